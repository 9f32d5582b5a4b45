//! Which primitive a run drives, and how its workers deliberately break it in a self-test.

use distlock_core::Capabilities;
use serde::{Deserialize, Serialize};

/// The primitive the workers of a run drive; the checker applies that primitive's rules.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum CheckKind {
    /// The mutex: one holder at a time.
    #[default]
    Exclusive,
    /// The read side of a read-write lock only: every worker a reader.
    Shared,
    /// A semaphore of this many permits.
    Permits(u32),
    /// A read-write lock with readers and writers: one acquisition in three is a writer.
    RwMix,
    /// Leader election: workers campaign, and each watches the leader with `observe`.
    Election,
    /// Multi-locks: each acquisition takes two of three names with `acquire_all`.
    Multi,
    /// The upgradeable read-write lock ([`UpgradeableRwLock`](distlock_core::UpgradeableRwLock)):
    /// of every four acquisitions, one is a writer that downgrades to a reader halfway, one
    /// the upgradeable reader that upgrades to the writer halfway, two plain readers.
    Upgradeable,
}

/// The number of lock names of a [`CheckKind::Multi`] run.
pub const MULTI_LOCKS: u32 = 3;

impl CheckKind {
    /// The semaphore size of the default `permits` kind.
    pub const DEFAULT_PERMITS: u32 = 2;

    /// The name used on the command line and in reports (`permits:2`).
    pub fn label(self) -> String {
        match self {
            Self::Exclusive => "exclusive".into(),
            Self::Shared => "shared".into(),
            Self::Permits(n) => format!("permits:{n}"),
            Self::RwMix => "rw-mix".into(),
            Self::Election => "election".into(),
            Self::Multi => "multi".into(),
            Self::Upgradeable => "upgradeable".into(),
        }
    }

    /// Every kind `caps` supports, in report order: the default of `distlock check`.
    pub fn supported(caps: &Capabilities) -> Vec<Self> {
        let mut kinds = vec![Self::Exclusive];
        if caps.shared {
            kinds.extend([Self::Shared, Self::RwMix, Self::Upgradeable]);
        }
        if caps.max_permits >= 1 {
            kinds.push(Self::Permits(Self::DEFAULT_PERMITS.min(caps.max_permits)));
        }
        kinds.extend([Self::Election, Self::Multi]);
        kinds
    }

    /// Why `caps` cannot run this kind, if it cannot.
    pub fn unsupported(self, caps: &Capabilities) -> Option<String> {
        match self {
            Self::Shared | Self::RwMix | Self::Upgradeable if !caps.shared => {
                Some("it has no read-write locks (no shared holds)".into())
            }
            Self::Permits(_) if caps.max_permits == 0 => Some("it has no semaphores".into()),
            Self::Permits(n) if n > caps.max_permits => Some(format!(
                "its semaphores have at most {} permits",
                caps.max_permits
            )),
            _ => None,
        }
    }

    /// How many holders may believe they hold one name at once.
    pub fn capacity(self) -> u32 {
        match self {
            Self::Permits(n) => n,
            // Readers: any number (bounded by the workers); the checker counts modes.
            Self::Shared | Self::RwMix | Self::Upgradeable => u32::MAX,
            Self::Exclusive | Self::Election | Self::Multi => 1,
        }
    }

    /// The mode of acquisition `seq` of worker `worker`.
    pub fn mode(self, worker: u32, seq: u64) -> Mode {
        match self {
            Self::Exclusive | Self::Election | Self::Multi => Mode::Exclusive,
            Self::Shared => Mode::Shared,
            Self::Permits(_) => Mode::Permit,
            Self::RwMix if (u64::from(worker) + seq).is_multiple_of(3) => Mode::Exclusive,
            Self::RwMix => Mode::Shared,
            Self::Upgradeable => match (u64::from(worker) + seq) % 4 {
                0 => Mode::Exclusive,
                1 => Mode::Upgradeable,
                _ => Mode::Shared,
            },
        }
    }

    /// The lock indexes acquisition `seq` of worker `worker` asks for (multi: two of
    /// [`MULTI_LOCKS`], which two rotating; every other kind: lock 0).
    pub fn locks(self, worker: u32, seq: u64) -> Vec<u32> {
        match self {
            Self::Multi => {
                let left_out =
                    u32::try_from((u64::from(worker) + seq) % u64::from(MULTI_LOCKS)).unwrap_or(0);
                (0..MULTI_LOCKS).filter(|&i| i != left_out).collect()
            }
            _ => vec![0],
        }
    }

    /// The name of lock `index` of a run on `name`.
    pub fn lock_name(self, name: &str, index: u32) -> String {
        match self {
            Self::Multi => format!("{name}/{index}"),
            _ => name.to_owned(),
        }
    }
}

impl std::fmt::Display for CheckKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.label())
    }
}

impl From<CheckKind> for String {
    fn from(kind: CheckKind) -> Self {
        kind.label()
    }
}

impl TryFrom<String> for CheckKind {
    type Error = String;

    fn try_from(text: String) -> Result<Self, String> {
        text.parse()
    }
}

