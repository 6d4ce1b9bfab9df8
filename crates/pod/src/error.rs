//! The pod's one error type: what failed and where. Transaction aborts are not errors (they are
//! [`crate::access::Abort`], an expected outcome that is retried); these are failures that stop a host
//! or refuse a configuration.

use std::io;
use std::path::PathBuf;

use thiserror::Error;

#[derive(Debug, Error)]
pub enum PodError {
    /// The configuration is invalid; every problem is listed.
    #[error("invalid pod configuration: {}", .0.join("; "))]
    Config(Vec<String>),
    /// A system call on the shared region failed.
    #[error("shared region: {what}: {source}")]
    Region { what: &'static str, source: io::Error },
    /// The mapped region does not carry our header (wrong file, or a different layout version).
    #[error("shared region is not a pod region of this version (magic {magic:#x}, version {version})")]
    BadRegion { magic: u64, version: u64 },
    /// A host's fixed HWcc structures (the CXL index buckets) do not fit in its budget.
    #[error("HWcc budget of {budget_bytes} bytes per host cannot hold the CXL index of {index_bytes} bytes")]
    BudgetTooSmall { budget_bytes: u64, index_bytes: u64 },
    /// A latch stayed held longer than any live holder would keep it: its holder died.
    #[error("latch at region offset {offset:#x} held for more than {waited_ms} ms (did a host die holding it?)")]
    LatchTimeout { offset: u64, waited_ms: u64 },
    /// A peer host did not answer within the bound: it is dead or wedged.
    #[error("host {host} did not answer within {waited_ms} ms")]
    PeerTimeout { host: usize, waited_ms: u64 },
    /// A message does not fit in a ring slot (a workload or protocol bound was exceeded).
    #[error("message of {bytes} bytes exceeds the ring slot payload of {max_bytes} bytes")]
    MessageTooLarge { bytes: usize, max_bytes: usize },
    /// A message could not be decoded: the region is corrupt or the peer runs other code.
    #[error("malformed message from host {from}: {detail}")]
    BadMessage { from: usize, detail: &'static str },
    /// Reading or writing a log file failed.
    #[error("log {path}: {source}")]
    LogIo { path: PathBuf, source: io::Error },
    /// A history or result file could not be read or written.
    #[error("{path}: {source}")]
    FileIo { path: PathBuf, source: io::Error },
    /// Starting or supervising host processes failed.
    #[error("host process: {what}: {source}")]
    Process { what: &'static str, source: io::Error },
    /// A host reported a failure (its message, from the region's error slot).
    #[error("host {host} failed: {message}")]
    HostFailed { host: usize, message: String },
    /// A host died without reporting (killed by a signal, or crashed).
    #[error("host {host} died: {status}")]
    HostDied { host: usize, status: String },
    /// A feature combination that this store does not implement, named honestly.
    #[error("not supported: {0}")]
    Unsupported(&'static str),
    /// The workload's data does not satisfy the protocol's limits (row sizes, counts).
    #[error("workload: {0}")]
    Workload(String),
}

pub type Result<T, E = PodError> = std::result::Result<T, E>;

impl PodError {
    /// Wraps an `io::Error` from a system call on the region.
    pub(crate) fn region(what: &'static str) -> impl FnOnce(io::Error) -> PodError {
        move |source| PodError::Region { what, source }
    }

    /// Wraps the current `errno` of a failed libc call on the region.
    pub(crate) fn region_errno(what: &'static str) -> PodError {
        PodError::Region { what, source: io::Error::last_os_error() }
    }
}
