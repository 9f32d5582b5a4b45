//! The shared (read) and permit (semaphore) kinds: the holders table of shared holds (the read
//! side of a read-write lock) and semaphore permits, the marker they leave on the lock row, and
//! the short transactions that change them. The exclusive kind (the mutex, the write side) is
//! the lock row alone: its one-statement paths are the dialects' [`Sql`](crate::dialect::Sql)
//! and `attempt.rs`'s.
//!
//! The holders live in `<table>_holders (name, owner, token, expires_at, permits, data)`, one
//! row per holder (`data`: the holder's data, `NULL` when none), created on the first shared
//! or permit acquisition (unless `create_table` is off; with it, a holders table of an
//! earlier version gets the `data` column then). While live holders exist, the name's row in
//! the lock table carries a **marker** as its owner (`"\u{1}shared"`, `"\u{1}permits:N"`:
//! never a real owner, which is a UUID or `id:UUID`) and at least the latest holder expiry as
//! its `expires_at` (a reader that leaves PostgreSQL's functions while others hold does not
//! lower it, see the crate docs), so the one-statement exclusive take refuses by itself while
//! they live and takes the row once they have all expired.
//!
//! Every change runs as one transaction that first locks the lock row (`SELECT .. FOR
//! UPDATE`; SQLite: `BEGIN IMMEDIATE`), so that changes of one name are serialized by that
//! row and every read of the holders table sees the committed state (except the first step
//! of a reader's release by PostgreSQL's functions, which deletes its own holder row without
//! that lock, and a reader's join beside live readers there, which locks the row for share:
//! see `postgres/routines.rs`). A holder is live while
//! its row's expiry is in the future **and** the lock row carries its marker: a forced release
//! (which clears the marker) or an exclusive take of an expired marker ends every holder at
//! once, and the next shared or permit acquisition on a row without a live marker (a new
//! "epoch") deletes whatever holder rows are left.

use std::sync::Arc;

use distlock_core::LockKind;
use sqlx::{AssertSqlSafe, ColumnIndex, Decode, Encode, Executor, IntoArguments, Type};

use crate::db::Peek;
use crate::dialect::{Dialect, q};
use crate::pool::InUse;

/// The first character of a marker: a control character no generated owner starts with.
const MARK: char = '\u{1}';

/// The marker that the lock row carries while holders of `kind` (shared or permits) live.
pub(crate) fn marker(kind: LockKind) -> String {
    match kind {
        LockKind::Permit { permits } => format!("{MARK}permits:{permits}"),
        _ => format!("{MARK}shared"),
    }
}

/// The kind of the holders an owner column stands for, if it is a marker.
pub(crate) fn marked(owner: &str) -> Option<LockKind> {
    let rest = owner.strip_prefix(MARK)?;
    if rest == "shared" {
        return Some(LockKind::Shared);
    }
    let permits = rest.strip_prefix("permits:")?;
    // Only the canonical form: "permits:03" is not a marker of ours.
    let n: u32 = permits.parse().ok()?;
    (n.to_string() == permits).then_some(LockKind::Permit { permits: n })
}

/// How a row is held, if a live holder (or a live marker) is on it.
pub(crate) fn held_kind(peek: &Peek) -> Option<LockKind> {
    peek.remaining_us?;
    Some(
        peek.owner
            .as_deref()
            .and_then(marked)
            .unwrap_or(LockKind::Exclusive),
    )
}

/// Why a request of `kind` can never join the holders of the row, if it cannot.
pub(crate) fn mismatch(peek: &Peek, kind: LockKind) -> Option<String> {
    kind.mismatch(held_kind(peek)?)
}

/// Whether a live reservation of another waiter than `owner` is on the row.
pub(crate) fn reserved_by_other(peek: &Peek, owner: &str) -> bool {
    peek.next_remaining_us.is_some() && peek.next_owner.as_deref() != Some(owner)
}

