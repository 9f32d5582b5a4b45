//! Read-write locks and semaphores: the shared and permit kinds, gated by the backend's
//! capabilities.

use std::sync::Mutex;
use std::sync::atomic::AtomicBool;

use distlock_core::{FencingToken, LockKind, UpgradeableRwLock};

use super::*;

/// Skips a case the backend cannot run: no shared holds.
macro_rules! needs_shared {
    ($client:expr) => {
        if !$client.capabilities().shared {
            return Outcome::Skipped("the backend has no shared (read) locks".into());
        }
    };
}

/// Skips a case the backend cannot run: no semaphores of `$n` permits.
macro_rules! needs_permits {
    ($client:expr, $n:expr) => {
        if $client.capabilities().max_permits < $n {
            return Outcome::Skipped(format!("the backend has no semaphores of {} permits", $n));
        }
    };
}

/// The bound of a wait that must end because of the fairness rule, not the ttl.
fn fair_wait(ctx: &Ctx) -> Duration {
    ctx.ttl() * 3 + ctx.slack() * 2
}

/// A semaphore of N never has more than N holders: each holder takes a free slot of N (none
/// free means the bound was broken) and bumps that slot's counter without atomicity (two
/// holders on one slot lose an update). That holds do overlap at all is shown by
/// [`permit_tokens_are_unique_and_increasing`], which holds two permits at once; here a slow
/// backend may well serialize them.
pub async fn permits_never_exceed_n_under_contention(ctx: Ctx) -> Outcome {
    const PERMITS: usize = 3;
    const CLIENTS: usize = 8;
    const ROUNDS: u64 = 12;
    let probe = ctx.client().await;
    needs_permits!(probe, PERMITS as u32);
    let name = ctx.name("semaphore");
    let slots: Arc<Vec<(AtomicBool, AtomicU64)>> = Arc::new(
        (0..PERMITS)
            .map(|_| (AtomicBool::new(false), AtomicU64::new(0)))
            .collect(),
    );
    let holders = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let client = ctx.client().await;
        let opts = ctx.opts().with_permits(PERMITS as u32);
        let (name, slots, holders, most) =
            (name.clone(), slots.clone(), holders.clone(), most.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let guard = acquire(&*client, &name, &opts).await;
                let now = holders.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                let slot = slots
                    .iter()
                    .position(|(busy, _)| !busy.swap(true, Ordering::SeqCst))
                    .unwrap_or_else(|| panic!("more than {PERMITS} holders at once"));
                let value = slots[slot].1.load(Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(3)).await;
                slots[slot].1.store(value + 1, Ordering::SeqCst);
                slots[slot].0.store(false, Ordering::SeqCst);
                holders.fetch_sub(1, Ordering::SeqCst);
                assert!(!guard.is_lost(), "lost a permit inside a short hold");
                assert_eq!(guard.kind(), LockKind::Permit { permits: 3 });
                release(guard).await;
            }
        }));
    }
    for task in join_all(tasks).await {
        task.expect("a contending client panicked");
    }
    let total: u64 = slots.iter().map(|(_, n)| n.load(Ordering::SeqCst)).sum();
    assert_eq!(
        total,
        CLIENTS as u64 * ROUNDS,
        "lost update: two holders on one permit"
    );
    let most = most.load(Ordering::SeqCst);
    assert!(most <= PERMITS, "{most} holders of {PERMITS} permits");
    Outcome::Passed
}

/// Each permit acquisition gets a unique token, larger than every earlier one on the name.
pub async fn permit_tokens_are_unique_and_increasing(ctx: Ctx) -> Outcome {
    let (a, b) = (ctx.client().await, ctx.client().await);
    needs_permits!(a, 2);
    let name = ctx.name("tokens");
    let opts = ctx.opts().with_permits(2);
    let mut last = FencingToken::new(0);
    for _ in 0..3 {
        let first = acquire(&*a, &name, &opts).await;
        let second = acquire(&*b, &name, &opts).await;
        assert!(first.token() > last, "{} after {last}", first.token());
        assert!(
            second.token() > first.token(),
            "{} after {}",
            second.token(),
            first.token()
        );
        last = second.token();
        release(first).await;
        let third = acquire(&*a, &name, &opts).await;
        assert!(third.token() > last, "{} after {last}", third.token());
        last = third.token();
        release(second).await;
        release(third).await;
    }
    Outcome::Passed
}

