//! The backend: its session, capabilities, inspection, listing and forced release of locks.
//! The protocol itself is in `attempt.rs` (acquiring) and `lease.rs` (holding).

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use distlock_core::backend::{Contended, unpoisoned as lock};
use distlock_core::{
    AcquireRequest, Attempt, Capabilities, ClientConfig, FencingGuarantee, FencingToken,
    LockBackend, LockInfo, LockName, LossDetection, Result, WakeUp,
};
use futures::StreamExt;
use futures::stream::BoxStream;
use tracing::{debug, warn};
use zookeeper_client as zk;

use crate::ZkConfig;
use crate::attempt::ZkAttempt;
use crate::error::{denied, zk_error};
use crate::keys::{Entry, escape, holder_data_of, queue, unescape};
use crate::kinds::holders;
use crate::session::{Session, open_session};

/// The smallest ttl accepted: the lease is the holder node's data, renewed every ttl/3 by a
/// write, and every write is a quorum round through the leader with a log fsync on each
/// server; it must land within the two thirds of the ttl left. 500 ms leaves it about 330 ms
/// (an fsync on a loaded disk alone can take 100 ms).
pub(crate) const MIN_TTL: Duration = Duration::from_millis(500);

/// The largest semaphore: the first waiter of a semaphore reads every holder's node in each
/// of its polls (to remove holders whose lease ran out, on the server's clock), all in one
/// round trip but one read per permit, and every waiter's listing carries every node. 256
/// keeps that poll a few kilobytes and well inside one operation timeout; a larger pool of
/// permits is better served by several names.
pub const MAX_PERMITS: u32 = 256;

/// How long a session may stay disconnected before the backend tries a replacement for new
/// work. The client library retries a lost connection with a doubling pause (0.1 s, 0.2 s,
/// ... 6.4 s, 12.8 s): after a server restart of a few seconds it came back up to 13 s after
/// the server did (measured in `distlock check`'s restart fault, where an acquisition
/// waiting 10 s failed behind it), so a waiter opens a new session instead of waiting for
/// the old one. Longer than the library's first pauses (0.1-0.8 s), which cover a dropped
/// connection to a serving server.
const REPLACE_AFTER: Duration = Duration::from_secs(2);

/// The ZooKeeper [`LockBackend`]. Cheap to clone (clones share the session).
#[derive(Clone)]
pub struct ZkBackend {
    pub(crate) shared: Arc<BackendState>,
}

/// What one backend holds, shared by its clones and attempts: the configuration and the
/// current session.
pub(crate) struct BackendState {
    pub(crate) config: ZkConfig,
    pub(crate) client_config: ClientConfig,
    /// The session timeout the server granted to the first session: the longest ttl.
    pub(crate) granted: Duration,
    pub(crate) current: Mutex<Arc<Session>>,
    /// Serialises re-connection after a session ended.
    pub(crate) connecting: tokio::sync::Mutex<()>,
    /// Whether a replacement for a disconnected session is being opened, and since when
    /// (one at a time, at most one every [`REPLACE_AFTER`]).
    pub(crate) replacing: AtomicBool,
    pub(crate) replace_tried: Mutex<Option<Instant>>,
    /// The lock nodes whose readers' and permits' joins lately found other nodes: their
    /// joins send the listing of the queue behind them (see [`join_queue`]).
    ///
    /// [`join_queue`]: crate::queue::join_queue
    pub(crate) contended: Contended,
}

impl fmt::Debug for ZkBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkBackend")
            .field("hosts", &self.shared.config.hosts())
            .field("chroot", &self.shared.config.chroot())
            .field("digest_user", &self.shared.config.digest_user())
            .field("tls", &self.shared.config.tls().is_some())
            .field("session_timeout", &self.shared.granted)
            .finish_non_exhaustive()
    }
}

