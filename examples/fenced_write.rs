//! A fenced write against PostgreSQL: a holder that paused past its lease cannot overwrite the
//! work of the holder after it, because the row remembers the highest fencing token that wrote
//! it.
//!
//! ```sh
//! eval "$(scripts/services.sh start)"
//! DISTLOCK_URL=$DISTLOCK_TEST_POSTGRES_URL \
//!   cargo run -p distlock-examples --features postgres --example fenced_write
//! ```

use std::time::Duration;

use distlock::sql::{FencedUpdate, SqlPool, sqlx};
use distlock::{AcquireOptions, ClientConfig, DistributedLock, Renewal};

#[tokio::main]
async fn main() -> Result<(), distlock::Error> {
    let url = std::env::var("DISTLOCK_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:15432/distlock".to_owned());
    let paused = distlock::sql::connect(&url, ClientConfig::default()).await?;
    let next = distlock::sql::connect(&url, ClientConfig::default()).await?;

    // The protected resource: a row with a fence column next to its data.
    let SqlPool::Postgres(pool) = paused.backend_ref().pool() else {
        return Err(distlock::Error::InvalidConfig(
            "this example needs a postgres:// URL".into(),
        ));
    };
    let setup = async {
        sqlx::query("CREATE TABLE IF NOT EXISTS example_accounts (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL, fence BIGINT)")
            .execute(&pool)
            .await?;
        sqlx::query(
            "INSERT INTO example_accounts VALUES (7, 100, NULL) ON CONFLICT (id) DO NOTHING",
        )
        .execute(&pool)
        .await
    };
    setup
        .await
        .map_err(|e| distlock::Error::backend("creating the example table", e))?;

    let short = AcquireOptions::default()
        .with_ttl(Duration::from_secs(1))
        .with_renewal(Renewal::disabled());
    let first = paused.acquire("account-7", &short).await?;
    println!(
        "holder A got token {}, then pauses (GC, SIGSTOP, slow network)...",
        first.token()
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;

    let second = next
        .acquire("account-7", &AcquireOptions::default())
        .await?;
    let write = FencedUpdate::new("example_accounts", "id", 7, "fence").set("balance", 200);
    let applied = next
        .backend_ref()
        .fenced_update(&write, second.token())
        .await?;
    println!(
        "holder B (token {}) writes balance 200: applied = {applied}",
        second.token()
    );

    // A wakes up, unaware that its lease ran out, and writes with its old token.
    let late = FencedUpdate::new("example_accounts", "id", 7, "fence").set("balance", 0);
    let applied = paused
        .backend_ref()
        .fenced_update(&late, first.token())
        .await?;
    println!(
        "holder A (token {}) writes balance 0 late: applied = {applied} (refused by the fence)",
        first.token()
    );
    assert!(
        !applied,
        "a stale token must not overwrite the newer holder's write"
    );

    second.release().await?;
    let _ = first.release().await; // NotHeld: A's lease had expired.
    Ok(())
}
