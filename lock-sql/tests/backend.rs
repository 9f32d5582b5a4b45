//! Backend-specific behaviour: the fenced-write helper on each database, clear errors for bad
//! URLs, missing databases and tables of the wrong shape, and `inspect`.

use std::time::Duration;

use distlock_core::{AcquireOptions, ClientConfig, DistributedLock, Error, LockClient, Renewal};
use distlock_sql::{FencedUpdate, SqlBackend, SqlPool};
use sqlx::AssertSqlSafe;

mod common;

use common::{exec, unique};

async fn client(url: &str) -> LockClient<SqlBackend> {
    common::client_with(url, Duration::from_secs(2)).await
}

/// `client` acquiring `name` in a task of its own.
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn waiting(
    client: &LockClient<SqlBackend>,
    name: &str,
    opts: &AcquireOptions,
) -> tokio::task::JoinHandle<distlock_core::Result<distlock_core::LockGuard>> {
    let (client, name, opts) = (client.clone(), name.to_owned(), opts.clone());
    tokio::spawn(async move { client.acquire(&name, &opts).await })
}

async fn balance(pool: &SqlPool, table: &str) -> (i64, i64) {
    let sql = format!("SELECT balance, fence FROM {table} WHERE id = 7");
    let row: Result<(i64, i64), sqlx::Error> = match pool {
        #[cfg(feature = "postgres")]
        SqlPool::Postgres(p) => sqlx::query_as(AssertSqlSafe(sql)).fetch_one(p).await,
        #[cfg(feature = "mysql")]
        SqlPool::MySql(p) => sqlx::query_as(AssertSqlSafe(sql)).fetch_one(p).await,
        #[cfg(feature = "sqlite")]
        SqlPool::Sqlite(p) => sqlx::query_as(AssertSqlSafe(sql)).fetch_one(p).await,
        #[allow(
            unreachable_patterns,
            reason = "reachable when a dialect's feature is off"
        )]
        _ => unreachable!("no other database is compiled in"),
    };
    row.unwrap_or_else(|e| panic!("read balance: {e}"))
}

/// No other client takes a lock while its holder's `valid_until` lies ahead, with no drift
/// margin but a clock slewing at NTP's most (500 ppm): the server's lease ends no earlier than
/// the ttl after the request was sent.
/// The other client polls as fast as it can, so that it takes the lock as soon as the server
/// lets it. (SQLite's clock has millisecond resolution: a lease computed from its reading
/// alone ended up to a millisecond early.)
async fn not_taken_before_valid_until(url: &str) {
    let mut config = ClientConfig::default().with_operation_timeout(Duration::from_secs(2));
    config.drift_factor = 0.0005;
    config.drift_fixed = Duration::ZERO;
    let a = common::client_of(url, config.clone()).await;
    let b = common::client_of(url, config).await;
    let opts = AcquireOptions::default()
        .with_ttl(Duration::from_millis(300))
        .with_renewal(Renewal::disabled());
    for round in 0..10 {
        let name = unique("valid-until");
        let held = a
            .try_acquire(&name, &opts)
            .await
            .expect("try")
            .expect("free");
        let valid_until = held.valid_until();
        held.abandon();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let taken = loop {
            if let Some(taken) = b.try_acquire(&name, &opts).await.expect("try") {
                break taken;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "round {round}: a lease of 300 ms still held after 5 s"
            );
        };
        let now = std::time::Instant::now();
        assert!(
            now >= valid_until,
            "round {round}: taken {:?} before the holder's valid_until",
            valid_until - now
        );
        taken.release().await.expect("release");
    }
}

/// A paused former holder's late write (lower token) is rejected; the current holder can
/// write several times.
async fn fenced_write_rejects_stale_token(url: &str) {
    let (a, b) = (client(url).await, client(url).await);
    let table = unique("accounts");
    let pool = a.backend_ref().pool();
    exec(
        &pool,
        format!(
            "CREATE TABLE {table} (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL, fence BIGINT)"
        ),
    )
    .await;
    exec(
        &pool,
        format!("INSERT INTO {table} (id, balance) VALUES (7, 100)"),
    )
    .await;
    let name = unique("fenced");
    let opts = AcquireOptions::default().with_ttl(Duration::from_secs(10));
    let stale = a.acquire(&name, &opts).await.expect("first holder");
    let stale_token = stale.token();
    // The first holder "pauses"; an operator breaks its lock and the next holder writes.
    assert!(
        a.backend_ref()
            .force_release(&name)
            .await
            .expect("force release")
    );
    let fresh = b.acquire(&name, &opts).await.expect("second holder");
    assert!(fresh.token() > stale_token);
    let write =
        |amount: i64| FencedUpdate::new(table.as_str(), "id", 7, "fence").set("balance", amount);
    let backend = b.backend_ref();
    assert!(
        backend
            .fenced_update(&write(150), fresh.token())
            .await
            .expect("fresh write")
    );
    assert!(
        backend
            .fenced_update(&write(160), fresh.token())
            .await
            .expect("second fresh write")
    );
    // The late write of the paused holder changes nothing.
    assert!(
        !backend
            .fenced_update(&write(999), stale_token)
            .await
            .expect("stale write")
    );
    assert_eq!(
        balance(&pool, &table).await,
        (160, fresh.token().get() as i64)
    );
    // A missing row is not written either, and bad identifiers are rejected before any SQL.
    let missing = FencedUpdate::new(table.as_str(), "id", 8, "fence").set("balance", 1);
    assert!(
        !backend
            .fenced_update(&missing, fresh.token())
            .await
            .expect("missing row")
    );
    let bad = FencedUpdate::new("accounts; DROP TABLE x", "id", 7, "fence");
    assert!(matches!(
        backend.fenced_update(&bad, fresh.token()).await,
        Err(Error::InvalidOptions(_))
    ));
    assert!(stale.release().await.is_err(), "the broken lock released");
    fresh.release().await.expect("release");
    exec(&pool, format!("DROP TABLE {table}")).await;
}

/// `inspect` shows the holder, its token and remaining lease, and nothing once released.
async fn inspect_shows_holder(url: &str) {
    let c = client(url).await;
    let name = unique("inspect");
    let guard = c
        .acquire(
            &name,
            &AcquireOptions::default().with_ttl(Duration::from_secs(10)),
        )
        .await
        .expect("acquire");
    let info = c.inspect(&name).await.expect("inspect").expect("held");
    assert_eq!(info.owner, guard.owner());
    assert_eq!(info.token, Some(guard.token()));
    let remaining = info.remaining.expect("remaining");
    assert!(remaining > Duration::from_secs(5) && remaining <= Duration::from_secs(10));
    guard.release().await.expect("release");
    assert_eq!(c.inspect(&name).await.expect("inspect"), None);
}

/// A table without the lock columns, or a missing one with `create_table=false`, is reported
/// at connect with the table's name.
async fn wrong_shape_is_reported(url: &str) {
    let admin = client(url).await;
    let table = unique("not_locks");
    let pool = admin.backend_ref().pool();
    exec(
        &pool,
        format!("CREATE TABLE {table} (name VARCHAR(64) PRIMARY KEY, x BIGINT)"),
    )
    .await;
    let sep = if url.contains('?') { '&' } else { '?' };
    for (url, what) in [
        (format!("{url}{sep}table={table}"), "wrong shape"),
        (
            format!("{url}{sep}table={table}_missing&create_table=false"),
            "missing table",
        ),
    ] {
        match distlock_sql::connect(&url, ClientConfig::default()).await {
            Err(Error::Backend { message, .. }) => {
                assert!(message.contains(&table), "{what}: {message}");
            }
            other => panic!("{what}: expected a backend error, got {other:?}"),
        }
    }
    exec(&pool, format!("DROP TABLE {table}")).await;
}

/// A lock table and a holders table of an earlier version (no `data` column; `old` gives
/// their `CREATE TABLE` statements for a table name): with `create_table` on, the client adds
/// the columns and holds carry data, exclusive and shared; with it off, the tables stay as
/// they are, holds carry none (the capability is off, `with_data` refused as unsupported)
/// and locks of both kinds work as before.
async fn a_table_without_the_data_column(url: &str, old: impl Fn(&str) -> [String; 2]) {
    let admin = client(url).await;
    let pool = admin.backend_ref().pool();
    let sep = if url.contains('?') { '&' } else { '?' };
    let opts = || AcquireOptions::default().with_ttl(Duration::from_secs(5));
    for create in [true, false] {
        let table = unique("old_data");
        for statement in old(&table) {
            exec(&pool, statement).await;
        }
        let with = format!("{url}{sep}table={table}&create_table={create}");
        let c = client(&with).await;
        assert_eq!(
            c.capabilities().holder_data,
            create,
            "create_table={create}"
        );
        let (name, readers) = (unique("old"), unique("old_readers"));
        if create {
            let guard = c
                .acquire(&name, &opts().with_data("d1"))
                .await
                .expect("acquire with data");
            let info = c.inspect(&name).await.expect("inspect").expect("held");
            assert_eq!(info.data.as_deref(), Some("d1"));
            guard.release().await.expect("release");
            let reader = c
                .acquire(&readers, &opts().shared().with_data("r1"))
                .await
                .expect("shared with data");
            let info = c.inspect(&readers).await.expect("inspect").expect("held");
            assert_eq!((info.holders, info.data.as_deref()), (1, Some("r1")));
            reader.release().await.expect("release");
            // Migrated once: the next client finds the columns.
            let again = client(&with).await;
            assert!(again.capabilities().holder_data);
        } else {
            match c.acquire(&name, &opts().with_data("d1")).await {
                Err(Error::Unsupported(_)) => {}
                other => panic!("data without the column: {other:?}"),
            }
            let guard = c.acquire(&name, &opts()).await.expect("acquire");
            let info = c.inspect(&name).await.expect("inspect").expect("held");
            assert_eq!((info.owner.as_str(), info.data), (guard.owner(), None));
            guard.release().await.expect("release");
            let reader = c.acquire(&readers, &opts().shared()).await.expect("shared");
            let info = c.inspect(&readers).await.expect("inspect").expect("held");
            assert_eq!((info.holders, info.data), (1, None));
            reader.release().await.expect("release");
        }
        exec(&pool, format!("DROP TABLE {table}_holders")).await;
        exec(&pool, format!("DROP TABLE {table}")).await;
    }
}

/// A lock table of its own (a unique name from `prefix`) whose tables the returned admin
/// client made complete (the lock table and the routines' queue at connect, the holders on
/// its first shared hold), and a user that `make` made on it (see
/// [`a_user_of_existing_tables`]): the admin client, the table, the user and the URL that
/// connects as that user.
#[cfg(any(feature = "postgres", feature = "mysql"))]
async fn a_user_on_a_new_table(
    url: &str,
    prefix: &str,
    make: impl Fn(&str, &str, &str) -> Vec<String>,
) -> (LockClient<SqlBackend>, String, String, url::Url) {
    let table = unique(prefix);
    let sep = if url.contains('?') { '&' } else { '?' };
    let with = format!("{url}{sep}table={table}");
    let admin = client(&with).await;
    let shared = AcquireOptions::default()
        .with_ttl(Duration::from_secs(5))
        .shared();
    admin
        .acquire(&unique("setup"), &shared)
        .await
        .expect("the admin's first shared hold")
        .release()
        .await
        .expect("release");
    let pool = admin.backend_ref().pool();
    let (user, password) = (unique("dl_user"), unique("pw"));
    for statement in make(&user, &password, &table) {
        exec(&pool, statement).await;
    }
    let mut as_user = url::Url::parse(&with).expect("url");
    as_user.set_username(&user).expect("user");
    as_user.set_password(Some(&password)).expect("password");
    (admin, table, user, as_user)
}

