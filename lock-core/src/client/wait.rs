//! The machinery of a waiting acquisition: when it polls again, what it reports while it
//! waits, the cleanup of an attempt it gives up, and what it does with a late grant.

use super::*;
use crate::finish::to_the_end;

/// A backend's grant, and when its lease started on the client's clock.
pub(super) struct Grant {
    pub(super) acquired: Acquired,
    /// The earlier of the backend's lease start and the send of the poll that returned it.
    pub(super) lease_started: Instant,
    pub(super) ttl: Duration,
    /// [`ClientConfig::drift`] of the ttl.
    pub(super) drift: Duration,
}

impl Grant {
    pub(super) fn new(acquired: Acquired, sent: Instant, ttl: Duration, drift: Duration) -> Self {
        let lease_started = acquired.lease_started.map_or(sent, |s| s.min(sent));
        Self {
            acquired,
            lease_started,
            ttl,
            drift,
        }
    }

    /// Whether the grant came back after the lease it grants had run out (the process was
    /// paused, or the answer held up past the ttl): somebody else may hold the lock by now.
    pub(super) fn is_late(&self) -> bool {
        Instant::now() >= self.lease_started + self.ttl - self.drift
    }
}

/// When a waiting acquisition gives up (`None`: never; a try never waits). A wait too long
/// to represent as an instant is a wait forever.
pub(super) fn wait_deadline(
    mode: AttemptMode,
    options: &AcquireOptions,
    started: Instant,
) -> Option<Instant> {
    match mode {
        AttemptMode::Try => None,
        AttemptMode::Wait => options.wait.and_then(|w| started.checked_add(w)),
    }
}

/// `guard` with the data `options` ask for stored; never handed out without it (released
/// when the data cannot be stored).
pub(super) async fn with_data(guard: LockGuard, options: &AcquireOptions) -> Result<LockGuard> {
    if let Some(data) = &options.data
        && let Err(err) = guard.set_data(Some(data)).await
    {
        let _ = guard.release().await;
        return Err(err);
    }
    Ok(guard)
}

/// What an acquisition does between two polls.
pub(super) struct Waits<'a> {
    pub(super) name: &'a LockName,
    pub(super) mode: AttemptMode,
    pub(super) started: Instant,
    /// [`wait_deadline`].
    pub(super) deadline: Option<Instant>,
}

impl Waits<'_> {
    /// After an answer that did not grant the lock (`last_error`: the poll failed, and is
    /// retried): ends a try, and a wait whose deadline passed, with their result; else waits
    /// up to `delay` for a wake-up, and `None`: poll again.
    pub(super) async fn pause(
        &self,
        attempt: &mut AttemptCleanup,
        pacing: &mut Pacing,
        metrics: &Handles,
        delay: Duration,
        last_error: &mut Option<Error>,
    ) -> Option<Result<Option<LockGuard>>> {
        if self.mode == AttemptMode::Try {
            metrics.refused();
            attempt.abandon().await;
            return Some(Ok(None));
        }
        let Some(sleep) = until_next_attempt(self.deadline, delay) else {
            attempt.abandon().await;
            if last_error.is_none() {
                metrics.timed_out();
            }
            let error = last_error
                .take()
                .unwrap_or_else(|| timed_out(self.name, self.started));
            return Some(Err(error));
        };
        // Cut short by the deadline: unless a wake-up comes first, this is the last sleep.
        let last = sleep < delay;
        let woke = tokio::select! {
            () = attempt.get().changed() => true,
            () = tokio::time::sleep(sleep) => false,
        };
        if woke {
            pacing.backoff.reset();
        } else if last && last_error.is_none() && pacing.settled() {
            // Nothing that could free the lock happened before the deadline (no event, and
            // the holder's lease runs past it): another poll would only say so again, one
            // or two round trips after the deadline. A lost event costs this wait nothing
            // more than its deadline.
            attempt.abandon().await;
            metrics.timed_out();
            return Some(Err(timed_out(self.name, self.started)));
        }
        None
    }
}

/// The error of a wait for `name` that ran out, begun at `started`.
pub(super) fn timed_out(name: &LockName, started: Instant) -> Error {
    Error::Timeout {
        name: name.to_string(),
        waited: started.elapsed(),
    }
}

/// How long a waiting acquisition sleeps before its next attempt (`delay`, cut at the
/// deadline); `None` once the deadline has passed.
pub(super) fn until_next_attempt(deadline: Option<Instant>, delay: Duration) -> Option<Duration> {
    match deadline {
        Some(deadline) => deadline
            .checked_duration_since(Instant::now())
            .filter(|left| !left.is_zero())
            .map(|left| delay.min(left)),
        None => Some(delay),
    }
}

/// How many grants in a row may come back too late ([`LockClient::acquire_fresh`]) before one
/// is handed out anyway, already lost (`is_lost()`), so that an acquisition whose every answer
/// takes longer than its ttl still ends.
pub(super) const MAX_LATE_GRANTS: u32 = 3;

