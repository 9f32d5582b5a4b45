//! The Lua scripts (those of the shared and permit kinds are in `kinds.rs`, on the helpers
//! here). Each runs atomically on the server; all use the server's own clock (`TIME`) only,
//! never a client's.

use std::sync::LazyLock;

use redis::{
    Cmd, ErrorKind, FromRedisValue, RedisResult, Script, ServerErrorKind, ToRedisArgs, Value,
};

use crate::keys::HEAD_LEN;

/// A Lua script: its `EVALSHA` digest and, for the servers that do not know it yet, its text.
pub(crate) struct Lua {
    script: Script,
    code: String,
}

impl Lua {
    pub(crate) fn new(code: &str) -> Self {
        Self {
            script: Script::new(code),
            code: code.to_owned(),
        }
    }
}

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
/// release's client CPU. On `NOSCRIPT` (a restarted, flushed or new server: a promoted
/// replica, another cluster node) the call is sent once more as `EVAL` with the script's text,
/// which also caches it there: one more round trip, on the node of the call's keys (a
/// `SCRIPT LOAD` would go to every node of a cluster, and fail while one is down).
pub(crate) struct Invocation {
    script: &'static Lua,
    cmd: Cmd,
}

impl Invocation {
    /// A call of `script` with `keys` (arguments follow with [`Self::arg`]).
    pub(crate) fn new(script: &'static Lua, keys: &[&str]) -> Self {
        Self::sized(script, keys, ARGS, ARGS_ROOM)
    }

    /// A call of `script` with `keys`, with room for `args` arguments of `room` bytes in all
    /// (a batch's arguments).
    pub(crate) fn sized(script: &'static Lua, keys: &[&str], args: usize, room: usize) -> Self {
        // Sized up front: growing the buffer argument by argument costs more than the copy.
        let data = 64 + keys.iter().map(|k| k.len()).sum::<usize>() + room;
        let mut cmd = Cmd::with_capacity(3 + keys.len() + args, data);
        cmd.arg("EVALSHA")
            .arg(script.script.get_hash())
            .arg(keys.len())
            .arg(keys);
        Self { script, cmd }
    }

    /// Appends an argument (`ARGV[n]`).
    pub(crate) fn arg<T: ToRedisArgs>(mut self, arg: T) -> Self {
        self.cmd.arg(arg);
        self
    }

    /// Runs the call on `conn`, sending the script's text if the server does not know it.
    pub(crate) async fn invoke<T: FromRedisValue>(
        &self,
        conn: &mut impl redis::aio::ConnectionLike,
    ) -> RedisResult<T> {
        match self.cmd.query_async(conn).await {
            Err(err) if err.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                self.eval().query_async(conn).await
            }
            result => result,
        }
    }

    /// Runs the call and `WAIT replicas timeout_ms` after it in one pipeline, so on one
    /// connection (on a cluster, the master of the call's first key): the count of replicas
    /// that acknowledged, the second value, covers the call's own writes. A `WAIT` sent on its
    /// own may go out on a fresh connection (a reconnect, the master a Sentinel names now, a
    /// slot moved), where it covers no write at all and answers at once with every replica.
    /// The `WAIT` runs whatever the call answered; it returns at once when the replicas have
    /// this connection's writes, else after `timeout_ms` (never 0, which waits for good). The
    /// call goes as `EVAL` with the script's text: a `NOSCRIPT` (a master just promoted knows
    /// no script) would cost a second pipeline, and a second `WAIT`.
    pub(crate) async fn invoke_acked<T: FromRedisValue>(
        &self,
        conn: &mut impl redis::aio::ConnectionLike,
        replicas: u32,
        timeout_ms: u64,
    ) -> RedisResult<(T, i64)> {
        acked(self.eval(), conn, replicas, timeout_ms.max(1)).await
    }

    /// The call as `EVAL` with the script's text (for a server that does not know it).
    fn eval(&self) -> Cmd {
        let mut eval = Cmd::with_capacity(8, self.script.code.len() + 256);
        eval.arg("EVAL").arg(&self.script.code);
        for arg in self.cmd.args_iter().skip(2) {
            if let redis::Arg::Simple(bytes) = arg {
                eval.arg(bytes);
            }
        }
        eval
    }
}

/// `call` then `WAIT` in one pipeline (see [`Invocation::invoke_acked`]): the call's answer
/// and the count of replicas, or the call's error.
async fn acked<T: FromRedisValue>(
    call: Cmd,
    conn: &mut impl redis::aio::ConnectionLike,
    replicas: u32,
    timeout_ms: u64,
) -> RedisResult<(T, i64)> {
    let mut pipe = redis::pipe();
    pipe.add_command(call)
        .cmd("WAIT")
        .arg(replicas)
        .arg(timeout_ms)
        .ignore_errors();
    let mut answers: Vec<Value> = pipe.query_async(conn).await?;
    let (Some(waited), Some(answer), None) = (answers.pop(), answers.pop(), answers.pop()) else {
        return Err(redis::RedisError::from((
            ErrorKind::Parse,
            "a pipeline of two commands did not get two answers",
        )));
    };
    let answer = T::from_redis_value(answer.extract_error()?)?;
    let acked = i64::from_redis_value(waited.extract_error()?)?;
    Ok((answer, acked))
}

