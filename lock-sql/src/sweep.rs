//! Forgetting names no longer used (issue 42): the lock rows that stayed free for
//! [`SqlConfig::forget_after`](crate::SqlConfig::forget_after) are deleted, and so are the
//! holders' rows (and places of the queue of permit waiters) that expired as long ago.
//!
//! A lock row's `version` is the name's fencing counter, and a missing row starts at the
//! database's clock in microseconds (see the crate docs). So a row may go once the clock is
//! well past its version: a row is deleted only when its lease ended (by release or expiry),
//! its waiter reservation (if any) ended, and its version is below the clock, each at least
//! `forget_after` ago. The next take of that name inserts a row at the clock, above the
//! deleted version unless the database's clock went back by more than `forget_after` (or a
//! take's statement took longer than that between reading the clock and inserting).
//!
//! Who sweeps: every client whose lock ends (released or lost) starts a sweeping task (one per
//! backend), which tries at once and then every [`Sweeper::every`], until its backend has
//! been idle for `forget_after` and one more round. A try first claims the round in the
//! table's reserved row, the one named `''` (no lock name is empty): only the client whose
//! claim moves that row's `expires_at` (the last sweep) forward by at least half of
//! [`Sweeper::every`] sweeps, so all the clients of a table sweep it at most twice per round
//! together, short-lived processes included. A task stops after a round more than
//! `forget_after` and a round after its backend's last activity: that round, or another
//! client's within the half round before it, deleted what its backend freed last. A sweep
//! deletes in batches of [`BATCH`] rows, each its own statement, with a pause between them
//! (PostgreSQL: the rows found first and locked, those locked by others skipped, then deleted
//! by key; MySQL: at READ COMMITTED, so only the deleted rows are locked).

use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use distlock_core::backend::unpoisoned;
use tracing::{debug, warn};

use crate::SqlPool;
use crate::keys::quote;
use crate::kinds::{holders_table, queue_table};

/// Rows one delete statement removes at most.
pub(crate) const BATCH: i64 = 1000;

/// Batches one sweep runs at most (a million rows); the next round goes on.
const MAX_BATCHES: usize = 1000;

/// The pause between two full batches: a backlog (a large table swept for the first time)
/// is deleted at most 1,000 rows per 10 ms, one statement at a time, beside the locks' own
/// statements.
const PAUSE: Duration = Duration::from_millis(10);

/// The sweeps of one backend.
#[derive(Debug)]
pub(crate) struct Sweeper {
    pool: SqlPool,
    table: String,
    forget_after: Duration,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// The backend's last acquisition or release.
    active: Instant,
    /// Whether a sweeping task runs.
    running: bool,
}

/// What one sweep did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Swept {
    /// Whether this client claimed the round (else another client swept lately).
    pub(crate) claimed: bool,
    /// Lock rows deleted.
    pub(crate) locks: u64,
    /// Holders' rows deleted, and places of the queue of permit waiters.
    pub(crate) holders: u64,
}

impl Sweeper {
    pub(crate) fn new(pool: SqlPool, table: String, forget_after: Duration) -> Arc<Self> {
        Arc::new(Self {
            pool,
            table,
            forget_after,
            state: Mutex::new(State {
                active: Instant::now(),
                running: false,
            }),
        })
    }

    /// How often the clients of a table sweep it, together: half of `forget_after`, between
    /// 1 s and 5 min.
    pub(crate) fn every(&self) -> Duration {
        (self.forget_after / 2).clamp(Duration::from_secs(1), Duration::from_secs(300))
    }

