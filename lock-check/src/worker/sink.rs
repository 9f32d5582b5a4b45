//! Where the events of the workers go: a [`Recorder`] assembling a history in memory, or
//! stdout as JSON lines.

use super::*;

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

    /// Since when `worker` holds a guard (`None`: it does not).
    pub fn holds(&self, worker: u32) -> Option<Nanos> {
        unpoisoned(&self.state).holding.get(&worker).copied()
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
            Event::Invoke {
                seq,
                t,
                mode,
                locks,
                after,
            } => {
                let id = AcqId { worker, seq };
                state.index.insert(id, state.history.acquisitions.len());
                state.history.acquisitions.push(Acquisition {
                    id,
                    mode,
                    locks,
                    after,
                    invoked: t,
                    ..Acquisition::default()
                });
            }
            Event::Acquired {
                seq,
                t,
                token,
                valid_until,
                parts,
            } => {
                if let Some(a) = state.acquisition(worker, seq) {
                    (a.returned, a.token, a.valid_until, a.parts) =
                        (Some(t), Some(token), Some(valid_until), parts);
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
            Event::Extended {
                seq,
                t,
                lock,
                remaining_ms,
            } => state.history.extensions.push(Extension {
                acq: AcqId { worker, seq },
                at: t,
                lock,
                remaining_ms,
            }),
            // The fault it belongs to records it.
            Event::Aimed { .. } => {}
            Event::Observed { t, term, value } => {
                state.history.observations.push(Observation {
                    worker,
                    at: t,
                    term,
                    value,
                });
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
