//! One acquisition: the upsert (an exclusive hold) or the holders' transaction (a shared hold,
//! a permit), the waiter reservation at the head of the queue, and waking.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use distlock_core::backend::{InFlight, NEXT_IN_LINE_MAX_POLL, within};
use distlock_core::{
    AcquireRequest, Acquired, Attempt, AttemptMode, Error, LockKind, LockName, Result, Step,
};

use crate::backend::{Inner, RESERVATION, micros, remaining, token_of};
use crate::db;
use crate::db::Claim;
use crate::error::map_err;
use crate::kinds::{self, HeldBy, JoinRequest, Joined};
use crate::lease::SqlLease;
use crate::wake::{ServerWait, Subscription, WaitFor, WakeSignal, Woken};

pub(crate) struct SqlAttempt {
    pub(crate) inner: Arc<Inner>,
    pub(crate) request: AcquireRequest,
    /// The version this waiter first saw busy: its age for the reservation.
    pub(crate) since: Option<i64>,
    pub(crate) subscription: Option<Subscription>,
    /// Whether an acquire statement was sent without a definite "not taken" answer (its
    /// reply lost or cancelled): `abandon` must then free the lock by owner, and until the
    /// next answer a poll trusts no hand-over's notification ([`SqlAttempt::handed_over`]:
    /// the statement may have re-taken the row since, with a newer version) and a reader
    /// or permit waiter joins rather than reads first.
    pub(crate) maybe_owned: bool,
    /// Whether this attempt may hold the waiter reservation.
    pub(crate) maybe_reserved: bool,
    /// Whether a release may have handed this attempt the lock unbeknown to it (see
    /// [`SqlAttempt::claim`]): `abandon` must then free the lock by owner.
    pub(crate) maybe_handed: bool,
    /// Whether a reader's join may have queued it behind a writer (see
    /// [`SqlAttempt::queues_read`]): a writer's release may hand it a read hold, and
    /// `abandon` must then take its place out for good and leave any hold handed to it.
    pub(crate) maybe_queued: bool,
    /// Whether the lock was found busy before: later polls read before they write.
    pub(crate) busy_before: bool,
    /// The last wake-up was a release addressed to this waiter: take without reading first.
    pub(crate) handed: bool,
    /// The last wake-up said a release handed this waiter the lock, with this version and a
    /// lease that began after this instant (`None`: as [`SqlAttempt::handed_after_reads`]
    /// bounds it, or a read hold, as a read of it says); discarded while
    /// [`SqlAttempt::maybe_owned`].
    pub(crate) handed_over: Option<(i64, Option<Instant>)>,
    /// The last wake-up said a release handed the lock to another waiter: the reservation
    /// is free, claim it without reading first.
    pub(crate) vacant: bool,
    /// When the last read was sent that found the lock held by another owner, and the
    /// version it found: a release that hands this waiter a later version commits after that
    /// read (the row moved on from that version since). Its statement, where the handed lease
    /// starts, may come before: a read sent while that release commits still finds the old
    /// holder. A bound of a writer's or a permit's lease only with [`SqlAttempt::claimed_at`]
    /// or a join's refusal (which waits for that commit), never of a read hold's.
    pub(crate) held_seen: Option<(Instant, i64)>,
    /// The read before [`SqlAttempt::held_seen`] that found an older version: a release may
    /// hand this waiter the lock or a permit while a read of its own is on the way, which
    /// then finds the handed version (no bound), while this earlier read still is one.
    pub(crate) held_seen_before: Option<(Instant, i64)>,
    /// When the last claim of the reservation that it granted (or whose answer did not come)
    /// was sent (`None` once a claim was refused, unless that refusal was a hand-over): a
    /// release that hands the lock to an exclusive waiter holding the reservation read that
    /// claim's commit (a claim sent later, while the release commits, finds the waiter
    /// holding and is refused), so the release's update, where the handed lease starts,
    /// came after this send. A read sent after that update, while the release commits (its
    /// WAL flush, a synchronous standby), still finds the old holder:
    /// [`SqlAttempt::held_seen`] alone then dated the lease later than the server did (by
    /// 465 ms with a commit made 500 ms slow). No bound of a read hold's: a reader's claim
    /// sent while the release commits waits for that commit and is granted (a stale
    /// reservation).
    pub(crate) claimed_at: Option<Instant>,
    /// When this reader's last join was sent that was refused, and the version it found: a
    /// refused join locked the name's row (PostgreSQL's functions), so a release that
    /// updated the row after it, and the read hold it handed over, came after this send. A
    /// bound of a read hold's lease (see [`SqlAttempt::read_hold_started`]).
    pub(crate) refused_join: Option<(Instant, i64)>,
    /// A wait on the server for the release of the holder ahead (MySQL's wake locks; the
    /// latest reader's, for a writer waiting for the readers), while this attempt holds the
    /// reservation, or of the holder it is paired with, while it is a queued permit waiter
    /// (see [`SqlAttempt::look_in_queue`]).
    pub(crate) server_wait: Option<ServerWait>,
    /// The holder (by version) that has no wake lock to wait on: poll it instead.
    pub(crate) unarmed: Option<i64>,
    /// The holder (by version) whose wake lock was not held yet when a wait began, and how
    /// many times: a holder that was handed the lock takes its wake lock just after the
    /// hand-over, so a waiter that looked in between waits again (a few times) after a read.
    pub(crate) not_armed: (i64, u32),
    /// A queued permit waiter that reads between its joins ([`db::Db::queued_look`]): until
    /// when its place (queued by its last join) needs no join to renew it, and what its last
    /// read found (waiters ahead, reads in a row that found as many).
    pub(crate) queue_look: Option<QueueLook>,
    /// The statements that may leave something on the server (a take, a join, a claim of
    /// the reservation), run to their end even when the poll that sent them is dropped
    /// first: [`Attempt::abandon`] waits for them, so that its clean-up by owner comes after
    /// them on the server (see [`SqlAttempt::sent`]).
    pub(crate) in_flight: InFlight,
    /// The [`WaitFor::Handover`] waits this attempt ended, until stopped on the server (see
    /// [`SqlAttempt::end_wait`]); the clean-up waits for them.
    pub(crate) ended_waits: InFlight,
}

