//! The ZooKeeper lock protocol: sessions, the queue of ephemeral sequential nodes, leases.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use distlock_core::{
    AcquireRequest, Acquired, Attempt, AttemptMode, Capabilities, ClientConfig, Error,
    FencingGuarantee, FencingToken, Lease, LockBackend, LockInfo, LockName, LossDetection,
    LossReason, Result, Step, WakeUp,
};
use futures::future::BoxFuture;
use tracing::{debug, warn};
use zookeeper_client as zk;

use crate::ZkConfig;
use crate::names::{Entry, escape, queue, unescape};

/// Node data of a node that holds (or is about to hold) the lock: `H<ttl in ms>`. Its lease runs
/// from the node's `mtime` for that many milliseconds, on the server's clock.
fn held_data(ttl: Duration) -> Vec<u8> {
    format!("H{}", ttl.as_millis()).into_bytes()
}

/// Node data of a waiter: never expired by others (its session keeps it alive).
const WAITING: &[u8] = b"W";

/// The ttl in a node's data, if it says "held".
fn parse_held(data: &[u8]) -> Option<i64> {
    std::str::from_utf8(data.strip_prefix(b"H")?)
        .ok()?
        .parse()
        .ok()
}

const EPHEMERAL_SEQUENTIAL: zk::CreateOptions<'static> =
    zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
const CONTAINER: zk::CreateOptions<'static> =
    zk::CreateMode::Container.with_acls(zk::Acls::anyone_all());
const PERSISTENT: zk::CreateOptions<'static> =
    zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());

/// The smallest ttl accepted: the lease is measured in whole milliseconds on the server and
/// renewed every ttl/3, so it must be many round trips long.
pub(crate) const MIN_TTL: Duration = Duration::from_millis(100);

/// Maps a client library error: answers about nodes are protocol surprises, everything else
/// (connection loss, I/O errors, session trouble, throttling) is a retryable unavailability.
fn zk_error(what: &str, err: zk::Error) -> Error {
    use zk::Error as E;
    match err {
        E::NoNode
        | E::NodeExists
        | E::BadVersion
        | E::NotEmpty
        | E::NoAuth
        | E::InvalidAcl
        | E::AuthFailed
        | E::BadArguments(_)
        | E::NoChildrenForEphemerals
        | E::Unimplemented
        | E::QuotaExceeded
        | E::NotReadOnly
        | E::ReconfigDisabled
        | E::NoWatcher => Error::backend(format!("ZooKeeper {what}: {err}"), err),
        other => Error::unavailable(format!("ZooKeeper {what}: {other}"), other),
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// One ZooKeeper session. Every node is ephemeral and belongs to the session that created it.
pub(crate) struct Session {
    pub(crate) client: zk::Client,
}

impl Session {
    fn is_dead(&self) -> bool {
        self.client.state().is_terminated()
    }

    fn is_connected(&self) -> bool {
        matches!(
            self.client.state(),
            zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly
        )
    }

    /// Fails at once while the connection is down, instead of queueing the request until the
    /// client library reconnects.
    fn check_connected(&self) -> Result<()> {
        if self.is_connected() || self.is_dead() {
            // A dead session answers every request with an error at once.
            return Ok(());
        }
        Err(Error::Unavailable {
            message: format!(
                "not connected to ZooKeeper (session {} is {})",
                self.client.session_id(),
                self.client.state()
            ),
            source: None,
        })
    }
}

/// The ZooKeeper [`LockBackend`]. Cheap to clone (clones share the session).
#[derive(Clone)]
pub struct ZkBackend {
    shared: Arc<Shared>,
}

struct Shared {
    config: ZkConfig,
    client_config: ClientConfig,
    /// The session timeout the server granted to the first session: the longest ttl.
    granted: Duration,
    current: Mutex<Arc<Session>>,
    /// Serialises re-connection after a session ended.
    connecting: tokio::sync::Mutex<()>,
}

impl fmt::Debug for ZkBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkBackend")
            .field("hosts", &self.shared.config.hosts())
            .field("chroot", &self.shared.config.chroot())
            .field("session_timeout", &self.shared.granted)
            .finish_non_exhaustive()
    }
}

