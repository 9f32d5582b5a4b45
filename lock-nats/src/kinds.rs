//! The queue of a name: every entry of its range in the order of its first revision, and
//! which of them hold, by kind.
//!
//! An exclusive entry holds when it is first; a shared entry when every entry before it is
//! shared (a waiting writer queues later readers behind it); a permit of N when fewer than N
//! entries are before it. Every entry of a name is of one family: permits of the same N, or
//! exclusive and shared; anything else is [`Error::Mismatch`].

use async_nats::jetstream::message::StreamMessage;
use async_nats::jetstream::response::Response;
use distlock_core::{Error, LockKind, Result};

use crate::backend::BackendState;
use crate::error::{not_found, request};
use crate::keys::{EntryValue, NameKeys};
use futures::StreamExt;

/// How many reads of keys [`Queue::read_behind`] has in flight at once (a read of a large
/// queue by each of its many waiters would otherwise flood the server's API queue).
const READ_AT_ONCE: usize = 32;

/// A batched direct get of the last message of every subject under a filter (ADR-31).
#[derive(serde::Serialize)]
struct MultiLast<'a> {
    multi_last: [&'a str; 1],
}

/// The header of a direct get's answer that names the stream that answered.
const NATS_STREAM: &str = "Nats-Stream";

/// The header of a batch's end that says how many messages it left out.
const NUM_PENDING: &str = "Nats-Num-Pending";

/// A request for the stream's info with the subjects under a filter.
#[derive(serde::Serialize)]
struct SubjectsRequest<'a> {
    subjects_filter: &'a str,
}

/// The answer to a [`SubjectsRequest`]: the subjects on this page (with their message
/// counts), and how many there are in all.
#[derive(serde::Deserialize)]
struct SubjectsPage {
    #[serde(default)]
    total: usize,
    state: SubjectsState,
}

/// The part of a stream's state a [`SubjectsPage`] reads.
#[derive(serde::Deserialize)]
struct SubjectsState {
    #[serde(default)]
    subjects: Option<std::collections::HashMap<String, u64>>,
}

/// One live entry.
#[derive(Clone, Debug)]
pub(crate) struct Entry {
    /// Its subject.
    pub(crate) subject: String,
    /// Its current revision (the sequence of its last write).
    pub(crate) rev: u64,
    /// What it stores, `first` resolved to the entry's creation revision.
    pub(crate) value: EntryValue,
    /// When its ttl ends by the server's clock (its timestamp plus its ttl), in ns since 1970.
    pub(crate) expires_ns: Option<i128>,
}

impl Entry {
    /// Its place in the queue, and its fencing token once it holds.
    pub(crate) fn token(&self) -> u64 {
        self.value.first
    }
}

/// The entries of a name, read from the stream's leader.
#[derive(Debug, Default)]
pub(crate) struct Queue {
    /// Live entries, by first revision.
    pub(crate) entries: Vec<Entry>,
    /// The highest sequence in the range, markers included (0: none): what a write that needs
    /// the range unchanged expects.
    pub(crate) last: u64,
    /// The latest server timestamp among the range's messages (ns since 1970).
    pub(crate) newest_ns: i128,
}

/// What [`inspect`](distlock_core::backend::LockBackend::inspect) has shown, per name: the
/// highest, over its reads, of the oldest holder's term (token) it showed, at most
/// [`Shown::NAMES`] names. Tokens are stream sequences and only grow, so a name is never
/// forgotten for being free for a moment (a release's gap before the next write): only a
/// name past the bound is, one arbitrary name for each new one.
#[derive(Debug, Default)]
pub(crate) struct Shown(std::sync::Mutex<std::collections::HashMap<String, u64>>);

impl Shown {
    /// How many names it keeps.
    pub(crate) const NAMES: usize = 4096;