/// What a queued permit waiter that reads between its joins keeps (see
/// [`SqlAttempt::queue_look`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct QueueLook {
    renew_at: Instant,
    ahead: Option<i64>,
    same: u32,
}

impl QueueLook {
    /// The pause before the next read, after one that found `ahead` waiters before this one:
    /// a millisecond per place (the first one reads every millisecond while the permits
    /// change hands), half a millisecond more for each read in a row that found the same,
    /// at most [`NEXT_IN_LINE_MAX_POLL`]: a semaphore whose holders keep it long is read 50
    /// times a second by each queued waiter.
    fn pause(&mut self, ahead: i64) -> Duration {
        if self.ahead == Some(ahead) {
            self.same = self.same.saturating_add(1);
        } else {
            (self.ahead, self.same) = (Some(ahead), 0);
        }
        let places = u32::try_from(ahead.saturating_add(1)).unwrap_or(u32::MAX);
        let ms = Duration::from_millis(1) * places.min(20)
            + Duration::from_micros(500) * self.same.min(40);
        ms.min(NEXT_IN_LINE_MAX_POLL)
    }
}

/// How many waits in a row on one holder may find its wake lock not held yet before the
/// waiter polls that holder instead (see [`SqlAttempt::not_armed`]).
const NOT_ARMED_RETRIES: u32 = 3;

/// Whether the row refuses `owner` now: a live holder or a live reservation of somebody else.
pub(crate) fn blocked(peek: &db::Peek, owner: &str) -> bool {
    let held = peek.remaining_us.is_some() && peek.owner.as_deref() != Some(owner);
    let reserved = peek.next_remaining_us.is_some() && peek.next_owner.as_deref() != Some(owner);
    held || reserved
}

impl SqlAttempt {
    /// The answer to a busy lock: a waiting attempt claims or keeps the reservation when it
    /// is free, expiring, or held by a younger waiter (one write, only then).
    /// A name held as a kind this one can never join is [`Error::Mismatch`] instead.
    async fn busy(&mut self, peek: db::Peek, sent: Instant) -> Result<Step> {
        if let Some(message) = kinds::mismatch(&peek, self.request.kind) {
            return Err(self.mismatch(message));
        }
        self.busy_before = true;
        let owner = &*self.request.owner;
        if peek.remaining_us.is_some() && peek.owner.as_deref() != Some(owner) {
            if let Some(seen) = self.held_seen.filter(|&(_, v)| v < peek.version) {
                self.held_seen_before = Some(seen);
            }
            self.held_seen = Some((sent, peek.version));
        }
        let retry = peek.remaining_us.map(remaining);
        if self.request.mode == AttemptMode::Try {
            return Ok(Step::busy(retry));
        }
        if self.queued() {
            // In the queue (its join renewed its place): a release hands it a permit and
            // tells it. It polls again before its place expires.
            let renew = RESERVATION.min(self.request.ttl) / 3;
            if !self.inner.db.has_events() {
                // Nothing tells it: it reads whether it holds, briskly, and joins again only
                // to renew its place.
                let look = self.queue_look.get_or_insert(QueueLook {
                    renew_at: sent,
                    ahead: None,
                    same: 0,
                });
                look.renew_at = sent + renew;
                return Ok(Step::NextInLine {
                    retry_after: Some(Duration::from_millis(1)),
                });
            }
            return Ok(Step::busy(Some(retry.map_or(renew, |r| r.min(renew)))));
        }
        let since = *self.since.get_or_insert(peek.version);
        // The reservation's lease (see `claim`).
        let reservation = RESERVATION.min(self.request.ttl);
        let mine = peek.next_owner.as_deref() == Some(owner) && peek.next_remaining_us.is_some();
        let claim = if mine {
            peek.next_remaining_us
                .is_some_and(|us| remaining(us) < reservation / 2)
        } else {
            peek.next_remaining_us.is_none() || peek.next_since.is_none_or(|s| s > since)
        };
        let head = if claim {
            let (claimed, handed) = self.claim(since).await?;
            if handed {
                // Maybe handed the lock: the wait for that hand-over says so, if there is one;
                // otherwise look at once.
                return Ok(match &self.server_wait {
                    Some(wait) if wait.purpose() == WaitFor::Handover => Step::busy(retry),
                    _ => Step::Again,
                });
            }
            if claimed == Claim::GrantedFree {
                // A release between our read and our claim notified nobody (it notifies the
                // reservation's holder only): take it now instead of waiting for a notification.
                return Ok(Step::Again);
            }
            claimed != Claim::Refused
        } else {
            mine
        };
        if head {
            if let Some(step) = self.wait_for_release(&peek, retry) {
                return Ok(step);
            }
            // Without notifications the core polls the next holder briskly; the others back off.
            return Ok(Step::NextInLine { retry_after: retry });
        }
        self.end_wait();
        Ok(Step::busy(retry))
    }