async fn open_session(config: &ZkConfig, timeout: Duration) -> Result<Arc<Session>> {
    let connect_string = config.connect_string();
    let connect = zk::Client::connector()
        .with_session_timeout(config.session_timeout())
        .with_fail_eagerly()
        .connect(&connect_string);
    let hosts = config.hosts().join(",");
    let client = match tokio::time::timeout(timeout, connect).await {
        Ok(Ok(client)) => client,
        Ok(Err(zk::Error::BadArguments(msg))) => {
            return Err(Error::InvalidConfig(format!(
                "ZooKeeper hosts {hosts:?}: {msg}"
            )));
        }
        Ok(Err(err)) => {
            // The client says only "no available hosts": ask the network why.
            let reason = match distlock_core::tcp_cause(config.hosts(), timeout / 4).await {
                Some(io) => io,
                None => err.to_string(),
            };
            return Err(Error::unavailable(
                format!("cannot connect to ZooKeeper at {hosts}: {reason}"),
                err,
            ));
        }
        Err(_) => {
            return Err(Error::Unavailable {
                message: format!("no ZooKeeper server of {hosts} answered within {timeout:?}"),
                source: None,
            });
        }
    };
    let base = config.base_path();
    match tokio::time::timeout(timeout, client.mkdir(&base, &PERSISTENT)).await {
        Ok(Ok(())) => {}
        Ok(Err(err)) => return Err(zk_error(&format!("creating {base}"), err)),
        Err(_) => {
            return Err(Error::Unavailable {
                message: format!("creating {base} got no answer within {timeout:?}"),
                source: None,
            });
        }
    }
    debug!(session = %client.session_id(), timeout = ?client.session_timeout(), "ZooKeeper session opened");
    Ok(Arc::new(Session { client }))
}

