//! Configuration: which servers, which mode, and the protocol's timing knobs.

use std::ops::RangeInclusive;
use std::time::Duration;

use distlock_core::Error;
use distlock_core::service_url::{self, ServiceUrl, UrlOptions};
use distlock_core::tls::TlsFiles;

/// How the backend connects and behaves. Built with [`RedisConfig::from_url`],
/// [`RedisConfig::single`] or [`RedisConfig::redlock`], then the `with_*` methods.
///
/// URL forms (the scheme is case-insensitive; user and password are percent-decoded):
///
/// - `redis://[user:password@]host:port[/db]`: one master;
/// - `redis+unix:///path/to/redis.sock[?db=N&user=U&pass=P]` (or `unix://`): one master on a
///   Unix socket;
/// - `redlock://[user:password@]host1:port1,host2:port2,host3:port3[/db]`: Redlock over N >= 3
///   independent masters;
/// - `redis+sentinel://[user:password@]s1:p1,s2:p2,s3:p3/master_name[/db]`: the master that
///   the Sentinels name `master_name`, followed across failovers (see the crate docs,
///   "Sentinel and Cluster"). User, password and database are the data nodes'; the Sentinels
///   are asked without credentials;
/// - `redis+cluster://[user:password@]h1:p1,h2:p2,...`: a Redis Cluster, the given nodes as
///   seeds (any subset; the client learns the others);
/// - `rediss://...`, `redlocks://...`, `rediss+sentinel://...` and `rediss+cluster://...`:
///   the same over TLS (every node, the Sentinels and the pub/sub connections too). The
///   server's certificate is verified against the public roots (webpki-roots) or the `ca`
///   file, and must name the host.
///
/// User and password are sent with `AUTH user password` (Redis 6 ACL users) on every connection
/// of every node, the subscriber's included; a password alone authenticates the `default` user.
///
/// Query options (durations in [`humantime`](https://docs.rs/humantime) syntax, with a unit):
///
/// | option | meaning | default |
/// |---|---|---|
/// | `fair` | strict FIFO queue (`true`/`false`) | `false` |
/// | `handoff` | how long a release reserves the lock for the oldest waiter | `100ms` |
/// | `hand_over` | a release hands the lock straight to the oldest waiter (see [`RedisConfig::hand_over`]) | `true` |
/// | `waiter_timeout` | a waiter silent this long (or for its acquire's ttl, if shorter) is dropped from the queue (at least `30ms`) | `2s` |
/// | `node_timeout` | Redlock: how long to wait for each node | a tenth of the ttl |
/// | `client_name` | name in `CLIENT LIST` and `CLIENT SETINFO lib-name` | `distlock` |
/// | `ca` | TLS: PEM file of the certificate authority that signed the servers' certificates | public roots |
/// | `cert`, `key` | TLS: PEM files of a client certificate and its key (mutual TLS) | none |
/// | `danger_skip_verify` | TLS: accept ANY server certificate, for test rigs only: anyone on the path can read and forge the traffic | `false` |
/// | `clock_tokens` | every fencing token is at least the server's clock in microseconds (see [`RedisConfig::clock_tokens`]) | `true` for Sentinel and Cluster, else `false` |
/// | `wait_replicas` | an acquisition is granted only once this many replicas have it (`WAIT`; see [`RedisConfig::wait_replicas`]) | `0` |
/// | `wait_timeout` | how long an acquisition waits for `wait_replicas` | `100ms` |
/// | `forget_after` | a name nobody acquired for its lease plus this long has its fencing counter expire (see [`RedisConfig::forget_after`]) | `10m` |
///
/// Numbers have ranges, and a value outside one is an error naming the option, the value and
/// the range: the database 0 to 2147483647 ([`RedisConfig::DATABASE`]), `wait_replicas` 0 to
/// 1000 ([`RedisConfig::WAIT_REPLICAS`]), `handoff` 1ms to 1min ([`RedisConfig::HANDOFF`]),
/// `waiter_timeout` 30ms to 1h ([`RedisConfig::WAITER_TIMEOUT`]), `node_timeout` and
/// `wait_timeout` 1ms to 10min ([`RedisConfig::NODE_TIMEOUT`]), `forget_after` 1 ms to 30 days
/// ([`RedisConfig::FORGET_AFTER`]).
///
/// ```
/// use distlock_redis::RedisConfig;
///
/// let single = RedisConfig::from_url("redis://127.0.0.1:6379/2?fair=true&handoff=50ms").unwrap();
/// assert!(!single.is_redlock() && single.fair);
/// let redlock = RedisConfig::from_url("redlock://10.0.0.1:6379,10.0.0.2:6379,10.0.0.3:6379").unwrap();
/// assert_eq!(redlock.nodes.len(), 3);
/// assert!(RedisConfig::from_url("redlock://10.0.0.1:6379").is_err()); // fewer than 3
/// let tls = RedisConfig::from_url("rediss://app:secret@redis.internal:6380?ca=/etc/ca.pem").unwrap();
/// assert!(tls.is_tls() && !format!("{tls:?}").contains("secret"));
/// ```
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisConfig {
    /// One `redis://` URL per master (one for single-master mode).
    pub nodes: Vec<String>,
    /// Redlock over `nodes` (majority quorum) instead of one master.
    pub redlock: bool,
    /// Strict FIFO: a waiter queue kept in Redis decides who is next; `try_acquire` fails while
    /// anybody waits. Default `false`: starvation-free handoff (see the crate docs).
    pub fair: bool,
    /// Default mode: how long a release reserves the lock for the oldest waiter, when it does
    /// not hand it over ([`Self::hand_over`]). Default 100 ms.
    pub handoff: Duration,
    /// Not with [`Self::wait_replicas`]: a release that finds an exclusive waiter queued
    /// **hands the lock over** to the oldest live one in the same script (its owner value in
    /// the lock key, with the releaser's lease and the next fencing token, published to it),
    /// so the waiter holds on the message without a round trip of its own (Redlock: on the
    /// messages of a majority of the masters); its lease counts from its last poll before
    /// the release. A waiter that asked for another lease, or a client that predates this, polls
    /// and finds the lock its own. Readers behind a writer, and the permit waiters first in
    /// line for the permits a release frees, are handed their holds the same way. The price:
    /// a waiter killed while queued (it stays queued for its [`Self::waiter_timeout`]) and
    /// then handed the lock keeps it until that lease runs out, where a reservation
    /// ([`Self::handoff`]) would have kept it that long only.
    /// `false`: reserve and let the waiter take it (one more round trip per contended
    /// handoff). Default `true`.
    pub hand_over: bool,
    /// A waiter that stops polling for this long, or for its acquire's ttl if that is shorter
    /// (killed or paused without leaving the queue), is dropped from the queue. Waiters
    /// re-register every third of it. Default 2 s.
    pub waiter_timeout: Duration,
    /// Redlock: how long to wait for each node; `None`: a tenth of the ttl, at most the
    /// operation timeout.
    pub node_timeout: Option<Duration>,
    /// Name reported to the server (`CLIENT SETINFO lib-name`), to find connections in
    /// `CLIENT LIST`. Default `distlock`.
    pub client_name: String,
    /// TLS files shared by every `rediss://` node: a certificate authority and a client
    /// certificate. Empty by default (public roots, no client certificate).
    pub tls: TlsFiles,
    /// Accept any server certificate on `rediss://` nodes (no verification at all). For test
    /// rigs only: a connection that does not verify its server can be read and changed by
    /// anyone on the network path. Default `false`; a warning is logged at every connect.
    pub danger_skip_verify: bool,
    /// Sentinel mode: the master name the Sentinels (`nodes`) monitor; the lock runs on the
    /// master they name, followed across failovers.
    pub sentinel_master: Option<String>,
    /// Redis Cluster mode: `nodes` are seed nodes of one cluster.
    pub cluster: bool,
    /// Every fencing token is at least the server's `TIME` in microseconds (the acquire
    /// script takes `max(counter + 1, now_us)`): after a failover to a replica whose counter
    /// lags, the new master's tokens still exceed the old master's, as long as the two
    /// servers' clocks differ by less than the failover took. The fast path's script and the
    /// full acquire script both apply it. Default `true` for Sentinel
    /// and Cluster, `false` for one master and Redlock.
    pub clock_tokens: bool,
    /// After a granted acquisition, wait until this many replicas acknowledged it (its
    /// owner-checked renewal and `WAIT N wait_timeout` in one pipeline: one more round trip,
    /// only for a grant; the count is of replicas that have the hold, whichever connection the
    /// pipeline takes); an acquisition that fewer replicas acknowledged in time is given back
    /// and answers a retryable [`Error::Unavailable`]. The pipeline has a connection of its
    /// own (on a cluster, to every node), as a `WAIT` blocks its connection until the replicas
    /// answer or `wait_timeout`: while they lag, the client's other commands go on, but the
    /// grants' waits on a master queue behind one another (the k-th of k grants at once waits
    /// about k times `wait_timeout`, and fails at the operation timeout). Sentinel and
    /// Cluster only. Default 0 (no wait).
    pub wait_replicas: u32,
    /// How long an acquisition waits for [`Self::wait_replicas`]. Default 100 ms; at most half
    /// the client's operation timeout ([`RedisBackend::connect`](crate::RedisBackend::connect)
    /// refuses it otherwise).
    pub wait_timeout: Duration,
    /// How long a name's fencing counter outlives its last acquisition's lease: each
    /// acquisition sets the counter key to expire after its ttl plus this, so a name in use
    /// keeps its counter, and a name nobody acquires any more leaves no key behind (the lock
    /// key goes with its release or lease, the waiter keys with their timeout). The next
    /// acquisition of a forgotten name starts again from the server's clock in microseconds,
    /// which is above every earlier token of that name unless the server's clock went back by
    /// more than this (and the lease) in between. Redlock: unless the masters' clocks also
    /// differed by more than this. Default 10 minutes (longer than any step a time daemon
    /// makes).
    pub forget_after: Duration,
}

