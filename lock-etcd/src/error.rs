//! etcd client errors as distlock errors, and which of them are worth retrying.

use distlock_core::Error;
use distlock_core::backend::{RetryPolicy, retrying};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::EtcdConfig;
use crate::members::Members;

/// Maps a client error: transport and availability problems are retryable.
pub(crate) fn map_err(what: &str, err: etcd_client::Error) -> Error {
    let message = format!("{what}: {}", cause(&err));
    if retryable(&err) {
        Error::unavailable(message, err)
    } else {
        Error::backend(message, err)
    }
}

/// A client error in one short line: the operating system's reason for a transport failure
/// (`connection refused`) instead of the gRPC and transport layers' debug dump.
pub(crate) fn cause(err: &etcd_client::Error) -> String {
    match (distlock_core::io_cause(err), err) {
        (Some(io), _) => io,
        (None, etcd_client::Error::GRpcStatus(status)) => {
            format!("{} ({:?})", status.message(), status.code())
        }
        (None, other) => other.to_string(),
    }
}

/// Whether a client error is a transport or availability problem (worth retrying).
pub(crate) fn retryable(err: &etcd_client::Error) -> bool {
    use etcd_client::Error as E;
    match err {
        // Not retryable: INVALID_ARGUMENT 3, NOT_FOUND 5, ALREADY_EXISTS 6, PERMISSION_DENIED 7,
        // FAILED_PRECONDITION 9, OUT_OF_RANGE 11, UNIMPLEMENTED 12, UNAUTHENTICATED 16.
        E::GRpcStatus(status) => !matches!(status.code() as i32, 3 | 5 | 6 | 7 | 9 | 11 | 12 | 16),
        E::TransportError(_)
        | E::IoError(_)
        | E::WatchError(_)
        | E::LeaseKeepAliveError(_)
        | E::EndpointError(_) => true,
        _ => false,
    }
}

/// Classifies a failed connection (`err`: the client's last error, if any): a refused user or
/// password, a failed TLS handshake (untrusted or expired certificate, TLS to a plain port, no
/// client certificate where one is required) and a plain connection to a TLS port are the
/// caller's to fix, so they are [`Error::Backend`] (not retryable); each names the endpoints
/// and the cause. Anything else is [`Error::Unavailable`], with the network's reason.
pub(crate) async fn connect_err(
    config: &EtcdConfig,
    timeout: Duration,
    err: Option<etcd_client::Error>,
) -> Error {
    let at = format!("etcd at {}", config.hosts());
    if let Some(err) = err {
        if let etcd_client::Error::InvalidArgs(_) | etcd_client::Error::InvalidUri(_) = err {
            return Error::InvalidConfig(format!("{at}: {err}"));
        }
        if let Some(tls) = tls_cause(&err) {
            let hint = client_cert_hint(config, &tls);
            return Error::backend(format!("TLS with {at} failed: {tls}{hint}"), err);
        }
        if !retryable(&err) {
            // A wrong password and an unknown user get the same answer from etcd.
            let who = match config.username() {
                Some(user) => format!(" for user {:?}", distlock_core::service_url::echo(user)),
                None => String::new(),
            };
            return Error::backend(
                format!("{at} refused the connection{who}: {}", cause(&err)),
                err,
            );
        }
        if config.is_tls() && (handshake_eof(&err) || speaks_plain_h2(config, timeout / 4).await) {
            return Error::backend(
                format!(
                    "TLS with {at} failed: the server does not speak TLS on this port (a \
                     plain port? then use etcd:// or http:// endpoints)"
                ),
                err,
            );
        }
        if let Some(tls) = tls_diagnosis(config, timeout / 4).await {
            return Error::backend(format!("TLS with {at} failed: {tls}"), err);
        }
        if !config.is_tls() && speaks_tls(config.endpoints(), timeout / 4).await {
            return Error::backend(
                format!(
                    "{at} expects TLS, this client connected without: use etcds:// \
                     (or https:// endpoints)"
                ),
                err,
            );
        }
        // The gRPC status keeps the OS's reason out of its source chain: ask the network why.
        let reason = match distlock_core::tcp_cause(config.endpoints(), timeout / 4).await {
            Some(io) => io,
            None => cause(&err),
        };
        return Error::Unavailable {
            message: format!("cannot connect to {at}: {reason}"),
            source: Some(Box::new(err)),
        };
    }
    let reason = distlock_core::tcp_cause(config.endpoints(), timeout / 4)
        .await
        .unwrap_or_else(|| "no answer".into());
    Error::Unavailable {
        message: format!("cannot connect to {at}: {reason}"),
        source: None,
    }
}

