//! What wakes a waiter: a watch on its predecessor's node.

use futures::future::BoxFuture;

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
