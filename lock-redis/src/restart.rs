//! Learning at once that a master restarted, so that its guards report
//! [`LossReason::ServerRestarted`] instead of waiting for a refused renewal.
//!
//! A Redis server without persistence forgets every lock when it restarts, and another client
//! can take them at once. Each node therefore remembers the `run_id` (from `INFO server`) its
//! locks were taken on. From the first guard on, one task per node keeps a pub/sub connection
//! open (subscribed to a channel nobody publishes on) only to notice when it closes; then it
//! reconnects, reads the `run_id` again and, if it changed, bumps the node's restart epoch,
//! which every guard of that node waits on. The task ends with the client.
//!
//! Sentinel: the watch reconnects to the master the Sentinels name now, so a failover shows as
//! a new `run_id` at another address ([`LossReason::Failover`]). Cluster: one watch per master
//! that serves guards; when it cannot reconnect and the cluster's slots show that address no
//! longer a master (its replica took over), its guards are lost the same way.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use crate::topology::{ClusterTopology, SentinelMaster};
use distlock_core::LossReason;
use distlock_core::backend::{LossEpochs, unpoisoned as lock};
use futures::StreamExt;
use futures::future::BoxFuture;
use tokio::task::AbortHandle;

/// The channel the watching connection subscribes to (nothing is published on it).
const WATCH_CHANNEL: &str = "distlock:restart-watch";

/// The server a watch follows.
#[derive(Debug)]
enum Watched {
    /// One master at a fixed address.
    Fixed(redis::Client),
    /// The master the Sentinels name now.
    Sentinel(Weak<SentinelMaster>),
    /// One master of a cluster, while it serves slots.
    ClusterMaster {
        topology: Weak<ClusterTopology>,
        addr: String,
        client: redis::Client,
        /// The slots showed it a master since the watch started: its replacement loses the
        /// guards (otherwise the map that named it was stale, and the guards look again).
        confirmed: AtomicBool,
    },
}

/// Where the watch connects next.
enum Target {
    Client(Box<redis::Client>, String),
    /// The watched master no longer is one (a failover): its guards are lost.
    Gone,
    /// The backend is gone: nothing to watch.
    Ended,
}

impl Watched {
    /// Whether a cluster master was seen a master by this watch (always true otherwise).
    fn confirmed(&self) -> bool {
        match self {
            Self::ClusterMaster { confirmed, .. } => confirmed.load(Ordering::Relaxed),
            _ => true,
        }
    }

    async fn target(&self, failed: bool) -> Target {
        match self {
            Self::Fixed(client) => Target::Client(Box::new(client.clone()), String::new()),
            Self::Sentinel(master) => {
                let Some(master) = master.upgrade() else {
                    return Target::Ended;
                };
                if failed {
                    master.refresh().await;
                }
                Target::Client(Box::new(master.client()), master.addr())
            }
            Self::ClusterMaster {
                topology,
                addr,
                client,
                confirmed,
            } => {
                let Some(topology) = topology.upgrade() else {
                    return Target::Ended;
                };
                // The slots are read at every (re)connection: a stale map could name a master
                // that a failover already replaced (now dead, or alive as a replica).
                let _ = failed;
                match topology.still_master(addr).await {
                    Some(false) => Target::Gone,
                    Some(true) => {
                        confirmed.store(true, Ordering::Relaxed);
                        Target::Client(Box::new(client.clone()), addr.clone())
                    }
                    None => Target::Client(Box::new(client.clone()), addr.clone()),
                }
            }
        }
    }
}

/// A node's restart detection.
#[derive(Debug)]
pub(crate) struct Restarts {
    watched: Watched,
    timeout: Duration,
    /// The `run_id` (and address) of the server the node's locks live on; `None` until read.
    run_id: Mutex<Option<(String, String)>>,
    /// Bumped each time the server is found restarted or replaced, with the reason (`None`:
    /// the watched cluster master was not the guards' master after all; they look again).
    epoch: LossEpochs,
    /// The watching task, started with the first guard.
    task: Mutex<Option<AbortHandle>>,
    /// The server does not tell its `run_id`: nothing to watch.
    blind: AtomicBool,
    /// The watched cluster master was replaced: this watch is over.
    gone: AtomicBool,
}

