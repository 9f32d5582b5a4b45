//! S1 and S2 of the shared benchmark on etcd, next to the raw floors (txn create + delete, and
//! etcd's own Lock API). Endpoints from `DISTLOCK_TEST_ETCD_ENDPOINTS` (default
//! `http://127.0.0.1:12379`).
//!
//! ```text
//! cargo run --release -p lock-etcd --all-features --example bench
//! ```

use distlock_bench::{BenchConfig, ScenarioSelection};
use distlock_etcd::EtcdConfig;
use distlock_etcd::bench::{lock_api_target, target};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let endpoints = std::env::var("DISTLOCK_TEST_ETCD_ENDPOINTS")
        .unwrap_or_else(|_| "http://127.0.0.1:12379".into());
    let config = EtcdConfig::new(endpoints.split(','))?.with_prefix("distlock-bench")?;
    let bench = BenchConfig::default()
        .with_cycles(3_000)
        .with_warmup_cycles(300);
    let report = distlock_bench::run(&[target("etcd", &config)], &bench).await?;
    println!("{}", report.to_markdown());
    let s1 = bench.with_scenarios(ScenarioSelection::S1);
    let report = distlock_bench::run(&[lock_api_target("etcd vs Lock API", &config)], &s1).await?;
    println!("{}", report.to_markdown());
    Ok(())
}
