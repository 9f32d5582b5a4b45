//! The lock guard: its lease, loss detection and release. Renewals are scheduled by the
//! client's one watchdog task (`watchdog.rs`).

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use tracing::{Instrument, debug, warn};

use crate::backend::unpoisoned as lock;
use crate::backend::{Lease, Renewer, within};
use crate::finish::to_the_end;
use crate::flag::{Flag, Flags};
use crate::registry::{Reentrant, Registry, RegistryKey};
use crate::telemetry::{Handles, Op, Released};
use crate::watchdog::{Schedule, Watchdog, Watched};
use crate::{Error, FencingToken, LockKind, LockName, LossReason, Result};

/// [`Held::flags`]: renewal and loss watching ended.
const STOP: u8 = 0;
/// [`Held::flags`]: the lock was lost.
const LOST: u8 = 1;

/// A held lock.
///
/// The guard renews its lease in the background (unless renewal is disabled) and tells you the
/// moment the lock may be lost: [`is_lost`](Self::is_lost) and [`lost`](Self::lost). Pass
/// [`token`](Self::token) with every write to the protected resource.
///
/// # Dropping
///
/// Prefer [`release`](Self::release), which reports whether the lock was still yours. Dropping
/// a guard without releasing stops renewal at once and releases the lock from a background task
/// when a tokio runtime is available; without one (or if that release fails), the lock is freed
/// by the server when its ttl runs out. [`abandon`](Self::abandon) stops renewal and leaves the
/// lock to expire, as a crashed holder would.
#[must_use = "the lock is released as soon as the guard is dropped"]
pub struct LockGuard {
    held: Arc<Held>,
    finished: bool,
}

pub(crate) struct Held {
    pub(crate) name: LockName,
    pub(crate) kind: LockKind,
    pub(crate) owner: Arc<str>,
    pub(crate) token: FencingToken,
    pub(crate) backend: &'static str,
    lease: Box<dyn Lease>,
    /// The batch the lease's automatic renewals go to ([`Lease::renewer`]).
    renewer: Option<Arc<dyn Renewer>>,
    pub(crate) ttl: Duration,
    /// The lease asked of the server at every renewal: the ttl plus the lock-delay
    /// ([`crate::AcquireOptions::with_lock_delay`]).
    lease_ttl: Duration,
    /// The margin kept off every lease for clock drift ([`crate::ClientConfig::drift`] of the ttl).
    drift: Duration,
    operation_timeout: Duration,
    /// Renewal stops so that the lock is not held past this instant.
    hold_limit: Option<Instant>,
    valid_until: Mutex<Instant>,
    /// When the server's lease certainly ended if not renewed: the last acquire or renew
    /// request's sending plus the ttl.
    lease_end: Mutex<Instant>,
    /// Why the lock was lost, once it is (the first reason wins); flag [`LOST`] is raised then.
    lost: Mutex<Option<LossReason>>,
    /// Flag [`STOP`]: renewal and loss watching end (released, lost or dropped); flag
    /// [`LOST`]: the lock was lost.
    flags: Flags,
    /// Renewal state, driven by the client's [`Watchdog`].
    schedule: Mutex<Schedule>,
    watchdog: Watchdog,
    /// Reentrant holds still outstanding; 0 once released or abandoned.
    holds: Mutex<usize>,
    /// Boxed: most guards have none, and the key is 64 bytes.
    reentry: Option<Box<(Weak<Registry<Held>>, RegistryKey)>>,
    /// The [`LossEpochs`](crate::backend::LossEpochs) group the guard joined, if any.
    loss_group: Option<usize>,
    metrics: Arc<Handles>,
    /// When the grant came back (`acquire` returns then, or once it wrote the holder data it
    /// was asked to): where [`LockGuard::hold_at_least`]'s minimum and the hold time
    /// (`distlock_hold_seconds`) count from. The lease is known only to have started after
    /// `NewGuard::lease_started`, which for a lease handed over may lie long before.
    returned: Instant,
    /// Counted as held (`distlock_held_guards`) until released, dropped, abandoned or lost.
    holding: AtomicBool,
}

