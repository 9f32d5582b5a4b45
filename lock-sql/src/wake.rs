//! What wakes a waiter: PostgreSQL's LISTEN/NOTIFY (one listening connection per backend),
//! MySQL/MariaDB's user-level locks (a [`ServerWait`] of the waiter at the head of the queue on
//! the holder's wake lock), or polling.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::watch;

/// Per-name wake-ups fed by a notification listener. A wake-up may target one waiter (the
/// holder of the reservation): then only that waiter's task wakes, so a release neither
/// stampedes the waiters nor wakes any but the next one.
#[derive(Debug, Default)]
pub(crate) struct Notifier {
    /// Name, then owner (unique per attempt), to the attempt's wake-ups.
    names: Mutex<Names>,
}

/// What the last wake-up said to one waiter. A send always wakes the receiver, equal value
/// or not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wake {
    /// Something changed on the name: look again.
    Changed,
    /// A release addressed to this waiter (it holds the reservation): take without reading.
    Released,
    /// The release handed the lock to this waiter, with this version: it holds it already.
    Handed(i64),
    /// The release handed the lock to another waiter, whose reservation it used up: claim
    /// the reservation (no need to read first).
    Vacant,
}

pub(crate) type Names = HashMap<String, HashMap<String, watch::Sender<Wake>>>;

#[cfg_attr(
    not(feature = "postgres"),
    allow(dead_code, reason = "LISTEN/NOTIFY is PostgreSQL's")
)]
impl Notifier {
    fn names(&self) -> std::sync::MutexGuard<'_, Names> {
        self.names.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn subscribe(self: &Arc<Self>, name: &str, owner: &str) -> Subscription {
        let rx = self
            .names()
            .entry(name.to_owned())
            .or_default()
            .entry(owner.to_owned())
            .or_insert_with(|| watch::Sender::new(Wake::Changed))
            .subscribe();
        Subscription {
            rx,
            notifier: self.clone(),
            name: name.to_owned(),
            owner: owner.to_owned(),
        }
    }

    /// Wakes the waiters of `name` as `note` says: a release wakes only its target (if it
    /// waits here), a hand-over its target and every other waiter (whose turn to reserve it
    /// is), anything else every waiter.
    pub(crate) fn wake(&self, name: &str, note: Note<'_>) {
        let names = self.names();
        let Some(owners) = names.get(name) else {
            return;
        };
        match note {
            Note::Changed => owners.values().for_each(wake_one),
            Note::Released(target) => {
                if let Some(tx) = owners.get(target) {
                    tx.send_replace(Wake::Released);
                }
            }
            Note::Handed(target, version) => {
                for (owner, tx) in owners {
                    let wake = if owner == target {
                        Wake::Handed(version)
                    } else {
                        Wake::Vacant
                    };
                    tx.send_replace(wake);
                }
            }
        }
    }

    /// After a listener reconnect, events may have been missed: wake everyone.
    pub(crate) fn wake_all(&self) {
        self.names()
            .values()
            .flat_map(HashMap::values)
            .for_each(wake_one);
    }
}

pub(crate) fn wake_one(tx: &watch::Sender<Wake>) {
    tx.send_replace(Wake::Changed);
}

/// A waiter's view of the wake-ups of one name.
#[derive(Debug)]
pub(crate) struct Subscription {
    rx: watch::Receiver<Wake>,
    notifier: Arc<Notifier>,
    name: String,
    owner: String,
}

impl Subscription {
    /// Marks every wake-up so far as seen: call before a poll's statement is sent.
    pub(crate) fn mark_seen(&mut self) {
        self.rx.borrow_and_update();
    }

    /// Resolves on the next wake-up for this waiter after [`mark_seen`](Self::mark_seen).
    pub(crate) async fn changed(&mut self) -> Wake {
        if self.rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
        *self.rx.borrow_and_update()
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut names = self.notifier.names();
        if let Some(owners) = names.get_mut(&self.name) {
            owners.remove(&self.owner);
            if owners.is_empty() {
                names.remove(&self.name);
            }
        }
    }
}

