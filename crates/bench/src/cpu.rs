//! CPU accounting from `/proc`: system-wide ticks from `/proc/stat` and per-process
//! utime+stime from `/proc/<pid>/stat`.
//!
//! The parsers are pure (text in, numbers out) so they are unit-tested; the readers around them
//! only do the file I/O. Ticks are `USER_HZ` units (`sysconf(_SC_CLK_TCK)`, 100 on Linux).

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};

/// Aggregate CPU time of all cores since boot, in ticks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SystemTicks {
    /// user + nice + system + irq + softirq + steal. Guest time is already inside user/nice.
    pub busy: u64,
    /// idle + iowait.
    pub idle: u64,
}

/// Parses the aggregate `cpu ` line of `/proc/stat`.
pub fn parse_proc_stat(text: &str) -> Result<SystemTicks> {
    let line = text.lines().find(|line| line.starts_with("cpu ")).context("/proc/stat has no aggregate cpu line")?;
    let fields: Vec<u64> =
        line.split_whitespace().skip(1).map(str::parse).collect::<Result<_, _>>().context("/proc/stat cpu line")?;
    if fields.len() < 8 {
        bail!("/proc/stat cpu line has {} fields, expected at least 8", fields.len());
    }
    // user nice system idle iowait irq softirq steal [guest guest_nice]
    let busy = fields[0] + fields[1] + fields[2] + fields[5] + fields[6] + fields[7];
    let idle = fields[3] + fields[4];
    Ok(SystemTicks { busy, idle })
}

/// Parses utime + stime (fields 14 and 15) from a `/proc/<pid>/stat` line. The command name in
/// parentheses may itself contain spaces and parentheses, so fields are counted after the last `)`.
pub fn parse_pid_stat(text: &str) -> Result<u64> {
    let (_, after_name) = text.rsplit_once(')').context("/proc/<pid>/stat without a command name")?;
    // After the name come field 3 (state), 4 (ppid), ...; utime is field 14, stime field 15.
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let utime: u64 = fields.get(11).context("no utime field")?.parse().context("utime")?;
    let stime: u64 = fields.get(12).context("no stime field")?.parse().context("stime")?;
    Ok(utime + stime)
}

/// The parent pid (field 4) from a `/proc/<pid>/stat` line.
pub fn parse_pid_stat_ppid(text: &str) -> Option<u32> {
    let (_, after_name) = text.rsplit_once(')')?;
    after_name.split_whitespace().nth(1)?.parse().ok()
}

/// `sysconf(_SC_CLK_TCK)`, falling back to Linux's fixed 100 if sysconf fails.
pub fn clock_ticks_per_second() -> u64 {
    // SAFETY: sysconf has no memory-safety preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(ticks).ok().filter(|&ticks| ticks > 0).unwrap_or(100)
}

/// Reads `/proc/stat` now.
pub fn read_system() -> Result<SystemTicks> {
    parse_proc_stat(&std::fs::read_to_string("/proc/stat").context("reading /proc/stat")?)
}

/// utime + stime of `pid`, or `None` when it has exited (zombies included: a zombie's counters
/// are final, and treating it as gone tells a probe that the process is no longer running).
pub fn read_process(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    if parse_pid_stat_state(&stat) == Some('Z') {
        return None;
    }
    parse_pid_stat(&stat).ok()
}

/// The state letter (field 3: R, S, D, Z, ...) from a `/proc/<pid>/stat` line.
pub fn parse_pid_stat_state(text: &str) -> Option<char> {
    let (_, after_name) = text.rsplit_once(')')?;
    after_name.split_whitespace().next()?.chars().next()
}

/// `parent` and its direct children (PostgreSQL backends are children of the postmaster).
pub fn process_and_children(parent: u32) -> Vec<u32> {
    let mut pids = vec![parent];
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return pids;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse::<u32>().ok()) else {
            continue;
        };
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        if parse_pid_stat_ppid(&stat) == Some(parent) {
            pids.push(pid);
        }
    }
    pids
}

