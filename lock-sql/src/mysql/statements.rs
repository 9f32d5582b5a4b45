//! The MySQL / MariaDB statements: the lock table's, the holders table's, the batched
//! renewal's and the wake lock's, built once per table.

use super::*;

pub(super) const NOW: &str = "UTC_TIMESTAMP(6)";

/// The type of the `data` columns: the holder data as the UTF-8 bytes it was given (at most
/// [`MAX_HOLDER_DATA`](distlock_core::MAX_HOLDER_DATA), 512 bytes; room for four times as
/// many), compared and stored byte for byte whatever the table's character set.
pub(super) const DATA_TYPE: &str = "VARBINARY(2048)";

/// The database's clock in microseconds since the Unix epoch: the first version of a new row
/// (see the crate docs, "A store emptied or recreated").
pub(super) const NOW_US: &str =
    "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))";

/// The columns of a lock row's [`Peek`](crate::db::Peek).
pub(super) fn peek_columns() -> String {
    format!(
        "owner, version, IF(owner IS NOT NULL AND expires_at > {NOW}, \
         TIMESTAMPDIFF(MICROSECOND, {NOW}, expires_at), NULL), next_owner, next_since, \
         IF(next_owner IS NOT NULL AND next_expires > {NOW}, \
         TIMESTAMPDIFF(MICROSECOND, {NOW}, next_expires), NULL)"
    )
}

/// ARGS: name, owner, wake lock prefix (twice; NULL: take no wake lock), marker, name, owner,
/// owner, wake lock prefix, name. A queued permit waiter's look (see [`Db::queued_look`]), as
/// up to three rows, told apart by their first column:
/// - `1`: how many live waiters are queued ahead of it (of its semaphore) and how many places
///   its own live place was compared with (0: its place is not live);
/// - `2` (only if a release handed it one): the token and remaining lease (µs) of a live
///   permit of its on a row that carries the marker (the lease no longer than the marker's:
///   a hand-over dates the name's row before the holder row, each statement of the procedure
///   at its own `NOW`, and a permit outliving its marker is not a permit), and whether its
///   wake lock was taken then (on this connection);
/// - `3`: how many live holder rows the name has, and the tokens of the other live holders
///   whose wake lock is held, oldest first (cut at `group_concat_max_len`, 1,024 characters
///   by default).
///
/// Three plain `SELECT`s rather than one with a scalar subquery per figure, which MariaDB
/// optimizes one by one at every execution: 3,000 looks from the `mariadb` client on a
/// semaphore of 3 holders and 5 waiters, 365-416 µs a look against 297-327 µs (a look is
/// about a fifth of the server's CPU in `--scenario semaphore`, `perf`).
pub(super) fn queued_look_sql(table: &str) -> String {
    let t = quote(table, '`');
    let h = quote(&holders_table(table), '`');
    let w = quote(&queue_table(table), '`');
    format!(
        "SELECT 1, CAST(SUM(a.permits = me.permits \
         AND (a.seq < me.seq OR (a.seq = me.seq AND a.owner < me.owner))) AS SIGNED), COUNT(*), \
         NULL, NULL \
         FROM {w} AS me JOIN {w} AS a ON a.name = me.name AND a.expires_at > {NOW} \
         WHERE me.name = ? AND me.owner = ? AND me.expires_at > {NOW} AND me.ttl >= 0 \
         UNION ALL SELECT 2, h.token, \
         TIMESTAMPDIFF(MICROSECOND, {NOW}, LEAST(h.expires_at, t.expires_at)), \
         IF(? IS NULL, NULL, GET_LOCK(CONCAT(?, h.token), 0)), NULL \
         FROM {h} AS h JOIN {t} AS t ON t.name = h.name AND t.owner = ? AND t.expires_at > {NOW} \
         WHERE h.name = ? AND h.owner = ? AND h.expires_at > {NOW} \
         UNION ALL SELECT 3, COUNT(*), NULL, NULL, \
         CAST(GROUP_CONCAT(IF(o.owner <> ? AND IS_USED_LOCK(CONCAT(?, o.token)) IS NOT NULL, \
         o.token, NULL) ORDER BY o.token) AS CHAR) \
         FROM {h} AS o WHERE o.name = ? AND o.expires_at > {NOW}"
    )
}

