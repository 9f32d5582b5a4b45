//! One Redis master: its connection, its subscriber, and the lock scripts run on it (those
//! of the shared and permit kinds in `kinds.rs`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use distlock_core::tls::TlsMaterial;
use distlock_core::{AcquireRequest, AttemptMode, Error, FencingToken, LockKind, LockName, Result};
use redis::Cmd;
use redis::IntoConnectionInfo;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use crate::topology::{ClusterTopology, Conn, Endpoint, SentinelMaster};

use crate::RedisConfig;
use crate::error::{RedisError, RedisErrorKind};
use crate::keys::{LockKeys, Siblings};
use crate::kinds::{self, Holder, held_kind, marker_kind};
use crate::restart::{self, Restarts};
use crate::scripts::{self, Invocation};
use crate::wake::Subscriber;

/// One master: a multiplexed, auto-reconnecting connection and a lazily opened subscriber.
#[derive(Debug)]
pub(crate) struct Node {
    pub(crate) addr: String,
    pub(crate) conn: Conn,
    /// Where the background connections go (election observers' too).
    pub(crate) endpoint: Endpoint,
    pub(crate) sub: Subscriber,
    /// Learns that the server restarted (and forgot its locks), or that a failover replaced
    /// it (Sentinel). `None` for a cluster: each master has its own, in the topology.
    pub(crate) restarts: Option<Arc<Restarts>>,
    /// Whether the server takes `SET ... NX GET` (Redis >= 7.0); cleared at the first
    /// refusal, after which every acquisition runs the script.
    pub(crate) fast_path: AtomicBool,
    /// Locks this client saw contended lately.
    pub(crate) contended: Contended,
}

/// The locks this client saw contended (a refused fast path, a busy answer of the script, a
/// release that found waiters) within the last [`Self::WINDOW`]: their acquisitions go
/// straight to the script, and their releases to the full release script. A refused fast path
/// costs a round trip, so on a contended lock it doubled the round trips of an acquisition
/// (and, while the fast path was a `MULTI` whose `INCR` always ran, the counter's growth:
/// 13,099 values for 6,550 acquisitions in an independent benchmark); the short release script
/// ([`scripts::RELEASE_ALONE`]) costs a round trip when waiters are queued. An uncontended lock
/// keeps both short paths.
#[derive(Debug, Default)]
pub(crate) struct Contended {
    seen: std::sync::Mutex<std::collections::HashMap<String, Instant>>,
}

impl Contended {
    /// How long a refusal sends a lock's acquisitions to the script.
    const WINDOW: Duration = Duration::from_secs(1);
    /// The most locks remembered: past it, the expired entries go (all of them if none has).
    const MAX: usize = 1024;