/// A semaphore asked for with another size, or used as a read-write lock, is a typed error
/// while it is held, never a silent mix.
pub async fn semaphore_mismatch_is_reported(ctx: Ctx) -> Outcome {
    let (a, b) = (ctx.client().await, ctx.client().await);
    needs_permits!(a, 3);
    let name = ctx.name("mismatch");
    let guard = acquire(&*a, &name, &ctx.opts().with_permits(2)).await;
    let mut asks = vec![ctx.opts().with_permits(3), ctx.opts()];
    if a.capabilities().shared {
        asks.push(ctx.opts().shared());
    }
    for ask in asks {
        for waiting in [false, true] {
            let got = if waiting {
                b.acquire(&name, &ask.clone().with_wait(LONG_WAIT))
                    .await
                    .map(Some)
            } else {
                b.try_acquire(&name, &ask).await
            };
            match got {
                Err(Error::Mismatch { name: n, message }) => {
                    assert_eq!(n, name);
                    assert!(!message.is_empty());
                }
                other => panic!("asking {:?} of a semaphore of 2 gave {other:?}", ask.kind),
            }
        }
    }
    // A holder of the right size still gets in, and the name is a lock again once free.
    let second = acquire(&*b, &name, &ctx.opts().with_permits(2)).await;
    release(second).await;
    release(guard).await;
    let mutex = acquire(&*b, &name, &ctx.opts()).await;
    release(mutex).await;
    Outcome::Passed
}

/// Zero permits, or more than the backend declares, is refused before anything is sent; a
/// kind the backend lacks is `Unsupported`, never a silent downgrade to a mutex.
pub async fn invalid_kinds_are_typed_errors(ctx: Ctx) -> Outcome {
    let client = ctx.client().await;
    let name = ctx.name("invalid");
    let caps = client.capabilities().clone();
    let mut asks = vec![
        ctx.opts().with_permits(0),
        ctx.opts().with_permits(u32::MAX),
    ];
    if caps.max_permits < 2 {
        asks.push(ctx.opts().with_permits(2));
    }
    if !caps.shared {
        asks.push(ctx.opts().shared());
    }
    for ask in asks {
        let tried = client.try_acquire(&name, &ask).await;
        let waited = client
            .acquire(&name, &ask.clone().with_wait(LONG_WAIT))
            .await;
        for got in [tried.map(|_| ()), waited.map(|_| ())] {
            match (ask.kind, got) {
                (LockKind::Shared, Err(Error::Unsupported(_))) => {}
                (LockKind::Permit { .. }, Err(Error::Unsupported(_))) if caps.max_permits == 0 => {}
                (LockKind::Permit { .. }, Err(Error::InvalidOptions(_)))
                    if caps.max_permits > 0 => {}
                (kind, got) => panic!("asking for {kind} gave {got:?}"),
            }
        }
    }
    Outcome::Passed
}

/// A crashed permit holder's permit comes back once its lease has run out, not before: never
/// while the holder's `valid_until` lies ahead. (The lease may have started before the request:
/// on etcd every key of a client shares one lease, kept alive by the client's other holds, so
/// the crashed holder's `valid_until`, and the permit's return, come up to a keepalive period
/// before request + ttl.)
pub async fn crashed_permit_holder_frees_after_ttl(ctx: Ctx) -> Outcome {
    let (a, b) = (ctx.client().await, ctx.client().await);
    needs_permits!(a, 2);
    let name = ctx.name("crash");
    let ttl = ctx.ttl();
    let opts = ctx.opts().with_permits(2).with_renewal(Renewal::disabled());
    let kept = acquire(&*a, &name, &ctx.opts().with_permits(2)).await;
    let sent = Instant::now();
    let crashed = acquire(&*a, &name, &opts).await;
    let answered = Instant::now();
    let valid_until = crashed.valid_until();
    crashed.abandon();
    if let Some(third) = try_acquire(&*b, &name, &opts).await {
        // Only if getting here took a loaded machine longer than the crashed lease.
        let now = Instant::now();
        assert!(
            now >= valid_until,
            "a third permit of 2, {:?} before the crashed holder's valid_until",
            valid_until - now
        );
        release(third).await;
        release(kept).await;
        return Outcome::Passed;
    }
    let guard = acquire(&*b, &name, &opts).await;
    let taken = Instant::now();
    assert!(
        taken >= valid_until,
        "the permit came back {:?} before the crashed holder's valid_until",
        valid_until - taken
    );
    assert!(
        taken >= sent + ttl / 2,
        "the permit came back {:?} after, long before its ttl {ttl:?}",
        taken - sent
    );
    assert!(
        taken <= answered + ttl + ctx.slack(),
        "the permit came back only {:?} after (ttl {ttl:?})",
        taken - answered
    );
    release(guard).await;
    release(kept).await;
    Outcome::Passed
}

