//! The cases, each written once for every backend. Each returns [`Outcome`] or panics with
//! what went wrong.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use distlock_core::{
    AcquireOptions, Backoff, DistributedLock, Error, LockGuard, LockName, LossReason, OwnerId,
    Renewal,
};
use futures::future::join_all;
use rand::Rng;

use crate::{Ctx, HookError, HookResult, Outcome};

/// A wait long enough to never be the reason a case fails on a healthy server.
const LONG_WAIT: Duration = Duration::from_secs(60);

/// Turns a hook result into "go on", a skip, or a failure.
macro_rules! hook {
    ($result:expr) => {
        match $result {
            Ok(()) => {}
            Err(HookError::Unsupported(reason)) => return Outcome::Skipped(reason),
            Err(HookError::Failed(reason)) => panic!("fault hook failed: {reason}"),
        }
    };
}

fn long_ttl(ctx: &Ctx) -> Duration {
    let caps_max = ctx.harness().ttl() * 1000;
    Duration::from_secs(30).min(caps_max)
}

async fn acquire(client: &dyn DistributedLock, name: &str, opts: &AcquireOptions) -> LockGuard {
    match client
        .acquire(name, &opts.clone().with_wait(LONG_WAIT))
        .await
    {
        Ok(guard) => guard,
        Err(err) => panic!("acquire({name:?}) failed: {err}"),
    }
}

async fn try_acquire(
    client: &dyn DistributedLock,
    name: &str,
    opts: &AcquireOptions,
) -> Option<LockGuard> {
    match client.try_acquire(name, opts).await {
        Ok(guard) => guard,
        Err(err) => panic!("try_acquire({name:?}) failed: {err}"),
    }
}

async fn release(guard: LockGuard) {
    let name = guard.name().clone();
    if let Err(err) = guard.release().await {
        panic!("release({name:?}) failed: {err}");
    }
}

/// Polls `try_acquire` until it succeeds or `within` passes.
async fn acquire_within(
    client: &dyn DistributedLock,
    name: &str,
    opts: &AcquireOptions,
    within: Duration,
) -> Option<LockGuard> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(guard) = try_acquire(client, name, opts).await {
            return Some(guard);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// 8 clients x 50 acquisitions on one name: a deliberately non-atomic counter ends exact and
/// never more than one holder exists at a time.
pub async fn exclusive_under_contention(ctx: Ctx) -> Outcome {
    const CLIENTS: usize = 8;
    const ROUNDS: u64 = 50;
    let name = ctx.name("contended");
    let counter = Arc::new(AtomicU64::new(0));
    let holders = Arc::new(AtomicUsize::new(0));
    let max_holders = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let client = ctx.client().await;
        let (name, opts) = (name.clone(), ctx.opts());
        let (counter, holders, max_holders) =
            (counter.clone(), holders.clone(), max_holders.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let guard = acquire(&*client, &name, &opts).await;
                let now = holders.fetch_add(1, Ordering::SeqCst) + 1;
                max_holders.fetch_max(now, Ordering::SeqCst);
                let value = counter.load(Ordering::SeqCst);
                tokio::task::yield_now().await;
                counter.store(value + 1, Ordering::SeqCst);
                holders.fetch_sub(1, Ordering::SeqCst);
                assert!(
                    !guard.is_lost(),
                    "lost the lock inside a short critical section"
                );
                release(guard).await;
            }
        }));
    }
    for task in join_all(tasks).await {
        task.expect("a contending client panicked");
    }
    assert_eq!(
        max_holders.load(Ordering::SeqCst),
        1,
        "two clients held the lock at once"
    );
    assert_eq!(
        counter.load(Ordering::SeqCst),
        CLIENTS as u64 * ROUNDS,
        "lost update: exclusion failed"
    );
    Outcome::Passed
}

/// `try_acquire` on a held lock answers "not acquired", not an error, and promptly.
pub async fn try_acquire_on_held_lock_returns_none(ctx: Ctx) -> Outcome {
    let (a, b) = (ctx.client().await, ctx.client().await);
    let name = ctx.name("held");
    let guard = acquire(&*a, &name, &ctx.opts()).await;
    for _ in 0..5 {
        let started = Instant::now();
        assert!(
            try_acquire(&*b, &name, &ctx.opts()).await.is_none(),
            "a held lock was acquired twice"
        );
        assert!(
            started.elapsed() < ctx.slack() * 2,
            "try_acquire took {:?}",
            started.elapsed()
        );
    }
    release(guard).await;
    Outcome::Passed
}

