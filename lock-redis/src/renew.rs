//! Batched renewal: the automatic renewals of a client's leases that fall due together go to
//! the server as one request per master and batch instead of one per lock.
//!
//! - **One master and Sentinel**: one [`RENEW_MANY`](scripts::RENEW_MANY) script call per
//!   batch (`EVALSHA`, resent as `EVAL` after `NOSCRIPT`) on the master of the moment, which
//!   renews each lock exactly as its own renew script would and answers per lock.
//! - **Cluster**: a script's declared keys must share one slot, and every lock name is a hash
//!   tag of its own, so the batch is split by the master that serves each lock's slot (as
//!   last read from `CLUSTER SLOTS`), and each master gets one
//!   [`RENEW_MANY_ON_NODE`](scripts::RENEW_MANY_ON_NODE) call per [`MAX_BATCH`] locks: the
//!   same script with the keys passed as arguments, routed by the first lock's key. All
//!   masters at once: one round trip and one script call per master and batch. A lock whose
//!   slot that node no longer serves (a resharding, a failover), a script the node does not
//!   know, or a call the cluster redirected falls back to that lock's own renewal request,
//!   which the cluster client routes, redirects and reloads.
//! - **Redlock**: the batch script on every master at once; each lock is renewed iff a
//!   majority renewed it within its validity, as in its own renewal (`redlock.rs`).
//!
//! Every kind (exclusive, shared, permit) is batched.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use async_trait::async_trait;
use distlock_core::backend::{RenewItem, Renewer, downcast_lease};
use distlock_core::{Error, LockKind, Result};
use futures::future::join_all;
use redis::Value;

use crate::backend::BackendState;
use crate::error::{RedisError, RedisErrorKind};
use crate::keys::of_kind;
use crate::kinds::marker;
use crate::lease::RedisLease;
use crate::node::{Node, millis};
use crate::redlock;
use crate::scripts::{self, Invocation};
use crate::topology::ClusterTopology;

/// The most locks one batched renewal carries, and one script call renews.
///
/// The batch script runs atomically, so it holds the server (every other client's commands)
/// for as long as it runs: about 2.5 µs per lock on Redis 7.0 (`INFO commandstats`: 0.6-0.8
/// ms for 256 locks, 2.2-2.7 ms for 1,024, where one lock's own renew script takes 8-10 µs),
/// so 256 locks keep that pause under a millisecond while a client holding 1,000 locks still
/// needs only 4 requests per renewal interval. The request itself is small (about 120 bytes a lock) and far below Redis's
/// argument limits (`proto-max-bulk-len`, 2^31 arguments); the script walks `KEYS` and
/// `ARGV` in a loop, so Lua's `unpack` limit (about 8,000 values on the C stack) does not
/// apply. A Redlock node's answer must also come within its node timeout (a tenth of the
/// ttl by default).
pub(crate) const MAX_BATCH: usize = 256;

/// The [`Renewer`] of one backend (one per [`BackendState`], so all its leases batch together).
#[derive(Debug)]
pub(crate) struct RedisRenewer {
    /// A cluster's slot map: a batch spreads over its masters, [`MAX_BATCH`] for each.
    cluster: Option<Arc<ClusterTopology>>,
}

impl RedisRenewer {
    /// The renewer of a backend over `nodes`.
    pub(crate) fn new(nodes: &[Node]) -> Self {
        Self {
            cluster: nodes.first().and_then(|n| n.cluster_topology().cloned()),
        }
    }
}

/// A batch: each lease with the ttl to renew it to.
pub(crate) type Batch<'a> = [(&'a RedisLease, Duration)];

/// One master's answer for each lock of a batch: renewed, not held, or an error of that lock.
pub(crate) type Answers = Vec<std::result::Result<bool, RedisError>>;

#[async_trait]
impl Renewer for RedisRenewer {
    /// [`MAX_BATCH`]; for a cluster, [`MAX_BATCH`] per master (a batch is split by master,
    /// then into script calls of at most [`MAX_BATCH`]).
    fn max_batch(&self) -> usize {
        let masters = self.cluster.as_ref().map_or(1, |t| t.masters().len());
        MAX_BATCH * masters.max(1)
    }

