//! Drives the real `distlock` binary against an embedded SQLite file shared by the processes.

#![cfg(feature = "sqlite")]

#[allow(dead_code, reason = "each test file uses a part of the harness")]
mod common;

use common::Env;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

impl Env {
    fn held(&self, name: &str) -> bool {
        let out = self.run(&["status", "--name", name, "--json"]);
        assert!(
            out.status.success(),
            "status failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).contains("\"held\":true")
    }

    fn wait_until_held(&self, name: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self.held(name) {
            assert!(Instant::now() < deadline, "the lock was never taken");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

#[test]
fn two_runs_on_one_name_serialize() {
    let env = Env::new();
    let log = env.path("log");
    let script = format!(
        "echo start >> {0}; sleep 0.3; echo end >> {0}",
        log.display()
    );
    let children: Vec<_> = (0..3)
        .map(|_| {
            env.distlock(&["run", "--name", "serial", "--", "sh", "-c", &script])
                .spawn()
                .expect("spawn")
        })
        .collect();
    for mut child in children {
        assert!(child.wait().expect("wait").success());
    }
    let lines: Vec<String> = read(&log).lines().map(str::to_owned).collect();
    assert_eq!(lines.len(), 6, "{lines:?}");
    for pair in lines.chunks(2) {
        assert_eq!(
            pair,
            ["start", "end"],
            "critical sections overlapped: {lines:?}"
        );
    }
}

#[test]
fn the_command_sees_increasing_tokens_and_its_exit_status_is_returned() {
    let env = Env::new();
    let mut tokens = Vec::new();
    for _ in 0..3 {
        let out = env.run(&[
            "run",
            "--name",
            "tokens",
            "--",
            "sh",
            "-c",
            "echo $DISTLOCK_LOCK_NAME $DISTLOCK_FENCING_TOKEN",
        ]);
        assert!(out.status.success());
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        let (name, token) = stdout.trim().split_once(' ').expect("name and token");
        assert_eq!(name, "tokens");
        tokens.push(token.parse::<u64>().expect("numeric token"));
    }
    assert!(tokens.windows(2).all(|w| w[1] > w[0]), "{tokens:?}");
    let out = env.run(&["run", "--name", "tokens", "--", "sh", "-c", "exit 7"]);
    assert_eq!(out.status.code(), Some(7));
}

#[test]
fn wait_zero_on_a_held_lock_exits_busy() {
    let env = Env::new();
    let mut holder = env
        .distlock(&["run", "--name", "busy", "--", "sleep", "3"])
        .spawn()
        .expect("spawn");
    env.wait_until_held("busy");
    let out = env.run(&["run", "--name", "busy", "--wait", "0", "--", "true"]);
    assert_eq!(
        out.status.code(),
        Some(75),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let started = Instant::now();
    let out = env.run(&["run", "--name", "busy", "--wait", "300ms", "--", "true"]);
    assert_eq!(out.status.code(), Some(75));
    assert!(started.elapsed() >= Duration::from_millis(300));
    holder.kill().expect("kill");
    let _ = holder.wait();
}

/// Once `holder` holds `name`: SIGKILLs it, runs `after`, then runs the next `distlock run` of
/// `name` (waiting up to 20 s, which must succeed); how long after the kill it got the lock.
fn kill_then_run_next(
    env: &Env,
    mut holder: std::process::Child,
    name: &str,
    after: impl FnOnce(),
) -> Duration {
    env.wait_until_held(name);
    holder.kill().expect("SIGKILL distlock");
    let killed = Instant::now();
    let _ = holder.wait();
    after();
    let out = env.run(&["run", "--name", name, "--wait", "20s", "--", "true"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    killed.elapsed()
}

#[test]
fn a_killed_holder_frees_the_lock_after_the_ttl() {
    let env = Env::new();
    let pid_file = env.path("child.pid");
    let script = format!("echo $$ > {}; exec sleep 60", pid_file.display());
    let holder = env
        .distlock(&[
            "run", "--name", "crash", "--ttl", "2s", "--", "sh", "-c", &script,
        ])
        .spawn()
        .expect("spawn");
    let freed = kill_then_run_next(&env, holder, "crash", || {
        if let Ok(pid) = read(&pid_file).trim().parse::<i32>() {
            let _ = Command::new("kill").arg(pid.to_string()).status();
        }
    });
    assert!(
        freed >= Duration::from_millis(1200),
        "freed after {freed:?}, before the ttl"
    );
    assert!(
        freed <= Duration::from_secs(6),
        "freed only after {freed:?}"
    );
}

/// `--lock-delay`: a SIGKILLed holder's name stays taken for its ttl plus the delay (a
/// renewal at most ttl/3 before the kill leaves a lease of at least 2/3 ttl + delay); a
/// released one is free at once.
#[test]
fn a_killed_holders_lock_delay_keeps_the_name_and_a_release_frees_it() {
    let env = Env::new();
    let holder = env
        .distlock(&[
            "run",
            "--name",
            "delayed",
            "--ttl",
            "1500ms",
            "--lock-delay",
            "3s",
            "--",
            "sleep",
            "60",
        ])
        .spawn()
        .expect("spawn");
    let freed = kill_then_run_next(&env, holder, "delayed", || {});
    assert!(
        freed >= Duration::from_millis(3900),
        "freed after {freed:?}, before 2/3 of the ttl plus the lock-delay"
    );
    assert!(
        freed <= Duration::from_secs(10),
        "freed only after {freed:?}"
    );

    let out = env.run(&[
        "run",
        "--name",
        "delayed",
        "--lock-delay",
        "30s",
        "--",
        "true",
    ]);
    assert!(out.status.success());
    let started = Instant::now();
    let out = env.run(&["run", "--name", "delayed", "--wait", "0", "--", "true"]);
    assert!(
        out.status.success(),
        "a released lock with a lock-delay was not free: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(started.elapsed() < Duration::from_secs(5));

    // A lease longer than the backend keeps: exit 78 before anything runs.
    let out = env.run(&[
        "run",
        "--name",
        "delayed",
        "--ttl",
        "10s",
        "--lock-delay",
        "1000d",
        "--",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(78));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--ttl 10s plus --lock-delay ") && stderr.contains("backend allows"),
        "{stderr}"
    );
}

#[test]
fn a_lost_lock_kills_the_command_at_once() {
    let env = Env::new();
    let marker = env.path("terminated");
    let pid_file = env.path("command.pid");
    // A command that would take its time on SIGTERM: a lost lock may already have another
    // holder, so it gets SIGKILL at once, not SIGTERM and a --grace.
    let script = format!(
        "trap 'echo TERM > {}; sleep 5; exit 0' TERM; echo $$ > {}; while true; do sleep 0.05; done",
        marker.display(),
        pid_file.display()
    );
    let started = Instant::now();
    let holder = env
        .distlock(&[
            "run", "--name", "stolen", "--ttl", "1500ms", "--grace", "5s", "--", "sh", "-c",
            &script,
        ])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    env.wait_until_held("stolen");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let config = distlock_sql::SqlConfig::from_url(&env.url()).expect("url");
        let admin = distlock_sql::SqlBackend::connect(config)
            .await
            .expect("connect");
        assert!(
            admin.force_release("stolen").await.expect("steal"),
            "the lock was not held"
        );
    });
    let out = holder.wait_with_output().expect("wait");
    assert_eq!(
        out.status.code(),
        Some(76),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pid: i32 = read(&pid_file).trim().parse().expect("pid");
    assert!(!common::alive(pid), "the command outlived distlock");
    assert!(!marker.exists(), "the command got SIGTERM and a grace");
    assert!(String::from_utf8_lossy(&out.stderr).contains("lost"));
    assert!(started.elapsed() < Duration::from_secs(4));
}

#[test]
fn bad_flags_and_urls_fail_with_their_exit_codes() {
    let env = Env::new();
    for (args, code) in [
        (
            &["run", "--name", "x", "--ttl", "soon", "--", "true"][..],
            2,
        ),
        (&["run", "--name", "x"][..], 2),
        (
            &["run", "--name", "x", "--url", "nonsense", "--", "true"][..],
            78,
        ),
        (
            &["run", "--name", "x", "--url", "ftp://host", "--", "true"][..],
            78,
        ),
        (&["run", "--name", "", "--", "true"][..], 78),
        (&["run", "--name", "x", "--ttl", "0s", "--", "true"][..], 78),
        (
            &["run", "--name", "x", "--", "/nonexistent/command"][..],
            127,
        ),
        (&["status", "--name", "x", "--url", "nonsense"][..], 78),
    ] {
        let out = env.run(args);
        assert_eq!(
            out.status.code(),
            Some(code),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!out.stderr.is_empty(), "{args:?} printed no explanation");
    }
}

#[test]
fn status_reports_holder_and_token() {
    let env = Env::new();
    let out = env.run(&["status", "--name", "st"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("st: free"));
    let mut holder = env
        .distlock(&["run", "--name", "st", "--", "sleep", "3"])
        .spawn()
        .expect("spawn");
    env.wait_until_held("st");
    let out = env.run(&["status", "--name", "st"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("st: held") && text.contains("token:"),
        "{text}"
    );
    // `run` stores host, pid and command as the hold's data by default.
    let data = format!("pid={} cmd=sleep 3", holder.id());
    assert!(
        text.contains("  data:      host=") && text.contains(&data),
        "{text}"
    );
    let out = env.run(&["status", "--name", "st", "--json"]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert!(
        json["data"].as_str().is_some_and(|d| d.ends_with(&data)),
        "{json}"
    );
    holder.kill().expect("kill");
    let _ = holder.wait();

    // --data chooses it, --no-data stores none.
    for (flag, shown) in [
        (&["--data", "job=nightly"][..], Some("job=nightly")),
        (&["--no-data"][..], None),
    ] {
        let mut args = vec!["run", "--name", "st2"];
        args.extend(flag);
        args.extend(["--", "sleep", "3"]);
        let mut holder = env.distlock(&args).spawn().expect("spawn");
        env.wait_until_held("st2");
        let out = env.run(&["status", "--name", "st2", "--json"]);
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        assert_eq!(json["data"].as_str(), shown, "{json}");
        holder.kill().expect("kill");
        let _ = holder.wait();
        // The killed holder's lease runs out (ttl 30 s): take the next name.
        let _ = env.run(&["unlock", "--force", "--name", "st2"]);
    }
}

/// A stdout whose reader is gone (`distlock list | head -1` after head exits) ends the command
/// quietly with 141 (128 + SIGPIPE), never a panic (101) on the failed write.
#[test]
fn a_closed_stdout_ends_the_command_quietly() {
    let env = Env::new();
    let out = env.run(&["run", "--name", "held", "--", "true"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for args in [
        &["list"][..],
        &["list", "--json"],
        &["status", "--name", "x"],
        &["status", "--name", "x", "--json"],
        &["leader", "--name", "x"],
        &["leader", "--name", "x", "--watch"],
        &["unlock", "--force", "--name", "x"],
        &["completions", "zsh"],
    ] {
        // The reader is closed before distlock starts: its first write fails with EPIPE.
        let (reader, writer) = std::io::pipe().expect("pipe");
        drop(reader);
        let out = env
            .distlock(args)
            .stdout(writer)
            .stderr(Stdio::piped())
            .output()
            .expect("run distlock");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(141), "{args:?}: {stderr}");
        assert!(stderr.is_empty(), "{args:?}: {stderr}");
    }
}

/// A ttl shorter than the backend can keep renewed is refused before anything runs (exit 78,
/// naming the shortest it takes), instead of the lease running out at once and the command
/// being killed (exit 76).
#[test]
fn a_ttl_too_short_to_renew_is_refused_before_the_command_runs() {
    let env = Env::new();
    for command in ["run", "elect"] {
        for ttl in ["2ms", "299ms"] {
            let args = [
                command, "--name", "short", "--ttl", ttl, "--", "echo", "RAN",
            ];
            let out = env.run(&args);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(78), "{args:?}: {stderr}");
            assert!(out.stdout.is_empty(), "{args:?}: the command ran");
            assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
            assert!(
                stderr.contains("ttl") && stderr.contains("300ms"),
                "{args:?}: {stderr}"
            );
        }
    }
    let out = env.run(&[
        "run", "--name", "short", "--ttl", "300ms", "--", "echo", "RAN",
    ]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "RAN");
}