/// `acquire` with a wait deadline fails with `Timeout` no earlier than the deadline and not much
/// after, and leaves nothing behind that blocks the next client.
pub async fn acquire_times_out_at_deadline(ctx: Ctx) -> Outcome {
    let (a, b, c) = (ctx.client().await, ctx.client().await, ctx.client().await);
    let name = ctx.name("deadline");
    let opts = ctx.opts().with_ttl(long_ttl(&ctx));
    let guard = acquire(&*a, &name, &opts).await;
    let wait = ctx.ttl().min(Duration::from_millis(700));
    let started = Instant::now();
    let result = b.acquire(&name, &opts.clone().with_wait(wait)).await;
    let took = started.elapsed();
    assert!(
        matches!(result, Err(Error::Timeout { .. })),
        "expected Timeout, got {result:?}"
    );
    assert!(
        took >= wait,
        "timed out after {took:?}, before the {wait:?} deadline"
    );
    assert!(
        took <= wait + ctx.slack(),
        "timed out after {took:?}, long after the {wait:?} deadline"
    );
    assert!(
        try_acquire(&*c, &name, &opts).await.is_none(),
        "the holder lost the lock"
    );
    release(guard).await;
    // The timed-out waiter must not block the next client (no stale queue entry).
    let next = try_acquire(&*c, &name, &opts).await;
    assert!(
        next.is_some(),
        "a timed-out waiter left something behind that blocks others"
    );
    release(next.expect("checked")).await;
    Outcome::Passed
}

/// A released lock can be taken by another client at once.
pub async fn release_frees_lock_at_once(ctx: Ctx) -> Outcome {
    let (a, b) = (ctx.client().await, ctx.client().await);
    let name = ctx.name("release");
    let opts = ctx.opts().with_ttl(long_ttl(&ctx));
    for _ in 0..3 {
        let guard = acquire(&*a, &name, &opts).await;
        release(guard).await;
        let guard = try_acquire(&*b, &name, &opts)
            .await
            .expect("the released lock was still held");
        release(guard).await;
    }
    Outcome::Passed
}

/// A blocked waiter is woken by the release, not by ttl expiry.
pub async fn release_wakes_blocked_waiter(ctx: Ctx) -> Outcome {
    let (a, b) = (ctx.client().await, ctx.client().await);
    let name = ctx.name("wake");
    let ttl = long_ttl(&ctx);
    let opts = ctx.opts().with_ttl(ttl);
    let guard = acquire(&*a, &name, &opts).await;
    let waiter = {
        let (name, opts) = (name.clone(), opts.clone());
        tokio::spawn(async move {
            let guard = acquire(&*b, &name, &opts).await;
            (Instant::now(), guard)
        })
    };
    tokio::time::sleep(ctx.slack()).await; // let the waiter block
    assert!(!waiter.is_finished(), "the waiter got a held lock");
    let released = Instant::now();
    release(guard).await;
    let (acquired, guard) = waiter.await.expect("waiter panicked");
    let handoff = acquired - released;
    let bound = ctx.slack() + opts.backoff.max;
    assert!(
        handoff < bound,
        "the waiter took {handoff:?} after the release (ttl {ttl:?}): not woken by it"
    );
    release(guard).await;
    Outcome::Passed
}

/// A crashed holder (renewal stopped, no release) frees the lock after the ttl: not before,
/// not much after.
pub async fn crashed_holder_frees_after_ttl(ctx: Ctx) -> Outcome {
    let (a, b) = (ctx.client().await, ctx.client().await);
    let name = ctx.name("crash");
    let ttl = ctx.ttl();
    let opts = ctx.opts().with_renewal(Renewal::disabled());
    let sent = Instant::now();
    let guard = acquire(&*a, &name, &opts).await;
    let answered = Instant::now();
    guard.abandon();
    let guard = acquire(&*b, &name, &opts).await;
    let taken = Instant::now();
    assert!(
        taken >= sent + ttl,
        "the lock was taken {:?} after the crashed holder's request, before its ttl {ttl:?}",
        taken - sent
    );
    assert!(
        taken <= answered + ttl + ctx.slack(),
        "the lock was free only {:?} after acquisition (ttl {ttl:?})",
        taken - answered
    );
    release(guard).await;
    Outcome::Passed
}

/// Dropping a guard without `release()` frees the lock promptly (long before the ttl).
pub async fn dropped_guard_frees_lock_promptly(ctx: Ctx) -> Outcome {
    let (a, b) = (ctx.client().await, ctx.client().await);
    let name = ctx.name("drop");
    let ttl = long_ttl(&ctx);
    let opts = ctx.opts().with_ttl(ttl);
    let guard = acquire(&*a, &name, &opts).await;
    let dropped = Instant::now();
    drop(guard);
    let guard = acquire(&*b, &name, &opts).await;
    let took = dropped.elapsed();
    assert!(
        took < ctx.slack() + opts.backoff.max,
        "a dropped guard freed the lock only after {took:?} (ttl {ttl:?})"
    );
    release(guard).await;
    Outcome::Passed
}

