//! Learning at once that a master restarted, so that its guards report
//! [`LossReason::ServerRestarted`] instead of waiting for a refused renewal.
//!
//! A Redis server without persistence forgets every lock when it restarts, and another client
//! can take them at once. Each node therefore remembers the `run_id` (from `INFO server`) its
//! locks were taken on. From the first guard on, one task per node keeps a pub/sub connection
//! open (subscribed to a channel nobody publishes on) only to notice when it closes; then it
//! reconnects, reads the `run_id` again and, if it changed, bumps the node's restart epoch,
//! which every guard of that node waits on. The task ends with the client.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use distlock_core::LossReason;
use distlock_core::backend::unpoisoned as lock;
use futures::StreamExt;
use futures::future::BoxFuture;
use tokio::sync::watch;
use tokio::task::AbortHandle;

/// The channel the watching connection subscribes to (nothing is published on it).
const WATCH_CHANNEL: &str = "distlock:restart-watch";

/// A node's restart detection.
#[derive(Debug)]
pub(crate) struct Restarts {
    client: redis::Client,
    timeout: Duration,
    /// The `run_id` of the server the node's locks live on; `None` until read.
    run_id: Mutex<Option<String>>,
    /// Bumped each time the server is found restarted.
    epoch: watch::Sender<u64>,
    /// The watching task, started with the first guard.
    task: Mutex<Option<AbortHandle>>,
    /// The server does not tell its `run_id`: nothing to watch.
    blind: AtomicBool,
}

impl Restarts {
    /// Restart detection for the server `client` connects to, whose `run_id` was read at
    /// connect (`None`: not known yet; the watching task reads it).
    pub(crate) fn new(client: redis::Client, timeout: Duration, run_id: Option<String>) -> Self {
        Self {
            client,
            timeout,
            run_id: Mutex::new(run_id),
            epoch: watch::Sender::new(0),
            task: Mutex::new(None),
            blind: AtomicBool::new(false),
        }
    }

    /// Whether restarts can be watched (the server tells its `run_id`, or has not been asked).
    pub(crate) fn watchable(&self) -> bool {
        !self.blind.load(Ordering::Relaxed)
    }

    /// A future that resolves with [`LossReason::ServerRestarted`] once the server is found
    /// restarted after this call (a lock taken before a restart is gone with it). Starts the
    /// watching task if it is not running.
    pub(crate) fn lost_on_restart(self: &Arc<Self>) -> BoxFuture<'static, LossReason> {
        let mut rx = self.epoch.subscribe();
        let mut task = lock(&self.task);
        if task.as_ref().is_none_or(AbortHandle::is_finished) {
            *task = Some(tokio::spawn(watch_server(Arc::downgrade(self))).abort_handle());
        }
        Box::pin(async move {
            match rx.changed().await {
                Ok(()) => LossReason::ServerRestarted,
                // The client is gone: nothing will tell.
                Err(_) => std::future::pending().await,
            }
        })
    }

    /// Records the `run_id` read from the server; bumps the epoch if it differs from the
    /// one the locks were taken on.
    fn seen(&self, run_id: String) {
        let mut known = lock(&self.run_id);
        match known.as_deref() {
            Some(old) if old != run_id => {
                tracing::warn!(old, new = %run_id, "the Redis server restarted: its locks are gone");
                *known = Some(run_id);
                drop(known);
                self.epoch.send_modify(|epoch| *epoch += 1);
            }
            Some(_) => {}
            None => *known = Some(run_id),
        }
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
    loop {
        let Some(node) = restarts.upgrade() else {
            return;
        };
        let (client, timeout) = (node.client.clone(), node.timeout);
        let connected = async {
            let mut conn = client.get_multiplexed_async_connection().await.ok()?;
            let id = run_id(&mut conn, timeout).await.ok()?;
            let mut pubsub = client.get_async_pubsub().await.ok()?;
            pubsub.subscribe(WATCH_CHANNEL).await.ok()?;
            Some((id, pubsub))
        };
        let Ok(Some((id, pubsub))) = tokio::time::timeout(timeout, connected).await else {
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
        node.seen(id);
        drop(node);
        pause = Duration::from_millis(10);
        // Nothing is published on the channel: the stream ends when the connection closes.
        let mut messages = pubsub.into_on_message();
        while messages.next().await.is_some() {}
    }
}
