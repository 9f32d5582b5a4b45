//! Upgradeable read-write locks: a reader that may become the writer with no other writer in
//! between, and a writer that may become a reader the same way.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::{
    AcquireOptions, DistributedLock, Error, FencingToken, LockGuard, LockKind, LockName,
    LossReason, MultiGuard, Result,
};

/// What an [`UpgradeableRwLock`] appends to its name for its gate.
pub const GATE_SUFFIX: &str = "#upgrade";

/// An upgradeable read-write lock (DistributedLock's `UpgradeableReaderWriterLock`): plain
/// readers, writers, and at most one **upgradeable reader** at a time, which reads alongside
/// the plain readers and may later [`upgrade`](UpgradeableGuard::upgrade) to the writer with
/// no other writer in between; a writer may [`downgrade`](WriteGuard::downgrade) to a reader
/// the same way.
///
/// Built on any backend with read-write locks ([`Capabilities::shared`](crate::Capabilities::shared))
/// from two locks: the read-write lock `name` itself, and its exclusive **gate**
/// `name#upgrade`. Writers and upgradeable readers take the gate first and keep it, so
/// - upgradeable readers exclude each other (one gate), and writers (a reader's share of
///   `name` keeps them out), and share `name` with plain readers;
/// - an upgrade lets go of its share of `name` and waits for the write side; the readers in
///   `name` finish, no writer can come in between (it would need the gate), and the new write
///   hold has a larger [fencing token](FencingToken) than every hold before it, the
///   upgrader's read included. Two upgrades never deadlock: there is one gate.
///
/// Every writer of `name` must go through this type ([`write`](Self::write)): a plain
/// [`acquire`](DistributedLock::acquire) of `name` skips the gate, and is still excluded from
/// every reader and writer, but may come between an upgrader's read and its write. The gate's
/// name `name#upgrade` is reserved for this lock.
///
/// Each part renews itself; a guard is lost when either part is. A wait for the name under
/// the gate (a writer's, the upgradeable reader's, an upgrade's, a downgrade's) ends with
/// [`Error::Lost`] as soon as the gate is lost (its local deadline passed while the waiter
/// was paused or cut off: another writer may have the gate by now), leaving nothing behind;
/// a hold of the name granted after that is released, never handed out.
///
/// ```
/// # async fn demo() -> Result<(), distlock_core::Error> {
/// use std::time::Duration;
/// use distlock_core::{AcquireOptions, UpgradeableRwLock, memory::MemoryStore};
///
/// let store = MemoryStore::new();
/// let rw = UpgradeableRwLock::new(store.client(), "config")?;
/// let opts = AcquireOptions::default().with_ttl(Duration::from_secs(10));
/// let reader = rw.read(&opts).await?;
/// let maybe_writer = rw.upgradeable(&opts).await?;
/// // Nobody else may become the writer now; a plain reader may still read.
/// assert!(rw.try_upgradeable(&opts).await?.is_none());
/// let read_token = maybe_writer.token();
/// reader.release().await?;
/// let writer = maybe_writer
///     .upgrade(Some(Duration::from_secs(5)))
///     .await
///     .map_err(|failed| failed.error)?;
/// assert!(writer.token() > read_token);
/// let reader = writer.downgrade().await?;
/// reader.release().await?;
/// # Ok(()) }
/// # tokio::runtime::Runtime::new().unwrap().block_on(demo()).unwrap();
/// ```
#[derive(Clone, Debug)]
pub struct UpgradeableRwLock {
    locks: Arc<dyn DistributedLock>,
    name: LockName,
    gate: LockName,
}

impl UpgradeableRwLock {
    /// The upgradeable read-write lock `name` on `locks`.
    ///
    /// # Errors
    /// [`Error::InvalidName`] for a name that is invalid, or too long for its gate
    /// (at most [`LockName::MAX_LEN`] minus the length of [`GATE_SUFFIX`] bytes);
    /// [`Error::Unsupported`] when the backend has no read-write locks.
    pub fn new(locks: Arc<dyn DistributedLock>, name: &str) -> Result<Self> {
        let name = LockName::new(name)?;
        let gate = LockName::new(format!("{name}{GATE_SUFFIX}")).map_err(|_| {
            Error::InvalidName {
                name: name.as_str().chars().take(64).collect(),
                reason: format!(
                    "an upgradeable lock's name is at most {} bytes (its gate appends {GATE_SUFFIX:?})",
                    LockName::MAX_LEN - GATE_SUFFIX.len()
                ),
            }
        })?;
        if !locks.capabilities().shared {
            return Err(Error::Unsupported(format!(
                "upgradeable read-write locks on {}: it has no read-write locks",
                locks.backend()
            )));
        }
        Ok(Self { locks, name, gate })
    }

