//! Opening the pool (a server database's: [`open_server`]), connections guarded while in use
//! ([`InUse`]), and how long a connection may sit idle before it is checked ([`IdleLimit`]);
//! the connections kept checked out between statements are [`crate::hot`]'s.

#[cfg(any(feature = "postgres", feature = "mysql"))]
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

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
/// connection, no ping before each use (see [`HotConns`](crate::hot::HotConns)) unless the connection idled long
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
/// the sqlx pool's idle ones (`before_acquire`), the kept ones ([`HotConns`](crate::hot::HotConns)) and MySQL's
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
