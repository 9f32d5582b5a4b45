//! A worker's loop: acquire, a critical section of checked and fenced writes, release.
//!
//! The loop is the same in a worker process of `distlock check` (its events go to stdout as
//! JSON lines, its writes to the checking process's register over TCP) and in a task of an
//! in-process test (events and writes straight to memory).

use std::time::{Duration, Instant};

use async_trait::async_trait;
use std::sync::Arc;

use distlock_core::{
    AcquireOptions, DistributedLock, Error, LockGuard, LockKind, MultiGuard, Renewal,
    UpgradeableGuard, UpgradeableRwLock, WriteGuard,
};
use futures::StreamExt as _;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use distlock_core::backend::unpoisoned;

use crate::history::{
    AcqId, Acquisition, Check, Extension, History, Nanos, Observation, Part, at, now,
};
use crate::kind::{CheckKind, Mode, Sabotage};
use crate::register::{Access, FencedRegister};

mod aim;
mod sink;

use aim::aimed;
pub use aim::{AIM_WAIT, Aim, NoAim, Op, StdinAim};
pub use sink::{Recorder, StdoutSink};

/// What a worker does.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerParams {
    /// Its number.
    pub id: u32,
    /// The lock all workers contend for (a multi-lock run: the prefix of its locks' names).
    pub name: String,
    /// The primitive it drives.
    #[serde(default)]
    pub kind: CheckKind,
    /// The lock's ttl.
    pub ttl: Duration,
    /// How long one `acquire` may wait.
    pub wait: Duration,
    /// Checked writes per critical section.
    pub steps: u32,
    /// The work of each step, between its check and its write.
    pub step_gap: Duration,
    /// A deliberate bug, for the checker's self-tests only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sabotage: Option<Sabotage>,
    /// The lock-delay every acquisition asks for ([`AcquireOptions::with_lock_delay`]).
    #[serde(default, skip_serializing_if = "Duration::is_zero")]
    pub lock_delay: Duration,
}

/// One thing a worker did, as it logs it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "e", rename_all = "kebab-case")]
pub enum Event {
    /// `acquire` called.
    Invoke {
        /// The acquisition's number in this worker.
        seq: u64,
        /// When.
        t: Nanos,
        /// What it asks for.
        #[serde(default, skip_serializing_if = "Mode::is_exclusive")]
        mode: Mode,
        /// The locks it asks for (empty: lock 0).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        locks: Vec<u32>,
        /// The acquisition it continues (an upgrade or a downgrade of it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        after: Option<u64>,
    },
    /// `acquire` returned a guard.
    Acquired {
        /// Which acquisition.
        seq: u64,
        /// When.
        t: Nanos,
        /// Its token.
        token: u64,
        /// Its `valid_until`.
        valid_until: Nanos,
        /// A multi-lock's locks with their tokens.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        parts: Vec<Part>,
    },
    /// `acquire` returned an error.
    Failed {
        /// Which acquisition.
        seq: u64,
        /// When.
        t: Nanos,
        /// The error.
        error: String,
    },
    /// A check before a write.
    Check {
        /// Which acquisition.
        seq: u64,
        /// Which step.
        step: u32,
        /// When.
        t: Nanos,
        /// Whether the holder still believed it held the lock.
        passed: bool,
    },
    /// `release` called.
    Release {
        /// Which acquisition.
        seq: u64,
        /// When.
        t: Nanos,
    },
    /// Half a ttl after a successful release, the server still showed the acquisition as the
    /// holder, with a lease that had been extended past the release (a renewal that raced the
    /// release and won).
    Extended {
        /// Which acquisition.
        seq: u64,
        /// When the server was read.
        t: Nanos,
        /// Which lock (a multi-lock's part).
        lock: u32,
        /// Milliseconds the lease still had to run, if the backend tells (else it was held
        /// at all).
        remaining_ms: Option<u64>,
    },
    /// The worker is about to send `op`, the operation an ambiguous-reply fault aims at,
    /// and waits until the checking process has cut its replies (see [`Aim`]).
    Aimed {
        /// The operation.
        op: Op,
        /// When.
        t: Nanos,
    },
    /// The worker's election observer reported a leader.
    Observed {
        /// When.
        t: Nanos,
        /// The leader's term (`None`: no leader, or no term).
        term: Option<u64>,
        /// The leader's value.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        value: Option<String>,
    },
}

/// Where a worker's writes go.
#[async_trait]
pub trait Register: Send + Sync {
    /// Performs `access`; whether the register accepted it.
    ///
    /// # Errors
    /// The register cannot be reached (the worker then stops with that error).
    async fn access(&self, access: Access) -> std::io::Result<bool>;
}

