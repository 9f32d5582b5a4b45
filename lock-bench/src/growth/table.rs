//! The growth tables of a report.

use super::*;

fn opt(value: Option<f64>, digits: usize) -> String {
    value.map_or_else(|| "n/a".to_owned(), |v| format!("{v:.digits$}"))
}

/// The growth tables of every target that ran a growth scenario.
pub(crate) fn markdown(report: &crate::Report) -> String {
    let mut out = String::new();
    let c = &report.config;
    let targets: Vec<_> = report
        .targets
        .iter()
        .filter_map(|t| t.growth.as_ref().map(|g| (t, g)))
        .collect();
    if targets.iter().any(|(_, g)| !g.hold.is_empty()) {
        out.push_str(&hold_table(c, &targets));
    }
    if targets.iter().any(|(_, g)| !g.clients.is_empty()) {
        out.push_str(&clients_table(c, &targets));
    }
    if targets.iter().any(|(_, g)| !g.mixed_clients.is_empty()) {
        out.push_str(&mixed_clients_table(c, &targets));
    }
    if targets
        .iter()
        .any(|(_, g)| g.every_names().next().is_some())
    {
        out.push_str(&names_table(c, &targets));
    }
    out.push_str(&crate::churn::markdown(report));
    out
}

/// The hold-K table: per target and K, the server's requests, CPU, heap, losses.
fn hold_table(c: &BenchConfig, targets: &[(&crate::TargetResult, &GrowthResult)]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n### Hold-K: one client holding K locks (ttl {}, renewal tick {}, window {}, {} acquisitions in flight)\n",
        humantime::format_duration(c.hold_ttl),
        humantime::format_duration(c.renewal_tick()),
        humantime::format_duration(c.hold_window()),
        c.hold_concurrency
    );
    out.push_str("| target | primitive | K | server requests / tick | per lock | idle / tick | CPU % of a core | heap bytes / guard | lost | acquire all ms | release all ms | server counter |\n");
    out.push_str("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|\n");
    for (t, g) in targets {
        let idle = g.idle.as_ref().map(|i| i.per_tick);
        let counter = g
            .server_counter
            .as_deref()
            .unwrap_or("n/a (no server counter)");
        for h in &g.hold {
            let lost = if h.lost > 0 {
                let reasons: Vec<String> = h
                    .loss_reasons
                    .iter()
                    .map(|(r, n)| format!("{r} {n}"))
                    .collect();
                format!("**{}** ({})", h.lost, reasons.join(", "))
            } else {
                "0".to_owned()
            };
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {lost} | {:.0} | {:.0} | {counter} |",
                t.target,
                h.kind.as_str(),
                h.locks,
                opt(h.requests_per_tick, 1),
                opt(h.requests_per_tick_per_lock, 2),
                opt(idle, 1),
                opt(h.cpu_percent, 2),
                opt(h.heap_bytes_per_guard, 0),
                h.acquire_ms,
                h.release_ms,
            );
        }
    }
    out
}

/// The clients-C table: S2 per client count, with shares against the fair share.
fn clients_table(c: &BenchConfig, targets: &[(&crate::TargetResult, &GrowthResult)]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n### Clients-C: C clients on one name (S2's loop, hold {}, measured {} after {} warm-up)\n",
        humantime::format_duration(c.hold),
        humantime::format_duration(c.duration),
        humantime::format_duration(c.s2_warmup)
    );
    out.push_str("| target | C | critical sections/s | handoff p50 ms | handoff p99 ms | longest wait ms | min share ÷ fair | max share ÷ fair | violations |\n");
    out.push_str("|---|--:|--:|--:|--:|--:|--:|--:|--:|\n");
    for (t, g) in targets {
        for p in &g.clients {
            let _ = writeln!(
                out,
                "| {} | {} | {:.0} | {:.2} | {:.2} | {:.1} | {:.2} | {:.2} | {} |",
                t.target,
                p.clients,
                p.critical_sections_per_sec,
                p.handoff_p50_us / 1000.0,
                p.handoff_p99_us / 1000.0,
                p.longest_wait_us / 1000.0,
                p.min_share_of_fair,
                p.max_share_of_fair,
                p.s2.exclusivity_violations
            );
        }
    }
    out
}