    fn seen(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, Instant>> {
        self.seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether the fast path of `key` was refused within the window.
    pub(crate) fn lately(&self, key: &str) -> bool {
        self.seen()
            .get(key)
            .is_some_and(|at| at.elapsed() < Self::WINDOW)
    }

    /// Records that `key` was seen contended.
    pub(crate) fn refused(&self, key: &str) {
        let mut seen = self.seen();
        // Seen already (every busy poll of a waiter): no new key to allocate.
        if let Some(at) = seen.get_mut(key) {
            *at = Instant::now();
            return;
        }
        if seen.len() >= Self::MAX {
            seen.retain(|_, at| at.elapsed() < Self::WINDOW);
            if seen.len() >= Self::MAX {
                seen.clear();
            }
        }
        seen.insert(key.to_owned(), Instant::now());
    }

    /// Forgets `key` (its fast path succeeded).
    pub(crate) fn cleared(&self, key: &str) {
        let mut seen = self.seen();
        if !seen.is_empty() {
            seen.remove(key);
        }
    }
}

/// How `rediss://` nodes verify their server and present themselves: read once per backend
/// from [`RedisConfig::tls`](crate::RedisConfig::tls).
#[derive(Clone, Debug, Default)]
pub(crate) struct NodeTls {
    pub(crate) material: TlsMaterial,
    pub(crate) skip_verify: bool,
}

impl NodeTls {
    /// Reads the configuration's TLS files (nothing to read without a `rediss://` node).
    pub(crate) async fn load(config: &RedisConfig) -> Result<Self> {
        let material = if config.is_tls() {
            // The client library builds its rustls configuration with the process's default
            // crypto provider, which rustls cannot choose when another crate of the build
            // (zookeeper-client's TLS) brings a second one: then it panics. Ring, the
            // workspace's provider, becomes the default unless one is installed already.
            let _ = rustls::crypto::ring::default_provider().install_default();
            config.tls.load().await?
        } else {
            TlsMaterial::default()
        };
        if config.danger_skip_verify && config.is_tls() {
            tracing::warn!(
                "danger_skip_verify: the Redis servers' TLS certificates are NOT verified; \
                 anyone on the network path can read and change the lock traffic"
            );
        }
        Ok(Self {
            material,
            skip_verify: config.danger_skip_verify,
        })
    }

    /// The client library's client for the node URL `url` (`redis://`, `rediss://` or
    /// `redis+unix://`), `name`d in `CLIENT SETINFO`.
    pub(crate) fn client(&self, url: &str, name: &str) -> Result<redis::Client> {
        let shown = distlock_core::service_url::redact(url);
        let invalid =
            |e: redis::RedisError| Error::InvalidConfig(format!("invalid Redis URL {shown}: {e}"));
        let tls = url.starts_with("rediss://");
        let info = if tls && self.skip_verify {
            // The client library's spelling of "no verification" is the #insecure fragment.
            format!("{url}#insecure").into_connection_info()
        } else {
            url.into_connection_info()
        }
        .map_err(invalid)?;
        let settings = info
            .redis_settings()
            .clone()
            .set_lib_name(name, env!("CARGO_PKG_VERSION"));
        let info = info.set_redis_settings(settings);
        if !tls {
            return redis::Client::open(info).map_err(invalid);
        }
        let certificates = redis::TlsCertificates {
            client_tls: self
                .material
                .identity
                .clone()
                .map(|(client_cert, client_key)| redis::ClientTlsConfig {
                    client_cert,
                    client_key,
                }),
            root_cert: self.material.ca_pem.clone(),
        };
        redis::Client::build_with_tls(info, certificates).map_err(|e| {
            Error::InvalidConfig(format!(
                "TLS files for {shown}: {}",
                e.detail().unwrap_or("not usable")
            ))
        })
    }
}

/// Why a connection to `addr` that timed out or broke at once cannot work, when the port
/// speaks the other protocol: a plain Redis behind a `rediss://` URL (the TLS handshake waits
/// forever for an answer that never comes), or a TLS-only port behind a `redis://` URL (the
/// server resets the connection at the first clear-text byte). Asked once, in clear text
/// (`PING`), within `timeout`; `None` when that says nothing certain.
async fn wrong_port(addr: &str, tls: bool, timeout: Duration) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let probe = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
        stream.write_all(b"PING\r\n").await.ok()?;
        let mut first = [0u8; 1];
        Some(stream.read(&mut first).await.map(|n| (n, first[0])))
    };
    match (tls, tokio::time::timeout(timeout, probe).await) {
        // A RESP answer (+PONG, -NOAUTH ...) in clear text: a plain Redis port.
        (true, Ok(Some(Ok((1, b'+' | b'-'))))) => Some(
            "the server answers plain Redis, not TLS (use redis://, or the server's TLS port)"
                .into(),
        ),
        // Closed or reset without a byte: not a plain Redis port; a TLS-only one refuses
        // clear text this way.
        (false, Ok(Some(Ok((0, _)) | Err(_)))) => Some(
            "the server closed the connection at the first clear-text byte (a TLS-only port? \
             use rediss://)"
                .into(),
        ),
        _ => None,
    }
}

/// What the release script is asked to do (see [`scripts::RELEASE`] and
/// [`HOLD_RELEASE`](crate::kinds::HOLD_RELEASE)).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReleaseMode {
    Release,
    Abandon,
    Retreat,
    /// End every shared or permit holder (forced release;
    /// [`HOLD_RELEASE`](crate::kinds::HOLD_RELEASE) only).
    Force,
}

