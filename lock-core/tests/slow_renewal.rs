//! A renewal whose answer is slow does not eat into the next round's margin: the next renewal
//! is scheduled from when the last one was sent, so the lease keeps `ttl - interval` in hand
//! whatever the latency.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use distlock_core::memory::MemoryStore;
use distlock_core::{AcquireOptions, DistributedLock, Lease, LockClient, Result};

mod common;
use common::Wrapping;

/// Answers every renewal `delay` late (a loaded server or a long network path).
#[derive(Debug)]
struct Slow {
    inner: Box<dyn Lease>,
    delay: Duration,
    renewals: Arc<AtomicUsize>,
}

#[async_trait]
impl Lease for Slow {
    async fn renew(&self, ttl: Duration) -> Result<()> {
        tokio::time::sleep(self.delay).await;
        self.renewals.fetch_add(1, Ordering::SeqCst);
        self.inner.renew(ttl).await
    }

    async fn release(&self) -> Result<()> {
        self.inner.release().await
    }
}

/// ttl 1.2 s, renewed every 400 ms, each answer 440 ms late. Scheduled from the send (with
/// rounds at least a quarter interval apart), a round is sent 540 ms after the last and
/// answered 980 ms after it, 220 ms inside the 1.2 s lease the last one granted: slack for a
/// loaded machine (a 250 ms margin failed under CI load once). Scheduled from the answer, the
/// next round would be sent 840 ms after the last and answered 1,280 ms after it, past the
/// lease: the lock would be reported lost after about 2 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_renewals_keep_the_lock() {
    let store = MemoryStore::new();
    let renewals = Arc::new(AtomicUsize::new(0));
    let counted = renewals.clone();
    let client = LockClient::new(Wrapping::new(
        &store,
        Arc::new(move |inner| {
            Box::new(Slow {
                inner,
                delay: Duration::from_millis(440),
                renewals: counted.clone(),
            })
        }),
    ));
    let ttl = Duration::from_millis(1200);
    let guard = client
        .try_acquire("slow", &AcquireOptions::default().with_ttl(ttl))
        .await
        .unwrap()
        .unwrap();
    tokio::time::sleep(ttl * 4).await;
    assert_eq!(guard.loss_reason(), None, "the lock was lost while renewed");
    // Every round is sent at least a quarter interval after the last answer: one per 540 ms
    // here (8 answers in 4.8 s, the 9th due at 5.16 s), not back to back (one per 440 ms: the
    // 9th by 4.36 s). A loaded machine only makes rounds later, so fewer.
    let rounds = renewals.load(Ordering::SeqCst);
    assert!(
        (4..=8).contains(&rounds),
        "{rounds} renewals in {:?}",
        ttl * 4
    );
    guard.release().await.unwrap();
}
