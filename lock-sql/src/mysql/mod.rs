//! MySQL / MariaDB: `INSERT .. ON DUPLICATE KEY UPDATE` with `UTC_TIMESTAMP(6)` as the clock;
//! the new version comes back through `LAST_INSERT_ID(expr)`.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock_core::{LockKind, Result};
use sqlx::{AssertSqlSafe, Executor, Row};
use tokio::sync::{OwnedSemaphorePermit, oneshot};

use crate::backend::SqlPool;
use crate::config::SqlConfig;
use crate::db::{Claim, Db, QueuedLook, Sessions, each_hold};
use crate::dialect::{Common, CommonStatements, DataColumn, Routines, Sql, prepare_all, q};
use crate::error::map_err;
use crate::hot::HotConns;
use crate::keys::quote;
use crate::kinds::{
    self, HeldBy, HolderSql, Holds, JoinRequest, Joined, holders_table, marker, queue_table,
};
use crate::pool::{IdleLimit, InUse, checked, open_server};
use crate::renew::{BySize, LIST_MAX_BATCH, Renewal, padded, renewed_at, too_many};
use crate::wake::{ServerWait, WaitFor, WakeLockSql, WakeLocks, spawn_keep_alive};

mod routines;
mod statements;

use routines::routines;

use statements::*;

/// The longest wait on a wake lock, in seconds: a wait also ends with the holder's lease, and
/// a waiter cancelled mid-wait kills its statement, so this only bounds a wait on a holder that
/// neither releases nor loses its connection.
const MAX_WAIT_SECS: u64 = 2;

/// MySQL / MariaDB, whose waiters have no notification to listen to. Instead:
///
/// - a take of an existing row also takes the holder's **wake lock** (`GET_LOCK(prefix +
///   version, 0)` in the same statement), and its connection stays with the lease (*pinned*)
///   until the release, which gives the wake lock up in its own statement;
/// - the waiter at the head of the queue waits on the server for that wake lock
///   ([`MyDb::wait_release`]: `GET_LOCK(.., seconds)` in a task of its own, on a connection
///   of its own) and takes the lock as soon as the holder gave it up;
/// - a join that takes a shared hold or a permit takes the holder's wake lock too (procedure
///   `_v3`, see [`MyDb::join`]): a writer waiting at the head for the readers waits for the
///   latest one's, and reads whether the last one's release handed it the lock (release
///   procedure `_v3`), as after a writer's.
///
/// A queued permit waiter (see `queued_look`) takes its wake lock with the read that finds a
/// permit handed to it, and waits on the wake lock of the holder as many places from the
/// oldest as it is from the head of the queue.
///
/// At most a quarter of the pool is pinned (joins leave one of those for takes), and at most
/// a quarter waits; beyond that (and for a first take, which inserts the row) holders take no
/// wake lock and waiters poll.
///
/// A pinned connection idles for as long as its lock is held, and the server closes a
/// connection idle for `wait_timeout` (the wake lock going with it: the waiter would then
/// poll every 20 ms for the rest of the hold). So a task pings every pinned connection idle
/// for half the time after which the pool checks a connection ([`IdleLimit`]: a quarter of
/// `wait_timeout`, at most every 30 s): see [`WakeLocks::keep_alive`].
#[derive(Debug)]
pub(crate) struct MyDb {
    check: Arc<str>,
    /// A queued permit waiter's look ([`queued_look_sql`]); prepared on first use (the queue
    /// table exists only with the procedures).
    queued_look: Arc<str>,
    /// The release of a shared hold or a permit on the connection that holds its wake lock,
    /// which the procedure gives up after its commit (`None`: no procedures).
    release_waking: Option<Arc<str>>,
    /// The join that also takes the new holder's wake lock (`None`: no procedures).
    join_waking: Option<Arc<str>>,
    /// The batched renewal's update and read, by list size.
    renew_many: (BySize, BySize),
    common: Common<sqlx::MySql>,
    wake: Arc<WakeLocks>,
    keep_alive: tokio::task::AbortHandle,
}

