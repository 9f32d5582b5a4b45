#![doc = include_str!("../README.md")]
//!
//! Redis backend for distlock: one master (`redis://`), the master of a Sentinel-managed
//! replication group (`redis+sentinel://`), a Redis Cluster (`redis+cluster://`), or Redlock
//! over N independent masters (`redlock://`), with fencing tokens, renewal, pub/sub wake-ups
//! and a starvation-free default.
//!
//! ```no_run
//! # async fn demo() -> Result<(), distlock_core::Error> {
//! use std::time::Duration;
//! use distlock_core::{AcquireOptions, ClientConfig, DistributedLock};
//!
//! let locks = distlock_redis::connect("redis://127.0.0.1:6379", ClientConfig::default()).await?;
//! let guard = locks
//!     .acquire("invoices", &AcquireOptions::default().with_ttl(Duration::from_secs(10)))
//!     .await?;
//! println!("fencing token {}", guard.token()); // pass it with every write
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! # Keys
//!
//! A lock name maps to keys `distlock:{<fnv64 of the name>}:<kind>:<name>` ([`LockKeys`]):
//! the name verbatim after a fixed-length prefix (so distinct names never collide) and a hash
//! tag so that all keys of a name share one Redis Cluster slot. Kinds: `l` the lock (a string
//! holding the owner value, the lease as its TTL), `f` the fencing counter, `q` and `a` the
//! waiter queue (arrival order, and liveness deadlines), `c` the pub/sub channel of
//! releases, and `d` the data stored with the holds (see "Holder data" below).
//!
//! # Protocol (single master)
//!
//! - **Acquire, fast path** (default mode, first poll of an attempt): a short script,
//!   `SET l owner NX PX ttl GET` and, only if that took the lock, `INCR f` (clock tokens and
//!   a counter never seeded take the rule of the full script, below), so the counter step
//!   belongs to this acquisition, tokens strictly increase and a refused attempt burns no
//!   counter value. (It replaced `MULTI; SET NX PX GET; INCR; EXEC`: the same server time in
//!   the same run, and one reply to parse instead of five, which took 4-5 µs of the client's
//!   CPU per acquire + release off.) A handoff reservation lives in `l` itself, so `NX`
//!   refuses a reserved lock as well. The `GET` tells a busy answer from the attempt's own
//!   value; a waiting attempt that finds the lock taken goes on to the full script in the
//!   same poll, to be queued. Servers older than 7.0 (no `NX` with `GET`) are detected at the
//!   first refusal and served by the full script alone.
//! - **Acquire, script** (`EVALSHA`, reloaded automatically after `NOSCRIPT`; later polls, and
//!   always in fair mode): if the lock is free (or reserved for this attempt, or, in fair
//!   mode, this attempt heads the queue) it runs `SET l owner PX ttl` and `INCR f` and returns
//!   the counter as the fencing token. Otherwise it returns the remaining lease and, for a waiting attempt,
//!   records the waiter in the queue with a liveness deadline (the server's `TIME` plus
//!   [`RedisConfig::waiter_timeout`], or the acquire's ttl if shorter); waiters that stop polling are dropped from the queue by
//!   the next script that looks at it. A retried poll whose earlier reply was lost finds the
//!   lock already its own and gets the same token back, with the lease restarted.
//! - **Renew** is an owner-checked `PEXPIRE`; **release** an owner-checked `DEL` that then
//!   picks the oldest live waiter and hands the lock over to it, or reserves it (below).
//!   Both answer [`distlock_core::Error::NotHeld`] when the owner no longer holds the lock.
//!   The release of a lock this client has not seen contended lately runs a shorter script
//!   first (the owner-checked `DEL` if nobody is queued, with two keys and one argument); one
//!   that finds waiters leaves the lock to the full script, in a second round trip.
//! - **Batched renewal**: the automatic renewals that fall due together (a client holding many
//!   locks) go to the master as one script call per 256 locks, which renews each lock exactly
//!   as its own renew script would and answers per lock (a lock removed meanwhile is lost
//!   alone). Every kind is batched, on every topology: Sentinel on the master of the moment,
//!   Cluster one call per master and 256 of its locks (keys passed as arguments, since a
//!   script's declared keys must share a slot), Redlock the same call on every master, each
//!   lock renewed iff a majority renewed it within its validity. An explicit
//!   [`LockGuard::renew`](distlock_core::LockGuard::renew) stays one request.
//! - **Wake-ups**: a waiting attempt polls once; only at the first busy answer does it
//!   subscribe the name's channel on the client's single subscriber connection (shared by all
//!   names, one per node), and its next `changed()` returns as soon as the subscription is
//!   active, so that a release between the poll and the subscription is never missed. A
//!   message addressed to another waiter does not wake it; an empty one (or a broken
//!   subscriber connection) wakes everyone. Expiry of a crashed holder's lease is caught by
//!   sleeping until the remaining `PTTL` that the busy answer carried. Channels are
//!   unsubscribed when no attempt waits on them any more.
//! - **Hand-over** ([`RedisConfig::hand_over`], on by default; not with
//!   [`RedisConfig::wait_replicas`]; Redlock: see [Redlock](#redlock)): when the oldest live
//!   waiter wants the lock exclusively, the release script itself sets the lock key to that
//!   waiter's owner value, with the releaser's lease and the next fencing token (the counter
//!   stepped as the waiter's own acquisition would), takes it out of the queue and publishes
//!   `"\0\1" + lease ms + ":" + token + "\0" + owner` (readers: see below). A waiter that asked for the same lease holds on that message
//!   with no round trip of its own, its lease counted from the send of its last poll (which
//!   found the lock busy, so the release ran after it); one that asked for another lease
//!   polls, finds the lock its own and restarts the lease with its own ttl, and so does a
//!   client that predates the hand-over (it reads the message as a list of owners naming
//!   it). A message is trusted only if its token is above the fencing counter that the
//!   answer to the waiter's last poll read (busy answers carry it; none came, or none was
//!   set: not trusted): one published before that poll ran (for a hand-over lost since, e.g.
//!   to a forced release) is not. Shared holds and permits are handed over the same way
//!   (see [Read-write locks and semaphores](#read-write-locks-and-semaphores-single-master)).
//!   A contended handoff costs the release alone:
//!   one round trip and one message, where a reservation costs a message and the waiter's
//!   acquire round trip. The price: a waiter (a writer, a reader handed a shared hold with
//!   the others, a permit waiter handed a permit) killed while queued (less than its waiter
//!   timeout before the release: it stays queued that long) keeps what was handed to it
//!   until that lease runs out, where a reservation holds the lock for
//!   [`RedisConfig::handoff`] only; a forced release reserves instead of handing over (it
//!   does not know the next holder's lease).
//! - **No starvation (default)**: a release hands the lock to the oldest waiter (above), or
//!   otherwise reserves it for that waiter for [`RedisConfig::handoff`] (the lock key then
//!   holds `"\0next:" + its owner value`, which no owner value can equal) and wakes only
//!   that waiter, so a releaser that comes straight back finds the lock taken or reserved
//!   and queues behind the others; waiters are served in turn. A reserved waiter that does
//!   not come in time loses the reservation (dead waiters cost at most one handoff window
//!   each; one handed the lock, its lease). New arrivals may still take a free, unreserved
//!   lock, so this is not strict FIFO.
//! - **Fair mode** (`?fair=true`, [`RedisConfig::fair`]): strict FIFO by the queue (like
//!   Redisson's fair lock): only the head of the queue may take the lock, `try_acquire` fails
//!   while anybody waits, and a dead head is skipped once its liveness deadline passes.
//!
//! The fencing guarantee is [`SingleNode`](distlock_core::FencingGuarantee::SingleNode). Tokens
//! never go back: a missing counter `f` (a new name, or a server restarted without its data) is
//! first set to the server's `TIME` in microseconds (by the acquire script, or, after the fast
//! path stepped a missing counter, by a follow-up script that takes the next token), so a
//! restarted server's first token exceeds every token it handed out before, given a server
//! clock that does not go back across the restart. Exclusion holds only while the server keeps
//! its data: a failover to a lagging replica, or a restart without an fsynced AOF, forgets the
//! lock and can let a second client in. A restart is noticed at once: from a client's first
//! lock on a master, one connection of its watches the server, and a new `run_id` after a
//! reconnection marks every guard on that master lost with
//! [`LossReason::ServerRestarted`](distlock_core::LossReason::ServerRestarted). (Redlock: one
//! master's restart does not lose a majority's lock; renewal tells.)
//!
//! # Holder data
//!
//! A hold can carry up to [`MAX_HOLDER_DATA`](distlock_core::MAX_HOLDER_DATA) bytes of data
//! ([`AcquireOptions::with_data`](distlock_core::AcquireOptions::with_data),
//! [`LockGuard::set_data`](distlock_core::LockGuard::set_data), an election's proclaim), on
//! one master, Sentinel and Cluster. It lives in the hash `d` of the name (same hash tag as
//! its other keys, so the same cluster slot): owner value -> data. A short owner-checked
//! script writes it (the exclusive holder's value in `l`, or a live entry in `h` under the
//! kind's marker), replacing an exclusive hold's whole hash (any other field there is a
//! former hold's) or a shared holder's own field, and sets the key's TTL to the lock key's
//! remaining lease plus one lease. From then on every script that extends a hold extends
//! `d` with `l` (the renew scripts, a reader's acquisition, and the batched renewal for the
//! holds that stored data: a flag per lock in the call), so a hold renewed for hours keeps
//! its data, and every script that ends one deletes it with it: the exclusive releases (the
//! short one too: `DEL l d`, one command), a forced release or a release of the hold by its
//! token (both run the release scripts), a reader's release or pruning (its field), the last
//! reader (the key), a new epoch of readers. An expired hold's `d` expires with `l`, or at
//! most one lease later (the write's slack, for a batched renewal already on its way without
//! the flag). `inspect` and `list` read only the field of the holder they show (the
//! exclusive holder in the same script as the holder; the latest reader or permit holder by
//! one `HGET` after the holders), and owner values are unique per acquisition, so another
//! hold's data is never shown, and a new hold starts without any. Observers track `d` with
//! the holder keys, so a proclaim reaches them at once. Writing it is not a renewal: the
//! lease is unchanged. Not on Redlock (see [Redlock](#redlock)).
//!
//! The same script that reads an exclusive holder for `inspect` reads the fencing counter `f`:
//! on one master it is that holder's token (only a granted acquisition steps it), so
//! `inspect`, `list` and an election's leader report it (the term); it is missing, and not
//! reported, for a lock held for longer than the lease plus [`RedisConfig::forget_after`].
//!
//! What it costs holds without data (Redis 7.0 on a shared 2-core machine, server time per
//! call from `INFO commandstats`, medians of 6-8 runs, three sessions): a release deletes one
//! more key that does not exist (`SET` plus the short release script: 1.85, 2.12, 2.02 µs
//! before; 2.01, 2.18, 2.27 µs after); a batched renewal of 256 locks nothing measurable
//! (276 and 318 µs before, 284 and 305 µs after). Extending the data key for every lock, with
//! or without data, took it to 414 µs: hence the flag. With data, it takes 493-548 µs (one
//! more `PEXPIRE` per lock).
//!
//! # What is left on the server
//!
//! A released name leaves nothing behind for long: the lock key goes with the release (or its
//! lease), the hold's data `d` with it, the waiter keys `q` and `a` expire twice the waiter timeout
//! after the last waiter joined, a shared or permit hold's `h` and `t` with the last holder, and
//! the fencing counter `f` expires [`RedisConfig::forget_after`] (10 minutes by default) after the
//! lease of the name's last acquisition; every acquisition sets that expiry again (a `PEXPIRE`, or
//! the `PX` of its clock token's `SET`, in its script), so a name in use keeps its counter. The
//! keys of names no longer used are therefore bounded by the names acquired within the lease plus
//! `forget_after` (measured: 100,000 distinct names acquired and released once each left 100,000
//! counter keys, 166 bytes each, that were all gone after `forget_after`; before, they stayed
//! forever). The first token of a forgotten name comes from the server's clock, like a new name's,
//! so it is above every earlier token of that name unless the server's clock went back by more than
//! the lease plus `forget_after` in between. Count what is kept with
//! [`DistributedLock::footprint`](distlock_core::DistributedLock::footprint).
//!
//! # Sentinel and Cluster
//!
//! Both run the single-master protocol above on one master at a time; what differs is how
//! that master is found, and what a failover does.
//!
//! - **Sentinel** (`redis+sentinel://s1:p1,s2:p2,s3:p3/master_name`): the Sentinels are asked
//!   for the master (all at once; the address most of them give). The lock's commands go to
//!   it; on a connection error, a timeout or `READONLY` (a master that was made a replica)
//!   the Sentinels are asked again in the background, and every Sentinel's `+switch-master`
//!   event switches at once. Wake-ups, observers and the restart watch connect to the master
//!   of the moment.
//! - **Cluster** (`redis+cluster://h1:p1,h2:p2,...`): the client library's cluster client
//!   (MOVED/ASK redirections, slot map refresh). All keys of a name share one slot (the hash
//!   tag), so every script runs on that slot's master. A script unknown to the node that
//!   serves it (`NOSCRIPT`: a promoted replica) is sent once as `EVAL` on that node. Wake-ups use
//!   classic pub/sub, subscribed on the master that serves the name's slot (one subscriber
//!   connection per such master), where the script publishes: a subscriber of another node
//!   waits for the cluster bus to carry the message (about 43 ms now and then, measured). A
//!   `PUBLISH` reaches every node of a cluster, so after a failure to connect to that master
//!   the subscriber tries another node (and the slots are read again), and one left on a
//!   former master still in the cluster after a failover hears later (one cut off hears
//!   nothing: its waiters poll on their timers until its connection breaks). Observers track
//!   the name's keys on the slot's master (`CLIENT TRACKING` is per node), found again at each
//!   reconnection. `list` scans every master.
//! - **Failover = possible loss** (both): replication is asynchronous, so a promoted replica
//!   may lack the lock (and its counter may lag). A guard therefore learns of a failover as of
//!   a restart: the restart watch of its master (Sentinel: the master the Sentinels name;
//!   Cluster: the master that serves the lock's slot, one watch per master) sees another
//!   server and marks the guards lost with
//!   [`LossReason::Failover`](distlock_core::LossReason::Failover) (a restart of the same
//!   master stays [`ServerRestarted`](distlock_core::LossReason::ServerRestarted)). Cluster:
//!   when the watched master cannot be reached and the cluster's slots show it no longer a
//!   master, its guards are lost. The signal comes when the new master is known, about when
//!   other clients can reach it; a second client may be granted the lock by a new master that
//!   lacks it before the first hears (see the failover measurements in the README).
//! - **Fencing**: [`SingleNode`](distlock_core::FencingGuarantee::SingleNode), per master. By
//!   default ([`RedisConfig::clock_tokens`]) every token is at least the server's `TIME` in
//!   microseconds (`max(counter + 1, now_us + 1)`, in the acquire scripts: `TIME`, `GET f`, then
//!   `SET f now_us+1 PX keep`, or `INCR f` when the counter is ahead of the clock), so a promoted
//!   replica's tokens exceed the old master's as long as the servers' clocks differ by less than
//!   the failover took. `?wait_replicas=N` makes an acquisition count only once N replicas
//!   acknowledged it (after a grant, its owner-checked renewal and `WAIT N wait_timeout` in one
//!   pipeline, one more round trip, sent on a connection of its own, as a `WAIT` blocks its
//!   connection while the replicas lag; the renewal makes the count that of replicas that
//!   have the hold, whichever connection granted it; too few acknowledgements give the lock
//!   back and answer a retryable error; `wait_timeout` must be at most half the operation
//!   timeout), which closes the window of a failover to a replica that missed it, short of a
//!   replica that acknowledged and then lost the race to be promoted.
//!
//! # Read-write locks and semaphores (single master)
//!
//! Shared holds and permits are scripts only (the exclusive paths above are unchanged). The
//! holders are a sorted set `h` (owner -> the server's `TIME` in ms at which its lease ends)
//! with their tokens in a hash `t`; while they may live, `l` holds a marker (`"\0shared"` or
//! `"\0permits:N"`) whose TTL covers the latest lease, so the exclusive fast path's `SET NX`
//! and script refuse by themselves, and a holder is live while its lease has not ended and
//! `l` holds the marker (a forced release, or a marker that expired and was replaced, ends
//! them all). The acquire script prunes expired holders, counts the live ones (`ZCOUNT`) and
//! takes the same counter `f` as the mutex (stepped in the same script), so every acquisition
//! of a name, of any kind, gets a larger token. `N` lives in the marker: a request with another
//! `N`, a permit request on a read-write lock, or any request of the other family answers
//! [`distlock_core::Error::Mismatch`].
//!
//! Waiters share the mutex's queue `q` (readers as `"\0s:" + owner`, permit waiters as
//! `"\0p:" + owner`) and are served in arrival order in both modes: a reader holds when no
//! writer holds `l` or has it reserved and no writer waits ahead of it (a waiting writer
//! queues new readers behind it: no writer starvation; on Redlock, whose waiters are ordered
//! by the arrival time their clients' clocks gave them, a reader whose client's clock lags by
//! X passes the writers that queued within the last X); a permit holds when the live holders
//! plus the permit waiters ahead of it are fewer than `N`. Wake-ups are targeted: the last
//! reader's release hands the lock to the writer at the head as a writer's release hands it
//! to the next writer (see Hand-over above; or reserves it, in the default mode, without the
//! hand-over); a writer's release with readers at the head hands the lock over to all of them
//! up to the next writer (at most 128) in the same way, their shared holds and tokens written
//! by the release and one message with each reader's token (without the hand-over it wakes
//! them in one message, reserving `l` for them in the default mode); a released permit goes
//! to the permit waiter first in line for it in the same way (its hold and token written by
//! the release; one message `"\0\1" + lease ms + "/" + N + ":" + tokens + "\0" + owners`, as
//! the readers' with the semaphore's `N`, several where holds had expired, held on only by a
//! waiter of a semaphore of `N`; without the hand-over it wakes the one permit waiter that
//! now fits); and a reader's release that finds readers at the head of a name free or held
//! by readers (the writer ahead of them gone from the queue unreleased, or more readers than
//! a hand-over takes) wakes them, reserving a free `l` for them in the default mode. Renewal
//! and release are owner-checked scripts; a lost hold answers [`distlock_core::Error::NotHeld`].
//!
//! # Redlock
//!
//! Over N >= 3 independent masters (odd recommended), every operation goes to all nodes at
//! once, each with a per-node timeout much smaller than the ttl
//! ([`RedisConfig::node_timeout`]). An acquisition succeeds iff a majority acquired AND the
//! elapsed time plus the clock drift allowance (ttl x 0.01 + 2 ms by default, from
//! [`distlock_core::ClientConfig`]) is below the ttl; the guard's validity is ttl - elapsed - drift.
//! An acquisition, a renewal or a release returns as soon as a majority granted, renewed or
//! released it: a slow or paused master (within its node timeout) no longer delays it by its
//! own answer, which only a round that fails needs (such a round still waits for every master,
//! up to the node timeout; so does the watchdog's batched renewal). Its request finishes in the
//! background; whatever an acquisition takes there is the holder's, which the renewals and the
//! release reach on every master (the release there only once the acquisition's request
//! finished, which may take two scripts: it never leaves a copy granted after it ran).
//! On failure the lock is released on all nodes (also those whose answer was lost) and the
//! attempt retries after a random delay; when too few nodes answer at all the error is
//! [`distlock_core::Error::QuorumNotReached`], listing each node's outcome. A renewal counts only
//! if a majority renewed within the validity, and a release only if a majority released: a lock
//! found on fewer (a late acquisition's write on one master after the lock was removed from
//! the others) is removed there and answers [`distlock_core::Error::NotHeld`], or the masters'
//! error when too few answered to tell; a forced release removes it the same way and answers
//! that nothing was held (or fails, when too few answered to tell). The fencing token comes
//! from the largest of the majority's counters (the lagging nodes of the majority are raised
//! to it): that counter times 64 plus the index of the first master that gave it, so that
//! readers acquiring at once through different majorities with equal largest counters still
//! get distinct tokens (each master hands out each counter value once; Redlock takes at most
//! 64 masters). Declared
//! [`BestEffort`](distlock_core::FencingGuarantee::BestEffort).
//!
//! A release hands the lock over on each master as on one (see Hand-over above): each master's
//! release script gives it to its oldest waiter (mostly the same one on every master, as the
//! arrival score comes from the waiter; the queues can differ where a poll missed a master)
//! and publishes its own counter. The waiter holds once a majority of the masters' messages
//! came, each trusted only if its token is above the counter that master's answer to the
//! waiter's last poll showed (a busy answer's, or the grant a failed round gave back; no
//! answer, or no counter: not trusted), with the lease counted from that poll's send, the
//! token made from the majority's counters and their lower ones raised, as after a round.
//! Once one master's message came, the others' are awaited for 5 ms (at most the node
//! timeout): a master whose queue differs (a waiter whose poll reached it first) hands over to
//! a waiter the others do not; that waiter then polls, and finds the lock its own where it
//! was handed over.
//!
//! Read-write locks run the single-master scripts on every node with the same majority and
//! validity rules (a writer's majority shares a node with any other holder's majority, and a
//! node never grants a writer with anybody else), so they are as sound as the Redlock mutex.
//! Semaphores are not offered on Redlock: see [`MAX_PERMITS`] for why counting by majorities
//! is unsound. Neither is holder data
//! ([`Capabilities::holder_data`](distlock_core::Capabilities) is `false`, and acquiring with
//! data answers [`distlock_core::Error::Unsupported`]): each master would keep its own copy,
//! a write that reached a majority but not every master leaves the copies disagreeing, and
//! telling the latest value apart takes a version per write plus a majority read that writes
//! the latest back (a quorum register): two more rounds on every inspection, for every
//! reader of a read lock.
//!
//! What Redlock does not protect against: process pauses and network delays longer than the
//! lease (the holder still believes it holds the lock), clock jumps on the servers (a key
//! expires early), and a node restarting without persistence while others hold the same
//! majority (it may help a second client to a majority). Use fencing tokens checked by the
//! resource, and prefer the etcd, ZooKeeper or SQL backends for locks that guard correctness.
//!
//! # Errors
//!
//! Connection problems are [`distlock_core::Error::Unavailable`] (retryable); a key of another
//! type where the lock's keys live (`WRONGTYPE`), a read-only replica (`READONLY`) and other
//! server errors are [`distlock_core::Error::Backend`]. The source is a [`RedisError`] with a
//! [`RedisErrorKind`] to tell them apart.

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
mod node;
mod observe;
mod redlock;
mod renew;
mod restart;
mod scripts;
mod topology;
mod wake;

