//! The in-memory backend (`memory://`): the reference implementation of the lock contract for
//! one process.
//!
//! All clients made from one [`MemoryStore`] see the same locks. Expiry runs on the monotonic
//! clock, waiters are served in FIFO order and woken by releases, and fencing tokens come from
//! one process-wide counter, so they strictly increase per name (and across names).
//!
//! Every kind works: exclusive, shared (read-write locks, a waiting writer queues new readers
//! behind it) and semaphores of up to [`MAX_PERMITS`] permits, all served in arrival order.
//!
//! The store also offers fault injection for testing applications: [`MemoryStore::remove`]
//! takes a lock away from its holder and [`MemoryStore::set_available`] simulates an outage.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::StreamExt;
use futures::stream::BoxStream;
use tokio::sync::watch;

use crate::backend::{
    AcquireRequest, Acquired, Attempt, AttemptMode, Lease, LockBackend, LockInfo, RenewItem,
    Renewer, Step, downcast_lease,
};
use crate::{
    Capabilities, Error, FencingGuarantee, FencingToken, LockClient, LockKind, LockName, Result,
    WakeUp,
};

/// The largest semaphore of the in-memory backend.
pub const MAX_PERMITS: u32 = 1 << 20;

/// The shortest ttl of the in-memory backend: a renewal is a lock of the store, no I/O, but
/// it runs on a timer every ttl/3, and timers tick in whole milliseconds and wait for a busy
/// runtime; below 10 ms a lease would expire between ticks.
const MIN_TTL: Duration = Duration::from_millis(10);

/// Shared lock state for any number of in-process clients. Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct MemoryStore {
    shared: Arc<StoreState>,
}

#[derive(Debug)]
struct StoreState {
    state: Mutex<State>,
    /// Process-wide fencing counter: strictly increasing for every name.
    tokens: AtomicU64,
    waiter_ids: AtomicU64,
    /// Bumped on every acquisition and release of any name, for observers.
    any_change: watch::Sender<()>,
    /// The one batch of this store's leases: their renewals take the state's lock once per
    /// tick.
    renewer: Arc<dyn Renewer>,
}

impl Default for StoreState {
    fn default() -> Self {
        Self {
            state: Mutex::default(),
            tokens: AtomicU64::new(0),
            waiter_ids: AtomicU64::new(0),
            any_change: watch::Sender::new(()),
            renewer: Arc::new(MemoryRenewer),
        }
    }
}

#[derive(Debug, Default)]
struct State {
    locks: HashMap<LockName, Entry>,
    unavailable: bool,
}

#[derive(Debug)]
struct Entry {
    /// The holders: one exclusive, or any number of shared, or up to N permits of N.
    holders: Vec<Holder>,
    /// Waiters in arrival order.
    queue: VecDeque<Waiter>,
    /// Bumped whenever the lock may have become free.
    changed: watch::Sender<()>,
}

#[derive(Debug)]
struct Waiter {
    id: u64,
    kind: LockKind,
}

#[derive(Debug)]
struct Holder {
    owner: Arc<str>,
    token: FencingToken,
    expires_at: Instant,
    kind: LockKind,
    /// The data stored with the hold ([`Lease::set_data`]).
    data: Option<String>,
}

impl Entry {
    fn new() -> Self {
        Self {
            holders: Vec::new(),
            queue: VecDeque::new(),
            changed: watch::Sender::new(()),
        }
    }

    /// The live holders, dropping expired ones.
    fn holders(&mut self, now: Instant) -> &mut Vec<Holder> {
        self.holders.retain(|h| h.expires_at > now);
        &mut self.holders
    }

    /// The live holder `owner`.
    fn holder(&mut self, now: Instant, owner: &str) -> Option<&mut Holder> {
        self.holders(now).iter_mut().find(|h| *h.owner == *owner)
    }

    /// What an inspection shows: the latest holder, how it holds, and how many hold.
    fn info(&mut self, now: Instant) -> Option<LockInfo> {
        let holders = self.holders(now);
        let count = u32::try_from(holders.len()).unwrap_or(u32::MAX);
        let latest = holders.iter().max_by_key(|h| h.token)?;
        Some(
            LockInfo::new(
                latest.owner.to_string(),
                Some(latest.token),
                Some(latest.expires_at.saturating_duration_since(now)),
            )
            .with_holders(latest.kind, count)
            .with_data(latest.data.clone()),
        )
    }

    fn notify(&self) {
        self.changed.send_replace(());
    }

