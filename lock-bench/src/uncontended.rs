//! S1 (uncontended acquire + release) and the raw floor (and the fenced floor, when the target
//! has one), measured with the same loop and interleaved: the measured cycles of each run in
//! blocks of [`BLOCK`] cycles that rotate between the sides (each one first in turn: the floor,
//! then S1, then the fenced floor), so that a server whose speed drifts during the run (a
//! write-ahead log growing, a snapshot, a JVM warming up, another process waking) weighs on all
//! alike and the ratios compare like with like.

use std::time::{Duration, Instant};

use distlock_core::{AcquireOptions, DistributedLock, Error};

use crate::report::{FloorResult, S1Result};
use crate::stats::{CpuTotal, Progress, Recorder, rate};
use crate::{BenchConfig, Instruments, LatencySummary, RawFloor, S1Call};

/// Measured cycles per alternating block: short enough that drift within a block is small
/// (0.02-0.2 s on the servers here), long enough that switching sides costs nothing.
const BLOCK: u64 = 100;

/// The timings of one side (S1 or the floor) accumulated over its blocks.
struct Timed {
    cycle: Recorder,
    elapsed: Duration,
    /// The process's CPU time during the side's measured blocks.
    cpu: CpuTotal,
}

impl Timed {
    fn new() -> Self {
        Self {
            cycle: Recorder::new(),
            elapsed: Duration::ZERO,
            cpu: CpuTotal::new(),
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

impl<'a, 'f> FloorSide<'a, 'f> {
    /// The side of `floor`, if given.
    fn of(floor: FloorArg<'a, 'f>) -> Option<Self> {
        floor.map(|(floor, name)| Self {
            floor,
            name,
            timed: Timed::new(),
        })
    }

    /// One raw cycle; recorded if `measured`.
    async fn cycle(&mut self, measured: bool) -> Result<(), Error> {
        let start = Instant::now();
        self.floor.cycle(self.name).await?;
        if measured {
            self.timed.cycle.record(start.elapsed());
        }
        Ok(())
    }

    /// What this side measured over `cycles` measured cycles, or the error that stopped it.
    fn result(self, error: Option<Error>, cycles: u64) -> Result<FloorResult, Error> {
        match error {
            Some(e) => Err(e),
            None => Ok(FloorResult {
                label: self.floor.label().to_owned(),
                cycles,
                elapsed_ms: self.timed.elapsed.as_secs_f64() * 1000.0,
                ops_per_sec: rate(cycles, self.timed.elapsed),
                cycle: self.timed.cycle.summary(),
                cpu_per_cycle_us: self.timed.cpu.per_cycle_us(cycles),
                paused_cycle: None,
            }),
        }
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
    /// Runs `n` cycles back to back and adds their wall time (and the process's CPU time, as
    /// `instruments` measure it) if `measured`.
    async fn block(
        mut self,
        n: u64,
        measured: bool,
        progress: &mut Progress,
        instruments: &dyn Instruments,
    ) -> Result<(), Error> {
        // Read only around measured blocks (`getrusage` in the CLI: a syscall).
        let cpu = measured.then(|| instruments.cpu_time()).flatten();
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
            timed.cpu.add(cpu, instruments.cpu_time());
        }
        Ok(())
    }
}

/// What [`run`] measured: each side's result, or why it stopped.
pub(crate) struct Uncontended {
    pub(crate) s1: Option<Result<S1Result, Error>>,
    pub(crate) floor: Option<Result<FloorResult, Error>>,
    pub(crate) fenced_floor: Option<Result<FloorResult, Error>>,
}

/// A raw floor to measure next to S1: the floor and the name it locks.
pub(crate) type FloorArg<'a, 'f> = Option<(&'a mut (dyn RawFloor + 'f), &'a str)>;

/// Measures S1 on `client`, the raw `floor` and the `fenced` floor, each if given,
/// interleaved, with the process's CPU time per side as `instruments` measure it. A side that
/// fails stops; the others go on.
pub(crate) async fn run<'f>(
    client: Option<(&dyn DistributedLock, &str)>,
    floor: FloorArg<'_, 'f>,
    fenced: FloorArg<'_, 'f>,
    config: &BenchConfig,
    instruments: &dyn Instruments,
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
    let (mut floor, mut fenced) = (FloorSide::of(floor), FloorSide::of(fenced));
    // Per side, in rotation order: the floor, S1, the fenced floor.
    let mut errors: [Option<Error>; 3] = [None, None, None];
    let present: Vec<usize> = [floor.is_some(), s1.is_some(), fenced.is_some()]
        .iter()
        .enumerate()
        .filter_map(|(i, present)| present.then_some(i))
        .collect();
    // Warm-up (unmeasured), then the rotating measured blocks.
    let mut blocks = vec![(config.warmup_cycles, false)];
    let mut left = config.cycles;
    while left > 0 {
        let n = left.min(BLOCK);
        blocks.push((n, true));
        left -= n;
    }
    for (i, (n, measured)) in blocks.into_iter().enumerate() {
        for k in 0..present.len() {
            let which = present[(i + k) % present.len()];
            if errors[which].is_some() {
                continue;
            }
            let side = match which {
                0 => floor.as_mut().map(Side::Floor),
                1 => s1.as_mut().map(Side::S1),
                _ => fenced.as_mut().map(Side::Floor),
            };
            if let Some(side) = side
                && let Err(e) = side.block(n, measured, &mut progress, instruments).await
            {
                errors[which] = Some(e);
            }
        }
    }
    let [floor_error, s1_error, fenced_error] = errors;
    Uncontended {
        s1: s1.map(|s| match s1_error {
            Some(e) => Err(e),
            None => Ok(S1Result {
                call: config.s1_call,
                cycles: config.cycles,
                elapsed_ms: s.timed.elapsed.as_secs_f64() * 1000.0,
                ops_per_sec: rate(config.cycles, s.timed.elapsed),
                cycle: s.timed.cycle.summary(),
                cpu_per_cycle_us: s.timed.cpu.per_cycle_us(config.cycles),
                acquire: s.acquire.summary(),
                release: s.release.summary(),
                floor_ratio: None,
                fenced_floor_ratio: None,
            }),
        }),
        floor: floor.map(|f| f.result(floor_error, config.cycles)),
        fenced_floor: fenced.map(|f| f.result(fenced_error, config.cycles)),
    }
}
