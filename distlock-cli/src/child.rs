//! The command of `distlock run` as a process group that cannot outlive its lock.
//!
//! - The command leads a process group of its own: distlock signals the whole group (the
//!   command and everything it started that stayed in the group), never only the first process.
//! - Linux `PR_SET_PDEATHSIG`: when distlock dies in a way it cannot handle (SIGKILL, a crash,
//!   the OOM killer), the kernel sends SIGKILL to the command at once.
//! - distlock is a child subreaper (`PR_SET_CHILD_SUBREAPER`): processes of the group orphaned
//!   by the command's exit become distlock's children, so distlock can wait until the whole
//!   group is gone (and reap it) before it releases the lock.
//! - When distlock runs in the foreground of a terminal, the command's group gets the terminal
//!   (as a shell does for a job), so an interactive command can read it and Ctrl-C reaches it.
//! - distlock ignores the signals that stop a job (SIGTSTP, SIGTTOU) from its command's start
//!   on: a stopped distlock would neither renew nor kill (see `never_stop`).
//! - A supervisor and, where one can be made, a cgroup v2 leaf catch what the parent-death
//!   signal does not: the processes the command started (see `contain.rs`).

use std::io::IsTerminal;
use std::process::ExitStatus;
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{SigHandler, SigSet, SigmaskHow, Signal, killpg, pthread_sigmask, signal};
use nix::sys::wait::{WaitPidFlag, waitpid};
use nix::unistd::{Pid, getpgrp, getpid, getppid, setpgid, tcgetpgrp, tcsetpgrp};
use tokio::process::{Child, Command};

use crate::contain::{self, Cgroup, Contain, Supervisor};

/// How often the group is checked while distlock waits for it to be gone.
const GROUP_POLL: Duration = Duration::from_millis(20);
/// How long distlock waits for a group that got SIGKILL to disappear before it gives up.
const AFTER_KILL: Duration = Duration::from_secs(2);

/// Makes distlock the reaper of the processes its command orphans (see the module docs).
pub(crate) fn become_subreaper() {
    // Without it, orphans are reaped by init instead: draining the group only takes longer.
    if let Err(err) = nix::sys::prctl::set_child_subreaper(true) {
        tracing::debug!(%err, "cannot become a child subreaper");
    }
}

/// Makes the process `command` starts die (SIGKILL) with the thread that spawns it, however
/// distlock ends; if distlock is already gone when the child would exec, the child dies so
/// before it (see `arm_parent_death`).
///
/// The signal is armed between fork and exec, so no instant of the child's program runs
/// without it. Like [`CommandGroup::spawn`], spawn from a thread that lives as long as
/// distlock (the main thread or a runtime worker thread, not a blocking-pool thread).
pub(crate) fn dies_with_distlock(command: &mut Command) {
    let parent = getpid();
    // SAFETY: the closure runs in the forked child before exec and makes only
    // async-signal-safe system calls (prctl, getppid, kill); it allocates nothing and takes no
    // lock.
    #[expect(
        unsafe_code,
        reason = "pre_exec is the only way to arm PR_SET_PDEATHSIG"
    )]
    unsafe {
        command.pre_exec(move || arm_parent_death(parent));
    }
}

/// In a forked child before exec: SIGKILL when the parent dies, and at once if `parent`
/// already died (the child was re-parented before the signal was armed), as the armed signal
/// would have done. Not an error: the spawn reports one through a pipe to the parent, and
/// with the parent gone that write fails and the standard library aborts the child, printing
/// "fatal runtime error" on the command's standard error (seen in CI, when a test killed
/// distlock as it spawned its command).
fn arm_parent_death(parent: Pid) -> std::io::Result<()> {
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
    if getppid() != parent {
        nix::sys::signal::raise(Signal::SIGKILL)?;
        // Not reached: SIGKILL cannot be caught. An errno, not `io::Error::other`: nothing
        // may be allocated between fork and exec.
        return Err(Errno::ESRCH.into());
    }
    Ok(())
}

