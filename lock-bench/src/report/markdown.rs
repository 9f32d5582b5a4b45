//! The Markdown rendering of a [`Report`].

use std::fmt::Write as _;

use super::*;

impl Report {
    /// The parameters, one line per scenario.
    pub fn parameters(&self) -> String {
        let c = &self.config;
        let mut out = scenario_lines(c);
        if c.background_load > 0 {
            let _ = writeln!(
                out,
                "- Background load: {} busy processes (one core each when scheduled) ran through \
                 the whole run, the floors' blocks and distlock's alike.",
                c.background_load
            );
        }
        let _ = writeln!(
            out,
            "- Floor: the backend's minimal raw acquire + release, same loop as S1, interleaved with it in rotating blocks of 100 cycles; ratio = ops/s ÷ floor ops/s. \
             Names under `{}`.",
            c.name_prefix
        );
        if c.scenarios.contended() {
            let _ = writeln!(
                out,
                "- Paused floor cycle: {PAUSED_CYCLES} floor cycles, each after a {} pause (the hold), so that it starts \
                 from the idle state a handoff starts from; one cycle = two round trips from idle. \
                 handoff ÷ paused = S2 handoff p50 ÷ paused floor cycle p50 (≤ 1: within two round trips).",
                human(c.hold)
            );
            let _ = writeln!(
                out,
                "- Contended floor: S2's loop on the server's own blocking lock (one connection per \
                 client, same clients, hold and duration), measured just before S2; ratio = S2 \
                 critical sections/s ÷ the floor's, p99 ratio = S2 handoff p99 ÷ the floor's."
            );
        }
        if self
            .targets
            .iter()
            .any(|t| t.fenced_floor.is_some() || t.fenced_contended_floor.is_some())
        {
            let _ = writeln!(
                out,
                "- Fenced floors: the floors again, also handing out a fencing token (S1's: in the \
                 same rotation of blocks as S1 and the floor; S2's: right after the contended \
                 floor); fenced ÷ floor = what the tokens cost by themselves, distlock ÷ fenced \
                 floor = what distlock costs on top."
            );
        }
        if self.targets.iter().any(|t| {
            t.uncontended
                .as_ref()
                .is_some_and(|s| s.cpu_per_cycle_us.is_some())
        }) {
            let _ = writeln!(
                out,
                "- CPU µs/cycle: the process's CPU time (user + system, every thread) during a \
                 side's measured blocks ÷ its cycles: what a cycle costs the client's CPUs, on \
                 the critical path or not."
            );
        }
        let _ = writeln!(out, "- Runtime: tokio {}.", self.runtime);
        out
    }

    /// The growth scenarios' tables (hold-K, clients-C, names), empty when none ran.
    pub fn growth_markdown(&self) -> String {
        crate::growth::markdown(self)
    }

    /// A Markdown rendering: the parameters, one row per target × scenario (with the floor and
    /// the ratio), S2 details, and the errors if any.
    pub fn to_markdown(&self) -> String {
        if self.config.scenarios.growth_only() {
            let mut out = format!("- Runtime: tokio {}.\n", self.runtime);
            if self.config.background_load > 0 {
                let _ = writeln!(
                    out,
                    "- Background load: {} busy processes through the whole run.",
                    self.config.background_load
                );
            }
            out.push_str(&self.growth_markdown());
            for t in &self.targets {
                for e in &t.errors {
                    let _ = writeln!(out, "\n- {} {}: error: {}", t.target, e.scenario, e.message);
                }
            }
            return out;
        }
        let mut out = self.parameters();
        out.push('\n');
        out.push_str(&self.scenarios_markdown());
        out.push_str(&self.contended_markdown());
        out.push_str(&self.contended_floor_markdown());
        out.push_str(&self.fenced_floor_markdown());
        out.push_str(&self.cycle_markdown());
        out.push_str(&self.cpu_markdown());
        out.push_str(&self.mixed_markdown());
        out.push_str(&self.semaphore_mutexes_markdown());
        out
    }

