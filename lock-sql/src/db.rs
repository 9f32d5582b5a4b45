//! What every database dialect implements: the lock table's statements, executed.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;

use crate::fence::FencedUpdate;
use distlock_core::Error;
use distlock_core::service_url;

use crate::{Dialect, SqlConfig, SqlPool, map_err};

/// A row of the lock table as the attempt needs it.
#[derive(Debug)]
pub(crate) struct Peek {
    /// The owner column (possibly of an expired lease).
    pub(crate) owner: Option<String>,
    /// The version column.
    pub(crate) version: i64,
    /// Remaining lease in microseconds when a live holder exists.
    pub(crate) remaining_us: Option<i64>,
    /// The waiter holding the reservation (possibly expired).
    pub(crate) next_owner: Option<String>,
    /// Its age (the version it first saw busy).
    pub(crate) next_since: Option<i64>,
    /// Remaining reservation in microseconds when it is live.
    pub(crate) next_remaining_us: Option<i64>,
}

/// A live holder as [`Db::list`] reports it.
#[derive(Debug)]
pub(crate) struct Listed {
    /// The lock name.
    pub(crate) name: String,
    /// The owner column.
    pub(crate) owner: String,
    /// The version column: the holder's fencing token.
    pub(crate) version: i64,
    /// Remaining lease in microseconds.
    pub(crate) remaining_us: i64,
}

impl Listed {
    /// Reads `name, owner, version, remaining_us` from a row.
    pub(crate) fn from_row<R: sqlx::Row>(row: &R) -> Result<Self, sqlx::Error>
    where
        usize: sqlx::ColumnIndex<R>,
        for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
        for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    {
        Ok(Self {
            name: row.try_get(0)?,
            owner: row.try_get(1)?,
            version: row.try_get(2)?,
            remaining_us: row.try_get(3)?,
        })
    }
}

/// The answer to a reservation claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Claim {
    /// An older waiter holds a live reservation.
    Refused,
    /// The reservation is ours.
    Granted,
    /// The reservation is ours and the lock was free when it was written: a release came
    /// between the caller's read and the claim, and notified nobody (backends with events).
    GrantedFree,
}

impl Claim {
    /// The answer of a backend that cannot tell whether the lock is free: granted or not.
    #[cfg_attr(
        not(any(feature = "mysql", feature = "sqlite")),
        allow(dead_code, reason = "used by the MySQL and SQLite dialects only")
    )]
    pub(crate) fn granted(granted: bool) -> Self {
        if granted {
            Self::Granted
        } else {
            Self::Refused
        }
    }
}

/// One database's statements. Every method is a single statement (a round trip), except
/// where noted, and returns sqlx's error for the caller to classify.
#[async_trait]
pub(crate) trait Db: Send + Sync + fmt::Debug + 'static {
    /// Whether releases are pushed to waiters (LISTEN/NOTIFY).
    fn has_events(&self) -> bool;

    /// The atomic acquire: takes the row when free, expired, or already this owner's, and not
    /// reserved by another waiter; bumps the version. Returns the new version.
    ///
    /// `wake_waiters`: the taker may hold the waiter reservation, which a take clears; backends
    /// with events then tell the other waiters in the same statement, so that the next one
    /// claims it.
    async fn take(
        &self,
        name: &str,
        owner: &str,
        ttl_us: i64,
        wake_waiters: bool,
    ) -> Result<Option<i64>, sqlx::Error>;

    /// Reads the row.
    async fn peek(&self, name: &str) -> Result<Option<Peek>, sqlx::Error>;

    /// Claims (or keeps) the waiter reservation unless an older waiter holds a live one.
    async fn reserve(
        &self,
        name: &str,
        owner: &str,
        since: i64,
        hold_us: i64,
    ) -> Result<Claim, sqlx::Error>;

    /// Owner-and-version-checked extension of a live lease.
    async fn renew(
        &self,
        name: &str,
        owner: &str,
        version: i64,
        ttl_us: i64,
    ) -> Result<bool, sqlx::Error>;

    /// Owner-and-version-checked release of a live lease (wakes waiters).
    async fn release(&self, name: &str, owner: &str, version: i64) -> Result<bool, sqlx::Error>;

    /// Drops this owner's lock and reservation, whatever the version.
    async fn abandon(&self, name: &str, owner: &str) -> Result<(), sqlx::Error>;

    /// Frees the lock whoever holds it; the version is kept.
    async fn force_release(&self, name: &str) -> Result<bool, sqlx::Error>;

    /// The live holders of names starting with `prefix` (`""`: all), by name, at most
    /// `limit`. One statement on the pool (an operator's read, not a hot path).
    async fn list(&self, prefix: &str, limit: i64) -> Result<Vec<Listed>, sqlx::Error>;

    /// `UPDATE table SET ..., fence = token WHERE key = ? AND (fence IS NULL OR fence <= token)`.
    async fn fenced_update(&self, update: &FencedUpdate, token: i64) -> Result<bool, sqlx::Error>;

    /// A wake-up subscription for `name`, for backends with events.
    fn subscribe(&self, name: &str, owner: &str) -> Option<Subscription> {
        let _ = (name, owner);
        None
    }

    /// The typed pool.
    fn pool(&self) -> SqlPool;
}

