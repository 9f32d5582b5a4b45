//! `distlock bench`: the shared lock-bench scenarios against one or more URLs, each next to its
//! backend's raw floor.

use std::io::IsTerminal as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use distlock_bench::{Instruments, Report, Target};

use crate::bench_args::BenchArgs;

use crate::exit::{CONFIG, Failure, OTHER};

/// Flags of `distlock bench`.
#[derive(Debug, clap::Args)]
pub(crate) struct CliBenchArgs {
    /// A lock service URL to measure; repeat for a side-by-side comparison (default:
    /// DISTLOCK_URL, else the per-user SQLite file).
    #[arg(long = "url", env = "DISTLOCK_URL", hide_env_values = true)]
    urls: Vec<String>,

    /// Also print what distlock's own metrics recorded during the run, per backend: counts
    /// (acquisitions, refusals, timeouts, renewals, losses, releases, errors) and the
    /// percentiles of the wait, hold, handoff and request durations.
    #[arg(long)]
    metrics: bool,

    /// The tokio runtime the clients run on: multi-thread (what `#[tokio::main]` gives) or
    /// current-thread (one thread for every client and the harness). The report names it.
    #[arg(long, value_enum, default_value = "multi-thread")]
    pub(crate) runtime: Flavor,

    /// Also measure fenced floors, in the same run as the plain ones: on PostgreSQL and MySQL
    /// S2's contended floor again, committing a fencing token in each critical section (a
    /// durable counter increment while the server's lock is held: the least a lock whose
    /// tokens survive a database crash writes); on Redis (not Redlock) S1's floor again,
    /// stepping a counter in the transaction of its `SET` (`MULTI`, `SET NX PX`, `INCR`,
    /// `EXEC`: the least a lock whose tokens strictly increase sends), in the same rotation as
    /// S1. The etcd and ZooKeeper floors' locks have tokens of their own already.
    #[arg(long)]
    fenced_floor: bool,

    /// Run N busy processes (distlock itself, spinning) beside the whole run, so that every
    /// block, the floors' and distlock's, is measured on the same loaded machine; the report
    /// says so and how much CPU they got. At most 256.
    #[arg(long, value_name = "N", default_value_t = 0,
          value_parser = clap::value_parser!(u16).range(0..=256))]
    background_load: u16,

    #[command(flatten)]
    bench: BenchArgs,
}

/// `--runtime`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Flavor {
    /// tokio's multi-thread runtime, one worker per core.
    MultiThread,
    /// tokio's current-thread runtime.
    CurrentThread,
}

pub(crate) async fn bench(args: CliBenchArgs) -> Result<u8, Failure> {
    // Before any client is built: clients register their metric handles when built.
    let recorded = if args.metrics {
        Some(crate::bench_metrics::Recorded::install().map_err(|e| Failure::new(OTHER, e))?)
    } else {
        None
    };
    let mut urls = args.urls.clone();
    if urls.is_empty() {
        let default = crate::state::default_url();
        if default.is_empty() {
            return Err(crate::state::no_state_dir());
        }
        crate::state::prepare_default_db()?;
        urls.push(default);
    }
    let mut targets = Vec::new();
    for url in &urls {
        // Fail fast on a bad URL before anything is measured.
        distlock::connect(url).await.map_err(|err| {
            let shown = distlock::service_url::redact(url);
            Failure::from_lock(&err, format!("cannot use {shown}"))
        })?;
        let owned = url.clone();
        let target = Target::new(distlock::service_url::redact(url), move || {
            let url = owned.clone();
            async move { distlock::connect(&url).await }
        });
        targets.push(with_floor(target, url, args.fenced_floor));
    }
    let mut config = args
        .bench
        .config()
        .with_background_load(usize::from(args.background_load));
    let growth = config.scenarios.growth_only();
    // The growth scenarios show a progress bar instead of progress lines.
    let instruments = CliInstruments::new(growth && config.progress);
    if growth {
        config.progress = false;
    }
    let load = crate::bench_load::Load::start(usize::from(args.background_load))?;
    let report = distlock_bench::run_with(&targets, &config, &instruments)
        .await
        .map_err(|err| Failure::from_lock(&err, "benchmark"))?;
    let load = load.finish();
    println!("{}", report.to_markdown());
    if args.background_load > 0 {
        println!("{load}");
    }
    if let Some(dir) = &args.bench.charts {
        write_charts(&report, dir)?;
    }
    if let Some(recorded) = &recorded {
        println!("{}", recorded.report());
    }
    if let Some(path) = &args.bench.json {
        let json = report
            .to_json()
            .map_err(|e| Failure::new(OTHER, format!("cannot encode results: {e}")))?;
        std::fs::write(path, json + "\n")
            .map_err(|e| Failure::new(CONFIG, format!("cannot write {}: {e}", path.display())))?;
    }
    if report.has_failures() {
        return Err(Failure::new(
            OTHER,
            "some scenarios failed or saw their bound exceeded (exclusivity or permits; see the tables)",
        ));
    }
    Ok(0)
}

