//! A release lets the next waiter hold with no read of the queue: the waiter counts the
//! removals of the keys ahead of it from the republished events (`wake::Count`), so a handoff
//! costs the release's purge and nothing else. A waiter's read of its queue on the single
//! server is one batched direct get (`$JS.API.DIRECT.GET`), or, on a stream that does not
//! answer those, the stream's info and a `$JS.API.STREAM.MSG.GET` per key; a subscriber to
//! those requests counts them.

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
    /// The stream's name.
    stream: String,
    reads: futures::stream::SelectAll<async_nats::Subscriber>,
    /// Keeps the subscribers' connection.
    spy: distlock_nats::NatsBackend,
}

/// The read requests of the stream seen, by kind.
#[derive(Debug, Default, PartialEq, Eq)]
struct Reads {
    /// `$JS.API.STREAM.MSG.GET`: one message each.
    gets: usize,
    /// `$JS.API.STREAM.INFO`: the stream's subjects (and every client's connect).
    infos: usize,
    /// `$JS.API.DIRECT.GET`: a batch of messages each.
    direct: usize,
}

impl Reads {
    /// `n` batched direct gets and nothing else.
    fn direct(n: usize) -> Self {
        Self {
            direct: n,
            ..Self::default()
        }
    }
}

async fn setup() -> Option<Setup> {
    setup_with(&["STREAM.MSG.GET", "STREAM.INFO", "DIRECT.GET"]).await
}

/// [`setup`], the subscriber listening to the stream's read requests of `apis` only (one that
/// listens to `DIRECT.GET` is a responder there: a request sent there gets no "no responders").
async fn setup_with(apis: &[&str]) -> Option<Setup> {
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
    let stream = format!("KV_{bucket}");
    let mut reads = futures::stream::SelectAll::new();
    for api in apis {
        let subscriber = spy
            .client()
            .subscribe(format!("$JS.API.{api}.{stream}"))
            .await
            .expect("subscribe to the stream's reads");
        reads.push(subscriber);
    }
    spy.client().flush().await.expect("flush");
    Some(Setup {
        config,
        stream,
        reads,
        spy,
    })
}

impl Setup {
    async fn client(&self) -> LockClient<distlock_nats::NatsBackend> {
        self.client_with(Duration::from_secs(5)).await
    }

    /// A client whose requests time out after `timeout`.
    async fn client_with(&self, timeout: Duration) -> LockClient<distlock_nats::NatsBackend> {
        let config = ClientConfig::default().with_operation_timeout(timeout);
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
    async fn quiet(&mut self) -> Reads {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        let mut reads = Reads::default();
        while let Ok(Some(read)) =
            tokio::time::timeout(Duration::from_millis(300), self.reads.next()).await
        {
            let subject = read.subject.as_str();
            if subject.starts_with("$JS.API.DIRECT.GET.") {
                reads.direct += 1;
            } else if subject.starts_with("$JS.API.STREAM.INFO.") {
                reads.infos += 1;
            } else {
                reads.gets += 1;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{reads:?} in 5 s: the waiters never stop reading"
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
            Reads::default(),
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
    assert_eq!(
        s.quiet().await,
        Reads::default(),
        "the readers read the queue"
    );
    for guard in held {
        guard.release().await.expect("release");
    }
}

/// A waiter behind two holders and another waiter reads the queue (four keys) in one
/// request, and finds every entry ahead of it: it waits, and holds once a holder leaves. Its
/// client had not waited on the name lately, so it read once unsubscribed first: two reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiters_reads_are_one_direct_get_each() {
    let Some(mut s) = setup().await else { return };
    let opts = AcquireOptions::default()
        .with_ttl(Duration::from_secs(30))
        .with_permits(2);
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(s.client().await.acquire("sem", &opts).await.expect("hold"));
    }
    let mut waiters = vec![s.waiter("sem", &opts).await];
    let client = s.client().await;
    s.quiet().await;
    let waiter = tokio::spawn(async move { client.acquire("sem", &opts).await.expect("wait") });
    let reads = s.quiet().await;
    assert!(!waiter.is_finished(), "the waiter should wait");
    assert_eq!(reads, Reads::direct(2), "the waiter's reads of the queue");
    waiters.push(waiter);
    for _ in 0..2 {
        held.remove(0).release().await.expect("release");
        held.push(next_holder(&mut waiters).await);
    }
    for guard in held {
        guard.release().await.expect("release");
    }
}

/// The stream of `s` edited not to answer direct gets after a client with request timeout
/// `timeout` connected, which then waits behind a holder (`unanswered`: the spy of `s` takes
/// the direct get, which then gets no answer): it tries a direct get once, then
/// reads the queue as without (the stream's subjects, a get per key), correctly (it waits,
/// and holds once the holder leaves), and tries no direct get again for a while. Its next
/// wait, on another name, subscribes before it reads (a read is a request per key now): one
/// read.
async fn read_without_direct_gets(mut s: Setup, timeout: Duration, unanswered: bool) {
    let opts = AcquireOptions::default().with_ttl(Duration::from_secs(30));
    let holder = s.client_with(timeout).await;
    let held = holder.acquire("mutex", &opts).await.expect("hold");
    let client = s.client_with(timeout).await;
    let js = async_nats::jetstream::new(s.spy.client().clone());
    let mut stream = js.get_stream(&s.stream).await.expect("stream");
    let mut config = stream.info().await.expect("stream info").config.clone();
    assert!(
        config.allow_direct,
        "a single-server bucket answers direct gets"
    );
    config.allow_direct = false;
    js.update_stream(config).await.expect("edit the stream");
    s.quiet().await;
    let task = {
        let (client, opts) = (client.clone(), opts.clone());
        tokio::spawn(async move { client.acquire("mutex", &opts).await.expect("wait") })
    };
    if unanswered {
        // The unanswered direct get's time (half the timeout), then the reads without.
        tokio::time::sleep(timeout).await;
    }
    let reads = s.quiet().await;
    assert!(!task.is_finished(), "the waiter should wait");
    assert_eq!(
        reads,
        Reads {
            // Seen only where the spy listens to direct gets (see `setup_with`).
            direct: usize::from(unanswered),
            // Twice (unsubscribed, then subscribed: its client had not waited lately).
            infos: 2,
            gets: 4,
        },
        "the waiter's reads: its subjects and a get per key (two), twice"
    );
    held.release().await.expect("release");
    let guard = next_holder(&mut vec![task]).await;
    let other = holder.acquire("other", &opts).await.expect("hold");
    s.quiet().await;
    // The same client's next wait, on a name it never waited on: with its reads a request per
    // key now, it subscribes before it reads, and reads once.
    let task = {
        let opts = opts.clone();
        tokio::spawn(async move { client.acquire("other", &opts).await.expect("wait") })
    };
    let reads = s.quiet().await;
    assert!(!task.is_finished(), "the second waiter should wait");
    assert_eq!(
        reads.direct, 0,
        "a direct get soon after the first: {reads:?}"
    );
    assert_eq!(reads.infos, 1, "the second waiter's read: {reads:?}");
    other.release().await.expect("release");
    next_holder(&mut vec![task])
        .await
        .release()
        .await
        .expect("release");
    guard.release().await.expect("release");
}

/// No responder: the server answers the direct get at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_without_direct_gets_is_read_without() {
    let Some(s) = setup_with(&["STREAM.MSG.GET", "STREAM.INFO"]).await else {
        return;
    };
    read_without_direct_gets(s, Duration::from_secs(5), false).await;
}

/// A direct get nobody answers (as for a user not allowed to send it): the read goes on
/// without once the request's timeout has passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unanswered_direct_get_is_read_without() {
    let Some(s) = setup().await else { return };
    read_without_direct_gets(s, Duration::from_secs(1), true).await;
}