impl Drop for MyDb {
    fn drop(&mut self) {
        self.keep_alive.abort();
    }
}

/// The `WHERE` of `information_schema.columns` for `column` of `table` (unquoted, maybe
/// `schema.table`; plain identifiers, safe in literals), in the current database unless
/// `table` names a schema.
fn column_of(table: &str, column: &str) -> String {
    let (schema, name) = match table.split_once('.') {
        Some((schema, name)) => (format!("'{schema}'"), name),
        None => ("DATABASE()".to_owned(), table),
    };
    format!("table_schema = {schema} AND table_name = '{name}' AND column_name = '{column}'")
}

/// What a connect reads of the server and the lock table, in one query.
struct Catalog {
    /// The session's `wait_timeout` in seconds (see [`IdleLimit`]).
    wait_timeout: Option<u64>,
    /// Whether the lock table exists (it has a column).
    exists: bool,
    /// Whether it has `next_ttl`: a table created by an earlier version and not altered
    /// (`create_table` off) may lack it (its releases then free the lock instead of handing
    /// it over).
    next_ttl: bool,
    /// Whether it has `data` (without it, holds carry no data).
    data: bool,
}

/// Whether a [`Catalog`] found one column of the lock table.
type HasColumn = fn(&Catalog) -> bool;

impl Catalog {
    /// Reads the catalog for the lock table (`table`, unquoted, maybe `schema.table`: where
    /// `CREATE TABLE` makes it, the current database unless it names a schema).
    async fn read(conn: &mut sqlx::MySqlConnection, table: &str) -> Result<Self> {
        let (schema, name) = match table.split_once('.') {
            Some((schema, name)) => (Some(schema), name),
            None => (None, table),
        };
        let (wait_timeout, columns, next_ttl, data): (Option<i64>, i64, i64, i64) = sqlx::query_as(
            "SELECT CAST(@@session.wait_timeout AS SIGNED), CAST(COUNT(*) AS SIGNED), \
                 CAST(COALESCE(SUM(column_name = 'next_ttl'), 0) AS SIGNED), \
                 CAST(COALESCE(SUM(column_name = 'data'), 0) AS SIGNED) \
                 FROM information_schema.columns \
                 WHERE table_schema = COALESCE(?, DATABASE()) AND table_name = ?",
        )
        .bind(schema)
        .bind(name)
        .fetch_one(conn)
        .await
        .map_err(|e| {
            map_err(
                &format!("reading wait_timeout and the columns of {table}"),
                e,
            )
        })?;
        Ok(Self {
            wait_timeout: wait_timeout.and_then(|s| u64::try_from(s).ok()),
            exists: columns > 0,
            next_ttl: next_ttl > 0,
            data: data > 0,
        })
    }
}

impl MyDb {
    pub(crate) async fn open(config: &SqlConfig, sessions: Arc<Sessions>) -> Result<Self> {
        let session_id = "SELECT CAST(CONNECTION_ID() AS SIGNED)";
        let (pool, idle) =
            open_server::<sqlx::MySql>(config, sessions, "MySQL", session_id).await?;
        Self::set_up(pool, config, config.max_connections / 2, idle).await
    }

    /// Sets up the lock table and its statements on `pool`, keeping at most `keep`
    /// connections checked out between statements (see [`HotConns`]).
    pub(crate) async fn on_pool(
        pool: sqlx::MySqlPool,
        config: &SqlConfig,
        keep: u32,
    ) -> Result<Self> {
        Self::set_up(pool, config, keep, Arc::new(IdleLimit::server())).await
    }

