//! The owner's side of Tigon's data movement: the CATs a host owns, in CLOCK order; move-in
//! (serving a migration request), move-out (second chance, never a pinned node), pre-migration,
//! and the end-of-run eviction.
//!
//! ```text
//!  move_in:  make_room (CLOCK) ─ block (retained under SWcc, fresh under NoSWcc) ─ copy unless
//!            current ─ node linked into the CXL index ─ shortcut, MIGRATED ─ neighbour bits
//!  move_out: latch ─ pinned? skip ─ second chance? clear, skip ─ lock state + modified data back
//!            to DRAM ─ unlink ─ word = 0 ─ free the node (NoSWcc: the block too)
//! ```
//!
//! Invariants: lock state lives in exactly one tier — it moves with `MIGRATED` while the owner's
//! worker (the only one touching its DRAM) holds the node's latch; a pinned node is never moved
//! out; the CLOCK sweep is bounded (two passes), since every node may be pinned.

use std::sync::atomic::Ordering;

use crate::cat::{block_bytes, BLOCK_HEADER_BYTES};
use crate::coherence::{lines_spanned, SwccProtocol};
use crate::cxl_index::NewCat;
use crate::error::{PodError, Result};
use crate::host::Host;
use crate::message::MigrateOutcome;
use crate::partition::{row_flags, RowId, TableId};
use crate::region::Off;
use crate::staleness::TraceKind;
use crate::word::{CatNode, Latched, MetaWord, CAT_NODE_BYTES, LATCH_WAIT_MAX};

/// A CAT this host owns, in CLOCK order.
#[derive(Debug, Clone, Copy)]
pub struct ClockEntry {
    pub node: Off<CatNode>,
    pub table: TableId,
    pub row: RowId,
}

/// The CATs one host owns and the CLOCK hand over them.
#[derive(Debug, Default)]
pub struct Cats {
    clock: Vec<ClockEntry>,
    hand: usize,
}

impl Cats {
    pub(crate) fn len(&self) -> usize {
        self.clock.len()
    }

    /// One requested key: the tuple becomes (or already is) a CAT, pinned once for the requester.
    pub(crate) fn migrate_one(&mut self, host: &mut Host, table: TableId, key: u64) -> Result<MigrateOutcome> {
        let row = host.partition.table(table).find(key);
        // Finding and reading the row is a tuple access, as for a baseline's remote access.
        host.counters.tuple_ops += u64::from(row.is_some());
        Ok(match row {
            None => MigrateOutcome::NotFound,
            // A migrated placeholder is a remote insert: its CAT's lock tells the truth (held
            // while in flight, free once committed), so it is served like any CAT.
            Some(row) if host.partition.table(table).row(row).is(row_flags::MIGRATED) => {
                let node_off = host.partition.table(table).row(row).shortcut;
                let node: &CatNode = host.region.get(node_off);
                let latched = host.latch_owned(node, node_off)?;
                node.pin(&latched);
                drop(latched);
                MigrateOutcome::Moved { node: node_off.raw() }
            }
            Some(row) if host.partition.table(table).row(row).is(row_flags::PLACEHOLDER) => MigrateOutcome::NotFound,
            Some(row) => match self.move_in(host, table, row, 1)? {
                Some(node) => {
                    host.maybe_crash(crate::config::CrashPoint::MoveIn);
                    MigrateOutcome::Moved { node: node.raw() }
                }
                None => MigrateOutcome::OutOfMemory,
            },
        })
    }

