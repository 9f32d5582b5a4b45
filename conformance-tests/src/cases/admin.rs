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