/// Which Redis deployment a configuration names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Topology {
    /// One master (`redis://`).
    Single,
    /// Redlock over independent masters (`redlock://`).
    Redlock,
    /// The master named by Sentinels (`redis+sentinel://`).
    Sentinel,
    /// A Redis Cluster (`redis+cluster://`).
    Cluster,
}

/// Shows the nodes with their passwords replaced by `***`.
impl std::fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let nodes: Vec<String> = self.nodes.iter().map(|n| service_url::redact(n)).collect();
        f.debug_struct("RedisConfig")
            .field("nodes", &nodes)
            .field("redlock", &self.redlock)
            .field("fair", &self.fair)
            .field("handoff", &self.handoff)
            .field("hand_over", &self.hand_over)
            .field("waiter_timeout", &self.waiter_timeout)
            .field("node_timeout", &self.node_timeout)
            .field("client_name", &self.client_name)
            .field("tls", &self.tls)
            .field("danger_skip_verify", &self.danger_skip_verify)
            .field("sentinel_master", &self.sentinel_master)
            .field("cluster", &self.cluster)
            .field("clock_tokens", &self.clock_tokens)
            .field("wait_replicas", &self.wait_replicas)
            .field("wait_timeout", &self.wait_timeout)
            .field("forget_after", &self.forget_after)
            .finish()
    }
}