    fn names(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, u64>> {
        distlock_core::backend::unpoisoned(&self.0)
    }

    /// The term below which an entry is left out (see [`Queue::observed`]).
    pub(crate) fn floor(&self, name: &str) -> Option<u64> {
        self.names().get(name).copied()
    }

    /// Holders of `name` were shown, the oldest with term `oldest`.
    pub(crate) fn saw(&self, name: &str, oldest: u64) {
        let mut names = self.names();
        if let Some(floor) = names.get_mut(name) {
            *floor = (*floor).max(oldest);
            return;
        }
        if names.len() >= Self::NAMES
            && let Some(gone) = names.keys().next().cloned()
        {
            names.remove(&gone);
        }
        names.insert(name.to_owned(), oldest);
    }
}

/// Whether a stored message is a marker (a delete, a purge, a ttl's expiry), not an entry.
pub(crate) fn is_marker(headers: Option<&async_nats::HeaderMap>) -> bool {
    headers.is_some_and(|h| {
        h.get("Nats-Marker-Reason").is_some()
            || h.get("KV-Operation")
                .is_some_and(|op| matches!(op.as_str(), "DEL" | "PURGE"))
    })
}

/// The entry a stored message is, or `None` for a marker.
pub(crate) fn entry_of(message: &StreamMessage) -> Result<Option<Entry>> {
    if is_marker(Some(&message.headers)) {
        return Ok(None);
    }
    let mut value = EntryValue::decode(&message.payload)?;
    if value.first == 0 {
        value.first = message.sequence;
    }
    let ttl = message
        .headers
        .get("Nats-TTL")
        .and_then(|v| v.as_str().parse::<i128>().ok());
    Ok(Some(Entry {
        subject: message.subject.to_string(),
        rev: message.sequence,
        value,
        expires_ns: ttl.map(|secs| message.time.unix_timestamp_nanos() + secs * 1_000_000_000),
    }))
}

impl Queue {
    /// Takes in one message of the range. A key found twice (rewritten, renewed, while the
    /// reads passed it) is the later message's (by subject, its index in `entries`, in
    /// `seen`). A marker found after the entry it removed leaves the entry in: as if read
    /// before the removal (its subscribers are told of the removal).
    fn add(
        &mut self,
        message: &StreamMessage,
        seen: &mut std::collections::HashMap<String, usize>,
    ) -> Result<()> {
        self.last = self.last.max(message.sequence);
        self.newest_ns = self.newest_ns.max(message.time.unix_timestamp_nanos());
        if let Some(entry) = entry_of(message)? {
            if let Some(&at) = seen.get(&entry.subject) {
                self.entries[at] = entry;
            } else {
                seen.insert(entry.subject.clone(), self.entries.len());
                self.entries.push(entry);
            }
        }
        Ok(())
    }

    /// Reads every entry of `keys`' range: one request per message (the range holds one
    /// message per key: the bucket keeps no history). An entry counts until the server
    /// removes it: its owner can still renew it until then, so no reader may take it for
    /// gone any earlier.
    pub(crate) async fn read(state: &BackendState, keys: &NameKeys) -> Result<Self> {
        state.connected()?;
        let mut queue = Self::default();
        let mut seen = std::collections::HashMap::new();
        let mut seq = 1;
        loop {
            let message = match state
                .stream
                .get_first_raw_message_by_subject(&keys.range, seq)
                .await
            {
                Ok(message) => message,
                Err(err) if not_found(&err.kind()) => break,
                Err(err) => return Err(request("read", err)),
            };
            seq = message.sequence + 1;
            queue.add(&message, &mut seen)?;
        }
        queue.entries.sort_by_key(Entry::token);
        Ok(queue)
    }