/// The fast path of an exclusive acquisition (see the crate docs): `SET NX PX GET`, and the
/// counter step only when the `SET` took the lock, so a refused attempt burns no token. The
/// common case is the `SET` and one `INCR`; clock tokens, and a counter never seeded (below
/// [`SEED_FLOOR`]), take the acquire scripts' rule ([`NEXT_TOKEN`]) instead.
///
/// KEYS: lock, fence. ARGV: owner, ttl ms, [`SEED_FLOOR`] (0: clock tokens), forget ms
/// (see [`NEXT_TOKEN`]).
/// Returns the lock key's value (a bulk string) when it was taken, else the token (an
/// integer).
pub(crate) static ACQUIRE_FAST: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        &[
            r"
local previous = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2], 'GET')
if previous then
  return previous
end
local floor = tonumber(ARGV[3])
local fence_keep = tonumber(ARGV[2]) + tonumber(ARGV[4])
if floor > 0 then
  local stepped = redis.call('INCR', KEYS[2])
  if stepped >= floor then
    redis.call('PEXPIRE', KEYS[2], fence_keep)
    return stepped
  end
end
local t = redis.call('TIME')
",
            NEXT_TOKEN,
            r"
return token
",
        ]
        .concat(),
    )
});

/// Acquire (or queue), one round trip: the slow path, taken when the fast path
/// ([`ACQUIRE_FAST`]) found the lock key taken, and always in fair mode.
///
/// KEYS: lock, fence, queue, alive.
/// ARGV: owner, ttl ms, wait ("1" to queue), fair ("1"), waiter timeout ms, arrival score
/// ("" = the server's time in microseconds), [`SEED_FLOOR`], forget ms (see [`NEXT_TOKEN`]).
/// Returns `{1, token}` when acquired, `{0, retry_ms, counter}` when busy (`retry_ms` < 0:
/// unknown; see [`BUSY`]), `{2, permits}` when the name is a semaphore of that many permits
/// (see [`HOLD_ACQUIRE`](crate::kinds::HOLD_ACQUIRE)).
pub(crate) static ACQUIRE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        &[
            r"
local owner = ARGV[1]
local member = owner
local ttl = tonumber(ARGV[2])
local holder = redis.call('GET', KEYS[1])
if holder == owner then
  -- A retry after a lost reply: the lock is already ours; restart its lease (and its data's).
  redis.call('PEXPIRE', KEYS[1], ttl)
  redis.call('PEXPIRE', ",
            &data_key("KEYS[1]"),
            r", ttl)
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
if holder and string.byte(holder, 1) == 0 and string.sub(holder, 2, 9) == 'permits:' then
  -- A semaphore's holders: never joined by an exclusive request.
  return {2, tonumber(string.sub(holder, 10)) or 0}
end
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
",
            BUSY,
            &grant("owner", "ttl"),
            r"
return {1, token}
",
        ]
        .concat(),
    )
});

/// Lua that answers a `blocked` attempt of the acquire scripts `{0, blocked, counter}` (the
/// fencing counter `KEYS[2]`, 0 if missing: a hand-over message that does not carry a larger
/// token was sent before this answer ran, see `attempt.rs`), first queueing
/// it if it waits (`ARGV[3]` = "1"): as `member` in the queue `KEYS[3]` (arrival score
/// `ARGV[6]`, or the server's `TIME` `t` in µs) with a liveness deadline in `KEYS[4]` (`now` +
/// the waiter timeout `ARGV[5]`). Both keys live at least twice that timeout, never less than
/// they did: a waiter's timeout follows its ttl, and one with a short ttl shortened them under
/// the waiters with longer ones, whose places then vanished between their polls (a release
/// found nobody to hand the lock to, and a `try_acquire` of the fair mode took it).
pub(crate) const BUSY: &str = r"
if blocked then
  if ARGV[3] == '1' then
    local wto = tonumber(ARGV[5])
    local score = ARGV[6]
    if score == '' then
      score = t[1] .. string.format('%06d', tonumber(t[2]))
    end
    redis.call('ZADD', KEYS[3], 'NX', score, member)
    redis.call('ZADD', KEYS[4], now + wto, member)
    if redis.call('PTTL', KEYS[3]) < wto * 2 then redis.call('PEXPIRE', KEYS[3], wto * 2) end
    if redis.call('PTTL', KEYS[4]) < wto * 2 then redis.call('PEXPIRE', KEYS[4], wto * 2) end
  end
  return {0, blocked, tonumber(redis.call('GET', KEYS[2]) or '0')}
end
";

/// Lua that steps the fencing counter `KEYS[2]` into `token`, in the acquire scripts, which
/// set `floor` (their [`SEED_FLOOR`] argument), `t` (the server's `TIME`) and `fence_keep`
/// first. A missing counter (first use, a name forgotten, or a server restarted without its
/// data) or one from before seeding (below `floor`) starts again from the server's clock in
/// microseconds. `floor` = 0 (clock tokens, [`crate::RedisConfig::clock_tokens`]): every
/// token is `max(counter + 1, clock + 1)`, so a promoted replica whose counter lags still
/// continues above the old master's tokens (given clocks that agree within the failover).
/// Counter tokens (`floor` > 0) take two commands: the `INCR` first, as the fast path's
/// ([`ACQUIRE_FAST`]), and the `PEXPIRE`; a step that lands at or below `floor` (a counter
/// missing or unseeded) sets the counter from the clock and steps it again. Clock tokens take
/// two commands besides the `TIME`: `GET` of the counter, and a `SET` of
/// the clock plus one with the counter's expiry when the counter is not ahead of the clock
/// (the common case); a counter ahead (a clock that went back, or the second and later
/// grants of one script, which share its `TIME`) is stepped like any other (`INCR`,
/// `PEXPIRE`). Any server version.
///
/// The counter then expires `fence_keep` ms later: the lease plus
/// [`forget_after`](crate::RedisConfig::forget_after). Every acquisition sets it again, so
/// a name in use keeps its counter, and a name nobody took for that long leaves no key
/// behind; its next token comes from the clock, above this one unless the server's clock
/// went back by more than `forget_after` (see the crate docs, "What is left on the server").
pub(crate) const NEXT_TOKEN: &str = r"
local token
if floor > 0 then
  token = redis.call('INCR', KEYS[2])
  if token <= floor then
    redis.call('SET', KEYS[2], t[1] .. string.format('%06d', tonumber(t[2])))
    token = redis.call('INCR', KEYS[2])
  end
  redis.call('PEXPIRE', KEYS[2], fence_keep)
