//! Tokens after a server restart are greater than before (the version column is durable), and
//! a client made before the restart works again after it. Stops real servers: the tests of this
//! binary run one at a time.

use std::time::Duration;

use distlock_core::{AcquireOptions, ClientConfig, DistributedLock};

static SERVER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn services(command: &str, name: &str) {
    if let Err(err) = conformance_tests::services(command, name).await {
        panic!("{err}");
    }
}

#[allow(dead_code, reason = "unused when no server dialect is compiled in")]
async fn tokens_increase_across_restart(url: &str, service: &str) {
    let _alone = SERVER.lock().await;
    let config = ClientConfig::default().with_operation_timeout(Duration::from_secs(2));
    let before = distlock_sql::connect(url, config.clone())
        .await
        .expect("connect");
    let name = format!("restart-{}", uuid::Uuid::new_v4().simple());
    let opts = AcquireOptions::default()
        .with_ttl(Duration::from_secs(5))
        .with_wait(Duration::from_secs(30));
    let mut last = 0;
    for _ in 0..3 {
        let guard = before.acquire(&name, &opts).await.expect("acquire");
        last = guard.token().get();
        guard.release().await.expect("release");
    }
    services("stop-one", service).await;
    services("start-one", service).await;
    let after = distlock_sql::connect(url, config)
        .await
        .expect("connect after restart");
    let guard = after
        .acquire(&name, &opts)
        .await
        .expect("acquire after restart");
    assert!(
        guard.token().get() > last,
        "token {} after restart, {last} before",
        guard.token()
    );
    let token = guard.token();
    guard.release().await.expect("release");
    // The old client's pool reconnects.
    let guard = before
        .acquire(&name, &opts)
        .await
        .expect("old client after restart");
    assert!(guard.token() > token);
    guard.release().await.expect("release");
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_tokens_increase_across_restart() {
    let Some(url) = conformance_tests::server_var("postgres", "DISTLOCK_TEST_POSTGRES_URL") else {
        return;
    };
    tokens_increase_across_restart(&url, "postgres").await;
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_tokens_increase_across_restart() {
    let Some(url) = conformance_tests::server_var("mysql", "DISTLOCK_TEST_MYSQL_URL") else {
        return;
    };
    tokens_increase_across_restart(&url, "mariadb").await;
}