/// Renewal keeps a lock held for more than 3 x ttl, and nobody else gets it meanwhile.
pub async fn renewal_keeps_lock_beyond_ttl(ctx: Ctx) -> Outcome {
    let (a, b) = (ctx.client().await, ctx.client().await);
    let name = ctx.name("renewal");
    let ttl = ctx.ttl();
    let guard = acquire(&*a, &name, &ctx.opts()).await;
    let until = Instant::now() + ttl * 7 / 2;
    while Instant::now() < until {
        assert!(
            try_acquire(&*b, &name, &ctx.opts()).await.is_none(),
            "another client got a renewed lock"
        );
        assert!(
            !guard.is_lost(),
            "renewal failed: {:?}",
            guard.loss_reason()
        );
        tokio::time::sleep(ttl / 4).await;
    }
    assert!(
        guard.valid_until() > Instant::now(),
        "valid_until was not extended by renewal"
    );
    release(guard).await;
    Outcome::Passed
}

/// After A's lease expired and B acquired, A's `release` and `renew` fail and B still holds.
pub async fn stale_holder_cannot_release_or_renew(ctx: Ctx) -> Outcome {
    let (a, b, c) = (ctx.client().await, ctx.client().await, ctx.client().await);
    let name = ctx.name("stale");
    let stale = acquire(&*a, &name, &ctx.opts().with_renewal(Renewal::disabled())).await;
    let fresh = acquire(&*b, &name, &ctx.opts()).await;
    assert!(
        stale.is_lost(),
        "the expired holder does not know it lost the lock"
    );
    let renewed = stale.renew().await;
    assert!(
        matches!(renewed, Err(Error::NotHeld { .. } | Error::Lost { .. })),
        "stale renew: {renewed:?}"
    );
    let released = stale.release().await;
    assert!(
        matches!(released, Err(Error::NotHeld { .. } | Error::Lost { .. })),
        "stale release: {released:?}"
    );
    assert!(
        try_acquire(&*c, &name, &ctx.opts()).await.is_none(),
        "the stale holder released the new holder's lock"
    );
    fresh.renew().await.expect("the new holder can renew");
    assert!(!fresh.is_lost());
    release(fresh).await;
    Outcome::Passed
}

/// Fencing tokens strictly increase per name over 100 acquisitions by several clients, across
/// releases and expiries.
pub async fn fencing_tokens_strictly_increase(ctx: Ctx) -> Outcome {
    const CLIENTS: usize = 4;
    const TOTAL: usize = 100;
    let names = [ctx.name("fence-a"), ctx.name("fence-b")];
    let log = Arc::new(std::sync::Mutex::new(vec![Vec::new(), Vec::new()]));
    let taken = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let client = ctx.client().await;
        let (names, log, taken, opts) = (names.clone(), log.clone(), taken.clone(), ctx.opts());
        tasks.push(tokio::spawn(async move {
            for round in 0.. {
                let n = taken.fetch_add(1, Ordering::SeqCst);
                if n >= TOTAL {
                    return;
                }
                // Each client alternates between the names, so both see many holders.
                let which = (round + c) % 2;
                // A few acquisitions end by expiry instead of release.
                let expire = n % 40 == 7;
                let opts = if expire {
                    opts.clone().with_renewal(Renewal::disabled())
                } else {
                    opts.clone()
                };
                let guard = acquire(&*client, &names[which], &opts).await;
                log.lock().expect("log")[which].push(guard.token().get());
                if expire {
                    guard.abandon();
                } else {
                    release(guard).await;
                }
            }
        }));
    }
    for task in join_all(tasks).await {
        task.expect("a client panicked");
    }
    let log = log.lock().expect("log");
    for (name, tokens) in names.iter().zip(log.iter()) {
        assert!(tokens.len() > 10, "too few acquisitions of {name}");
        for pair in tokens.windows(2) {
            assert!(
                pair[1] > pair[0],
                "tokens of {name} did not strictly increase: {tokens:?}"
            );
        }
    }
    Outcome::Passed
}

