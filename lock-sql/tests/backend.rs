//! Backend-specific behaviour: the fenced-write helper on each database, clear errors for bad
//! URLs, missing databases and tables of the wrong shape, and `inspect`.

use std::time::Duration;

use distlock_core::{AcquireOptions, ClientConfig, DistributedLock, Error, LockClient};
use distlock_sql::{FencedUpdate, SqlBackend, SqlPool};
use sqlx::AssertSqlSafe;

mod common;

use common::{exec, unique};

async fn client(url: &str) -> LockClient<SqlBackend> {
    common::client_with(url, Duration::from_secs(2)).await
}

async fn balance(pool: &SqlPool, table: &str) -> (i64, i64) {
    let sql = format!("SELECT balance, fence FROM {table} WHERE id = 7");
    let row: Result<(i64, i64), sqlx::Error> = match pool {
        #[cfg(feature = "postgres")]
        SqlPool::Postgres(p) => sqlx::query_as(AssertSqlSafe(sql)).fetch_one(p).await,
        #[cfg(feature = "mysql")]
        SqlPool::MySql(p) => sqlx::query_as(AssertSqlSafe(sql)).fetch_one(p).await,
        #[cfg(feature = "sqlite")]
        SqlPool::Sqlite(p) => sqlx::query_as(AssertSqlSafe(sql)).fetch_one(p).await,
        #[allow(
            unreachable_patterns,
            reason = "reachable when a dialect's feature is off"
        )]
        _ => unreachable!("no other database is compiled in"),
    };
    row.unwrap_or_else(|e| panic!("read balance: {e}"))
}

/// A paused former holder's late write (lower token) is rejected; the current holder can
/// write several times.
async fn fenced_write_rejects_stale_token(url: &str) {
    let (a, b) = (client(url).await, client(url).await);
    let table = unique("accounts");
    let pool = a.backend_ref().pool();
    exec(
        &pool,
        format!(
            "CREATE TABLE {table} (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL, fence BIGINT)"
        ),
    )
    .await;
    exec(
        &pool,
        format!("INSERT INTO {table} (id, balance) VALUES (7, 100)"),
    )
    .await;
    let name = unique("fenced");
    let opts = AcquireOptions::default().with_ttl(Duration::from_secs(10));
    let stale = a.acquire(&name, &opts).await.expect("first holder");
    let stale_token = stale.token();
    // The first holder "pauses"; an operator breaks its lock and the next holder writes.
    assert!(
        a.backend_ref()
            .force_release(&name)
            .await
            .expect("force release")
    );
    let fresh = b.acquire(&name, &opts).await.expect("second holder");
    assert!(fresh.token() > stale_token);
    let write =
        |amount: i64| FencedUpdate::new(table.as_str(), "id", 7, "fence").set("balance", amount);
    let backend = b.backend_ref();
    assert!(
        backend
            .fenced_update(&write(150), fresh.token())
            .await
            .expect("fresh write")
    );
    assert!(
        backend
            .fenced_update(&write(160), fresh.token())
            .await
            .expect("second fresh write")
    );
    // The late write of the paused holder changes nothing.
    assert!(
        !backend
            .fenced_update(&write(999), stale_token)
            .await
            .expect("stale write")
    );
    assert_eq!(
        balance(&pool, &table).await,
        (160, fresh.token().get() as i64)
    );
    // A missing row is not written either, and bad identifiers are rejected before any SQL.
    let missing = FencedUpdate::new(table.as_str(), "id", 8, "fence").set("balance", 1);
    assert!(
        !backend
            .fenced_update(&missing, fresh.token())
            .await
            .expect("missing row")
    );
    let bad = FencedUpdate::new("accounts; DROP TABLE x", "id", 7, "fence");
    assert!(matches!(
        backend.fenced_update(&bad, fresh.token()).await,
        Err(Error::InvalidOptions(_))
    ));
    assert!(stale.release().await.is_err(), "the broken lock released");
    fresh.release().await.expect("release");
    exec(&pool, format!("DROP TABLE {table}")).await;
}

/// `inspect` shows the holder, its token and remaining lease, and nothing once released.
async fn inspect_shows_holder(url: &str) {
    let c = client(url).await;
    let name = unique("inspect");
    let guard = c
        .acquire(
            &name,
            &AcquireOptions::default().with_ttl(Duration::from_secs(10)),
        )
        .await
        .expect("acquire");
    let info = c.inspect(&name).await.expect("inspect").expect("held");
    assert_eq!(info.owner, guard.owner());
    assert_eq!(info.token, Some(guard.token()));
    let remaining = info.remaining.expect("remaining");
    assert!(remaining > Duration::from_secs(5) && remaining <= Duration::from_secs(10));
    guard.release().await.expect("release");
    assert_eq!(c.inspect(&name).await.expect("inspect"), None);
}

