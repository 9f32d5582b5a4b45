//! Read-write locks and semaphores on ZooKeeper: expired holders, crashed readers, and the
//! herd check, counted through the server's own figures (`mntr`'s watch notifications).

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{ZkHarness, unique};
use distlock_core::{AcquireOptions, DistributedLock, LockGuard, LockKind};
use distlock_zookeeper::zookeeper_client as zk;
use tokio::task::JoinHandle;

/// The herd checks read server-wide counters: the tests of this binary run one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The bound of anything that should happen at once.
const SOON: Duration = Duration::from_secs(5);

async fn harness() -> Option<ZkHarness> {
    let server = conformance_tests::server_var("zk", "DISTLOCK_TEST_ZK_CONNECT")?;
    Some(ZkHarness::new(&server).await)
}

/// One test's setup: the serial turn, the harness, a unique lock name and `n` clients.
async fn setup(
    what: &str,
    n: usize,
) -> Option<(
    tokio::sync::MutexGuard<'static, ()>,
    ZkHarness,
    String,
    Vec<Client>,
)> {
    let serial = SERIAL.lock().await;
    let h = harness().await?;
    let clients = clients(&h, n).await;
    Some((serial, h, unique(what), clients))
}

type Client = Arc<dyn DistributedLock>;

async fn clients(h: &ZkHarness, n: usize) -> Vec<Client> {
    let mut clients = Vec::new();
    for _ in 0..n {
        clients.push(h.backend().await.expect("connect").into_dyn());
    }
    clients
}

/// Starts a waiting acquisition and returns once its node is in the queue (the queue then
/// has `len` nodes), so that waiters queue in the order they are started.
async fn enqueue(
    h: &ZkHarness,
    client: &Client,
    name: &str,
    opts: &AcquireOptions,
    len: usize,
) -> JoinHandle<LockGuard> {
    let (client, name_, opts) = (client.clone(), name.to_owned(), opts.clone());
    let task = tokio::spawn(async move { client.acquire(&name_, &opts).await.expect("acquire") });
    tokio::time::timeout(SOON, h.queue_when(name, len))
        .await
        .expect("the waiter's node did not appear");
    task
}

async fn got(task: JoinHandle<LockGuard>, what: &str) -> LockGuard {
    tokio::time::timeout(SOON, task)
        .await
        .unwrap_or_else(|_| panic!("{what} did not get the lock"))
        .expect("a waiter panicked")
}

/// The queue's nodes and their data, lowest sequence first.
async fn marks(h: &ZkHarness, name: &str) -> Vec<(String, Vec<u8>)> {
    let mut marks = Vec::new();
    for node in h.queue(name).await {
        let path = format!("{}/{node}", h.lock_path(name));
        if let Ok((data, _)) = h.admin.get_data(&path).await {
            marks.push((node, data));
        }
    }
    marks
}

/// Waits until the `waiting` last nodes of the queue say "waiting" (their first poll made
/// them waiters and set their watches in the same round trip) and the others "held", then
/// until the server's watch count is steady.
async fn settled(h: &ZkHarness, name: &str, waiting: usize) {
    let started = Instant::now();
    loop {
        let marks = marks(h, name).await;
        let held = marks.len().saturating_sub(waiting);
        let as_expected = marks
            .iter()
            .enumerate()
            .all(|(i, (_, data))| data.first() == Some(if i < held { &b'H' } else { &b'W' }));
        if as_expected && marks.len() > waiting {
            break;
        }
        assert!(started.elapsed() < SOON, "waiters not marked: {marks:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut last = mntr(h).await.get("zk_watch_count").copied();
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = mntr(h).await.get("zk_watch_count").copied();
        if now == last {
            return;
        }
        assert!(started.elapsed() < SOON, "the watch count keeps changing");
        last = now;
    }
}

/// The server's `mntr` figures.
async fn mntr(h: &ZkHarness) -> HashMap<String, i64> {
    common::mntr(&h.server).await
}

/// Watch notifications the server sent, by event: the sums of `mntr`'s per-event watcher
/// counts (each event counts the watchers it triggered).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Notified {
    children: i64,
    deleted: i64,
    changed: i64,
    created: i64,
    /// Requests the server received (all sessions).
    requests: i64,
}

impl Notified {
    async fn now(h: &ZkHarness) -> Self {
        let m = mntr(h).await;
        let sum = |event: &str| {
            m.get(&format!("zk_sum_node_{event}_watch_count"))
                .copied()
                .unwrap_or_else(|| panic!("mntr has no zk_sum_node_{event}_watch_count: {m:?}"))
        };
        Self {
            children: sum("children"),
            deleted: sum("deleted"),
            changed: sum("changed"),
            created: sum("created"),
            requests: m.get("zk_packets_received").copied().unwrap_or_default(),
        }
    }

