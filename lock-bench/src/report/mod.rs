//! Results: serializable structures and the Markdown rendering.

use std::fmt::Write as _;

use serde::Serialize;

use crate::uncontended::PAUSED_CYCLES;
use crate::{BenchConfig, GrowthResult, LatencySummary, S1Call};

mod markdown;

/// Everything one [`run`](crate::run) measured, with its parameters.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct Report {
    /// `lock-bench` and its version, to tell report formats apart.
    pub tool: String,
    /// The scenario parameters (durations in milliseconds).
    pub config: BenchConfig,
    /// The tokio runtime flavour the run was measured on: `current_thread` or `multi_thread`.
    pub runtime: String,
    /// One entry per target, in the order given.
    pub targets: Vec<TargetResult>,
}

/// The results of one target.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct TargetResult {
    /// The target's label.
    pub target: String,
    /// The backend name its clients report ([`DistributedLock::backend`](distlock_core::DistributedLock::backend)),
    /// once a client was created.
    pub backend: Option<String>,
    /// The raw floor, if the target has one and it ran without error.
    pub floor: Option<FloorResult>,
    /// Why the target has a raw floor but S1 and S2 were measured without it
    /// ([`RawFloor::unfit`](crate::RawFloor::unfit)).
    pub no_floor: Option<String>,
    /// The fenced raw floor ([`Target::with_fenced_floor`](crate::Target::with_fenced_floor)),
    /// measured interleaved with S1 and the raw floor, if the target has one.
    pub fenced_floor: Option<FloorResult>,
    /// S1, if selected and successful.
    pub uncontended: Option<S1Result>,
    /// S2, if selected and successful.
    pub contended: Option<S2Result>,
    /// The contended floor (S2's loop on the server's own blocking lock, measured just before
    /// S2), if the target has one and S2 is selected.
    pub contended_floor: Option<ContendedFloorResult>,
    /// The fenced contended floor
    /// ([`Target::with_fenced_contended_floor`](crate::Target::with_fenced_contended_floor)),
    /// measured right after the contended floor, if the target has one and S2 is selected.
    pub fenced_contended_floor: Option<ContendedFloorResult>,
    /// The read/write mix, if selected, supported and successful.
    pub rw_mix: Option<MixedResult>,
    /// The read/write mix on the contended floors (the server's own lock, shared and
    /// exclusive: [`ContendedFloor::has_shared`](crate::ContendedFloor::has_shared)), measured
    /// just before distlock's, if the target has such a floor, the mix is selected and the
    /// floors' run succeeded (its bound is checked as distlock's: [`Self::violations`]).
    pub rw_floor: Option<FloorMixResult>,
    /// The semaphore, if selected, supported and successful.
    pub semaphore: Option<MixedResult>,
    /// About the most the semaphore can match on this machine and server (a guide, not a
    /// bound): as many distlock mutexes as it has permits (at most its clients), side by side,
    /// the semaphore's clients split among them, measured just before the semaphore, if it is
    /// selected and supported and this run succeeded.
    pub semaphore_mutexes: Option<SideBySideResult>,
    /// The growth scenarios (hold-K, clients-C, names), when selected.
    pub growth: Option<GrowthResult>,
    /// Scenarios not run because the backend lacks the lock kind they need.
    pub skipped: Vec<Skipped>,
    /// What failed: a failing part is reported here and the run goes on with the next part.
    pub errors: Vec<ScenarioError>,
}

/// A scenario that was not run, and why (the backend's
/// [`Capabilities`](distlock_core::Capabilities) lack the lock kind it needs).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Skipped {
    /// `"rw"`, `"semaphore"`, or a growth scenario and its primitive (`"hold rw"`,
    /// `"clients semaphore"`).
    pub scenario: String,
    /// Why, in plain words.
    pub reason: String,
}

