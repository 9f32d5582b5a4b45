//! Metrics, through the [`metrics`](https://docs.rs/metrics) facade, and the names of the
//! `tracing` spans.
//!
//! Every [`LockClient`](crate::LockClient), whatever its backend, records the metrics below
//! in one place (the shared wait loop, guard and watchdog), labelled `backend` (the
//! backend's [`name`](crate::LockBackend::name): `redis`, `etcd`, ...). distlock has no
//! exporter: install any `metrics` recorder (e.g. `metrics-exporter-prometheus`) **before**
//! creating clients. A client registers its handles once, when it is built, with the recorder
//! installed then; afterwards recording costs an atomic add or a histogram sample, and no
//! allocation, per event.
//!
//! With [`ClientConfig::with_metrics_per_name`](crate::ClientConfig::with_metrics_per_name)
//! every metric also carries a `name` label (the lock name). Off by default: every lock name
//! becomes a time series, and the client keeps one set of handles per name it has seen.
//!
//! | name | type | labels | meaning |
//! |---|---|---|---|
//! | `distlock_acquisitions_total` | counter | backend | locks taken on the server (`acquire`, `try_acquire`, `campaign`; a reentrant re-acquisition is not counted) |
//! | `distlock_try_acquire_refusals_total` | counter | backend | `try_acquire` calls that found the lock held (`Ok(None)`) |
//! | `distlock_acquire_timeouts_total` | counter | backend | `acquire` calls that ended with [`Error::Timeout`] |
//! | `distlock_renewals_total` | counter | backend | successful renewals, automatic or by [`LockGuard::renew`](crate::LockGuard::renew) |
//! | `distlock_renewal_failures_total` | counter | backend | renewals refused by the server or not answered |
//! | `distlock_losses_total` | counter | backend, reason | held locks lost, by [`LossReason`] (`renewal_rejected`, `lease_expired`, `connection_lost`, `session_expired`, `released_elsewhere`, `hold_limit_reached`, `server_restarted`) |
//! | `distlock_releases_total` | counter | backend, result | release requests sent (explicit or after a drop): `ok`, `not_held` (no longer ours), `error` (no answer: the ttl frees it) |
//! | `distlock_backend_errors_total` | counter | backend, kind | errors of backend requests: `unavailable`, `backend`, `quorum_not_reached`, `mismatch`, `unsupported`, `other` |
//! | `distlock_acquire_wait_seconds` | histogram | backend | from the call to holding the lock, for every acquisition counted above |
//! | `distlock_hold_seconds` | histogram | backend | from when `acquire` got the lock to the end of the hold: release, drop, abandon or loss |
//! | `distlock_handoff_seconds` | histogram | backend | for an acquisition that found the lock taken: from the wake-up that preceded the successful attempt (the backend's release event, or the end of the pause between polls) to holding the lock |
//! | `distlock_operation_duration_seconds` | histogram | backend, operation | one backend request: `acquire` (one attempt), `renew` (a batched renewal counts once per lock it renews), `release`, `abandon`, `inspect`, `list`, `force_release`, `release_hold` |
//! | `distlock_held_guards` | gauge | backend | locks this process holds: acquired, and neither released, dropped, abandoned nor lost |
//! | `distlock_waiting_acquires` | gauge | backend | `acquire` calls waiting for a lock they found taken |
//!
//! # Tracing
//!
//! Spans (all at `DEBUG`, so that `INFO` is quiet in a healthy service) and the fields a
//! subscriber can filter on:
//!
//! | span or target | level | fields | when |
//! |---|---|---|---|
//! | `distlock.acquire` | DEBUG | `backend`, `name` | an `acquire` call, its attempts and the acquired guard's creation |
//! | `distlock.try_acquire` | DEBUG | `backend`, `name` | a `try_acquire` call |
//! | `distlock.campaign` | DEBUG | `backend`, `name` | a `campaign` call |
//! | `distlock.renew` | DEBUG | `backend`, `name`, `token` | one renewal request |
//! | `distlock.renew_batch` | DEBUG | `backend`, `locks` | one request renewing `locks` leases together (a backend with a [`Renewer`](crate::Renewer)) |
//! | `distlock.release` | DEBUG | `backend`, `name`, `token` | a release request (explicit or after a drop) |
//! | `distlock.loss_signal` | DEBUG | `backend`, `name` | a backend's own loss report (session expiry) |
//! | `distlock.force_release` | DEBUG | `backend`, `name` | an operator's `force_release` |
//! | `distlock.release_hold` | DEBUG | `backend`, `name`, `token` | `release_hold` of one hold |
//! | `distlock.cleanup` | DEBUG | `what` | a cleanup nobody waits for (a lease that ran out, an unanswered queue entry) |
//! | target `distlock_core::waiting` | DEBUG event | `name` | an `acquire` found the lock taken and waits ([`WAITING_TARGET`](crate::WAITING_TARGET)) |
//! | target `distlock_core::wait` | WARN event | | an `acquire` keeps failing to reach the backend (rate-limited: once, then every 10 s) |
//! | `lock lost` | WARN event | `backend`, `name`, `token`, `reason` | a held lock was lost (an abandoned lock's expiry is `DEBUG`) |
//! | `force-released a lock` | WARN event | `backend`, `name`, `removed` | `force_release` ran |
//! | `released a hold by its owner and token` | WARN event | `backend`, `name`, `token`, `removed` | `release_hold` ran |
//! | target `distlock_redis::restart` | WARN event | `old`, `new` | a Redis server restarted and forgot its locks |
//! | target `distlock_redis::node` | WARN event | | `danger_skip_verify`: TLS certificates are not verified (at connect) |
//! | target `distlock_zookeeper::backend` | WARN event | `session`, `state` | a ZooKeeper session ended; a new one is opened |
//! | target `distlock_zookeeper::session` | WARN event | `base` | the base node is open to anyone (at connect) |
//! | target `distlock_etcd::members` | WARN event | `endpoint` | an etcd member refuses connections: not used until it accepts them again |
//!
//! Nothing logs at `INFO`: a healthy service is quiet at `INFO` and `WARN`. Everything else
//! (retries, pacing, cleanups, releases) is `DEBUG`; the targets are the modules
//! (`distlock_core::client`, `distlock_redis::wake`, ...), so `RUST_LOG=distlock_core=debug`
//! or a span filter like `[distlock.acquire{name=invoices}]=debug` picks what to see.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use metrics::{Counter, Gauge, Histogram, Label, Unit};

