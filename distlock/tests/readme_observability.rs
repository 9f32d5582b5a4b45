//! The README's Observability tables say what `distlock::telemetry` says: every metric name,
//! and every span with its level and fields.

use std::collections::BTreeSet;

use distlock::telemetry;

const README: &str = include_str!("../../README.md");

/// The README's section `## Observability`, up to the next section.
fn section() -> &'static str {
    let start = README
        .find("\n## Observability\n")
        .expect("an Observability section");
    let rest = &README[start + 1..];
    let end = rest[3..].find("\n## ").map_or(rest.len(), |e| e + 3);
    &rest[..end]
}

#[test]
fn every_metric_is_in_the_readme_table() {
    let rows: BTreeSet<&str> = section()
        .lines()
        .filter_map(|l| l.strip_prefix("| `distlock_"))
        .filter_map(|l| l.split('`').next())
        .collect();
    let names = [
        telemetry::ACQUISITIONS,
        telemetry::TRY_ACQUIRE_REFUSALS,
        telemetry::ACQUIRE_TIMEOUTS,
        telemetry::RENEWALS,
        telemetry::RENEWAL_FAILURES,
        telemetry::LOSSES,
        telemetry::RELEASES,
        telemetry::BACKEND_ERRORS,
        telemetry::ACQUIRE_WAIT,
        telemetry::HOLD,
        telemetry::HANDOFF,
        telemetry::OPERATION_DURATION,
        telemetry::HELD_GUARDS,
        telemetry::WAITING_ACQUIRES,
    ];
    let expected: BTreeSet<&str> = names
        .iter()
        .map(|n| n.strip_prefix("distlock_").unwrap())
        .collect();
    assert_eq!(rows, expected);
    for labels in [
        &telemetry::LOSS_REASONS[..],
        &telemetry::RELEASE_RESULTS,
        &telemetry::ERROR_KINDS,
        &telemetry::OPERATIONS,
    ] {
        for label in labels {
            assert!(section().contains(&format!("`{label}`")), "{label}");
        }
    }
}

#[test]
fn every_span_row_matches_the_core_table() {
    // `distlock.NAME` | LEVEL | fields, from either table.
    fn spans<'a>(lines: impl Iterator<Item = &'a str>, prefix: &str) -> BTreeSet<String> {
        lines
            .filter_map(|l| l.strip_prefix(prefix))
            .map(|row| {
                let cells: Vec<&str> = row.split('|').map(str::trim).take(3).collect();
                cells.join(" | ")
            })
            .collect()
    }
    let core = include_str!("../../lock-core/src/telemetry.rs");
    let documented = spans(core.lines(), "//! | `distlock.");
    let readme = spans(section().lines(), "| span `distlock.");
    assert_eq!(readme, documented);
    assert_eq!(readme.len(), 10);
}
