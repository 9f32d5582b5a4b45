//! The shared and permit kinds' transactions as PL/pgSQL functions: a join, a renewal and a
//! release of a shared hold or a permit in one round trip each (two for a reader that may be
//! the last to leave: see [`Parts::release`]).
//!
//! The transactions of [`kinds`](crate::kinds) take five to eight round trips each (`BEGIN`,
//! the row lock, the holders' statements, `COMMIT`), and the name's lock row stays locked for
//! all of them but the first: every other join, renewal and release of the name waits that
//! long. Run inside the server, the same statements hold the row for a fraction of one round
//! trip. The functions run the very statements of [`HolderSql`] (their `$n` arguments
//! replaced by the functions' parameters), in the order [`kinds::Tx`](crate::kinds::Tx)
//! runs them, and answer what its methods answer; a refused join writes nothing (as the
//! transaction it replaces rolled back) but a permit waiter's or a waiting reader's place in
//! the queue, which only the functions keep (see [`queue_table`](crate::kinds::queue_table)).
//! Each statement of a function sees what committed
//! before it (read committed), after the row lock, as in the transaction (but the first step
//! of a reader's release, which does not lock the row: see [`Parts::release`], and a
//! reader's join beside live readers, which locks it for share: see [`Parts::join`]).
//!
//! They are created (when missing) with the lock table, so only where the table may be
//! created ([`SqlConfig::create_table`](crate::SqlConfig::create_table)); with it off, they
//! are used when present, else the transactions are. A client of an earlier version runs the
//! transactions: both lock the row first, so they serialize with each other (a reader's first
//! release step, which does not, deletes only its own holder row; a reader beside readers
//! shares the row's lock with its likes only, and keeps to a range that an earlier client's
//! join moves the row past; so does a permit's release that hands it over from the range).
//! The names end in [`VERSION`]: a change of what a function does takes a new name, so that
//! clients of two versions never run each other's.
//!
//! A fourth function renews a batch of holds (`_dl_renew_many_v11`, arrays of the renewal's
//! arguments sorted by name): the watchdog's renewals of every shared hold and permit of a
//! client in one round trip per [`PG_MAX_BATCH`](crate::renew::PG_MAX_BATCH), each checked
//! and extended by the very statements of the single renewal, the rows locked in name order
//! (as the exclusive kind's batch). A client holding 10,000 read holds otherwise sends 10,000
//! calls per renewal tick.
//!
//! A fifth (`_dl_hand_read_v11`, see [`Parts::hand_read`]) is called by a writer's release
//! statement, not by a client: it hands a read hold to the reserved reader and the queued ones.

use sqlx::{AssertSqlSafe, Executor};

use crate::dialect::{Calls, Routines};
use crate::keys::quote;
use crate::kinds::{HolderSql, InRoutine};
use crate::pool::InUse;

/// The functions' version, the end of their names: `v11` hands a released permit to the first
/// waiter in the queue without locking the name's row for update, its token from the row's
/// range (see [`Parts::release`]), `v10` refuses a permit waiter's first join
/// into a full semaphore, and queues it, without locking the name's row (see [`Parts::join`]),
/// `v9` queues a waiting reader that a writer
/// refuses (as permit waiters queue, see [`Parts::join`]), has a writer's release hand a read
/// hold to every live reader in that queue beside the reserved one ([`Parts::hand_read`]) and
/// a reader's release that locked the name's row wait for a leave in progress (see
/// [`Parts::release`]), `v8` adds the hand-over of a read hold to the reserved reader in a
/// writer's release ([`Parts::hand_read`]), and clears a reservation whose waiter holds already
/// (a join or a release of the name's other holders, see [`Parts::join`]), `v7` has a reader's
/// second release step end the readers' turn also when their marker ran out, and the last
/// reader's first step run the second itself when the name's row is free (see
/// [`Parts::release`]), `v6` lets a reader join live readers without locking the name's row for
/// update (see [`Parts::join`]), `v5` lets a reader that does not leave last release without
/// locking the name's row (see [`Parts::release`]), `v4` queues permit waiters (see
/// [`Parts::release`] and [`queue_table`](crate::kinds::queue_table)), `v3` releases also hand
/// the lock to the reserved writer when the last reader leaves, `v2` hand a permit over to the
/// reserved permit waiter; `v1` (earlier clients) wake the reserved waiter to join instead.
const VERSION: &str = "v11";

/// Replaces the arguments `$1`, `$2`, ... of `sql` with `names`, in order.
fn with_args(sql: &str, names: &[&str]) -> String {
    let mut out = sql.to_owned();
    // From the last: `$1` is a prefix of `$10`.
    for (i, name) in names.iter().enumerate().rev() {
        out = out.replace(&format!("${}", i + 1), name);
    }
    out
}

/// The functions of lock table `table` (unquoted) with holders' statements `sql`,
/// `peek_columns` the columns of a lock row's peek, `remaining` the remaining lease of a
/// holders table row in microseconds and `channel` the `pg_notify` channel; `None` when
/// their names would not fit PostgreSQL's 63 bytes.
pub(crate) fn routines(
    table: &str,
    sql: &HolderSql,
    peek_columns: &str,
    remaining: &str,
    channel: &str,
) -> Option<Made> {
    let last = table.rsplit('.').next().unwrap_or(table);
    if last.len() + format!("_dl_renew_many_{VERSION}").len() > 63 {
        return None;
    }
    let name = |what: &str| quote(&format!("{table}_dl_{what}_{VERSION}"), '"');
    let (join, renew, release) = (name("join"), name("renew"), name("release"));
    let renew_many = name("renew_many");
    let hand_read = name("hand_read");
    let join_call = |reads: i32| format!("SELECT * FROM {join}($1, $2, $3, $4, $5, $6, {reads})");
    let release_call = |step: &str, reads: i32| {
        format!("SELECT {release}($1, $2, $3, $4, $5, {step}, {reads})::int::bigint")
    };
    let signatures = [
        format!("{join}(text, text, text, bigint, bigint, bigint, integer)"),
        format!("{renew}(text, text, text, bigint, bigint)"),
        format!("{release}(text, text, text, bigint, boolean, integer, integer)"),
        format!("{renew_many}(text[], text[], text[], bigint[], bigint[])"),
        format!("{hand_read}(text, text, bigint)"),
    ];
    // Plain identifiers: safe in literals.
    let queue = quote(&crate::kinds::queue_table(table), '"');
    // Not versioned: every version from `v6` on draws readers' tokens from it.
    let reads = quote(&format!("{table}_dl_reads"), '"');
    // Looked up where `create` makes them, not anywhere on the path. Another role's functions
    // in a schema later on the path (`public`) would run on this role's lock table (resolved
    // at each call) but with that role's queue table, which this one may not write.
    let here = super::creation_schema(table);
    // The queue table and the sequence count as two of the `create` statements.
    let present = signatures
        .iter()
        .map(|s| format!("(to_regprocedure({here}'{s}') IS NOT NULL)::int"))
        .chain([&queue, &reads].map(|r| format!("(to_regclass({here}'{r}') IS NOT NULL)::int")))
        .collect::<Vec<_>>()
        .join(" + ");
    let parts = Parts {
        t: quote(table, '"'),
        h: quote(&crate::kinds::holders_table(table), '"'),
        w: queue,
        reads,
        in_routine: sql.in_routine(with_args),
        peek_columns,
        remaining,
        channel,
    };
    let routines = Routines {
        calls: Calls {
            join: join_call(READS).into(),
            renew: format!("SELECT {renew}($1, $2, $3, $4, $5)::int::bigint").into(),
            release: release_call("0", READS).into(),
            release_in_steps: Some(release_call("$6::integer", READS).into()),
            renew_many: Some(format!("SELECT * FROM {renew_many}($1, $2, $3, $4, $5)").into()),
            queue: true,
            reads_queue: false,
        },
        present: format!("SELECT {present}").into(),
        create: vec![
            parts.queue(),
            parts.sequence(),
            parts.join(&signatures[0]),
            parts.renew(&signatures[1]),
            parts.release(&signatures[2]),
            parts.renew_many(&signatures[3]),
            parts.hand_read(&signatures[4]),
        ],
    };
    // Since `v9` the hand-over reads, locks and deletes readers' places in the queue, and a
    // reader that queues (only where it may hand over) writes its own.
    let may_hand = format!(
        "SELECT has_function_privilege({here}'{}', 'EXECUTE'){}",
        signatures[4],
        ["SELECT", "INSERT", "UPDATE", "DELETE"]
            .map(|p| format!(" AND has_table_privilege({here}'{}', '{p}')", parts.w))
            .concat()
    );
    Some(Made {
        routines,
        may_hand,
        // Drawn (`nextval`: USAGE or UPDATE) and read (the range's spent check, a permit
        // waiter's refusal: SELECT).
        may_draw: format!(
            "SELECT has_sequence_privilege({here}'{0}', 'USAGE, UPDATE') \
             AND has_sequence_privilege({here}'{0}', 'SELECT')",
            parts.reads
        ),
        join_without: join_call(READS_NONE),
        release_without: release_call("0", READS_NONE),
        steps_without: release_call("$6::integer", READS_NONE),
        hand_read,
    })
}