/// Two shared holders hold at once; neither a writer nor a second writer gets in meanwhile;
/// the writer gets in once both left.
pub async fn readers_hold_together_and_exclude_writers(ctx: Ctx) -> Outcome {
    let (a, b, w) = (ctx.client().await, ctx.client().await, ctx.client().await);
    needs_shared!(a);
    let name = ctx.name("rw");
    let read = ctx.opts().shared();
    let first = acquire(&*a, &name, &read).await;
    let second = try_acquire(&*b, &name, &read)
        .await
        .expect("a second reader was refused while only a reader held the lock");
    assert_eq!(second.kind(), LockKind::Shared);
    assert!(
        try_acquire(&*w, &name, &ctx.opts()).await.is_none(),
        "a writer joined readers"
    );
    if let Ok(Some(info)) = a.inspect(&name).await {
        assert_eq!((info.kind, info.holders), (LockKind::Shared, 2), "{info:?}");
    }
    release(first).await;
    assert!(
        try_acquire(&*w, &name, &ctx.opts()).await.is_none(),
        "a writer joined a reader"
    );
    release(second).await;
    let writer = try_acquire(&*w, &name, &ctx.opts())
        .await
        .expect("the writer was refused after every reader left");
    assert!(
        try_acquire(&*a, &name, &read).await.is_none(),
        "a reader joined a writer"
    );
    assert!(
        try_acquire(&*b, &name, &ctx.opts()).await.is_none(),
        "two writers"
    );
    release(writer).await;
    Outcome::Passed
}

/// Under a mix of readers and writers: never two writers, never a writer with a reader.
/// (That readers share is shown by [`readers_hold_together_and_exclude_writers`].)
pub async fn read_write_exclusion_under_contention(ctx: Ctx) -> Outcome {
    const CLIENTS: usize = 6;
    const ROUNDS: usize = 15;
    let probe = ctx.client().await;
    needs_shared!(probe);
    let name = ctx.name("mix");
    // (readers, writers) inside now, and the most readers seen at once.
    let inside = Arc::new(Mutex::new((0usize, 0usize)));
    let most_readers = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for client_no in 0..CLIENTS {
        let client = ctx.client().await;
        let (name, inside, most_readers) = (name.clone(), inside.clone(), most_readers.clone());
        let opts = ctx.opts();
        tasks.push(tokio::spawn(async move {
            for round in 0..ROUNDS {
                let writer = (client_no + round) % 5 == 0;
                let opts = if writer {
                    opts.clone()
                } else {
                    opts.clone().shared()
                };
                let guard = acquire(&*client, &name, &opts).await;
                {
                    let mut now = inside.lock().unwrap();
                    if writer {
                        now.1 += 1;
                    } else {
                        now.0 += 1;
                        most_readers.fetch_max(now.0, Ordering::SeqCst);
                    }
                    assert!(now.1 <= 1, "two writers at once");
                    assert!(now.1 == 0 || now.0 == 0, "a writer with {} readers", now.0);
                }
                tokio::time::sleep(Duration::from_millis(3)).await;
                {
                    let mut now = inside.lock().unwrap();
                    if writer { now.1 -= 1 } else { now.0 -= 1 }
                }
                assert!(!guard.is_lost(), "lost the lock inside a short hold");
                release(guard).await;
            }
        }));
    }
    for task in join_all(tasks).await {
        task.expect("a contending client panicked");
    }
    tracing::debug!(
        most_readers = most_readers.load(Ordering::SeqCst),
        "readers at once"
    );
    Outcome::Passed
}

