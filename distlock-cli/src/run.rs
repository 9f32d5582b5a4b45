//! `distlock run`: hold a lock while a command runs.

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock::{AcquireOptions, DistributedLock, Error, LockGuard, LockKind, LossReason, Renewal};

use crate::upgrade::{Control, Hold, Request};
use nix::sys::signal::Signal;
use tokio::process::Command;
use tokio::signal::unix::SignalKind;

use crate::Connection;
use crate::child::{CommandGroup, SpawnError};
use crate::contain::Contain;
use crate::exit::{BUSY, CONFIG, Failure, LOST, NOT_EXECUTABLE, NOT_FOUND, OTHER, SKIPPED};

pub(crate) const AFTER_HELP: &str = "\
CMD gets DISTLOCK_FENCING_TOKEN (strictly increasing per lock name: pass it to the resource you
protect) and DISTLOCK_LOCK_NAME, but not DISTLOCK_URL or DISTLOCK_PASSWORD_FILE (they may hold
a password; --pass-url passes them on). The lock is renewed every ttl/3 while CMD runs. CMD
runs in a process group of its own (and a cgroup of its own where one can be made: --contain);
the lock is released only once no process of it is left.

The command never runs past the lease:
  renewals failing (server unreachable): SIGTERM to everything CMD started when the lease has
      min(--grace, ttl/3) + K left, SIGKILL when K is left (K = 100 ms, or ttl/10 if less),
      so that it is dead before the lease can end on the server and another holder start;
      exit 76. A renewal that succeeds in between does not undo the SIGTERM.
  lock lost (renewal refused, session expired, lease ran out): SIGKILL at once; exit 76.
  SIGINT, SIGTERM, SIGHUP, SIGQUIT to distlock: passed on to CMD's group; distlock releases
      the lock when the group is gone and exits with CMD's status. While still waiting for
      the lock: exit 128+N at once, nothing was run.
  SIGKILL of distlock, a crash, the OOM killer: the kernel kills CMD (PR_SET_PDEATHSIG) and a
      supervisor process kills the rest of its group, and of its cgroup (which also holds the
      processes that left the group with setsid); the lock expires after its ttl.
  CMD exits, leaving processes behind: they get SIGTERM (SIGKILL after --grace), then the lock
      is released.

Cron (the same job on several hosts, run once):
  --skip-if-held: try once; if the lock is held, print nothing and exit 80.
  --hold-at-least 5m: keep the lock until 5 minutes after it was taken, even if CMD ends
      sooner, so a host whose cron fires a little later does not run the job again. Renewal
      stops once the lease covers the minimum; a signal to distlock releases at once.

Upgradeable read-write lock (--upgradeable, --upgradeable-write): CMD also gets
DISTLOCK_CONTROL and may run `distlock upgrade [--wait D]` (become the writer, no other writer
in between; prints the new token; exit 75 when the wait runs out, the read is kept) and
`distlock downgrade` (back to the upgradeable read).

Examples:
  distlock run --name backup -- pg_dump -f /backups/db.sql mydb
  distlock run --name deploy --wait 0 -- make deploy      # give up at once if held (exit 75)
  distlock run --name job --ttl 10s --wait 2m -- ./job.sh
  */5 * * * * distlock run --name report --skip-if-held --hold-at-least 4m -- ./report.sh";

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

    /// Lock-delay: if distlock dies holding the lock (SIGKILL, a crash, a lost host), nobody
    /// gets it for this long after its lease ran out, so that writes CMD still had in flight
    /// can drain; a release frees it at once. The server keeps a lease of ttl + this.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "0s")]
    lock_delay: Duration,

    /// Time between SIGTERM and SIGKILL for processes the command left running, and the
    /// warning before the lease ends when renewals fail (at most ttl/3: the command is always
    /// dead before the lease ends).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    grace: Duration,

    /// What holds the command's processes together: a cgroup v2 leaf (catches processes that
    /// leave the process group; needs a writable cgroup hierarchy), the process group, or
    /// auto (a cgroup where one can be made).
    #[arg(long, value_enum, default_value = "auto")]
    contain: Contain,

    /// Pass DISTLOCK_URL and DISTLOCK_PASSWORD_FILE on to the command (removed by default:
    /// they may hold or lead to a password).
    #[arg(long)]
    pass_url: bool,

    /// The command and its arguments.
    #[arg(required = true, last = true, value_name = "CMD")]
    command: Vec<String>,
}