    fn since(self, before: Self) -> Self {
        Self {
            children: self.children - before.children,
            deleted: self.deleted - before.deleted,
            changed: self.changed - before.changed,
            created: self.created - before.created,
            requests: self.requests - before.requests,
        }
    }

    fn total(self) -> i64 {
        self.children + self.deleted + self.changed + self.created
    }
}

/// A permit holder whose session ends stops counting at once: the server removes its node
/// and the first waiter's watch on it fires, long before the holder's ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_of_a_closed_session_frees_at_once() {
    let _serial = SERIAL.lock().await;
    let Some(h) = harness().await else { return };
    let name = unique("closed");
    let (kept, waiter) = (
        clients(&h, 1).await.remove(0),
        clients(&h, 1).await.remove(0),
    );
    let (gone, tag) = h.proxied().await.expect("connect");
    let opts = AcquireOptions::default()
        .with_ttl(Duration::from_secs(20))
        .with_permits(2)
        .with_wait(Duration::from_secs(30));
    let first = kept.acquire(&name, &opts).await.expect("acquire");
    let lost = gone.acquire(&name, &opts).await.expect("acquire");
    let lost_token = lost.token();
    let waiting = enqueue(&h, &waiter, &name, &opts, 3).await;
    settled(&h, &name, 1).await;
    // Cut off from the server, so that it cannot take its session back, the holder's
    // session is ended by a connection of ours: its ttl (20 s) and session timeout (30 s)
    // are far off.
    h.partition(&tag, true);
    let ended = Instant::now();
    let session = gone.backend_ref().session_info().clone();
    let twin = zk::Client::connector()
        .with_session(session)
        .connect(&h.server)
        .await
        .expect("connect with the holder's session");
    drop(twin);
    let third = got(waiting, "the waiter").await;
    assert!(
        ended.elapsed() < Duration::from_secs(5),
        "the permit came back only after {:?} (ttl 20 s)",
        ended.elapsed()
    );
    assert!(
        third.token() > lost_token,
        "{} after {lost_token}",
        third.token()
    );
    drop(lost);
    third.release().await.expect("release");
    first.release().await.expect("release");
    h.drained(&name).await;
}

/// A permit holder that stopped renewing (its session alive) is removed by the next
/// acquirer once its lease ran out on the server's clock; the acquirer's token is higher.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapsed_permit_holder_is_pruned_by_the_next_acquirer() {
    let Some((_serial, h, name, c)) = setup("lapsed", 2).await else {
        return;
    };
    let ttl = Duration::from_secs(1);
    let opts = AcquireOptions::default()
        .with_ttl(ttl)
        .with_permits(2)
        .with_wait(Duration::from_secs(10));
    let kept = c[0].acquire(&name, &opts).await.expect("acquire");
    let sent = Instant::now();
    let crashed = c[0]
        .acquire(
            &name,
            &opts
                .clone()
                .with_renewal(distlock_core::Renewal::disabled()),
        )
        .await
        .expect("acquire");
    let crashed_token = crashed.token();
    crashed.abandon();
    let crashed_node = h.queue(&name).await[1].clone();
    let guard = c[1].acquire(&name, &opts).await.expect("acquire");
    let waited = sent.elapsed();
    assert!(
        waited >= ttl,
        "the permit came back after {waited:?}, before its ttl"
    );
    assert!(
        waited < ttl + SOON,
        "the permit came back only after {waited:?}"
    );
    assert!(guard.token() > crashed_token);
    let queue = h.queue(&name).await;
    assert!(
        !queue.contains(&crashed_node),
        "the lapsed holder's node is still there: {queue:?}"
    );
    assert_eq!(queue.len(), 2, "{queue:?}");
    guard.release().await.expect("release");
    kept.release().await.expect("release");
    h.drained(&name).await;
}

/// A reader that crashed (stopped renewing, session alive) blocks a waiting writer for its
/// ttl, no longer; the writer then holds with a higher token, and the reader is told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_reader_frees_the_lock_after_its_ttl_while_a_writer_waits() {
    let Some((_serial, h, name, c)) = setup("reader", 2).await else {
        return;
    };
    let ttl = Duration::from_secs(1);
    let read = AcquireOptions::default()
        .with_ttl(ttl)
        .shared()
        .with_renewal(distlock_core::Renewal::disabled());
    let sent = Instant::now();
    let reader = c[0].acquire(&name, &read).await.expect("acquire");
    let reader_token = reader.token();
    let lost = reader.lost();
    reader.abandon();
    let write = AcquireOptions::default()
        .with_ttl(ttl)
        .with_wait(Duration::from_secs(10));
    let writer = enqueue(&h, &c[1], &name, &write, 2).await;
    let writer = got_within(writer, ttl + SOON).await;
    let waited = sent.elapsed();
    assert!(
        waited >= ttl,
        "the writer got in after {waited:?}, before the reader's ttl"
    );
    assert!(writer.token() > reader_token);
    assert_eq!(writer.kind(), LockKind::Exclusive);
    tokio::time::timeout(SOON, lost)
        .await
        .expect("the crashed reader was not told it lost the lock");
    writer.release().await.expect("release");
    h.drained(&name).await;
}

