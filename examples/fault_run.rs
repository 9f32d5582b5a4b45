//! Fault injection against a real lock service: worker processes contend for one lock while the
//! coordinator pauses (SIGSTOP/SIGCONT) and kills (SIGKILL) them at random, and every write of a
//! critical section goes through a fenced register shared by all processes. The log of what
//! happened is then checked for mutual exclusion, token order and fencing.
//!
//! ```sh
//! cargo run --release -p distlock-examples --example fault_run --features zookeeper,etcd -- \
//!     --url zk://127.0.0.1:2181 [--secs 40] [--workers 5] [--ttl 2s] [--wait 20s] [--name NAME]
//! ```
//!
//! The coordinator re-executes itself as `--workers` worker processes (`FAULT_RUN_ROLE=worker`).
//! For `--secs` seconds, every 1-3 s it picks a random worker that is not paused and either
//! pauses it for 3-6 s or kills it and starts a replacement. Then it lets the workers run 3 s
//! more, stops them with SIGTERM, and times a fresh client acquiring the same lock.
//!
//! A worker loops: acquire (ttl, wait); 8 fenced writes ~50 ms apart, each preceded by a check of
//! the guard (`is_lost`, `valid_until`); release. The register is a file under `flock` holding
//! the highest token written and the acquisition that wrote it: a write with a lower token is
//! refused (the critical section stops), a write with the same token from another acquisition is
//! a shared-token violation. Every event is one `O_APPEND` line of `events.log`, stamped with
//! `SystemTime` nanoseconds (one machine, so stamps of different processes compare).
//!
//! The last line printed is
//! `RESULT url=... acquisitions=A timeouts=T errors=E exclusion_violations=X
//! token_order_violations=O shared_token_writes=S fence_refusals=F late_writes=L fresh_acquire_ms=M`
//! (`--analyse DIR` checks the log of an earlier run again and prints the same line):
//!
//! - an exclusion violation is a pair of acquisitions whose accepted writes interleave
//!   (a, b, a in register order), or whose holds overlap: from the grant (logged after
//!   `acquire` returned) to the last guard check that let an accepted write go ahead. A write
//!   whose check came before the other's grant but which reached the register after it (the
//!   writer was paused between its check and its write) is no violation of the lock: it is a
//!   late write, counted apart (`late_writes`), which the register refuses once the newer
//!   holder has written; no lock can prevent it, only the fence;
//! - a token order violation is an acquisition whose token is not greater than that of an
//!   acquisition granted before it was even requested (the other's `ACQ` stamp precedes its
//!   request stamp); concurrent requests may be granted in either order.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use distlock::{AcquireOptions, DistributedLock, Error, LockGuard};
use nix::fcntl::{Flock, FlockArg};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

const ROLE_ENV: &str = "FAULT_RUN_ROLE";
const DIR_ENV: &str = "FAULT_RUN_DIR";
const NAME_ENV: &str = "FAULT_RUN_NAME";
const WRITES: usize = 8;
const WRITE_GAP: Duration = Duration::from_millis(50);

type BoxResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Worker processes contend for one lock while this process pauses and kills them; the log is
/// then checked for exclusion, token order and fencing.
#[derive(Debug, Clone, clap::Parser)]
struct Args {
    /// The lock service (any URL `distlock::connect` takes).
    #[arg(long, required_unless_present = "analyse")]
    url: Option<String>,
    /// Only check the log of an earlier run in DIR (the `dir=` it printed) and print its
    /// RESULT line.
    #[arg(long, value_name = "DIR", conflicts_with = "url")]
    analyse: Option<PathBuf>,
    /// How long faults are injected, in seconds.
    #[arg(long, default_value_t = 40, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    secs: u64,
    /// Worker processes.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u16).range(1..))]
    workers: u16,
    /// The lease of every acquisition.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "2s")]
    ttl: Duration,
    /// How long each acquire may wait.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "20s")]
    wait: Duration,
    /// The lock name (default: fault-run-<nanoseconds>).
    #[arg(long)]
    name: Option<String>,
}

