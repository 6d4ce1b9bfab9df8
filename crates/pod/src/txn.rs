//! Transactions: the interface workloads program against ([`TxnOps`]), the per-attempt state
//! (access set + value arena), and the protocol-independent parts of execution on a host —
//! dispatch by protocol and owner, the owner's DRAM rows (lock, read, apply), inserts with
//! next-key locking, scans, commit TIDs, logging and acknowledgement.
//!
//! ```text
//!  workload ──TxnOps──► ActiveTxn ──► Host::access ─┬─ owner == me ──► access_owned  (DRAM row, or its CAT word)
//!                                                   ├─ Tigon ───────► tigon_access_remote  (CXL index / migrate)
//!                                                   ├─ DS2PL+ ──────► ds2pl_access_remote  (lock by message)
//!                                                   └─ OCC+ ────────► occ_read_remote      (read by message)
//!             commit ──► tigon_commit | ds2pl_commit | occ_commit ──► finish_access (apply + release)
//! ```
//!
//! Invariants: a transaction holds every lock it will ever hold before its commit TID is chosen
//! (strict 2PL; OCC locks its write set before validating); TID = max(epoch << 32, every TID
//! read + 1, the worker's last TID + 1), so versions of a key strictly increase; a transaction
//! never touches more than [`ACCESSES_MAX`] tuples.

use crate::coherence::lines_spanned;
use crate::coherence::SwccProtocol;
use crate::config::{InjectedFault, Protocol};
use crate::error::PodError;
use crate::host::Host;
use crate::partition::{row_flags, IntMap, RowId, TableId, SUPREMUM_KEY};
use crate::region::Off;
use crate::staleness::{event_time, read_time, TraceKind, TraceRecord};
use crate::word::{CatNode, Latched, LocalLock, MetaWord};

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

/// A transaction attempt running on a host.
pub struct ActiveTxn<'h> {
    pub(crate) host: &'h mut Host,
    pub(crate) txn: &'h mut TxnState,
}

impl TxnOps for ActiveTxn<'_> {
    fn host(&self) -> usize {
        self.host.me
    }
    fn read(&mut self, table: TableId, key: u64) -> TxnResult<Option<&[u8]>> {
        let index = self.host.access(self.txn, table, key, LockMode::Read)?;
        Ok(index.and_then(|index| self.txn.value(index)))
    }
    fn read_for_update(&mut self, table: TableId, key: u64) -> TxnResult<Option<&[u8]>> {
        let index = self.host.access(self.txn, table, key, LockMode::Write)?;
        Ok(index.and_then(|index| self.txn.value(index)))
    }
    fn write(&mut self, table: TableId, key: u64, value: &[u8]) -> TxnResult<()> {
        self.host.check_row_size(table, value)?;
        let Some(index) = self.host.access(self.txn, table, key, LockMode::Write)? else {
            return Err(TxnError::Fatal(PodError::Workload(format!("write to absent key {key} of table {table}"))));
        };
        self.txn.set_value(index, value);
        let access = &mut self.txn.accesses[index];
        if access.change == Change::None {
            access.change = Change::Update;
        }
        Ok(())
    }
    fn insert(&mut self, table: TableId, key: u64, value: &[u8]) -> TxnResult<()> {
        self.host.check_row_size(table, value)?;
        self.host.insert(self.txn, table, key, value)
    }
    fn delete(&mut self, table: TableId, key: u64) -> TxnResult<()> {
        if self.host.config.protocol != Protocol::Tigon {
            self.host.require_owned(table, key, "baseline deletes from another host's partition")?;
        }
        if let Some(index) = self.host.access(self.txn, table, key, LockMode::Write)? {
            let access = &mut self.txn.accesses[index];
            if access.change == Change::Insert {
                return Err(TxnError::Fatal(PodError::Unsupported("deleting a row inserted by the same transaction")));
            }
            access.change = Change::Delete;
            access.value = None;
        }
        Ok(())
    }
    fn scan(&mut self, table: TableId, low: u64, high: u64, limit: usize) -> TxnResult<Vec<u64>> {
        self.host.scan(self.txn, table, low, high, limit)
    }
}

