//! Every metric of `distlock_core::telemetry`, checked against a scripted scenario: acquire,
//! contend, time out, lose (refused renewal, expiry, unreachable server), release, drop,
//! abandon, failed requests. The backend is the in-memory one behind a wrapper that counts
//! every request it serves, so that the metrics are compared with exact counts even where the
//! number of renewals depends on timing.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use common::Wrapping;
use distlock_core::memory::{MemoryBackend, MemoryStore};
use distlock_core::telemetry::{
    ACQUIRE_TIMEOUTS, ACQUIRE_WAIT, ACQUISITIONS, BACKEND_ERRORS, ERROR_KINDS, HANDOFF,
    HELD_GUARDS, HOLD, LOSS_REASONS, LOSSES, OPERATION_DURATION, OPERATIONS, RELEASE_RESULTS,
    RELEASES, RENEWAL_FAILURES, RENEWALS, TRY_ACQUIRE_REFUSALS, WAITING_ACQUIRES,
};
use distlock_core::{
    AcquireOptions, AcquireRequest, Attempt, Capabilities, ClientConfig, DistributedLock, Error,
    FencingToken, Lease, LockBackend, LockClient, LockInfo, LockName, LossReason, Renewal, Result,
    Step,
};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

/// What the wrapped backend served.
#[derive(Debug, Default)]
struct Served {
    polls: AtomicU64,
    renewed: AtomicU64,
    renew_failed: AtomicU64,
    releases: AtomicU64,
    abandons: AtomicU64,
    /// Requests answered with `Unavailable`.
    unavailable: AtomicU64,
}

impl Served {
    fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::SeqCst)
    }

    fn note<T>(&self, result: &Result<T>) {
        if matches!(result, Err(Error::Unavailable { .. })) {
            self.unavailable.fetch_add(1, Ordering::SeqCst);
        }
    }
}

#[derive(Debug)]
struct Counting {
    inner: MemoryBackend,
    served: Arc<Served>,
}

struct CountingAttempt {
    inner: Box<dyn Attempt>,
    served: Arc<Served>,
}

#[derive(Debug)]
struct CountingLease {
    inner: Box<dyn Lease>,
    served: Arc<Served>,
}

#[async_trait]
impl LockBackend for Counting {
    fn name(&self) -> &'static str {
        "counting"
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn begin(&self, request: AcquireRequest) -> Box<dyn Attempt> {
        Box::new(CountingAttempt {
            inner: self.inner.begin(request),
            served: self.served.clone(),
        })
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        self.inner.inspect(name).await
    }

    async fn list(&self, prefix: Option<&str>, limit: usize) -> Result<Vec<(LockName, LockInfo)>> {
        self.inner.list(prefix, limit).await
    }

    async fn force_release(&self, name: &LockName) -> Result<bool> {
        self.inner.force_release(name).await
    }

    async fn release_hold(
        &self,
        name: &LockName,
        owner: &str,
        token: FencingToken,
    ) -> Result<bool> {
        self.inner.release_hold(name, owner, token).await
    }
}

#[async_trait]
impl Attempt for CountingAttempt {
    async fn poll(&mut self) -> Result<Step> {
        self.served.polls.fetch_add(1, Ordering::SeqCst);
        let step = self.inner.poll().await;
        self.served.note(&step);
        Ok(match step? {
            Step::Acquired(mut acquired) => {
                let inner = std::mem::replace(&mut acquired.lease, Box::new(NoLease));
                acquired.lease = Box::new(CountingLease {
                    inner,
                    served: self.served.clone(),
                });
                Step::Acquired(acquired)
            }
            other => other,
        })
    }

    async fn changed(&mut self) {
        self.inner.changed().await;
    }

    async fn abandon(self: Box<Self>) -> Result<()> {
        self.served.abandons.fetch_add(1, Ordering::SeqCst);
        let done = self.inner.abandon().await;
        self.served.note(&done);
        done
    }
}

#[async_trait]
impl Lease for CountingLease {
    async fn renew(&self, ttl: Duration) -> Result<()> {
        let renewed = self.inner.renew(ttl).await;
        let counter = match renewed {
            Ok(()) => &self.served.renewed,
            Err(_) => &self.served.renew_failed,
        };
        counter.fetch_add(1, Ordering::SeqCst);
        self.served.note(&renewed);
        renewed
    }

    async fn release(&self) -> Result<()> {
        self.served.releases.fetch_add(1, Ordering::SeqCst);
        let released = self.inner.release().await;
        self.served.note(&released);
        released
    }
}

/// Stands in for a lease while it is moved into its wrapper.
#[derive(Debug)]
struct NoLease;

