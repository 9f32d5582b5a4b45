//! Without --url and DISTLOCK_URL, every `distlock` of a user shares one private SQLite file in
//! the user's state directory, whatever the current directory; read-only commands create
//! nothing.

#![cfg(feature = "sqlite")]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_distlock");

/// A user with a fresh home directory and two unrelated working directories.
struct User {
    root: tempfile::TempDir,
}

impl User {
    fn new() -> Self {
        let root = tempfile::tempdir().expect("temp dir");
        for dir in ["home", "a", "b"] {
            std::fs::create_dir(root.path().join(dir)).expect("mkdir");
        }
        Self { root }
    }

    fn home(&self) -> PathBuf {
        self.root.path().join("home")
    }

    fn state_file(&self) -> PathBuf {
        self.home().join(".local/state/distlock/locks.db")
    }

    fn distlock(&self, cwd: &str, args: &[&str]) -> Command {
        let mut cmd = Command::new(BIN);
        cmd.args(args)
            .env("HOME", self.home())
            .env_remove("XDG_STATE_HOME")
            .env_remove("XDG_DATA_HOME")
            .env_remove("DISTLOCK_URL")
            .current_dir(self.root.path().join(cwd));
        cmd
    }

    fn run(&self, cwd: &str, args: &[&str]) -> Output {
        self.distlock(cwd, args).output().expect("run distlock")
    }
}

fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).expect("read_dir").flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(files_under(&path));
        }
        found.push(path);
    }
    found
}

#[test]
fn runs_from_two_directories_share_one_lock() {
    let user = User::new();
    let mut holder = user
        .distlock("a", &["run", "--name", "demo", "--", "sleep", "3"])
        .spawn()
        .expect("spawn");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = user.run("b", &["status", "--name", "demo", "--json"]);
        if String::from_utf8_lossy(&out.stdout).contains("\"held\":true") {
            break;
        }
        assert!(Instant::now() < deadline, "never held");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Before: the default was sqlite://distlock.db in the current directory, so this ran.
    let out = user.run(
        "b",
        &["run", "--name", "demo", "--wait", "0", "--", "echo", "RAN"],
    );
    assert_eq!(
        out.status.code(),
        Some(75),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("RAN"));
    let _ = holder.wait();
    for cwd in ["a", "b"] {
        assert!(
            files_under(&user.root.path().join(cwd)).is_empty(),
            "files created in the working directory {cwd}"
        );
    }
    let file = user.state_file();
    let mode = |p: &Path| std::fs::metadata(p).expect("metadata").permissions().mode() & 0o777;
    assert_eq!(mode(&file), 0o600, "{}", file.display());
    assert_eq!(mode(file.parent().expect("dir")), 0o700);
}

#[test]
fn status_and_list_create_nothing_and_show_where_they_looked() {
    let user = User::new();
    let out = user.run("a", &["status", "--name", "x"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("x: free"), "{text}");
    let shown = format!("sqlite://{}", user.state_file().display());
    assert!(text.contains(&shown), "status names the lock file: {text}");
    let out = user.run("a", &["list"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = user.run("a", &["unlock", "--force", "--name", "x"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        files_under(user.root.path()).iter().all(|p| p.is_dir()) && !user.state_file().exists(),
        "read-only commands created {:?}",
        files_under(user.root.path())
    );
    // --help tells where the default is.
    let out = user.run("a", &["run", "--help"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains(&shown));
}

#[test]
fn xdg_state_home_is_honoured() {
    let user = User::new();
    let state = user.root.path().join("state");
    let out = user
        .distlock("a", &["run", "--name", "x", "--", "true"])
        .env("XDG_STATE_HOME", &state)
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(state.join("distlock/locks.db").exists());
    assert!(!user.state_file().exists());
}

/// An empty URL (`--url ""`, `DISTLOCK_URL=`) is an input error that names it (exit 78), not
/// a missing HOME: HOME is set, and the default is not used in its place.
#[test]
fn an_empty_url_is_named_as_the_error() {
    let user = User::new();
    for (args, env_url, named) in [
        (
            &["status", "--name", "x", "--url", ""][..],
            None,
            "--url is empty",
        ),
        (
            &["list", "--url", ""],
            Some("sqlite:///nonexistent/x.db"),
            "--url is empty",
        ),
        (
            &["status", "--name", "x"],
            Some(""),
            "DISTLOCK_URL is set but empty",
        ),
        (
            &["run", "--name", "x", "--", "echo", "RAN"],
            Some(""),
            "DISTLOCK_URL is set but empty",
        ),
        (
            &["unlock", "--force", "--name", "x"],
            Some(""),
            "DISTLOCK_URL is set but empty",
        ),
    ] {
        let mut cmd = user.distlock("a", args);
        if let Some(url) = env_url {
            cmd.env("DISTLOCK_URL", url);
        }
        let out = cmd.output().expect("run distlock");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(78), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.contains(named), "{args:?}: {stderr}");
        assert!(!stderr.contains("HOME"), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?}: the command ran");
    }
    assert!(!user.state_file().exists(), "the default was used");
}
