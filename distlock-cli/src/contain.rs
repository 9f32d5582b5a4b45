//! What keeps every process of `distlock run`'s command from outliving distlock, even when
//! distlock itself is killed with SIGKILL (when it cannot act):
//!
//! - **A supervisor**: a small process (distlock itself, re-executed with [`SUPERVISE_ARG`]) in
//!   a process group of its own, started before the command. It blocks reading a pipe whose
//!   only writer is distlock. The command, before it execs, writes its process id into that
//!   pipe, so the supervisor knows the command's process group before any of the command's
//!   code runs. When distlock ends normally it writes [`DONE`] (its command's processes are
//!   gone by then); when distlock dies any other way the kernel closes the pipe and the
//!   supervisor kills what is left: SIGKILL to the process group, and the whole cgroup.
//! - **A cgroup v2 leaf** (`--contain cgroup`, or `auto` when the cgroup hierarchy is
//!   writable): the command moves itself into a fresh cgroup before it execs, so everything it
//!   starts is in it, including processes that left its process group (`setsid`, `setpgid`,
//!   daemons). `cgroup.kill` kills them all at once. distlock waits for the cgroup to be empty
//!   before it releases the lock.
//!
//! What each mode catches when distlock is SIGKILLed: the command (PR_SET_PDEATHSIG, both
//! modes); every process of its process group (both modes, through the supervisor); processes
//! that left the group (cgroup mode only); nothing if the supervisor itself is SIGKILLed first
//! (then only the command dies, by its parent-death signal).

use std::ffi::OsString;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{SigSet, SigmaskHow, Signal, kill, killpg, pthread_sigmask};
use nix::unistd::Pid;

/// The first argument that makes distlock a supervisor (see the module docs).
pub(crate) const SUPERVISE_ARG: &str = "__distlock-supervise";
/// What distlock writes to its supervisor when its command's processes are gone.
const DONE: u8 = b'D';
/// How long the supervisor waits for a killed cgroup to empty before it removes it.
const EMPTY_WAIT: Duration = Duration::from_secs(5);

/// How the command's processes are held together (`--contain`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Contain {
    /// A cgroup v2 leaf when one can be made here, else the process group.
    Auto,
    /// A cgroup v2 leaf; refuse to run the command when none can be made.
    Cgroup,
    /// The command's process group (processes that leave it are not caught).
    ProcessGroup,
}

/// A cgroup v2 directory made for one command.
#[derive(Debug)]
pub(crate) struct Cgroup {
    dir: PathBuf,
}

