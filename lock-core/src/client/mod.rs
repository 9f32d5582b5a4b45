//! The generic client: the one implementation of [`DistributedLock`] over any [`LockBackend`].

use std::fmt;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::StreamExt;
use futures::stream::BoxStream;
use rand::Rng;
use tracing::{Instrument, debug, warn};

use crate::backend::{
    AcquireRequest, Acquired, Attempt, AttemptMode, LockBackend, MAX_IMMEDIATE_POLLS,
    NEXT_IN_LINE_MAX_POLL, Step, within,
};
use crate::guard::{Held, LockGuard, NewGuard};
use crate::registry::{Registry, RegistryKey};
use crate::telemetry::{Handles, Instruments, Op};
use crate::watchdog::Watchdog;
use crate::{
    AcquireOptions, Backoff, Capabilities, ClientConfig, DistributedLock, Error, Leader, LockInfo,
    LockName, OwnerId, Result, WakeUp, election,
};

mod wait;

use wait::*;

/// A lock client over one backend. Cheap to clone (clones share connections and the
/// reentrancy table).
///
/// ```
/// # async fn demo() -> Result<(), distlock_core::Error> {
/// use std::sync::Arc;
/// use distlock_core::{DistributedLock, LockClient, memory::{MemoryBackend, MemoryStore}};
///
/// let client = LockClient::new(MemoryBackend::new(MemoryStore::new()));
/// let shared: Arc<dyn DistributedLock> = Arc::new(client);
/// assert_eq!(shared.backend(), "memory");
/// # Ok(()) }
/// ```
pub struct LockClient<B> {
    inner: Arc<Inner<B>>,
}

struct Inner<B> {
    backend: B,
    config: ClientConfig,
    caps: Capabilities,
    registry: Arc<Registry<Held>>,
    watchdog: Watchdog,
    instruments: Instruments,
}