/// What the core knows when it turns a backend's `Acquired` into a guard.
pub(crate) struct NewGuard {
    pub(crate) name: LockName,
    pub(crate) kind: LockKind,
    pub(crate) owner: Arc<str>,
    pub(crate) token: FencingToken,
    pub(crate) backend: &'static str,
    pub(crate) lease: Box<dyn Lease>,
    pub(crate) ttl: Duration,
    /// The server's lease: the ttl plus the lock-delay.
    pub(crate) lease_ttl: Duration,
    /// [`crate::ClientConfig::drift`] of the ttl.
    pub(crate) drift: Duration,
    /// [`crate::ClientConfig::operation_timeout`].
    pub(crate) operation_timeout: Duration,
    /// An instant the lease started after: the sending of the request that took it, or, for a
    /// lease handed over by a release, an instant known to be before that release (a
    /// waiter's last read before it, perhaps long before).
    pub(crate) lease_started: Instant,
    /// When the grant came back.
    pub(crate) returned: Instant,
    pub(crate) renewal_interval: Option<Duration>,
    pub(crate) max_hold: Option<Duration>,
    pub(crate) reentry: Option<(Weak<Registry<Held>>, RegistryKey)>,
    pub(crate) watchdog: Watchdog,
    pub(crate) metrics: Arc<Handles>,
}

impl LockGuard {
    pub(crate) fn start(new: NewGuard) -> Self {
        // A cap too far away to represent is no cap.
        let hold_limit = new.max_hold.and_then(|m| new.lease_started.checked_add(m));
        let mut valid_until = new.lease_started + new.ttl - new.drift;
        if let Some(limit) = hold_limit {
            valid_until = valid_until.min(limit);
        }
        let renewer = new.lease.renewer();
        let shared_loss = new.lease.shared_loss();
        let held = Arc::new(Held {
            name: new.name,
            kind: new.kind,
            owner: new.owner,
            token: new.token,
            backend: new.backend,
            lease: new.lease,
            renewer,
            ttl: new.ttl,
            lease_ttl: new.lease_ttl,
            drift: new.drift,
            operation_timeout: new.operation_timeout,
            hold_limit,
            valid_until: Mutex::new(valid_until),
            lease_end: Mutex::new(new.lease_started + new.lease_ttl),
            lost: Mutex::new(None),
            flags: Flags::default(),
            schedule: Mutex::new(Schedule::new(new.lease_started, new.renewal_interval)),
            watchdog: new.watchdog,
            holds: Mutex::new(1),
            reentry: new.reentry.map(Box::new),
            loss_group: shared_loss.as_ref().map(|(epochs, _)| epochs.id()),
            metrics: new.metrics,
            returned: new.returned,
            holding: AtomicBool::new(true),
        });
        held.metrics.hold_started();
        let entry = held.clone() as Arc<dyn Watched>;
        held.watchdog.watch(&entry);
        if let Some((epochs, since)) = shared_loss {
            held.watchdog.join_loss(&epochs, since, &entry);
        }
        if let Some(signal) = held.lease.loss_signal() {
            // Only backends that learn of a loss by themselves (sessions) have one; the
            // client's watchdog task polls it until the guard stops.
            let watched = held.clone();
            let span = tracing::debug_span!("distlock.loss_signal", backend = held.backend, name = %held.name);
            let signal = async move {
                let held = watched;
                tokio::select! {
                    biased;
                    () = held.stop().raised() => {}
                    reason = signal => held.signal_loss(reason),
                }
            };
            held.watchdog.watch_loss(Box::pin(signal.instrument(span)));
        }
        Self {
            held,
            finished: false,
        }
    }

    /// Another guard on the same lease (reentrant acquisition), if it is still held.
    pub(crate) fn reenter(held: &Arc<Held>) -> Option<Self> {
        let mut holds = lock(&held.holds);
        if *holds == 0 || held.is_lost() {
            return None;
        }
        *holds += 1;
        Some(Self {
            held: held.clone(),
            finished: false,
        })
    }

    pub(crate) fn held(&self) -> &Arc<Held> {
        &self.held
    }

    /// The lock name.
    pub fn name(&self) -> &LockName {
        &self.held.name
    }

    /// What this guard holds: the whole lock, a shared hold, or one permit.
    pub fn kind(&self) -> LockKind {
        self.held.kind
    }

    /// The unique owner value stored on the server for this acquisition.
    pub fn owner(&self) -> &str {
        &self.held.owner
    }

    /// The fencing token of this acquisition.
    pub fn token(&self) -> FencingToken {
        self.held.token
    }

    /// The lease length this lock was acquired with.
    pub fn ttl(&self) -> Duration {
        self.held.ttl
    }

