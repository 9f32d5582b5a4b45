//! The worker loop, the recorder and the checker together, with workers as tasks of this
//! process: a correct backend (the in-memory one) shows no violation, a deliberately broken one
//! (every acquisition succeeds, whoever holds the lock) is caught.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use distlock_check::{
    CheckConfig, FencedRegister, FinalAcquire, History, Judgement, Recorder, Rule, Verdict, Worker,
    WorkerEnd, WorkerParams, check, history::now, work,
};
use distlock_core::backend::{AcquireRequest, Acquired, Attempt, Lease, LockBackend, Step};
use distlock_core::memory::MemoryStore;
use distlock_core::{
    AcquireOptions, Capabilities, DistributedLock, FencingGuarantee, FencingToken, LockClient,
    Result,
};

async fn run(lock: Arc<dyn DistributedLock>, guarantee: FencingGuarantee) -> (History, Verdict) {
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
            tokio::spawn(async move {
                let params = WorkerParams {
                    id,
                    name: "in-process".into(),
                    ttl: Duration::from_secs(1),
                    wait: Duration::from_secs(5),
                    steps: 3,
                    step_gap: Duration::from_millis(5),
                };
                work(&*lock, &params, &*register, &*recorder, stopped).await
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let end = now();
    stop.send(true).expect("workers listen");
    for task in tasks {
        task.await
            .expect("no panic")
            .expect("the register is in memory");
    }
    let invoked = now();
    let last = lock
        .acquire(
            "in-process",
            &AcquireOptions::default().with_wait(Duration::from_secs(5)),
        )
        .await;
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
        guarantee,
        settle: 2_000_000_000,
        max_gap: 1_000_000_000,
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