impl Host {
    pub(crate) fn check_row_size(&self, table: TableId, value: &[u8]) -> TxnResult<()> {
        let expected = self.partition.table(table).spec.row_bytes;
        if value.len() != expected {
            return Err(TxnError::Fatal(PodError::Workload(format!(
                "value of {} bytes for table {table} with {expected}-byte rows",
                value.len()
            ))));
        }
        Ok(())
    }

    pub(crate) fn require_owned(&self, table: TableId, key: u64, what: &'static str) -> TxnResult<()> {
        if self.workload.owner(table, key) != self.me {
            return Err(TxnError::Fatal(PodError::Unsupported(what)));
        }
        Ok(())
    }

    /// Finds or acquires `(table, key)` in `want` mode; the index of its access, or `None` if absent.
    pub(crate) fn access(
        &mut self,
        txn: &mut TxnState,
        table: TableId,
        key: u64,
        want: LockMode,
    ) -> TxnResult<Option<usize>> {
        if let Some(index) = txn.find(table, key) {
            let access = txn.accesses[index];
            if access.change == Change::Delete {
                return Ok(None);
            }
            if access.lock < want && self.config.protocol != Protocol::Occ {
                self.upgrade(txn, index)?;
            }
            return Ok(Some(index));
        }
        // The supremum row of an ordered table belongs to every partition (next-key locking).
        let owner = if key == SUPREMUM_KEY { self.me } else { self.workload.owner(table, key) };
        match (self.config.protocol, owner == self.me) {
            (_, true) => self.access_owned(txn, table, key, want),
            (Protocol::Tigon, false) => self.tigon_access_remote(txn, table, key, owner, want),
            (Protocol::Ds2pl, false) => self.ds2pl_access_remote(txn, table, key, owner, want),
            (Protocol::Occ, false) => self.occ_read_remote(txn, table, key, owner),
        }
    }

    fn upgrade(&mut self, txn: &mut TxnState, index: usize) -> TxnResult<()> {
        let access = txn.accesses[index];
        match access.place {
            Place::Local(row) => self.lock_owned(access.table, row, access.lock, LockMode::Write)?,
            Place::Cat { node, .. } => self.tigon_upgrade(node)?,
            Place::Remote { owner } => self.ds2pl_upgrade(txn, owner, access.table, access.key)?,
        }
        txn.accesses[index].lock = LockMode::Write;
        Ok(())
    }

    /// An owned tuple: NO_WAIT lock (2PL) or version check (OCC), then its value from DRAM.
    fn access_owned(
        &mut self,
        txn: &mut TxnState,
        table: TableId,
        key: u64,
        want: LockMode,
    ) -> TxnResult<Option<usize>> {
        let Some(row) = self.partition.table(table).find(key) else {
            return Ok(None);
        };
        if self.partition.table(table).row(row).is(row_flags::PLACEHOLDER) {
            return abort(Abort::Conflict);
        }
        let lock = if self.config.protocol == Protocol::Occ {
            if self.partition.table(table).row(row).lock.writer() {
                return abort(Abort::Conflict);
            }
            LockMode::None
        } else {
            self.lock_owned(table, row, LockMode::None, want)?;
            want
        };
        let stored = self.partition.table(table).row(row);
        self.counters.dram_tuple_ops += 1;
        self.counters.dram_bytes += stored.data.len() as u64;
        let access = Access {
            table,
            key,
            place: Place::Local(row),
            lock,
            read_tid: Some(stored.lock.tid()),
            value: None,
            change: Change::None,
        };
        Ok(Some(txn.push(access, Some(&stored.data))?))
    }

    /// NO_WAIT transition `held → want` of an owned row: on its DRAM word, or on its CAT word if
    /// migrated (copying the CXL data back first when a remote host modified it).
    pub(crate) fn lock_owned(&mut self, table: TableId, row: RowId, held: LockMode, want: LockMode) -> TxnResult<()> {
        if self.partition.table(table).row(row).is(row_flags::MIGRATED) {
            return self.tigon_lock_owned_cat(table, row, held, want);
        }
        let stored = self.partition.table_mut(table).row_mut(row);
        let next = match (held, want) {
            (LockMode::None, LockMode::Read) => stored.lock.try_read_lock(),
            (LockMode::None, LockMode::Write) => stored.lock.try_write_lock(),
            (LockMode::Read, LockMode::Write) => stored.lock.try_upgrade(),
            _ => Some(stored.lock),
        };
        match next {
            Some(lock) => {
                stored.lock = lock;
                Ok(())
            }
            None => abort(Abort::Conflict),
        }
    }