async fn got_within(task: JoinHandle<LockGuard>, bound: Duration) -> LockGuard {
    tokio::time::timeout(bound, task)
        .await
        .expect("the waiter did not get the lock")
        .expect("a waiter panicked")
}

/// Options of the herd checks: ttls long enough that no renewal or waiter refresh (every
/// ttl/3) falls into the measured release.
fn herd_opts() -> AcquireOptions {
    AcquireOptions::default()
        .with_ttl(Duration::from_secs(25))
        .with_wait(Duration::from_secs(30))
}

/// The herd check of a semaphore: with 2 holders and 6 waiters, a release notifies the two
/// waiters that count the deletions ahead of them (`PERMIT_WAITERS_COUNTING` in the crate),
/// and once the first marks itself held, the second (whose watch on it is set again by one
/// read) and the third (which watches it to join those that count): never the 6. Then a
/// release of the *other* holder than the one released first still reaches the new first
/// waiter (a waiter watching one fixed holder would miss it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_release_wakes_only_the_waiter_it_frees_a_permit_for() {
    const WAITERS: usize = 6;
    let Some((_serial, h, name, c)) = setup("herd-sem", 2 + WAITERS).await else {
        return;
    };
    let opts = herd_opts().with_permits(2);
    let h0 = c[0].acquire(&name, &opts).await.expect("acquire");
    let h1 = c[1].acquire(&name, &opts).await.expect("acquire");
    let mut waiting = Vec::new();
    for i in 0..WAITERS {
        waiting.push(enqueue(&h, &c[2 + i], &name, &opts, 3 + i).await);
    }
    settled(&h, &name, WAITERS).await;
    let before = Notified::now(&h).await;
    h0.release().await.expect("release");
    let mut waiting = waiting.into_iter();
    let w0 = got(waiting.next().unwrap(), "the first waiter").await;
    let seen = Notified::now(&h).await.since(before);
    eprintln!("semaphore of 2, {WAITERS} waiters, one release: {seen:?}");
    assert!(
        seen.children <= 1,
        "{} waiters woken by the children watch: {seen:?}",
        seen.children
    );
    // The release notifies the two counting waiters; the first one's held mark the second
    // and the third; the released holder's own loss watch may fire too (the other three
    // waiters watch waiters that did not change).
    assert!(seen.total() <= 5, "a herd: {seen:?}");
    // Holders h1 and w0 now, w1 first waiter: the newer holder leaves first.
    w0.release().await.expect("release");
    let w1 = got(waiting.next().unwrap(), "the second waiter").await;
    h1.release().await.expect("release");
    let w2 = got(waiting.next().unwrap(), "the third waiter").await;
    let rest: Vec<_> = waiting.collect();
    assert!(rest.iter().all(|t| !t.is_finished()), "more than 2 holders");
    w1.release().await.expect("release");
    w2.release().await.expect("release");
    for task in rest {
        got(task, "a later waiter")
            .await
            .release()
            .await
            .expect("release");
    }
    h.drained(&name).await;
}

/// A permit waiter that counts the deletions ahead of it holds only once enough are gone:
/// behind the two holders of a semaphore of 2 and a waiter, the waiter ahead giving up (its
/// node deleted) is one of the two deletions it needs, not both; a holder's release then lets
/// it in beside the other holder, never as a third.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_counting_permit_waiter_holds_once_enough_nodes_ahead_are_gone() {
    let Some((_serial, h, name, c)) = setup("count-sem", 4).await else {
        return;
    };
    let opts = herd_opts().with_permits(2);
    let first = c[0].acquire(&name, &opts).await.expect("acquire");
    let second = c[1].acquire(&name, &opts).await.expect("acquire");
    let ahead = enqueue(&h, &c[2], &name, &opts, 3).await;
    let waiter = enqueue(&h, &c[3], &name, &opts, 4).await;
    settled(&h, &name, 2).await;
    // The waiter ahead gives up: its acquisition dropped, its node removed.
    ahead.abort();
    tokio::time::timeout(SOON, h.queue_when(&name, 3))
        .await
        .expect("the node of the waiter that gave up is still there");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!waiter.is_finished(), "a third permit of two was granted");
    first.release().await.expect("release");
    let taken = got(waiter, "the waiter").await;
    assert_eq!(
        h.queue(&name).await.len(),
        2,
        "holders besides the two permits"
    );
    taken.release().await.expect("release");
    second.release().await.expect("release");
    h.drained(&name).await;
}

