//! The shared (read) and permit (semaphore) kinds: the marker the lock key holds while their
//! holders live, their scripts ([`HOLD_ACQUIRE`], [`HOLD_RENEW`], [`HOLD_RELEASE`]) and the
//! calls a node runs them with, and how a node reads their holders ([`read_holders`]). The
//! exclusive kind (the mutex, the write side) keeps its scripts in `scripts.rs` and its steps in
//! `node/locking.rs`, which also runs these calls. What both kinds share stays in `scripts.rs`:
//! the Lua helpers that prune the queue and wake readers and permit waiters, and the batched
//! renewal's script.

use std::sync::LazyLock;
use std::time::Duration;

use distlock_core::{AcquireRequest, AttemptMode, LockKind};

use crate::RedisConfig;
use crate::keys::LockKeys;
use crate::node::{Holding, ReleaseMode, millis, seed_floor};
use crate::scripts::{
    BUSY, Invocation, Lua, NEXT_TOKEN, grant_hold, hand_over, publish_holds, with_helpers,
};
use crate::topology::Conn;

/// The lock key's value while readers hold the lock (its TTL covers the latest reader's
/// lease). Like every value this crate stores besides owners, it starts with NUL.
pub(crate) const SHARED_MARKER: &str = "\0shared";

/// The lock key's value while permits of a semaphore of `permits` are held.
pub(crate) fn permits_marker(permits: u32) -> String {
    format!("\0permits:{permits}")
}

/// The kind of the holders a lock key's value stands for, if it is a marker of shared or
/// permit holders (see [`HOLD_ACQUIRE`]).
pub(crate) fn marker_kind(value: &[u8]) -> Option<LockKind> {
    if value == SHARED_MARKER.as_bytes() {
        return Some(LockKind::Shared);
    }
    let digits = value.strip_prefix(b"\0permits:")?;
    let permits: u32 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(LockKind::Permit { permits })
}

/// The kind a script's mismatch answer names (-1 exclusive, 0 shared, N permits).
pub(crate) fn held_kind(code: i64) -> LockKind {
    match u32::try_from(code) {
        Ok(0) => LockKind::Shared,
        Ok(permits) => LockKind::Permit { permits },
        Err(_) => LockKind::Exclusive,
    }
}

/// The permits argument of the hold scripts: 0 for a shared hold.
fn permits_arg(kind: LockKind) -> u32 {
    match kind {
        LockKind::Permit { permits } => permits,
        _ => 0,
    }
}

/// The lock key's value while holders of `kind` (shared or permits) live.
pub(crate) fn marker(kind: LockKind) -> String {
    match kind {
        LockKind::Permit { permits } => permits_marker(permits),
        _ => SHARED_MARKER.to_owned(),
    }
}