/// The TLS layer's reason, when `err` is a failed TLS handshake or a TLS alert from the peer
/// (an untrusted or expired certificate, a missing client certificate, a plain server's answer:
/// rustls reports those as invalid data; retrying cannot help).
pub(crate) fn tls_cause(err: &etcd_client::Error) -> Option<String> {
    io_errors(err)
        .find(|io| io.kind() == std::io::ErrorKind::InvalidData)
        .and_then(|io| distlock_core::io_cause(io))
}

/// A hint when the server refused the handshake with an alert and no client certificate was
/// given (a server that requires one answers so).
fn client_cert_hint(config: &EtcdConfig, tls: &str) -> &'static str {
    match config.tls_files() {
        Some(files) if !files.has_identity() && tls.contains("alert") => {
            " (does the server require a client certificate? give cert= and key=)"
        }
        _ => "",
    }
}

/// Why TLS with the first reachable endpoint fails, found by a handshake of our own with the
/// configured CA and client certificate, then a short read: with TLS 1.3 the server checks the
/// client certificate after the client's side of the handshake is done, and its refusal (an
/// alert) can lose the race against the HTTP/2 client's first write, which then only sees a
/// broken pipe. `None` when the handshake and the read raise no TLS error (or no endpoint
/// accepts a connection).
async fn tls_diagnosis(config: &EtcdConfig, timeout: Duration) -> Option<String> {
    use tokio_rustls::rustls;
    let material = config.tls_files()?.load().await.ok()?;
    let tls = tls_client_config(&material).ok()?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(tls));
    for endpoint in config.endpoints() {
        let hostport = endpoint
            .split_once("://")
            .map_or(endpoint.as_str(), |(_, h)| h);
        let host = hostport.rsplit_once(':').map_or(hostport, |(h, _)| h);
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let Ok(name) = rustls::pki_types::ServerName::try_from(host.to_owned()) else {
            continue;
        };
        let attempt = async {
            let tcp = tokio::net::TcpStream::connect(hostport).await.ok()?;
            let refused = |err: std::io::Error| {
                (err.kind() == std::io::ErrorKind::InvalidData)
                    .then(|| distlock_core::io_cause(&err))
                    .flatten()
            };
            let mut stream = match connector.connect(name, tcp).await {
                Ok(stream) => stream,
                Err(err) => return Some(refused(err)),
            };
            let mut byte = [0u8; 1];
            match tokio::time::timeout(timeout, stream.read(&mut byte)).await {
                Ok(Err(err)) => Some(refused(err)),
                _ => Some(None),
            }
        };
        if let Ok(Some(found)) = tokio::time::timeout(timeout * 2, attempt).await {
            return found.map(|tls| format!("{tls}{}", client_cert_hint(config, &tls)));
        }
    }
    None
}

