//! The checker: what a [`History`] shows, judged against the backend's declared
//! [`FencingGuarantee`].
//!
//! Rules (each finding names the acquisitions involved and when):
//!
//! - [`Rule::SharedToken`]: two acquisitions returned the same token, or the register accepted
//!   writes with one token from two acquisitions: two holders shared a token.
//! - [`Rule::TokenOrder`]: acquisition A returned before B was called, yet
//!   `token(A) >= token(B)`: tokens did not follow real time.
//! - [`Rule::StaleCheck`]: a holder with token `g` passed its check
//!   (`!is_lost() && now < valid_until()`) at `t`, while an acquisition with a larger token had
//!   already returned before `t`: the local deadline (or the loss signal) came too late, and
//!   only the fence stood between the two holders.
//!   A reader is stale only after a newer writer; a permit holder is judged by the next rule.
//! - [`Rule::Overlap`]: at some instant more holders believed they held the lock than its kind
//!   allows: two exclusive holders, an exclusive holder with anyone else, more than N permit
//!   holders. A holder believed it from its grant to its last passing check, so its interval
//!   is `[returned, last passing check]`.
//! - [`Rule::NoWriterBetween`]: an upgrade (or a downgrade) of an upgradeable lock let
//!   another writer in: another exclusive acquisition got a token between the token of the
//!   hold that was changed and the new hold's (a grant between the two on the server; not
//!   judged by the workers' logs, which a paused worker writes late).
//! - [`Rule::AllOrNone`]: a multi-lock acquisition returned with a different set of locks than
//!   it asked for.
//! - [`Rule::ObserverOrder`]: an election observer reported a term older than one it had
//!   already reported.
//! - [`Rule::ProclaimTerm`]: an election observer saw a value with a term that is not its
//!   leader's: `w<worker>#<seq>.<step>` (proclaimed by acquisition `seq` of that worker) with
//!   another term than that acquisition's token, or the campaign value `w<worker>` with the
//!   term of another worker's acquisition. A deposed leader's proclaim that landed on its
//!   successor's term shows so.
//! - [`Rule::LockDelay`]: with a lock-delay ([`CheckConfig::lock_delay`]), an acquisition
//!   was granted while a crashed holder's lease plus its delay had not yet run out (and no
//!   live holder crowded it already, which is an overlap): a hold whose worker never called
//!   release keeps the name on the server until at least its last known deadline (its
//!   `valid_until` when granted, or its last passing check, both before its lease's end)
//!   plus the delay; a later grant that returned before then came too early.
//! - [`Rule::RenewedAfterRelease`]: half a ttl after a release returned, the server still
//!   showed the released owner holding a lease that ends later than a ttl after the release:
//!   a renewal raced the release and extended it.
//! - [`Rule::Liveness`]: workers waited while the lock had free capacity and no fault was
//!   active for longer than [`CheckConfig::max_gap`], or no worker held the lock in the
//!   whole run.
//! - [`Rule::Starvation`]: an acquisition failed (its wait ran out, or the server refused)
//!   although no fault was active during its wait.
//! - [`Rule::FinalAcquire`]: the acquisition after healing failed.
//! - [`Rule::Worker`]: a worker failed on its own (a panic, an error) or hung.
//!
//! The token and overlap rules apply per lock: a multi-lock run's history is judged once for
//! each of its locks, with each acquisition's token for that lock.
//!
//! A safety finding (the first three, overlaps and observer order) on a backend whose guarantee is not
//! [`Linearizable`](FencingGuarantee::Linearizable) is judged
//! [`Judgement::Expected`] when it falls inside a server restart (from the kill to
//! [`CheckConfig::settle`] after the server answered again): a single Redis server without
//! persistence forgets its locks when it restarts, as the README says. On a backend whose
//! leases end on the server's wall clock ([`CheckConfig::wall_clock_leases`]: Redis, SQL,
//! ZooKeeper), a stale check, an overlap or a writer between an upgrade's two holds from a
//! clock fault's forward step until
//! [`CheckConfig::settle`] after the clock is set right is [`Judgement::Expected`] too,
//! whatever the guarantee: the step
//! ended the lease on the server at once, while the holder's own deadline runs on its
//! monotonic clock. The token rules stay violations then: a clock step must never repeat a
//! token or send one back. Everything else is a [`Judgement::Violation`].
//!
//! Writes the register refused are not findings: each is a late write of a former holder that
//! only the fence stopped ([`Stats::writes_rejected`]), the number that shows why the protected
//! resource must check tokens.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use distlock_core::FencingGuarantee;
use serde::Serialize;

