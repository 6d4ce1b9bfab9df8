//! How much of the machine other work took while the benchmark ran: every core's busy time
//! (`/proc/stat`) minus this process's and its reaped host processes' (`getrusage`). The load
//! average cannot tell: the benchmark's own host processes keep it near the core count.

use std::time::{Duration, Instant};

use crate::cpu::{clock_ticks_per_second, read_system};

/// CPU counters when the benchmark started.
pub struct OtherWork {
    started: Instant,
    system_busy: Option<Duration>,
    own: Duration,
}

impl OtherWork {
    pub fn start() -> OtherWork {
        OtherWork { started: Instant::now(), system_busy: system_busy(), own: own_cpu() }
    }

    /// Other work's CPU time since the start ÷ (elapsed × cores); `None` if `/proc/stat` is unreadable.
    pub fn share(&self, cores: usize) -> Option<f64> {
        let busy = system_busy()?.checked_sub(self.system_busy?)?;
        let own = own_cpu().saturating_sub(self.own);
        let capacity = self.started.elapsed().as_secs_f64() * cores.max(1) as f64;
        (capacity > 0.0).then(|| (busy.saturating_sub(own).as_secs_f64() / capacity).min(1.0))
    }
}

fn system_busy() -> Option<Duration> {
    let ticks = read_system().ok()?.busy;
    Some(Duration::from_secs_f64(ticks as f64 / clock_ticks_per_second() as f64))
}

/// User + system time of this process and of its children that have been waited for (every
/// host process of a finished run).
fn own_cpu() -> Duration {
    [libc::RUSAGE_SELF, libc::RUSAGE_CHILDREN].into_iter().map(usage).sum()
}

fn usage(who: libc::c_int) -> Duration {
    // SAFETY: rusage is plain old data, for which all-zero bytes are a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes into the struct we pass and reads nothing else.
    if unsafe { libc::getrusage(who, &mut usage) } != 0 {
        return Duration::ZERO;
    }
    let time = |tv: libc::timeval| Duration::new(tv.tv_sec as u64, tv.tv_usec as u32 * 1000);
    time(usage.ru_utime) + time(usage.ru_stime)
}
