//! names: clients on random names of a large set, next to raw floor connections.

use super::*;

/// A small, fast generator (SplitMix64) for name picks: no cryptographic need.
pub(super) struct Pick(u64);

impl Pick {
    fn new(client: usize) -> Self {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        Self(u64::from(nanos) ^ (client as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15))
    }

    /// A number below `bound` (which is at least 1).
    fn below(&mut self, bound: usize) -> usize {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z % bound.max(1) as u64) as usize
    }
}

/// What every names loop shares: the window and the count measured so far.
pub(super) struct Window {
    measure_from: Instant,
    measure_until: Instant,
    measured: AtomicU64,
    stop: AtomicBool,
}

impl Window {
    fn new(config: &BenchConfig) -> Arc<Self> {
        let measure_from = Instant::now() + config.s2_warmup;
        Arc::new(Self {
            measure_from,
            measure_until: measure_from + config.duration,
            measured: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        })
    }

    fn running(&self) -> bool {
        !self.stop.load(Ordering::Relaxed) && Instant::now() < self.measure_until
    }

    fn inside(&self, at: Instant) -> bool {
        at >= self.measure_from && at < self.measure_until
    }
}

/// Waits for every task, showing progress; the first error (by task) is returned.
pub(super) async fn join<T: Send + 'static>(
    handles: Vec<tokio::task::JoinHandle<Result<T, Error>>>,
    window: &Window,
    config: &BenchConfig,
    instruments: &dyn Instruments,
    what: &str,
) -> Result<Vec<T>, Error> {
    let deadline = window.measure_until + config.acquire_wait + config.ttl + Duration::from_secs(5);
    let aborts: Vec<_> = handles
        .iter()
        .map(tokio::task::JoinHandle::abort_handle)
        .collect();
    let mut joined = std::pin::pin!(futures::future::join_all(handles));
    let outcomes = loop {
        if Instant::now() >= deadline {
            aborts.iter().for_each(tokio::task::AbortHandle::abort);
            return Err(Error::Backend {
                message: format!("{what} did not finish in time"),
                source: None,
            });
        }
        match tokio::time::timeout(Duration::from_millis(250), joined.as_mut()).await {
            Ok(outcomes) => break outcomes,
            Err(_) => instruments.detail(&format!(
                "{what}: {} measured",
                window.measured.load(Ordering::Relaxed)
            )),
        }
    };
    let mut values = Vec::with_capacity(outcomes.len());
    for outcome in outcomes {
        match outcome {
            Ok(Ok(value)) => values.push(value),
            Ok(Err(e)) => return Err(e),
            Err(join) => {
                return Err(Error::Backend {
                    message: format!("a {what} task failed: {join}"),
                    source: None,
                });
            }
        }
    }
    Ok(values)
}

/// What [`names`] did with one primitive.
pub(super) enum Named {
    /// It ran.
    Ran(NamesResult),
    /// The backend lacks the primitive: why.
    Lacks(String),
}

/// The primitives names runs, in order: the mutex always (beside the raw floor), then each
/// other one of [`BenchConfig::growth_kinds`].
pub(super) fn names_kinds(config: &BenchConfig) -> impl Iterator<Item = GrowthKind> + '_ {
    let others = config
        .growth_kinds
        .iter()
        .filter(|k| **k != GrowthKind::Mutex);
    std::iter::once(GrowthKind::Mutex).chain(others.copied())
}

/// The scenario's name for `kind` in phases, skips and errors: `names`, `names rw`, ...
pub(super) fn names_scenario(kind: GrowthKind) -> String {
    match kind {
        GrowthKind::Mutex => "names".to_owned(),
        kind => format!("names {}", kind.as_str()),
    }
}