/// A lock removed behind its holder's back is reported lost within one renewal interval plus a
/// round trip, and is free for others.
pub async fn removed_lock_is_reported_lost(ctx: Ctx) -> Outcome {
    let (a, b) = (ctx.client().await, ctx.client().await);
    let name = ctx.name("removed");
    let opts = ctx.opts();
    let interval = opts.renewal_interval().expect("renewal is on by default");
    let guard = acquire(&*a, &name, &opts).await;
    let lost = guard.lost();
    hook!(ctx.harness().remove_lock(&name).await);
    let removed = Instant::now();
    let reason = tokio::time::timeout(interval + ctx.slack(), lost)
        .await
        .unwrap_or_else(|_| {
            panic!(
                "lost() did not resolve within {:?} of the removal",
                interval + ctx.slack()
            )
        });
    assert!(
        guard.is_lost(),
        "lost() resolved ({reason}) but is_lost() is false"
    );
    assert!(removed.elapsed() <= interval + ctx.slack());
    let other = try_acquire(&*b, &name, &opts).await;
    assert!(other.is_some(), "the removed lock is not free");
    let released = guard.release().await;
    assert!(released.is_err(), "release of a removed lock succeeded");
    release(other.expect("checked")).await;
    Outcome::Passed
}

/// `valid_until()` is never later than the moment another client can acquire, and `lost()`
/// reports the expiry of an unrenewed lease.
pub async fn valid_until_is_conservative(ctx: Ctx) -> Outcome {
    let (a, b) = (ctx.client().await, ctx.client().await);
    for round in 0..3 {
        let name = ctx.name(&format!("valid-{round}"));
        let guard = acquire(&*a, &name, &ctx.opts().with_renewal(Renewal::disabled())).await;
        let valid_until = guard.valid_until();
        let lost = guard.lost();
        let other = acquire(&*b, &name, &ctx.opts()).await;
        let taken = Instant::now();
        assert!(
            taken >= valid_until,
            "another client acquired {:?} before the holder's valid_until",
            valid_until - taken
        );
        let reason = tokio::time::timeout(ctx.slack(), lost)
            .await
            .expect("lost() did not resolve after expiry");
        assert_eq!(reason, LossReason::LeaseExpired);
        assert!(guard.is_lost());
        release(other).await;
    }
    Outcome::Passed
}

/// A cap on the total hold time stops renewal: the guard reports `HoldLimitReached` and the
/// lock becomes free.
pub async fn hold_limit_stops_renewal(ctx: Ctx) -> Outcome {
    let (a, b) = (ctx.client().await, ctx.client().await);
    let name = ctx.name("hold-limit");
    let ttl = ctx.ttl();
    let cap = ttl * 3 / 2;
    let started = Instant::now();
    let guard = acquire(
        &*a,
        &name,
        &ctx.opts().with_renewal(Renewal::auto().max_hold(cap)),
    )
    .await;
    let reason = tokio::time::timeout(cap + ctx.slack(), guard.lost())
        .await
        .expect("hold limit not reported");
    assert_eq!(reason, LossReason::HoldLimitReached);
    assert!(
        started.elapsed() + Duration::from_millis(5) >= cap,
        "hold limit reported early"
    );
    let other = acquire(&*b, &name, &ctx.opts()).await;
    assert!(
        started.elapsed() <= cap + ttl + ctx.slack(),
        "the capped lock stayed held too long"
    );
    drop(guard);
    release(other).await;
    Outcome::Passed
}

/// Names that are prefixes of each other, differ only in case, contain special characters or
/// are at the maximum length are distinct locks.
pub async fn distinct_names_are_independent(ctx: Ctx) -> Outcome {
    let (a, b) = (ctx.client().await, ctx.client().await);
    let base = ctx.name("n");
    let mut names: Vec<String> = [
        "", "/", "/x", "x", "X", "a/b", "a%2Fb", "a%2fb", "a_b", "a:b", "a*b", "a%b", "a'b",
        "a\"b", "a\\b", "..", ".", "/..", "a b", " a", "a ", "🔒", "{tag}", "{tag}x", "}{", "\t",
        "é", "e\u{301}",
    ]
    .iter()
    .map(|s| format!("{base}{s}"))
    .collect();
    let max = |last: char| {
        let mut s = base.clone();
        while s.len() + last.len_utf8() < LockName::MAX_LEN {
            s.push('m');
        }
        s.push(last);
        s
    };
    names.push(max('1'));
    names.push(max('2'));
    names.push(max('🔑'));
    let opts = ctx.opts().with_ttl(long_ttl(&ctx));
    let mut guards = Vec::new();
    for name in &names {
        match try_acquire(&*a, name, &opts).await {
            Some(guard) => guards.push(guard),
            None => panic!("{name:?} collides with another name of this case"),
        }
    }
    for name in &names {
        assert!(
            try_acquire(&*b, name, &opts).await.is_none(),
            "{name:?} was acquired twice"
        );
    }
    // Releasing one name frees exactly that name.
    for index in [0, 4, names.len() - 1] {
        let guard = guards.remove(index.min(guards.len() - 1));
        let name = guard.name().to_string();
        release(guard).await;
        let taken = try_acquire(&*b, &name, &opts)
            .await
            .unwrap_or_else(|| panic!("{name:?} not freed"));
        for other in &guards {
            assert!(
                try_acquire(&*b, other.name().as_str(), &opts)
                    .await
                    .is_none(),
                "{:?} freed with {name:?}",
                other.name()
            );
        }
        release(taken).await;
    }
    for guard in guards {
        release(guard).await;
    }
    Outcome::Passed
}

