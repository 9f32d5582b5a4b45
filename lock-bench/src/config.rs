//! Scenario parameters.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use distlock_core::{Error, LockKind};
use serde::{Serialize, Serializer};

use crate::mixed::Mix;

/// Which scenarios a run measures. The raw floor of a target, if it has one, is measured
/// whenever any scenario runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ScenarioSelection {
    /// S1 only: uncontended acquire + release.
    S1,
    /// S2 only: contended critical sections.
    S2,
    /// The read/write mix only: shared and exclusive acquisitions of one name.
    RwMix,
    /// The semaphore only: clients contending for the permits of one name.
    Semaphore,
    /// Every scenario above (S1, S2, RW mix, semaphore; not the growth curves, which are long).
    #[default]
    All,
    /// Growth: one client holding K locks, for each K of [`BenchConfig::hold_counts`].
    Hold,
    /// Growth: S2 for each client count of [`BenchConfig::client_counts`].
    Clients,
    /// Growth: [`BenchConfig::names_clients`] clients on [`BenchConfig::names`] names picked at
    /// random, the mutex next to the raw floor run the same way, then each other primitive
    /// of [`BenchConfig::growth_kinds`].
    Names,
    /// Growth: hold, clients and names.
    Growth,
    /// Growth: [`BenchConfig::churn_names`] distinct names acquired and released once each,
    /// and what the server keeps for them afterwards (not in `Growth`: it is long).
    Churn,
}

impl ScenarioSelection {
    /// Whether S1 (uncontended) runs.
    pub fn uncontended(self) -> bool {
        matches!(self, Self::S1 | Self::All)
    }

    /// Whether S2 (contended) runs.
    pub fn contended(self) -> bool {
        matches!(self, Self::S2 | Self::All)
    }

    /// Whether the read/write mix runs.
    pub fn rw_mix(self) -> bool {
        matches!(self, Self::RwMix | Self::All)
    }

    /// Whether the semaphore scenario runs.
    pub fn semaphore(self) -> bool {
        matches!(self, Self::Semaphore | Self::All)
    }

    /// Whether the hold-K growth scenario runs.
    pub fn hold(self) -> bool {
        matches!(self, Self::Hold | Self::Growth)
    }

    /// Whether the clients-C growth scenario runs.
    pub fn clients(self) -> bool {
        matches!(self, Self::Clients | Self::Growth)
    }

    /// Whether the many-names growth scenario runs.
    pub fn names(self) -> bool {
        matches!(self, Self::Names | Self::Growth)
    }

    /// Whether the churn growth scenario runs.
    pub fn churn(self) -> bool {
        matches!(self, Self::Churn)
    }

    /// Whether only growth scenarios run (then S1, S2 and their floors do not).
    pub fn growth_only(self) -> bool {
        matches!(
            self,
            Self::Hold | Self::Clients | Self::Names | Self::Growth | Self::Churn
        )
    }
}

/// A primitive of the growth scenarios hold-K and clients-C ([`BenchConfig::growth_kinds`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GrowthKind {
    /// The mutex: hold-K holds K exclusive locks; clients-C runs S2's loop.
    Mutex,
    /// The read-write lock: hold-K holds a read (shared) hold on each of K names; clients-C
    /// runs the read/write mix ([`BenchConfig::write_share`] of the acquisitions exclusive).
    ReadWrite,
    /// The semaphore of [`BenchConfig::permits`]: hold-K holds one permit of each of K
    /// names; clients-C runs the semaphore scenario.
    Semaphore,
}

impl GrowthKind {
    /// Every primitive, in report order.
    pub const ALL: [Self; 3] = [Self::Mutex, Self::ReadWrite, Self::Semaphore];

    /// The short name of reports, charts and `--growth-kinds`: `mutex`, `rw`, `semaphore`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Mutex => "mutex",
            Self::ReadWrite => "rw",
            Self::Semaphore => "semaphore",
        }
    }

    /// The kind of hold-K's acquisitions (a read hold, one permit of `permits`).
    pub(crate) fn lock_kind(self, permits: u32) -> LockKind {
        match self {
            Self::Mutex => LockKind::Exclusive,
            Self::ReadWrite => LockKind::Shared,
            Self::Semaphore => LockKind::Permit { permits },
        }
    }

    /// The scenario clients-C runs for this primitive, `None` for the mutex (S2's loop).
    pub(crate) fn mix(self, config: &BenchConfig) -> Option<Mix> {
        match self {
            Self::Mutex => None,
            Self::ReadWrite => Some(Mix::ReadWrite {
                write_share: config.write_share,
            }),
            Self::Semaphore => Some(Mix::Semaphore {
                permits: config.permits,
            }),
        }
    }
}

