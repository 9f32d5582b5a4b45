//! The shared conformance suite against real Redis masters from `scripts/services.sh`:
//! `redis` (the first master), `redis_fair` (the same in strict FIFO mode), `redlock3` (the
//! first three masters), `redlock5` (all five) and `redis_tls` (a TLS-only master with an ACL
//! user and a client certificate); `redis_sentinel` (the master that the Sentinels name) and
//! `redis_cluster` (the Redis Cluster), whose outage hook stops every data node (so that no
//! failover happens: Sentinel replicas first, the cluster's six at once) and starts them
//! again.

mod common;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use conformance_tests::{Harness, HookError, HookResult, TestClient};
use distlock_core::Error;
use distlock_redis::LockKeys;

const OP_TIMEOUT: Duration = Duration::from_secs(2);

/// One configuration under test: independent masters (one, or Redlock), or a topology.
struct RedisHarness {
    servers: Servers,
    ttl: Duration,
}

enum Servers {
    /// One master or Redlock over several, by URL.
    Masters { urls: Vec<String>, fair: bool },
    /// Sentinel or Cluster: one logical master behind a topology URL; `ports` are the data
    /// nodes (`services.sh` names `redis-repl-<port>`, `redis-cluster-<port>`).
    Topology {
        url: String,
        sentinel: bool,
        ports: Vec<u16>,
    },
}

const TTL: Duration = Duration::from_millis(1500);

async fn make(backend: &str, nodes: usize, fair: bool) -> Option<Arc<dyn Harness>> {
    let urls = if backend.ends_with("_tls") {
        vec![common::tls_url(backend)?]
    } else {
        common::urls(backend)?
    };
    assert!(
        urls.len() >= nodes,
        "DISTLOCK_TEST_REDIS_URLS has {} masters, {backend} needs {nodes}",
        urls.len()
    );
    let urls = urls[..nodes].to_vec();
    Some(Arc::new(RedisHarness {
        servers: Servers::Masters { urls, fair },
        ttl: TTL,
    }))
}

async fn redis_single() -> Option<Arc<dyn Harness>> {
    make("redis", 1, false).await
}

async fn redis_fair() -> Option<Arc<dyn Harness>> {
    make("redis", 1, true).await
}

async fn redis_tls() -> Option<Arc<dyn Harness>> {
    make("redis_tls", 1, false).await
}

async fn redlock3() -> Option<Arc<dyn Harness>> {
    make("redlock3", 3, false).await
}

async fn redlock5() -> Option<Arc<dyn Harness>> {
    make("redlock5", 5, false).await
}

async fn redis_sentinel() -> Option<Arc<dyn Harness>> {
    let url = common::sentinel_url("redis_sentinel")?;
    let ports = common::REPL_PORTS.to_vec();
    Some(Arc::new(RedisHarness {
        servers: Servers::Topology {
            url,
            sentinel: true,
            ports,
        },
        ttl: TTL,
    }))
}

async fn redis_cluster() -> Option<Arc<dyn Harness>> {
    let url = common::cluster_url("redis_cluster")?;
    let ports = common::url_hosts(&url)
        .into_iter()
        .map(|(_, p)| p)
        .collect();
    Some(Arc::new(RedisHarness {
        servers: Servers::Topology {
            url,
            sentinel: false,
            ports,
        },
        ttl: TTL,
    }))
}

impl RedisHarness {
    /// The node URLs the fault hooks reach: the masters, or every data node of a topology.
    fn node_urls(&self) -> Vec<String> {
        match &self.servers {
            Servers::Masters { urls, .. } => urls.clone(),
            Servers::Topology { ports, .. } => ports.iter().map(|p| common::local(*p)).collect(),
        }
    }

    /// The `services.sh` names stopped by the outage hook, in order: the single master, a
    /// Redlock majority, or every data node of a topology (Sentinel: replicas first, so that
    /// the Sentinels find no replica to promote).
    async fn outage_services(&self) -> Vec<String> {
        match &self.servers {
            Servers::Masters { urls, .. } => {
                let quorum = urls.len() / 2 + 1;
                let stopped = if urls.len() == 1 {
                    &urls[..]
                } else {
                    &urls[..quorum]
                };
                stopped.iter().map(|u| common::service_name(u)).collect()
            }
            Servers::Topology {
                sentinel, ports, ..
            } => {
                let (mut others, mut masters) = (Vec::new(), Vec::new());
                for port in ports {
                    let name = if *sentinel {
                        format!("redis-repl-{port}")
                    } else {
                        format!("redis-cluster-{port}")
                    };
                    match common::role(*port).await.as_deref() {
                        Some("master") => masters.push(name),
                        _ => others.push(name),
                    }
                }
                others.extend(masters);
                others
            }
        }
    }
}

