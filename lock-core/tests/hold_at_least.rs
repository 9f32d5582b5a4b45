//! `LockGuard::hold_at_least` and `release_after` (ShedLock's `lockAtLeastFor`): the lock stays
//! held until the minimum has passed, renewed while needed and no longer.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::Wrapping;
use distlock_core::memory::{MemoryBackend, MemoryStore};
use distlock_core::{AcquireOptions, ClientConfig, DistributedLock, LockClient, Renewal};

fn client(store: &MemoryStore, operation_timeout: Duration) -> LockClient<MemoryBackend> {
    let config = ClientConfig::default().with_operation_timeout(operation_timeout);
    LockClient::with_config(MemoryBackend::new(store.clone()), config).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_after_keeps_the_lock_past_its_ttl_until_the_minimum() {
    let store = MemoryStore::new();
    // The last renewal leaves the lease at least one operation timeout past the minimum, for
    // the release: 300 ms of slack for a loaded machine's late timers (100 ms was too thin).
    let holder = client(&store, Duration::from_millis(300));
    let other = client(&store, Duration::from_millis(300));
    let opts = AcquireOptions::default()
        .with_ttl(Duration::from_millis(300))
        .with_renewal(Renewal::auto());
    let started = Instant::now();
    let guard = holder.acquire("job", &opts).await.unwrap();
    let minimum = Duration::from_millis(1500);
    let releasing = tokio::spawn(guard.release_after(minimum));
    // Five ttls after the acquisition: still held (renewed while the minimum was not covered).
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(
        other.try_acquire("job", &opts).await.unwrap().is_none(),
        "the lock was free before its minimum hold"
    );
    releasing.await.unwrap().unwrap();
    assert!(started.elapsed() >= minimum, "released before the minimum");
    let next = other.try_acquire("job", &opts).await.unwrap();
    assert!(next.is_some(), "not free after the minimum");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_stops_once_the_lease_covers_the_minimum() {
    let store = MemoryStore::new();
    let holder = client(&store, Duration::from_millis(200));
    let other = client(&store, Duration::from_millis(200));
    let ttl = Duration::from_secs(2);
    let opts = AcquireOptions::default()
        .with_ttl(ttl)
        .with_renewal(Renewal::auto());
    let started = Instant::now();
    let guard = holder.acquire("cron", &opts).await.unwrap();
    // The first lease (2 s) covers 1 s + the operation timeout: no renewal at ttl/3.
    guard.hold_at_least(Duration::from_secs(1)).await;
    assert!(started.elapsed() >= Duration::from_secs(1));
    assert!(!guard.is_lost());
    // A holder that dies now leaves the first lease, not one renewed at 0.67 s (to 2.67 s).
    guard.abandon();
    tokio::time::sleep_until((started + ttl + Duration::from_millis(250)).into()).await;
    assert!(
        other.try_acquire("cron", &opts).await.unwrap().is_some(),
        "the lease was renewed past the minimum"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minimum_already_passed_releases_at_once() {
    let store = MemoryStore::new();
    let holder = client(&store, Duration::from_millis(200));
    let opts = AcquireOptions::default().with_ttl(Duration::from_secs(5));
    let guard = holder.acquire("done", &opts).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let begun = Instant::now();
    guard
        .release_after(Duration::from_millis(10))
        .await
        .unwrap();
    assert!(begun.elapsed() < Duration::from_secs(1));
    assert!(store.is_empty());
}

/// The minimum counts from `acquire`'s return: a lease handed over by a release is known only
/// to have started after the waiter's last read before it (here 3 s before the grant came
/// back), and counting from there ended the hold at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_minimum_counts_from_the_acquires_return() {
    let store = MemoryStore::new();
    let backend = Wrapping::new(&store, Arc::new(|lease| lease)).back_dated(Duration::from_secs(3));
    let holder = LockClient::new(backend);
    let opts = AcquireOptions::default().with_ttl(Duration::from_secs(30));
    let begun = Instant::now();
    let guard = holder.acquire("job", &opts).await.unwrap();
    let minimum = Duration::from_millis(500);
    guard.hold_at_least(minimum).await;
    let held = begun.elapsed();
    assert!(
        held >= minimum,
        "held {held:?} since the acquire began, not the minimum {minimum:?}"
    );
    guard.release().await.unwrap();
}

/// Renewal stops once the holder's own deadline covers the minimum, not the server's lease:
/// with a lock-delay the lease lasts 2 s longer than that deadline, and stopping on the lease
/// let the deadline pass 0.3 s in, ending the hold there as a loss and releasing the lock
/// 0.7 s before the minimum.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_delay_does_not_end_the_minimum_early() {
    let store = MemoryStore::new();
    let holder = client(&store, Duration::from_millis(200));
    let other = client(&store, Duration::from_millis(200));
    let opts = AcquireOptions::default()
        .with_ttl(Duration::from_millis(300))
        .with_lock_delay(Duration::from_secs(2))
        .with_renewal(Renewal::auto());
    let started = Instant::now();
    let guard = holder.acquire("nightly", &opts).await.unwrap();
    let minimum = Duration::from_secs(1);
    let releasing = tokio::spawn(guard.release_after(minimum));
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(
        other.try_acquire("nightly", &opts).await.unwrap().is_none(),
        "the lock was free 0.7 s into a 1 s minimum"
    );
    releasing.await.unwrap().unwrap();
    assert!(started.elapsed() >= minimum, "released before the minimum");
}

/// An operation timeout too long to add to an instant is a valid configuration: the minimum
/// is then never covered, and renewal goes on to the end (adding it panicked).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_longest_operation_timeout_does_not_panic() {
    let store = MemoryStore::new();
    let holder = client(&store, Duration::MAX);
    let opts = AcquireOptions::default().with_ttl(Duration::from_millis(300));
    let guard = holder.acquire("long", &opts).await.unwrap();
    let started = Instant::now();
    let minimum = Duration::from_millis(500);
    guard.hold_at_least(minimum).await;
    assert!(started.elapsed() >= minimum);
    assert!(!guard.is_lost(), "renewal stopped before the minimum");
    guard.release().await.unwrap();
}
