//! The growth curves (issue 22): how distlock's cost grows with the number of held locks
//! (hold-K), of contending clients (clients-C) and of names (names).
//!
//! - **hold-K**: one client acquires K distinct names (renewal on, lease
//!   [`BenchConfig::hold_ttl`]) with [`BenchConfig::hold_concurrency`] acquisitions in flight,
//!   holds them for [`BenchConfig::hold_window`], then releases them. Over the window: the
//!   server's requests per renewal tick (its own counter, [`ServerCounter`], read before and
//!   after, minus the reads' own cost and minus the idle background measured once per target
//!   over a window as long with no lock held), the process's CPU time as a percentage of one
//!   core, and the live heap bytes per held guard ([`Instruments`]). Locks lost during the
//!   hold are counted (must be 0).
//! - **clients-C**: S2's loop ([`crate::contended`]) once per client count.
//! - **names**: [`BenchConfig::names_clients`] clients each acquiring a name picked at random
//!   among [`BenchConfig::names`] (waiting if another client holds it), holding it for
//!   [`BenchConfig::hold`], releasing it; next to as many raw floor connections running
//!   [`RawFloor::cycle`] the same way just before (each on its own share of the names, since
//!   a raw floor cycle cannot wait), so the ratio compares like with like.

use std::fmt;
use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use distlock_core::{AcquireOptions, DistributedLock, Error, LockGuard};
use futures::StreamExt as _;
use serde::Serialize;

use crate::report::{S2Result, ScenarioError};
use crate::stats::{Progress, Recorder, rate};
use crate::{BenchConfig, LatencySummary, RawFloor, Target};

/// A server's own count of the requests it served (all clients together), read by the hold
/// scenario before and after its window: Redis `total_reads_processed`, PostgreSQL
/// `pg_stat_database.xact_commit`, MySQL `Questions`, etcd's gRPC counters, ZooKeeper's
/// `zk_packets_received`.
#[async_trait]
pub trait ServerCounter: Send + fmt::Debug {
    /// What is counted, for the report, e.g. `"Redis INFO stats total_reads_processed"`.
    fn label(&self) -> &str;

    /// The counter's current value.
    ///
    /// # Errors
    /// Whatever the server answered; the hold scenario then reports no request counts.
    async fn read(&mut self) -> Result<u64, Error>;

    /// How late the counter may count a request (a server that publishes its counts in
    /// batches): the hold scenario waits at least this long after acquiring K locks before its
    /// window starts, so that the acquisitions are not counted as renewals.
    fn settle(&self) -> Duration {
        Duration::ZERO
    }
}

/// The measuring process's own instruments, supplied by the binary so that the harness stays
/// allocator- and platform-agnostic, and its progress display. Every method has a default
/// that measures or shows nothing ([`NoInstruments`]).
pub trait Instruments: Send + Sync + fmt::Debug {
    /// Bytes currently allocated on the heap by the whole process (a counting global
    /// allocator), or `None` if not known.
    fn live_heap_bytes(&self) -> Option<u64> {
        None
    }

    /// CPU time (user + system) the process has used so far, or `None` if not known.
    fn cpu_time(&self) -> Option<Duration> {
        None
    }

    /// The run has `phases` growth phases in all (called once, before the first).
    fn begin(&self, phases: u64) {
        let _ = phases;
    }

    /// A new phase starts (the previous one is done).
    fn phase(&self, label: &str) {
        let _ = label;
    }

    /// Progress within the current phase.
    fn detail(&self, text: &str) {
        let _ = text;
    }

    /// Every phase is done.
    fn finish(&self) {}
}

/// [`Instruments`] that measure and show nothing.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoInstruments;

impl Instruments for NoInstruments {}

/// The growth scenarios of one target.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[non_exhaustive]
pub struct GrowthResult {
    /// What the server counter counts, when the target has one.
    pub server_counter: Option<String>,
    /// The idle background, when the target has a server counter and hold ran.
    pub idle: Option<IdleWindow>,
    /// Hold-K, one entry per K.
    pub hold: Vec<HoldPoint>,
    /// Clients-C, one entry per C.
    pub clients: Vec<ClientsPoint>,
    /// Names.
    pub names: Option<NamesResult>,
    /// Churn.
    pub churn: Option<crate::ChurnResult>,
}