impl RedisConfig {
    /// The database numbers accepted (the URL's path, or `db=` on a socket): Redis numbers its
    /// databases with an `int`.
    pub const DATABASE: RangeInclusive<u32> = 0..=i32::MAX as u32;

    /// The `wait_replicas` accepted.
    pub const WAIT_REPLICAS: RangeInclusive<u32> = 0..=1000;

    /// The `handoff` reservations accepted: a release reserves the lock this long for a waiter
    /// that may be gone.
    pub const HANDOFF: RangeInclusive<Duration> =
        Duration::from_millis(1)..=Duration::from_secs(60);

    /// The `waiter_timeout`s accepted.
    pub const WAITER_TIMEOUT: RangeInclusive<Duration> =
        Duration::from_millis(30)..=Duration::from_secs(3600);

    /// The `forget_after`s accepted.
    pub const FORGET_AFTER: RangeInclusive<Duration> =
        Duration::from_millis(1)..=Duration::from_secs(30 * 24 * 3600);

    /// The default [`Self::forget_after`].
    pub const DEFAULT_FORGET_AFTER: Duration = Duration::from_secs(600);

    /// The `node_timeout`s (Redlock) and `wait_timeout`s accepted.
    pub const NODE_TIMEOUT: RangeInclusive<Duration> =
        Duration::from_millis(1)..=Duration::from_secs(600);

