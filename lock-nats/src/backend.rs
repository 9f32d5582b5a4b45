//! The NATS backend: the connection, the bucket's stream, the writes of the protocol, and the
//! [`LockBackend`] implementation.

use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;
use std::time::Instant;

use async_nats::jetstream::message::PublishMessage as Publish;
use async_nats::jetstream::{self, stream};
use async_trait::async_trait;
use distlock_core::backend::{
    AcquireRequest, Attempt, Contended, LockBackend, LockInfo, held_among, unpoisoned,
};
use distlock_core::{
    Capabilities, Error, FencingGuarantee, FencingToken, Footprint, LockKind, LockName,
    LossDetection, Result, WakeUp,
};
use futures::stream::BoxStream;

use crate::NatsConfig;
use crate::attempt::NatsAttempt;
use crate::error::{Written, backend_msg, not_found, request, subject_busy, written};
use crate::keys::{Bucket, EntryValue, NameKeys, Slots};
use crate::kinds::{Entry, Queue, Shown, entry_of};
use crate::renew::NatsRenewer;

/// The shortest ttl: JetStream's per-message ttl counts whole seconds (a ttl is sent rounded
/// up, so the server never ends a lease before the client's deadline).
pub const MIN_TTL: Duration = Duration::from_secs(1);

/// The longest ttl.
pub const MAX_TTL: Duration = Duration::from_secs(24 * 3600);

/// The most permits of a semaphore (every waiter reads the whole queue of its name).
pub const MAX_PERMITS: u32 = 256;

/// How long the server keeps the marker of a removed entry (its own ttl).
const MARKER_TTL: Duration = Duration::from_secs(1);

/// How much longer than the entry's ttl the marker of a holder removed behind its owner's
/// back stays (see `NatsBackend::remove_holders`): beyond the owner's drift margin, and past
/// the server's removal of an entry it brought back.
const REMOVED_MARGIN: Duration = Duration::from_secs(3);

/// How long a client reads queues without direct gets after one went unanswered (see
/// [`BackendState::direct_off_until`]).
const DIRECT_PAUSE: Duration = Duration::from_secs(60);

/// The oldest server with per-message ttls and their expiry markers.
const MIN_SERVER: (u64, u64) = (2, 11);

/// What every part of the backend shares: the connection and the bucket.
#[derive(Debug)]
pub(crate) struct BackendState {
    pub(crate) client: async_nats::Client,
    pub(crate) js: jetstream::Context,
    pub(crate) stream: stream::Stream,
    pub(crate) bucket: Bucket,
    pub(crate) renewer: Arc<NatsRenewer>,
    /// The keys this client reuses, per name.
    pub(crate) slots: Arc<Slots>,
    /// The names whose attempts of this client had to wait lately: where a read of the queue
    /// is one request ([`BackendState::reads_direct`]), the next attempt there subscribes to
    /// the name's events before it reads the queue (see `NatsAttempt::poll_wait`), and an
    /// attempt elsewhere only once a read says it must wait.
    pub(crate) waited: Contended,
    /// This client's tag: its key of a name is `<name>.<tag>`.
    pub(crate) tag: String,
    /// The bucket's stream has replicas: a clustered stream gives a write its sequence when
    /// it proposes it, so a write expecting the range's last revision can pass while a
    /// lower-sequence write of the range is still being proposed (conformance on the R3
    /// cluster: token 11 granted before 10). Writes that decide from an earlier read are
    /// checked by a read after them there.
    pub(crate) replicated: bool,
    /// The bucket's stream answers batched direct gets, which a waiter's read of its queue
    /// uses ([`Queue::read_behind`](crate::kinds::Queue::read_behind)): a single-server
    /// stream with `allow_direct` (every single-server bucket this version creates), read
    /// at connect.
    pub(crate) direct: bool,
    /// Until when direct reads are off: [`DIRECT_PAUSE`] after a direct get not answered by
    /// the stream itself (no responder: the stream was edited since; another stream's answer:
    /// a mirror that serves direct gets; no answer in time: a user not allowed to send it, a
    /// request lost in a reconnect); the reads then take the stream's info and a get per key,
    /// as without.
    pub(crate) direct_off_until: Mutex<Option<Instant>>,
    /// The operation timeout, every request's (half of it the direct read's).
    pub(crate) timeout: Duration,
    /// The terms [`inspect`](LockBackend::inspect) has shown, per name: what
    /// [`Queue::observed`] judges an older entry by.
    pub(crate) shown: Shown,
}