    /// The table of every scenario's throughput and latency beside the floor, one row per
    /// target and scenario (skips and errors included), and the targets without a floor.
    fn scenarios_markdown(&self) -> String {
        let mut out = String::new();
        out.push_str("| target | scenario | ops/s | p50 µs | p99 µs | max µs | floor | floor ops/s | ratio |\n");
        out.push_str("|---|---|--:|--:|--:|--:|---|--:|--:|\n");
        for t in &self.targets {
            let floor_label = match (&t.floor, &t.no_floor) {
                (Some(f), _) => f.label.as_str(),
                (None, Some(_)) => "none (see below)",
                (None, None) => "-",
            };
            let floor_ops = t
                .floor
                .as_ref()
                .map_or_else(|| "-".to_owned(), |f| format!("{:.0}", f.ops_per_sec));
            let ratio = |r: Option<f64>| match r {
                None => "-".to_owned(),
                Some(r) if r != 0.0 && r < 0.01 => format!("{r:.2e}"),
                Some(r) => format!("{r:.3}"),
            };
            let mut row = |scenario: &str, ops: f64, lat: &LatencySummary, r: Option<f64>| {
                let _ = writeln!(
                    out,
                    "| {} | {scenario} | {ops:.0} | {:.1} | {:.1} | {:.1} | {floor_label} | {floor_ops} | {} |",
                    t.target,
                    lat.p50_us,
                    lat.p99_us,
                    lat.max_us,
                    ratio(r)
                );
            };
            if let Some(s1) = &t.uncontended {
                row("S1 uncontended", s1.ops_per_sec, &s1.cycle, s1.floor_ratio);
            }
            if let Some(s2) = &t.contended {
                row(
                    "S2 contended",
                    s2.critical_sections_per_sec,
                    &s2.handoff,
                    s2.floor_ratio,
                );
            }
            if let Some(m) = &t.rw_mix {
                let label = format!("RW mix ({:.0}% exclusive)", self.config.write_share * 100.0);
                row(&label, m.acquisitions_per_sec, &m.acquire_wait, None);
            }
            if let Some(m) = &t.semaphore {
                let label = format!("semaphore ({} permits)", self.config.permits);
                row(&label, m.acquisitions_per_sec, &m.acquire_wait, None);
            }
            for skip in &t.skipped {
                let _ = writeln!(
                    out,
                    "| {} | {} | skipped: {} | | | | | | |",
                    t.target,
                    skip.scenario,
                    skip.reason.replace('|', "\\|")
                );
            }
            for e in &t.errors {
                let _ = writeln!(
                    out,
                    "| {} | {} | error: {} | | | | | | |",
                    t.target,
                    e.scenario,
                    e.message.replace('|', "\\|")
                );
            }
        }
        for t in &self.targets {
            if let Some(why) = &t.no_floor {
                let _ = writeln!(out, "\n- {}: no floor: {why}", t.target);
            }
        }
        out
    }

    /// S2's details per target: handoffs, waits, holds, shares, violations, the paused floor.
    fn contended_markdown(&self) -> String {
        let mut out = String::new();
        let contended: Vec<_> = self
            .targets
            .iter()
            .filter_map(|t| t.contended.as_ref().map(|c| (t, c)))
            .collect();
        if !contended.is_empty() {
            out.push_str("\n| target | S2 critical sections | to another client | longest wait ms | mean hold µs | held % | per-client share | violations | paused floor cycle p50 µs | handoff ÷ paused |\n");
            out.push_str("|---|--:|--:|--:|--:|--:|---|--:|--:|--:|\n");
            for (t, c) in contended {
                let shares: Vec<_> = c
                    .per_client
                    .iter()
                    .map(|p| format!("{:.0}%", p.share * 100.0))
                    .collect();
                let paused = t
                    .floor
                    .as_ref()
                    .and_then(|f| f.paused_cycle.as_ref())
                    .map_or_else(|| "-".to_owned(), |p| format!("{:.1}", p.p50_us));
                let _ = writeln!(
                    out,
                    "| {} | {} | {} | {:.1} | {:.0} | {:.1} | {} | {} | {paused} | {} |",
                    t.target,
                    c.critical_sections,
                    c.handoff_other_share
                        .map_or_else(|| "-".to_owned(), |s| format!("{:.1}%", s * 100.0)),
                    c.longest_wait_us / 1000.0,
                    c.mean_hold_us,
                    c.held_share * 100.0,
                    shares.join(" / "),
                    c.exclusivity_violations,
                    c.handoff_paused_floor_ratio
                        .map_or_else(|| "-".to_owned(), |r| format!("{r:.2}"))
                );
            }
        }
        out
    }

