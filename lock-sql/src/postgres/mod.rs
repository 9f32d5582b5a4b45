//! PostgreSQL: one statement that updates a free row or inserts a missing one (`WITH u AS
//! (UPDATE .. WHERE free), i AS (INSERT .. WHERE NOT EXISTS u ON CONFLICT DO NOTHING)`),
//! `now()` as the clock, `pg_notify` in the releasing statement (and in the take of a waiter
//! that held the reservation) and one `LISTEN`ing connection.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock_core::Result;
use sqlx::postgres::PgListener;
use sqlx::{AssertSqlSafe, Executor, Row};

use crate::backend::SqlPool;
use crate::config::SqlConfig;
use crate::db::{Claim, Db, Sessions, each_hold};
use crate::dialect::{Common, CommonStatements, DataColumn, Sql, granted_to, prepare_all, q};
use crate::error::{map_err, pooler_err};
use crate::hot::HotConns;
use crate::keys::quote;
use crate::kinds::{HeldBy, HolderSql, Holds, holders_table, marker};
use crate::pool::{IdleLimit, InUse, open_server};
use crate::renew::{PG_MAX_BATCH, Renewal, renewed_at};
use crate::wake::{Notifier, Subscription, parse_payload};

mod routines;

use routines::routines;

/// The database's clock in microseconds since the Unix epoch: the first version of a new row
/// (see the crate docs, "A store emptied or recreated"), and the first value of the sequence
/// of readers' tokens (see `routines`).
pub(super) const NOW_US: &str = "(EXTRACT(EPOCH FROM now()) * 1000000)::bigint";

/// The columns of a lock row's [`Peek`](crate::db::Peek).
const PEEK_COLUMNS: &str = "owner, version, CASE WHEN owner IS NOT NULL AND expires_at > now() \
     THEN (EXTRACT(EPOCH FROM (expires_at - now())) * 1000000)::bigint END AS remaining, \
     next_owner, next_since, CASE WHEN next_owner IS NOT NULL AND next_expires > now() \
     THEN (EXTRACT(EPOCH FROM (next_expires - now())) * 1000000)::bigint END AS next_remaining";

/// The remaining lease of a row (of the holders table) in microseconds.
const REMAINING: &str = "(EXTRACT(EPOCH FROM (expires_at - now())) * 1000000)::bigint";

/// The lock table's statements in this dialect; with `handover` (the table has the
/// `next_ttl` column), a release hands the lock to the exclusive waiter holding the
/// reservation (see [`PgDb`]); with `data` (the table has the `data` column), holds carry
/// data, which every take, release, hand-over, abandon and forced release clears.
fn statements(table: &str, handover: bool, data: DataColumn) -> (Sql, Arc<str>, HolderSql) {
    let t = quote(table, '"');
    let clear_data = data.clear();
    let us = "* interval '1 microsecond'";
    // An UPDATE of a free row, else an INSERT of a missing one. Unlike
    // `INSERT .. ON CONFLICT DO UPDATE .. WHERE`, a refused take locks no row, so it writes
    // no WAL and commits without a flush: waiters polling a busy lock stay cheap.
    let clear_ttl = if handover { ", next_ttl = NULL" } else { "" };
    let take = format!(
        "WITH u AS (UPDATE {t} SET owner = $2, version = version + 1, \
             expires_at = now() + $3::bigint {us}, next_owner = NULL, next_since = NULL, \
             next_expires = NULL{clear_ttl}{clear_data} \
             WHERE name = $1 AND (owner IS NULL OR owner = $2 OR expires_at <= now()) \
             AND (next_owner IS NULL OR next_owner = $2 OR next_expires <= now()) RETURNING version, owner), \
             i AS (INSERT INTO {t} (name, owner, version, expires_at) \
             SELECT $1, $2, {NOW_US}, now() + $3::bigint {us} WHERE NOT EXISTS (SELECT 1 FROM u) \
             ON CONFLICT (name) DO NOTHING RETURNING version, owner), \
             v AS (SELECT version, owner FROM u UNION ALL SELECT version, owner FROM i)"
    );
    let peek_columns = PEEK_COLUMNS;
    let peek = format!("SELECT {peek_columns} FROM {t} WHERE name = $1");
    // Set in a statement's RETURNING (evaluated only for a row it changed), this makes the
    // statement's commit return without waiting for its WAL flush: for writes that need no
    // durability of their own. A waiter's reservation is a hint that lives a second; a lost
    // release (a database crash within the WAL writer's delay) leaves the lock held until its
    // lease ends, never held twice; and every take commits synchronously, which flushes
    // every earlier commit with it, so a token can never be handed out twice.
    let no_flush = NO_FLUSH;
    let sql = Sql {
            take: format!("{take} SELECT version, owner FROM v").into(),
            peek: peek.as_str().into(),
            reserve: reserve_sql(&t, handover, no_flush).into(),
            renew: format!(
                "UPDATE {t} SET expires_at = now() + $1::bigint {us} \
                 WHERE name = $2 AND owner = $3 AND version = $4 AND expires_at > now()"
            )
            .into(),
            release: if handover {
                release_handing_over(&t, clear_data, None)
            } else {
                format!(
                    "WITH r AS (UPDATE {t} SET owner = NULL, expires_at = now(){clear_data} \
                     WHERE name = $1 AND owner = $2 AND version = $3 AND expires_at > now() \
                     RETURNING name, next_owner, next_expires > now() AS live, {no_flush}) \
                     SELECT CASE WHEN next_owner IS NULL THEN NULL \
                     WHEN live THEN pg_notify($4, octet_length(next_owner) || ':' || next_owner || name) \
                     ELSE pg_notify($4, '0:' || name) END FROM r"
                )
            }
            .into(),
            abandon: abandon_sql(&t, handover, data).into(),
            force: format!(
                "WITH r AS (UPDATE {t} SET owner = NULL, expires_at = now(){clear_data} \
                 WHERE name = $1 AND owner IS NOT NULL AND expires_at > now() RETURNING name) \
                 SELECT pg_notify($2, '0:' || name) FROM r"
            )
            .into(),
            list: format!(
                "SELECT name, owner, version, \
                 (EXTRACT(EPOCH FROM (expires_at - now())) * 1000000)::bigint, {} \
                 FROM {t} WHERE owner IS NOT NULL AND expires_at > now() \
                 AND left(name, length($1)) = $2 ORDER BY name LIMIT $3",
                data.select()
            )
            .into(),
            inspect: format!(
                "SELECT {peek_columns}, {} FROM {t} WHERE name = $1",
                data.select()
            )
            .into(),
            set_data: data.0.then(|| {
                format!(
                    "UPDATE {t} SET data = $1 \
                     WHERE name = $2 AND owner = $3 AND version = $4 AND expires_at > now()"
                )
                .into()
            }),
    };
    let take_wake =
        format!("{take} SELECT version, owner, pg_notify($4, '0:' || $1) FROM v").into();
    (sql, take_wake, holder_statements(table, &peek, data))
}

