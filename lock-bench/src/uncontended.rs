//! S1 (uncontended acquire + release) and the raw floor, measured with the same loop and
//! interleaved: the measured cycles of each run in blocks of [`BLOCK`] cycles that alternate
//! between the two (floor first in even blocks, S1 first in odd ones), so that a server whose speed
//! drifts during the run (a write-ahead log growing, a snapshot, a JVM warming up, another
//! process waking) weighs on both alike and the ratio compares like with like.

use std::time::{Duration, Instant};

use distlock_core::{AcquireOptions, DistributedLock, Error};

use crate::report::{FloorResult, S1Result};
use crate::stats::{Progress, Recorder, rate};
use crate::{BenchConfig, LatencySummary, RawFloor, S1Call};

/// Measured cycles per alternating block: short enough that drift within a block is small
/// (0.02-0.2 s on the servers here), long enough that switching sides costs nothing.
const BLOCK: u64 = 100;

/// The timings of one side (S1 or the floor) accumulated over its blocks.
struct Timed {
    cycle: Recorder,
    elapsed: Duration,
}

impl Timed {
    fn new() -> Self {
        Self {
            cycle: Recorder::new(),
            elapsed: Duration::ZERO,
        }
    }
}

/// The S1 side: a client, its name and options, and its partial timings.
struct S1Side<'a> {
    client: &'a dyn DistributedLock,
    name: &'a str,
    options: AcquireOptions,
    wait_options: AcquireOptions,
    call: S1Call,
    timed: Timed,
    acquire: Recorder,
    release: Recorder,
}

impl S1Side<'_> {
    /// One acquire + release; recorded if `measured`.
    async fn cycle(&mut self, measured: bool) -> Result<(), Error> {
        let name = self.name;
        let start = Instant::now();
        let guard = match self.call {
            S1Call::TryAcquire => self
                .client
                .try_acquire(name, &self.options)
                .await?
                .ok_or_else(|| Error::Backend {
                    message: format!(
                        "{name:?} was held by somebody else during the uncontended run"
                    ),
                    source: None,
                })?,
            S1Call::Acquire => self.client.acquire(name, &self.wait_options).await?,
        };
        let acquired = Instant::now();
        guard.release().await?;
        let end = Instant::now();
        if measured {
            self.acquire.record(acquired - start);
            self.release.record(end - acquired);
            self.timed.cycle.record(end - start);
        }
        Ok(())
    }
}

/// The floor side.
struct FloorSide<'a, 'f> {
    floor: &'a mut (dyn RawFloor + 'f),
    name: &'a str,
    timed: Timed,
}

impl FloorSide<'_, '_> {
    /// One raw cycle; recorded if `measured`.
    async fn cycle(&mut self, measured: bool) -> Result<(), Error> {
        let start = Instant::now();
        self.floor.cycle(self.name).await?;
        if measured {
            self.timed.cycle.record(start.elapsed());
        }
        Ok(())
    }
}

/// Floor cycles measured after a pause each (see [`FloorResult::paused_cycle`]).
pub(crate) const PAUSED_CYCLES: u64 = 200;

/// Runs [`PAUSED_CYCLES`] floor cycles, each after `pause`, and returns their latency.
pub(crate) async fn paused_floor(
    floor: &mut dyn RawFloor,
    name: &str,
    pause: Duration,
    progress: &mut Progress,
) -> Result<LatencySummary, Error> {
    let mut cycle = Recorder::new();
    for _ in 0..PAUSED_CYCLES {
        tokio::time::sleep(pause).await;
        let start = Instant::now();
        floor.cycle(name).await?;
        cycle.record(start.elapsed());
        progress.tick(|| "paused floor cycles".to_owned());
    }
    Ok(cycle.summary())
}

/// One side of the comparison, for the block loop they share.
enum Side<'s, 'a, 'f> {
    S1(&'s mut S1Side<'a>),
    Floor(&'s mut FloorSide<'a, 'f>),
}

impl Side<'_, '_, '_> {
    /// Runs `n` cycles back to back and adds their wall time if `measured`.
    async fn block(mut self, n: u64, measured: bool, progress: &mut Progress) -> Result<(), Error> {
        let started = Instant::now();
        for _ in 0..n {
            match &mut self {
                Self::S1(s) => s.cycle(measured).await?,
                Self::Floor(f) => f.cycle(measured).await?,
            }
            progress.tick(|| "cycles".to_owned());
        }
        if measured {
            let timed = match self {
                Self::S1(s) => &mut s.timed,
                Self::Floor(f) => &mut f.timed,
            };
            timed.elapsed += started.elapsed();
        }
        Ok(())
    }
}

/// What [`run`] measured: each side's result, or why it stopped.
pub(crate) struct Uncontended {
    pub(crate) s1: Option<Result<S1Result, Error>>,
    pub(crate) floor: Option<Result<FloorResult, Error>>,
}

/// Measures S1 on `client` and the raw `floor`, each if given, interleaved. A side that fails
/// stops; the other goes on alone.
pub(crate) async fn run<'f>(
    client: Option<(&dyn DistributedLock, &str)>,
    floor: Option<(&mut (dyn RawFloor + 'f), &str)>,
    config: &BenchConfig,
    mut progress: Progress,
) -> Uncontended {
    let options = AcquireOptions::default().with_ttl(config.ttl);
    let mut s1 = client.map(|(client, name)| S1Side {
        client,
        name,
        wait_options: options.clone().with_wait(config.acquire_wait),
        options: options.clone(),
        call: config.s1_call,
        timed: Timed::new(),
        acquire: Recorder::new(),
        release: Recorder::new(),
    });
    let mut floor = floor.map(|(floor, name)| FloorSide {
        floor,
        name,
        timed: Timed::new(),
    });
    let mut s1_error = None;
    let mut floor_error = None;
    // Warm-up (unmeasured), then the alternating measured blocks.
    let mut blocks = vec![(config.warmup_cycles, false)];
    let mut left = config.cycles;
    while left > 0 {
        let n = left.min(BLOCK);
        blocks.push((n, true));
        left -= n;
    }
    for (i, (n, measured)) in blocks.into_iter().enumerate() {
        let floor_first = i % 2 == 0;
        for floor_turn in [floor_first, !floor_first] {
            let (side, error) = if floor_turn {
                (floor.as_mut().map(Side::Floor), &mut floor_error)
            } else {
                (s1.as_mut().map(Side::S1), &mut s1_error)
            };
            if let Some(side) = side.filter(|_| error.is_none())
                && let Err(e) = side.block(n, measured, &mut progress).await
            {
                *error = Some(e);
            }
        }
    }
    Uncontended {
        s1: s1.map(|s| match s1_error {
            Some(e) => Err(e),
            None => Ok(S1Result {
                call: config.s1_call,
                cycles: config.cycles,
                elapsed_ms: s.timed.elapsed.as_secs_f64() * 1000.0,
                ops_per_sec: rate(config.cycles, s.timed.elapsed),
                cycle: s.timed.cycle.summary(),
                acquire: s.acquire.summary(),
                release: s.release.summary(),
                floor_ratio: None,
            }),
        }),
        floor: floor.map(|f| match floor_error {
            Some(e) => Err(e),
            None => Ok(FloorResult {
                label: f.floor.label().to_owned(),
                cycles: config.cycles,
                elapsed_ms: f.timed.elapsed.as_secs_f64() * 1000.0,
                ops_per_sec: rate(config.cycles, f.timed.elapsed),
                cycle: f.timed.cycle.summary(),
                paused_cycle: None,
            }),
        }),
    }
}
