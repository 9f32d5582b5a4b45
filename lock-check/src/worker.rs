//! A worker's loop: acquire, a critical section of checked and fenced writes, release.
//!
//! The loop is the same in a worker process of `distlock check` (its events go to stdout as
//! JSON lines, its writes to the checking process's register over TCP) and in a task of an
//! in-process test (events and writes straight to memory).

use std::time::{Duration, Instant};

use async_trait::async_trait;
use distlock_core::{AcquireOptions, DistributedLock, Error};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use distlock_core::backend::unpoisoned;

use crate::history::{AcqId, Acquisition, Check, History, Nanos, at, now};
use crate::register::FencedRegister;

/// What a worker does.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerParams {
    /// Its number.
    pub id: u32,
    /// The lock all workers contend for.
    pub name: String,
    /// The lock's ttl.
    pub ttl: Duration,
    /// How long one `acquire` may wait.
    pub wait: Duration,
    /// Checked writes per critical section.
    pub steps: u32,
    /// The work of each step, between its check and its write.
    pub step_gap: Duration,
}

/// One thing a worker did, as it logs it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "e", rename_all = "kebab-case")]
pub enum Event {
    /// `acquire` called.
    Invoke {
        /// The acquisition's number in this worker.
        seq: u64,
        /// When.
        t: Nanos,
    },
    /// `acquire` returned a guard.
    Acquired {
        /// Which acquisition.
        seq: u64,
        /// When.
        t: Nanos,
        /// Its token.
        token: u64,
        /// Its `valid_until`.
        valid_until: Nanos,
    },
    /// `acquire` returned an error.
    Failed {
        /// Which acquisition.
        seq: u64,
        /// When.
        t: Nanos,
        /// The error.
        error: String,
    },
    /// A check before a write.
    Check {
        /// Which acquisition.
        seq: u64,
        /// Which step.
        step: u32,
        /// When.
        t: Nanos,
        /// Whether the holder still believed it held the lock.
        passed: bool,
    },
    /// `release` called.
    Release {
        /// Which acquisition.
        seq: u64,
        /// When.
        t: Nanos,
    },
}

/// Where a worker's writes go.
#[async_trait]
pub trait Register: Send + Sync {
    /// Writes `step` of `acq` with `token`; whether the register accepted it.
    ///
    /// # Errors
    /// The register cannot be reached (the worker then stops with that error).
    async fn write(&self, acq: AcqId, token: u64, step: u32) -> std::io::Result<bool>;
}

#[async_trait]
impl Register for FencedRegister {
    async fn write(&self, acq: AcqId, token: u64, step: u32) -> std::io::Result<bool> {
        Ok(FencedRegister::write(self, acq, token, step))
    }
}

/// Where a worker's events go.
pub trait Sink: Send + Sync {
    /// Records one event of worker `worker`.
    fn event(&self, worker: u32, event: Event);
}

