//! The shared conformance suite against a single NATS server, a 3-node JetStream cluster with
//! an R3 bucket, and a single server over mutual TLS with a user and password.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use conformance_tests::{Harness, HookError, HookResult, TestClient, server_var, services};
use distlock_core::backend::LockBackend;
use distlock_core::{ClientConfig, Error, LockName};
use distlock_nats::{NatsBackend, NatsConfig};

const OP_TIMEOUT: Duration = Duration::from_secs(2);

struct NatsHarness {
    config: NatsConfig,
    /// services.sh names of the servers `stop_server` stops (two of three: quorum lost).
    outage: Vec<&'static str>,
    many_locks: usize,
}

impl NatsHarness {
    fn new(url: &str, outage: Vec<&'static str>, many_locks: usize) -> Arc<Self> {
        let config =
            NatsConfig::from_url(url).unwrap_or_else(|err| panic!("test server URL: {err}"));
        // A bucket per test process, or the parent's in a child process of a case.
        let bucket = conformance_tests::child::inherited()
            .filter(|b| !b.is_empty())
            .unwrap_or_else(|| {
                let run = uuid::Uuid::new_v4().simple().to_string();
                format!("distlock-test-{}", &run[..8])
            });
        let config = config.with_bucket(&bucket).expect("valid test bucket");
        Arc::new(Self {
            config,
            outage,
            many_locks,
        })
    }
}

#[async_trait]
impl Harness for NatsHarness {
    async fn client(&self) -> Result<TestClient, Error> {
        let config = ClientConfig::default().with_operation_timeout(OP_TIMEOUT);
        Ok(TestClient {
            lock: distlock_nats::connect_with(self.config.clone(), config)
                .await?
                .into_dyn(),
            tag: "nats".into(),
        })
    }

    /// Whole seconds (JetStream's message ttls); 2 s leaves room for a renewal round of the
    /// many-locks case on a loaded machine.
    fn ttl(&self) -> Duration {
        Duration::from_secs(2)
    }

    fn many_locks(&self) -> usize {
        self.many_locks
    }

    /// One compare-and-set per lock and renewal (JetStream has no multi-key write): 10,000
    /// locks renewed every third of 2 s are 15,000 writes a second, more than a loaded CI
    /// machine served (1,022 of 10,000 lost); every third of 10 s, 3,000.
    fn many_locks_ttl(&self) -> Duration {
        Duration::from_secs(10)
    }

    /// The server checks message ttls on a timer, and a ttl is rounded up to whole seconds.
    fn slack(&self) -> Duration {
        Duration::from_millis(1500)
    }

    fn operation_timeout(&self) -> Duration {
        OP_TIMEOUT
    }

    fn process_shared(&self) -> Option<String> {
        Some(self.config.bucket().to_owned())
    }

    async fn remove_lock(&self, name: &str) -> HookResult {
        let backend = NatsBackend::connect(&self.config, OP_TIMEOUT)
            .await
            .map_err(|e| HookError::Failed(e.to_string()))?;
        let name = LockName::new(name).map_err(|e| HookError::Failed(e.to_string()))?;
        match backend.force_release(&name).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(HookError::Failed(format!("{name} was not held"))),
            Err(e) => Err(HookError::Failed(e.to_string())),
        }
    }

    async fn cut_connection(&self, _client: &TestClient) -> HookResult {
        Err(HookError::Unsupported(
            "the test servers have no system account to kick one client's connection".into(),
        ))
    }

    async fn stop_server(&self) -> HookResult {
        for server in &self.outage {
            services("stop-one", server)
                .await
                .map_err(HookError::Failed)?;
        }
        Ok(())
    }

    async fn start_server(&self) -> HookResult {
        let mut result = Ok(());
        for server in &self.outage {
            if let Err(e) = services("start-one", server).await {
                result = Err(HookError::Failed(e));
            }
        }
        // Serving again means the bucket's stream answers (it has a leader).
        for _ in 0..100 {
            if let Ok(backend) = NatsBackend::connect(&self.config, OP_TIMEOUT).await
                && let Ok(name) = LockName::new("distlock-probe")
                && backend.inspect(&name).await.is_ok()
            {
                return result;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(HookError::Failed("NATS did not serve after restart".into()))
    }
}

async fn single() -> Option<Arc<dyn Harness>> {
    let url = server_var("nats", "DISTLOCK_TEST_NATS_URL")?;
    Some(NatsHarness::new(
        &url,
        vec!["nats"],
        conformance_tests::SCALE_LOCKS,
    ))
}

async fn cluster() -> Option<Arc<dyn Harness>> {
    let url = server_var("nats", "DISTLOCK_TEST_NATS_CLUSTER_URL")?;
    Some(NatsHarness::new(
        &url,
        vec!["nats-cluster-3", "nats-cluster-2"],
        1000,
    ))
}

async fn tls() -> Option<Arc<dyn Harness>> {
    let url = server_var("nats", "DISTLOCK_TEST_NATS_TLS_URL")?;
    Some(NatsHarness::new(&url, vec!["nats-tls"], 1000))
}

conformance_tests::conformance_suite!(nats, crate::single);
conformance_tests::conformance_suite!(nats_tls, crate::tls, transport_variant);
conformance_tests::conformance_suite!(nats_cluster, crate::cluster);