/// The running command: the leader of its own process group, perhaps in a cgroup of its own,
/// watched by a supervisor.
#[derive(Debug)]
pub(crate) struct CommandGroup {
    child: Child,
    pgid: Pid,
    cgroup: Option<Cgroup>,
    supervisor: Supervisor,
    /// Whether the group was given the terminal (given back by [`CommandGroup::finish`]).
    terminal: bool,
    finished: bool,
}

/// Why the command could not be started: the command itself (not found, not executable), or
/// what should have contained it.
#[derive(Debug)]
pub(crate) enum SpawnError {
    Command(std::io::Error),
    Contain(String),
}

impl CommandGroup {
    /// Starts `command` in a new process group that dies with distlock, contained as `contain`
    /// says (see the module docs).
    ///
    /// Must be called from the thread that lives as long as distlock (the main thread): the
    /// kernel sends the parent-death signal when the thread that forked the child exits.
    pub(crate) fn spawn(mut command: Command, contain: Contain) -> Result<Self, SpawnError> {
        let cgroup = match contain {
            Contain::ProcessGroup => None,
            Contain::Auto => Cgroup::create()
                .inspect_err(|err| tracing::debug!(%err, "no cgroup; the process group only"))
                .ok(),
            Contain::Cgroup => Some(Cgroup::create().map_err(|err| {
                SpawnError::Contain(format!("--contain cgroup: cannot make a cgroup: {err}"))
            })?),
        };
        let joining = match &cgroup {
            Some(cgroup) => Some(cgroup.procs_for_joining().map_err(|err| {
                SpawnError::Contain(format!("cannot join {}: {err}", cgroup.dir().display()))
            })?),
            None => None,
        };
        let (supervisor, announce_to) = Supervisor::start(cgroup.as_ref())
            .map_err(|err| SpawnError::Contain(format!("cannot start the supervisor: {err}")))?;
        let parent = getpid();
        let terminal = in_terminal_foreground();
        let kept = never_stop();
        let pre_exec = move || -> std::io::Result<()> {
            // Between fork and exec only async-signal-safe calls: these are plain syscalls.
            // The parent's death first: should distlock be gone already, the child dies here,
            // before a step below can fail for that reason and report it to nobody.
            arm_parent_death(parent)?;
            setpgid(Pid::from_raw(0), Pid::from_raw(0))?;
            if let Some(procs) = &joining {
                contain::join(procs)?;
            }
            contain::announce(&announce_to)?;
            if terminal {
                // A background group may take the terminal only with SIGTTOU blocked.
                let ttou = SigSet::from(Signal::SIGTTOU);
                pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&ttou), None)?;
                let taken = tcsetpgrp(std::io::stdin(), getpid());
                pthread_sigmask(SigmaskHow::SIG_UNBLOCK, Some(&ttou), None)?;
                taken?;
            }
            // The command gets the dispositions distlock had before `never_stop`.
            for (stop, before) in kept.into_iter().flatten() {
                // SAFETY: setting a disposition (default or ignore, no handler) is the
                // sigaction system call.
                #[expect(unsafe_code, reason = "signal(2) has no safe wrapper in nix")]
                unsafe {
                    signal(stop, before)?;
                }
            }
            Ok(())
        };
        // SAFETY: the closure runs in the forked child before exec and makes only
        // async-signal-safe system calls (setpgid, write, sigprocmask, tcsetpgrp, sigaction,
        // prctl, getppid, getpid, kill) on values made before the fork; it allocates nothing
        // and takes no lock.
        #[expect(
            unsafe_code,
            reason = "pre_exec is the only way to arm PR_SET_PDEATHSIG"
        )]
        unsafe {
            command.pre_exec(pre_exec);
        }
        let spawned = command.spawn();
        // The command's copies of the pipe and of cgroup.procs go with the closure.
        drop(command);
        let child = match spawned {
            Ok(child) => child,
            Err(err) => {
                if let Some(cgroup) = &cgroup {
                    cgroup.remove();
                }
                return Err(SpawnError::Command(err));
            }
        };
        let pid = child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .ok_or_else(|| SpawnError::Contain("the command has no process id".into()))?;
        Ok(Self {
            child,
            pgid: Pid::from_raw(pid),
            cgroup,
            supervisor,
            terminal,
            finished: false,
        })
    }

    /// Whether the command is contained by a cgroup (else by its process group only).
    pub(crate) fn in_cgroup(&self) -> bool {
        self.cgroup.is_some()
    }

    /// Waits for the command (the group leader) to exit. Cancel-safe.
    pub(crate) async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        self.child.wait().await
    }

    /// Sends `signal` to every process of the group (a signal passed on, as a shell does), and
    /// SIGCONT after a signal that ends a process (see [`continues`]).
    pub(crate) fn signal(&self, signal: Signal) {
        // ESRCH: the group is gone already.
        let _ = killpg(self.pgid, signal);
        if continues(signal) {
            let _ = killpg(self.pgid, Signal::SIGCONT);
        }
    }

    /// Sends `signal` to everything the command started: its group, and its cgroup if any.
    pub(crate) fn signal_all(&self, signal: Signal) {
        self.signal(signal);
        if let Some(cgroup) = &self.cgroup {
            cgroup.signal(signal);
            if continues(signal) {
                cgroup.signal(Signal::SIGCONT);
            }
        }
    }

    /// SIGKILL to everything the command started, then waits until it is all gone (the lease
    /// may end any moment: no grace).
    pub(crate) async fn kill(&mut self) {
        self.signal_all(Signal::SIGKILL);
        let _ = self.child.wait().await;
        self.finish(Duration::ZERO, true).await;
    }

    /// Whether a process of the command is left (its group, or its cgroup).
    fn any_left(&self) -> bool {
        killpg(self.pgid, None) != Err(Errno::ESRCH)
            || self.cgroup.as_ref().is_some_and(Cgroup::populated)
    }

    /// After the command exited: waits until no process of its group is left (SIGTERM to the
    /// stragglers, SIGKILL after `grace`), then gives the terminal back. Only then may the lock
    /// be released. `quiet` drops the notes about stragglers.
    pub(crate) async fn finish(&mut self, grace: Duration, quiet: bool) {
        let started = tokio::time::Instant::now();
        let mut termed = false;
        let mut killed_at = None;
        loop {
            reap_orphans();
            if !self.any_left() {
                break;
            }
            let waited = started.elapsed();
            if !termed {
                termed = true;
                if !quiet {
                    crate::out::stderr_line(
                        "distlock: the command left processes running; \
                         terminating them before the lock is released",
                    );
                }
                self.signal_all(Signal::SIGTERM);
            } else if killed_at.is_none() && waited >= grace {
                if !quiet {
                    crate::out::stderr_line(
                        "distlock: processes of the command ignored SIGTERM; killing them",
                    );
                }
                self.signal_all(Signal::SIGKILL);
                killed_at = Some(waited);
            } else if killed_at.is_some_and(|at| waited >= at + AFTER_KILL) {
                // Only zombies that another process must reap can be left after SIGKILL.
                break;
            }
            tokio::time::sleep(GROUP_POLL).await;
        }
        self.give_back_terminal();
        if let Some(cgroup) = &self.cgroup {
            cgroup.remove();
        }
        self.supervisor.done();
        self.finished = true;
    }

    fn give_back_terminal(&mut self) {
        if !std::mem::take(&mut self.terminal) {
            return;
        }
        let stdin = std::io::stdin();
        if tcgetpgrp(&stdin) != Ok(self.pgid) {
            return;
        }
        let ttou = SigSet::from(Signal::SIGTTOU);
        let mut old = SigSet::empty();
        if pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&ttou), Some(&mut old)).is_ok() {
            let _ = tcsetpgrp(&stdin, getpgrp());
            let _ = pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&old), None);
        }
    }
}

