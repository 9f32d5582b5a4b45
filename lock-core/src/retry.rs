//! The one retry policy of distlock: how often and how soon a backend repeats a request that
//! failed for a transient reason, in the caller's path or in a background cleanup.
//!
//! Backends decide *whether* a failed request may be repeated (only they know, say, that a
//! delete whose answer was lost must not be sent again); how many times and after which pause
//! is decided here, once, and traced the same way for every backend.

use std::fmt::Display;
use std::future::Future;
use std::time::{Duration, Instant};

use rand::Rng;
use tracing::{Instrument, debug};

use crate::{Error, Result};

/// How many times a failed request is repeated, and the pauses in between: exponential from
/// `first`, capped at `max`, each one jittered down by up to a quarter so that many clients
/// that failed together do not retry together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Repetitions after the first failure (0: never repeat).
    pub retries: u32,
    /// The pause before the first repetition.
    pub first: Duration,
    /// The longest pause.
    pub max: Duration,
}

impl RetryPolicy {
    /// In a caller's path (an acquire step, a renewal, a release, an inspection): four
    /// repetitions after about 10, 20, 40 and 80 ms, so that a brief transport failure (a
    /// reconnect, a leader change) costs the caller about 150 ms, well inside the operation
    /// timeout, before the error reaches the core's own wait loop or renewal schedule.
    pub const TRANSIENT: Self = Self {
        retries: 4,
        first: Duration::from_millis(10),
        max: Duration::from_millis(80),
    };

    /// A cleanup nobody waits for (a queue entry whose answer was lost, a key whose lease
    /// outlives its lock): ten repetitions, 100 ms doubling to 2 s, about 13 s in all; after
    /// that the server's ttl frees what is left.
    pub const BACKGROUND: Self = Self {
        retries: 10,
        first: Duration::from_millis(100),
        max: Duration::from_secs(2),
    };

    /// The pause before repetition number `n` (0-based).
    pub fn pause(&self, n: u32) -> Duration {
        let full = self
            .first
            .saturating_mul(2u32.saturating_pow(n.min(31)))
            .min(self.max);
        let nanos = u64::try_from(full.as_nanos()).unwrap_or(u64::MAX);
        Duration::from_nanos(nanos - rand::rng().random_range(0..=nanos / 4))
    }
}

/// Bounds `fut` by `timeout`: its output, or [`Error::Unavailable`] saying that `what` got
/// no answer within `timeout`. The one way the core and the backends bound a request
/// (connecting, an operation), so that every such error reads the same.
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use std::time::Duration;
/// use distlock_core::backend::within;
///
/// let slow = within(Duration::from_millis(10), "connecting to db1", std::future::pending::<()>());
/// let err = slow.await.unwrap_err();
/// assert_eq!(err.to_string(), "backend unavailable: connecting to db1 got no answer within 10ms");
/// assert_eq!(within(Duration::from_secs(1), "x", async { 7 }).await.unwrap(), 7);
/// # });
/// ```
///
/// # Errors
/// [`Error::Unavailable`] when `timeout` passes first (the future is dropped).
pub async fn within<F: Future>(timeout: Duration, what: impl Display, fut: F) -> Result<F::Output> {
    tokio::time::timeout(timeout, fut)
        .await
        .map_err(|_| Error::Unavailable {
            message: format!("{what} got no answer within {timeout:?}"),
            source: None,
        })
}

/// The repetitions of one operation under a [`RetryPolicy`], for a retry loop written out
/// where [`retrying`]'s closure cannot borrow what the operation needs (a `&mut self`).
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use distlock_core::backend::{Retries, RetryPolicy};
///
/// let mut failures_left = 2;
/// let mut retries = Retries::new(RetryPolicy::TRANSIENT);
/// let answer = loop {
///     let result = if failures_left > 0 { failures_left -= 1; Err("reset") } else { Ok(7) };
///     match result {
///         Err(err) if retries.pause("reading", &err).await => {}
///         other => break other,
///     }
/// };
/// assert_eq!(answer, Ok(7));
/// # });
/// ```
#[derive(Debug)]
pub struct Retries {
    policy: RetryPolicy,
    done: u32,
}

impl Retries {
    /// No repetition yet.
    pub fn new(policy: RetryPolicy) -> Self {
        Self { policy, done: 0 }
    }

    /// After a failure worth repeating: false when the policy's repetitions are used up;
    /// otherwise traces `err`, sleeps the policy's pause and returns true.
    pub async fn pause(&mut self, what: &str, err: &(dyn Display + Sync)) -> bool {
        if self.done >= self.policy.retries {
            return false;
        }
        let pause = self.policy.pause(self.done);
        self.done += 1;
        debug!(%err, ?pause, attempt = self.done, "{what} failed, retrying");
        tokio::time::sleep(pause).await;
        true
    }
}