    /// [`Self::on_pool`], with `idle` the limit the pool's `before_acquire` reads, set here
    /// from the server's `wait_timeout`.
    async fn set_up(
        pool: sqlx::MySqlPool,
        config: &SqlConfig,
        keep: u32,
        idle: Arc<IdleLimit>,
    ) -> Result<Self> {
        let table = quote(&config.table, '`');
        // One connection for the set-up, closed rather than given back if cancelled mid-way
        // (see `InUse`).
        let mut setup = InUse::acquire(&pool)
            .await
            .map_err(|e| map_err("connect", e))?;
        let conn = setup.conn();
        // Read first: a complete table needs no `CREATE` (which a user without the right to
        // create tables may not run, even with `IF NOT EXISTS`, and which MySQL writes to its
        // binary log on every connect) and no `ALTER` (which waits for every open transaction
        // on the table).
        let mut catalog = Catalog::read(conn, &config.table).await?;
        // The server closes a connection idle for `wait_timeout` seconds (see `IdleLimit`).
        idle.set_server_limit(catalog.wait_timeout.map(Duration::from_secs));
        if config.create_table && !catalog.exists {
            let create = format!(
                "CREATE TABLE IF NOT EXISTS {table} (name VARBINARY(512) NOT NULL PRIMARY KEY, \
                 owner VARBINARY(255) NULL, version BIGINT NOT NULL, expires_at DATETIME(6) NOT NULL, \
                 next_owner VARBINARY(255) NULL, next_since BIGINT NULL, next_expires DATETIME(6) NULL, \
                 next_ttl BIGINT NULL, data {DATA_TYPE} NULL) ENGINE=InnoDB"
            );
            conn.execute(AssertSqlSafe(create))
                .await
                .map_err(|e| map_err(&format!("creating the lock table {table}"), e))?;
            // Its columns (or, made first by a concurrent client of an earlier version, those
            // of that table).
            catalog = Catalog::read(conn, &config.table).await?;
        }
        if config.create_table {
            // A table of an earlier version: the column of hand-overs, the holder data. A
            // concurrent client may have added it meanwhile (duplicate column).
            let columns: [(&str, &str, HasColumn); 2] = [
                ("next_ttl", "BIGINT", |c| c.next_ttl),
                ("data", DATA_TYPE, |c| c.data),
            ];
            for (column, ty, has) in columns {
                if !has(&catalog) {
                    let alter = format!("ALTER TABLE {table} ADD COLUMN {column} {ty} NULL");
                    let altered = conn.execute(AssertSqlSafe(alter)).await;
                    catalog = Catalog::read(conn, &config.table).await?;
                    if let Err(err) = altered
                        && !has(&catalog)
                    {
                        return Err(map_err(&format!("adding {column} to {table}"), err));
                    }
                }
            }
        }
        let (handover, data) = (catalog.next_ttl, catalog.data);
        drop(setup.done());
        let (sql, check, wake, holds) = statements(&config.table, handover, DataColumn(data));
        let routines = match routines(&config.table, &holds, &peek_columns()) {
            Some(routines) => set_up_routines(&pool, routines, config.create_table).await,
            None => None,
        };
        let release_waking = routines
            .as_ref()
            .map(|_| routines::release_call(&config.table, true).into());
        let join_waking = routines
            .as_ref()
            .map(|_| routines::join_call(&config.table, true).into());
        let holds = Holds::new(holds, config.create_table);
        let mut prepared = sql.prepared();
        prepared.extend([&check, &wake.take, &wake.release, &wake.wait, &wake.handed]);
        let renew_many = renew_many_sql(&config.table);
        prepared.extend(renew_many.0.first());
        prepared.extend(renew_many.1.first());
        prepare_all(&pool, &prepared, &table).await?;
        // A quarter of the pool at most pins, and as many wait (none of a pool under 4).
        let slots = usize::try_from(pool.options().get_max_connections() / 4)
            .unwrap_or(0)
            .min(usize::try_from(keep).unwrap_or(0));
        let wake = Arc::new(WakeLocks::new(
            config.table.clone(),
            wake,
            pool.clone(),
            slots,
            handover,
            idle.clone(),
        ));
        let keep_alive = spawn_keep_alive(&wake, &idle);
        Ok(Self {
            wake,
            keep_alive,
            common: Common {
                conns: HotConns::new(pool, keep).with_idle_limit(idle),
                sql,
                holds,
                routines: routines.map(|routines| routines.calls),
            },
            check,
            queued_look: queued_look_sql(&config.table).into(),
            release_waking,
            join_waking,
            renew_many,
        })
    }