/// Whether the row refuses a shared or permit request of `owner` whatever the holders table
/// says: an exclusive holder, or another waiter's reservation (a waiting writer queues new
/// readers behind it).
pub(crate) fn refuses_holds(peek: &Peek, owner: &str) -> bool {
    held_kind(peek) == Some(LockKind::Exclusive) || reserved_by_other(peek, owner)
}

/// The notification payload that wakes the waiter holding the row's live reservation, or
/// (none) every waiter of `name` (see [`parse_payload`](crate::wake::parse_payload)).
fn wake_payload(peek: &Peek, name: &str) -> String {
    let target = match (&peek.next_owner, peek.next_remaining_us) {
        (Some(next), Some(_)) => next.as_str(),
        _ => "",
    };
    format!("{}:{target}{name}", target.len())
}

/// The holders table of lock table `table` (`schema.t` gives `schema.t_holders`).
pub(crate) fn holders_table(table: &str) -> String {
    format!("{table}_holders")
}

/// The queue of permit waiters of lock table `table` (PostgreSQL's functions and MySQL's procedures make and use it,
/// see `postgres/routines.rs`): `<table>_queue (name, owner, seq, expires_at, ttl, permits)`,
/// one row per waiting attempt, first in line the lowest `seq` (the clock in microseconds
/// when it queued; then `owner`), live until `expires_at` (each poll of the waiter renews
/// it), `ttl` the lease (µs) it asks for (negative: an abandoned attempt's place, kept gone),
/// `permits` the semaphore's; 0 for a reader that a writer refused (PostgreSQL's functions
/// since `_v9`: a writer's release hands each such reader a read hold).
pub(crate) fn queue_table(table: &str) -> String {
    format!("{table}_queue")
}

/// A dialect's statements on the holders table, and on the lock row as the holders keep it.
/// Arguments bind in the order given (as for [`Sql`](crate::dialect::Sql)).
#[derive(Debug)]
pub(crate) struct HolderSql {
    /// ARGS: name. The lock row's [`Peek`] columns, the row locked for the transaction.
    pub(crate) lock: Arc<str>,
    /// ARGS: name. Inserts a free lock row (version: the clock, see the crate docs, "A store emptied or recreated") if none
    /// exists.
    pub(crate) ensure: Arc<str>,
    /// ARGS: name, owner. Deletes the expired holders and `owner`'s own row.
    pub(crate) purge: Arc<str>,
    /// ARGS: name. Deletes every holder row of the name (a new epoch).
    pub(crate) purge_all: Arc<str>,
    /// ARGS: name. Returns `count, min remaining_us` of the live holders.
    pub(crate) count: Arc<str>,
    /// ARGS: marker, ttl_us, owner (3 times), name. Puts the marker on the row, bumps the
    /// version, extends the expiry to cover the new holder and clears `owner`'s reservation.
    pub(crate) mark: Arc<str>,
    /// ARGS: name, owner, token, ttl_us, permits. Adds a holder.
    pub(crate) insert: Arc<str>,
    /// ARGS: ttl_us, name, owner, token. Extends a live holder; changes one row iff renewed.
    pub(crate) extend: Arc<str>,
    /// ARGS: ttl_us, name. Extends the lock row's expiry to cover a renewed holder.
    pub(crate) stretch: Arc<str>,
    /// ARGS: name, owner, token. Deletes a live holder; changes one row iff released.
    pub(crate) leave: Arc<str>,
    /// ARGS: name. Frees the lock row (the last holder left).
    pub(crate) free: Arc<str>,
    /// ARGS: name, name. Sets the lock row's expiry to the latest live holder's.
    pub(crate) shrink: Arc<str>,
    /// ARGS: name, name. Returns `owner, token, remaining_us, count, data` of the latest live
    /// holder. Not locked: an operator's read.
    pub(crate) info: Arc<str>,
    /// [`info`](Self::info) with `NULL` as the data: for a holders table without the `data`
    /// column.
    pub(crate) info_without_data: Arc<str>,
    /// ARGS: data, name, owner, token. Replaces a live holder's data; changes one row iff it
    /// did.
    pub(crate) set_data: Arc<str>,
    /// No ARGS. Counts the `data` columns of the holders table (0 or 1).
    pub(crate) has_data: Arc<str>,
    /// No ARGS. Counts the `data` columns of the holders table where
    /// [`setup`](Self::setup) would create it (0 or 1): 1, and no set-up is needed. `None`:
    /// that is the table [`has_data`](Self::has_data) finds (every database but PostgreSQL,
    /// whose search path may put another schema's table of the name ahead of where a
    /// `CREATE` makes it).
    pub(crate) set_up: Option<Arc<str>>,
    /// No ARGS. Adds the `data` column to a holders table of an earlier version (when
    /// [`setup`](Self::setup) may run).
    pub(crate) add_data: Arc<str>,
    /// ARGS: payload. Wakes waiters at commit (PostgreSQL only).
    pub(crate) notify: Option<Arc<str>>,
    /// Creates the table if missing: run in one transaction before the first use, unless
    /// the table must not be created.
    pub(crate) setup: Vec<Arc<str>>,
}

