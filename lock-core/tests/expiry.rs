//! `Lease::expired`: the core calls it once a lock ran out without a release, after the server's
//! lease certainly ended, and never after a clean release.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use distlock_core::memory::{MemoryBackend, MemoryStore};
use distlock_core::{
    AcquireOptions, DistributedLock, Lease, LockClient, LossReason, Renewal, Result,
};

mod common;
use common::Wrapping;

/// A lease that records when `expired` was called.
#[derive(Debug)]
struct SpyLease {
    inner: Box<dyn Lease>,
    expired: Arc<Mutex<Vec<Instant>>>,
}

#[async_trait]
impl Lease for SpyLease {
    async fn renew(&self, ttl: Duration) -> Result<()> {
        self.inner.renew(ttl).await
    }

    async fn release(&self) -> Result<()> {
        self.inner.release().await
    }

    async fn expired(&self) -> Result<()> {
        self.expired.lock().unwrap().push(Instant::now());
        Ok(())
    }
}

/// The in-memory backend, with every lease recording when `expired` was called.
fn spy() -> (LockClient<Wrapping>, Arc<Mutex<Vec<Instant>>>) {
    let expired = Arc::new(Mutex::new(Vec::new()));
    let recorded = expired.clone();
    let backend = Wrapping::new(
        &MemoryStore::new(),
        Arc::new(move |inner| {
            Box::new(SpyLease {
                inner,
                expired: recorded.clone(),
            })
        }),
    );
    (LockClient::new(backend), expired)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_left_to_expire_is_cleaned_up_after_its_server_lease() {
    let (client, expired) = spy();
    let ttl = Duration::from_millis(300);
    let options = AcquireOptions::default()
        .with_ttl(ttl)
        .with_renewal(Renewal::disabled());
    let sent = Instant::now();
    let guard = client.try_acquire("left", &options).await.unwrap().unwrap();
    let lost = guard.lost();
    guard.abandon();
    let reason = tokio::time::timeout(Duration::from_secs(5), lost)
        .await
        .expect("lost() fires at the local deadline");
    assert_eq!(reason, LossReason::LeaseExpired);
    let deadline = Instant::now() + Duration::from_secs(5);
    while expired.lock().unwrap().is_empty() {
        assert!(Instant::now() < deadline, "expired() was never called");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let calls = expired.lock().unwrap().clone();
    assert_eq!(calls.len(), 1);
    assert!(
        calls[0] >= sent + ttl,
        "expired() came {:?} after the acquire was sent, before its ttl {ttl:?}",
        calls[0] - sent
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_or_renewed_lock_is_never_expired() {
    let (client, expired) = spy();
    // Renewed every 50 ms, a round may come 350 ms late before the lease runs out.
    let ttl = Duration::from_millis(400);
    let released = client
        .try_acquire("released", &AcquireOptions::default().with_ttl(ttl))
        .await
        .unwrap()
        .unwrap();
    let renewed = client
        .try_acquire(
            "renewed",
            &AcquireOptions::default()
                .with_ttl(ttl)
                .with_renewal(Renewal::auto().every(Duration::from_millis(50))),
        )
        .await
        .unwrap()
        .unwrap();
    released.release().await.unwrap();
    tokio::time::sleep(ttl * 3).await;
    assert!(!renewed.is_lost());
    renewed.release().await.unwrap();
    tokio::time::sleep(ttl * 2).await;
    assert!(expired.lock().unwrap().is_empty());
}

/// A lease whose release waits `delay` before it reaches the store, and whose renewals fail
/// without an answer when `unreachable` (counted in `failed`).
#[derive(Debug)]
struct SlowRelease {
    inner: Box<dyn Lease>,
    delay: Duration,
    unreachable: bool,
    failed: Arc<AtomicUsize>,
}

#[async_trait]
impl Lease for SlowRelease {
    async fn renew(&self, ttl: Duration) -> Result<()> {
        if self.unreachable {
            self.failed.fetch_add(1, Ordering::SeqCst);
            return Err(distlock_core::Error::Unavailable {
                message: "the test's server is unreachable".into(),
                source: None,
            });
        }
        self.inner.renew(ttl).await
    }

    async fn release(&self) -> Result<()> {
        tokio::time::sleep(self.delay).await;
        self.inner.release().await
    }
}

/// A release sent before the local deadline that finds the lock gone after it: the lease ran
/// out (what the watchdog, which the release stopped, would have said: a connection lost when
/// the renewals were failing), not a removal by somebody else. A release that finds the lock
/// gone before the deadline: somebody else's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_that_outlives_the_lease_reports_an_expiry() {
    let store = MemoryStore::new();
    // The last case's lease long enough that no stall of a loaded machine outlasts it.
    for (ttl, delay, unreachable, expected) in [
        (
            Duration::from_millis(300),
            Duration::from_millis(500),
            false,
            LossReason::LeaseExpired,
        ),
        (
            Duration::from_millis(300),
            Duration::from_millis(500),
            true,
            LossReason::ConnectionLost,
        ),
        (
            Duration::from_secs(30),
            Duration::ZERO,
            false,
            LossReason::ReleasedElsewhere,
        ),
    ] {
        let failed = Arc::new(AtomicUsize::new(0));
        let counted = failed.clone();
        let client = LockClient::new(Wrapping::new(
            &store,
            Arc::new(move |inner| {
                Box::new(SlowRelease {
                    inner,
                    delay,
                    unreachable,
                    failed: counted.clone(),
                })
            }),
        ));
        // Renewed (and failing, when unreachable) every 50 ms until the release.
        let renewal = if unreachable {
            Renewal::auto().every(Duration::from_millis(50))
        } else {
            Renewal::disabled()
        };
        let options = AcquireOptions::default()
            .with_ttl(ttl)
            .with_renewal(renewal);
        let guard = client.try_acquire("slow", &options).await.unwrap().unwrap();
        // A second renewal sent: the first one's failure was settled (renewals of a guard
        // come one after another).
        let renewed_twice = async {
            while unreachable && failed.load(Ordering::SeqCst) < 2 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(5), renewed_twice)
            .await
            .expect("the guard tried to renew twice");
        if expected == LossReason::ReleasedElsewhere {
            // Removed by somebody else while the lease lasts.
            let other = LockClient::new(MemoryBackend::new(store.clone()));
            assert!(other.force_release("slow").await.unwrap());
        }
        let lost = guard.lost();
        let err = guard.release().await.unwrap_err();
        let reason = tokio::time::timeout(Duration::from_secs(5), lost)
            .await
            .expect("lost() fires once the release found the lock gone");
        assert_eq!(reason, expected, "{delay:?}: {err}");
        if expected != LossReason::ReleasedElsewhere {
            assert!(
                matches!(&err, distlock_core::Error::Lost { reason, .. } if *reason == expected),
                "{err:?}"
            );
        } else {
            assert!(
                matches!(err, distlock_core::Error::NotHeld { .. }),
                "{err:?}"
            );
        }
    }
}