/// What a key holds now.
#[derive(Debug)]
pub(crate) enum Key {
    /// No message.
    Empty,
    /// The marker of a removal, at this revision.
    Marker(u64),
    /// A live entry.
    Live(Entry),
}

/// The `Nats-TTL` header of a lease of `ttl`: whole seconds, rounded up.
pub(crate) fn ttl_header(ttl: Duration) -> String {
    let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    secs.max(1).to_string()
}

impl BackendState {
    /// Whether a waiter's read may be a batched direct get (see [`BackendState::direct`]).
    pub(crate) fn reads_direct(&self) -> bool {
        self.direct
            && unpoisoned(&self.direct_off_until).is_none_or(|until| Instant::now() >= until)
    }

    /// Turns the direct reads off for [`DIRECT_PAUSE`], because `why` (a warning, unless
    /// they were off already).
    pub(crate) fn no_direct(&self, why: &str) {
        let now = Instant::now();
        let mut off = unpoisoned(&self.direct_off_until);
        if off.is_none_or(|until| now >= until) {
            tracing::warn!(
                stream = %self.bucket.stream,
                "NATS: {why}; reading queues without direct gets for {DIRECT_PAUSE:?}"
            );
        }
        *off = Some(now + DIRECT_PAUSE);
    }

    /// [`Error::Unavailable`] at once while the connection is down (the client reconnects in
    /// the background): a request sent now would wait for its whole timeout.
    pub(crate) fn connected(&self) -> Result<()> {
        match self.client.connection_state() {
            async_nats::connection::State::Connected => Ok(()),
            state => Err(Error::Unavailable {
                message: format!("NATS: not connected ({state:?}), reconnecting"),
                source: None,
            }),
        }
    }

    /// Waits until the connection is up (at once when it is), at most the operation
    /// timeout, then answers as [`Self::connected`]: for a release, which should reach a
    /// server that comes back meanwhile rather than fail at once and leave the lock held for
    /// a whole ttl. Only the connection: a replicated stream may still have no leader. While
    /// the client reconnects its connection task takes no command, so a flush queued then is
    /// answered once it is connected again: no polling. Nothing is sent (cancel safe).
    pub(crate) async fn reconnected(&self) -> Result<()> {
        if self.connected().is_err() {
            // A flush that fails (the client closed) or times out leaves the state to say so.
            let _ = tokio::time::timeout(self.timeout, self.client.flush()).await;
        }
        self.connected()
    }

    /// A write of `value` with a ttl, stored only if its subject's last revision is
    /// `expected` (0: the subject has none), or with `range`, only if the last revision of
    /// the whole range (every key of the name) is.
    pub(crate) fn put(
        value: &EntryValue,
        ttl: Duration,
        expected: u64,
        range: Option<&str>,
    ) -> Publish {
        within(
            Publish::build()
                .payload(value.encode())
                .header("Nats-TTL", ttl_header(ttl).as_str())
                .expected_last_subject_sequence(expected),
            range,
        )
    }

    /// Sends `publish` to `subject` and waits for its acknowledgement.
    pub(crate) async fn send(
        &self,
        what: &str,
        subject: &str,
        publish: Publish,
    ) -> Result<Written> {
        self.connected()?;
        // A clustered stream refuses a write expecting a revision while an earlier write of
        // the subject is still being proposed (10164): it was not stored, send it again.
        let mut pause = Duration::from_millis(2);
        loop {
            let result = match self
                .js
                .send_publish(subject.to_owned(), publish.clone())
                .await
            {
                Ok(ack) => ack.await.map(|ack| ack.sequence),
                Err(err) => Err(err),
            };
            match result {
                Err(err) if subject_busy(&err) && pause < Duration::from_millis(100) => {
                    tokio::time::sleep(pause).await;
                    pause *= 2;
                }
                result => return written(what, result),
            }
        }
    }

