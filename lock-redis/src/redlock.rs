//! Redlock over N independent masters: the quorum rounds of acquire, renew, release,
//! inspection and forced release. Each works on every master at once (per-node timeouts), and
//! succeeds only with a majority. The single-master paths in `attempt.rs`, `lease.rs` and
//! `backend.rs` hand over to these functions when the backend is a Redlock; the per-node
//! commands are in `node/`, shared by both.

use std::sync::Arc;
use std::time::{Duration, Instant};

use std::collections::HashMap;

use distlock_core::{
    Acquired, AttemptMode, Error, FencingToken, LockInfo, LockKind, LockName, NodeOutcome,
    NodeResult, Result, Step,
};
use futures::StreamExt;
use futures::future::BoxFuture;
use futures::future::join_all;
use futures::stream::FuturesUnordered;

use crate::attempt::{RedisAttempt, remaining};
use crate::backend::BackendState;
use crate::error::{RedisError, RedisErrorKind};
use crate::keys::LockKeys;
use crate::lease::RedisLease;
use crate::node::{Answer, Holding, Node, ReleaseMode, within};
use crate::renew::{self, Batch};

/// Redlock tokens are the majority's largest counter times this, plus the index (in URL order)
/// of the first master of the majority that gave it; Redlock takes at most this many masters.
///
/// Each master's counter hands out every value once, so no two acquisitions get the same
/// (counter, master) pair: readers that acquire at once through different majorities, whose
/// largest counters can be equal, still get distinct tokens. Order follows the counters, as
/// the plain maximum did.
pub(crate) const TOKEN_SCALE: u64 = 64;

/// The token of an acquisition whose majority's largest counter is `max`, first given by the
/// master at `index`.
pub(crate) fn token_of(max: u64, index: usize) -> u64 {
    max.saturating_mul(TOKEN_SCALE)
        .saturating_add(u64::try_from(index).unwrap_or(0) % TOKEN_SCALE)
}

