//! Sentinel (`redis+sentinel://`): the master the Sentinels name, asked of all of them at
//! once and followed across failovers (`+switch-master`, or a request that failed on it).

use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use distlock_core::backend::unpoisoned as lock;
use distlock_core::{Error, Result};
use futures::StreamExt;
use futures::future::join_all;
use redis::Value;
use redis::aio::ConnectionManager;
use tokio::task::AbortHandle;

use super::{NodeTemplate, host_port, manager_config};
use crate::RedisConfig;
use crate::error::RedisError;
use crate::node::NodeTls;

/// The master the Sentinels name, with a connection to it, replaced when they name another.
pub(crate) struct SentinelMaster {
    name: String,
    sentinels: Vec<(String, redis::Client)>,
    pub(super) template: NodeTemplate,
    timeout: Duration,
    /// Whether grants wait for replicas (`wait_replicas`): only then has the master a
    /// connection for their `WAIT`s ([`Lane::Waits`]).
    waits: bool,
    current: Mutex<Current>,
    /// One resolution at a time; the last one's end, to space them.
    resolving: tokio::sync::Mutex<Option<Instant>>,
    /// The `+switch-master` listeners, stopped with the master.
    listeners: Mutex<Vec<AbortHandle>>,
}

struct Current {
    addr: String,
    client: redis::Client,
    conn: ConnectionManager,
    /// The `WAIT` lane (see [`Lane::Waits`]), connected at its first use; `conn` without
    /// `wait_replicas`.
    waits: ConnectionManager,
}

/// Which of the master's two connections a request goes on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lane {
    /// The lock commands.
    Locks,
    /// The `wait_replicas` grants' pipelines: a `WAIT` blocks its connection until the
    /// replicas acknowledge or its timeout, and on the lock commands' connection it held up
    /// every renewal, release and attempt behind it while the replicas lagged.
    Waits,
}

impl std::fmt::Debug for SentinelMaster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelMaster")
            .field("name", &self.name)
            .field("master", &self.addr())
            .finish_non_exhaustive()
    }
}

impl Drop for SentinelMaster {
    fn drop(&mut self) {
        for task in lock(&self.listeners).drain(..) {
            task.abort();
        }
    }
}

/// How long a failed or finished resolution keeps the next one waiting.
const RESOLVE_SPACING: Duration = Duration::from_millis(50);

impl SentinelMaster {
    /// Asks the Sentinels (`config.nodes`) for the master `config.sentinel_master`, connects to
    /// it and starts listening for `+switch-master` on every Sentinel.
    ///
    /// # Errors
    /// [`Error::Unavailable`] when no Sentinel names a master within `timeout`.
    pub(crate) async fn connect(
        config: &RedisConfig,
        tls: NodeTls,
        timeout: Duration,
    ) -> Result<Arc<Self>> {
        let name = config.sentinel_master.clone().unwrap_or_default();
        let template = NodeTemplate::new(&config.nodes[0], tls, config)?;
        let mut sentinels = Vec::new();
        for node in &config.nodes {
            let (host, port) = host_port(node).ok_or_else(|| {
                Error::InvalidConfig(format!(
                    "invalid Sentinel address {}",
                    distlock_core::service_url::redact(node)
                ))
            })?;
            let client = template.sentinel_client(&host, port)?;
            sentinels.push((format!("{host}:{port}"), client));
        }
        let (host, port) = resolve(&sentinels, &name, timeout)
            .await
            .map_err(|e| e.into_lock_error(&format!("ask the Sentinels for master {name:?}")))?;
        let client = template.client(&host, port)?;
        let lazy = || {
            ConnectionManager::new_lazy_with_config(client.clone(), manager_config(timeout))
                .map_err(|e| RedisError::classify(&host, e).into_lock_error("connect"))
        };
        let conn = lazy()?;
        let waits = if config.wait_replicas > 0 {
            lazy()?
        } else {
            conn.clone()
        };
        let master = Arc::new(Self {
            name,
            sentinels,
            template,
            timeout,
            waits: config.wait_replicas > 0,
            current: Mutex::new(Current {
                addr: format!("{host}:{port}"),
                client,
                conn,
                waits,
            }),
            resolving: tokio::sync::Mutex::new(None),
            listeners: Mutex::new(Vec::new()),
        });
        let listeners = master
            .sentinels
            .iter()
            .map(|(_, client)| {
                tokio::spawn(listen(Arc::downgrade(&master), client.clone())).abort_handle()
            })
            .collect();
        *lock(&master.listeners) = listeners;
        Ok(master)
    }

