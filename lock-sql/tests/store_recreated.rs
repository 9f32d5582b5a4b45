//! A lock store that is emptied or recreated under its clients (issue 47): a PostgreSQL or
//! MySQL lock row deleted. Fencing tokens never go back (a missing counter starts at the clock
//! in microseconds, the rule of the Redis backend), and the holder whose row is gone is told
//! at its next renewal.
#![cfg(any(feature = "postgres", feature = "mysql"))]

use std::time::Duration;

use distlock_core::{AcquireOptions, DistributedLock, Error, LockGuard, Renewal};

mod common;

use common::{client_with, unique};

/// One long lease and no automatic renewal: each test renews by hand.
fn opts() -> AcquireOptions {
    AcquireOptions::default()
        .with_ttl(Duration::from_secs(30))
        .with_renewal(Renewal::disabled())
}

/// The renewal of `guard`, whose row is gone, is refused and the guard is lost.
async fn assert_renewal_reports_the_loss(guard: &LockGuard) {
    match guard.renew().await {
        Err(Error::NotHeld { .. } | Error::Lost { .. }) => {}
        other => panic!("the renewal of a vanished lease answered {other:?}"),
    }
    assert!(guard.is_lost(), "the guard does not know its lock is gone");
}

/// A deleted row starts again above every token it gave.
async fn a_deleted_row_keeps_tokens_growing_and_tells_the_holder(url: &str) {
    let table = unique("recreated");
    let sep = if url.contains('?') { '&' } else { '?' };
    let url = format!("{url}{sep}table={table}");
    let first = client_with(&url, Duration::from_secs(5)).await;
    let held = first.acquire("account-7", &opts()).await.unwrap();
    let pool = first.backend_ref().pool();
    common::exec(&pool, format!("DELETE FROM {table}")).await;

    let second = client_with(&url, Duration::from_secs(5)).await;
    let next = second.acquire("account-7", &opts()).await.unwrap();
    assert!(
        next.token() > held.token(),
        "token {} after {}: the new row started the counter again",
        next.token(),
        held.token()
    );
    assert_renewal_reports_the_loss(&held).await;
    next.release().await.unwrap();
    common::exec(&pool, format!("DROP TABLE {table}")).await;
}

#[cfg(feature = "postgres")]
#[tokio::test]
async fn a_deleted_postgres_row_keeps_tokens_growing_and_tells_the_holder() {
    let Some(url) = conformance_tests::server_var("postgres", "DISTLOCK_TEST_POSTGRES_URL") else {
        return;
    };
    a_deleted_row_keeps_tokens_growing_and_tells_the_holder(&url).await;
}

#[cfg(feature = "mysql")]
#[tokio::test]
async fn a_deleted_mysql_row_keeps_tokens_growing_and_tells_the_holder() {
    let Some(url) = conformance_tests::server_var("mysql", "DISTLOCK_TEST_MYSQL_URL") else {
        return;
    };
    a_deleted_row_keeps_tokens_growing_and_tells_the_holder(&url).await;
}
