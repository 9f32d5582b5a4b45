//! The harness on the in-memory backend, with small parameters: result structure, floor
//! plumbing, error reporting and the flag defaults. No timing assertions.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use distlock_bench::{
    BenchConfig, LatencySummary, RawFloor, Report, S1Call, ScenarioSelection, Target,
};
use distlock_core::memory::MemoryStore;
use distlock_core::{Error, LockKind};

fn small() -> BenchConfig {
    BenchConfig::default()
        .with_cycles(200)
        .with_warmup_cycles(20)
        .with_duration(Duration::from_millis(300))
        .with_s2_warmup(Duration::from_millis(50))
}

/// The side-by-side table's row that starts with `starts`, and its nine cells.
fn side_by_side_row<'a>(markdown: &'a str, starts: &str) -> (&'a str, Vec<&'a str>) {
    let row = markdown
        .lines()
        .find(|l| l.starts_with(starts))
        .unwrap_or_else(|| panic!("no side-by-side row: {markdown}"));
    let cells: Vec<&str> = row.trim_matches('|').split(" | ").map(str::trim).collect();
    assert_eq!(cells.len(), 9, "{row}");
    (row, cells)
}

fn assert_sane(latency: &LatencySummary, what: &str) {
    assert!(latency.count > 0, "{what}: no samples");
    assert!(
        latency.p50_us <= latency.p99_us,
        "{what}: p50 > p99: {latency:?}"
    );
    assert!(
        latency.p99_us <= latency.max_us,
        "{what}: p99 > max: {latency:?}"
    );
    assert!(latency.mean_us > 0.0, "{what}: zero mean: {latency:?}");
}

/// A floor that costs two scheduler round trips and counts its cycles; its name must end in
/// `/{name}` (the floor's `floor`, the fenced floor's `fenced-floor`).
#[derive(Debug)]
struct YieldFloor {
    cycles: Arc<AtomicU64>,
    label: &'static str,
    name: &'static str,
}

impl YieldFloor {
    fn plain(cycles: Arc<AtomicU64>) -> Box<dyn RawFloor> {
        Box::new(Self {
            cycles,
            label: "two yields",
            name: "floor",
        })
    }
}

#[async_trait]
impl RawFloor for YieldFloor {
    fn label(&self) -> &str {
        self.label
    }

