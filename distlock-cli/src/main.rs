//! `distlock`: run a command under a distributed lock, inspect a lock, benchmark backends.
//!
//! Exit codes (also in `distlock --help`):
//!
//! | code | meaning |
//! |---|---|
//! | the command's | `run`, `elect`: the command ran under the lock (as leader) and exited with this status (128+N if killed by signal N) |
//! | 2 | bad flags |
//! | 3 | `leader`: the election has no leader |
//! | 69 | the lock service is unreachable |
//! | 75 | `run`, `elect`: the lock is held elsewhere (another leader) and `--wait` ran out |
//! | 76 | `run`, `elect`: the lock (leadership) was lost while the command ran, or renewals failed until its lease was about to end; the command was killed |
//! | 78 | bad URL, option or name (`--permits 0`); a lock kind the backend lacks (`--shared`, `--permits` where it has no read-write locks or semaphores); a lock kind that does not match the name's holders (`--permits 3` on a semaphore of 5, `--permits` on a read-write lock) |
//! | 80 | `run --skip-if-held`: the lock is held elsewhere; nothing was run, nothing printed |
//! | 126, 127 | `run`, `elect`: the command could not be executed / was not found |
//! | 141 | stdout was closed by its reader (`distlock list \| head -1`): the output stopped there, quietly (128 + SIGPIPE, as a shell reports a command killed by it) |
//! | 1 | any other failure |

mod bench;
mod bench_alloc;
mod bench_args;
mod bench_load;
mod bench_metrics;
mod check;
mod child;
mod contain;
mod elect;
mod exit;
mod leader;
mod list;
mod logs;
mod out;
mod owner;
mod run;
mod state;
mod status;
mod unlock;
mod upgrade;

/// Counts live heap bytes for `distlock bench --scenario hold` (bytes per held guard): one
/// relaxed atomic add or subtract per allocation once `bench` starts counting; for every
/// other subcommand (`run` included) the system allocator behind one relaxed load.
#[global_allocator]
static ALLOCATOR: bench_alloc::Counting = bench_alloc::Counting;

use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{CommandFactory, Parser, Subcommand};
use distlock::DistributedLock;

use crate::exit::{CONFIG, Failure};

const AFTER_HELP: &str = "\
Exit codes: the command's own status for `run` and `elect` (128+N when killed by signal N);
2 bad flags; 3 `leader`: no leader; 69 lock service unreachable; 75 lock busy (--wait ran out);
76 lock or leadership lost while the command ran (it was terminated); 80 `run --skip-if-held`:
held elsewhere, nothing run; 78 bad URL, option or
name, a lock kind the backend lacks or that does not match the name's holders (--shared,
--permits); 126/127 command not executable / not found; 141 stdout closed by its reader
(`distlock list | head -1`: the output stopped there, quietly); 1 anything else.

Examples:
  distlock run --name nightly-report -- ./report.sh --full
  distlock run --name cache --shared -- ./read-cache.sh   (readers together, never with a writer)
  distlock run --name gpu --permits 2 -- ./train.sh       (at most 2 at once)
  distlock elect --name scheduler -- ./scheduler          (run while leader; failover)
  distlock leader --name scheduler --watch
  DISTLOCK_URL=redis://127.0.0.1:6379 distlock run --name deploy --wait 0 -- make deploy
  DISTLOCK_URL='rediss://app:PASS@redis.internal:6380?ca=/etc/ssl/ca.pem' distlock run ...
    (TLS and a password: keep them in DISTLOCK_URL, out of the process list)
  distlock status --name deploy --url etcd://10.0.0.1:2379
  distlock list --prefix deploy --json
  distlock unlock --force --name deploy   (dangerous: see `distlock unlock --help`)
  distlock bench --url redis://127.0.0.1:6379 --url sqlite://bench.db --duration 3s";

/// Distributed locks from the shell: run a command while holding a lock (exclusive, shared or
/// one of N permits; renewed, with a fencing token in DISTLOCK_FENCING_TOKEN) or while leading
/// an election, see who holds a lock or leads, compare backends.
#[derive(Debug, Parser)]
#[command(name = "distlock", version = version_text(), about, after_help = AFTER_HELP)]
struct Cli {
    /// Print only errors (no waiting notice, no warnings).
    #[arg(short, long, global = true, conflicts_with = "verbose")]
    quiet: bool,

    /// More log output on stderr: -v info, -vv debug, -vvv trace (DISTLOCK_LOG overrides).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,

    #[command(subcommand)]
    command: Command,
}