/// A waiting writer is not starved by a stream of overlapping readers: new readers queue
/// behind it, and it gets the lock once the readers before it are done.
pub async fn waiting_writer_is_not_starved_by_readers(ctx: Ctx) -> Outcome {
    const READERS: usize = 3;
    let probe = ctx.client().await;
    needs_shared!(probe);
    let name = ctx.name("starve");
    let read = ctx.opts().shared();
    let stop = Arc::new(AtomicBool::new(false));
    let mut stream = Vec::new();
    for _ in 0..READERS {
        let client = ctx.client().await;
        let (name, read, stop) = (name.clone(), read.clone(), stop.clone());
        // Overlapping holds: without the fairness rule the lock is never free of readers.
        stream.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let guard = acquire(&*client, &name, &read).await;
                tokio::time::sleep(Duration::from_millis(40)).await;
                release(guard).await;
            }
        }));
        tokio::time::sleep(Duration::from_millis(15)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let writer = ctx.client().await;
    let asked = Instant::now();
    let (name_w, opts_w) = (name.clone(), ctx.opts().with_wait(fair_wait(&ctx)));
    let waiting = tokio::spawn(async move { writer.acquire(&name_w, &opts_w).await });
    let got = waiting.await.expect("the writer panicked");
    let waited = asked.elapsed();
    stop.store(true, Ordering::SeqCst);
    let guard = match got {
        Ok(guard) => guard,
        Err(err) => panic!("a writer starved by readers: {err} after {waited:?}"),
    };
    assert!(
        waited < fair_wait(&ctx),
        "the writer waited {waited:?} behind a stream of readers"
    );
    release(guard).await;
    for task in join_all(stream).await {
        task.expect("a reader panicked");
    }
    Outcome::Passed
}

/// While a writer waits, a new reader is refused (it would queue behind the writer), though
/// only readers hold the lock.
pub async fn new_readers_queue_behind_a_waiting_writer(ctx: Ctx) -> Outcome {
    let (a, w, c) = (ctx.client().await, ctx.client().await, ctx.client().await);
    needs_shared!(a);
    let name = ctx.name("queue");
    let read = ctx.opts().shared();
    let reader = acquire(&*a, &name, &read).await;
    let (name_w, opts_w) = (name.clone(), ctx.opts().with_wait(LONG_WAIT));
    // Returns once the writer's first poll says it waits.
    let waiting = spawn_waiting(LONG_WAIT, async move { w.acquire(&name_w, &opts_w).await }).await;
    assert!(
        try_acquire(&*c, &name, &read).await.is_none(),
        "a new reader went ahead of a waiting writer"
    );
    let late_reader = {
        let (c, name, read) = (c.clone(), name.clone(), read.clone());
        tokio::spawn(async move { acquire(&*c, &name, &read).await })
    };
    release(reader).await;
    let writer = tokio::time::timeout(fair_wait(&ctx), waiting)
        .await
        .expect("the writer did not get the lock after the reader left")
        .expect("the writer panicked")
        .expect("the writer's acquire failed");
    assert!(
        !late_reader.is_finished(),
        "a reader got in with the writer"
    );
    let writer_token = writer.token();
    release(writer).await;
    let late = tokio::time::timeout(fair_wait(&ctx), late_reader)
        .await
        .expect("the queued reader did not get the lock after the writer")
        .expect("the queued reader panicked");
    assert!(
        late.token() > writer_token,
        "a later reader's token is not above the writer's"
    );
    release(late).await;
    Outcome::Passed
}

/// Tokens follow the rule: a reader's token is above every earlier writer's and below every
/// later writer's; every acquisition's token is unique.
pub async fn read_write_tokens_follow_the_fencing_rule(ctx: Ctx) -> Outcome {
    let (a, b) = (ctx.client().await, ctx.client().await);
    needs_shared!(a);
    let name = ctx.name("fence");
    let read = ctx.opts().shared();
    let w1 = acquire(&*a, &name, &ctx.opts()).await;
    let t1 = w1.token();
    release(w1).await;
    let r1 = acquire(&*a, &name, &read).await;
    let r2 = acquire(&*b, &name, &read).await;
    assert!(
        r1.token() > t1 && r2.token() > t1,
        "a reader below an earlier writer"
    );
    assert_ne!(r1.token(), r2.token(), "two readers share a token");
    let top = r1.token().max(r2.token());
    release(r1).await;
    release(r2).await;
    let w2 = acquire(&*b, &name, &ctx.opts()).await;
    assert!(
        w2.token() > top,
        "a writer at {} below an earlier reader at {top}",
        w2.token()
    );
    release(w2).await;
    Outcome::Passed
}

