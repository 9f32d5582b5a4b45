#![doc = include_str!("../README.md")]
//!
//! The core of distlock: one [`DistributedLock`] trait for every backend, the shared machinery
//! behind it, and the in-memory backend.
//!
//! A distributed lock is a lease. It expires, because holders crash, so a holder must renew it
//! while it works, must learn the moment it may have lost it, and must pass a [`FencingToken`]
//! with every write so that the protected resource can refuse a late write from a paused former
//! holder. This crate does all of that once:
//!
//! - [`LockClient`] implements [`DistributedLock`] over any [`LockBackend`]: name and option
//!   validation, the wait loop (deadline, cancellation, jittered backoff, backend wake-ups),
//!   per-operation timeouts, explicit-owner reentrancy and `tracing` spans;
//! - [`LockGuard`] carries the token, renews the lease in the background (every `ttl / 3` by
//!   default, with an optional cap on the total hold time), keeps a conservative local deadline
//!   ([`LockGuard::valid_until`], counted on the monotonic clock from when the acquire or renew
//!   request was *sent*, minus a drift margin) and reports loss through
//!   [`LockGuard::is_lost`] and the [`LockGuard::lost`] future;
//! - every primitive is one of these acquisitions: a mutex, the read side of a read-write lock
//!   ([`AcquireOptions::shared`]) or a permit of a semaphore
//!   ([`AcquireOptions::with_permits`]), all with the same guard; multi-locks
//!   ([`DistributedLock::acquire_all`], [`MultiGuard`]) and leader election
//!   ([`DistributedLock::campaign`], [`DistributedLock::leader`],
//!   [`DistributedLock::observe`]) are built on them. The fencing rule of each kind is on
//!   [`LockKind`];
//! - [`memory`] is the reference backend for one process, with every kind.
//!
//! # Tracing and metrics
//!
//! Every acquire, renewal and release runs in a `tracing` span named after it
//! (`distlock.acquire`, ...). A waiting acquire emits one `DEBUG` event with target
//! [`WAITING_TARGET`] when its first poll finds the lock taken, so a subscriber can tell "queued
//! behind a holder" from "still connecting". Every client records metrics through the
//! `metrics` facade. [`telemetry`] lists the spans, their fields and the metrics.
//!
//! ```
//! # async fn demo() -> Result<(), distlock_core::Error> {
//! use std::time::Duration;
//! use distlock_core::{AcquireOptions, DistributedLock, memory::MemoryStore};
//!
//! let store = MemoryStore::new();
//! let (a, b) = (store.client(), store.client());
//! let opts = AcquireOptions::default().with_ttl(Duration::from_secs(5));
//!
//! let guard = a.acquire("invoices", &opts).await?;
//! assert!(b.try_acquire("invoices", &opts).await?.is_none()); // held elsewhere: not an error
//! let token = guard.token();
//! guard.release().await?;
//!
//! let next = b.acquire("invoices", &opts).await?;
//! assert!(next.token() > token); // fencing tokens strictly increase
//! # next.release().await }
//! # tokio::runtime::Runtime::new().unwrap().block_on(demo()).unwrap();
//! ```
//!
//! # Writing a backend
//!
//! A backend speaks its server's protocol and nothing else. It implements three small traits
//! from [`backend`]:
//!
//! 1. [`LockBackend`]: its [`Capabilities`] (fencing guarantee, FIFO, wake-up mechanism, ttl
//!    limits, loss detection) and [`LockBackend::begin`], which creates an [`Attempt`] for one
//!    acquisition. The [`AcquireRequest`] carries the validated name, a unique owner value to
//!    store on the server, the ttl, whether the caller waits or tries once, and the
//!    [`LockKind`] asked for (only kinds the capabilities declare: `shared`, `max_permits`).
//!    Optionally [`LockBackend::watch`] wakes election observers.
//! 2. [`Attempt`]: [`poll`](Attempt::poll) makes one atomic try (or checks the attempt's place
//!    in a server-side queue) and answers [`Step::Acquired`] with a lease and a fencing token,
//!    or what it saw: [`Step::Busy`] (with the holder's remaining lease when known),
//!    [`Step::NextInLine`], [`Step::Again`] (the queue changed under it) or
//!    [`Step::Contended`] (a race with no holder). When to poll again is the core's decision,
//!    never a loop or a sleep inside `poll`;
//!    [`changed`](Attempt::changed) resolves when polling again is worthwhile (pub/sub
//!    message, watch event, NOTIFY), and may be left at its default (never) for polling
//!    backends; [`abandon`](Attempt::abandon) removes the attempt's traces from the server,
//!    including a lock taken by a request whose reply was lost (match it by the owner value).
//! 3. [`Lease`]: owner-checked, atomic [`renew`](Lease::renew) and
//!    [`release`](Lease::release) that answer [`Error::NotHeld`] when the lock is no longer
//!    the owner's, optionally a [`loss_signal`](Lease::loss_signal) future for servers
//!    that report loss themselves (session expiry), [`expired`](Lease::expired) for a
//!    server-side lease that can outlive the lock, and a [`renewer`](Lease::renewer) that
//!    renews many leases in one request ([`Renewer`]), so that a client's renewal cost per
//!    tick does not grow with the number of locks it holds.
//!
//! Shared helpers for backends live in [`backend`] too: the one retry policy
//! ([`backend::RetryPolicy`], [`backend::retrying`], [`backend::Retries`]; the backend only
//! says which failed requests may be sent again), [`backend::within`] to bound a request,
//! [`backend::spawn_cleanup`] for cleanups nobody waits for, [`backend::InFlight`] for
//! requests that must reach their end before the attempt's clean-up (on a backend whose
//! requests go over several connections, a pool's, a request cut short by a cancellation may
//! still be applied after a clean-up sent on another connection), [`backend::unpoisoned`],
//! and [`backend::escape_name`] for keys and node names.
//!
//! Then `LockClient::new(backend)` is a complete [`DistributedLock`], and one line in the
//! conformance suite (`conformance_tests::conformance_suite!`) proves it against a real server.
//! Rules: every call may be cancelled at an await point and must leave the attempt usable;
//! never compare timestamps from two machines (use server-side TTLs); report transport
//! failures as [`Error::Unavailable`] (retried by the core) and protocol surprises as
//! [`Error::Backend`].

