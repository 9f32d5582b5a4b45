//! Lock names as KV keys and subjects, and the value an entry stores.
//!
//! A name is one subject token: every byte outside `[A-Za-z0-9_-]` becomes `=XX` (hex, `=`
//! included), so an escaped name never contains `.` and no name's range holds another's keys.
//! An entry of the name is the key `<escaped name>.<tag>`, the tag random per acquisition.

use std::fmt::Write as _;

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
/// and its fencing token; 0 in the creating write, which cannot know its own revision), and
/// the owner. Text: `<kind>\n<first>\n<owner>`, kind `x`, `r` or `p<N>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct EntryValue {
    pub(crate) kind: LockKind,
    pub(crate) first: u64,
    pub(crate) owner: String,
}

impl EntryValue {
    pub(crate) fn encode(&self) -> bytes::Bytes {
        let kind = match self.kind {
            LockKind::Shared => "r".to_owned(),
            LockKind::Permit { permits } => format!("p{permits}"),
            _ => "x".to_owned(),
        };
        bytes::Bytes::from(format!("{kind}\n{}\n{}", self.first, self.owner))
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
        })
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
    fn values_round_trip() {
        for kind in [
            LockKind::Exclusive,
            LockKind::Shared,
            LockKind::Permit { permits: 7 },
        ] {
            let v = EntryValue {
                kind,
                first: 42,
                owner: "o\nwith newline".into(),
            };
            assert_eq!(EntryValue::decode(&v.encode()).unwrap(), v);
        }
        assert!(EntryValue::decode(b"q\n1\no").is_err());
        assert!(EntryValue::decode(b"x\nnope\no").is_err());
        assert!(EntryValue::decode(b"x").is_err());
    }
}
