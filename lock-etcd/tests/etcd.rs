//! etcd-specific behaviour: lease revocation, a cluster member going down, fencing across a
//! restart, FIFO order of waiters, cancelled waits, bad input.
//!
//! Tests that stop a server take [`SERVERS`] for writing; the others take it for reading, so
//! that no test runs while a server of this binary is down.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Etcd, OP_TIMEOUT, service, unique};
use conformance_tests::failover::{self, Plan, Tally};
use conformance_tests::{TestClient, server_var};
use distlock_core::{AcquireOptions, ClientConfig, DistributedLock, Error, LossReason};
use distlock_etcd::etcd_client::GetOptions;
use futures::FutureExt;
use tokio::sync::RwLock;

static SERVERS: RwLock<()> = RwLock::const_new(());

const TTL: Duration = Duration::from_secs(3);
/// Lease expiry is checked by the leader every 500 ms; raft rounds fsync on a busy machine.
const SLACK: Duration = Duration::from_millis(1500);

fn opts() -> AcquireOptions {
    AcquireOptions::default()
        .with_ttl(TTL)
        .with_wait(Duration::from_secs(10))
}

async fn single() -> Option<Etcd> {
    let endpoints = server_var("etcd", "DISTLOCK_TEST_ETCD_ENDPOINTS")?;
    Some(Etcd::new(&endpoints, vec!["etcd"]).await)
}

async fn cluster() -> Option<Etcd> {
    let endpoints = server_var("etcd", "DISTLOCK_TEST_ETCD_CLUSTER_ENDPOINTS")?;
    let members = vec!["etcd-cluster-1", "etcd-cluster-2", "etcd-cluster-3"];
    Some(Etcd::new(&endpoints, members).await)
}

/// Waits until a quorum answers a linearizable read again.
async fn serving(etcd: &Etcd) {
    for _ in 0..150 {
        let mut admin = etcd.admin.clone();
        let read = admin.get("distlock-probe", Some(GetOptions::new().with_count_only()));
        if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(1), read).await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("etcd did not serve again");
}

