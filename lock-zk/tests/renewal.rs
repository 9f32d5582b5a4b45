//! Batched renewal, counted by the server: one client holding K locks sends about
//! ceil(K / 500) requests per renewal interval (`mntr`'s `zk_packets_received`), not K; a
//! lock removed behind its holder is lost alone.
//!
//! Its own test binary, one case at a time: the figures are the whole server's.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::ZkHarness;
use distlock_core::{AcquireOptions, DistributedLock, LockGuard};

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The ttl of the held locks: renewed every second.
const TTL: Duration = Duration::from_secs(3);
/// The renewal interval (the core's default, a third of the ttl).
const INTERVAL: Duration = Duration::from_secs(1);
/// The most nodes one renewal `multi` carries (lock-zk's `renew::MAX_BATCH`).
const MAX_BATCH: usize = 500;
/// Measured renewal intervals.
const INTERVALS: u32 = 4;

async fn harness() -> Option<ZkHarness> {
    let server = conformance_tests::server_var("zk", "DISTLOCK_TEST_ZK_CONNECT")?;
    Some(ZkHarness::new(&server).await)
}

/// The server's `mntr` figures.
async fn mntr(h: &ZkHarness) -> HashMap<String, i64> {
    common::mntr(&h.server).await
}

async fn packets(h: &ZkHarness) -> i64 {
    mntr(h).await["zk_packets_received"]
}

/// Requests the server received over `INTERVALS` renewal intervals, and the idle background
/// over as long measured first.
async fn window(h: &ZkHarness) -> i64 {
    let before = packets(h).await;
    tokio::time::sleep(INTERVAL * INTERVALS).await;
    packets(h).await - before
}

async fn hold(h: &ZkHarness, k: usize) -> (i64, i64) {
    let client = h.backend().await.unwrap();
    let idle = window(h).await;
    let run = uuid::Uuid::new_v4().simple().to_string();
    let opts = AcquireOptions::default().with_ttl(TTL);
    let mut guards: Vec<LockGuard> = Vec::with_capacity(k);
    let names: Vec<String> = (0..k).map(|i| format!("renew-{}-{i}", &run[..8])).collect();
    for chunk in names.chunks(50) {
        let taken = futures::future::join_all(chunk.iter().map(|n| client.try_acquire(n, &opts)));
        for guard in taken.await {
            guards.push(guard.unwrap().expect("a free name"));
        }
    }
    // Two rounds align the leases' schedules (watchdog.rs).
    tokio::time::sleep(TTL).await;
    let held = window(h).await;
    let lost = guards.iter().filter(|g| g.is_lost()).count();
    let per_interval = (held - idle) as f64 / f64::from(INTERVALS);
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
async fn k_locks_cost_a_multi_per_500_per_interval() {
    let _serial = SERIAL.lock().await;
    let Some(h) = harness().await else { return };
    let k = 1000;
    let (held, idle) = hold(&h, k).await;
    let batches = k.div_ceil(MAX_BATCH) as i64 * i64::from(INTERVALS);
    // Slack: a ping or two of the client (and of anybody else on the server).
    assert!(
        held - idle <= batches + 6,
        "K = {k}: {held} requests (idle {idle}) for {batches} renewal batches"
    );
    // And the renewals were counted.
    assert!(
        held - idle >= batches / 2,
        "K = {k}: only {held} requests (idle {idle}) for {batches} renewal batches"
    );
}

/// Holder data set while batched renewals rewrite the same nodes is what the next read shows:
/// a renewal whose request was built before the `set_data` must not reach the server after it
/// and bring the old data back. Before the fix, `inspect` right after a `set_data` showed the
/// previous data now and then (first seen in CI, in the conformance case on holder data).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_set_during_batched_renewals_is_never_undone() {
    let _serial = SERIAL.lock().await;
    let Some(h) = harness().await else { return };
    let client = h.backend().await.unwrap();
    let run = uuid::Uuid::new_v4().simple().to_string();
    // Renewed every 300 ms, in one multi of 500 nodes: a wide window for the race.
    let opts = AcquireOptions::default().with_ttl(Duration::from_millis(900));
    let names: Vec<String> = (0..MAX_BATCH)
        .map(|i| format!("data-{}-{i}", &run[..8]))
        .collect();
    let mut guards: Vec<LockGuard> = Vec::with_capacity(names.len());
    for chunk in names.chunks(50) {
        let taken = futures::future::join_all(chunk.iter().map(|n| client.try_acquire(n, &opts)));
        for guard in taken.await {
            guards.push(guard.unwrap().expect("a free name"));
        }
    }
    let started = std::time::Instant::now();
    let mut round = 0u32;
    let mut checked = 0usize;
    while started.elapsed() < Duration::from_secs(4) {
        round += 1;
        // 20 nodes at a time: set, then read back on the same session.
        let at = (round as usize * 20) % guards.len();
        let picked = &guards[at..(at + 20).min(guards.len())];
        let value = format!("round={round}");
        let results = futures::future::join_all(picked.iter().map(|guard| {
            let value = value.clone();
            let client = &client;
            async move {
                guard.set_data(Some(&value)).await.expect("set_data");
                let shown = client
                    .inspect(guard.name().as_str())
                    .await
                    .expect("inspect");
                (
                    guard.name().as_str().to_owned(),
                    shown.and_then(|info| info.data),
                )
            }
        }))
        .await;
        for (name, shown) in results {
            assert_eq!(
                shown.as_deref(),
                Some(value.as_str()),
                "{name}: old data after set_data"
            );
            checked += 1;
        }
    }
    eprintln!("{checked} set_data calls read back, {round} rounds");
    assert!(
        guards.iter().all(|g| !g.is_lost()),
        "locks lost while renewed"
    );
    for result in futures::future::join_all(guards.into_iter().map(LockGuard::release)).await {
        result.unwrap();
    }
}
