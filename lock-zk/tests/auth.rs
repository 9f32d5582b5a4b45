//! Digest and SASL DIGEST-MD5 authentication and TLS against the real `zookeeper-auth` server
//! of services.sh: another identity (or none) cannot touch our nodes and gets a clear,
//! non-retryable error; secrets never show; TLS failures are typed and quick.

mod common;

use std::time::{Duration, Instant};

use common::{Creds, client_config, raw_client};
use conformance_tests::server_var;
use distlock_core::{AcquireOptions, DistributedLock, Error, LockName};
use distlock_zookeeper::ZkConfig;
use distlock_zookeeper::zookeeper_client as zk;

/// `DISTLOCK_TEST_ZK_AUTH_URL`, e.g. `zk://distlock:PASSWORD@127.0.0.1:12182`.
fn auth_url() -> Option<String> {
    server_var("zk", "DISTLOCK_TEST_ZK_AUTH_URL")
}

fn unique(prefix: &str) -> String {
    let run = uuid::Uuid::new_v4().simple().to_string();
    format!("/distlock-auth-test/{prefix}-{}", &run[..8])
}

/// `url` with `path` as its chroot (before any query).
fn with_chroot(url: &str, path: &str) -> String {
    match url.split_once('?') {
        Some((base, query)) => format!("{base}{path}?{query}"),
        None => format!("{url}{path}"),
    }
}

/// `url` with other userinfo (`None`: no credentials).
fn with_userinfo(url: &str, userinfo: Option<&str>) -> String {
    let (scheme, rest) = url.split_once("://").expect("a URL");
    let hosts = rest.rsplit_once('@').map_or(rest, |(_, hosts)| hosts);
    match userinfo {
        Some(userinfo) => format!("{scheme}://{userinfo}@{hosts}"),
        None => format!("{scheme}://{hosts}"),
    }
}

fn server_of(url: &str) -> String {
    ZkConfig::from_url(url).expect("a valid URL").hosts()[0].clone()
}

fn assert_clear(err: &Error, needles: &[&str], secret: &str) {
    let shown = format!("{err} | {err:?} | {err:#?}");
    assert!(
        matches!(err, Error::Backend { .. }) && !err.is_retryable(),
        "not a non-retryable backend error: {shown}"
    );
    for needle in needles {
        assert!(shown.contains(needle), "{needle:?} missing in: {shown}");
    }
    assert!(!shown.contains(secret), "the password shows in: {shown}");
}

#[tokio::test]
async fn foreign_clients_cannot_delete_our_nodes() {
    let Some(url) = auth_url() else { return };
    let chroot = unique("foreign");
    let ours = distlock_zookeeper::connect(&with_chroot(&url, &chroot), client_config())
        .await
        .expect("connect with credentials");
    let guard = ours
        .try_acquire("victim", &AcquireOptions::default())
        .await
        .expect("try_acquire")
        .expect("free");
    let config = ZkConfig::from_url(&with_chroot(&url, &chroot)).unwrap();
    let lock_node = config.lock_path(&LockName::new("victim").unwrap());
    let server = server_of(&url);
    let admin = raw_client(&server, Creds::of_url(&url).as_ref()).await;
    let queue = admin.list_children(&lock_node).await.expect("list");
    assert_eq!(queue.len(), 1, "{queue:?}");
    let queue_node = format!("{lock_node}/{}", queue[0]);
    let (acls, _) = admin.get_acl(&queue_node).await.expect("get_acl");
    assert!(
        acls.iter().all(|a| a.scheme() == "digest"
            || (a.scheme() == "world" && a.permission() == zk::Permission::READ)),
        "{acls:?}"
    );

    let intruder = Creds {
        user: "intruder".into(),
        password: "guess".into(),
    };
    for (who, client) in [
        (
            "other credentials",
            raw_client(&server, Some(&intruder)).await,
        ),
        ("no credentials", raw_client(&server, None).await),
    ] {
        for path in [&queue_node, &lock_node, &config.base_path()] {
            assert_eq!(
                client.delete(path, None).await,
                Err(zk::Error::NoAuth),
                "{who} deleting {path}"
            );
        }
        assert_eq!(
            client.set_data(&queue_node, b"H1", None).await.map(drop),
            Err(zk::Error::NoAuth),
            "{who} writing our node"
        );
        let sneak = zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
        assert_eq!(
            client
                .create(&format!("{lock_node}/sneak.0000000000"), b"H1", &sneak)
                .await
                .map(drop),
            Err(zk::Error::NoAuth),
            "{who} joining the queue"
        );
        // Anyone may read (status, monitoring).
        client.get_data(&queue_node).await.expect("world READ");
    }
    assert!(!guard.is_lost());
    guard.release().await.expect("still ours");
}

