//! The in-memory backend with every acquired lease wrapped by the test, for tests of what the
//! core does with a lease's optional hooks (renewer, loss signal).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use distlock_core::memory::{MemoryBackend, MemoryStore};
use distlock_core::{AcquireRequest, Attempt, Capabilities, Lease, LockBackend, Result, Step};
use tokio::sync::Notify;

/// Turns the memory backend's lease into the test's.
pub(crate) type Wrap = Arc<dyn Fn(Box<dyn Lease>) -> Box<dyn Lease> + Send + Sync>;

/// The in-memory backend over `store`, its leases passed through `wrap`.
pub(crate) struct Wrapping {
    inner: MemoryBackend,
    wrap: Wrap,
    back_date: Option<Duration>,
    slow_abandon: Option<SlowAbandon>,
}

/// An attempt's clean-up that says it started in `.1`, takes `.0`, then counts itself done
/// in `.2`.
pub(crate) type SlowAbandon = (Duration, Arc<Notify>, Arc<AtomicUsize>);

impl Wrapping {
    pub(crate) fn new(store: &MemoryStore, wrap: Wrap) -> Self {
        Self {
            inner: MemoryBackend::new(store.clone()),
            wrap,
            back_date: None,
            slow_abandon: None,
        }
    }

    /// Its attempts' clean-ups notify `started`, take `delay`, then count themselves in
    /// `done`.
    #[allow(dead_code, reason = "used by some of the tests that share this module")]
    pub(crate) fn slow_abandon(
        mut self,
        delay: Duration,
        started: Arc<Notify>,
        done: Arc<AtomicUsize>,
    ) -> Self {
        self.slow_abandon = Some((delay, started, done));
        self
    }

    /// Its grants say their lease started `ago` before they came back, as a lease handed over
    /// by a release says (after the waiter's last read before it).
    #[allow(dead_code, reason = "used by some of the tests that share this module")]
    pub(crate) fn back_dated(mut self, ago: Duration) -> Self {
        self.back_date = Some(ago);
        self
    }
}

impl std::fmt::Debug for Wrapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wrapping").finish_non_exhaustive()
    }
}

struct WrappingAttempt {
    inner: Box<dyn Attempt>,
    wrap: Wrap,
    back_date: Option<Duration>,
    slow_abandon: Option<SlowAbandon>,
}

#[async_trait]
impl LockBackend for Wrapping {
    fn name(&self) -> &'static str {
        "wrapping"
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn begin(&self, request: AcquireRequest) -> Box<dyn Attempt> {
        Box::new(WrappingAttempt {
            inner: self.inner.begin(request),
            wrap: self.wrap.clone(),
            back_date: self.back_date,
            slow_abandon: self.slow_abandon.clone(),
        })
    }
}

#[async_trait]
impl Attempt for WrappingAttempt {
    async fn poll(&mut self) -> Result<Step> {
        Ok(match self.inner.poll().await? {
            Step::Acquired(mut acquired) => {
                let inner = std::mem::replace(&mut acquired.lease, Box::new(Placeholder));
                acquired.lease = (self.wrap)(inner);
                match self.back_date {
                    Some(ago) => {
                        let started = Instant::now().checked_sub(ago).expect("a clock that old");
                        Step::Acquired(acquired.with_lease_started(started))
                    }
                    None => Step::Acquired(acquired),
                }
            }
            other => other,
        })
    }

    async fn changed(&mut self) {
        self.inner.changed().await;
    }

    async fn abandon(self: Box<Self>) -> Result<()> {
        let Some((delay, started, done)) = self.slow_abandon else {
            return self.inner.abandon().await;
        };
        started.notify_one();
        tokio::time::sleep(delay).await;
        let abandoned = self.inner.abandon().await;
        done.fetch_add(1, Ordering::SeqCst);
        abandoned
    }
}

/// Stands in for a lease while it is moved into the test's wrapper.
#[derive(Debug)]
struct Placeholder;

#[async_trait]
impl Lease for Placeholder {
    async fn renew(&self, _ttl: Duration) -> Result<()> {
        unreachable!("replaced at once")
    }

    async fn release(&self) -> Result<()> {
        unreachable!("replaced at once")
    }
}
