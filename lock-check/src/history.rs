//! What happened during a run: acquisitions, checks of the local deadline, writes to the
//! fenced register, faults and worker exits, each stamped with `CLOCK_MONOTONIC`.
//!
//! Every process on one machine reads the same `CLOCK_MONOTONIC`, so events logged by
//! separate worker processes and by the checking process can be merged and compared directly.
//! Times are [`Nanos`]: nanoseconds of that clock ([`now`]).

use serde::{Deserialize, Serialize};

use crate::kind::Mode;

/// Nanoseconds of `CLOCK_MONOTONIC`, the clock every process on the machine shares.
pub type Nanos = u64;

/// The current `CLOCK_MONOTONIC` time.
///
/// Rust's [`Instant`](std::time::Instant) reads this clock on Linux but hides its value; a
/// history needs the value itself to merge the logs of several processes.
pub fn now() -> Nanos {
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .expect("CLOCK_MONOTONIC is always readable");
    let secs = u64::try_from(ts.tv_sec()).unwrap_or(0);
    let nanos = u64::try_from(ts.tv_nsec()).unwrap_or(0);
    secs * 1_000_000_000 + nanos
}

/// `now()` for an [`Instant`](std::time::Instant) of this process (e.g. a guard's
/// `valid_until`), by its distance from the present.
pub fn at(instant: std::time::Instant) -> Nanos {
    let (mono, here) = (now(), std::time::Instant::now());
    if instant >= here {
        mono.saturating_add(nanos_of(instant - here))
    } else {
        mono.saturating_sub(nanos_of(here - instant))
    }
}

/// A duration in [`Nanos`], saturating.
pub fn nanos_of(duration: std::time::Duration) -> Nanos {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// Identifies one acquisition: the worker that made it and its sequence number there.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct AcqId {
    /// The worker's number (a replacement for a killed worker gets a new number).
    pub worker: u32,
    /// The acquisition's number within the worker, from 0.
    pub seq: u64,
}

impl std::fmt::Display for AcqId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "w{}#{}", self.worker, self.seq)
    }
}

/// One call of `acquire` by a worker, from its call to its end.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Acquisition {
    /// Which acquisition.
    pub id: AcqId,
    /// What it asked for (a reader, a permit, the whole lock).
    #[serde(default, skip_serializing_if = "Mode::is_exclusive")]
    pub mode: Mode,
    /// The locks of the run it asked for, by index (a multi-lock asks for several; empty:
    /// lock 0 alone).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub locks: Vec<u32>,
    /// For a multi-lock, the locks it got with their tokens (`token` is then the first's).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<Part>,
    /// The acquisition of the same worker this one continues without a gap for another
    /// writer: an upgrade of that upgradeable read, or a downgrade of that write.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<u64>,
    /// When `acquire` was called.
    pub invoked: Nanos,
    /// When it returned; `None` if the worker died or hung before.
    pub returned: Option<Nanos>,
    /// Its fencing token, if it returned a guard.
    pub token: Option<u64>,
    /// The guard's `valid_until`, if it returned one.
    pub valid_until: Option<Nanos>,
    /// Why it failed, if it returned an error.
    pub error: Option<String>,
    /// When the holder called `release` (or `None`: it did not).
    pub released: Option<Nanos>,
    /// When the holder learnt its lock was lost (a failed check or the loss signal).
    pub lost: Option<Nanos>,
}

impl Acquisition {
    /// Whether it returned a guard.
    pub fn acquired(&self) -> bool {
        self.token.is_some() && self.returned.is_some()
    }

    /// The locks it asked for, by index.
    pub fn wanted(&self) -> Vec<u32> {
        if self.locks.is_empty() {
            vec![0]
        } else {
            self.locks.clone()
        }
    }

    /// Its token on lock `lock`, if it holds that lock.
    pub fn token_of(&self, lock: u32) -> Option<u64> {
        if self.parts.is_empty() {
            self.token.filter(|_| lock == 0)
        } else {
            self.parts.iter().find(|p| p.lock == lock).map(|p| p.token)
        }
    }
}

/// One lock of a multi-lock acquisition, with its token.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Part {
    /// The lock's index in the run.
    pub lock: u32,
    /// Its fencing token.
    pub token: u64,
}

/// A released acquisition that the server still showed as the holder half a ttl later, with
/// a lease extended past its release: a renewal raced the release and won.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Extension {
    /// Which acquisition.
    pub acq: AcqId,
    /// When the server was read.
    pub at: Nanos,
    /// Which lock.
    pub lock: u32,
    /// What the lease had left, if the backend tells.
    pub remaining_ms: Option<u64>,
}

