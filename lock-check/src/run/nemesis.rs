//! The nemesis: which fault hits whom, what it acts on, and its infliction and healing.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use rand::Rng;
use tokio::process::Command;

use super::fleet::{Fleet, Running};
use super::{RunError, io};
use crate::history::{Fault, FaultKind, Nanos, now};
use crate::proxy::Proxy;
use crate::worker::Op;

/// Whom fault `kind` hits: `Some(None)` the server, `Some(Some(id))` worker `id` (the holder
/// two times in three for the faults that matter most in a critical section), `None` nobody
/// now (the server or every worker already under a fault, no clock file).
pub(super) fn target(
    kind: FaultKind,
    fleet: &Fleet<'_>,
    busy: &Busy,
    clock: bool,
    rng: &mut impl Rng,
) -> Option<Option<u32>> {
    let mut ids: Vec<u32> = fleet
        .running
        .keys()
        .copied()
        .filter(|id| !busy.targets.contains(&Some(*id)))
        .collect();
    ids.sort_unstable();
    // A pause or a partition of the holder is the interesting case (a GC pause in the
    // critical section): aim at it two times in three.
    let holder = fleet
        .recorder
        .holder()
        .filter(|w| ids.contains(w) && rng.random_bool(2.0 / 3.0));
    Some(match (kind, holder) {
        (FaultKind::Restart, _) if busy.targets.contains(&None) => return None,
        (FaultKind::Restart, _) => None,
        (FaultKind::Clock, _) if !clock || busy.clock => return None,
        (FaultKind::Clock, _) => None,
        (_, _) if ids.is_empty() => return None,
        (
            FaultKind::Pause
            | FaultKind::Partition
            | FaultKind::Ambiguous
            | FaultKind::Starve
            | FaultKind::Lossy,
            Some(holder),
        ) => Some(holder),
        _ => Some(ids[rng.random_range(0..ids.len())]),
    })
}

/// What fault `kind` acts on, for `victim` (a worker, by number) if it has one; `None` when it
/// cannot apply now (no victim, no proxy to cut, no clock file). Not for crashes
/// ([`Fleet::crash`]).
pub(super) fn action(
    kind: FaultKind,
    victim: Option<(u32, &Running)>,
    fleet: &Fleet<'_>,
    clock_file: Option<&Path>,
    rng: &mut impl Rng,
) -> Option<Action> {
    if matches!(
        kind,
        FaultKind::Partition | FaultKind::Ambiguous | FaultKind::Lossy
    ) && fleet.upstreams.is_empty()
    {
        return None;
    }
    Some(match kind {
        FaultKind::Pause | FaultKind::Starve => match victim {
            Some((_, worker)) => Action::Signal(worker.pid),
            None => return None,
        },
        // A holder's: aimed at one of its operations (see `Aimer`): its renewals if its
        // section has just begun (a renewal is aimed at while half a ttl of the section
        // is left), else its release or the acquire after it. A waiter's: its acquire in
        // flight, from now on.
        FaultKind::Ambiguous => match victim {
            Some((id, worker)) => {
                let switches = worker.proxies.iter().map(Proxy::switch).collect();
                match fleet.recorder.holds(id) {
                    Some(since) => {
                        let age = now().saturating_sub(since);
                        let op = if age < crate::history::nanos_of(fleet.config.ttl / 4) {
                            Op::Renew
                        } else if rng.random_bool(0.5) {
                            Op::Release
                        } else {
                            Op::Acquire
                        };
                        Action::Aim(op, worker.aimer.clone(), switches)
                    }
                    None => Action::Cut(switches),
                }
            }
            None => return None,
        },
        FaultKind::Partition | FaultKind::Lossy => match victim {
            Some((_, worker)) => Action::Cut(worker.proxies.iter().map(Proxy::switch).collect()),
            None => return None,
        },
        FaultKind::Restart => Action::Restart(fleet.config.restart_cmd.clone().unwrap_or_default()),
        FaultKind::Clock => {
            // Forward or back by 1.5-3 ttls: past every lease's end, or far enough back
            // that leases written now end late by more than their ttl.
            let step = i64::try_from(
                fleet
                    .config
                    .ttl
                    .mul_f64(rng.random_range(1.5..3.0))
                    .as_millis(),
            )
            .unwrap_or(i64::MAX);
            let step = if rng.random_bool(0.5) { step } else { -step };
            Action::Clock(clock_file?.to_path_buf(), step)
        }
        FaultKind::Crash => return None,
    })
}