impl ReleaseMode {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Release => "release",
            Self::Abandon => "abandon",
            Self::Retreat => "retreat",
            Self::Force => "force",
        }
    }
}

pub(crate) enum Answer {
    Acquired(u64),
    Busy(i64),
    /// The name is held as this kind, which the request can never join.
    Mismatch(LockKind),
}

/// Who holds a lock on one master, as [`Node::inspect`] reads it.
#[derive(Debug)]
pub(crate) enum Holding {
    Free,
    /// An exclusive holder and its remaining lease (ms).
    Exclusive {
        owner: String,
        pttl: i64,
    },
    /// Live shared or permit holders (never empty).
    Holds {
        kind: LockKind,
        holders: Vec<Holder>,
    },
}

impl Node {
    /// Connects to the master of `client` (made by [`NodeTls::client`], or the
    /// application's own), naming the connection `name`. A master that does not answer
    /// within `timeout` still gets a node (connected lazily, retried by the connection
    /// manager) and the failure, for the caller's quorum count.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a database the server does not have.
    pub(crate) async fn connect(
        client: redis::Client,
        name: &str,
        timeout: Duration,
    ) -> Result<(Self, Option<RedisError>)> {
        let info = client.get_connection_info();
        let tls = matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. });
        let addr = info.addr().to_string();
        let db = info.redis_settings().db();
        let manager_config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout))
            .set_number_of_retries(2)
            .set_min_delay(Duration::from_millis(10))
            .set_max_delay(Duration::from_millis(200));
        let eager = tokio::time::timeout(
            timeout,
            ConnectionManager::new_with_config(client.clone(), manager_config.clone()),
        )
        .await
        .unwrap_or_else(|_| {
            Err(redis::RedisError::from((
                redis::ErrorKind::Io,
                "connect timed out",
            )))
        });
        let (conn, failure, run_id) = match eager {
            Ok(mut conn) => {
                // Lets operators (and the tests' fault hooks) find the connection in CLIENT
                // LIST; a reconnected connection is unnamed. Best effort, except that it is
                // the first command: a server that wants credentials (NOAUTH) says so here,
                // at connect time, not at the first lock.
                let named: redis::RedisResult<()> = tokio::time::timeout(
                    timeout,
                    redis::cmd("CLIENT")
                        .arg("SETNAME")
                        .arg(name)
                        .query_async(&mut conn),
                )
                .await
                .unwrap_or(Ok(()));
                if let Err(err) = named
                    && matches!(err.code(), Some("NOAUTH" | "WRONGPASS"))
                {
                    return Err(RedisError::classify(&addr, err).into_lock_error("connect"));
                }
                let run_id = restart::run_id(&mut conn, timeout).await.ok().flatten();
                (conn, None, run_id)
            }
            Err(err) if err.to_string().contains("refused to switch database") => {
                return Err(Error::InvalidConfig(format!(
                    "Redis database {db} does not exist on {addr} (the server has fewer \
                     databases: see `databases` in redis.conf)"
                )));
            }
            Err(err) => {
                let mut failure = RedisError::classify(&addr, err);
                if matches!(
                    failure.kind,
                    RedisErrorKind::Timeout | RedisErrorKind::Connection
                ) && let Some(why) = wrong_port(&addr, tls, timeout / 4).await
                {
                    failure = RedisError::tls(&addr, why);
                }
                let lazy = ConnectionManager::new_lazy_with_config(client.clone(), manager_config)
                    .map_err(|e| RedisError::classify(&addr, e).into_lock_error("connect"))?;
                (lazy, Some(failure), None)
            }
        };
        let restarts = Arc::new(Restarts::new(client.clone(), timeout, run_id));
        let endpoint = Endpoint::Fixed(Box::new(client));
        let sub = Subscriber::new(endpoint.clone(), addr.clone(), timeout);
        let node = Self {
            addr,
            conn: Conn::Direct(conn),
            endpoint,
            sub,
            restarts: Some(restarts),
            fast_path: AtomicBool::new(true),
            contended: Contended::default(),
        };
        Ok((node, failure))
    }

    /// The master the Sentinels name (see [`SentinelMaster`]). Its `run_id` is read at once,
    /// so that a failover later shows as a new one.
    ///
    /// # Errors
    /// As [`SentinelMaster::connect`]; credentials the master refuses.
    pub(crate) async fn sentinel(
        config: &RedisConfig,
        tls: NodeTls,
        timeout: Duration,
    ) -> Result<Self> {
        let master = SentinelMaster::connect(config, tls, timeout).await?;
        let mut conn = Conn::Sentinel(master.clone());
        let addr = master.addr();
        let named: redis::RedisResult<()> = tokio::time::timeout(
            timeout,
            redis::cmd("CLIENT")
                .arg("SETNAME")
                .arg(&config.client_name)
                .query_async(&mut conn),
        )
        .await
        .unwrap_or(Ok(()));
        if let Err(err) = named {
            return Err(RedisError::classify(&addr, err).into_lock_error("connect"));
        }
        let run_id = restart::run_id(&mut conn, timeout)
            .await
            .ok()
            .flatten()
            .map(|id| (id, addr.clone()));
        let restarts = Arc::new(Restarts::sentinel(Arc::downgrade(&master), timeout, run_id));
        let endpoint = Endpoint::Sentinel(master);
        let sub = Subscriber::new(endpoint.clone(), addr.clone(), timeout);
        Ok(Self {
            addr: format!(
                "sentinel master {:?}",
                config.sentinel_master.as_deref().unwrap_or("")
            ),
            conn,
            endpoint,
            sub,
            restarts: Some(restarts),
            fast_path: AtomicBool::new(true),
            contended: Contended::default(),
        })
    }

    /// A Redis Cluster (see [`ClusterTopology`]).
    ///
    /// # Errors
    /// As [`ClusterTopology::connect`].
    pub(crate) async fn cluster(
        config: &RedisConfig,
        tls: NodeTls,
        timeout: Duration,
    ) -> Result<Self> {
        let topology = ClusterTopology::connect(config, tls, timeout).await?;
        let conn = Conn::Cluster(topology.conn.clone());
        let addr = "cluster".to_owned();
        let endpoint = Endpoint::Cluster(topology);
        let sub = Subscriber::new(endpoint.clone(), addr.clone(), timeout);
        Ok(Self {
            addr,
            conn,
            endpoint,
            sub,
            restarts: None,
            fast_path: AtomicBool::new(true),
            contended: Contended::default(),
        })
    }

    /// A failure of a request: a read-only answer on a Sentinel or Cluster master means a
    /// failover demoted it (the master is looked up again): retryable.
    pub(crate) fn classify(&self, e: redis::RedisError) -> RedisError {
        let mut error = RedisError::classify(&self.addr, e);
        if error.kind == RedisErrorKind::ReadOnly && !matches!(self.conn, Conn::Direct(_)) {
            error.kind = RedisErrorKind::Failover;
        }
        error
    }

    /// The cluster's topology, for a cluster node.
    pub(crate) fn cluster_topology(&self) -> Option<&Arc<ClusterTopology>> {
        match &self.endpoint {
            Endpoint::Cluster(topology) => Some(topology),
            _ => None,
        }
    }

    /// One acquisition attempt. `fast`: try the fast path first (see
    /// [`Self::acquire_fast`]).
    pub(crate) async fn acquire(
        &self,
        keys: &LockKeys,
        request: &AcquireRequest,
        config: &RedisConfig,
        score: &str,
        fast: bool,
    ) -> Result<Answer, RedisError> {
        if request.kind != LockKind::Exclusive {
            return self.acquire_hold(keys, request, config, score).await;
        }
        if fast && self.fast_path.load(Ordering::Relaxed) && !self.contended.lately(&keys.lock) {
            match self.acquire_fast(keys, request, config).await {
                Ok(Some(answer)) => {
                    if matches!(answer, Answer::Acquired(_)) {
                        self.contended.cleared(&keys.lock);
                    } else {
                        self.contended.refused(&keys.lock);
                    }
                    return self.replicated(answer, keys, request, config).await;
                }
                Ok(None) => self.contended.refused(&keys.lock),
                Err(err) if err.kind == RedisErrorKind::Unsupported => {
                    tracing::debug!(node = %self.addr, "SET NX GET refused (Redis < 7.0): acquiring by script only");
                    self.fast_path.store(false, Ordering::Relaxed);
                }
                Err(err) => return Err(err),
            }
        }
        let mut conn = self.conn.clone();
        let answer: Answer = Invocation::new(
            &scripts::ACQUIRE,
            &[&keys.lock, &keys.fence, &keys.queue, &keys.alive],
        )
        .arg(&*request.owner)
        .arg(millis(request.ttl))
        .arg(if request.mode == AttemptMode::Wait {
            "1"
        } else {
            "0"
        })
        .arg(if config.fair { "1" } else { "0" })
        .arg(millis(config.waiter_timeout_for(request.ttl)))
        .arg(score)
        .arg(seed_floor(config))
        .arg(millis(config.forget_after))
        .invoke(&mut conn)
        .await
        .map_err(|e| self.classify(e))?;

        if matches!(answer, Answer::Busy(_)) {
            // Taken (also in fair mode, which never tries the fast path): this lock's
            // release goes straight to the full script.
            self.contended.refused(&keys.lock);
        }
        self.replicated(answer, keys, request, config).await
    }

    /// With [`RedisConfig::wait_replicas`]: an acquisition counts once that many replicas
    /// acknowledged it (`WAIT` on the master's connection that ran the script); otherwise it is
    /// given back and the attempt fails with a retryable error.
    async fn replicated(
        &self,
        answer: Answer,
        keys: &LockKeys,
        request: &AcquireRequest,
        config: &RedisConfig,
    ) -> Result<Answer, RedisError> {
        if config.wait_replicas == 0 || !matches!(answer, Answer::Acquired(_)) {
            return Ok(answer);
        }
        let mut wait = Cmd::new();
        wait.arg("WAIT")
            .arg(config.wait_replicas)
            .arg(millis(config.wait_timeout));
        let acked = self
            .conn
            .on_master_of(&keys.lock, &wait)
            .await
            .and_then(|v| redis::from_redis_value::<i64>(v).map_err(redis::RedisError::from))
            .map_err(|e| self.classify(e))?;
        if acked >= i64::from(config.wait_replicas) {
            return Ok(answer);
        }
        let _ = self
            .release(
                keys,
                &request.owner,
                config,
                ReleaseMode::Abandon,
                request.kind,
            )
            .await;
        Err(RedisError {
            kind: RedisErrorKind::Timeout,
            node: self.addr.clone(),
            source: Some(redis::RedisError::from((
                redis::ErrorKind::Io,
                "too few replicas acknowledged the acquisition (wait_replicas)",
            ))),
        })
    }

    /// A shared or permit acquisition attempt (see [`kinds::acquire_call`]).
    async fn acquire_hold(
        &self,
        keys: &LockKeys,
        request: &AcquireRequest,
        config: &RedisConfig,
        score: &str,
    ) -> Result<Answer, RedisError> {
        let mut conn = self.conn.clone();
        let answer: Answer = kinds::acquire_call(keys, request, config, score)
            .invoke(&mut conn)
            .await
            .map_err(|e| self.classify(e))?;
        self.replicated(answer, keys, request, config).await
    }

    /// The uncontended path: [`scripts::ACQUIRE_FAST`], `SET lock owner NX PX ttl GET` and,
    /// only if that took the lock, the next token (`INCR fence`; clock tokens and unseeded
    /// counters by the acquire scripts' rule), atomically, so tokens strictly increase per
    /// acquisition and a refused attempt burns no counter value. A reservation for a waiter
    /// lives in the lock key itself, so `NX` also refuses a reserved lock.
    ///
    /// `None`: the script must decide (the key is this attempt's own value or reservation, or
    /// a waiting attempt must be queued).
    async fn acquire_fast(
        &self,
        keys: &LockKeys,
        request: &AcquireRequest,
        config: &RedisConfig,
    ) -> Result<Option<Answer>, RedisError> {
        let mut conn = self.conn.clone();
        let reply: FastReply = Invocation::new(&scripts::ACQUIRE_FAST, &[&keys.lock, &keys.fence])
            .arg(&*request.owner)
            .arg(millis(request.ttl))
            .arg(seed_floor(config))
            .arg(millis(config.forget_after))
            .invoke(&mut conn)
            .await
            .map_err(|e| self.classify(e))?;
        let previous = match reply {
            FastReply::Token(token) => return Ok(Some(Answer::Acquired(token))),
            FastReply::Taken(previous) => previous,
        };
        // A permit marker in the lock key: the name is a semaphore (not an `if let` guard:
        // the declared rust-version predates them).
        let permits = marker_kind(&previous).filter(|kind| matches!(kind, LockKind::Permit { .. }));
        Ok(if permits.is_some() {
            permits.map(Answer::Mismatch)
        } else if request.mode == AttemptMode::Wait || is_own(&previous, &request.owner) {
            None
        } else {
            Some(Answer::Busy(-1))
        })
    }

    pub(crate) async fn renew(
        &self,
        keys: &LockKeys,
        owner: &str,
        ttl: Duration,
        kind: LockKind,
    ) -> Result<bool, RedisError> {
        let mut conn = self.conn.clone();
        let renewed: i64 = if kind == LockKind::Exclusive {
            Invocation::new(&scripts::RENEW, &[&keys.lock])
                .arg(owner)
                .arg(millis(ttl))
        } else {
            kinds::renew_call(keys, owner, ttl, kind)
        }
        .invoke(&mut conn)
        .await
        .map_err(|e| self.classify(e))?;
        Ok(renewed == 1)
    }

    pub(crate) async fn release(
        &self,
        keys: &LockKeys,
        owner: &str,
        config: &RedisConfig,
        mode: ReleaseMode,
        kind: LockKind,
    ) -> Result<bool, RedisError> {
        if kind == LockKind::Exclusive {
            return self.release_lock(&keys.lock, owner, config, mode).await;
        }
        let mut conn = self.conn.clone();
        let released: i64 = kinds::release_call(keys, owner, config, mode, kind)
            .invoke(&mut conn)
            .await
            .map_err(|e| self.classify(e))?;
        Ok(released == 1)
    }

    /// [`Self::release`] of an exclusive lock, from its lock key alone (see [`Siblings`]).
    pub(crate) async fn release_lock(
        &self,
        lock: &str,
        owner: &str,
        config: &RedisConfig,
        mode: ReleaseMode,
    ) -> Result<bool, RedisError> {
        let mut conn = self.conn.clone();
        if mode == ReleaseMode::Release && !self.contended.lately(lock) {
            let queue = crate::keys::queue_of(lock);
            let released: i64 = Invocation::new(&scripts::RELEASE_ALONE, &[lock, &queue])
                .arg(owner)
                .invoke(&mut conn)
                .await
                .map_err(|e| self.classify(e))?;
            if released == 1 {
                return Ok(true);
            }
            // Waiters queued (or the lock is lost): the full script decides, and the next
            // acquisitions of this lock know it is contended.
            self.contended.refused(lock);
        }
        let siblings = Siblings::of(lock);
        let released: i64 = Invocation::new(
            &scripts::RELEASE,
            &[lock, siblings.queue(), siblings.alive()],
        )
        .arg(owner)
        .arg(if config.fair { "1" } else { "0" })
        .arg(millis(config.handoff))
        .arg(siblings.channel())
        .arg(mode.as_str())
        .invoke(&mut conn)
        .await
        .map_err(|e| self.classify(e))?;
        Ok(released == 1)
    }

    /// Raises the fencing counter to at least `token`, kept for `keep` (see
    /// [`scripts::RAISE_FENCE`]).
    pub(crate) async fn raise_fence(
        &self,
        keys: &LockKeys,
        token: u64,
        keep: Duration,
    ) -> Result<(), RedisError> {
        let mut conn = self.conn.clone();
        let _: i64 = Invocation::new(&scripts::RAISE_FENCE, &[&keys.fence])
            .arg(token)
            .arg(millis(keep))
            .invoke(&mut conn)
            .await
            .map_err(|e| self.classify(e))?;
        Ok(())
    }

    /// Frees the lock whoever holds it: reads the holder and runs the owner-checked release
    /// script as that owner (shared or permit holders: the hold release script ending them
    /// all), so waiters are handed the lock and woken exactly as by a release. The fencing
    /// counter is untouched. `false`: free (or only reserved for a waiter).
    pub(crate) async fn force_release(
        &self,
        keys: &LockKeys,
        config: &RedisConfig,
    ) -> Result<bool, RedisError> {
        for _ in 0..8 {
            let (owner, mode, kind) = match self.inspect(keys).await? {
                Holding::Free => return Ok(false),
                Holding::Exclusive { owner, .. } => {
                    (owner, ReleaseMode::Release, LockKind::Exclusive)
                }
                Holding::Holds { kind, .. } => (String::new(), ReleaseMode::Force, kind),
            };
            if self.release(keys, &owner, config, mode, kind).await? {
                return Ok(true);
            }
            // The holder changed between the read and the script: look again.
        }
        Ok(false)
    }

    /// The names whose lock key exists and starts with `prefix`, by `SCAN` (never `KEYS`), until
    /// the scan ends or `enough` are found.
    pub(crate) async fn scan_names(
        &self,
        prefix: &str,
        enough: usize,
    ) -> Result<Vec<LockName>, RedisError> {
        self.scan_names_on(self.conn.clone(), prefix, enough).await
    }

    /// [`Self::scan_names`] on `conn` (a cluster master's own connection).
    pub(crate) async fn scan_names_on(
        &self,
        mut conn: impl redis::aio::ConnectionLike,
        prefix: &str,
        enough: usize,
    ) -> Result<Vec<LockName>, RedisError> {
        let pattern = crate::keys::lock_key_pattern(prefix);
        let mut names = std::collections::BTreeSet::new();
        self.scan(&mut conn, &pattern, |keys| {
            names.extend(keys.iter().filter_map(|k| crate::keys::name_of_lock_key(k)));
            names.len() < enough
        })
        .await?;
        Ok(names.into_iter().collect())
    }

    /// `SCAN MATCH pattern` on `conn`, each batch of keys given to `each` until it answers
    /// `false` or the scan is complete.
    async fn scan(
        &self,
        conn: &mut impl redis::aio::ConnectionLike,
        pattern: &str,
        mut each: impl FnMut(&[String]) -> bool,
    ) -> Result<(), RedisError> {
        let mut cursor: u64 = 0;
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(conn)
                .await
                .map_err(|e| self.classify(e))?;
            cursor = next;
            if !each(&keys) || cursor == 0 {
                return Ok(());
            }
        }
    }

    /// Counts the keys of every kind of the names starting with `prefix` on `conn` (one
    /// master), into `footprint`, by kind (see [`crate::keys::kind_of_key`]).
    pub(crate) async fn count_keys_on(
        &self,
        mut conn: impl redis::aio::ConnectionLike,
        prefix: &str,
        footprint: &mut distlock_core::Footprint,
    ) -> Result<(), RedisError> {
        let pattern = crate::keys::any_key_pattern(prefix);
        self.scan(&mut conn, &pattern, |keys| {
            for kind in keys.iter().filter_map(|k| crate::keys::kind_of_key(k)) {
                footprint.add(kind, 1);
            }
            true
        })
        .await
    }

    /// Who holds the lock. An exclusive holder's token cannot be told: the fence counter
    /// can be ahead of it (under Redlock, each master's counter is raised to the highest
    /// token handed out), so it is only an upper bound, and is not reported. Shared and permit
    /// holders are read from their sorted set (live: lease not over by the server's clock)
    /// with their tokens, in a second round trip.
    pub(crate) async fn inspect(&self, keys: &LockKeys) -> Result<Holding, RedisError> {
        let classify = |e| self.classify(e);
        let mut conn = self.conn.clone();
        let (value, pttl): (Option<Vec<u8>>, i64) = redis::pipe()
            .get(&keys.lock)
            .pttl(&keys.lock)
            .query_async(&mut conn)
            .await
            .map_err(classify)?;
        let Some(value) = value else {
            return Ok(Holding::Free);
        };
        if let Some(kind) = marker_kind(&value) {
            return kinds::read_holders(&mut conn, keys, kind)
                .await
                .map_err(classify);
        }
        // A reservation for a waiter is nobody's lock (yet).
        match String::from_utf8(value) {
            Ok(owner) if !owner.starts_with(scripts::RESERVED_PREFIX) => {
                Ok(Holding::Exclusive { owner, pttl })
            }
            _ => Ok(Holding::Free),
        }
    }
}