#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod backend;
mod capabilities;
mod client;
mod contended;
mod descriptor;
mod election;
mod error;
mod finish;
mod flag;
mod footprint;
mod guard;
mod kind;
mod lock;
mod loss;
pub mod memory;
mod multi;
mod name;
mod options;
mod registry;
mod retry;
pub mod service_url;
pub mod telemetry;
pub mod tls;
mod token;
mod upgradeable;
mod watchdog;

pub use backend::{
    AcquireRequest, Acquired, Attempt, AttemptMode, Lease, LockBackend, LockInfo, RenewItem,
    Renewer, Step,
};
pub use capabilities::{Capabilities, LossDetection, WakeUp};
pub use client::LockClient;
pub use descriptor::{ConnectFn, Descriptor};
pub use election::Leader;
pub use error::{
    BoxError, Error, LossReason, NodeOutcome, NodeResult, Result, io_cause, tcp_cause,
};
pub use footprint::Footprint;
pub use guard::{LeaseView, LockGuard};
pub use kind::LockKind;
pub use lock::DistributedLock;
pub use multi::MultiGuard;
pub use name::LockName;
pub use options::{
    AcquireOptions, Backoff, ClientConfig, MAX_HOLDER_DATA, OwnerId, Renewal,
    default_renewal_interval,
};
pub use token::{FencingGuarantee, FencingToken};
pub use upgradeable::{
    GATE_SUFFIX, GatedGuard, UpgradeError, Upgradeable, UpgradeableGuard, UpgradeableRwLock, Write,
    WriteGuard,
};

/// The `tracing` target of the one `DEBUG` event a waiting acquire emits when its first poll
/// finds the lock taken (held, or queued ahead of it): from then on it waits.
pub const WAITING_TARGET: &str = "distlock_core::waiting";