/// What faults are in progress on: workers (by number) and the server (`None`: a restart),
/// and the server's clock.
#[derive(Default)]
pub(super) struct Busy {
    pub(super) targets: std::collections::HashSet<Option<u32>>,
    pub(super) clock: bool,
}

/// A fault task's end: the fault, or one that missed (an aimed worker that did not get to the
/// operation in time), whose target is free again all the same.
pub(super) struct Ended {
    pub(super) fault: Fault,
    pub(super) missed: bool,
}

impl Busy {
    /// A fault task ended: its target is free again, and the fault joins `faults`.
    pub(super) fn done(
        &mut self,
        ended: Result<Result<Ended, RunError>, tokio::task::JoinError>,
        faults: &mut Vec<Fault>,
    ) -> Result<(), RunError> {
        let ended = ended.map_err(|err| RunError::Config(format!("a fault task: {err}")))??;
        let fault = ended.fault;
        if fault.kind == FaultKind::Clock {
            self.clock = false;
        } else {
            self.targets.remove(&fault.worker);
        }
        if !ended.missed {
            faults.push(fault);
        }
        Ok(())
    }
}

/// The faults of a run: those running as tasks (one at a time, or overlapping with
/// [`RunConfig::overlap`](super::RunConfig::overlap)), what they occupy, and those that ended.
#[derive(Default)]
pub(super) struct Nemesis {
    active: tokio::task::JoinSet<Result<Ended, RunError>>,
    pub(super) busy: Busy,
    pub(super) faults: Vec<Fault>,
}

impl Nemesis {
    /// Takes in the fault tasks that have ended.
    pub(super) fn reap(&mut self) -> Result<(), RunError> {
        while let Some(done) = self.active.try_join_next() {
            self.busy.done(done, &mut self.faults)?;
        }
        Ok(())
    }

    /// Waits for the next fault task to end.
    pub(super) async fn wait_one(&mut self) -> Result<(), RunError> {
        if let Some(done) = self.active.join_next().await {
            self.busy.done(done, &mut self.faults)?;
        }
        Ok(())
    }

    /// Waits for every fault task; returns the faults in the order they began.
    pub(super) async fn finish(mut self) -> Result<Vec<Fault>, RunError> {
        while let Some(done) = self.active.join_next().await {
            self.busy.done(done, &mut self.faults)?;
        }
        self.faults.sort_by_key(|f| f.start);
        Ok(self.faults)
    }

    /// Starts fault `kind` on `target` (begun at `begun`) as a task: `action` for `hold`, its
    /// target (or the server's clock) busy until it heals.
    pub(super) fn launch(
        &mut self,
        kind: FaultKind,
        target: Option<u32>,
        action: Action,
        hold: Duration,
        ttl: Duration,
        begun: Nanos,
    ) {
        let (step_ms, aimed) = match &action {
            Action::Clock(_, step) => (Some(*step), None),
            Action::Aim(op, ..) => (None, Some(*op)),
            _ => (None, None),
        };
        if kind == FaultKind::Clock {
            self.busy.clock = true;
        } else {
            self.busy.targets.insert(target);
        }
        self.active.spawn(async move {
            let inflicted = inflict(kind, action, hold, ttl).await?;
            Ok(Ended {
                fault: Fault {
                    kind,
                    worker: target,
                    start: inflicted.start.unwrap_or(begun),
                    healed: inflicted.healed.unwrap_or_else(now),
                    step_ms,
                    aimed,
                },
                missed: aimed.is_some() && inflicted.start.is_none(),
            })
        });
    }
}

/// How long fault `kind` lasts: 1.5-3 ttls; an ambiguous-reply fault 0.5-1.5 ttls, shorter
/// than a partition: a holder's renewals and release, a waiter's acquire, go through
/// unanswered, and the lease they set must still end.
pub(super) fn hold_for(kind: FaultKind, ttl: Duration, rng: &mut impl Rng) -> Duration {
    match kind {
        FaultKind::Ambiguous => ttl.mul_f64(rng.random_range(0.5..1.5)),
        _ => ttl.mul_f64(rng.random_range(1.5..3.0)),
    }
}

/// Aims an ambiguous-reply fault at one operation of a worker process (see
/// [`crate::worker::Aim`]): lines to its stdin, and the count of its `aimed` events.
#[derive(Clone)]
pub(super) struct Aimer {
    pub(super) stdin: Arc<tokio::sync::Mutex<Option<tokio::process::ChildStdin>>>,
    pub(super) aimed: tokio::sync::watch::Receiver<u64>,
}