/// `distlock --version`: the version and the backends compiled in.
fn version_text() -> String {
    let mut backends: Vec<&str> = distlock::BACKENDS
        .iter()
        .filter_map(|b| b.descriptor)
        .map(distlock::Descriptor::name)
        .collect();
    // zookeeper has two lines (zk://, zks://).
    backends.dedup();
    format!(
        "{} (backends: {})",
        env!("CARGO_PKG_VERSION"),
        backends.join(", ")
    )
}

/// The help of `--url`: the URLs this build can open, and the features that add the others.
fn url_help() -> String {
    let mut help = String::from("Lock service URL: ");
    let enabled: Vec<&str> = distlock::BACKENDS
        .iter()
        .filter_map(|b| b.descriptor)
        .map(distlock::Descriptor::example)
        .collect();
    help.push_str(&enabled.join(", "));
    let missing: Vec<String> = distlock::BACKENDS
        .iter()
        .filter(|b| b.descriptor.is_none())
        .filter_map(|b| Some(format!("{}:// (feature {})", b.schemes[0], b.feature?)))
        .collect();
    if !missing.is_empty() {
        help.push_str(". Not in this build: ");
        help.push_str(&missing.join(", "));
        help.push_str(" (cargo install distlock-cli --features ...)");
    }
    help.push_str(
        ". Default: one SQLite file per user (the state directory), whatever the current directory",
    );
    help
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Hold the lock (or a shared hold, or a permit) while CMD runs; terminate CMD if it is lost.
    #[command(after_help = run::AFTER_HELP)]
    Run(run::RunArgs),
    /// Campaign to lead an election; run CMD while leader (like `etcdctl elect`).
    #[command(after_help = elect::AFTER_HELP)]
    Elect(elect::ElectArgs),
    /// Inside `run --upgradeable`: become the writer, no other writer in between; prints the
    /// new fencing token (exit 75: --wait ran out, the upgradeable read is kept).
    Upgrade(upgrade::UpgradeArgs),
    /// Inside `run --upgradeable` or `--upgradeable-write`: go back from the write side to
    /// the upgradeable read, no other writer in between; prints the new fencing token.
    Downgrade,
    /// Show the leader of an election (exit 3: none); --watch follows every change.
    Leader(leader::LeaderArgs),
    /// Show who holds a lock, its fencing token and remaining lease.
    Status(status::StatusArgs),
    /// List held locks (name, owner, token, remaining lease) where the backend can.
    List(list::ListArgs),
    /// DANGEROUS: free a lock whoever holds it (needs --force; see --help).
    #[command(after_help = unlock::AFTER_HELP)]
    Unlock(unlock::UnlockArgs),
    /// Benchmark backends side by side (uncontended, contended mutex, read/write mix, semaphore).
    Bench(bench::CliBenchArgs),
    /// Try hard to break a lock deployment (pauses, crashes, partitions, restarts) and judge
    /// what happened against the backend's guarantee.
    #[command(after_help = check::AFTER_HELP)]
    Check(check::CheckArgs),
    /// One worker process of `distlock check` (internal).
    #[command(hide = true)]
    CheckWorker(check::WorkerArgs),
    /// Print a shell completion script (e.g. `distlock completions bash > /etc/bash_completion.d/distlock`).
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

/// Common connection flags.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct Connection {
    #[arg(long, env = "DISTLOCK_URL", hide_env_values = true, help = url_help(),
          default_value_t = state::default_url(), hide_default_value = state::default_url().is_empty())]
    pub(crate) url: String,

    /// Give up on any single server operation after this long.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "5s")]
    pub(crate) op_timeout: Duration,

    /// Read the URL's password from this file (read once, never printed): keeps it out of the
    /// process list and the environment. The same as the URL option `password_file=`.
    #[arg(long, env = "DISTLOCK_PASSWORD_FILE", value_name = "FILE")]
    pub(crate) password_file: Option<std::path::PathBuf>,
}

impl Connection {
    /// Connects for taking locks; the default SQLite file is created (privately) if missing.
    /// A lock service that lives in this process only (`memory://`, `sqlite::memory:`) is
    /// refused: no other process would see its locks.
    pub(crate) async fn connect(&self) -> Result<Arc<dyn DistributedLock>, Failure> {
        if self.url.is_empty() {
            return Err(state::empty_url());
        }
        if self.url == state::default_url() {
            state::prepare_default_db()?;
        }
        self.open().await
    }

    /// Connects as [`connect`](Self::connect) for holding leases of `ttl`, and refuses
    /// (exit 78, see [`check_ttl`]) a ttl the backend cannot keep renewed, before anything is
    /// acquired or run.
    pub(crate) async fn connect_for_ttl(
        &self,
        ttl: Duration,
    ) -> Result<Arc<dyn DistributedLock>, Failure> {
        let locks = self.connect().await?;
        check_ttl(&*locks, ttl)?;
        Ok(locks)
    }

