//! One contender of a multi-process contention test: loops acquire, hold, release on one name
//! for a while and prints one line per critical section, `acquired_us released_us waited_us`
//! (wall clock, microseconds), so that the lines of several processes can be merged into
//! handoff latencies by `contend.py` next to this file (`contend.py OUT1 OUT2 ...`).
//!
//! ```text
//! cargo run --release -p distlock-etcd --example contend -- URL NAME SECONDS [lockapi]
//! ```
//!
//! With `lockapi`, the same loop over etcd's own Lock API (the raw contended floor).

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use distlock_etcd::EtcdConfig;
use distlock_etcd::distlock_core::{AcquireOptions, ClientConfig, DistributedLock};

fn wall_us() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_env("DISTLOCK_LOG"))
        .with_writer(std::io::stderr)
        .init();
    let args: Vec<String> = std::env::args().collect();
    let (url, name) = (&args[1], &args[2]);
    let seconds: u64 = args[3].parse()?;
    let lock_api = args.get(4).is_some_and(|a| a == "lockapi");
    let hold = Duration::from_millis(1);
    let until = Instant::now() + Duration::from_secs(seconds);
    let mut lines = Vec::new();
    if lock_api {
        let config = EtcdConfig::from_url(url)?;
        let mut client =
            distlock_etcd::EtcdBackend::connect_client(&config, Duration::from_secs(5)).await?;
        let lease = client.lease_grant(60, None).await?.id();
        let key = format!("{}/lockapi/{name}", config.prefix());
        while Instant::now() < until {
            let asked = Instant::now();
            let options = distlock_etcd::etcd_client::LockOptions::new().with_lease(lease);
            let resp = client.lock(key.clone(), Some(options)).await?;
            let acquired = wall_us();
            let waited = asked.elapsed();
            tokio::time::sleep(hold).await;
            let released = wall_us();
            client.unlock(resp.key().to_vec()).await?;
            lines.push(format!("{acquired} {released} {}", waited.as_micros()));
        }
    } else {
        let client = distlock_etcd::connect(url, ClientConfig::default()).await?;
        let options = AcquireOptions::default().with_ttl(Duration::from_secs(10));
        while Instant::now() < until {
            let asked = Instant::now();
            let guard = client.acquire(name, &options).await?;
            let acquired = wall_us();
            let waited = asked.elapsed();
            tokio::time::sleep(hold).await;
            let released = wall_us();
            guard.release().await?;
            lines.push(format!("{acquired} {released} {}", waited.as_micros()));
        }
    }
    println!("{}", lines.join("\n"));
    Ok(())
}