impl Holding {
    /// The acquisition's options: the ttl, renewal every ttl/3, and the wait if one is given.
    fn options(&self) -> AcquireOptions {
        let opts = AcquireOptions::default()
            .with_ttl(self.ttl)
            .with_lock_delay(self.lock_delay)
            .with_renewal(Renewal::auto());
        match self.wait {
            Some(wait) => opts.with_wait(wait),
            None => opts,
        }
    }
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

    /// Hold the upgradeable read of the upgradeable read-write lock NAME: beside `run
    /// --shared` readers, one at a time, no writer. CMD may become the writer with no other
    /// writer in between by running `distlock upgrade` (it prints the new fencing token), and
    /// go back with `distlock downgrade`. Every writer of NAME must use
    /// `--upgradeable-write`.
    #[arg(long, conflicts_with_all = ["shared", "permits", "upgradeable_write"])]
    upgradeable: bool,

    /// Hold the write side of the upgradeable read-write lock NAME, through its gate (how
    /// every writer of a name that `run --upgradeable` uses must write). CMD may go down to
    /// the upgradeable read with `distlock downgrade`, and up again with `distlock upgrade`.
    #[arg(long, conflicts_with_all = ["shared", "permits"])]
    upgradeable_write: bool,

    /// For cron: try once and, if the lock is held elsewhere, print nothing and exit 80 (not
    /// an error); the same as --wait 0 with its own exit code.
    #[arg(long, conflicts_with = "wait")]
    skip_if_held: bool,

    /// The data stored with the hold, which `status`, `list` and their --json show (at most
    /// 512 bytes; anyone who can read the locks can read it). Default, where the backend
    /// stores data: `host=<host> pid=<pid> cmd=<CMD and its arguments>`.
    #[arg(long, value_name = "TEXT", conflicts_with = "no_data")]
    data: Option<String>,

    /// Store no data with the hold (say, when CMD's arguments carry anything private).
    #[arg(long)]
    no_data: bool,

