//! Acquisition options, renewal policy, backoff and client configuration.

use std::time::Duration;

use crate::{Capabilities, Error, LockKind};

/// How a lock is acquired and held. Built from [`AcquireOptions::default`] with the `with_*`
/// methods.
///
/// ```
/// use std::time::Duration;
/// use distlock_core::{AcquireOptions, Renewal};
///
/// let opts = AcquireOptions::default()
///     .with_ttl(Duration::from_secs(10))
///     .with_wait(Duration::from_secs(2))
///     .with_renewal(Renewal::auto().max_hold(Duration::from_secs(600)));
/// assert_eq!(opts.ttl, Duration::from_secs(10));
/// ```
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct AcquireOptions {
    /// Lease length on the server. A holder that stops renewing (crash, pause) loses the lock at
    /// most this long after its last successful renewal. Default 30 s.
    pub ttl: Duration,
    /// How long [`acquire`](crate::DistributedLock::acquire) waits for the lock before failing
    /// with [`Error::Timeout`]. `None` waits forever. Ignored by `try_acquire`. Default `None`.
    pub wait: Option<Duration>,
    /// Automatic renewal while the guard lives. Default: on, every `ttl / 3`, no cap.
    pub renewal: Renewal,
    /// Retry pacing while waiting, for backends that poll and as a safety net for those that
    /// are woken by events.
    pub backoff: Backoff,
    /// An explicit owner for reentrancy: the same owner acquiring the same name again through
    /// the same client gets another guard on the same lease instead of blocking. `None` (the
    /// default) means every acquisition is a new owner, and a second acquire blocks.
    pub owner: Option<OwnerId>,
    /// What is asked for: the whole lock (the default), a shared hold, or one permit of a
    /// semaphore. See [`LockKind`].
    pub kind: LockKind,
    /// Lock-delay (Chubby's, Consul's): when this hold ends without a release (the holder
    /// crashed, was cut off or paused past its ttl), nobody gets the name for this long after
    /// the hold's lease ran out, so that a resource that cannot check fencing tokens gets time
    /// for the old holder's in-flight writes to drain. A release (or
    /// [`force_release`](crate::DistributedLock::force_release)) frees the name at once.
    /// Default zero. See [`with_lock_delay`](Self::with_lock_delay).
    pub lock_delay: Duration,
    /// Data stored with the hold from its acquisition: who holds it and why (a host, a
    /// process, a job id). See [`with_data`](Self::with_data). Default none.
    pub data: Option<String>,
}

impl Default for AcquireOptions {
    fn default() -> Self {
        Self {
            ttl: Duration::from_secs(30),
            wait: None,
            renewal: Renewal::auto(),
            backoff: Backoff::default(),
            owner: None,
            kind: LockKind::Exclusive,
            lock_delay: Duration::ZERO,
            data: None,
        }
    }
}

