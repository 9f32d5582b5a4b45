//! One acquisition: joining the queue, waiting behind the predecessor, taking over an expired
//! head, leaving the queue.

use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use distlock_core::backend::detached;
use distlock_core::{
    AcquireRequest, Acquired, Attempt, AttemptMode, Error, FencingToken, LockKind, Result, Step,
};
use futures::future::OptionFuture;
use tracing::debug;
use zookeeper_client as zk;

use crate::ZkBackend;
use crate::error::{denied, zk_error};
use crate::keys::{Entry, escape, held_data, node_prefix, queue, waiting_data};
use crate::kinds::{Blockers, Place, blockers, mismatch, place};
use crate::lease::ZkLease;
use crate::queue::{
    Ahead, Lapse, NodeClock, ServerNow, Written, ensure_parent, join_queue, leave_on_reconnection,
    leave_queue, list_queue, ours_by_prefix, remove_lapsed,
};
use crate::session::Session;
use crate::wake::{Wake, Woken};

/// What one path of a poll decided: go on with `T`, or end the poll with this answer.
pub(crate) enum Next<T> {
    Go(T),
    Done(Option<Step>),
}

pub(crate) struct ZkAttempt {
    backend: ZkBackend,
    request: AcquireRequest,
    /// The lock node; its children are the queue.
    parent: String,
    /// `[<kind tag>.]<escaped owner>.`: our node's name up to the sequence number.
    prefix: String,
    /// The session our node belongs to.
    session: Option<Arc<Session>>,
    /// Our node's name, once known.
    node: Option<String>,
    /// A create was sent whose outcome we may not have seen (find the node by its prefix,
    /// among the nodes of our session: see [`Self::locate`]).
    maybe_created: bool,
    /// Our nodes in a session we moved away from (see [`Self::session`]): no longer ours to
    /// wait with, removed through the current session at the next poll.
    left: Vec<String>,
    /// A create in a session we moved away from may have made a node whose name we never
    /// saw: the next poll looks for it by our prefix (see [`Self::remove_left`]).
    left_unseen: bool,
    /// Our node's data says "waiting".
    waiting_marked: bool,
    /// What the last watch saw, for the next poll: the watched node deleted
    /// ([`Woken::Gone`]: it expects to hold), or enough of the nodes that kept ours from
    /// holding ([`Woken::Clear`]: it holds without a look at the queue while our waiting lease
    /// is fresh).
    woken: Option<Woken>,
    /// Our node's creation zxid (its fencing token), once a create's answer gave it.
    created_zxid: Option<i64>,
    /// Our node's lease and the server's clock.
    clock: NodeClock,
    wake: Wake,
}

impl ZkAttempt {
    pub(crate) fn new(backend: ZkBackend, request: AcquireRequest) -> Self {
        let parent = backend.shared.config.lock_path(&request.name);
        let prefix = node_prefix(request.kind, &escape(&request.owner));
        let request_ttl = request.ttl;
        Self {
            backend,
            request,
            parent,
            prefix,
            session: None,
            node: None,
            maybe_created: false,
            left: Vec::new(),
            left_unseen: false,
            waiting_marked: false,
            woken: None,
            created_zxid: None,
            clock: NodeClock::new(request_ttl),
            wake: Wake::Idle,
        }
    }

    fn own_path(&self, node: &str) -> String {
        format!("{}/{node}", self.parent)
    }

    /// Forgets our node (it is gone, or died with its session).
    fn forget_node(&mut self) {
        self.node = None;
        self.maybe_created = false;
        self.woken = None;
        self.waiting_marked = false;
        self.created_zxid = None;
        self.clock.forget();
    }

    /// Whether a waiting poll must write our node: to mark it as a waiter, to refresh its
    /// lease, or to read the server's clock (see [`NodeClock::due`]).
    fn must_write(&self, now: Instant) -> bool {
        !self.waiting_marked || self.clock.due(now)
    }

    /// The session to use; a node of a dead session is gone with it. A node of a retired
    /// session (see `ZkBackend::session`), which lives on while that session does, is removed
    /// through the new one (see [`Self::remove_left`]); the attempt joins the queue again.
    async fn session(&mut self) -> Result<Arc<Session>> {
        if let Some(session) = &self.session {
            if !session.is_dead() && !session.is_retired() {
                // A waiter polls while the connection is down, and moves once it is replaced.
                self.backend.replace_if_stale(session);
                return Ok(session.clone());
            }
            if !session.is_dead() {
                debug!(node = ?self.node, "moving to the backend's new session");
                self.left_unseen |= self.node.is_none() && self.maybe_created;
                self.left.extend(self.node.take());
            }
            self.forget_node();
        }
        let session = self.backend.session().await?;
        // Kept first: a refused waiter that moved here removes the nodes it left on the old
        // session through this one (see `abandon`). Checked once, when taken: the refusal
        // below is not retryable, so the attempt ends (a session's timeout does not change).
        self.session = Some(session.clone());
        // The longest ttl is the first session's timeout (the backend's capabilities); a
        // session opened since (the first ended, or stayed disconnected) may have been granted
        // less, by a server restarted with a lower `maxSessionTimeout`. A holder cut off from
        // the ensemble believes it holds until its lease's end: past the session's timeout,
        // the server has deleted its node and granted the lock to another. (A session that
        // reconnects keeps the timeout it was first granted, as far as the client tells.)
        let timeout = session.client.session_timeout();
        if self.request.ttl > timeout {
            return Err(Error::InvalidOptions(format!(
                "a lease of {:?} (ttl plus lock-delay) is longer than the {timeout:?} timeout \
                 the ZooKeeper server granted the session now open: ask for at most that, or \
                 raise the server's maxSessionTimeout",
                self.request.ttl
            )));
        }
        Ok(session)
    }

