//! The key layout, `<prefix>/<escaped name>/<client tag>.<number>`, and the numbers a client
//! has in use.

use std::collections::HashSet;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex};

use distlock_core::LockKind;
use distlock_core::backend::{AsciiSet, NON_ALPHANUMERIC, escape_name, unpoisoned as lock};
use tracing::debug;

use crate::backend::BackendState;
use crate::keys;

/// Bytes escaped in a key segment: all but `[A-Za-z0-9._-]`. The result never contains `/`,
/// and the mapping is injective (`%` itself is escaped), so `<prefix>/<escaped name>/` is a key
/// range that holds the keys of exactly one name.
pub(crate) const KEY_SEGMENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'.').remove(b'_').remove(b'-');

/// Escapes a name into key segment form (see [`KEY_SEGMENT`]).
pub(crate) fn escape(s: &str) -> String {
    escape_name(s, KEY_SEGMENT)
}

pub(crate) use distlock_core::backend::unescape_name as unescape;

/// The end of the key range of every key starting with `start` (its last byte incremented;
/// escaped keys are ASCII, so that byte is never 0xFF).
pub(crate) fn range_end(start: &str) -> Vec<u8> {
    let mut end = start.as_bytes().to_vec();
    if let Some(last) = end.last_mut() {
        *last = last.saturating_add(1);
    }
    end
}

/// The key range (a prefix ending in `/`) of one lock name.
pub(crate) fn name_range(prefix: &str, name: &str) -> String {
    format!("{prefix}/{}/", escape(name))
}

/// The name whose key range ([`name_range`]) under `prefix` is `range`.
pub(crate) fn name_of_range(prefix: &str, range: &str) -> Option<String> {
    let escaped = range
        .strip_prefix(prefix)?
        .strip_prefix('/')?
        .strip_suffix('/')?;
    unescape(escaped)
}

/// A queue key's value: the owner, then, if the holder stored data
/// ([`distlock_core::Lease::set_data`]), a NUL and the data (neither an owner nor data may
/// contain a NUL). Written at creation with the owner alone; the data lives and ends with the
/// key.
pub(crate) fn value_with_data(owner: &str, data: Option<&str>) -> Vec<u8> {
    match data {
        Some(data) => format!("{owner}\0{data}").into_bytes(),
        None => owner.as_bytes().to_vec(),
    }
}

/// The owner and data of a queue key's value ([`value_with_data`]).
pub(crate) fn owner_and_data(value: &[u8]) -> (&[u8], Option<&[u8]>) {
    match value.iter().position(|&b| b == 0) {
        Some(at) => (&value[..at], Some(&value[at + 1..])),
        None => (value, None),
    }
}

/// A queue key of one client (`tag`: a random hex tag of the client) on one name, for an
/// acquisition of `kind` (see [`kind_tag`]).
pub(crate) fn entry_key(range: &str, kind: LockKind, tag: &str, number: u32) -> String {
    format!("{range}{}{}.{number}", kind_tag(kind), escape(tag))
}

/// What a queue key says about its kind, right after the name's range: nothing for an
/// exclusive key (`<tag>.<n>`, the tag being hex, so the layout of the mutex is unchanged),
/// `r.` for a shared one and `p<N>.` for a permit of N. So every shared key sorts in
/// `[<range>r, <range>s)` and every other key before `<range>r` ([`non_shared_end`]), and the
/// permits of N have a range of their own ([`permit_range`]): the protocol reads and compares
/// these ranges inside its transactions.
pub(crate) fn kind_tag(kind: LockKind) -> String {
    match kind {
        LockKind::Shared => "r.".to_owned(),
        LockKind::Permit { permits } => format!("p{permits}."),
        _ => String::new(),
    }
}

/// The kind of the queue key `key` of the name range `range` (see [`kind_tag`]); a key that
/// this layout did not write counts as exclusive (it blocks everybody).
pub(crate) fn key_kind(range: &str, key: &[u8]) -> LockKind {
    let rest = key.strip_prefix(range.as_bytes()).unwrap_or(key);
    match rest {
        [b'r', b'.', ..] => LockKind::Shared,
        [b'p', tail @ ..] => {
            let digits = tail.iter().take_while(|b| b.is_ascii_digit()).count();
            let permits = std::str::from_utf8(&tail[..digits])
                .ok()
                .and_then(|d| d.parse().ok());
            match (permits, tail.get(digits)) {
                (Some(permits), Some(b'.')) => LockKind::Permit { permits },
                _ => LockKind::Exclusive,
            }
        }
        _ => LockKind::Exclusive,
    }
}

