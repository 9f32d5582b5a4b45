//! `distlock bench`: the shared lock-bench scenarios against one or more URLs, each next to its
//! backend's raw floor.

use distlock_bench::Target;

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
        targets.push(with_floor(target, url));
    }
    let config = args.bench.config();
    let report = distlock_bench::run(&targets, &config)
        .await
        .map_err(|err| Failure::from_lock(&err, "benchmark"))?;
    println!("{}", report.to_markdown());
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

/// Registers the raw floor of the URL's backend (each backend crate's `bench::floor`), when
/// it is compiled in; the backend is found in the facade's scheme table.
fn with_floor(target: Target, url: &str) -> Target {
    let scheme = url
        .split_once(':')
        .map(|(scheme, _)| scheme.to_ascii_lowercase())
        .unwrap_or_default();
    let Some(backend) = distlock::SCHEMES
        .iter()
        .find(|s| s.enabled && s.names.contains(&scheme.as_str()))
        .map(|s| s.backend)
        .filter(|backend| *backend != "memory")
    // in-process: no server, no floor
    else {
        return target;
    };
    let target = target.with_floor({
        let url = url.to_owned();
        move || {
            let url = url.clone();
            async move { floor(backend, &url).await }
        }
    });
    if !has_contended_floor(backend) {
        return target;
    }
    let url = url.to_owned();
    target.with_contended_floor(move || {
        let url = url.clone();
        async move { contended_floor(backend, &url).await }
    })
}

/// Whether `backend` has a blocking lock of its own for S2's contended floor: etcd's Lock API,
/// ZooKeeper's ephemeral node with a watch, MySQL's `GET_LOCK`, PostgreSQL's advisory locks.
/// Redis has none (a raw Redis lock polls), nor has SQLite.
fn has_contended_floor(backend: &str) -> bool {
    matches!(backend, "etcd" | "zookeeper" | "mysql" | "postgres")
}

/// The contended floor of `backend` for `url` (see [`has_contended_floor`]).
async fn contended_floor(
    backend: &str,
    url: &str,
) -> Result<Box<dyn distlock_bench::ContendedFloor>, distlock::Error> {
    let _ = url;
    match backend {
        #[cfg(feature = "etcd")]
        "etcd" => distlock_etcd::bench::contended_floor(url).await,
        #[cfg(feature = "zookeeper")]
        "zookeeper" => distlock_zookeeper::bench::contended_floor(url).await,
        #[cfg(any(feature = "postgres", feature = "mysql"))]
        "postgres" | "mysql" => distlock_sql::bench::contended_floor(url)
            .await?
            .ok_or_else(|| distlock::Error::Unsupported("SQLite has no blocking lock".into())),
        other => Err(distlock::Error::Unsupported(format!(
            "no contended floor for the {other} backend"
        ))),
    }
}

/// The raw floor of `backend` (a [`distlock::Scheme::backend`] name) for `url`.
async fn floor(
    backend: &str,
    url: &str,
) -> Result<Box<dyn distlock_bench::RawFloor>, distlock::Error> {
    let _ = url;
    match backend {
        #[cfg(feature = "redis")]
        "redis" | "redlock" | "redis-sentinel" | "redis-cluster" => {
            distlock_redis::bench::floor(url).await
        }
        #[cfg(feature = "etcd")]
        "etcd" => distlock_etcd::bench::floor(url).await,
        #[cfg(feature = "zookeeper")]
        "zookeeper" => distlock_zookeeper::bench::floor(url).await,
        #[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
        "sqlite" | "postgres" | "mysql" => distlock_sql::bench::floor(url).await,
        other => Err(distlock::Error::Unsupported(format!(
            "no raw floor for the {other} backend"
        ))),
    }
}