/// One Redlock acquisition round: the acquire script on every master at once, each bounded by
/// the per-node timeout; held iff a majority answered within the validity (ttl - elapsed -
/// drift), as soon as a majority granted it (the other masters' answers are not awaited; a
/// failed round waits for every master, up to the node timeout).
/// The token comes from the largest counter of that majority ([`TOKEN_SCALE`]), and the
/// majority's lower counters are raised to it. A failed round releases wherever it may hold.
pub(crate) async fn acquire(attempt: &mut RedisAttempt) -> Result<Step> {
    attempt.listen_early();
    let shared = attempt.shared.clone();
    let ttl = attempt.request.ttl;
    let timeout = shared.node_timeout(ttl);
    let fast = attempt.fast();
    let started = Instant::now();
    let quorum = shared.quorum();
    let round = Arc::new((
        shared.clone(),
        attempt.keys.clone(),
        attempt.request.clone(),
        attempt.score.clone(),
    ));
    // A majority that granted is the lock: the other masters' answers matter only to a failed
    // round, and whatever their requests take is this owner's, which the lease's renewals and
    // its release reach on every master.
    let gathered = gather(
        shared.nodes.len(),
        quorum,
        |i| {
            let round = round.clone();
            async move {
                let (shared, keys, request, score) = &*round;
                let n = &shared.nodes[i];
                within(
                    n,
                    timeout,
                    n.acquire(keys, request, &shared.config, score, fast),
                )
                .await
            }
        },
        |answer| matches!(answer, Ok(Answer::Acquired(_))),
    )
    .await;
    let elapsed = started.elapsed();
    if gathered.good >= quorum && elapsed + shared.client.drift(ttl) < ttl {
        // Queued where the lock was busy: left there at once (see `acquired`), also where the
        // answer comes after this (a grant there is the lease's, like the majority's).
        let leave = Leave::of(attempt);
        let late = leave.clone();
        let (answered, unsettled) = gathered.settle_with(move |rest| {
            Box::pin(async move {
                if let Some(late) = late {
                    late.run(busy(rest.iter().map(|(i, a)| (*i, a)))).await;
                }
            })
        });
        let tokens: Vec<(&Node, u64)> = shared
            .nodes
            .iter()
            .zip(&answered)
            .filter_map(|(n, a)| match a {
                Some(Ok(Answer::Acquired(token))) => Some((n, *token)),
                _ => None,
            })
            .collect();
        if let Some(leave) = leave {
            leave.spawn(busy(
                answered
                    .iter()
                    .enumerate()
                    .filter_map(|(i, a)| Some((i, a.as_ref()?))),
            ));
        }
        return Ok(Step::Acquired(
            acquired(attempt, &tokens, timeout, unsettled).await,
        ));
    }
    // The round failed: every master's answer decides what to retreat from (a majority that
    // granted too late leaves the others to be awaited).
    let answers = settled(&shared, gathered.all().await);
    // What each master's counter was, for the hand-overs to come (see `RedisAttempt::seen`).
    for (i, answer) in answers.iter().enumerate() {
        if let Ok(Answer::Busy(_, Some(counter)) | Answer::Acquired(counter)) = answer {
            attempt.saw(i, started, *counter);
        }
    }
    let Tally {
        outcomes,
        tokens,
        mut busy,
        hard_failure,
        mismatch,
    } = Tally::of(&shared, &answers);
    retreat(attempt, &answers, timeout).await;
    if let Some(held) = mismatch {
        return Err(attempt.mismatch(held));
    }
    if tokens.len() + busy.len() < quorum {
        let error = Error::QuorumNotReached {
            name: attempt.request.name.to_string(),
            reached: tokens.len(),
            needed: quorum,
            nodes: outcomes,
        };
        return Err(match hard_failure {
            // A misconfigured server does not heal by retrying.
            Some(kind) => Error::Backend {
                message: format!("{kind}: {error}"),
                source: Some(Box::new(error)),
            },
            None => error,
        });
    }
    if busy.len() >= quorum {
        busy.sort_unstable();
        // The lease is certainly over on a majority after the quorum-th shortest one.
        let ms = busy.get(quorum - 1).copied();
        return Ok(attempt.busy(ms));
    }
    // A split vote or too slow: the core retries after a random pause (a waiter
    // subscribes first, as on any busy answer).
    let _subscribed = attempt.busy(None);
    Ok(Step::Contended)
}

/// Runs one request per master at once (`each(i)` for master `i`, owning what it needs) and
/// returns their answers as soon as `enough` of them are `good`, else once every master
/// answered (each bounded by its own timeout); `None` for a master not awaited yet, whose
/// request goes on in [`Gathered`]. So a slow master, within its node timeout, delays no round
/// that a majority settled without it.
async fn gather<T, F>(
    masters: usize,
    enough: usize,
    each: impl Fn(usize) -> F,
    good: impl Fn(&T) -> bool,
) -> Gathered<T>
where
    F: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let mut rest: Rest<T> = (0..masters)
        .map(|i| {
            let request = each(i);
            Box::pin(async move { (i, request.await) }) as BoxFuture<'static, (usize, T)>
        })
        .collect();
    let mut answers: Vec<Option<T>> = (0..masters).map(|_| None).collect();
    let mut met = 0;
    while met < enough
        && let Some((i, answer)) = rest.next().await
    {
        met += usize::from(good(&answer));
        answers[i] = Some(answer);
    }
    Gathered {
        answers,
        good: met,
        rest,
    }
}

/// The requests of a [`gather`] still running.
type Rest<T> = FuturesUnordered<BoxFuture<'static, (usize, T)>>;

/// What [`gather`] returns: the answers so far, and the requests still running, which must
/// either be awaited ([`Gathered::all`]) or finish in the background ([`Gathered::settle`]):
/// never dropped, so that they act on their masters, and teach their nodes what their
/// answers say (a Redis without `SET NX GET`, a contended lock), as if awaited.
struct Gathered<T> {
    answers: Vec<Option<T>>,
    /// How many of `answers` were good.
    good: usize,
    rest: Rest<T>,
}