    /// [`Queue::read`] for a waiter whose own entry is written, on a single server: every
    /// entry ahead of it was in the range before this read began. One request where the
    /// stream answers direct gets ([`Queue::read_direct`]); otherwise (or where that read is
    /// not possible) the range's keys come in
    /// one request (the stream's subjects under the range), then the last message of every
    /// key, [`READ_AT_ONCE`] at once, where the walk sends a request per message, one after
    /// the other (16 readers of one name: 2 round trips instead of 17). A key written after
    /// the first request may be missing: it is behind the waiter's entry. So is, possibly,
    /// the highest sequence of the range (`last`): this read is not for a write that expects
    /// the range unchanged, and a lease's compare-and-set on the range fails anyway if
    /// anything was written after its entry.
    ///
    /// A replicated stream walks: its requests are not answered from one state (a stream
    /// without a leader answers its info from a member that may lag; a new leader answers
    /// reads while it applies its log), and only the walk's order (no message is seen before
    /// every lower one is applied) makes a read that shows the waiter's entry show every entry
    /// ahead of it. So does a range with more keys than one page of the info lists.
    pub(crate) async fn read_behind(
        state: &BackendState,
        keys: &NameKeys,
        own: &str,
    ) -> Result<Self> {
        if state.replicated {
            return Self::read(state, keys).await;
        }
        state.connected()?;
        if state.reads_direct()
            && let Some(queue) = Self::read_direct(state, keys, own).await?
        {
            return Ok(queue);
        }
        let ask = SubjectsRequest {
            subjects_filter: &keys.range,
        };
        let info = format!("STREAM.INFO.{}", state.bucket.stream);
        let page: Response<SubjectsPage> = state
            .js
            .request(info, &ask)
            .await
            .map_err(|e| request("read", e))?;
        let page = match page {
            Response::Ok(page) => page,
            Response::Err { error } => return Err(request("read", error)),
        };
        let subjects = page.state.subjects.unwrap_or_default();
        if page.total > subjects.len() {
            return Self::read(state, keys).await;
        }
        let subjects: Vec<String> = subjects.into_keys().collect();
        let mut queue = Self::default();
        let mut seen = std::collections::HashMap::new();
        for chunk in subjects.chunks(READ_AT_ONCE) {
            let reads = chunk
                .iter()
                .map(|subject| state.stream.get_last_raw_message_by_subject(subject));
            for read in futures::future::join_all(reads).await {
                match read {
                    Ok(message) => queue.add(&message, &mut seen)?,
                    // Removed, marker and all, since the first request.
                    Err(err) if not_found(&err.kind()) => {}
                    Err(err) => return Err(request("read", err)),
                }
            }
        }
        queue.entries.sort_by_key(Entry::token);
        Ok(queue)
    }

    /// [`Queue::read_behind`]'s read in one request, on a stream that answers direct gets
    /// ([`BackendState::direct`]): the last message of every key under the name's range in
    /// one batch (`multi_last`, nats-server 2.11), which the server ends with its
    /// end-of-batch status, and which must hold the waiter's own entry (subject `own`).
    /// `None`: not read so, read as without: the name has more keys than one batch may hold
    /// (1,024), the batch ended otherwise than complete (any status but a complete end, a
    /// batch without `own`); or the stream does not answer such reads, not in time (a server
    /// that drops a request its user may not send answers nothing), or another stream
    /// answered (direct reads are then off for a while, see [`BackendState::no_direct`]).
    async fn read_direct(state: &BackendState, keys: &NameKeys, own: &str) -> Result<Option<Self>> {
        let inbox = state.client.new_inbox();
        // Subscribed before the request goes out: the server handles the two in order.
        let mut answers = state
            .client
            .subscribe(inbox.clone())
            .await
            .map_err(|e| request("read", e))?;
        let ask = serde_json::to_vec(&MultiLast {
            multi_last: [&keys.range],
        })
        .map_err(|e| request("read", e))?;
        state
            .client
            .publish_with_reply(
                format!("$JS.API.DIRECT.GET.{}", state.bucket.stream),
                inbox,
                ask.into(),
            )
            .await
            .map_err(|e| request("read", e))?;
        // Half the operation's time, which bounds the poll: the other half is the read's
        // without, should this one go unanswered.
        let deadline = tokio::time::Instant::now() + state.timeout / 2;
        let mut queue = Self::default();
        let mut seen = std::collections::HashMap::new();
        loop {
            let answer = match tokio::time::timeout_at(deadline, answers.next()).await {
                Ok(Some(answer)) => answer,
                Ok(None) => {
                    return Err(Error::Unavailable {
                        message: "NATS read: the direct read's subscription ended".into(),
                        source: None,
                    });
                }
                Err(_) => {
                    state.no_direct("a direct get was not answered in time");
                    return Ok(None);
                }
            };
            match answer.status.map(|s| s.as_u16()) {
                None => {}
                // The end of the batch: complete only when it says nothing is left out.
                Some(204) => {
                    let pending = answer
                        .headers
                        .as_ref()
                        .and_then(|h| h.get_last(NUM_PENDING));
                    if pending.is_none_or(|n| n.as_str() != "0") {
                        return Ok(None);
                    }
                    break;
                }
                Some(503) => {
                    state.no_direct("the stream does not answer direct gets");
                    return Ok(None);
                }
                // Anything else ends the batch unfinished: a 404 where a message the server
                // picked could not be loaded (an entry expiring during the read: the
                // messages after it are missing), 413 for more keys than a batch may hold.
                Some(_) => return Ok(None),
            }
            let from = answer
                .headers
                .as_ref()
                .and_then(|h| h.get_last(NATS_STREAM));
            if from.is_none_or(|s| s.as_str() != state.bucket.stream) {
                // A mirror's answer may lag the stream: not a read to decide on.
                state.no_direct("a direct get was answered by another stream");
                return Ok(None);
            }
            let message = StreamMessage::try_from(answer).map_err(|e| request("read", e))?;
            queue.add(&message, &mut seen)?;
        }
        // The waiter's own entry is under the range: a batch without it is not whole.
        if queue.position(own).is_none() {
            return Ok(None);
        }
        queue.entries.sort_by_key(Entry::token);
        Ok(Some(queue))
    }