    /// A lock of the backend ended (released or lost): starts the sweeping task if none runs (on
    /// the current tokio runtime; without one, nothing).
    pub(crate) fn touched(self: &Arc<Self>) {
        let mut state = unpoisoned(&self.state);
        state.active = Instant::now();
        if state.running {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        state.running = true;
        handle.spawn(rounds(Arc::downgrade(self)));
    }

    /// One round: claims it, and if claimed, deletes what is due.
    ///
    /// # Errors
    /// The database's.
    pub(crate) async fn sweep(&self) -> Result<Swept, sqlx::Error> {
        let mut swept = Swept::default();
        // Half a round: clients whose rounds drift apart still find the claim free at their
        // next round, and all together sweep at most twice a round.
        let every = micros(self.every() / 2);
        let forget = micros(self.forget_after);
        if !claim(&self.pool, &self.table, every).await? {
            return Ok(swept);
        }
        swept.claimed = true;
        for _ in 0..MAX_BATCHES {
            let n = delete_locks(&self.pool, &self.table, forget).await?;
            swept.locks += n;
            if n < BATCH as u64 {
                break;
            }
            tokio::time::sleep(PAUSE).await;
        }
        // The holders, then the queue of permit waiters (the routines keep it; a
        // crashed waiter's place is left behind on a name nobody waits for again).
        for holders in [holders_table(&self.table), queue_table(&self.table)] {
            for _ in 0..MAX_BATCHES {
                let n = match delete_holders(&self.pool, &holders, forget).await {
                    Ok(n) => n,
                    Err(e) if crate::footprint::missing_table(&e) => 0,
                    Err(e) => return Err(e),
                };
                swept.holders += n;
                if n < BATCH as u64 {
                    break;
                }
                tokio::time::sleep(PAUSE).await;
            }
        }
        Ok(swept)
    }
}

/// The sweeping task: a round at once, then one every [`Sweeper::every`], until the backend
/// was idle for `forget_after` and one round more (so that the rows it freed last are
/// swept), or is dropped.
async fn rounds(sweeper: Weak<Sweeper>) {
    loop {
        let Some(this) = sweeper.upgrade() else {
            return;
        };
        match this.sweep().await {
            Ok(swept) if swept.locks + swept.holders > 0 => debug!(
                table = %this.table,
                locks = swept.locks,
                holders = swept.holders,
                "swept the rows of names no longer used"
            ),
            Ok(_) => {}
            Err(e) => warn!(table = %this.table, error = %e, "sweeping free lock rows failed"),
        }
        let every = this.every();
        {
            let mut state = unpoisoned(&this.state);
            if state.active.elapsed() > this.forget_after + every {
                state.running = false;
                return;
            }
        }
        drop(this);
        tokio::time::sleep(every).await;
    }
}

fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// Claims a sweeping round: moves the reserved row's `expires_at` (the last sweep) to now if
/// it is at least `every_us` old, or inserts the row. Whether this call did either.
async fn claim(pool: &SqlPool, table: &str, every_us: i64) -> Result<bool, sqlx::Error> {
    let (now, ago) = clock(pool);
    let t = quote(table, quote_char(pool));
    let moved =
        format!("UPDATE {t} SET expires_at = {now} WHERE name = '' AND expires_at <= {ago}");
    if execute(pool, &moved, every_us).await? > 0 {
        return Ok(true);
    }
    let insert = match pool {
        #[cfg(feature = "mysql")]
        SqlPool::MySql(_) => format!(
            "INSERT IGNORE INTO {t} (name, owner, version, expires_at) VALUES ('', NULL, 0, {now})"
        ),
        #[allow(unreachable_patterns, reason = "reachable with the other dialects")]
        _ => format!(
            "INSERT INTO {t} (name, owner, version, expires_at) VALUES ('', NULL, 0, {now}) \
             ON CONFLICT (name) DO NOTHING"
        ),
    };
    Ok(execute(pool, &insert, every_us).await? > 0)
}

/// The identifier quote of `pool`'s dialect.
fn quote_char(pool: &SqlPool) -> char {
    match pool {
        #[cfg(feature = "mysql")]
        SqlPool::MySql(_) => '`',
        #[allow(unreachable_patterns, reason = "reachable with the other dialects")]
        _ => '"',
    }
}

/// `pool`'s clock in the type of `expires_at`, and that clock less the statement's argument
/// in microseconds. The argument is `$1` on PostgreSQL, `?1` on SQLite, and `?` on MySQL
/// (bound once for each, see [`execute`]).
fn clock(pool: &SqlPool) -> (&'static str, &'static str) {
    match pool {
        #[cfg(feature = "postgres")]
        SqlPool::Postgres(_) => ("now()", "now() - $1 * interval '1 microsecond'"),
        #[cfg(feature = "mysql")]
        SqlPool::MySql(_) => (
            "UTC_TIMESTAMP(6)",
            "UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND",
        ),
        #[cfg(feature = "sqlite")]
        SqlPool::Sqlite(_) => (
            "CAST(unixepoch('subsec') * 1000000 AS INTEGER)",
            "(CAST(unixepoch('subsec') * 1000000 AS INTEGER) - ?1)",
        ),
    }
}

/// `pool`'s clock in microseconds since the Unix epoch, less the statement's argument (the
/// unit of `version`).
fn version_ago(pool: &SqlPool) -> &'static str {
    match pool {
        #[cfg(feature = "postgres")]
        SqlPool::Postgres(_) => "(EXTRACT(EPOCH FROM now()) * 1000000)::bigint - $1",
        #[cfg(feature = "mysql")]
        SqlPool::MySql(_) => {
            "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) - ?"
        }
        #[cfg(feature = "sqlite")]
        SqlPool::Sqlite(_) => "(CAST(unixepoch('subsec') * 1000000 AS INTEGER) - ?1)",
    }
}