/// What an election observer (`observe`) in a worker reported.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Observation {
    /// The observing worker.
    pub worker: u32,
    /// When it reported.
    pub at: Nanos,
    /// The leader's term (`None`: no leader, or a leader without a term).
    pub term: Option<u64>,
    /// The leader's value: `w<worker>` as it campaigned, or `w<worker>#<seq>.<step>` as it
    /// proclaimed in step `step` of its acquisition `seq` (where the backend stores holder
    /// data).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

/// A holder's check, before a write, that its lock is still valid:
/// `!guard.is_lost() && now < guard.valid_until()`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Check {
    /// Whose.
    pub acq: AcqId,
    /// Which step of the critical section.
    pub step: u32,
    /// When it was made.
    pub at: Nanos,
    /// Whether the holder believed it still held the lock.
    pub passed: bool,
}

/// A write (or a reader's read) to the fenced register, as the register saw it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Write {
    /// Whose.
    pub acq: AcqId,
    /// Which lock's resource (a multi-lock run has one per lock).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub lock: u32,
    /// A reader's read: accepted unless a writer with a larger token wrote; it raises the
    /// token a later write needs.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub read: bool,
    /// The token it carried.
    pub token: u64,
    /// Which step of the critical section.
    pub step: u32,
    /// When the register received it.
    pub at: Nanos,
    /// Whether the register accepted it (its token was at least the largest accepted).
    pub accepted: bool,
}

#[allow(
    clippy::trivially_copy_pass_by_ref,
    reason = "serde's skip_serializing_if passes a reference"
)]
fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// The kinds of fault a nemesis injects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// A worker stopped (`SIGSTOP`) and continued (`SIGCONT`): a GC pause.
    Pause,
    /// A worker killed (`SIGKILL`) and replaced by a fresh one.
    Crash,
    /// A worker's traffic to the server black-holed, sockets kept open.
    Partition,
    /// The server killed and restarted with its data directory.
    Restart,
    /// A worker's requests reach the server but every reply is lost, then its connections
    /// close: a request that failed on the client but took effect on the server.
    Ambiguous,
    /// A worker throttled to 5 % of a CPU (stopped 95 ms in every 100 ms): a starved runtime.
    Starve,
    /// A worker's traffic held back at random, in order (jitter, and retransmitted losses of
    /// 200-600 ms).
    Lossy,
    /// The server's wall clock stepped forward (or back) by more than a ttl, held there, then
    /// set right: through the control file of a server run under libfaketime
    /// ([`Fault::step_ms`] says which way). The monotonic clocks keep running true.
    Clock,
}

impl FaultKind {
    /// Every kind, in a fixed order.
    pub const ALL: [Self; 8] = [
        Self::Pause,
        Self::Crash,
        Self::Partition,
        Self::Restart,
        Self::Ambiguous,
        Self::Starve,
        Self::Lossy,
        Self::Clock,
    ];

    /// The name used on the command line and in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pause => "pause",
            Self::Crash => "crash",
            Self::Partition => "partition",
            Self::Restart => "restart",
            Self::Ambiguous => "ambiguous",
            Self::Starve => "starve",
            Self::Lossy => "lossy",
            Self::Clock => "clock",
        }
    }
}

impl std::fmt::Display for FaultKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for FaultKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|kind| kind.as_str() == s)
            .ok_or_else(|| {
                format!(
                    "unknown fault {s:?} (expected pause, crash, partition, restart, \
                     ambiguous, starve, lossy or clock)"
                )
            })
    }
}

/// One injected fault, from its start to its healing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fault {
    /// What.
    pub kind: FaultKind,
    /// The worker it hit (`None`: the server).
    pub worker: Option<u32>,
    /// When it began.
    pub start: Nanos,
    /// When it was healed (the process continued, the replacement started, traffic flowed
    /// again, the server answered again, the server's clock was set right).
    pub healed: Nanos,
    /// A clock fault's step in milliseconds: positive, the server's wall clock jumped forward
    /// at `start` and back at `healed`; negative, back at `start` and forward at `healed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_ms: Option<i64>,
    /// The operation an ambiguous-reply fault was aimed at (`None`: at whatever the worker
    /// sent while it lasted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aimed: Option<crate::worker::Op>,
}

impl Fault {
    /// When a clock fault stepped the server's wall clock forward (at its start for a
    /// forward step, at its healing for a step back); `None` for other faults.
    pub fn forward_step_at(&self) -> Option<Nanos> {
        match (self.kind, self.step_ms) {
            (FaultKind::Clock, Some(step)) if step > 0 => Some(self.start),
            (FaultKind::Clock, Some(step)) if step < 0 => Some(self.healed),
            _ => None,
        }
    }
}

