//! Bad or extreme input to the real binary: a typed one-line error or a sane run, never a panic
//! (exit 101) and never a secret in a message.

use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_distlock");

fn distlock(dir: &tempfile::TempDir, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env(
            "DISTLOCK_URL",
            format!("sqlite://{}", dir.path().join("locks.db").display()),
        )
        .current_dir(dir.path())
        .output()
        .expect("run distlock")
}

fn assert_no_panic(out: &Output, what: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(101), "{what}: {stderr}");
    assert!(!stderr.contains("panicked"), "{what}: {stderr}");
}

#[cfg(feature = "sqlite")]
#[test]
fn extreme_durations_never_panic() {
    let dir = tempfile::tempdir().unwrap();
    // A wait too long to represent is a wait forever: the free lock is taken at once.
    let out = distlock(
        &dir,
        &[
            "run",
            "--name",
            "x",
            "--wait",
            "300000000000years",
            "--",
            "true",
        ],
    );
    assert_no_panic(&out, "--wait 300000000000years");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for flags in [
        ["--ttl", "0s"],
        ["--ttl", "300000000000years"],
        ["--op-timeout", "0s"],
        ["--op-timeout", "300000000000years"],
        ["--grace", "300000000000years"],
        ["--wait", "0s"],
    ] {
        let mut args = vec!["run", "--name", "y"];
        args.extend(flags);
        args.extend(["--", "true"]);
        let out = distlock(&dir, &args);
        assert_no_panic(&out, &flags.join(" "));
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(stderr.trim().lines().count() == 1, "{flags:?}: {stderr}");
            assert!(
                stderr.contains("distlock: ") || stderr.contains("error: "),
                "{stderr}"
            );
        }
    }
}

#[cfg(feature = "postgres")]
#[test]
fn passwords_never_reach_a_message() {
    let dir = tempfile::tempdir().unwrap();
    let secret = "s3cretPw9";
    for url in [
        format!("postgres://app:{secret}@127.0.0.1:1/x"),
        format!("postgres://app:{secret}@127.0.0.1:1/x?table=bad-name"),
        format!("nosuch://app:{secret}@h/x"),
    ] {
        for args in [
            vec!["status", "--name", "x", "--op-timeout", "1s", "--url", &url],
            vec![
                "run",
                "--name",
                "x",
                "--op-timeout",
                "1s",
                "--url",
                &url,
                "--",
                "true",
            ],
        ] {
            let out = distlock(&dir, &args);
            assert_no_panic(&out, &url);
            assert!(!out.status.success());
            let all = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(!all.contains(secret), "{args:?}: {all}");
        }
    }
}

/// Runs `distlock run` against `url` and returns (exit code, stderr) after checking that the
/// command did not run and that stderr is one line.
fn run_fails(dir: &tempfile::TempDir, url: &str) -> (Option<i32>, String) {
    let out = distlock(
        dir,
        &[
            "run",
            "--name",
            "x",
            "--op-timeout",
            "3s",
            "--url",
            url,
            "--",
            "echo",
            "RAN",
        ],
    );
    assert_no_panic(&out, url);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.stdout.is_empty(), "{url}: the command ran");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{url}: {stderr}");
    (out.status.code(), stderr)
}

/// Each backend says what failed and why in one line: the server's address and the OS's
/// reason, once (no "refused: refused: os error 111" chains).
#[test]
fn connection_errors_name_the_server_and_the_cause_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut cases: Vec<(&str, &str)> = Vec::new();
    if cfg!(feature = "postgres") {
        cases.push((
            "postgres://app:pw@127.0.0.1:1/x",
            "cannot connect to PostgreSQL at 127.0.0.1:1: connection refused",
        ));
    }
    if cfg!(feature = "mysql") {
        cases.push((
            "mysql://app:pw@127.0.0.1:1/x",
            "cannot connect to MySQL at 127.0.0.1:1: connection refused",
        ));
    }
    if cfg!(feature = "redis") {
        cases.push((
            "redis://127.0.0.1:1",
            "cannot connect to Redis at 127.0.0.1:1: connection refused",
        ));
    }
    if cfg!(feature = "etcd") {
        cases.push((
            "etcd://127.0.0.1:1",
            "cannot connect to etcd at 127.0.0.1:1: connection refused",
        ));
    }
    if cfg!(feature = "zookeeper") {
        cases.push((
            "zk://127.0.0.1:1",
            "cannot connect to ZooKeeper at 127.0.0.1:1: connection refused",
        ));
    }
    for (url, needle) in cases {
        let (code, stderr) = run_fails(&dir, url);
        assert_eq!(code, Some(69), "{url}: {stderr}");
        assert!(stderr.contains(needle), "{url}: {stderr}");
        assert_eq!(
            stderr.to_lowercase().matches("refused").count(),
            1,
            "{stderr}"
        );
        assert!(!stderr.contains("os error"), "{url}: {stderr}");
    }
}