/// Deletes at most [`BATCH`] lock rows that are due (see the module docs). How many.
async fn delete_locks(pool: &SqlPool, table: &str, forget_us: i64) -> Result<u64, sqlx::Error> {
    let t = quote(table, quote_char(pool));
    let (_, ago) = clock(pool);
    let due = format!(
        "name <> '' AND expires_at < {ago} AND version < {} \
         AND (next_expires IS NULL OR next_expires < {ago})",
        version_ago(pool)
    );
    let sql = match pool {
        // The rows found first and locked (those locked by others skipped), then deleted by
        // key: a join of the two scans took a whole-table scan per batch.
        #[cfg(feature = "postgres")]
        SqlPool::Postgres(_) => format!(
            "DELETE FROM {t} WHERE name = ANY(ARRAY(SELECT name FROM {t} WHERE {due} \
             LIMIT {BATCH} FOR UPDATE SKIP LOCKED))"
        ),
        #[cfg(feature = "mysql")]
        SqlPool::MySql(_) => format!("DELETE FROM {t} WHERE {due} LIMIT {BATCH}"),
        #[cfg(feature = "sqlite")]
        SqlPool::Sqlite(_) => format!(
            "DELETE FROM {t} WHERE name IN (SELECT name FROM {t} WHERE {due} LIMIT {BATCH})"
        ),
    };
    execute(pool, &sql, forget_us).await
}

/// Deletes at most [`BATCH`] rows of the holders table (or the queue) `holders` whose lease ended
/// `forget_us` ago or more. How many.
async fn delete_holders(pool: &SqlPool, holders: &str, forget_us: i64) -> Result<u64, sqlx::Error> {
    let h = quote(holders, quote_char(pool));
    let (_, ago) = clock(pool);
    let sql = match pool {
        #[cfg(feature = "postgres")]
        SqlPool::Postgres(_) => format!(
            "DELETE FROM {h} WHERE ctid = ANY(ARRAY(SELECT ctid FROM {h} \
             WHERE expires_at < {ago} LIMIT {BATCH} FOR UPDATE SKIP LOCKED))"
        ),
        #[cfg(feature = "mysql")]
        SqlPool::MySql(_) => format!("DELETE FROM {h} WHERE expires_at < {ago} LIMIT {BATCH}"),
        #[cfg(feature = "sqlite")]
        SqlPool::Sqlite(_) => format!(
            "DELETE FROM {h} WHERE (name, owner) IN (SELECT name, owner FROM {h} \
             WHERE expires_at < {ago} LIMIT {BATCH})"
        ),
    };
    execute(pool, &sql, forget_us).await
}

/// Runs `sql` with `arg` as its argument, if it takes one (`$1`, `?1`; MySQL: bound for
/// each `?`), each statement its own transaction (MySQL: at READ COMMITTED, so that a delete
/// locks only the rows it deletes). How many rows it changed.
async fn execute(pool: &SqlPool, sql: &str, arg: i64) -> Result<u64, sqlx::Error> {
    let query = || sqlx::AssertSqlSafe(sql.to_owned());
    Ok(match pool {
        #[cfg(feature = "postgres")]
        SqlPool::Postgres(pool) => {
            let mut query = sqlx::query(query());
            if sql.contains("$1") {
                query = query.bind(arg);
            }
            query.execute(pool).await?.rows_affected()
        }
        #[cfg(feature = "mysql")]
        SqlPool::MySql(pool) => {
            let mut query = sqlx::query(query());
            for _ in 0..sql.matches('?').count() {
                query = query.bind(arg);
            }
            let mut conn = pool.acquire().await?;
            let mut tx = sqlx::Connection::begin_with(
                &mut *conn,
                <sqlx::MySql as crate::dialect::Dialect>::BEGIN,
            )
            .await?;
            let done = query.execute(&mut *tx).await?.rows_affected();
            tx.commit().await?;
            done
        }
        #[cfg(feature = "sqlite")]
        SqlPool::Sqlite(pool) => {
            let mut query = sqlx::query(query());
            if sql.contains("?1") {
                query = query.bind(arg);
            }
            query.execute(pool).await?.rows_affected()
        }
    })
}