/// Which processes to charge CPU to, by role.
#[derive(Debug, Clone, Default)]
pub struct Probe {
    /// The pooler's processes (empty for direct PostgreSQL).
    pub pooler: Vec<u32>,
    /// The load generator.
    pub pgbench: Vec<u32>,
    /// The postmaster; its children are found anew at every snapshot because backends come and go.
    pub postmaster: Option<u32>,
}

/// CPU counters at one instant.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Wall clock, µs since the Unix epoch (pgbench's per-transaction log uses the same clock).
    pub wall_us: u64,
    pub system: SystemTicks,
    pub pooler: BTreeMap<u32, u64>,
    pub pgbench: BTreeMap<u32, u64>,
    pub postgres: BTreeMap<u32, u64>,
}

impl Probe {
    /// Reads every counter now. Exited processes are simply absent.
    pub fn snapshot(&self) -> Result<Snapshot> {
        let system = read_system()?;
        let postgres_pids = self.postmaster.map(process_and_children).unwrap_or_default();
        Ok(Snapshot {
            wall_us: unix_micros(),
            system,
            pooler: ticks_of(&self.pooler),
            pgbench: ticks_of(&self.pgbench),
            postgres: ticks_of(&postgres_pids),
        })
    }
}

fn ticks_of(pids: &[u32]) -> BTreeMap<u32, u64> {
    pids.iter().filter_map(|&pid| read_process(pid).map(|ticks| (pid, ticks))).collect()
}

/// Ticks a group of processes used between two snapshots: per-pid differences for processes alive
/// at the end (a process born in between counts from zero; one that died in between is lost).
pub fn group_delta(start: &BTreeMap<u32, u64>, end: &BTreeMap<u32, u64>) -> u64 {
    end.iter().map(|(pid, &ticks)| ticks.saturating_sub(start.get(pid).copied().unwrap_or(0))).sum()
}

/// Microseconds since the Unix epoch (0 if the clock is before 1970).
pub fn unix_micros() -> u64 {
    let since_epoch = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    u64::try_from(since_epoch.as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: busy/idle sums use the documented fields; method: a literal /proc/stat excerpt.
    #[test]
    fn parses_proc_stat_aggregate_line() {
        let text = "cpu  100 5 50 1000 20 3 7 2 40 0\ncpu0 50 2 25 500 10 1 3 1 20 0\nintr 1 2 3\n";
        let ticks = parse_proc_stat(text).expect("valid");
        assert_eq!(ticks, SystemTicks { busy: 100 + 5 + 50 + 3 + 7 + 2, idle: 1000 + 20 });
        assert!(parse_proc_stat("cpu0 1 2 3\n").is_err());
        assert!(parse_proc_stat("cpu  1 2 3\n").is_err());
    }

    // Goal: utime+stime survive a command name with spaces and parentheses; method: literal line.
    #[test]
    fn parses_pid_stat_with_awkward_name() {
        let line = "4242 (my (odd) name) S 1 4242 4242 0 -1 4194560 100 0 0 0 1234 567 0 0 20 0 4 0 99 0 0";
        assert_eq!(parse_pid_stat(line).expect("valid"), 1234 + 567);
        assert_eq!(parse_pid_stat_ppid(line), Some(1));
        assert_eq!(parse_pid_stat_state(line), Some('S'));
        assert!(parse_pid_stat("4242 (x) S 1").is_err());
    }

    // Goal: group deltas count newborn processes from zero and ignore dead ones; method: maps.
    #[test]
    fn group_delta_handles_births_and_deaths() {
        let start = BTreeMap::from([(1, 100), (2, 50)]);
        let end = BTreeMap::from([(1, 130), (3, 7)]);
        assert_eq!(group_delta(&start, &end), 30 + 7);
    }

    // Goal: the live readers work on this machine; method: read our own process and /proc/stat.
    #[test]
    fn reads_live_counters() {
        assert!(read_system().expect("/proc/stat").busy > 0);
        assert!(read_process(std::process::id()).is_some());
        assert!(clock_ticks_per_second() >= 100);
    }
}