    /// Keep the lock until this long after it was taken, even if the command ends sooner (it
    /// is released at once on a signal to distlock). Renewal stops once the lease covers it.
    #[arg(long, value_parser = humantime::parse_duration, value_name = "DURATION")]
    hold_at_least: Option<Duration>,

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

/// What a command holds while CMD runs: the hold, and the environment CMD gets besides
/// DISTLOCK_FENCING_TOKEN and DISTLOCK_LOCK_NAME.
pub(crate) struct Held {
    pub(crate) hold: Hold,
    pub(crate) env: Vec<(&'static str, String)>,
    /// A leader's value file (`elect --value-file`) and the value proclaimed last.
    pub(crate) value_file: Option<(PathBuf, String)>,
}

/// How often a leader's value file is read again.
const VALUE_FILE_EVERY: Duration = Duration::from_secs(1);

/// The value in a value file: its first line, without surrounding white space.
pub(crate) async fn read_value_file(path: &Path) -> std::io::Result<String> {
    let text = tokio::fs::read_to_string(path).await?;
    Ok(text.lines().next().unwrap_or_default().trim().to_owned())
}

/// Reads the value file again and proclaims its value if it changed (an unreadable or empty
/// file, or a value the backend refuses, is reported and left for the next read). Only a
/// regular file is read again: a named pipe (`--value-file <(...)`) gave its value at the
/// start, and opening it again would wait for a writer for ever, and the leader's loop with it
/// (no signal passed on, the command's exit not seen).
async fn proclaim_from(file: &mut (PathBuf, String), guard: &LockGuard, name: &str) {
    if tokio::fs::metadata(&file.0)
        .await
        .is_ok_and(|meta| !meta.is_file())
    {
        return;
    }
    let value = match read_value_file(&file.0).await {
        Ok(value) if !value.is_empty() && value != file.1 => value,
        Ok(_) => return,
        Err(err) => {
            tracing::warn!(file = %file.0.display(), "cannot read the value file: {err}");
            return;
        }
    };
    match guard.proclaim(&value).await {
        Ok(()) => {
            tracing::info!(
                "proclaimed {:?} as the value of {name:?}",
                crate::out::printable(&value)
            );
            file.1 = value;
        }
        // A lost leadership ends the command through the guard's loss.
        Err(err) if err.is_not_held() => {}
        Err(err) => tracing::warn!("cannot proclaim the new value of {name:?}: {err}"),
    }
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

pub(crate) async fn run(mut args: RunArgs, quiet: bool) -> Result<u8, Failure> {
    let kind = args.kind()?;
    let name = args.name.clone();
    let (upgradeable, upgradeable_write) = (args.upgradeable, args.upgradeable_write);
    if args.skip_if_held {
        args.holding.wait = Some(Duration::ZERO);
    }
    let after = After {
        hold_at_least: args.hold_at_least,
    };
    let data = match (&args.data, args.no_data) {
        (_, true) => None,
        (Some(data), _) => Some((data.clone(), true)),
        (None, false) => Some((crate::owner::run_data(&args.holding.command), false)),
    };
    let ran = run_holding(
        &args.holding,
        &args.name,
        Role::Lock,
        quiet,
        after,
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
            match data {
                Some((data, _)) if locks.capabilities().holder_data => {
                    opts = opts.with_data(data);
                }
                Some((_, true)) => {
                    return Err(Failure::new(
                        CONFIG,
                        format!(
                            "--data: the {} backend stores no data with a hold",
                            locks.backend()
                        ),
                    ));
                }
                _ => {}
            }
            if upgradeable || upgradeable_write {
                let hold = crate::upgrade::take(locks, &name, &opts, upgradeable_write).await?;
                return Ok(hold.map(|hold| Held {
                    hold,
                    env: Vec::new(),
                    value_file: None,
                }));
            }
            // `distlock-run@<host>#<pid>`: lets `status` and `list` show which process holds it.
            if let Ok(owner) = distlock::OwnerId::new(crate::owner::run_owner_id()) {
                opts = opts.with_owner(owner);
            }
            let guard = acquire(&*locks, &name, &opts).await?;
            Ok(guard.map(|guard| Held {
                hold: Hold::One(guard),
                env: Vec::new(),
                value_file: None,
            }))
        },
    )
    .await;
    match ran {
        Err(failure) if args.skip_if_held && failure.code == BUSY => {
            tracing::info!("lock {:?} is held elsewhere: skipped", args.name);
            Ok(SKIPPED)
        }
        other => other,
    }
}

/// What happens after the command ended, before the release.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct After {
    /// Keep the lock until this long after it was taken.
    pub(crate) hold_at_least: Option<Duration>,
}

/// Runs the command of `holding` while holding what `take` acquires (given the connection and
/// the options of `holding`), as `run` and `elect` do: waits for it (a notice after a second,
/// signals end the wait at once), runs the command contained (process group, cgroup,
/// supervisor), kills it before the lease can end when renewals fail or at once when the lock
/// is lost (exit 76), passes signals on, waits as `after` says, and releases once the command's
/// processes are gone. `take` returns `None` when the wait ran out.
pub(crate) async fn run_holding<F, Fut>(
    holding: &Holding,
    name: &str,
    role: Role,
    quiet: bool,
    after: After,
    take: F,
) -> Result<u8, Failure>
where
    F: FnOnce(Arc<dyn DistributedLock>, AcquireOptions) -> Fut,
    Fut: Future<Output = Result<Option<Held>, Failure>>,
{
    // Signals are caught from the start: before the lock is held they end distlock at once
    // (nothing runs yet), afterwards they are passed on to the command's process group.
    let mut signals = Signals::new()?;
    let locks = holding.connection.connect_for_ttl(holding.ttl).await?;
    crate::check_lock_delay(&*locks, holding.ttl, holding.lock_delay)?;
    let acquiring = take(locks.clone(), holding.options());
    let acquired = match wait_for_lock(acquiring, &mut signals, &*locks, name, role, quiet).await {
        Ok(acquired) => acquired?,
        Err(signal) => return Ok(128 + signal as u8),
    };
    let Some(mut held) = acquired else {
        return Err(Failure::new(BUSY, role.busy(name)));
    };
    let (control, mut group) = start(holding, name, &mut held)?;
    let mut hold = held.hold;
    let mut value_file = held.value_file;
    let deadline = Deadline::new(hold.ttl(), holding.grace);
    let mut lost = hold.lost();
    let mut terminated = false;
    let status = loop {
        tokio::select! {
            status = group.wait() => break status.map_err(|e| Failure::new(OTHER, format!("waiting for the command: {e}")))?,
            reason = &mut lost => {
                group.kill().await;
                let lost = role.lost(name);
                crate::out::stderr_line(format!("distlock: {lost} ({reason}); killed the command"));
                return Ok(LOST);
            }
            due = running_out(|| hold.valid_until(), deadline, terminated) => {
                if lease_due(due, &mut group, deadline, &mut terminated, name).await {
                    return Ok(LOST);
                }
            }
            signal = signals.recv() => group.signal(signal),
            () = tokio::time::sleep(VALUE_FILE_EVERY), if value_file.is_some() => {
                if let Some(file) = value_file.as_mut() {
                    // A proclamation takes up to an operation timeout when the server does
                    // not answer: the loss and the lease's end are not left waiting on it.
                    // Made once: a signal passed on does not start the proclamation again. It is
                    // given up at the next step of the lease's end as it stands now (the loop
                    // then takes that step), however the renewals go meanwhile: a read that
                    // never ends (a hung file system) does not keep the loop from the command.
                    let (term_at, kill_at) = deadline.signals(hold.valid_until());
                    let due = if terminated { kill_at } else { term_at };
                    let proclaiming = proclaim_from(file, hold.guard(), name);
                    let gone = hold.lost();
                    let ends = tokio::time::sleep_until(due.into());
                    tokio::pin!(proclaiming, gone, ends);
                    loop {
                        tokio::select! {
                            () = &mut proclaiming => break,
                            _ = &mut gone => break,
                            () = &mut ends => break,
                            signal = signals.recv() => group.signal(signal),
                        }
                    }
                }
            }
            Some((stream, request)) = next_request(control.as_ref()) => {
                let serving = Serving {
                    signals: &mut signals, group: &mut group, deadline, name, role,
                    grace: holding.grace, quiet,
                };
                match serve(hold, request, stream, serving, &mut terminated).await {
                    Ok(changed) => {
                        hold = changed;
                        lost = hold.lost();
                    }
                    Err(code) => return Ok(code),
                }
            }
        }
    };
    let kill_at = deadline.signals(hold.valid_until()).1;
    let draining = Draining {
        grace: holding.grace,
        quiet,
        kill_at,
        role,
        name,
    };
    if !draining.drain(&mut group, &mut lost).await {
        return Ok(LOST);
    }
    if !release_after(hold, name, after, &mut signals).await || terminated {
        return Ok(LOST);
    }
    Ok(exit_code(status))
}

/// Starts the command of `holding` under `held`: contained, and for a gated hold with the
/// control socket it sends `distlock upgrade` and `distlock downgrade` to (in its environment).
fn start(
    holding: &Holding,
    name: &str,
    held: &mut Held,
) -> Result<(Option<Control>, CommandGroup), Failure> {
    crate::child::become_subreaper();
    let control = match held.hold {
        Hold::One(_) => None,
        Hold::Upgradeable(_) | Hold::Write(_) => Some(Control::open()?),
    };
    if let Some(control) = &control {
        held.env.push((
            crate::upgrade::CONTROL_VARIABLE,
            control.path().display().to_string(),
        ));
    }
    let group = spawn(holding, name, held)?;
    tracing::info!(
        cgroup = group.in_cgroup(),
        "the command runs in its process group{}",
        cgroup_note(group.in_cgroup())
    );
    Ok((control, group))
}

/// What [`serve`] watches while a change of the hold waits.
struct Serving<'a> {
    signals: &'a mut Signals,
    group: &'a mut CommandGroup,
    deadline: Deadline,
    name: &'a str,
    role: Role,
    /// `--grace`, for what the command leaves running.
    grace: Duration,
    /// No notes about leftovers.
    quiet: bool,
}