/// The server's requests over a window as long as the hold window, with no lock held by this
/// process (other clients of a shared server, its own housekeeping).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct IdleWindow {
    /// The window.
    pub window_ms: f64,
    /// Requests one pair of counter reads adds by itself, subtracted from every delta.
    pub read_cost: u64,
    /// Requests counted over the window, less the reads' cost.
    pub requests: u64,
    /// `requests` per renewal tick.
    pub per_tick: f64,
}

/// Hold-K for one K.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct HoldPoint {
    /// K: locks held at once.
    pub locks: usize,
    /// Time to acquire all K.
    pub acquire_ms: f64,
    /// Time to release all K.
    pub release_ms: f64,
    /// The measured window (all K held).
    pub window_ms: f64,
    /// Renewal ticks (ttl / 3) in the window.
    pub ticks: f64,
    /// Server requests over the window, less the reads' cost (idle not subtracted); `None`
    /// without a server counter.
    pub server_requests: Option<u64>,
    /// `server_requests` per tick, less the idle background per tick (at least 0).
    pub requests_per_tick: Option<f64>,
    /// `requests_per_tick / locks`.
    pub requests_per_tick_per_lock: Option<f64>,
    /// CPU time of the process over the window, as a percentage of one core.
    pub cpu_percent: Option<f64>,
    /// Live heap bytes at the end of the measured window (every lock held a renewal tick and
    /// more) minus before acquiring, divided by K.
    pub heap_bytes_per_guard: Option<f64>,
    /// Guards that reported a loss by the end of the window (must be 0).
    pub lost: u64,
}

/// Clients-C for one C: S2 with C clients.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct ClientsPoint {
    /// C.
    pub clients: usize,
    /// Critical sections per second.
    pub critical_sections_per_sec: f64,
    /// Handoff to another client, median.
    pub handoff_p50_us: f64,
    /// Handoff to another client, 99th percentile.
    pub handoff_p99_us: f64,
    /// The longest single acquire.
    pub longest_wait_us: f64,
    /// The smallest client share ÷ the fair share 1/C (1 = perfectly fair).
    pub min_share_of_fair: f64,
    /// The largest client share ÷ the fair share 1/C.
    pub max_share_of_fair: f64,
    /// Everything S2 measured.
    pub s2: S2Result,
}

/// Names: clients on many names picked at random, next to the raw floor.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct NamesResult {
    /// Names picked from.
    pub names: usize,
    /// Clients (and floor connections).
    pub clients: usize,
    /// Acquisitions returned inside the window.
    pub acquisitions: u64,
    /// Acquisitions per second.
    pub acquisitions_per_sec: f64,
    /// Duration of every acquire call in the window.
    pub acquire_wait: LatencySummary,
    /// Guards lost (must be 0).
    pub lost: u64,
    /// The raw floor's label, when the target has one.
    pub floor_label: Option<String>,
    /// Floor cycles per second (same clients, names, hold and window).
    pub floor_cycles_per_sec: Option<f64>,
    /// `acquisitions_per_sec / floor_cycles_per_sec`.
    pub floor_ratio: Option<f64>,
}

/// The number of progress phases `config` gives one target.
pub(crate) fn phases(config: &BenchConfig, has_counter: bool) -> u64 {
    let mut n = 0;
    if config.scenarios.hold() {
        n += config.hold_counts.len() as u64 + u64::from(has_counter);
    }
    if config.scenarios.clients() {
        n += config.client_counts.len() as u64;
    }
    if config.scenarios.names() {
        n += 2;
    }
    if config.scenarios.churn() {
        n += 1 + u64::from(!config.churn_settle.is_zero());
    }
    n
}