    /// The current master's address.
    pub(crate) fn addr(&self) -> String {
        lock(&self.current).addr.clone()
    }

    /// The current master's client.
    pub(crate) fn client(&self) -> redis::Client {
        lock(&self.current).client.clone()
    }

    /// The current master's connection of `lane`.
    pub(super) fn connection(&self, lane: Lane) -> ConnectionManager {
        let current = lock(&self.current);
        match lane {
            Lane::Locks => current.conn.clone(),
            Lane::Waits => current.waits.clone(),
        }
    }

    /// After a request, its answers or its failure: a master that is gone or was made a
    /// replica (`READONLY`) is looked up again, in the background. A server's refusal comes
    /// back as an answer ([`Value::ServerError`]), not as a failed request.
    pub(super) fn check(
        self: &Arc<Self>,
        outcome: std::result::Result<&[Value], &redis::RedisError>,
    ) {
        let moved = match outcome {
            Ok(answers) => answers.iter().any(read_only),
            // A refusal inside an answer (a batch renewal's, a transaction's) is seen where it
            // is classified (`Node::classify`).
            Err(error) => {
                error.is_io_error()
                    || error.is_connection_refusal()
                    || error.is_connection_dropped()
                    || error.is_timeout()
            }
        };
        if moved {
            self.look_again();
        }
    }

    /// Asks the Sentinels for the master again, in the background ([`Self::refresh`]).
    pub(crate) fn look_again(self: &Arc<Self>) {
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let master = self.clone();
            handle.spawn(async move { master.refresh().await });
        }
    }

    /// Asks the Sentinels again and, if they name another master, switches every new request
    /// to it. Spaced: concurrent callers share one resolution.
    pub(crate) async fn refresh(&self) {
        let Ok(mut last) = self.resolving.try_lock() else {
            // Someone is resolving now: its answer serves us too.
            let _ = self.resolving.lock().await;
            return;
        };
        if last.is_some_and(|at| at.elapsed() < RESOLVE_SPACING) {
            return;
        }
        let resolved = resolve(&self.sentinels, &self.name, self.timeout).await;
        *last = Some(Instant::now());
        let Ok((host, port)) = resolved else { return };
        let addr = format!("{host}:{port}");
        if addr == self.addr() {
            return;
        }
        let Ok(client) = self.template.client(&host, port) else {
            return;
        };
        let lazy = || {
            ConnectionManager::new_lazy_with_config(client.clone(), manager_config(self.timeout))
        };
        let Ok(conn) = lazy() else { return };
        let waits = if self.waits {
            let Ok(waits) = lazy() else { return };
            waits
        } else {
            conn.clone()
        };
        let mut current = lock(&self.current);
        tracing::warn!(
            master = %self.name,
            old = %current.addr,
            new = %addr,
            "Sentinel failover: the lock's master moved"
        );
        *current = Current {
            addr,
            client,
            conn,
            waits,
        };
    }
}

/// Whether `answer` is a `READONLY` refusal (a master made a replica), also one a script's
/// write got, which a server before 7.0 quotes in a script error.
fn read_only(answer: &Value) -> bool {
    matches!(answer, Value::ServerError(error)
        if error.code() == "READONLY"
            || error.details().is_some_and(|d| d.contains(READ_ONLY_REFUSAL)))
}

/// The text of a replica's refusal of a write.
const READ_ONLY_REFUSAL: &str = "READONLY You can't write";