use crate::backend::unpoisoned as lock;
use crate::{Error, LockName, LossReason};

/// `distlock_acquisitions_total`: locks taken on the server.
pub const ACQUISITIONS: &str = "distlock_acquisitions_total";
/// `distlock_try_acquire_refusals_total`: `try_acquire` calls that found the lock held.
pub const TRY_ACQUIRE_REFUSALS: &str = "distlock_try_acquire_refusals_total";
/// `distlock_acquire_timeouts_total`: `acquire` calls that timed out.
pub const ACQUIRE_TIMEOUTS: &str = "distlock_acquire_timeouts_total";
/// `distlock_renewals_total`: successful renewals.
pub const RENEWALS: &str = "distlock_renewals_total";
/// `distlock_renewal_failures_total`: renewals refused or not answered.
pub const RENEWAL_FAILURES: &str = "distlock_renewal_failures_total";
/// `distlock_losses_total` (label `reason`): held locks lost.
pub const LOSSES: &str = "distlock_losses_total";
/// `distlock_releases_total` (label `result`): release requests sent.
pub const RELEASES: &str = "distlock_releases_total";
/// `distlock_backend_errors_total` (label `kind`): failed backend requests.
pub const BACKEND_ERRORS: &str = "distlock_backend_errors_total";
/// `distlock_acquire_wait_seconds`: from the call to holding the lock.
pub const ACQUIRE_WAIT: &str = "distlock_acquire_wait_seconds";
/// `distlock_hold_seconds`: from when `acquire` got the lock to the end of the hold.
pub const HOLD: &str = "distlock_hold_seconds";
/// `distlock_handoff_seconds`: from the wake-up to holding the lock, after a wait.
pub const HANDOFF: &str = "distlock_handoff_seconds";
/// `distlock_operation_duration_seconds` (label `operation`): one backend request.
pub const OPERATION_DURATION: &str = "distlock_operation_duration_seconds";
/// `distlock_held_guards`: locks this process holds.
pub const HELD_GUARDS: &str = "distlock_held_guards";
/// `distlock_waiting_acquires`: `acquire` calls waiting for a taken lock.
pub const WAITING_ACQUIRES: &str = "distlock_waiting_acquires";

/// The values of the `reason` label of [`LOSSES`], in the order of [`LossReason`]'s variants.
pub const LOSS_REASONS: [&str; 8] = [
    "renewal_rejected",
    "lease_expired",
    "connection_lost",
    "session_expired",
    "released_elsewhere",
    "hold_limit_reached",
    "server_restarted",
    "failover",
];

/// The values of the `result` label of [`RELEASES`].
pub const RELEASE_RESULTS: [&str; 3] = ["ok", "not_held", "error"];