impl HolderSql {
    /// The statements prepared on first use, so that a holders table of the wrong shape is
    /// reported then; `data`: the table has the `data` column.
    fn prepared(&self, data: bool) -> impl Iterator<Item = &Arc<str>> {
        let with_data = data.then_some(&self.set_data);
        [
            &self.lock,
            &self.ensure,
            &self.purge,
            &self.purge_all,
            &self.count,
            &self.mark,
            &self.insert,
            &self.extend,
            &self.stretch,
            &self.leave,
            &self.free,
            &self.shrink,
        ]
        .into_iter()
        .chain(&self.notify)
        .chain(with_data)
    }
}

/// [`HolderSql`]'s statements in a server-side routine, each argument replaced by the
/// routine's parameter or variable of that name: `p_name`, `p_owner`, `p_marker`, `p_ttl`
/// (µs), `p_permits`, `p_token`, and `o_taken` (the token a join takes).
#[cfg_attr(
    not(any(feature = "postgres", feature = "mysql")),
    allow(dead_code, reason = "PostgreSQL's and MySQL's")
)]
pub(crate) struct InRoutine {
    pub(crate) ensure: String,
    pub(crate) purge: String,
    pub(crate) purge_all: String,
    pub(crate) mark: String,
    pub(crate) insert: String,
    /// [`HolderSql::insert`] for the waiter `w_owner` a release hands a permit to.
    #[cfg_attr(
        not(feature = "postgres"),
        allow(dead_code, reason = "PostgreSQL's release")
    )]
    pub(crate) insert_waiter: String,
    pub(crate) extend: String,
    pub(crate) stretch: String,
    pub(crate) leave: String,
    pub(crate) free: String,
    pub(crate) shrink: String,
}

#[cfg_attr(
    not(any(feature = "postgres", feature = "mysql")),
    allow(dead_code, reason = "PostgreSQL's and MySQL's")
)]
impl HolderSql {
    /// The statements with their arguments replaced by `with_args(statement, names)` (the
    /// dialect's placeholders, in the order of their ARGS).
    pub(crate) fn in_routine(&self, with_args: impl Fn(&str, &[&str]) -> String) -> InRoutine {
        let (name, owner) = ("p_name", "p_owner");
        InRoutine {
            ensure: with_args(&self.ensure, &[name]),
            purge: with_args(&self.purge, &[name, owner]),
            purge_all: with_args(&self.purge_all, &[name]),
            mark: with_args(
                &self.mark,
                &["p_marker", "p_ttl", owner, owner, owner, name],
            ),
            insert: with_args(
                &self.insert,
                &[name, owner, "o_taken", "p_ttl", "p_permits"],
            ),
            insert_waiter: with_args(
                &self.insert,
                &[name, "w_owner", "o_taken", "p_ttl", "p_permits"],
            ),
            extend: with_args(&self.extend, &["p_ttl", name, owner, "p_token"]),
            stretch: with_args(&self.stretch, &["p_ttl", name]),
            leave: with_args(&self.leave, &[name, owner, "p_token"]),
            free: with_args(&self.free, &[name]),
            shrink: with_args(&self.shrink, &[name, name]),
        }
    }
}