else
  local counter = tonumber(redis.call('GET', KEYS[2]) or '0')
  local clock = tonumber(t[1]) * 1000000 + tonumber(t[2])
  if counter <= clock then
    token = clock + 1
    redis.call('SET', KEYS[2], string.format('%.0f', token), 'PX', fence_keep)
  else
    token = redis.call('INCR', KEYS[2])
    redis.call('PEXPIRE', KEYS[2], fence_keep)
  end
end
";

/// Lua that gives the lock to the owner value `who` (a Lua variable) for `lease` ms (a Lua
/// number), as an acquisition does: the lock key set, the next token in `token`
/// ([`NEXT_TOKEN`], from `t` and the scripts' common arguments `ARGV[7]` (the seed floor) and
/// `ARGV[8]` (forget ms)), and `who` out of the queue. KEYS: lock, fence, queue, alive.
fn grant(who: &str, lease: &str) -> String {
    format!(
        "redis.call('SET', KEYS[1], {who}, 'PX', {lease})
local floor = tonumber(ARGV[7])
local fence_keep = {lease} + tonumber(ARGV[8])
{NEXT_TOKEN}redis.call('ZREM', KEYS[3], {who})
redis.call('ZREM', KEYS[4], {who})
"
    )
}

/// Lua that hands the lock over to the waiter `who` for `lease` ms (Lua variables; see
/// [`RELEASE`]): [`grant`], then the hand-over message on the channel `ARGV[4]`.
pub(crate) fn hand_over(who: &str, lease: &str) -> String {
    format!(
        "{}redis.call('PUBLISH', ARGV[4], '\\0\\1' .. string.format('%d', {lease}) .. ':' .. \
         string.format('%.0f', token) .. '\\0' .. {who})\n",
        grant(who, lease)
    )
}

/// Lua that gives the live queue member `w` (a reader or a permit waiter: NUL, a letter and
/// `:` before its owner value) a hold of its own for `lease` ms, as its acquisition would: its
/// lease's end (from `now`) in the holders' sorted set `holders`, the next token
/// ([`NEXT_TOKEN`], which needs `t`, `floor` and `fence_keep`) in the hash `tokens`, out of
/// the queue (`KEYS[3]`, `KEYS[4]`), and its owner and token added to the Lua tables `owners`
/// and `tokens` that [`publish_holds`] sends.
pub(crate) fn grant_hold(holders: &str, tokens: &str) -> String {
    format!(
        "local who = string.sub(w, 4)
{NEXT_TOKEN}redis.call('ZADD', {holders}, now + lease, who)
redis.call('HSET', {tokens}, who, token)
redis.call('ZREM', KEYS[3], w)
redis.call('ZREM', KEYS[4], w)
owners[#owners + 1] = who
tokens[#tokens + 1] = string.format('%.0f', token)
"
    )
}

/// Lua that publishes on the channel `ARGV[4]` the holds that [`grant_hold`] gave for `lease`
/// ms: [`HANDED_OVER`] + lease ms + `kind` (a Lua string expression: `''` for shared holds,
/// `'/' ..` the semaphore's permits for permits) + `:` + the tokens (comma-separated) + NUL +
/// the owners (NUL-separated, in the same order).
pub(crate) fn publish_holds(kind: &str) -> String {
    format!(
        "redis.call('PUBLISH', ARGV[4], '\\0\\1' .. string.format('%d', lease) .. {kind} .. ':' ..
  table.concat(tokens, ',') .. '\\0' .. table.concat(owners, '\\0'))
"
    )
}

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

/// Owner-checked extension, of the hold's data too (see [`SET_DATA`]: the data key expires
/// with the lock key). KEYS: lock, data. ARGV: owner, ttl ms. Returns 1 or 0.
pub(crate) static RENEW: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
  return 1
end
return 0
",
    )
});

/// Lua that defines `data_of(l)`: the data key ([`LockKeys::data`](crate::LockKeys::data))
/// of the name whose lock key is `l`, for the two scripts that take the lock key alone to keep
/// their calls short ([`RELEASE_ALONE`], the batched renewal [`RENEW_MANY`]). It carries the
/// lock key's hash tag, so it lives in the same cluster slot, on the node the call went to.
fn data_of() -> String {
    format!("local function data_of(l) return {} end\n", data_key("l"))
}