/// A waiter's reservation of the lock's next turn (never the holder's own: a hand-over to this
/// waiter came first); with `handover`, with the ttl the hand-over gives it. ARGS: name,
/// owner, since, reservation ttl in microseconds (, the waiter's ttl).
fn reserve_sql(t: &str, handover: bool, no_flush: &str) -> String {
    let us = "* interval '1 microsecond'";
    if handover {
        format!(
            "UPDATE {t} SET next_owner = $2, next_since = $3, \
             next_expires = now() + $4::bigint {us}, next_ttl = $5 \
             WHERE name = $1 AND owner IS DISTINCT FROM $2 \
             AND (next_owner IS NULL OR next_owner = $2 OR next_expires <= now() \
             OR next_since > $3) RETURNING owner IS NULL OR expires_at <= now(), {no_flush}"
        )
    } else {
        format!(
            "UPDATE {t} SET next_owner = $2, next_since = $3, next_expires = now() + $4::bigint {us} \
             WHERE name = $1 AND (next_owner IS NULL OR next_owner = $2 OR next_expires <= now() \
             OR next_since > $3) RETURNING owner IS NULL OR expires_at <= now(), {no_flush}"
        )
    }
}

/// An attempt's cleanup: its hold or its reservation, whichever it has, and a wake-up.
/// ARGS: name, owner, channel. With `handover` (the table has `next_ttl`), the reservation's
/// ttl goes with it: left behind, a release would hand the lock to the next reservation
/// written without one (by a client of a version before `next_ttl`, a reader's), as to a
/// writer.
fn abandon_sql(t: &str, handover: bool, data: DataColumn) -> String {
    let clear_ttl = if handover {
        ", next_ttl = CASE WHEN next_owner = $2 THEN NULL ELSE next_ttl END"
    } else {
        ""
    };
    format!(
        "WITH r AS (UPDATE {t} SET \
         expires_at = CASE WHEN owner = $2 THEN now() ELSE expires_at END, \
         owner = CASE WHEN owner = $2 THEN NULL ELSE owner END, \
         next_expires = CASE WHEN next_owner = $2 THEN NULL ELSE next_expires END, \
         next_since = CASE WHEN next_owner = $2 THEN NULL ELSE next_since END, \
         next_owner = CASE WHEN next_owner = $2 THEN NULL ELSE next_owner END{clear_ttl}{} \
         WHERE name = $1 AND (owner = $2 OR next_owner = $2) RETURNING name) \
         SELECT pg_notify($3, '0:' || name) FROM r",
        if data.0 {
            ", data = CASE WHEN owner = $2 THEN NULL ELSE data END"
        } else {
            ""
        }
    )
}

/// Set in a statement's `RETURNING` or `SELECT`, makes its commit return without waiting for
/// its WAL flush (see [`statements`]).
const NO_FLUSH: &str = "set_config('synchronous_commit', 'off', true)";

