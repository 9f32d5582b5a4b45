//! What differs between the databases besides SQL text ([`Dialect`]), and the statements that
//! every database runs the same way ([`Common`]): for these only the SQL text differs. Each
//! dialect writes their placeholders so that the arguments bind in the order documented on
//! [`Common`]'s fields (MySQL's `?` in that order; PostgreSQL's `$n` and SQLite's `?n`
//! numbered to match).

use std::sync::Arc;

use async_trait::async_trait;
use distlock_core::LockKind;
use distlock_core::backend::{RetryPolicy, retrying};
#[cfg(any(feature = "postgres", feature = "mysql"))]
use sqlx::SqlSafeStr;
use sqlx::{AssertSqlSafe, ColumnIndex, Decode, Encode, Executor, IntoArguments, Type};

use crate::db::{Claim, Listed, Peek, bind_value};
#[cfg(any(feature = "postgres", feature = "mysql"))]
use crate::error::shape_err;
use crate::fence::FencedUpdate;
use crate::hot::HotConns;
use crate::kinds::{self, HeldBy, HolderInfo, Holds, JoinRequest, Joined, Tx, marker};

/// What SQL text cannot say about a database.
pub(crate) trait Dialect: sqlx::Database {
    /// The identifier quote.
    const QUOTE: char;

    /// The `n`th (1-based) placeholder of a statement built at run time.
    fn param(n: usize) -> String;

    /// How many rows a statement changed.
    fn changed(result: &Self::QueryResult) -> u64;

    /// An owner column (or another text column: the holder data) as text (MySQL keeps owners
    /// and data as bytes).
    fn owner(row: &Self::Row, index: usize) -> Result<Option<String>, sqlx::Error>;

    /// How a transaction of the holders ([`crate::kinds`]) starts: at READ COMMITTED on the
    /// servers (every statement sees what committed before it, also where the application's
    /// default is stricter), as a writer at once on SQLite (`BEGIN IMMEDIATE`: a deferred
    /// transaction's upgrade to a writer fails as busy without waiting).
    const BEGIN: &'static str;
}

/// A dialect's lock-table statements: only their SQL text differs between the databases.
/// Each writes its placeholders so that the arguments bind in the order given here (MySQL's
/// `?` in that order; PostgreSQL's `$n` and SQLite's `?n` numbered to match). PostgreSQL's
/// releasing statements also take the notification channel, last. A dialect keeps what only
/// it needs beside these (MySQL's version check after a take, PostgreSQL's waking take).
#[derive(Debug)]
pub(crate) struct Sql {
    /// ARGS: name, owner, ttl_us. Takes the row when free, expired or already the owner's.
    pub(crate) take: Arc<str>,
    /// ARGS: name. Returns `owner, version, remaining_us, next_owner, next_since,
    /// next_remaining_us` (see [`Peek`]).
    pub(crate) peek: Arc<str>,
    /// ARGS: since, hold_us, owner, name, owner, since. Changes one row iff the reservation
    /// is granted.
    pub(crate) reserve: Arc<str>,
    /// ARGS: ttl_us, name, owner, version. Changes one row iff renewed.
    pub(crate) renew: Arc<str>,
    /// ARGS: name, owner, version. Changes one row iff released.
    pub(crate) release: Arc<str>,
    /// ARGS: owner (5 times), name, owner (twice).
    pub(crate) abandon: Arc<str>,
    /// ARGS: name. Changes one row iff a live lock was freed.
    pub(crate) force: Arc<str>,
    /// ARGS: prefix, prefix, limit. Returns `name, owner, version, remaining_us, data` (see
    /// [`Listed`]). Not prepared at connect: operators' reads only.
    pub(crate) list: Arc<str>,
    /// ARGS: name. Returns the [`peek`](Self::peek)'s columns and the holder data, read
    /// together (`NULL` for a table without the `data` column). Not prepared at connect:
    /// operators' reads only.
    pub(crate) inspect: Arc<str>,
    /// ARGS: data, name, owner, version. Replaces the holder data of a live lease of that
    /// owner and version; changes one row iff it did. `None`: the lock table has no `data`
    /// column (a table of an earlier version, `create_table` off), holds carry no data.
    pub(crate) set_data: Option<Arc<str>>,
}

