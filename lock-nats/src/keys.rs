//! Lock names as KV keys and subjects, and the value an entry stores.
//!
//! A name is one subject token: every byte outside `[A-Za-z0-9_-]` becomes `=XX` (hex, `=`
//! included), so an escaped name never contains `.` and no name's range holds another's keys.
//! An entry of the name is the key `<escaped name>.<tag>`, the tag random per acquisition.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use distlock_core::{LockKind, Result};

/// The subjects of one lock name in a bucket.
#[derive(Clone, Debug)]
pub(crate) struct NameKeys {
    /// `$KV.<bucket>.<escaped>.`: an entry's subject is this and its tag.
    pub(crate) prefix: String,
    /// `$KV.<bucket>.<escaped>.>`: every entry of the name.
    pub(crate) range: String,
    /// `<events>.<escaped>.>`: where the server republishes what is stored in the range.
    pub(crate) events: String,
}

impl NameKeys {
    pub(crate) fn new(bucket: &Bucket, name: &str) -> Self {
        let escaped = escape(name);
        let prefix = format!("{}{escaped}.", bucket.kv_prefix);
        Self {
            range: format!("{prefix}>"),
            events: format!("{}{escaped}.>", bucket.events_prefix),
            prefix,
        }
    }

    /// The subject of the entry `tag`.
    pub(crate) fn entry(&self, tag: &str) -> String {
        format!("{}{tag}", self.prefix)
    }
}

/// The subjects of a bucket.
#[derive(Clone, Debug)]
pub(crate) struct Bucket {
    /// The bucket's name.
    pub(crate) name: String,
    /// `KV_<bucket>`: its stream.
    pub(crate) stream: String,
    /// `$KV.<bucket>.`
    pub(crate) kv_prefix: String,
    /// `_distlock.<bucket>.`: the republished events.
    pub(crate) events_prefix: String,
}

impl Bucket {
    pub(crate) fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            stream: format!("KV_{name}"),
            kv_prefix: format!("$KV.{name}."),
            events_prefix: format!("_distlock.{name}."),
        }
    }

    /// The name whose entry `subject` is, if it is one of this bucket's entries.
    pub(crate) fn name_of(&self, subject: &str) -> Option<String> {
        let rest = subject.strip_prefix(&self.kv_prefix)?;
        let (escaped, _tag) = rest.split_once('.')?;
        unescape(escaped)
    }
}

/// Whether `c` is kept as it is in an escaped name.
fn plain(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b'-'
}

/// The name as one subject token.
pub(crate) fn escape(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for &b in name.as_bytes() {
        if plain(b) {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "={b:02X}");
        }
    }
    out
}

/// The name an escaped token came from (`None` if it is not one [`escape`] makes).
pub(crate) fn unescape(token: &str) -> Option<String> {
    let bytes = token.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'=' {
            let hex = token.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else if plain(bytes[i]) {
            out.push(bytes[i]);
            i += 1;
        } else {
            return None;
        }
    }
    String::from_utf8(out).ok()
}

/// What an entry stores: its kind, the revision it was created at (its place in the queue
/// and its fencing token; 0 in the creating write, which cannot know its own revision), the
/// owner and the holder's data, if any ([`distlock_core::Lease::set_data`]). Text:
/// `<kind>\n<first>\n<owner>[\0<data>]`, kind `x`, `r` or `p<N>` (neither an owner nor data
/// contains a NUL).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct EntryValue {
    pub(crate) kind: LockKind,
    pub(crate) first: u64,
    pub(crate) owner: String,
    pub(crate) data: Option<String>,
}

impl EntryValue {
    pub(crate) fn encode(&self) -> bytes::Bytes {
        let kind = match self.kind {
            LockKind::Shared => "r".to_owned(),
            LockKind::Permit { permits } => format!("p{permits}"),
            _ => "x".to_owned(),
        };
        let text = format!("{kind}\n{}\n{}", self.first, self.owner);
        bytes::Bytes::from(match &self.data {
            Some(data) => format!("{text}\0{data}"),
            None => text,
        })
    }

