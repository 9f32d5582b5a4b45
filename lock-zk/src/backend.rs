//! The backend: its session, capabilities, inspection, listing and forced release of locks.
//! The protocol itself is in `attempt.rs` (acquiring) and `lease.rs` (holding).

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use distlock_core::backend::{held_among, unpoisoned as lock};
use distlock_core::{
    AcquireRequest, Attempt, Capabilities, ClientConfig, FencingGuarantee, FencingToken,
    LockBackend, LockInfo, LockName, LossDetection, Result, WakeUp,
};
use tracing::warn;
use zookeeper_client as zk;

use crate::ZkConfig;
use crate::attempt::ZkAttempt;
use crate::error::zk_error;
use crate::keys::{escape, parse_held, queue, unescape};
use crate::session::{Session, open_session};

/// The smallest ttl accepted: the lease is measured in whole milliseconds on the server and
/// renewed every ttl/3, so it must be many round trips long.
pub(crate) const MIN_TTL: Duration = Duration::from_millis(100);

/// The ZooKeeper [`LockBackend`]. Cheap to clone (clones share the session).
#[derive(Clone)]
pub struct ZkBackend {
    pub(crate) shared: Arc<Shared>,
}

pub(crate) struct Shared {
    pub(crate) config: ZkConfig,
    pub(crate) client_config: ClientConfig,
    /// The session timeout the server granted to the first session: the longest ttl.
    pub(crate) granted: Duration,
    pub(crate) current: Mutex<Arc<Session>>,
    /// Serialises re-connection after a session ended.
    pub(crate) connecting: tokio::sync::Mutex<()>,
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
    pub(crate) async fn session(&self) -> Result<Arc<Session>> {
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
        Box::new(ZkAttempt::new(self.clone(), request))
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
        held_among(self, names, limit).await
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
