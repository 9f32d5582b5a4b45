//! What is measured: a labelled client factory and an optional raw floor.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use distlock_core::memory::MemoryStore;
use distlock_core::{DistributedLock, Error};
use futures::future::BoxFuture;

use crate::ServerCounter;

/// The future a [`Target`]'s client factory returns.
pub type ClientFuture = BoxFuture<'static, Result<Arc<dyn DistributedLock>, Error>>;

/// The future a [`Target`]'s floor factory returns.
pub type FloorFuture = BoxFuture<'static, Result<Box<dyn RawFloor>, Error>>;

/// The future a [`Target`]'s contended floor factory returns.
pub type ContendedFloorFuture = BoxFuture<'static, Result<Box<dyn ContendedFloor>, Error>>;

type ClientFactory = Box<dyn Fn() -> ClientFuture + Send + Sync>;
type FloorFactory = Box<dyn Fn() -> FloorFuture + Send + Sync>;
type ContendedFloorFactory = Box<dyn Fn() -> ContendedFloorFuture + Send + Sync>;
type CounterFactory = Box<dyn Fn() -> ServerCounterFuture + Send + Sync>;

/// What an optional factory makes, if there is one.
async fn made<T>(
    factory: Option<&(dyn Fn() -> BoxFuture<'static, Result<T, Error>> + Send + Sync)>,
) -> Result<Option<T>, Error> {
    match factory {
        Some(make) => make().await.map(Some),
        None => Ok(None),
    }
}

/// The future a [`Target`]'s server counter factory returns.
pub type ServerCounterFuture = BoxFuture<'static, Result<Box<dyn ServerCounter>, Error>>;

/// The cheapest correct lock a backend's server allows, without any of distlock's machinery:
/// what one acquire + release costs at minimum.
///
/// [`cycle`](Self::cycle) makes the minimum server round trips a correct lock needs, e.g. for
/// Redis `SET name owner NX PX ttl` followed by an `EVALSHA` compare-and-delete; for SQL an
/// insert and an owner-checked delete. The harness runs it with the same loop as S1 (same
/// warm-up, same cycle count, one connection) and reports every scenario's throughput as a
/// ratio to it.
///
/// ```
/// use async_trait::async_trait;
/// use distlock_bench::RawFloor;
///
/// /// Costs nothing: measures the harness itself.
/// #[derive(Debug)]
/// struct Nothing;
///
/// #[async_trait]
/// impl RawFloor for Nothing {
///     fn label(&self) -> &str {
///         "no-op"
///     }
///
///     async fn cycle(&mut self, _name: &str) -> Result<(), distlock_core::Error> {
///         Ok(())
///     }
/// }
/// ```
#[async_trait]
pub trait RawFloor: Send + fmt::Debug {
    /// What the cycle does, for the report, e.g. `"SET NX PX + EVALSHA del"`.
    fn label(&self) -> &str;

    /// One acquire + release of `name`, with the fewest round trips a correct lock needs.
    ///
    /// # Errors
    /// Whatever the server answered; the floor measurement stops at the first error.
    async fn cycle(&mut self, name: &str) -> Result<(), Error>;

    /// Why S1 and S2 cannot be compared with this floor, if so: its cycle costs what something
    /// other than its work decides, and decides anew for S1's own connection (SQLite's
    /// per-connection thread, see `distlock_sql::bench`). The harness then runs S1 and S2
    /// without a floor, and the report gives this reason in its place
    /// ([`TargetResult::no_floor`](crate::TargetResult::no_floor)). `None`, the default: a
    /// floor to compare with.
    fn unfit(&self) -> Option<&str> {
        None
    }
}

/// The server's own blocking lock, without any of distlock's machinery: what a contended
/// handoff costs at minimum. S2 runs the same loop on it first, with as many floors as
/// clients (each its own connection), so that S2's throughput and handoff latency are compared
/// with a floor measured on the same server, in the same run, under the same load.
///
/// Examples: MySQL's `GET_LOCK` / `RELEASE_LOCK`, PostgreSQL's `pg_advisory_lock` /
/// `pg_advisory_unlock`, etcd's Lock API, a ZooKeeper ephemeral node with an `exists` watch.
/// Such floors give up what distlock adds (fencing tokens, leases that outlive a connection,
/// renewal, loss reports, fairness where the server has none), so a ratio of 1 is the ceiling.
///
/// ```
/// use std::time::Duration;
/// use async_trait::async_trait;
/// use distlock_bench::ContendedFloor;
///
/// /// A process-local floor: a tokio mutex shared by every floor of one run.
/// #[derive(Debug)]
/// struct Local(std::sync::Arc<tokio::sync::Mutex<()>>, Option<tokio::sync::OwnedMutexGuard<()>>);
///
/// #[async_trait]
/// impl ContendedFloor for Local {
///     fn label(&self) -> &str {
///         "tokio mutex"
///     }
///
///     async fn acquire(&mut self, _name: &str, _wait: Duration) -> Result<(), distlock_core::Error> {
///         self.1 = Some(self.0.clone().lock_owned().await);
///         Ok(())
///     }
///
///     async fn release(&mut self, _name: &str) -> Result<(), distlock_core::Error> {
///         self.1 = None;
///         Ok(())
///     }
/// }
/// ```
#[async_trait]
pub trait ContendedFloor: Send + fmt::Debug {
    /// What the floor does, for the report, e.g. `"GET_LOCK + RELEASE_LOCK"`.
    fn label(&self) -> &str;

    /// Blocks until `name` is held by this floor, at most `wait`.
    ///
    /// # Errors
    /// Whatever the server answered, or [`Error::Timeout`] past `wait`; the contended floor
    /// stops at the first error.
    async fn acquire(&mut self, name: &str, wait: Duration) -> Result<(), Error>;

    /// Releases `name`, held by this floor.
    ///
    /// # Errors
    /// Whatever the server answered.
    async fn release(&mut self, name: &str) -> Result<(), Error>;

    /// Whether the server's lock also has shared (read) holds, [`Self::acquire_shared`]:
    /// the read/write mix then runs on the floors too, just before distlock's. Default
    /// `false`.
    fn has_shared(&self) -> bool {
        false
    }

    /// Blocks until `name` is held shared by this floor (with the other shared holders, never
    /// with an exclusive one), at most `wait`.
    ///
    /// # Errors
    /// Whatever the server answered, or [`Error::Timeout`] past `wait`;
    /// [`Error::Unsupported`] by default (see [`Self::has_shared`]).
    async fn acquire_shared(&mut self, name: &str, wait: Duration) -> Result<(), Error> {
        let _ = (name, wait);
        Err(Error::Unsupported(format!(
            "the contended floor {:?} has no shared holds",
            self.label()
        )))
    }

    /// Releases the shared hold of `name` this floor holds.
    ///
    /// # Errors
    /// Whatever the server answered; [`Error::Unsupported`] by default.
    async fn release_shared(&mut self, name: &str) -> Result<(), Error> {
        let _ = name;
        Err(Error::Unsupported(format!(
            "the contended floor {:?} has no shared holds",
            self.label()
        )))
    }
}

/// One backend configuration to measure: a label, a factory of independent clients and an
/// optional raw floor.
///
/// Every call of the client factory must return a new, independent client (its own
/// connection or session), because S2's contending clients each call it once.
///
/// ```
/// use distlock_bench::Target;
/// use distlock_core::memory::MemoryStore;
///
/// let store = MemoryStore::new();
/// let target = Target::new("memory", move || {
///     let store = store.clone();
///     async move { Ok(store.client()) }
/// });
/// assert_eq!(target.label(), "memory");
/// assert!(!target.has_floor());
/// ```
pub struct Target {
    label: String,
    connect: ClientFactory,
    floor: Option<FloorFactory>,
    fenced_floor: Option<FloorFactory>,
    contended_floor: Option<ContendedFloorFactory>,
    fenced_contended_floor: Option<ContendedFloorFactory>,
    server_counter: Option<CounterFactory>,
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Target")
            .field("label", &self.label)
            .field("floor", &self.floor.is_some())
            .field("fenced_floor", &self.fenced_floor.is_some())
            .field("contended_floor", &self.contended_floor.is_some())
            .field(
                "fenced_contended_floor",
                &self.fenced_contended_floor.is_some(),
            )
            .field("server_counter", &self.server_counter.is_some())
            .finish_non_exhaustive()
    }
}

