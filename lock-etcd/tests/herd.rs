//! No thundering herd, counted by the etcd member itself: its `/metrics` endpoint counts the
//! watch events it delivers (`etcd_debugging_mvcc_events_total`, after each watcher's
//! filters), the watchers open (`etcd_debugging_mvcc_watcher_total`) and the transactions it
//! served (`grpc_server_handled_total{grpc_method="Txn"}`). A release must deliver an event
//! only to the waiters it unblocks, or (a semaphore's waiters, who count the keys ahead of
//! them) make no waiter read that it does not unblock.
//!
//! Its own test binary, one case at a time: the figures are the whole member's, so nothing
//! else of this process may touch etcd meanwhile. The waiters' backoff is a minute, so that
//! only events (never the core's safety-net polls) make them read.

mod common;

use std::time::{Duration, Instant};

use common::Etcd;
use conformance_tests::server_var;
use distlock_core::LockClient;
use distlock_core::{AcquireOptions, Backoff, DistributedLock, Error, LockGuard, LockKind};
use distlock_etcd::EtcdBackend;
use tokio::sync::Mutex;
use tokio::task::JoinHandle;

static SERIAL: Mutex<()> = Mutex::const_new(());

/// Long enough that no renewal (every ttl / 3) falls inside a measured release.
const TTL: Duration = Duration::from_secs(30);
/// A bound on things that must happen, never a synchronisation.
const BOUND: Duration = Duration::from_secs(10);

/// The member's figures that count wake-ups.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Figures {
    /// Watch events delivered to watchers.
    events: u64,
    /// Watchers open now.
    watchers: u64,
    /// Transactions served (every acquire step, release and position read is one).
    txns: u64,
    /// Watch streams opened since the member started.
    streams: u64,
}

/// Reads `/metrics` of the member at `endpoint` (`http://host:port`).
async fn figures(endpoint: &str) -> Figures {
    let body = common::metrics(endpoint).await;
    let value = common::metric_value;
    let mut figures = Figures {
        events: 0,
        watchers: 0,
        txns: 0,
        streams: 0,
    };
    for line in body.lines() {
        if line.starts_with("etcd_debugging_mvcc_events_total ") {
            figures.events = value(line);
        } else if line.starts_with("etcd_debugging_mvcc_watcher_total ") {
            figures.watchers = value(line);
        } else if line.starts_with("grpc_server_handled_total{")
            && line.contains("grpc_method=\"Txn\"")
        {
            figures.txns += value(line);
        } else if line.starts_with("grpc_server_started_total{")
            && line.contains("grpc_method=\"Watch\"")
            && line.contains("grpc_service=\"etcdserverpb.Watch\"")
        {
            figures.streams += value(line);
        }
    }
    figures
}

struct Setup {
    etcd: Etcd,
    endpoint: String,
}

async fn setup() -> Option<Setup> {
    let endpoints = server_var("etcd", "DISTLOCK_TEST_ETCD_ENDPOINTS")?;
    let endpoint = endpoints.split(',').next()?.to_owned();
    Some(Setup {
        etcd: Etcd::new(&endpoints, vec!["etcd"]).await,
        endpoint,
    })
}

fn opts() -> AcquireOptions {
    AcquireOptions::default()
        .with_ttl(TTL)
        .with_wait(Duration::from_secs(60))
        .with_backoff(Backoff::new(
            Duration::from_secs(60),
            Duration::from_secs(60),
        ))
}

type Waiter = JoinHandle<Result<LockGuard, Error>>;