pub use backend::RedisBackend;
pub use descriptor::{CLUSTER, REDIS, REDLOCK, SENTINEL};

/// The largest semaphore on one master (`redis://`): 65,536 permits.
///
/// Every operation of the semaphore scripts is logarithmic in the holders and waiters (sorted
/// sets counted with `ZCOUNT`, ranked with `ZRANK`), so the bound is about memory and the
/// longest script, not speed: each holder costs a sorted-set member and a hash field (about
/// 150 bytes with its owner value), so a full semaphore stays within 10 MB, and the loops that
/// prune expired holders or wake waiters in one script are bounded (128 entries at a time) so
/// that no script blocks the server for long.
///
/// **Redlock has no semaphores** ([`Capabilities::max_permits`](distlock_core::Capabilities)
/// is 0 there): a majority-based semaphore is unsound. With 2 permits on 3 masters, clients A,
/// B and C can take masters {1, 2}, {2, 3} and {1, 3}: every master has 2 holders (within its
/// bound), every client has a majority, and 3 clients hold 2 permits. Majorities only exclude
/// each other (any two share a master, which cannot grant both): that is enough for a mutex
/// and for the read-write lock (a writer's majority shares a master with any reader's or
/// writer's majority, and a master never holds a writer with anybody else), not for counting.
pub const MAX_PERMITS: u32 = 1 << 16;
pub use config::{RedisConfig, Topology};
pub use distlock_core;
pub use error::{RedisError, RedisErrorKind};
pub use keys::LockKeys;
pub use redis;

