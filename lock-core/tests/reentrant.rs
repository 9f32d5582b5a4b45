//! Reentrant holds and options checked against the client: a hold released while others go on
//! still reports a loss already known, and a renewal interval past the holder's deadline is
//! refused at acquire rather than ending every hold as a loss.

use std::time::Duration;

use distlock_core::memory::{MemoryBackend, MemoryStore};
use distlock_core::{
    AcquireOptions, ClientConfig, DistributedLock, Error, LockClient, OwnerId, Renewal,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reentrant_release_reports_a_known_loss() {
    let store = MemoryStore::new();
    let client = LockClient::new(MemoryBackend::new(store.clone()));
    let opts = AcquireOptions::default()
        .with_ttl(Duration::from_millis(300))
        .with_renewal(Renewal::auto())
        .with_owner(OwnerId::new("worker-1").unwrap());
    let first = client.acquire("shared-job", &opts).await.unwrap();
    let second = client.acquire("shared-job", &opts).await.unwrap();
    assert!(store.remove("shared-job"), "the hold was not on the store");
    tokio::time::timeout(Duration::from_secs(5), second.lost())
        .await
        .expect("the loss was not reported within 5 s");
    let released = first.release().await;
    assert!(
        matches!(released, Err(Error::Lost { .. })),
        "a release of a lost reentrant hold answered {released:?}"
    );
    let last = second.release().await;
    assert!(
        last.as_ref().is_err_and(Error::is_not_held),
        "the last release answered {last:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_due_after_the_holders_deadline_is_refused() {
    let store = MemoryStore::new();
    let client = LockClient::new(MemoryBackend::new(store.clone()));
    let ttl = Duration::from_secs(1);
    // The default drift margin (1% + 2 ms) puts the deadline at 988 ms.
    let late = AcquireOptions::default()
        .with_ttl(ttl)
        .with_renewal(Renewal::auto().every(Duration::from_millis(995)));
    let refused = client.acquire("renewed", &late).await;
    assert!(
        matches!(&refused, Err(Error::InvalidOptions(msg)) if msg.contains("drift margin")),
        "a renewal after the deadline answered {:?}",
        refused.map(|g| g.token())
    );
    assert!(store.is_empty(), "a refused acquire left a hold");
    // Just inside the deadline: taken, and held across renewals.
    let config = ClientConfig::default();
    let inside = ttl - config.drift(ttl) - Duration::from_millis(300);
    let opts = AcquireOptions::default()
        .with_ttl(ttl)
        .with_renewal(Renewal::auto().every(inside));
    let guard = client.acquire("renewed", &opts).await.unwrap();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(
        !guard.is_lost(),
        "a hold renewed inside its deadline was lost"
    );
    guard.release().await.unwrap();
}
