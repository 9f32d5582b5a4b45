//! How a node connects over TLS ([`NodeTls`]), and what a connection that fails at once says
//! about the port ([`wrong_port`]).

use std::time::Duration;

use distlock_core::tls::TlsMaterial;
use distlock_core::{Error, Result};
use redis::IntoConnectionInfo;

use crate::RedisConfig;

/// How `rediss://` nodes verify their server and present themselves: read once per backend
/// from [`RedisConfig::tls`](crate::RedisConfig::tls).
#[derive(Clone, Debug, Default)]
pub(crate) struct NodeTls {
    pub(crate) material: TlsMaterial,
    pub(crate) skip_verify: bool,
}

impl NodeTls {
    /// Reads the configuration's TLS files (nothing to read without a `rediss://` node).
    pub(crate) async fn load(config: &RedisConfig) -> Result<Self> {
        let material = if config.is_tls() {
            // The client library builds its rustls configuration with the process's default
            // crypto provider, which rustls cannot choose when another crate of the build
            // (zookeeper-client's TLS) brings a second one: then it panics. Ring, the
            // workspace's provider, becomes the default unless one is installed already.
            let _ = rustls::crypto::ring::default_provider().install_default();
            config.tls.load().await?
        } else {
            TlsMaterial::default()
        };
        if config.danger_skip_verify && config.is_tls() {
            tracing::warn!(
                "danger_skip_verify: the Redis servers' TLS certificates are NOT verified; \
                 anyone on the network path can read and change the lock traffic"
            );
        }
        Ok(Self {
            material,
            skip_verify: config.danger_skip_verify,
        })
    }

    /// The client library's client for the node URL `url` (`redis://`, `rediss://` or
    /// `redis+unix://`), `name`d in `CLIENT SETINFO`.
    pub(crate) fn client(&self, url: &str, name: &str) -> Result<redis::Client> {
        let shown = distlock_core::service_url::redact(url);
        let invalid =
            |e: redis::RedisError| Error::InvalidConfig(format!("invalid Redis URL {shown}: {e}"));
        let tls = url.starts_with("rediss://");
        let info = if tls && self.skip_verify {
            // The client library's spelling of "no verification" is the #insecure fragment.
            format!("{url}#insecure").into_connection_info()
        } else {
            url.into_connection_info()
        }
        .map_err(invalid)?;
        let settings = info
            .redis_settings()
            .clone()
            .set_lib_name(name, env!("CARGO_PKG_VERSION"));
        let info = info.set_redis_settings(settings);
        if !tls {
            return redis::Client::open(info).map_err(invalid);
        }
        let certificates = redis::TlsCertificates {
            client_tls: self
                .material
                .identity
                .clone()
                .map(|(client_cert, client_key)| redis::ClientTlsConfig {
                    client_cert,
                    client_key,
                }),
            root_cert: self.material.ca_pem.clone(),
        };
        redis::Client::build_with_tls(info, certificates).map_err(|e| {
            Error::InvalidConfig(format!(
                "TLS files for {shown}: {}",
                e.detail().unwrap_or("not usable")
            ))
        })
    }
}

/// Why a connection to `addr` that timed out or broke at once cannot work, when the port
/// speaks the other protocol: a plain Redis behind a `rediss://` URL (the TLS handshake waits
/// forever for an answer that never comes), or a TLS-only port behind a `redis://` URL (the
/// server resets the connection at the first clear-text byte). Asked once, in clear text
/// (`PING`), within `timeout`; `None` when that says nothing certain.
pub(super) async fn wrong_port(addr: &str, tls: bool, timeout: Duration) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let probe = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
        stream.write_all(b"PING\r\n").await.ok()?;
        let mut first = [0u8; 1];
        Some(stream.read(&mut first).await.map(|n| (n, first[0])))
    };
    match (tls, tokio::time::timeout(timeout, probe).await) {
        // A RESP answer (+PONG, -NOAUTH ...) in clear text: a plain Redis port.
        (true, Ok(Some(Ok((1, b'+' | b'-'))))) => Some(
            "the server answers plain Redis, not TLS (use redis://, or the server's TLS port)"
                .into(),
        ),
        // Closed or reset without a byte: not a plain Redis port; a TLS-only one refuses
        // clear text this way.
        (false, Ok(Some(Ok((0, _)) | Err(_)))) => Some(
            "the server closed the connection at the first clear-text byte (a TLS-only port? \
             use rediss://)"
                .into(),
        ),
        _ => None,
    }
}