/// Acquire (or queue) a shared hold or a permit, one round trip. The holders are the sorted
/// set `h` (owner -> server time at which its lease ends) and their tokens the hash `t`;
/// while any may live, the lock key holds the kind's marker ([`SHARED_MARKER`],
/// [`permits_marker`]) with a TTL that covers the latest lease, so the exclusive paths (the
/// fast path's `SET NX` included) refuse by themselves and need no change. A holder is live
/// while its lease has not ended **and** the lock key holds the marker: the first holder of a
/// new marker (a new epoch) drops whatever `h` and `t` still hold. A writer's release hands
/// the free lock over to the readers at the head of the queue (a new epoch it writes itself,
/// see [`RELEASE`](crate::scripts::RELEASE)), or, without the hand-over, wakes them and
/// reserves the lock for them (default mode) with `"\0next:\0readers"`, a reservation (it
/// starts with [`RESERVED_PREFIX`](crate::scripts::RESERVED_PREFIX)) for no owner, which
/// readers join as a new epoch.
///
/// Served in arrival order in both modes: a reader holds when no writer is ahead of it in
/// the queue (a waiting writer queues new readers behind it) and no writer holds or has the
/// lock reserved. A Redlock reader's place is its arrival score (the same on every master),
/// so a reader not queued yet is behind the writers of strictly lower scores only (a reader
/// sorts before a writer of the same score): one that arrived first but reaches this master
/// after a writer queued here holds at once unless a writer holds or has the lock reserved,
/// rather than queue ahead of that writer, where no reader's release woke it (they served a
/// writer at the head only; the readers at the head waited to the backoff's maximum, the
/// writer behind them too: the RW mix's 250 ms stalls on three masters). A
/// permit holds when the live holders plus the permit waiters ahead of it are fewer than the
/// permits.
///
/// The holders' data ([`SET_DATA`](crate::scripts::SET_DATA)) is the hash `d`, kept with `h`
/// and `t`: dropped with them at a new epoch, a pruned holder's field with its entry.
///
/// KEYS: lock, fence, queue, alive, holders, tokens, data.
/// ARGV: owner, ttl ms, wait ("1" to queue), (unused), waiter timeout ms, arrival score
/// ("" = the server's time in microseconds), [`SEED_FLOOR`](crate::scripts::SEED_FLOOR), permits
/// (0 = a shared hold), forget ms (see [`NEXT_TOKEN`]).
/// Returns `{1, token}` when acquired, `{0, retry_ms, counter}` when busy (`retry_ms` < 0:
/// unknown; see [`BUSY`]),
/// `{2, held}` when the name is held as a kind this request can never join (`held`: -1
/// exclusive, 0 shared, N a semaphore of N permits).
pub(crate) static HOLD_ACQUIRE: LazyLock<Lua> = LazyLock::new(|| {
    with_helpers(&[
        r"
local owner = ARGV[1]
local ttl = tonumber(ARGV[2])
local n = tonumber(ARGV[8])
local marker, member = hold_names(owner, ARGV[8])
local holder = redis.call('GET', KEYS[1])
local readers_reserved = holder == '\0next:\0readers'
if holder and holder ~= marker then
  local held = -1
  if holder == '\0shared' or readers_reserved then
    held = 0
  elseif string.sub(holder, 1, 9) == '\0permits:' then
    held = tonumber(string.sub(holder, 10)) or -1
  end
  if n > 0 or held > 0 then return {2, held} end
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local epoch = holder == marker
local count = 0
if epoch then
  prune_holders(KEYS[5], KEYS[6], KEYS[7], now)
  if redis.call('ZSCORE', KEYS[5], owner) then
    -- A retry after a lost reply: the hold is already ours; restart its lease.
    redis.call('ZADD', KEYS[5], now + ttl, owner)
    local keep = math.max(redis.call('PTTL', KEYS[1]), ttl)
    redis.call('PEXPIRE', KEYS[1], keep)
    redis.call('PEXPIRE', KEYS[5], keep)
    redis.call('PEXPIRE', KEYS[6], keep)
    redis.call('PEXPIRE', KEYS[7], keep)
    return {1, tonumber(redis.call('HGET', KEYS[6], owner) or '0')}
  end
  -- Only a permit counts the holders: a reader is blocked by writers alone.
  if n > 0 then count = redis.call('ZCOUNT', KEYS[5], '(' .. now, '+inf') end
end
prune_waiters(KEYS[3], KEYS[4], now)
local blocked = nil
local rank = redis.call('ZRANK', KEYS[3], member)
if holder and not epoch and not readers_reserved then
  -- A writer holds the lock, or has it reserved.
  blocked = redis.call('PTTL', KEYS[1])
elseif n == 0 then
  local ahead = {}
  if not rank and ARGV[6] ~= '' then
    ahead = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', '(' .. ARGV[6])
  elseif not rank then
    ahead = redis.call('ZRANGE', KEYS[3], 0, -1)
  elseif rank > 0 then
    ahead = redis.call('ZRANGE', KEYS[3], 0, rank - 1)
  end
  for _, w in ipairs(ahead) do
    if string.sub(w, 1, 3) ~= '\0s:' then
      -- A writer waits ahead: it goes first.
      blocked = math.max(redis.call('PTTL', KEYS[1]), -1)
      break
    end
  end
else
  local ahead = rank or redis.call('ZCARD', KEYS[3])
  if count + ahead >= n then
    blocked = -1
    if count >= n then
      local first = redis.call('ZRANGEBYSCORE', KEYS[5], '(' .. now, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
      if first[2] then blocked = math.max(tonumber(first[2]) - now, 1) end
    end
  end
end
",
        BUSY,
        r"
if not epoch then
  redis.call('DEL', KEYS[5], KEYS[6], KEYS[7])
end
redis.call('ZADD', KEYS[5], now + ttl, owner)
local keep = ttl
if epoch then keep = math.max(redis.call('PTTL', KEYS[1]), ttl) end
redis.call('SET', KEYS[1], marker, 'PX', keep)
local floor = tonumber(ARGV[7])
local fence_keep = keep + tonumber(ARGV[9])
",
        NEXT_TOKEN,
        r"
redis.call('HSET', KEYS[6], owner, token)
redis.call('PEXPIRE', KEYS[5], keep)
redis.call('PEXPIRE', KEYS[6], keep)
redis.call('PEXPIRE', KEYS[7], keep)
if rank then
  redis.call('ZREM', KEYS[3], member)
  redis.call('ZREM', KEYS[4], member)
end
return {1, token}
",
    ]
    .concat())
});

/// Owner-checked extension of a shared hold or a permit (the holders' data key with it).
/// KEYS: lock, holders, tokens, data. ARGV: owner, ttl ms, the kind's marker. Returns 1, or 0
/// when the owner does not hold.
pub(crate) static HOLD_RENEW: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        r"
if redis.call('GET', KEYS[1]) ~= ARGV[3] then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ends = redis.call('ZSCORE', KEYS[2], ARGV[1])
if not ends or tonumber(ends) <= now then return 0 end
local ttl = tonumber(ARGV[2])
redis.call('ZADD', KEYS[2], now + ttl, ARGV[1])
local keep = math.max(redis.call('PTTL', KEYS[1]), ttl)
redis.call('PEXPIRE', KEYS[1], keep)
redis.call('PEXPIRE', KEYS[2], keep)
redis.call('PEXPIRE', KEYS[3], keep)
redis.call('PEXPIRE', KEYS[4], keep)
return 1
",
    )
});