#[async_trait]
impl Lease for NoLease {
    async fn renew(&self, _ttl: Duration) -> Result<()> {
        unreachable!("replaced at once")
    }

    async fn release(&self) -> Result<()> {
        unreachable!("replaced at once")
    }
}

/// The recorded values, accumulated over snapshots: a debugging snapshot drains histograms
/// and resets counters and gauges to zero (our gauges only go up and down by steps, so their
/// value is the sum of what the snapshots saw).
#[derive(Default)]
struct Observed {
    counters: HashMap<String, u64>,
    gauges: HashMap<String, f64>,
    samples: HashMap<String, Vec<f64>>,
}

impl Observed {
    /// `name{k=v,...}` with the labels sorted.
    fn key(name: &str, labels: &[(&str, &str)]) -> String {
        let mut labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        labels.sort();
        format!("{name}{{{}}}", labels.join(","))
    }

    fn take(&mut self, snapshotter: &Snapshotter) {
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            let (_, key) = key.into_parts();
            let labels: Vec<(&str, &str)> = key.labels().map(|l| (l.key(), l.value())).collect();
            let id = Self::key(key.name(), &labels);
            match value {
                DebugValue::Histogram(values) => self
                    .samples
                    .entry(id)
                    .or_default()
                    .extend(values.into_iter().map(|v| v.into_inner())),
                DebugValue::Counter(n) => *self.counters.entry(id).or_default() += n,
                DebugValue::Gauge(v) => *self.gauges.entry(id).or_default() += v.into_inner(),
            }
        }
    }

    /// A registered counter's value (a missing one fails: every handle is registered).
    fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        let key = Self::key(name, labels);
        *self
            .counters
            .get(&key)
            .unwrap_or_else(|| panic!("no counter {key}"))
    }

    fn gauge(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let key = Self::key(name, labels);
        *self
            .gauges
            .get(&key)
            .unwrap_or_else(|| panic!("no gauge {key}"))
    }

    fn samples(&self, name: &str, labels: &[(&str, &str)]) -> &[f64] {
        self.samples
            .get(&Self::key(name, labels))
            .map_or(&[], Vec::as_slice)
    }
}

const B: (&str, &str) = ("backend", "counting");

