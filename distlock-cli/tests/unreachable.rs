//! A dead lock server is never a silent forever-wait: `connect` checks the endpoint, and a
//! waiting `run` whose server goes away reports the failures as they happen.

#![cfg(any(feature = "etcd", feature = "redis"))]

#[cfg(feature = "redis")]
use std::io::Read;
use std::process::Command;
#[cfg(feature = "redis")]
use std::process::Stdio;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_distlock");

/// `distlock run` against a closed port, without --wait: a one-line error, promptly.
#[test]
fn a_dead_endpoint_fails_promptly_without_wait() {
    let mut urls = Vec::new();
    if cfg!(feature = "etcd") {
        urls.push("etcd://127.0.0.1:1");
    }
    if cfg!(feature = "redis") {
        urls.push("redis://127.0.0.1:1");
    }
    for url in urls {
        let started = Instant::now();
        let out = Command::new(BIN)
            .args(["run", "--name", "x", "--op-timeout", "2s", "--url", url])
            .args(["--", "echo", "RAN"])
            .output()
            .expect("run distlock");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(69), "{url}: {stderr}");
        assert!(out.stdout.is_empty(), "{url}: the command ran");
        assert_eq!(stderr.trim().lines().count(), 1, "{url}: {stderr}");
        assert!(stderr.to_lowercase().contains("refused"), "{url}: {stderr}");
        assert!(started.elapsed() < Duration::from_secs(15), "{url}");
    }
}

#[cfg(feature = "redis")]
#[test]
fn a_waiter_whose_server_dies_reports_it() {
    let mut server = conformance_tests::servers::OwnRedis::start(&[]);
    let url = server.url();
    let run = |args: &[&str]| {
        Command::new(BIN)
            .args(["run", "--url", &url, "--op-timeout", "1s"])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn distlock")
    };
    let mut holder = run(&["--name", "dead", "--", "sleep", "30"]);
    std::thread::sleep(Duration::from_millis(500));
    let mut waiter = run(&["--name", "dead", "--", "echo", "RAN"]);
    std::thread::sleep(Duration::from_millis(1500));
    server.kill();
    std::thread::sleep(Duration::from_secs(4));
    let _ = waiter.kill();
    let _ = holder.kill();
    let _ = holder.wait();
    let mut stderr = String::new();
    waiter
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut stderr)
        .expect("read");
    let _ = waiter.wait();
    // Before: nothing at all, forever.
    assert_eq!(
        stderr.matches("distlock: waiting for lock").count(),
        1,
        "{stderr}"
    );
    assert!(
        stderr.contains("still waiting for lock \"dead\""),
        "the failure is reported: {stderr}"
    );
    assert!(
        stderr.matches("still waiting").count() <= 2,
        "rate-limited: {stderr}"
    );
}

/// A `distlock check-worker` process for `url`, as the checking process starts one (its
/// parent: this test), with a register address that nothing answers on yet.
#[cfg(feature = "redis")]
fn check_worker(url: &str, register: &std::net::TcpListener) -> Command {
    let params = r#"{"id":0,"name":"x","ttl":{"secs":1,"nanos":0},"wait":{"secs":1,"nanos":0},"steps":1,"step_gap":{"secs":0,"nanos":100000000}}"#;
    let mut worker = Command::new(BIN);
    worker
        .args(["check-worker", "--params", params, "--op-timeout", "1s"])
        .arg("--register")
        .arg(register.local_addr().expect("its address").to_string())
        .env("DISTLOCK_CHECK_URL", url)
        .env("DISTLOCK_CHECK_PARENT", std::process::id().to_string());
    worker
}

/// A check worker started while its servers are down (a crashed worker's successor, during a
/// server restart) keeps trying to connect instead of failing the check, and ends cleanly
/// when the check stops it first.
#[cfg(feature = "redis")]
#[test]
fn a_check_worker_waits_for_its_server_until_stopped() {
    let register = std::net::TcpListener::bind("127.0.0.1:0").expect("a register port");
    let mut worker = check_worker("redis://127.0.0.1:1", &register)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn a check worker");
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        worker.try_wait().expect("worker status").is_none(),
        "the worker gave up on its server: {:?}",
        worker.wait_with_output()
    );
    let pid = nix::unistd::Pid::from_raw(i32::try_from(worker.id()).expect("a pid"));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
    let stopped = Instant::now();
    let status = loop {
        if let Some(status) = worker.try_wait().expect("worker status") {
            break status;
        }
        assert!(
            stopped.elapsed() < Duration::from_secs(5),
            "the worker did not end on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    if let Some(mut pipe) = worker.stderr.take() {
        let _ = pipe.read_to_string(&mut stderr);
    }
    assert!(status.success(), "{status}: {stderr}");
}

/// A check worker whose URL cannot work (an option no backend knows) ends at once with the
/// configuration error, instead of retrying until the check stops it.
#[cfg(feature = "redis")]
#[test]
fn a_check_worker_with_a_bad_url_ends_at_once() {
    let register = std::net::TcpListener::bind("127.0.0.1:0").expect("a register port");
    let started = Instant::now();
    let out = check_worker("redis://127.0.0.1:1/?no_such_option=1", &register)
        .output()
        .expect("run a check worker");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(10), "{stderr}");
}
