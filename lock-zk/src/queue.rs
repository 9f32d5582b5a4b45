//! The queue on the server: the lock node's children, lowest sequence first. Listing it,
//! joining it (our node created in one multi with a touch of the lock node), and leaving it.

use distlock_core::{Error, Result};
use zookeeper_client as zk;

use crate::error::zk_error;
use crate::keys::{CONTAINER, EPHEMERAL_SEQUENTIAL, Entry, PERSISTENT, queue};

/// The queue under `parent`, lowest sequence first; empty once the lock node is gone. The
/// request is sent at the call, not when the future is first polled, so that it keeps its
/// place among the session's requests.
pub(crate) fn list_queue<'a>(
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

/// Creates the lock node (a container, removed by the server once empty).
pub(crate) async fn ensure_parent(client: &zk::Client, parent: &str, base: &str) -> Result<()> {
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
pub(crate) async fn join_queue(
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

/// Deletes our node (found by its unique prefix if a create's reply was lost).
pub(crate) async fn leave_queue(
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
