//! What a lock service keeps on its server for a set of names: [`Footprint`].

use std::fmt;

/// What the server keeps for the lock names that start with a prefix: every object the
/// backend writes for them (keys, rows, nodes, entries), counted by kind, as
/// [`DistributedLock::footprint`](crate::DistributedLock::footprint) reads it. For the
/// operator who wants to know what is left behind by names that are no longer used, and for
/// the growth measurements of `distlock bench --scenario churn`.
///
/// ```
/// use distlock_core::Footprint;
///
/// let footprint = Footprint::new("keys").with("fence", 3).with("lock", 1);
/// assert_eq!(footprint.objects(), 4);
/// assert_eq!(footprint.count("fence"), 3);
/// assert_eq!(footprint.to_string(), "4 keys (fence 3, lock 1)");
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Footprint {
    /// What one object is, plural: `"keys"`, `"rows"`, `"nodes"`, `"entries"`.
    pub unit: &'static str,
    /// The objects by kind (e.g. Redis `("fence", n)`, SQL `("lock rows", n)`), in the
    /// backend's order; a kind may be listed with 0.
    pub parts: Vec<(&'static str, u64)>,
}

impl Footprint {
    /// No objects yet, counted in `unit` (plural, e.g. `"keys"`).
    pub fn new(unit: &'static str) -> Self {
        Self {
            unit,
            parts: Vec::new(),
        }
    }

    /// Adds `count` objects of `kind` (to the count of that kind if it is already listed).
    #[must_use]
    pub fn with(mut self, kind: &'static str, count: u64) -> Self {
        self.add(kind, count);
        self
    }

    /// Adds `count` objects of `kind` (to the count of that kind if it is already listed).
    pub fn add(&mut self, kind: &'static str, count: u64) {
        match self.parts.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, n)) => *n = n.saturating_add(count),
            None => self.parts.push((kind, count)),
        }
    }

    /// Every object, all kinds together.
    pub fn objects(&self) -> u64 {
        self.parts
            .iter()
            .fold(0, |sum, (_, n)| sum.saturating_add(*n))
    }

    /// The objects of `kind` (0 when it is not listed).
    pub fn count(&self, kind: &str) -> u64 {
        self.parts
            .iter()
            .find(|(k, _)| *k == kind)
            .map_or(0, |(_, n)| *n)
    }
}

impl fmt::Display for Footprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.objects(), self.unit)?;
        let mut parts = self.parts.iter().filter(|(_, n)| *n > 0);
        if let Some((kind, n)) = parts.next() {
            write!(f, " ({kind} {n}")?;
            for (kind, n) in parts {
                write!(f, ", {kind} {n}")?;
            }
            f.write_str(")")?;
        }
        Ok(())
    }
}
