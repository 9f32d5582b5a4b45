//! The benchmark flags, shared by the `lock-bench` binary and `distlock bench`.

use std::path::PathBuf;
use std::time::Duration;

use crate::{BenchConfig, S1Call, ScenarioSelection};

/// The scenario flags, to `#[command(flatten)]` into a clap command. Defaults match
/// [`BenchConfig::default`]; durations take humantime syntax (`500ms`, `5s`, `1m`).
///
/// ```
/// use clap::Parser;
/// use distlock_bench::BenchArgs;
///
/// #[derive(Parser)]
/// struct Cli {
///     #[command(flatten)]
///     bench: BenchArgs,
/// }
///
/// let cli = Cli::parse_from(["bench", "--clients", "8", "--hold", "2ms", "--scenario", "s2"]);
/// let config = cli.bench.config();
/// assert_eq!(config.clients, 8);
/// assert_eq!(config.hold, std::time::Duration::from_millis(2));
/// ```
#[derive(Clone, Debug, clap::Args)]
pub struct BenchArgs {
    /// Scenarios to run: s1 (uncontended), s2 (contended) or all.
    #[arg(long, value_enum, default_value = "all")]
    pub scenario: ScenarioSelection,

    /// S1 and floor: measured acquire + release cycles.
    #[arg(long, default_value_t = 10_000)]
    pub cycles: u64,

    /// S1 and floor: warm-up cycles before measuring.
    #[arg(long, default_value_t = 1_000)]
    pub warmup: u64,

    /// S1: the acquire call to time.
    #[arg(long, value_enum, default_value = "try-acquire")]
    pub s1_call: S1Call,

    /// S2: contending clients (each its own connection).
    #[arg(long, default_value_t = 4)]
    pub clients: usize,

    /// S2: time each client holds the lock.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "1ms")]
    pub hold: Duration,

    /// S2: measured duration.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "5s")]
    pub duration: Duration,

    /// S2: warm-up before measuring.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "500ms")]
    pub s2_warmup: Duration,

    /// Lease length of every acquisition (renewed at ttl/3 as by default).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    pub ttl: Duration,

    /// Bound on each waiting acquire; hitting it fails the scenario.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "60s")]
    pub acquire_wait: Duration,

    /// Lock name prefix (default: a random one per run).
    #[arg(long)]
    pub name_prefix: Option<String>,

    /// Also write all results as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,

    /// No progress lines on stderr.
    #[arg(long, short)]
    pub quiet: bool,
}

impl BenchArgs {
    /// The run parameters these flags describe.
    pub fn config(&self) -> BenchConfig {
        let mut config = BenchConfig::default()
            .with_scenarios(self.scenario)
            .with_cycles(self.cycles)
            .with_warmup_cycles(self.warmup)
            .with_s1_call(self.s1_call)
            .with_clients(self.clients)
            .with_hold(self.hold)
            .with_duration(self.duration)
            .with_s2_warmup(self.s2_warmup)
            .with_ttl(self.ttl)
            .with_acquire_wait(self.acquire_wait)
            .with_progress(!self.quiet);
        if let Some(prefix) = &self.name_prefix {
            config = config.with_name_prefix(prefix.clone());
        }
        config
    }
}