/// A crashed reader blocks writers for its ttl at most; a reader whose lease ran out is
/// told so, and its renewal is refused once a writer holds the lock.
pub async fn crashed_reader_frees_after_ttl_and_loss_is_reported(ctx: Ctx) -> Outcome {
    let (a, b) = (ctx.client().await, ctx.client().await);
    needs_shared!(a);
    let name = ctx.name("crash");
    let ttl = ctx.ttl();
    let read = ctx.opts().shared().with_renewal(Renewal::disabled());
    let crashed = acquire(&*a, &name, &read).await;
    let answered = Instant::now();
    crashed.abandon();
    let stale = acquire(&*a, &name, &read).await;
    assert!(
        try_acquire(&*b, &name, &ctx.opts()).await.is_none(),
        "a writer joined readers"
    );
    let writer = acquire(&*b, &name, &ctx.opts()).await;
    let taken = Instant::now();
    assert!(
        taken <= answered + ttl * 2 + ctx.slack(),
        "the writer got in only {:?} after the readers' last acquisition (ttl {ttl:?})",
        taken - answered
    );
    assert!(stale.is_lost(), "a reader past its lease does not know it");
    assert!(
        stale.renew().await.is_err(),
        "an expired reader renewed under a writer"
    );
    release(writer).await;
    Outcome::Passed
}

/// Cancelled shared and permit acquisitions leave nothing behind: once the holder leaves,
/// the lock is free at once.
pub async fn cancelled_shared_and_permit_waits_leave_nothing_behind(ctx: Ctx) -> Outcome {
    let (a, b) = (ctx.client().await, ctx.client().await);
    let caps = a.capabilities().clone();
    if !caps.shared && caps.max_permits == 0 {
        return Outcome::Skipped("the backend has only exclusive locks".into());
    }
    let mut pairs = Vec::new();
    if caps.shared {
        pairs.push((ctx.name("rw"), ctx.opts(), ctx.opts().shared()));
    }
    if caps.max_permits >= 1 {
        let one = ctx.opts().with_permits(1);
        pairs.push((ctx.name("sem"), one.clone(), one));
    }
    for (name, hold, ask) in pairs {
        let holder = acquire(&*a, &name, &hold).await;
        let ask = ask.with_wait(LONG_WAIT);
        for _ in 0..5 {
            let waiting = b.acquire(&name, &ask);
            let cancelled = tokio::time::timeout(Duration::from_millis(30), waiting).await;
            assert!(
                cancelled.is_err(),
                "an acquisition of a held lock succeeded"
            );
        }
        release(holder).await;
        // The cleanup of a cancelled attempt runs in the background.
        let free = acquire_within(&*b, &name, &hold, ctx.slack()).await;
        let guard = free.unwrap_or_else(|| panic!("cancelled {:?} waits left a trace", ask.kind));
        release(guard).await;
    }
    Outcome::Passed
}