    /// Moves an owned row into CXL with `pins` pins; `None` if no room even after eviction.
    /// Like Tigon's `move_from_partition_to_shared_region`: block (a retained one under SWcc, a
    /// fresh one under NoSWcc), data copied unless the retained block is current, node linked
    /// into the CXL index, shortcut set.
    pub(crate) fn move_in(
        &mut self,
        host: &mut Host,
        table: TableId,
        row: RowId,
        pins: u32,
    ) -> Result<Option<Off<CatNode>>> {
        let bytes = block_bytes(host.row_bytes(table));
        let data_charge = if host.config.swcc == SwccProtocol::NoSwcc { bytes } else { 0 };
        if !self.make_room(host, CAT_NODE_BYTES + data_charge)? {
            host.counters.moves_refused += 1;
            return Ok(None);
        }
        let stored = host.partition.table(table).row(row);
        let (block, current) = match stored.retained_block {
            0 => match host.blocks.alloc(bytes) {
                Some(block) => (block, false),
                None => {
                    host.counters.moves_refused += 1;
                    return Ok(None);
                }
            },
            block => (block, !stored.is(row_flags::MODIFIED_SINCE_MOVED_OUT)),
        };
        assert!(host.hwcc.charge_data(data_charge), "make_room reserved the data bytes");
        let (key, lock, data) = (stored.key, stored.lock, stored.data.clone());
        // Under SWcc a row's first move-in fills the block later ones reuse: a compulsory cost
        // (`Counters::first_move_in_written_lines`). Under NoSWcc every move-in fills a fresh
        // block, so the first one is what each later one costs too, and is priced.
        let compulsory = stored.retained_block == 0 && host.config.swcc != SwccProtocol::NoSwcc;
        let block_len = BLOCK_HEADER_BYTES as u64 + host.row_bytes(table) as u64;
        if !current {
            host.store_block(block, lock.tid(), &data);
            host.swcc.writeback(host.region, block, block_len);
            host.swcc.fence();
            if compulsory {
                host.counters.first_move_in_written_lines += lines_spanned(block, block_len);
            }
        }
        let node = host.hwcc.alloc_node().expect("make_room reserved the node");
        let word = MetaWord(0).with_block_offset(block).with_lock_of(lock).with_only_host_valid(host.me);
        host.model_event(block, if current { TraceKind::Reset } else { TraceKind::Write }, block_len);
        host.index.link(host.region, host.me, node, NewCat { table, key, word, pins })?;
        // The latch CAS on the new node, and the bucket head line the link rewrites.
        host.counters.owner_atomics += 1;
        host.counters.hwcc_lines_read += 1;
        let stored = host.partition.table_mut(table).row_mut(row);
        stored.set(row_flags::MIGRATED, true);
        stored.set(row_flags::MODIFIED_SINCE_MOVED_OUT, false);
        stored.shortcut = node;
        stored.retained_block = block;
        self.clock.push(ClockEntry { node, table, row });
        host.link_neighbour_bits(table, key)?;
        host.counters.moves_in += 1;
        host.shared().hwcc_used_bytes.store(host.hwcc.used_bytes(), Ordering::Relaxed);
        Ok(Some(node))
    }

    /// CLOCK (second chance) over this host's CATs until `extra` HWcc bytes fit. Bounded: two
    /// sweeps, since every node may be pinned.
    fn make_room(&mut self, host: &mut Host, extra: u64) -> Result<bool> {
        let mut steps = 0usize;
        let limit = 2 * self.clock.len() + 1;
        while !host.hwcc.fits(extra) && !self.clock.is_empty() && steps < limit {
            steps += 1;
            if self.hand >= self.clock.len() {
                self.hand = 0;
            }
            if !self.move_out(host, self.hand, false)? {
                self.hand += 1;
            }
        }
        Ok(host.hwcc.fits(extra))
    }

    /// Moves the CAT at `clock[at]` back out unless it is pinned (or, without `force`, has its
    /// second chance). True if it was moved out.
    fn move_out(&mut self, host: &mut Host, at: usize, force: bool) -> Result<bool> {
        let entry = self.clock[at];
        let node: &CatNode = host.region.get(entry.node);
        let mut latched = host.latch_owned(node, entry.node)?;
        if node.pins.load(Ordering::Relaxed) > 0 {
            return Ok(false);
        }
        if !force && latched.value.flag(MetaWord::SECOND_CHANCE) {
            latched.value = latched.value.with_flag(MetaWord::SECOND_CHANCE, false);
            return Ok(false);
        }
        evict_latched(host, entry, &mut latched);
        drop(latched);
        self.clock.swap_remove(at);
        let key = host.partition.table(entry.table).row(entry.row).key;
        host.unlink_neighbour_bits(entry.table, key)?;
        Ok(true)
    }