impl AcquireOptions {
    /// Sets the lease length.
    #[must_use]
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Sets how long `acquire` waits (`Duration::ZERO` tries once). At the deadline it fails
    /// with [`Error::Timeout`] after removing its queue entry, if any
    /// (one round trip). On a backend that wakes waiters by events it ends right there when
    /// no event came and the holder's lease runs past the deadline; a polling backend asks
    /// once more at the deadline (one round trip more).
    #[must_use]
    pub fn with_wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }

    /// Waits forever in `acquire`.
    #[must_use]
    pub fn wait_forever(mut self) -> Self {
        self.wait = None;
        self
    }

    /// Sets the renewal policy.
    #[must_use]
    pub fn with_renewal(mut self, renewal: Renewal) -> Self {
        self.renewal = renewal;
        self
    }

    /// Sets the retry pacing.
    #[must_use]
    pub fn with_backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Sets an explicit owner, which makes the acquisition reentrant for that owner.
    #[must_use]
    pub fn with_owner(mut self, owner: OwnerId) -> Self {
        self.owner = Some(owner);
        self
    }

    /// Asks for the whole lock (the default): a mutex, or the write side of a read-write lock.
    #[must_use]
    pub fn exclusive(mut self) -> Self {
        self.kind = LockKind::Exclusive;
        self
    }

    /// Asks for the read side of a read-write lock: shared with other shared holders, never
    /// with an exclusive one. New shared holders queue behind a waiting exclusive one.
    #[must_use]
    pub fn shared(mut self) -> Self {
        self.kind = LockKind::Shared;
        self
    }

    /// Asks for one permit of a semaphore of `permits` (at most that many holders at once).
    /// Every caller of one name must give the same number; 0, or more than the backend's
    /// [`Capabilities::max_permits`], is refused when acquiring.
    #[must_use]
    pub fn with_permits(mut self, permits: u32) -> Self {
        self.kind = LockKind::Permit { permits };
        self
    }

    /// Sets what is asked for.
    #[must_use]
    pub fn with_kind(mut self, kind: LockKind) -> Self {
        self.kind = kind;
        self
    }

    /// Sets the lock-delay: a hold that ends without a release keeps the name from everybody
    /// for `delay` after its lease ran out.
    ///
    /// Enforced by the server: the lease written on the server lasts `ttl + delay` (acquire
    /// and every renewal), while the holder's own deadline
    /// ([`LockGuard::valid_until`](crate::LockGuard::valid_until)) and its renewals keep to
    /// `ttl`; a release deletes the lease at once. So a holder that stops renewing learns it
    /// may have lost the lock at most `ttl` after its last renewal, and the next holder gets it
    /// no sooner than `ttl + delay` after it. `ttl + delay` must be within the backend's
    /// [`Capabilities::max_ttl`]. The delay holds exactly as far as the backend keeps its
    /// leases: on a Redis failover or a restart without persistence it is lost with the lock
    /// (see the README's guarantees). The hold's acquisition decides: a later holder's own
    /// delay applies to its own hold. [`LockInfo::remaining`](crate::LockInfo::remaining)
    /// shows the server's lease, delay included.
    ///
    /// ```
    /// use std::time::Duration;
    /// use distlock_core::AcquireOptions;
    ///
    /// let opts = AcquireOptions::default()
    ///     .with_ttl(Duration::from_secs(10))
    ///     .with_lock_delay(Duration::from_secs(5));
    /// assert_eq!(opts.lease_ttl(), Duration::from_secs(15));
    /// ```
    #[must_use]
    pub fn with_lock_delay(mut self, delay: Duration) -> Self {
        self.lock_delay = delay;
        self
    }

    /// Stores `data` with the hold (at most [`MAX_HOLDER_DATA`]
    /// bytes): [`inspect`](crate::DistributedLock::inspect), [`list`](crate::DistributedLock::list)
    /// and `distlock status --json` show it while the lock is held, and
    /// [`LockGuard::set_data`](crate::LockGuard::set_data) replaces it. It is written right
    /// after the grant, before `acquire` returns (a reader in between sees the hold without
    /// it), and ends with the hold. Anyone who can read the locks can read it: never a
    /// secret. Needs [`Capabilities::holder_data`] (else `Unsupported`).
    ///
    /// ```
    /// use distlock_core::AcquireOptions;
    ///
    /// let opts = AcquireOptions::default().with_data("host=web-3 job=nightly-report");
    /// assert_eq!(opts.data.as_deref(), Some("host=web-3 job=nightly-report"));
    /// ```
    #[must_use]
    pub fn with_data(mut self, data: impl Into<String>) -> Self {
        self.data = Some(data.into());
        self
    }

    /// The lease written on the server: the ttl plus the [lock-delay](Self::with_lock_delay).
    pub fn lease_ttl(&self) -> Duration {
        self.ttl.saturating_add(self.lock_delay)
    }

    /// The interval between automatic renewals, if renewal is on.
    pub fn renewal_interval(&self) -> Option<Duration> {
        self.renewal
            .enabled
            .then(|| self.renewal.interval_for(self.ttl))
    }

    /// Checks the options against themselves and the backend's limits. `acquire` also checks
    /// a renewal interval against the client's drift margin (see [`Renewal::every`]).
    ///
    /// # Errors
    /// [`Error::InvalidOptions`] naming the offending value; [`Error::Unsupported`] for a
    /// kind the backend does not offer.
    pub fn validate(&self, caps: &Capabilities) -> Result<(), Error> {
        let bad = |msg: String| Err(Error::InvalidOptions(msg));
        match self.kind {
            LockKind::Exclusive => {}
            LockKind::Shared if caps.shared => {}
            LockKind::Shared => {
                return Err(Error::Unsupported(
                    "this backend has no shared (read) locks".into(),
                ));
            }
            LockKind::Permit { .. } if caps.max_permits == 0 => {
                return Err(Error::Unsupported("this backend has no semaphores".into()));
            }
            LockKind::Permit { permits } if permits == 0 || permits > caps.max_permits => {
                return bad(format!(
                    "a semaphore needs 1 ..= {} permits on this backend, got {permits}",
                    caps.max_permits
                ));
            }
            LockKind::Permit { .. } => {}
        }
        if self.ttl.is_zero() {
            return bad("ttl must be greater than zero".into());
        }
        if self.ttl < caps.min_ttl || self.ttl > caps.max_ttl {
            return bad(format!(
                "ttl {:?} is outside this backend's limits ({:?} ..= {:?})",
                self.ttl, caps.min_ttl, caps.max_ttl
            ));
        }
        if let Some(data) = &self.data {
            if !caps.holder_data {
                return Err(Error::Unsupported(
                    "this backend stores no data with a hold".into(),
                ));
            }
            check_holder_data(data)?;
        }
        if self.lease_ttl() > caps.max_ttl {
            return bad(format!(
                "ttl {:?} plus lock-delay {:?} is longer than this backend's longest lease {:?}",
                self.ttl, self.lock_delay, caps.max_ttl
            ));
        }
        if let Some(interval) = self.renewal.interval
            && (interval.is_zero() || interval >= self.ttl)
        {
            return bad(format!(
                "renewal interval {interval:?} must be greater than zero and shorter than the ttl {:?}",
                self.ttl
            ));
        }
        if self.renewal.max_hold.is_some_and(|m| m.is_zero()) {
            return bad("max_hold must be greater than zero".into());
        }
        if self.backoff.min.is_zero() || self.backoff.min > self.backoff.max {
            return bad(format!(
                "backoff needs 0 < min <= max, got min {:?}, max {:?}",
                self.backoff.min, self.backoff.max
            ));
        }
        if !(self.backoff.factor.is_finite() && self.backoff.factor >= 1.0) {
            return bad(format!(
                "backoff factor must be >= 1, got {}",
                self.backoff.factor
            ));
        }
        Ok(())
    }

    /// Checks the renewal interval against the holder's deadline, which the client's drift
    /// margin puts before the ttl: a renewal due after that deadline would find every hold
    /// lost before its first renewal.
    pub(crate) fn check_renewal(&self, config: &ClientConfig) -> Result<(), Error> {
        let Some(interval) = self.renewal_interval() else {
            return Ok(());
        };
        let drift = config.drift(self.ttl);
        if interval >= self.ttl.saturating_sub(drift) {
            return Err(Error::InvalidOptions(format!(
                "renewal interval {interval:?} must be shorter than the ttl {:?} less the \
                 client's drift margin {drift:?}",
                self.ttl
            )));
        }
        Ok(())
    }
}

