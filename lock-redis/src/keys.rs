//! How lock names map to Redis keys and channels.

use std::sync::{Arc, Mutex, PoisonError};

use distlock_core::LockName;

/// The Redis keys and the pub/sub channel of one lock name.
///
/// Every key is `distlock:{<tag>}:<kind>:<name>`, where `<tag>` is the 64-bit FNV-1a hash of
/// the name in hex and `<kind>` one letter. The name is appended verbatim (Redis keys are binary
/// safe), after a fixed-length prefix, so two distinct names always give distinct keys, and the
/// one-letter kind sits before the name, so no name's counter can be another name's lock key.
/// The hash tag puts all keys of one name into the same Redis Cluster slot (the name itself
/// cannot be the tag: it may contain `{` and `}`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockKeys {
    /// The lock itself: a string holding the owner value, with the lease as its TTL.
    pub lock: String,
    /// The fencing counter (`INCR` on every acquisition). Lives as long as the lease plus
    /// `forget_after` ([`RedisConfig::forget_after`](crate::RedisConfig::forget_after)).
    pub fence: String,
    /// Waiters in arrival order (sorted set scored by arrival time).
    pub queue: String,
    /// Waiter liveness (sorted set scored by the server time at which a waiter that stopped
    /// polling is considered dead).
    pub alive: String,
    /// The channel on which releases are published (payload: the owner value of the waiter
    /// served next, or empty).
    pub channel: String,
}

impl LockKeys {
    /// The keys of `name`.
    pub fn new(name: &LockName) -> Self {
        Self::of_name(name.as_str())
    }

    /// The keys of the valid name `name`.
    fn of_name(name: &str) -> Self {
        // Built by hand, not by `format!`: this runs on every acquisition, and five formatted
        // strings cost more client CPU than the rest of an uncontended acquire.
        let mut head = String::with_capacity(HEAD_LEN);
        head.push_str("distlock:{");
        let tag = fnv1a(name.as_bytes());
        for shift in (0..16).rev() {
            let nibble = u32::try_from((tag >> (shift * 4)) & 0xf).unwrap_or_default();
            head.push(char::from_digit(nibble, 16).unwrap_or('0'));
        }
        head.push_str("}:");
        let key = |kind: char| {
            let mut key = String::with_capacity(head.len() + 2 + name.len());
            key.push_str(&head);
            key.push(kind);
            key.push(':');
            key.push_str(name);
            key
        };
        Self {
            lock: key('l'),
            fence: key('f'),
            queue: key('q'),
            alive: key('a'),
            channel: key('c'),
        }
    }

    /// The holders of a shared or permit hold: a sorted set of owner values scored by the
    /// server time (ms) at which each one's lease ends. Made on demand (the exclusive paths
    /// never need it).
    pub fn holders(&self) -> String {
        self.with_kind('h')
    }

    /// The fencing tokens of the shared or permit holders: a hash owner -> token.
    pub fn tokens(&self) -> String {
        self.with_kind('t')
    }

    /// The data stored with the holds (holder data): a hash owner -> data, of every kind
    /// (an exclusive hold has one field at most). Its TTL follows the lock key's: every
    /// script that extends a hold extends it too, and the release scripts delete its field
    /// (or the key) with the hold. Made on demand.
    pub fn data(&self) -> String {
        self.with_kind('d')
    }

    fn with_kind(&self, kind: char) -> String {
        of_kind(&self.lock, kind)
    }

    /// The keys of `name`, validating it first.
    ///
    /// # Errors
    /// [`distlock_core::Error::InvalidName`] for an invalid name.
    pub fn for_name(name: &str) -> distlock_core::Result<Self> {
        Ok(Self::new(&LockName::new(name)?))
    }
}

/// `distlock:{` + 16 hex digits + `}:`.
pub(crate) const HEAD_LEN: usize = 28;

/// Slots of a [`KeysCache`].
const KEYS_CACHE_SLOTS: usize = 32;

/// The keys of the names this backend acquired lately, so that a name taken again and again
/// does not build its five keys anew every time: building them ([`LockKeys::new`]: a hash, six
/// allocations) and dropping them cost about 2,000 instructions, against about 28,000 for a
/// whole uncontended acquire + release on the client. Direct-mapped by the name's hash: a
/// name takes the place of the one in its slot, and a lookup is one uncontended lock, the hash
/// and one comparison.
#[derive(Debug, Default)]
pub(crate) struct KeysCache {
    slots: [Mutex<Option<Arc<LockKeys>>>; KEYS_CACHE_SLOTS],
}

