//! The lock-bench scenarios S1 (uncontended) and S2 (4 clients, one name, hold 1 ms) on every
//! database compiled in and configured, next to its raw floor (two single-row UPDATEs on one
//! connection):
//!
//! ```text
//! eval "$(scripts/services.sh env)"
//! cargo run --release -p lock-sql --all-features --example bench
//! ```
//!
//! PostgreSQL and MariaDB are measured when `DISTLOCK_TEST_POSTGRES_URL` /
//! `DISTLOCK_TEST_MYSQL_URL` are set; SQLite always, on a temporary file.
//! `DISTLOCK_BENCH_CYCLES` and `DISTLOCK_BENCH_SECONDS` shorten or lengthen the run.

use std::time::Duration;

use distlock_bench::{BenchConfig, RawFloor, Target};
use distlock_core::ClientConfig;
use distlock_sql::bench::SqlFloor;

fn target(label: &str, url: String) -> Target {
    let floor_url = url.clone();
    Target::new(label, move || {
        let url = url.clone();
        async move {
            Ok(distlock_sql::connect(&url, ClientConfig::default())
                .await?
                .into_dyn())
        }
    })
    .with_floor(move || {
        let url = floor_url.clone();
        async move { Ok(Box::new(SqlFloor::connect(&url).await?) as Box<dyn RawFloor>) }
    })
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() -> Result<(), distlock_core::Error> {
    let mut targets = Vec::new();
    if let Ok(url) = std::env::var("DISTLOCK_TEST_POSTGRES_URL") {
        targets.push(target("postgres", url));
    }
    if let Ok(url) = std::env::var("DISTLOCK_TEST_MYSQL_URL") {
        targets.push(target("mariadb", url));
    }
    let path = std::env::temp_dir().join(format!(
        "distlock-bench-{}.db",
        uuid::Uuid::new_v4().simple()
    ));
    targets.push(target("sqlite", format!("sqlite://{}", path.display())));
    let cycles = env_u64("DISTLOCK_BENCH_CYCLES", 5_000);
    let config = BenchConfig::default()
        .with_cycles(cycles)
        .with_warmup_cycles(cycles / 10)
        .with_clients(4)
        .with_hold(Duration::from_millis(1))
        .with_duration(Duration::from_secs(env_u64("DISTLOCK_BENCH_SECONDS", 5)));
    let report = distlock_bench::run(&targets, &config).await?;
    println!("{}", report.to_markdown());
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    if report.has_failures() {
        std::process::exit(1);
    }
    Ok(())
}
