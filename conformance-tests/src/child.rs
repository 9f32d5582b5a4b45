//! A waiter in another process, for the cases that kill or pause a waiting process.
//!
//! The child process is the test binary itself, run again with `--exact <config>::<case>`
//! and [`CHILD`] naming that test: [`run_case`](crate::run_case) then plays the child's part
//! (`child_role`) instead of the case. This way the child always runs the same build and
//! the same harness as its parent; a separate binary in this crate would not be built, or
//! would be stale, when a backend crate's tests run (Cargo builds a package's binaries only
//! for that package's own tests).
//!
//! The child connects through the harness, acquires one lock with the given ttl and wait, and
//! reports on its stdout, one line each, prefixed by [`PREFIX`]: `queued` (its first poll
//! found the lock taken, see [`distlock_core::WAITING_TARGET`]), then `acquired <token>` and
//! `released`, or `timeout`. Any other failure panics, so the child exits with a failure.

use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use distlock_core::{AcquireOptions, Error};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::mpsc;
use tracing::instrument::WithSubscriber;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::{Layer, Registry};

use crate::{Ctx, Harness};

/// Names the test whose child this process is.
pub const CHILD: &str = "DISTLOCK_CONFORMANCE_CHILD";
/// What the child's harness needs to reach its parent's locks (see
/// [`Harness::process_shared`]); read it with [`inherited`].
pub const SHARED: &str = "DISTLOCK_CONFORMANCE_SHARED";
const LOCK: &str = "DISTLOCK_CONFORMANCE_LOCK";
const TTL_MS: &str = "DISTLOCK_CONFORMANCE_TTL_MS";
const WAIT_MS: &str = "DISTLOCK_CONFORMANCE_WAIT_MS";
/// The prefix of the child's report lines (the test harness writes its own lines too).
pub const PREFIX: &str = "distlock-child: ";

/// In a child process, what its parent's harness passed on (see
/// [`Harness::process_shared`]); `None` in the parent.
pub fn inherited() -> Option<String> {
    std::env::var(SHARED).ok()
}

/// Whether this process is the child of the test `test`.
pub(crate) fn is_child_of(test: &str) -> bool {
    std::env::var(CHILD).is_ok_and(|t| t == test)
}

fn env_ms(var: &str) -> Duration {
    let value = std::env::var(var).unwrap_or_else(|_| panic!("{var} is not set"));
    Duration::from_millis(
        value
            .parse()
            .unwrap_or_else(|_| panic!("{var}={value:?} is not a number")),
    )
}

fn report(line: &str) {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{PREFIX}{line}");
    let _ = out.flush();
}

/// Calls `on_wait` on the core's [`WAITING_TARGET`](distlock_core::WAITING_TARGET) event.
struct WaitingLayer<F>(F);

impl<S: tracing::Subscriber, F: Fn() + Send + Sync + 'static> Layer<S> for WaitingLayer<F> {
    fn on_event(&self, event: &tracing::Event<'_>, _ctx: Context<'_, S>) {
        if event.metadata().target() == distlock_core::WAITING_TARGET {
            (self.0)();
        }
    }
}

/// A `tracing` dispatcher that calls `on_wait` when an acquire run under it starts waiting
/// (use it with [`WithSubscriber::with_subscriber`]).
pub fn on_waiting(on_wait: impl Fn() + Send + Sync + 'static) -> tracing::Dispatch {
    // tracing-core 0.1.36 (tokio-rs/tracing#3611): while exactly one `Dispatch` is
    // registered in the process, a callsite first hit on a thread without a subscriber (here:
    // another case's waiting acquire) is cached as never interesting, and the one dispatch
    // (installed on another task) then never sees that event: the waiter looked stuck. A
    // second dispatch kept alive for the whole process makes tracing ask every registered
    // dispatch instead.
    keep_every_dispatch_asked();
    tracing::Dispatch::new(Registry::default().with(WaitingLayer(on_wait)))
}