    /// The lock is ours: its lease runs from the poll, or from `started` if earlier.
    fn acquired(
        &self,
        session: Arc<Session>,
        node: &str,
        czxid: i64,
        started: Option<Instant>,
    ) -> Result<Step> {
        let token = FencingToken::from_server(czxid, &format!("the czxid of {node}"))?;
        let lease = ZkLease::new(
            session,
            self.request.name.clone(),
            self.own_path(node),
            self.request.ttl,
        );
        let acquired = Acquired::new(Box::new(lease), token);
        Ok(Step::Acquired(match started {
            Some(started) => acquired.with_lease_started(started),
            None => acquired,
        }))
    }

    /// Removes the nodes we left in a session we moved away from, where they would hold our
    /// place ahead of our new node until their leases ran out: those known by name, and those
    /// of a create there whose answer we missed (our prefix, another session's node). A name
    /// is forgotten once its node is gone; a lost connection keeps the rest for the next poll
    /// (so does a cancelled poll), any other refusal lets that node lapse. Nodes of another
    /// session are never taken for ours (see [`Self::locate`]) meanwhile.
    async fn remove_left(&mut self, session: &Session) {
        if self.left_unseen {
            let client = &session.client;
            let Ok(children) = client.list_children(&self.parent).await else {
                return;
            };
            let Ok(nodes) = ours_by_prefix(client, &self.parent, &self.prefix, children).await
            else {
                return;
            };
            let others = nodes.into_iter().filter(|(_, mine)| !mine);
            self.left.extend(others.map(|(node, _)| node));
            self.left_unseen = false;
        }
        while let Some(node) = self.left.first() {
            match session.client.delete(&self.own_path(node), None).await {
                Ok(()) | Err(zk::Error::NoNode) => {}
                Err(zk::Error::ConnectionLoss) => return,
                Err(err) => debug!(%node, %err, "our node of a former session is left to lapse"),
            }
            self.left.remove(0);
        }
    }

    /// Our node's place in `entries`: by its name once known; after a create whose answer we
    /// did not see, the node with our prefix that this very session created. A node with our
    /// prefix from another session (a session we moved away from, whose create's answer we
    /// missed too) is never ours: holding through it, the lock would end with that session
    /// while this one holds on, and with the token of another node.
    async fn locate(&mut self, session: &Session, entries: &[Entry]) -> Result<Option<usize>> {
        if let Some(node) = &self.node {
            return Ok(entries.iter().position(|e| &e.name == node));
        }
        let names = entries.iter().map(|e| e.name.clone());
        let nodes = ours_by_prefix(&session.client, &self.parent, &self.prefix, names)
            .await
            .map_err(|err| zk_error("looking for our node", err))?;
        let mine = nodes.into_iter().find(|(_, mine)| *mine);
        Ok(mine.and_then(|(node, _)| entries.iter().position(|e| e.name == node)))
    }

    async fn poll_once(&mut self) -> Result<Option<Step>> {
        let session = self.session().await?;
        session.check_connected()?;
        if !self.left.is_empty() || self.left_unseen {
            self.remove_left(&session).await;
        }
        let held = held_data(self.request.ttl);
        let woken = self.woken.take();
        if woken == Some(Woken::Clear)
            && let Some(node) = self.node.clone()
            && let Some(step) = self.hold_on_waiting_lease(&session, &node, &held)?
        {
            return Ok(Some(step));
        }
        // The queue, and our node as written by this very call (created, or marked held): its
        // lease starts now.
        let (entries, fresh) = if self.node.is_none() && !self.maybe_created {
            match self.join(&session, &held).await? {
                Next::Go(go) => go,
                Next::Done(step) => return Ok(step),
            }
        } else if matches!(woken, Some(Woken::Gone | Woken::Clear))
            && matches!(self.request.kind, LockKind::Exclusive | LockKind::Shared)
            && self.request.mode == AttemptMode::Wait
            && let Some(node) = self.node.clone()
        {
            match self.handoff(&session, &held, &node).await? {
                Next::Go(go) => go,
                Next::Done(step) => return Ok(step),
            }
        } else {
            (list_queue(&session.client, &self.parent).await?, None)
        };
        let Some(index) = self.locate(&session, &entries).await? else {
            // Our node is gone (removed, expired by a contender) or was never created.
            self.forget_node();
            return Ok(None);
        };
        let own = entries[index].name.clone();
        self.node = Some(own.clone());
        if let Some(message) = mismatch(self.request.kind, &entries[..index]) {
            return Err(Error::Mismatch {
                name: self.request.name.to_string(),
                message,
            });
        }
        if self.request.kind != LockKind::Exclusive {
            return self
                .poll_kind(&session, &entries, index, fresh, &held)
                .await;
        }
        if index == 0 {
            return self.take_head(&session, &own, fresh, &held).await;
        }
        if self.request.mode == AttemptMode::Try && index > 1 {
            return Ok(Some(Step::busy(None)));
        }
        if self.request.mode == AttemptMode::Wait
            && let Some(blockers) = blockers(self.request.kind, &entries, index)
        {
            return self
                .wait_for_blockers(&session, &own, &blockers, &held)
                .await;
        }
        if index > 1 {
            return self
                .wait_behind(&session.client, &own, &entries[index - 1].name)
                .await;
        }
        self.next_in_line(&session.client, &own, &entries[0].name, fresh, &held)
            .await
    }