/// The largest data stored with a hold ([`AcquireOptions::with_data`]), in bytes: a host, a
/// process id and a command line fit; a document does not belong in a lock.
pub const MAX_HOLDER_DATA: usize = 512;

/// Checks data for a hold: at most [`MAX_HOLDER_DATA`] bytes, no NUL.
pub(crate) fn check_holder_data(data: &str) -> Result<(), Error> {
    if data.len() > MAX_HOLDER_DATA || data.contains('\0') {
        return Err(Error::InvalidOptions(format!(
            "holder data must be at most {MAX_HOLDER_DATA} bytes without NUL, got {} bytes",
            data.len()
        )));
    }
    Ok(())
}

/// Automatic renewal (the "watchdog") of a held lock.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Renewal {
    /// Whether the guard renews its lease in the background.
    pub enabled: bool,
    /// Interval between renewals; `None` means `ttl / 3`. Must be shorter than the ttl less
    /// the client's drift margin (see [`Renewal::every`]).
    pub interval: Option<Duration>,
    /// Cap on the total hold time: renewal stops so that the lease ends no later than this long
    /// after the earliest instant it may have started (the sending of the request that took
    /// it; for a lease handed over by a release, the waiter's last read before that release),
    /// and the guard then reports
    /// [`LossReason::HoldLimitReached`](crate::LossReason::HoldLimitReached).
    pub max_hold: Option<Duration>,
}

