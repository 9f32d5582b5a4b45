//! `lock-bench`: runs the distlock benchmark scenarios and prints a Markdown table (and
//! optionally JSON).
//!
//! It has the in-memory backend only; `distlock bench` offers every backend by URL through the
//! same [`distlock_bench::BenchArgs`] flags.

use std::process::ExitCode;

use clap::{Parser, ValueEnum};
use distlock_bench::{BenchArgs, Target};

/// Benchmark distlock backends: uncontended acquire+release (S1) and contended critical
/// sections (S2), next to each backend's raw floor.
#[derive(Debug, Parser)]
#[command(name = "lock-bench", version, about)]
struct Cli {
    /// Backend to measure.
    #[arg(long, value_enum, default_value = "memory")]
    backend: Backend,

    #[command(flatten)]
    bench: BenchArgs,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Backend {
    /// The in-process reference backend.
    Memory,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let targets = match cli.backend {
        Backend::Memory => vec![Target::memory()],
    };
    let config = cli.bench.config();
    let report = match distlock_bench::run(&targets, &config).await {
        Ok(report) => report,
        Err(err) => {
            eprintln!("lock-bench: {err}");
            return ExitCode::from(2);
        }
    };
    println!("{}", report.to_markdown());
    if let Some(path) = &cli.bench.json {
        let written = report
            .to_json()
            .map_err(|e| e.to_string())
            .and_then(|json| std::fs::write(path, json + "\n").map_err(|e| e.to_string()));
        if let Err(err) = written {
            eprintln!("lock-bench: cannot write {}: {err}", path.display());
            return ExitCode::from(2);
        }
    }
    if report.has_failures() {
        eprintln!(
            "lock-bench: some scenarios failed or saw exclusivity violations (see the table)"
        );
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
