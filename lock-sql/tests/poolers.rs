//! Connection poolers and idle limits between the client and the database (issue 42), on the
//! servers of `scripts/services.sh`:
//!
//! - PgBouncer in transaction pooling (`pgbouncer-tx`): a client connection gets another
//!   server connection for each transaction, so LISTEN, prepared statements and session
//!   variables do not carry over. Refused at connect, with an error that names it and what to
//!   use instead; before, the connect failed with sqlx's bare "pool timed out", or, when it
//!   went through, statements failed with "prepared statement sqlx_s_N already exists".
//! - PgBouncer in session pooling (`pgbouncer-session`): works as a direct connection,
//!   wake-ups (LISTEN/NOTIFY) included (the conformance suite runs on it as well).
//! - MariaDB with `wait_timeout=2` (`mariadb-wait-timeout`): the server closes every
//!   connection idle for 2 s. Before, the pool handed such a dead connection to the next
//!   statement: a `try_acquire` after 3 s of quiet failed, and so did the release of a lock
//!   held longer than 2 s (on the holder's connection that keeps the waiters' wake lock).

#[allow(dead_code, reason = "each test file uses a part of the helpers")]
mod common;

#[allow(
    unused_imports,
    reason = "unused when no server dialect is compiled in"
)]
use common::unique;
use std::time::{Duration, Instant};

use distlock_core::{AcquireOptions, ClientConfig, DistributedLock, LockClient, LockGuard};
use distlock_sql::SqlBackend;

#[allow(dead_code, reason = "unused when no server dialect is compiled in")]
fn config() -> ClientConfig {
    ClientConfig::default().with_operation_timeout(Duration::from_secs(2))
}

/// Two clients of the server in `var`; `None` (the tests skip) when it is unset and not
/// required (see [`conformance_tests::server_var`]).
#[allow(dead_code, reason = "unused when no server dialect is compiled in")]
async fn two_clients(
    backend: &str,
    var: &str,
) -> Option<(LockClient<SqlBackend>, LockClient<SqlBackend>)> {
    let url = conformance_tests::server_var(backend, var)?;
    let connect = async || {
        distlock_sql::connect(&url, config())
            .await
            .unwrap_or_else(|err| panic!("connect to {var}: {err}"))
    };
    Some((connect().await, connect().await))
}

/// Hands `guard` over to `waiter`: the waiter asks for the lock, `guard` keeps it `hold`
/// longer (still held, and the waiter still waiting, at the end), then releases it. Returns
/// how long after the release the waiter had it; its token is greater.
#[allow(dead_code, reason = "unused when no server dialect is compiled in")]
async fn hand_over(
    guard: LockGuard,
    waiter: &LockClient<SqlBackend>,
    opts: &AcquireOptions,
    hold: Duration,
) -> Duration {
    let token = guard.token();
    let label = guard.name().as_str().to_owned();
    let waiting = {
        let (waiter, name, opts) = (
            waiter.clone(),
            guard.name().as_str().to_owned(),
            opts.clone(),
        );
        tokio::spawn(async move {
            let guard = waiter.acquire(&name, &opts).await.expect("waiter");
            (Instant::now(), guard)
        })
    };
    tokio::time::sleep(hold).await;
    assert!(!guard.is_lost(), "lost: {:?}", guard.loss_reason());
    assert!(!waiting.is_finished(), "two holders");
    guard
        .release()
        .await
        .unwrap_or_else(|err| panic!("release after {hold:?} held: {err}"));
    let released = Instant::now();
    let (granted, next) = waiting.await.expect("waiter task");
    assert!(next.token() > token);
    next.release().await.expect("release");
    let woken = granted.saturating_duration_since(released);
    eprintln!("{label}: the waiter had the lock {woken:?} after the release");
    woken
}

#[cfg(feature = "postgres")]
mod pgbouncer {
    use super::*;
    use distlock_core::Error;

    fn refused(err: &Error) {
        let text = err.to_string();
        assert!(matches!(err, Error::Unsupported(_)), "{err:?}");
        assert!(!err.is_retryable(), "{err:?}");
        for part in [
            "127.0.0.1:",
            "does not keep a session per connection (a NOTIFY ",
            "transaction pooling",
            "pool_mode=session",
            "directly",
        ] {
            assert!(text.contains(part), "{part:?} missing from: {text}");
        }
        assert!(!text.contains('\n'), "{text}");
    }

