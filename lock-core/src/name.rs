//! Validated lock names.

use std::fmt;
use std::sync::Arc;

use crate::Error;

/// A validated lock name.
///
/// Any non-empty UTF-8 string of at most [`LockName::MAX_LEN`] bytes without NUL characters is a
/// valid name. Names are compared byte for byte: `Jobs` and `jobs` are different locks. Each
/// backend maps names to its own key space (escaping, hashing) so that two distinct names never
/// collide there.
///
/// Cloning is cheap: the clones share one string, so a guard and its backend's lease keep the
/// name once.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockName(Arc<str>);

impl LockName {
    /// The maximum length of a name in bytes (UTF-8).
    pub const MAX_LEN: usize = 256;

    /// Validates `name`.
    ///
    /// # Errors
    /// [`Error::InvalidName`] when the name is empty, longer than [`LockName::MAX_LEN`] bytes, or
    /// contains a NUL character.
    pub fn new(name: impl Into<String>) -> Result<Self, Error> {
        let name = name.into();
        let reason = if name.is_empty() {
            Some("a lock name must not be empty".to_owned())
        } else if name.len() > Self::MAX_LEN {
            Some(format!(
                "a lock name is at most {} bytes, this one has {}",
                Self::MAX_LEN,
                name.len()
            ))
        } else if name.contains('\0') {
            Some("a lock name must not contain NUL characters".to_owned())
        } else {
            None
        };
        match reason {
            Some(reason) => Err(Error::InvalidName {
                name: preview(&name),
                reason,
            }),
            None => Ok(Self(name.into())),
        }
    }

    /// The name as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A short, printable excerpt of a rejected name for error messages.
fn preview(name: &str) -> String {
    let mut out: String = name.chars().take(64).collect();
    if out.len() < name.len() {
        out.push('…');
    }
    out.replace('\0', "\\0")
}

impl fmt::Debug for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for LockName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl TryFrom<&str> for LockName {
    type Error = Error;
    fn try_from(value: &str) -> Result<Self, Error> {
        Self::new(value)
    }
}

impl TryFrom<String> for LockName {
    type Error = Error;
    fn try_from(value: String) -> Result<Self, Error> {
        Self::new(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_unicode_and_punctuation() {
        for ok in [
            "a",
            "jobs/nightly",
            "🔒 lock",
            "a:b*c%d'e\"f\\g..",
            &"x".repeat(256),
        ] {
            assert_eq!(LockName::new(ok).unwrap().as_str(), ok);
        }
    }

    #[test]
    fn rejects_empty_nul_and_long() {
        for bad in [
            String::new(),
            "a\0b".to_owned(),
            "x".repeat(257),
            "é".repeat(129),
        ] {
            assert!(matches!(LockName::new(bad), Err(Error::InvalidName { .. })));
        }
    }
}
