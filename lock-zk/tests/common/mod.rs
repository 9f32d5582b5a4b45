//! Shared test helpers: the ZooKeeper harness, a cuttable TCP proxy, services.sh hooks.
#![allow(
    dead_code,
    unreachable_pub,
    reason = "each test binary uses a part of the shared helpers"
)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use conformance_tests::{Harness, HookError, HookResult, TestClient};
use distlock_core::{ClientConfig, Error, LockClient, LockName};
use distlock_zookeeper::zookeeper_client as zk;
use distlock_zookeeper::{ZkBackend, ZkConfig};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

pub const OP_TIMEOUT: Duration = Duration::from_secs(2);

/// A name no other test (or test run) uses: `what` and a random suffix.
pub fn unique(what: &str) -> String {
    format!("{what}-{}", &uuid::Uuid::new_v4().simple().to_string()[..8])
}
/// Long enough for the suite's 30 s ttls (the longest ttl is the session timeout).
pub const SESSION_TIMEOUT: Duration = Duration::from_secs(30);

/// A TCP proxy in front of the server whose live connections can be cut.
pub struct Proxy {
    pub port: u16,
    /// While set, new connections are closed at once (a network partition).
    blocked: Arc<std::sync::atomic::AtomicBool>,
    conns: Arc<Mutex<Vec<JoinHandle<()>>>>,
    accept: JoinHandle<()>,
}

