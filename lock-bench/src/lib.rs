//! The shared distlock benchmark harness: every backend measured the same way, next to the
//! cheapest correct lock its server allows.
//!
//! A [`Target`] is a label, a factory of independent `Arc<dyn DistributedLock>` clients and an
//! optional [`RawFloor`]. [`run`] measures each target with the same [`BenchConfig`]:
//!
//! - **Floor**: the backend's raw acquire + release (e.g. Redis `SET NX PX` + `EVALSHA`
//!   compare-and-delete), one connection, with the S1 loop. Every scenario reports its
//!   throughput as a ratio to it (lock ops/s ÷ floor ops/s). A floor that says it cannot be
//!   compared with S1's connection ([`RawFloor::unfit`]) is left out of S1 and S2, and
//!   [`TargetResult::no_floor`] says why.
//! - **S1, uncontended**: one client acquires and releases one name, `cycles` times after
//!   `warmup_cycles`: cycles/s and cycle latency p50/p99/max, plus acquire and release alone.
//!   With [`run_with`] and [`Instruments`] that measure CPU time, also the process's CPU time
//!   per cycle of S1 and of each floor, read around every block of cycles
//!   ([`S1Result::cpu_per_cycle_us`]): what the lock costs the client's CPUs besides its
//!   round trips.
//! - **S2, contended**: `clients` clients (each from its own factory call) loop on one name:
//!   `acquire`, hold for `hold`, release, re-acquire at once, for `duration` after
//!   `s2_warmup`. Critical sections/s; handoff latency to *another* client, measured from the
//!   instant just before the holder calls `release` to the instant the next holder's `acquire`
//!   returns (handoffs back to the same client are only counted, in
//!   [`S2Result::handoff_other_share`]); the longest single acquire; each client's share; and
//!   an exclusivity check (a shared holder gauge that must never exceed one).
//! - **RW mix**: [`BenchConfig::mixed_clients`] clients (8) on one name, each acquisition
//!   exclusive with probability [`BenchConfig::write_share`] (0.1), else shared; hold, release,
//!   again, as S2. Acquisitions/s, acquire latency (all, shared, exclusive), the longest wait,
//!   each client's share, and gauges: never two writers, never a writer with a reader
//!   ([`MixedResult`]).
//! - **Semaphore**: the same clients on one semaphore of [`BenchConfig::permits`] (3)
//!   permits; the gauge: never more holders than permits. Just before it, as many distlock
//!   mutexes as it has permits (at most its clients) run side by side, the same clients split
//!   among them, each name S2's loop ([`TargetResult::semaphore_mutexes`]): a permit changes
//!   hands as a mutex does, so they are about the most the semaphore can match on the same
//!   machine and server.
//!
//!   Both are skipped, with the reason in [`TargetResult::skipped`], on a backend whose
//!   [`Capabilities`](distlock_core::Capabilities) lack the kind. A violated bound makes
//!   [`Report::has_failures`] true.
//! - **Contended floor** (with S2, for a target that has one): S2's loop, same clients, hold
//!   and duration, on the server's own blocking lock ([`ContendedFloor`]: MySQL `GET_LOCK`,
//!   PostgreSQL advisory locks, etcd's Lock API, a ZooKeeper ephemeral node with a watch),
//!   measured just before S2 ([`S2Result::contended_floor_ratio`],
//!   [`S2Result::handoff_p99_floor_ratio`]). Where the server's lock has shared holds too
//!   ([`ContendedFloor::has_shared`]: PostgreSQL's advisory locks, the memory target's
//!   tokio read-write lock), the read/write mix runs
//!   on the floors as well, just before distlock's ([`TargetResult::rw_floor`]): a writer's
//!   turns between readers on the server's own read-write lock, beside its S2 handoffs.
//! - **Fenced floors** (for a target that registers them: [`Target::with_fenced_floor`],
//!   [`Target::with_fenced_contended_floor`]): the floors again, also handing out a fencing
//!   token (Redis: `INCR` in the transaction of the `SET`; SQL: a token commit per critical
//!   section). S1's runs in the same rotation of blocks as S1 and the floor, S2's right after
//!   the contended floor, so the same run shows what tokens cost by themselves and what
//!   distlock costs on top ([`S1Result::fenced_floor_ratio`],
//!   [`S2Result::fenced_contended_floor_ratio`]).
//! - **Paused floor** (with S2): floor cycles each started after a pause as long as `hold`.
//!   A handoff starts from idle processes and CPUs (everybody slept through the hold), and
//!   waking them costs far more than a round trip on a busy loop (here, on a virtual machine:
//!   a PostgreSQL statement 0.36 ms back to back, 0.9 ms after 0.5 ms idle). So handoffs are
//!   compared with this paused cycle, two round trips from idle
//!   ([`S2Result::handoff_paused_floor_ratio`]).
//!
//! - **Growth curves** (issue 22; [`ScenarioSelection::Growth`] or one of `Hold`, `Clients`,
//!   `Names`, never in `All`: they are long): hold-K (one client holding K locks: the server's
//!   requests per renewal tick from its own [`ServerCounter`], CPU and heap bytes per guard
//!   from the binary's [`Instruments`], locks lost), clients-C (S2 per client count) and names
//!   (random names next to the raw floor run the same way), in [`TargetResult::growth`];
//!   hold-K, clients-C and names for each primitive of [`BenchConfig::growth_kinds`] (the
//!   read-write lock's hold-K holds read holds, its clients-C and names run the read/write
//!   mix; the semaphore's holds one permit per name and runs the semaphore scenario:
//!   [`MixedClientsPoint`]);
//!   [`hold_cost_svg`], [`clients_latency_svg`] and [`clients_primitives_svg`] chart them.
//!   See [`run_with`].
//! - **Churn** (issue 42; [`ScenarioSelection::Churn`], not in `Growth`): one client
//!   acquires and releases [`BenchConfig::churn_names`] distinct names once each, then counts
//!   what the server still keeps for them through
//!   [`DistributedLock::footprint`](distlock_core::DistributedLock::footprint), at once and
//!   after [`BenchConfig::churn_settle`] ([`ChurnResult`]).
//!
//! Lock names live under a random prefix per run, so concurrent or repeated runs against one
//! server do not collide. A failing part (connection refused, lock lost) is recorded in the
//! [`Report`] and the run goes on. The report renders as Markdown
//! ([`Report::to_markdown`]) and JSON ([`Report::to_json`]) and carries the parameters.
//!
//! ```
//! use std::time::Duration;
//! use distlock_bench::{BenchConfig, Target};
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let config = BenchConfig::default()
//!     .with_cycles(100)
//!     .with_warmup_cycles(10)
//!     .with_duration(Duration::from_millis(100))
//!     .with_s2_warmup(Duration::from_millis(20));
//! let report = distlock_bench::run(&[Target::memory()], &config).await?;
//! assert!(!report.has_failures());
//! println!("{}", report.to_markdown());
//! # Ok::<(), distlock_core::Error>(())
//! # }).unwrap();
//! ```
//!
//! Other backends register a target the same way, with a factory that opens a new client
//! per call (`distlock bench`, the one benchmark command, does this for every backend URL,
//! `memory://` included):
//!
//! ```
//! # use std::sync::Arc;
//! # use distlock_bench::Target;
//! # use distlock_core::{DistributedLock, Error};
//! # async fn connect(_url: &str) -> Result<Arc<dyn DistributedLock>, Error> {
//! #     Ok(distlock_core::memory::MemoryStore::new().client())
//! # }
//! let url = "redis://127.0.0.1:16379".to_owned();
//! let target = Target::new("redis", move || {
//!     let url = url.clone();
//!     async move { connect(&url).await }
//! });
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]

