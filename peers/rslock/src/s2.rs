//! Redlock S2 (issue 44, item 3): C clients contend for one name on N masters, each holding
//! it 1 ms per critical section, for a window; rslock against distlock's `redlock://`, in
//! alternating rounds on the same masters.
//!
//! - `rslock`: `LockManager::acquire_no_guard` (rslock's own loop of `lock`, its default
//!   retries: 3 tries a call, a random pause of 0-200 ms between them) + `unlock`;
//! - `rslock-10ms`: the same with the pause at 0-10 ms (`set_retry(3, 10 ms)`), a user tuning
//!   it for contention;
//! - `distlock`: `acquire` (waits, fair handoff by default) + `release`, ttl 10 s.
//!
//! Each client has its own lock manager or connection (a process of its own, as in a
//! deployment). Every critical section checks that nobody else is inside (an overlap is
//! counted, never expected). Reported per side and round: critical sections per second, the
//! share of the window the lock was held, the handoff to another client (the holder starting
//! its release to the next holder's acquire returning) p50 / p99, the least and the most
//! served client's share of the critical sections, and the longest wait.

use std::error::Error;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The hold of every critical section (the timer makes it longer).
const HOLD: Duration = Duration::from_millis(1);
/// Before each measured window, every client runs this long unmeasured.
const WARMUP: Duration = Duration::from_millis(500);

/// The sides, in the order of the first round (then rotated).
pub const SIDES: [&str; 3] = ["rslock", "rslock-10ms", "distlock"];

/// One side's figures in one round.
#[derive(Debug, Clone)]
pub struct Round {
    pub side: &'static str,
    pub per_second: f64,
    pub held: f64,
    pub handoff_p50_us: f64,
    pub handoff_p99_us: f64,
    pub min_share: f64,
    pub max_share: f64,
    pub longest_wait_ms: f64,
    pub overlaps: u64,
}

/// What every client of a run records.
#[derive(Default)]
struct Shared {
    inside: AtomicBool,
    overlaps: AtomicU64,
    /// (client, the instant its release started) of the last critical section.
    last_release: Mutex<Option<(usize, Instant)>>,
    handoffs: Mutex<Vec<Duration>>,
    held: Mutex<Duration>,
}

/// A client's way to take and give up the lock.
enum Client {
    Rslock(rslock::LockManager),
    Distlock(Arc<dyn distlock::DistributedLock>),
}

impl Client {
    async fn open(side: &str, masters: &[String], url: &str) -> Result<Self, Box<dyn Error>> {
        Ok(match side {
            "distlock" => Client::Distlock(distlock::connect(url).await?),
            _ => {
                let mut manager = rslock::LockManager::new(masters.to_vec());
                if side == "rslock-10ms" {
                    manager.set_retry(3, Duration::from_millis(10));
                }
                Client::Rslock(manager)
            }
        })
    }
}

/// Runs `rounds` rounds of every side for `window` each with `clients` clients on the masters
/// `masters` (`redis://` URLs), distlock on `redlock://` over the same ones.
pub async fn run(
    masters: &[String],
    window: Duration,
    clients: usize,
    rounds: usize,
) -> Result<Vec<Round>, Box<dyn Error>> {
    let hosts: Vec<&str> = masters
        .iter()
        .map(|m| m.trim_start_matches("redis://").trim_end_matches('/'))
        .collect();
    let url = format!("redlock://{}", hosts.join(","));
    let mut out = Vec::new();
    for round in 0..rounds {
        for turn in 0..SIDES.len() {
            let side = SIDES[(round + turn) % SIDES.len()];
            let name = format!("peer-rslock-s2-{side}-{}-{round}", std::process::id());
            out.push(one(side, masters, &url, &name, window, clients).await?);
        }
    }
    Ok(out)
}

