//! One acquisition: the fast path, the scripts, the waiter queue and handoff on one master;
//! a Redlock round is in `redlock.rs`.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use distlock_core::{
    AcquireRequest, Acquired, Attempt, AttemptMode, Error, FencingToken, Lease, LockKind, Result,
    Step,
};
use futures::future::join_all;

use crate::backend::BackendState;
use crate::keys::LockKeys;
use crate::lease::RedisLease;
use crate::node::{Answer, Node, ReleaseMode, millis, within};
use crate::redlock;
use crate::scripts::HANDED_OVER;
use crate::wake::Subscription;

/// Redlock: how long a waiter that one master handed the lock over to waits for the other
/// masters' hand-overs of the same release (sent at once, so due within a round trip of each
/// other) before it polls (at most the node timeout). A master whose queue differs (a waiter
/// whose poll reached it and not the others yet) hands over to a waiter the others do not:
/// that waiter polls after this and finds its hold there, instead of blocking for the node
/// timeout (a tenth of the ttl) with a hold the others wait behind.
const HAND_OVER_GRACE: Duration = Duration::from_millis(5);

/// How long after a failed abandon it is tried again ([`RedisAttempt::abandon_later`]): a
/// connection that broke reconnects first.
const ABANDON_AGAIN_AFTER: Duration = Duration::from_millis(100);

pub(crate) fn remaining(pttl: i64) -> Option<Duration> {
    u64::try_from(pttl).ok().map(Duration::from_millis)
}

pub(crate) struct RedisAttempt {
    pub(crate) shared: Arc<BackendState>,
    pub(crate) keys: Arc<LockKeys>,
    pub(crate) request: AcquireRequest,
    pub(crate) score: String,
    /// One per node, created at the first busy answer of a waiting attempt (or before its
    /// first poll, when its channel is still subscribed: see [`crate::wake::Subscriber::listening`]).
    pub(crate) subs: Vec<Subscription>,
    /// A `try_acquire` whose last poll was answered "busy" by every node: it left nothing
    /// on the server, so abandoning it costs no round trip.
    pub(crate) settled: bool,
    /// Whether a poll ran already: only the first one may take the fast path, later ones know
    /// the lock is contended and go straight to the script (which queues the waiter).
    pub(crate) polled: bool,
    /// Per node (empty until the first answer that says), what its answer to the last poll
    /// showed of the fencing counter: when that poll was sent, and the counter (a busy
    /// answer's, or the token of a grant a failed Redlock round gave back); `None` when that
    /// answer did not come or showed no counter. A release that hands the lock over on that
    /// node ran after that poll (had it run before, the poll would have found the lock this
    /// attempt's own and said so), so the lease it hands over started after the send, and
    /// its token is above the counter.
    pub(crate) seen: Vec<Option<(Instant, u64)>>,
    /// Per node (empty until the first), the token of a hand-over received since the last
    /// poll ([`Attempt::changed`]); a majority of them is the lock, for the next poll.
    pub(crate) handed: Vec<Option<u64>>,
}

impl RedisAttempt {
    /// The lease of this attempt's acquisition; Redlock: with the masters whose requests of
    /// the round that acquired it were still running ([`redlock::Unsettled`]).
    pub(crate) fn lease(&self, unsettled: Option<redlock::Unsettled>) -> Box<dyn Lease> {
        Box::new(RedisLease {
            shared: self.shared.clone(),
            lock: self.keys.lock.clone(),
            owner: self.request.owner.clone(),
            name: self.request.name.clone(),
            kind: self.request.kind,
            ttl: self.request.ttl,
            has_data: AtomicBool::new(false),
            cluster_watch: self
                .shared
                .nodes
                .first()
                .and_then(|node| node.cluster_topology())
                .and_then(|topology| topology.confirmed_watch_for(&self.keys.lock)),
            unsettled,
        })
    }

