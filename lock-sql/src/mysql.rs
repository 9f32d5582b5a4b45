//! MySQL / MariaDB: `INSERT .. ON DUPLICATE KEY UPDATE` with `UTC_TIMESTAMP(6)` as the clock;
//! the new version comes back through `LAST_INSERT_ID(expr)`.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock_core::Result;
use sqlx::{AssertSqlSafe, Executor, Row};
use tokio::sync::{OwnedSemaphorePermit, oneshot};

use crate::backend::SqlPool;
use crate::config::SqlConfig;
use crate::db::{Claim, Db, Sessions};
use crate::dialect::{Common, CommonStatements, DataColumn, Sql, prepare_all, q};
use crate::error::map_err;
use crate::keys::quote;
use crate::kinds::{HolderSql, Holds, holders_table};
use crate::pool::{HotConns, IdleLimit, InUse, checked, open_server};
use crate::renew::{BySize, LIST_MAX_BATCH, Renewal, padded, renewed_at, too_many};
use crate::wake::{ServerWait, WakeLockSql, WakeLocks, spawn_keep_alive};

const NOW: &str = "UTC_TIMESTAMP(6)";

/// The type of the `data` columns: the holder data as the UTF-8 bytes it was given (at most
/// [`MAX_HOLDER_DATA`](distlock_core::MAX_HOLDER_DATA), 512 bytes; room for four times as
/// many), compared and stored byte for byte whatever the table's character set.
const DATA_TYPE: &str = "VARBINARY(2048)";

/// The database's clock in microseconds since the Unix epoch: the first version of a new row
/// (see the crate docs, "A store emptied or recreated").
const NOW_US: &str = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))";

/// A release's assignments, with `handover` (see [`MyDb`]): to the exclusive waiter that
/// holds a live reservation, if any, else free. `wake`: the assignment of `owner` runs it
/// too (it gives the holder's wake lock up), whatever it decides. Assignments run left to
/// right and see earlier ones: the decision is taken first, into a session variable. `data`:
/// the holder data is cleared (the freed hold's, or the former holder's on a hand-over).
fn release_sets(handover: bool, wake: &str, data: DataColumn) -> String {
    let clear_data = data.clear();
    if !handover {
        return format!(
            "owner = {}, expires_at = {NOW}{clear_data}",
            wake.replace("{}", "NULL")
        );
    }
    let hand = format!(
        "(next_owner IS NOT NULL AND next_expires > {NOW} AND next_ttl IS NOT NULL \
         AND next_owner <> owner)"
    );
    let keep = |column: &str| format!("{column} = IF(@distlock_hand, NULL, {column})");
    format!(
        "version = version + IF(@distlock_hand := {hand}, 1, 0), \
         owner = {}, \
         expires_at = IF(@distlock_hand, {NOW} + INTERVAL next_ttl MICROSECOND, {NOW}), \
         {}, {}, {}, {}{clear_data}",
        wake.replace("{}", "IF(@distlock_hand, next_owner, NULL)"),
        keep("next_owner"),
        keep("next_since"),
        keep("next_expires"),
        keep("next_ttl"),
    )
}

/// The take: an upsert that takes a free (or expired, or own) row. Assignments run left to
/// right and see earlier ones, so the decision is taken once, into a session variable, before any column changes; `cleared` is what `next_since` becomes
/// on a take (after `version`, so that it sees the new version). LAST_INSERT_ID reports
/// the outcome: the new version when taken, 0 when refused (the clock for a new row).
/// `t` is the quoted table; `data`: a take clears the holder data (a new row has none).
fn take_sql(t: &str, cleared: &str, data: DataColumn) -> String {
    let clear_data = if data.0 {
        ", data = IF(@distlock_take, NULL, data)"
    } else {
        ""
    };
    format!(
        "INSERT INTO {t} (name, owner, version, expires_at) \
         VALUES (?, ?, LAST_INSERT_ID({NOW_US}), {NOW} + INTERVAL ? MICROSECOND) \
         ON DUPLICATE KEY UPDATE \
         version = IF(@distlock_take := ((owner IS NULL OR owner = VALUES(owner) OR expires_at <= {NOW}) \
           AND (next_owner IS NULL OR next_owner = VALUES(owner) OR next_expires <= {NOW})), \
           LAST_INSERT_ID(version + 1), version + LAST_INSERT_ID(0)), \
         owner = IF(@distlock_take, VALUES(owner), owner), \
         expires_at = IF(@distlock_take, VALUES(expires_at), expires_at), \
         next_owner = IF(@distlock_take, NULL, next_owner), \
         next_since = IF(@distlock_take, {cleared}, next_since), \
         next_expires = IF(@distlock_take, NULL, next_expires){clear_data}"
    )
}

