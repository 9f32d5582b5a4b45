//! The raw floors for the shared benchmark harness: `SET name owner NX PX ttl` followed by an
//! `EVALSHA` compare-and-delete, on one multiplexed connection ([`RedisFloor`]) or on N
//! masters at once ([`RedlockFloor`]). The fenced floor (`distlock bench --fenced-floor`) also
//! takes a fencing token with each `SET`, atomically.

use async_trait::async_trait;
use distlock_bench::{BenchHooks, RawFloor, ServerCounter, probe_error as error, timed};
use distlock_core::Error;
use redis::aio::MultiplexedConnection;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::error::RedisError;
use crate::node::NodeTls;
use crate::scripts::{self, Invocation};

/// The cheapest correct Redis lock: two round trips, no renewal, no queue; no fencing, or
/// (fenced) the least fencing: `MULTI; SET NX PX; INCR; EXEC`, so that the token steps in the
/// same transaction as the `SET` (as distlock's fast path does).
#[derive(Debug)]
pub struct RedisFloor {
    conn: FloorConn,
    addr: String,
    counter: u64,
    fenced: bool,
}

impl RedisFloor {
    /// Opens one connection to the node URL `url` (`redis://...` or `rediss://...`, TLS as
    /// the lock's own connections).
    async fn connect(url: &str, tls: &NodeTls, fenced: bool) -> Result<Self, Error> {
        let shown = distlock_core::service_url::redact(url);
        let client = tls.client(url, "distlock-floor")?;
        let conn = client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| RedisError::classify(&shown, e).into_lock_error("connect"))?;
        Ok(Self {
            conn: FloorConn::Plain(conn),
            addr: shown,
            counter: 0,
            fenced,
        })
    }
}

/// One master's connection, or the Sentinel master's or the cluster's.
#[derive(Clone, Debug)]
enum FloorConn {
    Plain(MultiplexedConnection),
    Topology(crate::topology::Conn),
}

impl redis::aio::ConnectionLike for FloorConn {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        match self {
            Self::Plain(conn) => conn.req_packed_command(cmd),
            Self::Topology(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        match self {
            Self::Plain(conn) => conn.req_packed_commands(cmd, offset, count),
            Self::Topology(conn) => conn.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Plain(conn) => conn.get_db(),
            Self::Topology(conn) => conn.get_db(),
        }
    }
}

#[async_trait]
impl RawFloor for RedisFloor {
    fn label(&self) -> &str {
        if self.fenced {
            "MULTI SET NX PX + INCR EXEC, EVALSHA compare-and-delete"
        } else {
            "SET NX PX + EVALSHA compare-and-delete"
        }
    }

    async fn cycle(&mut self, name: &str) -> Result<(), Error> {
        self.counter += 1;
        let owner = format!("floor-{}", self.counter);
        let mut set = redis::cmd("SET");
        set.arg(name).arg(&owner).arg("NX").arg("PX").arg(30_000);
        let set: Option<String> = if self.fenced {
            let (set, _token): (Option<String>, u64) = redis::pipe()
                .atomic()
                .add_command(set)
                // The name as the hash tag: the counter sits in the name's cluster slot.
                .incr(format!("{{{name}}}:fence"), 1)
                .query_async(&mut self.conn)
                .await
                .map_err(|e| RedisError::classify(&self.addr, e).into_lock_error("MULTI SET NX"))?;
            set
        } else {
            set.query_async(&mut self.conn)
                .await
                .map_err(|e| RedisError::classify(&self.addr, e).into_lock_error("SET NX"))?
        };
        if set.is_none() {
            return Err(Error::Backend {
                message: format!("{name:?} is already held"),
                source: None,
            });
        }
        let deleted: i64 = Invocation::new(&scripts::COMPARE_AND_DELETE, &[name])
            .arg(&owner)
            .invoke(&mut self.conn)
            .await
            .map_err(|e| RedisError::classify(&self.addr, e).into_lock_error("EVALSHA del"))?;
        if deleted == 1 {
            Ok(())
        } else {
            Err(Error::NotHeld {
                name: name.to_owned(),
            })
        }
    }
}

/// The cheapest Redlock: `SET NX PX` on all masters at once, then the compare-and-delete on
/// all of them (a majority must agree). No fencing, no validity check, no retry.
#[derive(Debug)]
pub struct RedlockFloor {
    nodes: Vec<RedisFloor>,
    counter: u64,
}

impl RedlockFloor {
    /// Opens one connection to each node URL.
    async fn connect<S: AsRef<str> + Sync>(urls: &[S], tls: &NodeTls) -> Result<Self, Error> {
        let mut nodes = Vec::with_capacity(urls.len());
        for url in urls {
            nodes.push(RedisFloor::connect(url.as_ref(), tls, false).await?);
        }
        Ok(Self { nodes, counter: 0 })
    }
}

#[async_trait]
impl RawFloor for RedlockFloor {
    fn label(&self) -> &str {
        "SET NX PX + EVALSHA del on all masters"
    }