/// Runs the selected growth scenarios on `target`; failures go to `errors`.
pub(crate) async fn run_target(
    target: &Target,
    config: &BenchConfig,
    instruments: &dyn Instruments,
    base: &str,
    backend: &mut Option<String>,
    errors: &mut Vec<ScenarioError>,
) -> GrowthResult {
    let mut result = GrowthResult::default();
    let label = target.label();
    if config.scenarios.hold() {
        let mut counter = match target.server_counter().await {
            Ok(counter) => counter,
            Err(e) => {
                errors.push(ScenarioError::new("hold counter", &e));
                None
            }
        };
        result.server_counter = counter.as_ref().map(|c| c.label().to_owned());
        let hold_base = format!("{base}/hold");
        let hold = hold(
            target,
            config,
            instruments,
            counter.as_deref_mut(),
            &hold_base,
            backend,
            &mut result,
        );
        if let Err(e) = hold.await {
            errors.push(ScenarioError::new("hold", &e));
        }
    }
    if config.scenarios.clients() {
        for &count in &config.client_counts {
            instruments.phase(&format!("{label} clients C={count}"));
            let measured = async {
                let clients = crate::connect(target, count, backend).await?;
                let config = config.clone().with_clients(count);
                let name = format!("{base}/clients/{count}");
                let progress = Progress::new(config.progress, label, &format!("clients {count}"));
                crate::contended::run_s2(clients, name, &config, progress).await
            };
            match measured.await {
                Ok(s2) => result.clients.push(clients_point(count, s2)),
                Err(e) => errors.push(ScenarioError::new(&format!("clients {count}"), &e)),
            }
        }
    }
    if config.scenarios.names() {
        match names(
            target,
            config,
            instruments,
            &format!("{base}/names"),
            backend,
        )
        .await
        {
            Ok(names) => result.names = Some(names),
            Err(e) => errors.push(ScenarioError::new("names", &e)),
        }
    }
    if config.scenarios.churn() {
        let base = format!("{base}/churn");
        match crate::churn::churn(target, config, instruments, &base, backend).await {
            Ok(churn) => result.churn = Some(churn),
            Err(e) => errors.push(ScenarioError::new("churn", &e)),
        }
    }
    result
}

fn clients_point(count: usize, s2: S2Result) -> ClientsPoint {
    let fair = 1.0 / count as f64;
    let shares = s2.per_client.iter().map(|c| c.share / fair);
    let min = shares.clone().fold(f64::INFINITY, f64::min);
    let max = shares.fold(0.0, f64::max);
    ClientsPoint {
        clients: count,
        critical_sections_per_sec: s2.critical_sections_per_sec,
        handoff_p50_us: s2.handoff.p50_us,
        handoff_p99_us: s2.handoff.p99_us,
        longest_wait_us: s2.longest_wait_us,
        min_share_of_fair: if min.is_finite() { min } else { 0.0 },
        max_share_of_fair: max,
        s2,
    }
}

/// Two back-to-back reads: what reading costs in the counter itself.
async fn read_cost(counter: &mut dyn ServerCounter) -> Result<u64, Error> {
    let a = counter.read().await?;
    let b = counter.read().await?;
    Ok(b.saturating_sub(a))
}

/// Sleeps `window`, showing the time left.
async fn wait_window(window: Duration, what: &str, instruments: &dyn Instruments) {
    let start = Instant::now();
    let end = start + window;
    loop {
        let now = Instant::now();
        if now >= end {
            break;
        }
        instruments.detail(&format!(
            "{what}: {:.0}s / {:.0}s",
            (now - start).as_secs_f64(),
            window.as_secs_f64()
        ));
        tokio::time::sleep((end - now).min(Duration::from_millis(500))).await;
    }
}

