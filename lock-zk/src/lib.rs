#![doc = include_str!("../README.md")]
//!
//! ZooKeeper backend for distlock: a fair (FIFO) lock queue of ephemeral sequential nodes,
//! woken by watches on the nodes ahead that keep a waiter out (its predecessor; a writer's
//! readers; the nodes ahead of a permit waiter near the head), with `czxid` fencing tokens
//! and session-loss detection.
//!
//! ```no_run
//! # async fn demo() -> Result<(), distlock_core::Error> {
//! use std::time::Duration;
//! use distlock_core::{AcquireOptions, ClientConfig, DistributedLock};
//!
//! let client = distlock_zookeeper::connect("zk://127.0.0.1:2181,127.0.0.1:2182/myapp", ClientConfig::default()).await?;
//! let opts = AcquireOptions::default().with_ttl(Duration::from_secs(10));
//! let guard = client.acquire("invoices", &opts).await?;
//! // pass guard.token() with every write to the protected resource
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! # Nodes
//!
//! Every lock name maps to one *lock node* `<chroot>/distlock/<escaped name>`, a container
//! node (ZooKeeper 3.5+ deletes it once it has been emptied). Names are escaped byte by byte:
//! ASCII letters, digits, `_` and `-` stay, every other byte becomes `%XX`, so distinct names
//! never share a node, and `/`, `.`, `..`, `%2F`, emoji or control characters are all valid.
//!
//! Each acquisition creates one `EPHEMERAL_SEQUENTIAL` child `<escaped owner>.<sequence>`,
//! where the owner is the unique value lock-core gives every acquisition. The child with the
//! lowest sequence holds the lock; the others wait in sequence order (FIFO), each watching only
//! its predecessor (no herd effect; the read-write lock and the semaphore watch a few nodes
//! more, below). Because the name carries the unique owner, a create whose
//! reply was lost is found again by listing the children (Curator's "protected mode"), and
//! [`Attempt::abandon`](distlock_core::Attempt::abandon) deletes it, so no orphan blocks the queue.
//!
//! The first poll creates the node and sets the (unused) data of the lock node in one `multi`
//! transaction. The lock node's stat in the answer is taken after the create, so its
//! `numChildren` says whether the new node is alone; alone, it holds the lock and no listing is
//! needed, so an uncontended acquire costs one write and a release one more, the same as the
//! raw create + delete. The stat's `mzxid` is the transaction's zxid, which is also the new
//! node's `czxid`: the token. Only when other nodes exist does the poll list the children.
//! A reader's or a permit's join on a lock node whose joins met other nodes within the last
//! second sends that listing right behind the `multi`, before its answer: the server answers
//! a session's requests in order, so the listing shows the new node, and a reader beside
//! readers knows its place in one round trip (16 readers of one name: 3,326 → 3,530
//! acquisitions/s; a semaphore of 3 with 8 clients: 767 → 918).
//!
//! A handoff costs the release alone where the waiter knows every node that keeps it from
//! holding: nodes ahead of a node only ever leave the queue (none joins ahead), so the waiter
//! next in line (the mutex's, a writer's) watches the head, and holds as soon as the head is
//! deleted, with no request but the "held" mark of its node (see below), sent, not awaited
//! (the same for a writer behind readers only, a reader behind one writer and the first two
//! permit waiters, see below). A change of a node such a waiter watches (a renewal, a held
//! mark) costs it one read of that node, which watches it again, not a look at the queue:
//! such a write restarts that node's lease, and the waiter looks again by the end of the
//! lease it judged, or by its own refresh (a third of its ttl) at the latest.
//! Further back, when the node it watches is deleted, a waiter sends a listing and, right
//! behind it, its held mark: the server answers the listing without waiting for the mark to
//! commit; if it shows that the waiter holds, it holds the lock at once, a handoff of the
//! release and one read. Until the mark commits, its node still says "waiting", which no
//! contender takes for an expired holder (both shortcuts are taken only while that waiting
//! lease is fresh), and its local lease counts from before the mark was sent. Such a node
//! holds all the same: inspection and forced releases do not ask for the mark. A waiter
//! that learns it holds from any other listing (a waiter further back, or one that removed a
//! lapsed holder) holds the same way: it sends its mark and does not wait for the answer.
//!
//! # Read-write locks and semaphores
//!
//! Curator's recipes, on the same queue. A node's name says its kind: `<owner>.<seq>` is
//! exclusive (the mutex's node, unchanged: the exclusive kind is the write side of the
//! read-write lock), `read.<owner>.<seq>` shared, `sem<N>.<owner>.<seq>` a permit of a
//! semaphore of N. Escaped owners never contain `.`, so the tag is unambiguous. Every node
//! has the same data (`H`/`W` and its lease, below) and is removed the same way once its
//! lease ran out.
//!
//! - A writer holds when its node is first, and watches its predecessor: the mutex, as is.
//!   Behind readers only (at most 8 of them), it watches each of them, and holds once the
//!   last is deleted with no look at the queue (only its held mark, sent, not awaited), as
//!   the mutex's next in line does on the head's deletion. Readers that leave about together
//!   no longer wake it one after the other to list the queue and watch the next.
//! - A reader holds when no exclusive node is ahead of it, and otherwise watches the latest
//!   exclusive node ahead of it. A reader that joins behind a waiting writer waits for that
//!   writer: writers are not starved. A writer's release wakes the readers between it and the
//!   next writer, and nobody else. A reader with that one writer ahead holds on its deletion
//!   as the writer behind readers does (its held mark only); behind two writers or more, on
//!   its listing, as the mutex's next waiter does (the listing and the held mark in one round
//!   trip, see above). Either shortcut is taken while the waiter's own lease is fresh (see
//!   "Leases on the server's clock"), else it lists the queue first; a node ahead of a kind
//!   that does not belong with it (an attempt about to be told `Mismatch`) makes it list
//!   too.
//! - Of the permit nodes of N, the first N hold. The first two waiters (at most 8 nodes
//!   ahead: `PERMIT_WAITERS_COUNTING` and `MAX_BLOCKERS` in the `kinds` module) read and
//!   watch every node ahead of them in one round trip, remove those whose lease ran out,
//!   and count their deletions: the first waiter holds at the first, the second at the
//!   second, each with its held mark alone, as the mutex's next in line does (nodes ahead
//!   only ever leave the queue). A waiter further back watches the waiter two places ahead
//!   of it, whose held mark (the write that marks it held) brings it among the two that
//!   count. A second waiter with more than 8 nodes ahead (N of 8 or more) watches its
//!   predecessor, and a first waiter with more than 8 holders ahead (N of 9 or more) lists
//!   the children with a watch (which fires when a node joins or leaves) and reads the
//!   holders' nodes. A node that holds as soon as it is
//!   created writes that mark too when its listing shows a permit node behind it: that node
//!   may have listed before a release and seen it waiting. So a release reaches the two
//!   waiters that count, one of which it frees a permit for, and that one's mark the other
//!   and the next waiter: four notifications, however many wait. Before (2026-12-06), the
//!   first waiter listed the queue on every release and join, and the next waiter took over
//!   its watch only once the first had its permit: two round trips on the way to each
//!   permit, which three permits changing hands as often as one lock did not leave time
//!   for.
//! - Kinds that do not belong together: the head of the queue (the oldest node, a holder) says
//!   what the name is; a permit request on a name whose head is not a permit node of the same
//!   N, or a shared or exclusive request on a semaphore, answers
//!   [`Error::Mismatch`](distlock_core::Error::Mismatch), and the attempt's node is removed.
//!   Only permit waiters judge a permit holder's lease: a crashed semaphore holder makes
//!   requests of other kinds answer `Mismatch` until a permit request removes it or its
//!   session expires.
//! - Tokens are the nodes' `czxid`, for every kind (one name, one counter: the zxid). A node
//!   holds only after every node it waits for is gone, and nodes are created in sequence
//!   order, so a writer's token is above every earlier holder's, and a reader's or a permit's
//!   above every earlier writer's and every holder that left before it was created. Two
//!   permit or read acquisitions whose attempts overlap may return in the other order than
//!   their tokens: the token is the place in the queue.
//! - [`MAX_PERMITS`] bounds N: the first waiter reads every holder's node in each of its
//!   looks.
//! - Cost of the leases: ZooKeeper's data and exists watches fire on data changes too, and
//!   a node's lease lives in its data. A waiter that watches its predecessor is therefore
//!   also woken, and looks again (a listing and a read), when that node is written: each
//!   renewal of a holder (every ttl/3), a waiter's refresh (every ttl/3), a held mark. A
//!   waiter that watches several nodes (a writer behind readers, the mutex's next in line, a
//!   reader behind one writer, the two permit waiters that count) reads only the node that
//!   was written, to watch it again. None of this wakes anybody else.
//!
//! # Leases on the server's clock
//!
//! ZooKeeper's own liveness unit is the session, shared by every lock of a client, and kept
//! alive by the client library's heartbeats even when a holder stops renewing. The lock's ttl
//! is therefore kept on the holder's node: its data is `H<ttl ms>` and its lease runs from the
//! node's `mtime` (the server's clock when the create or the last renewal was committed).
//! Renewal is a `set_data` of the holder's own node (which only the holder writes, and which
//! exists only while it holds: owner-checked and atomic), release a `delete`. The client's
//! watchdog renews the held nodes of a session together: one `multi` of their `set_data`s
//! (at most 500), and when one node is gone (a multi is all or nothing; the server names the
//! first failed operation) that lock alone is reported lost and the rest sent again. No
//! holder watches its own node (every renewal changes its data, so a watch would cost a
//! registration and a notification per lock and renewal): a node removed behind its holder
//! (a forced release, a lease judged lapsed) is found by the next renewal, which is
//! refused, and the session's end by one watch for every guard of the session. A contender
//! that is next in line reads the head node and, when a write of its own node is due (its
//! waiting mark, a refresh, or the time the head's lease may run out; a try: always), the
//! server's current time (the `mtime` of that write) in one round trip; if `now - mtime >
//! ttl` it deletes the head with the version it read, which fails if the holder renewed
//! meanwhile. Both timestamps come from the server (the leader of an ensemble): clients'
//! clocks are never compared. The write is sent
//! after the read: the server handles a session's requests in order, so its `mtime` was
//! stamped after every write the read saw, and a step back of the leader's clock between a
//! renewal and that write can only make the holder look younger. (Sent the other way round,
//! as before, a renewal stamped after a step back but read after the write looked older by
//! the step, and was removed while its holder still held: one overlap in a CI run of the
//! clock fault.) A reading stamped before the read (a try's creation of its node, two round
//! trips earlier) only says when to look again: the next poll reads, then writes.
//!
//! A waiter's node has a lease too: its data is `W<ttl ms>`, and the waiter writes it again
//! every third of the ttl while it waits (together with the reads it sends to watch the
//! nodes ahead, so it costs one more write per third of the ttl). The waiter behind a node
//! whose lease ran out, a holder's or a waiter's, removes it the same way, with the version
//! it read. So a waiter whose process was killed, or paused (`SIGSTOP`, a long GC pause, a
//! frozen VM), blocks the queue for one ttl, not until its session expires (30 s by default);
//! a paused waiter that comes back finds its node gone and joins the queue again at its end.
//! A waiter handed the lock while its node still says `W` counts its lease from its last write
//! of the node, and takes that shortcut only while that write is less than half a ttl old.
//! Nodes written by versions of this crate from before waiters had leases say plain `W` and
//! live as long as their session.
//! Caveat: across a leader change two different servers' clocks are compared; they must agree
//! within the drift margin.
//!
//! # Sessions and ttls
//!
//! One session per backend, opened by [`connect`] with the configured session timeout
//! (default 30 s, `?session_timeout=` in the URL). The longest accepted ttl is the timeout the
//! server granted: a holder cut off from the ensemble keeps believing it holds the lock until
//! its local deadline (at most one ttl after its last renewal was sent), and the server must
//! not delete its node (session expiry) before that. A session opened later (the first ended,
//! or stayed disconnected) that the server grants a shorter timeout (restarted with a lower
//! `maxSessionTimeout`) refuses an acquisition whose lease is longer than that timeout, a
//! waiter too at its next poll on it: [`Error::InvalidOptions`](distlock_core::Error).
//! The shortest ttl is 500 ms. A crashed
//! process's held locks and its queue entries (waiters) are freed after their ttl by the
//! waiters behind them; its session expiry removes whatever is left.
//!
//! While the connection is down, guards are uncertain: renewals fail and are retried by
//! lock-core until the local deadline. [`LockGuard::lost`](distlock_core::LockGuard::lost) fires
//! when the session expires ([`LossReason::SessionExpired`](distlock_core::LossReason)), when a
//! renewal finds the holder's node deleted (`RenewalRejected`, or `LeaseExpired` after the
//! lease ran out), or when the local deadline passes, whichever comes first. After a session
//! expiry, the next operation opens a new session transparently.
//!
//! A session that stays disconnected for 2 s while the servers answer (the client library
//! would retry it only after its backoff, up to 12.8 s) is replaced for new work; its guards
//! live on with it. A waiter on it moves: it removes its queue node through the new session
//! and joins the queue again there. An attempt knows its node by name (after a create whose
//! answer was lost, by its owner's prefix among the nodes its own session created), never by
//! the prefix alone: a node left in the old session, alive with that session, is never taken
//! for the new one's (the lock would end with the old session, and carry another node's
//! token).
//!
//! # Authentication
//!
//! `zk://user:password@host:port/...` (or [`ZkConfig::with_digest_auth`]) authenticates the
//! session with ZooKeeper digest credentials (`addauth digest user:password`), and every node
//! the backend creates gets the ACL `auth:ALL, world:anyone:READ`: all permissions for that
//! identity (the server writes it as `digest:user:<hash>`), read for anyone (`distlock status`,
//! monitoring: lock names and owners are not secret). That covers the chroot node, the base node
//! `<chroot>/distlock`, each lock node and each queue node: ZooKeeper asks for DELETE
//! permission on a node's *parent* to delete it, and CREATE on the parent to add a node, so
//! another identity, or a client without credentials, can neither delete nor change our queue
//! nodes nor join the queue, nor delete or replace the lock nodes. Missing ancestors of the
//! chroot are created open, as other tools would, so that other identities can have chroots
//! next to ours. The identity is the pair user:password; use one per application (every
//! process of it with the same credentials).
//!
//! `addauth digest` always succeeds, so a wrong password would only show when touching a node.
//! [`connect`] therefore reads the base node's ACL after opening the session and fails at once
//! with a non-retryable [`Error::Backend`](distlock_core::Error::Backend) naming the servers,
//! the node and the cause ("wrong password for digest user ...", "the credentials of digest
//! user ... lack permission (it belongs to ...)", "this client has no credentials"), never the
//! password. A `NoAuth` answer later (a lock node of another identity under a shared base) is
//! the same kind of error, naming the lock node: no retries until the wait deadline.
//!
//! Without credentials nothing changes: nodes are created open (`world:anyone:ALL`), as
//! before. A base node created earlier without credentials stays open when credentials are
//! added later: lock nodes created from then on are restricted, but anyone may still create
//! lock nodes in the base (and squat a name with an open lock node). The client logs a warning
//! when it finds its base open; restrict it with `setAcl` (e.g.
//! `addauth digest user:password`, then `setAcl -R /distlock auth::cdrwa,world:anyone:r` in
//! `zkCli.sh`), or use a new
//! chroot. Over TLS with a client certificate, the server also authenticates the session as
//! `x509:<certificate subject>`, and the `auth` ACL includes that identity too.
//!
//! With the cargo feature `sasl`, `zk://user:password@host:port/...?auth=sasl` (or
//! [`ZkConfig::with_sasl_auth`]) authenticates with SASL DIGEST-MD5 instead: the servers need
//! `authProvider.1=org.apache.zookeeper.server.auth.SASLAuthenticationProvider` and a JAAS
//! `Server` section (`org.apache.zookeeper.server.auth.DigestLoginModule`) with
//! `user_<name>="<password>"`. The session's identity is then `sasl:<name>`, the same
//! `auth:ALL, world:anyone:READ` ACL restricts every node to it, and the connect-time check
//! of the base node's ACL looks for that identity. Unlike `addauth digest`, the server checks
//! the password during the handshake: a wrong password or an unknown user fails [`connect`]
//! at once with a non-retryable [`Error::Backend`](distlock_core::Error::Backend) naming the
//! servers and saying "authentication failed". (ZooKeeper 3.8 was seen letting an unknown
//! user through with the password of the user authenticated just before, as
//! `sasl:<unknown name>`; the check of the base node's ACL then refuses it, naming the owner.)
//! Without the feature, `auth=sasl` is
//! [`Error::Unsupported`](distlock_core::Error::Unsupported). Kerberos (GSSAPI) is not offered.
//!
//! # TLS
//!
//! With the cargo feature `tls`, `zks://[user:password@]host:port[,...][/chroot]?ca=PATH`
//! connects to the servers' `secureClientPort` (ZooKeeper 3.5+, served by its Netty connection
//! factory) and verifies their certificates against `ca=` (PEM; the name in the certificate
//! must match the host); `cert=PATH&key=PATH` adds a client certificate for servers that ask
//! for one (`ssl.clientAuth`). The files are read by
//! [`TlsFiles`](distlock_core::tls::TlsFiles). TLS runs on rustls: zookeeper-client builds its
//! configuration with the process's default crypto provider, which this crate sets to ring
//! unless the application installed one first.
//!
//! Failures are typed: an untrusted server certificate, a refused client certificate,
//! `zks://` to a plain port and `zk://` to a TLS port each give a non-retryable
//! [`Error::Backend`](distlock_core::Error::Backend) naming the host and the cause, within
//! the operation timeout (the client library only says "no available hosts"; a handshake of
//! this crate's own finds out why). Without the feature, `zk://` to a TLS port stays a
//! retryable "no available hosts" (nothing here can tell a TLS server), and a `zks://` URL is an
//! [`Error::Unsupported`](distlock_core::Error::Unsupported) naming it.
//!
//! # Guarantees
//!
//! | fencing | fairness | wake-up | loss detection |
//! |---|---|---|---|
//! | `Linearizable`: the holder node's `czxid` | FIFO (sequence order; readers behind a waiting writer wait) | watch on the predecessor (a reader: the latest writer ahead; a writer behind readers only: each of them; the first two permit waiters: every node ahead, counting their deletions; later permit waiters: the waiter two ahead) | session state (one watch per session) + renewal (a node removed behind its holder: the next renewal) |
//!
//! Tokens strictly increase per name: nodes are granted in sequence order, which is `czxid`
//! order, and zxids only grow, also across server restarts (the epoch is in the high bits).
//!
//! A server (a follower, or even the leader) may not yet have applied a write another server
//! already applied and answered, so a client that only reads could miss a hold another
//! client just took through another server of the ensemble (measured: in 100 rounds of
//! acquire on one server and `inspect` on the two others, the 21st missed it).
//! [`inspect`](distlock_core::DistributedLock::inspect), `list`, `leader` and observers
//! therefore send a write barrier before they read (a transaction that checks the version of
//! the node they read, any version: one quorum write more per `inspect`, per `list`, per
//! observer wake-up), and so do forced releases and `release_hold` before they look for the
//! holders. ZooKeeper's `sync` was not enough: the leader answers its own clients' `sync` as
//! a read, maybe before it applied a hold a follower already applied and granted (with the
//! machine busy, 1 of 8 runs of 100 rounds missed one; with the barrier, none of 14). The
//! locks themselves never rest on such reads: an acquisition reads after its own write, which
//! a server applies in order.

