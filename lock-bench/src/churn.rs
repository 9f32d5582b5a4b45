//! The churn growth scenario (issue 42): what names that are no longer used leave behind on
//! the server.
//!
//! One client acquires and releases [`BenchConfig::churn_names`] distinct names, each once,
//! [`BenchConfig::hold_concurrency`] at a time, then asks the backend what the server still
//! keeps for them ([`DistributedLock::footprint`] over the scenario's name prefix): at once,
//! and again after [`BenchConfig::churn_settle`] when that is not zero (a server that removes
//! objects later: Redis key expiry, ZooKeeper's container reaper).

use std::time::{Duration, Instant};

use distlock_core::{AcquireOptions, DistributedLock, Error, Footprint, LockGuard};
use futures::StreamExt as _;
use serde::Serialize;

use crate::growth::Instruments;
use crate::{BenchConfig, Target};

/// What the server kept for the names of the churn scenario, as counted once.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct Leftover {
    /// When it was counted, from the end of the last release.
    pub after_ms: f64,
    /// Every object left (keys, rows, nodes, entries).
    pub objects: u64,
    /// `objects` per name of the scenario.
    pub per_name: f64,
    /// The objects by kind, as the backend names them.
    pub parts: Vec<(String, u64)>,
}

impl Leftover {
    fn new(footprint: &Footprint, names: usize, after: Duration) -> Self {
        let objects = footprint.objects();
        Self {
            after_ms: after.as_secs_f64() * 1000.0,
            objects,
            per_name: objects as f64 / names.max(1) as f64,
            parts: footprint
                .parts
                .iter()
                .map(|(kind, n)| ((*kind).to_owned(), *n))
                .collect(),
        }
    }

    fn parts_text(&self) -> String {
        let parts: Vec<String> = self
            .parts
            .iter()
            .filter(|(_, n)| *n > 0)
            .map(|(kind, n)| format!("{kind} {n}"))
            .collect();
        if parts.is_empty() {
            "-".to_owned()
        } else {
            parts.join(", ")
        }
    }
}

/// Churn: distinct names acquired and released once each, and what the server kept.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct ChurnResult {
    /// Distinct names, each acquired and released once.
    pub names: usize,
    /// Acquisitions (and releases) in flight at once.
    pub concurrency: usize,
    /// Time for all the acquisitions and releases.
    pub elapsed_ms: f64,
    /// Acquire + release cycles per second.
    pub cycles_per_sec: f64,
    /// Guards that were lost before their release (must be 0).
    pub lost: u64,
    /// What the objects are (`"keys"`, `"rows"`, `"nodes"`, `"entries"`); `None` when the
    /// backend cannot count them.
    pub unit: Option<String>,
    /// Counted right after the last release.
    pub at_once: Option<Leftover>,
    /// Counted again after [`BenchConfig::churn_settle`], when that is not zero.
    pub settled: Option<Leftover>,
}

/// Runs the churn scenario on `target`; names under `base`.
pub(crate) async fn churn(
    target: &Target,
    config: &BenchConfig,
    instruments: &dyn Instruments,
    base: &str,
    backend: &mut Option<String>,
) -> Result<ChurnResult, Error> {
    let label = target.label();
    let count = config.churn_names;
    instruments.phase(&format!("{label} churn: {count} names"));
    let client = target.connect().await?;
    *backend = Some(client.backend().to_owned());
    let prefix = format!("{base}/");
    let options = AcquireOptions::default()
        .with_ttl(config.ttl)
        .with_wait(config.acquire_wait);
    let started = Instant::now();
    let lost = cycle_all(&*client, &prefix, count, &options, config, instruments).await?;
    let elapsed = started.elapsed();
    let ended = Instant::now();

    instruments.detail("counting what is left");
    let at_once = client.footprint(&prefix).await?;
    let unit = at_once.as_ref().map(|f| f.unit.to_owned());
    let at_once = at_once.map(|f| Leftover::new(&f, count, ended.elapsed()));
    let mut settled = None;
    if !config.churn_settle.is_zero() && unit.is_some() {
        instruments.phase(&format!("{label} churn: settling"));
        let until = ended + config.churn_settle;
        loop {
            let now = Instant::now();
            if now >= until {
                break;
            }
            instruments.detail(&format!(
                "settling: {:.0}s / {:.0}s",
                (now - ended).as_secs_f64(),
                config.churn_settle.as_secs_f64()
            ));
            tokio::time::sleep((until - now).min(Duration::from_millis(500))).await;
        }
        settled = client
            .footprint(&prefix)
            .await?
            .map(|f| Leftover::new(&f, count, ended.elapsed()));
    }
    Ok(ChurnResult {
        names: count,
        concurrency: config.hold_concurrency,
        elapsed_ms: elapsed.as_secs_f64() * 1000.0,
        cycles_per_sec: count as f64 / elapsed.as_secs_f64().max(1e-9),
        lost,
        unit,
        at_once,
        settled,
    })
}

