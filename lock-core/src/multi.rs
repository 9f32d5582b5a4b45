//! Multi-locks: all of a set of names or none.

use std::fmt;
use std::time::Instant;

use futures::future::select_all;

use crate::{FencingToken, LockGuard, LockName, LossReason, Result};

/// All the locks of a set, taken by
/// [`DistributedLock::acquire_all`](crate::DistributedLock::acquire_all) in the canonical
/// order of their names (so two callers asking for overlapping sets in different orders never
/// deadlock). Each part renews itself; the whole is lost when any part is.
///
/// Dropping it releases every part in the background, as dropping a [`LockGuard`] does.
pub struct MultiGuard {
    /// In name order.
    guards: Vec<LockGuard>,
}

impl MultiGuard {
    /// Guards already sorted by name, without duplicates.
    pub(crate) fn new(guards: Vec<LockGuard>) -> Self {
        Self { guards }
    }

    /// The parts, in name order.
    pub fn guards(&self) -> &[LockGuard] {
        &self.guards
    }

    /// The parts, to hold or release one by one.
    pub fn into_guards(self) -> Vec<LockGuard> {
        self.guards
    }

    /// Each name with its fencing token, in name order: pass a name's token with every write
    /// to the resource that name protects.
    pub fn tokens(&self) -> impl Iterator<Item = (&LockName, FencingToken)> {
        self.guards.iter().map(|g| (g.name(), g.token()))
    }

    /// The fencing token of one part.
    pub fn token(&self, name: &str) -> Option<FencingToken> {
        self.guards
            .iter()
            .find(|g| g.name().as_str() == name)
            .map(LockGuard::token)
    }

    /// The earliest [`LockGuard::valid_until`] of the parts: until then, all are held.
    pub fn valid_until(&self) -> Instant {
        self.guards
            .iter()
            .map(LockGuard::valid_until)
            .min()
            .unwrap_or_else(Instant::now)
    }

    /// Whether any part may be lost.
    pub fn is_lost(&self) -> bool {
        self.guards.iter().any(LockGuard::is_lost)
    }

    /// Resolves when any part is lost, with its name and why. Cancel safe; after a clean
    /// release it never resolves.
    pub fn lost(&self) -> impl Future<Output = (LockName, LossReason)> + Send + 'static {
        let parts: Vec<_> = self
            .guards
            .iter()
            .map(|g| {
                let name = g.name().clone();
                let lost = g.lost();
                Box::pin(async move { (name, lost.await) })
            })
            .collect();
        async move {
            if parts.is_empty() {
                return std::future::pending().await;
            }
            select_all(parts).await.0
        }
    }

    /// Releases every part (in reverse name order), even when one fails.
    ///
    /// # Errors
    /// The first error of a part's release ([`Error::NotHeld`](crate::Error::NotHeld),
    /// [`Error::Lost`](crate::Error::Lost), [`Error::Unavailable`](crate::Error::Unavailable));
    /// the other parts are released nonetheless.
    pub async fn release(self) -> Result<()> {
        let mut first = Ok(());
        for guard in self.guards.into_iter().rev() {
            let released = guard.release().await;
            if first.is_ok() {
                first = released;
            }
        }
        first
    }
}

impl fmt::Debug for MultiGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(&self.guards).finish()
    }
}

/// The canonical order of a multi-lock: validated names, sorted, duplicates removed.
pub(crate) fn canonical(names: &[&str]) -> Result<Vec<LockName>> {
    if names.is_empty() {
        return Err(crate::Error::InvalidOptions(
            "a multi-lock needs at least one name".into(),
        ));
    }
    let mut names = names
        .iter()
        .map(|n| LockName::new(*n))
        .collect::<Result<Vec<_>>>()?;
    names.sort();
    names.dedup();
    Ok(names)
}
