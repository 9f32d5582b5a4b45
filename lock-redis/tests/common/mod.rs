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

/// The `redis+sentinel://` URL of the test Sentinels, or `None` (skip) when unset.
pub fn sentinel_url(backend: &str) -> Option<String> {
    conformance_tests::server_var(backend, "DISTLOCK_TEST_REDIS_SENTINEL_URL")
}

/// The `redis+cluster://` URL of the test cluster, or `None` (skip) when unset.
pub fn cluster_url(backend: &str) -> Option<String> {
    conformance_tests::server_var(backend, "DISTLOCK_TEST_REDIS_CLUSTER_URL")
}

/// The `host:port` list of a `redis+sentinel://` or `redis+cluster://` URL.
pub fn url_hosts(url: &str) -> Vec<(String, u16)> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    let hosts = rest.split(['/', '?']).next().unwrap_or_default();
    hosts
        .split(',')
        .filter_map(|h| {
            let (host, port) = h.rsplit_once(':')?;
            Some((host.to_owned(), port.parse().ok()?))
        })
        .collect()
}

/// The data nodes of the Sentinel topology (`services.sh` names `redis-repl-<port>`).
pub const REPL_PORTS: [u16; 3] = [16400, 16401, 16402];

/// The port of the master the Sentinels of `url` name now (the first that answers).
pub async fn sentinel_master_port(url: &str) -> u16 {
    let master = url
        .rsplit_once('/')
        .map(|(_, m)| m.split('?').next().unwrap_or(m).to_owned())
        .expect("a master name");
    for _ in 0..100 {
        for (host, port) in url_hosts(url) {
            let client = redis::Client::open(format!("redis://{host}:{port}")).expect("url");
            let ask = async {
                let mut conn = client.get_multiplexed_async_connection().await.ok()?;
                redis::cmd("SENTINEL")
                    .arg("GET-MASTER-ADDR-BY-NAME")
                    .arg(&master)
                    .query_async::<Option<(String, u16)>>(&mut conn)
                    .await
                    .ok()
                    .flatten()
            };
            if let Ok(Some((_, port))) = tokio::time::timeout(Duration::from_secs(1), ask).await {
                return port;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no Sentinel of {url} names a master");
}

/// `redis://127.0.0.1:<port>`.
pub fn local(port: u16) -> String {
    format!("redis://127.0.0.1:{port}")
}

/// The role (`master`, `slave`) of the node on `port`, if it answers.
pub async fn role(port: u16) -> Option<String> {
    let client = redis::Client::open(local(port)).ok()?;
    let ask = async {
        let mut conn = client.get_multiplexed_async_connection().await.ok()?;
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut conn)
            .await
            .ok()?;
        info.lines()
            .find_map(|l| l.strip_prefix("role:"))
            .map(|r| r.trim().to_owned())
    };
    tokio::time::timeout(Duration::from_secs(1), ask)
        .await
        .ok()
        .flatten()
}

/// The port of the cluster master that serves `key` (asked of the nodes of `url`).
pub async fn cluster_master_of(url: &str, key: &str) -> u16 {
    let hosts = url_hosts(url);
    for _ in 0..100 {
        for (host, port) in &hosts {
            let client = redis::Client::open(format!("redis://{host}:{port}")).expect("url");
            let ask = async {
                let mut conn = client.get_multiplexed_async_connection().await.ok()?;
                let slot: i64 = redis::cmd("CLUSTER")
                    .arg("KEYSLOT")
                    .arg(key)
                    .query_async(&mut conn)
                    .await
                    .ok()?;
                let slots: Vec<redis::Value> = redis::cmd("CLUSTER")
                    .arg("SLOTS")
                    .query_async(&mut conn)
                    .await
                    .ok()?;
                for range in slots {
                    let redis::Value::Array(fields) = range else {
                        continue;
                    };
                    let (Some(redis::Value::Int(a)), Some(redis::Value::Int(b))) =
                        (fields.first(), fields.get(1))
                    else {
                        continue;
                    };
                    if (*a..=*b).contains(&slot)
                        && let Some(redis::Value::Array(node)) = fields.get(2)
                        && let Some(redis::Value::Int(p)) = node.get(1)
                    {
                        return u16::try_from(*p).ok();
                    }
                }
                None
            };
            if let Ok(Some(port)) = tokio::time::timeout(Duration::from_secs(1), ask).await {
                return port;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no node of {url} tells the master of {key}");
}

/// `cmdstat_<command>` calls of the server behind `conn`, by command (`INFO commandstats`:
/// the commands that scripts run are counted too).
pub async fn command_calls(
    conn: &mut redis::aio::MultiplexedConnection,
) -> std::collections::HashMap<String, u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .expect("INFO commandstats");
    info.lines()
        .filter_map(|line| {
            let (cmd, stats) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = stats.split(',').find_map(|f| f.strip_prefix("calls="))?;
            Some((cmd.to_owned(), calls.parse().ok()?))
        })
        .collect()
}
