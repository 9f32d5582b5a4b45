//! The Lua scripts. Each runs atomically on the server; all use the server's own clock
//! (`TIME`) only, never a client's.

use std::sync::LazyLock;

use redis::{Cmd, ErrorKind, FromRedisValue, RedisResult, Script, ServerErrorKind, ToRedisArgs};

/// The value prefix of a handoff reservation stored in the lock key: `"\0next:" + owner`. No
/// owner value contains a NUL byte, so a reservation never equals an owner.
pub(crate) const RESERVED_PREFIX: &str = "\0next:";

/// Room for a call's arguments: up to 8 (`ARGV`), of 192 bytes in all (owners are 32-80 bytes,
/// the rest are numbers and flags). More only costs a reallocation.
const ARGS: usize = 8;
const ARGS_ROOM: usize = 192;

/// One call of a script, written straight into an `EVALSHA` command.
///
/// `redis::ScriptInvocation` first copies every key and argument into a buffer of its own and
/// then into the command: on the release script's eight arguments that was a third of the
/// release's client CPU. The script is loaded on `NOSCRIPT` (a restarted or flushed server) and
/// the call sent once more, as `ScriptInvocation` does.
pub(crate) struct Invocation {
    script: &'static Script,
    cmd: Cmd,
}

impl Invocation {
    /// A call of `script` with `keys` (arguments follow with [`Self::arg`]).
    pub(crate) fn new(script: &'static Script, keys: &[&str]) -> Self {
        // Sized up front: growing the buffer argument by argument costs more than the copy.
        let data = 64 + keys.iter().map(|k| k.len()).sum::<usize>() + ARGS_ROOM;
        let mut cmd = Cmd::with_capacity(3 + keys.len() + ARGS, data);
        cmd.arg("EVALSHA")
            .arg(script.get_hash())
            .arg(keys.len())
            .arg(keys);
        Self { script, cmd }
    }

    /// Appends an argument (`ARGV[n]`).
    pub(crate) fn arg<T: ToRedisArgs>(mut self, arg: T) -> Self {
        self.cmd.arg(arg);
        self
    }

    /// Runs the call on `conn`, loading the script first if the server does not know it.
    pub(crate) async fn invoke<T: FromRedisValue>(
        &self,
        conn: &mut impl redis::aio::ConnectionLike,
    ) -> RedisResult<T> {
        match self.cmd.query_async(conn).await {
            Err(err) if err.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                self.script.load_async(conn).await?;
                self.cmd.query_async(conn).await
            }
            result => result,
        }
    }
}

/// Acquire (or queue), one round trip: the slow path, taken when the fast path
/// (`MULTI`, `SET NX PX GET`, `INCR`, `EXEC`; see the crate docs) found the lock key taken, and
/// always in fair mode.
///
/// KEYS: lock, fence, queue, alive.
/// ARGV: owner, ttl ms, wait ("1" to queue), fair ("1"), waiter timeout ms, arrival score
/// ("" = the server's time in microseconds), [`SEED_FLOOR`].
/// Returns `{1, token}` when acquired, `{0, retry_ms}` when busy (`retry_ms` < 0: unknown).
pub(crate) static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local owner = ARGV[1]
local ttl = tonumber(ARGV[2])
local holder = redis.call('GET', KEYS[1])
if holder == owner then
  -- A retry after a lost reply: the lock is already ours; restart its lease.
  redis.call('PEXPIRE', KEYS[1], ttl)
  return {1, tonumber(redis.call('GET', KEYS[2]) or '0')}
end
local fair = ARGV[4] == '1'
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local dead = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now, 'LIMIT', 0, 64)
for _, w in ipairs(dead) do
  redis.call('ZREM', KEYS[3], w)
  redis.call('ZREM', KEYS[4], w)
end
local blocked = nil
if holder and holder ~= '\0next:' .. owner then
  -- Held, or reserved for another waiter.
  blocked = redis.call('PTTL', KEYS[1])
elseif not holder and fair then
  local head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  if head and head ~= owner then
    local alive = tonumber(redis.call('ZSCORE', KEYS[4], head) or now)
    blocked = math.max(alive - now, 1)
  end
end
if blocked then
  if ARGV[3] == '1' then
    local wto = tonumber(ARGV[5])
    local score = ARGV[6]
    if score == '' then
      score = t[1] .. string.format('%06d', tonumber(t[2]))
    end
    redis.call('ZADD', KEYS[3], 'NX', score, owner)
    redis.call('ZADD', KEYS[4], now + wto, owner)
    redis.call('PEXPIRE', KEYS[3], wto * 2)
    redis.call('PEXPIRE', KEYS[4], wto * 2)
  end
  return {0, blocked}
end
redis.call('SET', KEYS[1], owner, 'PX', ttl)
if tonumber(redis.call('GET', KEYS[2]) or '0') < tonumber(ARGV[7]) then
  -- A missing counter (first use, or a server restarted without its data) or one from before
  -- seeding: it starts again from the server's clock in microseconds (see SEED_FLOOR).
  redis.call('SET', KEYS[2], t[1] .. string.format('%06d', tonumber(t[2])))
