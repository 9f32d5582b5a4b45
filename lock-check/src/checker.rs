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
//! - [`Rule::AllOrNone`]: a multi-lock acquisition returned with a different set of locks than
//!   it asked for.
//! - [`Rule::ObserverOrder`]: an election observer reported a term older than one it had
//!   already reported.
//! - [`Rule::RenewedAfterRelease`]: half a ttl after a release returned, the server still
//!   showed the released owner holding a lease that ends later than a ttl after the release:
//!   a renewal raced the release and extended it.
//! - [`Rule::Liveness`]: workers waited while the lock had free capacity and no fault was
//!   active for longer than [`CheckConfig::max_gap`].
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
//! ZooKeeper), a stale check or an overlap from a clock fault's forward step until
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
    /// A multi-lock returned a different set of locks than it asked for.
    AllOrNone,
    /// An election observer reported an older term after a newer one.
    ObserverOrder,
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
    pub const ALL: [Self; 11] = [
        Self::SharedToken,
        Self::TokenOrder,
        Self::StaleCheck,
        Self::Overlap,
        Self::AllOrNone,
        Self::ObserverOrder,
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
            Self::AllOrNone => "a multi-lock holds all of its locks or none",
            Self::ObserverOrder => "an observer never reports an older term",
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
                | Self::ObserverOrder
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
        if locks.len() > 1 {
            for finding in &mut findings[from..] {
                finding.detail = format!("lock {lock}: {}", finding.detail);
            }
        }
    }
    all_or_none(&acquired, &mut findings);
    observer_order(history, &mut findings);
    for e in &history.extensions {
        findings.push(Finding {
            rule: Rule::RenewedAfterRelease,
            at: e.at,
            acqs: vec![e.acq],
            detail: format!(
                "{} was released, yet the server still showed it holding lock {} with {} left",
                e.acq,
                e.lock,
                e.remaining_ms
                    .map_or_else(|| "an unknown lease".to_owned(), |ms| format!("{ms} ms"))
            ),
            judgement: Judgement::Violation,
        });
    }
    starvation(history, config, &mut findings);
    let gap = longest_gap(history, config);
    if gap.0 > config.max_gap {
        findings.push(Finding {
            rule: Rule::Liveness,
            at: gap.1.unwrap_or(history.start),
            acqs: Vec::new(),
            detail: format!(
                "workers waited {} ms with no holder and no fault active (limit {} ms)",
                gap.0 / 1_000_000,
                config.max_gap / 1_000_000
            ),
            judgement: Judgement::Violation,
        });
    }
    match &history.final_acquire {
        Some(last) if last.token.is_none() => findings.push(Finding {
            rule: Rule::FinalAcquire,
            at: last.returned,
            acqs: Vec::new(),
            detail: format!(
                "the acquisition after healing failed: {}",
                last.error.as_deref().unwrap_or("no guard")
            ),
            judgement: Judgement::Violation,
        }),
        Some(_) => {}
        None => findings.push(Finding {
            rule: Rule::FinalAcquire,
            at: history.end,
            acqs: Vec::new(),
            detail: "no acquisition was made after healing".into(),
            judgement: Judgement::Violation,
        }),
    }
    for worker in &history.workers {
        let detail = match &worker.end {
            WorkerEnd::Clean | WorkerEnd::Killed => continue,
            WorkerEnd::Failed(how) => format!("worker {} failed: {how}", worker.id),
            WorkerEnd::Hung => format!("worker {} did not stop when asked", worker.id),
        };
        findings.push(Finding {
            rule: Rule::Worker,
            at: history.end,
            acqs: Vec::new(),
            detail,
            judgement: Judgement::Violation,
        });
    }
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
    if config.wall_clock_leases && matches!(rule, Rule::StaleCheck | Rule::Overlap) {
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

fn shared_tokens(history: &History, acquired: &[&Acquisition], out: &mut Vec<Finding>) {
    let mut by_token: HashMap<u64, Vec<&Acquisition>> = HashMap::new();
    for a in acquired {
        by_token.entry(a.token.unwrap_or(0)).or_default().push(a);
    }
    let mut reported = std::collections::HashSet::new();
    for (token, holders) in by_token.into_iter().filter(|(_, h)| h.len() > 1) {
        reported.insert(token);
        out.push(Finding {
            rule: Rule::SharedToken,
            at: holders.iter().filter_map(|a| a.returned).max().unwrap_or(0),
            acqs: holders.iter().map(|a| a.id).collect(),
            detail: format!("{} acquisitions returned token {token}", holders.len()),
            judgement: Judgement::Violation,
        });
    }
    let mut writers: HashMap<u64, (Vec<AcqId>, Nanos)> = HashMap::new();
    for w in history.writes.iter().filter(|w| w.accepted) {
        let entry = writers.entry(w.token).or_insert_with(|| (Vec::new(), w.at));
        if !entry.0.contains(&w.acq) {
            entry.0.push(w.acq);
            entry.1 = w.at;
        }
    }
    for (token, (acqs, at)) in writers {
        if acqs.len() > 1 && !reported.contains(&token) {
            out.push(Finding {
                rule: Rule::SharedToken,
                at,
                detail: format!(
                    "the register accepted writes with token {token} from {} acquisitions",
                    acqs.len()
                ),
                acqs,
                judgement: Judgement::Violation,
            });
        }
    }
}

/// For each acquisition B, the acquisition with the largest token among those that returned
/// before B was called must have a smaller token than B's.
fn token_order(acquired: &[&Acquisition], out: &mut Vec<Finding>) {
    let mut latest = Latest::new(acquired);
    let mut by_invoke: Vec<&Acquisition> = acquired.to_vec();
    by_invoke.sort_by_key(|a| a.invoked);
    for b in by_invoke {
        if let Some(a) = latest.before(b.invoked).filter(|a| a.token >= b.token) {
            out.push(Finding {
                rule: Rule::TokenOrder,
                at: b.invoked,
                acqs: vec![a.id, b.id],
                detail: format!(
                    "{} returned token {} before {} was called, which got token {}",
                    a.id,
                    a.token.unwrap_or(0),
                    b.id,
                    b.token.unwrap_or(0)
                ),
                judgement: Judgement::Violation,
            });
        }
    }
}

/// A holder is stale once an acquisition with a larger token returned: any acquisition for
/// an exclusive holder, a writer's for a reader. Permit holders are judged by [`overlaps`].
fn stale_checks(history: &History, acquired: &[&Acquisition], out: &mut Vec<Finding>) {
    let tokens: HashMap<AcqId, (u64, Mode)> = acquired
        .iter()
        .filter_map(|a| Some((a.id, (a.token?, a.mode))))
        .collect();
    let mut latest = Latest::new(acquired);
    let writers: Vec<&Acquisition> = acquired
        .iter()
        .copied()
        .filter(|a| a.mode == Mode::Exclusive)
        .collect();
    let mut latest_writer = Latest::new(&writers);
    let mut checks: Vec<_> = history.checks.iter().filter(|c| c.passed).collect();
    checks.sort_by_key(|c| c.at);
    // One finding per stale holder: its first passing check after it was superseded.
    let mut reported = std::collections::HashSet::new();
    for check in checks {
        let (newest, newest_writer) = (latest.before(check.at), latest_writer.before(check.at));
        let Some(&(own, mode)) = tokens.get(&check.acq) else {
            continue;
        };
        let newest = match mode {
            Mode::Exclusive => newest,
            Mode::Shared => newest_writer,
            Mode::Permit => continue,
        };
        if let Some(newer) = newest.filter(|b| b.token > Some(own))
            && reported.insert(check.acq)
        {
            out.push(Finding {
                rule: Rule::StaleCheck,
                at: check.at,
                acqs: vec![check.acq, newer.id],
                detail: format!(
                    "{} (token {own}) passed its check at step {} {} ms after {} returned token {}",
                    check.acq,
                    check.step,
                    check.at.saturating_sub(newer.returned.unwrap_or(0)) / 1_000_000,
                    newer.id,
                    newer.token.unwrap_or(0)
                ),
                judgement: Judgement::Violation,
            });
        }
    }
}

/// Each holder's belief interval: from `acquire` returning to its last passing check.
fn intervals(history: &History) -> Vec<(Nanos, Nanos, &Acquisition)> {
    let mut last_pass: HashMap<AcqId, Nanos> = HashMap::new();
    for c in history.checks.iter().filter(|c| c.passed) {
        let last = last_pass.entry(c.acq).or_insert(c.at);
        *last = (*last).max(c.at);
    }
    history
        .acquisitions
        .iter()
        .filter(|a| a.acquired())
        .filter_map(|a| {
            let from = a.returned?;
            let until = *last_pass.get(&a.id)?;
            (from <= until).then_some((from, until, a))
        })
        .collect()
}

/// Sweeps the belief intervals: whenever a holder's interval begins while the holders already
/// in theirs leave no room for it (by mode and the kind's capacity), one finding naming it and
/// the holders it overlapped.
fn overlaps(history: &History, kind: CheckKind, out: &mut Vec<Finding>) {
    let capacity = usize::try_from(kind.capacity()).unwrap_or(usize::MAX);
    let spans = intervals(history);
    // (time, 0 = end before 1 = start at one instant, index)
    let mut events: Vec<(Nanos, u8, usize)> = Vec::with_capacity(spans.len() * 2);
    for (i, (from, until, _)) in spans.iter().enumerate() {
        events.push((*from, 1, i));
        events.push((*until, 0, i));
    }
    events.sort_unstable();
    let mut live: BTreeSet<usize> = BTreeSet::new();
    for (at, edge, i) in events {
        if edge == 0 {
            live.remove(&i);
            continue;
        }
        let entering = spans[i].2;
        let count = |mode| live.iter().filter(|&&j| spans[j].2.mode == mode).count();
        let (exclusive, shared, permits) = (
            count(Mode::Exclusive),
            count(Mode::Shared),
            count(Mode::Permit),
        );
        let crowded = match entering.mode {
            Mode::Exclusive => !live.is_empty(),
            Mode::Shared => exclusive > 0 || permits > 0,
            Mode::Permit => exclusive > 0 || shared > 0 || permits + 1 > capacity,
        };
        if crowded {
            let others: Vec<&Acquisition> = live.iter().map(|&j| spans[j].2).collect();
            let mut acqs = vec![entering.id];
            acqs.extend(others.iter().map(|a| a.id));
            out.push(Finding {
                rule: Rule::Overlap,
                at,
                detail: format!(
                    "{} ({}, token {}) was granted while {} still passed their checks: {}",
                    entering.id,
                    mode_name(entering.mode),
                    entering.token.unwrap_or(0),
                    others.len(),
                    others
                        .iter()
                        .map(|a| format!(
                            "{} ({}, token {})",
                            a.id,
                            mode_name(a.mode),
                            a.token.unwrap_or(0)
                        ))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                acqs,
                judgement: Judgement::Violation,
            });
        }
        live.insert(i);
    }
}

fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Exclusive => "exclusive",
        Mode::Shared => "shared",
        Mode::Permit => "permit",
    }
}