    async fn cycle(&mut self, name: &str) -> Result<(), Error> {
        self.counter += 1;
        let owner = format!("floor-{}", self.counter);
        let quorum = self.nodes.len() / 2 + 1;
        let sets = futures::future::join_all(self.nodes.iter().map(|node| {
            let mut conn = node.conn.clone();
            let owner = owner.clone();
            async move {
                redis::cmd("SET")
                    .arg(name)
                    .arg(&owner)
                    .arg("NX")
                    .arg("PX")
                    .arg(30_000)
                    .query_async::<Option<String>>(&mut conn)
                    .await
            }
        }))
        .await;
        let acquired = sets.iter().filter(|r| matches!(r, Ok(Some(_)))).count();
        let dels = futures::future::join_all(self.nodes.iter().map(|node| {
            let mut conn = node.conn.clone();
            let owner = owner.clone();
            async move {
                Invocation::new(&scripts::COMPARE_AND_DELETE, &[name])
                    .arg(&owner)
                    .invoke::<i64>(&mut conn)
                    .await
            }
        }))
        .await;
        let released = dels.iter().filter(|r| matches!(r, Ok(1))).count();
        if acquired >= quorum && released >= quorum {
            Ok(())
        } else {
            Err(Error::Backend {
                message: format!("{name:?}: {acquired} acquired, {released} released"),
                source: None,
            })
        }
    }
}

/// The raw floor for a lock URL: [`RedlockFloor`] over every node of a `redlock://` URL (each
/// with the URL's credentials and database), [`RedisFloor`] otherwise (on the master the
/// Sentinels name, or on the cluster with its routing). `distlock bench` calls it.
///
/// # Errors
/// [`Error::InvalidConfig`] for a bad URL, [`Error::Unavailable`] when a node cannot be reached.
pub async fn floor(url: &str) -> Result<Box<dyn RawFloor>, Error> {
    connect_floor(url, false).await
}

/// The fenced raw floor for a lock URL: [`RedisFloor`] taking a fencing token with each `SET`
/// (`distlock bench --fenced-floor`).
///
/// # Errors
/// As [`floor`]; [`Error::Unsupported`] for a `redlock://` URL (its floor has no tokens).
pub async fn fenced_floor(url: &str) -> Result<Box<dyn RawFloor>, Error> {
    connect_floor(url, true).await
}

async fn connect_floor(url: &str, fenced: bool) -> Result<Box<dyn RawFloor>, Error> {
    let config = crate::RedisConfig::from_url(url)?;
    if fenced && config.is_redlock() {
        return Err(Error::Unsupported(
            "no fenced floor for Redlock (its floor takes no tokens)".into(),
        ));
    }
    let tls = NodeTls::load(&config).await?;
    let timeout = std::time::Duration::from_secs(5);
    let node = match config.topology() {
        crate::Topology::Sentinel => {
            Some(crate::node::Node::sentinel(&config, tls.clone(), timeout).await?)
        }
        crate::Topology::Cluster => {
            Some(crate::node::Node::cluster(&config, tls.clone(), timeout).await?)
        }
        _ => None,
    };
    if let Some(node) = node {
        return Ok(Box::new(RedisFloor {
            conn: FloorConn::Topology(node.conn.clone()),
            addr: node.addr.clone(),
            counter: 0,
            fenced,
        }));
    }
    if config.is_redlock() {
        Ok(Box::new(RedlockFloor::connect(&config.nodes, &tls).await?))
    } else {
        Ok(Box::new(
            RedisFloor::connect(&config.nodes[0], &tls, fenced).await?,
        ))
    }
}

/// The hooks of a single master (and of Sentinel's): [`floor`], [`fenced_floor`] and, on
/// plain TCP, the server counter ([`server_counter`]).
pub const REDIS: BenchHooks = BenchHooks::new()
    .with_floor(|url| Box::pin(async move { floor(&url).await }))
    .with_fenced_floor(|url| Box::pin(async move { fenced_floor(&url).await }))
    .with_server_counter(
        |url| url.starts_with("redis://"),
        |url| Box::pin(async move { server_counter(&url).await }),
    );

/// Redlock's hooks: [`floor`] on every master, and their summed server counter.
pub const REDLOCK: BenchHooks = BenchHooks::new()
    .with_floor(|url| Box::pin(async move { floor(&url).await }))
    .with_server_counter(
        |url| url.starts_with("redlock://"),
        |url| Box::pin(async move { server_counter(&url).await }),
    );

/// Sentinel's hooks: the floors on the master the Sentinels name (its counter would need the
/// master's address, which the URL does not give).
pub const SENTINEL: BenchHooks = BenchHooks::new()
    .with_floor(|url| Box::pin(async move { floor(&url).await }))
    .with_fenced_floor(|url| Box::pin(async move { fenced_floor(&url).await }));

/// Cluster's hooks: the floors with the cluster's routing, and the counter summed over the
/// URL's nodes.
pub const CLUSTER: BenchHooks = BenchHooks::new()
    .with_floor(|url| Box::pin(async move { floor(&url).await }))
    .with_fenced_floor(|url| Box::pin(async move { fenced_floor(&url).await }))
    .with_server_counter(
        |url| url.starts_with("redis+cluster://"),
        |url| Box::pin(async move { server_counter(&url).await }),
    );

/// The server's own request counter for `distlock bench --scenario hold`:
/// `total_reads_processed` of `INFO stats` (the server's reads of client sockets: one per
/// request, or per pipeline), summed over every node of the URL (plain TCP). `INFO
/// commandstats` would also count every command a script runs: a batched renewal of 256 locks
/// is one request but 513 commands.
///
/// # Errors
/// [`Error::Backend`] when a node cannot be reached or refuses the URL's credentials.
pub async fn server_counter(url: &str) -> Result<Box<dyn ServerCounter>, Error> {
    let (auth, hosts) = distlock_bench::url_hosts(url, 6379);
    Ok(Box::new(Redis::connect(auth, hosts).await?))
}

/// Redis nodes, one kept connection each, spoken to in RESP.
#[derive(Debug)]
struct Redis {
    nodes: Vec<(String, TcpStream)>,
}

impl Redis {
    async fn connect(auth: Option<String>, hosts: Vec<String>) -> Result<Self, Error> {
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
    async fn command(host: &str, conn: &mut TcpStream, parts: &[&str]) -> Result<String, Error> {
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

    async fn read(&mut self) -> Result<u64, Error> {
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
