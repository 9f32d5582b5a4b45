//! `distlock elect` and `distlock leader` against the real binary and an embedded SQLite file
//! shared by the processes (elections need only the exclusive lock: every backend has them).

#![cfg(feature = "sqlite")]

#[allow(dead_code, reason = "each test file uses a part of the harness")]
mod common;

use common::Env;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// Waits for a file to exist and returns its content.
fn wait_for(path: &Path) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(text) = std::fs::read_to_string(path)
            && text.ends_with('\n')
        {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "{} never written",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A candidate that writes `<term> <token> <value>` to `out` once elected, then leads until
/// the file `go` exists.
fn candidate(env: &Env, name: &str, value: &str, out: &Path, go: &Path) -> Child {
    let script = format!(
        "echo \"$DISTLOCK_LEADER_TERM $DISTLOCK_FENCING_TOKEN $DISTLOCK_LEADER_VALUE\" > {out}.tmp; \
         mv {out}.tmp {out}; while [ ! -e {go} ]; do sleep 0.05; done",
        out = out.display(),
        go = go.display()
    );
    env.distlock(&[
        "elect", "--name", name, "--value", value, "--", "sh", "-c", &script,
    ])
    .stderr(Stdio::piped())
    .spawn()
    .expect("spawn distlock elect")
}

/// `<term> <token> <value>` as the command wrote it.
fn parse(line: &str) -> (u64, u64, String) {
    let mut parts = line.split_whitespace();
    let mut number = || parts.next().and_then(|p| p.parse().ok()).expect("a number");
    let (term, token) = (number(), number());
    (term, token, parts.collect::<Vec<_>>().join(" "))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn the_command_runs_only_while_leader_and_the_next_candidate_takes_over() {
    let env = Env::new();
    let (a_out, b_out) = (env.path("a.out"), env.path("b.out"));
    let (a_go, b_go) = (env.path("a.go"), env.path("b.go"));
    let a = candidate(&env, "sched", "node-a", &a_out, &a_go);
    let (a_term, a_token, a_value) = parse(&wait_for(&a_out));
    assert_eq!(a_value, "node-a");
    assert_eq!(a_term, a_token, "the term is the fencing token");

    let b = candidate(&env, "sched", "node-b", &b_out, &b_go);
    // Another leader now: `--wait 0` gives up at once.
    let out = env.run(&["elect", "--name", "sched", "--wait", "0", "--", "true"]);
    assert_eq!(out.status.code(), Some(75), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("another leader"),
        "{}",
        text(&out.stderr)
    );
    std::thread::sleep(Duration::from_millis(700));
    assert!(
        !b_out.exists(),
        "the second candidate ran while the first led"
    );

    // The first leader's command exits: it resigns, the second is elected with a later term.
    std::fs::write(&a_go, "").expect("go");
    let a = a.wait_with_output().expect("wait a");
    assert!(a.status.success(), "{}", text(&a.stderr));
    let (b_term, b_token, b_value) = parse(&wait_for(&b_out));
    assert_eq!(b_value, "node-b");
    assert_eq!(b_term, b_token);
    assert!(b_term > a_term, "terms {a_term} then {b_term}");
    std::fs::write(&b_go, "").expect("go");
    let b = b.wait_with_output().expect("wait b");
    assert!(b.status.success(), "{}", text(&b.stderr));

    // The command's status is elect's, and the default value names host and pid.
    let out = env.run(&[
        "elect",
        "--name",
        "sched",
        "--",
        "sh",
        "-c",
        "echo $DISTLOCK_LEADER_VALUE; exit 9",
    ]);
    assert_eq!(out.status.code(), Some(9), "{}", text(&out.stderr));
    let value = text(&out.stdout);
    let (host, pid) = value.trim().rsplit_once(':').expect("<host>:<pid>");
    assert!(!host.is_empty() && pid.parse::<u32>().is_ok(), "{value}");
}

#[test]
fn lost_leadership_terminates_the_command() {
    let env = Env::new();
    let holder = env
        .distlock(&[
            "elect", "--name", "lost", "--ttl", "1500ms", "--grace", "2s", "--", "sleep", "60",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let deadline = Instant::now() + Duration::from_secs(20);
    while env.run(&["leader", "--name", "lost"]).status.code() != Some(0) {
        assert!(Instant::now() < deadline, "never elected");
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = env.run(&["unlock", "--force", "--name", "lost"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = holder.wait_with_output().expect("wait");
    assert_eq!(out.status.code(), Some(76), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("leadership of \"lost\" lost"),
        "{}",
        text(&out.stderr)
    );
}

/// Lines of a child's stdout, read on a thread.
fn lines(child: &mut Child) -> mpsc::Receiver<String> {
    let stdout = child.stdout.take().expect("piped stdout");
    let (send, receive) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if send.send(line).is_err() {
                break;
            }
        }
    });
    receive
}

/// The next line that `wanted` accepts, skipping others.
fn next_matching(
    lines: &mpsc::Receiver<String>,
    wanted: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = lines
            .recv_timeout(left)
            .expect("the watch printed no such line");
        let value: serde_json::Value = serde_json::from_str(&line).expect("a JSON line");
        if wanted(&value) {
            return value;
        }
    }
}

#[test]
fn leader_shows_the_leader_and_watch_follows_changes() {
    let env = Env::new();
    let out = env.run(&["leader", "--name", "web"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "web: no leader");

    let mut watch = env
        .distlock(&[
            "leader",
            "--name",
            "web",
            "--watch",
            "--json",
            "--interval",
            "100ms",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn watch");
    let seen = lines(&mut watch);
    let first = next_matching(&seen, |_| true);
    assert_eq!(first["leader"], false, "{first}");

    let (a_out, a_go) = (env.path("a.out"), env.path("a.go"));
    let a = candidate(&env, "web", "10.0.0.1:80", &a_out, &a_go);
    let (a_term, ..) = parse(&wait_for(&a_out));
    let out = env.run(&["leader", "--name", "web", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let now: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(now["value"], "10.0.0.1:80", "{now}");
    assert_eq!(now["term"], a_term, "{now}");
    assert!(now["remaining_ms"].as_u64().is_some(), "{now}");
    let out = env.run(&["leader", "--name", "web"]);
    let line = text(&out.stdout);
    assert!(line.starts_with("web: leader 10.0.0.1:80 (term "), "{line}");
    let led = next_matching(&seen, |v| v["leader"] == true);
    assert_eq!(led["value"], "10.0.0.1:80", "{led}");

    // A second candidate takes over when the first resigns: the watch sees the new term.
    let (b_out, b_go) = (env.path("b.out"), env.path("b.go"));
    let b = candidate(&env, "web", "10.0.0.2:80", &b_out, &b_go);
    std::fs::write(&a_go, "").expect("go");
    let (b_term, ..) = parse(&wait_for(&b_out));
    let next = next_matching(&seen, |v| v["value"] == "10.0.0.2:80");
    assert_eq!(next["term"], b_term, "{next}");
    assert!(b_term > a_term);
    std::fs::write(&b_go, "").expect("go");
    for candidate in [a, b] {
        let out = candidate.wait_with_output().expect("wait");
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    let gone = next_matching(&seen, |v| v["leader"] == false);
    assert_eq!(gone["name"], "web");

    // SIGTERM (as Ctrl-C) ends the watch cleanly.
    kill(Pid::from_raw(watch.id() as i32), Signal::SIGTERM).expect("SIGTERM");
    let status = watch.wait().expect("wait watch");
    assert_eq!(status.code(), Some(0), "{status:?}");
}

/// `elect --value-file`: the leader's value is the file's first line; a new line written while
/// it leads is proclaimed (same term) and `leader` shows it. A missing file is exit 78.
#[test]
fn a_leader_proclaims_the_new_value_of_its_value_file() {
    let env = Env::new();
    let file = env.path("addr");
    std::fs::write(&file, "10.0.0.1:80\n").expect("write");
    let (out, go) = (env.path("p.out"), env.path("p.go"));
    let script = format!(
        "echo \"$DISTLOCK_LEADER_TERM $DISTLOCK_FENCING_TOKEN $DISTLOCK_LEADER_VALUE\" > {out}.tmp; \
         mv {out}.tmp {out}; while [ ! -e {go} ]; do sleep 0.05; done",
        out = out.display(),
        go = go.display()
    );
    let file_arg = file.to_str().expect("utf-8");
    let leader = env
        .distlock(&[
            "elect",
            "--name",
            "pro",
            "--value-file",
            file_arg,
            "--",
            "sh",
            "-c",
            &script,
        ])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn distlock elect");
    let (term, _, value) = parse(&wait_for(&out));
    assert_eq!(value, "10.0.0.1:80");
    std::fs::write(&file, "10.0.0.1:6432\n").expect("write");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let shown = env.run(&["leader", "--name", "pro", "--json"]);
        let now: serde_json::Value = serde_json::from_slice(&shown.stdout).expect("JSON");
        if now["value"] == "10.0.0.1:6432" {
            assert_eq!(now["term"], term, "the proclaim changed the term: {now}");
            break;
        }
        assert_eq!(now["value"], "10.0.0.1:80", "{now}");
        assert!(
            Instant::now() < deadline,
            "the new value was never proclaimed"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::fs::write(&go, "").expect("go");
    let done = leader.wait_with_output().expect("wait");
    assert!(done.status.success(), "{}", text(&done.stderr));

    let missing = env.path("no-such-file");
    let out = env.run(&[
        "elect",
        "--name",
        "pro",
        "--value-file",
        missing.to_str().expect("utf-8"),
        "--",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(78), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("--value-file"));
}

/// A named pipe as the value file (`--value-file <(...)`) gives the value at the start and is
/// not read again: opening it again waited for a writer for ever, and the leader's loop with
/// it, so a SIGTERM was never passed on and distlock hung.
#[test]
fn a_value_file_that_is_a_pipe_is_read_once() {
    let env = Env::new();
    let fifo = env.path("value.fifo");
    let made = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(made.success());
    let mut writer = Command::new("sh")
        .args(["-c", &format!("echo 10.0.0.9:80 > {}", fifo.display())])
        .spawn()
        .expect("spawn the pipe's writer");
    let started = env.path("in");
    let script = format!(
        "echo \"$DISTLOCK_LEADER_VALUE\" > {0}.tmp; mv {0}.tmp {0}; sleep 60",
        started.display()
    );
    let mut leader = env
        .distlock(&[
            "elect",
            "--name",
            "piped",
            "--value-file",
            fifo.to_str().expect("utf-8"),
            "--",
            "sh",
            "-c",
            &script,
        ])
        .spawn()
        .expect("spawn distlock elect");
    assert_eq!(wait_for(&started).trim(), "10.0.0.9:80");
    assert!(writer.wait().expect("the writer").success());
    // Past the loop's next reads of the value file (every second).
    std::thread::sleep(Duration::from_millis(2500));
    kill(Pid::from_raw(leader.id() as i32), Signal::SIGTERM).expect("SIGTERM");
    let deadline = Instant::now() + Duration::from_secs(5);
    let status = loop {
        if let Some(status) = leader.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = leader.kill();
            panic!("distlock elect did not end 5 s after SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(128 + Signal::SIGTERM as i32));
}
