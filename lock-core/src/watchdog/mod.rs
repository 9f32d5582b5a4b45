//! The renewal and loss deadlines of all guards of one client, driven by one task.
//!
//! A guard costs a map entry, not a task with its own timers: acquiring and releasing touch a
//! mutex-protected ordered map and nothing else, and the task wakes only when a deadline is
//! due (renewals run concurrently inside it). The task starts with the first guard and ends
//! once no deadline has been left for [`IDLE_LINGER`]: a client that takes and releases locks
//! back to back (each guard shorter than a renewal interval) neither spawns a task nor wakes
//! one per lock, which cost a cross-thread wake-up or two per acquisition on a multi-thread
//! runtime.
//!
//! Renewals of leases with a [`Renewer`] are batched: at a tick, every due lease of one
//! renewer goes to the server in one `renew_many` call per `max_batch` leases, together with
//! the leases of that renewer that are at least half-way to their next renewal. Renewing those
//! early (by at most half an interval, so never more than twice as often) merges the leases'
//! schedules: within two rounds every lease of a renewer with one renewal interval falls due at
//! the same tick, and a client holding K locks sends ceil(K / max_batch) requests per renewal
//! interval, whenever the locks were taken.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

// Keyed by addresses, which no caller chooses: a fast hasher. SipHash took 0.42k of the 26.5k
// instructions of an uncontended acquire and release (callgrind).
use foldhash::HashMap;

use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, StreamExt};
use tokio::sync::Notify;
use tokio::time::sleep_until;
use tracing::{Instrument, debug};

use crate::backend::unpoisoned as lock;
use crate::backend::{Lease, LossEpochs, RenewItem, Renewer, within};
use crate::flag::Flag;
use crate::telemetry::{Handles, Op};
use crate::{Error, LockName, LossReason, Result};

mod task;
#[cfg(test)]
mod tests;

use task::*;

/// What the watchdog needs of a guard: its schedule, deadlines and renewal. (The guard
/// implements it; the watchdog knows nothing else of guards.)
pub(crate) trait Watched: Send + Sync + 'static {
    /// The renewal state the watchdog keeps in the guard.
    fn schedule(&self) -> &Mutex<Schedule>;
    /// Cancelled when the guard stops (release, drop, a reported loss).
    fn stop(&self) -> Flag<'_>;
    /// The local deadline.
    fn valid_until(&self) -> Instant;
    /// Renewal stops so that the lock is not held past this instant.
    fn hold_limit(&self) -> Option<Instant>;
    /// The lease length the holder counts on.
    fn ttl(&self) -> Duration;
    /// The lease asked of the server at a renewal (the ttl plus any lock-delay).
    fn lease_ttl(&self) -> Duration;
    /// The lock, for traces.
    fn name(&self) -> &LockName;
    /// False once every guard is gone or the lock was abandoned.
    fn renewing(&self) -> bool;
    /// Records a loss (the first reason wins).
    fn mark_lost(&self, reason: LossReason);
    /// One renewal request, which moves the local deadline on success.
    fn renew_once(&self) -> BoxFuture<'_, Result<()>>;
    /// The local deadline passed without a renewal: the lease ran out (loss already marked).
    fn ran_out(self: Arc<Self>);
    /// The batch its automatic renewals go to, if the backend batches.
    fn renewer(&self) -> Option<&Arc<dyn Renewer>>;
    /// The lease, for a batched renewal.
    fn lease(&self) -> &dyn Lease;
    /// The backend's name, for traces.
    fn backend(&self) -> &'static str;
    /// The bound on one backend request.
    fn operation_timeout(&self) -> Duration;
    /// Applies the answer to a renewal sent at `sent` (see `Held::settle_renewal`).
    fn settle_renewal(&self, sent: Instant, result: Result<()>) -> Result<()>;
    /// The guard's metric handles.
    fn metrics(&self) -> &Handles;
    /// The [`LossEpochs`] source this guard joined (its id), if any.
    fn loss_group(&self) -> Option<usize>;
    /// The backend learned by itself that the lock is gone: ends the guard with `reason` (a
    /// removal found past the local deadline is an expiry).
    fn signal_loss(&self, reason: LossReason);
}

/// How long the task stays, idle (no deadline, renewal or loss signal left, no guard in a
/// loss group), before it ends. A guard taken meanwhile finds it running (no spawn) and its
/// loss group still watched (no new future): taking and releasing a lock wakes nobody.
pub(crate) const IDLE_LINGER: Duration = Duration::from_secs(1);