/// The statements of the wake locks (`GET_LOCK`) beside the table's (`t`: the quoted
/// table).
fn wake_lock_sql(t: &str, handover: bool, data: DataColumn) -> WakeLockSql {
    WakeLockSql {
        // ARGS: name, owner, ttl_us, wake lock prefix. A take of an existing row also takes
        // the holder's wake lock (prefix + new version) on its connection, without waiting.
        take: take_sql(
            t,
            "IF(GET_LOCK(CONCAT(?, version), 0) IS NULL, NULL, NULL)",
            data,
        )
        .into(),
        // ARGS: wake lock, name, owner, version. The release gives the wake lock up in the
        // same statement, before its commit: the woken waiter's take (or its read of a
        // hand-over, a locking one) waits for the row.
        release: format!(
            "UPDATE {t} SET {} \
             WHERE name = ? AND owner = ? AND version = ? AND expires_at > {NOW}",
            release_sets(handover, "IF(RELEASE_LOCK(?) IS NULL, {}, {})", data)
        )
        .into(),
        // ARGS: wake lock (twice), seconds, wake lock. 0: nobody holds it; 2: it was given up
        // (and we let it go at once); 3: the wait timed out.
        wait: "SELECT CASE WHEN IS_USED_LOCK(?) IS NULL THEN 0 \
               WHEN GET_LOCK(?, ?) = 1 THEN 1 + RELEASE_LOCK(?) ELSE 3 END"
            .into(),
        // ARGS: wake lock prefix (twice; NULL: take no wake lock), name, owner. A locking
        // read: it waits for the commit of the release that woke us. Returns the version,
        // the remaining lease and whether our wake lock was taken.
        handed: format!(
            "SELECT version, TIMESTAMPDIFF(MICROSECOND, {NOW}, expires_at), \
             IF(? IS NULL, NULL, GET_LOCK(CONCAT(?, version), 0)) FROM {t} \
             WHERE name = ? AND owner = ? AND expires_at > {NOW} LOCK IN SHARE MODE"
        )
        .into(),
    }
}

/// The lock table's statements in this dialect; with `handover` (the table has the
/// `next_ttl` column), a release hands the lock to the reserved exclusive waiter; with `data`
/// (the table has the `data` column), holds carry data, which every take, release, hand-over,
/// abandon and forced release clears.
fn statements(
    table: &str,
    handover: bool,
    data: DataColumn,
) -> (Sql, Arc<str>, WakeLockSql, HolderSql) {
    let t = quote(table, '`');
    let clear_data = data.clear();
    let peek_columns = format!(
        "owner, version, IF(owner IS NOT NULL AND expires_at > {NOW}, \
         TIMESTAMPDIFF(MICROSECOND, {NOW}, expires_at), NULL), next_owner, next_since, \
         IF(next_owner IS NOT NULL AND next_expires > {NOW}, \
         TIMESTAMPDIFF(MICROSECOND, {NOW}, next_expires), NULL)"
    );
    let peek = format!("SELECT {peek_columns} FROM {t} WHERE name = ?");
    let take = |cleared: &str| take_sql(&t, cleared, data);
    let wake = wake_lock_sql(&t, handover, data);
    let sql = Sql {
            take: take("NULL").into(),
            peek: peek.as_str().into(),
            // With hand-overs, ARGS: since, hold_us, owner, ttl_us, name, owner (twice), since;
            // never a reservation of the holder (a hand-over to this waiter came first).
            reserve: if handover {
                format!(
                    "UPDATE {t} SET next_since = ?, next_expires = {NOW} + INTERVAL ? MICROSECOND, \
                     next_owner = ?, next_ttl = ? WHERE name = ? AND NOT owner <=> ? \
                     AND (next_owner IS NULL OR next_owner = ? OR next_expires <= {NOW} OR next_since > ?)"
                )
            } else {
                format!(
                    "UPDATE {t} SET next_since = ?, next_expires = {NOW} + INTERVAL ? MICROSECOND, next_owner = ? \
                     WHERE name = ? AND (next_owner IS NULL OR next_owner = ? OR next_expires <= {NOW} \
                     OR next_since > ?)"
                )
            }
            .into(),
            renew: format!(
                "UPDATE {t} SET expires_at = {NOW} + INTERVAL ? MICROSECOND \
                 WHERE name = ? AND owner = ? AND version = ? AND expires_at > {NOW}"
            )
            .into(),
            release: format!(
                "UPDATE {t} SET {} WHERE name = ? AND owner = ? AND version = ? AND expires_at > {NOW}",
                release_sets(handover, "{}", data)
            )
            .into(),
            // The data after the owner: assignments run left to right, and an owner found
            // NULL (cleared here, or free before) has no data to keep.
            abandon: format!(
                "UPDATE {t} SET expires_at = IF(owner <=> ?, {NOW}, expires_at), \
                 owner = IF(owner <=> ?, NULL, owner), {}\
                 next_expires = IF(next_owner <=> ?, NULL, next_expires), \
                 next_since = IF(next_owner <=> ?, NULL, next_since), \
                 next_owner = IF(next_owner <=> ?, NULL, next_owner) \
                 WHERE name = ? AND (owner = ? OR next_owner = ?)",
                if data.0 { "data = IF(owner IS NULL, NULL, data), " } else { "" }
            )
            .into(),
            force: format!(
                "UPDATE {t} SET owner = NULL, expires_at = {NOW}{clear_data} \
                 WHERE name = ? AND owner IS NOT NULL AND expires_at > {NOW}"
            )
            .into(),
            list: format!(
                "SELECT CAST(name AS CHAR CHARACTER SET utf8mb4), CAST(owner AS CHAR CHARACTER SET utf8mb4), \
                 version, TIMESTAMPDIFF(MICROSECOND, {NOW}, expires_at), {} \
                 FROM {t} WHERE owner IS NOT NULL AND expires_at > {NOW} \
                 AND LEFT(name, LENGTH(?)) = ? ORDER BY name LIMIT ?",
                data.select()
            )
            .into(),
            inspect: format!(
                "SELECT {peek_columns}, {} FROM {t} WHERE name = ?",
                data.select()
            )
            .into(),
            set_data: data.0.then(|| {
                format!(
                    "UPDATE {t} SET data = ? \
                     WHERE name = ? AND owner = ? AND version = ? AND expires_at > {NOW}"
                )
                .into()
            }),
    };
    let check = format!("SELECT version FROM {t} WHERE name = ? AND owner = ?").into();
    (sql, check, wake, holder_statements(table, &peek, data))
}

