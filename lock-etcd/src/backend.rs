//! The backend: connecting, capabilities, inspection, listing and forced release of locks.
//! The protocol itself is in `attempt.rs` (queueing), `lease.rs` (holding), `renew.rs`
//! (batched renewal) and `session.rs` (the shared etcd leases).

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use distlock_core::backend::within;
use distlock_core::{
    AcquireRequest, Attempt, Capabilities, FencingGuarantee, FencingToken, LockBackend, LockInfo,
    LockKind, LockName, LossDetection, Result, WakeUp,
};
use etcd_client::{
    Client, Compare, CompareOp, GetOptions, SortOrder, SortTarget, Txn, TxnOp, WatchOptions,
};
use futures::StreamExt;
use futures::stream::BoxStream;
use tokio::sync::mpsc;

use crate::attempt::{EtcdAttempt, token};
use crate::checks::KeyCheck;
use crate::config::EtcdConfig;
use crate::error::{connect_err, map_err, retryable, tls_cause, transient};
use crate::keys;
use crate::keys::KeyPool;
use crate::members::{self, Members, Prober};
use crate::renew::EtcdRenewer;
use crate::session::LeaseSlot;
use crate::wake::IdleWatches;
use crate::watcher::WatchHub;

/// The shortest lease etcd grants with its default heartbeat settings (shorter requests are
/// silently raised to it).
pub const MIN_TTL: Duration = Duration::from_secs(2);

/// The largest semaphore. A permit waiter's position read returns the keys before its own,
/// at most N + 1 of them (about 80 bytes each), and the first waiter of a semaphore is woken
/// by any of the N holders' releases; 1024 keeps that read under ~100 KB. (etcd sorts a
/// name's whole queue on each such read anyway, as for the mutex.)
pub const MAX_PERMITS: u32 = 1024;

/// The longest ttl this backend accepts.
pub const MAX_TTL: Duration = Duration::from_secs(24 * 3600);

/// The etcd lock protocol over one [`etcd_client::Client`] (one connection pool, one lease per
/// distinct ttl). Build it with [`EtcdBackend::connect`] and wrap it in a
/// [`distlock_core::LockClient`], or use [`crate::connect`].
#[derive(Clone)]
pub struct EtcdBackend {
    pub(crate) shared: Arc<BackendState>,
}

/// What one backend holds, shared by its clones, attempts and leases: the etcd client, the
/// client's leases, queue keys and watches, the renewer and the members' health.
pub(crate) struct BackendState {
    pub(crate) client: Client,
    pub(crate) prefix: String,
    pub(crate) endpoints: Vec<String>,
    /// One lease per ttl in whole seconds, granted on first use, replaced when it is gone.
    pub(crate) leases: tokio::sync::Mutex<HashMap<i64, Arc<LeaseSlot>>>,
    /// The renewal batcher's queue, started on first use.
    pub(crate) checks: OnceLock<mpsc::UnboundedSender<KeyCheck>>,
    /// The queue keys this client uses, per name.
    pub(crate) keys: KeyPool,
    /// Watches kept for the next wait on the same key (see `wake.rs`).
    pub(crate) watches: IdleWatches,
    /// The client's one watch stream, which carries every wait's watch (see `watcher.rs`).
    pub(crate) hub: WatchHub,
    /// Renews the client's held locks together (see `renew.rs`).
    pub(crate) renewer: Arc<EtcdRenewer>,
    /// Where requests report a member that does not answer or connect.
    pub(crate) members: Members,
    /// Takes such members out of the client's balancer while they are down.
    _prober: Prober,
}

impl fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("endpoints", &self.shared.endpoints)
            .field("prefix", &self.shared.prefix)
            .finish_non_exhaustive()
    }
}

impl EtcdBackend {
    /// Connects to the cluster of `config` (TLS and user as configured) and checks that some
    /// endpoint answers, within `connect_timeout` (which also bounds each connection attempt).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`](distlock_core::Error::InvalidConfig) for an endpoint the client
    /// library rejects or a TLS file that cannot be read;
    /// [`Error::Backend`](distlock_core::Error::Backend) (not retryable, naming the endpoints
    /// and the cause)
    /// for a refused user or password, a TLS handshake that fails (untrusted or expired
    /// certificate, TLS to a plain port, no client certificate where one is required) and a
    /// plain connection to a TLS port; [`Error::Unavailable`](distlock_core::Error::Unavailable)
    /// when no endpoint answers.
    pub async fn connect(config: &EtcdConfig, connect_timeout: Duration) -> Result<Self> {
        let client = Self::connect_client(config, connect_timeout).await?;
        Ok(Self::from_client(client, config))
    }