    async fn cycle(&mut self, name: &str) -> Result<(), Error> {
        let suffix = name.rsplit('/').next().unwrap_or_default();
        assert_eq!(suffix, self.name, "floor name {name:?}");
        tokio::task::yield_now().await;
        tokio::task::yield_now().await;
        self.cycles.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

fn memory_target_with_floor(label: &str, cycles: Arc<AtomicU64>) -> Target {
    let store = MemoryStore::new();
    Target::new(label, move || {
        let store = store.clone();
        async move { Ok(store.client()) }
    })
    .with_floor(move || {
        let cycles = cycles.clone();
        async move { Ok(YieldFloor::plain(cycles)) }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_scenarios_on_memory_give_sane_results() {
    let config = small();
    let report = distlock_bench::run(&[Target::memory()], &config)
        .await
        .unwrap();
    assert!(!report.has_failures(), "{report:#?}");
    assert_eq!(report.targets.len(), 1);
    let t = &report.targets[0];
    assert_eq!(t.target, "memory");
    assert_eq!(t.backend.as_deref(), Some("memory"));
    assert!(t.errors.is_empty(), "{:?}", t.errors);

    let floor = t.floor.as_ref().expect("the memory target has a floor");
    assert_eq!(floor.cycles, 200);
    assert_sane(&floor.cycle, "floor");
    assert_eq!(floor.cycle.count, 200);
    assert!(floor.ops_per_sec > 0.0);

    let s1 = t.uncontended.as_ref().expect("S1 ran");
    assert_eq!(s1.call, S1Call::TryAcquire);
    assert_eq!(s1.cycle.count, 200);
    assert_sane(&s1.cycle, "s1 cycle");
    assert_sane(&s1.acquire, "s1 acquire");
    assert_sane(&s1.release, "s1 release");
    assert!(s1.ops_per_sec > 0.0);
    // The measured cycles are disjoint parts of the measured wall time.
    let summed = s1.cycle.mean_us * s1.cycle.count as f64;
    assert!(
        summed <= s1.elapsed_ms * 1000.0 * 1.01,
        "cycles sum to {summed} µs in {} ms",
        s1.elapsed_ms
    );
    assert!(s1.cycle.max_us * 1.01 >= s1.acquire.max_us.max(s1.release.max_us));
    assert!(s1.floor_ratio.is_some_and(|r| r > 0.0));

    let s2 = t.contended.as_ref().expect("S2 ran");
    assert_eq!(s2.clients, 4);
    assert!(s2.critical_sections > 0);
    assert!(s2.critical_sections_per_sec > 0.0);
    assert_eq!(s2.exclusivity_violations, 0);
    assert_eq!(s2.max_holders, 1);
    assert_sane(&s2.handoff, "s2 handoff");
    assert_eq!(s2.handoff.count, s2.handoffs_to_other);
    assert_sane(&s2.acquire_wait, "s2 acquire");
    assert_eq!(s2.acquire_wait.count, s2.critical_sections);
    let share = s2.handoff_other_share.expect("there were handoffs");
    assert!((0.0..=1.0).contains(&share), "handoff share {share}");
    assert!(s2.handoffs_to_other + s2.handoffs_to_self <= s2.critical_sections);
    assert!(s2.longest_wait_us > 0.0);
    // The exact longest wait and the histogram's maximum agree (3 significant digits).
    let (exact, recorded) = (s2.longest_wait_us, s2.acquire_wait.max_us);
    assert!(
        (recorded - exact).abs() <= exact * 0.002 + 0.01,
        "exact {exact} µs, histogram {recorded} µs"
    );
    assert!(
        s2.mean_hold_us >= 1000.0,
        "hold is at least the requested 1 ms: {}",
        s2.mean_hold_us
    );
    assert!(s2.held_share > 0.0);
    assert_eq!(s2.per_client.len(), 4);
    let total: u64 = s2.per_client.iter().map(|c| c.critical_sections).sum();
    assert_eq!(total, s2.critical_sections);
    let shares: f64 = s2.per_client.iter().map(|c| c.share).sum();
    assert!((shares - 1.0).abs() < 1e-9, "shares sum to {shares}");
    for c in &s2.per_client {
        assert!((0.0..=1.0).contains(&c.share));
        assert!(c.longest_wait_us <= s2.longest_wait_us);
    }
    assert!(s2.floor_ratio.is_some_and(|r| r > 0.0));

    // With S2, the floor is also measured after pauses as long as the hold.
    let paused = floor
        .paused_cycle
        .as_ref()
        .expect("S2 ran: the paused floor too");
    assert_eq!(paused.count, 200);
    assert_sane(paused, "paused floor");
    let ratio = s2
        .handoff_paused_floor_ratio
        .expect("a floor and handoffs: a ratio");
    assert!((ratio - s2.handoff.p50_us / paused.p50_us).abs() <= 1e-9 * ratio.max(1.0));
    let markdown = report.to_markdown();
    assert!(markdown.contains("handoff ÷ paused"), "{markdown}");
    assert!(
        markdown.contains(&format!("| {:.1} | {ratio:.2} |", paused.p50_us)),
        "{markdown}"
    );

    // The contended floor ran the same loop, just before S2, with as many clients.
    let floor = t
        .contended_floor
        .as_ref()
        .expect("memory has a contended floor");
    assert_eq!(floor.label, "tokio rwlock");
    let f = &floor.s2;
    assert_eq!(f.clients, 4);
    assert!(f.critical_sections > 0);
    assert_eq!(f.exclusivity_violations, 0);
    assert_eq!(f.max_holders, 1);
    assert_sane(&f.handoff, "contended floor handoff");
    let ratio = s2
        .contended_floor_ratio
        .expect("a contended floor: a ratio");
    assert!(
        (ratio - s2.critical_sections_per_sec / f.critical_sections_per_sec).abs() <= 1e-9,
        "{ratio}"
    );
    assert!(s2.handoff_p99_floor_ratio.is_some_and(|r| r > 0.0));
    assert!(markdown.contains("| memory | tokio rwlock |"), "{markdown}");
    assert_eq!(report.runtime, "multi_thread");
}

#[tokio::test(flavor = "current_thread")]
async fn the_runtime_flavour_is_recorded() {
    let config = small().with_scenarios(distlock_bench::ScenarioSelection::S1);
    let report = distlock_bench::run(&[Target::memory()], &config)
        .await
        .unwrap();
    assert_eq!(report.runtime, "current_thread");
    assert!(
        report
            .to_markdown()
            .contains("- Runtime: tokio current_thread.")
    );
    // S2 not selected: no contended floor either.
    assert!(report.targets[0].contended_floor.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_floor_plumbing() {
    let cycles = Arc::new(AtomicU64::new(0));
    let config = small().with_scenarios(ScenarioSelection::S1);
    let report = distlock_bench::run(&[memory_target_with_floor("fake", cycles.clone())], &config)
        .await
        .unwrap();
    assert!(!report.has_failures(), "{report:#?}");
    let t = &report.targets[0];
    // Warm-up and measured cycles, each exactly once.
    assert_eq!(cycles.load(Ordering::Relaxed), 220);
    let floor = t.floor.as_ref().unwrap();
    assert_eq!(floor.label, "two yields");
    assert_eq!(floor.cycle.count, 200);
    let s1 = t.uncontended.as_ref().unwrap();
    let ratio = s1.floor_ratio.unwrap();
    assert!((ratio - s1.ops_per_sec / floor.ops_per_sec).abs() <= 1e-9 * ratio.max(1.0));
    assert!(t.contended.is_none(), "S2 was not selected");
    assert!(
        floor.paused_cycle.is_none(),
        "the paused floor runs with S2 only"
    );

    // Without instruments that measure CPU time, no CPU figures.
    assert_eq!((s1.cpu_per_cycle_us, floor.cpu_per_cycle_us), (None, None));

    let markdown = report.to_markdown();
    assert!(markdown.contains("| fake | S1 uncontended |"), "{markdown}");
    assert!(markdown.contains("| two yields |"), "{markdown}");
    // Each side's cycle latency, for telling a stall of the client from one of the server.
    let cycle = |side: &str, lat: &distlock_bench::LatencySummary| {
        format!(
            "| fake | {side} | {:.1} | {:.1} | {:.1} |",
            lat.p50_us, lat.p99_us, lat.max_us
        )
    };
    assert!(
        markdown.contains(&cycle("distlock", &s1.cycle)),
        "{markdown}"
    );
    assert!(
        markdown.contains(&cycle("floor: two yields", &floor.cycle)),
        "{markdown}"
    );
    assert!(!markdown.contains("| fake | fenced floor:"), "{markdown}");
    assert!(!markdown.contains("S2 contended"), "{markdown}");
    assert!(!markdown.contains("CPU µs/cycle"), "{markdown}");
}

/// Instruments whose CPU clock advances 1 ms per reading.
#[derive(Debug, Default)]
struct StepCpu(AtomicU64);

impl distlock_bench::Instruments for StepCpu {
    fn cpu_time(&self) -> Option<Duration> {
        Some(Duration::from_millis(
            self.0.fetch_add(1, Ordering::Relaxed),
        ))
    }
}

/// S1 and its floor each get the process's CPU time over their own measured blocks only: a
/// clock read before and after each block (1 ms apart here), so 2 blocks of 100 cycles give
/// 10 µs a cycle on each side, whatever the warm-up read. The Markdown shows them side by side.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cpu_time_is_taken_around_each_sides_blocks() {
    let cycles = Arc::new(AtomicU64::new(0));
    let config = small().with_scenarios(ScenarioSelection::S1);
    assert_eq!(config.cycles, 200);
    let report = distlock_bench::run_with(
        &[memory_target_with_floor("fake", cycles)],
        &config,
        &StepCpu::default(),
    )
    .await
    .unwrap();
    assert!(!report.has_failures(), "{report:#?}");
    let t = &report.targets[0];
    let s1 = t.uncontended.as_ref().unwrap();
    let floor = t.floor.as_ref().unwrap();
    assert_eq!(s1.cpu_per_cycle_us, Some(10.0));
    assert_eq!(floor.cpu_per_cycle_us, Some(10.0));
    let markdown = report.to_markdown();
    assert!(
        markdown.contains("| fake | S1 uncontended | 10.0 | - | 10.0 | 0.0 | - |"),
        "{markdown}"
    );
    assert!(markdown.contains("- CPU µs/cycle:"), "{markdown}");
}

/// The fenced floor runs in the same rotation as S1 and the floor: the same warm-up and
/// measured cycles, and S1 gets a ratio to each; the Markdown puts the fenced floor next to
/// the plain one. Without S1 it does not run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_floor_runs_in_the_rotation_of_s1() {
    let (cycles, tokens) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let counted = tokens.clone();
    let target = memory_target_with_floor("fenced", cycles.clone()).with_fenced_floor(move || {
        let floor = YieldFloor {
            cycles: counted.clone(),
            label: "two yields + a token",
            name: "fenced-floor",
        };
        async move { Ok(Box::new(floor) as Box<dyn RawFloor>) }
    });
    let targets = [target];
    let config = small().with_scenarios(ScenarioSelection::S1);
    let report = distlock_bench::run(&targets, &config).await.unwrap();
    assert!(!report.has_failures(), "{report:#?}");
    assert_eq!(cycles.load(Ordering::Relaxed), 220);
    assert_eq!(tokens.load(Ordering::Relaxed), 220);
    let t = &report.targets[0];
    let fenced = t.fenced_floor.as_ref().unwrap();
    assert_eq!(fenced.label, "two yields + a token");
    assert_eq!(fenced.cycle.count, 200);
    let s1 = t.uncontended.as_ref().unwrap();
    let ratio = s1.fenced_floor_ratio.unwrap();
    assert!((ratio - s1.ops_per_sec / fenced.ops_per_sec).abs() <= 1e-9 * ratio.max(1.0));
    assert!(s1.floor_ratio.is_some());
    let markdown = report.to_markdown();
    assert!(
        markdown.contains("| fenced | S1 uncontended | ")
            && markdown.contains("| two yields + a token |"),
        "{markdown}"
    );
    assert!(markdown.contains("- Fenced floors:"), "{markdown}");
    let lat = &fenced.cycle;
    let row = format!(
        "| fenced | fenced floor: two yields + a token | {:.1} | {:.1} | {:.1} |",
        lat.p50_us, lat.p99_us, lat.max_us
    );
    assert!(markdown.contains(&row), "{markdown}");

    let config = small().with_scenarios(ScenarioSelection::S2);
    let report = distlock_bench::run(&targets, &config).await.unwrap();
    assert!(!report.has_failures(), "{report:#?}");
    assert!(report.targets[0].fenced_floor.is_none(), "{report:#?}");
    assert_eq!(
        tokens.load(Ordering::Relaxed),
        220,
        "the fenced floor ran without S1"
    );
}

/// A floor that says S1 cannot be compared with it.
#[derive(Debug)]
struct UnfitFloor(Arc<AtomicU64>);

#[async_trait]
impl RawFloor for UnfitFloor {
    fn label(&self) -> &str {
        "thread hops"
    }

    async fn cycle(&mut self, _name: &str) -> Result<(), Error> {
        self.0.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn unfit(&self) -> Option<&str> {
        "its cost is the placement of a thread".into()
    }
}

/// Issue 47: SQLite's floor measured slower than distlock in some runs and faster in others.
/// A floor that says it cannot be compared is not run next to S1 nor S2: no floor ratio, and
/// the report says why instead of showing a floor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unfit_floor_is_left_out_with_its_reason() {
    let cycles = Arc::new(AtomicU64::new(0));
    let store = MemoryStore::new();
    let target = Target::new("hops", move || {
        let store = store.clone();
        async move { Ok(store.client()) }
    })
    .with_floor({
        let cycles = cycles.clone();
        move || {
            let cycles = cycles.clone();
            async move { Ok(Box::new(UnfitFloor(cycles)) as Box<dyn RawFloor>) }
        }
    });
    let report = distlock_bench::run(&[target], &small()).await.unwrap();
    assert!(!report.has_failures(), "{report:#?}");
    let t = &report.targets[0];
    assert_eq!(cycles.load(Ordering::Relaxed), 0, "the unfit floor ran");
    assert!(t.floor.is_none());
    assert_eq!(
        t.no_floor.as_deref(),
        Some("its cost is the placement of a thread")
    );
    assert_eq!(t.uncontended.as_ref().unwrap().floor_ratio, None);
    let s2 = t.contended.as_ref().unwrap();
    assert_eq!(
        (s2.floor_ratio, s2.handoff_paused_floor_ratio),
        (None, None)
    );
    let markdown = report.to_markdown();
    assert!(
        markdown.contains("| hops | S1 uncontended |") && markdown.contains("| none (see below) |"),
        "{markdown}"
    );
    assert!(
        markdown.contains("- hops: no floor: its cost is the placement of a thread"),
        "{markdown}"
    );
    assert!(report.to_json().unwrap().contains("\"no_floor\""));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn targets_without_floor_have_no_ratio() {
    let store = MemoryStore::new();
    let target = Target::new("bare", move || {
        let store = store.clone();
        async move { Ok(store.client()) }
    });
    let config = small().with_s1_call(S1Call::Acquire).with_clients(2);
    let report = distlock_bench::run(&[target], &config).await.unwrap();
    assert!(!report.has_failures(), "{report:#?}");
    let t = &report.targets[0];
    assert!(t.floor.is_none());
    let s1 = t.uncontended.as_ref().unwrap();
    assert_eq!(s1.call, S1Call::Acquire);
    assert_eq!(s1.floor_ratio, None);
    let s2 = t.contended.as_ref().unwrap();
    assert_eq!(s2.per_client.len(), 2);
    assert_eq!(s2.exclusivity_violations, 0);
    assert_eq!(s2.floor_ratio, None);
    assert_eq!(s2.handoff_paused_floor_ratio, None);
    assert!(report.to_markdown().contains("| bare | S2 contended |"));
    assert!(t.fenced_floor.is_none() && t.fenced_contended_floor.is_none());
    assert!(!report.to_markdown().contains("Fenced floors"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_reported_and_the_run_goes_on() {
    let broken = Target::new("broken", || async {
        Err::<Arc<dyn distlock_core::DistributedLock>, _>(Error::Unavailable {
            message: "connection refused".into(),
            source: None,
        })
    })
    .with_floor(|| async {
        Err::<Box<dyn RawFloor>, _>(Error::Unsupported("no floor today".into()))
    });
    let config = small().with_duration(Duration::from_millis(100));
    let report = distlock_bench::run(&[broken, Target::memory()], &config)
        .await
        .unwrap();
    assert!(report.has_failures());
    let broken = &report.targets[0];
    let failed: Vec<_> = broken.errors.iter().map(|e| e.scenario.as_str()).collect();
    assert_eq!(
        failed,
        ["floor", "s1", "s2", "rw", "semaphore mutexes", "semaphore"]
    );
    assert!(broken.errors[1].message.contains("connection refused"));
    assert!(broken.uncontended.is_none() && broken.contended.is_none() && broken.backend.is_none());
    let memory = &report.targets[1];
    assert!(memory.errors.is_empty() && memory.uncontended.is_some() && memory.contended.is_some());
    assert!(
        report
            .to_markdown()
            .contains("| broken | s1 | error: backend unavailable: connection refused")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_carries_parameters_and_results() {
    let config = small().with_name_prefix("test-prefix");
    let report: Report = distlock_bench::run(&[Target::memory()], &config)
        .await
        .unwrap();
    let json: serde_json::Value = serde_json::from_str(&report.to_json().unwrap()).unwrap();
    let params = &json["config"];
    assert_eq!(params["cycles"], 200);
    assert_eq!(params["warmup_cycles"], 20);
    assert_eq!(params["clients"], 4);
    assert_eq!(params["ttl_ms"], 10_000.0);
    assert_eq!(params["hold_ms"], 1.0);
    assert_eq!(params["duration_ms"], 300.0);
    assert_eq!(params["scenarios"], "all");
    assert_eq!(params["s1_call"], "try_acquire");
    assert_eq!(params["name_prefix"], "test-prefix");
    let target = &json["targets"][0];
    assert_eq!(target["target"], "memory");
    assert!(target["floor"]["ops_per_sec"].as_f64().unwrap() > 0.0);
    assert!(target["uncontended"]["cycle"]["p99_us"].is_number());
    assert_eq!(target["contended"]["exclusivity_violations"], 0);
    assert!(target["contended"]["handoff_other_share"].is_number());
    assert_eq!(
        target["contended"]["per_client"].as_array().unwrap().len(),
        4
    );
    assert!(json["tool"].as_str().unwrap().starts_with("lock-bench "));
}

#[tokio::test]
async fn invalid_config_is_rejected() {
    for config in [
        small().with_clients(0),
        small().with_cycles(0),
        small().with_duration(Duration::ZERO),
    ] {
        let err = distlock_bench::run(&[Target::memory()], &config)
            .await
            .unwrap_err();
        assert!(matches!(err, Error::InvalidConfig(_)), "{err:?}");
    }
}

#[test]
fn name_prefixes_are_random_per_config() {
    let (a, b) = (BenchConfig::default(), BenchConfig::default());
    assert_ne!(a.name_prefix, b.name_prefix);
    assert!(a.name_prefix.starts_with("lock-bench/"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rw_mix_and_semaphore_stay_within_their_bounds() {
    let config = small()
        .with_scenarios(ScenarioSelection::All)
        .with_mixed_clients(6)
        .with_permits(2)
        .with_write_share(0.2);
    let report = distlock_bench::run(&[Target::memory()], &config)
        .await
        .unwrap();
    assert!(!report.has_failures(), "{report:#?}");
    let t = &report.targets[0];
    assert!(t.skipped.is_empty(), "{:?}", t.skipped);

    let rw = t.rw_mix.as_ref().expect("the RW mix ran");
    assert_eq!(rw.clients, 6);
    assert_eq!(rw.violations, 0);
    assert_eq!(rw.max_writers, Some(1));
    assert!(rw.max_holders >= 2, "readers never overlapped: {rw:?}");
    assert!(rw.exclusive_acquisitions > 0 && rw.exclusive_acquisitions < rw.acquisitions);
    let (shared, exclusive) = (rw.shared_wait.unwrap(), rw.exclusive_wait.unwrap());
    assert_eq!(shared.count + exclusive.count, rw.acquisitions);
    assert_eq!(rw.acquire_wait.count, rw.acquisitions);
    assert_sane(&rw.acquire_wait, "rw acquire");
    assert_eq!(rw.per_client.len(), 6);
    let total: u64 = rw.per_client.iter().map(|c| c.critical_sections).sum();
    assert_eq!(total, rw.acquisitions);

    let sem = t.semaphore.as_ref().expect("the semaphore ran");
    assert_eq!(sem.permits, Some(2));
    assert_eq!(sem.violations, 0);
    assert_eq!(sem.max_holders, 2, "{sem:?}");
    assert_eq!(sem.max_writers, None);
    assert_eq!(sem.exclusive_acquisitions, 0);
    assert!(sem.shared_wait.is_none());
    assert_sane(&sem.acquire_wait, "semaphore acquire");
    // Just before it, as many mutexes as it has permits, side by side, its clients split
    // among them: every name busy, none ever held twice.
    let side = t
        .semaphore_mutexes
        .as_ref()
        .expect("the mutexes side by side ran");
    assert_eq!(
        (side.names, side.clients, side.violations),
        (2, 6, 0),
        "{side:?}"
    );
    assert_eq!(side.per_name.len(), 2);
    assert!(side.per_name.iter().all(|r| *r > 0.0), "{side:?}");
    let sum: f64 = side.per_name.iter().sum();
    assert!(
        (sum - side.critical_sections_per_sec).abs() < 1e-6 * sum.max(1.0),
        "{side:?}"
    );

    let markdown = report.to_markdown();
    // Its row: the semaphore's rate over the side by side's, and theirs over S2's times the
    // permits: numbers, not "-".
    let (row, cells) = side_by_side_row(&markdown, "| memory | 2 | ");
    for ratio in [cells[5], cells[7]] {
        assert!(ratio.parse::<f64>().is_ok_and(|r| r > 0.0), "{row}");
    }
    assert_eq!(cells[8], "0", "{row}");
    assert!(
        markdown.contains("| memory | RW mix (20% exclusive) |"),
        "{markdown}"
    );
    assert!(
        markdown.contains("| memory | semaphore (2 permits) |"),
        "{markdown}"
    );
    assert!(markdown.contains("| 2 (≤ 2) | "), "{markdown}");
    assert!(markdown.contains(" | - | - | 0 |"), "{markdown}");
    // Six clients on two permits keep them in use nearly all the time (the hold's sleep),
    // never more than both.
    assert!(
        (1.5..=2.0).contains(&sem.mean_holders),
        "mean permits in use {}",
        sem.mean_holders
    );
    let rw = report.targets[0].rw_mix.as_ref().expect("rw mix");
    // Writers and readers took turns: both handoffs between the kinds were timed, each
    // within an acquisition's wait, and the table sets them beside S2's handoffs.
    let (to_readers, to_writer) = (
        rw.writer_to_readers.expect("writer to readers"),
        rw.readers_to_writer.expect("readers to writer"),
    );
    assert!(to_readers.count > 0 && to_writer.count > 0, "{rw:?}");
    assert!(to_readers.count <= rw.acquisitions - rw.exclusive_acquisitions);
    assert!(to_writer.count <= rw.exclusive_acquisitions);
    assert_sane(&to_readers, "writer to readers");
    assert_sane(&to_writer, "readers to writer");
    assert!(
        to_writer.max_us <= rw.exclusive_wait.unwrap().max_us + 1000.0,
        "{rw:?}"
    );
    assert!(
        markdown.contains("| target | writer → readers p50"),
        "{markdown}"
    );
    // The handoffs' row has their ratio to two S2 handoffs, and the floor's (the memory
    // floor is a read-write lock) to two of its own: numbers, not "-".
    let row = markdown
        .lines()
        .find(|l| l.starts_with("| memory | ") && l.matches(" (").count() == 2)
        .unwrap_or_else(|| panic!("no handoff row: {markdown}"));
    let cells: Vec<&str> = row.trim_matches('|').split(" | ").map(str::trim).collect();
    assert_eq!(cells.len(), 8, "{row}");
    for ratio in [cells[4], cells[7]] {
        assert!(ratio.parse::<f64>().is_ok_and(|r| r > 0.0), "{row}");
    }
    // The floor's mix ran just before, with as many clients, within the same bounds.
    let floor = report.targets[0]
        .rw_floor
        .as_ref()
        .expect("a read-write floor");
    assert_eq!(floor.label, "tokio rwlock");
    assert_eq!((floor.mix.clients, floor.mix.violations), (rw.clients, 0));
    assert!(
        markdown.contains("| memory | RW mix on the floor: tokio rwlock | "),
        "{markdown}"
    );
    assert_eq!(floor.mix.max_writers, Some(1));
    assert!(floor.mix.exclusive_acquisitions > 0 && floor.mix.max_holders > 1);
    let floor_turns = (
        floor
            .mix
            .writer_to_readers
            .expect("floor: writer to readers"),
        floor
            .mix
            .readers_to_writer
            .expect("floor: readers to writer"),
    );
    assert!(
        floor_turns.0.count > 0 && floor_turns.1.count > 0,
        "{floor:?}"
    );
    assert!(sem.writer_to_readers.is_none() && sem.readers_to_writer.is_none());
    let writers = rw.writer_share.expect("a writer share");
    assert!(writers > 0.0 && writers < 1.0, "{writers}");
    assert!(rw.mean_holders > 0.0, "{}", rw.mean_holders);
    let json: serde_json::Value = serde_json::from_str(&report.to_json().unwrap()).unwrap();
    assert_eq!(json["config"]["permits"], 2);
    assert_eq!(json["targets"][0]["semaphore"]["violations"], 0);
    assert_eq!(json["targets"][0]["semaphore_mutexes"]["names"], 2);
    assert_eq!(json["targets"][0]["rw_mix"]["max_writers"], 1);
}

/// A memory client that declares neither shared locks nor semaphores (`caps` without them),
/// or, with `broken_permits`, whose permits' acquisitions fail.
#[derive(Debug)]
struct ExclusiveOnly {
    inner: Arc<dyn distlock_core::DistributedLock>,
    caps: distlock_core::Capabilities,
    broken_permits: bool,
}

impl ExclusiveOnly {
    /// A target of such clients on one memory store: exclusive-only ones, or with
    /// `broken_permits` ones that declare every kind but fail permits.
    fn target(label: &'static str, broken_permits: bool) -> Target {
        let store = MemoryStore::new();
        Target::new(label, move || {
            let inner = store.client();
            let caps = if broken_permits {
                inner.capabilities().clone()
            } else {
                distlock_core::Capabilities::new(inner.capabilities().fencing)
            };
            let client = Self {
                inner,
                caps,
                broken_permits,
            };
            async move { Ok(Arc::new(client) as Arc<dyn distlock_core::DistributedLock>) }
        })
    }
}

#[async_trait]
impl distlock_core::DistributedLock for ExclusiveOnly {
    fn backend(&self) -> &'static str {
        if self.broken_permits {
            "broken-permits"
        } else {
            "exclusive-only"
        }
    }

    fn capabilities(&self) -> &distlock_core::Capabilities {
        &self.caps
    }

    async fn try_acquire(
        &self,
        name: &str,
        options: &distlock_core::AcquireOptions,
    ) -> Result<Option<distlock_core::LockGuard>, Error> {
        self.inner.try_acquire(name, options).await
    }

    async fn acquire(
        &self,
        name: &str,
        options: &distlock_core::AcquireOptions,
    ) -> Result<distlock_core::LockGuard, Error> {
        if self.broken_permits && matches!(options.kind, LockKind::Permit { .. }) {
            return Err(Error::Backend {
                message: "permits broken on purpose".into(),
                source: None,
            });
        }
        self.inner.acquire(name, options).await
    }

    async fn campaign(
        &self,
        name: &str,
        value: &str,
        options: &distlock_core::AcquireOptions,
    ) -> Result<distlock_core::LockGuard, Error> {
        self.inner.campaign(name, value, options).await
    }

    fn observe(
        &self,
        name: &str,
        every: Duration,
    ) -> futures::stream::BoxStream<'static, Result<Option<distlock_core::Leader>, Error>> {
        self.inner.observe(name, every)
    }

    async fn inspect(&self, name: &str) -> Result<Option<distlock_core::LockInfo>, Error> {
        self.inner.inspect(name).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenarios_a_backend_cannot_run_are_skipped_with_the_reason() {
    let target = ExclusiveOnly::target("plain", false);
    let config = small().with_scenarios(ScenarioSelection::All);
    let report = distlock_bench::run(&[target], &config).await.unwrap();
    assert!(!report.has_failures(), "{report:#?}");
    let t = &report.targets[0];
    assert!(t.contended.is_some() && t.rw_mix.is_none() && t.semaphore.is_none());
    assert!(
        t.semaphore_mutexes.is_none() && t.errors.is_empty(),
        "{t:?}"
    );
    let skipped: Vec<_> = t.skipped.iter().map(|s| s.scenario.as_str()).collect();
    assert_eq!(skipped, ["rw", "semaphore"]);
    assert!(
        t.skipped[0].reason.contains("no shared (read) locks"),
        "{:?}",
        t.skipped
    );
    assert!(
        t.skipped[1].reason.contains("no semaphores"),
        "{:?}",
        t.skipped
    );
    let markdown = report.to_markdown();
    assert!(
        markdown.contains("| plain | rw | skipped: the exclusive-only backend has no shared"),
        "{markdown}"
    );
}

/// The mutexes side by side keep their row when the semaphore after them fails, so that their
/// figures and violations always show.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mutexes_side_by_side_show_when_the_semaphore_fails() {
    let target = ExclusiveOnly::target("broken", true);
    let config = small().with_scenarios(ScenarioSelection::Semaphore);
    let report = distlock_bench::run(&[target], &config).await.unwrap();
    let t = &report.targets[0];
    let failed: Vec<_> = t.errors.iter().map(|e| e.scenario.as_str()).collect();
    assert_eq!(failed, ["semaphore"], "{t:?}");
    assert!(t.semaphore.is_none());
    let side = t
        .semaphore_mutexes
        .as_ref()
        .expect("the mutexes side by side ran");
    assert!(
        side.critical_sections > 0 && side.violations == 0,
        "{side:?}"
    );
    let markdown = report.to_markdown();
    let (row, cells) = side_by_side_row(&markdown, "| broken | 3 | ");
    // No semaphore: its rate, permits in use and ratio are "-"; the mutexes' rate is there.
    assert_eq!((cells[2], cells[3], cells[5]), ("-", "-", "-"), "{row}");
    assert!(cells[4].starts_with(|c: char| c.is_ascii_digit()), "{row}");
    assert_eq!(cells[8], "0", "{row}");
}
