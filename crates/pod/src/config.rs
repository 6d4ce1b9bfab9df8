//! Everything a pod run is told: hosts, protocol, workload, memory budgets, coherence, logging,
//! timing, and the test-only knobs (crash points, injected protocol faults).

use std::path::PathBuf;

use serde::Serialize;

use crate::coherence::{CoherenceBackend, SwccProtocol};
use crate::error::{PodError, Result};
use crate::region::HOSTS_MAX;
use crate::workload::WorkloadConfig;

/// The concurrency-control protocol all hosts of a pod run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Protocol {
    /// Pasha/Tigon: shared tuples in CXL, 2PL NO_WAIT on the HWcc word, no 2PC.
    Tigon,
    /// DS2PL+: owner-only data, remote reads and locks by message, 2PC.
    Ds2pl,
    /// OCC+: Silo-style distributed OCC (remote reads by message; lock, validate, 2PC). Not
    /// Sundial: there are no logical leases.
    Occ,
}

impl Protocol {
    pub fn label(self) -> &'static str {
        match self {
            Protocol::Tigon => "Tigon-style",
            Protocol::Ds2pl => "DS2PL+",
            Protocol::Occ => "OCC+ (Silo-style)",
        }
    }
}

/// Where a host stops itself with SIGKILL (crash tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CrashPoint {
    /// After a transaction's log records are appended, before its writes are applied.
    MidEpoch,
    /// Inside a move-in, after the CAT is linked, before the requester is answered.
    MoveIn,
    /// While holding a CAT's latch during write release.
    HoldingLatch,
    /// In the logger, after writing a batch and before its fdatasync.
    BeforeFsync,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct CrashSpec {
    pub host: usize,
    pub point: CrashPoint,
    /// The point is passed this many times; the last one kills the host.
    pub after: u64,
}

/// Deliberate protocol bugs, to prove the simulated incoherent caches expose them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum InjectedFault {
    /// Readers never invalidate before reading a CAT they have not cached.
    SkipReaderInvalidate,
    /// Writers never write back before releasing the write lock.
    SkipWriterWriteback,
}

#[derive(Debug, Clone, Serialize)]
pub struct PodConfig {
    /// Host processes, 1..=8.
    pub hosts: usize,
    pub protocol: Protocol,
    pub workload: WorkloadConfig,
    pub coherence: CoherenceBackend,
    pub swcc: SwccProtocol,
    /// HWcc bytes for the whole pod (index + metadata; + data under NoSWcc), split evenly per host.
    pub hwcc_budget_bytes: u64,
    /// SWcc bytes per host for tuple blocks.
    pub swcc_bytes_per_host: u64,
    /// CXL index buckets per host (power of two; 0 = from the partition size).
    pub index_buckets_per_host: u64,
    /// Owner reaches its CATs through the shortcut pointer (off: through the CXL index).
    pub shortcut: bool,
    /// Tigon: move every row of the workload's shareable tables into CXL at start, while the
    /// budget lasts (Tigon's `--pre_migrate`; its main figures use it, budget sweeps do not).
    pub pre_migrate: bool,
    /// Log directory; `None` disables logging (acknowledge at commit).
    pub log_dir: Option<PathBuf>,
    pub epoch_ms: u64,
    pub warmup_ms: u64,
    pub measure_ms: u64,
    /// Keep measuring past `measure_ms` until the hosts together acknowledged at least this many
    /// transactions in the measured window (0 = off), at most [`MEASURE_EXTENSION_MAX`] longer.
    /// Tests set it so that the amount of work, not the speed of a loaded machine, decides what
    /// they check.
    ///
    /// [`MEASURE_EXTENSION_MAX`]: crate::launcher::MEASURE_EXTENSION_MAX
    pub measure_acked_min: u64,
    pub seed: u64,
    /// Write every committed transaction's read and write versions here (serializability checker).
    pub history_dir: Option<PathBuf>,
    /// Rebuild partitions from the logs instead of starting fresh (the logs are kept).
    pub recover: bool,
    /// Upper bound of the random back-off after an abort, µs (Tigon: 100).
    pub backoff_max_us: u64,
    pub crash: Option<CrashSpec>,
    pub fault: Option<InjectedFault>,
    /// Take a checkpoint each time a host has appended this many log bytes since its last one
    /// (0 = never); logs below every host's checkpoint are deleted (bounded disk).
    pub checkpoint_log_bytes: u64,
    /// A host's logger starts a new log segment file once the current one holds this many bytes
    /// (only whole segments are deleted).
    pub log_segment_bytes: u64,
    /// Append the id, commit epoch and log-buffer epoch of every acknowledged transaction to
    /// `log_dir/acked-H.ids` (16 + 8 bytes each), so a crash test can check each one survived.
    pub record_acked: bool,
    /// Pin every host process (worker and logger) to this CPU: the benchmark's check that the
    /// latency model does not depend on how the cores time-slice the hosts.
    pub pin_cpu: Option<usize>,
}

