//! `distlock::blocking`: the conformance subset (exclusion, timeout, release, loss) from plain
//! threads on the memory backend, a SQLite file and Redis; where blocking calls may be made
//! (plain threads, `spawn_blocking` of both runtime flavours) and the typed error where they
//! may not (async contexts).
#![cfg(feature = "blocking")]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use distlock::blocking::{self, Client};
use distlock::{AcquireOptions, Error, LossReason, Renewal};

/// A name prefix unique to this run.
fn prefix() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("blocking-{}-{nanos}", std::process::id())
}

/// One backend configuration: a URL and the timing of its cases.
struct Config {
    url: String,
    ttl: Duration,
    slack: Duration,
}

impl Config {
    fn client(&self) -> Client {
        let config =
            distlock::ClientConfig::default().with_operation_timeout(Duration::from_secs(2));
        blocking::connect_with(&self.url, config)
            .unwrap_or_else(|err| panic!("connect {}: {err}", self.url))
    }

    fn opts(&self) -> AcquireOptions {
        AcquireOptions::default()
            .with_ttl(self.ttl)
            .with_wait(Duration::from_secs(30))
    }
}

/// 4 threads x 25 acquisitions, each with a client of its own: a deliberately non-atomic
/// counter ends exact, and never more than one holder at a time.
fn exclusion(config: &Config, name: &str) {
    const THREADS: usize = 4;
    const ROUNDS: u64 = 25;
    let counter = Arc::new(AtomicU64::new(0));
    let holders = Arc::new(AtomicUsize::new(0));
    let max_holders = Arc::new(AtomicUsize::new(0));
    std::thread::scope(|scope| {
        for _ in 0..THREADS {
            let client = config.client();
            let (counter, holders, max_holders) = (&counter, &holders, &max_holders);
            scope.spawn(move || {
                for _ in 0..ROUNDS {
                    let guard = client.acquire(name, &config.opts()).unwrap();
                    let now = holders.fetch_add(1, Ordering::SeqCst) + 1;
                    max_holders.fetch_max(now, Ordering::SeqCst);
                    let value = counter.load(Ordering::SeqCst);
                    std::thread::yield_now();
                    counter.store(value + 1, Ordering::SeqCst);
                    holders.fetch_sub(1, Ordering::SeqCst);
                    assert!(!guard.is_lost(), "lost inside a short critical section");
                    guard.release().unwrap();
                }
            });
        }
    });
    assert_eq!(max_holders.load(Ordering::SeqCst), 1, "two holders at once");
    assert_eq!(counter.load(Ordering::SeqCst), THREADS as u64 * ROUNDS);
}

/// `try_acquire` on a held lock is `Ok(None)`; `acquire` with a deadline fails with `Timeout`
/// not before it nor long after, and leaves nothing behind.
fn timeout(config: &Config, name: &str) {
    let (a, b) = (config.client(), config.client());
    let guard = a.acquire(name, &config.opts()).unwrap();
    assert!(b.try_acquire(name, &config.opts()).unwrap().is_none());
    let wait = Duration::from_millis(500);
    let started = Instant::now();
    let result = b.acquire(name, &config.opts().with_wait(wait));
    let took = started.elapsed();
    assert!(matches!(result, Err(Error::Timeout { .. })), "{result:?}");
    assert!(took >= wait, "timed out after {took:?}, before {wait:?}");
    assert!(took <= wait + config.slack, "timed out after {took:?}");
    assert!(!guard.is_lost());
    guard.release().unwrap();
    let next = b.try_acquire(name, &config.opts()).unwrap();
    next.expect("a timed-out waiter left something behind")
        .release()
        .unwrap();
}

/// `release` frees the lock at once and wakes a blocked waiter (a thread); dropping a guard
/// releases it before the drop returns.
fn release(config: &Config, name: &str) {
    let (a, b) = (config.client(), config.client());
    let long = config.opts().with_ttl(Duration::from_secs(30));
    let guard = a.acquire(name, &long).unwrap();
    let first = guard.token();
    guard.release().unwrap();
    let guard = b.try_acquire(name, &long).unwrap().expect("released: free");
    assert!(guard.token() > first, "tokens increase");
    let waiter = std::thread::spawn({
        let (a, long, name) = (a.clone(), long.clone(), name.to_owned());
        move || {
            let guard = a.acquire(&name, &long).unwrap();
            (Instant::now(), guard)
        }
    });
    std::thread::sleep(config.slack);
    assert!(!waiter.is_finished(), "the waiter got a held lock");
    let released = Instant::now();
    guard.release().unwrap();
    let (acquired, guard) = waiter.join().unwrap();
    let handoff = acquired - released;
    let bound = config.slack + long.backoff.max;
    assert!(handoff < bound, "woken {handoff:?} after the release");
    drop(guard); // blocks until released
    let again = b.try_acquire(name, &long).unwrap();
    again
        .expect("a dropped guard's lock is free")
        .release()
        .unwrap();
}

