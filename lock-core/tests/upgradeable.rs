//! The upgradeable read-write lock on the in-process backend: who excludes whom, upgrades
//! and downgrades with no writer in between, a failed upgrade that keeps its hold. The same
//! cases run on every real backend in the conformance suite.

use std::sync::Arc;
use std::time::Duration;

use distlock_core::memory::{MemoryBackend, MemoryStore};
use distlock_core::{
    AcquireOptions, ClientConfig, Error, LockClient, LockName, Renewal, UpgradeableRwLock,
};

fn opts() -> AcquireOptions {
    AcquireOptions::default().with_ttl(Duration::from_secs(10))
}

const SHORT: Duration = Duration::from_millis(200);

#[tokio::test]
async fn one_upgradeable_reader_shares_with_readers_and_excludes_writers() {
    let rw = UpgradeableRwLock::new(MemoryStore::new().client(), "doc").expect("valid");
    let up = rw.upgradeable(&opts()).await.expect("upgradeable");
    assert!(rw.try_upgradeable(&opts()).await.unwrap().is_none());
    assert!(rw.try_write(&opts()).await.unwrap().is_none());
    let reader = rw
        .try_read(&opts())
        .await
        .unwrap()
        .expect("a reader shares");
    let waited = rw.write(&opts().with_wait(SHORT)).await;
    assert!(matches!(waited, Err(Error::Timeout { .. })), "{waited:?}");
    reader.release().await.expect("released");
    up.release().await.expect("released");
    let writer = rw.try_write(&opts()).await.unwrap().expect("free again");
    assert!(rw.try_read(&opts()).await.unwrap().is_none());
    assert!(rw.try_upgradeable(&opts()).await.unwrap().is_none());
    writer.release().await.expect("released");
}

#[tokio::test]
async fn an_upgrade_waits_for_the_readers_and_no_writer_comes_between() {
    let rw = UpgradeableRwLock::new(MemoryStore::new().client(), "doc").expect("valid");
    let up = rw.upgradeable(&opts()).await.expect("upgradeable");
    let read_token = up.token();
    let reader = rw.read(&opts()).await.expect("reader");
    // A writer queues for the gate.
    let other = rw.clone();
    let writer = tokio::spawn(async move { other.write(&opts()).await.map(|w| w.token()) });
    tokio::time::sleep(SHORT).await;
    let upgrading = tokio::spawn(up.upgrade(Some(Duration::from_secs(5))));
    tokio::time::sleep(SHORT).await;
    assert!(!upgrading.is_finished(), "upgraded while a reader reads");
    reader.release().await.expect("released");
    let write = upgrading.await.unwrap().expect("upgraded");
    assert!(
        write.token() > read_token,
        "{:?} after {read_token:?}",
        write.token()
    );
    assert!(!writer.is_finished(), "the other writer came between");
    let token = write.token();
    write.release().await.expect("released");
    let later = writer.await.unwrap().expect("the other writer after");
    assert!(later > token);
}

#[tokio::test]
async fn a_timed_out_upgrade_gives_back_the_upgradeable_hold() {
    let rw = UpgradeableRwLock::new(MemoryStore::new().client(), "doc").expect("valid");
    let up = rw.upgradeable(&opts()).await.expect("upgradeable");
    let reader = rw.read(&opts()).await.expect("reader");
    let failed = up.upgrade(Some(SHORT)).await.expect_err("a reader stays");
    assert!(
        matches!(failed.error, Error::Timeout { .. }),
        "{:?}",
        failed.error
    );
    let up = failed.guard.expect("the upgradeable hold kept");
    assert!(!up.is_lost());
    assert!(rw.try_upgradeable(&opts()).await.unwrap().is_none());
    assert!(rw.try_write(&opts()).await.unwrap().is_none());
    // Readers read on, and once they are done the upgrade goes through.
    let second = rw.try_read(&opts()).await.unwrap().expect("readers share");
    second.release().await.expect("released");
    reader.release().await.expect("released");
    let write = up.upgrade(Some(SHORT)).await.expect("upgraded");
    write.release().await.expect("released");
}

#[tokio::test]
async fn a_downgrade_lets_readers_in_and_no_writer() {
    let rw = UpgradeableRwLock::new(MemoryStore::new().client(), "doc").expect("valid");
    let write = rw.write(&opts()).await.expect("writer");
    let write_token = write.token();
    let other = rw.clone();
    let writer = tokio::spawn(async move { other.write(&opts()).await.map(|w| w.token()) });
    let reader_lock = rw.clone();
    let reader = tokio::spawn(async move { reader_lock.read(&opts()).await });
    tokio::time::sleep(SHORT).await;
    let up = write.downgrade_to_upgradeable().await.expect("downgraded");
    assert!(up.token() > write_token);
    let reader = reader.await.unwrap().expect("a waiting reader gets in");
    assert!(!writer.is_finished(), "a writer came between");
    reader.release().await.expect("released");
    // Up again, then down to a plain reader: the gate goes, the writer waits for the read.
    let write = up.upgrade(None).await.expect("upgraded");
    let read = write.downgrade().await.expect("downgraded");
    tokio::time::sleep(SHORT).await;
    assert!(!writer.is_finished(), "a writer got in beside a reader");
    // The gate let go of: the waiting writer took it, and waits for the reader.
    assert!(rw.try_upgradeable(&opts()).await.unwrap().is_none());
    let read_token = read.token();
    read.release().await.expect("released");
    let later = writer.await.unwrap().expect("the writer after");
    assert!(later > read_token);
}

