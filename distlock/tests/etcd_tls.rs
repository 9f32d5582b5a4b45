//! The facade opens `etcds://` URLs (mutual TLS and a user, the `etcd-tls` server of
//! `scripts/services.sh`), and neither the client nor a refusal shows the password.

#![cfg(feature = "etcd")]

use distlock::{AcquireOptions, Error};

#[tokio::test]
async fn connect_opens_etcds_urls_and_hides_the_password() {
    let Some(url) = conformance_tests::server_var("etcd", "DISTLOCK_TEST_ETCD_TLS_URL") else {
        return;
    };
    let parsed = distlock::service_url::ServiceUrl::parse(&url).expect("a URL");
    let secret = parsed.password().expect("a password").to_owned();
    let locks = distlock::connect(&url).await.expect("connect over TLS");
    for text in [format!("{locks:?}"), format!("{locks:#?}")] {
        assert!(!text.contains(&secret), "{text}");
    }
    let guard = locks
        .acquire("facade-etcds", &AcquireOptions::default())
        .await
        .expect("acquire");
    guard.release().await.expect("release");

    let wrong = url.replacen(&secret, "not-the-password", 1);
    let err = distlock::connect(&wrong)
        .await
        .expect_err("a wrong password");
    assert!(
        matches!(err, Error::Backend { .. }) && !err.is_retryable(),
        "{err:?}"
    );
    for text in [format!("{err}"), format!("{err:?}"), format!("{err:#?}")] {
        assert!(!text.contains("not-the-password"), "{text}");
        assert!(!text.contains(&secret), "{text}");
    }
}
