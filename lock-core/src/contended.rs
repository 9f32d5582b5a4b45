//! [`Contended`]: the names a client saw contended lately, so that a backend picks the
//! path that suits a contended name (more requests at once) only where it pays.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::backend::unpoisoned;

/// The names (or keys) a client saw contended within the last second; at most 1,024 of
/// them, so the memory stays bounded whatever the names.
///
/// A backend records a name when it meets others on it ([`Self::saw`]: a refusal, waiters
/// found by a release, holders beside a reader), forgets it when it found the name free
/// ([`Self::cleared`]), and asks [`Self::lately`] before choosing a path. Redis sends a
/// contended lock's acquisitions straight to its script, and its releases to the full
/// release script, where the short paths would cost a round trip more; ZooKeeper sends the
/// listing of the queue right behind a reader's or a permit's join, which a join alone would
/// read for nothing.
///
/// ```
/// use distlock_core::backend::Contended;
///
/// let contended = Contended::default();
/// assert!(!contended.lately("orders"));
/// contended.saw("orders"); // a refusal, say
/// assert!(contended.lately("orders"));
/// contended.cleared("orders"); // found free
/// assert!(!contended.lately("orders"));
/// ```
#[derive(Debug, Default)]
pub struct Contended {
    seen: Mutex<HashMap<String, Instant>>,
}

impl Contended {
    /// How long a name counts as contended after it was last seen so (the type's doc says
    /// it in words).
    const WINDOW: Duration = Duration::from_secs(1);
    /// The most names remembered: past it, the expired entries go (all of them if none has).
    /// The type's doc says it in words.
    const MAX: usize = 1024;

    fn seen(&self) -> MutexGuard<'_, HashMap<String, Instant>> {
        unpoisoned(&self.seen)
    }

    /// Whether `key` was seen contended within the last second (and not cleared since).
    pub fn lately(&self, key: &str) -> bool {
        self.seen()
            .get(key)
            .is_some_and(|at| at.elapsed() < Self::WINDOW)
    }

    /// Records that `key` was seen contended now.
    pub fn saw(&self, key: &str) {
        let mut seen = self.seen();
        // Seen already (every busy poll of a waiter): no new key to allocate.
        if let Some(at) = seen.get_mut(key) {
            *at = Instant::now();
            return;
        }
        if seen.len() >= Self::MAX {
            seen.retain(|_, at| at.elapsed() < Self::WINDOW);
            if seen.len() >= Self::MAX {
                seen.clear();
            }
        }
        seen.insert(key.to_owned(), Instant::now());
    }

    /// Forgets `key` (it was found free).
    pub fn cleared(&self, key: &str) {
        let mut seen = self.seen();
        if !seen.is_empty() {
            seen.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Contended;

    #[test]
    fn a_contended_name_is_remembered_until_cleared() {
        let contended = Contended::default();
        assert!(!contended.lately("a"));
        contended.saw("a");
        assert!(contended.lately("a"));
        assert!(!contended.lately("b"));
        contended.cleared("a");
        assert!(!contended.lately("a"));
    }

    #[test]
    fn the_memory_is_bounded() {
        let contended = Contended::default();
        for i in 0..Contended::MAX * 3 {
            contended.saw(&i.to_string());
            assert!(contended.seen().len() <= Contended::MAX);
        }
        // The newest one is always remembered.
        assert!(contended.lately(&(Contended::MAX * 3 - 1).to_string()));
    }
}
