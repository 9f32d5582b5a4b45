//! A blocking API for synchronous programs (feature `blocking`, on by default), like
//! `reqwest::blocking`.
//!
//! A [`Client`] runs its own tokio runtime (current-thread) on a background thread named
//! `distlock-blocking`: the connection, every lock operation and the guards' renewals run
//! there, and each method blocks the calling thread until its operation is done. It works from
//! a plain `fn main`, from threads of your own and from `tokio::task::spawn_blocking`. Called
//! from an async context (a task polled by a tokio runtime, or inside `Runtime::block_on`),
//! where blocking the thread would stall that runtime, every method fails at once with
//! [`Error::BlockingInAsyncContext`]: use the async API there.
//!
//! ```
//! use std::time::Duration;
//! use distlock::AcquireOptions;
//!
//! # fn main() -> Result<(), distlock::Error> {
//! let locks = distlock::blocking::connect("memory://blocking-doc")?;
//! let opts = AcquireOptions::default()
//!     .with_ttl(Duration::from_secs(10))
//!     .with_wait(Duration::from_secs(5));
//! let guard = locks.acquire("reports/daily", &opts)?;
//! assert!(locks.try_acquire("reports/daily", &opts)?.is_none()); // held: not an error
//! println!("fencing token {}", guard.token());
//! guard.release()?;
//! # Ok(()) }
//! ```
//!
//! The guards are those of the async API (renewed in the background, with
//! [`valid_until`](Guard::valid_until), [`is_lost`](Guard::is_lost) and
//! [`wait_lost`](Guard::wait_lost)); dropping one releases its lock and blocks until the
//! release was answered (at most the client's operation timeout).

use std::fmt;
use std::future::Future;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::thread::{JoinHandle, ThreadId};
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::BoxStream;
use tokio::sync::oneshot;

use crate::{
    AcquireOptions, Capabilities, ClientConfig, DistributedLock, Error, FencingToken, Leader,
    LockGuard, LockInfo, LockKind, LockName, LossReason, Result,
};

mod background;

use background::{Background, check_context};

/// Connects to the lock service at `url` (see [`crate::connect`]) with the default
/// [`ClientConfig`], on a runtime of the client's own.
///
/// # Errors
/// As [`crate::connect`]; [`Error::BlockingInAsyncContext`] from an async context;
/// [`Error::Backend`] if the background thread cannot be started.
pub fn connect(url: &str) -> Result<Client> {
    connect_with(url, ClientConfig::default())
}

/// Connects to the lock service at `url` with the given client configuration.
///
/// # Errors
/// As [`connect`], plus [`Error::InvalidConfig`] for an invalid configuration.
pub fn connect_with(url: &str, config: ClientConfig) -> Result<Client> {
    check_context("connect", None)?;
    let runtime = Arc::new(Background::start()?);
    let url = url.to_owned();
    let timeout = config.operation_timeout;
    let connect = async move { crate::connect_with(&url, config).await };
    let lock = runtime.run("connect", connect)??;
    Ok(Client {
        lock,
        runtime,
        timeout,
    })
}