impl KeysCache {
    /// The keys of `name`.
    pub(crate) fn get(&self, name: &LockName) -> Arc<LockKeys> {
        let name = name.as_str();
        let slot =
            usize::try_from(fnv1a(name.as_bytes()) % KEYS_CACHE_SLOTS as u64).unwrap_or_default();
        let mut slot = self.slots[slot]
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // The lock key is a fixed-length head, then `l:` and the name: its tail and length
        // tell the name apart from any other.
        if let Some(keys) = slot.as_ref().filter(|keys| {
            keys.lock.len() == HEAD_LEN + 2 + name.len() && keys.lock.ends_with(name)
        }) {
            return keys.clone();
        }
        let keys = Arc::new(LockKeys::of_name(name));
        *slot = Some(keys.clone());
        keys
    }
}

/// The key of another kind (`h`, `t`, ...) of the name whose lock key is `lock`.
pub(crate) fn of_kind(lock: &str, kind: char) -> String {
    let mut key = String::with_capacity(lock.len());
    key.push_str(lock.get(..HEAD_LEN).unwrap_or_default());
    key.push(kind);
    key.push_str(lock.get(HEAD_LEN + 1..).unwrap_or_default());
    key
}

/// [`LockKeys::queue`] of the name whose lock key is `lock` (the short release's only other
/// key).
pub(crate) fn queue_of(lock: &str) -> String {
    of_kind(lock, 'q')
}

/// The release's keys of the name whose lock key is `lock` (queue, alive, channel, data, fence,
/// holders, tokens), made from it in one allocation: a held lock keeps only its lock key, and
/// rebuilding every key of its name ([`LockKeys::new`]: a hash, six allocations) cost more
/// client CPU than the rest of the release's own work.
#[derive(Debug)]
pub(crate) struct Siblings {
    buf: String,
    /// The length of one key (they all have the lock key's).
    len: usize,
}

impl Siblings {
    /// The kinds, in the order of the accessors below.
    const KINDS: [char; 7] = ['q', 'a', 'c', 'd', 'f', 'h', 't'];

    pub(crate) fn of(lock: &str) -> Self {
        let mut buf = String::with_capacity(lock.len() * Self::KINDS.len());
        for kind in Self::KINDS {
            buf.push_str(lock.get(..HEAD_LEN).unwrap_or_default());
            buf.push(kind);
            buf.push_str(lock.get(HEAD_LEN + 1..).unwrap_or_default());
        }
        Self {
            len: lock.len(),
            buf,
        }
    }

    fn nth(&self, n: usize) -> &str {
        self.buf
            .get(n * self.len..(n + 1) * self.len)
            .unwrap_or_default()
    }

    /// [`LockKeys::queue`].
    pub(crate) fn queue(&self) -> &str {
        self.nth(0)
    }

    /// [`LockKeys::alive`].
    pub(crate) fn alive(&self) -> &str {
        self.nth(1)
    }

    /// [`LockKeys::channel`].
    pub(crate) fn channel(&self) -> &str {
        self.nth(2)
    }

    /// [`LockKeys::data`].
    pub(crate) fn data(&self) -> &str {
        self.nth(3)
    }

    /// [`LockKeys::fence`].
    pub(crate) fn fence(&self) -> &str {
        self.nth(4)
    }

    /// [`LockKeys::holders`].
    pub(crate) fn holders(&self) -> &str {
        self.nth(5)
    }

    /// [`LockKeys::tokens`].
    pub(crate) fn tokens(&self) -> &str {
        self.nth(6)
    }
}

/// A `SCAN MATCH` pattern for the lock keys of every name starting with `prefix`.
pub(crate) fn lock_key_pattern(prefix: &str) -> String {
    let mut pattern = String::with_capacity(HEAD_LEN + 3 + prefix.len() * 2);
    pattern.push_str("distlock:{????????????????}:l:");
    for c in prefix.chars() {
        // Redis glob specials: escaped to match themselves.
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            pattern.push('\\');
        }
        pattern.push(c);
    }
    pattern.push('*');
    pattern
}

/// A `SCAN MATCH` pattern for the keys of every kind of every name starting with `prefix`.
pub(crate) fn any_key_pattern(prefix: &str) -> String {
    let mut pattern = lock_key_pattern(prefix);
    // `...}:l:` becomes `...}:?:`.
    pattern.replace_range(HEAD_LEN..=HEAD_LEN, "?");
    pattern
}

/// What a key of this crate's layout is, by its kind letter (see [`LockKeys`]): `None` for
/// a key this crate did not write (another layout, or a tag that does not match its name).
pub(crate) fn kind_of_key(key: &str) -> Option<&'static str> {
    let tag = key.get(HEAD_LEN..HEAD_LEN + 2)?;
    let kind = match tag {
        "l:" => "lock",
        "f:" => "fence",
        "q:" => "queue",
        "a:" => "alive",
        "h:" => "holders",
        "t:" => "tokens",
        "d:" => "data",
        _ => return None,
    };
    let name = LockName::new(key.get(HEAD_LEN + 2..)?).ok()?;
    (of_kind(&LockKeys::new(&name).lock, tag.chars().next()?) == key).then_some(kind)
}

