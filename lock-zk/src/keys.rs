//! Mapping lock names and owners to znode names without collisions, and the data and modes
//! of the nodes.

use std::time::Duration;

use distlock_core::LockKind;
use distlock_core::backend::{AsciiSet, NON_ALPHANUMERIC, escape_name};
use zookeeper_client as zk;

/// Bytes escaped in a znode name segment: all but ASCII letters, digits, `_` and `-`. The
/// mapping is injective, the result never contains `/` or `.` (so it is never `.` or `..`, and
/// `.` can separate fields), and it contains no character ZooKeeper rejects.
const NODE_NAME: &AsciiSet = &NON_ALPHANUMERIC.remove(b'_').remove(b'-');

/// Escapes a name into node name form (see [`NODE_NAME`]).
pub(crate) fn escape(s: &str) -> String {
    escape_name(s, NODE_NAME)
}

pub(crate) use distlock_core::backend::unescape_name as unescape;

/// One queue entry: a child `[<kind>.]<escaped owner>.<sequence>` of a lock node. The kind
/// tag is absent for an exclusive node (the mutex's node name, unchanged), `read` for a shared
/// one and `sem<N>` for a permit of a semaphore of N. Escaped owners never contain `.`, so the
/// tag cannot be confused with an owner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    /// The child's name.
    pub(crate) name: String,
    /// Its sequence number (the queue position).
    pub(crate) seq: i64,
    /// What it asks for (or holds).
    pub(crate) kind: LockKind,
}

/// The tag of a shared (reader's) node.
const READ_TAG: &str = "read";
/// The tag of a permit node, followed by the semaphore's size.
const PERMIT_TAG: &str = "sem";

/// The name of a node of `kind` for the escaped owner `owner`, up to its sequence number.
pub(crate) fn node_prefix(kind: LockKind, owner: &str) -> String {
    match kind {
        LockKind::Shared => format!("{READ_TAG}.{owner}."),
        LockKind::Permit { permits } => format!("{PERMIT_TAG}{permits}.{owner}."),
        _ => format!("{owner}."),
    }
}

/// The kind a node name's tag says; `None` for a tag this crate did not write.
fn parse_tag(tag: &str) -> Option<LockKind> {
    if tag == READ_TAG {
        return Some(LockKind::Shared);
    }
    let digits = tag.strip_prefix(PERMIT_TAG)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let permits: u32 = digits.parse().ok()?;
    (permits > 0).then_some(LockKind::Permit { permits })
}

impl Entry {
    /// Parses a child name; `None` for a node this crate did not create.
    pub(crate) fn parse(name: String) -> Option<Self> {
        let (rest, digits) = name.rsplit_once('.')?;
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let kind = match rest.split_once('.') {
            None => LockKind::Exclusive,
            Some((tag, owner)) if !owner.contains('.') => parse_tag(tag)?,
            Some(_) => return None,
        };
        let seq = digits.parse().ok()?;
        Some(Self { name, seq, kind })
    }

    /// The escaped owner part (between the kind tag and the last `.`).
    pub(crate) fn owner_part(&self) -> &str {
        let rest = self.name.rsplit_once('.').map_or("", |(rest, _)| rest);
        rest.split_once('.').map_or(rest, |(_, owner)| owner)
    }
}

/// The children of a lock node in queue order (lowest sequence first); foreign nodes dropped.
pub(crate) fn queue(children: Vec<String>) -> Vec<Entry> {
    let mut entries: Vec<Entry> = children.into_iter().filter_map(Entry::parse).collect();
    entries.sort_by_key(|e| e.seq);
    entries
}

/// Node data of a node that holds (or is about to hold) the lock: `H<ttl in ms>`. Its lease runs
/// from the node's `mtime` for that many milliseconds, on the server's clock.
pub(crate) fn held_data(ttl: Duration) -> Vec<u8> {
    format!("H{}", ttl.as_millis()).into_bytes()
}

/// Node data of a holder that stored data ([`distlock_core::Lease::set_data`]): the mark of
/// [`held_data`], a NUL, the data (which has no NUL). Renewals write it again as it is.
pub(crate) fn held_data_with(ttl: Duration, data: Option<&str>) -> Vec<u8> {
    let mut bytes = held_data(ttl);
    if let Some(data) = data {
        bytes.push(0);
        bytes.extend_from_slice(data.as_bytes());
    }
    bytes
}

/// The holder's data in a node's data ([`held_data_with`]), if any.
pub(crate) fn holder_data_of(node: &[u8]) -> Option<String> {
    let at = node.iter().position(|&b| b == 0)?;
    Some(String::from_utf8_lossy(&node[at + 1..]).into_owned())
}

/// Node data of a waiter: `W<ttl in ms>`. A waiter refreshes its node every third of the ttl
/// while it waits, so its lease, like a holder's, runs from the node's `mtime`; the waiter
/// behind it removes the node once that lease ran out (a killed or paused process).
pub(crate) fn waiting_data(ttl: Duration) -> Vec<u8> {
    format!("W{}", ttl.as_millis()).into_bytes()
}

/// What a queue node's data says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mark {
    /// It holds the lock (or is about to): lease in ms.
    Held(i64),
    /// It waits, with a lease in ms, or with none (a node written by a version of this crate
    /// before waiters had leases: it lives as long as its session).
    Waiting(Option<i64>),
}

