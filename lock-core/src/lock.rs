//! The user-facing trait.

use std::fmt::Debug;

use async_trait::async_trait;

use std::time::{Duration, Instant};

use futures::stream::BoxStream;

use crate::{
    AcquireOptions, Capabilities, Leader, LockGuard, LockInfo, LockName, MultiGuard, Result,
};

/// A distributed lock service: one client of one backend.
///
/// Object safe: `Arc<dyn DistributedLock>` works, which is what
/// `distlock::connect(url)` returns. Every backend gives the same guarantees, except those its
/// [`Capabilities`] declare otherwise (fencing strength, fairness, wake-up mechanism).
///
/// ```
/// # async fn demo() -> Result<(), distlock_core::Error> {
/// use std::time::Duration;
/// use distlock_core::{AcquireOptions, DistributedLock, memory::MemoryStore};
///
/// let locks = MemoryStore::new().client();
/// let opts = AcquireOptions::default().with_ttl(Duration::from_secs(10));
/// let guard = locks.acquire("reports/daily", &opts).await?;
/// println!("fencing token {}", guard.token());
/// guard.release().await?;
/// # Ok(()) }
/// # tokio::runtime::Runtime::new().unwrap().block_on(demo()).unwrap();
/// ```
#[async_trait]
pub trait DistributedLock: Send + Sync + Debug {
    /// The backend's short name, e.g. `"redis"`.
    fn backend(&self) -> &'static str;

    /// What the backend guarantees.
    fn capabilities(&self) -> &Capabilities;

    /// Takes the lock if it is free right now (for FIFO backends: free and nobody queued).
    ///
    /// Returns `Ok(None)` when somebody else holds it: that is not an error. The guard renews
    /// the lease as `options.renewal` says. `options.wait` is ignored.
    ///
    /// Cancel safe: if the future is dropped, whatever the attempt left on the server is
    /// removed in the background, and at worst expires after the ttl.
    ///
    /// # Errors
    /// [`Error::InvalidName`](crate::Error::InvalidName),
    /// [`Error::InvalidOptions`](crate::Error::InvalidOptions), or the backend's error
    /// ([`Error::Unavailable`](crate::Error::Unavailable) after the operation timeout).
    async fn try_acquire(&self, name: &str, options: &AcquireOptions) -> Result<Option<LockGuard>>;

    /// Waits until the lock is acquired or `options.wait` has passed.
    ///
    /// Waiters are woken by the backend's release events where it has them, and otherwise
    /// poll with jittered backoff bounded by the holder's remaining lease. With an explicit
    /// `options.owner`, an owner that already holds the lock through this client gets another
    /// guard on the same lease at once (reentrancy); the lock is released when the last of them
    /// is released.
    ///
    /// Cancel safe, as [`try_acquire`](Self::try_acquire): a dropped `acquire` leaves no queue
    /// entry and no lock behind for longer than the ttl.
    ///
    /// Retryable backend errors (an unreachable server, a timed-out request) are retried with
    /// backoff until the deadline; with no deadline, forever. They are not silent: each is
    /// logged as a `tracing` warning with target `distlock_core::wait`, the first at once, then
    /// at most one every 10 s with the number of failures in between.
    ///
    /// # Errors
    /// [`Error::Timeout`](crate::Error::Timeout) when the wait deadline passes while the lock
    /// is busy; the last backend error when the deadline passes while the backend was failing
    /// (e.g. [`Error::Unavailable`](crate::Error::Unavailable)); validation errors as
    /// `try_acquire`.
    async fn acquire(&self, name: &str, options: &AcquireOptions) -> Result<LockGuard>;