    /// Connects for reading only: `None` when the URL names a SQLite file that does not exist
    /// (no lock can be held there, and nothing is created just to say so). A lock service that
    /// lives in this process only is refused, as by [`connect`](Self::connect).
    pub(crate) async fn connect_existing(
        &self,
    ) -> Result<Option<Arc<dyn DistributedLock>>, Failure> {
        if self.url.is_empty() {
            return Err(state::empty_url());
        }
        #[cfg(feature = "sqlite")]
        if let Ok(config) = distlock_sql::SqlConfig::from_url(&self.url)
            && let Some(file) = config.sqlite_file()
        {
            if !file.exists() {
                return Ok(None);
            }
            // Reading a file this user may not write (another user's, a read-only mount):
            // open it read-only rather than refuse it, unless the URL chose a mode itself.
            let writable = std::fs::OpenOptions::new().write(true).open(&file);
            if writable.is_err_and(|err| {
                matches!(
                    err.kind(),
                    std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::ReadOnlyFilesystem
                )
            }) && !self.url.contains("mode=")
            {
                let separator = if self.url.contains('?') { '&' } else { '?' };
                let read_only = Self {
                    url: format!("{}{separator}mode=ro", self.url),
                    ..self.clone()
                };
                return read_only.open().await.map(Some);
            }
        }
        self.open().await.map(Some)
    }

    async fn open(&self) -> Result<Arc<dyn DistributedLock>, Failure> {
        let config = distlock::ClientConfig::default().with_operation_timeout(self.op_timeout);
        let locks = distlock::connect_with(&self.url_to_open(), config)
            .await
            .map_err(|err| {
                // Configuration errors name the URL themselves.
                let shown = self.shown();
                let context = if err.to_string().contains(&shown) {
                    String::new()
                } else {
                    format!("cannot use {shown}")
                };
                Failure::from_lock(&err, context)
            })?;
        if locks.capabilities().process_local {
            return Err(Failure::new(
                CONFIG,
                format!(
                    "{} keeps its locks inside this one distlock process: no other process \
                     sees them and they end with it (two runs would both hold a lock); use a \
                     lock server or a SQLite file (sqlite://PATH), or leave out --url for the \
                     per-user default",
                    self.shown()
                ),
            ));
        }
        Ok(locks)
    }

    /// The URL with `--password-file` (DISTLOCK_PASSWORD_FILE) as its `password_file` option,
    /// which the library reads at connect.
    pub(crate) fn url_to_open(&self) -> std::borrow::Cow<'_, str> {
        let Some(file) = &self.password_file else {
            return self.url.as_str().into();
        };
        distlock::with_password_file(&self.url, file).into()
    }

    /// The URL as messages show it: without its password, cut if very long.
    pub(crate) fn shown(&self) -> String {
        distlock::service_url::redact(&self.url)
    }
}

/// Refuses `--ttl` outside the backend's range (exit 78): below its `min_ttl` the lease
/// cannot be renewed in time (every ttl/3, a server round trip or more each) and the command
/// would be killed as soon as it started; above its `max_ttl` the backend refuses it.
pub(crate) fn check_ttl(locks: &dyn DistributedLock, ttl: Duration) -> Result<(), Failure> {
    let caps = locks.capabilities();
    let shown = |d: Duration| humantime::format_duration(d).to_string();
    let why = if ttl < caps.min_ttl {
        format!(
            "is shorter than the {} backend can keep renewed (every ttl/3): give at least {}",
            locks.backend(),
            shown(caps.min_ttl)
        )
    } else if ttl > caps.max_ttl {
        format!(
            "is longer than the {} backend allows: give at most {}",
            locks.backend(),
            shown(caps.max_ttl)
        )
    } else {
        return Ok(());
    };
    Err(Failure::new(CONFIG, format!("--ttl {} {why}", shown(ttl))))
}

/// Exit 78 when the ttl plus the lock-delay is a lease longer than the backend keeps.
pub(crate) fn check_lock_delay(
    locks: &dyn DistributedLock,
    ttl: Duration,
    lock_delay: Duration,
) -> Result<(), Failure> {
    let max = locks.capabilities().max_ttl;
    if ttl.saturating_add(lock_delay) <= max {
        return Ok(());
    }
    let shown = |d: Duration| humantime::format_duration(d).to_string();
    Err(Failure::new(
        CONFIG,
        format!(
            "--ttl {} plus --lock-delay {} is a lease longer than the {} backend allows: give at \
             most {} together",
            shown(ttl),
            shown(lock_delay),
            locks.backend(),
            shown(max)
        ),
    ))
}

