//! Several workers contend for one lock; each records the fencing token it got, and the example
//! checks (not just claims) that the tokens strictly increased in the order the lock was held.
//!
//! `cargo run -p distlock-examples --example quickstart` (embedded SQLite, no server), or with
//! `DISTLOCK_URL=redis://127.0.0.1:16379` and the `distlock` feature for that backend. It exits
//! with an error if two workers held the lock at once or a token did not increase.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock::AcquireOptions;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = distlock_examples::url_or_default("quickstart");
    let opts = AcquireOptions::default()
        .with_ttl(Duration::from_secs(10))
        .with_wait(Duration::from_secs(30));
    // What every holder saw, in the order the lock was held: written only under the lock.
    let holds = Arc::new(Mutex::new(distlock_examples::Holds::default()));
    let mut workers = Vec::new();
    for worker in 0..4 {
        // Each worker is its own client, as separate processes would be.
        let locks = distlock::connect(&url).await?;
        let (opts, holds) = (opts.clone(), Arc::clone(&holds));
        workers.push(tokio::spawn(async move {
            for round in 0..3 {
                let guard = locks.acquire("quickstart", &opts).await?;
                let token = guard.token().get();
                holds.lock().expect("poisoned").enter(token);
                println!(
                    "worker {worker} round {round}: holding the lock with fencing token {token}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
                holds.lock().expect("poisoned").leave();
                guard.release().await?;
            }
            Ok::<(), distlock::Error>(())
        }));
    }
    for worker in workers {
        worker.await??;
    }
    let holds = holds.lock().expect("poisoned");
    holds.check()?;
    println!(
        "checked: {} holds, never two at once, tokens strictly increased ({url})",
        holds.tokens().len()
    );
    Ok(())
}