/// The batched renewal's statements (see [`crate::renew`]), by padded list size: the update,
/// and the read of which leases of the list are held, for when fewer rows matched than were
/// asked. ARGS of both: name, owner, version, ttl_us for each lease (`NULL`s for padding).
/// The read returns the 0-based positions of the leases held.
fn renew_many_sql(table: &str) -> (BySize, BySize) {
    let t = quote(table, '`');
    // The first row's casts give the list's column types.
    let list = |rows: usize| {
        let mut list = String::from(
            "SELECT 0 AS i, CAST(? AS BINARY) AS name, CAST(? AS BINARY) AS owner, \
             CAST(? AS SIGNED) AS version, CAST(? AS SIGNED) AS ttl",
        );
        for i in 1..rows {
            list.push_str(&format!(" UNION ALL SELECT {i}, ?, ?, ?, ?"));
        }
        list
    };
    let join = "l.name = v.name AND l.owner = v.owner AND l.version = v.version";
    let update = BySize::new(LIST_MAX_BATCH, |rows| {
        format!(
            "UPDATE {t} AS l JOIN ({}) AS v ON {join} \
             SET l.expires_at = {NOW} + INTERVAL v.ttl MICROSECOND WHERE l.expires_at > {NOW}",
            list(rows)
        )
    });
    let held = BySize::new(LIST_MAX_BATCH, |rows| {
        format!(
            "SELECT v.i FROM {t} AS l JOIN ({}) AS v ON {join} WHERE l.expires_at > {NOW}",
            list(rows)
        )
    });
    (update, held)
}

/// A list statement of MySQL's batched renewal with `batch` bound (see [`renew_many_sql`]).
fn bind_list<'q>(
    sql: &Arc<str>,
    batch: &[Renewal<'q>],
) -> sqlx::query::Query<'q, sqlx::MySql, sqlx::mysql::MySqlArguments> {
    let mut query = q(sql);
    for r in batch {
        query = query
            .bind(r.name)
            .bind(r.owner)
            .bind(r.version)
            .bind(r.ttl_us);
    }
    for _ in batch.len()..padded(batch.len()) {
        query = query.bind(None::<&str>).bind(None::<&str>);
        query = query.bind(None::<i64>).bind(None::<i64>);
    }
    query
}

