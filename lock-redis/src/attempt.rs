//! One acquisition: the fast path, the scripts, the waiter queue and handoff, on one master
//! or a Redlock quorum.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use distlock_core::{
    AcquireRequest, Acquired, Attempt, AttemptMode, Error, FencingToken, Lease, NodeOutcome,
    NodeResult, Result, Step,
};
use futures::future::join_all;

use crate::backend::Shared;
use crate::error::RedisErrorKind;
use crate::keys::LockKeys;
use crate::lease::RedisLease;
use crate::node::{Answer, ReleaseMode, within};
use crate::wake::Subscription;

pub(crate) fn remaining(pttl: i64) -> Option<Duration> {
    u64::try_from(pttl).ok().map(Duration::from_millis)
}

pub(crate) struct RedisAttempt {
    pub(crate) shared: Arc<Shared>,
    pub(crate) keys: Arc<LockKeys>,
    pub(crate) request: AcquireRequest,
    pub(crate) score: String,
    /// One per node, created at the first busy answer of a waiting attempt.
    pub(crate) subs: Vec<Subscription>,
    /// A `try_acquire` whose last poll was answered "busy" by every node: it left nothing
    /// on the server, so abandoning it costs no round trip.
    pub(crate) settled: bool,
    /// Whether a poll ran already: only the first one may take the fast path, later ones know
    /// the lock is contended and go straight to the script (which queues the waiter).
    pub(crate) polled: bool,
}

impl RedisAttempt {
    fn lease(&self) -> Box<dyn Lease> {
        Box::new(RedisLease {
            shared: self.shared.clone(),
            keys: self.keys.clone(),
            owner: self.request.owner.clone(),
            name: self.request.name.clone(),
        })
    }

    /// A waiting attempt starts listening at its first busy answer (not before: the
    /// uncontended path costs no subscription).
    fn busy(&mut self, retry_ms: Option<i64>) -> Step {
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
        let refresh = self.shared.refresh();
        Step::busy(Some(known.map_or(refresh, |k| k.min(refresh))))
    }

    /// Whether this poll may try the script-free fast path: only the first one, and never in
    /// fair mode (which must look at the queue even when the lock key is free).
    fn fast(&self) -> bool {
        !self.shared.config.fair && !self.polled
    }

    async fn poll_single(&mut self) -> Result<Step> {
        let node = &self.shared.nodes[0];
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
                Step::Acquired(Acquired::new(self.lease(), FencingToken::new(token)))
            }
            Answer::Busy(ms) => self.busy(Some(ms)),
        })
    }

    async fn poll_redlock(&mut self) -> Result<Step> {
        let shared = self.shared.clone();
        let ttl = self.request.ttl;
        let timeout = shared.node_timeout(ttl);
        let fast = self.fast();
        let started = Instant::now();
        let answers = join_all(shared.nodes.iter().map(|n| {
            within(
                n,
                timeout,
                n.acquire(&self.keys, &self.request, &shared.config, &self.score, fast),
            )
        }))
        .await;
        let elapsed = started.elapsed();
        let mut outcomes = Vec::with_capacity(answers.len());
        let mut tokens = Vec::new();
        let mut busy = Vec::new();
        let mut hard_failure = None;
        for (node, answer) in shared.nodes.iter().zip(&answers) {
            let result = match answer {
                Ok(Answer::Acquired(token)) => {
                    tokens.push((node, *token));
                    NodeResult::Acquired
                }
                Ok(Answer::Busy(ms)) => {
                    busy.push(*ms);
                    NodeResult::HeldByAnother
                }
                Err(err) if err.kind == RedisErrorKind::Timeout => NodeResult::TimedOut,
                Err(err) => {
                    if !err.is_transient() && hard_failure.is_none() {
                        hard_failure = Some(err.kind);
                    }
                    NodeResult::Failed(err.summary())
                }
            };
            outcomes.push(NodeOutcome {
                node: node.addr.clone(),
                result,
            });
        }
        let quorum = shared.quorum();
        let drift = shared.client.drift(ttl);
        if tokens.len() >= quorum && elapsed + drift < ttl {
            let max = tokens.iter().map(|(_, t)| *t).max().unwrap_or(0);
            if tokens.iter().any(|(_, t)| *t != max) {
                // Bring every node of this majority up to the token handed out, so that any
                // later majority (which shares a node with this one) continues above it.
                join_all(
                    tokens
                        .iter()
                        .filter(|(_, t)| *t != max)
                        .map(|(n, _)| within(n, timeout, n.raise_fence(&self.keys, max))),
                )
                .await;
            }
            return Ok(Step::Acquired(Acquired::new(
                self.lease(),
                FencingToken::new(max),
            )));
        }
        // Failed: release everywhere we may hold it (also where the answer was lost).
        join_all(
            shared
                .nodes
                .iter()
                .zip(&answers)
                .filter(|(_, a)| !matches!(a, Ok(Answer::Busy(_))))
                .map(|(n, _)| {
                    within(
                        n,
                        timeout,
                        n.release(
                            &self.keys,
                            &self.request.owner,
                            &shared.config,
                            ReleaseMode::Retreat,
                        ),
                    )
                }),
        )
        .await;
        if tokens.len() + busy.len() < quorum {
            let error = Error::QuorumNotReached {
                name: self.request.name.to_string(),
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
            return Ok(self.busy(ms));
        }
        // A split vote or too slow: the core retries after a random pause (a waiter
        // subscribes first, as on any busy answer).
        let _subscribed = self.busy(None);
        Ok(Step::Contended)
    }
}

#[async_trait]
impl Attempt for RedisAttempt {
    async fn poll(&mut self) -> Result<Step> {
        self.settled = false;
        let step = if self.shared.redlock() {
            self.poll_redlock().await
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
        let owner = self.request.owner.as_bytes();
        loop {
            let wakes = self.subs.iter_mut().map(|s| Box::pin(s.next()));
            let (wake, _, _) = futures::future::select_all(wakes).await;
            // Targeted at another waiter: that one is served next, keep waiting.
            if wake.is_empty() || &*wake == owner {
                return;
            }
        }
    }

    async fn abandon(self: Box<Self>) -> Result<()> {
        if self.settled {
            return Ok(());
        }
        let shared = &self.shared;
        let timeout = shared.cleanup_timeout();
        let results = join_all(shared.nodes.iter().map(|n| {
            within(
                n,
                timeout,
                n.release(
                    &self.keys,
                    &self.request.owner,
                    &shared.config,
                    ReleaseMode::Abandon,
                ),
            )
        }))
        .await;
        match results.into_iter().find_map(Result::err) {
            Some(err) => Err(err.into_lock_error("abandon")),
            None => Ok(()),
        }
    }
}