impl Args {
    fn url(&self) -> &str {
        self.url.as_deref().unwrap_or_default()
    }
}

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// The shared event log: one `write` per line on an `O_APPEND` file.
#[derive(Debug)]
struct EventLog(File);

impl EventLog {
    fn open(dir: &Path) -> std::io::Result<Self> {
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("events.log"))
            .map(Self)
    }

    fn line(&self, line: &str) {
        let mut line: String = line
            .chars()
            .map(|c| if c == '\n' || c == '\r' { ' ' } else { c })
            .take(1000)
            .collect();
        line.push('\n');
        if let Err(err) = (&self.0).write_all(line.as_bytes()) {
            eprintln!("fault_run: cannot write the event log: {err}");
        }
    }
}

#[tokio::main]
async fn main() -> BoxResult<()> {
    let args = <Args as clap::Parser>::parse();
    if let Some(dir) = &args.analyse {
        let text = std::fs::read_to_string(dir.join("events.log"))?;
        // The coordinator is the process that logs the faults.
        let coordinator = text
            .lines()
            .find_map(|line| line.strip_prefix("FAULT "))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|pid| pid.parse().ok())
            .unwrap_or(0);
        let report = analyse(&text, coordinator);
        report.print_details();
        report.print_result("-", "-");
        return Ok(());
    }
    if std::env::var(ROLE_ENV).as_deref() == Ok("worker") {
        let dir = PathBuf::from(std::env::var(DIR_ENV)?);
        let name = std::env::var(NAME_ENV)?;
        tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_env("DISTLOCK_LOG")
                    .unwrap_or_else(|_| "warn".into()),
            )
            .with_writer(std::io::stderr)
            .init();
        worker(&args, &dir, &name).await
    } else {
        coordinator(&args).await
    }
}

// ----------------------------------------------------------------------------------------------
// Worker

/// What the register said about one write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WriteOutcome {
    Ok,
    Refused,
    Shared,
}

/// One fenced write under `flock`; the `WRITE` line is logged while the flock is held, so the
/// order of `WRITE` lines in the log is the order of writes at the register.
fn fenced_write(
    dir: &Path,
    log: &EventLog,
    pid: u32,
    acq: &str,
    token: u64,
    t_check: u128,
    seq: usize,
) -> std::io::Result<WriteOutcome> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(dir.join("register"))?;
    let mut file = Flock::lock(file, FlockArg::LockExclusive).map_err(|(_, e)| e)?;
    let mut text = String::new();
    file.read_to_string(&mut text)?;
    let mut fields = text.split_whitespace();
    let highest: u64 = fields.next().and_then(|s| s.parse().ok()).unwrap_or(0);
    let writer = fields.next().unwrap_or("-").to_owned();
    let outcome = if token < highest {
        WriteOutcome::Refused
    } else if token == highest && writer != acq {
        WriteOutcome::Shared
    } else {
        WriteOutcome::Ok
    };
    if outcome != WriteOutcome::Refused {
        file.set_len(0)?;
        file.seek(SeekFrom::Start(0))?;
        file.write_all(format!("{token} {acq}\n").as_bytes())?;
    }
    let word = match outcome {
        WriteOutcome::Ok => "ok",
        WriteOutcome::Refused => "refused",
        WriteOutcome::Shared => "shared",
    };
    log.line(&format!(
        "WRITE {pid} {acq} {token} {} {word} {highest} {t_check} {seq}",
        now_ns()
    ));
    drop(file);
    Ok(outcome)
}

