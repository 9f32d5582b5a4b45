//! The cases, each written once for every backend, by area. Each returns [`Outcome`] or panics
//! with what went wrong. [`CASES`](crate::CASES) lists them all (the one table the suite macro
//! and the disruptive-case list come from).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use distlock_core::{
    AcquireOptions, Backoff, DistributedLock, Error, FencingToken, LockGuard, LockName, LossReason,
    OwnerId, Renewal,
};
use futures::future::join_all;
use rand::Rng;

use crate::{Ctx, HookError, HookResult, Outcome, TestClient};

/// A wait long enough to never be the reason a case fails on a healthy server.
const LONG_WAIT: Duration = Duration::from_secs(60);

/// Turns a hook result into "go on", a skip, or a failure.
macro_rules! hook {
    ($result:expr) => {
        match $result {
            Ok(()) => {}
            Err(HookError::Unsupported(reason)) => return Outcome::Skipped(reason),
            Err(HookError::Failed(reason)) => panic!("fault hook failed: {reason}"),
        }
    };
}

fn long_ttl(ctx: &Ctx) -> Duration {
    let caps_max = ctx.harness().ttl() * 1000;
    Duration::from_secs(30).min(caps_max)
}

async fn acquire(client: &dyn DistributedLock, name: &str, opts: &AcquireOptions) -> LockGuard {
    match client
        .acquire(name, &opts.clone().with_wait(LONG_WAIT))
        .await
    {
        Ok(guard) => guard,
        Err(err) => panic!("acquire({name:?}) failed: {err}"),
    }
}

async fn try_acquire(
    client: &dyn DistributedLock,
    name: &str,
    opts: &AcquireOptions,
) -> Option<LockGuard> {
    match client.try_acquire(name, opts).await {
        Ok(guard) => guard,
        Err(err) => panic!("try_acquire({name:?}) failed: {err}"),
    }
}

async fn release(guard: LockGuard) {
    let name = guard.name().clone();
    if let Err(err) = guard.release().await {
        panic!("release({name:?}) failed: {err}");
    }
}

/// Polls `try_acquire` until it succeeds or `within` passes.
async fn acquire_within(
    client: &dyn DistributedLock,
    name: &str,
    opts: &AcquireOptions,
    within: Duration,
) -> Option<LockGuard> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(guard) = try_acquire(client, name, opts).await {
            return Some(guard);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Spawns `work` (which starts with a waiting acquire) and returns once that acquire waits: its
/// first poll found the lock taken, so on a FIFO backend it holds its place in the queue.
///
/// # Panics
/// If the acquire does not start waiting `within`.
async fn spawn_waiting<T: Send + 'static>(
    within: Duration,
    work: impl std::future::Future<Output = T> + Send + 'static,
) -> tokio::task::JoinHandle<T> {
    use tracing::instrument::WithSubscriber;
    let waiting = Arc::new(tokio::sync::Notify::new());
    let task = {
        let waiting = waiting.clone();
        tokio::spawn(work.with_subscriber(crate::child::on_waiting(move || waiting.notify_one())))
    };
    if tokio::time::timeout(within, waiting.notified())
        .await
        .is_err()
    {
        panic!("a waiter did not start waiting within {within:?}");
    }
    task
}

// After the helpers above: `hook!` is in scope for the modules declared below it.
mod admin;
mod elections;
mod exclusion;
mod faults;
mod input;
mod kinds;
mod leases;
mod processes;

pub use admin::*;
pub use elections::*;
pub use exclusion::*;
pub use faults::*;
pub use input::*;
pub use kinds::*;
pub use leases::*;
pub use processes::*;