/// A blocking lock client: [`DistributedLock`] with methods that block. Cheap to clone
/// (clones share the connection and the background runtime, which stops when the last
/// client, guard and observer are gone).
#[derive(Clone)]
pub struct Client {
    lock: Arc<dyn DistributedLock>,
    runtime: Arc<Background>,
    /// The operation timeout, which bounds a dropped guard's release.
    timeout: Duration,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("lock", &self.lock)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// The backend's short name, e.g. `"redis"`.
    pub fn backend(&self) -> &'static str {
        self.lock.backend()
    }

    /// What the backend guarantees.
    pub fn capabilities(&self) -> &Capabilities {
        self.lock.capabilities()
    }

    /// The async client underneath, for code that has an async context too. Its guards
    /// renew on this client's runtime only while the runtime runs (as long as this client
    /// or one of its clones lives).
    pub fn as_async(&self) -> &Arc<dyn DistributedLock> {
        &self.lock
    }

    /// Runs one operation of the async client on the background runtime.
    fn call<T, F>(
        &self,
        operation: &'static str,
        op: impl FnOnce(Arc<dyn DistributedLock>) -> F,
    ) -> Result<T>
    where
        T: Send + 'static,
        F: Future<Output = Result<T>> + Send + 'static,
    {
        self.runtime.run(operation, op(self.lock.clone()))?
    }

    fn guard(&self, guard: LockGuard) -> Guard {
        Guard {
            inner: Some(guard),
            runtime: self.runtime.clone(),
            timeout: self.timeout,
        }
    }

    /// Takes the lock if it is free right now; `Ok(None)` when somebody else holds it. See
    /// [`DistributedLock::try_acquire`]: the guard renews the lease as `options.renewal`
    /// says.
    ///
    /// # Errors
    /// As [`DistributedLock::try_acquire`]; [`Error::BlockingInAsyncContext`].
    pub fn try_acquire(&self, name: &str, options: &AcquireOptions) -> Result<Option<Guard>> {
        let (name, options) = (name.to_owned(), options.clone());
        let taken = self.call("try_acquire", move |lock| async move {
            lock.try_acquire(&name, &options).await
        })?;
        Ok(taken.map(|guard| self.guard(guard)))
    }

    /// Blocks until the lock is acquired or `options.wait` has passed (forever when it is
    /// `None`). See [`DistributedLock::acquire`] for wake-ups, retries and reentrancy.
    ///
    /// # Errors
    /// [`Error::Timeout`] when the wait deadline passes while the lock is held; otherwise as
    /// [`DistributedLock::acquire`]; [`Error::BlockingInAsyncContext`].
    pub fn acquire(&self, name: &str, options: &AcquireOptions) -> Result<Guard> {
        let (name, options) = (name.to_owned(), options.clone());
        let guard = self.call("acquire", move |lock| async move {
            lock.acquire(&name, &options).await
        })?;
        Ok(self.guard(guard))
    }

    /// Takes every lock of `names` or none, waiting up to `options.wait` for the whole set;
    /// see [`DistributedLock::acquire_all`].
    ///
    /// # Errors
    /// As [`DistributedLock::acquire_all`]; [`Error::BlockingInAsyncContext`].
    pub fn acquire_all(&self, names: &[&str], options: &AcquireOptions) -> Result<MultiGuard> {
        let (names, options) = (owned(names), options.clone());
        let guard = self.call("acquire_all", move |lock| async move {
            lock.acquire_all(&borrowed(&names), &options).await
        })?;
        Ok(self.multi(guard))
    }

    /// Takes every lock of `names` if all are free now, else none (`Ok(None)`); see
    /// [`DistributedLock::try_acquire_all`].
    ///
    /// # Errors
    /// As [`DistributedLock::try_acquire_all`]; [`Error::BlockingInAsyncContext`].
    pub fn try_acquire_all(
        &self,
        names: &[&str],
        options: &AcquireOptions,
    ) -> Result<Option<MultiGuard>> {
        let (names, options) = (owned(names), options.clone());
        let taken = self.call("try_acquire_all", move |lock| async move {
            lock.try_acquire_all(&borrowed(&names), &options).await
        })?;
        Ok(taken.map(|guard| self.multi(guard)))
    }

    fn multi(&self, guard: crate::MultiGuard) -> MultiGuard {
        MultiGuard {
            parts: guard
                .into_guards()
                .into_iter()
                .map(|g| self.guard(g))
                .collect(),
        }
    }

    /// Blocks until this candidate leads the election `name` with `value`; the guard's token
    /// is the term. Resign by releasing the guard. See [`DistributedLock::campaign`].
    ///
    /// # Errors
    /// As [`DistributedLock::campaign`]; [`Error::BlockingInAsyncContext`].
    pub fn campaign(&self, name: &str, value: &str, options: &AcquireOptions) -> Result<Guard> {
        let (name, value, options) = (name.to_owned(), value.to_owned(), options.clone());
        let guard = self.call("campaign", move |lock| async move {
            lock.campaign(&name, &value, &options).await
        })?;
        Ok(self.guard(guard))
    }

    /// The current leader of the election `name` (`Ok(None)`: none).
    ///
    /// # Errors
    /// As [`DistributedLock::leader`]; [`Error::BlockingInAsyncContext`].
    pub fn leader(&self, name: &str) -> Result<Option<Leader>> {
        let name = name.to_owned();
        self.call(
            "leader",
            move |lock| async move { lock.leader(&name).await },
        )
    }

    /// Observes the election `name`: an iterator of the leader now, then of every change,
    /// read when the backend signals one and at least every `every`; see
    /// [`DistributedLock::observe`]. Each `next` blocks until the next change; the
    /// observation stops when the iterator is dropped.
    pub fn observe(&self, name: &str, every: Duration) -> Observer {
        Observer::start(self, self.lock.observe(name, every))
    }

    /// Who holds `name`, for diagnostics (`Ok(None)`: free).
    ///
    /// # Errors
    /// As [`DistributedLock::inspect`]; [`Error::BlockingInAsyncContext`].
    pub fn inspect(&self, name: &str) -> Result<Option<LockInfo>> {
        let name = name.to_owned();
        self.call(
            "inspect",
            move |lock| async move { lock.inspect(&name).await },
        )
    }

    /// Held locks whose name starts with `prefix`, at most `limit`, sorted by name.
    ///
    /// # Errors
    /// As [`DistributedLock::list`]; [`Error::BlockingInAsyncContext`].
    pub fn list(&self, prefix: Option<&str>, limit: usize) -> Result<Vec<(LockName, LockInfo)>> {
        let prefix = prefix.map(str::to_owned);
        self.call("list", move |lock| async move {
            lock.list(prefix.as_deref(), limit).await
        })
    }

    /// **Dangerous**: frees `name` whoever holds it; see [`DistributedLock::force_release`].
    ///
    /// # Errors
    /// As [`DistributedLock::force_release`]; [`Error::BlockingInAsyncContext`].
    pub fn force_release(&self, name: &str) -> Result<bool> {
        let name = name.to_owned();
        self.call("force_release", move |lock| async move {
            lock.force_release(&name).await
        })
    }

    /// Releases the one hold of `name` with this owner and token; see
    /// [`DistributedLock::release_hold`].
    ///
    /// # Errors
    /// As [`DistributedLock::release_hold`]; [`Error::BlockingInAsyncContext`].
    pub fn release_hold(&self, name: &str, owner: &str, token: FencingToken) -> Result<bool> {
        let (name, owner) = (name.to_owned(), owner.to_owned());
        self.call("release_hold", move |lock| async move {
            lock.release_hold(&name, &owner, token).await
        })
    }
}