/// The master the Sentinels name: asked of all at once, the address most of those that
/// answered give (ties: the first Sentinel's).
async fn resolve(
    sentinels: &[(String, redis::Client)],
    name: &str,
    timeout: Duration,
) -> std::result::Result<(String, u16), RedisError> {
    let asks = sentinels.iter().map(|(addr, client)| async move {
        let ask = async {
            let mut conn = client.get_multiplexed_async_connection().await?;
            redis::cmd("SENTINEL")
                .arg("GET-MASTER-ADDR-BY-NAME")
                .arg(name)
                .query_async::<Option<(String, u16)>>(&mut conn)
                .await
        };
        match tokio::time::timeout(timeout, ask).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(e)) => Err(RedisError::classify(addr, e)),
            Err(_) => Err(RedisError::timeout(addr)),
        }
    });
    let answers = join_all(asks).await;
    let mut votes: Vec<((String, u16), usize)> = Vec::new();
    let mut failure = None;
    for answer in answers {
        match answer {
            Ok(Some(addr)) => match votes.iter_mut().find(|(a, _)| *a == addr) {
                Some((_, n)) => *n += 1,
                None => votes.push((addr, 1)),
            },
            Ok(None) => {}
            Err(e) => failure = Some(e),
        }
    }
    let best = votes.iter().map(|(_, n)| *n).max().unwrap_or(0);
    match votes.into_iter().find(|(_, n)| *n == best) {
        Some((addr, _)) => Ok(addr),
        None => Err(failure.unwrap_or_else(|| RedisError {
            kind: crate::RedisErrorKind::Other,
            node: sentinels
                .iter()
                .map(|(a, _)| a.as_str())
                .collect::<Vec<_>>()
                .join(","),
            source: Some(redis::RedisError::from((
                redis::ErrorKind::Io,
                "no Sentinel knows the master name",
            ))),
        })),
    }
}