    fn is_idle(&self) -> bool {
        self.holders.is_empty() && self.queue.is_empty()
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// A new client of this store, as a trait object.
    pub fn client(&self) -> Arc<dyn crate::DistributedLock> {
        LockClient::new(MemoryBackend::new(self.clone())).into_dyn()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.shared
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The state, unless an outage is simulated.
    fn available_state(&self) -> Result<MutexGuard<'_, State>> {
        let state = self.state();
        if state.unavailable {
            return Err(Error::Unavailable {
                message: "the in-memory store is marked unavailable".into(),
                source: None,
            });
        }
        Ok(state)
    }

    /// Fault injection: removes the lock `name` from whoever holds it, as an operator deleting
    /// the key would. Returns whether it was held.
    pub fn remove(&self, name: &str) -> bool {
        let Ok(name) = LockName::new(name) else {
            return false;
        };
        let mut state = self.state();
        let Some(entry) = state.locks.get_mut(&name) else {
            return false;
        };
        let was_held = !entry.holders(Instant::now()).is_empty();
        entry.holders.clear();
        entry.notify();
        self.shared.any_change.send_replace(());
        if entry.is_idle() {
            state.locks.remove(&name);
        }
        was_held
    }

    /// Removes the live hold of `name` by `owner` (with `token`, when given) and wakes the
    /// waiters. Returns whether there was one.
    fn release(&self, name: &LockName, owner: &str, token: Option<FencingToken>) -> Result<bool> {
        let mut state = self.available_state()?;
        let now = Instant::now();
        let Some(entry) = state.locks.get_mut(name) else {
            return Ok(false);
        };
        match entry.holder(now, owner) {
            Some(holder) if token.is_none_or(|t| t == holder.token) => {}
            _ => return Ok(false),
        }
        entry.holders.retain(|h| *h.owner != *owner);
        entry.notify();
        self.shared.any_change.send_replace(());
        if entry.is_idle() {
            state.locks.remove(name);
        }
        Ok(true)
    }

    /// Fault injection: while unavailable, every operation fails with [`Error::Unavailable`];
    /// leases keep running out meanwhile.
    pub fn set_available(&self, available: bool) {
        let mut state = self.state();
        state.unavailable = !available;
        if available {
            for entry in state.locks.values() {
                entry.notify();
            }
        }
    }

    /// The number of names with a holder or waiters (expired holders included until touched).
    pub fn len(&self) -> usize {
        self.state().locks.len()
    }

    /// Whether no name has a holder or waiters.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The [`LockBackend`] over a [`MemoryStore`].
#[derive(Clone, Debug)]
pub struct MemoryBackend {
    store: MemoryStore,
}

/// The in-memory backend's [`Descriptor`](crate::Descriptor): `memory://NAME` URLs with the
/// same NAME share one store within the process (`memory://` alone: the store named "").
pub const DESCRIPTOR: crate::Descriptor = crate::Descriptor::new(
    "memory",
    &["memory"],
    "memory://[NAME] (this process only)",
    |url, config| {
        Box::pin(async move {
            let name = url.get("memory://".len()..).unwrap_or_default();
            Ok(
                crate::LockClient::with_config(MemoryBackend::new(named_store(name)), config)?
                    .into_dyn(),
            )
        })
    },
)
.with_monotonic_leases()
.without_password();

/// The process's store called `name` (see [`DESCRIPTOR`]).
fn named_store(name: &str) -> MemoryStore {
    static STORES: std::sync::OnceLock<Mutex<HashMap<String, MemoryStore>>> =
        std::sync::OnceLock::new();
    let stores = STORES.get_or_init(Mutex::default);
    let mut stores = stores
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    stores.entry(name.to_owned()).or_default().clone()
}

impl MemoryBackend {
    /// A backend over `store`.
    pub fn new(store: MemoryStore) -> Self {
        Self { store }
    }

    /// The store.
    pub fn store(&self) -> &MemoryStore {
        &self.store
    }
}

#[async_trait]
impl LockBackend for MemoryBackend {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(FencingGuarantee::Linearizable)
            .with_fifo(true)
            .with_wake_up(WakeUp::Event)
            .with_ttl_range(MIN_TTL, Duration::from_secs(365 * 24 * 3600))
            .with_list(true)
            .with_force_release(true)
            .with_release_hold(true)
            .with_holder_data(true)
            .with_shared(true)
            .with_max_permits(MAX_PERMITS)
            .with_process_local(true)
    }

    fn begin(&self, request: AcquireRequest) -> Box<dyn Attempt> {
        let id = self.store.shared.waiter_ids.fetch_add(1, Ordering::Relaxed);
        Box::new(MemoryAttempt {
            store: self.store.clone(),
            request,
            id,
            queued: false,
            changes: None,
        })
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        let mut state = self.store.available_state()?;
        let now = Instant::now();
        Ok(state.locks.get_mut(name).and_then(|e| e.info(now)))
    }

    async fn list(&self, prefix: Option<&str>, limit: usize) -> Result<Vec<(LockName, LockInfo)>> {
        let mut state = self.store.available_state()?;
        let now = Instant::now();
        let mut held: Vec<(LockName, LockInfo)> = state
            .locks
            .iter_mut()
            .filter(|(name, _)| prefix.is_none_or(|p| name.as_str().starts_with(p)))
            .filter_map(|(name, entry)| Some((name.clone(), entry.info(now)?)))
            .collect();
        held.sort_by(|a, b| a.0.cmp(&b.0));
        held.truncate(limit);
        Ok(held)
    }

    /// The store's entries (one per name with holders or waiters; a released name's entry
    /// is removed, and the token counter is one for the whole process).
    async fn footprint(&self, prefix: &str) -> Result<Option<crate::Footprint>> {
        let state = self.store.available_state()?;
        let entries = state
            .locks
            .keys()
            .filter(|name| name.as_str().starts_with(prefix))
            .count();
        Ok(Some(
            crate::Footprint::new("entries").with("lock", entries as u64),
        ))
    }

    async fn force_release(&self, name: &LockName) -> Result<bool> {
        // The process-wide token counter is untouched: the next holder's token is higher.
        drop(self.store.available_state()?);
        Ok(self.store.remove(name.as_str()))
    }

    async fn release_hold(
        &self,
        name: &LockName,
        owner: &str,
        token: FencingToken,
    ) -> Result<bool> {
        self.store.release(name, owner, Some(token))
    }

    fn watch(&self, _name: &LockName) -> Option<BoxStream<'static, ()>> {
        // Any change of any name wakes the observer, which reads its own name again.
        let rx = self.store.shared.any_change.subscribe();
        Some(
            futures::stream::unfold(rx, |mut rx| async move {
                rx.changed().await.ok()?;
                Some(((), rx))
            })
            .boxed(),
        )
    }
}

