//! The conformance suite: every distlock backend configuration runs the same cases against a
//! real server.
//!
//! A backend provides a [`Harness`] (how to make independent clients, which ttl to test with,
//! and fault hooks: remove a lock behind its holder's back, cut a client's connection, stop and
//! start the server), and instantiates the whole suite with one line:
//!
//! ```text
//! // lock-redis/tests/conformance.rs
//! conformance_tests::conformance_suite!(redis, harness);
//! ```
//!
//! which creates one named test per case (`redis::exclusive_under_contention`, ...). Cases a
//! backend cannot run (a fault hook it lacks, a capability it does not declare) pass with one
//! `SKIP` line on stderr that says why. A harness whose server variable is unset skips the
//! whole suite loudly, unless `DISTLOCK_TEST_REQUIRE` names the backend (or is `all`): then the
//! tests fail. Every case uses names under a random prefix, so runs never see each other's
//! locks.

use std::future::Future;
use std::io::Write as _;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock_core::{AcquireOptions, DistributedLock, Error};

pub mod cases;
pub mod child;
pub mod churn;
pub mod failover;
pub mod memory;
pub mod servers;
pub mod tls;

/// A fresh client made by a [`Harness`], with the tag the harness uses to find its connection.
#[derive(Clone, Debug)]
pub struct TestClient {
    /// The client.
    pub lock: Arc<dyn DistributedLock>,
    /// Harness-specific identity (e.g. a Redis client name), for [`Harness::cut_connection`].
    pub tag: String,
}

impl std::ops::Deref for TestClient {
    type Target = dyn DistributedLock;
    fn deref(&self) -> &Self::Target {
        &*self.lock
    }
}

/// Why a fault hook could not run.
#[derive(Debug)]
pub enum HookError {
    /// The backend configuration has no such fault: the case is skipped with this reason.
    Unsupported(String),
    /// The hook failed: the case fails.
    Failed(String),
}

/// Result of a fault hook.
pub type HookResult = Result<(), HookError>;

fn unsupported(what: &str) -> HookResult {
    Err(HookError::Unsupported(format!(
        "the harness has no `{what}` fault hook"
    )))
}

/// One backend configuration under test.
#[async_trait]
pub trait Harness: Send + Sync + 'static {
    /// A fresh client with its own connections, configured with
    /// [`operation_timeout`](Harness::operation_timeout).
    async fn client(&self) -> Result<TestClient, Error>;

    /// The base ttl of the cases: short, but several server round trips long.
    fn ttl(&self) -> Duration;

    /// Allowance for timing checks (server expiry granularity, scheduling on a loaded machine).
    fn slack(&self) -> Duration {
        Duration::from_millis(500)
    }

    /// The per-operation timeout the harness's clients are configured with.
    fn operation_timeout(&self) -> Duration;

    /// How many names the "many locks" case holds at once (the case runs alone, as the
    /// disruptive ones do). Each backend's main configuration holds [`SCALE_LOCKS`]; variants
    /// (TLS, auth, topologies) may hold fewer to keep the suite quick.
    fn many_locks(&self) -> usize {
        1000
    }

    /// The ttl of the "many locks" case (default: [`Self::ttl`]). All its renewals go through
    /// one client at once, so a backend whose base ttl is short for a loaded machine may ask
    /// for a longer one here.
    fn many_locks_ttl(&self) -> Duration {
        self.ttl()
    }

    /// Removes the lock `name` behind its holder's back (an operator deleting the key).
    async fn remove_lock(&self, name: &str) -> HookResult {
        let _ = name;
        unsupported("remove_lock")
    }

    /// Whether the backend wakes election observers when the leader or its value changes
    /// ([`LockBackend::watch`](distlock_core::LockBackend::watch)); `false`: they read at
    /// their interval only.
    fn observers_woken(&self) -> bool {
        true
    }

    /// Cuts the connection(s) of `client` on the server side.
    async fn cut_connection(&self, client: &TestClient) -> HookResult {
        let _ = client;
        unsupported("cut_connection")
    }

    /// Stops the server (or makes it unreachable).
    async fn stop_server(&self) -> HookResult {
        unsupported("stop_server")
    }

    /// Starts the server again (data kept), and returns once it serves.
    async fn start_server(&self) -> HookResult {
        unsupported("start_server")
    }

    /// What a harness in another process (a [`child`] of the running case, made by the same
    /// factory) needs to reach this harness's locks, passed to it as [`child::inherited`]: a
    /// harness with a namespace of its own (a key prefix, a chroot, a database file) returns
    /// it, and its factory uses the inherited one when there is one. `None` when no other
    /// process can reach the locks (an in-process store). The default, an empty string, suits
    /// a server whose address and names the child finds as its parent did.
    fn process_shared(&self) -> Option<String> {
        Some(String::new())
    }
}