impl Sql {
    /// The statements prepared at connect (all but the operators' reads), so that a table of
    /// the wrong shape is reported then.
    pub(crate) fn prepared(&self) -> Vec<&Arc<str>> {
        let mut all = vec![&self.take, &self.peek, &self.reserve, &self.renew];
        all.extend([&self.release, &self.abandon, &self.force]);
        all.extend(&self.set_data);
        all
    }
}

/// What the statements of a lock table write and read of the holder data: the `data` column
/// when the table has it, else nothing (see [`Sql::set_data`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct DataColumn(pub(crate) bool);

impl DataColumn {
    /// An assignment list's tail that clears the data (`, data = NULL`), or nothing.
    pub(crate) fn clear(self) -> &'static str {
        if self.0 { ", data = NULL" } else { "" }
    }

    /// The data column for a `SELECT`: `data`, or `NULL` for a table without it.
    pub(crate) fn select(self) -> &'static str {
        if self.0 { "data" } else { "NULL" }
    }
}

/// A database's statements on its kept connections. The [`Db`](crate::db::Db) trait's
/// provided methods run them (see [`CommonStatements`]); PostgreSQL runs its notifying ones
/// itself.
#[derive(Debug)]
pub(crate) struct Common<DB: sqlx::Database> {
    pub(crate) conns: HotConns<DB>,
    pub(crate) sql: Sql,
    /// The statements of shared holds and permits.
    pub(crate) holds: Holds,
    /// The calls of the server-side routines that run the holds' transactions in one round
    /// trip, where they exist (PostgreSQL's functions, MySQL's procedures); else the
    /// transactions of [`crate::kinds`] run.
    pub(crate) routines: Option<Calls>,
}

#[cfg_attr(
    not(any(feature = "postgres", feature = "mysql")),
    allow(dead_code, reason = "PostgreSQL's and MySQL's")
)]
impl<DB: sqlx::Database> Common<DB> {
    /// The call of the routine that renews a batch of holds ([`Calls::renew_many`]), when the
    /// routines are in use.
    pub(crate) fn renew_holds_call(&self) -> Option<&Arc<str>> {
        self.routines.as_ref()?.renew_many.as_ref()
    }

    /// Whether the routines in use queue permit waiters ([`Calls::queue`]).
    pub(crate) fn queues_permits(&self) -> bool {
        self.routines.as_ref().is_some_and(|calls| calls.queue)
    }
}

/// A database's routines of shared holds and permits for one lock table: the statements that
/// call them, tell whether they exist and create them.
#[derive(Debug)]
#[cfg_attr(
    not(any(feature = "postgres", feature = "mysql")),
    allow(dead_code, reason = "PostgreSQL's and MySQL's")
)]
pub(crate) struct Routines {
    /// The calls.
    pub(crate) calls: Calls,
    /// No ARGS. How many of the routines exist (all: as many as [`Self::create`] makes).
    pub(crate) present: Arc<str>,
    /// The statements that create them (`CREATE OR REPLACE FUNCTION`; MySQL: `CREATE
    /// PROCEDURE IF NOT EXISTS`, in the text protocol only).
    pub(crate) create: Vec<String>,
}