/// Carries out the command's `request` on `hold` and answers it on `stream`. While the change
/// waits (an upgrade waits for the readers), signals are passed on to the command, and the
/// command is held to the lease of what the change keeps throughout (the gate) as the run's
/// loop holds it to the hold's: terminated when renewals fail, killed before that lease ends
/// or at once when it is lost. A command that exits meanwhile (its `distlock upgrade` killed
/// by a timeout or a Ctrl-C) ends the run with its status: what it left running is stopped
/// first, then the request is given up. What the request held (the gate, a place in the
/// name's queue) is then not released: distlock exits, and it expires with its lease. The
/// hold afterwards, or the exit code the run ends with (the command killed, or exited).
async fn serve(
    hold: Hold,
    request: Request,
    mut stream: tokio::net::UnixStream,
    serving: Serving<'_>,
    terminated: &mut bool,
) -> Result<Hold, u8> {
    let Serving {
        signals,
        group,
        deadline,
        name,
        role,
        grace,
        quiet,
    } = serving;
    let kept = hold.kept_lease();
    let lost = kept.lost();
    let changing = hold.change(request);
    let valid_until = || kept.valid_until();
    let ends = running_out(&valid_until, deadline, *terminated);
    tokio::pin!(changing, lost, ends);
    let (changed, answer) = loop {
        tokio::select! {
            changed = &mut changing => break changed,
            signal = signals.recv() => group.signal(signal),
            reason = &mut lost => {
                group.kill().await;
                crate::out::stderr_line(format!(
                    "distlock: {} while the command's request was carried out ({reason}); \
                     killed the command",
                    role.lost(name)
                ));
                return Err(LOST);
            }
            due = &mut ends => {
                if lease_due(due, group, deadline, terminated, name).await {
                    return Err(LOST);
                }
                ends.set(running_out(&valid_until, deadline, *terminated));
            }
            status = group.wait() => {
                let code = match status {
                    Ok(status) => exit_code(status),
                    Err(err) => {
                        crate::out::stderr_line(format!("distlock: waiting for the command: {err}"));
                        OTHER
                    }
                };
                let kill_at = deadline.signals(kept.valid_until()).1;
                let draining = Draining { grace, quiet, kill_at, role, name };
                if !draining.drain(group, &mut lost).await || *terminated || kept.is_lost() {
                    return Err(LOST);
                }
                return Err(code);
            }
        }
    };
    crate::upgrade::answer(&mut stream, &answer).await;
    match changed {
        Some(changed) => Ok(changed),
        None => {
            group.kill().await;
            crate::out::stderr_line(format!(
                "distlock: {name:?} is no longer held after the command's request; killed the \
                 command"
            ));
            Err(LOST)
        }
    }
}

