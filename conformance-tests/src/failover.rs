//! Failover measurements: a holder and a waiter on one name while a server of a replicated
//! topology (etcd cluster, ZooKeeper ensemble, Redis Sentinel or Cluster) is killed with
//! SIGKILL and brought back. [`handoff`] runs one such round and reports what happened; the
//! backends' tests assert what the README promises for their topology, and print the figures
//! ([`Tally`]).

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use distlock_core::{AcquireOptions, FencingToken, LossReason};

use crate::TestClient;

/// What one round of [`handoff`] does.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The lock name.
    pub name: String,
    /// The holder's and the waiter's options (ttl, renewal, wait).
    pub opts: AcquireOptions,
    /// How long the holder keeps the lock after the kill before releasing it: zero hands the
    /// lock over while the topology is still failing over.
    pub hold_after_kill: Duration,
    /// How long the waiter may take to get the lock after the release (or the loss).
    pub handoff_bound: Duration,
}

/// What happened in one round.
#[derive(Debug, Default)]
pub struct Round {
    /// The server that was killed (`services.sh` name).
    pub killed: String,
    /// How long the kill hook took (it returns once the server is gone).
    pub kill_took: Duration,
    /// The holder's token.
    pub first: Option<FencingToken>,
    /// The waiter's token, if it got the lock.
    pub second: Option<FencingToken>,
    /// The waiter acquired while the holder had neither been told of a loss nor begun its
    /// release: two holders at once, as far as they know.
    pub second_holder: bool,
    /// The waiter's token was not greater than the holder's.
    pub token_regressed: bool,
    /// The holder was told it lost the lock (and when, after the kill).
    pub loss: Option<(LossReason, Duration)>,
    /// The holder's release failed (its error).
    pub release_error: Option<String>,
    /// From the release (or the loss, whichever came first) to the waiter's acquisition.
    pub handoff: Option<Duration>,
    /// Why the round could not run as planned (a hook or an acquisition failed).
    pub error: Option<String>,
}

/// Runs one round: `holder` acquires `plan.name`, `waiter` starts waiting for it, `kill`
/// crashes a server (returning its name), the holder keeps the lock for
/// `plan.hold_after_kill` and releases it, the waiter gets it. `restore(name)` brings the
/// killed server back (always, also when the round fails) before the round returns.
pub async fn handoff<K, KF, R, RF>(
    holder: &TestClient,
    waiter: &TestClient,
    plan: &Plan,
    kill: K,
    restore: R,
) -> Round
where
    K: FnOnce() -> KF,
    KF: Future<Output = Result<String, String>>,
    R: FnOnce(String) -> RF,
    RF: Future<Output = Result<(), String>>,
{
    let mut round = Round::default();
    let guard = match holder.acquire(&plan.name, &plan.opts).await {
        Ok(guard) => guard,
        Err(err) => {
            round.error = Some(format!("the holder could not acquire: {err}"));
            return round;
        }
    };
    round.first = Some(guard.token());
    // The loss signal, timestamped as it fires.
    let lost_at: Arc<Mutex<Option<(LossReason, Instant)>>> = Arc::default();
    let lost = guard.lost();
    let record = lost_at.clone();
    let watcher = tokio::spawn(async move {
        let reason = lost.await;
        *record.lock().expect("not poisoned") = Some((reason, Instant::now()));
    });
    let waiting = {
        let waiter = waiter.clone();
        let (name, opts) = (plan.name.clone(), plan.opts.clone());
        tokio::spawn(async move {
            let result = waiter.acquire(&name, &opts).await;
            (result, Instant::now())
        })
    };
    // Let the waiter queue up behind the holder (a late arrival only makes the round weaker).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let killed_at = Instant::now();
    let killing = kill().await;
    round.kill_took = killed_at.elapsed();
    match killing {
        Ok(name) => round.killed = name,
        Err(err) => {
            round.error = Some(format!("kill: {err}"));
            waiting.abort();
            watcher.abort();
            return round;
        }
    }
    tokio::time::sleep(plan.hold_after_kill).await;
    let release_started = Instant::now();
    if let Err(err) = guard.release().await {
        round.release_error = Some(err.to_string());
    }
    let restored = restore(round.killed.clone()).await;
    let acquired = tokio::time::timeout(plan.handoff_bound, waiting).await;
    watcher.abort();
    let loss = lost_at.lock().expect("not poisoned").clone();
    round.loss = loss
        .clone()
        .map(|(reason, at)| (reason, at.saturating_duration_since(killed_at)));
    match acquired {
        Ok(Ok((Ok(second), at))) => {
            round.second = Some(second.token());
            round.token_regressed = second.token() <= guard_token(round.first);
            let told = loss
                .as_ref()
                .map_or(release_started, |(_, lost)| (*lost).min(release_started));
            round.second_holder = at < told;
            round.handoff = Some(at.saturating_duration_since(told));
            if let Err(err) = second.release().await {
                round.error = Some(format!("the waiter's release failed: {err}"));
            }
        }
        Ok(Ok((Err(err), _))) => round.error = Some(format!("the waiter failed: {err}")),
        Ok(Err(err)) => round.error = Some(format!("the waiter's task failed: {err}")),
        Err(_) => {
            round.error = Some(format!(
                "the waiter did not get the lock within {:?} of the release",
                plan.handoff_bound
            ));
        }
    }
    if let Err(err) = restored {
        round.error = Some(format!("restore: {err}"));
    }
    round
}