impl TargetResult {
    /// Violations of the bound in every scenario, and locks lost in the growth scenarios:
    /// must be 0.
    pub fn violations(&self) -> u64 {
        let s2 = self
            .contended
            .as_ref()
            .map_or(0, |c| c.exclusivity_violations);
        let floor = self.rw_floor.as_ref().map(|f| &f.mix);
        let mixed = [self.rw_mix.as_ref(), self.semaphore.as_ref(), floor]
            .into_iter()
            .flatten()
            .map(|m| m.violations)
            .sum::<u64>()
            + self.semaphore_mutexes.as_ref().map_or(0, |m| m.violations);
        let growth = self.growth.as_ref().map_or(0, |g| {
            let held = g.hold.iter().map(|h| h.lost).sum::<u64>();
            let clients = g
                .clients
                .iter()
                .map(|c| c.s2.exclusivity_violations)
                .sum::<u64>();
            let mixed_clients = g
                .mixed_clients
                .iter()
                .map(|c| c.mixed.violations)
                .sum::<u64>();
            held + clients
                + mixed_clients
                + g.every_names().map(|n| n.lost).sum::<u64>()
                + g.churn.as_ref().map_or(0, |c| c.lost)
        });
        s2 + mixed + growth
    }
}

/// A part of a run that failed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ScenarioError {
    /// `"floor"`, `"s1"`, `"s2"`, `"rw"` or `"semaphore"`.
    pub scenario: String,
    /// The error, displayed with its sources.
    pub message: String,
}

impl ScenarioError {
    /// The error's line, then each cause of its source chain that the line does not already
    /// say (the backends put the short cause in their message; a database error is often its
    /// own source too): one line, each cause once.
    pub(crate) fn new(scenario: &str, error: &distlock_core::Error) -> Self {
        let mut message = error.to_string();
        let mut source = std::error::Error::source(error);
        while let Some(s) = source {
            let cause = s.to_string();
            if !message.contains(&cause) {
                let _ = write!(message, ": {cause}");
            }
            source = s.source();
        }
        Self {
            scenario: scenario.to_owned(),
            message,
        }
    }
}

/// The raw floor, measured with the S1 loop.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct FloorResult {
    /// What a floor cycle does.
    pub label: String,
    /// Measured cycles.
    pub cycles: u64,
    /// Wall time of the measured cycles.
    pub elapsed_ms: f64,
    /// Cycles per second.
    pub ops_per_sec: f64,
    /// Latency of one cycle.
    pub cycle: LatencySummary,
    /// The process's CPU time per measured cycle, in microseconds, as the run's
    /// [`Instruments::cpu_time`](crate::Instruments::cpu_time) gives it (`distlock bench`:
    /// `getrusage`, user + system, every thread), taken around each block of cycles; only the
    /// side whose block runs works then. `None` when the instruments do not measure CPU time
    /// (as with [`run`](crate::run)).
    pub cpu_per_cycle_us: Option<f64>,
    /// Latency of one cycle started after a pause as long as the S2 hold, measured when S2
    /// runs: the state a handoff starts from (client, server and CPUs idle, so every wake-up
    /// costs what it costs at a handoff). Two round trips from idle.
    pub paused_cycle: Option<LatencySummary>,
}

/// S1: one client acquiring and releasing one name, back to back.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct S1Result {
    /// The acquire call timed.
    pub call: S1Call,
    /// Measured cycles.
    pub cycles: u64,
    /// Wall time of the measured cycles.
    pub elapsed_ms: f64,
    /// Acquire + release cycles per second.
    pub ops_per_sec: f64,
    /// Latency of one acquire + release cycle.
    pub cycle: LatencySummary,
    /// CPU time of the whole bench process per measured cycle, as
    /// [`FloorResult::cpu_per_cycle_us`]: what an acquire + release costs the client's CPUs.
    pub cpu_per_cycle_us: Option<f64>,
    /// Latency of the acquire call alone.
    pub acquire: LatencySummary,
    /// Latency of the release call alone.
    pub release: LatencySummary,
    /// `ops_per_sec / floor.ops_per_sec`, when the target has a floor.
    pub floor_ratio: Option<f64>,
    /// `ops_per_sec / fenced_floor.ops_per_sec`, when the target has a fenced floor.
    pub fenced_floor_ratio: Option<f64>,
}

