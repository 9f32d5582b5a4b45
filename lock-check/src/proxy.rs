//! A TCP proxy per worker and server, to partition one worker from the server or to lose the
//! server's replies to it.
//!
//! While partitioned, the proxy forwards nothing in either direction and opens no upstream
//! connection, but keeps every socket open: the worker's requests and the server's replies
//! wait (in the proxy's sockets) as packets would in a network that drops them and retransmits,
//! and no side sees a reset. Healing forwards what waited.
//!
//! While the link is lossy, every chunk in either direction is held back before it is
//! forwarded, in order: mostly not at all, one in five by 1-20 ms (jitter), one in ten by
//! 200-600 ms (a lost segment that TCP retransmits after its minimum timeout of 200 ms). A TCP
//! stream cannot be reordered or lose bytes, so this is how loss and reordering below it reach
//! the client; the kernel's `netem` would do the same one layer down, where it is available.
//!
//! While replies are lost, the worker's requests reach the server and are carried out, but
//! every byte the server answers is dropped; when the fault heals, each connection that lost a
//! reply is closed (its byte stream has a hole), so the worker sees its request fail or time
//! out although the server did what it asked: the ambiguous reply of a real network.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What the proxy does to a worker's traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cut {
    /// Everything flows.
    Open,
    /// Nothing flows; everything waits.
    Partition,
    /// Requests flow; replies are dropped.
    Replies,
    /// Everything flows, late and unevenly.
    Lossy,
}

/// A running proxy; stops (and drops its connections) when dropped.
#[derive(Debug)]
pub struct Proxy {
    addr: SocketAddr,
    cut: Switch,
    task: JoinHandle<()>,
}

/// Turns a proxy's faults on and off; a clone may outlive the proxy (then it does nothing).
#[derive(Clone, Debug)]
pub struct Switch(Arc<watch::Sender<Cut>>);

impl Switch {
    /// Starts (`true`) or heals (`false`) the partition.
    pub fn partition(&self, on: bool) {
        self.0
            .send_replace(if on { Cut::Partition } else { Cut::Open });
    }

    /// Starts (`true`) or heals (`false`) the loss of every reply; healing closes each
    /// connection that lost one.
    pub fn lose_replies(&self, on: bool) {
        self.0
            .send_replace(if on { Cut::Replies } else { Cut::Open });
    }

    /// Starts (`true`) or heals (`false`) a lossy link: chunks held back at random, in order.
    pub fn lossy(&self, on: bool) {
        self.0.send_replace(if on { Cut::Lossy } else { Cut::Open });
    }
}

impl Proxy {
    /// Listens on a free loopback port and forwards every connection to `upstream`
    /// (`host:port`).
    ///
    /// # Errors
    /// No loopback port could be bound.
    pub async fn start(upstream: String) -> std::io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let (cut, watching) = watch::channel(Cut::Open);
        let task = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((client, _)) = listener.accept().await {
                let _ = client.set_nodelay(true);
                connections.spawn(forward(client, upstream.clone(), watching.clone()));
                while connections.try_join_next().is_some() {}
            }
        });
        Ok(Self {
            addr,
            cut: Switch(Arc::new(cut)),
            task,
        })
    }

    /// The switch of this proxy's faults.
    pub fn switch(&self) -> Switch {
        self.cut.clone()
    }

    /// The address workers connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        // Dropping the accept task drops its JoinSet, which aborts every connection.
        self.task.abort();
    }
}

async fn forward(client: TcpStream, upstream: String, cut: watch::Receiver<Cut>) {
    if flowing(&mut cut.clone()).await.is_err() {
        return;
    }
    let Ok(server) = TcpStream::connect(&upstream).await else {
        return;
    };
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    // Set once a reply was dropped: the connection is closed when the fault heals.
    let holed = Arc::new(AtomicBool::new(false));
    tokio::select! {
        () = pump(client_read, server_write, cut.clone(), false, holed.clone()) => {}
        () = pump(server_read, client_write, cut, true, holed) => {}
    }
}

