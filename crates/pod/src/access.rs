//! What a transaction is, independent of where it runs: the interface workloads program
//! against ([`TxnOps`]), the outcome types, and one attempt's state (access set + value arena).
//!
//! ```text
//!  workload ──TxnOps──► worker (crate::worker) ──► local rows (crate::owned)
//!                                              └─► other hosts' tuples: the protocol (crate::protocol)
//! ```
//!
//! Invariants: a transaction never touches more than [`ACCESSES_MAX`] tuples; an access is found
//! by `(table, key)` in O(1); the value an access first read stays available after a write
//! replaced it ([`TxnState::read_value`]).

use crate::error::PodError;
use crate::partition::{IntMap, RowId, TableId};
use crate::region::Off;
use crate::word::CatNode;

/// Most tuples one transaction may touch (TPC-C StockLevel reads ~400).
pub const ACCESSES_MAX: usize = 4096;

/// Why an attempt was abandoned (it is retried unless the workload asked for it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Abort {
    /// NO_WAIT lock conflict (or OCC's lock phase).
    Conflict,
    /// FAIL_OOM: the owner could not move the tuple into CXL within its budget.
    OutOfMemory,
    /// OCC validation found a changed read.
    Validation,
    /// The workload rolled back on purpose (not retried).
    User,
}

#[derive(Debug)]
pub enum TxnError {
    Abort(Abort),
    Fatal(PodError),
}

impl From<PodError> for TxnError {
    fn from(error: PodError) -> Self {
        TxnError::Fatal(error)
    }
}

pub type TxnResult<T> = std::result::Result<T, TxnError>;

pub fn abort<T>(reason: Abort) -> TxnResult<T> {
    Err(TxnError::Abort(reason))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LockMode {
    None,
    Read,
    Write,
}

/// A tuple a transaction phase asks for before it reads it (an entry of Tigon's read set before
/// `process_requests`): every fetch of a phase is acquired together, local ones first, then the
/// other hosts' with one flush and one wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fetch {
    pub table: TableId,
    pub key: u64,
    /// `Read` or `Write` (OCC reads either way and locks its writes at commit).
    pub lock: LockMode,
}

impl Fetch {
    pub fn read(table: TableId, key: u64) -> Fetch {
        Fetch { table, key, lock: LockMode::Read }
    }
    pub fn write(table: TableId, key: u64) -> Fetch {
        Fetch { table, key, lock: LockMode::Write }
    }
}

/// Where an accessed tuple lives, as far as this transaction is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// In this host's partition (its lock is the DRAM word, or the CAT word if migrated).
    Local(RowId),
    /// Another host's tuple, shared in CXL at this node (pinned by us).
    Cat { owner: usize, node: Off<CatNode> },
    /// Another host's tuple reached by message (baselines).
    Remote { owner: usize },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    None,
    Update,
    Insert,
    Delete,
}

#[derive(Debug, Clone, Copy)]
pub struct Access {
    pub table: TableId,
    pub key: u64,
    pub place: Place,
    pub lock: LockMode,
    /// The version read (`None` for inserts).
    pub read_tid: Option<u64>,
    /// Current value in the transaction's arena: (start, len).
    pub value: Option<(usize, usize)>,
    pub change: Change,
}

/// An OCC scan, re-checked at commit (phantoms).
#[derive(Debug, Clone)]
pub struct ScanRecord {
    pub table: TableId,
    pub low: u64,
    pub high: u64,
    pub limit: usize,
    pub keys: Vec<u64>,
}

/// One attempt's state, reused across attempts to avoid allocation.
#[derive(Debug, Default)]
pub struct TxnState {
    pub gid: u64,
    pub accesses: Vec<Access>,
    lookup: IntMap<(TableId, u64), usize>,
    values: Vec<u8>,
    /// Per access, the value it first read (what the tuple held when locked), in `values`.
    read_values: Vec<Option<(usize, usize)>>,
    pub scans: Vec<ScanRecord>,
}