/// The statements that call a database's routines of shared holds and permits
/// (`postgres/routines.rs`, `mysql/routines.rs`): the same answers as the transactions of
/// [`crate::kinds`] in one round trip. Each binds name, owner, the kind's marker and two more
/// arguments (below) and answers one row.
#[derive(Debug)]
#[cfg_attr(
    not(any(feature = "postgres", feature = "mysql")),
    allow(dead_code, reason = "PostgreSQL's and MySQL's")
)]
pub(crate) struct Calls {
    /// Then ttl_us, permits (0: a shared hold), and with [`Self::queue`] the queue lease
    /// (µs; 0: not queued). The row: the lock row's peek columns as the join found them, the
    /// token taken (`NULL`: refused), and the first holder's remaining lease when a full
    /// semaphore refused.
    pub(crate) join: Arc<str>,
    /// Whether permit waiters queue (PostgreSQL, MySQL): a refused permit join with a queue lease
    /// puts its waiter in the name's queue, or keeps it there for that lease from now, and a
    /// release hands each permit it frees to the first live waiter of the queue.
    pub(crate) queue: bool,
    /// Whether waiting readers queue too (PostgreSQL's functions since `_v9`, where the user
    /// may call the hand-over of read holds): the release of a read hold that may have left a
    /// place ([`HeldBy::queued`](crate::kinds::HeldBy::queued)) then passes `wake`, and takes
    /// that place out.
    pub(crate) reads_queue: bool,
    /// Then token, ttl_us. The row: 1 if the holder was live and is renewed, else 0.
    pub(crate) renew: Arc<str>,
    /// Then token (`NULL`: an abandoned attempt's, whose token is unknown), wake (a permit's
    /// release wakes a waiter even while others hold; a read hold's, with
    /// [`Self::reads_queue`]). The row: 1 if the holder was live and
    /// has left, else 0.
    pub(crate) release: Arc<str>,
    /// A read hold's release in two steps (PostgreSQL): [`Self::release`]'s arguments, then
    /// the step (a bigint). Step 1 leaves the holders without locking the name's row and answers 1 (left,
    /// another live holder is not leaving: it or a later one frees the name), 0 (not a live
    /// holder) or `NULL` (left, maybe the last holder); only then step 2 runs what is left of
    /// [`Self::release`] (the row locked, the name freed or handed to the reserved writer).
    /// A step 1 that finds the name's row free runs step 2 itself and answers 1.
    pub(crate) release_in_steps: Option<Arc<str>>,
    /// The renewal of a batch of holds sorted by name. PostgreSQL binds the arrays of names,
    /// owners, markers, tokens and ttl_us, and answers the 0-based positions of the renewed
    /// holds as rows; MySQL binds one JSON array of `[name, owner, marker, token, ttl_us]`
    /// and answers one row, a string of `1` (renewed) or `0` per hold.
    pub(crate) renew_many: Option<Arc<str>>,
}

/// [`Common`]'s statements, whatever the database, for the [`Db`](crate::db::Db) trait's
/// provided methods.
#[async_trait]
pub(crate) trait CommonStatements: Send + Sync {
    async fn peek(&self, name: &str) -> Result<Option<Peek>, sqlx::Error>;
    async fn renew(
        &self,
        name: &str,
        owner: &str,
        version: i64,
        ttl: i64,
    ) -> Result<bool, sqlx::Error>;
    async fn release(&self, name: &str, owner: &str, version: i64) -> Result<bool, sqlx::Error>;
    async fn force_release(&self, name: &str) -> Result<bool, sqlx::Error>;
    async fn list(&self, prefix: &str, limit: i64) -> Result<Vec<Listed>, sqlx::Error>;
    async fn inspect(&self, name: &str) -> Result<Option<(Peek, Option<String>)>, sqlx::Error>;
    /// Whether the lock table has the `data` column ([`Sql::set_data`]).
    fn has_data(&self) -> bool;
    async fn set_data(
        &self,
        name: &str,
        owner: &str,
        version: i64,
        data: Option<&str>,
    ) -> Result<bool, sqlx::Error>;
    async fn set_hold_data(
        &self,
        held: HeldBy<'_>,
        data: Option<&str>,
    ) -> Result<bool, sqlx::Error>;
    async fn reserve(
        &self,
        name: &str,
        owner: &str,
        since: i64,
        hold: i64,
    ) -> Result<Claim, sqlx::Error>;
    async fn abandon(&self, name: &str, owner: &str) -> Result<(), sqlx::Error>;
    async fn fenced_update(&self, update: &FencedUpdate, token: i64) -> Result<bool, sqlx::Error>;
    async fn join(&self, req: JoinRequest<'_>) -> Result<Joined, sqlx::Error>;
    async fn renew_hold(&self, held: HeldBy<'_>, ttl_us: i64) -> Result<bool, sqlx::Error>;
    async fn release_hold(&self, held: HeldBy<'_>) -> Result<bool, sqlx::Error>;
    async fn hold_info(&self, name: &str) -> Result<Option<HolderInfo>, sqlx::Error>;
}

/// The version a take's answer `row` (version, then the row's owner after the take) grants
/// `owner`.
///
/// # Errors
/// A protocol error (retryable) when the answer names another owner: an answer that is not
/// this statement's (a server connection out of step with its statements, which the caller
/// closes) is never taken for a grant; as reading the row otherwise.
#[cfg_attr(
    not(any(feature = "postgres", feature = "sqlite")),
    allow(dead_code, reason = "MySQL's take answers by affected rows")
)]
pub(crate) fn granted_to<R: sqlx::Row>(row: &R, owner: &str) -> Result<i64, sqlx::Error>
where
    usize: ColumnIndex<R>,
    for<'t> i64: Decode<'t, R::Database> + Type<R::Database>,
    for<'t> String: Decode<'t, R::Database> + Type<R::Database>,
{
    let found: String = row.try_get(1)?;
    if found != owner {
        let version = row.try_get::<i64, _>(0).ok();
        // Not expected of a working connection: leave a trail to what answered.
        tracing::warn!(%found, %owner, ?version, "the answer to a take names another owner: not a grant, connection closed");
        return Err(sqlx::Error::Protocol(
            "the answer to a take names another owner: not a grant".into(),
        ));
    }
    row.try_get(0)
}

/// A prepared-once statement of a dialect, ready for its arguments.
pub(crate) fn q<DB: sqlx::Database>(
    sql: &Arc<str>,
) -> sqlx::query::Query<'static, DB, DB::Arguments> {
    sqlx::query(AssertSqlSafe(sql.clone()))
}