mod charts;
mod churn;
mod config;
mod contended;
mod growth;
mod hooks;
mod mixed;
mod report;
mod stats;
mod target;
mod uncontended;

pub use charts::{clients_latency_svg, clients_primitives_svg, hold_cost_svg};
pub use churn::{ChurnResult, Leftover};
pub use config::{BenchConfig, GrowthKind, S1Call, ScenarioSelection};
pub use growth::{
    ClientsPoint, GrowthResult, HoldPoint, IdleWindow, Instruments, MixedClientsPoint, NamesResult,
    NoInstruments, ServerCounter,
};
pub use hooks::{
    BenchHooks, ContendedFloorFn, FloorFn, ReadsFn, ServerCounterFn, exchange, http_get,
    probe_error, timed, url_hosts,
};
pub use report::{
    ClientShare, ContendedFloorResult, FloorMixResult, FloorResult, MixedResult, Report, S1Result,
    S2Result, ScenarioError, SideBySideResult, Skipped, TargetResult,
};
pub use stats::LatencySummary;
pub use target::{
    ClientFuture, ContendedFloor, ContendedFloorFuture, FloorFuture, RawFloor, ServerCounterFuture,
    Target,
};

use distlock_core::Error;
use stats::Progress;

/// Measures every target with `config`, one after another, and returns all results.
///
/// Must run inside a tokio runtime (S2 spawns one task per client); a multi-threaded runtime
/// gives contending clients real parallelism.
///
/// # Errors
/// [`Error::InvalidConfig`] if `config` is invalid. Failures while measuring are recorded in
/// the report ([`TargetResult::errors`]) instead.
pub async fn run(targets: &[Target], config: &BenchConfig) -> Result<Report, Error> {
    run_with(targets, config, &NoInstruments).await
}