/// Acquires and releases `{prefix}{i}` for every i below `count`, `config.hold_concurrency`
/// at a time. Returns how many guards were lost before their release.
async fn cycle_all(
    client: &dyn DistributedLock,
    prefix: &str,
    count: usize,
    options: &AcquireOptions,
    config: &BenchConfig,
    instruments: &dyn Instruments,
) -> Result<u64, Error> {
    let mut cycles = futures::stream::iter(0..count)
        .map(|i| async move {
            let guard: LockGuard = client.acquire(&format!("{prefix}{i}"), options).await?;
            match guard.release().await {
                Ok(()) => Ok(0),
                Err(Error::Lost { .. }) => Ok(1),
                Err(e) => Err(e),
            }
        })
        .buffer_unordered(config.hold_concurrency);
    let (mut done, mut lost) = (0, 0);
    let mut shown = Instant::now();
    while let Some(outcome) = cycles.next().await {
        lost += outcome?;
        done += 1;
        if shown.elapsed() >= Duration::from_millis(250) {
            shown = Instant::now();
            instruments.detail(&format!("acquired and released {done} / {count}"));
        }
    }
    Ok(lost)
}

fn leftover_cells(leftover: Option<&Leftover>) -> (String, String, String) {
    leftover.map_or_else(
        || ("n/a".to_owned(), "n/a".to_owned(), "-".to_owned()),
        |l| {
            (
                l.objects.to_string(),
                format!("{:.3}", l.per_name),
                l.parts_text(),
            )
        },
    )
}

/// The churn table of every target that ran it, or nothing.
pub(crate) fn markdown(report: &crate::Report) -> String {
    use std::fmt::Write as _;
    let rows: Vec<_> = report
        .targets
        .iter()
        .filter_map(|t| {
            t.growth
                .as_ref()
                .and_then(|g| g.churn.as_ref())
                .map(|c| (t, c))
        })
        .collect();
    let mut out = String::new();
    if rows.is_empty() {
        return out;
    }
    let c = &report.config;
    let _ = writeln!(
        out,
        "\n### Churn: {} distinct names, each acquired and released once ({} in flight, ttl {})\n",
        c.churn_names,
        c.hold_concurrency,
        humantime::format_duration(c.ttl),
    );
    out.push_str("| target | cycles/s | lost | unit | left at once | per name | by kind | left after settling | per name | by kind |\n");
    out.push_str("|---|--:|--:|---|--:|--:|---|--:|--:|---|\n");
    for (t, churn) in rows {
        let (now, now_per, now_parts) = leftover_cells(churn.at_once.as_ref());
        let (later, later_per, later_parts) = match &churn.settled {
            Some(s) => {
                let (a, b, c) = leftover_cells(Some(s));
                (format!("{a} (after {:.0} s)", s.after_ms / 1000.0), b, c)
            }
            None => ("-".to_owned(), "-".to_owned(), "-".to_owned()),
        };
        let lost = if churn.lost > 0 {
            format!("**{}**", churn.lost)
        } else {
            "0".to_owned()
        };
        let _ = writeln!(
            out,
            "| {} | {:.0} | {lost} | {} | {now} | {now_per} | {now_parts} | {later} | {later_per} | {later_parts} |",
            t.target,
            churn.cycles_per_sec,
            churn.unit.as_deref().unwrap_or("n/a"),
        );
    }
    out
}