impl Restarts {
    /// Restart detection for the server `client` connects to, whose `run_id` was read at
    /// connect (`None`: not known yet; the watching task reads it).
    pub(crate) fn new(client: redis::Client, timeout: Duration, run_id: Option<String>) -> Self {
        Self::with(
            Watched::Fixed(client),
            timeout,
            run_id.map(|id| (id, String::new())),
        )
    }

    /// The watch of the master the Sentinels name, whose `run_id` at `addr` was read at
    /// connect (`None`: not known yet).
    pub(crate) fn sentinel(
        master: Weak<SentinelMaster>,
        timeout: Duration,
        run_id: Option<(String, String)>,
    ) -> Self {
        Self::with(Watched::Sentinel(master), timeout, run_id)
    }

    /// The watch of the cluster master at `addr`.
    pub(crate) fn cluster_master(
        topology: Weak<ClusterTopology>,
        addr: String,
        client: redis::Client,
        timeout: Duration,
    ) -> Self {
        Self::with(
            Watched::ClusterMaster {
                topology,
                addr,
                client,
                confirmed: AtomicBool::new(false),
            },
            timeout,
            None,
        )
    }

    fn with(watched: Watched, timeout: Duration, run_id: Option<(String, String)>) -> Self {
        Self {
            watched,
            timeout,
            run_id: Mutex::new(run_id),
            epoch: LossEpochs::new(),
            task: Mutex::new(None),
            blind: AtomicBool::new(false),
            gone: AtomicBool::new(false),
        }
    }

    /// Whether the watched cluster master was replaced (its watch ended).
    pub(crate) fn is_gone(&self) -> bool {
        self.gone.load(Ordering::Relaxed)
    }

    /// Whether restarts can be watched (the server tells its `run_id`, or has not been asked).
    pub(crate) fn watchable(&self) -> bool {
        !self.blind.load(Ordering::Relaxed)
    }

    /// Whether this watch follows a master for good: a cluster master's once the slots showed
    /// it a master (from then on its replacement is a loss, never a stale map: see
    /// [`Self::loss`]), and every other watch.
    pub(crate) fn confirmed(&self) -> bool {
        self.watched.confirmed()
    }

    /// A future that resolves with [`LossReason::ServerRestarted`] once the server is found
    /// restarted after this call (a lock taken before a restart is gone with it), or
    /// [`LossReason::Failover`] once another server replaced it as the master; or `None` when the watched cluster master turned out not
    /// to be a master when the watch started (a stale slot map named it): the caller looks
    /// for the slot's master again.
    pub(crate) fn loss(self: &Arc<Self>) -> BoxFuture<'static, Option<LossReason>> {
        let mut rx = self.epoch.subscribe();
        self.ensure_watching();
        Box::pin(async move {
            match rx.changed().await {
                Ok(()) => rx.borrow().1.clone(),
                // The client is gone: nothing will tell.
                Err(_) => std::future::pending().await,
            }
        })
    }

    /// The node's restart events and the current epoch, for the core to end every guard
    /// taken before the next restart ([`distlock_core::Lease::shared_loss`]): one watch for
    /// all of the node's guards. Starts the watching task if it is not running. `None` once
    /// the watch is over ([`Self::is_gone`], a cluster master's only: its master was replaced,
    /// and that last event may precede the epoch read here, so a guard joining now would never
    /// be told anything).
    pub(crate) fn shared_loss(self: &Arc<Self>) -> Option<(LossEpochs, u64)> {
        // The epoch first: `gone` is set before the last event is sent, so a watch not gone
        // after this read had not sent it when the guard joined.
        let since = self.epoch.current();
        if self.is_gone() {
            return None;
        }
        self.ensure_watching();
        Some((self.epoch.clone(), since))
    }

    /// Starts the watching task unless it runs, or the watch is over (a cluster master
    /// replaced: its last event was sent, and a new task would watch that address again).
    fn ensure_watching(self: &Arc<Self>) {
        if self.is_gone() {
            return;
        }
        let mut task = lock(&self.task);
        if task.as_ref().is_none_or(AbortHandle::is_finished) {
            *task = Some(tokio::spawn(watch_server(Arc::downgrade(self))).abort_handle());
        }
    }

    /// Records the `run_id` read from the server; bumps the epoch if it differs from the
    /// one the locks were taken on.
    fn seen(&self, run_id: String, addr: String) {
        let mut known = lock(&self.run_id);
        match known.as_ref() {
            Some((old, old_addr)) if *old != run_id => {
                let reason = if *old_addr == addr {
                    tracing::warn!(old, new = %run_id, "the Redis server restarted: its locks are gone");
                    LossReason::ServerRestarted
                } else {
                    tracing::warn!(old = %old_addr, new = %addr, "a failover replaced the Redis master: its locks may be gone");
                    LossReason::Failover
                };
                *known = Some((run_id, addr));
                drop(known);
                self.lost(Some(reason));
            }
            Some(_) => {}
            None => *known = Some((run_id, addr)),
        }
    }

    fn lost(&self, reason: Option<LossReason>) {
        self.epoch.lose(reason);
    }
}