async fn hold(
    target: &Target,
    config: &BenchConfig,
    instruments: &dyn Instruments,
    mut counter: Option<&mut (dyn ServerCounter + '_)>,
    base: &str,
    backend: &mut Option<String>,
    result: &mut GrowthResult,
) -> Result<(), Error> {
    let label = target.label();
    let window = config.hold_window();
    let ticks = window.as_secs_f64() / config.renewal_tick().as_secs_f64();
    let client = target.connect().await?;
    *backend = Some(client.backend().to_owned());

    let mut cost = 0;
    if let Some(counter) = counter.as_deref_mut() {
        instruments.phase(&format!("{label} hold: idle window"));
        cost = read_cost(counter).await?;
        let before = counter.read().await?;
        wait_window(window, "idle, no lock held", instruments).await;
        let after = counter.read().await?;
        let requests = after.saturating_sub(before).saturating_sub(cost);
        result.idle = Some(IdleWindow {
            window_ms: window.as_secs_f64() * 1000.0,
            read_cost: cost,
            requests,
            per_tick: requests as f64 / ticks,
        });
    }
    let idle_per_tick = result.idle.as_ref().map_or(0.0, |i| i.per_tick);

    let options = AcquireOptions::default()
        .with_ttl(config.hold_ttl)
        .with_wait(config.acquire_wait);
    for &k in &config.hold_counts {
        instruments.phase(&format!("{label} hold K={k}"));
        let heap_before = instruments.live_heap_bytes();
        let started = Instant::now();
        let guards = acquire_many(
            &*client,
            &format!("{base}/{k}"),
            k,
            &options,
            config,
            instruments,
        )
        .await?;
        let acquire_ms = started.elapsed().as_secs_f64() * 1000.0;
        // The window measures the steady state: one renewal tick first, in which the locks'
        // schedules align and what the acquisitions left behind lands (a ZooKeeper loss watch
        // is set a tenth of the ttl after its acquisition; PostgreSQL publishes an idle
        // connection's counts up to 10 s late).
        let settle = counter
            .as_deref()
            .map_or(Duration::ZERO, ServerCounter::settle)
            .max(config.renewal_tick());
        wait_window(settle, &format!("settling with {k} locks"), instruments).await;

        let counted_before = match counter.as_deref_mut() {
            Some(c) => Some(c.read().await?),
            None => None,
        };
        let cpu_before = instruments.cpu_time();
        let window_start = Instant::now();
        wait_window(window, &format!("holding {k} locks"), instruments).await;
        let held_for = window_start.elapsed();
        let cpu_after = instruments.cpu_time();
        // The heap of the steady state: after a renewal tick and the window, when every loss
        // watch is set and renewal has run.
        let heap_after = instruments.live_heap_bytes();
        let counted_after = match counter.as_deref_mut() {
            Some(c) => Some(c.read().await?),
            None => None,
        };
        let lost = guards.iter().filter(|g| g.is_lost()).count() as u64;

        instruments.detail(&format!("releasing {k} locks"));
        let started = Instant::now();
        // Losses after the window (while releasing) count too.
        let lost_at_release = release_many(guards, config.hold_concurrency).await?;
        let lost = lost.max(lost_at_release);
        let release_ms = started.elapsed().as_secs_f64() * 1000.0;

        let ticks = held_for.as_secs_f64() / config.renewal_tick().as_secs_f64();
        let server_requests = counted_before
            .zip(counted_after)
            .map(|(b, a)| a.saturating_sub(b).saturating_sub(cost));
        let requests_per_tick =
            server_requests.map(|r| (r as f64 / ticks - idle_per_tick).max(0.0));
        let cpu_percent = cpu_before
            .zip(cpu_after)
            .map(|(b, a)| a.saturating_sub(b).as_secs_f64() / held_for.as_secs_f64() * 100.0);
        let heap_bytes_per_guard = heap_before
            .zip(heap_after)
            .map(|(b, a)| (a as f64 - b as f64) / k as f64);
        result.hold.push(HoldPoint {
            locks: k,
            acquire_ms,
            release_ms,
            window_ms: held_for.as_secs_f64() * 1000.0,
            ticks,
            server_requests,
            requests_per_tick,
            requests_per_tick_per_lock: requests_per_tick.map(|r| r / k as f64),
            cpu_percent,
            heap_bytes_per_guard,
            lost,
        });
    }
    Ok(())
}

/// Acquires `{base}/{i}` for every i below `count`, `config.hold_concurrency` at a time.
async fn acquire_many(
    client: &dyn DistributedLock,
    base: &str,
    count: usize,
    options: &AcquireOptions,
    config: &BenchConfig,
    instruments: &dyn Instruments,
) -> Result<Vec<LockGuard>, Error> {
    let names: Vec<String> = (0..count).map(|i| format!("{base}/{i}")).collect();
    let mut guards = Vec::with_capacity(count);
    let mut pending = futures::stream::iter(names.iter())
        .map(|name| client.acquire(name, options))
        .buffer_unordered(config.hold_concurrency);
    let mut shown = Instant::now();
    while let Some(guard) = pending.next().await {
        guards.push(guard?);
        if shown.elapsed() >= Duration::from_millis(250) {
            shown = Instant::now();
            instruments.detail(&format!("acquired {} / {count}", guards.len()));
        }
    }
    Ok(guards)
}

/// Releases every guard, `concurrency` at a time. Returns how many turned out lost (a lost
/// guard's release reports [`Error::Lost`]); any other error is returned once all ran.
async fn release_many(guards: Vec<LockGuard>, concurrency: usize) -> Result<u64, Error> {
    let outcomes: Vec<_> = futures::stream::iter(guards)
        .map(LockGuard::release)
        .buffer_unordered(concurrency)
        .collect()
        .await;
    let mut lost = 0;
    let mut first = None;
    for outcome in outcomes {
        match outcome {
            Ok(()) => {}
            Err(Error::Lost { .. }) => lost += 1,
            Err(e) => {
                first.get_or_insert(e);
            }
        }
    }
    first.map_or(Ok(lost), Err)
}

/// A small, fast generator (SplitMix64) for name picks: no cryptographic need.
struct Pick(u64);

impl Pick {
    fn new(client: usize) -> Self {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        Self(u64::from(nanos) ^ (client as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15))
    }

    /// A number below `bound` (which is at least 1).
    fn below(&mut self, bound: usize) -> usize {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z % bound.max(1) as u64) as usize
    }
}

