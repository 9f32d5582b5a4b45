//! S2: K clients contending for one name.
//!
//! Each client loops: `acquire` (bounded by [`BenchConfig::acquire_wait`]), hold for
//! [`BenchConfig::hold`], release, re-acquire at once. Just before calling `release`, the
//! holder writes `(its id, now)` into a shared record and decrements a shared holder gauge;
//! just after `acquire` returns, the next holder increments the gauge (a non-zero previous
//! value is an exclusivity violation) and reads the record. If the record names another
//! client, `now - release instant` is one handoff latency; if it names itself, the handoff
//! went back to the same client and is only counted. Statistics cover the critical sections
//! whose `acquire` returned inside the measured window.
//!
//! The contended floor runs the same loop on the server's own blocking lock
//! ([`ContendedFloor`]), one floor per client, just before S2.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use distlock_core::{AcquireOptions, DistributedLock, Error, LockGuard, LockKind};

use crate::report::{ClientShare, S2Result};
use crate::stats::{Progress, Recorder, micros, rate, share};
use crate::{BenchConfig, ContendedFloor};

/// One contending client of the S2 loop: a distlock client, or a contended floor.
#[async_trait]
pub(crate) trait Contender: Send + 'static {
    /// What a holder keeps until it releases.
    type Held: Send;

    /// Acquires `name`, waiting as `options` allow.
    async fn enter(&mut self, name: &str, options: &AcquireOptions) -> Result<Self::Held, Error>;

    /// Releases what [`Self::enter`] acquired.
    async fn leave(&mut self, name: &str, held: Self::Held) -> Result<(), Error>;
}

#[async_trait]
impl Contender for Arc<dyn DistributedLock> {
    type Held = LockGuard;

    async fn enter(&mut self, name: &str, options: &AcquireOptions) -> Result<LockGuard, Error> {
        self.acquire(name, options).await
    }

    async fn leave(&mut self, _name: &str, held: LockGuard) -> Result<(), Error> {
        held.release().await
    }
}

/// A floor holds the kind `options` asked for: exclusive, or shared where the server's lock
/// has shared holds ([`ContendedFloor::has_shared`]).
#[async_trait]
impl Contender for Box<dyn ContendedFloor> {
    type Held = LockKind;

    async fn enter(&mut self, name: &str, options: &AcquireOptions) -> Result<LockKind, Error> {
        let wait = options.wait.unwrap_or(Duration::MAX);
        match options.kind {
            LockKind::Shared => self.acquire_shared(name, wait).await?,
            LockKind::Exclusive => self.acquire(name, wait).await?,
            kind => {
                return Err(Error::Unsupported(format!(
                    "the contended floor {:?} has no {kind} holds",
                    self.label()
                )));
            }
        }
        Ok(options.kind)
    }

    async fn leave(&mut self, name: &str, kind: LockKind) -> Result<(), Error> {
        if kind == LockKind::Shared {
            self.release_shared(name).await
        } else {
            self.release(name).await
        }
    }
}

struct Shared {
    name: String,
    options: AcquireOptions,
    hold: Duration,
    measure_from: Instant,
    measure_until: Instant,
    /// Clients inside a critical section right now: must never exceed 1.
    holders: AtomicU64,
    max_holders: AtomicU64,
    violations: AtomicU64,
    /// The last holder about to release: (client id, instant just before `release`).
    last_release: Mutex<Option<(usize, Instant)>>,
    /// Critical sections in the measured window so far, for progress lines.
    measured: AtomicU64,
    /// Set when a client fails, so that the others stop too.
    stop: AtomicBool,
}

/// One client's statistics over the measured window.
struct ClientStats {
    critical_sections: u64,
    to_other: u64,
    to_self: u64,
    held: Duration,
    longest_wait: Duration,
    /// Handoffs from another client to this one.
    handoff: Recorder,
    /// Every `acquire` call of this client.
    wait: Recorder,
}

