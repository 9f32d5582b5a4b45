//! Locks over the application's own sqlx pool ([`distlock_sql::from_pool`]) on each real
//! database: they exclude the locks of a URL-connected client on the same table, leave the
//! pool usable by the application, and a fenced write runs inside the application's own
//! transaction (committed with it, rolled back with it, refused for a stale token).

#[allow(dead_code, reason = "each test file uses a part of the helpers")]
mod common;

use common::unique;
use std::time::Duration;

use distlock_core::{AcquireOptions, ClientConfig, DistributedLock, Error, LockClient};
use distlock_sql::{FencedUpdate, SqlBackend, SqlConfig, SqlPool};

fn config() -> ClientConfig {
    ClientConfig::default().with_operation_timeout(Duration::from_secs(2))
}

/// What every database must show; `app_query` runs one statement of the application on its
/// pool, `fenced` runs `write` in a transaction of the application and commits it if
/// `commit`, and `balance` reads the protected row.
async fn check<Q, F, B>(url: &str, pool: SqlPool, app_query: Q, fenced: F, balance: B)
where
    Q: AsyncFn() -> Result<(), sqlx::Error>,
    F: AsyncFn(&FencedUpdate, distlock_core::FencingToken, bool) -> Result<bool, Error>,
    B: AsyncFn() -> i64,
{
    let own: LockClient<SqlBackend> = distlock_sql::from_pool(pool.clone(), config())
        .await
        .expect("locks over the application's pool");
    let by_url = distlock_sql::connect(url, config()).await.expect("connect");
    let name = unique("own-pool");
    let opts = AcquireOptions::default().with_ttl(Duration::from_secs(5));
    let guard = own.acquire(&name, &opts).await.expect("acquire");
    assert!(
        by_url
            .try_acquire(&name, &opts)
            .await
            .expect("try")
            .is_none(),
        "the same table: the URL client sees the lock"
    );
    // The application still gets connections from its pool while locks are held.
    tokio::time::timeout(Duration::from_secs(2), app_query())
        .await
        .expect("the application's statement waited for a connection")
        .expect("the application's statement");

    let write = |n: i64| FencedUpdate::new("own_pool_accounts", "id", 7, "fence").set("balance", n);
    let first = guard.token();
    // Rolled back with the application's transaction.
    assert!(
        fenced(&write(100), first, false)
            .await
            .expect("fenced write")
    );
    assert_eq!(balance().await, 0, "rolled back");
    // Committed with it.
    assert!(
        fenced(&write(120), first, true)
            .await
            .expect("fenced write")
    );
    assert_eq!(balance().await, 120);
    guard.release().await.expect("release");
    // A later holder writes; the former holder's token is refused in its transaction.
    let later = by_url.acquire(&name, &opts).await.expect("acquire");
    assert!(later.token() > first);
    assert!(
        fenced(&write(130), later.token(), true)
            .await
            .expect("write")
    );
    assert!(
        !fenced(&write(666), first, true).await.expect("stale write"),
        "a stale token must not write"
    );
    assert_eq!(balance().await, 130);
    later.release().await.expect("release");

    // A configuration for another database is refused.
    let other = if pool.dialect() == distlock_sql::Dialect::Sqlite {
        "postgres://h/db"
    } else {
        "sqlite::memory:"
    };
    let mismatch = SqlBackend::from_pool(pool, SqlConfig::from_url(other).expect("url")).await;
    assert!(matches!(mismatch, Err(Error::InvalidConfig(_))));
}

/// Runs [`check`] on the application's `pool` (any sqlx pool type) at `url`.
macro_rules! check_pool {
    ($url:expr, $pool:expr) => {{
        use sqlx::Executor;
        let pool = $pool;
        let (app, tx_pool, read_pool) = (pool.clone(), pool.clone(), pool.clone());
        check(
            $url,
            SqlPool::from(pool),
            async || app.execute("SELECT 1").await.map(drop),
            async |write: &FencedUpdate, token, commit| {
                let mut tx = tx_pool.begin().await.expect("begin");
                let written = write.execute(&mut *tx, token).await?;
                if commit {
                    tx.commit().await.expect("commit");
                } else {
                    tx.rollback().await.expect("rollback");
                }
                Ok(written)
            },
            async || {
                sqlx::query_scalar::<_, i64>("SELECT balance FROM own_pool_accounts WHERE id = 7")
                    .fetch_one(&read_pool)
                    .await
                    .expect("read")
            },
        )
        .await
    }};
}