#[async_trait]
impl<DB> CommonStatements for Common<DB>
where
    DB: Dialect,
    DB::Arguments: IntoArguments<DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'c> &'c sqlx::Pool<DB>: Executor<'c, Database = DB>,
    usize: ColumnIndex<DB::Row>,
    for<'t> &'t str: Encode<'t, DB> + Type<DB>,
    for<'t> i64: Encode<'t, DB> + Decode<'t, DB> + Type<DB>,
    for<'t> Option<i64>: Encode<'t, DB> + Decode<'t, DB> + Type<DB>,
    for<'t> Option<String>: Encode<'t, DB> + Type<DB>,
    for<'t> f64: Encode<'t, DB> + Type<DB>,
    for<'t> bool: Encode<'t, DB> + Type<DB>,
    for<'t> String: Encode<'t, DB> + Decode<'t, DB> + Type<DB>,
    for<'t> Vec<u8>: Encode<'t, DB> + Type<DB>,
{
    async fn peek(&self, name: &str) -> Result<Option<Peek>, sqlx::Error> {
        let row = self
            .conns
            .fetch_optional(q(&self.sql.peek).bind(name))
            .await?;
        row.map(|row| Peek::from_row(&row, |i| DB::owner(&row, i)))
            .transpose()
    }

    async fn renew(
        &self,
        name: &str,
        owner: &str,
        version: i64,
        ttl: i64,
    ) -> Result<bool, sqlx::Error> {
        let query = q(&self.sql.renew).bind(ttl).bind(name);
        let query = query.bind(owner).bind(version);
        Ok(DB::changed(&self.conns.execute(query).await?) == 1)
    }

    async fn release(&self, name: &str, owner: &str, version: i64) -> Result<bool, sqlx::Error> {
        let query = q(&self.sql.release).bind(name).bind(owner).bind(version);
        Ok(DB::changed(&self.conns.execute(query).await?) == 1)
    }

    async fn force_release(&self, name: &str) -> Result<bool, sqlx::Error> {
        let query = q(&self.sql.force).bind(name);
        Ok(DB::changed(&self.conns.execute(query).await?) == 1)
    }

    async fn list(&self, prefix: &str, limit: i64) -> Result<Vec<Listed>, sqlx::Error> {
        let query = q(&self.sql.list).bind(prefix).bind(prefix).bind(limit);
        let rows = query.fetch_all(self.conns.pool()).await?;
        rows.iter()
            .map(|row| Listed::from_row(row, DB::owner(row, 4)?))
            .collect()
    }

    async fn inspect(&self, name: &str) -> Result<Option<(Peek, Option<String>)>, sqlx::Error> {
        let row = self
            .conns
            .fetch_optional(q(&self.sql.inspect).bind(name))
            .await?;
        row.map(|row| {
            let peek = Peek::from_row(&row, |i| DB::owner(&row, i))?;
            Ok((peek, DB::owner(&row, 6)?))
        })
        .transpose()
    }

    fn has_data(&self) -> bool {
        self.sql.set_data.is_some()
    }

    async fn set_data(
        &self,
        name: &str,
        owner: &str,
        version: i64,
        data: Option<&str>,
    ) -> Result<bool, sqlx::Error> {
        // Without the column no hold has data to replace (the lease asks first).
        let Some(sql) = &self.sql.set_data else {
            return Ok(false);
        };
        let query = q(sql).bind(data.map(str::to_owned)).bind(name);
        let query = query.bind(owner).bind(version);
        Ok(DB::changed(&self.conns.execute(query).await?) == 1)
    }

    async fn set_hold_data(
        &self,
        held: HeldBy<'_>,
        data: Option<&str>,
    ) -> Result<bool, sqlx::Error> {
        if !kinds::ready(&self.holds, self.conns.pool()).await? {
            return Err(sqlx::Error::Configuration(
                "the holders table has no `data` column (a table of an earlier version): \
                 connect once with create_table on to add it"
                    .into(),
            ));
        }
        self.in_tx(held.name, async |tx, peek| {
            let set = tx.set_data(held, data, &peek).await?;
            Ok((set, set))
        })
        .await
    }

    async fn reserve(
        &self,
        name: &str,
        owner: &str,
        since: i64,
        hold: i64,
    ) -> Result<Claim, sqlx::Error> {
        let query = q(&self.sql.reserve).bind(since).bind(hold).bind(owner);
        let query = query.bind(name).bind(owner).bind(since);
        Ok(Claim::granted(
            DB::changed(&self.conns.execute(query).await?) == 1,
        ))
    }

    async fn abandon(&self, name: &str, owner: &str) -> Result<(), sqlx::Error> {
        let mut query = q(&self.sql.abandon);
        for _ in 0..5 {
            query = query.bind(owner);
        }
        let query = query.bind(name).bind(owner).bind(owner);
        self.conns.execute(query).await?;
        Ok(())
    }

    async fn fenced_update(&self, update: &FencedUpdate, token: i64) -> Result<bool, sqlx::Error> {
        Ok(DB::changed(
            &self
                .conns
                .execute(fenced_query::<DB>(update, token))
                .await?,
        ) == 1)
    }

    async fn join(&self, req: JoinRequest<'_>) -> Result<Joined, sqlx::Error> {
        if let Some(calls) = &self.routines {
            let query = self.join_query(&calls.join, &req);
            let row = self.call(query).await?;
            return Self::joined(&row, req.kind);
        }
        self.in_tx(req.name, async |tx, peek| {
            let joined = tx.join(req, peek).await?;
            let taken = matches!(joined, Joined::Taken(_));
            Ok((joined, taken))
        })
        .await
    }

    async fn renew_hold(&self, held: HeldBy<'_>, ttl_us: i64) -> Result<bool, sqlx::Error> {
        if let Some(calls) = &self.routines {
            let Some(token) = held.token else {
                return Ok(false);
            };
            let query = q(&calls.renew).bind(held.name).bind(held.owner);
            let query = query.bind(marker(held.kind)).bind(token).bind(ttl_us);
            return self.call_answer(query).await;
        }
        self.in_tx(held.name, async |tx, peek| {
            let renewed = tx.renew(held, ttl_us, &peek).await?;
            Ok((renewed, renewed))
        })
        .await
    }

    async fn release_hold(&self, held: HeldBy<'_>) -> Result<bool, sqlx::Error> {
        if let Some(calls) = &self.routines {
            let wake = match held.kind {
                LockKind::Permit { .. } => true,
                LockKind::Shared => calls.reads_queue && held.queued,
                _ => false,
            };
            let call = |sql: &Arc<str>| {
                let query = q(sql).bind(held.name).bind(held.owner);
                query.bind(marker(held.kind)).bind(held.token).bind(wake)
            };
            let shared = held.kind == LockKind::Shared && held.token.is_some();
            if let Some(steps) = calls.release_in_steps.as_ref().filter(|_| shared) {
                let row = self.call(call(steps).bind(1_i64)).await?;
                if let Some(answer) = sqlx::Row::try_get::<Option<i64>, _>(&row, 0)? {
                    return Ok(answer == 1);
                }
                // Left, and maybe the last holder: the name is freed (or handed over) now. The
                // hold is gone whatever this answers: a failed step 2 is tried again (a release
                // tried again from the start would find no hold), and after that the name
                // waits for its lease to end.
                let rest = retrying(
                    "the rest of a read hold's release",
                    RetryPolicy::TRANSIENT,
                    |_: &sqlx::Error| true,
                    || self.call(call(steps).bind(2_i64)),
                )
                .await;
                if let Err(err) = rest {
                    tracing::warn!(%err, name = held.name, "a read hold left, but the name stays held until its lease ends");
                }
                return Ok(true);
            }
            return self.call_answer(call(&calls.release)).await;
        }
        self.in_tx(held.name, async |tx, peek| {
            let released = tx.release(held, &peek).await?;
            Ok((released, released))
        })
        .await
    }

    async fn hold_info(&self, name: &str) -> Result<Option<HolderInfo>, sqlx::Error> {
        kinds::ready(&self.holds, self.conns.pool()).await?;
        let info = self.holds.info();
        let query = q(info).bind(name).bind(name);
        let Some(row) = self.conns.fetch_optional(query).await? else {
            return Ok(None);
        };
        Ok(Some(HolderInfo {
            owner: DB::owner(&row, 0)?.unwrap_or_default(),
            token: sqlx::Row::try_get(&row, 1)?,
            remaining_us: sqlx::Row::try_get(&row, 2)?,
            count: sqlx::Row::try_get(&row, 3)?,
            data: DB::owner(&row, 4)?,
        }))
    }
}