    /// One master at `url` (`redis://...` or `rediss://...`).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] if `url` is not a valid `redis://` or `rediss://` URL.
    pub fn single(url: &str) -> Result<Self, Error> {
        let mut config = Self::from_url(url)?;
        if config.topology() != Topology::Single {
            return Err(Error::InvalidConfig(format!(
                "expected a redis:// or rediss:// URL, got {}",
                service_url::redact(url)
            )));
        }
        config.nodes.truncate(1);
        Ok(config)
    }

    /// Redlock over independent masters given as `redis://` or `rediss://` URLs (at least 3;
    /// TLS may differ per node). The TLS options (`ca`, `cert`, `key`, `danger_skip_verify`)
    /// of the URLs must agree: they apply to every `rediss://` node.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for fewer than 3 nodes, an invalid URL or TLS options that
    /// differ between nodes.
    pub fn redlock<S: AsRef<str>>(urls: &[S]) -> Result<Self, Error> {
        let mut nodes = Vec::with_capacity(urls.len());
        let mut tls: Option<(TlsFiles, bool)> = None;
        for url in urls {
            let single = Self::single(url.as_ref())?;
            let this = (single.tls, single.danger_skip_verify);
            match &tls {
                Some(first) if *first != this => {
                    return Err(Error::InvalidConfig(format!(
                        "the TLS options of {} differ from the first node's: give every node \
                         the same ca, cert, key and danger_skip_verify",
                        service_url::redact(url.as_ref())
                    )));
                }
                Some(_) => {}
                None => tls = Some(this),
            }
            nodes.extend(single.nodes);
        }
        let (tls, danger_skip_verify) = tls.unwrap_or_default();
        let config = Self {
            nodes,
            redlock: true,
            tls,
            danger_skip_verify,
            ..Self::defaults()
        };
        config.validate()?;
        Ok(config)
    }

    fn defaults() -> Self {
        Self {
            nodes: Vec::new(),
            redlock: false,
            fair: false,
            hand_over: true,
            handoff: Duration::from_millis(100),
            waiter_timeout: Duration::from_secs(2),
            node_timeout: None,
            client_name: "distlock".into(),
            tls: TlsFiles::default(),
            danger_skip_verify: false,
            sentinel_master: None,
            cluster: false,
            clock_tokens: false,
            wait_replicas: 0,
            wait_timeout: Duration::from_millis(100),
            forget_after: Self::DEFAULT_FORGET_AFTER,
        }
    }

    /// Which deployment this configuration names.
    pub fn topology(&self) -> Topology {
        match (self.redlock, self.cluster, &self.sentinel_master) {
            (true, _, _) => Topology::Redlock,
            (_, true, _) => Topology::Cluster,
            (_, _, Some(_)) => Topology::Sentinel,
            _ => Topology::Single,
        }
    }

