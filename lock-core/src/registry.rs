//! The reentrancy registry: which lease an explicit owner holds on a name, through one client.
//!
//! An acquisition by an explicit owner looks up its slot here (one acquisition at a time per
//! name and owner) and joins the live lease it finds instead of queueing behind it; a release
//! of the last hold forgets the entry.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use crate::backend::unpoisoned as lock;
use crate::{LockKind, LockName, OwnerId};

/// What the registry needs to know of a held lease.
pub(crate) trait Reentrant {
    /// Whether the lease may be lost (it then offers no reentry).
    fn is_lost(&self) -> bool;
}

/// Identifies a reentrant holder.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct RegistryKey {
    name: LockName,
    owner: OwnerId,
    /// A shared hold is not an exclusive one: an owner re-entering asks for the same kind.
    kind: LockKind,
}

impl RegistryKey {
    pub(crate) fn new(name: LockName, owner: OwnerId, kind: LockKind) -> Self {
        Self { name, owner, kind }
    }
}

type Slot<H> = Arc<tokio::sync::Mutex<Weak<H>>>;

/// The leases held by explicit owners through one client.
pub(crate) struct Registry<H> {
    slots: Mutex<HashMap<RegistryKey, Slot<H>>>,
}

impl<H> Default for Registry<H> {
    fn default() -> Self {
        Self {
            slots: Mutex::default(),
        }
    }
}

impl<H: Reentrant> Registry<H> {
    /// The slot of `key`: lock it to acquire as that owner; it holds the live lease, if any.
    pub(crate) fn slot(&self, key: &RegistryKey) -> Slot<H> {
        let mut slots = lock(&self.slots);
        slots.entry(key.clone()).or_default().clone()
    }

    /// Removes the entry for `key` if nobody uses it.
    pub(crate) fn tidy(&self, key: &RegistryKey) {
        let mut slots = lock(&self.slots);
        if let Some(slot) = slots.get(key) {
            let unused = Arc::strong_count(slot) == 1
                && slot
                    .try_lock()
                    .is_ok_and(|held| held.upgrade().is_none_or(|h| h.is_lost()));
            if unused {
                slots.remove(key);
            }
        }
    }

    /// Called when `held` is released: its entry no longer offers reentry.
    pub(crate) fn forget(&self, key: &RegistryKey, held: &Arc<H>) {
        let mut slots = lock(&self.slots);
        let stale = slots.get(key).is_some_and(|slot| {
            Arc::strong_count(slot) == 1
                && slot
                    .try_lock()
                    .is_ok_and(|current| current.upgrade().is_none_or(|h| Arc::ptr_eq(&h, held)))
        });
        if stale {
            slots.remove(key);
        }
    }
}