/// What [`routines`] makes: the functions, and what [`set_up`] needs to call them for a
/// database user who may not draw from the sequence of readers' tokens.
pub(crate) struct Made {
    routines: Routines,
    /// One row: whether the user may draw from the sequence (`nextval`).
    may_draw: String,
    /// One row: whether the user may call the function that hands a read hold over (which
    /// every exclusive release statement then names, see [`Made::hand_read`]) and read and
    /// write the queue, where readers then queue (see [`Parts::join`]).
    may_hand: String,
    /// The join's call that draws nothing from it.
    join_without: String,
    /// The release's call that draws nothing from it (every permit's hand-over locks the
    /// name's row for update).
    release_without: String,
    /// The same, of a read hold's release in steps.
    steps_without: String,
    /// The name of the function that hands a read hold over in a writer's release (see
    /// [`Parts::hand_read`]), for [`release_handing_over`](super::release_handing_over).
    pub(crate) hand_read: String,
}

/// The join's and the release's `p_reads` (see [`Parts::join`], [`Parts::release`]): a reader
/// beside live readers takes a token of their range, the row locked for share; a reader that
/// locks the row for update sets a new range; a permit's release hands it over with a token
/// of the range where it can, and a hand-over with the row locked sets a new range.
const READS: i32 = 1;
/// Neither: a user who may not draw from the sequence or read it (every join and every
/// permit's hand-over locks the row for update).
const READS_NONE: i32 = 0;

/// The functions of `routines` when they exist, creating them first (in a transaction under
/// the lock table's advisory lock, as the table) when missing and `create`, and whether the
/// user may call the hand-over of a read hold. A failure to create them is logged and leaves
/// the transactions in use: they do the same, in more round trips.
pub(super) async fn set_up(
    pool: &sqlx::PgPool,
    made: Made,
    create: bool,
) -> Option<(Routines, bool)> {
    let Made {
        mut routines,
        may_draw,
        may_hand,
        join_without,
        release_without,
        steps_without,
        ..
    } = made;
    let made = async {
        // Closed, not given back, if cancelled mid-way (see `InUse`).
        let mut conn = InUse::acquire(pool).await?;
        let present = async |conn: &mut sqlx::PgConnection| {
            let found: i32 = sqlx::query_scalar(AssertSqlSafe(routines.present.clone()))
                .fetch_one(conn)
                .await?;
            Ok::<_, sqlx::Error>(usize::try_from(found).is_ok_and(|n| n == routines.create.len()))
        };
        let mut found = present(conn.conn()).await?;
        if !found && create {
            let mut tx = sqlx::Connection::begin(conn.conn()).await?;
            sqlx::query("SELECT pg_advisory_xact_lock(7283160942917)")
                .execute(&mut *tx)
                .await?;
            if !present(&mut tx).await? {
                for statement in &routines.create {
                    tx.execute(AssertSqlSafe(statement.clone())).await?;
                }
            }
            tx.commit().await?;
            found = true;
        }
        let (drawn, hands) = if found {
            let may = async |sql: String, conn: &mut sqlx::PgConnection| {
                sqlx::query_scalar::<_, bool>(AssertSqlSafe(sql))
                    .fetch_one(conn)
                    .await
            };
            (
                may(may_draw, conn.conn()).await?,
                may(may_hand, conn.conn()).await?,
            )
        } else {
            (false, false)
        };
        drop(conn.done());
        Ok::<_, sqlx::Error>((found, drawn, hands))
    };
    match made.await {
        Ok((true, true, hands)) => {
            routines.calls.reads_queue = hands;
            Some((routines, hands))
        }
        Ok((true, false, hands)) => {
            // Granted the tables and functions but not the sequence: every join and every
            // permit's hand-over locks the name's row for update, as before `v6` and `v11`.
            routines.calls.join = join_without.into();
            routines.calls.release = release_without.into();
            routines.calls.release_in_steps = Some(steps_without.into());
            routines.calls.reads_queue = hands;
            Some((routines, hands))
        }
        Ok((false, ..)) => None,
        Err(err) => {
            tracing::warn!(%err, "cannot create the functions of shared holds and permits; using transactions");
            None
        }
    }
}

/// What the functions' bodies are made of.
struct Parts<'a> {
    /// The holders' statements, in the routine.
    in_routine: InRoutine,
    t: String,
    h: String,
    /// The queue of permit waiters and of readers that a writer refused.
    w: String,
    /// The sequence of readers' tokens (see [`Parts::join`]).
    reads: String,
    peek_columns: &'a str,
    remaining: &'a str,
    channel: &'a str,
}

/// How many tokens a readers' range holds (see [`Parts::join`]): the row's version moves on by
/// as many more when a reader sets one, and at most as many readers join beside each other
/// before one locks the row for update again, letting a renewal, a release or a writer's
/// reservation queued for the row in (PostgreSQL does not queue a lock for share behind one
/// for update while only locks for share hold the row).
const READ_RANGE: i64 = 16;

/// Makes the call's commit return without waiting for its WAL flush, where it wrote nothing
/// that needs to be durable by itself: a refusal (which still locked the row, and PostgreSQL
/// logs a row lock, so its commit would flush) and a release (lost in a database crash, the
/// hold stays until its lease ends: never held twice). A join that takes and a renewal commit
/// synchronously, which flushes every earlier commit with them, so a token is never handed out
/// twice. The same rule as the exclusive kind's statements.
const NO_FLUSH: &str = "PERFORM set_config('synchronous_commit', 'off', true)";

/// The variables a peek of the lock row is read into.
const PEEK_INTO: &str =
    "o_owner, o_version, o_remaining, o_next_owner, o_next_since, o_next_remaining";

