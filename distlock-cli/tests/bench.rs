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
/// names the runtime asked for. On MySQL, `--fenced-floor` also runs a floor that commits a
/// token, in the same run, and S2 is compared with both.
#[test]
fn s2_runs_next_to_the_contended_floor_of_each_server() {
    let servers = [
        ("postgres", "DISTLOCK_TEST_POSTGRES_URL", "pg_advisory_lock"),
        (
            "mysql",
            "DISTLOCK_TEST_MYSQL_URL",
            "GET_LOCK + RELEASE_LOCK",
        ),
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
        let mut args = vec![
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
        if backend == "mysql" {
            args.push("--fenced-floor");
        }
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
        let fenced = &target["fenced_contended_floor"];
        if backend == "mysql" {
            let label = fenced["label"].as_str().unwrap_or("");
            assert!(label.contains("token commit"), "{label:?} in {target}");
            assert_eq!(fenced["s2"]["exclusivity_violations"], 0, "{target}");
            let ratio = target["contended"]["fenced_contended_floor_ratio"].as_f64();
            assert!(ratio.is_some_and(|r| r > 0.0), "{target}");
            assert!(stdout.contains(label), "{stdout}");
        } else {
            assert!(fenced.is_null(), "{backend}: {target}");
        }
    }
}

/// `--fenced-floor` on Redis: S1 runs next to the plain floor and a floor that takes a fencing
/// token in the transaction of its `SET` (its label says so), in the same run, and is compared
/// with both.
#[test]
fn s1_on_redis_can_compare_with_a_floor_that_takes_tokens() {
    let Some(urls) = conformance_tests::server_var("redis", "DISTLOCK_TEST_REDIS_URLS") else {
        return;
    };
    let url = urls.split(',').next().unwrap_or_default();
    let env = Env::new();
    let args = [
        "--url",
        url,
        "--scenario",
        "s1",
        "--cycles",
        "50",
        "--warmup",
        "5",
        "--fenced-floor",
    ];
    let (target, stdout) = growth_run(&env, "s1-fenced.json", &args);
    let plain = target["floor"]["label"].as_str().unwrap_or("");
    assert!(!plain.contains("INCR"), "{plain:?} in {target}");
    let fenced = &target["fenced_floor"];
    let label = fenced["label"].as_str().unwrap_or("");
    assert!(label.contains("INCR"), "{label:?} in {target}");
    assert_eq!(fenced["cycles"], 50, "{target}");
    assert!(stdout.contains(label), "{stdout}");
    for ratio in ["floor_ratio", "fenced_floor_ratio"] {
        let value = target["uncontended"][ratio].as_f64();
        assert!(value.is_some_and(|r| r > 0.0), "{ratio}: {target}");
    }
    // The CLI measures the process's CPU time (getrusage): every side has its own per cycle.
    for side in ["uncontended", "floor", "fenced_floor"] {
        let cpu = target[side]["cpu_per_cycle_us"].as_f64();
        assert!(cpu.is_some_and(|us| us > 0.0), "{side}: {target}");
    }
    assert!(stdout.contains("| distlock CPU µs/cycle |"), "{stdout}");
}

/// Runs `distlock bench` with `args` (plus `--json FILE --quiet`), asserts success and returns
/// the JSON report's first target and the Markdown.
fn growth_run(env: &Env, file: &str, args: &[&str]) -> (serde_json::Value, String) {
    let json = env.path(file);
    let json_arg = json.to_string_lossy().into_owned();
    let mut all = vec!["bench"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--json", &json_arg, "--quiet"]);
    let out = env.run(&all);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{args:?}: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    (report["targets"][0].clone(), stdout)
}

/// `--scenario hold` on memory: CPU and heap bytes per guard, no server counter.
#[test]
fn hold_reports_the_cost_of_each_held_lock_in_memory() {
    hold_reports_the_cost_of_each_held_lock("memory://bench-hold");
}

/// `--scenario hold` on Redis: also the server's requests per renewal tick.
#[test]
fn hold_reports_the_cost_of_each_held_lock_on_redis() {
    if let Some(urls) = conformance_tests::server_var("redis", "DISTLOCK_TEST_REDIS_URLS") {
        hold_reports_the_cost_of_each_held_lock(urls.split(',').next().unwrap_or_default());
    }
}

/// `--scenario hold` on ZooKeeper and MySQL: their server counters (`mntr`'s
/// `zk_packets_received`, `Questions`), which the backend crates' bench hooks declare.
#[cfg(all(feature = "zookeeper", feature = "mysql"))]
#[test]
fn hold_reads_the_server_counters_of_zookeeper_and_mysql() {
    if let Some(zk) = conformance_tests::server_var("zk", "DISTLOCK_TEST_ZK_CONNECT") {
        hold_reports_the_cost_of_each_held_lock(&format!("zk://{zk}"));
    }
    if let Some(mysql) = conformance_tests::server_var("mysql", "DISTLOCK_TEST_MYSQL_URL") {
        hold_reports_the_cost_of_each_held_lock(&mysql);
    }
}

/// Per K the server's requests per renewal tick (not on memory, which has no server), CPU,
/// heap bytes per guard, and no lock lost.
fn hold_reports_the_cost_of_each_held_lock(url: &str) {
    let env = Env::new();
    let args = [
        "--url",
        url,
        "--scenario",
        "hold",
        "--hold-counts",
        "1,50",
        "--hold-ttl",
        "1500ms",
        "--growth-kinds",
        "mutex",
    ];
    let file = format!("hold-{}.json", url.split(':').next().unwrap_or("x"));
    let (target, stdout) = growth_run(&env, &file, &args);
    assert!(stdout.contains("### Hold-K"), "{stdout}");
    let growth = &target["growth"];
    let points = growth["hold"].as_array().expect("hold points");
    assert_eq!(points.len(), 2, "{growth}");
    for (point, k) in points.iter().zip([1, 50]) {
        assert_eq!(point["locks"], k, "{point}");
        assert_eq!(point["lost"], 0, "{point}");
        assert!(point["cpu_percent"].as_f64().is_some(), "{point}");
        let bytes = point["heap_bytes_per_guard"].as_f64().unwrap_or(0.0);
        assert!(bytes > 0.0, "{url}: {point}");
        assert!(point["ticks"].as_f64().unwrap_or(0.0) > 8.0, "{point}");
        let per_tick = point["requests_per_tick"].as_f64();
        if !url.starts_with("memory") {
            assert!(per_tick.is_some_and(|r| r > 0.0), "{url}: {point}");
        } else {
            assert!(per_tick.is_none(), "{point}");
        }
    }
    if url.starts_with("redis") {
        assert!(growth["idle"]["per_tick"].as_f64().is_some(), "{growth}");
        // Batched renewal: 50 locks renewed every tick cost one request (ceil(50 / 256)), not
        // one per lock (other tests' traffic on the shared server may add a few).
        let fifty = points[1]["requests_per_tick"].as_f64().unwrap_or(0.0);
        assert!(fifty < 25.0, "{growth}");
    }
}

/// `--scenario clients`: S2 per client count, with shares against the fair share.
#[test]
fn clients_reports_one_s2_per_client_count() {
    let env = Env::new();
    let args = [
        "--url",
        "memory://bench-clients",
        "--scenario",
        "clients",
        "--client-counts",
        "2,4",
        "--duration",
        "300ms",
        "--s2-warmup",
        "50ms",
        "--growth-kinds",
        "mutex",
    ];
    let (target, stdout) = growth_run(&env, "clients.json", &args);
    assert!(stdout.contains("### Clients-C"), "{stdout}");
    let points = target["growth"]["clients"].as_array().expect("points");
    assert_eq!(points.len(), 2, "{target}");
    for (point, c) in points.iter().zip([2, 4]) {
        assert_eq!(point["clients"], c, "{point}");
        assert!(point["critical_sections_per_sec"].as_f64().unwrap_or(0.0) > 0.0);
        assert!(
            point["handoff_p99_us"].as_f64().unwrap_or(0.0) > 0.0,
            "{point}"
        );
        let (min, max) = (
            point["min_share_of_fair"].as_f64().unwrap_or(-1.0),
            point["max_share_of_fair"].as_f64().unwrap_or(-1.0),
        );
        assert!((0.0..=1.0).contains(&min) && max >= 1.0, "{point}");
        assert_eq!(point["s2"]["exclusivity_violations"], 0, "{point}");
    }
}

/// `--scenario names` on SQLite (a raw floor, no server): acquisitions/s next to the floor's.
#[test]
fn names_runs_next_to_the_raw_floor() {
    let env = Env::new();
    let url = env.url();
    let args = [
        "--url",
        &url,
        "--scenario",
        "names",
        "--names",
        "40",
        "--names-clients",
        "4",
        "--duration",
        "300ms",
        "--s2-warmup",
        "50ms",
    ];
    let (target, stdout) = growth_run(&env, "names.json", &args);
    assert!(stdout.contains("### Names"), "{stdout}");
    let names = &target["growth"]["names"];
    assert_eq!(names["names"], 40, "{names}");
    assert!(names["acquisitions"].as_u64().unwrap_or(0) > 0, "{names}");
    assert_eq!(names["lost"], 0, "{names}");
    assert!(
        names["floor_ratio"].as_f64().is_some_and(|r| r > 0.0),
        "{names}"
    );
    // The read-write lock's mix and a semaphore's permit on the same many names, no floor.
    let others = target["growth"]["names_mixed"].as_array().expect("others");
    let kinds: Vec<_> = others.iter().map(|n| n["kind"].as_str()).collect();
    assert_eq!(kinds, [Some("read_write"), Some("semaphore")], "{others:?}");
    for n in others {
        assert!(n["acquisitions"].as_u64().unwrap_or(0) > 0, "{n}");
        assert_eq!(
            (n["lost"].as_u64(), n["floor_ratio"].as_f64()),
            (Some(0), None)
        );
    }
    // No clients-C ran: nothing to set beside them.
    for n in std::iter::once(&target["growth"]["names"]).chain(others) {
        assert!(
            n["one_name_per_sec"].is_null() && n["one_name_ratio"].is_null(),
            "{n}"
        );
    }
}

/// `--charts DIR` writes both growth charts as SVG.
#[test]
fn charts_are_written_as_svg() {
    let env = Env::new();
    let dir = env.path("charts");
    let dir_arg = dir.to_string_lossy().into_owned();
    let args = [
        "--url",
        "memory://bench-charts",
        "--scenario",
        "growth",
        "--hold-counts",
        "1,10",
        "--hold-ttl",
        "300ms",
        "--client-counts",
        "2,3",
        "--names",
        "10",
        "--names-clients",
        "2",
        "--duration",
        "200ms",
        "--s2-warmup",
        "20ms",
        "--charts",
        &dir_arg,
    ];
    growth_run(&env, "charts.json", &args);
    for file in [
        "hold-cost.svg",
        "clients-latency.svg",
        "clients-primitives.svg",
    ] {
        let svg = std::fs::read_to_string(dir.join(file)).unwrap_or_default();
        assert!(
            svg.contains("<svg") && svg.trim_end().ends_with("</svg>"),
            "{file}: {svg}"
        );
        assert!(svg.contains("memory://bench-charts"), "{file}");
    }
    // One line per primitive where the chart has them.
    for file in ["hold-cost.svg", "clients-primitives.svg"] {
        let svg = std::fs::read_to_string(dir.join(file)).unwrap_or_default();
        for line in [
            "memory://bench-charts rw",
            "memory://bench-charts semaphore",
        ] {
            assert!(svg.contains(line), "{file} has no line {line:?}");
        }
    }
}

/// `--growth-kinds`: hold-K and clients-C of the read-write lock and the semaphore beside the
/// mutex's, each within its bound (a semaphore's holders never more than its permits, a
/// read-write lock's readers together), and a backend without a primitive skips it.
#[test]
fn growth_measures_every_primitive() {
    let env = Env::new();
    let args = [
        "--url",
        "memory://bench-kinds",
        "--scenario",
        "growth",
        "--hold-counts",
        "20",
        "--hold-ttl",
        "300ms",
        "--hold-for",
        "1s",
        "--client-counts",
        "6",
        "--permits",
        "2",
        "--names",
        "10",
        "--names-clients",
        "2",
        "--duration",
        "300ms",
        "--s2-warmup",
        "50ms",
    ];
    let (target, stdout) = growth_run(&env, "kinds.json", &args);
    let growth = &target["growth"];
    let kinds: Vec<_> = growth["hold"]
        .as_array()
        .expect("hold points")
        .iter()
        .map(|p| {
            assert_eq!(
                (p["locks"].as_u64(), p["lost"].as_u64()),
                (Some(20), Some(0))
            );
            assert_eq!(p["loss_reasons"], serde_json::json!({}), "{p}");
            p["kind"].as_str().unwrap_or_default().to_owned()
        })
        .collect();
    assert_eq!(kinds, ["mutex", "read_write", "semaphore"], "{growth}");
    assert_eq!(growth["clients"].as_array().map(Vec::len), Some(1));
    let mixed = growth["mixed_clients"].as_array().expect("mixed points");
    assert_eq!(mixed.len(), 2, "{growth}");
    let (rw, sem) = (&mixed[0]["mixed"], &mixed[1]["mixed"]);
    assert_eq!(
        (mixed[0]["kind"].as_str(), mixed[1]["kind"].as_str()),
        (Some("read_write"), Some("semaphore"))
    );
    for point in mixed {
        assert_eq!(point["clients"], 6, "{point}");
        assert_eq!(point["mixed"]["violations"], 0, "{point}");
        assert!(
            point["acquisitions_per_sec"].as_f64().unwrap_or(0.0) > 0.0,
            "{point}"
        );
    }
    assert!(
        rw["max_holders"].as_u64().unwrap_or(0) >= 2,
        "readers never together: {rw}"
    );
    assert_eq!(rw["max_writers"], 1, "{rw}");
    assert_eq!(sem["max_holders"], 2, "{sem}");
    for heading in [
        "| memory://bench-kinds | rw | 20 |",
        "| memory://bench-kinds | semaphore | 6 |",
    ] {
        assert!(stdout.contains(heading), "no row {heading:?}: {stdout}");
    }
    assert!(
        stdout.contains("### Clients-C of the read-write lock"),
        "{stdout}"
    );
}

/// `--scenario names` measures every primitive, each beside clients-C of the same primitive
/// with as many clients (C = `--names-clients`, neither the first nor the last C) on one
/// name.
#[test]
fn names_sit_beside_the_same_clients_on_one_name() {
    let env = Env::new();
    let args = [
        "--url",
        "memory://bench-names-kinds",
        "--scenario",
        "growth",
        "--hold-counts",
        "1",
        "--hold-ttl",
        "300ms",
        "--hold-for",
        "100ms",
        "--client-counts",
        "2,4,6",
        "--names",
        "20",
        "--names-clients",
        "4",
        "--duration",
        "300ms",
        "--s2-warmup",
        "50ms",
    ];
    let (target, stdout) = growth_run(&env, "names-kinds.json", &args);
    let growth = &target["growth"];
    let at_four = |points: &serde_json::Value, kind: Option<&str>| {
        points
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["clients"] == 4 && kind.is_none_or(|k| p["kind"] == k))
            .cloned()
            .unwrap_or_default()
    };
    let one_name = [
        at_four(&growth["clients"], None)["critical_sections_per_sec"].clone(),
        at_four(&growth["mixed_clients"], Some("read_write"))["acquisitions_per_sec"].clone(),
        at_four(&growth["mixed_clients"], Some("semaphore"))["acquisitions_per_sec"].clone(),
    ];
    let names_mixed = growth["names_mixed"]
        .as_array()
        .expect("names of the others");
    let names: Vec<_> = std::iter::once(&growth["names"])
        .chain(names_mixed)
        .collect();
    assert_eq!(names.len(), 3, "{growth}");
    for ((n, kind), one) in names
        .iter()
        .zip(["mutex", "read_write", "semaphore"])
        .zip(one_name)
    {
        assert_eq!(n["kind"], kind, "{n}");
        assert_eq!(
            (n["clients"].as_u64(), n["lost"].as_u64()),
            (Some(4), Some(0))
        );
        let rate = n["acquisitions_per_sec"].as_f64().unwrap_or(0.0);
        assert!(rate > 0.0 && one.as_f64().is_some_and(|o| o > 0.0), "{n}");
        assert_eq!(n["one_name_per_sec"], one, "{n}");
        let ratio = n["one_name_ratio"].as_f64().unwrap_or(0.0);
        assert!(
            (ratio - one.as_f64().unwrap_or(0.0) / rate).abs() < 1e-9,
            "{n}"
        );
    }
    assert!(names_mixed.iter().all(|n| n["floor_ratio"].is_null()));
    let table = stdout.split("### Names").nth(1).unwrap_or_default();
    for row in [
        "| memory://bench-names-kinds | mutex | ",
        "| memory://bench-names-kinds | rw | ",
        "| memory://bench-names-kinds | semaphore | ",
    ] {
        assert!(table.contains(row), "no names row {row:?}: {stdout}");
    }
}

/// The pids of the busy processes of the bench `parent` (their command line names it).
fn busy_processes(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                let args: Vec<&[u8]> = c.split(|b| *b == 0).collect();
                args.get(1) == Some(&&b"__distlock-busy"[..])
                    && args.get(2) == Some(&parent.to_string().as_bytes())
            })
        })
        .collect()
}

