//! Election observers' wake-ups: Redis client-side caching in broadcasting mode.
//!
//! An observer's stream opens one RESP3 connection per master and asks it for
//! `CLIENT TRACKING ON BCAST PREFIX <lock key> PREFIX <holders key> PREFIX <data key>`: from
//! then on the server pushes an invalidation whenever one of the name's holder keys changes
//! (a `SET` of a new holder, by the fast path's script too, a `DEL` at release, a renewal's
//! `PEXPIRE`, and the key's expiry), or the holders' data does (a leader's proclaim). Lockers
//! do nothing extra: no script publishes for observers.

use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, ProtocolVersion, PushInfo, PushKind};
use tokio::sync::mpsc;

use crate::keys::LockKeys;
use crate::topology::Endpoint;

/// The observer's stream for one master: yields once when tracking is active (so that a
/// change between the observer's first read and the tracking is not missed) and on every
/// invalidation of the name's keys; after a broken connection it yields, reconnects and goes
/// on. It ends when it cannot connect or the server refuses tracking (the observer then reads
/// at intervals).
pub(crate) fn changes(
    endpoint: &Endpoint,
    keys: &LockKeys,
    timeout: Duration,
) -> BoxStream<'static, ()> {
    enum State {
        Connect(Box<Target>),
        Open {
            target: Box<Target>,
            /// Kept for the tracking: dropping it closes the connection.
            _conn: MultiplexedConnection,
            pushes: mpsc::UnboundedReceiver<PushInfo>,
        },
    }
    let target = Box::new(Target {
        endpoint: endpoint.clone(),
        prefixes: [keys.lock.clone(), keys.holders(), keys.data()],
        timeout,
    });
    futures::stream::unfold(State::Connect(target), |state| async move {
        match state {
            State::Connect(target) => {
                // A failover takes a few seconds (Sentinel, Cluster): try for that long before
                // leaving the observer to read at intervals.
                let tries = if matches!(target.endpoint, Endpoint::Fixed(_)) {
                    1
                } else {
                    40
                };
                let mut tracked = None;
                for _ in 0..tries {
                    tracked = track(&target).await;
                    if tracked.is_some() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                let (conn, pushes) = tracked?;
                Some((
                    (),
                    State::Open {
                        target,
                        _conn: conn,
                        pushes,
                    },
                ))
            }
            State::Open {
                target,
                _conn,
                mut pushes,
            } => loop {
                match pushes.recv().await {
                    Some(push) if push.kind == PushKind::Invalidate => {
                        return Some((
                            (),
                            State::Open {
                                target,
                                _conn,
                                pushes,
                            },
                        ));
                    }
                    Some(push) if push.kind != PushKind::Disconnection => {}
                    // Broken: changes may have been missed; read again, then reconnect.
                    _ => return Some(((), State::Connect(target))),
                }
            },
        }
    })
    .boxed()
}

/// Where an observer's stream connects (the master of the name's keys, looked up at every
/// connection: Sentinel and Cluster move it), and what it tracks.
struct Target {
    endpoint: Endpoint,
    prefixes: [String; 3],
    timeout: Duration,
}

/// Opens a RESP3 connection and turns broadcasting tracking on for the target's prefixes.
async fn track(
    target: &Target,
) -> Option<(MultiplexedConnection, mpsc::UnboundedReceiver<PushInfo>)> {
    let client = target.endpoint.master_for(&target.prefixes[0]).await?;
    let info = client.get_connection_info().clone();
    let settings = info
        .redis_settings()
        .clone()
        .set_protocol(ProtocolVersion::RESP3);
    let client = redis::Client::open(info.set_redis_settings(settings)).ok()?;
    let (tx, rx) = mpsc::unbounded_channel();
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(target.timeout))
        .set_response_timeout(Some(target.timeout))
        .set_push_sender(tx);
    let mut conn = client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .map_err(|e| tracing::debug!("observer connection failed: {e}"))
        .ok()?;
    let mut tracking = redis::cmd("CLIENT");
    tracking.arg("TRACKING").arg("ON").arg("BCAST");
    for prefix in &target.prefixes {
        tracking.arg("PREFIX").arg(prefix);
    }
    let () = tracking
        .query_async(&mut conn)
        .await
        .map_err(|e| tracing::debug!("CLIENT TRACKING refused: {e}"))
        .ok()?;
    Some((conn, rx))
}
