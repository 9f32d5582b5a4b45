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
//! - **clients-C**: S2's loop ([`crate::contended`]) once per client count for the mutex,
//!   the read/write mix and the semaphore scenario ([`crate::mixed`]) for the read-write
//!   lock and the semaphore.
//!
//! Hold-K and clients-C measure each primitive of [`BenchConfig::growth_kinds`] the backend
//! has (hold-K of a read-write lock: a read hold on each of K names; of a semaphore: one
//! permit of each of K names).
//! - **names**: [`BenchConfig::names_clients`] clients each acquiring a name picked at random
//!   among [`BenchConfig::names`] (waiting if another client holds it), holding it for
//!   [`BenchConfig::hold`], releasing it; next to as many raw floor connections running
//!   [`RawFloor::cycle`] the same way just before (each on its own share of the names, since
//!   a raw floor cycle cannot wait), so the ratio compares like with like. Then the same for
//!   each other primitive of [`BenchConfig::growth_kinds`] the backend has, with no floor (a
//!   raw floor is a mutex's): the read/write mix (its share of writers) on each name, one
//!   permit of a semaphore per name. Beside clients-C of the same primitive with as many
//!   clients on one name, it says how near one name comes to independent ones: issue 44's
//!   readers that "scale like independent locks".

use std::fmt;
use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use distlock_core::{AcquireOptions, DistributedLock, Error, LockGuard};
use futures::StreamExt as _;
use serde::Serialize;

use crate::mixed::Mix;
use crate::report::{MixedResult, S2Result, ScenarioError, Skipped};
use crate::stats::{Progress, Recorder, rate};
use crate::{BenchConfig, GrowthKind, LatencySummary, RawFloor, Target};

mod hold;
mod names;
mod table;

use hold::hold;
use names::{Named, names, names_kinds, names_scenario};
pub(crate) use table::markdown;

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
    /// Clients-C of the mutex, one entry per C.
    pub clients: Vec<ClientsPoint>,
    /// Clients-C of the read-write lock and the semaphore, one entry per primitive and C.
    pub mixed_clients: Vec<MixedClientsPoint>,
    /// Names of the mutex.
    pub names: Option<NamesResult>,
    /// Names of the read-write lock and the semaphore, one entry per primitive.
    pub names_mixed: Vec<NamesResult>,
    /// Churn.
    pub churn: Option<crate::ChurnResult>,
}

impl GrowthResult {
    /// Names of every primitive that ran: the mutex's first.
    pub(crate) fn every_names(&self) -> impl Iterator<Item = &NamesResult> {
        self.names.iter().chain(&self.names_mixed)
    }
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
    /// The primitive held.
    pub kind: GrowthKind,
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
    /// Guards that reported a loss by the end of the window, or whose release found them no
    /// longer held (must be 0).
    pub lost: u64,
    /// The losses reported by the end of the window, by [`LossReason`](distlock_core::LossReason)
    /// (its variant's name): why they were lost.
    pub loss_reasons: std::collections::BTreeMap<String, u64>,
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

/// Clients-C for one C of the read-write lock (the read/write mix) or the semaphore.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct MixedClientsPoint {
    /// The primitive: [`GrowthKind::ReadWrite`] or [`GrowthKind::Semaphore`].
    pub kind: GrowthKind,
    /// C.
    pub clients: usize,
    /// Acquisitions (of every kind) per second.
    pub acquisitions_per_sec: f64,
    /// The smallest client share ÷ the fair share 1/C (1 = perfectly fair).
    pub min_share_of_fair: f64,
    /// The largest client share ÷ the fair share 1/C.
    pub max_share_of_fair: f64,
    /// Everything the scenario measured (waits, holders in use, violations).
    pub mixed: MixedResult,
}

/// Names: clients on many names picked at random (the mutex's next to the raw floor).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct NamesResult {
    /// The primitive: the mutex, the read-write lock (the read/write mix, each acquisition
    /// on a name of its own pick) or one permit of a semaphore per name.
    pub kind: GrowthKind,
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
    /// Clients-C of the same primitive with C = [`Self::clients`] on one name, when it ran
    /// with that C: its critical sections (the mutex) or acquisitions per second.
    pub one_name_per_sec: Option<f64>,
    /// `one_name_per_sec / acquisitions_per_sec`: one name against independent ones (1 = as
    /// many clients on one name go as fast as on names of their own).
    pub one_name_ratio: Option<f64>,
}

impl NamesResult {
    /// Sets the one-name figures from `result`'s clients-C of the same primitive and C.
    fn beside_one_name(&mut self, result: &GrowthResult) {
        let one = match self.kind {
            GrowthKind::Mutex => result
                .clients
                .iter()
                .find(|p| p.clients == self.clients)
                .map(|p| p.critical_sections_per_sec),
            kind => result
                .mixed_clients
                .iter()
                .find(|p| p.kind == kind && p.clients == self.clients)
                .map(|p| p.acquisitions_per_sec),
        };
        self.one_name_per_sec = one;
        self.one_name_ratio = one
            .filter(|_| self.acquisitions_per_sec > 0.0)
            .map(|one| one / self.acquisitions_per_sec);
    }
}

/// The number of progress phases `config` gives one target.
pub(crate) fn phases(config: &BenchConfig, has_counter: bool) -> u64 {
    let mut n = 0;
    let kinds = config.growth_kinds.len() as u64;
    if config.scenarios.hold() {
        n += kinds * config.hold_counts.len() as u64 + u64::from(has_counter);
    }
    if config.scenarios.clients() {
        n += kinds * config.client_counts.len() as u64;
    }
    if config.scenarios.names() {
        // The mutex's floor, then each primitive's clients.
        n += 1 + names_kinds(config).count() as u64;
    }
    if config.scenarios.churn() {
        n += 1 + u64::from(!config.churn_settle.is_zero());
    }
    n
}