/// What a case concluded.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Every check held.
    Passed,
    /// The case does not apply to this configuration, for the given reason.
    Skipped(String),
}

/// What a case gets: the harness and a unique name prefix.
#[derive(Clone)]
pub struct Ctx {
    harness: Arc<dyn Harness>,
    prefix: String,
    /// The libtest name of the running test (`config::case`), for [`child`] processes.
    test: String,
}

impl std::fmt::Debug for Ctx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ctx")
            .field("prefix", &self.prefix)
            .field("test", &self.test)
            .finish_non_exhaustive()
    }
}

/// How many times [`Ctx::client`] tries to create a client.
pub const CLIENT_ATTEMPTS: u32 = 3;

impl Ctx {
    /// The harness.
    pub fn harness(&self) -> &dyn Harness {
        &*self.harness
    }

    /// A lock name unique to this run and case.
    pub fn name(&self, suffix: &str) -> String {
        format!("{}{suffix}", self.prefix)
    }

    /// The run-and-case prefix of every name this case uses.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// A new client; panics with the backend's error if it cannot connect.
    ///
    /// A retryable refusal (the server did not answer within the operation timeout) is tried
    /// again, up to [`CLIENT_ATTEMPTS`] times in all: on the 2-core CI machine, with the four
    /// backends' suites at once, a TLS connection of an unoptimized test build took most of the
    /// 2 s operation timeout by itself (ZooKeeper and PostgreSQL over TLS, 1 of 2 runs). Every
    /// case checks what the lock does once it has a client; none checks how fast one connects.
    pub async fn client(&self) -> TestClient {
        let mut attempt = 1;
        loop {
            match self.harness.client().await {
                Ok(client) => return client,
                Err(err) if err.is_retryable() && attempt < CLIENT_ATTEMPTS => {
                    eprintln!("creating a client, attempt {attempt} of {CLIENT_ATTEMPTS}: {err}");
                    attempt += 1;
                }
                Err(err) => panic!("cannot create a client: {err}"),
            }
        }
    }

    /// Options with the harness's ttl and default renewal.
    pub fn opts(&self) -> AcquireOptions {
        AcquireOptions::default().with_ttl(self.harness.ttl())
    }

    /// The harness's base ttl.
    pub fn ttl(&self) -> Duration {
        self.harness.ttl()
    }

    /// The harness's timing slack.
    pub fn slack(&self) -> Duration {
        self.harness.slack()
    }

    /// [`Harness::observers_woken`].
    pub fn observers_woken(&self) -> bool {
        self.harness.observers_woken()
    }
}

/// A boxed case future.
pub type CaseFuture = Pin<Box<dyn Future<Output = Outcome> + Send>>;

