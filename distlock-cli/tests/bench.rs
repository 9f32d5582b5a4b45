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
