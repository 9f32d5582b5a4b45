//! The watchdog with the in-memory backend: batching, early renewal, idle linger.

use super::*;
use crate::memory::{MemoryBackend, MemoryStore};
use crate::{AcquireOptions, DistributedLock, LockClient, Renewal};

impl Watchdog {
    fn entries(&self) -> usize {
        lock(&self.shared.state).timers.len()
    }

    fn running(&self) -> bool {
        lock(&self.shared.state).running
    }

    /// Waits until the task has ended; fails with `what` if it still runs at `deadline`.
    async fn ended_by(&self, deadline: Instant, what: &str) {
        while self.running() {
            assert!(Instant::now() < deadline, "{what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_map_entry_per_guard_and_none_after_release() {
    let client = LockClient::new(MemoryBackend::new(MemoryStore::new()));
    let watchdog = client.watchdog().clone();
    let options = AcquireOptions::default()
        .with_ttl(Duration::from_millis(300))
        .with_renewal(Renewal::auto().every(Duration::from_millis(50)));
    let mut guards = Vec::new();
    for i in 0..100 {
        let name = format!("wd-{i}");
        guards.push(client.try_acquire(&name, &options).await.unwrap().unwrap());
    }
    assert_eq!(watchdog.entries(), 100);
    assert!(watchdog.running());
    // Renewal keeps every lock well past its ttl.
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(guards.iter().all(|g| !g.is_lost()));
    for guard in guards {
        guard.release().await.unwrap();
    }
    // Released guards leave the map at once, also those whose renewal was in flight.
    assert_eq!(watchdog.entries(), 0);
    let deadline = Instant::now() + Duration::from_secs(5);
    watchdog
        .ended_by(deadline, "the watchdog task did not end")
        .await;
    // A new guard starts a new task.
    let guard = client
        .try_acquire("wd-again", &options)
        .await
        .unwrap()
        .unwrap();
    assert!(watchdog.running());
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn back_to_back_guards_share_one_task_that_ends_once_idle() {
    let client = LockClient::new(MemoryBackend::new(MemoryStore::new()));
    let watchdog = client.watchdog().clone();
    let options = AcquireOptions::default().with_ttl(Duration::from_secs(30));
    for _ in 0..50 {
        let guard = client
            .try_acquire("wd-cycle", &options)
            .await
            .unwrap()
            .unwrap();
        guard.release().await.unwrap();
        // Released, and the task stays for the next guard.
        assert_eq!(watchdog.entries(), 0);
        assert!(watchdog.running(), "the task ended between two guards");
    }
    let ended = Instant::now();
    let deadline = ended + IDLE_LINGER + Duration::from_secs(5);
    watchdog
        .ended_by(deadline, "the idle task did not end")
        .await;
    assert!(
        ended.elapsed() >= IDLE_LINGER,
        "the task ended before its linger"
    );
}

/// The task sleeps towards a guard's renewal (10 s away); the guard's release, the last
/// one, wakes it to start its idle linger then, rather than at that renewal time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_release_starts_the_idle_linger() {
    let client = LockClient::new(MemoryBackend::new(MemoryStore::new()));
    let watchdog = client.watchdog().clone();
    let options = AcquireOptions::default().with_ttl(Duration::from_secs(30));
    let guard = client
        .try_acquire("wd-last", &options)
        .await
        .unwrap()
        .unwrap();
    // Until the task has taken the guard's renewal time as its wake-up.
    let deadline = Instant::now() + Duration::from_secs(5);
    while lock(&watchdog.shared.state)
        .wake_at
        .is_none_or(|at| at < Instant::now() + Duration::from_secs(5))
    {
        assert!(
            Instant::now() < deadline,
            "the task never slept towards the renewal"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Time for the task to take that turn (a spawned task runs at once on a free worker).
    tokio::time::sleep(Duration::from_millis(100)).await;
    guard.release().await.unwrap();
    let deadline = Instant::now() + IDLE_LINGER + Duration::from_secs(3);
    watchdog
        .ended_by(
            deadline,
            "the idle task did not end (it slept towards the released guard's renewal)",
        )
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_guard_reports_expiry_then_leaves_the_map() {
    let client = LockClient::new(MemoryBackend::new(MemoryStore::new()));
    let watchdog = client.watchdog().clone();
    let options = AcquireOptions::default().with_ttl(Duration::from_millis(200));
    let guard = client
        .try_acquire("wd-abandon", &options)
        .await
        .unwrap()
        .unwrap();
    let lost = guard.lost();
    guard.abandon();
    let reason = tokio::time::timeout(Duration::from_secs(5), lost)
        .await
        .expect("lost() fires at the deadline");
    assert_eq!(reason, LossReason::LeaseExpired);
    assert_eq!(watchdog.entries(), 0);
}
