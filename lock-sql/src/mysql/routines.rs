//! The shared and permit kinds' transactions as stored procedures: a join, a renewal and a
//! release of a shared hold or a permit in one round trip each (see PostgreSQL's functions,
//! `postgres/routines.rs`, for why: the name's lock row stays locked for a fraction of one
//! round trip instead of five to eight).
//!
//! Each procedure runs the statements of [`HolderSql`] (their `?` arguments replaced by the
//! procedure's parameters) in one transaction, in the order [`kinds::Tx`](crate::kinds::Tx)
//! runs them, rolls back what it refuses, and answers with one row. They are created (`IF NOT
//! EXISTS`) with the lock table, used when present with `create_table=false`, and named
//! `_v1`: a change of what one does takes a new name.
//!
//! A fourth procedure renews a batch of holds (`_dl_renew_many_v1`, the renewals' arguments
//! as one JSON array sorted by name, read by `JSON_TABLE`): the watchdog's renewals of every
//! shared hold and permit of a client in one round trip and one commit per
//! [`LIST_MAX_BATCH`](crate::renew::LIST_MAX_BATCH), each hold checked as the single renewal
//! checks it and extended as it extends it, by statements over the whole batch, the rows
//! locked in name order. A client holding 10,000 read holds otherwise sends 10,000 calls (and
//! MariaDB flushes its log 10,000 times) per renewal tick. `JSON_TABLE` needs MariaDB 10.6 or
//! MySQL 8.0: on an older server the procedures are not created and the transactions are
//! used, as with any failure to create them.

use crate::dialect::{Calls, Routines};
use crate::keys::quote;
use crate::kinds::{HolderSql, InRoutine, holders_table};

use super::statements::NOW;

/// Replaces the arguments `?` of `sql` with `names`, in order (the statements hold no `?` in
/// a literal).
fn with_args(sql: &str, names: &[&str]) -> String {
    let mut parts = sql.split('?');
    let mut out = parts.next().unwrap_or_default().to_owned();
    for (i, part) in parts.enumerate() {
        out.push_str(names.get(i).copied().unwrap_or("NULL"));
        out.push_str(part);
    }
    out
}

/// The variables a peek of the lock row is read into, whether it was found, a count.
const DECLARE_PEEK: &str = "DECLARE o_owner VARBINARY(255); DECLARE o_version BIGINT;
  DECLARE o_remaining BIGINT; DECLARE o_next_owner VARBINARY(255);
  DECLARE o_next_since BIGINT; DECLARE o_next_remaining BIGINT;
  DECLARE v_found INT DEFAULT 1; DECLARE n BIGINT;";

/// The handlers (after every variable): a missing row clears `v_found`; an error rolls back
/// and reaches the caller.
const HANDLERS: &str = "DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_found = 0;
  DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
  SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
  START TRANSACTION;";

/// The parameters every procedure starts with.
const PARAMS: &str =
    "IN p_name VARBINARY(512), IN p_owner VARBINARY(255), IN p_marker VARBINARY(255)";

/// The procedures of lock table `table` (unquoted, maybe `schema.table`) with holders'
/// statements `sql` and `peek_columns` the columns of a lock row's peek; `None` when their
/// names would not fit MySQL's 64 characters.
pub(crate) fn routines(table: &str, sql: &HolderSql, peek_columns: &str) -> Option<Routines> {
    let (schema, last) = match table.split_once('.') {
        Some((schema, last)) => (Some(schema), last),
        None => (None, table),
    };
    if last.len() + "_dl_renew_many_v1".len() > 64 {
        return None;
    }
    let routine = |what: &str| format!("{last}_dl_{what}_v1");
    let name = |what: &str| quote(&format!("{table}_dl_{what}_v1"), '`');
    let (join, renew, release) = (name("join"), name("renew"), name("release"));
    let renew_many = name("renew_many");
    // Plain identifiers: safe in literals.
    let present = format!(
        "SELECT COUNT(*) FROM information_schema.routines \
         WHERE routine_schema = {} AND routine_name IN ('{}', '{}', '{}', '{}')",
        schema.map_or_else(|| "DATABASE()".to_owned(), |s| format!("'{s}'")),
        routine("join"),
        routine("renew"),
        routine("release"),
        routine("renew_many"),
    );
    let parts = Parts {
        t: quote(table, '`'),
        h: quote(&holders_table(table), '`'),
        in_routine: sql.in_routine(with_args),
        peek_columns,
    };
    Some(Routines {
        calls: Calls {
            join: format!("CALL {join}(?, ?, ?, ?, ?)").into(),
            renew: format!("CALL {renew}(?, ?, ?, ?, ?)").into(),
            release: format!("CALL {release}(?, ?, ?, ?, ?)").into(),
            renew_many: Some(format!("CALL {renew_many}(?)").into()),
            queue: false,
        },
        present: present.into(),
        create: vec![
            parts.join(&join),
            parts.renew(&renew),
            parts.release(&release),
            parts.renew_many(&renew_many),
        ],
    })
}

