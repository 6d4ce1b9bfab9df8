//! Facts about the machine and the software under test, recorded next to every result so a
//! number can be traced to where and how it was measured.

use std::path::Path;
use std::process::Command;

use serde::{Deserialize, Serialize};

/// The machine a benchmark ran on, and how busy it was: the one description every report
/// records (`machine` in its JSON) and prints in its markdown header.
///
/// Every field has a serde default, so reports written before a field existed still parse (the
/// engine benchmark merges `--only` runs into the committed engine.json).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Machine {
    /// CPUs this process may run on.
    #[serde(alias = "cores")]
    pub nproc: usize,
    pub cpu_model: String,
    pub memory_mib: u64,
    /// `ostype osrelease arch`, e.g. `Linux 6.1.0-18-amd64 x86_64`.
    pub kernel: String,
    /// `/sys/kernel/mm/transparent_hugepage/enabled` (the engine's chunk pool relies on it).
    pub transparent_hugepages: String,
    /// `/proc/sys/vm/nr_hugepages`.
    pub hugetlb_pages: String,
    pub somaxconn: String,
    pub ip_local_port_range: String,
    /// `/proc/loadavg` (1, 5, 15 min) when the benchmark started and when it ended: other work
    /// on the shared machine perturbs the figures.
    pub load_average_before: String,
    pub load_average_after: String,
    /// What the core count means for the figures.
    pub note: String,
}

impl Machine {
    /// The machine as it is now; the load average now is the "before" (and, until
    /// [`Machine::finish`], the "after").
    pub fn now() -> Machine {
        let nproc = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        let cpuinfo = read_trimmed("/proc/cpuinfo");
        let meminfo = read_trimmed("/proc/meminfo");
        let load = load_average();
        Machine {
            nproc,
            cpu_model: field_after_colon(&cpuinfo, "model name").unwrap_or_default(),
            memory_mib: field_after_colon(&meminfo, "MemTotal")
                .and_then(|value| value.split_whitespace().next()?.parse::<u64>().ok())
                .map_or(0, |kib| kib / 1024),
            kernel: format!(
                "{} {} {}",
                read_trimmed("/proc/sys/kernel/ostype"),
                read_trimmed("/proc/sys/kernel/osrelease"),
                std::env::consts::ARCH
            ),
            transparent_hugepages: read_trimmed("/sys/kernel/mm/transparent_hugepage/enabled"),
            hugetlb_pages: read_trimmed("/proc/sys/vm/nr_hugepages"),
            somaxconn: read_trimmed("/proc/sys/net/core/somaxconn"),
            ip_local_port_range: read_trimmed("/proc/sys/net/ipv4/ip_local_port_range")
                .split_whitespace()
                .collect::<Vec<_>>()
                .join("-"),
            load_average_after: load.clone(),
            load_average_before: load,
            note: format!(
                "{nproc}-core machine: load generator, system under test and its peers share the same cores, \
                 so absolute numbers are low and the ratios are what matters"
            ),
        }
    }

    /// Records the load average at the end of the benchmark.
    pub fn finish(&mut self) {
        self.load_average_after = load_average();
    }

    /// `**2-core machine** (CPU model, kernel)` for a markdown header.
    pub fn headline(&self) -> String {
        format!("**{}-core machine** ({}, {})", self.nproc, self.cpu_model, self.kernel)
    }
}

/// The 1, 5 and 15 minute load averages from `/proc/loadavg` (`"0.35 2.15 2.47"`), to show
/// how busy the shared machine was around a run; empty if unreadable.
pub fn load_average() -> String {
    read_trimmed("/proc/loadavg").split_whitespace().take(3).collect::<Vec<_>>().join(" ")
}

/// A file's contents, trimmed; empty when unreadable.
fn read_trimmed(path: &str) -> String {
    std::fs::read_to_string(path).map(|text| text.trim().to_string()).unwrap_or_default()
}