/// Owner-checked release of a shared hold or a permit, abandonment of such an attempt, a
/// Redlock retreat, or a forced release of every holder.
///
/// A holder's data goes with it (its field of `d`, or the whole key with the last holder or a
/// forced release). The marker and the holders' keys last at least to the latest lease (every
/// acquisition, renewal and hand-over extends them to its own): a leave shrinks them to the
/// latest lease left only when the marker lasts longer (the leaver's lease ended last, or a
/// hand-over's lease outlasted the holds), and otherwise leaves them as they are (one `PTTL`
/// instead of four `PEXPIRE`s for most releases of a read hold among others).
///
/// KEYS: lock, fence, queue, alive, holders, tokens, data.
/// ARGV: owner, fair ("1"), handoff ms, channel, mode ("release", "abandon", "retreat",
/// "leave" as for [`RELEASE`](crate::scripts::RELEASE), or "force": end every holder), permits
/// (0 = shared),
/// [`SEED_FLOOR`](crate::scripts::SEED_FLOOR), forget ms, hand-over lease ms ("0": none).
///
/// An abandon of a permit attempt that finds the name a semaphore of other permits (a misuse
/// its poll refused) gives back, as that semaphore's, a permit that one handed it.
///
/// Then serves the waiters this call unblocks: when the last holder left and a writer heads
/// the queue, that writer, as the mutex's release does (the lock handed over to it with a
/// hand-over lease, else reserved for it in the default mode); and readers it finds at the
/// head of a name that is free or held by readers (the writer ahead of them was pruned dead,
/// or more readers waited than a writer's release hands over to), woken (a free lock
/// reserved for them in the default mode) as a writer's release without the hand-over does;
/// for a semaphore, with a hand-over lease, once a hold of this call's left or while holders
/// of its permits live, each free permit goes to the live permit waiter first in line for it
/// (at most 128): a hold of its own in `h` and `t` as its acquisition would make it (lease,
/// token; a new epoch if the last holder took the lock key with it), out of the queue, and
/// one message [`HANDED_OVER`](crate::scripts::HANDED_OVER) + lease ms + `/` + permits + `:` +
/// their tokens (comma-separated) + NUL + their owners (NUL-separated): the permits tell a waiter
/// that the hold is of its own semaphore. Without the lease, it wakes the permit
/// waiters whose place in the queue now fits in the free permits and did not before (one
/// for one released permit). Returns 1 if a live hold was released, else 0; force: the owners
/// of the live holds it ended (an array, empty if none), or 0 if the lock key held no marker
/// of `kind`.
pub(crate) static HOLD_RELEASE: LazyLock<Lua> = LazyLock::new(|| {
    with_helpers(
        &[
            r"
local owner = ARGV[1]
local fair = ARGV[2] == '1'
local mode = ARGV[5]
local n = tonumber(ARGV[6])
local marker, member = hold_names(owner, ARGV[6])
local holder = redis.call('GET', KEYS[1])
if mode == 'abandon' and n > 0 and holder and holder ~= marker
    and string.sub(holder, 1, 9) == '\0permits:' then
  -- A release of a semaphore of other permits may have handed this attempt (a misuse that
  -- its poll refused) a permit of that one: it gives it back, as that semaphore's.
  marker = holder
  n = tonumber(string.sub(holder, 10)) or 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local released = 0
local left = false
local before = 0
if holder == marker then
  prune_holders(KEYS[5], KEYS[6], KEYS[7], now)
  before = redis.call('ZCOUNT', KEYS[5], '(' .. now, '+inf')
  if mode == 'force' then
    -- The owners it ends, as the answer (an array, not 0 or 1: see the doc).
    released = redis.call('ZRANGEBYSCORE', KEYS[5], '(' .. now, '+inf')
    redis.call('DEL', KEYS[5], KEYS[6], KEYS[7])
    left = true
  elseif mode ~= 'leave' then
    local ends = redis.call('ZSCORE', KEYS[5], owner)
    if ends then
      redis.call('ZREM', KEYS[5], owner)
      redis.call('HDEL', KEYS[6], owner)
      redis.call('HDEL', KEYS[7], owner)
      left = true
      if tonumber(ends) > now then released = 1 end
    end
  end
end
local moved = nil
if mode == 'release' or mode == 'abandon' or mode == 'leave' then
  moved = redis.call('ZRANK', KEYS[3], member)
  if moved then
    redis.call('ZREM', KEYS[3], member)
    redis.call('ZREM', KEYS[4], member)
  end
end
if not left and not moved then return released end
local count = 0
if holder == marker and left then
  -- The holders left live: every entry is live after the prune, and this call ended one
  -- live hold (`released`) or all of them (force).
  if mode == 'force' then count = 0 else count = before - released end
  if count == 0 then
    redis.call('DEL', KEYS[1], KEYS[5], KEYS[6], KEYS[7])
    holder = false
  else
    -- The marker (and the holders' keys with it) lasts at least to the latest lease left:
    -- shrink them to it only where the marker lasts longer (the leaver's lease ended last,
    -- or a hand-over's lease outlasted the holds), within the millisecond of `now`.
    local last = redis.call('ZRANGE', KEYS[5], -1, -1, 'WITHSCORES')
    local keep = math.max(tonumber(last[2]) - now, 1)
    if redis.call('PTTL', KEYS[1]) > keep + 2 then
      redis.call('PEXPIRE', KEYS[1], keep)
      redis.call('PEXPIRE', KEYS[5], keep)
      redis.call('PEXPIRE', KEYS[6], keep)
      redis.call('PEXPIRE', KEYS[7], keep)
    end
  end
elseif holder == marker then
  count = before
end
prune_waiters(KEYS[3], KEYS[4], now)
local head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
if not head then return released end
if not holder and string.byte(head, 1) ~= 0 then
  -- Free, and a writer is first: hand over as the mutex's release does.
  local lease = tonumber(ARGV[9])
  if lease > 0 then
",
            &hand_over("head", "lease"),
            r"
    return released
  end
  if not fair then
    redis.call('SET', KEYS[1], '\0next:' .. head, 'PX', ARGV[3])
    redis.call('ZREM', KEYS[3], head)
    redis.call('ZREM', KEYS[4], head)
  end
  redis.call('PUBLISH', ARGV[4], head)
elseif n == 0 and (not holder or holder == marker) and string.sub(head, 1, 3) == '\0s:' then
  -- Free or held by readers, and readers are first: whatever held them back is gone (a
  -- writer ahead of them pruned dead, or more readers queued than a hand-over takes).
  -- Woken, they join.
  wake_holds(KEYS[1], KEYS[3], ARGV[4], not holder and not fair, ARGV[3])
elseif n > 0 and (not holder or holder == marker) then
  local lease = tonumber(ARGV[9])
  if lease > 0 and count < n and (left or holder == marker) then
    -- Hands each free permit to the live permit waiter first in line for it (at most 128):
    -- a hold of its own, with the lease and a token, as its acquisition would make it (a
    -- new epoch if the lock key went with the last holder), out of the queue, and one
    -- message with every token and the permits.
    local free = math.min(n - count, 128)
    local keep = lease
    if holder then keep = math.max(redis.call('PTTL', KEYS[1]), lease) end
    local floor = tonumber(ARGV[7])
    local fence_keep = keep + tonumber(ARGV[8])
    local owners, tokens = {}, {}
    for _, w in ipairs(redis.call('ZRANGE', KEYS[3], 0, free + 63)) do
      if #owners >= free or string.sub(w, 1, 3) ~= '\0p:' then break end
      if tonumber(redis.call('ZSCORE', KEYS[4], w) or '0') > now then
        if not holder then
          redis.call('DEL', KEYS[5], KEYS[6], KEYS[7])
          redis.call('SET', KEYS[1], marker, 'PX', keep)
          holder = marker
        end
",
            &grant_hold("KEYS[5]", "KEYS[6]"),
            r"
      else
        redis.call('ZREM', KEYS[3], w)
        redis.call('ZREM', KEYS[4], w)
      end
    end
    if #owners > 0 then
      redis.call('PEXPIRE', KEYS[1], keep)
      redis.call('PEXPIRE', KEYS[5], keep)
      redis.call('PEXPIRE', KEYS[6], keep)
      redis.call('PEXPIRE', KEYS[7], keep)
",
            &publish_holds("'/' .. string.format('%d', n)"),
            r"
      return released
    end
  end
  -- The waiter at place i may hold iff count + i < n: wake those that fit now and did not.
  local hi = n - count - 1
  local lo = hi
  if left then lo = n - before end
  if lo < 0 then lo = 0 end
  if hi - lo > 127 then hi = lo + 127 end
  if hi >= lo and (left or moved <= hi) then
    publish_to(ARGV[4], redis.call('ZRANGE', KEYS[3], lo, hi))
  end
end
return released
",
        ]
        .concat(),
    )
});

/// One live shared or permit holder.
#[derive(Debug, Clone)]
pub(crate) struct Holder {
    pub(crate) owner: String,
    pub(crate) token: Option<u64>,
    /// Remaining lease, ms.
    pub(crate) remaining: i64,
}

/// The server's `TIME`, the holders with the ends of their leases (ms) and their tokens.
type HoldersRead = (
    (u64, u64),
    Vec<(String, i64)>,
    std::collections::HashMap<String, u64>,
);

/// The call of [`HOLD_ACQUIRE`] for `request` (a shared hold or a permit): its keys and
/// arguments.
pub(crate) fn acquire_call(
    keys: &LockKeys,
    request: &AcquireRequest,
    config: &RedisConfig,
    score: &str,
) -> Invocation {
    let (holders, tokens, data) = (keys.holders(), keys.tokens(), keys.data());
    Invocation::new(
        &HOLD_ACQUIRE,
        &[
            &keys.lock,
            &keys.fence,
            &keys.queue,
            &keys.alive,
            &holders,
            &tokens,
            &data,
        ],
    )
    .arg(&*request.owner)
    .arg(millis(request.ttl))
    .arg(if request.mode == AttemptMode::Wait {
        "1"
    } else {
        "0"
    })
    .arg("0")
    .arg(millis(config.waiter_timeout_for(request.ttl)))
    .arg(score)
    .arg(seed_floor(config))
    .arg(permits_arg(request.kind))
    .arg(millis(config.forget_after))
}

/// The call of [`HOLD_RENEW`] for `owner`'s hold of `kind` (shared or permits).
pub(crate) fn renew_call(
    keys: &LockKeys,
    owner: &str,
    ttl: Duration,
    kind: LockKind,
) -> Invocation {
    Invocation::new(
        &HOLD_RENEW,
        &[&keys.lock, &keys.holders(), &keys.tokens(), &keys.data()],
    )
    .arg(owner)
    .arg(millis(ttl))
    .arg(marker(kind))
}

/// The call of [`HOLD_RELEASE`] for `owner`'s hold of `kind` (shared or permits), or for
/// every holder ([`ReleaseMode::Force`]); `hand_over`: the lease with which the last holder
/// hands the lock to a writer at the head of the queue, and a permit's release each freed
/// permit to the permit waiter first in line for it (`None`: reserved or woken instead).
pub(crate) fn release_call(
    keys: &LockKeys,
    owner: &str,
    config: &RedisConfig,
    mode: ReleaseMode,
    kind: LockKind,
    hand_over: Option<Duration>,
) -> Invocation {
    let fair = if config.fair { "1" } else { "0" };
    Invocation::new(
        &HOLD_RELEASE,
        &[
            &keys.lock,
            &keys.fence,
            &keys.queue,
            &keys.alive,
            &keys.holders(),
            &keys.tokens(),
            &keys.data(),
        ],
    )
    .arg(owner)
    .arg(fair)
    .arg(millis(config.handoff))
    .arg(&keys.channel)
    .arg(mode.as_str())
    .arg(permits_arg(kind))
    .arg(seed_floor(config))
    .arg(millis(config.forget_after))
    .arg(hand_over.map_or(0, millis))
}

/// The live holders of a lock key that holds the marker of `kind`, read on `conn` from their
/// sorted set (lease not over by the server's clock) with their tokens (see
/// [`Node::inspect`](crate::node::Node::inspect)).
pub(crate) async fn read_holders(
    conn: &mut Conn,
    keys: &LockKeys,
    kind: LockKind,
) -> redis::RedisResult<Holding> {
    let ((secs, micros), members, tokens): HoldersRead = redis::pipe()
        .cmd("TIME")
        .zrange_withscores(keys.holders(), 0, -1)
        .hgetall(keys.tokens())
        .query_async(conn)
        .await?;
    let now = i64::try_from(secs * 1000 + micros / 1000).unwrap_or(i64::MAX);
    let holders: Vec<Holder> = members
        .into_iter()
        .map(|(owner, ends)| Holder {
            token: tokens.get(&owner).copied(),
            owner,
            remaining: ends - now,
        })
        .filter(|h| h.remaining > 0)
        .collect();
    Ok(if holders.is_empty() {
        Holding::Free
    } else {
        Holding::Holds { kind, holders }
    })
}
