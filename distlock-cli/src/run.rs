//! `distlock run`: hold a lock while a command runs.

use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use distlock::{AcquireOptions, Error, LockGuard, Renewal};
use nix::sys::signal::Signal;
use tokio::process::Command;
use tokio::signal::unix::SignalKind;

use crate::Connection;
use crate::child::CommandGroup;
use crate::exit::{BUSY, Failure, LOST, NOT_EXECUTABLE, NOT_FOUND, OTHER};

pub(crate) const AFTER_HELP: &str = "\
CMD gets DISTLOCK_FENCING_TOKEN (strictly increasing per lock name: pass it to the resource you
protect) and DISTLOCK_LOCK_NAME. The lock is renewed every ttl/3 while CMD runs. CMD runs in a
process group of its own; the lock is released only once no process of that group is left.

Signals and failures:
  lock lost (renewal refused, server unreachable past the lease): SIGTERM to CMD's group,
      SIGKILL after --grace; exit 76.
  SIGINT, SIGTERM, SIGHUP, SIGQUIT to distlock: passed on to CMD's group; distlock releases
      the lock when the group is gone and exits with CMD's status. While still waiting for
      the lock: exit 128+N at once, nothing was run.
  SIGKILL of distlock, a crash, the OOM killer: the kernel kills CMD (PR_SET_PDEATHSIG); the
      lock expires after its ttl. Processes CMD started are not signalled by the kernel.
  CMD exits, leaving processes in its group: they get SIGTERM (SIGKILL after --grace), then
      the lock is released.

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

    /// Time between SIGTERM and SIGKILL when the lock is lost, and for processes the command
    /// left running in its group.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    grace: Duration,

    /// The command and its arguments.
    #[arg(required = true, last = true, value_name = "CMD")]
    command: Vec<String>,
}

pub(crate) async fn run(args: RunArgs, quiet: bool) -> Result<u8, Failure> {
    // Signals are caught from the start: before the lock is held they end distlock at once
    // (nothing runs yet), afterwards they are passed on to the command's process group.
    let mut signals = Signals::new()?;
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
    let acquiring = acquire(&*locks, &args.name, &opts);
    tokio::pin!(acquiring);
    let report_wait = tokio::time::sleep(WAIT_NOTICE);
    tokio::pin!(report_wait);
    let mut reported = quiet;
    let acquired = loop {
        tokio::select! {
            acquired = &mut acquiring => break acquired?,
            signal = signals.recv() => return Ok(128 + signal as u8),
            () = &mut report_wait, if !reported => {
                reported = true;
                report_waiting(&*locks, &args.name).await;
            }
        }
    };
    let Some(guard) = acquired else {
        return Err(Failure::new(
            BUSY,
            format!("lock {:?} is held elsewhere", args.name),
        ));
    };
    crate::child::become_subreaper();
    let mut group = spawn(&args, &guard)?;
    let lost = guard.lost();
    tokio::pin!(lost);
    let status = loop {
        tokio::select! {
            status = group.wait() => break status.map_err(|e| Failure::new(OTHER, format!("waiting for the command: {e}")))?,
            reason = &mut lost => {
                eprintln!("distlock: lock {:?} lost ({reason}); terminating the command", args.name);
                group.terminate(args.grace).await;
                group.finish(args.grace, quiet).await;
                return Ok(LOST);
            }
            signal = signals.recv() => group.signal(signal),
        }
    };
    // Stragglers of the command's group stop before the lock is released, never after.
    group.finish(args.grace, quiet).await;
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

/// After this long without the lock, a waiting `run` says so (once).
const WAIT_NOTICE: Duration = Duration::from_secs(1);

/// Tells the user that `run` is waiting, and for whom when the backend can tell.
async fn report_waiting(locks: &dyn distlock::DistributedLock, name: &str) {
    let holder = match locks.inspect(name).await {
        Ok(Some(info)) => match crate::owner::parse_run_owner(&info.owner) {
            Some(run) => format!(", held by distlock run on {} (pid {})", run.host, run.pid),
            None => format!(", held by owner {}", info.owner),
        },
        Ok(None) => String::new(),
        Err(err) => format!(" (cannot see its holder: {err})"),
    };
    eprintln!("distlock: waiting for lock {name:?}{holder}");
}

/// The signals `run` handles: INT, TERM, HUP and QUIT alike.
struct Signals {
    streams: [(Signal, tokio::signal::unix::Signal); 4],
}

impl Signals {
    fn new() -> Result<Self, Failure> {
        let listen = |signal: Signal| {
            tokio::signal::unix::signal(SignalKind::from_raw(signal as i32))
                .map(|stream| (signal, stream))
                .map_err(|err| Failure::new(OTHER, format!("cannot handle {signal}: {err}")))
        };
        Ok(Self {
            streams: [
                listen(Signal::SIGINT)?,
                listen(Signal::SIGTERM)?,
                listen(Signal::SIGHUP)?,
                listen(Signal::SIGQUIT)?,
            ],
        })
    }

    /// The next of the handled signals to arrive. Cancel-safe.
    async fn recv(&mut self) -> Signal {
        let [(int, a), (term, b), (hup, c), (quit, d)] = &mut self.streams;
        tokio::select! {
            _ = a.recv() => *int,
            _ = b.recv() => *term,
            _ = c.recv() => *hup,
            _ = d.recv() => *quit,
        }
    }
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

fn spawn(args: &RunArgs, guard: &LockGuard) -> Result<CommandGroup, Failure> {
    let (program, rest) = args
        .command
        .split_first()
        .ok_or_else(|| Failure::new(OTHER, "no command given"))?;
    let mut command = Command::new(program);
    command
        .args(rest)
        .env("DISTLOCK_FENCING_TOKEN", guard.token().to_string())
        .env("DISTLOCK_LOCK_NAME", &args.name)
        .stdin(Stdio::inherit());
    CommandGroup::spawn(command).map_err(|err| {
        let code = match err.kind() {
            std::io::ErrorKind::NotFound => NOT_FOUND,
            std::io::ErrorKind::PermissionDenied => NOT_EXECUTABLE,
            _ => OTHER,
        };
        Failure::new(code, format!("cannot run {program:?}: {err}"))
    })
}

fn exit_code(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code).unwrap_or(OTHER),
        (None, Some(sig)) => 128u8.saturating_add(u8::try_from(sig).unwrap_or(0)),
        (None, None) => OTHER,
    }
}
