//! SVG charts of the growth curves (plotters, SVG backend, as lock-check's timeline): one panel
//! per figure, one line per target.

use plotters::coord::combinators::IntoLogRange;
use plotters::prelude::*;

use crate::{GrowthKind, Report};

/// One panel: a title and, per target, its points `(x, y)`.
struct Panel {
    title: &'static str,
    series: Vec<(String, Vec<(f64, f64)>)>,
}

const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

/// `hold-cost.svg`: server requests per renewal tick, client CPU (% of one core) and heap
/// bytes per held guard, each against K (log x axis), one line per target and primitive
/// (the mutex's named by its target, the others `target rw`, `target semaphore`).
///
/// # Errors
/// The chart could not be drawn (a message from the plotting crate), or no target ran hold.
pub fn hold_cost_svg(report: &Report) -> Result<String, String> {
    let series = |value: fn(&crate::HoldPoint) -> Option<f64>| {
        report
            .targets
            .iter()
            .flat_map(|t| {
                GrowthKind::ALL.into_iter().filter_map(move |kind| {
                    let points: Vec<_> = t
                        .growth
                        .as_ref()?
                        .hold
                        .iter()
                        .filter(|h| h.kind == kind)
                        .filter_map(|h| Some((h.locks as f64, value(h)?)))
                        .collect();
                    (!points.is_empty()).then(|| (series_label(&t.target, kind), points))
                })
            })
            .collect::<Vec<_>>()
    };
    let panels = [
        Panel {
            title: "server requests per renewal tick (idle subtracted)",
            series: series(|h| h.requests_per_tick),
        },
        Panel {
            title: "client CPU, % of one core",
            series: series(|h| h.cpu_percent),
        },
        Panel {
            title: "client heap bytes per held guard",
            series: series(|h| h.heap_bytes_per_guard),
        },
    ];
    let ttl = humantime::format_duration(report.config.hold_ttl);
    draw(
        &format!("distlock bench: the cost of holding K locks (ttl {ttl})"),
        "K (locks held by one client)",
        &panels,
    )
}

/// `clients-latency.svg`: handoff p50, handoff p99 and the longest wait (ms) against the
/// number of contending clients C (log x axis), one line per target.
///
/// # Errors
/// The chart could not be drawn, or no target ran clients.
pub fn clients_latency_svg(report: &Report) -> Result<String, String> {
    let series = |value: fn(&crate::ClientsPoint) -> f64| {
        report
            .targets
            .iter()
            .filter_map(|t| {
                let points: Vec<_> = t
                    .growth
                    .as_ref()?
                    .clients
                    .iter()
                    .map(|c| (c.clients as f64, value(c) / 1000.0))
                    .collect();
                (!points.is_empty()).then(|| (t.target.clone(), points))
            })
            .collect::<Vec<_>>()
    };
    let panels = [
        Panel {
            title: "handoff p50, ms",
            series: series(|c| c.handoff_p50_us),
        },
        Panel {
            title: "handoff p99, ms",
            series: series(|c| c.handoff_p99_us),
        },
        Panel {
            title: "longest wait, ms",
            series: series(|c| c.longest_wait_us),
        },
    ];
    let hold = humantime::format_duration(report.config.hold);
    draw(
        &format!("distlock bench: C clients on one name (hold {hold})"),
        "C (contending clients)",
        &panels,
    )
}