#[async_trait]
impl Harness for RedisHarness {
    async fn client(&self) -> Result<TestClient, Error> {
        let tag = common::tag();
        let config = match &self.servers {
            Servers::Masters { urls, fair } => {
                let config = common::config(urls, *fair);
                if urls.len() > 1 {
                    // The default (ttl / 10) is tight for a debug build on a busy 2-core machine.
                    config.with_node_timeout(self.ttl / 5)
                } else {
                    config
                }
            }
            Servers::Topology { url, .. } => distlock_redis::RedisConfig::from_url(url)?,
        };
        let config = config.with_client_name(tag.clone());
        let client =
            distlock_redis::connect_with(config, common::client_config(OP_TIMEOUT)).await?;
        Ok(TestClient {
            lock: client.into_dyn(),
            tag,
        })
    }

    fn ttl(&self) -> Duration {
        self.ttl
    }

    fn slack(&self) -> Duration {
        Duration::from_millis(700)
    }

    fn operation_timeout(&self) -> Duration {
        OP_TIMEOUT
    }

    fn many_locks(&self) -> usize {
        // One master, plain: the scale of batched renewal. A Redlock lock is one lock per node,
        // and every renewal round goes to all nodes: keep the client-side work of a debug
        // build on a shared 2-core machine comparable. The other variants keep the suite quick.
        match &self.servers {
            Servers::Masters { urls, .. } if urls.len() > 1 => 200,
            Servers::Masters { urls, fair: false } if !urls[0].starts_with("rediss") => {
                conformance_tests::SCALE_LOCKS
            }
            _ => 1000,
        }
    }

    /// 3 s for 10,000 locks (acquiring them takes a few seconds, and the first renewal round
    /// of the early ones must not wait behind them); the base ttl for the variants' fewer.
    fn many_locks_ttl(&self) -> Duration {
        if self.many_locks() >= conformance_tests::SCALE_LOCKS {
            Duration::from_secs(3)
        } else {
            self.ttl
        }
    }

    async fn remove_lock(&self, name: &str) -> HookResult {
        let keys = LockKeys::for_name(name).map_err(|e| HookError::Failed(e.to_string()))?;
        let urls = match &self.servers {
            Servers::Masters { urls, .. } => urls.clone(),
            Servers::Topology { url, sentinel, .. } => {
                let port = if *sentinel {
                    common::sentinel_master_port(url).await
                } else {
                    common::cluster_master_of(url, &keys.lock).await
                };
                vec![common::local(port)]
            }
        };
        let mut removed = 0;
        for url in &urls {
            let mut conn = common::raw(url).await;
            let n: i64 = ::redis::cmd("DEL")
                .arg(&keys.lock)
                .query_async(&mut conn)
                .await
                .map_err(|e| HookError::Failed(e.to_string()))?;
            removed += n;
        }
        if removed == 0 {
            return Err(HookError::Failed(format!("{name:?} was not held")));
        }
        Ok(())
    }

    async fn cut_connection(&self, client: &TestClient) -> HookResult {
        let mut killed = 0;
        for url in self.node_urls() {
            killed += common::kill_tagged(&url, &client.tag)
                .await
                .map_err(HookError::Failed)?;
        }
        if killed == 0 {
            return Err(HookError::Failed(format!(
                "no connection tagged {} found",
                client.tag
            )));
        }
        Ok(())
    }

    async fn stop_server(&self) -> HookResult {
        // A cluster's six are killed within milliseconds (stopping one after the other gives
        // the cluster time for failovers) and started again together (a node started alone
        // never sees a healthy cluster).
        let cluster = matches!(
            self.servers,
            Servers::Topology {
                sentinel: false,
                ..
            }
        );
        let action = if cluster { "kill-one" } else { "stop-one" };
        for name in self.outage_services().await {
            common::services(action, &name)
                .await
                .map_err(HookError::Failed)?;
        }
        Ok(())
    }

    async fn start_server(&self) -> HookResult {
        if let Servers::Topology {
            sentinel: false,
            ports,
            ..
        } = &self.servers
        {
            // `start` with the six starts them together and waits until the cluster is
            // healthy; only those six (see `services_of`).
            let names: Vec<String> = ports.iter().map(|p| format!("redis-cluster-{p}")).collect();
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            return conformance_tests::services_of("start", &names)
                .await
                .map_err(HookError::Failed);
        }
        // services.sh restarts each on its data dir (a Sentinel data node with the role it
        // last had) and waits until it serves and its topology is healthy again.
        let mut names = self.outage_services().await;
        names.sort();
        let mut failed = Vec::new();
        for name in &names {
            if let Err(e) = common::services("start-one", name).await {
                failed.push(e);
            }
        }
        if let Servers::Masters { .. } = self.servers {
            for url in self.node_urls() {
                common::wait_ready(&url).await;
            }
        }
        if failed.is_empty() {
            Ok(())
        } else {
            Err(HookError::Failed(failed.join("; ")))
        }
    }
}

conformance_tests::conformance_suite!(redis, crate::redis_single);
conformance_tests::conformance_suite!(redis_fair, crate::redis_fair);
conformance_tests::conformance_suite!(redlock3, crate::redlock3);
conformance_tests::conformance_suite!(redlock5, crate::redlock5);
conformance_tests::conformance_suite!(redis_tls, crate::redis_tls, transport_variant);
conformance_tests::conformance_suite!(redis_sentinel, crate::redis_sentinel);
conformance_tests::conformance_suite!(redis_cluster, crate::redis_cluster);
