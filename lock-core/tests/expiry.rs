//! `Lease::expired`: the core calls it once a lock ran out without a release, after the server's
//! lease certainly ended, and never after a clean release.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use distlock_core::memory::{MemoryBackend, MemoryStore};
use distlock_core::{
    AcquireOptions, AcquireRequest, Attempt, Capabilities, DistributedLock, Lease, LockBackend,
    LockClient, LossReason, Renewal, Result, Step,
};

/// The in-memory backend, with every lease recording when `expired` was called.
#[derive(Debug)]
struct Spy {
    inner: MemoryBackend,
    expired: Arc<Mutex<Vec<Instant>>>,
}

struct SpyAttempt {
    inner: Box<dyn Attempt>,
    expired: Arc<Mutex<Vec<Instant>>>,
}

#[derive(Debug)]
struct SpyLease {
    inner: Box<dyn Lease>,
    expired: Arc<Mutex<Vec<Instant>>>,
}

#[async_trait]
impl LockBackend for Spy {
    fn name(&self) -> &'static str {
        "spy"
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn begin(&self, request: AcquireRequest) -> Box<dyn Attempt> {
        Box::new(SpyAttempt {
            inner: self.inner.begin(request),
            expired: self.expired.clone(),
        })
    }
}

#[async_trait]
impl Attempt for SpyAttempt {
    async fn poll(&mut self) -> Result<Step> {
        Ok(match self.inner.poll().await? {
            Step::Acquired(mut acquired) => {
                let inner = std::mem::replace(&mut acquired.lease, Box::new(Dead));
                acquired.lease = Box::new(SpyLease {
                    inner,
                    expired: self.expired.clone(),
                });
                Step::Acquired(acquired)
            }
            other => other,
        })
    }

    async fn changed(&mut self) {
        self.inner.changed().await;
    }

    async fn abandon(self: Box<Self>) -> Result<()> {
        self.inner.abandon().await
    }
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

/// A placeholder while the real lease is moved into the spy.
#[derive(Debug)]
struct Dead;

#[async_trait]
impl Lease for Dead {
    async fn renew(&self, _: Duration) -> Result<()> {
        unreachable!("replaced at once")
    }

    async fn release(&self) -> Result<()> {
        unreachable!("replaced at once")
    }
}

fn spy() -> (LockClient<Spy>, Arc<Mutex<Vec<Instant>>>) {
    let expired = Arc::new(Mutex::new(Vec::new()));
    let backend = Spy {
        inner: MemoryBackend::new(MemoryStore::new()),
        expired: expired.clone(),
    };
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
    let ttl = Duration::from_millis(200);
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