/// The holders' statements of a database, with the one-time setup of their table.
#[derive(Debug)]
pub(crate) struct Holds {
    pub(crate) sql: HolderSql,
    /// Set once the table was set up and the statements prepared: whether the table has the
    /// `data` column (it has unless it is of an earlier version and may not be altered).
    pub(crate) ready: tokio::sync::OnceCell<bool>,
}

impl Holds {
    /// The holders' statements, their table not set up yet; `create`: it may be created
    /// ([`SqlConfig::create_table`](crate::SqlConfig::create_table)).
    pub(crate) fn new(mut sql: HolderSql, create: bool) -> Self {
        if !create {
            sql.setup.clear();
        }
        Self {
            sql,
            ready: tokio::sync::OnceCell::new(),
        }
    }

    /// Whether the holders table has the `data` column (known once [`ready`]).
    pub(crate) fn has_data(&self) -> bool {
        self.ready.get().copied().unwrap_or(false)
    }

    /// The statement of an inspection ([`HolderSql::info`]), for the table as it is.
    pub(crate) fn info(&self) -> &Arc<str> {
        if self.has_data() {
            &self.sql.info
        } else {
            &self.sql.info_without_data
        }
    }
}

/// What a shared or permit acquisition found.
#[derive(Debug)]
pub(crate) enum Joined {
    /// Taken, with this token (the new version).
    Taken(i64),
    /// Refused now: the row as it was (its `remaining_us` is when a permit frees, for a full
    /// semaphore).
    Busy(Peek),
    /// The name is held as another kind that can never be joined (see [`LockKind::mismatch`]).
    Mismatch(String),
}

impl Joined {
    /// The answer of a join that ran in the server: `taken`, the token when it took; else why
    /// not, from the lock row `peek` as it found it (`first_end`: the first holder's remaining
    /// lease, when a full semaphore refused). The same answers as [`Tx::join`] gives.
    pub(crate) fn from_server(
        peek: Peek,
        kind: LockKind,
        taken: Option<i64>,
        first_end: Option<i64>,
    ) -> Self {
        match taken {
            Some(token) => Self::Taken(token),
            None => match mismatch(&peek, kind) {
                Some(message) => Self::Mismatch(message),
                None => Self::Busy(Peek {
                    remaining_us: first_end.or(peek.remaining_us),
                    ..peek
                }),
            },
        }
    }
}

/// A live holder as an inspection shows it: the latest one, and how many hold.
#[derive(Debug)]
pub(crate) struct HolderInfo {
    pub(crate) owner: String,
    pub(crate) token: i64,
    pub(crate) remaining_us: i64,
    pub(crate) count: i64,
    /// The latest holder's data.
    pub(crate) data: Option<String>,
}

/// What a shared or permit acquisition asks for.
#[derive(Debug, Clone, Copy)]
pub(crate) struct JoinRequest<'a> {
    pub(crate) name: &'a str,
    pub(crate) owner: &'a str,
    pub(crate) kind: LockKind,
    pub(crate) ttl_us: i64,
    /// The lease of the waiter's place in the name's queue, should a permit join be refused
    /// (µs; 0: not queued, as a try); only where permit waiters queue
    /// ([`Db::queues_permits`](crate::db::Db::queues_permits)). A waiting reader's, where a
    /// writer's release hands read holds over
    /// ([`Db::hands_reads_over`](crate::db::Db::hands_reads_over)), should a writer refuse it:
    /// negative on its first join (it has no place to take out when it takes).
    pub(crate) queue_us: i64,
}

/// A holder's lease, as renewal and release name it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HeldBy<'a> {
    pub(crate) name: &'a str,
    pub(crate) owner: &'a str,
    pub(crate) kind: LockKind,
    /// The holder's token; `None` for an abandoned attempt, whose token is unknown.
    pub(crate) token: Option<i64>,
    /// Whether the attempt may have left a place in the name's queue: a reader queued behind a
    /// writer and told by a hand-over that it holds (see [`Calls::reads_queue`]).
    ///
    /// [`Calls::reads_queue`]: crate::dialect::Calls::reads_queue
    pub(crate) queued: bool,
}

