//! `run --upgradeable` and `run --upgradeable-write`: a command under the upgradeable
//! read-write lock, and `distlock upgrade` / `distlock downgrade`, which that command runs to
//! change its hold through the control socket `run` opens for it (`DISTLOCK_CONTROL`).
//!
//! The protocol is one line each way: `upgrade <wait in ms, or "forever">` or `downgrade`;
//! `ok <fencing token>` or `err <exit code> <message>`.

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::time::{Duration, Instant};

use distlock::{
    Error, FencingToken, LeaseView, LockGuard, LossReason, UpgradeableGuard, UpgradeableRwLock,
    WriteGuard,
};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::{UnixListener, UnixStream};

use crate::exit::{BUSY, CONFIG, Failure, LOST, OTHER, UNAVAILABLE};

/// The variable that tells the command where the control socket is.
pub(crate) const CONTROL_VARIABLE: &str = "DISTLOCK_CONTROL";

/// What a command holds while it runs.
pub(crate) enum Hold {
    /// A lock, a shared hold, a permit, a leader's term.
    One(LockGuard),
    /// The upgradeable read of an upgradeable read-write lock.
    Upgradeable(UpgradeableGuard),
    /// The write side of an upgradeable read-write lock, with its gate.
    Write(WriteGuard),
}

/// A loss signal that outlives the hold it came from.
pub(crate) type Lost = Pin<Box<dyn Future<Output = LossReason> + Send>>;

impl Hold {
    /// The hold's fencing token (for a gated hold, its hold of the name's).
    pub(crate) fn token(&self) -> FencingToken {
        self.guard().token()
    }

    /// The guard of the name itself (not a gate).
    pub(crate) fn guard(&self) -> &LockGuard {
        match self {
            Self::One(guard) => guard,
            Self::Upgradeable(held) => held.guard(),
            Self::Write(held) => held.guard(),
        }
    }

    /// The lease of the part a [`change`](Self::change) keeps throughout (for a gated hold,
    /// the gate: it keeps other writers out while the name's part is let go of and taken
    /// again), seen from outside the hold.
    pub(crate) fn kept_lease(&self) -> LeaseView {
        match self {
            Self::One(guard) => guard.lease_view(),
            Self::Upgradeable(held) => held.gate_guard().lease_view(),
            Self::Write(held) => held.gate_guard().lease_view(),
        }
    }

    /// The lease length.
    pub(crate) fn ttl(&self) -> Duration {
        self.guard().ttl()
    }

    /// Until when all of it is certainly held.
    pub(crate) fn valid_until(&self) -> Instant {
        match self {
            Self::One(guard) => guard.valid_until(),
            Self::Upgradeable(held) => held.valid_until(),
            Self::Write(held) => held.valid_until(),
        }
    }

    /// Whether any of it may be lost.
    pub(crate) fn is_lost(&self) -> bool {
        match self {
            Self::One(guard) => guard.is_lost(),
            Self::Upgradeable(held) => held.is_lost(),
            Self::Write(held) => held.is_lost(),
        }
    }

    /// Resolves when any of it is lost.
    pub(crate) fn lost(&self) -> Lost {
        match self {
            Self::One(guard) => Box::pin(guard.lost()),
            Self::Upgradeable(held) => {
                let lost = held.lost();
                Box::pin(async move { lost.await.1 })
            }
            Self::Write(held) => {
                let lost = held.lost();
                Box::pin(async move { lost.await.1 })
            }
        }
    }

    /// Keeps every part until `minimum` after it was taken (see [`LockGuard::hold_at_least`]).
    pub(crate) async fn hold_at_least(&self, minimum: Duration) {
        match self {
            Self::One(guard) => guard.hold_at_least(minimum).await,
            Self::Upgradeable(held) => held.hold_at_least(minimum).await,
            Self::Write(held) => held.hold_at_least(minimum).await,
        }
    }

    /// Releases all of it.
    ///
    /// # Errors
    /// The release's error (of the first part that failed).
    pub(crate) async fn release(self) -> Result<(), Error> {
        match self {
            Self::One(guard) => guard.release().await,
            Self::Upgradeable(held) => held.release().await,
            Self::Write(held) => held.release().await,
        }
    }