impl Mark {
    /// Parses node data (up to a holder's data, see [`held_data_with`]); `None` for data this
    /// crate did not write.
    pub(crate) fn parse(data: &[u8]) -> Option<Self> {
        let data = data.split(|&b| b == 0).next().unwrap_or(data);
        let ms = |digits: &[u8]| -> Option<i64> {
            if !digits.iter().all(u8::is_ascii_digit) {
                return None;
            }
            let ms: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
            i64::try_from(ms).ok()
        };
        match data.split_first()? {
            (b'H', digits) => ms(digits).map(Self::Held),
            (b'W', []) => Some(Self::Waiting(None)),
            (b'W', digits) => ms(digits).map(|ttl| Self::Waiting(Some(ttl))),
            _ => None,
        }
    }

    /// The node's lease in ms, running from its `mtime`, if it has one.
    pub(crate) fn lease_ms(self) -> Option<i64> {
        match self {
            Self::Held(ttl) | Self::Waiting(Some(ttl)) => Some(ttl),
            Self::Waiting(None) => None,
        }
    }
}

/// A queue node, with the ACL of [`crate::acl::node_acls`].
pub(crate) const fn ephemeral_sequential(acls: zk::Acls<'static>) -> zk::CreateOptions<'static> {
    zk::CreateMode::EphemeralSequential.with_acls(acls)
}

/// A lock node (removed by the server once empty).
pub(crate) const fn container(acls: zk::Acls<'static>) -> zk::CreateOptions<'static> {
    zk::CreateMode::Container.with_acls(acls)
}

/// The base node, the chroot and its missing ancestors.
pub(crate) const fn persistent(acls: zk::Acls<'static>) -> zk::CreateOptions<'static> {
    zk::CreateMode::Persistent.with_acls(acls)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_is_injective_and_path_safe() {
        let names = [
            "", "/", "/x", "x", "X", "a/b", "a%2Fb", "a%2fb", "a_b", "a:b", "a*b", "a%b", "a'b",
            "a\"b", "a\\b", "..", ".", "/..", "a b", " a", "a ", "🔒", "{tag}", "é", "e\u{301}",
            "\t",
        ];
        let mut seen = std::collections::HashSet::new();
        for name in names {
            let e = escape(name);
            assert!(!e.contains('/') && !e.contains('.'), "{e}");
            assert!(e.bytes().all(|b| b.is_ascii_graphic()), "{e}");
            assert_eq!(unescape(&e).as_deref(), Some(name));
            assert!(seen.insert(e), "{name:?} collides");
        }
    }

    #[test]
    fn queue_orders_by_sequence_and_skips_foreign_nodes() {
        let q = queue(vec![
            "b.0000000010".into(),
            "foreign".into(),
            "a.0000000002".into(),
            "c.".into(),
        ]);
        assert_eq!(q.iter().map(|e| e.seq).collect::<Vec<_>>(), [2, 10]);
        assert_eq!(q[0].owner_part(), "a");
    }

    #[test]
    fn kinds_are_tagged_in_node_names_and_parsed_back() {
        let kinds = [
            LockKind::Exclusive,
            LockKind::Shared,
            LockKind::Permit { permits: 1 },
            LockKind::Permit { permits: 256 },
        ];
        for kind in kinds {
            let name = format!("{}0000000042", node_prefix(kind, "ab%2Fc"));
            let entry = Entry::parse(name).expect("parses");
            assert_eq!((entry.kind, entry.seq), (kind, 42));
            assert_eq!(entry.owner_part(), "ab%2Fc");
        }
        // An owner that looks like a tag is still an exclusive node's owner.
        let entry = Entry::parse("read.0000000001".into()).unwrap();
        assert_eq!(
            (entry.kind, entry.owner_part()),
            (LockKind::Exclusive, "read")
        );
        for foreign in [
            "sem0.a.0000000001",
            "semx.a.0000000001",
            "write.a.0000000001",
            "a.b.c.0000000001",
            "sem.a.0000000001",
        ] {
            assert_eq!(Entry::parse(foreign.into()), None, "{foreign}");
        }
    }

    #[test]
    fn marks_round_trip_and_old_waiters_have_no_lease() {
        let ttl = Duration::from_millis(2500);
        assert_eq!(Mark::parse(&held_data(ttl)), Some(Mark::Held(2500)));
        assert_eq!(
            Mark::parse(&waiting_data(ttl)),
            Some(Mark::Waiting(Some(2500)))
        );
        assert_eq!(Mark::parse(b"W"), Some(Mark::Waiting(None)));
        assert_eq!(Mark::parse(b"W").and_then(Mark::lease_ms), None);
        assert_eq!(
            Mark::parse(&waiting_data(ttl)).and_then(Mark::lease_ms),
            Some(2500)
        );
        assert_eq!(Mark::parse(&held_data(ttl)), Some(Mark::Held(2500)));
        for foreign in [&b""[..], b"H", b"Hx", b"W-", b"W-5", b"H+5", b"X10", b"w10"] {
            assert_eq!(Mark::parse(foreign), None, "{foreign:?}");
        }
    }
}