    /// The version of `owner`'s hold of `name`, read on the connection of the take.
    async fn check(
        &self,
        conn: &mut sqlx::MySqlConnection,
        name: &str,
        owner: &str,
    ) -> Result<Option<i64>, sqlx::Error> {
        let row = q(&self.check)
            .bind(name)
            .bind(owner)
            .fetch_optional(conn)
            .await?;
        row.map(|r| r.try_get::<i64, _>(0)).transpose()
    }

    /// A take that also takes the holder's wake lock, and pins its connection if it took.
    async fn take_waking(
        &self,
        name: &str,
        owner: &str,
        ttl_us: i64,
        slot: OwnedSemaphorePermit,
    ) -> Result<Option<i64>, sqlx::Error> {
        // Cancelled or failed mid-way, the connection is closed, and with it any wake lock.
        let mut hot = self.common.conns.get().await?;
        let result = q(&self.wake.sql.take)
            .bind(name)
            .bind(owner)
            .bind(ttl_us)
            .bind(self.wake.prefix(name))
            .execute(hot.conn())
            .await;
        let done = match result {
            Ok(done) => done,
            Err(err) => return hot.finish(Err(err)),
        };
        match answer(&done) {
            Answer::Taken(version) => {
                // An existing row: its connection holds the wake lock until the release.
                self.wake.pin(name, owner, version, hot.into_pooled(), slot);
                Ok(Some(version))
            }
            Answer::Refused => hot.finish(Ok(None)),
            // A new row (no wake lock was taken), or an answer to check.
            Answer::Ask => {
                let result = self.check(hot.conn(), name, owner).await;
                hot.finish(result)
            }
        }
    }
}

/// The procedures of `routines` when they exist, creating them first when missing and
/// `create` (`IF NOT EXISTS`: a concurrent first connect may create them too). A failure to
/// create them is logged and leaves the transactions in use: they do the same, in more round
/// trips.
async fn set_up_routines(
    pool: &sqlx::MySqlPool,
    routines: Routines,
    create: bool,
) -> Option<Routines> {
    let made = async {
        // Closed, not given back, if cancelled mid-way (see `InUse`).
        let mut conn = InUse::acquire(pool).await?;
        let count = async |conn: &mut sqlx::MySqlConnection| {
            sqlx::query_scalar::<_, i64>(AssertSqlSafe(routines.present.clone()))
                .fetch_one(conn)
                .await
        };
        let all = i64::try_from(routines.create.len()).unwrap_or(i64::MAX);
        let mut found = count(conn.conn()).await? == all;
        if !found && create {
            for statement in &routines.create {
                // Not in the prepared statement protocol.
                sqlx::raw_sql(AssertSqlSafe(statement.clone()))
                    .execute(conn.conn())
                    .await?;
            }
            found = count(conn.conn()).await? == all;
        }
        drop(conn.done());
        Ok::<_, sqlx::Error>(found)
    };
    match made.await {
        Ok(found) => found.then_some(routines),
        Err(err) => {
            tracing::warn!(%err, "cannot create the procedures of shared holds and permits; using transactions");
            None
        }
    }
}

/// What a take's answer says.
enum Answer {
    /// An existing row was taken (2 rows affected); LAST_INSERT_ID carries the new version.
    Taken(i64),
    /// The row was left alone (found, unchanged) and LAST_INSERT_ID set to 0.
    Refused,
    /// A new row was inserted (LAST_INSERT_ID its first version), or anything else: read the
    /// row.
    Ask,
}

fn answer(done: &sqlx::mysql::MySqlQueryResult) -> Answer {
    match (done.rows_affected(), i64::try_from(done.last_insert_id())) {
        (2, Ok(version)) if version > 0 => Answer::Taken(version),
        (1, Ok(0)) => Answer::Refused,
        _ => Answer::Ask,
    }
}

