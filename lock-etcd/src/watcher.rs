//! The client's one watch stream: every wait's watch is a watch id on it.
//!
//! etcd multiplexes watches on a gRPC stream: a create request (here with a watch id the
//! client picks) registers a watch, a cancel request with that id removes it, and each
//! response names the watch it belongs to. A stream per wait made a busy client open a stream
//! per handoff (issue 22: the leader had started 9,326 watch streams after one benchmark
//! session); here one task per client owns one stream, opened when the first watch is needed,
//! and routes each response to its waiter by watch id.
//!
//! **Reconnection.** When the stream breaks (an error, its end, or a waiter that got no
//! answer to its create within [`ATTEMPT_TIMEOUT`]: a member that went silent), the task opens
//! a new one (the client's balancer picks a live member) and creates every live watch again,
//! from the revision after the last one that watch was told about: no event is missed or seen
//! twice. A start revision already compacted gets the watch cancelled, and its waiter polls
//! again. A create the server refuses outright (e.g. an auth token that expired on the stream,
//! which etcd checks against the token the stream was opened with) cancels that watch and
//! makes the next watch open a new stream. If no stream can be opened, the waiters are told
//! (`Answer::Failed`) and poll again.

use std::collections::HashMap;
use std::sync::Mutex as StdMutex;
use std::sync::atomic::{AtomicI64, Ordering};

use distlock_core::backend::unpoisoned as lock;
use etcd_client::{Client, WatchOptions, WatchResponse, WatchResponseStream};
use tokio::sync::mpsc;
use tracing::debug;

use crate::error::ATTEMPT_TIMEOUT;
use crate::members::Members;
use crate::wake::Blocker;

/// The watch stream of one client (see the module's documentation).
#[derive(Default)]
pub(crate) struct WatchHub {
    /// The task's command queue, started on first use (and again if its runtime went away).
    commands: StdMutex<Option<mpsc::UnboundedSender<Command>>>,
    /// The last watch id given out (ids are never reused on a stream).
    last_id: AtomicI64,
}

enum Command {
    Create {
        id: i64,
        blocker: Blocker,
        answers: mpsc::UnboundedSender<Answer>,
    },
    Cancel {
        id: i64,
    },
    /// The stream seems dead: open another.
    Reopen,
}

/// What the stream tells one watch's waiter.
pub(crate) enum Answer {
    /// The watch exists, from the revision after `start`.
    Created { start: i64 },
    /// Events of the watch.
    Events(WatchResponse),
    /// The server cancelled the watch (or refused to create it).
    Cancelled,
    /// No stream could be opened: the watch is gone.
    Failed,
}

/// One watch on the client's stream; cancelled on the server when dropped.
pub(crate) struct HubWatch {
    id: i64,
    commands: mpsc::UnboundedSender<Command>,
    answers: mpsc::UnboundedReceiver<Answer>,
}

impl Drop for HubWatch {
    fn drop(&mut self) {
        let _ = self.commands.send(Command::Cancel { id: self.id });
    }
}

impl HubWatch {
    /// The next answer; `None` once the client's task is gone. Cancel safe.
    pub(crate) async fn next(&mut self) -> Option<Answer> {
        self.answers.recv().await
    }

    /// Waits for the watch to be created: its start revision, or `None` if it was refused or
    /// the stream failed. Cancel safe.
    pub(crate) async fn created(&mut self) -> Option<i64> {
        loop {
            match self.next().await? {
                Answer::Created { start } => return Some(start),
                Answer::Events(_) => {}
                Answer::Cancelled | Answer::Failed => return None,
            }
        }
    }

    /// Asks for a new stream: this watch's create went unanswered.
    pub(crate) fn reopen(&self) {
        let _ = self.commands.send(Command::Reopen);
    }
}