impl<T: Send + 'static> Gathered<T> {
    /// The answers so far; the requests still running finish in a spawned task.
    fn settle(self) -> Vec<Option<T>> {
        self.settle_with(|_| Box::pin(async {})).0
    }

    /// [`Self::settle`], and then `late` with the answers that came in the spawned task; with
    /// the masters whose requests were still running, as they finish (`None`: none was).
    fn settle_with<F>(self, late: F) -> (Vec<Option<T>>, Option<Unsettled>)
    where
        F: FnOnce(Vec<(usize, T)>) -> BoxFuture<'static, ()> + Send + 'static,
    {
        let Self {
            answers, mut rest, ..
        } = self;
        if rest.is_empty() {
            return (answers, None);
        }
        let running = answers
            .iter()
            .enumerate()
            .filter(|(_, a)| a.is_none())
            .fold(0, |mask, (i, _)| mask | master_bit(i));
        let (finished, unsettled) = tokio::sync::watch::channel(running);
        tokio::spawn(async move {
            let mut answered = Vec::new();
            while let Some(answer) = rest.next().await {
                finished.send_modify(|running| *running &= !master_bit(answer.0));
                answered.push(answer);
            }
            late(answered).await;
        });
        (answers, Some(Unsettled(unsettled)))
    }

    /// Every master's answer (each request is bounded by its own timeout).
    async fn all(self) -> Vec<Option<T>> {
        let Self {
            mut answers,
            mut rest,
            ..
        } = self;
        while let Some((i, answer)) = rest.next().await {
            answers[i] = Some(answer);
        }
        answers
    }
}

/// The masters whose requests of an acquisition round were still running when a majority
/// granted it ([`Gathered::settle_with`]), as they finish. The lease's release waits for a
/// master's request before it sends its own there: a request that takes two scripts (the
/// `SET NX GET` fast path, then the full script where the lock was busy) could otherwise
/// grant the lock there after the release ran, a copy nobody removes until its ttl runs out
/// (a master that refuses everyone else meanwhile).
#[derive(Clone, Debug)]
pub(crate) struct Unsettled(tokio::sync::watch::Receiver<u64>);

impl Unsettled {
    /// Whether master `i`'s request of the round is still running.
    pub(crate) fn running(&self, i: usize) -> bool {
        *self.0.borrow() & master_bit(i) != 0
    }

    /// Returns once master `i`'s request of the round has finished (at once if it had; also
    /// if the task awaiting it is gone, as with a runtime shutting down). Each request is
    /// bounded by its node timeout, so this is too.
    pub(crate) async fn settled(&self, i: usize) {
        let mut running = self.0.clone();
        // An error: the sender is gone, nothing is left running.
        let _ = running
            .wait_for(|running| running & master_bit(i) == 0)
            .await;
    }
}

/// Master `i`'s bit in a set of masters (Redlock takes at most 64: [`TOKEN_SCALE`]).
fn master_bit(i: usize) -> u64 {
    u32::try_from(i)
        .ok()
        .and_then(|i| 1u64.checked_shl(i))
        .unwrap_or(0)
}

/// The answers of [`gather`], a master not awaited counted as timed out.
fn settled<T>(
    shared: &BackendState,
    answers: Vec<Option<std::result::Result<T, RedisError>>>,
) -> Vec<std::result::Result<T, RedisError>> {
    answers
        .into_iter()
        .zip(&shared.nodes)
        .map(|(a, n)| a.unwrap_or_else(|| Err(RedisError::timeout(&n.addr))))
        .collect()
}