#[tokio::test]
async fn other_identities_get_a_clear_error_at_connect() {
    let Some(url) = auth_url() else { return };
    let chroot = unique("connect");
    let secret = Creds::of_url(&url).unwrap().password;
    // The base belongs to our identity.
    drop(
        distlock_zookeeper::connect(&with_chroot(&url, &chroot), client_config())
            .await
            .expect("owner connects"),
    );
    let host = server_of(&url);
    let base = format!("{chroot}/distlock");
    for (userinfo, needles) in [
        (
            Some("distlock:not-the-password"),
            vec!["wrong password", "\"distlock\""],
        ),
        (
            Some("intruder:pw"),
            vec!["\"intruder\" lack permission", "\"distlock\""],
        ),
        (None, vec!["no credentials"]),
    ] {
        let other = with_chroot(&with_userinfo(&url, userinfo), &chroot);
        let started = Instant::now();
        let err = distlock_zookeeper::connect(&other, client_config())
            .await
            .expect_err("another identity must not connect");
        assert!(
            started.elapsed() < common::OP_TIMEOUT,
            "{:?}",
            started.elapsed()
        );
        let mut all = needles.clone();
        all.extend([host.as_str(), base.as_str()]);
        assert_clear(&err, &all, &secret);
        assert!(!err.to_string().contains("not-the-password"), "{err}");
    }
}

/// A base created without credentials (before auth was turned on) stays open: the client
/// warns, works, and its lock nodes are still its own; another identity that tries the same
/// name gets a clear error naming the lock node.
#[tokio::test]
async fn another_identity_locking_our_name_is_refused() {
    let Some(url) = auth_url() else { return };
    let chroot = unique("open-base");
    let server = server_of(&url);
    let legacy = raw_client(&server, None).await;
    legacy
        .mkdir(
            &format!("{chroot}/distlock"),
            &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all()),
        )
        .await
        .expect("an open base");
    let ours = distlock_zookeeper::connect(&with_chroot(&url, &chroot), client_config())
        .await
        .expect("owner connects to an open base");
    let guard = ours
        .try_acquire("shared-name", &AcquireOptions::default())
        .await
        .unwrap()
        .expect("free");
    let intruder_url = with_chroot(&with_userinfo(&url, Some("intruder:pw")), &chroot);
    let intruder = distlock_zookeeper::connect(&intruder_url, client_config())
        .await
        .expect("the open base lets anyone in");
    let lock_node = ZkConfig::from_url(&intruder_url)
        .unwrap()
        .lock_path(&LockName::new("shared-name").unwrap());
    for attempt in 0..2 {
        let started = Instant::now();
        let err = if attempt == 0 {
            intruder
                .try_acquire("shared-name", &AcquireOptions::default())
                .await
                .map(drop)
        } else {
            let opts = AcquireOptions::default().with_wait(Duration::from_secs(5));
            intruder.acquire("shared-name", &opts).await.map(drop)
        }
        .expect_err("another identity must not join our queue");
        // No retry loop until the wait deadline: the error comes at once.
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        assert_clear(&err, &[&lock_node, "\"intruder\"", &server], "pw@");
    }
    assert!(!guard.is_lost());
    guard.release().await.expect("still ours");
}

/// Every line logged at TRACE level while the test runs (this crate's and the client
/// library's), for [`secrets_never_show`].
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Every event of this thread, from TRACE up, written into `writer` until the guard drops.
///
/// tracing-core 0.1.36 (tokio-rs/tracing#3611): while exactly one `Dispatch` is registered
/// in the process, a callsite first hit on a thread without a subscriber (another test of this
/// binary) is cached as never interesting, and this thread's subscriber then never sees it:
/// distlock's "released" line went missing in 1 CI run. A second dispatch kept alive for the
/// whole process makes tracing ask every registered dispatch instead
/// (`conformance_tests::child::keep_every_dispatch_asked`).
fn capture_on_this_thread(writer: Captured) -> tracing::subscriber::DefaultGuard {
    conformance_tests::child::keep_every_dispatch_asked();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    tracing::subscriber::set_default(subscriber)
}