#[tokio::test]
async fn names_too_long_for_the_gate_are_refused() {
    let longest = "n".repeat(LockName::MAX_LEN - distlock_core::GATE_SUFFIX.len());
    let locks = MemoryStore::new().client();
    assert!(UpgradeableRwLock::new(locks.clone(), &longest).is_ok());
    let refused = UpgradeableRwLock::new(locks.clone(), &format!("{longest}n"));
    assert!(
        matches!(refused, Err(Error::InvalidName { .. })),
        "{refused:?}"
    );
    assert!(matches!(
        UpgradeableRwLock::new(locks, ""),
        Err(Error::InvalidName { .. })
    ));
}

/// A writer whose gate is lost while it waits for the readers gives up at once, and leaves no
/// place in the queue behind: it never takes the name after another writer took the gate.
#[tokio::test]
async fn a_writer_that_loses_its_gate_while_waiting_gives_up() {
    let store = MemoryStore::new();
    let rw = UpgradeableRwLock::new(store.client(), "doc").expect("valid");
    let short = AcquireOptions::default().with_ttl(Duration::from_millis(300));
    let reader = rw.read(&short).await.expect("reader");
    let writer = {
        let rw = rw.clone();
        let opts = short.clone().with_wait(Duration::from_secs(10));
        tokio::spawn(async move { rw.write(&opts).await })
    };
    tokio::time::sleep(SHORT).await;
    assert!(store.remove("doc#upgrade"), "the writer held the gate");
    let ended = tokio::time::timeout(Duration::from_secs(3), writer)
        .await
        .expect("the writer kept waiting without its gate")
        .expect("no panic");
    assert!(matches!(ended, Err(Error::Lost { .. })), "{ended:?}");
    // Nothing of it is left: with the reader gone, another writer gets in at once.
    reader.release().await.expect("released");
    let next = rw
        .try_write(&short)
        .await
        .unwrap()
        .expect("the writer left no trace");
    next.release().await.expect("released");
}

/// A writer takes the gate, then waits for the readers of the name: `hold_at_least` keeps
/// the gate until the minimum has passed since the name was taken too. Counted from the
/// gate's own acquisition, the gate stopped renewing once its lease covered its own minimum,
/// and another client could take it while the name's minimum went on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_at_least_keeps_the_gate_until_the_names_minimum() {
    // Renewal stops once a lease covers the minimum plus one operation timeout: a short one.
    let config = ClientConfig::default().with_operation_timeout(Duration::from_millis(100));
    let store = MemoryStore::new();
    let client = LockClient::with_config(MemoryBackend::new(store.clone()), config);
    let rw = UpgradeableRwLock::new(Arc::new(client.expect("valid config")), "doc").expect("valid");
    let short = AcquireOptions::default()
        .with_ttl(Duration::from_secs(1))
        .with_renewal(Renewal::auto());
    let reader = rw.read(&opts()).await.expect("reader");
    let leaving = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        reader.release().await
    });
    let write = rw.write(&short).await.expect("writer");
    leaving.await.unwrap().expect("released");
    let other = store.client();
    let gate = rw.gate().clone();
    let (_, taken) = tokio::join!(write.hold_at_least(Duration::from_secs(2)), async {
        // Past the gate's own minimum (2 s after it) and its lease's end then, before the
        // name's minimum ends (3.5 s after the gate).
        tokio::time::sleep(Duration::from_millis(1500)).await;
        other.try_acquire(gate.as_str(), &opts()).await
    });
    assert!(
        taken.expect("answered").is_none(),
        "another client took the gate before the minimum"
    );
    write.release().await.expect("both parts still held");
}

/// `hold_at_least` on a gated hold keeps both parts until the minimum has passed.
#[tokio::test]
async fn hold_at_least_keeps_both_parts() {
    let rw = UpgradeableRwLock::new(MemoryStore::new().client(), "doc").expect("valid");
    let started = std::time::Instant::now();
    let write = rw.write(&opts()).await.expect("writer");
    write.hold_at_least(SHORT).await;
    assert!(started.elapsed() >= SHORT, "{:?}", started.elapsed());
    assert!(!write.is_lost());
    assert!(
        rw.try_read(&opts()).await.unwrap().is_none(),
        "the name let go of"
    );
    assert!(
        rw.try_upgradeable(&opts()).await.unwrap().is_none(),
        "the gate let go of"
    );
    write.release().await.expect("released");
}
