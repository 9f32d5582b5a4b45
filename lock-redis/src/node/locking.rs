//! The lock scripts run on one master: acquiring (the fast path, the script, the replicas'
//! acknowledgement), renewing, releasing, raising the fencing counter, and the scripts'
//! answers. The calls of the shared and permit kinds' scripts are built in `kinds.rs`.

use std::sync::atomic::Ordering;
use std::time::Duration;

use distlock_core::{AcquireRequest, AttemptMode, FencingToken, LockKind};

use super::{Node, millis};
use crate::RedisConfig;
use crate::error::{RedisError, RedisErrorKind};
use crate::keys::{LockKeys, Siblings};
use crate::kinds::{self, held_kind, marker_kind};
use crate::scripts::{self, Invocation};

/// What the release script is asked to do (see [`scripts::RELEASE`] and
/// [`HOLD_RELEASE`](crate::kinds::HOLD_RELEASE)).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReleaseMode {
    Release,
    Abandon,
    Retreat,
    /// Redlock, a master outside the majority that granted: leave its queue (and give up a
    /// reservation there), keep a hold it handed since (the lease's renewals reach it).
    Leave,
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
            Self::Leave => "leave",
            Self::Force => "force",
        }
    }
}

pub(crate) enum Answer {
    Acquired(u64),
    /// Taken: the remaining lease in ms (< 0: unknown), and the fencing counter when the
    /// script read one (see [`scripts::BUSY`]).
    Busy(i64, Option<u64>),
    /// The name is held as this kind, which the request can never join.
    Mismatch(LockKind),
}

