//! SQLite URLs the binary cannot use (issue 47): a missing directory, a read-only file or
//! directory, an unknown option, a pool size out of range. Each exits 78 (EX_CONFIG) with one
//! line naming the path or the option and the cause, never SQLite's bare "(code: 14) unable to
//! open database file" with exit 1.

#![cfg(feature = "sqlite")]

#[allow(dead_code, reason = "each test file uses a part of the harness")]
mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{BIN, Env};

/// The uid and gid of `nobody` on Debian and most Linux systems.
const NOBODY: u32 = 65534;

/// `distlock run --url URL -- true` in the environment's directory, as the current user.
fn run_on(env: &Env, url: &str) -> Output {
    env.run(&["run", "--url", url, "--name", "x", "--", "true"])
}

/// Asserts that `out` is exit 78 with one line on stderr holding every one of `needles`.
fn assert_config_failure(out: &Output, needles: &[&str]) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    for needle in needles {
        assert!(stderr.contains(needle), "{needle:?} not in {stderr}");
    }
    assert!(!stderr.contains("code: 14"), "{stderr}");
}

#[test]
fn a_missing_directory_exits_78_naming_it() {
    let env = Env::new();
    let dir = env.path("no/such/dir");
    let file = dir.join("x.db");
    let out = run_on(&env, &format!("sqlite://{}", file.display()));
    assert_config_failure(
        &out,
        &[
            &file.display().to_string(),
            &format!("the directory {} does not exist", dir.display()),
        ],
    );
}

/// Who runs the binary for the read-only cases: root writes whatever the permissions say, so
/// as root the binary runs as `nobody`, from a copy that `nobody` can execute.
struct Unprivileged {
    /// The binary to run.
    bin: PathBuf,
    /// The user and group to run it as, when switching from root.
    ids: Option<(u32, u32)>,
}

impl Unprivileged {
    fn new(env: &Env) -> Self {
        let probe = env.path("whoami");
        std::fs::write(&probe, b"").unwrap();
        let root = std::fs::metadata(&probe).unwrap().uid() == 0;
        std::fs::remove_file(&probe).unwrap();
        if !root {
            return Self {
                bin: PathBuf::from(BIN),
                ids: None,
            };
        }
        let bin = env.path("distlock-copy");
        std::fs::copy(BIN, &bin).unwrap();
        for path in [env.path(""), bin.clone()] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        Self {
            bin,
            ids: Some((NOBODY, NOBODY)),
        }
    }

    /// `distlock run --url URL -- true` as this user.
    fn run(&self, env: &Env, url: &str) -> Output {
        self.command(env, &["run", "--url", url, "--name", "x", "--", "true"])
    }

    /// `distlock ARGS` as this user.
    fn command(&self, env: &Env, args: &[&str]) -> Output {
        let mut cmd = Command::new(&self.bin);
        cmd.args(args).current_dir(env.path(""));
        if let Some((uid, gid)) = self.ids {
            cmd.uid(uid).gid(gid);
        }
        // The copy was just written: a process another test thread forks meanwhile inherits
        // the write descriptor until its own exec closes it, and exec of the copy fails with
        // "Text file busy" until then (seen in CI). Brief: retried.
        for _ in 0..100 {
            match cmd.output() {
                Err(err) if err.kind() == std::io::ErrorKind::ExecutableFileBusy => {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                done => return done.expect("run distlock"),
            }
        }
        cmd.output().expect("run distlock")
    }
}

/// A database file with a lock table (made by a first run), then made read-only.
fn read_only_file(env: &Env, dir: &Path) -> PathBuf {
    std::fs::create_dir(dir).unwrap();
    let file = dir.join("locks.db");
    let made = run_on(env, &format!("sqlite://{}", file.display()));
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o444)).unwrap();
    file
}

#[test]
fn a_read_only_file_exits_78_naming_it() {
    let env = Env::new();
    let user = Unprivileged::new(&env);
    let dir = env.path("shared");
    let file = read_only_file(&env, &dir);
    // The directory is writable by all: the file itself is what refuses.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = user.run(&env, &format!("sqlite://{}", file.display()));
    assert_config_failure(
        &out,
        &[
            &format!("cannot open the SQLite database {}", file.display()),
            "read-only for this user (permission denied)",
        ],
    );
}

/// Reading needs no write access: `list` and `status` open a file this user may not write
/// read-only, where `run` is refused (above).
#[test]
fn list_and_status_read_a_read_only_file() {
    let env = Env::new();
    let user = Unprivileged::new(&env);
    let dir = env.path("shared");
    let file = read_only_file(&env, &dir);
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let url = format!("sqlite://{}", file.display());
    for args in [
        vec!["list", "--url", &url],
        vec!["status", "--url", &url, "--name", "x"],
    ] {
        let out = user.command(&env, &args);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn a_read_only_directory_exits_78_naming_it() {
    let env = Env::new();
    let user = Unprivileged::new(&env);
    let dir = env.path("closed");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o555)).unwrap();
    let file = dir.join("new.db");
    let out = user.run(&env, &format!("sqlite://{}", file.display()));
    assert_config_failure(
        &out,
        &[
            &format!("cannot open the SQLite database {}", file.display()),
            &format!(
                "the directory {} takes no new files (permission denied)",
                dir.display()
            ),
        ],
    );
    assert!(!file.exists());
}

#[test]
fn an_unknown_option_exits_78_listing_the_known_ones() {
    let env = Env::new();
    let url = format!("{}?bogus=1", env.url());
    let out = run_on(&env, &url);
    assert_config_failure(
        &out,
        &[
            "unknown option \"bogus\" (known: table, pool_size, max_connections",
            "mode, cache, immutable, vfs)",
        ],
    );
}

/// `pool_size=100000000` took 7 GB before failing; now it is refused before connecting.
#[test]
fn a_pool_size_out_of_range_exits_78_naming_the_range() {
    let env = Env::new();
    let url = format!("{}?pool_size=100000000", env.url());
    let out = run_on(&env, &url);
    assert_config_failure(
        &out,
        &["option pool_size=100000000 is out of range: expected 1 to 1000"],
    );
    assert!(!env.path("locks.db").exists(), "nothing was opened");
}