/// The acquire scripts' seed floor argument: [`scripts::SEED_FLOOR`], or 0 for tokens of at
/// least the server's clock ([`RedisConfig::clock_tokens`]).
pub(crate) fn seed_floor(config: &RedisConfig) -> u64 {
    if config.clock_tokens {
        0
    } else {
        scripts::SEED_FLOOR
    }
}

/// A script's `{code, value}` answer (see [`scripts::ACQUIRE`],
/// [`HOLD_ACQUIRE`](crate::kinds::HOLD_ACQUIRE)); a granted token is checked by
/// [`FencingToken::from_server`].
impl redis::FromRedisValue for Answer {
    fn from_redis_value(value: redis::Value) -> Result<Self, redis::ParsingError> {
        let (code, value): (i64, i64) = redis::FromRedisValue::from_redis_value(value)?;
        Ok(match code {
            1 => Self::Acquired(
                FencingToken::from_server(value, "the acquire script's counter")
                    .map_err(|err| err.to_string())?
                    .get(),
            ),
            2 => Self::Mismatch(held_kind(value)),
            _ => Self::Busy(value),
        })
    }
}

/// The answer of [`scripts::ACQUIRE_FAST`].
enum FastReply {
    /// The lock key's value: the `SET` was refused.
    Taken(Vec<u8>),
    /// The `SET` took the lock and the counter stepped to this value.
    Token(u64),
}