/// How the processes a command left running are stopped once it exited (see
/// [`Draining::drain`]).
struct Draining<'a> {
    /// `--grace` between their SIGTERM and SIGKILL.
    grace: Duration,
    /// No notes about them.
    quiet: bool,
    /// When they are killed whatever the grace: the lease is about to end.
    kill_at: Instant,
    role: Role,
    name: &'a str,
}

impl Draining<'_> {
    /// Stops what the command left running before the lock is released, never after: SIGTERM,
    /// SIGKILL after the grace, at `kill_at` at the latest, and at once when `lost` resolves
    /// (the grace is for a lock still held; a loss known already comes first). `false` when
    /// the lock was lost.
    async fn drain(self, group: &mut CommandGroup, lost: impl Future<Output = LossReason>) -> bool {
        tokio::select! {
            biased;
            reason = lost => {
                group.kill().await;
                crate::out::stderr_line(format!(
                    "distlock: {} ({reason}); killed what the command left running",
                    self.role.lost(self.name)
                ));
                false
            }
            () = group.finish(self.grace, self.quiet) => true,
            () = tokio::time::sleep_until(self.kill_at.into()) => {
                group.kill().await;
                true
            }
        }
    }
}

/// What the lease's end calls for, once renewals stopped succeeding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Due {
    /// Warn the command: SIGTERM to every process.
    Term,
    /// Kill the command: the lease is about to end.
    Kill,
}

