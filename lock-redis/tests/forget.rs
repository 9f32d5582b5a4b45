//! Issue 42, store growth under churn: a name's fencing counter expires `forget_after` after
//! its last lease, so names no longer used leave no key behind, and the tokens of a forgotten
//! name still grow (it starts again at the server's clock). Before, every name ever acquired
//! kept its counter key for good (100,000 names: 100,000 keys of 166 bytes).

mod common;

use std::time::Duration;

use conformance_tests::churn::{churn, footprint_until};
use distlock_core::{AcquireOptions, ClientConfig, DistributedLock};
use distlock_redis::LockKeys;

/// Names churned per test.
const NAMES: usize = 200;

fn name(case: &str) -> String {
    format!(
        "forget-{}/{case}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    )
}

async fn connect(url: &str) -> std::sync::Arc<dyn DistributedLock> {
    let config = ClientConfig::default().with_operation_timeout(Duration::from_secs(5));
    match distlock_redis::connect(url, config).await {
        Ok(client) => client.into_dyn(),
        Err(e) => panic!("connect {url}: {e}"),
    }
}

/// `url` with `options` added to its query.
fn with_options(url: &str, options: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{options}")
}

/// The three configurations: one master, Redlock over three, the cluster; `None` each when
/// its servers are not set up (then skipped, or failed under `DISTLOCK_TEST_REQUIRE`).
fn configurations() -> Vec<(&'static str, String)> {
    let mut urls = Vec::new();
    if let Some(masters) = common::urls("redis") {
        urls.push(("redis", masters[0].clone()));
        let hosts: Vec<&str> = masters
            .iter()
            .take(3)
            .map(|u| u.trim_start_matches("redis://").trim_end_matches('/'))
            .collect();
        urls.push(("redlock", format!("redlock://{}", hosts.join(","))));
    }
    if let Some(cluster) = common::cluster_url("redis") {
        urls.push(("redis-cluster", cluster));
    }
    urls
}

fn opts(ttl: Duration) -> AcquireOptions {
    AcquireOptions::default()
        .with_ttl(ttl)
        .with_wait(Duration::from_secs(10))
}

/// The shortest lease each configuration takes.
fn ttl(client: &dyn DistributedLock) -> Duration {
    client.capabilities().min_ttl
}

#[tokio::test(flavor = "multi_thread")]
async fn churned_names_leave_no_keys() {
    for (label, url) in configurations() {
        let client = connect(&with_options(&url, "forget_after=1ms")).await;
        let prefix = format!("{}/", name("churn"));
        let names = churn(&*client, &prefix, NAMES, &opts(ttl(&*client))).await;
        let right_after = client.footprint(&prefix).await.unwrap().unwrap();
        let left = footprint_until(&*client, &prefix, Duration::from_secs(10), |f| {
            f.objects() == 0
        })
        .await;
        assert_eq!(
            left.objects(),
            0,
            "{label}: left behind by {names} names: {left} (right after: {right_after})"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_forgotten_name_gets_a_higher_token() {
    for (label, url) in configurations() {
        let client = connect(&with_options(&url, "forget_after=1ms")).await;
        let name = name("again");
        let opts = opts(ttl(&*client));
        let first = client.acquire(&name, &opts).await.unwrap();
        let token = first.token();
        first.release().await.unwrap();
        let left = footprint_until(&*client, &name, Duration::from_secs(10), |f| {
            f.objects() == 0
        })
        .await;
        assert_eq!(left.objects(), 0, "{label}: the counter stayed: {left}");
        let next = client.acquire(&name, &opts).await.unwrap();
        assert!(
            next.token() > token,
            "{label}: token {} after the counter expired, {token} before",
            next.token()
        );
        next.release().await.unwrap();
    }
}

/// A lock renewed for longer than its ttl plus `forget_after` outlives its counter key; the
/// next holder's token is still higher. A ttl of 1 s at least: held for up to 6 ttls, a lease
/// of the shortest ttl (200 ms on one master, renewed within about 130 ms) was lost in CI
/// while every lane's binaries and the background builds ran (2026-12-07).
#[tokio::test(flavor = "multi_thread")]
async fn a_counter_that_expires_under_its_holder_still_fences() {
    for (label, url) in configurations() {
        let client = connect(&with_options(&url, "forget_after=1ms")).await;
        let name = name("held");
        let ttl = ttl(&*client).max(Duration::from_secs(1));
        let held = client.acquire(&name, &opts(ttl)).await.unwrap();
        let gone = footprint_until(&*client, &name, ttl * 6, |f| f.count("fence") == 0).await;
        assert_eq!(gone.count("fence"), 0, "{label}: {gone}");
        assert!(!held.is_lost(), "{label}: the renewed lock was lost");
        let token = held.token();
        held.release().await.unwrap();
        let next = client.acquire(&name, &opts(ttl)).await.unwrap();
        assert!(
            next.token() > token,
            "{label}: {} after {token}",
            next.token()
        );
        next.release().await.unwrap();
    }
}

/// By default the counter lives 10 minutes past the lease of the last acquisition.
#[tokio::test(flavor = "multi_thread")]
async fn the_counter_expires_forget_after_past_the_lease() {
    let Some(masters) = common::urls("redis") else {
        return;
    };
    let client = connect(&masters[0]).await;
    let name = name("pttl");
    let ttl = Duration::from_secs(30);
    let guard = client.acquire(&name, &opts(ttl)).await.unwrap();
    let mut conn = common::raw(&masters[0]).await;
    let keys = LockKeys::for_name(&name).unwrap();
    let pttl: i64 = redis::cmd("PTTL")
        .arg(&keys.fence)
        .query_async(&mut conn)
        .await
        .unwrap();
    let expected = i64::try_from((ttl + Duration::from_secs(600)).as_millis()).unwrap();
    assert!(
        (expected - 5_000..=expected).contains(&pttl),
        "the counter expires in {pttl} ms, expected about {expected}"
    );
    guard.release().await.unwrap();
}