    async fn renew_many(&self, items: &[RenewItem<'_>]) -> Result<Vec<Result<()>>> {
        let leases: Vec<Option<&RedisLease>> = items
            .iter()
            .map(|item| downcast_lease::<RedisLease>(item.lease))
            .collect();
        let Some(shared) = leases.iter().flatten().next().map(|l| l.shared.clone()) else {
            return Ok(items.iter().map(|_| foreign()).collect());
        };
        // The leases of this backend (all of them, unless the core mixed backends).
        let (mut mine, mut batch) = (Vec::with_capacity(items.len()), Vec::new());
        for (item, lease) in items.iter().zip(&leases) {
            let ours = lease.filter(|l| Arc::ptr_eq(&l.shared, &shared));
            mine.push(ours.is_some());
            if let Some(lease) = ours {
                batch.push((lease, item.ttl));
            }
        }
        let mut answers = renew(&shared, &batch).await?.into_iter();
        Ok(mine
            .into_iter()
            .map(|ours| {
                if ours {
                    answers.next().unwrap_or_else(foreign)
                } else {
                    foreign()
                }
            })
            .collect())
    }
}

/// The answer for a lease this renewer cannot renew (another backend's).
fn foreign() -> Result<()> {
    Err(Error::Backend {
        message: "a lease of another backend in a Redis renewal batch".into(),
        source: None,
    })
}

/// Renews `batch` on the backend's master(s); `Err` when no master answered at all.
async fn renew(shared: &BackendState, batch: &Batch<'_>) -> Result<Vec<Result<()>>> {
    if shared.redlock() {
        return redlock::renew_many(shared, batch).await;
    }
    let node = &shared.nodes[0];
    let answers = match node.cluster_topology() {
        Some(topology) => on_cluster(node, topology, batch).await,
        None => on_master(node, batch)
            .await
            .map_err(|e| e.into_lock_error("renew"))?,
    };
    Ok(batch
        .iter()
        .zip(answers)
        .map(|((lease, _), answer)| match answer {
            Ok(true) => Ok(()),
            Ok(false) => Err(Error::not_held(&lease.name)),
            Err(err) => Err(err.into_lock_error("renew")),
        })
        .collect())
}

/// Renews `batch` on one master (the Sentinels' master of the moment for a Sentinel node) by
/// [`scripts::RENEW_MANY`] calls of at most [`MAX_BATCH`] locks. `Err`: a call failed as a
/// whole.
pub(crate) async fn on_master(
    node: &Node,
    batch: &Batch<'_>,
) -> std::result::Result<Answers, RedisError> {
    let mut answers = Vec::with_capacity(batch.len());
    for part in batch.chunks(MAX_BATCH) {
        answers.extend(script(node, part, false).await?);
    }
    Ok(answers)
}

/// One batch script call for `part`: [`scripts::RENEW_MANY`], or
/// [`scripts::RENEW_MANY_ON_NODE`] for locks of many slots of one cluster master (`on_node`).
async fn script(
    node: &Node,
    part: &Batch<'_>,
    on_node: bool,
) -> std::result::Result<Answers, RedisError> {
    let Some((first, _)) = part.first() else {
        return Ok(Vec::new());
    };
    // The holders and tokens keys of shared holds and permits, owned here for the call.
    let hold_keys: Vec<Option<[String; 2]>> = part
        .iter()
        .map(|(lease, _)| {
            (lease.kind != LockKind::Exclusive)
                .then(|| [of_kind(&lease.lock, 'h'), of_kind(&lease.lock, 't')])
        })
        .collect();
    let mut keys: Vec<&str> = Vec::with_capacity(part.len());
    for ((lease, _), hold) in part.iter().zip(&hold_keys) {
        keys.push(&lease.lock);
        if let Some([holders, tokens]) = hold {
            keys.push(holders);
            keys.push(tokens);
        }
    }
    let room: usize = part.iter().map(|(l, _)| l.owner.len() + 32).sum();
    let mut call = if on_node {
        let room = room + keys.iter().map(|k| k.len() + 16).sum::<usize>();
        let mut call = Invocation::sized(
            &scripts::RENEW_MANY_ON_NODE,
            &[&first.lock],
            1 + keys.len() + part.len() * 4,
            room,
        )
        .arg(keys.len());
        for key in &keys {
            call = call.arg(*key);
        }
        call
    } else {
        Invocation::sized(&scripts::RENEW_MANY, &keys, part.len() * 4, room)
    };
    for (lease, ttl) in part {
        let kind_marker = match lease.kind {
            LockKind::Exclusive => String::new(),
            kind => marker(kind),
        };
        let data = if lease.has_data.load(Ordering::Relaxed) {
            "1"
        } else {
            ""
        };
        call = call
            .arg(&*lease.owner)
            .arg(millis(*ttl))
            .arg(kind_marker)
            .arg(data);
    }
    let mut conn = node.conn.clone();
    let values: Vec<Value> = call.invoke(&mut conn).await.map_err(|e| node.classify(e))?;
    if values.len() != part.len() {
        return Err(node.classify(redis::RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "batched renewal",
            format!("{} answers for {} locks", values.len(), part.len()),
        ))));
    }
    Ok(values.into_iter().map(|v| answer(node, v)).collect())
}