/// Resolves when renewals failed long enough that the command must be warned
/// ([`Deadline::term_lead`] before the end of the lease `valid_until` reads, each renewal
/// moving it) or, once `terminated`, killed ([`Deadline::kill_lead`] before). Cancel safe.
async fn running_out(
    valid_until: impl Fn() -> Instant,
    deadline: Deadline,
    terminated: bool,
) -> Due {
    loop {
        let until = valid_until();
        let (term_at, kill_at) = deadline.signals(until);
        tokio::time::sleep_until(if terminated { kill_at } else { term_at }.into()).await;
        if valid_until() <= until {
            return if terminated { Due::Kill } else { Due::Term };
        }
    }
}

/// Does what `due` calls for, then says so on stderr (a write that blocks comes after the
/// signal): SIGTERM to the command (`terminated` then says so), or kill it (`true`: the run
/// ends).
async fn lease_due(
    due: Due,
    group: &mut CommandGroup,
    deadline: Deadline,
    terminated: &mut bool,
    name: &str,
) -> bool {
    match due {
        Due::Kill => {
            group.kill().await;
            crate::out::stderr_line(format!(
                "distlock: the lease of {name:?} was about to end; killed the command"
            ));
            true
        }
        Due::Term => {
            *terminated = true;
            group.signal_all(Signal::SIGTERM);
            crate::out::stderr_line(format!(
                "distlock: renewals of {name:?} are failing and its lease ends in {}; \
                 terminated the command",
                humantime::format_duration(deadline.term_lead)
            ));
            false
        }
    }
}

/// Keeps `hold` as `after` says (a signal ends that at once), then releases it; `false` when
/// it turned out lost.
async fn release_after(hold: Hold, name: &str, after: After, signals: &mut Signals) -> bool {
    if let Some(minimum) = after.hold_at_least {
        tokio::select! {
            () = hold.hold_at_least(minimum) => {}
            signal = signals.recv() => {
                tracing::info!(%signal, "released before --hold-at-least on a signal");
            }
        }
    }
    release(hold, name).await
}

/// The next request of the command on `control`; never, without one.
async fn next_request(control: Option<&Control>) -> Option<(tokio::net::UnixStream, Request)> {
    match control {
        Some(control) => loop {
            if let Some(request) = control.next().await {
                return Some(request);
            }
        },
        None => std::future::pending().await,
    }
}

/// Waits for `acquiring`, saying on stderr (unless `quiet`) who holds the lock once the wait
/// is long; `Err(signal)` when a signal comes first (nothing runs yet: distlock ends).
async fn wait_for_lock<T>(
    acquiring: impl Future<Output = T>,
    signals: &mut Signals,
    locks: &dyn DistributedLock,
    name: &str,
    role: Role,
    quiet: bool,
) -> Result<T, Signal> {
    tokio::pin!(acquiring);
    let report_wait = tokio::time::sleep(WAIT_NOTICE);
    tokio::pin!(report_wait);
    let mut reported = quiet;
    loop {
        tokio::select! {
            acquired = &mut acquiring => return Ok(acquired),
            signal = signals.recv() => return Err(signal),
            () = &mut report_wait, if !reported => {
                reported = true;
                report_waiting(locks, name, role).await;
            }
        }
    }
}

