//! The shared conformance suite against real Redis masters from `scripts/services.sh`:
//! `redis` (the first master), `redis_fair` (the same in strict FIFO mode), `redlock3` (the
//! first three masters), `redlock5` (all five) and `redis_tls` (a TLS-only master with an ACL
//! user and a client certificate).

mod common;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use conformance_tests::{Harness, HookError, HookResult, TestClient};
use distlock_core::Error;
use distlock_redis::LockKeys;

const OP_TIMEOUT: Duration = Duration::from_secs(2);

struct RedisHarness {
    urls: Vec<String>,
    fair: bool,
    ttl: Duration,
}

async fn make(backend: &str, nodes: usize, fair: bool, ttl_ms: u64) -> Option<Arc<dyn Harness>> {
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
    Some(Arc::new(RedisHarness {
        urls: urls[..nodes].to_vec(),
        fair,
        ttl: Duration::from_millis(ttl_ms),
    }))
}

async fn redis_single() -> Option<Arc<dyn Harness>> {
    make("redis", 1, false, 1500).await
}

async fn redis_fair() -> Option<Arc<dyn Harness>> {
    make("redis", 1, true, 1500).await
}

async fn redis_tls() -> Option<Arc<dyn Harness>> {
    make("redis_tls", 1, false, 1500).await
}

async fn redlock3() -> Option<Arc<dyn Harness>> {
    make("redlock3", 3, false, 1500).await
}

async fn redlock5() -> Option<Arc<dyn Harness>> {
    make("redlock5", 5, false, 1500).await
}

impl RedisHarness {
    /// The nodes stopped by the outage hook: the single master, or a Redlock majority.
    fn outage_nodes(&self) -> &[String] {
        let quorum = self.urls.len() / 2 + 1;
        if self.urls.len() == 1 {
            &self.urls
        } else {
            &self.urls[..quorum]
        }
    }
}

#[async_trait]
impl Harness for RedisHarness {
    async fn client(&self) -> Result<TestClient, Error> {
        let tag = common::tag();
        let mut config = common::config(&self.urls, self.fair).with_client_name(tag.clone());
        if self.urls.len() > 1 {
            // The default (ttl / 10) is tight for a debug build on a busy 2-core machine.
            config = config.with_node_timeout(self.ttl / 5);
        }
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
        // A Redlock lock is one lock per node, and every renewal round goes to all nodes: keep
        // the client-side work of a debug build on a shared 2-core machine comparable.
        if self.urls.len() == 1 { 1000 } else { 200 }
    }

    async fn remove_lock(&self, name: &str) -> HookResult {
        let keys = LockKeys::for_name(name).map_err(|e| HookError::Failed(e.to_string()))?;
        let mut removed = 0;
        for url in &self.urls {
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
        for url in &self.urls {
            killed += common::kill_tagged(url, &client.tag)
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
        for url in self.outage_nodes() {
            common::services("stop-one", &common::service_name(url))
                .await
                .map_err(HookError::Failed)?;
        }
        Ok(())
    }

    async fn start_server(&self) -> HookResult {
        let mut failed = Vec::new();
        for url in self.outage_nodes() {
            if let Err(e) = common::services("start-one", &common::service_name(url)).await {
                failed.push(e);
            }
        }
        for url in self.outage_nodes() {
            common::wait_ready(url).await;
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
conformance_tests::conformance_suite!(redis_tls, crate::redis_tls);
