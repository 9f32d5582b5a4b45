//! The worker loop, the recorder and the checker together, with workers as tasks of this
//! process: a correct backend (the in-memory one) shows no violation, a deliberately broken one
//! (every acquisition succeeds, whoever holds the lock) is caught.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use distlock_check::{
    CheckConfig, CheckKind, FencedRegister, FinalAcquire, History, Judgement, NoAim, Recorder,
    Rule, Sabotage, Verdict, Worker, WorkerEnd, WorkerParams, check, history::now, work,
};
use distlock_core::backend::{AcquireRequest, Acquired, Attempt, Lease, LockBackend, Step};
use distlock_core::memory::MemoryStore;
use distlock_core::{
    AcquireOptions, Capabilities, DistributedLock, FencingGuarantee, FencingToken, LockClient,
    LockInfo, Result,
};

async fn run(lock: Arc<dyn DistributedLock>, guarantee: FencingGuarantee) -> (History, Verdict) {
    let params = WorkerParams {
        id: 0,
        name: "in-process".into(),
        kind: CheckKind::Exclusive,
        sabotage: None,
        ttl: Duration::from_secs(1),
        lock_delay: Duration::ZERO,
        wait: Duration::from_secs(5),
        steps: 3,
        step_gap: Duration::from_millis(5),
    };
    run_with(lock, guarantee, params, Duration::from_millis(1500)).await
}

/// Four workers with `params` (each its own id) for `duration`, a final acquisition, the
/// verdict.
async fn run_with(
    lock: Arc<dyn DistributedLock>,
    guarantee: FencingGuarantee,
    params: WorkerParams,
    duration: Duration,
) -> (History, Verdict) {
    let kind = params.kind;
    let register = Arc::new(FencedRegister::new());
    let recorder = Arc::new(Recorder::new());
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let start = now();
    let tasks: Vec<_> = (0..4)
        .map(|id| {
            let (lock, register, recorder, stopped) = (
                lock.clone(),
                register.clone(),
                recorder.clone(),
                stopped.clone(),
            );
            let params = WorkerParams {
                id,
                ..params.clone()
            };
            tokio::spawn(async move {
                work(&lock, &params, &*register, &*recorder, &NoAim, stopped).await
            })
        })
        .collect();
    tokio::time::sleep(duration).await;
    let end = now();
    stop.send(true).expect("workers listen");
    for task in tasks {
        task.await
            .expect("no panic")
            .expect("the register is in memory");
    }
    let invoked = now();
    let options = AcquireOptions::default().with_wait(Duration::from_secs(5));
    let last = match kind {
        CheckKind::Multi => lock
            .acquire_all(&["in-process/0", "in-process/1", "in-process/2"], &options)
            .await
            .map(|all| all.into_guards().remove(0)),
        CheckKind::Permits(n) => lock.acquire("in-process", &options.with_permits(n)).await,
        CheckKind::Shared => lock.acquire("in-process", &options.shared()).await,
        _ => lock.acquire("in-process", &options).await,
    };
    let mut history = recorder.history();
    history.start = start;
    history.end = end;
    history.writes = register.writes();
    history.workers = (0..4)
        .map(|id| Worker {
            id,
            end: WorkerEnd::Clean,
        })
        .collect();
    history.final_acquire = Some(FinalAcquire {
        invoked,
        returned: now(),
        token: last.as_ref().ok().map(|g| g.token().get()),
        error: last.as_ref().err().map(ToString::to_string),
    });
    let config = CheckConfig {
        kind,
        guarantee,
        fifo: true,
        settle: 2_000_000_000,
        max_gap: 1_000_000_000,
        renew_every: 333_000_000,
        wall_clock_leases: false,
        lock_delay: 0,
    };
    let verdict = check(&history, &config);
    (history, verdict)
}

#[tokio::test]
async fn the_memory_backend_passes() {
    let (history, verdict) = run(MemoryStore::new().client(), FencingGuarantee::Linearizable).await;
    assert!(!verdict.failed(), "{:#?}", verdict.findings);
    assert!(verdict.stats.acquired >= 20, "{:?}", verdict.stats);
    assert_eq!(verdict.stats.writes_rejected, 0);
    assert!(history.writes.len() as u64 >= 3 * verdict.stats.acquired - 3);
    let table = distlock_check::report::markdown("memory", &verdict);
    assert!(
        table.contains("| no two holders share a token | pass | 0 |"),
        "{table}"
    );
    let svg = distlock_check::report::svg("memory", &history, &verdict).expect("draws");
    assert!(svg.contains("held") && !svg.contains("violation"), "{svg}");
}

/// A backend that grants every acquisition at once, with increasing tokens.
#[derive(Debug, Default)]
struct Careless(Arc<AtomicU64>);

#[derive(Debug)]
struct NoLease;

#[async_trait]
impl Lease for NoLease {
    async fn renew(&self, _ttl: Duration) -> Result<()> {
        Ok(())
    }
    async fn release(&self) -> Result<()> {
        Ok(())
    }
}

