//! `distlock check` against the embedded SQLite file (the server backends run it from
//! scripts/test.sh): a run with pauses and crashes passes and writes its reports; options
//! that cannot work are exit 78 before anything starts.

#![cfg(feature = "sqlite")]

#[allow(dead_code, reason = "each test file uses a part of the harness")]
mod common;

use common::Env;

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn a_run_with_pauses_and_crashes_passes_and_reports() {
    let env = Env::new();
    let (json, svg, md) = (env.path("c.json"), env.path("c.svg"), env.path("c.md"));
    let url = env.url();
    let out = env.run(&[
        "check",
        "--url",
        &url,
        "--kind",
        "exclusive,rw-mix",
        "--duration",
        "6s",
        "--workers",
        "3",
        "--ttl",
        "1s",
        "--nemesis",
        "pause,crash",
        "--step-gap",
        "20ms",
        "--json",
        json.to_str().expect("utf-8"),
        "--svg",
        svg.to_str().expect("utf-8"),
        "--markdown",
        md.to_str().expect("utf-8"),
    ]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.contains("| no two holders share a token | pass | 0 |")
            && stdout.contains(", exclusive (linearizable)")
            && stdout.contains(", rw-mix (linearizable)"),
        "{stdout}"
    );
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).expect("the JSON report")).expect("JSON");
    assert_eq!(report["params"]["guarantee"], "linearizable");
    assert_eq!(
        report["params"]["kinds"],
        serde_json::json!(["exclusive", "rw-mix"])
    );
    for (run, kind) in report["runs"]
        .as_array()
        .expect("runs")
        .iter()
        .zip(["exclusive", "rw-mix"])
    {
        assert_eq!(run["kind"], kind);
        let acquired = run["verdict"]["stats"]["acquired"]
            .as_u64()
            .expect("a count");
        assert!(acquired >= 6, "{kind}: {}", run["verdict"]["stats"]);
        assert!(run["history"]["final_acquire"]["token"].is_u64(), "{kind}");
        let svg = env.path(&format!("c-{kind}.svg"));
        assert!(
            std::fs::read_to_string(&svg)
                .expect("an SVG per kind")
                .starts_with("<svg")
        );
    }
    // The read-write run had readers and writers.
    let modes: Vec<&str> = report["runs"][1]["history"]["acquisitions"]
        .as_array()
        .expect("acquisitions")
        .iter()
        .map(|a| a["mode"].as_str().unwrap_or("exclusive"))
        .collect();
    assert!(
        modes.contains(&"shared") && modes.contains(&"exclusive"),
        "{modes:?}"
    );
    let faults: usize = report["runs"]
        .as_array()
        .expect("runs")
        .iter()
        .map(|run| run["history"]["faults"].as_array().map_or(0, Vec::len))
        .sum();
    assert!(faults > 0);
    assert_eq!(
        std::fs::read_to_string(&md).expect("the tables"),
        stdout.trim_end_matches('\n').to_owned() + "\n"
    );
}

/// The checker's self-test on a real binary and store: workers with a deliberate bug are
/// caught by the rule that bug breaks, exit 1.
#[test]
fn every_sabotage_is_caught_by_its_rule() {
    let cases = [
        ("exclusive", "ignore-validity", "StaleCheck"),
        ("permits:2", "extra-permit", "Overlap"),
        ("rw-mix", "writer-as-reader", "Overlap"),
        ("multi", "partial-multi", "AllOrNone"),
        ("upgradeable", "upgrade-by-release", "NoWriterBetween"),
    ];
    std::thread::scope(|scope| {
        for (kind, sabotage, rule) in cases {
            scope.spawn(move || {
                let env = Env::new();
                let url = env.url();
                let mut args = vec![
                    "check",
                    "--url",
                    &url,
                    "--kind",
                    kind,
                    "--sabotage",
                    sabotage,
                    "--duration",
                    "5s",
                    "--workers",
                    "4",
                    "--ttl",
                    "500ms",
                    "--nemesis",
                    "",
                ];
                if sabotage == "ignore-validity" {
                    // Sections of 2 ttls, never renewed.
                    args.extend(["--steps", "5", "--step-gap", "200ms"]);
                }
                let out = env.run(&args);
                let stdout = text(&out.stdout);
                assert_eq!(out.status.code(), Some(1), "{kind} {sabotage}: {stdout}");
                assert!(
                    stdout.contains(&format!("- VIOLATION [{rule}]")),
                    "{kind} {sabotage}: {stdout}"
                );
            });
        }
    });
}

