//! The flags of `distlock bench`: the harness's [`BenchConfig`] as command-line options.

use std::path::PathBuf;
use std::time::Duration;

use distlock_bench::{BenchConfig, GrowthKind, S1Call, ScenarioSelection};

/// The scenario flags, flattened into `distlock bench`. Defaults match
/// [`BenchConfig::default`]; durations take humantime syntax (`500ms`, `5s`, `1m`).
#[derive(Clone, Debug, clap::Args)]
pub(crate) struct BenchArgs {
    /// Scenarios to run: s1 (uncontended), s2 (contended mutex), rw-mix (shared and exclusive
    /// acquisitions), semaphore, or all; or the growth curves (long, not in all): hold (one
    /// client holding K locks), clients (C clients on one name), names (16 clients on 1 000
    /// names: the mutex, then each other primitive of --growth-kinds), or growth (all three);
    /// churn (what --churn-names released names leave on the server; not in growth).
    #[arg(long, value_enum, default_value = "all")]
    pub(crate) scenario: Scenario,

    /// S1 and floor: measured acquire + release cycles.
    #[arg(long, default_value_t = 10_000)]
    pub(crate) cycles: u64,

    /// S1 and floor: warm-up cycles before measuring.
    #[arg(long, default_value_t = 1_000)]
    pub(crate) warmup: u64,

    /// S1: the acquire call to time.
    #[arg(long, value_enum, default_value = "try-acquire")]
    pub(crate) s1_call: Call,

    /// S2: contending clients (each its own connection).
    #[arg(long, default_value_t = 4)]
    pub(crate) clients: usize,

    /// S2: time each client holds the lock.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "1ms")]
    pub(crate) hold: Duration,

    /// S2: measured duration.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "5s")]
    pub(crate) duration: Duration,

    /// S2: warm-up before measuring.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "500ms")]
    pub(crate) s2_warmup: Duration,

    /// RW mix and semaphore: contending clients (each its own connection).
    #[arg(long, default_value_t = 8)]
    pub(crate) mixed_clients: usize,

    /// RW mix: the fraction of acquisitions that are exclusive (the rest are shared).
    #[arg(long, default_value_t = 0.1)]
    pub(crate) write_share: f64,

    /// Semaphore: its permits.
    #[arg(long, default_value_t = 3)]
    pub(crate) permits: u32,

    /// Lease length of every acquisition (renewed at ttl/3 as by default).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    pub(crate) ttl: Duration,

    /// Bound on each waiting acquire; hitting it fails the scenario.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "60s")]
    pub(crate) acquire_wait: Duration,

    /// Hold: the numbers of locks K one client acquires and holds, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,10,100,1000,10000")]
    pub(crate) hold_counts: Vec<usize>,

    /// Hold: the lease of each held lock; renewal every third of it (the renewal tick).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "30s")]
    pub(crate) hold_ttl: Duration,

    /// Hold: how long all K locks are held and measured (default: 3 × --hold-ttl).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub(crate) hold_for: Option<Duration>,

    /// Hold: acquisitions (and releases) in flight at once.
    #[arg(long, default_value_t = 64)]
    pub(crate) hold_concurrency: usize,

    /// Clients: the numbers of contending clients C, comma-separated (hold, duration and
    /// warm-up as S2).
    #[arg(long, value_delimiter = ',', default_value = "4,16,64")]
    pub(crate) client_counts: Vec<usize>,

    /// Hold, clients and names: the primitives measured, comma-separated (a backend without one
    /// skips it, saying why).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "mutex,rw,semaphore"
    )]
    pub(crate) growth_kinds: Vec<Primitive>,

    /// Names: how many names the clients pick from at random.
    #[arg(long, default_value_t = 1_000)]
    pub(crate) names: usize,

    /// Names: the clients (and raw floor connections).
    #[arg(long, default_value_t = 16)]
    pub(crate) names_clients: usize,

    /// Churn: distinct names, each acquired and released once (--hold-concurrency at a time).
    #[arg(long, default_value_t = 100_000)]
    pub(crate) churn_names: usize,

    /// Churn: wait this long after the last release, then count what is left a second time
    /// (0: count once, at once).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "0s")]
    pub(crate) churn_settle: Duration,

    /// Growth scenarios: write SVG charts into DIR (hold-cost.svg, clients-latency.svg,
    /// clients-primitives.svg).
    #[arg(long, value_name = "DIR")]
    pub(crate) charts: Option<PathBuf>,

    /// Lock name prefix (default: a random one per run).
    #[arg(long)]
    pub(crate) name_prefix: Option<String>,

    /// Also write all results as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    pub(crate) json: Option<PathBuf>,

    /// No progress lines (or progress bar) on stderr.
    #[arg(long, short)]
    pub(crate) quiet: bool,
}

impl BenchArgs {
    /// The run parameters these flags describe.
    pub(crate) fn config(&self) -> BenchConfig {
        let mut config = BenchConfig::default()
            .with_scenarios(self.scenario.into())
            .with_cycles(self.cycles)
            .with_warmup_cycles(self.warmup)
            .with_s1_call(self.s1_call.into())
            .with_clients(self.clients)
            .with_hold(self.hold)
            .with_duration(self.duration)
            .with_s2_warmup(self.s2_warmup)
            .with_ttl(self.ttl)
            .with_acquire_wait(self.acquire_wait)
            .with_mixed_clients(self.mixed_clients)
            .with_write_share(self.write_share)
            .with_permits(self.permits)
            .with_hold_counts(self.hold_counts.clone())
            .with_hold_ttl(self.hold_ttl)
            .with_hold_for(self.hold_for)
            .with_hold_concurrency(self.hold_concurrency)
            .with_client_counts(self.client_counts.clone())
            .with_growth_kinds(self.growth_kinds.iter().map(|&k| k.into()).collect())
            .with_names(self.names, self.names_clients)
            .with_churn(self.churn_names, self.churn_settle)
            .with_progress(!self.quiet);
        if let Some(prefix) = &self.name_prefix {
            config = config.with_name_prefix(prefix.clone());
        }
        config
    }
}