impl Proxy {
    pub async fn start(target: String) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let conns: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let blocked: Arc<std::sync::atomic::AtomicBool> = Arc::default();
        let tracked = conns.clone();
        let refuse = blocked.clone();
        let accept = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if refuse.load(std::sync::atomic::Ordering::SeqCst) {
                    drop(inbound);
                    continue;
                }
                let target = target.clone();
                let task = tokio::spawn(async move {
                    if let Ok(mut outbound) = TcpStream::connect(&target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                let mut conns = tracked.lock().unwrap();
                conns.retain(|t| !t.is_finished());
                conns.push(task);
            }
        });
        Ok(Self {
            port,
            blocked,
            conns,
            accept,
        })
    }

    /// Partitions (`true`) or heals (`false`) the path through the proxy: while partitioned,
    /// live connections are cut and new ones closed at once.
    pub fn partition(&self, on: bool) {
        self.blocked.store(on, std::sync::atomic::Ordering::SeqCst);
        if on {
            self.cut();
        }
    }

    /// Closes every connection open through the proxy (new ones are accepted).
    pub fn cut(&self) -> usize {
        let conns: Vec<_> = self.conns.lock().unwrap().drain(..).collect();
        let live = conns.iter().filter(|t| !t.is_finished()).count();
        for task in conns {
            task.abort();
        }
        live
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

/// `scripts/services.sh stop-one|start-one zookeeper`.
pub async fn service(action: &str) -> Result<(), String> {
    conformance_tests::services(action, "zookeeper").await
}

/// Digest credentials of a test URL (`zk://user:password@...`).
#[derive(Clone)]
pub struct Creds {
    pub user: String,
    pub password: String,
}

impl Creds {
    pub fn of_url(url: &str) -> Option<Self> {
        let parsed = distlock_core::service_url::ServiceUrl::parse(url).expect("a valid URL");
        Some(Self {
            user: parsed.username()?.to_owned(),
            password: parsed.password()?.to_owned(),
        })
    }
}

/// A raw client (the harness's admin, or a foreign one in the tests) with these credentials.
pub async fn raw_client(server: &str, creds: Option<&Creds>) -> zk::Client {
    let mut connector = zk::Client::connector();
    if let Some(creds) = creds {
        connector = connector.with_auth(
            "digest",
            format!("{}:{}", creds.user, creds.password).as_bytes(),
        );
    }
    connector
        .connect(server)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to ZooKeeper at {server}: {e}"))
}

/// Clients of one ZooKeeper server (or ensemble), each through its own proxies (one per
/// server), all under one chroot.
pub struct ZkHarness {
    /// The first server (the admin's, and direct backends').
    pub server: String,
    /// Every server of the ensemble (just `server` for a standalone one).
    pub servers: Vec<String>,
    /// The services.sh names `stop_server` stops, in order (standalone: the one server;
    /// ensemble: two of three, so that the quorum is lost).
    pub outage: Vec<&'static str>,
    pub chroot: String,
    pub admin: zk::Client,
    /// The credentials of every client, the admin's too.
    pub creds: Option<Creds>,
    /// TLS files of every client but the admin (which uses the plain port).
    pub tls: Option<distlock_core::tls::TlsFiles>,
    /// [`Harness::many_locks`].
    pub many_locks: usize,
    /// [`Harness::slack`].
    pub slack: Duration,
    proxies: Mutex<HashMap<String, Vec<Proxy>>>,
}

impl ZkHarness {
    /// The harness of a `zk://user:password@host:port` URL, whose server services.sh calls
    /// `service`.
    pub async fn with_url(url: &str, service: &'static str) -> Self {
        let config = ZkConfig::from_url(url).expect("a valid ZooKeeper URL");
        let mut harness = Self::connect(&config.hosts()[0], Creds::of_url(url)).await;
        harness.outage = vec![service];
        harness
    }

    /// The harness of a `zks://user:password@host:port?ca=...` URL: the clients connect over
    /// TLS, the admin client over the same server's plain port (`plain_url`).
    pub async fn with_tls_url(url: &str, plain_url: &str, service: &'static str) -> Self {
        let config = ZkConfig::from_url(url).expect("a valid ZooKeeper URL");
        let plain = ZkConfig::from_url(plain_url).expect("a valid ZooKeeper URL");
        let mut harness = Self::connect(&plain.hosts()[0], Creds::of_url(url)).await;
        harness.server = config.hosts()[0].clone();
        harness.servers = vec![harness.server.clone()];
        harness.tls = config.tls().cloned();
        harness.outage = vec![service];
        // TLS costs the Java server CPU on every request (the 2-core test machine also runs the
        // client and, in CI, other builds): 200 locks renewed every ttl/3 (600 writes/s) fell
        // behind there when other cases ran alongside; 100 keeps the case meaningful.
        harness.many_locks = 100;
        harness.slack = Duration::from_secs(1);
        harness
    }

    pub async fn new(server: &str) -> Self {
        Self::connect(server, None).await
    }

    /// The harness of a 3-server ensemble (`h1:p1,h2:p2,h3:p3`, services.sh names
    /// `zk-ensemble-1..3`): every client connects to all servers (each through its own proxy),
    /// the admin and direct backends too, and `stop_server` stops two servers (quorum lost).
    pub async fn ensemble(connect: &str) -> Self {
        let servers: Vec<String> = connect
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect();
        let mut harness = Self::connect(connect, None).await;
        harness.admin = raw_client(&servers.join(","), None).await;
        harness.server = servers.join(",");
        harness.servers = servers;
        harness.outage = vec!["zk-ensemble-3", "zk-ensemble-2"];
        // Every write goes through the leader's quorum (two fsyncs on the 2-core machine).
        harness.many_locks = 100;
        harness.slack = Duration::from_secs(1);
        harness
    }

    async fn connect(server: &str, creds: Option<Creds>) -> Self {
        // A child process of a conformance case uses its parent's chroot.
        let chroot = conformance_tests::child::inherited()
            .filter(|chroot| !chroot.is_empty())
            .unwrap_or_else(|| {
                let run = uuid::Uuid::new_v4().simple().to_string();
                format!("/distlock-test/{}", &run[..8])
            });
        let server = server.split(',').next().unwrap_or(server).trim().to_owned();
        let admin = raw_client(&server, creds.as_ref()).await;
        Self {
            servers: vec![server.clone()],
            outage: vec!["zookeeper"],
            server,
            chroot,
            admin,
            creds,
            tls: None,
            many_locks: 200,
            slack: Duration::from_millis(750),
            proxies: Mutex::default(),
        }
    }

    pub fn config(&self, host: &str) -> ZkConfig {
        let config = ZkConfig::new(&format!("{host}{}", self.chroot))
            .expect("valid connect string")
            .with_session_timeout(SESSION_TIMEOUT);
        let config = match &self.creds {
            Some(creds) => config
                .with_digest_auth(&creds.user, &creds.password)
                .expect("valid credentials"),
            None => config,
        };
        match &self.tls {
            Some(files) => config.with_tls(files.clone()).expect("valid TLS files"),
            None => config,
        }
    }

    /// A backend connected directly (no proxy).
    pub async fn backend(&self) -> Result<LockClient<ZkBackend>, Error> {
        distlock_zookeeper::connect_with(self.config(&self.server), client_config()).await
    }

    /// A backend connected through a new proxy, returned with the proxy's tag.
    pub async fn proxied(&self) -> Result<(LockClient<ZkBackend>, String), Error> {
        self.proxied_with_session(SESSION_TIMEOUT).await
    }

    /// As [`proxied`](Self::proxied), with its own session timeout.
    pub async fn proxied_with_session(
        &self,
        session_timeout: Duration,
    ) -> Result<(LockClient<ZkBackend>, String), Error> {
        let mut proxies = Vec::new();
        for server in &self.servers {
            proxies.push(
                Proxy::start(server.clone())
                    .await
                    .map_err(|e| Error::unavailable("starting the test proxy", e))?,
            );
        }
        let tag = format!("proxy-{}", proxies[0].port);
        let hosts: Vec<String> = proxies
            .iter()
            .map(|p| format!("127.0.0.1:{}", p.port))
            .collect();
        let config = self
            .config(&hosts.join(","))
            .with_session_timeout(session_timeout);
        let client = distlock_zookeeper::connect_with(config, client_config()).await?;
        self.proxies.lock().unwrap().insert(tag.clone(), proxies);
        Ok((client, tag))
    }

    /// Partitions or heals the proxy `tag` (see [`Proxy::partition`]).
    pub fn partition(&self, tag: &str, on: bool) {
        if let Some(proxies) = self.proxies.lock().unwrap().get(tag) {
            for proxy in proxies {
                proxy.partition(on);
            }
        }
    }

    /// Closes every connection of the client `tag` (to any server); the number closed.
    pub fn cut(&self, tag: &str) -> Option<usize> {
        self.proxies
            .lock()
            .unwrap()
            .get(tag)
            .map(|proxies| proxies.iter().map(Proxy::cut).sum())
    }

    /// The lock node of `name`.
    pub fn lock_path(&self, name: &str) -> String {
        self.config(&self.server)
            .lock_path(&LockName::new(name).expect("valid name"))
    }

    /// Creates a queue node of `name` in the admin's session (which stays alive), as an
    /// exclusive attempt tagged `tag` would, with `data` (its mark and lease, as `W500`);
    /// its path.
    pub async fn stray_node(&self, name: &str, tag: &str, data: &[u8]) -> String {
        let (_, seq) = self
            .admin
            .create(
                &format!("{}/{tag}.", self.lock_path(name)),
                data,
                &zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all()),
            )
            .await
            .unwrap_or_else(|e| panic!("creating a {tag} node of {name:?}: {e}"));
        format!("{}/{tag}.{seq}", self.lock_path(name))
    }

    /// Resolves once `name` has no queue node left (watch-driven, no polling).
    pub async fn drained(&self, name: &str) {
        self.queue_when(name, 0).await;
    }

    /// The queue of `name` once it has `len` nodes, lowest sequence first (watch-driven, no
    /// polling).
    pub async fn queue_when(&self, name: &str, len: usize) -> Vec<String> {
        let path = self.lock_path(name);
        loop {
            let watcher = match self.admin.list_and_watch_children(&path).await {
                Ok((children, _)) if children.len() == len => return by_sequence(children),
                Ok((_, watcher)) => watcher,
                Err(zk::Error::NoNode) if len == 0 => return Vec::new(),
                // No lock node yet: wait for its creation.
                Err(zk::Error::NoNode) => match self.admin.check_and_watch_stat(&path).await {
                    Ok((None, watcher)) => watcher,
                    Ok((Some(_), _)) => continue, // created meanwhile: list again
                    Err(e) => panic!("watching the lock node of {name:?}: {e}"),
                },
                Err(e) => panic!("watching the queue of {name:?}: {e}"),
            };
            watcher.changed().await;
        }
    }

    /// The queue of `name`, lowest sequence first. On an ensemble the admin's server may be a
    /// follower that has not applied the clients' latest writes yet: a `sync` first makes it
    /// catch up with the leader.
    pub async fn queue(&self, name: &str) -> Vec<String> {
        if let Err(e) = self.admin.sync("/").await {
            panic!("syncing before listing {name:?}: {e}");
        }
        match self.admin.list_children(&self.lock_path(name)).await {
            Ok(children) => by_sequence(children),
            Err(zk::Error::NoNode) => Vec::new(),
            Err(e) => panic!("listing {name:?}: {e}"),
        }
    }
}