/// With `--lock-delay`, crashed holders keep the name for the delay and the run passes; workers
/// that leave the delay out (the `ignore-lock-delay` sabotage: a backend that ignored it) are
/// caught by the `lock-delay` rule. One worker, so that every crash hits a holder.
#[test]
fn crashed_holders_keep_their_lock_delay_and_its_sabotage_is_caught() {
    std::thread::scope(|scope| {
        for sabotage in [None, Some("ignore-lock-delay")] {
            scope.spawn(move || {
                let env = Env::new();
                let url = env.url();
                let json = env.path("d.json");
                let mut args = vec![
                    "check",
                    "--url",
                    &url,
                    "--kind",
                    "exclusive",
                    "--duration",
                    "6s",
                    "--workers",
                    "1",
                    "--ttl",
                    "500ms",
                    "--lock-delay",
                    "1s",
                    "--nemesis",
                    "crash",
                    "--json",
                    json.to_str().expect("utf-8"),
                ];
                if let Some(sabotage) = sabotage {
                    args.extend(["--sabotage", sabotage]);
                }
                let out = env.run(&args);
                let stdout = text(&out.stdout);
                let report: serde_json::Value =
                    serde_json::from_slice(&std::fs::read(&json).expect("the JSON report"))
                        .expect("JSON");
                assert_eq!(report["params"]["lock_delay_ms"], 1000);
                let acquisitions = report["runs"][0]["history"]["acquisitions"]
                    .as_array()
                    .expect("acquisitions");
                let crashed = acquisitions
                    .iter()
                    .position(|a| a["token"].is_u64() && a["released"].is_null())
                    .expect("no crash hit a holder");
                assert!(
                    acquisitions[crashed + 1..]
                        .iter()
                        .any(|a| a["token"].is_u64()),
                    "nobody acquired after the crashed holder: nothing was judged"
                );
                if sabotage.is_some() {
                    assert_eq!(out.status.code(), Some(1), "{stdout}");
                    assert!(stdout.contains("- VIOLATION [LockDelay]"), "{stdout}");
                } else {
                    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
                    assert!(
                        stdout.contains(
                            "| a crashed holder's name stays taken for its lock-delay | pass | 0 |"
                        ),
                        "{stdout}"
                    );
                }
            });
        }
    });
}

#[test]
fn options_that_cannot_work_are_config_errors() {
    let env = Env::new();
    let url = env.url();
    let missing = env.path("no-such-clock.rc");
    let missing = missing.to_str().expect("utf-8");
    let cases: [(&[&str], &str); 10] = [
        (
            &["--url", &url, "--duration", "0s"],
            "a run of 0ms is too short to judge anything: give at least 2s",
        ),
        (
            &["--url", &url, "--duration", "500ms", "--ttl", "200ms"],
            "give at least 1s",
        ),
        (
            &["--url", &url, "--kind", "permits:100000"],
            "--kind permits:100000 cannot be checked on sqlite: its semaphores have at most",
        ),
        (
            &["--url", &url, "--kind", "mutexes"],
            "unknown kind \"mutexes\"",
        ),
        (&["--url", &url, "--nemesis", "restart"], "--restart-cmd"),
        (&["--url", &url, "--ttl", "0s"], "--ttl 0s is outside"),
        (
            &["--url", "memory://"],
            "keeps its locks inside this one distlock process",
        ),
        (
            &["--url", &url, "--nemesis", "meteor"],
            "unknown fault \"meteor\"",
        ),
        (
            &["--url", &url, "--faults", "clock", "--clock-file", missing],
            "no-such-clock.rc does not exist",
        ),
        (
            &["--url", &url, "--ttl", "10s", "--lock-delay", "1000d"],
            "--ttl 10s plus --lock-delay 2years",
        ),
    ];
    for (args, expected) in cases {
        let mut all = vec!["check"];
        all.extend_from_slice(args);
        let out = env.run(&all);
        let stderr = text(&out.stderr);
        assert!(
            matches!(out.status.code(), Some(78 | 2)),
            "{args:?}: {:?} {stderr}",
            out.status
        );
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
}

/// The pids of the processes whose parent is `parent`.
fn children(parent: u32) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // "pid (comm) state ppid ...": the comm may hold spaces, the last ')' ends it.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|ppid| ppid.parse::<u32>().ok());
        if ppid == Some(parent) {
            found.push(pid);
        }
    }
    found
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        !stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
    })
}

/// A worker dies with its checking process, even when it is stopped and the checking process
/// is SIGKILLed.
#[test]
fn workers_die_with_a_killed_checking_process() {
    let env = Env::new();
    let url = env.url();
    let mut check = env
        .distlock(&[
            "check",
            "--url",
            &url,
            "--duration",
            "60s",
            "--workers",
            "3",
            "--ttl",
            "1s",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("distlock check starts");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let workers = loop {
        // Only workers past exec: a child still between fork and exec is not a worker yet.
        let found: Vec<u32> = children(check.id())
            .into_iter()
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmdline| {
                    cmdline.split(|&b| b == 0).any(|arg| arg == b"check-worker")
                })
            })
            .collect();
        if found.len() >= 3 {
            break found;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no workers: {found:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    // Stopped workers (a pause fault in progress) would neither write nor read again: only
    // the parent-death signal ends them.
    for &pid in &workers {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(pid).expect("a pid"));
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).expect("SIGSTOP");
    }
    check.kill().expect("SIGKILL");
    check.wait().expect("reaped");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while workers.iter().any(|&pid| alive(pid)) {
        assert!(
            std::time::Instant::now() < deadline,
            "workers {workers:?} outlived the checking process"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Faults that need a server connection are named as not applying to SQLite, not dropped in
/// silence; so is the clock fault without a clock file.
#[test]
fn faults_that_cannot_apply_are_named() {
    let env = Env::new();
    let url = env.url();
    let out = env.run(&[
        "check",
        "--url",
        &url,
        "--kind",
        "exclusive",
        "--duration",
        "2s",
        "--nemesis",
        "partition,ambiguous,clock",
    ]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("partition, ambiguous cannot apply to sqlite://")
            && stderr.contains("clock cannot apply to sqlite://")
            && stderr.contains("no --clock-file"),
        "{stderr}"
    );
}
