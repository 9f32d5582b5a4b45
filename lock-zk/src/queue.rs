//! The queue on the server: the lock node's children, lowest sequence first. Listing it,
//! joining it (our node created in one multi with a touch of the lock node), and leaving it;
//! and the clock of a place in it ([`NodeClock`]): every node is a lease, a waiter's too.
//! Where a node of each kind stands in the queue, and who holds a name, are in `kinds.rs`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock_core::backend::spawn_cleanup;
use distlock_core::{Error, Result};
use zookeeper_client as zk;

use crate::ZkConfig;
use crate::error::{denied, zk_error};
use crate::keys::{Entry, Mark, container, ephemeral_sequential, queue};
use crate::session::{Session, create_base};

/// The queue under `parent`, lowest sequence first; empty once the lock node is gone. The
/// request is sent at the call, not when the future is first polled, so that it keeps its
/// place among the session's requests.
pub(crate) fn list_queue<'a>(
    client: &'a zk::Client,
    parent: &str,
) -> impl Future<Output = Result<Vec<Entry>>> + Send + use<'a> {
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
pub(crate) struct Written {
    /// Its creation zxid: the fencing token.
    pub(crate) czxid: i64,
    /// The write's time on the server's clock.
    pub(crate) mtime: i64,
}

impl From<&zk::Stat> for Written {
    fn from(stat: &zk::Stat) -> Self {
        Self {
            czxid: stat.czxid,
            mtime: stat.mtime,
        }
    }
}

/// The answer to [`join_queue`].
pub(crate) struct Joined {
    /// Our node's name.
    pub(crate) node: String,
    pub(crate) written: Written,
    /// Ours is the only node: we hold the lock.
    pub(crate) alone: bool,
}

/// The answer to the listing [`join_queue`] sent right behind the join (our node in it).
pub(crate) type Listing<'a> = futures::future::BoxFuture<'a, Result<Vec<Entry>>>;

