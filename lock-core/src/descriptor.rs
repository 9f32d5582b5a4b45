//! What a backend declares about itself, once: its name, its URL schemes, how to open a client,
//! and the facts that the tools around it need (the default port of its servers, whose clock
//! ends its leases). Each backend crate has one `Descriptor` per family of URL schemes; the
//! facade's registry (`distlock::backends`) lists them, and `connect`, the command line, its
//! benchmark and `distlock check` read them from there, so that no other place names a
//! backend.

use std::fmt;
use std::sync::Arc;

use futures::future::BoxFuture;

use crate::{ClientConfig, DistributedLock, Result};

/// Opens a client of one backend: the URL (one of its descriptor's schemes; the facade has
/// already resolved `password_file=`) and the client configuration, checked.
pub type ConnectFn =
    fn(String, ClientConfig) -> BoxFuture<'static, Result<Arc<dyn DistributedLock>>>;

/// One family of URL schemes of a backend, and what the tools need to know of it.
///
/// ```
/// use distlock_core::{Descriptor, memory};
///
/// let memory = &memory::DESCRIPTOR;
/// assert_eq!(memory.name(), "memory");
/// assert!(memory.serves("MEMORY"));
/// assert!(!memory.takes_password());
/// assert_eq!(memory.default_port(), None);
/// ```
#[derive(Clone, Copy)]
pub struct Descriptor {
    name: &'static str,
    schemes: &'static [&'static str],
    example: &'static str,
    connect: ConnectFn,
    default_port: Option<u16>,
    wall_clock_leases: bool,
    password: bool,
    announced: bool,
}

impl Descriptor {
    /// A backend called `name` (short, lower case: `redis-cluster`), reached by URLs of
    /// `schemes` (lower case; matched case-insensitively), shown to users as `example`, opened
    /// by `connect`. By default its servers have no default port, its leases end on its
    /// servers' wall clock and its URLs may carry a password.
    #[must_use]
    pub const fn new(
        name: &'static str,
        schemes: &'static [&'static str],
        example: &'static str,
        connect: ConnectFn,
    ) -> Self {
        Self {
            name,
            schemes,
            example,
            connect,
            default_port: None,
            wall_clock_leases: true,
            password: true,
            announced: false,
        }
    }

    /// The port of a host given without one in the URL.
    #[must_use]
    pub const fn with_default_port(mut self, port: u16) -> Self {
        self.default_port = Some(port);
        self
    }

    /// The backend's leases end on its servers' monotonic clock (etcd's lessor), which no
    /// wall clock step moves.
    #[must_use]
    pub const fn with_monotonic_leases(mut self) -> Self {
        self.wall_clock_leases = false;
        self
    }

    /// The backend's clients follow the addresses its servers announce (Redis Sentinel and
    /// Cluster): after the first contact they talk to hosts the URL does not name, so a proxy
    /// in front of the URL's hosts would not see their traffic.
    #[must_use]
    pub const fn with_announced_addresses(mut self) -> Self {
        self.announced = true;
        self
    }

    /// The backend takes no password (its URLs get no `password_file=` option).
    #[must_use]
    pub const fn without_password(mut self) -> Self {
        self.password = false;
        self
    }

    /// The backend's short name, e.g. `redis`.
    #[must_use]
    pub const fn name(&self) -> &'static str {
        self.name
    }

    /// Its URL schemes, lower case.
    #[must_use]
    pub const fn schemes(&self) -> &'static [&'static str] {
        self.schemes
    }

    /// An example URL, for help texts.
    #[must_use]
    pub const fn example(&self) -> &'static str {
        self.example
    }

    /// The port of a host given without one (`None`: no network server, e.g. SQLite).
    #[must_use]
    pub const fn default_port(&self) -> Option<u16> {
        self.default_port
    }

    /// Whether its leases end on its servers' wall clock, so that a step of that clock moves
    /// their ends: Redis (key expiry), SQL (the database's `now()`), ZooKeeper (a holder
    /// node's `mtime`). etcd's leases run on its monotonic clock.
    #[must_use]
    pub const fn wall_clock_leases(&self) -> bool {
        self.wall_clock_leases
    }

    /// Whether its clients follow the addresses its servers announce (see
    /// [`with_announced_addresses`](Self::with_announced_addresses)).
    #[must_use]
    pub const fn follows_announced_addresses(&self) -> bool {
        self.announced
    }

    /// Whether its URLs may carry a password (and so the `password_file=` option).
    #[must_use]
    pub const fn takes_password(&self) -> bool {
        self.password
    }

    /// Whether `scheme` (any case) is one of its URL schemes.
    #[must_use]
    pub fn serves(&self, scheme: &str) -> bool {
        self.schemes.iter().any(|s| s.eq_ignore_ascii_case(scheme))
    }

    /// Opens a client for `url` (see [`ConnectFn`]).
    ///
    /// # Errors
    /// The backend's: a malformed URL, an unreachable server, refused credentials.
    pub async fn connect(
        &self,
        url: impl Into<String>,
        config: ClientConfig,
    ) -> Result<Arc<dyn DistributedLock>> {
        (self.connect)(url.into(), config).await
    }
}

impl fmt::Debug for Descriptor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Descriptor")
            .field("name", &self.name)
            .field("schemes", &self.schemes)
            .field("default_port", &self.default_port)
            .field("wall_clock_leases", &self.wall_clock_leases)
            .field("password", &self.password)
            .field("announced", &self.announced)
            .finish_non_exhaustive()
    }
}