/// Works around tokio-rs/tracing#3611 (see [`on_waiting`]) for a test that installs a
/// subscriber of its own: keeps a second `Dispatch` registered for the whole process, so that
/// a callsite first hit on a thread without a subscriber is not cached as never interesting.
pub fn keep_every_dispatch_asked() {
    static SECOND: LazyLock<tracing::Dispatch> =
        LazyLock::new(|| tracing::Dispatch::new(Registry::default()));
    LazyLock::force(&SECOND);
}

/// The child's part: acquire, report, release.
///
/// # Panics
/// On any failure other than a timeout (the child then exits with a failure).
pub(crate) async fn child_role(harness: Arc<dyn Harness>) {
    let name = std::env::var(LOCK).unwrap_or_else(|_| panic!("{LOCK} is not set"));
    let options = AcquireOptions::default()
        .with_ttl(env_ms(TTL_MS))
        .with_wait(env_ms(WAIT_MS));
    let client = harness
        .client()
        .await
        .unwrap_or_else(|err| panic!("the child cannot connect: {err}"));
    let acquire = client
        .acquire(&name, &options)
        .with_subscriber(on_waiting(|| report("queued")));
    match acquire.await {
        Ok(guard) => {
            report(&format!("acquired {}", guard.token()));
            guard
                .release()
                .await
                .unwrap_or_else(|err| panic!("the child cannot release: {err}"));
            report("released");
        }
        Err(Error::Timeout { .. }) => report("timeout"),
        Err(err) => panic!("the child's acquire failed: {err}"),
    }
}

/// A child process waiting for a lock, seen from its parent. Killed when dropped.
#[derive(Debug)]
pub struct ChildWaiter {
    child: tokio::process::Child,
    pid: Pid,
    lines: mpsc::UnboundedReceiver<(Instant, String)>,
    /// Every report line so far, with when it arrived.
    seen: Vec<(Instant, String)>,
}