impl WatchHub {
    /// Creates a watch of `blocker` from "now" on the client's stream (opened if needed).
    pub(crate) fn watch(&self, client: &Client, members: &Members, blocker: Blocker) -> HubWatch {
        let id = self.last_id.fetch_add(1, Ordering::Relaxed) + 1;
        let (answers_tx, answers) = mpsc::unbounded_channel();
        let mut command = Command::Create {
            id,
            blocker,
            answers: answers_tx,
        };
        let mut queue = lock(&self.commands);
        for _ in 0..2 {
            let commands = match queue.as_ref() {
                Some(commands) if !commands.is_closed() => commands.clone(),
                _ => {
                    let (tx, rx) = mpsc::unbounded_channel();
                    tokio::spawn(run(client.clone(), members.clone(), rx));
                    *queue = Some(tx.clone());
                    tx
                }
            };
            match commands.send(command) {
                Ok(()) => {
                    return HubWatch {
                        id,
                        commands,
                        answers,
                    };
                }
                Err(mpsc::error::SendError(back)) => {
                    *queue = None;
                    command = back;
                }
            }
        }
        // The task could not be started twice in a row (no runtime left): an answerless watch;
        // its waiter's poll schedule bounds the wait.
        let (commands, _) = mpsc::unbounded_channel();
        HubWatch {
            id,
            commands,
            answers,
        }
    }
}

/// A live watch, as the task knows it.
struct Live {
    blocker: Blocker,
    /// The revision to create it from again after a reconnection (0: not created yet).
    next: i64,
    /// Whether its waiter was told it is created.
    reported: bool,
    answers: mpsc::UnboundedSender<Answer>,
}

impl Live {
    fn options(&self, id: i64) -> WatchOptions {
        let options = self.blocker.options().with_watch_id(id);
        if self.next > 0 {
            options.with_start_revision(self.next)
        } else {
            options
        }
    }
}

/// What the writer sends on the stream.
enum Request {
    Create(String, WatchOptions),
    Cancel(i64),
}

/// An open stream: the writer task's queue and the responses.
struct Open {
    requests: mpsc::UnboundedSender<Request>,
    responses: WatchResponseStream,
}

impl Open {
    /// Opens a stream with every live watch, or `None` (after failing them all).
    async fn start(
        client: &Client,
        members: &Members,
        live: &mut HashMap<i64, Live>,
    ) -> Option<Self> {
        let mut ids: Vec<i64> = live.keys().copied().collect();
        ids.sort_unstable();
        let (first, rest) = ids.split_first()?;
        let first_watch = live.get(first)?;
        let key = first_watch.blocker.key.clone();
        let options = first_watch.options(*first);
        let mut watches = client.watch_client();
        let failure = match tokio::time::timeout(ATTEMPT_TIMEOUT, watches.watch(key, Some(options)))
            .await
        {
            Ok(Ok(stream)) => {
                let (mut sender, responses) = stream.split();
                let (requests, mut queue) = mpsc::unbounded_channel::<Request>();
                // Requests go through a task of their own: a send waits for the stream's flow
                // control, which must not hold up reading the responses.
                tokio::spawn(async move {
                    while let Some(request) = queue.recv().await {
                        let sent = match request {
                            Request::Create(key, options) => sender.watch(key, Some(options)).await,
                            Request::Cancel(id) => sender.cancel(id).await,
                        };
                        if sent.is_err() {
                            return;
                        }
                    }
                });
                let open = Self {
                    requests,
                    responses,
                };
                for id in rest {
                    if let Some(watch) = live.get(id) {
                        open.create(*id, watch);
                    }
                }
                return Some(open);
            }
            Ok(Err(err)) => err.to_string(),
            Err(_) => "no answer".to_owned(),
        };
        debug!(err = %failure, "cannot open the watch stream");
        members.suspect();
        for (_, watch) in live.drain() {
            let _ = watch.answers.send(Answer::Failed);
        }
        None
    }

    fn create(&self, id: i64, watch: &Live) {
        let _ = self.requests.send(Request::Create(
            watch.blocker.key.clone(),
            watch.options(id),
        ));
    }
}

