//! No rendering of a connected client, a guard, a config or an error, and no log line at
//! TRACE level, shows the password of the URL it came from: `{:?}`, `{:#?}`, `{}`, the source
//! chain and everything `tracing` emitted in this test binary are searched for it, against
//! real servers, plain and over TLS (Redis, Redlock, PostgreSQL, MariaDB, etcd, ZooKeeper with
//! digest auth, plain and TLS).

#![cfg(all(
    feature = "redis",
    feature = "postgres",
    feature = "mysql",
    feature = "etcd",
    feature = "zookeeper-tls"
))]

use std::fmt::Debug;
use std::sync::{Arc, Mutex, OnceLock};

use conformance_tests::servers::OwnRedis;
use distlock::{AcquireOptions, DistributedLock};

const SECRET: &str = "Pw-9fQz-secret";

/// Everything `tracing` emits in this test binary, at TRACE level, spans' fields included.
fn captured() -> &'static Arc<Mutex<Vec<u8>>> {
    static LOG: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOG.get_or_init(|| {
        let log = Arc::new(Mutex::new(Vec::new()));
        let sink = log.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_span_events(tracing_subscriber::fmt::format::FmtSpan::FULL)
            .with_ansi(false)
            .with_writer(move || Sink(sink.clone()))
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("one global subscriber");
        log
    })
}

struct Sink(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Checks that no log line so far shows `secret`, and that there are log lines at all.
fn assert_logs_hide(secret: &str) {
    let log = captured()
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    let log = String::from_utf8_lossy(&log);
    assert!(
        log.contains("TRACE") || log.contains("DEBUG"),
        "nothing was logged"
    );
    if let Some(line) = log.lines().find(|line| line.contains(secret)) {
        panic!("a log line shows the password: {line}");
    }
}

/// Every rendering of `value`, checked for the secret.
fn assert_hidden(what: &str, value: &impl Debug) {
    assert_hidden_from(what, value, SECRET);
}

fn assert_hidden_from(what: &str, value: &impl Debug, secret: &str) {
    for text in [format!("{value:?}"), format!("{value:#?}")] {
        assert!(!text.contains(secret), "{what}: {text}");
    }
}

fn assert_error_hidden(what: &str, err: &distlock::Error) {
    assert_error_hidden_from(what, err, SECRET);
}

fn assert_error_hidden_from(what: &str, err: &distlock::Error, secret: &str) {
    assert_hidden_from(what, err, secret);
    let mut text = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        text.push_str(&format!(" / {cause} / {cause:?}"));
        source = cause.source();
    }
    assert!(!text.contains(secret), "{what}: {text}");
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
    captured();
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
        format!("rediss://u:{SECRET}@127.0.0.1:1?cert=/nonexistent.pem"),
        format!("redlocks://u:{SECRET}@127.0.0.1:1,127.0.0.1:2,127.0.0.1:3?ca=/nonexistent.pem"),
    ];
    assert_connected_hidden("LockClient<RedisBackend>", &url, &client, &failing).await;
    assert_logs_hide(SECRET);
}

#[tokio::test]
async fn no_rendering_of_a_postgres_client_shows_the_password() {
    captured();
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
    assert_logs_hide(SECRET);
}

/// The TLS servers' URLs carry the password made at start-up (and the paths of the
/// certificates): every rendering of their clients, guards and refusals, and every log line,
/// keep it out. Each URL is also tried with a wrong password and with an untrusted CA.
#[tokio::test]
async fn no_rendering_or_log_line_over_tls_shows_the_password() {
    captured();
    let mut secrets = Vec::new();
    for (backend, var) in [
        ("redis_tls", "DISTLOCK_TEST_REDIS_TLS_URL"),
        ("redis_tls", "DISTLOCK_TEST_REDLOCK_TLS_URL"),
        ("postgres_tls", "DISTLOCK_TEST_POSTGRES_TLS_URL"),
        ("mysql_tls", "DISTLOCK_TEST_MYSQL_TLS_URL"),
        ("etcd_tls", "DISTLOCK_TEST_ETCD_TLS_URL"),
        ("zk_auth", "DISTLOCK_TEST_ZK_AUTH_URL"),
        ("zk_tls", "DISTLOCK_TEST_ZK_TLS_URL"),
        ("nats", "DISTLOCK_TEST_NATS_TLS_URL"),
    ] {
        let Some(url) = conformance_tests::server_var(backend, var) else {
            continue;
        };
        // The userinfo of a (possibly multi-host) URL: between "://" and the last '@'.
        let userinfo = url
            .split_once("://")
            .and_then(|(_, rest)| rest.rsplit_once('@'))
            .map(|(userinfo, _)| userinfo.to_owned())
            .expect("the TLS URL has credentials");
        let secret = userinfo
            .split_once(':')
            .map(|(_, password)| password.to_owned())
            .expect("a password");
        let client = distlock::connect(&url)
            .await
            .unwrap_or_else(|err| panic!("{var}: {err}"));
        assert_hidden_from(var, &client, &secret);
        let guard = client
            .acquire("secret-test-tls", &AcquireOptions::default())
            .await
            .expect("acquire");
        assert_hidden_from("LockGuard", &guard, &secret);
        guard.release().await.expect("release");
        let wrong = url.replacen(&secret, &format!("{secret}x"), 1);
        let err = distlock::connect(&wrong).await.expect_err("wrong password");
        assert_error_hidden_from(var, &err, &secret);
        if url.contains("/ca.pem") {
            let untrusted = url.replacen("/ca.pem", "/other-ca.pem", 1);
            let err = distlock::connect(&untrusted)
                .await
                .expect_err("untrusted CA");
            assert_error_hidden_from(var, &err, &secret);
        }
        secrets.push(secret);
    }
    for secret in &secrets {
        assert_logs_hide(secret);
    }
}
