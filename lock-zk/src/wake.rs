//! What wakes a waiter: a watch on the node or nodes it waits for.

use futures::future::BoxFuture;
use zookeeper_client as zk;

/// What a watch saw when it fired.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Woken {
    /// A watched node changed (a renewal, a waiting mark), or a session event: look again.
    Changed,
    /// The watched node was deleted; whether ours holds now takes a look.
    Gone,
    /// Every node that kept ours from holding was deleted (see [`Wake::cleared`]): ours holds,
    /// no look needed.
    Clear,
}

/// What wakes a waiter.
pub(crate) enum Wake {
    /// No watch set (not waiting).
    Idle,
    /// A watch on the nodes waited for, resolving when they are gone (or changed, or on a
    /// session event).
    Watch(BoxFuture<'static, Woken>),
    /// Poll again at once.
    Now,
}

impl Wake {
    /// Woken by `watcher`: [`Woken::Gone`] when the watched node was deleted.
    pub(crate) fn deleted(watcher: zk::OneshotWatcher) -> Self {
        Self::Watch(Box::pin(async move {
            match watcher.changed().await.event_type {
                zk::EventType::NodeDeleted => Woken::Gone,
                _ => Woken::Changed,
            }
        }))
    }

    /// Woken once every node of `watchers` (all the nodes that keep ours from holding; nodes
    /// ahead of ours only ever leave the queue, none joins ahead) was deleted, as
    /// [`Woken::Clear`]; at the first other event (a renewal, a held mark, a session event),
    /// as [`Woken::Changed`].
    pub(crate) fn cleared(watchers: Vec<zk::OneshotWatcher>) -> Self {
        let each = watchers.into_iter().map(|watcher| async move {
            match watcher.changed().await.event_type {
                zk::EventType::NodeDeleted => Ok(()),
                _ => Err(()),
            }
        });
        let all = futures::future::try_join_all(each);
        Self::Watch(Box::pin(async move {
            match all.await {
                Ok(_) => Woken::Clear,
                Err(()) => Woken::Changed,
            }
        }))
    }
}