// A current-thread runtime: the client library's tasks log on this thread, into the capture.
#[tokio::test(flavor = "current_thread")]
async fn secrets_never_show() {
    let Some(url) = auth_url() else { return };
    let captured = Captured::default();
    let writer = captured.clone();
    let _logging = capture_on_this_thread(writer);
    let secret = format!("s3cr3t-{}", uuid::Uuid::new_v4().simple());
    let chroot = unique("secret");
    let mine = with_chroot(
        &with_userinfo(&url, Some(&format!("keeper:{secret}"))),
        &chroot,
    );
    let config = ZkConfig::from_url(&mine).unwrap();
    let client = distlock_zookeeper::connect(&mine, client_config())
        .await
        .expect("connect");
    let mut shown = vec![
        format!("{config:?}"),
        format!("{config:#?}"),
        format!("{client:?}"),
        format!("{client:#?}"),
        format!("{:?}", client.backend_ref()),
        format!("{:#?}", client.backend_ref()),
    ];
    let mut errors = Vec::new();
    // Wrong password against the same base, a closed port, bad URLs, a missing TLS file.
    let wrong = with_chroot(
        &with_userinfo(&url, Some(&format!("keeper:x{secret}"))),
        &chroot,
    );
    errors.push(
        distlock_zookeeper::connect(&wrong, client_config())
            .await
            .unwrap_err(),
    );
    for bad in [
        format!("zk://keeper:{secret}@127.0.0.1:1"),
        format!("zk://keeper:{secret}@127.0.0.1:1/a//b"),
        format!("zk://keeper:{secret}@127.0.0.1:1?nope=1"),
        format!("zks://keeper:{secret}@127.0.0.1:1?ca=/nonexistent/ca.pem"),
        format!("zks://keeper:{secret}@127.0.0.1:1"),
        format!("redis://keeper:{secret}@127.0.0.1:1"),
    ] {
        errors.push(
            distlock_zookeeper::connect(&bad, client_config())
                .await
                .unwrap_err(),
        );
    }
    for err in &errors {
        shown.extend([err.to_string(), format!("{err:?}"), format!("{err:#?}")]);
    }
    // A lock cycle, so that the session's requests are logged too.
    let guard = client
        .acquire("logged", &AcquireOptions::default())
        .await
        .expect("acquire");
    guard.release().await.expect("release");
    drop(client);
    // The same over TLS, with a client certificate.
    #[cfg(feature = "tls")]
    if let Some(tls_url) = server_var("zk", "DISTLOCK_TEST_ZK_TLS_URL") {
        let dir = tls::tls_dir(&tls_url);
        let tls_url = format!("{tls_url}&cert={dir}/client.pem&key={dir}/client.key");
        let mine = with_chroot(
            &with_userinfo(&tls_url, Some(&format!("keeper:{secret}"))),
            &unique("secret-tls"),
        );
        let config = ZkConfig::from_url(&mine).unwrap();
        let client = distlock_zookeeper::connect(&mine, client_config())
            .await
            .expect("connect over TLS");
        let guard = client
            .acquire("logged", &AcquireOptions::default())
            .await
            .expect("acquire over TLS");
        guard.release().await.expect("release");
        shown.extend([
            format!("{config:?}"),
            format!("{config:#?}"),
            format!("{client:?}"),
            format!("{client:#?}"),
        ]);
    }
    let log = String::from_utf8_lossy(&captured.0.lock().unwrap()).into_owned();
    assert!(log.lines().count() > 5, "nothing was logged: {log}");
    shown.push(log);
    for text in &shown {
        assert!(!text.contains(&secret), "the password shows in: {text}");
    }
}

#[cfg(feature = "tls")]
mod tls {
    use super::*;

    /// `DISTLOCK_TEST_ZK_TLS_URL`, e.g. `zks://distlock:PASSWORD@127.0.0.1:12183?ca=...`.
    fn tls_url() -> Option<String> {
        server_var("zk", "DISTLOCK_TEST_ZK_TLS_URL")
    }