impl Node {
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
                        self.contended.saw(&keys.lock);
                    }
                    return self.replicated(answer, keys, request, config).await;
                }
                Ok(None) => self.contended.saw(&keys.lock),
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

        if matches!(answer, Answer::Busy(..)) {
            // Taken (also in fair mode, which never tries the fast path): this lock's
            // release goes straight to the full script.
            self.contended.saw(&keys.lock);
        }
        self.replicated(answer, keys, request, config).await
    }

    /// With [`RedisConfig::wait_replicas`]: an acquisition counts once that many replicas
    /// acknowledged it ([`Self::acknowledged`]); otherwise, or when that check fails, it is
    /// given back and the attempt fails with a retryable error (the check's own, if it failed).
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
        let Err(err) = self.acknowledged(keys, request, config).await else {
            return Ok(answer);
        };
        let _ = self
            .release(
                keys,
                &request.owner,
                config,
                ReleaseMode::Abandon,
                request.kind,
                None,
            )
            .await;
        Err(err)
    }

    /// Whether [`RedisConfig::wait_replicas`] replicas have `request`'s hold, just acquired:
    /// its renewal (owner-checked, the lease from now) and `WAIT` in one pipeline
    /// ([`Invocation::invoke_acked`]), on the node's `WAIT` connection ([`Node::waits`]),
    /// where a `WAIT` holds up no lock command. Only a granted attempt waits so: a refused one
    /// sends no `WAIT`, which would hold up the other grants' while replicas lag.
    ///
    /// `WAIT` counts the replicas that have the writes of the connection it runs on. On the
    /// acquisition's connection those include the grant; a `WAIT` of its own on another one
    /// (after a reconnect, on the master a Sentinel names now, where a cluster moved the slot)
    /// counted every replica at once, the grant on none. The renewal covers both: it finds the
    /// hold on the master the `WAIT` asks, and a replica that acknowledged the renewal has
    /// everything that master wrote before it, the hold too.
    ///
    /// # Errors
    /// A retryable one for too few replicas, or a hold that is not on that master; the
    /// request's own otherwise.
    async fn acknowledged(
        &self,
        keys: &LockKeys,
        request: &AcquireRequest,
        config: &RedisConfig,
    ) -> Result<(), RedisError> {
        let mut conn = self.waits.clone();
        let renewal = renewal(keys, &request.owner, request.ttl, request.kind);
        let (renewed, acked): (i64, i64) = renewal
            .invoke_acked(&mut conn, config.wait_replicas, millis(config.wait_timeout))
            .await
            .map_err(|e| self.classify(e))?;
        let why = if renewed != 1 {
            "the master no longer had the hold it had just granted (wait_replicas)"
        } else if acked < i64::from(config.wait_replicas) {
            "too few replicas acknowledged the acquisition (wait_replicas)"
        } else {
            return Ok(());
        };
        Err(RedisError {
            kind: RedisErrorKind::Timeout,
            node: self.addr.clone(),
            source: Some(redis::RedisError::from((redis::ErrorKind::Io, why))),
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
            Some(Answer::Busy(-1, None))
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
        let renewed: i64 = renewal(keys, owner, ttl, kind)
            .invoke(&mut conn)
            .await
            .map_err(|e| self.classify(e))?;
        Ok(renewed == 1)
    }

    /// Releases `owner`'s hold of `kind` (see [`ReleaseMode`]). `hand_over`: the lease with
    /// which the lock is handed to the oldest waiter (a writer after an exclusive hold or the
    /// last shared one, the readers at the head after an exclusive hold), or a freed permit to
    /// the permit waiter first in line for it ([`RedisConfig::hand_over_lease`]); `None`:
    /// reserved for it, or woken, instead.
    pub(crate) async fn release(
        &self,
        keys: &LockKeys,
        owner: &str,
        config: &RedisConfig,
        mode: ReleaseMode,
        kind: LockKind,
        hand_over: Option<Duration>,
    ) -> Result<bool, RedisError> {
        if kind == LockKind::Exclusive {
            return self
                .release_lock(&keys.lock, owner, config, mode, hand_over)
                .await;
        }
        let mut conn = self.conn.clone();
        let released: i64 = kinds::release_call(keys, owner, config, mode, kind, hand_over)
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
        hand_over: Option<Duration>,
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
            self.contended.saw(lock);
        }
        let siblings = Siblings::of(lock);
        let released: i64 = Invocation::new(
            &scripts::RELEASE,
            &[
                lock,
                siblings.fence(),
                siblings.queue(),
                siblings.alive(),
                siblings.data(),
                siblings.holders(),
                siblings.tokens(),
            ],
        )
        .arg(owner)
        .arg(if config.fair { "1" } else { "0" })
        .arg(millis(config.handoff))
        .arg(siblings.channel())
        .arg(mode.as_str())
        .arg(hand_over.map_or(0, millis))
        .arg(seed_floor(config))
        .arg(millis(config.forget_after))
        .invoke(&mut conn)
        .await
        .map_err(|e| self.classify(e))?;
        Ok(released == 1)
    }

    /// Replaces the data of `owner`'s hold of `kind`, acquired for `ttl` (`None`: removes it),
    /// owner-checked (see [`scripts::SET_DATA`]). `false`: the owner does not hold the lock.
    pub(crate) async fn set_data(
        &self,
        keys: &LockKeys,
        owner: &str,
        kind: LockKind,
        ttl: Duration,
        data: Option<&str>,
    ) -> Result<bool, RedisError> {
        let kind_marker = match kind {
            LockKind::Exclusive => String::new(),
            kind => kinds::marker(kind),
        };
        let mut conn = self.conn.clone();
        let room = owner.len() + data.map_or(0, str::len) + 32;
        let set: i64 = Invocation::sized(
            &scripts::SET_DATA,
            &[&keys.lock, &keys.holders(), &keys.data()],
            5,
            room,
        )
        .arg(owner)
        .arg(kind_marker)
        .arg(if data.is_some() { "1" } else { "0" })
        .arg(data.unwrap_or(""))
        .arg(millis(ttl))
        .invoke(&mut conn)
        .await
        .map_err(|e| self.classify(e))?;
        Ok(set == 1)
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

/// A script's `{code, value}` or busy `{0, retry_ms, counter}` answer (see
/// [`scripts::ACQUIRE`], [`HOLD_ACQUIRE`](crate::kinds::HOLD_ACQUIRE)); a granted token is
/// checked by [`FencingToken::from_server`].
impl redis::FromRedisValue for Answer {
    fn from_redis_value(value: redis::Value) -> Result<Self, redis::ParsingError> {
        let answer: Vec<i64> = redis::FromRedisValue::from_redis_value(value)?;
        let (code, value, counter) = match answer[..] {
            [code, value] => (code, value, None),
            // 0: no counter (expired, or never used), which tells nothing.
            [code, value, counter] => (code, value, u64::try_from(counter).ok().filter(|c| *c > 0)),
            _ => return Err(format!("the acquire script answered {answer:?}").into()),
        };
        Ok(match code {
            1 => Self::Acquired(
                FencingToken::from_server(value, "the acquire script's counter")
                    .map_err(|err| err.to_string())?
                    .get(),
            ),
            2 => Self::Mismatch(held_kind(value)),
            _ => Self::Busy(value, counter),
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

/// The renewal of `owner`'s hold of `kind` to `ttl` from now: 1 if it holds, else 0.
fn renewal(keys: &LockKeys, owner: &str, ttl: Duration, kind: LockKind) -> Invocation {
    if kind == LockKind::Exclusive {
        Invocation::new(&scripts::RENEW, &[&keys.lock, &keys.data()])
            .arg(owner)
            .arg(millis(ttl))
    } else {
        kinds::renew_call(keys, owner, ttl, kind)
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