impl ChildWaiter {
    /// Starts the child of the running case: it acquires `name` with `ttl`, waiting at most
    /// `wait`.
    ///
    /// # Panics
    /// When the process cannot start.
    pub fn spawn(ctx: &Ctx, shared: &str, name: &str, ttl: Duration, wait: Duration) -> Self {
        let exe = std::env::current_exe().expect("the test binary's path");
        let mut child = tokio::process::Command::new(exe)
            .args([
                "--exact",
                ctx.test.as_str(),
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD, &ctx.test)
            .env(SHARED, shared)
            .env(LOCK, name)
            .env(TTL_MS, ttl.as_millis().to_string())
            .env(WAIT_MS, wait.as_millis().to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("starting the child process");
        let pid = child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .map(Pid::from_raw)
            .expect("the child's pid");
        let stdout = child.stdout.take().expect("the child's stdout");
        let (tx, lines) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut reader = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                // The test harness may have written its own words before ours on the line.
                if let Some((_, report)) = line.split_once(PREFIX)
                    && tx.send((Instant::now(), report.to_owned())).is_err()
                {
                    break;
                }
            }
        });
        Self {
            child,
            pid,
            lines,
            seen: Vec::new(),
        }
    }

    /// Reads the report lines that arrived so far.
    pub fn seen(&mut self) -> &[(Instant, String)] {
        while let Ok(line) = self.lines.try_recv() {
            self.seen.push(line);
        }
        &self.seen
    }

    /// Waits for a report line starting with one of `words`, at most `within`; returns it.
    ///
    /// # Panics
    /// When it does not come (the child exited, or said something else, or is silent).
    pub async fn expect(&mut self, words: &[&str], within: Duration) -> (Instant, String) {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            match tokio::time::timeout_at(deadline, self.lines.recv()).await {
                Ok(Some((at, line))) => {
                    self.seen.push((at, line.clone()));
                    if words.iter().any(|w| line.starts_with(w)) {
                        return (at, line);
                    }
                }
                Ok(None) => panic!(
                    "the child exited without saying {words:?}; it said {:?}",
                    self.said()
                ),
                Err(_) => panic!(
                    "the child did not say {words:?} within {within:?}; it said {:?}",
                    self.said()
                ),
            }
        }
    }

    fn said(&self) -> Vec<&str> {
        self.seen.iter().map(|(_, line)| line.as_str()).collect()
    }

    /// Sends `signal` to the child.
    ///
    /// # Panics
    /// When the signal cannot be sent.
    pub fn signal(&self, signal: Signal) {
        kill(self.pid, signal).unwrap_or_else(|err| panic!("sending {signal} to the child: {err}"));
    }

    /// Stops the child with `SIGSTOP` and returns once every thread of it has stopped.
    ///
    /// `kill` only queues a stop: the kernel wakes one thread of the process to carry it out,
    /// and the others run on until that thread has been scheduled and told them. On a loaded
    /// machine that took long enough for the child's runtime to take a lock handed to it
    /// just after the `kill` (seen 1.2 ms after it, next to busy loops on 2 cores), so the
    /// cases that pause a waiter found it holding the lock they had released to it. Reads
    /// `/proc/PID/task/*/stat` (Linux) every millisecond, for at most `within`.
    ///
    /// # Panics
    /// When the signal cannot be sent, or the child has not stopped within `within`.
    pub async fn pause(&self, within: Duration) {
        self.signal(Signal::SIGSTOP);
        let tasks = format!("/proc/{}/task", self.pid);
        if std::fs::metadata(&tasks).is_err() {
            return; // No procfs: the stop is taken on trust.
        }
        let deadline = Instant::now() + within;
        while !all_stopped(&tasks) {
            assert!(
                Instant::now() < deadline,
                "the child did not stop within {within:?} of SIGSTOP"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Kills the child with `SIGKILL` and reaps it.
    pub async fn kill(&mut self) {
        self.signal(Signal::SIGKILL);
        let _ = self.child.wait().await;
    }

    /// Waits for the child to exit, at most `within`.
    ///
    /// # Panics
    /// When it does not.
    pub async fn exit(&mut self, within: Duration) -> ExitStatus {
        match tokio::time::timeout(within, self.child.wait()).await {
            Ok(Ok(status)) => status,
            Ok(Err(err)) => panic!("waiting for the child: {err}"),
            Err(_) => panic!(
                "the child did not exit within {within:?}; it said {:?}",
                self.said()
            ),
        }
    }
}

/// Whether every thread under `tasks` (`/proc/PID/task`) is stopped: state `T` in its `stat`
/// (the field after the parenthesized command name). A thread that exits meanwhile is not
/// counted.
fn all_stopped(tasks: &str) -> bool {
    let Ok(entries) = std::fs::read_dir(tasks) else {
        return false;
    };
    entries.flatten().all(|entry| {
        std::fs::read_to_string(entry.path().join("stat")).map_or(true, |stat| {
            stat.rsplit_once(") ")
                .and_then(|(_, rest)| rest.chars().next())
                .is_some_and(|state| state == 'T' || state == 't')
        })
    })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    fn wait_event() {
        tracing::debug!(target: distlock_core::WAITING_TARGET, "the lock is taken: waiting");
    }

    /// The race of tokio-rs/tracing#3611: the callsite is first hit on a thread without a
    /// subscriber while the waiter's dispatch is the only one registered.
    #[test]
    fn a_waiting_event_first_seen_elsewhere_still_reaches_the_waiter() {
        let seen = Arc::new(AtomicUsize::new(0));
        let dispatch = {
            let seen = seen.clone();
            on_waiting(move || {
                seen.fetch_add(1, Ordering::SeqCst);
            })
        };
        std::thread::spawn(wait_event)
            .join()
            .expect("the other thread");
        tracing::dispatcher::with_default(&dispatch, wait_event);
        assert_eq!(seen.load(Ordering::SeqCst), 1, "the waiting event was lost");
    }
}