/// The values of the `kind` label of [`BACKEND_ERRORS`] (`other`: any other error kind).
pub const ERROR_KINDS: [&str; 6] = [
    "unavailable",
    "backend",
    "quorum_not_reached",
    "mismatch",
    "unsupported",
    "other",
];

/// The values of the `operation` label of [`OPERATION_DURATION`].
pub const OPERATIONS: [&str; 8] = [
    "acquire",
    "renew",
    "release",
    "abandon",
    "inspect",
    "list",
    "force_release",
    "release_hold",
];

/// A backend request, as the `operation` label names it.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Op {
    Acquire = 0,
    Renew = 1,
    Release = 2,
    Abandon = 3,
    Inspect = 4,
    List = 5,
    ForceRelease = 6,
    ReleaseHold = 7,
}

/// How a release request ended, as the `result` label names it.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Released {
    Ok = 0,
    NotHeld = 1,
    Error = 2,
}

fn loss_index(reason: &LossReason) -> usize {
    match reason {
        LossReason::RenewalRejected => 0,
        LossReason::LeaseExpired => 1,
        LossReason::ConnectionLost => 2,
        LossReason::SessionExpired => 3,
        LossReason::ReleasedElsewhere => 4,
        LossReason::HoldLimitReached => 5,
        LossReason::ServerRestarted => 6,
        LossReason::Failover => 7,
    }
}

fn error_index(err: &Error) -> usize {
    match err {
        Error::Unavailable { .. } => 0,
        Error::Backend { .. } => 1,
        Error::QuorumNotReached { .. } => 2,
        Error::Mismatch { .. } => 3,
        Error::Unsupported(_) => 4,
        _ => 5,
    }
}

/// The handles of one label set (a backend, and a lock name if names are labels). Registered
/// once; recording through them allocates nothing.
pub(crate) struct Handles {
    acquisitions: Counter,
    refusals: Counter,
    timeouts: Counter,
    renewals: Counter,
    renewal_failures: Counter,
    losses: [Counter; LOSS_REASONS.len()],
    releases: [Counter; RELEASE_RESULTS.len()],
    backend_errors: [Counter; ERROR_KINDS.len()],
    wait: Histogram,
    hold: Histogram,
    handoff: Histogram,
    operations: [Histogram; OPERATIONS.len()],
    held: Gauge,
    waiting: Gauge,
}

impl Handles {
    fn register(backend: &'static str, name: Option<&LockName>) -> Self {
        let base: Vec<Label> = std::iter::once(Label::from_static_parts("backend", backend))
            .chain(name.map(|n| Label::new("name", n.as_str().to_owned())))
            .collect();
        let with = |key: &'static str, value: &'static str| {
            let mut labels = base.clone();
            labels.push(Label::from_static_parts(key, value));
            labels
        };
        let counter = |name: &'static str| metrics::counter!(name, base.clone());
        let histogram = |name: &'static str| metrics::histogram!(name, base.clone());
        let gauge = |name: &'static str| metrics::gauge!(name, base.clone());
        Self {
            acquisitions: counter(ACQUISITIONS),
            refusals: counter(TRY_ACQUIRE_REFUSALS),
            timeouts: counter(ACQUIRE_TIMEOUTS),
            renewals: counter(RENEWALS),
            renewal_failures: counter(RENEWAL_FAILURES),
            losses: LOSS_REASONS.map(|r| metrics::counter!(LOSSES, with("reason", r))),
            releases: RELEASE_RESULTS.map(|r| metrics::counter!(RELEASES, with("result", r))),
            backend_errors: ERROR_KINDS.map(|k| metrics::counter!(BACKEND_ERRORS, with("kind", k))),
            wait: histogram(ACQUIRE_WAIT),
            hold: histogram(HOLD),
            handoff: histogram(HANDOFF),
            operations: OPERATIONS
                .map(|o| metrics::histogram!(OPERATION_DURATION, with("operation", o))),
            held: gauge(HELD_GUARDS),
            waiting: gauge(WAITING_ACQUIRES),
        }
    }

    /// Counts an acquisition whose `acquire` started at `started` (`woken`: the wake-up before
    /// the successful attempt, when the lock was found taken first); returns now, when the
    /// grant came back: where its hold starts for [`HOLD`].
    pub(crate) fn acquired(&self, started: Instant, woken: Option<Instant>) -> Instant {
        let now = Instant::now();
        self.acquisitions.increment(1);
        self.wait.record(now.saturating_duration_since(started));
        if let Some(woken) = woken {
            self.handoff.record(now.saturating_duration_since(woken));
        }
        now
    }

    pub(crate) fn refused(&self) {
        self.refusals.increment(1);
    }

    pub(crate) fn timed_out(&self) {
        self.timeouts.increment(1);
    }