/// Runs `body` with `member` stopped and starts it again afterwards, also when `body` panics.
async fn with_member_stopped<F>(etcd: &Etcd, member: &str, body: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    service("stop-one", member).await.expect("stop the member");
    let outcome = std::panic::AssertUnwindSafe(body).catch_unwind().await;
    service("start-one", member)
        .await
        .expect("start the member again");
    serving(etcd).await;
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

#[tokio::test]
async fn revoking_the_lease_is_reported_as_loss() {
    let _serial = SERVERS.read().await;
    let Some(etcd) = single().await else { return };
    let (a, b) = (etcd.client().await.unwrap(), etcd.client().await.unwrap());
    let name = unique("revoke");
    let guard = a.acquire(&name, &opts()).await.unwrap();
    let entries = etcd.entries(&name).await;
    assert_eq!(entries.len(), 1, "{entries:?}");
    let lease = entries[0].2;
    assert_ne!(lease, 0, "the queue key is attached to a lease");
    etcd.admin.clone().lease_revoke(lease).await.unwrap();
    // The next renewal (every ttl/3) learns that the lease is gone.
    let reason = tokio::time::timeout(TTL + SLACK, guard.lost())
        .await
        .expect("the loss is reported within the ttl");
    assert!(
        matches!(
            reason,
            LossReason::RenewalRejected | LossReason::LeaseExpired
        ),
        "{reason:?}"
    );
    assert!(etcd.entries(&name).await.is_empty());
    let other = b.try_acquire(&name, &opts()).await.unwrap();
    let other = other.expect("the name is free once the lease is revoked");
    other.release().await.unwrap();
    // The client grants itself a new lease.
    let again = a.acquire(&name, &opts()).await.unwrap();
    assert_ne!(etcd.entries(&name).await[0].2, lease);
    again.release().await.unwrap();
    assert!(matches!(guard.release().await, Err(Error::Lost { .. })));
}

#[tokio::test]
async fn stopping_one_cluster_member_keeps_locks_working() {
    let _serial = SERVERS.write().await;
    let Some(etcd) = cluster().await else { return };
    let etcd = Arc::new(etcd);
    let (a, b) = (etcd.client().await.unwrap(), etcd.client().await.unwrap());
    let name = unique("member-down");
    let held = a.acquire(&name, &opts()).await.unwrap();
    let token = held.token();
    let body = {
        let etcd = etcd.clone();
        async move {
            // Longer than two ttls: the holder keeps renewing through the remaining members.
            let until = Instant::now() + TTL * 2 + SLACK;
            let mut rounds = 0;
            while Instant::now() < until {
                assert!(!held.is_lost(), "the holder lost its lease");
                let busy = b.try_acquire(&name, &opts()).await.unwrap();
                assert!(busy.is_none(), "another client took a held lock");
                let other = b.acquire(&unique("member-down-other"), &opts()).await;
                let other = other.expect("locks keep working with one member down");
                assert!(other.token() > token);
                other.release().await.unwrap();
                rounds += 1;
                tokio::time::sleep(TTL / 6).await;
            }
            assert!(rounds >= 3);
            assert_eq!(etcd.entries(&name).await.len(), 1);
            held.release().await.expect("the holder still holds");
        }
    };
    with_member_stopped(&etcd, "etcd-cluster-1", body).await;
    let after = a.acquire(&unique("member-back"), &opts()).await.unwrap();
    after.release().await.unwrap();
}

#[tokio::test]
async fn fencing_tokens_grow_across_a_restart() {
    let _serial = SERVERS.write().await;
    let Some(etcd) = single().await else { return };
    let etcd = Arc::new(etcd);
    let client = etcd.client().await.unwrap();
    let name = unique("restart");
    let first = client.acquire(&name, &opts()).await.unwrap();
    let before = first.token();
    first.release().await.unwrap();
    with_member_stopped(&etcd, "etcd", async {}).await;
    // The same client reconnects; a fresh one sees the same counter.
    let fresh = etcd.client().await.unwrap();
    for lock in [&client, &fresh] {
        let guard = lock.acquire(&name, &opts()).await.unwrap();
        assert!(
            guard.token() > before,
            "{:?} after the restart, {before:?} before",
            guard.token()
        );
        guard.release().await.unwrap();
    }
}

#[tokio::test]
async fn waiters_are_served_in_arrival_order() {
    let _serial = SERVERS.read().await;
    let Some(etcd) = single().await else { return };
    let name = unique("fifo");
    let holder = etcd.client().await.unwrap();
    let held = holder.acquire(&name, &opts()).await.unwrap();
    let (order_tx, mut order_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    for i in 0..5 {
        let client = etcd.client().await.unwrap();
        let (waiter_name, order) = (name.clone(), order_tx.clone());
        tasks.push(tokio::spawn(async move {
            let guard = client.acquire(&waiter_name, &opts()).await.unwrap();
            order.send((i, guard.token())).unwrap();
            guard.release().await.unwrap();
        }));
        // The next waiter arrives once this one is queued.
        for _ in 0..200 {
            if etcd.entries(&name).await.len() == i + 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(etcd.entries(&name).await.len(), i + 2, "waiter {i} queued");
    }
    drop(order_tx);
    held.release().await.unwrap();
    let mut order = Vec::new();
    while let Some(entry) = order_rx.recv().await {
        order.push(entry);
    }
    for task in tasks {
        task.await.unwrap();
    }
    let served: Vec<usize> = order.iter().map(|(i, _)| *i).collect();
    assert_eq!(served, [0, 1, 2, 3, 4]);
    assert!(order.windows(2).all(|w| w[0].1 < w[1].1), "{order:?}");
    assert!(etcd.entries(&name).await.is_empty());
}

#[tokio::test]
async fn a_timed_out_waiter_leaves_the_queue() {
    let _serial = SERVERS.read().await;
    let Some(etcd) = single().await else { return };
    let (a, b) = (etcd.client().await.unwrap(), etcd.client().await.unwrap());
    let name = unique("leave");
    let held = a.acquire(&name, &opts()).await.unwrap();
    let short = opts().with_wait(Duration::from_millis(300));
    let err = b.acquire(&name, &short).await.unwrap_err();
    assert!(matches!(err, Error::Timeout { .. }), "{err:?}");
    // Cancelled by dropping the future, too.
    let long = opts();
    let cancelled = tokio::time::timeout(Duration::from_millis(300), b.acquire(&name, &long));
    assert!(cancelled.await.is_err());
    // Abandoning a cancelled attempt runs in the background.
    for _ in 0..100 {
        if etcd.entries(&name).await.len() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        etcd.entries(&name).await.len(),
        1,
        "only the holder remains"
    );
    held.release().await.unwrap();
    assert!(etcd.entries(&name).await.is_empty());
}

/// Acquisitions cancelled at every point of their put (before it is sent, on its way, after
/// it landed) leave no key once their cleanup ran: the delete waits for the put's answer, so
/// it cannot reach the server first and leave the put's key to the lease (3 s here).
#[tokio::test]
async fn acquisitions_cancelled_mid_put_leave_no_key() {
    let _serial = SERVERS.read().await;
    let Some(etcd) = single().await else { return };
    let (a, b) = (etcd.client().await.unwrap(), etcd.client().await.unwrap());
    let (queued, free) = (unique("cancel-queued"), unique("cancel-free"));
    let held = a.acquire(&queued, &opts()).await.unwrap();
    let mut free_taken = 0;
    for i in 0..60_u64 {
        let after = Duration::from_micros(300 * (i % 12));
        let waited = tokio::time::timeout(after, b.acquire(&queued, &opts())).await;
        assert!(waited.is_err(), "a held lock was acquired");
        // A free name: a cancelled `try_acquire` whose put landed would hold it.
        if let Ok(Ok(Some(guard))) =
            tokio::time::timeout(after, b.try_acquire(&free, &opts())).await
        {
            free_taken += 1;
            guard.release().await.unwrap();
        }
    }
    held.release().await.unwrap();
    // Well within the lease's 3 s: what remains after this is a leaked key, not a slow delete.
    let deadline = Instant::now() + Duration::from_secs(1);
    let left = loop {
        let left = (etcd.entries(&queued).await, etcd.entries(&free).await);
        if (left.0.is_empty() && left.1.is_empty()) || Instant::now() >= deadline {
            break left;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        left.0.is_empty() && left.1.is_empty(),
        "keys left after the cleanups: {left:?} ({free_taken} of the free name's tries answered)"
    );
}

#[tokio::test]
async fn bad_urls_are_typed_errors() {
    for url in [
        "etcd://",
        "etcd://host:notaport",
        "etcd://host:1?opt=1",
        "etcd://a:1,,b:2",
        "http://127.0.0.1:2379",
        "etcd://user@host:1",
    ] {
        let result = distlock_etcd::connect(url, ClientConfig::default()).await;
        assert!(
            matches!(result, Err(Error::InvalidConfig(_))),
            "{url}: {result:?}"
        );
    }
    let bad_timeout = ClientConfig::default().with_operation_timeout(Duration::ZERO);
    let result = distlock_etcd::connect("etcd://127.0.0.1:12379", bad_timeout).await;
    assert!(matches!(result, Err(Error::InvalidConfig(_))), "{result:?}");
}

#[tokio::test]
async fn an_unreachable_endpoint_is_unavailable_within_the_timeout() {
    // Port 1 on loopback: connection refused at once.
    let timeout = Duration::from_millis(500);
    let config = ClientConfig::default().with_operation_timeout(timeout);
    let started = Instant::now();
    let result = match distlock_etcd::connect("etcd://127.0.0.1:1", config).await {
        Ok(client) => client.try_acquire("x", &opts()).await.map(|_| ()),
        Err(err) => Err(err),
    };
    let err = result.expect_err("nothing listens there");
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    assert!(err.is_retryable());
    // Connecting and the operation each have the timeout.
    assert!(
        started.elapsed() < timeout * 2 + OP_TIMEOUT,
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_client_reuses_its_queue_keys() {
    let _serial = SERVERS.read().await;
    let Some(etcd) = single().await else { return };
    let client = etcd.client().await.unwrap();
    let name = unique("reuse");
    // etcd keeps deleted keys in its index until a compaction and every queue read walks
    // them: acquisitions one after the other must use one key, not one key each.
    let mut keys = std::collections::BTreeSet::new();
    let mut last = None;
    for _ in 0..20 {
        let guard = client.acquire(&name, &opts()).await.unwrap();
        let entries = etcd.entries(&name).await;
        assert_eq!(entries.len(), 1);
        keys.insert(entries[0].0.clone());
        assert!(last < Some(guard.token()), "tokens must still increase");
        last = Some(guard.token());
        guard.release().await.unwrap();
    }
    assert_eq!(keys.len(), 1, "{keys:?}");

    // Concurrent attempts of one client on one name use different keys.
    let client = Arc::new(client);
    let held = client.acquire(&name, &opts()).await.unwrap();
    let waiter = {
        let (client, name) = (client.clone(), name.clone());
        tokio::spawn(async move {
            let guard = client.acquire(&name, &opts()).await.unwrap();
            guard.release().await.unwrap();
        })
    };
    for _ in 0..200 {
        if etcd.entries(&name).await.len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let entries = etcd.entries(&name).await;
    assert_eq!(entries.len(), 2, "the waiter queued under a key of its own");
    assert_ne!(entries[0].0, entries[1].0);
    held.release().await.unwrap();
    waiter.await.unwrap();
    assert!(etcd.entries(&name).await.is_empty());
}

/// etcd-client connects lazily; `connect` must still fail at once, with a typed error, on an
/// endpoint nothing listens on (before, it succeeded and a waiter retried silently forever).
#[tokio::test]
async fn connect_verifies_the_endpoint() {
    let started = Instant::now();
    let config = ClientConfig::default().with_operation_timeout(Duration::from_secs(2));
    let err = distlock_etcd::connect("etcd://127.0.0.1:1", config)
        .await
        .map(|_| ())
        .unwrap_err();
    assert!(matches!(err, Error::Unavailable { .. }), "{err}");
    assert!(err.to_string().contains("127.0.0.1:1"), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
}

/// Election observers are woken by a watch on the name, not by their interval: with an
/// interval of an hour, each new leader and the resignation are still seen at once.
#[tokio::test]
async fn election_observers_are_woken_by_the_watch() {
    use futures::StreamExt;
    let _serial = SERVERS.read().await;
    let Some(etcd) = single().await else { return };
    let (observer, candidate) = (etcd.client().await.unwrap(), etcd.client().await.unwrap());
    let name = unique("observed");
    let mut changes = observer.observe(&name, Duration::from_secs(3600));
    async fn next(changes: &mut Changes) -> Option<distlock_core::Leader> {
        let seen = tokio::time::timeout(SLACK, changes.next())
            .await
            .expect("no change seen within the slack: not woken by a watch");
        seen.expect("the observation ended")
            .expect("an observation failed")
    }
    type Changes =
        futures::stream::BoxStream<'static, distlock_core::Result<Option<distlock_core::Leader>>>;
    assert_eq!(next(&mut changes).await, None);
    let mut last = None;
    for value in ["a", "b"] {
        let term = candidate.campaign(&name, value, &opts()).await.unwrap();
        let leader = next(&mut changes).await.expect("a leader");
        assert_eq!(leader.value.as_deref(), Some(value));
        assert_eq!(leader.term, Some(term.token()));
        assert!(last < leader.term, "{last:?} then {:?}", leader.term);
        last = leader.term;
        term.release().await.unwrap();
        assert_eq!(
            next(&mut changes).await,
            None,
            "the resignation was not seen"
        );
    }
}

/// The services.sh name of the cluster's current leader (members are named like services).
async fn leader(etcd: &Etcd) -> Result<String, String> {
    let mut admin = etcd.admin.clone();
    for _ in 0..100 {
        if let (Ok(status), Ok(members)) = (admin.status().await, admin.member_list().await) {
            let id = status.leader();
            if let Some(member) = members.members().iter().find(|m| m.id() == id && id != 0) {
                return Ok(member.name().to_owned());
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err("the cluster has no leader".into())
}

/// A client with the default options (operation timeout 5 s), as an application has.
async fn default_client(etcd: &Etcd) -> TestClient {
    let client = distlock_etcd::connect_with(etcd.config.clone(), ClientConfig::default())
        .await
        .expect("connect");
    TestClient {
        lock: client.into_dyn(),
        tag: "etcd".into(),
    }
}

/// Kill -9 the leader while a client holds a lock and another waits, then release: after 3 s
/// (a new leader serves meanwhile; the holder's lease keeps being renewed) and at once (the
/// handoff crosses the election). No second holder, no loss, growing tokens, every time.
/// Default client options (operation timeout 5 s) and a 6 s ttl: an election took 1.3-2.8 s
/// here (randomized election timeout 1-2 s, slower on a loaded machine), and a lock must
/// outlast it plus one renewal interval (ttl / 3) to be kept.
#[tokio::test]
async fn killing_the_leader_keeps_locks_and_handoffs_exact() {
    let _serial = SERVERS.write().await;
    let Some(etcd) = cluster().await else { return };
    let (holder, waiter) = (default_client(&etcd).await, default_client(&etcd).await);
    for hold in [Duration::from_secs(3), Duration::ZERO] {
        let mut tally = Tally::default();
        for i in 0..failover::rounds(2) {
            let current = leader(&etcd).await.expect("leader");
            let plan = Plan {
                name: unique(&format!("leader-kill-{i}")),
                opts: AcquireOptions::default()
                    .with_ttl(Duration::from_secs(6))
                    .with_wait(Duration::from_secs(300)),
                hold_after_kill: hold,
                handoff_bound: Duration::from_secs(15),
            };
            let round = failover::handoff(
                &holder,
                &waiter,
                &plan,
                || async move { service("kill-one", &current).await.map(|()| current) },
                |name| {
                    let etcd = &etcd;
                    async move {
                        let started = service("start-one", &name).await;
                        serving(etcd).await;
                        started
                    }
                },
            )
            .await;
            round.assert_exact(&format!("round {i}"), true);
            tally.add(&round);
        }
        eprintln!(
            "etcd_cluster, leader killed, released {hold:?} later: {}",
            tally.summary()
        );
    }
}

/// Two of three members killed (no quorum) while a client holds a lock: the holder is told of
/// the loss by its local deadline (within its ttl), nobody acquires meanwhile, and afterwards
/// another client gets the lock with a greater token (see [`failover::quorum_loss`]).
#[tokio::test]
async fn losing_the_quorum_is_reported_to_the_holder() {
    let _serial = SERVERS.write().await;
    let Some(etcd) = cluster().await else { return };
    let (holder, other) = (default_client(&etcd).await, default_client(&etcd).await);
    let (reason, after) = failover::quorum_loss(
        &holder,
        &other,
        &unique("quorum"),
        TTL,
        &["etcd-cluster-2", "etcd-cluster-3"],
    )
    .await;
    serving(&etcd).await;
    eprintln!("etcd_cluster, quorum lost: the holder was told {reason:?} after {after:?}");
}