/// Invalid names and options give typed errors, never a panic, and leave nothing held.
pub async fn invalid_input_is_rejected(ctx: Ctx) -> Outcome {
    let client = ctx.client().await;
    let caps = client.capabilities().clone();
    let ok = ctx.opts();
    for bad in [
        String::new(),
        format!("{}\0", ctx.name("nul")),
        "x".repeat(LockName::MAX_LEN + 1),
    ] {
        let r = client.try_acquire(&bad, &ok).await;
        assert!(
            matches!(r, Err(Error::InvalidName { .. })),
            "name {bad:?}: {r:?}"
        );
        let r = client.acquire(&bad, &ok).await;
        assert!(
            matches!(r, Err(Error::InvalidName { .. })),
            "name {bad:?}: {r:?}"
        );
        assert!(matches!(
            client.inspect(&bad).await,
            Err(Error::InvalidName { .. })
        ));
    }
    let ttl = ctx.ttl();
    let mut bad_options = vec![
        ("zero ttl", ok.clone().with_ttl(Duration::ZERO)),
        (
            "ttl above the backend's maximum",
            ok.clone().with_ttl(caps.max_ttl + Duration::from_secs(1)),
        ),
        (
            "renewal interval equal to the ttl",
            ok.clone().with_renewal(Renewal::auto().every(ttl)),
        ),
        (
            "renewal interval above the ttl",
            ok.clone().with_renewal(Renewal::auto().every(ttl * 2)),
        ),
        (
            "zero renewal interval",
            ok.clone()
                .with_renewal(Renewal::auto().every(Duration::ZERO)),
        ),
        (
            "zero max hold",
            ok.clone()
                .with_renewal(Renewal::auto().max_hold(Duration::ZERO)),
        ),
        (
            "backoff min above max",
            ok.clone()
                .with_backoff(Backoff::new(Duration::from_secs(2), Duration::from_secs(1))),
        ),
        (
            "zero backoff",
            ok.clone()
                .with_backoff(Backoff::new(Duration::ZERO, Duration::from_secs(1))),
        ),
    ];
    if caps.min_ttl > Duration::from_nanos(1) {
        bad_options.push((
            "ttl below the backend's minimum",
            ok.clone().with_ttl(caps.min_ttl / 2),
        ));
    }
    let name = ctx.name("invalid");
    for (what, opts) in &bad_options {
        let r = client.try_acquire(&name, opts).await;
        assert!(matches!(r, Err(Error::InvalidOptions(_))), "{what}: {r:?}");
        let r = client.acquire(&name, opts).await;
        assert!(matches!(r, Err(Error::InvalidOptions(_))), "{what}: {r:?}");
    }
    for bad in ["", "a\0b"] {
        assert!(matches!(OwnerId::new(bad), Err(Error::InvalidOptions(_))));
    }
    assert!(matches!(
        OwnerId::new("o".repeat(OwnerId::MAX_LEN + 1)),
        Err(Error::InvalidOptions(_))
    ));
    let guard = try_acquire(&*client, &name, &ok)
        .await
        .expect("a rejected request left the lock held");
    release(guard).await;
    Outcome::Passed
}

/// Dropping `acquire` futures at random points, hundreds of times, never leaves the lock held
/// or a queue entry blocking others beyond the ttl.
pub async fn cancelled_acquires_leave_nothing_behind(ctx: Ctx) -> Outcome {
    const ROUNDS: usize = 200;
    let clients = [ctx.client().await, ctx.client().await, ctx.client().await];
    let holder = ctx.client().await;
    let name = ctx.name("cancel");
    let opts = ctx.opts();
    let mut held = None;
    for round in 0..ROUNDS {
        // Alternate between a held lock (cancel while queued) and a free one (cancel while
        // acquiring, or right after the server granted it).
        if round % 20 == 0 {
            held = match held.take() {
                Some(guard) => {
                    release(guard).await;
                    None
                }
                None => Some(acquire(&*holder, &name, &opts).await),
            };
        }
        let client = &clients[round % clients.len()];
        let budget = Duration::from_micros(rand::rng().random_range(0..3_000));
        if let Ok(Ok(guard)) = tokio::time::timeout(budget, client.acquire(&name, &opts)).await {
            // Completed within the budget: a normal acquisition.
            assert!(held.is_none(), "acquired a lock held by another client");
            release(guard).await;
        }
    }
    if let Some(guard) = held {
        release(guard).await;
    }
    let fresh = ctx.client().await;
    let within = ctx.ttl() + ctx.slack();
    let guard = acquire_within(&*fresh, &name, &opts, within)
        .await
        .unwrap_or_else(|| {
            panic!("cancelled acquires left the lock blocked for more than {within:?}")
        });
    release(guard).await;
    Outcome::Passed
}

