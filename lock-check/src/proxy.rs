//! A TCP proxy per worker and server, to partition one worker from the server.
//!
//! While partitioned, the proxy forwards nothing in either direction and opens no upstream
//! connection, but keeps every socket open: the worker's requests and the server's replies
//! wait (in the proxy's sockets) as packets would in a network that drops them and retransmits,
//! and no side sees a reset. Healing forwards what waited.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A running proxy; stops (and drops its connections) when dropped.
#[derive(Debug)]
pub struct Proxy {
    addr: SocketAddr,
    blocked: watch::Sender<bool>,
    task: JoinHandle<()>,
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
        let (blocked, watching) = watch::channel(false);
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
            blocked,
            task,
        })
    }

    /// The address workers connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Starts (`true`) or heals (`false`) the partition.
    pub fn partition(&self, on: bool) {
        self.blocked.send_replace(on);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        // Dropping the accept task drops its JoinSet, which aborts every connection.
        self.task.abort();
    }
}

async fn forward(client: TcpStream, upstream: String, blocked: watch::Receiver<bool>) {
    if open(&blocked).await.is_err() {
        return;
    }
    let Ok(server) = TcpStream::connect(&upstream).await else {
        return;
    };
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    tokio::select! {
        _ = pump(client_read, server_write, blocked.clone()) => {}
        _ = pump(server_read, client_write, blocked) => {}
    }
}

/// Waits until the partition is healed; `Err` when the proxy is gone.
async fn open(blocked: &watch::Receiver<bool>) -> Result<(), watch::error::RecvError> {
    let mut blocked = blocked.clone();
    blocked.wait_for(|on| !*on).await.map(drop)
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    blocked: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if open(&blocked).await.is_err() {
            return;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        // Bytes read just before a partition began are held back until it heals.
        if open(&blocked).await.is_err() || to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