/// The acquisition of a round whose masters `tokens` (a majority) granted it: the token
/// comes from their largest counter ([`TOKEN_SCALE`]), and their lower counters are raised
/// to it, so that any later majority (which shares a master with this one) continues above
/// it.
pub(crate) async fn acquired(
    attempt: &RedisAttempt,
    tokens: &[(&Node, u64)],
    timeout: Duration,
    unsettled: Option<Unsettled>,
) -> Acquired {
    let shared = &attempt.shared;
    let max = tokens.iter().map(|(_, t)| *t).max().unwrap_or(0);
    let index = tokens
        .iter()
        .find(|(_, t)| *t == max)
        .and_then(|(node, _)| shared.nodes.iter().position(|n| std::ptr::eq(n, *node)))
        .unwrap_or(0);
    if tokens.iter().any(|(_, t)| *t != max) {
        let keep = attempt.request.ttl + shared.config.forget_after;
        join_all(
            tokens
                .iter()
                .filter(|(_, t)| *t != max)
                .map(|(n, _)| within(n, timeout, n.raise_fence(&attempt.keys, max, keep))),
        )
        .await;
    }
    Acquired::new(
        attempt.lease(unsettled),
        FencingToken::new(token_of(max, index)),
    )
}

/// The masters among `answers` (index, answer) that answered busy: the attempt is queued
/// there.
fn busy<'a>(
    answers: impl IntoIterator<Item = (usize, &'a std::result::Result<Answer, RedisError>)>,
) -> Vec<usize> {
    answers
        .into_iter()
        .filter(|(_, a)| matches!(a, Ok(Answer::Busy(..))))
        .map(|(i, _)| i)
        .collect()
}

/// An acquired attempt leaving the queues of masters outside its majority, in the background
/// ([`ReleaseMode::Leave`]: a reservation there is given up, a hold one of them handed it
/// since is kept, and the lease's renewals and release reach it). Its place there would
/// otherwise stay until its release, and a reader's place at the head of a queue, ahead of a
/// writer, made the release that freed that master wake nobody: the writer slept to its
/// backoff's maximum (250 ms, the RW mix's p99 on three masters).
#[derive(Clone)]
pub(crate) struct Leave {
    shared: Arc<BackendState>,
    keys: Arc<LockKeys>,
    owner: Arc<str>,
    kind: LockKind,
    hand_over: Option<Duration>,
}

impl Leave {
    /// `None` for a try (never queued: nothing to leave).
    pub(crate) fn of(attempt: &RedisAttempt) -> Option<Self> {
        (attempt.request.mode == AttemptMode::Wait).then(|| Self {
            shared: attempt.shared.clone(),
            keys: attempt.keys.clone(),
            owner: attempt.request.owner.clone(),
            kind: attempt.request.kind,
            hand_over: attempt.shared.config.hand_over_lease(attempt.request.ttl),
        })
    }

    /// Leaves the queues of the masters `masters` (indices), each bounded by the clean-up
    /// timeout; failures are ignored (the place then lasts until the release, or the waiter
    /// timeout).
    async fn run(self, masters: Vec<usize>) {
        let timeout = self.shared.cleanup_timeout();
        let leave = masters
            .iter()
            .filter_map(|i| self.shared.nodes.get(*i))
            .map(|n| {
                within(
                    n,
                    timeout,
                    n.release(
                        &self.keys,
                        &self.owner,
                        &self.shared.config,
                        ReleaseMode::Leave,
                        self.kind,
                        self.hand_over,
                    ),
                )
            });
        join_all(leave).await;
    }

    /// [`Self::run`] in a spawned task (nothing when `masters` is empty or no runtime runs).
    pub(crate) fn spawn(self, masters: Vec<usize>) {
        if !masters.is_empty()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(self.run(masters));
        }
    }
}

/// After a failed round: releases wherever the lock may have been taken (also where the
/// answer was lost), so that the next round starts clean.
async fn retreat(
    attempt: &RedisAttempt,
    answers: &[std::result::Result<Answer, RedisError>],
    timeout: Duration,
) {
    let shared = &attempt.shared;
    join_all(
        shared
            .nodes
            .iter()
            .zip(answers)
            .filter(|(_, a)| !matches!(a, Ok(Answer::Busy(..))))
            .map(|(n, _)| {
                within(
                    n,
                    timeout,
                    n.release(
                        &attempt.keys,
                        &attempt.request.owner,
                        &shared.config,
                        ReleaseMode::Retreat,
                        attempt.request.kind,
                        None,
                    ),
                )
            }),
    )
    .await;
}

