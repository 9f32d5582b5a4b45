//! The verdict as a table (terminal and Markdown), as JSON, and as an SVG timeline.

use std::fmt::Write as _;

use plotters::prelude::*;
use serde::Serialize;

use crate::checker::{Judgement, Rule, Stats, Verdict};
use crate::history::{FaultKind, History, Nanos};
use crate::kind::CheckKind;

/// Milliseconds, for reports.
fn ms(nanos: Nanos) -> String {
    format!("{:.0} ms", nanos as f64 / 1e6)
}

/// The verdict table and the run's figures, in Markdown (which reads as plain text too).
pub fn markdown(label: &str, verdict: &Verdict) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "### `distlock check` of {label} ({})",
        verdict.guarantee
    );
    let _ = writeln!(out);
    let _ = writeln!(out, "| check | result | findings |");
    let _ = writeln!(out, "|---|---|--:|");
    for rule in Rule::ALL {
        let found: Vec<_> = verdict.of(rule).collect();
        let violations = found
            .iter()
            .filter(|f| f.judgement == Judgement::Violation)
            .count();
        let result = if violations > 0 {
            "**FAIL**".to_owned()
        } else if let Some(Judgement::Expected(why)) = found.first().map(|f| &f.judgement) {
            format!("expected ({why})")
        } else {
            "pass".to_owned()
        };
        let _ = writeln!(out, "| {} | {result} | {} |", rule.title(), found.len());
    }
    out.push_str(&figures(&verdict.stats));
    let shown: Vec<_> = verdict.findings.iter().take(10).collect();
    if !shown.is_empty() {
        let _ = writeln!(out);
        for f in &shown {
            let judged = match &f.judgement {
                Judgement::Violation => "VIOLATION".to_owned(),
                Judgement::Expected(_) => "expected".to_owned(),
            };
            let _ = writeln!(out, "- {judged} [{:?}] {}", f.rule, f.detail);
        }
        if verdict.findings.len() > shown.len() {
            let _ = writeln!(
                out,
                "- ... and {} more",
                verdict.findings.len() - shown.len()
            );
        }
    }
    out
}

