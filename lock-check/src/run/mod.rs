//! The checking process: worker processes, their proxies, the register, the nemesis, and the
//! acquisition after healing.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use distlock_core::service_url::ServiceUrl;
use distlock_core::{AcquireOptions, DistributedLock};
use rand::{Rng, SeedableRng};
use tokio::process::Command;

use crate::history::{Fault, FaultKind, FinalAcquire, History, Worker, now};
use crate::kind::{CheckKind, MULTI_LOCKS, Sabotage};
use crate::register::{FencedRegister, serve};
use crate::worker::{Recorder, WorkerParams};

/// What a run does.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// The lock service URL (the workers reach its hosts through their proxies).
    pub url: String,
    /// The lock all workers contend for (a multi-lock run: the prefix of its locks' names).
    pub name: String,
    /// The primitive the workers drive.
    pub kind: CheckKind,
    /// A deliberate bug in the workers, for the checker's self-tests only.
    pub sabotage: Option<Sabotage>,
    /// How long the workers run.
    pub duration: Duration,
    /// How many worker processes run at once.
    pub workers: u32,
    /// The lock's ttl.
    pub ttl: Duration,
    /// The lock-delay every acquisition asks for (zero: none); judged by the checker's
    /// `lock-delay` rule.
    pub lock_delay: Duration,
    /// Checked writes per critical section.
    pub steps: u32,
    /// The work of each step, between its check and its write.
    pub step_gap: Duration,
    /// The faults to inject.
    pub nemesis: Vec<FaultKind>,
    /// The shell command that kill -9s and restarts the server, returning once it serves.
    pub restart_cmd: Option<String>,
    /// Whether faults may overlap: a new one starts every 0.5-1.5 s whether or not the last
    /// has healed (never two on one worker, never two restarts or two clock steps at once).
    /// Else one at a time.
    pub overlap: bool,
    /// The clock fault's control file: the `FAKETIME_TIMESTAMP_FILE` of a server run under
    /// libfaketime, whose first line is its wall clock's offset in seconds (`+0`, `+2.5`,
    /// `-3`). Without it the clock fault is not injected.
    pub clock_file: Option<PathBuf>,
    /// The port of a URL host given without one, from the backend's descriptor; `None`: the
    /// workers reach no server of the URL directly (SQLite has none; Sentinel and Cluster
    /// clients follow the addresses the servers announce), so no proxy is put in front of them.
    pub default_port: Option<u16>,
}

/// Why a run could not be made (a finding of the checker is not an error).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// The configuration cannot work.
    #[error("{0}")]
    Config(String),
    /// The run could not set itself up (a port, a process).
    #[error("{what}: {source}")]
    Io {
        /// What failed.
        what: String,
        /// Why.
        source: std::io::Error,
    },
    /// The restart command failed.
    #[error("the restart command failed: {0}")]
    Restart(String),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> RunError {
    let what = what.into();
    move |source| RunError::Io { what, source }
}

/// Makes the command of one worker process.
pub trait Spawner: Send + Sync {
    /// The command that runs [`work`](crate::work) for `params` against `url` (the proxied
    /// URL), writing to the register at `register` and its events as JSON lines to stdout,
    /// stopping cleanly on `SIGTERM`.
    fn command(&self, params: &WorkerParams, url: &str, register: SocketAddr) -> Command;
}

impl RunConfig {
    /// Checks that the run can work, before anything starts; returns the servers of the URL
    /// (see [`upstreams`]).
    ///
    /// # Errors
    /// [`RunError::Config`] saying what cannot work.
    pub fn validate(&self) -> Result<Vec<String>, RunError> {
        let upstreams = upstreams(&self.url, self.default_port)?;
        if self.nemesis.contains(&FaultKind::Restart) && self.restart_cmd.is_none() {
            return Err(RunError::Config(
                "the restart fault needs --restart-cmd (a command that kill -9s and restarts \
                 the server with its data)"
                    .into(),
            ));
        }
        if self.workers == 0 {
            return Err(RunError::Config("a check needs at least one worker".into()));
        }
        if let Some(file) = &self.clock_file
            && !file.is_file()
        {
            return Err(RunError::Config(format!(
                "the clock file {} does not exist: give the FAKETIME_TIMESTAMP_FILE of the \
                 server under test (scripts/services.sh prints DISTLOCK_TEST_*_CLOCK_FILE)",
                file.display()
            )));
        }
        let shortest = self.ttl.max(Duration::from_secs(1));
        if self.duration < shortest {
            return Err(RunError::Config(format!(
                "a run of {} is too short to judge anything: give at least {} (the ttl, and \
                 at least 1 s)",
                fmt_duration(self.duration),
                fmt_duration(shortest)
            )));
        }
        Ok(upstreams)
    }
}