    /// The first poll: creates our node. Alone in the queue, it holds the lock at once;
    /// otherwise the poll goes on with the queue and our fresh node.
    async fn join(
        &mut self,
        session: &Arc<Session>,
        held: &[u8],
    ) -> Result<Next<(Vec<Entry>, Option<Written>)>> {
        let client = &session.client;
        self.maybe_created = true;
        let sent = Instant::now();
        // A reader or a permit that lately joined others: its listing rides behind the join.
        let kinds = self.request.kind != LockKind::Exclusive;
        let list = kinds && self.backend.shared.contended.lately(&self.parent);
        let (joined, listing) =
            match join_queue(session, &self.parent, &self.prefix, held, list).await {
                Ok(joined) => joined,
                Err(zk::Error::NoNode) => {
                    self.maybe_created = false;
                    ensure_parent(session, &self.backend.shared.config, &self.parent).await?;
                    return Ok(Next::Done(None));
                }
                Err(zk::Error::NoAuth) => {
                    self.maybe_created = false;
                    return Err(denied(
                        &self.backend.shared.config,
                        &self.parent,
                        "joining the queue",
                    ));
                }
                Err(err) => return Err(zk_error("joining the queue", err)),
            };
        // Recorded before the listing is awaited: a poll dropped there keeps the join.
        self.created_zxid = Some(joined.written.czxid);
        self.clock.wrote(sent, joined.written.mtime);
        self.node = Some(joined.node.clone());
        if kinds {
            let contended = &self.backend.shared.contended;
            if joined.alone {
                contended.cleared(&self.parent);
            } else {
                contended.saw(&self.parent);
            }
        }
        if joined.alone {
            self.wake = Wake::Idle;
            let step = self.acquired(session.clone(), &joined.node, joined.written.czxid, None)?;
            return Ok(Next::Done(Some(step)));
        }
        let entries = match listing {
            Some(listing) => listing.await?,
            None => list_queue(client, &self.parent).await?,
        };
        Ok(Next::Go((entries, Some(joined.written))))
    }

    /// The node we watched was deleted: almost always the holder releasing, which makes ours
    /// hold (the mutex's node the head; a reader's, the writer it waited for gone). Lists the
    /// queue and restarts our lease in one round trip, so a handoff costs the release and
    /// this one request. Should ours not hold after all, the waiting paths
    /// mark the node as a waiter again in their next request, so a stale "held" mark lives for
    /// one round trip at most.
    ///
    /// Until the mark commits, our node is a waiter's, which the waiter behind may remove once
    /// its lease ran out: so the shortcut is taken only while that lease is fresh, and the
    /// lock's lease counts from the write that started it.
    async fn handoff(
        &mut self,
        session: &Arc<Session>,
        held: &[u8],
        node: &str,
    ) -> Result<Next<(Vec<Entry>, Option<Written>)>> {
        let client = &session.client;
        // Before sending: a write whose answer is lost (an error, a cancelled poll) may have
        // marked the node held all the same.
        let was_waiting = std::mem::replace(&mut self.waiting_marked, false);
        // The listing goes first: the server answers a read queued before our write without
        // waiting for that write to commit.
        let list = list_queue(client, &self.parent);
        let sent = Instant::now();
        let touch = client.set_data(&self.own_path(node), held, None);
        let entries = list.await?;
        if let Some((czxid, refreshed)) = self.waiting_lease(was_waiting)
            && self.holds_in(&entries, node)
        {
            // Ours holds (the mutex's node as the head of the queue, a reader's with no writer
            // ahead). Until the held mark in flight commits, our node is a waiter's, with a
            // lease that started at `refreshed`; the mark restarts it.
            self.wake = Wake::Idle;
            let step = self.acquired(session.clone(), node, czxid, Some(refreshed))?;
            return Ok(Next::Done(Some(step)));
        }
        match touch.await {
            Ok(stat) => {
                self.clock.wrote(sent, stat.mtime);
                Ok(Next::Go((entries, Some(Written::from(&stat)))))
            }
            Err(zk::Error::NoNode) => {
                self.forget_node();
                Ok(Next::Done(None))
            }
            Err(err) => Err(zk_error("taking the lock", err)),
        }
    }