    /// A backend request of `op` that started at `sent` ended now.
    pub(crate) fn operation(&self, op: Op, sent: Instant) {
        self.operations[op as usize].record(sent.elapsed());
    }

    /// A backend request of `op` that started at `sent` ended now with `result`.
    pub(crate) fn measured<T>(&self, op: Op, sent: Instant, result: &Result<T, Error>) {
        self.operation(op, sent);
        if let Err(err) = result {
            self.backend_error(err);
        }
    }

    /// A backend request failed (a refusal, [`Error::NotHeld`], is not an error).
    pub(crate) fn backend_error(&self, err: &Error) {
        if !err.is_not_held() {
            self.backend_errors[error_index(err)].increment(1);
        }
    }

    pub(crate) fn renewed(&self, ok: bool) {
        if ok {
            self.renewals.increment(1);
        } else {
            self.renewal_failures.increment(1);
        }
    }

    pub(crate) fn lost(&self, reason: &LossReason) {
        self.losses[loss_index(reason)].increment(1);
    }

    pub(crate) fn released(&self, result: Released) {
        self.releases[result as usize].increment(1);
    }

    pub(crate) fn hold_started(&self) {
        self.held.increment(1.0);
    }

    pub(crate) fn hold_ended(&self, returned: Instant) {
        self.held.decrement(1.0);
        self.hold.record(returned.elapsed());
    }

    /// Counts an `acquire` as waiting until the returned mark is dropped (cancel safe).
    pub(crate) fn waiting(self: &Arc<Self>) -> WaitingMark {
        self.waiting.increment(1.0);
        WaitingMark(self.clone())
    }
}

/// One waiting `acquire`, counted in [`WAITING_ACQUIRES`] while it lives.
pub(crate) struct WaitingMark(Arc<Handles>);

impl Drop for WaitingMark {
    fn drop(&mut self) {
        self.0.waiting.decrement(1.0);
    }
}

/// The metrics of one client: its backend's handles, and one set per lock name when names
/// are labels.
pub(crate) struct Instruments {
    backend: &'static str,
    shared: Arc<Handles>,
    by_name: Option<Mutex<HashMap<LockName, Arc<Handles>>>>,
}

impl Instruments {
    pub(crate) fn new(backend: &'static str, per_name: bool) -> Self {
        describe();
        Self {
            backend,
            shared: Arc::new(Handles::register(backend, None)),
            by_name: per_name.then(Mutex::default),
        }
    }

    /// The handles for `name`: the backend's, unless names are labels.
    pub(crate) fn handles(&self, name: &LockName) -> Arc<Handles> {
        let Some(by_name) = &self.by_name else {
            return self.shared.clone();
        };
        let mut by_name = lock(by_name);
        if let Some(handles) = by_name.get(name) {
            return handles.clone();
        }
        let handles = Arc::new(Handles::register(self.backend, Some(name)));
        by_name.insert(name.clone(), handles.clone());
        handles
    }

    /// The backend's handles (operations not about one lock, such as `list`).
    pub(crate) fn shared(&self) -> &Arc<Handles> {
        &self.shared
    }
}

/// Describes every metric to the installed recorder (units and help texts).
fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_counter!(ACQUISITIONS, "Locks taken on the server");
    describe_counter!(
        TRY_ACQUIRE_REFUSALS,
        "try_acquire calls that found the lock held"
    );
    describe_counter!(ACQUIRE_TIMEOUTS, "acquire calls that timed out");
    describe_counter!(RENEWALS, "Successful lease renewals");
    describe_counter!(RENEWAL_FAILURES, "Renewals refused or not answered");
    describe_counter!(LOSSES, "Held locks lost, by reason");
    describe_counter!(RELEASES, "Release requests sent, by result");
    describe_counter!(BACKEND_ERRORS, "Failed backend requests, by kind");
    describe_histogram!(
        ACQUIRE_WAIT,
        Unit::Seconds,
        "From the acquire call to holding the lock"
    );
    describe_histogram!(
        HOLD,
        Unit::Seconds,
        "From acquisition to release, drop, abandon or loss"
    );
    describe_histogram!(
        HANDOFF,
        Unit::Seconds,
        "After a wait: from the wake-up to holding the lock"
    );
    describe_histogram!(
        OPERATION_DURATION,
        Unit::Seconds,
        "One backend request, by operation"
    );
    describe_gauge!(HELD_GUARDS, "Locks this process holds");
    describe_gauge!(WAITING_ACQUIRES, "acquire calls waiting for a taken lock");
}

impl std::fmt::Debug for Instruments {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Instruments")
            .field("backend", &self.backend)
            .field("per_name", &self.by_name.is_some())
            .finish_non_exhaustive()
    }
}