/// The upgradeable read-write lock across clients: one upgradeable reader at a time, beside
/// plain readers and without writers; an upgrade that times out while a reader reads keeps
/// its hold; an upgrade waits for the readers, and a writer already waiting for the gate
/// comes after it, with a larger token.
pub async fn upgradeable_reader_upgrades_with_no_writer_between(ctx: Ctx) -> Outcome {
    let (a, b, w) = (ctx.client().await, ctx.client().await, ctx.client().await);
    needs_shared!(a);
    let name = ctx.name("upgradeable");
    let lock = |client: &TestClient| {
        UpgradeableRwLock::new(client.lock.clone(), &name).expect("a valid name")
    };
    let (rw_a, rw_b, rw_w) = (lock(&a), lock(&b), lock(&w));
    let opts = ctx.opts();
    let up = rw_a.upgradeable(&opts).await.expect("upgradeable");
    let read_token = up.token();
    assert!(
        rw_b.try_upgradeable(&opts).await.expect("try").is_none(),
        "two upgradeable readers"
    );
    assert!(
        rw_w.try_write(&opts).await.expect("try").is_none(),
        "a writer beside the upgradeable reader"
    );
    let reader = rw_b
        .try_read(&opts)
        .await
        .expect("try")
        .expect("a plain reader was refused beside the upgradeable one");
    // A short upgrade while the reader reads: timed out, the hold kept.
    let failed = up
        .upgrade(Some(ctx.slack() / 2))
        .await
        .expect_err("upgraded beside a reader");
    assert!(
        matches!(failed.error, Error::Timeout { .. }),
        "{failed}: {:?}",
        failed.error
    );
    let up = failed.guard.expect("a timed-out upgrade lost its hold");
    assert!(
        rw_b.try_upgradeable(&opts).await.expect("try").is_none(),
        "the gate was let go of by a timed-out upgrade"
    );
    // A writer waits for the gate; the upgrade waits for the reader.
    let writer = {
        let (rw, opts) = (rw_w.clone(), opts.clone().with_wait(LONG_WAIT));
        tokio::spawn(async move { rw.write(&opts).await.map(|g| g.token()) })
    };
    tokio::time::sleep(ctx.slack() / 2).await;
    let upgrading = tokio::spawn(up.upgrade(Some(LONG_WAIT)));
    tokio::time::sleep(ctx.slack() / 2).await;
    assert!(!upgrading.is_finished(), "upgraded while a reader read");
    release(reader).await;
    let write = tokio::time::timeout(fair_wait(&ctx), upgrading)
        .await
        .expect("the upgrade did not end after the reader left")
        .expect("the upgrade panicked")
        .unwrap_or_else(|failed| panic!("{failed}: {:?}", failed.error));
    assert!(
        write.token() > read_token,
        "the write token {} is not above the read token {read_token}",
        write.token()
    );
    assert!(
        !writer.is_finished(),
        "a writer came between read and upgrade"
    );
    assert!(
        try_acquire(&*b, &name, &opts.clone().shared())
            .await
            .is_none(),
        "a reader beside the upgraded writer"
    );
    let token = write.token();
    write.release().await.expect("released");
    let later = tokio::time::timeout(fair_wait(&ctx), writer)
        .await
        .expect("the waiting writer did not get in after the upgrader")
        .expect("the writer panicked")
        .expect("the writer's acquire failed");
    assert!(
        later > token,
        "the next writer's token {later} is not above {token}"
    );
    Outcome::Passed
}

/// A writer downgrades with no writer in between: readers waiting for it get in, a writer
/// waiting does not until the reader is done; tokens keep increasing across the changes.
pub async fn downgrade_lets_readers_in_and_no_writer(ctx: Ctx) -> Outcome {
    let (a, r, w) = (ctx.client().await, ctx.client().await, ctx.client().await);
    needs_shared!(a);
    let name = ctx.name("downgrade");
    let lock = |client: &TestClient| {
        UpgradeableRwLock::new(client.lock.clone(), &name).expect("a valid name")
    };
    let (rw_a, rw_r, rw_w) = (lock(&a), lock(&r), lock(&w));
    let opts = ctx.opts();
    let write = rw_a.write(&opts).await.expect("writer");
    let write_token = write.token();
    let long = opts.clone().with_wait(LONG_WAIT);
    let writer = {
        let (rw, opts) = (rw_w.clone(), long.clone());
        tokio::spawn(async move { rw.write(&opts).await.map(|g| g.token()) })
    };
    let reader = {
        let (rw, opts) = (rw_r.clone(), long.clone());
        tokio::spawn(async move { rw.read(&opts).await })
    };
    tokio::time::sleep(ctx.slack() / 2).await;
    assert!(!reader.is_finished(), "a reader beside the writer");
    let up = write
        .downgrade_to_upgradeable()
        .await
        .expect("downgraded to the upgradeable reader");
    assert!(
        up.token() > write_token,
        "the downgraded read token is not above the write's"
    );
    let reader = tokio::time::timeout(fair_wait(&ctx), reader)
        .await
        .expect("the waiting reader did not get in after the downgrade")
        .expect("the reader panicked")
        .expect("the reader's acquire failed");
    assert!(!writer.is_finished(), "a writer came in at the downgrade");
    release(reader).await;
    let write = up
        .upgrade(Some(fair_wait(&ctx)))
        .await
        .unwrap_or_else(|failed| panic!("{failed}: {:?}", failed.error));
    let read = write.downgrade().await.expect("downgraded to a reader");
    tokio::time::sleep(ctx.slack() / 2).await;
    assert!(
        !writer.is_finished(),
        "a writer beside the downgraded reader"
    );
    let read_token = read.token();
    release(read).await;
    let later = tokio::time::timeout(fair_wait(&ctx), writer)
        .await
        .expect("the waiting writer did not get in after the reader")
        .expect("the writer panicked")
        .expect("the writer's acquire failed");
    assert!(
        later > read_token,
        "the writer's token {later} is not above {read_token}"
    );
    Outcome::Passed
}
