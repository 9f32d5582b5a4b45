//! What wakes a waiter: a watch on the node or nodes it waits for.

use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use zookeeper_client as zk;

/// What a watch saw when it fired.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Woken {
    /// A watched node changed (a renewal, a waiting mark: for a waiter watching one node), a
    /// session's end, or a failed read to watch a node again: look again.
    Changed,
    /// The watched node was deleted; whether ours holds now takes a look.
    Gone,
    /// Enough of the nodes that kept ours from holding were deleted (see [`Wake::counted`]):
    /// ours holds, no look needed.
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

    /// Woken once `needed` nodes of `watched` (nodes ahead of ours, with the path and the
    /// watch of each; nodes ahead only ever leave the queue, none joins ahead) were deleted,
    /// as [`Woken::Clear`]: all of them for a writer behind readers, one of the N holders for
    /// the first permit waiter. A watched node's data change (a renewal, a held mark) does not
    /// wake the waiter: its watch is set again by a read of that node alone on `client` (a
    /// node gone by then counts as deleted), so holders that renew or readers that mark their
    /// holds cost a read each, not a look at the queue. Such a write restarts the node's
    /// lease, and the waiter looks again by the end of the lease it judged, or by its own
    /// refresh (a third of its ttl) at the latest. Any other event (the session's end), or a
    /// read that fails otherwise, wakes it as [`Woken::Changed`].
    pub(crate) fn counted(
        client: zk::Client,
        watched: Vec<(String, zk::OneshotWatcher)>,
        needed: usize,
    ) -> Self {
        let client = std::sync::Arc::new(client);
        let each: FuturesUnordered<_> = watched
            .into_iter()
            .map(|(path, watcher)| until_deleted(client.clone(), path, watcher))
            .collect();
        debug_assert!(
            needed > 0 && needed <= each.len(),
            "{needed} of {}",
            each.len()
        );
        Self::Watch(Box::pin(async move {
            let mut each = each;
            let mut gone = 0;
            while let Some(outcome) = each.next().await {
                if outcome.is_err() {
                    return Woken::Changed;
                }
                gone += 1;
                if gone >= needed {
                    return Woken::Clear;
                }
            }
            Woken::Changed
        }))
    }
}

/// Resolves when the node at `path`, watched by `watcher`, is deleted (`Ok`), watching it
/// again after each change of its data; `Err` at any other event or failed read.
async fn until_deleted(
    client: std::sync::Arc<zk::Client>,
    path: String,
    mut watcher: zk::OneshotWatcher,
) -> Result<(), ()> {
    loop {
        match watcher.changed().await.event_type {
            zk::EventType::NodeDeleted => return Ok(()),
            zk::EventType::NodeDataChanged => match client.get_and_watch_data(&path).await {
                Ok((_, _, again)) => watcher = again,
                Err(zk::Error::NoNode) => return Ok(()),
                Err(_) => return Err(()),
            },
            _ => return Err(()),
        }
    }
}