    /// The read-write lock's name.
    pub fn name(&self) -> &LockName {
        &self.name
    }

    /// The gate's name (`name#upgrade`), held by the writer and the upgradeable reader.
    pub fn gate(&self) -> &LockName {
        &self.gate
    }

    /// Waits for a plain read hold: a shared hold of `name`, as
    /// [`acquire`](DistributedLock::acquire) with [`LockKind::Shared`] (`options.kind` is
    /// ignored). It shares the lock with the other readers and the upgradeable reader.
    ///
    /// # Errors
    /// As [`acquire`](DistributedLock::acquire).
    pub async fn read(&self, options: &AcquireOptions) -> Result<LockGuard> {
        self.locks
            .acquire(self.name.as_str(), &part(options, LockKind::Shared))
            .await
    }

    /// [`read`](Self::read) if it can be had now (`Ok(None)`: a writer holds or waits).
    ///
    /// # Errors
    /// As [`try_acquire`](DistributedLock::try_acquire).
    pub async fn try_read(&self, options: &AcquireOptions) -> Result<Option<LockGuard>> {
        self.locks
            .try_acquire(self.name.as_str(), &part(options, LockKind::Shared))
            .await
    }

    /// Waits for the upgradeable read hold: the gate, then a shared hold of `name`, within
    /// `options.wait` in all. `options.kind` and `options.owner` are ignored (never
    /// reentrant); `options.data` is stored with the read hold.
    ///
    /// Cancel safe: dropping the future releases what it took so far in the background.
    ///
    /// # Errors
    /// As [`acquire`](DistributedLock::acquire); the gate is released first.
    pub async fn upgradeable(&self, options: &AcquireOptions) -> Result<UpgradeableGuard> {
        let started = Instant::now();
        match self.take(LockKind::Shared, options, true).await? {
            Some((gate, read)) => Ok(UpgradeableGuard::new(
                self.locks.clone(),
                options,
                gate,
                read,
            )),
            None => Err(self.timed_out(started)),
        }
    }

    /// [`upgradeable`](Self::upgradeable) if it can be had now (`Ok(None)`: another
    /// upgradeable reader or a writer holds the gate, or a writer holds or waits for `name`).
    ///
    /// # Errors
    /// As [`try_acquire`](DistributedLock::try_acquire).
    pub async fn try_upgradeable(
        &self,
        options: &AcquireOptions,
    ) -> Result<Option<UpgradeableGuard>> {
        Ok(self
            .take(LockKind::Shared, options, false)
            .await?
            .map(|(gate, read)| UpgradeableGuard::new(self.locks.clone(), options, gate, read)))
    }

    /// Waits for the write hold: the gate, then the exclusive hold of `name`, within
    /// `options.wait` in all. Its [`token`](WriteGuard::token) is the exclusive hold's.
    /// `options.kind` and `options.owner` are ignored.
    ///
    /// Cancel safe, as [`upgradeable`](Self::upgradeable).
    ///
    /// # Errors
    /// As [`acquire`](DistributedLock::acquire); the gate is released first.
    pub async fn write(&self, options: &AcquireOptions) -> Result<WriteGuard> {
        let started = Instant::now();
        match self.take(LockKind::Exclusive, options, true).await? {
            Some((gate, write)) => Ok(WriteGuard::new(self.locks.clone(), options, gate, write)),
            None => Err(self.timed_out(started)),
        }
    }

    /// [`write`](Self::write) if it can be had now (`Ok(None)`: held by somebody).
    ///
    /// # Errors
    /// As [`try_acquire`](DistributedLock::try_acquire).
    pub async fn try_write(&self, options: &AcquireOptions) -> Result<Option<WriteGuard>> {
        Ok(self
            .take(LockKind::Exclusive, options, false)
            .await?
            .map(|(gate, write)| WriteGuard::new(self.locks.clone(), options, gate, write)))
    }