/// [`run`] with the process's [`Instruments`]: S1's and its floors' CPU time per cycle, the
/// hold scenario's heap and CPU figures, and a progress display for the growth scenarios.
///
/// # Errors
/// As [`run`].
pub async fn run_with(
    targets: &[Target],
    config: &BenchConfig,
    instruments: &dyn Instruments,
) -> Result<Report, Error> {
    config.validate()?;
    let mut results = Vec::with_capacity(targets.len());
    if config.scenarios.growth_only() {
        let phases = targets
            .iter()
            .map(|t| growth::phases(config, t.has_server_counter()))
            .sum();
        instruments.begin(phases);
    }
    for target in targets {
        results.push(run_target(target, config, instruments).await);
    }
    if config.scenarios.growth_only() {
        instruments.finish();
    }
    Ok(Report {
        tool: format!("lock-bench {}", env!("CARGO_PKG_VERSION")),
        config: config.clone(),
        runtime: runtime_flavor(),
        targets: results,
    })
}

/// The flavour of the runtime this runs on, as tokio names it.
fn runtime_flavor() -> String {
    match tokio::runtime::Handle::current().runtime_flavor() {
        tokio::runtime::RuntimeFlavor::CurrentThread => "current_thread",
        tokio::runtime::RuntimeFlavor::MultiThread => "multi_thread",
        _ => "other",
    }
    .to_owned()
}

async fn run_target(
    target: &Target,
    config: &BenchConfig,
    instruments: &dyn Instruments,
) -> TargetResult {
    let label = target.label();
    let base = format!("{}/{label}", config.name_prefix);
    let mut result = TargetResult {
        target: label.to_owned(),
        backend: None,
        floor: None,
        no_floor: None,
        fenced_floor: None,
        uncontended: None,
        contended: None,
        contended_floor: None,
        fenced_contended_floor: None,
        rw_mix: None,
        rw_floor: None,
        semaphore: None,
        semaphore_mutexes: None,
        growth: None,
        skipped: Vec::new(),
        errors: Vec::new(),
    };
    if config.scenarios.growth_only() {
        let growth = growth::run_target(
            target,
            config,
            instruments,
            &base,
            &mut result.backend,
            (&mut result.errors, &mut result.skipped),
        )
        .await;
        result.growth = Some(growth);
        return result;
    }
    let floor_name = format!("{base}/floor");
    let mut floor = run_s1(target, config, instruments, &base, &floor_name, &mut result).await;
    if config.scenarios.contended() {
        run_s2(
            target,
            config,
            &base,
            floor.as_deref_mut(),
            &floor_name,
            &mut result,
        )
        .await;
    }
    if config.scenarios.rw_mix() {
        let mix = mixed::Mix::ReadWrite {
            write_share: config.write_share,
        };
        if target.has_contended_floor() {
            match floor_mix(target, mix, &base, config).await {
                Ok(floor) => result.rw_floor = floor,
                Err(e) => result.errors.push(ScenarioError::new("rw floor", &e)),
            }
        }
        result.rw_mix = run_mixed(target, config, mix, "rw", &base, &mut result).await;
    }
    if config.scenarios.semaphore() {
        let mix = mixed::Mix::Semaphore {
            permits: config.permits,
        };
        match mutexes_side_by_side(target, config, mix, &base, &mut result).await {
            Ok(side) => result.semaphore_mutexes = side,
            Err(e) => result
                .errors
                .push(ScenarioError::new("semaphore mutexes", &e)),
        }
        result.semaphore = run_mixed(target, config, mix, "semaphore", &base, &mut result).await;
    }
    result
}

