//! A host's partition in its private DRAM: per table a slab of rows, a hash index (point tables)
//! or an ordered index (range tables), and per row the owner-side metadata of the Pasha
//! architecture.
//!
//! ```text
//!  LocalTable ── hash / BTreeMap: key → RowId ──► LocalRow { lock: LocalLock (writer, readers, TID),
//!                                                           flags: MIGRATED | MODIFIED_SINCE_MOVED_OUT | PLACEHOLDER,
//!                                                           shortcut → CatNode in the HWcc arena,
//!                                                           retained SWcc block, data }
//! ```
//!
//! Invariants: one worker thread per host owns the partition (no DRAM latches needed; remote
//! hosts never touch it — they reach shared tuples through the region); `shortcut` is non-null
//! exactly when `MIGRATED` is set; ordered tables hold a supremum row at `u64::MAX` so next-key
//! locking always has a key to lock.

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

use crate::region::Off;
use crate::word::{CatNode, LocalLock};

pub type TableId = u8;
pub type RowId = u32;

/// Key of the supremum row of every ordered table (never returned by scans, never logged).
pub const SUPREMUM_KEY: u64 = u64::MAX;

/// A table's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableSpec {
    pub id: TableId,
    pub name: &'static str,
    /// Every row of the table has exactly this many bytes.
    pub row_bytes: usize,
    /// Range-scannable (ordered index) instead of hash.
    pub ordered: bool,
}

pub mod row_flags {
    /// The row is a CAT: its metadata word lives in the HWcc arena.
    pub const MIGRATED: u8 = 1 << 0;
    /// DRAM data changed since the last move-out, so the retained SWcc block is stale.
    pub const MODIFIED_SINCE_MOVED_OUT: u8 = 1 << 1;
    /// Inserted by an uncommitted transaction.
    pub const PLACEHOLDER: u8 = 1 << 2;
    /// A remote insert's row that a committed remote delete removed before the owner heard the
    /// insert commit (messages from different hosts race): remove it on `InsertDone`.
    pub const DELETE_PENDING: u8 = 1 << 3;
}

#[derive(Debug)]
pub struct LocalRow {
    pub key: u64,
    pub lock: LocalLock,
    pub flags: u8,
    pub shortcut: Off<CatNode>,
    /// SWcc block kept after move-out (0 = none), reused on the next move-in.
    pub retained_block: u64,
    pub data: Box<[u8]>,
}

impl LocalRow {
    pub fn is(&self, flag: u8) -> bool {
        self.flags & flag != 0
    }
    pub fn set(&mut self, flag: u8, on: bool) {
        if on {
            self.flags |= flag
        } else {
            self.flags &= !flag
        }
    }
}

/// FxHash-style hasher for integer keys (SipHash is needlessly slow here; keys are not adversarial).
#[derive(Default)]
pub struct IntHasher(u64);

impl Hasher for IntHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.write_u64(u64::from(*byte));
        }
    }
    fn write_u64(&mut self, value: u64) {
        self.0 = (self.0.rotate_left(5) ^ value).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn write_u8(&mut self, value: u8) {
        self.write_u64(u64::from(value))
    }
    fn write_usize(&mut self, value: usize) {
        self.write_u64(value as u64)
    }
}

pub type IntMap<K, V> = HashMap<K, V, BuildHasherDefault<IntHasher>>;

#[derive(Debug)]
pub struct LocalTable {
    pub spec: TableSpec,
    rows: Vec<LocalRow>,
    free: Vec<RowId>,
    hash: IntMap<u64, RowId>,
    ordered: BTreeMap<u64, RowId>,
}

impl LocalTable {
    fn new(spec: TableSpec) -> LocalTable {
        let mut table =
            LocalTable { spec, rows: Vec::new(), free: Vec::new(), hash: IntMap::default(), ordered: BTreeMap::new() };
        if spec.ordered {
            table.insert(SUPREMUM_KEY, vec![0; spec.row_bytes].into_boxed_slice(), 0);
        }
        table
    }

    pub fn find(&self, key: u64) -> Option<RowId> {
        if self.spec.ordered {
            self.ordered.get(&key).copied()
        } else {
            self.hash.get(&key).copied()
        }
    }

    /// Adds a row; the key must be absent.
    pub fn insert(&mut self, key: u64, data: Box<[u8]>, tid: u64) -> RowId {
        assert_eq!(data.len(), self.spec.row_bytes, "row size of table {}", self.spec.name);
        let row =
            LocalRow { key, lock: LocalLock::unlocked(tid), flags: 0, shortcut: Off::NULL, retained_block: 0, data };
        let id = match self.free.pop() {
            Some(id) => {
                self.rows[id as usize] = row;
                id
            }
            None => {
                self.rows.push(row);
                RowId::try_from(self.rows.len() - 1).expect("fewer than 2^32 rows per table")
            }
        };
        let previous = if self.spec.ordered { self.ordered.insert(key, id) } else { self.hash.insert(key, id) };
        assert!(previous.is_none(), "duplicate key {key} in {}", self.spec.name);
        id
    }

    /// Removes a row from the index; returns its retained SWcc block for the caller to free.
    pub fn remove(&mut self, key: u64) -> Option<LocalRow> {
        let id = if self.spec.ordered { self.ordered.remove(&key) } else { self.hash.remove(&key) }?;
        self.free.push(id);
        let placeholder = LocalRow {
            key: 0,
            lock: LocalLock(0),
            flags: 0,
            shortcut: Off::NULL,
            retained_block: 0,
            data: Box::new([]),
        };
        Some(std::mem::replace(&mut self.rows[id as usize], placeholder))
    }