/// The call S1 times for the acquire half of a cycle.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum S1Call {
    /// One `try_acquire` per cycle: the same work as the raw floor's acquire.
    #[default]
    TryAcquire,
    /// `acquire` bounded by `acquire_wait`: the waiting path (queue entry, wake-up
    /// subscription) on a free lock.
    Acquire,
}

impl S1Call {
    /// The method name, as printed in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::TryAcquire => "try_acquire",
            Self::Acquire => "acquire",
        }
    }
}

/// The parameters of one benchmark run, shared by every target so that all backends are
/// measured the same way. Serialized (durations in milliseconds) into the report.
///
/// ```
/// use std::time::Duration;
/// use distlock_bench::{BenchConfig, ScenarioSelection};
///
/// let config = BenchConfig::default()
///     .with_scenarios(ScenarioSelection::S2)
///     .with_clients(8)
///     .with_hold(Duration::from_millis(2));
/// assert_eq!(config.clients, 8);
/// ```
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct BenchConfig {
    /// Which scenarios run. Default: all.
    pub scenarios: ScenarioSelection,
    /// S1 and floor: measured acquire + release cycles. Default 10 000.
    pub cycles: u64,
    /// S1 and floor: unmeasured cycles before the measured ones. Default 1 000.
    pub warmup_cycles: u64,
    /// S1: which acquire call is timed. Default `try_acquire`.
    pub s1_call: S1Call,
    /// Lease length of every acquisition (renewal stays at its default, `ttl / 3`).
    /// Default 10 s.
    #[serde(rename = "ttl_ms", serialize_with = "millis")]
    pub ttl: Duration,
    /// S2: contending clients, each its own client from the target's factory. Default 4.
    pub clients: usize,
    /// S2: how long each critical section holds the lock (`tokio::time::sleep`, so at least
    /// the timer's granularity). Default 1 ms.
    #[serde(rename = "hold_ms", serialize_with = "millis")]
    pub hold: Duration,
    /// S2: measured duration. Default 5 s.
    #[serde(rename = "duration_ms", serialize_with = "millis")]
    pub duration: Duration,
    /// S2: unmeasured time before the measured duration. Default 500 ms.
    #[serde(rename = "s2_warmup_ms", serialize_with = "millis")]
    pub s2_warmup: Duration,
    /// The read/write mix and the semaphore: contending clients, each its own client from
    /// the target's factory. Default 8.
    pub mixed_clients: usize,
    /// The read/write mix: the fraction of acquisitions that are exclusive (writes); the
    /// others are shared (reads). Default 0.1.
    pub write_share: f64,
    /// The semaphore: its permits. Default 3.
    pub permits: u32,
    /// S2 (and S1 with [`S1Call::Acquire`]): the wait bound passed to `acquire`. A waiter that
    /// hits it fails the scenario. Default 60 s.
    #[serde(rename = "acquire_wait_ms", serialize_with = "millis")]
    pub acquire_wait: Duration,
    /// Hold: the numbers of locks K one client acquires and holds, one measurement each.
    /// Default 1, 10, 100, 1 000, 10 000.
    pub hold_counts: Vec<usize>,
    /// Hold: the lease of each held lock (renewed every `hold_ttl / 3`, the renewal tick).
    /// Default 30 s.
    #[serde(rename = "hold_ttl_ms", serialize_with = "millis")]
    pub hold_ttl: Duration,
    /// Hold: how long all K locks are held, the measured window; `None`: 3 × `hold_ttl`.
    #[serde(rename = "hold_for_ms", serialize_with = "opt_millis")]
    pub hold_for: Option<Duration>,
    /// Hold: acquisitions (and releases) in flight at once. Default 64.
    pub hold_concurrency: usize,
    /// Clients: the numbers of contending clients C, one S2 run each. Default 4, 16, 64.
    pub client_counts: Vec<usize>,
    /// Hold, clients and names: the primitives measured, each its own curve (a backend without a
    /// primitive skips it, with the reason in the report). Default all three.
    pub growth_kinds: Vec<GrowthKind>,
    /// Names: how many names the clients pick from. Default 1 000.
    pub names: usize,
    /// Names: the clients (and raw floor connections). Default 16.
    pub names_clients: usize,
    /// Churn: distinct names, each acquired and released once (with `hold_concurrency` in
    /// flight). Default 100 000.
    pub churn_names: usize,
    /// Churn: how long to wait after the last release before counting what is left a second
    /// time (0: counted once, at once). Default 0.
    #[serde(rename = "churn_settle_ms", serialize_with = "millis")]
    pub churn_settle: Duration,
    /// Prefix of every lock name used by the run, so that runs never collide. Default: a
    /// random `lock-bench/<16 hex digits>`, new for every `BenchConfig::default()`.
    pub name_prefix: String,
    /// Busy processes that ran beside the whole run (started by the caller, e.g. `distlock
    /// bench --background-load N`): recorded in the report, so that figures measured on a
    /// loaded machine say so. Every block, the floors' and distlock's, ran under the same load.
    /// Default 0.
    pub background_load: usize,
    /// Print progress lines to stderr during scenarios that take longer than a second.
    /// Default off (the binary turns it on).
    #[serde(skip)]
    pub progress: bool,
}

