//! `distlock list` and `distlock unlock --force` against the real binary and an embedded SQLite
//! file shared with a running `distlock run`.

#![cfg(feature = "sqlite")]

#[allow(dead_code, reason = "each test file uses a part of the harness")]
mod common;

use common::Env;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

impl Env {
    /// `distlock list --json` as parsed JSON.
    fn list(&self, extra: &[&str]) -> Vec<serde_json::Value> {
        let mut args = vec!["list", "--json"];
        args.extend_from_slice(extra);
        let out = self.run(&args);
        assert!(
            out.status.success(),
            "list failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let value: serde_json::Value =
            serde_json::from_slice(&out.stdout).expect("list --json prints JSON");
        value.as_array().expect("a JSON array").clone()
    }

    /// Waits until `name` is listed, and returns its entry.
    fn wait_until_listed(&self, name: &str) -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(entry) = self.list(&[]).into_iter().find(|e| e["name"] == name) {
                return entry;
            }
            assert!(Instant::now() < deadline, "{name} was never listed");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A `distlock run` holding `name` until killed or the lock is lost.
    fn holder(&self, name: &str) -> Child {
        self.distlock(&[
            "run", "--name", name, "--ttl", "1500ms", "--grace", "2s", "--", "sleep", "60",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn distlock run")
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn list_shows_a_run_holder_and_not_a_released_lock() {
    let env = Env::new();
    let out = env.run(&["run", "--name", "done", "--", "true"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(env.list(&[]).is_empty(), "a released lock is listed");
    let mut holder = env.holder("jobs/nightly");
    let entry = env.wait_until_listed("jobs/nightly");
    assert!(
        entry["owner"].as_str().is_some_and(|o| !o.is_empty()),
        "{entry}"
    );
    assert!(entry["token"].as_u64().is_some(), "{entry}");
    assert!(entry["remaining_ms"].as_u64().is_some(), "{entry}");
    // `distlock run` acquires as `distlock-run@<host>#<pid>`: list shows host and pid.
    assert_eq!(
        entry["pid"].as_u64(),
        Some(u64::from(holder.id())),
        "{entry}"
    );
    assert!(
        entry["host"].as_str().is_some_and(|h| !h.is_empty()),
        "{entry}"
    );
    assert_eq!(env.list(&["--prefix", "jobs/"]).len(), 1);
    assert!(env.list(&["--prefix", "other/"]).is_empty());
    let out = env.run(&["list"]);
    let table = text(&out.stdout);
    assert!(
        table.contains("NAME") && table.contains("jobs/nightly") && table.contains("pid "),
        "{table}"
    );
    holder.kill().expect("kill");
    let _ = holder.wait();
}

#[test]
fn unlock_without_force_refuses_and_explains() {
    let env = Env::new();
    let mut holder = env.holder("deploy");
    env.wait_until_listed("deploy");
    let out = env.run(&["unlock", "--name", "deploy"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("--force") && stderr.contains("fencing"),
        "{stderr}"
    );
    assert_eq!(env.list(&[]).len(), 1, "the refused unlock freed the lock");
    let help = text(&env.run(&["unlock", "--help"]).stdout);
    assert!(
        help.contains("DANGER") && help.contains("fencing") && help.contains("still"),
        "{help}"
    );
    holder.kill().expect("kill");
    let _ = holder.wait();
}

#[test]
fn unlock_force_frees_the_lock_the_holder_reports_the_loss_and_a_new_run_proceeds() {
    let env = Env::new();
    let holder = env.holder("stuck");
    let entry = env.wait_until_listed("stuck");
    let old_token = entry["token"].as_u64().expect("token");
    let out = env.run(&["unlock", "--force", "--name", "stuck"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("force-released"));
    let started = Instant::now();
    let out = holder.wait_with_output().expect("wait");
    assert_eq!(out.status.code(), Some(76), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("lost"), "{}", text(&out.stderr));
    assert!(started.elapsed() < Duration::from_secs(10));
    let out = env.run(&[
        "run",
        "--name",
        "stuck",
        "--wait",
        "5s",
        "--",
        "sh",
        "-c",
        "echo $DISTLOCK_FENCING_TOKEN",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let token: u64 = text(&out.stdout).trim().parse().expect("numeric token");
    assert!(token > old_token, "{token} <= {old_token}");
    let out = env.run(&["unlock", "--force", "--name", "stuck"]);
    assert!(out.status.success());
    assert!(text(&out.stdout).contains("was not held"));
}

#[test]
fn unlock_by_owner_and_token_frees_only_that_hold() {
    let env = Env::new();
    let holder = env.holder("job");
    let entry = env.wait_until_listed("job");
    let owner = entry["owner"].as_str().expect("owner").to_owned();
    let token = entry["token"].as_u64().expect("token");
    let unlock = |owner: &str, token: u64| {
        env.run(&[
            "unlock",
            "--name",
            "job",
            "--owner",
            owner,
            "--token",
            &token.to_string(),
        ])
    };
    for (who, t) in [(owner.as_str(), token + 1), ("somebody-else", token)] {
        let out = unlock(who, t);
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert!(
            text(&out.stdout).contains("nothing released"),
            "{}",
            text(&out.stdout)
        );
    }
    assert_eq!(
        env.list(&[]).len(),
        1,
        "a wrong owner or token freed the lock"
    );
    // --owner needs --token, and --force does not go with them.
    for args in [
        vec!["unlock", "--name", "job", "--owner", &owner],
        vec!["unlock", "--name", "job", "--token", "1"],
        vec![
            "unlock", "--name", "job", "--force", "--owner", &owner, "--token", "1",
        ],
    ] {
        let out = env.run(&args);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            text(&out.stderr)
        );
    }
    assert_eq!(env.list(&[]).len(), 1, "a refused unlock freed the lock");
    let out = unlock(&owner, token);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("released the hold"),
        "{}",
        text(&out.stdout)
    );
    let started = Instant::now();
    let out = holder.wait_with_output().expect("wait");
    assert_eq!(out.status.code(), Some(76), "{}", text(&out.stderr));
    assert!(started.elapsed() < Duration::from_secs(10));
    let out = unlock(&owner, token);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("nothing released"));
}
