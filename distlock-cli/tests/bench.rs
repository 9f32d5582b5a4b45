//! `distlock bench --metrics` against the real binary: the harness's tables, then what
//! distlock's own metrics recorded during the run.

#[allow(dead_code, reason = "each test file uses a part of the harness")]
mod common;

use common::Env;

#[test]
fn bench_prints_the_figures_its_metrics_recorded() {
    let env = Env::new();
    let args = [
        "bench",
        "--metrics",
        "--url",
        "memory://bench-metrics",
        "--scenario",
        "s1",
        "--cycles",
        "200",
        "--warmup",
        "20",
        "--quiet",
    ];
    let out = env.run(&args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (_, metrics) = stdout
        .split_once("## distlock metrics recorded during the run")
        .unwrap_or_else(|| panic!("no metrics section:\n{stdout}"));
    // | memory | acquisitions | try refused | timeouts | renewals | renewal failures | losses
    // | releases | backend errors |
    let row: Vec<u64> = metrics
        .lines()
        .find(|line| line.starts_with("| memory | ") && !line.contains("distlock_"))
        .unwrap_or_else(|| panic!("no memory row:\n{metrics}"))
        .split('|')
        .skip(2)
        .filter(|cell| !cell.trim().is_empty())
        .map(|cell| cell.trim().parse().expect("a count"))
        .collect();
    let [
        acquisitions,
        refused,
        timeouts,
        _renewals,
        failures,
        losses,
        releases,
        errors,
    ] = row[..]
    else {
        panic!("unexpected row {row:?}");
    };
    assert!(acquisitions >= 220, "{row:?}"); // warm-up and measured cycles at least
    assert_eq!(releases, acquisitions, "{row:?}");
    assert_eq!(
        [refused, timeouts, failures, losses, errors],
        [0; 5],
        "{row:?}"
    );
    for histogram in ["distlock_acquire_wait_seconds", "distlock_hold_seconds"] {
        let line = metrics
            .lines()
            .find(|l| l.contains(histogram))
            .unwrap_or_else(|| panic!("no {histogram} row:\n{metrics}"));
        let count: u64 = line.split('|').nth(4).unwrap().trim().parse().unwrap();
        assert_eq!(count, acquisitions, "{line}");
    }
    assert!(metrics.contains("operation=acquire"), "{metrics}");
}

/// `distlock bench --scenario s2` on each server with a blocking lock of its own: the
/// contended floor runs first, on the server's lock, and S2 is compared with it; the report
/// names the runtime asked for.
#[test]
fn s2_runs_next_to_the_contended_floor_of_each_server() {
    let servers = [
        ("postgres", "DISTLOCK_TEST_POSTGRES_URL", "pg_advisory_lock"),
        ("mysql", "DISTLOCK_TEST_MYSQL_URL", "GET_LOCK"),
        ("etcd", "DISTLOCK_TEST_ETCD_ENDPOINTS", "etcd Lock API"),
        ("zookeeper", "DISTLOCK_TEST_ZK_CONNECT", "create ephemeral"),
    ];
    let env = Env::new();
    // Each runtime flavour on every other server (both on all of them took 24 s).
    let runtimes = ["current-thread", "multi-thread"].into_iter().cycle();
    for ((backend, var, floor), runtime) in servers.into_iter().zip(runtimes) {
        let Some(value) = conformance_tests::server_var(backend, var) else {
            continue;
        };
        let url = match backend {
            "etcd" => value
                .split(',')
                .next()
                .unwrap_or_default()
                .replacen("http://", "etcd://", 1),
            "zookeeper" => format!("zk://{value}"),
            _ => value,
        };
        let json = env.path(&format!("{backend}.json"));
        let json_arg = json.to_string_lossy().into_owned();
        let args = [
            "bench",
            "--url",
            &url,
            "--scenario",
            "s2",
            "--runtime",
            runtime,
            "--duration",
            "400ms",
            "--s2-warmup",
            "50ms",
            // The S1 floor (and its paused cycles) also runs with S2: kept short.
            "--cycles",
            "50",
            "--warmup",
            "5",
            "--json",
            &json_arg,
            "--quiet",
        ];
        let out = env.run(&args);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{backend} {runtime}: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
        assert_eq!(
            report["runtime"],
            runtime.replace('-', "_"),
            "{backend}: {report}"
        );
        let target = &report["targets"][0];
        let label = target["contended_floor"]["label"].as_str().unwrap_or("");
        assert!(label.contains(floor), "{backend}: {label:?} in {target}");
        let floor_s2 = &target["contended_floor"]["s2"];
        assert!(
            floor_s2["critical_sections"].as_u64().unwrap_or(0) > 0,
            "{target}"
        );
        assert_eq!(floor_s2["exclusivity_violations"], 0, "{target}");
        let ratio = target["contended"]["contended_floor_ratio"].as_f64();
        assert!(ratio.is_some_and(|r| r > 0.0), "{backend}: {target}");
        assert!(stdout.contains(&format!("| {floor}")), "{stdout}");
    }
}
