//! The backend-facing interface: the few protocol primitives a backend implements.
//!
//! See the crate documentation, section "Writing a backend".

use std::any::Any;
use std::fmt::Debug;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::future::BoxFuture;
use futures::stream::BoxStream;

use crate::{Capabilities, FencingToken, LockKind, LockName, LossReason, Result};

pub use crate::contended::Contended;
pub use crate::finish::InFlight;
pub use crate::loss::LossEpochs;
pub use crate::retry::{Retries, RetryPolicy, detached, retrying, spawn_cleanup, within};

/// A lock server protocol. Everything else (validation, waiting, renewal scheduling, loss
/// detection, guards, reentrancy, tracing) is done once by [`LockClient`](crate::LockClient).
#[async_trait]
pub trait LockBackend: Send + Sync + Debug + 'static {
    /// A short name for logs and reports, e.g. `"redis"`.
    fn name(&self) -> &'static str;

    /// What this backend guarantees; checked against [`AcquireOptions`](crate::AcquireOptions).
    fn capabilities(&self) -> Capabilities;

    /// Starts one acquisition. Must not do I/O: the first [`Attempt::poll`] does.
    fn begin(&self, request: AcquireRequest) -> Box<dyn Attempt>;

    /// Reads who holds `name`, for diagnostics. The default says the backend cannot tell.
    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        let _ = name;
        Err(crate::Error::Unsupported(format!(
            "{} cannot inspect locks",
            self.name()
        )))
    }

    /// Lists held locks whose name starts with `prefix` (every held lock when `None`), at
    /// most `limit` of them, sorted by name. When more are held, which ones are returned is
    /// up to the backend. Expired leases and waiters are not listed. The default says the
    /// backend cannot list; a backend that overrides it declares
    /// [`Capabilities::list`](crate::Capabilities::list).
    async fn list(&self, prefix: Option<&str>, limit: usize) -> Result<Vec<(LockName, LockInfo)>> {
        let _ = (prefix, limit);
        Err(crate::Error::Unsupported(format!(
            "{} cannot list locks",
            self.name()
        )))
    }

    /// Frees `name` whoever holds it, as an operator breaking a stuck lock would, and wakes
    /// its waiters the way a release does. Returns whether a live lock was removed.
    ///
    /// The fencing state must survive: the next acquisition of `name` gets a token higher than
    /// the removed holder's. The former holder's renewal and release must then fail with
    /// [`Error::NotHeld`](crate::Error::NotHeld). The default says the backend cannot do it.
    async fn force_release(&self, name: &LockName) -> Result<bool> {
        let _ = name;
        Err(crate::Error::Unsupported(format!(
            "{} cannot force-release locks",
            self.name()
        )))
    }

    /// Releases the one live hold of `name` whose owner is `owner` (the
    /// [`AcquireRequest::owner`] of its acquisition) and whose fencing token is `token`, as its
    /// holder's release would (its waiters are woken), from any process. Touches nothing else:
    /// not another holder of a shared lock or semaphore, not a newer hold, not a waiter.
    /// Returns whether that hold was live and is now released; `Ok(false)` when no live hold
    /// of `name` has both that owner and that token (released, expired, forced out, or never).
    /// The check and the removal are one atomic step on the server.
    ///
    /// As for [`force_release`](Self::force_release), the fencing state survives and the
    /// released holder's renewal and release then fail with
    /// [`Error::NotHeld`](crate::Error::NotHeld). A backend that overrides it declares
    /// [`Capabilities::release_hold`](crate::Capabilities::release_hold); the default says it
    /// cannot.
    async fn release_hold(
        &self,
        name: &LockName,
        owner: &str,
        token: FencingToken,
    ) -> Result<bool> {
        let _ = (name, owner, token);
        Err(crate::Error::Unsupported(format!(
            "{} cannot release a hold by its owner and token",
            self.name()
        )))
    }

    /// Counts what the server keeps for the lock names that start with `prefix` (every name
    /// when empty; a valid name prefix, checked by the caller): each key, row or node this
    /// backend writes for them, held or not, by kind. For operators and the growth
    /// measurements (what names no longer used leave behind). It may read every such
    /// object, so it can take long on a large key space. `Ok(None)` (the default): the
    /// backend cannot count.
    async fn footprint(&self, prefix: &str) -> Result<Option<crate::Footprint>> {
        let _ = prefix;
        Ok(None)
    }

    /// A stream that yields whenever the holders of `name` may have changed (a release, a new
    /// holder), for observers of an election. It may yield more often than things change,
    /// and must not miss a change after the stream was created. `None` (the default): the
    /// backend cannot wake observers, who then read [`inspect`](Self::inspect) at intervals.
    fn watch(&self, name: &LockName) -> Option<BoxStream<'static, ()>> {
        let _ = name;
        None
    }
}