impl ZkBackend {
    /// Deletes the holders' nodes (as [`inspect`](LockBackend::inspect) counts them), or only
    /// the one of `(owner, token)`, each version-checked so that a renewal in between makes it
    /// look again. ZooKeeper lets any session delete another's
    /// ephemeral node. The waiters' watches fire and they take the lock; their nodes were
    /// created later, so their tokens (`czxid`) are higher. The former holders' renewals
    /// find their nodes gone and report the loss.
    async fn remove_holders(
        &self,
        name: &LockName,
        only: Option<(&str, FencingToken)>,
    ) -> Result<bool> {
        let session = self.session().await?;
        session.check_connected()?;
        let client = &session.client;
        let parent = self.shared.config.lock_path(name);
        // A hold just taken through another server must show in the listing.
        barrier(&self.shared.config, client, &parent).await?;
        let mut removed = false;
        for _ in 0..8 {
            let children = match client.list_children(&parent).await {
                Ok(children) => children,
                Err(zk::Error::NoNode) => return Ok(removed),
                Err(err) => return Err(zk_error("listing the queue", err)),
            };
            let entries = queue(children);
            let (_, held) = holders(&entries);
            let mut again = false;
            for holder in held {
                if let Some((owner, _)) = only
                    && unescape(holder.owner_part()).as_deref() != Some(owner)
                {
                    continue;
                }
                let token = only.map(|(_, token)| token);
                match remove_held(client, &parent, holder, token).await? {
                    Some(true) => removed = true,
                    Some(false) => {}
                    None => again = true,
                }
            }
            if !again {
                return Ok(removed);
            }
        }
        Ok(removed)
    }