    /// The token and the lease start to hold on while our held mark is still in flight: our
    /// node said "waiting" (`was_waiting`) with a lease fresh enough, and its token is known.
    /// Until the mark commits, the node behind judges ours by that waiting lease, so the
    /// lock's lease counts from its start. `None`: the mark's answer must be awaited.
    fn waiting_lease(&self, was_waiting: bool) -> Option<(i64, Instant)> {
        if !was_waiting {
            return None;
        }
        Some((self.created_zxid?, self.clock.fresh()?))
    }

    /// Whether `node` (ours) holds in the queue `entries`: the mutex's as the head, a
    /// reader's with no writer ahead of it, with no node ahead of a kind that does not belong
    /// with ours.
    fn holds_in(&self, entries: &[Entry], node: &str) -> bool {
        let kind = self.request.kind;
        entries
            .iter()
            .position(|e| e.name == node)
            .is_some_and(|index| {
                mismatch(kind, &entries[..index]).is_none()
                    && matches!(place(kind, entries, index), Place::Holds { .. })
            })
    }

    /// Ours holds now (it heads the queue, or every node that kept it from holding is gone)
    /// on its waiting lease: our node says "waiting" with a lease fresh enough, as in
    /// [`Self::handoff`]. The held mark is sent, not awaited (the waiter behind, if any, is
    /// woken by it), and the lock's lease counts from that waiting lease's start; a node gone
    /// meanwhile shows in the first renewal, as after the handoff's shortcut. `None`: no such
    /// lease (the caller writes, or looks again).
    fn hold_on_waiting_lease(
        &mut self,
        session: &Arc<Session>,
        own: &str,
        held: &[u8],
    ) -> Result<Option<Step>> {
        let Some((czxid, refreshed)) = self.waiting_lease(self.waiting_marked) else {
            return Ok(None);
        };
        self.waiting_marked = false;
        // Sent at the call.
        drop(session.client.set_data(&self.own_path(own), held, None));
        self.wake = Wake::Idle;
        self.acquired(session.clone(), own, czxid, Some(refreshed))
            .map(Some)
    }

    /// Our node heads the queue: the lock is ours, its lease starting with `fresh` or with a
    /// "held" mark written now (the node was created earlier, as a waiter). A waiter whose
    /// node says "waiting" with a fresh lease holds at once, as in [`Self::handoff`]: the mark
    /// is sent, not awaited, and the lock's lease counts from that waiting lease's start.
    async fn take_head(
        &mut self,
        session: &Arc<Session>,
        own: &str,
        fresh: Option<Written>,
        held: &[u8],
    ) -> Result<Option<Step>> {
        if fresh.is_none()
            && self.request.mode == AttemptMode::Wait
            && let Some(step) = self.hold_on_waiting_lease(session, own, held)?
        {
            return Ok(Some(step));
        }
        let written = match fresh {
            Some(written) => written,
            None => match session
                .client
                .set_data(&self.own_path(own), held, None)
                .await
            {
                Ok(stat) => Written::from(&stat),
                Err(zk::Error::NoNode) => {
                    self.forget_node();
                    return Ok(None);
                }
                Err(err) => return Err(zk_error("taking the lock", err)),
            },
        };
        self.wake = Wake::Idle;
        self.acquired(session.clone(), own, written.czxid, None)
            .map(Some)
    }