/// A table without the lock columns, or a missing one with `create_table=false`, is reported
/// at connect with the table's name.
async fn wrong_shape_is_reported(url: &str) {
    let admin = client(url).await;
    let table = unique("not_locks");
    let pool = admin.backend_ref().pool();
    exec(
        &pool,
        format!("CREATE TABLE {table} (name VARCHAR(64) PRIMARY KEY, x BIGINT)"),
    )
    .await;
    let sep = if url.contains('?') { '&' } else { '?' };
    for (url, what) in [
        (format!("{url}{sep}table={table}"), "wrong shape"),
        (
            format!("{url}{sep}table={table}_missing&create_table=false"),
            "missing table",
        ),
    ] {
        match distlock_sql::connect(&url, ClientConfig::default()).await {
            Err(Error::Backend { message, .. }) => {
                assert!(message.contains(&table), "{what}: {message}");
            }
            other => panic!("{what}: expected a backend error, got {other:?}"),
        }
    }
    exec(&pool, format!("DROP TABLE {table}")).await;
}

#[test]
fn bad_urls_are_invalid_config() {
    for url in [
        "ftp://host/db",
        "sqlite://x.db?table=bad-name",
        "sqlite://x.db?pool_size=many",
        "sqlite://x.db?busy_timeout=soon",
        "sqlite::memory:?pool_size=4",
        "postgres://h/db?connect_timeout=0",
        "mysql://h/db?create_table=maybe",
    ] {
        match distlock_sql::SqlConfig::from_url(url) {
            Err(Error::InvalidConfig(msg)) => assert!(!msg.is_empty()),
            other => panic!("{url}: {other:?}"),
        }
    }
}

#[cfg(feature = "sqlite")]
mod sqlite {
    use super::*;

    fn url() -> String {
        let path =
            std::env::temp_dir().join(format!("distlock-be-{}.db", uuid::Uuid::new_v4().simple()));
        format!("sqlite://{}", path.display())
    }

    #[tokio::test]
    async fn fenced_write() {
        fenced_write_rejects_stale_token(&url()).await;
    }

    #[tokio::test]
    async fn inspect() {
        inspect_shows_holder(&url()).await;
    }

    #[tokio::test]
    async fn wrong_shape() {
        wrong_shape_is_reported(&url()).await;
    }

    /// The first use of a file creates it, its table, and switches it to WAL.
    #[tokio::test]
    async fn first_use_creates_file_in_wal_mode() {
        let url = url();
        let c = client(&url).await;
        let guard = c
            .try_acquire("first", &AcquireOptions::default())
            .await
            .expect("try")
            .expect("free");
        guard.release().await.expect("release");
        let SqlPool::Sqlite(pool) = c.backend_ref().pool() else {
            panic!("not sqlite")
        };
        let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
            .fetch_one(&pool)
            .await
            .expect("pragma");
        assert_eq!(mode, "wal");
    }

    /// Clients that open a new file at the same moment all connect: SQLite refuses some of
    /// the setup steps (the switch to WAL) at once instead of waiting out the busy timeout.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn clients_opening_a_new_file_together_all_connect() {
        for _ in 0..10 {
            let url = url();
            let clients = futures::future::join_all(
                (0..6).map(|_| distlock_sql::connect(&url, ClientConfig::default())),
            )
            .await;
            for c in clients {
                if let Err(err) = c {
                    panic!("a concurrent first connect failed: {err}");
                }
            }
        }
    }

    /// `sqlite::memory:` is one database shared by the pool.
    #[tokio::test]
    async fn memory_database_works() {
        let c = client("sqlite::memory:").await;
        let opts = AcquireOptions::default();
        let guard = c.try_acquire("m", &opts).await.expect("try").expect("free");
        assert!(c.try_acquire("m", &opts).await.expect("try").is_none());
        guard.release().await.expect("release");
    }
}

#[cfg(feature = "postgres")]
mod postgres {
    use super::*;

    fn url() -> Option<String> {
        conformance_tests::server_var("postgres", "DISTLOCK_TEST_POSTGRES_URL")
    }

    #[tokio::test]
    async fn fenced_write() {
        let Some(url) = url() else { return };
        fenced_write_rejects_stale_token(&url).await;
    }

    #[tokio::test]
    async fn inspect() {
        let Some(url) = url() else { return };
        inspect_shows_holder(&url).await;
    }

    #[tokio::test]
    async fn wrong_shape() {
        let Some(url) = url() else { return };
        wrong_shape_is_reported(&url).await;
    }