/// S1 next to the raw floor and the fenced floor (when the scenarios have S1): their results
/// into `result`; returns the raw floor (for S2's paused floor), unless it declared itself
/// unfit or failed to open.
async fn run_s1(
    target: &Target,
    config: &BenchConfig,
    instruments: &dyn Instruments,
    base: &str,
    floor_name: &str,
    result: &mut TargetResult,
) -> Option<Box<dyn RawFloor>> {
    let mut floor = match target.floor().await {
        Ok(floor) => floor,
        Err(e) => {
            result.errors.push(ScenarioError::new("floor", &e));
            None
        }
    };
    result.no_floor = floor
        .as_deref()
        .and_then(RawFloor::unfit)
        .map(str::to_owned);
    if result.no_floor.is_some() {
        floor = None;
    }
    // Only next to S1: unlike the floor, it has no part in S2's comparisons.
    let fenced_floor = if config.scenarios.uncontended() {
        target.fenced_floor().await
    } else {
        Ok(None)
    };
    let mut fenced_floor = fenced_floor.unwrap_or_else(|e| {
        result.errors.push(ScenarioError::new("fenced floor", &e));
        None
    });
    let client = if config.scenarios.uncontended() {
        match target.connect().await {
            Ok(client) => {
                result.backend = Some(client.backend().to_owned());
                Some(client)
            }
            Err(e) => {
                result.errors.push(ScenarioError::new("s1", &e));
                None
            }
        }
    } else {
        None
    };
    let s1_name = format!("{base}/s1");
    let fenced_name = format!("{base}/fenced-floor");
    let measured = uncontended::run(
        client.as_deref().map(|c| (c, s1_name.as_str())),
        floor.as_deref_mut().map(|f| (f, floor_name)),
        fenced_floor
            .as_deref_mut()
            .map(|f| (f, fenced_name.as_str())),
        config,
        instruments,
        Progress::new(config.progress, target.label(), "s1"),
    )
    .await;
    for (scenario, measured, slot) in [
        ("floor", measured.floor, &mut result.floor),
        (
            "fenced floor",
            measured.fenced_floor,
            &mut result.fenced_floor,
        ),
    ] {
        match measured {
            Some(Ok(f)) => *slot = Some(f),
            Some(Err(e)) => result.errors.push(ScenarioError::new(scenario, &e)),
            None => {}
        }
    }
    drop(fenced_floor);
    let ops = |f: &Option<FloorResult>| f.as_ref().map(|f| f.ops_per_sec).filter(|ops| *ops > 0.0);
    let (floor_ops, fenced_ops) = (ops(&result.floor), ops(&result.fenced_floor));
    match measured.s1 {
        Some(Ok(mut s1)) => {
            s1.floor_ratio = floor_ops.map(|f| s1.ops_per_sec / f);
            s1.fenced_floor_ratio = fenced_ops.map(|f| s1.ops_per_sec / f);
            result.uncontended = Some(s1);
        }
        Some(Err(e)) => result.errors.push(ScenarioError::new("s1", &e)),
        None => {}
    }
    drop(client);
    floor
}

