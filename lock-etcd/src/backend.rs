//! The protocol: shared leases, the revision-ordered queue, watches and the reaper.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex, OnceLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use distlock_core::{
    AcquireRequest, Acquired, Attempt, AttemptMode, Capabilities, Error, FencingGuarantee,
    FencingToken, Lease, LockBackend, LockInfo, LockName, LossDetection, Result, Step, WakeUp,
};
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, LeaseKeepAliveStream,
    LeaseKeeper, PutOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse, WatchFilterType,
    WatchOptions, WatchStream,
};
use tokio::sync::{mpsc, oneshot, watch};
use tracing::debug;

use crate::config::EtcdConfig;
use crate::keys;
use distlock_core::backend::unpoisoned as lock;

/// The shortest lease etcd grants with its default heartbeat settings (shorter requests are
/// silently raised to it).
pub const MIN_TTL: Duration = Duration::from_secs(2);
/// The longest ttl this backend accepts.
pub const MAX_TTL: Duration = Duration::from_secs(24 * 3600);

/// The etcd lock protocol over one [`etcd_client::Client`] (one connection pool, one lease per
/// distinct ttl). Build it with [`EtcdBackend::connect`] and wrap it in a
/// [`distlock_core::LockClient`], or use [`crate::connect`].
#[derive(Clone)]
pub struct EtcdBackend {
    shared: Arc<Shared>,
}

struct Shared {
    client: Client,
    prefix: String,
    endpoints: Vec<String>,
    /// One lease per ttl in whole seconds, granted on first use, replaced when it is gone.
    leases: tokio::sync::Mutex<HashMap<i64, Arc<LeaseSlot>>>,
    /// The renewal batcher's queue, started on first use.
    checks: OnceLock<mpsc::UnboundedSender<KeyCheck>>,
    /// The queue keys this client uses, per name.
    keys: KeyPool,
}

/// The queue keys of one client: `<range><client tag>.<n>`, with the smallest `n` not in use
/// on that name, so that a client reuses the same few keys. etcd keeps a deleted key in its
/// index until the next compaction, and every read of a name's queue walks all of them: with a
/// fresh key per acquisition (the owner), a busy name slowed down by about 0.5 µs per past
/// acquisition (an S1 cycle went from 1.6 to 3.1 ms in 1750 cycles) until the server compacted.
/// A key is reused only once it is known to be gone (see [`QueueKey`]).
struct KeyPool {
    /// Random, so that no two clients share keys.
    tag: String,
    used: StdMutex<HashMap<String, std::collections::BTreeSet<u32>>>,
}

impl KeyPool {
    fn new() -> Self {
        let tag = uuid::Uuid::new_v4().simple().to_string();
        Self {
            tag: tag[..16].to_owned(),
            used: StdMutex::default(),
        }
    }

    fn take(&self, range: &str) -> u32 {
        let mut used = lock(&self.used);
        let set = used.entry(range.to_owned()).or_default();
        let n = (0..).find(|n| !set.contains(n)).unwrap_or(u32::MAX);
        set.insert(n);
        n
    }

    fn give_back(&self, range: &str, n: u32) {
        let mut used = lock(&self.used);
        if let Some(set) = used.get_mut(range) {
            set.remove(&n);
            if set.is_empty() {
                used.remove(range);
            }
        }
    }
}

/// One queue key, shared by the attempt, the lease and the reaper that use it. Its number goes
/// back to the pool as soon as the key is known to be deleted ([`QueueKey::deleted`]), or
/// when the last user is done and no put of it was ever sent. A key that may still exist on
/// the server (a put or delete whose answer never came) is never reused, so that no attempt
/// can mistake it for its own. Every write to a key after its put compares its create
/// revision, so a stale handle cannot touch a later use of the same key.
struct QueueKey {
    shared: Arc<Shared>,
    /// The name's key range: its whole queue.
    range: String,
    number: u32,
    key: String,
    may_exist: AtomicBool,
    returned: AtomicBool,
}

impl QueueKey {
    fn new(shared: &Arc<Shared>, range: String) -> Arc<Self> {
        let number = shared.keys.take(&range);
        Arc::new(Self {
            shared: shared.clone(),
            key: keys::entry_key(&range, &shared.keys.tag, number),
            range,
            number,
            may_exist: AtomicBool::new(false),
            returned: AtomicBool::new(false),
        })
    }

    fn may_exist(&self) -> bool {
        self.may_exist.load(Ordering::Acquire)
    }

    fn set_may_exist(&self, may: bool) {
        self.may_exist.store(may, Ordering::Release);
    }

    /// The key is gone from the server: its number may serve the next attempt at once.
    fn deleted(&self) {
        self.set_may_exist(false);
        self.give_back();
    }

    fn give_back(&self) {
        if !self.returned.swap(true, Ordering::AcqRel) {
            self.shared.keys.give_back(&self.range, self.number);
        }
    }
}

