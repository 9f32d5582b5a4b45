//! The watchdog's task: what is due at a tick, the batched renewals it sends, and how it
//! reports their answers.

use super::*;

/// One "no answer" per lease of a batch whose request failed as a whole (every lease is then
/// retried, as after a failed request of its own).
pub(super) fn unanswered(err: &Error, n: usize) -> Vec<Result<()>> {
    (0..n)
        .map(|_| {
            Err(Error::Unavailable {
                message: err.to_string(),
                source: None,
            })
        })
        .collect()
}

/// When to renew after a granted renewal: one `interval` after it was sent, so that the
/// lease keeps `ttl - interval` in hand whatever the answer's latency (scheduling from the
/// answer would lose that latency at every round, and a slow server could run a lease out
/// between two rounds). At least a quarter `interval` from now, so that an overloaded server
/// is not sent renewals back to back.
pub(super) fn next_renewal(held: &dyn Watched, interval: Duration) -> Instant {
    let now = Instant::now();
    let valid_until = held.valid_until();
    if held.hold_limit().is_some_and(|limit| valid_until >= limit) {
        // Clamped to the hold limit: the validity says nothing about the latency.
        return now + interval;
    }
    let in_hand = held.ttl().saturating_sub(interval);
    let by_validity = valid_until.checked_sub(in_hand).unwrap_or(now);
    by_validity.clamp(now + interval / 4, now + interval)
}

/// The next renewal, unless it would fall after the hold limit (`valid_until` is clamped to
/// the limit anyway).
pub(super) fn renew_at(held: &dyn Watched, schedule: &Schedule) -> Option<Instant> {
    schedule
        .next_renewal
        .filter(|at| held.hold_limit().is_none_or(|limit| *at < limit))
}

pub(super) fn next_event(held: &dyn Watched, schedule: &Schedule) -> Instant {
    let valid_until = held.valid_until();
    renew_at(held, schedule).map_or(valid_until, |at| at.min(valid_until))
}

/// Whether a batched guard's renewal, not yet due at `now`, may go with this tick's batch: it
/// falls due within half its interval, and its loss deadline has not passed.
pub(super) fn may_go_early(held: &dyn Watched, now: Instant) -> bool {
    if held.stop().is_raised() || !held.renewing() {
        return false;
    }
    let schedule = lock(held.schedule());
    let Some(at) = renew_at(held, &schedule) else {
        return false;
    };
    let interval = schedule
        .interval
        .unwrap_or_else(|| crate::options::default_renewal_interval(held.ttl()));
    at <= now + interval / 2 && now < held.valid_until()
}

/// Clears `running` if the task is dropped before it decides to end (its runtime shut down),
/// so that the next guard starts a new one.
pub(super) struct Running {
    pub(super) watchdog: Watchdog,
    pub(super) armed: bool,
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.armed {
            let mut state = lock(&self.watchdog.shared.state);
            state.running = false;
            state.wake_at = None;
            state.idle_since = None;
            // The groups' waiting futures went with the task: the next guard of a source
            // starts a new one.
            state.groups.clear();
            state.group_waits.clear();
        }
    }
}