/// A multi-lock acquisition that returned must hold exactly the locks it asked for.
fn all_or_none(acquired: &[&Acquisition], out: &mut Vec<Finding>) {
    for a in acquired.iter().filter(|a| !a.locks.is_empty()) {
        let got: BTreeSet<u32> = a.parts.iter().map(|p| p.lock).collect();
        let wanted: BTreeSet<u32> = a.locks.iter().copied().collect();
        if got != wanted {
            out.push(Finding {
                rule: Rule::AllOrNone,
                at: a.returned.unwrap_or(a.invoked),
                acqs: vec![a.id],
                detail: format!("{} asked for locks {wanted:?} and got {got:?}", a.id),
                judgement: Judgement::Violation,
            });
        }
    }
}

/// Each observer's reported terms never go back (one finding per observer).
fn observer_order(history: &History, out: &mut Vec<Finding>) {
    let mut by_worker: BTreeMap<u32, Vec<(Nanos, u64)>> = BTreeMap::new();
    for o in &history.observations {
        if let Some(term) = o.term {
            by_worker.entry(o.worker).or_default().push((o.at, term));
        }
    }
    for (worker, mut seen) in by_worker {
        seen.sort_unstable_by_key(|(at, _)| *at);
        let mut highest = 0;
        for (at, term) in seen {
            if term < highest {
                out.push(Finding {
                    rule: Rule::ObserverOrder,
                    at,
                    acqs: Vec::new(),
                    detail: format!(
                        "worker {worker}'s observer reported term {term} after term {highest}"
                    ),
                    judgement: Judgement::Violation,
                });
                break;
            }
            highest = term;
        }
    }
}

