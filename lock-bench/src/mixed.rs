//! The read/write mix and the semaphore: K clients on one name, each acquisition of a kind
//! that lets several holders in at once, with gauges that prove the bound.
//!
//! Each client loops as in S2: `acquire` (bounded by [`BenchConfig::acquire_wait`]), hold
//! for [`BenchConfig::hold`], release, re-acquire at once.
//!
//! - **Read/write mix**: each acquisition is exclusive with probability
//!   [`BenchConfig::write_share`] (a per-client pseudo-random sequence), else shared. Just
//!   after `acquire` returns, a writer increments the writer gauge and reads the reader gauge,
//!   a reader increments the reader gauge and reads the writer gauge; a writer that finds
//!   another writer or any reader, or a reader that finds a writer, is a violation. Each
//!   holder decrements its gauge just before calling `release`. The mix also times the two
//!   handoffs between the kinds, from the instant just before the `release` that makes the
//!   name free for the other kind to the return of that kind's next `acquire`, counted only
//!   when that `acquire` was already waiting at the instant: **writer to readers** (a
//!   writer's release, then the first reader in) and **readers to writer** (the last reader's
//!   release, no reader in since, then the writer in). Their p50s together against two S2
//!   handoffs (the same backend, the same run) answer what a writer's turn between readers
//!   costs beside a mutex's.
//! - **Semaphore**: every acquisition is one of [`BenchConfig::permits`] permits; a holder
//!   that finds `permits` holders already inside is a violation.
//!
//! Statistics cover the acquisitions that returned inside the measured window.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use distlock_core::{AcquireOptions, Capabilities, Error, LockKind};

use crate::BenchConfig;
use crate::contended::{Contender, client_shares, run_clients};
use crate::report::MixedResult;
use crate::stats::{Progress, Recorder, micros, rate};

/// Which of the two scenarios.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Mix {
    /// Shared acquisitions with `write_share` exclusive ones among them.
    ReadWrite { write_share: f64 },
    /// One permit of a semaphore of `permits`.
    Semaphore { permits: u32 },
}

impl Mix {
    /// Why the backend cannot run this scenario, if it cannot (from its capabilities).
    pub(crate) fn unsupported(self, backend: &str, caps: &Capabilities) -> Option<String> {
        match self {
            Self::ReadWrite { .. } if !caps.shared => Some(format!(
                "the {backend} backend has no shared (read) locks (Capabilities::shared is false)"
            )),
            Self::Semaphore { .. } if caps.max_permits == 0 => Some(format!(
                "the {backend} backend has no semaphores (Capabilities::max_permits is 0)"
            )),
            Self::Semaphore { permits } if permits > caps.max_permits => Some(format!(
                "the {backend} backend has semaphores of at most {} permits, {permits} asked",
                caps.max_permits
            )),
            _ => None,
        }
    }

    /// The kind of client `id`'s `n`-th acquisition: a permit of the semaphore; in the
    /// read/write mix exclusive for about `write_share` of them (a fixed pseudo-random
    /// sequence per client), else shared.
    pub(crate) fn kind_of(self, id: usize, n: u64) -> LockKind {
        match self {
            Self::ReadWrite { write_share } if unit(id, n) < write_share => LockKind::Exclusive,
            Self::ReadWrite { .. } => LockKind::Shared,
            Self::Semaphore { permits } => LockKind::Permit { permits },
        }
    }
}

struct Shared {
    name: String,
    options: AcquireOptions,
    mix: Mix,
    hold: Duration,
    measure_from: Instant,
    measure_until: Instant,
    /// Shared holders (read/write mix) or permit holders (semaphore) inside right now.
    holders: AtomicU64,
    max_holders: AtomicU64,
    /// Exclusive holders inside right now (read/write mix): never more than one, and never
    /// with a shared holder.
    writers: AtomicU64,
    max_writers: AtomicU64,
    violations: AtomicU64,
    /// The instant just before the last writer's release, until the first reader in takes it.
    writer_released: Mutex<Option<Instant>>,
    /// The instant just before the release of a reader that left no reader in, until a reader
    /// comes in (which clears it) or the next writer does (which takes it).
    readers_drained: Mutex<Option<Instant>>,
    /// Acquisitions in the measured window so far, for progress lines.
    measured: AtomicU64,
    /// Set when a client fails, so that the others stop too.
    stop: AtomicBool,
}

/// Takes the instant in `slot`, if any.
fn take(slot: &Mutex<Option<Instant>>) -> Option<Instant> {
    slot.lock().unwrap_or_else(PoisonError::into_inner).take()
}

