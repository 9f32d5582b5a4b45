//! ZooKeeper-specific behaviour: session expiry, restarts, escaping, bad input.

mod common;

use std::time::{Duration, Instant};

use common::{ZkHarness, service};
use distlock_core::{
    AcquireOptions, Backoff, ClientConfig, DistributedLock, Error, LockGuard, LockKind, LossReason,
};

/// Tests of this binary that take the server away or expire sessions run one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn harness() -> Option<ZkHarness> {
    let server = conformance_tests::server_var("zk", "DISTLOCK_TEST_ZK_CONNECT")?;
    Some(ZkHarness::new(&server).await)
}

fn opts() -> AcquireOptions {
    AcquireOptions::default()
        .with_ttl(Duration::from_secs(2))
        .with_wait(Duration::from_secs(20))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_session_is_reported_and_a_new_session_serves() {
    let _serial = SERIAL.lock().await;
    let Some(h) = harness().await else { return };
    // The holder reaches the server through a proxy, with a short session, so that a
    // partition longer than the session timeout makes the server expire the session.
    let session = Duration::from_millis(1500);
    let (client, tag) = h.proxied_with_session(session).await.expect("connect");
    let other = h.backend().await.expect("connect");
    let short = AcquireOptions::default()
        .with_ttl(Duration::from_secs(1))
        .with_wait(Duration::from_secs(20));
    let guard = client.acquire("expiry", &short).await.expect("acquire");
    // Nobody contends for this one: its node goes only when the server expires the session.
    let marker = client
        .acquire("expiry-marker", &short)
        .await
        .expect("acquire the marker");
    let lost = guard.lost();
    let old_session = client.backend_ref().session_info().clone();

    h.partition(&tag, true);
    let reason = tokio::time::timeout(Duration::from_secs(10), lost)
        .await
        .expect("lost() did not fire while partitioned past the session timeout");
    // The expiry itself is only reported on reconnection; during the partition the local
    // deadline passes first, which the core reports as a lost connection.
    assert!(
        matches!(
            reason,
            LossReason::SessionExpired | LossReason::ConnectionLost
        ),
        "unexpected loss reason {reason:?}"
    );
    assert!(guard.is_lost());
    // Another client gets the lock: it removes the holder whose lease ran out, or the server
    // expires the session with its ephemeral node, whichever comes first.
    let taken = other
        .acquire("expiry", &opts())
        .await
        .expect("the expired session's lock was never freed");
    // Heal only once the server has expired the session (else the client resumes it).
    tokio::time::timeout(Duration::from_secs(20), h.drained("expiry-marker"))
        .await
        .expect("the server never expired the partitioned session");
    h.partition(&tag, false);
    assert!(
        guard.release().await.is_err(),
        "released a lock of an expired session"
    );
    assert!(
        marker.release().await.is_err(),
        "released a lock of an expired session"
    );
    taken.release().await.expect("release");

    // The same client serves new acquisitions on a new session.
    let again = client
        .acquire("expiry", &short)
        .await
        .expect("acquire on a new session");
    assert_ne!(client.backend_ref().session_info().id(), old_session.id());
    again.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_does_not_wait_for_the_client_librarys_reconnect_backoff() {
    let _serial = SERIAL.lock().await;
    let Some(h) = harness().await else { return };
    // The client library retries a lost connection after 0.1, 0.2, 0.4 ... 6.4, 12.8 s: cut
    // off for 7.5 s (the session, 30 s, lives on), its next try is about 12.7 s after the
    // cut. Once the path is back, an acquisition must not wait for that try.
    let (client, tag) = h.proxied().await.expect("connect");
    let before = client.backend_ref().session_info().id();
    h.partition(&tag, true);
    tokio::time::sleep(Duration::from_millis(7500)).await;
    h.partition(&tag, false);
    let healed = Instant::now();
    let options = AcquireOptions::default()
        .with_ttl(Duration::from_secs(2))
        .with_wait(Duration::from_secs(4));
    let guard = client
        .acquire("backoff", &options)
        .await
        .expect("no acquisition within 4 s of the path coming back");
    assert!(healed.elapsed() < Duration::from_secs(4));
    assert_ne!(
        client.backend_ref().session_info().id(),
        before,
        "acquired on the old session: the library reconnected early, nothing was tested"
    );
    guard.release().await.expect("release");
}
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_keep_increasing_across_a_server_restart() {
    let _serial = SERIAL.lock().await;
    let Some(h) = harness().await else { return };
    let client = h.backend().await.expect("connect");
    let guard = client.acquire("restart", &opts()).await.expect("acquire");
    let before = guard.token();
    guard.release().await.expect("release");

    service("stop-one").await.expect("stop zookeeper");
    let restarted = service("start-one").await;
    restarted.expect("start zookeeper");

    let guard = client
        .acquire("restart", &opts())
        .await
        .expect("acquire after the restart");
    assert!(
        guard.token() > before,
        "token {} after the restart is not above {before}",
        guard.token()
    );
    guard.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_hosts_fail_typed_within_the_timeout() {
    let timeout = Duration::from_millis(800);
    let config = ClientConfig::default().with_operation_timeout(timeout);
    let started = Instant::now();
    // Nothing listens on ports 1 and 2 of loopback.
    let result =
        distlock_zookeeper::connect("zk://127.0.0.1:1,127.0.0.1:2/x", config.clone()).await;
    assert!(
        matches!(result, Err(Error::Unavailable { .. })),
        "expected Unavailable, got {result:?}"
    );
    assert!(
        started.elapsed() < timeout + Duration::from_millis(500),
        "took {:?}",
        started.elapsed()
    );

    for bad in [
        "zk://",
        "zk://h:notaport",
        "etcd://h:1",
        "zk://h:1?bogus=1",
        "zk://h:1//x",
    ] {
        let result = distlock_zookeeper::connect(bad, config.clone()).await;
        assert!(
            matches!(result, Err(Error::InvalidConfig(_))),
            "{bad:?}: expected InvalidConfig, got {result:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_are_escaped_into_single_path_segments() {
    let _serial = SERIAL.lock().await;
    let Some(h) = harness().await else { return };
    let client = h.backend().await.expect("connect");
    for name in [
        "a/b/../c",
        ".",
        "..",
        "%2F",
        "zookeeper",
        "x\u{1}y",
        "🔒 {tag}",
    ] {
        let guard = client
            .try_acquire(name, &opts())
            .await
            .unwrap_or_else(|e| panic!("{name:?} rejected: {e}"))
            .unwrap_or_else(|| panic!("{name:?} held"));
        let path = h.lock_path(name);
        let (base, segment) = path.rsplit_once('/').expect("a path");
        assert_eq!(base, format!("{}/distlock", h.chroot));
        assert!(
            !segment.is_empty() && !segment.contains(['.', '/']),
            "{segment:?}"
        );
        assert_eq!(
            h.queue(name).await.len(),
            1,
            "{name:?} has no node at {path}"
        );
        guard.release().await.expect("release");
        assert!(
            h.queue(name).await.is_empty(),
            "{name:?}: release left a node"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_queue_in_order_and_leave_no_node_behind() {
    let _serial = SERIAL.lock().await;
    let Some(h) = harness().await else { return };
    let holder = h.backend().await.expect("connect");
    let guard = holder.acquire("queue", &opts()).await.expect("acquire");
    let mut waiters = Vec::new();
    for _ in 0..3 {
        let client = h.backend().await.expect("connect");
        waiters.push(tokio::spawn(async move {
            let guard = client.acquire("queue", &opts()).await.expect("acquire");
            let token = guard.token();
            guard.release().await.expect("release");
            token
        }));
        // Joined the queue: one more node.
        let want = waiters.len() + 1;
        let deadline = Instant::now() + Duration::from_secs(5);
        while h.queue("queue").await.len() < want {
            assert!(Instant::now() < deadline, "waiter did not join the queue");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let first = guard.token();
    guard.release().await.expect("release");
    let mut last = first;
    for waiter in waiters {
        let token = waiter.await.expect("waiter");
        assert!(token > last, "tokens out of queue order");
        last = token;
    }
    assert!(h.queue("queue").await.is_empty());

    // A waiter that gives up removes its node.
    let guard = holder.acquire("queue", &opts()).await.expect("acquire");
    let quitter = h.backend().await.expect("connect");
    let r = quitter
        .acquire("queue", &opts().with_wait(Duration::from_millis(300)))
        .await;
    assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
    assert_eq!(
        h.queue("queue").await.len(),
        1,
        "the timed-out waiter left its node"
    );
    guard.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_predecessor_gives_up_is_marked_waiting_again() {
    let _serial = SERIAL.lock().await;
    let Some(h) = harness().await else { return };
    let name = "give-up";
    let holder = h.backend().await.expect("connect");
    let guard = holder.acquire(name, &opts()).await.expect("acquire");
    let quitter = h.backend().await.expect("connect");
    let quitting = tokio::spawn(async move {
        quitter
            .acquire(name, &opts().with_wait(Duration::from_millis(800)))
            .await
            .map(|_| ())
    });
    queue_of(&h, name, 2, "the quitter").await;
    let waiter = h.backend().await.expect("connect");
    let waiting = tokio::spawn(async move {
        // A long ttl: its waiting mark is refreshed every 6.7 s only, so the mark checked
        // below is the re-mark after the false handoff, not a refresh.
        let long = opts().with_ttl(LONG_TTL);
        let guard = waiter.acquire(name, &long).await.expect("acquire");
        let token = guard.token();
        guard.release().await.expect("release");
        token
    });
    let queue = queue_of(&h, name, 3, "the waiter").await;
    let r = quitting.await.expect("quitter");
    assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");

    // The quitter's node went away, so the waiter took its predecessor's deletion for a
    // handoff and marked its node held. It is not the head: its next request must mark it
    // waiting again, or a contender could later expire it by that stale mark. Refreshes of the
    // waiting mark (every third of the ttl) would make a version count no witness, so: wait for
    // a waiting mark written after the quitter's node was deleted (the lock node's pzxid),
    // sooner than a refresh, and check that it stays (a stale held mark lives for one round
    // trip at most).
    queue_of(&h, name, 2, "the queue without the quitter").await;
    let (_, parent) = h
        .admin
        .get_data(&h.lock_path(name))
        .await
        .expect("the lock node");
    let path = format!("{}/{}", h.lock_path(name), queue[2]);
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let (data, stat) = h.admin.get_data(&path).await.expect("the waiter's node");
        if stat.mzxid > parent.pzxid && data == LONG_WAITING_MARK {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the waiter's node was not marked waiting after the quitter left: version {} ({:?}), \
             written at zxid {}, the quitter left at {}",
            stat.version,
            String::from_utf8_lossy(&data),
            stat.mzxid,
            parent.pzxid
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (data, _) = h.admin.get_data(&path).await.expect("the waiter's node");
    assert_eq!(
        data, LONG_WAITING_MARK,
        "the waiter's node did not stay marked waiting"
    );
    assert_eq!(h.queue(name).await.len(), 2);
    assert!(!waiting.is_finished(), "the waiter got a held lock");

    let first = guard.token();
    guard.release().await.expect("release");
    let token = waiting.await.expect("waiter");
    assert!(token > first);
    assert!(h.queue(name).await.is_empty());
}

/// A waiter whose session stays disconnected while the server answers moves to a new
/// session and joins the queue again there (see `ZkBackend::session`). It removes the node it
/// left in the old session (which lives on with that session, ahead of the new node) and
/// never takes that node for its own, though the two share its owner's prefix: holding
/// through it, the lock would end with the old session while the new one holds on, and with
/// the new node's token (CI, 2026-11-30: two leaders at once in the fault check, after a
/// server restart moved a waiter to a new session).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_moved_to_a_new_session_leaves_its_old_node_behind() {
    let _serial = SERIAL.lock().await;
    let Some(h) = harness().await else { return };
    let name = "moved";
    let holder = h.backend().await.expect("connect");
    let guard = holder.acquire(name, &opts()).await.expect("acquire");
    let (waiter, tag) = h.proxied().await.expect("connect");
    let before = waiter.backend_ref().session_info().id();
    let waiting = tokio::spawn(async move {
        let options = opts().with_wait(Duration::from_secs(60));
        let guard = waiter.acquire(name, &options).await.expect("acquire");
        (waiter, guard)
    });
    let old = queue_of(&h, name, 2, "the waiter").await[1].clone();
    // Cut off for 7.5 s: the session (30 s) lives on, and the library's next reconnection
    // try comes about 12.7 s after the cut, so the waiter moves to a new session.
    h.partition(&tag, true);
    tokio::time::sleep(Duration::from_millis(7500)).await;
    h.partition(&tag, false);
    let deadline = Instant::now() + Duration::from_secs(10);
    let moved = loop {
        let last = h.queue(name).await;
        if last.len() == 2 && last[1] != old {
            break last[1].clone();
        }
        assert!(
            Instant::now() < deadline,
            "the waiter did not move to a new node alone: {last:?} (old node {old})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };

    guard.release().await.expect("release");
    let (waiter, handed) = waiting.await.expect("waiter");
    assert_ne!(
        waiter.backend_ref().session_info().id(),
        before,
        "the waiter kept its session: nothing was tested"
    );
    assert_eq!(h.queue(name).await, std::slice::from_ref(&moved));
    let path = format!("{}/{moved}", h.lock_path(name));
    let (_, czxid) = data_once(&h, &path, |d| d.starts_with(b"H")).await;
    assert_eq!(
        handed.token().get(),
        u64::try_from(czxid).expect("positive zxid")
    );
    handed.release().await.expect("release");
    assert!(h.queue(name).await.is_empty());
}

/// The queue of `name` once it has `len` nodes (`who` joined it).
async fn queue_of(h: &ZkHarness, name: &str, len: usize, who: &str) -> Vec<String> {
    tokio::time::timeout(Duration::from_secs(5), h.queue_when(name, len))
        .await
        .unwrap_or_else(|_| panic!("{who} did not join the queue"))
}

/// A holder's node data: `H` and the ttl of [`opts`] in milliseconds.
fn held_mark() -> Vec<u8> {
    format!("H{}", opts().ttl.as_millis()).into_bytes()
}

/// The ttl of the waiter in `a_waiter_whose_predecessor_gives_up_is_marked_waiting_again`, and
/// the data of its node while it waits.
const LONG_TTL: Duration = Duration::from_secs(20);
const LONG_WAITING_MARK: &[u8] = b"W20000";

/// A waiter's node data: `W` and the ttl of [`opts`] in milliseconds (its lease).
fn waiting_mark() -> Vec<u8> {
    format!("W{}", opts().ttl.as_millis()).into_bytes()
}

/// The data of `path` once `accept` takes it, waiting on data watches (no polling).
async fn data_once(
    h: &ZkHarness,
    path: &str,
    accept: impl Fn(&[u8]) -> bool + Send + Sync,
) -> (Vec<u8>, i64) {
    let wait = async {
        loop {
            let (data, stat, watcher) = h
                .admin
                .get_and_watch_data(path)
                .await
                .expect("reading the node");
            if accept(&data) {
                return (data, stat.czxid);
            }
            watcher.changed().await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), wait)
        .await
        .unwrap_or_else(|_| panic!("{path} never reached the expected data"))
}

/// A waiter handed the lock by a release holds it as soon as a listing shows it first (its
/// node said "waiting", which no contender expires), with its node's creation zxid as the
/// token; the held mark sent with that listing lands right after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handed_lock_carries_the_nodes_token_and_is_marked_held() {
    let _serial = SERIAL.lock().await;
    let Some(h) = harness().await else { return };
    let name = "handed";
    let holder = h.backend().await.expect("connect");
    let guard = holder.acquire(name, &opts()).await.expect("acquire");
    let waiter = h.backend().await.expect("connect");
    let waiting = tokio::spawn(async move {
        let guard = waiter.acquire(name, &opts()).await.expect("acquire");
        (waiter, guard)
    });
    let queue = queue_of(&h, name, 2, "the waiter").await;
    let path = format!("{}/{}", h.lock_path(name), queue[1]);
    data_once(&h, &path, |d| d == waiting_mark()).await;

    let first = guard.token();
    guard.release().await.expect("release");
    let (_waiter, handed) = waiting.await.expect("waiter");
    let (data, czxid) = data_once(&h, &path, |d| d.starts_with(b"H")).await;
    assert_eq!(data, held_mark());
    assert_eq!(
        handed.token().get(),
        u64::try_from(czxid).expect("positive zxid")
    );
    assert!(handed.token() > first);
    handed.release().await.expect("release");
    assert!(h.queue(name).await.is_empty());
}

/// An uncontended acquisition holds at once (its node is the lock node's only child) with its
/// node's creation zxid as the token; with another node in the queue, the same first poll
/// finds that it is not alone and does not take the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_alone_node_holds_with_its_creation_zxid_and_a_second_one_waits() {
    let _serial = SERIAL.lock().await;
    let Some(h) = harness().await else { return };
    let name = "alone";
    let locks = h.backend().await.expect("connect");
    let mut previous = None;
    for _ in 0..3 {
        let guard = locks
            .try_acquire(name, &opts())
            .await
            .unwrap()
            .expect("free");
        let queue = h.queue(name).await;
        assert_eq!(queue.len(), 1, "{queue:?}");
        let path = format!("{}/{}", h.lock_path(name), queue[0]);
        let (data, czxid) = data_once(&h, &path, |_| true).await;
        assert_eq!(data, held_mark());
        assert_eq!(guard.token().get(), u64::try_from(czxid).expect("zxid"));
        assert!(previous.is_none_or(|p| guard.token() > p));
        previous = Some(guard.token());

        let other = h.backend().await.expect("connect");
        assert!(other.try_acquire(name, &opts()).await.unwrap().is_none());
        assert_eq!(
            h.queue(name).await.len(),
            1,
            "the refused try left its node"
        );
        guard.release().await.expect("release");
    }
    assert!(h.queue(name).await.is_empty());
}

/// Waiters refresh their nodes' leases while they wait, so a queue behind a long hold keeps
/// every waiter in its place: nobody's lease runs out, nobody is removed, FIFO holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_waiters_keep_their_places_for_many_ttls() {
    let _serial = SERIAL.lock().await;
    let Some(h) = harness().await else { return };
    let name = "long-queue";
    let ttl = Duration::from_millis(600);
    let short = opts().with_ttl(ttl);
    let holder = h.backend().await.expect("connect");
    let guard = holder.acquire(name, &short).await.expect("acquire");
    let mut waiters = Vec::new();
    for who in 0..2 {
        let client = h.backend().await.expect("connect");
        let short = short.clone();
        waiters.push(tokio::spawn(async move {
            let guard = client.acquire(name, &short).await.expect("acquire");
            let token = guard.token();
            guard.release().await.expect("release");
            token
        }));
        queue_of(&h, name, who + 2, "a waiter").await;
    }
    let before = h.queue(name).await;
    tokio::time::sleep(ttl * 5).await;
    assert_eq!(h.queue(name).await, before, "a live waiter lost its place");
    assert!(!guard.is_lost(), "the holder lost its lock");
    let first = guard.token();
    guard.release().await.expect("release");
    let mut tokens = vec![first];
    for waiter in waiters {
        tokens.push(waiter.await.expect("waiter"));
    }
    assert!(tokens.is_sorted(), "not FIFO: {tokens:?}");
}

/// A waiter node that stops being refreshed (its process died, its session lives on) is
/// removed by the waiter behind it once its lease ran out on the server's clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_waiters_node_is_removed_after_its_lease() {
    let _serial = SERIAL.lock().await;
    let Some(h) = harness().await else { return };
    let name = "dead-waiter";
    let holder = h.backend().await.expect("connect");
    let guard = holder.acquire(name, &opts()).await.expect("acquire");
    // A waiter's node as a process killed while waiting leaves it: marked waiting with a
    // lease of 500 ms, in a session that stays alive (the harness's own).
    let created = Instant::now();
    h.stray_node(name, "dead", b"W500").await;
    let waiter = h.backend().await.expect("connect");
    let waiting = tokio::spawn(async move {
        let guard = waiter.acquire(name, &opts()).await.expect("acquire");
        let token = guard.token();
        guard.release().await.expect("release");
        (Instant::now(), token)
    });
    queue_of(&h, name, 3, "the waiter").await;
    // Removed once its lease ran out on the server's clock: not before, and soon after.
    queue_of(&h, name, 2, "the dead waiter's removal").await;
    let removed = created.elapsed();
    assert!(
        removed >= Duration::from_millis(500),
        "removed after {removed:?}, before its lease ran out"
    );
    assert!(
        removed < Duration::from_millis(1500),
        "removed only after {removed:?}"
    );
    assert!(!waiting.is_finished(), "the waiter took a held lock");
    let first = guard.token();
    let released = Instant::now();
    guard.release().await.expect("release");
    let (acquired, token) = waiting.await.expect("waiter");
    assert!(token > first);
    let took = acquired - released;
    assert!(took < Duration::from_secs(1), "handoff took {took:?}");
    assert!(h.queue(name).await.is_empty());
}

/// A node of another kind behind the head (a writer whose look at the queue comes late: a
/// poll cut short keeps its node) refuses the permit behind it: once the head left, that
/// writer found itself the head and held beside the permit, which had held without counting
/// it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_of_another_kind_ahead_refuses_a_permit() {
    let _serial = SERIAL.lock().await;
    let Some(h) = harness().await else { return };
    let name = "kind-behind-head";
    let permits = opts().with_kind(LockKind::Permit { permits: 2 });
    let first = h.backend().await.expect("connect");
    let guard = first.acquire(name, &permits).await.expect("acquire");
    // The writer's node as its join left it, its listing not yet answered: held by nobody.
    let stranded = h.stray_node(name, "stranded", b"W30000").await;
    let second = h.backend().await.expect("connect");
    match second.try_acquire(name, &permits).await {
        Err(Error::Mismatch { .. }) => {}
        Ok(Some(_)) => panic!("a permit held behind a writer's node"),
        other => panic!("{other:?}"),
    }
    guard.release().await.expect("release");
    h.admin
        .delete(&stranded, None)
        .await
        .expect("remove the writer's node");
}

/// A waiter handed the lock holds before its "held" mark commits (the handoff shortcut of the
/// mutex and of readers): while its node still says "waiting", inspection counts it as the
/// holder and a forced release removes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_whose_node_still_says_waiting_is_seen_and_can_be_freed() {
    let Some(h) = harness().await else { return };
    let client = h.backend().await.expect("connect");
    // No renewal: nothing writes the "held" mark back during the test.
    let opts = opts().with_renewal(distlock_core::Renewal::disabled());
    for (name, opts) in [
        ("mark-waiting", opts.clone()),
        ("mark-waiting-read", opts.shared()),
    ] {
        let guard = client.acquire(name, &opts).await.expect("acquire");
        let queue = h.queue(name).await;
        assert_eq!(queue.len(), 1, "{queue:?}");
        let node = format!("{}/{}", h.lock_path(name), queue[0]);
        h.admin
            .set_data(&node, &waiting_mark(), None)
            .await
            .expect("mark the holder's node waiting");
        let info = client.inspect(name).await.expect("inspect");
        let info = info.expect("a holder whose node says waiting was not seen");
        assert_eq!(info.token, Some(guard.token()));
        assert!(client.force_release(name).await.expect("force release"));
        assert!(h.queue(name).await.is_empty(), "{name}: the node stayed");
        assert!(
            guard.release().await.is_err(),
            "{name}: released after removal"
        );
    }
}

/// A TCP proxy for one client connection that records the operation code of every request
/// the client sends (the `type` of each request header after the connect request), pings
/// left out, with the instant each arrived.
struct Recorder {
    addr: String,
    ops: std::sync::Arc<std::sync::Mutex<Vec<(Instant, i32)>>>,
}

impl Recorder {
    async fn start(target: String) -> Self {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("address").to_string();
        let ops: std::sync::Arc<std::sync::Mutex<Vec<(Instant, i32)>>> = std::sync::Arc::default();
        let seen = ops.clone();
        tokio::spawn(async move {
            let Ok((inbound, _)) = listener.accept().await else {
                return;
            };
            let outbound = tokio::net::TcpStream::connect(&target)
                .await
                .expect("connect to the server");
            let (mut from_client, mut to_client) = inbound.into_split();
            let (mut from_server, mut to_server) = outbound.into_split();
            tokio::spawn(async move {
                let _ = tokio::io::copy(&mut from_server, &mut to_client).await;
            });
            // Frames: a 4-byte length, then (after the connect request) xid and type.
            let (mut pending, mut frames) = (Vec::new(), 0_usize);
            let mut chunk = [0_u8; 16 * 1024];
            while let Ok(n) = from_client.read(&mut chunk).await {
                if n == 0 || to_server.write_all(&chunk[..n]).await.is_err() {
                    break;
                }
                pending.extend_from_slice(&chunk[..n]);
                let at = Instant::now();
                while pending.len() >= 4 {
                    let len = u32::from_be_bytes(pending[..4].try_into().expect("4 bytes"));
                    let len = usize::try_from(len).expect("length");
                    if pending.len() < 4 + len {
                        break;
                    }
                    if frames > 0 && len >= 8 {
                        let op = i32::from_be_bytes(pending[8..12].try_into().expect("4 bytes"));
                        if op != 11 {
                            seen.lock().expect("ops").push((at, op));
                        }
                    }
                    frames += 1;
                    pending.drain(..4 + len);
                }
            }
        });
        Self { addr, ops }
    }

    fn ops(&self) -> Vec<(Instant, i32)> {
        self.ops.lock().expect("ops").clone()
    }
}

/// A waiting acquisition of `name` with `options` by a client connected through a
/// [`Recorder`] of its requests: the recorder, and the task, which returns the client (kept
/// alive while its guard lives) with the guard.
async fn wait_through_recorder(
    h: &ZkHarness,
    name: &str,
    options: AcquireOptions,
) -> (
    Recorder,
    tokio::task::JoinHandle<Result<(ZkClient, LockGuard), Error>>,
) {
    let recorder = Recorder::start(h.server.clone()).await;
    let waiter =
        distlock_zookeeper::connect_with(h.config(&recorder.addr), common::client_config())
            .await
            .expect("connect through the recorder");
    let name = name.to_owned();
    let wait =
        tokio::spawn(async move { waiter.acquire(&name, &options).await.map(|g| (waiter, g)) });
    (recorder, wait)
}

/// A permit waiter counts the deletions of the nodes ahead of it: behind two holders of a
/// semaphore of 2 and one more waiter, it holds once two of those three are gone, with no
/// request but its held mark, and the waiter ahead becoming a holder (its held mark, a change
/// of a node it watches) costs it one read of that node to watch it again, not a look at the
/// queue. Before, it watched its predecessor, which woke it to list the queue and become the
/// first waiter (a listing with a watch and a read of each holder), and the next release woke
/// it to list the queue again.
/// ZooKeeper's operation codes: 4 getData, 5 setData, 2 delete, 18 removeWatches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_waiter_counts_the_releases_ahead() {
    let Some(h) = harness().await else { return };
    let (get_data, set_data, delete, remove_watches) = (4, 5, 2, 18);
    let options = AcquireOptions::default()
        .with_kind(LockKind::Permit { permits: 2 })
        .with_ttl(Duration::from_secs(30))
        .with_wait(Duration::from_secs(20))
        // No poll but on a wake-up (see `a_turn_needs_no_look_at_the_queue`).
        .with_backoff(Backoff::new(
            Duration::from_millis(2),
            Duration::from_secs(60),
        ));
    let holder = h.backend().await.expect("connect");
    let name = common::unique("permits-counted");
    let first = holder.acquire(&name, &options).await.expect("acquire");
    let second = holder.acquire(&name, &options).await.expect("acquire");
    let ahead = {
        let (holder, name, options) = (holder.clone(), name.clone(), options.clone());
        tokio::spawn(async move { holder.acquire(&name, &options).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!ahead.is_finished(), "a third permit of two was granted");
    let (recorder, wait) = wait_through_recorder(&h, &name, options.clone()).await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(!wait.is_finished(), "a fourth permit of two was granted");
    let before = recorder.ops().len();
    // The newest holder first; the waiter ahead takes its permit.
    second.release().await.expect("release");
    let ahead = ahead
        .await
        .expect("join")
        .expect("the waiter ahead acquires");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!wait.is_finished(), "a third permit of two was granted");
    first.release().await.expect("release");
    let (_waiter, taken) = wait.await.expect("join").expect("the waiter acquires");
    // The held mark is sent, not awaited: the release's answer, on the same connection,
    // comes after it.
    taken.release().await.expect("release");
    ahead.release().await.expect("release");
    // Its watch on the node still ahead of it, no longer needed, is removed before the mark.
    let after: Vec<i32> = recorder.ops()[before..].iter().map(|&(_, op)| op).collect();
    assert_eq!(
        after,
        vec![get_data, remove_watches, set_data, delete],
        "requests from the first release to the waiter's own release"
    );
}

/// A client of this backend.
type ZkClient = distlock_core::LockClient<distlock_zookeeper::ZkBackend>;

/// A waiter reads the node ahead of it before it writes its own node, in the same round trip:
/// the write's `mtime`, its reading of the server's clock, is then stamped after every write
/// the read saw, so a step back of the server's clock can only make the holder look younger.
/// Sent the other way round (as before), a holder's renewal stamped after a step back and read
/// after the waiter's write looked older by the step, and the waiter removed the node of a
/// live holder (CI's clock fault, once). The requests' order on the wire is what this checks,
/// on each of the three ways of waiting: a writer next in line (the head's read), a reader
/// behind a writer (its predecessor's watched read), and the first permit waiter (a read of
/// every holder). ZooKeeper's operation codes: 4 getData, 5 setData.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_reads_the_node_ahead_before_it_writes_its_own() {
    let Some(h) = harness().await else { return };
    let (get_data, set_data) = (4, 5);
    let one_permit = LockKind::Permit { permits: 1 };
    let cases = [
        ("next in line", LockKind::Exclusive, LockKind::Exclusive),
        ("behind a writer", LockKind::Exclusive, LockKind::Shared),
        ("first permit waiter", one_permit, one_permit),
    ];
    for (case, held, waits) in cases {
        let options = |kind| {
            AcquireOptions::default()
                .with_kind(kind)
                .with_ttl(Duration::from_secs(3))
                .with_wait(Duration::from_secs(20))
        };
        let holder = h.backend().await.expect("connect");
        let name = common::unique("read-first");
        let guard = holder
            .acquire(&name, &options(held))
            .await
            .expect("acquire");
        let (recorder, wait) = wait_through_recorder(&h, &name, options(waits)).await;
        // The waiter's first look, then one per refresh of its own node (every second), and
        // per renewal of the holder for those that watch its node.
        tokio::time::sleep(Duration::from_millis(2500)).await;
        guard.release().await.expect("release");
        let (_waiter, taken) = wait.await.expect("join").expect("the waiter acquires");
        taken.release().await.expect("release");
        // A poll's requests are sent together, microseconds apart; polls are a wait apart
        // (a wake-up, a refresh). A read within a millisecond after a write is its poll's
        // (sent after it: the order this test fails). A read before a write, counted to show
        // that some poll did both, may come further ahead on a loaded machine (CI, once:
        // every such pair 1 ms or more apart): within 50 ms of it.
        let ops = recorder.ops();
        let codes: Vec<i32> = ops.iter().map(|&(_, op)| op).collect();
        let near = Duration::from_millis(1);
        let paired = Duration::from_millis(50);
        let mut read_first = 0;
        for (i, &(at, op)) in ops.iter().enumerate() {
            if op != set_data {
                continue;
            }
            let after = ops[i + 1..]
                .iter()
                .take_while(|&&(t, _)| t - at < near)
                .any(|&(_, op)| op == get_data);
            assert!(
                !after,
                "{case}: the waiter wrote its node before reading the node ahead: {codes:?}"
            );
            let before = ops[..i]
                .iter()
                .rev()
                .take_while(|&&(t, _)| at - t < paired)
                .any(|&(_, op)| op == get_data);
            read_first += usize::from(before);
        }
        assert!(
            read_first > 0,
            "{case}: no poll both read a node and wrote the waiter's: {codes:?}"
        );
    }
}

/// A waiter whose blockers' deletion alone lets it in holds without a look at the queue: a
/// writer behind three readers (which leave one after the other, the last it watched first),
/// a reader behind one writer and the mutex's next in line each send only the write that
/// marks their node held once the last of them is gone. Before, each deletion of the watched
/// node cost a listing of the queue (and a new watch while readers remained): a round trip
/// more in each handoff. ZooKeeper's operation codes: 5 setData, 2 delete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_needs_no_look_at_the_queue() {
    let Some(h) = harness().await else { return };
    let (set_data, delete) = (5, 2);
    let options = |kind| {
        AcquireOptions::default()
            .with_kind(kind)
            .with_ttl(Duration::from_secs(30))
            .with_wait(Duration::from_secs(20))
            // No poll but on a wake-up: the core's safety net (a poll every 250 ms by
            // default, against a lost event) would list the queue at random times.
            .with_backoff(Backoff::new(
                Duration::from_millis(2),
                Duration::from_secs(60),
            ))
    };
    let cases = [
        (
            "a writer behind three readers",
            LockKind::Shared,
            3,
            LockKind::Exclusive,
        ),
        (
            "a reader behind a writer",
            LockKind::Exclusive,
            1,
            LockKind::Shared,
        ),
        (
            "the mutex's next in line",
            LockKind::Exclusive,
            1,
            LockKind::Exclusive,
        ),
    ];
    for (case, held, count, waits) in cases {
        let holder = h.backend().await.expect("connect");
        let name = common::unique("turn");
        let mut guards = Vec::new();
        for _ in 0..count {
            guards.push(
                holder
                    .acquire(&name, &options(held))
                    .await
                    .expect("acquire"),
            );
        }
        let (recorder, wait) = wait_through_recorder(&h, &name, options(waits)).await;
        // The waiter's first polls; its own node needs no refresh for 10 s, nor the
        // holders' renewal.
        tokio::time::sleep(Duration::from_millis(1000)).await;
        assert!(!wait.is_finished(), "{case}: acquired while blocked");
        let before = recorder.ops().len();
        // The newest first: the writer's predecessor, which alone it watched before.
        while let Some(guard) = guards.pop() {
            guard.release().await.expect("release");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let (_waiter, taken) = wait.await.expect("join").expect("the waiter acquires");
        // The held mark is sent, not awaited: the release's answer, on the same connection,
        // comes after it.
        taken.release().await.expect("release");
        let after: Vec<i32> = recorder.ops()[before..].iter().map(|&(_, op)| op).collect();
        assert_eq!(
            after,
            vec![set_data, delete],
            "{case}: requests from the first release to the waiter's own release"
        );
    }
}
