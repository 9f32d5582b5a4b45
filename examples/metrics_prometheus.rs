//! distlock's metrics in the Prometheus text format: the `metrics-exporter-prometheus` recorder
//! is installed before connecting, a few scripted lock operations run (acquire, a refused
//! `try_acquire`, an `acquire` that times out, a waiter that takes over at the release), and
//! the example prints the rendered exposition and checks (not just claims) what it says.
//!
//! `cargo run -p distlock-examples --example metrics_prometheus` (embedded SQLite, no server),
//! or with `DISTLOCK_URL=redis://127.0.0.1:16379` and the `distlock` feature for that backend.
//! A service would serve `handle.render()` on its `/metrics` route (or enable the exporter's
//! `http-listener` feature); distlock itself depends on the `metrics` facade only.

use std::time::Duration;

use distlock::{AcquireOptions, Error, telemetry};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Histograms as Prometheus histograms (buckets, _sum, _count) rather than summaries.
    let buckets = [0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0];
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &buckets)?
        .install_recorder()?;

    // Clients register their metric handles when built: after the recorder.
    let url = distlock_examples::url_or_default("metrics_prometheus");
    let (a, b) = (
        distlock::connect(&url).await?,
        distlock::connect(&url).await?,
    );
    let backend = a.backend();
    let name = format!("metrics-example-{}", std::process::id());
    let opts = AcquireOptions::default()
        .with_ttl(Duration::from_secs(10))
        .with_wait(Duration::from_secs(10));

    let held = a.acquire(&name, &opts).await?;
    assert!(b.try_acquire(&name, &opts).await?.is_none());
    let short = opts.clone().with_wait(Duration::from_millis(200));
    let timed_out = b.acquire(&name, &short).await;
    assert!(matches!(timed_out, Err(Error::Timeout { .. })));
    let waiter = {
        let (b, name, opts) = (b.clone(), name.clone(), opts.clone());
        tokio::spawn(async move { b.acquire(&name, &opts).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    held.release().await?;
    waiter.await??.release().await?;

    let text = handle.render();
    println!("{text}");

    // The exposition says what happened.
    let label = format!("{{backend=\"{backend}\"}}");
    let expect = [
        format!("{}{label} 2", telemetry::ACQUISITIONS),
        format!("{}{label} 1", telemetry::TRY_ACQUIRE_REFUSALS),
        format!("{}{label} 1", telemetry::ACQUIRE_TIMEOUTS),
        format!(
            "{}{{backend=\"{backend}\",result=\"ok\"}} 2",
            telemetry::RELEASES
        ),
        format!("{}{label} 0", telemetry::HELD_GUARDS),
        format!("{}{label} 0", telemetry::WAITING_ACQUIRES),
        format!("{}_count{label} 2", telemetry::ACQUIRE_WAIT),
        format!("{}_count{label} 2", telemetry::HOLD),
        format!("{}_count{label} 1", telemetry::HANDOFF),
        format!("# TYPE {} histogram", telemetry::OPERATION_DURATION),
        format!(
            "# HELP {} Locks taken on the server",
            telemetry::ACQUISITIONS
        ),
    ];
    let missing: Vec<&String> = expect
        .iter()
        .filter(|line| !text.lines().any(|l| l.starts_with(line.as_str())))
        .collect();
    if !missing.is_empty() {
        return Err(format!("the exposition lacks {missing:?}").into());
    }
    println!("checked: the exposition shows every scripted operation");
    Ok(())
}