    /// Moves one row out now (a committed delete), waiting out transient pins.
    pub(crate) fn force_move_out(&mut self, host: &mut Host, table: TableId, row: RowId) -> Result<()> {
        let at = self
            .clock
            .iter()
            .position(|entry| entry.table == table && entry.row == row)
            .expect("a migrated row is in the clock list");
        let started = std::time::Instant::now();
        while !self.move_out(host, at, true)? {
            if started.elapsed() > LATCH_WAIT_MAX {
                return Err(PodError::Unsupported("a CAT stayed pinned while being deleted"));
            }
            std::thread::yield_now();
        }
        Ok(())
    }

    /// Removes a committed delete's row, moving it out of CXL first if it is shared.
    pub(crate) fn delete_row(&mut self, host: &mut Host, table: TableId, row: RowId) -> Result<()> {
        if host.partition.table(table).row(row).is(row_flags::MIGRATED) {
            self.force_move_out(host, table, row)?;
        }
        host.delete_owned_row(table, row);
        Ok(())
    }

    /// Moves rows of the shareable tables in until the budget is full (no eviction); returns how many.
    pub(crate) fn pre_migrate(&mut self, host: &mut Host) -> Result<u64> {
        let mut moved = 0;
        for table in host.workload.shareable_tables() {
            let charge = CAT_NODE_BYTES
                + if host.config.swcc == SwccProtocol::NoSwcc { block_bytes(host.row_bytes(table)) } else { 0 };
            for row in host.partition.table(table).live_row_ids() {
                if !host.hwcc.fits(charge) || self.move_in(host, table, row, 0)?.is_none() {
                    return Ok(moved);
                }
                moved += 1;
            }
        }
        Ok(moved)
    }

    /// End of run: every CAT back out, so DRAM is the whole truth (checks, next start).
    pub(crate) fn evict_all(&mut self, host: &mut Host) -> Result<()> {
        let started = std::time::Instant::now();
        while !self.clock.is_empty() {
            if !self.move_out(host, self.clock.len() - 1, true)? {
                if started.elapsed() > LATCH_WAIT_MAX {
                    return Err(PodError::Unsupported("a CAT stayed pinned after every host stopped"));
                }
                std::thread::yield_now();
            }
        }
        Ok(())
    }
}

/// With the node latched and unpinned: lock state and modified data back to DRAM, unlink,
/// zero the word (the latch release publishes "no tuple here"), free the node.
fn evict_latched(host: &mut Host, entry: ClockEntry, latched: &mut Latched<'_>) {
    let mut word = latched.value;
    let key = host.partition.table(entry.table).row(entry.row).key;
    let len = host.block_len(entry.table);
    host.model_read(word.block_offset(), len);
    if word.flag(MetaWord::MODIFIED) {
        host.swcc_before_read(&mut word, len);
        let (tid, value) = host.load_block(entry.node, entry.table);
        let stored = host.partition.table_mut(entry.table).row_mut(entry.row);
        stored.data.copy_from_slice(&value);
        stored.lock = stored.lock.with_tid(tid);
    }
    let stored = host.partition.table_mut(entry.table).row_mut(entry.row);
    stored.lock = stored.lock.with_lock_of(word);
    stored.set(row_flags::MIGRATED, false);
    stored.shortcut = Off::NULL;
    let lines = host.index.unlink(host.region, host.me, entry.node, entry.table, key);
    host.counters.hwcc_lines_read += u64::from(lines.expect("an owned CAT is in its owner's index"));
    latched.value = MetaWord(0);
    host.hwcc.free_node(entry.node);
    if host.config.swcc == SwccProtocol::NoSwcc {
        // Tigon keeps the block as a cache only under SWcc (`move_from_*_to_partition`
        // frees it when `enable_scc` is off, and the next move-in allocates a fresh one), so
        // under NoSWcc every move-in rewrites a block and its readers fetch it anew.
        let bytes = block_bytes(host.row_bytes(entry.table));
        host.hwcc.refund_data(bytes);
        host.blocks.free(word.block_offset(), bytes);
        host.partition.table_mut(entry.table).row_mut(entry.row).retained_block = 0;
    }
    host.counters.moves_out += 1;
    host.shared().hwcc_used_bytes.store(host.hwcc.used_bytes(), Ordering::Relaxed);
}
