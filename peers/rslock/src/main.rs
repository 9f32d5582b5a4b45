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
//!
//! `peer-rslock s2 URL,URL,URL [SECONDS] [CLIENTS] [ROUNDS] [current|multi]`: Redlock S2 of
//! rslock and distlock on those masters, in alternating rounds (see the `s2` module).

mod s2;

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
    let mut args = std::env::args().skip(1).peekable();
    if args.peek().map(String::as_str) == Some("s2") {
        args.next();
        return contended(args.collect());
    }
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
    let rt = runtime_of(&runtime)?;
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

/// The `s2` mode: parses its arguments, runs the rounds, prints a Markdown table.
fn contended(args: Vec<String>) -> Result<(), Box<dyn Error>> {
    let arg = |i: usize| args.get(i).map(String::as_str);
    let masters: Vec<String> = arg(0)
        .unwrap_or("redis://127.0.0.1:16379,redis://127.0.0.1:16380,redis://127.0.0.1:16381")
        .split(',')
        .map(|m| {
            if m.contains("://") {
                m.to_owned()
            } else {
                format!("redis://{m}")
            }
        })
        .collect();
    let number = |i: usize, default: u64, what: &str| -> Result<u64, String> {
        arg(i).map_or(Ok(default), |text| {
            text.parse()
                .map_err(|e| format!("{what} must be a whole number ({text:?}: {e})"))
        })
    };
    let seconds = number(1, 5, "SECONDS")?;
    let clients = usize::try_from(number(2, 4, "CLIENTS")?)?;
    let rounds = usize::try_from(number(3, 3, "ROUNDS")?)?;
    if clients < 2 || seconds == 0 || rounds == 0 {
        return Err("CLIENTS must be at least 2, SECONDS and ROUNDS at least 1".into());
    }
    let runtime = arg(4).unwrap_or("multi");
    let rt = runtime_of(runtime)?;
    let rows = rt.block_on(s2::run(
        &masters,
        std::time::Duration::from_secs(seconds),
        clients,
        rounds,
    ))?;
    println!(
        "Redlock S2 on {} masters, {clients} clients, hold 1 ms, {seconds} s a round, {runtime} runtime\n",
        masters.len()
    );
    println!(
        "| round | side | cs/s | held % | handoff p50 / p99 us | min / max share | longest wait ms | overlaps |"
    );
    println!("|--:|---|--:|--:|--:|--:|--:|--:|");
    for (i, r) in rows.iter().enumerate() {
        println!(
            "| {} | {} | {:.0} | {:.1} | {:.0} / {:.0} | {:.2} / {:.2} | {:.1} | {} |",
            i / s2::SIDES.len() + 1,
            r.side,
            r.per_second,
            r.held * 100.0,
            r.handoff_p50_us,
            r.handoff_p99_us,
            r.min_share,
            r.max_share,
            r.longest_wait_ms,
            r.overlaps
        );
    }
    for side in s2::SIDES {
        let of: Vec<f64> = rows
            .iter()
            .filter(|r| r.side == side)
            .map(|r| r.per_second)
            .collect();
        let mean = of.iter().sum::<f64>() / of.len() as f64;
        println!("\n{side}: mean {mean:.0} cs/s over {} rounds", of.len());
    }
    Ok(())
}

/// The tokio runtime named `current` or `multi`.
fn runtime_of(name: &str) -> Result<tokio::runtime::Runtime, Box<dyn Error>> {
    let mut builder = match name {
        "current" => tokio::runtime::Builder::new_current_thread(),
        "multi" => tokio::runtime::Builder::new_multi_thread(),
        other => return Err(format!("the runtime is current or multi, not {other:?}").into()),
    };
    Ok(builder.enable_all().build()?)
}
