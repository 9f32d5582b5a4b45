//! The backend: one master or Redlock over several, speaking the scripts of [`crate::scripts`].

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use distlock_core::{
    AcquireRequest, Acquired, Attempt, AttemptMode, Capabilities, ClientConfig, Error,
    FencingGuarantee, FencingToken, Lease, LockBackend, LockInfo, LockName, LossDetection,
    NodeOutcome, NodeResult, Result, Step, WakeUp,
};
use futures::future::join_all;
use rand::Rng;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Cmd, IntoConnectionInfo};

use crate::RedisConfig;
use crate::error::{RedisError, RedisErrorKind};
use crate::keys::LockKeys;
use crate::scripts::{self, Invocation};
use crate::subscriber::{Subscriber, Subscription};

/// The Redis [`LockBackend`]: one master (`redis`) or Redlock over N masters (`redlock`).
/// Made by [`connect`](crate::connect) or [`RedisBackend::connect`]. Cheap to clone.
#[derive(Clone, Debug)]
pub struct RedisBackend {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    nodes: Vec<Node>,
    config: RedisConfig,
    client: ClientConfig,
}

/// One master: a multiplexed, auto-reconnecting connection and a lazily opened subscriber.
#[derive(Debug)]
struct Node {
    addr: String,
    conn: ConnectionManager,
    sub: Subscriber,
    /// Whether the server takes `SET ... NX GET` (Redis >= 7.0); cleared at the first
    /// refusal, after which every acquisition runs the script.
    fast_path: AtomicBool,
}

/// What the release script is asked to do (see [`scripts::RELEASE`]).
#[derive(Clone, Copy)]
enum ReleaseMode {
    Release,
    Abandon,
    Retreat,
}

enum Answer {
    Acquired(u64),
    Busy(i64),
}

impl Node {
    /// One acquisition attempt. `fast`: try the script-free fast path first (see
    /// [`Self::acquire_fast`]).
    async fn acquire(
        &self,
        keys: &LockKeys,
        request: &AcquireRequest,
        config: &RedisConfig,
        score: &str,
        fast: bool,
    ) -> Result<Answer, RedisError> {
        if fast && self.fast_path.load(Ordering::Relaxed) {
            match self.acquire_fast(keys, request).await {
                Ok(Some(answer)) => return Ok(answer),
                Ok(None) => {}
                Err(err) if err.kind == RedisErrorKind::Unsupported => {
                    tracing::debug!(node = %self.addr, "SET NX GET refused (Redis < 7.0): acquiring by script only");
                    self.fast_path.store(false, Ordering::Relaxed);
                }
                Err(err) => return Err(err),
            }
        }
        let mut conn = self.conn.clone();
        let (acquired, value): (i64, i64) = Invocation::new(
            &scripts::ACQUIRE,
            &[&keys.lock, &keys.fence, &keys.queue, &keys.alive],
        )
        .arg(&request.owner)
        .arg(millis(request.ttl))
        .arg(if request.mode == AttemptMode::Wait {
            "1"
        } else {
            "0"
        })
        .arg(if config.fair { "1" } else { "0" })
        .arg(millis(config.waiter_timeout))
        .arg(score)
        .invoke(&mut conn)
        .await
        .map_err(|e| RedisError::classify(&self.addr, e))?;
        Ok(if acquired == 1 {
            Answer::Acquired(u64::try_from(value).unwrap_or(0))
        } else {
            Answer::Busy(value)
        })
    }

