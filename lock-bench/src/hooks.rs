//! A backend's hooks for the harness, declared once in its crate's `bench` module: its raw
//! floors and its server's own request counter, and the small I/O helpers those counters
//! share.

use std::future::Future;
use std::time::Duration;

use distlock_core::Error;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::{ContendedFloorFuture, FloorFuture, ServerCounterFuture, Target};

/// Opens a raw floor for a URL.
pub type FloorFn = fn(String) -> FloorFuture;
/// Opens a contended floor for a URL.
pub type ContendedFloorFn = fn(String) -> ContendedFloorFuture;
/// Opens a server counter reader for a URL.
pub type ServerCounterFn = fn(String) -> ServerCounterFuture;
/// Whether a server counter can read the servers of a URL.
pub type ReadsFn = fn(&str) -> bool;

/// What one backend offers the harness beside its clients. Each backend crate's `bench`
/// module declares one per URL scheme family (next to its `Descriptor`), and the facade's
/// registry hands them to `distlock bench`, which calls [`Target::with_hooks`].
///
/// ```
/// use distlock_bench::{BenchHooks, Target};
///
/// const NONE: BenchHooks = BenchHooks::new();
/// let target = Target::memory().with_hooks(&NONE, "memory://", false);
/// assert!(target.has_floor()); // the in-memory target's own floor stays
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct BenchHooks {
    floor: Option<FloorFn>,
    fenced_floor: Option<FloorFn>,
    contended_floor: Option<ContendedFloorFn>,
    fenced_contended_floor: Option<ContendedFloorFn>,
    server_counter: Option<(ReadsFn, ServerCounterFn)>,
}

impl BenchHooks {
    /// No hooks.
    #[must_use]
    pub const fn new() -> Self {
        Self {
            floor: None,
            fenced_floor: None,
            contended_floor: None,
            fenced_contended_floor: None,
            server_counter: None,
        }
    }

    /// The raw floor (see [`Target::with_floor`]).
    #[must_use]
    pub const fn with_floor(mut self, floor: FloorFn) -> Self {
        self.floor = Some(floor);
        self
    }

    /// The fenced raw floor, measured with `--fenced-floor` (see
    /// [`Target::with_fenced_floor`]).
    #[must_use]
    pub const fn with_fenced_floor(mut self, floor: FloorFn) -> Self {
        self.fenced_floor = Some(floor);
        self
    }

    /// The server's own blocking lock as S2's floor (see [`Target::with_contended_floor`]).
    #[must_use]
    pub const fn with_contended_floor(mut self, floor: ContendedFloorFn) -> Self {
        self.contended_floor = Some(floor);
        self
    }

    /// The fenced contended floor, measured with `--fenced-floor` (see
    /// [`Target::with_fenced_contended_floor`]).
    #[must_use]
    pub const fn with_fenced_contended_floor(mut self, floor: ContendedFloorFn) -> Self {
        self.fenced_contended_floor = Some(floor);
        self
    }

    /// The server's request counter, for the URLs that `reads` accepts (a counter may need
    /// what some URLs do not give: plain TCP, a whitelisted command).
    #[must_use]
    pub const fn with_server_counter(mut self, reads: ReadsFn, counter: ServerCounterFn) -> Self {
        self.server_counter = Some((reads, counter));
        self
    }
}

impl Target {
    /// Registers what `hooks` offers for `url`: the floors (the fenced ones with `fenced`) and
    /// the server counter when it can read that URL's servers.
    #[must_use]
    pub fn with_hooks(mut self, hooks: &BenchHooks, url: &str, fenced: bool) -> Self {
        if let Some(floor) = hooks.floor {
            self = self.with_floor(opener(floor, url));
        }
        if let Some(floor) = hooks.fenced_floor.filter(|_| fenced) {
            self = self.with_fenced_floor(opener(floor, url));
        }
        if let Some(floor) = hooks.contended_floor {
            self = self.with_contended_floor(opener(floor, url));
        }
        if let Some(floor) = hooks.fenced_contended_floor.filter(|_| fenced) {
            self = self.with_fenced_contended_floor(opener(floor, url));
        }
        if let Some((reads, counter)) = hooks.server_counter
            && reads(url)
        {
            self = self.with_server_counter(opener(counter, url));
        }
        self
    }
}

/// A factory that calls `open` with `url`.
fn opener<T: 'static>(open: fn(String) -> T, url: &str) -> impl Fn() -> T + Send + Sync + 'static {
    let url = url.to_owned();
    move || open(url.clone())
}

/// How long one read of a server counter may take.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// An error of a server counter or floor, saying what failed (`what`: a host, a query).
pub fn probe_error(what: &str, detail: impl std::fmt::Display) -> Error {
    Error::Backend {
        message: format!("{what}: {detail}"),
        source: None,
    }
}

/// `fut`, failing after 10 s; errors name `what`.
///
/// # Errors
/// The I/O error, or a time-out.
pub async fn timed<T>(
    what: &str,
    fut: impl Future<Output = std::io::Result<T>>,
) -> Result<T, Error> {
    match tokio::time::timeout(READ_TIMEOUT, fut).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(probe_error(what, e)),
        Err(_) => Err(probe_error(what, "timed out")),
    }
}

/// Connects to `host` (`host:port`), sends `request`, reads until the server closes: one
/// ZooKeeper four-letter word, one HTTP/1.0 request.
///
/// # Errors
/// The connection's error, or a time-out (10 s per step).
pub async fn exchange(host: &str, request: &[u8]) -> Result<String, Error> {
    let mut conn = timed(host, TcpStream::connect(host)).await?;
    timed(host, conn.write_all(request)).await?;
    let mut reply = Vec::new();
    timed(host, conn.read_to_end(&mut reply)).await?;
    Ok(String::from_utf8_lossy(&reply).into_owned())
}

/// The body (with the headers) of `GET path` on `host` (`host:port`), plain HTTP/1.0: an etcd
/// member's `/metrics`.
///
/// # Errors
/// As [`exchange`].
pub async fn http_get(host: &str, path: &str) -> Result<String, Error> {
    exchange(
        host,
        format!("GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n").as_bytes(),
    )
    .await
}

/// The user info (`user:password`, if any) and the `host:port` list of a URL's authority,
/// `default_port` for a host without one.
#[must_use]
pub fn url_hosts(url: &str, default_port: u16) -> (Option<String>, Vec<String>) {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    let (auth, list) = match authority.rsplit_once('@') {
        Some((auth, list)) => (Some(auth.to_owned()), list),
        None => (None, authority),
    };
    let hosts = list
        .split(',')
        .filter(|h| !h.is_empty())
        .map(|h| {
            if h.contains(':') {
                h.to_owned()
            } else {
                format!("{h}:{default_port}")
            }
        })
        .collect();
    (auth, hosts)
}

#[cfg(test)]
mod tests {
    use super::url_hosts;

    #[test]
    fn hosts_come_from_the_authority() {
        assert_eq!(
            url_hosts("redlock://u:p@a:1,b,c:3/0?x=y", 6379),
            (
                Some("u:p".to_owned()),
                vec!["a:1".to_owned(), "b:6379".to_owned(), "c:3".to_owned()]
            )
        );
        assert_eq!(
            url_hosts("zk://127.0.0.1:2181/chroot", 2181),
            (None, vec!["127.0.0.1:2181".to_owned()])
        );
    }
}