#[test]
fn background_load_runs_busy_processes_through_the_run_and_leaves_none() {
    let env = Env::new();
    let json = env.path("load.json");
    let json_arg = json.to_str().expect("utf-8 path");
    let child = env
        .distlock(&[
            "bench",
            "--url",
            "memory://bench-load",
            "--scenario",
            "s2",
            "--duration",
            "2s",
            "--background-load",
            "2",
            "--json",
            json_arg,
            "--quiet",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn distlock bench");
    let pid = child.id();
    // While S2 runs, the two busy processes are there.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while busy_processes(pid).len() < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "no 2 busy processes seen"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let out = child.wait_with_output().expect("wait");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(busy_processes(pid).is_empty(), "busy processes left behind");
    let line = stdout
        .lines()
        .find(|l| l.starts_with("- Background load: 2 busy processes (2 still running"))
        .unwrap_or_else(|| panic!("no load line:\n{stdout}"));
    // "... got X s of CPU in Y s (Z cores)": they were busy.
    let cores: f64 = line
        .rsplit_once('(')
        .and_then(|(_, c)| c.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no core count in {line}"));
    assert!(cores > 0.2, "{line}");
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).expect("the JSON report")).expect("JSON");
    assert_eq!(report["config"]["background_load"], 2, "{report}");
    // Out of range: a usage error.
    let out = env.run(&["bench", "--url", "memory://x", "--background-load", "257"]);
    assert_eq!(out.status.code(), Some(2));

    // Killed with SIGKILL, the bench leaves no busy process spinning.
    let mut child = env
        .distlock(&[
            "bench",
            "--url",
            "memory://bench-load-killed",
            "--scenario",
            "s2",
            "--duration",
            "30s",
            "--background-load",
            "2",
            "--quiet",
        ])
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("spawn distlock bench");
    let pid = child.id();
    while busy_processes(pid).len() < 2 {
        assert!(std::time::Instant::now() < deadline + std::time::Duration::from_secs(20));
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    child.kill().expect("SIGKILL");
    let _ = child.wait();
    let gone = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !busy_processes(pid).is_empty() {
        assert!(
            std::time::Instant::now() < gone,
            "busy processes outlived a killed bench"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