    /// The uncontended path without Lua (scripts cost several times a plain command on the
    /// server): `MULTI; SET lock owner NX PX ttl GET; INCR fence; EXEC`. The transaction makes
    /// the counter step atomic with the `SET`, so tokens still strictly increase per
    /// acquisition; a refused `SET` burns a counter value, which is harmless. A reservation
    /// for a waiter lives in the lock key itself, so `NX` also refuses a reserved lock.
    ///
    /// `None`: the script must decide (the key is this attempt's own value or reservation, or
    /// a waiting attempt must be queued).
    async fn acquire_fast(
        &self,
        keys: &LockKeys,
        request: &AcquireRequest,
    ) -> Result<Option<Answer>, RedisError> {
        // Commands sized up front (see `scripts::Invocation`).
        let mut set = Cmd::with_capacity(7, 32 + keys.lock.len() + request.owner.len());
        set.arg("SET")
            .arg(&keys.lock)
            .arg(&request.owner)
            .arg("NX")
            .arg("PX")
            .arg(millis(request.ttl))
            .arg("GET");
        let mut incr = Cmd::with_capacity(2, 4 + keys.fence.len());
        incr.arg("INCR").arg(&keys.fence);
        let mut conn = self.conn.clone();
        let (previous, token): (Option<Vec<u8>>, u64) = redis::Pipeline::with_capacity(2)
            .atomic()
            .add_command(set)
            .add_command(incr)
            .query_async(&mut conn)
            .await
            .map_err(|e| RedisError::classify(&self.addr, e))?;
        Ok(match previous {
            None => Some(Answer::Acquired(token)),
            Some(_) if request.mode == AttemptMode::Wait => None,
            Some(value) if is_own(&value, &request.owner) => None,
            Some(_) => Some(Answer::Busy(-1)),
        })
    }

    async fn renew(&self, keys: &LockKeys, owner: &str, ttl: Duration) -> Result<bool, RedisError> {
        let mut conn = self.conn.clone();
        let renewed: i64 = Invocation::new(&scripts::RENEW, &[&keys.lock])
            .arg(owner)
            .arg(millis(ttl))
            .invoke(&mut conn)
            .await
            .map_err(|e| RedisError::classify(&self.addr, e))?;
        Ok(renewed == 1)
    }

    async fn release(
        &self,
        keys: &LockKeys,
        owner: &str,
        config: &RedisConfig,
        mode: ReleaseMode,
    ) -> Result<bool, RedisError> {
        let mut conn = self.conn.clone();
        let released: i64 =
            Invocation::new(&scripts::RELEASE, &[&keys.lock, &keys.queue, &keys.alive])
                .arg(owner)
                .arg(if config.fair { "1" } else { "0" })
                .arg(millis(config.handoff))
                .arg(&keys.channel)
                .arg(match mode {
                    ReleaseMode::Release => "release",
                    ReleaseMode::Abandon => "abandon",
                    ReleaseMode::Retreat => "retreat",
                })
                .invoke(&mut conn)
                .await
                .map_err(|e| RedisError::classify(&self.addr, e))?;
        Ok(released == 1)
    }

    async fn raise_fence(&self, keys: &LockKeys, token: u64) -> Result<(), RedisError> {
        let mut conn = self.conn.clone();
        let _: i64 = Invocation::new(&scripts::RAISE_FENCE, &[&keys.fence])
            .arg(token)
            .invoke(&mut conn)
            .await
            .map_err(|e| RedisError::classify(&self.addr, e))?;
        Ok(())
    }

    /// Frees the lock whoever holds it: reads the holder and runs the owner-checked release
    /// script as that owner, so waiters are handed the lock and woken exactly as by a release.
    /// The fencing counter is untouched. `false`: free (or only reserved for a waiter).
    async fn force_release(
        &self,
        keys: &LockKeys,
        config: &RedisConfig,
    ) -> Result<bool, RedisError> {
        for _ in 0..8 {
            let (owner, _, _) = self.inspect(keys).await?;
            let Some(owner) = owner else {
                return Ok(false);
            };
            if self
                .release(keys, &owner, config, ReleaseMode::Release)
                .await?
            {
                return Ok(true);
            }
            // The holder changed between the read and the script: look again.
        }
        Ok(false)
    }

