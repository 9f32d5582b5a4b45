//! PostgreSQL and MariaDB over verified TLS as a password user (the servers of
//! `scripts/services.sh`, certificates and password made at its start-up): the lock works, and
//! every way of getting the connection wrong fails at once with a typed, non-retryable error
//! that names the server and never shows the password.

#![cfg(any(feature = "postgres", feature = "mysql"))]

use std::time::{Duration, Instant};

use distlock_core::{AcquireOptions, ClientConfig, DistributedLock, Error};

/// Bound on every failing connect: the connect timeout plus slack.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

fn config() -> ClientConfig {
    ClientConfig::default().with_operation_timeout(Duration::from_secs(2))
}

/// The TLS URL of `backend` from its variable, or a skip.
fn tls_url(backend: &str, var: &str) -> Option<url::Url> {
    let raw = conformance_tests::server_var(backend, var)?;
    Some(url::Url::parse(&raw).unwrap_or_else(|e| panic!("{var} is not a URL: {e}")))
}

/// `url` with the query parameter `key` set to `value`.
fn with_param(url: &url::Url, key: &str, value: &str) -> url::Url {
    let pairs: Vec<(String, String)> = url
        .query_pairs()
        .filter(|(k, _)| k != key)
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .chain([(key.to_owned(), value.to_owned())])
        .collect();
    let mut out = url.clone();
    out.query_pairs_mut().clear().extend_pairs(pairs);
    out
}

fn tls_file(name: &str) -> String {
    let dir = std::env::var("DISTLOCK_TEST_TLS_DIR").expect("DISTLOCK_TEST_TLS_DIR is set");
    format!("{dir}/{name}")
}

/// Locks and unlocks over TLS.
async fn locks_over_tls(url: &url::Url) {
    let client = distlock_sql::connect(url.as_str(), config())
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

/// Connecting to `url` fails within the bound with a non-retryable error whose every rendering
/// names the server, says `cause` and keeps `secret` out.
async fn refused(url: &url::Url, secret: &str, cause: &[&str]) {
    let started = Instant::now();
    let err: Error = match distlock_sql::connect(url.as_str(), config()).await {
        Ok(_) => panic!(
            "connected with {}",
            distlock_core::service_url::redact(url.as_str())
        ),
        Err(err) => err,
    };
    let took = started.elapsed();
    assert!(took < CONNECT_TIMEOUT, "the refusal took {took:?}: {err}");
    assert!(
        !err.is_retryable(),
        "a retryable error for a bad connection: {err}"
    );
    let shown = [format!("{err}"), format!("{err:?}"), format!("{err:#}")];
    for text in &shown {
        assert!(!text.contains(secret), "the password is shown: {text}");
    }
    assert!(
        shown[0].contains("127.0.0.1"),
        "the server is not named: {}",
        shown[0]
    );
    let lower = shown[0].to_lowercase();
    assert!(
        cause.iter().any(|c| lower.contains(c)),
        "the cause ({cause:?}) is not said: {}",
        shown[0]
    );
}

async fn bad_connections(url: &url::Url, plain: (&str, &str), ca_param: &str) {
    let secret = url
        .password()
        .expect("the TLS URL has a password")
        .to_owned();
    // A wrong password (the right one must not show up either).
    let mut wrong = url.clone();
    wrong.set_password(Some("not-the-password")).unwrap();
    refused(&wrong, "not-the-password", &["password", "access denied"]).await;
    // The TLS user without TLS.
    refused(
        &with_param(url, plain.0, plain.1),
        &secret,
        &["reject", "access denied", "ssl"],
    )
    .await;
    // A server certificate signed by a CA the client does not trust.
    let untrusted = with_param(url, ca_param, &tls_file("other-ca.pem"));
    refused(&untrusted, &secret, &["certificate", "tls"]).await;
    // An unknown user.
    let mut stranger = url.clone();
    stranger.set_username("distlock_nobody").unwrap();
    refused(
        &stranger,
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