    #[tokio::test]
    async fn missing_database_and_unreachable_server() {
        let Some(url) = url() else { return };
        let base = url.rsplit_once('/').map(|(b, _)| b).unwrap_or(&url);
        match distlock_sql::connect(
            &format!("{base}/no_such_db_distlock"),
            ClientConfig::default(),
        )
        .await
        {
            Err(Error::Backend { message, .. }) => {
                assert!(message.contains("no_such_db_distlock"), "{message}")
            }
            other => panic!("missing database: {other:?}"),
        }
        let config = ClientConfig::default().with_operation_timeout(Duration::from_millis(500));
        let started = std::time::Instant::now();
        match distlock_sql::connect("postgres://postgres@127.0.0.1:1/distlock", config).await {
            Err(Error::Unavailable { .. }) => {}
            other => panic!("unreachable server: {other:?}"),
        }
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "took {:?}",
            started.elapsed()
        );
    }
}

#[cfg(feature = "mysql")]
mod mysql {
    use super::*;

    fn url() -> Option<String> {
        conformance_tests::server_var("mysql", "DISTLOCK_TEST_MYSQL_URL")
    }

    #[tokio::test]
    async fn fenced_write() {
        let Some(url) = url() else { return };
        fenced_write_rejects_stale_token(&url).await;
    }

    #[tokio::test]
    async fn inspect() {
        let Some(url) = url() else { return };
        inspect_shows_holder(&url).await;
    }

    #[tokio::test]
    async fn wrong_shape() {
        let Some(url) = url() else { return };
        wrong_shape_is_reported(&url).await;
    }

    /// How many of `client`'s connections wait in `GET_LOCK` on the server.
    async fn waiting_in_get_lock(admin: &sqlx::MySqlPool, client: &LockClient<SqlBackend>) -> i64 {
        let ids = client.backend_ref().session_ids();
        let list = ids.iter().map(i64::to_string).collect::<Vec<_>>().join(",");
        let sql = format!(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
             WHERE STATE = 'User lock' AND ID IN ({list})"
        );
        sqlx::query_scalar(AssertSqlSafe(sql))
            .fetch_one(admin)
            .await
            .unwrap_or_else(|e| panic!("processlist: {e}"))
    }

    /// The reserved waiter waits for the holder's wake lock on the server and takes the lock
    /// when it is given up; a waiter cancelled mid-wait leaves no statement waiting there and
    /// no reservation behind.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn waiter_waits_on_the_wake_lock_and_cancels_cleanly() {
        let Some(url) = url() else { return };
        let (a, b) = (client(&url).await, client(&url).await);
        let admin = sqlx::MySqlPool::connect(&url).await.expect("admin pool");
        let name = unique("wake");
        let opts = AcquireOptions::default()
            .with_ttl(Duration::from_secs(10))
            .with_wait(Duration::from_secs(10));
        // The first take inserts the row, without a wake lock; the later ones take one.
        let first = a.acquire(&name, &opts).await.expect("first acquire");
        first.release().await.expect("release");
        let held = a.acquire(&name, &opts).await.expect("acquire");
        let waiter = {
            let (b, name, opts) = (b.clone(), name.clone(), opts.clone());
            tokio::spawn(async move { b.acquire(&name, &opts).await })
        };
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(
            waiting_in_get_lock(&admin, &b).await,
            1,
            "no wait on the server"
        );
        held.release().await.expect("release");
        let taken = tokio::time::timeout(Duration::from_secs(2), waiter)
            .await
            .expect("the waiter was not woken")
            .expect("join")
            .expect("acquire");
        let token = taken.token();

        // Cancelled mid-wait: the wait is killed on the server, the reservation dropped.
        let cancelled = tokio::time::timeout(Duration::from_millis(500), a.acquire(&name, &opts));
        assert!(cancelled.await.is_err(), "acquired a held lock");
        // Within a second: an unkilled wait would run on for its bound of 2 s.
        let mut left = 1;
        for _ in 0..10 {
            left = waiting_in_get_lock(&admin, &a).await;
            if left == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(left, 0, "a cancelled wait still runs on the server");
        taken.release().await.expect("release");
        let again = b
            .try_acquire(&name, &opts)
            .await
            .expect("try_acquire")
            .expect("a reservation of the cancelled waiter refused the lock");
        assert!(again.token() > token);
        again.release().await.expect("release");
    }

    #[tokio::test]
    async fn missing_database() {
        let Some(url) = url() else { return };
        let base = url.rsplit_once('/').map(|(b, _)| b).unwrap_or(&url);
        match distlock_sql::connect(
            &format!("{base}/no_such_db_distlock"),
            ClientConfig::default(),
        )
        .await
        {
            Err(Error::Backend { message, .. }) => {
                assert!(message.contains("no_such_db_distlock"), "{message}")
            }
            other => panic!("missing database: {other:?}"),
        }
    }
}
