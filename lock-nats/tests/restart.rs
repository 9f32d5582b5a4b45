//! A single server killed (SIGKILL) and restarted on its data brings back, for a moment,
//! keys released in the seconds before, once their purge markers' 1 s ttl has removed the
//! markers: the released key is read again, with its last write, until its ttl's removal runs
//! once more (nats-server 2.15; `distlock check`, restart fault: an election's observer
//! showed term 6412 after 6415). An observer that showed a newer term must not show such a
//! key's older one; a holder removed behind its owner's back must not come back for the owner
//! to renew it. The server is restarted: this binary runs alone on it (scripts/test.sh
//! runs a backend crate's binaries other than its conformance suite one after another).

use std::time::Duration;

use conformance_tests::{server_var, services};
use distlock_core::{AcquireOptions, ClientConfig, DistributedLock, LockClient};
use distlock_nats::{NatsBackend, NatsConfig};

/// How many times the scene is played at most until a restart brings a key back.
const ROUNDS: usize = 4;

/// Taken by each test for its whole scene: one restarts the server in the middle of another's.
static SERVER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The server's turn (see [`SERVER`]) and its configuration on a bucket of its own named
/// after `what`; `None` with no server.
async fn turn(what: &str) -> Option<(tokio::sync::MutexGuard<'static, ()>, NatsConfig)> {
    let url = server_var("nats", "DISTLOCK_TEST_NATS_URL")?;
    let turn = SERVER.lock().await;
    let bucket = format!("{what}-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let config = NatsConfig::from_url(&url)
        .and_then(|c| c.with_bucket(&bucket))
        .expect("NATS URL");
    Some((turn, config))
}

/// A new client, or `None` while the server is away.
async fn try_client(config: &NatsConfig) -> Option<LockClient<NatsBackend>> {
    let options = ClientConfig::default().with_operation_timeout(Duration::from_secs(2));
    distlock_nats::connect_with(config.clone(), options)
        .await
        .ok()
}

async fn client(config: &NatsConfig) -> LockClient<NatsBackend> {
    try_client(config).await.expect("connect")
}

/// The token an inspection of `name` shows, if any; an error while the server is away.
async fn shown(client: &LockClient<NatsBackend>, name: &str) -> distlock_core::Result<Option<u64>> {
    Ok(client
        .inspect(name)
        .await?
        .and_then(|i| i.token)
        .map(|t| t.get()))
}

/// Two holds released, a third held and shown by the observer, then the server killed and
/// restarted: for the brought-back keys' ttl, the observer never shows an older term, while
/// a new client (one that has shown nothing) reading beside it sees one: the restart did
/// bring a key back while the observer read (else the round proves nothing and is played
/// again). The ttl (6 s) leaves the restart time to come back before the keys expire.
#[tokio::test]
async fn an_observer_never_shows_a_term_a_restart_brought_back() {
    let Some((_turn, config)) = turn("restart").await else {
        return;
    };
    let ttl = Duration::from_secs(6);
    let opts = AcquireOptions::default().with_ttl(ttl);
    for round in 0..ROUNDS {
        let name = format!("observed-{round}");
        let observer = client(&config).await;
        // A client each: a client's next acquisition of a name reuses its released key.
        for _ in 0..2 {
            let guard = client(&config)
                .await
                .acquire(&name, &opts)
                .await
                .expect("acquire");
            guard.release().await.expect("release");
        }
        let holder = client(&config).await;
        let held = holder.acquire(&name, &opts).await.expect("hold");
        let term = held.token().get();
        assert_eq!(
            shown(&observer, &name).await.ok().flatten(),
            Some(term),
            "the holder shown"
        );
        // Past the purge markers' 1 s ttl: the restart brings back keys whose markers are
        // gone (without this wait, 9 rounds of 9 brought nothing back; with it, the first
        // round of each of 7 runs).
        tokio::time::sleep(Duration::from_millis(1500)).await;
        services("restart-one", "nats").await.expect("restart");
        let (mut brought_back, mut holder_shown) = (None, false);
        let end = tokio::time::Instant::now() + ttl;
        while tokio::time::Instant::now() < end {
            // An error: the server is away, or the observer not reconnected yet.
            if let Ok(token) = shown(&observer, &name).await {
                if let Some(token) = token {
                    assert!(
                        token >= term,
                        "round {round}: the observer showed term {token} after term {term}"
                    );
                    holder_shown |= token == term;
                }
                if brought_back.is_none()
                    && let Some(fresh) = try_client(&config).await
                {
                    brought_back = shown(&fresh, &name)
                        .await
                        .ok()
                        .flatten()
                        .filter(|&t| t < term);
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Hiding every holder would pass the check above: the live one must show.
        assert!(
            holder_shown,
            "round {round}: the live holder {term} never shown after the restart"
        );
        drop(held);
        if let Some(token) = brought_back {
            eprintln!("round {round}: the restart brought back term {token} (held: {term})");
            return;
        }
        eprintln!("round {round}: the restart brought nothing back; played again");
    }
    panic!("no restart of {ROUNDS} brought a released key back: nothing was judged");
}

/// A holder removed behind its back (`force_release`) and the lock granted to a waiter, then
/// the server killed and restarted: the removed key must not come back for its owner's next
/// renewal to be stored beside the new holder (with the removal's marker gone after 1 s, it
/// did: the owner renewed and held on). The owner must learn of its loss while the new holder
/// holds. The ttl (15 s) puts the owner's first renewal (at 5 s) after the restart.
#[tokio::test]
async fn a_holder_removed_behind_its_back_stays_removed_across_a_restart() {
    let Some((_turn, config)) = turn("forced").await else {
        return;
    };
    let ttl = Duration::from_secs(15);
    let opts = AcquireOptions::default().with_ttl(ttl);
    let started = tokio::time::Instant::now();
    let owner = client(&config).await;
    let held = owner.acquire("forced", &opts).await.expect("hold");
    let waiter = client(&config).await;
    let next = tokio::spawn({
        let opts = opts.clone();
        async move { waiter.acquire("forced", &opts).await }
    });
    // Queued (its entry written) well within this.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!next.is_finished(), "the waiter did not wait");
    let admin = client(&config).await;
    assert!(
        admin.force_release("forced").await.expect("force"),
        "nothing removed"
    );
    let next = next
        .await
        .expect("the waiter's task")
        .expect("the next holder");
    // Past the 1 s marker a release leaves: then the restart brought removed keys back.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    services("restart-one", "nats").await.expect("restart");
    let end = started + ttl * 4 / 5;
    while !held.is_lost() {
        assert!(
            tokio::time::Instant::now() < end,
            "the removed owner still holds {:?} in, beside the next holder (lost: {})",
            started.elapsed(),
            next.is_lost()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!next.is_lost(), "the next holder lost its lock");
    next.release().await.expect("release");
}

/// The NATS server stopped with `SIGSTOP` (its connections stay open, nothing answers) until
/// dropped, which sends `SIGCONT`.
struct Hung(String);

impl Hung {
    /// Stops the test server, whose pid `scripts/services.sh` recorded.
    fn stop() -> Self {
        let dir = std::env::var("DISTLOCK_SERVICES_DIR").unwrap_or_else(|_| {
            concat!(env!("CARGO_MANIFEST_DIR"), "/../target/services").to_owned()
        });
        let pid = std::fs::read_to_string(format!("{dir}/run/nats.pid")).expect("the pid file");
        let hung = Self(pid.trim().to_owned());
        hung.signal("-STOP");
        hung
    }

    fn signal(&self, signal: &str) {
        let status = std::process::Command::new("kill")
            .args([signal, &self.0])
            .status()
            .expect("kill");
        assert!(status.success(), "kill {signal} {}", self.0);
    }
}

impl Drop for Hung {
    fn drop(&mut self) {
        self.signal("-CONT");
    }
}

/// What the server goes through while a waiter gives up.
#[derive(Clone, Copy)]
enum Outage {
    /// Stopped, then started again 0.5 s later: the client knows it is disconnected.
    Stopped,
    /// Hung for 3 s (see [`Hung`]): the connection looks up, no answer comes.
    Hung,
}

/// A waiter (ttl 30 s) gives up (its acquire dropped) during `outage`; once the server
/// answers again and the holder releases, another client's `try_acquire` must take the name
/// within 10 s: the abandoned entry was removed, not left for its ttl ahead of every later
/// acquisition.
async fn an_abandoned_waiter_leaves_after(outage: Outage, name: &str) {
    let Some((_turn, config)) = turn(name).await else {
        return;
    };
    let opts = AcquireOptions::default().with_ttl(Duration::from_secs(30));
    let holder = client(&config).await;
    let held = holder.acquire(name, &opts).await.expect("hold");
    let waiter = client(&config).await;
    let waiting = tokio::spawn({
        let (opts, name) = (opts.clone(), name.to_owned());
        async move { waiter.acquire(&name, &opts).await.map(|_| ()) }
    });
    // Queued (its entry written) well within this.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!waiting.is_finished(), "the waiter did not wait");
    match outage {
        Outage::Stopped => {
            services("stop-one", "nats").await.expect("stop");
            waiting.abort();
            let _ = waiting.await;
            tokio::time::sleep(Duration::from_millis(500)).await;
            services("start-one", "nats").await.expect("start");
        }
        Outage::Hung => {
            let hung = Hung::stop();
            waiting.abort();
            let _ = waiting.await;
            // Past the core's limit on the abandon (the operation timeout, 2 s).
            tokio::time::sleep(Duration::from_secs(3)).await;
            drop(hung);
        }
    }
    let end = tokio::time::Instant::now() + Duration::from_secs(10);
    while shown(&holder, name).await.is_err() {
        assert!(
            tokio::time::Instant::now() < end,
            "the holder never got an answer"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    held.release().await.expect("release");
    let next = client(&config).await;
    let end = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(Some(guard)) = next.try_acquire(name, &opts).await {
            guard.release().await.expect("release");
            break;
        }
        assert!(
            tokio::time::Instant::now() < end,
            "the abandoned waiter's entry still ahead 10 s after the server answered again"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The server stopped: the abandon's removal failed at once, and its error ended the
/// abandon (the entry stayed).
#[tokio::test]
async fn a_waiter_abandoned_while_the_server_is_down_leaves_once_it_is_back() {
    an_abandoned_waiter_leaves_after(Outage::Stopped, "left").await;
}

/// The server hung: the abandon's removal got no answer before the core dropped the abandon
/// at its limit, but it was sent, and the server stores it once it answers again.
#[tokio::test]
async fn a_waiter_abandoned_while_the_server_hangs_leaves_once_it_answers() {
    an_abandoned_waiter_leaves_after(Outage::Hung, "hung").await;
}

/// A renewal due while the server is down is not kept to be sent once the client has
/// reconnected: the holder may have let the lock go by then (here its release failed, the
/// server away for the whole operation timeout), and such a renewal stored the entry again for a whole ttl from its landing,
/// ahead of every later acquisition. The entry must end with the lease its last stored write
/// gave it: the next client takes the name within 2.5 s of the ttl after the acquisition.
#[tokio::test]
async fn a_renewal_due_while_the_server_is_down_is_not_sent_once_it_is_back() {
    let Some((_turn, config)) = turn("renewal-down").await else {
        return;
    };
    let ttl = Duration::from_secs(10);
    let opts = AcquireOptions::default().with_ttl(ttl);
    let holder = client(&config).await;
    let held = holder.acquire("down", &opts).await.expect("hold");
    let acquired = tokio::time::Instant::now();
    services("stop-one", "nats").await.expect("stop");
    // The first renewal (at a third of the ttl) and its retries fall in the outage.
    tokio::time::sleep_until(acquired + ttl / 3 + Duration::from_secs(1)).await;
    assert!(
        held.release().await.is_err(),
        "released with the server away"
    );
    services("start-one", "nats").await.expect("start");
    let next = loop {
        if let Some(next) = try_client(&config).await {
            break next;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let end = acquired + ttl + Duration::from_millis(2500);
    loop {
        if let Ok(Some(guard)) = next.try_acquire("down", &opts).await {
            guard.release().await.expect("release");
            break;
        }
        assert!(
            tokio::time::Instant::now() < end,
            "the released entry still held {:?} after its acquisition",
            acquired.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(holder);
}

/// A release called while the client reconnects (the server stopped, started again 300 ms
/// later) waits for the connection within its operation timeout and removes the entry: the
/// name is free at once, not a ttl later (it failed at once as `Unavailable`, and the lock
/// stayed held for its ttl of 30 s).
#[tokio::test]
async fn a_release_while_the_client_reconnects_reaches_the_server() {
    let Some((_turn, config)) = turn("release-down").await else {
        return;
    };
    let opts = AcquireOptions::default().with_ttl(Duration::from_secs(30));
    // Above the services' readiness timeout (60 s): another lane's server may hold their
    // state lock while it starts, and the client's pauses between reconnections grow to 4 s.
    let options = ClientConfig::default().with_operation_timeout(Duration::from_secs(90));
    let holder = distlock_nats::connect_with(config.clone(), options)
        .await
        .expect("connect");
    let held = holder.acquire("down", &opts).await.expect("hold");
    let nats = holder.backend_ref().client().clone();
    services("stop-one", "nats").await.expect("stop");
    // The server closes its connections as it stops: the client knows it is away.
    let seen = tokio::time::timeout(Duration::from_secs(10), async {
        while nats.connection_state() == async_nats::connection::State::Connected {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    let release = tokio::spawn(held.release());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let waited = !release.is_finished();
    // Started again before any assertion: a failure must not leave the next tests without it.
    services("start-one", "nats").await.expect("start");
    let started = tokio::time::Instant::now();
    assert!(seen.is_ok(), "the client did not see the server go");
    assert!(waited, "the release did not wait");
    release
        .await
        .expect("the release's task")
        .expect("the release, once the server is back");
    // The client's next reconnection comes at most 4 s after the server is ready.
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the release came back {:?} after the server",
        started.elapsed()
    );
    let next = client(&config).await;
    let guard = next
        .try_acquire("down", &opts)
        .await
        .expect("try_acquire")
        .expect("the released name is free");
    guard.release().await.expect("release");
}