    /// Waiting for a lock held exclusively (or a writer waiting at the head for the readers),
    /// on a backend that waits on the server for a release ([`db::Db::wait_release`]): such
    /// a wait, kept across polls while the holder stays the same, and a busy step (the
    /// release wakes this attempt, the core's backoff is only the safety net). `None`: no
    /// wait is possible, poll briskly. A writer waits for the latest reader (the row's
    /// version is its token), mostly the last to leave; should another still hold when it
    /// left, the wait on a lock nobody holds any more says so ([`Woken::NotArmed`]), and the
    /// writer polls briskly until the row's version changes.
    fn wait_for_release(&mut self, peek: &db::Peek, retry: Option<Duration>) -> Option<Step> {
        let version = peek.version;
        let held = kinds::held_kind(peek);
        let waits = match held {
            Some(LockKind::Exclusive) => true,
            Some(LockKind::Shared) => self.request.kind == LockKind::Exclusive,
            _ => false,
        };
        // A reader's wake lock is taken before its join commits: found free, it was given up
        // for good (the reader left, an older one still holds), so the writer polls.
        let left = held == Some(LockKind::Shared) && self.not_armed.0 == version;
        if !waits || left || self.unarmed == Some(version) {
            self.end_wait();
            return None;
        }
        if self.server_wait.as_ref().map(ServerWait::version) != Some(version) {
            self.end_wait();
            let (name, owner) = (self.request.name.as_str(), &*self.request.owner);
            let remaining = retry.unwrap_or_default();
            // A writer's release hands the lock to the writer at the head, and so does the
            // last reader's (MySQL's release procedure `_v3`): a writer's wake-up reads
            // whether it did. None hands a read hold over.
            let purpose = match (self.request.kind, held) {
                (LockKind::Exclusive, Some(LockKind::Exclusive | LockKind::Shared)) => {
                    WaitFor::Handover
                }
                _ => WaitFor::First,
            };
            self.server_wait = self
                .inner
                .db
                .wait_release(name, owner, version, remaining, purpose);
        }
        self.server_wait.as_ref().map(|_| Step::busy(retry))
    }
}

impl SqlAttempt {
    /// Ends the wait on the server, if any: one that keeps nothing runs to its end
    /// ([`ServerWait::let_run`]); a [`WaitFor::Handover`] wait is stopped on the server, on a
    /// task of its own, which the clean-up waits for (`ended_waits`): its wake-up read may
    /// have begun, and may pin a handed-over lock's connection after the wait was ended.
    fn end_wait(&mut self) {
        if let Some(wait) = self.server_wait.take() {
            if wait.purpose() == WaitFor::Handover {
                self.ended_waits.track(wait.stop());
            } else {
                wait.let_run();
            }
        }
    }

    /// Whether this attempt waits in the name's queue of permit waiters
    /// ([`db::Db::queues_permits`]) rather than for the reservation.
    fn queued(&self) -> bool {
        matches!(self.request.kind, LockKind::Permit { .. })
            && self.request.mode == AttemptMode::Wait
            && self.inner.db.queues_permits()
    }

    /// Whether this waiting reader's joins queue it when a writer refuses it, beside its
    /// claims of the reservation: where a writer's release hands read holds over
    /// ([`db::Db::hands_reads_over`]), it hands one to each reader so queued too, not only to
    /// the reserved one (PostgreSQL's functions, see `postgres/routines.rs`).
    fn queues_read(&self) -> bool {
        self.request.kind == LockKind::Shared
            && self.request.mode == AttemptMode::Wait
            && self.inner.db.hands_reads_over()
    }

    /// After a hand-over to another waiter, or a permit taken by the waiter that held the
    /// reservation and filling the semaphore, either of which used the reservation up: claims
    /// it at once (the claim says whether the lock is free, so nothing is read first). `None`:
    /// the lock is free, take it.
    async fn claim_vacant(&mut self) -> Result<Option<Step>> {
        let Some(since) = self.since.filter(|_| self.busy_before) else {
            return Ok(None);
        };
        let (claimed, handed) = self.claim(since).await?;
        Ok(match claimed {
            // The lock is held (by the waiter it was handed to): its release hands it on.
            Claim::Granted => Some(Step::NextInLine { retry_after: None }),
            Claim::GrantedFree => None,
            // Maybe handed the lock: look at once.
            Claim::Refused if handed => Some(Step::Again),
            // An older waiter holds the reservation: wait for the next wake-up.
            Claim::Refused => Some(Step::busy(None)),
        })
    }