/// The renewal interval when none is set: a third of the ttl, so that a lease survives one
/// lost or late renewal with a third of it to spare.
pub fn default_renewal_interval(ttl: Duration) -> Duration {
    ttl / 3
}

impl Renewal {
    /// The interval between renewals of a lease of `ttl`: the one set, else
    /// [`default_renewal_interval`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use distlock_core::Renewal;
    ///
    /// let ttl = Duration::from_secs(9);
    /// assert_eq!(Renewal::auto().interval_for(ttl), Duration::from_secs(3));
    /// let every_second = Renewal::auto().every(Duration::from_secs(1));
    /// assert_eq!(every_second.interval_for(ttl), Duration::from_secs(1));
    /// ```
    pub fn interval_for(&self, ttl: Duration) -> Duration {
        self.interval
            .unwrap_or_else(|| default_renewal_interval(ttl))
    }

    /// Renew every `ttl / 3` with no cap.
    pub fn auto() -> Self {
        Self {
            enabled: true,
            interval: None,
            max_hold: None,
        }
    }

    /// No renewal: the lease ends after one ttl unless renewed by hand.
    pub fn disabled() -> Self {
        Self {
            enabled: false,
            interval: None,
            max_hold: None,
        }
    }

    /// Renew at this interval instead of `ttl / 3`. The interval counts from when the last
    /// renewal was sent, not from its answer, so a slow answer does not shrink the margin the
    /// lease keeps (`ttl - interval`); rounds are at least `interval / 4` apart. It must be
    /// shorter than the holder's deadline, the ttl less the client's drift margin
    /// ([`ClientConfig::drift`]): a longer one is refused at acquire
    /// ([`Error::InvalidOptions`]).
    #[must_use]
    pub fn every(mut self, interval: Duration) -> Self {
        self.interval = Some(interval);
        self
    }

    /// Stop renewing so that the lock is held at most this long.
    #[must_use]
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = Some(max_hold);
        self
    }
}

impl Default for Renewal {
    fn default() -> Self {
        Self::auto()
    }
}

/// Jittered exponential backoff between attempts while waiting.
///
/// Each delay is drawn uniformly from `[min, current]`, where `current` starts at `min` and is
/// multiplied by `factor` after every attempt up to `max`. Event-driven backends use `max` only
/// as a safety net between wake-ups.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Backoff {
    /// Smallest delay. Default 2 ms.
    pub min: Duration,
    /// Largest delay. Default 250 ms.
    pub max: Duration,
    /// Growth per attempt. Default 2.
    pub factor: f64,
}

impl Backoff {
    /// A backoff between `min` and `max`, doubling.
    pub fn new(min: Duration, max: Duration) -> Self {
        Self {
            min,
            max,
            factor: 2.0,
        }
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new(Duration::from_millis(2), Duration::from_millis(250))
    }
}

/// An explicit owner identity for reentrant acquisition (see [`AcquireOptions::owner`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct OwnerId(String);

impl OwnerId {
    /// Maximum length in bytes.
    pub const MAX_LEN: usize = 128;

    /// Validates an owner id: non-empty, at most [`OwnerId::MAX_LEN`] bytes, no NUL.
    ///
    /// # Errors
    /// [`Error::InvalidOptions`] otherwise.
    pub fn new(id: impl Into<String>) -> Result<Self, Error> {
        let id = id.into();
        if id.is_empty() || id.len() > Self::MAX_LEN || id.contains('\0') {
            return Err(Error::InvalidOptions(format!(
                "an owner id must be 1..={} bytes without NUL",
                Self::MAX_LEN
            )));
        }
        Ok(Self(id))
    }