/// A duration as a person writes it: `1.5s`, `250ms`.
fn fmt_duration(d: Duration) -> String {
    if d.subsec_millis() == 0 && d.as_secs() > 0 && d.subsec_nanos() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// The servers of `url` as `host:port` (`default_port` for a host without one), in URL order;
/// none without a default port (see [`RunConfig::default_port`]).
///
/// # Errors
/// The URL does not parse.
pub fn upstreams(url: &str, default_port: Option<u16>) -> Result<Vec<String>, RunError> {
    let Some(port) = default_port else {
        return Ok(Vec::new());
    };
    let parsed = ServiceUrl::parse(url).map_err(|err| RunError::Config(err.to_string()))?;
    Ok(parsed
        .hosts()
        .iter()
        .map(|h| h.with_default_port(port))
        .collect())
}

/// `url` with its host list replaced by `hosts` (one per original host, in order).
pub fn with_hosts(url: &str, hosts: &[String]) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let userinfo = authority
        .rsplit_once('@')
        .map(|(user, _)| format!("{user}@"))
        .unwrap_or_default();
    format!("{scheme}://{userinfo}{}{tail}", hosts.join(","))
}

mod fleet;
mod nemesis;

use fleet::*;
pub use nemesis::set_clock;
use nemesis::*;

/// Runs a check: starts the register and `config.workers` worker processes (each behind its
/// own proxies), injects faults for `config.duration`, stops the workers, acquires once more
/// through `lock` (a direct client) and returns the merged history.
///
/// # Errors
/// A configuration that cannot work, a port or process that cannot be set up, a failing
/// restart command.
pub async fn run(
    config: &RunConfig,
    spawner: &dyn Spawner,
    lock: Arc<dyn DistributedLock>,
) -> Result<History, RunError> {
    let upstreams = config.validate()?;
    let register = Arc::new(FencedRegister::new());
    let (register_addr, register_task) = serve(register.clone())
        .await
        .map_err(io("starting the register"))?;
    let recorder = Arc::new(Recorder::new());
    let mut fleet = Fleet {
        config,
        spawner,
        upstreams: &upstreams,
        register: register_addr,
        recorder: &recorder,
        running: HashMap::new(),
        next_id: 0,
    };
    let mut ends: Vec<Worker> = Vec::new();
    for _ in 0..config.workers {
        fleet.add().await?;
    }
    let start_at = now();
    let deadline = tokio::time::Instant::now() + config.duration;
    let mut rng = rand::rngs::StdRng::from_rng(&mut rand::rng());
    let ttl = config.ttl;
    let longest = ttl.mul_f64(3.0);
    // Faults other than crashes run as tasks: one at a time, or overlapping with
    // `config.overlap` (two workers paused together, a partition during a restart).
    let mut nemesis = Nemesis::default();
    let clock_file = config
        .clock_file
        .clone()
        .filter(|_| config.nemesis.contains(&FaultKind::Clock));
    if let Some(file) = &clock_file {
        // A clock left stepped by an earlier check that was killed mid-fault.
        set_clock(file, 0)?;
    }
    while !config.nemesis.is_empty()
        && tokio::time::Instant::now() + longest + Duration::from_secs(1) < deadline
    {
        tokio::time::sleep(Duration::from_millis(rng.random_range(500..1500))).await;
        nemesis.reap()?;
        let kind = config.nemesis[rng.random_range(0..config.nemesis.len())];
        let Some(target) = target(kind, &fleet, &nemesis.busy, clock_file.is_some(), &mut rng)
        else {
            continue;
        };
        let hold = hold_for(kind, ttl, &mut rng);
        let begun = now();
        if kind == FaultKind::Crash {
            let target = target.unwrap_or_default();
            fleet.crash(target, &mut ends).await?;
            nemesis.faults.push(Fault {
                kind,
                worker: Some(target),
                start: begun,
                healed: now(),
                step_ms: None,
                aimed: None,
            });
            continue;
        }
        let victim = target.and_then(|id| fleet.running.get(&id).map(|w| (id, w)));
        let Some(action) = action(kind, victim, &fleet, clock_file.as_deref(), &mut rng) else {
            continue;
        };
        nemesis.launch(kind, target, action, hold, ttl, begun);
        if !config.overlap {
            nemesis.wait_one().await?;
        }
    }
    let faults = nemesis.finish().await?;
    tokio::time::sleep_until(deadline).await;
    let end_at = now();
    ends.extend(stop(fleet.running, ttl * 2 + Duration::from_secs(10)).await);
    register_task.abort();
    ends.sort_by_key(|w| w.id);
    let final_acquire = probe(&*lock, config).await;
    let mut history = recorder.history();
    history.start = start_at;
    history.end = end_at;
    history.writes = register.writes();
    history.faults = faults;
    history.workers = ends;
    history.final_acquire = Some(final_acquire);
    Ok(history)
}