/// The value of the first `key : value` line, trimmed.
fn field_after_colon(text: &str, key: &str) -> Option<String> {
    text.lines()
        .find(|line| line.starts_with(key))
        .and_then(|line| line.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
}

/// First line of `program --version`, or a note that it failed.
pub fn version_of(program: &Path) -> String {
    match Command::new(program).arg("--version").output() {
        Ok(output) if output.status.success() => {
            String::from_utf8_lossy(&output.stdout).lines().next().unwrap_or_default().trim().to_string()
        }
        Ok(output) => format!("unknown ({})", output.status),
        Err(error) => format!("unknown ({error})"),
    }
}

/// `git describe`-like identification of the working tree, when run inside a repository.
pub fn git_revision() -> Option<String> {
    let output = Command::new("git").args(["rev-parse", "--short", "HEAD"]).output().ok()?;
    if !output.status.success() {
        return None;
    }
    let revision = String::from_utf8_lossy(&output.stdout).trim().to_string();
    let dirty = Command::new("git")
        .args(["status", "--porcelain", "--untracked-files=no"])
        .output()
        .is_ok_and(|status| !status.stdout.is_empty());
    Some(if dirty { format!("{revision}-dirty") } else { revision })
}

/// The command line as typed, arguments with spaces or quotes single-quoted.
pub fn command_line() -> String {
    std::env::args().map(|arg| shell_quote(&arg)).collect::<Vec<_>>().join(" ")
}

fn shell_quote(arg: &str) -> String {
    let plain = !arg.is_empty() && arg.chars().all(|c| c.is_ascii_alphanumeric() || "-_./=,:@%+".contains(c));
    if plain {
        arg.to_string()
    } else {
        format!("'{}'", arg.replace('\'', "'\\''"))
    }
}

/// `YYYY-MM-DDTHH:MM:SSZ` for a Unix time in seconds (UTC, proleptic Gregorian).
pub fn iso8601_utc(unix_s: u64) -> String {
    let days = (unix_s / 86_400) as i64;
    let seconds_of_day = unix_s % 86_400;
    let (year, month, day) = bypass_wire::civil::civil_from_days(days);
    let (hour, minute, second) = (seconds_of_day / 3600, seconds_of_day / 60 % 60, seconds_of_day % 60);
    format!("{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}Z")
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: dates convert correctly across epochs, leap days and centuries; method: known stamps.
    #[test]
    fn formats_utc_dates() {
        assert_eq!(iso8601_utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(iso8601_utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(iso8601_utc(1_700_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(iso8601_utc(4_107_542_399), "2100-02-28T23:59:59Z");
    }

    // Goal: quoting leaves plain args alone and protects the rest; method: literals.
    #[test]
    fn quotes_shell_arguments() {
        assert_eq!(shell_quote("--clients=50,1000"), "--clients=50,1000");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), "'it'\\''s'");
        assert_eq!(shell_quote(""), "''");
    }

    // Goal: machine facts are read on Linux; method: check a few are non-empty.
    #[test]
    fn reads_machine_info() {
        let machine = Machine::now();
        assert!(machine.nproc >= 1);
        assert!(machine.kernel.starts_with("Linux"));
        assert_eq!(load_average().split(' ').count(), 3);
        assert_eq!(machine.load_average_before, machine.load_average_after);
    }

    // Goal: reports written by older versions (engine.json's `cores`, missing fields) parse;
    // method: deserialize the engine's old machine object.
    #[test]
    fn parses_older_machine_descriptions() {
        let old = r#"{"cores": 2, "load_average_before": "0.5 1.7 2.2 2/84 25681", "kernel": "6.1.0"}"#;
        let machine: Machine = serde_json::from_str(old).expect("parses");
        assert_eq!((machine.nproc, machine.kernel.as_str()), (2, "6.1.0"));
        assert!(machine.cpu_model.is_empty());
    }
}
