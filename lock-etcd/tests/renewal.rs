//! Batched renewal, counted by the member's `/metrics`: one client holding K locks sends one
//! keepalive per lease slot and one transaction per 100 keys per renewal interval, not one of
//! each per lock; a lock removed behind its holder is lost alone.
//!
//! Its own test binary, one case at a time: the figures are the whole member's.

mod common;

use std::time::Duration;

use common::Etcd;
use conformance_tests::server_var;
use distlock_core::{AcquireOptions, DistributedLock, LockGuard};

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The ttl of the held locks: renewed every second.
const TTL: Duration = Duration::from_secs(3);
/// The renewal interval (the core's default, a third of the ttl).
const INTERVAL: Duration = Duration::from_secs(1);
/// The most keys one renewal transaction reads (lock-etcd's `CHECKS_PER_TXN`).
const MAX_BATCH: usize = 100;
/// Measured renewal intervals.
const INTERVALS: u32 = 4;

/// Requests the member served: unary KV calls (transactions, ranges) and keepalive messages.
async fn requests(endpoint: &str) -> u64 {
    let body = common::metrics(endpoint).await;
    let value = common::metric_value;
    body.lines()
        .filter(|line| {
            line.starts_with("grpc_server_msg_received_total{")
                && ["Txn", "Range", "LeaseKeepAlive", "Put", "DeleteRange"]
                    .iter()
                    .any(|m| line.contains(&format!("grpc_method=\"{m}\"")))
        })
        .map(value)
        .sum()
}

async fn setup() -> Option<(Etcd, String)> {
    let endpoints = server_var("etcd", "DISTLOCK_TEST_ETCD_ENDPOINTS")?;
    let endpoint = endpoints.split(',').next()?.to_owned();
    Some((Etcd::new(&endpoints, vec!["etcd"]).await, endpoint))
}

async fn window(endpoint: &str) -> u64 {
    let before = requests(endpoint).await;
    tokio::time::sleep(INTERVAL * INTERVALS).await;
    requests(endpoint).await - before
}

async fn hold(etcd: &Etcd, endpoint: &str, k: usize) -> (u64, u64) {
    let client = etcd.client().await.unwrap();
    let idle = window(endpoint).await;
    let run = uuid::Uuid::new_v4().simple().to_string();
    let opts = AcquireOptions::default().with_ttl(TTL);
    let names: Vec<String> = (0..k).map(|i| format!("renew-{}-{i}", &run[..8])).collect();
    let mut guards: Vec<LockGuard> = Vec::with_capacity(k);
    for chunk in names.chunks(50) {
        let taken = futures::future::join_all(chunk.iter().map(|n| client.try_acquire(n, &opts)));
        for guard in taken.await {
            guards.push(guard.unwrap().expect("a free name"));
        }
    }
    // Two rounds align the leases' schedules (watchdog.rs).
    tokio::time::sleep(TTL).await;
    let held = window(endpoint).await;
    let lost = guards.iter().filter(|g| g.is_lost()).count();
    let per_interval = (held as f64 - idle as f64) / f64::from(INTERVALS);
    eprintln!(
        "K = {k}: {held} requests in {INTERVALS} renewal intervals, idle {idle}: {per_interval:.1} per interval; {lost} lost"
    );
    assert_eq!(lost, 0, "locks lost while renewed");
    for result in futures::future::join_all(guards.into_iter().map(LockGuard::release)).await {
        result.unwrap();
    }
    (held, idle)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k_locks_cost_a_keepalive_and_a_txn_per_100_per_interval() {
    let _serial = SERIAL.lock().await;
    let Some((etcd, endpoint)) = setup().await else {
        return;
    };
    let k = 1000;
    let (held, idle) = hold(&etcd, &endpoint, k).await;
    // A keepalive and ceil(K / 100) transactions per interval.
    let expected = (1 + k.div_ceil(MAX_BATCH)) as u64 * u64::from(INTERVALS);
    assert!(
        held.saturating_sub(idle) <= expected + expected / 2 + 4,
        "K = {k}: {held} requests (idle {idle}), {expected} expected"
    );
    // And the renewals were counted.
    assert!(
        held.saturating_sub(idle) >= expected / 2,
        "K = {k}: only {held} requests (idle {idle}), {expected} expected"
    );
}