impl<B> Clone for LockClient<B> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<B: LockBackend> fmt::Debug for LockClient<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockClient")
            .field("backend", &self.inner.backend)
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl<B: LockBackend> LockClient<B> {
    /// An operator's request on `name` (a forced release, the release of one hold): within
    /// the operation timeout, in `span`, its duration measured as `op`.
    async fn operator_call(
        &self,
        name: &LockName,
        op: Op,
        what: &'static str,
        span: tracing::Span,
        call: impl Future<Output = Result<bool>>,
    ) -> Result<bool> {
        let metrics = self.inner.instruments.handles(name);
        let sent = Instant::now();
        let removed = within(self.inner.config.operation_timeout, what, call)
            .instrument(span)
            .await
            .and_then(|r| r);
        metrics.measured(op, sent, &removed);
        removed
    }

    /// A client with the default [`ClientConfig`].
    pub fn new(backend: B) -> Self {
        Self::build(backend, ClientConfig::default())
    }

    /// A client with the given configuration.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] if the configuration is inconsistent.
    pub fn with_config(backend: B, config: ClientConfig) -> Result<Self> {
        config.validate()?;
        Ok(Self::build(backend, config))
    }

    fn build(backend: B, config: ClientConfig) -> Self {
        let caps = backend.capabilities();
        let instruments = Instruments::new(backend.name(), config.metrics_per_name);
        Self {
            inner: Arc::new(Inner {
                backend,
                config,
                caps,
                registry: Arc::default(),
                watchdog: Watchdog::default(),
                instruments,
            }),
        }
    }

    /// The backend.
    pub fn backend_ref(&self) -> &B {
        &self.inner.backend
    }

    /// The configuration.
    pub fn config(&self) -> &ClientConfig {
        &self.inner.config
    }

    #[cfg(test)]
    pub(crate) fn watchdog(&self) -> &Watchdog {
        &self.inner.watchdog
    }

    /// This client as a shared trait object.
    pub fn into_dyn(self) -> Arc<dyn DistributedLock> {
        Arc::new(self)
    }

    async fn acquire_with(
        &self,
        name: &str,
        options: &AcquireOptions,
        mode: AttemptMode,
    ) -> Result<Option<LockGuard>> {
        let name = LockName::new(name)?;
        options.validate(&self.inner.caps)?;
        options.check_renewal(&self.inner.config)?;
        let Some(owner) = options.owner.clone() else {
            return self
                .acquire_fresh(name, Owners::Plain(None), options, mode, None)
                .await;
        };
        // Reentrant path: one acquisition at a time per (name, owner, kind), so that a second
        // acquire by the same owner joins the first lease instead of queueing behind it.
        let key = RegistryKey::new(name.clone(), owner, options.kind);
        let slot = self.inner.registry.slot(&key);
        let mut current = slot.lock().await;
        if let Some(guard) = current.upgrade().and_then(|held| LockGuard::reenter(&held)) {
            debug!(name = %name, "reentrant acquisition");
            return Ok(Some(guard));
        }
        let reentry = Some((Arc::downgrade(&self.inner.registry), key.clone()));
        let owners = Owners::Plain(options.owner.as_ref());
        let acquired = self
            .acquire_fresh(name, owners, options, mode, reentry)
            .await;
        if let Ok(Some(guard)) = &acquired {
            *current = Arc::downgrade(guard.held());
        }
        drop(current);
        drop(slot);
        self.inner.registry.tidy(&key);
        acquired
    }

    /// One acquisition by an owner from `owners` (unique to it), without the reentrancy table.
    async fn acquire_fresh(
        &self,
        name: LockName,
        owners: Owners<'_>,
        options: &AcquireOptions,
        mode: AttemptMode,
        reentry: Option<(Weak<Registry<Held>>, RegistryKey)>,
    ) -> Result<Option<LockGuard>> {
        let mut owner = owners.next()?;
        let started = Instant::now();
        let waits = Waits {
            name: &name,
            mode,
            started,
            deadline: wait_deadline(mode, options, started),
        };
        let mut request = AcquireRequest {
            name: name.clone(),
            owner: owner.clone(),
            ttl: options.lease_ttl(),
            mode,
            kind: options.kind,
        };
        let op_timeout = self.inner.config.operation_timeout;
        let metrics = self.inner.instruments.handles(&name);
        let mut attempt = self.begin(&request, &metrics);
        // Grants that came back after the lease they grant had run out, in a row.
        let mut late_grants = 0_u32;
        let mut pacing = Pacing::new(options, self.inner.caps.wake_up);
        let mut report = WaitReport::default();
        let mut last_error: Option<Error>;
        // Counted in `distlock_waiting_acquires` from the first answer that the lock is taken
        // until this call ends (also when its future is dropped).
        let mut waiting = None;
        // The last wake-up of a waiting attempt, for `distlock_handoff_seconds`.
        let mut woken = None;
        loop {
            let sent = Instant::now();
            let step = within(op_timeout, "acquire attempt", attempt.get().poll())
                .await
                .and_then(|step| step);
            metrics.operation(Op::Acquire, sent);
            let delay = match step {
                Ok(Step::Acquired(acquired)) => {
                    attempt.disarm();
                    let drift = self.inner.config.drift(options.ttl);
                    let grant = Grant::new(acquired, sent, options.ttl, drift);
                    if late_grants < MAX_LATE_GRANTS && grant.is_late() {
                        // Not a guard: released, asked for again (see `release_late_grant`).
                        late_grants += 1;
                        warn!(name = %name, ttl = ?options.ttl, late = ?grant.lease_started.elapsed(), "a grant came back after its lease ran out: not used, asking again");
                        release_late_grant(grant.acquired.lease, op_timeout);
                        owner = owners.next()?;
                        request.owner = owner.clone();
                        attempt = self.begin(&request, &metrics);
                        continue;
                    }
                    let returned = metrics.acquired(started, woken.filter(|_| waiting.is_some()));
                    let guard =
                        self.guard(name, owner, options, (grant, returned), reentry, metrics);
                    return with_data(guard, options).await.map(Some);
                }
                Ok(step) => {
                    last_error = None;
                    if mode == AttemptMode::Wait && report.taken(&name, &step) {
                        waiting = Some(metrics.waiting());
                    }
                    match pacing.after(&step) {
                        Some(delay) => delay,
                        None => continue,
                    }
                }
                Err(err) if err.is_retryable() && mode == AttemptMode::Wait => {
                    metrics.backend_error(&err);
                    report.retrying(&name, &err);
                    last_error = Some(err);
                    pacing.backoff.next()
                }
                Err(err) => {
                    metrics.backend_error(&err);
                    attempt.abandon().await;
                    return Err(err);
                }
            };
            if let Some(ended) = waits
                .pause(&mut attempt, &mut pacing, &metrics, delay, &mut last_error)
                .await
            {
                return ended;
            }
            if waiting.is_some() {
                woken = Some(Instant::now());
            }
        }
    }

    /// The guard of `grant`, returned to the caller at `returned`, its watchdog started.
    fn guard(
        &self,
        name: LockName,
        owner: Arc<str>,
        options: &AcquireOptions,
        (grant, returned): (Grant, Instant),
        reentry: Option<(Weak<Registry<Held>>, RegistryKey)>,
        metrics: Arc<Handles>,
    ) -> LockGuard {
        LockGuard::start(NewGuard {
            name,
            kind: options.kind,
            owner,
            token: grant.acquired.token,
            backend: self.inner.backend.name(),
            lease: grant.acquired.lease,
            ttl: grant.ttl,
            lease_ttl: options.lease_ttl(),
            drift: grant.drift,
            operation_timeout: self.inner.config.operation_timeout,
            lease_started: grant.lease_started,
            returned,
            renewal_interval: options.renewal_interval(),
            max_hold: options.renewal.max_hold,
            reentry,
            watchdog: self.inner.watchdog.clone(),
            metrics,
        })
    }

    /// A new attempt of the backend for `request`, abandoned if dropped before it ends.
    fn begin(&self, request: &AcquireRequest, metrics: &Arc<Handles>) -> AttemptCleanup {
        AttemptCleanup::new(
            self.inner.backend.begin(request.clone()),
            self.inner.config.operation_timeout,
            metrics.clone(),
        )
    }
}