    /// The fenced floors next to the plain ones of the same run, for targets that have them:
    /// what handing out fencing tokens costs by itself, and distlock against that.
    fn fenced_floor_markdown(&self) -> String {
        let mut out = String::new();
        let mut rows = Vec::new();
        for t in &self.targets {
            if let (Some(fenced), Some(s1)) = (&t.fenced_floor, &t.uncontended) {
                let plain = t.floor.as_ref().map(|f| f.ops_per_sec);
                rows.push((
                    t,
                    "S1 uncontended",
                    &fenced.label,
                    fenced.ops_per_sec,
                    plain,
                    s1.ops_per_sec,
                ));
            }
            if let (Some(fenced), Some(s2)) = (&t.fenced_contended_floor, &t.contended) {
                let plain = t
                    .contended_floor
                    .as_ref()
                    .map(|f| f.s2.critical_sections_per_sec);
                let (label, ops) = (&fenced.label, fenced.s2.critical_sections_per_sec);
                rows.push((
                    t,
                    "S2 contended",
                    label,
                    ops,
                    plain,
                    s2.critical_sections_per_sec,
                ));
            }
        }
        if rows.is_empty() {
            return out;
        }
        out.push_str("\n| target | scenario | floor ops/s | fenced floor | fenced floor ops/s | fenced ÷ floor | distlock ops/s | distlock ÷ fenced floor |\n");
        out.push_str("|---|---|--:|---|--:|--:|--:|--:|\n");
        let ratio = |a: f64, b: Option<f64>| {
            b.filter(|b| *b > 0.0)
                .map_or_else(|| "-".to_owned(), |b| format!("{:.3}", a / b))
        };
        for (t, scenario, label, fenced, plain, distlock) in rows {
            let _ = writeln!(
                out,
                "| {} | {scenario} | {} | {label} | {fenced:.0} | {} | {distlock:.0} | {} |",
                t.target,
                plain.map_or_else(|| "-".to_owned(), |p| format!("{p:.0}")),
                ratio(fenced, plain),
                ratio(distlock, Some(fenced)),
            );
        }
        out
    }

    /// S1's cycle latency beside each floor's, from the same rotation of blocks, a row per
    /// side: a stall that S1 shows and its floor does not is the client's, one both show is
    /// the server's (or the machine's).
    fn cycle_markdown(&self) -> String {
        let mut out = String::new();
        let rows: Vec<_> = self
            .targets
            .iter()
            .filter_map(|t| {
                let s1 = t.uncontended.as_ref()?;
                (t.floor.is_some() || t.fenced_floor.is_some()).then_some((t, s1))
            })
            .collect();
        if rows.is_empty() {
            return out;
        }
        out.push_str("\n| target | S1 cycle beside | p50 µs | p99 µs | max µs |\n");
        out.push_str("|---|---|--:|--:|--:|\n");
        for (t, s1) in rows {
            let mut row = |side: &str, lat: &LatencySummary| {
                let _ = writeln!(
                    out,
                    "| {} | {side} | {:.1} | {:.1} | {:.1} |",
                    t.target, lat.p50_us, lat.p99_us, lat.max_us
                );
            };
            row("distlock", &s1.cycle);
            if let Some(f) = &t.floor {
                row(&format!("floor: {}", f.label), &f.cycle);
            }
            if let Some(f) = &t.fenced_floor {
                row(&format!("fenced floor: {}", f.label), &f.cycle);
            }
        }
        out
    }

