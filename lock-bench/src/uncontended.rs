//! S1 (uncontended acquire + release) and the raw floor, measured with the same loop.

use std::time::{Duration, Instant};

use lock_core::{AcquireOptions, DistributedLock, Error};

use crate::report::{FloorResult, S1Result};
use crate::stats::{Progress, Recorder, rate};
use crate::{BenchConfig, RawFloor, S1Call};

/// The timings of the measured cycles of one loop.
struct Timed {
    cycle: Recorder,
    elapsed: Duration,
}

/// Runs `warmup + cycles` iterations of `step` (which returns when the cycle ended and records
/// its own partial timings) and times the measured ones, start to end, back to back.
///
/// A macro rather than a function taking a closure, because the step borrows the client or
/// floor mutably across its await points.
macro_rules! timed_loop {
    ($config:expr, $progress:expr, |$measured:ident| $step:expr) => {{
        let config: &BenchConfig = $config;
        let total = config.warmup_cycles + config.cycles;
        let mut cycle = Recorder::new();
        let mut first_start = None;
        let mut last_end = Instant::now();
        for i in 0..total {
            let $measured = i >= config.warmup_cycles;
            let start = Instant::now();
            if $measured && first_start.is_none() {
                first_start = Some(start);
            }
            $step;
            last_end = Instant::now();
            if $measured {
                cycle.record(last_end - start);
            }
            $progress.tick(|| format!("{} / {total} cycles", i + 1));
        }
        let elapsed = first_start.map_or(Duration::ZERO, |s| last_end - s);
        Timed { cycle, elapsed }
    }};
}

pub(crate) async fn run_s1(
    client: &dyn DistributedLock,
    name: &str,
    config: &BenchConfig,
    mut progress: Progress,
) -> Result<S1Result, Error> {
    let options = AcquireOptions::default().with_ttl(config.ttl);
    let wait_options = options.clone().with_wait(config.acquire_wait);
    let mut acquire = Recorder::new();
    let mut release = Recorder::new();
    let timed = timed_loop!(config, progress, |measured| {
        let start = Instant::now();
        let guard = match config.s1_call {
            S1Call::TryAcquire => {
                client
                    .try_acquire(name, &options)
                    .await?
                    .ok_or_else(|| Error::Backend {
                        message: format!(
                            "{name:?} was held by somebody else during the uncontended run"
                        ),
                        source: None,
                    })?
            }
            S1Call::Acquire => client.acquire(name, &wait_options).await?,
        };
        let acquired = Instant::now();
        guard.release().await?;
        if measured {
            acquire.record(acquired - start);
            release.record(acquired.elapsed());
        }
    });
    let ops_per_sec = rate(config.cycles, timed.elapsed);
    Ok(S1Result {
        call: config.s1_call,
        cycles: config.cycles,
        elapsed_ms: timed.elapsed.as_secs_f64() * 1000.0,
        ops_per_sec,
        cycle: timed.cycle.summary(),
        acquire: acquire.summary(),
        release: release.summary(),
        floor_ratio: None,
    })
}

pub(crate) async fn run_floor(
    floor: &mut dyn RawFloor,
    name: &str,
    config: &BenchConfig,
    mut progress: Progress,
) -> Result<FloorResult, Error> {
    let timed = timed_loop!(config, progress, |_measured| {
        floor.cycle(name).await?;
    });
    Ok(FloorResult {
        label: floor.label().to_owned(),
        cycles: config.cycles,
        elapsed_ms: timed.elapsed.as_secs_f64() * 1000.0,
        ops_per_sec: rate(config.cycles, timed.elapsed),
        cycle: timed.cycle.summary(),
    })
}
