//! The harness of the CLI tests: the real `distlock` binary in a fresh directory whose SQLite
//! file every process of a test shares (through `DISTLOCK_URL`).

use std::path::PathBuf;
use std::process::{Command, Output};

/// The binary under test.
pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_distlock");

/// A temporary directory holding the lock file; the working directory of every command.
pub(crate) struct Env {
    dir: tempfile::TempDir,
}

impl Env {
    pub(crate) fn new() -> Self {
        Self {
            dir: tempfile::tempdir().expect("temp dir"),
        }
    }

    /// The lock service URL: the directory's SQLite file.
    pub(crate) fn url(&self) -> String {
        format!("sqlite://{}", self.path("locks.db").display())
    }

    /// A file in the directory.
    pub(crate) fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `distlock ARGS` against the directory's lock file, not started yet.
    pub(crate) fn distlock(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(BIN);
        cmd.args(args)
            .env("DISTLOCK_URL", self.url())
            .current_dir(self.dir.path());
        cmd
    }

    /// Runs `distlock ARGS` to the end.
    pub(crate) fn run(&self, args: &[&str]) -> Output {
        self.distlock(args).output().expect("run distlock")
    }
}

/// Whether process `pid` runs (a zombie has ended: it only waits to be reaped).
pub(crate) fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        let state = stat.rsplit_once(')').map(|(_, rest)| rest.trim_start());
        !state.is_some_and(|s| s.starts_with('Z') || s.starts_with('X'))
    })
}