    /// The typed error for a name held as `held`, which this request can never join.
    pub(crate) fn mismatch(&self, held: distlock_core::LockKind) -> Error {
        Error::Mismatch {
            name: self.request.name.to_string(),
            message: self.request.kind.mismatch(held).unwrap_or_else(|| {
                format!("it is held as {held}, asked for as {}", self.request.kind)
            }),
        }
    }

    /// A waiting attempt starts listening at its first busy answer (not before: the
    /// uncontended path costs no subscription).
    pub(crate) fn busy(&mut self, retry_ms: Option<i64>) -> Step {
        let known = retry_ms
            .and_then(|ms| u64::try_from(ms).ok())
            .map(Duration::from_millis);
        if self.request.mode == AttemptMode::Try {
            return Step::busy(known);
        }
        if self.subs.is_empty() {
            self.subs = self
                .shared
                .nodes
                .iter()
                .map(|n| n.sub.subscribe(&self.keys.channel))
                .collect();
        }
        // Poll at least every third of the waiter timeout, to stay in the queue.
        let refresh = self.shared.refresh(self.request.ttl);
        Step::busy(Some(known.map_or(refresh, |k| k.min(refresh))))
    }

    /// Before a waiting attempt's first poll: listens on its channel if every node's is still
    /// subscribed from an earlier wait of this client, so that a busy answer needs neither a
    /// subscription nor a poll after it, and no release between the poll and the first wait
    /// goes unheard (a subscription made after the poll, on a channel already subscribed, is
    /// active at once and misses it: the waiter slept to its backoff's maximum). Otherwise
    /// [`Self::busy`] subscribes, and the new subscription costs a poll more.
    pub(crate) fn listen_early(&mut self) {
        if self.polled || self.request.mode != AttemptMode::Wait || !self.subs.is_empty() {
            return;
        }
        let channel = &self.keys.channel;
        let subs: Vec<Subscription> = self
            .shared
            .nodes
            .iter()
            .map_while(|n| n.sub.listening(channel))
            .collect();
        if subs.len() == self.shared.nodes.len() {
            self.subs = subs;
        }
    }

    /// Notes what node `node`'s answer to the poll sent at `sent` showed of its counter (see
    /// [`Self::seen`]).
    pub(crate) fn saw(&mut self, node: usize, sent: Instant, counter: u64) {
        if self.seen.is_empty() {
            self.seen = vec![None; self.shared.nodes.len()];
        }
        if let Some(seen) = self.seen.get_mut(node) {
            *seen = Some((sent, counter));
        }
    }

    /// The token of a hand-over message `wake` from node `node` addressed to this attempt
    /// that it may count on (see [`scripts::RELEASE`](crate::scripts::RELEASE)): a
    /// configuration that hands over, the lease this attempt asked for, and a token above
    /// the counter that node's last answer showed (a message sent before that poll ran, for
    /// a hand-over lost since, e.g. to a forced release, carries a token at most that
    /// counter). `None`: poll, which finds the lock this attempt's own if it was handed over.
    fn hand_over(&self, node: usize, wake: &[u8]) -> Option<u64> {
        let (_, counter) = self.seen.get(node).copied().flatten()?;
        self.shared.config.hand_over_lease(self.request.ttl)?;
        let handed = handed_over(wake, self.request.owner.as_bytes())?;
        let permits = match self.request.kind {
            LockKind::Permit { permits } => Some(permits),
            _ => None,
        };
        (handed.lease == millis(self.request.ttl)
            && handed.permits == permits
            && handed.token > counter)
            .then_some(handed.token)
    }

    /// The hand-overs received since the last poll, if a majority of the nodes handed the
    /// lock over: `(node, token)`, with the earliest send of the polls before them (the
    /// lease's start). Clears them: a poll supersedes them otherwise.
    fn handed_majority(&mut self) -> Option<(Vec<(usize, u64)>, Instant)> {
        let handed: Vec<(usize, u64)> = std::mem::take(&mut self.handed)
            .into_iter()
            .enumerate()
            .filter_map(|(i, token)| Some((i, token?)))
            .collect();
        if handed.len() < self.shared.quorum() {
            return None;
        }
        let started = handed
            .iter()
            .filter_map(|(i, _)| self.seen.get(*i).copied().flatten())
            .map(|(sent, _)| sent)
            .min()?;
        Some((handed, started))
    }