/// Loss: a lock removed behind its holder is reported through `wait_lost` within a renewal
/// interval, and its release fails; an unrenewed lease is reported expired; an abandoned
/// lock is free for others after its ttl, not before.
fn loss(config: &Config, name: &str) {
    let (a, b) = (config.client(), config.client());
    let opts = config.opts();
    let interval = opts.renewal_interval().expect("renewal is on");
    let guard = a.acquire(name, &opts).unwrap();
    assert_eq!(
        guard.wait_lost_timeout(Duration::from_millis(50)).unwrap(),
        None
    );
    assert!(b.force_release(name).unwrap());
    let removed = Instant::now();
    let reason = guard.wait_lost().unwrap();
    assert!(
        removed.elapsed() <= interval + config.slack,
        "reported {:?} after the removal",
        removed.elapsed()
    );
    assert_eq!(reason, LossReason::RenewalRejected);
    assert!(guard.is_lost());
    assert!(guard.release().is_err(), "released a removed lock");

    let once = opts.clone().with_renewal(Renewal::disabled());
    let guard = b.acquire(name, &once).unwrap();
    let reason = guard
        .wait_lost_timeout(config.ttl + config.slack)
        .unwrap()
        .expect("an unrenewed lease expires");
    assert_eq!(reason, LossReason::LeaseExpired);
    assert!(Instant::now() >= guard.valid_until());
    drop(guard);

    let sent = Instant::now();
    let guard = a.acquire(name, &once).unwrap();
    guard.abandon();
    let taken = b.acquire(name, &once).unwrap();
    assert!(
        sent.elapsed() >= config.ttl,
        "an abandoned lock was free before its ttl"
    );
    taken.release().unwrap();
}

/// The subset, each case on names of its own.
fn subset(config: &Config) {
    let prefix = prefix();
    exclusion(config, &format!("{prefix}/exclusion"));
    timeout(config, &format!("{prefix}/timeout"));
    release(config, &format!("{prefix}/release"));
    loss(config, &format!("{prefix}/loss"));
}

#[test]
fn conformance_subset_on_memory() {
    subset(&Config {
        url: format!("memory://{}", prefix()),
        ttl: Duration::from_millis(300),
        slack: Duration::from_millis(300),
    });
}

#[cfg(feature = "sqlite")]
#[test]
fn conformance_subset_on_sqlite() {
    let dir = std::env::temp_dir().join(prefix());
    std::fs::create_dir_all(&dir).unwrap();
    subset(&Config {
        url: format!("sqlite://{}", dir.join("locks.db").display()),
        ttl: Duration::from_millis(1000),
        slack: Duration::from_millis(700),
    });
    std::fs::remove_dir_all(&dir).ok();
}

#[cfg(feature = "redis")]
#[test]
fn conformance_subset_on_redis() {
    let Some(urls) = conformance_tests::server_var("redis", "DISTLOCK_TEST_REDIS_URLS") else {
        return;
    };
    let first = urls.split(',').next().unwrap_or_default().trim();
    subset(&Config {
        url: first.to_owned(),
        ttl: Duration::from_millis(1000),
        slack: Duration::from_millis(700),
    });
}

/// Blocking calls work from threads of other runtimes' blocking pools, on both flavours.
#[test]
fn works_from_spawn_blocking_of_both_runtime_flavours() {
    let client = blocking::connect(&format!("memory://{}", prefix())).unwrap();
    let opts = AcquireOptions::default();
    let flavours = [
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap(),
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap(),
    ];
    for runtime in flavours {
        let (client, opts) = (client.clone(), opts.clone());
        let token = runtime.block_on(async move {
            tokio::task::spawn_blocking(move || {
                let guard = client.acquire("spawn-blocking", &opts)?;
                let token = guard.token();
                drop(guard); // released before the drop returns
                assert!(client.inspect("spawn-blocking")?.is_none());
                Ok::<_, Error>(token)
            })
            .await
            .unwrap()
        });
        assert!(token.unwrap().get() > 0);
    }
}