/// The process's instruments for the growth scenarios: the counting allocator's live bytes,
/// `getrusage` CPU time, and an indicatif progress bar on stderr (hidden with `--quiet` and
/// when stderr is not a terminal).
#[derive(Debug)]
struct CliInstruments {
    bar: indicatif::ProgressBar,
    started: AtomicBool,
}

impl CliInstruments {
    fn new(show: bool) -> Self {
        let bar = if show && std::io::stderr().is_terminal() {
            let bar = indicatif::ProgressBar::new(0);
            if let Ok(style) = indicatif::ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bar:24} {pos}/{len} {prefix}: {wide_msg}",
            ) {
                bar.set_style(style);
            }
            bar.enable_steady_tick(Duration::from_millis(200));
            bar
        } else {
            indicatif::ProgressBar::hidden()
        };
        Self {
            bar,
            started: AtomicBool::new(false),
        }
    }
}

impl Instruments for CliInstruments {
    fn live_heap_bytes(&self) -> Option<u64> {
        Some(crate::bench_alloc::live_bytes())
    }

    fn cpu_time(&self) -> Option<Duration> {
        use nix::sys::resource::{UsageWho, getrusage};
        let usage = getrusage(UsageWho::RUSAGE_SELF).ok()?;
        let time = |t: nix::sys::time::TimeVal| {
            let secs = u64::try_from(t.tv_sec()).unwrap_or(0);
            let micros = u64::try_from(t.tv_usec()).unwrap_or(0);
            Duration::from_secs(secs) + Duration::from_micros(micros)
        };
        Some(time(usage.user_time()) + time(usage.system_time()))
    }

    fn begin(&self, phases: u64) {
        self.bar.set_length(phases);
    }

    fn phase(&self, label: &str) {
        if self.started.swap(true, Ordering::Relaxed) {
            self.bar.inc(1);
        }
        self.bar.set_prefix(label.to_owned());
        self.bar.set_message("");
    }

    fn detail(&self, text: &str) {
        self.bar.set_message(text.to_owned());
    }

    fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

/// `--charts DIR`: the growth charts of `report` (those it has data for).
fn write_charts(report: &Report, dir: &std::path::Path) -> Result<(), Failure> {
    std::fs::create_dir_all(dir)
        .map_err(|e| Failure::new(CONFIG, format!("cannot create {}: {e}", dir.display())))?;
    type Draw = fn(&Report) -> Result<String, String>;
    let charts: [(&str, Draw); 3] = [
        ("hold-cost.svg", distlock_bench::hold_cost_svg),
        ("clients-latency.svg", distlock_bench::clients_latency_svg),
        (
            "clients-primitives.svg",
            distlock_bench::clients_primitives_svg,
        ),
    ];
    for (file, draw) in charts {
        // A chart without data (its scenario did not run) is not written.
        let Ok(svg) = draw(report) else {
            continue;
        };
        let path = dir.join(file);
        std::fs::write(&path, svg)
            .map_err(|e| Failure::new(CONFIG, format!("cannot write {}: {e}", path.display())))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

/// Registers the hooks of the URL's backend (its crate's `bench` module: raw floors, server
/// counter), as the facade's registry gives them; `fenced`: its fenced floors too (see
/// `--fenced-floor`). A backend without hooks (in-process memory) gets none.
fn with_floor(target: Target, url: &str, fenced: bool) -> Target {
    match distlock::find_backend(url).ok().and_then(|b| b.bench) {
        Some(hooks) => target.with_hooks(hooks, url, fenced),
        None => target,
    }
}