/// Runs worker `params.id` on `lock` until `stop` turns true (checked between acquisitions; a
/// waiting `acquire` is abandoned at once, a critical section in progress is finished and
/// released).
///
/// # Errors
/// The register failed; lock errors are events, not errors.
pub async fn work(
    lock: &dyn DistributedLock,
    params: &WorkerParams,
    register: &dyn Register,
    sink: &dyn Sink,
    mut stop: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let options = AcquireOptions::default()
        .with_ttl(params.ttl)
        .with_wait(params.wait);
    let id = params.id;
    for seq in 0.. {
        if *stop.borrow() {
            break;
        }
        sink.event(id, Event::Invoke { seq, t: now() });
        let acquired = tokio::select! {
            acquired = lock.acquire(&params.name, &options) => acquired,
            _ = stop.wait_for(|stop| *stop) => break,
        };
        let guard = match acquired {
            Ok(guard) => guard,
            Err(err) => {
                sink.event(
                    id,
                    Event::Failed {
                        seq,
                        t: now(),
                        error: err.to_string(),
                    },
                );
                if !matches!(err, Error::Timeout { .. }) {
                    // Do not spin on a server that refuses at once.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                continue;
            }
        };
        let token = guard.token().get();
        sink.event(
            id,
            Event::Acquired {
                seq,
                t: now(),
                token,
                valid_until: at(guard.valid_until()),
            },
        );
        let acq = AcqId { worker: id, seq };
        for step in 0..params.steps {
            let passed = !guard.is_lost() && Instant::now() < guard.valid_until();
            sink.event(
                id,
                Event::Check {
                    seq,
                    step,
                    t: now(),
                    passed,
                },
            );
            if !passed {
                break;
            }
            // The step's work, done in the belief of holding the lock; a pause here makes the
            // write below late.
            tokio::time::sleep(params.step_gap).await;
            // A refused write ends the section; the register records it.
            if !register.write(acq, token, step).await? {
                break;
            }
        }
        sink.event(id, Event::Release { seq, t: now() });
        // A release that fails (the lock was lost meanwhile) is what the checks are for.
        let _ = guard.release().await;
    }
    Ok(())
}

/// A [`Sink`] that assembles the events of every worker into a [`History`].
#[derive(Debug, Default)]
pub struct Recorder {
    state: std::sync::Mutex<Recorded>,
}

#[derive(Debug, Default)]
struct Recorded {
    history: History,
    index: std::collections::HashMap<AcqId, usize>,
    /// Workers between `Acquired` and `Release`, with when they acquired.
    holding: std::collections::HashMap<u32, Nanos>,
}

impl Recorder {
    /// An empty recorder.
    pub fn new() -> Self {
        Self::default()
    }

    /// The worker that acquired most recently among those that hold a guard now.
    pub fn holder(&self) -> Option<u32> {
        let state = unpoisoned(&self.state);
        state
            .holding
            .iter()
            .max_by_key(|(_, since)| **since)
            .map(|(worker, _)| *worker)
    }

    /// The history so far: acquisitions and checks (writes, faults, workers and the final
    /// acquisition are the caller's to add).
    pub fn history(&self) -> History {
        unpoisoned(&self.state).history.clone()
    }
}

impl Recorded {
    fn acquisition(&mut self, worker: u32, seq: u64) -> Option<&mut Acquisition> {
        let i = *self.index.get(&AcqId { worker, seq })?;
        self.history.acquisitions.get_mut(i)
    }
}

impl Sink for Recorder {
    fn event(&self, worker: u32, event: Event) {
        let mut state = unpoisoned(&self.state);
        let state = &mut *state;
        match event {
            Event::Invoke { seq, t } => {
                let id = AcqId { worker, seq };
                state.index.insert(id, state.history.acquisitions.len());
                state.history.acquisitions.push(Acquisition {
                    id,
                    invoked: t,
                    returned: None,
                    token: None,
                    valid_until: None,
                    error: None,
                    released: None,
                    lost: None,
                });
            }
            Event::Acquired {
                seq,
                t,
                token,
                valid_until,
            } => {
                if let Some(a) = state.acquisition(worker, seq) {
                    (a.returned, a.token, a.valid_until) =
                        (Some(t), Some(token), Some(valid_until));
                }
                state.holding.insert(worker, t);
            }
            Event::Failed { seq, t, error } => {
                if let Some(a) = state.acquisition(worker, seq) {
                    (a.returned, a.error) = (Some(t), Some(error));
                }
            }
            Event::Check {
                seq,
                step,
                t,
                passed,
            } => {
                if let Some(a) = state.acquisition(worker, seq).filter(|_| !passed) {
                    a.lost.get_or_insert(t);
                }
                state.history.checks.push(Check {
                    acq: AcqId { worker, seq },
                    step,
                    at: t,
                    passed,
                });
            }
            Event::Release { seq, t } => {
                if let Some(a) = state.acquisition(worker, seq) {
                    a.released = Some(t);
                }
                state.holding.remove(&worker);
            }
        }
    }
}

/// The [`Sink`] of a worker process: each event one JSON line on stdout, flushed at once (the
/// checking process reads them as they come; a killed worker loses nothing it printed).
#[derive(Debug, Default)]
pub struct StdoutSink;

impl Sink for StdoutSink {
    fn event(&self, _worker: u32, event: Event) {
        use std::io::Write as _;
        if let Ok(line) = serde_json::to_string(&event) {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
        }
    }
}
