//! Opening the pool (a server database's: [`open_server`]), connections kept checked out
//! between statements, and how long a connection may sit idle before it is checked
//! ([`IdleLimit`]).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

#[cfg(any(feature = "postgres", feature = "mysql"))]
use std::str::FromStr;

#[cfg(any(feature = "postgres", feature = "mysql"))]
use distlock_core::Error;
use sqlx::Connection as _;
#[cfg(any(feature = "postgres", feature = "mysql"))]
use sqlx::{ColumnIndex, Decode, Executor, Type};

#[cfg(any(feature = "postgres", feature = "mysql"))]
use crate::config::SqlConfig;
#[cfg(any(feature = "postgres", feature = "mysql"))]
use crate::db::Sessions;
#[cfg(any(feature = "postgres", feature = "mysql"))]
use crate::error::connect_err;

/// Opens a pool. When the pool gives up with sqlx's bare "pool timed out", one direct
/// connection attempt (bounded by `probe`) finds the cause to report instead: connection
/// refused, unknown host, wrong password.
pub(crate) async fn open_pool<DB: sqlx::Database>(
    pool: sqlx::pool::PoolOptions<DB>,
    options: <DB::Connection as sqlx::Connection>::Options,
    probe: Duration,
) -> Result<sqlx::Pool<DB>, sqlx::Error> {
    use sqlx::ConnectOptions;
    match pool.connect_with(options.clone()).await {
        Err(sqlx::Error::PoolTimedOut) => {
            match tokio::time::timeout(probe, options.connect()).await {
                Ok(Err(cause)) => Err(cause),
                _ => Err(sqlx::Error::PoolTimedOut),
            }
        }
        other => other,
    }
}

/// The pool of a server database: the config's size, half the connect timeout to wait for a
/// connection, no ping before each use (see [`HotConns`]) unless the connection idled long
/// enough for the server to have closed it (see [`IdleLimit`]), and every new connection's
/// server-side id, read by `session_id` (SQL answering one BIGINT), recorded in `sessions`.
/// The id is read in the simple query protocol: no prepared statement, which a pooler in
/// transaction mode would leave on a server connection that another client gets next (the
/// backend refuses such a pooler, and must connect to say so).
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn server_pool<DB>(
    config: &SqlConfig,
    session_id: &'static str,
    sessions: Arc<Sessions>,
    idle: Arc<IdleLimit>,
) -> sqlx::pool::PoolOptions<DB>
where
    DB: sqlx::Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    usize: ColumnIndex<DB::Row>,
    for<'t> i64: Decode<'t, DB> + Type<DB>,
{
    sqlx::pool::PoolOptions::<DB>::new()
        .max_connections(config.max_connections)
        .acquire_timeout(config.effective_connect_timeout() / 2)
        .test_before_acquire(false)
        .before_acquire(move |conn, meta| {
            let stale = idle.stale(meta.idle_for);
            Box::pin(async move {
                // A failed ping closes the connection; the pool tries another.
                Ok(!stale || sqlx::Connection::ping(conn).await.is_ok())
            })
        })
        .after_connect(move |conn, _meta| {
            let sessions = sessions.clone();
            Box::pin(async move {
                let row = sqlx::raw_sql(session_id).fetch_one(conn).await?;
                sessions.add(sqlx::Row::try_get(&row, 0)?);
                Ok(())
            })
        })
}

/// Opens the pool of a server database at `config.url` (`what`: the database's name, for a
/// bad URL's message), each new connection's server-side id read by `session_id` into
/// `sessions` (see [`server_pool`]). Returns the pool and the idle limit its `before_acquire`
/// reads, for the caller to set from the server's own limit.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) async fn open_server<DB>(
    config: &SqlConfig,
    sessions: Arc<Sessions>,
    what: &str,
    session_id: &'static str,
) -> distlock_core::Result<(sqlx::Pool<DB>, Arc<IdleLimit>)>
where
    DB: sqlx::Database,
    <DB::Connection as sqlx::Connection>::Options: FromStr<Err = sqlx::Error>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    usize: ColumnIndex<DB::Row>,
    for<'t> i64: Decode<'t, DB> + Type<DB>,
{
    let options: <DB::Connection as sqlx::Connection>::Options =
        config.url.parse().map_err(|e| {
            Error::InvalidConfig(format!("bad {what} URL {}: {e}", config.redacted_url()))
        })?;
    let idle = Arc::new(IdleLimit::server());
    let pool = server_pool::<DB>(config, session_id, sessions, idle.clone());
    let probe = config.effective_connect_timeout() / 4;
    let pool = open_pool(pool, options, probe)
        .await
        .map_err(|e| connect_err(config, e))?;
    Ok((pool, idle))
}