impl Drop for CommandGroup {
    /// A group left behind by an early return (an error) is killed: it must not run on
    /// without the lock.
    fn drop(&mut self) {
        if !self.finished {
            // The supervisor (told nothing) kills what is left when distlock exits.
            self.signal_all(Signal::SIGKILL);
            self.give_back_terminal();
        }
    }
}

/// Whether SIGCONT follows `signal`: a stopped process (Ctrl-Z in the command's terminal,
/// `kill -STOP`) keeps a signal pending until it is continued, and distlock, waiting for the
/// command to exit, waited for ever. A shell's `kill` continues a stopped job after SIGTERM and
/// SIGHUP too; SIGKILL needs no help.
fn continues(signal: Signal) -> bool {
    matches!(
        signal,
        Signal::SIGTERM | Signal::SIGHUP | Signal::SIGINT | Signal::SIGQUIT
    )
}

/// Whether distlock's process group owns the terminal on standard input.
fn in_terminal_foreground() -> bool {
    let stdin = std::io::stdin();
    stdin.is_terminal() && tcgetpgrp(&stdin) == Ok(getpgrp())
}

/// Makes distlock ignore the signals that stop a job (SIGTSTP, SIGTTOU), as its command is about
/// to start: a stopped distlock neither renews nor kills, and its command runs on without the
/// lock. Ctrl-Z reaches distlock when its command does not have the terminal (stdin not a
/// terminal), and once the command's group has it, distlock is in the background, where with
/// `stty tostop` its first line on the terminal (a loss, failing renewals) would stop it. The
/// dispositions they had before, for the command (`None`: left as it was).
fn never_stop() -> [Option<(Signal, SigHandler)>; 2] {
    [Signal::SIGTSTP, Signal::SIGTTOU].map(|stop| {
        // SAFETY: setting a disposition (ignore, no handler) is the sigaction system call.
        #[expect(unsafe_code, reason = "signal(2) has no safe wrapper in nix")]
        let before = unsafe { signal(stop, SigHandler::SigIgn) };
        before
            .inspect_err(|err| tracing::debug!(%err, %stop, "cannot ignore a stop signal"))
            .ok()
            .map(|before| (stop, before))
    })
}