    /// The id as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Client-wide settings of a [`LockClient`](crate::LockClient).
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct ClientConfig {
    /// Upper bound for any single backend operation (one acquire attempt, a renewal, a release).
    /// An operation that takes longer fails with [`Error::Unavailable`]. Default 5 s.
    pub operation_timeout: Duration,
    /// Clock drift allowance as a fraction of the ttl, subtracted from every lease when
    /// computing `valid_until`. Default 0.01.
    pub drift_factor: f64,
    /// Fixed clock drift allowance added to the above. Default 2 ms.
    pub drift_fixed: Duration,
    /// Whether every metric also carries the lock name as a `name` label (see
    /// [`telemetry`](crate::telemetry)). Default off: each name becomes a time series.
    pub metrics_per_name: bool,
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            operation_timeout: Duration::from_secs(5),
            drift_factor: 0.01,
            drift_fixed: Duration::from_millis(2),
            metrics_per_name: false,
        }
    }
}

impl ClientConfig {
    /// Sets the per-operation timeout.
    #[must_use]
    pub fn with_operation_timeout(mut self, timeout: Duration) -> Self {
        self.operation_timeout = timeout;
        self
    }

    /// Labels every metric with the lock name too (`name`), or not (the default). Use it
    /// only with a bounded set of names: each name is a time series in the recorder, and the
    /// client keeps one set of metric handles per name it has seen.
    #[must_use]
    pub fn with_metrics_per_name(mut self, per_name: bool) -> Self {
        self.metrics_per_name = per_name;
        self
    }

    /// The drift margin for a lease of `ttl`: `ttl * drift_factor + drift_fixed`, at most half
    /// the ttl.
    pub fn drift(&self, ttl: Duration) -> Duration {
        let factor = if self.drift_factor.is_finite() {
            self.drift_factor.clamp(0.0, 0.5)
        } else {
            0.5
        };
        let margin = ttl.mul_f64(factor).saturating_add(self.drift_fixed);
        margin.min(ttl / 2)
    }

    /// Checks the configuration.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a zero timeout or a drift factor outside `0..0.5`.
    pub fn validate(&self) -> Result<(), Error> {
        if self.operation_timeout.is_zero() {
            return Err(Error::InvalidConfig(
                "operation_timeout must be greater than zero".into(),
            ));
        }
        if !(0.0..0.5).contains(&self.drift_factor) {
            return Err(Error::InvalidConfig(format!(
                "drift_factor must be in 0..0.5, got {}",
                self.drift_factor
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FencingGuarantee;

    #[test]
    fn defaults_are_valid_and_renew_at_a_third() {
        let opts = AcquireOptions::default();
        opts.validate(&Capabilities::new(FencingGuarantee::Linearizable))
            .unwrap();
        assert_eq!(opts.renewal_interval(), Some(Duration::from_secs(10)));
        assert_eq!(
            opts.clone()
                .with_renewal(Renewal::disabled())
                .renewal_interval(),
            None
        );
    }

    #[test]
    fn drift_is_bounded_by_half_the_ttl() {
        let config = ClientConfig::default();
        assert_eq!(
            config.drift(Duration::from_secs(10)),
            Duration::from_millis(102)
        );
        assert_eq!(
            config.drift(Duration::from_millis(2)),
            Duration::from_millis(1)
        );
        assert!(
            ClientConfig {
                drift_factor: 0.7,
                ..ClientConfig::default()
            }
            .validate()
            .is_err()
        );
        assert!(
            ClientConfig::default()
                .with_operation_timeout(Duration::ZERO)
                .validate()
                .is_err()
        );
    }

    #[test]
    fn ttl_limits_come_from_the_backend() {
        let caps = Capabilities::new(FencingGuarantee::Linearizable)
            .with_ttl_range(Duration::from_secs(1), Duration::from_secs(60));
        let opts = AcquireOptions::default();
        assert!(
            opts.clone()
                .with_ttl(Duration::from_millis(999))
                .validate(&caps)
                .is_err()
        );
        assert!(
            opts.clone()
                .with_ttl(Duration::from_secs(61))
                .validate(&caps)
                .is_err()
        );
        assert!(
            opts.with_ttl(Duration::from_secs(60))
                .validate(&caps)
                .is_ok()
        );
    }
}
