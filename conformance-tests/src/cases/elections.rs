//! Multi-locks and leader election: built on the exclusive lock, so every backend runs them.

use std::collections::HashMap;
use std::sync::Mutex;

use distlock_core::{FencingToken, Leader, MultiGuard};
use futures::StreamExt;

use super::*;

async fn acquire_all(
    client: &dyn DistributedLock,
    names: &[&str],
    opts: &AcquireOptions,
) -> MultiGuard {
    match client
        .acquire_all(names, &opts.clone().with_wait(LONG_WAIT))
        .await
    {
        Ok(guard) => guard,
        Err(err) => panic!("acquire_all({names:?}) failed: {err}"),
    }
}

/// Callers asking for overlapping sets in different orders never deadlock, and each name is
/// held by one of them at a time.
pub async fn multi_locks_in_any_order_never_deadlock(ctx: Ctx) -> Outcome {
    const ROUNDS: usize = 10;
    let (a, b, c, d) = (ctx.name("a"), ctx.name("b"), ctx.name("c"), ctx.name("d"));
    let sets = [
        vec![a.clone(), b.clone(), c.clone()],
        vec![c.clone(), b.clone(), a.clone()],
        vec![b.clone(), d.clone()],
        vec![d.clone(), a.clone()],
    ];
    let inside: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let mut tasks = Vec::new();
    for set in sets {
        let client = ctx.client().await;
        let (opts, inside) = (ctx.opts(), inside.clone());
        tasks.push(tokio::spawn(async move {
            let names: Vec<&str> = set.iter().map(String::as_str).collect();
            for _ in 0..ROUNDS {
                let guard = acquire_all(&*client, &names, &opts).await;
                for name in &set {
                    let mut inside = inside.lock().unwrap();
                    let n = inside.entry(name.clone()).or_default();
                    *n += 1;
                    assert_eq!(*n, 1, "{name} held by two multi-locks");
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
                for name in &set {
                    *inside.lock().unwrap().get_mut(name).unwrap() -= 1;
                }
                assert!(!guard.is_lost(), "lost a part inside a short hold");
                guard.release().await.expect("release of a multi-lock");
            }
        }));
    }
    let all = tokio::time::timeout(LONG_WAIT, join_all(tasks))
        .await
        .expect("multi-locks deadlocked");
    for task in all {
        task.expect("a multi-lock client panicked");
    }
    Outcome::Passed
}

/// All or nothing: when one name is taken, `try_acquire_all` and a timed-out `acquire_all`
/// leave every other name free; a taken set has a token per name, in name order.
pub async fn multi_lock_is_all_or_nothing(ctx: Ctx) -> Outcome {
    let (a, b) = (ctx.client().await, ctx.client().await);
    let (first, second, third) = (ctx.name("1"), ctx.name("2"), ctx.name("3"));
    let blocker = acquire(&*b, &second, &ctx.opts()).await;
    let names = [third.as_str(), first.as_str(), second.as_str()];
    match a.try_acquire_all(&names, &ctx.opts()).await {
        Ok(None) => {}
        other => panic!("try_acquire_all over a held name gave {other:?}"),
    }
    let timed = a
        .acquire_all(&names, &ctx.opts().with_wait(Duration::from_millis(200)))
        .await;
    assert!(matches!(timed, Err(Error::Timeout { .. })), "{timed:?}");
    for name in [&first, &third] {
        let guard = try_acquire(&*b, name, &ctx.opts())
            .await
            .unwrap_or_else(|| panic!("{name} stayed taken after a failed multi-lock"));
        release(guard).await;
    }
    release(blocker).await;
    let all = acquire_all(&*a, &names, &ctx.opts()).await;
    let order: Vec<&str> = all.tokens().map(|(name, _)| name.as_str()).collect();
    assert_eq!(order, [first.as_str(), second.as_str(), third.as_str()]);
    for (name, token) in all.tokens() {
        assert_eq!(all.token(name.as_str()), Some(token));
        if let Ok(Some(info)) = b.inspect(name.as_str()).await
            && let Some(seen) = info.token
        {
            assert_eq!(seen, token, "{name}");
        }
    }
    assert!(matches!(
        a.acquire_all(&[], &ctx.opts()).await,
        Err(Error::InvalidOptions(_))
    ));
    all.release().await.expect("release of a multi-lock");
    Outcome::Passed
}

/// A multi-lock reports the loss of any one part.
pub async fn multi_lock_reports_loss_of_any_part(ctx: Ctx) -> Outcome {
    let a = ctx.client().await;
    let (first, second) = (ctx.name("1"), ctx.name("2"));
    let all = acquire_all(&*a, &[&first, &second], &ctx.opts()).await;
    let lost = all.lost();
    hook!(ctx.harness().remove_lock(&second).await);
    let bound = ctx.ttl() + ctx.slack() * 2;
    let (name, _reason) = tokio::time::timeout(bound, lost)
        .await
        .unwrap_or_else(|_| panic!("the loss of one part was not reported within {bound:?}"));
    assert_eq!(name.as_str(), second);
    assert!(all.is_lost());
    let _ = all.release().await;
    Outcome::Passed
}

/// One leader at a time; terms strictly increase; everyone reads the leader's value and term.
pub async fn one_leader_at_a_time_with_increasing_terms(ctx: Ctx) -> Outcome {
    const CANDIDATES: usize = 3;
    const TERMS: usize = 6;
    let name = ctx.name("election");
    let leaders = Arc::new(AtomicUsize::new(0));
    let terms: Arc<Mutex<Vec<FencingToken>>> = Arc::default();
    let reader = ctx.client().await;
    let mut tasks = Vec::new();
    for candidate in 0..CANDIDATES {
        let client = ctx.client().await;
        let (name, opts, leaders, terms) =
            (name.clone(), ctx.opts(), leaders.clone(), terms.clone());
        let value = format!("node-{candidate}");
        tasks.push(tokio::spawn(async move {
            for _ in 0..TERMS {
                let opts = opts.clone().with_wait(LONG_WAIT);
                let guard = match client.campaign(&name, &value, &opts).await {
                    Ok(guard) => guard,
                    Err(err) => panic!("campaign failed: {err}"),
                };
                assert_eq!(
                    leaders.fetch_add(1, Ordering::SeqCst),
                    0,
                    "two leaders at once"
                );
                {
                    let mut terms = terms.lock().unwrap();
                    if let Some(last) = terms.last() {
                        assert!(guard.token() > *last, "term {} after {last}", guard.token());
                    }
                    terms.push(guard.token());
                }
                let seen = client.leader(&name).await;
                if let Ok(seen) = seen {
                    let seen = seen.expect("no leader while one leads");
                    assert_eq!(seen.value.as_deref(), Some(value.as_str()));
                    assert!(seen.term.is_none_or(|t| t == guard.token()), "{seen:?}");
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
                leaders.fetch_sub(1, Ordering::SeqCst);
                release(guard).await;
            }
        }));
    }
    for task in join_all(tasks).await {
        task.expect("a candidate panicked");
    }
    assert_eq!(terms.lock().unwrap().len(), CANDIDATES * TERMS);
    if let Ok(leader) = reader.leader(&name).await {
        assert_eq!(leader, None, "a leader after everyone resigned");
    }
    Outcome::Passed
}

/// An observer sees each leader in turn (each leads longer than the observer's interval),
/// with increasing terms, and "no leader" at the end.
pub async fn observer_sees_every_leader_change(ctx: Ctx) -> Outcome {
    let (observer, candidate) = (ctx.client().await, ctx.client().await);
    let name = ctx.name("observed");
    if observer.inspect(&name).await.is_err() {
        return Outcome::Skipped("the backend cannot inspect locks".into());
    }
    let every = Duration::from_millis(50);
    let mut stream = observer.observe(&name, every);
    let first = tokio::time::timeout(ctx.slack(), stream.next()).await;
    assert!(
        matches!(first, Ok(Some(Ok(None)))),
        "first observation: {first:?}"
    );
    let seen: Arc<Mutex<Vec<Option<Leader>>>> = Arc::default();
    let collector = {
        let seen = seen.clone();
        tokio::spawn(async move {
            while let Some(next) = stream.next().await {
                let leader = next.expect("an observation failed");
                let done = leader.as_ref().and_then(|l| l.value.as_deref()) == Some("c");
                seen.lock().unwrap().push(leader);
                if done {
                    break;
                }
            }
        })
    };
    let hold = every * 4 + ctx.slack() / 2;
    for value in ["a", "b", "c"] {
        let guard = candidate
            .campaign(&name, value, &ctx.opts().with_wait(LONG_WAIT))
            .await
            .expect("campaign");
        tokio::time::sleep(hold).await;
        if value != "c" {
            release(guard).await;
        } else {
            tokio::time::timeout(LONG_WAIT, collector)
                .await
                .expect("the observer never saw the last leader")
                .expect("the observer panicked");
            release(guard).await;
            break;
        }
    }
    let seen = seen.lock().unwrap().clone();
    let values: Vec<&str> = seen
        .iter()
        .flatten()
        .filter_map(|l| l.value.as_deref())
        .collect();
    assert_eq!(values, ["a", "b", "c"], "observed {seen:?}");
    let terms: Vec<FencingToken> = seen.iter().flatten().filter_map(|l| l.term).collect();
    assert!(terms.windows(2).all(|w| w[0] < w[1]), "terms {terms:?}");
    Outcome::Passed
}

/// A leader whose lease runs out (it stopped renewing) knows it has lost before anyone else
/// is elected.
pub async fn deposed_leader_knows_before_the_next_is_elected(ctx: Ctx) -> Outcome {
    let (a, b) = (ctx.client().await, ctx.client().await);
    let name = ctx.name("deposed");
    let paused = ctx.opts().with_renewal(Renewal::disabled());
    let old = a.campaign(&name, "old", &paused).await.expect("campaign");
    let new = b
        .campaign(&name, "new", &ctx.opts().with_wait(LONG_WAIT))
        .await
        .expect("campaign");
    let elected = Instant::now();
    assert!(
        old.valid_until() <= elected,
        "the old leader's valid_until is after the new term"
    );
    assert!(old.is_lost(), "the old leader did not know it was deposed");
    assert!(
        new.token() > old.token(),
        "term {} after {}",
        new.token(),
        old.token()
    );
    assert!(
        matches!(
            a.campaign(&name, &"x".repeat(Leader::MAX_VALUE_LEN + 1), &ctx.opts())
                .await,
            Err(Error::InvalidOptions(_))
        ),
        "an overlong value was accepted"
    );
    release(new).await;
    Outcome::Passed
}

/// The first leader `changes` reports with `value`, within `within`.
///
/// # Panics
/// When none comes (the observation ended, or `within` passed).
async fn seen_value(
    changes: &mut futures::stream::BoxStream<'static, distlock_core::Result<Option<Leader>>>,
    value: &str,
    within: Duration,
) -> Leader {
    tokio::time::timeout(within, async {
        while let Some(item) = changes.next().await {
            if let Ok(Some(l)) = item
                && l.value.as_deref() == Some(value)
            {
                return l;
            }
        }
        panic!("the observation ended")
    })
    .await
    .unwrap_or_else(|_| panic!("no observer report of the value {value:?} within {within:?}"))
}

/// Proclaim: the leader changes its value without a new election (the term stays), observers
/// see it (at once where the backend signals changes); a deposed leader's proclaim is
/// refused and leaves its successor's value alone.
pub async fn proclaim_changes_the_value_and_keeps_the_term(ctx: Ctx) -> Outcome {
    let (a, b) = (ctx.client().await, ctx.client().await);
    if !a.capabilities().holder_data {
        return Outcome::Skipped("the backend stores no data with a hold".into());
    }
    let name = ctx.name("proclaim");
    let opts = ctx.opts().with_wait(LONG_WAIT);
    let mut changes = b.observe(&name, Duration::from_millis(200));
    let leader = a.campaign(&name, "v1", &opts).await.expect("campaign");
    let first = b.leader(&name).await.expect("leader").expect("a leader");
    assert_eq!(first.value.as_deref(), Some("v1"));
    // Where the backend signals changes, an observer that reads only every 30 s sees the
    // proclaim at once too: the signal covers a value's change, not only a new leader.
    let mut signalled = ctx
        .observers_woken()
        .then(|| b.observe(&name, Duration::from_secs(30)));
    if let Some(signalled) = signalled.as_mut() {
        seen_value(signalled, "v1", Duration::from_secs(10)).await;
    }
    leader.proclaim("v2").await.expect("proclaim");
    let now = b.leader(&name).await.expect("leader").expect("a leader");
    assert_eq!(
        (now.value.as_deref(), now.term),
        (Some("v2"), first.term),
        "the proclaim changed the term or not the value"
    );
    // The observer reports v2 with the same term.
    let seen = seen_value(&mut changes, "v2", Duration::from_secs(10)).await;
    assert_eq!(seen.term, first.term);
    if let Some(signalled) = signalled.as_mut() {
        let seen = seen_value(signalled, "v2", Duration::from_secs(5)).await;
        assert_eq!(seen.term, first.term);
    }
    assert!(matches!(
        leader
            .proclaim(&"x".repeat(Leader::MAX_VALUE_LEN + 1))
            .await,
        Err(Error::InvalidOptions(_))
    ));
    release(leader).await;

    // A plain lock's guard has no value to proclaim.
    let plain = acquire(&*a, &ctx.name("proclaim-plain"), &ctx.opts()).await;
    assert!(matches!(
        plain.proclaim("v").await,
        Err(Error::InvalidOptions(_))
    ));
    release(plain).await;

    // A leader that stopped renewing is deposed by the next; its proclaim is refused.
    let stale = a
        .campaign(
            &name,
            "old",
            &opts.clone().with_renewal(Renewal::disabled()),
        )
        .await
        .expect("campaign");
    let next = b.campaign(&name, "new", &opts).await.expect("campaign");
    let refused = stale.proclaim("late").await;
    assert!(
        refused.as_ref().is_err_and(Error::is_not_held),
        "a deposed leader proclaimed: {refused:?}"
    );
    let now = b.leader(&name).await.expect("leader").expect("a leader");
    assert_eq!(
        (now.value.as_deref(), now.term),
        (Some("new"), Some(next.token()))
    );
    release(next).await;
    Outcome::Passed
}