/// What the masters answered to one acquisition round.
struct Tally<'a> {
    /// Every master's answer, for [`Error::QuorumNotReached`].
    outcomes: Vec<NodeOutcome>,
    /// The masters that granted the lock, with their counters.
    tokens: Vec<(&'a Node, u64)>,
    /// The remaining leases (ms) reported by masters where somebody else holds it.
    busy: Vec<i64>,
    /// The first error that retrying will not heal (a misconfigured server).
    hard_failure: Option<RedisErrorKind>,
    /// A master where the name is held as a kind the request can never join.
    mismatch: Option<LockKind>,
}

impl<'a> Tally<'a> {
    fn of(shared: &'a BackendState, answers: &[std::result::Result<Answer, RedisError>]) -> Self {
        let mut tally = Tally {
            outcomes: Vec::with_capacity(answers.len()),
            tokens: Vec::new(),
            busy: Vec::new(),
            hard_failure: None,
            mismatch: None,
        };
        for (node, answer) in shared.nodes.iter().zip(answers) {
            let result = match answer {
                Ok(Answer::Acquired(token)) => {
                    tally.tokens.push((node, *token));
                    NodeResult::Acquired
                }
                Ok(Answer::Busy(ms, _)) => {
                    tally.busy.push(*ms);
                    NodeResult::HeldByAnother
                }
                Ok(Answer::Mismatch(held)) => {
                    tally.mismatch = Some(*held);
                    NodeResult::HeldByAnother
                }
                Err(err) if err.kind == RedisErrorKind::Timeout => NodeResult::TimedOut,
                Err(err) => {
                    if !err.is_transient() && tally.hard_failure.is_none() {
                        tally.hard_failure = Some(err.kind);
                    }
                    NodeResult::Failed(err.summary())
                }
            };
            tally.outcomes.push(NodeOutcome {
                node: node.addr.clone(),
                result,
            });
        }
        tally
    }
}

/// The majority rule of renewals, releases and forced releases, given how many masters
/// `agreed` (renewed, released, held for one owner) and how many gave no answer (`unknown`):
/// `Some(true)` when those that agreed are a majority, `Some(false)` when not even the unknown
/// ones could have made one up, `None` when too few answered to tell.
fn majority(agreed: usize, unknown: usize, quorum: usize) -> Option<bool> {
    if agreed >= quorum {
        Some(true)
    } else if agreed + unknown < quorum {
        Some(false)
    } else {
        None
    }
}

/// Renews on every master; renewed iff a majority did within the validity (returned as soon as
/// one did, see [`gather`]). Fewer than a majority that could still renew: not held; otherwise
/// (too slow, too many failures) unavailable, and the core retries until the local deadline.
pub(crate) async fn renew(lease: &RedisLease, ttl: Duration) -> Result<()> {
    let shared = &lease.shared;
    let started = Instant::now();
    let timeout = shared.node_timeout(ttl);
    let quorum = shared.quorum();
    let results = on_masters(lease, timeout, LeaseOp::Renew(ttl)).await;
    let renewed = results.iter().filter(|r| matches!(r, Ok(true))).count();
    let failed = results.iter().filter(|r| r.is_err()).count();
    match majority(renewed, failed, quorum) {
        Some(true) if started.elapsed() + shared.client.drift(ttl) < ttl => return Ok(()),
        Some(false) => return Err(Error::not_held(&lease.name)),
        _ => {}
    }
    Err(Error::Unavailable {
        message: format!(
            "renewal of {:?} reached {renewed} of {} nodes ({quorum} needed) within the validity",
            lease.name.as_str(),
            shared.nodes.len()
        ),
        source: results
            .into_iter()
            .find_map(Result::err)
            .map(|e| Box::new(e) as distlock_core::BoxError),
    })
}

