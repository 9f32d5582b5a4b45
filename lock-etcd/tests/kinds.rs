//! etcd-specific behaviour of the shared and permit kinds: a holder whose lease is not kept
//! alive (a crashed process) stops counting once etcd expires its lease, for the next
//! acquirer of a semaphore and for a writer waiting behind a reader.

mod common;

use std::time::{Duration, Instant};

use common::{Etcd, unique};
use conformance_tests::server_var;
use distlock_core::LockBackend;
use distlock_core::{AcquireOptions, DistributedLock, FencingToken, LockKind};
use distlock_etcd::etcd_client::PutOptions;
use futures::StreamExt;

const TTL: Duration = Duration::from_secs(3);
/// Lease expiry is checked by the leader every 500 ms; raft rounds fsync on a busy machine.
const SLACK: Duration = Duration::from_millis(1500);
/// The lease of the crashed holder: etcd's minimum.
const CRASHED_TTL: i64 = 2;

async fn single() -> Option<Etcd> {
    let endpoints = server_var("etcd", "DISTLOCK_TEST_ETCD_ENDPOINTS")?;
    Some(Etcd::new(&endpoints, vec!["etcd"]).await)
}

/// What a crashed process leaves behind: its queue key of `kind` (`kind_tag` is the layout's
/// `r.` or `p<N>.`) on a lease that nobody keeps alive. Returns the key's create revision and
/// when the lease was granted.
async fn crashed_holder(etcd: &Etcd, name: &str, kind_tag: &str) -> (i64, Instant) {
    let mut admin = etcd.admin.clone();
    let granted = Instant::now();
    let lease = admin
        .lease_grant(CRASHED_TTL, None)
        .await
        .expect("grant a lease");
    let key = format!(
        "{}{kind_tag}00c0ffee00c0ffee.0",
        etcd.backend().await.key_range(name)
    );
    let put = admin
        .put(
            key,
            "crashed",
            Some(PutOptions::new().with_lease(lease.id())),
        )
        .await
        .expect("put the crashed holder's key");
    let rev = put.header().expect("a header").revision();
    (rev, granted)
}

#[tokio::test]
async fn an_expired_semaphore_holder_stops_counting_for_the_next_acquirer() {
    let Some(etcd) = single().await else { return };
    let (a, b) = (etcd.client().await.unwrap(), etcd.client().await.unwrap());
    let name = unique("sem-expired");
    let opts = AcquireOptions::default()
        .with_ttl(TTL)
        .with_permits(2)
        .with_wait(Duration::from_secs(20));
    let (crashed, granted) = crashed_holder(&etcd, &name, "p2.").await;
    let kept = a.acquire(&name, &opts).await.expect("the second permit");
    let info = a.inspect(&name).await.unwrap().expect("held");
    assert_eq!(
        (info.kind, info.holders),
        (LockKind::Permit { permits: 2 }, 2)
    );
    assert!(
        b.try_acquire(&name, &opts).await.unwrap().is_none(),
        "a third permit of 2 while the crashed holder's lease runs"
    );
    let guard = b.acquire(&name, &opts).await.expect("the expired permit");
    let waited = granted.elapsed();
    assert!(
        waited >= Duration::from_secs(CRASHED_TTL as u64),
        "the permit came back after {waited:?}, before the lease ran out"
    );
    assert!(
        waited <= Duration::from_secs(CRASHED_TTL as u64) + SLACK,
        "the permit came back only after {waited:?}"
    );
    assert!(guard.token() > FencingToken::new(crashed as u64));
    assert!(guard.token() > kept.token());
    assert!(!kept.is_lost(), "the live holder lost its permit");
    let info = a.inspect(&name).await.unwrap().expect("held");
    assert_eq!(info.holders, 2, "{info:?}");
    assert_eq!(
        info.token,
        Some(guard.token()),
        "the latest holder is reported"
    );
    guard.release().await.unwrap();
    kept.release().await.unwrap();
    assert_eq!(a.inspect(&name).await.unwrap(), None);
}