/// The release that hands the lock over. ARGS: name, owner, version, channel.
///
/// When an exclusive waiter holds a live reservation (`next_ttl` positive), the row becomes that
/// waiter's, with the next version and the waiter's ttl from the clock as the row is updated
/// (`clock_timestamp()`, not `now()`: the statement may have started before the waiter's last
/// claim of the reservation was sent, which bounds its lease; the update read that claim's
/// commit, so it follows its send. A read of the waiter's may follow the update, while this
/// commit waits, and still find the old holder: see `SqlAttempt::claimed_at`), and the notification
/// (`h<version>:..`, see [`crate::wake::parse_payload`]) tells it so: a handoff is this one
/// statement, with the waiter's take done in it. This commit hands out a fencing token, so it
/// waits for its WAL flush like a take. Otherwise the lock is freed as before: the reserved
/// waiter (a shared one) or every waiter is woken, and the commit does not wait for its flush.
/// The assignments all read the row as it was. `clear_data` clears the holder data (see
/// [`DataColumn::clear`]): the freed hold's, or the former holder's on a hand-over.
///
/// With `hand_read` (the function of that name, see `routines`), a live reservation of a
/// reader (a negative `next_ttl`, its ttl negated, see [`Db::hands_reads_over`]) is handed
/// a read hold: the row is freed as above, then that function, called in this statement,
/// marks it shared with the next version, adds the reader's holder row and tells it
/// (`h<version>:..`), and does the same for each reader queued behind it (since `_v9`); the
/// commit waits for its flush. Only readers of this version reserve
/// with a negative `next_ttl` on a name a writer holds (a permit waiter queues instead, and
/// one of a version before `_v4`, which reserved with its ttl negated, waits on a name held
/// as a semaphore: a writer's name only by misuse of the name for both). A release of an
/// earlier client wakes such a reader, which then joins, as before.
fn release_handing_over(t: &str, clear_data: &str, hand_read: Option<&str>) -> String {
    let no_flush = NO_FLUSH;
    // A permit waiter's reservation has a negative `next_ttl`: never handed the lock.
    let h = "(next_owner IS NOT NULL AND next_expires > now() AND next_ttl > 0 \
             AND next_owner <> owner)";
    let keep = |column: &str| format!("{column} = CASE WHEN {h} THEN NULL ELSE {column} END");
    // A reader's live reservation, read from the row as this statement left it.
    let reader = "live AND next_ttl < 0";
    let (read, flushed) = match hand_read {
        Some(f) => (
            format!("WHEN {reader} THEN {f}(name, next_owner, -next_ttl)"),
            format!("AND NOT coalesce({reader}, false)"),
        ),
        None => (String::new(), String::new()),
    };
    format!(
        "WITH r AS (UPDATE {t} SET owner = CASE WHEN {h} THEN next_owner END, \
         version = version + CASE WHEN {h} THEN 1 ELSE 0 END, \
         expires_at = CASE WHEN {h} THEN clock_timestamp() + next_ttl * interval '1 microsecond' \
         ELSE now() END, \
         {}, {}, {}, {}{clear_data} \
         WHERE name = $1 AND owner = $2 AND version = $3 AND expires_at > now() \
         RETURNING name, owner, version, next_owner, next_expires > now() AS live, next_ttl) \
         SELECT CASE WHEN owner IS NOT NULL \
         THEN pg_notify($4, 'h' || version || ':' || octet_length(owner) || ':' || owner || name) \
         WHEN next_owner IS NULL THEN NULL {read} \
         WHEN live THEN pg_notify($4, octet_length(next_owner) || ':' || next_owner || name) \
         ELSE pg_notify($4, '0:' || name) END, \
         CASE WHEN owner IS NULL {flushed} THEN {no_flush} END FROM r",
        keep("next_owner"),
        keep("next_since"),
        keep("next_expires"),
        keep("next_ttl"),
    )
}

/// The batched renewal (see [`crate::renew`]). ARGS: names, owners, versions, ttls (µs), as
/// arrays. Returns the 1-based position of each renewed lease.
///
/// The lease check compares with `(SELECT now())`, not `now()`: the planner estimates
/// `expires_at > now()` from the table's statistics, which, on a table whose last analyze
/// saw only expired leases (a table with history, before a client takes thousands of
/// locks), say that about one row is live. It then scanned the table for the live rows and
/// compared each with every name of the batch (a nested loop with a join filter): 2.5 s for
/// one batch of 1,024 with 10,000 locks held (PostgreSQL 15, 60,000 rows), so every lock of
/// the client was lost at a 3 s ttl. A comparison with a sub-select's value is estimated
/// without the statistics, and the plan becomes a lookup by name per lease (or a hash join):
/// 16-19 ms for the same batch.
fn renew_many_sql(table: &str) -> Arc<str> {
    let t = quote(table, '"');
    format!(
        "UPDATE {t} AS l SET expires_at = now() + v.ttl * interval '1 microsecond' \
         FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[]) \
         WITH ORDINALITY AS v(name, owner, version, ttl, i) \
         WHERE l.name = v.name AND l.owner = v.owner AND l.version = v.version \
         AND l.expires_at > (SELECT now()) RETURNING v.i"
    )
    .into()
}