#[async_trait]
impl Register for FencedRegister {
    async fn access(&self, access: Access) -> std::io::Result<bool> {
        Ok(FencedRegister::access(self, access))
    }
}

/// Where a worker's events go.
pub trait Sink: Send + Sync {
    /// Records one event of worker `worker`.
    fn event(&self, worker: u32, event: Event);
}

/// What a worker holds: one guard, a multi-lock's, or an upgradeable lock's upgradeable read
/// or write (each with its gate).
enum Held {
    One(LockGuard),
    All(MultiGuard),
    Upgradeable(UpgradeableGuard),
    Write(WriteGuard),
}

impl Held {
    fn valid_until(&self) -> Instant {
        match self {
            Self::One(guard) => guard.valid_until(),
            Self::All(guard) => guard.valid_until(),
            Self::Upgradeable(guard) => guard.valid_until(),
            Self::Write(guard) => guard.valid_until(),
        }
    }

    fn is_lost(&self) -> bool {
        match self {
            Self::One(guard) => guard.is_lost(),
            Self::All(guard) => guard.is_lost(),
            Self::Upgradeable(guard) => guard.is_lost(),
            Self::Write(guard) => guard.is_lost(),
        }
    }

    /// The guards of the run's locks (not an upgradeable lock's gate).
    fn guards(&self) -> &[LockGuard] {
        match self {
            Self::One(guard) => std::slice::from_ref(guard),
            Self::All(guard) => guard.guards(),
            Self::Upgradeable(guard) => std::slice::from_ref(guard.guard()),
            Self::Write(guard) => std::slice::from_ref(guard.guard()),
        }
    }

    /// Each guard with the index of its lock in the run (0 for a single guard).
    fn indexed<'a>(
        &'a self,
        params: &'a WorkerParams,
    ) -> impl Iterator<Item = (u32, &'a LockGuard)> + 'a {
        self.guards().iter().map(|guard| {
            let index = (0..crate::kind::MULTI_LOCKS)
                .find(|&i| params.kind.lock_name(&params.name, i) == guard.name().as_str())
                .unwrap_or(0);
            (index, guard)
        })
    }

    /// Each lock held with its token.
    fn parts(&self, params: &WorkerParams) -> Vec<Part> {
        self.indexed(params)
            .map(|(lock, guard)| Part {
                lock,
                token: guard.token().get(),
            })
            .collect()
    }

    /// Each lock held with its name and the owner stored for it.
    fn owners(&self, params: &WorkerParams) -> Vec<(u32, String, String)> {
        self.indexed(params)
            .map(|(lock, guard)| {
                let name = guard.name().as_str().to_owned();
                (lock, name, guard.owner().to_owned())
            })
            .collect()
    }

    /// A leader proclaims `value` (refused once it no longer leads: what the
    /// `proclaim-term` rule checks the server did).
    async fn proclaim(&self, value: &str) {
        if let Self::One(guard) = self {
            let _ = guard.proclaim(value).await;
        }
    }

    /// Releases; whether the release succeeded.
    async fn release(self) -> bool {
        // A release that fails (the lock was lost meanwhile) is what the checks are for.
        match self {
            Self::One(guard) => guard.release().await.is_ok(),
            Self::All(guard) => guard.release().await.is_ok(),
            Self::Upgradeable(guard) => guard.release().await.is_ok(),
            Self::Write(guard) => guard.release().await.is_ok(),
        }
    }

    /// What an upgradeable lock's hold becomes halfway through its section: the upgradeable
    /// reader the writer, the writer a plain reader (`None`: no change).
    fn next_mode(&self) -> Option<Mode> {
        match self {
            Self::Upgradeable(_) => Some(Mode::Exclusive),
            Self::Write(_) => Some(Mode::Shared),
            Self::One(_) | Self::All(_) => None,
        }
    }

    /// Upgrades or downgrades (see [`Self::next_mode`]); on failure nothing is held.
    async fn change(
        self,
        lock: &Arc<dyn DistributedLock>,
        params: &WorkerParams,
        options: &AcquireOptions,
    ) -> Result<Self, Error> {
        match self {
            Self::Upgradeable(guard) if params.sabotage == Some(Sabotage::UpgradeByRelease) => {
                let _ = guard.release().await;
                UpgradeableRwLock::new(lock.clone(), &params.name)?
                    .write(options)
                    .await
                    .map(Self::Write)
            }
            Self::Upgradeable(guard) => match guard.upgrade(Some(params.wait)).await {
                Ok(write) => Ok(Self::Write(write)),
                Err(failed) => {
                    if let Some(guard) = failed.guard {
                        let _ = guard.release().await;
                    }
                    Err(failed.error)
                }
            },
            Self::Write(guard) => guard.downgrade().await.map(Self::One),
            held @ (Self::One(_) | Self::All(_)) => Ok(held),
        }
    }
}

