//! The ZooKeeper session every node of a backend belongs to, and opening it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use distlock_core::backend::{LossEpochs, unpoisoned, within};
use distlock_core::{Error, LossReason, Result};
use tokio::task::AbortHandle;
use tracing::{debug, warn};
use zookeeper_client as zk;

use crate::ZkConfig;
use crate::acl::{Access, judge, node_acls};
use crate::error::{denied, zk_error};
use crate::keys::persistent;
use crate::renew::ZkRenewer;

/// One ZooKeeper session. Every node is ephemeral and belongs to the session that created it.
pub(crate) struct Session {
    pub(crate) client: zk::Client,
    /// The ACL of every node this session creates.
    pub(crate) acls: zk::Acls<'static>,
    /// Renews this session's held nodes together (see `renew.rs`).
    pub(crate) renewer: Arc<ZkRenewer>,
    /// Fires once, when the session ends (expired or closed): every guard of the session is
    /// lost then ([`distlock_core::Lease::shared_loss`]), through one watch for all of them.
    pub(crate) lost: LossEpochs,
    /// How the connection fares, kept up to date by the task that watches the state.
    link: Arc<Link>,
    /// The task that watches the session's state for its end; stopped with the session.
    watch: AbortHandle,
}

/// The connection of a session as its watcher saw it last, and whether the backend has
/// moved new work to another session.
#[derive(Default)]
struct Link {
    /// Since when the client has been reconnecting (`None` while connected).
    disconnected_since: Mutex<Option<Instant>>,
    /// Set when the backend opened a replacement because this session stayed disconnected
    /// while the servers answered (see `ZkBackend::session`): its guards live on, but new
    /// acquisitions go to the replacement.
    retired: AtomicBool,
}

impl Drop for Session {
    fn drop(&mut self) {
        self.watch.abort();
    }
}

/// Waits for the session's end and reports it to every guard of the session; meanwhile
/// notes when the connection went down.
async fn watch_session(mut states: zk::StateWatcher, lost: LossEpochs, link: Arc<Link>) {
    let mut state = states.state();
    while !state.is_terminated() {
        {
            let mut since = unpoisoned(&link.disconnected_since);
            *since = match state {
                zk::SessionState::Disconnected => Some(since.unwrap_or_else(Instant::now)),
                _ => None,
            };
        }
        state = states.changed().await;
    }
    debug!(%state, "ZooKeeper session ended: its locks are lost");
    lost.lose(Some(LossReason::SessionExpired));
}

impl Session {
    pub(crate) fn is_dead(&self) -> bool {
        self.client.state().is_terminated()
    }

    /// How long the client has been trying to reconnect, if it is.
    pub(crate) fn disconnected_for(&self) -> Option<Duration> {
        unpoisoned(&self.link.disconnected_since).map(|since| since.elapsed())
    }

    /// Whether the backend moved new work to a replacement session (this one may still
    /// reconnect: the guards it holds keep it).
    pub(crate) fn is_retired(&self) -> bool {
        self.link.retired.load(Ordering::SeqCst)
    }

    pub(crate) fn retire(&self) {
        self.link.retired.store(true, Ordering::SeqCst);
    }

    pub(crate) fn is_connected(&self) -> bool {
        matches!(
            self.client.state(),
            zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly
        )
    }