    /// Takes every lock of `names` or none: in the canonical order of the names (sorted, so
    /// two callers asking for overlapping sets in any order never deadlock), each as
    /// `options` say (kind, ttl, renewal). `options.wait` bounds the whole acquisition.
    /// Duplicate names count once.
    ///
    /// Cancel safe: dropping the future releases the parts taken so far in the background.
    ///
    /// # Errors
    /// [`Error::InvalidOptions`](crate::Error::InvalidOptions) for an empty set; any error of
    /// [`acquire`](Self::acquire) (the parts taken are released first).
    async fn acquire_all(&self, names: &[&str], options: &AcquireOptions) -> Result<MultiGuard> {
        let names = crate::multi::canonical(names)?;
        let deadline = options.wait.and_then(|w| Instant::now().checked_add(w));
        let mut guards = Vec::with_capacity(names.len());
        for name in &names {
            let mut part = options.clone();
            if let Some(deadline) = deadline {
                part.wait = Some(deadline.saturating_duration_since(Instant::now()));
            }
            match self.acquire(name.as_str(), &part).await {
                Ok(guard) => guards.push(guard),
                Err(err) => {
                    MultiGuard::new(guards).release().await.ok();
                    return Err(err);
                }
            }
        }
        Ok(MultiGuard::new(guards))
    }

    /// Takes every lock of `names` if all are free now, else none (`Ok(None)`), in the
    /// canonical order of [`acquire_all`](Self::acquire_all).
    ///
    /// # Errors
    /// As [`try_acquire`](Self::try_acquire); the parts taken are released first.
    async fn try_acquire_all(
        &self,
        names: &[&str],
        options: &AcquireOptions,
    ) -> Result<Option<MultiGuard>> {
        let names = crate::multi::canonical(names)?;
        let mut guards = Vec::with_capacity(names.len());
        for name in &names {
            let taken = self.try_acquire(name.as_str(), options).await;
            match taken {
                Ok(Some(guard)) => guards.push(guard),
                Ok(None) | Err(_) => {
                    MultiGuard::new(guards).release().await.ok();
                    return taken.map(|_| None);
                }
            }
        }
        Ok(Some(MultiGuard::new(guards)))
    }

