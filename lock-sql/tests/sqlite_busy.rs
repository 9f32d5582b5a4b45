//! SQLite's write lock held by another connection for longer than the busy timeout: a release
//! that SQLite kept out (`BUSY`) applied nothing, and is sent again within the operation
//! timeout (CI, 2026-11-30: a permit's release failed "database is locked" with 8 clients of
//! one semaphore on a loaded machine).
#![cfg(feature = "sqlite")]

use std::time::{Duration, Instant};

use distlock_core::{AcquireOptions, ClientConfig, DistributedLock};
use sqlx::Connection;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_kept_out_by_another_writer_is_sent_again() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("busy.db");
    let url = format!("sqlite://{}?busy_timeout=300ms", path.display());
    let config = ClientConfig::default().with_operation_timeout(Duration::from_secs(5));
    let client = distlock_sql::connect(&url, config).await.expect("connect");
    let permits = AcquireOptions::default().with_permits(3);
    for (name, kind) in [
        ("busy-permit", permits),
        ("busy-lock", AcquireOptions::default()),
    ] {
        let guard = client.acquire(name, &kind).await.expect("acquire");
        // Another writer holds the file's write lock for more than one busy timeout and less
        // than two.
        let mut raw = sqlx::SqliteConnection::connect(&format!("sqlite://{}", path.display()))
            .await
            .expect("a second connection");
        sqlx::query("BEGIN IMMEDIATE")
            .execute(&mut raw)
            .await
            .expect("the write lock");
        let writer = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(450)).await;
            sqlx::query("COMMIT")
                .execute(&mut raw)
                .await
                .expect("commit");
        });
        let started = Instant::now();
        guard
            .release()
            .await
            .unwrap_or_else(|err| panic!("{name}: release kept out by the other writer: {err}"));
        assert!(
            started.elapsed() >= Duration::from_millis(300),
            "{name}: the release did not wait for the write lock"
        );
        writer.await.expect("writer");
        assert!(
            client
                .try_acquire(name, &kind)
                .await
                .expect("try_acquire")
                .is_some(),
            "{name}: still held after its release"
        );
    }
}