    /// Claims the waiter reservation (as old as `since`; a lease no longer than the lock's: a
    /// killed or paused waiter at the head blocks the others for its ttl at most): the answer,
    /// and whether a release may have handed this attempt the lock. Records whether the
    /// attempt may hold the reservation now ([`SqlAttempt::maybe_reserved`]). A refusal says
    /// that another waiter's live reservation replaced any of ours or, for an exclusive
    /// waiter on a backend whose release hands the lock to the reservation's holder
    /// ([`db::Db::hands_over`]), that a release just did (a claim is never the holder's own):
    /// the lock is then this attempt's, and if it gives up before it learns so, its clean-up
    /// must free the lock (otherwise held until its ttl). A reader's refusal after it may have
    /// held the reservation, where a writer's release hands the reserved reader a read hold
    /// ([`db::Db::hands_reads_over`]), may follow such a hand-over too (then the others claim
    /// the reservation it used up). A permit or read hold handed over leaves the lock row
    /// naming no owner of it: a claim after one is granted, and the reservation so renewed is
    /// stale (the next join or release of the name clears it). A queued permit waiter claims
    /// nothing.
    async fn claim(&mut self, since: i64) -> Result<(Claim, bool)> {
        let reservation = micros(RESERVATION.min(self.request.ttl));
        let ttl = self.handover_ttl();
        // The attempt may have held the reservation before this claim.
        let had = std::mem::replace(&mut self.maybe_reserved, true);
        let sent = Instant::now();
        // Its answer may be lost and the claim granted all the same.
        self.claimed_at = Some(self.claimed_at.map_or(sent, |c| c.min(sent)));
        let claimed = self
            .sent(|inner, name, owner| async move {
                inner
                    .db
                    .reserve(name.as_str(), &owner, since, reservation, ttl)
                    .await
            })
            .await
            .map_err(|e| map_err("acquire", e))?;
        self.maybe_reserved = claimed != Claim::Refused;
        let handed = claimed == Claim::Refused
            && had
            && match self.request.kind {
                LockKind::Exclusive => self.inner.db.hands_over(),
                LockKind::Shared => self.inner.db.hands_reads_over(),
                _ => false,
            };
        self.maybe_handed |= handed;
        if claimed != Claim::Refused {
            self.claimed_at = Some(sent);
        } else if !handed {
            self.claimed_at = None;
        }
        Ok((claimed, handed))
    }