/// What an acquisition asks for.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct AcquireRequest {
    /// The lock.
    pub name: LockName,
    /// A value unique to this acquisition (a UUID, prefixed with the explicit owner id if one
    /// was given). Store it on the server; renew and release must check it. Shared: a lease
    /// that keeps a clone keeps no copy of its own.
    pub owner: Arc<str>,
    /// The lease length.
    pub ttl: Duration,
    /// Whether the caller waits ([`AttemptMode::Wait`]) or tries once.
    pub mode: AttemptMode,
    /// What is asked for. Checked against [`Capabilities`] by the core: a backend only sees
    /// the kinds it declares. Holders of other kinds on the name must answer
    /// [`Error::Mismatch`](crate::Error::Mismatch) where [`LockKind::mismatch`] says so, and
    /// so may attempts of such kinds queued ahead of this one (one of them may be the head by
    /// the time it looks at the queue).
    pub kind: LockKind,
}

impl AcquireRequest {
    /// A request as the core makes it, for a backend's own tests of its attempts: `owner`
    /// must be unique to the acquisition, as the core's are.
    #[must_use]
    pub fn new(
        name: LockName,
        owner: Arc<str>,
        ttl: Duration,
        mode: AttemptMode,
        kind: LockKind,
    ) -> Self {
        Self {
            name,
            owner,
            ttl,
            mode,
            kind,
        }
    }
}

/// Whether an attempt may queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttemptMode {
    /// `try_acquire`: take the lock only if it is free (and, for fair backends, nobody waits);
    /// never leave a queue entry behind.
    Try,
    /// `acquire`: the attempt may join a queue; [`Attempt::abandon`] leaves it.
    Wait,
}

/// One acquisition in progress. Created by [`LockBackend::begin`], driven by the core.
///
/// Cancel safety: the core may drop a [`poll`](Attempt::poll) or [`changed`](Attempt::changed)
/// future at any await point (operation timeout, wait deadline, the caller dropping `acquire`).
/// The attempt must stay usable for the next call and for [`abandon`](Attempt::abandon), which
/// the core always calls (from a spawned task if the caller was cancelled) when the attempt ends
/// without a guard.
#[async_trait]
pub trait Attempt: Send + 'static {
    /// Tries to take the lock (or checks the attempt's place in the queue).
    async fn poll(&mut self) -> Result<Step>;

    /// Resolves when calling [`poll`](Attempt::poll) again is worthwhile (a release was
    /// published, the predecessor disappeared). Must not miss a change that happened after the
    /// last `poll` started. The default never resolves: the core then polls with backoff.
    async fn changed(&mut self) {
        std::future::pending::<()>().await;
    }

    /// Removes every trace of this attempt from the server: a queue entry, or a lock taken by a
    /// `poll` whose reply never arrived (owner-checked, by [`AcquireRequest::owner`]).
    async fn abandon(self: Box<Self>) -> Result<()>;
}

/// The result of one [`Attempt::poll`]. When to poll again is the core's decision; the step
/// tells it what the backend saw.
#[derive(Debug)]
#[non_exhaustive]
pub enum Step {
    /// The lock is ours.
    Acquired(Acquired),
    /// Somebody else holds it (or is ahead in the queue): poll again on a wake-up
    /// ([`Attempt::changed`]), or after `retry_after`, or after the core's backoff.
    Busy {
        /// When polling again makes sense even without a wake-up, typically the holder's
        /// remaining lease.
        retry_after: Option<Duration>,
    },
    /// This attempt is next in line: the holder's release makes it the holder. A backend
    /// without wake-up events says so, and the core polls it briskly (1 ms doubling to
    /// [`NEXT_IN_LINE_MAX_POLL`]) while the other waiters back off.
    NextInLine {
        /// As for [`Step::Busy`].
        retry_after: Option<Duration>,
    },
    /// The attempt's view of the server changed under it (its predecessor left, a release
    /// came between two requests, a session was re-established): poll again now. The core
    /// does so at once up to [`MAX_IMMEDIATE_POLLS`] times in a row, then backs off.
    Again,
    /// The attempt lost a race with no clear holder (a Redlock split vote): poll again after
    /// a short random pause (up to a tenth of the ttl, 2-50 ms), wake-up or not.
    Contended,
}

