//! One pub/sub connection per node and client, shared by every waiting attempt of that client
//! (in a Redis Cluster, one per master that serves a name waited on: see [`Subscriber`]).
//!
//! Channels are subscribed when the first attempt starts waiting on a name, and unsubscribed
//! once no attempt has waited on it for [`SUBSCRIPTION_IDLE`]. Messages are fanned out to
//! the attempts through a broadcast channel per name. When the connection breaks, every
//! waiter is woken (it re-polls, so no release is missed) and the next
//! [`Subscription::ensure`] reconnects and re-subscribes.
//!
//! The idle time is for a client that waits on the same name again and again (a contended
//! lock): subscribing and unsubscribing for every wait cost two commands per critical section,
//! and a new subscription costs a poll more, since a release between the poll that found the
//! lock busy and the subscription would be missed. An attempt that starts while its channel is
//! still subscribed listens before its first poll ([`Subscriber::listening`]), and needs
//! neither.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use distlock_core::backend::unpoisoned as lock;
use futures::StreamExt;
use tokio::sync::{broadcast, oneshot};

use crate::error::RedisError;
use crate::topology::Endpoint;

/// A wake-up: the published payload (the owner value of the waiter served next; empty when
/// anybody may try, or when the connection was reset).
pub(crate) type Wake = Arc<[u8]>;

/// The wake-up subscriptions of one node of one client.
///
/// A master (single, Redlock's, the Sentinels') has one connection. In a Redis Cluster each
/// channel is subscribed on the master that serves its slot as last read (the channel shares
/// the name's hash tag), one connection per such master: the scripts `PUBLISH` there, and a
/// subscriber of that node reads the message at once, where one on another node waits for the
/// cluster bus to carry it (measured: p50 59-84 against 162-206 µs, and about 43 ms now and
/// then). Classic pub/sub reaches every node of the cluster, so a subscription on another node
/// (after a failure to connect to the master) or left on a former master that still runs in
/// the cluster after a failover hears later, not never; one on a node cut off hears nothing
/// until its connection breaks, and its waiters poll on their timers meanwhile, as on a master.
#[derive(Debug)]
pub(crate) struct Subscriber {
    /// The connection of the master, or of any node of a cluster (a channel whose slot's
    /// master is not known); the cluster masters' connections are made like it.
    any: Arc<Inner>,
    /// The connection of each cluster master, by `host:port`.
    shards: Mutex<HashMap<String, Arc<Inner>>>,
}

#[derive(Debug)]
struct Inner {
    /// Where to subscribe: the master, or a node of the cluster (see `shard`).
    endpoint: Endpoint,
    /// The cluster master this connection is for (tried first; any node after a failure to
    /// connect to it, the master again after a success).
    shard: Option<String>,
    /// Failed connection attempts, to try the next cluster node after each.
    failures: std::sync::atomic::AtomicUsize,
    node: String,
    timeout: Duration,
    channels: Mutex<HashMap<String, Channel>>,
    /// Serializes connecting, subscribing and unsubscribing.
    conn: tokio::sync::Mutex<Option<Conn>>,
}

impl Inner {
    fn new(endpoint: &Endpoint, shard: Option<String>, node: &str, timeout: Duration) -> Arc<Self> {
        Arc::new(Self {
            endpoint: endpoint.clone(),
            shard,
            failures: std::sync::atomic::AtomicUsize::new(0),
            node: node.to_owned(),
            timeout,
            channels: Mutex::new(HashMap::new()),
            conn: tokio::sync::Mutex::new(None),
        })
    }
}

/// How long a channel stays subscribed after its last waiter stopped (see the module's
/// documentation).
pub(crate) const SUBSCRIPTION_IDLE: Duration = Duration::from_secs(2);

#[derive(Debug)]
struct Channel {
    tx: broadcast::Sender<Wake>,
    waiters: usize,
    /// The connection generation on which this channel is subscribed.
    subscribed: Option<u64>,
    /// Bumped each time the last waiter stops: an unsubscription planned then goes ahead only
    /// if nobody waited since.
    idle: u64,
}

#[derive(Debug)]
struct Conn {
    sink: redis::aio::PubSubSink,
    generation: u64,
    /// Dropping it stops the reader task (and closes the connection).
    _shutdown: oneshot::Sender<()>,
    alive: Arc<std::sync::atomic::AtomicBool>,
}

impl Subscriber {
    pub(crate) fn new(endpoint: Endpoint, node: String, timeout: Duration) -> Self {
        Self {
            any: Inner::new(&endpoint, None, &node, timeout),
            shards: Mutex::new(HashMap::new()),
        }
    }

