//! A release or an attempt's clean-up, once started, reaches the server even when the caller's
//! future is dropped before it ends (a `tokio::time::timeout` or `select!` around it; here a
//! `select!` that drops it once the slow work has started): the rest runs on a task of its
//! own. Before, a cancelled release left the lock held (its renewal already stopped) until
//! its ttl, and a cancelled clean-up left the attempt's traces.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use distlock_core::memory::{MemoryBackend, MemoryStore};
use distlock_core::{AcquireOptions, DistributedLock, Lease, LockClient, Result};
use tokio::sync::Notify;

mod common;
use common::Wrapping;

/// How long the test's slow release or clean-up takes.
const SLOW: Duration = Duration::from_millis(200);

/// A lease whose release says it started, then reaches the server [`SLOW`] late.
#[derive(Debug)]
struct SlowRelease(Box<dyn Lease>, Arc<Notify>);

#[async_trait]
impl Lease for SlowRelease {
    async fn renew(&self, ttl: Duration) -> Result<()> {
        self.0.renew(ttl).await
    }

    async fn release(&self) -> Result<()> {
        self.1.notify_one();
        tokio::time::sleep(SLOW).await;
        self.0.release().await
    }
}

/// A long lease, so that only a release frees the name within the test.
fn opts() -> AcquireOptions {
    AcquireOptions::default().with_ttl(Duration::from_secs(60))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_cut_short_by_its_caller_still_frees_the_lock() {
    let store = MemoryStore::new();
    let started = Arc::new(Notify::new());
    let notify = started.clone();
    let slow = LockClient::new(Wrapping::new(
        &store,
        Arc::new(move |inner| Box::new(SlowRelease(inner, notify.clone()))),
    ));
    let other = LockClient::new(MemoryBackend::new(store.clone()));
    let guard = slow.try_acquire("cut", &opts()).await.unwrap().unwrap();
    // Cut short once the release has started.
    tokio::select! {
        released = guard.release() => panic!("the slow release answered first: {released:?}"),
        () = started.notified() => {}
    }
    // Generous: the release needs SLOW; the lease would need a minute.
    let until = Instant::now() + Duration::from_secs(10);
    let taken = loop {
        if let Some(guard) = other.try_acquire("cut", &opts()).await.unwrap() {
            break guard;
        }
        assert!(
            Instant::now() < until,
            "the cancelled release never reached the server"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    taken.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_up_cut_short_by_its_caller_still_runs() {
    let store = MemoryStore::new();
    let (started, abandoned) = (Arc::new(Notify::new()), Arc::new(AtomicUsize::new(0)));
    let slow = LockClient::new(Wrapping::new(&store, Arc::new(|inner| inner)).slow_abandon(
        SLOW,
        started.clone(),
        abandoned.clone(),
    ));
    let holder = LockClient::new(MemoryBackend::new(store.clone()));
    let held = holder.try_acquire("busy", &opts()).await.unwrap().unwrap();
    // The refused try cleans its attempt up before it answers: cut short in that clean-up.
    let opts = opts();
    tokio::select! {
        tried = slow.try_acquire("busy", &opts) => panic!("the try answered first: {tried:?}"),
        () = started.notified() => {}
    }
    assert_eq!(abandoned.load(Ordering::SeqCst), 0);
    let until = Instant::now() + Duration::from_secs(10);
    while abandoned.load(Ordering::SeqCst) == 0 {
        assert!(
            Instant::now() < until,
            "the cancelled clean-up never finished"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    held.release().await.unwrap();
}