    /// A wait begun at `started` that ended without the lock (a waiting acquisition never
    /// does: it gets the lock or an error).
    fn timed_out(&self, started: Instant) -> Error {
        Error::Timeout {
            name: self.name.to_string(),
            waited: started.elapsed(),
        }
    }

    /// The gate, then `name` as `kind`: both, or (`Ok(None)`, a try only) neither.
    async fn take(
        &self,
        kind: LockKind,
        options: &AcquireOptions,
        wait: bool,
    ) -> Result<Option<(LockGuard, LockGuard)>> {
        let started = Instant::now();
        let gate_options = AcquireOptions {
            data: None,
            ..part(options, LockKind::Exclusive)
        };
        let gate = if wait {
            self.locks
                .acquire(self.gate.as_str(), &gate_options)
                .await?
        } else {
            match self
                .locks
                .try_acquire(self.gate.as_str(), &gate_options)
                .await?
            {
                Some(gate) => gate,
                None => return Ok(None),
            }
        };
        let mut options = part(options, kind);
        options.wait = options.wait.map(|w| w.saturating_sub(started.elapsed()));
        let name = self.name.as_str();
        let taken = if wait {
            under_gate(&gate, self.locks.acquire(name, &options))
                .await
                .map(Some)
        } else {
            under_gate(&gate, self.locks.try_acquire(name, &options)).await
        };
        match taken {
            // A gate that lapsed while this waited (a pause, a partition) may be another
            // writer's by now: the hold of the name alone is not handed out.
            Ok(Some(held)) => match gate_held(&gate) {
                Ok(()) => Ok(Some((gate, held))),
                Err(error) => {
                    let _ = pair(held, gate).release().await;
                    Err(error)
                }
            },
            other => {
                let _ = gate.release().await;
                other.map(|_| None)
            }
        }
    }
}

/// `options` for one part: of `kind`, never reentrant.
fn part(options: &AcquireOptions, kind: LockKind) -> AcquireOptions {
    AcquireOptions {
        owner: None,
        kind,
        ..options.clone()
    }
}

/// How long restoring a hold (a read after a failed upgrade, after a downgrade) may wait:
/// nothing but a writer that skipped the gate can make it wait at all.
fn restore_wait(options: &AcquireOptions) -> Duration {
    options.ttl
}

/// `taking` (a part of the name, asked for while holding `gate`), unless the gate is lost
/// first: then [`Error::Lost`], and the dropped acquisition leaves nothing behind (as any
/// cancelled one). A writer cut off while it waits so gives up its place when its gate's
/// local deadline passes, instead of taking the name after another writer took the gate.
async fn under_gate<T>(gate: &LockGuard, taking: impl Future<Output = Result<T>>) -> Result<T> {
    let lost = gate.lost();
    tokio::select! {
        taken = taking => taken,
        reason = lost => Err(Error::Lost {
            name: gate.name().to_string(),
            reason,
        }),
    }
}

/// Whether the gate is certainly still ours now: nobody else can have held it meanwhile.
fn gate_held(gate: &LockGuard) -> std::result::Result<(), Error> {
    if gate.is_lost() || Instant::now() >= gate.valid_until() {
        return Err(Error::Lost {
            name: gate.name().to_string(),
            reason: gate.loss_reason().unwrap_or(LossReason::LeaseExpired),
        });
    }
    Ok(())
}

/// The two parts of a hold: the part of `name` and the gate (in name order, `name` first).
fn pair(held: LockGuard, gate: LockGuard) -> MultiGuard {
    MultiGuard::new(vec![held, gate])
}

/// The part of `name` and the gate of a [`pair`].
fn split(parts: MultiGuard) -> (LockGuard, LockGuard) {
    let mut parts = parts.into_guards().into_iter();
    match (parts.next(), parts.next()) {
        (Some(held), Some(gate)) => (held, gate),
        _ => unreachable!("a pair has two parts"),
    }
}

/// A hold of an [`UpgradeableRwLock`] that holds its gate: the upgradeable reader
/// ([`UpgradeableGuard`]: the gate and a shared hold of the name) or the writer
/// ([`WriteGuard`]: the gate and the exclusive hold of the name). Dropping it releases both
/// parts in the background, as dropping a [`LockGuard`] does.
pub struct GatedGuard<S> {
    locks: Arc<dyn DistributedLock>,
    options: AcquireOptions,
    /// The hold of the name, then the gate ([`pair`]).
    parts: MultiGuard,
    side: PhantomData<fn() -> S>,
}

