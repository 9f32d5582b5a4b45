//! Issue 42, store growth under churn: the rows of names no longer used are swept once free
//! for `forget_after`, the tokens of a swept name still grow, and a held lock's row stays.
//! Before the sweep, every name ever acquired kept its row for good (100,000 names: 100,000
//! rows).

use std::time::Duration;

use conformance_tests::churn::{churn, footprint_until};
use distlock_core::{AcquireOptions, DistributedLock};
use distlock_sql::SqlBackend;

#[allow(dead_code, reason = "each test file uses a part of the helpers")]
mod common;

use common::{client_with, exec, unique};

/// Names churned per test.
const NAMES: usize = 200;

/// `url` with `options` (`a=b&c=d`) added to its query.
fn with_options(url: &str, options: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{options}")
}

fn opts() -> AcquireOptions {
    conformance_tests::churn::options()
}

/// A client of `url` on a table of its own whose free rows are swept at once
/// (`forget_after=1ms`: every second), and that table.
async fn client(url: &str) -> (distlock_core::LockClient<SqlBackend>, String) {
    let table = unique("forget");
    let url = with_options(url, &format!("table={table}&forget_after=1ms"));
    (client_with(&url, Duration::from_secs(5)).await, table)
}

async fn drop_tables(client: &distlock_core::LockClient<SqlBackend>, table: &str) {
    let pool = client.backend_ref().pool();
    exec(&pool, format!("DROP TABLE IF EXISTS {table}")).await;
    exec(&pool, format!("DROP TABLE IF EXISTS {table}_holders")).await;
}

/// NAMES exclusive names, a shared hold and a permit acquired and released once each leave
/// no row behind one sweep later (before: NAMES + 2 lock rows for good).
async fn churned_names_leave_no_rows(url: &str) {
    let (client, table) = client(url).await;
    let prefix = format!("{table}/");
    let names = churn(&client, &prefix, NAMES, &opts()).await;
    let left = footprint_until(&client, &prefix, Duration::from_secs(10), |f| {
        f.objects() == 0
    })
    .await;
    assert_eq!(left.objects(), 0, "left behind by {names} names: {left}");
    // Only the table's one reserved row (the last sweep) is not a lock's.
    let all = client.footprint("").await.unwrap().unwrap();
    assert_eq!(all.count("lock rows"), 1, "{all}");
    drop_tables(&client, &table).await;
}

/// A swept name starts again at the database's clock: above its tokens before.
async fn a_swept_name_gets_a_higher_token(url: &str) {
    let (client, table) = client(url).await;
    let name = format!("{table}/again");
    let first = client.acquire(&name, &opts()).await.unwrap();
    let token = first.token();
    first.release().await.unwrap();
    let left = footprint_until(&client, &name, Duration::from_secs(10), |f| {
        f.objects() == 0
    })
    .await;
    assert_eq!(left.objects(), 0, "the row was not swept: {left}");
    let next = client.acquire(&name, &opts()).await.unwrap();
    assert!(
        next.token() > token,
        "token {} after the row was swept, {token} before",
        next.token()
    );
    next.release().await.unwrap();
    drop_tables(&client, &table).await;
}

/// A lock held (and renewed) across many sweeps keeps its row, and so does the name a
/// waiter waits for: the holder renews and releases, and the waiter gets a higher token.
async fn held_and_awaited_rows_stay(url: &str) {
    let (client, table) = client(url).await;
    let other_url = with_options(url, &format!("table={table}&forget_after=1ms"));
    let other = client_with(&other_url, Duration::from_secs(5)).await;
    let name = format!("{table}/held");
    let short = AcquireOptions::default()
        .with_ttl(Duration::from_millis(600))
        .with_wait(Duration::from_secs(10));
    let held = client.acquire(&name, &short).await.unwrap();
    let waiter = tokio::spawn({
        let name = name.clone();
        let short = short.clone();
        async move { other.acquire(&name, &short).await }
    });
    // Other names churn meanwhile, so that sweeps run; the held row must survive them.
    for i in 0..20 {
        let guard = client
            .acquire(&format!("{table}/churn{i}"), &opts())
            .await
            .unwrap();
        guard.release().await.unwrap();
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    assert!(!held.is_lost(), "the held lock was lost while sweeps ran");
    held.renew().await.unwrap();
    let token = held.token();
    held.release().await.unwrap();
    let next = waiter.await.unwrap().unwrap();
    assert!(next.token() > token, "{} after {token}", next.token());
    next.release().await.unwrap();
    drop_tables(&client, &table).await;
}

macro_rules! per_database {
    ($db:ident, $feature:literal, $url:expr) => {
        #[cfg(feature = $feature)]
        mod $db {
            #[tokio::test(flavor = "multi_thread")]
            async fn churned_names_leave_no_rows() {
                let Some(url) = $url else { return };
                super::churned_names_leave_no_rows(&url).await;
            }

            #[tokio::test(flavor = "multi_thread")]
            async fn a_swept_name_gets_a_higher_token() {
                let Some(url) = $url else { return };
                super::a_swept_name_gets_a_higher_token(&url).await;
            }

            #[tokio::test(flavor = "multi_thread")]
            async fn held_and_awaited_rows_stay() {
                let Some(url) = $url else { return };
                super::held_and_awaited_rows_stay(&url).await;
            }
        }
    };
}

per_database!(
    sqlite,
    "sqlite",
    Some(crate::common::SqliteUrl::new("distlock-forget-"))
);
per_database!(
    postgres,
    "postgres",
    conformance_tests::server_var("postgres", "DISTLOCK_TEST_POSTGRES_URL")
);
per_database!(
    mysql,
    "mysql",
    conformance_tests::server_var("mysql", "DISTLOCK_TEST_MYSQL_URL")
);