    /// The value of `payload`; an entry this backend did not write is an error.
    pub(crate) fn decode(payload: &[u8]) -> Result<Self> {
        let bad = || {
            crate::error::backend_msg("a KV entry in a lock's range that distlock did not write")
        };
        let text = std::str::from_utf8(payload).map_err(|_| bad())?;
        let mut parts = text.splitn(3, '\n');
        let (kind, first, owner) = match (parts.next(), parts.next(), parts.next()) {
            (Some(k), Some(f), Some(o)) => (k, f, o),
            _ => return Err(bad()),
        };
        let (owner, data) = match owner.split_once('\0') {
            Some((owner, data)) => (owner, Some(data.to_owned())),
            None => (owner, None),
        };
        let kind = match kind {
            "x" => LockKind::Exclusive,
            "r" => LockKind::Shared,
            p => LockKind::Permit {
                permits: p
                    .strip_prefix('p')
                    .and_then(|n| n.parse().ok())
                    .ok_or_else(bad)?,
            },
        };
        Ok(Self {
            kind,
            first: first.parse().map_err(|_| bad())?,
            owner: owner.to_owned(),
            data,
        })
    }
}

/// The key a client reuses per name: every release leaves a purge marker on its key (for
/// the waiters' wake-up) that lives for a second, and a new key per acquisition made a name
/// acquired in a loop collect a marker per acquisition, each one more request of every queue
/// read (a cycle took 0.5 ms, then 1.6 ms after 8 cycles, 13 ms in a bench). A client's first
/// attempt on a name takes the name's key of the client (`<name>.<client tag>`), whose
/// marker the next acquisition overwrites (the bucket keeps one message per key); further
/// attempts of the client on the name at the same time take random tags.
#[derive(Debug, Default)]
pub(crate) struct Slots {
    inner: Mutex<SlotState>,
}

#[derive(Debug, Default)]
struct SlotState {
    /// Names whose client key an attempt or lease of this client uses.
    in_use: HashSet<String>,
    /// Names whose client key this client released lately: the marker's revision, when, and
    /// whether the range had no other live entry then (see [`Slot::clean`]).
    released: HashMap<String, (u64, Instant, bool)>,
}

/// How long a released key's marker revision is worth remembering: less than the marker's
/// life, after which the key has no message and a create expects revision 0.
const MARKER_MEMORY: Duration = Duration::from_millis(800);

/// The key an attempt writes: its subject, and what its first create expects there.
#[derive(Debug)]
pub(crate) struct Slot {
    pub(crate) subject: String,
    /// The revision the subject is believed to have (a marker), or 0.
    pub(crate) expected: u64,
    /// The marker was the last message of the name's range when it was written, and the
    /// range had no other live entry (the release was a compare-and-set on the whole range,
    /// by a lease whose every write had been one): if the range's last revision is still the
    /// marker's, the name is free, and one write expecting that takes it.
    pub(crate) clean: bool,
    /// Set for the client's key of the name: frees it when the attempt or its lease ends.
    hold: Option<Arc<SlotHold>>,
}

/// The use of a client key; freed on drop.
#[derive(Debug)]
pub(crate) struct SlotHold {
    slots: Arc<Slots>,
    name: String,
}

impl Drop for SlotHold {
    fn drop(&mut self) {
        let mut state = self
            .slots
            .inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        state.in_use.remove(&self.name);
    }
}