/// Mutexes side by side: the semaphore's clients split among as many names as it has permits
/// (client `i` on name `i` mod names), each name S2's loop on a distlock mutex, all at once.
/// A semaphore of N permits hands a permit over as a mutex hands its lock over, so this is
/// about the most it can match on the same machine (a guide, not a bound): the server and the
/// clients doing N mutexes' work at once.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct SideBySideResult {
    /// The names (mutexes): the semaphore's permits, at most its clients.
    pub names: usize,
    /// The clients, all names together.
    pub clients: usize,
    /// Critical sections of every name whose `acquire` returned inside the measured window.
    pub critical_sections: u64,
    /// `critical_sections` per second of the window.
    pub critical_sections_per_sec: f64,
    /// Each name's critical sections per second, in name order.
    pub per_name: Vec<f64>,
    /// Exclusivity violations on any name (must be 0).
    pub violations: u64,
}

/// S2: several clients contending for one name.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct S2Result {
    /// Contending clients.
    pub clients: usize,
    /// The measured window.
    pub measured_ms: f64,
    /// Critical sections whose `acquire` returned inside the measured window.
    pub critical_sections: u64,
    /// `critical_sections` per second of the window.
    pub critical_sections_per_sec: f64,
    /// Handoff latency to ANOTHER client: from the instant just before the holder calls
    /// `release` to the instant the next holder's `acquire` returns. Handoffs back to the same
    /// client are not included.
    pub handoff: LatencySummary,
    /// Handoffs where the next holder was another client.
    pub handoffs_to_other: u64,
    /// Handoffs where the releasing client got the lock again.
    pub handoffs_to_self: u64,
    /// `handoffs_to_other / (handoffs_to_other + handoffs_to_self)`; `None` without handoffs.
    pub handoff_other_share: Option<f64>,
    /// Duration of every `acquire` call in the window, from call to return.
    pub acquire_wait: LatencySummary,
    /// The longest single `acquire` of any client (exact, not histogram-rounded).
    pub longest_wait_us: f64,
    /// Mean time between `acquire` returning and `release` being called (the requested hold
    /// plus timer granularity).
    pub mean_hold_us: f64,
    /// Fraction of the window the lock was held (sum of holds / window): 1 would be perfect
    /// handoffs with no gap.
    pub held_share: f64,
    /// Each client's share of the critical sections.
    pub per_client: Vec<ClientShare>,
    /// The most clients ever inside a critical section at once (must be 1).
    pub max_holders: u64,
    /// Acquisitions that found another client still inside its critical section (must be 0).
    pub exclusivity_violations: u64,
    /// `critical_sections_per_sec / floor.ops_per_sec`, when the target has a floor.
    pub floor_ratio: Option<f64>,
    /// `handoff.p50_us / floor.paused_cycle.p50_us`, when the target has a floor: at most 1
    /// means a handoff takes at most two round trips of the raw floor started from idle.
    pub handoff_paused_floor_ratio: Option<f64>,
    /// `critical_sections_per_sec` ÷ the contended floor's, when the target has one.
    pub contended_floor_ratio: Option<f64>,
    /// `handoff.p99_us` ÷ the contended floor's, when the target has one.
    pub handoff_p99_floor_ratio: Option<f64>,
    /// `critical_sections_per_sec` ÷ the fenced contended floor's, when the target has one.
    pub fenced_contended_floor_ratio: Option<f64>,
}

/// The contended floor: S2's loop on the server's own blocking lock.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct ContendedFloorResult {
    /// What the floor does ([`ContendedFloor::label`](crate::ContendedFloor::label)).
    pub label: String,
    /// The same measurements as S2's.
    pub s2: S2Result,
}

/// The read/write mix on the contended floors: the server's own read-write lock.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct FloorMixResult {
    /// What the floor does ([`ContendedFloor::label`](crate::ContendedFloor::label)).
    pub label: String,
    /// The same measurements as distlock's mix.
    pub mix: MixedResult,
}