impl ClientStats {
    fn new() -> Self {
        Self {
            critical_sections: 0,
            to_other: 0,
            to_self: 0,
            held: Duration::ZERO,
            longest_wait: Duration::ZERO,
            handoff: Recorder::new(),
            wait: Recorder::new(),
        }
    }
}

async fn client_loop<C: Contender>(
    id: usize,
    mut client: C,
    shared: Arc<Shared>,
) -> (ClientStats, Option<Error>) {
    let mut stats = ClientStats::new();
    let mut error = None;
    while !shared.stop.load(Ordering::Relaxed) && Instant::now() < shared.measure_until {
        let asked = Instant::now();
        let guard = match client.enter(&shared.name, &shared.options).await {
            Ok(guard) => guard,
            Err(err) => {
                error = Some(err);
                break;
            }
        };
        let acquired = Instant::now();
        let before = shared.holders.fetch_add(1, Ordering::SeqCst);
        shared.max_holders.fetch_max(before + 1, Ordering::SeqCst);
        if before != 0 {
            shared.violations.fetch_add(1, Ordering::SeqCst);
        }
        let previous = *shared
            .last_release
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let measured = acquired >= shared.measure_from && acquired < shared.measure_until;
        if measured {
            shared.measured.fetch_add(1, Ordering::Relaxed);
            stats.critical_sections += 1;
            let waited = acquired - asked;
            stats.wait.record(waited);
            stats.longest_wait = stats.longest_wait.max(waited);
            match previous {
                Some((holder, released)) if holder != id => {
                    stats.to_other += 1;
                    stats
                        .handoff
                        .record(acquired.saturating_duration_since(released));
                }
                Some(_) => stats.to_self += 1,
                None => {}
            }
        }

        tokio::time::sleep(shared.hold).await;

        let releasing = Instant::now();
        if measured {
            stats.held += releasing - acquired;
        }
        *shared
            .last_release
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some((id, releasing));
        shared.holders.fetch_sub(1, Ordering::SeqCst);
        if let Err(err) = client.leave(&shared.name, guard).await {
            error = Some(err);
            break;
        }
    }
    if error.is_some() {
        shared.stop.store(true, Ordering::Relaxed);
    }
    (stats, error)
}

/// Runs `client_loop` for each client on a task of its own, as every contended scenario does
/// (the scenario started at `start` and measures until `measure_until`), with a progress line
/// every second (`measured` counts what was measured so far). Returns each client's
/// statistics in client order, or the error of the first client (by index) that failed; past
/// a generous deadline, aborts the tasks and fails.
pub(crate) async fn run_clients<C, S, Fut>(
    clients: Vec<C>,
    client_loop: impl Fn(usize, C) -> Fut,
    (start, measure_until): (Instant, Instant),
    config: &BenchConfig,
    measured: &AtomicU64,
    progress: &mut Progress,
) -> Result<Vec<S>, Error>
where
    S: Send + 'static,
    Fut: Future<Output = (S, Option<Error>)> + Send + 'static,
{
    let handles: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(id, client)| tokio::spawn(client_loop(id, client)))
        .collect();
    let aborts: Vec<_> = handles
        .iter()
        .map(tokio::task::JoinHandle::abort_handle)
        .collect();
    // Generous: every waiter may wait its full bound, and a lost lock frees after one ttl.
    let deadline = measure_until + config.acquire_wait + config.ttl + Duration::from_secs(5);
    let total = config.s2_warmup + config.duration;
    let mut joined = std::pin::pin!(futures::future::join_all(handles));
    let outcomes = loop {
        let now = Instant::now();
        if now >= deadline {
            aborts.iter().for_each(tokio::task::AbortHandle::abort);
            return Err(Error::Backend {
                message: format!(
                    "the contended run did not finish within {:?}",
                    deadline - start
                ),
                source: None,
            });
        }
        let step = (deadline - now).min(Duration::from_millis(250));
        match tokio::time::timeout(step, joined.as_mut()).await {
            Ok(outcomes) => break outcomes,
            Err(_) => progress.tick(|| {
                format!(
                    "{:.1}s / {:.1}s, {} critical sections measured",
                    start.elapsed().as_secs_f64(),
                    total.as_secs_f64(),
                    measured.load(Ordering::Relaxed)
                )
            }),
        }
    };
    let mut stats = Vec::with_capacity(outcomes.len());
    for (id, outcome) in outcomes.into_iter().enumerate() {
        match outcome {
            Ok((client, None)) => stats.push(client),
            Ok((_, Some(err))) => return Err(err),
            Err(join) => {
                return Err(Error::Backend {
                    message: format!("client {id} failed: {join}"),
                    source: None,
                });
            }
        }
    }
    Ok(stats)
}

