//! Store growth under churn (issue 42): many names acquired and released once each, and
//! what the server keeps for them afterwards, for each backend's own tests.

use std::time::{Duration, Instant};

use distlock_core::{AcquireOptions, DistributedLock, Footprint, LockKind};

/// The options of the churn tests: a 5 s lease, waiting up to 10 s.
pub fn options() -> AcquireOptions {
    AcquireOptions::default()
        .with_ttl(Duration::from_secs(5))
        .with_wait(Duration::from_secs(10))
}

/// A name prefix of its own for one churn test: `forget-<uuid>/`.
pub fn prefix() -> String {
    format!("forget-{}/", uuid::Uuid::new_v4().simple())
}

/// Acquires and releases `{prefix}{i}` for each i below `names`, one after another, then
/// `{prefix}shared` as a shared hold and `{prefix}permit` as a permit of 2 where the backend
/// has those kinds. Returns how many names it used.
///
/// # Panics
/// When an acquisition or a release fails.
pub async fn churn(
    client: &dyn DistributedLock,
    prefix: &str,
    names: usize,
    options: &AcquireOptions,
) -> usize {
    for i in 0..names {
        let guard = client
            .acquire(&format!("{prefix}{i}"), options)
            .await
            .unwrap();
        guard.release().await.unwrap();
    }
    let caps = client.capabilities().clone();
    let mut kinds = Vec::new();
    if caps.shared {
        kinds.push(("shared", LockKind::Shared));
    }
    if caps.max_permits >= 2 {
        kinds.push(("permit", LockKind::Permit { permits: 2 }));
    }
    for (name, kind) in &kinds {
        let options = options.clone().with_kind(*kind);
        let guard = client
            .acquire(&format!("{prefix}{name}"), &options)
            .await
            .unwrap();
        guard.release().await.unwrap();
    }
    names + kinds.len()
}

/// What the server keeps for `prefix`, as soon as `done` says so, or after `within` (then
/// as it was last), read every 100 ms.
///
/// # Panics
/// When the backend cannot count, or the count fails.
pub async fn footprint_until(
    client: &dyn DistributedLock,
    prefix: &str,
    within: Duration,
    done: impl Fn(&Footprint) -> bool,
) -> Footprint {
    let deadline = Instant::now() + within;
    loop {
        let footprint = client
            .footprint(prefix)
            .await
            .unwrap()
            .expect("the backend counts what it keeps");
        if done(&footprint) || Instant::now() >= deadline {
            return footprint;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