fn by_sequence(mut children: Vec<String>) -> Vec<String> {
    children.sort_by_key(|c| c.rsplit_once('.').map(|(_, s)| s.to_owned()));
    children
}

pub fn client_config() -> ClientConfig {
    ClientConfig::default().with_operation_timeout(OP_TIMEOUT)
}

#[async_trait]
impl Harness for ZkHarness {
    async fn client(&self) -> Result<TestClient, Error> {
        let (client, tag) = self.proxied().await?;
        Ok(TestClient {
            lock: client.into_dyn(),
            tag,
        })
    }

    /// Several renewal round trips long, short enough to keep the suite quick.
    fn ttl(&self) -> Duration {
        Duration::from_secs(1)
    }

    /// fsync'ed writes on a shared 2-core machine: a few ms typical, tens at p99.
    fn slack(&self) -> Duration {
        self.slack
    }

    fn operation_timeout(&self) -> Duration {
        OP_TIMEOUT
    }

    fn process_shared(&self) -> Option<String> {
        Some(self.chroot.clone())
    }

    /// Each held lock is renewed (one fsync'ed write per multi of 500) every ttl/3.
    fn many_locks(&self) -> usize {
        self.many_locks
    }

    /// 6 s for thousands of locks: the first renewal round of the earliest locks must not
    /// wait behind the acquisition of the last ones, and a renewal round (20 multis of 500
    /// writes, one session) must answer within two thirds of the ttl on a loaded machine. At
    /// 3 s, one multi missed its deadline in a CI run with the four conformance lanes at once
    /// ("500 of 10000 locks were lost while renewed (ConnectionLost first)").
    fn many_locks_ttl(&self) -> Duration {
        if self.many_locks > 1000 {
            Duration::from_secs(6)
        } else {
            self.ttl()
        }
    }