/// The lock name of a lock key (`distlock:{<tag>}:l:<name>`), if it is one whose tag matches.
pub(crate) fn name_of_lock_key(key: &str) -> Option<LockName> {
    if key.get(HEAD_LEN..HEAD_LEN + 2) != Some("l:") {
        return None;
    }
    let name = LockName::new(key.get(HEAD_LEN + 2..)?).ok()?;
    (LockKeys::new(&name).lock == key).then_some(name)
}

/// 64-bit FNV-1a: stable across processes and versions (unlike `DefaultHasher`).
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in bytes {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distinct_names_give_distinct_keys_and_one_slot_tag() {
        let a = LockKeys::for_name("a/b").unwrap();
        let b = LockKeys::for_name("a%2Fb").unwrap();
        let c = LockKeys::for_name("{tag}").unwrap();
        assert_ne!(a.lock, b.lock);
        assert!(c.lock.starts_with("distlock:{"));
        let tag = |k: &str| k[..k.find('}').unwrap() + 1].to_owned();
        assert_eq!(tag(&c.lock), tag(&c.fence));
        assert_eq!(tag(&c.lock), tag(&c.queue));
        assert_ne!(a.lock, a.fence);
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        let tag = fnv1a(b"a/b");
        assert_eq!(a.lock, format!("distlock:{{{tag:016x}}}:l:a/b"));
        assert_eq!(a.channel, format!("distlock:{{{tag:016x}}}:c:a/b"));
        assert_eq!(a.lock.len(), HEAD_LEN + 2 + "a/b".len());
        assert_eq!(a.holders(), format!("distlock:{{{tag:016x}}}:h:a/b"));
        assert_eq!(a.tokens(), format!("distlock:{{{tag:016x}}}:t:a/b"));
        assert_eq!(a.data(), format!("distlock:{{{tag:016x}}}:d:a/b"));
        assert_eq!(name_of_lock_key(&a.holders()), None);
    }

    #[test]
    fn the_cache_gives_each_name_its_own_keys() {
        let cache = KeysCache::default();
        let name = |n: &str| LockName::new(n).unwrap();
        let first = cache.get(&name("jobs/a"));
        assert!(Arc::ptr_eq(&first, &cache.get(&name("jobs/a"))));
        assert_eq!(*first, LockKeys::for_name("jobs/a").unwrap());
        // Many more names than slots, some sharing one (and one name the tail of another):
        // each gets exactly its own keys, whatever it displaced.
        let names: Vec<String> = (0..200)
            .map(|i| format!("n{i}"))
            .chain(["x/n1".to_owned(), "1".to_owned()])
            .collect();
        for _ in 0..2 {
            for n in &names {
                assert_eq!(*cache.get(&name(n)), LockKeys::for_name(n).unwrap(), "{n}");
            }
        }
    }

    #[test]
    fn siblings_are_the_keys_of_the_same_name() {
        for name in ["a", "jobs/*x", "{tag}:l:q", "ünï/çødé"] {
            let keys = LockKeys::for_name(name).unwrap();
            let siblings = Siblings::of(&keys.lock);
            assert_eq!(siblings.queue(), keys.queue);
            assert_eq!(siblings.alive(), keys.alive);
            assert_eq!(siblings.channel(), keys.channel);
            assert_eq!(siblings.data(), keys.data());
            assert_eq!(siblings.fence(), keys.fence);
            assert_eq!(siblings.holders(), keys.holders());
            assert_eq!(siblings.tokens(), keys.tokens());
            assert_eq!(queue_of(&keys.lock), keys.queue);
        }
    }

    #[test]
    fn lock_keys_parse_back_and_match_the_scan_pattern() {
        let keys = LockKeys::for_name("jobs/*x").unwrap();
        assert_eq!(name_of_lock_key(&keys.lock).unwrap().as_str(), "jobs/*x");
        assert_eq!(name_of_lock_key(&keys.fence), None);
        assert_eq!(name_of_lock_key("distlock:{0000000000000000}:l:x"), None);
        assert_eq!(
            lock_key_pattern("a*b"),
            "distlock:{????????????????}:l:a\\*b*"
        );
        assert_eq!(
            any_key_pattern("a*b"),
            "distlock:{????????????????}:?:a\\*b*"
        );
        assert_eq!(kind_of_key(&keys.lock), Some("lock"));
        assert_eq!(kind_of_key(&keys.fence), Some("fence"));
        assert_eq!(kind_of_key(&keys.queue), Some("queue"));
        assert_eq!(kind_of_key(&keys.tokens()), Some("tokens"));
        assert_eq!(kind_of_key(&keys.data()), Some("data"));
        assert_eq!(kind_of_key("distlock:{0000000000000000}:f:jobs/*x"), None);
        assert_eq!(kind_of_key("distlock:{0000000000000000}:x:"), None);
    }
}