async fn connect_retrying(
    url: &str,
    log: &EventLog,
    pid: u32,
) -> std::sync::Arc<dyn DistributedLock> {
    loop {
        match distlock::connect(url).await {
            Ok(locks) => return locks,
            Err(err) => {
                log.line(&format!("ERR {pid} - - {} connect: {err}", now_ns()));
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

async fn worker(args: &Args, dir: &Path, name: &str) -> BoxResult<()> {
    let pid = std::process::id();
    let log = std::sync::Arc::new(EventLog::open(dir)?);
    let locks = connect_retrying(args.url(), &log, pid).await;
    let opts = AcquireOptions::default()
        .with_ttl(args.ttl)
        .with_wait(args.wait);
    loop {
        let acq = format!("{:016x}", rand::random::<u64>());
        let t_start = now_ns();
        match locks.acquire(name, &opts).await {
            Ok(guard) => {
                let token = guard.token().get();
                log.line(&format!("ACQ {pid} {acq} {token} {} {t_start}", now_ns()));
                critical_section(&guard, dir, &log, pid, &acq).await;
                let t = now_ns();
                match guard.release().await {
                    Ok(()) => log.line(&format!("REL {pid} {acq} {token} {t} ok")),
                    Err(err) => log.line(&format!("REL {pid} {acq} {token} {t} err {err}")),
                }
            }
            Err(Error::Timeout { .. }) => {
                log.line(&format!("TIMEOUT {pid} {acq} - {} {t_start}", now_ns()));
            }
            Err(err) => {
                log.line(&format!("ERR {pid} {acq} - {} acquire: {err:?}", now_ns()));
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(rand::random_range(0..20))).await;
    }
}

async fn critical_section(
    guard: &LockGuard,
    dir: &Path,
    log: &std::sync::Arc<EventLog>,
    pid: u32,
    acq: &str,
) {
    let token = guard.token().get();
    for seq in 0..WRITES {
        if seq > 0 {
            tokio::time::sleep(WRITE_GAP).await;
        }
        let t_check = now_ns();
        if guard.is_lost() || Instant::now() >= guard.valid_until() {
            let reason = guard
                .loss_reason()
                .map_or_else(|| "local deadline passed".to_owned(), |r| r.to_string());
            log.line(&format!("LOST {pid} {acq} {token} {t_check} {reason}"));
            return;
        }
        let (dir, log2, acq2) = (dir.to_owned(), std::sync::Arc::clone(log), acq.to_owned());
        let outcome = tokio::task::spawn_blocking(move || {
            fenced_write(&dir, &log2, pid, &acq2, token, t_check, seq)
        })
        .await;
        match outcome {
            Ok(Ok(WriteOutcome::Ok | WriteOutcome::Shared)) => {}
            Ok(Ok(WriteOutcome::Refused)) => return,
            Ok(Err(err)) => {
                log.line(&format!(
                    "ERR {pid} {acq} {token} {} register: {err}",
                    now_ns()
                ));
                return;
            }
            Err(err) => {
                log.line(&format!(
                    "ERR {pid} {acq} {token} {} register task: {err}",
                    now_ns()
                ));
                return;
            }
        }
    }
}

// ----------------------------------------------------------------------------------------------
// Coordinator

fn spawn_worker(dir: &Path, name: &str, slot: usize) -> BoxResult<Child> {
    let err = OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(format!("worker-{slot}.stderr")))?;
    let child = Command::new(std::env::current_exe()?)
        .args(std::env::args().skip(1))
        .env(ROLE_ENV, "worker")
        .env(DIR_ENV, dir)
        .env(NAME_ENV, name)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(err)
        .spawn()?;
    Ok(child)
}

fn signal(child: &Child, sig: Signal) {
    let pid = Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX));
    if let Err(err) = kill(pid, sig) {
        eprintln!("fault_run: {sig} to {}: {err}", child.id());
    }
}

async fn coordinator(args: &Args) -> BoxResult<()> {
    let name = args
        .name
        .clone()
        .unwrap_or_else(|| format!("fault-run-{}", now_ns()));
    let dir = std::env::temp_dir().join(format!("fault_run-{}-{}", std::process::id(), now_ns()));
    std::fs::create_dir_all(&dir)?;
    let log = EventLog::open(&dir)?;
    let me = std::process::id();
    eprintln!(
        "fault_run: url={} lock={name} dir={} workers={} secs={} ttl={:?} wait={:?}",
        args.url(),
        dir.display(),
        args.workers,
        args.secs,
        args.ttl,
        args.wait
    );

    let mut workers: Vec<Child> = Vec::new();
    for slot in 0..usize::from(args.workers) {
        let child = spawn_worker(&dir, &name, slot)?;
        log.line(&format!("FAULT {me} - - {} spawn {}", now_ns(), child.id()));
        workers.push(child);
    }
    // slot -> when to send SIGCONT
    let mut paused: BTreeMap<usize, Instant> = BTreeMap::new();
    let (mut pauses, mut kills) = (0u32, 0u32);
    let end = Instant::now() + Duration::from_secs(args.secs);
    let mut next_fault = Instant::now() + Duration::from_millis(rand::random_range(1000..=3000));
    while Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let now = Instant::now();
        let due: Vec<usize> = paused
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(slot, _)| *slot)
            .collect();
        for slot in due {
            paused.remove(&slot);
            signal(&workers[slot], Signal::SIGCONT);
            log.line(&format!(
                "FAULT {me} - - {} cont {}",
                now_ns(),
                workers[slot].id()
            ));
        }
        // A worker that died by itself is reported and replaced.
        for (slot, child) in workers.iter_mut().enumerate() {
            if let Ok(Some(status)) = child.try_wait() {
                log.line(&format!(
                    "ERR {me} - - {} worker {} exited by itself: {status}",
                    now_ns(),
                    child.id()
                ));
                paused.remove(&slot);
                *child = spawn_worker(&dir, &name, slot)?;
                log.line(&format!("FAULT {me} - - {} spawn {}", now_ns(), child.id()));
            }
        }
        if now < next_fault {
            continue;
        }
        next_fault = now + Duration::from_millis(rand::random_range(1000..=3000));
        let candidates: Vec<usize> = (0..workers.len())
            .filter(|slot| !paused.contains_key(slot))
            .collect();
        if candidates.is_empty() {
            continue;
        }
        let slot = candidates[rand::random_range(0..candidates.len())];
        if rand::random::<bool>() {
            let pause = Duration::from_millis(rand::random_range(3000..=6000));
            signal(&workers[slot], Signal::SIGSTOP);
            log.line(&format!(
                "FAULT {me} - - {} stop {} {}",
                now_ns(),
                workers[slot].id(),
                pause.as_millis()
            ));
            paused.insert(slot, now + pause);
            pauses += 1;
        } else {
            signal(&workers[slot], Signal::SIGKILL);
            let _ = workers[slot].wait();
            log.line(&format!(
                "FAULT {me} - - {} kill {}",
                now_ns(),
                workers[slot].id()
            ));
            workers[slot] = spawn_worker(&dir, &name, slot)?;
            log.line(&format!(
                "FAULT {me} - - {} spawn {}",
                now_ns(),
                workers[slot].id()
            ));
            kills += 1;
        }
    }
    for slot in std::mem::take(&mut paused).into_keys() {
        signal(&workers[slot], Signal::SIGCONT);
        log.line(&format!(
            "FAULT {me} - - {} cont {}",
            now_ns(),
            workers[slot].id()
        ));
    }
    eprintln!("fault_run: faults done ({pauses} pauses, {kills} kills); 3 s of calm");
    tokio::time::sleep(Duration::from_secs(3)).await;
    for child in &mut workers {
        signal(child, Signal::SIGTERM);
        log.line(&format!("FAULT {me} - - {} term {}", now_ns(), child.id()));
    }
    for child in &mut workers {
        let _ = child.wait();
    }

    // A fresh client: how long until the lock is free after the workers were stopped?
    let opts = AcquireOptions::default()
        .with_ttl(args.ttl)
        .with_wait(Duration::from_secs(20));
    let started = Instant::now();
    let acq = format!("fresh{:011x}", rand::random::<u64>() >> 20);
    let t_start = now_ns();
    let (fresh_ms, connect_ms) = match distlock::connect(args.url()).await {
        Err(err) => {
            log.line(&format!(
                "ERR {me} {acq} - {} fresh connect: {err}",
                now_ns()
            ));
            (None, started.elapsed().as_millis())
        }
        Ok(locks) => {
            let connect_ms = started.elapsed().as_millis();
            match locks.acquire(&name, &opts).await {
                Ok(guard) => {
                    let ms = started.elapsed().as_millis();
                    let token = guard.token().get();
                    log.line(&format!("ACQ {me} {acq} {token} {} {t_start}", now_ns()));
                    let (d, a) = (dir.clone(), acq.clone());
                    let l = EventLog::open(&dir)?;
                    let t_check = now_ns();
                    tokio::task::spawn_blocking(move || {
                        fenced_write(&d, &l, me, &a, token, t_check, 0)
                    })
                    .await??;
                    let t = now_ns();
                    match guard.release().await {
                        Ok(()) => log.line(&format!("REL {me} {acq} {token} {t} ok")),
                        Err(err) => log.line(&format!("REL {me} {acq} {token} {t} err {err}")),
                    }
                    (Some(ms), connect_ms)
                }
                Err(Error::Timeout { .. }) => {
                    log.line(&format!("TIMEOUT {me} {acq} - {} {t_start}", now_ns()));
                    (None, connect_ms)
                }
                Err(err) => {
                    log.line(&format!(
                        "ERR {me} {acq} - {} fresh acquire: {err:?}",
                        now_ns()
                    ));
                    (None, connect_ms)
                }
            }
        }
    };
    eprintln!(
        "fault_run: fresh client: connect {connect_ms} ms, acquire {}",
        fresh_ms.map_or_else(|| "FAILED".to_owned(), |ms| format!("{ms} ms total"))
    );

    let text = std::fs::read_to_string(dir.join("events.log"))?;
    let report = analyse(&text, me);
    report.print_details();
    report.print_result(
        args.url(),
        &fresh_ms.map_or_else(|| "FAILED".to_owned(), |ms| ms.to_string()),
    );
    Ok(())
}