/// The acquisition after healing, by a fresh client, of the run's kind: the whole lock for a
/// mutex, a read-write lock (every reader gone) and a campaign, one permit of a semaphore,
/// every lock of a multi-lock run.
async fn probe(lock: &dyn DistributedLock, config: &RunConfig) -> FinalAcquire {
    let ttl = config.ttl;
    let wait = (ttl * 3 + config.lock_delay).max(Duration::from_secs(10));
    let options = AcquireOptions::default().with_ttl(ttl).with_wait(wait);
    let invoked = now();
    let name = config.name.as_str();
    let token = match config.kind {
        CheckKind::Exclusive | CheckKind::RwMix => {
            acquired(lock.acquire(name, &options).await).await
        }
        CheckKind::Shared => acquired(lock.acquire(name, &options.shared()).await).await,
        CheckKind::Permits(n) => acquired(lock.acquire(name, &options.with_permits(n)).await).await,
        CheckKind::Election => acquired(lock.campaign(name, "final-probe", &options).await).await,
        CheckKind::Upgradeable => {
            // The writer's way in: the gate, then the lock.
            let gate = format!("{name}{}", distlock_core::GATE_SUFFIX);
            match lock.acquire(&gate, &options).await {
                Ok(gate) => {
                    let token = acquired(lock.acquire(name, &options).await).await;
                    let _ = gate.release().await;
                    token
                }
                Err(err) => Err(err),
            }
        }
        CheckKind::Multi => {
            let names: Vec<String> = (0..MULTI_LOCKS)
                .map(|i| config.kind.lock_name(name, i))
                .collect();
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            match lock.acquire_all(&names, &options).await {
                Ok(all) => {
                    let token = all.guards().first().map(|g| g.token().get());
                    let _ = all.release().await;
                    Ok(token.unwrap_or(0))
                }
                Err(err) => Err(err),
            }
        }
    };
    let returned = now();
    match token {
        Ok(token) => FinalAcquire {
            invoked,
            returned,
            token: Some(token),
            error: None,
        },
        Err(err) => FinalAcquire {
            invoked,
            returned,
            token: None,
            error: Some(err.to_string()),
        },
    }
}

/// The token of an acquired guard, released at once.
async fn acquired(
    guard: distlock_core::Result<distlock_core::LockGuard>,
) -> distlock_core::Result<u64> {
    let guard = guard?;
    let token = guard.token().get();
    let _ = guard.release().await;
    Ok(token)
}

#[cfg(test)]
mod tests {
    use std::process::Stdio;

    use tokio::io::BufReader;
    use tokio::process::{Child, Command};

    use super::*;
    use crate::worker::{Event, Op};

    /// A worker's side of the aiming protocol, in sh: what it reads on stdin, and an aimed
    /// event when armed for `release`. Exits 0 when it read `expected`.
    async fn fake_worker(expected: &str, arrives: bool) -> (Child, Aimer, Arc<AtomicBool>) {
        let script = format!(
            "read aim; {} read next; [ \"$aim/$next\" = '{expected}' ]",
            if arrives {
                r#"echo '{"e":"aimed","op":"release","t":1}';"#
            } else {
                ""
            }
        );
        let mut child = Command::new("sh")
            .args(["-c", &script])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("sh starts");
        let (aimed, aimed_rx) = tokio::sync::watch::channel(0u64);
        let stdout = child.stdout.take().map(BufReader::new);
        tokio::spawn(read_events(stdout, move |event| {
            if matches!(
                event,
                Event::Aimed {
                    op: Op::Release,
                    ..
                }
            ) {
                aimed.send_modify(|n| *n += 1);
            }
        }));
        let aimer = Aimer {
            stdin: Arc::new(tokio::sync::Mutex::new(child.stdin.take())),
            aimed: aimed_rx,
        };
        (child, aimer, Arc::new(AtomicBool::new(false)))
    }