impl Drop for QueueKey {
    fn drop(&mut self) {
        if self.may_exist() {
            debug!(key = %self.key, "a queue key that may still exist is not reused");
        } else {
            self.give_back();
        }
    }
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
    /// Connects to the cluster of `config`. The connection is made lazily: an unreachable
    /// cluster shows up as [`Error::Unavailable`] on the first operation, within the core's
    /// operation timeout (`connect_timeout` bounds each connection attempt).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] if the client library rejects an endpoint.
    pub async fn connect(config: &EtcdConfig, connect_timeout: Duration) -> Result<Self> {
        let options = ConnectOptions::new()
            .with_connect_timeout(connect_timeout)
            .with_keep_alive(Duration::from_secs(2), connect_timeout)
            .with_keep_alive_while_idle(true);
        let connecting = Client::connect(config.endpoints(), Some(options));
        let client = match tokio::time::timeout(connect_timeout, connecting).await {
            Ok(Ok(client)) => client,
            Ok(Err(
                err @ (etcd_client::Error::InvalidArgs(_) | etcd_client::Error::InvalidUri(_)),
            )) => {
                return Err(Error::InvalidConfig(format!(
                    "etcd endpoints {:?}: {err}",
                    config.endpoints()
                )));
            }
            Ok(Err(err)) => return Err(map_err("connecting to etcd", err)),
            Err(_) => {
                return Err(Error::Unavailable {
                    message: format!("connecting to etcd took longer than {connect_timeout:?}"),
                    source: None,
                });
            }
        };
        // etcd-client connects lazily: a dead endpoint would only show at the first lock
        // operation, and a waiter would retry it silently. A status call verifies that some
        // endpoint answers; requests are spread over the endpoints, so one try per endpoint
        // (plus one) lets a cluster with a member down pass.
        let endpoints = config.endpoints().join(",");
        let probe = async {
            let mut last = None;
            for _ in 0..=config.endpoints().len() {
                match client.clone().status().await {
                    Ok(_) => return Ok(()),
                    Err(err) => last = Some(err),
                }
            }
            Err(last)
        };
        match tokio::time::timeout(connect_timeout, probe).await {
            Ok(Ok(())) => {}
            Ok(Err(err)) => {
                // The gRPC status keeps the OS's reason out of its source chain: ask the
                // network why.
                let reason =
                    match distlock_core::tcp_cause(config.endpoints(), connect_timeout / 4).await {
                        Some(io) => io,
                        None => err.as_ref().map(cause).unwrap_or_default(),
                    };
                return Err(Error::Unavailable {
                    message: format!("cannot connect to etcd at {endpoints}: {reason}"),
                    source: err.map(|e| Box::new(e) as distlock_core::BoxError),
                });
            }
            Err(_) => {
                return Err(Error::Unavailable {
                    message: format!(
                        "etcd at {endpoints} did not answer within {connect_timeout:?}"
                    ),
                    source: None,
                });
            }
        }
        Ok(Self::from_client(client, config))
    }

