//! Runs the lock-bench scenarios S1 (uncontended) and S2 (4 clients contending) on the Redis
//! backend, next to its raw floor: single master (default and fair mode) and Redlock over 3
//! and 5 masters.
//!
//! ```text
//! eval "$(scripts/services.sh env)"
//! cargo run --release -p lock-redis --all-features --example bench [-- --quick]
//! ```

use std::time::Duration;

use distlock_bench::{BenchConfig, RawFloor, Target};
use distlock_core::{ClientConfig, Error};
use distlock_redis::RedisConfig;
use distlock_redis::bench::{RedisFloor, RedlockFloor};

fn target(label: &str, config: RedisConfig, floor_urls: Vec<String>) -> Target {
    Target::new(label, move || {
        let config = config.clone();
        async move {
            let client = distlock_redis::connect_with(config, ClientConfig::default()).await?;
            Ok(client.into_dyn())
        }
    })
    .with_floor(move || {
        let urls = floor_urls.clone();
        async move {
            Ok(if urls.len() == 1 {
                Box::new(RedisFloor::connect(&urls[0]).await?) as Box<dyn RawFloor>
            } else {
                Box::new(RedlockFloor::connect(&urls).await?) as Box<dyn RawFloor>
            })
        }
    })
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let urls: Vec<String> = std::env::var("DISTLOCK_TEST_REDIS_URLS")
        .map_err(|_| {
            Error::InvalidConfig(
                "DISTLOCK_TEST_REDIS_URLS is not set: eval \"$(scripts/services.sh env)\"".into(),
            )
        })?
        .split(',')
        .map(str::to_owned)
        .collect();
    if urls.len() < 5 {
        return Err(Error::InvalidConfig(
            "DISTLOCK_TEST_REDIS_URLS needs 5 masters".into(),
        ));
    }
    let quick = std::env::args().any(|a| a == "--quick");
    let mut config = BenchConfig::default();
    if quick {
        config = config
            .with_cycles(1_000)
            .with_warmup_cycles(100)
            .with_duration(Duration::from_secs(1));
    }
    let one = vec![urls[0].clone()];
    let targets = [
        target("redis", RedisConfig::single(&urls[0])?, one.clone()),
        target(
            "redis fair",
            RedisConfig::single(&urls[0])?.with_fair(true),
            one,
        ),
        target(
            "redlock3",
            RedisConfig::redlock(&urls[..3])?,
            urls[..3].to_vec(),
        ),
        target(
            "redlock5",
            RedisConfig::redlock(&urls[..5])?,
            urls[..5].to_vec(),
        ),
    ];
    let report = distlock_bench::run(&targets, &config).await?;
    println!("{}", report.to_markdown());
    if report.has_failures() {
        return Err(Error::Backend {
            message: "some scenarios failed (see the report)".into(),
            source: None,
        });
    }
    Ok(())
}