/// The same explicit owner re-acquires without blocking; the lock is released when the hold
/// count returns to zero. Without an owner, a second acquire by the same client blocks.
pub async fn reentrancy_by_explicit_owner(ctx: Ctx) -> Outcome {
    let (a, b) = (ctx.client().await, ctx.client().await);
    let name = ctx.name("reentrant");
    let owner = OwnerId::new("worker-1").expect("valid owner");
    let mine = ctx.opts().with_owner(owner);
    let first = acquire(&*a, &name, &mine).await;
    let second = tokio::time::timeout(
        ctx.slack(),
        a.acquire(&name, &mine.clone().with_wait(ctx.slack())),
    )
    .await
    .expect("reentrant acquire blocked")
    .expect("reentrant acquire failed");
    assert_eq!(
        first.token(),
        second.token(),
        "a reentrant hold is the same lease"
    );
    let third = try_acquire(&*a, &name, &mine)
        .await
        .expect("reentrant try_acquire failed");
    // Another owner, on the same client or another, is excluded.
    let other_owner = ctx
        .opts()
        .with_owner(OwnerId::new("worker-2").expect("valid owner"));
    assert!(
        try_acquire(&*a, &name, &other_owner).await.is_none(),
        "another owner entered"
    );
    assert!(
        try_acquire(&*b, &name, &mine).await.is_none(),
        "the same owner id on another client entered"
    );
    assert!(
        try_acquire(&*a, &name, &ctx.opts()).await.is_none(),
        "an ownerless acquire entered"
    );
    release(first).await;
    release(third).await;
    assert!(
        try_acquire(&*b, &name, &ctx.opts()).await.is_none(),
        "released before the hold count reached zero"
    );
    assert!(!second.is_lost());
    release(second).await;
    let guard = try_acquire(&*b, &name, &ctx.opts())
        .await
        .expect("not released at hold count zero");
    // Without an owner, the same client blocks like anyone else.
    let wait = ctx.ttl().min(Duration::from_millis(300));
    let again = b.acquire(&name, &ctx.opts().with_wait(wait)).await;
    assert!(
        matches!(again, Err(Error::Timeout { .. })),
        "an ownerless re-acquire did not block: {again:?}"
    );
    release(guard).await;
    Outcome::Passed
}

/// Where the backend declares FIFO, waiters get the lock in arrival order.
pub async fn fifo_fairness(ctx: Ctx) -> Outcome {
    const WAITERS: usize = 5;
    let holder = ctx.client().await;
    if !holder.capabilities().fifo {
        return Outcome::Skipped("the backend does not declare FIFO fairness".into());
    }
    let name = ctx.name("fifo");
    let opts = ctx.opts().with_ttl(long_ttl(&ctx));
    let guard = acquire(&*holder, &name, &opts).await;
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..WAITERS {
        let client = ctx.client().await;
        let (name, opts, order) = (name.clone(), opts.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let guard = acquire(&*client, &name, &opts).await;
            order.lock().expect("order").push(i);
            release(guard).await;
        }));
        // Let this waiter join the queue before the next one arrives.
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    release(guard).await;
    for task in join_all(tasks).await {
        task.expect("a waiter panicked");
    }
    let order = order.lock().expect("order").clone();
    assert_eq!(
        order,
        (0..WAITERS).collect::<Vec<_>>(),
        "waiters were not served in arrival order"
    );
    Outcome::Passed
}

/// One client holds many names with renewal for 3 x ttl; all stay held.
pub async fn many_locks_stay_held(ctx: Ctx) -> Outcome {
    let (a, b) = (ctx.client().await, ctx.client().await);
    let count = ctx.harness().many_locks();
    let names: Vec<String> = (0..count).map(|i| ctx.name(&format!("many-{i}"))).collect();
    let ttl = ctx.harness().many_locks_ttl();
    let opts = ctx.opts().with_ttl(ttl);
    let mut guards = Vec::with_capacity(count);
    for chunk in names.chunks(50) {
        let acquired = join_all(chunk.iter().map(|n| a.try_acquire(n, &opts))).await;
        for (name, result) in chunk.iter().zip(acquired) {
            match result {
                Ok(Some(guard)) => guards.push(guard),
                other => panic!("could not take {name:?}: {other:?}"),
            }
        }
    }
    let until = Instant::now() + ttl * 3;
    while Instant::now() < until {
        tokio::time::sleep(ttl / 2).await;
        let lost = guards.iter().filter(|g| g.is_lost()).count();
        assert_eq!(lost, 0, "{lost} of {count} locks were lost while renewed");
    }
    for name in names.iter().step_by(count.div_ceil(20).max(1)) {
        assert!(
            try_acquire(&*b, name, &opts).await.is_none(),
            "{name:?} was free while held"
        );
    }
    let results = join_all(guards.into_iter().map(LockGuard::release)).await;
    let failed = results.iter().filter(|r| r.is_err()).count();
    assert_eq!(failed, 0, "{failed} releases failed");
    Outcome::Passed
}