    /// The monotonic instant until which the lock is certainly held, unless the server lost
    /// data. Computed from when the last successful acquire or renew request was *sent*, minus
    /// the drift margin, so it is never later than the server-side expiry.
    pub fn valid_until(&self) -> Instant {
        self.held.valid_until()
    }

    /// Whether the lock may be lost: a loss was reported, or [`valid_until`](Self::valid_until)
    /// has passed.
    pub fn is_lost(&self) -> bool {
        self.held.is_lost()
    }

    /// Why the lock was lost, if a loss has been reported.
    pub fn loss_reason(&self) -> Option<LossReason> {
        self.held.loss_reason()
    }

    /// A future that resolves when the lock is lost (renewal refused, lease expired, session
    /// expired, renewals failing past the deadline, hold limit reached). It does not depend on
    /// the guard's lifetime; after a clean release it never resolves.
    ///
    /// Cancel safe: dropping it has no effect.
    pub fn lost(&self) -> impl Future<Output = LossReason> + Send + 'static {
        Self::lost_of(self.held.clone())
    }

    /// [`Self::lost`] of the lease `held`.
    async fn lost_of(held: Arc<Held>) -> LossReason {
        held.flags.flag(LOST).raised().await;
        match held.loss_reason() {
            Some(reason) => reason,
            None => std::future::pending().await,
        }
    }

    /// A view of this guard's lease that does not depend on the guard's lifetime: its
    /// [`valid_until`](LeaseView::valid_until) follows the renewals for as long as the guard
    /// (or a guard it became part of, such as a [`GatedGuard`](crate::GatedGuard) moved into
    /// an upgrade) goes on holding. For code that hands the guard to a future which consumes
    /// it, and must still stop its work before the lease ends.
    ///
    /// ```
    /// # async fn demo() -> Result<(), distlock_core::Error> {
    /// use std::time::Duration;
    /// use distlock_core::{AcquireOptions, UpgradeableRwLock, memory::MemoryStore};
    ///
    /// let store = MemoryStore::new();
    /// let rw = UpgradeableRwLock::new(store.client(), "config")?;
    /// let opts = AcquireOptions::default().with_ttl(Duration::from_millis(300));
    /// let maybe_writer = rw.upgradeable(&opts).await?;
    /// // The gate is held throughout the upgrade, which consumes the guard.
    /// let gate = maybe_writer.gate_guard().lease_view();
    /// let before = gate.valid_until();
    /// let writer = maybe_writer.upgrade(None).await.map_err(|failed| failed.error)?;
    /// tokio::time::sleep(Duration::from_millis(400)).await;
    /// assert!(gate.valid_until() > before, "renewed while the writer holds");
    /// assert!(!gate.is_lost());
    /// writer.release().await?;
    /// # Ok(()) }
    /// # tokio::runtime::Runtime::new().unwrap().block_on(demo()).unwrap();
    /// ```
    pub fn lease_view(&self) -> LeaseView {
        LeaseView {
            held: self.held.clone(),
        }
    }

    /// Renews the lease now, independently of automatic renewal.
    ///
    /// # Errors
    /// [`Error::Lost`] if a loss was already reported; [`Error::NotHeld`] if the server says
    /// the lock is no longer ours (the guard is then lost); [`Error::Unavailable`] if the server
    /// did not answer in time.
    pub async fn renew(&self) -> Result<()> {
        self.held.renew_once().await
    }

    /// Replaces the data stored with this hold on the server (`None` removes it): what
    /// [`inspect`](crate::DistributedLock::inspect), [`list`](crate::DistributedLock::list) and
    /// `distlock status --json` show from then on (see
    /// [`AcquireOptions::with_data`](crate::AcquireOptions::with_data)). Only while this hold is
    /// ours, checked atomically on the server: a former holder's update is refused. Not a
    /// renewal: the lease and `valid_until` stay as they are. Cancel safe: dropped, the update
    /// may or may not have landed.
    ///
    /// # Errors
    /// [`Error::InvalidOptions`] for data over [`crate::MAX_HOLDER_DATA`] bytes or with a NUL;
    /// [`Error::Unsupported`] on a backend without [`holder_data`](crate::Capabilities::holder_data);
    /// [`Error::Lost`] if a loss was already reported; [`Error::NotHeld`] if the server says
    /// the hold is no longer ours (the guard is then lost); [`Error::Unavailable`] if the
    /// server did not answer in time.
    pub async fn set_data(&self, data: Option<&str>) -> Result<()> {
        if let Some(data) = data {
            crate::options::check_holder_data(data)?;
        }
        self.held.set_data(data).await
    }

    /// Proclaims a new value for the leader of an election (etcd's `Proclaim`): the guard of a
    /// [`campaign`](crate::DistributedLock::campaign) changes the value
    /// [`leader`](crate::DistributedLock::leader) and
    /// [`observe`](crate::DistributedLock::observe) report, without a new election: the term
    /// stays. Refused once this guard no longer leads (a deposed leader cannot overwrite its
    /// successor's value). Stored as the hold's data ([`set_data`](Self::set_data)).
    ///
    /// # Errors
    /// As [`set_data`](Self::set_data); [`Error::InvalidOptions`] for a value over
    /// [`Leader::MAX_VALUE_LEN`](crate::Leader::MAX_VALUE_LEN) bytes, or from a guard that is not
    /// a campaign's.
    pub async fn proclaim(&self, value: &str) -> Result<()> {
        crate::election::check_value(value)?;
        if !crate::election::is_campaign_owner(&self.held.owner) {
            return Err(Error::InvalidOptions(
                "proclaim needs the guard of a campaign, not of a plain lock".into(),
            ));
        }
        self.held.set_data(Some(value)).await
    }

    /// Releases the lock (or one reentrant hold of it).
    ///
    /// Cancel safe: the release, once called, reaches the server even if this future is
    /// dropped before its answer (a `tokio::time::timeout` or `select!` around it): the rest
    /// of it then runs on a task of its own, as a dropped guard's release does, and its
    /// answer is not reported. Like that task, it needs the runtime to go on running (a
    /// runtime shut down first drops it; the ttl then frees the lock).
    ///
    /// # Errors
    /// [`Error::Lost`] or [`Error::NotHeld`] if the lock was no longer ours (a reentrant hold
    /// released while others go on reports a loss already known, and sends nothing);
    /// [`Error::Unavailable`] if the server did not answer (the lock then expires by its ttl).
    pub async fn release(mut self) -> Result<()> {
        self.finished = true;
        if !self.held.drop_hold() {
            // Other holds keep the lease and nothing is sent, but a loss is still reported.
            return match self.held.known_loss() {
                Some(reason) => Err(self.held.lost_error(reason)),
                None => Ok(()),
            };
        }
        to_the_end(self.held.clone().release_on_server()).await
    }

    /// When the grant came back: where [`Self::hold_at_least`] counts from.
    pub(crate) fn taken_at(&self) -> Instant {
        self.held.returned
    }

    /// Waits until the lock has been held for at least `minimum`, counted from its
    /// acquisition (when the grant came back to `acquire`), so that a job run by several
    /// schedulers does not run again within that time on a host whose clock or timer fires a
    /// little later (ShedLock's `lockAtLeastFor`). Not from the acquire request's sending: a
    /// lease handed over by a release is known only to have started after the waiter's last
    /// read before it, perhaps long before. Call it when the work is done, then
    /// [`release`](Self::release) (or use [`release_after`](Self::release_after), which does
    /// both).
    ///
    /// A [`Renewal::max_hold`](crate::Renewal::max_hold) counts from that earlier instant (the
    /// lease must end by then): a cap less than the minimum plus the wait for the grant ends
    /// the hold first, as a loss. Leave the cap room above the minimum.
    ///
    /// Renewal goes on only while the holder's deadline ([`valid_until`](Self::valid_until))
    /// does not yet cover the minimum plus one operation timeout (so that the release
    /// certainly arrives before the lease ends); then it stops,
    /// so a holder that dies while waiting leaves a lease that ends soon after the minimum,
    /// not a ttl later. Returns at once when the minimum has passed or the lock is lost; a
    /// minimum too far away to represent is waited for until the lock is lost.
    ///
    /// Cancel safe: dropping the future ends the wait; renewal may have stopped by then, so
    /// release the guard next rather than go on working under it.
    pub async fn hold_at_least(&self, minimum: Duration) {
        let held = &self.held;
        let until = held.returned.checked_add(minimum);
        let mut renewing = true;
        loop {
            let now = Instant::now();
            if until.is_some_and(|until| now >= until) || held.is_lost() {
                return;
            }
            // The holder's own deadline, not the server's lease (longer by the drift margin and
            // any lock-delay): renewal stopped on the lease alone left a deadline that passed
            // before the minimum, and the hold ended there as a loss.
            let covered = until
                .and_then(|until| until.checked_add(held.operation_timeout))
                .is_some_and(|needed| held.valid_until() >= needed);
            if renewing && covered {
                renewing = false;
                held.stop().raise();
                held.watchdog.unwatch(&**held);
                debug!(name = %held.name, "renewal stopped: the deadline covers the minimum hold");
            }
            // Woken by the minimum, a loss, or in time to see the next renewal's lease end.
            let step = now + (held.ttl / 6).max(Duration::from_millis(1));
            let wake = until.map_or(step, |until| until.min(step));
            tokio::select! {
                () = tokio::time::sleep_until(wake.into()) => {}
                () = held.flags.flag(LOST).raised() => return,
            }
        }
    }

    /// Releases the lock once it has been held for at least `minimum` since its acquisition:
    /// [`hold_at_least`](Self::hold_at_least), then [`release`](Self::release).
    ///
    /// # Errors
    /// As [`release`](Self::release).
    ///
    /// Cancel safe: dropping the future drops the guard, which releases the lock at once from
    /// a background task (see [Dropping](Self#dropping)).
    pub async fn release_after(self, minimum: Duration) -> Result<()> {
        self.hold_at_least(minimum).await;
        self.release().await
    }

    /// Stops renewal and forgets the lock without releasing it, as a crashed holder would: the
    /// lock stays held on the server until its ttl runs out. Other reentrant guards on the same
    /// lease are abandoned too.
    pub fn abandon(mut self) {
        self.finished = true;
        *lock(&self.held.holds) = 0;
        self.held.end_hold();
        debug!(name = %self.held.name, "guard abandoned, the lock is left to expire");
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.finished || !self.held.drop_hold() {
            return;
        }
        self.held.stop().raise();
        self.held.watchdog.unwatch(&*self.held);
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                let held = self.held.clone();
                handle.spawn(async move {
                    if let Err(err) = held.release_on_server().await {
                        debug!(%err, "release after drop failed; the ttl frees the lock");
                    }
                });
            }
            Err(_) => {
                self.held.end_hold();
                debug!(name = %self.held.name, "guard dropped outside a runtime; the ttl frees the lock")
            }
        }
    }
}