// ----------------------------------------------------------------------------------------------
// Analysis

#[derive(Debug, Default, Clone)]
struct Acq {
    pid: u32,
    id: String,
    token: u64,
    t_start: u128,
    t_acq: u128,
    /// The accepted writes (ok or shared): when the guard was checked, and when the write
    /// reached the register.
    accepted: Vec<(u128, u128)>,
    lost: Option<String>,
    released: Option<String>,
}

#[derive(Debug, Default)]
struct Report {
    acquisitions: usize,
    timeouts: usize,
    errors: usize,
    error_messages: BTreeMap<String, usize>,
    release_errors: BTreeMap<String, usize>,
    losses: BTreeMap<String, usize>,
    shared: usize,
    refusals: usize,
    /// Pairs where one holder's write, checked before the other's grant, reached the register
    /// after it.
    late_writes: usize,
    exclusion: Vec<String>,
    token_order: Vec<String>,
    duplicate_tokens: usize,
    max_wait_ms: u128,
    faults: BTreeMap<String, usize>,
}

fn field<'a>(fields: &[&'a str], i: usize) -> &'a str {
    fields.get(i).copied().unwrap_or("")
}

fn analyse(text: &str, coordinator: u32) -> Report {
    let mut report = Report::default();
    let mut acqs: Vec<Acq> = Vec::new();
    let mut by_id: HashMap<String, usize> = HashMap::new();
    // Accepted writes in register order: the acquisition index of each.
    let mut order: Vec<usize> = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let pid: u32 = field(&f, 1).parse().unwrap_or(0);
        let id = field(&f, 2).to_owned();
        let token: u64 = field(&f, 3).parse().unwrap_or(0);
        let t: u128 = field(&f, 4).parse().unwrap_or(0);
        let rest = f.get(5..).map(|r| r.join(" ")).unwrap_or_default();
        match field(&f, 0) {
            "ACQ" => {
                let t_start: u128 = field(&f, 5).parse().unwrap_or(0);
                if pid != coordinator {
                    report.acquisitions += 1;
                    report.max_wait_ms = report.max_wait_ms.max((t - t_start) / 1_000_000);
                }
                by_id.insert(id.clone(), acqs.len());
                acqs.push(Acq {
                    pid,
                    id,
                    token,
                    t_start,
                    t_acq: t,
                    ..Acq::default()
                });
            }
            "WRITE" => match field(&f, 5) {
                "refused" => report.refusals += 1,
                word @ ("ok" | "shared") => {
                    if word == "shared" {
                        report.shared += 1;
                    }
                    if let Some(&i) = by_id.get(&id) {
                        let t_check: u128 = field(&f, 7).parse().unwrap_or(0);
                        acqs[i].accepted.push((t_check, t));
                        order.push(i);
                    }
                }
                _ => {}
            },
            "LOST" => {
                *report.losses.entry(rest.clone()).or_default() += 1;
                if let Some(&i) = by_id.get(&id) {
                    acqs[i].lost = Some(rest);
                }
            }
            "REL" => {
                if rest != "ok" {
                    *report.release_errors.entry(rest.clone()).or_default() += 1;
                }
                if let Some(&i) = by_id.get(&id) {
                    acqs[i].released = Some(rest);
                }
            }
            "TIMEOUT" => report.timeouts += 1,
            "ERR" => {
                report.errors += 1;
                *report.error_messages.entry(rest).or_default() += 1;
            }
            "FAULT" => {
                *report.faults.entry(field(&f, 5).to_owned()).or_default() += 1;
            }
            _ => {}
        }
    }

    // Exclusion: accepted writes interleaved in register order (a .. b .. a).
    let mut span: HashMap<usize, (usize, usize)> = HashMap::new();
    for (k, &i) in order.iter().enumerate() {
        span.entry(i).and_modify(|s| s.1 = k).or_insert((k, k));
    }
    let mut pairs: HashSet<(usize, usize)> = HashSet::new();
    for (k, &b) in order.iter().enumerate() {
        for (&a, &(first, last)) in &span {
            if a != b && first < k && k < last && pairs.insert((a.min(b), a.max(b))) {
                report.exclusion.push(format!(
                    "interleaved writes: {} then {} then {} again",
                    describe(&acqs[a]),
                    describe(&acqs[b]),
                    acqs[a].id
                ));
            }
        }
    }
    // Exclusion: [grant, last accepted write] intervals of two acquisitions overlap.
    let writers: Vec<usize> = (0..acqs.len())
        .filter(|&i| !acqs[i].accepted.is_empty())
        .collect();
    for (x, &a) in writers.iter().enumerate() {
        for &b in &writers[x + 1..] {
            let (ra, rb) = (&acqs[a], &acqs[b]);
            let checked = |r: &Acq| r.accepted.iter().map(|w| w.0).max().unwrap_or(0);
            let written = |r: &Acq| r.accepted.iter().map(|w| w.1).max().unwrap_or(0);
            let (end_a, end_b) = (checked(ra), checked(rb));
            let granted = ra.t_acq.max(rb.t_acq);
            if granted < written(ra).min(written(rb)) && granted >= end_a.min(end_b) {
                report.late_writes += 1;
            }
            if granted < end_a.min(end_b) && pairs.insert((a.min(b), a.max(b))) {
                report.exclusion.push(format!(
                    "overlapping holds with accepted writes: {} (last check {}) and {} (last check {})",
                    describe(ra),
                    end_a,
                    describe(rb),
                    end_b
                ));
            }
        }
    }
    // Token order: granted-before-requested must mean a smaller token.
    for b in &acqs {
        if let Some(a) = acqs
            .iter()
            .find(|a| a.id != b.id && a.t_acq < b.t_start && b.token <= a.token)
        {
            report.token_order.push(format!(
                "{} requested after {} was granted, but its token is not greater",
                describe(b),
                describe(a)
            ));
        }
    }
    let mut seen: HashMap<u64, usize> = HashMap::new();
    for a in &acqs {
        *seen.entry(a.token).or_default() += 1;
    }
    report.duplicate_tokens = seen.values().filter(|&&n| n > 1).count();
    report
}

