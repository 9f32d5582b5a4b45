//! The fenced register: the protected resource of a run.
//!
//! It accepts a write iff its token is at least the largest token it has accepted, as a
//! storage service that honours fencing tokens would (Kleppmann's "How to do distributed
//! locking"). Equal tokens are accepted, so that one holder can write several steps; two
//! holders with one token are caught by the checker instead.

use std::sync::Mutex;

use distlock_core::backend::unpoisoned as state;

use crate::history::{AcqId, Nanos, Write, now};

/// A register that accepts writes in token order and records every write it receives.
#[derive(Debug, Default)]
pub struct FencedRegister {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    largest: Option<u64>,
    writes: Vec<Write>,
}

impl FencedRegister {
    /// An empty register.
    pub fn new() -> Self {
        Self::default()
    }

    /// Receives a write of `step` by `acq` carrying `token`, now; returns whether it was
    /// accepted.
    pub fn write(&self, acq: AcqId, token: u64, step: u32) -> bool {
        self.write_at(acq, token, step, now())
    }

    /// [`write`](Self::write) at a given time (for tests and replays).
    pub fn write_at(&self, acq: AcqId, token: u64, step: u32, at: Nanos) -> bool {
        let mut state = state(&self.state);
        let accepted = state.largest.is_none_or(|largest| token >= largest);
        if accepted {
            state.largest = Some(token);
        }
        state.writes.push(Write {
            acq,
            token,
            step,
            at,
            accepted,
        });
        accepted
    }

    /// The largest token accepted so far.
    pub fn largest(&self) -> Option<u64> {
        state(&self.state).largest
    }

    /// Every write received so far, in the order received.
    pub fn writes(&self) -> Vec<Write> {
        state(&self.state).writes.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: AcqId = AcqId { worker: 0, seq: 0 };
    const B: AcqId = AcqId { worker: 1, seq: 0 };

    #[test]
    fn accepts_in_token_order_and_refuses_older_tokens() {
        let register = FencedRegister::new();
        assert!(register.write_at(A, 5, 0, 1));
        assert!(
            register.write_at(A, 5, 1, 2),
            "one holder writes several steps"
        );
        assert!(register.write_at(B, 7, 0, 3));
        assert!(
            !register.write_at(A, 5, 2, 4),
            "a late write of an older holder"
        );
        assert_eq!(register.largest(), Some(7));
        let accepted: Vec<bool> = register.writes().iter().map(|w| w.accepted).collect();
        assert_eq!(accepted, [true, true, true, false]);
    }
}
