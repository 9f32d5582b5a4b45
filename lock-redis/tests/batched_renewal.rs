//! Batched renewal against the real servers: a client holding K locks renews them in about
//! ceil(K / 256) requests per renewal interval (one master, each Redlock master) or
//! ceil(K / masters / 256) per master (Cluster), counted by the servers themselves (`INFO
//! commandstats`, `INFO stats`); and a lock removed behind its holder inside a batch is lost
//! alone.
//!
//! The figures are printed (`--nocapture`): per renewal interval, the idle floor and the
//! watchdog's batches, in the same run. The cost without batching (one request per lock and
//! interval) is measured by `distlock bench --scenario hold`, not here.

mod common;

use std::time::Duration;

use distlock_core::{AcquireOptions, DistributedLock, LockClient, LockGuard, LossReason};
use distlock_redis::{RedisBackend, RedisConfig};
use futures::StreamExt;

/// The tests share servers and read their global counters: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Lease length; the watchdog renews every third of it (1 s).
const TTL: Duration = Duration::from_secs(3);
const INTERVAL: Duration = Duration::from_secs(1);
/// Renewal intervals counted per figure.
const INTERVALS: u32 = 4;
/// The renewer's batch size (`MAX_BATCH` in `src/renew.rs`).
const MAX_BATCH: usize = 256;

fn name(case: &str, i: usize) -> String {
    format!(
        "br-{case}-{}/{i}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    )
}

/// The servers' own counters, summed over the nodes.
#[derive(Clone, Copy, Debug, Default)]
struct Counters {
    /// Every command executed (`INFO commandstats` calls), including those that scripts run.
    calls: f64,
    /// Requests from clients that renew or run scripts: `EVALSHA` and `EVAL` calls.
    scripts: f64,
    /// Reads of client sockets (`total_reads_processed`): about one per round trip.
    reads: f64,
}

impl std::ops::Sub for Counters {
    type Output = Self;
    fn sub(self, o: Self) -> Self {
        Self {
            calls: self.calls - o.calls,
            scripts: self.scripts - o.scripts,
            reads: self.reads - o.reads,
        }
    }
}

impl Counters {
    fn per_interval(self) -> Self {
        let n = f64::from(INTERVALS);
        Self {
            calls: self.calls / n,
            scripts: self.scripts / n,
            reads: self.reads / n,
        }
    }
}

impl std::fmt::Display for Counters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "scripts {:7.1}  commands {:7.1}  reads {:7.1}",
            self.scripts, self.calls, self.reads
        )
    }
}

async fn read_counters(nodes: &[String]) -> Counters {
    let mut total = Counters::default();
    for url in nodes {
        let mut conn = common::raw(url).await;
        for (cmd, calls) in common::command_calls(&mut conn).await {
            // Counts stay far below 2^53: exact as f64.
            let calls = calls as f64;
            total.calls += calls;
            if cmd == "evalsha" || cmd == "eval" {
                total.scripts += calls;
            }
        }
        let stats: String = redis::cmd("INFO")
            .arg("stats")
            .query_async(&mut conn)
            .await
            .expect("INFO stats");
        total.reads += stats
            .lines()
            .find_map(|l| l.strip_prefix("total_reads_processed:"))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0);
    }
    total
}

/// The counters' growth over `INTERVALS` renewal intervals while `during` runs.
async fn window<F: Future<Output = ()>>(nodes: &[String], during: F) -> Counters {
    let before = read_counters(nodes).await;
    during.await;
    read_counters(nodes).await - before
}

async fn hold(
    locks: &LockClient<RedisBackend>,
    case: &str,
    k: usize,
    options: &AcquireOptions,
) -> Vec<LockGuard> {
    futures::stream::iter(0..k)
        .map(|i| {
            let name = name(case, i);
            async move {
                // A Redlock round can miss its node timeout on a loaded machine: try again.
                for _ in 0..2 {
                    if let Ok(Some(guard)) = locks.try_acquire(&name, options).await {
                        return guard;
                    }
                }
                locks
                    .try_acquire(&name, options)
                    .await
                    .expect("acquire")
                    .expect("a fresh name is free")
            }
        })
        .buffer_unordered(64)
        .collect()
        .await
}

