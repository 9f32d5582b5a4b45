//! Faults: cut connections and a server that goes away and comes back (disruptive cases).

use super::*;

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
    let before = guard.token();
    release(guard).await;
    let bound = ctx.harness().operation_timeout() + ctx.slack();
    let stopped = ctx.harness().stop_server().await;
    hook!(stopped);
    let outcome = check_outage(&ctx, &*client, &name, bound)
        .await
        // A grant's token tells where it came from: the server (a later token) or an answer
        // that was not the statement's (the token before).
        .map_err(|msg| format!("{msg} (the token before the outage: {before:?})"));
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