/// Acquisition `seq` of the worker, as its kind (and sabotage) says.
async fn acquire(
    lock: &Arc<dyn DistributedLock>,
    params: &WorkerParams,
    options: &AcquireOptions,
    mode: Mode,
    locks: &[u32],
) -> Result<Held, Error> {
    let sabotage = params.sabotage;
    let lock_kind = match (mode, params.kind) {
        (Mode::Exclusive, _) if sabotage == Some(Sabotage::WriterAsReader) => LockKind::Shared,
        (Mode::Exclusive, _) => LockKind::Exclusive,
        (Mode::Shared | Mode::Upgradeable, _) => LockKind::Shared,
        (Mode::Permit, CheckKind::Permits(permits)) => LockKind::Permit {
            permits: permits + u32::from(sabotage == Some(Sabotage::ExtraPermit)),
        },
        (Mode::Permit, _) => LockKind::Permit { permits: 1 },
    };
    let options = options.clone().with_kind(lock_kind);
    match params.kind {
        CheckKind::Election => lock
            .campaign(&params.name, &format!("w{}", params.id), &options)
            .await
            .map(Held::One),
        CheckKind::Multi => {
            let mut names: Vec<String> = locks
                .iter()
                .map(|&i| params.kind.lock_name(&params.name, i))
                .collect();
            if sabotage == Some(Sabotage::PartialMulti) {
                names.truncate(1);
            }
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            lock.acquire_all(&names, &options).await.map(Held::All)
        }
        CheckKind::Upgradeable => {
            let rw = UpgradeableRwLock::new(lock.clone(), &params.name)?;
            match mode {
                Mode::Exclusive => rw.write(&options).await.map(Held::Write),
                Mode::Upgradeable => rw.upgradeable(&options).await.map(Held::Upgradeable),
                _ => rw.read(&options).await.map(Held::One),
            }
        }
        _ => lock.acquire(&params.name, &options).await.map(Held::One),
    }
}

/// Runs worker `params.id` on `lock` until `stop` turns true (checked between acquisitions; a
/// waiting `acquire` is abandoned at once, a critical section in progress is finished and
/// released). In an election run it also observes the leader meanwhile.
///
/// # Errors
/// The register failed; lock errors are events, not errors.
pub async fn work(
    lock: &Arc<dyn DistributedLock>,
    params: &WorkerParams,
    register: &dyn Register,
    sink: &dyn Sink,
    aim: &dyn Aim,
    stop: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let observer = observe(&**lock, params, sink, stop.clone());
    let (released, audits) = tokio::sync::mpsc::unbounded_channel();
    let auditor = audit(&**lock, params, sink, audits);
    let (worked, (), ()) = tokio::join!(
        hold(lock, params, register, sink, aim, stop, released),
        observer,
        auditor
    );
    worked
}

/// A release to audit: the acquisition, when its release returned, and its locks' names and
/// owners.
type Released = (u64, Instant, Vec<(u32, String, String)>);

/// Reads the server's view half a ttl after each successful release (when a renewal of ttl/3
/// would have fired): the released owner must not hold a lease that outlives the release by
/// more than the lease it had (the ttl and the lock-delay). Ends when the worker stops releasing.
async fn audit(
    lock: &dyn DistributedLock,
    params: &WorkerParams,
    sink: &dyn Sink,
    mut audits: tokio::sync::mpsc::UnboundedReceiver<Released>,
) {
    while let Some((seq, released, names)) = audits.recv().await {
        tokio::time::sleep_until((released + params.ttl / 2).into()).await;
        for (lock_index, name, owner) in names {
            let Ok(Some(info)) = lock.inspect(&name).await else {
                continue;
            };
            if info.owner != owner {
                continue;
            }
            // The last renewal before the release could set the lease to end a ttl (and the
            // lock-delay) after it at the latest (plus a margin for the server's clock and the
            // read).
            let latest = released + params.ttl + params.lock_delay + Duration::from_millis(50);
            let ends = info.remaining.map(|r| Instant::now() + r);
            if ends.is_none_or(|ends| ends > latest) {
                sink.event(
                    params.id,
                    Event::Extended {
                        seq,
                        t: now(),
                        lock: lock_index,
                        remaining_ms: info
                            .remaining
                            .map(|r| u64::try_from(r.as_millis()).unwrap_or(u64::MAX)),
                    },
                );
            }
        }
    }
}