    /// The names whose lock key exists and starts with `prefix`, by `SCAN` (never `KEYS`), until
    /// the scan ends or `enough` are found.
    async fn scan_names(&self, prefix: &str, enough: usize) -> Result<Vec<LockName>, RedisError> {
        let pattern = crate::keys::lock_key_pattern(prefix);
        let mut conn = self.conn.clone();
        let mut names = std::collections::BTreeSet::new();
        let mut cursor: u64 = 0;
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut conn)
                .await
                .map_err(|e| RedisError::classify(&self.addr, e))?;
            names.extend(keys.iter().filter_map(|k| crate::keys::name_of_lock_key(k)));
            cursor = next;
            if cursor == 0 || names.len() >= enough {
                return Ok(names.into_iter().collect());
            }
        }
    }

    async fn inspect(
        &self,
        keys: &LockKeys,
    ) -> Result<(Option<String>, Option<u64>, i64), RedisError> {
        let mut conn = self.conn.clone();
        let (owner, token, pttl): (Option<String>, Option<u64>, i64) = redis::pipe()
            .get(&keys.lock)
            .get(&keys.fence)
            .pttl(&keys.lock)
            .query_async(&mut conn)
            .await
            .map_err(|e| RedisError::classify(&self.addr, e))?;
        // A reservation for a waiter is nobody's lock (yet).
        let owner = owner.filter(|o| !o.starts_with(scripts::RESERVED_PREFIX));
        Ok((owner, token, pttl))
    }
}

