//! What wakes a waiter: PostgreSQL's LISTEN/NOTIFY (one listening connection per backend,
//! its wake-ups sent to the waiters as [`WakeSignal`]s), MySQL/MariaDB's user-level locks (a
//! [`ServerWait`] of the waiter at the head of the queue on the holder's wake lock; the
//! connections that hold and wait on wake locks are kept by `WakeLocks`), or polling.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
#[cfg(feature = "mysql")]
use std::time::{Duration, Instant};

#[cfg(feature = "mysql")]
use distlock_core::backend::unpoisoned;
#[cfg(feature = "mysql")]
use futures::future::{self, Either};
#[cfg(feature = "mysql")]
use sqlx::pool::PoolConnection;
#[cfg(feature = "mysql")]
use sqlx::{AssertSqlSafe, Executor, Row};
use tokio::sync::watch;
#[cfg(feature = "mysql")]
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};

#[cfg(feature = "mysql")]
use crate::dialect::q;
#[cfg(feature = "mysql")]
use crate::pool::{IdleLimit, InUse, checked, ping};

/// Per-name wake-ups fed by a notification listener. A wake-up may target one waiter (the
/// holder of the reservation): then only that waiter's task wakes, so a release neither
/// stampedes the waiters nor wakes any but the next one.
#[derive(Debug, Default)]
pub(crate) struct Notifier {
    /// Name, then owner (unique per attempt), to the attempt's wake-ups.
    names: Mutex<Names>,
}

/// What the last wake-up said to one waiter. A send always wakes the receiver, equal value
/// or not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WakeSignal {
    /// Something changed on the name: look again.
    Changed,
    /// A release addressed to this waiter (it holds the reservation): take without reading.
    Released,
    /// The release handed the lock to this waiter, with this version: it holds it already.
    Handed(i64),
    /// The release handed the lock to another waiter, whose reservation it used up: claim
    /// the reservation (no need to read first).
    Vacant,
}

/// What a waiter's channel holds: the last wake-up, and the version of the last hand-over to
/// this waiter, which later wake-ups keep (see [`Subscription`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Wake {
    signal: WakeSignal,
    handed: Option<i64>,
    /// Whether the waiter claims the reservation a hand-over to another used up (else it
    /// waits in a queue, and such a hand-over is nothing to it: it is not woken).
    claims: bool,
}

impl Wake {
    /// `signal`, keeping the hand-over of `self`.
    fn then(self, signal: WakeSignal) -> Self {
        Self { signal, ..self }
    }
}

pub(crate) type Names = HashMap<String, HashMap<String, watch::Sender<Wake>>>;

#[cfg_attr(
    not(feature = "postgres"),
    allow(dead_code, reason = "LISTEN/NOTIFY is PostgreSQL's")
)]
impl Notifier {
    fn names(&self) -> std::sync::MutexGuard<'_, Names> {
        self.names.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `claims`: the waiter claims the reservation (see [`WakeSignal::Vacant`]); a queued
    /// permit waiter does not.
    pub(crate) fn subscribe(
        self: &Arc<Self>,
        name: &str,
        owner: &str,
        claims: bool,
    ) -> Subscription {
        let rx = self
            .names()
            .entry(name.to_owned())
            .or_default()
            .entry(owner.to_owned())
            .or_insert_with(|| {
                watch::Sender::new(Wake {
                    signal: WakeSignal::Changed,
                    handed: None,
                    claims,
                })
            })
            .subscribe();
        Subscription {
            rx,
            handed_seen: None,
            notifier: self.clone(),
            name: name.to_owned(),
            owner: owner.to_owned(),
        }
    }