    /// Opens a session (within `client_config.operation_timeout`) and creates the base node.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`](distlock_core::Error::InvalidConfig) for a bad configuration, [`Error::Unavailable`](distlock_core::Error::Unavailable) when no server
    /// answers in time.
    pub async fn connect(config: ZkConfig, client_config: &ClientConfig) -> Result<Self> {
        config.check()?;
        client_config.validate()?;
        let session = open_session(&config, client_config.operation_timeout).await?;
        let granted = session.client.session_timeout();
        Ok(Self {
            shared: Arc::new(BackendState {
                config,
                client_config: client_config.clone(),
                granted,
                current: Mutex::new(session),
                connecting: tokio::sync::Mutex::new(()),
                replacing: AtomicBool::new(false),
                replace_tried: Mutex::new(None),
                contended: Contended::default(),
            }),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &ZkConfig {
        &self.shared.config
    }

    /// The session timeout the server granted the first session, which is also the longest
    /// accepted ttl (a session opened later that the server grants less refuses longer
    /// leases).
    pub fn session_timeout(&self) -> Duration {
        self.shared.granted
    }

    /// The current session (id and password), e.g. for fault injection in tests: opening
    /// another connection with it and closing that one expires the session.
    pub fn session_info(&self) -> zk::SessionInfo {
        lock(&self.shared.current).client.session().clone()
    }

    /// The live session, opening a new one if the previous one expired or was closed. One
    /// disconnected for longer than [`REPLACE_AFTER`] is returned as it is (its requests fail
    /// at once as unavailable), while a replacement opens in the background.
    pub(crate) async fn session(&self) -> Result<Arc<Session>> {
        let current = lock(&self.shared.current).clone();
        if !current.is_dead() {
            self.replace_if_stale(&current);
            return Ok(current);
        }
        let _connecting = self.shared.connecting.lock().await;
        let current = lock(&self.shared.current).clone();
        if !current.is_dead() {
            return Ok(current);
        }
        warn!(session = %current.client.session_id(), state = %current.client.state(), "ZooKeeper session ended, opening a new one");
        let fresh = open_session(
            &self.shared.config,
            self.shared.client_config.operation_timeout,
        )
        .await?;
        warn_if_shorter(&self.shared, &fresh);
        *lock(&self.shared.current) = fresh.clone();
        Ok(fresh)
    }

    /// Starts a replacement of `session` (see [`Self::replace_in_background`]) if it has been
    /// disconnected for [`REPLACE_AFTER`]: for a caller that holds on to a session, as a
    /// waiting attempt does, and polls it while the connection is down.
    pub(crate) fn replace_if_stale(&self, session: &Arc<Session>) {
        if session
            .disconnected_for()
            .is_some_and(|gap| gap >= REPLACE_AFTER)
        {
            self.replace_in_background(session);
        }
    }

    /// Opens a new session for new work while `stale` stays disconnected. `stale` lives on
    /// with its guards (they renew if it reconnects, else they run out and report the loss);
    /// its waiters move to the new session at their next poll, removing their old queue
    /// nodes through it (see `ZkAttempt::remove_left`; one that cannot be removed lapses: a
    /// contender removes a node whose lease ran out). Installed only if `stale`
    /// is still the current session and still disconnected when the new one is open.
    fn replace_in_background(&self, stale: &Arc<Session>) {
        {
            let mut tried = lock(&self.shared.replace_tried);
            if tried.is_some_and(|at| at.elapsed() < REPLACE_AFTER)
                || self.shared.replacing.swap(true, Ordering::SeqCst)
            {
                return;
            }
            *tried = Some(Instant::now());
        }
        let shared = self.shared.clone();
        let stale = stale.clone();
        tokio::spawn(async move {
            match open_session(&shared.config, shared.client_config.operation_timeout).await {
                Ok(fresh) => {
                    let mut current = lock(&shared.current);
                    if Arc::ptr_eq(&current, &stale) && !stale.is_connected() && !stale.is_dead() {
                        warn!(
                            stale = %stale.client.session_id(),
                            fresh = %fresh.client.session_id(),
                            "ZooKeeper session still reconnecting while the servers answer: new work goes to a new session"
                        );
                        warn_if_shorter(&shared, &fresh);
                        stale.retire();
                        *current = fresh;
                    }
                }
                Err(err) => {
                    debug!(error = %err, "no replacement for the disconnected ZooKeeper session yet")
                }
            }
            shared.replacing.store(false, Ordering::SeqCst);
        });
    }
}

/// Warns when the server granted a replacement session `fresh` a shorter timeout than the
/// first: its attempts refuse leases longer than that (see `ZkAttempt::session`).
fn warn_if_shorter(shared: &BackendState, fresh: &Session) {
    let granted = fresh.client.session_timeout();
    if granted < shared.granted {
        warn!(
            ?granted,
            first = ?shared.granted,
            "the new ZooKeeper session has a shorter timeout than the first: longer leases \
             are refused"
        );
    }
}

#[async_trait]
impl LockBackend for ZkBackend {
    fn name(&self) -> &'static str {
        "zookeeper"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(FencingGuarantee::Linearizable)
            .with_fifo(true)
            .with_wake_up(WakeUp::Event)
            .with_ttl_range(MIN_TTL, self.shared.granted.max(MIN_TTL))
            .with_loss_detection(LossDetection::Session)
            .with_list(true)
            .with_force_release(true)
            .with_release_hold(true)
            .with_holder_data(true)
            .with_shared(true)
            .with_max_permits(MAX_PERMITS)
    }

    fn begin(&self, request: AcquireRequest) -> Box<dyn Attempt> {
        Box::new(ZkAttempt::new(self.clone(), request))
    }

    /// The holders as the queue shows them (the exclusive head; the readers ahead of the first
    /// writer; the first N permit nodes): the latest holder's node is read for its token
    /// (`czxid`). A holder's node may still say "waiting": a waiter handed the lock holds
    /// before its "held" mark commits (see the crate docs), so the mark is not asked for.
    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        let session = self.session().await?;
        session.check_connected()?;
        let parent = self.shared.config.lock_path(name);
        barrier(&self.shared.config, &session.client, &parent).await?;
        inspect_on(&session.client, &parent).await
    }

    /// The children of the base node are the escaped lock names; each is read as
    /// [`inspect`](LockBackend::inspect) reads it (behind one barrier for all), in name
    /// order, until `limit` are held.
    /// The remaining lease is not reported.
    async fn list(&self, prefix: Option<&str>, limit: usize) -> Result<Vec<(LockName, LockInfo)>> {
        let session = self.session().await?;
        session.check_connected()?;
        let base = self.shared.config.base_path();
        barrier(&self.shared.config, &session.client, &base).await?;
        let children = match session.client.list_children(&base).await {
            Ok(children) => children,
            Err(zk::Error::NoNode) => return Ok(Vec::new()),
            Err(err) => return Err(zk_error("listing the locks", err)),
        };
        let prefix = escape(prefix.unwrap_or(""));
        let mut names: Vec<LockName> = children
            .iter()
            .filter(|child| child.starts_with(&prefix))
            .filter_map(|child| LockName::new(unescape(child)?).ok())
            .collect();
        names.sort();
        // Behind the one barrier above: each name read on the same client.
        let mut held = Vec::new();
        for name in names {
            if held.len() >= limit {
                break;
            }
            let parent = self.shared.config.lock_path(&name);
            if let Some(info) = inspect_on(&session.client, &parent).await? {
                held.push((name, info));
            }
        }
        Ok(held)
    }

    /// The lock nodes (containers: the server removes one some time after its last child,
    /// see the README's "Growth curves") of the names, and their children (holders and
    /// waiters), from the base node's children and each lock node's stat.
    async fn footprint(&self, prefix: &str) -> Result<Option<distlock_core::Footprint>> {
        let session = self.session().await?;
        session.check_connected()?;
        let client = &session.client;
        let base = self.shared.config.base_path();
        let children = match client.list_children(&base).await {
            Ok(children) => children,
            Err(zk::Error::NoNode) => Vec::new(),
            Err(err) => return Err(zk_error("listing the locks", err)),
        };
        let prefix = escape(prefix);
        let nodes: Vec<String> = children
            .into_iter()
            .filter(|child| child.starts_with(&prefix))
            .collect();
        let paths: Vec<String> = nodes.iter().map(|node| format!("{base}/{node}")).collect();
        let stats: Vec<_> = futures::stream::iter(paths)
            .map(|path| client.check_stat(&path))
            .buffer_unordered(64)
            .collect()
            .await;
        let mut queued: u64 = 0;
        for stat in stats {
            match stat {
                Ok(Some(stat)) => queued += u64::try_from(stat.num_children).unwrap_or_default(),
                Ok(None) => {}
                Err(err) => return Err(zk_error("reading a lock node", err)),
            }
        }
        Ok(Some(
            distlock_core::Footprint::new("nodes")
                .with("lock nodes", nodes.len() as u64)
                .with("queue nodes", queued),
        ))
    }

    /// Deletes the holders' nodes (as [`inspect`](LockBackend::inspect) counts them) whose data says "held", each version-checked
    /// so that a renewal in between makes it look again. ZooKeeper lets any session delete
    /// another's ephemeral node. The waiters' watches fire and they take the lock; their nodes
    /// were created later, so their tokens (`czxid`) are higher. The former holders' watches
    /// on their own nodes report the loss.
    async fn force_release(&self, name: &LockName) -> Result<bool> {
        self.remove_holders(name, None).await
    }

    /// As [`force_release`](LockBackend::force_release), for the one holder node whose name
    /// carries `owner` and whose `czxid` (its token) is `token`: the delete is version-checked
    /// against the data read with that `czxid`.
    async fn release_hold(
        &self,
        name: &LockName,
        owner: &str,
        token: FencingToken,
    ) -> Result<bool> {
        self.remove_holders(name, Some((owner, token))).await
    }

    /// A children watch on the name's node (an exists watch while it does not exist),
    /// re-armed before each yield: the stream yields once the first watch is set (which
    /// closes the gap between the observer's first read and the watch), then after every
    /// change of the queue, with the next watch already set, so no change is missed. The
    /// head node's data is watched too: a waiter handed the lock marks its node held without
    /// changing the children (so the observer also reads again after each renewal of the
    /// leader, every ttl/3). While the watches cannot be set (disconnected), it tries again
    /// every 200 ms, and the observer reads at its interval meanwhile.
    ///
    /// Only standard one-shot watches: ZOOKEEPER-4466 (a persistent watch on a path breaks
    /// the standard watches of the same session on it, and the reverse) would bite the
    /// attempts and leases that share this session and watch the same nodes.
    fn watch(&self, name: &LockName) -> Option<BoxStream<'static, ()>> {
        let backend = self.clone();
        let parent = self.shared.config.lock_path(name);
        Some(
            futures::stream::unfold(
                (backend, parent, None::<Armed>),
                |(backend, parent, armed)| async move {
                    if let Some(armed) = armed {
                        armed.changed().await;
                    }
                    loop {
                        match arm(&backend, &parent).await {
                            Ok(armed) => return Some(((), (backend, parent, Some(armed)))),
                            Err(err) => {
                                // Disconnected: the observer reads at its interval meanwhile.
                                tracing::debug!(%err, "cannot watch a lock node, trying again");
                                tokio::time::sleep(REARM_PAUSE).await;
                            }
                        }
                    }
                },
            )
            .boxed(),
        )
    }
}