    /// The connection `channel` is subscribed on: its slot's master's in a cluster.
    fn shard(&self, channel: &str) -> Arc<Inner> {
        let Some(shard) = self.any.endpoint.pubsub_shard(channel) else {
            return self.any.clone();
        };
        let mut shards = lock(&self.shards);
        if let Some(inner) = shards.get(&shard) {
            return inner.clone();
        }
        // A master not seen before (the first wait there, or a failover's new master): forget
        // the connections nobody uses (closed when their last channel went idle).
        shards.retain(|_, inner| Arc::strong_count(inner) > 1 || !lock(&inner.channels).is_empty());
        let any = &self.any;
        let inner = Inner::new(&any.endpoint, Some(shard.clone()), &any.node, any.timeout);
        shards.insert(shard, inner.clone());
        inner
    }

    /// Registers interest in `channel`. Messages are buffered from now on, but only delivered
    /// once [`Subscription::ensure`] has made the server-side subscription active.
    pub(crate) fn subscribe(&self, channel: &str) -> Subscription {
        let inner = self.shard(channel);
        let mut channels = lock(&inner.channels);
        let entry = channels
            .entry(channel.to_owned())
            .or_insert_with(|| Channel {
                tx: broadcast::channel(16).0,
                waiters: 0,
                subscribed: None,
                idle: 0,
            });
        entry.waiters += 1;
        let rx = entry.tx.subscribe();
        drop(channels);
        Subscription {
            inner,
            channel: channel.to_owned(),
            rx,
        }
    }

    /// Interest in `channel` if it is subscribed already (another waiter of this client, or
    /// one that stopped less than [`SUBSCRIPTION_IDLE`] ago): every message from now on
    /// reaches the returned subscription, so an attempt that takes it before a poll misses
    /// no release after that poll. `None` (nothing registered) otherwise. One uncontended
    /// mutex when this client waits on nothing (in a cluster also the slot map's and the
    /// connections' map's).
    pub(crate) fn listening(&self, channel: &str) -> Option<Subscription> {
        let Some(shard) = self.any.endpoint.pubsub_shard(channel) else {
            return Self::listen_on(&self.any, channel);
        };
        let inner = lock(&self.shards).get(&shard)?.clone();
        Self::listen_on(&inner, channel)
    }

    fn listen_on(inner: &Arc<Inner>, channel: &str) -> Option<Subscription> {
        let mut channels = lock(&inner.channels);
        let entry = channels.get_mut(channel)?;
        entry.subscribed?;
        entry.waiters += 1;
        let rx = entry.tx.subscribe();
        drop(channels);
        Some(Subscription {
            inner: inner.clone(),
            channel: channel.to_owned(),
            rx,
        })
    }
}

/// One attempt's interest in one channel. Unsubscribes on drop when it was the last one.
#[derive(Debug)]
pub(crate) struct Subscription {
    inner: Arc<Inner>,
    channel: String,
    rx: broadcast::Receiver<Wake>,
}

impl Subscription {
    /// Whether the channel is subscribed on a live connection.
    pub(crate) fn is_active(&self) -> bool {
        let channels = lock(&self.inner.channels);
        let Some(subscribed) = channels.get(&self.channel).and_then(|c| c.subscribed) else {
            return false;
        };
        drop(channels);
        match self.inner.conn.try_lock() {
            Ok(conn) => conn.as_ref().is_some_and(|c| {
                c.generation == subscribed && c.alive.load(std::sync::atomic::Ordering::SeqCst)
            }),
            // Someone is (re)subscribing right now: let `ensure` wait for it.
            Err(_) => false,
        }
    }