    /// `statement`'s answer, given the backend, the name and the owner to own: a statement
    /// that may leave something on the server (a take, a join, a claim of the reservation).
    /// Dropped before its answer (the core's operation timeout, the caller's `timeout` or
    /// `select!`), the statement was perhaps sent and runs on the server anyway, maybe after
    /// the clean-up that [`Attempt::abandon`] sends on another connection, which would then
    /// find nothing to free by owner, and what the statement left would stay until its ttl
    /// (a reservation claimed just after its clean-up kept a writer out for a second). So its
    /// end is awaited on a task of its own, which `abandon` waits for first
    /// ([`InFlight`]); awaited to its end, it spawns nothing. That rest may still wait for a
    /// connection (at most the pool's acquire timeout, half the connect timeout) and then
    /// send the statement: the clean-up after it frees what it took. Such a statement waits
    /// for the one cut short before it, so that an attempt has one of them on the server at
    /// a time (its reads, `peek` and the queued waiter's look, are not among them).
    async fn sent<T, F>(&self, statement: impl FnOnce(Arc<Inner>, LockName, Arc<str>) -> F) -> T
    where
        F: Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        let (inner, name) = (self.inner.clone(), self.request.name.clone());
        let request = statement(inner, name, self.request.owner.clone());
        self.in_flight.run(request).await
    }

    /// The lease this waiter's reservation asks for, should a release hand it what it waits
    /// for: an exclusive waiter's ttl ([`db::Db::hands_over`]), a permit waiter's negated
    /// ([`db::Db::hands_permits_over`]: the sign keeps an exclusive release from handing it
    /// the lock), a shared waiter's negated too ([`db::Db::hands_reads_over`]: a writer's
    /// release hands it a read hold; a reader's never hands the lock to a reader), else none.
    fn handover_ttl(&self) -> Option<i64> {
        let ttl = micros(self.request.ttl);
        match self.request.kind {
            LockKind::Exclusive => Some(ttl),
            LockKind::Permit { .. } if self.inner.db.hands_permits_over() => Some(-ttl),
            LockKind::Shared if self.inner.db.hands_reads_over() => Some(-ttl),
            _ => None,
        }
    }

    fn mismatch(&self, message: String) -> Error {
        Error::Mismatch {
            name: self.request.name.to_string(),
            message,
        }
    }

    /// Whether a statement that failed with `err` may have reached the server.
    fn maybe_sent(err: &sqlx::Error) -> bool {
        !matches!(err, sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed)
    }

    /// A bound on when the release that handed this attempt the lock or a permit with
    /// `version` ran, from what it sent before: its last read of a holder whose version it
    /// follows (a permit waiter's refused join on PostgreSQL reports the last token drawn
    /// from the row's range as its version, so that a permit handed from the range later
    /// follows it too: see `postgres/routines.rs`) and, handed to the reservation's holder,
    /// its last claim. `None`: no such bound, or one that leaves less than half the lease
    /// (a short ttl, whose claims are as old as half of it): the row says what holds, which
    /// dates it from the server's remaining lease instead, one read more.
    fn handed_after_reads(&self, version: i64) -> Option<Instant> {
        [self.held_seen, self.held_seen_before]
            .into_iter()
            .flatten()
            .find(|&(_, seen)| seen < version)
            .map(|(at, _)| self.claimed_at.map_or(at, |claimed| at.min(claimed)))
            .filter(|&at| at + self.request.ttl / 2 > Instant::now())
    }

    /// An instant no later than the start of the read hold with token `version` that a
    /// writer's release handed this reader: its last refused join's send
    /// ([`SqlAttempt::refused_join`]), when younger than an eighth of the lease (a fast
    /// turn: nothing more to send, the lease counted short by that age at most), else from a
    /// read of the hold now ([`db::Db::hold_left`]): that read's send, less what the hold's
    /// lease had run then. `None`: no such live hold (or an instant before the clock's
    /// start): the reader's join says what holds (it takes a hold handed to it, renewed).
    async fn read_hold_started(&self, version: i64) -> Result<Option<Instant>> {
        let sent = Instant::now();
        if let Some((at, _)) = self
            .refused_join
            .filter(|&(at, seen)| seen < version && at + self.request.ttl / 8 > sent)
        {
            return Ok(Some(at));
        }
        let (name, owner) = (self.request.name.as_str(), &*self.request.owner);
        let left = self
            .inner
            .db
            .hold_left(name, owner, version)
            .await
            .map_err(|e| map_err("acquire", e))?;
        Ok(left.and_then(|us| self.started(sent, us)))
    }

    /// A lease of what a release handed this attempt, with token `version`, if that lease
    /// began after `since` (see [`SqlAttempt::held_seen`]).
    fn handed_over(&self, version: i64, since: Instant) -> Result<Step> {
        let acquired = self.grant(version)?.with_lease_started(since);
        Ok(Step::Acquired(acquired))
    }

    /// A lease found in a row read at `sent`: this attempt's (a release handed it over, and
    /// its notification was lost), with `remaining_us` left of it then.
    fn found_handed(&self, peek: &db::Peek, sent: Instant) -> Option<Result<Step>> {
        let owner = &*self.request.owner;
        let remaining_us = peek.remaining_us?;
        if peek.owner.as_deref() != Some(owner) || !self.inner.db.hands_over() {
            return None;
        }
        // An instant before the clock's start cannot be told: take it again instead.
        let started = self.started(sent, remaining_us)?;
        Some(self.handed_over(peek.version, started))
    }

    /// When a lease of this attempt's ttl began at the latest, read at `sent` with
    /// `remaining_us` left of it: `sent` less what had run. `None`: an instant before the
    /// clock's start.
    fn started(&self, sent: Instant, remaining_us: i64) -> Option<Instant> {
        sent.checked_sub(self.request.ttl.saturating_sub(remaining(remaining_us)))
    }

    /// A lease of what this attempt took, with token `version`.
    fn acquired(&self, version: i64) -> Result<Step> {
        self.grant(version).map(Step::Acquired)
    }

    /// The lease of this attempt's hold with token `version`.
    fn grant(&self, version: i64) -> Result<Acquired> {
        let lease = SqlLease {
            inner: self.inner.clone(),
            name: self.request.name.clone(),
            owner: self.request.owner.clone(),
            version,
            kind: self.request.kind,
            queued: self.maybe_queued,
        };
        Ok(Acquired::new(Box::new(lease), token_of(version)?))
    }

    /// Whether a writer's release may have handed this reader a read hold it did not learn of
    /// (its notification lost): it may hold the reservation, or be queued and `peek` shows a
    /// version past the one its last look found refusing it (a hand-over moves it on; while
    /// the readers ahead of a writer's reservation hold, it stays), and `peek` shows the name
    /// read with another waiter's reservation instead. Its join then answers (it renews a
    /// read hold of this owner's and takes it, see `routines`), where a look would refuse it
    /// until that hold ran out.
    fn maybe_handed_read(&self, peek: &db::Peek) -> bool {
        let moved_on = || self.held_seen.is_none_or(|(_, seen)| peek.version > seen);
        self.request.kind == LockKind::Shared
            && self.inner.db.hands_reads_over()
            && (self.maybe_reserved || self.maybe_handed || self.maybe_queued && moved_on())
            && kinds::held_kind(peek) == Some(LockKind::Shared)
            && kinds::reserved_by_other(peek, &self.request.owner)
    }

    /// A poll of a shared hold or a permit: one transaction that joins the holders or says
    /// why not (see [`crate::kinds`]).
    async fn poll_hold(&mut self, handed: bool) -> Result<Step> {
        if let Some(step) = self.look_in_queue().await? {
            return Ok(step);
        }
        let db = &self.inner.db;
        let (name, owner) = (self.request.name.as_str(), &*self.request.owner);
        let kind = self.request.kind;
        let sent = Instant::now();
        let queued = self.queued();
        // With a join's answer missing, join: it may hold what a hand-over gave it since.
        if self.busy_before && !handed && !queued && !self.maybe_owned {
            if self
                .server_wait
                .as_ref()
                .is_some_and(|w| w.pending_within(RESERVATION.min(self.request.ttl) / 4))
            {
                // The writer has not released (its wake lock is held): nothing to read yet.
                return Ok(Step::busy(None));
            }
            // Waiting: look before locking the row, while a writer or a reservation refuses.
            let peek = db.peek(name).await.map_err(|e| map_err("acquire", e))?;
            let refused =
                |p: &db::Peek| kinds::refuses_holds(p, owner) || kinds::mismatch(p, kind).is_some();
            if let Some(peek) = peek.filter(refused)
                && !self.maybe_handed_read(&peek)
            {
                return self.busy(peek, sent).await;
            }
        }
        let request = JoinRequest {
            name,
            owner,
            kind,
            ttl_us: micros(self.request.ttl),
            queue_us: if queued {
                micros(RESERVATION.min(self.request.ttl))
            } else if self.queues_read() {
                // Negative: nothing of this attempt's is queued yet, no place to take out.
                let us = micros(RESERVATION.min(self.request.ttl));
                if self.maybe_queued { us } else { -us }
            } else {
                0
            },
        };
        // A refusal queues the waiter: `abandon` must take it out.
        self.maybe_reserved |= queued;
        self.maybe_queued |= request.queue_us != 0 && !queued;
        let owned_before = std::mem::replace(&mut self.maybe_owned, true);
        let JoinRequest {
            kind,
            ttl_us,
            queue_us,
            ..
        } = request;
        let joined = self.sent(|inner, name, owner| async move {
            let request = JoinRequest {
                name: name.as_str(),
                owner: &owner,
                kind,
                ttl_us,
                queue_us,
            };
            inner.db.join(request).await
        });
        let joined = match joined.await {
            Ok(joined) => joined,
            Err(err) => {
                if !Self::maybe_sent(&err) {
                    self.maybe_owned = owned_before;
                }
                return Err(map_err("acquire", err));
            }
        };
        self.maybe_owned = false;
        match joined {
            Joined::Taken(version) => {
                // A reader's take leaves the queue (or never was in it).
                self.maybe_queued = false;
                // A queued permit waiter's wait keeps nothing: it runs to its end.
                if let Some(wait) = self.server_wait.take() {
                    wait.let_run();
                }
                self.acquired(version)
            }
            Joined::Busy(peek) => {
                self.refused_join = Some((sent, peek.version));
                if self.maybe_handed_read(&peek) {
                    // The join found no read hold handed to this reader (it would have taken
                    // it) and another waiter's reservation, the row locked: nothing of this
                    // attempt's is on the name, and its next polls look again.
                    self.maybe_reserved = false;
                    self.maybe_handed = false;
                }
                self.busy(peek, sent).await
            }
            Joined::Mismatch(message) => Err(self.mismatch(message)),
        }
    }
}