    /// Waits for the nodes of `blockers` to go, as many as it needs (see [`blockers`]: their
    /// deletion alone makes ours hold). In one round trip it reads and watches each, then
    /// writes our node when due ([`Self::must_write`]; after the reads, see
    /// `ServerNow::AfterReads`), and removes those whose lease ran out. A node gone already
    /// is one less to wait for; with enough gone, ours holds at once. Once enough are
    /// deleted, the next poll holds without a look at the queue ([`Woken::Clear`]): a writer
    /// behind readers that leave at about the same time no longer looks at the queue after
    /// each one, nor a permit waiter after each release ahead of it.
    async fn wait_for_blockers(
        &mut self,
        session: &Arc<Session>,
        own: &str,
        blockers: &Blockers<'_>,
        held: &[u8],
    ) -> Result<Option<Step>> {
        let client = &session.client;
        let nodes = &blockers.nodes;
        let paths: Vec<String> = nodes.iter().map(|e| self.own_path(&e.name)).collect();
        let sent = Instant::now();
        let waiting = waiting_data(self.request.ttl);
        // Sent at the call, in this order: the reads, then the write.
        let reads = futures::future::join_all(paths.iter().map(|p| client.get_and_watch_data(p)));
        let mark = self
            .must_write(sent)
            .then(|| client.set_data(&self.own_path(own), &waiting, None));
        let (marked, reads) = futures::join!(OptionFuture::from(mark), reads);
        let now = match marked.transpose() {
            Ok(Some(stat)) => {
                self.waiting_marked = true;
                Some(ServerNow::AfterReads(self.clock.wrote(sent, stat.mtime)))
            }
            Ok(None) => None,
            Err(zk::Error::NoNode) => {
                self.forget_node();
                return Ok(None);
            }
            Err(err) => return Err(zk_error("marking the waiter", err)),
        };
        let (reads, watchers): (Vec<_>, Vec<_>) = reads
            .into_iter()
            .zip(&paths)
            .map(|(read, path)| match read {
                Ok((data, stat, watcher)) => (Ok((data, stat)), Some((path.clone(), watcher))),
                Err(err) => (Err(err), None),
            })
            .unzip();
        let names = nodes.iter().map(|e| e.name.as_str());
        let what = "watching the node ahead";
        let Verdict::Alive { first_out } =
            judge_ahead(client, names, &paths, reads, now, what).await?
        else {
            return Ok(None);
        };
        // The watches of the nodes read (a node gone already is one less to wait for).
        let watchers: Vec<_> = watchers.into_iter().flatten().collect();
        let gone = nodes.len() - watchers.len();
        if gone >= blockers.needed {
            return self.hold_on_waiting_lease(session, own, held);
        }
        self.wake = Wake::counted(client.clone(), watchers, blockers.needed - gone);
        let retry_after = self.clock.wait_for(
            first_out.map(|(lease, _)| lease),
            first_out.map_or(0, |(_, mtime)| mtime),
            now.map(ServerNow::ms),
            true,
        );
        Ok(Some(Step::busy(retry_after)))
    }

    /// Behind another waiter: watch only the predecessor, and write our node (marking it as
    /// a waiter, refreshing its lease, reading the server's clock) in the same round trip
    /// when [`Self::must_write`] says so.
    async fn wait_behind(
        &mut self,
        client: &zk::Client,
        own: &str,
        predecessor: &str,
    ) -> Result<Option<Step>> {
        let own_path = self.own_path(own);
        let pred_path = self.own_path(predecessor);
        let sent = Instant::now();
        let waiting = waiting_data(self.request.ttl);
        // The read first: the write's `mtime`, our reading of the server's clock, is then
        // stamped after whatever the read saw (see `ServerNow::AfterReads`).
        let watch = client.get_and_watch_data(&pred_path);
        let mark = self
            .must_write(sent)
            .then(|| client.set_data(&own_path, &waiting, None));
        let (marked, watched) = futures::join!(
            async move {
                match mark {
                    Some(mark) => mark.await.map(Some),
                    None => Ok(None),
                }
            },
            watch
        );
        let now = match marked {
            Ok(Some(stat)) => {
                self.waiting_marked = true;
                Some(ServerNow::AfterReads(self.clock.wrote(sent, stat.mtime)))
            }
            Ok(None) => None,
            Err(zk::Error::NoNode) => {
                self.forget_node();
                return Ok(None);
            }
            Err(err) => return Err(zk_error("marking the waiter", err)),
        };
        match watched {
            Ok((data, stat, watcher)) => {
                let ahead = Ahead {
                    name: predecessor,
                    path: &pred_path,
                    data: &data,
                    stat: &stat,
                };
                self.judge(client, ahead, now, Some(watcher)).await
            }
            // The predecessor left between the listing and the watch: look again.
            Err(zk::Error::NoNode) => Ok(None),
            Err(err) => Err(zk_error("watching the predecessor", err)),
        }
    }

    /// A try next in line (a waiter next in line waits for the head as its blocker, see
    /// [`Self::wait_for_blockers`]): reads the head and the server's clock (our own write's
    /// mtime) in one round trip, and removes the head if its lease ran out on the server's
    /// clock.
    async fn next_in_line(
        &mut self,
        client: &zk::Client,
        own: &str,
        head: &str,
        fresh: Option<Written>,
        held: &[u8],
    ) -> Result<Option<Step>> {
        debug_assert_eq!(
            self.request.mode,
            AttemptMode::Try,
            "a waiter next in line waits for the head as a blocker"
        );
        let head_path = self.own_path(head);
        let (now, head_read) = match fresh {
            // Its new node's mtime is the server's clock, stamped before the read: should the
            // head look lapsed by it, the next poll reads, then writes.
            Some(written) => (
                ServerNow::BeforeReads(written.mtime),
                client.get_data(&head_path).await,
            ),
            None => {
                let sent = Instant::now();
                // The read first (see `ServerNow::AfterReads`): both are sent at the call.
                let read = client.get_data(&head_path);
                let touch = client.set_data(&self.own_path(own), held, None);
                let (touched, read) = futures::join!(touch, read);
                let stat = match touched {
                    Ok(stat) => stat,
                    Err(zk::Error::NoNode) => {
                        self.forget_node();
                        return Ok(None);
                    }
                    Err(err) => return Err(zk_error("marking the waiter", err)),
                };
                (
                    ServerNow::AfterReads(self.clock.wrote(sent, stat.mtime)),
                    read,
                )
            }
        };
        let (data, stat) = match head_read {
            Ok(read) => read,
            Err(zk::Error::NoNode) => return Ok(None),
            Err(err) => return Err(zk_error("reading the holder", err)),
        };
        let ahead = Ahead {
            name: head,
            path: &head_path,
            data: &data,
            stat: &stat,
        };
        self.judge(client, ahead, Some(now), None).await
    }