/// The statements of one transaction, on its connection (a short name for the bounds).
pub(crate) struct Tx<'t, DB: sqlx::Database> {
    pub(crate) conn: &'t mut DB::Connection,
    pub(crate) sql: &'t HolderSql,
}

impl<DB> Tx<'_, DB>
where
    DB: Dialect,
    DB::Arguments: IntoArguments<DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    usize: ColumnIndex<DB::Row>,
    for<'t> &'t str: Encode<'t, DB> + Type<DB>,
    for<'t> i64: Encode<'t, DB> + Decode<'t, DB> + Type<DB>,
    for<'t> Option<i64>: Decode<'t, DB> + Type<DB>,
    for<'t> String: Encode<'t, DB> + Type<DB>,
{
    /// Locks the lock row of `name` (inserting a free one if missing) and reads it.
    pub(crate) async fn lock(&mut self, name: &str) -> Result<Peek, sqlx::Error> {
        for _ in 0..2 {
            let row = q(&self.sql.lock)
                .bind(name.to_owned())
                .fetch_optional(&mut *self.conn)
                .await?;
            if let Some(row) = row {
                return Peek::from_row(&row, |i| DB::owner(&row, i));
            }
            q(&self.sql.ensure)
                .bind(name.to_owned())
                .execute(&mut *self.conn)
                .await?;
        }
        Err(sqlx::Error::RowNotFound)
    }

    async fn run(
        &mut self,
        query: sqlx::query::Query<'static, DB, DB::Arguments>,
    ) -> Result<u64, sqlx::Error> {
        Ok(DB::changed(&query.execute(&mut *self.conn).await?))
    }

    /// `count, min remaining_us` of the live holders.
    async fn count(&mut self, name: &str) -> Result<(i64, Option<i64>), sqlx::Error> {
        let row = q(&self.sql.count)
            .bind(name.to_owned())
            .fetch_one(&mut *self.conn)
            .await?;
        Ok((sqlx::Row::try_get(&row, 0)?, sqlx::Row::try_get(&row, 1)?))
    }

    /// Queues a wake-up (sent at commit) for the reservation's holder, or everyone if
    /// `everyone` or nobody holds it. Nothing on databases without events.
    async fn notify(&mut self, peek: &Peek, name: &str, everyone: bool) -> Result<(), sqlx::Error> {
        let Some(notify) = &self.sql.notify else {
            return Ok(());
        };
        let payload = if everyone {
            format!("0:{name}")
        } else {
            wake_payload(peek, name)
        };
        q(notify).bind(payload).execute(&mut *self.conn).await?;
        Ok(())
    }

    /// The body of a shared or permit acquisition, after the row is locked.
    pub(crate) async fn join(
        &mut self,
        req: JoinRequest<'_>,
        peek: Peek,
    ) -> Result<Joined, sqlx::Error> {
        let JoinRequest {
            name,
            owner,
            kind,
            ttl_us,
            // The transactions queue no waiter (see `Db::queues_permits`).
            queue_us: _,
        } = req;
        let held = held_kind(&peek);
        if let Some(message) = held.and_then(|held| kind.mismatch(held)) {
            return Ok(Joined::Mismatch(message));
        }
        if refuses_holds(&peek, owner) {
            return Ok(Joined::Busy(peek));
        }
        // A live marker of this kind: join its holders; otherwise start afresh.
        if held.is_some() {
            self.run(
                q(&self.sql.purge)
                    .bind(name.to_owned())
                    .bind(owner.to_owned()),
            )
            .await?;
        } else {
            self.run(q(&self.sql.purge_all).bind(name.to_owned()))
                .await?;
        }
        let permits = permits_of(kind);
        if held.is_some() && permits > 0 {
            let (count, first_end) = self.count(name).await?;
            if count >= permits {
                return Ok(Joined::Busy(Peek {
                    remaining_us: first_end.or(peek.remaining_us),
                    ..peek
                }));
            }
        }
        let mark = q(&self.sql.mark).bind(marker(kind)).bind(ttl_us);
        let mark = mark.bind(owner.to_owned()).bind(owner.to_owned());
        self.run(mark.bind(owner.to_owned()).bind(name.to_owned()))
            .await?;
        let token = peek.version + 1;
        let insert = q(&self.sql.insert)
            .bind(name.to_owned())
            .bind(owner.to_owned());
        self.run(insert.bind(token).bind(ttl_us).bind(permits))
            .await?;
        if peek.next_owner.as_deref() == Some(owner) {
            // The reservation was ours and is gone: the next waiter may claim it (or, a reader
            // behind the same writer, join us).
            self.notify(&peek, name, true).await?;
        }
        Ok(Joined::Taken(token))
    }

    /// The body of a renewal, after the row is locked: whether the holder was live.
    pub(crate) async fn renew(
        &mut self,
        held: HeldBy<'_>,
        ttl_us: i64,
        peek: &Peek,
    ) -> Result<bool, sqlx::Error> {
        let Some(token) = held.token.filter(|_| carries(peek, held.kind)) else {
            return Ok(false);
        };
        let extend = q(&self.sql.extend).bind(ttl_us).bind(held.name.to_owned());
        let extended = self
            .run(extend.bind(held.owner.to_owned()).bind(token))
            .await?;
        if extended != 1 {
            return Ok(false);
        }
        self.run(q(&self.sql.stretch).bind(ttl_us).bind(held.name.to_owned()))
            .await?;
        Ok(true)
    }

    /// The body of a release (or of an abandoned attempt's cleanup), after the row is locked:
    /// whether the holder was live. The last holder to leave frees the row.
    pub(crate) async fn release(
        &mut self,
        held: HeldBy<'_>,
        peek: &Peek,
    ) -> Result<bool, sqlx::Error> {
        if !carries(peek, held.kind) {
            return Ok(false);
        }
        let name = held.name.to_owned();
        let left = match held.token {
            Some(token) => {
                let leave = q(&self.sql.leave).bind(name.clone());
                self.run(leave.bind(held.owner.to_owned()).bind(token))
                    .await?
            }
            None => {
                let purge = q(&self.sql.purge).bind(name.clone());
                self.run(purge.bind(held.owner.to_owned())).await?
            }
        };
        if left == 0 {
            return Ok(false);
        }
        let (count, _) = self.count(held.name).await?;
        if count == 0 {
            self.run(q(&self.sql.free).bind(name)).await?;
        } else {
            self.run(q(&self.sql.shrink).bind(name.clone()).bind(name))
                .await?;
        }
        // A writer waits for the last reader; a permit waiter for any permit.
        if count == 0 || matches!(held.kind, LockKind::Permit { .. }) {
            self.notify(peek, held.name, false).await?;
        }
        Ok(true)
    }
}