/// `clients-primitives.svg`: acquisitions per second, the acquire wait's p99 (ms) and the
/// holders in use on average against the number of contending clients C (log x axis), one
/// line per target and primitive: the mutex's from S2 (critical sections, the held share),
/// the read-write lock's from the read/write mix and the semaphore's from its scenario.
///
/// # Errors
/// The chart could not be drawn, or no target ran clients.
pub fn clients_primitives_svg(report: &Report) -> Result<String, String> {
    let series = |mutex: fn(&crate::ClientsPoint) -> f64, mixed: fn(&crate::MixedResult) -> f64| {
        let mut all = Vec::new();
        for t in &report.targets {
            let Some(g) = &t.growth else { continue };
            let points: Vec<_> = g
                .clients
                .iter()
                .map(|c| (c.clients as f64, mutex(c)))
                .collect();
            if !points.is_empty() {
                all.push((series_label(&t.target, GrowthKind::Mutex), points));
            }
            for kind in [GrowthKind::ReadWrite, GrowthKind::Semaphore] {
                let points: Vec<_> = g
                    .mixed_clients
                    .iter()
                    .filter(|c| c.kind == kind)
                    .map(|c| (c.clients as f64, mixed(&c.mixed)))
                    .collect();
                if !points.is_empty() {
                    all.push((series_label(&t.target, kind), points));
                }
            }
        }
        all
    };
    let panels = [
        Panel {
            title: "acquisitions per second",
            series: series(|c| c.critical_sections_per_sec, |m| m.acquisitions_per_sec),
        },
        Panel {
            title: "acquire wait p99, ms",
            series: series(
                |c| c.s2.acquire_wait.p99_us / 1000.0,
                |m| m.acquire_wait.p99_us / 1000.0,
            ),
        },
        Panel {
            title: "holders in use on average (a mutex at most 1)",
            series: series(|c| c.s2.held_share, |m| m.mean_holders),
        },
    ];
    let c = &report.config;
    draw(
        &format!(
            "distlock bench: C clients on one name, every primitive (hold {}, {:.0}% writes, {} permits)",
            humantime::format_duration(c.hold),
            c.write_share * 100.0,
            c.permits
        ),
        "C (contending clients)",
        &panels,
    )
}

/// A chart line's label: the target for the mutex, `target rw` / `target semaphore`.
fn series_label(target: &str, kind: GrowthKind) -> String {
    match kind {
        GrowthKind::Mutex => target.to_owned(),
        kind => format!("{target} {}", kind.as_str()),
    }
}

fn draw(caption: &str, x_desc: &str, panels: &[Panel]) -> Result<String, String> {
    let points = || {
        panels
            .iter()
            .flat_map(|p| p.series.iter())
            .flat_map(|(_, s)| s.iter())
    };
    if points().next().is_none() {
        return Err("no measurement to chart".to_owned());
    }
    let x_max = points().map(|p| p.0).fold(1.0, f64::max);
    let mut out = String::new();
    {
        let height = 60 + 300 * panels.len() as u32;
        let root = SVGBackend::with_string(&mut out, (900, height)).into_drawing_area();
        let err = |e: DrawingAreaErrorKind<std::io::Error>| e.to_string();
        root.fill(&WHITE).map_err(err)?;
        let root = root.titled(caption, ("sans-serif", 20)).map_err(err)?;
        let areas = root.split_evenly((panels.len(), 1));
        for (panel, area) in panels.iter().zip(&areas) {
            let y_max = panel
                .series
                .iter()
                .flat_map(|(_, s)| s.iter().map(|p| p.1))
                .fold(0.0, f64::max);
            let y_top = if y_max > 0.0 { y_max * 1.15 } else { 1.0 };
            let mut chart = ChartBuilder::on(area)
                .caption(panel.title, ("sans-serif", 15))
                .margin(10)
                .x_label_area_size(36)
                .y_label_area_size(64)
                .build_cartesian_2d((0.8f64..x_max * 1.25).log_scale(), 0f64..y_top)
                .map_err(err)?;
            chart
                .configure_mesh()
                .x_desc(x_desc)
                .x_label_formatter(&|x| format!("{x:.0}"))
                .y_label_formatter(&|y| {
                    format!("{y:.4}")
                        .trim_end_matches('0')
                        .trim_end_matches('.')
                        .to_owned()
                })
                .draw()
                .map_err(err)?;
            for (i, (label, points)) in panel.series.iter().enumerate() {
                let color = COLORS[i % COLORS.len()];
                chart
                    .draw_series(LineSeries::new(
                        points.iter().copied(),
                        color.stroke_width(2),
                    ))
                    .map_err(err)?
                    .label(label.as_str())
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
                    });
                chart
                    .draw_series(points.iter().map(|p| Circle::new(*p, 3, color.filled())))
                    .map_err(err)?;
            }
            if !panel.series.is_empty() {
                chart
                    .configure_series_labels()
                    .position(SeriesLabelPosition::UpperLeft)
                    .background_style(WHITE.mix(0.85))
                    .border_style(BLACK.mix(0.3))
                    .draw()
                    .map_err(err)?;
            }
        }
        root.present().map_err(err)?;
    }
    Ok(out)
}
