//! What a held guard costs on the client's heap in lock-core itself: the guard, its place in
//! the watchdog and, for a lease that watches for its loss, what the core keeps for that,
//! measured with a counting allocator over 10,000 guards whose lease allocates nothing.
//!
//! The backends add their lease (name, owner, keys) and their own loss watch to this; the
//! `distlock bench --scenario hold` figures in the README are the whole per-backend cost.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use distlock_core::backend::{Acquired, LossEpochs};
use distlock_core::memory::{MemoryBackend, MemoryStore};
use distlock_core::{
    AcquireOptions, AcquireRequest, Attempt, Capabilities, DistributedLock, FencingToken, Lease,
    LockBackend, LockClient, LossReason, Result, Step,
};
use futures::future::BoxFuture;

static LIVE: AtomicUsize = AtomicUsize::new(0);

/// `System`, counting the bytes it hands out and takes back.
struct Counting;

// SAFETY: every method forwards to `System` with the caller's arguments; the only addition is
// a relaxed atomic update, which neither allocates nor panics.
#[expect(unsafe_code, reason = "a counting GlobalAlloc that forwards to System")]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is passed on unchanged.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: `ptr` came from `alloc` (so from `System`) with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract is passed on unchanged.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
            LIVE.fetch_add(new_size, Ordering::Relaxed);
        }
        new
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// How a [`Free`] lease reports its loss.
#[derive(Clone, Debug)]
enum Watch {
    /// No loss watch (as the SQL backends).
    None,
    /// A future of its own per lease (as ZooKeeper's node watch).
    Own,
    /// One shared source for every lease (as a Redis server's restart watch).
    Shared(LossEpochs),
}

/// Grants every acquisition at once with a lease that allocates nothing of its own.
#[derive(Debug)]
struct Free {
    caps: Capabilities,
    watch: Watch,
}

struct FreeAttempt(Watch);

#[derive(Debug)]
struct FreeLease(Watch);

#[async_trait]
impl LockBackend for Free {
    fn name(&self) -> &'static str {
        "free"
    }

    fn capabilities(&self) -> Capabilities {
        self.caps.clone()
    }

    fn begin(&self, _request: AcquireRequest) -> Box<dyn Attempt> {
        Box::new(FreeAttempt(self.watch.clone()))
    }
}

#[async_trait]
impl Attempt for FreeAttempt {
    async fn poll(&mut self) -> Result<Step> {
        let lease = Box::new(FreeLease(self.0.clone()));
        Ok(Step::Acquired(Acquired::new(lease, FencingToken::new(1))))
    }

    async fn abandon(self: Box<Self>) -> Result<()> {
        Ok(())
    }
}

#[async_trait]
impl Lease for FreeLease {
    async fn renew(&self, _ttl: Duration) -> Result<()> {
        Ok(())
    }

    async fn release(&self) -> Result<()> {
        Ok(())
    }

    fn loss_signal(&self) -> Option<BoxFuture<'static, LossReason>> {
        match &self.0 {
            Watch::Own => Some(Box::pin(std::future::pending())),
            _ => None,
        }
    }

    fn shared_loss(&self) -> Option<(LossEpochs, u64)> {
        match &self.0 {
            Watch::Shared(epochs) => Some((epochs.clone(), epochs.current())),
            _ => None,
        }
    }
}

/// The heap bytes per guard of 10,000 guards held (with renewal on) through one client.
async fn per_guard(watch: Watch) -> usize {
    const K: usize = 10_000;
    let caps = MemoryBackend::new(MemoryStore::new()).capabilities();
    let client = LockClient::new(Free { caps, watch });
    let options = AcquireOptions::default().with_ttl(Duration::from_secs(30));
    // Warm up: the watchdog task, the runtime's timer wheel, the tracing callsites.
    let first = client.acquire("warm-up", &options).await.expect("granted");
    let names: Vec<String> = (0..K).map(|i| format!("heap-{i:05}")).collect();
    let mut guards = Vec::with_capacity(K);
    let before = LIVE.load(Ordering::Relaxed);
    for name in &names {
        guards.push(client.acquire(name, &options).await.expect("granted"));
    }
    // The guards themselves (16 bytes each) are in `guards`, allocated before `before`.
    let per = (LIVE.load(Ordering::Relaxed) - before) / K;
    for guard in guards {
        guard.release().await.expect("released");
    }
    first.release().await.expect("released");
    per
}

/// What the core may keep per held guard (598 bytes measured, debug build, 2026-11-26, the
/// name and owner included: both are shared with the lease, which keeps no copy of its own):
/// the backends' leases come on top, within the whole client's target of 1 KiB per guard
/// beyond the name (README, "Scale").
const CORE_BUDGET: usize = 620;

#[tokio::test(flavor = "current_thread")]
async fn a_held_guard_costs_the_core_a_bounded_heap() {
    let plain = per_guard(Watch::None).await;
    let shared = per_guard(Watch::Shared(LossEpochs::new())).await;
    let own = per_guard(Watch::Own).await;
    eprintln!(
        "core heap per guard: {plain} B, shared loss source {shared} B, own loss future {own} B"
    );
    assert!(plain <= CORE_BUDGET, "{plain} B per guard");
    assert!(
        shared <= plain + 64,
        "a shared loss source costs {} B per guard",
        shared - plain
    );
    // What the shared source is for: cheaper than a future of its own per guard.
    assert!(
        shared < own,
        "a shared source ({shared} B) is no cheaper than a future each ({own} B)"
    );
}
