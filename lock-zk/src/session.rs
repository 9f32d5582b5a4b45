//! The ZooKeeper session every node of a backend belongs to, and opening it.

use std::sync::Arc;
use std::time::Duration;

use distlock_core::backend::within;
use distlock_core::{Error, Result};
use tracing::debug;
use zookeeper_client as zk;

use crate::ZkConfig;
use crate::error::zk_error;
use crate::keys::PERSISTENT;

/// One ZooKeeper session. Every node is ephemeral and belongs to the session that created it.
pub(crate) struct Session {
    pub(crate) client: zk::Client,
}

impl Session {
    pub(crate) fn is_dead(&self) -> bool {
        self.client.state().is_terminated()
    }

    pub(crate) fn is_connected(&self) -> bool {
        matches!(
            self.client.state(),
            zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly
        )
    }

    /// Fails at once while the connection is down, instead of queueing the request until the
    /// client library reconnects.
    pub(crate) fn check_connected(&self) -> Result<()> {
        if self.is_connected() || self.is_dead() {
            // A dead session answers every request with an error at once.
            return Ok(());
        }
        Err(Error::Unavailable {
            message: format!(
                "not connected to ZooKeeper (session {} is {})",
                self.client.session_id(),
                self.client.state()
            ),
            source: None,
        })
    }
}

pub(crate) async fn open_session(config: &ZkConfig, timeout: Duration) -> Result<Arc<Session>> {
    let connect_string = config.connect_string();
    let connect = zk::Client::connector()
        .with_session_timeout(config.session_timeout())
        .with_fail_eagerly()
        .connect(&connect_string);
    let hosts = config.hosts().join(",");
    let what = format!("connecting to ZooKeeper at {hosts}");
    let client = match within(timeout, what, connect).await? {
        Ok(client) => client,
        Err(zk::Error::BadArguments(msg)) => {
            return Err(Error::InvalidConfig(format!(
                "ZooKeeper hosts {hosts:?}: {msg}"
            )));
        }
        Err(err) => {
            // The client says only "no available hosts": ask the network why.
            let reason = match distlock_core::tcp_cause(config.hosts(), timeout / 4).await {
                Some(io) => io,
                None => err.to_string(),
            };
            return Err(Error::unavailable(
                format!("cannot connect to ZooKeeper at {hosts}: {reason}"),
                err,
            ));
        }
    };
    let base = config.base_path();
    within(
        timeout,
        format!("creating {base}"),
        client.mkdir(&base, &PERSISTENT),
    )
    .await?
    .map_err(|err| zk_error(&format!("creating {base}"), err))?;
    debug!(session = %client.session_id(), timeout = ?client.session_timeout(), "ZooKeeper session opened");
    Ok(Arc::new(Session { client }))
}