/// The longest a server connection sits idle before its next use checks it (a ping): load
/// balancers, NAT tables and proxies drop idle connections too, after minutes (AWS NLB 350 s,
/// Azure 4 min), and the server does not say.
pub(crate) const IDLE_CHECK_MAX: Duration = Duration::from_secs(60);

/// How long a connection may sit idle before its next use pings it first.
///
/// A server closes a connection idle for longer than its limit (MySQL `wait_timeout`, 8 h by
/// default and often set to seconds or minutes; PostgreSQL `idle_session_timeout`, off by
/// default) and says nothing: the client finds out when its next statement fails. A statement
/// that failed that way may have been sent, so it cannot simply be sent again; a ping has no
/// effect, so it can. Every connection idle for half the server's limit (at most
/// [`IDLE_CHECK_MAX`]) is pinged before it serves a statement, and closed if the ping fails:
/// the sqlx pool's idle ones (`before_acquire`), the kept ones ([`HotConns`]) and MySQL's
/// waiting and wake-lock connections. A connection used within the limit costs nothing more.
#[derive(Debug)]
pub(crate) struct IdleLimit {
    /// In milliseconds; `u64::MAX`: never (an embedded database).
    check_after_ms: AtomicU64,
}

impl IdleLimit {
    /// Never checked: SQLite, which closes no connection.
    pub(crate) fn never() -> Self {
        Self {
            check_after_ms: AtomicU64::new(u64::MAX),
        }
    }

    /// A server's connections, checked after [`IDLE_CHECK_MAX`] until
    /// [`Self::set_server_limit`].
    #[cfg_attr(
        not(any(feature = "postgres", feature = "mysql")),
        allow(dead_code, reason = "server databases only")
    )]
    pub(crate) fn server() -> Self {
        Self {
            check_after_ms: AtomicU64::new(millis(IDLE_CHECK_MAX)),
        }
    }

    /// The server closes connections idle for `limit` (`None` or zero: never): check them
    /// after half of it, at most after [`IDLE_CHECK_MAX`].
    #[cfg_attr(
        not(any(feature = "postgres", feature = "mysql")),
        allow(dead_code, reason = "server databases only")
    )]
    pub(crate) fn set_server_limit(&self, limit: Option<Duration>) {
        let check = limit
            .filter(|limit| !limit.is_zero())
            .map_or(IDLE_CHECK_MAX, |limit| (limit / 2).min(IDLE_CHECK_MAX));
        self.check_after_ms.store(millis(check), Ordering::Relaxed);
    }

    /// How long a connection may idle unchecked; `None`: forever.
    pub(crate) fn check_after(&self) -> Option<Duration> {
        match self.check_after_ms.load(Ordering::Relaxed) {
            u64::MAX => None,
            ms => Some(Duration::from_millis(ms)),
        }
    }

    /// Whether a connection idle for `idle` must be pinged before its next statement.
    pub(crate) fn stale(&self, idle: Duration) -> bool {
        self.check_after().is_some_and(|after| idle >= after)
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX - 1)
}

/// `conn` after `idle`: pinged first if `limit` says so (see [`IdleLimit`]).
pub(crate) async fn checked<DB: sqlx::Database>(
    conn: sqlx::pool::PoolConnection<DB>,
    idle: Duration,
    limit: &IdleLimit,
) -> Option<sqlx::pool::PoolConnection<DB>> {
    if limit.stale(idle) {
        ping(conn).await
    } else {
        Some(conn)
    }
}

