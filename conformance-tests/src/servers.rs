//! Servers of a test's own, next to the shared ones of `scripts/services.sh`: for tests that
//! kill their server, give it a password or put it on a Unix socket.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `redis-server` (installed by `scripts/services.sh`) without persistence, killed on drop.
#[derive(Debug)]
pub struct OwnRedis {
    child: Child,
    port: u16,
    socket: Option<PathBuf>,
}

impl OwnRedis {
    /// Starts one on a free TCP port of 127.0.0.1 with the extra `args`
    /// (e.g. `["--requirepass", "pw"]`) and waits until it accepts connections.
    ///
    /// # Panics
    /// When redis-server cannot be started or does not listen within 10 s.
    pub fn start(args: &[&str]) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let server = Self::spawn(&["--port", &port.to_string()], args, port, None);
        server.wait_until(|| std::net::TcpStream::connect(("127.0.0.1", port)).is_ok());
        server
    }

    /// Starts one listening on the Unix socket `socket` only.
    ///
    /// # Panics
    /// As [`OwnRedis::start`].
    pub fn start_on_socket(socket: &Path) -> Self {
        let path = socket.to_string_lossy();
        let server = Self::spawn(
            &["--port", "0", "--unixsocket", &path],
            &[],
            0,
            Some(socket.to_owned()),
        );
        server.wait_until(|| std::os::unix::net::UnixStream::connect(socket).is_ok());
        server
    }

    fn spawn(listen: &[&str], args: &[&str], port: u16, socket: Option<PathBuf>) -> Self {
        let child = Command::new("redis-server")
            .args(listen)
            .args(["--save", "", "--appendonly", "no"])
            .args(args)
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server (scripts/services.sh installs it)");
        Self {
            child,
            port,
            socket,
        }
    }

    fn wait_until(&self, ready: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !ready() {
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The TCP port (0 for a socket-only server).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT`, or `redis+unix:///SOCKET` for a socket-only server.
    pub fn url(&self) -> String {
        match &self.socket {
            Some(socket) => format!("redis+unix://{}", socket.display()),
            None => format!("redis://127.0.0.1:{}", self.port),
        }
    }

    /// Kills the server now (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        self.kill();
    }
}
