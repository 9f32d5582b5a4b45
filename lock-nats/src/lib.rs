#![doc = include_str!("../README.md")]
//!
//! NATS JetStream backend for distlock: a fair (FIFO) lock in a JetStream key-value bucket,
//! ordered by the stream's sequence, with linearizable fencing tokens.
//!
//! ```no_run
//! # async fn demo() -> Result<(), distlock_nats::distlock_core::Error> {
//! use std::time::Duration;
//! use distlock_nats::distlock_core::{AcquireOptions, ClientConfig, DistributedLock};
//!
//! let client = distlock_nats::connect("nats://127.0.0.1:4222/myapp", ClientConfig::default()).await?;
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
//! **The bucket.** Locks live in a JetStream key-value bucket (stream `KV_<bucket>`, created
//! on first use with the URL's `replicas`): one message per key (no history), rollups,
//! per-message ttls with expiry markers, direct gets on a single server only (every read of
//! a replicated stream is its leader's), and the headers of every stored message
//! republished to `_distlock.<bucket>.>` for wake-ups. A server older than 2.11 (no
//! per-message ttls) is refused when connecting.
//!
//! **Keys.** A lock name is one subject token (every byte outside `[A-Za-z0-9_-]` written
//! `=XX`); every acquisition of the name, of any kind, is a key `<name>.<random tag>`
//! whose value is its kind, its first revision and its owner, written with a ttl (`Nats-TTL`,
//! whole seconds rounded **up**, so [`MIN_TTL`] is 1 s and the server never ends a lease
//! before the client's deadline).
//!
//! **Acquire** (`acquire`, may queue) creates the key (expected last revision 0), then reads
//! the name's range (every key, by the revision it was created at): the first revision is the
//! place in the queue and the fencing token, from the stream's sequence (strictly increasing
//! per bucket, linearizable on a replicated stream). An exclusive entry holds when it is first,
//! a shared one when only shared ones are before it, a permit of N when fewer than N are
//! before it; a semaphore asked with another N, or used as a lock, answers
//! [`Error::Mismatch`]. On a single server, a waiter's read, after its own key is written,
//! is one request: a batched direct get of every key's last message under the range
//! (`multi_last`, up to 1,024 keys). On a bucket that does not answer direct gets (one made by
//! an earlier version; set `allow_direct` on its stream to have them) or with more keys, it
//! asks the stream for the name's keys (its subjects under the range) and then for every
//! key's last message at once: two round trips whatever the number of keys. A walk of the
//! range, which reads one message per request in sequence order, is kept for reads that must
//! see the whole range as of one moment (`try_acquire`, observers) and for replicated
//! streams, whose answers may come from different states. A waiter subscribes to the name's
//! republished events before the read it waits by, and counts the removals (a purge, a ttl's
//! expiry marker) of the keys that read found ahead of it, each only if stored after the
//! revision it read (on a single server, where that read is one request, an attempt whose
//! client did not wait on the name within the last second reads first, unsubscribed: on a
//! free name or beside readers it holds at once, sent no event; should it have to wait, it
//! subscribes and reads again): it holds on the removal that lets it in, with no read
//! (nobody joins ahead of a queued entry). It renews its own key every third of its ttl while
//! it waits, so a crashed waiter leaves the queue after its ttl. `try_acquire` writes its key
//! only if the name's whole range is as it read it
//! (`Nats-Expected-Last-Subject-Sequence-Subject` on the range) and nobody waits, so it never
//! leaves a queue entry.
//!
//! **Renew** rewrites the key with a fresh ttl only if its revision is the one we wrote last
//! (compare-and-set); the value keeps the first revision, so the token and the place stay.
//! A refused write is checked: a key that is still ours at a newer revision (a renewal whose
//! answer was lost) is taken up, anything else answers `NotHeld`. The client's watchdog renews
//! its locks in batches, every write of a batch sent before the first answer is read.
//! **Release** purges the key if its revision is ours (the purge marker expires after 1 s).
//! While the client reconnects, a release (and an operator's removal) waits for the
//! connection (not for a replicated stream's leader) within the operation timeout; every
//! other request fails at once as `Unavailable`, and a renewal due then is not sent.
//!
//! # Guarantees and what they rest on
//!
//! | | |
//! |---|---|
//! | fencing | the stream sequence: [`Linearizable`](distlock_core::FencingGuarantee::Linearizable), greater after restarts (file storage keeps it; a bucket kept in memory is refused) |
//! | fairness | FIFO by first revision, for every kind; a waiting writer blocks later readers |
//! | wake-up | the server's republish of the name's removals (purges, expiry markers) |
//! | loss detection | renewal (our key gone or rewritten), and the core's local deadline |
//! | clock | leases end on the stream leader's **wall clock** (JetStream's message ttls): a server clock stepping forward ends leases early |
//! | failover | an R3 bucket survives the loss of one server; the client reconnects to the URL's other servers |

#![cfg_attr(docsrs, feature(doc_cfg))]

mod attempt;
mod backend;
#[cfg(feature = "bench")]
#[cfg_attr(docsrs, doc(cfg(feature = "bench")))]
pub mod bench;
mod config;
mod descriptor;
mod error;
mod keys;
mod kinds;
mod lease;
mod renew;
mod wake;

use distlock_core::{ClientConfig, Error, LockClient};

pub use async_nats;
pub use backend::{MAX_PERMITS, MAX_TTL, MIN_TTL, NatsBackend};
pub use config::{DEFAULT_BUCKET, DEFAULT_PORT, MAX_REPLICAS, NatsConfig};
pub use descriptor::NATS;
pub use distlock_core;

/// Connects to `url` (`nats://[user:password@]host1:port1,host2:port2[/bucket][?replicas=N]`,
/// or `tls://...?ca=PATH&cert=PATH&key=PATH` for TLS, see [`NatsConfig::from_url`]) and
/// returns a lock client.
///
/// Connecting authenticates, checks the server's version (2.11 or newer, JetStream on), and
/// opens the bucket (creating it when it does not exist), within `config`'s operation timeout.
///
/// # Errors
/// [`Error::InvalidConfig`] for a malformed URL or configuration, or a credentials file that
/// cannot be read; [`Error::Backend`] (not retryable) when the server refuses the credentials,
/// the TLS handshake fails, the server is too old or has no JetStream, or the bucket exists
/// with a configuration the locks cannot use; [`Error::Unavailable`] when no server answers in
/// time.
pub async fn connect(url: &str, config: ClientConfig) -> Result<LockClient<NatsBackend>, Error> {
    connect_with(NatsConfig::from_url(url)?, config).await
}

/// Like [`connect`], from a [`NatsConfig`].
///
/// # Errors
/// As [`connect`].
pub async fn connect_with(
    nats: NatsConfig,
    config: ClientConfig,
) -> Result<LockClient<NatsBackend>, Error> {
    config.validate()?;
    let backend = NatsBackend::connect(&nats, config.operation_timeout).await?;
    LockClient::with_config(backend, config)
}