/// An election run's observer: each leader `observe` reports, until `stop`.
async fn observe(
    lock: &dyn DistributedLock,
    params: &WorkerParams,
    sink: &dyn Sink,
    mut stop: watch::Receiver<bool>,
) {
    if params.kind != CheckKind::Election {
        return;
    }
    let mut leaders = lock.observe(&params.name, params.ttl / 4);
    loop {
        tokio::select! {
            next = leaders.next() => match next {
                Some(Ok(leader)) => sink.event(params.id, Event::Observed {
                    t: now(),
                    term: leader.as_ref().and_then(|l| l.term).map(|t| t.get()),
                    value: leader.and_then(|l| l.value),
                }),
                Some(Err(_)) => {}
                None => return,
            },
            _ = stop.wait_for(|stop| *stop) => return,
        }
    }
}

/// The event of acquisition `seq` being called (a multi-lock's: with the locks it asks for).
fn invoke(params: &WorkerParams, seq: u64, mode: Mode, locks: &[u32]) -> Event {
    Event::Invoke {
        seq,
        t: now(),
        mode,
        locks: if params.kind == CheckKind::Multi {
            locks.to_vec()
        } else {
            Vec::new()
        },
        after: None,
    }
}

/// The event of acquisition `seq` returning `held` (a multi-lock's: with its parts' tokens).
fn granted(params: &WorkerParams, seq: u64, held: &Held, parts: &[Part]) -> Event {
    Event::Acquired {
        seq,
        t: now(),
        token: parts.first().map_or(0, |p| p.token),
        valid_until: at(held.valid_until()),
        parts: if params.kind == CheckKind::Multi {
            parts.to_vec()
        } else {
            Vec::new()
        },
    }
}

/// What a critical section holds now, and what the history calls it.
struct Section {
    held: Held,
    /// The acquisition it is recorded as.
    seq: u64,
    mode: Mode,
    /// Each lock held with its token.
    parts: Vec<Part>,
}

impl Section {
    /// `held`, granted to acquisition `seq`: recorded.
    fn granted(held: Held, seq: u64, mode: Mode, params: &WorkerParams, sink: &dyn Sink) -> Self {
        let parts = held.parts(params);
        sink.event(params.id, granted(params, seq, &held, &parts));
        Self {
            held,
            seq,
            mode,
            parts,
        }
    }

    /// Upgrades or downgrades (to `mode`), recorded as the end of this acquisition and
    /// acquisition `seq` continuing it; `None` when that failed, and nothing is held.
    async fn change(
        self,
        seq: u64,
        mode: Mode,
        lock: &Arc<dyn DistributedLock>,
        params: &WorkerParams,
        options: &AcquireOptions,
        sink: &dyn Sink,
    ) -> Option<Self> {
        let id = params.id;
        sink.event(
            id,
            Event::Release {
                seq: self.seq,
                t: now(),
            },
        );
        sink.event(
            id,
            Event::Invoke {
                seq,
                t: now(),
                mode,
                locks: Vec::new(),
                after: Some(self.seq),
            },
        );
        match self.held.change(lock, params, options).await {
            Ok(changed) => Some(Self::granted(changed, seq, mode, params, sink)),
            Err(err) => {
                failed(sink, id, seq, &err);
                None
            }
        }
    }
}

/// What the steps of a critical section need.
struct Steps<'a> {
    params: &'a WorkerParams,
    register: &'a dyn Register,
    sink: &'a dyn Sink,
    aim: &'a dyn Aim,
    /// Leaders proclaim at every step.
    proclaims: bool,
    /// The `ignore-validity` sabotage: checks always pass, nothing renews.
    careless: bool,
}

impl Steps<'_> {
    /// Every acquisition's options.
    fn options(&self) -> AcquireOptions {
        let params = self.params;
        let mut options = AcquireOptions::default()
            .with_ttl(params.ttl)
            .with_wait(params.wait);
        if params.sabotage != Some(Sabotage::IgnoreLockDelay) {
            options = options.with_lock_delay(params.lock_delay);
        }
        if self.careless {
            options = options.with_renewal(Renewal::disabled());
        }
        options
    }
}