impl Slots {
    /// The key for a new attempt on `name` (escaped: `keys`) by the client tagged `tag`.
    pub(crate) fn take(self: &Arc<Self>, keys: &NameKeys, name: &str, tag: &str) -> Slot {
        let mut state = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        if !state.in_use.insert(name.to_owned()) {
            return Slot {
                subject: keys.entry(&new_tag()),
                expected: 0,
                clean: false,
                hold: None,
            };
        }
        let (expected, clean) = state
            .released
            .remove(name)
            .filter(|(_, at, _)| at.elapsed() < MARKER_MEMORY)
            .map_or((0, false), |(rev, _, clean)| (rev, clean));
        Slot {
            subject: keys.entry(tag),
            expected,
            clean,
            hold: Some(Arc::new(SlotHold {
                slots: self.clone(),
                name: name.to_owned(),
            })),
        }
    }

    /// `name`'s client key was purged at `marker` (`clean`: see [`Slot::clean`]).
    pub(crate) fn released(&self, name: &str, marker: u64, clean: bool) {
        let mut state = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        if state.released.len() >= 1024 {
            state
                .released
                .retain(|_, (_, at, _)| at.elapsed() < MARKER_MEMORY);
        }
        state
            .released
            .insert(name.to_owned(), (marker, Instant::now(), clean));
    }
}

impl Slot {
    /// Gives up the client key (its key still holds another lease's entry): a random tag.
    pub(crate) fn fresh(&mut self, keys: &NameKeys) {
        self.subject = keys.entry(&new_tag());
        self.expected = 0;
        self.clean = false;
        self.hold = None;
    }

    /// Whether this is the client's key of the name (whose release is remembered).
    pub(crate) fn hold(&self) -> Option<Arc<SlotHold>> {
        self.hold.clone()
    }
}

/// A random tag for one acquisition's key.
pub(crate) fn new_tag() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_round_trips_and_keeps_one_token() {
        for name in ["jobs", "a.b", "a b/c=d", "ünï", "x>y*z", "-_"] {
            let e = escape(name);
            assert!(!e.contains('.') && !e.contains('>') && !e.contains('*') && !e.contains(' '));
            assert_eq!(unescape(&e).as_deref(), Some(name));
        }
        assert_eq!(escape("a.b"), "a=2Eb");
        assert_eq!(unescape("a=2"), None);
        assert_eq!(unescape("a.b"), None);
    }

    #[test]
    fn names_of_entries() {
        let b = Bucket::new("locks");
        let k = NameKeys::new(&b, "a.b");
        assert_eq!(k.range, "$KV.locks.a=2Eb.>");
        assert_eq!(k.events, "_distlock.locks.a=2Eb.>");
        assert_eq!(b.name_of(&k.entry("t1")).as_deref(), Some("a.b"));
        assert_eq!(b.name_of("$KV.other.a.t"), None);
    }

    #[test]
    fn a_client_reuses_its_key_of_a_name_when_free() {
        let slots = Arc::new(Slots::default());
        let keys = NameKeys::new(&Bucket::new("b"), "n");
        let a = slots.take(&keys, "n", "me");
        assert_eq!(a.subject, "$KV.b.n.me");
        let b = slots.take(&keys, "n", "me");
        assert_ne!(
            b.subject, a.subject,
            "a second attempt at once gets a tag of its own"
        );
        slots.released("n", 42, true);
        drop(a);
        let c = slots.take(&keys, "n", "me");
        assert_eq!(
            (c.subject.as_str(), c.expected, c.clean),
            ("$KV.b.n.me", 42, true)
        );
    }

    #[test]
    fn values_round_trip() {
        for kind in [
            LockKind::Exclusive,
            LockKind::Shared,
            LockKind::Permit { permits: 7 },
        ] {
            let mut v = EntryValue {
                kind,
                first: 42,
                owner: "o\nwith newline".into(),
                data: None,
            };
            assert_eq!(EntryValue::decode(&v.encode()).unwrap(), v);
            v.data = Some("host=h pid=1\ncmd=x".into());
            assert_eq!(EntryValue::decode(&v.encode()).unwrap(), v);
        }
        assert!(EntryValue::decode(b"q\n1\no").is_err());
        assert!(EntryValue::decode(b"x\nnope\no").is_err());
        assert!(EntryValue::decode(b"x").is_err());
    }
}