impl<DB> Common<DB>
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
    /// The row a call of a routine ([`Calls`]) answers, the holders table set up first.
    async fn call(
        &self,
        query: sqlx::query::Query<'static, DB, DB::Arguments>,
    ) -> Result<DB::Row, sqlx::Error> {
        kinds::ready(&self.holds, self.conns.pool()).await?;
        // `fetch_all`: MySQL answers a CALL with the row, then the call's status.
        let rows = self.conns.fetch_all(query).await?;
        rows.into_iter().next().ok_or(sqlx::Error::RowNotFound)
    }

    /// The call `call` of the join routine (see [`Calls::join`]) for `req`, with its
    /// arguments bound; a call with more arguments binds the rest.
    pub(crate) fn join_query(
        &self,
        call: &Arc<str>,
        req: &JoinRequest<'_>,
    ) -> sqlx::query::Query<'static, DB, DB::Arguments> {
        let query = q(call).bind(req.name).bind(req.owner);
        let query = query.bind(marker(req.kind)).bind(req.ttl_us);
        let query = query.bind(kinds::permits_of(req.kind));
        match &self.routines {
            Some(calls) if calls.queue => query.bind(req.queue_us),
            _ => query,
        }
    }

    /// What the row a join routine answered says for a request of `kind`.
    pub(crate) fn joined(row: &DB::Row, kind: LockKind) -> Result<Joined, sqlx::Error> {
        let peek = Peek::from_row(row, |i| DB::owner(row, i))?;
        let taken = sqlx::Row::try_get(row, 6)?;
        let first_end = sqlx::Row::try_get(row, 7)?;
        Ok(Joined::from_server(peek, kind, taken, first_end))
    }

    /// Whether a renewal's or a release's call answered 1.
    async fn call_answer(
        &self,
        query: sqlx::query::Query<'static, DB, DB::Arguments>,
    ) -> Result<bool, sqlx::Error> {
        let row = self.call(query).await?;
        Ok(sqlx::Row::try_get::<i64, _>(&row, 0)? == 1)
    }

    /// Runs `body` in a transaction of the holders on a kept connection, after locking the
    /// lock row of `name`; `body` answers its result and whether to commit (else the
    /// transaction rolls back: a refused acquisition writes nothing). A failed or cancelled
    /// transaction closes its connection (see [`Hot::finish`](crate::hot::Hot::finish)), and
    /// the server rolls it back.
    async fn in_tx<T>(
        &self,
        name: &str,
        body: impl AsyncFnOnce(&mut Tx<'_, DB>, Peek) -> Result<(T, bool), sqlx::Error>,
    ) -> Result<T, sqlx::Error> {
        kinds::ready(&self.holds, self.conns.pool()).await?;
        let mut hot = self.conns.get().await?;
        let result = async {
            let mut tx = sqlx::Connection::begin_with(hot.conn(), DB::BEGIN).await?;
            let mut statements = Tx {
                conn: &mut *tx,
                sql: &self.holds.sql,
            };
            let peek = statements.lock(name).await?;
            let (answer, commit) = body(&mut statements, peek).await?;
            if commit {
                tx.commit().await?;
            } else {
                tx.rollback().await?;
            }
            Ok(answer)
        }
        .await;
        hot.finish(result)
    }
}

