//! What is measured: a labelled client factory and an optional raw floor.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use distlock_core::memory::MemoryStore;
use distlock_core::{DistributedLock, Error};
use futures::future::BoxFuture;

/// The future a [`Target`]'s client factory returns.
pub type ClientFuture = BoxFuture<'static, Result<Arc<dyn DistributedLock>, Error>>;

/// The future a [`Target`]'s floor factory returns.
pub type FloorFuture = BoxFuture<'static, Result<Box<dyn RawFloor>, Error>>;

type ClientFactory = Box<dyn Fn() -> ClientFuture + Send + Sync>;
type FloorFactory = Box<dyn Fn() -> FloorFuture + Send + Sync>;

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
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Target")
            .field("label", &self.label)
            .field("floor", &self.floor.is_some())
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

    /// The in-memory backend: every client shares one fresh [`MemoryStore`]. Its floor is a
    /// mutex-protected map insert + owner-checked remove, so its ratio shows what the core
    /// machinery (validation, guard, watchdog task) costs on top of the bare data structure.
    pub fn memory() -> Self {
        let store = MemoryStore::new();
        Self::new("memory", move || {
            let store = store.clone();
            async move { Ok(store.client()) }
        })
        .with_floor(|| async { Ok(Box::new(MapFloor::default()) as Box<dyn RawFloor>) })
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

    /// A new raw floor, if one is registered.
    ///
    /// # Errors
    /// The factory's error.
    pub async fn floor(&self) -> Result<Option<Box<dyn RawFloor>>, Error> {
        match &self.floor {
            Some(make) => make().await.map(Some),
            None => Ok(None),
        }
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