    /// A shared or permit node's poll, once the queue is known (see [`place`]): hold, wait for
    /// the node that blocks ours, or, as the first permit waiter, for any holder to go.
    async fn poll_kind(
        &mut self,
        session: &Arc<Session>,
        entries: &[Entry],
        index: usize,
        fresh: Option<Written>,
        held: &[u8],
    ) -> Result<Option<Step>> {
        let own = entries[index].name.as_str();
        let place = place(self.request.kind, entries, index);
        if self.request.mode == AttemptMode::Wait
            && matches!(place, Place::Behind(_) | Place::FirstWaiter(_))
            && let Some(blockers) = blockers(self.request.kind, entries, index)
        {
            return self.wait_for_blockers(session, own, &blockers, held).await;
        }
        match place {
            // A successor that saw our node waiting may watch its data: the write marking it
            // held wakes it (it may now be among the waiters that count, or the first waiter).
            // Without one, a node created by this poll holds with its creation as it is.
            Place::Holds { successor } => {
                let fresh = fresh.filter(|_| !successor);
                self.take_head(session, own, fresh, held).await
            }
            Place::Behind(blocker) if self.request.mode == AttemptMode::Try => {
                // A try removes a holder whose lease ran out, as the mutex's does.
                if entries.first() == Some(&blocker) {
                    self.next_in_line(&session.client, own, &blocker.name, fresh, held)
                        .await
                } else {
                    Ok(Some(Step::busy(None)))
                }
            }
            Place::Behind(blocker) => self.wait_behind(&session.client, own, &blocker.name).await,
            Place::FirstWaiter(holders) => self.first_waiter(session, own, &holders, fresh).await,
        }
    }

    /// The first permit waiter (N holders ahead of it): the release or removal of any holder
    /// frees a permit for it. In one round trip it writes its node when due (waiting mark,
    /// lease refresh, the server's clock: [`Self::must_write`]), lists the children with a
    /// watch (which fires on the next release, and on nothing a holder's renewal does), and
    /// reads every holder's node to remove those whose lease ran out. A try reads the holders
    /// with the server's clock of its own write, without a watch.
    ///
    /// Taken by a try and by a waiter with more than `kinds::MAX_BLOCKERS` holders ahead;
    /// any other first waiter counts the holders' deletions (see
    /// [`Self::wait_for_blockers`]).
    /// The waiter behind it watches its node: when it becomes a holder, the write that marks
    /// it held wakes that one, which then takes over the children watch.
    async fn first_waiter(
        &mut self,
        session: &Arc<Session>,
        own: &str,
        holders: &[Entry],
        fresh: Option<Written>,
    ) -> Result<Option<Step>> {
        let client = &session.client;
        let try_mode = self.request.mode == AttemptMode::Try;
        let own_path = self.own_path(own);
        let sent = Instant::now();
        let mark = if try_mode {
            held_data(self.request.ttl)
        } else {
            waiting_data(self.request.ttl)
        };
        // Sent in this order on the session: the reads, the watched listing, the write (whose
        // `mtime` is then stamped after whatever the reads saw: see `ServerNow::AfterReads`).
        let paths: Vec<String> = holders.iter().map(|h| self.own_path(&h.name)).collect();
        let reads = futures::future::join_all(paths.iter().map(|path| client.get_data(path)));
        let listing = (!try_mode).then(|| client.list_and_watch_children(&self.parent));
        let touch = match fresh {
            Some(_) if try_mode => None,
            _ if try_mode || self.must_write(sent) => Some(client.set_data(&own_path, &mark, None)),
            _ => None,
        };
        let (touched, listed, reads) = futures::join!(
            OptionFuture::from(touch),
            OptionFuture::from(listing),
            reads
        );
        let (touched, listed) = (touched.transpose(), listed.transpose());
        let now = match touched {
            Ok(Some(stat)) => {
                self.waiting_marked = !try_mode;
                Some(ServerNow::AfterReads(self.clock.wrote(sent, stat.mtime)))
            }
            // Only a try leaves a fresh node unwritten (a waiter's is not marked yet); in a
            // waiter this would only delay a removal to the next write.
            Ok(None) => fresh.map(|written| ServerNow::BeforeReads(written.mtime)),
            Err(zk::Error::NoNode) => {
                self.forget_node();
                return Ok(None);
            }
            Err(err) => return Err(zk_error("marking the waiter", err)),
        };
        let watcher = match listed {
            Ok(Some((children, watcher))) => {
                // Still the first waiter, or the listing saw a change: look again.
                let entries = queue(children);
                let still = entries
                    .iter()
                    .position(|e| e.name == own)
                    .map(|index| place(self.request.kind, &entries, index));
                if !matches!(still, Some(Place::FirstWaiter(_))) {
                    return Ok(None);
                }
                Some(watcher)
            }
            Ok(None) => None,
            Err(zk::Error::NoNode) => return Ok(None),
            Err(err) => return Err(zk_error("watching the holders", err)),
        };
        if reads
            .iter()
            .any(|read| matches!(read, Err(zk::Error::NoNode)))
        {
            return Ok(None); // released meanwhile
        }
        // The holder whose lease runs out first: when to look again.
        let names = holders.iter().map(|h| h.name.as_str());
        let Verdict::Alive { first_out } =
            judge_ahead(client, names, &paths, reads, now, "reading a holder").await?
        else {
            return Ok(None);
        };
        if let Some(watcher) = watcher {
            self.wake = Wake::deleted(watcher);
        }
        let retry_after = self.clock.wait_for(
            first_out.map(|(lease, _)| lease),
            first_out.map_or(0, |(_, mtime)| mtime),
            now.map(ServerNow::ms),
            !try_mode,
        );
        Ok(Some(Step::busy(retry_after)))
    }