/// The upgradeable read hold of an [`UpgradeableRwLock`].
pub type UpgradeableGuard = GatedGuard<Upgradeable>;

/// The write hold of an [`UpgradeableRwLock`].
pub type WriteGuard = GatedGuard<Write>;

/// The side of a [`GatedGuard`] that may upgrade: the upgradeable reader.
#[derive(Debug)]
pub enum Upgradeable {}

/// The side of a [`GatedGuard`] that may downgrade: the writer.
#[derive(Debug)]
pub enum Write {}

impl<S> GatedGuard<S> {
    fn new(
        locks: Arc<dyn DistributedLock>,
        options: &AcquireOptions,
        gate: LockGuard,
        held: LockGuard,
    ) -> Self {
        Self {
            locks,
            options: options.clone(),
            parts: pair(held, gate),
            side: PhantomData,
        }
    }

    /// The hold of the name: shared for the upgradeable reader, exclusive for the writer.
    pub fn guard(&self) -> &LockGuard {
        &self.parts.guards()[0]
    }

    /// The gate's hold.
    pub fn gate_guard(&self) -> &LockGuard {
        &self.parts.guards()[1]
    }

    /// The fencing token of the hold of the name: a reader's for the upgradeable reader, the
    /// writer's (pass it with every write) for the writer.
    pub fn token(&self) -> FencingToken {
        self.guard().token()
    }

    /// Until when both parts are certainly held.
    pub fn valid_until(&self) -> Instant {
        self.parts.valid_until()
    }

    /// Whether either part may be lost.
    pub fn is_lost(&self) -> bool {
        self.parts.is_lost()
    }

    /// Resolves when either part is lost, with its name and why. Cancel safe.
    pub fn lost(&self) -> impl Future<Output = (LockName, LossReason)> + Send + 'static {
        self.parts.lost()
    }

    /// [`LockGuard::hold_at_least`] for both parts at once, measured from the later of their
    /// acquisitions: the gate is taken first, perhaps long before the name (a writer waits
    /// for the readers there), and must not stop renewing before the name's minimum ends.
    /// Cancel safe, as that is.
    pub async fn hold_at_least(&self, minimum: Duration) {
        let (held, gate) = (self.guard(), self.gate_guard());
        let since = held.taken_at().max(gate.taken_at());
        let from = |part: &LockGuard| {
            minimum.saturating_add(since.saturating_duration_since(part.taken_at()))
        };
        tokio::join!(
            held.hold_at_least(from(held)),
            gate.hold_at_least(from(gate))
        );
    }

    /// Releases both parts.
    ///
    /// # Errors
    /// As [`MultiGuard::release`]: the first part's error; both are released nonetheless.
    pub async fn release(self) -> Result<()> {
        self.parts.release().await
    }
}

impl<S> fmt::Debug for GatedGuard<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GatedGuard")
            .field("parts", &self.parts)
            .finish_non_exhaustive()
    }
}

