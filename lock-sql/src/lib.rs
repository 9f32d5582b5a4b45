//! PostgreSQL, MySQL/MariaDB and SQLite backends for distlock, one cargo feature each
//! (`postgres`, `mysql`, `sqlite`; `sqlite` is the default and the project's embedded backend).
//!
//! ```no_run
//! # async fn demo() -> Result<(), distlock_core::Error> {
//! use distlock_sql::distlock_core::{AcquireOptions, ClientConfig, DistributedLock};
//!
//! // A file next to the program: created on first use, with its table, in WAL mode.
//! let client = distlock_sql::connect("sqlite://locks.db", ClientConfig::default()).await?;
//! let guard = client.acquire("nightly-report", &AcquireOptions::default()).await?;
//! println!("fencing token {}", guard.token());
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! # The protocol
//!
//! One table (default `distlock_locks`, created at connect unless `create_table=false`; the
//! connect step also prepares every statement, so a table of the wrong shape is reported then):
//!
//! | column | meaning |
//! |---|---|
//! | `name` | the lock name, primary key, bound as a parameter and compared byte for byte (`TEXT COLLATE "C"` on PostgreSQL, `VARBINARY` on MySQL, `TEXT` with SQLite's binary collation), so no two distinct names collide |
//! | `owner` | the holder's unique owner value, `NULL` when released |
//! | `version` | **the fencing token**: incremented by every acquisition, never reset, kept on release |
//! | `expires_at` | end of the lease, on the **database's** clock |
//! | `next_owner`, `next_since`, `next_expires` | the waiter reservation (below) |
//!
//! - **Acquire** is one upsert statement (PostgreSQL: an `UPDATE .. WHERE free` and, for a
//!   missing row, an `INSERT .. ON CONFLICT DO NOTHING` in one statement, so that a refused
//!   take locks no row and writes nothing; MySQL `ON DUPLICATE KEY UPDATE`; SQLite
//!   `ON CONFLICT DO UPDATE .. WHERE`) that takes the row only when it is free, expired (compared with
//!   `now()` / `UTC_TIMESTAMP(6)` / SQLite's `unixepoch('subsec')`, never the client's clock) or
//!   already this attempt's, and not reserved by another waiter; it sets the owner and the
//!   expiry and increments `version`. The database serializes upserts of one row, so at most one
//!   owner is live and versions are strictly increasing: [`FencingGuarantee::Linearizable`],
//!   as long as rows are never deleted (releases keep the row; do not delete them by hand).
//! - **Renew** and **release** are `UPDATE .. WHERE name = ? AND owner = ? AND version = ? AND
//!   expires_at > now`; the affected-row count decides, and zero answers
//!   [`Error::NotHeld`].
//! - **Abandon** (an attempt that ends without a guard) clears the owner's lock and
//!   reservation by owner value, so a lock granted by a reply that never arrived is freed.
//! - **Waiters**: a waiting attempt that finds the lock busy claims the single reservation
//!   slot of the row unless an *older* waiter (one that first saw a lower `version`) holds a
//!   live one; the upsert refuses everybody else while the reservation lives (1 s, renewed by
//!   the waiter's polls). The oldest waiter therefore gets the lock next, so a client that
//!   releases and re-acquires at once cannot starve the others. It is not strict FIFO (the
//!   slot goes to the oldest waiter *that has polled*), so `fifo` is not declared. After its
//!   first busy answer a waiter reads the row before it writes: busy polls cost no commit, and
//!   the reservation is written only when it is claimed or half expired.
//! - **Wake-ups**: on PostgreSQL the releasing statement runs
//!   `pg_notify('distlock:<table>', ...)` when a waiter holds the reservation, addressed to
//!   that waiter; a `LISTEN`ing connection per backend wakes that waiter's task and no other
//!   ([`WakeUp::Event`]). Its taking statement wakes the other waiters, so the next one
//!   claims the reservation (a claim returns whether the lock is free by then, so a release
//!   between a waiter's read and its claim is not missed). A lost notification (listener
//!   reconnect) wakes everybody; the core's backoff maximum is the safety net. MySQL and
//!   SQLite poll ([`WakeUp::Polling`]) with the core's jittered backoff bounded by the
//!   holder's remaining lease; the reserved waiter reads every 1-20 ms.
//! - **Loss** is detected by renewal (a refused owner-checked renewal, or the local deadline).
//!
//! Errors: a dropped connection, a refused connection, SQLite `BUSY` and deadlocks are
//! [`Error::Unavailable`] (retried by the core); anything else
//! the database says is [`Error::Backend`] with sqlx's error as
//! the source.
//!
//! SQLite: a file (`sqlite://PATH`, created if missing) or `sqlite::memory:` (one database
//! for the pool, so `pool_size=1`). Journal mode WAL, `synchronous=NORMAL` (a process crash
//! loses nothing; a power loss can roll back the last acquisitions, and with them their
//! versions: use `synchronous=full` when tokens must survive power loss), busy timeout 5 s.
//! Several processes on one file exclude each other through SQLite's file locks, and may open
//! a new file at the same moment: setup steps that SQLite refuses at once as busy (the switch
//! to WAL) are retried for up to the busy timeout. Expiry uses the machine's wall clock,
//! shared by every process on the file.
//!
//! Protected resources in the same database can be written with
//! [`SqlBackend::fenced_update`] ([`FencedUpdate`]).

