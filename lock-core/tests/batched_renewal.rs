//! Batched renewal: a client's watchdog renews the due leases of one [`Renewer`] in one
//! `renew_many` call per `max_batch` leases, aligns their schedules, and reports each lease's
//! own outcome to its own guard.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use distlock_core::backend::{RenewItem, Renewer, downcast_lease};
use distlock_core::memory::MemoryStore;
use distlock_core::{
    AcquireOptions, DistributedLock, Error, Lease, LockClient, LossReason, Result,
};

mod common;
use common::Wrapping;

/// Counts `renew_many` calls and their sizes, and renews each lease through its own `renew`.
#[derive(Debug)]
struct Counting {
    max_batch: usize,
    calls: AtomicUsize,
    sizes: Mutex<Vec<usize>>,
    /// Answer every call with a whole-request failure while set.
    failing: std::sync::atomic::AtomicBool,
}

impl Counting {
    fn new(max_batch: usize) -> Arc<Self> {
        Arc::new(Self {
            max_batch,
            calls: AtomicUsize::new(0),
            sizes: Mutex::new(Vec::new()),
            failing: std::sync::atomic::AtomicBool::new(false),
        })
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

#[derive(Debug)]
struct BatchedLease {
    inner: Box<dyn Lease>,
    renewer: Arc<Counting>,
}

#[async_trait]
impl Lease for BatchedLease {
    async fn renew(&self, ttl: Duration) -> Result<()> {
        self.inner.renew(ttl).await
    }

    async fn release(&self) -> Result<()> {
        self.inner.release().await
    }

    fn renewer(&self) -> Option<Arc<dyn Renewer>> {
        Some(self.renewer.clone())
    }
}

#[async_trait]
impl Renewer for Counting {
    fn max_batch(&self) -> usize {
        self.max_batch
    }

    async fn renew_many(&self, items: &[RenewItem<'_>]) -> Result<Vec<Result<()>>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.sizes.lock().unwrap().push(items.len());
        assert!(items.len() <= self.max_batch, "a batch above max_batch");
        if self.failing.load(Ordering::SeqCst) {
            return Err(Error::Unavailable {
                message: "the test renewer is failing".into(),
                source: None,
            });
        }
        let mut results = Vec::with_capacity(items.len());
        for item in items {
            let lease = downcast_lease::<BatchedLease>(item.lease).expect("our own lease");
            results.push(lease.inner.renew(item.ttl).await);
        }
        Ok(results)
    }
}

fn client(store: &MemoryStore, renewer: &Arc<Counting>) -> LockClient<Wrapping> {
    let renewer = renewer.clone();
    LockClient::new(Wrapping::new(
        store,
        Arc::new(move |inner| {
            Box::new(BatchedLease {
                inner,
                renewer: renewer.clone(),
            })
        }),
    ))
}

/// 300 locks taken over ~150 ms (ttl 600 ms, renewed every 200 ms, batches of 64): after the
/// first round aligns them, each tick sends ceil(300 / 64) = 5 requests, not 300; no lease
/// is renewed on its own, and none is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn due_leases_of_one_renewer_go_in_few_requests() {
    const LOCKS: usize = 300;
    let store = MemoryStore::new();
    let renewer = Counting::new(64);
    let client = client(&store, &renewer);
    let opts = AcquireOptions::default().with_ttl(Duration::from_millis(600));
    let mut guards = Vec::new();
    for i in 0..LOCKS {
        guards.push(
            client
                .try_acquire(&format!("batch-{i}"), &opts)
                .await
                .unwrap()
                .unwrap(),
        );
        if i % 20 == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    // One or two rounds to align the schedules, then count over 2 s = 10 ticks.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let before = renewer.calls();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let calls = renewer.calls() - before;
    let sizes = renewer.sizes.lock().unwrap().clone();
    assert!(
        calls <= 11 * LOCKS.div_ceil(64),
        "{calls} renew_many calls in 10 ticks for {LOCKS} locks: {sizes:?}"
    );
    assert!(calls >= 5 * LOCKS.div_ceil(64), "too few renewals: {calls}");
    for guard in &guards {
        assert!(!guard.is_lost(), "{} lost", guard.name());
    }
    // The leases were renewed: each is valid about a ttl from the last tick.
    let soonest = guards.iter().map(|g| g.valid_until()).min().unwrap();
    assert!(soonest > Instant::now() + Duration::from_millis(150));
    for guard in guards {
        guard.release().await.unwrap();
    }
}

/// A lock removed behind its holder is reported lost by the batch that finds it gone
/// (`RenewalRejected`), and its batch-mates go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_refused_lease_is_lost_alone() {
    let store = MemoryStore::new();
    let renewer = Counting::new(256);
    let client = client(&store, &renewer);
    let opts = AcquireOptions::default().with_ttl(Duration::from_millis(600));
    let mut guards = Vec::new();
    for i in 0..10 {
        guards.push(
            client
                .try_acquire(&format!("refused-{i}"), &opts)
                .await
                .unwrap()
                .unwrap(),
        );
    }
    assert!(store.remove("refused-3"));
    let reason = tokio::time::timeout(Duration::from_secs(2), guards[3].lost())
        .await
        .expect("the removed lock is reported lost");
    assert_eq!(reason, LossReason::RenewalRejected);
    tokio::time::sleep(Duration::from_millis(700)).await;
    for (i, guard) in guards.iter().enumerate() {
        assert_eq!(guard.is_lost(), i == 3, "guard {i}");
    }
    assert!(renewer.calls() >= 2);
}

/// A batch request that fails as a whole is retried like a failed renewal of its own: the
/// guards survive a failure shorter than their lease, and are lost (`ConnectionLost`) at their
/// local deadline when it lasts longer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_batch_is_retried_then_reported() {
    let store = MemoryStore::new();
    let renewer = Counting::new(256);
    let client = client(&store, &renewer);
    let opts = AcquireOptions::default().with_ttl(Duration::from_millis(900));
    let mut guards = Vec::new();
    for i in 0..20 {
        guards.push(
            client
                .try_acquire(&format!("failing-{i}"), &opts)
                .await
                .unwrap()
                .unwrap(),
        );
    }
    // A short outage: 250 ms < the time left on each lease at the first renewal.
    tokio::time::sleep(Duration::from_millis(250)).await;
    renewer.failing.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(250)).await;
    renewer.failing.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(
        guards.iter().all(|g| !g.is_lost()),
        "a short outage lost a lock"
    );
    // A long one.
    renewer.failing.store(true, Ordering::SeqCst);
    let started = Instant::now();
    for guard in &guards {
        let reason = tokio::time::timeout(Duration::from_secs(3), guard.lost())
            .await
            .expect("reported within the ttl");
        assert_eq!(reason, LossReason::ConnectionLost);
    }
    assert!(
        started.elapsed() <= Duration::from_millis(1500),
        "{:?}",
        started.elapsed()
    );
}

/// `LockGuard::renew` (explicit) goes to the lease itself, not the batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_explicit_renewal_uses_the_lease() {
    let store = MemoryStore::new();
    let renewer = Counting::new(256);
    let client = client(&store, &renewer);
    let opts = AcquireOptions::default().with_ttl(Duration::from_secs(30));
    let guard = client
        .try_acquire("explicit", &opts)
        .await
        .unwrap()
        .unwrap();
    guard.renew().await.unwrap();
    assert_eq!(renewer.calls(), 0);
    guard.release().await.unwrap();
}