/// Server-side ids of the connections a pool opened.
#[derive(Debug, Default)]
pub(crate) struct Sessions(Mutex<BTreeSet<i64>>);

impl Sessions {
    #[cfg_attr(
        not(any(feature = "postgres", feature = "mysql")),
        allow(dead_code, reason = "used by the server dialects only")
    )]
    pub(crate) fn add(&self, id: i64) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id);
    }

    pub(crate) fn list(&self) -> Vec<i64> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .copied()
            .collect()
    }
}

/// Per-name wake-ups fed by a notification listener. A wake-up may target one waiter (the
/// holder of the reservation): then only that waiter's task wakes, so a release neither
/// stampedes the waiters nor wakes any but the next one.
#[derive(Debug, Default)]
pub(crate) struct Notifier {
    /// Name, then owner (unique per attempt), to the attempt's wake-ups.
    names: Mutex<Names>,
}

/// Whether the last wake-up was addressed to this waiter alone. A send always wakes the
/// receiver, equal value or not.
type Wake = bool;

type Names = HashMap<String, HashMap<String, watch::Sender<Wake>>>;

#[cfg_attr(
    not(feature = "postgres"),
    allow(dead_code, reason = "LISTEN/NOTIFY is PostgreSQL's")
)]
impl Notifier {
    fn names(&self) -> std::sync::MutexGuard<'_, Names> {
        self.names.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn subscribe(self: &Arc<Self>, name: &str, owner: &str) -> Subscription {
        let rx = self
            .names()
            .entry(name.to_owned())
            .or_default()
            .entry(owner.to_owned())
            .or_insert_with(|| watch::Sender::new(false))
            .subscribe();
        Subscription {
            rx,
            notifier: self.clone(),
            name: name.to_owned(),
            owner: owner.to_owned(),
        }
    }

    /// Wakes the waiters of `name`: only `target` if given (if it waits here), else all.
    pub(crate) fn wake(&self, name: &str, target: Option<&str>) {
        let names = self.names();
        let Some(owners) = names.get(name) else {
            return;
        };
        match target {
            Some(target) => {
                if let Some(tx) = owners.get(target) {
                    tx.send_replace(true);
                }
            }
            None => owners.values().for_each(wake_one),
        }
    }

    /// After a listener reconnect, events may have been missed: wake everyone.
    pub(crate) fn wake_all(&self) {
        self.names()
            .values()
            .flat_map(HashMap::values)
            .for_each(wake_one);
    }
}

fn wake_one(tx: &watch::Sender<Wake>) {
    tx.send_replace(false);
}

/// A waiter's view of the wake-ups of one name.
#[derive(Debug)]
pub(crate) struct Subscription {
    rx: watch::Receiver<Wake>,
    notifier: Arc<Notifier>,
    name: String,
    owner: String,
}

impl Subscription {
    /// Marks every wake-up so far as seen: call before a poll's statement is sent.
    pub(crate) fn mark_seen(&mut self) {
        self.rx.borrow_and_update();
    }