    /// Campaigns to lead the election `name` with `value` (at most
    /// 128 bytes, e.g. the candidate's address): waits, as [`acquire`](Self::acquire) does,
    /// until it holds the exclusive lock `name`, and returns the leader's guard. Its
    /// [`token`](LockGuard::token) is the term: strictly increasing across leaders. The
    /// leader stays leader while the guard renews; it learns of a loss through
    /// [`LockGuard::lost`] before anyone else can be elected (its
    /// [`valid_until`](LockGuard::valid_until) passes first). Resign by releasing the guard.
    ///
    /// `options.owner` and `options.kind` are ignored: campaigns are never reentrant.
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire);
    /// [`Error::InvalidOptions`](crate::Error::InvalidOptions) for a value too long or with
    /// a NUL.
    async fn campaign(
        &self,
        name: &str,
        value: &str,
        options: &AcquireOptions,
    ) -> Result<LockGuard>;

    /// The current leader of the election `name`, for anyone (`Ok(None)`: no leader). A name
    /// held by a plain exclusive lock shows as a leader without a value.
    ///
    /// # Errors
    /// As [`inspect`](Self::inspect).
    async fn leader(&self, name: &str) -> Result<Option<Leader>> {
        Ok(self.inspect(name).await?.and_then(Leader::from_info))
    }

    /// Observes the election `name`: the leader now, then every change (a new leader or term,
    /// or none), read again whenever the backend signals a change (see
    /// [`LockBackend::watch`](crate::LockBackend::watch)) and at least every `every`. Errors
    /// are yielded and the observation goes on; it ends when the stream is dropped.
    ///
    /// A change that comes and goes between two reads is not seen; terms tell how many
    /// leaders came between.
    fn observe(&self, name: &str, every: Duration) -> BoxStream<'static, Result<Option<Leader>>>;

    /// Reads who holds `name`, for diagnostics (`Ok(None)`: free).
    ///
    /// # Errors
    /// [`Error::Unsupported`](crate::Error::Unsupported) when the backend cannot tell.
    async fn inspect(&self, name: &str) -> Result<Option<LockInfo>>;

    /// Lists held locks whose name starts with `prefix` (all when `None`), at most `limit` of
    /// them, sorted by name, for operators and diagnostics. When more locks are held, which of
    /// them are returned is up to the backend. Expired leases and waiters are not listed.
    /// [`Capabilities::list`] says whether the backend can list.
    ///
    /// # Errors
    /// [`Error::Unsupported`](crate::Error::Unsupported) when the backend cannot list;
    /// [`Error::InvalidName`](crate::Error::InvalidName) for a prefix no name could start
    /// with (longer than [`LockName::MAX_LEN`](crate::LockName::MAX_LEN), or with a NUL).
    async fn list(&self, prefix: Option<&str>, limit: usize) -> Result<Vec<(LockName, LockInfo)>> {
        let _ = (prefix, limit);
        Err(crate::Error::Unsupported(format!(
            "{} cannot list locks",
            self.backend()
        )))
    }

    /// Counts what the server keeps for the lock names that start with `prefix` (all names
    /// when empty), held or free: every key, row or node the backend wrote for them and has
    /// not removed, by kind (see [`Footprint`](crate::Footprint)). What a name leaves behind
    /// once released is bounded per backend; the README's "Growth curves" give the figures.
    /// It may read every such object (no operation timeout), so it can take long on a large
    /// key space. `Ok(None)`: the backend cannot count.
    ///
    /// # Errors
    /// [`Error::InvalidName`](crate::Error::InvalidName) for a prefix no name could start
    /// with; the backend's error when the server cannot be read.
    async fn footprint(&self, prefix: &str) -> Result<Option<crate::Footprint>> {
        let _ = prefix;
        Ok(None)
    }

    /// Releases exactly one hold of `name`, the one whose owner is `owner` and whose fencing
    /// token is `token` (as [`LockGuard::owner`] and [`LockGuard::token`] report them, e.g.
    /// from `distlock status` or `list`), from any process: a supervisor freeing the lock of
    /// a worker it knows is dead, without the risk of [`force_release`](Self::force_release)
    /// freeing a newer holder. Returns `Ok(true)` when that hold was live and is now released
    /// (its waiters are woken as by a release), `Ok(false)` when no live hold of `name` has
    /// that owner and that token: released, expired or forced out already, or a typo. Other
    /// holders of a shared lock or semaphore, newer holds and waiters are untouched.
    ///
    /// The holder is not stopped: as after [`force_release`](Self::force_release), it learns
    /// of the loss at its next renewal, and the next acquisition gets a higher
    /// [`FencingToken`](crate::FencingToken).
    ///
    /// # Errors
    /// [`Error::Unsupported`](crate::Error::Unsupported) when the backend cannot do it
    /// ([`Capabilities::release_hold`]); [`Error::InvalidName`](crate::Error::InvalidName);
    /// [`Error::InvalidOptions`](crate::Error::InvalidOptions) for an empty owner, one with a
    /// NUL or one longer than 512 bytes (no stored owner is: at most 161).
    async fn release_hold(
        &self,
        name: &str,
        owner: &str,
        token: crate::FencingToken,
    ) -> Result<bool> {
        let _ = (name, owner, token);
        Err(crate::Error::Unsupported(
            "this lock cannot release a hold by its owner and token".into(),
        ))
    }

    /// **Dangerous**: frees `name` whoever holds it, as an operator breaking a stuck lock, and
    /// wakes its waiters. Returns whether a live lock was removed (`Ok(false)`: it was free).
    ///
    /// The holder is not stopped: it keeps running until its next renewal is refused, and
    /// learns of the loss through [`LockGuard::lost`] / [`LockGuard::is_lost`] (within one
    /// renewal interval for a guard that renews; a guard without renewal only at its local
    /// deadline). Until then it may still act as if it held the lock. What keeps a resource
    /// safe is fencing: the next acquisition gets a higher [`FencingToken`](crate::FencingToken),
    /// so a resource that checks tokens refuses the former holder's late writes. Its
    /// `renew` and `release` fail with [`Error::NotHeld`](crate::Error::NotHeld) or
    /// [`Error::Lost`](crate::Error::Lost).
    ///
    /// # Errors
    /// [`Error::Unsupported`](crate::Error::Unsupported) when the backend cannot do it
    /// ([`Capabilities::force_release`]); [`Error::InvalidName`](crate::Error::InvalidName);
    /// the backend's error when the server cannot be reached, or answers too few to tell
    /// whether the lock was held (Redlock, fewer masters than a majority could hide: the lock
    /// is removed from those that answered).
    async fn force_release(&self, name: &str) -> Result<bool> {
        let _ = name;
        Err(crate::Error::Unsupported(format!(
            "{} cannot force-release locks",
            self.backend()
        )))
    }
}
