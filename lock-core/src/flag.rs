//! A one-way flag that async code can wait for, without an allocation: what every guard keeps
//! twice (stopped, lost), so that holding thousands of locks stays cheap in memory.

use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::Notify;

/// Raised once, never lowered; [`raised`](Self::raised) resolves once it is.
#[derive(Debug, Default)]
pub(crate) struct Flag {
    up: AtomicBool,
    notify: Notify,
}

impl Flag {
    /// Raises the flag and wakes every waiter; true if this call raised it.
    pub(crate) fn raise(&self) -> bool {
        let first = !self.up.swap(true, Ordering::AcqRel);
        if first {
            self.notify.notify_waiters();
        }
        first
    }

    /// Whether the flag is up.
    pub(crate) fn is_raised(&self) -> bool {
        self.up.load(Ordering::Acquire)
    }

    /// Resolves once the flag is up (at once if it is). Cancel safe.
    pub(crate) async fn raised(&self) {
        let notified = self.notify.notified();
        tokio::pin!(notified);
        loop {
            // Registered before the check: a raise after the check wakes this waiter.
            notified.as_mut().enable();
            if self.is_raised() {
                return;
            }
            notified.as_mut().await;
            notified.set(self.notify.notified());
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::Flag;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn waiters_before_and_after_the_raise_all_resolve() {
        let flag = Arc::new(Flag::default());
        let early: Vec<_> = (0..8)
            .map(|_| {
                let flag = flag.clone();
                tokio::spawn(async move { flag.raised().await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!flag.is_raised());
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