    /// Wakes the waiters of `name` as `note` says: a release wakes only its target (if it
    /// waits here), a hand-over its target and every other waiter that claims the
    /// reservation (whose turn to reserve it is; [`Note::HandedAlone`]: only its target),
    /// anything else every waiter.
    pub(crate) fn wake(&self, name: &str, note: Note<'_>) {
        let names = self.names();
        let Some(owners) = names.get(name) else {
            return;
        };
        match note {
            Note::Changed => owners.values().for_each(wake_one),
            Note::Released(target) => {
                if let Some(tx) = owners.get(target) {
                    tx.send_modify(|w| *w = w.then(WakeSignal::Released));
                }
            }
            Note::Handed(target, version) | Note::HandedAlone(target, version) => {
                let others = matches!(note, Note::Handed(..));
                for (owner, tx) in owners {
                    tx.send_if_modified(|w| {
                        if owner == target {
                            *w = Wake {
                                signal: WakeSignal::Handed(version),
                                handed: Some(version),
                                claims: w.claims,
                            };
                        } else if w.claims && others {
                            *w = w.then(WakeSignal::Vacant);
                        } else {
                            return false;
                        }
                        true
                    });
                }
            }
        }
    }

    /// After a listener reconnect, events may have been missed: wake everyone.
    pub(crate) fn wake_all(&self) {
        self.names()
            .values()
            .flat_map(HashMap::values)
            .for_each(wake_one);
    }
}

pub(crate) fn wake_one(tx: &watch::Sender<Wake>) {
    tx.send_modify(|w| *w = w.then(WakeSignal::Changed));
}

/// A waiter's view of the wake-ups of one name.
///
/// A channel keeps only its last value, so a wake-up that came after a hand-over to this
/// waiter and before the waiter looked (a later hand-over to another waiter, a release that
/// woke everyone) would hide the hand-over: the waiter, holding the lock or a permit without
/// knowing, would wait on (a permit waiter claims the reservation again) until it next
/// reads. So the channel keeps the last hand-over's version beside the last wake-up, and a
/// hand-over this subscription has not reported yet is reported first.
#[derive(Debug)]
pub(crate) struct Subscription {
    rx: watch::Receiver<Wake>,
    /// The version of the last hand-over reported.
    handed_seen: Option<i64>,
    notifier: Arc<Notifier>,
    name: String,
    owner: String,
}

impl Subscription {
    /// Marks every wake-up so far as seen: call before a poll's statement is sent. Returns the
    /// version of a hand-over among them not reported before, which the poll must not miss.
    pub(crate) fn mark_seen(&mut self) -> Option<i64> {
        let wake = *self.rx.borrow_and_update();
        self.unreported(wake)
    }

    fn unreported(&mut self, wake: Wake) -> Option<i64> {
        let new = wake.handed.filter(|&v| self.handed_seen != Some(v))?;
        self.handed_seen = Some(new);
        Some(new)
    }

    /// Resolves on the next wake-up for this waiter after [`mark_seen`](Self::mark_seen): a
    /// hand-over not reported yet, else the last wake-up (a hand-over reported before reads
    /// as [`WakeSignal::Changed`]: look again).
    pub(crate) async fn changed(&mut self) -> WakeSignal {
        if self.rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
        let wake = *self.rx.borrow_and_update();
        match (self.unreported(wake), wake.signal) {
            (Some(version), _) => WakeSignal::Handed(version),
            (None, WakeSignal::Handed(_)) => WakeSignal::Changed,
            (None, signal) => signal,
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut names = self.notifier.names();
        if let Some(owners) = names.get_mut(&self.name) {
            owners.remove(&self.owner);
            if owners.is_empty() {
                names.remove(&self.name);
            }
        }
    }
}

/// What ended a [`ServerWait`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(
    not(feature = "mysql"),
    allow(dead_code, reason = "server waits are MySQL's")
)]
pub(crate) enum Woken {
    /// The holder gave its wake lock up: it released (or its connection closed).
    Released,
    /// The holder's release handed the lock to the waiter, with this version: the waiter
    /// holds it, and the wait's connection now holds the waiter's own wake lock for the next
    /// waiter (kept with the lease until its release).
    Handed {
        /// The version (fencing token) of the waiter's hold.
        version: i64,
        /// The lease ends after this instant (the read was sent before it learnt what was
        /// left of the lease).
        until: std::time::Instant,
    },
    /// Nobody held the wake lock when the wait began: this holder has none (or released
    /// just before). Waiting on it again would return at once.
    NotArmed,
    /// The wait's bound passed with the wake lock still held.
    TimedOut,
    /// The wait failed (connection lost, query killed) or could not start.
    Failed,
}

