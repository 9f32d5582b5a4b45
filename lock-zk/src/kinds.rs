//! The lock kinds in the queue: where a node of each kind (exclusive, shared, permit) stands
//! ([`place`]), whether it can ever join the holders ([`mismatch`]), and who holds a name
//! ([`holders`]). The queue's mechanics (listing, joining, leaving, the nodes' leases) are in
//! `queue.rs`; the exclusive kind, the mutex, keeps its own path in `attempt.rs` (the first
//! node holds, every other watches its predecessor).

use distlock_core::LockKind;

use crate::keys::Entry;

/// Why a node of `kind` can never join the holders, given the nodes `ahead` of it in the
/// queue: one of them is of a kind that does not belong with it ([`LockKind::mismatch`]).
/// Not only the head (the oldest node, which holds): a node of another kind behind the head
/// is an attempt about to be told so and leave, unless its look at the queue comes late (a
/// slow answer, a poll cut short, whose node is kept) and finds it the head by then. It then
/// held beside ours, which [`place`] let hold without counting it (a writer beside a permit
/// holder, tokens out of order). The later node is refused instead.
pub(crate) fn mismatch(kind: LockKind, ahead: &[Entry]) -> Option<String> {
    ahead.iter().find_map(|node| kind.mismatch(node.kind))
}

/// Where a shared or permit node stands in the queue (the exclusive kind, the mutex, keeps its
/// own path in `attempt.rs`: the first node holds, every other watches its predecessor).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Place {
    /// It holds the lock. `successor`: a node behind it may be watching its data as a waiter's
    /// (a permit node further back that saw it waiting, and waits for it to hold), so the
    /// write that marks it held must be made, to wake that node.
    Holds { successor: bool },
    /// It waits for this node to go: a reader for the latest writer ahead of it (Curator's
    /// read lock); a permit waiter beyond the first for its predecessor, or beyond the
    /// waiters that count ([`PERMIT_WAITERS_COUNTING`]) for the waiter that many places
    /// ahead, which signals it with a write of its node when it becomes a holder. Most wait
    /// for [`blockers`] instead, when there are any.
    Behind(Entry),
    /// The first permit waiter: the release (or removal) of any of these holders frees a
    /// permit for it. It counts their deletions (see [`blockers`]); with more than
    /// [`MAX_BLOCKERS`] of them, or as a try, it lists the lock node's children (with a watch)
    /// and judges their leases.
    FirstWaiter(Vec<Entry>),
}

/// Where `entries[index]`, a node of `kind`, stands (see [`Place`]).
///
/// - Shared: it holds when no exclusive node is ahead of it; otherwise it waits for the
///   latest exclusive node ahead. A reader that joins behind a waiting writer therefore waits
///   for that writer, which is the writer preference.
/// - Permit of N: among the permit nodes of N (others do not belong: see [`mismatch`]), the
///   first N hold, the next is the first waiter, the others wait for their predecessor (the
///   second waiter) or the waiter [`PERMIT_WAITERS_COUNTING`] places ahead.
/// - Exclusive: first holds, others wait for their predecessor.
pub(crate) fn place(kind: LockKind, entries: &[Entry], index: usize) -> Place {
    match kind {
        LockKind::Permit { permits } => {
            let own = entries[index].seq;
            let same: Vec<&Entry> = entries.iter().filter(|e| e.kind == kind).collect();
            let at = same.iter().position(|e| e.seq == own).unwrap_or(0);
            let n = usize::try_from(permits).unwrap_or(usize::MAX);
            match at.checked_sub(n) {
                None => Place::Holds {
                    successor: at + 1 < same.len(),
                },
                Some(0) => Place::FirstWaiter(same[..n].iter().map(|e| (*e).clone()).collect()),
                // Its predecessor, or, beyond the waiters that count, the waiter whose hold
                // brings it among them.
                Some(waiter) => {
                    Place::Behind(same[at - waiter.min(PERMIT_WAITERS_COUNTING)].clone())
                }
            }
        }
        LockKind::Shared => match entries[..index]
            .iter()
            .rev()
            .find(|e| e.kind == LockKind::Exclusive)
        {
            Some(writer) => Place::Behind(writer.clone()),
            None => Place::Holds { successor: false },
        },
        _ => match index.checked_sub(1) {
            None => Place::Holds { successor: false },
            Some(ahead) => Place::Behind(entries[ahead].clone()),
        },
    }
}

