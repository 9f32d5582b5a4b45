//! `distlock run`: hold a lock while a command runs.

use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use distlock::{AcquireOptions, Error, LockGuard, Renewal};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::{Child, Command};
use tokio::signal::unix::{SignalKind, signal};

use crate::Connection;
use crate::exit::{BUSY, Failure, LOST, NOT_EXECUTABLE, NOT_FOUND, OTHER};

pub(crate) const AFTER_HELP: &str = "\
CMD gets DISTLOCK_FENCING_TOKEN (strictly increasing per lock name: pass it to the resource you
protect) and DISTLOCK_LOCK_NAME. The lock is renewed every ttl/3 while CMD runs. If it is lost
(renewal refused, server unreachable past the lease), CMD gets SIGTERM, then SIGKILL after
--grace, and distlock exits with 76. SIGINT/SIGTERM sent to distlock are passed on to CMD.

Examples:
  distlock run --name backup -- pg_dump -f /backups/db.sql mydb
  distlock run --name deploy --wait 0 -- make deploy      # give up at once if held (exit 75)
  distlock run --name job --ttl 10s --wait 2m -- ./job.sh";

/// Flags of `distlock run`.
#[derive(Debug, clap::Args)]
pub(crate) struct RunArgs {
    /// The lock name.
    #[arg(long)]
    name: String,

    #[command(flatten)]
    connection: Connection,

    /// Lease length; renewed every ttl/3 while the command runs.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "30s")]
    ttl: Duration,

    /// How long to wait for the lock (0 tries once); waits forever when omitted.
    #[arg(long, value_parser = humantime::parse_duration)]
    wait: Option<Duration>,

    /// Time between SIGTERM and SIGKILL when the lock is lost.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    grace: Duration,

    /// The command and its arguments.
    #[arg(required = true, last = true, value_name = "CMD")]
    command: Vec<String>,
}

pub(crate) async fn run(args: RunArgs) -> Result<u8, Failure> {
    let locks = args.connection.connect().await?;
    let mut opts = AcquireOptions::default()
        .with_ttl(args.ttl)
        .with_renewal(Renewal::auto());
    if let Some(wait) = args.wait {
        opts = opts.with_wait(wait);
    }
    // `distlock-run@<host>#<pid>`: lets `status` and `list` show which process holds it.
    if let Ok(owner) = distlock::OwnerId::new(crate::owner::run_owner_id()) {
        opts = opts.with_owner(owner);
    }
    let mut interrupt = signal(SignalKind::interrupt()).map_err(signal_failure)?;
    let mut terminate = signal(SignalKind::terminate()).map_err(signal_failure)?;
    let acquired = tokio::select! {
        acquired = acquire(&*locks, &args.name, &opts) => acquired?,
        _ = interrupt.recv() => return Ok(128 + Signal::SIGINT as u8),
        _ = terminate.recv() => return Ok(128 + Signal::SIGTERM as u8),
    };
    let Some(guard) = acquired else {
        return Err(Failure::new(
            BUSY,
            format!("lock {:?} is held elsewhere", args.name),
        ));
    };
    let mut child = spawn(&args, &guard)?;
    let lost = guard.lost();
    tokio::pin!(lost);
    let status = loop {
        tokio::select! {
            status = child.wait() => break status.map_err(|e| Failure::new(OTHER, format!("waiting for the command: {e}")))?,
            reason = &mut lost => {
                eprintln!("distlock: lock {:?} lost ({reason}); terminating the command", args.name);
                stop(&mut child, args.grace).await;
                return Ok(LOST);
            }
            _ = interrupt.recv() => forward(&child, Signal::SIGINT),
            _ = terminate.recv() => forward(&child, Signal::SIGTERM),
        }
    };
    let was_lost = guard.is_lost();
    match guard.release().await {
        Ok(()) if !was_lost => {}
        Ok(()) => eprintln!(
            "distlock: the lease of {:?} ran out just as the command ended",
            args.name
        ),
        Err(err @ (Error::Lost { .. } | Error::NotHeld { .. })) => {
            eprintln!("distlock: {err}; the command may have finished without the lock");
            return Ok(LOST);
        }
        Err(err) => eprintln!("distlock: release failed ({err}); the lock expires after its ttl"),
    }
    Ok(exit_code(status))
}

async fn acquire(
    locks: &dyn distlock::DistributedLock,
    name: &str,
    opts: &AcquireOptions,
) -> Result<Option<LockGuard>, Failure> {
    let context = || format!("cannot acquire {name:?}");
    if opts.wait == Some(Duration::ZERO) {
        return locks
            .try_acquire(name, opts)
            .await
            .map_err(|e| Failure::from_lock(&e, context()));
    }
    match locks.acquire(name, opts).await {
        Ok(guard) => Ok(Some(guard)),
        Err(Error::Timeout { .. }) => Ok(None),
        Err(err) => Err(Failure::from_lock(&err, context())),
    }
}

fn spawn(args: &RunArgs, guard: &LockGuard) -> Result<Child, Failure> {
    let (program, rest) = args
        .command
        .split_first()
        .ok_or_else(|| Failure::new(OTHER, "no command given"))?;
    Command::new(program)
        .args(rest)
        .env("DISTLOCK_FENCING_TOKEN", guard.token().to_string())
        .env("DISTLOCK_LOCK_NAME", &args.name)
        .stdin(Stdio::inherit())
        .spawn()
        .map_err(|err| {
            let code = match err.kind() {
                std::io::ErrorKind::NotFound => NOT_FOUND,
                std::io::ErrorKind::PermissionDenied => NOT_EXECUTABLE,
                _ => OTHER,
            };
            Failure::new(code, format!("cannot run {program:?}: {err}"))
        })
}

/// SIGTERM, then SIGKILL after `grace`.
async fn stop(child: &mut Child, grace: Duration) {
    forward(child, Signal::SIGTERM);
    if tokio::time::timeout(grace, child.wait()).await.is_err() {
        eprintln!(
            "distlock: the command ignored SIGTERM for {}; killing it",
            humantime::format_duration(grace)
        );
        let _ = child.kill().await;
    }
}

fn forward(child: &Child, sig: Signal) {
    if let Some(pid) = child.id().and_then(|id| i32::try_from(id).ok()) {
        // The child may have exited already: nothing to do then.
        let _ = kill(Pid::from_raw(pid), sig);
    }
}

fn exit_code(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code).unwrap_or(OTHER),
        (None, Some(sig)) => 128u8.saturating_add(u8::try_from(sig).unwrap_or(0)),
        (None, None) => OTHER,
    }
}

fn signal_failure(err: std::io::Error) -> Failure {
    Failure::new(OTHER, format!("cannot install signal handlers: {err}"))
}
