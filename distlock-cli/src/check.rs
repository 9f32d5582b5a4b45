//! `distlock check`: tries hard to break a lock deployment (pauses, crashes, partitions,
//! restarts) and says whether it did (see the distlock-check crate).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use distlock_check::history::FaultKind;
use distlock_check::report::{self, JsonReport, KindRun};
use distlock_check::{
    CheckConfig, CheckKind, RemoteRegister, RunConfig, RunError, Sabotage, Spawner, StdoutSink,
};
use serde::Serialize;

use crate::Connection;
use crate::exit::{CONFIG, Failure, OTHER};

/// The environment variable that passes the (proxied) URL to a worker: not its command line,
/// where other users could read a password.
const WORKER_URL: &str = "DISTLOCK_CHECK_URL";
/// The checking process's pid, so that a worker can tell whether it is already orphaned.
const WORKER_PARENT: &str = "DISTLOCK_CHECK_PARENT";

/// Exit status of a check that found a violation of the backend's declared guarantee.
pub(crate) const VIOLATED: u8 = 1;

pub(crate) const AFTER_HELP: &str = "\
Worker processes loop on one lock of one --kind: acquire, then --steps writes, each after \
checking that the guard is neither lost nor past valid_until, to a fenced register kept by this \
process (it refuses a token lower than one it accepted; readers read, refused after a newer \
writer's write); release. Each kind runs for --duration in turn, on a name of its own. \
Meanwhile faults are injected one at a time: pause (SIGSTOP for 1.5-3 x ttl), crash (SIGKILL, a fresh worker replaces it), partition \
(the worker's traffic to every server held back by its own proxy, sockets kept open), restart \
(--restart-cmd, e.g. a command that kill -9s the server and starts it again on its data), \
ambiguous (the worker's requests reach the server but its replies are lost for 0.5-1.5 x ttl, \
then its connections close: acquires, renewals and releases that took effect unanswered), \
starve (the worker throttled to 5% of a CPU, SIGSTOP 95 ms in every 100 ms, for 1.5-3 x ttl), \
lossy (the worker's traffic held back at random, in order: 1 chunk in 5 by 1-20 ms, 1 in 10 by \
200-600 ms like a segment TCP retransmits, for 1.5-3 x ttl), \
clock (the server's wall clock stepped forward, or back, by 1.5-3 x ttl for 1.5-3 x ttl, then \
set right, through --clock-file, the libfaketime control file of a server run under it; its \
monotonic clock keeps running). \
Partition and ambiguous act on connections to the URL's hosts (not SQLite, nor Redis Sentinel \
and Cluster, whose clients reach the addresses the servers announce). With --overlap, faults overlap. The \
merged history is judged against the backend's fencing guarantee: shared tokens, tokens out \
of real-time order, a holder passing its check after a newer holder acquired, more holders \
passing their checks at once than the kind allows (one writer or many readers, N permits), a \
multi-lock holding part of its set, an election observer reporting an older term, stalls, \
acquisitions failing with no fault active, the lock after healing, worker failures. A holder passing its check after a newer grant, or \
two holders at once, right after the clock jumped forward is expected on the backends whose \
leases end on the server's wall clock (Redis, SQL, ZooKeeper; not etcd); the token rules \
hold regardless. Exit 0: no violation; 1: a violation; 78: bad options.";

/// Flags of `distlock check`.
#[derive(Debug, clap::Args)]
pub(crate) struct CheckArgs {
    #[command(flatten)]
    connection: Connection,

    /// How long the workers run, for each kind.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "60s")]
    duration: Duration,

    /// The primitives to check, comma-separated: exclusive, shared (readers only), rw-mix
    /// (one writer in three), upgradeable (the upgradeable read-write lock: writers that
    /// downgrade, upgradeable readers that upgrade, plain readers), permits:N, election (with
    /// an observer in every worker), multi (two of three names at once). Default: every kind
    /// the backend offers, in that order.
    #[arg(long, value_delimiter = ',', value_parser = parse_kind)]
    kind: Vec<CheckKind>,

    /// A deliberate bug in the workers, to see the checker find it (self-tests only).
    #[arg(long, hide = true, value_parser = parse_sabotage)]
    sabotage: Option<Sabotage>,

    /// Worker processes at once.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=64))]
    workers: u32,

