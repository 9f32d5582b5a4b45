//! Aiming an ambiguous-reply fault at one operation of a worker: the operations, and how a
//! worker reports that it is about to send one and waits for the checker.

use super::*;

/// An operation of a holder's life, as an ambiguous-reply fault aims at it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Op {
    /// The next `acquire` call (a holder's: the one after its release).
    Acquire,
    /// The renewals of the lock held (aimed at before the next step of a critical section
    /// with at least ttl/2 left: the reply to at least one renewal is lost).
    Renew,
    /// The next `release` call.
    Release,
}

impl Op {
    /// Every operation, in a fixed order.
    pub const ALL: [Self; 3] = [Self::Acquire, Self::Renew, Self::Release];

    /// Its name on a worker's stdin and in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Acquire => "acquire",
            Self::Renew => "renew",
            Self::Release => "release",
        }
    }
}

/// How the checking process aims an ambiguous-reply fault at one operation of a worker: it
/// arms the worker for an [`Op`]; the worker, when it gets there, reports
/// [`Event::Aimed`] and waits (at most [`AIM_WAIT`]) until told to go on; the checker cuts the
/// worker's replies in between. So the request of exactly that operation reaches the server
/// and its reply is lost.
#[async_trait]
pub trait Aim: Send + Sync {
    /// Whether the worker is armed for `op`; disarms it.
    fn take(&self, op: Op) -> bool;

    /// Waits until the checker says go (at most [`AIM_WAIT`]).
    async fn go(&self);
}

/// How long an aimed worker waits for the checker before it goes on regardless.
pub const AIM_WAIT: Duration = Duration::from_secs(2);

/// Never aimed at: in-process workers, which have no proxy to cut.
#[derive(Debug, Default)]
pub struct NoAim;

#[async_trait]
impl Aim for NoAim {
    fn take(&self, _op: Op) -> bool {
        false
    }

    async fn go(&self) {}
}

/// The [`Aim`] of a worker process: lines on its stdin, `aim OP` (`acquire`, `renew`,
/// `release`; `aim none` disarms) and `go`. A closed stdin arms nothing.
#[derive(Debug)]
pub struct StdinAim {
    armed: std::sync::Mutex<Option<Op>>,
    go: tokio::sync::Mutex<tokio::sync::mpsc::UnboundedReceiver<()>>,
}

impl StdinAim {
    /// Starts reading the process's stdin.
    pub fn start() -> std::sync::Arc<Self> {
        use tokio::io::AsyncBufReadExt as _;
        let (go_tx, go_rx) = tokio::sync::mpsc::unbounded_channel();
        let aim = std::sync::Arc::new(Self {
            armed: std::sync::Mutex::new(None),
            go: tokio::sync::Mutex::new(go_rx),
        });
        let armed = std::sync::Arc::downgrade(&aim);
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let Some(aim) = armed.upgrade() else { return };
                match line.trim() {
                    "go" => {
                        let _ = go_tx.send(());
                    }
                    command => {
                        let op = command
                            .strip_prefix("aim ")
                            .and_then(|op| Op::ALL.into_iter().find(|o| o.as_str() == op));
                        *unpoisoned(&aim.armed) = op;
                    }
                }
            }
        });
        aim
    }
}

#[async_trait]
impl Aim for StdinAim {
    fn take(&self, op: Op) -> bool {
        let mut armed = unpoisoned(&self.armed);
        if *armed != Some(op) {
            return false;
        }
        *armed = None;
        // A `go` left over from an aim that timed out belongs to no one: dropped now, before
        // the aimed event, after which the checker's `go` may come at any time.
        if let Ok(mut go) = self.go.try_lock() {
            while go.try_recv().is_ok() {}
        }
        true
    }

    async fn go(&self) {
        let mut go = self.go.lock().await;
        let _ = tokio::time::timeout(AIM_WAIT, go.recv()).await;
    }
}

/// If `aim` is armed for `op`: reports it and waits for the checker.
pub(super) async fn aimed(aim: &dyn Aim, sink: &dyn Sink, id: u32, op: Op) {
    if aim.take(op) {
        sink.event(id, Event::Aimed { op, t: now() });
        aim.go().await;
    }
}
