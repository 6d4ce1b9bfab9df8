//! A host's own rows, as every protocol reaches them: NO_WAIT locks on the DRAM word (or on the
//! CAT word once the row is shared — one code path picks by `MIGRATED`, as Tigon's), optimistic
//! reads for OCC, inserts with next-key locking, range scans, and applying a committed value.
//!
//! ```text
//!  access_local ─ in txn? ─ upgrade if needed ─► index
//!               └ new ─► lock (2PL) or check "not write-locked" (OCC) ─► copy value ─► push
//!  finish_owned(commit TID | abort) ─► apply (DRAM; + block if a CAT) ─► unlock
//! ```
//!
//! Invariants: a transaction holds every lock it will ever hold before its commit TID is chosen
//! (strict 2PL; OCC locks its write set at commit); a row whose lock is held is never removed
//! except by the holder; a shared row is moved out by its protocol before it is deleted.

use crate::access::{abort, Abort, Access, Change, LockMode, Place, ScanRecord, TxnError, TxnResult, TxnState};
use crate::error::PodError;
use crate::host::Host;
use crate::partition::{row_flags, RowId, TableId, SUPREMUM_KEY};
use crate::word::LocalLock;

/// How a protocol takes tuples it reads: under a lock (2PL), or by remembering the version and
/// validating at commit (OCC).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadPolicy {
    Locking,
    Optimistic,
}

impl Host {
    pub(crate) fn check_row_size(&self, table: TableId, value: &[u8]) -> TxnResult<()> {
        let expected = self.row_bytes(table);
        if value.len() != expected {
            return Err(TxnError::Fatal(PodError::Workload(format!(
                "value of {} bytes for table {table} with {expected}-byte rows",
                value.len()
            ))));
        }
        Ok(())
    }

    /// Whether `key` of `table` is in this host's partition (the supremum row of an ordered
    /// table belongs to every partition: next-key locking).
    pub(crate) fn owns(&self, table: TableId, key: u64) -> bool {
        key == SUPREMUM_KEY || self.workload.owner(table, key) == self.me
    }

    /// An owned tuple in `want` mode: found in the transaction (upgraded if 2PL needs it) or
    /// taken now. The index of its access, or `None` if absent (or deleted by this transaction).
    pub(crate) fn access_local(
        &mut self,
        txn: &mut TxnState,
        table: TableId,
        key: u64,
        want: LockMode,
        policy: ReadPolicy,
    ) -> TxnResult<Option<usize>> {
        if let Some(index) = txn.find(table, key) {
            let access = txn.accesses[index];
            if access.change == Change::Delete {
                return Ok(None);
            }
            if access.lock < want && policy == ReadPolicy::Locking {
                let Place::Local(row) = access.place else { unreachable!("an owned key has a local access") };
                self.lock_owned(table, row, access.lock, want)?;
                txn.accesses[index].lock = want;
            }
            return Ok(Some(index));
        }
        self.access_owned(txn, table, key, want, policy)
    }