    /// Parses a `redis://`, `rediss://`, `redlock://`, `redlocks://` or `redis+unix://` URL
    /// with optional query options
    /// (see the [type docs](Self)). The scheme is case-insensitive; user and password are
    /// percent-decoded.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming what is wrong, with the URL's password redacted.
    pub fn from_url(url: &str) -> Result<Self, Error> {
        let url = url.trim();
        let scheme = url
            .split_once("://")
            .map(|(scheme, _)| scheme.to_ascii_lowercase());
        if let Some("redis+unix" | "unix") = scheme.as_deref() {
            return Self::from_unix_url(url);
        }
        let parsed = ServiceUrl::parse(url)?;
        let (topology, tls) = match parsed.scheme() {
            "redis" => (Topology::Single, false),
            "rediss" => (Topology::Single, true),
            "redlock" => (Topology::Redlock, false),
            "redlocks" => (Topology::Redlock, true),
            "redis+sentinel" => (Topology::Sentinel, false),
            "rediss+sentinel" => (Topology::Sentinel, true),
            "redis+cluster" => (Topology::Cluster, false),
            "rediss+cluster" => (Topology::Cluster, true),
            other => {
                return Err(parsed.error(format!(
                    "unknown scheme {:?}: expected redis://, rediss://, redlock://, redlocks://, \
                     redis+sentinel://, redis+cluster:// or redis+unix://",
                    service_url::echo(other)
                )));
            }
        };
        let (master, db) = match topology {
            Topology::Sentinel => match parsed.path().split_once('/') {
                Some((master, db)) => (master, db),
                None => (parsed.path(), ""),
            },
            _ => ("", parsed.path()),
        };
        if topology == Topology::Sentinel && master.is_empty() {
            return Err(parsed.error(
                "a redis+sentinel:// URL names the master: redis+sentinel://s1:p1,s2:p2/master_name",
            ));
        }
        let db = match db {
            "" => None,
            db => Some(
                service_url::parse_integer("database", db, &Self::DATABASE)
                    .map_err(|why| parsed.error(why))?,
            ),
        };
        if topology == Topology::Cluster && db.is_some_and(|db| db != 0) {
            return Err(parsed.error("a Redis Cluster has database 0 only"));
        }
        if topology == Topology::Single && parsed.hosts().len() != 1 {
            return Err(parsed.error(
                "a redis:// URL names one master; use redlock://h1:p1,h2:p2,h3:p3 for several",
            ));
        }
        let replicated = matches!(topology, Topology::Sentinel | Topology::Cluster);
        let mut config = Self {
            redlock: topology == Topology::Redlock,
            cluster: topology == Topology::Cluster,
            sentinel_master: (topology == Topology::Sentinel).then(|| master.to_owned()),
            clock_tokens: replicated,
            ..Self::defaults()
        };
        let node_scheme = if tls { "rediss" } else { "redis" };
        for host in parsed.hosts() {
            let mut node = url::Url::parse(&format!("{node_scheme}://{host}/"))
                .map_err(|err| parsed.error(format!("invalid host {host}: {err}")))?;
            let credentials = node
                .set_username(parsed.username().unwrap_or(""))
                .and_then(|()| node.set_password(parsed.password()));
            if credentials.is_err() {
                return Err(parsed.error("the user name or password cannot be used"));
            }
            if let Some(db) = db {
                node.set_path(&db.to_string());
            } else {
                node.set_path("");
            }
            config.nodes.push(node.into());
        }
        let mut options = parsed.options();
        config.tls = TlsFiles::take(&mut options).map_err(|e| match e {
            Error::InvalidConfig(msg) => parsed.error(msg),
            other => other,
        })?;
        config.danger_skip_verify = options.bool("danger_skip_verify")?.unwrap_or(false);
        if !tls && (!config.tls.is_empty() || config.danger_skip_verify) {
            return Err(parsed.error(format!(
                "the TLS options (ca, cert, key, danger_skip_verify) need {}s://",
                parsed.scheme()
            )));
        }
        config.take_options(options)?;
        config.validate().map_err(|e| match e {
            Error::InvalidConfig(msg) => parsed.error(msg),
            other => other,
        })?;
        Ok(config)
    }

    /// `redis+unix:///path/to/redis.sock[?db=N&user=U&pass=P&...]` (also `unix://`): one
    /// master on a Unix socket.
    fn from_unix_url(url: &str) -> Result<Self, Error> {
        let redacted = service_url::redact(url);
        let bad = |why: String| Error::InvalidConfig(format!("{why} (in {redacted})"));
        let parsed = url::Url::parse(url).map_err(|err| bad(format!("invalid URL: {err}")))?;
        if parsed.host_str().is_some_and(|h| !h.is_empty()) || parsed.path().len() <= 1 {
            return Err(bad(
                "a Unix socket URL is redis+unix:///absolute/path/to/redis.sock".to_owned(),
            ));
        }
        let mut options = UrlOptions::from_query(parsed.query().unwrap_or(""), url);
        let db = options.integer("db", Self::DATABASE)?;
        let user = options.take("user");
        let pass = options.take("pass").or_else(|| options.take("password"));
        let mut node =
            url::Url::parse("redis+unix:///").map_err(|err| bad(format!("invalid URL: {err}")))?;
        node.set_path(parsed.path());
        for (key, value) in [
            ("db", db.map(|d| d.to_string())),
            ("user", user),
            ("pass", pass),
        ] {
            if let Some(value) = value {
                node.query_pairs_mut().append_pair(key, &value);
            }
        }
        let mut config = Self {
            nodes: vec![node.into()],
            ..Self::defaults()
        };
        config.take_options(options)?;
        config.validate().map_err(|e| match e {
            Error::InvalidConfig(msg) => bad(msg),
            other => other,
        })?;
        Ok(config)
    }