/// The herd check of a read-write lock: a writer holds, 2 readers wait behind it, then a
/// writer, then 4 readers. The first writer's release notifies the 2 readers it frees (they
/// watch it) and the waiting writer once (its predecessor marks itself held), and none of
/// the 4 readers behind the waiting writer (they watch that writer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_release_wakes_only_the_readers_it_frees() {
    let Some((_serial, h, name, c)) = setup("herd-rw", 8).await else {
        return;
    };
    let (write, read) = (herd_opts(), herd_opts().shared());
    let w0 = c[0].acquire(&name, &write).await.expect("acquire");
    let r1 = enqueue(&h, &c[1], &name, &read, 2).await;
    let r2 = enqueue(&h, &c[2], &name, &read, 3).await;
    let w1 = enqueue(&h, &c[3], &name, &write, 4).await;
    let mut late = Vec::new();
    for i in 0..4 {
        late.push(enqueue(&h, &c[4 + i], &name, &read, 5 + i).await);
    }
    settled(&h, &name, 7).await;
    let before = Notified::now(&h).await;
    w0.release().await.expect("release");
    let (r1, r2) = (got(r1, "a reader").await, got(r2, "a reader").await);
    let seen = Notified::now(&h).await.since(before);
    eprintln!("1 writer holding, 2 readers + 1 writer + 4 readers waiting, one release: {seen:?}");
    assert_eq!(seen.children, 0, "{seen:?}");
    // The 2 readers (and the released writer's own loss watch, if set).
    assert!(
        seen.deleted <= 3,
        "readers behind the waiting writer woken: {seen:?}"
    );
    // The waiting writer, by the held mark of its predecessor.
    assert!(seen.changed <= 1, "{seen:?}");
    assert!(
        late.iter().all(|t| !t.is_finished()),
        "a reader passed the waiting writer"
    );
    r1.release().await.expect("release");
    r2.release().await.expect("release");
    let w1 = got(w1, "the waiting writer").await;
    assert!(
        late.iter().all(|t| !t.is_finished()),
        "a reader joined a writer"
    );
    // The writer's held mark woke the readers that watch it (see the crate docs); they
    // watch it again.
    settled(&h, &name, 4).await;
    let before = Notified::now(&h).await;
    w1.release().await.expect("release");
    let mut readers = Vec::new();
    for task in late {
        readers.push(got(task, "a late reader").await);
    }
    let seen = Notified::now(&h).await.since(before);
    eprintln!("1 writer holding, 4 readers waiting, one release: {seen:?}");
    // The 4 readers (and the writer's own loss watch, if set), nobody else.
    assert!(seen.deleted <= 5 && seen.children == 0, "{seen:?}");
    assert!(seen.changed == 0, "{seen:?}");
    for reader in readers {
        reader.release().await.expect("release");
    }
    h.drained(&name).await;
}

/// Election observers are woken by the watches on the name, not by their interval (an hour
/// here): each new leader, and each resignation, is seen at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn election_observers_are_woken_by_the_watch() {
    use futures::StreamExt;
    let _serial = SERIAL.lock().await;
    let Some(h) = harness().await else { return };
    let c = clients(&h, 3).await;
    let (observer, a, b) = (&c[0], &c[1], &c[2]);
    let name = unique("observed");
    let mut changes = observer.observe(&name, Duration::from_secs(3600));
    let mut next = async || {
        tokio::time::timeout(SOON, changes.next())
            .await
            .expect("no change seen: not woken by a watch")
            .expect("the observation ended")
            .expect("an observation failed")
    };
    assert_eq!(next().await, None);
    let opts = AcquireOptions::default()
        .with_ttl(Duration::from_secs(5))
        .with_wait(Duration::from_secs(10));
    let term = a.campaign(&name, "a", &opts).await.expect("campaign");
    let leader = next().await.expect("a leader");
    assert_eq!(
        (leader.value.as_deref(), leader.term),
        (Some("a"), Some(term.token()))
    );
    // A waiting candidate is handed the lock: its node's held mark changes no children.
    let (b2, name2, opts2) = (b.clone(), name.clone(), opts.clone());
    let second = tokio::spawn(async move { b2.campaign(&name2, "b", &opts2).await });
    tokio::time::timeout(SOON, h.queue_when(&name, 2))
        .await
        .expect("the second candidate did not queue");
    term.release().await.expect("release");
    let mut seen = next().await;
    if seen.is_none() {
        // The observer read between the release and the held mark.
        seen = next().await;
    }
    let second = second.await.expect("panicked").expect("campaign");
    let leader = seen.expect("the second leader");
    assert_eq!(
        (leader.value.as_deref(), leader.term),
        (Some("b"), Some(second.token()))
    );
    second.release().await.expect("release");
    assert_eq!(next().await, None, "the resignation was not seen");
}