    /// Whether the entry at `index` holds.
    pub(crate) fn holds(&self, index: usize) -> bool {
        let before = &self.entries[..index];
        match self.entries[index].value.kind {
            LockKind::Shared => before.iter().all(|e| e.value.kind == LockKind::Shared),
            LockKind::Permit { permits } => index < permits as usize,
            _ => index == 0,
        }
    }

    /// The subjects and revisions of the entries that keep the one at `index` waiting (an
    /// exclusive entry's and a permit's every entry ahead, a shared entry's every exclusive
    /// entry ahead), and how many of them must leave before it may hold: a permit of N needs
    /// `index + 1 - N` gone, any other kind every one. Entries added later queue behind it,
    /// so only these removals unblock it, and a release wakes the waiters it lets in (one
    /// exclusive or permit waiter, the readers behind a writer), not every waiter behind it.
    pub(crate) fn blockers(&self, index: usize) -> (Vec<(String, u64)>, usize) {
        let ahead = self.entries[..index].iter();
        let kind = self.entries[index].value.kind;
        let keys: Vec<(String, u64)> = ahead
            .filter(|e| kind != LockKind::Shared || e.value.kind != LockKind::Shared)
            .map(|e| (e.subject.clone(), e.rev))
            .collect();
        let needed = match kind {
            LockKind::Permit { permits } => (index + 1).saturating_sub(permits as usize),
            _ => keys.len(),
        };
        (keys, needed.max(1))
    }

    /// The position of the entry at `subject`.
    pub(crate) fn position(&self, subject: &str) -> Option<usize> {
        self.entries.iter().position(|e| e.subject == subject)
    }

    /// The queue as an observer should see it, `floor` what [`Shown::floor`] says of the
    /// name: without the entries older than the highest oldest holder this client showed
    /// (`floor`): on a single server every one of them; on a `replicated` stream those whose
    /// ttl ended before a later message of the range was written (by the server's
    /// timestamps), which the server has not removed yet.
    ///
    /// On a single server a read misses no live entry (the walk reads the range in sequence
    /// order, and a renewal's message comes after the one it replaces), and the first entry
    /// of a read holds: an entry older than a holder shown was gone from that read, removed
    /// (a renewal's compare-and-set fails on a removed key), and is back only because the
    /// server brought it back. A server killed and restarted brings back keys released in
    /// the seconds before whose purge markers' ttl had run out, each with its last write,
    /// until its ttl's removal runs again (lock-nats/tests/restart.rs): an election's
    /// observer that had shown a newer term showed the older one again (`distlock check`,
    /// restart fault: term 6412 after 6415). A replicated stream's read may miss a live
    /// entry (a new leader answers reads while it applies its log): one in its ttl may be a
    /// live holder's and stays (the observer goes back to it: the term it showed was not the
    /// leader's). A client that has shown nothing of the name yet (a new one, a name
    /// forgotten, see [`Shown`]) sees every entry, a brought-back one too, until the server
    /// removes it. A stream whose sequences start over (its bucket deleted and created
    /// again, a memory-storage stream restarted, its data lost) has its new entries left out
    /// by a client that showed a higher term, until its sequences pass `floor`: its tokens
    /// went back, which a fenced resource refuses as well. The lock itself never judges so:
    /// an entry holds its place until the server removes it.
    pub(crate) fn observed(mut self, floor: Option<u64>, replicated: bool) -> Self {
        let newest = self.newest_ns;
        self.entries.retain(|e| {
            let kept = || replicated && e.expires_ns.is_none_or(|end| end >= newest);
            floor.is_none_or(|f| e.token() >= f || kept())
        });
        self
    }

