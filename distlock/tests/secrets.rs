//! No rendering of a connected client, a guard, a config or an error shows the password of the
//! URL it came from: `{:?}`, `{:#?}` and `{}` are searched for it, against real servers.

#![cfg(all(feature = "redis", feature = "postgres"))]

use conformance_tests::servers::OwnRedis;
use distlock::{AcquireOptions, DistributedLock};
use std::fmt::Debug;

const SECRET: &str = "Pw-9fQz-secret";

/// Every rendering of `value`, checked for the secret.
fn assert_hidden(what: &str, value: &impl Debug) {
    for text in [format!("{value:?}"), format!("{value:#?}")] {
        assert!(!text.contains(SECRET), "{what}: {text}");
    }
}

fn assert_error_hidden(what: &str, err: &distlock::Error) {
    assert_hidden(what, err);
    let mut text = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        text.push_str(&format!(" / {cause} / {cause:?}"));
        source = cause.source();
    }
    assert!(!text.contains(SECRET), "{what}: {text}");
}

/// The client, a guard it hands out and the facade's client for `url`, then the errors of
/// connecting to each of `failing`.
async fn assert_connected_hidden(
    what: &str,
    url: &str,
    client: &impl DistributedLock,
    failing: &[String],
) {
    assert_hidden(what, client);
    let guard = client
        .acquire("secret-test", &AcquireOptions::default())
        .await
        .expect("acquire");
    assert_hidden("LockGuard", &guard);
    guard.release().await.expect("release");
    let facade = distlock::connect(url).await.expect("facade connect");
    assert_hidden("dyn DistributedLock", &facade);
    for url in failing {
        let err = distlock::connect(url).await.expect_err(url);
        assert_error_hidden(url, &err);
    }
}

#[tokio::test]
async fn no_rendering_of_a_redis_client_shows_the_password() {
    let server = OwnRedis::start(&["--requirepass", SECRET]);
    let url = format!("redis://:{SECRET}@127.0.0.1:{}/0", server.port());
    let config = distlock::redis::RedisConfig::from_url(&url).expect("config");
    assert_hidden("RedisConfig", &config);
    let redlock = distlock::redis::RedisConfig::from_url(&format!(
        "redlock://app:{SECRET}@127.0.0.1:1,127.0.0.1:2,127.0.0.1:3"
    ))
    .expect("redlock config");
    assert_hidden("Redlock RedisConfig", &redlock);

    let client = distlock::redis::connect(&url, distlock::ClientConfig::default())
        .await
        .expect("connect with the password");
    // A wrong password and a refused connection: the errors do not show the one given.
    let failing = [
        format!("redis://:{SECRET}x@127.0.0.1:{}/0", server.port()),
        format!("redis://:{SECRET}@127.0.0.1:1/0"),
        format!("redis://:{SECRET}@127.0.0.1:1/x"),
        format!("redlock://:{SECRET}@127.0.0.1:1,127.0.0.1:2"),
        format!("rediss://:{SECRET}@127.0.0.1:1"),
    ];
    assert_connected_hidden("LockClient<RedisBackend>", &url, &client, &failing).await;
}

#[tokio::test]
async fn no_rendering_of_a_postgres_client_shows_the_password() {
    let Ok(base) = std::env::var("DISTLOCK_TEST_POSTGRES_URL") else {
        panic!("DISTLOCK_TEST_POSTGRES_URL is not set: run scripts/services.sh start");
    };
    // The test server trusts local connections, so any password is accepted.
    let url = base.replacen(
        "postgres://postgres@",
        &format!("postgres://postgres:{SECRET}@"),
        1,
    );
    assert!(
        url.contains(SECRET),
        "unexpected DISTLOCK_TEST_POSTGRES_URL {base}"
    );
    let config = distlock::sql::SqlConfig::from_url(&url).expect("config");
    assert_hidden("SqlConfig", &config);
    let client = distlock::sql::connect(&url, distlock::ClientConfig::default())
        .await
        .expect("connect");
    let failing = [
        format!("postgres://postgres:{SECRET}@127.0.0.1:1/distlock"),
        format!("postgres://postgres:{SECRET}@127.0.0.1:1/distlock?table=no-such"),
        format!("postgres://postgres:{SECRET}@127.0.0.1:1/distlock?connect_timeout=5"),
        format!("mysql://root:{SECRET}@127.0.0.1:1/distlock"),
    ];
    assert_connected_hidden("LockClient<SqlBackend>", &url, &client, &failing).await;
}
