//! Redis over verified TLS as an ACL user (the `redis-tls-*` servers of `scripts/services.sh`:
//! TLS only, the default user off, certificates and password made at its start-up): single
//! master and Redlock lock over TLS, and every way of getting the connection wrong fails at
//! once with a typed, non-retryable error that names the server and never shows the password.

mod common;

use std::time::Duration;

use conformance_tests::tls::{refused, tls_file, with_param};
use distlock_core::{AcquireOptions, ClientConfig, DistributedLock};
use distlock_redis::{RedisConfig, redis};

fn config() -> ClientConfig {
    ClientConfig::default().with_operation_timeout(Duration::from_secs(2))
}

async fn locks(url: &str) {
    let client = distlock_redis::connect(url, config())
        .await
        .unwrap_or_else(|err| panic!("connecting over TLS: {err}"));
    let name = format!("tls-{}", uuid::Uuid::new_v4().simple());
    // A long ttl: a waiter that only polled would sleep until the holder's PTTL (~10 s).
    let opts = AcquireOptions::default()
        .with_ttl(Duration::from_secs(10))
        .with_wait(Duration::from_secs(15));
    let guard = client
        .acquire(&name, &opts)
        .await
        .expect("acquire over TLS");
    let other = distlock_redis::connect(url, config())
        .await
        .expect("connect");
    let busy = other.try_acquire(&name, &opts).await.expect("try");
    assert!(busy.is_none(), "a held lock was taken over TLS");
    // The waiter is woken by the release through the subscriber, over TLS as well.
    let waiter = tokio::spawn(async move {
        let guard = other.acquire(&name, &opts).await?;
        Ok::<_, distlock_core::Error>((guard.token(), std::time::Instant::now()))
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The waiter's subscriber is connected (the servers speak TLS only, to ACL users only).
    let first_node = RedisConfig::from_url(url).expect("url").nodes[0].clone();
    let query = url.split_once('?').map(|(_, q)| q).unwrap_or_default();
    let mut admin = common::raw(&format!("{first_node}?{query}")).await;
    let clients: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(&mut admin)
        .await
        .expect("CLIENT LIST");
    assert!(
        clients
            .lines()
            .any(|l| l.contains(" flags=P ") && l.contains(" user=distlock ")),
        "no subscriber of user distlock on {}: {clients}",
        distlock_core::service_url::redact(&first_node)
    );
    guard.renew().await.expect("renew over TLS");
    let first = guard.token();
    let released = std::time::Instant::now();
    guard.release().await.expect("release over TLS");
    let (second, woken) = waiter
        .await
        .expect("join")
        .expect("the waiter gets the lock");
    let after = woken.duration_since(released);
    assert!(
        after < Duration::from_secs(3),
        "the waiter got the lock {after:?} after the release: no pub/sub wake-up over TLS"
    );
    assert!(second > first, "fencing tokens increase over TLS");
}

#[tokio::test]
async fn single_master_and_redlock_over_tls() {
    let Some(url) = common::tls_url("redis_tls") else {
        return;
    };
    locks(&url).await;
    let redlock = conformance_tests::server_var("redis_tls", "DISTLOCK_TEST_REDLOCK_TLS_URL")
        .expect("DISTLOCK_TEST_REDLOCK_TLS_URL is set with the TLS URL");
    locks(&redlock).await;
}

#[tokio::test]
async fn bad_connections_fail_at_once_without_the_password() {
    let Some(url) = common::tls_url("redis_tls") else {
        return;
    };
    let parsed = url::Url::parse(&url).expect("a URL");
    let secret = parsed.password().expect("a password").to_owned();
    let server = format!("127.0.0.1:{}", parsed.port().expect("a port"));
    let connect = |url: String| async move { distlock_redis::connect(&url, config()).await };
    let edit = |f: &dyn Fn(&mut url::Url)| {
        let mut u = parsed.clone();
        f(&mut u);
        u.to_string()
    };

    let wrong = edit(&|u| u.set_password(Some("not-the-password")).expect("password"));
    refused(
        "wrong password",
        connect(wrong),
        &server,
        "not-the-password",
        &["wrongpass", "credentials"],
    )
    .await;
    let stranger = edit(&|u| u.set_username("nobody").expect("user"));
    refused(
        "unknown user",
        connect(stranger),
        &server,
        &secret,
        &["wrongpass", "credentials"],
    )
    .await;
    let anonymous = edit(&|u| {
        u.set_username("").expect("user");
        u.set_password(None).expect("password");
    });
    refused(
        "no credentials",
        connect(anonymous),
        &server,
        &secret,
        &["noauth", "credentials"],
    )
    .await;
    let untrusted = with_param(&url, "ca", &tls_file("other-ca.pem"));
    refused(
        "untrusted CA",
        connect(untrusted),
        &server,
        &secret,
        &["certificate", "tls"],
    )
    .await;
    let public_roots = with_param(&url, "ca", "");
    refused(
        "public roots only",
        connect(public_roots),
        &server,
        &secret,
        &["certificate", "tls"],
    )
    .await;
    // TLS to a plain port: the first plain master answers the handshake in clear text.
    let plain = common::urls("redis_tls").expect("DISTLOCK_TEST_REDIS_URLS")[0].clone();
    let plain_port = url::Url::parse(&plain).expect("url").port().expect("port");
    let tls_to_plain = edit(&|u| u.set_port(Some(plain_port)).expect("port"));
    refused(
        "TLS to a plain port",
        connect(tls_to_plain),
        &format!("127.0.0.1:{plain_port}"),
        &secret,
        &["tls"],
    )
    .await;
    // Plain to the TLS port: the server drops the connection at the first clear-text byte.
    let plain_to_tls = edit(&|u| u.set_scheme("redis").expect("scheme"));
    let plain_to_tls = with_param(
        &with_param(&with_param(&plain_to_tls, "ca", ""), "cert", ""),
        "key",
        "",
    );
    refused(
        "plain to a TLS port",
        connect(plain_to_tls),
        &server,
        &secret,
        &["tls", "closed"],
    )
    .await;

    // The opt-out is loud and works: an untrusted server certificate is accepted.
    let skip = with_param(
        &with_param(&url, "ca", &tls_file("other-ca.pem")),
        "danger_skip_verify",
        "true",
    );
    let client = distlock_redis::connect(&skip, config())
        .await
        .expect("danger_skip_verify connects");
    let guard = client
        .acquire("tls-skip", &AcquireOptions::default())
        .await
        .expect("acquire");
    guard.release().await.expect("release");
    // A missing CA file is a configuration error naming the file.
    let missing = with_param(&url, "ca", "/nonexistent/ca.pem");
    let Err(err) = distlock_redis::connect(&missing, config()).await else {
        panic!("connected with a missing CA file");
    };
    assert!(
        matches!(err, distlock_core::Error::InvalidConfig(_)),
        "{err}"
    );
    assert!(err.to_string().contains("/nonexistent/ca.pem"), "{err}");
}

/// The application's own `redis::Client`s (TLS, ACL user) serve the locks: one master, and
/// Redlock over three; the backend's configuration never shows their password.
#[tokio::test]
async fn the_applications_own_clients() {
    let Some(url) = common::tls_url("redis_tls") else {
        return;
    };
    let secret = url::Url::parse(&url)
        .expect("url")
        .password()
        .expect("a password")
        .to_owned();
    let mine = distlock_redis::from_client(common::client(&url), config())
        .await
        .expect("locks over the application's client");
    assert!(!format!("{mine:?}").contains(&secret));
    assert!(!format!("{:?}", mine.backend_ref().config()).contains(&secret));
    let by_url = distlock_redis::connect(&url, config())
        .await
        .expect("connect");
    excludes(&mine, &by_url).await;

    let redlock = conformance_tests::server_var("redis_tls", "DISTLOCK_TEST_REDLOCK_TLS_URL")
        .expect("DISTLOCK_TEST_REDLOCK_TLS_URL");
    let nodes = distlock_redis::RedisConfig::from_url(&redlock).expect("url");
    let (_, query) = redlock.split_once('?').expect("TLS files in the query");
    let clients = nodes
        .nodes
        .iter()
        .map(|node| common::client(&format!("{node}?{query}")))
        .collect();
    let backend = distlock_redis::RedisBackend::from_clients(clients, nodes, config())
        .await
        .expect("Redlock over the application's clients");
    assert!(backend.config().is_redlock() && backend.config().nodes.len() == 3);
    // The first Redlock node is the single master: its key is taken too.
    excludes(&distlock_core::LockClient::new(backend), &by_url).await;
}

/// A lock taken by `locks` is seen as taken by `other`.
async fn excludes(locks: &impl DistributedLock, other: &impl DistributedLock) {
    let name = format!("own-{}", uuid::Uuid::new_v4().simple());
    let opts = AcquireOptions::default().with_ttl(Duration::from_secs(2));
    let guard = locks.acquire(&name, &opts).await.expect("acquire");
    let seen = other.try_acquire(&name, &opts).await.expect("try");
    assert!(seen.is_none(), "the other client took a held lock");
    guard.release().await.expect("release");
}
