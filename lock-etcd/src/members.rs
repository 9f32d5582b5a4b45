//! Which cluster members the client's requests may go to: those that accept connections.
//!
//! etcd-client spreads requests over its endpoints with a power-of-two-choices balancer that
//! prefers the endpoint with the fewest requests in flight. A member that died (kill -9) keeps
//! its place there, and since every request to it fails at once ("tcp connect error"), it is
//! always the least loaded: measured in tests/etcd.rs, after a leader's kill -9 four
//! renewals in a row, 250 ms apart, went to the dead member while the two others served again,
//! until the holder's lease ran out. This module takes a member that refuses connections out
//! of the balancer and puts it back once it accepts them again.
//!
//! Probing is event-driven, so a healthy cluster costs nothing: a request that got no answer
//! or could not connect calls [`Members::suspect`], which probes every member once (a TCP
//! connection, at most every [`PROBE_PAUSE`]); a member found dead is probed again every
//! [`PROBE_PAUSE`] until it accepts a connection. The last live member is never taken out.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::Client;
use tokio::sync::Notify;
use tokio::task::AbortHandle;
use tracing::{debug, warn};

/// The shortest pause between two probe rounds, and how long one connection attempt may take.
pub(crate) const PROBE_PAUSE: Duration = Duration::from_millis(250);

/// The handle the request paths use to report a suspect member. Cheap to clone.
#[derive(Clone, Debug, Default)]
pub(crate) struct Members {
    wake: Arc<Notify>,
}

impl Members {
    /// A request got no answer, or could not connect: probe the members.
    pub(crate) fn suspect(&self) {
        self.wake.notify_one();
    }
}

/// The probing task of one client; stops when dropped.
#[derive(Debug)]
pub(crate) struct Prober {
    task: Option<AbortHandle>,
}

impl Drop for Prober {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

/// Starts probing for `client` over `endpoints` (the URLs it was connected with), when there
/// are two or more and a runtime to run on.
pub(crate) fn start(client: &Client, endpoints: &[String], members: &Members) -> Prober {
    let handle = tokio::runtime::Handle::try_current().ok();
    let task = handle.filter(|_| endpoints.len() > 1).map(|handle| {
        handle
            .spawn(probe(
                client.clone(),
                endpoints.to_vec(),
                members.wake.clone(),
            ))
            .abort_handle()
    });
    Prober { task }
}

/// `host:port` of an endpoint URL.
fn address(endpoint: &str) -> &str {
    let rest = endpoint
        .split_once("://")
        .map_or(endpoint, |(_, rest)| rest);
    rest.split('/').next().unwrap_or(rest)
}

async fn accepts(endpoint: &str) -> bool {
    matches!(
        tokio::time::timeout(
            PROBE_PAUSE,
            tokio::net::TcpStream::connect(address(endpoint))
        )
        .await,
        Ok(Ok(_))
    )
}

async fn probe(client: Client, endpoints: Vec<String>, wake: Arc<Notify>) {
    let mut out: HashSet<usize> = HashSet::new();
    loop {
        // Everybody after a suspicion; only the members taken out on the timer.
        let everybody = if out.is_empty() {
            wake.notified().await;
            true
        } else {
            tokio::select! {
                () = wake.notified() => true,
                () = tokio::time::sleep(PROBE_PAUSE) => false,
            }
        };
        let probed: Vec<usize> = (0..endpoints.len())
            .filter(|i| everybody || out.contains(i))
            .collect();
        let alive = futures::future::join_all(probed.iter().map(|&i| accepts(&endpoints[i]))).await;
        for (&i, alive) in probed.iter().zip(alive) {
            let endpoint = &endpoints[i];
            let change = if alive && out.contains(&i) {
                out.remove(&i);
                debug!(%endpoint, "etcd member accepts connections again: back in use");
                client.add_endpoint(endpoint).await
            } else if !alive && !out.contains(&i) && out.len() + 1 < endpoints.len() {
                out.insert(i);
                warn!(%endpoint, "etcd member refuses connections: not used until it is back");
                client.remove_endpoint(endpoint).await
            } else {
                Ok(())
            };
            if let Err(err) = change {
                // An application's own client whose endpoints the library does not manage.
                debug!(%err, "cannot change the client's endpoints: member probing stops");
                return;
            }
        }
        tokio::time::sleep(PROBE_PAUSE).await;
    }
}

#[cfg(test)]
mod tests {
    use super::address;

    #[test]
    fn addresses_of_endpoint_urls() {
        assert_eq!(address("http://127.0.0.1:2379"), "127.0.0.1:2379");
        assert_eq!(address("https://etcd.example:2379/"), "etcd.example:2379");
        assert_eq!(address("10.0.0.1:2379"), "10.0.0.1:2379");
    }
}