/// Malformed URLs: a configuration error (exit 78) that says what is wrong, short.
#[test]
fn url_mistakes_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let long_host = format!("redis://:s3cret@{}:1", "h".repeat(100_000));
    let mut cases: Vec<(String, &str)> = Vec::new();
    if cfg!(feature = "sqlite") {
        cases.push(("sqlite://".into(), "needs a file path"));
        cases.push(("sqlite:".into(), "needs a file path"));
    }
    if cfg!(feature = "redis") {
        cases.push((long_host, "bytes in all"));
        cases.push(("redis://127.0.0.1:1?handoff=100".into(), "needs a unit"));
        cases.push(("redis://127.0.0.1:1?handoff_ms=5".into(), "unknown option"));
        cases.push((
            "redis://127.0.0.1:1/x".into(),
            "database=\"x\": expected an integer",
        ));
    }
    if cfg!(feature = "zookeeper") {
        cases.push(("zk://h?session_timeout=1500".into(), "needs a unit"));
    }
    for (url, needle) in &cases {
        let (code, stderr) = run_fails(&dir, url);
        assert_eq!(code, Some(78), "{stderr}");
        assert!(stderr.contains(needle), "{needle}: {stderr}");
        assert!(stderr.len() < 1000, "{} bytes: {stderr:.300}", stderr.len());
        assert!(!stderr.contains("s3cret"), "{stderr:.300}");
    }
}

/// Schemes are case-insensitive, and a database the server does not have is a configuration
/// error that says so (not "server error").
#[cfg(feature = "redis")]
#[test]
fn redis_scheme_case_and_missing_database() {
    let Some(url) = std::env::var("DISTLOCK_TEST_REDIS_URLS")
        .ok()
        .and_then(|urls| urls.split(',').next().map(str::to_owned))
    else {
        panic!("DISTLOCK_TEST_REDIS_URLS is not set: run scripts/services.sh start");
    };
    let dir = tempfile::tempdir().unwrap();
    let upper = url.replacen("redis://", "REDIS://", 1);
    let out = distlock(
        &dir,
        &[
            "run", "--name", "case", "--url", &upper, "--", "echo", "RAN",
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "RAN");
    let (code, stderr) = run_fails(&dir, &format!("{url}/99"));
    assert_eq!(code, Some(78), "{stderr}");
    assert!(
        stderr.contains("Redis database 99 does not exist"),
        "{stderr}"
    );
}

/// `redis+unix://` (and `unix://`) reach a server on a Unix socket.
#[cfg(feature = "redis")]
#[test]
fn redis_over_a_unix_socket() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("redis.sock");
    let _server = conformance_tests::servers::OwnRedis::start_on_socket(&socket);
    for scheme in ["redis+unix", "Unix"] {
        let url = format!("{scheme}://{}?db=1", socket.display());
        let out = distlock(
            &dir,
            &["run", "--name", "sock", "--url", &url, "--", "echo", "RAN"],
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{url}: {stderr}");
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "RAN");
    }
}

/// A lock service that lives inside the one distlock process (`memory://`, an in-memory
/// SQLite database) excludes nobody: two `run`s would both hold the lock. Every command that
/// takes or reads locks refuses it (exit 78) before running anything.
#[test]
fn process_local_lock_services_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut urls = vec!["memory://", "memory://jobs", "MEMORY://"];
    if cfg!(feature = "sqlite") {
        urls.extend(["sqlite::memory:", "sqlite:locks.db?mode=memory"]);
    }
    for url in urls {
        for command in [
            &["run", "--name", "x", "--", "echo", "RAN"][..],
            &["elect", "--name", "x", "--", "echo", "RAN"],
            &["status", "--name", "x"],
            &["list"],
            &["leader", "--name", "x"],
            &["unlock", "--force", "--name", "x"],
        ] {
            let mut args = command.to_vec();
            args.splice(1..1, ["--url", url]);
            let out = distlock(&dir, &args);
            assert_no_panic(&out, url);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(78), "{args:?}: {stderr}");
            assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
            assert!(
                stderr.contains("keeps its locks inside this one distlock process")
                    && stderr.contains("sqlite://PATH"),
                "{args:?}: {stderr}"
            );
            assert!(out.stdout.is_empty(), "{args:?}: it ran");
        }
    }
}
