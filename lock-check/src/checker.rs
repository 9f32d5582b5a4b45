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
//! - [`Rule::Liveness`]: workers waited while nobody held the lock and no fault was active for
//!   longer than [`CheckConfig::max_gap`].
//! - [`Rule::FinalAcquire`]: the acquisition after healing failed.
//! - [`Rule::Worker`]: a worker failed on its own (a panic, an error) or hung.
//!
//! A safety finding (the first three) on a backend whose guarantee is not
//! [`Linearizable`](FencingGuarantee::Linearizable) is judged
//! [`Judgement::Expected`] when it falls inside a server restart (from the kill to
//! [`CheckConfig::settle`] after the server answered again): a single Redis server without
//! persistence forgets its locks when it restarts, as the README says. Everything else is a
//! [`Judgement::Violation`].
//!
//! Writes the register refused are not findings: each is a late write of a former holder that
//! only the fence stopped ([`Stats::writes_rejected`]), the number that shows why the protected
//! resource must check tokens.

use std::collections::{BTreeMap, HashMap};

use distlock_core::FencingGuarantee;
use serde::Serialize;

use crate::history::{AcqId, Acquisition, FaultKind, History, Nanos, WorkerEnd};

/// What the checker needs besides the history.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheckConfig {
    /// The backend's declared guarantee.
    pub guarantee: FencingGuarantee,
    /// How long a healed fault's effects may last (locks of a killed worker run out, a paused
    /// worker's guard expires): typically twice the ttl.
    pub settle: Nanos,
    /// The longest acceptable stretch with waiters, no holder and no fault.
    pub max_gap: Nanos,
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
    /// Waiters without a holder for too long.
    Liveness,
    /// No lock after healing.
    FinalAcquire,
    /// A worker failed or hung.
    Worker,
}

impl Rule {
    /// Every rule, in report order.
    pub const ALL: [Self; 6] = [
        Self::SharedToken,
        Self::TokenOrder,
        Self::StaleCheck,
        Self::Liveness,
        Self::FinalAcquire,
        Self::Worker,
    ];

    /// What the rule checks, in a few words.
    pub fn title(self) -> &'static str {
        match self {
            Self::SharedToken => "no two holders share a token",
            Self::TokenOrder => "tokens increase in real-time order",
            Self::StaleCheck => "valid_until/is_lost turn before a newer holder acquires",
            Self::Liveness => "waiters get the lock without stalls",
            Self::FinalAcquire => "the lock works after every fault is healed",
            Self::Worker => "no worker panics or hangs",
        }
    }

    fn is_safety(self) -> bool {
        matches!(
            self,
            Self::SharedToken | Self::TokenOrder | Self::StaleCheck
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
    shared_tokens(history, &acquired, &mut findings);
    token_order(&acquired, &mut findings);
    stale_checks(history, &acquired, &mut findings);
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
            finding.judgement = judge(history, config, finding.at);
        }
    }
    findings.sort_by_key(|f| (f.at, f.rule));
    Verdict {
        guarantee: config.guarantee.to_string(),
        findings,
        stats: stats(history, &acquired, gap),
    }
}

fn judge(history: &History, config: &CheckConfig, at: Nanos) -> Judgement {
    if config.guarantee == FencingGuarantee::Linearizable {
        return Judgement::Violation;
    }
    let restart = history.faults.iter().find(|fault| {
        fault.kind == FaultKind::Restart
            && fault.start <= at
            && at <= fault.healed.saturating_add(config.settle)
    });
    match restart {
        Some(_) => Judgement::Expected(format!(
            "{}: the server restarted and forgot the lock (no persistence)",
            config.guarantee
        )),
        None => Judgement::Violation,
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

fn stale_checks(history: &History, acquired: &[&Acquisition], out: &mut Vec<Finding>) {
    let tokens: HashMap<AcqId, u64> = acquired
        .iter()
        .filter_map(|a| Some((a.id, a.token?)))
        .collect();
    let mut latest = Latest::new(acquired);
    let mut checks: Vec<_> = history.checks.iter().filter(|c| c.passed).collect();
    checks.sort_by_key(|c| c.at);
    // One finding per stale holder: its first passing check after it was superseded.
    let mut reported = std::collections::HashSet::new();
    for check in checks {
        let newest = latest.before(check.at);
        let Some(&own) = tokens.get(&check.acq) else {
            continue;
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

/// The longest stretch in which some worker waited, no guard was held and no fault (with its
/// settle time) was active; with when it began.
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
    let (mut waiting, mut held, mut faults) = (0i64, 0i64, 0i64);
    let mut since: Option<Nanos> = None;
    let mut best = (0, None);
    for (at, _, w, h, f) in events {
        (waiting, held, faults) = (waiting + w, held + h, faults + f);
        let stalled = waiting > 0 && held <= 0 && faults <= 0 && at >= history.start;
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

fn stats(history: &History, acquired: &[&Acquisition], gap: (Nanos, Option<Nanos>)) -> Stats {
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{Check, Fault, FinalAcquire, Worker, Write};

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
            error: None,
            released: Some(released),
            lost: None,
        }
    }

    fn config(guarantee: FencingGuarantee) -> CheckConfig {
        CheckConfig {
            guarantee,
            settle: 4_000 * MS,
            max_gap: 500 * MS,
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
        });
        let verdict = check(&h, &config(FencingGuarantee::Linearizable));
        assert_eq!(verdict.findings, []);
        assert_eq!(verdict.stats.writes_rejected, 1);
    }
}
