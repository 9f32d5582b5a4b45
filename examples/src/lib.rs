//! Runnable examples of distlock; see the files next to this crate's `Cargo.toml`:
//!
//! - `quickstart.rs`: several workers contend for one lock on the embedded SQLite default and
//!   print their fencing tokens (`cargo run -p distlock-examples --example quickstart`);
//! - `singleton_job.rs`: only one instance of a periodic job runs at a time, and `lost()`
//!   cancels the work the moment the lock may be gone;
//! - `fenced_write.rs`: a write to PostgreSQL that a paused former holder cannot overwrite;
//! - `metrics_prometheus.rs`: distlock's metrics through the Prometheus exporter, checked.
//!
//! Every example takes the lock service URL from `DISTLOCK_URL` (default: a SQLite file).

/// The URL the examples use: `DISTLOCK_URL`, or a SQLite file named after the example.
pub fn url_or_default(example: &str) -> String {
    std::env::var("DISTLOCK_URL").unwrap_or_else(|_| format!("sqlite://{example}.db"))
}

/// What the holders of one lock saw, recorded under the lock: the tokens in the order the lock
/// was held, and whether two holders ever overlapped. The examples check it rather than claim it.
#[derive(Debug, Default)]
pub struct Holds {
    tokens: Vec<u64>,
    inside: usize,
    overlaps: usize,
}

impl Holds {
    /// A holder entered its critical section with `token`.
    pub fn enter(&mut self, token: u64) {
        self.inside += 1;
        if self.inside > 1 {
            self.overlaps += 1;
        }
        self.tokens.push(token);
    }

    /// The holder left its critical section.
    pub fn leave(&mut self) {
        self.inside = self.inside.saturating_sub(1);
    }

    /// The tokens in the order the lock was held.
    pub fn tokens(&self) -> &[u64] {
        &self.tokens
    }

    /// Checks that no two holders overlapped and that every token was larger than the one before.
    ///
    /// # Errors
    /// A message naming the first violation.
    pub fn check(&self) -> Result<(), String> {
        if self.overlaps > 0 {
            return Err(format!(
                "{} times two holders held the lock at once",
                self.overlaps
            ));
        }
        match self.tokens.windows(2).find(|w| w[1] <= w[0]) {
            Some(w) => Err(format!(
                "fencing token {} came after {}: tokens did not strictly increase",
                w[1], w[0]
            )),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Holds;

    fn holds(tokens: &[u64]) -> Holds {
        let mut holds = Holds::default();
        for &token in tokens {
            holds.enter(token);
            holds.leave();
        }
        holds
    }

    #[test]
    fn the_check_refuses_what_the_example_must_not_claim() {
        assert!(holds(&[3, 4, 9]).check().is_ok());
        assert!(
            holds(&[3, 3])
                .check()
                .unwrap_err()
                .contains("did not strictly increase")
        );
        assert!(holds(&[5, 4]).check().is_err());
        let mut overlapping = Holds::default();
        overlapping.enter(1);
        overlapping.enter(2);
        assert!(overlapping.check().unwrap_err().contains("at once"));
    }
}