/// A Lua expression for the data key of the name whose lock key is the Lua value `lock`: the
/// lock key with its kind letter `l` (after the [`HEAD_LEN`] bytes of the prefix) made `d`.
fn data_key(lock: &str) -> String {
    format!(
        "string.sub({lock}, 1, {}) .. 'd' .. string.sub({lock}, {})",
        HEAD_LEN,
        HEAD_LEN + 2
    )
}

/// Replaces the data stored with a hold (holder data), only if the owner still holds it.
///
/// The data of every hold of a name is the hash `d` ([`LockKeys::data`](crate::LockKeys::data)):
/// owner -> data. An exclusive hold's call first deletes the hash (its other fields can only be
/// a former hold's), a shared hold or a permit replaces or removes its own field. The key takes
/// the lock key's remaining lease plus one lease of the hold (`ttl`) as its TTL, and every
/// script that extends or ends a hold extends it or deletes the field with it: the data lives
/// as long as the hold, and `inspect` reads only the field of the holder it shows, so no
/// other hold's data is ever shown, and a new hold (a new owner value) starts without any.
/// Not a renewal: no lease changes.
///
/// The slack of one lease: the batched renewal extends the data key only for the leases that
/// stored data (see [`RENEW_MANY`]), and one already on its way when the lease's flag was set
/// extends the lock key alone, to at most `ttl` from then; the data key still outlives that
/// lease, and the next renewal carries the flag. It outlives a hold that ends by expiry by at
/// most one lease, unseen (`inspect` reads the field of the current holder only).
///
/// KEYS: lock, holders, data. ARGV: owner, the kind's marker ("" = exclusive), "1" to store
/// (else remove), the data, ttl ms. Returns 1, or 0 when the owner does not hold the lock (a
/// shared or permit holder: its lease ended, or the marker changed).
pub(crate) static SET_DATA: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        r"
local owner, marker = ARGV[1], ARGV[2]
local holder = redis.call('GET', KEYS[1])
if marker == '' then
  if holder ~= owner then return 0 end
  redis.call('DEL', KEYS[3])
else
  if holder ~= marker then return 0 end
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local ends = redis.call('ZSCORE', KEYS[2], owner)
  if not ends or tonumber(ends) <= now then return 0 end
  if ARGV[3] ~= '1' then
    redis.call('HDEL', KEYS[3], owner)
    return 1
  end
end
if ARGV[3] == '1' then
  redis.call('HSET', KEYS[3], owner, ARGV[4])
  local keep = redis.call('PTTL', KEYS[1])
  if keep > 0 then redis.call('PEXPIRE', KEYS[3], keep + tonumber(ARGV[5])) end
end
return 1
",
    )
});

/// Who holds a lock, with an exclusive holder's data and the fencing counter, atomically.
/// KEYS: lock, data, fence. Returns `{value, pttl, data, counter}`: the lock key's value (nil:
/// free) and its `PTTL`; for an owner value (not a marker or a reservation, which start with
/// NUL), its data field (nil: none) and the counter `f` (nil: forgotten, see [`NEXT_TOKEN`]).
pub(crate) static INSPECT: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        r"
local value = redis.call('GET', KEYS[1])
if not value then return {false, -2, false, false} end
local data, counter = false, false
if string.byte(value, 1) ~= 0 then
  data = redis.call('HGET', KEYS[2], value)
  counter = redis.call('GET', KEYS[3])
end
return {value, redis.call('PTTL', KEYS[1]), data, counter}
",
    )
});

/// Owner-checked extension of many locks in one call, each exactly as [`RENEW`] (exclusive)
/// or [`HOLD_RENEW`](crate::kinds::HOLD_RENEW) (a shared hold or a permit) would extend it alone: a refused lock
/// answers 0 and does not stop the others, and an error on one lock's keys (`WRONGTYPE`, or
/// a key another cluster node serves) is caught (`pcall`) and answered for that lock alone.
///
/// Per lock `i` (from 0): ARGV[4i+1] owner, ARGV[4i+2] ttl ms, ARGV[4i+3] the kind's marker
/// ("" = exclusive), ARGV[4i+4] "1" if the hold stored data (its data key is then extended
/// too, see [`SET_DATA`]; not for the others: that `PEXPIRE` of a missing key took a third
/// of the script's time); KEYS: the lock key for an exclusive lock, else lock, holders, tokens.
/// Returns one answer per lock, in order: 1, 0, or the error's text. The keys are walked in
/// a loop (no `unpack`, so no bound from Lua's C stack); see [`crate::renew`] for the batch
/// size.
pub(crate) static RENEW_MANY: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        &[
            "local keys, args = KEYS, ARGV\n",
            &data_of(),
            RENEW_MANY_BODY,
        ]
        .concat(),
    )
});

/// [`RENEW_MANY`] for the locks of many slots of one Redis Cluster master. A script's
/// declared keys must share a slot, and every lock name is a hash tag of its own, so only the
/// first lock's key is declared (`KEYS[1]`, which routes the call to that slot's master) and
/// the keys are passed in ARGV: `ARGV[1]` the number of keys n, `ARGV[2..n+1]` the keys (as
/// [`RENEW_MANY`]'s KEYS), then the locks' arguments as [`RENEW_MANY`]'s ARGV. Scripts without
/// a shebang may access keys of other slots than the declared one, on the same node (Redis
/// 7.0+ keeps this for `EVAL` compatibility; older servers never checked); a key that node
/// does not serve fails for its lock alone.
pub(crate) static RENEW_MANY_ON_NODE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        &[
            r"
local n = tonumber(ARGV[1])
local keys, args = {}, {}
for i = 2, n + 1 do keys[#keys + 1] = ARGV[i] end
for i = n + 2, #ARGV do args[#args + 1] = ARGV[i] end
",
            &data_of(),
            RENEW_MANY_BODY,
        ]
        .concat(),
    )
});