async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !check() {
        assert!(tokio::time::Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_after_a_scripted_scenario() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let store = MemoryStore::new();
    let served = Arc::new(Served::default());
    let backend = || Counting {
        inner: MemoryBackend::new(store.clone()),
        served: served.clone(),
    };
    // The handles bind to the recorder current when the client is built; they record into it
    // from any thread afterwards.
    let (a, b) = metrics::with_local_recorder(&recorder, || {
        (LockClient::new(backend()), LockClient::new(backend()))
    });
    let mut seen = Observed::default();
    let renewing = AcquireOptions::default()
        .with_ttl(Duration::from_millis(300))
        .with_renewal(Renewal::auto().every(Duration::from_millis(50)));
    let mut acquisitions = 0;

    // Acquire; contend with try_acquire (refused) and with an acquire that times out.
    let first = a.try_acquire("m/a", &renewing).await.unwrap().unwrap();
    acquisitions += 1;
    seen.take(&snapshotter);
    assert_eq!(seen.gauge(HELD_GUARDS, &[B]), 1.0);
    assert!(b.try_acquire("m/a", &renewing).await.unwrap().is_none());
    let short = renewing.clone().with_wait(Duration::from_millis(100));
    let err = b.acquire("m/a", &short).await.unwrap_err();
    assert!(matches!(err, Error::Timeout { .. }), "{err}");

    // A waiter, counted while it waits, takes over at the release: one handoff.
    let waiter = {
        let (b, opts) = (
            b.clone(),
            renewing.clone().with_wait(Duration::from_secs(10)),
        );
        tokio::spawn(async move { b.acquire("m/a", &opts).await })
    };
    let snapshots = &snapshotter;
    eventually("the waiter is counted", || {
        seen.take(snapshots);
        seen.gauge(WAITING_ACQUIRES, &[B]) == 1.0
    })
    .await;
    tokio::time::sleep(Duration::from_millis(120)).await; // some renewals of `first`
    first.release().await.unwrap();
    let second = waiter.await.unwrap().unwrap();
    acquisitions += 1;
    seen.take(&snapshotter);
    assert_eq!(seen.gauge(WAITING_ACQUIRES, &[B]), 0.0);
    second.release().await.unwrap();

    // Lost: a refused renewal (force-released), then released (not held any more).
    let refused = a.acquire("m/refused", &renewing).await.unwrap();
    acquisitions += 1;
    assert!(b.force_release("m/refused").await.unwrap());
    // A release of a hold by its token, of a hold that is not there: measured, nothing else.
    assert!(
        !b.release_hold("m/free", "nobody", FencingToken::new(1))
            .await
            .unwrap()
    );
    let reason = tokio::time::timeout(Duration::from_secs(5), refused.lost())
        .await
        .unwrap();
    assert_eq!(reason, LossReason::RenewalRejected);
    assert!(refused.release().await.is_err());

    // Lost: the lease expired (no renewal).
    let once = AcquireOptions::default()
        .with_ttl(Duration::from_millis(150))
        .with_renewal(Renewal::disabled());
    let expiring = a.acquire("m/expired", &once).await.unwrap();
    acquisitions += 1;
    assert_eq!(expiring.lost().await, LossReason::LeaseExpired);
    // The local deadline comes a drift margin before the server's: wait that out, so that
    // the release the drop sends (from a task) is refused.
    tokio::time::sleep(Duration::from_millis(20)).await;
    drop(expiring);
    let sent = || Served::get(&served.releases) == 4;
    eventually("the expired guard's release", sent).await;

    // Lost: the server stopped answering renewals; then a failed try_acquire and a failed
    // release while it is down.
    let cut_off = a.acquire("m/cut-off", &renewing).await.unwrap();
    acquisitions += 1;
    let long = AcquireOptions::default()
        .with_ttl(Duration::from_secs(10))
        .with_renewal(Renewal::disabled());
    let releasing = a.acquire("m/release-fails", &long).await.unwrap();
    acquisitions += 1;
    store.set_available(false);
    let reason = tokio::time::timeout(Duration::from_secs(5), cut_off.lost())
        .await
        .unwrap();
    assert_eq!(reason, LossReason::ConnectionLost);
    let err = a.try_acquire("m/down", &renewing).await.unwrap_err();
    assert!(matches!(err, Error::Unavailable { .. }), "{err}");
    let err = releasing.release().await.unwrap_err();
    assert!(matches!(err, Error::Unavailable { .. }), "{err}");
    store.set_available(true);
    tokio::time::sleep(Duration::from_millis(50)).await; // its lease certainly ran out
    drop(cut_off);

    // Dropped (released in the background) and abandoned (left to expire: not a loss).
    let dropped = a.acquire("m/dropped", &renewing).await.unwrap();
    acquisitions += 1;
    drop(dropped);
    let abandoned = a.acquire("m/abandoned", &once).await.unwrap();
    acquisitions += 1;
    let gone = abandoned.lost();
    abandoned.abandon();
    assert_eq!(gone.await, LossReason::LeaseExpired);

    // Diagnostics.
    assert!(a.inspect("m/a").await.unwrap().is_none());
    // Only the lock whose release got no answer is left, until its ttl runs out (the
    // abandoned one is gone once the drift margin after its local deadline has passed).
    tokio::time::sleep(Duration::from_millis(20)).await;
    let listed = a.list(Some("m/"), 10).await.unwrap();
    let names: Vec<&str> = listed.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names, ["m/release-fails"]);

    let all_released = || Served::get(&served.releases) == 7;
    eventually("the dropped guard's release", all_released).await;
    seen.take(&snapshotter);

    // Counters.
    assert_eq!(seen.counter(ACQUISITIONS, &[B]), acquisitions);
    assert_eq!(seen.counter(TRY_ACQUIRE_REFUSALS, &[B]), 1);
    assert_eq!(seen.counter(ACQUIRE_TIMEOUTS, &[B]), 1);
    let renewed = Served::get(&served.renewed);
    let renew_failed = Served::get(&served.renew_failed);
    assert!(renewed >= 2, "{renewed} renewals");
    assert!(renew_failed >= 2, "{renew_failed} failed renewals"); // 1 refused, >= 1 unanswered
    assert_eq!(seen.counter(RENEWALS, &[B]), renewed);
    assert_eq!(seen.counter(RENEWAL_FAILURES, &[B]), renew_failed);
    for reason in LOSS_REASONS {
        let expected = u64::from(matches!(
            reason,
            "renewal_rejected" | "lease_expired" | "connection_lost"
        ));
        let losses = seen.counter(LOSSES, &[B, ("reason", reason)]);
        assert_eq!(losses, expected, "losses by {reason}");
    }
    // first, second, dropped: ok; refused, and the lost guards dropped (expired, cut off):
    // not held; releasing: no answer. The abandoned guard sent none.
    let releases = |result| seen.counter(RELEASES, &[B, ("result", result)]);
    assert_eq!(RELEASE_RESULTS.map(releases), [3, 3, 1]);
    let unavailable = Served::get(&served.unavailable);
    for kind in ERROR_KINDS {
        let expected = if kind == "unavailable" {
            unavailable
        } else {
            0
        };
        let errors = seen.counter(BACKEND_ERRORS, &[B, ("kind", kind)]);
        assert_eq!(errors, expected, "backend errors of kind {kind}");
    }

    // Gauges: nothing held, nobody waiting.
    assert_eq!(seen.gauge(HELD_GUARDS, &[B]), 0.0);
    assert_eq!(seen.gauge(WAITING_ACQUIRES, &[B]), 0.0);

    // Histograms: one wait and one hold per acquisition, one handoff (the waiter's), one
    // duration per request served.
    let waits = seen.samples(ACQUIRE_WAIT, &[B]);
    assert_eq!(waits.len() as u64, acquisitions);
    let holds = seen.samples(HOLD, &[B]);
    assert_eq!(holds.len() as u64, acquisitions);
    assert!(
        holds.iter().any(|h| *h >= 0.12),
        "first held >= 120 ms: {holds:?}"
    );
    let handoffs = seen.samples(HANDOFF, &[B]);
    assert_eq!(handoffs.len(), 1, "{handoffs:?}");
    let longest_wait = waits.iter().copied().fold(0.0, f64::max);
    assert!(handoffs[0] < longest_wait, "{handoffs:?} vs {waits:?}");
    assert!(
        longest_wait >= 0.1,
        "the waiter waited >= 100 ms: {waits:?}"
    );
    for operation in OPERATIONS {
        let expected = match operation {
            "acquire" => Served::get(&served.polls),
            "renew" => renewed + renew_failed,
            "release" => Served::get(&served.releases),
            "abandon" => Served::get(&served.abandons),
            _ => 1, // inspect, list, force_release, release_hold
        };
        let durations = seen.samples(OPERATION_DURATION, &[B, ("operation", operation)]);
        assert_eq!(durations.len() as u64, expected, "{operation} durations");
        assert!(
            durations.iter().all(|d| (0.0..5.0).contains(d)),
            "{durations:?}"
        );
    }
}