impl<DB> Tx<'_, DB>
where
    DB: Dialect,
    DB::Arguments: IntoArguments<DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'t> &'t str: Encode<'t, DB> + Type<DB>,
    for<'t> i64: Encode<'t, DB> + Type<DB>,
    for<'t> String: Encode<'t, DB> + Type<DB>,
    for<'t> Option<String>: Encode<'t, DB> + Type<DB>,
{
    /// The body of a holder data update, after the row is locked: whether the holder was live
    /// (its row unexpired under the live marker of its kind) and has the data now. Not a
    /// renewal: the expiries stay.
    pub(crate) async fn set_data(
        &mut self,
        held: HeldBy<'_>,
        data: Option<&str>,
        peek: &Peek,
    ) -> Result<bool, sqlx::Error> {
        let Some(token) = held.token.filter(|_| carries(peek, held.kind)) else {
            return Ok(false);
        };
        let set = q(&self.sql.set_data).bind(data.map(str::to_owned));
        let set = set.bind(held.name.to_owned()).bind(held.owner.to_owned());
        Ok(DB::changed(&set.bind(token).execute(&mut *self.conn).await?) == 1)
    }
}

/// The permits of a semaphore of `kind`, as the holders table keeps them (0: a shared hold).
pub(crate) fn permits_of(kind: LockKind) -> i64 {
    match kind {
        LockKind::Permit { permits } => i64::from(permits),
        _ => 0,
    }
}

