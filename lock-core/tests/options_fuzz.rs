//! Fuzz target for every acquisition option and client setting: extreme and random values
//! through the public API must give `Ok` or a typed error, never a panic.
//!
//! A seeded generator runs `FUZZ_CASES` cases (default 3000, under a second in CI); run it longer
//! with `FUZZ_CASES=100000 FUZZ_SEED=7 cargo test -p distlock-core --test options_fuzz`.

use rand::rngs::StdRng;
use rand::{RngCore as _, SeedableRng as _};
use std::time::Duration;

use distlock_core::memory::{MemoryBackend, MemoryStore};
use distlock_core::{
    AcquireOptions, Backoff, ClientConfig, DistributedLock, LockClient, OwnerId, Renewal,
};

/// rand's seeded generator, deterministic per seed, and the picks this target makes.
struct Rng(StdRng);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0.next_u64()
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[(self.next() % items.len() as u64) as usize]
    }

    fn duration(&mut self) -> Duration {
        match self.next() % 8 {
            0 => Duration::ZERO,
            1 => Duration::from_nanos(1),
            2 => Duration::MAX,
            3 => Duration::from_secs(u64::MAX),
            4 => Duration::from_millis(self.next() % 50 + 1),
            5 => Duration::from_secs(self.next() % (400 * 24 * 3600)),
            6 => Duration::from_nanos(self.next()),
            _ => Duration::new(self.next(), (self.next() % 1_000_000_000) as u32),
        }
    }

    fn float(&mut self) -> f64 {
        self.pick(&[
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            -1.0,
            0.0,
            0.49,
            0.5,
            1.0,
            2.0,
            1e308,
            f64::MIN_POSITIVE,
        ])
    }
}

fn options(rng: &mut Rng) -> AcquireOptions {
    let mut renewal = if rng.next().is_multiple_of(4) {
        Renewal::disabled()
    } else {
        Renewal::auto()
    };
    if rng.next().is_multiple_of(2) {
        renewal = renewal.every(rng.duration());
    }
    if rng.next().is_multiple_of(2) {
        renewal = renewal.max_hold(rng.duration());
    }
    let mut backoff = Backoff::new(rng.duration(), rng.duration());
    backoff.factor = rng.float();
    let mut opts = AcquireOptions::default()
        .with_ttl(rng.duration())
        .with_renewal(renewal)
        .with_backoff(backoff);
    if !rng.next().is_multiple_of(3) {
        opts = opts.with_wait(rng.duration());
    }
    if rng.next().is_multiple_of(3)
        && let Ok(owner) = OwnerId::new(format!("owner-{}", rng.next() % 3))
    {
        opts = opts.with_owner(owner);
    }
    opts
}

fn config(rng: &mut Rng) -> ClientConfig {
    let mut config = ClientConfig::default().with_operation_timeout(rng.duration());
    config.drift_factor = rng.float();
    config.drift_fixed = rng.duration();
    config
}

#[tokio::test]
async fn no_option_value_panics() {
    let cases: u64 = std::env::var("FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3000);
    let seed: u64 = std::env::var("FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x5EED);
    let mut rng = Rng(StdRng::seed_from_u64(seed));
    let store = MemoryStore::new();
    // Holds "busy" so that a waiting acquire really waits (and is then cancelled).
    let holder = store.client();
    let _busy = holder
        .acquire("busy", &AcquireOptions::default())
        .await
        .unwrap();
    for case in 0..cases {
        let config = config(&mut rng);
        let opts = options(&mut rng);
        let Ok(client) = LockClient::with_config(MemoryBackend::new(store.clone()), config) else {
            continue; // rejected with a typed error: fine
        };
        let name = rng.pick(&["free", "busy"]);
        let bounded = Duration::from_millis(5);
        // Err or a timeout (a wait cut short) are both fine: only a panic is not.
        if let Ok(Ok(guard)) = tokio::time::timeout(bounded, client.acquire(name, &opts)).await {
            let _ = tokio::time::timeout(bounded, guard.renew()).await;
            let _ = tokio::time::timeout(bounded, guard.release()).await;
        }
        if let Ok(Some(guard)) = client.try_acquire(name, &opts).await {
            let _ = guard.valid_until();
            drop(guard); // released in the background
        }
        assert!(case < cases);
    }
}

#[tokio::test]
async fn a_wait_too_long_to_represent_waits_forever() {
    let store = MemoryStore::new();
    let holder = store.client();
    let held = holder
        .acquire("x", &AcquireOptions::default())
        .await
        .unwrap();
    let waiter = store.client();
    let opts = AcquireOptions::default().with_wait(Duration::MAX);
    let waiting = tokio::time::timeout(Duration::from_millis(50), waiter.acquire("x", &opts));
    assert!(
        waiting.await.is_err(),
        "still waiting, no panic, no timeout error"
    );
    held.release().await.unwrap();
    let guard = waiter.acquire("x", &opts).await.unwrap();
    guard.release().await.unwrap();
}
