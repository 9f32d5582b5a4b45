//! A waiting acquisition ends at its deadline, not one slow round trip after it, when nothing
//! that could free the lock happened: on a backend whose server notifies waiters, no event
//! came and the holder's lease runs past the deadline. Found by the conformance suite on
//! ZooKeeper over TLS in a loaded CI: the poll at the deadline and the abandon after it took
//! 1.09 s together, after a 700 ms wait. A polling backend, or a known lease end before the
//! deadline, still gets its last poll.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use distlock_core::memory::{MemoryBackend, MemoryStore};
use distlock_core::{
    AcquireOptions, AcquireRequest, Attempt, Backoff, Capabilities, DistributedLock, Error,
    LockBackend, LockClient, Result, Step, WakeUp,
};

/// How long every answer of the slow server takes.
const ROUND_TRIP: Duration = Duration::from_millis(400);
const WAIT: Duration = Duration::from_millis(700);

/// Always busy, each answer a slow round trip; never wakes anyone.
#[derive(Debug)]
struct Busy {
    caps: Capabilities,
    retry_after: Option<Duration>,
    polls: Arc<AtomicUsize>,
    abandons: Arc<AtomicUsize>,
}

struct BusyAttempt {
    retry_after: Option<Duration>,
    polls: Arc<AtomicUsize>,
    abandons: Arc<AtomicUsize>,
}

#[async_trait]
impl LockBackend for Busy {
    fn name(&self) -> &'static str {
        "busy"
    }

    fn capabilities(&self) -> Capabilities {
        self.caps.clone()
    }

    fn begin(&self, _request: AcquireRequest) -> Box<dyn Attempt> {
        Box::new(BusyAttempt {
            retry_after: self.retry_after,
            polls: self.polls.clone(),
            abandons: self.abandons.clone(),
        })
    }
}

#[async_trait]
impl Attempt for BusyAttempt {
    async fn poll(&mut self) -> Result<Step> {
        self.polls.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(ROUND_TRIP).await;
        Ok(Step::busy(self.retry_after))
    }

    async fn abandon(self: Box<Self>) -> Result<()> {
        self.abandons.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// Waits `WAIT` on a lock the slow server always calls busy: how long the wait took and how
/// many polls it made.
async fn timed_out(wake_up: WakeUp, retry_after: Option<Duration>) -> (Duration, usize) {
    let (polls, abandons) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let backend = Busy {
        caps: MemoryBackend::new(MemoryStore::new())
            .capabilities()
            .with_wake_up(wake_up),
        retry_after,
        polls: polls.clone(),
        abandons: abandons.clone(),
    };
    let client = LockClient::new(backend);
    // A backoff longer than the wait: one sleep from the first answer to the deadline.
    let options = AcquireOptions::default()
        .with_ttl(Duration::from_secs(10))
        .with_backoff(Backoff::new(Duration::from_secs(5), Duration::from_secs(5)))
        .with_wait(WAIT);
    let started = Instant::now();
    let result = client.acquire("busy", &options).await;
    let took = started.elapsed();
    assert!(
        matches!(result, Err(Error::Timeout { .. })),
        "expected Timeout, got {result:?}"
    );
    assert!(took >= WAIT, "timed out after {took:?}, before {WAIT:?}");
    assert_eq!(abandons.load(Ordering::SeqCst), 1, "the attempt abandoned");
    (took, polls.load(Ordering::SeqCst))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_events_a_wait_ends_at_its_deadline() {
    let (took, polls) = timed_out(WakeUp::Event, None).await;
    assert_eq!(polls, 1, "polled again after the deadline");
    assert!(
        // 300 ms of slack for late timers; a poll after the deadline takes a round trip.
        took < WAIT + ROUND_TRIP * 3 / 4,
        "timed out after {took:?}: a round trip after the {WAIT:?} deadline"
    );
    // The holder's lease ends after the deadline: nothing to poll for either.
    let (_, polls) = timed_out(WakeUp::Event, Some(Duration::from_secs(3))).await;
    assert_eq!(
        polls, 1,
        "polled again for a lease that ends after the deadline"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_events_or_with_a_lease_ending_first_the_deadline_gets_its_last_poll() {
    let (took, polls) = timed_out(WakeUp::Polling, None).await;
    assert_eq!(polls, 2, "a polling waiter's last chance at the deadline");
    assert!(took >= WAIT + ROUND_TRIP, "{took:?}");
    // The holder's lease ends before the deadline: polled then, whatever the wake-up.
    let (_, polls) = timed_out(WakeUp::Event, Some(Duration::from_millis(100))).await;
    assert!(
        polls >= 2,
        "no poll when the holder's lease ran out: {polls}"
    );
}
