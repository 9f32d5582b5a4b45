//! What wakes a waiter: a watch on its predecessor's node.

use futures::future::BoxFuture;
use zookeeper_client as zk;

/// What wakes a waiter.
pub(crate) enum Wake {
    /// No watch set (not waiting).
    Idle,
    /// A watch on the predecessor, resolving on its deletion (`true`) or change (or session
    /// events).
    Watch(BoxFuture<'static, bool>),
    /// Poll again at once.
    Now,
}

impl Wake {
    /// Woken by `watcher`: `true` when the watched node was deleted.
    pub(crate) fn deleted(watcher: zk::OneshotWatcher) -> Self {
        Self::Watch(Box::pin(async move {
            watcher.changed().await.event_type == zk::EventType::NodeDeleted
        }))
    }
}
