//! The shared and permit kinds' transactions as stored procedures: a join, a renewal and a
//! release of a shared hold or a permit in one round trip each (see PostgreSQL's functions,
//! `postgres/routines.rs`, for why: the name's lock row stays locked for a fraction of one
//! round trip instead of five to eight).
//!
//! Each procedure runs the statements of [`HolderSql`] (their `?` arguments replaced by the
//! procedure's parameters) in one transaction (a reader's release that may be the last: in
//! two, see [`Parts::release`]), in the order [`kinds::Tx`](crate::kinds::Tx) runs them,
//! rolls back what it refuses, and answers with one row. They are created (`IF NOT
//! EXISTS`) with the lock table, used when present with `create_table=false`, and named by
//! version: a change of what one does takes a new name. The join is `_v5` and the release
//! `_v7`: they keep the queue of permit waiters (see [`Parts::join`] and [`Parts::release`]),
//! the join takes the new holder's wake lock when asked to (and a reader joining live readers
//! locks the name's row only to step its version), the release of the last holder
//! hands the lock to the reserved writer, a reader's release leaves without locking the
//! name's row while another reader holds, and a permit's release hands the permit to the
//! first queued waiter in place; the renewals are still `_v1`.
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
use crate::kinds::{HolderSql, InRoutine, holders_table, queue_table};

use super::statements::{NOW, NOW_US};

/// The version of the join procedure: `v2` queues permit waiters (see [`Parts::join`]), `v3`
/// also takes the new holder's wake lock, `v4` lets a reader join live readers with the name's
/// row locked for the step of its version only, `v5` counts the holders only when the waiters
/// queued ahead leave a permit (see [`Parts::join`]).
const JOIN: u8 = 5;

/// The version of the release procedure: `v2` hands freed permits to the queue (see
/// [`Parts::release`]), `v3` also hands the lock to the reserved writer when the last holder
/// leaves, `v4` lets a reader leave without locking the name's row while another holds, `v5`
/// hands a permit over with two statements fewer, `v7` hands it over in place (see
/// [`Parts::release`]; `v6` named a dropped experiment, README "What released names leave
/// behind").
const RELEASE: u8 = 7;

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

/// The shared marker ([`marker`](crate::kinds::marker)) as a MySQL expression.
const SHARED: &str = "CONCAT(CHAR(1), 'shared')";

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
    let routine = |what: &str, v: u8| format!("{last}_dl_{what}_v{v}");
    let name = |what: &str, v: u8| quote(&format!("{table}_dl_{what}_v{v}"), '`');
    let (join, renew, release) = (
        name("join", JOIN),
        name("renew", 1),
        name("release", RELEASE),
    );
    let renew_many = name("renew_many", 1);
    let schema = schema.map_or_else(|| "DATABASE()".to_owned(), |s| format!("'{s}'"));
    // Plain identifiers: safe in literals. The queue table counts as one of the `create`
    // statements.
    let present = format!(
        "SELECT (SELECT COUNT(*) FROM information_schema.routines \
         WHERE routine_schema = {schema} AND routine_name IN ('{}', '{}', '{}', '{}')) \
         + (SELECT COUNT(*) FROM information_schema.tables \
         WHERE table_schema = {schema} AND table_name = '{}')",
        routine("join", JOIN),
        routine("renew", 1),
        routine("release", RELEASE),
        routine("renew_many", 1),
        queue_table(last),
    );
    let parts = Parts {
        t: quote(table, '`'),
        h: quote(&holders_table(table), '`'),
        w: quote(&queue_table(table), '`'),
        in_routine: sql.in_routine(with_args),
        peek_columns,
    };
    Some(Routines {
        calls: Calls {
            join: join_call(table, false).into(),
            renew: format!("CALL {renew}(?, ?, ?, ?, ?)").into(),
            release: release_call(table, false).into(),
            release_in_steps: None,
            renew_many: Some(format!("CALL {renew_many}(?)").into()),
            queue: true,
            reads_queue: false,
        },
        present: present.into(),
        create: vec![
            parts.queue(),
            parts.join(&join),
            parts.renew(&renew),
            parts.release(&release),
            parts.renew_many(&renew_many),
        ],
    })
}