fn millis<S: Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_f64(duration.as_secs_f64() * 1000.0)
}

#[expect(
    clippy::ref_option,
    reason = "serde's serialize_with passes a reference to the field"
)]
fn opt_millis<S: Serializer>(
    duration: &Option<Duration>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match duration {
        Some(d) => millis(d, serializer),
        None => serializer.serialize_none(),
    }
}

impl Default for BenchConfig {
    fn default() -> Self {
        Self {
            scenarios: ScenarioSelection::All,
            cycles: 10_000,
            warmup_cycles: 1_000,
            s1_call: S1Call::TryAcquire,
            ttl: Duration::from_secs(10),
            clients: 4,
            hold: Duration::from_millis(1),
            duration: Duration::from_secs(5),
            s2_warmup: Duration::from_millis(500),
            acquire_wait: Duration::from_secs(60),
            mixed_clients: 8,
            write_share: 0.1,
            permits: 3,
            background_load: 0,
            hold_counts: vec![1, 10, 100, 1_000, 10_000],
            hold_ttl: Duration::from_secs(30),
            hold_for: None,
            hold_concurrency: 64,
            client_counts: vec![4, 16, 64],
            growth_kinds: GrowthKind::ALL.to_vec(),
            names: 1_000,
            names_clients: 16,
            churn_names: 100_000,
            churn_settle: Duration::ZERO,
            name_prefix: random_prefix(),
            progress: false,
        }
    }
}

/// `lock-bench/` and 16 random hex digits (from the standard library's randomly seeded
/// hasher, the clock and the process id).
fn random_prefix() -> String {
    let mut hasher = RandomState::new().build_hasher();
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    hasher.write_u128(nanos);
    hasher.write_u32(std::process::id());
    format!("lock-bench/{:016x}", hasher.finish())
}

impl BenchConfig {
    /// The names of the mutexes run side by side before the semaphore: one per permit, at
    /// most one per client (at least one).
    pub(crate) fn side_by_side_names(&self) -> usize {
        usize::try_from(self.permits)
            .unwrap_or(usize::MAX)
            .clamp(1, self.mixed_clients.max(1))
    }

    /// Sets which scenarios run.
    #[must_use]
    pub fn with_scenarios(mut self, scenarios: ScenarioSelection) -> Self {
        self.scenarios = scenarios;
        self
    }

    /// Sets the measured S1 (and floor) cycles.
    #[must_use]
    pub fn with_cycles(mut self, cycles: u64) -> Self {
        self.cycles = cycles;
        self
    }

    /// Sets the S1 (and floor) warm-up cycles.
    #[must_use]
    pub fn with_warmup_cycles(mut self, cycles: u64) -> Self {
        self.warmup_cycles = cycles;
        self
    }

    /// Sets the call S1 times.
    #[must_use]
    pub fn with_s1_call(mut self, call: S1Call) -> Self {
        self.s1_call = call;
        self
    }

    /// Sets the lease length.
    #[must_use]
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Sets the number of S2 clients.
    #[must_use]
    pub fn with_clients(mut self, clients: usize) -> Self {
        self.clients = clients;
        self
    }

    /// Sets the S2 hold time.
    #[must_use]
    pub fn with_hold(mut self, hold: Duration) -> Self {
        self.hold = hold;
        self
    }

    /// Sets the measured S2 duration.
    #[must_use]
    pub fn with_duration(mut self, duration: Duration) -> Self {
        self.duration = duration;
        self
    }

    /// Sets the S2 warm-up.
    #[must_use]
    pub fn with_s2_warmup(mut self, warmup: Duration) -> Self {
        self.s2_warmup = warmup;
        self
    }

    /// Sets the wait bound of `acquire`.
    #[must_use]
    pub fn with_acquire_wait(mut self, wait: Duration) -> Self {
        self.acquire_wait = wait;
        self
    }

    /// Sets the number of clients of the read/write mix and the semaphore.
    #[must_use]
    pub fn with_mixed_clients(mut self, clients: usize) -> Self {
        self.mixed_clients = clients;
        self
    }

    /// Sets the fraction of exclusive acquisitions in the read/write mix.
    #[must_use]
    pub fn with_write_share(mut self, share: f64) -> Self {
        self.write_share = share;
        self
    }

    /// Records `n` busy processes running beside the run (see
    /// [`background_load`](Self::background_load)); the caller starts them.
    #[must_use]
    pub fn with_background_load(mut self, n: usize) -> Self {
        self.background_load = n;
        self
    }