/// S2 next to the contended floors and the floor's paused cycle: their results, and S2's
/// ratios to them, into `result`.
async fn run_s2(
    target: &Target,
    config: &BenchConfig,
    base: &str,
    floor: Option<&mut (dyn RawFloor + '_)>,
    floor_name: &str,
    result: &mut TargetResult,
) {
    let progress = |scenario| Progress::new(config.progress, target.label(), scenario);
    if let (Some(raw), Some(measured)) = (floor, result.floor.as_mut()) {
        let mut progress = progress("paused floor");
        match uncontended::paused_floor(raw, floor_name, config.hold, &mut progress).await {
            Ok(paused) => measured.paused_cycle = Some(paused),
            Err(e) => result.errors.push(ScenarioError::new("floor", &e)),
        }
    }

    if target.has_contended_floor() {
        match contended_floor(target, false, base, config).await {
            Ok(floor) => result.contended_floor = Some(floor),
            Err(e) => result.errors.push(ScenarioError::new("s2 floor", &e)),
        }
    }
    if target.has_fenced_contended_floor() {
        match contended_floor(target, true, base, config).await {
            Ok(floor) => result.fenced_contended_floor = Some(floor),
            Err(e) => result
                .errors
                .push(ScenarioError::new("s2 fenced floor", &e)),
        }
    }

    let s2 = async {
        let clients = connect(target, config.clients, &mut result.backend).await?;
        contended::run_s2(clients, format!("{base}/s2"), config, progress("s2")).await
    };
    match s2.await {
        Ok(mut s2) => {
            s2_ratios(&mut s2, result);
            result.contended = Some(s2);
        }
        Err(e) => result.errors.push(ScenarioError::new("s2", &e)),
    }
}

/// S2's ratios to the floors measured before it.
fn s2_ratios(s2: &mut S2Result, result: &TargetResult) {
    s2.floor_ratio = result
        .floor
        .as_ref()
        .map(|f| f.ops_per_sec)
        .filter(|ops| *ops > 0.0)
        .map(|f| s2.critical_sections_per_sec / f);
    s2.handoff_paused_floor_ratio = result
        .floor
        .as_ref()
        .and_then(|f| f.paused_cycle.as_ref())
        .filter(|p| p.p50_us > 0.0)
        .map(|p| s2.handoff.p50_us / p.p50_us);
    if let Some(floor) = &result.contended_floor {
        let f = &floor.s2;
        s2.contended_floor_ratio = (f.critical_sections_per_sec > 0.0)
            .then(|| s2.critical_sections_per_sec / f.critical_sections_per_sec);
        s2.handoff_p99_floor_ratio =
            (f.handoff.p99_us > 0.0).then(|| s2.handoff.p99_us / f.handoff.p99_us);
    }
    if let Some(floor) = &result.fenced_contended_floor {
        let f = &floor.s2;
        s2.fenced_contended_floor_ratio = (f.critical_sections_per_sec > 0.0)
            .then(|| s2.critical_sections_per_sec / f.critical_sections_per_sec);
    }
}

/// S2's loop on `target`'s contended floor (`fenced`: its fenced one), one floor per client.
async fn contended_floor(
    target: &Target,
    fenced: bool,
    base: &str,
    config: &BenchConfig,
) -> Result<ContendedFloorResult, Error> {
    let mut floors = Vec::with_capacity(config.clients);
    for _ in 0..config.clients {
        let floor = if fenced {
            target.fenced_contended_floor().await?
        } else {
            target.contended_floor().await?
        };
        floors.extend(floor);
    }
    let label = floors
        .first()
        .map(|f| f.label().to_owned())
        .unwrap_or_default();
    let (name, scenario) = if fenced {
        (format!("{base}/s2-fenced-floor"), "s2 fenced floor")
    } else {
        (format!("{base}/s2-floor"), "s2 floor")
    };
    let progress = Progress::new(config.progress, target.label(), scenario);
    let s2 = contended::run_s2(floors, name, config, progress).await?;
    Ok(ContendedFloorResult { label, s2 })
}

/// The read/write mix `mix` on `target`'s contended floors, one per client, when they have
/// shared holds (`None` when they have not).
async fn floor_mix(
    target: &Target,
    mix: mixed::Mix,
    base: &str,
    config: &BenchConfig,
) -> Result<Option<FloorMixResult>, Error> {
    // The first floor says whether the server's lock has shared holds.
    let Some(first) = target.contended_floor().await?.filter(|f| f.has_shared()) else {
        return Ok(None);
    };
    let label = first.label().to_owned();
    let mut floors = vec![first];
    for _ in 1..config.mixed_clients {
        let Some(floor) = target.contended_floor().await? else {
            return Err(Error::Unsupported(format!(
                "the contended floor {label:?} opened once, then declined"
            )));
        };
        floors.push(floor);
    }
    let progress = Progress::new(config.progress, target.label(), "rw floor");
    let name = format!("{base}/rw-floor");
    let mix = mixed::run_mixed(floors, name, mix, config, progress).await?;
    Ok(Some(FloorMixResult { label, mix }))
}

/// `count` clients of `target`, each from its own factory call; `backend` learns their
/// backend's name.
async fn connect(
    target: &Target,
    count: usize,
    backend: &mut Option<String>,
) -> Result<Vec<std::sync::Arc<dyn distlock_core::DistributedLock>>, Error> {
    let mut clients = Vec::with_capacity(count);
    for _ in 0..count {
        clients.push(target.connect().await?);
    }
    if let Some(client) = clients.first() {
        *backend = Some(client.backend().to_owned());
    }
    Ok(clients)
}

/// As many distlock mutexes as the semaphore has permits, side by side, each S2's loop on its
/// own name with its share of the semaphore's clients ([`SideBySideResult`]); `None` when the
/// backend has no semaphore of that size (the semaphore's run says why).
async fn mutexes_side_by_side(
    target: &Target,
    config: &BenchConfig,
    mix: mixed::Mix,
    base: &str,
    result: &mut TargetResult,
) -> Result<Option<SideBySideResult>, Error> {
    let clients = connect(target, config.mixed_clients, &mut result.backend).await?;
    let Some(client) = clients.first() else {
        return Ok(None);
    };
    if mix
        .unsupported(client.backend(), client.capabilities())
        .is_some()
    {
        return Ok(None);
    }
    // `connect` made `mixed_clients` clients, the bound of the names.
    let names = config.side_by_side_names();
    let mut groups: Vec<Vec<_>> = (0..names).map(|_| Vec::new()).collect();
    for (i, client) in clients.into_iter().enumerate() {
        groups[i % names].push(client);
    }
    let runs = groups.into_iter().enumerate().map(|(i, group)| {
        let scenario = format!("mutex {} of {names} side by side", i + 1);
        let progress = Progress::new(config.progress, target.label(), &scenario);
        let name = format!("{base}/semaphore-mutexes/{i}");
        contended::run_s2(group, name, config, progress)
    });
    // Every run to its end (each bounded by its deadline), even after one failed: clients
    // left running would share the server with the semaphore's run that follows.
    let runs = futures::future::join_all(runs)
        .await
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    let critical_sections = runs.iter().map(|r| r.critical_sections).sum();
    Ok(Some(SideBySideResult {
        names,
        clients: config.mixed_clients,
        critical_sections,
        critical_sections_per_sec: stats::rate(critical_sections, config.duration),
        per_name: runs.iter().map(|r| r.critical_sections_per_sec).collect(),
        violations: runs.iter().map(|r| r.exclusivity_violations).sum(),
    }))
}

/// The read/write mix or the semaphore on `target`: skipped (with the reason in `result`)
/// when the backend lacks the lock kind, errors recorded in `result`.
async fn run_mixed(
    target: &Target,
    config: &BenchConfig,
    mix: mixed::Mix,
    scenario: &str,
    base: &str,
    result: &mut TargetResult,
) -> Option<MixedResult> {
    let progress = Progress::new(config.progress, target.label(), scenario);
    let measured = async {
        let clients = connect(target, config.mixed_clients, &mut result.backend).await?;
        if let Some(client) = clients.first()
            && let Some(reason) = mix.unsupported(client.backend(), client.capabilities())
        {
            return Ok(Err(reason));
        }
        let name = format!("{base}/{scenario}");
        mixed::run_mixed(clients, name, mix, config, progress)
            .await
            .map(Ok)
    };
    match measured.await {
        Ok(Ok(measured)) => {
            if measured.violations > 0 {
                eprintln!(
                    "[{}] {scenario}: {} VIOLATIONS of the bound (max holders {}, max writers {:?})",
                    target.label(),
                    measured.violations,
                    measured.max_holders,
                    measured.max_writers
                );
            }
            Some(measured)
        }
        Ok(Err(reason)) => {
            result.skipped.push(Skipped {
                scenario: scenario.to_owned(),
                reason,
            });
            None
        }
        Err(e) => {
            result.errors.push(ScenarioError::new(scenario, &e));
            None
        }
    }
}