/// Where the owner values of one acquisition come from: one for its first attempt, and a new
/// one for each attempt after a grant that came back too late (see `acquire_fresh`).
enum Owners<'a> {
    /// [`unique_owner`], with the explicit owner id if one was given.
    Plain(Option<&'a OwnerId>),
    /// A campaign's: [`election::campaign_owner`] of the leader value.
    Campaign(&'a str),
}

impl Owners<'_> {
    fn next(&self) -> Result<Arc<str>> {
        match self {
            Self::Plain(id) => Ok(unique_owner(*id)),
            Self::Campaign(value) => election::campaign_owner(value).map(Arc::from),
        }
    }
}

/// The owner value of one acquisition: a random v4 UUID from the thread-local generator (no
/// syscall), prefixed with the explicit owner id if one was given.
pub(crate) fn unique_owner(id: Option<&OwnerId>) -> Arc<str> {
    let unique = uuid::Builder::from_random_bytes(rand::rng().random()).into_uuid();
    // Hex-encoded on the stack and copied once into the `Arc`: this runs on every
    // acquisition, and `format!` and `to_string` cost more than the random bytes.
    let mut hex = uuid::Uuid::encode_buffer();
    let unique = unique.simple().encode_lower(&mut hex);
    match id {
        Some(id) => {
            let mut owner = String::with_capacity(id.as_str().len() + 1 + unique.len());
            owner.push_str(id.as_str());
            owner.push(':');
            owner.push_str(unique);
            owner.into()
        }
        None => Arc::from(&*unique),
    }
}