/// The guards that joined one [`LossEpochs`] source, and the epoch each was taken in. A group
/// lives as long as the watchdog task that waits for its source (also while it has no
/// member), so that guards taken one after another share one wait.
struct Group {
    members: HashMap<usize, (u64, std::sync::Weak<dyn Watched>)>,
    /// Keeps the source, so that its address (the group's key) cannot be another source's
    /// while the group exists.
    _source: LossEpochs,
}

/// Identifies a guard in its loss group: the address of its shared state.
fn member_key(held: &dyn Watched) -> usize {
    std::ptr::from_ref(held).cast::<()>() as usize
}

/// A renewer's identity: the address of its shared value.
fn renewer_id(renewer: &Arc<dyn Renewer>) -> usize {
    Arc::as_ptr(renewer).cast::<()>() as usize
}

type Entry = Arc<dyn Watched>;

/// Where a guard sits in the deadline map.
pub(crate) type TimerKey = (Instant, u64);

/// A guard's renewal state, kept in the guard and read by the watchdog.
#[derive(Debug)]
pub(crate) struct Schedule {
    /// The guard's current entry in the map (none while a renewal runs, or once done).
    key: Option<TimerKey>,
    /// The next automatic renewal, if renewal is on and the lock is still renewed.
    next_renewal: Option<Instant>,
    /// The automatic renewal interval (none: renewal disabled).
    interval: Option<Duration>,
    /// The last renewal failed without an answer (the loss reason becomes ConnectionLost).
    failing: bool,
}

impl Schedule {
    pub(crate) fn new(acquired_at: Instant, interval: Option<Duration>) -> Self {
        Self {
            key: None,
            next_renewal: interval.map(|i| acquired_at + i),
            interval,
            failing: false,
        }
    }

    /// Why a guard with this schedule lost its lock once its local deadline `valid_until`
    /// passed: its renewals were failing, the deadline is its `hold_limit`, or its lease
    /// simply ran out.
    pub(crate) fn expiry_reason(
        &self,
        hold_limit: Option<Instant>,
        valid_until: Instant,
    ) -> LossReason {
        if self.failing {
            LossReason::ConnectionLost
        } else if hold_limit.is_some_and(|limit| valid_until >= limit) {
            LossReason::HoldLimitReached
        } else {
            LossReason::LeaseExpired
        }
    }
}

/// The deadline map and its task. Cheap to clone (clones share both).
#[derive(Clone, Default)]
pub(crate) struct Watchdog {
    shared: Arc<WatchdogState>,
}

#[derive(Default)]
struct WatchdogState {
    state: Mutex<State>,
    /// Wakes the task when a deadline earlier than the one it sleeps towards arrives.
    notify: Notify,
    seq: AtomicU64,
}

#[derive(Default)]
struct State {
    timers: BTreeMap<TimerKey, Entry>,
    running: bool,
    /// The deadline the task sleeps towards (while idle: the end of its linger).
    wake_at: Option<Instant>,
    /// When the task found itself idle, if nothing happened since (see [`IDLE_LINGER`]).
    idle_since: Option<Instant>,
    /// Backends' loss signals of new guards, for the task to poll.
    signals: Vec<BoxFuture<'static, ()>>,
    /// The waiting futures of new loss groups, for the task to poll.
    group_waits: Vec<BoxFuture<'static, ()>>,
    groups: HashMap<usize, Group>,
}

impl Watchdog {
    /// Starts watching a new guard.
    pub(crate) fn watch(&self, held: &Entry) {
        let at = next_event(held.as_ref(), &lock(held.schedule()));
        self.insert(held, at);
    }

    /// Polls `signal` (a backend's own loss report, which ends by itself when its guard
    /// stops) in the watchdog's task, so that a guard with a loss signal costs a boxed future,
    /// not a task of its own.
    pub(crate) fn watch_loss(&self, signal: BoxFuture<'static, ()>) {
        let mut state = lock(&self.shared.state);
        state.signals.push(signal);
        self.wake_for_future(state);
    }

    /// Has the task take a new future out of `state` (starting it if it is not running).
    fn wake_for_future(&self, mut state: std::sync::MutexGuard<'_, State>) {
        state.idle_since = None;
        if state.running {
            drop(state);
            self.shared.notify.notify_one();
        } else {
            state.running = true;
            drop(state);
            tokio::spawn(run(self.clone()));
        }
    }

