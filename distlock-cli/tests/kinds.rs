//! `distlock run --shared` and `--permits N` against the real binary and the embedded SQLite
//! file shared by the processes.
//!
//! Shared holds and semaphores across processes need a backend that has them and that
//! processes share: the SQLite backend.

#![cfg(feature = "sqlite")]

#[allow(dead_code, reason = "each test file uses a part of the harness")]
mod common;

use common::Env;
use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

use distlock::{Capabilities, DistributedLock};

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// What the backend of the test's lock file offers.
fn capabilities(env: &Env) -> Capabilities {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let locks = distlock_sql::connect(&env.url(), distlock::ClientConfig::default())
            .await
            .expect("connect");
        locks.capabilities().clone()
    })
}

/// Waits until `path` exists.
fn wait_for(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until `status` shows `name` held as `kind`, and returns its JSON.
fn wait_held_as(env: &Env, name: &str, kind: &str) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = env.run(&["status", "--name", name, "--json"]);
        let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        if status["held"] == true {
            assert_eq!(status["kind"], kind, "{status}");
            return status;
        }
        assert!(Instant::now() < deadline, "{name} never held");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// While `run --name NAME HOLD` holds NAME (status shows it as `kind`), `run PROBE` on the
/// same name is refused at once with exit 78 and a message containing `says`.
fn assert_mismatch(env: &Env, (name, hold, kind): (&str, &str, &str), probe: &[&str], says: &str) {
    let mut holder = env
        .distlock(&["run", "--name", name, hold, "--", "sleep", "30"])
        .spawn()
        .expect("spawn");
    wait_held_as(env, name, kind);
    let mut args = vec!["run", "--name", name];
    args.extend_from_slice(probe);
    args.extend_from_slice(&["--", "true"]);
    let out = env.run(&args);
    holder.kill().expect("kill");
    let _ = holder.wait();
    assert_eq!(out.status.code(), Some(78), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains(says), "{}", text(&out.stderr));
}

/// A `run --shared` of `name` whose command reads until the file `r.done` appears; returns
/// once it holds.
fn reading(env: &Env, name: &str) -> Child {
    let reader = env
        .distlock(&[
            "run",
            "--name",
            name,
            "--shared",
            "--",
            "sh",
            "-c",
            "touch r.in; while [ ! -e r.done ]; do sleep 0.05; done",
        ])
        .spawn()
        .expect("spawn the reader");
    wait_for(&env.path("r.in"));
    reader
}

fn wait_success(child: Child) {
    let out = child.wait_with_output().expect("wait");
    assert!(out.status.success(), "{}", text(&out.stderr));
}

#[test]
fn bad_permits_and_conflicting_kinds_fail_with_their_exit_codes() {
    let env = Env::new();
    for (args, code, says) in [
        (&["--permits", "0"][..], 78, "--permits must be at least 1"),
        (&["--permits", "99999999999"][..], 78, "too large"),
        (&["--permits", "-1"][..], 2, ""),
        (
            &["--shared", "--permits", "2"][..],
            2,
            "cannot be used with",
        ),
    ] {
        let mut all = vec!["run", "--name", "bad"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--", "true"]);
        let out = env.run(&all);
        assert_eq!(
            out.status.code(),
            Some(code),
            "{args:?}: {}",
            text(&out.stderr)
        );
        assert!(
            text(&out.stderr).contains(says),
            "{args:?}: {}",
            text(&out.stderr)
        );
    }
}

#[test]
fn shared_runs_hold_together_and_keep_a_writer_out() {
    let env = Env::new();
    assert!(
        capabilities(&env).shared,
        "the sqlite backend has no shared locks"
    );
    // Each reader says it is in, then stays until both are in: only possible together.
    let reader = |me: &str, other: &str| {
        let script = format!(
            "touch {me}; i=0; while [ ! -e {other} ]; do i=$((i+1)); [ $i -gt 400 ] && exit 1; \
             sleep 0.05; done; while [ ! -e {done} ]; do sleep 0.05; done",
            me = env.path(me).display(),
            other = env.path(other).display(),
            done = env.path("done").display()
        );
        env.distlock(&["run", "--name", "rw", "--shared", "--", "sh", "-c", &script])
            .spawn()
            .expect("spawn reader")
    };
    let (a, b) = (reader("a.in", "b.in"), reader("b.in", "a.in"));
    wait_for(&env.path("a.in"));
    wait_for(&env.path("b.in"));
    let out = env.run(&["status", "--name", "rw", "--json"]);
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(status["kind"], "shared", "{status}");
    assert_eq!(status["holders"], 2, "{status}");
    // A writer cannot join the readers.
    let out = env.run(&["run", "--name", "rw", "--wait", "0", "--", "true"]);
    assert_eq!(out.status.code(), Some(75), "{}", text(&out.stderr));
    std::fs::write(env.path("done"), "").expect("done");
    wait_success(a);
    wait_success(b);
    // A semaphore of the read-write lock's name is another kind of lock.
    assert_mismatch(
        &env,
        ("rw", "--shared", "shared"),
        &["--permits", "2"],
        "cannot be acquired as asked",
    );
}

/// `(start, end)` in nanoseconds of each critical section the commands logged.
fn intervals(log: &Path) -> Vec<(u128, u128)> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut open = std::collections::HashMap::new();
    let mut done = Vec::new();
    for line in text.lines() {
        let mut parts = line.split_whitespace();
        let (Some(id), Some(event), Some(at)) = (parts.next(), parts.next(), parts.next()) else {
            panic!("bad line {line:?}");
        };
        let at: u128 = at.parse().expect("nanoseconds");
        match event {
            "start" => {
                open.insert(id.to_owned(), at);
            }
            _ => done.push((open.remove(id).expect("start before end"), at)),
        }
    }
    done
}

/// The most intervals open at once.
fn max_overlap(intervals: &[(u128, u128)]) -> usize {
    let mut events: Vec<(u128, i32)> = intervals
        .iter()
        .flat_map(|(start, end)| [(*start, 1), (*end, -1)])
        .collect();
    // At one instant, ends first: a section that ends as another starts does not overlap it.
    events.sort();
    let (mut open, mut most) = (0i32, 0i32);
    for (_, step) in events {
        open += step;
        most = most.max(open);
    }
    most as usize
}

#[test]
fn three_runs_with_two_permits_never_have_more_than_two_inside() {
    let env = Env::new();
    assert!(
        capabilities(&env).max_permits >= 2,
        "the sqlite backend has no semaphores"
    );
    let log = env.path("log");
    let children: Vec<_> = (0..3)
        .map(|id| {
            let script = format!(
                "echo \"{id} start $(date +%s%N)\" >> {log}; sleep 1; echo \"{id} end $(date +%s%N)\" >> {log}",
                log = log.display()
            );
            env.distlock(&["run", "--name", "sem", "--permits", "2", "--", "sh", "-c", &script])
                .spawn()
                .expect("spawn")
        })
        .collect();
    // While they run, status shows a semaphore.
    let status = wait_held_as(&env, "sem", "permit");
    assert_eq!(status["permits"], 2, "{status}");
    for child in children {
        wait_success(child);
    }
    let sections = intervals(&log);
    assert_eq!(sections.len(), 3, "{sections:?}");
    assert_eq!(
        max_overlap(&sections),
        2,
        "more than 2 inside, or never 2: {sections:?}"
    );
    // Asking for the same name with another size is a mismatch, not a wait.
    assert_mismatch(
        &env,
        ("sem", "--permits=2", "permit"),
        &["--permits", "3"],
        "2 permits",
    );
}

#[test]
fn the_overlap_gauge_counts_what_it_should() {
    assert_eq!(max_overlap(&[(0, 10), (10, 20), (20, 30)]), 1);
    assert_eq!(max_overlap(&[(0, 10), (5, 20), (6, 7)]), 3);
    assert_eq!(max_overlap(&[(0, 10), (5, 20), (11, 30)]), 2);
}

/// Waits until `path` holds a line, and returns it trimmed.
fn read_when_written(path: &Path) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.ends_with('\n') {
            return text.trim().to_owned();
        }
        assert!(
            Instant::now() < deadline,
            "{} never written",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `run --upgradeable`: one at a time, beside `run --shared` readers, no writer; the command's
/// `distlock upgrade` waits for the reader and gets the write side before a writer that was
/// already waiting (`run --upgradeable-write`), with a larger token (a short one before it
/// runs out: exit 75, the hold kept); `distlock downgrade` goes back. Outside such a run both are refused.
#[test]
fn an_upgradeable_run_upgrades_with_no_writer_between() {
    let env = Env::new();
    let bin = common::BIN;
    let script = format!(
        "touch in; while [ ! -e go ]; do sleep 0.05; done; \
         {bin} upgrade --wait 300ms; echo $? > first; \
         w=$({bin} upgrade --wait 20s) || exit 9; echo \"$DISTLOCK_FENCING_TOKEN $w\" > up; \
         while [ ! -e done ]; do sleep 0.05; done; \
         r=$({bin} downgrade) || exit 8; echo \"$r\" > down"
    );
    let holder = env
        .distlock(&[
            "run",
            "--name",
            "up",
            "--upgradeable",
            "--",
            "sh",
            "-c",
            &script,
        ])
        .spawn()
        .expect("spawn the upgradeable run");
    wait_for(&env.path("in"));
    let now = |args: &[&str]| {
        let mut all = vec!["run", "--name", "up", "--wait", "0"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--", "true"]);
        env.run(&all).status.code()
    };
    assert_eq!(
        now(&["--shared"]),
        Some(0),
        "a reader beside the upgradeable run"
    );
    assert_eq!(now(&["--upgradeable"]), Some(75), "two upgradeable runs");
    assert_eq!(
        now(&["--upgradeable-write"]),
        Some(75),
        "a writer beside it"
    );
    // A writer waits for the gate; a reader reads.
    let writer = env
        .distlock(&[
            "run",
            "--name",
            "up",
            "--upgradeable-write",
            "--",
            "sh",
            "-c",
            "echo $DISTLOCK_FENCING_TOKEN > w",
        ])
        .spawn()
        .expect("spawn the writer");
    let reader = reading(&env, "up");
    std::fs::write(env.path("go"), "").expect("go");
    std::thread::sleep(Duration::from_millis(700));
    assert!(!env.path("up").exists(), "upgraded while a reader read");
    // The first, short upgrade ran out beside the reader: exit 75, the read kept.
    assert_eq!(read_when_written(&env.path("first")), "75");
    std::fs::write(env.path("r.done"), "").expect("reader done");
    wait_success(reader);
    let up = read_when_written(&env.path("up"));
    let tokens: Vec<u64> = up.split(' ').map(|t| t.parse().expect("a token")).collect();
    assert!(
        tokens[1] > tokens[0],
        "the write token is not above the read's: {up}"
    );
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !env.path("w").exists(),
        "a writer came in beside the upgraded run"
    );
    std::fs::write(env.path("done"), "").expect("done");
    wait_success(holder);
    let down: u64 = read_when_written(&env.path("down"))
        .parse()
        .expect("a token");
    assert!(
        down > tokens[1],
        "the downgraded token {down} is not above {}",
        tokens[1]
    );
    wait_success(writer);
    let w: u64 = read_when_written(&env.path("w")).parse().expect("a token");
    assert!(
        w > down,
        "the waiting writer's token {w} is not above {down}"
    );
    // Outside an upgradeable run, and inside a plain one, the requests are refused.
    let out = env.run(&["upgrade"]);
    assert_eq!(out.status.code(), Some(78), "{}", text(&out.stderr));
    let out = env.run(&[
        "run",
        "--name",
        "plain",
        "--",
        "sh",
        "-c",
        &format!("{bin} downgrade"),
    ]);
    assert_eq!(out.status.code(), Some(78), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("distlock run --upgradeable"),
        "{}",
        text(&out.stderr)
    );
}

/// A command that exits while its `distlock upgrade` waits (the request killed by `timeout`)
/// ends the run with its own exit status and lets go of the name; distlock used to wait for
/// the upgrade for ever (it has no `--wait`), keeping the gate from every writer.
#[test]
fn a_command_that_exits_while_its_upgrade_waits_ends_the_run() {
    let env = Env::new();
    let bin = common::BIN;
    let reader = reading(&env, "upx");
    let started = Instant::now();
    let mut upgrading = env
        .distlock(&[
            "run",
            "--name",
            "upx",
            "--ttl",
            "3s",
            "--upgradeable",
            "--",
            "sh",
            "-c",
            &format!("timeout 1 {bin} upgrade; exit 3"),
        ])
        .spawn()
        .expect("spawn the upgradeable run");
    let deadline = started + Duration::from_secs(15);
    let status = loop {
        if let Some(status) = upgrading.try_wait().expect("try_wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = upgrading.kill();
            std::fs::write(env.path("r.done"), "").expect("reader done");
            panic!("the run still waits for the upgrade of a command that exited");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    std::fs::write(env.path("r.done"), "").expect("reader done");
    assert_eq!(status.code(), Some(3), "the command's exit status");
    // A writer gets the gate and the name once the reader is done and what the run gave up
    // expired (the gate, a place in the queue: within their 3 s ttl).
    wait_success(reader);
    let out = env.run(&[
        "run",
        "--name",
        "upx",
        "--upgradeable-write",
        "--wait",
        "10s",
        "--",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}