    /// S1's CPU time per cycle next to its floors', for targets where it was measured.
    fn cpu_markdown(&self) -> String {
        let mut out = String::new();
        let rows: Vec<_> = self
            .targets
            .iter()
            .filter_map(|t| {
                let s1 = t.uncontended.as_ref()?.cpu_per_cycle_us?;
                let floor = |f: &Option<FloorResult>| f.as_ref().and_then(|f| f.cpu_per_cycle_us);
                Some((t, floor(&t.floor), floor(&t.fenced_floor), s1))
            })
            .collect();
        if rows.is_empty() {
            return out;
        }
        out.push_str("\n| target | scenario | floor CPU µs/cycle | fenced floor CPU µs/cycle | distlock CPU µs/cycle | distlock − floor µs | distlock − fenced floor µs |\n");
        out.push_str("|---|---|--:|--:|--:|--:|--:|\n");
        let us = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.1}"));
        for (t, floor, fenced, s1) in rows {
            let _ = writeln!(
                out,
                "| {} | S1 uncontended | {} | {} | {s1:.1} | {} | {} |",
                t.target,
                us(floor),
                us(fenced),
                us(floor.map(|f| s1 - f)),
                us(fenced.map(|f| s1 - f)),
            );
        }
        out
    }

    /// S2 next to the contended floor measured just before it, for targets that have one.
    fn contended_floor_markdown(&self) -> String {
        let mut out = String::new();
        let rows: Vec<_> = self
            .targets
            .iter()
            .filter_map(|t| Some((t, t.contended_floor.as_ref()?, t.contended.as_ref()?)))
            .collect();
        if rows.is_empty() {
            return out;
        }
        out.push_str("\n| target | contended floor | floor cs/s | S2 cs/s | ratio | floor handoff p50 / p99 ms | S2 handoff p50 / p99 ms | p99 ratio | floor longest wait ms | S2 longest wait ms |\n");
        out.push_str("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|\n");
        let ratio = |r: Option<f64>| r.map_or_else(|| "-".to_owned(), |r| format!("{r:.2}"));
        let ms =
            |l: &LatencySummary| format!("{:.2} / {:.2}", l.p50_us / 1000.0, l.p99_us / 1000.0);
        for (t, floor, s2) in rows {
            let f = &floor.s2;
            let _ = writeln!(
                out,
                "| {} | {} | {:.0} | {:.0} | {} | {} | {} | {} | {:.1} | {:.1} |",
                t.target,
                floor.label,
                f.critical_sections_per_sec,
                s2.critical_sections_per_sec,
                ratio(s2.contended_floor_ratio),
                ms(&f.handoff),
                ms(&s2.handoff),
                ratio(s2.handoff_p99_floor_ratio),
                f.longest_wait_us / 1000.0,
                s2.longest_wait_us / 1000.0,
            );
        }
        out
    }

    /// The details of the read/write mix and the semaphore, with their gauges.
    fn mixed_markdown(&self) -> String {
        let mut out = String::new();
        let mixed: Vec<_> = self
            .targets
            .iter()
            .flat_map(|t| {
                let floor = t
                    .rw_floor
                    .as_ref()
                    .map(|f| (t, format!("RW mix on the floor: {}", f.label), &f.mix));
                let rw = t.rw_mix.as_ref().map(|m| (t, "RW mix".to_owned(), m));
                let sem = t.semaphore.as_ref().map(|m| (t, "semaphore".to_owned(), m));
                floor.into_iter().chain(rw).chain(sem)
            })
            .collect();
        if mixed.is_empty() {
            return out;
        }
        out.push_str("\n| target | scenario | acquisitions | exclusive | shared p50 / p99 µs | exclusive p50 / p99 µs | longest wait ms | per-client share | max holders | mean holders | writer held % | max writers | violations |\n");
        out.push_str("|---|---|--:|--:|--:|--:|--:|---|--:|--:|--:|--:|--:|\n");
        let p = |l: &Option<LatencySummary>| {
            l.as_ref().map_or_else(
                || "-".to_owned(),
                |l| format!("{:.1} / {:.1}", l.p50_us, l.p99_us),
            )
        };
        for (t, scenario, m) in mixed {
            let shares: Vec<_> = m
                .per_client
                .iter()
                .map(|p| format!("{:.0}%", p.share * 100.0))
                .collect();
            let holders = match m.permits {
                Some(permits) => format!("{} (≤ {permits})", m.max_holders),
                None => m.max_holders.to_string(),
            };
            let writers = m
                .max_writers
                .map_or_else(|| "-".to_owned(), |w| format!("{w} (≤ 1)"));
            let violations = violations_cell(m.violations);
            let _ = writeln!(
                out,
                "| {} | {scenario} | {} | {} | {} | {} | {:.1} | {} | {holders} | {:.2} | {} | {writers} | {violations} |",
                t.target,
                m.acquisitions,
                m.exclusive_acquisitions,
                p(&m.shared_wait),
                p(&m.exclusive_wait),
                m.longest_wait_us / 1000.0,
                shares.join(" / "),
                m.mean_holders,
                m.writer_share
                    .map_or_else(|| "-".to_owned(), |w| format!("{:.1}", w * 100.0)),
            );
        }
        out.push_str(&self.kind_handoffs_markdown());
        out
    }

    /// The semaphore beside as many mutexes as it has permits (at most its clients), side by
    /// side, and those mutexes beside S2 (one mutex) times their number. A row wherever the
    /// mutexes ran, the semaphore's cells `-` if it did not.
    fn semaphore_mutexes_markdown(&self) -> String {
        let mut out = String::new();
        let rows: Vec<_> = self
            .targets
            .iter()
            .filter_map(|t| Some((t, t.semaphore_mutexes.as_ref()?)))
            .collect();
        if rows.is_empty() {
            return out;
        }
        out.push_str("\nThe semaphore beside as many mutexes as it has permits (at most its clients), side by side (its clients split among the names, each name S2's loop, all at once, just before the semaphore): a permit changes hands as a mutex does, so the mutexes side by side are about the most the semaphore can match on this machine and server; and those mutexes beside S2 (one name, its own clients) times their number: below 1, the machine does not run that many mutexes at S2's speed at once.\n");
        out.push_str("\n| target | names | semaphore acquisitions/s | mean holders | mutexes side by side cs/s (per name) | semaphore ÷ side by side | S2 cs/s × names | side by side ÷ (S2 × names) | violations |\n");
        out.push_str("|---|--:|--:|--:|--:|--:|--:|--:|--:|\n");
        let opt = |v: Option<f64>, digits: usize| {
            v.map_or_else(|| "-".to_owned(), |v| format!("{v:.digits$}"))
        };
        let ratio = |a: f64, b: f64| (b > 0.0).then(|| a / b);
        for (t, side) in rows {
            let per_name: Vec<_> = side.per_name.iter().map(|r| format!("{r:.0}")).collect();
            let names = side.names as f64;
            let s2 = t
                .contended
                .as_ref()
                .map(|c| c.critical_sections_per_sec * names)
                .filter(|r| *r > 0.0);
            let sem = t.semaphore.as_ref();
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {:.0} ({}) | {} | {} | {} | {} |",
                t.target,
                side.names,
                opt(sem.map(|m| m.acquisitions_per_sec), 0),
                opt(sem.map(|m| m.mean_holders), 2),
                side.critical_sections_per_sec,
                per_name.join(" / "),
                opt(
                    sem.and_then(|m| ratio(m.acquisitions_per_sec, side.critical_sections_per_sec)),
                    2
                ),
                opt(s2, 0),
                opt(s2.and_then(|r| ratio(side.critical_sections_per_sec, r)), 2),
                violations_cell(side.violations),
            );
        }
        out
    }

    /// The read/write mix's handoffs between the kinds, beside two of S2's (mutex) handoffs.
    fn kind_handoffs_markdown(&self) -> String {
        let mut out = String::new();
        let rows: Vec<_> = self
            .targets
            .iter()
            .filter_map(|t| {
                let m = t.rw_mix.as_ref()?;
                Some((
                    t,
                    m.writer_to_readers.as_ref()?,
                    m.readers_to_writer.as_ref()?,
                ))
            })
            .collect();
        if rows.is_empty() {
            return out;
        }
        out.push_str("\nRW mix handoffs between the kinds (each from just before the release that frees the name for the other kind to the other kind's first acquisition that was waiting), against two S2 handoffs of the same target (writer → readers p50 + readers → writer p50 ÷ 2 × S2 handoff p50; ≤ 1: a writer's turn costs no more than two mutex handoffs); where the server has a read-write lock of its own, the same mix on it (the contended floor, just before distlock's mix), against two of its S2 handoffs.\n");
        out.push_str("\n| target | writer → readers p50 / p99 ms (count) | readers → writer p50 / p99 ms (count) | S2 handoff p50 ms | ÷ 2 S2 handoffs | floor: writer → readers, readers → writer p50 ms | floor S2 handoff p50 ms | floor ÷ 2 floor S2 handoffs |\n");
        out.push_str("|---|--:|--:|--:|--:|--:|--:|--:|\n");
        let ms = |l: &LatencySummary| {
            format!(
                "{:.2} / {:.2} ({})",
                l.p50_us / 1000.0,
                l.p99_us / 1000.0,
                l.count
            )
        };
        let opt = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.2}"));
        for (t, to_readers, to_writer) in rows {
            let s2 = t.contended.as_ref().map(|c| c.handoff.p50_us);
            let floor = t.rw_floor.as_ref().and_then(|f| {
                Some((
                    f.mix.writer_to_readers.as_ref()?,
                    f.mix.readers_to_writer.as_ref()?,
                ))
            });
            let floor_s2 = t.contended_floor.as_ref().map(|f| f.s2.handoff.p50_us);
            let floor_turns = floor.map_or_else(
                || "-".to_owned(),
                |(r, w)| format!("{:.2}, {:.2}", r.p50_us / 1000.0, w.p50_us / 1000.0),
            );
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {floor_turns} | {} | {} |",
                t.target,
                ms(to_readers),
                ms(to_writer),
                opt(s2.filter(|p| *p > 0.0).map(|p| p / 1000.0)),
                opt(s2.and_then(|p| turns_ratio(to_readers, to_writer, p))),
                opt(floor.and(floor_s2).filter(|p| *p > 0.0).map(|p| p / 1000.0)),
                opt(floor
                    .zip(floor_s2)
                    .and_then(|((r, w), p)| turns_ratio(r, w, p))),
            );
        }
        out
    }
}

