//! The key layout: `<prefix>/<escaped name>/<client tag>.<number>`.

/// Percent-escapes every byte outside `[A-Za-z0-9._-]`. The result never contains `/`, and
/// the mapping is injective (`%` itself is escaped), so `<prefix>/<escaped name>/` is a key
/// range that holds the keys of exactly one name.
pub(crate) fn escape(s: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = String::with_capacity(s.len());
    for &b in s.as_bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-') {
            out.push(char::from(b));
        } else {
            out.push('%');
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 0xF)]));
        }
    }
    out
}

/// Reverses [`escape`]; `None` if `s` is not an escaped string.
pub(crate) fn unescape(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

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