use crate::history::{AcqId, Acquisition, ClockSteps, FaultKind, History, Nanos, Reach, WorkerEnd};
use crate::kind::{CheckKind, Mode};

mod rules;
#[cfg(test)]
mod tests;

use rules::*;

/// What the checker needs besides the history.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheckConfig {
    /// The primitive the workers drove.
    pub kind: CheckKind,
    /// The backend's declared guarantee.
    pub guarantee: FencingGuarantee,
    /// Whether the backend declares FIFO waiters (else a waiter that times out while others
    /// get the lock is expected, not a violation).
    pub fifo: bool,
    /// How long a healed fault's effects may last (locks of a killed worker run out, a paused
    /// worker's guard expires): typically twice the ttl.
    pub settle: Nanos,
    /// The longest acceptable stretch with waiters, no holder and no fault.
    pub max_gap: Nanos,
    /// The holders' renewal interval (ttl/3), for what ambiguous replies reached.
    pub renew_every: Nanos,
    /// Whether the backend's leases end on its server's wall clock (Redis key expiry, SQL
    /// `now()`, a ZooKeeper node's `mtime`; not etcd, whose leases run on its monotonic
    /// clock; the backend's descriptor says which). Then a forward
    /// step of that clock ends leases early, and the stale checks and overlaps that follow
    /// within `settle` are expected.
    pub wall_clock_leases: bool,
    /// The lock-delay the workers asked for (zero: none, and the `lock-delay` rule has
    /// nothing to judge).
    pub lock_delay: Nanos,
}

/// The rules of the checker.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Rule {
    /// Two holders shared a token.
    SharedToken,
    /// A later acquisition got a token that is not larger.
    TokenOrder,
    /// A holder believed it held the lock after a newer holder had it.
    StaleCheck,
    /// More holders believed they held the lock at once than its kind allows.
    Overlap,
    /// An upgrade or a downgrade let another writer in.
    NoWriterBetween,
    /// A multi-lock returned a different set of locks than it asked for.
    AllOrNone,
    /// An election observer reported an older term after a newer one.
    ObserverOrder,
    /// An observer saw a leader value with another leader's term.
    ProclaimTerm,
    /// A crashed holder's name was granted before its lock-delay ran out.
    LockDelay,
    /// A lease was extended after its release.
    RenewedAfterRelease,
    /// Waiters without a holder for too long.
    Liveness,
    /// An acquisition failed while no fault was active.
    Starvation,
    /// No lock after healing.
    FinalAcquire,
    /// A worker failed or hung.
    Worker,
}

impl Rule {
    /// Every rule, in report order.
    pub const ALL: [Self; 14] = [
        Self::SharedToken,
        Self::TokenOrder,
        Self::StaleCheck,
        Self::Overlap,
        Self::NoWriterBetween,
        Self::AllOrNone,
        Self::ObserverOrder,
        Self::ProclaimTerm,
        Self::LockDelay,
        Self::RenewedAfterRelease,
        Self::Liveness,
        Self::Starvation,
        Self::FinalAcquire,
        Self::Worker,
    ];

    /// What the rule checks, in a few words.
    pub fn title(self) -> &'static str {
        match self {
            Self::SharedToken => "no two holders share a token",
            Self::TokenOrder => "tokens increase in real-time order",
            Self::StaleCheck => "valid_until/is_lost turn before a newer holder acquires",
            Self::Overlap => "never more holders at once than the kind allows",
            Self::NoWriterBetween => "no writer gets in at an upgrade or a downgrade",
            Self::AllOrNone => "a multi-lock holds all of its locks or none",
            Self::ObserverOrder => "an observer never reports an older term",
            Self::ProclaimTerm => "an observer sees each value with its own leader's term",
            Self::LockDelay => "a crashed holder's name stays taken for its lock-delay",
            Self::RenewedAfterRelease => "no lease is extended after its release",
            Self::Liveness => "waiters get the lock without stalls",
            Self::Starvation => "no acquisition fails while no fault is active",
            Self::FinalAcquire => "the lock works after every fault is healed",
            Self::Worker => "no worker panics or hangs",
        }
    }

    /// The rules that may not hold on a single node's restart (see [`Judgement::Expected`]).
    fn is_safety(self) -> bool {
        matches!(
            self,
            Self::SharedToken
                | Self::TokenOrder
                | Self::StaleCheck
                | Self::Overlap
                | Self::NoWriterBetween
                | Self::ObserverOrder
                | Self::ProclaimTerm
                | Self::LockDelay
        )
    }
}