/// The end of the log line that says what holds the command's processes together.
fn cgroup_note(in_cgroup: bool) -> &'static str {
    if in_cgroup {
        " and a cgroup of its own"
    } else {
        ""
    }
}

/// Releases the lock once the command and its stragglers are gone, saying on stderr what
/// went wrong; `false` when the lock turned out lost (the command may have finished without
/// it).
async fn release(hold: Hold, name: &str) -> bool {
    let was_lost = hold.is_lost();
    match hold.release().await {
        Ok(()) if !was_lost => {}
        Ok(()) => crate::out::stderr_line(format!(
            "distlock: the lease of {name:?} ran out just as the command ended"
        )),
        Err(err @ (Error::Lost { .. } | Error::NotHeld { .. })) => {
            crate::out::stderr_line(format!(
                "distlock: {err}; the command may have finished without the lock"
            ));
            return false;
        }
        Err(err) => crate::out::stderr_line(format!(
            "distlock: release failed ({err}); the lock expires after its ttl"
        )),
    }
    true
}

/// When the command is signalled before its lease ends, if renewals stop succeeding.
#[derive(Clone, Copy, Debug)]
struct Deadline {
    /// SIGKILL this long before the lease's end (as the guard sees it, drift already off).
    kill_lead: Duration,
    /// SIGTERM this long before the lease's end.
    term_lead: Duration,
}

impl Deadline {
    /// At most 100 ms (ttl/10 for short ttls) for the kill to land; the warning before it is
    /// --grace, at most ttl/3 (a lease renewed on time keeps 2/3 of the ttl ahead).
    fn new(ttl: Duration, grace: Duration) -> Self {
        let kill_lead = (ttl / 10).min(KILL_LEAD);
        Self {
            kill_lead,
            term_lead: kill_lead + grace.min(ttl / 3),
        }
    }

    /// When to send SIGTERM and SIGKILL for a lease valid until `until`.
    fn signals(self, until: Instant) -> (Instant, Instant) {
        let before = |lead| until.checked_sub(lead).unwrap_or(until);
        (before(self.term_lead), before(self.kill_lead))
    }
}

/// The most time allowed between SIGKILL and the lease's end.
const KILL_LEAD: Duration = Duration::from_millis(100);

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
        Role::Lock => {
            crate::out::stderr_line(format!("distlock: waiting for lock {name:?}{holder}"))
        }
        Role::Leader => {
            crate::out::stderr_line(format!("distlock: waiting to lead {name:?}{holder}"))
        }
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
        .env("DISTLOCK_FENCING_TOKEN", held.hold.token().to_string())
        .env("DISTLOCK_LOCK_NAME", name)
        .envs(held.env.iter().map(|(key, value)| (key, value)))
        .stdin(Stdio::inherit());
    if !holding.pass_url {
        for secret in CREDENTIAL_VARIABLES {
            command.env_remove(secret);
        }
    }
    CommandGroup::spawn(command, holding.contain).map_err(|err| match err {
        SpawnError::Command(err) => {
            let code = match err.kind() {
                std::io::ErrorKind::NotFound => NOT_FOUND,
                std::io::ErrorKind::PermissionDenied => NOT_EXECUTABLE,
                _ => OTHER,
            };
            Failure::new(code, format!("cannot run {program:?}: {err}"))
        }
        SpawnError::Contain(why) => Failure::new(OTHER, why),
    })
}

/// The variables distlock reads a password (or the way to one) from: not passed to CMD.
const CREDENTIAL_VARIABLES: [&str; 2] = ["DISTLOCK_URL", "DISTLOCK_PASSWORD_FILE"];

fn exit_code(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code).unwrap_or(OTHER),
        (None, Some(sig)) => 128u8.saturating_add(u8::try_from(sig).unwrap_or(0)),
        (None, None) => OTHER,
    }
}