/// The end of the part of `range` that holds every key but the shared ones (exclusive and
/// permit keys sort before `r`, shared keys after).
pub(crate) fn non_shared_end(range: &str) -> String {
    format!("{range}r")
}

/// The key range of the permit keys of N in `range`: `(start, end)`.
pub(crate) fn permit_range(range: &str, permits: u32) -> (String, Vec<u8>) {
    let start = format!("{range}{}", kind_tag(LockKind::Permit { permits }));
    let end = range_end(&start);
    (start, end)
}

/// How many of a name's queue keys, in create-revision order, hold the lock: an exclusive
/// first key alone; the leading run of shared keys (no writer before them); the leading run
/// of permit keys of the first key's N, at most N of them. The rule every attempt applies to
/// itself, and a mixed queue (two kinds raced on one name) stays safe under it: a key holds
/// only if every key before it is compatible with it.
pub(crate) fn holder_count(kinds: &[LockKind]) -> usize {
    let Some(&first) = kinds.first() else {
        return 0;
    };
    match first {
        LockKind::Shared => kinds.iter().take_while(|k| **k == first).count(),
        LockKind::Permit { permits } => kinds
            .iter()
            .take(usize::try_from(permits).unwrap_or(usize::MAX))
            .take_while(|k| **k == first)
            .count(),
        _ => 1,
    }
}

/// The queue keys of one client: `<range><client tag>.<n>`, with the smallest `n` not in use
/// on that name, so that a client reuses the same few keys. etcd keeps a deleted key in its
/// index until the next compaction, and every read of a name's queue walks all of them: with a
/// fresh key per acquisition (the owner), a busy name slowed down by about 0.5 µs per past
/// acquisition (an S1 cycle went from 1.6 to 3.1 ms in 1750 cycles) until the server compacted.
/// A key is reused only once it is known to be gone (see [`QueueKey`]).
pub(crate) struct KeyPool {
    /// Random, so that no two clients share keys.
    pub(crate) tag: String,
    /// The numbers in use, by the hash of their range: no copy of the name per held lock. Two
    /// ranges whose hashes collide share one set of numbers, which only makes one of them skip
    /// a number (each key still has its own range in it).
    used: StdMutex<HashSet<(u64, u32)>>,
    hasher: RandomState,
}

impl KeyPool {
    pub(crate) fn new() -> Self {
        let tag = uuid::Uuid::new_v4().simple().to_string();
        Self {
            tag: tag[..16].to_owned(),
            used: StdMutex::default(),
            hasher: RandomState::new(),
        }
    }

    fn take(&self, range: &str) -> u32 {
        let hash = self.hasher.hash_one(range);
        let mut used = lock(&self.used);
        let n = (0..)
            .find(|n| !used.contains(&(hash, *n)))
            .unwrap_or(u32::MAX);
        used.insert((hash, n));
        n
    }

    fn give_back(&self, range: &str, n: u32) {
        let hash = self.hasher.hash_one(range);
        lock(&self.used).remove(&(hash, n));
    }
}

/// One queue key of this client: taken from the [`KeyPool`] when an acquisition starts, given
/// back once the key is known to be gone from the server.
pub(crate) struct QueueKey {
    pub(crate) shared: Arc<BackendState>,
    /// The length of the name's key range (its whole queue), the start of `key`.
    range_len: usize,
    pub(crate) number: u32,
    pub(crate) key: String,
    pub(crate) may_exist: AtomicBool,
    pub(crate) returned: AtomicBool,
}

impl QueueKey {
    pub(crate) fn new(shared: &Arc<BackendState>, range: String, kind: LockKind) -> Arc<Self> {
        let number = shared.keys.take(&range);
        Arc::new(Self {
            shared: shared.clone(),
            key: keys::entry_key(&range, kind, &shared.keys.tag, number),
            range_len: range.len(),
            number,
            may_exist: AtomicBool::new(false),
            returned: AtomicBool::new(false),
        })
    }