/// A release's assignments, with `handover` (see [`MyDb`]): to the exclusive waiter that
/// holds a live reservation, if any, else free. `wake`: the assignment of `owner` runs it
/// too (it gives the holder's wake lock up), whatever it decides. Assignments run left to
/// right and see earlier ones: the decision is taken first, into a session variable. `data`:
/// the holder data is cleared (the freed hold's, or the former holder's on a hand-over).
pub(super) fn release_sets(handover: bool, wake: &str, data: DataColumn) -> String {
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
/// `t` is the quoted table; `data`: a take clears the holder data (a new row has none);
/// `handover` (the table has `next_ttl`): and the reservation's ttl, with the reservation
/// (left behind, a release would hand the lock to the next reservation written without one,
/// by a client of a version before `next_ttl`, as to a writer).
pub(super) fn take_sql(t: &str, cleared: &str, handover: bool, data: DataColumn) -> String {
    let clear_data = if data.0 {
        ", data = IF(@distlock_take, NULL, data)"
    } else {
        ""
    };
    let clear_ttl = if handover {
        ", next_ttl = IF(@distlock_take, NULL, next_ttl)"
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
         next_expires = IF(@distlock_take, NULL, next_expires){clear_ttl}{clear_data}"
    )
}

/// The statements of the wake locks (`GET_LOCK`) beside the table's (`t`: the quoted
/// table).
pub(super) fn wake_lock_sql(t: &str, handover: bool, data: DataColumn) -> WakeLockSql {
    WakeLockSql {
        // ARGS: name, owner, ttl_us, wake lock prefix. A take of an existing row also takes
        // the holder's wake lock (prefix + new version) on its connection, without waiting.
        take: take_sql(
            t,
            "IF(GET_LOCK(CONCAT(?, version), 0) IS NULL, NULL, NULL)",
            handover,
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
pub(super) fn statements(
    table: &str,
    handover: bool,
    data: DataColumn,
) -> (Sql, Arc<str>, WakeLockSql, HolderSql) {
    let t = quote(table, '`');
    let clear_data = data.clear();
    let peek_columns = peek_columns();
    let peek = format!("SELECT {peek_columns} FROM {t} WHERE name = ?");
    let take = |cleared: &str| take_sql(&t, cleared, handover, data);
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
            // NULL (cleared here, or free before) has no data to keep; so is the
            // reservation's ttl after the reservation (see `take_sql`).
            abandon: format!(
                "UPDATE {t} SET expires_at = IF(owner <=> ?, {NOW}, expires_at), \
                 owner = IF(owner <=> ?, NULL, owner), {}\
                 next_expires = IF(next_owner <=> ?, NULL, next_expires), \
                 next_since = IF(next_owner <=> ?, NULL, next_since), \
                 next_owner = IF(next_owner <=> ?, NULL, next_owner){} \
                 WHERE name = ? AND (owner = ? OR next_owner = ?)",
                if data.0 { "data = IF(owner IS NULL, NULL, data), " } else { "" },
                if handover { ", next_ttl = IF(next_owner IS NULL, NULL, next_ttl)" } else { "" }
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
pub(super) fn renew_many_sql(table: &str) -> (BySize, BySize) {
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
pub(super) fn bind_list<'q>(
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
pub(super) fn holder_statements(table: &str, peek: &str, data: DataColumn) -> HolderSql {
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
        // No schema search path: the table a `CREATE` makes is the one found.
        set_up: None,
        add_data: format!("ALTER TABLE {h} ADD COLUMN data {DATA_TYPE} NULL").into(),
        notify: None,
        setup,
    }
}
