//! The key layout: `<prefix>/<escaped name>/<client tag>.<number>`.

use distlock_core::backend::{AsciiSet, NON_ALPHANUMERIC, escape_name};

/// Bytes escaped in a key segment: all but `[A-Za-z0-9._-]`. The result never contains `/`,
/// and the mapping is injective (`%` itself is escaped), so `<prefix>/<escaped name>/` is a key
/// range that holds the keys of exactly one name.
const KEY_SEGMENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'.').remove(b'_').remove(b'-');

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

/// A queue key of one client (`tag`: a random hex tag of the client) on one name.
pub(crate) fn entry_key(range: &str, tag: &str, number: u32) -> String {
    format!("{range}{}.{number}", escape(tag))
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
        }
        assert_eq!(range_end("p/a"), b"p/b".to_vec());
    }
}
