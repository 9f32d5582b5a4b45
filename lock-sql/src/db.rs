//! What every database dialect implements: the lock table's statements, executed.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use distlock_core::LockKind;
use distlock_core::backend::unpoisoned;

use crate::backend::SqlPool;
use crate::dialect::CommonStatements;
use crate::fence::FencedUpdate;
use crate::kinds::{self, HeldBy, HolderInfo, JoinRequest, Joined};
use crate::renew::Renewal;
use crate::wake::{ServerWait, Subscription, WaitFor};

/// A row of the lock table as the attempt needs it.
#[derive(Debug)]
pub(crate) struct Peek {
    /// The owner column (possibly of an expired lease).
    pub(crate) owner: Option<String>,
    /// The version column.
    pub(crate) version: i64,
    /// Remaining lease in microseconds when a live holder exists.
    pub(crate) remaining_us: Option<i64>,
    /// The waiter holding the reservation (possibly expired).
    pub(crate) next_owner: Option<String>,
    /// Its age (the version it first saw busy).
    pub(crate) next_since: Option<i64>,
    /// Remaining reservation in microseconds when it is live.
    pub(crate) next_remaining_us: Option<i64>,
}

impl Peek {
    /// Reads `owner, version, remaining_us, next_owner, next_since, next_remaining_us` from a
    /// row; `owner` reads an owner column (by index) as text.
    pub(crate) fn from_row<R: sqlx::Row>(
        row: &R,
        owner: impl Fn(usize) -> Result<Option<String>, sqlx::Error>,
    ) -> Result<Self, sqlx::Error>
    where
        usize: sqlx::ColumnIndex<R>,
        for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    {
        Ok(Self {
            owner: owner(0)?,
            version: row.try_get(1)?,
            remaining_us: row.try_get(2)?,
            next_owner: owner(3)?,
            next_since: row.try_get(4)?,
            next_remaining_us: row.try_get(5)?,
        })
    }
}

/// What a queued permit waiter reads between its joins ([`Db::queued_look`]).
#[derive(Debug)]
pub(crate) struct QueuedLook {
    /// The permit a release handed the waiter: its token, and its remaining lease (µs) when
    /// read.
    pub(crate) handed: Option<(i64, i64)>,
    /// How many live waiters are queued ahead of it; `None`: its own place is not live.
    pub(crate) ahead: Option<i64>,
    /// Whether the live holders and the waiters ahead leave a permit (one freed without a
    /// hand-over: an expired lease, a forced release, a client of an earlier version): the
    /// waiter joins at once rather than at its place's renewal.
    pub(crate) free: bool,
    /// The tokens of the other live holders that hold a wake lock, oldest first: the waiter
    /// `ahead` places from the head waits on the server for the release of the one at that
    /// place (MySQL).
    pub(crate) armed: Vec<i64>,
}

/// A live holder as [`Db::list`] reports it.
#[derive(Debug)]
pub(crate) struct Listed {
    /// The lock name.
    pub(crate) name: String,
    /// The owner column.
    pub(crate) owner: String,
    /// The version column: the holder's fencing token.
    pub(crate) version: i64,
    /// Remaining lease in microseconds.
    pub(crate) remaining_us: i64,
    /// The holder data of an exclusive hold (the `data` column).
    pub(crate) data: Option<String>,
}

impl Listed {
    /// Reads `name, owner, version, remaining_us` from a row, with `data` read by the caller
    /// (column 4, as its dialect reads text kept as bytes).
    pub(crate) fn from_row<R: sqlx::Row>(row: &R, data: Option<String>) -> Result<Self, sqlx::Error>
    where
        usize: sqlx::ColumnIndex<R>,
        for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
        for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    {
        Ok(Self {
            name: row.try_get(0)?,
            owner: row.try_get(1)?,
            version: row.try_get(2)?,
            remaining_us: row.try_get(3)?,
            data,
        })
    }
}

