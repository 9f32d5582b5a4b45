//! An election observer never reports a term older than one it reported: a read that shows an
//! older leader again (an expired holder's entry renewed by its owner's late write, as NATS
//! showed under `distlock check`, or a lagging replica) is stale, not a change.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use distlock_core::memory::{MemoryBackend, MemoryStore};
use distlock_core::{
    AcquireRequest, Attempt, Capabilities, DistributedLock, FencingToken, LockBackend, LockClient,
    LockInfo, LockName, Result,
};
use futures::StreamExt;

/// The in-memory backend, whose `inspect` answers what the test scripted, one read after the
/// other (the last answer again once the script is done).
#[derive(Debug)]
struct Scripted {
    inner: MemoryBackend,
    reads: Mutex<VecDeque<Option<LockInfo>>>,
}

#[async_trait]
impl LockBackend for Scripted {
    fn name(&self) -> &'static str {
        "scripted"
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn begin(&self, request: AcquireRequest) -> Box<dyn Attempt> {
        self.inner.begin(request)
    }

    async fn inspect(&self, _name: &LockName) -> Result<Option<LockInfo>> {
        let mut reads = self.reads.lock().expect("script");
        Ok(if reads.len() > 1 {
            reads.pop_front().flatten()
        } else {
            reads.front().cloned().flatten()
        })
    }
}

/// A leader `owner` with term `term`.
fn held(owner: &str, term: u64) -> Option<LockInfo> {
    Some(LockInfo::new(
        owner.to_owned(),
        Some(FencingToken::new(term)),
        Some(Duration::from_secs(1)),
    ))
}

#[tokio::test]
async fn an_observer_never_reports_an_older_term() {
    let script = [
        held("a", 10),
        held("b", 12),
        // The older leader again: stale.
        held("a", 10),
        held("b", 12),
        None,
        held("a", 10),
        held("c", 13),
    ];
    let backend = Scripted {
        inner: MemoryBackend::new(MemoryStore::new()),
        reads: Mutex::new(script.into_iter().collect()),
    };
    let client: Arc<dyn DistributedLock> = Arc::new(LockClient::new(backend));
    let mut observed = client.observe("job", Duration::from_millis(1));
    let mut terms = Vec::new();
    while terms.last() != Some(&Some(13)) {
        let leader = tokio::time::timeout(Duration::from_secs(5), observed.next())
            .await
            .expect("the observer went quiet")
            .expect("the observer ended")
            .expect("a read failed");
        terms.push(leader.and_then(|l| l.term).map(FencingToken::get));
    }
    // No leader is a change; the older term is not, before it or after it.
    assert_eq!(terms, [Some(10), Some(12), None, Some(13)]);
}
