//! Output that never panics: `println!` and `eprintln!` panic when the stream is gone.
//!
//! Rust ignores SIGPIPE, so a write to a pipe whose reader has exited (`distlock list | head
//! -1`) fails with `BrokenPipe`. On stdout that ends the command quietly with
//! [`CLOSED_STDOUT`] (141, what a shell reports for a command killed by SIGPIPE); on stderr the
//! line is dropped, as there is nobody left to tell. SIGPIPE itself stays ignored, so that
//! `run` and `elect` never die of it while they hold a lock (their command gets the default
//! SIGPIPE back).

use std::borrow::Cow;
use std::fmt::Display;
use std::io::Write;

use crate::exit::{CLOSED_STDOUT, Failure, OTHER};

/// Writes `bytes` to stdout and flushes them. A closed stdout is a quiet failure with
/// [`CLOSED_STDOUT`]; any other write error is one with its cause.
pub(crate) fn write(bytes: &[u8]) -> Result<(), Failure> {
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(bytes)
        .and_then(|()| stdout.flush())
        .map_err(|err| match err.kind() {
            std::io::ErrorKind::BrokenPipe => Failure::silent(CLOSED_STDOUT),
            _ => Failure::new(OTHER, format!("cannot write to stdout: {err}")),
        })
}

/// Writes `line` and a newline to stdout, as [`write`].
pub(crate) fn line(line: impl Display) -> Result<(), Failure> {
    write(format!("{line}\n").as_bytes())
}

/// Writes `line` and a newline to stderr; a failed write is dropped (stderr is where
/// failures would be told).
pub(crate) fn stderr_line(line: impl Display) {
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// `text` (a lock name, an owner, a leader's value: anything another process may have
/// chosen) as a terminal may be given it: control characters (C0, DEL, C1) and the
/// bidirectional text controls escaped as Rust writes them (`\n`, `\u{1b}`), the rest as is.
/// `--json` output keeps the exact string instead (JSON escapes the control characters).
pub(crate) fn printable(text: &str) -> Cow<'_, str> {
    if !text.chars().any(unprintable) {
        return Cow::Borrowed(text);
    }
    let mut shown = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if unprintable(c) {
            shown.extend(c.escape_debug());
        } else {
            shown.push(c);
        }
    }
    Cow::Owned(shown)
}

/// Whether `c` must not reach a terminal as is: it moves the cursor, rings, starts an escape
/// sequence (ESC, CSI) or reorders the text around it (bidirectional overrides).
fn unprintable(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
        )
}

#[cfg(test)]
mod tests {
    use super::printable;

    #[test]
    fn control_characters_are_escaped_and_the_rest_kept() {
        assert_eq!(
            printable("evil\x1b]0;pwned\x07\x1b[2J"),
            "evil\\u{1b}]0;pwned\\u{7}\\u{1b}[2J"
        );
        assert_eq!(printable("a\nb\tc\r\u{9b}"), "a\\nb\\tc\\r\\u{9b}");
        assert_eq!(printable("x\u{202e}gpj.exe"), "x\\u{202e}gpj.exe");
        assert_eq!(
            printable("jobs/ünïcode \\ \"q\" 'x'"),
            "jobs/ünïcode \\ \"q\" 'x'"
        );
        assert!(matches!(printable("plain"), std::borrow::Cow::Borrowed(_)));
    }
}