#![cfg_attr(docsrs, feature(doc_cfg))]

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock_core::{
    AcquireRequest, Acquired, Attempt, AttemptMode, Capabilities, ClientConfig, Error,
    FencingGuarantee, FencingToken, Lease, LockBackend, LockClient, LockInfo, LockName,
    LossDetection, Result, Step, WakeUp,
};

pub use distlock_core;
pub use sqlx;

mod config;
mod db;
mod fence;
#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;

#[cfg(feature = "bench")]
#[cfg_attr(docsrs, doc(cfg(feature = "bench")))]
pub mod bench;

pub use config::{DEFAULT_TABLE, Dialect, SqlConfig};
pub use fence::{FencedUpdate, SqlValue};

use db::{Claim, Db, Subscription};

/// How long a waiter's reservation lives without being renewed by its polls.
const RESERVATION: Duration = Duration::from_secs(1);
/// The reserved waiter of a polling database polls at least this often.
const HEAD_POLL_MAX: Duration = Duration::from_millis(20);

/// The pool of the database a [`SqlBackend`] uses, to run the application's own statements
/// next to the locks (e.g. fenced writes in a transaction).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum SqlPool {
    /// PostgreSQL.
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    Postgres(sqlx::PgPool),
    /// MySQL / MariaDB.
    #[cfg(feature = "mysql")]
    #[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
    MySql(sqlx::MySqlPool),
    /// SQLite.
    #[cfg(feature = "sqlite")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
    Sqlite(sqlx::SqlitePool),
}

/// Connects to the database at `url` and returns a lock client over it. This is what
/// `distlock::connect` calls for `postgres://`, `mysql://` and `sqlite:` URLs.
///
/// # Errors
/// [`Error::InvalidConfig`] for a bad URL or option; [`Error::Unavailable`] when the server
/// cannot be reached within the connect timeout (default: `config.operation_timeout`);
/// [`Error::Backend`] for a missing database or a lock table of the wrong shape.
pub async fn connect(url: &str, config: ClientConfig) -> Result<LockClient<SqlBackend>> {
    connect_with(SqlConfig::from_url(url)?, config).await
}

/// Like [`connect`], from an [`SqlConfig`] (e.g. built with its `with_*` methods).
///
/// # Errors
/// As [`connect`].
pub async fn connect_with(
    mut sql: SqlConfig,
    config: ClientConfig,
) -> Result<LockClient<SqlBackend>> {
    config.validate()?;
    if sql.connect_timeout.is_none() {
        sql.connect_timeout = Some(config.operation_timeout);
    }
    let backend = SqlBackend::connect(sql).await?;
    LockClient::with_config(backend, config)
}

