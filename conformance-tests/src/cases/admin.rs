//! Operators' tools: listing held locks and forced release.

use super::*;

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
    let contest = Contest::start(&ctx, a, b, &name).await;
    let forced = Instant::now();
    assert!(
        admin.force_release(&name).await.expect("force release"),
        "force release of a held lock reported nothing removed"
    );
    let new = contest.hand_over(&ctx, "force_release", forced).await;
    release(new).await;
    Outcome::Passed
}

/// A holder and a waiter blocked behind it, for the cases that remove the hold behind the
/// holder's back.
struct Contest {
    old: LockGuard,
    lost: std::pin::Pin<Box<dyn std::future::Future<Output = LossReason> + Send>>,
    waiter: tokio::task::JoinHandle<LockGuard>,
    interval: Duration,
}

impl Contest {
    /// `a` holds `name`, `b` waits for it (blocked, subscribed to wake-ups where the backend
    /// has them).
    async fn start(ctx: &Ctx, a: crate::TestClient, b: crate::TestClient, name: &str) -> Self {
        let opts = ctx.opts();
        let interval = opts.renewal_interval().expect("renewal is on by default");
        let old = acquire(&*a, name, &opts).await;
        let lost = Box::pin(old.lost());
        let waiter = {
            let (name, opts) = (name.to_owned(), opts.clone());
            tokio::spawn(async move { acquire(&*b, &name, &opts).await })
        };
        tokio::time::sleep(ctx.slack().min(ctx.ttl()) / 2).await;
        assert!(!waiter.is_finished(), "the waiter got a held lock");
        Self {
            old,
            lost,
            waiter,
            interval,
        }
    }

    /// After `how` removed the hold at `removed`: the old holder learns of the loss within its
    /// renewal interval, its `renew` and `release` fail, the waiter gets the lock (woken, or
    /// polling within the former lease) with a higher token and keeps it. The new guard.
    async fn hand_over(self, ctx: &Ctx, how: &str, removed: Instant) -> LockGuard {
        let Self {
            old,
            lost,
            waiter,
            interval,
        } = self;
        let old_token = old.token();
        let reason = tokio::time::timeout(interval + ctx.slack(), lost)
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "lost() did not resolve within {:?} of the {how}",
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
            "renew after {how}: {renewed:?}"
        );
        let within = ctx.ttl() + ctx.slack();
        let new = tokio::time::timeout(within, waiter)
            .await
            .unwrap_or_else(|_| panic!("the waiter did not get the lock within {within:?}"))
            .expect("the waiter panicked");
        assert!(removed.elapsed() <= interval.max(within) + ctx.slack());
        assert!(
            new.token() > old_token,
            "the next holder's token {} is not above the removed holder's {old_token}",
            new.token()
        );
        let released = old.release().await;
        assert!(
            matches!(released, Err(Error::NotHeld { .. } | Error::Lost { .. })),
            "release after {how}: {released:?}"
        );
        assert!(
            !new.is_lost(),
            "the old holder's release took the new holder's lock"
        );
        new.renew().await.expect("the new holder can renew");
        new
    }
}

/// `release_hold` frees exactly the hold named by its owner and token: a wrong token, a wrong
/// owner or a free name remove nothing; the right pair frees it (the holder learns of the loss
/// within its renewal interval, its renew and release fail, a blocked waiter gets the lock with
/// a higher token); the same pair again removes nothing and leaves the newer holder holding.
pub async fn release_hold_frees_exactly_that_hold(ctx: Ctx) -> Outcome {
    let (a, b, admin) = (ctx.client().await, ctx.client().await, ctx.client().await);
    if !admin.capabilities().release_hold {
        return Outcome::Skipped("the backend cannot release a hold by its token".into());
    }
    let name = ctx.name("by-token");
    let release_hold = |owner: String, token: FencingToken| {
        let (admin, name) = (admin.clone(), name.clone());
        async move {
            admin
                .release_hold(&name, &owner, token)
                .await
                .unwrap_or_else(|err| panic!("release_hold({name:?}, {owner:?}, {token}): {err}"))
        }
    };
    assert!(
        !release_hold("nobody".into(), FencingToken::new(1)).await,
        "release_hold of a free name reported a removal"
    );
    let contest = Contest::start(&ctx, a, b, &name).await;
    let (owner, token) = (contest.old.owner().to_owned(), contest.old.token());
    assert!(
        !release_hold(owner.clone(), FencingToken::new(token.get() + 1)).await,
        "a wrong token released the hold"
    );
    assert!(
        !release_hold(format!("{owner}0"), token).await,
        "a wrong owner released the hold"
    );
    contest
        .old
        .renew()
        .await
        .expect("the holder still holds after the refused releases");
    let removed = Instant::now();
    assert!(
        release_hold(owner.clone(), token).await,
        "release_hold of the live hold reported nothing removed"
    );
    let new = contest.hand_over(&ctx, "release_hold", removed).await;
    assert!(
        !release_hold(owner.clone(), token).await,
        "the released hold's pair released something again"
    );
    assert!(
        !release_hold(owner, new.token()).await,
        "the old owner with the new token released the new hold"
    );
    new.renew().await.expect("the new holder still holds");
    release(new).await;
    Outcome::Passed
}