    use std::sync::atomic::{AtomicBool, Ordering};

    /// Aims `release` at a scripted worker (see [`fake_worker`]) for at most `within`:
    /// whether the cut began, whether it ran, and whether the worker read `expected`.
    async fn aim_at(expected: &str, arrives: bool, within: Duration) -> (bool, bool, bool) {
        let (mut child, aimer, cut) = fake_worker(expected, arrives).await;
        let flag = cut.clone();
        let start = aimer
            .aim(Op::Release, within, move || {
                flag.store(true, Ordering::SeqCst)
            })
            .await;
        let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
            .await
            .expect("the worker was answered")
            .expect("sh ends");
        (
            start.is_some(),
            cut.load(Ordering::SeqCst),
            status.success(),
        )
    }

    #[tokio::test]
    async fn an_aimed_worker_is_cut_when_it_arrives_then_let_go() {
        let (started, cut, read) = aim_at("aim release/go", true, Duration::from_secs(10)).await;
        assert!(started, "the worker arrived");
        assert!(cut, "cut before it went on");
        assert!(read, "the worker read aim release, then go");
    }

    #[tokio::test]
    async fn an_aim_the_worker_does_not_reach_is_withdrawn_uncut() {
        let (started, cut, read) =
            aim_at("aim release/aim none", false, Duration::from_millis(300)).await;
        assert!(!started);
        assert!(!cut);
        assert!(read, "the worker was disarmed");
    }

    /// A clock set right is a forward step when it had been stepped back: the fault's healing
    /// is recorded before the file is written (a server reads the new clock at once), so the
    /// window of expected overlaps after a forward step cannot begin after the step.
    #[tokio::test]
    async fn a_clock_fault_heals_at_the_time_before_the_clock_is_set_right() {
        let dir = std::env::temp_dir().join(format!("distlock-check-heal-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temp dir");
        let file = dir.join("clock.rc");
        let action = Action::Clock(file.clone(), -1_500);
        let hold = Duration::from_millis(20);
        let before = now();
        let inflicted = inflict(FaultKind::Clock, action, hold, Duration::from_secs(1))
            .await
            .expect("stepped and set right");
        let after = now();
        let healed = inflicted.healed.expect("the time it was set right");
        assert!(before + crate::history::nanos_of(hold) <= healed && healed <= after);
        assert_eq!(std::fs::read_to_string(&file).expect("read"), "+0.000\n");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn hosts_are_replaced_and_everything_else_kept() {
        assert_eq!(
            with_hosts(
                "redlock://u:p@h1:1,h2:2/x?a=b",
                &["127.0.0.1:5".into(), "127.0.0.1:6".into()]
            ),
            "redlock://u:p@127.0.0.1:5,127.0.0.1:6/x?a=b"
        );
        assert_eq!(
            with_hosts("etcd://h", &["127.0.0.1:7".into()]),
            "etcd://127.0.0.1:7"
        );
        assert_eq!(
            upstreams("zk://a,b:2182/chroot", Some(2181)).expect("parses"),
            ["a:2181", "b:2182"]
        );
        assert_eq!(
            upstreams("sqlite:///tmp/x.db", None).expect("parses"),
            Vec::<String>::new()
        );
    }

    #[test]
    fn the_clock_file_is_replaced_whole_with_the_offset_in_seconds() {
        let dir = std::env::temp_dir().join(format!("distlock-check-clock-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temp dir");
        let file = dir.join("clock.rc");
        for (ms, text) in [(2_500, "+2.500\n"), (-1_005, "-1.005\n"), (0, "+0.000\n")] {
            set_clock(&file, ms).expect("written");
            assert_eq!(std::fs::read_to_string(&file).expect("read"), text);
        }
        assert_eq!(std::fs::read_dir(&dir).expect("listed").count(), 1);
        let missing = RunConfig {
            url: "redis://h".into(),
            name: "n".into(),
            kind: CheckKind::Exclusive,
            sabotage: None,
            duration: Duration::from_secs(5),
            workers: 1,
            ttl: Duration::from_secs(1),
            lock_delay: Duration::ZERO,
            steps: 1,
            step_gap: Duration::ZERO,
            nemesis: vec![FaultKind::Clock],
            restart_cmd: None,
            overlap: false,
            clock_file: Some(dir.join("missing.rc")),
            default_port: Some(6379),
        };
        assert!(
            matches!(missing.validate(), Err(RunError::Config(why)) if why.contains("missing.rc")),
        );
        std::fs::remove_dir_all(&dir).expect("removed");
    }
}
