//! Redis-specific behaviour of shared holds, permits and election observers: pruning of
//! expired permit holders, a crashed reader under a waiting writer, targeted wake-ups counted
//! by the server's own statistics, and observers woken by client-side-caching pushes.
//!
//! The wake-up counts read `INFO commandstats` of the first master, which counts every command
//! of every client: those tests hold `STATS` exclusively, every other test of this binary
//! holds it shared.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use distlock_core::{AcquireOptions, Backoff, DistributedLock, LockClient, LockKind, Renewal};
use distlock_redis::{LockKeys, RedisBackend};
use futures::StreamExt;

static STATS: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

const OP: Duration = Duration::from_secs(2);
/// Generous bound for things that happen at once (a debug build on a busy 2-core machine).
const SLACK: Duration = Duration::from_millis(1500);

fn name(case: &str) -> String {
    format!(
        "rk-{}/{case}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    )
}

fn opts() -> AcquireOptions {
    AcquireOptions::default()
        .with_ttl(Duration::from_secs(10))
        .with_wait(Duration::from_secs(30))
}

async fn client(urls: &[String]) -> LockClient<RedisBackend> {
    distlock_redis::connect_with(common::config(urls, false), common::client_config(OP))
        .await
        .expect("connect")
}

/// A client whose waiters only poll on their own every 10 s (waiter timeout 30 s, with
/// [`herd_opts`]): any poll within a second of a release was woken by it.
async fn quiet_client(urls: &[String]) -> LockClient<RedisBackend> {
    let config = common::config(urls, false).with_waiter_timeout(Duration::from_secs(30));
    distlock_redis::connect_with(config, common::client_config(OP))
        .await
        .expect("connect")
}

/// Waiters that poll on their own only every 10 s: the backoff's maximum (the safety net of
/// an event-driven backend) and the queue refresh (a third of the waiter timeout) both.
fn herd_opts() -> AcquireOptions {
    AcquireOptions::default()
        .with_ttl(Duration::from_secs(30))
        .with_wait(Duration::from_secs(30))
        .with_backoff(Backoff::new(
            Duration::from_millis(2),
            Duration::from_secs(10),
        ))
}

async fn zcard(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> usize {
    redis::cmd("ZCARD")
        .arg(key)
        .query_async(conn)
        .await
        .expect("ZCARD")
}

async fn zscore(conn: &mut redis::aio::MultiplexedConnection, key: &str, member: &str) -> bool {
    let score: Option<f64> = redis::cmd("ZSCORE")
        .arg(key)
        .arg(member)
        .query_async(conn)
        .await
        .expect("ZSCORE");
    score.is_some()
}

/// A permit holder that crashed (renewal stopped, never released) stays in the holders' set
/// until the next acquirer's script prunes it; it is never counted once its lease is over.
#[tokio::test]
async fn an_expired_permit_holder_is_pruned_by_the_next_acquirer() {
    let Some(urls) = common::urls("redis") else {
        return;
    };
    let _shared = STATS.read().await;
    let (a, b) = (client(&urls[..1]).await, client(&urls[..1]).await);
    let name = name("prune");
    let keys = LockKeys::for_name(&name).unwrap();
    let mut raw = common::raw(&urls[0]).await;
    let sem = opts().with_permits(2);
    let short = Duration::from_millis(400);
    let crashed = a
        .acquire(
            &name,
            &sem.clone()
                .with_ttl(short)
                .with_renewal(Renewal::disabled()),
        )
        .await
        .unwrap();
    let crashed_owner = a.inspect(&name).await.unwrap().expect("held").owner;
    crashed.abandon();
    let kept = b.acquire(&name, &sem).await.unwrap();
    assert_eq!(zcard(&mut raw, &keys.holders()).await, 2);
    tokio::time::sleep(short + Duration::from_millis(100)).await;
    // Nobody ran a script since: the expired holder is still in the set, but not counted.
    assert_eq!(zcard(&mut raw, &keys.holders()).await, 2);
    let info = a.inspect(&name).await.unwrap().expect("held");
    assert_eq!(
        (info.kind, info.holders),
        (LockKind::Permit { permits: 2 }, 1)
    );
    let third = a
        .try_acquire(&name, &sem)
        .await
        .unwrap()
        .expect("the expired permit was still counted");
    assert_eq!(zcard(&mut raw, &keys.holders()).await, 2);
    assert!(
        !zscore(&mut raw, &keys.holders(), &crashed_owner).await,
        "the expired holder was not pruned"
    );
    let token: Option<u64> = redis::cmd("HGET")
        .arg(keys.tokens())
        .arg(&crashed_owner)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(token, None, "the expired holder's token stayed");
    third.release().await.unwrap();
    kept.release().await.unwrap();
    let left: usize = redis::cmd("EXISTS")
        .arg(&keys.lock)
        .arg(keys.holders())
        .arg(keys.tokens())
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(left, 0, "the last release left keys behind");
}

/// The remaining lives (`PTTL`, ms) of the lock key and the holders' keys.
async fn lives(conn: &mut redis::aio::MultiplexedConnection, keys: &LockKeys) -> [i64; 4] {
    let mut lives = [0; 4];
    for (life, key) in lives.iter_mut().zip([
        keys.lock.clone(),
        keys.holders(),
        keys.tokens(),
        keys.data(),
    ]) {
        *life = redis::cmd("PTTL")
            .arg(key)
            .query_async(conn)
            .await
            .expect("PTTL");
    }
    lives
}

/// The lock key (the readers' marker) and the holders' keys last to the latest read lease. A
/// reader whose lease ends before another's leaves them as they are, with no `PEXPIRE`; the
/// reader whose lease ends last shrinks them to the latest lease left, and so does any
/// leaver when the marker outlasts every hold.
#[tokio::test]
async fn the_readers_marker_lasts_to_the_latest_lease_left() {
    let Some(mut herd) = Herd::start("marker-life").await else {
        return;
    };
    let c = client(&herd.urls[..1]).await;
    let read = |secs| {
        opts()
            .shared()
            .with_ttl(Duration::from_secs(secs))
            .with_renewal(Renewal::disabled())
    };
    let long = c.acquire(&herd.name, &read(60)).await.unwrap();
    let short = c.acquire(&herd.name, &read(20)).await.unwrap();
    long.set_data(Some("long")).await.unwrap();
    // The data key lives a lease longer than the lock key (see `SET_DATA`).
    let lasting = |lives: [i64; 4]| {
        let [lock, holders, tokens, data] = lives;
        for life in [lock, holders, tokens] {
            assert!((50_000..=60_000).contains(&life), "a life of {life} ms");
        }
        assert!(
            (lock..=lock + 60_000).contains(&data),
            "data lives {data} ms"
        );
    };
    lasting(lives(&mut herd.raw, &herd.keys).await);
    let before = common::command_calls(&mut herd.raw).await;
    short.release().await.unwrap();
    let after = common::command_calls(&mut herd.raw).await;
    let pexpires = |stats: &HashMap<String, u64>| stats.get("pexpire").copied().unwrap_or(0);
    assert_eq!(
        pexpires(&after),
        pexpires(&before),
        "a release before the latest lease set the keys' lives again"
    );
    lasting(lives(&mut herd.raw, &herd.keys).await);
    let later = c.acquire(&herd.name, &read(20)).await.unwrap();
    later.set_data(Some("later")).await.unwrap();
    long.release().await.unwrap();
    for life in lives(&mut herd.raw, &herd.keys).await {
        assert!(
            (10_000..=20_000).contains(&life),
            "a life of {life} ms after the latest lease left, 20 s to the next"
        );
    }
    assert!(
        c.try_acquire(&herd.name, &opts()).await.unwrap().is_none(),
        "a writer got in beside a live reader"
    );
    // A marker that outlasts every hold (as a hand-over's longer lease leaves it) is shrunk by
    // a leaver whose lease did not end last, too.
    let other = c.acquire(&herd.name, &read(20)).await.unwrap();
    let _: () = redis::cmd("PEXPIRE")
        .arg(&herd.keys.lock)
        .arg(60_000)
        .query_async(&mut herd.raw)
        .await
        .unwrap();
    later.release().await.unwrap();
    let [lock, ..] = lives(&mut herd.raw, &herd.keys).await;
    assert!(
        (10_000..=20_000).contains(&lock),
        "the lock key lives {lock} ms beyond the holds' 20 s"
    );
    other.release().await.unwrap();
    let left: usize = redis::cmd("EXISTS")
        .arg(&herd.keys.lock)
        .arg(herd.keys.holders())
        .arg(herd.keys.tokens())
        .arg(herd.keys.data())
        .query_async(&mut herd.raw)
        .await
        .unwrap();
    assert_eq!(left, 0, "the last release left keys behind");
}

/// A reader that crashed blocks a waiting writer until its lease ends, not longer; the writer
/// then gets the lock with a higher token, and the crashed reader's renewal is refused.
#[tokio::test]
async fn a_crashed_reader_frees_the_lock_for_a_waiting_writer_after_its_ttl() {
    let Some(urls) = common::urls("redis") else {
        return;
    };
    let _shared = STATS.read().await;
    let (r, w) = (client(&urls[..1]).await, client(&urls[..1]).await);
    let name = name("reader-crash");
    let ttl = Duration::from_millis(800);
    let sent = Instant::now();
    let reader = r
        .acquire(
            &name,
            &opts()
                .shared()
                .with_ttl(ttl)
                .with_renewal(Renewal::disabled()),
        )
        .await
        .unwrap();
    let reader_token = reader.token();
    let answered = Instant::now();
    reader.abandon();
    let writer = w.acquire(&name, &opts()).await.unwrap();
    let taken = Instant::now();
    assert!(
        taken >= sent + ttl,
        "the writer got in {:?} after the reader, before its ttl {ttl:?}",
        taken - sent
    );
    assert!(
        taken <= answered + ttl + SLACK,
        "the writer waited {:?} for a reader of ttl {ttl:?}",
        taken - answered
    );
    assert!(writer.token() > reader_token);
    let info = w.inspect(&name).await.unwrap().expect("held");
    assert_eq!((info.kind, info.holders), (LockKind::Exclusive, 1));
    writer.release().await.unwrap();
}

/// The script calls (`EVALSHA`) and publishes since `before`.
async fn scripts_and_publishes(
    conn: &mut redis::aio::MultiplexedConnection,
    before: &HashMap<String, u64>,
) -> (u64, u64) {
    let now = common::command_calls(conn).await;
    let delta =
        |cmd: &str| now.get(cmd).copied().unwrap_or(0) - before.get(cmd).copied().unwrap_or(0);
    (delta("evalsha"), delta("publish"))
}

/// Waits until `subscribers` clients listen on `channel` and the server has then seen no
/// script call for a while: every waiter has queued, subscribed and polled again, and now
/// sleeps until a wake-up (its timers are seconds away). The subscriptions are awaited first:
/// a waiter's new subscriber connection took longer than the quiet time in a loaded CI run,
/// and its poll after subscribing then counted as a wake-up's (2026-12-02).
async fn settled(
    conn: &mut redis::aio::MultiplexedConnection,
    channel: &str,
    subscribers: usize,
) -> HashMap<String, u64> {
    let deadline = Instant::now() + SLACK * 4;
    loop {
        let (_, listening): (String, usize) = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(channel)
            .query_async(conn)
            .await
            .expect("PUBSUB NUMSUB");
        if listening >= subscribers {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{listening} of {subscribers} waiters subscribed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut last = common::command_calls(conn).await;
    loop {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = common::command_calls(conn).await;
        if now.get("evalsha") == last.get("evalsha") {
            return now;
        }
        last = now;
    }
}

/// A wake-up count's setup: the masters, a fresh name and its keys, a raw connection to the
/// first master, and `STATS` held exclusively.
struct Herd {
    urls: Vec<String>,
    name: String,
    keys: LockKeys,
    raw: redis::aio::MultiplexedConnection,
    _exclusive: tokio::sync::RwLockWriteGuard<'static, ()>,
}

impl Herd {
    async fn start(case: &str) -> Option<Self> {
        let urls = common::urls("redis")?;
        let _exclusive = STATS.write().await;
        let name = name(case);
        let keys = LockKeys::for_name(&name).unwrap();
        let raw = common::raw(&urls[0]).await;
        Some(Self {
            urls,
            name,
            keys,
            raw,
            _exclusive,
        })
    }
}

/// Readers queued behind a waiting writer, and a release of the reader holding the lock: only
/// the writer is woken, and holds on the release's hand-over (no script call besides the
/// release); the writer's release then hands the lock to the readers (all of them, in one
/// message, none polling), and nobody else.
#[tokio::test]
async fn a_release_wakes_only_the_waiters_it_unblocks_read_write() {
    const READERS: usize = 5;
    let Some(mut herd) = Herd::start("herd-rw").await else {
        return;
    };
    let (urls, name, keys, raw) = (&herd.urls, &herd.name, &herd.keys, &mut herd.raw);
    let holder = quiet_client(&urls[..1]).await;
    let reader = holder.acquire(name, &herd_opts().shared()).await.unwrap();
    let writer = {
        let (locks, name) = (quiet_client(&urls[..1]).await, name.clone());
        tokio::spawn(async move { locks.acquire(&name, &herd_opts()).await })
    };
    while zcard(raw, &keys.queue).await < 1 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut readers = Vec::new();
    for _ in 0..READERS {
        let (locks, name) = (quiet_client(&urls[..1]).await, name.clone());
        readers.push(tokio::spawn(async move {
            locks.acquire(&name, &herd_opts().shared()).await
        }));
    }
    while zcard(raw, &keys.queue).await < 1 + READERS {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let before = settled(raw, &keys.channel, 1 + READERS).await;
    reader.release().await.unwrap();
    let writer = tokio::time::timeout(SLACK, writer)
        .await
        .expect("the writer was not woken")
        .unwrap()
        .unwrap();
    let after_release = settled(raw, &keys.channel, READERS).await;
    let (scripts, publishes) = scripts_and_publishes(raw, &before).await;
    assert_eq!(
        (scripts, publishes),
        (1, 1),
        "a reader's release with 1 writer and {READERS} readers waiting: \
         the release alone (it hands the lock over: the writer holds on its message)"
    );
    assert!(readers.iter().all(|r| !r.is_finished()));
    writer.release().await.unwrap();
    for r in readers {
        let guard = tokio::time::timeout(SLACK, r)
            .await
            .expect("a reader was not woken by the writer's release")
            .unwrap()
            .unwrap();
        guard.release().await.unwrap();
    }
    // The writer's release alone (it hands the lock to the readers; their releases come
    // after).
    let (scripts, publishes) = scripts_and_publishes(raw, &after_release).await;
    assert_eq!(
        (scripts - READERS as u64, publishes),
        (1, 1),
        "a writer's release with {READERS} readers waiting: one message, no poll"
    );
}

/// A released permit goes to the one permit waiter that now fits (handed over: it holds on
/// the release's message, with no poll), and wakes nobody else.
#[tokio::test]
async fn a_release_wakes_only_the_waiters_it_unblocks_permits() {
    const WAITERS: usize = 4;
    let Some(mut herd) = Herd::start("herd-sem").await else {
        return;
    };
    let (urls, name, keys, raw) = (&herd.urls, &herd.name, &herd.keys, &mut herd.raw);
    let sem = herd_opts().with_permits(2);
    let holder = quiet_client(&urls[..1]).await;
    let first = holder.acquire(name, &sem).await.unwrap();
    let second = holder.acquire(name, &sem).await.unwrap();
    let mut waiters = Vec::new();
    for _ in 0..WAITERS {
        let (locks, name, sem) = (quiet_client(&urls[..1]).await, name.clone(), sem.clone());
        waiters.push(tokio::spawn(
            async move { locks.acquire(&name, &sem).await },
        ));
    }
    while zcard(raw, &keys.queue).await < WAITERS {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let before = settled(raw, &keys.channel, WAITERS).await;
    first.release().await.unwrap();
    let deadline = Instant::now() + SLACK;
    while zcard(raw, &keys.queue).await != WAITERS - 1 {
        assert!(Instant::now() < deadline, "no permit waiter got the permit");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    settled(raw, &keys.channel, WAITERS - 1).await;
    let (scripts, publishes) = scripts_and_publishes(raw, &before).await;
    assert_eq!(
        (scripts, publishes),
        (1, 1),
        "a released permit with {WAITERS} waiters: the release alone (it hands the permit \
         over: the waiter holds on its message)"
    );
    assert_eq!(waiters.iter().filter(|w| w.is_finished()).count(), 1);
    second.release().await.unwrap();
    for w in waiters {
        let guard = tokio::time::timeout(SLACK * 2, w)
            .await
            .expect("a permit waiter was never served")
            .unwrap()
            .unwrap();
        guard.release().await.unwrap();
    }
}

/// Election observers are woken by the server's invalidation pushes, not by their interval:
/// with an interval of an hour, each new leader (taken by the fast path, which publishes
/// nothing) and each resignation (with nobody queued, which publishes nothing) is seen at once.
#[tokio::test]
async fn election_observers_are_woken_by_tracking_pushes() {
    let Some(urls) = common::urls("redis") else {
        return;
    };
    let _shared = STATS.read().await;
    for nodes in [1, 3] {
        let (observer, candidate) = (client(&urls[..nodes]).await, client(&urls[..nodes]).await);
        let name = name("observed");
        let mut changes = observer.observe(&name, Duration::from_secs(3600));
        let mut next = async || {
            tokio::time::timeout(SLACK, changes.next())
                .await
                .unwrap_or_else(|_| panic!("{nodes} node(s): no change seen: not woken"))
                .expect("the observation ended")
                .expect("an observation failed")
        };
        assert_eq!(next().await, None);
        for value in ["a", "b"] {
            let term = candidate.campaign(&name, value, &opts()).await.unwrap();
            let leader = next().await.expect("a leader");
            assert_eq!(leader.value.as_deref(), Some(value));
            term.release().await.unwrap();
            assert_eq!(next().await, None, "the resignation was not seen");
        }
    }
}