/// Puts `at` in `slot`.
fn put(slot: &Mutex<Option<Instant>>, at: Option<Instant>) {
    *slot.lock().unwrap_or_else(PoisonError::into_inner) = at;
}

impl Shared {
    /// Enters the gauges after an acquisition of `kind`; counts a violation of the bound.
    /// Returns the handoff this acquisition ends, if it ends one (see the module's text): the
    /// instant it started from.
    fn enter(&self, kind: LockKind) -> Option<Instant> {
        let mut handoff = None;
        let violated = match kind {
            LockKind::Exclusive => {
                let writers = self.writers.fetch_add(1, Ordering::SeqCst) + 1;
                self.max_writers.fetch_max(writers, Ordering::SeqCst);
                handoff = take(&self.readers_drained);
                writers > 1 || self.holders.load(Ordering::SeqCst) > 0
            }
            _ => {
                let holders = self.holders.fetch_add(1, Ordering::SeqCst) + 1;
                self.max_holders.fetch_max(holders, Ordering::SeqCst);
                if kind == LockKind::Shared {
                    handoff = take(&self.writer_released);
                    put(&self.readers_drained, None);
                }
                let over = match kind {
                    LockKind::Permit { permits } => holders > u64::from(permits),
                    _ => false,
                };
                over || self.writers.load(Ordering::SeqCst) > 0
            }
        };
        if violated {
            self.violations.fetch_add(1, Ordering::SeqCst);
        }
        handoff
    }