    /// The checked [`etcd_client::Client`] that [`EtcdBackend::connect`] uses, for code that
    /// wants its own (e.g. to share with [`EtcdBackend::from_client`] or for administration).
    ///
    /// # Errors
    /// As [`EtcdBackend::connect`].
    pub async fn connect_client(config: &EtcdConfig, connect_timeout: Duration) -> Result<Client> {
        let options = config.connect_options(connect_timeout).await?;
        let at = format!("etcd at {}", config.hosts());
        // With a user, connecting authenticates at once, on one endpoint: a member that is down
        // fails it, so one try per endpoint (plus one), as for the probe below. Credential and
        // TLS errors are not retried.
        let connecting = async {
            let mut tries = 0;
            loop {
                tries += 1;
                match Client::connect(config.endpoints(), Some(options.clone())).await {
                    Ok(client) => return Ok(client),
                    Err(err)
                        if tries <= config.endpoints().len()
                            && retryable(&err)
                            && tls_cause(&err).is_none() => {}
                    Err(err) => return Err(err),
                }
            }
        };
        let client = match within(connect_timeout, &at, connecting).await? {
            Ok(client) => client,
            Err(err) => return Err(connect_err(config, connect_timeout, Some(err)).await),
        };
        // etcd-client connects lazily: a dead endpoint would only show at the first lock
        // operation, and a waiter would retry it silently. A status call verifies that some
        // endpoint answers; requests are spread over the endpoints, so one try per endpoint
        // (plus one) lets a cluster with a member down pass.
        let probe = async {
            let mut last = None;
            for _ in 0..=config.endpoints().len() {
                match client.clone().status().await {
                    Ok(_) => return Ok(()),
                    Err(err) => {
                        let fatal = !retryable(&err) || tls_cause(&err).is_some();
                        last = Some(err);
                        if fatal {
                            break;
                        }
                    }
                }
            }
            Err(last)
        };
        match within(connect_timeout, &at, probe).await? {
            Ok(()) => Ok(client),
            Err(err) => Err(connect_err(config, connect_timeout, err).await),
        }
    }

    /// Uses an existing client (its endpoints are taken from `config` for diagnostics only).
    pub fn from_client(client: Client, config: &EtcdConfig) -> Self {
        let members = Members::default();
        let prober = members::start(&client, config.endpoints(), &members);
        Self {
            shared: Arc::new(BackendState {
                _prober: prober,
                members,
                client,
                prefix: config.prefix().to_owned(),
                endpoints: config.endpoints().to_vec(),
                leases: tokio::sync::Mutex::default(),
                checks: OnceLock::new(),
                keys: KeyPool::new(),
                watches: IdleWatches::default(),
                hub: WatchHub::default(),
                renewer: Arc::default(),
            }),
        }
    }

    /// The underlying etcd client.
    pub fn client(&self) -> &Client {
        &self.shared.client
    }

    /// The key prefix under which the queue keys of `name` live (a range: every key of the
    /// name starts with it, and no key of another name does).
    pub fn key_range(&self, name: &str) -> String {
        keys::name_range(&self.shared.prefix, name)
    }
}