    /// Removes the entry at `subject` if its last revision is `expected` (with `range`: if
    /// the range's is), leaving a purge marker that expires by itself.
    pub(crate) async fn purge(
        &self,
        subject: &str,
        expected: u64,
        range: Option<&str>,
    ) -> Result<Written> {
        self.purge_leaving(subject, expected, range, MARKER_TTL)
            .await
    }

    /// [`Self::purge`], its marker kept `marker_ttl`.
    pub(crate) async fn purge_leaving(
        &self,
        subject: &str,
        expected: u64,
        range: Option<&str>,
        marker_ttl: Duration,
    ) -> Result<Written> {
        let publish = Publish::build()
            .header("KV-Operation", "PURGE")
            .header("Nats-Rollup", "sub")
            .header("Nats-TTL", ttl_header(marker_ttl).as_str())
            .expected_last_subject_sequence(expected);
        self.send("purge", subject, within(publish, range)).await
    }

    /// Removes whatever is at `subject`, leaving a purge marker that expires by itself: for
    /// an attempt's own subject only.
    pub(crate) async fn purge_any(&self, subject: &str) -> Result<Written> {
        let publish = Publish::build()
            .header("KV-Operation", "PURGE")
            .header("Nats-Rollup", "sub")
            .header("Nats-TTL", ttl_header(MARKER_TTL).as_str());
        self.send("purge", subject, publish).await
    }

    /// What the key at `subject` holds now.
    pub(crate) async fn key(&self, subject: &str) -> Result<Key> {
        self.connected()?;
        match self.stream.get_last_raw_message_by_subject(subject).await {
            Ok(message) => Ok(match entry_of(&message)? {
                Some(entry) => Key::Live(entry),
                None => Key::Marker(message.sequence),
            }),
            Err(err) if not_found(&err.kind()) => Ok(Key::Empty),
            Err(err) => Err(request("read", err)),
        }
    }

    /// The entry at `subject` now, if there is one (a marker is none).
    pub(crate) async fn entry(&self, subject: &str) -> Result<Option<Entry>> {
        Ok(match self.key(subject).await? {
            Key::Live(entry) => Some(entry),
            Key::Empty | Key::Marker(_) => None,
        })
    }
}

/// `publish` with its expected last revision checked on `range` (a wildcard subject) instead
/// of its own subject.
fn within(publish: Publish, range: Option<&str>) -> Publish {
    match range {
        Some(range) => publish.header("Nats-Expected-Last-Subject-Sequence-Subject", range),
        None => publish,
    }
}

/// Connects to the servers of `config`, checks the server's version, and opens (or creates)
/// the bucket.
pub(crate) async fn open(config: &NatsConfig, timeout: Duration) -> Result<Arc<BackendState>> {
    let options = config.connect_options(timeout).await?;
    let at = config.hosts();
    let client = tokio::time::timeout(timeout, options.connect(config.server_urls()))
        .await
        .map_err(|_| Error::Unavailable {
            message: format!("NATS at {at}: no server answered within {timeout:?}"),
            source: None,
        })?
        .map_err(|err| crate::error::connect(&at, err))?;
    check_version(&client)?;
    // Every JetStream request (a write's acknowledgement, a read) within the operation timeout.
    let mut js = jetstream::new(client.clone());
    js.set_timeout(timeout);
    let bucket = Bucket::new(config.bucket());
    let (stream, replicated, direct) = open_stream(&js, &bucket, config.replicas()).await?;
    Ok(Arc::new(BackendState {
        renewer: Arc::new(NatsRenewer::new(js.clone())),
        client,
        js,
        stream,
        bucket,
        slots: Arc::default(),
        waited: Contended::default(),
        tag: crate::keys::new_tag(),
        replicated,
        direct,
        direct_off_until: Mutex::new(None),
        shown: Shown::default(),
        timeout,
    }))
}