/// The statement of a [`FencedUpdate`] with `token`, bound (see [`FencedUpdate::sql`] for the
/// order of the arguments).
pub(crate) fn fenced_query<DB>(
    update: &FencedUpdate,
    token: i64,
) -> sqlx::query::Query<'static, DB, DB::Arguments>
where
    DB: Dialect,
    for<'t> i64: Encode<'t, DB> + Type<DB>,
    for<'t> Option<i64>: Encode<'t, DB> + Type<DB>,
    for<'t> f64: Encode<'t, DB> + Type<DB>,
    for<'t> bool: Encode<'t, DB> + Type<DB>,
    for<'t> String: Encode<'t, DB> + Type<DB>,
    for<'t> Vec<u8>: Encode<'t, DB> + Type<DB>,
{
    let sql = update.sql(DB::QUOTE, DB::param);
    let mut query = sqlx::query::<DB>(AssertSqlSafe(sql));
    for (_, value) in &update.set {
        query = bind_value!(query, value);
    }
    query = query.bind(token);
    query = bind_value!(query, &update.key);
    query.bind(token)
}

/// Prepares `statements` on a pooled connection, so that a table of the wrong shape is
/// reported at connect (naming `table`) rather than at the first lock.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) async fn prepare_all<DB>(
    pool: &sqlx::Pool<DB>,
    statements: &[&Arc<str>],
    table: &str,
) -> distlock_core::Result<()>
where
    DB: sqlx::Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    // Closed, not given back, if cancelled mid-way (see `InUse`).
    let mut conn = crate::pool::InUse::acquire(pool)
        .await
        .map_err(|e| shape_err(table, e))?;
    for statement in statements {
        conn.conn()
            .prepare(AssertSqlSafe((*statement).clone()).into_sql_str())
            .await
            .map_err(|e| shape_err(table, e))?;
    }
    drop(conn.done());
    Ok(())
}

