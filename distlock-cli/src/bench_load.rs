//! `distlock bench --background-load N`: N busy processes beside the whole run, so that the
//! floors' blocks and distlock's are measured on the same loaded machine.
//!
//! Each busy process is distlock itself, re-executed with [`BUSY_ARG`] and the bench's pid: it
//! spins on arithmetic and ends as soon as its parent is gone (checked every 10 ms), so a
//! bench killed with SIGKILL leaves nothing spinning. The bench kills and reaps them when the
//! run ends, on every path (a [`Drop`]), and reports the CPU time they got.

use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use nix::sys::resource::{UsageWho, getrusage};

use crate::exit::{Failure, OTHER};

/// The hidden first argument of a busy process; the second is the bench's pid.
pub(crate) const BUSY_ARG: &str = "__distlock-busy";

/// A busy process's main, when this process is one: `None` otherwise.
pub(crate) fn busy_main() -> Option<ExitCode> {
    let mut args = std::env::args().skip(1);
    if args.next()? != BUSY_ARG {
        return None;
    }
    let Some(parent) = args.next().and_then(|p| p.parse::<u32>().ok()) else {
        return Some(ExitCode::from(2));
    };
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    while std::os::unix::process::parent_id() == parent {
        let slice = Instant::now();
        while slice.elapsed() < Duration::from_millis(10) {
            for _ in 0..10_000 {
                x = std::hint::black_box(x.rotate_left(7) ^ x.wrapping_mul(31));
            }
        }
    }
    Some(ExitCode::SUCCESS)
}

/// The running busy processes.
pub(crate) struct Load {
    children: Vec<Child>,
    started: Instant,
    cpu_before: Duration,
}

impl Load {
    /// Starts `n` busy processes.
    pub(crate) fn start(n: usize) -> Result<Self, Failure> {
        let exe = std::env::current_exe()
            .map_err(|e| Failure::new(OTHER, format!("--background-load: {e}")))?;
        let mut load = Self {
            children: Vec::with_capacity(n),
            started: Instant::now(),
            cpu_before: children_cpu(),
        };
        let pid = std::process::id().to_string();
        for _ in 0..n {
            let child = Command::new(&exe)
                .args([BUSY_ARG, &pid])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| {
                    Failure::new(
                        OTHER,
                        format!("--background-load: cannot start a busy process: {e}"),
                    )
                })?;
            load.children.push(child);
        }
        Ok(load)
    }

    /// Stops and reaps the busy processes; a line saying how much CPU they got.
    pub(crate) fn finish(mut self) -> String {
        let n = self.children.len();
        let still = self.stop();
        let wall = self.started.elapsed();
        let cpu = children_cpu().saturating_sub(self.cpu_before);
        format!(
            "- Background load: {n} busy processes ({still} still running at the end) got {:.1} s of CPU in {:.1} s ({:.2} cores).",
            cpu.as_secs_f64(),
            wall.as_secs_f64(),
            cpu.as_secs_f64() / wall.as_secs_f64().max(1e-9)
        )
    }

    /// Kills and reaps every busy process; how many were still running.
    fn stop(&mut self) -> usize {
        let mut running = 0;
        for mut child in self.children.drain(..) {
            if matches!(child.try_wait(), Ok(None)) {
                running += 1;
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        running
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The CPU time of the reaped children of this process.
fn children_cpu() -> Duration {
    getrusage(UsageWho::RUSAGE_CHILDREN).map_or(Duration::ZERO, |u| {
        let t = |tv: nix::sys::time::TimeVal| {
            Duration::new(
                u64::try_from(tv.tv_sec()).unwrap_or(0),
                u32::try_from(tv.tv_usec()).unwrap_or(0) * 1000,
            )
        };
        t(u.user_time()) + t(u.system_time())
    })
}