async fn release_all(guards: Vec<LockGuard>) {
    futures::stream::iter(guards)
        .for_each_concurrent(64, |g| async move {
            let _ = g.release().await;
        })
        .await;
}

/// The figures of one topology at each K: the idle floor and the batched renewals per
/// renewal interval, from the counters of `nodes` (the masters). Asserts that they need about
/// `expected(K)` script calls per interval (ceil(K / 256) per master that the batch goes
/// to) and that no lock is lost.
async fn figures(
    label: &str,
    config: RedisConfig,
    nodes: &[String],
    ks: &[usize],
    expected: fn(usize) -> usize,
) {
    let locks = distlock_redis::connect_with(config, common::client_config(Duration::from_secs(5)))
        .await
        .expect("connect");
    for &k in ks {
        // The servers are shared: a figure counts only between two quiet floors (other
        // clients' scripts would be counted as ours), else it is measured again.
        for attempt in 1..=ATTEMPTS {
            let quiet = measure(label, &locks, nodes, k, expected).await;
            if quiet {
                break;
            }
            println!("{label} K={k}: other clients ran scripts meanwhile (attempt {attempt})");
            assert!(
                attempt < ATTEMPTS,
                "{label} K={k}: the servers were never quiet"
            );
        }
    }
}

/// How often a figure is measured again while other clients use the servers.
const ATTEMPTS: u32 = 4;

/// One measurement of K locks (see [`figures`]); `false` when the floors around it show
/// other clients' scripts, so that the figures cannot be told apart from theirs.
async fn measure(
    label: &str,
    locks: &LockClient<RedisBackend>,
    nodes: &[String],
    k: usize,
    expected: fn(usize) -> usize,
) -> bool {
    let floor = window(nodes, tokio::time::sleep(INTERVAL * INTERVALS))
        .await
        .per_interval();

    // After: the watchdog's batches, once the schedules aligned (within two rounds).
    let auto = AcquireOptions::default().with_ttl(TTL);
    let guards = hold(locks, "after", k, &auto).await;
    tokio::time::sleep(INTERVAL * 3).await;
    let after = window(nodes, tokio::time::sleep(INTERVAL * INTERVALS))
        .await
        .per_interval();
    let lost = guards.iter().filter(|g| g.is_lost()).count();
    release_all(guards).await;
    let floor_after = window(nodes, tokio::time::sleep(INTERVAL * INTERVALS))
        .await
        .per_interval();

    println!("{label} K={k} floor : {floor}");
    println!("{label} K={k} after : {after}");
    println!("{label} K={k} floor : {floor_after}");
    assert_eq!(lost, 0, "{label} K={k}: locks lost");
    if floor.scripts + floor_after.scripts > 1.0 {
        return false;
    }
    // Aligned schedules: `expected` calls per interval; a round that straddles the
    // alignment, or a part split off by the 256 bound, may add a few.
    let expected = expected(k) as f64;
    assert!(
        after.scripts <= 1.5 * expected + nodes.len() as f64,
        "{label} K={k}: after {after}, floor {floor}, expected {expected}"
    );
    // The renewals were counted: every interval renewed the K locks.
    assert!(
        after.scripts >= 0.75 * expected,
        "{label} K={k}: after {after}, fewer calls than ceil(K / 256) per master, \
         expected {expected}"
    );
    true
}

