//! The fenced register: the protected resource of a run.
//!
//! It accepts a write iff its token is at least the largest token it has accepted, as a
//! storage service that honours fencing tokens would (Kleppmann's "How to do distributed
//! locking"). Equal tokens are accepted, so that one holder can write several steps; two
//! holders with one token are caught by the checker instead.

use std::sync::Mutex;

use distlock_core::backend::unpoisoned as state;

use crate::history::{AcqId, Nanos, Write, now};

/// A register that accepts writes in token order and records every write it receives.
#[derive(Debug, Default)]
pub struct FencedRegister {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    largest: Option<u64>,
    writes: Vec<Write>,
}

impl FencedRegister {
    /// An empty register.
    pub fn new() -> Self {
        Self::default()
    }

    /// Receives a write of `step` by `acq` carrying `token`, now; returns whether it was
    /// accepted.
    pub fn write(&self, acq: AcqId, token: u64, step: u32) -> bool {
        self.write_at(acq, token, step, now())
    }

    /// [`write`](Self::write) at a given time (for tests and replays).
    pub fn write_at(&self, acq: AcqId, token: u64, step: u32, at: Nanos) -> bool {
        let mut state = state(&self.state);
        let accepted = state.largest.is_none_or(|largest| token >= largest);
        if accepted {
            state.largest = Some(token);
        }
        state.writes.push(Write {
            acq,
            token,
            step,
            at,
            accepted,
        });
        accepted
    }

    /// The largest token accepted so far.
    pub fn largest(&self) -> Option<u64> {
        state(&self.state).largest
    }

    /// Every write received so far, in the order received.
    pub fn writes(&self) -> Vec<Write> {
        state(&self.state).writes.clone()
    }
}

/// Serves `register` to worker processes on a loopback TCP port until the returned task is
/// aborted. One line per write, `"<worker> <seq> <token> <step>\n"`, answered `"1\n"`
/// (accepted) or `"0\n"` (refused); a malformed line closes that connection.
///
/// # Errors
/// No loopback port could be bound.
pub async fn serve(
    register: std::sync::Arc<FencedRegister>,
) -> std::io::Result<(std::net::SocketAddr, tokio::task::JoinHandle<()>)> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
    let addr = listener.local_addr()?;
    let task = tokio::spawn(async move {
        let mut connections = tokio::task::JoinSet::new();
        while let Ok((stream, _)) = listener.accept().await {
            let _ = stream.set_nodelay(true);
            let register = register.clone();
            connections.spawn(async move {
                let (read, mut write) = stream.into_split();
                let mut lines = BufReader::new(read).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    let Some((acq, token, step)) = parse_write(&line) else {
                        return;
                    };
                    let reply = if register.write(acq, token, step) {
                        b"1\n"
                    } else {
                        b"0\n"
                    };
                    if write.write_all(reply).await.is_err() {
                        return;
                    }
                }
            });
            while connections.try_join_next().is_some() {}
        }
    });
    Ok((addr, task))
}

fn parse_write(line: &str) -> Option<(AcqId, u64, u32)> {
    let mut fields = line.split_ascii_whitespace().map(str::parse::<u64>);
    let (worker, seq, token, step) = (
        fields.next()?.ok()?,
        fields.next()?.ok()?,
        fields.next()?.ok()?,
        fields.next()?.ok()?,
    );
    if fields.next().is_some() {
        return None;
    }
    let acq = AcqId {
        worker: u32::try_from(worker).ok()?,
        seq,
    };
    Some((acq, token, u32::try_from(step).ok()?))
}

/// A worker process's connection to the register served by [`serve`].
#[derive(Debug)]
pub struct RemoteRegister {
    stream: tokio::sync::Mutex<tokio::io::BufStream<tokio::net::TcpStream>>,
}

impl RemoteRegister {
    /// Connects to the register at `addr`.
    ///
    /// # Errors
    /// The connection failed.
    pub async fn connect(addr: std::net::SocketAddr) -> std::io::Result<Self> {
        let stream = tokio::net::TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Self {
            stream: tokio::sync::Mutex::new(tokio::io::BufStream::new(stream)),
        })
    }
}

#[async_trait::async_trait]
impl crate::worker::Register for RemoteRegister {
    async fn write(&self, acq: AcqId, token: u64, step: u32) -> std::io::Result<bool> {
        use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
        let mut stream = self.stream.lock().await;
        let line = format!("{} {} {token} {step}\n", acq.worker, acq.seq);
        stream.write_all(line.as_bytes()).await?;
        stream.flush().await?;
        let mut reply = String::new();
        stream.read_line(&mut reply).await?;
        match reply.as_str() {
            "1\n" => Ok(true),
            "0\n" => Ok(false),
            _ => Err(std::io::Error::other(format!(
                "the register answered {reply:?}"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: AcqId = AcqId { worker: 0, seq: 0 };
    const B: AcqId = AcqId { worker: 1, seq: 0 };

    #[test]
    fn accepts_in_token_order_and_refuses_older_tokens() {
        let register = FencedRegister::new();
        assert!(register.write_at(A, 5, 0, 1));
        assert!(
            register.write_at(A, 5, 1, 2),
            "one holder writes several steps"
        );
        assert!(register.write_at(B, 7, 0, 3));
        assert!(
            !register.write_at(A, 5, 2, 4),
            "a late write of an older holder"
        );
        assert_eq!(register.largest(), Some(7));
        let accepted: Vec<bool> = register.writes().iter().map(|w| w.accepted).collect();
        assert_eq!(accepted, [true, true, true, false]);
    }

    #[tokio::test]
    async fn serves_worker_processes_over_tcp() {
        use crate::worker::Register as _;
        let register = std::sync::Arc::new(FencedRegister::new());
        let (addr, task) = serve(register.clone()).await.expect("a loopback port");
        let remote = RemoteRegister::connect(addr).await.expect("connects");
        assert!(remote.write(B, 9, 0).await.expect("answers"));
        assert!(!remote.write(A, 8, 0).await.expect("answers"));
        assert_eq!(register.largest(), Some(9));
        assert_eq!(parse_write("1 2 3"), None);
        assert_eq!(parse_write("1 2 3 4 5"), None);
        assert_eq!(parse_write("1 2 x 4"), None);
        task.abort();
    }
}