/// The holders' statements (see [`crate::kinds`]); `data`: whether the lock table has the
/// `data` column, cleared when the row gets the marker or is freed.
fn holder_statements(table: &str, peek: &str, data: DataColumn) -> HolderSql {
    let t = quote(table, '`');
    let h = quote(&holders_table(table), '`');
    let clear_data = data.clear();
    let live = format!("FROM {h} WHERE name = ? AND expires_at > {NOW}");
    let info = |data: &str| {
        format!(
            "SELECT owner, token, TIMESTAMPDIFF(MICROSECOND, {NOW}, expires_at), \
             (SELECT COUNT(*) {live}), {data} FROM {h} WHERE name = ? AND expires_at > {NOW} \
             ORDER BY token DESC LIMIT 1"
        )
    };
    let setup = vec![
        format!(
            "CREATE TABLE IF NOT EXISTS {h} (name VARBINARY(512) NOT NULL, \
             owner VARBINARY(255) NOT NULL, token BIGINT NOT NULL, expires_at DATETIME(6) NOT NULL, \
             permits BIGINT NOT NULL, data {DATA_TYPE} NULL, PRIMARY KEY (name, owner)) \
             ENGINE=InnoDB"
        )
        .into(),
    ];
    HolderSql {
        lock: format!("{peek} FOR UPDATE").into(),
        // A no-op update rather than INSERT IGNORE, which would hide other errors.
        ensure: format!(
            "INSERT INTO {t} (name, owner, version, expires_at) VALUES (?, NULL, {NOW_US}, {NOW}) \
             ON DUPLICATE KEY UPDATE name = name"
        )
        .into(),
        purge: format!("DELETE FROM {h} WHERE name = ? AND (expires_at <= {NOW} OR owner = ?)")
            .into(),
        purge_all: format!("DELETE FROM {h} WHERE name = ?").into(),
        count: format!(
            "SELECT COUNT(*), MIN(TIMESTAMPDIFF(MICROSECOND, {NOW}, expires_at)) {live}"
        )
        .into(),
        // Assignments run left to right: the reservation's columns before `next_owner`.
        mark: format!(
            "UPDATE {t} SET owner = ?, version = version + 1, \
             expires_at = GREATEST(expires_at, {NOW} + INTERVAL ? MICROSECOND), \
             next_since = IF(next_owner <=> ?, NULL, next_since), \
             next_expires = IF(next_owner <=> ?, NULL, next_expires), \
             next_owner = IF(next_owner <=> ?, NULL, next_owner){clear_data} WHERE name = ?"
        )
        .into(),
        insert: format!(
            "INSERT INTO {h} (name, owner, token, expires_at, permits) \
             VALUES (?, ?, ?, {NOW} + INTERVAL ? MICROSECOND, ?)"
        )
        .into(),
        extend: format!(
            "UPDATE {h} SET expires_at = {NOW} + INTERVAL ? MICROSECOND \
             WHERE name = ? AND owner = ? AND token = ? AND expires_at > {NOW}"
        )
        .into(),
        stretch: format!(
            "UPDATE {t} SET expires_at = GREATEST(expires_at, {NOW} + INTERVAL ? MICROSECOND) \
             WHERE name = ?"
        )
        .into(),
        leave: format!(
            "DELETE FROM {h} WHERE name = ? AND owner = ? AND token = ? AND expires_at > {NOW}"
        )
        .into(),
        free: format!("UPDATE {t} SET owner = NULL, expires_at = {NOW}{clear_data} WHERE name = ?")
            .into(),
        shrink: format!(
            "UPDATE {t} SET expires_at = COALESCE((SELECT MAX(expires_at) {live}), {NOW}) \
             WHERE name = ?"
        )
        .into(),
        info: info("data").into(),
        info_without_data: info("NULL").into(),
        set_data: format!(
            "UPDATE {h} SET data = ? \
             WHERE name = ? AND owner = ? AND token = ? AND expires_at > {NOW}"
        )
        .into(),
        has_data: format!(
            "SELECT COUNT(*) FROM information_schema.columns WHERE {}",
            column_of(&holders_table(table), "data")
        )
        .into(),
        add_data: format!("ALTER TABLE {h} ADD COLUMN data {DATA_TYPE} NULL").into(),
        notify: None,
        setup,
    }
}

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
///   of its own) and takes the lock as soon as the holder gave it up.
///
/// At most a quarter of the pool is pinned, and at most a quarter waits; beyond that (and for
/// a first take, which inserts the row) holders take no wake lock and waiters poll.
///
/// A pinned connection idles for as long as its lock is held, and the server closes a
/// connection idle for `wait_timeout` (the wake lock going with it: the waiter would then
/// poll every 20 ms for the rest of the hold). So a task pings every pinned connection idle
/// for half the time after which the pool checks a connection ([`IdleLimit`]: a quarter of
/// `wait_timeout`, at most every 30 s): see [`WakeLocks::keep_alive`].
#[derive(Debug)]
pub(crate) struct MyDb {
    check: Arc<str>,
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

/// Whether the lock table (`table`, unquoted, maybe `schema.table`) has `column`: a table
/// created by an earlier version and not altered (`create_table` off) may lack `next_ttl`
/// (its releases then free the lock instead of handing it over) or `data` (its holds then
/// carry no data).
async fn has_column(conn: &mut sqlx::MySqlConnection, table: &str, column: &str) -> Result<bool> {
    let (schema, name) = match table.split_once('.') {
        Some((schema, name)) => (Some(schema), name),
        None => (None, table),
    };
    let found: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.columns \
         WHERE table_schema = COALESCE(?, DATABASE()) AND table_name = ? AND column_name = ?",
    )
    .bind(schema)
    .bind(name)
    .bind(column)
    .fetch_one(conn)
    .await
    .map_err(|e| map_err(&format!("reading the columns of {table}"), e))?;
    Ok(found > 0)
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
        // The server closes a connection idle for `wait_timeout` seconds (see `IdleLimit`).
        let wait_timeout: Option<i64> =
            sqlx::query_scalar("SELECT CAST(@@session.wait_timeout AS SIGNED)")
                .fetch_one(&mut *conn)
                .await
                .map_err(|e| map_err("reading wait_timeout", e))?;
        let wait_timeout = wait_timeout.and_then(|s| u64::try_from(s).ok());
        idle.set_server_limit(wait_timeout.map(Duration::from_secs));
        // With `create_table`, the table has the columns once this block is through.
        let (handover, data) = if config.create_table {
            let create = format!(
                "CREATE TABLE IF NOT EXISTS {table} (name VARBINARY(512) NOT NULL PRIMARY KEY, \
                 owner VARBINARY(255) NULL, version BIGINT NOT NULL, expires_at DATETIME(6) NOT NULL, \
                 next_owner VARBINARY(255) NULL, next_since BIGINT NULL, next_expires DATETIME(6) NULL, \
                 next_ttl BIGINT NULL, data {DATA_TYPE} NULL) ENGINE=InnoDB"
            );
            conn.execute(AssertSqlSafe(create))
                .await
                .map_err(|e| map_err(&format!("creating the lock table {table}"), e))?;
            // A table of an earlier version: the column of hand-overs, the holder data. Each
            // altered only when missing, since an ALTER waits for every open transaction on
            // the table; a concurrent client may have added it meanwhile (duplicate column).
            for (column, ty) in [("next_ttl", "BIGINT"), ("data", DATA_TYPE)] {
                if !has_column(conn, &config.table, column).await? {
                    let alter = format!("ALTER TABLE {table} ADD COLUMN {column} {ty} NULL");
                    if let Err(err) = conn.execute(AssertSqlSafe(alter)).await
                        && !has_column(conn, &config.table, column).await?
                    {
                        return Err(map_err(&format!("adding {column} to {table}"), err));
                    }
                }
            }
            (true, true)
        } else {
            (
                has_column(conn, &config.table, "next_ttl").await?,
                has_column(conn, &config.table, "data").await?,
            )
        };
        drop(setup.done());
        let (sql, check, wake, holds) = statements(&config.table, handover, DataColumn(data));
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
            },
            check,
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
                self.wake.pin(name, owner, hot.into_pooled(), slot);
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

    fn hands_over(&self) -> bool {
        self.wake.handover
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
            Ok(Some(1)) => self.wake.pin(name, owner, hot.into_pooled(), slot),
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
        let pinned = match self.wake.take_pinned(name, owner).await {
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
    ) -> Option<ServerWait> {
        let slot = self.wake.wait_slots.clone().try_acquire_owned().ok()?;
        let lock = format!("{}{version}", self.wake.prefix(name));
        // Whole seconds (MySQL's GET_LOCK takes no fraction), at least one, at most the cap.
        let secs = remaining.as_secs().saturating_add(1).min(MAX_WAIT_SECS);
        let (cancel, cancelled) = oneshot::channel();
        let whose = (name.to_owned(), owner.to_owned());
        let task = tokio::spawn(self.wake.clone().wait(lock, secs, cancelled, slot, whose));
        Some(ServerWait::new(version, task, cancel))
    }

    fn forget(&self, name: &str, owner: &str) {
        // Closing the connection (when the pinned one is dropped) gives its wake lock up.
        drop(self.wake.unpin(name, owner));
    }

    fn pool(&self) -> SqlPool {
        SqlPool::MySql(self.common.conns.pool().clone())
    }
}