impl TxnState {
    pub fn reset(&mut self, gid: u64) {
        self.gid = gid;
        self.accesses.clear();
        self.lookup.clear();
        self.values.clear();
        self.read_values.clear();
        self.scans.clear();
    }

    pub fn find(&self, table: TableId, key: u64) -> Option<usize> {
        self.lookup.get(&(table, key)).copied()
    }

    pub fn push(&mut self, access: Access, value: Option<&[u8]>) -> TxnResult<usize> {
        if self.accesses.len() >= ACCESSES_MAX {
            return Err(TxnError::Fatal(PodError::Workload(format!(
                "a transaction touched more than {ACCESSES_MAX} tuples"
            ))));
        }
        let index = self.accesses.len();
        self.accesses.push(access);
        self.lookup.insert((access.table, access.key), index);
        if let Some(value) = value {
            self.set_value(index, value);
        }
        self.read_values.push(self.accesses[index].value);
        Ok(index)
    }

    pub fn set_value(&mut self, index: usize, value: &[u8]) {
        let start = self.values.len();
        self.values.extend_from_slice(value);
        self.accesses[index].value = Some((start, value.len()));
    }

    pub fn value(&self, index: usize) -> Option<&[u8]> {
        let (start, len) = self.accesses[index].value?;
        Some(&self.values[start..start + len])
    }

    /// The value access `index` read when it was first made (before any write replaced it).
    pub fn read_value(&self, index: usize) -> Option<&[u8]> {
        let (start, len) = self.read_values[index]?;
        Some(&self.values[start..start + len])
    }

    pub fn is_read_only(&self) -> bool {
        self.accesses.iter().all(|access| access.change == Change::None)
    }
}

/// What workloads call. Values are whole rows of the table's fixed size.
pub trait TxnOps {
    fn host(&self) -> usize;
    /// This attempt's transaction id: unique across hosts and restarts (what `record_acked`
    /// records), so a workload may key a row by it.
    fn id(&self) -> u64;
    /// Acquires every listed tuple now, as one phase (Tigon's `process_requests`): this host's
    /// rows first, then the other hosts' with one flush and one wait. Later reads and writes of
    /// them find them in the transaction; an absent key is simply not there.
    fn fetch(&mut self, wanted: &[Fetch]) -> TxnResult<()>;
    /// Reads a tuple under a shared lock (2PL) or with its version recorded (OCC).
    fn read(&mut self, table: TableId, key: u64) -> TxnResult<Option<&[u8]>>;
    /// Reads a tuple under an exclusive lock (avoids upgrade aborts before a write).
    fn read_for_update(&mut self, table: TableId, key: u64) -> TxnResult<Option<&[u8]>>;
    /// Replaces an existing tuple's value (applied at commit).
    fn write(&mut self, table: TableId, key: u64, value: &[u8]) -> TxnResult<()>;
    /// Inserts a new tuple into this host's partition.
    fn insert(&mut self, table: TableId, key: u64, value: &[u8]) -> TxnResult<()>;
    /// Deletes a tuple of this host's partition (no-op if absent).
    fn delete(&mut self, table: TableId, key: u64) -> TxnResult<()>;
    /// Keys in `[low, high]` (at most `limit`) of an ordered table, each read-locked, plus the
    /// next key (phantom protection). The range lies in one partition; another host's is scanned
    /// through shared tuples (Tigon-style only, fewer than 64 rows).
    fn scan(&mut self, table: TableId, low: u64, high: u64, limit: usize) -> TxnResult<Vec<u64>>;
}

/// Reads for update, lets `change` edit a copy, writes it back. False if the key is absent.
pub fn update(txn: &mut dyn TxnOps, table: TableId, key: u64, change: impl FnOnce(&mut [u8])) -> TxnResult<bool> {
    let Some(row) = txn.read_for_update(table, key)? else {
        return Ok(false);
    };
    let mut row = row.to_vec();
    change(&mut row);
    txn.write(table, key, &row)?;
    Ok(true)
}