    /// The lock's ttl (pauses and partitions last 1.5-3 times this).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "2s")]
    ttl: Duration,

    /// Faults to inject, comma-separated: pause, crash, partition, restart, ambiguous, starve,
    /// lossy, clock (none: ""). Also `--faults`.
    #[arg(long, alias = "faults", value_delimiter = ',', default_value = "pause,crash,partition,ambiguous,starve,lossy", value_parser = parse_fault)]
    nemesis: Vec<Option<FaultKind>>,

    /// Let faults overlap: a new one starts every 0.5-1.5 s whether or not the last has healed
    /// (two workers paused together, a partition during a restart; never two faults on one
    /// worker, never two restarts at once). Default: one at a time.
    #[arg(long)]
    overlap: bool,

    /// A shell command that kill -9s the server and starts it again with its data, returning
    /// once it serves (needed by the restart fault).
    #[arg(long)]
    restart_cmd: Option<String>,

    /// The libfaketime control file (FAKETIME_TIMESTAMP_FILE) of the server under test, run
    /// with FAKETIME_NO_CACHE=1: the clock fault writes the wall clock's offset in seconds to
    /// it ("+2.5", "-3") and "+0" when it heals (needed by the clock fault).
    #[arg(long)]
    clock_file: Option<PathBuf>,

    /// The lock-delay every acquisition asks for (see `run --lock-delay`): a crashed holder's
    /// name stays taken this long after its lease ran out, which the `lock-delay` rule judges
    /// (with the crash fault). Default: none.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "0s")]
    lock_delay: Duration,

    /// Checked writes per critical section.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=1000))]
    steps: u32,

    /// The work of each step, between its check and its write (a pause there makes the write
    /// late: what the fence is for). Default: a fifth of the ttl, so that a critical section
    /// of 5 steps lasts a ttl and needs its renewals.
    #[arg(long, value_parser = humantime::parse_duration)]
    step_gap: Option<Duration>,

    /// The lock's name (default: a fresh one per run).
    #[arg(long)]
    name: Option<String>,

    /// Also write the parameters, the history and the verdict as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,

    /// Also write the verdict table (Markdown) to this file.
    #[arg(long)]
    markdown: Option<PathBuf>,

    /// Also draw the timeline (holds, faults, violations) as SVG to this file.
    #[arg(long)]
    svg: Option<PathBuf>,
}

fn parse_kind(text: &str) -> Result<CheckKind, String> {
    text.parse()
}

fn parse_sabotage(text: &str) -> Result<Sabotage, String> {
    text.parse()
}

fn parse_fault(text: &str) -> Result<Option<FaultKind>, String> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(None);
    }
    text.parse().map(Some)
}

/// The hidden `check-worker` command: one worker process of a check.
#[derive(Debug, clap::Args)]
pub(crate) struct WorkerArgs {
    /// The register's address.
    #[arg(long)]
    register: SocketAddr,
    /// The worker's parameters (JSON).
    #[arg(long)]
    params: String,
    /// Give up on any single server operation after this long.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "5s")]
    op_timeout: Duration,
}

#[derive(Debug, Serialize)]
struct Params<'a> {
    url: String,
    guarantee: String,
    kinds: Vec<String>,
    duration_ms: u128,
    workers: u32,
    ttl_ms: u128,
    #[serde(skip_serializing_if = "is_zero")]
    lock_delay_ms: u128,
    steps: u32,
    step_gap_ms: u128,
    nemesis: Vec<&'a str>,
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    clock_file: Option<String>,
}

struct SelfSpawner {
    exe: PathBuf,
    op_timeout: Duration,
}

impl Spawner for SelfSpawner {
    fn command(
        &self,
        params: &distlock_check::WorkerParams,
        url: &str,
        register: SocketAddr,
    ) -> tokio::process::Command {
        let mut command = tokio::process::Command::new(&self.exe);
        command
            .arg("check-worker")
            .arg("--register")
            .arg(register.to_string())
            .arg("--params")
            .arg(serde_json::to_string(params).unwrap_or_default())
            .arg("--op-timeout")
            .arg(humantime::format_duration(self.op_timeout).to_string())
            .env(WORKER_URL, url)
            .env(WORKER_PARENT, std::process::id().to_string())
            .env("DISTLOCK_LOG", "error");
        // Armed before exec: a worker stopped by a pause fault, or not yet past its start-up,
        // still dies with a SIGKILLed checking process.
        crate::child::dies_with_distlock(&mut command);
        command
    }
}