    pub(super) fn tls_dir(url: &str) -> String {
        let ca = url
            .split("ca=")
            .nth(1)
            .expect("ca=")
            .split('&')
            .next()
            .unwrap();
        ca.rsplit_once('/').unwrap().0.to_owned()
    }

    #[tokio::test]
    async fn locks_over_tls_with_and_without_a_client_certificate() {
        let Some(url) = tls_url() else { return };
        let dir = tls_dir(&url);
        let chroot = unique("tls");
        for url in [
            url.clone(),
            format!("{url}&cert={dir}/client.pem&key={dir}/client.key"),
        ] {
            let client = distlock_zookeeper::connect(&with_chroot(&url, &chroot), client_config())
                .await
                .expect("connect over TLS");
            let guard = client
                .acquire("over-tls", &AcquireOptions::default())
                .await
                .expect("acquire over TLS");
            guard.release().await.expect("release");
        }
    }

    async fn refused(url: &str, needles: &[&str]) {
        let started = Instant::now();
        let err = distlock_zookeeper::connect(url, client_config())
            .await
            .expect_err("must not connect");
        let took = started.elapsed();
        assert!(
            took < common::OP_TIMEOUT + Duration::from_millis(500),
            "{took:?}: {err}"
        );
        assert_clear(&err, needles, "@127.0.0.1");
        eprintln!(
            "{}: {took:?}: {err}",
            distlock_core::service_url::redact(url)
        );
    }

    /// The application's own connector, carrying its own TLS options (`secure`), opens the
    /// backend's sessions with the configuration's digest credentials: the lock works and
    /// excludes a client of the URL.
    #[tokio::test]
    async fn the_applications_own_tls_connector() {
        let Some(url) = tls_url() else { return };
        let dir = tls_dir(&url);
        let chroot = unique("own-connector");
        let ca = std::fs::read_to_string(format!("{dir}/ca.pem")).expect("the CA");
        let options = zk::TlsOptions::new().with_pem_ca(&ca).expect("a CA");
        let app = zk::Client::connector()
            .with_connection_timeout(Duration::from_secs(2))
            .with_tls(options);
        // The same server and credentials, without the URL's TLS files.
        let plain_form = with_chroot(&url.replacen("zks://", "zk://", 1), &chroot);
        let plain_form = plain_form
            .split_once('?')
            .map_or(plain_form.as_str(), |(u, _)| u);
        let config = ZkConfig::from_url(plain_form)
            .expect("config")
            .with_connector(app, true);
        assert!(config.is_secure());
        let mine = distlock_core::LockClient::new(
            distlock_zookeeper::ZkBackend::connect(config, &client_config())
                .await
                .expect("sessions from the application's connector"),
        );
        let by_url = distlock_zookeeper::connect(&with_chroot(&url, &chroot), client_config())
            .await
            .expect("connect over TLS");
        let guard = mine
            .acquire("own-connector", &AcquireOptions::default())
            .await
            .expect("acquire");
        let busy = by_url
            .try_acquire("own-connector", &AcquireOptions::default())
            .await
            .expect("try");
        assert!(busy.is_none(), "the URL client took a held lock");
        guard.release().await.expect("release");
    }

    #[tokio::test]
    async fn untrusted_certificate_authority_is_refused() {
        let Some(url) = tls_url() else { return };
        let dir = tls_dir(&url);
        let other = url.replace(&format!("{dir}/ca.pem"), &format!("{dir}/other-ca.pem"));
        let host = server_of(&url);
        refused(&other, &[&host, "certificate"]).await;
    }

    #[tokio::test]
    async fn tls_to_the_plain_port_is_refused() {
        let (Some(url), Some(plain)) = (tls_url(), auth_url()) else {
            return;
        };
        let plain_host = server_of(&plain);
        let tls_host = server_of(&url);
        let wrong = url.replace(&tls_host, &plain_host);
        refused(&wrong, &[&plain_host, "TLS"]).await;
    }

