//! S1 and S2 of the shared benchmark on ZooKeeper, next to the raw floor (create
//! ephemeral-sequential + delete). Server from `DISTLOCK_TEST_ZK_CONNECT` (default
//! `127.0.0.1:12181`). The server's JVM is warmed up first.
//!
//! ```text
//! cargo run --release -p lock-zk --all-features --example bench
//! ```

use distlock_bench::BenchConfig;
use distlock_zookeeper::ZkConfig;
use distlock_zookeeper::bench::{ZkFloor, target};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let server =
        std::env::var("DISTLOCK_TEST_ZK_CONNECT").unwrap_or_else(|_| "127.0.0.1:12181".into());
    let config = ZkConfig::new(&format!("{server}/distlock-bench"))?;
    eprintln!("warming the server up...");
    ZkFloor::connect(&config).await?.warm_up(3_000).await?;
    let bench = BenchConfig::default()
        .with_cycles(5_000)
        .with_warmup_cycles(500);
    let report = distlock_bench::run(&[target("zookeeper", &config)], &bench).await?;
    println!("{}", report.to_markdown());
    Ok(())
}
