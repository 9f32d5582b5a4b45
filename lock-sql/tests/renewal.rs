//! Batched renewal on each database: a client holding K locks renews them in about
//! ceil(K / max_batch) statements per renewal interval, counted by the server (PostgreSQL
//! `pg_stat_database.xact_commit`, MariaDB `Questions`; SQLite, which has no server, by the
//! statements sqlx runs on the lock table), next to the idle floor of the same run (the cost
//! without batching, one statement per lock, is measured by `distlock bench --scenario hold`).
//! A lock removed behind its holder is lost alone. On PostgreSQL and MariaDB the same for
//! shared holds and permits (a function or procedure call per batch); SQLite renews those one
//! by one.

use std::time::Duration;

use async_trait::async_trait;
use distlock_core::{
    AcquireOptions, ClientConfig, DistributedLock, LockBackend, LockClient, LockGuard, LockKind,
    LossReason,
};
use distlock_sql::SqlBackend;
use futures::future::join_all;

mod common;

use common::unique;

/// The lease length of the measured locks: renewed every second.
const TTL: Duration = Duration::from_secs(3);
const INTERVAL: Duration = Duration::from_secs(1);
/// Renewal intervals counted per measurement.
const INTERVALS: u64 = 6;

/// A count of the database's requests that only grows.
#[async_trait]
trait Counter: Send + Sync {
    async fn read(&self) -> u64;
}

/// `names` acquired by `client` in waves of 50: quick, and spread over less than a renewal
/// interval.
async fn acquire_in_waves<B: LockBackend>(
    client: &LockClient<B>,
    names: &[String],
    opts: &AcquireOptions,
) -> Vec<LockGuard> {
    let mut guards = Vec::with_capacity(names.len());
    for wave in names.chunks(50) {
        let taken = join_all(wave.iter().map(|name| client.acquire(name, opts))).await;
        guards.extend(taken.into_iter().map(|g| g.expect("acquire")));
    }
    guards
}

/// Windows of [`INTERVALS`] renewal intervals measured at most, per [`hold`].
const WINDOWS: usize = 3;

/// `k` locks of `kind` held by `client` for windows of [`INTERVALS`] renewal intervals (after their
/// schedules aligned), until a window's count `fits` or [`WINDOWS`] were measured: the
/// smallest count `counter` saw in a window, and how many locks were lost. The counters
/// count the whole server, whose own background can land in any window: under the load of
/// other test lanes, one PostgreSQL window counted 80 commits where 12 renewals and 2 of
/// background were due, and autovacuum had processed that test's table in it. A broken
/// batching (one statement per lock) fails every window by a factor of hundreds.
async fn hold<B: LockBackend>(
    client: &LockClient<B>,
    (prefix, kind): (&str, LockKind),
    k: usize,
    counter: &dyn Counter,
    fits: impl Fn(u64) -> bool,
) -> (u64, usize) {
    let opts = AcquireOptions::default().with_ttl(TTL).with_kind(kind);
    let names: Vec<String> = (0..k).map(|i| format!("{prefix}-{i}")).collect();
    let guards = acquire_in_waves(client, &names, &opts).await;
    // Two rounds align the schedules (see lock-core's watchdog); one more settles.
    tokio::time::sleep(3 * INTERVAL).await;
    let mut least = u64::MAX;
    for window in 1..=WINDOWS {
        let before = counter.read().await;
        tokio::time::sleep(INTERVAL * u32::try_from(INTERVALS).unwrap_or(1)).await;
        let counted = counter.read().await.saturating_sub(before);
        least = least.min(counted);
        if fits(counted) {
            break;
        }
        eprintln!("{prefix}: window {window} of {WINDOWS} counted {counted}");
    }
    let lost = guards.iter().filter(|g| g.is_lost()).count();
    if lost > 0 {
        let mut reasons: Vec<_> = guards.iter().filter_map(LockGuard::loss_reason).collect();
        reasons.dedup();
        eprintln!("{prefix}: {lost} of {k} lost: {reasons:?}");
    }
    join_all(guards.into_iter().map(LockGuard::release)).await;
    (least, lost)
}

