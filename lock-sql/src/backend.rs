//! The backend over one pool: connecting, creating and checking the table, capabilities,
//! inspection, listing, forced release and the release of one hold by its owner and token.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock_core::backend::{InFlight, Renewer, within};
use distlock_core::{
    AcquireRequest, Attempt, Capabilities, Error, FencingGuarantee, FencingToken, LockBackend,
    LockInfo, LockKind, LockName, Result, WakeUp,
};

use crate::attempt::SqlAttempt;
use crate::db::Db;
use crate::error::map_err;
use crate::kinds;
use crate::renew::SqlRenewer;
use crate::sweep::Sweeper;
use crate::{Dialect, FencedUpdate, SqlConfig, db};

/// The longest lease: the expiry is a microsecond count, so the limit is a choice (a year).
const MAX_TTL: Duration = Duration::from_secs(365 * 24 * 3600);

/// The shortest ttl: a renewal every ttl/3 is a transaction (a pooled connection, an
/// owner-checked UPDATE, a commit; on SQLite a writer that may wait for another), and it
/// must commit within the two thirds of the ttl left. 300 ms leaves it about 200 ms, many
/// commits of a server at ease; shorter leases are lost to an ordinary slow commit.
const MIN_TTL: Duration = Duration::from_millis(300);

/// The largest semaphore: enough for any pool of workers, small enough that a holders
/// table of that many rows per name stays an ordinary table.
pub const MAX_PERMITS: u32 = 65536;

/// How long a waiter's reservation lives without being renewed by its polls (the acquire's
/// ttl, if that is shorter).
pub(crate) const RESERVATION: Duration = Duration::from_secs(1);

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

#[cfg(feature = "postgres")]
impl From<sqlx::PgPool> for SqlPool {
    fn from(pool: sqlx::PgPool) -> Self {
        Self::Postgres(pool)
    }
}

#[cfg(feature = "mysql")]
impl From<sqlx::MySqlPool> for SqlPool {
    fn from(pool: sqlx::MySqlPool) -> Self {
        Self::MySql(pool)
    }
}

#[cfg(feature = "sqlite")]
impl From<sqlx::SqlitePool> for SqlPool {
    fn from(pool: sqlx::SqlitePool) -> Self {
        Self::Sqlite(pool)
    }
}

impl SqlPool {
    /// The database behind the pool.
    pub fn dialect(&self) -> Dialect {
        match self {
            #[cfg(feature = "postgres")]
            Self::Postgres(_) => Dialect::Postgres,
            #[cfg(feature = "mysql")]
            Self::MySql(_) => Dialect::MySql,
            #[cfg(feature = "sqlite")]
            Self::Sqlite(_) => Dialect::Sqlite,
        }
    }

    /// Where the pool connects, as a URL without credentials (for messages):
    /// `postgres://user@host:port/db`, `mysql://...`, `sqlite://PATH`.
    pub fn describe(&self) -> String {
        match self {
            #[cfg(feature = "postgres")]
            Self::Postgres(pool) => {
                let o = pool.connect_options();
                format!(
                    "postgres://{}@{}:{}/{}",
                    o.get_username(),
                    o.get_host(),
                    o.get_port(),
                    o.get_database().unwrap_or_default()
                )
            }
            #[cfg(feature = "mysql")]
            Self::MySql(pool) => {
                let o = pool.connect_options();
                format!(
                    "mysql://{}@{}:{}/{}",
                    o.get_username(),
                    o.get_host(),
                    o.get_port(),
                    o.get_database().unwrap_or_default()
                )
            }
            #[cfg(feature = "sqlite")]
            Self::Sqlite(pool) => {
                format!(
                    "sqlite://{}",
                    pool.connect_options().get_filename().display()
                )
            }
        }
    }
}

