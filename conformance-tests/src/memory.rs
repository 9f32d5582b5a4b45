//! The harness of the in-memory backend: fault hooks act on the shared store.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock_core::memory::{MemoryBackend, MemoryStore};
use distlock_core::{ClientConfig, Error, LockClient};

use crate::{Harness, HookError, HookResult, TestClient};

/// Clients over one [`MemoryStore`].
#[derive(Debug, Default)]
pub struct MemoryHarness {
    store: MemoryStore,
}

/// The harness factory for [`conformance_suite!`](crate::conformance_suite).
pub async fn harness() -> Option<Arc<dyn Harness>> {
    Some(Arc::new(MemoryHarness::default()))
}

const OP_TIMEOUT: Duration = Duration::from_secs(2);

#[async_trait]
impl Harness for MemoryHarness {
    async fn client(&self) -> Result<TestClient, Error> {
        let config = ClientConfig::default().with_operation_timeout(OP_TIMEOUT);
        let client = LockClient::with_config(MemoryBackend::new(self.store.clone()), config)?;
        Ok(TestClient {
            lock: client.into_dyn(),
            tag: "memory".into(),
        })
    }

    fn ttl(&self) -> Duration {
        Duration::from_millis(400)
    }

    /// The issue-22 scale: 10,000 locks renewed by one client (batched, one store lock per
    /// tick), with a 1 s ttl.
    fn many_locks(&self) -> usize {
        crate::SCALE_LOCKS
    }

    fn many_locks_ttl(&self) -> Duration {
        Duration::from_secs(1)
    }

    fn operation_timeout(&self) -> Duration {
        OP_TIMEOUT
    }

    async fn remove_lock(&self, name: &str) -> HookResult {
        if self.store.remove(name) {
            Ok(())
        } else {
            Err(HookError::Failed(format!("{name:?} was not held")))
        }
    }

    async fn cut_connection(&self, _client: &TestClient) -> HookResult {
        Err(HookError::Unsupported(
            "the in-memory backend has no connections to cut".into(),
        ))
    }

    async fn stop_server(&self) -> HookResult {
        self.store.set_available(false);
        Ok(())
    }

    async fn start_server(&self) -> HookResult {
        self.store.set_available(true);
        Ok(())
    }

    fn process_shared(&self) -> Option<String> {
        None
    }
}