impl Target {
    /// A target named `label` whose clients come from `connect`.
    pub fn new<F, Fut>(label: impl Into<String>, connect: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Arc<dyn DistributedLock>, Error>> + Send + 'static,
    {
        Self {
            label: label.into(),
            connect: Box::new(move || Box::pin(connect())),
            floor: None,
            fenced_floor: None,
            contended_floor: None,
            fenced_contended_floor: None,
            server_counter: None,
        }
    }

    /// Registers the backend's raw floor; `floor` is called once per run and should open its
    /// own connection.
    #[must_use]
    pub fn with_floor<F, Fut>(mut self, floor: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Box<dyn RawFloor>, Error>> + Send + 'static,
    {
        self.floor = Some(Box::new(move || Box::pin(floor())));
        self
    }

    /// Registers a second raw floor that also hands out fencing tokens (the least a lock with
    /// tokens sends), measured in the same run as S1 and the plain floor, interleaved with
    /// both: [`S1Result::fenced_floor_ratio`](crate::S1Result::fenced_floor_ratio). `floor` is
    /// called once per run and should open its own connection.
    #[must_use]
    pub fn with_fenced_floor<F, Fut>(mut self, floor: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Box<dyn RawFloor>, Error>> + Send + 'static,
    {
        self.fenced_floor = Some(Box::new(move || Box::pin(floor())));
        self
    }

    /// Registers a second contended floor that also commits a fencing token per critical
    /// section, run right after the plain one and before S2:
    /// [`S2Result::fenced_contended_floor_ratio`](crate::S2Result::fenced_contended_floor_ratio).
    /// `floor` is called once per contending client and should open its own connection.
    #[must_use]
    pub fn with_fenced_contended_floor<F, Fut>(mut self, floor: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Box<dyn ContendedFloor>, Error>> + Send + 'static,
    {
        self.fenced_contended_floor = Some(Box::new(move || Box::pin(floor())));
        self
    }

    /// Registers the server's own blocking lock as S2's contended floor; `floor` is called once
    /// per contending client and should open its own connection.
    #[must_use]
    pub fn with_contended_floor<F, Fut>(mut self, floor: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Box<dyn ContendedFloor>, Error>> + Send + 'static,
    {
        self.contended_floor = Some(Box::new(move || Box::pin(floor())));
        self
    }

    /// Registers a reader of the server's own request counter, for the hold scenario; `counter`
    /// is called once per run and should open its own connection.
    #[must_use]
    pub fn with_server_counter<F, Fut>(mut self, counter: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Box<dyn ServerCounter>, Error>> + Send + 'static,
    {
        self.server_counter = Some(Box::new(move || Box::pin(counter())));
        self
    }

    /// A new server counter reader, if one is registered.
    ///
    /// # Errors
    /// The factory's error.
    pub async fn server_counter(&self) -> Result<Option<Box<dyn ServerCounter>>, Error> {
        made(self.server_counter.as_deref()).await
    }

    /// The in-memory backend: every client shares one fresh [`MemoryStore`]. Its floor is a
    /// mutex-protected map insert + owner-checked remove, so its ratio shows what the core
    /// machinery (validation, guard, watchdog task) costs on top of the bare data structure;
    /// its contended floor is one tokio read-write lock shared by all of a run's floors (one
    /// name), held exclusively in S2 and both ways in the read/write mix.
    pub fn memory() -> Self {
        let store = MemoryStore::new();
        Self::new("memory", move || {
            let store = store.clone();
            async move { Ok(store.client()) }
        })
        .with_floor(|| async { Ok(Box::new(MapFloor::default()) as Box<dyn RawFloor>) })
        .with_contended_floor({
            let lock = Arc::new(tokio::sync::RwLock::new(()));
            move || {
                let floor = RwFloor {
                    lock: lock.clone(),
                    held: None,
                };
                async move { Ok(Box::new(floor) as Box<dyn ContendedFloor>) }
            }
        })
    }

    /// The label, as shown in reports.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// Whether a raw floor is registered.
    pub fn has_floor(&self) -> bool {
        self.floor.is_some()
    }

    /// A new independent client.
    ///
    /// # Errors
    /// The factory's error (e.g. the server is unreachable).
    pub async fn connect(&self) -> Result<Arc<dyn DistributedLock>, Error> {
        (self.connect)().await
    }

    /// Whether a server counter reader is registered.
    pub fn has_server_counter(&self) -> bool {
        self.server_counter.is_some()
    }

    /// Whether a contended floor is registered.
    pub fn has_contended_floor(&self) -> bool {
        self.contended_floor.is_some()
    }

    /// A new contended floor (its own connection), if one is registered.
    ///
    /// # Errors
    /// The factory's error.
    pub async fn contended_floor(&self) -> Result<Option<Box<dyn ContendedFloor>>, Error> {
        made(self.contended_floor.as_deref()).await
    }

    /// A new raw floor, if one is registered.
    ///
    /// # Errors
    /// The factory's error.
    pub async fn floor(&self) -> Result<Option<Box<dyn RawFloor>>, Error> {
        made(self.floor.as_deref()).await
    }

    /// A new fenced raw floor ([`Self::with_fenced_floor`]), if one is registered.
    ///
    /// # Errors
    /// The factory's error.
    pub async fn fenced_floor(&self) -> Result<Option<Box<dyn RawFloor>>, Error> {
        made(self.fenced_floor.as_deref()).await
    }

    /// Whether a fenced contended floor is registered.
    pub fn has_fenced_contended_floor(&self) -> bool {
        self.fenced_contended_floor.is_some()
    }

    /// A new fenced contended floor ([`Self::with_fenced_contended_floor`]), if one is
    /// registered.
    ///
    /// # Errors
    /// The factory's error.
    pub async fn fenced_contended_floor(&self) -> Result<Option<Box<dyn ContendedFloor>>, Error> {
        made(self.fenced_contended_floor.as_deref()).await
    }
}

/// The in-memory floor: a lock as a map entry behind a mutex.
#[derive(Debug, Default)]
struct MapFloor {
    map: Mutex<HashMap<String, u64>>,
    next: u64,
}

#[async_trait]
impl RawFloor for MapFloor {
    fn label(&self) -> &str {
        "mutex map insert + remove"
    }

    async fn cycle(&mut self, name: &str) -> Result<(), Error> {
        self.next += 1;
        let owner = self.next;
        {
            let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
            if map.contains_key(name) {
                return Err(Error::Backend {
                    message: format!("{name:?} is already held"),
                    source: None,
                });
            }
            map.insert(name.to_owned(), owner);
        }
        let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        match map.get(name) {
            Some(held) if *held == owner => {
                map.remove(name);
                Ok(())
            }
            _ => Err(Error::NotHeld {
                name: name.to_owned(),
            }),
        }
    }
}

/// The in-memory contended floor: a fair tokio read-write lock, shared by every floor of the
/// target (which contends on one name only).
#[derive(Debug)]
struct RwFloor {
    lock: Arc<tokio::sync::RwLock<()>>,
    held: Option<RwHeld>,
}

/// What an in-memory floor holds.
#[derive(Debug)]
enum RwHeld {
    Write(#[allow(dead_code, reason = "held, not read")] tokio::sync::OwnedRwLockWriteGuard<()>),
    Read(#[allow(dead_code, reason = "held, not read")] tokio::sync::OwnedRwLockReadGuard<()>),
}

impl RwFloor {
    /// Waits at most `wait` for `hold`, then keeps what it gives.
    async fn enter<F: Future<Output = RwHeld>>(
        &mut self,
        name: &str,
        wait: Duration,
        hold: F,
    ) -> Result<(), Error> {
        let held = tokio::time::timeout(wait, hold)
            .await
            .map_err(|_| Error::Timeout {
                name: name.to_owned(),
                waited: wait,
            })?;
        self.held = Some(held);
        Ok(())
    }

    /// Gives up what it holds, if it is what `shared` says.
    fn leave(&mut self, name: &str, shared: bool) -> Result<(), Error> {
        match self.held.take() {
            Some(RwHeld::Read(_)) if shared => Ok(()),
            Some(RwHeld::Write(_)) if !shared => Ok(()),
            other => {
                self.held = other;
                Err(Error::NotHeld {
                    name: name.to_owned(),
                })
            }
        }
    }
}

#[async_trait]
impl ContendedFloor for RwFloor {
    fn label(&self) -> &str {
        "tokio rwlock"
    }

    async fn acquire(&mut self, name: &str, wait: Duration) -> Result<(), Error> {
        let lock = self.lock.clone();
        self.enter(name, wait, async {
            RwHeld::Write(lock.write_owned().await)
        })
        .await
    }

    async fn release(&mut self, name: &str) -> Result<(), Error> {
        self.leave(name, false)
    }

    fn has_shared(&self) -> bool {
        true
    }

    async fn acquire_shared(&mut self, name: &str, wait: Duration) -> Result<(), Error> {
        let lock = self.lock.clone();
        self.enter(name, wait, async { RwHeld::Read(lock.read_owned().await) })
            .await
    }

    async fn release_shared(&mut self, name: &str) -> Result<(), Error> {
        self.leave(name, true)
    }
}