/// Runs `scenario` on a current-thread runtime with a local recorder, current for the whole
/// run (per-name handles are registered when a name is first used, with the recorder current
/// then), and answers what it recorded.
fn recorded<F, Fut>(scenario: F) -> Observed
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    metrics::with_local_recorder(&recorder, || runtime.block_on(scenario())).unwrap();
    let mut seen = Observed::default();
    seen.take(&snapshotter);
    seen
}

#[test]
fn the_lock_name_is_a_label_only_when_asked_for() {
    let store = MemoryStore::new();
    let per_name = ClientConfig::default().with_metrics_per_name(true);
    let seen = recorded(|| async {
        let plain = LockClient::new(MemoryBackend::new(store.clone()));
        let named = LockClient::with_config(MemoryBackend::new(store.clone()), per_name)?;
        let opts = AcquireOptions::default();
        for client in [&plain, &named] {
            client.acquire("x", &opts).await?.release().await?;
            client.acquire("y", &opts).await?.release().await?;
        }
        Ok(())
    });
    let memory = ("backend", "memory");
    // The plain client's two, and none of the named client's.
    assert_eq!(seen.counter(ACQUISITIONS, &[memory]), 2);
    for name in ["x", "y"] {
        assert_eq!(seen.counter(ACQUISITIONS, &[memory, ("name", name)]), 1);
        assert_eq!(seen.samples(HOLD, &[memory, ("name", name)]).len(), 1);
    }
}

/// The hold time runs from `acquire`'s return, not from the earliest instant the lease may
/// have started: a lease handed over by a release is known only to have started after the
/// waiter's last read before it, which may lie long before the waiter learns of it (a
/// PostgreSQL semaphore's holds of 1 ms had been recorded as 8.85 ms at the median).
#[test]
fn the_hold_time_runs_from_the_acquires_return() {
    let store = MemoryStore::new();
    let backend = Wrapping::new(&store, Arc::new(|lease| lease)).back_dated(Duration::from_secs(3));
    let seen = recorded(|| async {
        let client = LockClient::new(backend);
        let opts = AcquireOptions::default().with_ttl(Duration::from_secs(30));
        client.acquire("x", &opts).await?.release().await
    });
    let holds = seen.samples(HOLD, &[("backend", "wrapping")]);
    assert_eq!(holds.len(), 1, "{holds:?}");
    assert!(
        holds[0] < 1.0,
        "the hold was counted from the lease's early start: {holds:?}"
    );
}
