//! One-way flags that async code can wait for, without an allocation: every guard keeps two
//! (stopped, lost) on one [`Flags`], so that holding thousands of locks stays cheap in memory.

use std::sync::atomic::{AtomicU8, Ordering};

use tokio::sync::Notify;

/// Up to eight one-way flags sharing one wake-up list (a waiter of one flag may be woken by
/// another's raise, and then waits again).
#[derive(Debug, Default)]
pub(crate) struct Flags {
    up: AtomicU8,
    notify: Notify,
}

impl Flags {
    /// Flag number `bit` (0 to 7) of these.
    pub(crate) fn flag(&self, bit: u8) -> Flag<'_> {
        Flag {
            flags: self,
            mask: 1 << (bit & 7),
        }
    }
}

/// One of [`Flags`]: raised once, never lowered; [`raised`](Self::raised) resolves once it is.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Flag<'a> {
    flags: &'a Flags,
    mask: u8,
}

impl<'a> Flag<'a> {
    /// Raises the flag and wakes every waiter; true if this call raised it.
    pub(crate) fn raise(self) -> bool {
        let first = self.flags.up.fetch_or(self.mask, Ordering::AcqRel) & self.mask == 0;
        if first {
            self.flags.notify.notify_waiters();
        }
        first
    }

    /// Whether the flag is up.
    pub(crate) fn is_raised(self) -> bool {
        self.flags.up.load(Ordering::Acquire) & self.mask != 0
    }

    /// Resolves once the flag is up (at once if it is). Cancel safe.
    pub(crate) async fn raised(self) {
        let notified = self.flags.notify.notified();
        tokio::pin!(notified);
        loop {
            // Registered before the check: a raise after the check wakes this waiter.
            notified.as_mut().enable();
            if self.is_raised() {
                return;
            }
            notified.as_mut().await;
            notified.set(self.flags.notify.notified());
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::Flags;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn waiters_before_and_after_the_raise_all_resolve() {
        let flags = Arc::new(Flags::default());
        let early: Vec<_> = (0..8)
            .map(|_| {
                let flags = flags.clone();
                tokio::spawn(async move { flags.flag(1).raised().await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(20)).await;
        let flag = flags.flag(1);
        assert!(!flag.is_raised());
        assert!(flags.flag(0).raise());
        assert!(!flag.is_raised(), "another flag raised this one");
        assert!(flag.raise());
        assert!(!flag.raise(), "raised twice");
        for waiter in early {
            tokio::time::timeout(Duration::from_secs(5), waiter)
                .await
                .expect("woken")
                .unwrap();
        }
        tokio::time::timeout(Duration::from_secs(5), flag.raised())
            .await
            .expect("already up");
    }
}
