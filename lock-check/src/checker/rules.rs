//! The rules, one function each, that turn a history into findings.

use super::*;

pub(super) fn shared_tokens(history: &History, acquired: &[&Acquisition], out: &mut Vec<Finding>) {
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
pub(super) fn token_order(acquired: &[&Acquisition], out: &mut Vec<Finding>) {
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
pub(super) fn stale_checks(history: &History, acquired: &[&Acquisition], out: &mut Vec<Finding>) {
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
            Mode::Shared | Mode::Upgradeable => newest_writer,
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

/// Each acquisition's last passing check.
fn last_passes(history: &History) -> HashMap<AcqId, Nanos> {
    let mut last_pass: HashMap<AcqId, Nanos> = HashMap::new();
    for c in history.checks.iter().filter(|c| c.passed) {
        let last = last_pass.entry(c.acq).or_insert(c.at);
        *last = (*last).max(c.at);
    }
    last_pass
}

/// Each holder's belief interval: from `acquire` returning to its last passing check.
pub(super) fn intervals(history: &History) -> Vec<(Nanos, Nanos, &Acquisition)> {
    let last_pass = last_passes(history);
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
pub(super) fn overlaps(history: &History, kind: CheckKind, out: &mut Vec<Finding>) {
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
        if crowded(
            entering.mode,
            live.iter().map(|&j| spans[j].2.mode),
            capacity,
        ) {
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

/// An upgrade or a downgrade (an acquisition that continues another of its worker) lets no
/// other writer in: no other exclusive acquisition was granted between the hold it continues
/// and its own grant, that is, with a token between theirs (every grant of a name takes the
/// next value of its counter) that believed it held the lock (passed a check). Judged by
/// tokens, not by when the workers logged the grants: a worker paused after its grant logs it
/// late, and a writer may then come in legitimately after the grant and before the log.
pub(super) fn writers_between(history: &History, out: &mut Vec<Finding>) {
    let by_id: HashMap<AcqId, &Acquisition> =
        history.acquisitions.iter().map(|a| (a.id, a)).collect();
    // Writers that believed they held it (a passing check): a grant that came back already
    // lost (a writer paused while it waited, whose gate lapsed) never wrote.
    let believed = last_passes(history);
    let writers: Vec<&Acquisition> = history
        .acquisitions
        .iter()
        .filter(|a| a.acquired() && a.mode == Mode::Exclusive && believed.contains_key(&a.id))
        .collect();
    for changed in history.acquisitions.iter().filter(|a| a.acquired()) {
        let Some(seq) = changed.after else { continue };
        let before = AcqId {
            worker: changed.id.worker,
            seq,
        };
        let (Some(low), Some(high), Some(at)) = (
            by_id.get(&before).and_then(|b| b.token),
            changed.token,
            changed.returned,
        ) else {
            continue;
        };
        let between: Vec<&&Acquisition> = writers
            .iter()
            .filter(|a| a.token.is_some_and(|t| low < t && t < high))
            .collect();
        if between.is_empty() {
            continue;
        }
        let mut acqs = vec![changed.id, before];
        acqs.extend(between.iter().map(|a| a.id));
        out.push(Finding {
            rule: Rule::NoWriterBetween,
            at,
            detail: format!(
                "{} ({}, token {high}) continued {before} (token {low}), and {} writer(s) \
                 were granted in between: {}",
                changed.id,
                mode_name(changed.mode),
                between.len(),
                between
                    .iter()
                    .map(|a| format!("{} (token {})", a.id, a.token.unwrap_or(0)))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            acqs,
            judgement: Judgement::Violation,
        });
    }
}

/// Whether a holder of `entering`'s mode finds no room among holders of these modes, for a
/// kind of `capacity` permits.
fn crowded(entering: Mode, live: impl Iterator<Item = Mode>, capacity: usize) -> bool {
    let (mut exclusive, mut shared, mut permits, mut upgradeable) = (0, 0, 0_usize, 0);
    let mut any = false;
    for mode in live {
        any = true;
        match mode {
            Mode::Exclusive => exclusive += 1,
            Mode::Shared => shared += 1,
            Mode::Permit => permits += 1,
            Mode::Upgradeable => upgradeable += 1,
        }
    }
    match entering {
        Mode::Exclusive => any,
        Mode::Shared => exclusive > 0 || permits > 0,
        // One upgradeable reader at a time, beside plain readers.
        Mode::Upgradeable => exclusive > 0 || permits > 0 || upgradeable > 0,
        Mode::Permit => exclusive > 0 || shared > 0 || upgradeable > 0 || permits + 1 > capacity,
    }
}

/// Lock-delay: a hold whose worker never called release (it crashed) keeps its room on the
/// server until at least its last known deadline plus the delay. An acquisition with a larger
/// token that returned before then, where the live holders alone left it room (else it is
/// an overlap), was granted too early.
pub(super) fn lock_delays(history: &History, config: &CheckConfig, out: &mut Vec<Finding>) {
    let delay = config.lock_delay;
    if delay == 0 {
        return;
    }
    let capacity = usize::try_from(config.kind.capacity()).unwrap_or(usize::MAX);
    let last_pass = last_passes(history);
    // (granted, believed until, reserved until, acquisition) of every crashed hold.
    let crashed: Vec<(Nanos, Nanos, Nanos, &Acquisition)> = history
        .acquisitions
        .iter()
        .filter(|a| a.acquired() && a.released.is_none())
        .filter_map(|a| {
            let from = a.returned?;
            let believed = last_pass.get(&a.id).copied().unwrap_or(from);
            let known = a.valid_until.unwrap_or(from).max(believed);
            Some((from, believed, known.saturating_add(delay), a))
        })
        .collect();
    if crashed.is_empty() {
        return;
    }
    let beliefs = intervals(history);
    for b in history.acquisitions.iter().filter(|a| a.acquired()) {
        let Some(at) = b.returned else { continue };
        let early: Vec<&(Nanos, Nanos, Nanos, &Acquisition)> = crashed
            .iter()
            .filter(|(from, believed, until, a)| {
                a.id != b.id && a.token < b.token && *from <= at && *believed < at && at < *until
            })
            .collect();
        if early.is_empty() {
            continue;
        }
        let live = || {
            beliefs
                .iter()
                .filter(move |(from, until, a)| a.id != b.id && *from <= at && at <= *until)
                .map(|(_, _, a)| a.mode)
        };
        if crowded(b.mode, live(), capacity)
            || !crowded(
                b.mode,
                live().chain(early.iter().map(|e| e.3.mode)),
                capacity,
            )
        {
            continue;
        }
        let mut acqs = vec![b.id];
        acqs.extend(early.iter().map(|e| e.3.id));
        out.push(Finding {
            rule: Rule::LockDelay,
            at,
            detail: format!(
                "{} ({}, token {}) was granted while {} crashed holder(s) kept the name: {}",
                b.id,
                mode_name(b.mode),
                b.token.unwrap_or(0),
                early.len(),
                early
                    .iter()
                    .map(|(_, _, until, a)| format!(
                        "{} ({}, token {}) until {} ms later",
                        a.id,
                        mode_name(a.mode),
                        a.token.unwrap_or(0),
                        until.saturating_sub(at) / 1_000_000
                    ))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            acqs,
            judgement: Judgement::Violation,
        });
    }
}

pub(super) fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Exclusive => "exclusive",
        Mode::Shared => "shared",
        Mode::Permit => "permit",
        Mode::Upgradeable => "upgradeable",
    }
}

/// A multi-lock acquisition that returned must hold exactly the locks it asked for.
pub(super) fn all_or_none(acquired: &[&Acquisition], out: &mut Vec<Finding>) {
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
pub(super) fn observer_order(history: &History, out: &mut Vec<Finding>) {
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

/// The worker and, for a proclaimed value, the acquisition of an election worker's value
/// (`w<worker>` or `w<worker>#<seq>.<step>`); `None` for any other value.
fn value_source(value: &str) -> Option<(u32, Option<u64>)> {
    let rest = value.strip_prefix('w')?;
    match rest.split_once('#') {
        None => Some((rest.parse().ok()?, None)),
        Some((worker, tail)) => {
            let (seq, step) = tail.split_once('.')?;
            step.parse::<u32>().ok()?;
            Some((worker.parse().ok()?, Some(seq.parse().ok()?)))
        }
    }
}

/// Each observed leader value must come with its own leader's term (see [`Rule::ProclaimTerm`]).
pub(super) fn proclaim_terms(history: &History, out: &mut Vec<Finding>) {
    let token_of: HashMap<AcqId, u64> = history
        .acquisitions
        .iter()
        .filter(|a| a.acquired())
        .filter_map(|a| Some((a.id, a.token?)))
        .collect();
    let holder_of: HashMap<u64, AcqId> = token_of.iter().map(|(&id, &t)| (t, id)).collect();
    for o in &history.observations {
        let (Some(term), Some(value)) = (o.term, o.value.as_deref()) else {
            continue;
        };
        let Some((worker, seq)) = value_source(value) else {
            continue;
        };
        let (fine, acq) = match seq {
            // Proclaimed by that acquisition: its token is the term.
            Some(seq) => {
                let acq = AcqId { worker, seq };
                (token_of.get(&acq) == Some(&term), acq)
            }
            // The campaign value: the term's acquisition (if the worker learnt of it) is that
            // worker's.
            None => match holder_of.get(&term) {
                Some(&acq) => (acq.worker == worker, acq),
                None => continue,
            },
        };
        if !fine {
            out.push(Finding {
                rule: Rule::ProclaimTerm,
                at: o.at,
                acqs: vec![acq],
                detail: format!(
                    "worker {}'s observer saw value {value:?} with term {term}, which is not \
                     that leader's",
                    o.worker
                ),
                judgement: Judgement::Violation,
            });
        }
    }
}

/// An acquisition that failed although no fault (with its settle time) overlapped its wait.
pub(super) fn starvation(history: &History, config: &CheckConfig, out: &mut Vec<Finding>) {
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
pub(super) struct Latest<'a> {
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
pub(super) fn longest_gap(history: &History, config: &CheckConfig) -> (Nanos, Option<Nanos>) {
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

/// Renewals that raced a release and extended it (the worker's audit after a release).
pub(super) fn renewed_after_release(history: &History, out: &mut Vec<Finding>) {
    for e in &history.extensions {
        out.push(Finding {
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
}

/// Workers waited longer than `max_gap` with free capacity and no fault (`gap` from
/// [`longest_gap`]), or no worker held the lock in the whole run: with faults overlapping
/// (a new one before the last healed) every failure falls in a fault's window and no stretch
/// is fault-free, so a lock the workers could never take passed on its final acquisition
/// alone (made by a client of its own, not through the proxy).
pub(super) fn liveness(
    history: &History,
    config: &CheckConfig,
    gap: (Nanos, Option<Nanos>),
    out: &mut Vec<Finding>,
) {
    if !history.workers.is_empty() && !history.acquisitions.iter().any(Acquisition::acquired) {
        out.push(Finding {
            rule: Rule::Liveness,
            at: history.end,
            acqs: Vec::new(),
            detail: format!(
                "no worker held the lock in the whole run ({} attempts)",
                history.acquisitions.len()
            ),
            judgement: Judgement::Violation,
        });
    }
    if gap.0 > config.max_gap {
        out.push(Finding {
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
}

/// The acquisition after healing failed, or none was made.
pub(super) fn final_acquire(history: &History, out: &mut Vec<Finding>) {
    match &history.final_acquire {
        Some(last) if last.token.is_none() => out.push(Finding {
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
        None => out.push(Finding {
            rule: Rule::FinalAcquire,
            at: history.end,
            acqs: Vec::new(),
            detail: "no acquisition was made after healing".into(),
            judgement: Judgement::Violation,
        }),
    }
}

/// Workers that failed on their own or hung.
pub(super) fn workers(history: &History, out: &mut Vec<Finding>) {
    for worker in &history.workers {
        let detail = match &worker.end {
            WorkerEnd::Clean | WorkerEnd::Killed => continue,
            WorkerEnd::Failed(how) => format!("worker {} failed: {how}", worker.id),
            WorkerEnd::Hung => format!("worker {} did not stop when asked", worker.id),
        };
        out.push(Finding {
            rule: Rule::Worker,
            at: history.end,
            acqs: Vec::new(),
            detail,
            judgement: Judgement::Violation,
        });
    }
}