/// Renews a batch (see `renew.rs`): the batch script on every master at once, then each
/// lock by the rule of [`renew`](fn@renew): renewed iff a majority renewed it within its validity; not
/// held when fewer than a majority could still renew it; otherwise unavailable (retried).
/// `Err` when no master answered at all.
pub(crate) async fn renew_many(
    shared: &BackendState,
    batch: &Batch<'_>,
) -> Result<Vec<Result<()>>> {
    let shortest = batch.iter().map(|(_, ttl)| *ttl).min().unwrap_or_default();
    let timeout = shared.node_timeout(shortest);
    let started = Instant::now();
    let answers = join_all(
        shared
            .nodes
            .iter()
            .map(|n| within(n, timeout, renew::on_master(n, batch))),
    )
    .await;
    let elapsed = started.elapsed();
    if answers.iter().all(Result::is_err) {
        let first = answers.into_iter().find_map(Result::err);
        return Err(Error::Unavailable {
            message: format!(
                "batched renewal of {} locks reached none of the {} Redis masters",
                batch.len(),
                shared.nodes.len()
            ),
            source: first.map(|e| Box::new(e) as distlock_core::BoxError),
        });
    }
    let quorum = shared.quorum();
    Ok(batch
        .iter()
        .enumerate()
        .map(|(i, (lease, ttl))| {
            // This lock's answer on each master (a master that failed as a whole: its error).
            let mut renewed = 0;
            let mut failed = None;
            let mut failures = 0;
            for answer in &answers {
                match answer.as_ref().map(|a| a.get(i)) {
                    Ok(Some(Ok(true))) => renewed += 1,
                    Ok(Some(Ok(false))) => {}
                    Ok(Some(Err(err))) | Err(err) => {
                        failures += 1;
                        failed.get_or_insert(err);
                    }
                    Ok(None) => failures += 1,
                }
            }
            match majority(renewed, failures, quorum) {
                Some(true) if elapsed + shared.client.drift(*ttl) < *ttl => return Ok(()),
                Some(false) => return Err(Error::not_held(&lease.name)),
                _ => {}
            }
            Err(Error::Unavailable {
                message: format!(
                    "renewal of {:?} reached {renewed} of {} nodes ({quorum} needed) within the \
                     validity",
                    lease.name.as_str(),
                    shared.nodes.len()
                ),
                source: failed.map(|e| Box::new(renew::copy(e)) as distlock_core::BoxError),
            })
        })
        .collect())
}

/// What [`on_masters`] asks of every master.
#[derive(Clone, Copy)]
enum LeaseOp {
    /// An owner-checked renewal for this long.
    Renew(Duration),
    /// An owner-checked release.
    Release,
}

/// `op` of `lease` on every master at once, each bounded by `timeout`: every master's answer,
/// or as soon as a majority answered `true` ([`gather`]; a master not awaited counts as timed
/// out, its request finishes in the background).
async fn on_masters(
    lease: &RedisLease,
    timeout: Duration,
    op: LeaseOp,
) -> Vec<std::result::Result<bool, RedisError>> {
    let shared = &lease.shared;
    let hand_over = shared.config.hand_over_lease(lease.ttl);
    let round = Arc::new((
        shared.clone(),
        lease.keys(),
        lease.owner.clone(),
        lease.kind,
    ));
    let answers = gather(
        shared.nodes.len(),
        shared.quorum(),
        |i| {
            // A release where the acquisition's own request still runs goes after it (see
            // `Unsettled`), not counting that wait against its timeout, and from a task of its
            // own: a release cancelled meanwhile (its caller's timeout, a dropped future)
            // still reaches that master.
            let after = match op {
                LeaseOp::Release => lease.unsettled.as_ref().filter(|u| u.running(i)).cloned(),
                LeaseOp::Renew(_) => None,
            };
            let addr = after.as_ref().map(|_| shared.nodes[i].addr.clone());
            let round = round.clone();
            let request = async move {
                if let Some(after) = after {
                    after.settled(i).await;
                }
                let (shared, keys, owner, kind) = &*round;
                let n = &shared.nodes[i];
                let request = async {
                    match op {
                        LeaseOp::Renew(ttl) => n.renew(keys, owner, ttl, *kind).await,
                        LeaseOp::Release => {
                            let mode = ReleaseMode::Release;
                            n.release(keys, owner, &shared.config, mode, *kind, hand_over)
                                .await
                        }
                    }
                };
                within(n, timeout, request).await
            };
            async move {
                match addr {
                    // A task that panicked or a runtime shutting down: no answer.
                    Some(addr) => tokio::spawn(request)
                        .await
                        .unwrap_or_else(|_| Err(RedisError::timeout(&addr))),
                    None => request.await,
                }
            }
        },
        |r| matches!(r, Ok(true)),
    )
    .await;
    settled(shared, answers.settle())
}

