//! hold-K: one client holding K locks, against the server's counter, CPU and heap.

use super::*;

/// Two back-to-back reads: what reading costs in the counter itself.
pub(super) async fn read_cost(counter: &mut dyn ServerCounter) -> Result<u64, Error> {
    let a = counter.read().await?;
    let b = counter.read().await?;
    Ok(b.saturating_sub(a))
}

/// Sleeps `window`, showing the time left.
pub(super) async fn wait_window(window: Duration, what: &str, instruments: &dyn Instruments) {
    let start = Instant::now();
    let end = start + window;
    loop {
        let now = Instant::now();
        if now >= end {
            break;
        }
        instruments.detail(&format!(
            "{what}: {:.0}s / {:.0}s",
            (now - start).as_secs_f64(),
            window.as_secs_f64()
        ));
        tokio::time::sleep((end - now).min(Duration::from_millis(500))).await;
    }
}

/// Hold-K of every primitive of [`BenchConfig::growth_kinds`] the backend has, one K after
/// another; a primitive the backend lacks goes to `skipped`.
#[expect(
    clippy::too_many_arguments,
    reason = "the scenario's inputs and its two outputs"
)]
pub(super) async fn hold(
    target: &Target,
    config: &BenchConfig,
    instruments: &dyn Instruments,
    mut counter: Option<&mut (dyn ServerCounter + '_)>,
    base: &str,
    backend: &mut Option<String>,
    result: &mut GrowthResult,
    skipped: &mut Vec<Skipped>,
) -> Result<(), Error> {
    let label = target.label();
    let window = config.hold_window();
    let ticks = window.as_secs_f64() / config.renewal_tick().as_secs_f64();
    let client = target.connect().await?;
    *backend = Some(client.backend().to_owned());

    let mut read_cost = 0;
    if let Some(counter) = counter.as_deref_mut() {
        instruments.phase(&format!("{label} hold: idle window"));
        let idle = idle_window(counter, window, ticks, instruments).await?;
        read_cost = idle.read_cost;
        result.idle = Some(idle);
    }
    let run = HoldRun {
        client: &*client,
        config,
        instruments,
        read_cost,
        idle_per_tick: result.idle.as_ref().map_or(0.0, |i| i.per_tick),
    };
    for &kind in &config.growth_kinds {
        let unsupported = kind
            .mix(config)
            .and_then(|mix| mix.unsupported(client.backend(), client.capabilities()));
        if let Some(reason) = unsupported {
            for &k in &config.hold_counts {
                instruments.phase(&format!("{label} hold {} K={k}: skipped", kind.as_str()));
            }
            skipped.push(Skipped {
                scenario: format!("hold {}", kind.as_str()),
                reason,
            });
            continue;
        }
        for &k in &config.hold_counts {
            instruments.phase(&format!("{label} hold {} K={k}", kind.as_str()));
            let name = format!("{base}/{}/{k}", kind.as_str());
            let point = run.hold_k(kind, k, &name, counter.as_deref_mut()).await?;
            result.hold.push(point);
        }
    }
    Ok(())
}

/// What every K of a hold run shares.
struct HoldRun<'a> {
    client: &'a dyn DistributedLock,
    config: &'a BenchConfig,
    instruments: &'a dyn Instruments,
    /// What a pair of counter reads adds to the counter.
    read_cost: u64,
    /// The server's idle requests per renewal tick.
    idle_per_tick: f64,
}