impl ZkBackend {
    /// Opens a session (within `client_config.operation_timeout`) and creates the base node.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a bad configuration, [`Error::Unavailable`] when no server
    /// answers in time.
    pub async fn connect(config: ZkConfig, client_config: &ClientConfig) -> Result<Self> {
        config.check()?;
        client_config.validate()?;
        let session = open_session(&config, client_config.operation_timeout).await?;
        let granted = session.client.session_timeout();
        Ok(Self {
            shared: Arc::new(Shared {
                config,
                client_config: client_config.clone(),
                granted,
                current: Mutex::new(session),
                connecting: tokio::sync::Mutex::new(()),
            }),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &ZkConfig {
        &self.shared.config
    }

    /// The session timeout the server granted, which is also the longest accepted ttl.
    pub fn session_timeout(&self) -> Duration {
        self.shared.granted
    }

    /// The current session (id and password), e.g. for fault injection in tests: opening
    /// another connection with it and closing that one expires the session.
    pub fn session_info(&self) -> zk::SessionInfo {
        lock(&self.shared.current).client.session().clone()
    }

    /// The live session, opening a new one if the previous one expired or was closed.
    async fn session(&self) -> Result<Arc<Session>> {
        let current = lock(&self.shared.current).clone();
        if !current.is_dead() {
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
        if fresh.client.session_timeout() < self.shared.granted {
            warn!(granted = ?fresh.client.session_timeout(), "the new session has a shorter timeout than the first");
        }
        *lock(&self.shared.current) = fresh.clone();
        Ok(fresh)
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
    }

    fn begin(&self, request: AcquireRequest) -> Box<dyn Attempt> {
        let parent = self.shared.config.lock_path(&request.name);
        let prefix = format!("{}.", escape(&request.owner));
        Box::new(ZkAttempt {
            backend: self.clone(),
            request,
            parent,
            prefix,
            session: None,
            node: None,
            maybe_created: false,
            waiting_marked: false,
            predecessor_gone: false,
            created_zxid: None,
            wake: Wake::Idle,
        })
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        let session = self.session().await?;
        session.check_connected()?;
        let client = &session.client;
        let parent = self.shared.config.lock_path(name);
        for _ in 0..3 {
            let children = match client.list_children(&parent).await {
                Ok(children) => children,
                Err(zk::Error::NoNode) => return Ok(None),
                Err(err) => return Err(zk_error("listing the queue", err)),
            };
            let Some(head) = queue(children).into_iter().next() else {
                return Ok(None);
            };
            match client.get_data(&format!("{parent}/{}", head.name)).await {
                Ok((data, stat)) => {
                    if parse_held(&data).is_none() {
                        return Ok(None);
                    }
                    let owner = unescape(head.owner_part()).unwrap_or_else(|| head.name.clone());
                    let token = u64::try_from(stat.czxid).ok().map(FencingToken::new);
                    return Ok(Some(LockInfo::new(owner, token, None)));
                }
                Err(zk::Error::NoNode) => continue,
                Err(err) => return Err(zk_error("reading the holder", err)),
            }
        }
        Ok(None)
    }

    /// The children of the base node are the escaped lock names; each is read as
    /// [`inspect`](LockBackend::inspect) reads it, in name order, until `limit` are held.
    /// The remaining lease is not reported.
    async fn list(&self, prefix: Option<&str>, limit: usize) -> Result<Vec<(LockName, LockInfo)>> {
        let session = self.session().await?;
        session.check_connected()?;
        let base = self.shared.config.base_path();
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
        let mut held = Vec::new();
        for name in names {
            if held.len() >= limit {
                break;
            }
            if let Some(info) = self.inspect(&name).await? {
                held.push((name, info));
            }
        }
        Ok(held)
    }

    /// Deletes the holder's node (the queue head, if its data says "held"), version-checked
    /// so that a renewal in between makes it look again. ZooKeeper lets any session delete
    /// another's ephemeral node. The next waiter's watch on its predecessor fires and it takes
    /// the lock; its node was created later, so its token (`czxid`) is higher. The former
    /// holder's watch on its own node reports the loss.
    async fn force_release(&self, name: &LockName) -> Result<bool> {
        let session = self.session().await?;
        session.check_connected()?;
        let client = &session.client;
        let parent = self.shared.config.lock_path(name);
        for _ in 0..8 {
            let children = match client.list_children(&parent).await {
                Ok(children) => children,
                Err(zk::Error::NoNode) => return Ok(false),
                Err(err) => return Err(zk_error("listing the queue", err)),
            };
            let Some(head) = queue(children).into_iter().next() else {
                return Ok(false);
            };
            let path = format!("{parent}/{}", head.name);
            let stat = match client.get_data(&path).await {
                Ok((data, stat)) if parse_held(&data).is_some() => stat,
                // A waiter about to take the lock: nobody holds it now.
                Ok(_) => return Ok(false),
                Err(zk::Error::NoNode) => continue,
                Err(err) => return Err(zk_error("reading the holder", err)),
            };
            match client.delete(&path, Some(stat.version)).await {
                Ok(()) => return Ok(true),
                Err(zk::Error::NoNode | zk::Error::BadVersion) => continue,
                Err(err) => return Err(zk_error("deleting the holder", err)),
            }
        }
        Ok(false)
    }
}

/// The queue under `parent`, lowest sequence first; empty once the lock node is gone. The
/// request is sent at the call, not when the future is first polled, so that it keeps its
/// place among the session's requests.
fn list_queue<'a>(
    client: &'a zk::Client,
    parent: &str,
) -> impl Future<Output = Result<Vec<Entry>>> + Send + 'a {
    let listing = client.list_children(parent);
    async move {
        match listing.await {
            Ok(children) => Ok(queue(children)),
            Err(zk::Error::NoNode) => Ok(Vec::new()),
            Err(err) => Err(zk_error("listing the queue", err)),
        }
    }
}

/// Our node as one of our own writes left it.
#[derive(Clone, Copy)]
struct Written {
    /// Its creation zxid: the fencing token.
    czxid: i64,
    /// The write's time on the server's clock.
    mtime: i64,
}

impl From<&zk::Stat> for Written {
    fn from(stat: &zk::Stat) -> Self {
        Self {
            czxid: stat.czxid,
            mtime: stat.mtime,
        }
    }
}

/// The answer to [`ZkAttempt::join_queue`].
struct Joined {
    /// Our node's name.
    node: String,
    written: Written,
    /// Ours is the only node: we hold the lock.
    alone: bool,
}

/// What wakes a waiter.
enum Wake {
    /// No watch set (not waiting).
    Idle,
    /// A watch on the predecessor, resolving on its deletion (`true`) or change (or session
    /// events).
    Watch(BoxFuture<'static, bool>),
    /// Poll again at once.
    Now,
}

struct ZkAttempt {
    backend: ZkBackend,
    request: AcquireRequest,
    /// The lock node; its children are the queue.
    parent: String,
    /// `<escaped owner>.`: our node's name up to the sequence number.
    prefix: String,
    /// The session our node belongs to.
    session: Option<Arc<Session>>,
    /// Our node's name, once known.
    node: Option<String>,
    /// A create was sent whose outcome we may not have seen (find the node by its prefix).
    maybe_created: bool,
    /// Our node's data says "waiting".
    waiting_marked: bool,
    /// The watched node was deleted: the next poll expects to be the head.
    predecessor_gone: bool,
    /// Our node's creation zxid (its fencing token), once a create's answer gave it.
    created_zxid: Option<i64>,
    wake: Wake,
}

impl ZkAttempt {
    fn own_path(&self, node: &str) -> String {
        format!("{}/{node}", self.parent)
    }

    /// Forgets our node (it is gone, or died with its session).
    fn forget_node(&mut self) {
        self.node = None;
        self.maybe_created = false;
        self.waiting_marked = false;
        self.created_zxid = None;
    }

    /// The session to use; a node of a dead session is gone with it.
    async fn session(&mut self) -> Result<Arc<Session>> {
        if let Some(session) = &self.session {
            if !session.is_dead() {
                return Ok(session.clone());
            }
            self.forget_node();
        }
        let session = self.backend.session().await?;
        self.session = Some(session.clone());
        Ok(session)
    }

    /// Creates the lock node (a container, removed by the server once empty).
    async fn ensure_parent(client: &zk::Client, parent: &str, base: &str) -> Result<()> {
        for _ in 0..3 {
            match client.create(parent, &[], &CONTAINER).await {
                Ok(_) | Err(zk::Error::NodeExists) => return Ok(()),
                Err(zk::Error::NoNode) => {
                    client
                        .mkdir(base, &PERSISTENT)
                        .await
                        .map_err(|e| zk_error(&format!("creating {base}"), e))?;
                }
                Err(err) => return Err(zk_error("creating the lock node", err)),
            }
        }
        Err(Error::Backend {
            message: format!("{parent} keeps disappearing"),
            source: None,
        })
    }

    /// Creates our node and touches the lock node in one transaction (one write, one round
    /// trip). The lock node's stat in the answer is taken after our create: its child count
    /// says whether ours is the only node (then we hold the lock, with no listing), and its
    /// `mzxid` is the transaction's zxid, which is our node's `czxid` (the create's own stat is
    /// missing from multi answers of servers with ZOOKEEPER-4026).
    async fn join_queue(
        client: &zk::Client,
        parent: &str,
        prefix: &str,
        held: &[u8],
    ) -> std::result::Result<Joined, zk::Error> {
        let create_path = format!("{parent}/{prefix}");
        let mut multi = client.new_multi_writer();
        multi.add_create(&create_path, held, &EPHEMERAL_SEQUENTIAL)?;
        multi.add_set_data(parent, &[], None)?;
        let results = multi.commit().await.map_err(zk::Error::from)?;
        let (
            Some(zk::MultiWriteResult::Create { path, stat }),
            Some(zk::MultiWriteResult::SetData { stat: parent }),
        ) = (results.first(), results.get(1))
        else {
            return Err(zk::Error::UnexpectedError(format!(
                "unexpected multi answer: {results:?}"
            )));
        };
        let node = path.rsplit('/').next().unwrap_or_default().to_owned();
        let czxid = if stat.is_invalid() {
            parent.mzxid
        } else {
            stat.czxid
        };
        Ok(Joined {
            node,
            written: Written {
                czxid,
                mtime: parent.mtime,
            },
            alone: parent.num_children == 1,
        })
    }

    fn acquired(
        &self,
        session: Arc<Session>,
        node: &str,
        czxid: i64,
        started: Instant,
    ) -> Result<Step> {
        let token = u64::try_from(czxid).map_err(|_| Error::Backend {
            message: format!("negative czxid {czxid} for {node}"),
            source: None,
        })?;
        let lease = ZkLease {
            session,
            name: self.request.name.clone(),
            path: self.own_path(node),
            renewed: Arc::new(Mutex::new((started, self.request.ttl))),
            drift: self.backend.shared.client_config.clone(),
        };
        Ok(Step::Acquired(Acquired::new(
            Box::new(lease),
            FencingToken::new(token),
        )))
    }

    async fn poll_once(&mut self, started: Instant) -> Result<Option<Step>> {
        let session = self.session().await?;
        session.check_connected()?;
        let client = &session.client;
        let held = held_data(self.request.ttl);
        // Our node as written by this very call (created, or marked held): its lease starts
        // now.
        let mut fresh: Option<Written> = None;
        let entries = if self.node.is_none() && !self.maybe_created {
            self.maybe_created = true;
            let joined = match Self::join_queue(client, &self.parent, &self.prefix, &held).await {
                Ok(joined) => joined,
                Err(zk::Error::NoNode) => {
                    self.maybe_created = false;
                    let base = self.backend.shared.config.base_path();
                    Self::ensure_parent(client, &self.parent, &base).await?;
                    return Ok(None);
                }
                Err(err) => return Err(zk_error("joining the queue", err)),
            };
            self.created_zxid = Some(joined.written.czxid);
            self.node = Some(joined.node.clone());
            if joined.alone {
                self.wake = Wake::Idle;
                return self
                    .acquired(session.clone(), &joined.node, joined.written.czxid, started)
                    .map(Some);
            }
            fresh = Some(joined.written);
            list_queue(client, &self.parent).await?
        } else if std::mem::take(&mut self.predecessor_gone)
            && self.request.mode == AttemptMode::Wait
            && let Some(node) = self.node.clone()
        {
            // The node we watched was deleted: almost always the holder releasing, which makes
            // us the head. List the queue and restart our lease in one round trip, so a handoff
            // costs the release and this one request. Should we not be the head after all, the
            // waiting paths below mark the node as a waiter again in their next request, so a
            // stale "held" mark lives for one round trip at most.
            // Before sending: a write whose answer is lost (an error, a cancelled poll) may
            // have marked the node held all the same.
            let was_waiting = std::mem::replace(&mut self.waiting_marked, false);
            // The listing goes first: the server answers a read queued before our write
            // without waiting for that write to commit.
            let list = list_queue(client, &self.parent);
            let touch = client.set_data(&self.own_path(&node), &held, None);
            let entries = list.await?;
            if was_waiting
                && let Some(czxid) = self.created_zxid
                && entries.first().is_some_and(|head| head.name == node)
            {
                // Ours as the head of the queue. Until the held mark in flight commits, our
                // node says "waiting", which no contender takes for an expired holder; the
                // mark only starts the lease contenders see, later than `started`.
                self.wake = Wake::Idle;
                return self
                    .acquired(session.clone(), &node, czxid, started)
                    .map(Some);
            }
            match touch.await {
                Ok(stat) => fresh = Some(Written::from(&stat)),
                Err(zk::Error::NoNode) => {
                    self.forget_node();
                    return Ok(None);
                }
                Err(err) => return Err(zk_error("taking the lock", err)),
            }
            entries
        } else {
            list_queue(client, &self.parent).await?
        };
        let Some(index) = entries
            .iter()
            .position(|e| e.name.starts_with(&self.prefix))
        else {
            // Our node is gone (removed, expired by a contender) or was never created.
            self.forget_node();
            return Ok(None);
        };
        let own = entries[index].name.clone();
        self.node = Some(own.clone());
        let own_path = self.own_path(&own);
        if index == 0 {
            let written = match fresh {
                Some(written) => written,
                // Restart the lease: the node was created earlier (as a waiter).
                None => match client.set_data(&own_path, &held, None).await {
                    Ok(stat) => Written::from(&stat),
                    Err(zk::Error::NoNode) => {
                        self.forget_node();
                        return Ok(None);
                    }
                    Err(err) => return Err(zk_error("taking the lock", err)),
                },
            };
            self.wake = Wake::Idle;
            return self
                .acquired(session.clone(), &own, written.czxid, started)
                .map(Some);
        }
        let head = &entries[0];
        let head_path = self.own_path(&head.name);
        if self.request.mode == AttemptMode::Try && index > 1 {
            return Ok(Some(Step::busy(None)));
        }
        if index > 1 {
            // Watch only the predecessor; mark ourselves as a waiter in the same round trip.
            let pred_path = self.own_path(&entries[index - 1].name);
            let mark = (!self.waiting_marked).then(|| client.set_data(&own_path, WAITING, None));
            let watch = client.check_and_watch_stat(&pred_path);
            let (marked, watched) = futures::join!(
                async move {
                    match mark {
                        Some(mark) => mark.await.map(Some),
                        None => Ok(None),
                    }
                },
                watch
            );
            match marked {
                Ok(Some(_)) => self.waiting_marked = true,
                Ok(None) => {}
                Err(zk::Error::NoNode) => {
                    self.forget_node();
                    return Ok(None);
                }
                Err(err) => return Err(zk_error("marking the waiter", err)),
            }
            return match watched {
                Ok((Some(_), watcher)) => {
                    self.set_watch(Some(watcher));
                    Ok(Some(Step::busy(None)))
                }
                // The predecessor left between the listing and the watch: look again.
                Ok((None, _)) => Ok(None),
                Err(err) => Err(zk_error("watching the predecessor", err)),
            };
        }
        // We are next. Read the head and the server's clock (our own write's mtime) in one round
        // trip, and watch the head.
        let touch_data: &[u8] = if self.request.mode == AttemptMode::Wait {
            WAITING
        } else {
            &held
        };
        let try_mode = self.request.mode == AttemptMode::Try;
        let (now_ms, head_read) = match fresh {
            // A try needs no watch, and its new node's mtime is the server's clock.
            Some(written) if try_mode => (
                written.mtime,
                client.get_data(&head_path).await.map(|(d, s)| (d, s, None)),
            ),
            _ => {
                let touch = client.set_data(&own_path, touch_data, None);
                let read = async {
                    if try_mode {
                        client.get_data(&head_path).await.map(|(d, s)| (d, s, None))
                    } else {
                        client
                            .get_and_watch_data(&head_path)
                            .await
                            .map(|(d, s, w)| (d, s, Some(w)))
                    }
                };
                let (touched, read) = futures::join!(touch, read);
                let stat = match touched {
                    Ok(stat) => stat,
                    Err(zk::Error::NoNode) => {
                        self.forget_node();
                        return Ok(None);
                    }
                    Err(err) => return Err(zk_error("marking the waiter", err)),
                };
                if !try_mode {
                    self.waiting_marked = true;
                }
                (stat.mtime, read)
            }
        };
        let (data, head_stat, watcher) = match head_read {
            Ok(read) => read,
            Err(zk::Error::NoNode) => return Ok(None),
            Err(err) => return Err(zk_error("reading the holder", err)),
        };
        let Some(head_ttl) = parse_held(&data) else {
            // A waiter about to take the lock.
            self.set_watch(watcher);
            return Ok(Some(Step::busy(None)));
        };
        let age = now_ms - head_stat.mtime;
        if age > head_ttl {
            // The holder's lease ran out on the server's clock: remove its node, unless it was
            // renewed meanwhile (the version check makes this atomic).
            debug!(holder = %head.name, age, head_ttl, "removing an expired holder");
            return match client.delete(&head_path, Some(head_stat.version)).await {
                Ok(()) | Err(zk::Error::NoNode) => Ok(None),
                Err(zk::Error::BadVersion) => {
                    self.set_watch(watcher);
                    Ok(Some(Step::busy(None)))
                }
                Err(err) => Err(zk_error("removing an expired holder", err)),
            };
        }
        self.set_watch(watcher);
        let remaining = u64::try_from(head_ttl - age).unwrap_or(0) + 1;
        Ok(Some(Step::busy(Some(Duration::from_millis(remaining)))))
    }

    fn set_watch(&mut self, watcher: Option<zk::OneshotWatcher>) {
        if let Some(watcher) = watcher {
            self.wake = Wake::Watch(Box::pin(async move {
                watcher.changed().await.event_type == zk::EventType::NodeDeleted
            }));
        }
    }
}

#[async_trait]
impl Attempt for ZkAttempt {
    async fn poll(&mut self) -> Result<Step> {
        let started = Instant::now();
        self.wake = Wake::Idle;
        for _ in 0..6 {
            if let Some(step) = self.poll_once(started).await? {
                return Ok(step);
            }
        }
        // The queue kept changing under us: let the core come back shortly.
        Ok(Step::busy(Some(Duration::from_millis(5))))
    }

    async fn changed(&mut self) {
        match &mut self.wake {
            Wake::Watch(watch) => {
                self.predecessor_gone = watch.await;
                self.wake = Wake::Now;
            }
            Wake::Now => {}
            Wake::Idle => std::future::pending().await,
        }
    }

    async fn abandon(self: Box<Self>) -> Result<()> {
        let Some(session) = self.session.clone() else {
            return Ok(());
        };
        if session.is_dead() {
            return Ok(()); // our ephemeral node died with the session
        }
        let connected = session.is_connected();
        let node = self.node.clone();
        let maybe_created = self.maybe_created;
        let (parent, prefix) = (self.parent.clone(), self.prefix.clone());
        // In a task of its own, so that a cancelled abandon (or one started while the
        // connection is down) still completes once the session is reachable again.
        let cleanup = tokio::spawn(async move {
            if !session.is_connected() {
                let mut states = session.client.state_watcher();
                let wait = session.client.session_timeout();
                let reconnected = tokio::time::timeout(wait, async {
                    while !session.is_connected() {
                        if session.is_dead() {
                            return;
                        }
                        states.changed().await;
                    }
                })
                .await;
                if reconnected.is_err() || session.is_dead() {
                    return Ok(());
                }
            }
            leave_queue(&session.client, &parent, &prefix, node, maybe_created).await
        });
        if !connected {
            debug!("abandoning while disconnected: the queue entry is removed on reconnection");
            return Ok(());
        }
        match cleanup.await {
            Ok(result) => result,
            Err(err) => Err(Error::backend(format!("leaving the queue: {err}"), err)),
        }
    }
}

/// Deletes our node (found by its unique prefix if a create's reply was lost).
async fn leave_queue(
    client: &zk::Client,
    parent: &str,
    prefix: &str,
    node: Option<String>,
    maybe_created: bool,
) -> Result<()> {
    let mut targets: Vec<String> = node.iter().cloned().collect();
    if node.is_none() && maybe_created {
        // A create whose reply we never saw: find it by our unique prefix (the listing is
        // sent after the create on the same session, so it includes it).
        match client.list_children(parent).await {
            Ok(children) => targets.extend(children.into_iter().filter(|c| c.starts_with(prefix))),
            Err(zk::Error::NoNode) => {}
            Err(err) => return Err(zk_error("looking for an orphan node", err)),
        }
    }
    for node in targets {
        match client.delete(&format!("{parent}/{node}"), None).await {
            Ok(()) | Err(zk::Error::NoNode) => {}
            Err(err) => return Err(zk_error("leaving the queue", err)),
        }
    }
    Ok(())
}

/// A held lock: our node at the head of the queue.
struct ZkLease {
    session: Arc<Session>,
    name: LockName,
    path: String,
    /// When the last acquire/renew was sent, and with which ttl: tells an expiry from a removal.
    renewed: Arc<Mutex<(Instant, Duration)>>,
    drift: ClientConfig,
}

impl fmt::Debug for ZkLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkLease")
            .field("path", &self.path)
            .field("session", &self.session.client.session_id())
            .finish_non_exhaustive()
    }
}

impl ZkLease {
    fn not_held(&self) -> Error {
        Error::NotHeld {
            name: self.name.to_string(),
        }
    }
}

#[async_trait]
impl Lease for ZkLease {
    async fn renew(&self, ttl: Duration) -> Result<()> {
        let sent = Instant::now();
        self.session.check_connected()?;
        // Only we write our node; it exists only while we hold (or a contender removed it
        // after expiry, or the session ended): a plain set_data is owner-checked and atomic.
        match self
            .session
            .client
            .set_data(&self.path, &held_data(ttl), None)
            .await
        {
            Ok(_) => {
                *lock(&self.renewed) = (sent, ttl);
                Ok(())
            }
            Err(zk::Error::NoNode | zk::Error::SessionExpired) => Err(self.not_held()),
            Err(err) => Err(zk_error("renewing the lock", err)),
        }
    }