pub(crate) async fn check(args: CheckArgs) -> Result<u8, Failure> {
    let nemesis: Vec<FaultKind> = args.nemesis.iter().flatten().copied().collect();
    let label = args.connection.shown();
    let name = args.name.clone().unwrap_or_else(|| {
        format!(
            "distlock-check/{}",
            &uuid::Uuid::new_v4().simple().to_string()[..12]
        )
    });
    let step_gap = args.step_gap.unwrap_or(args.ttl / 5);
    let backend = distlock::backend_for(&args.connection.url)
        .map_err(|err| Failure::from_lock(&err, format!("cannot use {label}")))?;
    let mut config = RunConfig {
        // With --password-file as the URL's option: workers read the file themselves.
        url: args.connection.url_to_open().into_owned(),
        name: name.clone(),
        kind: CheckKind::Exclusive,
        sabotage: args.sabotage,
        duration: args.duration,
        workers: args.workers,
        ttl: args.ttl,
        lock_delay: args.lock_delay,
        steps: args.steps,
        step_gap,
        nemesis: nemesis.clone(),
        restart_cmd: args.restart_cmd.clone(),
        overlap: args.overlap,
        clock_file: args.clock_file.clone(),
        default_port: backend
            .default_port()
            .filter(|_| !backend.follows_announced_addresses()),
    };
    let upstreams = config.validate().map_err(run_failure)?;
    let lock = args.connection.connect().await?;
    let caps = lock.capabilities().clone();
    check_ttl(&*lock, args.ttl)?;
    crate::check_lock_delay(&*lock, args.ttl, args.lock_delay)?;
    let kinds = kinds_to_check(&args, &caps, lock.backend())?;
    let spawner = SelfSpawner {
        exe: std::env::current_exe().map_err(|err| {
            Failure::new(OTHER, format!("cannot find the distlock binary: {err}"))
        })?,
        op_timeout: args.connection.op_timeout,
    };
    let kind_list: Vec<String> = kinds.iter().copied().map(CheckKind::label).collect();
    let wall_clock_leases = backend.wall_clock_leases();
    warn_inapplicable(&args, &nemesis, &label, backend, upstreams.is_empty());
    announce(&args, &label, &kind_list, &nemesis);
    let mut runs = Vec::new();
    for &kind in &kinds {
        config.kind = kind;
        config.name = if kinds.len() > 1 {
            format!("{name}/{kind}")
        } else {
            name.clone()
        };
        let history = distlock_check::run(&config, &spawner, Arc::clone(&lock))
            .await
            .map_err(run_failure)?;
        let verdict = distlock_check::check(
            &history,
            &judged_by(kind, &caps, args.ttl, args.lock_delay, wall_clock_leases),
        );
        println!(
            "{}",
            report::markdown(&format!("{label}, {kind}"), &verdict)
        );
        runs.push(KindRun {
            kind,
            verdict,
            history,
        });
    }
    let params = Params {
        url: label.clone(),
        guarantee: caps.fencing.to_string(),
        kinds: kind_list,
        duration_ms: args.duration.as_millis(),
        workers: args.workers,
        ttl_ms: args.ttl.as_millis(),
        lock_delay_ms: args.lock_delay.as_millis(),
        steps: args.steps,
        step_gap_ms: step_gap.as_millis(),
        nemesis: nemesis.iter().map(|f| f.as_str()).collect(),
        name: &name,
        clock_file: args.clock_file.as_ref().map(|f| f.display().to_string()),
    };
    write_reports(&args, &label, params, &runs)?;
    let failed = runs.iter().any(|run| run.verdict.failed());
    Ok(if failed { VIOLATED } else { 0 })
}

/// Refuses a ttl the backend of `lock` does not accept.
fn check_ttl(lock: &dyn distlock::DistributedLock, ttl: Duration) -> Result<(), Failure> {
    let caps = lock.capabilities();
    if ttl < caps.min_ttl || ttl > caps.max_ttl {
        return Err(Failure::new(
            CONFIG,
            format!(
                "--ttl {} is outside what {} accepts ({} to {})",
                humantime::format_duration(ttl),
                lock.backend(),
                humantime::format_duration(caps.min_ttl),
                humantime::format_duration(caps.max_ttl)
            ),
        ));
    }
    Ok(())
}

