//! Several workers contend for one lock; each prints the fencing token it got.
//!
//! `cargo run -p distlock-examples --example quickstart` (embedded SQLite, no server), or with
//! `DISTLOCK_URL=redis://127.0.0.1:16379` and the `distlock` feature for that backend.

use std::time::Duration;

use distlock::AcquireOptions;

#[tokio::main]
async fn main() -> Result<(), distlock::Error> {
    let url = distlock_examples::url_or_default("quickstart");
    let opts = AcquireOptions::default()
        .with_ttl(Duration::from_secs(10))
        .with_wait(Duration::from_secs(30));
    let mut workers = Vec::new();
    for worker in 0..4 {
        // Each worker is its own client, as separate processes would be.
        let locks = distlock::connect(&url).await?;
        let opts = opts.clone();
        workers.push(tokio::spawn(async move {
            for round in 0..3 {
                let guard = locks.acquire("quickstart", &opts).await?;
                println!(
                    "worker {worker} round {round}: holding the lock with fencing token {}",
                    guard.token()
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
                guard.release().await?;
            }
            Ok::<(), distlock::Error>(())
        }));
    }
    for worker in workers {
        worker.await.expect("worker panicked")?;
    }
    println!("done: tokens strictly increased across all workers ({url})");
    Ok(())
}