    /// Leaves the gauges just before the release of an acquisition of `kind`.
    fn leave(&self, kind: LockKind) {
        let now = Some(Instant::now());
        match kind {
            LockKind::Exclusive => {
                put(&self.writer_released, now);
                self.writers.fetch_sub(1, Ordering::SeqCst);
            }
            LockKind::Shared => {
                // The drained instant goes in before the gauge says so: a reader that comes in
                // after the gauge's fall finds it there to clear.
                let mut drained = self
                    .readers_drained
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                if self.holders.fetch_sub(1, Ordering::SeqCst) == 1 {
                    *drained = now;
                }
            }
            _ => {
                self.holders.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }
}

/// One client's statistics over the measured window.
struct ClientStats {
    acquisitions: u64,
    exclusive: u64,
    /// Time this client spent holding a shared hold or permit inside the measured window.
    held: Duration,
    /// The same for exclusive holds.
    held_exclusive: Duration,
    longest_wait: Duration,
    shared_wait: Recorder,
    exclusive_wait: Recorder,
    /// Writer-to-readers handoffs ended by this client's shared acquisitions.
    to_readers: Recorder,
    /// Readers-to-writer handoffs ended by this client's exclusive acquisitions.
    to_writer: Recorder,
}

impl ClientStats {
    fn new() -> Self {
        Self {
            acquisitions: 0,
            exclusive: 0,
            held: Duration::ZERO,
            held_exclusive: Duration::ZERO,
            longest_wait: Duration::ZERO,
            shared_wait: Recorder::new(),
            exclusive_wait: Recorder::new(),
            to_readers: Recorder::new(),
            to_writer: Recorder::new(),
        }
    }
}

/// The `n`-th pseudo-random number in `0..1` of client `id` (splitmix64): a fixed sequence
/// per client, so runs are repeatable and clients do not write in lockstep.
fn unit(id: usize, n: u64) -> f64 {
    let mut z = (id as u64)
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .wrapping_add(n.wrapping_mul(0xbf58_476d_1ce4_e5b9));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

async fn client_loop<C: Contender>(
    id: usize,
    mut client: C,
    shared: Arc<Shared>,
) -> (ClientStats, Option<Error>) {
    let mut stats = ClientStats::new();
    let mut error = None;
    let mut n = 0;
    while !shared.stop.load(Ordering::Relaxed) && Instant::now() < shared.measure_until {
        let kind = shared.mix.kind_of(id, n);
        n += 1;
        let options = shared.options.clone().with_kind(kind);
        let asked = Instant::now();
        let guard = match client.enter(&shared.name, &options).await {
            Ok(guard) => guard,
            Err(err) => {
                error = Some(err);
                break;
            }
        };
        let acquired = Instant::now();
        let handoff = shared.enter(kind);
        if acquired >= shared.measure_from && acquired < shared.measure_until {
            // Only a handoff to an acquisition that was waiting when it started.
            if let Some(from) = handoff.filter(|from| asked <= *from) {
                let recorder = if kind == LockKind::Exclusive {
                    &mut stats.to_writer
                } else {
                    &mut stats.to_readers
                };
                recorder.record(acquired.saturating_duration_since(from));
            }
            shared.measured.fetch_add(1, Ordering::Relaxed);
            stats.acquisitions += 1;
            let waited = acquired - asked;
            stats.longest_wait = stats.longest_wait.max(waited);
            if kind == LockKind::Exclusive {
                stats.exclusive += 1;
                stats.exclusive_wait.record(waited);
            } else {
                stats.shared_wait.record(waited);
            }
        }

        tokio::time::sleep(shared.hold).await;

        shared.leave(kind);
        // The part of this hold inside the measured window (the gauges' span).
        let inside = Instant::now()
            .min(shared.measure_until)
            .saturating_duration_since(acquired.max(shared.measure_from));
        if kind == LockKind::Exclusive {
            stats.held_exclusive += inside;
        } else {
            stats.held += inside;
        }
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

/// The mix on `clients` (distlock's, or contended floors), one name.
pub(crate) async fn run_mixed<C: Contender>(
    clients: Vec<C>,
    name: String,
    mix: Mix,
    config: &BenchConfig,
    mut progress: Progress,
) -> Result<MixedResult, Error> {
    let start = Instant::now();
    let measure_from = start + config.s2_warmup;
    let shared = Arc::new(Shared {
        name,
        options: AcquireOptions::default()
            .with_ttl(config.ttl)
            .with_wait(config.acquire_wait),
        mix,
        hold: config.hold,
        measure_from,
        measure_until: measure_from + config.duration,
        holders: AtomicU64::new(0),
        max_holders: AtomicU64::new(0),
        writers: AtomicU64::new(0),
        max_writers: AtomicU64::new(0),
        violations: AtomicU64::new(0),
        writer_released: Mutex::new(None),
        readers_drained: Mutex::new(None),
        measured: AtomicU64::new(0),
        stop: AtomicBool::new(false),
    });
    let client_count = clients.len();
    let measured = &shared.measured;
    let loop_of = |id, client| client_loop(id, client, shared.clone());
    let window = (start, shared.measure_until);
    let stats = run_clients(clients, loop_of, window, config, measured, &mut progress).await?;

    let (mut shared_wait, mut exclusive_wait) = (Recorder::new(), Recorder::new());
    let (mut to_readers, mut to_writer) = (Recorder::new(), Recorder::new());
    let per_client = client_shares(stats.iter().map(|s| (s.acquisitions, s.longest_wait)));
    let (mut total, mut exclusive) = (0, 0);
    let mut longest_wait = Duration::ZERO;
    let (mut held, mut held_exclusive) = (Duration::ZERO, Duration::ZERO);
    for stats in stats {
        held += stats.held;
        held_exclusive += stats.held_exclusive;
        total += stats.acquisitions;
        exclusive += stats.exclusive;
        longest_wait = longest_wait.max(stats.longest_wait);
        shared_wait.merge(&stats.shared_wait);
        exclusive_wait.merge(&stats.exclusive_wait);
        to_readers.merge(&stats.to_readers);
        to_writer.merge(&stats.to_writer);
    }
    let mut all_wait = Recorder::new();
    all_wait.merge(&shared_wait);
    all_wait.merge(&exclusive_wait);
    let read_write = matches!(mix, Mix::ReadWrite { .. });
    Ok(MixedResult {
        clients: client_count,
        measured_ms: config.duration.as_secs_f64() * 1000.0,
        acquisitions: total,
        acquisitions_per_sec: rate(total, config.duration),
        exclusive_acquisitions: exclusive,
        acquire_wait: all_wait.summary(),
        shared_wait: read_write.then(|| shared_wait.summary()),
        exclusive_wait: read_write.then(|| exclusive_wait.summary()),
        writer_to_readers: read_write.then(|| to_readers.summary()),
        readers_to_writer: read_write.then(|| to_writer.summary()),
        longest_wait_us: micros(longest_wait),
        per_client,
        max_holders: shared.max_holders.load(Ordering::SeqCst),
        mean_holders: held.as_secs_f64() / config.duration.as_secs_f64(),
        writer_share: read_write
            .then(|| held_exclusive.as_secs_f64() / config.duration.as_secs_f64()),
        max_writers: read_write.then(|| shared.max_writers.load(Ordering::SeqCst)),
        permits: match mix {
            Mix::Semaphore { permits } => Some(permits),
            Mix::ReadWrite { .. } => None,
        },
        violations: shared.violations.load(Ordering::SeqCst),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pseudo_random_sequence_is_uniform_enough() {
        let below = (0..10_000).filter(|n| unit(3, *n) < 0.1).count();
        assert!((800..1200).contains(&below), "{below}");
        assert!((0..1000).all(|n| (0.0..1.0).contains(&unit(7, n))));
        assert_ne!(unit(0, 1), unit(1, 1));
    }
}
