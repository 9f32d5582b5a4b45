//! A periodic job that must run in one instance only, however many copies of this program run:
//! each tick, whoever gets the lock runs the job; `lost()` cancels the work at once if the lock
//! may be gone (renewal refused, server unreachable past the lease).
//!
//! Start it in two terminals: `cargo run -p distlock-examples --example singleton_job`.

use std::time::Duration;

use distlock::{AcquireOptions, Renewal};

#[tokio::main]
async fn main() -> Result<(), distlock::Error> {
    let url = distlock_examples::url_or_default("singleton");
    let locks = distlock::connect(&url).await?;
    let opts = AcquireOptions::default()
        .with_ttl(Duration::from_secs(6))
        // Never hold it longer than a job may take, even if the work hangs.
        .with_renewal(Renewal::auto().max_hold(Duration::from_secs(60)));
    let mut ticks = tokio::time::interval(Duration::from_secs(5));
    for _ in 0..3 {
        ticks.tick().await;
        let Some(guard) = locks.try_acquire("jobs/compact-archive", &opts).await? else {
            println!("another instance runs the job this time");
            continue;
        };
        tokio::select! {
            reason = guard.lost() => {
                eprintln!("lock lost ({reason}): the job was cancelled half-way");
                continue;
            }
            () = job(guard.token().get()) => {}
        }
        guard.release().await?;
    }
    Ok(())
}

/// The protected work; the fencing token goes with every write it makes.
async fn job(token: u64) {
    println!("running the job with fencing token {token}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    println!("job done");
}