fn owned(names: &[&str]) -> Vec<String> {
    names.iter().map(|n| (*n).to_owned()).collect()
}

fn borrowed(names: &[String]) -> Vec<&str> {
    names.iter().map(String::as_str).collect()
}

/// A held lock, from a blocking [`Client`]: the async [`LockGuard`] with blocking methods.
///
/// It renews its lease on the client's background runtime. Dropping it releases the lock and
/// blocks until the release is answered, at most the client's operation timeout (then the
/// ttl frees the lock); dropped in an async context it releases in the background instead.
/// Prefer [`release`](Self::release), which reports whether the lock was still yours.
#[must_use = "the lock is released as soon as the guard is dropped"]
pub struct Guard {
    /// `None` once released, abandoned or dropped.
    inner: Option<LockGuard>,
    runtime: Arc<Background>,
    timeout: Duration,
}

impl fmt::Debug for Guard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.inner {
            Some(guard) => guard.fmt(f),
            None => f.write_str("Guard(finished)"),
        }
    }
}

impl Guard {
    fn get(&self) -> &LockGuard {
        self.inner
            .as_ref()
            .expect("a guard is present until consumed")
    }

    fn take(&mut self) -> LockGuard {
        self.inner
            .take()
            .expect("a guard is present until consumed")
    }

    /// The lock name.
    pub fn name(&self) -> &LockName {
        self.get().name()
    }

    /// What this guard holds: the whole lock, a shared hold, or one permit.
    pub fn kind(&self) -> LockKind {
        self.get().kind()
    }

    /// The unique owner value stored on the server for this acquisition.
    pub fn owner(&self) -> &str {
        self.get().owner()
    }

    /// The fencing token of this acquisition: pass it with every write to the resource.
    pub fn token(&self) -> FencingToken {
        self.get().token()
    }