/// `conn` if it answers a ping; `None`: it is closed. A ping cancelled mid-way closes the
/// connection too (see [`InUse`]).
pub(crate) async fn ping<DB: sqlx::Database>(
    conn: sqlx::pool::PoolConnection<DB>,
) -> Option<sqlx::pool::PoolConnection<DB>> {
    let mut used = InUse::new(conn);
    match used.conn().ping().await {
        Ok(()) => Some(used.done()),
        Err(err) => {
            tracing::debug!(%err, "a connection that idled was closed by the server");
            None
        }
    }
}

/// Connections kept checked out of the pool between statements.
///
/// sqlx pings every connection it takes back into its pool, so a pooled statement costs a
/// second round trip (on the server, or on SQLite's worker thread). The lock's statements
/// take a connection from here instead and give it back only after a statement succeeded;
/// a failed or cancelled statement drops its connection into the pool's own checks, and a
/// failure also drops the other kept connections (after a server restart they are all dead).
/// At most half the pool is kept (none of a one-connection pool), so the pool keeps serving
/// its other users (LISTEN, [`crate::SqlBackend::pool`]). A kept connection idle for longer
/// than the server may close it is pinged before it serves (see [`IdleLimit`]).
pub(crate) struct HotConns<DB: sqlx::Database> {
    pool: sqlx::Pool<DB>,
    /// Kept connections, and since when each is idle.
    idle: Mutex<Vec<(sqlx::pool::PoolConnection<DB>, Instant)>>,
    keep: usize,
    limit: Arc<IdleLimit>,
    /// Bumped by [`Self::forget_kept`]: a connection taken out before is not kept again.
    epoch: AtomicU64,
}

impl<DB: sqlx::Database> fmt::Debug for HotConns<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HotConns")
            .field("kept", &self.idle.lock().map_or(0, |idle| idle.len()))
            .field("keep", &self.keep)
            .finish_non_exhaustive()
    }
}

impl<DB: sqlx::Database> HotConns<DB> {
    /// Keeps at most `keep` connections (half the pool for a pool of its own).
    pub(crate) fn new(pool: sqlx::Pool<DB>, keep: u32) -> Self {
        Self {
            pool,
            idle: Mutex::default(),
            keep: usize::try_from(keep).unwrap_or(0),
            epoch: AtomicU64::new(0),
            limit: Arc::new(IdleLimit::never()),
        }
    }

    /// Pings a kept connection idle past `limit` before it serves again.
    #[cfg_attr(
        not(any(feature = "postgres", feature = "mysql")),
        allow(dead_code, reason = "server databases only")
    )]
    #[must_use]
    pub(crate) fn with_idle_limit(mut self, limit: Arc<IdleLimit>) -> Self {
        self.limit = limit;
        self
    }

    /// Closes every kept connection, and those in use now when they come back: they serve a
    /// database that is gone (a SQLite file deleted or replaced; see `sqlite::FileWatch`).
    #[cfg_attr(
        not(feature = "sqlite"),
        allow(
            dead_code,
            reason = "SQLite files only are replaced under their clients"
        )
    )]
    pub(crate) fn forget_kept(&self) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
        let kept = std::mem::take(&mut *self.idle.lock().unwrap_or_else(PoisonError::into_inner));
        kept.into_iter().for_each(|(conn, _)| drop(conn.detach()));
    }

    /// The pool itself, for statements that do not go through [`Self::get`].
    pub(crate) fn pool(&self) -> &sqlx::Pool<DB> {
        &self.pool
    }

    /// A connection: a kept one (pinged first if it idled long enough for the server to
    /// close it; closed if that ping fails), or one from the pool.
    pub(crate) async fn get(&self) -> Result<Hot<'_, DB>, sqlx::Error> {
        let epoch = self.epoch.load(Ordering::Acquire);
        let conn = loop {
            let kept = self
                .idle
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .pop();
            match kept {
                Some((conn, since)) => {
                    if let Some(conn) = checked(conn, since.elapsed(), &self.limit).await {
                        break conn;
                    }
                }
                None => break self.pool.acquire().await?,
            }
        };
        Ok(Hot {
            home: self,
            conn: InUse::new(conn),
            epoch,
        })
    }

    /// Lends `conn` (taken out before, e.g. by [`Hot::into_pooled`]) like a connection of
    /// [`Self::get`].
    #[cfg_attr(
        not(feature = "mysql"),
        allow(dead_code, reason = "MySQL keeps a holder's connection")
    )]
    pub(crate) fn adopt(&self, conn: sqlx::pool::PoolConnection<DB>) -> Hot<'_, DB> {
        Hot {
            home: self,
            conn: InUse::new(conn),
            epoch: self.epoch.load(Ordering::Acquire),
        }
    }
}