end
local token = redis.call('INCR', KEYS[2])
redis.call('ZREM', KEYS[3], owner)
redis.call('ZREM', KEYS[4], owner)
return {1, token}
",
    )
});

/// Fencing counters below this are seeded from the server's clock before their next step:
/// 10^15 µs after the Unix epoch is September 2001, so a counter seeded from any later clock
/// is above it, and one that is below it was never seeded (it is missing, because the key is
/// new or the server restarted without its data, or it was written by a version that did not
/// seed).
///
/// A seeded counter restarts at the server's time in microseconds, so after a restart
/// without persistence the next token is larger than every token the server handed out
/// before, as long as the server's clock did not go back across the restart by more than
/// the acquisitions of that name since its last seed exceeded one per microsecond (Redis
/// serves far fewer). Tokens stay within `u64` for about 580,000 years, and exact in the
/// scripts' Lua numbers (doubles) until 2255.
pub(crate) const SEED_FLOOR: u64 = 1_000_000_000_000_000;

/// The fast path's follow-up when its `INCR` answered a counter below [`SEED_FLOOR`]: seeds the
/// counter from the server's clock (as the acquire script does) and steps it, only if the
/// lock is still this owner's (otherwise the token would belong to nobody).
///
/// KEYS: lock, fence. ARGV: owner, [`SEED_FLOOR`]. Returns the token, or 0 if the lock is no
/// longer the owner's.
pub(crate) static SEED: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
if tonumber(redis.call('GET', KEYS[2]) or '0') < tonumber(ARGV[2]) then
  local t = redis.call('TIME')
  redis.call('SET', KEYS[2], t[1] .. string.format('%06d', tonumber(t[2])))
end
return redis.call('INCR', KEYS[2])
",
    )
});

/// Owner-checked extension. KEYS: lock. ARGV: owner, ttl ms. Returns 1 or 0.
pub(crate) static RENEW: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
",
    )
});

/// Owner-checked release with handoff, abandonment of an attempt, or a Redlock retreat.
///
/// KEYS: lock, queue, alive.
/// ARGV: owner, fair ("1"), handoff ms, channel, mode: "release" (the owner is done: also
/// leave the queue), "abandon" (the same for an attempt that ends without the lock: it also
/// gives up a reservation made for it) or "retreat" (Redlock, after a failed majority: only
/// give the lock back, keep the place in the queue and any reservation).
/// Then, if this call freed the lock (or gave up a turn), picks the oldest live waiter,
/// reserves the lock for it for `handoff` ms by storing [`RESERVED_PREFIX`] + its owner in the
/// lock key (default mode; the fair mode's queue needs no reservation) and publishes its owner
/// value on the channel (empty payload: nobody waits). Returns 1 if the lock was released,
/// else 0.
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local owner = ARGV[1]
local mode = ARGV[5]
local holder = redis.call('GET', KEYS[1])
if mode == 'release' and holder == owner and redis.call('EXISTS', KEYS[2]) == 0 then
  -- Nobody queued: nobody to hand over to or to wake.
  redis.call('DEL', KEYS[1])
  return 1
end
local fair = ARGV[2] == '1'
local released = 0
local handoff = false
if holder == owner then
  redis.call('DEL', KEYS[1])
  holder = false
  released = 1
  handoff = true
elseif holder == '\0next:' .. owner and mode ~= 'retreat' then
  redis.call('DEL', KEYS[1])
  holder = false
  handoff = true
end
if mode ~= 'retreat' then
  if redis.call('ZRANGE', KEYS[2], 0, 0)[1] == owner then handoff = true end
  redis.call('ZREM', KEYS[2], owner)
  redis.call('ZREM', KEYS[3], owner)
end
if holder or not handoff then return released end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local dead = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, 64)
for _, w in ipairs(dead) do
  redis.call('ZREM', KEYS[2], w)
  redis.call('ZREM', KEYS[3], w)
end
local nxt = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
if nxt and not fair then
  redis.call('SET', KEYS[1], '\0next:' .. nxt, 'PX', ARGV[3])
  redis.call('ZREM', KEYS[2], nxt)
  redis.call('ZREM', KEYS[3], nxt)
end
redis.call('PUBLISH', ARGV[4], nxt or '')
return released
",
    )
});

/// Raises a fencing counter to at least a value (Redlock, so that every node of a later
/// majority continues above the token just handed out). KEYS: fence. ARGV: value.
pub(crate) static RAISE_FENCE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
local want = tonumber(ARGV[1])
if cur < want then
  redis.call('SET', KEYS[1], ARGV[1])
  return want
end
return cur
",
    )
});

/// The raw floor's compare-and-delete. KEYS: lock. ARGV: owner.
#[cfg(feature = "bench")]
pub(crate) static COMPARE_AND_DELETE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
",
    )
});
