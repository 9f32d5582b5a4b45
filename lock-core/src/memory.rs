//! The in-memory backend (`memory://`): the reference implementation of the lock contract for
//! one process.
//!
//! All clients made from one [`MemoryStore`] see the same locks. Expiry runs on the monotonic
//! clock, waiters are served in FIFO order and woken by releases, and fencing tokens come from
//! one process-wide counter, so they strictly increase per name (and across names).
//!
//! The store also offers fault injection for testing applications: [`MemoryStore::remove`]
//! takes a lock away from its holder and [`MemoryStore::set_available`] simulates an outage.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::sync::watch;

use crate::backend::{
    AcquireRequest, Acquired, Attempt, AttemptMode, Lease, LockBackend, LockInfo, Step,
};
use crate::{
    Capabilities, Error, FencingGuarantee, FencingToken, LockClient, LockName, Result, WakeUp,
};

/// Shared lock state for any number of in-process clients. Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct MemoryStore {
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    /// Process-wide fencing counter: strictly increasing for every name.
    tokens: AtomicU64,
    waiter_ids: AtomicU64,
}

#[derive(Debug, Default)]
struct State {
    locks: HashMap<LockName, Entry>,
    unavailable: bool,
}

#[derive(Debug)]
struct Entry {
    holder: Option<Holder>,
    /// Waiters in arrival order.
    queue: VecDeque<u64>,
    /// Bumped whenever the lock may have become free.
    changed: watch::Sender<()>,
}

#[derive(Debug)]
struct Holder {
    owner: String,
    token: FencingToken,
    expires_at: Instant,
}

impl Entry {
    fn new() -> Self {
        Self {
            holder: None,
            queue: VecDeque::new(),
            changed: watch::Sender::new(()),
        }
    }

    /// The live holder, dropping an expired one.
    fn holder(&mut self, now: Instant) -> Option<&mut Holder> {
        if self.holder.as_ref().is_some_and(|h| h.expires_at <= now) {
            self.holder = None;
        }
        self.holder.as_mut()
    }

    fn notify(&self) {
        self.changed.send_replace(());
    }

    fn is_idle(&self) -> bool {
        self.holder.is_none() && self.queue.is_empty()
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
        let was_held = entry.holder(Instant::now()).is_some();
        entry.holder = None;
        entry.notify();
        if entry.is_idle() {
            state.locks.remove(&name);
        }
        was_held
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
            .with_ttl_range(
                Duration::from_millis(1),
                Duration::from_secs(365 * 24 * 3600),
            )
            .with_list(true)
            .with_force_release(true)
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
        Ok(state
            .locks
            .get_mut(name)
            .and_then(|e| e.holder(now))
            .map(|h| {
                LockInfo::new(
                    h.owner.clone(),
                    Some(h.token),
                    Some(h.expires_at.saturating_duration_since(now)),
                )
            }))
    }

    async fn list(&self, prefix: Option<&str>, limit: usize) -> Result<Vec<(LockName, LockInfo)>> {
        let mut state = self.store.available_state()?;
        let now = Instant::now();
        let mut held: Vec<(LockName, LockInfo)> = state
            .locks
            .iter_mut()
            .filter(|(name, _)| prefix.is_none_or(|p| name.as_str().starts_with(p)))
            .filter_map(|(name, entry)| {
                let h = entry.holder(now)?;
                let info = LockInfo::new(
                    h.owner.clone(),
                    Some(h.token),
                    Some(h.expires_at.saturating_duration_since(now)),
                );
                Some((name.clone(), info))
            })
            .collect();
        held.sort_by(|a, b| a.0.cmp(&b.0));
        held.truncate(limit);
        Ok(held)
    }

    async fn force_release(&self, name: &LockName) -> Result<bool> {
        // The process-wide token counter is untouched: the next holder's token is higher.
        drop(self.store.available_state()?);
        Ok(self.store.remove(name.as_str()))
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
        let entry = state
            .locks
            .entry(self.request.name.clone())
            .or_insert_with(Entry::new);
        // Subscribing under the state lock: any later release is seen by `changed`.
        self.changes = Some(entry.changed.subscribe());
        if self.request.mode == AttemptMode::Wait && !self.queued {
            entry.queue.push_back(self.id);
            self.queued = true;
        }
        let remaining = entry.holder(now).map(|h| h.expires_at - now);
        let my_turn = match self.request.mode {
            AttemptMode::Try => entry.queue.is_empty(),
            AttemptMode::Wait => entry.queue.front() == Some(&self.id),
        };
        if remaining.is_some() || !my_turn {
            return Ok(Step::busy(remaining));
        }
        if self.queued {
            entry.queue.pop_front();
            self.queued = false;
        }
        let token = FencingToken::new(self.store.shared.tokens.fetch_add(1, Ordering::SeqCst) + 1);
        entry.holder = Some(Holder {
            owner: self.request.owner.clone(),
            token,
            expires_at: now + self.request.ttl,
        });
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
        let was_head = entry.queue.front() == Some(&self.id);
        entry.queue.retain(|id| *id != self.id);
        if entry
            .holder
            .as_ref()
            .is_some_and(|h| h.owner == self.request.owner)
        {
            entry.holder = None;
        }
        if was_head || entry.holder.is_none() {
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
    owner: String,
}

impl MemoryLease {
    fn not_held(&self) -> Error {
        Error::NotHeld {
            name: self.name.to_string(),
        }
    }
}

#[async_trait]
impl Lease for MemoryLease {
    async fn renew(&self, ttl: Duration) -> Result<()> {
        let mut state = self.store.available_state()?;
        let now = Instant::now();
        match state.locks.get_mut(&self.name).and_then(|e| e.holder(now)) {
            Some(holder) if holder.owner == self.owner => {
                holder.expires_at = now + ttl;
                Ok(())
            }
            _ => Err(self.not_held()),
        }
    }

    async fn release(&self) -> Result<()> {
        let mut state = self.store.available_state()?;
        let now = Instant::now();
        let Some(entry) = state.locks.get_mut(&self.name) else {
            return Err(self.not_held());
        };
        if entry.holder(now).is_none_or(|h| h.owner != self.owner) {
            return Err(self.not_held());
        }
        entry.holder = None;
        entry.notify();
        if entry.is_idle() {
            state.locks.remove(&self.name);
        }
        Ok(())
    }
}