/// Releases, in the background and once, a lease that was granted too late to be used. The
/// release may reach the server after the acquisition's next grant, which, were it the same
/// owner's, it would take away from under a guard that believes it holds: so the next
/// attempt asks under a new owner.
pub(super) fn release_late_grant(lease: Box<dyn crate::Lease>, timeout: Duration) {
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return;
    };
    handle.spawn(async move {
        let released = within(timeout, "releasing a late grant", lease.release()).await;
        if let Err(err) = released.and_then(|answer| answer) {
            debug!(%err, "a late grant was not released; its ttl frees it");
        }
    });
}

/// When a waiting attempt polls again, from what its last poll answered: the one place where
/// the core decides the timing of every backend's polls.
pub(super) struct Pacing {
    pub(super) backoff: BackoffState,
    pub(super) wake_up: WakeUp,
    pub(super) ttl: Duration,
    /// Immediate re-polls in a row ([`Step::Again`]).
    pub(super) again: u32,
    /// Polls in a row while next in line ([`Step::NextInLine`]).
    pub(super) next_in_line: u32,
    /// The last answer was busy or next in line ([`Self::settled`]).
    settled: bool,
}

impl Pacing {
    pub(super) fn new(options: &AcquireOptions, wake_up: WakeUp) -> Self {
        Self {
            backoff: BackoffState::new(&options.backoff),
            wake_up,
            ttl: options.ttl,
            again: 0,
            next_in_line: 0,
            settled: false,
        }
    }

    /// How long to wait (a wake-up may come sooner) after a step other than `Acquired`;
    /// `None`: poll again now.
    pub(super) fn after(&mut self, step: &Step) -> Option<Duration> {
        self.settled = matches!(step, Step::Busy { .. } | Step::NextInLine { .. });
        if !matches!(step, Step::Again) {
            self.again = 0;
        }
        if !matches!(step, Step::NextInLine { .. }) {
            self.next_in_line = 0;
        }
        Some(match step {
            Step::Busy { retry_after } => self.busy(*retry_after),
            Step::NextInLine { retry_after } if self.wake_up != WakeUp::Event => {
                let brisk = next_in_line_poll(self.next_in_line);
                self.next_in_line = self.next_in_line.saturating_add(1);
                retry_after.map_or(brisk, |r| r.min(brisk))
            }
            Step::NextInLine { retry_after } => self.busy(*retry_after),
            Step::Again if self.again < MAX_IMMEDIATE_POLLS => {
                self.again += 1;
                debug!(again = self.again, "polling again at once");
                return None;
            }
            Step::Contended => contention_pause(self.ttl),
            // A backend that keeps answering `Again` (or an unknown step) gets the backoff.
            _ => {
                self.again = 0;
                self.backoff.next()
            }
        })
    }

    /// Whether the last answer was one that only an event (or the `retry_after` it planned the
    /// sleep by) can change: busy, or next in line, on a backend whose server notifies waiters.
    pub(super) fn settled(&self) -> bool {
        self.wake_up == WakeUp::Event && self.settled
    }

    /// After a busy answer: just after the holder's lease runs out (plus a little jitter to
    /// spread the herd), or the backoff.
    pub(super) fn busy(&mut self, retry_after: Option<Duration>) -> Duration {
        let after_expiry =
            retry_after.map(|d| d + Duration::from_micros(rand::rng().random_range(500..2_000)));
        match self.wake_up {
            // Events wake us; the backoff maximum is only a safety net against a lost event.
            WakeUp::Event => after_expiry.map_or(self.backoff.max(), |d| d.min(self.backoff.max())),
            _ => {
                let next = self.backoff.next();
                after_expiry.map_or(next, |d| d.min(next))
            }
        }
    }
}

/// The pause before poll number `n` (0-based) of an attempt that is next in line: 1 ms
/// doubling to [`NEXT_IN_LINE_MAX_POLL`].
pub(super) fn next_in_line_poll(n: u32) -> Duration {
    (Duration::from_millis(1) * 2u32.saturating_pow(n.min(8))).min(NEXT_IN_LINE_MAX_POLL)
}

/// After a race with no clear winner ([`Step::Contended`]): a random pause of 1 ms up to a
/// tenth of the ttl (at least 2, at most 50 ms), so that the racers do not meet again.
pub(super) fn contention_pause(ttl: Duration) -> Duration {
    let cap = u64::try_from((ttl / 10).as_millis())
        .unwrap_or(50)
        .clamp(2, 50);
    Duration::from_millis(rand::rng().random_range(1..=cap))
}

/// How often a waiter reports that its attempts keep failing.
pub(super) const FAILURE_REPORT_EVERY: Duration = Duration::from_secs(10);

/// What a waiting `acquire` reports: once, that it waits for a taken lock (see
/// [`crate::WAITING_TARGET`]); and the errors it retries, as they happen but rate-limited: the
/// first one at once, then at most one every [`FAILURE_REPORT_EVERY`] with the count in
/// between (a waiter on a dead server is not silent, nor does it flood the log).
#[derive(Debug, Default)]
pub(super) struct WaitReport {
    pub(super) last: Option<Instant>,
    pub(super) unreported: u64,
    /// Whether the wait for a taken lock was reported.
    pub(super) waiting: bool,
}