/// Runs the selected growth scenarios on `target`; failures go to `errors`, primitives the
/// backend lacks to `skipped`.
pub(crate) async fn run_target(
    target: &Target,
    config: &BenchConfig,
    instruments: &dyn Instruments,
    base: &str,
    backend: &mut Option<String>,
    (errors, skipped): (&mut Vec<ScenarioError>, &mut Vec<Skipped>),
) -> GrowthResult {
    let mut result = GrowthResult::default();
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
            skipped,
        );
        if let Err(e) = hold.await {
            errors.push(ScenarioError::new("hold", &e));
        }
    }
    if config.scenarios.clients() {
        for &kind in &config.growth_kinds {
            let run = ClientsRun {
                target,
                config,
                instruments,
                kind,
                base,
            };
            if let Some(reason) = run.every_count(backend, &mut result, errors).await {
                skipped.push(Skipped {
                    scenario: format!("clients {}", kind.as_str()),
                    reason,
                });
            }
        }
    }
    if config.scenarios.names() {
        for kind in names_kinds(config) {
            let names_base = match kind {
                GrowthKind::Mutex => format!("{base}/names"),
                kind => format!("{base}/names/{}", kind.as_str()),
            };
            let scenario = names_scenario(kind);
            match names(target, config, instruments, &names_base, kind, backend).await {
                Ok(Named::Ran(mut names)) => {
                    names.beside_one_name(&result);
                    match kind {
                        GrowthKind::Mutex => result.names = Some(names),
                        _ => result.names_mixed.push(names),
                    }
                }
                Ok(Named::Lacks(reason)) => skipped.push(Skipped { scenario, reason }),
                Err(e) => errors.push(ScenarioError::new(&scenario, &e)),
            }
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

/// Clients-C of one primitive.
struct ClientsRun<'a> {
    target: &'a Target,
    config: &'a BenchConfig,
    instruments: &'a dyn Instruments,
    kind: GrowthKind,
    base: &'a str,
}

impl ClientsRun<'_> {
    /// Every C of the config: points into `result`, failures into `errors` (the next C runs
    /// all the same). Returns why the backend lacks the primitive, if it does.
    async fn every_count(
        &self,
        backend: &mut Option<String>,
        result: &mut GrowthResult,
        errors: &mut Vec<ScenarioError>,
    ) -> Option<String> {
        for &count in &self.config.client_counts {
            let scenario = match self.kind {
                GrowthKind::Mutex => format!("clients {count}"),
                kind => format!("clients {} {count}", kind.as_str()),
            };
            let label = self.target.label();
            self.instruments.phase(&format!("{label} {scenario}"));
            let progress = Progress::new(self.config.progress, label, &scenario);
            match self.one_count(count, backend, result, progress).await {
                Ok(None) => {}
                Ok(Some(reason)) => return Some(reason),
                Err(e) => errors.push(ScenarioError::new(&scenario, &e)),
            }
        }
        None
    }

    /// C = `count`: its point into `result`, or why the backend lacks the primitive.
    async fn one_count(
        &self,
        count: usize,
        backend: &mut Option<String>,
        result: &mut GrowthResult,
        progress: Progress,
    ) -> Result<Option<String>, Error> {
        let name = format!("{}/clients/{}/{count}", self.base, self.kind.as_str());
        let clients = crate::connect(self.target, count, backend).await?;
        let Some(mix) = self.kind.mix(self.config) else {
            let config = self.config.clone().with_clients(count);
            let s2 = crate::contended::run_s2(clients, name, &config, progress).await?;
            result.clients.push(clients_point(count, s2));
            return Ok(None);
        };
        if let Some(first) = clients.first()
            && let Some(reason) = mix.unsupported(first.backend(), first.capabilities())
        {
            return Ok(Some(reason));
        }
        let config = self.config.clone().with_mixed_clients(count);
        let mixed = crate::mixed::run_mixed(clients, name, mix, &config, progress).await?;
        let (min, max) = share_bounds(count, mixed.per_client.iter().map(|c| c.share));
        result.mixed_clients.push(MixedClientsPoint {
            kind: self.kind,
            clients: count,
            acquisitions_per_sec: mixed.acquisitions_per_sec,
            min_share_of_fair: min,
            max_share_of_fair: max,
            mixed,
        });
        Ok(None)
    }
}

/// The smallest and the largest of `shares` ÷ the fair share 1/`count`.
fn share_bounds(count: usize, shares: impl Iterator<Item = f64> + Clone) -> (f64, f64) {
    let fair = 1.0 / count as f64;
    let min = shares
        .clone()
        .map(|s| s / fair)
        .fold(f64::INFINITY, f64::min);
    let max = shares.map(|s| s / fair).fold(0.0, f64::max);
    (if min.is_finite() { min } else { 0.0 }, max)
}

fn clients_point(count: usize, s2: S2Result) -> ClientsPoint {
    let (min, max) = share_bounds(count, s2.per_client.iter().map(|c| c.share));
    ClientsPoint {
        clients: count,
        critical_sections_per_sec: s2.critical_sections_per_sec,
        handoff_p50_us: s2.handoff.p50_us,
        handoff_p99_us: s2.handoff.p99_us,
        longest_wait_us: s2.longest_wait_us,
        min_share_of_fair: min,
        max_share_of_fair: max,
        s2,
    }
}