#[cfg(feature = "postgres")]
impl Dialect for sqlx::Postgres {
    const QUOTE: char = '"';
    const BEGIN: &'static str = "BEGIN ISOLATION LEVEL READ COMMITTED";

    fn param(n: usize) -> String {
        format!("${n}")
    }

    fn changed(result: &Self::QueryResult) -> u64 {
        result.rows_affected()
    }

    fn owner(row: &Self::Row, index: usize) -> Result<Option<String>, sqlx::Error> {
        sqlx::Row::try_get(row, index)
    }
}

#[cfg(feature = "mysql")]
impl Dialect for sqlx::MySql {
    const QUOTE: char = '`';
    const BEGIN: &'static str = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION";

    fn param(_: usize) -> String {
        "?".to_owned()
    }

    fn changed(result: &Self::QueryResult) -> u64 {
        result.rows_affected()
    }

    fn owner(row: &Self::Row, index: usize) -> Result<Option<String>, sqlx::Error> {
        let bytes: Option<Vec<u8>> = sqlx::Row::try_get(row, index)?;
        Ok(bytes.map(|b| String::from_utf8_lossy(&b).into_owned()))
    }
}

#[cfg(feature = "sqlite")]
impl Dialect for sqlx::Sqlite {
    const QUOTE: char = '"';
    const BEGIN: &'static str = "BEGIN IMMEDIATE";

    fn param(n: usize) -> String {
        format!("?{n}")
    }

    fn changed(result: &Self::QueryResult) -> u64 {
        result.rows_affected()
    }

    fn owner(row: &Self::Row, index: usize) -> Result<Option<String>, sqlx::Error> {
        sqlx::Row::try_get(row, index)
    }
}

#[cfg(all(test, feature = "sqlite"))]
mod tests {
    use sqlx::Connection;

    use super::*;

    /// A take's answer grants only the owner it names: an answer naming another owner (not
    /// this statement's) is a retryable protocol error, never a token.
    #[tokio::test]
    async fn a_take_answer_grants_only_the_owner_it_names() {
        let mut conn = sqlx::SqliteConnection::connect("sqlite::memory:")
            .await
            .unwrap();
        let row = sqlx::query("SELECT 7, 'me'")
            .fetch_one(&mut conn)
            .await
            .unwrap();
        assert_eq!(granted_to(&row, "me").unwrap(), 7);
        let taken = granted_to(&row, "someone else");
        assert!(matches!(taken, Err(sqlx::Error::Protocol(_))), "{taken:?}");
        let mapped = crate::error::map_err("acquire", taken.unwrap_err());
        assert!(mapped.is_retryable(), "{mapped}");
    }
}