/// An acquisition that failed although no fault (with its settle time) overlapped its wait.
fn starvation(history: &History, config: &CheckConfig, out: &mut Vec<Finding>) {
    for a in history.acquisitions.iter().filter(|a| a.error.is_some()) {
        let Some(returned) = a.returned else {
            continue;
        };
        if returned > history.end {
            // Failed because the worker was being stopped.
            continue;
        }
        let faulty = history
            .faults
            .iter()
            .any(|f| f.start <= returned && a.invoked <= f.healed.saturating_add(config.settle));
        if faulty {
            continue;
        }
        let error = a.error.as_deref().unwrap_or_default();
        // A wait that ran out on a backend without FIFO order can be bad luck; any other
        // failure with no fault around is the backend's.
        let judgement = if !config.fifo && error.contains("timed out") {
            Judgement::Expected("not FIFO: a waiter can be passed over until its wait ends".into())
        } else {
            Judgement::Violation
        };
        out.push(Finding {
            rule: Rule::Starvation,
            at: returned,
            acqs: vec![a.id],
            detail: format!(
                "{} failed after {} ms with no fault active: {error}",
                a.id,
                returned.saturating_sub(a.invoked) / 1_000_000
            ),
            judgement,
        });
    }
}

/// The acquisition with the largest token among those that returned before a time, for
/// times asked in increasing order.
struct Latest<'a> {
    by_return: Vec<&'a Acquisition>,
    next: usize,
    best: Option<&'a Acquisition>,
}