impl SqlAttempt {
    /// A queued permit waiter's read between its joins ([`db::Db::queued_look`]), while its
    /// place needs no renewal: the permit a release handed it, or the pause before the next
    /// read. `None`: join (to renew the place, or to take what the read could not).
    async fn look_in_queue(&mut self) -> Result<Option<Step>> {
        let now = Instant::now();
        if self.queue_look.is_none_or(|l| now >= l.renew_at) {
            return Ok(None);
        }
        let (name, owner) = (self.request.name.as_str(), &*self.request.owner);
        let found = self
            .inner
            .db
            .queued_look(name, owner, self.request.kind)
            .await
            .map_err(|e| map_err("acquire", e))?;
        let Some(found) = found else {
            return Ok(None);
        };
        if let Some((token, remaining_us)) = found.handed {
            if let Some(wait) = self.server_wait.take() {
                wait.let_run();
            }
            // Read after `now`, with `remaining_us` left: the lease ends after `now` plus
            // that. An instant before the clock's start cannot be told: join instead (it
            // renews the permit from then).
            let Some(started) = self.started(now, remaining_us) else {
                // The join renews the permit from then; the wake lock the read may have
                // taken for this token goes.
                self.inner.db.forget(name, owner);
                return Ok(None);
            };
            return self.handed_over(token, started).map(Some);
        }
        if found.free {
            // A permit freed without a hand-over: join now.
            return Ok(None);
        }
        // A place gone (expired, or never written): join again.
        let (Some(ahead), Some(look)) = (found.ahead, self.queue_look.as_mut()) else {
            if let Some(wait) = self.server_wait.take() {
                wait.let_run();
            }
            return Ok(None);
        };
        let pause = look.pause(ahead);
        // The releases hand permits to the queue in its order, and holders mostly release in
        // the order they took: the waiter `ahead` places from the head waits on the server
        // for the release of the holder as many places from the oldest (its wake lock held),
        // and reads again when it comes; the brisk reads go on beside it, for when another
        // holder releases first.
        let token = usize::try_from(ahead)
            .ok()
            .and_then(|k| found.armed.get(k).copied());
        match token {
            Some(token) if self.server_wait.as_ref().map(ServerWait::version) != Some(token) => {
                // An earlier wait runs to its end: it keeps nothing.
                if let Some(wait) = self.server_wait.take() {
                    wait.let_run();
                }
                let reservation = RESERVATION.min(self.request.ttl);
                self.server_wait =
                    self.inner
                        .db
                        .wait_release(name, owner, token, reservation, WaitFor::First);
            }
            Some(_) => {}
            None => {
                if let Some(wait) = self.server_wait.take() {
                    wait.let_run();
                }
            }
        }
        Ok(Some(Step::NextInLine {
            retry_after: Some(pause),
        }))
    }
}

