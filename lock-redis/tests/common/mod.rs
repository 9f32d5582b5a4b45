//! Shared test helpers: server URLs, raw connections, fault hooks on the services.sh servers.

#![allow(
    dead_code,
    unused_imports,
    unreachable_pub,
    reason = "each test binary uses a part of the shared helpers"
)]

use std::time::Duration;

use distlock_core::ClientConfig;
use distlock_redis::RedisConfig;

/// The redis:// URLs of the test masters, or `None` (skip) when unset.
pub fn urls(backend: &str) -> Option<Vec<String>> {
    let value = conformance_tests::server_var(backend, "DISTLOCK_TEST_REDIS_URLS")?;
    Some(
        value
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect(),
    )
}

/// The `rediss://` URL of the first TLS master (ACL user, CA and client certificate in the
/// query), or `None` (skip) when unset.
pub fn tls_url(backend: &str) -> Option<String> {
    conformance_tests::server_var(backend, "DISTLOCK_TEST_REDIS_TLS_URL")
}

/// `services.sh` name of the server at `url` (`redis-<port>`, `redis-tls-<port>`).
pub fn service_name(url: &str) -> String {
    let parsed = url::Url::parse(url).expect("valid url");
    let port = parsed.port().expect("a port");
    if parsed.scheme() == "rediss" {
        format!("redis-tls-{port}")
    } else {
        format!("redis-{port}")
    }
}

/// A client for one node URL of the tests, TLS files (`?ca=&cert=&key=`) included.
pub fn client(url: &str) -> redis::Client {
    let mut parsed = url::Url::parse(url).expect("valid url");
    if parsed.scheme() != "rediss" {
        return redis::Client::open(url).expect("valid url");
    }
    let pairs: Vec<(String, String)> = parsed.query_pairs().into_owned().collect();
    let file = |key: &str| {
        pairs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, path)| std::fs::read(path).expect("readable TLS file"))
    };
    let certificates = redis::TlsCertificates {
        client_tls: file("cert").map(|client_cert| redis::ClientTlsConfig {
            client_cert,
            client_key: file("key").expect("key= with cert="),
        }),
        root_cert: file("ca"),
    };
    parsed.set_query(None);
    redis::Client::build_with_tls(parsed.as_str(), certificates).expect("valid TLS url")
}

pub use conformance_tests::services;

/// A plain connection to one node, for fault injection.
pub async fn raw(url: &str) -> redis::aio::MultiplexedConnection {
    client(url)
        .get_multiplexed_async_connection()
        .await
        .expect("test server reachable")
}

/// Kills every connection named `tag` (`CLIENT SETNAME`, or `lib-name` on Redis 7.2+) on the node at `url`; returns how many.
pub async fn kill_tagged(url: &str, tag: &str) -> Result<usize, String> {
    let mut conn = raw(url).await;
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(&mut conn)
        .await
        .map_err(|e| e.to_string())?;
    let mut killed = 0;
    for line in list.lines() {
        let tagged = line
            .split(' ')
            .any(|f| f == format!("name={tag}") || f == format!("lib-name={tag}"));
        if !tagged {
            continue;
        }
        let Some(id) = line.split(' ').find_map(|f| f.strip_prefix("id=")) else {
            continue;
        };
        let _: redis::RedisResult<i64> = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("ID")
            .arg(id)
            .query_async(&mut conn)
            .await;
        killed += 1;
    }
    Ok(killed)
}

/// A unique client tag.
pub fn tag() -> String {
    format!(
        "distlock-t{}",
        &uuid::Uuid::new_v4().simple().to_string()[..10]
    )
}

/// Client config with a short operation timeout.
pub fn client_config(timeout: Duration) -> ClientConfig {
    ClientConfig::default().with_operation_timeout(timeout)
}

/// A config over `urls` (one: single master; more: Redlock).
pub fn config(urls: &[String], fair: bool) -> RedisConfig {
    let config = if urls.len() == 1 {
        RedisConfig::single(&urls[0]).expect("valid url")
    } else {
        RedisConfig::redlock(urls).expect("valid urls")
    };
    config.with_fair(fair)
}

/// Waits until the server at `url` answers PING (after a restart).
pub async fn wait_ready(url: &str) {
    for _ in 0..200 {
        let client = client(url);
        if let Ok(Ok(mut conn)) = tokio::time::timeout(
            Duration::from_millis(200),
            client.get_multiplexed_async_connection(),
        )
        .await
        {
            let pong: redis::RedisResult<String> = redis::cmd("PING").query_async(&mut conn).await;
            if pong.is_ok() {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("{url} did not come back");
}
