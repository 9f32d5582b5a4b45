//! A grant that comes back after the lease it grants has run out (the process was paused, the
//! answer was held up past the ttl) is never handed out as a guard: it is released and the
//! lock asked for again. Found by the conformance suite's paused waiter: resumed after
//! `SIGSTOP`, it read a grant from before the pause and reported a lock that another client
//! held (its release then said "not held").

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use distlock_core::backend::Acquired;
use distlock_core::memory::{MemoryBackend, MemoryStore};
use distlock_core::{
    AcquireOptions, AcquireRequest, Attempt, Capabilities, DistributedLock, FencingToken, Lease,
    LockBackend, LockClient, Result, Step,
};

const TTL: Duration = Duration::from_millis(300);

/// Grants every attempt; the first `late` attempts answer only after a ttl and more.
#[derive(Debug)]
struct Late {
    caps: Capabilities,
    late: usize,
    attempts: Arc<AtomicUsize>,
    releases: Arc<AtomicUsize>,
    /// Each attempt's owner, in order.
    owners: Arc<std::sync::Mutex<Vec<String>>>,
}

struct LateAttempt {
    late: bool,
    releases: Arc<AtomicUsize>,
}

#[derive(Debug)]
struct CountedLease(Arc<AtomicUsize>);

#[async_trait]
impl LockBackend for Late {
    fn name(&self) -> &'static str {
        "late"
    }

    fn capabilities(&self) -> Capabilities {
        self.caps.clone()
    }

    fn begin(&self, request: AcquireRequest) -> Box<dyn Attempt> {
        let n = self.attempts.fetch_add(1, Ordering::SeqCst);
        self.owners
            .lock()
            .expect("not poisoned")
            .push(request.owner.to_string());
        Box::new(LateAttempt {
            late: n < self.late,
            releases: self.releases.clone(),
        })
    }
}

#[async_trait]
impl Attempt for LateAttempt {
    async fn poll(&mut self) -> Result<Step> {
        if self.late {
            // The answer held up (or the process paused) past the ttl.
            tokio::time::sleep(TTL + Duration::from_millis(100)).await;
        }
        let lease = Box::new(CountedLease(self.releases.clone()));
        Ok(Step::Acquired(Acquired::new(lease, FencingToken::new(1))))
    }

    async fn abandon(self: Box<Self>) -> Result<()> {
        Ok(())
    }
}

#[async_trait]
impl Lease for CountedLease {
    async fn renew(&self, _ttl: Duration) -> Result<()> {
        Ok(())
    }

    async fn release(&self) -> Result<()> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

fn late_client(late: usize) -> (LockClient<Late>, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    let (client, attempts, releases, _) = late_client_owners(late);
    (client, attempts, releases)
}

type Owners = Arc<std::sync::Mutex<Vec<String>>>;

fn late_client_owners(
    late: usize,
) -> (LockClient<Late>, Arc<AtomicUsize>, Arc<AtomicUsize>, Owners) {
    let (attempts, releases, owners) = (Arc::default(), Arc::default(), Owners::default());
    let backend = Late {
        caps: MemoryBackend::new(MemoryStore::new()).capabilities(),
        late,
        attempts: Arc::clone(&attempts),
        releases: Arc::clone(&releases),
        owners: Arc::clone(&owners),
    };
    (LockClient::new(backend), attempts, releases, owners)
}

/// The late grant's release runs in the background and can reach the server after the next
/// grant: under the same owner it would release that grant from under its guard (found by
/// `distlock check` on Redis: a reader whose acquire was held up by a partition kept passing
/// its checks while a writer held the lock). So the next attempt asks under a new owner, the
/// guard holds that one, and a campaign's keeps its leader value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_attempt_after_a_late_grant_asks_under_a_new_owner() {
    let options = AcquireOptions::default().with_ttl(TTL);
    let (client, _, releases, owners) = late_client_owners(1);
    let guard = client.acquire("late", &options).await.expect("acquired");
    let asked = owners.lock().expect("not poisoned").clone();
    assert_eq!(asked.len(), 2, "{asked:?}");
    assert_ne!(
        asked[0], asked[1],
        "the same owner asked again after a late grant"
    );
    assert_eq!(guard.owner(), asked[1]);
    released(&releases, 1).await;

    let (client, _, releases, owners) = late_client_owners(1);
    let leader = client
        .campaign("late-election", "node-7", &options)
        .await
        .expect("elected");
    let asked = owners.lock().expect("not poisoned").clone();
    assert_eq!(asked.len(), 2, "{asked:?}");
    assert_ne!(asked[0], asked[1]);
    assert!(asked.iter().all(|o| o.ends_with("@node-7")), "{asked:?}");
    assert_eq!(leader.owner(), asked[1]);
    released(&releases, 1).await;
}

async fn released(releases: &AtomicUsize, n: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while releases.load(Ordering::SeqCst) < n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the late grants were not released"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_grant_is_released_and_the_lock_asked_for_again() {
    let (client, attempts, releases) = late_client(1);
    let options = AcquireOptions::default().with_ttl(TTL);
    let guard = client.acquire("late", &options).await.expect("acquired");
    assert!(!guard.is_lost(), "the guard handed out had run out already");
    assert_eq!(
        attempts.load(Ordering::SeqCst),
        2,
        "one late grant, one more attempt"
    );
    released(&releases, 1).await;
    guard.release().await.expect("released");
    // try_acquire too.
    let (client, attempts, releases) = late_client(1);
    let guard = client
        .try_acquire("late", &options)
        .await
        .unwrap()
        .expect("acquired");
    assert!(!guard.is_lost());
    assert_eq!(attempts.load(Ordering::SeqCst), 2);
    released(&releases, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquisition_whose_every_grant_is_late_still_ends() {
    let (client, attempts, releases) = late_client(usize::MAX);
    let options = AcquireOptions::default().with_ttl(TTL);
    let guard = client.acquire("always-late", &options).await.expect("ends");
    // Three late grants released, the fourth handed out as it is: already lost.
    assert_eq!(attempts.load(Ordering::SeqCst), 4);
    assert!(guard.is_lost(), "a grant that ran out is reported lost");
    released(&releases, 3).await;
}