    /// Decides about the node ahead of ours (the head, or our predecessor): removes it if its
    /// lease ran out ([`remove_lapsed`]), else waits for it: woken by `watcher`, when its
    /// lease may run out, or when our own lease needs a refresh.
    async fn judge(
        &mut self,
        client: &zk::Client,
        ahead: Ahead<'_>,
        now: Option<ServerNow>,
        watcher: Option<zk::OneshotWatcher>,
    ) -> Result<Option<Step>> {
        // Removed, or lapsed by a reading from before the read: look again (the next poll
        // writes our node after reading it).
        if remove_lapsed(client, &ahead, now).await? != Lapse::Alive {
            return Ok(None);
        }
        if let Some(watcher) = watcher {
            self.wake = Wake::deleted(watcher);
        }
        let lease = ahead.lease_ms();
        let refreshing = self.request.mode == AttemptMode::Wait;
        let retry_after =
            self.clock
                .wait_for(lease, ahead.stat.mtime, now.map(ServerNow::ms), refreshing);
        Ok(Some(Step::busy(retry_after)))
    }
}

/// What nodes ahead of ours, read together, say (see [`judge_ahead`]).
enum Verdict {
    /// One was removed, its lease run out (or may have run out): look again.
    LookAgain,
    /// Those read are alive; the lease (ms) and `mtime` of the one whose lease runs out first
    /// (none: no lease among them).
    Alive { first_out: Option<(i64, i64)> },
}

/// Judges the nodes ahead of ours (`names`, at `paths`) as `reads` saw them, in one round
/// trip: removes those whose lease ran out ([`remove_lapsed`]); a node gone before its read
/// is skipped. Other errors of a read end it with `what`.
async fn judge_ahead<'a>(
    client: &zk::Client,
    names: impl Iterator<Item = &'a str>,
    paths: &[String],
    reads: Vec<std::result::Result<(Vec<u8>, zk::Stat), zk::Error>>,
    now: Option<ServerNow>,
    what: &str,
) -> Result<Verdict> {
    let mut first_out: Option<(i64, i64)> = None;
    for ((name, path), read) in names.zip(paths).zip(reads) {
        let (data, stat) = match read {
            Ok(read) => read,
            Err(zk::Error::NoNode) => continue,
            Err(err) => return Err(zk_error(what, err)),
        };
        let ahead = Ahead {
            name,
            path,
            data: &data,
            stat: &stat,
        };
        if remove_lapsed(client, &ahead, now).await? != Lapse::Alive {
            return Ok(Verdict::LookAgain);
        }
        if let Some(lease) = ahead.lease_ms()
            && first_out.is_none_or(|(l, m)| stat.mtime + lease < m + l)
        {
            first_out = Some((lease, stat.mtime));
        }
    }
    Ok(Verdict::Alive { first_out })
}

#[async_trait]
impl Attempt for ZkAttempt {
    async fn poll(&mut self) -> Result<Step> {
        self.wake = Wake::Idle;
        // `None`: the queue changed under us (our node vanished, the head left between two
        // requests); the core polls again at once.
        Ok(self.poll_once().await?.unwrap_or(Step::Again))
    }