/// Waits until traffic may flow (no partition); `Err` when the proxy is gone.
async fn flowing(cut: &mut watch::Receiver<Cut>) -> Result<(), watch::error::RecvError> {
    cut.wait_for(|cut| *cut != Cut::Partition).await.map(drop)
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut cut: watch::Receiver<Cut>,
    replies: bool,
    holed: Arc<AtomicBool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if flowing(&mut cut).await.is_err() {
            return;
        }
        if holed.load(Ordering::SeqCst) && *cut.borrow() == Cut::Open {
            return;
        }
        let n = tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            // A change of the fault is looked at before reading on.
            changed = cut.changed() => {
                if changed.is_err() {
                    return;
                }
                continue;
            }
        };
        // Bytes read just before a partition began are held back until it heals.
        if flowing(&mut cut).await.is_err() {
            return;
        }
        if replies && *cut.borrow() == Cut::Replies {
            holed.store(true, Ordering::SeqCst);
            continue;
        }
        if *cut.borrow() == Cut::Lossy {
            tokio::time::sleep(lag()).await;
        }
        if holed.load(Ordering::SeqCst) || to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// How long a lossy link holds one chunk back.
fn lag() -> std::time::Duration {
    use rand::Rng as _;
    let mut rng = rand::rng();
    let ms = match rng.random_range(0..10u32) {
        0 => rng.random_range(200..600),
        1 | 2 => rng.random_range(1..20),
        _ => 0,
    };
    std::time::Duration::from_millis(ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server that counts the bytes it received.
    async fn echo() -> (String, Arc<std::sync::atomic::AtomicUsize>) {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.expect("a port");
        let addr = listener.local_addr().expect("an address").to_string();
        let received = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = received.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let counted = counted.clone();
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = stream.read(&mut buf).await {
                        if n == 0 {
                            return;
                        }
                        counted.fetch_add(n, Ordering::SeqCst);
                        if stream.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (addr, received)
    }

    #[tokio::test]
    async fn a_lossy_link_delivers_everything_in_order() {
        let (upstream, _) = echo().await;
        let proxy = Proxy::start(upstream).await.expect("starts");
        proxy.switch().lossy(true);
        let mut client = TcpStream::connect(proxy.addr()).await.expect("connects");
        let sent: Vec<u8> = (0..250u8).collect();
        for chunk in sent.chunks(25) {
            client.write_all(chunk).await.expect("writes");
        }
        let mut got = vec![0u8; sent.len()];
        client.read_exact(&mut got).await.expect("echoed");
        assert_eq!(got, sent);
    }

    #[test]
    fn a_lossy_link_holds_back_one_chunk_in_ten_like_a_retransmission() {
        let lags: Vec<u128> = (0..10_000).map(|_| lag().as_millis()).collect();
        let share = |range: std::ops::Range<u128>| {
            lags.iter().filter(|ms| range.contains(ms)).count() as f64 / 10_000.0
        };
        // Binomial shares of 10,000 draws: 3 standard deviations are under 1.3 %.
        assert!((share(200..600) - 0.1).abs() < 0.02, "{}", share(200..600));
        assert!((share(1..20) - 0.2).abs() < 0.02, "{}", share(1..20));
        assert!((share(0..1) - 0.7).abs() < 0.02, "{}", share(0..1));
        assert_eq!(share(20..200) + share(600..u128::MAX), 0.0);
    }

    #[tokio::test]
    async fn lost_replies_reach_the_server_and_the_connection_closes_on_healing() {
        let (upstream, received) = echo().await;
        let proxy = Proxy::start(upstream).await.expect("starts");
        let mut client = TcpStream::connect(proxy.addr()).await.expect("connects");
        let mut buf = [0u8; 16];
        client.write_all(b"ping").await.expect("writes");
        client.read_exact(&mut buf[..4]).await.expect("echoed");
        assert_eq!(&buf[..4], b"ping");
        proxy.switch().lose_replies(true);
        client.write_all(b"lost").await.expect("writes");
        let waited =
            tokio::time::timeout(std::time::Duration::from_millis(300), client.read(&mut buf))
                .await;
        assert!(waited.is_err(), "a reply came through: {waited:?}");
        assert_eq!(
            received.load(Ordering::SeqCst),
            8,
            "the request reached the server"
        );
        proxy.switch().lose_replies(false);
        let closed = tokio::time::timeout(std::time::Duration::from_secs(5), client.read(&mut buf))
            .await
            .expect("the holed connection is closed");
        assert!(matches!(closed, Ok(0) | Err(_)), "{closed:?}");
        // A new connection works normally.
        let mut again = TcpStream::connect(proxy.addr()).await.expect("connects");
        again.write_all(b"pong").await.expect("writes");
        again.read_exact(&mut buf[..4]).await.expect("echoed");
        assert_eq!(&buf[..4], b"pong");
    }
}