fn urls() -> Option<Vec<String>> {
    common::urls("redis")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_master_renews_k_locks_in_ceil_k_over_256_requests() {
    let Some(urls) = urls() else { return };
    let _serial = SERIAL.lock().await;
    let config = RedisConfig::single(&urls[0]).expect("url");
    figures("redis", config, &urls[..1], &[1000], |k| {
        k.div_ceil(MAX_BATCH)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_renews_k_locks_in_one_script_per_master_and_batch() {
    let Some(urls) = urls() else { return };
    if urls.len() < 3 {
        return;
    }
    let _serial = SERIAL.lock().await;
    let config = RedisConfig::redlock(&urls[..3]).expect("urls");
    figures("redlock3", config, &urls[..3], &[1000], |k| {
        3 * k.div_ceil(MAX_BATCH)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_renews_k_locks_in_one_script_per_master_and_batch() {
    let Some(url) = common::cluster_url("redis-cluster") else {
        return;
    };
    let _serial = SERIAL.lock().await;
    let mut masters = Vec::new();
    for (_, port) in common::url_hosts(&url) {
        if common::role(port).await.as_deref() == Some("master") {
            masters.push(common::local(port));
        }
    }
    let config = RedisConfig::from_url(&url).expect("url");
    // Batches of 256 per master (768 locks), each spread over the masters.
    figures("cluster", config, &masters, &[1000], |k| {
        3 * k.div_ceil(3 * MAX_BATCH)
    })
    .await;
}

/// Holds `k` locks of every kind the topology offers, removes two behind their holders,
/// and checks that exactly those are lost (RenewalRejected) while the others keep renewing.
async fn one_removed_lock_is_lost_alone(config: RedisConfig, kinds: &[AcquireOptions]) {
    let locks = distlock_redis::connect_with(config, common::client_config(Duration::from_secs(5)))
        .await
        .expect("connect");
    let mut guards = Vec::new();
    for (i, options) in kinds.iter().enumerate() {
        guards.extend(hold(&locks, &format!("lost{i}"), 100, options).await);
    }
    // Aligned into shared batches first.
    tokio::time::sleep(INTERVAL * 3).await;
    let victims = [0, guards.len() - 1];
    for &v in &victims {
        assert!(
            locks
                .force_release(guards[v].name().as_str())
                .await
                .expect("force release"),
            "the lock was held"
        );
    }
    for &v in &victims {
        let reason = tokio::time::timeout(TTL, guards[v].lost())
            .await
            .expect("the removed lock is reported lost within a ttl");
        assert_eq!(reason, LossReason::RenewalRejected);
    }
    // The others keep renewing, longer than their ttl.
    tokio::time::sleep(TTL + INTERVAL).await;
    for (i, guard) in guards.iter().enumerate() {
        if !victims.contains(&i) {
            assert!(!guard.is_lost(), "{} was lost", guard.name());
        }
    }
    release_all(guards).await;
}

fn every_kind() -> Vec<AcquireOptions> {
    let base = AcquireOptions::default().with_ttl(TTL);
    vec![base.clone(), base.clone().shared(), base.with_permits(1000)]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_master_loses_only_the_removed_lock_of_a_batch() {
    let Some(urls) = urls() else { return };
    let _serial = SERIAL.lock().await;
    let config = RedisConfig::single(&urls[0]).expect("url");
    one_removed_lock_is_lost_alone(config, &every_kind()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_loses_only_the_removed_lock_of_a_batch() {
    let Some(urls) = urls() else { return };
    if urls.len() < 3 {
        return;
    }
    let _serial = SERIAL.lock().await;
    let config = RedisConfig::redlock(&urls[..3]).expect("urls");
    let base = AcquireOptions::default().with_ttl(TTL);
    one_removed_lock_is_lost_alone(config, &[base.clone(), base.shared()]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_loses_only_the_removed_lock_of_a_batch() {
    let Some(url) = common::cluster_url("redis-cluster") else {
        return;
    };
    let _serial = SERIAL.lock().await;
    let config = RedisConfig::from_url(&url).expect("url");
    one_removed_lock_is_lost_alone(config, &every_kind()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_renews_in_batches_and_loses_only_the_removed_lock() {
    let Some(url) = common::sentinel_url("redis-sentinel") else {
        return;
    };
    let _serial = SERIAL.lock().await;
    let config = RedisConfig::from_url(&url).expect("url");
    one_removed_lock_is_lost_alone(config, &every_kind()).await;
}