#[async_trait]
impl Attempt for SqlAttempt {
    async fn poll(&mut self) -> Result<Step> {
        // A take, join or claim cut short (by the core's operation timeout) ends first.
        self.in_flight.settled().await;
        if self.request.mode == AttemptMode::Wait {
            // Subscribe before the statement is sent, so that no release after it is missed.
            match &mut self.subscription {
                Some(sub) => {
                    if let Some(version) = sub.mark_seen() {
                        // A hand-over came while this attempt was busy: take it below.
                        self.handed_over.get_or_insert((version, None));
                    }
                }
                None => {
                    let (name, owner) = (self.request.name.as_str(), &*self.request.owner);
                    let claims = !self.queued();
                    self.subscription = self.inner.db.subscribe(name, owner, claims);
                }
            }
        }
        if self.maybe_owned {
            // A take or join of this attempt's got no answer: it may have taken (again) what
            // a release handed over, with a newer version than the hand-over's. The row says
            // what holds: the read or the take (join) below.
            self.handed_over = None;
        }
        // Before a claim of the reservation: a hand-over to this attempt comes first, or it
        // would claim the reservation while holding.
        if let Some((version, since)) = self.handed_over {
            // A release handed us the lock (its notification or our read after the wake-up
            // says so, both after its commit): held since that release, after `since`, after
            // what `handed_after_reads` bounds it by, or, a read hold, what
            // `read_hold_started` does. Otherwise (a late notification) the row says what
            // holds.
            let since = match since {
                Some(since) => Some(since),
                // A read hold: a refused join or a read of it dates it (see `Db::hold_left`).
                // The hand-over stays noted until that read's answer: a read that fails or
                // is cancelled leaves it to the next poll.
                None if self.request.kind == LockKind::Shared => {
                    self.read_hold_started(version).await?
                }
                None => self.handed_after_reads(version),
            };
            self.handed_over = None;
            if let Some(since) = since {
                return self.handed_over(version, since);
            }
        }
        if self.request.kind != LockKind::Shared
            && std::mem::take(&mut self.vacant)
            && let Some(step) = self.claim_vacant().await?
        {
            return Ok(step);
        }
        let db = &self.inner.db;
        let (name, owner) = (self.request.name.as_str(), &*self.request.owner);
        let handed = std::mem::take(&mut self.handed);
        if self.request.kind != LockKind::Exclusive {
            return self.poll_hold(handed).await;
        }
        if self.busy_before && !handed {
            if self
                .server_wait
                .as_ref()
                .is_some_and(|w| w.pending_within(RESERVATION.min(self.request.ttl) / 4))
            {
                // The holder has not released (its wake lock is held): nothing to read yet.
                // Real reads resume after a quarter of the reservation, which they renew.
                return Ok(Step::busy(None));
            }
            // Waiting: look before writing, so that busy polls cost no commit.
            let sent = Instant::now();
            let peek = db.peek(name).await.map_err(|e| map_err("acquire", e))?;
            if let Some(found) = peek.as_ref().and_then(|p| self.found_handed(p, sent)) {
                if let Some(peek) = &peek {
                    db.arm(name, owner, peek.version).await;
                }
                return found;
            }
            if let Some(peek) = peek.filter(|p| blocked(p, owner)) {
                return self.busy(peek, sent).await;
            }
        }
        let ttl = micros(self.request.ttl);
        let owned_before = std::mem::replace(&mut self.maybe_owned, true);
        let reserved = self.maybe_reserved;
        let taken = self.sent(|inner, name, owner| async move {
            inner.db.take(name.as_str(), &owner, ttl, reserved).await
        });
        let taken = match taken.await {
            Ok(taken) => taken,
            Err(err) => {
                if !Self::maybe_sent(&err) {
                    // No connection, so nothing was sent.
                    self.maybe_owned = owned_before;
                }
                return Err(map_err("acquire", err));
            }
        };
        // A definite answer: taken (the guard owns it now) or not taken.
        self.maybe_owned = false;
        if let Some(version) = taken {
            return self.acquired(version);
        }
        let sent = Instant::now();
        match db.peek(name).await.map_err(|e| map_err("acquire", e))? {
            Some(peek) => self.busy(peek, sent).await,
            // The row vanished between the two statements: try again soon.
            None => Ok(Step::busy(Some(Duration::from_millis(1)))),
        }
    }