/// A user connects with the default `create_table` to a lock table whose tables another user
/// made complete, and takes and releases every kind. `make` gives the statements that make
/// user `user` (password `password`) for lock table `table`, `remove` those that remove it
/// again: a user who may read and write those tables but not create any (a connect and a
/// first shared hold read the catalog before they set anything up), or a user with a schema
/// of its own (who must make and use tables of its own there: the other user's are not its).
#[cfg(any(feature = "postgres", feature = "mysql"))]
async fn a_user_of_existing_tables(
    url: &str,
    make: impl Fn(&str, &str, &str) -> Vec<String>,
    remove: impl Fn(&str) -> Vec<String>,
) {
    let (admin, table, user, as_user) = a_user_on_a_new_table(url, "no_create", make).await;
    let pool = admin.backend_ref().pool();
    let opts = || AcquireOptions::default().with_ttl(Duration::from_secs(5));
    let used = async {
        let c = distlock_sql::connect(as_user.as_str(), ClientConfig::default())
            .await
            .map_err(|e| format!("connect: {e}"))?;
        for (what, opts) in [
            ("exclusive", opts()),
            ("shared", opts().shared()),
            ("permit", opts().with_permits(2)),
        ] {
            let guard = c
                .acquire(&unique("user"), &opts)
                .await
                .map_err(|e| format!("{what}: {e}"))?;
            guard
                .release()
                .await
                .map_err(|e| format!("{what} release: {e}"))?;
        }
        // The routines are in use (a failure to set them up falls back to the transactions,
        // silently): a permit waiter gets a place in their queue, which only they keep.
        let (name, one) = (unique("queued"), opts().with_permits(1));
        let held = c.acquire(&name, &one).await.map_err(|e| e.to_string())?;
        let waiter = {
            let (c, name, one) = (client(as_user.as_str()).await, name.clone(), one.clone());
            tokio::spawn(async move { c.acquire(&name, &one).await })
        };
        let pool = c.backend_ref().pool();
        let look = format!("SELECT count(*) FROM {table}_queue WHERE name = ");
        let started = std::time::Instant::now();
        loop {
            let places: i64 = match &pool {
                #[cfg(feature = "postgres")]
                SqlPool::Postgres(p) => {
                    sqlx::query_scalar(AssertSqlSafe(format!("{look}$1")))
                        .bind(&name)
                        .fetch_one(p)
                        .await
                }
                #[cfg(feature = "mysql")]
                SqlPool::MySql(p) => {
                    sqlx::query_scalar(AssertSqlSafe(format!("{look}?")))
                        .bind(&name)
                        .fetch_one(p)
                        .await
                }
                #[allow(unreachable_patterns, reason = "SQLite may be compiled in")]
                _ => unreachable!("PostgreSQL and MySQL only"),
            }
            .map_err(|e| format!("reading the queue: {e}"))?;
            if places > 0 {
                break;
            }
            if started.elapsed() > Duration::from_secs(5) {
                return Err("the waiter has no place in the routines' queue".to_owned());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        held.release().await.map_err(|e| e.to_string())?;
        common::granted(waiter)
            .await
            .release()
            .await
            .map_err(|e| e.to_string())?;
        Ok::<_, String>(())
    }
    .await;
    for statement in remove(&user) {
        exec(&pool, statement).await;
    }
    for t in ["_queue", "_holders", ""] {
        exec(&pool, format!("DROP TABLE IF EXISTS {table}{t}")).await;
    }
    used.expect("the user's locks");
}

/// The holder data ends with its hold, however the hold ends: the next hold of the name
/// shows none after an expiry, a forced release, a release by owner and token, a release
/// with a waiter queued (a hand-over on PostgreSQL and MySQL), and for shared holds after a
/// forced release and an expiry.
async fn the_data_ends_with_the_hold(url: &str) {
    let (a, b) = (client(url).await, client(url).await);
    let shown = async |name: &str| {
        let info = b.inspect(name).await.expect("inspect").expect("held");
        (info.owner, info.data)
    };
    let opts = || AcquireOptions::default().with_ttl(Duration::from_secs(1));
    let once = || opts().with_renewal(Renewal::disabled());

    // The same data again is no refusal (MySQL counts the rows found, not those changed).
    let name = unique("data_same");
    let guard = a
        .acquire(&name, &opts().with_data("same"))
        .await
        .expect("a");
    guard
        .set_data(Some("same"))
        .await
        .expect("the same data again");
    // The longest data, in characters of two bytes, comes back as it was.
    let longest = "ä".repeat(distlock_core::MAX_HOLDER_DATA / 2);
    guard
        .set_data(Some(&longest))
        .await
        .expect("the longest data");
    assert_eq!(shown(&name).await.1.as_deref(), Some(longest.as_str()));
    guard.release().await.expect("release");

    let name = unique("data_expired");
    let old = a.acquire(&name, &once().with_data("old")).await.expect("a");
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let next = b.acquire(&name, &opts()).await.expect("b after the expiry");
    assert_eq!(
        shown(&name).await,
        (next.owner().to_owned(), None),
        "expired"
    );
    drop(old);
    next.release().await.expect("release");

    let name = unique("data_forced");
    let old = a.acquire(&name, &opts().with_data("old")).await.expect("a");
    assert!(b.force_release(&name).await.expect("force"));
    assert_eq!(b.inspect(&name).await.expect("inspect"), None);
    let next = b
        .acquire(&name, &opts())
        .await
        .expect("b after the forced release");
    assert_eq!(
        shown(&name).await,
        (next.owner().to_owned(), None),
        "forced"
    );
    drop(old);
    next.release().await.expect("release");

    let name = unique("data_released_hold");
    let old = a.acquire(&name, &opts().with_data("old")).await.expect("a");
    assert!(
        b.release_hold(&name, old.owner(), old.token())
            .await
            .expect("release_hold")
    );
    let next = b
        .acquire(&name, &opts())
        .await
        .expect("b after release_hold");
    assert_eq!(
        shown(&name).await,
        (next.owner().to_owned(), None),
        "release_hold"
    );
    drop(old);
    next.release().await.expect("release");

    let name = unique("data_handed");
    let wait = opts().with_wait(Duration::from_secs(10));
    let old = a
        .acquire(&name, &wait.clone().with_data("old"))
        .await
        .expect("a");
    let waiter = {
        let (b, name) = (b.clone(), name.clone());
        tokio::spawn(async move { b.acquire(&name, &wait).await })
    };
    // Let the waiter claim the reservation.
    tokio::time::sleep(Duration::from_millis(300)).await;
    old.release().await.expect("release");
    let next = waiter.await.expect("task").expect("the waiter");
    assert_eq!(
        shown(&name).await,
        (next.owner().to_owned(), None),
        "handed"
    );
    next.release().await.expect("release");

    let readers = unique("data_readers");
    let old = a
        .acquire(&readers, &opts().shared().with_data("old"))
        .await
        .expect("a reads");
    assert!(b.force_release(&readers).await.expect("force"));
    let next = b
        .acquire(&readers, &opts().shared())
        .await
        .expect("b reads");
    assert_eq!(
        shown(&readers).await,
        (next.owner().to_owned(), None),
        "forced readers"
    );
    drop(old);
    next.release().await.expect("release");
    let old = a
        .acquire(&readers, &once().shared().with_data("old"))
        .await
        .expect("a reads");
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let next = b
        .acquire(&readers, &opts().shared())
        .await
        .expect("b reads");
    let info = b.inspect(&readers).await.expect("inspect").expect("held");
    assert_eq!((info.holders, info.data), (1, None), "expired readers");
    drop(old);
    next.release().await.expect("release");
}

#[test]
fn bad_urls_are_invalid_config() {
    let mut urls = vec!["ftp://host/db"];
    // Without its dialect's feature, a URL is unsupported before its options are read.
    if cfg!(feature = "sqlite") {
        urls.extend([
            "sqlite://x.db?table=bad-name",
            "sqlite://x.db?pool_size=many",
            "sqlite://x.db?busy_timeout=soon",
            "sqlite::memory:?pool_size=4",
        ]);
    }
    if cfg!(feature = "postgres") {
        urls.push("postgres://h/db?connect_timeout=0");
    }
    if cfg!(feature = "mysql") {
        urls.push("mysql://h/db?create_table=maybe");
    }
    for url in urls {
        match distlock_sql::SqlConfig::from_url(url) {
            Err(Error::InvalidConfig(msg)) => assert!(!msg.is_empty()),
            other => panic!("{url}: {other:?}"),
        }
    }
}

#[cfg(feature = "sqlite")]
mod sqlite {
    use super::*;

    fn url() -> common::SqliteUrl {
        common::SqliteUrl::new("distlock-be-")
    }

    #[tokio::test]
    async fn fenced_write() {
        fenced_write_rejects_stale_token(&url()).await;
    }

    #[tokio::test]
    async fn inspect() {
        inspect_shows_holder(&url()).await;
    }

    #[tokio::test]
    async fn valid_until() {
        not_taken_before_valid_until(&url()).await;
    }

    #[tokio::test]
    async fn wrong_shape() {
        wrong_shape_is_reported(&url()).await;
    }

    #[tokio::test]
    async fn data_ends_with_the_hold() {
        the_data_ends_with_the_hold(&url()).await;
    }

    #[tokio::test]
    async fn old_table_without_the_data_column() {
        a_table_without_the_data_column(&url(), |t| {
            [
                format!(
                    "CREATE TABLE {t} (name TEXT NOT NULL PRIMARY KEY, owner TEXT, \
                     version INTEGER NOT NULL, expires_at INTEGER NOT NULL, next_owner TEXT, \
                     next_since INTEGER, next_expires INTEGER) WITHOUT ROWID"
                ),
                format!(
                    "CREATE TABLE {t}_holders (name TEXT NOT NULL, owner TEXT NOT NULL, \
                     token INTEGER NOT NULL, expires_at INTEGER NOT NULL, \
                     permits INTEGER NOT NULL, PRIMARY KEY (name, owner)) WITHOUT ROWID"
                ),
            ]
        })
        .await;
    }

    /// The first use of a file creates it, its table, and switches it to WAL.
    #[tokio::test]
    async fn first_use_creates_file_in_wal_mode() {
        let url = url();
        let c = client(&url).await;
        let guard = c
            .try_acquire("first", &AcquireOptions::default())
            .await
            .expect("try")
            .expect("free");
        guard.release().await.expect("release");
        let SqlPool::Sqlite(pool) = c.backend_ref().pool() else {
            panic!("not sqlite")
        };
        let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
            .fetch_one(&pool)
            .await
            .expect("pragma");
        assert_eq!(mode, "wal");
    }

    /// Clients that open a new file at the same moment all connect: SQLite refuses some of
    /// the setup steps (the switch to WAL) at once instead of waiting out the busy timeout.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn clients_opening_a_new_file_together_all_connect() {
        for _ in 0..10 {
            let url = url();
            let clients = futures::future::join_all(
                (0..6).map(|_| distlock_sql::connect(&url, ClientConfig::default())),
            )
            .await;
            for c in clients {
                if let Err(err) = c {
                    panic!("a concurrent first connect failed: {err}");
                }
            }
        }
    }

    /// `sqlite::memory:` is one database shared by the pool.
    #[tokio::test]
    async fn memory_database_works() {
        let c = client("sqlite::memory:").await;
        let opts = AcquireOptions::default();
        let guard = c.try_acquire("m", &opts).await.expect("try").expect("free");
        assert!(c.try_acquire("m", &opts).await.expect("try").is_none());
        guard.release().await.expect("release");
    }
}

#[cfg(feature = "postgres")]
mod postgres {
    use super::*;

    fn url() -> Option<String> {
        conformance_tests::server_var("postgres", "DISTLOCK_TEST_POSTGRES_URL")
    }

    #[tokio::test]
    async fn fenced_write() {
        let Some(url) = url() else { return };
        fenced_write_rejects_stale_token(&url).await;
    }

    #[tokio::test]
    async fn inspect() {
        let Some(url) = url() else { return };
        inspect_shows_holder(&url).await;
    }

    #[tokio::test]
    async fn valid_until() {
        let Some(url) = url() else { return };
        not_taken_before_valid_until(&url).await;
    }

    #[tokio::test]
    async fn wrong_shape() {
        let Some(url) = url() else { return };
        wrong_shape_is_reported(&url).await;
    }

    /// The row of `name` in `table`: `(owner, version, next_owner, next_ttl)`.
    async fn row(
        pool: &sqlx::PgPool,
        table: &str,
        name: &str,
    ) -> (Option<String>, i64, Option<String>, Option<i64>) {
        let sql =
            format!("SELECT owner, version, next_owner, next_ttl FROM {table} WHERE name = $1");
        sqlx::query_as(AssertSqlSafe(sql))
            .bind(name)
            .fetch_one(pool)
            .await
            .unwrap_or_else(|e| panic!("read {name}: {e}"))
    }

    /// Waits until a waiter holds the reservation of `name`; returns its owner.
    async fn reserved(pool: &sqlx::PgPool, table: &str, name: &str) -> String {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            if let (_, _, Some(next), Some(_)) = row(pool, table, name).await {
                return next;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no waiter reserved {name}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// A lock `name` of `TABLE` held by one client (`held`, ttl `ttl`) and a second client
    /// waiting for it (`waiter`), which holds the reservation as `next`.
    struct Queued {
        pool: sqlx::PgPool,
        name: String,
        held: distlock_core::LockGuard,
        waiter: tokio::task::JoinHandle<distlock_core::Result<distlock_core::LockGuard>>,
        next: String,
        /// The holder's and the waiter's clients, alive as long as the test.
        _clients: [LockClient<SqlBackend>; 2],
    }

    const TABLE: &str = "distlock_locks";

    async fn queued(url: &str, prefix: &str, ttl: Duration) -> Queued {
        let (a, b) = (client(url).await, client(url).await);
        let pool = common::pg(&a);
        let name = unique(prefix);
        let opts = AcquireOptions::default().with_ttl(ttl);
        let held = a.acquire(&name, &opts).await.expect("a acquires");
        let waiter = waiting(&b, &name, &opts);
        let next = reserved(&pool, TABLE, &name).await;
        Queued {
            pool,
            name,
            held,
            waiter,
            next,
            _clients: [a, b],
        }
    }

    /// Clients of a lock table `t` of their own whose commits of a change that `event` names
    /// (`UPDATE ON {t}`, with `{t}` for the table's name) and `when` selects (a condition on
    /// `OLD` and `NEW`) are made 500 ms slow, once a transaction (a deferred trigger, as a
    /// slow flush or standby would), the pool and the table's name.
    async fn slow_commits(
        url: &str,
        event: &str,
        when: &str,
    ) -> ([LockClient<SqlBackend>; 3], sqlx::PgPool, String) {
        let table = unique("slow_commit");
        let sep = if url.contains('?') { '&' } else { '?' };
        let url = format!("{url}{sep}table={table}");
        let clients = [client(&url).await, client(&url).await, client(&url).await];
        let pool = common::pg(&clients[0]);
        // The first acquisitions create the tables.
        let opts = AcquireOptions::default();
        for opts in [opts.clone(), opts.clone().shared(), opts.with_permits(1)] {
            let first = clients[0].acquire(&unique("slow-commit"), &opts).await;
            first.expect("a").release().await.expect("a releases");
        }
        let admin = clients[0].backend_ref().pool();
        exec(
            &admin,
            format!(
                "CREATE FUNCTION {table}_slow() RETURNS trigger LANGUAGE plpgsql AS \
                 $$ BEGIN IF coalesce(current_setting('distlock_test.slept', true), '') = '' \
                 THEN PERFORM set_config('distlock_test.slept', 'yes', true); \
                 PERFORM pg_sleep(0.5); END IF; RETURN NULL; END $$"
            ),
        )
        .await;
        exec(
            &admin,
            format!(
                "CREATE CONSTRAINT TRIGGER {table}_slow AFTER {event} \
                 DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN ({when}) \
                 EXECUTE FUNCTION {table}_slow()",
                event = event.replace("{t}", &table)
            ),
        )
        .await;
        (clients, pool, table)
    }

    /// Drops what [`slow_commits`] made.
    async fn drop_slow_commits(pool: &sqlx::PgPool, table: &str) {
        drop_own_table(pool, table).await;
        let admin = SqlPool::Postgres(pool.clone());
        exec(&admin, format!("DROP FUNCTION {table}_slow()")).await;
    }

    /// How much later than the server's the lease of `guard` (of `name` in `table`, its
    /// holders' table when `read`) ends, and how much of the server's is left, in seconds.
    async fn lease_over(
        pool: &sqlx::PgPool,
        table: &str,
        name: &str,
        guard: &distlock_core::LockGuard,
        read: bool,
    ) -> (f64, f64) {
        let (from, token) = if read {
            (format!("{table}_holders"), "token")
        } else {
            (table.to_owned(), "version")
        };
        let sql = format!(
            "SELECT extract(epoch FROM expires_at - clock_timestamp())::float8 \
             FROM {from} WHERE name = $1 AND {token} = $2"
        );
        // A renewal answered between the two reads (a 1 s hold handed over after a 500 ms
        // commit renews at once) moved the belief past what the server's read saw: a CI run
        // measured +0.49 s so. Measured again then: a renewal answered before `before` is
        // committed and visible to the read that follows (PostgreSQL makes a commit visible
        // before it answers it); one committed but not yet answered only makes the belief
        // earlier.
        for _ in 0..10 {
            let before = guard.valid_until();
            let server: f64 = sqlx::query_scalar(AssertSqlSafe(sql.clone()))
                .bind(name)
                .bind(token_of(guard))
                .fetch_one(pool)
                .await
                .expect("the server's lease");
            // Read after the server's, so that the read's delay counts against neither.
            let now = std::time::Instant::now();
            let until = guard.valid_until();
            if until == before {
                let believed = until.saturating_duration_since(now);
                return (believed.as_secs_f64() - server, server);
            }
        }
        panic!("the lease of {name:?} was renewed during each of 10 reads");
    }

    /// Every lease in `over` (ttl in ms, seconds later than the server's) ends no later than
    /// the server's. Nor much earlier than the server's less the drift margin: by less than
    /// the slow commit and a margin (a take or join sent while the release commits, answered
    /// after it, dates its lease from its send), and most by less than 100 ms.
    fn no_later_than_the_servers(over: &[(u64, f64)]) {
        assert!(
            over.iter().all(|(_, s)| *s <= 0.005),
            "a lease ended after the server's by {over:?} s"
        );
        let drift = |ttl: u64| {
            let ttl = Duration::from_millis(ttl);
            ClientConfig::default().drift(ttl).as_secs_f64()
        };
        assert!(
            over.iter().all(|&(ttl, s)| s + drift(ttl) > -0.75),
            "a lease ended before the server's by {over:?} s"
        );
        let close = over
            .iter()
            .filter(|&&(ttl, s)| s + drift(ttl) > -0.1)
            .count();
        assert!(
            close * 2 > over.len(),
            "most leases ended before the server's by 100 ms or more: {over:?} s"
        );
    }

    /// A hand-over's lease starts when the release's statement runs, before its commit,
    /// and a waiter that read the row in between still saw the old holder: the lease it
    /// believes ends no later than the server's. The release's commit is made 500 ms slow.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lease_handed_over_ends_no_later_than_the_servers() {
        let Some(url) = url() else { return };
        let when = "OLD.owner IS NOT NULL AND NEW.owner IS NOT NULL AND OLD.owner <> NEW.owner";
        let ([a, b, _], pool, table) = slow_commits(&url, "UPDATE ON {t}", when).await;
        // Hand-overs with a ttl of 3 s and of 1 s (its claims are up to half of it old): the
        // waiter learns of one by its notification or by its own claim or read after the
        // commit (then from the server's remaining lease).
        let mut over = Vec::new();
        for ttl in [3000, 3000, 3000, 1000, 1000] {
            let opts = AcquireOptions::default().with_ttl(Duration::from_millis(ttl));
            let name = unique("slow-commit");
            let held = a.acquire(&name, &opts).await.expect("a acquires");
            let waiter = waiting(&b, &name, &opts);
            reserved(&pool, &table, &name).await;
            held.release().await.expect("a releases");
            let guard = waiter.await.expect("the waiter").expect("b acquires");
            over.push((ttl, lease_over(&pool, &table, &name, &guard, false).await.0));
            guard.release().await.expect("b releases");
        }
        drop_slow_commits(&pool, &table).await;
        no_later_than_the_servers(&over);
    }

    /// Waits until `n` waiters of `name` hold a live place in `table`'s queue of permit
    /// waiters (of a semaphore of `permits`; 0: readers).
    async fn places(pool: &sqlx::PgPool, table: &str, name: &str, permits: i64, n: i64) {
        let sql = format!(
            "SELECT count(*) FROM {table}_queue \
             WHERE name = $1 AND permits = $2 AND expires_at > now()"
        );
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let live: i64 = sqlx::query_scalar(AssertSqlSafe(sql.clone()))
                .bind(name)
                .bind(permits)
                .fetch_one(pool)
                .await
                .expect("the queue");
            if live >= n {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{n} waiters did not queue for {name}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// As [`a_lease_handed_over_ends_no_later_than_the_servers`], for the holds that a
    /// release hands over in the holders' table: the read holds a writer's release hands to
    /// the reserved reader and to a reader queued behind it, and a permit. The commit of a
    /// holder's row added is made 500 ms slow.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_hold_handed_over_ends_no_later_than_the_servers() {
        let Some(url) = url() else { return };
        let ([a, b, c], pool, table) = slow_commits(&url, "INSERT ON {t}_holders", "true").await;
        let mut over = Vec::new();
        let mut handed = Vec::new();
        for ttl in [30000, 30000, 3000, 3000, 3000, 1000, 1000] {
            let writes = AcquireOptions::default().with_ttl(Duration::from_millis(ttl));
            let reads = writes.clone().shared();
            let name = unique("slow-commit");
            let held = a.acquire(&name, &writes).await.expect("a acquires");
            let first = waiting(&b, &name, &reads);
            reserved(&pool, &table, &name).await;
            let second = waiting(&c, &name, &reads);
            // Both readers' first joins queued them, the reserved one's too.
            places(&pool, &table, &name, 0, 2).await;
            held.release().await.expect("a releases");
            let released = std::time::Instant::now();
            for waiter in [first, second] {
                let guard = common::granted(waiter).await;
                let (late, left) = lease_over(&pool, &table, &name, &guard, true).await;
                over.push((ttl, late));
                // Whether the hold is the one the release's statement made, its lease begun
                // before the release's 500 ms commit, not one a join renewed after it (a
                // reader that finds no hold to read joins, as one that polls between that
                // commit and its notification does). A 1 s hold renews at once.
                let began = Duration::from_millis(ttl).as_secs_f64() - left;
                if ttl >= 3000 {
                    handed.push((began, began > released.elapsed().as_secs_f64() + 0.4));
                }
                guard.release().await.expect("a reader releases");
            }
            let permit = writes.clone().with_permits(1);
            let name = unique("slow-commit");
            let held = a.acquire(&name, &permit).await.expect("a takes the permit");
            let waiter = waiting(&b, &name, &permit);
            places(&pool, &table, &name, 1, 1).await;
            held.release().await.expect("a releases the permit");
            let guard = common::granted(waiter).await;
            over.push((ttl, lease_over(&pool, &table, &name, &guard, true).await.0));
            guard.release().await.expect("b releases the permit");
        }
        drop_slow_commits(&pool, &table).await;
        no_later_than_the_servers(&over);
        let read = handed.iter().filter(|(_, before)| *before).count();
        assert!(
            read * 2 > handed.len(),
            "most read holds were renewed after the release: {handed:?}"
        );
    }

    /// Two clients, each holding a read hold (ttl 30 s) of a new name.
    struct TwoReaders {
        clients: [LockClient<SqlBackend>; 2],
        pool: sqlx::PgPool,
        name: String,
        held: [distlock_core::LockGuard; 2],
    }

    async fn two_readers(url: &str, prefix: &str) -> TwoReaders {
        let clients = [client(url).await, client(url).await];
        let pool = common::pg(&clients[0]);
        let name = unique(prefix);
        let reads = AcquireOptions::default()
            .with_ttl(Duration::from_secs(30))
            .shared();
        let first = clients[0]
            .acquire(&name, &reads)
            .await
            .expect("first reader");
        let second = clients[1]
            .acquire(&name, &reads)
            .await
            .expect("second reader");
        TwoReaders {
            clients,
            pool,
            name,
            held: [first, second],
        }
    }

    /// A reader's release that leaves another reader holding does not lock the name's row
    /// (readers of one name took turns on it, issue 44): it leaves while another transaction
    /// holds that row. The last reader's release frees the name: a writer takes it at once.
    #[tokio::test]
    async fn a_reader_leaves_without_the_names_row() {
        let Some(url) = url() else { return };
        let TwoReaders {
            clients: [a, _b],
            pool,
            name,
            held: [first, second],
        } = two_readers(&url, "reader-leaves").await;
        let tx = lock_row(&pool, TABLE, &name, "FOR UPDATE").await;
        tokio::time::timeout(Duration::from_secs(10), first.release())
            .await
            .expect("the release waited for the name's row")
            .expect("release");
        tx.rollback().await.expect("rollback");
        second.release().await.expect("the last reader's release");
        a_writer_takes_at_once(&a, &name, "the last reader's release left the name held").await;
    }

    /// `client` takes `name` exclusively at once (else panics with `held`) and releases it.
    async fn a_writer_takes_at_once(client: &LockClient<SqlBackend>, name: &str, held: &str) {
        let writer = client
            .try_acquire(name, &AcquireOptions::default())
            .await
            .expect("try")
            .expect(held);
        writer.release().await.expect("release the writer");
    }

    /// The two read holders of `name` (owner, token), lowest owner first.
    async fn read_holders(pool: &sqlx::PgPool, name: &str) -> [(String, i64); 2] {
        let holders =
            format!("SELECT owner, token FROM {TABLE}_holders WHERE name = $1 ORDER BY owner");
        let holders: Vec<(String, i64)> = sqlx::query_as(AssertSqlSafe(holders))
            .bind(name)
            .fetch_all(pool)
            .await
            .expect("holders");
        <[_; 2]>::try_from(holders).expect("two holders")
    }

    /// Step `n` of the release of the read hold `(owner, token)` of `name`: its answer is
    /// done (`true`), maybe the last (`NULL`) or not held (`false`).
    fn release_step(
        name: &str,
        n: i32,
        (owner, token): &(String, i64),
    ) -> sqlx::query::QueryScalar<'static, sqlx::Postgres, Option<bool>, sqlx::postgres::PgArguments>
    {
        let call =
            format!("SELECT {TABLE}_dl_release_v11($1, $2, chr(1) || 'shared', $3, false, {n}, 1)");
        sqlx::query_scalar(AssertSqlSafe(call))
            .bind(name.to_owned())
            .bind(owner.clone())
            .bind(*token)
    }

    /// The first steps of two readers' releases: the one that finds the other (and locks its
    /// row) answers that it is done; the other, whose delete waits for that commit, then
    /// finds nobody and answers that it may be the last, and its second step frees the name.
    /// A look that locked nothing, or waited for locked rows, would let both answer done (the
    /// name held until its lease ends) or wait on each other.
    #[tokio::test]
    async fn a_reader_that_may_be_last_says_so() {
        let Some(url) = url() else { return };
        let TwoReaders {
            clients: _clients,
            pool,
            name,
            held: _held,
        } = two_readers(&url, "may-be-last").await;
        let [low, high] = read_holders(&pool, &name).await;
        let step = |n: i32, holder: &(String, i64)| release_step(&name, n, holder);
        let mut tx = pool.begin().await.expect("begin");
        let done = step(1, &low)
            .fetch_one(&mut *tx)
            .await
            .expect("first step of one");
        assert_eq!(done, Some(true), "the other holder was not found");
        let other = {
            let (query, pool) = (step(1, &high), pool.clone());
            tokio::spawn(async move { query.fetch_one(&pool).await })
        };
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(
            !other.is_finished(),
            "the other's delete did not wait for the look's lock"
        );
        // The name's row held by another transaction: the step does not wait for it.
        let row_held = lock_row(&pool, TABLE, &name, "FOR UPDATE").await;
        tx.commit().await.expect("commit");
        let last = other.await.expect("join").expect("first step of the other");
        assert_eq!(last, None, "the last holder did not say it may be the last");
        row_held.rollback().await.expect("rollback");
        step(2, &high).fetch_one(&pool).await.expect("second step");
        assert_eq!(
            row(&pool, TABLE, &name).await.0,
            None,
            "the name stayed held"
        );
    }

    /// Runs `sql`, whose `$1` is `name`, on `on`, panicking with `what` on failure.
    async fn on_name<'e>(on: impl sqlx::PgExecutor<'e>, sql: String, name: &str, what: &str) {
        if let Err(err) = sqlx::query(AssertSqlSafe(sql)).bind(name).execute(on).await {
            panic!("{what}: {err}");
        }
    }

    /// A transaction holding the lock row of `name` in `table` (`FOR UPDATE` or `FOR SHARE`).
    async fn lock_row(
        pool: &sqlx::PgPool,
        table: &str,
        name: &str,
        mode: &str,
    ) -> sqlx::Transaction<'static, sqlx::Postgres> {
        let mut tx = pool.begin().await.expect("begin");
        let lock = format!("SELECT 1 FROM {table} WHERE name = $1 {mode}");
        on_name(&mut *tx, lock, name, &format!("lock the name's row {mode}")).await;
        tx
    }

    /// The last reader's first release step, the name's row free, ends the readers' turn in
    /// the same call (one round trip less for the last reader, issue 44): it hands the name
    /// to the reserved writer.
    #[tokio::test]
    async fn a_last_readers_first_step_hands_over() {
        let Some(url) = url() else { return };
        let (readers, last) = a_reader_before_a_writer(&url, "first-step-hands").await;
        let (pool, name) = (&readers.pool, &readers.name);
        let (_, before, _, _) = row(pool, TABLE, name).await;
        let ended = release_step(name, 1, &last)
            .fetch_one(pool)
            .await
            .expect("first step");
        assert_eq!(
            ended,
            Some(true),
            "the last reader's first step did not end the turn"
        );
        assert_handed_to_writer(pool, name, before).await;
    }

    /// Two readers of which one has left (its first release step found the other), and a
    /// writer's reservation: the readers and the holder left.
    async fn a_reader_before_a_writer(url: &str, prefix: &str) -> (TwoReaders, (String, i64)) {
        let readers = two_readers(url, prefix).await;
        let (pool, name) = (&readers.pool, &readers.name);
        reserve_for_writer(pool, name).await;
        let [low, high] = read_holders(pool, name).await;
        let done = release_step(name, 1, &low)
            .fetch_one(pool)
            .await
            .expect("first step");
        assert_eq!(done, Some(true), "the other holder was not found");
        (readers, high)
    }

    /// The name is the reserved writer's (see [`reserve_for_writer`]), with a version above
    /// `before`, and the reservation is gone.
    async fn assert_handed_to_writer(pool: &sqlx::PgPool, name: &str, before: i64) {
        let (owner, version, next, _) = row(pool, TABLE, name).await;
        assert_eq!(owner.as_deref(), Some("writer"), "not handed to the writer");
        assert!(version > before, "the hand-over kept the readers' version");
        assert_eq!(next, None, "the reservation stayed");
    }

    /// A reader's reservation of `name` (`owner`, a plain identifier), with the lease it
    /// wants when handed a read hold, negated.
    async fn reserve_for_reader(pool: &sqlx::PgPool, name: &str, owner: &str) {
        let reserve = format!(
            "UPDATE {TABLE} SET next_owner = '{owner}', next_since = version, \
             next_expires = now() + interval '30 seconds', next_ttl = -30000000 WHERE name = $1"
        );
        on_name(pool, reserve, name, "reserve").await;
    }

    /// A writer's reservation of `name` (`writer`), with the lease it wants when handed the
    /// lock.
    async fn reserve_for_writer(pool: &sqlx::PgPool, name: &str) {
        let reserve = format!(
            "UPDATE {TABLE} SET next_owner = 'writer', next_since = version, \
             next_expires = now() + interval '30 seconds', next_ttl = 30000000 WHERE name = $1"
        );
        on_name(pool, reserve, name, "reserve").await;
    }

    /// A reader's second release step that finds the read marker run out still ends the
    /// readers' turn: it hands the name to the reserved writer. A release whose count saw the
    /// other reader's row, deleted by that reader's first step but not yet committed, and whose
    /// shrink, a statement later, saw it gone, sets the marker's expiry to now; the second
    /// step that then answered `false` woke nobody, and the writer waited for its backstop
    /// poll (250 ms: `distlock bench --scenario rw-mix` showed readers → writer p99 252 ms in
    /// four runs of six). The race is replayed here as its end state.
    #[tokio::test]
    async fn a_last_reader_hands_over_after_its_marker_ran_out() {
        let Some(url) = url() else { return };
        let (readers, high) = a_reader_before_a_writer(&url, "marker-ran-out").await;
        let (pool, name) = (&readers.pool, &readers.name);
        let step = |n: i32, holder: &(String, i64)| release_step(name, n, holder);
        let row_held = lock_row(pool, TABLE, name, "FOR UPDATE").await;
        let last = step(1, &high).fetch_one(pool).await.expect("first step");
        assert_eq!(last, None, "the last holder did not say it may be the last");
        row_held.rollback().await.expect("rollback");
        // What the racing release's shrink left: the marker's expiry now.
        let ran_out = format!("UPDATE {TABLE} SET expires_at = now() WHERE name = $1");
        on_name(pool, ran_out, name, "run the marker out").await;
        let (_, before, _, _) = row(pool, TABLE, name).await;
        let ended = step(2, &high).fetch_one(pool).await.expect("second step");
        assert_eq!(ended, Some(true), "the second step did not end the turn");
        assert_handed_to_writer(pool, name, before).await;
    }

    /// A writer's release hands a read hold to the reader holding the reservation (a writer's
    /// turn to the readers was a wake-up, then the reader's join: a round trip and a commit
    /// more, issue 44): the reader's reservation carries its ttl negated, and the release
    /// marks the row shared with the next version, adds the reader's holder row and tells it
    /// (`h<version>:..`), which the reader takes as its hold.
    #[tokio::test]
    async fn a_writers_release_hands_the_reserved_reader_a_read_hold() {
        let Some(url) = url() else { return };
        let (a, b) = (client(&url).await, client(&url).await);
        let pool = common::pg(&a);
        let name = unique("hand-read");
        let ttl = Duration::from_secs(30);
        let writes = AcquireOptions::default().with_ttl(ttl);
        let writer = a.acquire(&name, &writes).await.expect("the writer");
        let reader = waiting(&b, &name, &writes.clone().shared());
        let next = reserved(&pool, TABLE, &name).await;
        let (_, _, _, next_ttl) = row(&pool, TABLE, &name).await;
        let micros = i64::try_from(ttl.as_micros()).expect("µs");
        assert_eq!(next_ttl, Some(-micros), "the reader's ttl, negated");
        let mut listener = common::listen(&pool, TABLE).await;
        let before = token_of(&writer);
        writer.release().await.expect("the writer's release");
        let read = common::granted(reader).await;
        let token = token_of(&read);
        assert_eq!(token, before + 1, "the next version");
        let handed = format!("h{token}:{}:{next}{name}", next.len());
        assert_eq!(common::next_note(&mut listener, &name).await, handed);
        read.renew().await.expect("renew the read hold handed over");
        let (owner, version, next_owner, next_ttl) = row(&pool, TABLE, &name).await;
        assert_eq!(owner.as_deref(), Some("\u{1}shared"), "not marked shared");
        assert_eq!((version, next_owner, next_ttl), (token, None, None));
        let holders = format!("SELECT owner, token FROM {TABLE}_holders WHERE name = $1");
        let holders: Vec<(String, i64)> = sqlx::query_as(AssertSqlSafe(holders))
            .bind(&name)
            .fetch_all(&pool)
            .await
            .expect("holders");
        assert_eq!(holders, [(next, token)]);
        read.release().await.expect("the reader's release");
    }

    /// The readers' places in the queue of `name` (owner, ttl), live or barred, in order;
    /// with `at_least`, read again (every 5 ms, 10 s at most) until that many are live.
    async fn reader_places(
        pool: &sqlx::PgPool,
        table: &str,
        name: &str,
        at_least: usize,
    ) -> Vec<(String, i64)> {
        let sql = format!(
            "SELECT owner, ttl, expires_at > now() FROM {table}_queue \
             WHERE name = $1 AND permits = 0 ORDER BY seq, owner"
        );
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let places: Vec<(String, i64, bool)> = sqlx::query_as(AssertSqlSafe(sql.clone()))
                .bind(name)
                .fetch_all(pool)
                .await
                .expect("the queue");
            if places.iter().filter(|p| p.2).count() >= at_least {
                return places.into_iter().map(|(o, t, _)| (o, t)).collect();
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{at_least} readers did not queue for {name}: {places:?}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// A writer holding a new name (ttl 30 s) of the first of `n` clients, and a reader of the
    /// second waiting for it that holds the reservation.
    struct WriterAhead {
        clients: Vec<LockClient<SqlBackend>>,
        pool: sqlx::PgPool,
        name: String,
        reads: AcquireOptions,
        writer: distlock_core::LockGuard,
        first: tokio::task::JoinHandle<distlock_core::Result<distlock_core::LockGuard>>,
        next: String,
    }

    async fn writer_ahead(url: &str, prefix: &str, n: usize) -> WriterAhead {
        let mut clients = Vec::new();
        for _ in 0..n {
            clients.push(client(url).await);
        }
        let pool = common::pg(&clients[0]);
        let name = unique(prefix);
        let writes = AcquireOptions::default().with_ttl(Duration::from_secs(30));
        let reads = writes.clone().shared();
        let writer = clients[0]
            .acquire(&name, &writes)
            .await
            .expect("the writer");
        let first = waiting(&clients[1], &name, &reads);
        let next = reserved(&pool, TABLE, &name).await;
        WriterAhead {
            clients,
            pool,
            name,
            reads,
            writer,
            first,
            next,
        }
    }

    /// The places of `name`'s queue kept live for 30 s (live a second from each refusal),
    /// whatever the machine's pace.
    async fn keep_places(pool: &sqlx::PgPool, name: &str) {
        let keep = format!(
            "UPDATE {TABLE}_queue SET expires_at = now() + interval '30 seconds' WHERE name = $1"
        );
        on_name(pool, keep, name, "keep the places").await;
    }

    /// A writer's release hands a read hold to every reader queued behind it, not only to the
    /// reserved one (issue 44: the others were woken and joined, each a commit under the
    /// name's row lock, one after the other, and the writer after them waited behind those
    /// joins). A reader that a writer refuses queues (`permits` 0); the release gives each
    /// live place a holder row with the next token, in the order they queued, and tells it
    /// (`h<version>:..`); the places go.
    #[tokio::test]
    async fn a_writers_release_hands_every_queued_reader_a_read_hold() {
        let Some(url) = url() else { return };
        let ahead = writer_ahead(&url, "hand-queued", 4).await;
        let (clients, pool, name, reads) = (&ahead.clients, &ahead.pool, &ahead.name, &ahead.reads);
        let (writer, first, next) = (ahead.writer, ahead.first, &ahead.next);
        let others = [
            waiting(&clients[2], name, reads),
            waiting(&clients[3], name, reads),
        ];
        // Every reader's first join queued it, the reserved one's too.
        reader_places(pool, TABLE, name, 3).await;
        keep_places(pool, name).await;
        let queued: Vec<String> = reader_places(pool, TABLE, name, 3)
            .await
            .into_iter()
            .map(|(owner, _)| owner)
            .filter(|owner| owner != next)
            .collect();
        assert_eq!(queued.len(), 2, "{queued:?}");
        let mut listener = common::listen(pool, TABLE).await;
        let before = token_of(&writer);
        writer.release().await.expect("the writer's release");
        let mut notes = Vec::new();
        for _ in 0..3 {
            notes.push(common::next_note(&mut listener, name).await);
        }
        // The queued readers in their order, then the reserved one, each told its token; only
        // the last note (`h`) wakes the other waiters.
        let told =
            |h: char, owner: &str, token: i64| format!("{h}{token}:{}:{owner}{name}", owner.len());
        let expected = [
            told('H', &queued[0], before + 2),
            told('H', &queued[1], before + 3),
            told('h', next, before + 1),
        ];
        assert_eq!(notes, expected, "not handed over by the release");
        let read = common::granted(first).await;
        assert_eq!(token_of(&read), before + 1);
        let mut tokens = vec![token_of(&read)];
        let mut holds = vec![read];
        for other in others {
            let hold = common::granted(other).await;
            tokens.push(token_of(&hold));
            holds.push(hold);
        }
        tokens.sort_unstable();
        assert_eq!(tokens, [before + 1, before + 2, before + 3]);
        let (owner, version, next_owner, _) = row(pool, TABLE, name).await;
        assert_eq!(owner.as_deref(), Some("\u{1}shared"), "not marked shared");
        assert_eq!((version, next_owner), (before + 3, None));
        assert_eq!(reader_places(pool, TABLE, name, 0).await, [], "places left");
        for hold in holds {
            hold.renew().await.expect("renew a read hold handed over");
            hold.release().await.expect("release it");
        }
        a_writer_takes_at_once(&clients[0], name, "the readers left the name held").await;
    }

    /// A reader that gives up while queued keeps its place barred (a negative ttl): the
    /// writer's release hands it nothing (a read hold nobody would release, keeping writers
    /// out until its lease ran out), and hands the reserved reader its hold.
    #[tokio::test]
    async fn a_reader_that_gave_up_is_handed_nothing() {
        let Some(url) = url() else { return };
        let ahead = writer_ahead(&url, "queued-gave-up", 3).await;
        let (pool, name, next) = (&ahead.pool, &ahead.name, &ahead.next);
        let brief = ahead.reads.clone().with_wait(Duration::from_millis(300));
        let gave_up = ahead.clients[2].acquire(name, &brief).await;
        assert!(gave_up.is_err(), "a reader took a name a writer holds");
        let places = reader_places(pool, TABLE, name, 0).await;
        let barred: Vec<_> = places.iter().filter(|(_, ttl)| *ttl < 0).collect();
        assert_eq!(barred.len(), 1, "{places:?}");
        keep_places(pool, name).await;
        let before = token_of(&ahead.writer);
        ahead.writer.release().await.expect("the writer's release");
        let read = common::granted(ahead.first).await;
        assert_eq!(token_of(&read), before + 1);
        let holders = format!("SELECT owner, token FROM {TABLE}_holders WHERE name = $1");
        let holders: Vec<(String, i64)> = sqlx::query_as(AssertSqlSafe(holders))
            .bind(name)
            .fetch_all(pool)
            .await
            .expect("holders");
        assert_eq!(
            holders,
            [(next.clone(), before + 1)],
            "handed to a reader that gave up"
        );
        assert_eq!(
            reader_places(pool, TABLE, name, 0).await,
            [(barred[0].0.clone(), -1)],
            "the barred place went"
        );
        read.release().await.expect("the reader's release");
    }

    /// A reader holding a read hold of `name` (ttl 30 s) whose own reservation is live again,
    /// as when its poll renewed the reservation while a writer's release handed it the hold:
    /// the reader's client, the other client, the pool and the guard.
    async fn a_reader_reserving_while_it_holds(
        url: &str,
        prefix: &str,
    ) -> (
        [LockClient<SqlBackend>; 2],
        sqlx::PgPool,
        String,
        distlock_core::LockGuard,
    ) {
        let TwoReaders {
            clients,
            pool,
            name,
            held: [held, second],
        } = two_readers(url, prefix).await;
        second.release().await.expect("the second reader's release");
        let holders = format!("SELECT owner FROM {TABLE}_holders WHERE name = $1");
        let owner: String = sqlx::query_scalar(AssertSqlSafe(holders))
            .bind(&name)
            .fetch_one(&pool)
            .await
            .expect("the reader's owner");
        reserve_for_reader(&pool, &name, &owner).await;
        (clients, pool, name, held)
    }

    /// A reservation of a live read holder keeps no other reader out: the join clears it.
    #[tokio::test]
    async fn a_readers_stale_reservation_keeps_no_reader_out() {
        let Some(url) = url() else { return };
        let (clients, pool, name, held) =
            a_reader_reserving_while_it_holds(&url, "stale-reserve-join").await;
        let reads = AcquireOptions::default().shared();
        let other = clients[1]
            .try_acquire(&name, &reads)
            .await
            .expect("try")
            .expect("the holder's own reservation kept a reader out");
        assert_eq!(
            row(&pool, TABLE, &name).await.2,
            None,
            "the reservation stayed"
        );
        other.release().await.expect("release");
        held.release().await.expect("release");
    }

    /// The release of a read holder whose own reservation is live clears it: a writer takes
    /// the name at once (the release woke nobody else, and the reservation kept writers out
    /// until it ran out).
    #[tokio::test]
    async fn a_readers_release_clears_its_stale_reservation() {
        let Some(url) = url() else { return };
        let (clients, pool, name, held) =
            a_reader_reserving_while_it_holds(&url, "stale-reserve-release").await;
        held.release().await.expect("release");
        assert_eq!(
            row(&pool, TABLE, &name).await.2,
            None,
            "the reservation stayed"
        );
        let kept = "the released reader's reservation kept the writer out";
        a_writer_takes_at_once(&clients[1], &name, kept).await;
    }

    /// A reader's join that finds a read hold of its own (a writer's release handed it over,
    /// and the notification was lost) renews it and takes it, whatever reservation another
    /// waiter holds since: a refusal would keep the reader waiting behind its own hold,
    /// and the writer behind that hold, until it ran out.
    #[tokio::test]
    async fn a_readers_join_takes_a_read_hold_it_was_handed() {
        let Some(url) = url() else { return };
        let readers = two_readers(&url, "join-handed").await;
        let (pool, name) = (&readers.pool, &readers.name);
        reserve_for_writer(pool, name).await;
        let [(owner, token), _] = read_holders(pool, name).await;
        let join = format!(
            "SELECT o_taken FROM {TABLE}_dl_join_v11($1, $2, chr(1) || 'shared', 30000000, 0, 0, 1)"
        );
        let taken: Option<i64> = sqlx::query_scalar(AssertSqlSafe(join))
            .bind(name)
            .bind(&owner)
            .fetch_one(pool)
            .await
            .expect("join");
        assert_eq!(taken, Some(token), "not the read hold it was handed");
        assert_eq!(read_holders(pool, name).await[0], (owner, token));
    }

    /// A reader's join that takes with a positive `p_queue` (a waiter that may have queued)
    /// takes its place out of the queue, beside live readers (the lock for share) and as the
    /// first reader of an epoch: left, a writer's release would hand that place a read hold
    /// nobody releases. One with a negative `p_queue` (a first join) queues when refused.
    #[tokio::test]
    async fn a_readers_take_takes_its_place_out() {
        let Some(url) = url() else { return };
        // A table of its own: the readers' range, set by the second reader, is not spent by
        // other tests' readers before the third joins.
        let ([a, b], table) = own_table(&url, "take-place").await;
        let (pool, name, reads) = (common::pg(&a), unique("take-place"), reads());
        let first = a.acquire(&name, &reads).await.expect("first reader");
        let setter = b.acquire(&name, &reads).await.expect("second reader");
        let join = format!(
            "SELECT o_taken FROM {table}_dl_join_v11($1, $2, chr(1) || 'shared', 30000000, 0, $3, 1)"
        );
        let place = format!(
            "INSERT INTO {table}_queue (name, owner, seq, expires_at, ttl, permits) \
             VALUES ($1, 'queued', 0, now() + interval '30 seconds', 30000000, 0)"
        );
        let free = unique("take-place-free");
        let gone = a.acquire(&free, &reads).await.expect("a reader of `free`");
        gone.release().await.expect("its release");
        // Beside live readers (the row's version stays), and as the first reader of `free`
        // (an epoch, a new version).
        for (name, beside) in [(&name, true), (&free, false)] {
            on_name(&pool, place.clone(), name, "queue").await;
            let version = row(&pool, &table, name).await.1;
            let taken: Option<i64> = sqlx::query_scalar(AssertSqlSafe(join.clone()))
                .bind(name)
                .bind("queued")
                .bind(1_000_000_i64)
                .fetch_one(&pool)
                .await
                .expect("join");
            assert!(taken.is_some(), "the queued reader did not join {name}");
            let kept = row(&pool, &table, name).await.1 == version;
            assert_eq!(kept, beside, "not the path asked for on {name}");
            assert_eq!(
                reader_places(&pool, &table, name, 0).await,
                [],
                "its place stayed"
            );
        }
        // A writer now: a reader's first join (negative) queues.
        let writer = unique("take-place-writer");
        let writes = AcquireOptions::default().with_ttl(Duration::from_secs(30));
        let held = a.acquire(&writer, &writes).await.expect("writer");
        let refused: Option<i64> = sqlx::query_scalar(AssertSqlSafe(join))
            .bind(&writer)
            .bind("refused")
            .bind(-1_000_000_i64)
            .fetch_one(&pool)
            .await
            .expect("join");
        assert_eq!(refused, None, "a reader joined a writer");
        let places = reader_places(&pool, &table, &writer, 1).await;
        assert_eq!(places, [("refused".to_owned(), 30_000_000)]);
        held.release().await.expect("the writer's release");
        for held in [first, setter] {
            held.release().await.expect("a reader's release");
        }
        drop_own_table(&pool, &table).await;
    }

    /// A reader's release takes its place in the queue out, when it was queued and told of
    /// its hold: a hand-over of a client before `_v9` (which keeps no queue) left that place,
    /// and a later hand-over would have given that owner, done with the name, a hold nobody
    /// releases (writers kept out for its ttl). The place is written back here after the
    /// hand-over, as such a client leaves it.
    #[tokio::test]
    async fn a_handed_readers_release_takes_its_place_out() {
        let Some(url) = url() else { return };
        let ahead = writer_ahead(&url, "release-place", 2).await;
        let (pool, name, next) = (&ahead.pool, &ahead.name, &ahead.next);
        ahead.writer.release().await.expect("the writer's release");
        let read = common::granted(ahead.first).await;
        let place = format!(
            "INSERT INTO {TABLE}_queue (name, owner, seq, expires_at, ttl, permits) \
             VALUES ($1, '{next}', 0, now() + interval '30 seconds', 30000000, 0)"
        );
        on_name(pool, place, name, "queue").await;
        read.release().await.expect("the reader's release");
        assert_eq!(
            reader_places(pool, TABLE, name, 0).await,
            [],
            "its place stayed"
        );
    }

    /// A reader's reservation left on a name read (its reader gone: it would join on its next
    /// poll otherwise) keeps no writer out once the readers have left: their releases clear
    /// it. Left, it refused the writer's take (and claim) until it ran out, and nobody woke
    /// the writer then.
    #[tokio::test]
    async fn readers_leave_no_readers_reservation_behind() {
        let Some(url) = url() else { return };
        let readers = two_readers(&url, "reader-reservation-left").await;
        let (pool, name) = (&readers.pool, &readers.name);
        reserve_for_reader(pool, name, "gone-reader").await;
        for held in readers.held {
            held.release().await.expect("a reader's release");
        }
        let kept = "a reader's reservation kept the writer out";
        a_writer_takes_at_once(&readers.clients[0], name, kept).await;
    }

    /// Readers that leave at the same moment, each maybe the last: one of them frees the
    /// name (none leaves it to the others, who have left too), round after round.
    #[tokio::test]
    async fn readers_leaving_together_free_the_name() {
        let Some(url) = url() else { return };
        let clients = [client(&url).await, client(&url).await, client(&url).await];
        let reads = AcquireOptions::default()
            .with_ttl(Duration::from_secs(30))
            .shared();
        for round in 0..100 {
            let name = unique("readers-leave");
            let mut held = Vec::new();
            for c in &clients {
                held.push(c.acquire(&name, &reads).await.expect("reader"));
            }
            let released = futures::future::join_all(held.into_iter().map(|g| g.release())).await;
            assert!(
                released.iter().all(Result::is_ok),
                "round {round}: {released:?}"
            );
            let writer = clients[0]
                .try_acquire(&name, &AcquireOptions::default())
                .await
                .expect("try");
            let writer = writer.unwrap_or_else(|| panic!("round {round}: the name stayed held"));
            writer.release().await.expect("release the writer");
        }
    }

    /// A maybe-last reader's release that locked the name's row waits for another reader's
    /// leave in progress (its holder row deleted, not yet committed) and counts that reader
    /// gone: it frees the name itself. Counted as live, that reader's second step freed it
    /// instead, and readers handed their holds together, leaving together, passed the name
    /// on one second step after another before the writer waiting for them got it.
    #[tokio::test]
    async fn a_last_reader_counts_a_leave_in_progress_as_gone() {
        let Some(url) = url() else { return };
        let readers = two_readers(&url, "leave-in-progress").await;
        let (pool, name) = (&readers.pool, &readers.name);
        let [first, second] = readers.held;
        let other = read_holders(pool, name)
            .await
            .into_iter()
            .find(|(_, token)| *token == token_of(&second))
            .expect("the second reader's row");
        let mut leaving = pool.begin().await.expect("begin");
        let leave = format!(
            "DELETE FROM {TABLE}_holders WHERE name = $1 AND owner = '{}'",
            other.0
        );
        on_name(&mut *leaving, leave, name, "leave").await;
        let release = tokio::spawn(first.release());
        tokio::time::sleep(Duration::from_millis(300)).await;
        let commit = async { leaving.commit().await.expect("commit the leave") };
        common::waits_then_releases(release, "the leave in progress", commit).await;
        a_writer_takes_at_once(
            &readers.clients[0],
            name,
            "the last reader's release left the name held",
        )
        .await;
        drop(second);
    }

    /// A guard's token as the row's `version` type.
    fn token_of(guard: &distlock_core::LockGuard) -> i64 {
        i64::try_from(guard.token().get()).expect("a token in bigint's range")
    }

    /// Clients of a lock table of their own (its sequence of readers' tokens too, which
    /// other tests' readers would otherwise draw from), and that table's name.
    async fn own_table(url: &str, prefix: &str) -> ([LockClient<SqlBackend>; 2], String) {
        let table = unique(prefix).replace('-', "_");
        let sep = if url.contains('?') { '&' } else { '?' };
        let url = format!("{url}{sep}table={table}");
        ([client(&url).await, client(&url).await], table)
    }

    /// Read holds with a 30 s ttl.
    fn reads() -> AcquireOptions {
        AcquireOptions::default()
            .with_ttl(Duration::from_secs(30))
            .shared()
    }

    /// The readers `held` release `name`; then a writer takes it at once, its token above
    /// every reader's, and releases it.
    async fn writer_above(
        client: &LockClient<SqlBackend>,
        name: &str,
        held: Vec<distlock_core::LockGuard>,
    ) {
        let top = held.iter().map(|g| g.token()).max().expect("readers");
        for g in held {
            g.release().await.expect("release");
        }
        let writer = client
            .try_acquire(name, &AcquireOptions::default())
            .await
            .expect("try")
            .expect("the readers left the name held");
        assert!(writer.token() > top, "a writer below a reader");
        writer.release().await.expect("release the writer");
    }

    /// Drops `table`, its holders, queue, sequence and functions.
    async fn drop_own_table(pool: &sqlx::PgPool, table: &str) {
        let functions = format!(
            "DO $$ DECLARE f regprocedure; BEGIN FOR f IN SELECT oid::regprocedure FROM pg_proc \
             WHERE proname LIKE '{table}\\_dl\\_%' LOOP EXECUTE 'DROP FUNCTION ' || f; END LOOP; END $$"
        );
        for sql in [
            format!("DROP TABLE IF EXISTS {table}_holders, {table}_queue, {table}"),
            format!("DROP SEQUENCE IF EXISTS {table}_dl_reads"),
            functions,
        ] {
            sqlx::query(AssertSqlSafe(sql))
                .execute(pool)
                .await
                .expect("drop the table");
        }
    }

    /// A reader beside a live reader joins with the row locked for share only (readers of
    /// one name took turns on its row, issue 44): it joins while another transaction holds
    /// the row for share, which a lock for update would wait for. Its token lies above the
    /// first reader's and below the row's version, which it leaves as it was, so a writer
    /// after both takes a larger one.
    #[tokio::test]
    async fn a_reader_joins_readers_without_locking_the_row_for_update() {
        let Some(url) = url() else { return };
        let ([a, b], table) = own_table(&url, "beside").await;
        let (pool, name, reads) = (common::pg(&a), unique("reader-joins"), reads());
        // The first reader of the name sets no range; the second, joining it, sets one.
        let first = a.acquire(&name, &reads).await.expect("first reader");
        let setter = b
            .acquire(&name, &reads)
            .await
            .expect("the reader that sets a range");
        let version = row(&pool, &table, &name).await.1;
        let tx = lock_row(&pool, &table, &name, "FOR SHARE").await;
        let second = tokio::time::timeout(Duration::from_secs(10), b.acquire(&name, &reads))
            .await
            .expect("the join waited for the name's row")
            .expect("second reader");
        tx.rollback().await.expect("rollback");
        assert_eq!(
            row(&pool, &table, &name).await.1,
            version,
            "the row changed"
        );
        assert!(
            first.token() < second.token() && token_of(&second) < version,
            "tokens {} then {}, row at {version}",
            first.token(),
            second.token()
        );
        writer_above(&a, &name, vec![first, setter, second]).await;
        drop_own_table(&pool, &table).await;
    }

    /// A reader's token stays between the writers when the readers' range is not the row's:
    /// after a join that moved the row's version without a range (a client of an earlier
    /// version), with the range used up, and with the sequence started again. Each such
    /// reader locks the row, takes a token above its version and sets a new range, which the
    /// next reader draws from without moving the row's version.
    #[tokio::test]
    async fn readers_take_no_token_out_of_their_range() {
        let Some(url) = url() else { return };
        let ([a, b], table) = own_table(&url, "ranges").await;
        let (pool, name, reads) = (common::pg(&a), unique("reader-range"), reads());
        let version = async || row(&pool, &table, &name).await.1;
        let alter = async |sql: String| on_name(&pool, sql, &name, "alter the row").await;
        let mut held = vec![a.acquire(&name, &reads).await.expect("first reader")];
        let spoilt = [
            // An earlier client's join: the next version as its token, the range as it was.
            format!("UPDATE {table} SET version = version + 1 WHERE name = $1"),
            // The range used up: every token drawn would reach the row's version.
            format!("UPDATE {table} SET read_base = version WHERE name = $1"),
            // The sequence started again: every token drawn would be below the range.
            format!("SELECT setval('{table}_dl_reads', 1) WHERE $1 IS NOT NULL"),
        ];
        for (i, sql) in spoilt.into_iter().enumerate() {
            alter(sql).await;
            let before = version().await;
            let taken = [&a, &b][i % 2]
                .acquire(&name, &reads)
                .await
                .expect("a reader after the range was spoilt");
            assert!(
                token_of(&taken) > before,
                "case {i}: a reader at {} below the row's version {before}",
                taken.token()
            );
            held.push(taken);
            let set = version().await;
            let beside = [&b, &a][i % 2]
                .acquire(&name, &reads)
                .await
                .expect("a reader of the new range");
            assert!(
                beside.token() > held[held.len() - 1].token() && token_of(&beside) < set,
                "case {i}: a reader at {} beside {}, row at {set}",
                beside.token(),
                held[held.len() - 1].token()
            );
            assert_eq!(
                version().await,
                set,
                "case {i}: the reader moved the version"
            );
            held.push(beside);
        }
        let mut tokens: Vec<_> = held.iter().map(|g| g.token()).collect();
        tokens.sort();
        tokens.dedup();
        assert_eq!(tokens.len(), held.len(), "two readers share a token");
        writer_above(&a, &name, held).await;
        drop_own_table(&pool, &table).await;
    }

    /// A reader whose draw falls out of the readers' range and that, the row locked for
    /// update, is refused (a writer reserved the name meanwhile) takes nothing: the token it
    /// drew is no answer.
    #[tokio::test]
    async fn a_refusal_after_a_spent_range_takes_no_token() {
        let Some(url) = url() else { return };
        let ([a, b], table) = own_table(&url, "spent").await;
        let (pool, name, reads) = (common::pg(&a), unique("spent-range"), reads());
        let first = a.acquire(&name, &reads).await.expect("first reader");
        let setter = a
            .acquire(&name, &reads)
            .await
            .expect("the reader that sets a range");
        // A token drawn falls below the range (a sequence started again), which only the draw
        // finds out.
        let spend = format!(
            "UPDATE {table} SET read_base = read_from - 1000000 - \
             (SELECT last_value FROM {table}_dl_reads) WHERE name = $1"
        );
        on_name(&pool, spend, &name, "spend the range").await;
        let mut tx = lock_row(&pool, &table, &name, "FOR SHARE").await;
        let joining = {
            let (b, name, reads) = (b, name.clone(), reads.clone());
            tokio::spawn(async move { (b.try_acquire(&name, &reads).await, b) })
        };
        // The join draws from the spent range, then waits to lock the row for update.
        let waiting = format!(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
             AND query LIKE '%{table}_dl_join_v11%'"
        );
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while sqlx::query_scalar::<_, i64>(AssertSqlSafe(waiting.clone()))
            .fetch_one(&pool)
            .await
            .expect("pg_stat_activity")
            == 0
        {
            assert!(
                std::time::Instant::now() < deadline,
                "the join never waited for the row"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let reserve = format!(
            "UPDATE {table} SET next_owner = 'a writer', next_since = 0, \
             next_expires = now() + interval '1 minute' WHERE name = $1"
        );
        on_name(&mut *tx, reserve, &name, "reserve the name").await;
        tx.commit().await.expect("commit");
        let (joined, _b) = joining.await.expect("join");
        assert!(
            joined.expect("the try").is_none(),
            "a reader refused behind a writer's reservation holds"
        );
        setter.release().await.expect("release");
        first.release().await.expect("release");
        drop_own_table(&pool, &table).await;
    }

    /// The release hands the lock to the waiter holding the reservation, in its own
    /// statement: the row goes from the holder to the waiter with the next version (never
    /// free in between), a `h<version>:` notification says so, and the waiter holds it with
    /// that version as its token, a renewable lease of its own ttl.
    #[tokio::test]
    async fn a_release_hands_the_lock_to_the_reserved_waiter() {
        let Some(url) = url() else { return };
        let Queued {
            pool,
            name,
            held,
            waiter,
            next,
            _clients: _alive,
        } = queued(&url, "handover", Duration::from_secs(3)).await;
        let table = TABLE;
        let mut listener = common::listen(&pool, table).await;
        let token = held.token();
        held.release().await.expect("release");
        let (owner, version, next_owner, _) = row(&pool, table, &name).await;
        assert_eq!(owner.as_deref(), Some(next.as_str()), "not handed over");
        assert_eq!(version, i64::try_from(token.get()).expect("token") + 1);
        assert_eq!(next_owner, None, "the reservation outlived the hand-over");
        let got = common::granted(waiter).await;
        assert_eq!(got.token().get(), token.get() + 1, "not the handed version");
        let expected = format!("h{version}:{}:{next}{name}", next.len());
        assert_eq!(common::next_note(&mut listener, &name).await, expected);
        // The lease is the waiter's own: renewed past the ttl, then released.
        tokio::time::sleep(Duration::from_secs(4)).await;
        assert!(!got.is_lost(), "the handed lease was not renewed");
        got.renew().await.expect("renew the handed lease");
        got.release().await.expect("release the handed lease");
        assert_eq!(row(&pool, table, &name).await.0, None);
    }

    /// A hand-over notification that comes late (its version is not above the holder's the
    /// waiter last saw, so the lock has moved on since) grants nothing: the waiter keeps
    /// waiting, and gets the lock from the real release.
    #[tokio::test]
    async fn a_late_hand_over_notification_grants_nothing() {
        let Some(url) = url() else { return };
        let Queued {
            pool,
            name,
            held,
            waiter,
            next,
            _clients: _alive,
        } = queued(&url, "late-note", Duration::from_secs(5)).await;
        let table = TABLE;
        // Let the waiter read the row (and the holder's version) after it reserved.
        tokio::time::sleep(Duration::from_millis(400)).await;
        let token = held.token();
        let version = i64::try_from(token.get()).expect("token");
        let late = format!("h{version}:{}:{next}{name}", next.len());
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(format!("distlock:{table}"))
            .bind(&late)
            .execute(&pool)
            .await
            .expect("notify");
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !waiter.is_finished(),
            "a late notification granted the lock"
        );
        held.release().await.expect("release");
        let got = common::granted(waiter).await;
        assert_eq!(got.token().get(), token.get() + 1);
        got.release().await.expect("release");
    }

    /// A hand-over whose notification never arrives: the waiter finds the row its own on its
    /// next look, and holds it with that version (no second take), for what is left of it.
    #[tokio::test]
    async fn a_handed_lock_whose_notification_was_lost_is_found() {
        let Some(url) = url() else { return };
        let Queued {
            pool,
            name,
            held,
            waiter,
            _clients: _alive,
            ..
        } = queued(&url, "lost-note", Duration::from_secs(3)).await;
        let table = TABLE;
        // What the release does, without its notification.
        let hand = format!(
            "UPDATE {table} SET owner = next_owner, version = version + 1, \
             expires_at = now() + next_ttl * interval '1 microsecond', next_owner = NULL, \
             next_since = NULL, next_expires = NULL, next_ttl = NULL WHERE name = $1 \
             RETURNING version"
        );
        let version: i64 = sqlx::query_scalar(AssertSqlSafe(hand))
            .bind(&name)
            .fetch_one(&pool)
            .await
            .expect("hand over");
        let got = common::granted(waiter).await;
        assert_eq!(
            i64::try_from(got.token().get()).expect("token"),
            version,
            "taken again instead of found"
        );
        assert_eq!(row(&pool, table, &name).await.1, version);
        drop(held);
        got.release().await.expect("release the found lease");
    }

    /// A lock table of an earlier version (no `next_ttl`) gets the column when the client
    /// may create tables; without that right, its releases free the lock as before, and the
    /// waiters still get it.
    #[tokio::test]
    async fn a_table_without_the_hand_over_column() {
        let Some(url) = url() else { return };
        for create in [true, false] {
            let table = unique("old_locks");
            let admin = common::pg(&client(&url).await);
            let old = format!(
                "CREATE TABLE {table} (name TEXT COLLATE \"C\" PRIMARY KEY, owner TEXT, \
                 version BIGINT NOT NULL, expires_at TIMESTAMPTZ NOT NULL, next_owner TEXT, \
                 next_since BIGINT, next_expires TIMESTAMPTZ)"
            );
            sqlx::query(AssertSqlSafe(old))
                .execute(&admin)
                .await
                .expect("old table");
            let sep = if url.contains('?') { '&' } else { '?' };
            let with = format!("{url}{sep}table={table}&create_table={create}");
            let (a, b) = (client(&with).await, client(&with).await);
            let name = unique("old");
            let opts = AcquireOptions::default().with_ttl(Duration::from_secs(3));
            let held = a.acquire(&name, &opts).await.expect("a acquires");
            let waiter = waiting(&b, &name, &opts);
            let columns: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_attribute WHERE attrelid = to_regclass($1) \
                 AND attname = 'next_ttl'",
            )
            .bind(&table)
            .fetch_one(&admin)
            .await
            .expect("columns");
            assert_eq!(columns, i64::from(create), "create_table={create}");
            tokio::time::sleep(Duration::from_millis(200)).await;
            let token = held.token();
            held.release().await.expect("release");
            let got = common::granted(waiter).await;
            assert!(got.token() > token);
            got.release().await.expect("release");
            let drop_table = format!("DROP TABLE {table}");
            sqlx::query(AssertSqlSafe(drop_table))
                .execute(&admin)
                .await
                .expect("drop");
        }
    }

    /// Once the tables are complete, a connect and a first shared hold only read the
    /// catalog: they do not wait for the advisory lock that serializes creating them (held
    /// here by a session stuck in its set-up, as a client stopped mid-connect would leave it).
    #[tokio::test]
    async fn a_complete_table_is_not_set_up_again() {
        let Some(url) = url() else { return };
        let table = unique("complete");
        let sep = if url.contains('?') { '&' } else { '?' };
        let with = format!("{url}{sep}table={table}");
        let first = client(&with).await;
        let opts = AcquireOptions::default().with_ttl(Duration::from_secs(5));
        first
            .acquire(&unique("readers"), &opts.clone().shared())
            .await
            .expect("first shared hold creates the holders table")
            .release()
            .await
            .expect("release");
        let admin = common::pg(&first);
        let mut stuck = admin.begin().await.expect("begin");
        sqlx::query("SELECT pg_advisory_xact_lock(7283160942917)")
            .execute(&mut *stuck)
            .await
            .expect("the set-up lock");
        let within = Duration::from_secs(5);
        let next = tokio::time::timeout(
            within,
            distlock_sql::connect(&with, ClientConfig::default()),
        )
        .await
        .expect("a connect waited for the set-up lock")
        .expect("connect");
        tokio::time::timeout(within, async {
            let reader = next
                .acquire(&unique("readers"), &opts.clone().shared())
                .await;
            reader.expect("shared").release().await.expect("release");
        })
        .await
        .expect("a first shared hold waited for the set-up lock");
        stuck.rollback().await.expect("rollback");
        let drop_tables = format!("DROP TABLE IF EXISTS {table}, {table}_holders, {table}_queue");
        sqlx::query(AssertSqlSafe(drop_tables))
            .execute(&admin)
            .await
            .expect("drop");
    }

    /// A role `user` that may read and write the lock tables `t` (and call their functions).
    fn a_role_on_the_tables(user: &str, password: &str, t: &str) -> Vec<String> {
        vec![
            format!("CREATE ROLE {user} LOGIN PASSWORD '{password}'"),
            format!(
                "GRANT SELECT, INSERT, UPDATE, DELETE ON {t}, {t}_holders, {t}_queue TO {user}"
            ),
        ]
    }

    /// Drops the role `user` and its grants.
    fn drop_role(user: &str) -> Vec<String> {
        vec![format!("DROP OWNED BY {user}"), format!("DROP ROLE {user}")]
    }

    #[tokio::test]
    async fn a_user_who_may_not_create_tables() {
        let Some(url) = url() else { return };
        a_user_of_existing_tables(&url, a_role_on_the_tables, drop_role).await;
    }

    /// A role that may draw from the sequence of readers' tokens but not read it (`USAGE`
    /// without `SELECT`) draws nothing: its joins and hand-overs lock the name's row, as a
    /// role without the sequence does. With `_v11` as first written, its first hand-over set
    /// a range of tokens, and every permit waiter's refusal after it read the sequence and
    /// failed.
    #[tokio::test]
    async fn a_user_who_may_draw_but_not_read_the_sequence() {
        let Some(url) = url() else { return };
        let (admin, table, user, as_user) =
            a_user_on_a_new_table(&url, "usage_only", |user, password, t| {
                let mut made = a_role_on_the_tables(user, password, t);
                made.push(format!("GRANT USAGE ON SEQUENCE {t}_dl_reads TO {user}"));
                made
            })
            .await;
        let pool = admin.backend_ref().pool();
        let opts = AcquireOptions::default()
            .with_ttl(Duration::from_secs(10))
            .with_wait(Duration::from_secs(20));
        let connect = || distlock_sql::connect(as_user.as_str(), ClientConfig::default());
        let (a, b, c) = (
            connect().await.expect("connect"),
            connect().await.expect("connect"),
            connect().await.expect("connect"),
        );
        let (name, permit) = (unique("permit"), opts.with_permits(1));
        let pg = common::pg(&admin);
        let wait = |client: distlock_core::LockClient<SqlBackend>| {
            let (name, permit) = (name.clone(), permit.clone());
            tokio::spawn(async move { client.acquire(&name, &permit).await })
        };
        let held = a.acquire(&name, &permit).await.expect("a permit");
        let second = wait(b);
        places(&pg, &table, &name, 1, 1).await;
        held.release().await.expect("release");
        let second = common::granted(second).await;
        let third = wait(c);
        places(&pg, &table, &name, 1, 1).await;
        second.release().await.expect("release the handed permit");
        let third = common::granted(third).await;
        third.release().await.expect("release");
        for statement in drop_role(&user) {
            exec(&pool, statement).await;
        }
        let drop_tables = format!("DROP TABLE IF EXISTS {table}, {table}_holders, {table}_queue");
        exec(&pool, drop_tables).await;
    }

    /// A role that may not call the hand-over of a read hold (`EXECUTE` revoked from
    /// `PUBLIC`) still releases what it holds: its exclusive release, which otherwise names
    /// that function, does not then (every release failed, each lock held until its ttl).
    #[tokio::test]
    async fn a_user_who_may_not_hand_reads_over() {
        let Some(url) = url() else { return };
        a_user_of_existing_tables(
            &url,
            |user, password, t| {
                let mut made = a_role_on_the_tables(user, password, t);
                made.push(format!(
                    "REVOKE EXECUTE ON FUNCTION {t}_dl_hand_read_v11(text, text, bigint) \
                     FROM PUBLIC"
                ));
                made
            },
            drop_role,
        )
        .await;
    }

    /// A role whose own schema comes first on its search path gets tables of its own there,
    /// though another role's complete tables of the same name are in `public` (which it may
    /// not write): the set-up looks for them where its `CREATE` would make them, not
    /// anywhere on the path.
    #[tokio::test]
    async fn a_role_with_a_schema_of_its_own() {
        let Some(url) = url() else { return };
        a_user_of_existing_tables(
            &url,
            |user, password, _| {
                vec![
                    format!("CREATE ROLE {user} LOGIN PASSWORD '{password}'"),
                    format!("CREATE SCHEMA {user} AUTHORIZATION {user}"),
                ]
            },
            |user| {
                vec![
                    format!("DROP SCHEMA {user} CASCADE"),
                    format!("DROP OWNED BY {user}"),
                    format!("DROP ROLE {user}"),
                ]
            },
        )
        .await;
    }

    #[tokio::test]
    async fn data_ends_with_the_hold() {
        let Some(url) = url() else { return };
        the_data_ends_with_the_hold(&url).await;
    }

    #[tokio::test]
    async fn old_table_without_the_data_column() {
        let Some(url) = url() else { return };
        a_table_without_the_data_column(&url, |t| {
            [
                format!(
                    "CREATE TABLE {t} (name TEXT COLLATE \"C\" PRIMARY KEY, owner TEXT, \
                     version BIGINT NOT NULL, expires_at TIMESTAMPTZ NOT NULL, next_owner TEXT, \
                     next_since BIGINT, next_expires TIMESTAMPTZ, next_ttl BIGINT)"
                ),
                format!(
                    "CREATE TABLE {t}_holders (name TEXT COLLATE \"C\" NOT NULL, \
                     owner TEXT NOT NULL, token BIGINT NOT NULL, expires_at TIMESTAMPTZ NOT NULL, \
                     permits BIGINT NOT NULL, PRIMARY KEY (name, owner))"
                ),
            ]
        })
        .await;
    }

    #[tokio::test]
    async fn missing_database_and_unreachable_server() {
        let Some(url) = url() else { return };
        let base = url.rsplit_once('/').map(|(b, _)| b).unwrap_or(&url);
        match distlock_sql::connect(
            &format!("{base}/no_such_db_distlock"),
            ClientConfig::default(),
        )
        .await
        {
            Err(Error::Backend { message, .. }) => {
                assert!(message.contains("no_such_db_distlock"), "{message}")
            }
            other => panic!("missing database: {other:?}"),
        }
        let config = ClientConfig::default().with_operation_timeout(Duration::from_millis(500));
        let started = std::time::Instant::now();
        match distlock_sql::connect("postgres://postgres@127.0.0.1:1/distlock", config).await {
            Err(Error::Unavailable { .. }) => {}
            other => panic!("unreachable server: {other:?}"),
        }
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "took {:?}",
            started.elapsed()
        );
    }
}

#[cfg(feature = "mysql")]
mod mysql {
    use super::*;

    fn url() -> Option<String> {
        conformance_tests::server_var("mysql", "DISTLOCK_TEST_MYSQL_URL")
    }

    /// The row of `name`: `(owner, version, next_owner)`.
    async fn row(pool: &sqlx::MySqlPool, name: &str) -> (Option<String>, i64, Option<String>) {
        sqlx::query_as(
            "SELECT CAST(owner AS CHAR), version, CAST(next_owner AS CHAR) \
             FROM distlock_locks WHERE name = ?",
        )
        .bind(name)
        .fetch_one(pool)
        .await
        .unwrap_or_else(|e| panic!("read {name}: {e}"))
    }

    /// The wake lock of the holder of `name` (in table `distlock_locks`) with `version`: the
    /// documented FNV-1a of `<table>\0<name>` (see `wake_prefix` in `src/wake.rs`).
    fn wake_lock(name: &str, version: i64) -> String {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in "distlock_locks".bytes().chain([0]).chain(name.bytes()) {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
        format!("distlock:{hash:016x}:{version}")
    }

    /// `client`'s hold of `name` taken with a wake lock: the first take inserts the row (no
    /// wake lock), so it is released and taken again.
    async fn held_with_wake_lock(
        client: &LockClient<SqlBackend>,
        name: &str,
        opts: &AcquireOptions,
    ) -> distlock_core::LockGuard {
        let first = client.acquire(name, opts).await.expect("first acquire");
        first.release().await.expect("release");
        client.acquire(name, opts).await.expect("acquire")
    }

    /// A hand-over whose wake-up never comes (the holder's wake lock is not given up): the
    /// waiter finds the row its own on its next read, holds it with that version, and takes
    /// its own wake lock, so that the waiter after it can wait on the server again.
    #[tokio::test]
    async fn a_handed_lock_found_by_reading_takes_its_wake_lock() {
        let Some(url) = url() else { return };
        let (a, b) = (client(&url).await, client(&url).await);
        let pool = common::my(&a);
        let name = unique("found");
        let opts = AcquireOptions::default().with_ttl(Duration::from_secs(5));
        let held = held_with_wake_lock(&a, &name, &opts).await;
        let waiter = waiting(&b, &name, &opts);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while row(&pool, &name).await.2.is_none() {
            assert!(std::time::Instant::now() < deadline, "nobody reserved");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // What the release does, without giving the holder's wake lock up.
        let version: i64 = {
            sqlx::query(
                "UPDATE distlock_locks SET owner = next_owner, version = version + 1, \
                 expires_at = UTC_TIMESTAMP(6) + INTERVAL next_ttl MICROSECOND, next_owner = NULL, \
                 next_since = NULL, next_expires = NULL, next_ttl = NULL WHERE name = ?",
            )
            .bind(&name)
            .execute(&pool)
            .await
            .expect("hand over");
            row(&pool, &name).await.1
        };
        let got = tokio::time::timeout(Duration::from_secs(8), waiter)
            .await
            .expect("the waiter found the lock in time")
            .expect("task")
            .expect("acquire");
        assert_eq!(
            i64::try_from(got.token().get()).expect("token"),
            version,
            "taken again instead of found"
        );
        let used: Option<i64> = sqlx::query_scalar("SELECT IS_USED_LOCK(?)")
            .bind(wake_lock(&name, version))
            .fetch_one(&pool)
            .await
            .expect("IS_USED_LOCK");
        assert!(used.is_some(), "the found lock has no wake lock");
        drop(held);
        got.release().await.expect("release");
    }

    /// A reader joining live readers locks the name's row only to step its version (join
    /// `_v4`), and touches no other holder's row: it joins while another transaction holds
    /// every holder row of the name locked (as leaving readers' releases do, each its own).
    /// The join before `_v4` locked the name's row first and purged the name's holder rows
    /// under it, so it waited for those locks (`innodb_lock_wait_timeout`, 50 s by default).
    #[tokio::test]
    async fn a_reader_joins_past_locked_holder_rows() {
        let Some(url) = url() else { return };
        let (a, b, c) = (client(&url).await, client(&url).await, client(&url).await);
        let pool = common::my(&a);
        let name = unique("readers_past");
        let opts = AcquireOptions::default()
            .with_ttl(Duration::from_secs(10))
            .shared();
        let first = a.acquire(&name, &opts).await.expect("first reader");
        let second = b.acquire(&name, &opts).await.expect("second reader");
        // At the isolation the releases run at: the rows locked, not the gaps between them
        // (a new holder row's insert waits for a gap lock of repeatable read).
        let mut conn = pool.acquire().await.expect("connection").detach();
        sqlx::query("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
            .execute(&mut conn)
            .await
            .expect("read committed");
        let mut tx = sqlx::Connection::begin(&mut conn).await.expect("begin");
        let locked: Vec<String> = sqlx::query_scalar(
            "SELECT CAST(owner AS CHAR) FROM distlock_locks_holders WHERE name = ? FOR UPDATE",
        )
        .bind(&name)
        .fetch_all(&mut *tx)
        .await
        .expect("lock the holder rows");
        assert_eq!(locked.len(), 2, "two holder rows locked");
        let third = tokio::time::timeout(Duration::from_secs(5), c.acquire(&name, &opts))
            .await
            .expect("the third reader joined while the holder rows were locked")
            .expect("third reader");
        assert!(
            third.token() > second.token() && second.token() > first.token(),
            "tokens did not increase: {:?}, {:?}, {:?}",
            first.token(),
            second.token(),
            third.token()
        );
        tx.rollback().await.expect("rollback");
        for guard in [first, second, third] {
            guard.release().await.expect("release");
        }
        assert_eq!(row(&pool, &name).await.0, None, "the name is free again");
    }

    /// The release hands the lock to the waiter holding the reservation (which waits on the
    /// holder's wake lock): the row goes from the holder to the waiter with the next version,
    /// and the waiter holds it with that token; then it hands it on the same way.
    #[tokio::test]
    async fn a_release_hands_the_lock_to_the_reserved_waiter() {
        let Some(url) = url() else { return };
        let clients = [client(&url).await, client(&url).await, client(&url).await];
        let pool = common::my(&clients[0]);
        let name = unique("handover");
        let opts = AcquireOptions::default().with_ttl(Duration::from_secs(3));
        let mut held = clients[0].acquire(&name, &opts).await.expect("acquire");
        for next in &clients[1..] {
            let waiter = waiting(next, &name, &opts);
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            let reserved = loop {
                if let (_, _, Some(next)) = row(&pool, &name).await {
                    break next;
                }
                assert!(std::time::Instant::now() < deadline, "nobody reserved");
                tokio::time::sleep(Duration::from_millis(5)).await;
            };
            // Let the waiter start its wait on the holder's wake lock.
            tokio::time::sleep(Duration::from_millis(100)).await;
            let token = held.token();
            held.release().await.expect("release");
            let (owner, version, next_owner) = row(&pool, &name).await;
            assert_eq!(owner.as_deref(), Some(reserved.as_str()), "not handed over");
            assert_eq!(version, i64::try_from(token.get()).expect("token") + 1);
            assert_eq!(next_owner, None);
            held = common::granted(waiter).await;
            assert_eq!(
                held.token().get(),
                token.get() + 1,
                "not the handed version"
            );
            assert!(!held.is_lost());
        }
        held.release().await.expect("release");
        assert_eq!(row(&pool, &name).await.0, None);
    }

    /// Whether a connection holds the wake lock `lock`, asked every 50 ms for 2 s until the
    /// answer is `held` (a closed connection's locks go when the server notices the close).
    async fn wake_lock_held(pool: &sqlx::MySqlPool, lock: &str, held: bool) -> bool {
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        loop {
            let used: Option<i64> = sqlx::query_scalar("SELECT IS_USED_LOCK(?)")
                .bind(lock)
                .fetch_one(pool)
                .await
                .expect("IS_USED_LOCK");
            if used.is_some() == held || std::time::Instant::now() >= deadline {
                return used.is_some();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `release_hold` run by the holder's own client, whose pinned connection holds the wake
    /// lock that a waiter waits for on the server: a wrong token leaves the connection pinned
    /// with its wake lock (not back in the pool still holding it), the right pair releases
    /// the row and gives the wake lock up at once, as the holder's release would, not at the
    /// holder's next renewal; the waiter gets the lock.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn release_hold_gives_the_holders_wake_lock_up() {
        let Some(url) = url() else { return };
        let (a, b) = (client(&url).await, client(&url).await);
        let pool = common::my(&a);
        let name = unique("by-token");
        let opts = AcquireOptions::default().with_ttl(Duration::from_secs(10));
        let held = held_with_wake_lock(&a, &name, &opts).await;
        let version = i64::try_from(held.token().get()).expect("token");
        let lock = wake_lock(&name, version);
        assert!(
            wake_lock_held(&pool, &lock, true).await,
            "no wake lock taken"
        );
        let waiter = waiting(&b, &name, &opts);
        let wrong = distlock_core::FencingToken::new(held.token().get() + 1);
        assert!(
            !a.release_hold(&name, held.owner(), wrong)
                .await
                .expect("release_hold"),
            "a wrong token released the lock"
        );
        held.renew().await.expect("the holder holds");
        assert!(!waiter.is_finished(), "the waiter got a held lock");
        // The wake lock is still the pinned connection's: the holder's release gives it up.
        assert!(
            a.release_hold(&name, held.owner(), held.token())
                .await
                .expect("release_hold"),
            "the pair released nothing"
        );
        assert!(
            !wake_lock_held(&pool, &lock, false).await,
            "the wake lock is still held after release_hold"
        );
        let next = common::granted(waiter).await;
        assert!(next.token() > held.token());
        assert!(matches!(
            held.renew().await,
            Err(Error::NotHeld { .. } | Error::Lost { .. })
        ));
        next.release().await.expect("release");
    }

    #[tokio::test]
    async fn fenced_write() {
        let Some(url) = url() else { return };
        fenced_write_rejects_stale_token(&url).await;
    }

    #[tokio::test]
    async fn inspect() {
        let Some(url) = url() else { return };
        inspect_shows_holder(&url).await;
    }

    #[tokio::test]
    async fn valid_until() {
        let Some(url) = url() else { return };
        not_taken_before_valid_until(&url).await;
    }

    #[tokio::test]
    async fn wrong_shape() {
        let Some(url) = url() else { return };
        wrong_shape_is_reported(&url).await;
    }

    /// How many of `client`'s connections wait in `GET_LOCK` on the server.
    async fn waiting_in_get_lock(admin: &sqlx::MySqlPool, client: &LockClient<SqlBackend>) -> i64 {
        let ids = client.backend_ref().session_ids();
        let list = ids.iter().map(i64::to_string).collect::<Vec<_>>().join(",");
        let sql = format!(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
             WHERE STATE = 'User lock' AND ID IN ({list})"
        );
        sqlx::query_scalar(AssertSqlSafe(sql))
            .fetch_one(admin)
            .await
            .unwrap_or_else(|e| panic!("processlist: {e}"))
    }

    /// Asks `count` every 100 ms, at most `tries` times, until it answers 0: its last answer.
    async fn until_zero<F: std::future::Future<Output = i64>>(
        tries: u32,
        mut count: impl FnMut() -> F,
    ) -> i64 {
        let mut last = count().await;
        for _ in 1..tries {
            if last == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            last = count().await;
        }
        last
    }

    /// The reserved waiter waits for the holder's wake lock on the server and takes the lock
    /// when it is given up; a waiter cancelled mid-wait leaves no statement waiting there and
    /// no reservation behind.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn waiter_waits_on_the_wake_lock_and_cancels_cleanly() {
        let Some(url) = url() else { return };
        let (a, b) = (client(&url).await, client(&url).await);
        let admin = sqlx::MySqlPool::connect(&url).await.expect("admin pool");
        let name = unique("wake");
        let opts = AcquireOptions::default()
            .with_ttl(Duration::from_secs(10))
            .with_wait(Duration::from_secs(10));
        let held = held_with_wake_lock(&a, &name, &opts).await;
        let waiter = waiting(&b, &name, &opts);
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(
            waiting_in_get_lock(&admin, &b).await,
            1,
            "no wait on the server"
        );
        held.release().await.expect("release");
        let taken = tokio::time::timeout(Duration::from_secs(2), waiter)
            .await
            .expect("the waiter was not woken")
            .expect("join")
            .expect("acquire");
        let token = taken.token();

        // Cancelled mid-wait: the wait is killed on the server, the reservation dropped.
        let cancelled = tokio::time::timeout(Duration::from_millis(500), a.acquire(&name, &opts));
        assert!(cancelled.await.is_err(), "acquired a held lock");
        // Within a second: an unkilled wait would run on for its bound of 2 s.
        let left = until_zero(10, || waiting_in_get_lock(&admin, &a)).await;
        assert_eq!(left, 0, "a cancelled wait still runs on the server");
        // The clean-up runs in the background (the contract of a dropped `acquire`), after the
        // wait is killed: within a generous bound (5 s), the reservation is cleared, not merely
        // expired (an expired one keeps its `next_owner`).
        let reserved = until_zero(50, || async {
            sqlx::query_scalar::<_, i64>(
                "SELECT COUNT(*) FROM distlock_locks WHERE name = ? AND next_owner IS NOT NULL",
            )
            .bind(&name)
            .fetch_one(&admin)
            .await
            .expect("reservation")
        })
        .await;
        assert_eq!(
            reserved, 0,
            "the cancelled waiter's reservation was not removed"
        );
        taken.release().await.expect("release");
        let again = b
            .try_acquire(&name, &opts)
            .await
            .expect("try_acquire")
            .expect("a reservation of the cancelled waiter refused the lock");
        assert!(again.token() > token);
        again.release().await.expect("release");
    }

    /// Waits (every 20 ms, at most 5 s) until `client` has `n` connections waiting in
    /// `GET_LOCK`; fails otherwise.
    async fn until_waiting(admin: &sqlx::MySqlPool, client: &LockClient<SqlBackend>, n: i64) {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while waiting_in_get_lock(admin, client).await != n {
            assert!(
                std::time::Instant::now() < deadline,
                "no wait on the server"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A reader's join takes the reader's wake lock (procedure `_v3`) on a connection that
    /// stays with the hold; the writer waiting at the head for that reader waits on the server
    /// for it, the reader's release gives it up, and the writer takes; a reader refused behind
    /// that writer (the head of the queue) waits on the writer's wake lock and joins after its
    /// release.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn writers_and_readers_wait_on_each_others_wake_locks() {
        let Some(url) = url() else { return };
        let (a, b, c) = (client(&url).await, client(&url).await, client(&url).await);
        let admin = sqlx::MySqlPool::connect(&url).await.expect("admin pool");
        let name = unique("rw-wake");
        let ttl = Duration::from_secs(10);
        let write = AcquireOptions::default().with_ttl(ttl).with_wait(ttl);
        let read = write.clone().shared();
        let reader = a.acquire(&name, &read).await.expect("read");
        let lock = wake_lock(&name, i64::try_from(reader.token().get()).expect("token"));
        assert!(
            wake_lock_held(&admin, &lock, true).await,
            "the reader took no wake lock"
        );
        let writer = waiting(&b, &name, &write);
        until_waiting(&admin, &b, 1).await;
        reader.release().await.expect("release");
        assert!(
            !wake_lock_held(&admin, &lock, false).await,
            "the reader's release kept its wake lock"
        );
        let held = common::granted_within(writer, Duration::from_secs(2)).await;
        let next = waiting(&c, &name, &read);
        until_waiting(&admin, &c, 1).await;
        let token = held.token();
        held.release().await.expect("release");
        let joined = common::granted_within(next, Duration::from_secs(2)).await;
        assert!(joined.token() > token);
        joined.release().await.expect("release");
    }

    /// Two clients, each holding a read hold (ttl 30 s) of a new name, and a pool of the
    /// test's own.
    async fn two_readers(
        url: &str,
        prefix: &str,
    ) -> (
        [LockClient<SqlBackend>; 2],
        sqlx::MySqlPool,
        String,
        [distlock_core::LockGuard; 2],
    ) {
        let clients = [client(url).await, client(url).await];
        let admin = sqlx::MySqlPool::connect(url).await.expect("admin pool");
        let name = unique(prefix);
        let reads = AcquireOptions::default()
            .with_ttl(Duration::from_secs(30))
            .shared();
        let first = clients[0].acquire(&name, &reads).await.expect("first");
        let second = clients[1].acquire(&name, &reads).await.expect("second");
        (clients, admin, name, [first, second])
    }

    /// Whether a writer takes `name` at once (released again if so).
    async fn a_writer_takes(client: &LockClient<SqlBackend>, name: &str) -> bool {
        let writer = client
            .try_acquire(name, &AcquireOptions::default())
            .await
            .expect("try");
        match writer {
            Some(writer) => {
                writer.release().await.expect("release the writer");
                true
            }
            None => false,
        }
    }

    /// A reader's release that leaves another reader holding does not lock the name's row
    /// (procedure `_v4`; readers of one name took turns on it, issue 44): it leaves while
    /// another transaction holds that row. The last reader's release frees the name.
    #[tokio::test]
    async fn a_reader_leaves_without_the_names_row() {
        let Some(url) = url() else { return };
        let ([a, _b], admin, name, [first, second]) = two_readers(&url, "reader-leaves").await;
        let mut tx = admin.begin().await.expect("begin");
        lock_name_row(&mut tx, &name).await;
        leave_while_locked(tx, first, "the name's row").await;
        the_last_reader_frees(&a, &name, second).await;
    }

    /// `reader` releases within 10 s while `tx` holds `what` locked, which `tx` then lets go.
    async fn leave_while_locked(
        tx: sqlx::Transaction<'_, sqlx::MySql>,
        reader: distlock_core::LockGuard,
        what: &str,
    ) {
        tokio::time::timeout(Duration::from_secs(10), reader.release())
            .await
            .unwrap_or_else(|_| panic!("the release waited for {what}"))
            .expect("release");
        tx.rollback().await.expect("rollback");
    }

    /// The name is still read (a writer cannot take it) until `last`, its last reader,
    /// releases: then `client` takes it at once.
    async fn the_last_reader_frees(
        client: &LockClient<SqlBackend>,
        name: &str,
        last: distlock_core::LockGuard,
    ) {
        assert!(!a_writer_takes(client, name).await, "a reader's hold ended");
        last.release().await.expect("the last reader's release");
        assert!(
            a_writer_takes(client, name).await,
            "the last reader's release left the name held"
        );
    }

    /// A reader's release that finds the other holder's row locked (by that holder's own
    /// release, say) may be the last: it locks the name's row (free here, so in the same
    /// transaction) and finds that holder still there, so the name stays read; that
    /// holder's release then frees it.
    #[tokio::test]
    async fn a_reader_that_may_be_last_counts_again() {
        let Some(url) = url() else { return };
        let ([a, _b], admin, name, [first, second]) = two_readers(&url, "may-be-last").await;
        let mut tx = admin.begin().await.expect("begin");
        lock_holder_row(&mut tx, &name, &second).await;
        leave_while_locked(tx, first, "the other holder's row").await;
        the_last_reader_frees(&a, &name, second).await;
    }

    /// `tx` locks the holder row of `holder` of `name` (which must exist).
    async fn lock_holder_row(
        tx: &mut sqlx::Transaction<'_, sqlx::MySql>,
        name: &str,
        holder: &distlock_core::LockGuard,
    ) {
        let found: Option<i64> = sqlx::query_scalar(
            "SELECT token FROM distlock_locks_holders WHERE name = ? AND owner = ? FOR UPDATE",
        )
        .bind(name)
        .bind(holder.owner())
        .fetch_optional(&mut **tx)
        .await
        .expect("lock the other holder's row");
        assert!(found.is_some(), "no holder row of {}", holder.owner());
    }

    /// `tx` locks the lock row of `name`.
    async fn lock_name_row(tx: &mut sqlx::Transaction<'_, sqlx::MySql>, name: &str) {
        sqlx::query("SELECT version FROM distlock_locks WHERE name = ? FOR UPDATE")
            .bind(name)
            .fetch_one(&mut **tx)
            .await
            .expect("lock the name's row");
    }

    /// `tx` locks the holder row of `holder` of `name`, then the name's row.
    async fn lock_holder_and_name(
        tx: &mut sqlx::Transaction<'_, sqlx::MySql>,
        name: &str,
        holder: &distlock_core::LockGuard,
    ) {
        lock_holder_row(tx, name, holder).await;
        lock_name_row(tx, name).await;
    }

    /// Whether `owner` still has its holder row of `name`.
    async fn has_holder_row(pool: &sqlx::MySqlPool, name: &str, owner: &str) -> bool {
        sqlx::query_scalar::<_, i64>(
            "SELECT COUNT(*) FROM distlock_locks_holders WHERE name = ? AND owner = ?",
        )
        .bind(name)
        .bind(owner)
        .fetch_one(pool)
        .await
        .expect("holder rows")
            > 0
    }

    /// A reader's release that may be the last while another transaction holds the name's
    /// row commits its leave (seen gone at once) and waits for that row in a second
    /// transaction of the same call, which answers once the row is let go; the name stays
    /// read by the other reader, whose release frees it.
    #[tokio::test]
    async fn a_reader_that_may_be_last_waits_for_the_row_after_leaving() {
        let Some(url) = url() else { return };
        let ([a, _b], admin, name, [first, second]) = two_readers(&url, "leaves-waits").await;
        let mut tx = admin.begin().await.expect("begin");
        lock_holder_and_name(&mut tx, &name, &second).await;
        let before = first.owner().to_owned();
        let release = tokio::spawn(async move { first.release().await });
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while has_holder_row(&admin, &name, &before).await {
            assert!(
                std::time::Instant::now() < deadline,
                "the leave was not committed while the release waited for the name's row"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let rollback = async { tx.rollback().await.expect("rollback") };
        common::waits_then_releases(release, "the name's row", rollback).await;
        the_last_reader_frees(&a, &name, second).await;
    }

    /// An error in the second transaction (here a lock wait timeout of 1 s on the name's
    /// row) after the leave committed answers that the hold was released: it is gone, and a
    /// caller told otherwise would call again and be told it held nothing.
    #[tokio::test]
    async fn an_error_after_the_leave_still_answers_released() {
        let Some(url) = url() else { return };
        let ([_a, _b], admin, name, [first, second]) = two_readers(&url, "leave-error").await;
        let mut tx = admin.begin().await.expect("begin");
        lock_holder_and_name(&mut tx, &name, &second).await;
        let mut conn = admin.acquire().await.expect("a connection");
        sqlx::query("SET SESSION innodb_lock_wait_timeout = 1")
            .execute(&mut *conn)
            .await
            .expect("lock wait timeout");
        let token = i64::try_from(first.token().get()).expect("token");
        let answers: Vec<i64> = sqlx::query_scalar(
            "CALL distlock_locks_dl_release_v7(?, ?, CONCAT(CHAR(1), 'shared'), ?, false, NULL)",
        )
        .bind(&name)
        .bind(first.owner())
        .bind(token)
        .fetch_all(&mut *conn)
        .await
        .expect("the call answered an error");
        assert_eq!(answers, [1], "the answer");
        assert!(
            !has_holder_row(&admin, &name, first.owner()).await,
            "the leave was undone"
        );
        assert!(
            has_holder_row(&admin, &name, second.owner()).await,
            "the other reader left"
        );
        tx.rollback().await.expect("rollback");
        drop(conn);
        second.release().await.expect("the other reader's release");
    }

    #[tokio::test]
    async fn data_ends_with_the_hold() {
        let Some(url) = url() else { return };
        the_data_ends_with_the_hold(&url).await;
    }

    #[tokio::test]
    async fn old_table_without_the_data_column() {
        let Some(url) = url() else { return };
        a_table_without_the_data_column(&url, |t| {
            [
                format!(
                    "CREATE TABLE {t} (name VARBINARY(512) NOT NULL PRIMARY KEY, \
                     owner VARBINARY(255) NULL, version BIGINT NOT NULL, \
                     expires_at DATETIME(6) NOT NULL, next_owner VARBINARY(255) NULL, \
                     next_since BIGINT NULL, next_expires DATETIME(6) NULL, next_ttl BIGINT NULL) \
                     ENGINE=InnoDB"
                ),
                format!(
                    "CREATE TABLE {t}_holders (name VARBINARY(512) NOT NULL, \
                     owner VARBINARY(255) NOT NULL, token BIGINT NOT NULL, \
                     expires_at DATETIME(6) NOT NULL, permits BIGINT NOT NULL, \
                     PRIMARY KEY (name, owner)) ENGINE=InnoDB"
                ),
            ]
        })
        .await;
    }

    #[tokio::test]
    async fn a_user_who_may_not_create_tables() {
        let Some(url) = url() else { return };
        let parsed = url::Url::parse(&url).expect("url");
        let db = parsed.path().trim_start_matches('/').to_owned();
        a_user_of_existing_tables(
            &url,
            |user, password, t| {
                vec![
                    format!("CREATE USER '{user}'@'%' IDENTIFIED BY '{password}'"),
                    format!("GRANT EXECUTE ON {db}.* TO '{user}'@'%'"),
                    format!("GRANT SELECT, INSERT, UPDATE, DELETE ON {t} TO '{user}'@'%'"),
                    format!("GRANT SELECT, INSERT, UPDATE, DELETE ON {t}_holders TO '{user}'@'%'"),
                    format!("GRANT SELECT, INSERT, UPDATE, DELETE ON {t}_queue TO '{user}'@'%'"),
                ]
            },
            |user| vec![format!("DROP USER '{user}'@'%'")],
        )
        .await;
    }

    #[tokio::test]
    async fn missing_database() {
        let Some(url) = url() else { return };
        let base = url.rsplit_once('/').map(|(b, _)| b).unwrap_or(&url);
        match distlock_sql::connect(
            &format!("{base}/no_such_db_distlock"),
            ClientConfig::default(),
        )
        .await
        {
            Err(Error::Backend { message, .. }) => {
                assert!(message.contains("no_such_db_distlock"), "{message}")
            }
            other => panic!("missing database: {other:?}"),
        }
    }

    /// The owner of the live place in the queue of permit waiters of `name` (but the test's
    /// `crashed` one), once a waiter queued (at most 10 s).
    async fn live_place(pool: &sqlx::MySqlPool, name: &str) -> String {
        let live = "SELECT CAST(owner AS CHAR) FROM distlock_locks_queue \
                    WHERE name = ? AND owner <> 'crashed' AND expires_at > UTC_TIMESTAMP(6)";
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let place: Option<String> = sqlx::query_scalar(live)
                .bind(name)
                .fetch_optional(pool)
                .await
                .expect("places");
            if let Some(owner) = place {
                return owner;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the waiter never queued"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// A semaphore of `permits` whose permits are all held (each by a client of its own,
    /// for `ttl`), and a waiter queued behind them, asking for `waiter_ttl`.
    struct Queued {
        _clients: Vec<LockClient<SqlBackend>>,
        pool: sqlx::MySqlPool,
        name: String,
        held: Vec<distlock_core::LockGuard>,
        waiter: tokio::task::JoinHandle<distlock_core::Result<distlock_core::LockGuard>>,
        /// The waiter's owner, as its place in the queue has it.
        queued: String,
    }

    async fn full_and_queued(
        url: &str,
        label: &str,
        permits: u32,
        ttl: Duration,
        waiter_ttl: Duration,
    ) -> Queued {
        let mut clients = Vec::new();
        for _ in 0..=permits {
            clients.push(client(url).await);
        }
        let pool = common::my(&clients[0]);
        let name = unique(label);
        let opts = AcquireOptions::default()
            .with_ttl(ttl)
            .with_permits(permits);
        let mut held = Vec::new();
        for holder in &clients[1..] {
            held.push(holder.acquire(&name, &opts).await.expect("a permit"));
        }
        let waiter = waiting(&clients[0], &name, &opts.with_ttl(waiter_ttl));
        let queued = live_place(&pool, &name).await;
        Queued {
            _clients: clients,
            pool,
            name,
            held,
            waiter,
            queued,
        }
    }

    /// A release hands a freed permit to the first live waiter of the queue, past a place
    /// that lapsed ahead of it (a crashed waiter's: left to the sweeper since the release
    /// procedure `_v5`), and the name's row then covers the new holder's lease.
    #[tokio::test]
    async fn a_permit_is_handed_past_a_lapsed_place_and_the_row_covers_it() {
        let Some(url) = url() else { return };
        let (a, b) = (client(&url).await, client(&url).await);
        let pool = common::my(&a);
        let name = unique("lapsed");
        let opts = AcquireOptions::default()
            .with_ttl(Duration::from_secs(30))
            .with_permits(1);
        // A shorter lease than the waiter's: the row must grow to cover the handed one.
        let short = opts.clone().with_ttl(Duration::from_secs(5));
        let held = a.acquire(&name, &short).await.expect("acquire");
        // First in line by its `seq`, but lapsed a second ago.
        sqlx::query(
            "INSERT INTO distlock_locks_queue (name, owner, seq, expires_at, ttl, permits) \
             VALUES (?, 'crashed', 0, UTC_TIMESTAMP(6) - INTERVAL 1 SECOND, 30000000, 1)",
        )
        .bind(&name)
        .execute(&pool)
        .await
        .expect("a lapsed place");
        let waiter = waiting(&b, &name, &opts);
        let queued = live_place(&pool, &name).await;
        held.release().await.expect("release");
        // Handed by the release itself: the waiter's holder row is there as it returns (the
        // waiter's own join, had the release left the permit free, comes a look later).
        assert!(
            has_holder_row(&pool, &name, &queued).await,
            "the release did not hand the queued waiter the permit"
        );
        assert!(
            !has_holder_row(&pool, &name, "crashed").await,
            "the lapsed place was handed the permit"
        );
        let next = common::granted(waiter).await;
        assert_eq!(next.owner(), queued, "another attempt holds the permit");
        // Within the few microseconds between the hand-over's statements (the mark reads the
        // clock before the holder row's insert does), and well past the first lease.
        let covered: Option<i64> = sqlx::query_scalar(
            "SELECT CAST(TIMESTAMPDIFF(MICROSECOND, t.expires_at, h.expires_at) < 100000 \
             AND t.expires_at > UTC_TIMESTAMP(6) + INTERVAL 20 SECOND AS SIGNED) \
             FROM distlock_locks AS t JOIN distlock_locks_holders AS h ON h.name = t.name \
             WHERE t.name = ? AND h.owner = ?",
        )
        .bind(&name)
        .bind(next.owner())
        .fetch_optional(&pool)
        .await
        .expect("the rows");
        assert_eq!(covered, Some(1), "the row does not cover the handed permit");
        next.release().await.expect("release");
        let (owner, _, _) = row(&pool, &name).await;
        assert_eq!(owner, None, "the last release did not free the name");
    }

    /// A permit's release hands it to the first waiter in place (release procedure `_v7`):
    /// it deletes its own holder row and inserts the waiter's, and touches no other holder's
    /// row, so it hands over while another transaction holds the other holder's row locked
    /// (as that holder's own release or renewal does). The release before `_v7` purged the
    /// name's holder rows under the name's row lock, and so waited for that lock
    /// (`innodb_lock_wait_timeout`, 50 s by default).
    #[tokio::test]
    async fn a_permit_is_handed_past_a_locked_holder_row() {
        let Some(url) = url() else { return };
        let long = Duration::from_secs(30);
        let q = full_and_queued(&url, "handed_past", 2, long, long).await;
        let (pool, name, queued) = (&q.pool, &q.name, &q.queued);
        let [leaving, staying] = <[_; 2]>::try_from(q.held).expect("two holders");
        // The staying holder's row by its key: the row locked, no gap beside it.
        let mut tx = pool.begin().await.expect("begin");
        lock_holder_row(&mut tx, name, &staying).await;
        let token = leaving.token();
        tokio::time::timeout(Duration::from_secs(5), leaving.release())
            .await
            .expect("the release handed over while a holder row was locked")
            .expect("release");
        let next = tokio::time::timeout(Duration::from_secs(5), common::granted(q.waiter))
            .await
            .expect("the waiter took the handed permit while a holder row was locked");
        assert_eq!(next.owner(), queued, "another attempt holds the permit");
        assert!(
            next.token() > token && next.token() > staying.token(),
            "the handed token is not the newest: {:?} after {:?} and {:?}",
            next.token(),
            token,
            staying.token()
        );
        tx.rollback().await.expect("rollback");
        for guard in [next, staying] {
            guard.release().await.expect("release");
        }
        assert_eq!(row(pool, name).await.0, None, "the name is free again");
    }

    /// A waiter queued again while a permit handed to it earlier lapsed unseen (its holder
    /// row still there, expired) is handed the next permit all the same: the in-place
    /// hand-over (release procedure `_v7`) deletes that row by its key first. Without it
    /// the insert of the waiter's new holder row failed on the table's key, and every
    /// release of the name answered that error until the row went.
    #[tokio::test]
    async fn a_permit_is_handed_to_a_waiter_with_a_lapsed_hold_of_its_own() {
        let Some(url) = url() else { return };
        let long = Duration::from_secs(30);
        let mut q = full_and_queued(&url, "own_lapsed", 1, long, long).await;
        let (pool, name, queued) = (&q.pool, &q.name, &q.queued);
        sqlx::query(
            "INSERT INTO distlock_locks_holders (name, owner, token, expires_at, permits) \
             VALUES (?, ?, 1, UTC_TIMESTAMP(6) - INTERVAL 1 SECOND, 1)",
        )
        .bind(name)
        .bind(queued)
        .execute(pool)
        .await
        .expect("a lapsed hold of the waiter's");
        let held = q.held.pop().expect("the holder");
        let token = held.token();
        tokio::time::timeout(Duration::from_secs(5), held.release())
            .await
            .expect("the release answered")
            .expect("release");
        let next = tokio::time::timeout(Duration::from_secs(5), common::granted(q.waiter))
            .await
            .expect("the waiter took the handed permit");
        assert_eq!(next.owner(), queued, "another attempt holds the permit");
        assert!(next.token() > token, "the handed token is not the newest");
        next.release().await.expect("release");
        assert_eq!(row(pool, name).await.0, None, "the name is free again");
    }

    /// A permit's release with a waiter queued, of a hold that is not there (lapsed, or
    /// released by force), hands nothing and changes nothing: the in-place hand-over
    /// (release procedure `_v7`) has stepped the name's row's version and stretched its
    /// expiry over the waiter's ttl before it finds the hold gone, and rolls all of it back.
    /// Called directly, while the name's one permit is held, so that no join of the waiter's
    /// moves the row meanwhile.
    #[tokio::test]
    async fn a_permit_release_that_finds_its_hold_gone_changes_nothing() {
        let Some(url) = url() else { return };
        let (short, long) = (Duration::from_secs(5), Duration::from_secs(60));
        let mut q = full_and_queued(&url, "gone_hold", 1, short, long).await;
        let (pool, name, queued) = (&q.pool, &q.name, &q.queued);
        let expiry = "SELECT version, CAST(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), \
                      expires_at) AS SIGNED) FROM distlock_locks WHERE name = ?";
        let (version, left): (i64, i64) = sqlx::query_as(expiry)
            .bind(name)
            .fetch_one(pool)
            .await
            .expect("the row before");
        let answers: Vec<i64> = sqlx::query_scalar(
            "CALL distlock_locks_dl_release_v7(?, 'nobody', CONCAT(CHAR(1), 'permits:1'), 1, \
             true, NULL)",
        )
        .bind(name)
        .fetch_all(pool)
        .await
        .expect("the call");
        assert_eq!(answers, [0], "a release of no hold answered");
        let (after, left_after): (i64, i64) = sqlx::query_as(expiry)
            .bind(name)
            .fetch_one(pool)
            .await
            .expect("the row after");
        assert_eq!(after, version, "the release stepped the version");
        assert!(
            left_after <= left,
            "the release stretched the row: {left} -> {left_after} us left"
        );
        assert!(
            !has_holder_row(pool, name, queued).await,
            "the release handed a permit"
        );
        let held = q.held.pop().expect("the holder");
        held.release().await.expect("release");
        let next = tokio::time::timeout(Duration::from_secs(10), common::granted(q.waiter))
            .await
            .expect("the waiter took the permit");
        next.release().await.expect("release");
    }
}