    /// The holders.
    pub(crate) fn holders(&self) -> impl Iterator<Item = &Entry> {
        (0..self.entries.len())
            .filter(|&i| self.holds(i))
            .map(|i| &self.entries[i])
    }

    /// Whether an entry of `kind` added now would hold with nobody waiting (`try_acquire`).
    pub(crate) fn admits(&self, kind: LockKind) -> bool {
        let n = self.entries.len();
        (0..n).all(|i| self.holds(i))
            && match kind {
                LockKind::Shared => self
                    .entries
                    .iter()
                    .all(|e| e.value.kind == LockKind::Shared),
                LockKind::Permit { permits } => n < permits as usize,
                _ => n == 0,
            }
    }

    /// [`Error::Mismatch`] when an entry's kind cannot share the name with `kind`.
    pub(crate) fn check_kind(&self, name: &str, kind: LockKind) -> Result<()> {
        for entry in &self.entries {
            if let Some(message) = kind.mismatch(entry.value.kind) {
                return Err(Error::Mismatch {
                    name: name.to_owned(),
                    message,
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue(kinds: &[LockKind]) -> Queue {
        Queue {
            entries: kinds
                .iter()
                .enumerate()
                .map(|(i, &kind)| Entry {
                    subject: format!("s{i}"),
                    rev: i as u64 + 1,
                    value: EntryValue {
                        kind,
                        first: i as u64 + 1,
                        owner: String::new(),
                        data: None,
                    },
                    expires_ns: None,
                })
                .collect(),
            last: kinds.len() as u64,
            newest_ns: 0,
        }
    }

    const X: LockKind = LockKind::Exclusive;
    const R: LockKind = LockKind::Shared;
    const P2: LockKind = LockKind::Permit { permits: 2 };

    /// The subjects of the entries that keep the one at `index` of `q` waiting.
    fn ahead(q: &Queue, index: usize) -> Vec<String> {
        q.blockers(index).0.into_iter().map(|(s, _)| s).collect()
    }

    /// On a replicated stream, an entry past its ttl by the server's timestamps is left out
    /// only below the oldest holder an observer showed: one that showed this entry (or
    /// nothing) keeps seeing it, since its owner may still renew it; an entry in its ttl is
    /// never left out.
    #[test]
    fn an_entry_past_its_ttl_is_left_out_only_behind_a_later_term_shown() {
        let q = |kinds: &[LockKind]| {
            let mut q = queue(kinds);
            for e in &mut q.entries {
                e.expires_ns = Some(1_000);
            }
            q.entries[0].expires_ns = Some(100);
            q.newest_ns = 500;
            q
        };
        let holders = |kinds: &[LockKind], floor| -> Vec<u64> {
            q(kinds)
                .observed(floor, true)
                .holders()
                .map(Entry::token)
                .collect()
        };
        assert_eq!(
            holders(&[X, X], None),
            [1],
            "a first look shows what the server holds"
        );
        assert_eq!(
            holders(&[X, X], Some(1)),
            [1],
            "the term shown went before its removal"
        );
        assert_eq!(
            holders(&[X, X], Some(2)),
            [2],
            "a restart's resurrected entry came back"
        );
        // Two permits held, the oldest past its ttl, a third waiting: the oldest shown stays.
        assert_eq!(holders(&[P2, P2, P2], Some(1)), [1, 2]);
        let mut recreated = queue(&[X]);
        recreated.entries[0].expires_ns = Some(1_000);
        recreated.newest_ns = 500;
        assert_eq!(
            recreated.observed(Some(9), true).entries.len(),
            1,
            "a live entry left out"
        );
    }

    /// On a single server, every entry below the oldest holder an observer showed is left
    /// out, in its ttl or without one too: a read misses no live entry, so it was removed,
    /// and came back with a restart (`distlock check`, term 6412 after 6415). A replicated
    /// stream keeps the one in its ttl.
    #[test]
    fn a_single_servers_entry_older_than_a_term_shown_is_left_out() {
        let holders = |kinds: &[LockKind], floor| -> Vec<u64> {
            let mut q = queue(kinds);
            for e in &mut q.entries {
                e.expires_ns = Some(1_000);
            }
            q.newest_ns = 500;
            q.observed(floor, false)
                .holders()
                .map(Entry::token)
                .collect()
        };
        assert_eq!(
            holders(&[X, X, X], Some(3)),
            [3],
            "brought back, in its ttl"
        );
        assert_eq!(holders(&[X, X, X], Some(1)), [1], "the term shown holds");
        assert_eq!(
            holders(&[X, X, X], None),
            [1],
            "nothing shown: what the server holds"
        );
        assert_eq!(holders(&[P2, P2, P2], Some(2)), [2, 3]);
        let mut q = queue(&[X, X]);
        q.entries[0].expires_ns = Some(1_000);
        q.newest_ns = 500;
        let replicated: Vec<u64> = q
            .observed(Some(2), true)
            .holders()
            .map(Entry::token)
            .collect();
        assert_eq!(
            replicated,
            [1],
            "a replicated stream's read may have missed it"
        );
        let no_ttl = queue(&[X, X]).observed(Some(2), false);
        assert_eq!(no_ttl.holders().map(Entry::token).collect::<Vec<_>>(), [2]);
    }

    /// The floor of a name only rises (nothing forgets it but the bound), and past the bound
    /// one name makes room for another.
    #[test]
    fn the_terms_shown_only_rise_and_are_bounded() {
        let shown = Shown::default();
        assert_eq!(shown.floor("a"), None);
        shown.saw("a", 3096);
        shown.saw("a", 3028);
        assert_eq!(shown.floor("a"), Some(3096), "went back to an older term");
        for i in 0..Shown::NAMES {
            shown.saw(&format!("n{i}"), 1);
        }
        assert_eq!(shown.names().len(), Shown::NAMES);
        shown.saw("a", 4000);
        assert_eq!(shown.names().len(), Shown::NAMES);
        assert_eq!(shown.floor("a"), Some(4000));
    }

    #[test]
    fn who_holds() {
        let q = queue(&[R, R, X, R]);
        assert_eq!(ahead(&q, 3), ["s2"]);
        assert_eq!(ahead(&q, 2), ["s0", "s1"]);
        assert_eq!(ahead(&queue(&[P2, P2, P2]), 2), ["s0", "s1"]);
        assert_eq!(
            (0..4).map(|i| q.holds(i)).collect::<Vec<_>>(),
            [true, true, false, false]
        );
        assert!(!q.admits(R), "a waiting writer queues new readers");
        assert!(queue(&[R, R]).admits(R));
        assert!(!queue(&[R]).admits(X));
        assert!(queue(&[]).admits(X));
        let p = queue(&[P2, P2, P2]);
        assert_eq!(p.holders().count(), 2);
        assert!(queue(&[P2]).admits(P2));
        assert!(!queue(&[P2, P2]).admits(P2));
    }

    #[test]
    fn removals_a_waiter_needs() {
        let needed = |q: &Queue, i: usize| q.blockers(i).1;
        let p = queue(&[P2, P2, P2, P2, P2]);
        // The third permit waits for one of the two ahead, the fifth for three of four.
        assert_eq!([needed(&p, 2), needed(&p, 3), needed(&p, 4)], [1, 2, 3]);
        assert_eq!(p.blockers(4).0.len(), 4);
        // A writer waits for everybody ahead, a reader for every writer ahead.
        let q = queue(&[X, R, X, R]);
        assert_eq!([needed(&q, 1), needed(&q, 2), needed(&q, 3)], [1, 2, 2]);
        assert_eq!(ahead(&q, 3), ["s0", "s2"]);
        // With the revisions they were read at.
        assert_eq!(q.blockers(3).0[1], ("s2".to_owned(), 3));
    }

    #[test]
    fn kinds_that_cannot_share_a_name() {
        assert!(queue(&[P2]).check_kind("n", X).is_err());
        assert!(
            queue(&[P2])
                .check_kind("n", LockKind::Permit { permits: 3 })
                .is_err()
        );
        assert!(queue(&[R, X]).check_kind("n", R).is_ok());
    }
}
