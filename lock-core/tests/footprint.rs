//! Issue 42, store growth under churn: the in-memory store keeps an entry per name only
//! while it is held or awaited; the token counter is one for the whole process.

use std::time::Duration;

use distlock_core::memory::MemoryStore;
use distlock_core::{AcquireOptions, Error};

#[tokio::test]
async fn churned_names_leave_no_entries() {
    let client = MemoryStore::new().client();
    let opts = AcquireOptions::default().with_ttl(Duration::from_secs(5));
    for i in 0..1000 {
        let guard = client.acquire(&format!("churn/{i}"), &opts).await.unwrap();
        guard.release().await.unwrap();
    }
    let held = client.acquire("churn/held", &opts).await.unwrap();
    let footprint = client.footprint("churn/").await.unwrap().unwrap();
    assert_eq!(footprint.objects(), 1, "{footprint}");
    assert_eq!(
        client.footprint("other/").await.unwrap().unwrap().objects(),
        0
    );
    held.release().await.unwrap();
    assert_eq!(client.footprint("").await.unwrap().unwrap().objects(), 0);
    assert!(matches!(
        client.footprint("bad\0prefix").await,
        Err(Error::InvalidName { .. })
    ));
}