/// Deletes `holder`'s node (if its `czxid` is `token`, when given) with the version read,
/// whatever its mark says: a waiter handed the lock holds while its node still says
/// "waiting". `Some(removed)`, or `None` when it changed meanwhile (renewed, marked, gone):
/// look again.
async fn remove_held(
    client: &zk::Client,
    parent: &str,
    holder: &Entry,
    token: Option<FencingToken>,
) -> Result<Option<bool>> {
    let path = format!("{parent}/{}", holder.name);
    let stat = match client.get_data(&path).await {
        Ok((_, stat)) if token.is_some_and(|t| u64::try_from(stat.czxid).ok() != Some(t.get())) => {
            return Ok(Some(false));
        }
        Ok((_, stat)) => stat,
        Err(zk::Error::NoNode) => return Ok(None),
        Err(err) => return Err(zk_error("reading a holder", err)),
    };
    match client.delete(&path, Some(stat.version)).await {
        Ok(()) => Ok(Some(true)),
        Err(zk::Error::NoNode | zk::Error::BadVersion) => Ok(None),
        Err(err) => Err(zk_error("deleting a holder", err)),
    }
}

/// The pause between attempts to set an observer's watches while that fails.
const REARM_PAUSE: Duration = Duration::from_millis(200);

/// The watches of an election observer (see [`ZkBackend::watch`]).
struct Armed {
    watchers: Vec<zk::OneshotWatcher>,
}