impl std::str::FromStr for CheckKind {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        Ok(match text.trim() {
            "exclusive" | "mutex" => Self::Exclusive,
            "shared" => Self::Shared,
            "rw-mix" => Self::RwMix,
            "election" => Self::Election,
            "multi" => Self::Multi,
            "upgradeable" => Self::Upgradeable,
            "permits" => Self::Permits(Self::DEFAULT_PERMITS),
            other => match other.strip_prefix("permits:").map(str::parse::<u32>) {
                Some(Ok(n)) if n >= 1 => Self::Permits(n),
                Some(_) => {
                    return Err(format!(
                        "bad kind {other:?}: permits:N needs a whole number N of at least 1"
                    ));
                }
                None => {
                    return Err(format!(
                        "unknown kind {other:?} (expected exclusive, shared, permits:N, rw-mix, \
                         upgradeable, election or multi)"
                    ));
                }
            },
        })
    }
}

/// What one acquisition asked for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// The whole lock (a mutex holder, a writer, a leader, a multi-lock).
    #[default]
    Exclusive,
    /// A reader.
    Shared,
    /// One permit of a semaphore.
    Permit,
    /// The upgradeable reader: reads beside plain readers, excludes writers and other
    /// upgradeable readers.
    Upgradeable,
}

impl Mode {
    /// Whether this mode was the default (for compact JSON).
    pub fn is_exclusive(&self) -> bool {
        *self == Self::Exclusive
    }
}

/// A deliberate bug in the workers, so that a self-test can show the checker finds what it
/// must (each names the rule it should trip). Never for a real check.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Sabotage {
    /// Holders skip their validity check (it always passes) and do not renew: they keep
    /// working after their lease ran out (trips `stale-check` and `overlap`).
    IgnoreValidity,
    /// Semaphore workers ask for one permit more than the run judges (trips `overlap`).
    ExtraPermit,
    /// Writers of a read-write run acquire as readers (trips `overlap`).
    WriterAsReader,
    /// Multi-lock workers take only the first name of their set (trips `all-or-none`).
    PartialMulti,
    /// Workers acquire without the run's lock-delay, as a backend that ignored it would
    /// (trips `lock-delay` once a crash leaves a hold behind).
    IgnoreLockDelay,
    /// Upgradeable readers upgrade by letting go of everything and asking for the write
    /// lock anew, so a waiting writer gets in between (trips `no-writer-between`).
    UpgradeByRelease,
}

impl Sabotage {
    /// Every sabotage, in a fixed order.
    pub const ALL: [Self; 6] = [
        Self::IgnoreValidity,
        Self::ExtraPermit,
        Self::WriterAsReader,
        Self::PartialMulti,
        Self::IgnoreLockDelay,
        Self::UpgradeByRelease,
    ];

    /// The name used on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::IgnoreValidity => "ignore-validity",
            Self::ExtraPermit => "extra-permit",
            Self::WriterAsReader => "writer-as-reader",
            Self::PartialMulti => "partial-multi",
            Self::IgnoreLockDelay => "ignore-lock-delay",
            Self::UpgradeByRelease => "upgrade-by-release",
        }
    }
}

impl std::str::FromStr for Sabotage {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|s| s.as_str() == text.trim())
            .ok_or_else(|| {
                format!(
                    "unknown sabotage {text:?} (expected one of: {})",
                    Self::ALL.map(Self::as_str).join(", ")
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use distlock_core::FencingGuarantee;

    #[test]
    fn kinds_parse_and_print_alike() {
        for kind in [
            CheckKind::Exclusive,
            CheckKind::Shared,
            CheckKind::Permits(3),
            CheckKind::RwMix,
            CheckKind::Election,
            CheckKind::Multi,
        ] {
            assert_eq!(kind.label().parse::<CheckKind>(), Ok(kind));
            let json = serde_json::to_string(&kind).expect("encodes");
            assert_eq!(
                serde_json::from_str::<CheckKind>(&json).expect("decodes"),
                kind
            );
        }
        assert_eq!("permits".parse(), Ok(CheckKind::Permits(2)));
        for bad in ["permits:0", "permits:x", "permits:-1", "lock", ""] {
            assert!(bad.parse::<CheckKind>().is_err(), "{bad}");
        }
    }

    #[test]
    fn the_default_follows_the_capabilities() {
        let plain = Capabilities::new(FencingGuarantee::Linearizable);
        assert_eq!(
            CheckKind::supported(&plain),
            [CheckKind::Exclusive, CheckKind::Election, CheckKind::Multi]
        );
        let full = plain.clone().with_shared(true).with_max_permits(1);
        assert_eq!(
            CheckKind::supported(&full),
            [
                CheckKind::Exclusive,
                CheckKind::Shared,
                CheckKind::RwMix,
                CheckKind::Upgradeable,
                CheckKind::Permits(1),
                CheckKind::Election,
                CheckKind::Multi
            ]
        );
        assert!(CheckKind::Permits(2).unsupported(&full).is_some());
        assert!(CheckKind::RwMix.unsupported(&plain).is_some());
        assert!(CheckKind::Multi.unsupported(&plain).is_none());
    }

    #[test]
    fn multi_sets_rotate_over_two_of_three_names() {
        let sets: Vec<_> = (0..3).map(|seq| CheckKind::Multi.locks(0, seq)).collect();
        assert_eq!(sets, [vec![1, 2], vec![0, 2], vec![0, 1]]);
        assert_eq!(CheckKind::Multi.lock_name("n", 2), "n/2");
        assert_eq!(CheckKind::RwMix.lock_name("n", 0), "n");
        let writers = (0..30)
            .filter(|&seq| CheckKind::RwMix.mode(1, seq) == Mode::Exclusive)
            .count();
        assert_eq!(writers, 10);
    }
}