fn check_version(client: &async_nats::Client) -> Result<()> {
    let info = client.server_info();
    let mut parts = info
        .version
        .split(['.', '-'])
        .map(|p| p.parse::<u64>().unwrap_or(0));
    let version = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    if version < MIN_SERVER {
        return Err(Error::Unsupported(format!(
            "NATS server {} is too old: locks need per-message ttls (server {}.{} or newer)",
            info.version, MIN_SERVER.0, MIN_SERVER.1
        )));
    }
    if !info.jetstream {
        return Err(Error::Unsupported(format!(
            "NATS server {} has JetStream disabled: start it with -js",
            info.server_name
        )));
    }
    Ok(())
}

/// The bucket's stream: a KV bucket (one message per key, rollups; direct gets on a single
/// server only, so that every read of a replicated stream is the leader's) with per-message
/// ttls, expiry markers, and its messages' headers republished for wake-ups.
fn stream_config(bucket: &Bucket, replicas: u8) -> stream::Config {
    stream::Config {
        name: bucket.stream.clone(),
        subjects: vec![format!("{}>", bucket.kv_prefix)],
        max_messages_per_subject: 1,
        discard: stream::DiscardPolicy::New,
        allow_rollup: true,
        deny_delete: true,
        allow_direct: replicas == 1,
        allow_message_ttl: true,
        subject_delete_marker_ttl: Some(MARKER_TTL),
        storage: stream::StorageType::File,
        num_replicas: usize::from(replicas),
        republish: Some(stream::Republish {
            source: format!("{}>", bucket.kv_prefix),
            destination: format!("{}>", bucket.events_prefix),
            headers_only: true,
        }),
        description: Some("distlock locks".into()),
        ..Default::default()
    }
}

async fn open_stream(
    js: &jetstream::Context,
    bucket: &Bucket,
    replicas: u8,
) -> Result<(stream::Stream, bool, bool)> {
    let wanted = stream_config(bucket, replicas);
    let mut stream = match js.get_stream(&bucket.stream).await {
        Ok(stream) => stream,
        Err(_) => js
            .get_or_create_stream(wanted.clone())
            .await
            .map_err(|err| request(&format!("creating bucket {}", bucket.name), err))?,
    };
    let info = stream
        .info()
        .await
        .map_err(|err| request(&format!("bucket {}", bucket.name), err))?;
    let have = &info.config;
    let usable = have.allow_message_ttl
        && have.max_messages_per_subject == 1
        && have.allow_rollup
        && have.republish.as_ref().map(|r| &r.destination)
            == wanted.republish.as_ref().map(|r| &r.destination);
    if !usable {
        return Err(backend_msg(format!(
            "NATS bucket {} exists but is not a distlock bucket (it needs one message per key, \
             rollups, per-message ttls and a republish to {}>): use another bucket",
            bucket.name, bucket.events_prefix
        )));
    }
    if have.storage != stream::StorageType::File {
        // A stream kept in memory starts again at sequence 1 when its servers restart: the
        // tokens would go back, and a late write of a paused former holder pass the fence.
        return Err(Error::Unsupported(format!(
            "NATS bucket {} keeps its messages in memory, so a restart would restart its \
             sequences (the fencing tokens): use a bucket on file storage",
            bucket.name
        )));
    }
    let replicated = have.num_replicas > 1;
    let direct = !replicated && have.allow_direct;
    Ok((stream, replicated, direct))
}

/// The NATS JetStream backend. Create it with [`connect`](crate::connect).
#[derive(Debug, Clone)]
pub struct NatsBackend {
    pub(crate) state: Arc<BackendState>,
}

