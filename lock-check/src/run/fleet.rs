//! The worker processes of a run: their start behind their proxies, their events, their stop.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::Child;

use super::nemesis::Aimer;
use super::{RunConfig, RunError, Spawner, io, with_hosts};
use crate::history::{Worker, WorkerEnd};
use crate::proxy::Proxy;
use crate::worker::{Event, Recorder, Sink, WorkerParams};

pub(super) struct Running {
    pub(super) child: Child,
    pub(super) pid: Pid,
    pub(super) proxies: Vec<Proxy>,
    pub(super) aimer: Aimer,
    pub(super) stderr: tokio::task::JoinHandle<String>,
    pub(super) stdout: tokio::task::JoinHandle<()>,
}

/// Stops every worker (`SIGTERM`) and says how each ended; one still busy `grace` later
/// (after its critical section could have ended) hangs.
pub(super) async fn stop(running: HashMap<u32, Running>, grace: Duration) -> Vec<Worker> {
    let mut ends = Vec::new();
    for worker in running.values() {
        // Its end of the aiming pipe closes: a runtime reading stdin exits at EOF only.
        worker.aimer.stdin.lock().await.take();
        let _ = kill(worker.pid, Signal::SIGTERM);
    }
    for (id, mut worker) in running {
        let end = match tokio::time::timeout(grace, worker.child.wait()).await {
            Ok(Ok(status)) if status.success() => WorkerEnd::Clean,
            // Our own stop request, before the worker could watch for it (it was starting).
            Ok(Ok(status))
                if std::os::unix::process::ExitStatusExt::signal(&status)
                    == Some(Signal::SIGTERM as i32) =>
            {
                WorkerEnd::Clean
            }
            Ok(Ok(status)) => {
                let stderr = worker.stderr.await.unwrap_or_default();
                WorkerEnd::Failed(format!("{status}: {}", stderr.trim()))
            }
            Ok(Err(err)) => WorkerEnd::Failed(format!("cannot wait for it: {err}")),
            Err(_) => {
                let _ = worker.child.start_kill();
                WorkerEnd::Hung
            }
        };
        let _ = worker.stdout.await;
        ends.push(Worker { id, end });
        drop(worker.proxies);
    }
    ends
}

/// The worker processes of a run.
pub(super) struct Fleet<'a> {
    pub(super) config: &'a RunConfig,
    pub(super) spawner: &'a dyn Spawner,
    pub(super) upstreams: &'a [String],
    pub(super) register: SocketAddr,
    pub(super) recorder: &'a Arc<Recorder>,
    pub(super) running: HashMap<u32, Running>,
    pub(super) next_id: u32,
}

impl Fleet<'_> {
    /// Kills worker `id` (`SIGKILL`) and starts a fresh one in its place.
    pub(super) async fn crash(&mut self, id: u32, ends: &mut Vec<Worker>) -> Result<(), RunError> {
        if let Some(mut gone) = self.running.remove(&id) {
            let _ = gone.child.start_kill();
            let _ = gone.child.wait().await;
            let _ = gone.stdout.await;
            ends.push(Worker {
                id,
                end: WorkerEnd::Killed,
            });
        }
        self.add().await
    }

    /// Starts one more worker, with a new number.
    pub(super) async fn add(&mut self) -> Result<(), RunError> {
        let id = self.next_id;
        let worker = start(self, id).await?;
        self.running.insert(id, worker);
        self.next_id += 1;
        Ok(())
    }
}

pub(super) async fn start(fleet: &Fleet<'_>, id: u32) -> Result<Running, RunError> {
    let Fleet {
        config,
        spawner,
        upstreams,
        register,
        recorder,
        ..
    } = *fleet;
    let mut proxies = Vec::new();
    for upstream in upstreams {
        proxies.push(
            Proxy::start(upstream.clone())
                .await
                .map_err(io("starting a proxy"))?,
        );
    }
    let url = if proxies.is_empty() {
        config.url.clone()
    } else {
        let hosts: Vec<String> = proxies.iter().map(|p| p.addr().to_string()).collect();
        with_hosts(&config.url, &hosts)
    };
    let params = WorkerParams {
        id,
        name: config.name.clone(),
        kind: config.kind,
        sabotage: config.sabotage,
        ttl: config.ttl,
        lock_delay: config.lock_delay,
        // Long enough for every other worker to hold once (a section lasts about a ttl), and
        // for a crashed holder's lease and lock-delay to run out twice.
        wait: config.ttl * (config.workers + 2) + config.lock_delay * 2,
        steps: config.steps,
        step_gap: config.step_gap,
    };
    let mut child = spawner
        .command(&params, &url, register)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(io("starting a worker process"))?;
    let pid = child
        .id()
        .and_then(|pid| i32::try_from(pid).ok())
        .map(Pid::from_raw)
        .ok_or_else(|| RunError::Config("a worker exited at once".into()))?;
    let stdout = child.stdout.take().map(BufReader::new);
    let recorder = recorder.clone();
    let (aimed, aimed_rx) = tokio::sync::watch::channel(0u64);
    let aimer = Aimer {
        stdin: Arc::new(tokio::sync::Mutex::new(child.stdin.take())),
        aimed: aimed_rx,
    };
    let stdout = tokio::spawn(read_events(stdout, move |event| {
        if matches!(event, Event::Aimed { .. }) {
            aimed.send_modify(|n| *n += 1);
        }
        recorder.event(id, event);
    }));
    let stderr = child.stderr.take();
    let stderr = tokio::spawn(async move {
        // Keep the tail: the reason a worker failed is at the end.
        let mut tail = String::new();
        if let Some(mut stderr) = stderr {
            let mut buf = vec![0u8; 8192];
            while let Ok(n) = stderr.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                tail.push_str(&String::from_utf8_lossy(&buf[..n]));
                if tail.len() > 4096 {
                    let cut = tail.len() - 2048;
                    let cut = (cut..tail.len())
                        .find(|&i| tail.is_char_boundary(i))
                        .unwrap_or(tail.len());
                    tail.drain(..cut);
                }
            }
        }
        tail
    });
    Ok(Running {
        child,
        pid,
        proxies,
        aimer,
        stderr,
        stdout,
    })
}

/// Hands each event a worker prints (a JSON line) to `event`, until its stdout closes.
pub(super) async fn read_events(
    stdout: Option<BufReader<tokio::process::ChildStdout>>,
    mut event: impl FnMut(Event),
) {
    let Some(mut lines) = stdout.map(AsyncBufReadExt::lines) else {
        return;
    };
    while let Ok(Some(line)) = lines.next_line().await {
        if let Ok(parsed) = serde_json::from_str::<Event>(&line) {
            event(parsed);
        }
    }
}