/// A writer's two turns (to the readers and back, p50s) over two S2 handoffs of p50
/// `handoff_us`; `None` without a turn of either kind or a handoff.
fn turns_ratio(
    to_readers: &LatencySummary,
    to_writer: &LatencySummary,
    handoff_us: f64,
) -> Option<f64> {
    (to_readers.count > 0 && to_writer.count > 0 && handoff_us > 0.0)
        .then(|| (to_readers.p50_us + to_writer.p50_us) / (2.0 * handoff_us))
}

fn human(d: std::time::Duration) -> humantime::FormattedDuration {
    humantime::format_duration(d)
}

/// The parameters of each scenario the configuration runs (S1, S2, RW mix, semaphore), one
/// line each, as the report's header lists them.
fn scenario_lines(c: &BenchConfig) -> String {
    let mut out = String::new();
    if c.scenarios.uncontended() {
        let _ = writeln!(
            out,
            "- S1 uncontended: one client, {} × ({} + release) after {} warm-up cycles, ttl {}; \
             latency = one cycle.",
            c.cycles,
            c.s1_call.as_str(),
            c.warmup_cycles,
            human(c.ttl)
        );
    }
    if c.scenarios.contended() {
        let _ = writeln!(
            out,
            "- S2 contended: {} clients on one name, hold {}, measured {} after {} warm-up, \
             ttl {}, acquire wait bound {}; latency = handoff to another client (holder about \
             to call release → next holder's acquire returns).",
            c.clients,
            human(c.hold),
            human(c.duration),
            human(c.s2_warmup),
            human(c.ttl),
            human(c.acquire_wait)
        );
    }
    if c.scenarios.rw_mix() {
        let _ = writeln!(
            out,
            "- RW mix: {} clients on one name, each acquisition exclusive with probability {} \
             (else shared), hold {}, measured {} after {} warm-up; latency = acquire call to \
             return; gauge: never two writers, never a writer with a reader.",
            c.mixed_clients,
            c.write_share,
            human(c.hold),
            human(c.duration),
            human(c.s2_warmup)
        );
    }
    if c.scenarios.semaphore() {
        let _ = writeln!(
            out,
            "- Semaphore: {} clients on one semaphore of {} permits, hold {}, measured {} \
             after {} warm-up; latency = acquire call to return; gauge: never more than {} \
             holders. Just before it, {} mutexes side by side: the same clients split among \
             as many names, each S2's loop, same hold, warm-up and duration.",
            c.mixed_clients,
            c.permits,
            human(c.hold),
            human(c.duration),
            human(c.s2_warmup),
            c.permits,
            c.side_by_side_names()
        );
    }
    out
}

/// A violations cell: `0`, or the count in bold with VIOLATED.
fn violations_cell(violations: u64) -> String {
    if violations > 0 {
        format!("**{violations} VIOLATED**")
    } else {
        "0".to_owned()
    }
}