/// What every names loop shares: the window and the count measured so far.
struct Window {
    measure_from: Instant,
    measure_until: Instant,
    measured: AtomicU64,
    stop: AtomicBool,
}

impl Window {
    fn new(config: &BenchConfig) -> Arc<Self> {
        let measure_from = Instant::now() + config.s2_warmup;
        Arc::new(Self {
            measure_from,
            measure_until: measure_from + config.duration,
            measured: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        })
    }

    fn running(&self) -> bool {
        !self.stop.load(Ordering::Relaxed) && Instant::now() < self.measure_until
    }

    fn inside(&self, at: Instant) -> bool {
        at >= self.measure_from && at < self.measure_until
    }
}

/// Waits for every task, showing progress; the first error (by task) is returned.
async fn join<T: Send + 'static>(
    handles: Vec<tokio::task::JoinHandle<Result<T, Error>>>,
    window: &Window,
    config: &BenchConfig,
    instruments: &dyn Instruments,
    what: &str,
) -> Result<Vec<T>, Error> {
    let deadline = window.measure_until + config.acquire_wait + config.ttl + Duration::from_secs(5);
    let aborts: Vec<_> = handles
        .iter()
        .map(tokio::task::JoinHandle::abort_handle)
        .collect();
    let mut joined = std::pin::pin!(futures::future::join_all(handles));
    let outcomes = loop {
        if Instant::now() >= deadline {
            aborts.iter().for_each(tokio::task::AbortHandle::abort);
            return Err(Error::Backend {
                message: format!("{what} did not finish in time"),
                source: None,
            });
        }
        match tokio::time::timeout(Duration::from_millis(250), joined.as_mut()).await {
            Ok(outcomes) => break outcomes,
            Err(_) => instruments.detail(&format!(
                "{what}: {} measured",
                window.measured.load(Ordering::Relaxed)
            )),
        }
    };
    let mut values = Vec::with_capacity(outcomes.len());
    for outcome in outcomes {
        match outcome {
            Ok(Ok(value)) => values.push(value),
            Ok(Err(e)) => return Err(e),
            Err(join) => {
                return Err(Error::Backend {
                    message: format!("a {what} task failed: {join}"),
                    source: None,
                });
            }
        }
    }
    Ok(values)
}