/// The loop of [`RENEW_MANY`] over the tables `keys` and `args`; the data key (`data_of`,
/// see [`data_of`]) of a hold that stored data is extended with it.
const RENEW_MANY_BODY: &str = r"
local function renew(l, owner, ttl, data)
  if redis.call('GET', l) == owner then
    redis.call('PEXPIRE', l, ttl)
    if data == '1' then redis.call('PEXPIRE', data_of(l), ttl) end
    return 1
  end
  return 0
end
local now = nil
local function renew_hold(l, h, t, owner, ttl, marker, data)
  if redis.call('GET', l) ~= marker then return 0 end
  if not now then
    local tm = redis.call('TIME')
    now = tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000)
  end
  local ends = redis.call('ZSCORE', h, owner)
  if not ends or tonumber(ends) <= now then return 0 end
  ttl = tonumber(ttl)
  redis.call('ZADD', h, now + ttl, owner)
  local keep = math.max(redis.call('PTTL', l), ttl)
  redis.call('PEXPIRE', l, keep)
  redis.call('PEXPIRE', h, keep)
  redis.call('PEXPIRE', t, keep)
  if data == '1' then redis.call('PEXPIRE', data_of(l), keep) end
  return 1
end
local out = {}
local k = 1
for i = 1, #args, 4 do
  local ok, r
  if args[i + 2] == '' then
    ok, r = pcall(renew, keys[k], args[i], args[i + 1], args[i + 3])
    k = k + 1
  else
    ok, r = pcall(renew_hold, keys[k], keys[k + 1], keys[k + 2], args[i], args[i + 1], args[i + 2], args[i + 3])
    k = k + 3
  end
  if ok then
    out[#out + 1] = r
  elseif type(r) == 'table' and r.err then
    out[#out + 1] = r.err
  else
    out[#out + 1] = tostring(r)
  end
end
return out
";

/// The release of an uncontended exclusive lock: deletes the lock key (and the hold's data,
/// `data_of`, see [`data_of`]) if it holds the owner
/// and nobody is queued (nobody to hand over to or to wake), with the two keys and the one
/// argument that needs, where [`RELEASE`] takes three keys and five arguments: half the bytes
/// on the wire, and a little less server time (Redis 7.0, 6 rounds of 20,000 pipelined calls:
/// 2.7-4.0 µs a call, median 3.6, against 3.4-4.7 µs, median 3.8). Anything else (waiters, a
/// reservation, a lost lock) is [`RELEASE`]'s to decide.
///
/// KEYS: lock, queue. ARGV: owner. Returns 1 if the lock was released, else 0 (nothing done).
pub(crate) static RELEASE_ALONE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(&format!(
        r"
if redis.call('GET', KEYS[1]) == ARGV[1] and redis.call('EXISTS', KEYS[2]) == 0 then
  redis.call('DEL', KEYS[1], {})
  return 1
end
return 0
",
        data_key("KEYS[1]")
    ))
});

/// Owner-checked release with handoff, abandonment of an attempt, or a Redlock retreat. The
/// hold's data (`d`, see [`SET_DATA`]) goes with the lock key.
///
/// KEYS: lock, fence, queue, alive, data, holders, tokens.
/// ARGV: owner, fair ("1"), handoff ms, channel, mode: "release" (the owner is done: also
/// leave the queue), "abandon" (the same for an attempt that ends without the lock: it also
/// gives up a reservation or a hand-over made for it), "retreat" (Redlock, after a failed
/// majority: only give the lock back, keep the place in the queue and any reservation) or
/// "leave" (Redlock, after a majority granted: leave the queue and give up a reservation,
/// keep a hold);
/// hand-over lease ms ("0": reserve instead), [`SEED_FLOOR`], forget ms (see [`NEXT_TOKEN`]).
///
/// Then, if this call freed the lock (or gave up a turn), picks the oldest live waiter and:
/// - with a hand-over lease (`ARGV[6]` > 0), **hands the lock over**: sets the lock key to the
///   waiter's owner value for that lease, steps the fencing counter as its acquisition would
///   ([`NEXT_TOKEN`]), takes it out of the queue and publishes [`HANDED_OVER`] + lease ms +
///   `:` + token + NUL + owner. The waiter holds on the message alone when it asked for the same
///   lease (see `attempt.rs`); otherwise its next poll finds the lock its own and restarts the
///   lease with its own ttl (the acquire script's retry branch). A client that predates the
///   hand-over reads the message as a list of owners that names it, and polls the same way;
/// - otherwise reserves the lock for it for `handoff` ms by storing [`RESERVED_PREFIX`] + its
///   owner in the lock key (default mode; the fair mode's queue needs no reservation) and
///   publishes its owner value on the channel (empty payload: nobody waits).
///
/// When readers head the queue of a lock this call freed, with a hand-over lease it hands the
/// lock over to them (up to the first writer, at most 128): a new epoch of shared holds in
/// `h` and `t` as their acquisitions would make it (marker, lease, a token each), out of the
/// queue, and one message [`HANDED_OVER`] + lease ms + `:` + their tokens (comma-separated) +
/// NUL + their owners (NUL-separated, in the same order). Otherwise it wakes them as
/// [`HOLD_RELEASE`](crate::kinds::HOLD_RELEASE) does (reserving the free lock for the readers
/// in the default mode), and a writer that leaves the head of the queue while readers hold
/// wakes the readers queued behind it. Returns 1 if the lock was released, else 0.
pub(crate) static RELEASE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        &[
            r"
local owner = ARGV[1]
local mode = ARGV[5]
local holder = redis.call('GET', KEYS[1])
if mode == 'release' and holder == owner and redis.call('EXISTS', KEYS[3]) == 0 then
  -- Nobody queued: nobody to hand over to or to wake.
  redis.call('DEL', KEYS[1], KEYS[5])
  return 1
end
",
            // Defined after the uncontended release returned: it does not pay for them.
            HELPERS,
            r"
local fair = ARGV[2] == '1'
local released = 0
local handoff = false
if holder == owner and mode ~= 'leave' then
  redis.call('DEL', KEYS[1], KEYS[5])
  holder = false
  released = 1
  handoff = true
elseif holder == '\0next:' .. owner and mode ~= 'retreat' then
  redis.call('DEL', KEYS[1])
  holder = false
  handoff = true
end
if mode ~= 'retreat' then
  if redis.call('ZRANGE', KEYS[3], 0, 0)[1] == owner then handoff = true end
  redis.call('ZREM', KEYS[3], owner)
  redis.call('ZREM', KEYS[4], owner)
end
-- Readers holding: a writer that left the head of the queue may unblock the readers behind it.
if (holder and holder ~= '\0shared') or not handoff then return released end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
prune_waiters(KEYS[3], KEYS[4], now)
local nxt = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
local lease = tonumber(ARGV[6])
if nxt and lease > 0 and not holder and string.sub(nxt, 1, 3) == '\0s:' then
  -- Hands the lock over to the live readers at the head (up to the first writer, at most
  -- 128; the pruning above drops at most 64 dead waiters): a new epoch of shared holds, each
  -- with its lease and token, as their acquisitions would have made it, and one message
  -- with every reader's token.
  local readers = {}
  for _, w in ipairs(redis.call('ZRANGE', KEYS[3], 0, 127)) do
    if string.sub(w, 1, 3) ~= '\0s:' then break end
    if tonumber(redis.call('ZSCORE', KEYS[4], w) or '0') > now then
      readers[#readers + 1] = w
    else
      redis.call('ZREM', KEYS[3], w)
      redis.call('ZREM', KEYS[4], w)
    end
  end
  if #readers > 0 then
    redis.call('DEL', KEYS[5], KEYS[6], KEYS[7])
    redis.call('SET', KEYS[1], '\0shared', 'PX', lease)
    local floor = tonumber(ARGV[7])
    local fence_keep = lease + tonumber(ARGV[8])
    local owners, tokens = {}, {}
    for _, w in ipairs(readers) do
",
            &grant_hold("KEYS[6]", "KEYS[7]"),
            r"
    end
    redis.call('PEXPIRE', KEYS[6], lease)
    redis.call('PEXPIRE', KEYS[7], lease)
",
            &publish_holds("''"),
            r"
    return released
  end
  -- Every reader at the head was dead: whoever is next now.
  nxt = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
end
if nxt and string.byte(nxt, 1) == 0 then
  wake_holds(KEYS[1], KEYS[3], ARGV[4], not holder and not fair, ARGV[3])
  return released
end
if holder then return released end
if nxt and lease > 0 then
",
            &hand_over("nxt", "lease"),
            r"
  return released
end
if nxt and not fair then
  redis.call('SET', KEYS[1], '\0next:' .. nxt, 'PX', ARGV[3])
  redis.call('ZREM', KEYS[3], nxt)
  redis.call('ZREM', KEYS[4], nxt)
end
redis.call('PUBLISH', ARGV[4], nxt or '')
return released
",
        ]
        .concat(),
    )
});