/// What a wait on the server is for ([`crate::db::Db::wait_release`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WaitFor {
    /// An exclusive waiter at the head, for an exclusive holder or the latest reader: the
    /// wait lasts the holder's lease (at most a cap), and with hand-overs a wake-up reads
    /// whether the release made the waiter the holder (then its connection may stay with the
    /// lease: cancel it, never leave it running).
    Handover,
    /// Any other wait of a waiter first in its line (a reader at the head, a queued permit
    /// waiter): a second at most, keeping nothing.
    First,
}

/// A wait that runs on the server in a task of its own, for the release of the holder with
/// `version`: cancelling the future that awaits it ([`ServerWait::woken`]) leaves the wait
/// running, so the next `changed()` picks it up again. Dropping the `ServerWait` before the
/// wait ended cancels it on the server (the task kills its statement).
#[derive(Debug)]
pub(crate) struct ServerWait {
    version: i64,
    purpose: WaitFor,
    started: std::time::Instant,
    task: tokio::task::JoinHandle<Woken>,
    /// Dropped (with the `ServerWait`, or by [`ServerWait::stop`]) to tell the task to stop
    /// the wait on the server.
    cancel: Option<tokio::sync::oneshot::Sender<()>>,
}

#[cfg_attr(
    not(feature = "mysql"),
    allow(dead_code, reason = "server waits are MySQL's")
)]
impl ServerWait {
    /// A wait for `purpose` run by `task`, which stops when `cancel`'s receiver resolves.
    pub(crate) fn new(
        version: i64,
        purpose: WaitFor,
        task: tokio::task::JoinHandle<Woken>,
        cancel: tokio::sync::oneshot::Sender<()>,
    ) -> Self {
        Self {
            version,
            purpose,
            started: std::time::Instant::now(),
            task,
            cancel: Some(cancel),
        }
    }

    /// Whether the wait is still on and began less than `fresh` ago: the holder has not
    /// given its wake lock up yet, so a read would only find it holding.
    pub(crate) fn pending_within(&self, fresh: std::time::Duration) -> bool {
        !self.task.is_finished() && self.started.elapsed() < fresh
    }

    /// The holder's version this wait is for.
    pub(crate) fn version(&self) -> i64 {
        self.version
    }

    /// What this wait is for.
    pub(crate) fn purpose(&self) -> WaitFor {
        self.purpose
    }

    /// Resolves when the wait ended. Cancel-safe: the wait goes on without it.
    pub(crate) async fn woken(&mut self) -> Woken {
        (&mut self.task).await.unwrap_or(Woken::Failed)
    }

    /// Leaves the wait to run to its end (the holder's release, or its bound) in the
    /// background, and its connection to be kept for the next wait: for a wait that is no
    /// longer needed but keeps nothing when it ends (any but [`WaitFor::Handover`]'s),
    /// rather than killing its statement and closing its connection.
    pub(crate) fn let_run(self) {
        let Self { task, cancel, .. } = self;
        if task.is_finished() {
            return;
        }
        drop(tokio::spawn(async move {
            let _ = task.await;
            drop(cancel);
        }));
    }

    /// Stops the wait on the server and waits for its task to end, so that nothing it keeps
    /// (a hand-over's pinned connection) comes after the caller's clean-up.
    pub(crate) async fn stop(mut self) {
        self.cancel = None;
        let _ = self.woken().await;
    }
}