    /// Every connect through a transaction-pooling PgBouncer is refused, also while other
    /// clients' prepared statements are on its server connections, and so is a pool the
    /// application made on it ([`distlock_sql::from_pool`]).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn transaction_pooling_is_refused_at_connect() {
        let Some(url) =
            conformance_tests::server_var("pgbouncer", "DISTLOCK_TEST_PGBOUNCER_TX_URL")
        else {
            return;
        };
        // Another application's prepared statements on the server connections.
        let other = sqlx::PgPool::connect(&url).await.expect("a plain pool");
        for _ in 0..3 {
            let _ = sqlx::query_scalar::<_, i32>("SELECT 1")
                .fetch_one(&other)
                .await;
        }
        for attempt in 0..5 {
            match distlock_sql::connect(&url, config()).await {
                Ok(_) => panic!("attempt {attempt}: transaction pooling was accepted"),
                Err(err) => refused(&err),
            }
        }
        // Also several at once, while another client keeps the server connections busy.
        let busy = {
            let other = other.clone();
            tokio::spawn(async move {
                loop {
                    let _ = sqlx::raw_sql("SELECT pg_sleep(0.001)")
                        .execute(&other)
                        .await;
                }
            })
        };
        let connects: Vec<_> = (0..6)
            .map(|_| {
                let url = url.clone();
                tokio::spawn(async move { distlock_sql::connect(&url, config()).await.err() })
            })
            .collect();
        for connect in connects {
            let err = connect.await.expect("connect task");
            refused(&err.expect("transaction pooling was accepted under load"));
        }
        busy.abort();
        let err = distlock_sql::from_pool(other.clone(), config())
            .await
            .expect_err("the application's pool on transaction pooling was accepted");
        refused(&err);
        other.close().await;
    }

    /// Session pooling keeps each client connection on one server connection: the backend
    /// connects, and a release wakes the waiter through LISTEN/NOTIFY at once (a lost
    /// notification would leave it polling until near the end of the 20 s lease).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn session_pooling_works_and_wakes_waiters() {
        let Some((holder, waiter)) =
            two_clients("pgbouncer", "DISTLOCK_TEST_PGBOUNCER_SESSION_URL").await
        else {
            return;
        };
        let name = unique("pgbouncer-session");
        let opts = AcquireOptions::default()
            .with_ttl(Duration::from_secs(20))
            .with_wait(Duration::from_secs(15));
        for round in 0..3 {
            let guard = holder.acquire(&name, &opts).await.expect("acquire");
            let woken = hand_over(guard, &waiter, &opts, Duration::from_millis(500)).await;
            assert!(
                woken < Duration::from_secs(2),
                "round {round}: the waiter got the lock {woken:?} after the release"
            );
        }
    }
}

#[cfg(feature = "mysql")]
mod wait_timeout {
    use super::*;

    /// The server's `wait_timeout` (2 s) closes the pool's idle connections: a lock taken after
    /// a quiet spell, a lease renewed at intervals longer than it, and the release of a lock
    /// held longer than it (its connection kept the wake lock, idle, all along) go through at
    /// the first try, and the waiter gets the lock promptly after the release.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn connections_closed_for_idleness_are_replaced() {
        let Some((holder, waiter)) =
            two_clients("mysql", "DISTLOCK_TEST_MYSQL_WAIT_TIMEOUT_URL").await
        else {
            return;
        };
        let name = unique("wait-timeout");
        // Renewed every 3 s: each renewal finds the connections it used before closed.
        let opts = AcquireOptions::default()
            .with_ttl(Duration::from_secs(9))
            .with_wait(Duration::from_secs(30));
        // The row exists: the holder's take pins a connection with the waiters' wake lock.
        let first = holder.acquire(&name, &opts).await.expect("acquire");
        first.release().await.expect("release");
        for round in 0..2 {
            tokio::time::sleep(Duration::from_secs(3)).await;
            let guard = holder
                .try_acquire(&name, &opts)
                .await
                .unwrap_or_else(|err| panic!("round {round}: try_acquire after 3 s idle: {err}"))
                .expect("free");
            // Three renewals, each after 3 s of idleness.
            let woken = hand_over(guard, &waiter, &opts, Duration::from_secs(10)).await;
            assert!(
                woken < Duration::from_secs(1),
                "round {round}: the waiter got the lock {woken:?} after the release"
            );
        }
    }
}
