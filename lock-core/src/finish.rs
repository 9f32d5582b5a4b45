//! Work that must run to its end once started: a release, an abandoned attempt's clean-up, a
//! backend's request that may leave something on the server.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::watch;

/// The requests of one attempt that must not be cut short, and the end of those that were.
///
/// An attempt's request that may leave something on the server (a take, a join, a queue
/// entry) is sent, and then the caller's future may be dropped before its answer (an
/// operation timeout, the caller's `timeout` or `select!`): the request still runs on the
/// server, and may be applied *after* the attempt's [`abandon`](crate::Attempt::abandon) sent
/// its clean-up on another connection, which then found nothing to free. What the request
/// left stays until its ttl. Run such requests with [`InFlight::run`]: cut short, the rest
/// of the request runs on a task of its own, for at most the bound given to
/// [`InFlight::new`] (a connection that stopped answering must not hold the attempt up for
/// good; dropped then, the request ends as any cut short request did before), and
/// [`InFlight::settled`], awaited before `abandon`'s clean-up ([`InFlight::after`]), waits
/// for it. Awaited to its end, a request spawns nothing (one allocation).
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use std::time::Duration;
/// use distlock_core::backend::InFlight;
///
/// let in_flight = InFlight::new(Duration::from_secs(5));
/// // A request cut short by its caller after 10 ms...
/// let request = in_flight.run(async { tokio::time::sleep(Duration::from_millis(50)).await; 7 });
/// assert!(tokio::time::timeout(Duration::from_millis(10), request).await.is_err());
/// // ... ends on a task of its own, which the clean-up waits for before it frees anything.
/// in_flight.settled().await;
/// assert_eq!(in_flight.run(async { 8 }).await, 8);
/// # });
/// ```
#[derive(Clone, Debug)]
pub struct InFlight {
    /// How many requests cut short still run, and for how long each may.
    late: Late,
}

/// Where the rest of a request cut short is counted while it runs, and its bound.
#[derive(Clone, Debug)]
struct Late {
    running: Arc<watch::Sender<usize>>,
    bound: Duration,
}

impl InFlight {
    /// An attempt's requests, the rest of each one cut short given at most `bound` to end
    /// (a backend's operation timeout, say: the request has had up to one already).
    pub fn new(bound: Duration) -> Self {
        Self {
            late: Late {
                running: Arc::new(watch::Sender::new(0)),
                bound,
            },
        }
    }

    /// `request`'s answer, once every request cut short before it has ended: one request of
    /// the attempt runs at a time, also when an operation timeout cut the one before. Cancel
    /// safe: dropped while it waits for those, `request` is dropped unsent; dropped after,
    /// the rest of `request` runs on a task of its own (on the current runtime; with none,
    /// it is dropped) for at most the bound, which [`Self::settled`] waits for.
    pub async fn run<F>(&self, request: F) -> F::Output
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.settled().await;
        ToTheEnd {
            work: Some(Box::pin(request)),
            late: Some(self.late.clone()),
        }
        .await
    }

    /// How long the rest of a request cut short may run (see [`Self::new`]).
    pub fn bound(&self) -> Duration {
        self.late.bound
    }

    /// Waits until every request cut short so far has ended (at once when none was; a task
    /// that panicked, or that its runtime dropped, has ended too). Cancel safe.
    pub async fn settled(&self) {
        let mut late = self.late.running.subscribe();
        // The sender is `self`'s: never closed while this waits.
        let _ = late.wait_for(|running| *running == 0).await;
    }

    /// Runs `work` on a task of its own (on the current runtime; with none, it is dropped)
    /// for at most the bound, counted like a request cut short: for what an attempt ends
    /// without waiting for it, and may leave something behind until it ends (a wait on the
    /// server stopped mid-way), which [`Self::settled`] then waits for.
    pub fn track<F>(&self, work: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        drop(ToTheEnd {
            work: Some(Box::pin(work)),
            late: Some(self.late.clone()),
        });
    }

    /// `work` (an attempt's clean-up), once every request cut short has ended, run to its end
    /// as a release is: dropped while it waits for those (the clean-up's own timeout,
    /// the caller's `select!`), the wait and then `work` go on on a task of its own, so that
    /// a slow request cut short does not cost the clean-up that must follow it.
    pub fn after<F>(&self, work: F) -> impl Future<Output = F::Output> + Send + 'static
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let in_flight = self.clone();
        to_the_end(async move {
            in_flight.settled().await;
            work.await
        })
    }
}

/// One request cut short still running, counted in [`InFlight`] until dropped.
struct Running(Arc<watch::Sender<usize>>);

impl Running {
    fn new(late: &Late) -> Self {
        late.running.send_modify(|running| *running += 1);
        Self(late.running.clone())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0
            .send_modify(|running| *running = running.saturating_sub(1));
    }
}

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
    ToTheEnd {
        work: Some(Box::pin(work)),
        late: None,
    }
}

/// See [`to_the_end`] and [`InFlight::run`].
pub(crate) struct ToTheEnd<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    work: Option<Pin<Box<F>>>,
    /// Where the rest of `work`, if it is cut short, is counted while it runs, and for how
    /// long it may ([`InFlight`]'s; `None`: to its end, uncounted).
    late: Option<Late>,
}

impl<F> Future for ToTheEnd<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        // Polled again after its end: it never ends twice. Out of `this` while polled: should
        // `work` panic, the unwinding drops it, and does not spawn it again.
        let Some(mut work) = this.work.take() else {
            return Poll::Pending;
        };
        let output = work.as_mut().poll(cx);
        if output.is_pending() {
            this.work = Some(work);
        }
        output
    }
}

