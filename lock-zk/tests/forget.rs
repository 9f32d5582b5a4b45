//! Issue 42, store growth under churn: names acquired and released once each leave no
//! holder or waiter node; their lock nodes are containers, which the server removes on its
//! own (every `znode.container.checkIntervalMs`, 60 s by default, at most
//! `znode.container.maxPerMinute`, 10,000, a minute; see the README's "Growth curves").

use std::time::Duration;

use conformance_tests::churn::{self, churn};
use distlock_core::{ClientConfig, DistributedLock};

#[tokio::test(flavor = "multi_thread")]
async fn churned_names_leave_only_containers() {
    let Some(connect) = conformance_tests::server_var("zookeeper", "DISTLOCK_TEST_ZK_CONNECT")
    else {
        return;
    };
    let config = ClientConfig::default().with_operation_timeout(Duration::from_secs(5));
    let client = distlock_zookeeper::connect(&format!("zk://{connect}"), config)
        .await
        .unwrap();
    let prefix = churn::prefix();
    let opts = churn::options();
    let names = churn(&client, &prefix, 200, &opts).await;
    let left = client.footprint(&prefix).await.unwrap().unwrap();
    assert_eq!(left.count("queue nodes"), 0, "{left}");
    assert!(left.count("lock nodes") <= names as u64, "{left}");
    let name = format!("{prefix}held");
    let held = client.acquire(&name, &opts).await.unwrap();
    let one = client.footprint(&name).await.unwrap().unwrap();
    let counts = (one.count("lock nodes"), one.count("queue nodes"));
    assert_eq!(counts, (1, 1), "{one}");
    held.release().await.unwrap();
}