impl<DB: sqlx::Database> HotConns<DB>
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
{
    /// Runs one statement on a connection from [`Self::get`].
    pub(crate) async fn execute<'q, A>(
        &self,
        query: sqlx::query::Query<'q, DB, A>,
    ) -> Result<DB::QueryResult, sqlx::Error>
    where
        A: sqlx::IntoArguments<DB> + Send + 'q,
    {
        let mut hot = self.get().await?;
        let result = query.execute(hot.conn()).await;
        hot.keep(result)
    }

    /// Runs one statement that returns at most one row.
    pub(crate) async fn fetch_optional<'q, A>(
        &self,
        query: sqlx::query::Query<'q, DB, A>,
    ) -> Result<Option<DB::Row>, sqlx::Error>
    where
        A: sqlx::IntoArguments<DB> + Send + 'q,
    {
        let mut hot = self.get().await?;
        let result = query.fetch_optional(hot.conn()).await;
        hot.keep(result)
    }

    /// Runs one statement that returns rows.
    pub(crate) async fn fetch_all<'q, A>(
        &self,
        query: sqlx::query::Query<'q, DB, A>,
    ) -> Result<Vec<DB::Row>, sqlx::Error>
    where
        A: sqlx::IntoArguments<DB> + Send + 'q,
    {
        let mut hot = self.get().await?;
        let result = query.fetch_all(hot.conn()).await;
        hot.keep(result)
    }
}

impl<DB: sqlx::Database> Drop for HotConns<DB> {
    fn drop(&mut self) {
        let kept = std::mem::take(self.idle.get_mut().unwrap_or_else(PoisonError::into_inner));
        if tokio::runtime::Handle::try_current().is_err() {
            // Handing a connection back to the pool spawns a task: without a runtime, close
            // them here instead.
            kept.into_iter().for_each(|(conn, _)| drop(conn.detach()));
        }
    }
}

/// A connection taken out of a pool, closed rather than given back when dropped in use: a
/// statement cancelled mid-way (its caller timed out, or was dropped) may leave the rest of
/// its answer unread, and sqlx does not always skip it. The next statement on that
/// connection would then read it as its own answer (sqlx's MySQL driver panics decoding a
/// prepared statement's column definitions as a `BEGIN`'s answer). So only a use that ended
/// ([`Self::done`]) gives the connection back.
pub(crate) struct InUse<DB: sqlx::Database>(Option<sqlx::pool::PoolConnection<DB>>);

impl<DB: sqlx::Database> InUse<DB> {
    /// A connection of `pool`.
    pub(crate) async fn acquire(pool: &sqlx::Pool<DB>) -> Result<Self, sqlx::Error> {
        Ok(Self::new(pool.acquire().await?))
    }

    /// Guards `conn` until [`Self::done`].
    pub(crate) fn new(conn: sqlx::pool::PoolConnection<DB>) -> Self {
        Self(Some(conn))
    }

    /// The connection, to run statements on.
    pub(crate) fn conn(&mut self) -> &mut DB::Connection {
        self.0
            .as_mut()
            .expect("the connection is present until done or closed")
    }

    /// The connection, after its statements ended (with an answer or an error).
    pub(crate) fn done(mut self) -> sqlx::pool::PoolConnection<DB> {
        self.0
            .take()
            .expect("the connection is present until done or closed")
    }

    /// Closes the connection instead of giving it back (as dropping does).
    pub(crate) fn close(self) {
        drop(self);
    }
}

