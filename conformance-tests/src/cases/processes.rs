//! Waiters in other processes that are killed or paused while queued: a lock is a lease, and
//! so is a place in its queue. Each case runs a waiter in a [`child`](crate::child) process.

use nix::sys::signal::Signal;
use tokio::task::JoinHandle;

use super::*;
use crate::TestClient;
use crate::child::ChildWaiter;

/// How long a child process may take to start, connect and make its first poll.
const CHILD_START: Duration = Duration::from_secs(30);

/// A holder, a waiter in a child process queued behind it, and an in-process waiter queued
/// behind the child: the order in which a FIFO backend serves them.
struct Queue {
    holder: Held,
    child: ChildWaiter,
    next: JoinHandle<(Instant, Held)>,
}

/// A guard with the client it came from (kept as long as the guard).
struct Held {
    guard: LockGuard,
    client: TestClient,
}

/// Sets up a [`Queue`] on `name`, or says why this configuration cannot.
async fn queue(ctx: &Ctx, name: &str) -> Result<Queue, Outcome> {
    let Some(shared) = ctx.harness().process_shared() else {
        return Err(Outcome::Skipped(
            "the backend's locks live in one process".into(),
        ));
    };
    let client = ctx.client().await;
    let holder = Held {
        guard: acquire(&*client, name, &ctx.opts()).await,
        client,
    };
    let mut child = ChildWaiter::spawn(ctx, &shared, name, ctx.ttl(), LONG_WAIT);
    child.expect(&["queued"], CHILD_START).await;
    let next = queue_behind(ctx.client().await, name, ctx.opts()).await;
    Ok(Queue {
        holder,
        child,
        next,
    })
}

/// Starts a waiting acquire of `name` on `client` and returns once it waits.
async fn queue_behind(
    client: TestClient,
    name: &str,
    opts: AcquireOptions,
) -> JoinHandle<(Instant, Held)> {
    let name = name.to_owned();
    spawn_waiting(CHILD_START, async move {
        let guard = acquire(&*client, &name, &opts).await;
        (Instant::now(), Held { guard, client })
    })
    .await
}

/// Releases the holder of `queue` (whose child waiter is dead or paused) and returns the next
/// waiter's guard, checking that it came within the ttl (the child's place in the queue is a
/// lease of that length) plus slack, with a larger token.
async fn next_takes_over(ctx: &Ctx, holder: Held, next: JoinHandle<(Instant, Held)>) -> Held {
    let held = holder.guard.token();
    let released = Instant::now();
    release(holder.guard).await;
    drop(holder.client);
    let bound = ctx.ttl() + ctx.slack();
    let (at, next) = match tokio::time::timeout(bound + LONG_WAIT, next).await {
        Ok(Ok(got)) => got,
        Ok(Err(err)) => panic!("the next waiter failed: {err}"),
        Err(_) => panic!(
            "the next waiter had no lock {:?} after the release",
            bound + LONG_WAIT
        ),
    };
    let took = at - released;
    assert!(
        took <= bound,
        "the next waiter took {took:?} after the release (ttl {:?}): the stopped waiter's place \
         in the queue blocked it beyond its ttl",
        ctx.ttl()
    );
    assert!(
        next.guard.token() > held,
        "the next holder's token {} is not above the previous holder's {held}",
        next.guard.token()
    );
    next
}

/// A waiter killed with `SIGKILL` while queued (its client never says goodbye) stops blocking
/// the waiters behind it within its ttl.
pub async fn killed_waiter_does_not_block_the_queue(ctx: Ctx) -> Outcome {
    stopped_waiter(ctx, Signal::SIGKILL).await
}

/// A waiter paused with `SIGSTOP` while queued stops blocking the waiters behind it within its
/// ttl; resumed, it does not take the lock from the new holder, and its own acquire ends
/// cleanly: with the lock after the new holder's release (a larger token), or a timeout.
pub async fn paused_waiter_does_not_block_the_queue(ctx: Ctx) -> Outcome {
    stopped_waiter(ctx, Signal::SIGSTOP).await
}

/// The cases above: the queued child gets `signal` (`SIGKILL` or `SIGSTOP`).
async fn stopped_waiter(ctx: Ctx, signal: Signal) -> Outcome {
    let name = ctx.name(&format!("stopped-waiter-{signal}"));
    let Queue {
        holder,
        mut child,
        next,
    } = match queue(&ctx, &name).await {
        Ok(queue) => queue,
        Err(outcome) => return outcome,
    };
    if signal == Signal::SIGKILL {
        child.kill().await;
    } else {
        child.pause(CHILD_START).await;
    }
    let Held { guard, client } = next_takes_over(&ctx, holder, next).await;
    if signal == Signal::SIGSTOP {
        child.signal(Signal::SIGCONT);
        resumed_waiter_stays_behind(&ctx, &mut child, guard).await;
    } else {
        release(guard).await;
        let again = acquire(&*client, &name, &ctx.opts()).await;
        release(again).await;
    }
    drop(client);
    Outcome::Passed
}

/// After `SIGCONT`: the child does not take the lock while `guard` holds it, and ends cleanly
/// after its release.
async fn resumed_waiter_stays_behind(ctx: &Ctx, child: &mut ChildWaiter, guard: LockGuard) {
    // Long enough for the resumed child to act on whatever it last saw, and for its renewals
    // or the new holder's to run several times.
    let until = Instant::now() + ctx.ttl() * 2 + ctx.slack();
    while Instant::now() < until {
        assert!(
            !guard.is_lost(),
            "the new holder lost the lock after the waiter resumed"
        );
        assert!(
            !child
                .seen()
                .iter()
                .any(|(_, line)| line.starts_with("acquired")),
            "the resumed waiter acquired the lock the new holder holds"
        );
        tokio::time::sleep(ctx.ttl() / 10).await;
    }
    let held = guard.token();
    release(guard).await;
    let (_, said) = child.expect(&["acquired", "timeout"], LONG_WAIT).await;
    if let Some(token) = said.strip_prefix("acquired ") {
        let token: u64 = token.parse().expect("the child's token");
        assert!(
            token > held.get(),
            "the resumed waiter's token {token} is not above the new holder's {held}"
        );
        child.expect(&["released"], LONG_WAIT).await;
    }
    let status = child.exit(LONG_WAIT).await;
    assert!(status.success(), "the resumed waiter exited with {status}");
}
