//! A release lets the next waiter hold with no read of the queue: the waiter counts the
//! removals of the keys ahead of it from the republished events (`wake::Count`), so a handoff
//! costs the release's purge and nothing else. Each read of a queue of N keys is N + 1
//! `$JS.API.STREAM.MSG.GET` requests; a subscriber to those requests counts them.

use std::time::Duration;

use conformance_tests::server_var;
use distlock_core::{AcquireOptions, ClientConfig, DistributedLock, LockClient, LockGuard};
use distlock_nats::NatsConfig;
use distlock_nats::async_nats;
use futures::StreamExt;
use tokio::task::JoinHandle;

/// Clients of one fresh bucket on the single server, and a subscriber to its stream's reads.
struct Setup {
    config: NatsConfig,
    reads: async_nats::Subscriber,
    /// Keeps the subscriber's connection.
    _spy: distlock_nats::NatsBackend,
}

async fn setup() -> Option<Setup> {
    let url = server_var("nats", "DISTLOCK_TEST_NATS_URL")?;
    let bucket = format!(
        "handoff-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let config = NatsConfig::from_url(&url)
        .and_then(|c| c.with_bucket(&bucket))
        .expect("NATS URL");
    let spy = distlock_nats::NatsBackend::connect(&config, Duration::from_secs(5))
        .await
        .expect("spy connection");
    let reads = spy
        .client()
        .subscribe(format!("$JS.API.STREAM.MSG.GET.KV_{bucket}"))
        .await
        .expect("subscribe to the stream's reads");
    spy.client().flush().await.expect("flush");
    Some(Setup {
        config,
        reads,
        _spy: spy,
    })
}

impl Setup {
    async fn client(&self) -> LockClient<distlock_nats::NatsBackend> {
        let config = ClientConfig::default().with_operation_timeout(Duration::from_secs(5));
        distlock_nats::connect_with(self.config.clone(), config)
            .await
            .expect("connect")
    }

    /// A waiter on `name` in a client of its own, queued (its read done) when this returns.
    async fn waiter(&mut self, name: &str, opts: &AcquireOptions) -> JoinHandle<LockGuard> {
        let client = self.client().await;
        let (name, opts) = (name.to_owned(), opts.clone());
        let task = tokio::spawn(async move { client.acquire(&name, &opts).await.expect("wait") });
        // Its entry written and the queue read: a request per key, then quiet.
        self.quiet().await;
        assert!(!task.is_finished(), "the waiter should wait");
        task
    }

    /// The reads since the last call, once none came for 300 ms (at most 5 s).
    async fn quiet(&mut self) -> usize {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        let mut reads = 0;
        while tokio::time::timeout(Duration::from_millis(300), self.reads.next())
            .await
            .is_ok()
        {
            reads += 1;
            assert!(
                tokio::time::Instant::now() < deadline,
                "{reads} reads in 5 s: the waiters never stop reading"
            );
        }
        reads
    }
}

/// The first of `waiters` to hold, removed from them.
async fn next_holder(waiters: &mut Vec<JoinHandle<LockGuard>>) -> LockGuard {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(at) = waiters.iter().position(JoinHandle::is_finished) {
            return waiters.remove(at).await.expect("waiter task");
        }
        assert!(tokio::time::Instant::now() < deadline, "no waiter got it");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// `holders` hold `name` as `opts` asks and three waiters queue behind them; each release
/// lets one waiter in with no read of the queue.
async fn handoffs_read_nothing(s: &mut Setup, name: &str, opts: &AcquireOptions, holders: usize) {
    let mut held = Vec::new();
    for _ in 0..holders {
        held.push(s.client().await.acquire(name, opts).await.expect("hold"));
    }
    let mut waiters = Vec::new();
    for _ in 0..3 {
        waiters.push(s.waiter(name, opts).await);
    }
    for round in 0..3 {
        held.remove(0).release().await.expect("release");
        held.push(next_holder(&mut waiters).await);
        assert_eq!(
            s.quiet().await,
            0,
            "round {round}: the handoff read the queue"
        );
        assert_eq!(waiters.len(), 2 - round, "round {round}: one waiter holds");
    }
    for guard in held {
        guard.release().await.expect("release");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_handoff_reads_nothing() {
    let Some(mut s) = setup().await else { return };
    let opts = AcquireOptions::default()
        .with_ttl(Duration::from_secs(30))
        .with_permits(2);
    handoffs_read_nothing(&mut s, "sem", &opts, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_handoff_reads_nothing() {
    let Some(mut s) = setup().await else { return };
    let opts = AcquireOptions::default().with_ttl(Duration::from_secs(30));
    handoffs_read_nothing(&mut s, "mutex", &opts, 1).await;
}

/// Readers queued behind a writer hold on its release, all of them, with no read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_behind_a_writer_read_nothing_on_its_release() {
    let Some(mut s) = setup().await else { return };
    let ttl = Duration::from_secs(30);
    let write = AcquireOptions::default().with_ttl(ttl);
    let read = AcquireOptions::default().with_ttl(ttl).shared();
    let writer = s.client().await.acquire("rw", &write).await.expect("write");
    let mut readers = Vec::new();
    for _ in 0..3 {
        readers.push(s.waiter("rw", &read).await);
    }
    writer.release().await.expect("release");
    let mut held = Vec::new();
    while !readers.is_empty() {
        held.push(next_holder(&mut readers).await);
    }
    assert_eq!(s.quiet().await, 0, "the readers read the queue");
    for guard in held {
        guard.release().await.expect("release");
    }
}