/// The log filter: DISTLOCK_LOG if set, else from -q/-v. By default the library's warnings
/// are shown except the ones distlock reports itself (a lost lock, a forced release, and
/// async-nats's connection errors, which the NATS backend's error carries).
fn log_filter(quiet: bool, verbose: u8) -> tracing_subscriber::EnvFilter {
    use tracing_subscriber::EnvFilter;
    if let Ok(filter) = EnvFilter::try_from_env("DISTLOCK_LOG") {
        return filter;
    }
    EnvFilter::new(match (quiet, verbose) {
        (true, _) => "error,async_nats=off",
        (false, 0) => "warn,distlock_core::guard=error,distlock_core::client=error,async_nats=off",
        (false, 1) => "info",
        (false, 2) => "debug",
        (false, _) => "trace",
    })
}

fn main() -> ExitCode {
    // `run`'s supervisor: distlock re-executed, before anything else (see contain.rs).
    if let Some(code) = contain::supervisor_main() {
        return code;
    }
    // `bench --background-load`'s busy processes, before anything else too.
    if let Some(code) = bench_load::busy_main() {
        return code;
    }
    let cli = Cli::parse();
    let stderr_is_terminal = std::io::stderr().is_terminal();
    let logs = tracing_subscriber::fmt()
        .with_env_filter(log_filter(cli.quiet, cli.verbose))
        .with_writer(std::io::stderr)
        .with_ansi(stderr_is_terminal);
    if cli.verbose == 0 {
        logs.event_format(logs::Plain).init();
    } else {
        logs.init();
    }
    if let Command::Completions { shell } = cli.command {
        // Into memory first: clap_complete panics when its writer fails.
        let mut script = Vec::new();
        clap_complete::generate(shell, &mut Cli::command(), "distlock", &mut script);
        return match out::write(&script) {
            Ok(()) => ExitCode::SUCCESS,
            Err(failure) => {
                failure.report(cli.verbose > 0);
                ExitCode::from(failure.code)
            }
        };
    }
    if matches!(cli.command, Command::Bench(_)) {
        bench_alloc::start_counting();
    }
    // `block_on` polls the command's future on this (the main) thread, so `run` forks its
    // command from the thread that lives as long as distlock: the parent-death signal is tied
    // to the forking thread (see child.rs).
    let runtime = match &cli.command {
        Command::Bench(args) if args.runtime == bench::Flavor::CurrentThread => {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
        }
        _ => tokio::runtime::Runtime::new(),
    };
    let runtime = match runtime {
        Ok(runtime) => runtime,
        Err(err) => {
            out::stderr_line(format_args!(
                "distlock: cannot start the async runtime: {err}"
            ));
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Run(args) => run::run(args, cli.quiet).await,
            Command::Elect(args) => elect::elect(args, cli.quiet).await,
            Command::Upgrade(args) => upgrade::upgrade(args).await,
            Command::Downgrade => upgrade::downgrade().await,
            Command::Leader(args) => leader::leader(args).await,
            Command::Status(args) => status::status(args).await,
            Command::List(args) => list::list(args).await,
            Command::Unlock(args) => unlock::unlock(args).await,
            Command::Bench(args) => bench::bench(args).await,
            Command::Check(args) => check::check(args).await,
            Command::CheckWorker(args) => check::worker(args).await,
            Command::Completions { .. } => Ok(0),
        }
    });
    match result {
        Ok(code) => ExitCode::from(code),
        Err(failure) => {
            failure.report(cli.verbose > 0);
            ExitCode::from(failure.code)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_ttl_outside_the_backends_range_is_refused_with_its_bounds() {
        let locks = distlock::connect("memory://check-ttl")
            .await
            .expect("memory");
        let caps = locks.capabilities().clone();
        assert!(check_ttl(&*locks, caps.min_ttl).is_ok());
        assert!(check_ttl(&*locks, caps.max_ttl).is_ok());
        let short = check_ttl(&*locks, caps.min_ttl / 2).expect_err("too short");
        assert_eq!(short.code, CONFIG);
        assert_eq!(
            short.message,
            "--ttl 5ms is shorter than the memory backend can keep renewed (every ttl/3): give \
             at least 10ms"
        );
        let long = check_ttl(&*locks, caps.max_ttl * 2).expect_err("too long");
        let most = format!("give at most {}", humantime::format_duration(caps.max_ttl));
        assert!(long.message.ends_with(&most), "{}", long.message);
    }
}