/// Runs `op` until it succeeds, fails with an error for which `repeatable` says no, or the
/// policy's repetitions run out; returns the last result. Each repetition is traced at debug
/// level with `what`.
///
/// Cancel safe when `op`'s futures are: dropping the returned future drops the request in
/// flight.
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use distlock_core::backend::{RetryPolicy, retrying};
///
/// let mut calls = 0;
/// let answer: Result<u32, &str> = retrying(
///     "reading the counter",
///     RetryPolicy::TRANSIENT,
///     |err: &&str| *err == "connection reset",
///     || {
///         calls += 1;
///         let result = if calls < 3 { Err("connection reset") } else { Ok(7) };
///         async move { result }
///     },
/// )
/// .await;
/// assert_eq!(answer, Ok(7));
/// assert_eq!(calls, 3);
/// # });
/// ```
pub async fn retrying<T, E, F, Fut>(
    what: &str,
    policy: RetryPolicy,
    repeatable: impl Fn(&E) -> bool,
    mut op: F,
) -> std::result::Result<T, E>
where
    E: Display + Sync,
    F: FnMut() -> Fut,
    Fut: Future<Output = std::result::Result<T, E>>,
{
    let mut retries = Retries::new(policy);
    loop {
        match op().await {
            Err(err) if repeatable(&err) && retries.pause(what, &err).await => {}
            other => return other,
        }
    }
}

/// Runs `fut` in a task of its own and waits for its result: dropping the returned future
/// does not cancel `fut`. For a cleanup the caller waits for but that must not stop half-way
/// (a queue entry left behind by a cancelled `abandon` would outlive the attempt).
///
/// # Errors
/// `fut`'s error, or [`Error::Backend`] if its task panicked.
pub async fn detached<T, F>(fut: F) -> Result<T>
where
    T: Send + 'static,
    F: Future<Output = Result<T>> + Send + 'static,
{
    tokio::spawn(fut)
        .await
        .unwrap_or_else(|err| Err(Error::backend(format!("a cleanup task failed: {err}"), err)))
}

/// Runs a cleanup nobody waits for in a task of its own, from `start_at` on (at once when
/// `None`): `op` is repeated on any error under [`RetryPolicy::BACKGROUND`], and a cleanup that
/// still fails is only logged (the server's ttl frees what it leaves). Outside a tokio
/// runtime nothing runs. For a backend's `abandon` of an entry whose answer never came, or for
/// a lock whose lease outlives it.
pub fn spawn_cleanup<F, Fut>(what: &'static str, start_at: Option<Instant>, mut op: F)
where
    F: FnMut() -> Fut + Send + 'static,
    Fut: Future<Output = Result<()>> + Send + 'static,
{
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        debug!("{what}: no runtime; the ttl frees it");
        return;
    };
    let span = tracing::debug_span!("distlock.cleanup", what);
    handle.spawn(
        async move {
            if let Some(at) = start_at {
                tokio::time::sleep_until(at.into()).await;
            }
            match retrying(what, RetryPolicy::BACKGROUND, |_| true, &mut op).await {
                Ok(()) => debug!("{what}: done"),
                Err(err) => debug!(%err, "{what} failed; the ttl frees it"),
            }
        }
        .instrument(span),
    );
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    #[test]
    fn pauses_grow_to_the_cap_with_jitter_below() {
        let policy = RetryPolicy::TRANSIENT;
        for n in 0..40 {
            let full = (policy.first * 2u32.pow(n.min(20))).min(policy.max);
            let pause = policy.pause(n);
            assert!(pause <= full && pause >= full * 3 / 4, "{n}: {pause:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn gives_up_after_the_policy_and_never_repeats_a_refused_error() {
        let calls = AtomicU32::new(0);
        let result: std::result::Result<(), &str> = retrying(
            "x",
            RetryPolicy::TRANSIENT,
            |_| true,
            || {
                calls.fetch_add(1, Ordering::Relaxed);
                async { Err("down") }
            },
        )
        .await;
        assert_eq!(result, Err("down"));
        assert_eq!(calls.load(Ordering::Relaxed), 5);

        calls.store(0, Ordering::Relaxed);
        let result: std::result::Result<(), &str> = retrying(
            "x",
            RetryPolicy::TRANSIENT,
            |_| false,
            || {
                calls.fetch_add(1, Ordering::Relaxed);
                async { Err("refused") }
            },
        )
        .await;
        assert_eq!(result, Err("refused"));
        assert_eq!(calls.load(Ordering::Relaxed), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_cleanup_waits_for_its_start_and_retries_until_done() {
        let calls = Arc::new(AtomicU32::new(0));
        let start = Instant::now() + Duration::from_secs(3);
        let counter = calls.clone();
        spawn_cleanup("test cleanup", Some(start), move || {
            let n = counter.fetch_add(1, Ordering::Relaxed);
            async move {
                if n < 2 {
                    Err(Error::Unavailable {
                        message: "down".into(),
                        source: None,
                    })
                } else {
                    Ok(())
                }
            }
        });
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(calls.load(Ordering::Relaxed), 0, "not before its start");
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(calls.load(Ordering::Relaxed), 3);
    }
}