    /// The lock, handed over by a majority of the nodes (see [`Self::handed_majority`]): no
    /// acquire round trip (Redlock: the majority's lower counters raised, as after a round).
    async fn take_handed(&mut self) -> Option<Acquired> {
        let (handed, started) = self.handed_majority()?;
        let acquired = if self.shared.redlock() {
            let shared = self.shared.clone();
            let tokens: Vec<(&Node, u64)> = handed
                .iter()
                .map(|(i, token)| (&shared.nodes[*i], *token))
                .collect();
            let timeout = shared.node_timeout(self.request.ttl);
            // Still queued where it was busy at its last poll (or handed a hold since).
            let queued: Vec<usize> = (0..shared.nodes.len())
                .filter(|i| !handed.iter().any(|(h, _)| h == i))
                .collect();
            if let Some(leave) = redlock::Leave::of(self) {
                leave.spawn(queued);
            }
            redlock::acquired(self, &tokens, timeout, None).await
        } else {
            Acquired::new(self.lease(None), FencingToken::new(handed[0].1))
        };
        Some(acquired.with_lease_started(started))
    }

    /// Whether this poll may try the fast path: only the first one, and never in
    /// fair mode (which must look at the queue even when the lock key is free).
    pub(crate) fn fast(&self) -> bool {
        !self.shared.config.fair && !self.polled
    }

    async fn poll_single(&mut self) -> Result<Step> {
        self.listen_early();
        let node = &self.shared.nodes[0];
        let sent = Instant::now();
        let answer = node
            .acquire(
                &self.keys,
                &self.request,
                &self.shared.config,
                &self.score,
                self.fast(),
            )
            .await
            .map_err(|e| e.into_lock_error("acquire"))?;
        Ok(match answer {
            Answer::Acquired(token) => {
                Step::Acquired(Acquired::new(self.lease(None), FencingToken::new(token)))
            }
            Answer::Busy(ms, counter) => {
                if let Some(counter) = counter {
                    self.saw(0, sent, counter);
                }
                self.busy(Some(ms))
            }
            Answer::Mismatch(held) => return Err(self.mismatch(held)),
        })
    }
}

#[async_trait]
impl Attempt for RedisAttempt {
    async fn poll(&mut self) -> Result<Step> {
        self.settled = false;
        if let Some(acquired) = self.take_handed().await {
            return Ok(Step::Acquired(acquired));
        }
        // Only this poll's answers count from now on: a node whose answer does not come (an
        // error, a timeout, this poll cancelled) may have run it after a hand-over and then
        // lost that, or retreated from it, so a message from it makes the attempt poll.
        self.seen.iter_mut().for_each(|seen| *seen = None);
        let step = if self.shared.redlock() {
            redlock::acquire(self).await
        } else {
            self.poll_single().await
        };
        self.polled = true;
        if let Ok(Step::Busy { .. }) = &step
            && self.request.mode == AttemptMode::Try
            && !self.shared.redlock()
        {
            self.settled = true;
        }
        step
    }