#[async_trait]
impl LockBackend for EtcdBackend {
    fn name(&self) -> &'static str {
        "etcd"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(FencingGuarantee::Linearizable)
            .with_fifo(true)
            .with_wake_up(WakeUp::Event)
            .with_ttl_range(MIN_TTL, MAX_TTL)
            .with_loss_detection(LossDetection::Renewal)
            .with_list(true)
            .with_force_release(true)
            .with_release_hold(true)
            .with_holder_data(true)
            .with_shared(true)
            .with_max_permits(MAX_PERMITS)
    }

    fn begin(&self, request: AcquireRequest) -> Box<dyn Attempt> {
        Box::new(EtcdAttempt::new(&self.shared, request))
    }

    /// A watch on every key of the name (holders and queue, of every kind: a reader's or a
    /// permit's key is in the range as a writer's is): each event, and the watch's
    /// creation (which closes the gap between the observer's first read and the watch), wake
    /// the observer. The stream ends when the watch cannot be made or breaks: the observer then
    /// reads at intervals.
    fn watch(&self, name: &LockName) -> Option<BoxStream<'static, ()>> {
        enum Watch {
            Start(etcd_client::WatchClient, String),
            Open(etcd_client::WatchStream),
        }
        let range = keys::name_range(&self.shared.prefix, name.as_str());
        let start = Watch::Start(self.shared.client.watch_client(), range);
        Some(
            futures::stream::unfold(start, |state| async move {
                match state {
                    Watch::Start(mut client, range) => {
                        let options = WatchOptions::new().with_prefix();
                        let stream = client.watch(range, Some(options)).await.ok()?;
                        Some(((), Watch::Open(stream)))
                    }
                    Watch::Open(mut stream) => match stream.message().await {
                        Ok(Some(resp)) if !resp.canceled() => Some(((), Watch::Open(stream))),
                        _ => None,
                    },
                }
            })
            .boxed(),
        )
    }

    /// Reads the name's queue in create-revision order: the holders are its compatible head
    /// (see `keys::holder_count`), the latest of them is reported. The remaining lease is
    /// not reported.
    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        let range = keys::name_range(&self.shared.prefix, name.as_str());
        let options = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend);
        let resp = self
            .get_retrying(
                range.clone().into_bytes(),
                options,
                "reading the lock queue",
            )
            .await?;
        let queue: Vec<QueuedKey> = resp
            .kvs()
            .iter()
            .map(|kv| QueuedKey::new(&range, kv))
            .collect();
        Ok(holders_info(&queue))
    }

    /// Reads the keys under the prefix page by page in key order (all keys of one name are
    /// adjacent); each name's holders are found as for `inspect`. Stops once `limit` names
    /// are complete. The remaining lease is not reported.
    /// The keys under the prefix of the names (`<prefix>/<escaped name>/...`: holders and
    /// waiters), counted by the server (`count_only`). Deleted keys that etcd keeps in its
    /// history until a compaction are not counted.
    async fn footprint(&self, prefix: &str) -> Result<Option<distlock_core::Footprint>> {
        let start = format!("{}/{}", self.shared.prefix, keys::escape(prefix));
        let options = GetOptions::new()
            .with_range(keys::range_end(&start))
            .with_count_only();
        let resp = self
            .get_retrying(start.into_bytes(), options, "counting keys")
            .await?;
        let count = u64::try_from(resp.count()).unwrap_or_default();
        Ok(Some(
            distlock_core::Footprint::new("keys").with("queue keys", count),
        ))
    }

    async fn list(&self, prefix: Option<&str>, limit: usize) -> Result<Vec<(LockName, LockInfo)>> {
        let base = format!("{}/", self.shared.prefix);
        let start = format!("{base}{}", keys::escape(prefix.unwrap_or("")));
        let end = keys::range_end(&start);
        let mut next = start.into_bytes();
        let mut held: Vec<(LockName, LockInfo)> = Vec::new();
        // The name being read and its keys so far.
        let mut current: Option<(String, Vec<QueuedKey>)> = None;
        let finish = |current: Option<(String, Vec<QueuedKey>)>, held: &mut Vec<_>| {
            if let Some((escaped, mut queue)) = current
                && let Some(name) = keys::unescape(&escaped).and_then(|n| LockName::new(n).ok())
            {
                queue.sort_by_key(|k| k.rev);
                if let Some(info) = holders_info(&queue) {
                    held.push((name, info));
                }
            }
        };
        loop {
            let options = GetOptions::new()
                .with_range(end.clone())
                .with_limit(LIST_PAGE);
            let resp = self
                .get_retrying(next.clone(), options, "listing locks")
                .await?;
            for kv in resp.kvs() {
                let key = kv.key_str().unwrap_or_default();
                let Some((escaped, _)) = key.strip_prefix(&base).and_then(|k| k.split_once('/'))
                else {
                    continue;
                };
                let range = format!("{base}{escaped}/");
                match &mut current {
                    Some((name, queue)) if name == escaped => {
                        queue.push(QueuedKey::new(&range, kv));
                    }
                    _ => {
                        finish(current.take(), &mut held);
                        if held.len() >= limit {
                            return Ok(held);
                        }
                        current = Some((escaped.to_owned(), vec![QueuedKey::new(&range, kv)]));
                    }
                }
            }
            match resp.kvs().last() {
                Some(last) if resp.more() => {
                    next = last.key().to_vec();
                    next.push(0);
                }
                _ => break,
            }
        }
        finish(current, &mut held);
        held.truncate(limit);
        Ok(held)
    }

    /// Deletes every holder's key (the name's compatible head, as `inspect` finds it), each
    /// only if it is still that key. The waiters behind watch exactly those deletions and take
    /// the lock; their keys were created later, so their tokens (create revisions) are higher.
    /// A former holder's renewal finds its key gone and reports the loss.
    async fn force_release(&self, name: &LockName) -> Result<bool> {
        self.remove_holders(name, None).await
    }

    /// As [`force_release`](LockBackend::force_release), for the one holder key whose value
    /// is `owner` and whose create revision (its token) is `token`, deleted in a transaction
    /// that compares both.
    async fn release_hold(
        &self,
        name: &LockName,
        owner: &str,
        token: FencingToken,
    ) -> Result<bool> {
        self.remove_holders(name, Some((owner, token))).await
    }
}