    /// Stops watching (release, drop): removes the guard's entry at once.
    pub(crate) fn unwatch(&self, held: &dyn Watched) {
        let key = lock(held.schedule()).key.take();
        if key.is_none() && held.loss_group().is_none() {
            return;
        }
        let mut state = lock(&self.shared.state);
        // The task sleeps towards this guard's deadline, the last one: it would wake then for
        // nothing, and only start its idle linger after that (10 s after a 30 s lease was
        // taken). Woken now instead, it lingers from now: the same one wake-up, earlier.
        let mut wake = false;
        if let Some(key) = key {
            state.timers.remove(&key);
            wake = state.timers.is_empty() && state.wake_at == Some(key.0);
        }
        // The group stays, empty or not, with the task (see `Group`).
        if let Some(id) = held.loss_group()
            && let Some(group) = state.groups.get_mut(&id)
        {
            group.members.remove(&member_key(held));
        }
        drop(state);
        if wake {
            self.shared.notify.notify_one();
        }
    }

    /// Adds `held`, taken in epoch `since` of `epochs`, to that source's group: lost by the
    /// source's next event with a reason. The first member of a group starts the one future
    /// that waits for the source; the group and its future stay until the task ends (idle),
    /// so that the next guards join them without waking the task.
    pub(crate) fn join_loss(&self, epochs: &LossEpochs, since: u64, held: &Entry) {
        let id = epochs.id();
        let mut state = lock(&self.shared.state);
        let mut started = false;
        let group = state.groups.entry(id).or_insert_with(|| {
            started = true;
            Group {
                members: HashMap::default(),
                _source: epochs.clone(),
            }
        });
        group
            .members
            .insert(member_key(held.as_ref()), (since, Arc::downgrade(held)));
        if started {
            // Subscribed under the lock that created the group, before any later event:
            // none is missed.
            let events = epochs.subscribe();
            let waiting = self.clone().wait_group(id, epochs.clone(), events);
            state.group_waits.push(Box::pin(waiting));
            self.wake_for_future(state);
        } else {
            drop(state);
        }
        // A loss between the lease's epoch and its joining.
        if let Some((at, reason)) = epochs.last_loss()
            && at > since
        {
            self.lose_members(id, at, &reason);
        }
    }

    /// The one future per loss group: on each event with a reason, ends every member taken in
    /// an earlier epoch. Runs until the task ends (which drops it with the group).
    async fn wait_group(
        self,
        id: usize,
        epochs: LossEpochs,
        mut events: tokio::sync::watch::Receiver<(u64, Option<LossReason>)>,
    ) {
        loop {
            if events.changed().await.is_err() {
                // Not while `epochs` is held; ends rather than spinning if it were.
                return;
            }
            events.mark_unchanged();
            if let Some((at, reason)) = epochs.last_loss() {
                self.lose_members(id, at, &reason);
            }
        }
    }

    fn lose_members(&self, id: usize, epoch: u64, reason: &LossReason) {
        let lost: Vec<Entry> = {
            let mut state = lock(&self.shared.state);
            let Some(group) = state.groups.get_mut(&id) else {
                return;
            };
            let mut lost = Vec::new();
            group.members.retain(|_, (since, held)| {
                if *since >= epoch {
                    return true;
                }
                lost.extend(held.upgrade());
                false
            });
            lost
        };
        for held in lost {
            held.signal_loss(reason.clone());
        }
    }

    fn insert(&self, held: &Entry, at: Instant) {
        let key = (at, self.shared.seq.fetch_add(1, Ordering::Relaxed));
        lock(held.schedule()).key = Some(key);
        let mut state = lock(&self.shared.state);
        state.timers.insert(key, held.clone());
        if held.stop().is_raised() {
            // Stopped while a renewal ran: `unwatch` (which runs after the stop) may have
            // found no key yet, so take the entry out here.
            state.timers.remove(&key);
            return;
        }
        state.idle_since = None;
        // A running task is woken only for a deadline earlier than the one it sleeps
        // towards: otherwise it finds this one when it wakes.
        if !state.running {
            state.running = true;
            state.wake_at = Some(at);
            drop(state);
            tokio::spawn(run(self.clone()));
        } else if state.wake_at.is_none_or(|wake| at < wake) {
            state.wake_at = Some(at);
            drop(state);
            self.shared.notify.notify_one();
        }
    }

    /// Handles a guard whose deadline is due: the loss deadline passed, a renewal is due
    /// (returns the guard, to be renewed), or neither (it goes back into the map).
    fn due(&self, held: Entry, now: Instant) -> Option<Entry> {
        if held.stop().is_raised() {
            return None;
        }
        let valid_until = held.valid_until();
        let mut schedule = lock(held.schedule());
        if now >= valid_until {
            let reason = schedule.expiry_reason(held.hold_limit(), valid_until);
            drop(schedule);
            held.mark_lost(reason);
            held.stop().raise();
            held.ran_out();
            return None;
        }
        let renew_due = renew_at(held.as_ref(), &schedule).is_some_and(|at| at <= now);
        if renew_due && held.renewing() {
            return Some(held.clone());
        }
        if renew_due {
            // Abandoned: keep only the loss deadline, so that `lost()` still fires.
            schedule.next_renewal = None;
        }
        let at = next_event(held.as_ref(), &schedule);
        drop(schedule);
        self.insert(&held, at);
        None
    }

