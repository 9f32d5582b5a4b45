//! A held lock: its entry, renewed and released by compare-and-set on the entry's revision.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use distlock_core::backend::{Lease, Renewer};
use distlock_core::{Error, Result};

use crate::backend::BackendState;
use crate::error::Written;
use crate::keys::{EntryValue, SlotHold};

/// Where a lease's entry is.
#[derive(Debug)]
pub(crate) struct HeldKey {
    /// The lock's name.
    pub(crate) name: String,
    /// The entry's subject.
    pub(crate) subject: String,
    /// The name's range.
    pub(crate) range: String,
    /// The client's key of the name, if the entry is there.
    pub(crate) slot: Option<Arc<SlotHold>>,
    /// Whether the range had no other live entry at the lease's last write.
    pub(crate) alone: bool,
}

/// The server-side handle of a held lock: its entry's subject and current revision. The
/// fencing token (`value.first`) stays the acquisition's; the revision moves with every
/// renewal.
#[derive(Debug)]
pub(crate) struct NatsLease {
    pub(crate) state: Arc<BackendState>,
    pub(crate) name: String,
    pub(crate) subject: String,
    /// The entry as written last: kind, token, owner and the holder's data.
    value: Mutex<EntryValue>,
    /// The lease length of the acquisition and its renewals: every write of the entry sets
    /// its `Nats-TTL`, a write of the holder data too.
    ttl: Duration,
    rev: Mutex<u64>,
    /// The client's key of the name, kept in use while the lease lives.
    slot: Option<Arc<SlotHold>>,
    /// The name's range (every key of the name).
    range: String,
    /// The name's range has had no other live entry since this lease's last write: every
    /// write of it was a compare-and-set on the whole range. Its release then leaves the
    /// name free at a known revision (see `Slot::clean`).
    alone: AtomicBool,
}

impl NatsLease {
    pub(crate) fn new(
        state: Arc<BackendState>,
        value: EntryValue,
        rev: u64,
        key: HeldKey,
        ttl: Duration,
    ) -> Self {
        Self {
            state,
            name: key.name,
            subject: key.subject,
            value: Mutex::new(value),
            ttl,
            rev: Mutex::new(rev),
            slot: key.slot,
            range: key.range,
            alone: AtomicBool::new(key.alone),
        }
    }

    /// Whether every write of this lease so far was a compare-and-set on the whole range.
    pub(crate) fn alone(&self) -> bool {
        self.alone.load(Ordering::Relaxed)
    }

    /// Somebody else wrote in the range: compare-and-set on the key from now on.
    pub(crate) fn not_alone(&self) {
        self.alone.store(false, Ordering::Relaxed);
    }

    /// The range a write of this lease expects its revision on, if it is alone.
    pub(crate) fn range(&self, alone: bool) -> Option<&str> {
        alone.then_some(self.range.as_str())
    }

    /// The entry's value as this lease writes it now.
    pub(crate) fn value(&self) -> EntryValue {
        self.value
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(crate) fn rev(&self) -> u64 {
        *self.rev.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn set_rev(&self, rev: u64) {
        *self.rev.lock().unwrap_or_else(PoisonError::into_inner) = rev;
    }

    /// The entry's revision now, if it is still this lease's (a write whose answer was lost
    /// may have moved it): `None` when it is gone or another's.
    pub(crate) async fn current(&self) -> Result<Option<u64>> {
        let ours = self.value();
        Ok(self
            .state
            .entry(&self.subject)
            .await?
            .filter(|e| e.value.owner == ours.owner && e.token() == ours.first)
            .map(|e| e.rev))
    }

    /// After a refused compare-and-set at `rev`: the revision to try again with, or
    /// [`Error::NotHeld`].
    pub(crate) async fn after_conflict(&self, rev: u64) -> Result<u64> {
        match self.current().await? {
            Some(now) if now != rev => {
                self.set_rev(now);
                Ok(now)
            }
            _ => Err(Error::not_held(&self.name)),
        }
    }
}

#[async_trait]
impl Lease for NatsLease {
    async fn renew(&self, ttl: Duration) -> Result<()> {
        crate::renew::refresh(self, ttl).await
    }

    async fn release(&self) -> Result<()> {
        self.state.reconnected().await?;
        let mut rev = self.rev();
        for _ in 0..3 {
            let alone = self.alone();
            match self
                .state
                .purge(&self.subject, rev, self.range(alone))
                .await?
            {
                Written::Stored(marker) => {
                    if self.slot.is_some() {
                        self.state.slots.released(&self.name, marker, alone);
                    }
                    return Ok(());
                }
                Written::Conflict if alone => self.not_alone(),
                Written::Conflict => rev = self.after_conflict(rev).await?,
            }
        }
        Err(Error::not_held(&self.name))
    }

    /// A compare-and-set of the entry on its revision with the new data (and the lease's ttl,
    /// which every write of the entry sets: it renews the server's lease as a side effect,
    /// never beyond what a renewal would).
    ///
    /// The lease's value changes first, so that a renewal racing this write (and winning its
    /// compare-and-set) writes the new data too, never the old data back after it.
    async fn set_data(&self, data: Option<&str>) -> Result<()> {
        let value = {
            let mut value = self.value.lock().unwrap_or_else(PoisonError::into_inner);
            value.data = data.map(str::to_owned);
            value.clone()
        };
        let mut rev = self.rev();
        for _ in 0..3 {
            let alone = self.alone();
            let publish = BackendState::put(&value, self.ttl, rev, self.range(alone));
            match self.state.send("set data", &self.subject, publish).await? {
                Written::Stored(new) => {
                    self.set_rev(new);
                    return Ok(());
                }
                Written::Conflict if alone => self.not_alone(),
                Written::Conflict => rev = self.after_conflict(rev).await?,
            }
        }
        Err(Error::not_held(&self.name))
    }

    fn renewer(&self) -> Option<Arc<dyn Renewer>> {
        Some(self.state.renewer.clone())
    }
}
