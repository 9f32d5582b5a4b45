//! A counting global allocator: the `System` allocator plus one atomic count of the bytes
//! currently allocated, so that `distlock bench --scenario hold` can report the heap bytes a
//! held guard costs (live bytes after acquiring K locks minus before, divided by K).
//!
//! A global allocator is one per binary, so it is installed for every subcommand; but it counts
//! only once [`start_counting`] was called, which only `bench` does: for `run` and every other
//! subcommand it is `System` behind one relaxed load and a branch. When counting, the cost is
//! one relaxed atomic add per allocation and one subtract per free; the harness reads the
//! count through [`live_bytes`] (see `bench::CliInstruments`), so lock-bench itself stays
//! allocator-agnostic.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Bytes currently allocated through [`Counting`] (requested sizes, not the allocator's
/// rounding).
static LIVE: AtomicUsize = AtomicUsize::new(BASE);
/// Whether allocations are counted (see [`start_counting`]).
static COUNTING: AtomicBool = AtomicBool::new(false);
/// Where the count starts: blocks allocated before counting began and freed after are
/// subtracted though never added; the base keeps the count from wrapping below zero (only the
/// differences between two readings are used).
const BASE: usize = u32::MAX as usize;

/// Counts from now on (`bench` only; call it before the work to measure starts).
pub(crate) fn start_counting() {
    COUNTING.store(true, Ordering::Relaxed);
}

fn add(bytes: usize) {
    if COUNTING.load(Ordering::Relaxed) {
        LIVE.fetch_add(bytes, Ordering::Relaxed);
    }
}

fn sub(bytes: usize) {
    if COUNTING.load(Ordering::Relaxed) {
        LIVE.fetch_sub(bytes, Ordering::Relaxed);
    }
}

/// The heap bytes currently allocated by the whole process.
pub(crate) fn live_bytes() -> u64 {
    u64::try_from(LIVE.load(Ordering::Relaxed)).unwrap_or(u64::MAX)
}

/// `System`, counting the bytes it hands out and takes back.
#[derive(Debug)]
pub(crate) struct Counting;

// SAFETY: every method forwards to `System` with the caller's own arguments, unchanged, so
// `System`'s guarantees are `Counting`'s; the only addition is an atomic counter update, done
// after a successful allocation and before a free, which neither allocates nor panics.
#[expect(
    unsafe_code,
    reason = "a GlobalAlloc impl is unsafe by definition; it only forwards to System and counts"
)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc` (non-zero size) is passed on unchanged.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            add(layout.size());
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            add(layout.size());
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        sub(layout.size());
        // SAFETY: `ptr` was allocated by this allocator (so by `System`) with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract for `realloc` is passed on unchanged.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            add(new_size);
            sub(layout.size());
        }
        new
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_live_allocation_is_counted_until_freed() {
        super::start_counting();
        // Other test threads allocate too: a large block stands out of their noise.
        let before = super::live_bytes();
        let block = vec![0u8; 64 << 20];
        let during = super::live_bytes();
        drop(block);
        let after = super::live_bytes();
        assert!(during >= before + (60 << 20), "{before} {during}");
        assert!(after + (60 << 20) <= during, "{during} {after}");
    }
}