impl Armed {
    /// Resolves at the first event of any of the watches (a session event included).
    async fn changed(self) {
        let events = self.watchers.into_iter().map(|w| Box::pin(w.changed()));
        futures::future::select_all(events).await;
    }
}

/// Sets the observer's watches on `parent`: its children, or its creation, and the head's
/// data. Uses the backend's live session (a new one after an expiry).
async fn arm(backend: &ZkBackend, parent: &str) -> Result<Armed> {
    let session = backend.session().await?;
    let client = &session.client;
    let failed = |err| zk_error("watching a lock node", err);
    loop {
        let (children, listing) = match client.list_and_watch_children(parent).await {
            Ok(listed) => listed,
            Err(zk::Error::NoNode) => match client.check_and_watch_stat(parent).await {
                Ok((None, created)) => {
                    return Ok(Armed {
                        watchers: vec![created],
                    });
                }
                Ok((Some(_), _)) => continue, // created meanwhile: list it
                Err(err) => return Err(failed(err)),
            },
            Err(err) => return Err(failed(err)),
        };
        let mut watchers = vec![listing];
        if let Some(head) = queue(children).into_iter().next() {
            match client
                .check_and_watch_stat(&format!("{parent}/{}", head.name))
                .await
            {
                Ok((Some(_), head)) => watchers.push(head),
                // The head left meanwhile: the children watch has fired already.
                Ok((None, _)) => {}
                Err(err) => return Err(failed(err)),
            }
        }
        return Ok(Armed { watchers });
    }
}

/// Brings the server this session reads from up to every write committed before, ahead of
/// a read of `path` by someone who wrote nothing (`inspect`, `list`, an observer, a forced
/// release or `release_hold` looking for the holders), so that another client's hold that
/// `acquire` returned shows: a write barrier, a transaction of one version check of `path`
/// (any version), which the session's server, follower or leader, answers only once it
/// applied every write ordered before it; a check that finds no node is a transaction too,
/// ordered the same. It needs the READ permission the read needs. `sync` did not do: the
/// leader serves its own clients' `sync` as a read, and it applies a commit after it sent it
/// to the followers, one of which may already have applied it and answered the acquisition
/// (with the machine busy, 1 of 8 runs of 100 rounds missed a hold so). One quorum write more
/// per such read (an observer's wake-up, an `inspect`; one per `list`); lock safety never
/// rests on these reads.
async fn barrier(config: &ZkConfig, client: &zk::Client, path: &str) -> Result<()> {
    let what = "a read's write barrier";
    let mut barrier = client.new_multi_writer();
    barrier
        .add_check_version(path, -1)
        .map_err(|err| zk_error(what, err))?;
    match barrier.commit().await {
        // No node: nothing to see, and the transaction was ordered all the same.
        Ok(_)
        | Err(zk::MultiWriteError::OperationFailed {
            source: zk::Error::NoNode,
            ..
        }) => Ok(()),
        Err(
            zk::MultiWriteError::OperationFailed {
                source: zk::Error::NoAuth,
                ..
            }
            | zk::MultiWriteError::RequestFailed {
                source: zk::Error::NoAuth,
            },
        ) => Err(denied(config, path, what)),
        Err(err) => Err(zk_error(what, err.into())),
    }
}

/// [`inspect`](LockBackend::inspect)'s read of the lock node `parent` on `client`, behind a
/// [`barrier`] sent on that client.
async fn inspect_on(client: &zk::Client, parent: &str) -> Result<Option<LockInfo>> {
    for _ in 0..3 {
        let children = match client.list_children(parent).await {
            Ok(children) => children,
            Err(zk::Error::NoNode) => return Ok(None),
            Err(err) => return Err(zk_error("listing the queue", err)),
        };
        let entries = queue(children);
        let (kind, held) = holders(&entries);
        let Some(latest) = held.last() else {
            return Ok(None);
        };
        match client.get_data(&format!("{parent}/{}", latest.name)).await {
            Ok((data, stat)) => {
                let owner = unescape(latest.owner_part()).unwrap_or_else(|| latest.name.clone());
                let token = FencingToken::from_server(stat.czxid, "a czxid").ok();
                let count = u32::try_from(held.len()).unwrap_or(u32::MAX);
                return Ok(Some(
                    LockInfo::new(owner, token, None)
                        .with_holders(kind, count)
                        .with_data(holder_data_of(&data)),
                ));
            }
            Err(zk::Error::NoNode) => continue,
            Err(err) => return Err(zk_error("reading the holder", err)),
        }
    }
    Ok(None)
}