    async fn changed(&mut self) {
        if self.subs.is_empty() {
            return std::future::pending().await;
        }
        // Subscriptions not active yet (first wait, or the subscriber connection broke):
        // activate them and return at once, so that the core polls again with the
        // subscription in place and no release between the last poll and now is missed.
        let inactive: Vec<&Subscription> = self.subs.iter().filter(|s| !s.is_active()).collect();
        if !inactive.is_empty() {
            let results = join_all(inactive.iter().map(|s| s.ensure())).await;
            if results.iter().any(Result::is_ok) {
                return;
            }
            tracing::debug!("cannot subscribe to release events; waiting on timers");
            if self.subs.iter().all(|s| !s.is_active()) {
                return std::future::pending().await;
            }
        }
        // Redlock: once one master handed the lock over, the others' hand-overs of the same
        // release are awaited for [`HAND_OVER_GRACE`] at most; then the poll decides.
        let mut grace = None;
        loop {
            let wakes = self.subs.iter_mut().map(|s| Box::pin(s.next()));
            let next = futures::future::select_all(wakes);
            let (wake, node, _) = match grace {
                None => next.await,
                Some(deadline) => match tokio::time::timeout_at(deadline, next).await {
                    Ok(woken) => woken,
                    Err(_) => return,
                },
            };
            // Targeted at other waiters: those are served next, keep waiting.
            if !addressed_to(&wake, self.request.owner.as_bytes()) {
                continue;
            }
            let Some(token) = self.hand_over(node, &wake) else {
                return;
            };
            if self.handed.is_empty() {
                self.handed = vec![None; self.shared.nodes.len()];
            }
            if let Some(handed) = self.handed.get_mut(node) {
                *handed = Some(token);
            }
            if self.handed.iter().flatten().count() >= self.shared.quorum() {
                return;
            }
            let wait = self
                .shared
                .node_timeout(self.request.ttl)
                .min(HAND_OVER_GRACE);
            grace.get_or_insert_with(|| tokio::time::Instant::now() + wait);
        }
    }

    async fn abandon(self: Box<Self>) -> Result<()> {
        if self.settled {
            return Ok(());
        }
        let shared = &self.shared;
        let timeout = shared.cleanup_timeout();
        // The lock may have been handed over to this attempt meanwhile: handed on in turn.
        let hand_over = shared.config.hand_over_lease(self.request.ttl);
        let results = join_all(shared.nodes.iter().map(|n| {
            within(
                n,
                timeout,
                n.release(
                    &self.keys,
                    &self.request.owner,
                    &shared.config,
                    ReleaseMode::Abandon,
                    self.request.kind,
                    hand_over,
                ),
            )
        }))
        .await;
        let mut first = None;
        for (node, result) in results.into_iter().enumerate() {
            if let Err(err) = result {
                // Its queue entry (or a hold handed to it meanwhile) would stay, ahead of
                // every later acquisition, until the waiter timeout or the handed lease ends:
                // tried again in the background (a unique owner: it frees nothing else), if
                // the failure may pass.
                if err.is_transient() {
                    self.abandon_later(node, hand_over);
                }
                first.get_or_insert(err);
            }
        }
        match first {
            Some(err) => Err(err.into_lock_error("abandon")),
            None => Ok(()),
        }
    }
}

impl RedisAttempt {
    /// [`Attempt::abandon`] on `node` once more, in the background until it is answered.
    fn abandon_later(&self, node: usize, hand_over: Option<Duration>) {
        let (shared, keys) = (self.shared.clone(), self.keys.clone());
        let (owner, kind) = (self.request.owner.clone(), self.request.kind);
        let start = Instant::now() + ABANDON_AGAIN_AFTER;
        distlock_core::backend::spawn_cleanup(
            "abandoning a Redis attempt",
            Some(start),
            move || {
                let (shared, keys, owner) = (shared.clone(), keys.clone(), owner.clone());
                async move {
                    let Some(n) = shared.nodes.get(node) else {
                        return Ok(());
                    };
                    let release = n.release(
                        &keys,
                        &owner,
                        &shared.config,
                        ReleaseMode::Abandon,
                        kind,
                        hand_over,
                    );
                    within(n, shared.cleanup_timeout(), release)
                        .await
                        .map(|_| ())
                        .map_err(|err| err.into_lock_error("abandon"))
                }
            },
        );
    }
}

/// Whether a release message wakes the waiter `owner`: an empty message wakes everybody, an
/// owner value that one waiter, and a message starting with NUL the NUL-separated owners in it
/// (the readers or permit waiters that a release unblocked at once).
pub(crate) fn addressed_to(wake: &[u8], owner: &[u8]) -> bool {
    match wake.strip_prefix(b"\0") {
        None => wake.is_empty() || wake == owner,
        Some(list) => list.split(|b| *b == 0).any(|o| o == owner),
    }
}