/// What the procedures' bodies are made of.
struct Parts<'a> {
    /// The holders' statements, in the routine.
    in_routine: InRoutine,
    t: String,
    h: String,
    peek_columns: &'a str,
}

impl Parts<'_> {
    /// Reads the lock row into the peek variables, locked.
    fn lock(&self) -> String {
        let Self {
            t, peek_columns, ..
        } = self;
        format!(
            "SELECT {peek_columns} INTO o_owner, o_version, o_remaining, o_next_owner, \
             o_next_since, o_next_remaining FROM {t} WHERE name = p_name FOR UPDATE"
        )
    }

    /// Whether the row carries the live marker of the caller's kind.
    const CARRIES: &'static str =
        "v_found = 1 AND o_remaining IS NOT NULL AND o_owner <=> p_marker";

    /// [`Tx::join`](crate::kinds::Tx::join).
    fn join(&self, name: &str) -> String {
        let Self { h, in_routine, .. } = self;
        let InRoutine {
            ensure,
            purge,
            purge_all,
            mark,
            insert,
            ..
        } = in_routine;
        let lock = self.lock();
        let answer = "SELECT o_owner, o_version, o_remaining, o_next_owner, o_next_since, \
                      o_next_remaining, o_taken, o_first_end";
        format!(
            "CREATE PROCEDURE IF NOT EXISTS {name}({PARAMS}, IN p_ttl BIGINT, IN p_permits BIGINT)
body: BEGIN
  {DECLARE_PEEK}
  DECLARE o_taken BIGINT; DECLARE o_first_end BIGINT; DECLARE held INT;
  {HANDLERS}
  {lock};
  IF v_found = 0 THEN
    SET v_found = 1;
    {ensure};
    {lock};
  END IF;
  SET held = o_remaining IS NOT NULL;
  -- Held as another kind (a mismatch or an exclusive holder), or another waiter's turn.
  IF (held AND NOT (o_owner <=> p_marker))
     OR (o_next_remaining IS NOT NULL AND NOT (o_next_owner <=> p_owner)) THEN
    ROLLBACK; {answer}; LEAVE body;
  END IF;
  IF held AND p_permits > 0 THEN
    SELECT COUNT(*), MIN(TIMESTAMPDIFF(MICROSECOND, {NOW}, expires_at)) INTO n, o_first_end
      FROM {h} WHERE name = p_name AND expires_at > {NOW} AND owner <> p_owner;
    IF n >= p_permits THEN ROLLBACK; {answer}; LEAVE body; END IF;
    SET o_first_end = NULL;
  END IF;
  IF held THEN {purge}; ELSE {purge_all}; END IF;
  {mark};
  SET o_taken = o_version + 1;
  {insert};
  COMMIT;
  {answer};
END"
        )
    }

    /// [`Tx::renew`](crate::kinds::Tx::renew).
    fn renew(&self, name: &str) -> String {
        let InRoutine {
            extend, stretch, ..
        } = &self.in_routine;
        let lock = self.lock();
        let carries = Self::CARRIES;
        format!(
            "CREATE PROCEDURE IF NOT EXISTS {name}({PARAMS}, IN p_token BIGINT, IN p_ttl BIGINT)
body: BEGIN
  {DECLARE_PEEK}
  {HANDLERS}
  {lock};
  IF NOT ({carries}) THEN ROLLBACK; SELECT CAST(0 AS SIGNED); LEAVE body; END IF;
  {extend};
  SET n = ROW_COUNT();
  IF n <> 1 THEN ROLLBACK; SELECT CAST(0 AS SIGNED); LEAVE body; END IF;
  {stretch};
  COMMIT;
  SELECT CAST(1 AS SIGNED);
END"
        )
    }

    /// [`Tx::renew`](crate::kinds::Tx::renew) of each hold of a batch (a JSON array of
    /// `[name, owner, marker, token, ttl_us]`, sorted by name) in one transaction, as four
    /// statements over the whole batch rather than a loop (a loop of the single renewal's
    /// statements took 120-600 ms per 512 holds, and 10,000 holds' batches kept a pool of 10
    /// busy): the lock rows locked (in name order: the list is sorted), which holds are live
    /// and carried by a live row of their kind (the single renewal's checks), the lock rows
    /// stretched over them (to the longest of their ttls) and the holds extended. The row: a
    /// string of one character per hold, in order, `1` if it was renewed, else `0`.
    fn renew_many(&self, name: &str) -> String {
        let Self { t, h, .. } = self;
        let batch = "JSON_TABLE(p_batch, '$[*]' COLUMNS (i FOR ORDINALITY, \
                     name VARCHAR(512) PATH '$[0]', owner VARCHAR(255) PATH '$[1]', \
                     marker VARCHAR(255) PATH '$[2]', token BIGINT PATH '$[3]', \
                     ttl BIGINT PATH '$[4]')) AS j";
        // A hold of the batch that is live, on a live lock row that carries its kind, at
        // `v_now`: the time once the rows are locked (a join that ran before saw an earlier
        // time, and one after waits for the commit).
        let carried = "t.name = j.name AND t.owner <=> j.marker AND t.expires_at > v_now \
                       AND h.owner = j.owner AND h.token = j.token AND h.expires_at > v_now";
        format!(
            "CREATE PROCEDURE IF NOT EXISTS {name}(IN p_batch LONGTEXT CHARACTER SET utf8mb4)
BEGIN
  DECLARE n BIGINT; DECLARE v_out LONGTEXT; DECLARE v_now DATETIME(6);
  DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
  SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
  START TRANSACTION;
  SELECT COUNT(*) INTO n FROM {batch} JOIN {t} AS t ON t.name = j.name FOR UPDATE;
  SET v_now = {NOW};
  SELECT GROUP_CONCAT(IF(h.name IS NULL, '0', '1') ORDER BY j.i SEPARATOR '') INTO v_out
    FROM {batch} LEFT JOIN ({t} AS t JOIN {h} AS h ON h.name = t.name) ON {carried};
  UPDATE {t} AS u JOIN (SELECT j.name, MAX(j.ttl) AS ttl
      FROM {batch} JOIN {t} AS t JOIN {h} AS h ON h.name = t.name AND {carried}
      GROUP BY j.name) AS s ON u.name = s.name
    SET u.expires_at = GREATEST(u.expires_at, v_now + INTERVAL s.ttl MICROSECOND);
  UPDATE {h} AS h JOIN {batch} JOIN {t} AS t ON h.name = t.name AND {carried}
    SET h.expires_at = v_now + INTERVAL j.ttl MICROSECOND;
  COMMIT;
  SELECT COALESCE(v_out, '');
END"
        )
    }

    /// [`Tx::release`](crate::kinds::Tx::release) (no wake-up, `p_wake` unused: MySQL's
    /// waiters of shared holds and permits poll).
    fn release(&self, name: &str) -> String {
        let Self { h, in_routine, .. } = self;
        let InRoutine {
            purge,
            leave,
            free,
            shrink,
            ..
        } = in_routine;
        let lock = self.lock();
        let carries = Self::CARRIES;
        format!(
            "CREATE PROCEDURE IF NOT EXISTS {name}({PARAMS}, IN p_token BIGINT, IN p_wake BOOLEAN)
body: BEGIN
  {DECLARE_PEEK}
  {HANDLERS}
  {lock};
  IF NOT ({carries}) THEN ROLLBACK; SELECT CAST(0 AS SIGNED); LEAVE body; END IF;
  IF p_token IS NULL THEN {purge}; SET n = ROW_COUNT(); ELSE {leave}; SET n = ROW_COUNT(); END IF;
  IF n = 0 THEN ROLLBACK; SELECT CAST(0 AS SIGNED); LEAVE body; END IF;
  SELECT COUNT(*) INTO n FROM {h} WHERE name = p_name AND expires_at > {NOW};
  IF n = 0 THEN {free}; ELSE {shrink}; END IF;
  COMMIT;
  SELECT CAST(1 AS SIGNED);
END"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_are_replaced_in_order() {
        assert_eq!(with_args("a = ? AND b = ?", &["x", "y"]), "a = x AND b = y");
        assert_eq!(with_args("no arguments", &[]), "no arguments");
    }
}