/// Reaps exited orphans that were re-parented to distlock (the subreaper), so that they leave
/// the process group. Called only after the command itself was collected.
fn reap_orphans() {
    while let Ok(status) = waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
        if status == nix::sys::wait::WaitStatus::StillAlive {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::{CommandExt, ExitStatusExt};
    use std::process::Stdio;

    use super::*;

    /// A child whose parent is gone when it would exec dies of SIGKILL there, as the armed
    /// parent-death signal would have killed it, and prints nothing: an error would go to a
    /// parent that cannot read it, and the standard library aborts a child whose error it
    /// cannot send. Here the parent lives and the child is told another one (a pid above any
    /// pid_max), so it sees its parent gone; before, its spawn failed with ESRCH.
    #[test]
    fn a_child_whose_parent_is_gone_dies_quietly_before_exec() {
        let mut command = std::process::Command::new("true");
        command.stdout(Stdio::piped()).stderr(Stdio::piped());
        // SAFETY: the closure makes only async-signal-safe system calls (prctl, getppid,
        // kill) and allocates nothing.
        #[expect(unsafe_code, reason = "pre_exec is how the child arms the signal")]
        unsafe {
            command.pre_exec(|| arm_parent_death(Pid::from_raw(i32::MAX)));
        }
        let output = command.output().expect("the spawn");
        assert_eq!(output.status.signal(), Some(9), "{:?}", output.status);
        assert!(output.stderr.is_empty(), "{:?}", output.stderr);
    }
}