/// How a finding counts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Judgement {
    /// The backend broke what it claims.
    Violation,
    /// What the backend's guarantee allows, with why.
    Expected(String),
}

/// One thing the checker found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// Which rule.
    pub rule: Rule,
    /// When it happened.
    pub at: Nanos,
    /// The acquisitions involved.
    pub acqs: Vec<AcqId>,
    /// One line saying what happened.
    pub detail: String,
    /// How it counts.
    pub judgement: Judgement,
}

/// Figures of the run.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Stats {
    /// From the workers' start to their stop.
    pub duration: Nanos,
    /// Calls of `acquire`.
    pub acquisitions: u64,
    /// Those that returned a guard.
    pub acquired: u64,
    /// Those that returned an error.
    pub failed: u64,
    /// Guards per second of the run.
    pub acquired_per_sec: f64,
    /// Checks a holder passed.
    pub checks_passed: u64,
    /// Checks that stopped a holder (its deadline had passed or its lock was lost).
    pub checks_refused: u64,
    /// Writes the register accepted.
    pub writes_accepted: u64,
    /// Writes the register refused: late writes of former holders that only the fence
    /// stopped.
    pub writes_rejected: u64,
    /// Faults injected, by kind.
    pub faults: BTreeMap<FaultKind, u64>,
    /// The longest stretch with waiters, no holder and no fault.
    pub longest_gap: Nanos,
    /// When it began.
    pub longest_gap_at: Option<Nanos>,
    /// How long the final acquisition took, if it succeeded.
    pub final_acquire: Option<Nanos>,
    /// Which operations the ambiguous-reply faults reached.
    pub ambiguous_reach: Reach,
    /// The operations the ambiguous-reply faults were aimed at, by their count.
    pub ambiguous_aimed: Reach,
    /// The clock faults' steps of the server's wall clock.
    pub clock_steps: ClockSteps,
}

/// The checker's answer.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Verdict {
    /// The guarantee judged against.
    pub guarantee: String,
    /// Every finding, in time order.
    pub findings: Vec<Finding>,
    /// Figures of the run.
    pub stats: Stats,
}

impl Verdict {
    /// Whether any finding is a violation.
    pub fn failed(&self) -> bool {
        self.violations().next().is_some()
    }

    /// The findings that are violations.
    pub fn violations(&self) -> impl Iterator<Item = &Finding> {
        self.findings
            .iter()
            .filter(|f| f.judgement == Judgement::Violation)
    }

    /// The findings of one rule.
    pub fn of(&self, rule: Rule) -> impl Iterator<Item = &Finding> {
        self.findings.iter().filter(move |f| f.rule == rule)
    }
}

/// Judges `history`.
pub fn check(history: &History, config: &CheckConfig) -> Verdict {
    let acquired: Vec<&Acquisition> = history
        .acquisitions
        .iter()
        .filter(|a| a.acquired())
        .collect();
    let mut findings = Vec::new();
    let locks: BTreeSet<u32> = history
        .acquisitions
        .iter()
        .flat_map(Acquisition::wanted)
        .chain([0])
        .collect();
    for &lock in &locks {
        let projected = project(history, lock);
        let acquired: Vec<&Acquisition> = projected
            .acquisitions
            .iter()
            .filter(|a| a.acquired())
            .collect();
        let from = findings.len();
        shared_tokens(&projected, &acquired, &mut findings);
        token_order(&acquired, &mut findings);
        stale_checks(&projected, &acquired, &mut findings);
        overlaps(&projected, config.kind, &mut findings);
        writers_between(&projected, &mut findings);
        lock_delays(&projected, config, &mut findings);
        if locks.len() > 1 {
            for finding in &mut findings[from..] {
                finding.detail = format!("lock {lock}: {}", finding.detail);
            }
        }
    }
    all_or_none(&acquired, &mut findings);
    observer_order(history, &mut findings);
    proclaim_terms(history, &mut findings);
    renewed_after_release(history, &mut findings);
    starvation(history, config, &mut findings);
    let gap = longest_gap(history, config);
    liveness(history, config, gap, &mut findings);
    final_acquire(history, &mut findings);
    workers(history, &mut findings);
    for finding in &mut findings {
        if finding.rule.is_safety() {
            finding.judgement = judge(history, config, finding.rule, finding.at);
        }
    }
    findings.sort_by_key(|f| (f.at, f.rule));
    Verdict {
        guarantee: config.guarantee.to_string(),
        findings,
        stats: stats(history, &acquired, gap, config.renew_every),
    }
}