macro_rules! own_pool_test {
    ($test:ident, $feature:literal, $backend:literal, $var:literal, $options:ty, $table_sql:literal) => {
        #[cfg(feature = $feature)]
        #[tokio::test]
        async fn $test() {
            use sqlx::{AssertSqlSafe, Executor};
            let Some(url) = conformance_tests::server_var($backend, $var) else {
                return;
            };
            let pool = <$options>::new()
                .max_connections(4)
                .connect(&url)
                .await
                .expect("the application's pool");
            pool.execute(AssertSqlSafe($table_sql))
                .await
                .expect("create");
            pool.execute("DELETE FROM own_pool_accounts")
                .await
                .expect("clear");
            pool.execute("INSERT INTO own_pool_accounts (id, balance) VALUES (7, 0)")
                .await
                .expect("insert");
            check_pool!(&url, pool);
        }
    };
}

own_pool_test!(
    postgres_pool,
    "postgres",
    "postgres",
    "DISTLOCK_TEST_POSTGRES_URL",
    sqlx::postgres::PgPoolOptions,
    "CREATE TABLE IF NOT EXISTS own_pool_accounts (id BIGINT PRIMARY KEY, balance BIGINT, fence BIGINT)"
);
own_pool_test!(
    mysql_pool,
    "mysql",
    "mysql",
    "DISTLOCK_TEST_MYSQL_URL",
    sqlx::mysql::MySqlPoolOptions,
    "CREATE TABLE IF NOT EXISTS own_pool_accounts (id BIGINT PRIMARY KEY, balance BIGINT, fence BIGINT)"
);

#[cfg(feature = "sqlite")]
#[tokio::test]
async fn sqlite_pool() {
    use sqlx::Executor;
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}?mode=rwc", dir.path().join("own.db").display());
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(4)
        .connect(&url)
        .await
        .expect("the application's pool");
    pool.execute(
        "CREATE TABLE own_pool_accounts (id INTEGER PRIMARY KEY, balance INTEGER, fence INTEGER)",
    )
    .await
    .expect("create");
    pool.execute("INSERT INTO own_pool_accounts (id, balance) VALUES (7, 0)")
        .await
        .expect("insert");
    check_pool!(&url, pool);
}

/// Sessions whose transactions default to REPEATABLE READ (the role's, the database's or the
/// URL's `options`): the backend's own pool sets READ COMMITTED on every connection, and an
/// application's pool that runs so is refused. The lock functions count a name's holders
/// after waiting for its row, and a snapshot from before that wait missed a reader that
/// joined meanwhile, freeing the name for a writer beside it.
#[cfg(feature = "postgres")]
#[tokio::test]
async fn postgres_sessions_stricter_than_read_committed() {
    let Some(url) = conformance_tests::server_var("postgres", "DISTLOCK_TEST_POSTGRES_URL") else {
        return;
    };
    let joiner = if url.contains('?') { '&' } else { '?' };
    let strict =
        format!("{url}{joiner}options=-c%20default_transaction_isolation%3Drepeatable%5C%20read");
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect(&strict)
        .await
        .expect("the application's pool");
    let level: String = sqlx::query_scalar("SHOW default_transaction_isolation")
        .fetch_one(&pool)
        .await
        .expect("read the level");
    assert_eq!(
        level, "repeatable read",
        "the URL's options were not applied"
    );
    match distlock_sql::from_pool(SqlPool::from(pool), config()).await {
        Err(Error::InvalidConfig(message)) => {
            assert!(message.contains("read committed"), "{message}")
        }
        Err(other) => panic!("{other}"),
        Ok(_) => panic!("a pool at repeatable read was taken"),
    }
    // Through the URL: taken, every session at READ COMMITTED.
    let locks = distlock_sql::connect(&strict, config())
        .await
        .expect("connect at a stricter default");
    let name = unique("strict");
    let opts = AcquireOptions::default().with_ttl(Duration::from_secs(5));
    let guard = locks.acquire(&name, &opts).await.expect("acquire");
    guard.release().await.expect("release");
}
