//! [`LossEpochs`]: one loss event shared by many leases (every lock taken on one server, one
//! session), watched by the client's watchdog once per source instead of once per guard.

use std::sync::Arc;

use tokio::sync::watch;

use crate::LossReason;

/// A source of loss events that end many leases at once: a Redis server that restarted
/// (its memory, and every lock in it, is gone), a session that expired. Events are numbered
/// (the epoch, starting at 0); a lease taken while the epoch was `E` is lost by the first
/// event numbered above `E` that carries a reason.
///
/// A backend keeps one per server connection or session and hands a clone and the epoch its
/// lease was taken in to the core through
/// [`Lease::shared_loss`](crate::backend::Lease::shared_loss). The client's watchdog then
/// waits for this source once, however many guards were taken from it, and marks lost the
/// guards taken before the event: a held guard costs the source a map entry (about 50 bytes),
/// not a future of its own.
///
/// Cloning is cheap (one `Arc`); the clones are the same source. Once every clone is dropped
/// the source can never fire, and the watchdog stops waiting for it.
///
/// ```
/// use distlock_core::LossReason;
/// use distlock_core::backend::LossEpochs;
///
/// let epochs = LossEpochs::new();
/// let taken_in = epochs.current();
/// epochs.lose(Some(LossReason::ServerRestarted));
/// assert_eq!(epochs.current(), taken_in + 1);
/// assert_eq!(epochs.reason(), Some(LossReason::ServerRestarted));
/// ```
#[derive(Clone, Debug)]
pub struct LossEpochs {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    tx: watch::Sender<(u64, Option<LossReason>)>,
    /// The latest event that carried a reason, and its epoch: a later event without one
    /// does not hide it from a guard that joins afterwards. Written with the event.
    last_loss: std::sync::Mutex<Option<(u64, LossReason)>>,
}

impl Default for LossEpochs {
    fn default() -> Self {
        Self::new()
    }
}

impl LossEpochs {
    /// A new source, at epoch 0, with no event yet.
    pub fn new() -> Self {
        Self {
            inner: Arc::new(Inner {
                tx: watch::Sender::new((0, None)),
                last_loss: std::sync::Mutex::new(None),
            }),
        }
    }

    /// The current epoch: a lease taken now is lost by the next event that carries a reason.
    pub fn current(&self) -> u64 {
        self.inner.tx.borrow().0
    }

    /// The reason of the latest event (`None` before the first, or if it carried none).
    pub fn reason(&self) -> Option<LossReason> {
        self.inner.tx.borrow().1.clone()
    }

    /// Starts a new epoch. With `Some(reason)`, every guard taken in an earlier epoch is lost
    /// with that reason (each once; a guard already lost or released is left alone). With
    /// `None`, the epoch only moves on (the source learned something, for example that it
    /// cannot tell, without ending anything): guards taken before are not lost by it, and
    /// waiters on [`Self::subscribe`] are woken.
    pub fn lose(&self, reason: Option<LossReason>) {
        self.inner.tx.send_modify(|(epoch, why)| {
            *epoch += 1;
            if let Some(reason) = &reason {
                *crate::backend::unpoisoned(&self.inner.last_loss) = Some((*epoch, reason.clone()));
            }
            *why = reason;
        });
    }

    /// The latest event that carried a reason, with its epoch: a guard taken in an earlier
    /// epoch is lost by it, whatever events without a reason came after.
    pub(crate) fn last_loss(&self) -> Option<(u64, LossReason)> {
        crate::backend::unpoisoned(&self.inner.last_loss).clone()
    }

    /// A receiver of the `(epoch, reason)` events, the current one marked seen: for a backend
    /// that needs to wait for one event by itself (outside the watchdog).
    pub fn subscribe(&self) -> watch::Receiver<(u64, Option<LossReason>)> {
        self.inner.tx.subscribe()
    }

    /// Identifies the source (the same for every clone), to group guards by it.
    pub(crate) fn id(&self) -> usize {
        Arc::as_ptr(&self.inner).cast::<()>() as usize
    }
}