/// What the checker judges a run of `kind` by: the backend's guarantee and fairness, and the
/// run's ttl and lock-delay (faults settle within two ttls and the delay; a stall is one past
/// two ttls and a second).
fn judged_by(
    kind: CheckKind,
    caps: &distlock::Capabilities,
    ttl: std::time::Duration,
    lock_delay: std::time::Duration,
    wall_clock_leases: bool,
) -> CheckConfig {
    let ttl_ns = distlock_check::history::nanos_of(ttl);
    let delay_ns = distlock_check::history::nanos_of(lock_delay);
    CheckConfig {
        kind,
        guarantee: caps.fencing,
        fifo: caps.fifo,
        settle: 2 * ttl_ns + delay_ns,
        max_gap: 2 * ttl_ns + 1_000_000_000,
        renew_every: distlock_check::history::nanos_of(distlock::Renewal::auto().interval_for(ttl)),
        wall_clock_leases,
        lock_delay: delay_ns,
    }
}

#[allow(
    clippy::trivially_copy_pass_by_ref,
    reason = "serde's skip_serializing_if passes a reference"
)]
fn is_zero(n: &u128) -> bool {
    *n == 0
}

/// The run's plan on stderr: workers, kinds, duration, ttl, faults.
fn announce(args: &CheckArgs, label: &str, kinds: &[String], nemesis: &[FaultKind]) {
    eprintln!(
        "distlock check: {} workers on {label}, {} for {} each, ttl {}, faults: {}",
        args.workers,
        kinds.join(", "),
        humantime::format_duration(args.duration),
        humantime::format_duration(args.ttl),
        if nemesis.is_empty() {
            "none".to_owned()
        } else {
            nemesis
                .iter()
                .map(|f| f.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        }
    );
}

/// The kinds to check: those asked for (`--kind`), else every kind the backend offers; an
/// error for a kind it does not.
fn kinds_to_check(
    args: &CheckArgs,
    caps: &distlock::Capabilities,
    backend: &str,
) -> Result<Vec<CheckKind>, Failure> {
    let kinds = if args.kind.is_empty() {
        CheckKind::supported(caps)
    } else {
        let mut kinds = args.kind.clone();
        kinds.dedup();
        kinds
    };
    if let Some((kind, why)) = kinds
        .iter()
        .find_map(|kind| Some((kind, kind.unsupported(caps)?)))
    {
        return Err(Failure::new(
            CONFIG,
            format!("--kind {kind} cannot be checked on {}: {why}", backend),
        ));
    }
    Ok(kinds)
}

/// Says on stderr which of the requested faults cannot apply to this run, and what a clock
/// step means on a backend whose leases do not run on the wall clock.
fn warn_inapplicable(
    args: &CheckArgs,
    nemesis: &[FaultKind],
    label: &str,
    backend: &distlock::Descriptor,
    unproxied: bool,
) {
    let cut: Vec<&str> = nemesis
        .iter()
        .filter(|f| {
            matches!(
                f,
                FaultKind::Partition | FaultKind::Ambiguous | FaultKind::Lossy
            )
        })
        .map(|f| f.as_str())
        .collect();
    if nemesis.contains(&FaultKind::Clock) && args.clock_file.is_none() {
        eprintln!(
            "distlock check: clock cannot apply to {label}: no --clock-file (the libfaketime \
             control file of the server under test; scripts/services.sh runs Redis and \
             PostgreSQL under libfaketime and prints DISTLOCK_TEST_*_CLOCK_FILE)"
        );
    }
    if nemesis.contains(&FaultKind::Clock)
        && args.clock_file.is_some()
        && !backend.wall_clock_leases()
    {
        eprintln!(
            "distlock check: {} leases run on the server's monotonic clock: a clock step must \
             change nothing, and any overlap is a violation",
            backend.name()
        );
    }
    if unproxied && !cut.is_empty() {
        eprintln!(
            "distlock check: {} cannot apply to {label}: its workers' connections cannot be \
             proxied (SQLite has none; Sentinel and Cluster clients reach the addresses the \
             servers announce)",
            cut.join(", "),
        );
    }
}

/// Writes the reports the flags ask for: JSON (every run), Markdown tables, SVG timelines
/// (one file per kind when there are several).
fn write_reports(
    args: &CheckArgs,
    label: &str,
    params: Params<'_>,
    runs: &[KindRun],
) -> Result<(), Failure> {
    if let Some(path) = &args.json {
        let json = serde_json::to_string_pretty(&JsonReport { params, runs })
            .map_err(|err| Failure::new(OTHER, format!("cannot encode the report: {err}")))?;
        write(path, &json)?;
    }
    if let Some(path) = &args.markdown {
        let tables: Vec<String> = runs
            .iter()
            .map(|run| report::markdown(&format!("{label}, {}", run.kind), &run.verdict))
            .collect();
        write(path, &tables.join("\n"))?;
    }
    if let Some(path) = &args.svg {
        for run in runs {
            let svg = report::svg(
                &format!("{label}, {}", run.kind),
                &run.history,
                &run.verdict,
            )
            .map_err(|why| Failure::new(OTHER, format!("cannot draw the timeline: {why}")))?;
            let path = if runs.len() > 1 {
                report::per_kind(path, run.kind)
            } else {
                path.clone()
            };
            write(&path, &svg)?;
        }
    }
    Ok(())
}

fn run_failure(err: RunError) -> Failure {
    match err {
        RunError::Config(why) => Failure::new(CONFIG, why),
        other => Failure::new(OTHER, other.to_string()),
    }
}

fn write(path: &std::path::Path, text: &str) -> Result<(), Failure> {
    std::fs::write(path, text)
        .map_err(|err| Failure::new(OTHER, format!("cannot write {}: {err}", path.display())))
}

/// One worker process: connect (retrying for a while: a replacement may start while the
/// server restarts), then loop until SIGTERM.
pub(crate) async fn worker(args: WorkerArgs) -> Result<u8, Failure> {
    use tokio::signal::unix::{SignalKind, signal};
    // The checking process armed the parent-death signal before exec (`SelfSpawner`): a
    // worker left behind would go on taking the lock. Refuse to run for anyone else.
    let parent = std::env::var(WORKER_PARENT).ok();
    if parent.as_deref() != Some(nix::unistd::getppid().as_raw().to_string().as_str()) {
        return Err(Failure::new(
            OTHER,
            "the checking process is gone (or this is not one of its workers)",
        ));
    }
    let params: distlock_check::WorkerParams = serde_json::from_str(&args.params)
        .map_err(|err| Failure::new(CONFIG, format!("bad --params: {err}")))?;
    let url = std::env::var(WORKER_URL)
        .map_err(|_| Failure::new(CONFIG, format!("{WORKER_URL} is not set")))?;
    let mut term = signal(SignalKind::terminate())
        .map_err(|err| Failure::new(OTHER, format!("cannot watch SIGTERM: {err}")))?;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        term.recv().await;
        let _ = stop.send(true);
    });
    // The worker's URL carries the parent's password_file option, if any.
    let connection = Connection {
        url,
        op_timeout: args.op_timeout,
        password_file: None,
    };
    // A worker started while its servers are down or cut off (a crashed worker's successor,
    // during a server restart: up to 75 s in CI, 2026-11-30; or behind a partition, where a
    // TLS handshake ends at once and reads as a plain port) connects once they are back, or
    // ends cleanly when the check stops it first. A URL or option that cannot work ends it
    // at once (the checking process, which connected with the same URL, rules out refused
    // credentials before any worker starts).
    let mut waiting = stopped.clone();
    let lock = loop {
        match connection.connect().await {
            Ok(lock) => break lock,
            Err(failure) if failure.code == CONFIG => return Err(failure),
            Err(_) => {
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(200)) => {}
                    _ = waiting.wait_for(|stop| *stop) => return Ok(0),
                }
            }
        }
    };
    let register = RemoteRegister::connect(args.register)
        .await
        .map_err(|err| Failure::new(OTHER, format!("cannot reach the register: {err}")))?;
    let aim = distlock_check::StdinAim::start();
    distlock_check::work(&lock, &params, &register, &StdoutSink, &*aim, stopped)
        .await
        .map_err(|err| Failure::new(OTHER, format!("the register failed: {err}")))?;
    Ok(0)
}