/// Creates the lock node (a container, removed by the server once empty), and the base node
/// if it went missing.
pub(crate) async fn ensure_parent(
    session: &Session,
    config: &ZkConfig,
    parent: &str,
) -> Result<()> {
    let client = &session.client;
    for _ in 0..3 {
        match client.create(parent, &[], &container(session.acls)).await {
            Ok(_) | Err(zk::Error::NodeExists) => return Ok(()),
            Err(zk::Error::NoNode) => create_base(client, config, session.acls).await?,
            Err(zk::Error::NoAuth) => return Err(denied(config, parent, "creating the lock node")),
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
///
/// With `list`, the queue's listing is sent right behind the transaction, before its
/// answer: the server answers a session's requests in order, so the listing sees our node,
/// and a join that is not alone (a reader beside readers, a permit beside holders) knows its
/// place with no second round trip. A join alone pays that read for nothing, so only the
/// readers and permits of a lock node whose joins lately found others ask (the mutex,
/// whose waiters wait anyway, never does).
///
/// Returns the listing unawaited, so that the caller records the join first: a poll dropped
/// while it waits for the listing keeps what the join's answer told it.
pub(crate) async fn join_queue<'a>(
    session: &'a Session,
    parent: &str,
    prefix: &str,
    held: &[u8],
    list: bool,
) -> std::result::Result<(Joined, Option<Listing<'a>>), zk::Error> {
    let create_path = format!("{parent}/{prefix}");
    let mut multi = session.client.new_multi_writer();
    multi.add_create(&create_path, held, &ephemeral_sequential(session.acls))?;
    multi.add_set_data(parent, &[], None)?;
    let commit = multi.commit();
    let listing = list.then(|| -> Listing<'a> { Box::pin(list_queue(&session.client, parent)) });
    let results = commit.await.map_err(zk::Error::from)?;
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
    let joined = Joined {
        node,
        written: Written {
            czxid,
            mtime: parent.mtime,
        },
        alone: parent.num_children == 1,
    };
    Ok((joined, listing))
}

/// Our nodes among `children` (by our unique `prefix`), each with whether `client`'s own
/// session created it (its `ephemeralOwner`): one read of each, sent together. A node gone
/// meanwhile is left out.
pub(crate) async fn ours_by_prefix(
    client: &zk::Client,
    parent: &str,
    prefix: &str,
    children: impl IntoIterator<Item = String>,
) -> std::result::Result<Vec<(String, bool)>, zk::Error> {
    let names: Vec<String> = children
        .into_iter()
        .filter(|child| child.starts_with(prefix))
        .collect();
    let session = client.session_id().0;
    let stats = futures::future::join_all(
        names
            .iter()
            .map(|name| client.check_stat(&format!("{parent}/{name}"))),
    )
    .await;
    names
        .into_iter()
        .zip(stats)
        .filter_map(|(name, stat)| match stat {
            Ok(Some(stat)) => Some(Ok((name, stat.ephemeral_owner == session))),
            Ok(None) => None,
            Err(err) => Some(Err(err)),
        })
        .collect()
}

/// Deletes our nodes: those `known` by name, and, with `search` (a create's reply was lost),
/// those found by our unique prefix.
pub(crate) async fn leave_queue(
    client: &zk::Client,
    parent: &str,
    prefix: &str,
    known: Vec<String>,
    search: bool,
) -> Result<()> {
    let mut targets = known;
    if search {
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

/// Leaves the queue in the background once `session` is connected again (see
/// [`leave_queue`]): within the session timeout; a session that ends takes our ephemeral
/// nodes with it.
pub(crate) fn leave_on_reconnection(
    session: Arc<Session>,
    parent: String,
    prefix: String,
    nodes: Vec<String>,
    search: bool,
) {
    spawn_cleanup(
        "leaving the lock queue after a reconnection",
        None,
        move || {
            let (session, parent, prefix, nodes) = (
                session.clone(),
                parent.clone(),
                prefix.clone(),
                nodes.clone(),
            );
            async move {
                let wait = session.client.session_timeout();
                let mut states = session.client.state_watcher();
                let reconnected = tokio::time::timeout(wait, async {
                    while !session.is_connected() && !session.is_dead() {
                        states.changed().await;
                    }
                })
                .await;
                if reconnected.is_err() || session.is_dead() {
                    return Ok(());
                }
                leave_queue(&session.client, &parent, &prefix, nodes, search).await
            }
        },
    );
}

/// Our node's lease (held or waiting) and the server's clock, as our own writes' answers gave
/// them. Leases are judged on the server's clock: a node's `mtime` against the `mtime` of our
/// own latest write.
pub(crate) struct NodeClock {
    /// The acquire's ttl: the lease of our node.
    ttl: Duration,
    /// When the last write of our node whose answer we saw was sent: its lease runs from no
    /// earlier than this.
    refreshed: Option<Instant>,
    /// The server's clock (ms) as our last write's answer gave it, and when that answer came.
    server: Option<(i64, Instant)>,
    /// When the lease of the node ahead of ours may run out: the next poll then writes our
    /// node to read the server's clock, and removes that node if its lease did run out.
    check_at: Option<Instant>,
}

impl NodeClock {
    pub(crate) fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            refreshed: None,
            server: None,
            check_at: None,
        }
    }

    /// Our node is gone: nothing of its lease counts any more.
    pub(crate) fn forget(&mut self) {
        self.refreshed = None;
        self.check_at = None;
    }

    /// Records the answer to a write of our node sent at `sent`: the node's lease restarted
    /// no earlier than that, and the answer's `mtime` is the server's clock. Returns it.
    pub(crate) fn wrote(&mut self, sent: Instant, mtime: i64) -> i64 {
        self.refreshed = Some(sent);
        self.server = Some((mtime, Instant::now()));
        mtime
    }

    /// How long until our waiting node's lease needs a refresh (every third of the ttl).
    fn refresh_in(&self, now: Instant) -> Duration {
        self.refreshed.map_or(Duration::ZERO, |at| {
            (at + distlock_core::default_renewal_interval(self.ttl)).saturating_duration_since(now)
        })
    }

    /// Whether our node must be written now: its lease needs a refresh, or the lease of the
    /// node ahead may have run out (the write reads the server's clock).
    pub(crate) fn due(&self, now: Instant) -> bool {
        self.refresh_in(now).is_zero() || self.check_at.is_some_and(|at| now >= at)
    }

    /// When our node's lease started, if that was less than half a ttl ago: fresh enough to
    /// count the lock's lease from it.
    pub(crate) fn fresh(&self) -> Option<Instant> {
        self.refreshed.filter(|at| at.elapsed() < self.ttl / 2)
    }

    /// We wait for a node written at `mtime` with a lease of `lease` ms (none: it has no
    /// lease, e.g. an old client's waiter); `now_ms` is the server's clock if this poll read
    /// it. Returns when to poll again: when that lease may run out, or, if `refreshing`, when
    /// our own lease needs a refresh, whichever comes first.
    pub(crate) fn wait_for(
        &mut self,
        lease: Option<i64>,
        mtime: i64,
        now_ms: Option<i64>,
        refreshing: bool,
    ) -> Option<Duration> {
        // Without a fresh reading of the server's clock, the last one plus the time since.
        let now = Instant::now();
        let server_now = now_ms.or_else(|| {
            self.server.map(|(ms, at)| {
                ms + i64::try_from(now.duration_since(at).as_millis()).unwrap_or(i64::MAX)
            })
        });
        let runs_out = lease.zip(server_now).map(|(lease, server_now)| {
            let left = lease - (server_now - mtime);
            Duration::from_millis(u64::try_from(left).unwrap_or(0) + 1)
        });
        self.check_at = runs_out.map(|left| now + left);
        let refresh = refreshing.then(|| self.refresh_in(now));
        match (runs_out, refresh) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// The node ahead of ours in the queue, as one read saw it.
#[derive(Clone, Copy)]
pub(crate) struct Ahead<'a> {
    pub(crate) name: &'a str,
    pub(crate) path: &'a str,
    pub(crate) data: &'a [u8],
    pub(crate) stat: &'a zk::Stat,
}

impl Ahead<'_> {
    /// Its lease in ms, as its mark says (none: an old client's waiter).
    pub(crate) fn lease_ms(&self) -> Option<i64> {
        Mark::parse(self.data).and_then(Mark::lease_ms)
    }
}

/// The server's clock (ms), as the answer to a write of our own node stamped it, and whether
/// that write was sent after the reads it is compared with.
#[derive(Clone, Copy, Debug)]
pub(crate) enum ServerNow {
    /// Sent after the reads on the session, whose requests the server handles in order: every
    /// `mtime` they saw was stamped before this one, so a step back of the server's clock
    /// between the two can only make a node look younger. Judges leases.
    AfterReads(i64),
    /// Stamped before the reads were sent (a try's creation of our node, two round trips
    /// earlier): a holder renewed after a step back of the server's clock would look older by
    /// the step, and lapsed. Only says when to look again.
    BeforeReads(i64),
}

impl ServerNow {
    /// The reading, whichever it is.
    pub(crate) fn ms(self) -> i64 {
        match self {
            Self::AfterReads(ms) | Self::BeforeReads(ms) => ms,
        }
    }
}

/// What the lease of the node ahead says (see [`lapse`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lapse {
    /// It runs (or cannot be judged: no lease, no reading of the server's clock): wait.
    Alive,
    /// It ran out: remove the node ([`remove_lapsed`]: removed, or gone already).
    Over,
    /// It looks over by a reading stamped before the read of the node
    /// ([`ServerNow::BeforeReads`]): look again with one stamped after.
    Unsure,
}

/// Whether the lease of `lease` ms of a node written at `mtime` ran out by `now` (none: no
/// reading of the server's clock in this poll).
pub(crate) fn lapse(lease: Option<i64>, mtime: i64, now: Option<ServerNow>) -> Lapse {
    let (Some(lease), Some(now)) = (lease, now) else {
        return Lapse::Alive;
    };
    match now {
        _ if now.ms() - mtime <= lease => Lapse::Alive,
        ServerNow::AfterReads(_) => Lapse::Over,
        ServerNow::BeforeReads(_) => Lapse::Unsure,
    }
}

/// Removes `ahead` if its lease (a holder's or a waiter's) ran out on the server's clock
/// (`now`: see [`lapse`]), unless it was written meanwhile (the version check makes this
/// atomic). [`Lapse::Over`]: removed, or gone already.
pub(crate) async fn remove_lapsed(
    client: &zk::Client,
    ahead: &Ahead<'_>,
    now: Option<ServerNow>,
) -> Result<Lapse> {
    let verdict = lapse(ahead.lease_ms(), ahead.stat.mtime, now);
    if verdict != Lapse::Over {
        return Ok(verdict);
    }
    let age = now.map_or(0, |now| now.ms() - ahead.stat.mtime);
    let lease = ahead.lease_ms();
    tracing::debug!(node = %ahead.name, age, lease, "removing a node whose lease ran out");
    match client.delete(ahead.path, Some(ahead.stat.version)).await {
        Ok(()) | Err(zk::Error::NoNode) => Ok(Lapse::Over),
        // Renewed or refreshed meanwhile: alive (the waiter looks again at once: its deadline
        // is the lease it read, which ran out).
        Err(zk::Error::BadVersion) => Ok(Lapse::Alive),
        Err(err) => Err(zk_error("removing a node whose lease ran out", err)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A holder renewed 200 ms after our write, once the leader's clock had stepped back by
    /// 2 s: its `mtime` is 1.8 s behind our write's. Read after that write (the order this
    /// crate sent them in before), its lease of 1 s looked over by 0.8 s.
    #[test]
    fn a_reading_from_before_the_read_never_removes() {
        let written = 1_000_000;
        let renewed = written + 200 - 2_000;
        assert_eq!(
            lapse(Some(1_000), renewed, Some(ServerNow::BeforeReads(written))),
            Lapse::Unsure
        );
        // Stamped after the read, the same reading judges: the read saw only what was
        // stamped before it.
        assert_eq!(
            lapse(
                Some(1_000),
                written - 1_001,
                Some(ServerNow::AfterReads(written))
            ),
            Lapse::Over
        );
        assert_eq!(
            lapse(
                Some(1_000),
                written - 1_000,
                Some(ServerNow::AfterReads(written))
            ),
            Lapse::Alive
        );
    }

    #[test]
    fn no_lease_or_no_reading_is_alive() {
        assert_eq!(
            lapse(None, 0, Some(ServerNow::AfterReads(1 << 40))),
            Lapse::Alive
        );
        assert_eq!(lapse(Some(1_000), 0, None), Lapse::Alive);
        // A lease not over yet is alive by either reading.
        assert_eq!(
            lapse(Some(1_000), 500, Some(ServerNow::BeforeReads(900))),
            Lapse::Alive
        );
    }
}