/// The figures table of a run's statistics (faults, acquisitions, writes, checks, stalls,
/// and the clock steps and lost replies when those faults ran).
fn figures(s: &Stats) -> String {
    let mut out = String::new();
    let faults = if s.faults.is_empty() {
        "none".to_owned()
    } else {
        s.faults
            .iter()
            .map(|(kind, n)| format!("{kind} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let _ = writeln!(out);
    let _ = writeln!(out, "| figure | value |");
    let _ = writeln!(out, "|---|--:|");
    let rows: [(&str, String); 10] = [
        ("duration", ms(s.duration)),
        ("faults injected", faults),
        (
            "acquisitions (acquired / failed)",
            format!("{} ({} / {})", s.acquisitions, s.acquired, s.failed),
        ),
        ("acquired per second", format!("{:.1}", s.acquired_per_sec)),
        ("fenced writes accepted", s.writes_accepted.to_string()),
        (
            "late writes only the fence stopped",
            s.writes_rejected.to_string(),
        ),
        (
            "checks that stopped a holder (deadline passed or lost)",
            s.checks_refused.to_string(),
        ),
        ("checks passed", s.checks_passed.to_string()),
        (
            "longest stall with waiters, no holder, no fault",
            ms(s.longest_gap),
        ),
        (
            "acquisition after healing",
            s.final_acquire.map_or_else(|| "failed".to_owned(), ms),
        ),
    ];
    for (name, value) in rows {
        let _ = writeln!(out, "| {name} | {value} |");
    }
    if s.faults.contains_key(&FaultKind::Clock) {
        let _ = writeln!(
            out,
            "| server clock steps (forward / back, the largest) | {} / {} / {} |",
            s.clock_steps.forward,
            s.clock_steps.back,
            ms(s.clock_steps.largest_ms.saturating_mul(1_000_000))
        );
    }
    if s.faults.contains_key(&FaultKind::Ambiguous) {
        let a = s.ambiguous_aimed;
        let _ = writeln!(
            out,
            "| lost replies aimed at (acquire / renew / release) | {} / {} / {} |",
            a.acquires, a.renewals, a.releases
        );
        let r = s.ambiguous_reach;
        let _ = writeln!(
            out,
            "| lost replies reached (acquire / renew / release) | {} / {} / {} |",
            r.acquires, r.renewals, r.releases
        );
    }
    out
}

/// What `--json` writes: the check's parameters, and each kind's run.
#[derive(Debug, Serialize)]
pub struct JsonReport<'a, P: Serialize> {
    /// The check's parameters.
    pub params: P,
    /// One run per kind checked, in order.
    pub runs: &'a [KindRun],
}

/// The run of one kind: its verdict and everything it recorded.
#[derive(Debug, Serialize)]
pub struct KindRun {
    /// The kind the workers drove.
    pub kind: CheckKind,
    /// The verdict.
    pub verdict: Verdict,
    /// Everything recorded.
    pub history: History,
}

/// The file of `kind`'s report beside `path` when a check has several kinds:
/// `run.svg` becomes `run-permits-2.svg`.
pub fn per_kind(path: &std::path::Path, kind: CheckKind) -> std::path::PathBuf {
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tag = kind.label().replace(':', "-");
    let file = match path.extension() {
        Some(ext) => format!("{stem}-{tag}.{}", ext.to_string_lossy()),
        None => format!("{stem}-{tag}"),
    };
    path.with_file_name(file)
}

fn fault_color(kind: FaultKind) -> RGBColor {
    match kind {
        FaultKind::Pause => RGBColor(240, 180, 40),
        FaultKind::Crash => RGBColor(200, 60, 60),
        FaultKind::Partition => RGBColor(120, 80, 200),
        FaultKind::Restart => RGBColor(120, 120, 120),
        FaultKind::Ambiguous => RGBColor(40, 160, 160),
        FaultKind::Starve => RGBColor(60, 160, 60),
        FaultKind::Lossy => RGBColor(200, 120, 200),
        FaultKind::Clock => RGBColor(230, 110, 30),
    }
}

/// An SVG timeline of the run: one row per worker, its holds as bars (from `acquire`
/// returning to `release` or a failed check), its waits as thin lines, faults shaded (a
/// restart or a clock step over every row; a dashed line where the server's clock jumped
/// forward), refused late writes as black crosses and violations as red circles.
///
/// # Errors
/// The chart could not be drawn (a message from the plotting crate).
pub fn svg(label: &str, history: &History, verdict: &Verdict) -> Result<String, String> {
    let rows = history
        .workers
        .iter()
        .map(|w| w.id + 1)
        .chain(history.acquisitions.iter().map(|a| a.id.worker + 1))
        .max()
        .unwrap_or(1);
    let last = history
        .final_acquire
        .as_ref()
        .map_or(history.end, |f| f.returned.max(history.end));
    let scale = Scale {
        origin: history.start,
        rows,
    };
    let span = scale.x(last).max(0.001);
    let mut out = String::new();
    {
        // Three empty rows above the workers hold the legend.
        let height = 120 + 28 * (rows + 3);
        let root = SVGBackend::with_string(&mut out, (1200, height)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                format!("distlock check: {label} ({})", verdict.guarantee),
                ("sans-serif", 18),
            )
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(48)
            .build_cartesian_2d(0f64..span, -0.6f64..(f64::from(rows) + 2.6))
            .map_err(err)?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(rows as usize + 3)
            .y_label_formatter(&|y| {
                if *y < f64::from(rows) - 0.5 {
                    format!("w{}", y.round())
                } else {
                    String::new()
                }
            })
            .x_desc("seconds")
            .draw()
            .map_err(err)?;
        draw_faults(&mut chart, &scale, history)?;
        draw_holds(&mut chart, &scale, history)?;
        draw_marks(&mut chart, &scale, history, verdict)?;
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(err)?;
        root.present().map_err(err)?;
    }
    Ok(out)
}

/// The timeline's chart: seconds across, a row per worker.
type Chart<'a, 'b> = ChartContext<
    'a,
    SVGBackend<'b>,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
>;

/// Where a history's instants and workers go on the chart.
struct Scale {
    origin: Nanos,
    rows: u32,
}

impl Scale {
    /// Seconds since the run started.
    #[expect(clippy::cast_precision_loss, reason = "a chart's resolution")]
    fn x(&self, t: Nanos) -> f64 {
        t.saturating_sub(self.origin) as f64 / 1e9
    }

    /// A worker's row.
    fn row(worker: u32) -> f64 {
        f64::from(worker)
    }

    /// Below the lowest row, above the highest.
    fn all_rows(&self) -> (f64, f64) {
        (-0.6, f64::from(self.rows) - 0.4)
    }
}

fn err(e: DrawingAreaErrorKind<std::io::Error>) -> String {
    e.to_string()
}

/// The faults, shaded over their worker's row (or every row) while they last, and the server
/// clock's forward jumps as lines.
fn draw_faults(chart: &mut Chart<'_, '_>, scale: &Scale, history: &History) -> Result<(), String> {
    for kind in FaultKind::ALL {
        let color = fault_color(kind);
        let shaded: Vec<_> = history
            .faults
            .iter()
            .filter(|f| f.kind == kind)
            .map(|f| {
                let (lo, hi) = match f.worker {
                    Some(w) => (Scale::row(w) - 0.45, Scale::row(w) + 0.45),
                    None => scale.all_rows(),
                };
                Rectangle::new(
                    [(scale.x(f.start), lo), (scale.x(f.healed), hi)],
                    color.mix(0.3).filled(),
                )
            })
            .collect();
        if shaded.is_empty() {
            continue;
        }
        chart
            .draw_series(shaded)
            .map_err(err)?
            .label(kind.as_str())
            .legend(move |(px, py)| {
                Rectangle::new([(px, py - 5), (px + 14, py + 5)], color.mix(0.4).filled())
            });
    }
    let (lo, hi) = scale.all_rows();
    let jumps: Vec<_> = history
        .faults
        .iter()
        .filter_map(crate::history::Fault::forward_step_at)
        .map(|at| {
            PathElement::new(
                vec![(scale.x(at), lo), (scale.x(at), hi)],
                fault_color(FaultKind::Clock).stroke_width(2),
            )
        })
        .collect();
    if !jumps.is_empty() {
        chart
            .draw_series(jumps)
            .map_err(err)?
            .label("server clock jumped forward")
            .legend(|(px, py)| {
                PathElement::new(
                    vec![(px + 7, py - 6), (px + 7, py + 6)],
                    fault_color(FaultKind::Clock).stroke_width(2),
                )
            });
    }
    Ok(())
}

/// Each acquisition's wait as a thin line, and its hold as a bar.
fn draw_holds(chart: &mut Chart<'_, '_>, scale: &Scale, history: &History) -> Result<(), String> {
    let waits = history.acquisitions.iter().map(|a| {
        let y = Scale::row(a.id.worker);
        PathElement::new(
            vec![
                (scale.x(a.invoked), y),
                (scale.x(a.returned.unwrap_or(history.end)), y),
            ],
            BLACK.mix(0.25),
        )
    });
    chart.draw_series(waits).map_err(err)?;
    let holds = history
        .acquisitions
        .iter()
        .filter(|a| a.acquired())
        .map(|a| {
            let from = a.returned.unwrap_or(a.invoked);
            let until = a
                .lost
                .or(a.released)
                .or(a.valid_until)
                .unwrap_or(history.end);
            let y = Scale::row(a.id.worker);
            Rectangle::new(
                [(scale.x(from), y - 0.28), (scale.x(until), y + 0.28)],
                BLUE.mix(0.7).filled(),
            )
        });
    chart
        .draw_series(holds)
        .map_err(err)?
        .label("held")
        .legend(|(px, py)| Rectangle::new([(px, py - 5), (px + 14, py + 5)], BLUE.filled()));
    Ok(())
}

/// The late writes the fence refused (crosses) and the violations (red circles).
fn draw_marks(
    chart: &mut Chart<'_, '_>,
    scale: &Scale,
    history: &History,
    verdict: &Verdict,
) -> Result<(), String> {
    let refused: Vec<_> = history
        .writes
        .iter()
        .filter(|w| !w.accepted)
        .map(|w| {
            Cross::new(
                (scale.x(w.at), Scale::row(w.acq.worker)),
                5,
                BLACK.stroke_width(2),
            )
        })
        .collect();
    if !refused.is_empty() {
        chart
            .draw_series(refused)
            .map_err(err)?
            .label("late write refused by the fence")
            .legend(|(px, py)| Cross::new((px + 7, py), 5, BLACK.stroke_width(2)));
    }
    let violations: Vec<_> = verdict
        .violations()
        .map(|f| {
            let y = f.acqs.first().map_or(-0.5, |a| Scale::row(a.worker));
            Circle::new((scale.x(f.at), y), 7, RED.stroke_width(3))
        })
        .collect();
    if !violations.is_empty() {
        chart
            .draw_series(violations)
            .map_err(err)?
            .label("violation")
            .legend(|(px, py)| Circle::new((px + 7, py), 5, RED.stroke_width(3)));
    }
    Ok(())
}
