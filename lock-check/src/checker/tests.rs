//! The checker's rules on hand-made histories.

use super::*;
use crate::history::{Check, Fault, FinalAcquire, Observation, Part, Worker, Write};

const MS: Nanos = 1_000_000;

fn id(worker: u32, seq: u64) -> AcqId {
    AcqId { worker, seq }
}

fn held(id: AcqId, invoked: Nanos, returned: Nanos, token: u64, released: Nanos) -> Acquisition {
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
        lock_delay: 0,
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

/// A run in which no worker ever held the lock fails, even when every failure fell in a
/// fault's window and the final acquisition (a client of its own) succeeded.
#[test]
fn a_run_with_no_hold_at_all_is_found() {
    let mut h = clean();
    for acq in &mut h.acquisitions {
        acq.returned = Some(acq.invoked + 700 * MS);
        acq.token = None;
        acq.valid_until = None;
        acq.released = None;
        acq.error = Some("timed out".into());
    }
    h.checks.clear();
    h.writes.clear();
    h.faults.push(Fault {
        kind: FaultKind::Partition,
        worker: None,
        start: 0,
        healed: h.end,
        step_ms: None,
        aimed: None,
    });
    let verdict = check(&h, &config(FencingGuarantee::Linearizable));
    let none: Vec<_> = verdict.of(Rule::Liveness).collect();
    assert_eq!(none.len(), 1, "{:?}", verdict.findings);
    assert!(none[0].detail.contains("no worker held"), "{:?}", none[0]);
    assert!(verdict.failed());
    // One hold is enough.
    h.acquisitions[0] = clean().acquisitions[0].clone();
    let verdict = check(&h, &config(FencingGuarantee::Linearizable));
    assert_eq!(
        verdict.of(Rule::Liveness).count(),
        0,
        "{:?}",
        verdict.findings
    );
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
            value: None,
        });
    }
    let verdict = check(&h, &of_kind(CheckKind::Election));
    assert!(!verdict.failed(), "{:#?}", verdict.findings);
    h.observations.push(Observation {
        worker: 0,
        at: 5 * MS,
        term: Some(2),
        value: None,
    });
    h.observations.push(Observation {
        worker: 0,
        at: 6 * MS,
        term: Some(1),
        value: None,
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

/// A crashed holder (never released) granted at 0 with `valid_until` at 300 ms and a
/// lock-delay of 500 ms keeps the name until 800 ms: a grant returning at 700 ms is found, one
/// at 900 ms is not, nor one at 700 ms without a delay or when the holder released.
#[test]
fn a_grant_inside_a_crashed_holders_lock_delay_is_found() {
    let history = |next_at: Nanos, released: Option<Nanos>| {
        let mut crashed = held(id(0, 0), 0, MS, 10, 0);
        crashed.valid_until = Some(300 * MS);
        crashed.released = released;
        let mut h = History {
            start: 0,
            end: 2_000 * MS,
            acquisitions: vec![
                crashed,
                held(id(1, 0), 100 * MS, next_at, 11, next_at + 50 * MS),
            ],
            final_acquire: Some(FinalAcquire {
                invoked: 1_900 * MS,
                returned: 1_901 * MS,
                token: Some(12),
                error: None,
            }),
            ..History::default()
        };
        h.checks.push(Check {
            acq: id(0, 0),
            step: 0,
            at: 200 * MS,
            passed: true,
        });
        h.checks.push(Check {
            acq: id(1, 0),
            step: 0,
            at: next_at + MS,
            passed: true,
        });
        h
    };
    let delayed = CheckConfig {
        lock_delay: 500 * MS,
        ..config(FencingGuarantee::Linearizable)
    };
    let verdict = check(&history(700 * MS, None), &delayed);
    let found: Vec<_> = verdict.of(Rule::LockDelay).collect();
    assert_eq!(found.len(), 1, "{:#?}", verdict.findings);
    assert_eq!(found[0].acqs, vec![id(1, 0), id(0, 0)]);
    assert_eq!(found[0].judgement, Judgement::Violation);
    assert!(
        found[0].detail.contains("until 100 ms later"),
        "{}",
        found[0].detail
    );
    assert_eq!(verdict.of(Rule::Overlap).count(), 0);
    for (h, config) in [
        (history(900 * MS, None), delayed),
        (history(700 * MS, Some(250 * MS)), delayed),
        (
            history(700 * MS, None),
            config(FencingGuarantee::Linearizable),
        ),
    ] {
        let verdict = check(&h, &config);
        assert_eq!(
            verdict.of(Rule::LockDelay).count(),
            0,
            "{:#?}",
            verdict.findings
        );
    }
    // A forward step of the wall clock the leases end on ends the delay early: expected.
    let mut stepped = history(700 * MS, None);
    stepped.faults.push(Fault {
        kind: FaultKind::Clock,
        worker: None,
        start: 400 * MS,
        healed: 600 * MS,
        step_ms: Some(1_000),
        aimed: None,
    });
    let wall = CheckConfig {
        wall_clock_leases: true,
        ..delayed
    };
    let verdict = check(&stepped, &wall);
    assert!(
        verdict.of(Rule::LockDelay).count() == 1 && !verdict.failed(),
        "{:#?}",
        verdict.findings
    );
}

/// clean(): acquisition w0#2 has token 14, w1#2 token 15. Values seen with their own leader's
/// term pass; a proclaim of w0#2 seen with w1#2's term, or w0's campaign value with w1's term,
/// is found; values this checker did not write are not judged.
#[test]
fn a_value_seen_with_another_leaders_term_is_found() {
    let observed = |value: &str, term: u64| Observation {
        worker: 3,
        at: 900 * MS,
        term: Some(term),
        value: Some(value.to_owned()),
    };
    let mut h = clean();
    for (value, term) in [
        ("w0#2.1", 14),
        ("w1", 15),
        ("w1#2.0", 15),
        ("final-probe", 99),
    ] {
        h.observations.push(observed(value, term));
    }
    let verdict = check(&h, &of_kind(CheckKind::Election));
    assert!(!verdict.failed(), "{:#?}", verdict.findings);
    for (value, term) in [("w0#2.1", 15), ("w0", 15)] {
        let mut bad = h.clone();
        bad.observations.push(observed(value, term));
        let verdict = check(&bad, &of_kind(CheckKind::Election));
        let found: Vec<_> = verdict.of(Rule::ProclaimTerm).collect();
        assert_eq!(found.len(), 1, "{value}: {:#?}", verdict.findings);
        assert!(
            found[0]
                .detail
                .contains(&format!("{value:?} with term {term}"))
        );
        assert!(verdict.failed());
    }
}

/// An upgrade (w0#1 continuing w0#0): a writer granted between the two holds (its token
/// between theirs) that believed it held is found; a writer granted after the upgrade is not,
/// even when the upgrader's worker logged its grant late (paused) and after that writer's
/// grant; nor one that never passed a check.
#[test]
fn a_writer_between_an_upgrades_two_holds_is_found_by_token() {
    let upgrade = |writer_token: u64, writer_returned: Nanos| {
        let mut read = held(id(0, 0), 0, 10 * MS, 10, 100 * MS);
        read.mode = Mode::Upgradeable;
        let mut write = held(id(0, 1), 100 * MS, 900 * MS, 20, 950 * MS);
        write.after = Some(0);
        let other = held(id(1, 0), 0, writer_returned, writer_token, 980 * MS);
        let passed = |acq, at| Check {
            acq,
            step: 0,
            at,
            passed: true,
        };
        History {
            acquisitions: vec![read, write, other],
            checks: vec![
                passed(id(0, 0), 20 * MS),
                passed(id(0, 1), 910 * MS),
                passed(id(1, 0), writer_returned + MS),
            ],
            ..History::default()
        }
    };
    let config = of_kind(CheckKind::Upgradeable);
    let between = check(&upgrade(15, 200 * MS), &config);
    let found: Vec<_> = between.of(Rule::NoWriterBetween).collect();
    assert_eq!(found.len(), 1, "{:#?}", between.findings);
    assert_eq!(found[0].acqs, [id(0, 1), id(0, 0), id(1, 0)]);
    assert_eq!(found[0].judgement, Judgement::Violation);
    // Token 25: granted after the upgrade, though it returned before the paused upgrader
    // logged its grant.
    let after = check(&upgrade(25, 500 * MS), &config);
    assert_eq!(
        after.of(Rule::NoWriterBetween).count(),
        0,
        "{:#?}",
        after.findings
    );
    // A writer granted in between that never passed a check (it came back already lost, its
    // gate lapsed while it was paused) never wrote: not a finding.
    let mut unbelieved = upgrade(15, 200 * MS);
    unbelieved.checks.retain(|c| c.acq != id(1, 0));
    let quiet = check(&unbelieved, &config);
    assert_eq!(
        quiet.of(Rule::NoWriterBetween).count(),
        0,
        "{:#?}",
        quiet.findings
    );
}
