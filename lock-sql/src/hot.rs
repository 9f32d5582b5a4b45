//! Connections kept checked out of the pool between statements ([`HotConns`]), served to
//! statements in the order they asked.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use tokio::sync::{Semaphore, SemaphorePermit};

use crate::pool::{IdleLimit, InUse, checked};

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
///
/// First come, first served: a statement takes a turn (one of as many as the pool has
/// connections, handed out in the order asked) before a connection, and gives it back with
/// the connection. Taking a kept connection whenever one was idle let new statements pass
/// those waiting in the pool's queue: with 64 operations in flight on 10 connections, some
/// waited the whole run (MariaDB, 10,000 read holds: 2.5 s, the pool's timeout, and failed
/// releases).
pub(crate) struct HotConns<DB: sqlx::Database> {
    pool: sqlx::Pool<DB>,
    /// The turns: one per connection of the pool, fair (first asked, first served).
    turns: Semaphore,
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
            turns: Semaphore::new(
                usize::try_from(pool.options().get_max_connections())
                    .unwrap_or(usize::MAX)
                    .clamp(1, Semaphore::MAX_PERMITS),
            ),
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

    /// A connection, on the statement's turn: a kept one (pinged first if it idled long
    /// enough for the server to close it; closed if that ping fails), or one from the pool.
    ///
    /// # Errors
    /// `PoolTimedOut` when the turn and the connection took longer than the pool's acquire
    /// timeout together (the bound a connection from the pool alone has); as the pool's
    /// acquire otherwise.
    ///
    /// Cancel safety: dropped while waiting for its turn, it leaves the line.
    pub(crate) async fn get(&self) -> Result<Hot<'_, DB>, sqlx::Error> {
        let bound = self.pool.options().get_acquire_timeout();
        let taken = tokio::time::timeout(bound, async {
            // Never closed: the semaphore lives as long as `self`.
            let turn = self.turns.acquire().await.ok();
            loop {
                let kept = self
                    .idle
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .pop();
                match kept {
                    Some((conn, since)) => {
                        if let Some(conn) = checked(conn, since.elapsed(), &self.limit).await {
                            return Ok::<_, sqlx::Error>((conn, turn));
                        }
                    }
                    None => return Ok((self.pool.acquire().await?, turn)),
                }
            }
        });
        let epoch = self.epoch.load(Ordering::Acquire);
        let (conn, turn) = taken.await.map_err(|_| sqlx::Error::PoolTimedOut)??;
        Ok(Hot {
            home: self,
            conn: InUse::new(conn),
            _turn: turn,
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
            _turn: None,
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

/// A connection from [`HotConns::get`]; closed if dropped before [`Hot::keep`] (see
/// [`InUse`]).
pub(crate) struct Hot<'a, DB: sqlx::Database> {
    home: &'a HotConns<DB>,
    conn: InUse<DB>,
    /// The statement's turn (none for an adopted connection), given back with the
    /// connection.
    _turn: Option<SemaphorePermit<'a>>,
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
        let Self {
            home, conn, epoch, ..
        } = self;
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
    /// connection (a wake lock) or whose answer may not be its own: passes the result
    /// through, keeping the connection after a success and closing it after a failure, so
    /// that the server rolls back or lets go; a failure also drops every kept connection, as
    /// [`Self::keep`]'s does. Dropped before (the caller was cancelled mid-way, perhaps
    /// between `BEGIN` and its answer), the connection is closed too (see [`InUse`]): a
    /// connection left inside a transaction must never serve the next statement.
    pub(crate) fn finish<T>(self, result: Result<T, sqlx::Error>) -> Result<T, sqlx::Error> {
        if result.is_ok() {
            return self.keep(result);
        }
        self.home
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
        self.conn.close();
        result
    }
}

#[cfg(all(test, feature = "sqlite"))]
mod tests {
    use std::time::Duration;

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

    /// A failure closes its own connection and drops the kept ones (after a restart they
    /// are all dead), as a failed kept statement does.
    #[tokio::test]
    async fn a_finished_failure_drops_the_kept_connections() {
        let dir = tempfile::tempdir().unwrap();
        let pool = file_pool(&dir, 4).await;
        let conns = HotConns::new(pool, 2);
        let (first, second) = (conns.get().await.unwrap(), conns.get().await.unwrap());
        first.keep(Ok(())).unwrap();
        assert_eq!(conns.idle.lock().unwrap().len(), 1);
        let failed = second.finish(Err::<(), _>(sqlx::Error::Protocol("out of step".into())));
        assert!(failed.is_err());
        assert!(
            conns.idle.lock().unwrap().is_empty(),
            "a failure kept the other connections"
        );
    }

    /// A connection given back goes to the statement that waited longest, not to the pool's
    /// queue nor to a newcomer; the next waiter gets it after that one.
    #[tokio::test]
    async fn a_kept_connection_goes_to_the_longest_waiter() {
        let dir = tempfile::tempdir().unwrap();
        let pool = file_pool(&dir, 1).await;
        let conns = HotConns::new(pool, 1);
        let first = conns.get().await.unwrap();
        let (longest, next) = (conns.get(), conns.get());
        tokio::pin!(longest, next);
        let short = Duration::from_millis(50);
        assert!(tokio::time::timeout(short, &mut longest).await.is_err());
        assert!(tokio::time::timeout(short, &mut next).await.is_err());
        first.keep(Ok(())).unwrap();
        assert!(
            tokio::time::timeout(short, &mut next).await.is_err(),
            "the later waiter was served first"
        );
        let served = tokio::time::timeout(Duration::from_secs(5), &mut longest)
            .await
            .expect("the longest waiter is handed the connection")
            .unwrap();
        served.keep(Ok(())).unwrap();
        let served = tokio::time::timeout(Duration::from_secs(5), &mut next)
            .await
            .expect("then the next one")
            .unwrap();
        served.keep(Ok(())).unwrap();
        assert_eq!(conns.idle.lock().unwrap().len(), 1);
    }

    /// Waiting for a turn counts against the pool's acquire timeout, as waiting in the pool
    /// does: a statement behind one that never ends gives up with `PoolTimedOut`.
    #[tokio::test]
    async fn a_turn_is_bounded_by_the_pools_acquire_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}?mode=rwc", dir.path().join("t.db").display());
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_millis(200))
            .connect(&url)
            .await
            .unwrap();
        let conns = HotConns::new(pool, 1);
        let _busy = conns.get().await.unwrap();
        let waited = tokio::time::timeout(Duration::from_secs(5), conns.get()).await;
        assert!(
            matches!(waited, Ok(Err(sqlx::Error::PoolTimedOut))),
            "{:?}",
            waited.map(|r| r.map(|_| ()))
        );
    }
}
