//! The fenced register: the protected resource of a run.
//!
//! It accepts a write iff its token is at least the largest token it has accepted, as a
//! storage service that honours fencing tokens would (Kleppmann's "How to do distributed
//! locking"). Equal tokens are accepted, so that one holder can write several steps; two
//! holders with one token are caught by the checker instead.
//!
//! Readers of a read-write lock read instead: a read is accepted unless a writer with a larger
//! token has written (the reader would see a newer writer's data under an older lock), and an
//! accepted read raises the token the next write needs, so that a paused former writer cannot
//! write under a reader that came after it. A multi-lock run keeps one such resource per lock.

use std::collections::HashMap;
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
    locks: HashMap<u32, Resource>,
    writes: Vec<Write>,
}

/// The fence of one lock's resource.
#[derive(Debug, Default)]
struct Resource {
    /// The largest token of any accepted access: a write needs at least this.
    largest: Option<u64>,
    /// The largest token of an accepted write: a read needs at least this.
    written: Option<u64>,
}

/// One access to the register, as a worker asks for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Access {
    /// Whose.
    pub acq: AcqId,
    /// Which lock's resource.
    pub lock: u32,
    /// The token it carries.
    pub token: u64,
    /// Which step of the critical section.
    pub step: u32,
    /// A reader's read (else a write).
    pub read: bool,
}

impl Access {
    /// A write of `step` by `acq` with `token` to lock 0's resource.
    pub fn write(acq: AcqId, token: u64, step: u32) -> Self {
        Self {
            acq,
            lock: 0,
            token,
            step,
            read: false,
        }
    }
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
        self.access_at(Access::write(acq, token, step), at)
    }

    /// Receives `access` now; returns whether it was accepted.
    pub fn access(&self, access: Access) -> bool {
        self.access_at(access, now())
    }

    /// [`access`](Self::access) at a given time (for tests and replays).
    pub fn access_at(&self, access: Access, at: Nanos) -> bool {
        let Access {
            acq,
            lock,
            token,
            step,
            read,
        } = access;
        let mut state = state(&self.state);
        let resource = state.locks.entry(lock).or_default();
        let needed = if read {
            resource.written
        } else {
            resource.largest
        };
        let accepted = needed.is_none_or(|needed| token >= needed);
        if accepted {
            resource.largest = resource.largest.max(Some(token));
            if !read {
                resource.written = Some(token);
            }
        }
        state.writes.push(Write {
            acq,
            lock,
            read,
            token,
            step,
            at,
            accepted,
        });
        accepted
    }

    /// The largest token accepted so far on lock 0's resource.
    pub fn largest(&self) -> Option<u64> {
        state(&self.state)
            .locks
            .get(&0)
            .and_then(|resource| resource.largest)
    }

    /// Every write received so far, in the order received.
    pub fn writes(&self) -> Vec<Write> {
        state(&self.state).writes.clone()
    }
}

/// Serves `register` to worker processes on a loopback TCP port until the returned task is
/// aborted. One line per access, `"<worker> <seq> <token> <step> <lock> <w|r>\n"`, answered
/// `"1\n"` (accepted) or `"0\n"` (refused); a malformed line closes that connection.
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
                    let Some(access) = parse_access(&line) else {
                        return;
                    };
                    let reply = if register.access(access) {
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

fn parse_access(line: &str) -> Option<Access> {
    let mut fields = line.split_ascii_whitespace();
    let mut number = || fields.next()?.parse::<u64>().ok();
    let (worker, seq, token, step, lock) = (number()?, number()?, number()?, number()?, number()?);
    let read = match fields.next()? {
        "r" => true,
        "w" => false,
        _ => return None,
    };
    if fields.next().is_some() {
        return None;
    }
    let acq = AcqId {
        worker: u32::try_from(worker).ok()?,
        seq,
    };
    Some(Access {
        acq,
        lock: u32::try_from(lock).ok()?,
        token,
        step: u32::try_from(step).ok()?,
        read,
    })
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
    async fn access(&self, access: Access) -> std::io::Result<bool> {
        use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
        let mut stream = self.stream.lock().await;
        let line = format!(
            "{} {} {} {} {} {}\n",
            access.acq.worker,
            access.acq.seq,
            access.token,
            access.step,
            access.lock,
            if access.read { 'r' } else { 'w' }
        );
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

    #[test]
    fn readers_are_fenced_by_writers_and_fence_late_writers() {
        let register = FencedRegister::new();
        let access = |acq, lock, token, read| Access {
            acq,
            lock,
            token,
            step: 0,
            read,
        };
        let c = AcqId { worker: 2, seq: 0 };
        assert!(register.access_at(access(A, 0, 10, false), 1), "writer 10");
        assert!(register.access_at(access(B, 0, 12, true), 2), "reader 12");
        assert!(
            register.access_at(access(c, 0, 11, true), 3),
            "an older reader still reads: no newer writer wrote"
        );
        assert!(
            !register.access_at(access(A, 0, 10, false), 4),
            "writer 10 after reader 12 came"
        );
        assert!(register.access_at(access(A, 0, 13, false), 5), "writer 13");
        assert!(
            !register.access_at(access(B, 0, 12, true), 6),
            "reader 12 after writer 13 wrote"
        );
        assert!(
            register.access_at(access(A, 1, 1, false), 7),
            "lock 1 has its own resource"
        );
        assert_eq!(register.largest(), Some(13));
    }

    #[tokio::test]
    async fn serves_worker_processes_over_tcp() {
        use crate::worker::Register as _;
        let register = std::sync::Arc::new(FencedRegister::new());
        let (addr, task) = serve(register.clone()).await.expect("a loopback port");
        let remote = RemoteRegister::connect(addr).await.expect("connects");
        assert!(
            remote
                .access(Access::write(B, 9, 0))
                .await
                .expect("answers")
        );
        assert!(
            !remote
                .access(Access::write(A, 8, 0))
                .await
                .expect("answers")
        );
        let read = Access {
            read: true,
            lock: 2,
            ..Access::write(A, 8, 0)
        };
        assert!(remote.access(read).await.expect("answers"));
        assert_eq!(register.largest(), Some(9));
        assert_eq!(register.writes()[2].lock, 2);
        assert!(register.writes()[2].read);
        assert_eq!(parse_access("1 2 3 4 0"), None);
        assert_eq!(parse_access("1 2 3 4 0 w 5"), None);
        assert_eq!(parse_access("1 2 x 4 0 w"), None);
        assert_eq!(parse_access("1 2 3 4 0 x"), None);
        assert_eq!(
            parse_access("1 2 3 4 0 r"),
            Some(Access {
                read: true,
                ..Access::write(AcqId { worker: 1, seq: 2 }, 3, 4)
            })
        );
        task.abort();
    }
}