/// What ended a [`ServerWait`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(
    not(feature = "mysql"),
    allow(dead_code, reason = "server waits are MySQL's")
)]
pub(crate) enum Woken {
    /// The holder gave its wake lock up: it released (or its connection closed).
    Released,
    /// The holder's release handed the lock to the waiter, with this version: the waiter
    /// holds it, and the wait's connection now holds the waiter's own wake lock for the next
    /// waiter (kept with the lease until its release).
    Handed {
        /// The version (fencing token) of the waiter's hold.
        version: i64,
        /// The lease ends after this instant (the read was sent before it learnt what was
        /// left of the lease).
        until: std::time::Instant,
    },
    /// Nobody held the wake lock when the wait began: this holder has none (or released
    /// just before). Waiting on it again would return at once.
    NotArmed,
    /// The wait's bound passed with the wake lock still held.
    TimedOut,
    /// The wait failed (connection lost, query killed) or could not start.
    Failed,
}

/// A wait that runs on the server in a task of its own, for the release of the holder with
/// `version`: cancelling the future that awaits it ([`ServerWait::woken`]) leaves the wait
/// running, so the next `changed()` picks it up again. Dropping the `ServerWait` before the
/// wait ended cancels it on the server (the task kills its statement).
#[derive(Debug)]
pub(crate) struct ServerWait {
    version: i64,
    started: std::time::Instant,
    task: tokio::task::JoinHandle<Woken>,
    /// Dropped (with the `ServerWait`, or by [`ServerWait::stop`]) to tell the task to stop
    /// the wait on the server.
    cancel: Option<tokio::sync::oneshot::Sender<()>>,
}

#[cfg_attr(
    not(feature = "mysql"),
    allow(dead_code, reason = "server waits are MySQL's")
)]
impl ServerWait {
    /// A wait run by `task`, which stops when `cancel`'s receiver resolves.
    pub(crate) fn new(
        version: i64,
        task: tokio::task::JoinHandle<Woken>,
        cancel: tokio::sync::oneshot::Sender<()>,
    ) -> Self {
        Self {
            version,
            started: std::time::Instant::now(),
            task,
            cancel: Some(cancel),
        }
    }

    /// Whether the wait is still on and began less than `fresh` ago: the holder has not
    /// given its wake lock up yet, so a read would only find it holding.
    pub(crate) fn pending_within(&self, fresh: std::time::Duration) -> bool {
        !self.task.is_finished() && self.started.elapsed() < fresh
    }

    /// The holder's version this wait is for.
    pub(crate) fn version(&self) -> i64 {
        self.version
    }

    /// Resolves when the wait ended. Cancel-safe: the wait goes on without it.
    pub(crate) async fn woken(&mut self) -> Woken {
        (&mut self.task).await.unwrap_or(Woken::Failed)
    }

    /// Stops the wait on the server and waits for its task to end, so that nothing it keeps
    /// (a hand-over's pinned connection) comes after the caller's clean-up.
    pub(crate) async fn stop(mut self) {
        self.cancel = None;
        let _ = self.woken().await;
    }
}

/// The prefix of the wake locks of `name` in `table`: the wake lock of the holder with version
/// `v` is the prefix followed by `v`. A hash keeps it within MySQL's 64 characters for any name;
/// FNV-1a, written out here, so that every process and version of this crate agrees on it.
/// Two names with the same hash only share wake-ups, which are hints.
#[cfg_attr(
    not(feature = "mysql"),
    allow(dead_code, reason = "wake locks are MySQL's")
)]
pub(crate) fn wake_prefix(table: &str, name: &str) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let bytes = table.bytes().chain([0]).chain(name.bytes());
    for byte in bytes {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("distlock:{hash:016x}:")
}