/// One measurement at a time per database: each counts the requests of the whole server
/// (SQLite: the statements on its own table), and the thousands of renewals of one would be
/// counted by another of the same server. Each database's measurements are one test, so that
/// they do not hold test threads while they wait here, and the databases' tests run at once
/// (one after the other, the binary took 185 s of a CI run's 1,091 s of tests).
static ALONE: [tokio::sync::Mutex<()>; 3] = [
    tokio::sync::Mutex::const_new(()),
    tokio::sync::Mutex::const_new(()),
    tokio::sync::Mutex::const_new(()),
];

/// The [`ALONE`] lock of the database of `url`.
fn alone(url: &str) -> &'static tokio::sync::Mutex<()> {
    let scheme = url.split_once(':').map_or(url, |(scheme, _)| scheme);
    &ALONE[match scheme {
        "postgres" | "postgresql" => 0,
        "mysql" | "mariadb" => 1,
        _ => 2,
    }]
}

/// The idle floor: the requests `counter` sees in as long as [`hold`] counts.
async fn floor(counter: &dyn Counter) -> u64 {
    let before = counter.read().await;
    tokio::time::sleep(INTERVAL * u32::try_from(INTERVALS).unwrap_or(1)).await;
    counter.read().await.saturating_sub(before)
}

/// K locks of `kind` held on the database of `url` (whose lock table, `table`, is dropped at the end),
/// between two idle floors: asserts that batching costs about ceil(K / max_batch) requests per
/// interval (and at least that many: the renewals were counted), and that no lock is lost.
/// K is at least twice the batch size: with a single batch per interval the renewals hide in
/// the server's idle background, which varies by more than that (PostgreSQL, 2026-11-26:
/// floors of 203 and 13 around a window that counted 12).
async fn batched(
    url: &str,
    (table, kind): (&str, LockKind),
    max_batch: u64,
    counter: &dyn Counter,
    label: &str,
) {
    let _alone = alone(url).lock().await;
    let config = ClientConfig::default().with_operation_timeout(Duration::from_secs(5));
    let backend = SqlBackend::connect(distlock_sql::SqlConfig::from_url(url).expect("url"))
        .await
        .expect("connect");
    let pool = backend.pool();
    let client = LockClient::with_config(backend, config).expect("client");
    let k = usize::try_from(max_batch * 2)
        .unwrap_or(usize::MAX)
        .max(1000);
    let idle = floor(counter).await;
    // Per interval: ceil(K / max_batch) batches, an extra one or two where the schedules
    // have not quite merged, and the server's idle background (`floor`, plus a little).
    let expected = u64::try_from(k).unwrap_or(u64::MAX).div_ceil(max_batch);
    let most = |floor: u64| (expected + 2) * INTERVALS + floor + 2 * INTERVALS;
    let prefix = unique("batch");
    let (batch, lost) = hold(&client, (&prefix, kind), k, counter, |n| n <= most(idle)).await;
    let idle2 = floor(counter).await;
    let per = |n: u64| n as f64 / INTERVALS as f64;
    eprintln!(
        "{label} {kind:?} K={k}: requests per renewal interval: floor {:.1} / {:.1}, \
         batched {:.1} ({lost} lost)",
        per(idle),
        per(idle2),
        per(batch)
    );
    assert_eq!(lost, 0, "{label}: locks lost with batching");
    assert!(
        batch <= most(idle.max(idle2)),
        "{label} K={k}: {batch} requests in {INTERVALS} intervals, expected about {} \
         (floor {idle}/{idle2})",
        expected * INTERVALS
    );
    // The renewals alone: the background may be lower in the window than in either floor.
    assert!(
        batch >= expected * (INTERVALS - 1),
        "{label} K={k}: only {batch} requests in {INTERVALS} intervals: the renewals were \
         not counted (floor {idle}/{idle2})"
    );
    if kind == LockKind::Exclusive {
        common::exec(&pool, format!("DROP TABLE {table}")).await;
    }
}