struct Granted(Arc<AtomicU64>);

#[async_trait]
impl Attempt for Granted {
    async fn poll(&mut self) -> Result<Step> {
        let token = FencingToken::new(self.0.fetch_add(1, Ordering::SeqCst) + 1);
        Ok(Step::Acquired(Acquired::new(Box::new(NoLease), token)))
    }
    async fn abandon(self: Box<Self>) -> Result<()> {
        Ok(())
    }
}

impl LockBackend for Careless {
    fn name(&self) -> &'static str {
        "careless"
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities::new(FencingGuarantee::Linearizable)
    }
    fn begin(&self, _request: AcquireRequest) -> Box<dyn Attempt> {
        Box::new(Granted(self.0.clone()))
    }
}

#[tokio::test]
async fn a_backend_that_grants_a_held_lock_is_caught() {
    let (history, verdict) = run(
        Arc::new(LockClient::new(Careless::default())),
        FencingGuarantee::Linearizable,
    )
    .await;
    assert!(verdict.failed());
    let stale: Vec<_> = verdict.of(Rule::StaleCheck).collect();
    assert!(!stale.is_empty(), "{:#?}", verdict.findings);
    assert!(stale.iter().all(|f| f.judgement == Judgement::Violation));
    assert!(verdict.stats.writes_rejected > 0, "{:?}", verdict.stats);
    let table = distlock_check::report::markdown("careless", &verdict);
    assert!(
        table.contains("| valid_until/is_lost turn before a newer holder acquires | **FAIL** |"),
        "{table}"
    );
    let svg = distlock_check::report::svg("careless", &history, &verdict).expect("draws");
    assert!(
        svg.starts_with("<svg") && svg.contains("violation"),
        "{svg}"
    );
}

/// Short sections (3 steps of 40 ms) under a 300 ms ttl.
fn params(kind: CheckKind, sabotage: Option<Sabotage>) -> WorkerParams {
    WorkerParams {
        id: 0,
        name: "in-process".into(),
        kind,
        sabotage,
        ttl: Duration::from_millis(300),
        lock_delay: Duration::ZERO,
        wait: Duration::from_secs(5),
        steps: 3,
        step_gap: Duration::from_millis(40),
    }
}

const KINDS: [CheckKind; 7] = [
    CheckKind::Exclusive,
    CheckKind::Shared,
    CheckKind::Permits(2),
    CheckKind::RwMix,
    CheckKind::Upgradeable,
    CheckKind::Election,
    CheckKind::Multi,
];

#[tokio::test]
async fn every_kind_passes_on_the_memory_backend() {
    let runs = KINDS.map(|kind| async move {
        let lock = MemoryStore::new().client();
        let (history, verdict) = run_with(
            lock,
            FencingGuarantee::Linearizable,
            params(kind, None),
            Duration::from_millis(1500),
        )
        .await;
        (kind, history, verdict)
    });
    for (kind, history, verdict) in futures::future::join_all(runs).await {
        assert!(!verdict.failed(), "{kind}: {:#?}", verdict.findings);
        assert!(verdict.stats.acquired >= 8, "{kind}: {:?}", verdict.stats);
        match kind {
            CheckKind::Multi => assert!(
                history
                    .acquisitions
                    .iter()
                    .filter(|a| a.acquired())
                    .all(|a| a.parts.len() == 2),
                "{kind}"
            ),
            CheckKind::Election => {
                let terms: Vec<_> = history.observations.iter().filter_map(|o| o.term).collect();
                assert!(terms.len() >= 4, "{kind}: {:?}", history.observations);
                // Leaders proclaimed, observers saw it: the proclaim-term rule had values.
                assert!(
                    history
                        .observations
                        .iter()
                        .any(|o| o.value.as_deref().is_some_and(|v| v.contains('#'))),
                    "{kind}: no proclaimed value observed: {:?}",
                    history.observations
                );
            }
            CheckKind::Upgradeable => {
                // Upgrades (to a writer) and downgrades (to a reader) happened: the
                // no-writer-between rule had pairs to judge.
                let changed = |mode| {
                    history
                        .acquisitions
                        .iter()
                        .filter(|a| a.acquired() && a.after.is_some() && a.mode == mode)
                        .count()
                };
                assert!(
                    changed(distlock_check::Mode::Exclusive) >= 1
                        && changed(distlock_check::Mode::Shared) >= 1,
                    "{kind}: {:#?}",
                    history.acquisitions
                );
            }
            _ => {}
        }
        // Every holder of a kind with concurrent holders overlapped another at least once:
        // the run exercised what the rule judges.
        if matches!(kind, CheckKind::Shared | CheckKind::Permits(_)) {
            let rw = CheckConfig {
                kind: CheckKind::Permits(1),
                guarantee: FencingGuarantee::Linearizable,
                fifo: true,
                settle: 2_000_000_000,
                max_gap: 1_000_000_000,
                renew_every: 333_000_000,
                wall_clock_leases: false,
                lock_delay: 0,
            };
            let mut as_one = history.clone();
            for a in &mut as_one.acquisitions {
                a.mode = distlock_check::Mode::Permit;
            }
            assert!(
                check(&as_one, &rw).of(Rule::Overlap).count() > 0,
                "{kind}: holders never overlapped"
            );
        }
    }
}