async fn names(
    target: &Target,
    config: &BenchConfig,
    instruments: &dyn Instruments,
    base: &str,
    backend: &mut Option<String>,
) -> Result<NamesResult, Error> {
    let label = target.label();
    let count = config.names_clients;
    let all: Arc<Vec<String>> =
        Arc::new((0..config.names).map(|i| format!("{base}/{i}")).collect());

    // The raw floor first: each connection on the names i with i % count == its index, so that
    // no two floor cycles ever meet on one name (a raw cycle cannot wait).
    instruments.phase(&format!("{label} names: raw floor"));
    let mut floors = Vec::with_capacity(count);
    if target.has_floor() {
        for _ in 0..count {
            floors.extend(target.floor().await?);
        }
    }
    let (floor_label, floor_cycles_per_sec) = if floors.is_empty() {
        (None, None)
    } else {
        let label = floors.first().map(|f| f.label().to_owned());
        let window = Window::new(config);
        let handles = floors
            .into_iter()
            .enumerate()
            .map(|(id, floor)| {
                let own: Vec<String> = all.iter().skip(id).step_by(count).cloned().collect();
                tokio::spawn(floor_loop(id, floor, own, window.clone(), config.hold))
            })
            .collect();
        let cycles: u64 = join(handles, &window, config, instruments, "names floor")
            .await?
            .into_iter()
            .sum();
        (label, Some(rate(cycles, config.duration)))
    };

    instruments.phase(&format!("{label} names: {count} clients"));
    let clients = crate::connect(target, count, backend).await?;
    let window = Window::new(config);
    let options = AcquireOptions::default()
        .with_ttl(config.ttl)
        .with_wait(config.acquire_wait);
    let handles = clients
        .into_iter()
        .enumerate()
        .map(|(id, client)| {
            let loop_ = names_loop(
                id,
                client,
                all.clone(),
                window.clone(),
                options.clone(),
                config.hold,
            );
            tokio::spawn(loop_)
        })
        .collect();
    let outcomes = join(handles, &window, config, instruments, "names").await?;
    let mut wait = Recorder::new();
    let (mut acquisitions, mut lost) = (0, 0);
    for (n, l, w) in outcomes {
        acquisitions += n;
        lost += l;
        wait.merge(&w);
    }
    let acquisitions_per_sec = rate(acquisitions, config.duration);
    Ok(NamesResult {
        names: config.names,
        clients: count,
        acquisitions,
        acquisitions_per_sec,
        acquire_wait: wait.summary(),
        lost,
        floor_label,
        floor_cycles_per_sec,
        floor_ratio: floor_cycles_per_sec
            .filter(|f| *f > 0.0)
            .map(|f| acquisitions_per_sec / f),
    })
}

async fn floor_loop(
    id: usize,
    mut floor: Box<dyn RawFloor>,
    names: Vec<String>,
    window: Arc<Window>,
    hold: Duration,
) -> Result<u64, Error> {
    let mut pick = Pick::new(id);
    let mut cycles = 0;
    if names.is_empty() {
        return Ok(0);
    }
    while window.running() {
        let name = &names[pick.below(names.len())];
        if let Err(e) = floor.cycle(name).await {
            window.stop.store(true, Ordering::Relaxed);
            return Err(e);
        }
        if window.inside(Instant::now()) {
            cycles += 1;
            window.measured.fetch_add(1, Ordering::Relaxed);
        }
        tokio::time::sleep(hold).await;
    }
    Ok(cycles)
}

async fn names_loop(
    id: usize,
    client: Arc<dyn DistributedLock>,
    names: Arc<Vec<String>>,
    window: Arc<Window>,
    options: AcquireOptions,
    hold: Duration,
) -> Result<(u64, u64, Recorder), Error> {
    let mut pick = Pick::new(id);
    let (mut acquisitions, mut lost) = (0, 0);
    let mut wait = Recorder::new();
    while window.running() {
        let name = &names[pick.below(names.len())];
        let asked = Instant::now();
        let guard = match client.acquire(name, &options).await {
            Ok(guard) => guard,
            Err(e) => {
                window.stop.store(true, Ordering::Relaxed);
                return Err(e);
            }
        };
        let acquired = Instant::now();
        if window.inside(acquired) {
            acquisitions += 1;
            window.measured.fetch_add(1, Ordering::Relaxed);
            wait.record(acquired - asked);
        }
        tokio::time::sleep(hold).await;
        if guard.is_lost() {
            lost += 1;
        }
        if let Err(e) = guard.release().await {
            window.stop.store(true, Ordering::Relaxed);
            return Err(e);
        }
    }
    Ok((acquisitions, lost, wait))
}

fn opt(value: Option<f64>, digits: usize) -> String {
    value.map_or_else(|| "n/a".to_owned(), |v| format!("{v:.digits$}"))
}