/// The task of one client's watch stream. Ends when the client and all its watches are gone.
async fn run(client: Client, members: Members, mut commands: mpsc::UnboundedReceiver<Command>) {
    enum Event {
        Command(Option<Command>),
        Response(Option<WatchResponse>),
    }
    let mut live: HashMap<i64, Live> = HashMap::new();
    let mut stream: Option<Open> = None;
    loop {
        let event = match &mut stream {
            Some(open) => tokio::select! {
                command = commands.recv() => Event::Command(command),
                response = open.responses.message() => Event::Response(response.ok().flatten()),
            },
            None => Event::Command(commands.recv().await),
        };
        match event {
            Event::Command(None) => return,
            Event::Command(Some(Command::Create {
                id,
                blocker,
                answers,
            })) => {
                let watch = Live {
                    blocker,
                    next: 0,
                    reported: false,
                    answers,
                };
                if let Some(open) = &stream {
                    open.create(id, &watch);
                }
                live.insert(id, watch);
            }
            Event::Command(Some(Command::Cancel { id })) => {
                if live.remove(&id).is_some()
                    && let Some(open) = &stream
                {
                    let _ = open.requests.send(Request::Cancel(id));
                }
            }
            Event::Command(Some(Command::Reopen)) => {
                if stream.take().is_some() {
                    debug!("a watch create went unanswered: opening a new watch stream");
                    members.suspect();
                }
            }
            Event::Response(None) => {
                debug!("the watch stream failed: opening a new one");
                members.suspect();
                stream = None;
            }
            Event::Response(Some(response)) => {
                if route(response, &mut live) {
                    stream = None;
                }
            }
        }
        if stream.is_none() && !live.is_empty() {
            stream = Open::start(&client, &members, &mut live).await;
        }
    }
}

/// Hands a response to its watch's waiter; true if the stream should be replaced.
fn route(response: WatchResponse, live: &mut HashMap<i64, Live>) -> bool {
    let id = response.watch_id();
    let revision = response.header().map_or(0, |h| h.revision());
    if response.canceled() {
        let Some(watch) = live.remove(&id) else {
            return false; // one we cancelled
        };
        let _ = watch.answers.send(Answer::Cancelled);
        // Refused at creation for another reason than compaction (an expired auth token, etcd
        // checks it against the stream's): the next watch needs a new stream.
        return response.created() && response.compact_revision() == 0;
    }
    let Some(watch) = live.get_mut(&id) else {
        return false;
    };
    if response.created() {
        if watch.next == 0 {
            watch.next = revision + 1;
        }
        if !watch.reported {
            watch.reported = true;
            let _ = watch.answers.send(Answer::Created { start: revision });
        }
        return false;
    }
    let last = response
        .events()
        .last()
        .and_then(|e| e.kv().map(etcd_client::KeyValue::mod_revision));
    watch.next = watch.next.max(covered(revision, last) + 1);
    if !response.events().is_empty() {
        let _ = watch.answers.send(Answer::Events(response));
    }
    false
}

/// The last revision of a watch's changes that a response with header revision `header`
/// and last event at revision `last` (if any) has sent: the resumed watch starts after it.
/// A response with events covers its events only: etcd's catch-up of a watch far behind
/// sends at most 1,000 revisions a response with the store's current revision in its header,
/// the rest still to come (`syncWatchers`, `moreRev`), so resuming after the header would
/// skip them. A response without events (a progress report) covers its header's revision.
fn covered(header: i64, last: Option<i64>) -> i64 {
    last.unwrap_or(header)
}

#[cfg(test)]
mod tests {
    use super::covered;

    #[test]
    fn a_catch_up_batch_covers_its_events_not_its_header() {
        // Events up to 1,500 of a watch far behind, the store at 2,400: resume at 1,501.
        assert_eq!(covered(2_400, Some(1_500)), 1_500);
        assert_eq!(covered(2_400, None), 2_400);
    }
}