    async fn changed(&mut self) {
        match &mut self.wake {
            Wake::Watch(watch) => {
                self.woken = Some(watch.await);
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
        // Our node, and those we left in a session we moved away from (not removed yet). The
        // search by our prefix (unique to this acquisition) finds those of lost creates. Left
        // nodes of a retired session, should the current one be dead, lapse after a ttl.
        let search = (self.node.is_none() && self.maybe_created) || self.left_unseen;
        let nodes: Vec<String> = self.left.iter().chain(&self.node).cloned().collect();
        let (parent, prefix) = (self.parent.clone(), self.prefix.clone());
        if session.is_connected() {
            // Detached, so that a cancelled abandon still removes the entry.
            return detached(async move {
                leave_queue(&session.client, &parent, &prefix, nodes, search).await
            })
            .await;
        }
        debug!("abandoning while disconnected: the queue entry is removed on reconnection");
        leave_on_reconnection(session, parent, prefix, nodes, search);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use distlock_core::{AcquireOptions, ClientConfig, DistributedLock, LockClient};

    use super::*;
    use crate::ZkConfig;
    use crate::session::open_session;

    /// The test server's configuration, asking for a 20 s session timeout.
    fn config() -> Option<ZkConfig> {
        let connect = conformance_tests::server_var("zk", "DISTLOCK_TEST_ZK_CONNECT")?;
        let config = ZkConfig::new(&connect).expect("connect string");
        Some(config.with_session_timeout(Duration::from_secs(20)))
    }

    /// A session of `config` granted a 4 s timeout.
    async fn short_session(config: ZkConfig, options: &ClientConfig) -> Arc<Session> {
        let short = config.with_session_timeout(Duration::from_secs(4));
        let session = open_session(&short, options.operation_timeout)
            .await
            .expect("open a session");
        assert_eq!(session.client.session_timeout(), Duration::from_secs(4));
        session
    }

    /// A session that replaced the first was granted a shorter timeout than the ttl asked for
    /// (which the first session's allowed): the acquisition is refused with a clear error,
    /// and one within the new timeout holds.
    #[tokio::test]
    async fn a_ttl_past_a_new_sessions_shorter_timeout_is_refused() {
        let Some(config) = config() else {
            return;
        };
        let options = ClientConfig::default();
        let backend = ZkBackend::connect(config.clone(), &options)
            .await
            .expect("connect");
        assert_eq!(backend.session_timeout(), Duration::from_secs(20));
        // As when the first session ended and the server granted its replacement less.
        let replacement = short_session(config, &options).await;
        *distlock_core::backend::unpoisoned(&backend.shared.current) = replacement;
        let client = LockClient::with_config(backend, options).expect("client");
        let name = format!("short-session-{}", uuid::Uuid::new_v4().simple());
        let long = AcquireOptions::default().with_ttl(Duration::from_secs(10));
        match client.acquire(&name, &long).await {
            Err(Error::InvalidOptions(message)) => {
                assert!(message.contains("4s"), "{message}");
            }
            other => panic!("a 10 s lease on a 4 s session: {other:?}"),
        }
        let within = AcquireOptions::default().with_ttl(Duration::from_secs(3));
        let guard = client.acquire(&name, &within).await.expect("acquire");
        guard.release().await.expect("release");
    }

    /// A waiter queued on the first session, which the backend replaces (as when it stays
    /// disconnected) with one granted a shorter timeout than the waiter's lease: the waiter
    /// is refused at its next poll, and its node on the first session is removed.
    #[tokio::test]
    async fn a_waiter_moved_to_a_shorter_session_is_refused_and_leaves_the_queue() {
        let Some(config) = config() else {
            return;
        };
        let options = ClientConfig::default();
        let name = format!("moved-waiter-{}", uuid::Uuid::new_v4().simple());
        let holder = crate::connect_with(config.clone(), options.clone())
            .await
            .expect("connect the holder");
        let opts = AcquireOptions::default().with_ttl(Duration::from_secs(6));
        let held = holder.acquire(&name, &opts).await.expect("hold");
        let backend = ZkBackend::connect(config.clone(), &options)
            .await
            .expect("connect");
        let shared = backend.shared.clone();
        let client = LockClient::with_config(backend, options.clone()).expect("client");
        let waiter = tokio::spawn({
            let name = name.clone();
            async move { client.acquire(&name, &opts).await.map(|_| ()) }
        });
        let parent = config.lock_path(&distlock_core::LockName::new(&name).expect("name"));
        let queued = || async {
            let session = distlock_core::backend::unpoisoned(&shared.current).clone();
            let children = session.client.list_children(&parent).await;
            children.expect("list the queue").len()
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while queued().await < 2 {
            assert!(Instant::now() < deadline, "the waiter never queued");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let replacement = short_session(config, &options).await;
        // The first session kept open: its last handle dropped, the client library would
        // close it, and its nodes would go without the waiter removing them.
        let first = {
            let mut current = distlock_core::backend::unpoisoned(&shared.current);
            current.retire();
            std::mem::replace(&mut *current, replacement)
        };
        // Its next poll comes by a third of its lease, to renew its waiting mark.
        let refused = tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .expect("the waiter was not refused in time")
            .expect("the waiter's task");
        match refused {
            Err(Error::InvalidOptions(message)) => assert!(message.contains("4s"), "{message}"),
            other => panic!("a 6 s lease on a 4 s session: {other:?}"),
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while queued().await > 1 {
            assert!(
                Instant::now() < deadline,
                "the refused waiter's node stayed"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(!first.is_dead(), "the first session ended");
        drop(first);
        held.release().await.expect("release");
    }
}