    /// Waits until the session is connected (or has ended, when every request fails at once).
    /// For a release: the caller's operation timeout bounds the wait, and a release sent
    /// after the reconnection still counts (the session, with its nodes, lives on). Measured
    /// in tests/ensemble.rs: a leader's kill -9 disconnects every client, which finds a
    /// serving server again 2.6 s later (the client library's reconnect backoff; the new
    /// leader was elected 0.5-0.8 s after the kill).
    pub(crate) async fn connected(&self) {
        let mut states = self.client.state_watcher();
        while !(self.is_connected() || self.is_dead()) {
            states.changed().await;
        }
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

/// A connector with the configuration's credentials and TLS settings.
pub(crate) async fn connector(config: &ZkConfig) -> Result<zk::Connector> {
    let base = config
        .app_connector()
        .cloned()
        .unwrap_or_else(zk::Client::connector);
    let mut connector = base
        .with_session_timeout(config.session_timeout())
        .with_fail_eagerly();
    if let Some(digest) = config.digest() {
        connector = if digest.sasl {
            with_sasl(connector, digest)?
        } else {
            connector.with_auth("digest", &digest.auth_bytes())
        };
    }
    if let Some(files) = config.tls() {
        connector = with_tls(connector, files).await?;
    }
    Ok(connector)
}

#[cfg(feature = "sasl")]
fn with_sasl(connector: zk::Connector, digest: &crate::config::Digest) -> Result<zk::Connector> {
    // The options' Debug shows the password: they go straight into the connector, never logged.
    let options = zk::SaslOptions::digest_md5(digest.user.clone(), digest.password.clone());
    Ok(connector.with_sasl(options))
}

#[cfg(not(feature = "sasl"))]
fn with_sasl(_connector: zk::Connector, _digest: &crate::config::Digest) -> Result<zk::Connector> {
    Err(Error::Unsupported(crate::config::SASL_UNSUPPORTED.into()))
}

#[cfg(feature = "tls")]
async fn with_tls(
    connector: zk::Connector,
    files: &distlock_core::tls::TlsFiles,
) -> Result<zk::Connector> {
    // zookeeper-client builds its rustls configuration with the process-wide default crypto
    // provider; make it ring (the workspace's one TLS stack) unless the application chose one.
    crate::install_crypto_provider();
    let material = files.load().await?;
    let bad = |what: &str, err: zk::Error| {
        Error::InvalidConfig(format!("ZooKeeper TLS: the {what} is not usable: {err}"))
    };
    let pem = |bytes: &[u8], what: &str| {
        String::from_utf8(bytes.to_vec()).map_err(|_| {
            Error::InvalidConfig(format!("ZooKeeper TLS: the {what} is not UTF-8 PEM"))
        })
    };
    let mut options = zk::TlsOptions::new();
    if let Some(ca) = &material.ca_pem {
        options = options
            .with_pem_ca(&pem(ca, "certificate authority (ca=)")?)
            .map_err(|e| bad("certificate authority (ca=)", e))?;
    }
    if let Some((cert, key)) = &material.identity {
        options = options
            .with_pem_identity(
                &pem(cert, "client certificate (cert=)")?,
                &pem(key, "private key (key=)")?,
            )
            // Never the key's contents: the library names only what it could not read.
            .map_err(|e| bad("client certificate or key (cert=, key=)", e))?;
    }
    Ok(connector.with_tls(options))
}

#[cfg(not(feature = "tls"))]
async fn with_tls(
    _connector: zk::Connector,
    _files: &distlock_core::tls::TlsFiles,
) -> Result<zk::Connector> {
    Err(Error::Unsupported(
        "ZooKeeper over TLS (zks://) needs the cargo feature `tls` of distlock-zookeeper".into(),
    ))
}

/// Connects: `tcp+tls://` for every host when the configuration has TLS.
pub(crate) async fn connect_client(
    connector: zk::Connector,
    config: &ZkConfig,
) -> std::result::Result<zk::Client, zk::Error> {
    #[cfg(feature = "tls")]
    if config.is_secure() {
        // The application's own TLS connector builds its rustls configuration here too, with
        // the process-wide provider: without one (and with both of rustls' providers built)
        // that panicked, whenever no earlier connection of the process had installed it.
        crate::install_crypto_provider();
        return connector.secure_connect(&config.connect_string()).await;
    }
    #[cfg(not(feature = "tls"))]
    if config.is_secure() {
        return Err(zk::Error::BadArguments(
            &"a TLS connector needs the cargo feature `tls` of distlock-zookeeper",
        ));
    }
    connector.connect(&config.connect_string()).await
}

pub(crate) async fn open_session(config: &ZkConfig, timeout: Duration) -> Result<Arc<Session>> {
    let started = tokio::time::Instant::now();
    let deadline = started + timeout;
    let hosts = config.hosts().join(",");
    let tls = match (config.tls().is_some(), config.uses_sasl()) {
        (true, true) => " over TLS (SASL DIGEST-MD5)",
        (true, false) => " over TLS",
        (false, true) => " (SASL DIGEST-MD5)",
        (false, false) => "",
    };
    let client = loop {
        let connect = connect_client(connector(config).await?, config);
        let what = format!("connecting to ZooKeeper at {hosts}{tls}");
        let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
        let err = match within(remaining, what, connect).await? {
            Ok(client) => break client,
            Err(zk::Error::BadArguments(msg)) => {
                return Err(Error::InvalidConfig(format!(
                    "ZooKeeper hosts {hosts:?}: {msg}"
                )));
            }
            Err(err @ zk::Error::AuthFailed) => {
                return Err(Error::backend(
                    format!("ZooKeeper at {hosts}: authentication failed{tls}"),
                    err,
                ));
            }
            Err(err) => err,
        };
        // The client says only "no available hosts": ask the network why. A TLS-level cause
        // is a configuration error: no point in retrying.
        #[cfg(feature = "tls")]
        if let Some(reason) = tls_cause(config, timeout / 2).await {
            return Err(Error::backend(
                format!("cannot connect to ZooKeeper at {hosts}{tls}: {reason}"),
                err,
            ));
        }
        let reason = match distlock_core::tcp_cause(config.hosts(), timeout / 4).await {
            Some(io) => io,
            None => {
                // Reachable, but the session handshake failed (a connection closed under
                // load, a server restarting): try again while the connect timeout lasts.
                if deadline.saturating_duration_since(tokio::time::Instant::now())
                    > Duration::from_millis(200)
                {
                    debug!(error = %err, "ZooKeeper session handshake failed, trying again");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
                err.to_string()
            }
        };
        return Err(Error::unavailable(
            format!("cannot connect to ZooKeeper at {hosts}{tls}: {reason}"),
            err,
        ));
    };
    let acls = node_acls(config.digest().is_some());
    let base = config.base_path();
    // What is left of the connect timeout (at least a round trip's worth).
    let remaining = deadline
        .saturating_duration_since(tokio::time::Instant::now())
        .max(timeout / 4);
    within(
        remaining,
        format!("checking the ACL of {base}"),
        check_base(&client, config, acls),
    )
    .await??;
    debug!(session = %client.session_id(), timeout = ?client.session_timeout(), "ZooKeeper session opened");
    let lost = LossEpochs::new();
    let link = Arc::<Link>::default();
    let watch = tokio::spawn(watch_session(
        client.state_watcher(),
        lost.clone(),
        link.clone(),
    ))
    .abort_handle();
    Ok(Arc::new(Session {
        client,
        acls,
        renewer: Arc::default(),
        lost,
        link,
        watch,
    }))
}

#[cfg(feature = "tls")]
async fn tls_cause(config: &ZkConfig, timeout: Duration) -> Option<String> {
    let material = match config.tls() {
        Some(files) => Some(files.load().await.ok()?),
        // The application's own TLS connector: its certificates are not ours to probe with,
        // and a probe without them would take its server's certificate for a plain URL's
        // mistake (a transient failure then ended the connect as a configuration error).
        None if config.is_secure() => return None,
        None => None,
    };
    crate::tls::diagnose(config.hosts(), material, timeout).await
}

/// Creates the base node `<chroot>/distlock` if missing: the chroot and the base with `acls`,
/// the chroot's missing ancestors (shared with whoever else uses that tree) open.
pub(crate) async fn create_base(
    client: &zk::Client,
    config: &ZkConfig,
    acls: zk::Acls<'static>,
) -> Result<()> {
    let base = config.base_path();
    let creating = |path: &str, err: zk::Error| match err {
        zk::Error::NoAuth => denied(config, path, &format!("creating {base}")),
        err => zk_error(&format!("creating {path}"), err),
    };
    match client.create(&base, &[], &persistent(acls)).await {
        Ok(_) | Err(zk::Error::NodeExists) => return Ok(()),
        Err(zk::Error::NoNode) => {}
        // The server checks the parent's ACL before whether the node exists: an existing base
        // in a chroot of another identity; the check of its ACL says more.
        Err(zk::Error::NoAuth) if matches!(client.check_stat(&base).await, Ok(Some(_))) => {
            return Ok(());
        }
        Err(err) => return Err(creating(&base, err)),
    }
    let chroot_depth = config.chroot().map_or(0, |c| c.matches('/').count());
    let mut path = String::new();
    for (depth, segment) in base.split('/').skip(1).enumerate() {
        path.push('/');
        path.push_str(segment);
        let acls = if depth + 1 < chroot_depth {
            zk::Acls::anyone_all()
        } else {
            acls
        };
        match client.create(&path, &[], &persistent(acls)).await {
            Ok(_) | Err(zk::Error::NodeExists) => {}
            Err(err) => return Err(creating(&path, err)),
        }
    }
    Ok(())
}

/// Creates the base node if missing and checks that this session may create lock nodes in it
/// (a wrong password shows up here: `addauth digest` always succeeds, the ACL tells); warns
/// when anyone may. Usually one read: the base exists.
async fn check_base(client: &zk::Client, config: &ZkConfig, acls: zk::Acls<'static>) -> Result<()> {
    let base = config.base_path();
    let acl = match client.get_acl(&base).await {
        Err(zk::Error::NoNode) => {
            create_base(client, config, acls).await?;
            client.get_acl(&base).await
        }
        other => other,
    };
    let (base_acls, _) = acl.map_err(|err| match err {
        zk::Error::NoAuth => denied(config, &base, "reading the ACL"),
        err => zk_error(&format!("reading the ACL of {base}"), err),
    })?;
    match judge(&base_acls, config.digest()) {
        Access::Granted => Ok(()),
        Access::Open => {
            warn!(
                base = %base,
                "{base} is open (world:anyone may create, delete or change nodes in it; it was \
                 created without credentials): another client can remove or replace this \
                 client's lock nodes; restrict it (setAcl) or use a new chroot"
            );
            Ok(())
        }
        Access::Denied(why) => {
            // A super user (or an ACL scheme the check does not know) passes the server's own
            // check: ask the server, with a probe node that is removed at once.
            let probe = format!("{base}/.distlock-access-probe");
            match client
                .create(&probe, &[], &zk::CreateMode::Ephemeral.with_acls(acls))
                .await
            {
                Ok(_) | Err(zk::Error::NodeExists) => {
                    let _ = client.delete(&probe, None).await;
                    Ok(())
                }
                Err(zk::Error::NoAuth) => Err(Error::backend(
                    format!(
                        "ZooKeeper at {}: cannot create lock nodes in {base}: {why}",
                        config.hosts().join(",")
                    ),
                    zk::Error::NoAuth,
                )),
                Err(err) => Err(zk_error(&format!("probing access to {base}"), err)),
            }
        }
    }
}