impl NatsBackend {
    /// Purges the holders of `name`, or only the one of `(owner, token)`, each with a
    /// compare-and-set on the revision read; those renewed in between are read again (up to
    /// 8 rounds). Whether any was purged.
    ///
    /// Behind its owner's back: each purge's marker outlives the entry's ttl (by the
    /// server's clock) by [`REMOVED_MARGIN`]. While it stands, the owner's renewals (a
    /// compare-and-set on the entry's revision) are refused, so the owner learns of the loss
    /// before its lease ends; a single server killed and restarted brings back removed keys
    /// whose markers are gone (see `Queue::observed`), and with a marker gone before the
    /// entry's end, the owner's next renewal was stored beside the next holder.
    async fn remove_holders(
        &self,
        name: &LockName,
        only: Option<(&str, FencingToken)>,
    ) -> Result<bool> {
        self.state.reconnected().await?;
        let keys = NameKeys::new(&self.state.bucket, name.as_str());
        let mut removed = false;
        for _ in 0..8 {
            let queue = Queue::read(&self.state, &keys).await?;
            let mut again = false;
            let chosen = queue.holders().filter(|e| {
                only.is_none_or(|(owner, token)| {
                    *e.value.owner == *owner && e.token() == token.get()
                })
            });
            for holder in chosen {
                let left = holder.expires_ns.map_or(MAX_TTL, |end| {
                    let longest = i128::try_from(MAX_TTL.as_nanos()).unwrap_or(i128::MAX);
                    let left = (end - queue.newest_ns).clamp(0, longest);
                    Duration::from_nanos(u64::try_from(left).unwrap_or(u64::MAX))
                });
                let marker = left + REMOVED_MARGIN;
                let purged = self
                    .state
                    .purge_leaving(&holder.subject, holder.rev, None, marker)
                    .await?;
                match purged {
                    Written::Stored(_) => removed = true,
                    Written::Conflict => again = true,
                }
            }
            if !again {
                return Ok(removed);
            }
        }
        Ok(removed)
    }

    /// Connects as [`connect`](crate::connect) does, without the lock client around it.
    ///
    /// # Errors
    /// As [`connect`](crate::connect).
    pub async fn connect(config: &NatsConfig, timeout: Duration) -> Result<Self> {
        Ok(Self {
            state: open(config, timeout).await?,
        })
    }

    /// The application's connection this backend uses.
    pub fn client(&self) -> &async_nats::Client {
        &self.state.client
    }

    /// The subject range of `name`'s entries (`$KV.<bucket>.<escaped name>.>`), for tools and
    /// tests that look at the bucket directly.
    pub fn key_range(&self, name: &str) -> String {
        NameKeys::new(&self.state.bucket, name).range
    }

    /// The subjects of the bucket's keys (held, waited for, or the markers of removed ones).
    async fn subjects(&self) -> Result<Vec<String>> {
        use futures::TryStreamExt;
        let filter = format!("{}>", self.state.bucket.kv_prefix);
        let mut subjects = self
            .state
            .stream
            .info_with_subjects(filter)
            .await
            .map_err(|err| request("listing keys", err))?;
        let mut out = Vec::new();
        while let Some((subject, _count)) = subjects
            .try_next()
            .await
            .map_err(|err| request("listing keys", err))?
        {
            out.push(subject);
        }
        Ok(out)
    }

    /// The names with keys in the bucket, sorted.
    async fn names(&self) -> Result<Vec<String>> {
        let mut names: Vec<String> = self
            .subjects()
            .await?
            .iter()
            .filter_map(|s| self.state.bucket.name_of(s))
            .collect();
        names.sort();
        names.dedup();
        Ok(names)
    }
}

