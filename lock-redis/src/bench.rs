//! The raw floors for the shared benchmark harness: `SET name owner NX PX ttl` followed by an
//! `EVALSHA` compare-and-delete, on one multiplexed connection ([`RedisFloor`]) or on N
//! masters at once ([`RedlockFloor`]).

use async_trait::async_trait;
use distlock_bench::RawFloor;
use distlock_core::Error;
use redis::aio::MultiplexedConnection;

use crate::error::RedisError;
use crate::node::NodeTls;
use crate::scripts::{self, Invocation};

/// The cheapest correct Redis lock: two round trips, no fencing, no renewal, no queue.
#[derive(Debug)]
pub struct RedisFloor {
    conn: MultiplexedConnection,
    addr: String,
    counter: u64,
}

impl RedisFloor {
    /// Opens one connection to the node URL `url` (`redis://...` or `rediss://...`, TLS as
    /// the lock's own connections).
    async fn connect(url: &str, tls: &NodeTls) -> Result<Self, Error> {
        let shown = distlock_core::service_url::redact(url);
        let client = tls.client(url, "distlock-floor")?;
        let conn = client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| RedisError::classify(&shown, e).into_lock_error("connect"))?;
        Ok(Self {
            conn,
            addr: shown,
            counter: 0,
        })
    }
}

#[async_trait]
impl RawFloor for RedisFloor {
    fn label(&self) -> &str {
        "SET NX PX + EVALSHA compare-and-delete"
    }

    async fn cycle(&mut self, name: &str) -> Result<(), Error> {
        self.counter += 1;
        let owner = format!("floor-{}", self.counter);
        let set: Option<String> = redis::cmd("SET")
            .arg(name)
            .arg(&owner)
            .arg("NX")
            .arg("PX")
            .arg(30_000)
            .query_async(&mut self.conn)
            .await
            .map_err(|e| RedisError::classify(&self.addr, e).into_lock_error("SET NX"))?;
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
            nodes.push(RedisFloor::connect(url.as_ref(), tls).await?);
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
/// with the URL's credentials and database), [`RedisFloor`] otherwise. `distlock bench` calls it.
///
/// # Errors
/// [`Error::InvalidConfig`] for a bad URL, [`Error::Unavailable`] when a node cannot be reached.
pub async fn floor(url: &str) -> Result<Box<dyn RawFloor>, Error> {
    let config = crate::RedisConfig::from_url(url)?;
    let tls = NodeTls::load(&config).await?;
    if config.is_redlock() {
        Ok(Box::new(RedlockFloor::connect(&config.nodes, &tls).await?))
    } else {
        Ok(Box::new(RedisFloor::connect(&config.nodes[0], &tls).await?))
    }
}
