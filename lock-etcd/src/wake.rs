//! What wakes a waiter: a watch on the key ahead of it, or the deadline.

use std::time::Instant;

use etcd_client::{EventType, WatchStream};

/// The next watch answer: `Some(true)` for a deletion (or a cancelled watch), `Some(false)` for
/// anything else, `None` when the stream failed. Never resolves without a watch.
pub(crate) async fn next_event(watch: &mut Option<(String, WatchStream, i64)>) -> Option<bool> {
    let Some((_, stream, _)) = watch else {
        return std::future::pending().await;
    };
    match stream.message().await {
        Ok(Some(resp)) => Some(
            resp.canceled()
                || resp
                    .events()
                    .iter()
                    .any(|e| e.event_type() == EventType::Delete),
        ),
        Ok(None) | Err(_) => None,
    }
}

pub(crate) async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}