/// The holders' statements (see [`crate::kinds`]); `data`: whether the lock table has the
/// `data` column, cleared when the row gets the marker or is freed.
fn holder_statements(table: &str, peek: &str, data: DataColumn) -> HolderSql {
    let t = quote(table, '"');
    let h = quote(&holders_table(table), '"');
    let clear_data = data.clear();
    let us = "* interval '1 microsecond'";
    let remaining = REMAINING;
    let live = format!("FROM {h} WHERE name = $1 AND expires_at > now()");
    let info = |data: &str| {
        format!(
            "SELECT owner, token, {remaining}, (SELECT count(*) {live}), {data} \
             FROM {h} WHERE name = $2 AND expires_at > now() ORDER BY token DESC LIMIT 1"
        )
    };
    let clear = |n: usize| {
        format!(
            "next_since = CASE WHEN next_owner = ${n} THEN NULL ELSE next_since END, \
             next_expires = CASE WHEN next_owner = ${} THEN NULL ELSE next_expires END, \
             next_owner = CASE WHEN next_owner = ${} THEN NULL ELSE next_owner END",
            n + 1,
            n + 2
        )
    };
    let setup = vec![
        // Concurrent first uses can race on the catalog: serialize them.
        "SELECT pg_advisory_xact_lock(7283160942917)".into(),
        format!(
            "CREATE TABLE IF NOT EXISTS {h} (name TEXT COLLATE \"C\" NOT NULL, owner TEXT NOT NULL, \
             token BIGINT NOT NULL, expires_at TIMESTAMPTZ NOT NULL, permits BIGINT NOT NULL, \
             data TEXT, PRIMARY KEY (name, owner))"
        )
        .into(),
    ];
    HolderSql {
        lock: format!("{peek} FOR UPDATE").into(),
        ensure: format!(
            "INSERT INTO {t} (name, owner, version, expires_at) VALUES ($1, NULL, {NOW_US}, now()) \
             ON CONFLICT (name) DO NOTHING"
        )
        .into(),
        purge: format!("DELETE FROM {h} WHERE name = $1 AND (expires_at <= now() OR owner = $2)")
            .into(),
        purge_all: format!("DELETE FROM {h} WHERE name = $1").into(),
        count: format!("SELECT count(*), min({remaining}) {live}").into(),
        mark: format!(
            "UPDATE {t} SET owner = $1, version = version + 1, \
             expires_at = GREATEST(expires_at, now() + $2::bigint {us}), {}{clear_data} WHERE name = $6",
            clear(3)
        )
        .into(),
        insert: format!(
            "INSERT INTO {h} (name, owner, token, expires_at, permits) \
             VALUES ($1, $2, $3, now() + $4::bigint {us}, $5)"
        )
        .into(),
        extend: format!(
            "UPDATE {h} SET expires_at = now() + $1::bigint {us} \
             WHERE name = $2 AND owner = $3 AND token = $4 AND expires_at > now()"
        )
        .into(),
        stretch: format!(
            "UPDATE {t} SET expires_at = GREATEST(expires_at, now() + $1::bigint {us}) WHERE name = $2"
        )
        .into(),
        leave: format!(
            "DELETE FROM {h} WHERE name = $1 AND owner = $2 AND token = $3 AND expires_at > now()"
        )
        .into(),
        free: format!("UPDATE {t} SET owner = NULL, expires_at = now(){clear_data} WHERE name = $1")
            .into(),
        shrink: format!(
            "UPDATE {t} SET expires_at = COALESCE((SELECT max(expires_at) {live}), now()) WHERE name = $2"
        )
        .into(),
        info: info("data").into(),
        info_without_data: info("NULL").into(),
        set_data: format!(
            "UPDATE {h} SET data = $1 \
             WHERE name = $2 AND owner = $3 AND token = $4 AND expires_at > now()"
        )
        .into(),
        has_data: format!("SELECT count(*) {}", column_of(&h, "data", false)).into(),
        set_up: Some(format!("SELECT count(*) {}", column_of(&h, "data", true)).into()),
        add_data: format!("ALTER TABLE {h} ADD COLUMN IF NOT EXISTS data TEXT").into(),
        // The table is a plain identifier: safe in a literal.
        notify: Some(format!("SELECT pg_notify('distlock:{table}', $1)").into()),
        setup,
    }
}

#[derive(Debug)]
pub(crate) struct PgDb {
    take_wake: Arc<str>,
    renew_many: Arc<str>,
    /// ARGS: name, owner, token. The remaining lease (µs) of that live hold: a read hold a
    /// writer's release handed over ([`Db::hold_left`]).
    hold_left: Arc<str>,
    common: Common<sqlx::Postgres>,
    channel: String,
    notifier: Arc<Notifier>,
    listener: tokio::task::AbortHandle,
    /// Whether releases hand the lock to the reserved exclusive waiter.
    handover: bool,
    /// Whether a writer's release hands a read hold to the reserved reader (see
    /// [`release_handing_over`]).
    reads_handed: bool,
}