    #[tokio::test]
    async fn plain_to_the_tls_port_is_refused() {
        let (Some(url), Some(plain)) = (tls_url(), auth_url()) else {
            return;
        };
        let plain_host = server_of(&plain);
        let tls_host = server_of(&url);
        let wrong = plain.replace(&plain_host, &tls_host);
        refused(&wrong, &[&tls_host, "zks://"]).await;
    }
}

/// SASL DIGEST-MD5 against the same server (its JAAS file knows one user, `distlock`).
#[cfg(feature = "sasl")]
mod sasl {
    use super::*;
    use conformance_tests::tls::refused;

    /// `DISTLOCK_TEST_ZK_SASL_URL`, e.g. `zk://distlock:PASSWORD@127.0.0.1:12182?auth=sasl`.
    fn sasl_url() -> Option<String> {
        server_var("zk", "DISTLOCK_TEST_ZK_SASL_URL")
    }

    #[tokio::test]
    async fn locks_over_sasl_and_other_identities_cannot_delete_our_nodes() {
        let Some(url) = sasl_url() else { return };
        let chroot = unique("sasl");
        let mine = with_chroot(&url, &chroot);
        let ours = distlock_zookeeper::connect(&mine, client_config())
            .await
            .expect("connect over SASL");
        let guard = ours
            .try_acquire("victim", &AcquireOptions::default())
            .await
            .expect("try_acquire")
            .expect("free");
        // The same identity from another client waits its turn.
        let twin = distlock_zookeeper::connect(&mine, client_config())
            .await
            .expect("a second SASL client");
        assert!(
            twin.try_acquire("victim", &AcquireOptions::default())
                .await
                .expect("try_acquire")
                .is_none(),
            "the lock is held"
        );
        let config = ZkConfig::from_url(&mine).unwrap();
        assert!(config.uses_sasl());
        let lock_node = config.lock_path(&LockName::new("victim").unwrap());
        let server = server_of(&url);
        let anonymous = raw_client(&server, None).await;
        let queue = anonymous.list_children(&lock_node).await.expect("list");
        assert_eq!(queue.len(), 1, "{queue:?}");
        let queue_node = format!("{lock_node}/{}", queue[0]);
        for path in [&queue_node, &lock_node, &config.base_path()] {
            let (acls, _) = anonymous.get_acl(path).await.expect("get_acl");
            assert!(
                acls.iter()
                    .any(|a| a.scheme() == "sasl" && a.id() == "distlock"),
                "{path}: {acls:?}"
            );
            assert!(
                acls.iter()
                    .all(|a| (a.scheme() == "sasl" && a.id() == "distlock")
                        || (a.scheme() == "world" && a.permission() == zk::Permission::READ)),
                "{path}: {acls:?}"
            );
        }
        // Digest credentials with the same user name and password are another identity.
        let same_name = Creds::of_url(&url).unwrap();
        for (who, client) in [
            (
                "digest credentials",
                raw_client(&server, Some(&same_name)).await,
            ),
            ("no credentials", anonymous),
        ] {
            for path in [&queue_node, &lock_node, &config.base_path()] {
                assert_eq!(
                    client.delete(path, None).await,
                    Err(zk::Error::NoAuth),
                    "{who} deleting {path}"
                );
            }
            assert_eq!(
                client.set_data(&queue_node, b"H1", None).await.map(drop),
                Err(zk::Error::NoAuth),
                "{who} writing our node"
            );
            client.get_data(&queue_node).await.expect("world READ");
        }
        // The digest client of the same name is told at connect whose base it is.
        let digest = with_chroot(&url.replace("?auth=sasl", ""), &chroot);
        assert!(!ZkConfig::from_url(&digest).unwrap().uses_sasl());
        let err = distlock_zookeeper::connect(&digest, client_config())
            .await
            .expect_err("a digest identity must not use a SASL-owned base");
        assert_clear(
            &err,
            &[
                "digest user \"distlock\" lack permission",
                "SASL user \"distlock\"",
                &server,
            ],
            &same_name.password,
        );
        assert!(!guard.is_lost());
        guard.release().await.expect("still ours");
        let guard = twin
            .try_acquire("victim", &AcquireOptions::default())
            .await
            .expect("try_acquire")
            .expect("free after release");
        guard.release().await.expect("release");
    }