    /// Uses an existing client (its endpoints are taken from `config` for diagnostics only).
    pub fn from_client(client: Client, config: &EtcdConfig) -> Self {
        Self {
            shared: Arc::new(Shared {
                client,
                prefix: config.prefix().to_owned(),
                endpoints: config.endpoints().to_vec(),
                leases: tokio::sync::Mutex::default(),
                checks: OnceLock::new(),
                keys: KeyPool::new(),
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
    }

    fn begin(&self, request: AcquireRequest) -> Box<dyn Attempt> {
        let range = keys::name_range(&self.shared.prefix, request.name.as_str());
        let key = QueueKey::new(&self.shared, range);
        Box::new(EtcdAttempt {
            shared: self.shared.clone(),
            name: request.name.as_str().to_owned(),
            mode: request.mode,
            ttl: request.ttl,
            owner: request.owner,
            key,
            slot: None,
            rev: None,
            watch_target: None,
            watch: None,
        })
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        let range = keys::name_range(&self.shared.prefix, name.as_str());
        let options = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1);
        let mut failures = 0;
        let resp = loop {
            match self
                .shared
                .client
                .kv_client()
                .get(range.clone(), Some(options.clone()))
                .await
            {
                Err(err) if retryable(&err) && failures < TRANSPORT_RETRIES => {
                    retry_pause(&mut failures).await;
                }
                other => break other.map_err(|e| map_err("reading the lock queue", e))?,
            }
        };
        Ok(resp.kvs().first().map(|kv| {
            LockInfo::new(
                String::from_utf8_lossy(kv.value()).into_owned(),
                Some(token(kv.create_revision())),
                None,
            )
        }))
    }

    /// Reads the keys under the prefix page by page in key order (all keys of one name are
    /// adjacent); each name's holder is its key with the lowest create revision, as for
    /// `inspect`. Stops once `limit` names are complete. The remaining lease is not reported.
    async fn list(&self, prefix: Option<&str>, limit: usize) -> Result<Vec<(LockName, LockInfo)>> {
        let base = format!("{}/", self.shared.prefix);
        let start = format!("{base}{}", keys::escape(prefix.unwrap_or("")));
        let end = keys::range_end(&start);
        let mut next = start.into_bytes();
        let mut held: Vec<(LockName, LockInfo)> = Vec::new();
        // The name being read and its head so far: (escaped name, create revision, owner).
        let mut current: Option<(String, i64, Vec<u8>)> = None;
        let finish = |current: Option<(String, i64, Vec<u8>)>, held: &mut Vec<_>| {
            if let Some((escaped, rev, owner)) = current
                && let Some(name) = keys::unescape(&escaped).and_then(|n| LockName::new(n).ok())
            {
                let owner = String::from_utf8_lossy(&owner).into_owned();
                held.push((name, LockInfo::new(owner, Some(token(rev)), None)));
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
                match &mut current {
                    Some((name, rev, owner)) if name == escaped => {
                        if kv.create_revision() < *rev {
                            *rev = kv.create_revision();
                            *owner = kv.value().to_vec();
                        }
                    }
                    _ => {
                        finish(current.take(), &mut held);
                        if held.len() >= limit {
                            return Ok(held);
                        }
                        current = Some((
                            escaped.to_owned(),
                            kv.create_revision(),
                            kv.value().to_vec(),
                        ));
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

    /// Deletes the holder's key (the name's key with the lowest create revision) if it is still
    /// that key. The next waiter watches exactly that deletion and takes the lock; its key was
    /// created later, so its token (create revision) is higher. The former holder's renewal
    /// finds its key gone and reports the loss.
    async fn force_release(&self, name: &LockName) -> Result<bool> {
        let range = keys::name_range(&self.shared.prefix, name.as_str());
        let head = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1)
            .with_keys_only();
        for _ in 0..8 {
            let resp = self
                .get_retrying(
                    range.clone().into_bytes(),
                    head.clone(),
                    "reading the lock queue",
                )
                .await?;
            let Some(kv) = resp.kvs().first() else {
                return Ok(false);
            };
            let key = kv.key().to_vec();
            let txn = Txn::new()
                .when([Compare::create_revision(
                    key.clone(),
                    CompareOp::Equal,
                    kv.create_revision(),
                )])
                .and_then([TxnOp::delete(key, None)]);
            let done = self
                .shared
                .client
                .kv_client()
                .txn(txn)
                .await
                .map_err(|e| map_err("force release", e))?;
            if done.succeeded() {
                return Ok(true);
            }
            // The holder released meanwhile: look at the new head.
        }
        Ok(false)
    }
}

/// Keys per page of [`LockBackend::list`]'s range reads.
const LIST_PAGE: i64 = 512;

impl EtcdBackend {
    /// One key-range read, retried at once after a transport error as `inspect` is.
    async fn get_retrying(
        &self,
        key: Vec<u8>,
        options: GetOptions,
        what: &str,
    ) -> Result<etcd_client::GetResponse> {
        let mut failures = 0;
        loop {
            match self
                .shared
                .client
                .kv_client()
                .get(key.clone(), Some(options.clone()))
                .await
            {
                Err(err) if retryable(&err) && failures < TRANSPORT_RETRIES => {
                    retry_pause(&mut failures).await;
                }
                other => return other.map_err(|e| map_err(what, e)),
            }
        }
    }
}

fn token(revision: i64) -> FencingToken {
    FencingToken::new(u64::try_from(revision).unwrap_or(0))
}

/// Maps a client error: transport and availability problems are retryable.
fn map_err(what: &str, err: etcd_client::Error) -> Error {
    let message = format!("{what}: {}", cause(&err));
    if retryable(&err) {
        Error::unavailable(message, err)
    } else {
        Error::backend(message, err)
    }
}

/// A client error in one short line: the operating system's reason for a transport failure
/// (`connection refused`) instead of the gRPC and transport layers' debug dump.
fn cause(err: &etcd_client::Error) -> String {
    match (distlock_core::io_cause(err), err) {
        (Some(io), _) => io,
        (None, etcd_client::Error::GRpcStatus(status)) => {
            format!("{} ({:?})", status.message(), status.code())
        }
        (None, other) => other.to_string(),
    }
}

/// Whether a client error is a transport or availability problem (worth retrying).
fn retryable(err: &etcd_client::Error) -> bool {
    use etcd_client::Error as E;
    match err {
        // Not retryable: INVALID_ARGUMENT 3, NOT_FOUND 5, ALREADY_EXISTS 6, PERMISSION_DENIED 7,
        // FAILED_PRECONDITION 9, OUT_OF_RANGE 11, UNIMPLEMENTED 12, UNAUTHENTICATED 16.
        E::GRpcStatus(status) => !matches!(status.code() as i32, 3 | 5 | 6 | 7 | 9 | 11 | 12 | 16),
        E::TransportError(_)
        | E::IoError(_)
        | E::WatchError(_)
        | E::LeaseKeepAliveError(_)
        | E::EndpointError(_) => true,
        _ => false,
    }
}

/// How often one operation is retried at once after a transport error.
const TRANSPORT_RETRIES: u32 = 4;

/// A short, growing pause before retrying after a transport error (10, 20, 40, 80 ms).
async fn retry_pause(failures: &mut u32) {
    tokio::time::sleep(Duration::from_millis(10 << *failures)).await;
    *failures += 1;
}

/// Whether a request certainly never reached a server (the connection could not be made).
fn not_sent(err: &etcd_client::Error) -> bool {
    match err {
        etcd_client::Error::GRpcStatus(status) => {
            // UNAVAILABLE 14, from a failed connection attempt.
            status.code() as i32 == 14 && status.message().contains("connect")
        }
        _ => false,
    }
}

/// Whether a write failed because its lease is gone.
fn lease_not_found(err: &etcd_client::Error) -> bool {
    matches!(err, etcd_client::Error::GRpcStatus(s) if s.message().contains("lease not found"))
}

impl Shared {
    /// Whether `key` still exists with create revision `rev`. Concurrent checks of one client
    /// are batched into one transaction (see [`check_keys`]).
    async fn key_is_ours(&self, key: &str, rev: i64) -> Result<bool> {
        let queue = self.checks.get_or_init(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            tokio::spawn(check_keys(self.client.clone(), rx));
            tx
        });
        let (reply, answer) = oneshot::channel();
        let check = KeyCheck {
            key: key.to_owned(),
            rev,
            reply,
        };
        if queue.send(check).is_ok()
            && let Ok(ours) = answer.await
        {
            return ours;
        }
        // The batcher is gone (the runtime that started it shut down): read directly.
        let options = GetOptions::new().with_keys_only();
        let resp = self
            .client
            .kv_client()
            .get(key, Some(options))
            .await
            .map_err(|e| map_err("renewing", e))?;
        Ok(resp
            .kvs()
            .first()
            .is_some_and(|kv| kv.create_revision() == rev))
    }

    /// The client's lease for `ttl` (rounded up to whole seconds), granted if needed.
    async fn slot(&self, ttl: Duration) -> Result<Arc<LeaseSlot>> {
        let secs = i64::try_from(ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0))
            .unwrap_or(i64::MAX)
            .max(1);
        let mut leases = self.leases.lock().await;
        if let Some(slot) = leases.get(&secs)
            && !slot.is_dead()
        {
            return Ok(slot.clone());
        }
        let sent = Instant::now();
        let resp = self
            .client
            .lease_client()
            .grant(secs, None)
            .await
            .map_err(|e| map_err("granting a lease", e))?;
        if !resp.error().is_empty() {
            return Err(Error::Backend {
                message: format!("etcd refused a lease: {}", resp.error()),
                source: None,
            });
        }
        // etcd may raise a short ttl to its minimum; never lower.
        let granted = u64::try_from(resp.ttl().max(secs)).unwrap_or(u64::MAX);
        let slot = Arc::new(LeaseSlot {
            id: resp.id(),
            ttl: Duration::from_secs(granted),
            refreshed: StdMutex::new(sent),
            dead: AtomicBool::new(false),
            keepalive: tokio::sync::Mutex::default(),
        });
        debug!(lease = slot.id, ttl = granted, "granted a lease");
        leases.insert(secs, slot.clone());
        Ok(slot)
    }

    /// A live lease for `ttl` whose last refresh is recent, refreshing it (one cheap
    /// keepalive, no raft round) or granting a new one when needed.
    async fn fresh_slot(&self, ttl: Duration) -> Result<Arc<LeaseSlot>> {
        for _ in 0..3 {
            let slot = self.slot(ttl).await?;
            if slot.refreshed().elapsed() < slot.ttl / 10 {
                return Ok(slot);
            }
            if slot.keep_alive(&self.client, Instant::now()).await? {
                return Ok(slot);
            }
        }
        Err(Error::Backend {
            message: "etcd leases kept disappearing right after being granted".into(),
            source: None,
        })
    }
}

/// One lease shared by the client's queue entries of one ttl, with its keepalive stream.
struct LeaseSlot {
    id: i64,
    ttl: Duration,
    /// When the last successful grant or keepalive was sent: the server keeps the lease at
    /// least until this instant + `ttl`.
    refreshed: StdMutex<Instant>,
    dead: AtomicBool,
    keepalive: tokio::sync::Mutex<KeepAlive>,
}

#[derive(Default)]
struct KeepAlive {
    stream: Option<(LeaseKeeper, LeaseKeepAliveStream)>,
    /// Keepalives sent on `stream` whose answer was not read yet (a cancelled call).
    unanswered: usize,
}

impl LeaseSlot {
    fn refreshed(&self) -> Instant {
        *lock(&self.refreshed)
    }

    fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    fn mark_dead(&self) {
        self.dead.store(true, Ordering::Release);
    }

    /// Keeps the lease alive: `Ok(true)` if it is (a keepalive sent at or after `since`
    /// succeeded), `Ok(false)` if the server says it is gone. Cancel safe.
    async fn keep_alive(&self, client: &Client, since: Instant) -> Result<bool> {
        let mut guard = self.keepalive.lock().await;
        if self.is_dead() {
            return Ok(false);
        }
        if self.refreshed() >= since {
            return Ok(true); // coalesced with a concurrent caller's keepalive
        }
        let KeepAlive { stream, unanswered } = &mut *guard;
        let sent = Instant::now();
        let alive = match stream {
            Some((keeper, responses)) => {
                if let Err(err) = keeper.keep_alive().await {
                    *stream = None;
                    *unanswered = 0;
                    return Err(map_err("sending a lease keepalive", err));
                }
                *unanswered += 1;
                let mut ttl = 0;
                while *unanswered > 0 {
                    match responses.message().await {
                        Ok(Some(resp)) => {
                            *unanswered -= 1;
                            ttl = resp.ttl();
                        }
                        Ok(None) => {
                            *stream = None;
                            *unanswered = 0;
                            return Err(Error::Unavailable {
                                message: "the lease keepalive stream ended".into(),
                                source: None,
                            });
                        }
                        Err(err) => {
                            *stream = None;
                            *unanswered = 0;
                            return Err(map_err("reading a lease keepalive answer", err));
                        }
                    }
                }
                ttl > 0
            }
            None => match client.lease_client().keep_alive(self.id).await {
                Ok(opened) => {
                    *stream = Some(opened);
                    *unanswered = 0;
                    true
                }
                // The library's way of saying the first answer had ttl 0.
                Err(etcd_client::Error::LeaseKeepAliveError(_)) => false,
                Err(err) => return Err(map_err("opening a lease keepalive stream", err)),
            },
        };
        if alive {
            let mut refreshed = lock(&self.refreshed);
            *refreshed = (*refreshed).max(sent);
        } else {
            debug!(lease = self.id, "lease is gone");
            self.mark_dead();
        }
        Ok(alive)
    }
}

/// One acquisition: a queue key of the client on its lease, with the owner as its value.
struct EtcdAttempt {
    shared: Arc<Shared>,
    name: String,
    mode: AttemptMode,
    ttl: Duration,
    owner: String,
    key: Arc<QueueKey>,
    /// The lease the key is attached to.
    slot: Option<Arc<LeaseSlot>>,
    /// The key's create revision once it is known to be queued.
    rev: Option<i64>,
    /// The predecessor to watch and the revision to watch from.
    watch_target: Option<(String, i64)>,
    /// The predecessor watched, the stream, and the revision the watch started after.
    watch: Option<(String, WatchStream, i64)>,
}

impl EtcdAttempt {
    fn acquired(
        &mut self,
        slot: Arc<LeaseSlot>,
        rev: i64,
        lease_started: Instant,
        poll_started: Instant,
    ) -> Step {
        self.watch = None;
        let (reaper, rx) = watch::channel(Some(poll_started + self.ttl));
        tokio::spawn(reap(self.key.clone(), rev, rx));
        let lease = EtcdLease {
            shared: self.shared.clone(),
            slot,
            name: self.name.clone(),
            key: self.key.clone(),
            rev,
            reaper,
        };
        Step::Acquired(Acquired::new(Box::new(lease), token(rev)).with_lease_started(lease_started))
    }

    fn put_op(&self, slot: &LeaseSlot) -> TxnOp {
        TxnOp::put(
            self.key.key.clone(),
            self.owner.clone(),
            Some(PutOptions::new().with_lease(slot.id)),
        )
    }

    /// `try_acquire`: put the key only if the name has no key at all (nobody holds or waits).
    async fn poll_try(&mut self, started: Instant) -> Result<Option<Step>> {
        let slot = self.shared.fresh_slot(self.ttl).await?;
        let lease_started = slot.refreshed();
        // Otherwise read the first key: ours if an earlier poll's answer was lost.
        let first = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1)
            .with_keys_only();
        let txn = Txn::new()
            .when([
                Compare::create_revision(self.key.range.clone(), CompareOp::Equal, 0).with_prefix(),
            ])
            .and_then([self.put_op(&slot)])
            .or_else([TxnOp::get(self.key.range.clone(), Some(first))]);
        let before = self.key.may_exist();
        self.key.set_may_exist(true);
        self.slot = Some(slot.clone());
        match self.shared.client.kv_client().txn(txn).await {
            Err(err) if lease_not_found(&err) => {
                slot.mark_dead();
                self.key.set_may_exist(before);
                Ok(None)
            }
            Err(err) => Err(map_err("acquiring", err)),
            Ok(resp) if resp.succeeded() => {
                let rev = header_revision(resp.header())?;
                Ok(Some(self.acquired(slot, rev, lease_started, started)))
            }
            Ok(resp) => {
                let first = match resp.op_responses().into_iter().next() {
                    Some(TxnOpResponse::Get(mut get)) => get.take_kvs().into_iter().next(),
                    _ => None,
                };
                match first {
                    Some(kv) if before && kv.key() == self.key.key.as_bytes() => {
                        let rev = kv.create_revision();
                        Ok(Some(self.acquired(slot, rev, lease_started, started)))
                    }
                    _ => {
                        self.key.set_may_exist(before);
                        Ok(Some(Step::busy(None)))
                    }
                }
            }
        }
    }

    /// `acquire`, first step: join the queue and learn the predecessor in one transaction.
    async fn poll_enqueue(&mut self, started: Instant) -> Result<Option<Step>> {
        let slot = self.shared.fresh_slot(self.ttl).await?;
        let lease_started = slot.refreshed();
        let last = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_limit(1)
            .with_keys_only();
        let txn = Txn::new()
            .when([Compare::create_revision(
                self.key.key.clone(),
                CompareOp::Equal,
                0,
            )])
            .and_then([
                TxnOp::get(self.key.range.clone(), Some(last)),
                self.put_op(&slot),
            ])
            .or_else([TxnOp::get(self.key.key.clone(), None)]);
        let before = self.key.may_exist();
        self.key.set_may_exist(true);
        let resp = match self.shared.client.kv_client().txn(txn).await {
            Err(err) if lease_not_found(&err) => {
                slot.mark_dead();
                self.key.set_may_exist(before);
                return Ok(None);
            }
            Err(err) => return Err(map_err("joining the lock queue", err)),
            Ok(resp) => resp,
        };
        let revision = header_revision(resp.header())?;
        let first_kvs = match resp.op_responses().into_iter().next() {
            Some(TxnOpResponse::Get(mut get)) => get.take_kvs(),
            _ => return Err(protocol("a transaction answered without its read")),
        };
        if !resp.succeeded() {
            // Our key exists already: an earlier poll's answer was lost. Find its place.
            match first_kvs.first() {
                Some(kv) => {
                    self.rev = Some(kv.create_revision());
                    if self.slot.is_none() {
                        self.slot = Some(slot);
                    }
                }
                None => self.rev = None,
            }
            return Ok(None);
        }
        self.slot = Some(slot.clone());
        match first_kvs.first() {
            None => Ok(Some(self.acquired(slot, revision, lease_started, started))),
            Some(pred) => {
                self.rev = Some(revision);
                self.watch_target = Some((key_string(pred.key()), revision + 1));
                Ok(Some(Step::busy(None)))
            }
        }
    }

    /// Whether our key (created at `rev`) exists, and the last key before it.
    async fn position_txn(&self, rev: i64, serializable: bool) -> Result<etcd_client::TxnResponse> {
        let mut before = GetOptions::new()
            .with_prefix()
            .with_max_create_revision(rev - 1)
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_limit(1)
            .with_keys_only();
        if serializable {
            before = before.with_serializable();
        }
        let txn = Txn::new()
            .when([Compare::create_revision(
                self.key.key.clone(),
                CompareOp::Equal,
                rev,
            )])
            .and_then([TxnOp::get(self.key.range.clone(), Some(before))]);
        self.shared
            .client
            .kv_client()
            .txn(txn)
            .await
            .map_err(|e| map_err("checking the lock queue", e))
    }

    /// `acquire`, later steps: is there still a key before ours?
    async fn poll_position(&mut self, rev: i64, started: Instant) -> Result<Option<Step>> {
        let Some(slot) = self.slot.clone() else {
            self.rev = None;
            return Ok(None);
        };
        if slot.refreshed().elapsed() >= slot.ttl / 10
            && !slot.keep_alive(&self.shared.client, Instant::now()).await?
        {
            self.rev = None; // the lease and our key are gone: queue again
            return Ok(None);
        }
        let lease_started = slot.refreshed();
        // First a serializable read, answered by whichever member the request reaches without
        // a quorum round: any snapshot that holds our key and no key before it proves that
        // every earlier key is gone for good (create revisions never come back). A lagging
        // snapshot (our key not in it yet, or a predecessor that may be gone meanwhile) is
        // confirmed by a linearizable read.
        let mut resp = self.position_txn(rev, true).await?;
        let head = resp.succeeded()
            && matches!(
                resp.op_responses().first(),
                Some(TxnOpResponse::Get(get)) if get.kvs().is_empty()
            );
        if !head {
            resp = self.position_txn(rev, false).await?;
        }
        if !resp.succeeded() {
            debug!(name = %self.name, "our queue key vanished; queueing again");
            self.rev = None;
            self.watch = None;
            self.watch_target = None;
            return Ok(None);
        }
        let revision = header_revision(resp.header())?;
        let kvs = match resp.op_responses().into_iter().next() {
            Some(TxnOpResponse::Get(mut get)) => get.take_kvs(),
            _ => return Err(protocol("a transaction answered without its read")),
        };
        match kvs.first() {
            None => Ok(Some(self.acquired(slot, rev, lease_started, started))),
            Some(pred) => {
                self.watch_target = Some((key_string(pred.key()), revision + 1));
                Ok(Some(Step::busy(None)))
            }
        }
    }
}

fn key_string(key: &[u8]) -> String {
    String::from_utf8_lossy(key).into_owned()
}

fn header_revision(header: Option<&etcd_client::ResponseHeader>) -> Result<i64> {
    header
        .map(etcd_client::ResponseHeader::revision)
        .filter(|r| *r > 0)
        .ok_or_else(|| protocol("a response without a revision"))
}

fn protocol(message: &str) -> Error {
    Error::Backend {
        message: format!("unexpected etcd answer: {message}"),
        source: None,
    }
}

#[async_trait]
impl Attempt for EtcdAttempt {
    async fn poll(&mut self) -> Result<Step> {
        let started = Instant::now();
        // A few rounds: a lease that vanished, or a lost answer, costs one more round. Every
        // step is safe to repeat (a repeated put finds its own key), so a transport error is
        // retried at once: the client balances over the endpoints, and a request routed to a
        // member that just went down fails before the balancer skips it.
        let mut failures = 0;
        for _ in 0..4 {
            let step = loop {
                let result = match (self.mode, self.rev) {
                    (AttemptMode::Try, _) => self.poll_try(started).await,
                    (AttemptMode::Wait, None) => self.poll_enqueue(started).await,
                    (AttemptMode::Wait, Some(rev)) => self.poll_position(rev, started).await,
                };
                match result {
                    Err(err) if err.is_retryable() && failures < TRANSPORT_RETRIES => {
                        debug!(%err, "retrying an acquire step");
                        retry_pause(&mut failures).await;
                    }
                    other => break other?,
                }
            };
            if let Some(step) = step {
                return Ok(step);
            }
        }
        Err(Error::Unavailable {
            message: "the lock queue kept changing under this attempt".into(),
            source: None,
        })
    }

    async fn changed(&mut self) {
        loop {
            if let Some((pred, from)) = self.watch_target.clone() {
                if self.watch.as_ref().is_none_or(|(k, _, _)| *k != pred) {
                    self.watch = None;
                    // From "now", not from `from`: a watch that starts in the past is served by
                    // etcd's catch-up loop, which runs every 100 ms. The gap between our read
                    // and the watch's start is closed below by polling once more.
                    let options = WatchOptions::new().with_filters([WatchFilterType::NoPut]);
                    match self
                        .shared
                        .client
                        .watch_client()
                        .watch(pred.clone(), Some(options))
                        .await
                    {
                        Ok(mut stream) => match stream.message().await {
                            Ok(Some(created)) if created.created() => {
                                // No revision (never seen): trust the watch; the core's
                                // backoff maximum bounds a missed gap, a re-poll loop would not.
                                let start = header_revision(created.header()).unwrap_or(0);
                                self.watch = Some((pred, stream, start));
                            }
                            // Anything else (an event, an error, the end): poll again.
                            _ => return,
                        },
                        Err(err) => {
                            // Leave it to the core's backoff to poll again.
                            debug!(%err, "cannot watch the predecessor");
                            self.watch_target = None;
                        }
                    }
                }
                if let Some((_, _, start)) = &self.watch
                    && from <= *start
                {
                    // The predecessor may have gone between our read and the watch's start.
                    return;
                }
            }
            // While queued, our key lives on the client's lease: keep it alive.
            let keepalive_at = self.slot.as_ref().map(|s| s.refreshed() + s.ttl / 3);
            tokio::select! {
                event = next_event(&mut self.watch) => match event {
                    Some(true) => {
                        self.watch = None;
                        self.watch_target = None;
                        return;
                    }
                    Some(false) => {}
                    None => {
                        self.watch = None;
                        self.watch_target = None;
                    }
                },
                () = sleep_until(keepalive_at) => {
                    if let Some(slot) = &self.slot {
                        match slot.keep_alive(&self.shared.client, Instant::now()).await {
                            Ok(true) => {}
                            Ok(false) => return, // our key is gone: poll queues again
                            Err(err) => {
                                debug!(%err, "keepalive while queued failed");
                                tokio::time::sleep(Duration::from_millis(100)).await;
                            }
                        }
                    }
                }
            }
        }
    }

    async fn abandon(self: Box<Self>) -> Result<()> {
        if !self.key.may_exist() {
            return Ok(());
        }
        let mut kv = self.shared.client.kv_client();
        if self.rev.is_some() {
            // A known queue entry: remove it now, so that the next client is not blocked.
            kv.delete(self.key.key.clone(), None)
                .await
                .map_err(|e| map_err("leaving the lock queue", e))?;
            self.key.deleted();
            return Ok(());
        }
        // A put whose answer never came (the server may be down): clean up in the background
        // rather than making the caller wait a second timeout; the key expires with the lease
        // otherwise.
        let key = self.key.clone();
        tokio::spawn(async move {
            for _ in 0..5 {
                match kv.delete(key.key.clone(), None).await {
                    Ok(_) => {
                        key.deleted();
                        return;
                    }
                    Err(err) => {
                        debug!(%err, key = %key.key, "removing an unanswered queue entry failed, retrying");
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                }
            }
        });
        Ok(())
    }
}

/// The next watch answer: `Some(true)` for a deletion (or a cancelled watch), `Some(false)` for
/// anything else, `None` when the stream failed. Never resolves without a watch.
async fn next_event(watch: &mut Option<(String, WatchStream, i64)>) -> Option<bool> {
    let Some((_, stream, _)) = watch else {
        return std::future::pending().await;
    };
    match stream.message().await {
        Ok(Some(resp)) => Some(
            resp.canceled()
                || resp
                    .events()
                    .iter()
                    .any(|e| e.event_type() == EventType::Delete),
        ),
        Ok(None) | Err(_) => None,
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// A held lock: its queue key, first in line, on the client's lease.
struct EtcdLease {
    shared: Arc<Shared>,
    slot: Arc<LeaseSlot>,
    name: String,
    key: Arc<QueueKey>,
    rev: i64,
    /// The instant after which the reaper deletes the key; `None` once released.
    reaper: watch::Sender<Option<Instant>>,
}

impl fmt::Debug for EtcdLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdLease")
            .field("key", &self.key.key)
            .field("revision", &self.rev)
            .field("lease", &self.slot.id)
            .finish_non_exhaustive()
    }
}

impl EtcdLease {
    fn not_held(&self) -> Error {
        Error::NotHeld {
            name: self.name.clone(),
        }
    }
}

#[async_trait]
impl Lease for EtcdLease {
    async fn renew(&self, ttl: Duration) -> Result<()> {
        let started = Instant::now();
        let (alive, ours) = tokio::join!(
            self.slot.keep_alive(&self.shared.client, started),
            self.shared.key_is_ours(&self.key.key, self.rev)
        );
        if !alive? || !ours? {
            return Err(self.not_held());
        }
        self.reaper.send_if_modified(|deadline| match deadline {
            Some(d) if *d < started + ttl => {
                *d = started + ttl;
                true
            }
            _ => false,
        });
        Ok(())
    }

    async fn release(&self) -> Result<()> {
        let mut failures = 0;
        let key = &self.key.key;
        let resp = loop {
            let txn = Txn::new()
                .when([Compare::create_revision(
                    key.clone(),
                    CompareOp::Equal,
                    self.rev,
                )])
                .and_then([TxnOp::delete(key.clone(), None)]);
            match self.shared.client.kv_client().txn(txn).await {
                // Only a request that never left may be repeated: a repeated delete whose first
                // answer was lost would find nothing and answer `NotHeld`.
                Err(err) if not_sent(&err) && failures < TRANSPORT_RETRIES => {
                    retry_pause(&mut failures).await;
                }
                other => break other.map_err(|e| map_err("releasing", e))?,
            }
        };
        self.reaper.send_replace(None);
        self.key.deleted();
        if !resp.succeeded() {
            return Err(self.not_held());
        }
        Ok(())
    }
}

/// Deletes a held key whose guard stopped renewing (abandoned, hold limit, renewal disabled)
/// once its ttl has passed, so that the lease other guards keep alive does not keep it held.
async fn reap(queue_key: Arc<QueueKey>, rev: i64, mut rx: watch::Receiver<Option<Instant>>) {
    loop {
        let Some(deadline) = *rx.borrow_and_update() else {
            return;
        };
        tokio::select! {
            () = tokio::time::sleep_until(deadline.into()) => {
                if *rx.borrow() == Some(deadline) {
                    break;
                }
            }
            changed = rx.changed() => {
                if changed.is_err() {
                    // The lease handle is gone without a release: wait out the last deadline.
                    let Some(deadline) = *rx.borrow() else { return };
                    tokio::time::sleep_until(deadline.into()).await;
                    break;
                }
            }
        }
    }
    let key = &queue_key.key;
    for _ in 0..10 {
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, rev)])
            .and_then([TxnOp::delete(key.clone(), None)]);
        match queue_key.shared.client.kv_client().txn(txn).await {
            Ok(resp) => {
                if resp.succeeded() {
                    debug!(%key, "expired lock key deleted");
                }
                // The key of this acquisition is gone either way (nobody else puts it).
                queue_key.deleted();
                return;
            }
            Err(err) => {
                debug!(%err, %key, "deleting an expired lock key failed, retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

/// One key-existence check of a renewal.
struct KeyCheck {
    key: String,
    rev: i64,
    reply: oneshot::Sender<Result<bool>>,
}

/// The most reads in one transaction (etcd's default `--max-txn-ops` is 128).
const CHECKS_PER_TXN: usize = 100;
/// The most transactions one batch sends at once.
const TXNS_PER_BATCH: usize = 8;

/// The renewal batcher of one client: every renewal must confirm that its key still exists
/// with its create revision. Checks that arrive while a batch is in flight wait for the next
/// one, which reads all their keys in one transaction per [`CHECKS_PER_TXN`] keys (group
/// commit: no added delay when idle, one round trip for a burst). Ends with the client.
async fn check_keys(client: Client, mut queue: mpsc::UnboundedReceiver<KeyCheck>) {
    let mut batch = Vec::new();
    while queue
        .recv_many(&mut batch, CHECKS_PER_TXN * TXNS_PER_BATCH)
        .await
        > 0
    {
        let chunks: Vec<Vec<KeyCheck>> = {
            let mut chunks = Vec::new();
            while !batch.is_empty() {
                let rest = batch.split_off(batch.len().min(CHECKS_PER_TXN));
                chunks.push(std::mem::replace(&mut batch, rest));
            }
            chunks
        };
        futures::future::join_all(chunks.into_iter().map(|chunk| check_chunk(&client, chunk)))
            .await;
    }
}

async fn check_chunk(client: &Client, chunk: Vec<KeyCheck>) {
    let reads = chunk
        .iter()
        .map(|c| TxnOp::get(c.key.clone(), Some(GetOptions::new().with_keys_only())));
    let txn = Txn::new().and_then(reads.collect::<Vec<_>>());
    let mut failures = 0;
    let answer = loop {
        // Read only: safe to repeat.
        match client.kv_client().txn(txn.clone()).await {
            Err(err) if retryable(&err) && failures < TRANSPORT_RETRIES => {
                retry_pause(&mut failures).await;
            }
            other => break other,
        }
    };
    match answer {
        Ok(resp) => {
            let mut answers = resp.op_responses().into_iter();
            for check in chunk {
                let ours = match answers.next() {
                    Some(TxnOpResponse::Get(get)) => Ok(get
                        .kvs()
                        .first()
                        .is_some_and(|kv| kv.create_revision() == check.rev)),
                    _ => Err(protocol("a transaction answered without its read")),
                };
                let _ = check.reply.send(ours);
            }
        }
        Err(err) => {
            let err = Arc::new(err);
            for check in chunk {
                let _ = check.reply.send(Err(shared_err("renewing", &err)));
            }
        }
    }
}

/// [`map_err`] for an error shared by several callers (the source is kept behind an `Arc`).
fn shared_err(what: &str, err: &Arc<etcd_client::Error>) -> Error {
    #[derive(Debug)]
    struct Shared(Arc<etcd_client::Error>);
    impl fmt::Display for Shared {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            self.0.fmt(f)
        }
    }
    impl std::error::Error for Shared {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&*self.0)
        }
    }
    let message = format!("{what}: {}", cause(err));
    let source = Shared(err.clone());
    if retryable(err) {
        Error::unavailable(message, source)
    } else {
        Error::backend(message, source)
    }
}