impl<DB: sqlx::Database> Drop for InUse<DB> {
    fn drop(&mut self) {
        if let Some(conn) = self.0.take() {
            drop(conn.detach());
        }
    }
}

/// A connection from [`HotConns::get`]; closed if dropped before [`Hot::keep`] (see
/// [`InUse`]).
pub(crate) struct Hot<'a, DB: sqlx::Database> {
    home: &'a HotConns<DB>,
    conn: InUse<DB>,
    /// The home's epoch when this connection was taken out.
    epoch: u64,
}

impl<DB: sqlx::Database> Hot<'_, DB> {
    /// The connection, to run statements on.
    pub(crate) fn conn(&mut self) -> &mut DB::Connection {
        self.conn.conn()
    }

    /// The connection, taken out of the kept ones for a longer use (see [`HotConns::adopt`]).
    #[cfg_attr(
        not(feature = "mysql"),
        allow(dead_code, reason = "MySQL keeps a holder's connection")
    )]
    pub(crate) fn into_pooled(self) -> sqlx::pool::PoolConnection<DB> {
        self.conn.done()
    }

    /// Passes a statement's result through: keeps the connection for the next statement if it
    /// succeeded, drops every kept connection if it failed (giving this one back to the
    /// pool's own checks).
    pub(crate) fn keep<T>(self, result: Result<T, sqlx::Error>) -> Result<T, sqlx::Error> {
        let Self { home, conn, epoch } = self;
        let conn = conn.done();
        if epoch != home.epoch.load(Ordering::Acquire) {
            // Its database went away while it was out (see `HotConns::forget_kept`).
            drop(conn.detach());
            return result;
        }
        let mut idle = home.idle.lock().unwrap_or_else(PoisonError::into_inner);
        match &result {
            Ok(_) if idle.len() < home.keep => idle.push((conn, Instant::now())),
            Ok(_) => {}
            Err(_) => idle.clear(),
        }
        result
    }

    /// For a transaction, or a statement whose failure may leave server state on its
    /// connection (a wake lock): passes the result through, keeping the connection after a
    /// success and closing it after a failure, so that the server rolls back or lets go.
    /// Dropped before (the caller was cancelled mid-way, perhaps between `BEGIN` and its
    /// answer), the connection is closed too (see [`InUse`]): a connection left inside a
    /// transaction must never serve the next statement.
    pub(crate) fn finish<T>(self, result: Result<T, sqlx::Error>) -> Result<T, sqlx::Error> {
        if result.is_ok() {
            return self.keep(result);
        }
        self.conn.close();
        result
    }
}

#[cfg(test)]
mod idle_tests {
    use super::*;

    /// A server's connections are checked after half its idle limit, at most after
    /// [`IDLE_CHECK_MAX`] (also with no limit: middleboxes drop idle connections too);
    /// SQLite's never.
    #[test]
    fn connections_are_checked_after_half_the_servers_idle_limit() {
        let limit = IdleLimit::server();
        assert_eq!(limit.check_after(), Some(IDLE_CHECK_MAX));
        limit.set_server_limit(Some(Duration::from_secs(2)));
        assert_eq!(limit.check_after(), Some(Duration::from_secs(1)));
        assert!(!limit.stale(Duration::from_millis(999)));
        assert!(limit.stale(Duration::from_secs(1)));
        limit.set_server_limit(Some(Duration::from_secs(28_800)));
        assert_eq!(limit.check_after(), Some(IDLE_CHECK_MAX));
        for off in [None, Some(Duration::ZERO)] {
            limit.set_server_limit(off);
            assert_eq!(limit.check_after(), Some(IDLE_CHECK_MAX));
        }
        let never = IdleLimit::never();
        assert_eq!(never.check_after(), None);
        assert!(!never.stale(Duration::from_secs(365 * 24 * 3600)));
    }
}

#[cfg(all(test, feature = "sqlite"))]
mod hot_tests {
    use super::*;

    /// A pool of at most `max` connections on a new SQLite file in `dir`.
    async fn file_pool(dir: &tempfile::TempDir, max: u32) -> sqlx::SqlitePool {
        let url = format!("sqlite://{}?mode=rwc", dir.path().join("t.db").display());
        sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(max)
            .connect(&url)
            .await
            .unwrap()
    }

