//! What recording metrics costs per acquisition: `try_acquire` + `release` cycles on the
//! in-memory backend, on a current-thread and a multi-thread runtime, with no recorder and
//! with metrics-util's debugging recorder (an atomic add per counter, a sample pushed per
//! histogram).
//!
//! `cargo run -p distlock-core --example metrics_overhead [CYCLES]`; compare with the same
//! program built from a commit before metrics for the cost of the instrumentation itself.

use std::time::{Duration, Instant};

use distlock_core::memory::{MemoryBackend, MemoryStore};
use distlock_core::{AcquireOptions, DistributedLock, LockClient};
use metrics_util::debugging::DebuggingRecorder;

fn cycles_per_run() -> u32 {
    std::env::args()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(20_000)
}

/// The mean time of one try_acquire + release cycle, best of 15 runs (the minimum filters
/// out the noise of other processes on a shared machine).
fn measure(runtime: &tokio::runtime::Runtime, client: &LockClient<MemoryBackend>) -> Duration {
    let opts = AcquireOptions::default();
    let cycles = cycles_per_run();
    let mut best = Duration::MAX;
    for _ in 0..15 {
        let took = runtime.block_on(async {
            let started = Instant::now();
            for _ in 0..cycles {
                let guard = client.try_acquire("overhead", &opts).await;
                guard
                    .expect("memory")
                    .expect("free")
                    .release()
                    .await
                    .expect("held");
            }
            started.elapsed()
        });
        best = best.min(took / cycles);
    }
    best
}

fn main() {
    let flavours = [
        (
            "current_thread",
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build(),
        ),
        (
            "multi_thread",
            tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build(),
        ),
    ];
    for (flavour, runtime) in flavours {
        let runtime = runtime.expect("a runtime");
        let plain = LockClient::new(MemoryBackend::new(MemoryStore::new()));
        let without = measure(&runtime, &plain);
        let recorder = DebuggingRecorder::new();
        let recorded = metrics::with_local_recorder(&recorder, || {
            LockClient::new(MemoryBackend::new(MemoryStore::new()))
        });
        let with = measure(&runtime, &recorded);
        let extra = with.as_nanos() as i128 - without.as_nanos() as i128;
        println!(
            "{flavour:>14}: no recorder {:>6} ns/cycle, debugging recorder {:>6} ns/cycle ({extra:+} ns)",
            without.as_nanos(),
            with.as_nanos()
        );
    }
}
