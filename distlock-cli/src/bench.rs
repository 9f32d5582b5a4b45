//! `distlock bench`: the shared lock-bench scenarios against one or more URLs, each next to its
//! backend's raw floor.

use distlock_bench::{BenchArgs, Target};

use crate::exit::{CONFIG, Failure, OTHER};

/// Flags of `distlock bench`.
#[derive(Debug, clap::Args)]
pub(crate) struct CliBenchArgs {
    /// A lock service URL to measure; repeat for a side-by-side comparison (default:
    /// DISTLOCK_URL, else the per-user SQLite file).
    #[arg(long = "url", env = "DISTLOCK_URL", hide_env_values = true)]
    urls: Vec<String>,

    #[command(flatten)]
    bench: BenchArgs,
}

pub(crate) async fn bench(args: CliBenchArgs) -> Result<u8, Failure> {
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
            "some scenarios failed or saw exclusivity violations (see the table)",
        ));
    }
    Ok(0)
}

/// Registers the raw floor of the URL's backend, when it is compiled in.
fn with_floor(target: Target, url: &str) -> Target {
    let scheme = url.split("://").next().unwrap_or_default();
    let url = url.to_owned();
    match scheme {
        #[cfg(feature = "redis")]
        "redis" | "rediss" => target.with_floor(move || {
            let url = url.clone();
            async move {
                let floor = distlock_redis::bench::RedisFloor::connect(&url).await?;
                Ok(Box::new(floor) as Box<dyn distlock_bench::RawFloor>)
            }
        }),
        #[cfg(feature = "redis")]
        "redlock" => target.with_floor(move || {
            let nodes = redlock_nodes(&url);
            async move {
                let floor = distlock_redis::bench::RedlockFloor::connect(&nodes).await?;
                Ok(Box::new(floor) as Box<dyn distlock_bench::RawFloor>)
            }
        }),
        #[cfg(feature = "etcd")]
        "etcd" => target.with_floor(move || {
            let url = url.clone();
            async move {
                let config = distlock_etcd::EtcdConfig::from_url(&url)?;
                let floor = distlock_etcd::bench::TxnFloor::connect(&config).await?;
                Ok(Box::new(floor) as Box<dyn distlock_bench::RawFloor>)
            }
        }),
        #[cfg(feature = "zookeeper")]
        "zk" => target.with_floor(move || {
            let url = url.clone();
            async move {
                let config = distlock_zookeeper::ZkConfig::from_url(&url)?;
                let floor = distlock_zookeeper::bench::ZkFloor::connect(&config).await?;
                Ok(Box::new(floor) as Box<dyn distlock_bench::RawFloor>)
            }
        }),
        #[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
        s if s.starts_with("sqlite")
            || s == "postgres"
            || s == "postgresql"
            || s == "mysql"
            || s == "mariadb" =>
        {
            target.with_floor(move || {
                let url = url.clone();
                async move {
                    let floor = distlock_sql::bench::SqlFloor::connect(&url).await?;
                    Ok(Box::new(floor) as Box<dyn distlock_bench::RawFloor>)
                }
            })
        }
        _ => {
            let _ = url;
            target
        }
    }
}

/// `redlock://h1:p1,h2:p2/db?opts` -> `redis://h1:p1/db`, ...
#[cfg(feature = "redis")]
fn redlock_nodes(url: &str) -> Vec<String> {
    let rest = url.trim_start_matches("redlock://");
    let rest = rest.split('?').next().unwrap_or_default();
    let (hosts, db) = rest.split_once('/').unwrap_or((rest, ""));
    hosts
        .split(',')
        .filter(|h| !h.is_empty())
        .map(|h| {
            if db.is_empty() {
                format!("redis://{h}")
            } else {
                format!("redis://{h}/{db}")
            }
        })
        .collect()
}