/// How many [`Step::Again`] in a row the core answers with an immediate poll before it backs
/// off (a backend that keeps answering `Again` is not allowed to spin).
pub const MAX_IMMEDIATE_POLLS: u32 = 16;

/// The longest pause between polls of an attempt that is [`Step::NextInLine`].
pub const NEXT_IN_LINE_MAX_POLL: Duration = Duration::from_millis(20);

impl Step {
    /// Shorthand for a busy lock with a known remaining lease.
    pub fn busy(retry_after: Option<Duration>) -> Self {
        Self::Busy { retry_after }
    }
}

/// A lock just taken.
#[derive(Debug)]
#[non_exhaustive]
pub struct Acquired {
    /// The handle to renew and release it.
    pub lease: Box<dyn Lease>,
    /// Its fencing token.
    pub token: FencingToken,
    /// If the server's lease clock started before the request that returned this (e.g. a lease
    /// granted when the attempt joined a queue), the monotonic instant before that request was
    /// sent. The core takes the earlier of this and the start of the successful `poll`.
    pub lease_started: Option<Instant>,
}

impl Acquired {
    /// A lock whose lease started with the poll that returned it.
    pub fn new(lease: Box<dyn Lease>, token: FencingToken) -> Self {
        Self {
            lease,
            token,
            lease_started: None,
        }
    }

    /// Sets an earlier lease start.
    #[must_use]
    pub fn with_lease_started(mut self, started: Instant) -> Self {
        self.lease_started = Some(started);
        self
    }
}

