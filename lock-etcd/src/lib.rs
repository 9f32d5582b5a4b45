#![doc = include_str!("../README.md")]
//!
//! etcd backend for distlock: a fair (FIFO) lock ordered by etcd revisions, with
//! linearizable fencing tokens.
//!
//! ```no_run
//! # async fn demo() -> Result<(), distlock_etcd::distlock_core::Error> {
//! use std::time::Duration;
//! use distlock_etcd::distlock_core::{AcquireOptions, ClientConfig, DistributedLock};
//!
//! let client = distlock_etcd::connect("etcd://127.0.0.1:2379/myapp", ClientConfig::default()).await?;
//! let opts = AcquireOptions::default().with_ttl(Duration::from_secs(10));
//! let guard = client.acquire("invoices", &opts).await?;
//! // Pass guard.token() with every write to the protected resource.
//! println!("holding with fencing token {}", guard.token());
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! # Protocol
//!
//! **Keys.** A lock name maps to the key range `<prefix>/<escaped name>/`: every byte outside
//! `[A-Za-z0-9._-]` is percent-escaped (`%` included), so the escaped name never contains `/`
//! and no two names share a range (a name that is a prefix of another never sees its keys).
//! One acquisition is a key `<range><client tag>.<n>`, whose value is the owner, attached to
//! a lease: the tag is random per client and `n` the smallest number that no other live
//! attempt of the client uses on that name. Keys are reused because etcd keeps every deleted
//! key in its index until the next compaction and each queue read walks them: with a new key
//! per acquisition, a busy name got slower by about 0.5 µs per past acquisition until the
//! server compacted (an uncontended cycle went from 1.6 to 3.1 ms within 1750 acquisitions).
//! A number is reused only once its key is known to be deleted, so an attempt never mistakes
//! an earlier key for its own, and every delete after the put compares the `create_revision`.
//!
//! **Leases.** A client holds one etcd lease per distinct ttl (rounded **up** to whole seconds;
//! etcd raises anything below its minimum, 2 s with default heartbeat settings, so that is
//! [`MIN_TTL`]) and one keepalive stream per lease. Granting a lease is a raft round, as
//! expensive as the lock transaction itself, so a lease per guard would make acquire + release
//! three raft rounds instead of two; a shared lease makes it two (put, delete), the same as the
//! raw floor. Keepalives are not raft rounds (the leader answers them alone, ~70 us here), so
//! a lease that was not refreshed in the last tenth of its ttl is refreshed before it is used.
//! The client's watchdog renews its held locks together: per batch of up to 100 locks, one
//! keepalive per lease and one transaction that reads every batched key (each lock is held
//! while its lease lives and its key is still there with its create revision).
//!
//! **Acquire** (`acquire`, may queue) is one transaction: if our key does not exist
//! (`create_revision == 0`), read the name's newest key, then put ours. No earlier key: we
//! hold, and the fencing token is our key's `create_revision` (the transaction's revision).
//! Otherwise the key read is our predecessor: the attempt watches it (deletions only, from the
//! revision after the read, so no event is missed) and, when it goes, re-checks in one
//! transaction that our key is still ours and that no key with a lower `create_revision`
//! remains. Waiters are therefore served in `create_revision` order (FIFO) and each one watches
//! only its predecessor (no thundering herd). While queued, the attempt keeps the lease alive.
//! Watches are kept and reused: etcd starts a watch "from now" at the revision it read just
//! before registering it, and a write committed in between leaves the watch *unsynced*, fed
//! only by a catch-up loop that runs every 100 ms, so a watch opened per wait sometimes missed
//! a handoff by up to 100 ms under contention. A client keeps a watch idle for 2 s after its
//! wait; the next wait on the same key (in a busy queue, usually the same predecessor, whose
//! client reuses its key) takes it back, long since synced, and tells old events from new ones
//! by revision. Every watch of a client is a watch id on the client's one watch stream (a
//! stream per wait made a busy client open one per handoff): the stream is opened with the
//! first watch, and on a failure opened again with every live watch re-created from the
//! revision after the last one it was told about.
//! `try_acquire` is one transaction that puts the key only if the name's whole range is empty
//! (nobody holds or waits), so it never leaves a queue entry. An abandoned attempt (timeout,
//! cancellation, error) deletes its key, also one whose put answer was lost (same key).
//!
//! **Read-write locks and semaphores** use the same queue: every acquisition of a name, of
//! any kind, is a key in its range, ordered by `create_revision` (one counter per name, so
//! the fencing rule holds across kinds), and the key's name says its kind (`r.<tag>.<n>` for a
//! reader, `p<N>.<tag>.<n>` for a permit of N; a writer's key is the mutex's). A writer holds
//! when first, a reader when no writer key is before it (a waiting writer queues later readers
//! behind it), a permit when fewer than N keys, all permits of N, are before it. A semaphore
//! asked with another N, or used as a lock, answers [`Error::Mismatch`]. Each waiter watches
//! only what blocks it: a writer its predecessor; a reader the deletions of writer keys, and
//! a permit waiter those of the name's range, each counting the keys ahead of it that block
//! it, so that it starts holding on the deletion that frees it, without a read; the `kinds`
//! module's documentation has the interleavings. Semaphores go up to [`MAX_PERMITS`].
//!
//! **Renew** sends a keepalive for the lease and, concurrently, checks that our key still
//! exists with its `create_revision`: a lease answered with ttl 0, or a key that is gone or
//! re-created, answers [`Error::NotHeld`], which marks the guard lost. Keepalives of one lease
//! are coalesced (a renewal that started before a keepalive was sent is covered by it), and the
//! key checks of one client are batched: checks arriving while a batch is in flight go together
//! in the next read-only transaction (up to 100 keys each, group-commit style, so no delay when
//! idle). A client holding 1000 locks thus renews with a few keepalives and about a dozen
//! transactions per renewal round instead of 1000 reads. **Release** deletes our key if its
//! `create_revision` is still ours; nothing deleted answers `NotHeld`.
//!
//! **Failover.** The client balances over all endpoints. A request routed to a member that just
//! went down fails before the balancer skips that member, so acquire steps, key checks and
//! `inspect` (all safe to repeat: a repeated put finds its own key) are retried at once up to
//! four times (10-80 ms apart), and a release too (its delete compares our key's create
//! revision). A repeat of a release whose first answer was lost that finds the key gone cannot
//! tell from the key alone whether that first delete took it or the lock was lost before:
//! it asks whether the key's lease lives (a keepalive). Alive, the release counts as done (a
//! forced release in between cannot be told from ours); gone, the key went with it, and the
//! release answers `NotHeld`.
//!
//! **The reaper.** Because the lease is shared, a guard that stops renewing (renewal disabled,
//! hold limit reached, [`abandon`](distlock_core::LockGuard::abandon)) would stay held as long as
//! other guards of the same client keep the lease alive. Each held key therefore has a small
//! task that deletes it (if its `create_revision` is still ours) once its own ttl has passed
//! since its last successful renewal was sent. A crashed process stops every keepalive, and
//! the lease expires on the server after its ttl.
//!
//! # Guarantees and what they rest on
//!
//! | | |
//! |---|---|
//! | fencing | `create_revision`, from etcd's linearizable revision counter: [`Linearizable`](distlock_core::FencingGuarantee::Linearizable), greater after restarts (the data directory keeps it) |
//! | fairness | FIFO by `create_revision`, for every kind; a waiting writer blocks later readers |
//! | wake-up | a watch on the key(s) that block the waiter: a release wakes only the waiters it unblocks |
//! | loss detection | renewal (keepalive ttl 0 or our key gone), and the core's local deadline |
//! | failover | the client balances over all endpoints; a member going down is survived |
//!
//! Against etcd 3.4 and newer (no `RangeStream`, no API newer than 3.4 is used).