impl Drop for PgDb {
    fn drop(&mut self) {
        self.listener.abort();
    }
}

impl PgDb {
    pub(crate) async fn open(config: &SqlConfig, sessions: Arc<Sessions>) -> Result<Self> {
        // Every session at READ COMMITTED whatever the database's or the role's default (see
        // `check_isolation`).
        let session_id = "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL READ \
                          COMMITTED; SELECT pg_backend_pid()::bigint";
        let (pool, idle) =
            open_server::<sqlx::Postgres>(config, sessions, "PostgreSQL", session_id).await?;
        Self::set_up(pool, config, config.max_connections / 2, idle).await
    }

    /// Sets up the lock table, its statements and the `LISTEN` connection on `pool`, keeping
    /// at most `keep` connections checked out between statements (see [`HotConns`]).
    pub(crate) async fn on_pool(pool: sqlx::PgPool, config: &SqlConfig, keep: u32) -> Result<Self> {
        Self::set_up(pool, config, keep, Arc::new(IdleLimit::server())).await
    }

    /// [`Self::on_pool`], with `idle` the limit the pool's `before_acquire` reads, set here
    /// from the server's `idle_session_timeout`.
    async fn set_up(
        pool: sqlx::PgPool,
        config: &SqlConfig,
        keep: u32,
        idle: Arc<IdleLimit>,
    ) -> Result<Self> {
        let mut listener = PgListener::connect_with(&pool)
            .await
            .map_err(|e| map_err("LISTEN", e))?;
        check_sessions(&mut listener, &pool, config).await?;
        check_isolation(&pool).await?;
        idle.set_server_limit(idle_session_timeout(&pool).await?);
        let table = quote(&config.table, '"');
        // Read first, which is all a connect does once the table is complete: the block that
        // creates it serializes every connect that runs it, under one advisory lock. Closed,
        // not given back, if cancelled mid-way (see `InUse`).
        let mut conn = InUse::acquire(&pool)
            .await
            .map_err(|e| map_err("connect", e))?;
        let mut found = columns(conn.conn(), &table, config.create_table).await?;
        // With `create_table`, the table has the columns once this block is through.
        if config.create_table && found != (true, true, true) {
            let create = format!(
                "CREATE TABLE IF NOT EXISTS {table} (name TEXT COLLATE \"C\" PRIMARY KEY, owner TEXT, \
                 version BIGINT NOT NULL, expires_at TIMESTAMPTZ NOT NULL, next_owner TEXT, \
                 next_since BIGINT, next_expires TIMESTAMPTZ, next_ttl BIGINT, data TEXT, \
                 read_base BIGINT, read_from BIGINT)"
            );
            // Concurrent first connects can race on the catalog: serialize them.
            let mut tx = sqlx::Connection::begin(conn.conn())
                .await
                .map_err(|e| map_err("create table", e))?;
            sqlx::query("SELECT pg_advisory_xact_lock(7283160942917)")
                .execute(&mut *tx)
                .await
                .map_err(|e| map_err("create table", e))?;
            tx.execute(AssertSqlSafe(create))
                .await
                .map_err(|e| map_err(&format!("creating the lock table {table}"), e))?;
            // A table of an earlier version: the column of hand-overs, the holder data, the
            // readers' tokens (see `routines`). Each altered only when missing (read again
            // under the lock), since an ALTER waits for every open transaction on the table.
            let (next_ttl, data, reads) = columns(&mut tx, &table, false).await?;
            for (column, ty, present) in [
                ("next_ttl", "BIGINT", next_ttl),
                ("data", "TEXT", data),
                ("read_base", "BIGINT", reads),
                ("read_from", "BIGINT", reads),
            ] {
                if !present {
                    let alter =
                        format!("ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {column} {ty}");
                    tx.execute(AssertSqlSafe(alter))
                        .await
                        .map_err(|e| map_err(&format!("adding {column} to {table}"), e))?;
                }
            }
            tx.commit().await.map_err(|e| map_err("create table", e))?;
            found = (true, true, true);
        }
        drop(conn.done());
        let (handover, data, reads) = found;
        let (mut sql, take_wake, holds) = statements(&config.table, handover, DataColumn(data));
        let channel = format!("distlock:{}", config.table);
        // The functions read and write the readers' columns (a table without them, of an
        // earlier version, that this client may not alter: the transactions run).
        let made = routines(&config.table, &holds, PEEK_COLUMNS, REMAINING, &channel);
        let routines = match made.filter(|_| reads) {
            Some(made) => {
                let hand_read = made.hand_read.clone();
                routines::set_up(&pool, made, config.create_table)
                    .await
                    .map(|(routines, hands)| (routines, hands.then_some(hand_read)))
            }
            None => None,
        };
        // With the functions (and the right to call the hand-over: every exclusive release
        // names it), a writer's release hands a read hold to the reserved reader.
        let hand_read = routines.as_ref().and_then(|(_, h)| h.clone());
        let reads_handed = handover && hand_read.is_some();
        if let Some(hand_read) = hand_read.filter(|_| reads_handed) {
            sql.release =
                release_handing_over(&table, DataColumn(data).clear(), Some(&hand_read)).into();
        }
        let holds = Holds::new(holds, config.create_table);
        let renew_many = renew_many_sql(&config.table);
        let hold_left: Arc<str> = format!(
            "SELECT {REMAINING} FROM {} \
             WHERE name = $1 AND owner = $2 AND token = $3 AND expires_at > now()",
            quote(&holders_table(&config.table), '"')
        )
        .into();
        let mut prepared = sql.prepared();
        prepared.extend([&take_wake, &renew_many]);
        prepare_all(&pool, &prepared, &table).await?;
        listener
            .listen(&channel)
            .await
            .map_err(|e| map_err("LISTEN", e))?;
        let notifier = Arc::new(Notifier::default());
        let task = tokio::spawn(listen(listener, notifier.clone()));
        Ok(Self {
            common: Common {
                conns: HotConns::new(pool, keep).with_idle_limit(idle),
                sql,
                holds,
                routines: routines.map(|(routines, _)| routines.calls),
            },
            take_wake,
            renew_many,
            hold_left,
            channel,
            notifier,
            listener: task.abort_handle(),
            handover,
            reads_handed,
        })
    }
}