/// [`batched`] and [`one_forced_release_is_lost_alone`] for shared holds, then permits of 3,
/// on lock table `table` of the database of `url` (left for the caller to drop, with the
/// routines).
#[cfg(any(feature = "postgres", feature = "mysql"))]
async fn batched_holds(url: &str, table: &str, max_batch: u64, counter: &dyn Counter, label: &str) {
    let url = format!("{url}&table={table}");
    for kind in [LockKind::Shared, LockKind::Permit { permits: 3 }] {
        batched(&url, (table, kind), max_batch, counter, label).await;
        one_forced_release_is_lost_alone(&url, kind).await;
    }
}

/// One of 50 locks freed behind its holder (an operator's forced release) is lost with
/// `RenewalRejected`; the other 49 go on renewing in their batch. Locks of `kind`. Taken [`ALONE`]: its few
/// hundred statements, counted by a batching measurement running meanwhile, failed that
/// measurement once (PostgreSQL: 614 commits in a window that expected about 12).
async fn one_forced_release_is_lost_alone(url: &str, kind: LockKind) {
    let _alone = alone(url).lock().await;
    let client = common::client_with(url, Duration::from_secs(5)).await;
    let prefix = unique("forced");
    let opts = AcquireOptions::default()
        .with_ttl(Duration::from_millis(1500))
        .with_kind(kind);
    let names: Vec<String> = (0..50).map(|i| format!("{prefix}-{i}")).collect();
    let guards: Vec<LockGuard> = join_all(names.iter().map(|name| client.acquire(name, &opts)))
        .await
        .into_iter()
        .map(|g| g.expect("acquire"))
        .collect();
    // Let a batched renewal or two pass first.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(
        client
            .backend_ref()
            .force_release(&format!("{prefix}-17"))
            .await
            .expect("force release")
    );
    let reason = tokio::time::timeout(Duration::from_secs(3), guards[17].lost())
        .await
        .expect("the freed lock is reported lost");
    assert_eq!(reason, LossReason::RenewalRejected);
    // Two more renewal intervals: the others are still held, on the server too.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    for (i, guard) in guards.iter().enumerate() {
        assert_eq!(guard.is_lost(), i == 17, "guard {i}");
        if i != 17 {
            let info = client
                .inspect(guard.name().as_str())
                .await
                .expect("inspect")
                .expect("still held");
            assert_eq!(info.owner, guard.owner(), "guard {i}");
        }
    }
    for guard in guards.into_iter().filter(|g| !g.is_lost()) {
        guard.release().await.expect("release");
    }
}

#[cfg(feature = "postgres")]
mod postgres {
    use super::*;

    fn url() -> Option<String> {
        conformance_tests::server_var("postgres", "DISTLOCK_TEST_POSTGRES_URL")
    }

    /// Transactions committed in the database (every autocommit statement is one; the read
    /// itself is one more). Statistics reach the shared counters at most once a second per
    /// connection, so a measurement spans several intervals.
    struct Commits(sqlx::PgPool);

    #[async_trait]
    impl Counter for Commits {
        async fn read(&self) -> u64 {
            let n: i64 = sqlx::query_scalar(
                "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()",
            )
            .fetch_one(&self.0)
            .await
            .expect("read pg_stat_database");
            u64::try_from(n).unwrap_or(0)
        }
    }