/// Cutting the holder's connection either leaves it holding (the client reconnects and keeps
/// renewing) or reports the loss; exclusion holds either way, and the client works afterwards.
pub async fn cut_connection_is_survived_or_reported(ctx: Ctx) -> Outcome {
    let (a, b) = (ctx.client().await, ctx.client().await);
    let name = ctx.name("cut");
    let guard = acquire(&*a, &name, &ctx.opts()).await;
    hook!(ctx.harness().cut_connection(&a).await);
    let until = Instant::now() + ctx.ttl() * 2;
    while Instant::now() < until {
        // Read the holder's belief BEFORE the competitor's attempt: if it believed it held the
        // lock throughout the attempt, the attempt must fail.
        let believed = !guard.is_lost();
        let other = try_acquire(&*b, &name, &ctx.opts()).await;
        if let Some(other) = other {
            assert!(
                !believed || guard.is_lost(),
                "another client acquired while the holder believed it held the lock"
            );
            release(other).await;
            break;
        }
        tokio::time::sleep(ctx.ttl() / 5).await;
    }
    let _ = guard.release().await;
    let again = acquire(&*a, &ctx.name("cut-after"), &ctx.opts()).await;
    release(again).await;
    Outcome::Passed
}

/// With the server stopped, operations fail with a typed, retryable error within the operation
/// timeout; after it returns, the same client works again.
pub async fn server_unavailable_then_recovers(ctx: Ctx) -> Outcome {
    let client = ctx.client().await;
    let name = ctx.name("outage");
    let guard = acquire(&*client, &name, &ctx.opts()).await;
    release(guard).await;
    let bound = ctx.harness().operation_timeout() + ctx.slack();
    let stopped = ctx.harness().stop_server().await;
    hook!(stopped);
    let outcome = check_outage(&ctx, &*client, &name, bound).await;
    let restarted: HookResult = ctx.harness().start_server().await;
    if let Err(HookError::Failed(reason) | HookError::Unsupported(reason)) = restarted {
        panic!("could not restart the server: {reason}");
    }
    outcome.unwrap_or_else(|msg| panic!("{msg}"));
    let guard = client
        .acquire(&name, &ctx.opts().with_wait(Duration::from_secs(30)))
        .await
        .unwrap_or_else(|err| {
            panic!("the client did not recover after the server returned: {err}")
        });
    release(guard).await;
    Outcome::Passed
}

async fn check_outage(
    ctx: &Ctx,
    client: &dyn DistributedLock,
    name: &str,
    bound: Duration,
) -> Result<(), String> {
    let started = Instant::now();
    let tried = client.try_acquire(name, &ctx.opts()).await;
    let took = started.elapsed();
    if !matches!(&tried, Err(e) if e.is_retryable()) {
        return Err(format!(
            "try_acquire during an outage: expected a retryable error, got {tried:?}"
        ));
    }
    if took > bound {
        return Err(format!(
            "try_acquire during an outage took {took:?} (bound {bound:?})"
        ));
    }
    let wait = Duration::from_millis(500);
    let started = Instant::now();
    let waited = client.acquire(name, &ctx.opts().with_wait(wait)).await;
    let took = started.elapsed();
    if !matches!(&waited, Err(e) if e.is_retryable()) {
        return Err(format!(
            "acquire during an outage: expected a retryable error, got {waited:?}"
        ));
    }
    if took > wait + bound {
        return Err(format!(
            "acquire during an outage took {took:?} (bound {:?})",
            wait + bound
        ));
    }
    Ok(())
}