impl GatedGuard<Upgradeable> {
    /// Becomes the writer: lets go of the read hold, waits (up to `wait`; `None`: forever)
    /// for the write side of the name while the other readers finish, and checks that the
    /// gate was held throughout, so that no other writer came between this read and the
    /// write. The write hold's token is larger than the read's.
    ///
    /// Cancel safe in that dropping the future releases whatever it held (in the background):
    /// the upgradeable hold is then gone.
    ///
    /// # Errors
    /// An [`UpgradeError`] with the cause: [`Error::Timeout`] (or a backend error) while
    /// waiting for the write side, with the upgradeable hold given back in
    /// [`UpgradeError::guard`] (its read hold taken again: a new token; no writer can have
    /// written since the old one, the gate was held); [`Error::Lost`] when a part was or is
    /// found lost, with everything released.
    pub async fn upgrade(
        self,
        wait: Option<Duration>,
    ) -> std::result::Result<WriteGuard, UpgradeError> {
        let Self {
            locks,
            options,
            parts,
            ..
        } = self;
        let (read, gate) = split(parts);
        let name = read.name().clone();
        let failed = |error| UpgradeError {
            name: name.to_string(),
            error,
            guard: None,
        };
        if let Err(error) = gate_held(&gate).and(read.loss_reason().map_or(Ok(()), |reason| {
            Err(Error::Lost {
                name: name.to_string(),
                reason,
            })
        })) {
            let _ = pair(read, gate).release().await;
            return Err(failed(error));
        }
        if let Err(error) = read.release().await {
            let _ = gate.release().await;
            return Err(failed(error));
        }
        let write_options = AcquireOptions {
            wait,
            ..part(&options, LockKind::Exclusive)
        };
        match under_gate(&gate, locks.acquire(name.as_str(), &write_options)).await {
            Ok(write) => match gate_held(&gate) {
                Ok(()) => Ok(WriteGuard::new(locks, &options, gate, write)),
                Err(error) => {
                    let _ = pair(write, gate).release().await;
                    Err(failed(error))
                }
            },
            Err(error) => {
                let restore = AcquireOptions {
                    wait: Some(restore_wait(&options)),
                    ..part(&options, LockKind::Shared)
                };
                let guard = match under_gate(&gate, locks.acquire(name.as_str(), &restore)).await {
                    Ok(read) if gate_held(&gate).is_ok() => {
                        Some(Self::new(locks, &options, gate, read))
                    }
                    Ok(read) => {
                        let _ = pair(read, gate).release().await;
                        None
                    }
                    Err(_) => {
                        let _ = gate.release().await;
                        None
                    }
                };
                Err(UpgradeError {
                    guard,
                    ..failed(error)
                })
            }
        }
    }
}

/// An upgrade that did not happen: why, and the upgradeable hold when it could be kept.
#[derive(Debug, thiserror::Error)]
#[error("the upgrade of lock {name:?} failed")]
#[non_exhaustive]
pub struct UpgradeError {
    /// The lock's name.
    pub name: String,
    /// Why.
    #[source]
    pub error: Error,
    /// The upgradeable hold, still held (`None`: released).
    pub guard: Option<UpgradeableGuard>,
}

impl GatedGuard<Write> {
    /// Becomes a plain reader with no writer in between: lets go of the write side, takes a
    /// read hold while still holding the gate, then lets go of the gate. Readers waiting
    /// for the writer get in alongside. The read hold's token is larger than the write's.
    ///
    /// Cancel safe in that dropping the future releases whatever it held.
    ///
    /// # Errors
    /// [`Error::Lost`] when a part was or is found lost (another writer may have come in
    /// between), a backend error from the release or the read; everything is released then.
    pub async fn downgrade(self) -> Result<LockGuard> {
        let (read, gate) = self.down().await?;
        let _ = gate.release().await;
        Ok(read)
    }

    /// Becomes the upgradeable reader with no writer in between: as
    /// [`downgrade`](Self::downgrade), keeping the gate.
    ///
    /// # Errors
    /// As [`downgrade`](Self::downgrade).
    pub async fn downgrade_to_upgradeable(self) -> Result<UpgradeableGuard> {
        let (locks, options) = (self.locks.clone(), self.options.clone());
        let (read, gate) = self.down().await?;
        Ok(UpgradeableGuard::new(locks, &options, gate, read))
    }

    /// The write side let go of, a read hold taken under the gate: (read, gate).
    async fn down(self) -> Result<(LockGuard, LockGuard)> {
        let Self {
            locks,
            options,
            parts,
            ..
        } = self;
        let (write, gate) = split(parts);
        let name = write.name().clone();
        if let Err(error) = gate_held(&gate) {
            let _ = pair(write, gate).release().await;
            return Err(error);
        }
        if let Err(error) = write.release().await {
            let _ = gate.release().await;
            return Err(error);
        }
        let read_options = AcquireOptions {
            wait: Some(restore_wait(&options)),
            ..part(&options, LockKind::Shared)
        };
        match under_gate(&gate, locks.acquire(name.as_str(), &read_options)).await {
            Ok(read) => match gate_held(&gate) {
                Ok(()) => Ok((read, gate)),
                Err(error) => {
                    let _ = pair(read, gate).release().await;
                    Err(error)
                }
            },
            Err(error) => {
                let _ = gate.release().await;
                Err(error)
            }
        }
    }
}