    /// Sets the semaphore's permits.
    #[must_use]
    pub fn with_permits(mut self, permits: u32) -> Self {
        self.permits = permits;
        self
    }

    /// Sets the hold scenario's lock counts K.
    #[must_use]
    pub fn with_hold_counts(mut self, counts: Vec<usize>) -> Self {
        self.hold_counts = counts;
        self
    }

    /// Sets the hold scenario's lease (the renewal tick is a third of it).
    #[must_use]
    pub fn with_hold_ttl(mut self, ttl: Duration) -> Self {
        self.hold_ttl = ttl;
        self
    }

    /// Sets the hold scenario's measured window (`None`: 3 × the hold ttl).
    #[must_use]
    pub fn with_hold_for(mut self, window: Option<Duration>) -> Self {
        self.hold_for = window;
        self
    }

    /// Sets the acquisitions in flight at once in the hold scenario.
    #[must_use]
    pub fn with_hold_concurrency(mut self, concurrency: usize) -> Self {
        self.hold_concurrency = concurrency;
        self
    }

    /// Sets the clients scenario's client counts C.
    #[must_use]
    pub fn with_client_counts(mut self, counts: Vec<usize>) -> Self {
        self.client_counts = counts;
        self
    }

    /// Sets the primitives of the hold and clients scenarios.
    #[must_use]
    pub fn with_growth_kinds(mut self, kinds: Vec<GrowthKind>) -> Self {
        self.growth_kinds = kinds;
        self
    }

    /// Sets the names scenario's number of names and clients.
    #[must_use]
    pub fn with_names(mut self, names: usize, clients: usize) -> Self {
        self.names = names;
        self.names_clients = clients;
        self
    }

    /// Sets the churn scenario's number of names and its settling time before the second
    /// count (zero: counted once).
    #[must_use]
    pub fn with_churn(mut self, names: usize, settle: Duration) -> Self {
        self.churn_names = names;
        self.churn_settle = settle;
        self
    }

    /// The hold scenario's measured window: `hold_for`, else 3 × `hold_ttl`.
    pub fn hold_window(&self) -> Duration {
        self.hold_for.unwrap_or(self.hold_ttl * 3)
    }

    /// The hold scenario's renewal tick: a third of `hold_ttl`, the default renewal interval.
    pub fn renewal_tick(&self) -> Duration {
        self.hold_ttl / 3
    }

    /// Sets the lock name prefix.
    #[must_use]
    pub fn with_name_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.name_prefix = prefix.into();
        self
    }

    /// Turns progress lines on stderr on or off.
    #[must_use]
    pub fn with_progress(mut self, progress: bool) -> Self {
        self.progress = progress;
        self
    }

    /// Checks the parameters.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the offending value.
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |msg: &str| Err(Error::InvalidConfig(msg.to_owned()));
        if self.cycles == 0 {
            return bad("cycles must be at least 1");
        }
        if self.clients == 0 {
            return bad("clients must be at least 1");
        }
        if self.mixed_clients == 0 {
            return bad("mixed_clients must be at least 1");
        }
        if !(0.0..=1.0).contains(&self.write_share) {
            return bad("write_share must be between 0 and 1");
        }
        if self.permits == 0 {
            return bad("permits must be at least 1");
        }
        if self.ttl.is_zero() {
            return bad("ttl must be greater than zero");
        }
        if self.duration.is_zero() {
            return bad("duration must be greater than zero");
        }
        if self.acquire_wait.is_zero() {
            return bad("acquire_wait must be greater than zero");
        }
        if self.scenarios.hold() {
            if self.hold_counts.is_empty() || self.hold_counts.contains(&0) {
                return bad("hold_counts must be non-empty and each at least 1");
            }
            if self.hold_ttl < Duration::from_millis(30) {
                return bad("hold_ttl must be at least 30ms");
            }
            if self.hold_window().is_zero() || self.hold_concurrency == 0 {
                return bad("hold_for and hold_concurrency must be greater than zero");
            }
        }
        if self.scenarios.clients()
            && (self.client_counts.is_empty() || self.client_counts.contains(&0))
        {
            return bad("client_counts must be non-empty and each at least 1");
        }
        if (self.scenarios.hold() || self.scenarios.clients()) && self.growth_kinds.is_empty() {
            return bad("growth_kinds must name at least one primitive");
        }
        if self.scenarios.names() && (self.names == 0 || self.names_clients == 0) {
            return bad("names and names_clients must be at least 1");
        }
        if self.scenarios.churn() && (self.churn_names == 0 || self.hold_concurrency == 0) {
            return bad("churn_names and hold_concurrency must be at least 1");
        }
        if self.name_prefix.is_empty() {
            return bad("name_prefix must not be empty");
        }
        Ok(())
    }
}