/// The prefix of the wake locks of `name` in `table`: the wake lock of the holder with version
/// `v` is the prefix followed by `v`. A hash keeps it within MySQL's 64 characters for any name;
/// FNV-1a, written out here, so that every process and version of this crate agrees on it.
/// Two names with the same hash only share wake-ups, which are hints.
#[cfg_attr(
    not(feature = "mysql"),
    allow(dead_code, reason = "wake locks are MySQL's")
)]
pub(crate) fn wake_prefix(table: &str, name: &str) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let bytes = table.bytes().chain([0]).chain(name.bytes());
    for byte in bytes {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("distlock:{hash:016x}:")
}

/// The statements of MySQL's wake locks (see [`WakeLocks`]), written by `mysql/statements.rs`.
#[cfg(feature = "mysql")]
#[derive(Debug)]
pub(crate) struct WakeLockSql {
    pub(crate) take: Arc<str>,
    pub(crate) release: Arc<str>,
    pub(crate) wait: Arc<str>,
    /// After a wake-up, with hand-overs: whether the release made the waiter the holder.
    pub(crate) handed: Arc<str>,
}

/// MySQL/MariaDB's wake locks (see [`MyDb`](crate::mysql::MyDb)): their statements, the
/// connections pinned with the leases (each holding its holder's wake lock) and the waiting
/// connections.
#[cfg(feature = "mysql")]
#[derive(Debug)]
pub(crate) struct WakeLocks {
    table: String,
    pub(crate) sql: WakeLockSql,
    pool: sqlx::MySqlPool,
    /// The connections holding a holder's wake lock, by name and owner.
    pinned: Mutex<HashMap<(String, String), Pinned>>,
    pub(crate) pin_slots: Arc<Semaphore>,
    pub(crate) wait_slots: Arc<Semaphore>,
    /// Waiting connections between waits, with their `CONNECTION_ID()` and since when they
    /// are idle.
    idle: Mutex<Vec<(PoolConnection<sqlx::MySql>, u64, Instant)>>,
    /// Whether releases hand the lock to the reserved exclusive waiter.
    pub(crate) handover: bool,
    /// How long a connection may idle before its next use pings it (`wait_timeout`).
    pub(crate) limit: Arc<IdleLimit>,
}

/// A pinned connection (see [`WakeLocks::pin`]), with the pin slot it takes.
#[cfg(feature = "mysql")]
#[derive(Debug)]
pub(crate) struct Pinned {
    /// The version (a shared hold's or a permit's token) of the hold whose wake lock it holds.
    version: i64,
    /// Locked by the release that takes the connection out, and by a keep-alive ping.
    conn: Arc<tokio::sync::Mutex<Holding>>,
    _slot: OwnedSemaphorePermit,
}

/// A connection that holds a wake lock, and since when it is idle (its take, or its last
/// keep-alive ping). Closed, never given back to the pool, when dropped with it: closing lets
/// the wake lock go (a release takes the connection out first).
#[cfg(feature = "mysql")]
#[derive(Debug)]
struct Holding {
    conn: Option<PoolConnection<sqlx::MySql>>,
    since: Instant,
}

#[cfg(feature = "mysql")]
impl Drop for Holding {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            drop(conn.detach());
        }
    }
}

#[cfg(feature = "mysql")]
impl Drop for WakeLocks {
    fn drop(&mut self) {
        if tokio::runtime::Handle::try_current().is_err() {
            // Handing a connection back to the pool spawns a task: close them here instead
            // (pinned ones are closed when dropped).
            let idle = std::mem::take(unpoisoned_mut(&mut self.idle));
            idle.into_iter().for_each(|(conn, ..)| drop(conn.detach()));
        }
    }
}

#[cfg(feature = "mysql")]
fn unpoisoned_mut<T>(mutex: &mut Mutex<T>) -> &mut T {
    mutex.get_mut().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(feature = "mysql")]
