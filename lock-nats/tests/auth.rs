//! Every way to authenticate, against the real servers of `scripts/services.sh`: nats-tls's
//! NKey user (`?nkey=`), nats-token's token (`TOKEN@`), nats-jwt's decentralized user
//! (`?creds=`, an operator, an account with JetStream and a user made at start-up). Each holds,
//! renews and releases a lock; wrong or missing credentials get a clear, non-retryable error,
//! quickly, that never shows the secret; nats-old (2.10) is refused as too old.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use conformance_tests::server_var;
use distlock_core::{AcquireOptions, ClientConfig, DistributedLock, Error};
use distlock_nats::NatsConfig;

/// How long a refusal may take (a connection refused at once answers in milliseconds).
const REFUSED_WITHIN: Duration = Duration::from_secs(10);

fn unique(prefix: &str) -> String {
    let run = uuid::Uuid::new_v4().simple().to_string();
    format!("auth-{prefix}-{}", &run[..8])
}

fn client_config() -> ClientConfig {
    ClientConfig::default().with_operation_timeout(Duration::from_secs(3))
}

/// The value of query option `key` of `url` (a path: no escapes in the test URLs).
fn option(url: &str, key: &str) -> PathBuf {
    let query = url.split_once('?').expect("a query").1;
    query
        .split('&')
        .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
        .map(PathBuf::from)
        .unwrap_or_else(|| panic!("no {key}= in the test URL"))
}

/// `url` with option `key` set to `value`.
fn with_option(url: &str, key: &str, value: &Path) -> String {
    let old = option(url, key);
    url.replacen(
        &format!("{key}={}", old.display()),
        &format!("{key}={}", value.display()),
        1,
    )
}

fn temp_file(prefix: &str, content: &str) -> PathBuf {
    let path = std::env::temp_dir().join(unique(prefix));
    std::fs::write(&path, content).expect("write a temporary file");
    path
}

/// `connect(url)` fails quickly; its error, every way it renders, shows `needles` and not
/// `secret`.
async fn refused(url: &str, needles: &[&str], secret: &str) -> Error {
    let started = Instant::now();
    let result = tokio::time::timeout(
        REFUSED_WITHIN,
        distlock_nats::connect_with(
            NatsConfig::from_url(url).expect("a valid URL"),
            client_config(),
        ),
    )
    .await
    .unwrap_or_else(|_| panic!("no answer within {REFUSED_WITHIN:?}"));
    let Err(err) = result else {
        panic!("connected with wrong credentials");
    };
    let shown = format!("{err} | {err:?} | {err:#?}");
    assert!(
        !err.is_retryable(),
        "a refusal is not retryable: {shown} (after {:?})",
        started.elapsed()
    );
    for needle in needles {
        assert!(shown.contains(needle), "{needle:?} missing in: {shown}");
    }
    assert!(
        !secret.is_empty() && !shown.contains(secret),
        "the secret shows in: {shown}"
    );
    err
}

/// Holds a lock past two of its ttls (renewed), sees a second client refused, releases it,
/// and sees the second client take it with a higher token.
async fn hold_renew_release(url: &str) {
    let config = NatsConfig::from_url(url).expect("a valid URL");
    let first = distlock_nats::connect_with(config.clone(), client_config())
        .await
        .unwrap_or_else(|err| panic!("connect: {err}"));
    let second = distlock_nats::connect_with(config, client_config())
        .await
        .unwrap_or_else(|err| panic!("connect: {err}"));
    let name = unique("hold");
    let ttl = Duration::from_secs(1);
    let options = AcquireOptions::default().with_ttl(ttl);
    let guard = first
        .try_acquire(&name, &options)
        .await
        .expect("try_acquire")
        .expect("a free name");
    tokio::time::sleep(ttl * 5 / 2).await;
    assert!(!guard.is_lost(), "the lease was lost: renewals failed");
    assert!(
        second
            .try_acquire(&name, &options)
            .await
            .expect("try_acquire")
            .is_none(),
        "a second holder while the first renews"
    );
    let token = guard.token();
    guard.release().await.expect("release");
    let next = second
        .try_acquire(&name, &options)
        .await
        .expect("try_acquire")
        .expect("free after release");
    assert!(next.token() > token);
    next.release().await.expect("release");
}

#[tokio::test]
async fn an_nkey_user_holds_renews_and_releases() {
    let Some(url) = server_var("nats", "DISTLOCK_TEST_NATS_NKEY_URL") else {
        return;
    };
    hold_renew_release(&url).await;
}

#[tokio::test]
async fn a_token_holds_renews_and_releases() {
    let Some(url) = server_var("nats", "DISTLOCK_TEST_NATS_TOKEN_URL") else {
        return;
    };
    hold_renew_release(&url).await;
}

#[tokio::test]
async fn a_creds_file_holds_renews_and_releases() {
    let Some(url) = server_var("nats", "DISTLOCK_TEST_NATS_CREDS_URL") else {
        return;
    };
    hold_renew_release(&url).await;
}