impl HoldRun<'_> {
    /// One client holding `k` locks of `kind` under `base`: acquired, settled for a renewal
    /// tick, held over the window, released.
    async fn hold_k(
        &self,
        kind: GrowthKind,
        k: usize,
        base: &str,
        mut counter: Option<&mut (dyn ServerCounter + '_)>,
    ) -> Result<HoldPoint, Error> {
        let (config, instruments) = (self.config, self.instruments);
        let options = AcquireOptions::default()
            .with_ttl(config.hold_ttl)
            .with_wait(config.acquire_wait)
            .with_kind(kind.lock_kind(config.permits));
        let heap_before = instruments.live_heap_bytes();
        let started = Instant::now();
        let guards = acquire_many(self.client, base, k, &options, config, instruments).await?;
        let acquire_ms = started.elapsed().as_secs_f64() * 1000.0;
        // The window measures the steady state: one renewal tick first, in which the locks'
        // schedules align and what the acquisitions left behind lands (a ZooKeeper loss watch
        // is set a tenth of the ttl after its acquisition; PostgreSQL publishes an idle
        // connection's counts up to 10 s late).
        let settle = counter
            .as_deref()
            .map_or(Duration::ZERO, ServerCounter::settle)
            .max(config.renewal_tick());
        wait_window(settle, &format!("settling with {k} locks"), instruments).await;

        let counted_before = read(counter.as_deref_mut()).await?;
        let cpu_before = instruments.cpu_time();
        let window_start = Instant::now();
        let window = config.hold_window();
        wait_window(window, &format!("holding {k} locks"), instruments).await;
        let held_for = window_start.elapsed();
        let cpu_after = instruments.cpu_time();
        // The heap of the steady state: after a renewal tick and the window, when every loss
        // watch is set and renewal has run.
        let heap_after = instruments.live_heap_bytes();
        let counted_after = read(counter).await?;
        let lost = guards.iter().filter(|g| g.is_lost()).count() as u64;
        let mut loss_reasons = std::collections::BTreeMap::new();
        for reason in guards.iter().filter_map(LockGuard::loss_reason) {
            *loss_reasons.entry(format!("{reason:?}")).or_insert(0) += 1;
        }

        instruments.detail(&format!("releasing {k} locks"));
        let started = Instant::now();
        // Losses after the window (while releasing) count too.
        let lost_at_release = release_many(guards, config.hold_concurrency).await?;
        let lost = lost.max(lost_at_release);
        let release_ms = started.elapsed().as_secs_f64() * 1000.0;

        let ticks = held_for.as_secs_f64() / config.renewal_tick().as_secs_f64();
        let server_requests = counted_before
            .zip(counted_after)
            .map(|(b, a)| a.saturating_sub(b).saturating_sub(self.read_cost));
        let requests_per_tick =
            server_requests.map(|r| (r as f64 / ticks - self.idle_per_tick).max(0.0));
        let cpu_percent = cpu_before
            .zip(cpu_after)
            .map(|(b, a)| a.saturating_sub(b).as_secs_f64() / held_for.as_secs_f64() * 100.0);
        let heap_bytes_per_guard = heap_before
            .zip(heap_after)
            .map(|(b, a)| (a as f64 - b as f64) / k as f64);
        Ok(HoldPoint {
            kind,
            locks: k,
            acquire_ms,
            release_ms,
            window_ms: held_for.as_secs_f64() * 1000.0,
            ticks,
            server_requests,
            requests_per_tick,
            requests_per_tick_per_lock: requests_per_tick.map(|r| r / k as f64),
            cpu_percent,
            heap_bytes_per_guard,
            lost,
            loss_reasons,
        })
    }
}

/// Acquires `{base}/{i}` for every i below `count`, `config.hold_concurrency` at a time.
pub(super) async fn acquire_many(
    client: &dyn DistributedLock,
    base: &str,
    count: usize,
    options: &AcquireOptions,
    config: &BenchConfig,
    instruments: &dyn Instruments,
) -> Result<Vec<LockGuard>, Error> {
    let names: Vec<String> = (0..count).map(|i| format!("{base}/{i}")).collect();
    let mut guards = Vec::with_capacity(count);
    let mut pending = futures::stream::iter(names.iter())
        .map(|name| client.acquire(name, options))
        .buffer_unordered(config.hold_concurrency);
    let mut shown = Instant::now();
    while let Some(guard) = pending.next().await {
        guards.push(guard?);
        if shown.elapsed() >= Duration::from_millis(250) {
            shown = Instant::now();
            instruments.detail(&format!("acquired {} / {count}", guards.len()));
        }
    }
    Ok(guards)
}

/// Releases every guard, `concurrency` at a time. Returns how many turned out lost (a lost
/// guard's release reports [`Error::Lost`], one the server no longer has
/// [`Error::NotHeld`]); any other error is returned once all ran.
pub(super) async fn release_many(guards: Vec<LockGuard>, concurrency: usize) -> Result<u64, Error> {
    let outcomes: Vec<_> = futures::stream::iter(guards)
        .map(LockGuard::release)
        .buffer_unordered(concurrency)
        .collect()
        .await;
    let mut lost = 0;
    let mut first = None;
    for outcome in outcomes {
        match outcome {
            Ok(()) => {}
            Err(Error::Lost { .. } | Error::NotHeld { .. }) => lost += 1,
            Err(e) => {
                first.get_or_insert(e);
            }
        }
    }
    first.map_or(Ok(lost), Err)
}

/// The server's requests over a `window` (`ticks` renewal ticks) with no lock held: the
/// background that hold-K's figures are measured above, and what a read of the counter costs.
async fn idle_window(
    counter: &mut dyn ServerCounter,
    window: Duration,
    ticks: f64,
    instruments: &dyn Instruments,
) -> Result<IdleWindow, Error> {
    let cost = read_cost(counter).await?;
    let before = counter.read().await?;
    wait_window(window, "idle, no lock held", instruments).await;
    let after = counter.read().await?;
    let requests = after.saturating_sub(before).saturating_sub(cost);
    Ok(IdleWindow {
        window_ms: window.as_secs_f64() * 1000.0,
        read_cost: cost,
        requests,
        per_tick: requests as f64 / ticks,
    })
}

/// The counter's value, if there is a counter.
async fn read(counter: Option<&mut (dyn ServerCounter + '_)>) -> Result<Option<u64>, Error> {
    match counter {
        Some(c) => c.read().await.map(Some),
        None => Ok(None),
    }
}