impl WakeLocks {
    /// The wake locks of `table` on `pool`, with `slots` connections at most pinned and as
    /// many waiting; `handover`: releases hand the lock to the reserved exclusive waiter;
    /// `limit`: the server's idle limit (`wait_timeout`).
    pub(crate) fn new(
        table: String,
        sql: WakeLockSql,
        pool: sqlx::MySqlPool,
        slots: usize,
        handover: bool,
        limit: Arc<IdleLimit>,
    ) -> Self {
        Self {
            table,
            sql,
            pool,
            pinned: Mutex::default(),
            pin_slots: Arc::new(Semaphore::new(slots)),
            wait_slots: Arc::new(Semaphore::new(slots)),
            idle: Mutex::default(),
            handover,
            limit,
        }
    }

    pub(crate) fn prefix(&self, name: &str) -> String {
        wake_prefix(&self.table, name)
    }

    /// Keeps a waiting connection for the next wait.
    fn park(&self, conn: PoolConnection<sqlx::MySql>, id: u64) {
        unpoisoned(&self.idle).push((conn, id, Instant::now()));
    }

    pub(crate) fn unpin(&self, name: &str, owner: &str) -> Option<Pinned> {
        unpoisoned(&self.pinned).remove(&(name.to_owned(), owner.to_owned()))
    }

    /// Keeps `conn` (which holds the wake lock of `owner`'s hold of `name` with `version`)
    /// until the release.
    pub(crate) fn pin(
        &self,
        name: &str,
        owner: &str,
        version: i64,
        conn: PoolConnection<sqlx::MySql>,
        slot: OwnedSemaphorePermit,
    ) {
        let holding = Holding {
            conn: Some(conn),
            since: Instant::now(),
        };
        let pinned = Pinned {
            version,
            conn: Arc::new(tokio::sync::Mutex::new(holding)),
            _slot: slot,
        };
        let key = (name.to_owned(), owner.to_owned());
        // A reentrant take of a lock we hold: the earlier hold's wake lock goes with its
        // connection, closed when dropped.
        drop(unpoisoned(&self.pinned).insert(key, pinned));
    }

    /// The connection pinned for `owner`'s hold of `name` with `version` taken out (to
    /// release on), and since when it is idle; `None`: none (one of another version stays
    /// pinned: a release of a wrong version must not take its holder's wake lock away), or
    /// the keep-alive found it closed.
    pub(crate) async fn take_pinned(
        &self,
        name: &str,
        owner: &str,
        version: i64,
    ) -> Option<(PoolConnection<sqlx::MySql>, Instant)> {
        let pinned = {
            let mut all = unpoisoned(&self.pinned);
            let key = (name.to_owned(), owner.to_owned());
            if all.get(&key)?.version != version {
                return None;
            }
            all.remove(&key)?
        };
        let mut holding = pinned.conn.lock().await;
        let since = holding.since;
        holding.conn.take().map(|conn| (conn, since))
    }

    /// Pings every pinned connection idle for `after` or longer (each at most once a round),
    /// so that the server does not close it for idleness with the wake lock it holds. One
    /// in use (by its release) is left alone; one whose ping fails is closed, and its holder's
    /// waiters poll.
    async fn keep_alive(&self, after: Duration) {
        let pinned: Vec<_> = unpoisoned(&self.pinned)
            .values()
            .map(|pinned| pinned.conn.clone())
            .collect();
        for cell in pinned {
            let Ok(mut holding) = cell.try_lock() else {
                continue;
            };
            if holding.since.elapsed() < after {
                continue;
            }
            if let Some(conn) = holding.conn.take() {
                holding.conn = ping(conn).await;
                holding.since = Instant::now();
            }
        }
    }