/// A safety finding of `rule` at `at`: expected during a restart of a server whose guarantee
/// does not survive it, and (stale checks and overlaps only) after a forward step of the
/// clock the leases end on; else a violation.
fn judge(history: &History, config: &CheckConfig, rule: Rule, at: Nanos) -> Judgement {
    let restart = history.faults.iter().find(|fault| {
        fault.kind == FaultKind::Restart
            && fault.start <= at
            && at <= fault.healed.saturating_add(config.settle)
    });
    if restart.is_some() && config.guarantee != FencingGuarantee::Linearizable {
        return Judgement::Expected(format!(
            "{}: the server restarted or failed over and lost the lock (no persistence, or \
             a promoted replica that had not received it)",
            config.guarantee
        ));
    }
    if config.wall_clock_leases
        && matches!(
            rule,
            Rule::StaleCheck | Rule::Overlap | Rule::NoWriterBetween | Rule::LockDelay
        )
    {
        // From the forward step until `settle` after the clock is set right: while the clock
        // is off, a lease granted before the step (a waiter's reservation picked up late, too)
        // can surface as a grant at any time.
        let step = history.faults.iter().find_map(|fault| {
            let stepped = fault.forward_step_at()?;
            let until = stepped.max(fault.healed).saturating_add(config.settle);
            (stepped <= at && at <= until).then(|| fault.step_ms.unwrap_or(0).unsigned_abs())
        });
        if let Some(ms) = step {
            return Judgement::Expected(format!(
                "leases on the server's wall clock: it stepped {ms} ms forward and ended the \
                 lease there at once; the holder's deadline runs on its monotonic clock"
            ));
        }
    }
    Judgement::Violation
}

/// The history of lock `lock` alone: the acquisitions that asked for it, each with its token
/// for that lock (none if it did not get it), their checks, and the accesses to its resource.
fn project(history: &History, lock: u32) -> History {
    let acquisitions: Vec<Acquisition> = history
        .acquisitions
        .iter()
        .filter(|a| a.wanted().contains(&lock))
        .map(|a| Acquisition {
            token: a.token_of(lock).filter(|_| a.acquired()),
            ..a.clone()
        })
        .collect();
    let ids: std::collections::HashSet<AcqId> = acquisitions.iter().map(|a| a.id).collect();
    History {
        acquisitions,
        checks: history
            .checks
            .iter()
            .filter(|c| ids.contains(&c.acq))
            .copied()
            .collect(),
        writes: history
            .writes
            .iter()
            .filter(|w| w.lock == lock)
            .copied()
            .collect(),
        ..History::default()
    }
}

fn stats(
    history: &History,
    acquired: &[&Acquisition],
    gap: (Nanos, Option<Nanos>),
    renew_every: Nanos,
) -> Stats {
    let duration = history.end.saturating_sub(history.start);
    let count = |pred: &dyn Fn(&Acquisition) -> bool| {
        history.acquisitions.iter().filter(|a| pred(a)).count() as u64
    };
    let mut faults = BTreeMap::new();
    for f in &history.faults {
        *faults.entry(f.kind).or_insert(0) += 1;
    }
    Stats {
        duration,
        acquisitions: history.acquisitions.len() as u64,
        acquired: acquired.len() as u64,
        failed: count(&|a| a.error.is_some()),
        acquired_per_sec: if duration == 0 {
            0.0
        } else {
            acquired.len() as f64 / (duration as f64 / 1e9)
        },
        checks_passed: history.checks.iter().filter(|c| c.passed).count() as u64,
        checks_refused: history.checks.iter().filter(|c| !c.passed).count() as u64,
        writes_accepted: history.writes.iter().filter(|w| w.accepted).count() as u64,
        writes_rejected: history.writes.iter().filter(|w| !w.accepted).count() as u64,
        faults,
        longest_gap: gap.0,
        longest_gap_at: gap.1,
        final_acquire: history
            .final_acquire
            .as_ref()
            .filter(|f| f.token.is_some())
            .map(|f| f.returned.saturating_sub(f.invoked)),
        ambiguous_reach: history.ambiguous_reach(renew_every),
        ambiguous_aimed: history.ambiguous_aimed(),
        clock_steps: history.clock_steps(),
    }
}
