//! Scenario parameters.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use distlock_core::Error;
use serde::{Serialize, Serializer};

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
    /// Every scenario.
    #[default]
    All,
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
    /// Prefix of every lock name used by the run, so that runs never collide. Default: a
    /// random `lock-bench/<16 hex digits>`, new for every `BenchConfig::default()`.
    pub name_prefix: String,
    /// Print progress lines to stderr during scenarios that take longer than a second.
    /// Default off (the binary turns it on).
    #[serde(skip)]
    pub progress: bool,
}

fn millis<S: Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_f64(duration.as_secs_f64() * 1000.0)
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

    /// Sets the semaphore's permits.
    #[must_use]
    pub fn with_permits(mut self, permits: u32) -> Self {
        self.permits = permits;
        self
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
        if self.name_prefix.is_empty() {
            return bad("name_prefix must not be empty");
        }
        Ok(())
    }
}
