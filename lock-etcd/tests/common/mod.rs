//! Shared by the etcd test binaries: clients, admin access and the server hooks.
#![allow(
    dead_code,
    unused_imports,
    unreachable_pub,
    reason = "each test binary uses a part of the shared helpers"
)]

use std::time::Duration;

use distlock_core::{ClientConfig, Error, LockClient};
use distlock_etcd::etcd_client::{Client, GetOptions};
use distlock_etcd::{EtcdBackend, EtcdConfig};

pub const OP_TIMEOUT: Duration = Duration::from_secs(2);

/// A name no other test (or test run) uses: `name` and a random suffix.
pub fn unique(name: &str) -> String {
    format!("{name}-{}", uuid::Uuid::new_v4().simple())
}

/// Test servers and a random key prefix for one test process.
#[derive(Clone)]
pub struct Etcd {
    pub config: EtcdConfig,
    pub admin: Client,
    /// services.sh names of the members.
    pub members: Vec<&'static str>,
    /// The key prefix of this test process's locks.
    pub prefix: String,
}

impl Etcd {
    pub async fn new(endpoints: &str, members: Vec<&'static str>) -> Self {
        let config = EtcdConfig::new(endpoints.split(',')).expect("valid test endpoints");
        Self::with_config(config, members).await
    }

    /// From a configuration (TLS, user); the prefix is replaced by the test process's.
    pub async fn with_config(config: EtcdConfig, members: Vec<&'static str>) -> Self {
        // A child process of a conformance case uses its parent's prefix.
        let prefix = conformance_tests::child::inherited()
            .filter(|prefix| !prefix.is_empty())
            .unwrap_or_else(|| {
                let run = uuid::Uuid::new_v4().simple().to_string();
                format!("distlock-test-{}", &run[..8])
            });
        let config = config.with_prefix(&prefix).expect("valid test prefix");
        // Connected like the lock clients (TLS and user included).
        let admin = EtcdBackend::connect_client(&config, OP_TIMEOUT)
            .await
            .unwrap_or_else(|err| panic!("admin client: {err}"));
        Self {
            config,
            admin,
            members,
            prefix,
        }
    }

    pub async fn client(&self) -> Result<LockClient<EtcdBackend>, Error> {
        let config = ClientConfig::default().with_operation_timeout(OP_TIMEOUT);
        distlock_etcd::connect_with(self.config.clone(), config).await
    }

    pub async fn backend(&self) -> EtcdBackend {
        EtcdBackend::connect(&self.config, OP_TIMEOUT)
            .await
            .expect("backend")
    }

    /// The queue keys of `name` (key, create revision, lease).
    pub async fn entries(&self, name: &str) -> Vec<(String, i64, i64)> {
        let range = self.backend().await.key_range(name);
        // Retried: with a cluster member down, a request may be routed to it first.
        let mut tries = 0;
        let resp = loop {
            let read = self
                .admin
                .clone()
                .get(range.clone(), Some(GetOptions::new().with_prefix()))
                .await;
            match read {
                Err(err) if tries < 10 => {
                    tries += 1;
                    eprintln!("admin get failed, retrying: {err}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                other => break other.expect("admin get"),
            }
        };
        resp.kvs()
            .iter()
            .map(|kv| {
                (
                    String::from_utf8_lossy(kv.key()).into_owned(),
                    kv.create_revision(),
                    kv.lease(),
                )
            })
            .collect()
    }
}

pub use conformance_tests::services as service;

/// The `/metrics` text of the member at `endpoint` (`http://host:port`).
pub async fn metrics(endpoint: &str) -> String {
    let host = endpoint.trim_start_matches("http://").trim_end_matches('/');
    distlock_bench::http_get(host, "/metrics")
        .await
        .expect("read the metrics endpoint")
}

/// The value of one `/metrics` line (counters are integers printed as floats).
pub fn metric_value(line: &str) -> u64 {
    let number = line.rsplit(' ').next().unwrap_or("0");
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "non-negative integer counters"
    )]
    number.parse::<f64>().map_or(0, |v| v as u64)
}