/// Takes the guards due at `now` out of the map, and with them the batched guards that may go
/// early with a renewer that has a due guard. Decides under the map's lock whether the task
/// ends (`None`): once it has been idle for [`IDLE_LINGER`]. `busy`: renewals or per-guard
/// loss signals are still running.
pub(super) fn take_due(state: &mut State, now: Instant, busy: bool) -> Option<Taken> {
    let mut due = Vec::new();
    while let Some(entry) = state.timers.first_entry() {
        if entry.key().0 > now {
            break;
        }
        due.push(entry.remove());
    }
    let mut early = Vec::new();
    let mut renewers: Vec<usize> = due
        .iter()
        .filter_map(|held| held.renewer().map(renewer_id))
        .collect();
    // A few renewers (one per connection or pool), many guards each.
    renewers.sort_unstable();
    renewers.dedup();
    if !renewers.is_empty() {
        let keys: Vec<TimerKey> = state
            .timers
            .iter()
            .filter(|(_, held)| {
                held.renewer()
                    .is_some_and(|r| renewers.contains(&renewer_id(r)))
                    && may_go_early(held.as_ref(), now)
            })
            .map(|(key, _)| *key)
            .collect();
        for key in keys {
            if let Some(held) = state.timers.remove(&key) {
                early.push(held);
            }
        }
    }
    let mut next = state.timers.keys().next().map(|key| key.0);
    let signals = std::mem::take(&mut state.signals);
    let group_waits = std::mem::take(&mut state.group_waits);
    let idle = due.is_empty()
        && next.is_none()
        && signals.is_empty()
        && group_waits.is_empty()
        && !busy
        && state.groups.values().all(|group| group.members.is_empty());
    if idle {
        let since = *state.idle_since.get_or_insert(now);
        let end = since + IDLE_LINGER;
        if now >= end {
            // Decided under the lock: an insert either comes before (and is seen) or after
            // (and starts a new task). The groups' futures end with the task.
            state.running = false;
            state.wake_at = None;
            state.idle_since = None;
            state.groups.clear();
            return None;
        }
        next = Some(end);
    } else {
        state.idle_since = None;
    }
    state.wake_at = next;
    Some(Taken {
        due,
        early,
        next,
        signals,
        group_waits,
    })
}

/// What one turn of the watchdog's loop takes out of the shared state.
pub(super) struct Taken {
    /// Guards whose deadline is due.
    pub(super) due: Vec<Entry>,
    /// Batched guards whose renewal goes early with a due batch.
    pub(super) early: Vec<Entry>,
    /// The next deadline left in the map.
    pub(super) next: Option<Instant>,
    /// New loss signals.
    pub(super) signals: Vec<BoxFuture<'static, ()>>,
    /// The waiting futures of new loss groups.
    pub(super) group_waits: Vec<BoxFuture<'static, ()>>,
}

pub(super) async fn run(watchdog: Watchdog) {
    let mut running = Running {
        watchdog: watchdog.clone(),
        armed: true,
    };
    let shared = &watchdog.shared;
    let mut renewals: FuturesUnordered<BoxFuture<'static, ()>> = FuturesUnordered::new();
    let mut signals: FuturesUnordered<BoxFuture<'static, ()>> = FuturesUnordered::new();
    // Not counted as work: they run as long as the task does.
    let mut group_waits: FuturesUnordered<BoxFuture<'static, ()>> = FuturesUnordered::new();
    loop {
        let now = Instant::now();
        let busy = !renewals.is_empty() || !signals.is_empty();
        let taken = take_due(&mut lock(&shared.state), now, busy);
        let Some(Taken {
            due,
            early,
            next,
            signals: new_signals,
            group_waits: new_group_waits,
        }) = taken
        else {
            running.armed = false;
            return;
        };
        signals.extend(new_signals);
        group_waits.extend(new_group_waits);
        let mut batches: HashMap<usize, (Arc<dyn Renewer>, Vec<Entry>)> = HashMap::default();
        let to_renew = due
            .into_iter()
            .filter_map(|held| {
                lock(held.schedule()).key = None;
                watchdog.due(held, now)
            })
            .chain(early.into_iter().inspect(|held| {
                lock(held.schedule()).key = None;
            }));
        for held in to_renew {
            match held.renewer() {
                Some(renewer) => {
                    let renewer = renewer.clone();
                    batches
                        .entry(renewer_id(&renewer))
                        .or_insert_with(|| (renewer, Vec::new()))
                        .1
                        .push(held);
                }
                None => renewals.push(Box::pin(watchdog.clone().renew(held))),
            }
        }
        for (renewer, mut guards) in batches.into_values() {
            let size = renewer.max_batch().max(1);
            while !guards.is_empty() {
                let rest = guards.split_off(guards.len().min(size));
                let part = std::mem::replace(&mut guards, rest);
                renewals.push(Box::pin(
                    watchdog.clone().renew_batch(renewer.clone(), part),
                ));
            }
        }
        let sleep = async {
            match next {
                Some(at) => sleep_until(at.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = shared.notify.notified() => {}
            () = sleep => {}
            Some(()) = renewals.next(), if !renewals.is_empty() => {}
            Some(()) = signals.next(), if !signals.is_empty() => {}
            Some(()) = group_waits.next(), if !group_waits.is_empty() => {}
        }
    }
}