/// `list` shows a held lock with its owner and token, not a released one, only names under the
/// prefix, and at most `limit` of them.
pub async fn list_shows_held_locks(ctx: Ctx) -> Outcome {
    let client = ctx.client().await;
    if !client.capabilities().list {
        return Outcome::Skipped("the backend cannot list locks".into());
    }
    let opts = ctx.opts().with_ttl(long_ttl(&ctx));
    let held = [
        acquire(&*client, &ctx.name("held-a"), &opts).await,
        acquire(&*client, &ctx.name("held-b"), &opts).await,
        acquire(&*client, &ctx.name("held-c"), &opts).await,
    ];
    release(acquire(&*client, &ctx.name("released"), &opts).await).await;
    let listed = match client.list(Some(ctx.prefix()), 100).await {
        Ok(listed) => listed,
        Err(err) => panic!("list failed: {err}"),
    };
    let names: Vec<&str> = listed.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        held.iter().map(|g| g.name().as_str()).collect::<Vec<_>>(),
        "list shows exactly the held locks under the prefix, by name"
    );
    for ((_, info), guard) in listed.iter().zip(&held) {
        assert_eq!(
            info.owner,
            guard.owner(),
            "listed owner of {}",
            guard.name()
        );
        if let Some(token) = info.token {
            assert_eq!(token, guard.token(), "listed token of {}", guard.name());
        }
        if let Some(left) = info.remaining {
            assert!(left <= opts.ttl, "remaining {left:?} exceeds the ttl");
        }
    }
    let limited = client
        .list(Some(ctx.prefix()), 2)
        .await
        .expect("list with a limit");
    assert_eq!(limited.len(), 2, "limit 2 returned {limited:?}");
    let narrow = client
        .list(Some(&ctx.name("held-b")), 100)
        .await
        .expect("list with a narrow prefix");
    assert_eq!(narrow.len(), 1, "prefix held-b: {narrow:?}");
    assert_eq!(narrow[0].0.as_str(), ctx.name("held-b"));
    let everything = client
        .list(None, 100_000)
        .await
        .expect("list without prefix");
    for guard in &held {
        assert!(
            everything.iter().any(|(n, _)| n == guard.name()),
            "list without a prefix misses {}",
            guard.name()
        );
    }
    for guard in held {
        release(guard).await;
    }
    let after = client.list(Some(ctx.prefix()), 100).await.expect("list");
    assert!(
        after.is_empty(),
        "released locks are still listed: {after:?}"
    );
    Outcome::Passed
}

/// After `force_release`, the forced-out holder learns of the loss within its renewal interval,
/// its `renew` and `release` fail, a blocked waiter gets the lock, and the waiter's token is
/// greater than the forced-out holder's.
pub async fn force_release_hands_over_with_higher_token(ctx: Ctx) -> Outcome {
    let (a, b, admin) = (ctx.client().await, ctx.client().await, ctx.client().await);
    if !admin.capabilities().force_release {
        return Outcome::Skipped("the backend cannot force-release locks".into());
    }
    let name = ctx.name("forced");
    assert!(
        !admin
            .force_release(&name)
            .await
            .expect("force release of a free lock"),
        "force release of a free lock reported a removal"
    );
    let opts = ctx.opts();
    let interval = opts.renewal_interval().expect("renewal is on by default");
    let old = acquire(&*a, &name, &opts).await;
    let old_token = old.token();
    let lost = old.lost();
    let waiter = {
        let (name, opts) = (name.clone(), opts.clone());
        tokio::spawn(async move { acquire(&*b, &name, &opts).await })
    };
    // Let the waiter block (and subscribe to wake-ups where the backend has them).
    tokio::time::sleep(ctx.slack().min(ctx.ttl()) / 2).await;
    assert!(!waiter.is_finished(), "the waiter got a held lock");
    let forced = Instant::now();
    assert!(
        admin.force_release(&name).await.expect("force release"),
        "force release of a held lock reported nothing removed"
    );
    let reason = tokio::time::timeout(interval + ctx.slack(), lost)
        .await
        .unwrap_or_else(|_| {
            panic!(
                "lost() did not resolve within {:?} of the force release",
                interval + ctx.slack()
            )
        });
    assert!(
        old.is_lost(),
        "lost() resolved ({reason}) but is_lost() is false"
    );
    let renewed = old.renew().await;
    assert!(
        matches!(renewed, Err(Error::NotHeld { .. } | Error::Lost { .. })),
        "renew after force release: {renewed:?}"
    );
    // A waiter is woken by the release event, or polls within the holder's former lease.
    let within = ctx.ttl() + ctx.slack();
    let new = tokio::time::timeout(within, waiter)
        .await
        .unwrap_or_else(|_| panic!("the waiter did not get the lock within {within:?}"))
        .expect("the waiter panicked");
    assert!(forced.elapsed() <= interval.max(within) + ctx.slack());
    assert!(
        new.token() > old_token,
        "the next holder's token {} is not above the forced-out holder's {old_token}",
        new.token()
    );
    let released = old.release().await;
    assert!(
        matches!(released, Err(Error::NotHeld { .. } | Error::Lost { .. })),
        "release after force release: {released:?}"
    );
    assert!(
        !new.is_lost(),
        "the old holder's release took the new holder's lock"
    );
    new.renew().await.expect("the new holder can renew");
    release(new).await;
    Outcome::Passed
}