    /// Releases `held` on an owned row (DRAM or CAT word); `wrote` makes a CAT write back first.
    pub(crate) fn unlock_owned(&mut self, table: TableId, row: RowId, held: LockMode, wrote: bool) -> TxnResult<()> {
        if held == LockMode::None {
            return Ok(());
        }
        if self.partition.table(table).row(row).is(row_flags::MIGRATED) {
            return self.tigon_unlock_owned_cat(table, row, held, wrote);
        }
        let stored = self.partition.table_mut(table).row_mut(row);
        stored.lock = match held {
            LockMode::Read => stored.lock.release_read(),
            _ => stored.lock.release_write(),
        };
        Ok(())
    }

    /// Inserts a placeholder, write-locked, after write-locking the next key (ordered tables).
    fn insert(&mut self, txn: &mut TxnState, table: TableId, key: u64, value: &[u8]) -> TxnResult<()> {
        let owner = self.workload.owner(table, key);
        if owner != self.me && self.config.protocol != Protocol::Tigon {
            return Err(TxnError::Fatal(PodError::Unsupported("baseline inserts into another host's partition")));
        }
        if let Some(index) = txn.find(table, key) {
            if txn.accesses[index].change != Change::Delete {
                return abort(Abort::User);
            }
            txn.set_value(index, value);
            txn.accesses[index].change = Change::Update;
            return Ok(());
        }
        if owner != self.me {
            return self.tigon_insert_remote(txn, table, key, value, owner);
        }
        if self.partition.table(table).find(key).is_some() {
            return abort(Abort::User);
        }
        if self.partition.table(table).spec.ordered {
            let (next_key, _) = self.partition.table(table).next_key(key);
            self.access(txn, table, next_key, LockMode::Write)?;
        }
        let row = self.partition.table_mut(table).insert(key, value.to_vec().into_boxed_slice(), 0);
        // The new row separates its neighbours: CATs beside it may no longer promise adjacency.
        self.unlink_neighbour_bits(table, key)?;
        let stored = self.partition.table_mut(table).row_mut(row);
        stored.set(row_flags::PLACEHOLDER, true);
        stored.lock = LocalLock::unlocked(0).try_write_lock().expect("a fresh row is unlocked");
        let access = Access {
            table,
            key,
            place: Place::Local(row),
            lock: LockMode::Write,
            read_tid: None,
            value: None,
            change: Change::Insert,
        };
        txn.push(access, Some(value))?;
        Ok(())
    }

    /// Locks (2PL) or records (OCC) every key in the range and the key after it.
    fn scan(&mut self, txn: &mut TxnState, table: TableId, low: u64, high: u64, limit: usize) -> TxnResult<Vec<u64>> {
        let owner = self.workload.owner(table, low);
        if owner != self.me {
            if self.config.protocol != Protocol::Tigon {
                return Err(TxnError::Fatal(PodError::Unsupported("baseline scans of another host's partition")));
            }
            return self.tigon_scan_remote(txn, table, (low, high, limit), owner);
        }
        let found = self.partition.table(table).range(low, high, limit);
        let mut keys = Vec::with_capacity(found.len());
        for (key, _) in &found {
            if self.access(txn, table, *key, LockMode::Read)?.is_some() {
                keys.push(*key);
            }
        }
        let bound = if found.len() == limit { found.last().map_or(high, |(key, _)| *key) } else { high };
        if bound < SUPREMUM_KEY {
            let (next_key, _) = self.partition.table(table).next_key(bound);
            self.access(txn, table, next_key, LockMode::Read)?;
        }
        if self.config.protocol == Protocol::Occ {
            txn.scans.push(ScanRecord { table, low, high, limit, keys: keys.clone() });
        }
        Ok(keys)
    }

    /// The commit TID and epoch (call once every lock is held).
    pub(crate) fn commit_tid(&self, txn: &TxnState, floor: u64) -> (u64, u64) {
        let epoch = self.region.header().global_epoch.load(std::sync::atomic::Ordering::Acquire);
        let mut tid = (epoch << 32).max(self.last_tid + 1).max(floor);
        for access in &txn.accesses {
            if let Some(read) = access.read_tid {
                tid = tid.max(read + 1);
            }
        }
        (epoch, tid)
    }