    /// Applies the lock's query options; any other option is an error.
    fn take_options(&mut self, mut options: UrlOptions) -> Result<(), Error> {
        const KNOWN: &[&str] = &[
            "fair",
            "handoff",
            "hand_over",
            "waiter_timeout",
            "node_timeout",
            "client_name",
            "ca",
            "cert",
            "key",
            "danger_skip_verify",
            "clock_tokens",
            "wait_replicas",
            "wait_timeout",
            "forget_after",
        ];
        if let Some(clock) = options.bool("clock_tokens")? {
            self.clock_tokens = clock;
        }
        if let Some(n) = options.integer("wait_replicas", Self::WAIT_REPLICAS)? {
            self.wait_replicas = n;
        }
        if let Some(timeout) = options.duration_in("wait_timeout", Self::NODE_TIMEOUT)? {
            self.wait_timeout = timeout;
        }
        if let Some(forget) = options.duration_in("forget_after", Self::FORGET_AFTER)? {
            self.forget_after = forget;
        }
        if let Some(fair) = options.bool("fair")? {
            self.fair = fair;
        }
        if let Some(hand_over) = options.bool("hand_over")? {
            self.hand_over = hand_over;
        }
        if let Some(handoff) = options.duration_in("handoff", Self::HANDOFF)? {
            self.handoff = handoff;
        }
        if let Some(timeout) = options.duration_in("waiter_timeout", Self::WAITER_TIMEOUT)? {
            self.waiter_timeout = timeout;
        }
        self.node_timeout = options
            .duration_in("node_timeout", Self::NODE_TIMEOUT)?
            .or(self.node_timeout);
        if let Some(name) = options.take("client_name") {
            if name.is_empty()
                || name.len() > 64
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
            {
                return Err(Error::InvalidConfig(format!(
                    "option client_name={:?}: expected 1 to 64 letters, digits, '-', '_' or '.'",
                    service_url::echo(&name)
                )));
            }
            self.client_name = name;
        }
        options.finish(KNOWN)
    }

    /// Strict FIFO mode on or off.
    #[must_use]
    pub fn with_fair(mut self, fair: bool) -> Self {
        self.fair = fair;
        self
    }

    /// Hand-over on release on or off (see [`Self::hand_over`]).
    #[must_use]
    pub fn with_hand_over(mut self, hand_over: bool) -> Self {
        self.hand_over = hand_over;
        self
    }

    /// The lease a release hands over with ([`Self::hand_over`]): the releaser's `ttl`, or
    /// `None` when this configuration does not hand over (with [`Self::wait_replicas`]: the
    /// replicas' acknowledgement belongs to the connection that wrote).
    pub(crate) fn hand_over_lease(&self, ttl: Duration) -> Option<Duration> {
        (self.hand_over && self.wait_replicas == 0).then_some(ttl)
    }

    /// Sets how long a name's fencing counter outlives its last lease
    /// ([`Self::forget_after`]).
    #[must_use]
    pub fn with_forget_after(mut self, forget_after: Duration) -> Self {
        self.forget_after = forget_after;
        self
    }

    /// Sets the handoff reservation length (default mode).
    #[must_use]
    pub fn with_handoff(mut self, handoff: Duration) -> Self {
        self.handoff = handoff;
        self
    }

