//! etcd client errors as distlock errors, and which of them are worth retrying.

use distlock_core::Error;
use distlock_core::backend::{RetryPolicy, retrying};
use std::fmt;
use std::sync::Arc;

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

/// Sends an etcd request, repeated under the core's [`RetryPolicy::TRANSIENT`] after a
/// transport error for which `repeatable` says the request may be sent again, and maps the
/// final error (`what` names the operation).
pub(crate) async fn transient<T, F, Fut>(
    what: &str,
    repeatable: fn(&etcd_client::Error) -> bool,
    op: F,
) -> Result<T, Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, etcd_client::Error>>,
{
    retrying(what, RetryPolicy::TRANSIENT, repeatable, op)
        .await
        .map_err(|e| map_err(what, e))
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
    struct Shared(Arc<etcd_client::Error>);
    impl fmt::Display for Shared {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            self.0.fmt(f)
        }
    }
    impl std::error::Error for Shared {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&*self.0)
        }
    }
    let message = format!("{what}: {}", cause(err));
    let source = Shared(err.clone());
    if retryable(err) {
        Error::unavailable(message, source)
    } else {
        Error::backend(message, source)
    }
}
