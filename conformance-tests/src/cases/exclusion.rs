//! Mutual exclusion, waiting, release and wake-ups, names, fairness, reentrancy.

use super::*;

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
        // Each waiter has joined the queue (its first poll found the lock taken) before the
        // next one arrives.
        tasks.push(
            spawn_waiting(LONG_WAIT, async move {
                let guard = acquire(&*client, &name, &opts).await;
                order.lock().expect("order").push(i);
                release(guard).await;
            })
            .await,
        );
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
    // Alone on the machine: no other case of any test binary runs meanwhile (`run_case`,
    // `machine_turn`).
    let names: Vec<String> = (0..count).map(|i| ctx.name(&format!("many-{i}"))).collect();
    let ttl = ctx.harness().many_locks_ttl();
    let opts = ctx.opts().with_ttl(ttl);
    let mut guards = Vec::with_capacity(count);
    // What is measured is holding, not taking: an acquisition that got no answer in time (a
    // pool or a server slow on a loaded machine) is tried again. A refusal is a failure,
    // unless an earlier try got no answer: that one may have been granted on the server, and
    // is cleaned up (or runs out within a ttl) before the name is free again.
    let take = |name: &String| {
        let a = a.clone();
        let (name, opts) = (name.clone(), opts.clone());
        async move {
            let mut unanswered = 0;
            let started = Instant::now();
            loop {
                match a.try_acquire(&name, &opts).await {
                    Ok(Some(guard)) => return guard,
                    Err(err) if err.is_retryable() && unanswered < 3 => unanswered += 1,
                    Ok(None) if unanswered > 0 && started.elapsed() < ttl * 3 => {}
                    other => panic!("could not take {name:?} ({unanswered} unanswered): {other:?}"),
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    for chunk in names.chunks(50) {
        guards.extend(join_all(chunk.iter().map(take)).await);
    }
    let started = Instant::now();
    let until = started + ttl * 3;
    while Instant::now() < until {
        tokio::time::sleep(ttl / 2).await;
        let reasons: Vec<_> = guards.iter().filter_map(LockGuard::loss_reason).collect();
        assert!(
            reasons.is_empty(),
            "{} of {count} locks were lost while renewed ({:?} first), {:?} after the start",
            reasons.len(),
            reasons[0],
            started.elapsed()
        );
    }
    for name in names.iter().step_by(count.div_ceil(20).max(1)) {
        assert!(
            try_acquire(&*b, name, &opts).await.is_none(),
            "{name:?} was free while held"
        );
    }
    // Released 50 at a time: thousands of releases at once would wait for a pooled
    // connection longer than the operation timeout on a pool of 10. At 200, the last of a
    // chunk waited for a PostgreSQL connection longer than the pool's acquire timeout once,
    // with the four conformance lanes at once (307 of 10000 failed, "pool timed out").
    let mut failed = 0;
    let mut first = None;
    let mut guards = guards.into_iter();
    let releasing = Instant::now();
    loop {
        let chunk: Vec<LockGuard> = guards.by_ref().take(50).collect();
        if chunk.is_empty() {
            break;
        }
        let results = join_all(chunk.into_iter().map(LockGuard::release)).await;
        for err in results.into_iter().filter_map(Result::err) {
            failed += 1;
            first.get_or_insert_with(|| (err, releasing.elapsed()));
        }
    }
    // Which error, and when: a timeout waiting for the pool, or a lock lost meanwhile.
    assert_eq!(
        failed,
        0,
        "{failed} of {count} releases failed, the first with {first:?} (after {:?} of releasing)",
        releasing.elapsed()
    );
    Outcome::Passed
}
