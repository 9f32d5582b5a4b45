//! What other processes chose (lock names, owners, a leader's value) reaches a terminal with
//! its control characters escaped, so that it cannot clear the screen or retitle the window;
//! `--json` keeps the exact strings.

#![cfg(feature = "sqlite")]

#[allow(dead_code, reason = "each test file uses a part of the harness")]
mod common;

use common::Env;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use distlock::AcquireOptions;

/// Sets the window title, rings, clears the screen.
const EVIL: &str = "evil\x1b]0;pwned\x07\x1b[2J";
/// [`EVIL`] as distlock shows it.
const ESCAPED: &str = "evil\\u{1b}]0;pwned\\u{7}\\u{1b}[2J";
/// An owner id that turns the text red.
const OWNER: &str = "owner\x1b[31m";

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `out`'s stdout and stderr, after checking that neither has an ESC or BEL byte.
fn clean(args: &[&str], out: &Output) -> (String, String) {
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    for stream in [&stdout, &stderr] {
        assert!(
            !stream.contains(['\x1b', '\x07']),
            "{args:?} printed a control character: {stream:?}"
        );
    }
    (stdout, stderr)
}

#[test]
fn names_owners_and_values_are_escaped_and_exact_in_json() {
    let env = Env::new();
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let locks = runtime
        .block_on(distlock::connect(&env.url()))
        .expect("connect");
    let owner = distlock::OwnerId::new(OWNER).expect("owner id");
    let opts = AcquireOptions::default().with_owner(owner);
    let guard = runtime
        .block_on(locks.acquire(EVIL, &opts))
        .expect("acquire");

    for args in [
        &["list"][..],
        &["status", "--name", EVIL],
        &["leader", "--name", EVIL],
    ] {
        let out = env.run(args);
        let (stdout, stderr) = clean(args, &out);
        assert!(out.status.success(), "{args:?}: {stderr}");
        assert!(stdout.contains(ESCAPED), "{args:?}: {stdout}");
        assert!(stdout.contains("owner\\u{1b}[31m"), "{args:?}: {stdout}");
    }

    // The notice of a waiting run names the holder, and the busy lock.
    let args = ["run", "--name", EVIL, "--wait", "1500ms", "--", "true"];
    let out = env.run(&args);
    let (_, stderr) = clean(&args, &out);
    assert_eq!(out.status.code(), Some(75), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "waiting for lock \"{ESCAPED}\", held by owner owner\\u{{1b}}[31m"
        )),
        "{stderr}"
    );

    // Errors that quote a name, the library's included.
    let long = format!("{EVIL}{}", "x".repeat(300));
    for args in [
        &["unlock", "--name", EVIL][..],
        &["status", "--name", &long],
    ] {
        let out = env.run(args);
        let (_, stderr) = clean(args, &out);
        assert!(!out.status.success(), "{args:?}");
        assert!(stderr.contains("\\u{1b}"), "{args:?}: {stderr}");
    }

    // JSON keeps the exact strings.
    let out = env.run(&["list", "--json"]);
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(listed[0]["name"], EVIL, "{listed}");
    let owner = listed[0]["owner"].as_str().unwrap_or_default();
    assert!(owner.starts_with(OWNER), "{listed}");
    let out = env.run(&["status", "--name", EVIL, "--json"]);
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(status["name"], EVIL, "{status}");
    runtime.block_on(guard.release()).expect("release");

    // A leader's value, chosen by the candidate.
    let go = env.path("go");
    let script = format!("while [ ! -e {} ]; do sleep 0.05; done", go.display());
    let mut leader = env
        .distlock(&[
            "elect", "--name", "v", "--value", EVIL, "--", "sh", "-c", &script,
        ])
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn distlock elect");
    let deadline = Instant::now() + Duration::from_secs(20);
    let stdout = loop {
        let args = ["leader", "--name", "v"];
        let out = env.run(&args);
        let (stdout, _) = clean(&args, &out);
        if out.status.success() {
            break stdout;
        }
        assert!(Instant::now() < deadline, "never elected");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        stdout.contains(&format!("v: leader {ESCAPED} (term")),
        "{stdout}"
    );
    std::fs::write(&go, "").expect("write go");
    assert!(leader.wait().expect("wait").success());
}
