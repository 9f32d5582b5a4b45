//! `distlock bench`: the shared lock-bench scenarios against one or more URLs.

use lock_bench::{BenchArgs, Target};

use crate::exit::{CONFIG, Failure, OTHER};

/// Flags of `distlock bench`.
#[derive(Debug, clap::Args)]
pub(crate) struct CliBenchArgs {
    /// A lock service URL to measure; repeat for a side-by-side comparison.
    #[arg(long = "url", required = true)]
    urls: Vec<String>,

    #[command(flatten)]
    bench: BenchArgs,
}

pub(crate) async fn bench(args: CliBenchArgs) -> Result<u8, Failure> {
    let mut targets = Vec::new();
    for url in &args.urls {
        // Fail fast on a bad URL before anything is measured.
        distlock::connect(url)
            .await
            .map_err(|err| Failure::from_lock(&err, format!("cannot use {url}")))?;
        let owned = url.clone();
        targets.push(Target::new(url.clone(), move || {
            let url = owned.clone();
            async move { distlock::connect(&url).await }
        }));
    }
    let config = args.bench.config();
    let report = lock_bench::run(&targets, &config)
        .await
        .map_err(|err| Failure::from_lock(&err, "benchmark"))?;
    println!("{}", report.to_markdown());
    if let Some(path) = &args.bench.json {
        let json = report
            .to_json()
            .map_err(|e| Failure::new(OTHER, format!("cannot encode results: {e}")))?;
        std::fs::write(path, json + "\n")
            .map_err(|e| Failure::new(CONFIG, format!("cannot write {}: {e}", path.display())))?;
    }
    if report.has_failures() {
        return Err(Failure::new(
            OTHER,
            "some scenarios failed or saw exclusivity violations (see the table)",
        ));
    }
    Ok(0)
}
