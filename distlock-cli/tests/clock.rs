//! `distlock check --faults clock` against the servers scripts/services.sh runs under
//! libfaketime (Redis, PostgreSQL, ZooKeeper, MariaDB): their wall clock steps forward or back by
//! 1.5-3 ttls and is set right, the overlaps a forward step causes are judged expected (their
//! leases end on that clock), and no token rule breaks. (Without a clock file, see check.rs.)

#![cfg(any(
    feature = "redis",
    feature = "postgres",
    feature = "zookeeper",
    feature = "mysql"
))]

#[allow(dead_code, reason = "each test file uses a part of the harness")]
mod common;

use common::Env;

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs the clock fault for a few seconds per kind on `url`, whose server reads its clock's
/// offset from `clock_file`, and checks the verdict: no violation, every kind stepped.
fn steps_without_a_violation(url: &str, clock_file: &str) {
    let env = Env::new();
    let json = env.path("clock.json");
    let out = env.run(&[
        "check",
        "--url",
        url,
        "--kind",
        "exclusive,permits:2",
        "--duration",
        "7s",
        "--workers",
        "4",
        "--ttl",
        "1s",
        "--faults",
        "clock",
        "--clock-file",
        clock_file,
        "--json",
        json.to_str().expect("utf-8"),
    ]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(!stderr.contains("cannot apply"), "{stderr}");
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).expect("the JSON report")).expect("JSON");
    assert_eq!(report["params"]["clock_file"], clock_file);
    for run in report["runs"].as_array().expect("runs") {
        let kind = &run["kind"];
        let steps: Vec<i64> = run["history"]["faults"]
            .as_array()
            .expect("faults")
            .iter()
            .filter(|f| f["kind"] == "clock")
            .map(|f| f["step_ms"].as_i64().expect("a clock fault's step"))
            .collect();
        // One ttl is 1 s: every step is 1.5-3 s, one way or the other.
        assert!(!steps.is_empty(), "{kind}: no clock step");
        assert!(
            steps.iter().all(|s| (1_500..=3_000).contains(&s.abs())),
            "{kind}: {steps:?}"
        );
        for finding in run["verdict"]["findings"].as_array().expect("findings") {
            assert_ne!(finding["judgement"], "violation", "{kind}: {finding}");
        }
        assert!(
            run["verdict"]["stats"]["acquired"]
                .as_u64()
                .expect("a count")
                >= 4,
            "{kind}: {}",
            run["verdict"]["stats"]
        );
    }
    // Set right when the run ended.
    assert_eq!(
        std::fs::read_to_string(clock_file).expect("the clock file"),
        "+0.000\n"
    );
}

/// The clock test on the server of `backend` whose variables are `url_var` and `file_var`
/// (skipped when they are not set, unless `DISTLOCK_TEST_REQUIRE` asks for it).
fn on_clock_server(backend: &str, url_var: &str, file_var: &str) {
    let url = conformance_tests::server_var(backend, url_var);
    let file = conformance_tests::server_var(backend, file_var);
    if let (Some(url), Some(file)) = (url, file) {
        steps_without_a_violation(&url, &file);
    }
}

#[cfg(feature = "redis")]
#[test]
fn redis_keeps_its_tokens_through_clock_steps() {
    on_clock_server(
        "redis",
        "DISTLOCK_TEST_REDIS_CLOCK_URL",
        "DISTLOCK_TEST_REDIS_CLOCK_FILE",
    );
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_keeps_its_tokens_through_clock_steps() {
    on_clock_server(
        "postgres",
        "DISTLOCK_TEST_POSTGRES_CLOCK_URL",
        "DISTLOCK_TEST_POSTGRES_CLOCK_FILE",
    );
}

#[cfg(feature = "mysql")]
#[test]
fn mysql_keeps_its_tokens_through_clock_steps() {
    on_clock_server(
        "mysql",
        "DISTLOCK_TEST_MYSQL_CLOCK_URL",
        "DISTLOCK_TEST_MYSQL_CLOCK_FILE",
    );
}

#[cfg(feature = "zookeeper")]
#[test]
fn zookeeper_keeps_its_tokens_through_clock_steps() {
    on_clock_server(
        "zookeeper",
        "DISTLOCK_TEST_ZK_CLOCK_URL",
        "DISTLOCK_TEST_ZK_CLOCK_FILE",
    );
}