    /// Resolves on the next wake-up for this waiter after [`mark_seen`](Self::mark_seen):
    /// `true` if it was addressed to this waiter alone (a release handed it the lock).
    pub(crate) async fn changed(&mut self) -> bool {
        if self.rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
        *self.rx.borrow_and_update()
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut names = self.notifier.names();
        if let Some(owners) = names.get_mut(&self.name) {
            owners.remove(&self.owner);
            if owners.is_empty() {
                names.remove(&self.name);
            }
        }
    }
}

/// Splits a notification payload `<owner byte length>:<owner><name>`; an empty owner
/// addresses every waiter.
#[cfg_attr(
    not(feature = "postgres"),
    allow(dead_code, reason = "LISTEN/NOTIFY is PostgreSQL's")
)]
pub(crate) fn parse_payload(payload: &str) -> Option<(Option<&str>, &str)> {
    let (len, rest) = payload.split_once(':')?;
    let len: usize = len.parse().ok()?;
    if !rest.is_char_boundary(len) {
        return None;
    }
    let (owner, name) = rest.split_at(len);
    Some(((!owner.is_empty()).then_some(owner), name))
}

/// Binds one [`SqlValue`] to a query of any of the databases.
macro_rules! bind_value {
    ($query:expr, $value:expr) => {
        match $value {
            $crate::SqlValue::Null => $query.bind(None::<i64>),
            $crate::SqlValue::Int(v) => $query.bind(*v),
            $crate::SqlValue::Float(v) => $query.bind(*v),
            $crate::SqlValue::Bool(v) => $query.bind(*v),
            $crate::SqlValue::Text(v) => $query.bind(v.clone()),
            $crate::SqlValue::Bytes(v) => $query.bind(v.clone()),
        }
    };
}
pub(crate) use bind_value;

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

/// Classifies a connect error: wrong database or credentials are the caller's to fix; a
/// network failure names the server and the cause in one line.
pub(crate) fn connect_err(config: &SqlConfig, err: sqlx::Error) -> Error {
    let url = config.redacted_url();
    match &err {
        sqlx::Error::Io(io) => {
            let server = url::Url::parse(&config.url)
                .ok()
                .and_then(|u| {
                    let host = u.host_str()?.to_owned();
                    Some(match u.port() {
                        Some(port) => format!("{host}:{port}"),
                        None => host,
                    })
                })
                .map_or_else(|| url.clone(), |s| service_url::echo(&s));
            let name = match config.dialect {
                Dialect::Postgres => "PostgreSQL",
                Dialect::MySql => "MySQL",
                Dialect::Sqlite => "SQLite",
            };
            Error::unavailable(
                format!(
                    "cannot connect to {name} at {server}: {}",
                    distlock_core::io_cause(io).unwrap_or_default()
                ),
                err,
            )
        }
        sqlx::Error::Database(db)
            if matches!(
                db.code().as_deref(),
                Some("3D000" | "28000" | "28P01" | "42000")
            ) =>
        {
            Error::backend(format!("cannot use {url}: {err}"), err)
        }
        sqlx::Error::Configuration(_) => Error::InvalidConfig(format!("{url}: {err}")),
        _ => map_err(&format!("connecting to {url}"), err),
    }
}

