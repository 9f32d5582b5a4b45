//! Exit codes and the error that carries one.

use distlock::Error;

/// Bad flags (clap's own code).
#[allow(dead_code, reason = "documents clap's exit code next to ours")]
pub(crate) const USAGE: u8 = 2;
/// The lock service is unreachable (EX_UNAVAILABLE).
pub(crate) const UNAVAILABLE: u8 = 69;
/// The lock is busy and the wait ran out (EX_TEMPFAIL).
pub(crate) const BUSY: u8 = 75;
/// The lock was lost while the command ran.
pub(crate) const LOST: u8 = 76;
/// Bad URL, option or name (EX_CONFIG).
pub(crate) const CONFIG: u8 = 78;
/// The command exists but could not be executed.
pub(crate) const NOT_EXECUTABLE: u8 = 126;
/// The command was not found.
pub(crate) const NOT_FOUND: u8 = 127;
/// Anything else.
pub(crate) const OTHER: u8 = 1;

/// A failure with the exit code it maps to.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) code: u8,
    pub(crate) message: String,
}

impl Failure {
    pub(crate) fn new(code: u8, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    /// Maps a lock error to its exit code, with `context` in front of the message.
    pub(crate) fn from_lock(err: &Error, context: impl std::fmt::Display) -> Self {
        let code = match err {
            Error::InvalidName { .. }
            | Error::InvalidOptions(_)
            | Error::InvalidConfig(_)
            | Error::Unsupported(_) => CONFIG,
            Error::Unavailable { .. } | Error::QuorumNotReached { .. } => UNAVAILABLE,
            Error::Timeout { .. } => BUSY,
            Error::Lost { .. } | Error::NotHeld { .. } => LOST,
            _ => OTHER,
        };
        Self {
            code,
            message: with_causes(format!("{context}: {err}"), err),
        }
    }
}

/// `message` followed by each cause of `err` whose text it does not already contain: one line,
/// without the repetitions a chain of wrapped errors makes ("refused: refused: refused").
fn with_causes(mut message: String, err: &dyn std::error::Error) -> String {
    let mut source = err.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !text.is_empty() && !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = cause.source();
    }
    message.replace('\n', " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("{0}")]
    struct Wrapped(String, #[source] Option<Box<Wrapped>>);

    #[test]
    fn causes_are_appended_once() {
        let io = Wrapped("Connection refused (os error 111)".into(), None);
        let mid = Wrapped(
            "connection refused on 127.0.0.1:1: Connection refused (os error 111)".into(),
            Some(Box::new(io)),
        );
        let err = Error::Unavailable {
            message: "cannot reach 127.0.0.1:1".into(),
            source: Some(Box::new(mid)),
        };
        let failure = Failure::from_lock(&err, "cannot use redis://127.0.0.1:1");
        assert_eq!(
            failure.message,
            "cannot use redis://127.0.0.1:1: backend unavailable: cannot reach 127.0.0.1:1: \
             connection refused on 127.0.0.1:1: Connection refused (os error 111)"
        );
        assert_eq!(failure.message.matches("os error 111").count(), 1);
    }
}