/// The answer to a reservation claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Claim {
    /// An older waiter holds a live reservation.
    Refused,
    /// The reservation is ours.
    Granted,
    /// The reservation is ours and the lock was free when it was written: a release came
    /// between the caller's read and the claim, and notified nobody (backends with events).
    GrantedFree,
}

impl Claim {
    /// The answer of a backend that cannot tell whether the lock is free: granted or not.
    pub(crate) fn granted(granted: bool) -> Self {
        if granted {
            Self::Granted
        } else {
            Self::Refused
        }
    }
}

/// One database's statements. Every method is a single statement (a round trip), except
/// where noted, and returns sqlx's error for the caller to classify.
#[async_trait]
pub(crate) trait Db: Send + Sync + fmt::Debug + 'static {
    /// Whether releases are pushed to waiters (LISTEN/NOTIFY). The default: no, they poll.
    fn has_events(&self) -> bool {
        false
    }

    /// Whether a release hands the lock to the exclusive waiter holding the reservation (the
    /// row becomes the waiter's, with the next version and the ttl it reserved with) and
    /// tells it so ([`crate::wake::WakeSignal::Handed`]). The default: no, the release frees it.
    fn hands_over(&self) -> bool {
        false
    }

    /// Whether a release of a permit that leaves the semaphore one short of full hands that
    /// permit to the permit waiter holding the reservation (a holder row of the waiter's, with
    /// the next version and the ttl it reserved with, stored negated) and tells it so
    /// ([`crate::wake::WakeSignal::Handed`]). The default: no, the release wakes that waiter,
    /// which then joins.
    fn hands_permits_over(&self) -> bool {
        false
    }

    /// Whether an exclusive release hands a read hold to the shared waiter holding the
    /// reservation (the row marked shared with the next version, a holder row of the
    /// waiter's with that token and the ttl it reserved with, stored negated) and tells it so
    /// ([`crate::wake::WakeSignal::Handed`]). The default: no, the release wakes that waiter,
    /// which then joins.
    fn hands_reads_over(&self) -> bool {
        false
    }

    /// The remaining lease (µs) of `owner`'s live read hold `token` of `name`, read now;
    /// `None`: no such hold. Where a writer's release hands read holds over
    /// ([`Self::hands_reads_over`]), the reader told so dates its lease from this read,
    /// unless a recent join of its that was refused does: nothing else it sent before bounds
    /// when the release's statement ran (a read sent while that release commits still finds
    /// the writer; a claim of the reservation sent then waits for that commit, and is
    /// granted). The default (no such hand-overs): `None`, the reader's join takes what it
    /// was handed.
    async fn hold_left(
        &self,
        _name: &str,
        _owner: &str,
        _token: i64,
    ) -> Result<Option<i64>, sqlx::Error> {
        Ok(None)
    }

    /// Whether permit waiters queue: a refused permit join with a queue lease
    /// ([`JoinRequest::queue_us`](crate::kinds::JoinRequest::queue_us)) puts the waiter in
    /// the name's queue (each join renews its place), and a release hands each permit it frees
    /// to the first waiter in it and tells it so ([`crate::wake::WakeSignal::Handed`]),
    /// waking nobody else; the release of an abandoned attempt's holds by owner
    /// ([`Self::release_hold`] without a token) takes its place for good. The default: no.
    fn queues_permits(&self) -> bool {
        false
    }

    /// The atomic acquire: takes the row when free, expired, or already this owner's, and not
    /// reserved by another waiter; bumps the version. Returns the new version, only from an
    /// answer that names `owner` as the row's owner (see [`crate::dialect::granted_to`]).
    ///
    /// `wake_waiters`: the taker may hold the waiter reservation, which a take clears; backends
    /// with events then tell the other waiters in the same statement, so that the next one
    /// claims it.
    async fn take(
        &self,
        name: &str,
        owner: &str,
        ttl_us: i64,
        wake_waiters: bool,
    ) -> Result<Option<i64>, sqlx::Error>;

    /// The statements this database runs as every other does.
    fn common(&self) -> &dyn CommonStatements;

    /// Reads the row.
    async fn peek(&self, name: &str) -> Result<Option<Peek>, sqlx::Error> {
        self.common().peek(name).await
    }

    /// A queued permit waiter's read ([`Db::queues_permits`]) where nothing tells it that a
    /// release handed it a permit (MySQL): whether one did, and its place in the queue. No
    /// row is locked (MySQL takes the waiter's wake lock with a handed permit); the waiter's
    /// join still renews its place now and then. `None`: no such read here (PostgreSQL's
    /// release notifies the waiter).
    async fn queued_look(
        &self,
        _name: &str,
        _owner: &str,
        _kind: LockKind,
    ) -> Result<Option<QueuedLook>, sqlx::Error> {
        Ok(None)
    }

    /// Claims (or keeps) the waiter reservation unless an older waiter holds a live one;
    /// `ttl_us`: the lease an exclusive waiter asks for, should a release hand it the lock
    /// ([`Db::hands_over`]), or a permit waiter's negated ([`Db::hands_permits_over`]).
    async fn reserve(
        &self,
        name: &str,
        owner: &str,
        since: i64,
        hold_us: i64,
        ttl_us: Option<i64>,
    ) -> Result<Claim, sqlx::Error> {
        let _ = ttl_us;
        self.common().reserve(name, owner, since, hold_us).await
    }

    /// Owner-and-version-checked extension of a live lease.
    async fn renew(
        &self,
        name: &str,
        owner: &str,
        version: i64,
        ttl_us: i64,
    ) -> Result<bool, sqlx::Error> {
        self.common().renew(name, owner, version, ttl_us).await
    }

    /// The batched [`Self::renew`] of many leases (see [`crate::renew`]): one statement (on
    /// MySQL a second one when some were refused); whether each was renewed, in order.
    async fn renew_many(&self, batch: &[Renewal<'_>]) -> Result<Vec<bool>, sqlx::Error>;

    /// The most leases one [`Self::renew_many`] takes (see [`crate::renew`]).
    fn max_batch(&self) -> usize;

    /// Whether [`Self::renew_holds`] renews a batch of shared holds and permits in one
    /// call (PostgreSQL's function, MySQL's procedure); otherwise each renews itself
    /// ([`Self::renew_hold`]).
    fn batches_holds(&self) -> bool {
        false
    }

    /// The batched [`Self::renew_hold`] of shared holds and permits, sorted by name (at most
    /// [`Self::max_batch`], each with its ttl): whether each was renewed, in order. Only where
    /// [`Self::batches_holds`]; the default renews them one after another.
    async fn renew_holds(&self, batch: &[(HeldBy<'_>, i64)]) -> Result<Vec<bool>, sqlx::Error> {
        each_hold(self, batch).await
    }

    /// Owner-and-version-checked release of a live lease (wakes waiters).
    async fn release(&self, name: &str, owner: &str, version: i64) -> Result<bool, sqlx::Error> {
        self.common().release(name, owner, version).await
    }

    /// [`Self::release`] of an exclusive lease by another than the lease itself (an operator's
    /// [`Self::release_token`], maybe in another process): the same statement and wake-up,
    /// without what only the lease's own release may use (MySQL: the connection pinned with
    /// the lease, which a wrong version must not take away from it). The default:
    /// [`Self::release`].
    async fn release_other(
        &self,
        name: &str,
        owner: &str,
        version: i64,
    ) -> Result<bool, sqlx::Error> {
        self.release(name, owner, version).await
    }

    /// Releases the one live hold of `name` whose owner is `owner` and whose token is
    /// `token`, of whatever kind, as its holder's release would (its waiters are woken); from
    /// any process ([`LockBackend::release_hold`](distlock_core::LockBackend::release_hold)).
    /// Whether that hold was live and is released now.
    ///
    /// An exclusive hold is the lock row (owner column, version column: the token): the
    /// owner-and-version-checked release statement ([`Self::release_other`]). Otherwise, if
    /// the row carries a live marker, the hold is a row of the holders table (owner, token):
    /// the release of a shared hold or permit with that token ([`Self::release_hold`], one
    /// transaction that locks the lock row and checks the marker, the owner, the token and
    /// the holder's expiry). A token is given once (every acquisition raises the version, or
    /// draws from a readers' range below it), so one hold at most has this owner and token,
    /// and each step is atomic on the server. So
    /// is the answer: an exclusive hold that the first step did not find live was over, or
    /// not taken yet, then; refusing it is the answer of that moment.
    async fn release_token(
        &self,
        name: &str,
        owner: &str,
        token: i64,
    ) -> Result<bool, sqlx::Error> {
        if kinds::marked(owner).is_some() {
            // The lock row's owner while shared holds or permits live, and its version at or
            // above the latest holder's token: never an owner of a hold, and the release
            // statement would free the row, ending every holder at once.
            return Ok(false);
        }
        if self.release_other(name, owner, token).await? {
            return Ok(true);
        }
        // Read first, so that a name held exclusively (or free) needs no transaction, nor
        // the holders table. The transaction checks the marker again under the row lock.
        let kind = self
            .peek(name)
            .await?
            .as_ref()
            .and_then(kinds::held_kind)
            .filter(|kind| *kind != LockKind::Exclusive);
        let Some(kind) = kind else {
            return Ok(false);
        };
        let held = HeldBy {
            name,
            owner,
            kind,
            token: Some(token),
            // Another's hold: whether it left a place is not known here.
            queued: true,
        };
        self.release_hold(held).await
    }

    /// Drops this owner's lock and reservation, whatever the version.
    async fn abandon(&self, name: &str, owner: &str) -> Result<(), sqlx::Error> {
        self.common().abandon(name, owner).await
    }

    /// Frees the lock whoever holds it; the version is kept.
    async fn force_release(&self, name: &str) -> Result<bool, sqlx::Error> {
        self.common().force_release(name).await
    }

    /// The live holders of names starting with `prefix` (`""`: all), by name, at most
    /// `limit`. One statement on the pool (an operator's read, not a hot path).
    async fn list(&self, prefix: &str, limit: i64) -> Result<Vec<Listed>, sqlx::Error> {
        self.common().list(prefix, limit).await
    }

    /// `UPDATE table SET ..., fence = token WHERE key = ? AND (fence IS NULL OR fence <= token)`.
    async fn fenced_update(&self, update: &FencedUpdate, token: i64) -> Result<bool, sqlx::Error> {
        self.common().fenced_update(update, token).await
    }

    /// A shared or permit acquisition: one transaction that locks the row, checks the
    /// holders and joins them (see [`crate::kinds`]).
    async fn join(&self, req: JoinRequest<'_>) -> Result<Joined, sqlx::Error> {
        self.common().join(req).await
    }

    /// Owner-and-token-checked extension of a live shared hold or permit (one transaction).
    async fn renew_hold(&self, held: HeldBy<'_>, ttl_us: i64) -> Result<bool, sqlx::Error> {
        self.common().renew_hold(held, ttl_us).await
    }

    /// Release of a live shared hold or permit (one transaction; the last holder frees the
    /// row and wakes waiters). Without a token: the cleanup of an abandoned attempt.
    async fn release_hold(&self, held: HeldBy<'_>) -> Result<bool, sqlx::Error> {
        self.common().release_hold(held).await
    }

    /// The latest live holder of a shared or permit name and how many hold it.
    async fn hold_info(&self, name: &str) -> Result<Option<HolderInfo>, sqlx::Error> {
        self.common().hold_info(name).await
    }

    /// The row with the holder data, read in one statement (an operator's read).
    async fn inspect(&self, name: &str) -> Result<Option<(Peek, Option<String>)>, sqlx::Error> {
        self.common().inspect(name).await
    }

    /// Whether holds carry data: the lock table has the `data` column.
    fn has_data(&self) -> bool {
        self.common().has_data()
    }

    /// Owner-and-version-checked replacement of the holder data of a live exclusive lease
    /// (one statement); `None` clears it. Whether it was replaced.
    async fn set_data(
        &self,
        name: &str,
        owner: &str,
        version: i64,
        data: Option<&str>,
    ) -> Result<bool, sqlx::Error> {
        self.common().set_data(name, owner, version, data).await
    }

    /// Owner-and-token-checked replacement of the holder data of a live shared hold or permit
    /// (one transaction, as a renewal); `None` clears it. Whether it was replaced.
    async fn set_hold_data(
        &self,
        held: HeldBy<'_>,
        data: Option<&str>,
    ) -> Result<bool, sqlx::Error> {
        self.common().set_hold_data(held, data).await
    }

    /// A wake-up subscription for `name`, for backends with events; `claims`: the waiter
    /// claims the reservation, so a hand-over to another wakes it.
    fn subscribe(&self, name: &str, owner: &str, claims: bool) -> Option<Subscription> {
        let _ = (name, owner, claims);
        None
    }

    /// A wait on the server for the release of `name` by its holder with `version` (an
    /// exclusive holder's, or a reader's or a permit holder's token), whose lease has
    /// `remaining`, for backends that wake waiters that way (MySQL's wake locks), for
    /// `purpose` (see [`WaitFor`]). `None`: none is possible now (no such backend, or its
    /// wait connections are all in use); the waiter polls.
    fn wait_release(
        &self,
        name: &str,
        owner: &str,
        version: i64,
        remaining: Duration,
        purpose: WaitFor,
    ) -> Option<ServerWait> {
        let _ = (name, owner, version, remaining, purpose);
        None
    }

    /// `owner` found itself the holder of `name` with `version` by reading the row (a
    /// hand-over whose wake-up it missed): lets the next waiter wait on the server for its
    /// release (MySQL: takes its wake lock, as a take does).
    async fn arm(&self, name: &str, owner: &str, version: i64) {
        let _ = (name, owner, version);
    }

    /// The lease of `owner` on `name` ended without a release (lost, or its guard dropped):
    /// lets go of whatever the take kept for it (MySQL: the connection holding its wake lock).
    fn forget(&self, name: &str, owner: &str) {
        let _ = (name, owner);
    }

    /// The typed pool.
    fn pool(&self) -> SqlPool;
}

/// Server-side ids of the connections a pool opened.
#[derive(Debug, Default)]
pub(crate) struct Sessions(Mutex<BTreeSet<i64>>);

impl Sessions {
    #[cfg_attr(
        not(any(feature = "postgres", feature = "mysql")),
        allow(dead_code, reason = "used by the server dialects only")
    )]
    pub(crate) fn add(&self, id: i64) {
        unpoisoned(&self.0).insert(id);
    }

    pub(crate) fn list(&self) -> Vec<i64> {
        unpoisoned(&self.0).iter().copied().collect()
    }
}

/// Binds one [`SqlValue`](crate::SqlValue) to a query of any of the databases.
macro_rules! bind_value {
    ($query:expr, $value:expr) => {
        match $value {
            $crate::SqlValue::Null => $query.bind(None::<i64>),
            $crate::SqlValue::Int(v) => $query.bind(*v),
            $crate::SqlValue::Float(v) => $query.bind(*v),
            $crate::SqlValue::Bool(v) => $query.bind(*v),
            $crate::SqlValue::Text(v) => $query.bind(v.clone()),
            $crate::SqlValue::Bytes(v) => $query.bind(v.clone()),
        }
    };
}
pub(crate) use bind_value;

/// [`Db::renew_hold`] of each of `batch`, one after another: whether each was renewed.
pub(crate) async fn each_hold<D: Db + ?Sized>(
    db: &D,
    batch: &[(HeldBy<'_>, i64)],
) -> Result<Vec<bool>, sqlx::Error> {
    let mut renewed = Vec::with_capacity(batch.len());
    for &(held, ttl_us) in batch {
        renewed.push(db.renew_hold(held, ttl_us).await?);
    }
    Ok(renewed)
}
