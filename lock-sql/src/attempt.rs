//! One acquisition: the upsert (an exclusive hold) or the holders' transaction (a shared hold,
//! a permit), the waiter reservation at the head of the queue, and waking.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock_core::{
    AcquireRequest, Acquired, Attempt, AttemptMode, Error, LockKind, Result, Step,
};

use crate::backend::{Inner, RESERVATION, micros, remaining, token_of};
use crate::db;
use crate::db::Claim;
use crate::error::map_err;
use crate::holds::{self, HeldBy, JoinRequest, Joined};
use crate::lease::SqlLease;
use crate::wake::{ServerWait, Subscription, Woken};

pub(crate) struct SqlAttempt {
    pub(crate) inner: Arc<Inner>,
    pub(crate) request: AcquireRequest,
    /// The version this waiter first saw busy: its age for the reservation.
    pub(crate) since: Option<i64>,
    pub(crate) subscription: Option<Subscription>,
    /// Whether an acquire statement was sent without a definite "not taken" answer (its
    /// reply lost or cancelled): `abandon` must then free the lock by owner.
    pub(crate) maybe_owned: bool,
    /// Whether this attempt may hold the waiter reservation.
    pub(crate) maybe_reserved: bool,
    /// Whether the lock was found busy before: later polls read before they write.
    pub(crate) busy_before: bool,
    /// The last wake-up was a release addressed to this waiter: take without reading first.
    pub(crate) handed: bool,
    /// A wait on the server for the release of the holder ahead (MySQL's wake locks), while
    /// this attempt is at the head of the queue.
    pub(crate) server_wait: Option<ServerWait>,
    /// The holder (by version) that has no wake lock to wait on: poll it instead.
    pub(crate) unarmed: Option<i64>,
}

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
    async fn busy(&mut self, peek: db::Peek) -> Result<Step> {
        if let Some(message) = holds::mismatch(&peek, self.request.kind) {
            return Err(self.mismatch(message));
        }
        self.busy_before = true;
        let retry = peek.remaining_us.map(remaining);
        if self.request.mode == AttemptMode::Try {
            return Ok(Step::busy(retry));
        }
        let db = &self.inner.db;
        let (name, owner) = (self.request.name.as_str(), &*self.request.owner);
        let since = *self.since.get_or_insert(peek.version);
        // A reservation is a lease, no longer than the lock's: a killed or paused waiter at
        // the head blocks the others for its ttl at most.
        let reservation = RESERVATION.min(self.request.ttl);
        let mine = peek.next_owner.as_deref() == Some(owner) && peek.next_remaining_us.is_some();
        let claim = if mine {
            peek.next_remaining_us
                .is_some_and(|us| remaining(us) < reservation / 2)
        } else {
            peek.next_remaining_us.is_none() || peek.next_since.is_none_or(|s| s > since)
        };
        let head = if claim {
            self.maybe_reserved = true;
            let claimed = db
                .reserve(name, owner, since, micros(reservation))
                .await
                .map_err(|e| map_err("acquire", e))?;
            // Refused: an older waiter's live reservation replaced any of ours.
            self.maybe_reserved = claimed != Claim::Refused;
            if claimed == Claim::GrantedFree {
                // A release between our read and our claim notified nobody (it notifies the
                // reservation's holder only): take it now instead of waiting for a notification.
                return Ok(Step::Again);
            }
            self.maybe_reserved
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
        self.server_wait = None;
        Ok(Step::busy(retry))
    }

    /// At the head of the queue of a lock held exclusively, on a backend that waits on the
    /// server for a release ([`db::Db::wait_release`]): such a wait, kept across polls while
    /// the holder stays the same, and a busy step (the release wakes this attempt, the core's
    /// backoff is only the safety net). `None`: no wait is possible, poll briskly.
    fn wait_for_release(&mut self, peek: &db::Peek, retry: Option<Duration>) -> Option<Step> {
        let version = peek.version;
        if holds::held_kind(peek) != Some(LockKind::Exclusive) || self.unarmed == Some(version) {
            self.server_wait = None;
            return None;
        }
        if self.server_wait.as_ref().map(ServerWait::version) != Some(version) {
            let name = self.request.name.as_str();
            let remaining = retry.unwrap_or_default();
            // Replacing an earlier wait cancels it.
            self.server_wait = self.inner.db.wait_release(name, version, remaining);
        }
        self.server_wait.as_ref().map(|_| Step::busy(retry))
    }
}