    /// The lease length this lock was acquired with.
    pub fn ttl(&self) -> Duration {
        self.get().ttl()
    }

    /// The monotonic instant until which the lock is certainly held; see
    /// [`LockGuard::valid_until`].
    pub fn valid_until(&self) -> Instant {
        self.get().valid_until()
    }

    /// Whether the lock may be lost (a loss was reported, or `valid_until` has passed).
    pub fn is_lost(&self) -> bool {
        self.get().is_lost()
    }

    /// Why the lock was lost, if a loss has been reported.
    pub fn loss_reason(&self) -> Option<LossReason> {
        self.get().loss_reason()
    }

    /// Blocks until the lock is lost, and says why. Returns at once if it is already lost.
    /// Use it in a thread of its own (or [`wait_lost_timeout`](Self::wait_lost_timeout)):
    /// a lock kept renewed is never lost.
    ///
    /// # Errors
    /// [`Error::BlockingInAsyncContext`].
    pub fn wait_lost(&self) -> Result<LossReason> {
        self.runtime.run("wait_lost", self.get().lost())
    }

    /// Blocks until the lock is lost or `timeout` has passed: `Ok(Some(reason))` for a loss,
    /// `Ok(None)` if the lock is still held.
    ///
    /// # Errors
    /// [`Error::BlockingInAsyncContext`].
    pub fn wait_lost_timeout(&self, timeout: Duration) -> Result<Option<LossReason>> {
        let lost = self.get().lost();
        self.runtime.run("wait_lost_timeout", async move {
            tokio::time::timeout(timeout, lost).await.ok()
        })
    }

    /// Renews the lease now; see [`LockGuard::renew`].
    ///
    /// # Errors
    /// As [`LockGuard::renew`]; [`Error::BlockingInAsyncContext`].
    pub fn renew(&self) -> Result<()> {
        self.runtime.block_on("renew", self.get().renew())?
    }

    /// Replaces the data stored with the hold; see [`LockGuard::set_data`].
    ///
    /// # Errors
    /// As [`LockGuard::set_data`]; [`Error::BlockingInAsyncContext`].
    pub fn set_data(&self, data: Option<&str>) -> Result<()> {
        self.runtime
            .block_on("set_data", self.get().set_data(data))?
    }

    /// Proclaims a new leader value; see [`LockGuard::proclaim`].
    ///
    /// # Errors
    /// As [`LockGuard::proclaim`]; [`Error::BlockingInAsyncContext`].
    pub fn proclaim(&self, value: &str) -> Result<()> {
        self.runtime
            .block_on("proclaim", self.get().proclaim(value))?
    }

    /// Releases the lock (or one reentrant hold of it); see [`LockGuard::release`].
    ///
    /// # Errors
    /// As [`LockGuard::release`]; [`Error::BlockingInAsyncContext`] (the guard is then
    /// released in the background, as a drop would).
    pub fn release(mut self) -> Result<()> {
        let guard = self.take();
        match self.runtime.check("release") {
            Ok(()) => self.runtime.run("release", guard.release())?,
            Err(err) => {
                self.runtime.release_in_background(guard);
                Err(err)
            }
        }
    }

    /// Releases the lock once it has been held for at least `minimum` since its acquisition
    /// (a job that must not run again within that time); see [`LockGuard::release_after`].
    /// Blocks until then.
    ///
    /// # Errors
    /// As [`LockGuard::release`]; [`Error::BlockingInAsyncContext`] (the guard is then
    /// released at once in the background, as a drop would).
    pub fn release_after(mut self, minimum: Duration) -> Result<()> {
        let guard = self.take();
        match self.runtime.check("release_after") {
            Ok(()) => self
                .runtime
                .run("release_after", guard.release_after(minimum))?,
            Err(err) => {
                self.runtime.release_in_background(guard);
                Err(err)
            }
        }
    }

    /// Stops renewal and leaves the lock to expire, as a crashed holder would; see
    /// [`LockGuard::abandon`].
    pub fn abandon(mut self) {
        self.take().abandon();
    }

