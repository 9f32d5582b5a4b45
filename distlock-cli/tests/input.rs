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