/// Releases on every master (also those that seemed to fail); released iff a majority held
/// it, as a renewal is renewed ([`renew`](fn@renew)). Returns once a majority released it (the
/// rest finish in the background; see [`gather`]). Fewer than a majority that could have held
/// it: not held, though it is removed from the masters that did (a late acquisition's write
/// that landed after the lock was lost, a master that missed a forced release): the lock was
/// not the caller's to the end, whatever a minority still showed. Otherwise (too many masters
/// failed to answer) the first failure: whether it was still held is not known.
pub(crate) async fn release(lease: &RedisLease) -> Result<()> {
    let shared = &lease.shared;
    let timeout = shared.cleanup_timeout();
    let quorum = shared.quorum();
    let results = on_masters(lease, timeout, LeaseOp::Release).await;
    let released = results.iter().filter(|r| matches!(r, Ok(true))).count();
    let failed = results.iter().filter(|r| r.is_err()).count();
    match (
        majority(released, failed, quorum),
        results.into_iter().find_map(Result::err),
    ) {
        (Some(true), _) => Ok(()),
        (None, Some(err)) => Err(err.into_lock_error("release")),
        _ => Err(Error::not_held(&lease.name)),
    }
}

/// A shared or permit holder as the masters show it: on how many, its kind, its highest counter
/// with the first master that showed it, its shortest remaining lease (ms).
type SeenHolder = (usize, LockKind, Option<(u64, usize)>, i64);

/// The holder a majority of masters agree on, with the shortest remaining lease of that
/// majority (no token: see [`Node::inspect`](crate::node::Node::inspect)); `None` when no
/// majority agrees. Shared holders: those that hold on a majority, described by the one with
/// the highest token (made as the acquisition made it: [`TOKEN_SCALE`]).
pub(crate) async fn inspect(shared: &BackendState, keys: &LockKeys) -> Result<Option<LockInfo>> {
    let timeout = shared.client.operation_timeout;
    let answers = join_all(
        shared
            .nodes
            .iter()
            .map(|n| within(n, timeout, n.inspect(keys))),
    )
    .await;
    let mut held = Vec::new();
    // Shared or permit holders: owner -> (masters, kind, highest counter with the first master
    // that showed it, shortest remaining).
    let mut holds: HashMap<String, SeenHolder> = HashMap::new();
    for (index, answer) in answers.into_iter().enumerate() {
        let Ok(answer) = answer else { continue };
        match answer {
            Holding::Free => {}
            Holding::Exclusive { owner, pttl, .. } => held.push((owner, pttl)),
            Holding::Holds { kind, holders } => {
                for h in holders {
                    let seen = holds.entry(h.owner).or_insert((0, kind, None, i64::MAX));
                    seen.0 += 1;
                    // Masters in URL order: the first to show the highest counter names it.
                    if let Some(counter) = h.token
                        && seen.2.is_none_or(|(top, _)| counter > top)
                    {
                        seen.2 = Some((counter, index));
                    }
                    seen.3 = seen.3.min(h.remaining);
                }
            }
        }
    }
    let live: Vec<_> = holds
        .into_iter()
        .filter(|(_, seen)| seen.0 >= shared.quorum())
        .collect();
    if let Some((owner, (_, kind, token, ms))) = live.iter().max_by_key(|(_, seen)| seen.2) {
        let count = u32::try_from(live.len()).unwrap_or(u32::MAX);
        return Ok(Some(
            LockInfo::new(
                owner.clone(),
                token.map(|(counter, index)| FencingToken::new(token_of(counter, index))),
                remaining(*ms),
            )
            .with_holders(*kind, count),
        ));
    }
    for (owner, _) in &held {
        let same: Vec<_> = held.iter().filter(|(o, _)| o == owner).collect();
        if same.len() >= shared.quorum() {
            let pttl = same.iter().map(|(_, p)| *p).min().unwrap_or(-1);
            return Ok(Some(LockInfo::new(owner.clone(), None, remaining(pttl))));
        }
    }
    Ok(None)
}