    /// Appends redo records for every change and the commit record.
    pub(crate) fn log_changes(&mut self, txn: &TxnState, tid: u64) {
        for (index, access) in txn.accesses.iter().enumerate() {
            if let Place::Remote { .. } = access.place {
                continue; // a 2PC participant logs its own part as prepared
            }
            match access.change {
                Change::None => {}
                Change::Delete => self.log.write(txn.gid, access.table, access.key, tid, None),
                Change::Update | Change::Insert => {
                    self.log.write(txn.gid, access.table, access.key, tid, txn.value(index))
                }
            }
        }
        self.log.commit(txn.gid, tid);
    }

    /// Applies (if `commit_tid` is given) and releases an owned row's access.
    pub(crate) fn finish_owned(&mut self, txn: &TxnState, index: usize, commit_tid: Option<u64>) -> TxnResult<()> {
        let access = txn.accesses[index];
        let Place::Local(row) = access.place else { unreachable!("finish_owned on a non-local access") };
        match (commit_tid, access.change) {
            (None, Change::Insert) => {
                self.partition.table_mut(access.table).remove(access.key);
                return Ok(());
            }
            (Some(_), Change::Delete) => {
                self.delete_owned_row(access.table, row)?;
                return Ok(());
            }
            (Some(tid), Change::Update | Change::Insert) => {
                let value = txn.value(index).expect("a change carries its value");
                self.apply_owned(access.table, row, value, tid);
            }
            _ => {}
        }
        let wrote = commit_tid.is_some() && access.change != Change::None;
        self.unlock_owned(access.table, row, access.lock, wrote)
    }

    /// Writes a committed value to an owned row: DRAM always, and the CXL block too if it is a CAT.
    fn apply_owned(&mut self, table: TableId, row: RowId, value: &[u8], tid: u64) {
        let stored = self.partition.table_mut(table).row_mut(row);
        stored.lock = stored.lock.with_tid(tid);
        stored.set(row_flags::PLACEHOLDER, false);
        self.counters.dram_tuple_ops += 1;
        self.counters.dram_bytes += value.len() as u64;
        if stored.is(row_flags::MIGRATED) {
            // The DRAM row equals the block (a remote write was copied back at lock time).
            let node = stored.shortcut;
            let old = std::mem::replace(&mut stored.data, value.to_vec().into_boxed_slice());
            self.tigon_write_block(node, tid, Some(&old), value);
        } else {
            stored.data.copy_from_slice(value);
            stored.set(row_flags::MODIFIED_SINCE_MOVED_OUT, true);
        }
    }

    /// A committed delete: a CAT is moved out first (waiting out transient pins), then the row goes.
    pub(crate) fn delete_owned_row(&mut self, table: TableId, row: RowId) -> TxnResult<()> {
        if self.partition.table(table).row(row).is(row_flags::MIGRATED) {
            self.tigon_force_move_out(table, row)?;
        }
        let key = self.partition.table(table).row(row).key;
        let removed = self.partition.table_mut(table).remove(key).expect("a locked row is present");
        if removed.retained_block != 0 {
            let bytes = crate::tigon::block_bytes(removed.data.len());
            self.blocks.free(removed.retained_block, bytes);
        }
        Ok(())
    }

    /// Releases every access without applying anything (abort), and tells 2PC participants.
    pub(crate) fn release_all(&mut self, txn: &TxnState) -> TxnResult<()> {
        for index in 0..txn.accesses.len() {
            match txn.accesses[index].place {
                Place::Local(_) => self.finish_owned(txn, index, None)?,
                Place::Cat { .. } => self.tigon_finish_cat(txn, index, None)?,
                Place::Remote { .. } => {}
            }
        }
        self.baseline_abort_participants(txn)
    }

    /// Bookkeeping after a commit: last TID, history, acknowledgement.
    pub(crate) fn after_commit(&mut self, txn: &TxnState, epoch: u64, tid: u64) {
        self.last_tid = tid;
        self.record_history(txn, tid);
        self.queue_ack(epoch);
    }