/// What a hand-over message gives one waiter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Handed {
    pub(crate) token: u64,
    /// The lease, ms.
    pub(crate) lease: u64,
    /// The kind handed over: the permits of the semaphore a permit is of, `None` for the
    /// lock or a shared hold (the queue member the release took tells those apart).
    pub(crate) permits: Option<u32>,
}

/// A hand-over message addressed to `owner`. Format: [`HANDED_OVER`] + lease ms (then, for
/// permits, `/` and the semaphore's permits) + `:` + tokens (comma-separated) + NUL + owners
/// (NUL-separated, one per token).
pub(crate) fn handed_over(wake: &[u8], owner: &[u8]) -> Option<Handed> {
    let mut parts = wake.strip_prefix(HANDED_OVER)?.split(|b| *b == 0);
    let head = std::str::from_utf8(parts.next()?).ok()?;
    let place = parts.position(|o| o == owner)?;
    let (lease, tokens) = head.split_once(':')?;
    let token = tokens.split(',').nth(place)?.parse().ok()?;
    let (lease, permits) = match lease.split_once('/') {
        Some((lease, permits)) => (lease, Some(permits.parse().ok()?)),
        None => (lease, None),
    };
    Some(Handed {
        token,
        lease: lease.parse().ok()?,
        permits,
    })
}

#[cfg(test)]
mod tests {
    use super::{Handed, addressed_to, handed_over};

    #[test]
    fn wake_ups_reach_only_their_addressees() {
        assert!(addressed_to(b"", b"a"));
        assert!(addressed_to(b"a", b"a"));
        assert!(!addressed_to(b"ab", b"a"));
        assert!(addressed_to(b"\0b\0a", b"a"));
        assert!(addressed_to(b"\0a", b"a"));
        assert!(!addressed_to(b"\0ab\0b", b"a"));
        assert!(!addressed_to(b"\0", b"a"));
        // A hand-over: addressed to its owner alone, old clients included.
        assert!(addressed_to(b"\0\x013000:42\0a", b"a"));
        assert!(!addressed_to(b"\0\x013000:42\0a", b"b"));
        assert!(addressed_to(b"\0\x013000:42,43\0b\0a", b"a"));
    }

    #[test]
    fn hand_over_messages_parse_for_their_owner_only() {
        let token = 1_790_000_000_000_123_u64;
        let handed = |token, lease, permits| {
            Some(Handed {
                token,
                lease,
                permits,
            })
        };
        let wake = format!("\0\x013000:{token}\0own-er");
        assert_eq!(
            handed_over(wake.as_bytes(), b"own-er"),
            handed(token, 3000, None)
        );
        assert_eq!(handed_over(wake.as_bytes(), b"own"), None);
        assert_eq!(handed_over(b"own-er", b"own-er"), None);
        assert_eq!(handed_over(b"\0own-er", b"own-er"), None);
        // Readers: one token each, in the owners' order.
        let readers = b"\0\x012000:7,9,11\0r1\0r2\0r3";
        assert_eq!(handed_over(readers, b"r2"), handed(9, 2000, None));
        assert_eq!(handed_over(readers, b"r3"), handed(11, 2000, None));
        assert_eq!(handed_over(readers, b"r4"), None);
        // Permits of a semaphore of 3.
        let permits = b"\0\x012000/3:7,9\0p1\0p2";
        assert_eq!(handed_over(permits, b"p2"), handed(9, 2000, Some(3)));
        for bad in [
            "\0\x0142\0a",
            "\0\x011:\0a",
            "\0\x011:1.7e+15\0a",
            "\0\x011:1a",
            "\0\x011:5\0b\0a",
            "\0\x011/:5\0a",
            "\0\x011/x:5\0a",
            "\0\x01/3:5\0a",
        ] {
            assert_eq!(handed_over(bad.as_bytes(), b"a"), None, "{bad:?}");
        }
    }
}