    /// A transaction cancelled mid-way (here: its guard dropped right after `BEGIN`) closes
    /// its connection; the next statement gets a fresh one, outside any transaction.
    #[tokio::test]
    async fn an_unfinished_transaction_never_serves_the_next_statement() {
        let dir = tempfile::tempdir().unwrap();
        let pool = file_pool(&dir, 1).await;
        let conns = HotConns::new(pool, 1);
        let mut cancelled = conns.get().await.unwrap();
        sqlx::query("BEGIN IMMEDIATE")
            .execute(cancelled.conn())
            .await
            .unwrap();
        drop(cancelled);
        let mut hot = conns.get().await.unwrap();
        let begun = sqlx::query("BEGIN IMMEDIATE").execute(hot.conn()).await;
        assert!(
            begun.is_ok(),
            "the next user was inside the old transaction: {begun:?}"
        );
    }

    /// Whether the next connection of `pool` (of one connection) is the one that made the
    /// temporary table `marker` (a temporary table lives on its connection only).
    async fn sees_marker(pool: &sqlx::SqlitePool) -> bool {
        let mut conn = pool.acquire().await.unwrap();
        sqlx::query("SELECT count(*) FROM marker")
            .execute(&mut *conn)
            .await
            .is_ok()
    }

    /// A connection dropped in use (its statement cancelled: here, before `done`) is closed,
    /// never given back to serve the next statement; one whose use ended is given back. So is
    /// a hot connection dropped before `keep`.
    #[tokio::test]
    async fn a_connection_dropped_in_use_is_closed() {
        let dir = tempfile::tempdir().unwrap();
        let pool = file_pool(&dir, 1).await;
        let mark = async |conn: &mut sqlx::SqliteConnection| {
            sqlx::query("CREATE TEMP TABLE marker (x INTEGER)")
                .execute(conn)
                .await
                .unwrap();
        };
        let mut used = InUse::acquire(&pool).await.unwrap();
        mark(used.conn()).await;
        drop(used.done());
        assert!(
            sees_marker(&pool).await,
            "a finished use gives its connection back"
        );
        let mut used = InUse::acquire(&pool).await.unwrap();
        sqlx::query("DROP TABLE marker")
            .execute(used.conn())
            .await
            .unwrap();
        mark(used.conn()).await;
        drop(used);
        assert!(
            !sees_marker(&pool).await,
            "a connection dropped in use was reused"
        );
        let conns = HotConns::new(pool.clone(), 1);
        let mut hot = conns.get().await.unwrap();
        mark(hot.conn()).await;
        drop(hot);
        assert!(
            !sees_marker(&pool).await,
            "a hot connection dropped in use was reused"
        );
    }

    #[tokio::test]
    async fn hot_connections_are_reused_after_success_and_dropped_after_failure() {
        let dir = tempfile::tempdir().unwrap();
        let pool = file_pool(&dir, 4).await;
        let conns = HotConns::new(pool, 2);
        // A temporary table lives on one connection only: seeing it means the same connection.
        let mut hot = conns.get().await.unwrap();
        let made = sqlx::query("CREATE TEMP TABLE marker (x INTEGER)")
            .execute(hot.conn())
            .await;
        hot.keep(made).unwrap();
        let mut hot = conns.get().await.unwrap();
        let seen = sqlx::query("SELECT count(*) FROM marker")
            .execute(hot.conn())
            .await;
        hot.keep(seen).expect("the kept connection is reused");
        // A failure drops the kept connections: the next one is new (no marker table).
        let mut hot = conns.get().await.unwrap();
        let failed = sqlx::query("SELECT * FROM no_such_table")
            .execute(hot.conn())
            .await;
        assert!(hot.keep(failed).is_err());
        assert!(conns.idle.lock().unwrap().is_empty());
        let mut hot = conns.get().await.unwrap();
        let seen = sqlx::query("SELECT count(*) FROM marker")
            .execute(hot.conn())
            .await;
        assert!(
            hot.keep(seen).is_err(),
            "a fresh connection has no marker table"
        );
    }
}
