//! `distlock run` never leaves its command running without the lock: signals to distlock reach
//! the command's whole process group, a SIGKILLed distlock takes its command with it
//! (PR_SET_PDEATHSIG), processes the command leaves behind are stopped before the release, and
//! an interactive command gets the terminal.

#![cfg(feature = "sqlite")]

#[allow(dead_code, reason = "each test file uses a part of the harness")]
mod common;

use common::{BIN, Env, alive};
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// Reads a pid the command wrote, waiting for the file to appear.
fn read_pid(path: &Path) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(pid) = std::fs::read_to_string(path)
            .ok()
            .and_then(|s| s.trim().parse().ok())
        {
            return pid;
        }
        assert!(
            Instant::now() < deadline,
            "{} never written",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn wait_gone(pid: i32, within: Duration, what: &str) {
    let deadline = Instant::now() + within;
    while alive(pid) {
        if Instant::now() > deadline {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            panic!("{what} (pid {pid}) still runs {within:?} later");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn kill_pid(child: &Child, signal: Signal) {
    kill(Pid::from_raw(child.id() as i32), signal).expect("signal distlock");
}

#[test]
fn a_signal_to_distlock_stops_the_whole_command_group_before_the_release() {
    for signal in [
        Signal::SIGHUP,
        Signal::SIGTERM,
        Signal::SIGQUIT,
        Signal::SIGINT,
    ] {
        let env = Env::new();
        let (shell, background) = (env.path("shell.pid"), env.path("background.pid"));
        let script = format!(
            "sleep 30 & echo $! > {}; echo $$ > {}; wait",
            background.display(),
            shell.display()
        );
        let mut holder = env
            .distlock(&[
                "run", "--name", "sig", "--ttl", "3s", "--", "sh", "-c", &script,
            ])
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        let (shell, background) = (read_pid(&shell), read_pid(&background));
        kill_pid(&holder, signal);
        let status = holder.wait().expect("wait");
        assert_eq!(status.code(), Some(128 + signal as i32), "{signal}");
        // The whole group got the signal: not only the shell, also what it started.
        wait_gone(shell, Duration::from_secs(5), "the command");
        wait_gone(background, Duration::from_secs(5), "the command's child");
        // distlock exited only after the group was gone, and released the lock: free at once.
        let out = env.run(&["run", "--name", "sig", "--wait", "0", "--", "true"]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{signal}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn a_killed_distlock_takes_its_command_with_it() {
    let env = Env::new();
    let pid_file = env.path("command.pid");
    let script = format!("echo $$ > {}; exec sleep 30", pid_file.display());
    let mut holder = env
        .distlock(&[
            "run", "--name", "kill", "--ttl", "3s", "--", "sh", "-c", &script,
        ])
        .spawn()
        .expect("spawn");
    let command = read_pid(&pid_file);
    kill_pid(&holder, Signal::SIGKILL);
    let killed = Instant::now();
    let _ = holder.wait();
    // Before: the command was re-parented to init and ran on for 30 s while, after the ttl,
    // a second holder ran beside it.
    wait_gone(
        command,
        Duration::from_secs(2),
        "the command of a SIGKILLed distlock",
    );
    assert!(killed.elapsed() < Duration::from_secs(2));
}

#[test]
fn processes_the_command_leaves_behind_are_stopped_before_the_lock_is_released() {
    let env = Env::new();
    let background = env.path("background.pid");
    // The command exits at once and leaves a sleep behind in its process group; one that
    // ignores SIGTERM needs the SIGKILL after --grace.
    let script = format!(
        "sh -c 'trap \"\" TERM; sleep 30' & echo $! > {}",
        background.display()
    );
    let started = Instant::now();
    let out = env.run(&[
        "run", "--name", "left", "--grace", "1s", "--", "sh", "-c", &script,
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("left processes running"), "{stderr}");
    assert!(
        !alive(read_pid(&background)),
        "a leftover outlived distlock"
    );
    assert!(started.elapsed() < Duration::from_secs(15));
    // Quiet: the same, without the note.
    let out = env.run(&[
        "-q", "run", "--name", "left", "--grace", "1s", "--", "sh", "-c", &script,
    ]);
    assert_eq!(out.status.code(), Some(0));
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!alive(read_pid(&background)));
}

#[test]
fn an_interactive_command_gets_the_terminal() {
    let env = Env::new();
    // script(1) runs distlock on a new pseudo-terminal, in the terminal's foreground group.
    // Without the hand-over, the command (in its own group) would be stopped by SIGTTIN when
    // it reads, and distlock would hold the lock forever.
    let inner =
        format!("{BIN} run --name tty -- sh -c 'read line; echo \"got $line\"'; echo \"exit $?\"");
    let mut script = Command::new("script")
        .args(["-qec", &inner, "/dev/null"])
        .env(
            "DISTLOCK_URL",
            format!("sqlite://{}", env.path("locks.db").display()),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("script(1) from util-linux");
    {
        use std::io::Write;
        let mut stdin = script.stdin.take().expect("stdin");
        stdin.write_all(b"hello\n").expect("type a line");
        // Keep the terminal open until the command answered.
        std::thread::sleep(Duration::from_millis(1500));
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while script.try_wait().expect("try_wait").is_none() {
        if Instant::now() > deadline {
            let _ = script.kill();
            panic!("the interactive command hung (no terminal?)");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = script.wait_with_output().expect("output");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("got hello"), "{text}");
    assert!(text.contains("exit 0"), "{text}");
}

/// With `stty tostop`, a background process that writes to the terminal is stopped by
/// SIGTTOU. distlock is in the background once its command has the terminal: a line it writes
/// then (here the warning that the value file of `elect` is gone) must not stop it, or a loss
/// (here a force-unlock) would never kill the command.
#[test]
fn a_terminal_set_to_tostop_does_not_stop_distlock() {
    let env = Env::new();
    let url = env.url();
    let value = env.path("value");
    std::fs::write(&value, "v1\n").expect("value file");
    // Job control (`set -m`), as in an interactive shell: distlock gets a process group of its
    // own whose parent's group is another of the session (else writes fail with EIO instead).
    let inner = format!(
        "set -m; stty tostop; {BIN} elect --url {url} --name tty --ttl 3s --value-file {value} \
         -- sh -c 'rm {value}; sleep 2; {BIN} unlock --url {url} --name tty --force; sleep 8; \
         echo survived'; echo \"exit $?\"",
        value = value.display()
    );
    let script = Command::new("script")
        .args(["-qec", &inner, "/dev/null"])
        .env("SHELL", "bash")
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("script(1) from util-linux");
    let pid = script.id() as i32;
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut script = script;
    while script.try_wait().expect("try_wait").is_none() {
        if Instant::now() > deadline {
            // A stopped distlock and its command would hold the terminal open for ever.
            let _ = kill(Pid::from_raw(-pid), Signal::SIGKILL);
            let _ = script.kill();
            panic!("distlock never ended: stopped by SIGTTOU?");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = script.wait_with_output().expect("output");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("exit 76"), "{text}");
    assert!(!text.contains("survived"), "{text}");
}

/// Ctrl-Z reaches distlock, not its command, when stdin is not a terminal (no hand-over): a
/// stopped distlock would neither renew nor kill while its command runs on. distlock ignores
/// SIGTSTP, so a force-unlock still kills the command at once.
#[test]
fn a_stop_signal_does_not_stop_distlock() {
    let env = Env::new();
    let mut run = env.distlock(&[
        "run",
        "--name",
        "tstp",
        "--ttl",
        "3s",
        "--",
        "sh",
        "-c",
        "echo $$ > pid; sleep 30",
    ]);
    // A process group of its own, whose parent is in another group of the session (a shell's
    // job): the kernel discards SIGTSTP sent to an orphaned group.
    let mut run = run
        .process_group(0)
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn");
    let pid = read_pid(&env.path("pid"));
    kill_pid(&run, Signal::SIGTSTP);
    std::thread::sleep(Duration::from_millis(200));
    let out = env.run(&["unlock", "--name", "tstp", "--force"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = run.try_wait().expect("try_wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = run.kill();
            panic!("distlock did not end after the force-unlock: stopped by SIGTSTP?");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(76));
    wait_gone(pid, Duration::from_secs(5), "the command");
}

#[test]
fn a_waiting_run_says_so_once_and_names_the_holder() {
    let env = Env::new();
    let mut holder = env
        .distlock(&["run", "--name", "w", "--", "sleep", "3"])
        .spawn()
        .expect("spawn");
    // Wait until the holder has the lock.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !String::from_utf8_lossy(&env.run(&["status", "--name", "w", "--json"]).stdout)
        .contains("\"held\":true")
    {
        assert!(Instant::now() < deadline, "never held");
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = env.run(&["run", "--name", "w", "--", "true"]);
    assert_eq!(out.status.code(), Some(0));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.matches("waiting for lock").count(), 1, "{stderr}");
    assert!(
        stderr.contains(&format!("(pid {})", holder.id())),
        "the holder is named: {stderr}"
    );
    let _ = holder.wait();
    let mut holder = env
        .distlock(&["run", "--name", "w", "--", "sleep", "2"])
        .spawn()
        .expect("spawn");
    std::thread::sleep(Duration::from_millis(300));
    let out = env.run(&["--quiet", "run", "--name", "w", "--", "true"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = holder.wait();
}

/// Whether a cgroup v2 leaf can be made here (`--contain cgroup` needs one).
fn cgroup_writable() -> bool {
    let env = Env::new();
    let out = env.run(&[
        "run",
        "--name",
        "probe",
        "--contain",
        "cgroup",
        "--",
        "true",
    ]);
    out.status.code() == Some(0)
}

/// A SIGKILLed distlock: its command, and what the command started in its process group, die
/// at once in both modes; a process that left the group (setsid) dies in cgroup mode only. A
/// second `run` after the ttl then never runs beside any of them.
#[test]
fn a_killed_distlock_takes_what_its_command_started_with_it() {
    let cgroups = cgroup_writable();
    if !cgroups {
        assert!(
            std::env::var("DISTLOCK_TEST_REQUIRE").is_err(),
            "no writable cgroup v2 hierarchy for --contain cgroup"
        );
        eprintln!("no writable cgroup v2: only the process-group mode is tried");
    }
    let modes: &[&str] = if cgroups {
        &["cgroup", "process-group"]
    } else {
        &["process-group"]
    };
    for &mode in modes {
        let env = Env::new();
        let (child, escaped) = (env.path("child.pid"), env.path("escaped.pid"));
        let script = format!(
            "sleep 40 & echo $! > {}; setsid sleep 41 & echo $! > {}; wait",
            child.display(),
            escaped.display()
        );
        let mut holder = env
            .distlock(&[
                "run",
                "--name",
                "k",
                "--ttl",
                "3s",
                "--contain",
                mode,
                "--",
                "sh",
                "-c",
                &script,
            ])
            .spawn()
            .expect("spawn");
        let (child, escaped) = (read_pid(&child), read_pid(&escaped));
        // `$!` is written when the shell forks: until `setsid` has run, the escapee is still
        // in the command's process group (a kill then would take it, in either mode).
        let deadline = Instant::now() + Duration::from_secs(20);
        while nix::unistd::getsid(Some(Pid::from_raw(escaped))).ok() != Some(Pid::from_raw(escaped))
        {
            assert!(
                Instant::now() < deadline,
                "the escapee never left its session"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        kill_pid(&holder, Signal::SIGKILL);
        let _ = holder.wait();
        wait_gone(
            child,
            Duration::from_secs(2),
            "a child of a SIGKILLed run's command",
        );
        if mode == "cgroup" {
            wait_gone(
                escaped,
                Duration::from_secs(2),
                "a setsid escapee (cgroup mode)",
            );
        } else {
            // Documented: the process group does not hold what leaves it.
            std::thread::sleep(Duration::from_millis(500));
            assert!(
                alive(escaped),
                "process-group mode caught a setsid escapee?"
            );
            let _ = kill(Pid::from_raw(escaped), Signal::SIGKILL);
        }
        // After the ttl the next holder runs, and nothing of the first is left beside it.
        std::thread::sleep(Duration::from_millis(3200));
        let out = env.run(&["run", "--name", "k", "--wait", "5s", "--", "true"]);
        assert_eq!(out.status.code(), Some(0), "{mode}");
        assert!(!alive(child), "{mode}");
    }
}

/// In cgroup mode a process that left the command's group is also waited for (and stopped)
/// before the release.
#[test]
fn a_setsid_escapee_is_stopped_before_the_release_in_cgroup_mode() {
    if !cgroup_writable() {
        assert!(
            std::env::var("DISTLOCK_TEST_REQUIRE").is_err(),
            "no writable cgroup v2"
        );
        return;
    }
    let env = Env::new();
    let escaped = env.path("escaped.pid");
    let script = format!("setsid sleep 30 & echo $! > {}", escaped.display());
    let out = env.run(&[
        "run",
        "--name",
        "e",
        "--contain",
        "cgroup",
        "--grace",
        "1s",
        "--",
        "sh",
        "-c",
        &script,
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !alive(read_pid(&escaped)),
        "the escapee outlived the release"
    );
}

/// DISTLOCK_URL may hold a password: the command does not get it unless --pass-url says so
/// (DISTLOCK_PASSWORD_FILE, which SQLite refuses, is tried in credentials.rs).
#[test]
fn the_command_does_not_get_the_url_unless_asked() {
    let env = Env::new();
    let out = env.run(&["run", "--name", "env", "--", "env"]);
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(printed.contains("DISTLOCK_FENCING_TOKEN="), "{printed}");
    assert!(!printed.contains("DISTLOCK_URL="), "{printed}");
    let out = env.run(&["run", "--name", "env", "--pass-url", "--", "env"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("DISTLOCK_URL=sqlite://"));
}

/// Cron on two hosts: the second, starting 1 s later, is skipped (exit 80, nothing printed)
/// while the first holds its minimum, even though the first's command failed at once; after
/// the minimum the next run goes ahead.
#[test]
fn skip_if_held_and_hold_at_least_run_a_job_once() {
    let env = Env::new();
    let started = Instant::now();
    let mut first = env
        .distlock(&[
            "run",
            "--name",
            "cron",
            "--skip-if-held",
            "--hold-at-least",
            "4s",
            "--ttl",
            "1s",
            "--",
            "sh",
            "-c",
            "exit 3",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    std::thread::sleep(Duration::from_secs(1));
    let second = env.run(&[
        "run",
        "--name",
        "cron",
        "--skip-if-held",
        "--",
        "echo",
        "ran",
    ]);
    assert_eq!(second.status.code(), Some(80));
    assert!(
        second.stdout.is_empty() && second.stderr.is_empty(),
        "a skip is silent"
    );
    let status = first.wait().expect("wait");
    assert_eq!(status.code(), Some(3), "the command's own status");
    assert!(
        started.elapsed() >= Duration::from_secs(4),
        "released before the minimum"
    );
    let third = env.run(&[
        "run",
        "--name",
        "cron",
        "--skip-if-held",
        "--",
        "echo",
        "ran",
    ]);
    assert_eq!(third.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&third.stdout).trim(), "ran");
    // A signal during the minimum releases at once.
    let mut held = env
        .distlock(&[
            "run",
            "--name",
            "cron",
            "--hold-at-least",
            "1h",
            "--",
            "true",
        ])
        .spawn()
        .expect("spawn");
    std::thread::sleep(Duration::from_millis(800));
    kill_pid(&held, Signal::SIGTERM);
    let begun = Instant::now();
    let _ = held.wait();
    assert!(begun.elapsed() < Duration::from_secs(5));
    let next = env.run(&["run", "--name", "cron", "--wait", "0", "--", "true"]);
    assert_eq!(
        next.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&next.stderr)
    );
}

/// A lock lost while distlock waits for what the command left behind kills it at once: the
/// grace is for a lock still held. Before, the leftover ran on beside the next holder until
/// the grace or the lease's old end (8-12 s here).
#[test]
fn a_lock_lost_while_leftovers_drain_kills_them_at_once() {
    let env = Env::new();
    let background = env.path("background.pid");
    // The leftover writes its pid once it ignores SIGTERM, and the command waits for that.
    let script = format!(
        "sh -c 'trap \"\" TERM; echo $$ > {0}.tmp; mv {0}.tmp {0}; exec sleep 60' & \
         while [ ! -e {0} ]; do sleep 0.01; done",
        background.display()
    );
    let holder = env
        .distlock(&[
            "run", "--name", "drain", "--ttl", "12s", "--grace", "30s", "--", "sh", "-c", &script,
        ])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let leftover = read_pid(&background);
    // The command itself has exited by now; its leftover ignores the SIGTERM.
    std::thread::sleep(Duration::from_millis(500));
    assert!(alive(leftover), "the leftover did not outlive the command");
    let out = env.run(&["unlock", "--name", "drain", "--force"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let unlocked = Instant::now();
    // The next renewal (every 4 s) finds the lock gone.
    wait_gone(
        leftover,
        Duration::from_secs(7),
        "the leftover of a lost lock",
    );
    let out = holder.wait_with_output().expect("wait");
    assert_eq!(
        out.status.code(),
        Some(76),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(unlocked.elapsed() < Duration::from_secs(8));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("killed what the command left running"),
        "{stderr}"
    );
}

/// A signal passed on to a stopped command continues it, so that it acts on the signal: the
/// signal stayed pending, and distlock waited for the command for ever, renewing the lock.
#[test]
fn a_signal_reaches_a_stopped_command() {
    let env = Env::new();
    let pid_file = env.path("command.pid");
    let script = format!("echo $$ > {}; exec sleep 60", pid_file.display());
    let mut holder = env
        .distlock(&[
            "run", "--name", "stopped", "--ttl", "3s", "--", "sh", "-c", &script,
        ])
        .spawn()
        .expect("spawn");
    let command = read_pid(&pid_file);
    kill(Pid::from_raw(command), Signal::SIGSTOP).expect("stop the command");
    std::thread::sleep(Duration::from_millis(300));
    kill_pid(&holder, Signal::SIGTERM);
    wait_gone(command, Duration::from_secs(5), "the stopped command");
    let status = holder.wait().expect("wait");
    assert_eq!(status.code(), Some(128 + Signal::SIGTERM as i32));
}
