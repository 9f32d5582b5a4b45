//! `distlock bench --metrics`: what distlock's own metrics (see `distlock::telemetry`)
//! recorded during the run, per backend, next to the harness's figures: the counts, and the
//! percentiles of the wait, hold, handoff and request-duration histograms.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use distlock::telemetry;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

/// A recorder installed for the whole process, before any client is built.
pub(crate) struct Recorded {
    snapshotter: Snapshotter,
}

impl Recorded {
    /// Installs the recorder.
    ///
    /// # Errors
    /// When another recorder is installed already.
    pub(crate) fn install() -> Result<Self, String> {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder
            .install()
            .map_err(|e| format!("cannot install the metrics recorder: {e}"))?;
        Ok(Self { snapshotter })
    }

    /// The figures recorded since the installation, as Markdown tables.
    pub(crate) fn report(&self) -> String {
        let figures = Figures::from_snapshot(&self.snapshotter);
        figures.to_markdown()
    }
}

/// One backend's values, by metric and its other labels (`reason=...`, `operation=...`).
#[derive(Default)]
struct Backend {
    counters: BTreeMap<(String, String), u64>,
    gauges: BTreeMap<String, f64>,
    histograms: BTreeMap<(String, String), Vec<f64>>,
}

#[derive(Default)]
struct Figures {
    backends: BTreeMap<String, Backend>,
}

impl Figures {
    fn from_snapshot(snapshotter: &Snapshotter) -> Self {
        let mut figures = Self::default();
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            let (_, key) = key.into_parts();
            if !key.name().starts_with("distlock_") {
                continue;
            }
            let mut backend = String::new();
            let mut other = Vec::new();
            for label in key.labels() {
                match label.key() {
                    "backend" => backend = label.value().to_owned(),
                    k => other.push(format!("{k}={}", label.value())),
                }
            }
            let entry = figures.backends.entry(backend).or_default();
            let id = (key.name().to_owned(), other.join(","));
            match value {
                DebugValue::Counter(n) => *entry.counters.entry(id).or_default() += n,
                DebugValue::Gauge(v) => *entry.gauges.entry(id.0).or_default() += v.into_inner(),
                DebugValue::Histogram(values) => entry
                    .histograms
                    .entry(id)
                    .or_default()
                    .extend(values.into_iter().map(|v| v.into_inner())),
            }
        }
        figures
    }

    fn to_markdown(&self) -> String {
        let mut out = String::from("## distlock metrics recorded during the run\n\n");
        if self.backends.is_empty() {
            out.push_str("(none recorded)\n");
            return out;
        }
        let counts = [
            ("acquisitions", telemetry::ACQUISITIONS),
            ("try refused", telemetry::TRY_ACQUIRE_REFUSALS),
            ("timeouts", telemetry::ACQUIRE_TIMEOUTS),
            ("renewals", telemetry::RENEWALS),
            ("renewal failures", telemetry::RENEWAL_FAILURES),
            ("losses", telemetry::LOSSES),
            ("releases", telemetry::RELEASES),
            ("backend errors", telemetry::BACKEND_ERRORS),
        ];
        out.push_str("| backend |");
        for (title, _) in counts {
            let _ = write!(out, " {title} |");
        }
        out.push_str("\n|---|");
        out.push_str(&"---:|".repeat(counts.len()));
        out.push('\n');
        for (name, backend) in &self.backends {
            let _ = write!(out, "| {name} |");
            for (_, metric) in counts {
                let _ = write!(out, " {} |", backend.total(metric));
            }
            out.push('\n');
        }
        out.push_str(
            "\n| backend | histogram | labels | count | p50 ms | p99 ms | max ms |\n|---|---|---|---:|---:|---:|---:|\n",
        );
        for (name, backend) in &self.backends {
            for ((metric, labels), values) in &backend.histograms {
                if values.is_empty() {
                    continue;
                }
                let mut sorted = values.clone();
                sorted.sort_by(f64::total_cmp);
                let ms = |q: f64| quantile(&sorted, q) * 1e3;
                let labels = if labels.is_empty() { "-" } else { labels };
                let _ = writeln!(
                    out,
                    "| {name} | {metric} | {labels} | {} | {:.3} | {:.3} | {:.3} |",
                    sorted.len(),
                    ms(0.5),
                    ms(0.99),
                    ms(1.0)
                );
            }
        }
        out
    }
}

impl Backend {
    /// A counter summed over its other labels.
    fn total(&self, metric: &str) -> u64 {
        self.counters
            .iter()
            .filter(|((name, _), _)| name == metric)
            .map(|(_, n)| n)
            .sum()
    }
}

/// The `q` quantile (nearest rank) of sorted, non-empty values.
fn quantile(sorted: &[f64], q: f64) -> f64 {
    let last = sorted.len().saturating_sub(1);
    // Nearest rank: a small index well inside usize.
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss,
        reason = "q is in 0..=1 and the index is at most len - 1"
    )]
    let at = ((last as f64) * q).round() as usize;
    sorted.get(at.min(last)).copied().unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_nearest_ranks() {
        let values: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&values, 0.5), 51.0);
        assert_eq!(quantile(&values, 0.99), 99.0);
        assert_eq!(quantile(&values, 1.0), 100.0);
        assert_eq!(quantile(&[7.0], 0.5), 7.0);
    }

    #[test]
    fn the_report_sums_counters_over_labels_and_lists_histograms() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        metrics::with_local_recorder(&recorder, || {
            let b = ("backend", "memory");
            metrics::counter!(telemetry::ACQUISITIONS, &[b]).increment(3);
            metrics::counter!(telemetry::LOSSES, &[b, ("reason", "lease_expired")]).increment(1);
            metrics::counter!(telemetry::LOSSES, &[b, ("reason", "renewal_rejected")]).increment(2);
            metrics::histogram!(telemetry::ACQUIRE_WAIT, &[b]).record(0.002);
        });
        let report = Figures::from_snapshot(&snapshotter).to_markdown();
        assert!(
            report.contains("| memory | 3 | 0 | 0 | 0 | 0 | 3 | 0 | 0 |"),
            "{report}"
        );
        assert!(
            report.contains(
                "| memory | distlock_acquire_wait_seconds | - | 1 | 2.000 | 2.000 | 2.000 |"
            ),
            "{report}"
        );
    }
}
