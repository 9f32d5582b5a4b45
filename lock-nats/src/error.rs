//! NATS client errors as distlock errors, and which of them are worth retrying.

use std::fmt::Display;

use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::stream::LastRawMessageErrorKind;
use distlock_core::Error;

/// A backend error with no client error behind it.
pub(crate) fn backend_msg(message: impl Into<String>) -> Error {
    Error::Backend {
        message: message.into(),
        source: None,
    }
}

/// What a JetStream publish (a write of the lock protocol) ended with.
pub(crate) enum Written {
    /// Stored at this revision.
    Stored(u64),
    /// Refused because the expected last revision was not the last one: somebody else wrote.
    Conflict,
}

/// Maps a publish's result: a refused expectation is [`Written::Conflict`]; a timeout or a
/// broken connection is retryable ([`Error::Unavailable`], the write may or may not have
/// been stored); anything else is [`Error::Backend`].
pub(crate) fn written(
    what: &str,
    result: Result<u64, async_nats::jetstream::context::PublishError>,
) -> Result<Written, Error> {
    match result {
        Ok(rev) => Ok(Written::Stored(rev)),
        Err(err) => match err.kind() {
            PublishErrorKind::WrongLastSequence => Ok(Written::Conflict),
            PublishErrorKind::TimedOut | PublishErrorKind::BrokenPipe => {
                Err(Error::unavailable(format!("NATS {what}: {err}"), err))
            }
            PublishErrorKind::StreamNotFound => Err(Error::unavailable(
                format!(
                    "NATS {what}: no stream answered (the bucket's stream has no leader, or was deleted)"
                ),
                err,
            )),
            _ if transient(&err) => Err(Error::unavailable(format!("NATS {what}: {err}"), err)),
            _ => Err(Error::backend(format!("NATS {what}: {err}"), err)),
        },
    }
}

/// Whether a refused write was refused only because an earlier write of its subject was still
/// being proposed in the stream's cluster (10164): not stored, so worth sending again.
pub(crate) fn subject_busy(err: &(dyn std::error::Error + 'static)) -> bool {
    jetstream_code(err) == Some(10164)
}

fn jetstream_code(err: &(dyn std::error::Error + 'static)) -> Option<u64> {
    let mut source = err.source();
    while let Some(e) = source {
        if let Some(js) = e.downcast_ref::<async_nats::jetstream::Error>() {
            return Some(js.error_code().0);
        }
        source = e.source();
    }
    None
}

/// JetStream answers that say "not now" rather than "no": the cluster has no quorum or no
/// leader (10008), or a clustered stream cannot check an expected last sequence while an
/// earlier write of the subject is still being proposed (10164, "wrong last sequence" without
/// a number: not an answer about the key, so no conflict).
fn transient(err: &(dyn std::error::Error + 'static)) -> bool {
    matches!(jetstream_code(err), Some(10008 | 10164))
}

/// Whether a message read failed because there is no such message.
pub(crate) fn not_found(kind: &LastRawMessageErrorKind) -> bool {
    matches!(kind, LastRawMessageErrorKind::NoMessageFound)
}

/// A failed read or request: retryable unless the server refused it for a reason of its own.
pub(crate) fn request(what: &str, err: impl std::error::Error + Send + Sync + 'static) -> Error {
    let text = err.to_string();
    // The JetStream API answers an unknown or leaderless stream with an error code; both heal.
    if text.contains("timed out") || text.contains("no responders") || text.contains("10008") {
        Error::unavailable(format!("NATS {what}: {text}"), err)
    } else if text.contains("jetstream error") || text.contains("JetStream") {
        Error::backend(format!("NATS {what}: {text}"), err)
    } else {
        Error::unavailable(format!("NATS {what}: {text}"), err)
    }
}

/// A failed connection: refused credentials and TLS failures are the caller's to fix (not
/// retryable), anything else is [`Error::Unavailable`].
pub(crate) fn connect(at: &dyn Display, err: async_nats::ConnectError) -> Error {
    use async_nats::ConnectErrorKind as K;
    let message = format!("NATS at {at}: {err}");
    match err.kind() {
        K::AuthorizationViolation | K::Authentication | K::Tls | K::ServerParse => {
            Error::backend(message, err)
        }
        _ => Error::unavailable(message, err),
    }
}