    /// One guard's renewal by its own request.
    async fn renew(self, held: Entry) {
        let valid_until = held.valid_until();
        let result = tokio::select! {
            biased;
            () = held.stop().raised() => return,
            () = sleep_until(valid_until.into()) => {
                held.mark_lost(LossReason::ConnectionLost);
                held.stop().raise();
                held.ran_out();
                return;
            }
            result = held.renew_once() => result,
        };
        self.renewed(&held, &result);
    }

    /// The renewals of `batch` (leases of one renewer, at most its `max_batch`) by one
    /// `renew_many` request. A guard whose local deadline passes before the answer is lost
    /// (`ConnectionLost`), as with a request of its own; a guard stopped meanwhile is left out.
    async fn renew_batch(self, renewer: Arc<dyn Renewer>, mut batch: Vec<Entry>) {
        batch.retain(|held| !held.stop().is_raised());
        let Some(first) = batch.first() else { return };
        let span = tracing::debug_span!(
            "distlock.renew_batch",
            backend = first.backend(),
            locks = batch.len()
        );
        let timeout = first.operation_timeout();
        let sent = Instant::now();
        let items: Vec<RenewItem<'_>> = batch
            .iter()
            .map(|held| RenewItem::new(held.lease(), held.lease_ttl()))
            .collect();
        let what = format_args!("batched renewal of {} locks", items.len()).to_string();
        let request = within(timeout, what, renewer.renew_many(&items)).instrument(span);
        tokio::pin!(request);
        // Guards whose local deadline passed while the request was out.
        let mut expired = vec![false; batch.len()];
        let answer = loop {
            let next_deadline = batch
                .iter()
                .zip(&expired)
                .filter(|(_, gone)| !**gone)
                .map(|(held, _)| held.valid_until())
                .min();
            let Some(deadline) = next_deadline else {
                break None;
            };
            tokio::select! {
                biased;
                answer = &mut request => break Some(answer.and_then(|a| a)),
                () = sleep_until(deadline.into()) => {
                    let now = Instant::now();
                    for (held, gone) in batch.iter().zip(expired.iter_mut()) {
                        if !*gone && now >= held.valid_until() {
                            *gone = true;
                            held.mark_lost(LossReason::ConnectionLost);
                            held.stop().raise();
                            held.clone().ran_out();
                        }
                    }
                }
            }
        };
        let Some(answer) = answer else { return };
        for held in &batch {
            held.metrics().operation(Op::Renew, sent);
        }
        let mut results = match answer {
            Ok(results) if results.len() == batch.len() => results,
            Ok(results) => {
                let err = Error::Backend {
                    message: format!(
                        "batched renewal answered {} results for {} locks",
                        results.len(),
                        batch.len()
                    ),
                    source: None,
                };
                first.metrics().backend_error(&err);
                unanswered(&err, batch.len())
            }
            Err(err) => {
                first.metrics().backend_error(&err);
                unanswered(&err, batch.len())
            }
        };
        for ((held, result), gone) in batch.iter().zip(results.drain(..)).zip(expired) {
            if gone || held.stop().is_raised() {
                continue;
            }
            if let Err(err) = &result {
                held.metrics().backend_error(err);
            }
            let settled = held.settle_renewal(sent, result);
            self.renewed(held, &settled);
        }
    }

    /// Schedules what follows a renewal's answer: the next renewal, a retry, or nothing (a
    /// refusal already reported the loss).
    fn renewed(&self, held: &Entry, result: &Result<()>) {
        let mut schedule = lock(held.schedule());
        let interval = schedule
            .interval
            .unwrap_or_else(|| crate::options::default_renewal_interval(held.ttl()));
        match result {
            Ok(()) => {
                schedule.failing = false;
                schedule.next_renewal = Some(next_renewal(held.as_ref(), interval));
            }
            // Refused: the settlement reported the loss.
            Err(err) if err.is_not_held() => {
                drop(schedule);
                held.stop().raise();
                return;
            }
            Err(err) => {
                schedule.failing = true;
                let retry = (interval / 4).clamp(Duration::from_millis(5), Duration::from_secs(1));
                debug!(%err, ?retry, name = %held.name(), "renewal failed, retrying");
                schedule.next_renewal = Some(Instant::now() + retry);
            }
        }
        let at = next_event(held.as_ref(), &schedule);
        drop(schedule);
        self.insert(held, at);
    }
}
