//! What an acquisition asks for: the whole lock, a shared (read) hold, or one permit of a
//! semaphore.

use std::fmt;

/// What an acquisition asks for. Set with [`AcquireOptions::shared`](crate::AcquireOptions::shared),
/// [`AcquireOptions::with_permits`](crate::AcquireOptions::with_permits) or (the default)
/// [`AcquireOptions::exclusive`](crate::AcquireOptions::exclusive).
///
/// One name is one lock whatever the kind: an exclusive hold is the write side of the
/// read-write lock of that name, and a shared hold its read side. A semaphore name is used
/// with [`LockKind::Permit`] only: asking for permits on a name held exclusively or shared (or
/// for a different number of permits than its holders) is [`Error::Mismatch`](crate::Error::Mismatch).
///
/// # Fencing
///
/// Every acquisition of a name, of any kind, takes its token from one counter of that name
/// (readers beside other readers may draw theirs from a range the counter set aside), so:
/// - exclusive holders (writers, mutex holders, leaders) get strictly increasing tokens;
/// - a shared holder's token is larger than every earlier writer's and smaller than every
///   later writer's;
/// - each permit acquisition has a unique token larger than all earlier ones on that name.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LockKind {
    /// The whole lock: a mutex, the write side of a read-write lock, a leader.
    #[default]
    Exclusive,
    /// The read side of a read-write lock: any number of shared holders at once, none while an
    /// exclusive holder holds it. A waiting exclusive acquisition blocks new shared ones, so
    /// writers are not starved by a stream of readers.
    Shared,
    /// One of `permits` permits of a semaphore: at most `permits` holders at once.
    Permit {
        /// The semaphore's size, the same for every caller of one name.
        permits: u32,
    },
}

impl LockKind {
    /// A short word for messages and logs: `exclusive`, `shared` or `permit`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Exclusive => "exclusive",
            Self::Shared => "shared",
            Self::Permit { .. } => "permit",
        }
    }

    /// Whether two holds of one name may coexist.
    pub fn compatible(self, other: Self) -> bool {
        match (self, other) {
            (Self::Shared, Self::Shared) => true,
            (Self::Permit { permits: a }, Self::Permit { permits: b }) => a == b,
            _ => false,
        }
    }

    /// Why a request of kind `self` can never join holders of kind `held`, if it cannot
    /// ([`Error::Mismatch`](crate::Error::Mismatch)): a semaphore asked with another size, or
    /// used as a read-write lock. `None`: the kinds belong together (they may still have to
    /// wait for each other, as a writer waits for readers).
    pub fn mismatch(self, held: Self) -> Option<String> {
        match (self, held) {
            (Self::Permit { permits: a }, Self::Permit { permits: b }) if a != b => Some(format!(
                "it is a semaphore of {b} permits, asked for as one of {a}"
            )),
            (Self::Permit { .. }, Self::Exclusive | Self::Shared) => Some(format!(
                "it is held as a {} lock, asked for as a semaphore",
                held.as_str()
            )),
            (Self::Exclusive | Self::Shared, Self::Permit { permits }) => Some(format!(
                "it is a semaphore of {permits} permits, asked for as a {} lock",
                self.as_str()
            )),
            _ => None,
        }
    }
}

impl fmt::Display for LockKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Permit { permits } => write!(f, "permit of {permits}"),
            other => f.write_str(other.as_str()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_that_can_never_share_a_name_say_why() {
        let sem = |permits| LockKind::Permit { permits };
        assert!(LockKind::Shared.compatible(LockKind::Shared));
        assert!(sem(3).compatible(sem(3)));
        assert!(!sem(3).compatible(sem(4)));
        assert!(!LockKind::Exclusive.compatible(LockKind::Exclusive));
        assert_eq!(LockKind::Exclusive.mismatch(LockKind::Shared), None);
        assert_eq!(LockKind::Shared.mismatch(LockKind::Exclusive), None);
        assert_eq!(sem(3).mismatch(sem(3)), None);
        assert!(sem(3).mismatch(sem(4)).unwrap().contains("4 permits"));
        assert!(sem(2).mismatch(LockKind::Shared).is_some());
        assert!(LockKind::Exclusive.mismatch(sem(2)).is_some());
    }
}