/// The clients-C table of the read-write lock and the semaphore.
fn mixed_clients_table(
    c: &BenchConfig,
    targets: &[(&crate::TargetResult, &GrowthResult)],
) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n### Clients-C of the read-write lock ({:.0}% writes) and the semaphore ({} permits): C clients on one name (hold {}, measured {} after {} warm-up)\n",
        c.write_share * 100.0,
        c.permits,
        humantime::format_duration(c.hold),
        humantime::format_duration(c.duration),
        humantime::format_duration(c.s2_warmup)
    );
    out.push_str("| target | primitive | C | acquisitions/s | acquire p50 ms | acquire p99 ms | longest wait ms | holders in use (mean) | most holders | min share ÷ fair | max share ÷ fair | violations |\n");
    out.push_str("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n");
    for (t, g) in targets {
        for p in &g.mixed_clients {
            let m = &p.mixed;
            let _ = writeln!(
                out,
                "| {} | {} | {} | {:.0} | {:.2} | {:.2} | {:.1} | {:.2} | {} | {:.2} | {:.2} | {} |",
                t.target,
                p.kind.as_str(),
                p.clients,
                p.acquisitions_per_sec,
                m.acquire_wait.p50_us / 1000.0,
                m.acquire_wait.p99_us / 1000.0,
                m.longest_wait_us / 1000.0,
                m.mean_holders,
                m.max_holders,
                p.min_share_of_fair,
                p.max_share_of_fair,
                m.violations
            );
        }
    }
    out
}

/// The names table: acquisitions on random names of a large set, beside the raw floor.
fn names_table(c: &BenchConfig, targets: &[(&crate::TargetResult, &GrowthResult)]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n### Names: {} clients, each acquisition on one of {} names picked at random (hold {}, measured {} after {} warm-up)\n",
        c.names_clients,
        c.names,
        humantime::format_duration(c.hold),
        humantime::format_duration(c.duration),
        humantime::format_duration(c.s2_warmup)
    );
    out.push_str("| target | primitive | acquisitions/s | acquire p50 µs | acquire p99 µs | lost | floor | floor cycles/s | ratio | one name /s | one name ÷ names |\n");
    out.push_str("|---|---|--:|--:|--:|--:|---|--:|--:|--:|--:|\n");
    for (t, g) in targets {
        for n in g.every_names() {
            let _ = writeln!(
                out,
                "| {} | {} | {:.0} | {:.1} | {:.1} | {} | {} | {} | {} | {} | {} |",
                t.target,
                n.kind.as_str(),
                n.acquisitions_per_sec,
                n.acquire_wait.p50_us,
                n.acquire_wait.p99_us,
                n.lost,
                n.floor_label.as_deref().unwrap_or("-"),
                opt(n.floor_cycles_per_sec, 0),
                opt(n.floor_ratio, 3),
                opt(n.one_name_per_sec, 0),
                opt(n.one_name_ratio, 2),
            );
        }
    }
    let _ = writeln!(
        out,
        "\nThe floor (the mutex's only): the backend's raw acquire + release on the same names, with the same clients (one connection each) and the same hold between cycles, measured just before; each floor connection picks among its own share of the names, since a raw cycle cannot wait for a name another holds. The read-write lock runs the read/write mix ({:.0}% writes) on each name, the semaphore one permit of {} on each. One name: clients-C of the same primitive with C = {} on one name, when it ran; ÷ names = how near one name comes to independent ones.",
        c.write_share * 100.0,
        c.permits,
        c.names_clients
    );
    out
}