#[async_trait]
impl<B: LockBackend> DistributedLock for LockClient<B> {
    fn backend(&self) -> &'static str {
        self.inner.backend.name()
    }

    fn capabilities(&self) -> &Capabilities {
        &self.inner.caps
    }

    async fn try_acquire(&self, name: &str, options: &AcquireOptions) -> Result<Option<LockGuard>> {
        let span = tracing::debug_span!("distlock.try_acquire", backend = self.backend(), name);
        self.acquire_with(name, options, AttemptMode::Try)
            .instrument(span)
            .await
    }

    async fn acquire(&self, name: &str, options: &AcquireOptions) -> Result<LockGuard> {
        let span = tracing::debug_span!("distlock.acquire", backend = self.backend(), name);
        let acquired = self
            .acquire_with(name, options, AttemptMode::Wait)
            .instrument(span)
            .await?;
        acquired.ok_or_else(|| Error::Backend {
            message: "backend returned no lock in wait mode".into(),
            source: None,
        })
    }

    async fn campaign(
        &self,
        name: &str,
        value: &str,
        options: &AcquireOptions,
    ) -> Result<LockGuard> {
        let span = tracing::debug_span!("distlock.campaign", backend = self.backend(), name);
        async {
            let name = LockName::new(name)?;
            let options = options.clone().exclusive();
            options.validate(&self.inner.caps)?;
            options.check_renewal(&self.inner.config)?;
            let guard = self
                .acquire_fresh(
                    name,
                    Owners::Campaign(value),
                    &options,
                    AttemptMode::Wait,
                    None,
                )
                .await?;
            guard.ok_or_else(|| Error::Backend {
                message: "backend returned no lock in wait mode".into(),
                source: None,
            })
        }
        .instrument(span)
        .await
    }

    fn observe(&self, name: &str, every: Duration) -> BoxStream<'static, Result<Option<Leader>>> {
        let name = match LockName::new(name) {
            Ok(name) => name,
            Err(err) => return futures::stream::once(async { Err(err) }).boxed(),
        };
        let changes = self.inner.backend.watch(&name);
        election::observe(self.clone().into_dyn(), name, changes, every)
    }

    async fn inspect(&self, name: &str) -> Result<Option<LockInfo>> {
        let name = LockName::new(name)?;
        let timeout = self.inner.config.operation_timeout;
        let metrics = self.inner.instruments.handles(&name);
        let sent = Instant::now();
        let result = within(timeout, "inspect", self.inner.backend.inspect(&name))
            .await
            .and_then(|r| r);
        metrics.measured(Op::Inspect, sent, &result);
        result
    }

    async fn list(&self, prefix: Option<&str>, limit: usize) -> Result<Vec<(LockName, LockInfo)>> {
        let prefix = prefix.filter(|p| !p.is_empty());
        if let Some(prefix) = prefix {
            // A non-empty prefix no name could start with is rejected as that name would be.
            LockName::new(prefix)?;
        }
        if limit == 0 {
            return Ok(Vec::new());
        }
        let timeout = self.inner.config.operation_timeout;
        let metrics = self.inner.instruments.shared();
        let sent = Instant::now();
        let listed = within(timeout, "list", self.inner.backend.list(prefix, limit))
            .await
            .and_then(|r| r);
        metrics.measured(Op::List, sent, &listed);
        let mut locks = listed?;
        locks.sort_by(|a, b| a.0.cmp(&b.0));
        locks.dedup_by(|a, b| a.0 == b.0);
        locks.retain(|(name, _)| prefix.is_none_or(|p| name.as_str().starts_with(p)));
        locks.truncate(limit);
        Ok(locks)
    }

    async fn footprint(&self, prefix: &str) -> Result<Option<crate::Footprint>> {
        if !prefix.is_empty() {
            // A prefix no name could start with is rejected as that name would be.
            LockName::new(prefix)?;
        }
        self.inner.backend.footprint(prefix).await
    }

    async fn release_hold(
        &self,
        name: &str,
        owner: &str,
        token: crate::FencingToken,
    ) -> Result<bool> {
        let name = LockName::new(name)?;
        if owner.is_empty() || owner.len() > 512 || owner.contains('\0') {
            return Err(Error::InvalidOptions(format!(
                "an owner to release must be 1..=512 bytes without NUL, got {} bytes",
                owner.len()
            )));
        }
        let span = tracing::debug_span!(
            "distlock.release_hold",
            backend = self.backend(),
            name = name.as_str(),
            token = token.get()
        );
        let call = self.inner.backend.release_hold(&name, owner, token);
        let removed = self
            .operator_call(&name, Op::ReleaseHold, "release hold", span, call)
            .await?;
        tracing::warn!(
            backend = self.backend(),
            name = name.as_str(),
            token = token.get(),
            removed,
            "released a hold by its owner and token"
        );
        Ok(removed)
    }

    async fn force_release(&self, name: &str) -> Result<bool> {
        let name = LockName::new(name)?;
        let span = tracing::debug_span!(
            "distlock.force_release",
            backend = self.backend(),
            name = name.as_str()
        );
        let call = self.inner.backend.force_release(&name);
        let removed = self
            .operator_call(&name, Op::ForceRelease, "force release", span, call)
            .await?;
        tracing::warn!(
            backend = self.backend(),
            name = name.as_str(),
            removed,
            "force-released a lock"
        );
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_within_bounds_and_resets() {
        let cfg = Backoff::new(Duration::from_millis(2), Duration::from_millis(50));
        let mut state = BackoffState::new(&cfg);
        for _ in 0..100 {
            let delay = state.next();
            assert!(delay >= cfg.min && delay <= cfg.max, "{delay:?}");
        }
        assert_eq!(state.current, cfg.max);
        state.reset();
        assert_eq!(state.next(), cfg.min);
    }

    #[test]
    fn again_polls_at_once_a_bounded_number_of_times_then_backs_off() {
        let options = AcquireOptions::default();
        let mut pacing = Pacing::new(&options, WakeUp::Event);
        for _ in 0..MAX_IMMEDIATE_POLLS {
            assert_eq!(pacing.after(&Step::Again), None);
        }
        let delay = pacing
            .after(&Step::Again)
            .expect("the backoff after the budget");
        assert!(delay >= options.backoff.min, "{delay:?}");
        // The budget starts again after the backoff, and after any other answer.
        assert_eq!(pacing.after(&Step::Again), None);
        pacing.after(&Step::busy(None));
        assert_eq!(pacing.again, 0);
    }

    #[test]
    fn the_next_in_line_polls_briskly_only_without_events() {
        let options = AcquireOptions::default();
        let mut polling = Pacing::new(&options, WakeUp::Polling);
        let next = |p: &mut Pacing| p.after(&Step::NextInLine { retry_after: None }).unwrap();
        let delays: Vec<_> = (0..8).map(|_| next(&mut polling)).collect();
        let ms = |n| Duration::from_millis(n);
        assert_eq!(
            delays,
            [ms(1), ms(2), ms(4), ms(8), ms(16), ms(20), ms(20), ms(20)]
        );
        // A busy answer ends the brisk run; a known lease end comes first.
        polling.after(&Step::busy(None));
        assert_eq!(next(&mut polling), ms(1));
        let sooner = Step::NextInLine {
            retry_after: Some(Duration::ZERO),
        };
        assert_eq!(polling.after(&sooner), Some(Duration::ZERO));
        // With events, the next holder waits for its wake-up like any waiter.
        let mut events = Pacing::new(&options, WakeUp::Event);
        assert_eq!(next(&mut events), options.backoff.max);
    }

    #[test]
    fn a_contended_round_pauses_up_to_a_tenth_of_the_ttl() {
        for (ttl, cap) in [(10u64, 2u64), (300, 30), (60_000, 50)] {
            let options = AcquireOptions::default().with_ttl(Duration::from_millis(ttl));
            let mut pacing = Pacing::new(&options, WakeUp::Event);
            for _ in 0..200 {
                let pause = pacing.after(&Step::Contended).unwrap();
                assert!(
                    pause >= Duration::from_millis(1) && pause <= Duration::from_millis(cap),
                    "ttl {ttl} ms: {pause:?}"
                );
            }
        }
    }

    #[test]
    fn retried_errors_are_reported_at_once_then_rate_limited() {
        let name = LockName::new("x").unwrap();
        let err = Error::Unavailable {
            message: "down".into(),
            source: None,
        };
        let mut report = WaitReport::default();
        assert!(
            report.retrying(&name, &err),
            "the first failure is reported"
        );
        assert!(!report.retrying(&name, &err));
        assert!(!report.retrying(&name, &err));
        assert_eq!(report.unreported, 2);
        report.last = Instant::now().checked_sub(FAILURE_REPORT_EVERY);
        assert!(
            report.retrying(&name, &err),
            "reported again after the interval"
        );
        assert_eq!(report.unreported, 0);
    }
}
