//! The shared conformance suite against a single etcd member, a 3-member cluster, and a single
//! member over mutual TLS with authentication (`etcd-tls`: client certificates required, user
//! root, auth tokens expiring after 10 s idle, so the suite also runs through token refreshes).

mod common;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use common::{Etcd, OP_TIMEOUT, service};
use conformance_tests::{Harness, HookError, HookResult, TestClient, server_var};
use distlock_core::Error;
use distlock_etcd::EtcdConfig;
use distlock_etcd::etcd_client::GetOptions;

struct EtcdHarness {
    etcd: Etcd,
    /// Which members `stop_server` stops: the single member, or two of three (quorum lost).
    outage: Vec<&'static str>,
    slack: Duration,
    /// How many locks the "many locks" case holds.
    many_locks: usize,
}

#[async_trait]
impl Harness for EtcdHarness {
    async fn client(&self) -> Result<TestClient, Error> {
        Ok(TestClient {
            lock: self.etcd.client().await?.into_dyn(),
            tag: "etcd".into(),
        })
    }

    /// etcd leases are whole seconds with a 2 s minimum; 3 s leaves 2 s for a renewal round of
    /// the 1000-lock case on a loaded 2-core machine.
    fn ttl(&self) -> Duration {
        Duration::from_secs(3)
    }

    /// 10,000 on the single member (renewed per batch of 100: one keepalive per lease and one
    /// read transaction), 1,000 on the cluster and over TLS to keep the suite quick.
    fn many_locks(&self) -> usize {
        self.many_locks
    }

    /// Lease expiry is checked every 500 ms by the leader, and raft rounds fsync.
    fn slack(&self) -> Duration {
        self.slack
    }

    fn operation_timeout(&self) -> Duration {
        OP_TIMEOUT
    }

    fn process_shared(&self) -> Option<String> {
        Some(self.etcd.prefix.clone())
    }

    async fn remove_lock(&self, name: &str) -> HookResult {
        let range = self.etcd.backend().await.key_range(name);
        let resp = self
            .etcd
            .admin
            .clone()
            .delete(
                range,
                Some(distlock_etcd::etcd_client::DeleteOptions::new().with_prefix()),
            )
            .await
            .map_err(|e| HookError::Failed(e.to_string()))?;
        if resp.deleted() == 0 {
            return Err(HookError::Failed(format!("{name:?} was not held")));
        }
        Ok(())
    }

    async fn cut_connection(&self, _client: &TestClient) -> HookResult {
        Err(HookError::Unsupported(
            "etcd cannot drop one client's connections from the server side".into(),
        ))
    }

    async fn stop_server(&self) -> HookResult {
        for member in &self.outage {
            service("stop-one", member)
                .await
                .map_err(HookError::Failed)?;
        }
        Ok(())
    }

    async fn start_server(&self) -> HookResult {
        let mut result = Ok(());
        for member in &self.outage {
            if let Err(e) = service("start-one", member).await {
                result = Err(HookError::Failed(e));
            }
        }
        // Serving again means a quorum answers a linearizable read.
        for _ in 0..100 {
            let mut admin = self.etcd.admin.clone();
            let read = admin.get("distlock-probe", Some(GetOptions::new().with_count_only()));
            if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(1), read).await {
                return result;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(HookError::Failed("etcd did not serve after restart".into()))
    }
}

async fn single() -> Option<Arc<dyn Harness>> {
    let endpoints = server_var("etcd", "DISTLOCK_TEST_ETCD_ENDPOINTS")?;
    Some(Arc::new(EtcdHarness {
        etcd: Etcd::new(&endpoints, vec!["etcd"]).await,
        outage: vec!["etcd"],
        slack: Duration::from_millis(1000),
        many_locks: conformance_tests::SCALE_LOCKS,
    }))
}

async fn cluster() -> Option<Arc<dyn Harness>> {
    let endpoints = server_var("etcd", "DISTLOCK_TEST_ETCD_CLUSTER_ENDPOINTS")?;
    let members = vec!["etcd-cluster-1", "etcd-cluster-2", "etcd-cluster-3"];
    Some(Arc::new(EtcdHarness {
        etcd: Etcd::new(&endpoints, members).await,
        outage: vec!["etcd-cluster-3", "etcd-cluster-2"],
        slack: Duration::from_millis(1500),
        many_locks: 1000,
    }))
}

async fn tls() -> Option<Arc<dyn Harness>> {
    let url = server_var("etcd", "DISTLOCK_TEST_ETCD_TLS_URL")?;
    let config = EtcdConfig::from_url(&url)
        .unwrap_or_else(|err| panic!("DISTLOCK_TEST_ETCD_TLS_URL: {err}"));
    Some(Arc::new(EtcdHarness {
        etcd: Etcd::with_config(config, vec!["etcd-tls"]).await,
        outage: vec!["etcd-tls"],
        slack: Duration::from_millis(1000),
        many_locks: 1000,
    }))
}

conformance_tests::conformance_suite!(etcd, crate::single);
conformance_tests::conformance_suite!(etcd_tls, crate::tls, transport_variant);
conformance_tests::conformance_suite!(etcd_cluster, crate::cluster);