/// The [`LockBackend`] over one database pool. Cheap to clone.
#[derive(Clone)]
pub struct SqlBackend {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) db: Box<dyn Db>,
    /// The renewer of every exclusive lease of this backend (see [`crate::renew`]).
    pub(crate) renewer: Arc<dyn Renewer>,
    config: SqlConfig,
    sessions: Arc<db::Sessions>,
    /// Deletes the rows of names no longer used (see [`crate::sweep`]).
    pub(crate) sweeper: Arc<crate::sweep::Sweeper>,
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
    /// As [`connect`](crate::connect).
    pub async fn connect(config: SqlConfig) -> Result<Self> {
        config.validate()?;
        let timeout = config.effective_connect_timeout();
        let sessions = Arc::new(db::Sessions::default());
        let make = Self::open(&config, sessions.clone());
        let what = format!("connecting to {}", config.redacted_url());
        let db = within(timeout, what, make).await??;
        let sweeper = Sweeper::new(db.pool(), config.table.clone(), config.forget_after);
        Ok(Self {
            inner: Arc::new(Inner {
                renewer: SqlRenewer::shared(db.max_batch()),
                db,
                config,
                sessions,
                sweeper,
            }),
        })
    }

    /// Uses the application's own `pool` (it keeps its size, timeouts, TLS and hooks): sets
    /// up the lock table (unless [`SqlConfig::create_table`] is off) and its statements on it.
    /// `config` comes from [`SqlConfig::for_pool`]; its pool size is not used. Of the pool's
    /// connections, the backend keeps at most two checked out between statements (to spare
    /// the pool's ping before each use) and, on PostgreSQL, one for `LISTEN`. The application
    /// can run fenced writes in its own transactions on the same pool
    /// ([`FencedUpdate::execute`]). [`SqlBackend::session_ids`] stays empty: the pool's
    /// connections are not the backend's to track.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] when `config` names another database than `pool`; otherwise as
    /// [`connect`](crate::connect) (a missing database, a table of the wrong shape, the
    /// server unreachable within the connect timeout).
    pub async fn from_pool(pool: SqlPool, config: SqlConfig) -> Result<Self> {
        config.validate()?;
        if config.dialect != pool.dialect() {
            return Err(Error::InvalidConfig(format!(
                "the configuration is for {:?} but the pool is {:?}",
                config.dialect,
                pool.dialect()
            )));
        }
        let timeout = config.effective_connect_timeout();
        let keep = |max: u32| (max / 2).min(2);
        let setup = async {
            let db: Box<dyn Db> = match pool {
                #[cfg(feature = "postgres")]
                SqlPool::Postgres(pool) => {
                    let keep = keep(pool.options().get_max_connections());
                    Box::new(crate::postgres::PgDb::on_pool(pool, &config, keep).await?)
                }
                #[cfg(feature = "mysql")]
                SqlPool::MySql(pool) => {
                    let keep = keep(pool.options().get_max_connections());
                    Box::new(crate::mysql::MyDb::on_pool(pool, &config, keep).await?)
                }
                #[cfg(feature = "sqlite")]
                SqlPool::Sqlite(pool) => {
                    let keep = keep(pool.options().get_max_connections());
                    Box::new(crate::sqlite::LiteDb::on_pool(pool, &config, keep).await?)
                }
            };
            Ok::<_, Error>(db)
        };
        let what = format!("setting up the locks on {}", config.redacted_url());
        let db = within(timeout, what, setup).await??;
        let sweeper = Sweeper::new(db.pool(), config.table.clone(), config.forget_after);
        Ok(Self {
            inner: Arc::new(Inner {
                renewer: SqlRenewer::shared(db.max_batch()),
                db,
                config,
                sessions: Arc::default(),
                sweeper,
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
            Dialect::Postgres => Ok(Box::new(
                crate::postgres::PgDb::open(config, sessions).await?,
            )),
            #[cfg(feature = "mysql")]
            Dialect::MySql => Ok(Box::new(crate::mysql::MyDb::open(config, sessions).await?)),
            #[cfg(feature = "sqlite")]
            Dialect::Sqlite => Ok(Box::new(crate::sqlite::LiteDb::open(config).await?)),
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

pub(crate) fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX).max(1)
}

pub(crate) fn remaining(us: i64) -> Duration {
    Duration::from_micros(u64::try_from(us).unwrap_or(0))
}

pub(crate) fn token_of(version: i64) -> Result<FencingToken> {
    FencingToken::from_server(version, "the lock table's version")
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
        // An in-memory SQLite database (`sqlite::memory:`, `mode=memory`) is this process's.
        #[cfg(feature = "sqlite")]
        let process_local = self.inner.config.dialect == Dialect::Sqlite
            && self.inner.config.sqlite_file().is_none();
        #[cfg(not(feature = "sqlite"))]
        let process_local = false;
        Capabilities::new(FencingGuarantee::Linearizable)
            .with_wake_up(wake_up)
            .with_ttl_range(MIN_TTL, MAX_TTL)
            .with_list(true)
            .with_force_release(true)
            .with_release_hold(true)
            .with_shared(true)
            .with_max_permits(MAX_PERMITS)
            .with_process_local(process_local)
            .with_holder_data(self.inner.db.has_data())
    }

    fn begin(&self, request: AcquireRequest) -> Box<dyn Attempt> {
        Box::new(SqlAttempt {
            inner: self.inner.clone(),
            request,
            since: None,
            subscription: None,
            maybe_owned: false,
            maybe_reserved: false,
            maybe_handed: false,
            maybe_queued: false,
            busy_before: false,
            handed: false,
            handed_over: None,
            vacant: false,
            held_seen: None,
            held_seen_before: None,
            claimed_at: None,
            refused_join: None,
            server_wait: None,
            unarmed: None,
            not_armed: (0, 0),
            queue_look: None,
            // The rest of a statement cut short gets another connect timeout: the client's
            // operation timeout within `CONNECT_TIMEOUT`, unless the URL sets its own (5 s
            // for the application's own pool).
            in_flight: InFlight::new(self.inner.config.effective_connect_timeout()),
            ended_waits: InFlight::new(self.inner.config.effective_connect_timeout()),
        })
    }

    /// The lock row and its holder data, read in one statement; for shared holds and
    /// permits, their latest holder and its data (another statement).
    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        let row = self
            .inner
            .db
            .inspect(name.as_str())
            .await
            .map_err(|e| map_err("inspect", e))?;
        let Some((peek, data)) = row else {
            return Ok(None);
        };
        match kinds::held_kind(&peek) {
            None => Ok(None),
            Some(LockKind::Exclusive) => Ok(Some(
                LockInfo::new(
                    peek.owner.unwrap_or_default(),
                    Some(token_of(peek.version)?),
                    peek.remaining_us.map(remaining),
                )
                .with_data(data),
            )),
            Some(kind) => self.holders(name.as_str(), kind).await,
        }
    }

    /// The rows of the lock table and of its holders table whose name starts with the
    /// prefix, one `count(*)` each (a missing holders table has none).
    async fn footprint(&self, prefix: &str) -> Result<Option<distlock_core::Footprint>> {
        let table = &self.inner.config.table;
        crate::footprint::count(&self.pool(), table, prefix)
            .await
            .map(Some)
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
            let info = match kinds::marked(&row.owner) {
                // Shared holds or permits: their latest holder (an operator's read, one
                // statement per such name).
                Some(kind) => match self.holders(name.as_str(), kind).await? {
                    Some(info) => info,
                    None => continue,
                },
                None => LockInfo::new(
                    row.owner,
                    Some(token_of(row.version)?),
                    Some(remaining(row.remaining_us)),
                )
                .with_data(row.data),
            };
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

    /// The hold's own release, checked against its owner and token on the server: the lock
    /// row's owner and version for an exclusive hold (one statement), the holders table's
    /// owner and token for a shared hold or a permit (one transaction, under the lock row's
    /// lock). The version is kept, and the waiters are woken as by the holder's release. A
    /// token beyond the version column's range is nobody's.
    async fn release_hold(
        &self,
        name: &LockName,
        owner: &str,
        token: FencingToken,
    ) -> Result<bool> {
        let Ok(token) = i64::try_from(token.get()) else {
            return Ok(false);
        };
        self.inner
            .db
            .release_token(name.as_str(), owner, token)
            .await
            .map_err(|e| map_err("release hold", e))
    }
}

impl SqlBackend {
    /// What an inspection shows of a name held as `kind` (shared or permits): its latest
    /// holder (with its data) and how many hold it.
    async fn holders(&self, name: &str, kind: LockKind) -> Result<Option<LockInfo>> {
        let info = self
            .inner
            .db
            .hold_info(name)
            .await
            .map_err(|e| map_err("inspect", e))?;
        info.map(|h| {
            let count = u32::try_from(h.count).unwrap_or(u32::MAX);
            Ok(LockInfo::new(
                h.owner,
                Some(token_of(h.token)?),
                Some(remaining(h.remaining_us)),
            )
            .with_holders(kind, count)
            .with_data(h.data))
        })
        .transpose()
    }
}

impl fmt::Debug for Inner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Inner")
            .field("table", &self.config.table)
            .finish_non_exhaustive()
    }
}
