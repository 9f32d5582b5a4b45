//! ZooKeeper client errors as distlock errors.

use distlock_core::Error;
use zookeeper_client as zk;

use crate::ZkConfig;

/// The server refused an operation on `path` (NoAuth): a clear, non-retryable error naming
/// the servers, the identity and the node, never the password.
pub(crate) fn denied(config: &ZkConfig, path: &str, what: &str) -> Error {
    let who = match config.digest() {
        Some(digest) => format!("the credentials of {}", crate::acl::who(digest)),
        None => "this client (no credentials)".to_owned(),
    };
    Error::backend(
        format!(
            "ZooKeeper at {}: {what}: {who} lack permission on {path} (NoAuth): a wrong password, \
             or the node belongs to another identity",
            config.hosts().join(",")
        ),
        zk::Error::NoAuth,
    )
}

/// Maps a client library error: answers about nodes are protocol surprises, everything else
/// (connection loss, I/O errors, session trouble, throttling) is a retryable unavailability.
pub(crate) fn zk_error(what: &str, err: zk::Error) -> Error {
    use zk::Error as E;
    match err {
        E::NoNode
        | E::NodeExists
        | E::BadVersion
        | E::NotEmpty
        | E::InvalidAcl
        | E::AuthFailed
        | E::BadArguments(_)
        | E::NoChildrenForEphemerals
        | E::Unimplemented
        | E::QuotaExceeded
        | E::NotReadOnly
        | E::ReconfigDisabled
        | E::NoWatcher => Error::backend(format!("ZooKeeper {what}: {err}"), err),
        E::NoAuth => Error::backend(
            format!(
                "ZooKeeper {what}: permission denied (NoAuth): this session's credentials lack \
                 permission on the lock's nodes"
            ),
            err,
        ),
        other => Error::unavailable(format!("ZooKeeper {what}: {other}"), other),
    }
}