/// A rustls client configuration like the one etcd-client builds from the same files (ring,
/// the CA or else the public roots, the client certificate if any, ALPN h2).
fn tls_client_config(
    material: &distlock_core::tls::TlsMaterial,
) -> Result<tokio_rustls::rustls::ClientConfig, distlock_core::BoxError> {
    use tokio_rustls::rustls;
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let mut roots = rustls::RootCertStore::empty();
    match &material.ca_pem {
        Some(pem) => {
            for cert in CertificateDer::pem_slice_iter(pem) {
                roots.add(cert?)?;
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots);
    let mut config = match &material.identity {
        Some((cert, key)) => builder.with_client_auth_cert(
            CertificateDer::pem_slice_iter(cert).collect::<Result<Vec<_>, _>>()?,
            PrivateKeyDer::from_pem_slice(key)?,
        )?,
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// Whether the server closed the connection during the TLS handshake (a plain server, which
/// takes the client's hello for garbage).
fn handshake_eof(err: &etcd_client::Error) -> bool {
    io_errors(err).any(|io| {
        io.kind() == std::io::ErrorKind::UnexpectedEof && io.to_string().contains("handshake")
    })
}

/// The I/O errors in `err`'s source chain (a gRPC status's too: etcd-client's error does not
/// name the status as its source).
fn io_errors(err: &etcd_client::Error) -> impl Iterator<Item = &std::io::Error> {
    let first: &(dyn std::error::Error + 'static) = match err {
        etcd_client::Error::GRpcStatus(status) => status,
        other => other,
    };
    std::iter::successors(Some(first), |e| e.source())
        .filter_map(|e| e.downcast_ref::<std::io::Error>())
}

/// Whether the first endpoint that accepts a connection answers the HTTP/2 connection preface
/// in plain text with a SETTINGS frame: a plain port that a TLS client reached (which the
/// server may have answered with a reset instead of a handshake).
async fn speaks_plain_h2(config: &EtcdConfig, timeout: Duration) -> bool {
    // The client preface, then an empty SETTINGS frame (length 0, type 4, no flags, stream 0).
    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0";
    for endpoint in config.endpoints() {
        let host = endpoint
            .split_once("://")
            .map_or(endpoint.as_str(), |(_, h)| h);
        let sniff = async {
            let mut stream = tokio::net::TcpStream::connect(host).await.ok()?;
            stream.write_all(PREFACE).await.ok()?;
            let mut frame = [0u8; 9];
            stream.read_exact(&mut frame).await.ok()?;
            Some(frame[3] == 0x04)
        };
        if let Ok(Some(plain)) = tokio::time::timeout(timeout, sniff).await {
            return plain;
        }
    }
    false
}

/// Whether the first of `endpoints` that accepts a connection answers a (deliberately
/// malformed) TLS handshake record with a TLS alert: a TLS port that a plain client reached.
async fn speaks_tls(endpoints: &[String], timeout: Duration) -> bool {
    // A handshake record (0x16, TLS 1.0) holding an empty ClientHello: a TLS server refuses it
    // with an alert record (0x15 0x03 ..); a plain gRPC server does not.
    const HELLO: [u8; 9] = [0x16, 0x03, 0x01, 0x00, 0x04, 0x01, 0x00, 0x00, 0x00];
    for endpoint in endpoints {
        let host = endpoint
            .split_once("://")
            .map_or(endpoint.as_str(), |(_, h)| h);
        let sniff = async {
            let mut stream = tokio::net::TcpStream::connect(host).await.ok()?;
            stream.write_all(&HELLO).await.ok()?;
            let mut answer = [0u8; 2];
            stream.read_exact(&mut answer).await.ok()?;
            Some(answer == [0x15, 0x03])
        };
        if let Ok(Some(tls)) = tokio::time::timeout(timeout, sniff).await {
            return tls;
        }
    }
    false
}

/// How long one attempt of an etcd request may stay unanswered before it is sent again. A
/// request handed to the client library just after the member behind its connection died can
/// stay unanswered indefinitely: measured in tests/etcd.rs, a `put` sent 0-80 ms after the
/// leader's kill -9 had no answer after 5 s, while the next request was answered in 13-81 ms
/// (and the cluster served writes again 1.3-1.6 s after the kill, etcdctl measured in the same
/// run). Waiting for such an attempt would spend the whole operation timeout.
pub(crate) const ATTEMPT_TIMEOUT: Duration = Duration::from_millis(750);

/// How etcd requests in a caller's path are repeated: long enough to ride through a leader
/// election (measured: the cluster accepts writes again 1.3-1.6 s after its leader's kill -9,
/// and until then requests to the dead member fail at once with a connect error), about 2.3 s
/// of pauses in all, which the operation timeout cuts short.
/// ([`RetryPolicy::TRANSIENT`]'s 150 ms gave up long before the new leader served.)
pub(crate) const FAILOVER: RetryPolicy = RetryPolicy {
    retries: 12,
    first: Duration::from_millis(20),
    max: Duration::from_millis(250),
};

/// Why one attempt of an etcd request failed.
#[derive(Debug)]
pub(crate) enum AttemptError {
    /// The client library's error.
    Client(etcd_client::Error),
    /// No answer within [`ATTEMPT_TIMEOUT`] (the request may still be applied).
    Unanswered,
}

impl fmt::Display for AttemptError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Client(err) => f.write_str(&cause(err)),
            Self::Unanswered => write!(f, "no answer within {ATTEMPT_TIMEOUT:?}"),
        }
    }
}

impl AttemptError {
    /// The distlock error of the operation `what` that failed with this.
    pub(crate) fn into_error(self, what: &str) -> Error {
        match self {
            Self::Client(err) => map_err(what, err),
            Self::Unanswered => Error::Unavailable {
                message: format!("{what}: no answer from etcd within {ATTEMPT_TIMEOUT:?}"),
                source: None,
            },
        }
    }
}

/// Sends an etcd request, repeated under [`FAILOVER`] after a
/// transport error for which `repeatable` says the request may be sent again, or after an
/// attempt unanswered within [`ATTEMPT_TIMEOUT`] (so only for requests that are safe to apply
/// twice), and maps the final error (`what` names the operation).
pub(crate) async fn transient<T, F, Fut>(
    what: &str,
    repeatable: fn(&etcd_client::Error) -> bool,
    members: &Members,
    op: F,
) -> Result<T, Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, etcd_client::Error>>,
{
    attempts(what, repeatable, members, op)
        .await
        .map(|(answer, _)| answer)
        .map_err(|e| e.into_error(what))
}

/// As [`transient`], with the attempt's error unmapped and whether an earlier attempt went
/// unanswered or failed after it was sent (it may have been applied before the one that
/// answered). A failed attempt that may come from a dead member (no answer, no connection, a
/// broken one) is reported to `members`.
pub(crate) async fn attempts<T, F, Fut>(
    what: &str,
    repeatable: fn(&etcd_client::Error) -> bool,
    members: &Members,
    mut op: F,
) -> Result<(T, bool), AttemptError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, etcd_client::Error>>,
{
    let unanswered = std::sync::atomic::AtomicBool::new(false);
    let answer = retrying(
        what,
        FAILOVER,
        |err: &AttemptError| match err {
            AttemptError::Client(err) => repeatable(err),
            AttemptError::Unanswered => true,
        },
        || {
            let attempt = op();
            let unanswered = &unanswered;
            async move {
                match tokio::time::timeout(ATTEMPT_TIMEOUT, attempt).await {
                    Ok(Ok(answer)) => Ok(answer),
                    Ok(Err(err)) => {
                        if not_sent(&err) {
                            members.suspect();
                        } else if retryable(&err) {
                            // Sent, then the connection failed (`transport error`, seen when
                            // the leader was killed): it may have been applied.
                            unanswered.store(true, std::sync::atomic::Ordering::Relaxed);
                            members.suspect();
                        }
                        Err(AttemptError::Client(err))
                    }
                    Err(_) => {
                        unanswered.store(true, std::sync::atomic::Ordering::Relaxed);
                        members.suspect();
                        Err(AttemptError::Unanswered)
                    }
                }
            }
        },
    )
    .await?;
    Ok((answer, unanswered.into_inner()))
}

/// Whether a request certainly never reached a server (the connection could not be made).
pub(crate) fn not_sent(err: &etcd_client::Error) -> bool {
    match err {
        etcd_client::Error::GRpcStatus(status) => {
            // UNAVAILABLE 14, from a failed connection attempt.
            status.code() as i32 == 14 && status.message().contains("connect")
        }
        _ => false,
    }
}

/// Whether a write failed because its lease is gone.
pub(crate) fn lease_not_found(err: &etcd_client::Error) -> bool {
    matches!(err, etcd_client::Error::GRpcStatus(s) if s.message().contains("lease not found"))
}

pub(crate) fn protocol(message: &str) -> Error {
    Error::Backend {
        message: format!("unexpected etcd answer: {message}"),
        source: None,
    }
}

/// [`map_err`] for an error shared by several callers (the source is kept behind an `Arc`).
pub(crate) fn shared_err(what: &str, err: &Arc<etcd_client::Error>) -> Error {
    #[derive(Debug)]
    struct ArcError(Arc<etcd_client::Error>);
    impl fmt::Display for ArcError {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            self.0.fmt(f)
        }
    }
    impl std::error::Error for ArcError {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&*self.0)
        }
    }
    let message = format!("{what}: {}", cause(err));
    let source = ArcError(err.clone());
    if retryable(err) {
        Error::unavailable(message, source)
    } else {
        Error::backend(message, source)
    }
}
