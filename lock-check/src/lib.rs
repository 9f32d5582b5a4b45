//! The distlock fault checker: does a lock deployment keep its promises under process pauses,
//! crashes, client partitions and server restarts?
//!
//! A run (driven by `distlock check`) has worker processes loop on one lock of one
//! [`CheckKind`] (a mutex, readers, a read-write mix, a semaphore, an election, multi-locks):
//! acquire, then a critical section of several steps, each step first checking
//! `!guard.is_lost() && now < guard.valid_until()` and then writing `(token, worker, step)` to
//! a [`FencedRegister`] kept by the checking process; release. A nemesis pauses, kills and
//! partitions workers, restarts the server and steps its wall clock meanwhile. Every event is stamped with
//! `CLOCK_MONOTONIC` ([`history::now`]), which all processes on one machine share, and merged
//! into one [`History`]; [`check`] then judges it against the backend's declared
//! [`FencingGuarantee`](distlock_core::FencingGuarantee).
//!
//! ```
//! use distlock_check::{
//!     AcqId, Acquisition, CheckConfig, CheckKind, FencedRegister, History, Rule, check,
//! };
//! use distlock_core::FencingGuarantee;
//!
//! // Two holders in turn; the first wakes up from a pause after the second took over, its
//! // check notices that its deadline passed, and a write it had already checked for is
//! // refused by the register.
//! let (a, b) = (AcqId { worker: 0, seq: 0 }, AcqId { worker: 1, seq: 0 });
//! let register = FencedRegister::new();
//! assert!(register.write_at(a, 10, 0, 150));
//! assert!(register.write_at(b, 11, 0, 450));
//! assert!(!register.write_at(a, 10, 1, 500));
//! let held = |id, invoked, returned, token, until| Acquisition {
//!     id, invoked, returned: Some(returned), token: Some(token), valid_until: Some(until),
//!     ..Acquisition::default()
//! };
//! let history = History {
//!     start: 0,
//!     end: 1_000,
//!     acquisitions: vec![held(a, 0, 100, 10, 300), held(b, 120, 400, 11, 900)],
//!     writes: register.writes(),
//!     ..History::default()
//! };
//! let config = CheckConfig {
//!     kind: CheckKind::Exclusive,
//!     guarantee: FencingGuarantee::Linearizable,
//!     fifo: true,
//!     settle: 0,
//!     max_gap: 1_000_000,
//!     renew_every: 100,
//!     wall_clock_leases: false,
//!     lock_delay: 0,
//! };
//! let verdict = check(&history, &config);
//! assert_eq!(verdict.stats.writes_rejected, 1);
//! assert!(verdict.of(Rule::TokenOrder).next().is_none());
//! ```

pub mod checker;
pub mod history;
pub mod kind;
pub mod proxy;
pub mod register;
pub mod report;
pub mod run;
pub mod worker;

pub use checker::{CheckConfig, Finding, Judgement, Rule, Stats, Verdict, check};
pub use history::{
    AcqId, Acquisition, Check, ClockSteps, Fault, FaultKind, FinalAcquire, History, Nanos,
    Observation, Part, Worker, WorkerEnd, Write,
};
pub use kind::{CheckKind, Mode, Sabotage};
pub use register::{Access, FencedRegister, RemoteRegister};
pub use run::{RunConfig, RunError, Spawner, run, set_clock};
pub use worker::{
    AIM_WAIT, Aim, Event, NoAim, Op, Recorder, Register, Sink, StdinAim, StdoutSink, WorkerParams,
    work,
};