/// At most this many nodes are watched by one waiter (see [`blockers`]): each of its looks
/// at the queue reads them all (a writer behind more readers, or a permit waiter behind more
/// nodes, waits for one node ahead).
pub(crate) const MAX_BLOCKERS: usize = 8;

/// How many permit waiters, from the first, count the deletions of the nodes ahead of them
/// (see [`blockers`]); a waiter further back watches the waiter this many places ahead,
/// whose hold brings it among them (see [`place`]). Each release notifies every counting
/// waiter, so the window bounds what a release costs however many wait, and two waiters
/// armed let two releases in a row each hand a permit over with no request (one counting
/// waiter gained nothing measurable: the next one was not ready for the next release).
pub(crate) const PERMIT_WAITERS_COUNTING: usize = 2;

/// The nodes whose deletion alone makes `entries[index]`, a waiting node of `kind`, hold
/// (nodes ahead of it only ever leave the queue; none joins ahead), and how many of them must
/// go: a writer's (or the mutex's) head when it is next in line; its readers, when only
/// readers (at most [`MAX_BLOCKERS`]) are ahead of it; a reader's writer, when one writer is
/// ahead of it (all of them, in these three); a permit waiter's every node ahead, when at most
/// [`MAX_BLOCKERS`] are, of which all but N - 1 (one for the first waiter, two for the next).
/// `None` otherwise (further back in the mutex's queue, a reader behind two writers, permits
/// further back): it waits for one node and looks at the queue when that one goes. Nor when
/// a node ahead does not belong with `kind`: such an attempt is refused before it is placed
/// (see [`mismatch`]); kept here so that no count ever skips such a node.
pub(crate) fn blockers(kind: LockKind, entries: &[Entry], index: usize) -> Option<Blockers<'_>> {
    let ahead = &entries[..index];
    if ahead.is_empty() || ahead.iter().any(|e| kind.mismatch(e.kind).is_some()) {
        return None;
    }
    let nodes: Vec<&Entry> = match kind {
        // Next in line: the head, whatever its kind.
        LockKind::Exclusive if index == 1 => vec![&entries[0]],
        LockKind::Exclusive => (ahead.len() <= MAX_BLOCKERS
            && ahead.iter().all(|e| e.kind == LockKind::Shared))
        .then(|| ahead.iter().collect())?,
        LockKind::Shared => {
            let mut writers = ahead.iter().filter(|e| e.kind == LockKind::Exclusive);
            let first = writers.next()?;
            writers.next().is_none().then(|| vec![first])?
        }
        LockKind::Permit { permits } => {
            // Every node ahead is a permit node of N (none mismatches): ours holds once all
            // but N - 1 of them are gone.
            let n = usize::try_from(permits).ok()?;
            let needed = index.checked_sub(n)? + 1;
            return (index <= MAX_BLOCKERS && needed <= PERMIT_WAITERS_COUNTING).then(|| {
                Blockers {
                    nodes: ahead.iter().collect(),
                    needed,
                }
            });
        }
        _ => return None,
    };
    Some(Blockers {
        needed: nodes.len(),
        nodes,
    })
}

/// What keeps a waiting node from holding (see [`blockers`]): once `needed` of `nodes` are
/// deleted, it holds.
#[derive(Debug)]
pub(crate) struct Blockers<'a> {
    /// The nodes ahead it waits on.
    pub(crate) nodes: Vec<&'a Entry>,
    /// How many of them must go.
    pub(crate) needed: usize,
}