    /// An owned tuple not yet in the transaction: NO_WAIT lock (2PL) or version check (OCC),
    /// then its value from DRAM.
    fn access_owned(
        &mut self,
        txn: &mut TxnState,
        table: TableId,
        key: u64,
        want: LockMode,
        policy: ReadPolicy,
    ) -> TxnResult<Option<usize>> {
        let Some(row) = self.partition.table(table).find(key) else {
            return Ok(None);
        };
        if self.partition.table(table).row(row).is(row_flags::PLACEHOLDER) {
            return abort(Abort::Conflict);
        }
        let lock = match policy {
            ReadPolicy::Optimistic if self.partition.table(table).row(row).lock.writer() => {
                return abort(Abort::Conflict)
            }
            ReadPolicy::Optimistic => LockMode::None,
            ReadPolicy::Locking => {
                self.lock_owned(table, row, LockMode::None, want)?;
                want
            }
        };
        let stored = self.partition.table(table).row(row);
        self.counters.tuple_ops += 1;
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
            return match self.lock_owned_cat(table, row, held, want)? {
                true => Ok(()),
                false => abort(Abort::Conflict),
            };
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
            return Ok(self.unlock_owned_cat(table, row, held, wrote)?);
        }
        let stored = self.partition.table_mut(table).row_mut(row);
        stored.lock = match held {
            LockMode::Read => stored.lock.release_read(),
            _ => stored.lock.release_write(),
        };
        Ok(())
    }

    /// Inserts a placeholder into this host's partition, write-locked, after write-locking the
    /// next key (ordered tables). `key` must not be in the transaction already.
    pub(crate) fn insert_local(
        &mut self,
        txn: &mut TxnState,
        table: TableId,
        key: u64,
        value: &[u8],
        policy: ReadPolicy,
    ) -> TxnResult<()> {
        if self.partition.table(table).find(key).is_some() {
            return abort(Abort::User);
        }
        if self.partition.table(table).spec.ordered {
            let (next_key, _) = self.partition.table(table).next_key(key);
            self.access_local(txn, table, next_key, LockMode::Write, policy)?;
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

    /// Locks (2PL) or records (OCC) every key of this host's partition in the range and the key
    /// after it; returns the keys in range.
    pub(crate) fn scan_local(
        &mut self,
        txn: &mut TxnState,
        table: TableId,
        (low, high, limit): (u64, u64, usize),
        policy: ReadPolicy,
    ) -> TxnResult<Vec<u64>> {
        let found = self.partition.table(table).range(low, high, limit);
        let mut keys = Vec::with_capacity(found.len());
        for (key, _) in &found {
            if self.access_local(txn, table, *key, LockMode::Read, policy)?.is_some() {
                keys.push(*key);
            }
        }
        let bound = if found.len() == limit { found.last().map_or(high, |(key, _)| *key) } else { high };
        if bound < SUPREMUM_KEY {
            let (next_key, _) = self.partition.table(table).next_key(bound);
            self.access_local(txn, table, next_key, LockMode::Read, policy)?;
        }
        if policy == ReadPolicy::Optimistic {
            txn.scans.push(ScanRecord { table, low, high, limit, keys: keys.clone() });
        }
        Ok(keys)
    }

    /// Applies (if `commit_tid` is given) and releases an owned row's access. A committed delete
    /// of a shared row needs its protocol to move it out first.
    pub(crate) fn finish_owned(&mut self, txn: &TxnState, index: usize, commit_tid: Option<u64>) -> TxnResult<()> {
        let access = txn.accesses[index];
        let Place::Local(row) = access.place else { unreachable!("finish_owned on a non-local access") };
        match (commit_tid, access.change) {
            (None, Change::Insert) => {
                self.partition.table_mut(access.table).remove(access.key);
                return Ok(());
            }
            (Some(_), Change::Delete) => {
                self.delete_owned_row(access.table, row);
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
    pub(crate) fn apply_owned(&mut self, table: TableId, row: RowId, value: &[u8], tid: u64) {
        let stored = self.partition.table_mut(table).row_mut(row);
        stored.lock = stored.lock.with_tid(tid);
        stored.set(row_flags::PLACEHOLDER, false);
        self.counters.tuple_ops += 1;
        self.counters.dram_bytes += value.len() as u64;
        if stored.is(row_flags::MIGRATED) {
            // The DRAM row equals the block (a remote write was copied back at lock time).
            let node = stored.shortcut;
            let old = std::mem::replace(&mut stored.data, value.to_vec().into_boxed_slice());
            self.write_block(node, tid, Some(&old), value);
        } else {
            stored.data.copy_from_slice(value);
            stored.set(row_flags::MODIFIED_SINCE_MOVED_OUT, true);
        }
    }

    /// Removes a committed delete's row (already moved out if it was shared), freeing the SWcc
    /// block it retained.
    pub(crate) fn delete_owned_row(&mut self, table: TableId, row: RowId) {
        assert!(!self.partition.table(table).row(row).is(row_flags::MIGRATED), "a shared row is moved out first");
        let key = self.partition.table(table).row(row).key;
        let removed = self.partition.table_mut(table).remove(key).expect("a locked row is present");
        if removed.retained_block != 0 {
            let bytes = crate::cat::block_bytes(removed.data.len());
            self.blocks.free(removed.retained_block, bytes);
        }
    }

    /// Abort: releases every access to this host's rows (and drops inserted placeholders).
    pub(crate) fn release_local(&mut self, txn: &TxnState) -> TxnResult<()> {
        for index in 0..txn.accesses.len() {
            if let Place::Local(_) = txn.accesses[index].place {
                self.finish_owned(txn, index, None)?;
            }
        }
        Ok(())
    }
}