/// What a notification says about one name (see [`parse_payload`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Note<'a> {
    /// Something changed: every waiter looks again.
    Changed,
    /// The holder released, and this waiter holds the reservation.
    Released(&'a str),
    /// The holder's release handed the lock to this waiter (which held the reservation),
    /// with this version.
    Handed(&'a str, i64),
}

/// Splits a notification payload into its name and what it says: `<owner byte
/// length>:<owner><name>` (an empty owner addresses every waiter) for a release, or
/// `h<version>:<owner byte length>:<owner><name>` for a hand-over. Clients that predate
/// hand-overs read the latter as malformed, and wake every waiter.
#[cfg_attr(
    not(feature = "postgres"),
    allow(dead_code, reason = "LISTEN/NOTIFY is PostgreSQL's")
)]
pub(crate) fn parse_payload(payload: &str) -> Option<(Note<'_>, &str)> {
    let (handed, payload) = match payload.strip_prefix('h') {
        Some(rest) => {
            let (version, rest) = rest.split_once(':')?;
            (Some(version.parse::<i64>().ok()?), rest)
        }
        None => (None, payload),
    };
    let (len, rest) = payload.split_once(':')?;
    let len: usize = len.parse().ok()?;
    if !rest.is_char_boundary(len) {
        return None;
    }
    let (owner, name) = rest.split_at(len);
    let note = match (handed, owner.is_empty()) {
        (Some(version), false) => Note::Handed(owner, version),
        (Some(_), true) => return None,
        (None, false) => Note::Released(owner),
        (None, true) => Note::Changed,
    };
    Some((note, name))
}

#[cfg(test)]
mod tests {
    use super::{Arc, Note, Notifier, Wake, parse_payload, wake_prefix};

    #[test]
    fn wake_lock_names_are_stable_and_short() {
        assert_eq!(wake_prefix("t", "a"), wake_prefix("t", "a"));
        assert_ne!(wake_prefix("t", "a"), wake_prefix("t", "b"));
        assert_ne!(wake_prefix("t", "a"), wake_prefix("u", "a"));
        // The known FNV-1a value of "t\0a", so that no build ever changes it.
        assert_eq!(wake_prefix("t", "a"), "distlock:566dd51943ee5048:");
        let longest = format!("{}{}", wake_prefix("t", &"x".repeat(512)), i64::MAX);
        assert!(longest.len() <= 64, "{longest}");
    }

    #[test]
    fn payloads() {
        assert_eq!(
            parse_payload("3:abcname"),
            Some((Note::Released("abc"), "name"))
        );
        assert_eq!(parse_payload("0:a:b"), Some((Note::Changed, "a:b")));
        assert_eq!(parse_payload("2:é🔒"), Some((Note::Released("é"), "🔒")));
        assert_eq!(
            parse_payload("h42:3:abcn:a"),
            Some((Note::Handed("abc", 42), "n:a"))
        );
        assert_eq!(parse_payload("h42:0:name"), None);
        assert_eq!(parse_payload("hx:3:abcname"), None);
        assert_eq!(parse_payload("1:é"), None);
        assert_eq!(parse_payload("x"), None);
    }

    /// A wake-up addressed to one waiter wakes that waiter's task only; an unaddressed one
    /// wakes every waiter of the name; a dropped subscription leaves nothing behind.
    #[tokio::test]
    async fn wake_ups_reach_only_the_waiters_they_name() {
        let notifier = Arc::new(Notifier::default());
        let mut a = notifier.subscribe("x", "a");
        let mut b = notifier.subscribe("x", "b");
        let mut other = notifier.subscribe("y", "c");
        a.mark_seen();
        b.mark_seen();
        other.mark_seen();
        notifier.wake("x", Note::Released("a"));
        assert_eq!(a.changed().await, Wake::Released, "not sent to its target");
        assert!(!b.rx.has_changed().expect("open"), "woke a bystander");
        notifier.wake("x", Note::Released("elsewhere"));
        notifier.wake("x", Note::Changed);
        assert_eq!(a.changed().await, Wake::Changed);
        assert_eq!(b.changed().await, Wake::Changed);
        // A hand-over: its target holds the lock, the other waiters compete for the queue.
        notifier.wake("x", Note::Handed("b", 7));
        assert_eq!(b.changed().await, Wake::Handed(7));
        assert_eq!(a.changed().await, Wake::Vacant);
        assert!(!other.rx.has_changed().expect("open"), "woke another name");
        notifier.wake_all();
        assert_eq!(other.changed().await, Wake::Changed);
        drop((a, b, other));
        assert!(notifier.names().is_empty());
    }
}