impl redis::FromRedisValue for FastReply {
    fn from_redis_value(value: redis::Value) -> Result<Self, redis::ParsingError> {
        match value {
            redis::Value::BulkString(taken) => Ok(Self::Taken(taken)),
            redis::Value::Int(token) => FencingToken::from_server(token, "the fast path's counter")
                .map(|token| Self::Token(token.get()))
                .map_err(|err| err.to_string().into()),
            other => Err(format!("the fast path answered {other:?}").into()),
        }
    }
}

/// Whether a lock key's value is `owner` or a reservation for it.
pub(crate) fn is_own(value: &[u8], owner: &str) -> bool {
    let reserved = scripts::RESERVED_PREFIX.as_bytes();
    value == owner.as_bytes()
        || value
            .strip_prefix(reserved)
            .is_some_and(|rest| rest == owner.as_bytes())
}

pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// Runs `fut` with a per-node timeout.
pub(crate) async fn within<T>(
    node: &Node,
    timeout: Duration,
    fut: impl Future<Output = Result<T, RedisError>>,
) -> Result<T, RedisError> {
    tokio::time::timeout(timeout, fut)
        .await
        .unwrap_or_else(|_| Err(RedisError::timeout(&node.addr)))
}

#[cfg(test)]
mod tests {
    use super::Contended;

    #[test]
    fn a_refused_fast_path_is_remembered_until_it_succeeds() {
        let contended = Contended::default();
        assert!(!contended.lately("a"));
        contended.refused("a");
        assert!(contended.lately("a"));
        assert!(!contended.lately("b"));
        contended.cleared("a");
        assert!(!contended.lately("a"));
    }

    #[test]
    fn the_memory_is_bounded() {
        let contended = Contended::default();
        for i in 0..Contended::MAX * 3 {
            contended.refused(&i.to_string());
            assert!(contended.seen().len() <= Contended::MAX);
        }
        // The newest one is always remembered.
        assert!(contended.lately(&(Contended::MAX * 3 - 1).to_string()));
    }
}