async fn one(
    side: &'static str,
    masters: &[String],
    url: &str,
    name: &str,
    window: Duration,
    clients: usize,
) -> Result<Round, Box<dyn Error>> {
    let shared = Arc::new(Shared::default());
    let mut opened = Vec::with_capacity(clients);
    for _ in 0..clients {
        opened.push(Client::open(side, masters, url).await?);
    }
    let start = Instant::now() + Duration::from_millis(50);
    let measure_from = start + WARMUP;
    let end = measure_from + window;
    let mut tasks = Vec::new();
    for (id, client) in opened.into_iter().enumerate() {
        let shared = shared.clone();
        let name = name.to_owned();
        tasks.push(tokio::spawn(async move {
            client_loop(id, client, &name, shared, start, measure_from, end).await
        }));
    }
    let mut counts = Vec::with_capacity(clients);
    let mut longest = Duration::ZERO;
    for task in tasks {
        let (count, wait) = task.await??;
        counts.push(count);
        longest = longest.max(wait);
    }
    let sections: u64 = counts.iter().sum();
    let fair = sections as f64 / clients as f64;
    let mut handoffs = std::mem::take(&mut *shared.handoffs.lock().map_err(|_| "poisoned")?);
    handoffs.sort_unstable();
    let at = |q: f64| {
        handoffs
            .get(((handoffs.len() as f64 - 1.0) * q).round() as usize)
            .map_or(f64::NAN, |d| d.as_secs_f64() * 1e6)
    };
    let held = *shared.held.lock().map_err(|_| "poisoned")?;
    Ok(Round {
        side,
        per_second: sections as f64 / window.as_secs_f64(),
        held: held.as_secs_f64() / window.as_secs_f64(),
        handoff_p50_us: at(0.5),
        handoff_p99_us: at(0.99),
        min_share: counts.iter().copied().min().unwrap_or(0) as f64 / fair,
        max_share: counts.iter().copied().max().unwrap_or(0) as f64 / fair,
        longest_wait_ms: longest.as_secs_f64() * 1e3,
        overlaps: shared.overlaps.load(Ordering::Relaxed),
    })
}

/// One client: take, hold 1 ms, give up, until `end`; counts its critical sections that
/// started in the window and its longest wait there. Returns (sections, longest wait).
async fn client_loop(
    id: usize,
    client: Client,
    name: &str,
    shared: Arc<Shared>,
    start: Instant,
    measure_from: Instant,
    end: Instant,
) -> Result<(u64, Duration), String> {
    tokio::time::sleep_until(start.into()).await;
    let ttl = Duration::from_secs(10);
    let options = distlock::AcquireOptions::default().with_ttl(ttl);
    let mut count = 0;
    let mut longest = Duration::ZERO;
    loop {
        let asked = Instant::now();
        if asked >= end {
            break;
        }
        enum Held {
            R(rslock::Lock),
            D(distlock::LockGuard),
        }
        let held = match &client {
            Client::Rslock(m) => Held::R(
                m.acquire_no_guard(name.as_bytes(), ttl)
                    .await
                    .map_err(|e| format!("rslock: {e:?}"))?,
            ),
            Client::Distlock(l) => Held::D(
                l.acquire(name, &options)
                    .await
                    .map_err(|e| format!("distlock: {e}"))?,
            ),
        };
        let got = Instant::now();
        if shared.inside.swap(true, Ordering::SeqCst) {
            shared.overlaps.fetch_add(1, Ordering::Relaxed);
        }
        let measured = got >= measure_from && got < end;
        if measured {
            count += 1;
            longest = longest.max(got - asked);
            if let Some((from, released)) = *shared.last_release.lock().map_err(|_| "poisoned")?
                && from != id
            {
                shared
                    .handoffs
                    .lock()
                    .map_err(|_| "poisoned")?
                    .push(got.saturating_duration_since(released));
            }
        }
        tokio::time::sleep(HOLD).await;
        let releasing = Instant::now();
        if measured {
            *shared.held.lock().map_err(|_| "poisoned")? += releasing - got;
        }
        *shared.last_release.lock().map_err(|_| "poisoned")? = Some((id, releasing));
        shared.inside.store(false, Ordering::SeqCst);
        match held {
            Held::R(lock) => {
                if let Client::Rslock(m) = &client {
                    m.unlock(&lock).await;
                }
            }
            Held::D(guard) => guard
                .release()
                .await
                .map_err(|e| format!("distlock: {e}"))?,
        }
    }
    Ok((count, longest))
}
