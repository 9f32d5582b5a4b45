//! What a backend can do, so that callers (and the conformance suite) can tell.

use std::time::Duration;

use crate::FencingGuarantee;

/// The properties of a backend.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// How far the fencing tokens can be trusted.
    pub fencing: FencingGuarantee,
    /// Whether waiters get the lock in arrival order.
    pub fifo: bool,
    /// How a waiter learns that the lock may be free.
    pub wake_up: WakeUp,
    /// Shortest ttl the backend accepts: the shortest lease it can keep renewed (every
    /// ttl/3, each renewal a server round trip or more that must land within the two thirds
    /// left). Each backend says why its value: etcd 2 s (its lease minimum), ZooKeeper 500 ms
    /// (a quorum write per renewal), SQL 300 ms (a commit per renewal), Redis 200 ms (Redlock
    /// 500 ms: a majority per renewal), memory 10 ms.
    pub min_ttl: Duration,
    /// Longest ttl the backend accepts.
    pub max_ttl: Duration,
    /// How a holder learns it lost the lock.
    pub loss_detection: LossDetection,
    /// Whether [`DistributedLock::list`](crate::DistributedLock::list) works.
    pub list: bool,
    /// Whether [`DistributedLock::force_release`](crate::DistributedLock::force_release) works.
    pub force_release: bool,
    /// Whether [`DistributedLock::release_hold`](crate::DistributedLock::release_hold) works:
    /// releasing one hold, named by its owner and fencing token, from any process.
    pub release_hold: bool,
    /// Whether holds carry data ([`AcquireOptions::with_data`](crate::AcquireOptions::with_data),
    /// [`LockGuard::set_data`](crate::LockGuard::set_data), election proclaims), stored with
    /// the hold on the server and shown by `inspect` and `list`.
    pub holder_data: bool,
    /// Whether [`LockKind::Shared`](crate::LockKind::Shared) holds (read-write locks) work.
    pub shared: bool,
    /// The largest semaphore [`LockKind::Permit`](crate::LockKind::Permit) may ask for; 0:
    /// no semaphores.
    pub max_permits: u32,
    /// Whether the locks live in this process only (the in-memory backend, an in-memory
    /// SQLite database): no other process sees them, and they end with the process. A tool
    /// whose locks must exclude other processes refuses such a backend.
    pub process_local: bool,
}

impl Capabilities {
    /// Capabilities with the given fencing guarantee; not FIFO, polling, ttl 1 ms ..= 1 day,
    /// loss detected by renewal, no listing, no force release, no release of a hold by its
    /// token, no holder data, exclusive locks only, shared between processes.
    pub fn new(fencing: FencingGuarantee) -> Self {
        Self {
            fencing,
            fifo: false,
            wake_up: WakeUp::Polling,
            min_ttl: Duration::from_millis(1),
            max_ttl: Duration::from_secs(24 * 3600),
            loss_detection: LossDetection::Renewal,
            list: false,
            force_release: false,
            release_hold: false,
            holder_data: false,
            shared: false,
            max_permits: 0,
            process_local: false,
        }
    }

    /// Declares read-write locks (shared holds).
    #[must_use]
    pub fn with_shared(mut self, shared: bool) -> Self {
        self.shared = shared;
        self
    }

    /// Declares semaphores of up to `max_permits` permits (0: none).
    #[must_use]
    pub fn with_max_permits(mut self, max_permits: u32) -> Self {
        self.max_permits = max_permits;
        self
    }

    /// Whether acquisitions of `kind` work on this backend (any number of permits).
    pub fn supports(&self, kind: crate::LockKind) -> bool {
        match kind {
            crate::LockKind::Exclusive => true,
            crate::LockKind::Shared => self.shared,
            crate::LockKind::Permit { .. } => self.max_permits > 0,
        }
    }

    /// Declares FIFO fairness.
    #[must_use]
    pub fn with_fifo(mut self, fifo: bool) -> Self {
        self.fifo = fifo;
        self
    }

    /// Declares the wake-up mechanism.
    #[must_use]
    pub fn with_wake_up(mut self, wake_up: WakeUp) -> Self {
        self.wake_up = wake_up;
        self
    }

    /// Declares the accepted ttl range.
    #[must_use]
    pub fn with_ttl_range(mut self, min: Duration, max: Duration) -> Self {
        self.min_ttl = min;
        self.max_ttl = max;
        self
    }

    /// Declares how loss is detected.
    #[must_use]
    pub fn with_loss_detection(mut self, loss_detection: LossDetection) -> Self {
        self.loss_detection = loss_detection;
        self
    }

    /// Declares that held locks can be listed.
    #[must_use]
    pub fn with_list(mut self, list: bool) -> Self {
        self.list = list;
        self
    }

    /// Declares that the locks live in this process only (see
    /// [`process_local`](Self::process_local)).
    #[must_use]
    pub fn with_process_local(mut self, process_local: bool) -> Self {
        self.process_local = process_local;
        self
    }

    /// Declares that locks can be force-released.
    #[must_use]
    pub fn with_force_release(mut self, force_release: bool) -> Self {
        self.force_release = force_release;
        self
    }

    /// Declares that one hold can be released by its owner and token (see
    /// [`release_hold`](Self::release_hold)).
    #[must_use]
    pub fn with_release_hold(mut self, release_hold: bool) -> Self {
        self.release_hold = release_hold;
        self
    }

    /// Declares that holds carry data (see [`holder_data`](Self::holder_data)).
    #[must_use]
    pub fn with_holder_data(mut self, holder_data: bool) -> Self {
        self.holder_data = holder_data;
        self
    }
}

/// How a waiting client learns that it may now get the lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WakeUp {
    /// The server notifies waiters (pub/sub, watch, LISTEN/NOTIFY, in-process signal).
    Event,
    /// Waiters re-try with jittered backoff, bounded by the holder's remaining lease.
    Polling,
}

/// How a holder learns that it may have lost the lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LossDetection {
    /// An owner-checked renewal is refused, or the local deadline passes without one.
    Renewal,
    /// As `Renewal`, plus the server's session or lease state (ZooKeeper session, etcd
    /// keepalive) is watched and reported as soon as it ends.
    Session,
}