/// `--scenario` (the harness's [`ScenarioSelection`]).
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub(crate) enum Scenario {
    /// S1 only: uncontended acquire + release.
    S1,
    /// S2 only: contended critical sections of a mutex.
    S2,
    /// The read/write mix only.
    RwMix,
    /// The semaphore only.
    Semaphore,
    /// S1, S2, the read/write mix and the semaphore.
    All,
    /// Growth: one client holding K locks (--hold-counts).
    Hold,
    /// Growth: C clients on one name (--client-counts).
    Clients,
    /// Growth: clients on many names picked at random, next to the raw floor.
    Names,
    /// Growth: hold, clients and names.
    Growth,
    /// What distinct names acquired and released once each leave on the server.
    Churn,
}

impl From<Scenario> for ScenarioSelection {
    fn from(scenario: Scenario) -> Self {
        match scenario {
            Scenario::S1 => Self::S1,
            Scenario::S2 => Self::S2,
            Scenario::RwMix => Self::RwMix,
            Scenario::Semaphore => Self::Semaphore,
            Scenario::All => Self::All,
            Scenario::Hold => Self::Hold,
            Scenario::Clients => Self::Clients,
            Scenario::Names => Self::Names,
            Scenario::Growth => Self::Growth,
            Scenario::Churn => Self::Churn,
        }
    }
}

/// `--growth-kinds` (the harness's [`GrowthKind`]).
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub(crate) enum Primitive {
    /// The mutex (exclusive locks; clients: S2's loop).
    Mutex,
    /// The read-write lock (hold: read holds; clients: the read/write mix).
    Rw,
    /// The semaphore of --permits (hold: one permit per name; clients: its scenario).
    Semaphore,
}

impl From<Primitive> for GrowthKind {
    fn from(kind: Primitive) -> Self {
        match kind {
            Primitive::Mutex => Self::Mutex,
            Primitive::Rw => Self::ReadWrite,
            Primitive::Semaphore => Self::Semaphore,
        }
    }
}

/// `--s1-call` (the harness's [`S1Call`]).
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub(crate) enum Call {
    /// One `try_acquire` per cycle: the same work as the raw floor's acquire.
    TryAcquire,
    /// `acquire` bounded by `acquire_wait`: the waiting path (queue entry, wake-up
    /// subscription) on a free lock.
    Acquire,
}

impl From<Call> for S1Call {
    fn from(call: Call) -> Self {
        match call {
            Call::TryAcquire => Self::TryAcquire,
            Call::Acquire => Self::Acquire,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use clap::Parser;
    use distlock_bench::{BenchConfig, GrowthKind, S1Call, ScenarioSelection};

    use super::BenchArgs;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchArgs,
    }

    #[test]
    fn flag_defaults_match_config_defaults() {
        let parsed = Cli::parse_from(["distlock-bench", "--quiet"])
            .bench
            .config();
        let default = BenchConfig::default().with_name_prefix(parsed.name_prefix.clone());
        assert_eq!(parsed, default);

        let cli = Cli::parse_from([
            "distlock-bench",
            "--scenario",
            "s1",
            "--cycles",
            "5",
            "--warmup",
            "0",
            "--clients",
            "3",
            "--hold",
            "500us",
            "--duration",
            "2s",
            "--ttl",
            "3s",
            "--s1-call",
            "acquire",
            "--json",
            "out.json",
            "--mixed-clients",
            "5",
            "--write-share",
            "0.25",
            "--permits",
            "4",
            "--hold-counts",
            "1,50",
            "--hold-ttl",
            "1500ms",
            "--client-counts",
            "2,4",
            "--growth-kinds",
            "rw,semaphore",
            "--churn-names",
            "500",
            "--churn-settle",
            "3s",
        ]);
        let config = cli.bench.config();
        assert_eq!(config.scenarios, ScenarioSelection::S1);
        assert_eq!(
            (config.cycles, config.warmup_cycles, config.clients),
            (5, 0, 3)
        );
        assert_eq!(config.hold, Duration::from_micros(500));
        assert_eq!(config.duration, Duration::from_secs(2));
        assert_eq!(config.ttl, Duration::from_secs(3));
        assert_eq!(config.s1_call, S1Call::Acquire);
        assert_eq!(
            (config.mixed_clients, config.write_share, config.permits),
            (5, 0.25, 4)
        );
        assert!(config.progress);
        assert_eq!(config.hold_counts, [1, 50]);
        assert_eq!(config.hold_window(), Duration::from_millis(4500));
        assert_eq!(config.client_counts, [2, 4]);
        assert_eq!(
            config.growth_kinds,
            [GrowthKind::ReadWrite, GrowthKind::Semaphore]
        );
        assert_eq!(config.churn_names, 500);
        assert_eq!(config.churn_settle, Duration::from_secs(3));
        assert_eq!(
            cli.bench.json.as_deref(),
            Some(std::path::Path::new("out.json"))
        );
    }
}