/// The head of a hand-over message ([`RELEASE`]): NUL (so that a client that predates the
/// hand-over reads the message as a list of owners) and a byte no owner value starts with.
pub(crate) const HANDED_OVER: &[u8] = b"\0\x01";

/// Raises a fencing counter to at least a value (Redlock, so that every node of a later
/// majority continues above the token just handed out), kept as the acquire scripts keep it
/// ([`NEXT_TOKEN`]). KEYS: fence. ARGV: value, keep ms (the lease plus `forget_after`).
pub(crate) static RAISE_FENCE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        r"
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
local want = tonumber(ARGV[1])
if cur < want then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return want
end
return cur
",
    )
});

/// The raw floor's compare-and-delete. KEYS: lock. ARGV: owner.
#[cfg(feature = "bench")]
pub(crate) static COMPARE_AND_DELETE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
",
    )
});

/// Lua shared by the scripts that wake waiters: pruning dead waiters, and waking the shared
/// or permit waiters at the head of the queue.
///
/// Queue members: a writer (exclusive waiter) is its owner value; a reader is `"\0s:" + owner`,
/// a permit waiter `"\0p:" + owner` (no owner value starts with NUL). A wake-up addressed to
/// several waiters is one message: `"\0" + owner + "\0" + owner ...`.
const HELPERS: &str = r"
-- Removes the members of `z` scored at or before `now` (at most `limit`), and each one's
-- entry in `other` (by `cmd`: 'ZREM', 'HDEL').
local function prune(z, other, cmd, now, limit)
  local gone = redis.call('ZRANGEBYSCORE', z, '-inf', now, 'LIMIT', 0, limit)
  for _, m in ipairs(gone) do
    redis.call('ZREM', z, m)
    redis.call(cmd, other, m)
  end