    #[tokio::test]
    async fn wrong_password_and_unknown_user_are_refused() {
        let Some(url) = sasl_url() else { return };
        let secret = Creds::of_url(&url).unwrap().password;
        let host = server_of(&url);
        let chroot = unique("sasl-refused");
        // The base belongs to our identity.
        drop(
            distlock_zookeeper::connect(&with_chroot(&url, &chroot), client_config())
                .await
                .expect("owner connects"),
        );
        let other = format!("pw-{}", uuid::Uuid::new_v4().simple());
        for (what, userinfo, bad_secret, cause) in [
            (
                "wrong SASL password",
                format!("distlock:x{secret}"),
                format!("x{secret}"),
                &["authentication failed"][..],
            ),
            (
                "unknown SASL user",
                format!("nobody:{other}"),
                other.clone(),
                &["authentication failed"][..],
            ),
            // ZooKeeper 3.8's DIGEST-MD5 callback handler is shared by all connections and keeps
            // the last known user name: an unknown user with the password of the user
            // authenticated just before may pass the handshake (as `sasl:nobody`). The ACL check
            // at connect still refuses it on our base.
            (
                "unknown SASL user with a known user's password",
                format!("nobody:{secret}"),
                secret.clone(),
                &["authentication failed", "\"nobody\" lack permission"][..],
            ),
        ] {
            let bad = with_chroot(&with_userinfo(&url, Some(&userinfo)), &chroot);
            let err = refused(
                what,
                distlock_zookeeper::connect(&bad, client_config()),
                &host,
                &bad_secret,
                cause,
            )
            .await;
            assert_clear(&err, &[&host, "SASL"], &secret);
            eprintln!("{what}: {err}");
        }
    }

    /// SASL on the TLS port: `zks://distlock:PASSWORD@...?ca=...&auth=sasl`.
    #[cfg(feature = "tls")]
    #[tokio::test]
    async fn locks_with_sasl_over_tls() {
        let Some(tls_url) = server_var("zk", "DISTLOCK_TEST_ZK_TLS_URL") else {
            return;
        };
        let url = with_chroot(&format!("{tls_url}&auth=sasl"), &unique("sasl-tls"));
        let config = ZkConfig::from_url(&url).unwrap();
        assert!(config.uses_sasl() && config.tls().is_some());
        let client = distlock_zookeeper::connect(&url, client_config())
            .await
            .expect("connect with SASL over TLS");
        let guard = client
            .acquire("sasl-over-tls", &AcquireOptions::default())
            .await
            .expect("acquire");
        guard.release().await.expect("release");
    }

    // A current-thread runtime: the client library's tasks log on this thread, into the capture.
    #[tokio::test(flavor = "current_thread")]
    async fn the_sasl_password_never_shows() {
        let Some(url) = sasl_url() else { return };
        let secret = Creds::of_url(&url).unwrap().password;
        let captured = Captured::default();
        let writer = captured.clone();
        let _logging = capture_on_this_thread(writer);
        let mine = with_chroot(&url, &unique("sasl-secret"));
        let config = ZkConfig::from_url(&mine).unwrap();
        let client = distlock_zookeeper::connect(&mine, client_config())
            .await
            .expect("connect");
        let guard = client
            .acquire("logged", &AcquireOptions::default())
            .await
            .expect("acquire");
        guard.release().await.expect("release");
        let mut shown = vec![
            format!("{config:?}"),
            format!("{config:#?}"),
            format!("{client:?}"),
            format!("{client:#?}"),
        ];
        drop(client);
        // The wrong password holds the right one: it must not show either.
        let wrong = with_userinfo(&mine, Some(&format!("distlock:{secret}x")));
        let err = distlock_zookeeper::connect(&wrong, client_config())
            .await
            .unwrap_err();
        shown.extend([err.to_string(), format!("{err:?}"), format!("{err:#?}")]);
        let log = String::from_utf8_lossy(&captured.0.lock().unwrap()).into_owned();
        // The capture works: the client library's connection attempts, distlock's release
        // and the refused session all logged here.
        for expected in [
            "attempts new connections",
            "released",
            "authentication failed",
        ] {
            assert!(log.contains(expected), "{expected:?} was not logged: {log}");
        }
        shown.push(log);
        for text in &shown {
            assert!(!text.contains(&secret), "the password shows in: {text}");
        }
    }
}