impl Section {
    /// Step `step` of the section: the check, the work, the fenced accesses; whether the
    /// section goes on (a failed check or a refused access ends it).
    async fn step(&self, step: u32, steps: &Steps<'_>) -> std::io::Result<bool> {
        let (params, sink) = (steps.params, steps.sink);
        let (id, seq, mode) = (params.id, self.seq, self.mode);
        // While at least half a ttl of the section is left: a renewal (every ttl/3) is sent
        // into the fault before the release.
        if params.step_gap * (params.steps - step) >= params.ttl / 2 {
            aimed(steps.aim, sink, id, Op::Renew).await;
        }
        let held = &self.held;
        // The check is stamped with the instant it judged: read again for the stamp, a pause
        // in between (the faults' SIGSTOP) stamped a check that passed in time after the
        // next holder's grant, a false violation.
        let judged = Instant::now();
        let passed = steps.careless || (!held.is_lost() && judged < held.valid_until());
        sink.event(
            id,
            Event::Check {
                seq,
                step,
                t: at(judged),
                passed,
            },
        );
        if !passed {
            return Ok(false);
        }
        if steps.proclaims {
            held.proclaim(&format!("w{id}#{seq}.{step}")).await;
        }
        // The step's work, done in the belief of holding the lock; a pause here makes the
        // write below late.
        tokio::time::sleep(params.step_gap).await;
        // A semaphore guards a pool, not one value: its holders have nothing to fence.
        if mode == Mode::Permit {
            return Ok(true);
        }
        for part in &self.parts {
            let access = Access {
                acq: AcqId { worker: id, seq },
                lock: part.lock,
                token: part.token,
                step,
                read: matches!(mode, Mode::Shared | Mode::Upgradeable),
            };
            // A refused access ends the section; the register records it.
            if !steps.register.access(access).await? {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// Records that acquisition `seq` of worker `id` failed with `err`.
fn failed(sink: &dyn Sink, id: u32, seq: u64, err: &Error) {
    sink.event(
        id,
        Event::Failed {
            seq,
            t: now(),
            error: err.to_string(),
        },
    );
}

async fn hold(
    lock: &Arc<dyn DistributedLock>,
    params: &WorkerParams,
    register: &dyn Register,
    sink: &dyn Sink,
    aim: &dyn Aim,
    mut stop: watch::Receiver<bool>,
    released: tokio::sync::mpsc::UnboundedSender<Released>,
) -> std::io::Result<()> {
    let steps = Steps {
        params,
        register,
        sink,
        aim,
        // A leader proclaims a new value at every step where the backend stores holder data.
        proclaims: params.kind == CheckKind::Election && lock.capabilities().holder_data,
        careless: params.sabotage == Some(Sabotage::IgnoreValidity),
    };
    let options = steps.options();
    let id = params.id;
    // Acquisition numbers; an upgrade or a downgrade takes one of its own, so the kind's
    // rotation of modes and locks goes by critical sections.
    let mut next_seq = 0_u64;
    'acquisitions: for section in 0.. {
        if *stop.borrow() {
            break;
        }
        let seq = next_seq;
        next_seq += 1;
        let mode = params.kind.mode(id, section);
        let locks = params.kind.locks(id, section);
        sink.event(id, invoke(params, seq, mode, &locks));
        aimed(aim, sink, id, Op::Acquire).await;
        let acquired = tokio::select! {
            acquired = acquire(lock, params, &options, mode, &locks) => acquired,
            _ = stop.wait_for(|stop| *stop) => break,
        };
        let held = match acquired {
            Ok(held) => held,
            Err(err) => {
                failed(sink, id, seq, &err);
                if !matches!(err, Error::Timeout { .. }) {
                    // Do not spin on a server that refuses at once.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                continue;
            }
        };
        let mut now_held = Section::granted(held, seq, mode, params, sink);
        for step in 0..params.steps {
            // Halfway, an upgradeable lock's hold upgrades or downgrades: the new mode is an
            // acquisition of its own that continues this one.
            if step == params.steps / 2
                && let Some(next_mode) = now_held.held.next_mode()
            {
                let seq = next_seq;
                next_seq += 1;
                match now_held
                    .change(seq, next_mode, lock, params, &options, sink)
                    .await
                {
                    Some(changed) => now_held = changed,
                    // Nothing is held after a failed change.
                    None => continue 'acquisitions,
                }
            }
            if !now_held.step(step, &steps).await? {
                break;
            }
        }
        aimed(aim, sink, id, Op::Release).await;
        let Section { held, seq, .. } = now_held;
        sink.event(id, Event::Release { seq, t: now() });
        let owners = held.owners(params);
        if held.release().await {
            let _ = released.send((seq, Instant::now(), owners));
        }
    }
    Ok(())
}