    async fn release(&self) -> Result<()> {
        self.session.check_connected()?;
        match self.session.client.delete(&self.path, None).await {
            Ok(()) => Ok(()),
            Err(zk::Error::NoNode | zk::Error::SessionExpired) => Err(self.not_held()),
            Err(err) => Err(zk_error("releasing the lock", err)),
        }
    }

    fn loss_signal(&self) -> Option<BoxFuture<'static, LossReason>> {
        let client = self.session.client.clone();
        let path = self.path.clone();
        let renewed = self.renewed.clone();
        let drift = self.drift.clone();
        Some(Box::pin(async move {
            let gone = || {
                let (sent, ttl) = *lock(&renewed);
                if Instant::now() >= sent + ttl - drift.drift(ttl) {
                    LossReason::LeaseExpired
                } else {
                    LossReason::ReleasedElsewhere
                }
            };
            let mut states = client.state_watcher();
            // Most holds are short: the watch on our node (one more request) is set only after
            // a tenth of the ttl. Until then a session expiry still ends the lease at once, and
            // a node removed meanwhile is found by that first check (or by renewal).
            let (_, ttl) = *lock(&renewed);
            let arm = tokio::time::sleep(ttl / 10);
            tokio::pin!(arm);
            loop {
                if states.peek_state().is_terminated() {
                    return LossReason::SessionExpired;
                }
                tokio::select! {
                    () = &mut arm => break,
                    state = states.changed() => {
                        if state.is_terminated() {
                            return LossReason::SessionExpired;
                        }
                    }
                }
            }
            loop {
                if states.peek_state().is_terminated() {
                    return LossReason::SessionExpired;
                }
                match client.check_and_watch_stat(&path).await {
                    Ok((None, _)) => return gone(),
                    Ok((Some(_), watcher)) => {
                        let event = watcher.changed().await;
                        match event.event_type {
                            zk::EventType::NodeDeleted => return gone(),
                            zk::EventType::Session if event.session_state.is_terminated() => {
                                return LossReason::SessionExpired;
                            }
                            _ => {} // our own renewal changed the data: watch again
                        }
                    }
                    Err(
                        zk::Error::SessionExpired | zk::Error::ClientClosed | zk::Error::AuthFailed,
                    ) => {
                        return LossReason::SessionExpired;
                    }
                    Err(_) => {
                        // Disconnected: the renewal deadline covers us; look again once the
                        // connection state changes.
                        let _ = tokio::time::timeout(Duration::from_millis(200), states.changed())
                            .await;
                    }
                }
            }
        }))
    }
}
