//! A lock store that is emptied or recreated under its clients (issue 47): the SQLite file
//! deleted, a PostgreSQL or MySQL lock row deleted. Fencing tokens never go back (a missing
//! counter starts at the clock in microseconds, the rule of the Redis backend), and the holder
//! whose row is gone is told at its next renewal.

use std::time::Duration;

use distlock_core::{AcquireOptions, DistributedLock, Error, LockGuard, Renewal};

#[allow(dead_code, reason = "each test file uses a part of the helpers")]
mod common;

use common::client_with;

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

/// Deletes `locks.db` in `dir`, with its `-wal` and `-shm` files.
#[cfg(feature = "sqlite")]
fn delete_database(dir: &std::path::Path) {
    for suffix in ["", "-wal", "-shm"] {
        let path = dir.join(format!("locks.db{suffix}"));
        if path.exists() {
            std::fs::remove_file(&path).unwrap();
        }
    }
}

#[cfg(feature = "sqlite")]
#[tokio::test]
async fn a_deleted_sqlite_file_keeps_tokens_growing_and_tells_the_holder() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("locks.db");
    let url = format!("sqlite://{}", file.display());
    let first = client_with(&url, Duration::from_secs(5)).await;
    let held = first.acquire("account-7", &opts()).await.unwrap();

    delete_database(dir.path());
    let second = client_with(&url, Duration::from_secs(5)).await;
    let next = second.acquire("account-7", &opts()).await.unwrap();
    assert!(
        next.token() > held.token(),
        "token {} after {}: the new file started the counter again",
        next.token(),
        held.token()
    );

    assert_renewal_reports_the_loss(&held).await;
    // The first client works on the new file too: the lock is the second's now.
    assert!(
        first
            .try_acquire("account-7", &opts())
            .await
            .unwrap()
            .is_none(),
        "the first client still uses the deleted file"
    );
    let last = next.token();
    next.release().await.unwrap();
    let again = first.acquire("account-7", &opts()).await.unwrap();
    assert!(again.token() > last);
    again.release().await.unwrap();
}

/// A deleted file that no other client recreates: the holder's renewal makes a new one and
/// finds no row there; the client goes on with the new file, its tables created again (the
/// holders' too, for a shared lock).
#[cfg(feature = "sqlite")]
#[tokio::test]
async fn a_deleted_sqlite_file_is_made_again_by_its_client() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("locks.db");
    let url = format!("sqlite://{}?pool_size=4", file.display());
    let client = client_with(&url, Duration::from_secs(5)).await;
    let held = client.acquire("a", &opts()).await.unwrap();
    let reader = client.acquire("b", &opts().shared()).await.unwrap();
    delete_database(dir.path());
    assert_renewal_reports_the_loss(&held).await;
    assert_renewal_reports_the_loss(&reader).await;
    assert!(file.exists(), "the client did not open the path again");
    let again = client.acquire("a", &opts()).await.unwrap();
    assert!(again.token() > held.token());
    let shared = client.acquire("b", &opts().shared()).await.unwrap();
    assert!(shared.token() > reader.token());
    again.release().await.unwrap();
    shared.release().await.unwrap();
}

/// The same rule on the servers: a deleted row starts again above every token it gave.
#[cfg(any(feature = "postgres", feature = "mysql"))]
async fn a_deleted_row_keeps_tokens_growing_and_tells_the_holder(url: &str) {
    let table = common::unique("recreated");
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