impl Aimer {
    pub(super) async fn say(&self, line: &str) {
        use tokio::io::AsyncWriteExt as _;
        if let Some(stdin) = self.stdin.lock().await.as_mut() {
            let _ = stdin.write_all(format!("{line}\n").as_bytes()).await;
            let _ = stdin.flush().await;
        }
    }

    /// Arms the worker for `op`, waits (at most `within`) until it is about to send it, then
    /// runs `cut` and lets it go on. When it was cut (`None`: the worker did not get there).
    pub(super) async fn aim(
        &self,
        op: Op,
        within: Duration,
        cut: impl FnOnce(),
    ) -> Option<crate::Nanos> {
        let mut aimed = self.aimed.clone();
        aimed.mark_unchanged();
        self.say(&format!("aim {}", op.as_str())).await;
        if tokio::time::timeout(within, aimed.changed()).await.is_err() {
            self.say("aim none").await;
            // It may have got there meanwhile, and waits.
            if !aimed.has_changed().unwrap_or(false) {
                return None;
            }
        }
        let start = now();
        cut();
        self.say("go").await;
        Some(start)
    }
}

/// What a fault acts on.
pub(super) enum Action {
    /// A worker process, by signals.
    Signal(Pid),
    /// A worker's proxies.
    Cut(Vec<crate::proxy::Switch>),
    /// A worker's proxies, when it is about to send the operation.
    Aim(Op, Aimer, Vec<crate::proxy::Switch>),
    /// The server, by the restart command.
    Restart(String),
    /// The server's wall clock, by its libfaketime control file: the step in milliseconds.
    Clock(PathBuf, i64),
}

/// Sets the offset of the server's wall clock to `offset_ms` (0: the true time): the first
/// line of its libfaketime control file, in seconds (`+2.500`). The file is replaced whole
/// (written beside it, then renamed over it), so the server, which reads it at every clock
/// read, never sees it half written.
///
/// # Errors
/// [`RunError::Io`] naming the file.
pub fn set_clock(file: &Path, offset_ms: i64) -> Result<(), RunError> {
    let what = || format!("setting the server's clock in {}", file.display());
    let sign = if offset_ms < 0 { '-' } else { '+' };
    let abs = offset_ms.unsigned_abs();
    let text = format!("{sign}{}.{:03}\n", abs / 1000, abs % 1000);
    let mut tmp = file.as_os_str().to_owned();
    tmp.push(".distlock-check");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, text).map_err(io(what()))?;
    std::fs::rename(&tmp, file).map_err(io(what()))
}

/// When a fault began and healed, where the time it returns is not the one to record.
#[derive(Default)]
pub(super) struct Inflicted {
    /// A fault aimed at an operation: when the cut began (`None`: it missed).
    pub(super) start: Option<crate::Nanos>,
    /// A clock fault: just before the clock was set right (a step forward, when it had been
    /// stepped back; the server can read the new clock before the file's write returns).
    pub(super) healed: Option<crate::Nanos>,
}