impl PodConfig {
    /// Defaults for `workload`: 2 hosts, Tigon-style, real flushes, WriteThrough, 64 MiB HWcc.
    pub fn new(workload: WorkloadConfig) -> PodConfig {
        PodConfig {
            hosts: 2,
            protocol: Protocol::Tigon,
            workload,
            coherence: CoherenceBackend::X86Flush,
            swcc: SwccProtocol::WriteThrough,
            hwcc_budget_bytes: 64 << 20,
            swcc_bytes_per_host: 512 << 20,
            index_buckets_per_host: 0,
            shortcut: true,
            pre_migrate: false,
            log_dir: None,
            epoch_ms: 10,
            warmup_ms: 500,
            measure_ms: 2_000,
            measure_acked_min: 0,
            seed: 1,
            history_dir: None,
            recover: false,
            backoff_max_us: 100,
            crash: None,
            fault: None,
            checkpoint_log_bytes: 256 << 20,
            log_segment_bytes: 64 << 20,
            record_acked: false,
            pin_cpu: None,
        }
    }

    /// Every problem at once.
    pub fn validate(&self) -> Result<()> {
        let mut problems = Vec::new();
        if !(1..=HOSTS_MAX).contains(&self.hosts) {
            problems.push(format!("hosts must be 1..={HOSTS_MAX}, not {}", self.hosts));
        }
        if self.hwcc_budget_bytes == 0 {
            problems.push("hwcc_budget_bytes must be positive".into());
        }
        if self.swcc_bytes_per_host < 1 << 16 {
            problems.push("swcc_bytes_per_host must be at least 64 KiB".into());
        }
        if self.index_buckets_per_host != 0 && !self.index_buckets_per_host.is_power_of_two() {
            problems.push("index_buckets_per_host must be a power of two (or 0 for automatic)".into());
        }
        if self.epoch_ms == 0 || self.epoch_ms > 10_000 {
            problems.push("epoch_ms must be 1..=10000".into());
        }
        if let Some(cpu) = self.pin_cpu {
            if cpu >= libc::CPU_SETSIZE as usize {
                problems.push(format!("pin_cpu must be below {}", libc::CPU_SETSIZE));
            }
        }
        if self.log_segment_bytes < 4096 {
            problems.push("log_segment_bytes must be at least 4096".into());
        }
        if self.record_acked && self.log_dir.is_none() {
            problems.push("record_acked needs a log_dir".into());
        }
        if self.recover && self.log_dir.is_none() {
            problems.push("recover needs a log_dir".into());
        }
        if let Some(crash) = self.crash {
            if crash.host >= self.hosts || crash.after == 0 {
                problems.push("crash.host must be a host and crash.after ≥ 1".into());
            }
        }
        problems.extend(self.workload.problems(self.hosts));
        if problems.is_empty() {
            Ok(())
        } else {
            Err(PodError::Config(problems))
        }
    }

    /// Under NoSWcc nothing is flushed, whatever back-end was asked for.
    pub fn effective_backend(&self) -> CoherenceBackend {
        if self.swcc == SwccProtocol::NoSwcc {
            CoherenceBackend::Noop
        } else {
            self.coherence
        }
    }

    pub fn hwcc_budget_per_host(&self) -> u64 {
        self.hwcc_budget_bytes / self.hosts as u64
    }

    /// Index buckets per host: configured, or one per 8 shareable rows (power of two), but at
    /// most a quarter of the per-host budget — like Tigon's index, the CXL index is part of what
    /// the budget pays for, so a small budget gets a small index (longer chains).
    pub fn index_buckets(&self) -> u64 {
        if self.index_buckets_per_host != 0 {
            return self.index_buckets_per_host;
        }
        let wanted = (self.workload.shareable_rows_per_host() / 8).max(1024).next_power_of_two();
        let affordable = (self.hwcc_budget_per_host() / 4 / 8).max(16);
        wanted.min(1 << (63 - affordable.leading_zeros()))
    }
}