use distlock_core::{ClientConfig, Error, LockClient};

/// Connects to `redis://host:port[/db]` (one master), `redis+sentinel://s1:p1,s2:p2/master`
/// (the master the Sentinels name), `redis+cluster://h1:p1,h2:p2` (a Redis Cluster) or
/// `redlock://h1:p1,h2:p2,h3:p3` (Redlock), with the query options of
/// [`RedisConfig::from_url`].
///
/// # Errors
/// [`Error::InvalidConfig`] for a bad URL or option; [`Error::Unavailable`] when the server (or
/// a Redlock majority) cannot be reached within the operation timeout.
pub async fn connect(url: &str, config: ClientConfig) -> Result<LockClient<RedisBackend>, Error> {
    connect_with(RedisConfig::from_url(url)?, config).await
}

/// A lock client on the master of the application's own `redis::Client` (its address,
/// credentials, TLS settings and database), with the default lock options; see
/// [`RedisBackend::from_clients`] for Redlock and other options.
///
/// ```no_run
/// # async fn demo() -> Result<(), distlock_core::Error> {
/// use distlock_redis::distlock_core::{AcquireOptions, ClientConfig, DistributedLock};
///
/// // The application's client, e.g. the one behind its ConnectionManager:
/// let app = distlock_redis::redis::Client::open("rediss://app:secret@redis.internal:6380/0")
///     .expect("a valid URL");
/// let locks = distlock_redis::from_client(app, ClientConfig::default()).await?;
/// let guard = locks.acquire("invoices", &AcquireOptions::default()).await?;
/// guard.release().await?;
/// # Ok(()) }
/// ```
///
/// # Errors
/// As [`connect`].
pub async fn from_client(
    client: redis::Client,
    config: ClientConfig,
) -> Result<LockClient<RedisBackend>, Error> {
    let options = RedisConfig::single("redis://127.0.0.1")?;
    let backend = RedisBackend::from_clients(vec![client], options, config.clone()).await?;
    LockClient::with_config(backend, config)
}

/// Connects with an explicit [`RedisConfig`] (e.g. [`RedisConfig::redlock`] over a list of
/// `redis://` URLs).
///
/// # Errors
/// As [`connect`].
pub async fn connect_with(
    redis: RedisConfig,
    config: ClientConfig,
) -> Result<LockClient<RedisBackend>, Error> {
    let backend = RedisBackend::connect(redis, config.clone()).await?;
    LockClient::with_config(backend, config)
}