    /// The name's key range: its whole queue (every queue key starts with it).
    pub(crate) fn range(&self) -> &str {
        self.key.get(..self.range_len).unwrap_or_default()
    }

    pub(crate) fn may_exist(&self) -> bool {
        self.may_exist.load(Ordering::Acquire)
    }

    pub(crate) fn set_may_exist(&self, may: bool) {
        self.may_exist.store(may, Ordering::Release);
    }

    /// The key is gone from the server: its number may serve the next attempt at once.
    pub(crate) fn deleted(&self) {
        self.set_may_exist(false);
        self.give_back();
    }

    fn give_back(&self) {
        if !self.returned.swap(true, Ordering::AcqRel) {
            self.shared.keys.give_back(self.range(), self.number);
        }
    }
}

impl Drop for QueueKey {
    fn drop(&mut self) {
        if self.may_exist() {
            debug!(key = %self.key, "a queue key that may still exist is not reused");
        } else {
            self.give_back();
        }
    }
}

pub(crate) fn key_string(key: &[u8]) -> String {
    String::from_utf8_lossy(key).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_is_injective_and_slash_free() {
        let names = [
            "a/b", "a%2Fb", "a%2fb", "a_b", "", "/", "..", "🔒", "a b", "A",
        ];
        let escaped: Vec<String> = names.iter().map(|n| escape(n)).collect();
        for (i, a) in escaped.iter().enumerate() {
            assert!(!a.contains('/'));
            for b in &escaped[i + 1..] {
                assert_ne!(a, b);
            }
        }
        let (x, xy) = (name_range("p", "x"), name_range("p", "x/y"));
        assert!(!xy.starts_with(&x));
        for name in names {
            assert_eq!(unescape(&escape(name)).as_deref(), Some(name));
            let range = name_range("/pre/fix", name);
            assert_eq!(name_of_range("/pre/fix", &range).as_deref(), Some(name));
        }
        assert_eq!(range_end("p/a"), b"p/b".to_vec());
    }

    #[test]
    fn keys_say_their_kind_and_sort_into_the_kind_ranges() {
        let range = name_range("p", "jobs/x");
        let kinds = [
            LockKind::Exclusive,
            LockKind::Shared,
            LockKind::Permit { permits: 3 },
            LockKind::Permit { permits: 30 },
        ];
        for kind in kinds {
            let key = entry_key(&range, kind, "0123456789abcdef", 7);
            assert_eq!(key_kind(&range, key.as_bytes()), kind, "{key}");
            let shared_part = key.as_str() >= non_shared_end(&range).as_str();
            assert_eq!(shared_part, kind == LockKind::Shared, "{key}");
            let (start, end) = permit_range(&range, 3);
            let in_three = key.as_bytes() >= start.as_bytes() && key.as_bytes() < &end[..];
            assert_eq!(in_three, kind == LockKind::Permit { permits: 3 }, "{key}");
        }
        // The mutex's key layout is unchanged.
        assert_eq!(
            entry_key(&range, LockKind::Exclusive, "ab", 0),
            format!("{range}ab.0")
        );
        assert_eq!(
            key_kind(&range, format!("{range}pX.1").as_bytes()),
            LockKind::Exclusive
        );
        assert_eq!(
            key_kind(&range, format!("{range}p12").as_bytes()),
            LockKind::Exclusive
        );
    }

    #[test]
    fn holders_are_the_compatible_head_of_the_queue() {
        use LockKind::{Exclusive as W, Shared as R};
        let p = |permits| LockKind::Permit { permits };
        assert_eq!(holder_count(&[]), 0);
        assert_eq!(holder_count(&[W, R, R]), 1);
        assert_eq!(holder_count(&[R, R, W, R]), 2);
        assert_eq!(holder_count(&[p(2), p(2), p(2)]), 2);
        assert_eq!(holder_count(&[p(3), p(2), p(3)]), 1);
        assert_eq!(holder_count(&[p(3), W, p(3)]), 1);
        assert_eq!(holder_count(&[R, p(2)]), 1);
    }
}