    /// Carries out `request`: the hold afterwards (`None`: nothing is held any more) and the
    /// answer for the command.
    pub(crate) async fn change(self, request: Request) -> (Option<Self>, Answer) {
        match (self, request) {
            (Self::Upgradeable(held), Request::Upgrade { wait }) => {
                match held.upgrade(wait).await {
                    Ok(write) => {
                        let token = write.token();
                        (Some(Self::Write(write)), Answer::Ok(token))
                    }
                    Err(failed) => {
                        let code = match failed.error {
                            Error::Timeout { .. } => BUSY,
                            _ if failed.guard.is_none() => LOST,
                            _ => OTHER,
                        };
                        let message = format!("{failed}: {}", failed.error);
                        (
                            failed.guard.map(Self::Upgradeable),
                            Answer::Err(code, message),
                        )
                    }
                }
            }
            (Self::Write(held), Request::Downgrade) => {
                match held.downgrade_to_upgradeable().await {
                    Ok(read) => {
                        let token = read.token();
                        (Some(Self::Upgradeable(read)), Answer::Ok(token))
                    }
                    Err(err) => (
                        None,
                        Answer::Err(LOST, format!("the downgrade failed: {err}")),
                    ),
                }
            }
            (held @ Self::Write(_), Request::Upgrade { .. }) => {
                let token = held.token();
                (Some(held), Answer::Ok(token))
            }
            (held @ Self::Upgradeable(_), Request::Downgrade) => {
                let token = held.token();
                (Some(held), Answer::Ok(token))
            }
            (held @ Self::One(_), _) => (
                Some(held),
                Answer::Err(
                    CONFIG,
                    "not an upgradeable lock: run the command with `distlock run --upgradeable` \
                     or `--upgradeable-write`"
                        .into(),
                ),
            ),
        }
    }
}

/// Takes the upgradeable read (or with `write`, the write side) of the upgradeable
/// read-write lock `name`; `Ok(None)` when the wait ran out (or, with a zero wait, it is held).
pub(crate) async fn take(
    locks: std::sync::Arc<dyn distlock::DistributedLock>,
    name: &str,
    opts: &distlock::AcquireOptions,
    write: bool,
) -> Result<Option<Hold>, Failure> {
    let context = || format!("cannot acquire {name:?}");
    let rw = UpgradeableRwLock::new(locks, name).map_err(|e| Failure::from_lock(&e, context()))?;
    let taken = match (opts.wait == Some(Duration::ZERO), write) {
        (true, false) => rw
            .try_upgradeable(opts)
            .await
            .map(|held| held.map(Hold::Upgradeable)),
        (true, true) => rw.try_write(opts).await.map(|held| held.map(Hold::Write)),
        (false, false) => rw
            .upgradeable(opts)
            .await
            .map(|h| Some(Hold::Upgradeable(h))),
        (false, true) => rw.write(opts).await.map(|h| Some(Hold::Write(h))),
    };
    match taken {
        Err(Error::Timeout { .. }) => Ok(None),
        other => other.map_err(|e| Failure::from_lock(&e, context())),
    }
}

/// A request of the command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Request {
    /// Become the writer, waiting at most this long (`None`: as long as it takes).
    Upgrade { wait: Option<Duration> },
    /// Become the upgradeable reader again.
    Downgrade,
}

impl Request {
    fn line(self) -> String {
        match self {
            Self::Upgrade { wait: Some(wait) } => format!("upgrade {}\n", wait.as_millis()),
            Self::Upgrade { wait: None } => "upgrade forever\n".into(),
            Self::Downgrade => "downgrade\n".into(),
        }
    }

    fn parse(line: &str) -> Result<Self, String> {
        let mut words = line.split_whitespace();
        match (words.next(), words.next(), words.next()) {
            (Some("downgrade"), None, None) => Ok(Self::Downgrade),
            (Some("upgrade"), Some("forever"), None) => Ok(Self::Upgrade { wait: None }),
            (Some("upgrade"), Some(ms), None) => ms
                .parse::<u64>()
                .map(|ms| Self::Upgrade {
                    wait: Some(Duration::from_millis(ms)),
                })
                .map_err(|_| format!("a bad wait in {line:?}")),
            _ => Err(format!("an unknown request {line:?}")),
        }
    }
}

/// The answer to a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    /// Done: the hold's token now.
    Ok(FencingToken),
    /// Not done: the exit code for `distlock upgrade`/`downgrade`, and why.
    Err(u8, String),
}

impl Answer {
    fn line(&self) -> String {
        match self {
            Self::Ok(token) => format!("ok {token}\n"),
            Self::Err(code, message) => format!("err {code} {}\n", message.replace('\n', " ")),
        }
    }
}

/// The control socket of one `run`, in a private directory removed when it is dropped.
pub(crate) struct Control {
    dir: PathBuf,
    path: PathBuf,
    listener: UnixListener,
}

