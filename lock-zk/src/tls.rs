//! Why a connection failed at the TLS level (feature `tls`). zookeeper-client reports every
//! failed connection as "no available hosts"; after such a failure this module runs one TLS
//! handshake of its own (rustls, ring) to each host and names the cause: an untrusted server
//! certificate, a refused client certificate, a plain port given to `zks://`, or a TLS port
//! given to `zk://`. These are configuration errors, not outages: the caller makes them
//! non-retryable.

use std::io::{self, Read as _};
use std::net::{TcpStream, ToSocketAddrs as _};
use std::sync::Arc;
use std::time::Duration;

use distlock_core::tls::TlsMaterial;
use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

/// The TLS-level reason why `hosts` refused us, if there is one: `material` is the
/// configuration's (`zks://`), or `None` for a plain `zk://` URL (then the question is whether
/// the server speaks TLS).
pub(crate) async fn diagnose(
    hosts: &[String],
    material: Option<TlsMaterial>,
    timeout: Duration,
) -> Option<String> {
    let hosts = hosts.to_vec();
    tokio::task::spawn_blocking(move || {
        let config = client_config(material.as_ref())?;
        hosts
            .iter()
            .find_map(|host| probe(host, config.clone(), material.is_some(), timeout))
    })
    .await
    .ok()
    .flatten()
}

fn client_config(material: Option<&TlsMaterial>) -> Option<Arc<rustls::ClientConfig>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .ok()?;
    let mut roots = RootCertStore::empty();
    if let Some(ca) = material.and_then(|m| m.ca_pem.as_deref()) {
        for cert in CertificateDer::pem_slice_iter(ca) {
            roots.add(cert.ok()?).ok()?;
        }
    }
    let builder = builder.with_root_certificates(roots);
    let config = match material.and_then(|m| m.identity.as_ref()) {
        Some((cert, key)) => {
            let chain = CertificateDer::pem_slice_iter(cert)
                .collect::<Result<Vec<_>, _>>()
                .ok()?;
            let key = PrivateKeyDer::from_pem_slice(key).ok()?;
            builder.with_client_auth_cert(chain, key).ok()?
        }
        None => builder.with_no_client_auth(),
    };
    Some(Arc::new(config))
}

/// One handshake with `host` (`name:port`).
fn probe(
    host: &str,
    config: Arc<rustls::ClientConfig>,
    secure: bool,
    timeout: Duration,
) -> Option<String> {
    let (name, _) = host.rsplit_once(':')?;
    let name = name.trim_start_matches('[').trim_end_matches(']');
    let server_name = ServerName::try_from(name.to_owned()).ok()?;
    let addr = host.to_socket_addrs().ok()?.next()?;
    // Not reachable at all: not a TLS question.
    let mut tcp = TcpStream::connect_timeout(&addr, timeout).ok()?;
    tcp.set_read_timeout(Some(timeout)).ok()?;
    tcp.set_write_timeout(Some(timeout)).ok()?;
    let mut conn = rustls::ClientConnection::new(config, server_name).ok()?;
    let mut handshake = Ok(());
    while conn.is_handshaking() {
        if let Err(err) = conn.complete_io(&mut tcp) {
            handshake = Err(err);
            break;
        }
    }
    let tls_error = |err: &io::Error| {
        err.get_ref()
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
            .cloned()
    };
    match (secure, handshake) {
        (true, Ok(())) => {
            // TLS 1.3: a refused client certificate arrives after the handshake.
            tcp.set_read_timeout(Some(Duration::from_millis(300)))
                .ok()?;
            let mut stream = rustls::Stream::new(&mut conn, &mut tcp);
            let mut byte = [0u8; 1];
            let err = stream.read_exact(&mut byte).err()?;
            match tls_error(&err) {
                Some(rustls::Error::AlertReceived(alert)) => Some(format!(
                    "{host} refused the TLS session ({alert:?}): does it need a client \
                     certificate (cert=, key=) signed by a CA it trusts?"
                )),
                _ => None,
            }
        }
        (true, Err(err)) => Some(match tls_error(&err) {
            Some(rustls::Error::InvalidCertificate(why)) => format!(
                "the certificate of {host} is not trusted by the certificate authority of ca= \
                 ({why:?})"
            ),
            Some(rustls::Error::AlertReceived(alert)) => format!(
                "{host} refused the TLS handshake ({alert:?}): does it need a client \
                 certificate (cert=, key=) signed by a CA it trusts?"
            ),
            Some(other) => format!(
                "{host} does not speak TLS ({other}): is it the plain clientPort? zks:// needs \
                 the servers' secureClientPort"
            ),
            None => format!(
                "{host} ended the TLS handshake ({}): is it the plain clientPort? zks:// needs \
                 the servers' secureClientPort",
                distlock_core::io_cause(&err).unwrap_or_else(|| err.to_string())
            ),
        }),
        // Plain URL: a server that sends a certificate speaks TLS.
        (false, Err(err))
            if matches!(
                tls_error(&err),
                Some(rustls::Error::InvalidCertificate(_) | rustls::Error::AlertReceived(_))
            ) =>
        {
            Some(format!(
                "{host} speaks TLS (its secureClientPort?): connect with \
                 zks://host:port?ca=PATH"
            ))
        }
        (false, _) => None,
    }
}