/// A guard's lease seen from outside the guard ([`LockGuard::lease_view`]). Cloned cheaply;
/// `'static`. Once the guard is released, abandoned or dropped, its
/// [`valid_until`](Self::valid_until) no longer moves (a released lock is not held, whatever it
/// says), and [`lost`](Self::lost) resolves only if the lock was lost before.
#[derive(Clone)]
pub struct LeaseView {
    held: Arc<Held>,
}

impl LeaseView {
    /// As [`LockGuard::valid_until`]: until when the lock is certainly held, as of the last
    /// successful acquire or renew request.
    pub fn valid_until(&self) -> Instant {
        self.held.valid_until()
    }

    /// As [`LockGuard::is_lost`].
    pub fn is_lost(&self) -> bool {
        self.held.is_lost()
    }

    /// As [`LockGuard::lost`]: resolves when the lock is lost (never after a clean
    /// release). Cancel safe.
    pub fn lost(&self) -> impl Future<Output = LossReason> + Send + 'static {
        LockGuard::lost_of(self.held.clone())
    }
}

impl fmt::Debug for LeaseView {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseView")
            .field("name", &self.held.name)
            .field("token", &self.held.token)
            .field("lost", &self.held.loss_reason())
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("backend", &self.held.backend)
            .field("name", &self.held.name)
            .field("token", &self.held.token)
            .field("owner", &self.held.owner)
            .field("lost", &self.loss_reason())
            .finish_non_exhaustive()
    }
}

