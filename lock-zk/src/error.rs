//! ZooKeeper client errors as distlock errors.

use distlock_core::Error;
use zookeeper_client as zk;

/// Maps a client library error: answers about nodes are protocol surprises, everything else
/// (connection loss, I/O errors, session trouble, throttling) is a retryable unavailability.
pub(crate) fn zk_error(what: &str, err: zk::Error) -> Error {
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