fn describe(a: &Acq) -> String {
    format!(
        "acq {} (pid {} token {} requested {} granted {} lost {:?} release {:?})",
        a.id, a.pid, a.token, a.t_start, a.t_acq, a.lost, a.released
    )
}

impl Report {
    /// The one summary line; `fresh` is the fresh client's acquire time in ms, or why none.
    fn print_result(&self, url: &str, fresh: &str) {
        println!(
            "RESULT url={} acquisitions={} timeouts={} errors={} exclusion_violations={} \
             token_order_violations={} shared_token_writes={} fence_refusals={} late_writes={} \
             fresh_acquire_ms={}",
            url,
            self.acquisitions,
            self.timeouts,
            self.errors,
            self.exclusion.len(),
            self.token_order.len(),
            self.shared,
            self.refusals,
            self.late_writes,
            fresh,
        );
    }

    fn print_details(&self) {
        println!(
            "DETAIL faults={:?} max_successful_wait_ms={} duplicate_tokens={}",
            self.faults, self.max_wait_ms, self.duplicate_tokens
        );
        println!("DETAIL losses={:?}", self.losses);
        for (msg, n) in &self.release_errors {
            println!("DETAIL release_error x{n}: {msg}");
        }
        for (msg, n) in &self.error_messages {
            println!("DETAIL error x{n}: {msg}");
        }
        for v in self.exclusion.iter().take(20) {
            println!("VIOLATION exclusion: {v}");
        }
        for v in self.token_order.iter().take(20) {
            println!("VIOLATION token order: {v}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::analyse;

    /// `ACQ pid id token t_acq t_requested` and `WRITE pid id token t word highest t_check seq`.
    fn log(lines: &[&str]) -> String {
        lines.join("\n")
    }

    #[test]
    fn a_write_checked_after_another_grant_is_an_exclusion_violation() {
        let report = analyse(
            &log(&[
                "ACQ 1 a 10 100 50",
                "WRITE 1 a 10 110 ok 0 105 0",
                "ACQ 2 b 11 200 60",
                "WRITE 2 b 11 210 ok 10 205 0",
                // a checked its guard at 220, after b's grant at 200.
                "WRITE 1 a 10 230 refused 11 220 1",
                "WRITE 1 a 10 240 ok 11 225 2",
            ]),
            0,
        );
        assert_eq!(report.exclusion.len(), 1, "{:?}", report.exclusion);
        assert_eq!(report.refusals, 1);
    }

    #[test]
    fn a_paused_write_checked_before_the_next_grant_is_late_not_a_violation() {
        let report = analyse(
            &log(&[
                "ACQ 1 a 10 100 50",
                "WRITE 1 a 10 110 ok 0 105 0",
                "ACQ 2 b 11 200 60",
                // a checked at 150, was paused, and reached the register at 300.
                "WRITE 1 a 10 300 ok 10 150 1",
                "WRITE 2 b 11 310 ok 10 205 0",
            ]),
            0,
        );
        assert!(report.exclusion.is_empty(), "{:?}", report.exclusion);
        assert_eq!(report.late_writes, 1);
    }

    #[test]
    fn interleaved_writes_and_tokens_going_back_are_found() {
        let report = analyse(
            &log(&[
                "ACQ 1 a 10 100 50",
                "ACQ 2 b 9 200 150",
                "WRITE 1 a 10 110 ok 0 105 0",
                "WRITE 2 b 9 210 shared 10 205 0",
                "WRITE 1 a 10 220 ok 10 215 1",
            ]),
            0,
        );
        assert_eq!(report.exclusion.len(), 1, "{:?}", report.exclusion);
        assert_eq!(report.token_order.len(), 1, "{:?}", report.token_order);
        assert_eq!(report.shared, 1);
    }
}