    /// Exclusive locks, then shared holds and permits: 2,048 of each (one per name) renewed
    /// by a statement (holds: a function call) per batch of 1,024, not one per lock; one
    /// forced release in a batch is lost alone. One test, one measurement after the other
    /// (each counts the whole server's commits).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn renewals_are_batched_and_a_forced_release_is_lost_alone() {
        let Some(url) = url() else { return };
        let admin = sqlx::PgPool::connect(&url).await.expect("admin");
        let table = unique("renewal");
        batched(
            &format!("{url}&table={table}"),
            (&table, LockKind::Exclusive),
            1024,
            &Commits(admin.clone()),
            "postgres",
        )
        .await;
        one_forced_release_is_lost_alone(&url, LockKind::Exclusive).await;
        let table = unique("hold_renewal");
        batched_holds(&url, &table, 1024, &Commits(admin.clone()), "postgres").await;
        let pool = distlock_sql::SqlPool::Postgres(admin);
        for (what, last) in [
            ("join", "bigint, bigint, integer"),
            ("renew", "bigint"),
            ("release", "boolean, integer, integer"),
        ] {
            let f = format!("{table}_dl_{what}_v11(text, text, text, bigint, {last})");
            common::exec(&pool, format!("DROP FUNCTION {f}")).await;
        }
        let f = format!("{table}_dl_renew_many_v11(text[], text[], text[], bigint[], bigint[])");
        common::exec(&pool, format!("DROP FUNCTION {f}")).await;
        let f = format!("{table}_dl_hand_read_v11(text, text, bigint)");
        common::exec(&pool, format!("DROP FUNCTION {f}")).await;
        let tables = format!("{table}_holders, {table}_queue, {table}");
        common::exec(&pool, format!("DROP TABLE {tables}")).await;
        common::exec(&pool, format!("DROP SEQUENCE {table}_dl_reads")).await;
    }

    /// A lock table with history: 50,000 expired leases, analyzed, so that its statistics
    /// say no lease is live. 4,096 locks taken on it with a 2 s ttl (4 batches, renewed every
    /// 667 ms) all stay held for 3 ttls. When the renewal's lease check was estimated from
    /// those statistics, each batch compared every live row with every name of the batch
    /// (about 1 s per batch with 4,096 held; 2.5 s with 10,000), and the locks were lost.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_table_with_history_keeps_thousands_of_locks() {
        const K: usize = 4096;
        const TTL: Duration = Duration::from_secs(2);
        let Some(url) = url() else { return };
        let _alone = alone(&url).lock().await;
        let table = unique("history");
        let client = common::client_with(&format!("{url}&table={table}"), TTL).await;
        let pool = client.backend_ref().pool();
        common::exec(
            &pool,
            format!(
                "INSERT INTO {table} (name, owner, version, expires_at) SELECT 'old-' || g, \
                 NULL, 1, now() - interval '1 hour' FROM generate_series(1, 50000) g"
            ),
        )
        .await;
        common::exec(&pool, format!("ANALYZE {table}")).await;
        let prefix = unique("history");
        let opts = AcquireOptions::default().with_ttl(TTL);
        let names: Vec<String> = (0..K).map(|i| format!("{prefix}-{i}")).collect();
        let guards = acquire_in_waves(&client, &names, &opts).await;
        tokio::time::sleep(3 * TTL).await;
        let lost: Vec<LossReason> = guards.iter().filter_map(LockGuard::loss_reason).collect();
        assert!(
            lost.is_empty(),
            "{} of {K} locks lost on a table with history ({:?} first)",
            lost.len(),
            lost.first()
        );
        join_all(guards.into_iter().map(LockGuard::release)).await;
        common::exec(&pool, format!("DROP TABLE {table}")).await;
    }
}

#[cfg(feature = "mysql")]
mod mysql {
    use super::*;

    fn url() -> Option<String> {
        conformance_tests::server_var("mysql", "DISTLOCK_TEST_MYSQL_URL")
    }

    /// The server's `Questions` (statements clients sent, the read itself included).
    struct Questions(sqlx::MySqlPool);

    #[async_trait]
    impl Counter for Questions {
        async fn read(&self) -> u64 {
            let (_, value): (String, String) =
                sqlx::query_as("SHOW GLOBAL STATUS LIKE 'Questions'")
                    .fetch_one(&self.0)
                    .await
                    .expect("read Questions");
            value.parse().unwrap_or(0)
        }
    }