/// Refuses a pooler that gives one client connection's transactions to different server
/// sessions (PgBouncer's `pool_mode=transaction` or `statement`): the backend's `LISTEN`
/// (wake-ups), prepared statements and `synchronous_commit` settings belong to a session.
/// Through such a pooler the listening connection holds no server session while it waits, so
/// a release's notification reaches nobody, or whichever client has the server session that
/// ran the `LISTEN` at the time (sqlx fails that client's statement: "unexpected message:
/// NotificationResponse"); and a client's prepared statement `sqlx_s_1` is another client's
/// on the next server session ("already exists", or the other statement run with these
/// arguments). Nothing in the protocol says a pooler is there, so this tries what the backend
/// relies on: `listener` listens on a channel of its own and another connection of `pool`
/// notifies it. With a session per connection the notification reaches the listener within a
/// round trip. Through a transaction pooler it never does: the NOTIFY runs on the server
/// session that ran the LISTEN (the one PgBouncer freed last), which hands the notification to
/// the notifier itself, or on another one, and the listener waits in vain (half the connect
/// timeout). In the simple query protocol (no prepared statement), once per connect: three
/// round trips, on the two connections the backend opens first in any case.
async fn check_sessions(
    listener: &mut PgListener,
    pool: &sqlx::PgPool,
    config: &SqlConfig,
) -> Result<()> {
    let failed = |e| map_err("checking that PostgreSQL keeps sessions (LISTEN)", e);
    let channel = format!(
        "distlock_probe_{}_{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    );
    listener.listen(&channel).await.map_err(failed)?;
    let wait = config.effective_connect_timeout() / 2;
    let mut notifier = InUse::acquire(pool).await.map_err(failed)?;
    let notify = sqlx::raw_sql(AssertSqlSafe(format!("NOTIFY \"{channel}\"")))
        .execute(notifier.conn())
        .await;
    match notify {
        Ok(_) => drop(notifier.done()),
        // sqlx's answer to a notification on a connection that does not listen: the pooler
        // ran the NOTIFY on the server session that LISTENs (the connection is closed).
        Err(sqlx::Error::Protocol(err)) => {
            tracing::debug!(%err, "the probe's NOTIFY");
            let evidence =
                "a NOTIFY came back to the connection that sent it, which does not LISTEN";
            return Err(pooler_err(config, evidence));
        }
        Err(err) => return Err(failed(err)),
    }
    let heard = tokio::time::timeout(wait, async {
        loop {
            match listener.try_recv().await {
                Ok(Some(note)) if note.channel() == channel => return Ok(()),
                Ok(Some(_)) => {}
                // The connection was lost (not what a pooler does to an idle client).
                Ok(None) => return Err(failed(sqlx::Error::PoolClosed)),
                Err(err) => return Err(failed(err)),
            }
        }
    })
    .await;
    match heard {
        Ok(heard) => heard?,
        Err(_) => {
            let evidence = format!("a NOTIFY did not reach its LISTEN within {wait:?}");
            return Err(pooler_err(config, &evidence));
        }
    }
    listener.unlisten(&channel).await.map_err(failed)
}

/// Refuses sessions whose transactions do not run at READ COMMITTED by default. The
/// backend's functions are called as single statements, each its own transaction at the
/// session's default level, and count a name's live holders after waiting for its row lock:
/// under REPEATABLE READ that count reads the snapshot from before the wait, misses a reader
/// that joined meanwhile, and frees the name for a writer beside it. A pool the backend opens
/// sets it on every connection; a pool of the application's own
/// ([`PgDb::on_pool`]) must (`default_transaction_isolation`, or its `after_connect`): one of
/// its connections is checked here, once (READ UNCOMMITTED runs as READ COMMITTED).
async fn check_isolation(pool: &sqlx::PgPool) -> Result<()> {
    let level: String =
        sqlx::query_scalar("SELECT current_setting('default_transaction_isolation')")
            .fetch_one(pool)
            .await
            .map_err(|e| map_err("reading default_transaction_isolation", e))?;
    if level == "read committed" || level == "read uncommitted" {
        return Ok(());
    }
    Err(distlock_core::Error::InvalidConfig(format!(
        "the pool's sessions run transactions at {level} by default; distlock's lock \
         functions need read committed (set default_transaction_isolation on its connections)"
    )))
}

/// The server's `idle_session_timeout` (PostgreSQL 14 and later; `None`: off or unknown): it
/// closes sessions idle that long (see [`IdleLimit`]).
async fn idle_session_timeout(pool: &sqlx::PgPool) -> Result<Option<Duration>> {
    let ms: Option<i64> = sqlx::query_scalar(
        "SELECT setting::bigint FROM pg_settings WHERE name = 'idle_session_timeout'",
    )
    .fetch_optional(pool)
    .await
    .map_err(|e| map_err("reading idle_session_timeout", e))?;
    Ok(ms
        .and_then(|ms| u64::try_from(ms).ok())
        .filter(|&ms| ms > 0)
        .map(Duration::from_millis))
}

/// What goes before the literal of `table` (quoted) so that `to_regclass` or
/// `to_regprocedure` finds the object where `CREATE .. IF NOT EXISTS` of that name would look
/// for it: in the name's schema, else the current schema (the first of the search path), not a
/// same-named one in a schema later on the path, which such a `CREATE` would hide behind a new
/// one (another role's table in `public`, say).
pub(super) fn creation_schema(table: &str) -> &'static str {
    if table.contains('.') {
        ""
    } else {
        "quote_ident(current_schema()) || '.' || "
    }
}