/// Whether a lock key's value is `owner` or a reservation for it.
fn is_own(value: &[u8], owner: &str) -> bool {
    let reserved = scripts::RESERVED_PREFIX.as_bytes();
    value == owner.as_bytes()
        || value
            .strip_prefix(reserved)
            .is_some_and(|rest| rest == owner.as_bytes())
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// Runs `fut` with a per-node timeout.
async fn within<T>(
    node: &Node,
    timeout: Duration,
    fut: impl Future<Output = Result<T, RedisError>>,
) -> Result<T, RedisError> {
    tokio::time::timeout(timeout, fut)
        .await
        .unwrap_or_else(|_| Err(RedisError::timeout(&node.addr)))
}

impl RedisBackend {
    /// Connects to the nodes of `config`. One master must answer within the operation
    /// timeout; for Redlock, a majority must (the others are connected lazily and retried).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a bad configuration, [`Error::Unavailable`] when the
    /// server(s) cannot be reached in time.
    pub async fn connect(config: RedisConfig, client: ClientConfig) -> Result<Self> {
        config.validate()?;
        client.validate()?;
        let timeout = client.operation_timeout;
        let connects = config.nodes.iter().map(|url| {
            let name = config.client_name.clone();
            async move {
                let info = url
                    .as_str()
                    .into_connection_info()
                    .map_err(|e| Error::InvalidConfig(format!("invalid Redis URL {url:?}: {e}")))?;
                let addr = info.addr().to_string();
                let settings = info
                    .redis_settings()
                    .clone()
                    .set_lib_name(&name, env!("CARGO_PKG_VERSION"));
                let info = info.set_redis_settings(settings);
                let db = info.redis_settings().db();
                let client = redis::Client::open(info)
                    .map_err(|e| Error::InvalidConfig(format!("invalid Redis URL {url:?}: {e}")))?;
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
                let (conn, failure) = match eager {
                    Ok(mut conn) => {
                        // Lets operators (and the tests' fault hooks) find the connection in
                        // CLIENT LIST; a reconnected connection is unnamed. Best effort.
                        let _: redis::RedisResult<()> = tokio::time::timeout(
                            timeout,
                            redis::cmd("CLIENT")
                                .arg("SETNAME")
                                .arg(&name)
                                .query_async(&mut conn),
                        )
                        .await
                        .unwrap_or(Ok(()));
                        (conn, None)
                    }
                    Err(err) if err.to_string().contains("refused to switch database") => {
                        return Err(Error::InvalidConfig(format!(
                            "Redis database {} does not exist on {addr} (the server has fewer \
                             databases: see `databases` in redis.conf)",
                            db
                        )));
                    }
                    Err(err) => {
                        let failure = RedisError::classify(&addr, err);
                        let lazy =
                            ConnectionManager::new_lazy_with_config(client.clone(), manager_config)
                                .map_err(|e| {
                                    RedisError::classify(&addr, e).into_lock_error("connect")
                                })?;
                        (lazy, Some(failure))
                    }
                };
                let sub = Subscriber::new(client, addr.clone(), timeout);
                let node = Node {
                    addr,
                    conn,
                    sub,
                    fast_path: AtomicBool::new(true),
                };
                Ok::<_, Error>((node, failure))
            }
        });
        let mut nodes = Vec::new();
        let mut failures = Vec::new();
        for result in join_all(connects).await {
            let (node, failure) = result?;
            if let Some(failure) = failure {
                failures.push(failure);
            }
            nodes.push(node);
        }
        let reachable = nodes.len() - failures.len();
        if reachable < config.quorum() {
            let mut failures = failures.into_iter();
            return Err(match (config.redlock, failures.next()) {
                (false, Some(failure)) => failure.into_lock_error("connect"),
                (_, first) => Error::Unavailable {
                    message: format!(
                        "only {reachable} of {} Redis masters reachable, {} needed{}",
                        nodes.len(),
                        config.quorum(),
                        first
                            .as_ref()
                            .map(|f| format!(" ({}: {})", f.node, f.kind))
                            .unwrap_or_default()
                    ),
                    source: first.map(Into::into),
                },
            });
        }
        Ok(Self {
            shared: Arc::new(Shared {
                nodes,
                config,
                client,
            }),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &RedisConfig {
        &self.shared.config
    }
}

impl Shared {
    fn redlock(&self) -> bool {
        self.config.redlock
    }

    fn quorum(&self) -> usize {
        self.config.quorum()
    }

    /// Redlock's per-node timeout: much smaller than the ttl.
    fn node_timeout(&self, ttl: Duration) -> Duration {
        let op = self.client.operation_timeout;
        self.config
            .node_timeout
            .unwrap_or_else(|| (ttl / 10).max(Duration::from_millis(5)))
            .min(op)
    }

    /// Per-node timeout of releases and abandons: not time-critical, but must end before
    /// the core's operation timeout.
    fn cleanup_timeout(&self) -> Duration {
        self.client.operation_timeout * 3 / 4
    }

    /// How often a waiter must poll to stay in the queue.
    fn refresh(&self) -> Duration {
        self.config.waiter_timeout / 3
    }
}

#[async_trait]
impl LockBackend for RedisBackend {
    fn name(&self) -> &'static str {
        if self.shared.redlock() {
            "redlock"
        } else {
            "redis"
        }
    }

    fn capabilities(&self) -> Capabilities {
        let redlock = self.shared.redlock();
        let fencing = if redlock {
            FencingGuarantee::BestEffort
        } else {
            FencingGuarantee::SingleNode
        };
        let min_ttl = if redlock {
            Duration::from_millis(10)
        } else {
            Duration::from_millis(1)
        };
        Capabilities::new(fencing)
            .with_fifo(self.shared.config.fair && !redlock)
            .with_wake_up(WakeUp::Event)
            .with_ttl_range(min_ttl, Duration::from_secs(7 * 24 * 3600))
            .with_loss_detection(LossDetection::Renewal)
            .with_list(true)
            .with_force_release(true)
    }

    fn begin(&self, request: AcquireRequest) -> Box<dyn Attempt> {
        let keys = Arc::new(LockKeys::new(&request.name));
        // Redlock: every node must order waiters alike, so the arrival score comes from here
        // (a client's clock only orders waiters; it never decides who holds the lock).
        let score = if self.shared.redlock() {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_micros().to_string())
                .unwrap_or_default()
        } else {
            String::new()
        };
        Box::new(RedisAttempt {
            shared: self.shared.clone(),
            keys,
            request,
            score,
            subs: Vec::new(),
            settled: false,
            polled: false,
        })
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        let keys = LockKeys::new(name);
        let shared = &self.shared;
        if !shared.redlock() {
            let node = &shared.nodes[0];
            let (owner, token, pttl) = node
                .inspect(&keys)
                .await
                .map_err(|e| e.into_lock_error("inspect"))?;
            return Ok(owner
                .map(|owner| LockInfo::new(owner, token.map(FencingToken::new), remaining(pttl))));
        }
        let timeout = shared.client.operation_timeout;
        let answers = join_all(
            shared
                .nodes
                .iter()
                .map(|n| within(n, timeout, n.inspect(&keys))),
        )
        .await;
        let held: Vec<_> = answers
            .into_iter()
            .filter_map(|a| a.ok())
            .filter_map(|(owner, token, pttl)| owner.map(|o| (o, token, pttl)))
            .collect();
        for (owner, _, _) in &held {
            let same: Vec<_> = held.iter().filter(|(o, _, _)| o == owner).collect();
            if same.len() >= shared.quorum() {
                let token = same.iter().filter_map(|(_, t, _)| *t).max();
                let pttl = same.iter().map(|(_, _, p)| *p).min().unwrap_or(-1);
                return Ok(Some(LockInfo::new(
                    owner.clone(),
                    token.map(FencingToken::new),
                    remaining(pttl),
                )));
            }
        }
        Ok(None)
    }

    /// `SCAN` over the lock keys (one master), then each candidate is read as
    /// [`inspect`](LockBackend::inspect) reads it. Redlock: the names found on any node, each
    /// reported only if a majority agrees on its holder (the same view `inspect` gives), so a
    /// lock held on a minority only is not listed; fails when fewer than a majority of nodes
    /// can be scanned.
    async fn list(&self, prefix: Option<&str>, limit: usize) -> Result<Vec<(LockName, LockInfo)>> {
        let shared = &self.shared;
        let prefix = prefix.unwrap_or("");
        // Candidates include reservations and keys expiring meanwhile: scan for some more.
        let enough = limit.saturating_mul(2).max(limit.saturating_add(16));
        let timeout = shared.client.operation_timeout;
        let scans = join_all(
            shared
                .nodes
                .iter()
                .map(|n| within(n, timeout, n.scan_names(prefix, enough))),
        )
        .await;
        let mut candidates = std::collections::BTreeSet::new();
        let mut answered = 0;
        let mut failure = None;
        for scan in scans {
            match scan {
                Ok(names) => {
                    answered += 1;
                    candidates.extend(names);
                }
                Err(err) => failure = Some(err),
            }
        }
        if answered < shared.quorum() {
            return Err(match failure {
                Some(err) if !shared.redlock() => err.into_lock_error("list"),
                failure => Error::Unavailable {
                    message: format!(
                        "list reached {answered} of {} Redis masters, {} needed",
                        shared.nodes.len(),
                        shared.quorum()
                    ),
                    source: failure.map(Into::into),
                },
            });
        }
        let mut held = Vec::new();
        for name in candidates {
            if held.len() >= limit {
                break;
            }
            if let Some(info) = self.inspect(&name).await? {
                held.push((name, info));
            }
        }
        Ok(held)
    }

    /// Runs the release script as the current holder (see `Node::force_release`) on every
    /// node: waiters get the same handoff and pub/sub wake-up as after a release, and the
    /// fencing counters are kept, so the next token is higher. Redlock: `true` if any node held
    /// it; fails unless a majority of nodes answered (the others free it at expiry).
    async fn force_release(&self, name: &LockName) -> Result<bool> {
        let keys = LockKeys::new(name);
        let shared = &self.shared;
        if !shared.redlock() {
            return shared.nodes[0]
                .force_release(&keys, &shared.config)
                .await
                .map_err(|e| e.into_lock_error("force release"));
        }
        let timeout = shared.cleanup_timeout();
        let results = join_all(
            shared
                .nodes
                .iter()
                .map(|n| within(n, timeout, n.force_release(&keys, &shared.config))),
        )
        .await;
        let answered = results.iter().filter(|r| r.is_ok()).count();
        let removed = results.iter().any(|r| matches!(r, Ok(true)));
        if answered >= shared.quorum() {
            return Ok(removed);
        }
        Err(Error::Unavailable {
            message: format!(
                "force release of {:?} reached {answered} of {} Redis masters, {} needed",
                name.as_str(),
                shared.nodes.len(),
                shared.quorum()
            ),
            source: results
                .into_iter()
                .find_map(Result::err)
                .map(|e| Box::new(e) as distlock_core::BoxError),
        })
    }
}

fn remaining(pttl: i64) -> Option<Duration> {
    u64::try_from(pttl).ok().map(Duration::from_millis)
}

struct RedisAttempt {
    shared: Arc<Shared>,
    keys: Arc<LockKeys>,
    request: AcquireRequest,
    score: String,
    /// One per node, created at the first busy answer of a waiting attempt.
    subs: Vec<Subscription>,
    /// A `try_acquire` whose last poll was answered "busy" by every node: it left nothing
    /// on the server, so abandoning it costs no round trip.
    settled: bool,
    /// Whether a poll ran already: only the first one may take the fast path, later ones know
    /// the lock is contended and go straight to the script (which queues the waiter).
    polled: bool,
}

impl RedisAttempt {
    fn lease(&self) -> Box<dyn Lease> {
        Box::new(RedisLease {
            shared: self.shared.clone(),
            keys: self.keys.clone(),
            owner: self.request.owner.clone(),
            name: self.request.name.clone(),
        })
    }

    /// A waiting attempt starts listening at its first busy answer (not before: the
    /// uncontended path costs no subscription).
    fn busy(&mut self, retry_ms: Option<i64>) -> Step {
        let known = retry_ms
            .and_then(|ms| u64::try_from(ms).ok())
            .map(Duration::from_millis);
        if self.request.mode == AttemptMode::Try {
            return Step::busy(known);
        }
        if self.subs.is_empty() {
            self.subs = self
                .shared
                .nodes
                .iter()
                .map(|n| n.sub.subscribe(&self.keys.channel))
                .collect();
        }
        // Poll at least every third of the waiter timeout, to stay in the queue.
        let refresh = self.shared.refresh();
        Step::busy(Some(known.map_or(refresh, |k| k.min(refresh))))
    }

    /// Whether this poll may try the script-free fast path: only the first one, and never in
    /// fair mode (which must look at the queue even when the lock key is free).
    fn fast(&self) -> bool {
        !self.shared.config.fair && !self.polled
    }

    async fn poll_single(&mut self) -> Result<Step> {
        let node = &self.shared.nodes[0];
        let answer = node
            .acquire(
                &self.keys,
                &self.request,
                &self.shared.config,
                &self.score,
                self.fast(),
            )
            .await
            .map_err(|e| e.into_lock_error("acquire"))?;
        Ok(match answer {
            Answer::Acquired(token) => {
                Step::Acquired(Acquired::new(self.lease(), FencingToken::new(token)))
            }
            Answer::Busy(ms) => self.busy(Some(ms)),
        })
    }

    async fn poll_redlock(&mut self) -> Result<Step> {
        let shared = self.shared.clone();
        let ttl = self.request.ttl;
        let timeout = shared.node_timeout(ttl);
        let fast = self.fast();
        let started = Instant::now();
        let answers = join_all(shared.nodes.iter().map(|n| {
            within(
                n,
                timeout,
                n.acquire(&self.keys, &self.request, &shared.config, &self.score, fast),
            )
        }))
        .await;
        let elapsed = started.elapsed();
        let mut outcomes = Vec::with_capacity(answers.len());
        let mut tokens = Vec::new();
        let mut busy = Vec::new();
        let mut hard_failure = None;
        for (node, answer) in shared.nodes.iter().zip(&answers) {
            let result = match answer {
                Ok(Answer::Acquired(token)) => {
                    tokens.push((node, *token));
                    NodeResult::Acquired
                }
                Ok(Answer::Busy(ms)) => {
                    busy.push(*ms);
                    NodeResult::HeldByAnother
                }
                Err(err) if err.kind == RedisErrorKind::Timeout => NodeResult::TimedOut,
                Err(err) => {
                    if !err.is_transient() && hard_failure.is_none() {
                        hard_failure = Some(err.kind);
                    }
                    NodeResult::Failed(err.summary())
                }
            };
            outcomes.push(NodeOutcome {
                node: node.addr.clone(),
                result,
            });
        }
        let quorum = shared.quorum();
        let drift = shared.client.drift(ttl);
        if tokens.len() >= quorum && elapsed + drift < ttl {
            let max = tokens.iter().map(|(_, t)| *t).max().unwrap_or(0);
            if tokens.iter().any(|(_, t)| *t != max) {
                // Bring every node of this majority up to the token handed out, so that any
                // later majority (which shares a node with this one) continues above it.
                join_all(
                    tokens
                        .iter()
                        .filter(|(_, t)| *t != max)
                        .map(|(n, _)| within(n, timeout, n.raise_fence(&self.keys, max))),
                )
                .await;
            }
            return Ok(Step::Acquired(Acquired::new(
                self.lease(),
                FencingToken::new(max),
            )));
        }
        // Failed: release everywhere we may hold it (also where the answer was lost).
        join_all(
            shared
                .nodes
                .iter()
                .zip(&answers)
                .filter(|(_, a)| !matches!(a, Ok(Answer::Busy(_))))
                .map(|(n, _)| {
                    within(
                        n,
                        timeout,
                        n.release(
                            &self.keys,
                            &self.request.owner,
                            &shared.config,
                            ReleaseMode::Retreat,
                        ),
                    )
                }),
        )
        .await;
        if tokens.len() + busy.len() < quorum {
            let error = Error::QuorumNotReached {
                name: self.request.name.to_string(),
                reached: tokens.len(),
                needed: quorum,
                nodes: outcomes,
            };
            return Err(match hard_failure {
                // A misconfigured server does not heal by retrying.
                Some(kind) => Error::Backend {
                    message: format!("{kind}: {error}"),
                    source: Some(Box::new(error)),
                },
                None => error,
            });
        }
        if busy.len() >= quorum {
            busy.sort_unstable();
            // The lease is certainly over on a majority after the quorum-th shortest one.
            let ms = busy.get(quorum - 1).copied();
            return Ok(self.busy(ms));
        }
        // A split vote or too slow: retry after a random delay.
        let cap = u64::try_from((ttl / 10).as_millis())
            .unwrap_or(50)
            .clamp(2, 50);
        let delay = rand::rng().random_range(1..=cap);
        Ok(self.busy(i64::try_from(delay).ok()))
    }
}

#[async_trait]
impl Attempt for RedisAttempt {
    async fn poll(&mut self) -> Result<Step> {
        self.settled = false;
        let step = if self.shared.redlock() {
            self.poll_redlock().await
        } else {
            self.poll_single().await
        };
        self.polled = true;
        if let Ok(Step::Busy { .. }) = &step
            && self.request.mode == AttemptMode::Try
            && !self.shared.redlock()
        {
            self.settled = true;
        }
        step
    }

    async fn changed(&mut self) {
        if self.subs.is_empty() {
            return std::future::pending().await;
        }
        // Subscriptions not active yet (first wait, or the subscriber connection broke):
        // activate them and return at once, so that the core polls again with the
        // subscription in place and no release between the last poll and now is missed.
        let inactive: Vec<&Subscription> = self.subs.iter().filter(|s| !s.is_active()).collect();
        if !inactive.is_empty() {
            let results = join_all(inactive.iter().map(|s| s.ensure())).await;
            if results.iter().any(Result::is_ok) {
                return;
            }
            tracing::debug!("cannot subscribe to release events; waiting on timers");
            if self.subs.iter().all(|s| !s.is_active()) {
                return std::future::pending().await;
            }
        }
        let owner = self.request.owner.as_bytes();
        loop {
            let wakes = self.subs.iter_mut().map(|s| Box::pin(s.next()));
            let (wake, _, _) = futures::future::select_all(wakes).await;
            // Targeted at another waiter: that one is served next, keep waiting.
            if wake.is_empty() || &*wake == owner {
                return;
            }
        }
    }

    async fn abandon(self: Box<Self>) -> Result<()> {
        if self.settled {
            return Ok(());
        }
        let shared = &self.shared;
        let timeout = shared.cleanup_timeout();
        let results = join_all(shared.nodes.iter().map(|n| {
            within(
                n,
                timeout,
                n.release(
                    &self.keys,
                    &self.request.owner,
                    &shared.config,
                    ReleaseMode::Abandon,
                ),
            )
        }))
        .await;
        match results.into_iter().find_map(Result::err) {
            Some(err) => Err(err.into_lock_error("abandon")),
            None => Ok(()),
        }
    }
}

#[derive(Debug)]
struct RedisLease {
    shared: Arc<Shared>,
    keys: Arc<LockKeys>,
    owner: String,
    name: LockName,
}

impl RedisLease {
    fn not_held(&self) -> Error {
        Error::NotHeld {
            name: self.name.to_string(),
        }
    }
}

#[async_trait]
impl Lease for RedisLease {
    async fn renew(&self, ttl: Duration) -> Result<()> {
        let shared = &self.shared;
        if !shared.redlock() {
            let renewed = shared.nodes[0]
                .renew(&self.keys, &self.owner, ttl)
                .await
                .map_err(|e| e.into_lock_error("renew"))?;
            return if renewed {
                Ok(())
            } else {
                Err(self.not_held())
            };
        }
        let started = Instant::now();
        let timeout = shared.node_timeout(ttl);
        let results = join_all(
            shared
                .nodes
                .iter()
                .map(|n| within(n, timeout, n.renew(&self.keys, &self.owner, ttl))),
        )
        .await;
        let renewed = results.iter().filter(|r| matches!(r, Ok(true))).count();
        let failed = results.iter().filter(|r| r.is_err()).count();
        let quorum = shared.quorum();
        if renewed >= quorum && started.elapsed() + shared.client.drift(ttl) < ttl {
            return Ok(());
        }
        if renewed + failed < quorum {
            return Err(self.not_held());
        }
        Err(Error::Unavailable {
            message: format!(
                "renewal of {:?} reached {renewed} of {} nodes ({quorum} needed) within the validity",
                self.name.as_str(),
                shared.nodes.len()
            ),
            source: results
                .into_iter()
                .find_map(Result::err)
                .map(|e| Box::new(e) as distlock_core::BoxError),
        })
    }

    async fn release(&self) -> Result<()> {
        let shared = &self.shared;
        if !shared.redlock() {
            let released = shared.nodes[0]
                .release(
                    &self.keys,
                    &self.owner,
                    &shared.config,
                    ReleaseMode::Release,
                )
                .await
                .map_err(|e| e.into_lock_error("release"))?;
            return if released {
                Ok(())
            } else {
                Err(self.not_held())
            };
        }
        let timeout = shared.cleanup_timeout();
        let results = join_all(shared.nodes.iter().map(|n| {
            within(
                n,
                timeout,
                n.release(
                    &self.keys,
                    &self.owner,
                    &shared.config,
                    ReleaseMode::Release,
                ),
            )
        }))
        .await;
        if results.iter().any(|r| matches!(r, Ok(true))) {
            return Ok(());
        }
        match results.into_iter().find_map(Result::err) {
            Some(err) => Err(err.into_lock_error("release")),
            None => Err(self.not_held()),
        }
    }
}