impl WaitReport {
    /// Notes a poll's answer: the first that says the lock is taken is reported (and
    /// returns true).
    pub(super) fn taken(&mut self, name: &LockName, step: &Step) -> bool {
        let taken = matches!(
            step,
            Step::Busy { .. } | Step::NextInLine { .. } | Step::Contended
        );
        let first = taken && !std::mem::replace(&mut self.waiting, true);
        if first {
            debug!(target: crate::WAITING_TARGET, name = %name, "the lock is taken: waiting");
        }
        first
    }

    /// Notes a retried error; reports it (and returns true) unless one was reported recently.
    pub(super) fn retrying(&mut self, name: &LockName, err: &Error) -> bool {
        let now = Instant::now();
        if self
            .last
            .is_some_and(|last| now.saturating_duration_since(last) < FAILURE_REPORT_EVERY)
        {
            self.unreported += 1;
            debug!(%err, "acquire attempt failed, retrying");
            return false;
        }
        let earlier = std::mem::take(&mut self.unreported);
        self.last = Some(now);
        // Its own target, so that applications can filter these reports apart.
        tracing::warn!(
            target: "distlock_core::wait",
            "still waiting for lock {:?}: {err}; retrying{}",
            name.as_str(),
            if earlier > 0 {
                format!(" ({earlier} more failures since the last report)")
            } else {
                String::new()
            }
        );
        true
    }
}

/// Makes sure an attempt that ends without a guard is abandoned, also when the caller's
/// future is dropped mid-way (then from a spawned task).
pub(super) struct AttemptCleanup {
    pub(super) attempt: Option<Box<dyn Attempt>>,
    pub(super) timeout: Duration,
    pub(super) metrics: Arc<Handles>,
}

impl AttemptCleanup {
    pub(super) fn new(attempt: Box<dyn Attempt>, timeout: Duration, metrics: Arc<Handles>) -> Self {
        Self {
            attempt: Some(attempt),
            timeout,
            metrics,
        }
    }

    pub(super) fn get(&mut self) -> &mut dyn Attempt {
        self.attempt
            .as_deref_mut()
            .expect("attempt is present until disarmed or abandoned")
    }

    pub(super) fn disarm(&mut self) {
        self.attempt = None;
    }

    /// Abandons the attempt (once). Cancel safe: the clean-up, once started, runs to its end
    /// on a task of its own if the caller's future is dropped first (see
    /// [`to_the_end`](crate::finish::to_the_end)).
    pub(super) async fn abandon(&mut self) {
        if let Some(attempt) = self.attempt.take() {
            let (timeout, metrics) = (self.timeout, self.metrics.clone());
            to_the_end(async move { abandon_quietly(attempt, timeout, &metrics).await }).await;
        }
    }
}

pub(super) async fn abandon_quietly(
    attempt: Box<dyn Attempt>,
    timeout: Duration,
    metrics: &Handles,
) {
    let sent = Instant::now();
    let result = within(timeout, "abandoning an attempt", attempt.abandon())
        .await
        .and_then(|r| r);
    metrics.operation(Op::Abandon, sent);
    if let Err(err) = result {
        metrics.backend_error(&err);
        debug!(%err, "abandoning an attempt failed; its traces expire with the ttl");
    }
}

impl Drop for AttemptCleanup {
    fn drop(&mut self) {
        if let Some(attempt) = self.attempt.take()
            && let Ok(handle) = tokio::runtime::Handle::try_current()
        {
            let (timeout, metrics) = (self.timeout, self.metrics.clone());
            handle.spawn(async move { abandon_quietly(attempt, timeout, &metrics).await });
        }
    }
}

/// Jittered exponential backoff state.
pub(super) struct BackoffState {
    pub(super) min: Duration,
    pub(super) max: Duration,
    pub(super) factor: f64,
    pub(super) current: Duration,
}

impl BackoffState {
    pub(super) fn new(cfg: &Backoff) -> Self {
        Self {
            min: cfg.min,
            max: cfg.max,
            factor: cfg.factor,
            current: cfg.min,
        }
    }

    pub(super) fn next(&mut self) -> Duration {
        let low = u64::try_from(self.min.as_nanos()).unwrap_or(u64::MAX);
        let high = u64::try_from(self.current.as_nanos())
            .unwrap_or(u64::MAX)
            .max(low);
        let delay = Duration::from_nanos(rand::rng().random_range(low..=high));
        // Saturates: a huge factor (validated finite and >= 1) must not overflow.
        self.current = Duration::try_from_secs_f64(self.current.as_secs_f64() * self.factor)
            .unwrap_or(self.max)
            .min(self.max);
        delay
    }

    pub(super) fn max(&self) -> Duration {
        self.max
    }

    pub(super) fn reset(&mut self) {
        self.current = self.min;
    }
}