/// `FROM .. WHERE` of the catalog rows of `column` of `table` (quoted; a plain identifier,
/// safe in a literal): of the table the name finds on the search path, or with `here` of the
/// one a `CREATE` would make ([`creation_schema`]).
fn column_of(table: &str, column: &str, here: bool) -> String {
    let schema = if here { creation_schema(table) } else { "" };
    format!(
        "FROM pg_attribute WHERE attrelid = to_regclass({schema}'{table}') \
         AND attname = '{column}' AND NOT attisdropped"
    )
}

/// Whether the lock table (`table`, quoted) has the column of hand-overs (`next_ttl`), the
/// holder data's (`data`) and the readers' (`read_base` and `read_from`), in one query (none
/// when the table does not exist): a table created by an earlier version and not altered
/// (`create_table` off) may lack `next_ttl` (its releases then free the lock instead of
/// handing it over), `data` (its holds then carry no data) or the readers' (the functions of
/// shared holds and permits are not used: the transactions run). `here`: of the table a
/// `CREATE` would make ([`creation_schema`]).
async fn columns(
    conn: &mut sqlx::PgConnection,
    table: &str,
    here: bool,
) -> Result<(bool, bool, bool)> {
    let schema = if here { creation_schema(table) } else { "" };
    let found = format!(
        "SELECT count(*) FILTER (WHERE attname = 'next_ttl') > 0, \
         count(*) FILTER (WHERE attname = 'data') > 0, \
         count(*) FILTER (WHERE attname IN ('read_base', 'read_from')) = 2 \
         FROM pg_attribute WHERE attrelid = to_regclass({schema}$1) AND NOT attisdropped"
    );
    sqlx::query_as(AssertSqlSafe(found))
        .bind(table)
        .fetch_one(conn)
        .await
        .map_err(|e| map_err(&format!("reading the columns of {table}"), e))
}