#[async_trait]
impl LockBackend for NatsBackend {
    fn name(&self) -> &'static str {
        "nats"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(FencingGuarantee::Linearizable)
            .with_fifo(true)
            .with_wake_up(WakeUp::Event)
            .with_ttl_range(MIN_TTL, MAX_TTL)
            .with_loss_detection(LossDetection::Renewal)
            .with_list(true)
            .with_force_release(true)
            .with_release_hold(true)
            .with_holder_data(true)
            .with_shared(true)
            .with_max_permits(MAX_PERMITS)
    }

    fn begin(&self, request: AcquireRequest) -> Box<dyn Attempt> {
        Box::new(NatsAttempt::new(self.state.clone(), request))
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        let keys = NameKeys::new(&self.state.bucket, name.as_str());
        let queue = Queue::read(&self.state, &keys).await?;
        let queue = queue.observed(self.state.shown.floor(name.as_str()), self.state.replicated);
        let holders: Vec<&Entry> = queue.holders().collect();
        // Entries are in first-revision (token) order: the first holder is the oldest.
        let (Some(oldest), Some(latest)) = (holders.first(), holders.last()) else {
            return Ok(None);
        };
        self.state.shown.saw(name.as_str(), oldest.token());
        let kind = latest.value.kind;
        let info = LockInfo::new(
            latest.value.owner.clone(),
            Some(FencingToken::new(latest.token())),
            None,
        )
        .with_data(latest.value.data.clone());
        let count = u32::try_from(holders.len()).unwrap_or(u32::MAX);
        Ok(Some(if kind == LockKind::Exclusive {
            info
        } else {
            info.with_holders(kind, count)
        }))
    }

    async fn list(&self, prefix: Option<&str>, limit: usize) -> Result<Vec<(LockName, LockInfo)>> {
        let names = self
            .names()
            .await?
            .into_iter()
            .filter(|n| prefix.is_none_or(|p| n.starts_with(p)))
            .filter_map(|n| LockName::new(n).ok())
            .collect::<Vec<_>>();
        held_among(self, names, limit).await
    }

    /// Purges every holder's entry, each with a compare-and-set on the revision read; a
    /// holder renewed in between (a newer revision) is read again, up to 8 times.
    async fn force_release(&self, name: &LockName) -> Result<bool> {
        self.remove_holders(name, None).await
    }

    /// As [`force_release`](LockBackend::force_release), for the one holder entry whose value
    /// carries `owner` and whose first revision (its token) is `token`.
    async fn release_hold(
        &self,
        name: &LockName,
        owner: &str,
        token: FencingToken,
    ) -> Result<bool> {
        self.remove_holders(name, Some((owner, token))).await
    }

    async fn footprint(&self, prefix: &str) -> Result<Option<Footprint>> {
        let n = self
            .subjects()
            .await?
            .iter()
            .filter_map(|s| self.state.bucket.name_of(s))
            .filter(|n| n.starts_with(prefix))
            .count();
        Ok(Some(
            Footprint::new("keys").with("entries and markers", n as u64),
        ))
    }

    fn watch(&self, name: &LockName) -> Option<BoxStream<'static, ()>> {
        let keys = NameKeys::new(&self.state.bucket, name.as_str());
        Some(crate::wake::events(self.state.client.clone(), keys.events))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_round_up_to_whole_seconds() {
        assert_eq!(ttl_header(Duration::from_millis(1)), "1");
        assert_eq!(ttl_header(Duration::from_millis(1000)), "1");
        assert_eq!(ttl_header(Duration::from_millis(1001)), "2");
        assert_eq!(ttl_header(Duration::from_secs(30)), "30");
    }

    /// A bucket made as distlock makes its own but kept in memory (by an operator, or a
    /// tool) is refused: its sequences, the tokens, would start again at 1 after a restart.
    #[tokio::test]
    async fn a_bucket_kept_in_memory_is_refused() {
        let Some(url) = conformance_tests::server_var("nats", "DISTLOCK_TEST_NATS_URL") else {
            return;
        };
        let name = format!("memory-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
        let config = NatsConfig::from_url(&url)
            .and_then(|c| c.with_bucket(&name))
            .expect("NATS URL");
        let timeout = Duration::from_secs(5);
        let client = config
            .connect_options(timeout)
            .await
            .expect("options")
            .connect(config.server_urls())
            .await
            .expect("connect");
        let js = jetstream::new(client);
        let bucket = Bucket::new(config.bucket());
        let mut memory = stream_config(&bucket, 1);
        memory.storage = stream::StorageType::Memory;
        js.create_stream(memory)
            .await
            .expect("the stream in memory");
        let refused = open(&config, timeout).await.map(|_| ());
        js.delete_stream(&bucket.stream).await.expect("clean up");
        match refused {
            Err(Error::Unsupported(message)) => {
                assert!(message.contains("in memory"), "{message}");
            }
            other => panic!("a bucket in memory: {other:?}"),
        }
        // The same bucket on file storage opens.
        open(&config, timeout)
            .await
            .expect("a bucket on file storage");
        js.delete_stream(&bucket.stream).await.expect("clean up");
    }
}