    /// The dead-waiter timeout of an acquire with `ttl`: a place in the queue is a lease too,
    /// no longer than the lock's, so a killed or paused waiter blocks the ones behind it for
    /// at most the ttl.
    pub(crate) fn waiter_timeout_for(&self, ttl: Duration) -> Duration {
        self.waiter_timeout.min(ttl).max(Duration::from_millis(30))
    }

    /// Sets the dead-waiter timeout.
    #[must_use]
    pub fn with_waiter_timeout(mut self, timeout: Duration) -> Self {
        self.waiter_timeout = timeout;
        self
    }

    /// Sets the Redlock per-node timeout.
    #[must_use]
    pub fn with_node_timeout(mut self, timeout: Duration) -> Self {
        self.node_timeout = Some(timeout);
        self
    }

    /// Sets the name reported to the server.
    #[must_use]
    pub fn with_client_name(mut self, name: impl Into<String>) -> Self {
        self.client_name = name.into();
        self
    }

    /// Whether any node is reached over TLS (`rediss://`).
    pub fn is_tls(&self) -> bool {
        self.nodes.iter().any(|n| n.starts_with("rediss://"))
    }

    /// Sets the TLS files (certificate authority, client certificate) of the `rediss://`
    /// nodes.
    #[must_use]
    pub fn with_tls(mut self, files: TlsFiles) -> Self {
        self.tls = files;
        self
    }

    /// Whether this is a Redlock configuration.
    pub fn is_redlock(&self) -> bool {
        self.redlock
    }

    /// The number of nodes that must agree: a majority for Redlock, else 1 (the one master,
    /// however it is found).
    pub fn quorum(&self) -> usize {
        if self.redlock {
            self.nodes.len() / 2 + 1
        } else {
            1
        }
    }

    /// Sets [`Self::clock_tokens`].
    #[must_use]
    pub fn with_clock_tokens(mut self, on: bool) -> Self {
        self.clock_tokens = on;
        self
    }

    /// Sets [`Self::wait_replicas`] and [`Self::wait_timeout`].
    #[must_use]
    pub fn with_wait_replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.wait_replicas = replicas;
        self.wait_timeout = timeout;
        self
    }

    /// Checks the configuration.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the problem.
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |m: String| Err(Error::InvalidConfig(m));
        if self.nodes.is_empty() {
            return bad("no Redis node given".into());
        }
        if self.redlock && self.nodes.len() < 3 {
            return bad(format!(
                "Redlock needs at least 3 independent masters, got {}",
                self.nodes.len()
            ));
        }
        if self.redlock && self.nodes.len() as u64 > crate::redlock::TOKEN_SCALE {
            return bad(format!(
                "Redlock takes at most {} masters, got {}",
                crate::redlock::TOKEN_SCALE,
                self.nodes.len()
            ));
        }
        if self.redlock && (self.cluster || self.sentinel_master.is_some()) {
            return bad("Redlock, Sentinel and Cluster modes exclude each other".into());
        }
        if self.topology() == Topology::Single && self.nodes.len() != 1 {
            return bad("single-master mode takes exactly one node".into());
        }
        if self.cluster && self.sentinel_master.is_some() {
            return bad("Sentinel and Cluster modes exclude each other".into());
        }
        if self.wait_replicas > 0
            && !matches!(self.topology(), Topology::Sentinel | Topology::Cluster)
        {
            return bad("wait_replicas needs redis+sentinel:// or redis+cluster://".into());
        }
        service_url::check_integer("wait_replicas", self.wait_replicas, &Self::WAIT_REPLICAS)
            .map_err(Error::InvalidConfig)?;
        let durations = [
            ("wait_timeout", Some(self.wait_timeout), &Self::NODE_TIMEOUT),
            ("handoff", Some(self.handoff), &Self::HANDOFF),
            (
                "waiter_timeout",
                Some(self.waiter_timeout),
                &Self::WAITER_TIMEOUT,
            ),
            ("node_timeout", self.node_timeout, &Self::NODE_TIMEOUT),
            ("forget_after", Some(self.forget_after), &Self::FORGET_AFTER),
        ];
        for (key, value, range) in durations {
            if let Some(value) = value {
                service_url::check_duration(key, &format!("{value:?}"), value, range)
                    .map_err(Error::InvalidConfig)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