impl Control {
    /// Opens a control socket in a new directory only this user can enter.
    pub(crate) fn open() -> Result<Self, Failure> {
        use std::os::unix::fs::DirBuilderExt as _;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let dir =
            std::env::temp_dir().join(format!("distlock-run-{}-{nanos:09}", std::process::id()));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| Failure::new(OTHER, format!("cannot create {}: {e}", dir.display())))?;
        let path = dir.join("control");
        let listener = UnixListener::bind(&path).map_err(|e| {
            let _ = std::fs::remove_dir(&dir);
            Failure::new(OTHER, format!("cannot listen on {}: {e}", path.display()))
        })?;
        Ok(Self {
            dir,
            path,
            listener,
        })
    }

    /// Where the command finds it.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The next request, with the connection to answer on (a request that does not arrive
    /// within a second, or cannot be read, is answered with an error at once).
    pub(crate) async fn next(&self) -> Option<(UnixStream, Request)> {
        let (stream, _) = self.listener.accept().await.ok()?;
        let mut reader = BufReader::new(stream);
        let mut line = String::new();
        let read = tokio::time::timeout(Duration::from_secs(1), reader.read_line(&mut line)).await;
        let mut stream = reader.into_inner();
        let request = match read {
            Ok(Ok(_)) => Request::parse(line.trim()),
            Ok(Err(err)) => Err(format!("an unreadable request: {err}")),
            Err(_) => Err("no request within a second".into()),
        };
        match request {
            Ok(request) => Some((stream, request)),
            Err(why) => {
                answer(&mut stream, &Answer::Err(CONFIG, why)).await;
                None
            }
        }
    }
}

impl Drop for Control {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// Sends `answer` (a command that went away does not hear it).
pub(crate) async fn answer(stream: &mut UnixStream, answer: &Answer) {
    let _ = stream.write_all(answer.line().as_bytes()).await;
    let _ = stream.shutdown().await;
}

/// Flags of `distlock upgrade`.
#[derive(Debug, clap::Args)]
pub(crate) struct UpgradeArgs {
    /// How long to wait for the other readers to finish (waits as long as it takes when
    /// omitted). When it runs out, the upgradeable read is kept and the exit code is 75.
    #[arg(long, value_parser = humantime::parse_duration)]
    wait: Option<Duration>,
}

/// `distlock upgrade`: asks the `run --upgradeable` this command runs under for the write
/// side; prints its fencing token.
pub(crate) async fn upgrade(args: UpgradeArgs) -> Result<u8, Failure> {
    ask(Request::Upgrade { wait: args.wait }).await
}

/// `distlock downgrade`: asks the `run` this command runs under to go back from the write
/// side to the upgradeable read; prints its fencing token.
pub(crate) async fn downgrade() -> Result<u8, Failure> {
    ask(Request::Downgrade).await
}

async fn ask(request: Request) -> Result<u8, Failure> {
    let path = std::env::var_os(CONTROL_VARIABLE).ok_or_else(|| {
        Failure::new(
            CONFIG,
            format!(
                "{CONTROL_VARIABLE} is not set: run this inside the command of \
                 `distlock run --upgradeable` or `--upgradeable-write`"
            ),
        )
    })?;
    let mut stream = UnixStream::connect(&path).await.map_err(|e| {
        Failure::new(
            UNAVAILABLE,
            format!(
                "cannot reach the distlock run at {}: {e}",
                Path::new(&path).display()
            ),
        )
    })?;
    stream
        .write_all(request.line().as_bytes())
        .await
        .map_err(|e| Failure::new(UNAVAILABLE, format!("cannot ask distlock run: {e}")))?;
    let mut line = String::new();
    BufReader::new(stream)
        .read_line(&mut line)
        .await
        .map_err(|e| Failure::new(UNAVAILABLE, format!("no answer from distlock run: {e}")))?;
    let line = line.trim();
    if let Some(token) = line.strip_prefix("ok ") {
        crate::out::line(token)?;
        return Ok(0);
    }
    let mut words = line.splitn(3, ' ');
    match (
        words.next(),
        words.next().and_then(|c| c.parse::<u8>().ok()),
        words.next(),
    ) {
        (Some("err"), Some(code), message) => {
            Err(Failure::new(code, message.unwrap_or("refused").to_owned()))
        }
        _ => Err(Failure::new(
            UNAVAILABLE,
            "distlock run went away without an answer (was its lock lost?)",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_read_back_as_written() {
        for request in [
            Request::Upgrade { wait: None },
            Request::Upgrade {
                wait: Some(Duration::from_millis(1500)),
            },
            Request::Downgrade,
        ] {
            assert_eq!(Request::parse(request.line().trim()), Ok(request));
        }
        for bad in ["", "upgrade", "upgrade soon", "downgrade now", "unlock"] {
            assert!(Request::parse(bad).is_err(), "{bad:?}");
        }
    }
}