struct MemoryAttempt {
    store: MemoryStore,
    request: AcquireRequest,
    id: u64,
    queued: bool,
    changes: Option<watch::Receiver<()>>,
}

#[async_trait]
impl Attempt for MemoryAttempt {
    async fn poll(&mut self) -> Result<Step> {
        let mut state = self.store.available_state()?;
        let now = Instant::now();
        let kind = self.request.kind;
        let entry = state
            .locks
            .entry(self.request.name.clone())
            .or_insert_with(Entry::new);
        // Subscribing under the state lock: any later release is seen by `changed`.
        self.changes = Some(entry.changed.subscribe());
        if let Some(held) = entry.holders(now).first().map(|h| h.kind)
            && let Some(message) = kind.mismatch(held)
        {
            return Err(Error::Mismatch {
                name: self.request.name.to_string(),
                message,
            });
        }
        if self.request.mode == AttemptMode::Wait && !self.queued {
            entry.queue.push_back(Waiter { id: self.id, kind });
            self.queued = true;
        }
        // Who is served first: everyone queued ahead (a `try` is behind everyone).
        let ahead = entry
            .queue
            .iter()
            .position(|w| w.id == self.id)
            .unwrap_or(entry.queue.len());
        let ahead = entry.queue.range(..ahead);
        let holders = &entry.holders;
        let free = match kind {
            LockKind::Shared => {
                holders.iter().all(|h| h.kind == LockKind::Shared)
                    && ahead.clone().all(|w| w.kind == LockKind::Shared)
            }
            LockKind::Permit { permits } => {
                holders.len() + ahead.len() < usize::try_from(permits).unwrap_or(usize::MAX)
            }
            _ => holders.is_empty() && ahead.len() == 0,
        };
        if !free {
            // A writer waits for the last holder; a reader or a permit for the first to go.
            let ends = holders.iter().map(|h| h.expires_at - now);
            let retry = match kind {
                LockKind::Exclusive => ends.max(),
                _ => ends.min(),
            };
            return Ok(Step::busy(retry));
        }
        if self.queued {
            entry.queue.retain(|w| w.id != self.id);
            self.queued = false;
            if kind != LockKind::Exclusive {
                // The next waiter may be able to join.
                entry.notify();
            }
        }
        let token = FencingToken::new(self.store.shared.tokens.fetch_add(1, Ordering::SeqCst) + 1);
        entry.holders.push(Holder {
            owner: self.request.owner.clone(),
            token,
            expires_at: now + self.request.ttl,
            kind,
            data: None,
        });
        self.store.shared.any_change.send_replace(());
        let lease = MemoryLease {
            store: self.store.clone(),
            name: self.request.name.clone(),
            owner: self.request.owner.clone(),
        };
        Ok(Step::Acquired(Acquired::new(Box::new(lease), token)))
    }

