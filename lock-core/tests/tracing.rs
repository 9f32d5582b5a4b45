//! The tracing table of `distlock_core::telemetry` against what the core emits: every span of a
//! scripted scenario is in the table with exactly its fields and level, and a healthy run
//! logs nothing at INFO or above; only a real loss and an operator's force-release warn.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock_core::memory::{MemoryBackend, MemoryStore};
use distlock_core::{AcquireOptions, DistributedLock, Error, LockClient, LossReason, Renewal};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

/// What was emitted: spans by name (their level and fields), events by level.
#[derive(Default)]
struct Seen {
    spans: BTreeMap<String, (Level, BTreeSet<String>)>,
    events: Vec<(Level, String, String)>,
}

#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Seen>>);

struct Message(String);

impl Visit for Message {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

impl<S: Subscriber> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, _id: &Id, _ctx: Context<'_, S>) {
        let meta = attrs.metadata();
        let fields = meta.fields().iter().map(|f| f.name().to_owned()).collect();
        let mut seen = self.0.lock().unwrap();
        seen.spans
            .insert(meta.name().to_owned(), (*meta.level(), fields));
    }

    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let mut message = Message(String::new());
        event.record(&mut message);
        let meta = event.metadata();
        let mut seen = self.0.lock().unwrap();
        seen.events
            .push((*meta.level(), meta.target().to_owned(), message.0));
    }
}

/// The span rows of the table in `telemetry.rs`: name, level, fields.
fn documented() -> BTreeMap<String, (Level, BTreeSet<String>)> {
    include_str!("../src/telemetry.rs")
        .lines()
        .filter_map(|line| line.strip_prefix("//! | `distlock."))
        .map(|row| {
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            let name = format!("distlock.{}", cells[0].trim_end_matches('`'));
            let level = cells[1].parse().expect("a level");
            let fields = cells[2]
                .split(',')
                .map(|f| f.trim().trim_matches('`').to_owned())
                .filter(|f| !f.is_empty())
                .collect();
            (name, (level, fields))
        })
        .collect()
}

#[test]
fn spans_match_the_table_and_a_healthy_run_is_quiet_at_info() {
    let capture = Capture::default();
    let subscriber = tracing_subscriber::registry().with(capture.clone());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    tracing::subscriber::with_default(subscriber, || {
        runtime.block_on(async {
            let store = MemoryStore::new();
            let (a, b) = (
                LockClient::new(MemoryBackend::new(store.clone())),
                LockClient::new(MemoryBackend::new(store)),
            );
            let opts = AcquireOptions::default()
                .with_ttl(Duration::from_millis(300))
                .with_renewal(Renewal::auto().every(Duration::from_millis(50)));
            // Healthy: acquire, contend, time out, renew, release, campaign, abandon.
            let guard = a.acquire("t", &opts).await?;
            assert!(b.try_acquire("t", &opts).await?.is_none());
            let short = opts.clone().with_wait(Duration::from_millis(60));
            assert!(matches!(
                b.acquire("t", &short).await,
                Err(Error::Timeout { .. })
            ));
            guard.renew().await?;
            guard.release().await?;
            a.campaign("e", "node-1", &opts).await?.release().await?;
            let abandoned = a.acquire("abandoned", &opts).await?;
            let expired = abandoned.lost();
            abandoned.abandon();
            assert_eq!(expired.await, LossReason::LeaseExpired);
            {
                let seen = capture.0.lock().unwrap();
                let loud: Vec<_> = seen.events.iter().filter(|e| e.0 <= Level::INFO).collect();
                assert!(loud.is_empty(), "a healthy run logged {loud:?}");
            }
            // Unhealthy: an operator breaks the lock, the holder loses it.
            let broken = a.acquire("broken", &opts).await?;
            assert!(b.force_release("broken").await?);
            assert_eq!(broken.lost().await, LossReason::RenewalRejected);
            drop(broken);
            // ... or releases one hold by its owner and token.
            let one = a.acquire("one", &opts).await?;
            assert!(b.release_hold("one", one.owner(), one.token()).await?);
            assert_eq!(one.lost().await, LossReason::RenewalRejected);
            drop(one);
            Ok::<_, Error>(())
        })
    })
    .unwrap();
    let seen = capture.0.lock().unwrap();
    let table = documented();
    for (name, emitted) in &seen.spans {
        assert_eq!(
            table.get(name),
            Some(emitted),
            "span {name} and its table row"
        );
    }
    // Every documented span was seen, except the backend-specific loss signal.
    let unseen: Vec<_> = table
        .keys()
        .filter(|n| !seen.spans.contains_key(*n))
        .collect();
    assert_eq!(unseen, ["distlock.loss_signal"]);
    let loud: Vec<(Level, &str)> = seen
        .events
        .iter()
        .filter(|e| e.0 <= Level::INFO)
        .map(|e| (e.0, e.2.as_str()))
        .collect();
    assert_eq!(
        loud,
        [
            (Level::WARN, "force-released a lock"),
            (Level::WARN, "lock lost"),
            (Level::WARN, "released a hold by its owner and token"),
            (Level::WARN, "lock lost")
        ]
    );
    let waiting = seen
        .events
        .iter()
        .filter(|e| e.1 == distlock_core::WAITING_TARGET);
    assert_eq!(
        waiting.count(),
        1,
        "one waiting event for the timed-out acquire"
    );
}