impl Drop for Restarts {
    fn drop(&mut self) {
        if let Some(task) = lock(&self.task).take() {
            task.abort();
        }
    }
}

/// Reads the server's `run_id` (`INFO server`): `Err` when the request failed (no answer),
/// `Ok(None)` when the server answered without one (`INFO` refused by an ACL, or renamed).
pub(crate) async fn run_id(
    conn: &mut impl redis::aio::ConnectionLike,
    timeout: Duration,
) -> Result<Option<String>, ()> {
    let answer: redis::RedisResult<String> =
        tokio::time::timeout(timeout, redis::cmd("INFO").arg("server").query_async(conn))
            .await
            .map_err(|_| ())?;
    let info = match answer {
        Ok(info) => info,
        Err(err) if err.is_io_error() || err.is_timeout() || err.is_connection_dropped() => {
            return Err(());
        }
        Err(_) => return Ok(None),
    };
    Ok(info
        .lines()
        .find_map(|line| line.strip_prefix("run_id:"))
        .map(|id| id.trim().to_owned()))
}

/// The watching task: (re)connects, compares the `run_id`, and waits for the connection to
/// close. Ends when the node is gone.
async fn watch_server(restarts: Weak<Restarts>) {
    let mut pause = Duration::from_millis(10);
    let mut failed = false;
    loop {
        let Some(node) = restarts.upgrade() else {
            return;
        };
        let timeout = node.timeout;
        let (client, addr) = match node.watched.target(failed).await {
            Target::Client(client, addr) => (client, addr),
            Target::Gone => {
                node.gone.store(true, Ordering::Relaxed);
                if node.watched.confirmed() {
                    tracing::warn!(
                        "a failover replaced a Redis Cluster master: its locks may be gone"
                    );
                    node.lost(Some(LossReason::Failover));
                } else {
                    node.lost(None);
                }
                return;
            }
            Target::Ended => return,
        };
        let connected = async {
            let mut conn = client.get_multiplexed_async_connection().await.ok()?;
            let id = run_id(&mut conn, timeout).await.ok()?;
            let mut pubsub = client.get_async_pubsub().await.ok()?;
            pubsub.subscribe(WATCH_CHANNEL).await.ok()?;
            Some((id, pubsub))
        };
        let Ok(Some((id, pubsub))) = tokio::time::timeout(timeout, connected).await else {
            failed = true;
            drop(node);
            tokio::time::sleep(pause).await;
            // Short: the server's clients may take its forgotten locks as soon as it is back.
            pause = (pause * 2).min(Duration::from_millis(100));
            continue;
        };
        let Some(id) = id else {
            // Nothing to compare a restart by: renewal alone will tell.
            tracing::debug!("the Redis server does not tell its run_id: restarts are not watched");
            node.blind.store(true, Ordering::Relaxed);
            return;
        };
        node.seen(id, addr);
        drop(node);
        pause = Duration::from_millis(10);
        // Nothing is published on the channel: the stream ends when the connection closes.
        let mut messages = pubsub.into_on_message();
        while messages.next().await.is_some() {}
        // Closed: ask again where the master is (Sentinel, Cluster) before reconnecting.
        failed = true;
    }
}