#[tokio::test]
async fn a_crashed_reader_frees_the_lock_after_its_ttl_while_a_writer_waits() {
    let Some(etcd) = single().await else { return };
    let (a, w) = (etcd.client().await.unwrap(), etcd.client().await.unwrap());
    let name = unique("rw-crashed");
    let read = AcquireOptions::default().with_ttl(TTL).shared();
    let write = AcquireOptions::default()
        .with_ttl(TTL)
        .with_wait(Duration::from_secs(20));
    let (crashed, granted) = crashed_holder(&etcd, &name, "r.").await;
    let live = a
        .acquire(&name, &read)
        .await
        .expect("a reader joins readers");
    let info = a.inspect(&name).await.unwrap().expect("held");
    assert_eq!((info.kind, info.holders), (LockKind::Shared, 2));
    let writer = {
        let (w, name, write) = (w.clone(), name.clone(), write.clone());
        tokio::spawn(async move { w.acquire(&name, &write).await })
    };
    // The live reader leaves once the writer queues; the crashed one stays until its lease ends.
    while etcd.entries(&name).await.len() < 3 {
        tokio::task::yield_now().await;
    }
    let reader_token = live.token();
    live.release().await.unwrap();
    let guard = tokio::time::timeout(Duration::from_secs(10), writer)
        .await
        .expect("the writer still waits after the crashed reader's ttl")
        .unwrap()
        .expect("the writer's acquire");
    let waited = granted.elapsed();
    assert!(
        waited >= Duration::from_secs(CRASHED_TTL as u64),
        "the writer got in after {waited:?}, before the reader's lease ran out"
    );
    assert!(
        waited <= Duration::from_secs(CRASHED_TTL as u64) + SLACK,
        "the writer got in only after {waited:?}"
    );
    assert!(guard.token() > FencingToken::new(crashed as u64));
    assert!(guard.token() > reader_token);
    let info = w.inspect(&name).await.unwrap().expect("held");
    assert_eq!((info.kind, info.holders), (LockKind::Exclusive, 1));
    guard.release().await.unwrap();
}

#[tokio::test]
async fn observers_are_woken_by_shared_and_permit_holders() {
    let Some(etcd) = single().await else { return };
    let client = etcd.client().await.unwrap();
    for (what, opts) in [
        ("rw", AcquireOptions::default().with_ttl(TTL).shared()),
        (
            "sem",
            AcquireOptions::default().with_ttl(TTL).with_permits(3),
        ),
    ] {
        let name = unique(what);
        let lock_name = distlock_core::LockName::new(name.clone()).unwrap();
        let mut changes = client
            .backend_ref()
            .watch(&lock_name)
            .expect("etcd watches");
        // The first yield says the watch is open: nothing after it is missed.
        let open = tokio::time::timeout(SLACK, changes.next()).await;
        assert_eq!(open.ok().flatten(), Some(()), "the watch did not open");
        let guard = client.acquire(&name, &opts).await.unwrap();
        let taken = tokio::time::timeout(SLACK, changes.next()).await;
        assert_eq!(
            taken.ok().flatten(),
            Some(()),
            "no wake-up for a new {what} holder"
        );
        guard.release().await.unwrap();
        let released = tokio::time::timeout(SLACK, changes.next()).await;
        assert_eq!(
            released.ok().flatten(),
            Some(()),
            "no wake-up for a {what} release"
        );
    }
}

/// An attempt queued behind a key of another kind is refused, whether that key is the one
/// just ahead of it or further: a left-over key of its own kind in between (here a crashed
/// process's, whose lease runs 2 s) hid the foreign key from the check of the newest key
/// only, and the attempt waited for the foreign holder to go, to take a name used as
/// another kind.
#[tokio::test]
async fn a_foreign_kind_behind_a_key_of_ours_refuses_the_attempt() {
    let Some(etcd) = single().await else { return };
    let (a, b) = (etcd.client().await.unwrap(), etcd.client().await.unwrap());
    let waits = |opts: AcquireOptions| opts.with_ttl(TTL).with_wait(Duration::from_secs(4));
    // (what holds, the crashed key's kind tag, what then asks)
    let cases = [
        (
            AcquireOptions::default(),
            "p2.",
            waits(AcquireOptions::default().with_permits(2)),
        ),
        (
            AcquireOptions::default().with_permits(2),
            "",
            waits(AcquireOptions::default().shared()),
        ),
        (
            AcquireOptions::default().with_permits(2),
            "",
            waits(AcquireOptions::default()),
        ),
    ];
    for (held, crashed, asks) in cases {
        let name = unique("foreign-behind");
        let holder = a
            .acquire(&name, &held.clone().with_ttl(Duration::from_secs(30)))
            .await
            .expect("the holder");
        crashed_holder(&etcd, &name, crashed).await;
        let started = Instant::now();
        let got = b.acquire(&name, &asks).await;
        assert!(
            matches!(got, Err(distlock_core::Error::Mismatch { .. })),
            "{:?} behind a crashed {crashed:?} key and a {:?} holder: {got:?} after {:?}",
            asks.kind,
            held.kind,
            started.elapsed()
        );
        holder.release().await.expect("release");
    }
}