/// Writes straight to the process's stderr, past the test harness's output capture, so that
/// skip lines are always visible.
pub fn loud(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// The one table of cases: every `pub async fn` of [`cases`] with whether it is disruptive (it
/// stops the server or cuts connections, so it must not overlap other cases). The suite macro
/// and [`CASES`] are both made from it; a test checks that it names every case function.
#[doc(hidden)]
#[macro_export]
macro_rules! __case_table {
    ($callback:ident ! { $($args:tt)* }) => {
        $crate::$callback! { $($args)* ;
            exclusive_under_contention: false,
            try_acquire_on_held_lock_returns_none: false,
            acquire_times_out_at_deadline: false,
            release_frees_lock_at_once: false,
            release_wakes_blocked_waiter: false,
            crashed_holder_frees_after_ttl: false,
            dropped_guard_frees_lock_promptly: false,
            lock_delay_keeps_a_crashed_holders_name: false,
            lock_delay_does_not_hold_a_released_name: false,
            renewal_keeps_lock_beyond_ttl: false,
            stale_holder_cannot_release_or_renew: false,
            fencing_tokens_strictly_increase: false,
            removed_lock_is_reported_lost: false,
            valid_until_is_conservative: false,
            hold_limit_stops_renewal: false,
            distinct_names_are_independent: false,
            invalid_input_is_rejected: false,
            cancelled_acquires_leave_nothing_behind: false,
            reentrancy_by_explicit_owner: false,
            fifo_fairness: false,
            many_locks_stay_held: true,
            list_shows_held_locks: false,
            force_release_hands_over_with_higher_token: false,
            release_hold_frees_exactly_that_hold: false,
            release_hold_of_one_holder_keeps_the_others: false,
            holder_data_is_stored_with_the_hold_and_ends_with_it: false,
            cut_connection_is_survived_or_reported: true,
            server_unavailable_then_recovers: true,
            killed_waiter_does_not_block_the_queue: false,
            paused_waiter_does_not_block_the_queue: false,
            permits_never_exceed_n_under_contention: false,
            permit_tokens_are_unique_and_increasing: false,
            semaphore_mismatch_is_reported: false,
            invalid_kinds_are_typed_errors: false,
            crashed_permit_holder_frees_after_ttl: false,
            readers_hold_together_and_exclude_writers: false,
            read_write_exclusion_under_contention: false,
            waiting_writer_is_not_starved_by_readers: false,
            new_readers_queue_behind_a_waiting_writer: false,
            read_write_tokens_follow_the_fencing_rule: false,
            crashed_reader_frees_after_ttl_and_loss_is_reported: false,
            cancelled_shared_and_permit_waits_leave_nothing_behind: false,
            upgradeable_reader_upgrades_with_no_writer_between: false,
            downgrade_lets_readers_in_and_no_writer: false,
            multi_locks_in_any_order_never_deadlock: false,
            multi_lock_is_all_or_nothing: false,
            multi_lock_reports_loss_of_any_part: false,
            one_leader_at_a_time_with_increasing_terms: false,
            observer_sees_every_leader_change: false,
            deposed_leader_knows_before_the_next_is_elected: false,
            proclaim_changes_the_value_and_keeps_the_term: false,
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __case_list {
    (; $($case:ident : $disruptive:literal),* $(,)?) => {
        &[$((stringify!($case), $disruptive)),*]
    };
}

/// How many locks one client holds in the "many locks" case on each backend's main
/// configuration: the scale that batched renewal is built for (issue 22).
pub const SCALE_LOCKS: usize = 10_000;

/// The case that runs alone on the machine (see [`machine_turn`]).
pub const ALONE_ON_THE_MACHINE: &str = "many_locks_stay_held";

/// A conformance case's turn on the machine, held until dropped (or its process ends): see
/// [`machine_turn`].
#[derive(Debug)]
pub struct MachineTurn {
    _locks: Vec<std::fs::File>,
}

/// The machine-wide turn of a conformance case, across the test binaries that
/// `scripts/test.sh` runs at once: [`ALONE_ON_THE_MACHINE`] (`alone`) runs with no other
/// case of any binary, the others run together.
///
/// The binaries mostly wait out ttls, and run side by side; the case holding many locks is
/// the one load that does not: 10,000 acquisitions, then renewal rounds at a 3 s ttl, on a
/// 2-core machine. Beside other binaries' cases it lost locks whenever it was tried (etcd,
/// NATS, ZooKeeper, MariaDB; zk_tls's 100 locks too: the history of scripts/test.sh).
///
/// Two files in the temporary directory: every case holds the case file shared; the lone
/// case holds it exclusively, and holds the gate file exclusively while it waits, so that
/// no case starts meanwhile (the lone one is not starved by a stream of shared ones).
/// Polled, so that the wait does not block the runtime.
///
/// # Panics
/// When a file cannot be opened or locked.
pub async fn machine_turn(alone: bool) -> MachineTurn {
    turn_in(&std::env::temp_dir(), alone).await
}

/// [`machine_turn`] with its files in `dir`.
async fn turn_in(dir: &std::path::Path, alone: bool) -> MachineTurn {
    let open = |name: &str| {
        let path = dir.join(name);
        let file = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(false)
            .open(&path)
            .unwrap_or_else(|err| panic!("cannot open {}: {err}", path.display()));
        (file, path)
    };
    let (gate, gate_path) = open("distlock-conformance-gate.lock");
    let (cases, cases_path) = open("distlock-conformance-cases.lock");
    let taken = |result: Result<(), std::fs::TryLockError>, path: &std::path::Path| match result {
        Ok(()) => true,
        Err(std::fs::TryLockError::WouldBlock) => false,
        Err(std::fs::TryLockError::Error(err)) => panic!("cannot lock {}: {err}", path.display()),
    };
    let pause = || tokio::time::sleep(Duration::from_millis(50));
    if alone {
        while !taken(gate.try_lock(), &gate_path) {
            pause().await;
        }
        while !taken(cases.try_lock(), &cases_path) {
            pause().await;
        }
        return MachineTurn {
            _locks: vec![gate, cases],
        };
    }
    loop {
        // Past the gate (no lone case waiting or running), then in with the others.
        if taken(gate.try_lock_shared(), &gate_path) {
            let _ = gate.unlock();
            if taken(cases.try_lock_shared(), &cases_path) {
                return MachineTurn {
                    _locks: vec![cases],
                };
            }
        }
        pause().await;
    }
}

/// Every case by name, with whether it is disruptive (runs alone: it stops the server or cuts
/// connections).
pub const CASES: &[(&str, bool)] = __case_table!(__case_list! {});

/// Who runs on the test servers: any number of shared cases, or one disruptive case alone.
/// Unlike a fair read-write lock, a waiting disruptive case does not hold back the shared
/// ones that come after it: it runs once none is running (when the test threads left are all
/// waiting disruptive cases, at the latest). The shared cases, mostly waiting out ttls, then
/// overlap as much as the test threads allow, and the disruptive ones gather at the end,
/// instead of draining the running cases at every disruptive one of every configuration.
struct Turns {
    /// Shared cases running, and whether a disruptive one runs.
    state: std::sync::Mutex<(usize, bool)>,
    changed: tokio::sync::Notify,
}

static SERVER: Turns = Turns {
    state: std::sync::Mutex::new((0, false)),
    changed: tokio::sync::Notify::const_new(),
};

/// A case's turn on the servers (see [`Turns`]); ends when dropped.
struct Turn {
    disruptive: bool,
}

impl Turns {
    async fn enter(&'static self, disruptive: bool) -> Turn {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            {
                let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
                let (shared, alone) = &mut *state;
                if !*alone && (!disruptive || *shared == 0) {
                    if disruptive {
                        *alone = true;
                    } else {
                        *shared += 1;
                    }
                    return Turn { disruptive };
                }
            }
            changed.await;
        }
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let mut state = SERVER.state.lock().unwrap_or_else(|e| e.into_inner());
        if self.disruptive {
            state.1 = false;
        } else {
            state.0 -= 1;
        }
        drop(state);
        SERVER.changed.notify_waiters();
    }
}

/// The cases that a transport variant of a configuration (TLS, authentication: see
/// [`conformance_suite!`]) runs when `DISTLOCK_TEST_VARIANTS=transport`: every case that
/// depends on the connection (its loss, the server's restart, a renewal stream kept over
/// time, child processes that connect with the same settings, a token read back) and one
/// contended case per primitive. The other cases (input checks, queue order, listings,
/// reentrancy, ...) run the same code whatever the connection; the plain configuration runs
/// them.
pub const TRANSPORT_CASES: &[&str] = &[
    "exclusive_under_contention",
    "release_wakes_blocked_waiter",
    "crashed_holder_frees_after_ttl",
    "renewal_keeps_lock_beyond_ttl",
    "stale_holder_cannot_release_or_renew",
    "fencing_tokens_strictly_increase",
    "removed_lock_is_reported_lost",
    "cut_connection_is_survived_or_reported",
    "server_unavailable_then_recovers",
    "killed_waiter_does_not_block_the_queue",
    "permits_never_exceed_n_under_contention",
    "read_write_exclusion_under_contention",
    "multi_lock_is_all_or_nothing",
    "one_leader_at_a_time_with_increasing_terms",
];

/// A configuration of a [`conformance_suite!`].
#[doc(hidden)]
#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// Its name (the suite's module).
    pub name: &'static str,
    /// Whether it differs from another configuration only in how it connects.
    pub transport_variant: bool,
}

/// Whether transport variants run every case: `DISTLOCK_TEST_VARIANTS` is unset or `full`;
/// `transport` runs only [`TRANSPORT_CASES`] on them (`scripts/test.sh` does, the full
/// suites run in `scripts/soak.sh`).
///
/// # Panics
/// On any other value, so that a typo does not silently change what runs.
pub fn variants_in_full() -> bool {
    match std::env::var("DISTLOCK_TEST_VARIANTS").as_deref() {
        Err(_) | Ok("" | "full") => true,
        Ok("transport") => false,
        Ok(other) => panic!("DISTLOCK_TEST_VARIANTS={other:?}: expected `full` or `transport`"),
    }
}

/// Runs one case for one configuration; used by [`conformance_suite!`]. `module` is the
/// `module_path!()` of the generated test (`<crate>::<config>`), which gives the test's
/// libtest name. In a [`child`] process of this test, plays the child's part instead.
pub async fn run_case<M, MF>(
    module: &str,
    config: Config,
    case: &str,
    disruptive: bool,
    make: M,
    body: fn(Ctx) -> CaseFuture,
) where
    M: FnOnce() -> MF,
    MF: Future<Output = Option<Arc<dyn Harness>>>,
{
    let Config {
        name: config,
        transport_variant,
    } = config;
    let test = match module.split_once("::") {
        Some((_crate, path)) => format!("{path}::{case}"),
        None => case.to_owned(),
    };
    if child::is_child_of(&test) {
        let harness = make()
            .await
            .unwrap_or_else(|| panic!("the child of {test} has no {config} server"));
        child::child_role(harness).await;
        return;
    }
    if transport_variant && !TRANSPORT_CASES.contains(&case) && !variants_in_full() {
        loud(&format!(
            "SKIP {config}::{case}: a transport variant runs only the transport cases under DISTLOCK_TEST_VARIANTS=transport"
        ));
        return;
    }
    // Cases that take the server away run alone; the others share it. Each binary has
    // servers of its own, so a process-wide lock is enough for that.
    let _turn = SERVER.enter(disruptive).await;
    let Some(harness) = make().await else {
        loud(&format!(
            "SKIP {config}::{case}: the {config} test server is not configured"
        ));
        return;
    };
    // The machine's load, though, is shared with the binaries running beside this one.
    let _machine = machine_turn(case == ALONE_ON_THE_MACHINE).await;
    let run = uuid::Uuid::new_v4().simple().to_string();
    let prefix = format!("ct-{}/{case}/", &run[..8]);
    match body(Ctx {
        harness,
        prefix,
        test,
    })
    .await
    {
        Outcome::Passed => {}
        Outcome::Skipped(reason) => loud(&format!("SKIP {config}::{case}: {reason}")),
    }
}

/// Runs `scripts/services.sh ACTION NAME` (e.g. `stop-one redis-16379`, `start-one postgres`)
/// for fault hooks that stop and start a real server.
///
/// # Errors
/// The script's stderr when it fails or cannot run.
pub async fn services(action: &str, name: &str) -> Result<(), String> {
    services_of(action, &[name]).await
}

/// Runs `scripts/services.sh ACTION NAME...`: `start` with the servers of a replicated group
/// that must come back together (a Redis Cluster node started alone never sees a healthy
/// cluster). Never a bare `start`: it would also bring back the servers that the binaries
/// running beside this one have stopped for their own outage (CI, 2026-12-01: the Redis
/// Cluster's outage ended with a bare `start`, which started the MariaDB that the SQL suite had
/// just stopped, and the SQL "outage" granted a lock).
///
/// # Errors
/// The script's stderr when it fails or cannot run.
pub async fn services_of(action: &str, names: &[&str]) -> Result<(), String> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/services.sh");
    let out = tokio::process::Command::new("bash")
        .arg(script)
        .arg(action)
        .args(names)
        .output()
        .await
        .map_err(|e| format!("cannot run services.sh: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "services.sh {action} {} failed: {}",
            names.join(" "),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Reads a server variable for `backend`, or decides to skip: `None` with a loud line when it
/// is unset, unless `DISTLOCK_TEST_REQUIRE` (`all` or a comma list) names the backend, which
/// makes a missing variable a failure.
///
/// # Panics
/// When the backend is required and the variable is unset.
pub fn server_var(backend: &str, var: &str) -> Option<String> {
    if let Ok(value) = std::env::var(var)
        && !value.trim().is_empty()
    {
        return Some(value);
    }
    let required = std::env::var("DISTLOCK_TEST_REQUIRE").unwrap_or_default();
    let required = required
        .split(',')
        .map(str::trim)
        .any(|r| r == "all" || r == backend);
    assert!(
        !required,
        "{var} is not set but DISTLOCK_TEST_REQUIRE requires the {backend} backend; run `eval \"$(scripts/services.sh start)\"` first"
    );
    loud(&format!(
        "SKIP {backend}: {var} is not set (start the servers with scripts/services.sh start)"
    ));
    None
}

/// Instantiates every conformance case for one backend configuration: a module `$config` with
/// one `#[tokio::test]` per case of [`CASES`]. `$make` is an
/// `async fn() -> Option<Arc<dyn Harness>>`.
///
/// `conformance_suite!(config, make, transport_variant)` declares a configuration that differs
/// from another of the same backend only in how it connects (TLS, authentication): it runs
/// every case when `DISTLOCK_TEST_VARIANTS=full` (the default), and only
/// [`TRANSPORT_CASES`] when it is `transport` (see [`variants_in_full`]).
#[macro_export]
macro_rules! conformance_suite {
    ($config:ident, $make:expr) => {
        mod $config {
            $crate::__case_table!(__suite_cases! { $config, $make, false });
        }
    };
    ($config:ident, $make:expr, transport_variant) => {
        mod $config {
            $crate::__case_table!(__suite_cases! { $config, $make, true });
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __suite_cases {
    ($config:ident, $make:expr, $variant:literal; $($case:ident : $disruptive:literal),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() {
                $crate::run_case(
                    module_path!(),
                    $crate::Config {
                        name: stringify!($config),
                        transport_variant: $variant,
                    },
                    stringify!($case),
                    $disruptive,
                    $make,
                    |ctx| ::std::boxed::Box::pin($crate::cases::$case(ctx)),
                )
                .await;
            }
        )*
    };
}

#[cfg(test)]
mod tests {
    /// A case function missing from the table would never run, and nothing else would say so.
    #[test]
    fn the_table_names_every_case_function() {
        let sources = [
            include_str!("cases/admin.rs"),
            include_str!("cases/elections.rs"),
            include_str!("cases/exclusion.rs"),
            include_str!("cases/faults.rs"),
            include_str!("cases/input.rs"),
            include_str!("cases/kinds.rs"),
            include_str!("cases/leases.rs"),
            include_str!("cases/mod.rs"),
            include_str!("cases/processes.rs"),
        ];
        let mut functions: Vec<&str> = sources
            .iter()
            .flat_map(|source| source.lines())
            .filter_map(|line| line.strip_prefix("pub async fn "))
            .filter_map(|rest| rest.split_once("(ctx: Ctx)").map(|(name, _)| name))
            .collect();
        functions.sort_unstable();
        let mut table: Vec<&str> = super::CASES.iter().map(|(name, _)| *name).collect();
        table.sort_unstable();
        assert_eq!(functions, table);
        for case in super::TRANSPORT_CASES {
            assert!(table.contains(case), "TRANSPORT_CASES names no case {case}");
        }
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src/cases");
        let files = std::fs::read_dir(dir).map_or(0, Iterator::count);
        assert_eq!(
            files,
            sources.len(),
            "a new file in {dir} must be added above"
        );
    }
}

#[cfg(test)]
mod machine_turn_tests {
    use std::time::Duration;

    use super::turn_in;

    /// Whether `turn` is taken within 300 ms.
    async fn taken<F: Future>(turn: F) -> Option<F::Output> {
        tokio::time::timeout(Duration::from_millis(300), turn)
            .await
            .ok()
    }

    #[tokio::test]
    async fn the_lone_case_waits_for_the_others_and_holds_back_new_ones() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let first = turn_in(dir.path(), false).await;
        let second = taken(turn_in(dir.path(), false))
            .await
            .expect("cases run together");
        let dir_path = dir.path().to_owned();
        let lone = tokio::spawn(async move { turn_in(&dir_path, true).await });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!lone.is_finished(), "the lone case ran beside others");
        // Waiting, it holds back a case that comes after it.
        assert!(taken(turn_in(dir.path(), false)).await.is_none());
        drop((first, second));
        let lone = taken(lone)
            .await
            .expect("the lone case got its turn")
            .expect("task");
        assert!(taken(turn_in(dir.path(), false)).await.is_none());
        assert!(taken(turn_in(dir.path(), true)).await.is_none());
        drop(lone);
        assert!(taken(turn_in(dir.path(), false)).await.is_some());
    }
}