/// Which operations of their victims the ambiguous-reply faults reached: a fault reaches an
/// acquire in flight during it, a release called during it, and a renewal when the victim
/// held a lock through it for at least one renewal interval (a renewal was then sent into it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reach {
    /// `acquire` calls in flight while replies were lost.
    pub acquires: u64,
    /// Holds that spanned a renewal interval while replies were lost.
    pub renewals: u64,
    /// `release` calls made while replies were lost.
    pub releases: u64,
}

/// The clock faults of a run: how many stepped the server's wall clock forward first, how
/// many back first, and the largest step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClockSteps {
    /// Steps forward (then back when set right).
    pub forward: u64,
    /// Steps back (then forward when set right).
    pub back: u64,
    /// The largest step, in milliseconds.
    pub largest_ms: u64,
}

impl History {
    /// The clock faults of this run (see [`ClockSteps`]).
    pub fn clock_steps(&self) -> ClockSteps {
        let mut steps = ClockSteps::default();
        for step in self.faults.iter().filter_map(|f| f.step_ms) {
            if step > 0 {
                steps.forward += 1;
            } else {
                steps.back += 1;
            }
            steps.largest_ms = steps.largest_ms.max(step.unsigned_abs());
        }
        steps
    }

    /// How many ambiguous-reply faults were aimed at each operation.
    pub fn ambiguous_aimed(&self) -> Reach {
        let mut aimed = Reach::default();
        for op in self.faults.iter().filter_map(|f| f.aimed) {
            match op {
                crate::worker::Op::Acquire => aimed.acquires += 1,
                crate::worker::Op::Renew => aimed.renewals += 1,
                crate::worker::Op::Release => aimed.releases += 1,
            }
        }
        aimed
    }

    /// What the ambiguous-reply faults of this run reached (see [`Reach`]); `renew_every` is
    /// the holders' renewal interval.
    pub fn ambiguous_reach(&self, renew_every: Nanos) -> Reach {
        let mut reach = Reach::default();
        for fault in &self.faults {
            let (FaultKind::Ambiguous, Some(victim)) = (fault.kind, fault.worker) else {
                continue;
            };
            let (start, healed) = (fault.start, fault.healed);
            for a in self.acquisitions.iter().filter(|a| a.id.worker == victim) {
                let returned = a.returned.unwrap_or(self.end);
                if a.invoked <= healed && returned >= start {
                    reach.acquires += 1;
                }
                if a.released.is_some_and(|at| (start..=healed).contains(&at)) {
                    reach.releases += 1;
                }
                if a.acquired() {
                    let held_until = [a.released, a.lost].into_iter().flatten().min();
                    let from = returned.max(start);
                    let to = held_until.unwrap_or(self.end).min(healed);
                    if to.saturating_sub(from) >= renew_every {
                        reach.renewals += 1;
                    }
                }
            }
        }
        reach
    }
}

/// How a worker process ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WorkerEnd {
    /// It stopped when asked, exit status 0.
    Clean,
    /// The nemesis killed it.
    Killed,
    /// It exited on its own with a failure (a panic, an error): the text says how.
    Failed(String),
    /// It did not stop within the grace period after being asked, and was killed.
    Hung,
}

/// One worker process.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Worker {
    /// Its number.
    pub id: u32,
    /// How it ended.
    pub end: WorkerEnd,
}

/// The acquisition made after every fault was healed, to show the lock is usable again.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinalAcquire {
    /// When it was called.
    pub invoked: Nanos,
    /// When it returned.
    pub returned: Nanos,
    /// Its token if it succeeded, else `None` and the error.
    pub token: Option<u64>,
    /// Why it failed.
    pub error: Option<String>,
}

/// Everything one run recorded, merged from every process.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct History {
    /// When the workers were started.
    pub start: Nanos,
    /// When they were asked to stop.
    pub end: Nanos,
    /// Every acquisition.
    pub acquisitions: Vec<Acquisition>,
    /// Every check before a write.
    pub checks: Vec<Check>,
    /// Every write the register received.
    pub writes: Vec<Write>,
    /// Every report of an election observer.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub observations: Vec<Observation>,
    /// Every lease seen extended after its release.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extensions: Vec<Extension>,
    /// Every fault.
    pub faults: Vec<Fault>,
    /// Every worker process.
    pub workers: Vec<Worker>,
    /// The acquisition after healing.
    pub final_acquire: Option<FinalAcquire>,
}
