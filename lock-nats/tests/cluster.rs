//! A failover of the 3-node JetStream cluster: kill -9 of the leader of the bucket's stream
//! (`scripts/services.sh kill-one`, then `start-one`), with a lock held across it.

use std::time::{Duration, Instant};

use conformance_tests::{server_var, services};
use distlock_core::{AcquireOptions, ClientConfig, DistributedLock};
use distlock_nats::NatsConfig;

/// A lock whose ttl outlasts the election (4.7-7.6 s here: JetStream's election timeout) plus
/// a renewal interval is kept: its renewals fail while there is no leader and succeed again
/// after; the next holder's token is higher, and every step is timed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_stream_leader_keeps_a_lock_whose_ttl_outlasts_the_election() {
    let Some(url) = server_var("nats", "DISTLOCK_TEST_NATS_CLUSTER_URL") else {
        return;
    };
    let bucket = format!(
        "failover-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let config = NatsConfig::from_url(&url)
        .and_then(|c| c.with_bucket(&bucket))
        .expect("cluster URL");
    let client_config = ClientConfig::default().with_operation_timeout(Duration::from_secs(2));
    let a = distlock_nats::connect_with(config.clone(), client_config.clone())
        .await
        .expect("connect a");
    let opts = AcquireOptions::default().with_ttl(Duration::from_secs(15));
    let guard = a.acquire("held-across", &opts).await.expect("acquire");
    let token = guard.token();

    // The leader of this bucket's stream (services.sh failover picks the busiest stream's).
    let backend = distlock_nats::NatsBackend::connect(&config, Duration::from_secs(2))
        .await
        .expect("admin connection");
    let js = distlock_nats::async_nats::jetstream::new(backend.client().clone());
    let mut stream = js.get_stream(format!("KV_{bucket}")).await.expect("stream");
    let info = stream.info().await.expect("stream info");
    let leader = info
        .cluster
        .as_ref()
        .and_then(|c| c.leader.clone())
        .expect("the stream has a leader");
    let killed = Instant::now();
    let failover = tokio::spawn(async move {
        services("kill-one", &leader)
            .await
            .expect("kill the leader");
        services("start-one", &leader)
            .await
            .expect("start it again");
        killed.elapsed()
    });
    // Renew every 100 ms: the first refused renewal, and the first that succeeds after it
    // (the new leader serving).
    let mut first_failure = None;
    let renewed = loop {
        match guard.renew().await {
            Ok(()) if first_failure.is_some() => break killed.elapsed(),
            Ok(()) if failover.is_finished() => break killed.elapsed(),
            Ok(()) => {}
            Err(_) => {
                first_failure.get_or_insert_with(|| killed.elapsed());
            }
        }
        assert!(!guard.is_lost(), "the lock was lost in the failover");
        assert!(
            killed.elapsed() < Duration::from_secs(30),
            "no renewal succeeded within 30 s of the kill"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let failover = failover.await.expect("failover task");
    assert!(!guard.is_lost(), "lost after the failover");

    let b = distlock_nats::connect_with(config, client_config)
        .await
        .expect("connect b");
    let tried = b.try_acquire("held-across", &opts).await.expect("try");
    assert!(tried.is_none(), "B got the lock A still holds");
    guard.release().await.expect("release after the failover");
    let next = b.acquire("held-across", &opts).await.expect("acquire b");
    let next_token = next.token();
    assert!(next_token > token, "the token went back");
    next.release().await.expect("release b");
    eprintln!(
        "nats failover: renewals refused from {first_failure:?}, served again {renewed:?} after \
         the kill (the old leader back: {failover:?}); B's token \
         {next_token} > A's {token}"
    );
}