/// The growth tables of every target that ran a growth scenario.
pub(crate) fn markdown(report: &crate::Report) -> String {
    let mut out = String::new();
    let c = &report.config;
    let targets: Vec<_> = report
        .targets
        .iter()
        .filter_map(|t| t.growth.as_ref().map(|g| (t, g)))
        .collect();
    if targets.iter().any(|(_, g)| !g.hold.is_empty()) {
        let _ = writeln!(
            out,
            "\n### Hold-K: one client holding K locks (ttl {}, renewal tick {}, window {}, {} acquisitions in flight)\n",
            humantime::format_duration(c.hold_ttl),
            humantime::format_duration(c.renewal_tick()),
            humantime::format_duration(c.hold_window()),
            c.hold_concurrency
        );
        out.push_str("| target | K | server requests / tick | per lock | idle / tick | CPU % of a core | heap bytes / guard | lost | acquire all ms | release all ms | server counter |\n");
        out.push_str("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|\n");
        for (t, g) in &targets {
            let idle = g.idle.as_ref().map(|i| i.per_tick);
            let counter = g
                .server_counter
                .as_deref()
                .unwrap_or("n/a (no server counter)");
            for h in &g.hold {
                let lost = if h.lost > 0 {
                    format!("**{}**", h.lost)
                } else {
                    "0".to_owned()
                };
                let _ = writeln!(
                    out,
                    "| {} | {} | {} | {} | {} | {} | {} | {lost} | {:.0} | {:.0} | {counter} |",
                    t.target,
                    h.locks,
                    opt(h.requests_per_tick, 1),
                    opt(h.requests_per_tick_per_lock, 2),
                    opt(idle, 1),
                    opt(h.cpu_percent, 2),
                    opt(h.heap_bytes_per_guard, 0),
                    h.acquire_ms,
                    h.release_ms,
                );
            }
        }
    }
    if targets.iter().any(|(_, g)| !g.clients.is_empty()) {
        let _ = writeln!(
            out,
            "\n### Clients-C: C clients on one name (S2's loop, hold {}, measured {} after {} warm-up)\n",
            humantime::format_duration(c.hold),
            humantime::format_duration(c.duration),
            humantime::format_duration(c.s2_warmup)
        );
        out.push_str("| target | C | critical sections/s | handoff p50 ms | handoff p99 ms | longest wait ms | min share ÷ fair | max share ÷ fair | violations |\n");
        out.push_str("|---|--:|--:|--:|--:|--:|--:|--:|--:|\n");
        for (t, g) in &targets {
            for p in &g.clients {
                let _ = writeln!(
                    out,
                    "| {} | {} | {:.0} | {:.2} | {:.2} | {:.1} | {:.2} | {:.2} | {} |",
                    t.target,
                    p.clients,
                    p.critical_sections_per_sec,
                    p.handoff_p50_us / 1000.0,
                    p.handoff_p99_us / 1000.0,
                    p.longest_wait_us / 1000.0,
                    p.min_share_of_fair,
                    p.max_share_of_fair,
                    p.s2.exclusivity_violations
                );
            }
        }
    }
    if targets.iter().any(|(_, g)| g.names.is_some()) {
        let _ = writeln!(
            out,
            "\n### Names: {} clients, each acquisition on one of {} names picked at random (hold {}, measured {} after {} warm-up)\n",
            c.names_clients,
            c.names,
            humantime::format_duration(c.hold),
            humantime::format_duration(c.duration),
            humantime::format_duration(c.s2_warmup)
        );
        out.push_str("| target | acquisitions/s | acquire p50 µs | acquire p99 µs | lost | floor | floor cycles/s | ratio |\n");
        out.push_str("|---|--:|--:|--:|--:|---|--:|--:|\n");
        for (t, g) in &targets {
            if let Some(n) = &g.names {
                let _ = writeln!(
                    out,
                    "| {} | {:.0} | {:.1} | {:.1} | {} | {} | {} | {} |",
                    t.target,
                    n.acquisitions_per_sec,
                    n.acquire_wait.p50_us,
                    n.acquire_wait.p99_us,
                    n.lost,
                    n.floor_label.as_deref().unwrap_or("-"),
                    opt(n.floor_cycles_per_sec, 0),
                    opt(n.floor_ratio, 3),
                );
            }
        }
        out.push_str("\nThe floor: the backend's raw acquire + release on the same names, with the same clients (one connection each) and the same hold between cycles, measured just before; each floor connection picks among its own share of the names, since a raw cycle cannot wait for a name another holds.\n");
    }
    out.push_str(&crate::churn::markdown(report));
    out
}