    pub fn row(&self, id: RowId) -> &LocalRow {
        &self.rows[id as usize]
    }
    pub fn row_mut(&mut self, id: RowId) -> &mut LocalRow {
        &mut self.rows[id as usize]
    }

    /// Keys in `[low, high]` in order, at most `limit` (ordered tables; the supremum excluded).
    pub fn range(&self, low: u64, high: u64, limit: usize) -> Vec<(u64, RowId)> {
        assert!(self.spec.ordered, "range scan on hash table {}", self.spec.name);
        self.ordered.range(low..=high.min(SUPREMUM_KEY - 1)).take(limit).map(|(key, id)| (*key, *id)).collect()
    }

    /// The first key strictly above `key` (the supremum if none).
    pub fn next_key(&self, key: u64) -> (u64, RowId) {
        assert!(self.spec.ordered && key < SUPREMUM_KEY);
        let (next, id) = self.ordered.range(key + 1..).next().expect("the supremum row is always present");
        (*next, *id)
    }

    /// The last key strictly below `key`, if any (placeholders included, like [`Self::next_key`]).
    pub fn prev_key(&self, key: u64) -> Option<(u64, RowId)> {
        assert!(self.spec.ordered);
        self.ordered.range(..key).next_back().map(|(prev, id)| (*prev, *id))
    }

    /// Row ids of every live row (non-supremum, non-placeholder), in index order.
    pub fn live_row_ids(&self) -> Vec<RowId> {
        let ids: Box<dyn Iterator<Item = (&u64, &RowId)>> =
            if self.spec.ordered { Box::new(self.ordered.iter()) } else { Box::new(self.hash.iter()) };
        ids.filter(|(key, id)| **key != SUPREMUM_KEY && !self.rows[**id as usize].is(row_flags::PLACEHOLDER))
            .map(|(_, id)| *id)
            .collect()
    }

    /// Every live (non-supremum, non-placeholder) row, for checks and recovery.
    pub fn live_rows(&self) -> impl Iterator<Item = (u64, &LocalRow)> {
        let ids: Box<dyn Iterator<Item = (&u64, &RowId)>> =
            if self.spec.ordered { Box::new(self.ordered.iter()) } else { Box::new(self.hash.iter()) };
        ids.filter(|(key, _)| **key != SUPREMUM_KEY)
            .map(|(key, id)| (*key, &self.rows[*id as usize]))
            .filter(|(_, row)| !row.is(row_flags::PLACEHOLDER))
    }

    pub fn len(&self) -> usize {
        if self.spec.ordered {
            self.ordered.len() - 1
        } else {
            self.hash.len()
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// All tables of one host's partition, indexed by `TableId`.
#[derive(Debug)]
pub struct Partition {
    tables: Vec<LocalTable>,
}

impl Partition {
    pub fn new(specs: &[TableSpec]) -> Partition {
        for (index, spec) in specs.iter().enumerate() {
            assert_eq!(spec.id as usize, index, "table ids must be dense and in order");
        }
        Partition { tables: specs.iter().map(|spec| LocalTable::new(*spec)).collect() }
    }
    pub fn table(&self, table: TableId) -> &LocalTable {
        &self.tables[table as usize]
    }
    pub fn table_mut(&mut self, table: TableId) -> &mut LocalTable {
        &mut self.tables[table as usize]
    }
    pub fn tables(&self) -> &[LocalTable] {
        &self.tables
    }
    pub fn tables_mut(&mut self) -> &mut [LocalTable] {
        &mut self.tables
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HASHED: TableSpec = TableSpec { id: 0, name: "h", row_bytes: 8, ordered: false };
    const ORDERED: TableSpec = TableSpec { id: 1, name: "o", row_bytes: 8, ordered: true };

    #[test]
    fn ordered_table_scans_and_finds_next_keys() {
        // Goal: range scans and next-key lookups, including the supremum. Method: insert 10, 20, 30.
        let mut partition = Partition::new(&[HASHED, ORDERED]);
        let table = partition.table_mut(1);
        for key in [10, 20, 30] {
            table.insert(key, Box::new([0; 8]), 1);
        }
        assert_eq!(table.range(15, 30, 10).iter().map(|(k, _)| *k).collect::<Vec<_>>(), vec![20, 30]);
        assert_eq!(table.range(0, 100, 2).len(), 2);
        assert_eq!(table.next_key(20).0, 30);
        assert_eq!(table.next_key(30).0, SUPREMUM_KEY);
        assert_eq!(table.len(), 3);
        assert_eq!(table.live_rows().count(), 3);
    }

    #[test]
    fn removed_rows_are_reused() {
        // Goal: the slab reuses removed rows and the index forgets them. Method: insert, remove, insert.
        let mut partition = Partition::new(&[HASHED]);
        let table = partition.table_mut(0);
        let first = table.insert(5, Box::new([1; 8]), 1);
        assert_eq!(table.remove(5).map(|row| row.key), Some(5));
        assert_eq!(table.find(5), None);
        assert_eq!(table.insert(6, Box::new([2; 8]), 1), first);
        assert_eq!(table.row(first).data[0], 2);
    }
}
