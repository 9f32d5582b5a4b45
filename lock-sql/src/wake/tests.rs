//! The notification payloads, the wake-ups' routing and the wake lock names.
use super::{Arc, Note, Notifier, WakeSignal, parse_payload, wake_prefix};

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
    assert_eq!(
        parse_payload("H42:3:abcn:a"),
        Some((Note::HandedAlone("abc", 42), "n:a"))
    );
    assert_eq!(parse_payload("h42:0:name"), None);
    assert_eq!(parse_payload("H42:0:name"), None);
    assert_eq!(parse_payload("hx:3:abcname"), None);
    assert_eq!(parse_payload("1:é"), None);
    assert_eq!(parse_payload("x"), None);
}

/// A wake-up addressed to one waiter wakes that waiter's task only; an unaddressed one
/// wakes every waiter of the name; a dropped subscription leaves nothing behind.
#[tokio::test]
async fn wake_ups_reach_only_the_waiters_they_name() {
    let notifier = Arc::new(Notifier::default());
    let mut a = notifier.subscribe("x", "a", true);
    let mut b = notifier.subscribe("x", "b", true);
    let mut other = notifier.subscribe("y", "c", true);
    let mut queued = notifier.subscribe("x", "q", false);
    a.mark_seen();
    b.mark_seen();
    other.mark_seen();
    queued.mark_seen();
    notifier.wake("x", Note::Released("a"));
    assert_eq!(
        a.changed().await,
        WakeSignal::Released,
        "not sent to its target"
    );
    assert!(!b.rx.has_changed().expect("open"), "woke a bystander");
    notifier.wake("x", Note::Released("elsewhere"));
    notifier.wake("x", Note::Changed);
    assert_eq!(a.changed().await, WakeSignal::Changed);
    assert_eq!(b.changed().await, WakeSignal::Changed);
    // A hand-over: its target holds the lock, the other waiters compete for the queue.
    notifier.wake("x", Note::Handed("b", 7));
    assert_eq!(b.changed().await, WakeSignal::Handed(7));
    assert_eq!(a.changed().await, WakeSignal::Vacant);
    assert!(!other.rx.has_changed().expect("open"), "woke another name");
    // A queued waiter claims no reservation: a hand-over to another does not wake it, one
    // to itself and any other wake-up do.
    assert_eq!(
        queued.changed().await,
        WakeSignal::Changed,
        "the wake-up before"
    );
    assert!(
        !queued.rx.has_changed().expect("open"),
        "woke a queued waiter"
    );
    notifier.wake("x", Note::Handed("q", 8));
    assert_eq!(queued.changed().await, WakeSignal::Handed(8));
    // A hand-over that wakes nobody else: its target holds, the claimers sleep on.
    assert_eq!(a.changed().await, WakeSignal::Vacant, "the hand-over to q");
    notifier.wake("x", Note::HandedAlone("b", 12));
    assert_eq!(b.changed().await, WakeSignal::Handed(12));
    assert!(!a.rx.has_changed().expect("open"), "woke a claimer");
    // Later wake-ups do not hide a hand-over its target has not seen yet, be it waiting
    // or polling; once reported, it is not reported again.
    notifier.wake("x", Note::Handed("a", 9));
    notifier.wake("x", Note::Handed("b", 10));
    notifier.wake("x", Note::Changed);
    assert_eq!(a.changed().await, WakeSignal::Handed(9));
    assert_eq!(b.mark_seen(), Some(10), "hidden from a poll");
    assert_eq!(b.mark_seen(), None, "reported twice");
    notifier.wake("x", Note::Changed);
    assert_eq!(a.changed().await, WakeSignal::Changed);
    notifier.wake("x", Note::Handed("a", 11));
    notifier.wake("x", Note::Released("a"));
    assert_eq!(a.mark_seen(), Some(11), "hidden from a poll");
    notifier.wake("x", Note::Changed);
    assert_eq!(a.changed().await, WakeSignal::Changed);
    notifier.wake_all();
    assert_eq!(other.changed().await, WakeSignal::Changed);
    drop((a, b, other, queued));
    assert!(notifier.names().is_empty());
}