impl<F> Drop for ToTheEnd<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn drop(&mut self) {
        if let Some(work) = self.work.take()
            && let Ok(handle) = tokio::runtime::Handle::try_current()
        {
            drop(match self.late.take() {
                Some(late) => {
                    let running = Running::new(&late);
                    handle.spawn(async move {
                        // Past the bound the request is dropped (its connection closed).
                        let _ = tokio::time::timeout(late.bound, work).await;
                        drop(running);
                    })
                }
                None => handle.spawn(async move {
                    work.await;
                }),
            });
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
            .field("running", &self.work.is_some())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::task::{Context, Poll};
    use std::time::Duration;

    use super::{InFlight, to_the_end};

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

    /// A request of 50 ms, cut short 10 ms in, whose rest runs on a task of its own.
    async fn cut_short(in_flight: &InFlight) -> Arc<AtomicBool> {
        let (request, done) = work(Duration::from_millis(50));
        let cut = tokio::time::timeout(Duration::from_millis(10), in_flight.run(request));
        assert!(cut.await.is_err(), "the request ended within 10 ms");
        done
    }

    #[tokio::test(start_paused = true)]
    async fn settled_waits_for_the_requests_cut_short() {
        let in_flight = InFlight::new(Duration::from_secs(1));
        let started = tokio::time::Instant::now();
        in_flight.settled().await;
        assert_eq!(started.elapsed(), Duration::ZERO, "waited with none cut");
        let (whole, _) = work(Duration::from_millis(5));
        assert_eq!(in_flight.run(whole).await, 7);
        let done = cut_short(&in_flight).await;
        in_flight.settled().await;
        assert!(done.load(Ordering::SeqCst));
        // Cut 15 ms in, the request started 5 ms in ends 50 ms after its start.
        assert_eq!(started.elapsed(), Duration::from_millis(5 + 50));
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_waits_for_the_one_cut_short_before_it() {
        let in_flight = InFlight::new(Duration::from_secs(1));
        let started = tokio::time::Instant::now();
        let first = cut_short(&in_flight).await;
        // Dropped while it waits for the first: never sent.
        let (unsent, unsent_done) = work(Duration::from_millis(1));
        let cut = tokio::time::timeout(Duration::from_millis(10), in_flight.run(unsent));
        assert!(cut.await.is_err(), "ran before the request cut short ended");
        let order = first.clone();
        let next = async move { order.load(Ordering::SeqCst) };
        assert!(
            in_flight.run(next).await,
            "sent before the one cut short ended"
        );
        assert_eq!(started.elapsed(), Duration::from_millis(50));
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            !unsent_done.load(Ordering::SeqCst),
            "a dropped wait sent its request"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn work_after_those_cut_short_runs_to_its_end() {
        let in_flight = InFlight::new(Duration::from_secs(1));
        let first = cut_short(&in_flight).await;
        let (order, done) = (first.clone(), Arc::new(AtomicBool::new(false)));
        let flag = done.clone();
        let clean_up = in_flight.after(async move {
            assert!(
                order.load(Ordering::SeqCst),
                "ran before the request cut short"
            );
            flag.store(true, Ordering::SeqCst);
        });
        // Its own timeout cuts it while it waits for the request cut short.
        let cut = tokio::time::timeout(Duration::from_millis(10), clean_up).await;
        assert!(cut.is_err(), "did not wait for the request cut short");
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(done.load(Ordering::SeqCst), "the work after was dropped");
    }

    #[tokio::test(start_paused = true)]
    async fn tracked_work_is_waited_for_up_to_its_bound() {
        let in_flight = InFlight::new(Duration::from_millis(30));
        let started = tokio::time::Instant::now();
        // Work of 20 ms ends within the bound; work of 50 ms is given up after 30.
        for (ms, ends, settled_at) in [(20, true, 20), (50, false, 20 + 30)] {
            let (tracked, done) = work(Duration::from_millis(ms));
            in_flight.track(async move {
                tracked.await;
            });
            in_flight.settled().await;
            assert_eq!(done.load(Ordering::SeqCst), ends, "work of {ms} ms");
            assert_eq!(started.elapsed(), Duration::from_millis(settled_at));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_cut_short_is_given_up_after_its_bound() {
        let in_flight = InFlight::new(Duration::from_millis(30));
        let started = tokio::time::Instant::now();
        let done = cut_short(&in_flight).await;
        in_flight.settled().await;
        assert!(!done.load(Ordering::SeqCst), "ran past its bound");
        // Cut 10 ms in, then given 30 ms more.
        assert_eq!(started.elapsed(), Duration::from_millis(10 + 30));
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_cut_short_that_panics_has_ended() {
        let in_flight = InFlight::new(Duration::from_secs(1));
        let request = async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            panic!("the request's own panic");
        };
        let cut = tokio::time::timeout(Duration::from_millis(1), in_flight.run(request)).await;
        assert!(cut.is_err());
        tokio::time::timeout(Duration::from_secs(10), in_flight.settled())
            .await
            .expect("settled waited for a task that panicked");
    }

    /// Work that panics at each poll, counting its polls.
    struct Panics(Arc<AtomicUsize>);

    impl Future for Panics {
        type Output = ();

        fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
            self.0.fetch_add(1, Ordering::SeqCst);
            panic!("the work's own panic");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn work_that_panics_is_not_run_again() {
        let polls = Arc::new(AtomicUsize::new(0));
        let task = tokio::spawn(to_the_end(Panics(polls.clone())));
        assert!(task.await.is_err_and(|e| e.is_panic()));
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(polls.load(Ordering::SeqCst), 1, "spawned again by its drop");
    }

    #[test]
    fn work_dropped_with_no_runtime_is_dropped() {
        let (work, done) = work(Duration::from_millis(1));
        drop(to_the_end(work));
        assert!(!done.load(Ordering::SeqCst));
    }
}
