//! Shared checks for the TLS and authentication tests of every networked backend: a bad
//! connection (wrong password, unknown user, untrusted certificate, TLS to a plain port, plain
//! to a TLS port) must fail within the connect bound with a typed, non-retryable error that
//! names the server and the cause, and never shows a secret.

use std::future::Future;
use std::time::{Duration, Instant};

use distlock_core::Error;

/// Bound on every failing connect of these tests: the tests' connect timeout plus slack.
pub const REFUSAL_BOUND: Duration = Duration::from_secs(5);

/// The path of `name` in the test certificates directory (`DISTLOCK_TEST_TLS_DIR`, made by
/// `scripts/services.sh`): `ca.pem`, `other-ca.pem`, `client.pem`, `client.key`, ...
///
/// # Panics
/// When the variable is not set.
pub fn tls_file(name: &str) -> String {
    let dir = std::env::var("DISTLOCK_TEST_TLS_DIR").expect("DISTLOCK_TEST_TLS_DIR is set");
    format!("{dir}/{name}")
}

/// `url` with the query parameter `key` set to `value` (replacing any earlier value); an empty
/// `value` removes it.
///
/// # Panics
/// When `url` does not parse.
pub fn with_param(url: &str, key: &str, value: &str) -> String {
    let mut parsed = url::Url::parse(url).expect("a valid URL");
    let pairs: Vec<(String, String)> = parsed
        .query_pairs()
        .filter(|(k, _)| k != key)
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .chain((!value.is_empty()).then(|| (key.to_owned(), value.to_owned())))
        .collect();
    if pairs.is_empty() {
        parsed.set_query(None);
    } else {
        parsed.query_pairs_mut().clear().extend_pairs(pairs);
    }
    parsed.into()
}

/// Runs `connect` and checks that it fails within [`REFUSAL_BOUND`] with a non-retryable
/// error whose `Display`, `Debug`, alternate `Debug` and source chain keep `secret` out, whose
/// `Display`
/// names `server` and says one of `cause` (lower case). Returns the error for more checks.
///
/// # Panics
/// When any of that does not hold (`what` names the case in the message).
pub async fn refused<T>(
    what: &str,
    connect: impl Future<Output = Result<T, Error>>,
    server: &str,
    secret: &str,
    cause: &[&str],
) -> Error {
    let started = Instant::now();
    let outcome = tokio::time::timeout(REFUSAL_BOUND * 2, connect).await;
    let took = started.elapsed();
    let err = match outcome {
        Err(_) => panic!("{what}: connect hung for {took:?}"),
        Ok(Ok(_)) => panic!("{what}: connected"),
        Ok(Err(err)) => err,
    };
    assert!(
        took < REFUSAL_BOUND,
        "{what}: the refusal took {took:?}: {err}"
    );
    assert!(
        !err.is_retryable(),
        "{what}: a retryable error for a bad connection: {err}"
    );
    let mut shown = vec![format!("{err}"), format!("{err:?}"), format!("{err:#}")];
    let mut source = std::error::Error::source(&err);
    while let Some(cause) = source {
        shown.push(format!("{cause} / {cause:?}"));
        source = cause.source();
    }
    for text in &shown {
        assert!(
            !text.contains(secret),
            "{what}: the secret is shown: {text}"
        );
    }
    assert!(
        shown[0].contains(server),
        "{what}: the server {server} is not named: {}",
        shown[0]
    );
    let lower = shown[0].to_lowercase();
    assert!(
        cause.iter().any(|c| lower.contains(c)),
        "{what}: the cause ({cause:?}) is not said: {}",
        shown[0]
    );
    assert!(
        !shown[0].contains('\n'),
        "{what}: not one line: {}",
        shown[0]
    );
    err
}