/// The server-side handle of a held lock.
#[async_trait]
pub trait Lease: Any + Send + Sync + Debug + 'static {
    /// Extends the lease to `ttl` from now, only if this owner still holds it.
    ///
    /// # Errors
    /// [`Error::NotHeld`](crate::Error::NotHeld) when the server says the owner no longer holds
    /// the lock; [`Error::Unavailable`](crate::Error::Unavailable) when the server cannot be
    /// reached (the core retries until the local deadline).
    async fn renew(&self, ttl: Duration) -> Result<()>;

    /// Releases the lock, only if this owner still holds it, and wakes waiters.
    ///
    /// # Errors
    /// [`Error::NotHeld`](crate::Error::NotHeld) when the owner no longer held it.
    async fn release(&self) -> Result<()>;

    /// Replaces the data stored with this hold (`None`: removes it), only if this owner still
    /// holds it, atomically on the server; `inspect` and `list` show it from then on, and it
    /// ends with the hold. The core checks the size ([`crate::MAX_HOLDER_DATA`]). Backends
    /// that declare [`Capabilities::holder_data`] implement it.
    ///
    /// # Errors
    /// [`Error::NotHeld`](crate::Error::NotHeld) when the owner no longer holds it; the
    /// default: [`Error::Unsupported`](crate::Error::Unsupported).
    async fn set_data(&self, data: Option<&str>) -> Result<()> {
        let _ = data;
        Err(crate::Error::Unsupported(
            "this backend stores no data with a hold".into(),
        ))
    }

    /// A future that resolves when the backend itself learns the lock is gone (session expiry,
    /// a watch on the key). `None` (the default): loss is detected by renewal only.
    ///
    /// Called once per guard; a `Some` future is polled by the client's one watchdog task (the
    /// task that renews every guard) until the guard is released or lost, so keep it cheap:
    /// no request per guard (set up a watch lazily, or share one per connection), and no
    /// blocking or long computation when polled.
    fn loss_signal(&self) -> Option<BoxFuture<'static, LossReason>> {
        None
    }

    /// The shared source of losses this lease belongs to, and the epoch it was taken in: the
    /// cheap form of [`Lease::loss_signal`] for a loss that ends every lock of a server or
    /// session at once (see [`LossEpochs`]). `None` (the default): none.
    ///
    /// Called once per guard, when it starts (a backend may start its watch then); the guard
    /// is lost, with the event's reason, by the first event of the source numbered above the
    /// returned epoch, until it is released. A lease may have both this and a
    /// [`Lease::loss_signal`]; whichever fires first ends the guard.
    fn shared_loss(&self) -> Option<(LossEpochs, u64)> {
        None
    }

    /// Called by the core, in the background, once the lock has run out without a release:
    /// the guard's local deadline passed (renewal disabled, the hold limit reached, the guard
    /// abandoned, renewals failing) or its release got no answer. The call comes after the
    /// last acquire or renew request was sent plus its ttl, i.e. once the server's lease has
    /// certainly ended, and is repeated under
    /// [`RetryPolicy::BACKGROUND`](crate::backend::RetryPolicy::BACKGROUND) while it fails.
    ///
    /// A backend whose server-side lease can outlive the lock (etcd: one lease kept alive
    /// for all of a client's keys) removes the lock here, owner-checked. The default does
    /// nothing: the server's ttl already freed it.
    async fn expired(&self) -> Result<()> {
        Ok(())
    }

    /// The batch this lease is renewed in: automatic renewals of leases that return the same
    /// [`Renewer`] (the same `Arc`, e.g. one per server connection or pool) and fall due at
    /// the same watchdog tick go to the server together, in one [`Renewer::renew_many`] call
    /// per [`Renewer::max_batch`] leases. Called once, when the guard is created. `None` (the
    /// default): each lease is renewed by its own [`renew`](Self::renew).
    ///
    /// [`LockGuard::renew`](crate::LockGuard::renew) (an explicit renewal) always uses
    /// [`renew`](Self::renew).
    fn renewer(&self) -> Option<Arc<dyn Renewer>> {
        None
    }
}

/// One lease of a batched renewal, and the ttl to renew it to.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct RenewItem<'a> {
    /// The lease, created by the backend whose [`Renewer`] receives it; get the backend's own
    /// type back with [`downcast_lease`].
    pub lease: &'a dyn Lease,
    /// Its new lease length, from now.
    pub ttl: Duration,
}

impl<'a> RenewItem<'a> {
    /// `lease`, to be renewed to `ttl` from now.
    pub fn new(lease: &'a dyn Lease, ttl: Duration) -> Self {
        Self { lease, ttl }
    }
}

/// Renews many leases of one backend in as few server requests as the protocol allows (one
/// script call, one statement, one `multi`): what a client's watchdog uses instead of one
/// [`Lease::renew`] per lock, so that holding thousands of locks costs a few requests per
/// renewal tick, not thousands. Returned by [`Lease::renewer`].
#[async_trait]
pub trait Renewer: Send + Sync + Debug + 'static {
    /// The most leases one [`renew_many`](Self::renew_many) call takes; the core splits larger
    /// batches (each part is one call, run concurrently).
    fn max_batch(&self) -> usize {
        DEFAULT_MAX_BATCH
    }

    /// Renews every lease to its ttl from now, each exactly as [`Lease::renew`] would: only if
    /// its owner still holds it, atomically on the server, per lease (one lease refused does
    /// not stop the others).
    ///
    /// Cancel safety: the core may drop the future at any await point (operation timeout);
    /// a renewal then counts as unanswered for every lease of the batch.
    ///
    /// # Errors
    /// `Ok` holds one result per item, in the order given: `Ok(())`, or
    /// [`Error::NotHeld`](crate::Error::NotHeld) for a lock that is no longer the owner's, or
    /// another error for that lease alone. `Err` when the request failed as a whole (no answer,
    /// a transport error): every lease of the batch then counts as unanswered, as a failed
    /// [`Lease::renew`] does, and is retried until its local deadline.
    async fn renew_many(&self, items: &[RenewItem<'_>]) -> Result<Vec<Result<()>>>;
}

/// [`Renewer::max_batch`] unless a backend says otherwise.
pub const DEFAULT_MAX_BATCH: usize = 256;

/// The backend's own lease type behind `lease`, for a [`Renewer`]: `None` if `lease` is of
/// another type (a renewer should answer that item with an error rather than panic).
pub fn downcast_lease<L: Lease>(lease: &dyn Lease) -> Option<&L> {
    let any: &dyn Any = lease;
    any.downcast_ref::<L>()
}

/// What [`LockBackend::inspect`] (and, per name, [`LockBackend::list`]) can tell about a lock.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockInfo {
    /// The holder's owner value.
    pub owner: String,
    /// The holder's fencing token, if the backend can tell.
    pub token: Option<FencingToken>,
    /// The remaining lease, if the backend can tell.
    pub remaining: Option<Duration>,
    /// How it is held. For shared and permit holds, `owner`, `token` and `remaining` are those
    /// of the latest holder (the highest token) and [`holders`](Self::holders) counts them.
    pub kind: LockKind,
    /// How many hold it (1 for an exclusive hold).
    pub holders: u32,
    /// The data stored with the hold shown (see [`Lease::set_data`]), if any.
    pub data: Option<String>,
}