/// Force release on every master; `true` if a majority of them held it for one owner, `false`
/// if no owner could have held a majority (a copy on fewer, left by an acquisition that failed
/// or a lock lost, was no lock: removed, but nobody held it). Fails when the masters that did
/// not answer could have made up a majority with those that showed one owner (the others free
/// it at expiry), as a release does.
pub(crate) async fn force_release(
    shared: &BackendState,
    keys: &LockKeys,
    name: &LockName,
) -> Result<bool> {
    let timeout = shared.cleanup_timeout();
    let results = join_all(
        shared
            .nodes
            .iter()
            .map(|n| within(n, timeout, n.force_release(keys, &shared.config))),
    )
    .await;
    let answered = results.iter().filter(|r| r.is_ok()).count();
    let mut masters: HashMap<&str, usize> = HashMap::new();
    for owner in results.iter().flatten().flatten() {
        *masters.entry(owner.as_str()).or_default() += 1;
    }
    let most = masters.values().copied().max().unwrap_or(0);
    if let Some(held) = majority(most, results.len() - answered, shared.quorum()) {
        return Ok(held);
    }
    Err(Error::Unavailable {
        message: format!(
            "force release of {:?} reached {answered} of {} Redis masters, too few to tell \
             whether a majority ({}) held it",
            name.as_str(),
            shared.nodes.len(),
            shared.quorum()
        ),
        source: results
            .into_iter()
            .find_map(Result::err)
            .map(|e| Box::new(e) as distlock_core::BoxError),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A round settled by a majority leaves the late master's request running; `Unsettled`
    /// answers for the masters that had answered at once, and for the late one only once its
    /// request finished.
    #[tokio::test]
    async fn unsettled_waits_for_the_requests_still_running() {
        let (finish, finished) = tokio::sync::oneshot::channel::<()>();
        let finished = std::sync::Mutex::new(Some(finished));
        let gathered = gather(
            3,
            2,
            |i| {
                let late = (i == 1).then(|| finished.lock().unwrap().take()).flatten();
                async move {
                    if let Some(late) = late {
                        let _ = late.await;
                    }
                    i
                }
            },
            |_| true,
        )
        .await;
        let (answers, unsettled) = gathered.settle_with(|_| Box::pin(async {}));
        assert_eq!(answers, vec![Some(0), None, Some(2)]);
        let unsettled = unsettled.expect("master 1 still running");
        assert_eq!(
            (0..3).map(|i| unsettled.running(i)).collect::<Vec<_>>(),
            [false, true, false]
        );
        let soon = Duration::from_millis(50);
        for i in [0, 2] {
            tokio::time::timeout(soon, unsettled.settled(i))
                .await
                .unwrap_or_else(|_| panic!("master {i} had answered"));
        }
        assert!(
            tokio::time::timeout(soon, unsettled.settled(1))
                .await
                .is_err(),
            "master 1's request is still running"
        );
        finish.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(5), unsettled.settled(1))
            .await
            .expect("master 1's request finished");
        assert!(!unsettled.running(1));
        let (answers, unsettled) = gather(3, 3, |i| async move { i }, |_| true)
            .await
            .settle_with(|_| Box::pin(async {}));
        assert_eq!(answers, vec![Some(0), Some(1), Some(2)]);
        assert!(unsettled.is_none(), "nothing was left running");
    }
}
