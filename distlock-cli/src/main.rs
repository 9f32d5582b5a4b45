//! `distlock`: run a command under a distributed lock, inspect a lock, benchmark backends.
//!
//! Exit codes (also in `distlock --help`):
//!
//! | code | meaning |
//! |---|---|
//! | the command's | `run`: the command ran under the lock and exited with this status (128+N if killed by signal N) |
//! | 2 | bad flags |
//! | 69 | the lock service is unreachable |
//! | 75 | `run`: the lock is held elsewhere and `--wait` ran out |
//! | 76 | `run`: the lock was lost while the command ran; the command was terminated |
//! | 78 | bad URL, option or name |
//! | 126, 127 | `run`: the command could not be executed / was not found |
//! | 1 | any other failure |

mod bench;
mod exit;
mod list;
mod owner;
mod run;
mod status;
mod unlock;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

use crate::exit::Failure;

/// The URL used when neither --url nor DISTLOCK_URL is given: an embedded SQLite file in the
/// current directory.
pub(crate) const DEFAULT_URL: &str = "sqlite://distlock.db";

const AFTER_HELP: &str = "\
Exit codes: the command's own status for `run` (128+N when killed by signal N); 2 bad flags;
69 lock service unreachable; 75 lock busy (--wait ran out); 76 lock lost while the command ran
(it was terminated); 78 bad URL, option or name; 126/127 command not executable / not found;
1 anything else.

Examples:
  distlock run --name nightly-report -- ./report.sh --full
  DISTLOCK_URL=redis://127.0.0.1:6379 distlock run --name deploy --wait 0 -- make deploy
  distlock status --name deploy --url etcd://10.0.0.1:2379
  distlock list --prefix deploy --json
  distlock unlock --force --name deploy   (dangerous: see `distlock unlock --help`)
  distlock bench --url redis://127.0.0.1:6379 --url sqlite://bench.db --duration 3s";

/// Distributed locks from the shell: run a command while holding a lock (renewed, with a
/// fencing token in DISTLOCK_FENCING_TOKEN), see who holds a lock, compare backends.
#[derive(Debug, Parser)]
#[command(name = "distlock", version, about, after_help = AFTER_HELP)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Hold the lock while CMD runs; terminate CMD if the lock is lost.
    #[command(after_help = run::AFTER_HELP)]
    Run(run::RunArgs),
    /// Show who holds a lock, its fencing token and remaining lease.
    Status(status::StatusArgs),
    /// List held locks (name, owner, token, remaining lease) where the backend can.
    List(list::ListArgs),
    /// DANGEROUS: free a lock whoever holds it (needs --force; see --help).
    #[command(after_help = unlock::AFTER_HELP)]
    Unlock(unlock::UnlockArgs),
    /// Benchmark backends side by side (uncontended and contended scenarios).
    Bench(bench::CliBenchArgs),
}

/// Common connection flags.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct Connection {
    /// Lock service URL: sqlite://PATH, postgres://..., mysql://..., redis://host:port,
    /// redlock://h1:p1,h2:p2,h3:p3, etcd://h1:p1,..., zk://h1:p1,...[/chroot], memory://.
    #[arg(long, env = "DISTLOCK_URL", default_value = DEFAULT_URL)]
    pub(crate) url: String,

    /// Give up on any single server operation after this long.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "5s")]
    pub(crate) op_timeout: Duration,
}

impl Connection {
    pub(crate) async fn connect(
        &self,
    ) -> Result<std::sync::Arc<dyn distlock::DistributedLock>, Failure> {
        let config = distlock::ClientConfig::default().with_operation_timeout(self.op_timeout);
        distlock::connect_with(&self.url, config)
            .await
            .map_err(|err| {
                let url = distlock::service_url::redact(&self.url);
                Failure::from_lock(&err, format!("cannot use {url}"))
            })
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("DISTLOCK_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("distlock: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Run(args) => run::run(args).await,
            Command::Status(args) => status::status(args).await,
            Command::List(args) => list::list(args).await,
            Command::Unlock(args) => unlock::unlock(args).await,
            Command::Bench(args) => bench::bench(args).await,
        }
    });
    match result {
        Ok(code) => ExitCode::from(code),
        Err(failure) => {
            eprintln!("distlock: {}", failure.message);
            ExitCode::from(failure.code)
        }
    }
}