    /// Exclusive locks, then shared holds and permits: 1,024 of each (one per name) renewed
    /// by a statement (holds: a procedure call, which `Questions` counts once) per batch of
    /// 512, not one per lock; one forced release in a batch is lost alone. One test, one
    /// measurement after the other (each counts the whole server's statements).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn renewals_are_batched_and_a_forced_release_is_lost_alone() {
        let Some(url) = url() else { return };
        let admin = sqlx::MySqlPool::connect(&url).await.expect("admin");
        let table = unique("renewal");
        batched(
            &format!("{url}&table={table}"),
            (&table, LockKind::Exclusive),
            512,
            &Questions(admin.clone()),
            "mysql",
        )
        .await;
        one_forced_release_is_lost_alone(&url, LockKind::Exclusive).await;
        let table = unique("hold_renewal");
        batched_holds(&url, &table, 512, &Questions(admin.clone()), "mysql").await;
        let pool = distlock_sql::SqlPool::MySql(admin);
        for what in ["join_v5", "renew_v1", "release_v7", "renew_many_v1"] {
            common::exec(&pool, format!("DROP PROCEDURE {table}_dl_{what}")).await;
        }
        let tables = format!("{table}_holders, {table}_queue, {table}");
        common::exec(&pool, format!("DROP TABLE {tables}")).await;
    }
}

#[cfg(feature = "sqlite")]
mod sqlite {
    use super::*;

    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};
    use tracing::field::{Field, Visit};
    use tracing::span::{Attributes, Id, Record};
    use tracing::{Event, Metadata, Subscriber};

    /// Counts sqlx's per-statement events (target `sqlx::query`) whose SQL names `table`:
    /// SQLite has no server to count requests, the statements it ran are the measure.
    struct Statements {
        table: OnceLock<String>,
        count: AtomicU64,
    }

    struct Sql<'a>(&'a str, bool);

    impl Visit for Sql<'_> {
        fn record_str(&mut self, _field: &Field, value: &str) {
            self.1 |= value.contains(self.0);
        }

        fn record_debug(&mut self, _field: &Field, value: &dyn std::fmt::Debug) {
            self.1 |= format!("{value:?}").contains(self.0);
        }
    }

    /// The subscriber over the counts.
    struct Shim(&'static Statements);

    impl Subscriber for Shim {
        fn enabled(&self, metadata: &Metadata<'_>) -> bool {
            metadata.target() == "sqlx::query"
        }

        fn new_span(&self, _span: &Attributes<'_>) -> Id {
            Id::from_u64(1)
        }

        fn record(&self, _span: &Id, _values: &Record<'_>) {}

        fn record_follows_from(&self, _span: &Id, _follows: &Id) {}

        fn event(&self, event: &Event<'_>) {
            if let Some(table) = self.0.table.get() {
                let mut sql = Sql(table, false);
                event.record(&mut sql);
                if sql.1 {
                    self.0.count.fetch_add(1, Ordering::Relaxed);
                }
            }
        }

        fn enter(&self, _span: &Id) {}

        fn exit(&self, _span: &Id) {}
    }

    struct Counted(&'static Statements);

    #[async_trait]
    impl Counter for Counted {
        async fn read(&self) -> u64 {
            self.0.count.load(Ordering::Relaxed)
        }
    }

    /// Exclusive locks renewed by a statement per batch of 512; one forced release in a
    /// batch is lost alone (SQLite renews shared holds and permits one by one).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn renewals_are_batched_and_a_forced_release_is_lost_alone() {
        static STATEMENTS: OnceLock<&'static Statements> = OnceLock::new();
        let statements = *STATEMENTS.get_or_init(|| {
            let s: &'static Statements = Box::leak(Box::new(Statements {
                table: OnceLock::new(),
                count: AtomicU64::new(0),
            }));
            let dispatch = tracing::Dispatch::new(Shim(s));
            tracing::dispatcher::set_global_default(dispatch).expect("no other subscriber");
            s
        });
        let dir = tempfile::tempdir().expect("tempdir");
        let table = unique("renewal");
        statements.table.set(table.clone()).expect("one table");
        let url = format!(
            "sqlite://{}?table={table}&pool_size=4",
            dir.path().join("renewal.db").display()
        );
        batched(
            &url,
            (&table, LockKind::Exclusive),
            512,
            &Counted(statements),
            "sqlite",
        )
        .await;
        let url = format!("sqlite://{}", dir.path().join("forced.db").display());
        one_forced_release_is_lost_alone(&url, LockKind::Exclusive).await;
    }
}