/// Names for `kind`: the mutex beside the raw floor; the read-write lock (the read/write mix
/// of [`BenchConfig::write_share`]) and the semaphore alone, a floor being a mutex.
pub(super) async fn names(
    target: &Target,
    config: &BenchConfig,
    instruments: &dyn Instruments,
    base: &str,
    kind: GrowthKind,
    backend: &mut Option<String>,
) -> Result<Named, Error> {
    let label = target.label();
    let count = config.names_clients;
    let all: Arc<Vec<String>> =
        Arc::new((0..config.names).map(|i| format!("{base}/{i}")).collect());
    let mix = kind.mix(config);

    // The raw floor first: each connection on the names i with i % count == its index, so that
    // no two floor cycles ever meet on one name (a raw cycle cannot wait).
    let mut floors = Vec::with_capacity(count);
    if mix.is_none() {
        // A phase of its own whether or not the target has a floor (see `phases`).
        instruments.phase(&format!("{label} names: raw floor"));
        if target.has_floor() {
            for _ in 0..count {
                floors.extend(target.floor().await?);
            }
        }
    }
    let (floor_label, floor_cycles_per_sec) = if floors.is_empty() {
        (None, None)
    } else {
        let label = floors.first().map(|f| f.label().to_owned());
        let window = Window::new(config);
        let handles = floors
            .into_iter()
            .enumerate()
            .map(|(id, floor)| {
                let own: Vec<String> = all.iter().skip(id).step_by(count).cloned().collect();
                tokio::spawn(floor_loop(id, floor, own, window.clone(), config.hold))
            })
            .collect();
        let cycles: u64 = join(handles, &window, config, instruments, "names floor")
            .await?
            .into_iter()
            .sum();
        (label, Some(rate(cycles, config.duration)))
    };

    let scenario = names_scenario(kind);
    instruments.phase(&format!("{label} {scenario}: {count} clients"));
    let clients = crate::connect(target, count, backend).await?;
    if let (Some(mix), Some(first)) = (mix, clients.first())
        && let Some(reason) = mix.unsupported(first.backend(), first.capabilities())
    {
        return Ok(Named::Lacks(reason));
    }
    let window = Window::new(config);
    let options = AcquireOptions::default()
        .with_ttl(config.ttl)
        .with_wait(config.acquire_wait);
    let handles = clients
        .into_iter()
        .enumerate()
        .map(|(id, client)| {
            let loop_ = names_loop(
                id,
                client,
                all.clone(),
                window.clone(),
                (options.clone(), mix),
                config.hold,
            );
            tokio::spawn(loop_)
        })
        .collect();
    let outcomes = join(handles, &window, config, instruments, &scenario).await?;
    let mut wait = Recorder::new();
    let (mut acquisitions, mut lost) = (0, 0);
    for (n, l, w) in outcomes {
        acquisitions += n;
        lost += l;
        wait.merge(&w);
    }
    let acquisitions_per_sec = rate(acquisitions, config.duration);
    Ok(Named::Ran(NamesResult {
        kind,
        names: config.names,
        clients: count,
        acquisitions,
        acquisitions_per_sec,
        acquire_wait: wait.summary(),
        lost,
        floor_label,
        floor_cycles_per_sec,
        floor_ratio: floor_cycles_per_sec
            .filter(|f| *f > 0.0)
            .map(|f| acquisitions_per_sec / f),
        one_name_per_sec: None,
        one_name_ratio: None,
    }))
}

pub(super) async fn floor_loop(
    id: usize,
    mut floor: Box<dyn RawFloor>,
    names: Vec<String>,
    window: Arc<Window>,
    hold: Duration,
) -> Result<u64, Error> {
    let mut pick = Pick::new(id);
    let mut cycles = 0;
    if names.is_empty() {
        return Ok(0);
    }
    while window.running() {
        let name = &names[pick.below(names.len())];
        if let Err(e) = floor.cycle(name).await {
            window.stop.store(true, Ordering::Relaxed);
            return Err(e);
        }
        if window.inside(Instant::now()) {
            cycles += 1;
            window.measured.fetch_add(1, Ordering::Relaxed);
        }
        tokio::time::sleep(hold).await;
    }
    Ok(cycles)
}

pub(super) async fn names_loop(
    id: usize,
    client: Arc<dyn DistributedLock>,
    names: Arc<Vec<String>>,
    window: Arc<Window>,
    (options, mix): (AcquireOptions, Option<Mix>),
    hold: Duration,
) -> Result<(u64, u64, Recorder), Error> {
    let mut pick = Pick::new(id);
    let (mut acquisitions, mut lost) = (0, 0);
    let mut wait = Recorder::new();
    let mut n = 0;
    while window.running() {
        let name = &names[pick.below(names.len())];
        let kinded;
        let options = match mix {
            None => &options,
            Some(mix) => {
                kinded = options.clone().with_kind(mix.kind_of(id, n));
                &kinded
            }
        };
        n += 1;
        let asked = Instant::now();
        let guard = match client.acquire(name, options).await {
            Ok(guard) => guard,
            Err(e) => {
                window.stop.store(true, Ordering::Relaxed);
                return Err(e);
            }
        };
        let acquired = Instant::now();
        if window.inside(acquired) {
            acquisitions += 1;
            window.measured.fetch_add(1, Ordering::Relaxed);
            wait.record(acquired - asked);
        }
        tokio::time::sleep(hold).await;
        if guard.is_lost() {
            lost += 1;
        }
        if let Err(e) = guard.release().await {
            window.stop.store(true, Ordering::Relaxed);
            return Err(e);
        }
    }
    Ok((acquisitions, lost, wait))
}