/// `release_hold` of one reader of a read-write lock (or, on a backend without them, one
/// permit holder of a semaphore) leaves the other holder holding and renewing, and lets a
/// writer (a second permit) in only once the last one is gone.
pub async fn release_hold_of_one_holder_keeps_the_others(ctx: Ctx) -> Outcome {
    let (a, b, admin) = (ctx.client().await, ctx.client().await, ctx.client().await);
    let caps = admin.capabilities();
    if !caps.release_hold {
        return Outcome::Skipped("the backend cannot release a hold by its token".into());
    }
    let (opts, other) = if caps.shared {
        (ctx.opts().shared(), ctx.opts())
    } else if caps.max_permits >= 2 {
        // Two of two permits held: a third contender needs one freed.
        (ctx.opts().with_permits(2), ctx.opts().with_permits(2))
    } else {
        return Outcome::Skipped("the backend has no shared holds".into());
    };
    let name = ctx.name("by-token-shared");
    let first = acquire(&*a, &name, &opts).await;
    let second = acquire(&*b, &name, &opts).await;
    let lost = first.lost();
    assert!(
        admin
            .release_hold(&name, first.owner(), first.token())
            .await
            .expect("release_hold"),
        "release_hold of a live shared hold reported nothing removed"
    );
    let interval = opts.renewal_interval().expect("renewal is on by default");
    tokio::time::timeout(interval + ctx.slack(), lost)
        .await
        .unwrap_or_else(|_| panic!("lost() did not resolve within {:?}", interval + ctx.slack()));
    second
        .renew()
        .await
        .expect("the other holder still holds after release_hold of the first");
    assert!(!second.is_lost(), "the other holder lost its hold");
    if caps.shared {
        assert!(
            try_acquire(&*admin, &name, &other).await.is_none(),
            "a writer got in while a reader still holds"
        );
    } else {
        let third = try_acquire(&*admin, &name, &other)
            .await
            .expect("the freed permit is free");
        release(third).await;
    }
    release(second).await;
    let writer = acquire_within(&*admin, &name, &other, ctx.ttl() + ctx.slack())
        .await
        .expect("free once both holds are gone");
    release(writer).await;
    Outcome::Passed
}

/// Holder data: stored with the hold at acquisition, shown by `inspect` (and `list`), replaced
/// by the holder, kept by renewals, refused from a former holder, gone with the hold; the
/// latest reader's shown for a read lock. A backend without it refuses the option, typed.
pub async fn holder_data_is_stored_with_the_hold_and_ends_with_it(ctx: Ctx) -> Outcome {
    let (a, b) = (ctx.client().await, ctx.client().await);
    let caps = a.capabilities().clone();
    let name = ctx.name("data");
    if !caps.holder_data {
        return match a.acquire(&name, &ctx.opts().with_data("x")).await {
            Err(Error::Unsupported(_)) => {
                Outcome::Skipped("the backend stores no data with a hold".into())
            }
            other => panic!("data on a backend without holder_data: {other:?}"),
        };
    }
    let data_of = async |name: &str| b.inspect(name).await.expect("inspect").expect("held").data;
    let guard = acquire(&*a, &name, &ctx.opts().with_data("host=a pid=1")).await;
    assert_eq!(data_of(&name).await.as_deref(), Some("host=a pid=1"));
    if caps.list {
        let listed = b.list(Some(&name), 10).await.expect("list");
        assert_eq!(listed.len(), 1, "{listed:?}");
        assert_eq!(listed[0].1.data.as_deref(), Some("host=a pid=1"));
    }
    guard.set_data(Some("step=2")).await.expect("set_data");
    assert_eq!(data_of(&name).await.as_deref(), Some("step=2"));
    // Renewals keep it.
    tokio::time::sleep(ctx.ttl() * 2).await;
    assert!(!guard.is_lost());
    assert_eq!(data_of(&name).await.as_deref(), Some("step=2"));
    guard.set_data(None).await.expect("clear");
    assert_eq!(data_of(&name).await, None);
    let big = "x".repeat(distlock_core::MAX_HOLDER_DATA + 1);
    assert!(matches!(
        guard.set_data(Some(&big)).await,
        Err(Error::InvalidOptions(_))
    ));
    assert!(matches!(
        a.acquire(&ctx.name("data-big"), &ctx.opts().with_data(big.clone()))
            .await,
        Err(Error::InvalidOptions(_))
    ));
    guard.set_data(Some("last")).await.expect("set_data");
    release(guard).await;

    // The next hold starts without it; a former holder cannot write over the next one's.
    let stale = acquire(&*a, &name, &ctx.opts().with_renewal(Renewal::disabled())).await;
    assert_eq!(
        data_of(&name).await,
        None,
        "the released hold's data stayed"
    );
    let next = acquire(&*b, &name, &ctx.opts().with_data("next")).await;
    let refused = stale.set_data(Some("stale")).await;
    assert!(
        refused.as_ref().is_err_and(Error::is_not_held),
        "a former holder's data was taken: {refused:?}"
    );
    assert_eq!(data_of(&name).await.as_deref(), Some("next"));
    release(next).await;

    if caps.shared {
        let readers = ctx.name("data-readers");
        let r1 = acquire(&*a, &readers, &ctx.opts().shared().with_data("r1")).await;
        let r2 = acquire(&*b, &readers, &ctx.opts().shared().with_data("r2")).await;
        let info = b.inspect(&readers).await.expect("inspect").expect("held");
        assert_eq!((info.holders, info.data.as_deref()), (2, Some("r2")));
        release(r2).await;
        assert_eq!(data_of(&readers).await.as_deref(), Some("r1"));
        release(r1).await;
    }
    Outcome::Passed
}
