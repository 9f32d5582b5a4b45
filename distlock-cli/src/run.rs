//! `distlock run`: hold a lock while a command runs.

use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use distlock::{AcquireOptions, DistributedLock, Error, LockGuard, LockKind, Renewal};
use nix::sys::signal::Signal;
use tokio::process::Command;
use tokio::signal::unix::SignalKind;

use crate::Connection;
use crate::child::CommandGroup;
use crate::exit::{BUSY, CONFIG, Failure, LOST, NOT_EXECUTABLE, NOT_FOUND, OTHER};

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

/// The flags of every command that runs CMD while holding a lock (`run`, `elect`).
#[derive(Debug, clap::Args)]
pub(crate) struct Holding {
    #[command(flatten)]
    pub(crate) connection: Connection,

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

/// Flags of `distlock run`.
#[derive(Debug, clap::Args)]
pub(crate) struct RunArgs {
    /// The lock name.
    #[arg(long)]
    name: String,

    /// Hold the lock shared (the read side of a read-write lock): any number of `run --shared`
    /// at once, none while a plain `run` (the write side) holds it.
    #[arg(long, conflicts_with = "permits")]
    shared: bool,

    /// Hold one of N permits of a semaphore: at most N commands at once. Every caller of one
    /// name must give the same N.
    #[arg(long, value_name = "N")]
    permits: Option<u64>,

    #[command(flatten)]
    holding: Holding,
}

impl RunArgs {
    /// What `run` asks for; `--permits` out of range is a configuration error.
    fn kind(&self) -> Result<LockKind, Failure> {
        match self.permits {
            _ if self.shared => Ok(LockKind::Shared),
            None => Ok(LockKind::Exclusive),
            Some(0) => Err(Failure::new(
                CONFIG,
                "--permits must be at least 1 (a semaphore of 0 permits admits nobody)",
            )),
            Some(n) => u32::try_from(n)
                .map(|permits| LockKind::Permit { permits })
                .map_err(|_| Failure::new(CONFIG, format!("--permits {n} is too large"))),
        }
    }
}

/// What a command holds while CMD runs: the guard, and the environment CMD gets besides
/// DISTLOCK_FENCING_TOKEN and DISTLOCK_LOCK_NAME.
pub(crate) struct Held {
    pub(crate) guard: LockGuard,
    pub(crate) env: Vec<(&'static str, String)>,
}

/// What is held: a lock (`run`) or the leadership of an election (`elect`), for messages.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Role {
    Lock,
    Leader,
}

impl Role {
    fn busy(self, name: &str) -> String {
        match self {
            Self::Lock => format!("lock {name:?} is held elsewhere"),
            Self::Leader => format!("election {name:?} has another leader"),
        }
    }

