//! `distlock bench --scenario hold`: readers of each server's OWN request counter, read
//! before and after the hold window (lock-bench's `ServerCounter`).
//!
//! - Redis (`redis://`, `redlock://`, `redis+cluster://`, plain TCP): `total_reads_processed`
//!   of `INFO stats` (the server's reads of client sockets: one per request, or per pipeline),
//!   summed over every node of the URL. `INFO commandstats` would also count every command a
//!   script runs: a batched renewal of 256 locks is one request but 513 commands.
//! - PostgreSQL: `xact_commit + xact_rollback` of the database in `pg_stat_database` (a
//!   transaction per statement in autocommit; `pg_stat_statements` is not installed on the
//!   servers here). PostgreSQL flushes a backend's counts at most once a second, and an idle
//!   backend's within 10 s, so a short window is blurred at its edges.
//! - MySQL / MariaDB: `SHOW GLOBAL STATUS` `Questions` (statements sent by clients).
//! - etcd (`etcd://`, plain HTTP): the sum of `grpc_server_msg_received_total` on each
//!   endpoint's `/metrics`: every request message, unary or on a stream (a lease keep-alive
//!   on a stream counts once per message, where `grpc_server_handled_total` would count the
//!   stream once, at its end).
//! - ZooKeeper (`zk://`): `zk_packets_received` of the `mntr` four-letter word (whitelisted by
//!   scripts/services.sh), summed over the connect string's servers.
//!
//! TLS URLs, Sentinel, Unix sockets, SQLite and memory have none: the report says "n/a".

use std::time::Duration;

use async_trait::async_trait;
use distlock_bench::ServerCounter;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// How long one read may take.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

fn error(what: &str, detail: impl std::fmt::Display) -> distlock::Error {
    distlock::Error::Backend {
        message: format!("{what}: {detail}"),
        source: None,
    }
}

/// Whether `backend` (a scheme table backend name) has a counter for `url`.
pub(crate) fn supported(backend: &str, url: &str) -> bool {
    let scheme = url.split_once("://").map_or("", |(s, _)| s);
    match backend {
        "redis" => scheme == "redis",
        "redlock" => scheme == "redlock",
        "redis-cluster" => scheme == "redis+cluster",
        "etcd" => scheme == "etcd",
        "zookeeper" => scheme == "zk" && !url.contains("auth=sasl"),
        #[cfg(feature = "postgres")]
        "postgres" => true,
        #[cfg(feature = "mysql")]
        "mysql" => true,
        _ => false,
    }
}

/// The counter of `backend` for `url` (see [`supported`]).
pub(crate) async fn connect(
    backend: &str,
    url: &str,
) -> Result<Box<dyn ServerCounter>, distlock::Error> {
    match backend {
        "redis" | "redlock" | "redis-cluster" => {
            let (auth, hosts) = hosts(url, 6379);
            Ok(Box::new(Redis::connect(auth, hosts).await?))
        }
        "etcd" => Ok(Box::new(Etcd {
            hosts: hosts(url, 2379).1,
        })),
        "zookeeper" => Ok(Box::new(Zk {
            hosts: hosts(url, 2181).1,
        })),
        #[cfg(feature = "postgres")]
        "postgres" => Ok(Box::new(sql::Postgres::connect(url).await?)),
        #[cfg(feature = "mysql")]
        "mysql" => Ok(Box::new(sql::Mysql::connect(url).await?)),
        other => Err(distlock::Error::Unsupported(format!(
            "no server counter for the {other} backend"
        ))),
    }
}

/// The URL's user info (`user:password`, if any) and its `host:port` list.
fn hosts(url: &str, default_port: u16) -> (Option<String>, Vec<String>) {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    let (auth, list) = match authority.rsplit_once('@') {
        Some((auth, list)) => (Some(auth.to_owned()), list),
        None => (None, authority),
    };
    let hosts = list
        .split(',')
        .filter(|h| !h.is_empty())
        .map(|h| {
            if h.contains(':') {
                h.to_owned()
            } else {
                format!("{h}:{default_port}")
            }
        })
        .collect();
    (auth, hosts)
}

async fn timed<T>(
    what: &str,
    fut: impl Future<Output = std::io::Result<T>>,
) -> Result<T, distlock::Error> {
    match tokio::time::timeout(READ_TIMEOUT, fut).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(error(what, e)),
        Err(_) => Err(error(what, "timed out")),
    }
}