/// A reader beside readers, or a lock on a free name, reads the queue once and holds, with no
/// subscription: nothing is sent to it but its write's answer and its read's batch (the keys
/// of the name, then the batch's end), not the name's events. A reader that must wait
/// (behind a writer) subscribes then, reads again, and holds on the writer's release with no
/// read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_beside_readers_is_sent_no_event() {
    let Some(mut s) = setup().await else { return };
    let read = AcquireOptions::default()
        .with_ttl(Duration::from_secs(30))
        .shared();
    let holders = s.client().await;
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(holders.acquire("rw", &read).await.expect("read"));
    }
    let reader = s.client().await;
    let nats = reader.backend_ref().client().clone();
    s.quiet().await;
    // Each acquisition: one read, and what was sent to the reader's client meanwhile (anything
    // sent late, an event of its write, comes within the quiet time).
    let mut acquire = async |name: &str, opts: &AcquireOptions| {
        let received = || {
            nats.statistics()
                .in_messages
                .load(std::sync::atomic::Ordering::Relaxed)
        };
        let before = received();
        let guard = reader.acquire(name, opts).await.expect("acquire");
        assert_eq!(s.quiet().await, Reads::direct(1), "{name}: the reads");
        (guard, received() - before)
    };
    let (guard, sent) = acquire("rw", &read).await;
    assert_eq!(
        sent,
        1 + 4 + 1,
        "sent to a reader beside readers: its write's answer, four keys, the end"
    );
    let lock = AcquireOptions::default().with_ttl(Duration::from_secs(30));
    let (free, sent) = acquire("free", &lock).await;
    assert_eq!(
        sent,
        1 + 1 + 1,
        "sent to a free lock: its write's answer, its key, the end"
    );
    free.release().await.expect("release");
    guard.release().await.expect("release");
    for guard in held {
        guard.release().await.expect("release");
    }
    let write = AcquireOptions::default().with_ttl(Duration::from_secs(30));
    let writer = holders.acquire("rw", &write).await.expect("write");
    s.quiet().await;
    let waiter = {
        let (reader, read) = (reader.clone(), read.clone());
        tokio::spawn(async move { reader.acquire("rw", &read).await.expect("wait") })
    };
    let reads = s.quiet().await;
    assert!(!waiter.is_finished(), "the reader should wait");
    assert_eq!(
        reads,
        Reads::direct(2),
        "a reader that must wait reads again once subscribed"
    );
    writer.release().await.expect("release");
    let guard = next_holder(&mut vec![waiter]).await;
    assert_eq!(s.quiet().await, Reads::default(), "the woken reader read");
    guard.release().await.expect("release");
}