/// The [`LockBackend`] over one database pool. Cheap to clone.
#[derive(Clone)]
pub struct SqlBackend {
    inner: Arc<Inner>,
}

struct Inner {
    db: Box<dyn Db>,
    config: SqlConfig,
    sessions: Arc<db::Sessions>,
}

impl fmt::Debug for SqlBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlBackend")
            .field("dialect", &self.inner.config.dialect)
            .field("url", &self.inner.config.redacted_url())
            .field("table", &self.inner.config.table)
            .finish_non_exhaustive()
    }
}

impl SqlBackend {
    /// Connects, creates the table if missing (unless disabled) and checks its shape.
    ///
    /// # Errors
    /// As [`connect`].
    pub async fn connect(config: SqlConfig) -> Result<Self> {
        config.validate()?;
        let timeout = config.connect_timeout.unwrap_or(Duration::from_secs(5));
        let sessions = Arc::new(db::Sessions::default());
        let make = Self::open(&config, sessions.clone());
        let db = match tokio::time::timeout(timeout, make).await {
            Ok(db) => db?,
            Err(_) => {
                return Err(Error::Unavailable {
                    message: format!(
                        "could not connect to {} within {timeout:?}",
                        config.redacted_url()
                    ),
                    source: None,
                });
            }
        };
        Ok(Self {
            inner: Arc::new(Inner {
                db,
                config,
                sessions,
            }),
        })
    }

    #[allow(
        unused_variables,
        reason = "`sessions` is unused when only SQLite is compiled in"
    )]
    async fn open(config: &SqlConfig, sessions: Arc<db::Sessions>) -> Result<Box<dyn Db>> {
        match config.dialect {
            #[cfg(feature = "postgres")]
            Dialect::Postgres => Ok(Box::new(postgres::PgDb::open(config, sessions).await?)),
            #[cfg(feature = "mysql")]
            Dialect::MySql => Ok(Box::new(mysql::MyDb::open(config, sessions).await?)),
            #[cfg(feature = "sqlite")]
            Dialect::Sqlite => Ok(Box::new(sqlite::LiteDb::open(config).await?)),
            #[allow(
                unreachable_patterns,
                reason = "reachable when a dialect's feature is off"
            )]
            other => Err(Error::Unsupported(format!(
                "the `{}` cargo feature of distlock-sql is not enabled",
                other.feature()
            ))),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &SqlConfig {
        &self.inner.config
    }

    /// The pool, to run the application's own statements on the same database.
    pub fn pool(&self) -> SqlPool {
        self.inner.db.pool()
    }

    /// The server-side ids of the connections this backend opened (PostgreSQL backend pids,
    /// MySQL connection ids; empty for SQLite), including closed ones: for diagnostics and
    /// fault injection (`pg_terminate_backend`, `KILL`).
    pub fn session_ids(&self) -> Vec<i64> {
        self.inner.sessions.list()
    }

    /// Frees `name` whoever holds it (an operator breaking a stuck lock). The version is kept,
    /// so the next holder's token is still higher; the former holder learns of the loss at its
    /// next renewal. Returns whether a live lock was freed.
    ///
    /// # Errors
    /// [`Error::InvalidName`], or the database's error.
    pub async fn force_release(&self, name: &str) -> Result<bool> {
        let name = LockName::new(name)?;
        self.inner
            .db
            .force_release(name.as_str())
            .await
            .map_err(|e| map_err("force release", e))
    }

    /// Runs a [`FencedUpdate`] with `token`: `true` if the row was written, `false` if the row
    /// is missing or already carries a higher token (a later holder wrote it).
    ///
    /// # Errors
    /// [`Error::InvalidOptions`] for a bad identifier; the database's error otherwise.
    pub async fn fenced_update(&self, update: &FencedUpdate, token: FencingToken) -> Result<bool> {
        update.validate()?;
        let token = i64::try_from(token.get())
            .map_err(|_| Error::InvalidOptions(format!("token {token} is out of range")))?;
        self.inner
            .db
            .fenced_update(update, token)
            .await
            .map_err(|e| map_err("fenced update", e))
    }
}

fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX).max(1)
}

fn remaining(us: i64) -> Duration {
    Duration::from_micros(u64::try_from(us).unwrap_or(0))
}

fn token_of(version: i64) -> Result<FencingToken> {
    u64::try_from(version)
        .map(FencingToken::new)
        .map_err(|_| Error::Backend {
            message: format!("the lock table holds a negative version {version}"),
            source: None,
        })
}

#[async_trait]
impl LockBackend for SqlBackend {
    fn name(&self) -> &'static str {
        match self.inner.config.dialect {
            Dialect::Postgres => "postgres",
            Dialect::MySql => "mysql",
            Dialect::Sqlite => "sqlite",
        }
    }

    fn capabilities(&self) -> Capabilities {
        let wake_up = if self.inner.db.has_events() {
            WakeUp::Event
        } else {
            WakeUp::Polling
        };
        Capabilities::new(FencingGuarantee::Linearizable)
            .with_fifo(false)
            .with_wake_up(wake_up)
            .with_ttl_range(
                Duration::from_millis(1),
                Duration::from_secs(365 * 24 * 3600),
            )
            .with_loss_detection(LossDetection::Renewal)
            .with_list(true)
            .with_force_release(true)
    }

    fn begin(&self, request: AcquireRequest) -> Box<dyn Attempt> {
        Box::new(SqlAttempt {
            inner: self.inner.clone(),
            request,
            since: None,
            head_polls: 0,
            subscription: None,
            maybe_owned: false,
            maybe_reserved: false,
            busy_before: false,
            handed: false,
        })
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        let peek = self
            .inner
            .db
            .peek(name.as_str())
            .await
            .map_err(|e| map_err("inspect", e))?;
        Ok(peek.and_then(|p| match (p.owner, p.remaining_us) {
            (Some(owner), Some(us)) => Some(LockInfo::new(
                owner,
                Some(token_of(p.version).ok()?),
                Some(remaining(us)),
            )),
            _ => None,
        }))
    }

    async fn list(&self, prefix: Option<&str>, limit: usize) -> Result<Vec<(LockName, LockInfo)>> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = self
            .inner
            .db
            .list(prefix.unwrap_or(""), limit)
            .await
            .map_err(|e| map_err("list", e))?;
        let mut held = Vec::with_capacity(rows.len());
        for row in rows {
            // A row written by something else than this crate may hold a name we reject.
            let Ok(name) = LockName::new(row.name) else {
                continue;
            };
            let info = LockInfo::new(
                row.owner,
                Some(token_of(row.version)?),
                Some(remaining(row.remaining_us)),
            );
            held.push((name, info));
        }
        Ok(held)
    }

    /// Frees the row (owner cleared, lease ended) but keeps it and its `version`, so the next
    /// holder's token is still higher; PostgreSQL notifies the waiters as a release does,
    /// MySQL and SQLite waiters find it at their next poll.
    async fn force_release(&self, name: &LockName) -> Result<bool> {
        self.inner
            .db
            .force_release(name.as_str())
            .await
            .map_err(|e| map_err("force release", e))
    }
}

struct SqlAttempt {
    inner: Arc<Inner>,
    request: AcquireRequest,
    /// The version this waiter first saw busy: its age for the reservation.
    since: Option<i64>,
    head_polls: u32,
    subscription: Option<Subscription>,
    /// Whether an acquire statement was sent without a definite "not taken" answer (its
    /// reply lost or cancelled): `abandon` must then free the lock by owner.
    maybe_owned: bool,
    /// Whether this attempt may hold the waiter reservation.
    maybe_reserved: bool,
    /// Whether the lock was found busy before: later polls read before they write.
    busy_before: bool,
    /// The last wake-up was a release addressed to this waiter: take without reading first.
    handed: bool,
}