impl LockInfo {
    /// Describes an exclusively held lock.
    pub fn new(owner: String, token: Option<FencingToken>, remaining: Option<Duration>) -> Self {
        Self {
            owner,
            token,
            remaining,
            kind: LockKind::Exclusive,
            holders: 1,
            data: None,
        }
    }

    /// Adds the data stored with the hold shown.
    #[must_use]
    pub fn with_data(mut self, data: Option<String>) -> Self {
        self.data = data;
        self
    }

    /// Says the lock is held as `kind` by `holders` holders.
    #[must_use]
    pub fn with_holders(mut self, kind: LockKind, holders: u32) -> Self {
        self.kind = kind;
        self.holders = holders;
        self
    }
}

/// For a [`LockBackend::list`] that finds candidate names first (keys, nodes): inspects each
/// in the given order, as [`LockBackend::inspect`] would, and keeps the held ones, at most
/// `limit`.
///
/// # Errors
/// The first error of an inspection.
pub async fn held_among<B, I>(
    backend: &B,
    names: I,
    limit: usize,
) -> Result<Vec<(LockName, LockInfo)>>
where
    B: LockBackend + ?Sized,
    I: IntoIterator<Item = LockName>,
    I::IntoIter: Send,
{
    let mut held = Vec::new();
    for name in names {
        if held.len() >= limit {
            break;
        }
        if let Some(info) = backend.inspect(&name).await? {
            held.push((name, info));
        }
    }
    Ok(held)
}

/// Locks `mutex`, also after a thread panicked while holding it: the shared state of a lock
/// client (maps of waiters, deadlines, sessions) stays valid across a panic, and one panicking
/// task must not take the client down with it. For backends and the core alike.
pub fn unpoisoned<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub use percent_encoding::{AsciiSet, NON_ALPHANUMERIC};

/// Escapes a lock name (or an owner) into one key segment or node name: every byte in `set`
/// and every non-ASCII byte becomes `%XX` (upper-case hex). With a `set` that contains `%` (as
/// [`NON_ALPHANUMERIC`] and every set made from it does) the mapping is injective, so distinct
/// names never share a key; [`unescape_name`] reverses it.
///
/// ```
/// use distlock_core::backend::{NON_ALPHANUMERIC, escape_name, unescape_name};
///
/// const KEY: &distlock_core::backend::AsciiSet = &NON_ALPHANUMERIC.remove(b'-');
/// assert_eq!(escape_name("jobs/nightly-2", KEY), "jobs%2Fnightly-2");
/// assert_eq!(unescape_name("jobs%2Fnightly-2").as_deref(), Some("jobs/nightly-2"));
/// ```
pub fn escape_name(name: &str, set: &'static AsciiSet) -> String {
    percent_encoding::utf8_percent_encode(name, set).to_string()
}

/// Reverses [`escape_name`]; `None` unless every `%` is followed by two hex digits and the
/// result is UTF-8 (a key or node this crate did not write).
pub fn unescape_name(escaped: &str) -> Option<String> {
    let bytes = escaped.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = escaped.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}