/// One lock's answer in a batch: 1 renewed, 0 not held, else the error of that lock alone.
pub(crate) fn answer(node: &Node, value: Value) -> std::result::Result<bool, RedisError> {
    match value {
        Value::Int(renewed) => Ok(renewed == 1),
        Value::ServerError(err) => Err(node.classify(err.into())),
        other => {
            let text = match other {
                Value::BulkString(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
                Value::SimpleString(text) => text,
                other => format!("{other:?}"),
            };
            Err(node.classify(redis::RedisError::from((
                redis::ErrorKind::Extension,
                "renewal of one lock of a batch",
                text,
            ))))
        }
    }
}

/// Renews `batch` on a Redis Cluster: the locks of each master (as last read) in one
/// [`scripts::RENEW_MANY_ON_NODE`] call per [`MAX_BATCH`], all masters at once. Each lock
/// gets its own answer (a master that fails answers an error for its locks only).
async fn on_cluster(node: &Node, topology: &Arc<ClusterTopology>, batch: &Batch<'_>) -> Answers {
    let mut groups: HashMap<String, Vec<usize>> = HashMap::new();
    for (i, (lease, _)) in batch.iter().enumerate() {
        let master = topology
            .master_addr_for(&lease.lock)
            .await
            .unwrap_or_default();
        groups.entry(master).or_default().push(i);
    }
    let parts = groups
        .into_values()
        .flat_map(|group| {
            group
                .chunks(MAX_BATCH)
                .map(<[usize]>::to_vec)
                .collect::<Vec<_>>()
        })
        .map(|part| async move {
            let answers = on_cluster_master(node, topology, batch, &part).await;
            (part, answers)
        });
    let mut answers: Vec<Option<std::result::Result<bool, RedisError>>> =
        batch.iter().map(|_| None).collect();
    for (part, part_answers) in join_all(parts).await {
        for (i, answer) in part.into_iter().zip(part_answers) {
            answers[i] = Some(answer);
        }
    }
    answers
        .into_iter()
        .map(|a| a.unwrap_or_else(|| Err(RedisError::timeout(&node.addr))))
        .collect()
}

/// One batch script call for the locks `part` of `batch` (served by one master, as last
/// read), on the master of the first one's slot; the locks it could not renew there go by
/// their own requests.
async fn on_cluster_master(
    node: &Node,
    topology: &ClusterTopology,
    batch: &Batch<'_>,
    part: &[usize],
) -> Answers {
    let locks: Vec<(&RedisLease, Duration)> = part.iter().map(|&i| batch[i]).collect();
    let mut answers = match script(node, &locks, true).await {
        Ok(answers) => answers,
        Err(err) if err.kind == RedisErrorKind::Failover => {
            // Slots moved (a resharding, a failover): the map that grouped them is stale.
            let _ = topology.refresh().await;
            return one_by_one(node, batch, part).await;
        }
        Err(err) => return part.iter().map(|_| Err(copy(&err))).collect(),
    };
    let retry: Vec<usize> = answers
        .iter()
        .enumerate()
        .filter(|(_, a)| a.as_ref().is_err_and(misrouted))
        .map(|(at, _)| at)
        .collect();
    if !retry.is_empty() {
        let _ = topology.refresh().await;
        let again: Vec<usize> = retry.iter().map(|&at| part[at]).collect();
        for (at, answer) in retry.into_iter().zip(one_by_one(node, batch, &again).await) {
            answers[at] = answer;
        }
    }
    answers
}

/// Whether a lock's error in a cluster batch means it went to a node that does not serve its
/// slot (any more), so that its own request, routed by the cluster client, can do better.
fn misrouted(err: &RedisError) -> bool {
    matches!(
        err.kind,
        RedisErrorKind::NoScript | RedisErrorKind::Failover
    ) || err
        .source
        .as_ref()
        .is_some_and(|e| e.to_string().contains("non local key"))
}

/// The locks `group` of `batch`, each by its own renewal request, all at once.
async fn one_by_one(node: &Node, batch: &Batch<'_>, group: &[usize]) -> Answers {
    join_all(group.iter().map(|&i| {
        let (lease, ttl) = batch[i];
        async move {
            node.renew(&lease.keys(), &lease.owner, ttl, lease.kind)
                .await
        }
    }))
    .await
}

/// Another copy of `err`, for each lock of a request that failed.
pub(crate) fn copy(err: &RedisError) -> RedisError {
    RedisError {
        kind: err.kind,
        node: err.node.clone(),
        source: err.source.clone(),
    }
}