#[async_trait]
impl Db for MyDb {
    fn common(&self) -> &dyn CommonStatements {
        &self.common
    }

    async fn take(
        &self,
        name: &str,
        owner: &str,
        ttl_us: i64,
        _wake_waiters: bool,
    ) -> Result<Option<i64>, sqlx::Error> {
        if let Ok(slot) = self.wake.pin_slots.clone().try_acquire_owned() {
            return self.take_waking(name, owner, ttl_us, slot).await;
        }
        // Two statements on one connection: LAST_INSERT_ID and the check belong to the take.
        let mut hot = self.common.conns.get().await?;
        let result = q(&self.common.sql.take)
            .bind(name)
            .bind(owner)
            .bind(ttl_us)
            .execute(hot.conn())
            .await;
        let done = match result {
            Ok(done) => done,
            Err(err) => return hot.keep(Err(err)),
        };
        match answer(&done) {
            Answer::Taken(version) => hot.keep(Ok(Some(version))),
            Answer::Refused => hot.keep(Ok(None)),
            Answer::Ask => {
                let result = self.check(hot.conn(), name, owner).await;
                hot.keep(result)
            }
        }
    }

    /// No `RETURNING` on MySQL's `UPDATE`: the matched-row count (sqlx asks for found rows,
    /// not changed ones) answers a batch that was all renewed; otherwise a second statement
    /// reads which leases of the batch are held now, which are those the update renewed (a
    /// lease it refused has lost its version or its lease for good).
    async fn renew_many(&self, batch: &[Renewal<'_>]) -> Result<Vec<bool>, sqlx::Error> {
        let (update, held) = &self.renew_many;
        let (Some(update), Some(held)) = (update.get(batch.len()), held.get(batch.len())) else {
            return Err(too_many(batch.len()));
        };
        let conns = &self.common.conns;
        let matched = conns
            .execute(bind_list(update, batch))
            .await?
            .rows_affected();
        if usize::try_from(matched).is_ok_and(|m| m == batch.len()) {
            return Ok(vec![true; batch.len()]);
        }
        let rows = conns.fetch_all(bind_list(held, batch)).await?;
        let positions = rows
            .iter()
            .map(|row| row.try_get::<i64, _>(0))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(renewed_at(batch.len(), positions))
    }

    fn max_batch(&self) -> usize {
        LIST_MAX_BATCH
    }

    fn batches_holds(&self) -> bool {
        self.common.renew_holds_call().is_some()
    }

    /// One call of the procedure `_dl_renew_many_v1` (see `routines.rs`) with the batch as a
    /// JSON array; its answer, a `1` or `0` per hold, must have one character per hold.
    async fn renew_holds(&self, batch: &[(HeldBy<'_>, i64)]) -> Result<Vec<bool>, sqlx::Error> {
        let Some(call) = self.common.renew_holds_call() else {
            return each_hold(self, batch).await;
        };
        // No token (never a live lease's): null, which matches no holder.
        let holds: Vec<_> = batch
            .iter()
            .map(|(h, ttl)| (h.name, h.owner, marker(h.kind), h.token, ttl))
            .collect();
        let json = serde_json::to_string(&holds).map_err(|e| sqlx::Error::Encode(e.into()))?;
        // `fetch_all`: MySQL answers a CALL with the row, then the call's status.
        let rows = self.common.conns.fetch_all(q(call).bind(json)).await?;
        let row = rows.first().ok_or(sqlx::Error::RowNotFound)?;
        let answer: String = row.try_get(0)?;
        if answer.len() != batch.len() {
            return Err(sqlx::Error::Protocol(format!(
                "the renewal of {} holds answered {} of them",
                batch.len(),
                answer.len()
            )));
        }
        Ok(answer.bytes().map(|b| b == b'1').collect())
    }

    fn hands_over(&self) -> bool {
        self.wake.handover
    }

    fn queues_permits(&self) -> bool {
        self.common.queues_permits()
    }

    /// The look takes the waiter's wake lock in the same statement when a release handed it
    /// a permit (its connection then stays with the lease, as a take's does), and lists the
    /// holders whose wake lock is held, for the waiter to wait on.
    async fn queued_look(
        &self,
        name: &str,
        owner: &str,
        kind: LockKind,
    ) -> Result<Option<QueuedLook>, sqlx::Error> {
        if !self.queues_permits() {
            return Ok(None);
        }
        let slot = self.wake.pin_slots.clone().try_acquire_owned().ok();
        let prefix = self.wake.prefix(name);
        let lock_prefix = slot.as_ref().map(|_| prefix.as_str());
        // Cancelled or failed mid-way, the connection is closed, and with it any wake lock.
        let mut hot = self.common.conns.get().await?;
        let query = q(&self.queued_look).bind(name).bind(owner);
        let query = query.bind(lock_prefix).bind(lock_prefix).bind(marker(kind));
        let query = query
            .bind(name)
            .bind(owner)
            .bind(owner)
            .bind(&prefix)
            .bind(name);
        let rows = match query.fetch_all(hot.conn()).await {
            Ok(rows) => rows,
            Err(err) => return hot.finish(Err(err)),
        };
        let read = (|| {
            let (mut ahead, mut placed, mut handed, mut woke) = (0_i64, 0_i64, None, None);
            let (mut held, mut armed) = (0_i64, None::<String>);
            for row in &rows {
                match row.try_get::<i64, _>(0)? {
                    1 => {
                        ahead = row.try_get::<Option<i64>, _>(1)?.unwrap_or(0);
                        placed = row.try_get(2)?;
                    }
                    2 => {
                        handed = Some((row.try_get(1)?, row.try_get(2)?));
                        woke = row.try_get::<Option<i64>, _>(3)?;
                    }
                    _ => {
                        held = row.try_get(1)?;
                        armed = row.try_get(4)?;
                    }
                }
            }
            let permits = kinds::permits_of(kind);
            let look = QueuedLook {
                handed,
                ahead: (placed > 0).then_some(ahead),
                free: held.saturating_add(ahead) < permits,
                // Cut at 1,024 characters: a token cut short is a wait on nobody's lock.
                armed: armed
                    .iter()
                    .flat_map(|list| list.split(','))
                    .map_while(|token| token.parse().ok())
                    .collect(),
            };
            Ok::<_, sqlx::Error>((look, woke))
        })();
        match (read, slot) {
            (Ok((look, Some(1))), Some(slot)) => {
                if let Some((token, _)) = look.handed {
                    self.wake.pin(name, owner, token, hot.into_pooled(), slot);
                }
                Ok(Some(look))
            }
            (read, _) => hot.finish(read.map(|(look, _)| Some(look))),
        }
    }

    async fn arm(&self, name: &str, owner: &str, version: i64) {
        let Ok(slot) = self.wake.pin_slots.clone().try_acquire_owned() else {
            return;
        };
        // Cancelled or failed mid-way, the connection is closed, and with it the wake lock.
        let Ok(mut hot) = self.common.conns.get().await else {
            return;
        };
        let lock = format!("{}{version}", self.wake.prefix(name));
        let got = sqlx::query_scalar::<_, Option<i64>>("SELECT GET_LOCK(?, 0)")
            .bind(&lock)
            .fetch_one(hot.conn())
            .await;
        match got {
            Ok(Some(1)) => self.wake.pin(name, owner, version, hot.into_pooled(), slot),
            other => {
                let _ = hot.finish(other.map(drop));
            }
        }
    }

    async fn reserve(
        &self,
        name: &str,
        owner: &str,
        since: i64,
        hold_us: i64,
        ttl_us: Option<i64>,
    ) -> Result<Claim, sqlx::Error> {
        if !self.wake.handover {
            return self.common.reserve(name, owner, since, hold_us).await;
        }
        let query = q(&self.common.sql.reserve)
            .bind(since)
            .bind(hold_us)
            .bind(owner)
            .bind(ttl_us);
        let query = query.bind(name).bind(owner).bind(owner).bind(since);
        let done = self.common.conns.execute(query).await?;
        Ok(Claim::granted(done.rows_affected() == 1))
    }

    async fn release(&self, name: &str, owner: &str, version: i64) -> Result<bool, sqlx::Error> {
        // A connection idle past the server's `wait_timeout` may be closed, and its wake lock
        // with it: then the release goes on another one (a failed ping sent nothing).
        let pinned = match self.wake.take_pinned(name, owner, version).await {
            Some((conn, since)) => checked(conn, since.elapsed(), &self.wake.limit).await,
            None => None,
        };
        let Some(conn) = pinned else {
            return self.common.release(name, owner, version).await;
        };
        // On the connection that holds the wake lock; closed if cancelled or failed, which
        // gives the wake lock up as well.
        let lock = format!("{}{version}", self.wake.prefix(name));
        let mut hot = self.common.conns.adopt(conn);
        let result = q(&self.wake.sql.release)
            .bind(&lock)
            .bind(name)
            .bind(owner)
            .bind(version)
            .execute(hot.conn())
            .await;
        let released = match result {
            Ok(done) => done.rows_affected() == 1,
            Err(err) => return hot.finish(Err(err)),
        };
        if !released {
            // Not held any more: the statement changed nothing, so give the wake lock up here.
            let result = sqlx::query("DO RELEASE_LOCK(?)")
                .bind(&lock)
                .execute(hot.conn())
                .await;
            return hot.finish(result.map(|_| false));
        }
        hot.finish(Ok(true))
    }

    /// The release statement on any connection: the pinned one is taken only once the row
    /// was released (a wrong version must not unpin the holder's, with its wake lock on it).
    /// It is then closed, which gives the holder's wake lock up as its release would: the
    /// waiters waiting on the server take the lock at once. A holder in another process keeps
    /// its wake lock until its renewal is refused; its waiters' waits end within
    /// [`MAX_WAIT_SECS`] in any case.
    async fn release_other(
        &self,
        name: &str,
        owner: &str,
        version: i64,
    ) -> Result<bool, sqlx::Error> {
        let released = self.common.release(name, owner, version).await?;
        if released {
            self.forget(name, owner);
        }
        Ok(released)
    }

    /// A join that takes also takes the new holder's wake lock, when two pin slots are free
    /// (one stays for the client's exclusive takes, whatever read holds it keeps): its
    /// connection then stays with the lease (pinned, like a take's), so that a writer waiting
    /// for the readers, or a queued permit waiter, waits on the server for its release.
    async fn join(&self, req: JoinRequest<'_>) -> Result<Joined, sqlx::Error> {
        let slots = &self.wake.pin_slots;
        // Another join may take a slot between the two: then neither arms (safe, not fair).
        let slot = slots
            .clone()
            .try_acquire_owned()
            .ok()
            .filter(|_| slots.available_permits() > 0);
        let (Some(call), Some(slot)) = (&self.join_waking, slot) else {
            return self.common.join(req).await;
        };
        kinds::ready(&self.common.holds, self.common.conns.pool()).await?;
        let query = self.common.join_query(call, &req);
        let query = query.bind(self.wake.prefix(req.name));
        // Cancelled or failed mid-way, the connection is closed, and with it any wake lock.
        let mut hot = self.common.conns.get().await?;
        // `fetch_all`: MySQL answers a CALL with the row, then the call's status.
        let read = match query.fetch_all(hot.conn()).await {
            Ok(rows) => rows
                .first()
                .ok_or(sqlx::Error::RowNotFound)
                .and_then(|row| {
                    let joined = Common::<sqlx::MySql>::joined(row, req.kind)?;
                    Ok((joined, row.try_get::<Option<i64>, _>(8)?))
                }),
            Err(err) => Err(err),
        };
        match read {
            Ok((Joined::Taken(token), Some(1))) => {
                self.wake
                    .pin(req.name, req.owner, token, hot.into_pooled(), slot);
                Ok(Joined::Taken(token))
            }
            read => hot.finish(read.map(|(joined, _)| joined)),
        }
    }

    /// A hold whose connection holds its wake lock (a join's, a permit handed over) is
    /// released on that connection: the release procedure gives the lock up after its commit
    /// (see `release_waking`);
    /// a release of another token leaves that connection pinned. Anything else goes on any
    /// connection (an abandoned attempt's clean-up first closes the connection of a wake lock
    /// taken for it, which gives the lock up).
    async fn release_hold(&self, held: HeldBy<'_>) -> Result<bool, sqlx::Error> {
        let pinned = match (held.token, &self.release_waking) {
            (Some(token), Some(_)) => {
                match self.wake.take_pinned(held.name, held.owner, token).await {
                    Some((conn, since)) => checked(conn, since.elapsed(), &self.wake.limit).await,
                    None => None,
                }
            }
            _ => None,
        };
        let (Some(conn), Some(call), Some(token)) = (pinned, &self.release_waking, held.token)
        else {
            if held.token.is_none() {
                // An abandoned attempt's clean-up, by owner: whatever it holds goes.
                self.forget(held.name, held.owner);
            }
            return self.common.release_hold(held).await;
        };
        let lock = format!("{}{token}", self.wake.prefix(held.name));
        // Closed if cancelled or failed, which gives the wake lock up as well.
        let mut hot = self.common.conns.adopt(conn);
        let query = q(call)
            .bind(held.name)
            .bind(held.owner)
            .bind(marker(held.kind));
        let query = query.bind(token).bind(true).bind(lock);
        // `fetch_all`: MySQL answers a CALL with the row, then the call's status.
        let result = match query.fetch_all(hot.conn()).await {
            Ok(rows) => rows
                .first()
                .ok_or(sqlx::Error::RowNotFound)
                .and_then(|row| row.try_get::<i64, _>(0))
                .map(|answer| answer == 1),
            Err(err) => Err(err),
        };
        hot.finish(result)
    }

    async fn abandon(&self, name: &str, owner: &str) -> Result<(), sqlx::Error> {
        self.forget(name, owner);
        self.common.abandon(name, owner).await
    }

    fn wait_release(
        &self,
        name: &str,
        owner: &str,
        version: i64,
        remaining: Duration,
        purpose: WaitFor,
    ) -> Option<ServerWait> {
        let slot = self.wake.wait_slots.clone().try_acquire_owned().ok()?;
        let handover = purpose == WaitFor::Handover;
        let lock = format!("{}{version}", self.wake.prefix(name));
        // Whole seconds (MySQL's GET_LOCK takes no fraction), at least one, at most the cap.
        // Any other wait (a reader's, a permit waiter's), one second: one it no longer needs
        // runs to its end in the background (see `ServerWait::let_run`), keeping its wait
        // slot until then.
        let secs = if handover {
            remaining.as_secs().saturating_add(1).min(MAX_WAIT_SECS)
        } else {
            1
        };
        let (cancel, cancelled) = oneshot::channel();
        // A writer's or the last reader's release hands a writer the lock; nothing else is
        // handed over by a release (a permit's is read by the waiter's look).
        let whose = handover.then(|| (name.to_owned(), owner.to_owned()));
        let task = tokio::spawn(self.wake.clone().wait(lock, secs, cancelled, slot, whose));
        Some(ServerWait::new(version, purpose, task, cancel))
    }

    fn forget(&self, name: &str, owner: &str) {
        // Closing the connection (when the pinned one is dropped) gives its wake lock up.
        drop(self.wake.unpin(name, owner));
    }

    fn pool(&self) -> SqlPool {
        SqlPool::MySql(self.common.conns.pool().clone())
    }
}