    async fn changed(&mut self) {
        if let Some(wait) = &mut self.server_wait {
            // Cancel-safe: the wait runs on in its task.
            let woken = wait.woken().await;
            let version = wait.version();
            self.server_wait = None;
            match woken {
                Woken::Released => {
                    self.handed = true;
                    if self.request.kind == LockKind::Exclusive {
                        // A writer woken by the latest reader, and not handed the lock:
                        // should an older one still hold, the writer polls (its wake lock is
                        // not the row's version). After a writer's release the row has moved
                        // on from `version`, which this only names.
                        self.not_armed = (version, 1);
                    }
                }
                Woken::Handed { version, until } => {
                    // Unknown (an instant before the clock's start): look at the row instead.
                    if let Some(since) = until.checked_sub(self.request.ttl) {
                        self.handed_over = Some((version, Some(since)));
                    }
                }
                // Poll now (the holder may just have released), then briskly.
                Woken::NotArmed if self.not_armed.0 != version => self.not_armed = (version, 1),
                Woken::NotArmed if self.not_armed.1 < NOT_ARMED_RETRIES => self.not_armed.1 += 1,
                Woken::NotArmed | Woken::Failed => self.unarmed = Some(version),
                Woken::TimedOut => {}
            }
            return;
        }
        match &mut self.subscription {
            // A queued waiter is not told of hand-overs to others (it subscribed so).
            Some(sub) => match sub.changed().await {
                WakeSignal::Changed => {}
                WakeSignal::Released => self.handed = true,
                WakeSignal::Handed(version) => self.handed_over = Some((version, None)),
                WakeSignal::Vacant => self.vacant = true,
            },
            None => std::future::pending().await,
        }
    }

    async fn abandon(self: Box<Self>) -> Result<()> {
        // A take, join or claim cut short, or a hand-over wait ended, may still run: what it
        // leaves comes before the clean-up, which runs to its end even if its timeout drops
        // this future while it waits (the core's timeout bounds it when not), for at most
        // the ttl and the bound of a request cut short: what the attempt left has expired
        // by then, and a connection that stopped answering does not keep it for good.
        let (in_flight, ended) = (self.in_flight.clone(), self.ended_waits.clone());
        let bound = in_flight.bound().saturating_add(self.request.ttl);
        let clean_up = async move {
            ended.settled().await;
            within(bound, "abandoning an attempt", self.clean_up())
                .await
                .and_then(|cleaned| cleaned)
        };
        in_flight.after(clean_up).await
    }
}

impl SqlAttempt {
    /// [`Attempt::abandon`]'s clean-up, once every take, join or claim cut short and every
    /// hand-over wait ended has ended.
    async fn clean_up(mut self: Box<Self>) -> Result<()> {
        if let Some(wait) = self.server_wait.take() {
            if wait.purpose() == WaitFor::Handover {
                // A wake-up read may be pinning a handed-over lock's connection: before the
                // clean-up below, which unpins it.
                wait.stop().await;
            } else {
                // It keeps nothing: it runs to its end.
                wait.let_run();
            }
        }
        if !self.maybe_owned && !self.maybe_reserved && !self.maybe_handed && !self.maybe_queued {
            // Every statement was answered: nothing of this attempt is on the server.
            return Ok(());
        }
        let db = &self.inner.db;
        let (name, owner) = (self.request.name.as_str(), &*self.request.owner);
        let kind = self.request.kind;
        let queued = self.queued();
        if kind == LockKind::Exclusive || self.maybe_reserved && !queued {
            // The exclusive lock (if taken) and the reservation, by owner (a queued waiter
            // never claims it). First: once the reservation is gone, no release hands this
            // attempt anything (but a queued reader's place, which the release by owner below
            // bars under the name's row lock, before it releases what a hand-over gave), so
            // the release by owner below finds whatever one handed it before.
            db.abandon(name, owner)
                .await
                .map_err(|e| map_err("abandon", e))?;
        }
        // A release may have handed the reserved (or queued) permit waiter a permit, or the
        // reserved (or queued) reader a read hold. The release by owner also takes a queued
        // waiter's place for good.
        let handed = self.maybe_handed
            || self.maybe_queued
            || self.maybe_reserved && (self.handover_ttl().is_some() || queued);
        if kind != LockKind::Exclusive && (self.maybe_owned || handed) {
            // A hold taken by a reply that never arrived, or handed over by a release whose
            // wake-up came too late: leave the holders, by owner.
            let held = HeldBy {
                name,
                owner,
                kind,
                token: None,
                queued: self.maybe_queued,
            };
            db.release_hold(held)
                .await
                .map_err(|e| map_err("abandon", e))?;
        }
        Ok(())
    }
}