impl Reentrant for Held {
    fn is_lost(&self) -> bool {
        Held::is_lost(self)
    }
}

impl Held {
    pub(crate) fn valid_until(&self) -> Instant {
        *lock(&self.valid_until)
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.flags.flag(LOST).is_raised() || Instant::now() >= self.valid_until()
    }

    fn loss_reason(&self) -> Option<LossReason> {
        lock(&self.lost).clone()
    }

    /// Records a loss once; the first reason wins.
    pub(crate) fn mark_lost(&self, reason: LossReason) {
        {
            let mut lost = lock(&self.lost);
            if lost.is_some() {
                return;
            }
            *lost = Some(reason.clone());
        }
        // A lock left to expire (abandoned) is no loss of a hold: no warning, no count. Ended
        // and counted before the flag wakes the holder: a holder that releases as soon as it
        // is told (on another thread) would otherwise end the hold first, and the loss would
        // go uncounted.
        if self.end_hold() {
            self.metrics.lost(&reason);
            warn!(backend = self.backend, name = %self.name, token = %self.token, %reason, "lock lost");
        } else {
            debug!(backend = self.backend, name = %self.name, token = %self.token, %reason, "lock expired after its hold ended");
        }
        self.flags.flag(LOST).raise();
    }

    /// Ends the hold for the metrics (held guards, hold time) once; true the first time.
    fn end_hold(&self) -> bool {
        let ended = self.holding.swap(false, Ordering::AcqRel);
        if ended {
            self.metrics.hold_ended(self.returned);
        }
        ended
    }