/// Whether the row refuses `owner` now: a live holder or a live reservation of somebody else.
fn blocked(peek: &db::Peek, owner: &str) -> bool {
    let held = peek.remaining_us.is_some() && peek.owner.as_deref() != Some(owner);
    let reserved = peek.next_remaining_us.is_some() && peek.next_owner.as_deref() != Some(owner);
    held || reserved
}

impl SqlAttempt {
    /// The answer to a busy lock: a waiting attempt claims or keeps the reservation when it
    /// is free, expiring, or held by a younger waiter (one write, only then).
    async fn busy(&mut self, peek: db::Peek) -> Result<Step> {
        self.busy_before = true;
        let mut retry = peek.remaining_us.map(remaining);
        if self.request.mode == AttemptMode::Try {
            return Ok(Step::busy(retry));
        }
        let db = &self.inner.db;
        let (name, owner) = (self.request.name.as_str(), self.request.owner.as_str());
        let since = *self.since.get_or_insert(peek.version);
        let mine = peek.next_owner.as_deref() == Some(owner) && peek.next_remaining_us.is_some();
        let claim = if mine {
            peek.next_remaining_us
                .is_some_and(|us| remaining(us) < RESERVATION / 2)
        } else {
            peek.next_remaining_us.is_none() || peek.next_since.is_none_or(|s| s > since)
        };
        let head = if claim {
            self.maybe_reserved = true;
            let claimed = db
                .reserve(name, owner, since, micros(RESERVATION))
                .await
                .map_err(|e| map_err("acquire", e))?;
            // Refused: an older waiter's live reservation replaced any of ours.
            self.maybe_reserved = claimed != Claim::Refused;
            if claimed == Claim::GrantedFree {
                // A release between our read and our claim notified nobody (it notifies the
                // reservation's holder only): take it now instead of waiting for a notification.
                return Ok(Step::busy(Some(Duration::ZERO)));
            }
            self.maybe_reserved
        } else {
            mine
        };
        if head && !db.has_events() {
            // The next holder polls briskly; the others back off.
            let step = Duration::from_millis(1) * 2u32.saturating_pow(self.head_polls.min(8));
            self.head_polls = self.head_polls.saturating_add(1);
            let delay = step.min(HEAD_POLL_MAX);
            retry = Some(retry.map_or(delay, |r| r.min(delay)));
        } else if !head {
            self.head_polls = 0;
        }
        Ok(Step::busy(retry))
    }
}

#[async_trait]
impl Attempt for SqlAttempt {
    async fn poll(&mut self) -> Result<Step> {
        let db = &self.inner.db;
        let (name, owner) = (self.request.name.as_str(), self.request.owner.as_str());
        if self.request.mode == AttemptMode::Wait {
            // Subscribe before the statement is sent, so that no release after it is missed.
            match &mut self.subscription {
                Some(sub) => sub.mark_seen(),
                None => self.subscription = db.subscribe(name, owner),
            }
        }
        let handed = std::mem::take(&mut self.handed);
        if self.busy_before && !handed {
            // Waiting: look before writing, so that busy polls cost no commit.
            let peek = db.peek(name).await.map_err(|e| map_err("acquire", e))?;
            if let Some(peek) = peek.filter(|p| blocked(p, owner)) {
                return self.busy(peek).await;
            }
        }
        let ttl = micros(self.request.ttl);
        let owned_before = std::mem::replace(&mut self.maybe_owned, true);
        let taken = match db.take(name, owner, ttl, self.maybe_reserved).await {
            Ok(taken) => taken,
            Err(err) => {
                if matches!(err, sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed) {
                    // No connection, so nothing was sent.
                    self.maybe_owned = owned_before;
                }
                return Err(map_err("acquire", err));
            }
        };
        // A definite answer: taken (the guard owns it now) or not taken.
        self.maybe_owned = false;
        if let Some(version) = taken {
            let lease = SqlLease {
                inner: self.inner.clone(),
                name: self.request.name.clone(),
                owner: self.request.owner.clone(),
                version,
            };
            return Ok(Step::Acquired(Acquired::new(
                Box::new(lease),
                token_of(version)?,
            )));
        }
        match db.peek(name).await.map_err(|e| map_err("acquire", e))? {
            Some(peek) => self.busy(peek).await,
            // The row vanished between the two statements: try again soon.
            None => Ok(Step::busy(Some(Duration::from_millis(1)))),
        }
    }