async fn listen(mut listener: PgListener, notifier: Arc<Notifier>) {
    loop {
        match listener.try_recv().await {
            Ok(Some(note)) => match parse_payload(note.payload()) {
                Some((note, name)) => notifier.wake(name, note),
                None => notifier.wake_all(),
            },
            // The connection dropped (it reconnects on the next call): events may be lost.
            Ok(None) => notifier.wake_all(),
            Err(err) => {
                tracing::debug!(%err, "LISTEN connection failed, retrying");
                notifier.wake_all();
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

#[async_trait]
impl Db for PgDb {
    fn common(&self) -> &dyn CommonStatements {
        &self.common
    }

    fn has_events(&self) -> bool {
        true
    }

    async fn take(
        &self,
        name: &str,
        owner: &str,
        ttl_us: i64,
        wake_waiters: bool,
    ) -> Result<Option<i64>, sqlx::Error> {
        let query = if wake_waiters {
            q(&self.take_wake)
                .bind(name)
                .bind(owner)
                .bind(ttl_us)
                .bind(&self.channel)
        } else {
            q(&self.common.sql.take).bind(name).bind(owner).bind(ttl_us)
        };
        let mut hot = self.common.conns.get().await?;
        let result = query.fetch_optional(hot.conn()).await;
        hot.finish(result.and_then(|row| row.map(|r| granted_to(&r, owner)).transpose()))
    }

    fn hands_over(&self) -> bool {
        self.handover
    }

    fn hands_permits_over(&self) -> bool {
        // The release function does it; the transactions do not.
        self.handover && self.common.routines.is_some()
    }

    fn hands_reads_over(&self) -> bool {
        self.reads_handed
    }

    async fn hold_left(
        &self,
        name: &str,
        owner: &str,
        token: i64,
    ) -> Result<Option<i64>, sqlx::Error> {
        let query = q(&self.hold_left).bind(name).bind(owner).bind(token);
        let row = self.common.conns.fetch_optional(query).await?;
        row.map(|row| row.try_get(0)).transpose()
    }

    fn queues_permits(&self) -> bool {
        self.common.queues_permits()
    }

    async fn reserve(
        &self,
        name: &str,
        owner: &str,
        since: i64,
        hold_us: i64,
        ttl_us: Option<i64>,
    ) -> Result<Claim, sqlx::Error> {
        let query = q(&self.common.sql.reserve)
            .bind(name)
            .bind(owner)
            .bind(since)
            .bind(hold_us);
        let query = if self.handover {
            query.bind(ttl_us)
        } else {
            query
        };
        let row = self.common.conns.fetch_optional(query).await?;
        Ok(match row {
            None => Claim::Refused,
            Some(row) if row.try_get::<bool, _>(0)? => Claim::GrantedFree,
            Some(_) => Claim::Granted,
        })
    }

    async fn renew_many(&self, batch: &[Renewal<'_>]) -> Result<Vec<bool>, sqlx::Error> {
        let names: Vec<&str> = batch.iter().map(|r| r.name).collect();
        let owners: Vec<&str> = batch.iter().map(|r| r.owner).collect();
        let versions: Vec<i64> = batch.iter().map(|r| r.version).collect();
        let ttls: Vec<i64> = batch.iter().map(|r| r.ttl_us).collect();
        let query = q(&self.renew_many).bind(names).bind(owners);
        let rows = self
            .common
            .conns
            .fetch_all(query.bind(versions).bind(ttls))
            .await?;
        let positions = rows
            .iter()
            .map(|row| row.try_get::<i64, _>(0).map(|i| i - 1))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(renewed_at(batch.len(), positions))
    }

    fn max_batch(&self) -> usize {
        PG_MAX_BATCH
    }

    fn batches_holds(&self) -> bool {
        self.common.renew_holds_call().is_some()
    }

    async fn renew_holds(&self, batch: &[(HeldBy<'_>, i64)]) -> Result<Vec<bool>, sqlx::Error> {
        let Some(call) = self.common.renew_holds_call() else {
            return each_hold(self, batch).await;
        };
        let names: Vec<&str> = batch.iter().map(|(h, _)| h.name).collect();
        let owners: Vec<&str> = batch.iter().map(|(h, _)| h.owner).collect();
        let markers: Vec<String> = batch.iter().map(|(h, _)| marker(h.kind)).collect();
        // No token (never a live lease's): NULL, which matches no holder.
        let tokens: Vec<Option<i64>> = batch.iter().map(|(h, _)| h.token).collect();
        let ttls: Vec<i64> = batch.iter().map(|&(_, ttl)| ttl).collect();
        let query = q(call).bind(names).bind(owners).bind(markers).bind(tokens);
        let rows = self.common.conns.fetch_all(query.bind(ttls)).await?;
        let positions = rows
            .iter()
            .map(|row| row.try_get::<i64, _>(0))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(renewed_at(batch.len(), positions))
    }

    async fn release(&self, name: &str, owner: &str, version: i64) -> Result<bool, sqlx::Error> {
        let row = self
            .common
            .conns
            .fetch_optional(
                q(&self.common.sql.release)
                    .bind(name)
                    .bind(owner)
                    .bind(version)
                    .bind(&self.channel),
            )
            .await?;
        Ok(row.is_some())
    }

    async fn abandon(&self, name: &str, owner: &str) -> Result<(), sqlx::Error> {
        self.common
            .conns
            .fetch_optional(
                q(&self.common.sql.abandon)
                    .bind(name)
                    .bind(owner)
                    .bind(&self.channel),
            )
            .await?;
        Ok(())
    }

    async fn force_release(&self, name: &str) -> Result<bool, sqlx::Error> {
        let row = self
            .common
            .conns
            .fetch_optional(q(&self.common.sql.force).bind(name).bind(&self.channel))
            .await?;
        Ok(row.is_some())
    }

    fn subscribe(&self, name: &str, owner: &str, claims: bool) -> Option<Subscription> {
        Some(self.notifier.subscribe(name, owner, claims))
    }

    fn pool(&self) -> SqlPool {
        SqlPool::Postgres(self.common.conns.pool().clone())
    }
}