    async fn remove_lock(&self, name: &str) -> HookResult {
        let queue = self.queue(name).await;
        let Some(head) = queue.first() else {
            return Err(HookError::Failed(format!("{name:?} has no holder node")));
        };
        self.admin
            .delete(&format!("{}/{head}", self.lock_path(name)), None)
            .await
            .map_err(|e| HookError::Failed(format!("deleting {head}: {e}")))
    }

    async fn cut_connection(&self, client: &TestClient) -> HookResult {
        match self.cut(&client.tag) {
            Some(n) if n > 0 => Ok(()),
            Some(_) => Err(HookError::Failed(
                "the client had no open connection".into(),
            )),
            None => Err(HookError::Failed(format!("no proxy {:?}", client.tag))),
        }
    }

    async fn stop_server(&self) -> HookResult {
        for name in &self.outage {
            conformance_tests::services("stop-one", name)
                .await
                .map_err(HookError::Failed)?;
        }
        Ok(())
    }

    async fn start_server(&self) -> HookResult {
        let mut result = Ok(());
        for name in &self.outage {
            if let Err(e) = conformance_tests::services("start-one", name).await {
                result = Err(HookError::Failed(e));
            }
        }
        result
    }
}

/// The `mntr` figures of the server at `server` (`host:port`; a four-letter word whitelisted
/// by scripts/services.sh).
pub async fn mntr(server: &str) -> HashMap<String, i64> {
    distlock_bench::exchange(server, b"mntr")
        .await
        .expect("read mntr")
        .lines()
        .filter_map(|line| {
            let (key, value) = line.split_once('\t')?;
            Some((key.to_owned(), value.trim().parse().ok()?))
        })
        .collect()
}