    /// Under the latch, for a reader about to read a CAT block: invalidate unless this host's
    /// copy is known valid (per the SWcc protocol variant).
    pub(crate) fn swcc_before_read(&mut self, word: &mut MetaWord, len: u64) {
        let block = word.block_offset();
        use crate::coherence::SwccProtocol::*;
        let valid = word.host_valid(self.me);
        let skip = self.config.fault == Some(InjectedFault::SkipReaderInvalidate);
        // NoSWcc runs WriteThrough's bookkeeping on the all-coherent back-end: the host bits are
        // what a hardware directory tracks, and its "invalidate" is the coherence miss that
        // fetches another host's lines from CXL (counted, no instruction; see `Swcc`).
        match self.config.swcc {
            WriteThrough | NoSharedReader | NoSwcc if valid => self.counters.swcc_hits += 1,
            WriteThrough | NoSharedReader | NoSwcc => {
                self.counters.swcc_misses += 1;
                if !skip {
                    self.swcc.invalidate_block(self.region, block, len);
                }
                *word = if self.config.swcc != NoSharedReader {
                    word.with_host_valid(self.me)
                } else {
                    word.with_only_host_valid(self.me)
                };
            }
            NonTemporal => {
                self.counters.swcc_misses += 1;
                if !skip {
                    self.swcc.invalidate_block(self.region, block, len);
                }
            }
        }
    }

    /// Under the latch, for a writer about to release its write lock: mark other hosts' copies
    /// stale and fence, so the lines [`Host::tigon_write_block`] wrote back reach memory before
    /// the lock is visibly released (NonTemporal also drops its copy).
    pub(crate) fn swcc_after_write(&mut self, word: &mut MetaWord, len: u64) {
        let block = word.block_offset();
        use crate::coherence::SwccProtocol::*;
        let skip = self.config.fault == Some(InjectedFault::SkipWriterWriteback);
        match self.config.swcc {
            WriteThrough | NoSharedReader | NoSwcc => *word = word.with_only_host_valid(self.me),
            NonTemporal if !skip => self.swcc.invalidate_block(self.region, block, len),
            NonTemporal => {}
        }
        if !skip {
            self.swcc.fence();
        }
        self.model_event(block, TraceKind::Write, len);
    }

    /// Latency model: this host reads the CAT block at `block` (`len` bytes) now — a remote
    /// reader before every read, the owner before every lock (it re-reads only after a foreign
    /// write). Traced; the launcher judges staleness in logical time ([`crate::staleness`]).
    pub(crate) fn model_read(&mut self, block: u64, len: u64) {
        let slice = self.layout.swcc_slice(self.me);
        let owner = slice <= block && block < slice + self.layout.swcc_per_host;
        let kind = if self.config.swcc == SwccProtocol::NonTemporal && !owner {
            TraceKind::ReadAlwaysFetches
        } else {
            TraceKind::Read
        };
        self.trace(TraceRecord {
            block,
            time: read_time(self.counters.attempts),
            kind,
            lines: lines_spanned(block, len),
        });
    }

    /// Latency model: this host cleared other hosts' copies of `block` now (`Write` or `Reset`).
    pub(crate) fn model_event(&mut self, block: u64, kind: TraceKind, len: u64) {
        self.trace(TraceRecord {
            block,
            time: event_time(self.counters.attempts),
            kind,
            lines: lines_spanned(block, len),
        });
    }

    fn trace(&mut self, record: TraceRecord) {
        if self.config.protocol == Protocol::Tigon {
            crate::staleness::append(self.region, &self.layout, self.me, record);
        }
    }

    /// Latches another host's CAT word, counting the CAS attempts (cross-host atomics).
    pub(crate) fn latch<'r>(&mut self, node: &'r CatNode, node_off: Off<CatNode>) -> TxnResult<Latched<'r>> {
        let (latched, attempts) = Latched::acquire(&node.word, node_off.raw())?;
        self.counters.hwcc_atomics += u64::from(attempts);
        Ok(latched)
    }

    /// Latches one of this host's own CAT words (its line usually sits in this host's cache).
    pub(crate) fn latch_owned<'r>(&mut self, node: &'r CatNode, node_off: Off<CatNode>) -> TxnResult<Latched<'r>> {
        let (latched, attempts) = Latched::acquire(&node.word, node_off.raw())?;
        self.counters.owner_atomics += u64::from(attempts);
        Ok(latched)
    }
}