    /// The async guard, to use in an async context of your own. Its renewals run on this
    /// client's background runtime, which lives as long as a client of it does.
    pub fn into_async(mut self) -> LockGuard {
        self.take()
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let Some(guard) = self.inner.take() else {
            return;
        };
        if self.runtime.check("drop").is_err() {
            self.runtime.release_in_background(guard);
            return;
        }
        // Blocks until the release is answered; `release` itself gives up after the
        // operation timeout, and the bound here covers a runtime that stopped answering.
        let bound = self.timeout + Duration::from_secs(1);
        if let Err(err) = self.runtime.run_bounded("drop", bound, guard.release()) {
            tracing::debug!(%err, "release after drop failed; the ttl frees the lock");
        }
    }
}

/// All the locks of a set, from [`Client::acquire_all`]: each part a [`Guard`].
#[derive(Debug)]
#[must_use = "the locks are released as soon as the guard is dropped"]
pub struct MultiGuard {
    /// In name order.
    parts: Vec<Guard>,
}

impl MultiGuard {
    /// The parts, in name order.
    pub fn guards(&self) -> &[Guard] {
        &self.parts
    }

    /// The parts, to hold or release one by one.
    pub fn into_guards(self) -> Vec<Guard> {
        self.parts
    }

    /// The fencing token of one part.
    pub fn token(&self, name: &str) -> Option<FencingToken> {
        self.parts
            .iter()
            .find(|g| g.name().as_str() == name)
            .map(Guard::token)
    }

    /// The earliest [`Guard::valid_until`] of the parts: until then, all are held.
    pub fn valid_until(&self) -> Instant {
        self.parts
            .iter()
            .map(Guard::valid_until)
            .min()
            .unwrap_or_else(Instant::now)
    }

    /// Whether any part may be lost.
    pub fn is_lost(&self) -> bool {
        self.parts.iter().any(Guard::is_lost)
    }

    /// Releases every part (in reverse name order), even when one fails.
    ///
    /// # Errors
    /// The first error of a part's release; the others are released nonetheless.
    pub fn release(self) -> Result<()> {
        let mut first = Ok(());
        for part in self.parts.into_iter().rev() {
            let released = part.release();
            if first.is_ok() {
                first = released;
            }
        }
        first
    }
}

/// The changes of an election's leader, from [`Client::observe`]. `next` blocks until the
/// next change; dropping the observer stops the observation.
pub struct Observer {
    changes: Option<tokio::sync::mpsc::Receiver<Result<Option<Leader>>>>,
    runtime: Arc<Background>,
}

impl fmt::Debug for Observer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Observer").finish_non_exhaustive()
    }
}

impl Observer {
    fn start(client: &Client, mut stream: BoxStream<'static, Result<Option<Leader>>>) -> Self {
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        client.runtime.handle.spawn(async move {
            while let Some(change) = stream.next().await {
                if tx.send(change).await.is_err() {
                    break; // the observer was dropped
                }
            }
        });
        Self {
            changes: Some(rx),
            runtime: client.runtime.clone(),
        }
    }

    /// The next change, waiting at most `timeout`: `Ok(None)` when none came.
    ///
    /// # Errors
    /// The observation's error (it goes on after one); [`Error::BlockingInAsyncContext`];
    /// [`Error::Backend`] when the observation has ended.
    pub fn next_timeout(&mut self, timeout: Duration) -> Result<Option<Option<Leader>>> {
        let changes = self.changes.as_mut().ok_or_else(ended)?;
        // Built when polled, in the runtime's context (a timer needs one).
        let next = async { tokio::time::timeout(timeout, changes.recv()).await };
        match self.runtime.block_on("observe", next)? {
            Ok(Some(change)) => change.map(Some),
            Ok(None) => Err(ended()),
            Err(_) => Ok(None),
        }
    }
}

fn ended() -> Error {
    Error::Backend {
        message: "the election observation has ended".into(),
        source: None,
    }
}

impl Iterator for Observer {
    type Item = Result<Option<Leader>>;

    /// Blocks until the next change. `None` when the observation ended; an
    /// [`Error::BlockingInAsyncContext`] item (and then `None`) in an async context.
    fn next(&mut self) -> Option<Self::Item> {
        let changes = self.changes.as_mut()?;
        match self.runtime.block_on("observe", changes.recv()) {
            Ok(change) => change,
            Err(err) => {
                self.changes = None;
                Some(Err(err))
            }
        }
    }
}