/// Redis nodes, one kept connection each, spoken to in RESP.
#[derive(Debug)]
struct Redis {
    nodes: Vec<(String, TcpStream)>,
}

impl Redis {
    async fn connect(auth: Option<String>, hosts: Vec<String>) -> Result<Self, distlock::Error> {
        let mut nodes = Vec::with_capacity(hosts.len());
        for host in hosts {
            let mut conn = timed(&host, TcpStream::connect(&host)).await?;
            if let Some(auth) = &auth {
                let parts: Vec<&str> = match auth.split_once(':') {
                    Some(("", password)) => vec!["AUTH", password],
                    Some((user, password)) => vec!["AUTH", user, password],
                    None => vec!["AUTH", auth],
                };
                let reply = Self::command(&host, &mut conn, &parts).await?;
                if reply.starts_with('-') {
                    return Err(error(&host, reply.trim()));
                }
            }
            nodes.push((host, conn));
        }
        Ok(Self { nodes })
    }

    /// Sends one command, returns its reply (a bulk string's payload, else the line).
    async fn command(
        host: &str,
        conn: &mut TcpStream,
        parts: &[&str],
    ) -> Result<String, distlock::Error> {
        let mut request = format!("*{}\r\n", parts.len());
        for part in parts {
            request.push_str(&format!("${}\r\n{part}\r\n", part.len()));
        }
        timed(host, conn.write_all(request.as_bytes())).await?;
        let mut buf = Vec::new();
        let mut chunk = [0u8; 8192];
        loop {
            let n = timed(host, conn.read(&mut chunk)).await?;
            if n == 0 {
                return Err(error(host, "connection closed"));
            }
            buf.extend_from_slice(&chunk[..n]);
            let Some(line_end) = buf.windows(2).position(|w| w == b"\r\n") else {
                continue;
            };
            let first = String::from_utf8_lossy(&buf[..line_end]).into_owned();
            let Some(len) = first.strip_prefix('$') else {
                return Ok(first);
            };
            let len: usize = len.parse().map_err(|_| error(host, "bad RESP length"))?;
            let start = line_end + 2;
            if buf.len() >= start + len + 2 {
                return Ok(String::from_utf8_lossy(&buf[start..start + len]).into_owned());
            }
        }
    }
}

#[async_trait]
impl ServerCounter for Redis {
    fn label(&self) -> &str {
        "Redis INFO stats total_reads_processed"
    }

    async fn read(&mut self) -> Result<u64, distlock::Error> {
        let mut total = 0;
        for (host, conn) in &mut self.nodes {
            let info = Self::command(host, conn, &["INFO", "stats"]).await?;
            total += info
                .lines()
                .find_map(|l| l.strip_prefix("total_reads_processed:"))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .ok_or_else(|| error(host, "no total_reads_processed in INFO stats"))?;
        }
        Ok(total)
    }
}

/// etcd endpoints, read over plain HTTP.
#[derive(Debug)]
struct Etcd {
    hosts: Vec<String>,
}

#[async_trait]
impl ServerCounter for Etcd {
    fn label(&self) -> &str {
        "etcd grpc_server_msg_received_total"
    }

    async fn read(&mut self) -> Result<u64, distlock::Error> {
        let mut total = 0.0;
        for host in &self.hosts {
            let request = format!("GET /metrics HTTP/1.0\r\nHost: {host}\r\n\r\n");
            let body = exchange(host, request.as_bytes()).await?;
            total += body
                .lines()
                .filter(|l| l.starts_with("grpc_server_msg_received_total{"))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>();
        }
        // Counter values are integers printed as floats.
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "a sum of non-negative integer counters"
        )]
        Ok(total as u64)
    }
}

/// ZooKeeper servers, read with `mntr`.
#[derive(Debug)]
struct Zk {
    hosts: Vec<String>,
}

#[async_trait]
impl ServerCounter for Zk {
    fn label(&self) -> &str {
        "ZooKeeper mntr zk_packets_received"
    }