impl SqlAttempt {
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

    /// A lease of what this attempt took, with token `version`.
    fn acquired(&self, version: i64) -> Result<Step> {
        let lease = SqlLease {
            inner: self.inner.clone(),
            name: self.request.name.clone(),
            owner: self.request.owner.clone(),
            version,
            kind: self.request.kind,
        };
        Ok(Step::Acquired(Acquired::new(
            Box::new(lease),
            token_of(version)?,
        )))
    }

    /// A poll of a shared hold or a permit: one transaction that joins the holders or says
    /// why not (see [`crate::holds`]).
    async fn poll_hold(&mut self, handed: bool) -> Result<Step> {
        let db = &self.inner.db;
        let (name, owner) = (self.request.name.as_str(), &*self.request.owner);
        let kind = self.request.kind;
        if self.busy_before && !handed {
            // Waiting: look before locking the row, while a writer or a reservation refuses.
            let peek = db.peek(name).await.map_err(|e| map_err("acquire", e))?;
            let refused =
                |p: &db::Peek| holds::refuses_holds(p, owner) || holds::mismatch(p, kind).is_some();
            if let Some(peek) = peek.filter(refused) {
                return self.busy(peek).await;
            }
        }
        let request = JoinRequest {
            name,
            owner,
            kind,
            ttl_us: micros(self.request.ttl),
        };
        let owned_before = std::mem::replace(&mut self.maybe_owned, true);
        let joined = match db.join(request).await {
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
            Joined::Taken(version) => self.acquired(version),
            Joined::Busy(peek) => self.busy(peek).await,
            Joined::Mismatch(message) => Err(self.mismatch(message)),
        }
    }
}

#[async_trait]
impl Attempt for SqlAttempt {
    async fn poll(&mut self) -> Result<Step> {
        let db = &self.inner.db;
        let (name, owner) = (self.request.name.as_str(), &*self.request.owner);
        if self.request.mode == AttemptMode::Wait {
            // Subscribe before the statement is sent, so that no release after it is missed.
            match &mut self.subscription {
                Some(sub) => sub.mark_seen(),
                None => self.subscription = db.subscribe(name, owner),
            }
        }
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
            let peek = db.peek(name).await.map_err(|e| map_err("acquire", e))?;
            if let Some(peek) = peek.filter(|p| blocked(p, owner)) {
                return self.busy(peek).await;
            }
        }
        let ttl = micros(self.request.ttl);
        let owned_before = std::mem::replace(&mut self.maybe_owned, true);
        let taken = match db.take(name, owner, ttl, self.maybe_reserved).await {
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
        match db.peek(name).await.map_err(|e| map_err("acquire", e))? {
            Some(peek) => self.busy(peek).await,
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
                Woken::Released => self.handed = true,
                // Poll now (the holder may just have released), then briskly.
                Woken::NotArmed | Woken::Failed => self.unarmed = Some(version),
                Woken::TimedOut => {}
            }
            return;
        }
        match &mut self.subscription {
            Some(sub) => self.handed = sub.changed().await,
            None => std::future::pending().await,
        }
    }

    async fn abandon(self: Box<Self>) -> Result<()> {
        if !self.maybe_owned && !self.maybe_reserved {
            // Every statement was answered: nothing of this attempt is on the server.
            return Ok(());
        }
        let db = &self.inner.db;
        let (name, owner) = (self.request.name.as_str(), &*self.request.owner);
        let kind = self.request.kind;
        if kind != LockKind::Exclusive {
            if self.maybe_owned {
                // A hold taken by a reply that never arrived: leave the holders, by owner.
                let held = HeldBy {
                    name,
                    owner,
                    kind,
                    token: None,
                };
                db.release_hold(held)
                    .await
                    .map_err(|e| map_err("abandon", e))?;
            }
            if !self.maybe_reserved {
                return Ok(());
            }
        }
        // The exclusive lock (if taken) and the reservation, by owner.
        db.abandon(name, owner)
            .await
            .map_err(|e| map_err("abandon", e))
    }
}
