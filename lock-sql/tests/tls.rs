//! PostgreSQL and MariaDB over verified TLS as a password user (the servers of
//! `scripts/services.sh`, certificates and password made at its start-up): the lock works, and
//! every way of getting the connection wrong fails at once with a typed, non-retryable error
//! that names the server and never shows the password.

#![cfg(any(feature = "postgres", feature = "mysql"))]

use std::time::Duration;

use conformance_tests::tls::{refused, tls_file, with_param};
use distlock_core::{AcquireOptions, ClientConfig, DistributedLock};

fn config() -> ClientConfig {
    ClientConfig::default().with_operation_timeout(Duration::from_secs(2))
}

/// The TLS URL of `backend` from its variable, or a skip.
fn tls_url(backend: &str, var: &str) -> Option<String> {
    conformance_tests::server_var(backend, var)
}

/// Locks and unlocks over TLS.
async fn locks_over_tls(url: &str) {
    let client = distlock_sql::connect(url, config())
        .await
        .unwrap_or_else(|err| panic!("connecting over TLS: {err}"));
    let name = format!("tls-{}", uuid::Uuid::new_v4().simple());
    let guard = client
        .acquire(&name, &AcquireOptions::default())
        .await
        .expect("acquire over TLS");
    assert!(
        client
            .try_acquire(&name, &AcquireOptions::default())
            .await
            .expect("try_acquire over TLS")
            .is_none()
    );
    guard.release().await.expect("release over TLS");
}

async fn bad_connections(url: &str, plain: (&str, &str), ca_param: &str) {
    let parsed = url::Url::parse(url).expect("a URL");
    let secret = parsed
        .password()
        .expect("the TLS URL has a password")
        .to_owned();
    let connect = |url: String| async move { distlock_sql::connect(&url, config()).await };
    let server = "127.0.0.1";
    // A wrong password (the right one must not show up either).
    let mut wrong = parsed.clone();
    wrong.set_password(Some("not-the-password")).unwrap();
    refused(
        "wrong password",
        connect(wrong.into()),
        server,
        "not-the-password",
        &["password", "access denied"],
    )
    .await;
    // The TLS user without TLS.
    refused(
        "without TLS",
        connect(with_param(url, plain.0, plain.1)),
        server,
        &secret,
        &["reject", "access denied", "ssl"],
    )
    .await;
    // A server certificate signed by a CA the client does not trust.
    let untrusted = with_param(url, ca_param, &tls_file("other-ca.pem"));
    refused(
        "untrusted CA",
        connect(untrusted),
        server,
        &secret,
        &["certificate", "tls"],
    )
    .await;
    // An unknown user.
    let mut stranger = parsed.clone();
    stranger.set_username("distlock_nobody").unwrap();
    refused(
        "unknown user",
        connect(stranger.into()),
        server,
        &secret,
        &["password", "access denied", "role", "no pg_hba"],
    )
    .await;
}

#[cfg(feature = "postgres")]
#[tokio::test]
async fn postgres_over_tls_and_bad_connections() {
    let Some(url) = tls_url("postgres", "DISTLOCK_TEST_POSTGRES_TLS_URL") else {
        return;
    };
    locks_over_tls(&url).await;
    bad_connections(&url, ("sslmode", "disable"), "sslrootcert").await;
}

#[cfg(feature = "mysql")]
#[tokio::test]
async fn mysql_over_tls_and_bad_connections() {
    let Some(url) = tls_url("mysql", "DISTLOCK_TEST_MYSQL_TLS_URL") else {
        return;
    };
    locks_over_tls(&url).await;
    bad_connections(&url, ("ssl-mode", "disabled"), "ssl-ca").await;
}
