//! Exit codes and the error that carries one.

use distlock::Error;

use crate::out::printable;

/// Bad flags (clap's own code).
#[allow(dead_code, reason = "documents clap's exit code next to ours")]
pub(crate) const USAGE: u8 = 2;
/// `leader`: the election has no leader.
pub(crate) const NO_LEADER: u8 = 3;
/// The lock service is unreachable (EX_UNAVAILABLE).
pub(crate) const UNAVAILABLE: u8 = 69;
/// The lock is busy and the wait ran out (EX_TEMPFAIL).
pub(crate) const BUSY: u8 = 75;
/// The lock was lost while the command ran.
pub(crate) const LOST: u8 = 76;
/// `run --skip-if-held`: the lock was held elsewhere, nothing was run (not an error: for cron).
pub(crate) const SKIPPED: u8 = 80;
/// Bad URL, option or name (EX_CONFIG).
pub(crate) const CONFIG: u8 = 78;
/// The command exists but could not be executed.
pub(crate) const NOT_EXECUTABLE: u8 = 126;
/// The command was not found.
pub(crate) const NOT_FOUND: u8 = 127;
/// Anything else.
pub(crate) const OTHER: u8 = 1;
/// Stdout was closed by its reader (`distlock list | head -1`): the output stopped there,
/// quietly. 128 + SIGPIPE, as a shell reports a command killed by SIGPIPE.
pub(crate) const CLOSED_STDOUT: u8 = 141;

/// A failure with the exit code it maps to.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) code: u8,
    /// One line: what failed and why.
    pub(crate) message: String,
    /// The error's sources, outermost first, each one line: shown with `-v`.
    pub(crate) causes: Vec<String>,
}

impl Failure {
    pub(crate) fn new(code: u8, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            causes: Vec::new(),
        }
    }

    /// A failure that has nothing to tell (its message is empty): only the exit code.
    pub(crate) fn silent(code: u8) -> Self {
        Self::new(code, "")
    }

    /// Prints the failure on stderr: one line, then with `verbose` the chain of causes; a
    /// [`silent`](Self::silent) failure prints nothing. Control characters are escaped (a
    /// message may quote a server's answer or a name another process chose).
    pub(crate) fn report(&self, verbose: bool) {
        if self.message.is_empty() {
            return;
        }
        crate::out::stderr_line(format_args!("distlock: {}", printable(&self.message)));
        if verbose {
            for cause in &self.causes {
                crate::out::stderr_line(format_args!("  caused by: {}", printable(cause)));
            }
        }
    }

    /// Maps a lock error to its exit code, with `context` in front of the message.
    pub(crate) fn from_lock(err: &Error, context: impl std::fmt::Display) -> Self {
        let context = context.to_string();
        let context = if context.is_empty() {
            context
        } else {
            format!("{context}: ")
        };
        let code = match err {
            Error::InvalidName { .. }
            | Error::InvalidOptions(_)
            | Error::InvalidConfig(_)
            | Error::Unsupported(_)
            | Error::Mismatch { .. } => CONFIG,
            Error::Unavailable { .. } | Error::QuorumNotReached { .. } => UNAVAILABLE,
            Error::Timeout { .. } => BUSY,
            Error::Lost { .. } | Error::NotHeld { .. } => LOST,
            _ => OTHER,
        };
        Self {
            code,
            message: one_line(&format!("{context}{err}")),
            causes: causes(err),
        }
    }
}

/// The library's errors say what failed and why in their own line (the backends put the short
/// cause in the message); their sources are the client libraries' full errors, often layered
/// and verbose, so they are shown only on request.
fn one_line(text: &str) -> String {
    text.replace(['\n', '\r'], " ")
}

/// The source chain of `err`, one line each.
fn causes(err: &dyn std::error::Error) -> Vec<String> {
    let mut causes = Vec::new();
    let mut source = err.source();
    while let Some(cause) = source {
        causes.push(one_line(&cause.to_string()));
        source = cause.source();
    }
    causes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("{0}")]
    struct Wrapped(String, #[source] Option<Box<Wrapped>>);

    #[test]
    fn the_message_is_one_line_and_the_causes_are_kept() {
        let io = Wrapped("Connection refused (os error 111)".into(), None);
        let mid = Wrapped("connection\nrefused".into(), Some(Box::new(io)));
        let err = Error::Unavailable {
            message: "cannot connect to Redis at 127.0.0.1:1: connection refused".into(),
            source: Some(Box::new(mid)),
        };
        let failure = Failure::from_lock(&err, "cannot use redis://127.0.0.1:1");
        assert_eq!(
            failure.message,
            "cannot use redis://127.0.0.1:1: backend unavailable: cannot connect to Redis at \
             127.0.0.1:1: connection refused"
        );
        assert_eq!(failure.code, UNAVAILABLE);
        assert_eq!(
            failure.causes,
            ["connection refused", "Connection refused (os error 111)"]
        );
    }
}