/// The read/write mix or the semaphore: several clients on one name, several holders at
/// once, with gauges that must stay within the bound.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct MixedResult {
    /// Contending clients.
    pub clients: usize,
    /// The measured window.
    pub measured_ms: f64,
    /// Acquisitions that returned inside the measured window (of every kind).
    pub acquisitions: u64,
    /// `acquisitions` per second of the window.
    pub acquisitions_per_sec: f64,
    /// The exclusive (write) ones among them; 0 for the semaphore.
    pub exclusive_acquisitions: u64,
    /// Duration of every `acquire` call in the window, from call to return.
    pub acquire_wait: LatencySummary,
    /// The read/write mix: the shared acquisitions alone.
    pub shared_wait: Option<LatencySummary>,
    /// The read/write mix: the exclusive acquisitions alone.
    pub exclusive_wait: Option<LatencySummary>,
    /// The read/write mix: from just before a writer's release to the first reader in, for
    /// the readers that were waiting then.
    pub writer_to_readers: Option<LatencySummary>,
    /// The read/write mix: from just before the release of the last reader in to the next
    /// writer in, for the writers that were waiting then (no reader in between).
    pub readers_to_writer: Option<LatencySummary>,
    /// The longest single `acquire` of any client (exact, not histogram-rounded).
    pub longest_wait_us: f64,
    /// Each client's share of the acquisitions.
    pub per_client: Vec<ClientShare>,
    /// The most shared holders (read/write mix) or permit holders (semaphore) at once.
    pub max_holders: u64,
    /// Shared holders (read/write mix) or permits in use (semaphore) on average over the
    /// measured window, weighted by time (each hold counted from its acquisition to its
    /// release's start): how much of its capacity the lock kept in use.
    pub mean_holders: f64,
    /// The read/write mix: the share of the window a writer held the lock.
    pub writer_share: Option<f64>,
    /// The read/write mix: the most exclusive holders at once (must be at most 1).
    pub max_writers: Option<u64>,
    /// The semaphore: its permits, the bound of `max_holders`.
    pub permits: Option<u32>,
    /// Acquisitions that broke the bound (must be 0): a writer with another writer or a
    /// reader, a reader with a writer, more permit holders than permits.
    pub violations: u64,
}

/// One S2 client's part.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct ClientShare {
    /// The client's index, from 0.
    pub client: usize,
    /// Its critical sections in the window.
    pub critical_sections: u64,
    /// Its share of all critical sections in the window.
    pub share: f64,
    /// Its longest single `acquire`.
    pub longest_wait_us: f64,
}

impl Report {
    /// Whether any part failed or any exclusivity (or permit bound) violation was seen.
    pub fn has_failures(&self) -> bool {
        self.targets
            .iter()
            .any(|t| !t.errors.is_empty() || t.violations() > 0)
    }

    /// The report as pretty-printed JSON.
    ///
    /// # Errors
    /// Never in practice (all fields serialize); kept for serde's signature.
    pub fn to_json(&self) -> serde_json::Result<String> {
        serde_json::to_string_pretty(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A database error that is its own source, as sqlx's are.
    #[derive(Debug)]
    struct Db(Option<Box<Db>>);

    impl std::fmt::Display for Db {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("1971 (42000): no such variable")
        }
    }

    impl std::error::Error for Db {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.0.as_deref().map(|d| d as _)
        }
    }

    #[test]
    fn each_cause_is_said_once() {
        let said = distlock_core::Error::Backend {
            message: "acquire failed: 1971 (42000): no such variable".into(),
            source: Some(Box::new(Db(Some(Box::new(Db(None)))))),
        };
        assert_eq!(
            ScenarioError::new("semaphore", &said).message,
            "backend error: acquire failed: 1971 (42000): no such variable"
        );
        let unsaid = distlock_core::Error::Backend {
            message: "acquire failed".into(),
            source: Some(Box::new(Db(None))),
        };
        assert_eq!(
            ScenarioError::new("semaphore", &unsaid).message,
            "backend error: acquire failed: 1971 (42000): no such variable"
        );
    }
}