impl EtcdBackend {
    /// Deletes the holders of `name`, or only the one of `(owner, token)`: whether any was.
    async fn remove_holders(
        &self,
        name: &LockName,
        only: Option<(&str, FencingToken)>,
    ) -> Result<bool> {
        let range = keys::name_range(&self.shared.prefix, name.as_str());
        let mut queue = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend);
        if only.is_none() {
            queue = queue.with_keys_only();
        }
        for _ in 0..8 {
            let resp = self
                .get_retrying(
                    range.clone().into_bytes(),
                    queue.clone(),
                    "reading the lock queue",
                )
                .await?;
            let keys: Vec<QueuedKey> = resp
                .kvs()
                .iter()
                .map(|kv| QueuedKey::new(&range, kv))
                .collect();
            if keys.is_empty() {
                return Ok(false);
            }
            if let Some((owner, token)) = only {
                let kinds: Vec<LockKind> = keys.iter().map(|k| k.kind).collect();
                let Some(hold) = keys[..keys::holder_count(&kinds)].iter().find(|k| {
                    k.owner == owner.as_bytes() && u64::try_from(k.rev).ok() == Some(token.get())
                }) else {
                    return Ok(false);
                };
                // Its create revision, compared in the transaction, is this very hold's: a key
                // reused by its client since has another (and the value, owner and holder
                // data, may change under a holder's set_data).
                return self.delete_if(hold).await;
            }
            if self.delete_holders(&keys).await? {
                return Ok(true);
            }
            // Every holder released meanwhile: look at the new head.
        }
        Ok(false)
    }

    /// Deletes the holders among `queue` (in create-revision order), each only if it is still
    /// that key; whether any was.
    async fn delete_holders(&self, queue: &[QueuedKey]) -> Result<bool> {
        let kinds: Vec<LockKind> = queue.iter().map(|k| k.kind).collect();
        let mut removed = false;
        for holder in &queue[..keys::holder_count(&kinds)] {
            // Not deleted: that holder released meanwhile.
            removed |= self.delete_if(holder).await?;
        }
        Ok(removed)
    }

    /// Deletes `holder`'s key if it still has its create revision: whether it did.
    async fn delete_if(&self, holder: &QueuedKey) -> Result<bool> {
        let txn = Txn::new()
            .when([Compare::create_revision(
                holder.key.clone(),
                CompareOp::Equal,
                holder.rev,
            )])
            .and_then([TxnOp::delete(holder.key.clone(), None)]);
        let done = self
            .shared
            .client
            .kv_client()
            .txn(txn)
            .await
            .map_err(|e| map_err("deleting a holder's key", e))?;
        Ok(done.succeeded())
    }
}

/// One key of a name's queue, as `inspect`, `list` and `force_release` read it.
struct QueuedKey {
    key: Vec<u8>,
    rev: i64,
    kind: LockKind,
    owner: Vec<u8>,
    data: Option<Vec<u8>>,
}

impl QueuedKey {
    fn new(range: &str, kv: &etcd_client::KeyValue) -> Self {
        let (owner, data) = keys::owner_and_data(kv.value());
        Self {
            key: kv.key().to_vec(),
            rev: kv.create_revision(),
            kind: keys::key_kind(range, kv.key()),
            owner: owner.to_vec(),
            data: data.map(<[u8]>::to_vec),
        }
    }
}

/// Who holds a name, from its queue in create-revision order: the latest holder, the kind and
/// the number of holders.
fn holders_info(queue: &[QueuedKey]) -> Option<LockInfo> {
    let kinds: Vec<LockKind> = queue.iter().map(|k| k.kind).collect();
    let count = keys::holder_count(&kinds);
    let latest = queue[..count].last()?;
    Some(
        LockInfo::new(
            String::from_utf8_lossy(&latest.owner).into_owned(),
            token(latest.rev).ok(),
            None,
        )
        .with_holders(latest.kind, u32::try_from(count).unwrap_or(u32::MAX))
        .with_data(
            latest
                .data
                .as_ref()
                .map(|data| String::from_utf8_lossy(data).into_owned()),
        ),
    )
}

/// Keys per page of [`LockBackend::list`]'s range reads.
pub(crate) const LIST_PAGE: i64 = 512;

impl EtcdBackend {
    /// One key-range read (safe to repeat), retried after a transport error.
    async fn get_retrying(
        &self,
        key: Vec<u8>,
        options: GetOptions,
        what: &str,
    ) -> Result<etcd_client::GetResponse> {
        transient(what, retryable, &self.shared.members, || {
            let mut kv = self.shared.client.kv_client();
            let (key, options) = (key.clone(), options.clone());
            async move { kv.get(key, Some(options)).await }
        })
        .await
    }
}