impl Cgroup {
    /// Makes a fresh leaf below distlock's own cgroup.
    ///
    /// # Errors
    /// No cgroup v2 hierarchy, or it is not writable here.
    pub(crate) fn create() -> std::io::Result<Self> {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
        // Fields: id parent major:minor root mount-point options... - fstype source options.
        let mount = mountinfo
            .lines()
            .find_map(|line| {
                let (left, right) = line.split_once(" - ")?;
                (right.split(' ').next() == Some("cgroup2")).then(|| left.split(' ').nth(4))?
            })
            .ok_or_else(|| std::io::Error::other("no cgroup v2 hierarchy is mounted"))?;
        let own = std::fs::read_to_string("/proc/self/cgroup")?;
        let own = own
            .lines()
            .find_map(|line| line.strip_prefix("0::"))
            .ok_or_else(|| std::io::Error::other("distlock is in no cgroup v2"))?;
        let parent = Path::new(mount).join(own.trim_start_matches('/'));
        let dir = parent.join(format!(
            "distlock-run-{}-{}",
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir(&dir)?;
        Ok(Self { dir })
    }

    /// The path of the cgroup, for the supervisor.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// `cgroup.procs`, opened for writing "0" (which moves the writing process in).
    pub(crate) fn procs_for_joining(&self) -> std::io::Result<File> {
        std::fs::OpenOptions::new()
            .write(true)
            .open(self.dir.join("cgroup.procs"))
    }

    /// Whether a process is left in the cgroup.
    pub(crate) fn populated(&self) -> bool {
        populated(&self.dir)
    }

    /// Sends `signal` to every process in the cgroup (SIGKILL: all at once, by the kernel).
    pub(crate) fn signal(&self, signal: Signal) {
        signal_cgroup(&self.dir, signal);
    }

    /// Removes the (empty) cgroup.
    pub(crate) fn remove(&self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

fn populated(dir: &Path) -> bool {
    // `populated 1` while a live process is in it or below; unreadable: assume the worst.
    std::fs::read_to_string(dir.join("cgroup.events"))
        .map_or(true, |events| events.lines().any(|l| l == "populated 1"))
}

fn signal_cgroup(dir: &Path, signal: Signal) {
    if signal == Signal::SIGKILL && std::fs::write(dir.join("cgroup.kill"), "1").is_ok() {
        return;
    }
    if let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) {
        for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
            let _ = kill(Pid::from_raw(pid), signal);
        }
    }
}

/// The running supervisor: distlock's end of its pipe.
#[derive(Debug)]
pub(crate) struct Supervisor {
    pipe: Option<std::io::PipeWriter>,
}

impl Supervisor {
    /// Starts the supervisor of a command that is about to be spawned; `cgroup` is the
    /// command's cgroup, if it has one. Returns the supervisor and the pipe end the command
    /// writes its process id to before it execs ([`announce`]).
    ///
    /// # Errors
    /// The pipe or the process could not be made.
    pub(crate) fn start(cgroup: Option<&Cgroup>) -> std::io::Result<(Self, std::io::PipeWriter)> {
        let (reader, writer) = std::io::pipe()?;
        let exe = std::env::current_exe()?;
        let mut command = std::process::Command::new(exe);
        let cgroup_arg: OsString = cgroup.map_or_else(|| "-".into(), |c| c.dir.clone().into());
        command
            .arg(SUPERVISE_ARG)
            .arg(cgroup_arg)
            .stdin(Stdio::from(reader))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .env_clear()
            // Out of distlock's process group: a Ctrl-C at the terminal must not end it.
            .process_group(0);
        let child = command.spawn()?;
        // Not waited for: it exits when distlock's pipe end closes; distlock (a subreaper, and
        // its parent) or init reaps it.
        drop(child);
        let for_command = writer.try_clone()?;
        Ok((Self { pipe: Some(writer) }, for_command))
    }

    /// Tells the supervisor that the command's processes are gone: it exits without killing.
    pub(crate) fn done(&mut self) {
        if let Some(mut pipe) = self.pipe.take() {
            let _ = pipe.write_all(&[DONE]);
        }
    }
}

/// In the forked command before exec: writes its process id (its process group's id) to the
/// supervisor. Async-signal-safe: one `write`, nothing allocated.
pub(crate) fn announce(pipe: &std::io::PipeWriter) -> std::io::Result<()> {
    let pid = nix::unistd::getpid().as_raw().to_ne_bytes();
    nix::unistd::write(pipe.as_fd(), &pid)?;
    Ok(())
}

/// In the forked command before exec: moves it into its cgroup (writing "0" to `cgroup.procs`
/// moves the writer). Async-signal-safe: one `write`.
pub(crate) fn join(procs: &File) -> std::io::Result<()> {
    nix::unistd::write(procs.as_fd(), b"0")?;
    Ok(())
}

/// The supervisor's program, when distlock was started as one (see the module docs); `None`
/// for every other invocation.
pub(crate) fn supervisor_main() -> Option<ExitCode> {
    let mut args = std::env::args_os().skip(1);
    if args.next()? != SUPERVISE_ARG {
        return None;
    }
    let cgroup = args.next().filter(|a| a != "-").map(PathBuf::from);
    // Only the pipe ends the supervisor: the signals a terminal or a service manager sends
    // stay pending until it exits.
    let mut blocked = SigSet::empty();
    for signal in [
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGQUIT,
        Signal::SIGPIPE,
    ] {
        blocked.add(signal);
    }
    let _ = pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&blocked), None);
    let mut stdin = std::io::stdin().lock();
    let mut pid = [0u8; 4];
    let group = stdin
        .read_exact(&mut pid)
        .ok()
        .map(|()| Pid::from_raw(i32::from_ne_bytes(pid)))
        .filter(|pid| pid.as_raw() > 1);
    let mut last = [0u8; 1];
    let done = group.is_some() && stdin.read_exact(&mut last).is_ok() && last[0] == DONE;
    if !done {
        // distlock ended without saying its command is gone: nothing of it may run on.
        if let Some(dir) = &cgroup {
            signal_cgroup(dir, Signal::SIGKILL);
        }
        if let Some(group) = group {
            let _ = killpg(group, Signal::SIGKILL);
        }
    }
    if let Some(dir) = &cgroup {
        let deadline = Instant::now() + EMPTY_WAIT;
        while populated(dir) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = std::fs::remove_dir(dir);
    }
    Some(ExitCode::SUCCESS)
}