#![cfg_attr(docsrs, feature(doc_cfg))]

mod acl;
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
mod queue;
mod renew;
mod session;
#[cfg(feature = "tls")]
mod tls;
mod wake;

pub use backend::{MAX_PERMITS, ZkBackend};
pub use config::ZkConfig;
pub use descriptor::ZK;
#[cfg(feature = "tls")]
pub use descriptor::ZKS;
pub use distlock_core;
pub use zookeeper_client;

use distlock_core::{ClientConfig, LockClient, Result};

/// Connects to ZooKeeper from a `zk://[user:password@]h1:p1,h2:p2[/chroot][?session_timeout=30s]`
/// URL, or `zks://...?ca=PATH[&cert=PATH&key=PATH]` over TLS (see [`ZkConfig::from_url`]).
///
/// # Errors
/// [`Error::InvalidConfig`](distlock_core::Error::InvalidConfig) for a malformed URL, client
/// configuration or unreadable TLS file; [`Error::Unavailable`](distlock_core::Error::Unavailable)
/// when no server answers within the operation timeout;
/// [`Error::Backend`](distlock_core::Error::Backend) (not retryable) when the credentials lack
/// permission on the base node or TLS fails (see "Authentication" and "TLS" above).
pub async fn connect(url: &str, config: ClientConfig) -> Result<LockClient<ZkBackend>> {
    let zk_config = ZkConfig::from_url(url)?;
    connect_with(zk_config, config).await
}

/// Makes ring the process-wide default rustls crypto provider, unless one is installed
/// already (then it does nothing). Feature `tls`.
///
/// zookeeper-client depends on rustls with its default features, so with this crate's `tls`
/// feature rustls is built with both ring and aws-lc-rs (cargo unifies features across the
/// whole build), and then `rustls::ClientConfig::builder()`, which zookeeper-client and other
/// libraries (redis-rs, for one) call, panics unless a default provider is installed. [`connect`]
/// calls this before every TLS connection and the `distlock` facade before every connection;
/// an application that builds rustls configurations elsewhere first should call it at the
/// start of `main` (or install a provider of its own).
#[cfg(feature = "tls")]
#[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
pub fn install_crypto_provider() {
    // Err: a provider is installed already, which is what we want.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Connects with an explicit [`ZkConfig`].
///
/// # Errors
/// As [`connect`].
pub async fn connect_with(
    zk_config: ZkConfig,
    config: ClientConfig,
) -> Result<LockClient<ZkBackend>> {
    config.validate()?;
    let backend = ZkBackend::connect(zk_config, &config).await?;
    LockClient::with_config(backend, config)
}