end
-- Drops waiters that stopped polling.
local function prune_waiters(q, alive, now) prune(alive, q, 'ZREM', now, 64) end
-- Drops holders whose lease ended (at most 128; the others are not counted as live anyway),
-- with their tokens (`t`) and data (`d`).
local function prune_holders(h, t, d, now)
  local gone = redis.call('ZRANGEBYSCORE', h, '-inf', now, 'LIMIT', 0, 128)
  for _, m in ipairs(gone) do
    redis.call('ZREM', h, m)
    redis.call('HDEL', t, m)
    redis.call('HDEL', d, m)
  end
end
-- The lock key's marker and the queue member of `owner` for a hold of `permits` (0: shared).
local function hold_names(owner, permits)
  if permits == '0' then return '\0shared', '\0s:' .. owner end
  return '\0permits:' .. permits, '\0p:' .. owner
end
-- Publishes one wake-up for the waiters `members` (queue members).
local function publish_to(channel, members)
  if #members == 0 then return end
  if #members == 1 then
    local m = members[1]
    if string.byte(m, 1) == 0 then m = string.sub(m, 4) end
    redis.call('PUBLISH', channel, m)
    return
  end
  local owners = {}
  for i, m in ipairs(members) do
    if string.byte(m, 1) == 0 then m = string.sub(m, 4) end
    owners[i] = m
  end
  redis.call('PUBLISH', channel, '\0' .. table.concat(owners, '\0'))
