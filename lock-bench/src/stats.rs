//! Latency recording (hdrhistogram, nanosecond resolution) and progress lines.

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;

/// Percentiles of a latency distribution, in microseconds (recorded with nanosecond
/// resolution and three significant digits).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct LatencySummary {
    /// Number of samples.
    pub count: u64,
    /// Mean.
    pub mean_us: f64,
    /// Median.
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// Largest sample.
    pub max_us: f64,
}

pub(crate) struct Recorder(Histogram<u64>);

impl Recorder {
    pub(crate) fn new() -> Self {
        // Auto-resizing, so no sample is ever out of range.
        Self(Histogram::new(3).expect("3 significant digits is a valid precision"))
    }

    pub(crate) fn record(&mut self, sample: Duration) {
        // `record` grows the histogram as needed (`saturating_record` would clamp to its
        // initial range instead); it can only fail for values past what it can ever track.
        let nanos = u64::try_from(sample.as_nanos()).unwrap_or(u64::MAX);
        if self.0.record(nanos).is_err() {
            self.0.saturating_record(nanos);
        }
    }

    pub(crate) fn merge(&mut self, other: &Self) {
        // Cannot fail: the histogram resizes itself.
        let _ = self.0.add(&other.0);
    }

    pub(crate) fn summary(&self) -> LatencySummary {
        let us = |nanos: u64| nanos as f64 / 1000.0;
        if self.0.is_empty() {
            return LatencySummary::default();
        }
        LatencySummary {
            count: self.0.len(),
            mean_us: self.0.mean() / 1000.0,
            p50_us: us(self.0.value_at_quantile(0.5)),
            p99_us: us(self.0.value_at_quantile(0.99)),
            max_us: us(self.0.max()),
        }
    }
}

/// Prints a line to stderr at most once a second, starting one second in.
pub(crate) struct Progress {
    prefix: String,
    enabled: bool,
    last: Instant,
}

impl Progress {
    pub(crate) fn new(enabled: bool, target: &str, scenario: &str) -> Self {
        Self {
            prefix: format!("[{target}] {scenario}"),
            enabled,
            last: Instant::now(),
        }
    }

    /// Whether a line is due; `line` is only built then.
    pub(crate) fn tick(&mut self, line: impl FnOnce() -> String) {
        if self.enabled && self.last.elapsed() >= Duration::from_secs(1) {
            self.last = Instant::now();
            eprintln!("{}: {}", self.prefix, line());
        }
    }
}

/// `part / whole`, or `None` when `whole` is zero.
pub(crate) fn share(part: u64, whole: u64) -> Option<f64> {
    (whole > 0).then(|| part as f64 / whole as f64)
}

/// Events per second.
pub(crate) fn rate(events: u64, elapsed: Duration) -> f64 {
    let secs = elapsed.as_secs_f64();
    if secs > 0.0 {
        events as f64 / secs
    } else {
        0.0
    }
}

pub(crate) fn micros(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e6
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_is_in_microseconds_and_not_clamped() {
        let mut a = Recorder::new();
        a.record(Duration::from_micros(10));
        a.record(Duration::from_millis(1));
        let mut b = Recorder::new();
        b.record(Duration::from_millis(2));
        b.record(Duration::from_secs(3600));
        a.merge(&b);
        let s = a.summary();
        assert_eq!(s.count, 4);
        assert!((9.99..=10.01).contains(&Recorder::single(Duration::from_micros(10)).p50_us));
        assert!((999.0..=1001.0).contains(&s.p50_us), "{s:?}");
        assert!((3.59e9..=3.61e9).contains(&s.max_us), "{s:?}");
        assert!(s.p50_us <= s.p99_us && s.p99_us <= s.max_us);
        assert_eq!(Recorder::new().summary(), LatencySummary::default());
    }

    impl Recorder {
        fn single(sample: Duration) -> LatencySummary {
            let mut r = Self::new();
            r.record(sample);
            r.summary()
        }
    }
}

/// CPU time accumulated over measured blocks; unknown once one block could not be measured.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CpuTotal(Option<Duration>);

impl CpuTotal {
    pub(crate) fn new() -> Self {
        Self(Some(Duration::ZERO))
    }

    /// Adds the CPU time between `start` and `end` (both from [`crate::Instruments::cpu_time`]).
    pub(crate) fn add(&mut self, start: Option<Duration>, end: Option<Duration>) {
        self.0 = match (self.0, start, end) {
            (Some(sum), Some(start), Some(end)) => Some(sum + end.saturating_sub(start)),
            _ => None,
        };
    }

    /// Microseconds per cycle over `cycles` cycles.
    pub(crate) fn per_cycle_us(self, cycles: u64) -> Option<f64> {
        let cpu = self.0.filter(|_| cycles > 0)?;
        Some(cpu.as_secs_f64() * 1e6 / cycles as f64)
    }
}

#[cfg(test)]
mod cpu_tests {
    use super::*;

    #[test]
    fn a_total_is_unknown_once_a_block_was() {
        let mut total = CpuTotal::new();
        let (a, b) = (Duration::from_micros(100), Duration::from_micros(400));
        total.add(Some(a), Some(b));
        total.add(Some(a), Some(b));
        assert_eq!(total.per_cycle_us(3).map(f64::round), Some(200.0));
        assert_eq!(total.per_cycle_us(0), None);
        total.add(None, Some(b));
        assert_eq!(total.per_cycle_us(3), None);
    }
}
