//! The client's etcd leases: one per ttl, shared by its queue keys, kept alive while used.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use distlock_core::backend::unpoisoned as lock;
use distlock_core::{Error, Result};
use etcd_client::{Client, LeaseKeepAliveStream, LeaseKeeper};
use tracing::debug;

use crate::backend::BackendState;
use crate::error::{ATTEMPT_TIMEOUT, AttemptError, map_err, not_sent};
use crate::members::Members;

impl BackendState {
    /// The client's lease for `ttl` (rounded up to whole seconds), granted if needed.
    async fn slot(&self, ttl: Duration) -> Result<Arc<LeaseSlot>> {
        let secs = i64::try_from(ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0))
            .unwrap_or(i64::MAX)
            .max(1);
        let mut leases = self.leases.lock().await;
        if let Some(slot) = leases.get(&secs)
            && !slot.is_dead()
        {
            return Ok(slot.clone());
        }
        let sent = Instant::now();
        let resp = self
            .client
            .lease_client()
            .grant(secs, None)
            .await
            .map_err(|e| map_err("granting a lease", e))?;
        if !resp.error().is_empty() {
            return Err(Error::Backend {
                message: format!("etcd refused a lease: {}", resp.error()),
                source: None,
            });
        }
        // etcd may raise a short ttl to its minimum; never lower.
        let granted = u64::try_from(resp.ttl().max(secs)).unwrap_or(u64::MAX);
        let slot = Arc::new(LeaseSlot {
            id: resp.id(),
            ttl: Duration::from_secs(granted),
            refreshed: StdMutex::new(sent),
            dead: AtomicBool::new(false),
            keepalive: tokio::sync::Mutex::default(),
        });
        debug!(lease = slot.id, ttl = granted, "granted a lease");
        leases.insert(secs, slot.clone());
        Ok(slot)
    }

    /// A live lease for `ttl` whose last refresh is recent, refreshing it (one cheap
    /// keepalive, no raft round) or granting a new one when needed.
    pub(crate) async fn fresh_slot(&self, ttl: Duration) -> Result<Arc<LeaseSlot>> {
        for _ in 0..3 {
            let slot = self.slot(ttl).await?;
            if slot.refreshed().elapsed() < slot.ttl / 10 {
                return Ok(slot);
            }
            if slot
                .keep_alive(&self.client, &self.members, Instant::now())
                .await?
            {
                return Ok(slot);
            }
        }
        Err(Error::Backend {
            message: "etcd leases kept disappearing right after being granted".into(),
            source: None,
        })
    }
}

/// One lease shared by the client's queue entries of one ttl, with its keepalive stream.
pub(crate) struct LeaseSlot {
    pub(crate) id: i64,
    pub(crate) ttl: Duration,
    /// When the last successful grant or keepalive was sent: the server keeps the lease at
    /// least until this instant + `ttl`.
    pub(crate) refreshed: StdMutex<Instant>,
    pub(crate) dead: AtomicBool,
    pub(crate) keepalive: tokio::sync::Mutex<KeepAlive>,
}

#[derive(Default)]
pub(crate) struct KeepAlive {
    pub(crate) stream: Option<(LeaseKeeper, LeaseKeepAliveStream)>,
    /// Keepalives sent on `stream` whose answer was not read yet (a cancelled call).
    pub(crate) unanswered: usize,
}

impl LeaseSlot {
    pub(crate) fn refreshed(&self) -> Instant {
        *lock(&self.refreshed)
    }

    /// Whether the server said the lease is gone (its keys with it).
    pub(crate) fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    pub(crate) fn mark_dead(&self) {
        self.dead.store(true, Ordering::Release);
    }

    /// Keeps the lease alive: `Ok(true)` if it is (a keepalive sent at or after `since`
    /// succeeded), `Ok(false)` if the server says it is gone. Cancel safe.
    pub(crate) async fn keep_alive(
        &self,
        client: &Client,
        members: &Members,
        since: Instant,
    ) -> Result<bool> {
        let mut guard = self.keepalive.lock().await;
        if self.is_dead() {
            return Ok(false);
        }
        if self.refreshed() >= since {
            return Ok(true); // coalesced with a concurrent caller's keepalive
        }
        let KeepAlive { stream, unanswered } = &mut *guard;
        let sent = Instant::now();
        let mut alive = None;
        if let Some((keeper, responses)) = stream {
            // A stream whose member died can stay silent forever (see ATTEMPT_TIMEOUT): after
            // that long without an answer it is dropped and a new one opened (on a live
            // member), in this same call.
            let exchange = async {
                keeper
                    .keep_alive()
                    .await
                    .map_err(|err| map_err("sending a lease keepalive", err))?;
                *unanswered += 1;
                let mut ttl = 0;
                while *unanswered > 0 {
                    match responses.message().await {
                        Ok(Some(resp)) => {
                            *unanswered -= 1;
                            ttl = resp.ttl();
                        }
                        Ok(None) => {
                            return Err(Error::Unavailable {
                                message: "the lease keepalive stream ended".into(),
                                source: None,
                            });
                        }
                        Err(err) => return Err(map_err("reading a lease keepalive answer", err)),
                    }
                }
                Ok(ttl > 0)
            };
            match tokio::time::timeout(ATTEMPT_TIMEOUT, exchange).await {
                Ok(Ok(answer)) => alive = Some(answer),
                Ok(Err(err)) => {
                    *stream = None;
                    *unanswered = 0;
                    members.suspect();
                    return Err(err);
                }
                Err(_) => {
                    debug!(
                        lease = self.id,
                        "lease keepalive stream silent: opening a new one"
                    );
                    members.suspect();
                    *stream = None;
                    *unanswered = 0;
                }
            }
        }
        let alive = match alive {
            Some(alive) => alive,
            None => {
                let mut leases = client.lease_client();
                match tokio::time::timeout(ATTEMPT_TIMEOUT, leases.keep_alive(self.id)).await {
                    Ok(Ok(opened)) => {
                        *stream = Some(opened);
                        *unanswered = 0;
                        true
                    }
                    // The library's way of saying the first answer had ttl 0.
                    Ok(Err(etcd_client::Error::LeaseKeepAliveError(_))) => false,
                    Ok(Err(err)) => {
                        if not_sent(&err) {
                            members.suspect();
                        }
                        return Err(map_err("opening a lease keepalive stream", err));
                    }
                    Err(_) => {
                        members.suspect();
                        return Err(
                            AttemptError::Unanswered.into_error("opening a lease keepalive stream")
                        );
                    }
                }
            }
        };
        if alive {
            let mut refreshed = lock(&self.refreshed);
            *refreshed = (*refreshed).max(sent);
        } else {
            debug!(lease = self.id, "lease is gone");
            self.mark_dead();
        }
        Ok(alive)
    }
}