#![cfg_attr(docsrs, feature(doc_cfg))]

mod attempt;
mod backend;
#[cfg(feature = "bench")]
#[cfg_attr(docsrs, doc(cfg(feature = "bench")))]
pub mod bench;
mod checks;
mod config;
mod descriptor;
mod error;
mod keys;
mod kinds;
mod lease;
mod members;
mod renew;
mod session;
mod wake;
mod watcher;

use distlock_core::{ClientConfig, Error, LockClient};

pub use backend::{EtcdBackend, MAX_PERMITS, MAX_TTL, MIN_TTL};
pub use config::{DEFAULT_PORT, DEFAULT_PREFIX, EtcdConfig};
pub use descriptor::ETCD;
pub use distlock_core;
pub use etcd_client;

/// Connects to `url` (`etcd://[user:password@]host1:port1,host2:port2[/prefix]`, or
/// `etcds://...?ca=PATH&cert=PATH&key=PATH` for TLS, see [`EtcdConfig::from_url`]) and returns
/// a lock client.
///
/// Connecting authenticates (with a user) and checks that some endpoint answers, within
/// `config`'s operation timeout.
///
/// # Errors
/// [`Error::InvalidConfig`] for a malformed URL or configuration, or a TLS file that cannot be
/// read; [`Error::Backend`] (not retryable) when the server refuses the user or password, the
/// TLS handshake fails, or a plain client reaches a TLS port; [`Error::Unavailable`] when no
/// endpoint answers in time.
pub async fn connect(url: &str, config: ClientConfig) -> Result<LockClient<EtcdBackend>, Error> {
    connect_with(EtcdConfig::from_url(url)?, config).await
}

/// A lock client over the application's own [`etcd_client::Client`] (its endpoints, TLS,
/// user and token refresh stay the application's); `etcd` gives the key prefix and names the
/// endpoints in messages. Nothing is checked at once: a client that cannot reach its cluster
/// fails the first lock operation, as it would the application's own requests.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use distlock_etcd::EtcdConfig;
/// use distlock_etcd::distlock_core::{AcquireOptions, ClientConfig, DistributedLock};
/// use distlock_etcd::etcd_client::{Client, ConnectOptions};
///
/// let options = ConnectOptions::new().with_user("app", "secret").with_auto_token_refresh(true);
/// let app = Client::connect(["http://10.0.0.1:2379"], Some(options)).await?;
/// let etcd = EtcdConfig::new(["http://10.0.0.1:2379"])?.with_prefix("app/locks")?;
/// let locks = distlock_etcd::from_client(app.clone(), &etcd, ClientConfig::default())?;
/// let guard = locks.acquire("invoices", &AcquireOptions::default()).await?;
/// guard.release().await?;
/// # Ok(()) }
/// ```
///
/// # Errors
/// [`Error::InvalidConfig`] for an invalid `config`.
pub fn from_client(
    client: etcd_client::Client,
    etcd: &EtcdConfig,
    config: ClientConfig,
) -> Result<LockClient<EtcdBackend>, Error> {
    config.validate()?;
    LockClient::with_config(EtcdBackend::from_client(client, etcd), config)
}

/// Like [`connect`], from an [`EtcdConfig`] (e.g. an `http://` or `https://` endpoint list).
///
/// # Errors
/// As [`connect`].
pub async fn connect_with(
    etcd: EtcdConfig,
    config: ClientConfig,
) -> Result<LockClient<EtcdBackend>, Error> {
    config.validate()?;
    let backend = EtcdBackend::connect(&etcd, config.operation_timeout).await?;
    LockClient::with_config(backend, config)
}