    async fn changed(&mut self) {
        match &mut self.subscription {
            Some(sub) => self.handed = sub.changed().await,
            None => std::future::pending().await,
        }
    }

    async fn abandon(self: Box<Self>) -> Result<()> {
        if !self.maybe_owned && !self.maybe_reserved {
            // Every statement was answered: nothing of this attempt is on the server.
            return Ok(());
        }
        self.inner
            .db
            .abandon(self.request.name.as_str(), &self.request.owner)
            .await
            .map_err(|e| map_err("abandon", e))
    }
}

#[derive(Debug)]
struct SqlLease {
    inner: Arc<Inner>,
    name: LockName,
    owner: String,
    version: i64,
}

impl fmt::Debug for Inner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Inner")
            .field("table", &self.config.table)
            .finish_non_exhaustive()
    }
}

impl SqlLease {
    fn not_held(&self) -> Error {
        Error::NotHeld {
            name: self.name.to_string(),
        }
    }
}

#[async_trait]
impl Lease for SqlLease {
    async fn renew(&self, ttl: Duration) -> Result<()> {
        let renewed = self
            .inner
            .db
            .renew(self.name.as_str(), &self.owner, self.version, micros(ttl))
            .await
            .map_err(|e| map_err("renew", e))?;
        if renewed {
            Ok(())
        } else {
            Err(self.not_held())
        }
    }

    async fn release(&self) -> Result<()> {
        let released = self
            .inner
            .db
            .release(self.name.as_str(), &self.owner, self.version)
            .await
            .map_err(|e| map_err("release", e))?;
        if released {
            Ok(())
        } else {
            Err(self.not_held())
        }
    }
}

/// Classifies sqlx's error: transport trouble is retryable, the rest is the database's word.
pub(crate) fn map_err(what: &str, err: sqlx::Error) -> Error {
    let transient = match &err {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Protocol(_) => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|code| transient_code(&code)),
        _ => false,
    };
    if transient {
        Error::unavailable(format!("{what} failed: {err}"), err)
    } else {
        Error::backend(format!("{what} failed: {err}"), err)
    }
}

/// SQLSTATEs (PostgreSQL, MySQL) and SQLite result codes that mean "try again".
fn transient_code(code: &str) -> bool {
    sqlite_busy(code)
        || code.starts_with("08") // connection exception
        || code.starts_with("57P") // admin shutdown, crash shutdown, cannot connect now
        || matches!(code, "53300" | "40001" | "40P01" | "70100" | "HYT00")
}

/// `SQLITE_BUSY`, `SQLITE_LOCKED` and their extended codes. SQLite's codes have at most four
/// digits, so an all-digit SQLSTATE such as `40001` is never taken for one.
pub(crate) fn sqlite_busy(code: &str) -> bool {
    code.len() < 5 && code.parse::<i32>().is_ok_and(|c| matches!(c & 0xff, 5 | 6))
}

#[cfg(test)]
mod tests {
    use super::transient_code;

    #[test]
    fn retryable_codes_are_told_apart_by_dialect() {
        // SQLite: BUSY, LOCKED, BUSY_SNAPSHOT (517), LOCKED_SHAREDCACHE (262); not CONSTRAINT.
        for code in ["5", "6", "517", "262"] {
            assert!(transient_code(code), "{code}");
        }
        assert!(!transient_code("19"));
        // All-digit SQLSTATEs are not SQLite codes: serialization failure, connection failure,
        // too many connections are retryable; a unique violation is not.
        for code in ["40001", "08006", "53300", "40P01", "57P01", "HYT00"] {
            assert!(transient_code(code), "{code}");
        }
        for code in ["23505", "42P01", "00005"] {
            assert!(!transient_code(code), "{code}");
        }
    }
}