/// Listens for `+switch-master` on one Sentinel and makes the master look again at once;
/// reconnects while the master lives.
async fn listen(master: Weak<SentinelMaster>, sentinel: redis::Client) {
    let mut pause = Duration::from_millis(100);
    loop {
        let Some(timeout) = master.upgrade().map(|m| m.timeout) else {
            return;
        };
        let subscribed = tokio::time::timeout(timeout, async {
            let mut pubsub = sentinel.get_async_pubsub().await.ok()?;
            pubsub.subscribe("+switch-master").await.ok()?;
            Some(pubsub)
        })
        .await;
        if let Ok(Some(pubsub)) = subscribed {
            pause = Duration::from_millis(100);
            let mut messages = pubsub.into_on_message();
            while let Some(message) = messages.next().await {
                let Some(master) = master.upgrade() else {
                    return;
                };
                // "<name> <old ip> <old port> <new ip> <new port>"
                let payload: String = message.get_payload().unwrap_or_default();
                if payload.split(' ').next() == Some(master.name.as_str()) {
                    master.refresh().await;
                }
            }
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(2));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::{Conn, Lane};

    /// The replicas online of the master the Sentinels named at connect time (`ROLE`),
    /// waited for (at most 30 s) after a test that stopped or killed one.
    async fn replicas(master: &SentinelMaster) -> Vec<(String, u16)> {
        let mut conn = master
            .client()
            .get_multiplexed_async_connection()
            .await
            .expect("the master");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (_, _, listed): (String, i64, Vec<(String, String, String)>) = redis::cmd("ROLE")
                .query_async(&mut conn)
                .await
                .expect("ROLE");
            let online: Vec<(String, u16)> = listed
                .into_iter()
                .filter_map(|(host, port, _)| Some((host, port.parse().ok()?)))
                .collect();
            if !online.is_empty() {
                return online;
            }
            assert!(Instant::now() < deadline, "no replica online after 30 s");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The test Sentinel group's turn, configuration and TLS; `None` without it.
    async fn group() -> Option<(tokio::sync::MutexGuard<'static, ()>, RedisConfig, NodeTls)> {
        let url =
            conformance_tests::server_var("redis_sentinel", "DISTLOCK_TEST_REDIS_SENTINEL_URL")?;
        let turn = crate::topology::SENTINEL_GROUP.lock().await;
        let config = RedisConfig::from_url(&url).expect("URL");
        let tls = NodeTls::load(&config).await.expect("TLS");
        Some((turn, config, tls))
    }

    /// The test masters' timeout, every Sentinel's answer's.
    const TIMEOUT: Duration = Duration::from_secs(2);

    /// Points `master`'s requests at the replica `(host, port)`, as if the master the client
    /// knew had been made a replica behind its back.
    fn demoted(master: &SentinelMaster, (host, port): &(String, u16)) {
        let client = master.template.client(host, *port).expect("client");
        let lazy = || {
            ConnectionManager::new_lazy_with_config(client.clone(), manager_config(master.timeout))
                .expect("manager")
        };
        let (conn, waits) = (lazy(), lazy());
        *lock(&master.current) = Current {
            addr: format!("{host}:{port}"),
            client: client.clone(),
            conn,
            waits,
        };
    }

    /// Waits (at most 10 s: a resolution waits up to 2 s for a Sentinel) until `master`
    /// goes to `named` again.
    async fn looked_up_again(master: &SentinelMaster, named: &str, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while master.addr() != named {
            assert!(
                Instant::now() < deadline,
                "after {what}, still on {} 10 s later",
                master.addr()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A master that answers `READONLY` (made a replica) is looked up again, for a command
    /// and for a script's write in a pipeline: the Sentinels' master serves the next
    /// requests. The refusal comes back as an answer, not as a failed request: unseen, the
    /// client went on writing to the replica until a Sentinel's `+switch-master` or the
    /// restart watch told it.
    #[tokio::test]
    async fn a_master_answering_read_only_is_looked_up_again() {
        let Some((_group, config, tls)) = group().await else {
            return;
        };
        let master = SentinelMaster::connect(&config, tls, TIMEOUT)
            .await
            .expect("connect");
        let named = master.addr();
        let replica = replicas(&master).await.swap_remove(0);
        let key = format!("read-only-{}", uuid::Uuid::new_v4().simple());
        let mut conn = Conn::Sentinel(master.clone(), Lane::Locks);

        demoted(&master, &replica);
        let set: redis::RedisResult<()> = redis::cmd("SET")
            .arg(&key)
            .arg("x")
            .query_async(&mut conn)
            .await;
        let refused = set.expect_err("a replica took a write");
        assert_eq!(refused.code(), Some("READONLY"), "{refused}");
        looked_up_again(&master, &named, "a refused SET").await;

        // Past the spacing of resolutions.
        tokio::time::sleep(RESOLVE_SPACING * 2).await;
        demoted(&master, &replica);
        let written: redis::RedisResult<Vec<Value>> = redis::pipe()
            .cmd("EVAL")
            .arg("return redis.call('SET', KEYS[1], ARGV[1])")
            .arg(1)
            .arg(&key)
            .arg("x")
            .ignore_errors()
            .query_async(&mut conn)
            .await;
        let answers = written.expect("the pipeline's answers");
        assert!(answers.iter().any(read_only), "{answers:?}");
        looked_up_again(&master, &named, "a script's refused write").await;

        let _: redis::RedisResult<()> = redis::cmd("DEL").arg(&key).query_async(&mut conn).await;
    }

    /// A batch renewal on a master made a replica answers each lock's refusal inside its
    /// answer (an array), which no request check sees: its classification looks the master
    /// up again. The lock is written on the master and on every replica first, so that the
    /// replica finds it ours and refuses the renewal's write.
    #[tokio::test]
    async fn a_batch_renewal_refused_as_read_only_looks_the_master_up_again() {
        let Some((_group, config, tls)) = group().await else {
            return;
        };
        let node = crate::node::Node::sentinel(&config, tls, TIMEOUT)
            .await
            .expect("connect");
        let crate::topology::Endpoint::Sentinel(master) = &node.endpoint else {
            panic!("a Sentinel node without its master");
        };
        let named = master.addr();
        let replicas = replicas(master).await;
        let owner = uuid::Uuid::new_v4().simple().to_string();
        let keys = crate::LockKeys::for_name(&format!("batch-{owner}")).expect("name");
        let mut conn = node.conn.clone();
        let () = redis::cmd("SET")
            .arg(&keys.lock)
            .arg(&owner)
            .arg("PX")
            .arg(60_000)
            .query_async(&mut conn)
            .await
            .expect("SET");
        let copies: i64 = redis::cmd("WAIT")
            .arg(replicas.len())
            .arg(5_000)
            .query_async(&mut conn)
            .await
            .expect("WAIT");
        assert_eq!(copies, replicas.len() as i64, "the replicas lack the lock");

        demoted(master, &replicas[0]);
        let answers: Vec<Value> =
            crate::scripts::Invocation::new(&crate::scripts::RENEW_MANY, &[&keys.lock])
                .arg(&owner)
                .arg(30_000)
                .arg("")
                .arg("")
                .invoke(&mut conn)
                .await
                .expect("the batch's answers");
        let [answer] = <[Value; 1]>::try_from(answers).expect("one answer");
        let refused = crate::renew::answer(&node, answer).expect_err("a replica renewed");
        assert_eq!(
            refused.kind,
            crate::error::RedisErrorKind::Failover,
            "{refused:?}"
        );
        looked_up_again(master, &named, "a batch renewal's refusal").await;
        let _: redis::RedisResult<()> = redis::cmd("DEL")
            .arg(&keys.lock)
            .query_async(&mut conn)
            .await;
    }
}