    /// Makes the server-side subscription active, connecting if needed. Cancel safe.
    pub(crate) async fn ensure(&self) -> Result<(), RedisError> {
        let inner = &self.inner;
        let mut conn = inner.conn.lock().await;
        let live = conn
            .as_ref()
            .is_some_and(|c| c.alive.load(std::sync::atomic::Ordering::SeqCst));
        if !live {
            *conn = None;
            // Counted as failed until it connects: an attempt cancelled (a waiter's poll timer)
            // or timed out moves on to the next server as a refused one does.
            let failures = inner
                .failures
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if failures > 0 {
                // A cluster master that cannot be reached may have failed over: read the slots
                // again (spaced), so that the next subscriptions go to the new master.
                inner.endpoint.refresh_later();
            }
            let client = inner
                .endpoint
                .pubsub_client(inner.shard.as_deref(), failures)
                .ok_or_else(|| RedisError::timeout(&inner.node))?;
            let pubsub = tokio::time::timeout(inner.timeout, client.get_async_pubsub())
                .await
                .map_err(|_| RedisError::timeout(&inner.node))
                .and_then(|r| r.map_err(|e| RedisError::classify(&inner.node, e)))?;
            // Connected: a cluster master's connection tries the master first again after the
            // next break; another goes back to the server it reached.
            let next = if inner.shard.is_some() { 0 } else { failures };
            inner
                .failures
                .store(next, std::sync::atomic::Ordering::Relaxed);
            let (sink, stream) = pubsub.split();
            let generation = NEXT_GENERATION.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let (shutdown, stopped) = oneshot::channel();
            let alive = Arc::new(std::sync::atomic::AtomicBool::new(true));
            tokio::spawn(read(
                Arc::downgrade(inner),
                stream,
                stopped,
                alive.clone(),
                generation,
            ));
            *conn = Some(Conn {
                sink,
                generation,
                _shutdown: shutdown,
                alive,
            });
        }
        let Some(current) = conn.as_mut() else {
            return Err(RedisError::timeout(&inner.node));
        };
        let done = lock(&inner.channels)
            .get(&self.channel)
            .is_some_and(|c| c.subscribed == Some(current.generation));
        if done {
            return Ok(());
        }
        let subscribed = tokio::time::timeout(inner.timeout, current.sink.subscribe(&self.channel))
            .await
            .map_err(|_| RedisError::timeout(&inner.node))
            .and_then(|r| r.map_err(|e| RedisError::classify(&inner.node, e)));
        if let Err(err) = subscribed {
            *conn = None;
            return Err(err);
        }
        if let Some(channel) = lock(&inner.channels).get_mut(&self.channel) {
            channel.subscribed = Some(current.generation);
        }
        Ok(())
    }

    /// The next wake-up. Cancel safe.
    pub(crate) async fn next(&mut self) -> Wake {
        match self.rx.recv().await {
            Ok(wake) => wake,
            // Missed some: wake up and look.
            Err(broadcast::error::RecvError::Lagged(_)) => Arc::from(&b""[..]),
            Err(broadcast::error::RecvError::Closed) => std::future::pending().await,
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut channels = lock(&self.inner.channels);
        let Some(entry) = channels.get_mut(&self.channel) else {
            return;
        };
        entry.waiters -= 1;
        if entry.waiters > 0 {
            return;
        }
        let runtime = tokio::runtime::Handle::try_current();
        let (Some(_), Ok(handle)) = (entry.subscribed, runtime) else {
            // Not subscribed on the server (or no runtime to unsubscribe later): forget it.
            channels.remove(&self.channel);
            return;
        };
        // Kept subscribed for the next wait on this name; unsubscribed if none comes.
        entry.idle += 1;
        let idle = entry.idle;
        drop(channels);
        let inner = Arc::downgrade(&self.inner);
        let channel = std::mem::take(&mut self.channel);
        handle.spawn(async move {
            tokio::time::sleep(SUBSCRIPTION_IDLE).await;
            let Some(inner) = inner.upgrade() else {
                return; // the client is gone, and its connection with it
            };
            // Under the connection's mutex: a new waiter's `ensure` subscribes after this.
            let mut conn = inner.conn.lock().await;
            let generation = {
                let mut channels = lock(&inner.channels);
                match channels.get(&channel) {
                    Some(entry) if entry.waiters == 0 && entry.idle == idle => {
                        channels.remove(&channel).and_then(|c| c.subscribed)
                    }
                    // Waited on since (and maybe idle again, with its own plan).
                    _ => return,
                }
            };
            if let Some(current) = conn.as_mut()
                && generation == Some(current.generation)
            {
                let _ =
                    tokio::time::timeout(inner.timeout, current.sink.unsubscribe(&channel)).await;
            }
            if inner.shard.is_some() && lock(&inner.channels).is_empty() {
                // A cluster master's connection with nothing left to hear: closed (opened
                // again by the next wait on one of its names).
                *conn = None;
            }
        });
    }
}

static NEXT_GENERATION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

async fn read(
    inner: Weak<Inner>,
    mut stream: redis::aio::PubSubStream,
    mut stopped: oneshot::Receiver<()>,
    alive: Arc<std::sync::atomic::AtomicBool>,
    generation: u64,
) {
    loop {
        let msg = tokio::select! {
            _ = &mut stopped => break,
            msg = stream.next() => msg,
        };
        let Some(msg) = msg else { break };
        let Some(inner) = inner.upgrade() else { break };
        let channels = lock(&inner.channels);
        if let Some(channel) = channels.get(msg.get_channel_name()) {
            let _ = channel.tx.send(Arc::from(msg.get_payload_bytes()));
        }
    }
    alive.store(false, std::sync::atomic::Ordering::SeqCst);
    // The connection is gone: releases may have been missed. Wake everyone to re-poll.
    if let Some(inner) = inner.upgrade() {
        let mut channels = lock(&inner.channels);
        for channel in channels.values_mut() {
            if channel.subscribed == Some(generation) {
                channel.subscribed = None;
                let _ = channel.tx.send(Arc::from(&b""[..]));
            }
        }
    }
}