    /// Drops one hold; true if it was the last one and the lock must now be released.
    fn drop_hold(&self) -> bool {
        let mut holds = lock(&self.holds);
        if *holds == 0 {
            return false;
        }
        *holds -= 1;
        *holds == 0
    }

    /// The loss already known, or, past the local deadline, what the watchdog would call that
    /// expiry (and why), marked as it would.
    fn known_loss(&self) -> Option<LossReason> {
        if let Some(reason) = self.loss_reason() {
            return Some(reason);
        }
        let valid_until = self.valid_until();
        if Instant::now() < valid_until {
            return None;
        }
        let reason = lock(&self.schedule).expiry_reason(self.hold_limit, valid_until);
        self.mark_lost(reason);
        // A batched renewal may have marked the loss first: its reason stands.
        self.loss_reason()
    }

    fn lost_error(&self, reason: LossReason) -> Error {
        Error::Lost {
            name: self.name.to_string(),
            reason,
        }
    }

    /// [`LockGuard::set_data`] of checked data.
    async fn set_data(&self, data: Option<&str>) -> Result<()> {
        if let Some(reason) = self.loss_reason() {
            return Err(self.lost_error(reason));
        }
        let what = Of("setting the holder data", &self.name);
        let result = within(self.operation_timeout, what, self.lease.set_data(data))
            .await
            .and_then(|answer| answer);
        if let Err(err) = &result {
            if err.is_not_held() {
                self.mark_lost(LossReason::RenewalRejected);
            } else {
                self.metrics.backend_error(err);
            }
        }
        result
    }

    pub(crate) async fn renew_once(&self) -> Result<()> {
        if let Some(reason) = self.loss_reason() {
            return Err(self.lost_error(reason));
        }
        let span = tracing::debug_span!("distlock.renew", backend = self.backend, name = %self.name, token = %self.token);
        let sent = Instant::now();
        let timeout = self.operation_timeout;
        let what = Of("renewal", &self.name);
        let result = within(timeout, what, self.lease.renew(self.lease_ttl))
            .instrument(span)
            .await
            .and_then(|answer| answer);
        self.metrics.operation(Op::Renew, sent);
        if let Err(err) = &result
            && !err.is_not_held()
        {
            self.metrics.backend_error(err);
        }
        self.settle_renewal(sent, result)
    }

    /// Applies the answer to a renewal request sent at `sent` (its own, or its part of a
    /// batch): moves the local deadline on success, reports a refusal as a loss. Counts the
    /// renewal, not the request (the caller counts the request and its error).
    pub(crate) fn settle_renewal(&self, sent: Instant, result: Result<()>) -> Result<()> {
        self.metrics.renewed(result.is_ok());
        match result {
            Ok(()) => {
                let mut until = sent + self.ttl - self.drift;
                if let Some(limit) = self.hold_limit {
                    until = until.min(limit);
                }
                let mut valid = lock(&self.valid_until);
                *valid = (*valid).max(until);
                drop(valid);
                let mut end = lock(&self.lease_end);
                *end = (*end).max(sent + self.lease_ttl);
                Ok(())
            }
            Err(err) if err.is_not_held() => {
                self.mark_lost(LossReason::RenewalRejected);
                Err(err)
            }
            Err(err) => Err(err),
        }
    }

    async fn release_on_server(self: Arc<Self>) -> Result<()> {
        let span = tracing::debug_span!("distlock.release", backend = self.backend, name = %self.name, token = %self.token);
        self.clone().release_in_span().instrument(span).await
    }