/// The call of the join procedure of lock table `table`: with `lock`, a seventh argument
/// is the prefix of the wake locks of the name (see `wake_prefix`), and a join that takes
/// also takes the new holder's wake lock on its connection, which then stays with the lease
/// (the row's ninth column: 1 if it was taken); else none is.
pub(super) fn join_call(table: &str, lock: bool) -> String {
    let join = quote(&format!("{table}_dl_join_v{JOIN}"), '`');
    let lock = if lock { "?" } else { "NULL" };
    format!("CALL {join}(?, ?, ?, ?, ?, ?, {lock})")
}

/// The call of the release procedure of lock table `table`: with `lock`, a sixth argument
/// names the wake lock to give up after the commit (on the connection that holds it), else
/// none is.
pub(super) fn release_call(table: &str, lock: bool) -> String {
    let release = quote(&format!("{table}_dl_release_v{RELEASE}"), '`');
    let lock = if lock { "?" } else { "NULL" };
    format!("CALL {release}(?, ?, ?, ?, ?, {lock})")
}

/// What the procedures' bodies are made of.
struct Parts<'a> {
    /// The holders' statements, in the routine.
    in_routine: InRoutine,
    t: String,
    h: String,
    /// The queue of permit waiters.
    w: String,
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

    /// The queue of permit waiters ([`queue_table`]), created when missing.
    fn queue(&self) -> String {
        format!(
            "CREATE TABLE IF NOT EXISTS {} (name VARBINARY(512) NOT NULL, \
             owner VARBINARY(255) NOT NULL, seq BIGINT NOT NULL, expires_at DATETIME(6) NOT NULL, \
             ttl BIGINT NOT NULL, permits BIGINT NOT NULL, PRIMARY KEY (name, owner)) ENGINE=InnoDB",
            self.w
        )
    }

    /// Queues waiter `p_owner` (ttl `p_ttl`, `p_permits`) for `p_queue` µs, at the back, or
    /// keeps its place if it still has a live one. An abandoned attempt's place (a negative
    /// ttl, see [`Parts::release`]) stays gone: a poll of it still on its way when it gave up
    /// does not queue it again. Assignments run left to right and see the earlier ones: `ttl`
    /// last.
    fn enqueue(&self) -> String {
        format!(
            "INSERT INTO {} (name, owner, seq, expires_at, ttl, permits)
      VALUES (p_name, p_owner, {NOW_US}, {NOW} + INTERVAL p_queue MICROSECOND, p_ttl, p_permits)
      ON DUPLICATE KEY UPDATE
        seq = IF(ttl < 0 OR expires_at > {NOW}, seq, VALUES(seq)),
        expires_at = IF(ttl < 0, expires_at, VALUES(expires_at)),
        permits = IF(ttl < 0, permits, VALUES(permits)),
        ttl = IF(ttl < 0, ttl, VALUES(ttl))",
            self.w
        )
    }

    /// [`Tx::join`](crate::kinds::Tx::join), and the queue of permit waiters (PostgreSQL's
    /// `v4` rule, see `postgres/routines.rs`): a permit join takes only while the holders and
    /// the live waiters queued ahead of it (all of them, if it is not queued) leave a permit,
    /// first come, first served; refused with `p_queue` (µs) above 0, it queues its waiter, or
    /// keeps its place, live for that long from now; a take leaves the queue. A permit that a
    /// release handed this waiter (see [`Parts::release`]) and that it did not learn of yet
    /// is renewed from now and taken again, with the token it was handed (an owner is unique
    /// per acquisition: the core's reentrancy never asks twice for one). With `p_lock` (the
    /// prefix of the name's wake locks), a take also takes the holder's wake lock, before its
    /// commit: whoever reads the new token finds its wake lock held, and waits on it.
    ///
    /// Since `v4` a reader whose name is held by live readers, with no live reservation on it,
    /// joins by one `UPDATE` of the name's row that steps its version (its token, read back
    /// by `LAST_INSERT_ID`) where the row still says so, then deletes a holder row of its own
    /// left from before (none, mostly) and inserts its new one: the name's row stays locked
    /// for those statements and the commit, not from the join's first read, and no other
    /// holder's row is read or locked (the lapsed ones are left to the other joins' purges
    /// and the sweeper). Before, every reader's join locked the name's row and then purged
    /// under it, scanning the name's holder rows, so it waited for each leaving reader's
    /// release holding its own row: 16 readers of one name, `--scenario clients --growth-kinds
    /// rw --write-share 0 --client-counts 16`, four pairs interleaved, 1,870-2,087 ->
    /// 2,821-3,124 acquisitions/s (acquire p50 4.7-5.4 -> 1.8-2.0 ms). Any other join (a
    /// refusal, a reservation, the first reader, a permit) goes the way it went.
    ///
    /// Since `v5` a permit join counts the live holders only when the live waiters queued
    /// ahead of it leave a permit: as many waiting ahead as there are permits refuse it
    /// whatever the holders are (the answer then has no first holder's end, which only a
    /// try's retry reads, and the name's row's expiry stands in for it): a statement less
    /// under the name's row lock in most queued waiters' joins.
    fn join(&self, name: &str) -> String {
        let Self {
            t,
            h,
            w,
            in_routine,
            ..
        } = self;
        let InRoutine {
            ensure,
            purge,
            purge_all,
            mark,
            insert,
            stretch,
            ..
        } = in_routine;
        let lock = self.lock();
        let enqueue = self.enqueue();
        let answer = "SELECT o_owner, o_version, o_remaining, o_next_owner, o_next_since, \
                      o_next_remaining, o_taken, o_first_end, o_armed";
        let arm = "IF p_lock IS NOT NULL THEN \
                   SET o_armed = GET_LOCK(CONCAT(p_lock, o_taken), 0); END IF";
        format!(
            "CREATE PROCEDURE IF NOT EXISTS {name}({PARAMS}, IN p_ttl BIGINT, IN p_permits BIGINT,
  IN p_queue BIGINT, IN p_lock VARBINARY(64))
body: BEGIN
  {DECLARE_PEEK}
  DECLARE o_taken BIGINT; DECLARE o_first_end BIGINT; DECLARE held INT; DECLARE o_armed INT;
  DECLARE w_seq BIGINT; DECLARE ahead BIGINT DEFAULT 0;
  {HANDLERS}
  -- A reader joining live readers, with no live reservation on the name: the name's row
  -- is locked by the step of its version, not before the join's first read (v4).
  IF p_permits = 0 AND p_marker = {SHARED} THEN
    UPDATE {t} SET version = LAST_INSERT_ID(version + 1),
        expires_at = GREATEST(expires_at, {NOW} + INTERVAL p_ttl MICROSECOND)
      WHERE name = p_name AND owner = p_marker AND expires_at > {NOW}
        AND (next_owner IS NULL OR next_expires IS NULL OR next_expires <= {NOW});
    IF ROW_COUNT() = 1 THEN
      SET o_taken = LAST_INSERT_ID();
      DELETE FROM {h} WHERE name = p_name AND owner = p_owner;
      {insert};
      {arm};
      COMMIT;
      SET o_owner = p_marker, o_version = o_taken - 1;
      {answer}; LEAVE body;
    END IF;
  END IF;
  {lock};
  IF v_found = 0 THEN
    SET v_found = 1;
    {ensure};
    {lock};
  END IF;
  SET held = o_remaining IS NOT NULL;
  -- A permit of this waiter's already (a release handed it over, and the waiter has not read
  -- it yet): renewed from now, it is the permit taken.
  IF held AND p_permits > 0 AND o_owner <=> p_marker THEN
    SELECT token INTO o_taken FROM {h}
      WHERE name = p_name AND owner = p_owner AND expires_at > {NOW} FOR UPDATE;
    IF o_taken IS NOT NULL THEN
      UPDATE {h} SET expires_at = {NOW} + INTERVAL p_ttl MICROSECOND
        WHERE name = p_name AND owner = p_owner AND expires_at > {NOW};
      {stretch};
      IF o_next_owner <=> p_owner THEN
        UPDATE {t} SET next_owner = NULL, next_since = NULL, next_expires = NULL
          WHERE name = p_name;
      END IF;
      DELETE FROM {w} WHERE name = p_name AND owner = p_owner;
      {arm};
      COMMIT;
      {answer}; LEAVE body;
    END IF;
  END IF;
  -- Held as another kind (a mismatch or an exclusive holder).
  IF held AND NOT (o_owner <=> p_marker) THEN
    ROLLBACK; {answer}; LEAVE body;
  END IF;
  SET n = 0;
  IF p_permits > 0 THEN
    SELECT seq INTO w_seq FROM {w} WHERE name = p_name AND owner = p_owner AND expires_at > {NOW};
    SELECT COUNT(*) INTO ahead FROM {w} WHERE name = p_name AND owner <> p_owner
      AND expires_at > {NOW} AND permits = p_permits
      AND (w_seq IS NULL OR seq < w_seq OR (seq = w_seq AND owner < p_owner));
    -- The holders are counted only when the waiters ahead leave a permit (v5).
    IF held AND ahead < p_permits THEN
      SELECT COUNT(*), MIN(TIMESTAMPDIFF(MICROSECOND, {NOW}, expires_at)) INTO n, o_first_end
        FROM {h} WHERE name = p_name AND expires_at > {NOW} AND owner <> p_owner;
    END IF;
  END IF;
  -- Another waiter's turn (a reservation, the waiters queued ahead), or no permit left.
  IF (o_next_remaining IS NOT NULL AND NOT (o_next_owner <=> p_owner))
     OR (p_permits > 0 AND n + ahead >= p_permits) THEN
    IF p_permits > 0 AND p_queue > 0 THEN
      {enqueue};
      COMMIT;
    ELSE
      ROLLBACK;
    END IF;
    {answer}; LEAVE body;
  END IF;
  SET o_first_end = NULL;
  IF held THEN {purge}; ELSE {purge_all}; END IF;
  {mark};
  SET o_taken = o_version + 1;
  {insert};
  IF p_permits > 0 THEN
    DELETE FROM {w} WHERE name = p_name AND owner = p_owner;
  END IF;
  {arm};
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

    /// [`Tx::release`](crate::kinds::Tx::release), and the hand-over of each permit it
    /// leaves free (`p_wake`: a permit's release) to the first live waiter of the name's
    /// queue, in the order they queued (see [`Parts::join`]): a holder row of that waiter's
    /// with the next version and the ttl it queued with (from the hand-over's statement), its
    /// place in the queue gone. A queued waiter reads whether it holds (see `queued_look`
    /// in `mysql/mod.rs`), when woken by the holder's wake lock `p_lock` (given up after the
    /// commit, whatever the release found; `NULL`: none) or briskly. An abandoned permit
    /// attempt's place (no token) is gone and kept gone (a negative ttl), against a poll of it
    /// still on its way, which would queue it again for a permit nobody releases.
    ///
    /// Since `v5` a hand-over leaves the places that lapsed to the sweeper (`sweep.rs`; every
    /// read of the queue skips them, and they were only a crashed waiter's: an abandoned
    /// one's stays barred either way) and the row's expiry as the hand-over's mark sets it
    /// (covering the new holder, which the shrink would only bring back to it unless the
    /// leaving holder's lease was the longest): two statements fewer under the name's row
    /// lock, in the release that a handed waiter waits for. Measured with `--scenario
    /// semaphore --clients 8` on MariaDB, eight pairs interleaved in two rounds (as the README
    /// has them): 3,034-3,474 -> 3,525-3,828 acquisitions per 5 s.
    ///
    /// Since `v7` a permit's release first reads the first live waiter of the queue without
    /// locking anything; with one there, it steps the name's row's version (its row locked
    /// from that `UPDATE`, which also checks the semaphore's live marker and stretches the
    /// row's expiry over the waiter's ttl), locks that waiter's place (`FOR UPDATE`, the
    /// first live one again: another release may have handed it meanwhile), deletes its own
    /// holder row and any lapsed one of the waiter's (a permit handed to it that it never
    /// learned of: by its key), inserts the waiter's with the stepped version as its token,
    /// deletes the place and commits: the permit handed in place, the holder count
    /// unchanged, so the holders are not counted, no other holder's row is read or locked
    /// (lapsed ones are left to the joins' purges and the sweeper), and the name's row stays
    /// locked for six statements instead of eight. Should the place or the hold be gone
    /// meanwhile, all of it is rolled back and the release goes on as any other; with no
    /// live marker or nobody queued, nothing was written. The locks are taken in the order
    /// of every other procedure: the name's row, then the queue's row. Unlike the hand-over
    /// below, it hands only the permit it frees (permits left free by lapsed holders are
    /// taken by the waiters' own joins, which their looks start). `--scenario semaphore
    /// --clients 8` on MariaDB 10.11, release builds interleaved, seven pairs (the last
    /// three in reverse order; this form without the delete of the waiter's lapsed row,
    /// added after a review): 795, 782, 729, 760, 753, 752, 762 -> 835, 784, 804, 787, 805,
    /// 805, 826 acquisitions/s (mean 762 -> 807, +6%), semaphore / its three mutexes side by
    /// side 0.60-0.64 -> 0.63-0.67. (`v6` named an experiment dropped on 2026-12-05: README,
    /// "What released names leave behind".)
    ///
    /// The release of the last holder (`v3`; PostgreSQL's rule, see `postgres/routines.rs`)
    /// hands the lock to the exclusive waiter holding the live reservation (a positive
    /// `next_ttl`: a writer), as an exclusive release does: the row becomes that writer's,
    /// with the next version (above every reader's token) and its ttl from now, the
    /// reservation gone. The writer waits on the server for the latest reader's wake lock,
    /// given up after this commit, and reads whether it was handed the lock (see
    /// `WakeLocks::handed`): a read where it took the row itself, a write that waits for its
    /// flush, before.
    ///
    /// A read hold's release (`v4`; PostgreSQL's steps, see `postgres/routines.rs`) first
    /// reads the name's row without locking it, deletes the holder's own row and looks for
    /// another live holder row that no release or purge has locked, locking it (`FOR UPDATE
    /// SKIP LOCKED`) until its commit: found, that holder's release comes after this one and
    /// sees it gone, and this release is done, the name's row untouched (its expiry may
    /// outlast the holders by what was left of this lease). Otherwise it was maybe the last:
    /// it locks the name's row unless another transaction holds it (`SKIP LOCKED`), else
    /// commits its leave and waits for the row in a second transaction, holding nothing of
    /// the first's; then it goes on as any release of a holder already gone: the holders
    /// counted, the name freed (also when the readers' marker ran out meanwhile: a release
    /// whose count saw this holder's row and whose shrink did not set its expiry to now),
    /// handed to the reserved writer, or left to the holders that joined since, and it
    /// answers 1 whatever it finds. An error once the leave committed answers 1 too (the
    /// hold is gone; the name then waits for its marker's expiry). The first step waits for
    /// nothing once it holds a lock: no deadlock. Until `v4` every reader's release locked
    /// the name's row, so readers of one name took turns on it (16 readers of one name on
    /// MariaDB made 0.3 of the acquisitions of 16 clients on 1,000 names).
    fn release(&self, name: &str) -> String {
        let Self {
            t,
            h,
            w,
            in_routine,
            ..
        } = self;
        let InRoutine {
            purge,
            leave,
            free,
            shrink,
            mark,
            insert,
            stretch,
            ..
        } = in_routine;
        let lock = self.lock();
        let permit = "LEFT(p_marker, 9) = CONCAT(CHAR(1), 'permits:')";
        // The first live waiter of the name's queue, its ttl.
        let head = format!(
            "SELECT owner, ttl INTO w_owner, p_ttl FROM {w} WHERE name = p_name \
             AND expires_at > {NOW} AND permits = p_permits AND ttl >= 0 \
             ORDER BY seq, owner LIMIT 1"
        );
        // After the commit: a waiter woken by it reads what the release did.
        let unlock = "IF p_lock IS NOT NULL THEN DO RELEASE_LOCK(p_lock); END IF";
        // An error after the first step committed the leave: the hold is gone, and the
        // caller must not be told otherwise (nor call again: the leave would find nothing).
        let rethrow = "BEGIN ROLLBACK; RESIGNAL; END;";
        debug_assert!(HANDLERS.contains(rethrow), "{HANDLERS}");
        let handlers = HANDLERS.replacen(
            rethrow,
            &format!(
                "BEGIN ROLLBACK;
    IF v_left = 1 THEN {unlock}; SELECT CAST(1 AS SIGNED); ELSE RESIGNAL; END IF;
  END;"
            ),
            1,
        );
        format!(
            "CREATE PROCEDURE IF NOT EXISTS {name}({PARAMS}, IN p_token BIGINT, IN p_wake BOOLEAN,
  IN p_lock VARBINARY(64))
body: BEGIN
  {DECLARE_PEEK}
  DECLARE o_taken BIGINT; DECLARE p_ttl BIGINT; DECLARE p_permits BIGINT;
  DECLARE w_owner VARBINARY(255); DECLARE handed INT DEFAULT 0; DECLARE v_live INT;
  DECLARE v_step INT DEFAULT 0; DECLARE v_left INT DEFAULT 0;
  DECLARE v_owner VARBINARY(255); DECLARE v_ttl BIGINT;
  {handlers}
  IF p_token IS NOT NULL AND p_marker = {SHARED} THEN
    -- A reader's release: its own row, the name's row read and not locked.
    SELECT owner, expires_at > {NOW} INTO o_owner, v_live FROM {t} WHERE name = p_name;
    IF v_found = 1 AND v_live AND o_owner <=> p_marker THEN
      {leave};
      IF ROW_COUNT() = 1 THEN
        -- Another live holder row that no release (or purge) has locked: its holder leaves
        -- after this commit (locked here until then), sees this row gone, and it or a later
        -- holder frees the name.
        SET w_owner = NULL;
        SELECT owner INTO w_owner FROM {h} WHERE name = p_name AND owner <> p_owner
          AND expires_at > {NOW} LIMIT 1 FOR UPDATE SKIP LOCKED;
        IF w_owner IS NOT NULL THEN COMMIT; {unlock}; SELECT CAST(1 AS SIGNED); LEAVE body; END IF;
        -- Maybe the last. Unless another transaction holds the name's row, it is locked now
        -- and the rest goes on in this transaction; else the leave commits and the rest runs
        -- in a transaction of its own, which waits for the row holding nothing.
        SET v_live = NULL;
        SELECT 1 INTO v_live FROM {t} WHERE name = p_name FOR UPDATE SKIP LOCKED;
        IF v_live IS NULL THEN
          COMMIT;
          SET v_left = 1;
          SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
          START TRANSACTION;
        END IF;
        SET v_step = 2;
      END IF;
    END IF;
    SET v_found = 1;
  END IF;
  IF p_wake AND p_token IS NOT NULL AND {permit} THEN
    -- A permit's release with a waiter queued (v7): the name's row locked by the step of its
    -- version (the next token), the permit handed in place to the first live waiter.
    SET p_permits = CAST(SUBSTRING(p_marker, 10) AS SIGNED), w_owner = NULL;
    {head};
    IF w_owner IS NOT NULL THEN
      UPDATE {t} SET version = LAST_INSERT_ID(version + 1),
          expires_at = GREATEST(expires_at, {NOW} + INTERVAL p_ttl MICROSECOND)
        WHERE name = p_name AND owner = p_marker AND expires_at > {NOW};
      IF ROW_COUNT() = 1 THEN
        SET o_taken = LAST_INSERT_ID(), v_owner = w_owner, v_ttl = p_ttl, w_owner = NULL;
        {head} FOR UPDATE;
        SET n = 0;
        IF w_owner IS NOT NULL THEN {leave}; SET n = ROW_COUNT(); END IF;
        IF n = 1 THEN
          -- A lapsed holder row of the waiter's own (a permit handed to it that it never
          -- learned of) goes first: by its key, no other holder's row read.
          DELETE FROM {h} WHERE name = p_name AND owner = w_owner;
          DELETE FROM {w} WHERE name = p_name AND owner = w_owner;
          SET p_owner = w_owner;
          {insert};
          -- Another waiter's ttl than the one read first: the row covers it too.
          IF NOT (w_owner <=> v_owner AND p_ttl <=> v_ttl) THEN {stretch}; END IF;
          COMMIT; {unlock}; SELECT CAST(1 AS SIGNED); LEAVE body;
        END IF;
        -- Nothing handed (the place or the hold gone meanwhile): undone whole, the name's
        -- row as it was, and the release goes on as any other.
        ROLLBACK;
        SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
        START TRANSACTION;
      END IF;
    END IF;
    SET v_found = 1;
  END IF;
  {lock};
  IF p_token IS NULL AND {permit} THEN
    INSERT INTO {w} (name, owner, seq, expires_at, ttl, permits)
      VALUES (p_name, p_owner, 0, {NOW}, -1, 0)
      ON DUPLICATE KEY UPDATE expires_at = {NOW}, ttl = -1;
  END IF;
  -- The second step's hold left with the first: what happened to the name since is no
  -- refusal. It also ends the readers' turn when their marker ran out: a release whose
  -- count saw this holder's row (deleted by the first step, not yet committed) and whose
  -- shrink, a statement later, did not, set the marker's expiry to now.
  IF NOT (v_found = 1 AND o_owner <=> p_marker AND (o_remaining IS NOT NULL OR v_step = 2))
  THEN
    COMMIT; {unlock}; SELECT CAST(v_step = 2 AS SIGNED); LEAVE body;
  END IF;
  IF v_step = 2 THEN
    SET n = 1;
  ELSEIF p_token IS NULL THEN
    {purge}; SET n = ROW_COUNT();
  ELSE
    {leave}; SET n = ROW_COUNT();
  END IF;
  IF n = 0 THEN COMMIT; {unlock}; SELECT CAST(0 AS SIGNED); LEAVE body; END IF;
  SELECT COUNT(*) INTO n FROM {h} WHERE name = p_name AND expires_at > {NOW};
  IF p_wake AND {permit} THEN
    SET p_permits = CAST(SUBSTRING(p_marker, 10) AS SIGNED);
    hand: WHILE n < p_permits DO
      SET w_owner = NULL;
      SELECT owner, ttl INTO w_owner, p_ttl FROM {w}
        WHERE name = p_name AND expires_at > {NOW} AND permits = p_permits AND ttl >= 0
        ORDER BY seq, owner LIMIT 1 FOR UPDATE;
      IF w_owner IS NULL THEN LEAVE hand; END IF;
      DELETE FROM {w} WHERE name = p_name AND owner = w_owner;
      SET p_owner = w_owner;
      {purge};
      {mark};
      SET o_version = o_version + 1;
      SET o_taken = o_version;
      {insert};
      SET n = n + 1;
      SET handed = 1;
    END WHILE;
  END IF;
  -- The last holder out hands the lock to the reserved writer (a positive `next_ttl`).
  IF n = 0 AND o_next_remaining IS NOT NULL AND NOT (o_next_owner <=> p_owner) THEN
    SELECT next_ttl INTO p_ttl FROM {t} WHERE name = p_name;
    IF p_ttl > 0 THEN
      {free};
      UPDATE {t} SET owner = next_owner, version = version + 1,
        expires_at = {NOW} + INTERVAL next_ttl MICROSECOND, next_owner = NULL,
        next_since = NULL, next_expires = NULL, next_ttl = NULL WHERE name = p_name;
      COMMIT;
      {unlock};
      SELECT CAST(1 AS SIGNED);
      LEAVE body;
    END IF;
  END IF;
  IF n = 0 THEN {free}; ELSEIF handed = 0 THEN {shrink}; END IF;
  COMMIT;
  {unlock};
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
