//! Issue 42, store growth under churn: names acquired and released once each leave no key
//! under the prefix (each acquisition's keys are deleted with its release; tokens are the
//! cluster's revisions, which need no key per name). What etcd keeps is its history of those
//! keys until a compaction (see the README's "Growth curves").

use std::time::Duration;

use conformance_tests::churn::{self, churn};
use distlock_core::{ClientConfig, DistributedLock};

#[tokio::test(flavor = "multi_thread")]
async fn churned_names_leave_no_keys() {
    let Some(endpoints) = conformance_tests::server_var("etcd", "DISTLOCK_TEST_ETCD_ENDPOINTS")
    else {
        return;
    };
    let hosts: Vec<&str> = endpoints
        .split(',')
        .map(|e| e.trim().trim_start_matches("http://"))
        .collect();
    let config = ClientConfig::default().with_operation_timeout(Duration::from_secs(5));
    let client = distlock_etcd::connect(&format!("etcd://{}", hosts.join(",")), config)
        .await
        .unwrap();
    let prefix = churn::prefix();
    let opts = churn::options();
    let names = churn(&client, &prefix, 200, &opts).await;
    let left = client.footprint(&prefix).await.unwrap().unwrap();
    assert_eq!(left.objects(), 0, "left behind by {names} names: {left}");
    // The count sees keys: one held lock is one key.
    let held = client
        .acquire(&format!("{prefix}held"), &opts)
        .await
        .unwrap();
    let one = client.footprint(&prefix).await.unwrap().unwrap();
    assert_eq!(one.objects(), 1, "{one}");
    held.release().await.unwrap();
}