    async fn release_in_span(self: Arc<Self>) -> Result<()> {
        self.stop().raise();
        self.watchdog.unwatch(&*self);
        if let Some((registry, key)) = self.reentry.as_deref()
            && let Some(registry) = registry.upgrade()
        {
            registry.forget(key, &self);
        }
        let timeout = self.operation_timeout;
        let what = Of("release", &self.name);
        let sent = Instant::now();
        let answer = within(timeout, what, self.lease.release()).await;
        self.metrics.operation(Op::Release, sent);
        self.metrics.released(match &answer {
            Ok(Ok(())) => Released::Ok,
            Ok(Err(err)) if err.is_not_held() => Released::NotHeld,
            Ok(Err(_)) | Err(_) => Released::Error,
        });
        let result = match answer {
            Ok(Ok(())) => Ok(()),
            Ok(Err(err)) if err.is_not_held() => match self.loss_reason() {
                Some(reason) => Err(self.lost_error(reason)),
                // The release stopped the watchdog: one that comes back after the local
                // deadline finds what the watchdog would have called an expiry (and why).
                None if Instant::now() >= self.valid_until() => {
                    let reason = self.known_loss().unwrap_or(LossReason::LeaseExpired);
                    Err(self.lost_error(reason))
                }
                None => {
                    self.mark_lost(LossReason::ReleasedElsewhere);
                    Err(err)
                }
            },
            Ok(Err(err)) | Err(err) => {
                self.metrics.backend_error(&err);
                Err(err)
            }
        };
        self.end_hold();
        debug!(backend = self.backend, name = %self.name, ok = result.is_ok(), "released");
        if result.as_ref().is_err_and(|err| !err.is_not_held()) {
            // Perhaps still held on the server: the backend cleans up once the lease ran out.
            self.clone().ran_out();
        }
        result
    }
}

/// "`operation` of `name`", for error messages, formatted only if one is made.
struct Of<'a>(&'static str, &'a LockName);

impl fmt::Display for Of<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} of {:?}", self.0, self.1.as_str())
    }
}

impl Watched for Held {
    fn schedule(&self) -> &Mutex<Schedule> {
        &self.schedule
    }

    fn stop(&self) -> Flag<'_> {
        self.flags.flag(STOP)
    }

    fn valid_until(&self) -> Instant {
        Held::valid_until(self)
    }

    fn hold_limit(&self) -> Option<Instant> {
        self.hold_limit
    }

    fn ttl(&self) -> Duration {
        self.ttl
    }

    fn lease_ttl(&self) -> Duration {
        self.lease_ttl
    }

    fn name(&self) -> &LockName {
        &self.name
    }

    fn renewing(&self) -> bool {
        *lock(&self.holds) > 0
    }

    fn mark_lost(&self, reason: LossReason) {
        Held::mark_lost(self, reason);
    }

    fn renew_once(&self) -> BoxFuture<'_, Result<()>> {
        Box::pin(Held::renew_once(self))
    }

    fn renewer(&self) -> Option<&Arc<dyn Renewer>> {
        self.renewer.as_ref()
    }

    fn lease(&self) -> &dyn Lease {
        &*self.lease
    }

    fn backend(&self) -> &'static str {
        self.backend
    }

    fn operation_timeout(&self) -> Duration {
        self.operation_timeout
    }

    fn settle_renewal(&self, sent: Instant, result: Result<()>) -> Result<()> {
        Held::settle_renewal(self, sent, result)
    }

    fn metrics(&self) -> &Handles {
        &self.metrics
    }

    fn loss_group(&self) -> Option<usize> {
        self.loss_group
    }

    fn signal_loss(&self, reason: LossReason) {
        // A lock removed once its local deadline passed expired; the backend cannot tell that
        // apart from a removal by somebody else.
        let reason = match reason {
            LossReason::ReleasedElsewhere if Instant::now() >= self.valid_until() => {
                LossReason::LeaseExpired
            }
            other => other,
        };
        self.mark_lost(reason);
        self.stop().raise();
    }

    fn ran_out(self: Arc<Self>) {
        let at = *lock(&self.lease_end);
        crate::backend::spawn_cleanup("removing a lock whose lease ran out", Some(at), move || {
            let held = self.clone();
            async move { held.lease.expired().await }
        });
    }
}
