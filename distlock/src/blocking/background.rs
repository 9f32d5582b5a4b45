//! The background runtime of the blocking API, and the check that refuses a blocking call
//! from an async context.

use super::*;

/// The background runtime: a current-thread tokio runtime driven by a thread of its own until
/// the last client, guard or observer of it is dropped.
pub(super) struct Background {
    pub(super) handle: tokio::runtime::Handle,
    thread: ThreadId,
    stop: Mutex<Option<oneshot::Sender<()>>>,
    joined: Mutex<Option<JoinHandle<()>>>,
}

impl Background {
    pub(super) fn start() -> Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::backend("cannot build the blocking client's runtime", e))?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("distlock-blocking".into())
            .spawn(move || {
                runtime.block_on(async {
                    let _ = stopped.await;
                });
                // Spawned tasks (renewals of guards nobody holds any more, cleanups) get a
                // moment to finish, then are cancelled.
                runtime.shutdown_timeout(Duration::from_secs(1));
            })
            .map_err(|e| Error::backend("cannot start the blocking client's thread", e))?;
        Ok(Self {
            handle,
            thread: thread.thread().id(),
            stop: Mutex::new(Some(stop)),
            joined: Mutex::new(Some(thread)),
        })
    }

    /// Whether a blocking call can be made from this thread.
    pub(super) fn check(&self, operation: &'static str) -> Result<()> {
        check_context(operation, Some(self.thread))
    }

    /// Runs `future` on the runtime and blocks until its output.
    pub(super) fn run<F>(&self, operation: &'static str, future: F) -> Result<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.spawn(operation, future)?
            .recv()
            .map_err(|_| stopped(operation))
    }

    /// Spawns `future` on the runtime, its output sent to the returned receiver.
    pub(super) fn spawn<F>(
        &self,
        operation: &'static str,
        future: F,
    ) -> Result<mpsc::Receiver<F::Output>>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.check(operation)?;
        let (tx, rx) = mpsc::sync_channel(1);
        self.handle.spawn(async move {
            let _ = tx.send(future.await);
        });
        Ok(rx)
    }

    /// Polls a future that borrows from the caller on the calling thread, inside the
    /// runtime's context (its timers and I/O are driven by the runtime's thread).
    pub(super) fn block_on<F: Future>(
        &self,
        operation: &'static str,
        future: F,
    ) -> Result<F::Output> {
        self.check(operation)?;
        Ok(self.handle.block_on(future))
    }

    /// As [`run`](Self::run), waiting at most `bound`.
    pub(super) fn run_bounded<F>(
        &self,
        operation: &'static str,
        bound: Duration,
        future: F,
    ) -> Result<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.spawn(operation, future)?
            .recv_timeout(bound)
            .map_err(|_| stopped(operation))
    }

    /// Releases `guard` from a task, without waiting.
    pub(super) fn release_in_background(&self, guard: LockGuard) {
        self.handle.spawn(async move {
            if let Err(err) = guard.release().await {
                tracing::debug!(%err, "release after drop failed; the ttl frees the lock");
            }
        });
    }
}

fn stopped(operation: &'static str) -> Error {
    Error::Backend {
        message: format!("distlock::blocking: the runtime stopped during `{operation}`"),
        source: None,
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if let Some(stop) = crate::backend::unpoisoned(&self.stop).take() {
            let _ = stop.send(());
        }
        let thread = crate::backend::unpoisoned(&self.joined).take();
        // Wait for the runtime to shut down (connections closed) where blocking is fine;
        // elsewhere the thread finishes by itself.
        if let Some(thread) = thread
            && check_context("drop", Some(self.thread)).is_ok()
        {
            let _ = thread.join();
        }
    }
}

/// How many units of a task's cooperative budget are probed at most (tokio's budget is 128).
const BUDGET_PROBE: usize = 1024;

/// `Ok` where the calling thread may block: not the client's own runtime thread (where the
/// operation could never run), and not an async context of any tokio runtime.
///
/// An async context is told apart from a `spawn_blocking` thread (which also has a runtime
/// handle, and may block) by tokio's cooperative budget: it is limited while a runtime polls
/// a task or a `block_on` future, and unlimited elsewhere. The probe takes units of it and
/// gives every one back (dropped in reverse order, each restores the budget as it found it).
pub(super) fn check_context(
    operation: &'static str,
    runtime_thread: Option<ThreadId>,
) -> Result<()> {
    let refuse = Err(Error::BlockingInAsyncContext { operation });
    if runtime_thread == Some(std::thread::current().id()) {
        return refuse;
    }
    if tokio::runtime::Handle::try_current().is_err() {
        return Ok(());
    }
    let mut cx = Context::from_waker(std::task::Waker::noop());
    let mut taken = Vec::with_capacity(BUDGET_PROBE);
    let mut limited = false;
    for _ in 0..BUDGET_PROBE {
        match tokio::task::coop::poll_proceed(&mut cx) {
            Poll::Ready(unit) => taken.push(unit),
            Poll::Pending => {
                limited = true;
                break;
            }
        }
    }
    while let Some(unit) = taken.pop() {
        drop(unit);
    }
    if limited { refuse } else { Ok(()) }
}