impl Round {
    /// Panics (naming `label`) unless the round ran and kept the linearizable promise: never
    /// two holders, never a token going back; with `kept`, also the holder never told of a
    /// loss and its release accepted (the lock outlived the failover).
    pub fn assert_exact(&self, label: &str, kept: bool) {
        assert!(self.error.is_none(), "{label}: {self:?}");
        assert!(!self.second_holder, "{label}: two holders: {self:?}");
        assert!(!self.token_regressed, "{label}: token went back: {self:?}");
        if kept {
            assert!(
                self.loss.is_none(),
                "{label}: the holder was told lost: {self:?}"
            );
            assert!(
                self.release_error.is_none(),
                "{label}: release refused: {self:?}"
            );
        }
    }
}

fn guard_token(token: Option<FencingToken>) -> FencingToken {
    token.unwrap_or(FencingToken::new(0))
}

/// Kills `victims` (a majority of a replicated topology, `services.sh` names) while `holder`
/// holds `name` with `ttl`, and asserts what must follow: the holder is told of the loss
/// (connection lost or session expired) within its ttl plus 2 s, `other` cannot acquire
/// meanwhile; with the servers back (always restarted, also on failure), `other` gets the
/// lock with a greater token and the holder's release is refused. Returns the loss reason
/// and when it came, after the last server was dead.
///
/// # Panics
/// When any of that does not happen.
pub async fn quorum_loss(
    holder: &TestClient,
    other: &TestClient,
    name: &str,
    ttl: Duration,
    victims: &[&str],
) -> (LossReason, Duration) {
    let opts = AcquireOptions::default()
        .with_ttl(ttl)
        .with_wait(Duration::from_secs(60));
    let guard = holder.acquire(name, &opts).await.expect("acquire");
    let token = guard.token();
    let lost = guard.lost();
    let mut killed = Ok(());
    for victim in victims {
        killed = killed.and(crate::services("kill-one", victim).await);
    }
    let killed_at = Instant::now();
    let reason = tokio::time::timeout(ttl + Duration::from_secs(2), lost).await;
    let told_after = killed_at.elapsed();
    let refused = other.try_acquire(name, &opts).await;
    for victim in victims {
        crate::services("start-one", victim)
            .await
            .expect("restart a killed server");
    }
    killed.expect("kill the servers");
    let reason = reason.expect("the holder was not told of the loss within its ttl + 2 s");
    assert!(
        matches!(
            reason,
            LossReason::ConnectionLost | LossReason::SessionExpired
        ),
        "{reason:?}"
    );
    assert!(
        refused.is_err(),
        "acquired without a quorum: {:?}",
        refused.map(|g| g.map(|g| g.token()))
    );
    let next = other.acquire(name, &opts).await.expect("acquire after");
    assert!(next.token() > token, "{:?} after {token:?}", next.token());
    assert!(guard.release().await.is_err(), "a lost lock was released");
    next.release().await.expect("release");
    (reason, told_after)
}

/// Counts over rounds, printed as one line for the notes and the README.
#[derive(Debug, Default)]
pub struct Tally {
    /// Rounds run.
    pub rounds: usize,
    /// Rounds with two holders at once (see [`Round::second_holder`]).
    pub second_holders: usize,
    /// Rounds whose second token was not greater.
    pub regressions: usize,
    /// Rounds in which the holder was told of a loss.
    pub losses: usize,
    /// Handoff times (release or loss to acquisition), for the median and maximum.
    pub handoffs: Vec<Duration>,
}

impl Tally {
    /// Adds one round (which must have run: `round.error` is `None`).
    pub fn add(&mut self, round: &Round) {
        self.rounds += 1;
        self.second_holders += usize::from(round.second_holder);
        self.regressions += usize::from(round.token_regressed);
        self.losses += usize::from(round.loss.is_some());
        self.handoffs.extend(round.handoff);
    }

    /// `second holder in A of N; token regression in B of N; holder told lost in C of N;
    /// handoff median X ms, max Y ms`.
    pub fn summary(&self) -> String {
        let mut handoffs = self.handoffs.clone();
        handoffs.sort();
        let ms = |d: Option<&Duration>| d.map_or(0, Duration::as_millis);
        format!(
            "second holder in {} of {n}; token regression in {} of {n}; holder told lost in {} of \
             {n}; handoff median {} ms, max {} ms",
            self.second_holders,
            self.regressions,
            self.losses,
            ms(handoffs.get(handoffs.len() / 2)),
            ms(handoffs.last()),
            n = self.rounds,
        )
    }
}

/// Rounds per failover test: `DISTLOCK_TEST_FAILOVER_ROUNDS`, or `default` (small, for CI).
pub fn rounds(default: usize) -> usize {
    std::env::var("DISTLOCK_TEST_FAILOVER_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(default)
}
