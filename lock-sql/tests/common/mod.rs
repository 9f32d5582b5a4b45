//! Helpers shared by the test files that talk to the databases directly.

use std::time::Duration;

use distlock_core::{ClientConfig, LockClient};
use distlock_sql::{SqlBackend, SqlPool};
use sqlx::{AssertSqlSafe, Executor};

/// `prefix` with a random suffix: a table or lock name no other test uses.
pub(crate) fn unique(prefix: &str) -> String {
    format!(
        "{prefix}_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

/// A `sqlite://` URL of a new file in a temporary directory, removed with the file and its
/// `-wal` / `-shm` when this is dropped (at the end of the test that holds it). Derefs to the
/// URL.
#[cfg(feature = "sqlite")]
#[allow(dead_code, reason = "not every test file uses SQLite")]
pub(crate) struct SqliteUrl {
    url: String,
    _dir: tempfile::TempDir,
}

#[cfg(feature = "sqlite")]
#[allow(dead_code, reason = "not every test file uses SQLite")]
impl SqliteUrl {
    /// A new file named `locks.db` in a new directory whose name starts with `prefix`.
    pub(crate) fn new(prefix: &str) -> Self {
        let dir = tempfile::Builder::new()
            .prefix(prefix)
            .tempdir()
            .expect("a temporary directory");
        let url = format!("sqlite://{}", dir.path().join("locks.db").display());
        Self { url, _dir: dir }
    }
}

#[cfg(feature = "sqlite")]
impl std::ops::Deref for SqliteUrl {
    type Target = str;

    fn deref(&self) -> &str {
        &self.url
    }
}

/// A client of `url` with operation timeout `timeout`.
pub(crate) async fn client_with(url: &str, timeout: Duration) -> LockClient<SqlBackend> {
    client_of(url, ClientConfig::default().with_operation_timeout(timeout)).await
}

/// A client of `url` with `config`.
pub(crate) async fn client_of(url: &str, config: ClientConfig) -> LockClient<SqlBackend> {
    match distlock_sql::connect(url, config).await {
        Ok(client) => client,
        Err(err) => panic!("connect {url}: {err}"),
    }
}

/// Runs one statement on `pool`, panicking with the statement on failure.
pub(crate) async fn exec(pool: &SqlPool, sql: String) {
    let result = match pool {
        #[cfg(feature = "postgres")]
        SqlPool::Postgres(p) => p.execute(AssertSqlSafe(sql.clone())).await.map(|_| ()),
        #[cfg(feature = "mysql")]
        SqlPool::MySql(p) => p.execute(AssertSqlSafe(sql.clone())).await.map(|_| ()),
        #[cfg(feature = "sqlite")]
        SqlPool::Sqlite(p) => p.execute(AssertSqlSafe(sql.clone())).await.map(|_| ()),
        #[allow(
            unreachable_patterns,
            reason = "reachable when a dialect's feature is off"
        )]
        _ => unreachable!("no other database is compiled in"),
    };
    if let Err(err) = result {
        panic!("{sql}: {err}");
    }
}

/// A listener of the lock table `table`'s notifications (`distlock:<table>`) on `pool`.
#[cfg(feature = "postgres")]
#[allow(dead_code, reason = "not every test file listens")]
pub(crate) async fn listen(pool: &sqlx::PgPool, table: &str) -> sqlx::postgres::PgListener {
    let mut listener = sqlx::postgres::PgListener::connect_with(pool)
        .await
        .expect("listen");
    listener
        .listen(&format!("distlock:{table}"))
        .await
        .expect("listen");
    listener
}

/// The next notification of `listener` about lock `name`, within 5 s each: its payload.
#[cfg(feature = "postgres")]
#[allow(dead_code, reason = "not every test file listens")]
pub(crate) async fn next_note(listener: &mut sqlx::postgres::PgListener, name: &str) -> String {
    loop {
        let note = tokio::time::timeout(Duration::from_secs(5), listener.recv())
            .await
            .expect("a notification")
            .expect("listen");
        if note.payload().ends_with(name) {
            return note.payload().to_owned();
        }
    }
}

/// The PostgreSQL pool of `client`, a `postgres://` client.
#[cfg(feature = "postgres")]
#[allow(dead_code, reason = "not every test file reads PostgreSQL directly")]
pub(crate) fn pg(client: &LockClient<SqlBackend>) -> sqlx::PgPool {
    match client.backend_ref().pool() {
        SqlPool::Postgres(pool) => pool,
        #[allow(unreachable_patterns, reason = "other dialects may be compiled in")]
        _ => unreachable!("a postgres:// client"),
    }
}

/// The MySQL pool of `client`, a `mysql://` client.
#[cfg(feature = "mysql")]
#[allow(dead_code, reason = "not every test file reads MySQL directly")]
pub(crate) fn my(client: &LockClient<SqlBackend>) -> sqlx::MySqlPool {
    match client.backend_ref().pool() {
        SqlPool::MySql(pool) => pool,
        #[allow(unreachable_patterns, reason = "other dialects may be compiled in")]
        _ => unreachable!("a mysql:// client"),
    }
}

/// The guard an acquisition running in `waiter`'s task gets, within 5 s.
#[allow(dead_code, reason = "not every test file waits in a task")]
pub(crate) async fn granted(
    waiter: tokio::task::JoinHandle<distlock_core::Result<distlock_core::LockGuard>>,
) -> distlock_core::LockGuard {
    granted_within(waiter, Duration::from_secs(5)).await
}

/// A release running in `release`'s task that must wait for `what` still waits; once
/// `let_go` lets `what` go, it ends within 10 s, released.
#[allow(dead_code, reason = "not every test file releases in a task")]
pub(crate) async fn waits_then_releases(
    release: tokio::task::JoinHandle<distlock_core::Result<()>>,
    what: &str,
    let_go: impl Future<Output = ()>,
) {
    assert!(
        !release.is_finished(),
        "the release did not wait for {what}"
    );
    let_go.await;
    tokio::time::timeout(Duration::from_secs(10), release)
        .await
        .unwrap_or_else(|_| panic!("the release did not end once {what} was let go"))
        .expect("the release's task")
        .expect("release");
}

/// The guard an acquisition running in `waiter`'s task gets, within `bound`.
#[allow(dead_code, reason = "not every test file waits in a task")]
pub(crate) async fn granted_within(
    waiter: tokio::task::JoinHandle<distlock_core::Result<distlock_core::LockGuard>>,
    bound: Duration,
) -> distlock_core::LockGuard {
    tokio::time::timeout(bound, waiter)
        .await
        .unwrap_or_else(|_| panic!("the waiter did not get the lock within {bound:?}"))
        .expect("the waiter's task")
        .expect("the waiter acquires")
}