    async fn changed(&mut self) {
        match self.changes.as_mut() {
            // An error means the entry was dropped: polling again re-creates it.
            Some(rx) => {
                let _ = rx.changed().await;
            }
            None => std::future::pending().await,
        }
    }

    async fn abandon(self: Box<Self>) -> Result<()> {
        // Works while unavailable too: an in-process waiter never outlives its attempt.
        let mut state = self.store.state();
        let Some(entry) = state.locks.get_mut(&self.request.name) else {
            return Ok(());
        };
        let queued = entry.queue.len();
        entry.queue.retain(|w| w.id != self.id);
        let holders = entry.holders.len();
        entry.holders.retain(|h| h.owner != self.request.owner);
        if queued != entry.queue.len() || holders != entry.holders.len() {
            // Those behind it, or waiting for what it held, may go now.
            entry.notify();
        }
        if entry.is_idle() {
            state.locks.remove(&self.request.name);
        }
        Ok(())
    }
}

#[derive(Debug)]
struct MemoryLease {
    store: MemoryStore,
    name: LockName,
    owner: Arc<str>,
}

impl MemoryLease {
    fn not_held(&self) -> Error {
        Error::NotHeld {
            name: self.name.to_string(),
        }
    }

    /// Extends the lease in `state` (its store's), if still the owner's.
    fn renew_in(&self, state: &mut State, now: Instant, ttl: Duration) -> Result<()> {
        match state
            .locks
            .get_mut(&self.name)
            .and_then(|e| e.holder(now, &self.owner))
        {
            Some(holder) => {
                holder.expires_at = now + ttl;
                Ok(())
            }
            None => Err(self.not_held()),
        }
    }
}

/// Renews a batch of one store's leases under one lock of its state.
#[derive(Debug)]
struct MemoryRenewer;

#[async_trait]
impl Renewer for MemoryRenewer {
    async fn renew_many(&self, items: &[RenewItem<'_>]) -> Result<Vec<Result<()>>> {
        let leases: Vec<Option<&MemoryLease>> = items
            .iter()
            .map(|item| downcast_lease::<MemoryLease>(item.lease))
            .collect();
        let foreign = || {
            Err(Error::Backend {
                message: "a lease of another store in a memory renewal batch".into(),
                source: None,
            })
        };
        let Some(store) = leases.iter().flatten().next().map(|l| &l.store) else {
            return Ok(items.iter().map(|_| foreign()).collect());
        };
        let mut state = store.available_state()?;
        let now = Instant::now();
        Ok(items
            .iter()
            .zip(leases)
            .map(|(item, lease)| match lease {
                Some(lease) if Arc::ptr_eq(&lease.store.shared, &store.shared) => {
                    lease.renew_in(&mut state, now, item.ttl)
                }
                _ => foreign(),
            })
            .collect())
    }
}

#[async_trait]
impl Lease for MemoryLease {
    async fn renew(&self, ttl: Duration) -> Result<()> {
        let mut state = self.store.available_state()?;
        self.renew_in(&mut state, Instant::now(), ttl)
    }

    fn renewer(&self) -> Option<Arc<dyn Renewer>> {
        Some(self.store.shared.renewer.clone())
    }

    async fn release(&self) -> Result<()> {
        if self.store.release(&self.name, &self.owner, None)? {
            Ok(())
        } else {
            Err(self.not_held())
        }
    }

    async fn set_data(&self, data: Option<&str>) -> Result<()> {
        let mut state = self.store.available_state()?;
        let entry = state.locks.get_mut(&self.name);
        let Some(entry) = entry else {
            return Err(self.not_held());
        };
        match entry.holder(Instant::now(), &self.owner) {
            Some(holder) => holder.data = data.map(str::to_owned),
            None => return Err(self.not_held()),
        }
        // Observers of an election see a proclaim at once.
        drop(state);
        self.store.shared.any_change.send_replace(());
        Ok(())
    }
}