#[tokio::test]
async fn a_wrong_or_missing_token_is_refused_without_showing_it() {
    let Some(url) = server_var("nats", "DISTLOCK_TEST_NATS_TOKEN_URL") else {
        return;
    };
    let (scheme, rest) = url.split_once("://").expect("a URL");
    let (token, host) = rest.split_once('@').expect("a token");
    // Shown URLs (the CLI's messages) and the configuration hide the token.
    let shown = format!(
        "{} {:?}",
        distlock_core::service_url::redact(&url),
        NatsConfig::from_url(&url).expect("a valid URL")
    );
    assert!(!shown.contains(token), "the token shows in: {shown}");
    let wrong = format!("{token}x");
    refused(
        &format!("{scheme}://{wrong}@{host}"),
        &[host, "authorization"],
        &wrong,
    )
    .await;
    // No token at all: the same refusal (nothing to hide but the real token).
    refused(
        &format!("{scheme}://{host}"),
        &[host, "authorization"],
        token,
    )
    .await;
}

#[tokio::test]
async fn a_wrong_or_unreadable_nkey_is_refused_without_showing_it() {
    let Some(url) = server_var("nats", "DISTLOCK_TEST_NATS_NKEY_URL") else {
        return;
    };
    let seed = std::fs::read_to_string(option(&url, "nkey")).expect("the seed file");
    let seed = seed.trim();
    // A well-formed seed of a user the server does not know: the creds user's, if present,
    // else ours with its key bytes changed (the checksum then fails: refused before sending).
    let creds = server_var("nats", "DISTLOCK_TEST_NATS_CREDS_URL")
        .map(|creds| std::fs::read_to_string(option(&creds, "creds")).expect("the creds file"));
    let stranger = creds
        .as_deref()
        .and_then(|c| c.lines().find(|l| l.starts_with("SU")))
        .map_or_else(|| seed.replacen(&seed[4..8], "AAAA", 1), str::to_owned);
    let file = temp_file("stranger.nk", &stranger);
    refused(
        &with_option(&url, "nkey", &file),
        &["authorization"],
        &stranger,
    )
    .await;
    std::fs::remove_file(&file).ok();
    // Not a seed at all: a clear error naming the file, not its content.
    let garbage = "SUnot-a-seed-at-all-but-a-secret-looking-line";
    let file = temp_file("garbage.nk", garbage);
    let err = refused(
        &with_option(&url, "nkey", &file),
        &["nkey=", &file.display().to_string()],
        garbage,
    )
    .await;
    assert!(matches!(err, Error::InvalidConfig(_)), "{err:?}");
    std::fs::remove_file(&file).ok();
    // A missing file: an invalid configuration naming the path.
    let missing = std::env::temp_dir().join(unique("missing.nk"));
    let err = refused(
        &with_option(&url, "nkey", &missing),
        &[&missing.display().to_string()],
        seed,
    )
    .await;
    assert!(matches!(err, Error::InvalidConfig(_)), "{err:?}");
}

#[tokio::test]
async fn a_forged_or_missing_creds_file_is_refused_without_showing_it() {
    let Some(url) = server_var("nats", "DISTLOCK_TEST_NATS_CREDS_URL") else {
        return;
    };
    let creds = std::fs::read_to_string(option(&url, "creds")).expect("the creds file");
    let seed = creds
        .lines()
        .find(|l| l.starts_with("SU"))
        .expect("a user seed in the creds file")
        .to_owned();
    // The user JWT with its signature replaced: the server refuses it.
    let forged: String = creds
        .lines()
        .map(|line| {
            if line.starts_with("eyJ") {
                let (signed, _) = line.rsplit_once('.').expect("a JWT");
                format!("{signed}.{}\n", "A".repeat(86))
            } else {
                format!("{line}\n")
            }
        })
        .collect();
    let file = temp_file("forged.creds", &forged);
    refused(
        &with_option(&url, "creds", &file),
        &["authorization"],
        &seed,
    )
    .await;
    std::fs::remove_file(&file).ok();
    // A file without a JWT: a clear error naming the file, not showing its seed.
    let file = temp_file("nojwt.creds", &format!("{seed}\n"));
    let err = refused(&with_option(&url, "creds", &file), &["creds"], &seed).await;
    assert!(matches!(err, Error::InvalidConfig(_)), "{err:?}");
    std::fs::remove_file(&file).ok();
    let missing = std::env::temp_dir().join(unique("missing.creds"));
    let err = refused(
        &with_option(&url, "creds", &missing),
        &[&missing.display().to_string()],
        &seed,
    )
    .await;
    assert!(matches!(err, Error::InvalidConfig(_)), "{err:?}");
}

#[tokio::test]
async fn a_server_older_than_2_11_is_refused_as_unsupported() {
    let Some(url) = server_var("nats", "DISTLOCK_TEST_NATS_OLD_URL") else {
        return;
    };
    let err = refused(&url, &["2.10.", "2.11 or newer", "ttl"], "no secret here").await;
    assert!(matches!(err, Error::Unsupported(_)), "{err:?}");
}
