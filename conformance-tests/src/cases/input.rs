//! Invalid names, options and durations: typed errors, never a panic.

use super::*;

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