/// In an async context every blocking call is refused with a typed error, not a panic; a
/// guard dropped there releases in the background.
#[test]
fn async_contexts_get_a_typed_error() {
    let url = format!("memory://{}", prefix());
    let client = blocking::connect(&url).unwrap();
    let guard = client.acquire("held", &AcquireOptions::default()).unwrap();
    let refused = |result: Result<(), Error>, what: &str| match result {
        Err(Error::BlockingInAsyncContext { .. }) => {}
        other => panic!("{what}: expected BlockingInAsyncContext, got {other:?}"),
    };
    let current = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let multi = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // In `block_on` itself, and in a spawned task.
    current.block_on(async {
        refused(blocking::connect(&url).map(drop), "connect in block_on");
        let opts = AcquireOptions::default();
        refused(client.try_acquire("x", &opts).map(drop), "try_acquire");
        refused(guard.renew(), "renew");
        refused(guard.wait_lost().map(drop), "wait_lost");
    });
    let in_task = {
        let client = client.clone();
        multi.block_on(async move {
            tokio::spawn(async move {
                let opts = AcquireOptions::default();
                client.acquire("y", &opts).map(drop)
            })
            .await
            .unwrap()
        })
    };
    refused(in_task, "acquire in a task");
    // Dropped in an async context: released from the client's runtime, without blocking.
    multi.block_on(async move { drop(guard) });
    let deadline = Instant::now() + Duration::from_secs(5);
    while client.inspect("held").unwrap().is_some() {
        assert!(
            Instant::now() < deadline,
            "the dropped guard was not released"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // The same thread may block again once out of the async context.
    let guard = client.acquire("held", &AcquireOptions::default()).unwrap();
    guard.release().unwrap();
}

/// The other primitives: read-write, semaphore, multi-lock and election, blocking.
#[test]
fn primitives_block_too() {
    let client = blocking::connect(&format!("memory://{}", prefix())).unwrap();
    let opts = AcquireOptions::default().with_wait(Duration::from_millis(100));
    // Read-write: readers share, a writer waits.
    let r1 = client.acquire("rw", &opts.clone().shared()).unwrap();
    let r2 = client.acquire("rw", &opts.clone().shared()).unwrap();
    assert!(client.try_acquire("rw", &opts).unwrap().is_none());
    r1.release().unwrap();
    r2.release().unwrap();
    client.acquire("rw", &opts).unwrap().release().unwrap();
    // Semaphore of 2.
    let permits = opts.clone().with_permits(2);
    let p1 = client.acquire("sem", &permits).unwrap();
    let p2 = client.acquire("sem", &permits).unwrap();
    assert!(matches!(
        client.acquire("sem", &permits),
        Err(Error::Timeout { .. })
    ));
    drop((p1, p2));
    // Multi-lock: all or nothing.
    let all = client.acquire_all(&["m/b", "m/a"], &opts).unwrap();
    assert_eq!(all.guards().len(), 2);
    assert!(all.token("m/a").is_some());
    assert!(
        client
            .try_acquire_all(&["m/a", "m/c"], &opts)
            .unwrap()
            .is_none()
    );
    assert!(client.try_acquire("m/c", &opts).unwrap().is_some());
    all.release().unwrap();
    // Election: a leader with its value and term, observed.
    let mut observer = client.observe("election", Duration::from_millis(50));
    assert_eq!(observer.next().unwrap().unwrap(), None);
    let leader = client.campaign("election", "node-1", &opts).unwrap();
    let seen = observer
        .next_timeout(Duration::from_secs(5))
        .unwrap()
        .expect("a change")
        .expect("a leader");
    assert_eq!(seen.value.as_deref(), Some("node-1"));
    assert_eq!(seen.term, Some(leader.token()));
    let read = client.leader("election").unwrap().expect("a leader");
    assert_eq!(read.value.as_deref(), Some("node-1"));
    leader.release().unwrap();
}

/// `release_after` blocks until the minimum hold has passed, then frees the lock.
#[test]
fn release_after_holds_until_the_minimum() {
    let client = blocking::connect(&format!("memory://{}", prefix())).unwrap();
    let opts = AcquireOptions::default().with_ttl(Duration::from_millis(300));
    let started = Instant::now();
    let guard = client.acquire("cron-job", &opts).unwrap();
    let minimum = Duration::from_millis(900);
    guard.release_after(minimum).unwrap();
    assert!(started.elapsed() >= minimum, "released before the minimum");
    assert!(client.inspect("cron-job").unwrap().is_none());
}
