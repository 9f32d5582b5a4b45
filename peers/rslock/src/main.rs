//! Redis S1 (one client, uncontended acquire + release of one name, in a loop) of five sides in
//! one process, measured in blocks of 100 cycles that rotate (each side first in turn), as
//! `distlock bench` interleaves its floors:
//!
//! - `floor`: `SET NX PX` + `EVALSHA` compare-and-delete on a multiplexed connection of
//!   redis 0.32 (rslock's client library);
//! - `fenced`: the same, the `SET` in `MULTI` with `INCR` of a counter (a fencing token);
//! - `fenced-lua`: the same, `SET NX PX` + `INCR` in one script;
//! - `rslock`: rslock 0.7.4, `LockManager::lock` + `unlock` (no fencing, no renewal);
//! - `floor-1.8`: `floor` on redis 1.8 (distlock's client library), its default configuration;
//! - `distlock`: `distlock::connect` + `acquire` + `release`, default options, ttl 10 s
//!   (renewal on).
//!
//! Usage: `peer-rslock [URL] [CYCLES] [current|multi]`. Prints the mean time per cycle of each
//! side and the ratios that issue 21 (item 4) asks about.

use std::error::Error;
use std::time::{Duration, Instant};

const BLOCK: u64 = 100;
const WARMUP: u64 = 500;
const SIDES: [&str; 6] = [
    "floor",
    "fenced",
    "fenced-lua",
    "rslock",
    "floor-1.8",
    "distlock",
];
const COMPARE_AND_DELETE: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
     return redis.call('DEL', KEYS[1]) else return 0 end";
const SET_AND_INCR: &str = "if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then \
     return redis.call('INCR', KEYS[2]) end return 0";

/// `SET name owner NX PX 30000` of the given client library (both versions build it alike).
macro_rules! set_nx {
    ($redis:ident, $name:expr, $owner:expr) => {
        $redis::cmd("SET")
            .arg($name)
            .arg($owner)
            .arg("NX")
            .arg("PX")
            .arg(30_000)
    };
}

fn main() -> Result<(), Box<dyn Error>> {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .unwrap_or_else(|| "redis://127.0.0.1:16379".into());
    let cycles: u64 = match args.next() {
        Some(text) => text
            .parse()
            .map_err(|e| format!("CYCLES must be a whole number ({text:?}: {e})"))?,
        None => 20_000,
    };
    let runtime = args.next().unwrap_or_else(|| "current".into());
    let rt = match runtime.as_str() {
        "current" => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?,
        "multi" => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?,
        other => return Err(format!("the runtime is current or multi, not {other:?}").into()),
    };
    let per_cycle = rt.block_on(run(&url, cycles))?;
    let us = |side: usize| per_cycle[side].as_secs_f64() * 1e6;
    let line: Vec<String> = SIDES
        .iter()
        .enumerate()
        .map(|(i, name)| format!("{name} {:.1} us ({:.3}x floor)", us(i), us(i) / us(0)))
        .collect();
    println!("{runtime}: {}", line.join(", "));
    println!(
        "{runtime}: fenced/rslock {:.3}, fenced-lua/rslock {:.3}, floor-1.8/floor {:.3}, distlock/rslock {:.3}, distlock/fenced {:.3}",
        us(1) / us(3),
        us(2) / us(3),
        us(4) / us(0),
        us(5) / us(3),
        us(5) / us(1)
    );
    Ok(())
}

async fn run(url: &str, cycles: u64) -> Result<Vec<Duration>, Box<dyn Error>> {
    let mut conn = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let delete = redis::Script::new(COMPARE_AND_DELETE);
    let set_and_incr = redis::Script::new(SET_AND_INCR);
    let mut conn18 = redis18::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let delete18 = redis18::Script::new(COMPARE_AND_DELETE);
    let rslock = rslock::LockManager::new(vec![url.to_owned()]);
    let distlock = distlock::connect(url).await?;
    let options = distlock::AcquireOptions::default().with_ttl(Duration::from_secs(10));
    let names: Vec<String> = SIDES
        .iter()
        .map(|side| format!("peer-rslock-{side}-{}", std::process::id()))
        .collect();
    let fence = |name: &str| format!("{{{name}}}:fence");
    let mut spent = vec![Duration::ZERO; SIDES.len()];
    let mut counter = 0u64;
    let blocks = (WARMUP + cycles).div_ceil(BLOCK);
    for block in 0..blocks {
        for turn in 0..SIDES.len() {
            let side = (usize::try_from(block)? + turn) % SIDES.len();
            let name = &names[side];
            let start = Instant::now();
            for _ in 0..BLOCK {
                let floor = side < 3 || side == 4;
                // A fresh owner value per cycle, as a lock library makes one (the floors only).
                let owner = if floor {
                    counter += 1;
                    format!("peer-{counter}")
                } else {
                    String::new()
                };
                let taken = match side {
                    0 => set_nx!(redis, name, &owner)
                        .query_async::<Option<String>>(&mut conn)
                        .await?
                        .is_some(),
                    1 => {
                        let (set, _token): (Option<String>, u64) = redis::pipe()
                            .atomic()
                            .add_command(set_nx!(redis, name, &owner).to_owned())
                            .incr(fence(name), 1)
                            .query_async(&mut conn)
                            .await?;
                        set.is_some()
                    }
                    2 => {
                        let token: u64 = set_and_incr
                            .key(name)
                            .key(fence(name))
                            .arg(&owner)
                            .arg(30_000)
                            .invoke_async(&mut conn)
                            .await?;
                        token > 0
                    }
                    3 => {
                        let lock = rslock
                            .lock(name.as_bytes(), Duration::from_secs(10))
                            .await
                            .map_err(|e| format!("rslock: {e}"))?;
                        rslock.unlock(&lock).await;
                        true
                    }
                    4 => {
                        let taken = set_nx!(redis18, name, &owner)
                            .query_async::<Option<String>>(&mut conn18)
                            .await?
                            .is_some();
                        let deleted: i64 = delete18
                            .key(name)
                            .arg(&owner)
                            .invoke_async(&mut conn18)
                            .await?;
                        taken && deleted == 1
                    }
                    _ => {
                        let guard = distlock.acquire(name, &options).await?;
                        guard.release().await?;
                        true
                    }
                };
                if !taken {
                    return Err(format!("{name:?} was held by somebody else").into());
                }
                if side < 3 {
                    let deleted: i64 = delete.key(name).arg(&owner).invoke_async(&mut conn).await?;
                    if deleted != 1 {
                        return Err(format!("{name:?} was not released").into());
                    }
                }
            }
            if block * BLOCK >= WARMUP {
                spent[side] += start.elapsed();
            }
        }
    }
    let measured = u32::try_from(blocks * BLOCK - WARMUP)?;
    Ok(spent.into_iter().map(|d| d / measured).collect())
}