impl Parts<'_> {
    /// Clears the name's reservation (a stale one: its waiter holds, or needs none).
    fn unreserve(&self) -> String {
        format!(
            "UPDATE {} SET next_owner = NULL, next_since = NULL, next_expires = NULL, \
             next_ttl = NULL WHERE name = p_name",
            self.t
        )
    }

    /// `SELECT .. INTO` the peek variables, the row locked.
    fn lock(&self) -> String {
        format!("{} FOR UPDATE", self.peek())
    }

    /// Whether draws (of the table's other names too) have spent the range read into
    /// `v_base` and `o_version` (its top): into `v_spent`. A reader beside readers and a
    /// permit's hand-over from the range look before they draw.
    fn spent(&self) -> String {
        format!(
            "SELECT v_base + last_value + is_called::int >= o_version INTO v_spent FROM {}",
            self.reads
        )
    }

    /// Reads the lock row into the peek variables, not locked.
    fn peek(&self) -> String {
        let Self {
            t, peek_columns, ..
        } = self;
        format!("SELECT {peek_columns} INTO {PEEK_INTO} FROM {t} WHERE name = p_name")
    }

    fn function(signature: &str, params: &str, returns: &str, body: &str) -> String {
        let name = signature.split('(').next().unwrap_or(signature);
        format!(
            "CREATE OR REPLACE FUNCTION {name}({params}) RETURNS {returns} LANGUAGE plpgsql AS $dl$\n{body}\n$dl$"
        )
    }

    /// The queue of permit waiters ([`queue_table`](crate::kinds::queue_table)), created when missing.
    fn queue(&self) -> String {
        format!(
            "CREATE TABLE IF NOT EXISTS {} (name TEXT COLLATE \"C\" NOT NULL, owner TEXT NOT NULL, \
             seq BIGINT NOT NULL, expires_at TIMESTAMPTZ NOT NULL, ttl BIGINT NOT NULL, \
             permits BIGINT NOT NULL, PRIMARY KEY (name, owner))",
            self.w
        )
    }

    /// The sequence of readers' tokens (see [`Parts::join`]), created when missing. It starts
    /// at the database's clock in microseconds, as a new lock row does, so that one made again
    /// (dropped, or a table restored without it) starts above every value of the one before,
    /// unless the clock went back. One value at a time, never cycling: a session's cache
    /// would hold values back from the ranges set meanwhile.
    fn sequence(&self) -> String {
        format!(
            "DO $dl$ BEGIN EXECUTE 'CREATE SEQUENCE IF NOT EXISTS {} AS bigint START WITH ' \
             || {} || ' CACHE 1 NO CYCLE'; END $dl$",
            self.reads,
            super::NOW_US
        )
    }

    /// Queues waiter `p_owner` (ttl `p_ttl`, `p_permits`; 0: a reader) for `|p_queue|` µs from
    /// the clock (not the transaction's start: a join that waited for the row lock keeps its
    /// whole lease), at the back, or keeps its place if it still has a live one (see
    /// [`Parts::join`]). An abandoned attempt's place (a negative ttl, see [`Parts::release`])
    /// stays gone: a poll of it still on its way when it gave up does not queue it again.
    fn enqueue(&self) -> String {
        format!(
            "INSERT INTO {} AS q (name, owner, seq, expires_at, ttl, permits)
        VALUES (p_name, p_owner, (EXTRACT(EPOCH FROM clock_timestamp()) * 1000000)::bigint,
          clock_timestamp() + abs(p_queue) * interval '1 microsecond', p_ttl, p_permits)
        ON CONFLICT (name, owner) DO UPDATE SET expires_at = EXCLUDED.expires_at,
          ttl = EXCLUDED.ttl, permits = EXCLUDED.permits,
          seq = CASE WHEN q.expires_at > now() THEN q.seq ELSE EXCLUDED.seq END
        WHERE q.ttl >= 0",
            self.w
        )
    }

    /// [`Tx::join`](crate::kinds::Tx::join); a permit that a release handed this waiter (see
    /// [`Parts::release`]) and that it did not learn of is renewed and taken again, whatever
    /// the row's reservation says (the transactions never hand a permit over).
    ///
    /// A permit join takes only while the holders and the live waiters queued ahead of it
    /// (all of them, if it is not queued) leave a permit: first come, first served. Refused
    /// with `p_queue` (µs) above 0, it queues its waiter, or keeps its place, live for that
    /// long from now; a take leaves the queue. The refusal commits without waiting for its
    /// flush: a place lost in a crash is taken again by the waiter's next poll.
    ///
    /// Since `v11` a permit waiter's refusal (`p_reads` 1) answers, as the row's version, the
    /// last value drawn from the row's range of tokens while that range is live (below the
    /// version), so that a waiter told of a permit handed from the range later (see
    /// [`Parts::release`]) can tell that hand-over followed its read, as it tells by the
    /// version when a release hands over with the row locked.
    ///
    /// Since `v10` a permit waiter's join (`p_queue` above 0) that finds, without locking the
    /// name's row, the live marker of its semaphore, no live reservation, no place and no
    /// holder row of its own, and the live holders and live waiters queued (for as many
    /// permits) at least `p_permits`, queues itself (`ON CONFLICT DO NOTHING`) and is refused
    /// there, its commit not waiting for its flush; anything else (a place to insert that is
    /// there after all included) goes on as before, the row locked. Every join that takes
    /// still locks the row, so no more than `p_permits` hold. Each acquisition of a full
    /// semaphore was such a refusal and a release, both on the name's one row lock, which the
    /// first refusals no longer take (a queued waiter's later joins, which renew its place or
    /// follow a wake-up, still lock it). A release that counted before this place was
    /// committed and hands nothing wakes the name's waiters (see [`Parts::release`]: every
    /// one, or the holder of a live reservation, which only clients before `v4` claim), whose
    /// joins then lock the row. A hand-over to this waiter needs a place of its own, which it
    /// had none of when it looked; should a poll of its own still on its way (a retry after a
    /// timeout) have queued it meanwhile and a release handed it a permit, a second look
    /// after the insert finds that holder row and the join goes on locked, which takes the
    /// permit and the place out: a place left beside a hold would be handed a second permit.
    ///
    /// Since `v9` a reader refused by a writer (holding, or reserving the next turn) with
    /// `p_queue` other than 0 queues too (`permits` 0), for `|p_queue|` µs: a writer's
    /// release hands a read hold to the readers queued (see [`Parts::hand_read`]). A reader's
    /// join that takes with `p_queue` above 0 (a waiter that may have queued before) takes
    /// its place out; below 0 (its first join: nothing queued yet) it spares that delete. A
    /// place that lapses (the writer held longer) is only a reader that joins when woken, as
    /// before.
    ///
    /// Since `v6` a reader (`p_reads` 1, see [`READS`]) joins live readers with the row
    /// locked for share only, its token from their range (`read_base` plus the next value of
    /// the sequence, kept only above `read_from` and below the row's `version`, which is
    /// `read_from` plus [`READ_RANGE`] while the range is the row's), as the crate docs
    /// describe ("A reader joins live readers without locking the name's row for update").
    /// A reader that locks the row for update and joins live readers sets a new range. The
    /// row's state is read first without a lock: a join that would write the row or be
    /// refused locks it for update (`SKIP LOCKED`: no wait), and when another transaction
    /// holds it, locks it for share instead, which waits for that commit, and looks again. A lock for share that
    /// finds the row no longer fit is let go by rolling its block (a subtransaction) back, so
    /// a join never holds a lock for share while it waits for one for update: no deadlock.
    /// After three looks, or a spent range, the join locks the row for update and goes on as
    /// before.
    fn join(&self, signature: &str) -> String {
        let Self {
            t,
            h,
            w,
            reads,
            in_routine,
            peek_columns,
            remaining,
            channel,
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
        let (peek, lock, spent) = (self.peek(), self.lock(), self.spent());
        let no_flush = NO_FLUSH;
        let enqueue = self.enqueue();
        let mark_reads = mark_reads(mark, reads);
        // A permit join's count of the live waiters queued ahead of it (all of them while
        // `w_seq` is NULL: it has no live place) and of the other live holders.
        let ahead = format!(
            "SELECT count(*) INTO ahead FROM {w} WHERE name = p_name AND owner <> p_owner
      AND expires_at > now() AND permits = p_permits
      AND (w_seq IS NULL OR (seq, owner) < (w_seq, p_owner))"
        );
        let holders = format!(
            "SELECT count(*), min({remaining}) INTO n, o_first_end FROM {h}
        WHERE name = p_name AND expires_at > now() AND owner <> p_owner"
        );
        let unreserve = self.unreserve();
        // A refused permit waiter's answer: the version is the last value drawn from the
        // row's range while it is live (see `release`), else the row's.
        let cursor = format!(
            "IF p_reads = 1 AND p_permits > 0 THEN
      SELECT read_base, read_from, version INTO v_base, v_from, v_top FROM {t}
        WHERE name = p_name;
      IF v_top = v_from + {READ_RANGE} THEN
        SELECT LEAST(v_top, v_base + last_value - 1 + is_called::int) INTO o_version
          FROM {reads};
      END IF;
    END IF;"
        );
        // The row's peek and range, read (then again, locked for share).
        let read_row = format!(
            "SELECT {peek_columns}, read_base, read_from INTO {PEEK_INTO}, v_base, v_from \
             FROM {t} WHERE name = p_name"
        );
        // Whether a reader may join beside the row's readers, with a token of their range.
        let beside = format!(
            "(o_owner = p_marker AND o_remaining >= p_ttl AND o_next_remaining IS NULL \
             AND o_version = v_from + {READ_RANGE})"
        );
        let body = format!(
            "DECLARE n bigint := 0; held boolean; w_seq bigint; ahead bigint := 0; v_base bigint;
  v_from bigint; v_spent boolean := false; v_top bigint;
BEGIN
  -- A reader beside live readers, its token from their range: the row read, then locked
  -- for share (no writer, free, reservation or new range until this commit) and read again.
  IF p_reads = 1 AND p_permits = 0 THEN
    FOR v_try IN 1 .. 3 LOOP
      {read_row};
      EXIT WHEN NOT FOUND;
      IF coalesce({beside}, false) THEN
        -- A range that draws of the table's other names have spent: no lock for share.
        {spent};
        EXIT WHEN v_spent;
      ELSE
        -- This join writes the row (a new epoch or range, a longer lease) or is refused: it
        -- locks the row for update (below), unless another transaction holds it, whose
        -- commit it then waits for, locking for share: the readers queued behind a join
        -- that marks the row join beside it.
        PERFORM 1 FROM {t} WHERE name = p_name FOR UPDATE SKIP LOCKED;
        EXIT WHEN FOUND;
      END IF;
      BEGIN
        {read_row} FOR SHARE;
        IF {beside} THEN
          o_taken := v_base + nextval('{reads}');
          -- Within the range whatever the sequence did (a value cached by a session
          -- before the range began, the sequence made again).
          v_spent := o_taken <= v_from OR o_taken >= o_version;
          IF NOT v_spent THEN
            {insert} ON CONFLICT (name, owner) DO NOTHING;
            IF FOUND THEN
              IF p_queue > 0 THEN
                DELETE FROM {w} WHERE name = p_name AND owner = p_owner;
              END IF;
              RETURN NEXT; RETURN;
            END IF;
          END IF;
        END IF;
        -- Not beside readers after all: the lock for share let go (the block rolled back).
        RAISE EXCEPTION 'not beside readers';
      EXCEPTION WHEN raise_exception THEN
        -- A token drawn and not taken is no answer.
        o_taken := NULL;
      END;
      EXIT WHEN v_spent;
    END LOOP;
  END IF;
  -- A permit waiter's first join into a full semaphore: refused and queued without
  -- locking the name's row (see the function's docs).
  IF p_permits > 0 AND p_queue > 0 THEN
    {peek};
    IF FOUND AND o_owner = p_marker AND o_remaining IS NOT NULL AND o_next_remaining IS NULL
       AND NOT EXISTS (SELECT 1 FROM {w} WHERE name = p_name AND owner = p_owner)
       AND NOT EXISTS (SELECT 1 FROM {h} WHERE name = p_name AND owner = p_owner) THEN
      {ahead};
      {holders};
      IF n + ahead >= p_permits THEN
        INSERT INTO {w} (name, owner, seq, expires_at, ttl, permits)
          VALUES (p_name, p_owner, (EXTRACT(EPOCH FROM clock_timestamp()) * 1000000)::bigint,
            clock_timestamp() + p_queue * interval '1 microsecond', p_ttl, p_permits)
          ON CONFLICT (name, owner) DO NOTHING;
        -- Looked at again in a statement of its own (a snapshot after the insert): a
        -- release that handed this owner a permit meanwhile (a poll of its own, still on
        -- its way, queued it) left its holder row, and the locked path below takes that
        -- permit and this place out.
        IF FOUND AND NOT EXISTS (SELECT 1 FROM {h} WHERE name = p_name AND owner = p_owner) THEN
          {cursor}
          {no_flush}; RETURN NEXT; RETURN;
        END IF;
      END IF;
    END IF;
    n := 0; ahead := 0; o_first_end := NULL;
  END IF;
  {lock};
  IF NOT FOUND THEN
    {ensure};
    {lock};
  END IF;
  held := o_remaining IS NOT NULL;
  -- A permit or read hold of this waiter's already (a release handed it over, and the
  -- wake-up did not tell the waiter, or too late to bound its lease): renewed from now, it
  -- is the hold taken, and a reservation or a place in the queue of the waiter's own is
  -- stale.
  IF held AND o_owner = p_marker THEN
    UPDATE {h} SET expires_at = now() + p_ttl * interval '1 microsecond'
      WHERE name = p_name AND owner = p_owner AND expires_at > now() RETURNING token INTO o_taken;
    IF FOUND THEN
      {stretch};
      IF o_next_owner = p_owner THEN
        {unreserve};
      END IF;
      DELETE FROM {w} WHERE name = p_name AND owner = p_owner;
      RETURN NEXT; RETURN;
    END IF;
  END IF;
  -- Held as another kind (a mismatch or an exclusive holder). A waiting reader refused by
  -- a writer queues, for the writer's release to hand it a read hold.
  IF held AND o_owner IS DISTINCT FROM p_marker THEN
    IF p_permits = 0 AND p_queue <> 0 AND left(o_owner, 1) <> chr(1) THEN
      {enqueue};
    END IF;
    {no_flush};
    RETURN NEXT; RETURN;
  END IF;
  IF p_permits > 0 THEN
    SELECT seq INTO w_seq FROM {w} WHERE name = p_name AND owner = p_owner AND expires_at > now();
    {ahead};
    IF held THEN
      {holders};
    END IF;
  END IF;
  -- A reservation of a live holder of the name is stale (a hand-over of a read hold or a
  -- permit while a poll of that waiter's own renewed the reservation): cleared, it keeps
  -- nobody out.
  IF held AND o_owner = p_marker AND o_next_remaining IS NOT NULL
     AND o_next_owner IS DISTINCT FROM p_owner AND EXISTS (SELECT 1 FROM {h}
       WHERE name = p_name AND owner = o_next_owner AND expires_at > now()) THEN
    {unreserve};
    o_next_owner := NULL; o_next_remaining := NULL; o_next_since := NULL;
  END IF;
  -- Another waiter's turn (a reservation, the waiters queued ahead), or no permit left.
  IF (o_next_remaining IS NOT NULL AND o_next_owner IS DISTINCT FROM p_owner)
     OR (p_permits > 0 AND n + ahead >= p_permits) THEN
    IF p_queue <> 0 THEN
      {enqueue};
    END IF;
    {cursor}
    {no_flush};
    RETURN NEXT; RETURN;
  END IF;
  o_first_end := NULL;
  IF held THEN {purge}; ELSE {purge_all}; END IF;
  -- A reader joining live readers sets a new range of readers' tokens, above its own and
  -- below the row's version, and half a lease more of the row's expiry, so that the readers
  -- after it join beside it. The first reader of an epoch sets none: most names are read by
  -- one reader at a time, whose joins a range would only slow (the sequence's page is one).
  IF p_reads = 1 AND p_permits = 0 AND held THEN {mark_reads}; ELSE {mark}; END IF;
  o_taken := o_version + 1;
  {insert};
  IF p_permits > 0 OR p_queue > 0 THEN
    DELETE FROM {w} WHERE name = p_name AND owner = p_owner;
  END IF;
  -- The reservation was ours and is gone: the next waiter may claim it. A semaphore now full
  -- tells the waiters only that (a hand-over to ourselves: they claim the turn, no join can
  -- take), anything else wakes them to join.
  IF o_next_owner = p_owner THEN
    IF p_permits > 0 AND n + 1 >= p_permits THEN
      PERFORM pg_notify('{channel}',
        'h' || o_taken || ':' || octet_length(p_owner) || ':' || p_owner || p_name);
    ELSE
      PERFORM pg_notify('{channel}', '0:' || p_name);
    END IF;
  END IF;
  RETURN NEXT;
END"
        );
        Self::function(
            signature,
            "p_name text, p_owner text, p_marker text, p_ttl bigint, p_permits bigint, \
             p_queue bigint, p_reads integer",
            "TABLE (o_owner text, o_version bigint, o_remaining bigint, o_next_owner text, \
             o_next_since bigint, o_next_remaining bigint, o_taken bigint, o_first_end bigint)",
            &body,
        )
    }

    /// [`Tx::renew`](crate::kinds::Tx::renew).
    fn renew(&self, signature: &str) -> String {
        let InRoutine {
            extend, stretch, ..
        } = &self.in_routine;
        let lock = self.lock();
        let no_flush = NO_FLUSH;
        let body = format!(
            "DECLARE {}; n bigint;
BEGIN
  {lock};
  IF NOT FOUND OR o_remaining IS NULL OR o_owner IS DISTINCT FROM p_marker THEN
    {no_flush}; RETURN false;
  END IF;
  {extend};
  GET DIAGNOSTICS n = ROW_COUNT;
  IF n <> 1 THEN {no_flush}; RETURN false; END IF;
  {stretch};
  RETURN true;
END",
            DECLARE_PEEK
        );
        Self::function(
            signature,
            "p_name text, p_owner text, p_marker text, p_token bigint, p_ttl bigint",
            "boolean",
            &body,
        )
    }

    /// [`Tx::renew`](crate::kinds::Tx::renew) of each hold of a batch (arrays sorted by name),
    /// in one transaction: the 0-based positions of the renewed ones. Unlike the single
    /// renewal, a refusal does not turn off the commit's flush: the renewals beside it need it.
    fn renew_many(&self, signature: &str) -> String {
        let InRoutine {
            extend, stretch, ..
        } = &self.in_routine;
        let lock = self.lock();
        let body = format!(
            "DECLARE {DECLARE_PEEK}; n bigint; i int;
  p_name text; p_owner text; p_marker text; p_token bigint; p_ttl bigint;
BEGIN
  FOR i IN 1 .. coalesce(array_length(p_names, 1), 0) LOOP
    p_name := p_names[i]; p_owner := p_owners[i]; p_marker := p_markers[i];
    p_token := p_tokens[i]; p_ttl := p_ttls[i];
    {lock};
    IF FOUND AND o_remaining IS NOT NULL AND o_owner IS NOT DISTINCT FROM p_marker THEN
      {extend};
      GET DIAGNOSTICS n = ROW_COUNT;
      IF n = 1 THEN
        {stretch};
        RETURN NEXT i - 1;
      END IF;
    END IF;
  END LOOP;
END"
        );
        Self::function(
            signature,
            "p_names text[], p_owners text[], p_markers text[], p_tokens bigint[], p_ttls bigint[]",
            "SETOF bigint",
            &body,
        )
    }

    /// The hand-over of a permit to waiter `p_owner` with ttl `p_ttl` in a release: its holder
    /// row with the next version (`o_taken`; `o_version` moves on with the row) and the
    /// notification that tells it. The lease starts when the row is locked (`v_at`), not at
    /// the transaction's start (`now()`): the waiter bounds it by its last poll, which the row
    /// lock follows, while the release's transaction may have started before that poll was
    /// sent.
    fn hand_permit(&self) -> String {
        let InRoutine {
            purge,
            mark,
            insert,
            ..
        } = &self.in_routine;
        let ranged = mark_reads(mark, &self.reads).replace("now()", "v_at");
        let (mark, insert) = (
            mark.replace("now()", "v_at"),
            insert.replace("now()", "v_at"),
        );
        format!(
            "v_at := clock_timestamp();
      {purge};
      IF p_reads = 1 THEN
        -- A new range of tokens, which the releases after it hand out (see `release`).
        {ranged};
        o_version := o_version + 1 + {READ_RANGE};
        o_taken := o_version - {READ_RANGE};
      ELSE
        {mark};
        o_version := o_version + 1;
        o_taken := o_version;
      END IF;
      {insert};
      PERFORM pg_notify('{}',
        'h' || o_taken || ':' || octet_length(p_owner) || ':' || p_owner || p_name);",
            self.channel
        )
    }

    /// The release's hand-over of each permit it leaves free (`n` holders left) to the first
    /// live waiter of the queue, in order (see [`Parts::release`]): the block of PL/pgSQL,
    /// which returns when it handed a permit.
    fn hand_to_queue(&self) -> String {
        let w = &self.w;
        let hand = self.hand_permit();
        format!(
            "  -- Each permit left free goes to the first live waiter of the queue.
  IF p_wake AND left(p_marker, 9) = chr(1) || 'permits:' THEN
    p_permits := substr(p_marker, 10)::bigint;
    WHILE n < p_permits LOOP
      SELECT owner, ttl INTO w_owner, p_ttl FROM {w}
        WHERE name = p_name AND expires_at > now() AND permits = p_permits AND ttl >= 0
        ORDER BY seq, owner LIMIT 1;
      EXIT WHEN NOT FOUND;
      -- The row's expiry is not shrunk (one write of the row less per handoff): it may
      -- outlast the holders by what was left of the released lease.
      IF NOT handed THEN
        DELETE FROM {w} WHERE name = p_name AND expires_at <= now() AND ttl >= 0;
      END IF;
      DELETE FROM {w} WHERE name = p_name AND owner = w_owner;
      p_owner := w_owner;
      {hand}
      n := n + 1;
      handed := true;
    END LOOP;
    IF handed AND n >= p_permits THEN RETURN true; END IF;
  END IF;"
        )
    }

    /// [`Tx::release`](crate::kinds::Tx::release), and a hand-over: a permit released from a
    /// full semaphore goes to the permit waiter holding the live reservation (its `next_ttl`
    /// is its ttl negated, see [`Db::hands_permits_over`](crate::db::Db::hands_permits_over)),
    /// as a join of that waiter would take it (the next version, the waiter's ttl from now),
    /// and the notification (`h<version>:..`) tells it so and the other waiters that the
    /// reservation is free. This commit hands out a token, so it waits for its flush. A
    /// release that leaves more than one permit free wakes the reserved waiter to join, as
    /// before (a hand-over would tell the others to claim the reservation while a permit is
    /// free). A reservation of a live permit holder (a waiter's poll in flight during its
    /// hand-over claims the cleared reservation again) is stale: the release clears it and
    /// wakes every waiter, so it neither hands that holder a second permit (which would
    /// replace its row, and the token it holds) nor queues the others behind it.
    ///
    /// Before that (`v4`), a permit's release (or an abandoned attempt's clean-up) hands each
    /// permit it leaves free to the first live waiter of the name's queue, in the order they
    /// queued (see [`Parts::join`]): a holder row of that waiter's with the next version and
    /// the ttl it queued with, its place in the queue gone, and `h<version>:..` tells it (the
    /// others, of earlier versions, claim the reservation, if any). The waiters in the queue
    /// are neither woken nor read by anyone but the release: a handoff is this one call. Its
    /// commit hands out tokens, so it waits for its flush. Without a live waiter in the queue,
    /// the release goes on as `v3`'s.
    ///
    /// The release of the last reader hands the lock to the exclusive waiter holding the
    /// live reservation (a positive `next_ttl`), as an exclusive release does (see
    /// [`release_handing_over`](super::release_handing_over)): the row becomes that writer's,
    /// with the next version (above every reader's token) and its ttl from now, and
    /// `h<version>:..` tells it; this commit waits for its flush. Until then the writer was
    /// woken and took the row itself: a wake-up and a take more per turn (issue 44 measured
    /// a writer's turn between readers at 2.5 mutex handoffs on PostgreSQL).
    ///
    /// Since `v5` a read hold's release runs in steps (`p_step`; 0: all of the above in one
    /// call, as every other release). Step 1 reads the lock row without locking it, deletes
    /// the holder's own row and looks for another live holder row that no release has locked
    /// (`FOR KEY SHARE SKIP LOCKED`, which also keeps that holder's release from deleting it
    /// before this commit): found, it answers `true` and the release is done, since that
    /// holder's release comes later and sees this one gone. Otherwise it answers `NULL` (left,
    /// maybe the last) and step 2 runs the rest of step 0 without the holder's own row (the
    /// row locked, the holders counted, the name freed or handed to the reserved writer).
    /// Since `v7` a step 1 that would answer `NULL` first tries to lock the lock row, skipping
    /// it if another transaction holds it: locked, it goes on as step 2 in the same call (the
    /// last reader's release in one round trip, not two). A step 1 waits for nothing once it
    /// holds a lock (its delete takes its first, its look and its lock of the lock row skip
    /// locked rows, and a step 2 in the same call waits only on rows it holds), so what waits
    /// for it is never waited for by it: no deadlock. A step 2 answers `true` whatever it
    /// finds: its hold left with step 1.
    ///
    /// Since `v11` a permit's release (`p_reads` 1, see [`READS`]) first tries to hand its
    /// permit to the first live waiter of the queue without locking the name's row for
    /// update: in a block (a subtransaction) it locks the row for share (no join, release,
    /// renewal or forced release that locks it for update runs until this commit, and other
    /// such hand-overs run beside it), and goes on only if the row carries the semaphore's
    /// live marker, no live reservation and a range of tokens that is the row's and not
    /// spent (as a reader's join beside readers, see [`Parts::join`]), and every permit is
    /// held (else the locked path hands each free one); it deletes the holder's own live
    /// row, locks the first live place of its number of permits that no other release has
    /// locked (`SKIP LOCKED`), draws the token from the range (`read_base` plus the
    /// sequence's next value, above `read_from` and below the row's `version`), starts the
    /// lease after the draw, checks that the marker's expiry covers it, inserts the waiter's
    /// holder row, deletes its place and notifies `h<token>:..`. Anything else rolls the
    /// block back (its lock for share let go) and the release goes on as before, the row
    /// locked. A permit changes hands, so the count of holders stays. The waiter holds on
    /// the notification when a read of its saw the lock held at a lower version (see
    /// `attempt.rs`): a permit waiter's refusal answers, while the row has a live range, the
    /// last value drawn from it as its version ([`Parts::join`]), and a token drawn after
    /// that read is above it, with its lease started after the read. A refusal that came
    /// after the hand-over (the handed lease ran out first) answers that token or more, and
    /// bounds nothing. Its commit hands out a token, so it waits for its flush, but under a
    /// lock for share: the hand-overs of different permits no longer wait for each other's
    /// flush (each such commit held the name's row until it was flushed). A hand-over with
    /// the row locked (`hand_permit`) sets a new range with its token (the version moves
    /// [`READ_RANGE`] past it, the marker's expiry half a lease past the waiter's), so about
    /// one in [`READ_RANGE`] hand-overs locks the row. Concurrent hand-overs may commit in
    /// another order than they drew: tokens of permits whose holds overlap are unique, not
    /// ordered. Where the user may not draw from the sequence or read it (`p_reads` 0) every
    /// hand-over locks the row, as before. The bound relies on the sequence never going back
    /// (no `setval` or `ALTER SEQUENCE .. RESTART` below its value, no restore of an older
    /// copy of it without its lock table), as the readers' tokens do. Since `v11` no release
    /// hands a permit to an abandoned attempt's place (a negative ttl), which a release that
    /// waited for the row behind the abandon could find still live.
    ///
    /// Since `v9` a reader's release that locked the lock row counts the live holder rows
    /// locked for key share, so that it waits for a leave in progress (a step 1 that deleted
    /// its row and has not committed) and counts that reader gone: it frees the name or hands
    /// it to the reserved writer itself, where it counted that reader and left the name to
    /// its step 2 (readers handed their holds together leave together, and passed the name on
    /// one step 2 after another). The count waits only for a transaction that deletes a
    /// holder row without holding the lock row, which is a step 1, and a step 1 waits for
    /// nothing once its delete holds its row; a renewal's update of a holder row takes no
    /// lock that conflicts with key share: no deadlock.
    fn release(&self, signature: &str) -> String {
        let Self {
            t,
            h,
            in_routine,
            channel,
            reads,
            peek_columns,
            ..
        } = self;
        let InRoutine {
            purge,
            leave,
            free,
            shrink,
            insert_waiter,
            ..
        } = in_routine;
        let insert_waiter = insert_waiter.replace("now()", "v_at");
        let (lock, spent) = (self.lock(), self.spent());
        let no_flush = NO_FLUSH;
        let unreserve = self.unreserve();
        let to_queue = self.hand_to_queue();
        let w = &self.w;
        let hand = self.hand_permit();
        let body = format!(
            "DECLARE {DECLARE_PEEK}; n bigint; o_taken bigint; p_ttl bigint; p_permits bigint;
  w_owner text; handed boolean := false; v_at timestamptz; v_row boolean; v_base bigint;
  v_from bigint; v_expires timestamptz; v_spent boolean;
BEGIN
  -- A permit handed to the first waiter without the name's row locked for update: a token
  -- of the row's range, the row locked for share (see the function's docs).
  IF p_reads = 1 AND p_step = 0 AND p_wake AND p_token IS NOT NULL
     AND left(p_marker, 9) = chr(1) || 'permits:' THEN
    BEGIN
      SELECT {peek_columns}, read_base, read_from, expires_at
        INTO {PEEK_INTO}, v_base, v_from, v_expires FROM {t} WHERE name = p_name FOR SHARE;
      IF NOT FOUND OR o_owner IS DISTINCT FROM p_marker OR o_remaining IS NULL
         OR o_next_remaining IS NOT NULL OR o_version IS DISTINCT FROM v_from + {READ_RANGE} THEN
        RAISE EXCEPTION 'not by the range';
      END IF;
      -- A range that draws (of the table's other names too) have spent: nothing drawn.
      {spent};
      p_permits := substr(p_marker, 10)::bigint;
      -- Another permit free (a holder's lease ran out): the locked path hands each one.
      SELECT count(*) INTO n FROM {h} WHERE name = p_name AND expires_at > now();
      IF v_spent OR n < p_permits THEN RAISE EXCEPTION 'not by the range'; END IF;
      {leave};
      IF NOT FOUND THEN RAISE EXCEPTION 'not by the range'; END IF;
      SELECT owner, ttl INTO w_owner, p_ttl FROM {w}
        WHERE name = p_name AND expires_at > now() AND permits = p_permits AND ttl >= 0
        ORDER BY seq, owner LIMIT 1 FOR UPDATE SKIP LOCKED;
      IF NOT FOUND OR v_expires < clock_timestamp() + p_ttl * interval '1 microsecond' THEN
        RAISE EXCEPTION 'not by the range';
      END IF;
      o_taken := v_base + nextval('{reads}');
      -- The lease starts after the draw: a refusal of this waiter's that read the range's
      -- last drawn value below this token came before it (see `join`).
      v_at := clock_timestamp();
      IF v_expires < v_at + p_ttl * interval '1 microsecond' OR o_taken <= v_from
         OR o_taken >= o_version THEN
        RAISE EXCEPTION 'not by the range';
      END IF;
      {insert_waiter};
      DELETE FROM {w} WHERE name = p_name AND owner = w_owner;
      PERFORM pg_notify('{channel}',
        'h' || o_taken || ':' || octet_length(w_owner) || ':' || w_owner || p_name);
      RETURN true;
    EXCEPTION WHEN raise_exception OR unique_violation THEN
      -- Not so (the block rolled back, its lock for share let go): the name's row locked.
      o_taken := NULL;
    END;
  END IF;
  IF p_step = 1 AND p_token IS NOT NULL THEN
    -- A reader's release: its own row, the name's row read and not locked. A holder this
    -- read or the delete cannot tell live (an expiry at the moment of a renewal still on
    -- its way) goes on below, the row locked, as step 0.
    SELECT owner, expires_at > now() INTO o_owner, v_row FROM {t} WHERE name = p_name;
    IF FOUND AND v_row AND o_owner = p_marker THEN
      {leave};
      IF FOUND THEN
        -- Its place in the queue, left by a hand-over of an earlier client's (`_v8`, which
        -- keeps no queue) that told it: gone, or a later hand-over would give this owner,
        -- whose attempt is over, a hold nobody releases. Only for a hold that may have left
        -- one (`p_wake`: a reader queued, then told it holds): not on every reader's release.
        IF p_wake THEN
          DELETE FROM {w} WHERE name = p_name AND owner = p_owner AND ttl >= 0;
        END IF;
        -- Another live holder row that no release (or purge) is deleting (a counting
        -- release's lock for key share does not keep it out): its holder leaves
        -- after this commit (locked here until then), sees this row gone, and it or a later
        -- holder frees the name. Looked for from this owner on, so that leavers spread.
        PERFORM 1 FROM {h} WHERE name = p_name AND owner > p_owner AND expires_at > now()
          ORDER BY owner LIMIT 1 FOR KEY SHARE SKIP LOCKED;
        IF FOUND THEN {no_flush}; RETURN true; END IF;
        PERFORM 1 FROM {h} WHERE name = p_name AND owner < p_owner AND expires_at > now()
          ORDER BY owner LIMIT 1 FOR KEY SHARE SKIP LOCKED;
        IF FOUND THEN {no_flush}; RETURN true; END IF;
        -- Maybe the last. Unless another transaction holds the name's row (the caller then
        -- calls again with step 2, which waits for it), the row is locked now and this
        -- release goes on as step 2: one round trip less for the last reader's release.
        PERFORM 1 FROM {t} WHERE name = p_name FOR UPDATE SKIP LOCKED;
        IF NOT FOUND THEN {no_flush}; RETURN NULL; END IF;
        p_step := 2;
      END IF;
    END IF;
  END IF;
  {lock};
  v_row := FOUND;
  -- An abandoned permit or read attempt's place: gone, and kept gone (a negative ttl)
  -- against a poll of it still on its way, which would queue it again for a permit nobody
  -- releases (or a read hold a writer's release hands it).
  IF p_token IS NULL AND (left(p_marker, 9) = chr(1) || 'permits:' OR p_marker = {SHARED}) THEN
    INSERT INTO {w} AS q (name, owner, seq, expires_at, ttl, permits)
      VALUES (p_name, p_owner, 0, now(), -1, 0)
      ON CONFLICT (name, owner) DO UPDATE SET expires_at = now(), ttl = -1;
  END IF;
  -- Step 2 ends the readers' turn also when their marker ran out: a release whose count saw
  -- this holder's row (deleted by step 1, not yet committed) and whose shrink, a statement
  -- later, did not, set the marker's expiry to now. Nobody else wakes the waiters then.
  IF NOT v_row OR o_owner IS DISTINCT FROM p_marker OR (o_remaining IS NULL AND p_step <> 2) THEN
    -- Step 2's hold left with step 1: what happened to the name since is no refusal.
    {no_flush}; RETURN p_step = 2;
  END IF;
  IF p_step = 2 THEN
    -- Step 1 took the holder's row out: what is left of its release.
    n := 1;
  ELSIF p_token IS NULL THEN
    {purge}; GET DIAGNOSTICS n = ROW_COUNT;
  ELSE
    {leave}; GET DIAGNOSTICS n = ROW_COUNT;
  END IF;
  IF n = 0 THEN RETURN false; END IF;
  IF p_marker = {SHARED} THEN
    -- Each live holder row locked for key share: one that another reader's first step is
    -- deleting (which does not wait for this row, see above) is waited for, and counted
    -- only if that release rolls back. Readers handed their holds together leave together:
    -- counted as live, the first steps that found this row locked each called a second,
    -- one after the other, and only the last of them handed the name on.
    SELECT count(*) INTO n FROM (SELECT 1 FROM {h} WHERE name = p_name AND expires_at > now()
      FOR KEY SHARE) AS live;
  ELSE
    SELECT count(*) INTO n FROM {h} WHERE name = p_name AND expires_at > now();
  END IF;
  -- A reservation of a holder is stale (it was handed its permit or read hold while a poll of
  -- its own renewed the reservation): clear it, wake every waiter, hand nothing to it. So is
  -- a reader's (its ttl negated) on a name read: that reader joins on its next poll, its own
  -- reservation keeping it out of nothing, and left behind (the reader gone) it would keep
  -- the writers out, unwoken, until it ran out.
  IF o_next_remaining IS NOT NULL AND (o_next_owner = p_owner OR EXISTS
      (SELECT 1 FROM {h} WHERE name = p_name AND owner = o_next_owner AND expires_at > now())
      OR (p_marker = {SHARED} AND (SELECT next_ttl FROM {t} WHERE name = p_name) < 0)) THEN
    {unreserve};
    o_next_owner := NULL; o_next_remaining := NULL;
  END IF;
{to_queue}
  IF p_wake AND o_next_remaining IS NOT NULL
     AND left(p_marker, 9) = chr(1) || 'permits:' THEN
    p_permits := substr(p_marker, 10)::bigint;
    SELECT -next_ttl INTO p_ttl FROM {t} WHERE name = p_name;
    IF p_ttl > 0 AND n = p_permits - 1 THEN
      {shrink};
      p_owner := o_next_owner;
      {hand}
      RETURN true;
    END IF;
  END IF;
  -- The last reader out hands the lock to the reserved writer.
  IF n = 0 AND o_next_remaining IS NOT NULL AND o_next_owner IS DISTINCT FROM p_owner THEN
    SELECT next_ttl INTO p_ttl FROM {t} WHERE name = p_name;
    IF p_ttl > 0 THEN
      {free};
      UPDATE {t} SET owner = next_owner, version = version + 1,
        expires_at = clock_timestamp() + next_ttl * interval '1 microsecond', next_owner = NULL,
        next_since = NULL, next_expires = NULL, next_ttl = NULL
        WHERE name = p_name RETURNING version INTO o_taken;
      PERFORM pg_notify('{channel}',
        'h' || o_taken || ':' || octet_length(o_next_owner) || ':' || o_next_owner || p_name);
      RETURN true;
    END IF;
  END IF;
  -- Permits handed to the queue above: this commit hands out tokens.
  IF NOT handed THEN {no_flush}; END IF;
  IF n = 0 THEN {free}; ELSE {shrink}; END IF;
  -- A writer waits for the last reader; a permit waiter for any permit.
  IF n = 0 OR (p_wake AND p_marker <> {SHARED}) THEN
    PERFORM pg_notify('{channel}', CASE WHEN o_next_owner IS NOT NULL AND o_next_remaining IS NOT NULL
      THEN octet_length(o_next_owner) || ':' || o_next_owner || p_name ELSE '0:' || p_name END);
  END IF;
  RETURN true;
END"
        );
        Self::function(
            signature,
            "p_name text, p_owner text, p_marker text, p_token bigint, p_wake boolean, \
             p_step integer, p_reads integer",
            "boolean",
            &body,
        )
    }
}

impl Parts<'_> {
    /// The hand-over of a read hold to reader `p_owner` (ttl `p_ttl`) in a writer's release
    /// (see [`release_handing_over`](super::release_handing_over)), which calls it in the same
    /// statement, after it freed the name's row (locked by it: this function, `VOLATILE`, sees
    /// that change) and found this reader's live reservation with the ttl stored negated
    /// ([`Db::hands_reads_over`](crate::db::Db::hands_reads_over)): what the reader's join
    /// would do on the free row, done for it. A new epoch (the holders' rows of the name
    /// deleted: none was live, a writer held), the row marked shared with the next version
    /// and the reservation cleared, a holder row of the reader's with that token, and
    /// `h<version>:..` tells the reader (and the other waiters: readers then join it, a
    /// writer claims the reservation). The lease starts when the function runs (`v_at`), not
    /// at the transaction's start: the reader dates it by a read of its holder row once told
    /// (see "Reader hand-over after a writer" in the crate docs). The calling statement lets
    /// the commit wait for its flush: it hands out a token. Should the row not be as said (a
    /// call of another kind), it hands nothing and wakes every waiter.
    ///
    /// Since `v9` it hands a read hold to every reader queued with a live place too (see
    /// [`Parts::join`]: a reader that a writer refused), in the order they queued, each with
    /// the next token after the reserved reader's (the row's version moves to the last) and
    /// the ttl it queued with, told by its own `H<version>:..` (sent before the reserved
    /// reader's `h`, which alone wakes the other waiters); every reader's place of the name goes, but an abandoned one's (a negative
    /// ttl), which keeps it out. Until then those readers were woken by the hand-over and
    /// joined, each a commit that waits for its flush, under the name's row lock, one after
    /// the other: the last reader's release, and so the writer after them, waited behind
    /// those joins (issue 44).
    ///
    /// Until `v8` the release woke the reserved reader, which then joined: a round trip and a
    /// commit more in a writer's turn to the readers.
    fn hand_read(&self, signature: &str) -> String {
        let Self {
            t,
            w,
            in_routine,
            channel,
            ..
        } = self;
        let InRoutine {
            purge_all,
            mark,
            insert,
            ..
        } = in_routine;
        let where_name = " WHERE name = p_name";
        debug_assert!(mark.ends_with(where_name), "{mark}");
        let mark = mark.replace("now()", "v_at").replacen(
            where_name,
            &format!(", next_ttl = NULL{where_name}"),
            1,
        );
        let insert = insert.replace("now()", "v_at");
        let body = format!(
            "DECLARE o_taken bigint; v_at timestamptz; p_marker text := {SHARED};
  p_permits bigint := 0; v_first text := p_owner; v_token bigint; v_until timestamptz;
  v_place record;
BEGIN
  PERFORM 1 FROM {t} WHERE name = p_name AND owner IS NULL AND next_owner = p_owner
    AND next_expires > now() AND next_ttl = -p_ttl;
  IF NOT FOUND THEN
    PERFORM pg_notify('{channel}', '0:' || p_name);
    RETURN;
  END IF;
  v_at := clock_timestamp();
  {purge_all};
  {mark} RETURNING version INTO o_taken;
  {insert};
  v_token := o_taken;
  -- The readers queued behind it (live places, in their order): a holder row each, with the
  -- next tokens and the ttl it queued with, and told so; their places (and the reserved
  -- reader's) gone. An abandoned reader's place (a negative ttl) stays.
  v_until := v_at + p_ttl * interval '1 microsecond';
  FOR v_place IN SELECT owner, ttl FROM {w} WHERE name = p_name AND permits = 0 AND ttl > 0
      AND expires_at > now() AND owner <> v_first ORDER BY seq, owner FOR UPDATE LOOP
    p_owner := v_place.owner;
    p_ttl := v_place.ttl;
    o_taken := o_taken + 1;
    {insert};
    v_until := greatest(v_until, v_at + p_ttl * interval '1 microsecond');
    -- Tells that reader only: the reserved reader's note, last, wakes the other waiters.
    PERFORM pg_notify('{channel}',
      'H' || o_taken || ':' || octet_length(p_owner) || ':' || p_owner || p_name);
  END LOOP;
  IF p_owner <> v_first THEN
    UPDATE {t} SET version = o_taken, expires_at = greatest(expires_at, v_until)
      WHERE name = p_name;
  END IF;
  DELETE FROM {w} WHERE name = p_name AND permits = 0 AND ttl >= 0;
  PERFORM pg_notify('{channel}',
    'h' || v_token || ':' || octet_length(v_first) || ':' || v_first || p_name);
END"
        );
        Self::function(
            signature,
            "p_name text, p_owner text, p_ttl bigint",
            "void",
            &body,
        )
    }
}

/// The shared marker ([`marker`](crate::kinds::marker)) as a PostgreSQL expression.
const SHARED: &str = "chr(1) || 'shared'";

/// The join's `mark` (see [`InRoutine`]) of a reader that sets a new range of readers'
/// tokens from the sequence `reads` (see [`Parts::join`]): its token (the next version) is
/// `read_from`, the version moves [`READ_RANGE`] past it, and the row's expiry covers half a
/// lease more than the reader's.
fn mark_reads(mark: &str, reads: &str) -> String {
    let bump = "version = version + 1,";
    let lease = "now() + p_ttl::bigint";
    debug_assert!(mark.contains(bump) && mark.contains(lease), "{mark}");
    mark.replacen(
        bump,
        &format!(
            "version = version + 1 + {READ_RANGE}, read_from = version + 1, \
             read_base = version + 1 - nextval('{reads}'),"
        ),
        1,
    )
    .replacen(lease, "now() + (p_ttl + p_ttl / 2)::bigint", 1)
}

/// The declarations of the peek variables (the join has them as its output columns).
const DECLARE_PEEK: &str = "o_owner text; o_version bigint; o_remaining bigint; \
     o_next_owner text; o_next_since bigint; o_next_remaining bigint";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reader_reads_the_row_then_locks_it_for_share() {
        let (_, _, holds) = super::super::statements("t", true, crate::dialect::DataColumn(true));
        let made = routines("t", &holds, "owner", "0", "c").expect("the functions");
        let join = &made.routines.create[2];
        let read = "read_base, read_from INTO o_owner, o_version, o_remaining, o_next_owner, \
                    o_next_since, o_next_remaining, v_base, v_from FROM \"t\" WHERE name = p_name";
        assert_eq!(join.matches(&format!("{read};")).count(), 1, "{join}");
        assert_eq!(
            join.matches(&format!("{read} FOR SHARE;")).count(),
            1,
            "{join}"
        );
    }

    /// The release hands a permit to `w_owner` in the holders table of its lock table, whose
    /// name may contain `owner` (the statement's arguments are named, not found by text).
    #[test]
    fn a_hand_over_inserts_into_the_tables_own_holders() {
        let table = "shop_owners";
        let (_, _, holds) = super::super::statements(table, true, crate::dialect::DataColumn(true));
        let made = routines(table, &holds, "owner", "0", "c").expect("the functions");
        let release = &made.routines.create[4];
        let insert = "INSERT INTO \"shop_owners_holders\" (name, owner, token, expires_at, \
                      permits) VALUES (p_name, w_owner, o_taken,";
        assert!(release.contains(insert), "{release}");
        assert!(!release.contains("show_owners"), "{release}");
    }

    #[test]
    fn a_reader_that_marks_the_row_sets_a_range() {
        let (_, _, holds) = super::super::statements("t", true, crate::dialect::DataColumn(true));
        let mark = holds.in_routine(with_args).mark;
        let marked = mark_reads(&mark, "\"t_dl_reads\"");
        assert!(
            marked.contains("version = version + 1 + 16, read_from = version + 1,")
                && marked.contains("now() + (p_ttl + p_ttl / 2)::bigint"),
            "{marked}"
        );
    }

    #[test]
    fn arguments_are_replaced_from_the_last() {
        assert_eq!(
            with_args("a = $1 AND b = $10 AND c = $2::bigint", &["x"; 10]),
            "a = x AND b = x AND c = x::bigint"
        );
        let names = ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"];
        assert_eq!(with_args("$1 $10 $2", &names), "a j b");
    }
}