    /// A waiting connection and its id: an idle one (pinged first if it idled long enough for
    /// the server to close it), or a new one from the pool.
    async fn waiting_conn(&self) -> Result<(PoolConnection<sqlx::MySql>, u64), sqlx::Error> {
        loop {
            let Some((conn, id, since)) = unpoisoned(&self.idle).pop() else {
                break;
            };
            if let Some(conn) = checked(conn, since.elapsed(), &self.limit).await {
                return Ok((conn, id));
            }
        }
        // Closed, not given back, if cancelled mid-way (see `InUse`).
        let mut conn = InUse::acquire(&self.pool).await?;
        let id: u64 = sqlx::query_scalar("SELECT CONNECTION_ID()")
            .fetch_one(conn.conn())
            .await?;
        Ok((conn.done(), id))
    }

    /// Waits on the server until the wake lock `lock` is given up (at most `secs`), or
    /// `cancel` resolves: then the statement is killed and its connection closed. With
    /// hand-overs and `whose` (the name and the waiting owner, for an exclusive waiter's wait
    /// on an exclusive holder), a wake-up then reads whether the release made `owner` the
    /// holder.
    pub(crate) async fn wait(
        self: Arc<Self>,
        lock: String,
        secs: u64,
        cancel: oneshot::Receiver<()>,
        _slot: OwnedSemaphorePermit,
        whose: Option<(String, String)>,
    ) -> Woken {
        let Ok((mut conn, id)) = self.waiting_conn().await else {
            return Woken::Failed;
        };
        let mut killed = false;
        let answer = {
            let query = q(&self.sql.wait)
                .bind(&lock)
                .bind(&lock)
                .bind(secs)
                .bind(&lock)
                .fetch_one(&mut *conn);
            let mut query = std::pin::pin!(query);
            // The wait's answer first, should both be ready.
            match future::select(query.as_mut(), cancel).await {
                Either::Left((answer, _)) => answer,
                Either::Right(_) => {
                    killed = true;
                    let kill = format!("KILL QUERY {id}");
                    if let Err(err) = self.pool.execute(AssertSqlSafe(kill)).await {
                        tracing::debug!(%err, "could not kill a cancelled wait");
                    }
                    query.await
                }
            }
        };
        let answer = answer.and_then(|row| row.try_get::<Option<i64>, _>(0));
        match answer {
            Ok(answer) if !killed => match answer {
                Some(0 | 3) => {
                    self.park(conn, id);
                    if answer == Some(0) {
                        Woken::NotArmed
                    } else {
                        Woken::TimedOut
                    }
                }
                _ => match whose.filter(|_| self.handover) {
                    Some((name, owner)) => self.handed(conn, id, &name, &owner).await,
                    None => {
                        self.park(conn, id);
                        Woken::Released
                    }
                },
            },
            // A killed statement's connection is not reused (a late kill could hit the next
            // statement); a failed one goes back to the pool's own checks.
            Ok(_) => {
                drop(conn.detach());
                Woken::Failed
            }
            Err(err) => {
                tracing::debug!(%err, "wait on a wake lock failed");
                if killed {
                    drop(conn.detach());
                }
                Woken::Failed
            }
        }
    }
}

#[cfg(feature = "mysql")]
impl WakeLocks {
    /// After a wake-up: whether the release handed `owner` the lock (a locking read, which
    /// waits for the release's commit), and if so, the waiter's own wake lock taken on this
    /// connection, which then stays with the lease (pinned) like a take's.
    async fn handed(
        &self,
        mut conn: PoolConnection<sqlx::MySql>,
        id: u64,
        name: &str,
        owner: &str,
    ) -> Woken {
        let slot = self.pin_slots.clone().try_acquire_owned().ok();
        let prefix = slot.as_ref().map(|_| self.prefix(name));
        let sent = Instant::now();
        let row = q(&self.sql.handed)
            .bind(&prefix)
            .bind(&prefix)
            .bind(name)
            .bind(owner)
            .fetch_optional(&mut *conn)
            .await;
        let read = row.and_then(|row| {
            row.map(|row| {
                let version: i64 = row.try_get(0)?;
                let remaining: i64 = row.try_get(1)?;
                let woke: Option<i64> = row.try_get(2)?;
                Ok((version, remaining, woke))
            })
            .transpose()
        });
        match read {
            Ok(Some((version, remaining, woke))) => {
                let left = Duration::from_micros(u64::try_from(remaining).unwrap_or(0));
                match (woke, slot) {
                    (Some(1), Some(slot)) => self.pin(name, owner, version, conn, slot),
                    _ => self.park(conn, id),
                }
                Woken::Handed {
                    version,
                    until: sent + left,
                }
            }
            // Freed rather than handed (or to another waiter): the waiter takes.
            Ok(None) => {
                self.park(conn, id);
                Woken::Released
            }
            Err(err) => {
                // A wake lock may be held by the failed statement's connection: close it.
                tracing::debug!(%err, "reading a hand-over failed");
                drop(conn.detach());
                Woken::Released
            }
        }
    }
}

