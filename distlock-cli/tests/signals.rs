//! `distlock run` never leaves its command running without the lock: signals to distlock reach
//! the command's whole process group, a SIGKILLed distlock takes its command with it
//! (PR_SET_PDEATHSIG), processes the command leaves behind are stopped before the release, and
//! an interactive command gets the terminal.

#![cfg(feature = "sqlite")]

#[allow(dead_code, reason = "each test file uses a part of the harness")]
mod common;

use common::{BIN, Env};
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

/// Whether a process runs (a zombie has ended: it only waits to be reaped).
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat.rsplit_once(')').map(|(_, rest)| rest.trim_start());
            !state.is_some_and(|s| s.starts_with('Z') || s.starts_with('X'))
        }
        Err(_) => false,
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