/// Injects one fault and heals it: the pause, throttle, partition, lost replies or clock
/// step last `hold`; a restart lasts until the command returns.
pub(super) async fn inflict(
    kind: FaultKind,
    action: Action,
    hold: Duration,
    ttl: Duration,
) -> Result<Inflicted, RunError> {
    match (kind, action) {
        (FaultKind::Pause, Action::Signal(pid)) => {
            let _ = kill(pid, Signal::SIGSTOP);
            tokio::time::sleep(hold).await;
            let _ = kill(pid, Signal::SIGCONT);
        }
        (FaultKind::Starve, Action::Signal(pid)) => {
            // 5 ms of CPU in every 100 ms: the holder's renewals and checks run late and
            // seldom, as in a process throttled by its cgroup or a runtime blocked by user
            // code.
            let until = tokio::time::Instant::now() + hold;
            while tokio::time::Instant::now() < until {
                let _ = kill(pid, Signal::SIGSTOP);
                tokio::time::sleep(Duration::from_millis(95)).await;
                let _ = kill(pid, Signal::SIGCONT);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        (FaultKind::Partition, Action::Cut(switches)) => {
            switches.iter().for_each(|s| s.partition(true));
            tokio::time::sleep(hold).await;
            switches.iter().for_each(|s| s.partition(false));
        }
        (FaultKind::Ambiguous, Action::Aim(op, aimer, switches)) => {
            // Within 1.5 ttls (the fault then lasts 3 at most, as the others): a holder gets
            // to its renewals and release within a critical section, a waiter to its next
            // acquire after its release.
            let cut = || switches.iter().for_each(|s| s.lose_replies(true));
            let Some(start) = aimer.aim(op, ttl.mul_f64(1.5), cut).await else {
                return Ok(Inflicted::default());
            };
            tokio::time::sleep(hold).await;
            switches.iter().for_each(|s| s.lose_replies(false));
            return Ok(Inflicted {
                start: Some(start),
                healed: None,
            });
        }
        (FaultKind::Ambiguous, Action::Cut(switches)) => {
            switches.iter().for_each(|s| s.lose_replies(true));
            tokio::time::sleep(hold).await;
            switches.iter().for_each(|s| s.lose_replies(false));
        }
        (FaultKind::Lossy, Action::Cut(switches)) => {
            switches.iter().for_each(|s| s.lossy(true));
            tokio::time::sleep(hold).await;
            switches.iter().for_each(|s| s.lossy(false));
        }
        (FaultKind::Restart, Action::Restart(cmd)) => restart(&cmd).await?,
        (FaultKind::Clock, Action::Clock(file, step)) => {
            set_clock(&file, step)?;
            tokio::time::sleep(hold).await;
            let healed = now();
            set_clock(&file, 0)?;
            return Ok(Inflicted {
                start: None,
                healed: Some(healed),
            });
        }
        _ => {}
    }
    Ok(Inflicted::default())
}

/// A restart slower than this has its output printed (see [`restart`]).
const SLOW_RESTART: Duration = Duration::from_secs(15);

/// What to print of a restart `cmd` that `took` this long with this `stderr`: nothing unless
/// it was slow, else a warning line and the last 40 lines of its output, indented.
fn slow_restart(cmd: &str, took: Duration, stderr: &[u8]) -> Option<String> {
    if took <= SLOW_RESTART {
        return None;
    }
    let stderr = String::from_utf8_lossy(stderr);
    let lines: Vec<&str> = stderr.trim().lines().collect();
    let mut report = format!(
        "distlock check: warning: the restart ({cmd}) took {:.1} s; the end of its output:\n",
        took.as_secs_f64()
    );
    for line in &lines[lines.len().saturating_sub(40)..] {
        report.push_str(&format!("    {line}\n"));
    }
    Some(report)
}

/// Runs the restart command `cmd`. One that fails, or takes longer than [`SLOW_RESTART`],
/// has the end of its output printed on stderr: why a server took so long to come back (its
/// log's last lines, which part of its probe failed) is otherwise lost with the run's servers.
pub(super) async fn restart(cmd: &str) -> Result<(), RunError> {
    let started = std::time::Instant::now();
    let output = tokio::time::timeout(
        Duration::from_secs(120),
        Command::new("sh")
            .args(["-c", cmd])
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .map_err(|_| RunError::Restart("it did not finish within 120 s".into()))?
    .map_err(|err| RunError::Restart(err.to_string()))?;
    if let Some(report) = slow_restart(cmd, started.elapsed(), &output.stderr) {
        eprint!("{report}");
    }
    if output.status.success() {
        Ok(())
    } else {
        let stderr = String::from_utf8_lossy(&output.stderr);
        // The reason is usually a few lines above the last one.
        let lines: Vec<&str> = stderr.trim().lines().collect();
        let tail = lines[lines.len().saturating_sub(5)..].join(" / ");
        Err(RunError::Restart(format!("{}: {tail}", output.status)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slow_restart_prints_the_end_of_its_output() {
        let output: String = (1..=50).map(|i| format!("line {i}\n")).collect();
        assert_eq!(
            slow_restart("restart-one x", SLOW_RESTART, output.as_bytes()),
            None
        );
        let report = slow_restart("restart-one x", Duration::from_secs(75), output.as_bytes())
            .expect("a slow restart is reported");
        let lines: Vec<&str> = report.lines().collect();
        assert_eq!(
            lines[0],
            "distlock check: warning: the restart (restart-one x) took 75.0 s; the end of its output:"
        );
        assert_eq!(lines.len(), 41);
        assert_eq!(lines[1], "    line 11");
        assert_eq!(lines[40], "    line 50");
    }
}