/// The task of [`WakeLocks::keep_alive`]: a round every half of `idle`'s check interval (a
/// pinned connection is then pinged before it idled for the whole interval, a half of the
/// server's `wait_timeout` at most). It ends with the backend.
#[cfg(feature = "mysql")]
pub(crate) fn spawn_keep_alive(
    wake: &Arc<WakeLocks>,
    idle: &IdleLimit,
) -> tokio::task::AbortHandle {
    let round = idle.check_after().map(|after| after / 2);
    let wake = Arc::downgrade(wake);
    let task = tokio::spawn(async move {
        let Some(round) = round.filter(|round| !round.is_zero()) else {
            return;
        };
        loop {
            tokio::time::sleep(round).await;
            let Some(wake) = wake.upgrade() else {
                return;
            };
            wake.keep_alive(round).await;
        }
    });
    task.abort_handle()
}

/// What a notification says about one name (see [`parse_payload`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Note<'a> {
    /// Something changed: every waiter looks again.
    Changed,
    /// The holder released, and this waiter holds the reservation.
    Released(&'a str),
    /// The holder's release handed the lock to this waiter (which held the reservation),
    /// with this version.
    Handed(&'a str, i64),
    /// One of the hand-overs of read holds to queued readers that a writer's release makes
    /// before the reserved reader's (PostgreSQL's `hand_read`): as [`Note::Handed`] to its
    /// target, nothing to the other waiters, whom the reserved reader's note wakes once.
    HandedAlone(&'a str, i64),
}

/// Splits a notification payload into its name and what it says: `<owner byte
/// length>:<owner><name>` (an empty owner addresses every waiter) for a release, or
/// `h<version>:<owner byte length>:<owner><name>` for a hand-over (`H<version>:..` for one
/// that wakes nobody else, [`Note::HandedAlone`]). Clients that predate hand-overs read the
/// latter as malformed, and wake every waiter (as those before `H` read it).
#[cfg_attr(
    not(feature = "postgres"),
    allow(dead_code, reason = "LISTEN/NOTIFY is PostgreSQL's")
)]
pub(crate) fn parse_payload(payload: &str) -> Option<(Note<'_>, &str)> {
    let (handed, payload) = match payload.strip_prefix(['h', 'H']) {
        Some(rest) => {
            let (version, rest) = rest.split_once(':')?;
            let alone = payload.starts_with('H');
            (Some((version.parse::<i64>().ok()?, alone)), rest)
        }
        None => (None, payload),
    };
    let (len, rest) = payload.split_once(':')?;
    let len: usize = len.parse().ok()?;
    if !rest.is_char_boundary(len) {
        return None;
    }
    let (owner, name) = rest.split_at(len);
    let note = match (handed, owner.is_empty()) {
        (Some((version, false)), false) => Note::Handed(owner, version),
        (Some((version, true)), false) => Note::HandedAlone(owner, version),
        (Some(_), true) => return None,
        (None, false) => Note::Released(owner),
        (None, true) => Note::Changed,
    };
    Some((note, name))
}

#[cfg(test)]
mod tests;
