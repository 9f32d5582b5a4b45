//! Output that never panics: `println!` and `eprintln!` panic when the stream is gone.
//!
//! Rust ignores SIGPIPE, so a write to a pipe whose reader has exited (`distlock list | head
//! -1`) fails with `BrokenPipe`. On stdout that ends the command quietly with
//! [`CLOSED_STDOUT`] (141, what a shell reports for a command killed by SIGPIPE); on stderr the
//! line is dropped, as there is nobody left to tell. SIGPIPE itself stays ignored, so that
//! `run` and `elect` never die of it while they hold a lock (their command gets the default
//! SIGPIPE back).

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