/// Who holds a name whose queue is `entries`, and as what: the head alone if it is
/// exclusive; the readers ahead of the first writer; the first N permit nodes of N. Nodes of
/// a waiter that may take its hold now (its data still says "waiting") count as holders. A
/// node of another kind ends them: the nodes behind it are refused (see [`mismatch`]).
pub(crate) fn holders(entries: &[Entry]) -> (LockKind, Vec<&Entry>) {
    let Some(head) = entries.first() else {
        return (LockKind::Exclusive, Vec::new());
    };
    let held = match head.kind {
        LockKind::Shared => entries
            .iter()
            .take_while(|e| e.kind == LockKind::Shared)
            .collect(),
        LockKind::Permit { permits } => entries
            .iter()
            .take_while(|e| e.kind == head.kind)
            .take(usize::try_from(permits).unwrap_or(usize::MAX))
            .collect(),
        _ => vec![head],
    };
    (head.kind, held)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{node_prefix, queue};

    fn entries(nodes: &[(LockKind, &str)]) -> Vec<Entry> {
        queue(
            nodes
                .iter()
                .enumerate()
                .map(|(seq, (kind, owner))| format!("{}{seq:010}", node_prefix(*kind, owner)))
                .collect(),
        )
    }

    const R: LockKind = LockKind::Shared;
    const W: LockKind = LockKind::Exclusive;
    const S2: LockKind = LockKind::Permit { permits: 2 };

    #[test]
    fn readers_hold_until_a_writer_and_then_wait_for_the_latest_writer_ahead() {
        let q = entries(&[(R, "a"), (R, "b"), (W, "w"), (R, "c"), (W, "x"), (R, "d")]);
        let holds = Place::Holds { successor: false };
        assert_eq!(place(R, &q, 0), holds);
        assert_eq!(place(R, &q, 1), holds);
        assert_eq!(place(R, &q, 3), Place::Behind(q[2].clone()));
        assert_eq!(place(R, &q, 5), Place::Behind(q[4].clone()));
        assert_eq!(place(W, &q, 2), Place::Behind(q[1].clone()));
        let (kind, held) = holders(&q);
        assert_eq!((kind, held.len()), (R, 2));
        assert_eq!(mismatch(W, &q[..2]), None);
        assert!(mismatch(S2, &q[..1]).is_some());
    }

    #[test]
    fn a_writer_waits_for_every_reader_ahead_a_reader_for_its_one_writer() {
        let names = |b: Option<Blockers<'_>>| {
            b.map(|b| {
                assert_eq!(b.needed, b.nodes.len());
                b.nodes.iter().map(|e| e.seq).collect::<Vec<_>>()
            })
        };
        let q = entries(&[(R, "a"), (R, "b"), (W, "w"), (R, "c"), (W, "x"), (R, "d")]);
        assert_eq!(names(blockers(W, &q, 2)), Some(vec![0, 1]));
        assert_eq!(names(blockers(R, &q, 3)), Some(vec![2]));
        // Behind two writers, or a writer behind a writer: wait for the predecessor.
        assert_eq!(names(blockers(R, &q, 5)), None);
        assert_eq!(names(blockers(W, &q, 4)), None);
        // Holding: nothing to wait for.
        assert_eq!(names(blockers(R, &q, 1)), None);
        // A node ahead of another kind could still become the head.
        let odd = entries(&[(W, "w"), (S2, "s"), (R, "r")]);
        assert_eq!(names(blockers(R, &odd, 2)), None);
        let mutex = entries(&[(W, "w"), (W, "x"), (W, "y")]);
        assert_eq!(names(blockers(W, &mutex, 1)), Some(vec![0]));
        assert_eq!(names(blockers(W, &mutex, 2)), None);
        let many: Vec<(LockKind, String)> =
            (0..=MAX_BLOCKERS).map(|i| (R, format!("r{i}"))).collect();
        let mut many: Vec<(LockKind, &str)> = many.iter().map(|(k, o)| (*k, o.as_str())).collect();
        many.push((W, "w"));
        assert_eq!(names(blockers(W, &entries(&many), MAX_BLOCKERS + 1)), None);
        assert_eq!(
            names(blockers(W, &entries(&many[1..]), MAX_BLOCKERS)).map(|b| b.len()),
            Some(MAX_BLOCKERS)
        );
    }

    #[test]
    fn the_first_n_permits_hold_the_next_watches_them_the_rest_their_predecessor() {
        // A foreign writer (told it mismatches) is not counted; the permits behind it are
        // refused before they are placed (see `mismatch`).
        let q = entries(&[(S2, "a"), (W, "w"), (S2, "b"), (S2, "c"), (S2, "d")]);
        assert_eq!(place(S2, &q, 0), Place::Holds { successor: true });
        assert_eq!(place(S2, &q, 2), Place::Holds { successor: true });
        assert_eq!(
            place(S2, &q, 3),
            Place::FirstWaiter(vec![q[0].clone(), q[2].clone()])
        );
        assert_eq!(place(S2, &q, 4), Place::Behind(q[3].clone()));
        let last = entries(&[(S2, "a"), (S2, "b")]);
        assert_eq!(place(S2, &last, 1), Place::Holds { successor: false });
        let (kind, held) = holders(&q);
        assert_eq!(
            (kind, held.len()),
            (S2, 1),
            "the permits behind the writer are refused"
        );
        let (kind, held) = holders(&q[2..]);
        assert_eq!((kind, held.len()), (S2, 2));
        assert!(mismatch(LockKind::Permit { permits: 3 }, &q).is_some());
        assert!(mismatch(W, &q).is_some());
        assert_eq!(mismatch(S2, &q[..1]), None);
        assert!(mismatch(S2, &q[..2]).is_some(), "a writer ahead not seen");
        // Whatever the head: a permit of another count, or a reader, behind a reader head.
        let mixed = entries(&[(R, "a"), (S2, "s"), (R, "b")]);
        assert!(mismatch(R, &mixed[..2]).is_some());
        assert_eq!(mismatch(S2, &mixed[..0]), None);
    }

    #[test]
    fn a_permit_waiter_counts_the_deletions_of_the_nodes_ahead() {
        let counted = |b: Option<Blockers<'_>>| b.map(|b| (b.nodes.len(), b.needed));
        let q = entries(&[(S2, "a"), (S2, "b"), (S2, "c"), (S2, "d"), (S2, "e")]);
        // Holders wait for nothing; the first waiter for any one of the two holders; the
        // next for two of the three nodes ahead; the third for its predecessor.
        assert_eq!(counted(blockers(S2, &q, 1)), None);
        assert_eq!(counted(blockers(S2, &q, 2)), Some((2, 1)));
        assert_eq!(counted(blockers(S2, &q, 3)), Some((3, 2)));
        assert_eq!(PERMIT_WAITERS_COUNTING, 2);
        assert_eq!(counted(blockers(S2, &q, 4)), None);
        // It watches the first waiter, whose hold brings it among those that count.
        assert_eq!(place(S2, &q, 4), Place::Behind(q[2].clone()));
        // A writer ahead (about to be told it mismatches) could still become the head.
        let odd = entries(&[(S2, "a"), (W, "w"), (S2, "b"), (S2, "c")]);
        assert_eq!(counted(blockers(S2, &odd, 3)), None);
        // Beyond MAX_BLOCKERS nodes ahead: its predecessor only.
        let s7 = LockKind::Permit { permits: 7 };
        let many: Vec<(LockKind, String)> = (0..=MAX_BLOCKERS + 1)
            .map(|i| (s7, format!("s{i}")))
            .collect();
        let many: Vec<(LockKind, &str)> = many.iter().map(|(k, o)| (*k, o.as_str())).collect();
        let q = entries(&many);
        assert_eq!(
            counted(blockers(s7, &q, MAX_BLOCKERS)),
            Some((MAX_BLOCKERS, PERMIT_WAITERS_COUNTING))
        );
        assert_eq!(counted(blockers(s7, &q, MAX_BLOCKERS + 1)), None);
    }
}
