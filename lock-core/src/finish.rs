//! Work that must run to its end once started: a release, an abandoned attempt's clean-up.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// `work`, awaited by its caller; if the caller's future is dropped before `work` ends (a
/// `tokio::time::timeout` or a `select!` around a release, an acquisition cut short while it
/// cleans up), the rest of `work` runs on a task of its own on the current runtime (with no
/// runtime left, it is dropped), so that a release or a clean-up once started still reaches
/// the server instead of leaving the lock held until its ttl. Awaited to its end, it spawns
/// nothing: the common path costs one allocation.
pub(crate) fn to_the_end<F>(work: F) -> ToTheEnd<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    ToTheEnd(Some(Box::pin(work)))
}

/// See [`to_the_end`].
pub(crate) struct ToTheEnd<F>(Option<Pin<Box<F>>>)
where
    F: Future + Send + 'static,
    F::Output: Send + 'static;

impl<F> Future for ToTheEnd<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        // Polled again after its end: it never ends twice.
        let Some(work) = this.0.as_mut() else {
            return Poll::Pending;
        };
        let output = std::task::ready!(work.as_mut().poll(cx));
        this.0 = None;
        Poll::Ready(output)
    }
}

impl<F> Drop for ToTheEnd<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn drop(&mut self) {
        if let Some(work) = self.0.take()
            && let Ok(handle) = tokio::runtime::Handle::try_current()
        {
            drop(handle.spawn(work));
        }
    }
}

impl<F> fmt::Debug for ToTheEnd<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToTheEnd")
            .field("running", &self.0.is_some())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use super::to_the_end;

    /// Work that ends `after` from its first poll, then says so in `done`.
    fn work(after: Duration) -> (impl Future<Output = u8> + Send + 'static, Arc<AtomicBool>) {
        let done = Arc::new(AtomicBool::new(false));
        let flag = done.clone();
        let work = async move {
            tokio::time::sleep(after).await;
            flag.store(true, Ordering::SeqCst);
            7
        };
        (work, done)
    }

    #[tokio::test(start_paused = true)]
    async fn awaited_work_ends_in_the_callers_future() {
        let (work, done) = work(Duration::from_millis(50));
        assert_eq!(to_the_end(work).await, 7);
        assert!(done.load(Ordering::SeqCst));
    }

    #[tokio::test(start_paused = true)]
    async fn work_cut_short_by_its_caller_ends_on_a_task_of_its_own() {
        let (work, done) = work(Duration::from_millis(50));
        let cut = tokio::time::timeout(Duration::from_millis(10), to_the_end(work)).await;
        assert!(cut.is_err(), "the work ended within 10 ms");
        assert!(!done.load(Ordering::SeqCst));
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            done.load(Ordering::SeqCst),
            "the rest of the work did not run"
        );
    }

    #[test]
    fn work_dropped_with_no_runtime_is_dropped() {
        let (work, done) = work(Duration::from_millis(1));
        drop(to_the_end(work));
        assert!(!done.load(Ordering::SeqCst));
    }
}