/// Each deliberate bug of the workers is found by the rule it should trip.
#[tokio::test]
async fn every_sabotage_is_caught_by_its_rule() {
    let cases = [
        (
            CheckKind::Exclusive,
            Sabotage::IgnoreValidity,
            Rule::StaleCheck,
        ),
        (
            CheckKind::Exclusive,
            Sabotage::IgnoreValidity,
            Rule::Overlap,
        ),
        (CheckKind::Election, Sabotage::IgnoreValidity, Rule::Overlap),
        (CheckKind::Permits(2), Sabotage::ExtraPermit, Rule::Overlap),
        (CheckKind::RwMix, Sabotage::WriterAsReader, Rule::Overlap),
        (CheckKind::Multi, Sabotage::PartialMulti, Rule::AllOrNone),
        (
            CheckKind::Upgradeable,
            Sabotage::UpgradeByRelease,
            Rule::NoWriterBetween,
        ),
    ];
    let runs = cases.map(|(kind, sabotage, rule)| async move {
        let mut p = params(kind, Some(sabotage));
        if sabotage == Sabotage::IgnoreValidity {
            // Sections of 500 ms under a 300 ms ttl that is never renewed.
            (p.steps, p.step_gap) = (5, Duration::from_millis(100));
        }
        let lock = MemoryStore::new().client();
        let (_, verdict) = run_with(
            lock,
            FencingGuarantee::Linearizable,
            p,
            Duration::from_millis(2000),
        )
        .await;
        (kind, sabotage, rule, verdict)
    });
    for (kind, sabotage, rule, verdict) in futures::future::join_all(runs).await {
        let found: Vec<_> = verdict.of(rule).collect();
        assert!(
            !found.is_empty(),
            "{kind} with {sabotage:?}: no {rule:?} finding in {:#?}",
            verdict.findings
        );
        assert!(found.iter().all(|f| f.judgement == Judgement::Violation));
        assert!(verdict.failed());
    }
}

/// A backend whose lease outlives its release: granted locks stay on the "server" with a full
/// ttl left (the renewal that raced the release and won), as inspect shows.
#[derive(Debug, Default)]
struct Undying {
    tokens: Arc<AtomicU64>,
    last: Arc<std::sync::Mutex<Option<(String, u64)>>>,
}

struct GrantedTo {
    tokens: Arc<AtomicU64>,
    last: Arc<std::sync::Mutex<Option<(String, u64)>>>,
    owner: String,
}

#[async_trait]
impl Attempt for GrantedTo {
    async fn poll(&mut self) -> Result<Step> {
        let token = self.tokens.fetch_add(1, Ordering::SeqCst) + 1;
        *self.last.lock().expect("not poisoned") = Some((self.owner.clone(), token));
        Ok(Step::Acquired(Acquired::new(
            Box::new(NoLease),
            FencingToken::new(token),
        )))
    }
    async fn abandon(self: Box<Self>) -> Result<()> {
        Ok(())
    }
}

#[async_trait]
impl LockBackend for Undying {
    fn name(&self) -> &'static str {
        "undying"
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities::new(FencingGuarantee::Linearizable)
    }
    fn begin(&self, request: AcquireRequest) -> Box<dyn Attempt> {
        Box::new(GrantedTo {
            tokens: self.tokens.clone(),
            last: self.last.clone(),
            owner: request.owner.to_string(),
        })
    }
    async fn inspect(&self, _name: &distlock_core::LockName) -> Result<Option<LockInfo>> {
        Ok(self
            .last
            .lock()
            .expect("not poisoned")
            .clone()
            .map(|(owner, token)| {
                LockInfo::new(
                    owner,
                    Some(FencingToken::new(token)),
                    Some(Duration::from_secs(1)),
                )
            }))
    }
}

#[tokio::test]
async fn a_lease_that_outlives_its_release_is_caught() {
    // Every acquisition is granted at once, and inspect shows the latest grant: half a ttl
    // after its release, a worker often still finds its own.
    let p = params(CheckKind::Exclusive, None);
    let lock: Arc<dyn DistributedLock> = Arc::new(LockClient::new(Undying::default()));
    let (history, verdict) = run_with(
        lock,
        FencingGuarantee::Linearizable,
        p,
        Duration::from_millis(1500),
    )
    .await;
    assert!(!history.extensions.is_empty(), "{history:#?}");
    assert!(verdict.of(Rule::RenewedAfterRelease).count() > 0);
    assert!(verdict.failed());
}