end
-- The queue's head is a reader or a permit waiter: wakes the readers at the head up to the
-- first writer (at most 128), or the permit waiter at the head. `reserve`: the lock is free
-- and may be reserved for the readers for `handoff` ms (default mode), so that no writer
-- arriving meanwhile takes it first.
local function wake_holds(l, q, channel, reserve, handoff)
  local ws = redis.call('ZRANGE', q, 0, 127)
  if string.sub(ws[1], 1, 3) ~= '\0s:' then
    publish_to(channel, {ws[1]})
    return
  end
  local readers = {}
  for _, w in ipairs(ws) do
    if string.sub(w, 1, 3) ~= '\0s:' then break end
    readers[#readers + 1] = w
  end
  if reserve then
    redis.call('SET', l, '\0next:\0readers', 'PX', handoff)
  end
  publish_to(channel, readers)
end
";

/// `script` with [`HELPERS`] in front.
pub(crate) fn with_helpers(script: &str) -> Lua {
    Lua::new(&[HELPERS, script].concat())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LockKeys;

    /// What the Lua of [`data_key`] computes, in Rust: `string.sub(l, 1, a) .. 'd' ..
    /// string.sub(l, b)` (1-based, inclusive).
    fn lua_data_key(lock: &str) -> String {
        let expr = data_key("l");
        let numbers: Vec<usize> = expr
            .split(|c: char| !c.is_ascii_digit())
            .filter_map(|n| n.parse().ok())
            .collect();
        let [1, to, from] = numbers[..] else {
            panic!("unexpected expression {expr}")
        };
        format!("{}d{}", &lock[..to], &lock[from - 1..])
    }

    #[test]
    fn the_scripts_data_key_is_the_names_data_key() {
        for name in ["a", "jobs/*x", "{tag}:l:q", "ünï/çødé"] {
            let keys = LockKeys::for_name(name).unwrap();
            assert_eq!(lua_data_key(&keys.lock), keys.data(), "{name}");
        }
        assert!(data_of().starts_with("local function data_of(l) return string.sub(l, 1, 28)"));
    }

    /// A connection that opens a new one to the server for every request: what a reconnect,
    /// or a master the Sentinels name anew, does between two requests.
    struct Fresh(redis::Client);

    impl Fresh {
        async fn connection(&self) -> RedisResult<redis::aio::MultiplexedConnection> {
            let config = redis::AsyncConnectionConfig::new()
                .set_response_timeout(Some(std::time::Duration::from_secs(10)));
            self.0
                .get_multiplexed_async_connection_with_config(&config)
                .await
        }
    }

    impl redis::aio::ConnectionLike for Fresh {
        fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> redis::RedisFuture<'a, Value> {
            Box::pin(async move { self.connection().await?.req_packed_command(cmd).await })
        }

        fn req_packed_commands<'a>(
            &'a mut self,
            cmd: &'a redis::Pipeline,
            offset: usize,
            count: usize,
        ) -> redis::RedisFuture<'a, Vec<Value>> {
            Box::pin(async move {
                let mut conn = self.connection().await?;
                conn.req_packed_commands(cmd, offset, count).await
            })
        }

        fn get_db(&self) -> i64 {
            0
        }
    }

    /// Test services stopped (`SIGSTOP`), resumed when dropped, also by a failing test.
    struct Stopped(Vec<String>);

    impl Stopped {
        fn signal(name: &str, signal: &str) -> bool {
            let dir = std::env::var("DISTLOCK_SERVICES_DIR").unwrap_or_else(|_| {
                concat!(env!("CARGO_MANIFEST_DIR"), "/../target/services").to_owned()
            });
            let Ok(pid) = std::fs::read_to_string(format!("{dir}/run/{name}.pid")) else {
                return false;
            };
            let status = std::process::Command::new("kill")
                .args([signal, pid.trim()])
                .status();
            status.is_ok_and(|s| s.success())
        }

        fn stop(names: &[String]) -> Self {
            let mut stopped = Self(Vec::new());
            for name in names {
                assert!(Self::signal(name, "-STOP"), "could not stop {name}");
                stopped.0.push(name.clone());
            }
            stopped
        }
    }

    impl Drop for Stopped {
        fn drop(&mut self) {
            for name in self.0.drain(..) {
                Self::signal(&name, "-CONT");
            }
        }
    }

    /// The master the Sentinels of `url` name, and the ports of every replica they know.
    async fn sentinel_view(url: &str) -> (redis::Client, Vec<u16>) {
        let rest = url.split_once("://").expect("URL").1;
        let (hosts, name) = rest.split_once('/').expect("a master name");
        let name = name.split(['/', '?']).next().unwrap();
        for host in hosts.split(',') {
            let Ok(sentinel) = redis::Client::open(format!("redis://{host}")) else {
                continue;
            };
            let Ok(mut conn) = sentinel.get_multiplexed_async_connection().await else {
                continue;
            };
            let master: RedisResult<(String, u16)> = redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(name)
                .query_async(&mut conn)
                .await;
            let replicas: RedisResult<Vec<Vec<String>>> = redis::cmd("SENTINEL")
                .arg("replicas")
                .arg(name)
                .query_async(&mut conn)
                .await;
            let (Ok((host, port)), Ok(replicas)) = (master, replicas) else {
                continue;
            };
            let ports = replicas
                .iter()
                .filter_map(|fields| {
                    let at = fields.iter().position(|f| f == "port")?;
                    fields.get(at + 1)?.parse().ok()
                })
                .filter(|p| *p != port)
                .collect();
            let master = redis::Client::open(format!("redis://{host}:{port}")).unwrap();
            return (master, ports);
        }
        panic!("no Sentinel of {url} answered");
    }

    /// Waits (at most 30 s) until the master lists every one of `replicas` online.
    async fn all_online(master: &redis::Client, replicas: &[u16]) {
        let mut conn = master.get_multiplexed_async_connection().await.unwrap();
        for _ in 0..300 {
            let info: String = redis::cmd("INFO")
                .arg("replication")
                .query_async(&mut conn)
                .await
                .unwrap();
            let online = |port: &u16| {
                info.lines().any(|l| {
                    l.starts_with("slave")
                        && l.contains(&format!("port={port},"))
                        && l.contains("state=online")
                })
            };
            if replicas.iter().all(online) {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        panic!("the replicas {replicas:?} are not all online");
    }

    /// A renewal pipelined with `WAIT` counts the replicas that have the hold, also on a
    /// connection replaced since the acquisition: 0 with the master's replicas stopped (a
    /// `WAIT` sent alone, on a new connection, counted every replica at once), theirs once
    /// they run, and a hold the master lacks is not renewed.
    #[tokio::test]
    async fn a_renewal_with_wait_counts_the_replicas_that_have_the_hold() {
        let Some(url) =
            conformance_tests::server_var("redis_sentinel", "DISTLOCK_TEST_REDIS_SENTINEL_URL")
        else {
            return;
        };
        let _group = crate::topology::SENTINEL_GROUP.lock().await;
        let (master, replicas) = sentinel_view(&url).await;
        assert!(!replicas.is_empty(), "the Sentinels know no replica");
        all_online(&master, &replicas).await;
        let mut fresh = Fresh(master);
        let owner = || uuid::Uuid::new_v4().to_string();
        let keys = |owner: &str| LockKeys::for_name(&format!("acked-{owner}")).unwrap();
        let acquire = |owner: &str| {
            let keys = keys(owner);
            Invocation::new(&ACQUIRE_FAST, &[&keys.lock, &keys.fence])
                .arg(owner)
                .arg(20_000)
                .arg(0)
                .arg(60_000)
        };
        let renew = |owner: &str| {
            let keys = keys(owner);
            Invocation::new(&RENEW, &[&keys.lock, &keys.data()])
                .arg(owner)
                .arg(20_000)
        };

        let a = owner();
        let names: Vec<String> = replicas.iter().map(|p| format!("redis-repl-{p}")).collect();
        let stopped = Stopped::stop(&names);
        let taken: RedisResult<Value> = acquire(&a).invoke(&mut fresh).await;
        let renewed = renew(&a).invoke_acked::<i64>(&mut fresh, 1, 300).await;
        drop(stopped);
        assert!(matches!(taken, Ok(Value::Int(_))), "not taken: {taken:?}");
        assert_eq!(
            renewed.expect("the renewal"),
            (1, 0),
            "counted stopped replicas"
        );

        let b = owner();
        let taken: RedisResult<Value> = acquire(&b).invoke(&mut fresh).await;
        assert!(matches!(taken, Ok(Value::Int(_))), "not taken: {taken:?}");
        let (renewed, acked) = renew(&b)
            .invoke_acked::<i64>(&mut fresh, 1, 5_000)
            .await
            .expect("the renewal");
        assert!(
            renewed == 1 && acked >= 1,
            "({renewed}, {acked}) once they run"
        );
        let (renewed, _) = renew(&owner())
            .invoke_acked::<i64>(&mut fresh, 1, 5_000)
            .await
            .expect("the renewal");
        assert_eq!(renewed, 0, "renewed a hold that is not there");
    }
}