    async fn read(&mut self) -> Result<u64, distlock::Error> {
        let mut total = 0;
        for host in &self.hosts {
            let reply = exchange(host, b"mntr").await?;
            let value = reply
                .lines()
                .find_map(|l| {
                    l.strip_prefix("zk_packets_received")?
                        .trim()
                        .parse::<u64>()
                        .ok()
                })
                .ok_or_else(|| {
                    error(
                        host,
                        "no zk_packets_received in mntr (is mntr whitelisted?)",
                    )
                })?;
            total += value;
        }
        Ok(total)
    }
}

/// Connects, sends `request`, reads until the server closes.
async fn exchange(host: &str, request: &[u8]) -> Result<String, distlock::Error> {
    let mut conn = timed(host, TcpStream::connect(host)).await?;
    timed(host, conn.write_all(request)).await?;
    let mut reply = Vec::new();
    timed(host, conn.read_to_end(&mut reply)).await?;
    Ok(String::from_utf8_lossy(&reply).into_owned())
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
mod sql {
    use async_trait::async_trait;
    use distlock_bench::ServerCounter;
    use sqlx::Connection as _;

    use super::error;

    /// PostgreSQL's `pg_stat_database` for the URL's database.
    #[cfg(feature = "postgres")]
    #[derive(Debug)]
    pub(super) struct Postgres(sqlx::PgConnection);

    #[cfg(feature = "postgres")]
    impl Postgres {
        pub(super) async fn connect(url: &str) -> Result<Self, distlock::Error> {
            let url = distlock_sql::SqlConfig::from_url(url)?.url;
            let conn = sqlx::PgConnection::connect(&url)
                .await
                .map_err(|e| error("postgres counter", e))?;
            Ok(Self(conn))
        }
    }

    #[cfg(feature = "postgres")]
    #[async_trait]
    impl ServerCounter for Postgres {
        fn label(&self) -> &str {
            "PostgreSQL pg_stat_database xact_commit + xact_rollback"
        }

        /// An idle connection's counts reach `pg_stat_database` up to 10 s late.
        fn settle(&self) -> std::time::Duration {
            std::time::Duration::from_secs(11)
        }

        async fn read(&mut self) -> Result<u64, distlock::Error> {
            // A fresh snapshot of the statistics, not the one cached by this session.
            sqlx::query("SELECT pg_stat_clear_snapshot()")
                .execute(&mut self.0)
                .await
                .map_err(|e| error("postgres counter", e))?;
            let (count,): (i64,) = sqlx::query_as(
                "SELECT (xact_commit + xact_rollback)::int8 FROM pg_stat_database \
                 WHERE datname = current_database()",
            )
            .fetch_one(&mut self.0)
            .await
            .map_err(|e| error("postgres counter", e))?;
            Ok(u64::try_from(count).unwrap_or(0))
        }
    }

    /// MySQL's or MariaDB's global `Questions`.
    #[cfg(feature = "mysql")]
    #[derive(Debug)]
    pub(super) struct Mysql(sqlx::MySqlConnection);

    #[cfg(feature = "mysql")]
    impl Mysql {
        pub(super) async fn connect(url: &str) -> Result<Self, distlock::Error> {
            let url = distlock_sql::SqlConfig::from_url(url)?.url;
            let conn = sqlx::MySqlConnection::connect(&url)
                .await
                .map_err(|e| error("mysql counter", e))?;
            Ok(Self(conn))
        }
    }

    #[cfg(feature = "mysql")]
    #[async_trait]
    impl ServerCounter for Mysql {
        fn label(&self) -> &str {
            "MySQL SHOW GLOBAL STATUS Questions"
        }

        async fn read(&mut self) -> Result<u64, distlock::Error> {
            let (_, value): (String, String) =
                sqlx::query_as("SHOW GLOBAL STATUS LIKE 'Questions'")
                    .fetch_one(&mut self.0)
                    .await
                    .map_err(|e| error("mysql counter", e))?;
            value
                .parse()
                .map_err(|_| error("mysql counter", format!("Questions = {value:?}")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::hosts;

    #[test]
    fn hosts_come_from_the_authority() {
        assert_eq!(
            hosts("redlock://u:p@a:1,b,c:3/0?x=y", 6379),
            (
                Some("u:p".to_owned()),
                vec!["a:1".to_owned(), "b:6379".to_owned(), "c:3".to_owned()]
            )
        );
        assert_eq!(
            hosts("zk://127.0.0.1:2181/chroot", 2181),
            (None, vec!["127.0.0.1:2181".to_owned()])
        );
    }
}