/// Whether the row carries the live marker of `kind`.
fn carries(peek: &Peek, kind: LockKind) -> bool {
    peek.remaining_us.is_some() && peek.owner.as_deref() == Some(marker(kind).as_str())
}

/// Sets up the holders table (when it may be created), adds the `data` column to a table of
/// an earlier version (likewise) and prepares the statements, once. Whether the table has the
/// `data` column.
pub(crate) async fn ready<DB>(holds: &Holds, pool: &sqlx::Pool<DB>) -> Result<bool, sqlx::Error>
where
    DB: Dialect,
    DB::Arguments: IntoArguments<DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    usize: ColumnIndex<DB::Row>,
    for<'t> i64: Decode<'t, DB> + Type<DB>,
{
    let data = holds
        .ready
        .get_or_try_init(|| async {
            // Closed, not given back, if cancelled mid-way (see `InUse`).
            let mut conn = InUse::acquire(pool).await?;
            let create = !holds.sql.setup.is_empty();
            let count = async |conn: &mut DB::Connection, sql: &Arc<str>| {
                let row = q::<DB>(sql).fetch_one(conn).await?;
                Ok::<_, sqlx::Error>(sqlx::Row::try_get::<i64, _>(&row, 0)? > 0)
            };
            let has_data = async |conn: &mut DB::Connection| count(conn, &holds.sql.has_data).await;
            // Looked up first: a table with the column needs no set-up (which serializes
            // first uses, under a lock on PostgreSQL), and an ALTER waits for every open
            // transaction on the table.
            let mut data = if create {
                let set_up = holds.sql.set_up.as_ref().unwrap_or(&holds.sql.has_data);
                count(conn.conn(), set_up).await?
            } else {
                has_data(conn.conn()).await?
            };
            if !data && create {
                let mut tx = sqlx::Connection::begin(conn.conn()).await?;
                for statement in &holds.sql.setup {
                    (&mut *tx).execute(AssertSqlSafe(statement.clone())).await?;
                }
                tx.commit().await?;
                data = has_data(conn.conn()).await?;
            }
            if !data && create {
                // A concurrent first use may have added it meanwhile (a duplicate column).
                let added = (&mut *conn.conn())
                    .execute(AssertSqlSafe(holds.sql.add_data.clone()))
                    .await;
                data = has_data(conn.conn()).await?;
                if let Err(err) = added
                    && !data
                {
                    return Err(err);
                }
            }
            for statement in holds.sql.prepared(data) {
                use sqlx::SqlSafeStr;
                conn.conn()
                    .prepare(AssertSqlSafe(statement.clone()).into_sql_str())
                    .await?;
            }
            drop(conn.done());
            Ok::<bool, sqlx::Error>(data)
        })
        .await?;
    Ok(*data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_round_trip_and_real_owners_are_not_markers() {
        for kind in [
            LockKind::Shared,
            LockKind::Permit { permits: 1 },
            LockKind::Permit { permits: 65536 },
        ] {
            assert_eq!(marked(&marker(kind)), Some(kind));
        }
        for owner in [
            "0123456789abcdef0123456789abcdef",
            "worker:0123456789abcdef0123456789abcdef",
            "\u{1}shared:0123456789abcdef0123456789abcdef",
            "\u{1}permits:03",
            "\u{1}permits:x",
            "shared",
        ] {
            assert_eq!(marked(owner), None, "{owner:?}");
        }
    }

    #[test]
    fn wake_ups_go_to_a_live_reservation_or_everyone() {
        let mut peek = Peek {
            owner: None,
            version: 3,
            remaining_us: None,
            next_owner: Some("wäiter".into()),
            next_since: Some(2),
            next_remaining_us: Some(10),
        };
        assert_eq!(wake_payload(&peek, "n"), "7:wäitern");
        peek.next_remaining_us = None;
        assert_eq!(wake_payload(&peek, "n"), "0:n");
    }
}