impl<'a> Latest<'a> {
    fn new(acquired: &[&'a Acquisition]) -> Self {
        let mut by_return = acquired.to_vec();
        by_return.sort_by_key(|a| a.returned);
        Self {
            by_return,
            next: 0,
            best: None,
        }
    }

    /// The largest token returned strictly before `at` (not earlier than the last `at` asked).
    fn before(&mut self, at: Nanos) -> Option<&'a Acquisition> {
        while let Some(&a) = self.by_return.get(self.next)
            && a.returned < Some(at)
        {
            if self.best.is_none_or(|best| a.token > best.token) {
                self.best = Some(a);
            }
            self.next += 1;
        }
        self.best
    }
}

/// The longest stretch in which some worker waited, the lock had room (no guard held; fewer
/// than N for a semaphore of N) and no fault (with its settle time) was active; with when it
/// began.
fn longest_gap(history: &History, config: &CheckConfig) -> (Nanos, Option<Nanos>) {
    // (time, waiting delta, held delta, fault delta); ends sort before starts at one instant.
    let mut events: Vec<(Nanos, i8, i64, i64, i64)> = Vec::new();
    let end = history.end;
    for a in &history.acquisitions {
        let stop = a.returned.unwrap_or(end).min(end);
        if a.invoked < stop {
            events.push((a.invoked, 1, 1, 0, 0));
            events.push((stop, 0, -1, 0, 0));
        }
        if let (true, Some(from)) = (a.acquired(), a.returned) {
            let until = a
                .released
                .or(a.lost)
                .or(a.valid_until)
                .unwrap_or(end)
                .min(end);
            if from < until {
                events.push((from, 1, 0, 1, 0));
                events.push((until, 0, 0, -1, 0));
            }
        }
    }
    for f in &history.faults {
        let until = f.healed.saturating_add(config.settle);
        events.push((f.start, 1, 0, 0, 1));
        events.push((until, 0, 0, 0, -1));
    }
    events.sort_by_key(|e| (e.0, e.1));
    let capacity = match config.kind {
        CheckKind::Permits(n) => i64::from(n),
        _ => 1,
    };
    let (mut waiting, mut held, mut faults) = (0i64, 0i64, 0i64);
    let mut since: Option<Nanos> = None;
    let mut best = (0, None);
    for (at, _, w, h, f) in events {
        (waiting, held, faults) = (waiting + w, held + h, faults + f);
        let stalled = waiting > 0 && held < capacity && faults <= 0 && at >= history.start;
        match (stalled, since) {
            (true, None) => since = Some(at),
            (false, Some(from)) => {
                if at - from > best.0 {
                    best = (at - from, Some(from));
                }
                since = None;
            }
            _ => {}
        }
    }
    best
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{Check, Fault, FinalAcquire, Observation, Part, Worker, Write};

    const MS: Nanos = 1_000_000;

    fn id(worker: u32, seq: u64) -> AcqId {
        AcqId { worker, seq }
    }

    fn held(
        id: AcqId,
        invoked: Nanos,
        returned: Nanos,
        token: u64,
        released: Nanos,
    ) -> Acquisition {
        Acquisition {
            id,
            invoked,
            returned: Some(returned),
            token: Some(token),
            valid_until: Some(returned + 2_000 * MS),
            released: Some(released),
            ..Acquisition::default()
        }
    }

    fn config(guarantee: FencingGuarantee) -> CheckConfig {
        CheckConfig {
            kind: CheckKind::Exclusive,
            guarantee,
            fifo: true,
            settle: 4_000 * MS,
            max_gap: 500 * MS,
            renew_every: 100 * MS,
            wall_clock_leases: false,
        }
    }

    /// Two workers taking turns, every step checked and written, a final acquisition.
    fn clean() -> History {
        let mut h = History {
            start: 0,
            end: 1_000 * MS,
            final_acquire: Some(FinalAcquire {
                invoked: 1_100 * MS,
                returned: 1_101 * MS,
                token: Some(100),
                error: None,
            }),
            workers: vec![
                Worker {
                    id: 0,
                    end: WorkerEnd::Clean,
                },
                Worker {
                    id: 1,
                    end: WorkerEnd::Clean,
                },
            ],
            ..History::default()
        };
        for i in 0..10u64 {
            let acq = id((i % 2) as u32, i / 2);
            let from = i * 100 * MS;
            h.acquisitions.push(held(
                acq,
                from.saturating_sub(50 * MS),
                from + MS,
                10 + i,
                from + 90 * MS,
            ));
            for step in 0..3 {
                let at = from + (2 + u64::from(step) * 10) * MS;
                h.checks.push(Check {
                    acq,
                    step,
                    at,
                    passed: true,
                });
                h.writes.push(Write {
                    acq,
                    token: 10 + i,
                    step,
                    at: at + MS,
                    accepted: true,
                    ..Write::default()
                });
            }
        }
        h
    }

    #[test]
    fn a_clean_history_has_no_findings() {
        let verdict = check(&clean(), &config(FencingGuarantee::Linearizable));
        assert_eq!(verdict.findings, []);
        assert!(!verdict.failed());
        assert_eq!(verdict.stats.acquired, 10);
        assert_eq!(verdict.stats.writes_accepted, 30);
        assert!(verdict.stats.longest_gap < 20 * MS, "{:?}", verdict.stats);
    }

    #[test]
    fn two_holders_with_one_token_are_found() {
        let mut h = clean();
        h.acquisitions[3].token = Some(12);
        for w in h.writes.iter_mut().filter(|w| w.acq == id(1, 1)) {
            w.token = 12;
        }
        let verdict = check(&h, &config(FencingGuarantee::Linearizable));
        let shared: Vec<_> = verdict.of(Rule::SharedToken).collect();
        assert_eq!(shared.len(), 1, "{:?}", verdict.findings);
        assert_eq!(shared[0].acqs.len(), 2);
        assert!(verdict.failed());
    }

    #[test]
    fn a_token_that_goes_back_is_found() {
        let mut h = clean();
        h.acquisitions[6].token = Some(5);
        let verdict = check(&h, &config(FencingGuarantee::Linearizable));
        let order: Vec<_> = verdict.of(Rule::TokenOrder).collect();
        assert_eq!(order.len(), 1, "{:?}", verdict.findings);
        assert_eq!(order[0].acqs, [id(1, 2), id(0, 3)]);
    }

    /// Worker 0's acquisition 2 (token 14, from 400 ms) keeps passing checks after worker 1
    /// took token 15 at 501 ms.
    fn stale() -> History {
        let mut h = clean();
        h.checks.push(Check {
            acq: id(0, 2),
            step: 3,
            at: 520 * MS,
            passed: true,
        });
        h.checks.push(Check {
            acq: id(0, 2),
            step: 4,
            at: 530 * MS,
            passed: true,
        });
        h
    }

    #[test]
    fn a_holder_that_outlives_its_lock_is_found_once() {
        let verdict = check(&stale(), &config(FencingGuarantee::Linearizable));
        let found: Vec<_> = verdict.of(Rule::StaleCheck).collect();
        assert_eq!(found.len(), 1, "{:?}", verdict.findings);
        assert_eq!(found[0].acqs, [id(0, 2), id(1, 2)]);
        assert_eq!(found[0].judgement, Judgement::Violation);
    }

    #[test]
    fn single_node_findings_during_a_restart_are_expected_and_only_then() {
        let restart = Fault {
            kind: FaultKind::Restart,
            worker: None,
            start: 450 * MS,
            healed: 480 * MS,
            step_ms: None,
            aimed: None,
        };
        let mut h = stale();
        h.faults.push(restart);
        let single = check(&h, &config(FencingGuarantee::SingleNode));
        assert!(!single.failed(), "{:?}", single.findings);
        assert!(matches!(
            single.of(Rule::StaleCheck).next().map(|f| &f.judgement),
            Some(Judgement::Expected(_))
        ));
        // The same on a linearizable backend is a failure, restart or not.
        assert!(check(&h, &config(FencingGuarantee::Linearizable)).failed());
        // And on a single node without a restart at that time.
        h.faults[0].start = 900 * MS;
        h.faults[0].healed = 950 * MS;
        assert!(check(&h, &config(FencingGuarantee::SingleNode)).failed());
    }

    /// A clock fault from 450 to 480 ms that stepped the server's wall clock by `step_ms`
    /// (forward at 450 ms if positive; back at 450 ms and forward at 480 ms if negative).
    fn clock(step_ms: i64) -> Fault {
        Fault {
            kind: FaultKind::Clock,
            worker: None,
            start: 450 * MS,
            healed: 480 * MS,
            step_ms: Some(step_ms),
            aimed: None,
        }
    }

    #[test]
    fn overlaps_after_a_forward_clock_step_are_expected_on_wall_clock_leases_only() {
        let wall = |guarantee| CheckConfig {
            wall_clock_leases: true,
            ..config(guarantee)
        };
        // stale(): w0#2 passes checks at 520 and 530 ms after w1#2 was granted at 501 ms:
        // a stale check and an overlap, 51 ms after the clock jumped forward.
        let mut h = stale();
        h.faults.push(clock(2_500));
        for guarantee in [FencingGuarantee::Linearizable, FencingGuarantee::SingleNode] {
            let verdict = check(&h, &wall(guarantee));
            assert!(!verdict.failed(), "{:#?}", verdict.findings);
            for rule in [Rule::StaleCheck, Rule::Overlap] {
                let found: Vec<_> = verdict.of(rule).collect();
                assert_eq!(found.len(), 1, "{rule:?}: {:#?}", verdict.findings);
                assert!(
                    matches!(&found[0].judgement, Judgement::Expected(why)
                        if why.contains("stepped 2500 ms forward")),
                    "{:?}",
                    found[0].judgement
                );
            }
        }
        // Leases on a monotonic clock (etcd): no step excuses them.
        assert!(check(&h, &config(FencingGuarantee::Linearizable)).failed());
        // A step back and its forward correction at 480 ms: the correction is the forward step.
        h.faults[0] = clock(-2_500);
        assert!(!check(&h, &wall(FencingGuarantee::Linearizable)).failed());
        // A step back set right only at 900 ms: nothing jumped forward before 501 ms.
        h.faults[0].healed = 900 * MS;
        let verdict = check(&h, &wall(FencingGuarantee::Linearizable));
        assert_eq!(verdict.violations().count(), 2, "{:#?}", verdict.findings);
        // Long after the step (more than `settle`), the overlap is the backend's again.
        h.faults[0] = Fault {
            start: 0,
            healed: 10 * MS,
            ..clock(2_500)
        };
        let late = CheckConfig {
            settle: 100 * MS,
            ..wall(FencingGuarantee::Linearizable)
        };
        assert!(check(&h, &late).failed());
        // But while the clock is still ahead (set right only at 480 ms), a grant that surfaces
        // late (a lease granted before the step) is the step's doing.
        h.faults[0] = Fault {
            start: 0,
            healed: 480 * MS,
            ..clock(2_500)
        };
        assert!(
            !check(&h, &late).failed(),
            "{:#?}",
            check(&h, &late).findings
        );
    }

    #[test]
    fn a_token_that_goes_back_after_a_clock_step_is_still_a_violation() {
        // Acquisition 6 (called at 550 ms, 100 ms after the clock jumped forward) gets a
        // token below the ones before it, as a clock-floored counter would after a step back.
        let mut h = clean();
        h.acquisitions[6].token = Some(5);
        h.faults.push(clock(2_500));
        for guarantee in [FencingGuarantee::Linearizable, FencingGuarantee::SingleNode] {
            let verdict = check(
                &h,
                &CheckConfig {
                    wall_clock_leases: true,
                    ..config(guarantee)
                },
            );
            let order: Vec<_> = verdict.of(Rule::TokenOrder).collect();
            assert_eq!(order.len(), 1, "{:#?}", verdict.findings);
            assert_eq!(order[0].judgement, Judgement::Violation);
            assert!(verdict.failed());
        }
        // Two holders with one token, in the same window: a violation too.
        let mut shared = clean();
        shared.acquisitions[7].token = Some(16);
        shared.faults.push(clock(-2_500));
        let verdict = check(
            &shared,
            &CheckConfig {
                wall_clock_leases: true,
                ..config(FencingGuarantee::SingleNode)
            },
        );
        assert!(
            verdict
                .of(Rule::SharedToken)
                .all(|f| f.judgement == Judgement::Violation)
                && verdict.of(Rule::SharedToken).count() > 0,
            "{:#?}",
            verdict.findings
        );
    }

    #[test]
    fn a_stall_without_a_fault_is_found_and_one_during_a_fault_is_not() {
        let mut h = clean();
        // The last acquisition returns 810 ms after its predecessor's release.
        h.acquisitions[9].returned = Some(1_700 * MS);
        h.acquisitions[9].released = Some(1_705 * MS);
        h.end = 2_000 * MS;
        let verdict = check(&h, &config(FencingGuarantee::Linearizable));
        let stall: Vec<_> = verdict.of(Rule::Liveness).collect();
        assert_eq!(stall.len(), 1, "{:?}", verdict.findings);
        assert_eq!(verdict.stats.longest_gap_at, Some(890 * MS));
        assert_eq!(verdict.stats.longest_gap, 810 * MS);
        h.faults.push(Fault {
            kind: FaultKind::Partition,
            worker: Some(1),
            start: 480 * MS,
            healed: 600 * MS,
            step_ms: None,
            aimed: None,
        });
        let verdict = check(&h, &config(FencingGuarantee::Linearizable));
        assert_eq!(verdict.of(Rule::Liveness).count(), 0, "{:?}", verdict.stats);
    }

    #[test]
    fn failed_workers_and_a_missing_final_acquire_are_found_but_killed_ones_are_not() {
        let mut h = clean();
        h.workers[0].end = WorkerEnd::Killed;
        h.workers.push(Worker {
            id: 2,
            end: WorkerEnd::Failed("panicked: boom".into()),
        });
        h.workers.push(Worker {
            id: 3,
            end: WorkerEnd::Hung,
        });
        h.final_acquire = None;
        let verdict = check(&h, &config(FencingGuarantee::Linearizable));
        assert_eq!(
            verdict.of(Rule::Worker).count(),
            2,
            "{:?}",
            verdict.findings
        );
        assert_eq!(verdict.of(Rule::FinalAcquire).count(), 1);
    }

    #[test]
    fn refused_writes_are_counted_not_reported() {
        let mut h = clean();
        h.writes.push(Write {
            acq: id(0, 0),
            token: 10,
            step: 3,
            at: 150 * MS,
            accepted: false,
            ..Write::default()
        });
        let verdict = check(&h, &config(FencingGuarantee::Linearizable));
        assert_eq!(verdict.findings, []);
        assert_eq!(verdict.stats.writes_rejected, 1);
    }

    /// Three holders of `mode` from 0, 10 and 20 ms, each passing checks for 100 ms, tokens
    /// 1, 2, 3.
    fn crowd(mode: Mode) -> History {
        let mut h = clean();
        h.acquisitions.clear();
        h.checks.clear();
        h.writes.clear();
        for i in 0..3u64 {
            let acq = id(u32::try_from(i).expect("small"), 0);
            let from = i * 10 * MS;
            h.acquisitions.push(Acquisition {
                mode,
                ..held(acq, from, from + MS, 1 + i, from + 101 * MS)
            });
            for step in 0..2 {
                h.checks.push(Check {
                    acq,
                    step,
                    at: from + 2 * MS + u64::from(step) * 98 * MS,
                    passed: true,
                });
            }
        }
        h
    }

    #[test]
    fn lost_replies_are_counted_by_the_operation_they_reached() {
        let mut h = History {
            start: 0,
            end: 5_000 * MS,
            ..History::default()
        };
        // w1: an acquire in flight at 1.0 s, a hold through the fault (0.3 s > one renewal
        // interval of 0.1 s), a release at 1.35 s; w2 (not the victim) is not counted.
        h.acquisitions
            .push(held(id(1, 0), 950 * MS, 1_050 * MS, 1, 1_350 * MS));
        h.acquisitions
            .push(held(id(2, 0), 950 * MS, 1_050 * MS, 2, 1_350 * MS));
        // A short hold inside the fault: no renewal was due.
        h.acquisitions
            .push(held(id(1, 1), 1_360 * MS, 1_370 * MS, 3, 1_380 * MS));
        h.faults.push(Fault {
            kind: FaultKind::Ambiguous,
            worker: Some(1),
            start: 1_000 * MS,
            healed: 1_400 * MS,
            step_ms: None,
            aimed: None,
        });
        let reach = check(&h, &config(FencingGuarantee::Linearizable))
            .stats
            .ambiguous_reach;
        assert_eq!(
            reach,
            Reach {
                acquires: 2,
                renewals: 1,
                releases: 2
            }
        );
    }

    fn of_kind(kind: CheckKind) -> CheckConfig {
        CheckConfig {
            kind,
            ..config(FencingGuarantee::Linearizable)
        }
    }

    #[test]
    fn permits_are_judged_by_how_many_hold_at_once() {
        let h = crowd(Mode::Permit);
        let three = check(&h, &of_kind(CheckKind::Permits(3)));
        assert!(!three.failed(), "{:#?}", three.findings);
        let two = check(&h, &of_kind(CheckKind::Permits(2)));
        let over: Vec<_> = two.of(Rule::Overlap).collect();
        assert_eq!(over.len(), 1, "{:#?}", two.findings);
        assert_eq!(over[0].acqs, [id(2, 0), id(0, 0), id(1, 0)]);
        assert_eq!(two.of(Rule::StaleCheck).count(), 0, "permits are not stale");
        assert!(two.failed());
    }

    #[test]
    fn readers_share_and_a_writer_among_them_is_found() {
        let mut h = crowd(Mode::Shared);
        let readers = check(&h, &of_kind(CheckKind::RwMix));
        assert!(!readers.failed(), "{:#?}", readers.findings);
        // The second holder is a writer: it overlaps the first reader, and the first reader
        // passes checks after a writer with a larger token came.
        h.acquisitions[1].mode = Mode::Exclusive;
        let verdict = check(&h, &of_kind(CheckKind::RwMix));
        let over: Vec<_> = verdict.of(Rule::Overlap).collect();
        assert_eq!(over.len(), 2, "{:#?}", verdict.findings);
        assert_eq!(over[0].acqs, [id(1, 0), id(0, 0)]);
        assert_eq!(over[1].acqs, [id(2, 0), id(0, 0), id(1, 0)]);
        // And the writer passes checks after a reader with a larger token came.
        let stale: Vec<_> = verdict.of(Rule::StaleCheck).collect();
        assert_eq!(stale.len(), 2, "{:#?}", verdict.findings);
        assert_eq!(stale[0].acqs, [id(0, 0), id(1, 0)]);
        assert_eq!(stale[1].acqs, [id(1, 0), id(2, 0)]);
    }

    #[test]
    fn a_reader_token_out_of_order_with_writers_is_found() {
        let mut h = clean();
        // Acquisition 5 is a reader that got a token below the writer before it.
        h.acquisitions[5].mode = Mode::Shared;
        h.acquisitions[5].token = Some(13);
        let verdict = check(&h, &of_kind(CheckKind::RwMix));
        let order: Vec<_> = verdict.of(Rule::TokenOrder).collect();
        assert_eq!(order.len(), 1, "{:#?}", verdict.findings);
        assert_eq!(order[0].acqs, [id(0, 2), id(1, 2)]);
        assert_eq!(verdict.of(Rule::SharedToken).count(), 1);
    }

    /// Multi-lock acquisitions of locks {0, 1} and {1, 2} in turn, each with its own tokens.
    fn multi() -> History {
        let mut h = clean();
        for (i, a) in h.acquisitions.iter_mut().enumerate() {
            let i = u32::try_from(i).expect("small");
            a.locks = if i % 2 == 0 { vec![0, 1] } else { vec![1, 2] };
            a.parts = a
                .locks
                .iter()
                .map(|&lock| Part {
                    lock,
                    token: 100 * u64::from(lock) + u64::from(i) + 1,
                })
                .collect();
            a.token = Some(a.parts[0].token);
        }
        h.writes.clear();
        h
    }

    #[test]
    fn a_multi_lock_is_judged_per_lock_and_as_a_whole() {
        let h = multi();
        let verdict = check(&h, &of_kind(CheckKind::Multi));
        assert!(!verdict.failed(), "{:#?}", verdict.findings);
        // A part that is missing is a partial multi-lock.
        let mut partial = h.clone();
        partial.acquisitions[3].parts.pop();
        let verdict = check(&partial, &of_kind(CheckKind::Multi));
        let found: Vec<_> = verdict.of(Rule::AllOrNone).collect();
        assert_eq!(found.len(), 1, "{:#?}", verdict.findings);
        assert_eq!(found[0].acqs, [id(1, 1)]);
        // A token that goes back on lock 2 only.
        let mut back = h;
        back.acquisitions[5].parts[1].token = 150;
        let verdict = check(&back, &of_kind(CheckKind::Multi));
        let order: Vec<_> = verdict.of(Rule::TokenOrder).collect();
        assert_eq!(order.len(), 1, "{:#?}", verdict.findings);
        assert!(
            order[0].detail.starts_with("lock 2: "),
            "{}",
            order[0].detail
        );
    }

    #[test]
    fn a_lease_extended_after_its_release_is_found() {
        let mut h = clean();
        h.extensions.push(crate::history::Extension {
            acq: id(0, 1),
            at: 700 * MS,
            lock: 0,
            remaining_ms: Some(1_900),
        });
        let verdict = check(&h, &config(FencingGuarantee::Linearizable));
        let found: Vec<_> = verdict.of(Rule::RenewedAfterRelease).collect();
        assert_eq!(found.len(), 1, "{:#?}", verdict.findings);
        assert!(
            found[0].detail.contains("1900 ms left"),
            "{}",
            found[0].detail
        );
        assert!(verdict.failed());
    }

    #[test]
    fn an_observer_that_goes_back_is_found() {
        let mut h = clean();
        for (at, term) in [(1, Some(3)), (2, None), (3, Some(4)), (4, Some(4))] {
            h.observations.push(Observation {
                worker: 0,
                at: at * MS,
                term,
            });
        }
        let verdict = check(&h, &of_kind(CheckKind::Election));
        assert!(!verdict.failed(), "{:#?}", verdict.findings);
        h.observations.push(Observation {
            worker: 0,
            at: 5 * MS,
            term: Some(2),
        });
        h.observations.push(Observation {
            worker: 0,
            at: 6 * MS,
            term: Some(1),
        });
        let verdict = check(&h, &of_kind(CheckKind::Election));
        let found: Vec<_> = verdict.of(Rule::ObserverOrder).collect();
        assert_eq!(found.len(), 1, "{:#?}", verdict.findings);
        assert!(
            found[0].detail.contains("term 2 after term 4"),
            "{}",
            found[0].detail
        );
    }

    #[test]
    fn a_failure_without_a_fault_is_starvation_unless_not_fifo_and_a_timeout() {
        let mut h = clean();
        h.acquisitions.push(Acquisition {
            id: id(2, 0),
            invoked: 100 * MS,
            returned: Some(700 * MS),
            error: Some("timed out after 600ms waiting for lock \"x\"".into()),
            ..Acquisition::default()
        });
        let verdict = check(&h, &config(FencingGuarantee::Linearizable));
        assert_eq!(
            verdict.of(Rule::Starvation).count(),
            1,
            "{:#?}",
            verdict.findings
        );
        assert!(verdict.failed());
        let unfair = CheckConfig {
            fifo: false,
            ..config(FencingGuarantee::Linearizable)
        };
        let verdict = check(&h, &unfair);
        assert!(!verdict.failed(), "{:#?}", verdict.findings);
        assert_eq!(verdict.of(Rule::Starvation).count(), 1);
        h.faults.push(Fault {
            kind: FaultKind::Pause,
            worker: Some(0),
            start: 600 * MS,
            healed: 650 * MS,
            step_ms: None,
            aimed: None,
        });
        let verdict = check(&h, &config(FencingGuarantee::Linearizable));
        assert_eq!(
            verdict.of(Rule::Starvation).count(),
            0,
            "{:#?}",
            verdict.findings
        );
    }
}
