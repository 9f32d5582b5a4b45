//! Renewals: a compare-and-set of the entry on its revision with a fresh ttl, one lease at a
//! time or a batch pipelined on the connection (every write sent, then every answer read).

use std::time::Duration;

use async_nats::jetstream;
use async_trait::async_trait;
use distlock_core::backend::{RenewItem, Renewer, downcast_lease};
use distlock_core::{Error, Result};

use crate::backend::BackendState;
use crate::error::{Written, written};
use crate::lease::NatsLease;

/// Renews `lease` to `ttl` from now, only if its entry is still the one it wrote last.
pub(crate) async fn refresh(lease: &NatsLease, ttl: Duration) -> Result<()> {
    let mut rev = lease.rev();
    for _ in 0..3 {
        let alone = lease.alone();
        let publish = BackendState::put(&lease.value(), ttl, rev, lease.range(alone));
        match lease.state.send("renew", &lease.subject, publish).await? {
            Written::Stored(new) => {
                lease.set_rev(new);
                return Ok(());
            }
            Written::Conflict if alone => lease.not_alone(),
            Written::Conflict => rev = lease.after_conflict(rev).await?,
        }
    }
    Err(Error::not_held(&lease.name))
}

/// The batched renewer of one connection.
#[derive(Debug)]
pub(crate) struct NatsRenewer {
    js: jetstream::Context,
}

impl NatsRenewer {
    pub(crate) fn new(js: jetstream::Context) -> Self {
        Self { js }
    }
}

#[async_trait]
impl Renewer for NatsRenewer {
    async fn renew_many(&self, items: &[RenewItem<'_>]) -> Result<Vec<Result<()>>> {
        // Every write first, so that the batch costs one round trip, not one per lease.
        let mut pending = Vec::with_capacity(items.len());
        for item in items {
            let Some(lease) = downcast_lease::<NatsLease>(item.lease) else {
                pending.push(None);
                continue;
            };
            let rev = lease.rev();
            let publish =
                BackendState::put(&lease.value(), item.ttl, rev, lease.range(lease.alone()));
            // Nothing sent while the connection is down (as one renewal): async-nats keeps a
            // publish made then and sends it once reconnected, when the holder may have let
            // the lock go (a release that failed meanwhile), and a renewal stored then held
            // the entry for a whole ttl more. Checked before each send: the connection may
            // drop part-way through the batch.
            let sent = match lease.state.connected() {
                Ok(()) => Ok(self.js.send_publish(lease.subject.clone(), publish).await),
                Err(err) => Err(err),
            };
            pending.push(Some((lease, rev, sent)));
        }
        let mut results = Vec::with_capacity(items.len());
        for (item, entry) in items.iter().zip(pending) {
            let Some((lease, rev, sent)) = entry else {
                results.push(Err(crate::error::backend_msg(
                    "a lease of another backend in a NATS renewal",
                )));
                continue;
            };
            let sent = match sent {
                Ok(sent) => sent,
                Err(down) => {
                    results.push(Err(down));
                    continue;
                }
            };
            let answer = match sent {
                Ok(ack) => ack.await.map(|ack| ack.sequence),
                Err(err) => Err(err),
            };
            results.push(match written("renew", answer) {
                Ok(Written::Stored(new)) => {
                    lease.set_rev(new);
                    Ok(())
                }
                // Somebody else wrote in the range of a lease that was alone: per key from now
                // on. Else moved by a renewal whose answer was lost, or gone. Then as one
                // renewal decides.
                Ok(Written::Conflict) if lease.alone() => {
                    lease.not_alone();
                    refresh(lease, item.ttl).await
                }
                Ok(Written::Conflict) => match lease.after_conflict(rev).await {
                    Ok(_) => refresh(lease, item.ttl).await,
                    Err(err) => Err(err),
                },
                Err(err) => Err(err),
            });
        }
        Ok(results)
    }
}