/// A statement that does not prepare: the table is missing or of the wrong shape.
pub(crate) fn shape_err(table: &str, err: sqlx::Error) -> Error {
    match &err {
        sqlx::Error::Database(_) => Error::backend(
            format!(
                "the lock table {table} is missing or has the wrong shape (expected columns name, owner, \
                 version, expires_at, next_owner, next_since, next_expires with name as primary key): {err}"
            ),
            err,
        ),
        _ => map_err("checking the lock table", err),
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
/// its other users (LISTEN, [`crate::SqlBackend::pool`]).
pub(crate) struct HotConns<DB: sqlx::Database> {
    pool: sqlx::Pool<DB>,
    idle: Mutex<Vec<sqlx::pool::PoolConnection<DB>>>,
    keep: usize,
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
    pub(crate) fn new(pool: sqlx::Pool<DB>, max_connections: u32) -> Self {
        Self {
            pool,
            idle: Mutex::default(),
            keep: usize::try_from(max_connections / 2).unwrap_or(0),
        }
    }

    /// The pool itself, for statements that do not go through [`Self::get`].
    pub(crate) fn pool(&self) -> &sqlx::Pool<DB> {
        &self.pool
    }

    /// A connection: a kept one, or one from the pool.
    pub(crate) async fn get(&self) -> Result<Hot<'_, DB>, sqlx::Error> {
        let kept = self
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        let conn = match kept {
            Some(conn) => conn,
            None => self.pool.acquire().await?,
        };
        Ok(Hot { home: self, conn })
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
}

impl<DB: sqlx::Database> Drop for HotConns<DB> {
    fn drop(&mut self) {
        let kept = std::mem::take(self.idle.get_mut().unwrap_or_else(PoisonError::into_inner));
        if tokio::runtime::Handle::try_current().is_err() {
            // Handing a connection back to the pool spawns a task: without a runtime, close
            // them here instead.
            kept.into_iter().for_each(|conn| drop(conn.detach()));
        }
    }
}

/// A connection from [`HotConns::get`].
pub(crate) struct Hot<'a, DB: sqlx::Database> {
    home: &'a HotConns<DB>,
    conn: sqlx::pool::PoolConnection<DB>,
}

impl<DB: sqlx::Database> Hot<'_, DB> {
    /// The connection, to run statements on.
    pub(crate) fn conn(&mut self) -> &mut DB::Connection {
        &mut self.conn
    }

    /// Passes a statement's result through: keeps the connection for the next statement if it
    /// succeeded, drops every kept connection if it failed.
    pub(crate) fn keep<T>(self, result: Result<T, sqlx::Error>) -> Result<T, sqlx::Error> {
        let Self { home, conn } = self;
        let mut idle = home.idle.lock().unwrap_or_else(PoisonError::into_inner);
        match &result {
            Ok(_) if idle.len() < home.keep => idle.push(conn),
            Ok(_) => {}
            Err(_) => idle.clear(),
        }
        result
    }
}

#[cfg(all(test, feature = "sqlite"))]
mod hot_tests {
    use super::*;

    #[tokio::test]
    async fn hot_connections_are_reused_after_success_and_dropped_after_failure() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}?mode=rwc", dir.path().join("hot.db").display());
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(4)
            .connect(&url)
            .await
            .unwrap();
        let conns = HotConns::new(pool, 4);
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

#[cfg(test)]
mod tests {
    use super::{Arc, Notifier, parse_payload};

    #[test]
    fn payloads() {
        assert_eq!(parse_payload("3:abcname"), Some((Some("abc"), "name")));
        assert_eq!(parse_payload("0:a:b"), Some((None, "a:b")));
        assert_eq!(parse_payload("2:é🔒"), Some((Some("é"), "🔒")));
        assert_eq!(parse_payload("1:é"), None);
        assert_eq!(parse_payload("x"), None);
    }

    /// A wake-up addressed to one waiter wakes that waiter's task only; an unaddressed one
    /// wakes every waiter of the name; a dropped subscription leaves nothing behind.
    #[tokio::test]
    async fn wake_ups_reach_only_the_waiters_they_name() {
        let notifier = Arc::new(Notifier::default());
        let mut a = notifier.subscribe("x", "a");
        let mut b = notifier.subscribe("x", "b");
        let mut other = notifier.subscribe("y", "c");
        a.mark_seen();
        b.mark_seen();
        other.mark_seen();
        notifier.wake("x", Some("a"));
        assert!(a.changed().await, "not handed to its target");
        assert!(!b.rx.has_changed().expect("open"), "woke a bystander");
        notifier.wake("x", Some("elsewhere"));
        notifier.wake("x", None);
        assert!(!a.changed().await);
        assert!(!b.changed().await);
        assert!(!other.rx.has_changed().expect("open"), "woke another name");
        notifier.wake_all();
        assert!(!other.changed().await);
        drop((a, b, other));
        assert!(notifier.names().is_empty());
    }
}
