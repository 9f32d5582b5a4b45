//! `Lease::loss_signal` and `Lease::shared_loss`: a backend's own loss report reaches its guard,
//! and costs no task per guard (the client's one watchdog task polls every guard's signal, and
//! waits once per shared source).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use distlock_core::backend::LossEpochs;
use distlock_core::memory::MemoryStore;
use distlock_core::{AcquireOptions, DistributedLock, Lease, LockClient, LossReason, Result};
use futures::future::BoxFuture;
use tokio::sync::watch;

mod common;

#[derive(Debug)]
struct SignallingLease {
    inner: Box<dyn Lease>,
    fire: watch::Receiver<Option<LossReason>>,
    dropped: Arc<Mutex<usize>>,
}

/// Counts its drop, so that the test sees signals end with their guards.
struct CountDrop(Arc<Mutex<usize>>);

impl Drop for CountDrop {
    fn drop(&mut self) {
        *self.0.lock().unwrap() += 1;
    }
}

#[async_trait]
impl Lease for SignallingLease {
    async fn renew(&self, ttl: Duration) -> Result<()> {
        self.inner.renew(ttl).await
    }

    async fn release(&self) -> Result<()> {
        self.inner.release().await
    }

    fn loss_signal(&self) -> Option<BoxFuture<'static, LossReason>> {
        let mut fire = self.fire.clone();
        let counted = CountDrop(self.dropped.clone());
        Some(Box::pin(async move {
            let _counted = counted;
            let reason = fire.wait_for(Option::is_some).await.map(|r| r.clone());
            match reason {
                Ok(Some(reason)) => reason,
                _ => std::future::pending().await,
            }
        }))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signals_reach_their_guards_without_a_task_each() {
    const LOCKS: usize = 200;
    let (fire, _) = watch::channel(None);
    let dropped = Arc::new(Mutex::new(0));
    let wrap: common::Wrap = Arc::new({
        let (fire, dropped) = (fire.subscribe(), dropped.clone());
        move |inner| {
            Box::new(SignallingLease {
                inner,
                fire: fire.clone(),
                dropped: dropped.clone(),
            })
        }
    });
    let client = LockClient::new(common::Wrapping::new(&MemoryStore::new(), wrap));
    let opts = AcquireOptions::default().with_ttl(Duration::from_secs(30));
    let tasks_before = tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks();
    let mut guards = Vec::new();
    for i in 0..LOCKS {
        guards.push(
            client
                .try_acquire(&format!("signal-{i}"), &opts)
                .await
                .unwrap()
                .unwrap(),
        );
    }
    let tasks = tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
        - tasks_before;
    assert!(
        tasks <= 2,
        "{tasks} tasks for {LOCKS} guards with loss signals"
    );

    // Released guards end their signals.
    for guard in guards.drain(..LOCKS / 2) {
        guard.release().await.unwrap();
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while *dropped.lock().unwrap() < LOCKS / 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "signals outlived their guards"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // A fired signal reaches every remaining guard.
    fire.send_replace(Some(LossReason::SessionExpired));
    for guard in &guards {
        let reason = tokio::time::timeout(Duration::from_secs(5), guard.lost())
            .await
            .expect("the signal reached the guard");
        assert_eq!(reason, LossReason::SessionExpired);
    }
    assert_eq!(*dropped.lock().unwrap(), LOCKS);
}

/// A lease on a shared [`LossEpochs`] source, taken in the source's epoch of its creation.
#[derive(Debug)]
struct EpochLease {
    inner: Box<dyn Lease>,
    epochs: LossEpochs,
    since: u64,
}

#[async_trait]
impl Lease for EpochLease {
    async fn renew(&self, ttl: Duration) -> Result<()> {
        self.inner.renew(ttl).await
    }

    async fn release(&self) -> Result<()> {
        self.inner.release().await
    }

    fn shared_loss(&self) -> Option<(LossEpochs, u64)> {
        Some((self.epochs.clone(), self.since))
    }
}

/// A client whose leases are on `epochs`, each taken in the source's epoch of its creation,
/// or in `since` if given.
fn epoch_client(epochs: &LossEpochs, since: Option<u64>) -> LockClient<common::Wrapping> {
    let wrap: common::Wrap = Arc::new({
        let epochs = epochs.clone();
        move |inner| {
            Box::new(EpochLease {
                inner,
                since: since.unwrap_or_else(|| epochs.current()),
                epochs: epochs.clone(),
            })
        }
    });
    LockClient::new(common::Wrapping::new(&MemoryStore::new(), wrap))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_source_ends_the_guards_taken_before_its_event_only() {
    const LOCKS: usize = 100;
    let epochs = LossEpochs::new();
    let client = epoch_client(&epochs, None);
    let opts = AcquireOptions::default().with_ttl(Duration::from_secs(30));
    let take = |prefix: &'static str| {
        let client = client.clone();
        let opts = opts.clone();
        async move {
            let mut guards = Vec::new();
            for i in 0..LOCKS {
                let name = format!("{prefix}-{i}");
                guards.push(client.try_acquire(&name, &opts).await.unwrap().unwrap());
            }
            guards
        }
    };
    let mut before = take("before").await;
    // Released before the event: left alone (its release reports no loss).
    let released = before.pop().unwrap();
    released.release().await.unwrap();

    // An event without a reason ends nothing.
    epochs.lose(None);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        before.iter().all(|g| !g.is_lost()),
        "an event without a reason ended a guard"
    );

    epochs.lose(Some(LossReason::ServerRestarted));
    let after = take("after").await;
    for guard in &before {
        let reason = tokio::time::timeout(Duration::from_secs(5), guard.lost())
            .await
            .expect("the event reached the guard");
        assert_eq!(reason, LossReason::ServerRestarted);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        after.iter().all(|g| !g.is_lost()),
        "a guard taken after the event was ended"
    );

    // The next event ends the later guards too.
    epochs.lose(Some(LossReason::Failover));
    for guard in &after {
        let reason = tokio::time::timeout(Duration::from_secs(5), guard.lost())
            .await
            .expect("the second event reached the guard");
        assert_eq!(reason, LossReason::Failover);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loss_before_the_guard_joined_ends_it_even_after_a_later_reasonless_event() {
    let epochs = LossEpochs::new();
    // Every lease says it was taken in epoch 0.
    let client = epoch_client(&epochs, Some(0));
    let opts = AcquireOptions::default().with_ttl(Duration::from_secs(30));
    // The loss, then an event without a reason, both before the guard starts.
    epochs.lose(Some(LossReason::SessionExpired));
    epochs.lose(None);
    let guard = client
        .try_acquire("joined-late", &opts)
        .await
        .unwrap()
        .unwrap();
    let reason = tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("the earlier loss reached the guard");
    assert_eq!(reason, LossReason::SessionExpired);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_source_ends_guards_taken_after_earlier_ones_came_and_went() {
    let epochs = LossEpochs::new();
    let client = epoch_client(&epochs, None);
    let opts = AcquireOptions::default().with_ttl(Duration::from_secs(30));
    // Guards taken and released back to back: the source's group outlives each of them.
    for _ in 0..20 {
        let guard = client.try_acquire("cycled", &opts).await.unwrap().unwrap();
        guard.release().await.unwrap();
    }
    let held = client.try_acquire("cycled", &opts).await.unwrap().unwrap();
    epochs.lose(Some(LossReason::ServerRestarted));
    let reason = tokio::time::timeout(Duration::from_secs(5), held.lost())
        .await
        .expect("the event reached a guard of the lasting group");
    assert_eq!(reason, LossReason::ServerRestarted);

    // Idle long enough for the watchdog task (and the group) to end: the next guard starts
    // a new wait on the source.
    drop(held);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let later = client.try_acquire("later", &opts).await.unwrap().unwrap();
    epochs.lose(Some(LossReason::Failover));
    let reason = tokio::time::timeout(Duration::from_secs(5), later.lost())
        .await
        .expect("the event reached a guard of a new group");
    assert_eq!(reason, LossReason::Failover);
}