/// Each client's part of a scenario, from its `(count, longest wait)`.
pub(crate) fn client_shares(
    clients: impl Iterator<Item = (u64, Duration)> + Clone,
) -> Vec<ClientShare> {
    let total = clients.clone().map(|(count, _)| count).sum();
    clients
        .enumerate()
        .map(|(client, (count, longest))| ClientShare {
            client,
            critical_sections: count,
            share: share(count, total).unwrap_or(0.0),
            longest_wait_us: micros(longest),
        })
        .collect()
}

/// S2 (or the contended floor, with floors as `clients`) on `name`.
pub(crate) async fn run_s2<C: Contender>(
    clients: Vec<C>,
    name: String,
    config: &BenchConfig,
    mut progress: Progress,
) -> Result<S2Result, Error> {
    let start = Instant::now();
    let measure_from = start + config.s2_warmup;
    let shared = Arc::new(Shared {
        name,
        options: AcquireOptions::default()
            .with_ttl(config.ttl)
            .with_wait(config.acquire_wait),
        hold: config.hold,
        measure_from,
        measure_until: measure_from + config.duration,
        holders: AtomicU64::new(0),
        max_holders: AtomicU64::new(0),
        violations: AtomicU64::new(0),
        last_release: Mutex::new(None),
        measured: AtomicU64::new(0),
        stop: AtomicBool::new(false),
    });
    let client_count = clients.len();
    let measured = &shared.measured;
    let loop_of = |id, client| client_loop(id, client, shared.clone());
    let window = (start, shared.measure_until);
    let stats = run_clients(clients, loop_of, window, config, measured, &mut progress).await?;

    let mut handoff = Recorder::new();
    let mut wait = Recorder::new();
    let per_client = client_shares(stats.iter().map(|s| (s.critical_sections, s.longest_wait)));
    let (mut total_cs, mut to_other, mut to_self) = (0, 0, 0);
    let mut held = Duration::ZERO;
    let mut longest_wait = Duration::ZERO;
    for stats in stats {
        total_cs += stats.critical_sections;
        to_other += stats.to_other;
        to_self += stats.to_self;
        held += stats.held;
        longest_wait = longest_wait.max(stats.longest_wait);
        handoff.merge(&stats.handoff);
        wait.merge(&stats.wait);
    }
    Ok(S2Result {
        clients: client_count,
        measured_ms: config.duration.as_secs_f64() * 1000.0,
        critical_sections: total_cs,
        critical_sections_per_sec: rate(total_cs, config.duration),
        handoff: handoff.summary(),
        handoffs_to_other: to_other,
        handoffs_to_self: to_self,
        handoff_other_share: share(to_other, to_other + to_self),
        acquire_wait: wait.summary(),
        longest_wait_us: micros(longest_wait),
        mean_hold_us: if total_cs > 0 {
            micros(held) / total_cs as f64
        } else {
            0.0
        },
        held_share: held.as_secs_f64() / config.duration.as_secs_f64(),
        per_client,
        max_holders: shared.max_holders.load(Ordering::SeqCst),
        exclusivity_violations: shared.violations.load(Ordering::SeqCst),
        floor_ratio: None,
        handoff_paused_floor_ratio: None,
        contended_floor_ratio: None,
        handoff_p99_floor_ratio: None,
        fenced_contended_floor_ratio: None,
    })
}
