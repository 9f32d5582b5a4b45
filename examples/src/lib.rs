//! Runnable examples of distlock; see the files next to this crate's `Cargo.toml`:
//!
//! - `quickstart.rs`: several workers contend for one lock on the embedded SQLite default and
//!   print their fencing tokens (`cargo run -p distlock-examples --example quickstart`);
//! - `singleton_job.rs`: only one instance of a periodic job runs at a time, and `lost()`
//!   cancels the work the moment the lock may be gone;
//! - `fenced_write.rs`: a write to PostgreSQL that a paused former holder cannot overwrite.
//!
//! Every example takes the lock service URL from `DISTLOCK_URL` (default: a SQLite file).

/// The URL the examples use: `DISTLOCK_URL`, or a SQLite file named after the example.
pub fn url_or_default(example: &str) -> String {
    std::env::var("DISTLOCK_URL").unwrap_or_else(|_| format!("sqlite://{example}.db"))
}