    fn lost(self, name: &str) -> String {
        match self {
            Self::Lock => format!("lock {name:?} lost"),
            Self::Leader => format!("leadership of {name:?} lost"),
        }
    }
}

pub(crate) async fn run(args: RunArgs, quiet: bool) -> Result<u8, Failure> {
    let kind = args.kind()?;
    let name = args.name.clone();
    run_holding(
        &args.holding,
        &args.name,
        Role::Lock,
        quiet,
        |locks, opts| async move {
            if !locks.capabilities().supports(kind) {
                let flag = if kind == LockKind::Shared {
                    "--shared"
                } else {
                    "--permits"
                };
                let what = if kind == LockKind::Shared {
                    "shared (read) locks"
                } else {
                    "semaphores"
                };
                return Err(Failure::new(
                    CONFIG,
                    format!("{flag}: the {} backend has no {what}", locks.backend()),
                ));
            }
            let mut opts = opts.with_kind(kind);
            // `distlock-run@<host>#<pid>`: lets `status` and `list` show which process holds it.
            if let Ok(owner) = distlock::OwnerId::new(crate::owner::run_owner_id()) {
                opts = opts.with_owner(owner);
            }
            let guard = acquire(&*locks, &name, &opts).await?;
            Ok(guard.map(|guard| Held {
                guard,
                env: Vec::new(),
            }))
        },
    )
    .await
}

/// Runs the command of `holding` while holding what `take` acquires (given the connection and
/// the options of `holding`), as `run` and `elect` do: waits for it (a notice after a second,
/// signals end the wait at once), runs the command in its own process group, terminates the
/// group when the lock is lost (exit 76), passes signals on, and releases once the group is
/// gone. `take` returns `None` when the wait ran out.
pub(crate) async fn run_holding<F, Fut>(
    holding: &Holding,
    name: &str,
    role: Role,
    quiet: bool,
    take: F,
) -> Result<u8, Failure>
where
    F: FnOnce(Arc<dyn DistributedLock>, AcquireOptions) -> Fut,
    Fut: Future<Output = Result<Option<Held>, Failure>>,
{
    // Signals are caught from the start: before the lock is held they end distlock at once
    // (nothing runs yet), afterwards they are passed on to the command's process group.
    let mut signals = Signals::new()?;
    let locks = holding.connection.connect().await?;
    let mut opts = AcquireOptions::default()
        .with_ttl(holding.ttl)
        .with_renewal(Renewal::auto());
    if let Some(wait) = holding.wait {
        opts = opts.with_wait(wait);
    }
    let acquiring = take(locks.clone(), opts);
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
                report_waiting(&*locks, name, role).await;
            }
        }
    };
    let Some(held) = acquired else {
        return Err(Failure::new(BUSY, role.busy(name)));
    };
    crate::child::become_subreaper();
    let mut group = spawn(holding, name, &held)?;
    let guard = held.guard;
    let lost = guard.lost();
    tokio::pin!(lost);
    let grace = holding.grace;
    let status = loop {
        tokio::select! {
            status = group.wait() => break status.map_err(|e| Failure::new(OTHER, format!("waiting for the command: {e}")))?,
            reason = &mut lost => {
                eprintln!("distlock: {} ({reason}); terminating the command", role.lost(name));
                group.terminate(grace).await;
                group.finish(grace, quiet).await;
                return Ok(LOST);
            }
            signal = signals.recv() => group.signal(signal),
        }
    };
    // Stragglers of the command's group stop before the lock is released, never after.
    group.finish(grace, quiet).await;
    let was_lost = guard.is_lost();
    match guard.release().await {
        Ok(()) if !was_lost => {}
        Ok(()) => eprintln!("distlock: the lease of {name:?} ran out just as the command ended"),
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

/// Tells the user that `run` or `elect` is waiting, and for whom when the backend can tell.
async fn report_waiting(locks: &dyn DistributedLock, name: &str, role: Role) {
    let holder = match role {
        Role::Lock => match locks.inspect(name).await {
            Ok(Some(info)) => format!(", {}", crate::owner::describe_holders(&info)),
            Ok(None) => String::new(),
            Err(err) => format!(" (cannot see its holder: {err})"),
        },
        Role::Leader => match locks.leader(name).await {
            Ok(Some(leader)) => format!(", {}", crate::leader::describe(&leader)),
            Ok(None) => String::new(),
            Err(err) => format!(" (cannot see its leader: {err})"),
        },
    };
    match role {
        Role::Lock => eprintln!("distlock: waiting for lock {name:?}{holder}"),
        Role::Leader => eprintln!("distlock: waiting to lead {name:?}{holder}"),
    }
}

/// The signals `run`, `elect` and `leader --watch` handle: INT, TERM, HUP and QUIT alike.
pub(crate) struct Signals {
    streams: [(Signal, tokio::signal::unix::Signal); 4],
}

impl Signals {
    pub(crate) fn new() -> Result<Self, Failure> {
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
    pub(crate) async fn recv(&mut self) -> Signal {
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
    locks: &dyn DistributedLock,
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

fn spawn(holding: &Holding, name: &str, held: &Held) -> Result<CommandGroup, Failure> {
    let (program, rest) = holding
        .command
        .split_first()
        .ok_or_else(|| Failure::new(OTHER, "no command given"))?;
    let mut command = Command::new(program);
    command
        .args(rest)
        .env("DISTLOCK_FENCING_TOKEN", held.guard.token().to_string())
        .env("DISTLOCK_LOCK_NAME", name)
        .envs(held.env.iter().map(|(key, value)| (key, value)))
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