impl Setup {
    /// Starts a waiting acquisition of `name` as `opts` asks, and returns once its watch is
    /// open on the member (so waiters queue in the order they are started).
    async fn waiter(&self, name: &str, opts: &AcquireOptions) -> Waiter {
        let before = figures(&self.endpoint).await.watchers;
        let client: LockClient<EtcdBackend> = self.etcd.client().await.unwrap();
        let (name, opts) = (name.to_owned(), opts.clone());
        let task = tokio::spawn(async move { client.acquire(&name, &opts).await });
        let started = Instant::now();
        while figures(&self.endpoint).await.watchers <= before {
            assert!(started.elapsed() < BOUND, "a waiter never watched");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        task
    }

    /// The member's figures once what the last step set off has come: a waiter's read would
    /// follow its event within milliseconds.
    async fn settled(&self) -> Figures {
        tokio::time::sleep(Duration::from_millis(300)).await;
        figures(&self.endpoint).await
    }

    /// Waits until `done` of `tasks` have finished, and returns the finished guards.
    async fn finished(&self, tasks: &mut Vec<Waiter>, done: usize) -> Vec<LockGuard> {
        let started = Instant::now();
        while tasks.iter().filter(|t| t.is_finished()).count() < done {
            assert!(
                started.elapsed() < BOUND,
                "the unblocked waiters never got in"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let mut guards = Vec::new();
        let mut waiting = Vec::new();
        for task in tasks.drain(..) {
            if task.is_finished() {
                guards.push(task.await.unwrap().expect("an unblocked waiter's acquire"));
            } else {
                waiting.push(task);
            }
        }
        *tasks = waiting;
        guards
    }
}

#[tokio::test]
async fn a_writers_release_wakes_the_readers_behind_it_and_not_the_next_writer() {
    let _serial = SERIAL.lock().await;
    let Some(s) = setup().await else { return };
    let name = format!("herd-rw-{}", uuid::Uuid::new_v4().simple());
    let holder_client = s.etcd.client().await.unwrap();
    let holder = holder_client.acquire(&name, &opts()).await.unwrap();
    let mut readers = Vec::new();
    for _ in 0..5 {
        readers.push(s.waiter(&name, &opts().shared()).await);
    }
    let mut writer = vec![s.waiter(&name, &opts()).await];
    // A waiter whose watch started after its read reads once more: let that settle.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let before = figures(&s.endpoint).await;
    holder.release().await.unwrap();
    let guards = s.finished(&mut readers, 5).await;
    // Nothing more comes once the readers hold.
    let after = s.settled().await;
    eprintln!("writer release with 5 readers + 1 writer waiting: {before:?} -> {after:?}");
    assert_eq!(
        after.events - before.events,
        5,
        "one event per reader unblocked, none for the writer behind them"
    );
    assert_eq!(
        after.txns - before.txns,
        1,
        "transactions beyond the release: each reader counts the writers ahead of it and \
         holds on the deletion of the last, without a read"
    );
    assert!(!writer[0].is_finished(), "the writer got in with readers");
    assert!(guards.iter().all(|g| g.kind() == LockKind::Shared));

    // The last reader's release (and only it) wakes the writer.
    let mut guards = guards.into_iter();
    let last = guards.next_back().unwrap();
    let before = figures(&s.endpoint).await;
    for guard in guards {
        guard.release().await.unwrap();
    }
    assert_eq!(
        figures(&s.endpoint).await.events,
        before.events,
        "woken early"
    );
    last.release().await.unwrap();
    let got = s.finished(&mut writer, 1).await;
    assert_eq!(figures(&s.endpoint).await.events - before.events, 1);
    got.into_iter().next().unwrap().release().await.unwrap();
}

/// A permit's release costs one transaction, the release itself: the first waiter counts
/// the deletion and holds without a read, and every waiter behind it gets the same one event
/// (it counts one key fewer ahead) and sends nothing; no watch is opened.
#[tokio::test]
async fn a_permit_release_is_one_transaction() {
    let _serial = SERIAL.lock().await;
    let Some(s) = setup().await else { return };
    let name = format!("herd-sem-{}", uuid::Uuid::new_v4().simple());
    let permits = opts().with_permits(2);
    let (a, b) = (
        s.etcd.client().await.unwrap(),
        s.etcd.client().await.unwrap(),
    );
    let first = a.acquire(&name, &permits).await.unwrap();
    let second = b.acquire(&name, &permits).await.unwrap();
    let mut waiters = Vec::new();
    for _ in 0..4 {
        waiters.push(s.waiter(&name, &permits).await);
    }
    // A waiter whose watch started after its read reads once more: let that settle.
    tokio::time::sleep(Duration::from_millis(500)).await;

    // The holder released is not the one any waiter could watch by position: the first
    // waiter must still see it (k0, k1 hold; k1 leaves).
    let mut holders = vec![first];
    let mut release = second;
    for round in 0..3 {
        let waiting = waiters.len() as u64;
        let before = figures(&s.endpoint).await;
        release.release().await.unwrap();
        let got = s.finished(&mut waiters, 1).await;
        // Nothing more comes once the waiter holds.
        let after = s.settled().await;
        eprintln!("permit release {round} with {waiting} waiting: {before:?} -> {after:?}");
        assert_eq!(after.txns - before.txns, 1, "round {round}");
        // One event to each range watch: the waiters' and those their clients keep idle
        // for a while after holding (for the next wait on the name); none is opened.
        let events = after.events - before.events;
        assert!(
            (waiting..=before.watchers).contains(&events),
            "round {round}: {events} events, {before:?}"
        );
        assert!(after.watchers <= before.watchers, "round {round}");
        assert_eq!(waiters.len(), 3 - round);
        holders.extend(got);
        release = holders.remove(0);
    }
    release.release().await.unwrap();
    for guard in holders {
        guard.release().await.unwrap();
    }
    for guard in s.finished(&mut waiters, 1).await {
        guard.release().await.unwrap();
    }
}

/// Issue 22: a stream per wait made the leader start thousands of watch streams in one
/// benchmark session. Every wait of a client shares its one stream.
#[tokio::test]
async fn a_clients_waits_share_one_watch_stream() {
    let _serial = SERIAL.lock().await;
    let Some(s) = setup().await else { return };
    let name = format!("herd-streams-{}", uuid::Uuid::new_v4().simple());
    const CLIENTS: usize = 4;
    const ROUNDS: usize = 40;
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        clients.push(s.etcd.client().await.unwrap());
    }
    let contended = AcquireOptions::default()
        .with_ttl(TTL)
        .with_wait(Duration::from_secs(60));
    let before = figures(&s.endpoint).await;
    let mut tasks = Vec::new();
    for client in clients {
        let (name, opts) = (name.clone(), contended.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let guard = client.acquire(&name, &opts).await?;
                tokio::time::sleep(Duration::from_millis(2)).await;
                guard.release().await?;
            }
            Ok::<_, Error>(())
        }));
    }
    for task in tasks {
        task.await.unwrap().expect("a contended acquire");
    }
    let after = figures(&s.endpoint).await;
    eprintln!(
        "{CLIENTS} clients x {ROUNDS} contended rounds: {} watch streams opened, {} events",
        after.streams - before.streams,
        after.events - before.events
    );
    assert!(
        after.events - before.events >= 40,
        "the waiters were woken by watches"
    );
    assert!(
        after.streams - before.streams <= CLIENTS as u64,
        "more than one watch stream per client: {before:?} -> {after:?}"
    );
}
