//! The Pasha/Tigon protocol: cross-host active tuples (CATs) in CXL memory, 2PL NO_WAIT on their
//! 8-byte HWcc word, software cache coherence on their SWcc blocks, and commit without 2PC.
//!
//! ```text
//!  remote access (host A, key of B):
//!    B's CXL index ──hit──► latch word: validate, pin, NO_WAIT lock, SWcc before_read ──► read block
//!         └─miss──► Migrate → B: move_in (CLOCK make_room, block, node, link) → Moved(node, pinned for A)
//!  commit (A): TID, redo records for every change (also B's tuples!), apply: DRAM rows and CXL
//!    blocks directly; latch: SWcc after_write (write back, clear others' bits), MODIFIED, unlock, unpin
//!  move-out (B, CLOCK second chance, never a pinned node): lock state + modified data back to
//!    DRAM, unlink, free the node (word = 0), keep the block for the next move-in (NoSWcc: free
//!    it too, as Tigon does when all CXL data is hardware-coherent and charged to the budget)
//!
//!  SWcc block: [ TID u64 | length u32 | flags u32 | row bytes … ]  (line-aligned, whole lines;
//!              a write stores and writes back only the TID line and the lines it changes)
//! ```
//!
//! Invariants: lock state lives in exactly one tier — it moves with `MIGRATED` while the owner's
//! worker (the only one touching its DRAM) holds the node's latch; a pinned node is never moved
//! out; the owner's DRAM copy is current unless the word's MODIFIED bit says a remote host wrote
//! the block; dirty block lines reach memory before the write lock is visibly released.

use std::sync::atomic::Ordering;

use crate::alloc::SwccArena;
use crate::coherence::{lines_spanned, SwccProtocol};
use crate::config::{CrashPoint, InjectedFault};
use crate::cxl_index::NewCat;
use crate::error::{PodError, Result};
use crate::host::Host;
use crate::message::{Message, MigrateOutcome};
use crate::partition::{row_flags, RowId, TableId};
use crate::region::{Off, LINE_BYTES};
use crate::staleness::TraceKind;
use crate::txn::{abort, Abort, Access, Change, LockMode, Place, TxnError, TxnResult, TxnState};
use crate::word::{CatNode, Latched, MetaWord, CAT_NODE_BYTES};

/// Bytes of a block's header before the row.
pub const BLOCK_HEADER_BYTES: usize = 16;

/// Whole-line size of the SWcc block of a row of `row_bytes`.
pub fn block_bytes(row_bytes: usize) -> u64 {
    SwccArena::block_bytes((BLOCK_HEADER_BYTES + row_bytes) as u64)
}

/// A CAT this host owns, in CLOCK order.
#[derive(Debug, Clone, Copy)]
pub struct ClockEntry {
    pub node: Off<CatNode>,
    pub table: TableId,
    pub row: RowId,
}

enum Pinned {
    Locked,
    /// The node no longer describes the tuple (moved out, reused): ask the owner.
    Stale,
    Conflict,
}

pub(crate) fn transition(word: MetaWord, held: LockMode, want: LockMode) -> Option<MetaWord> {
    match (held, want) {
        (LockMode::None, LockMode::Read) => word.try_read_lock(),
        (LockMode::None, LockMode::Write) => word.try_write_lock(),
        (LockMode::Read, LockMode::Write) => word.try_upgrade(),
        _ => Some(word),
    }
}

pub(crate) fn release(word: MetaWord, held: LockMode) -> MetaWord {
    match held {
        LockMode::None => word,
        LockMode::Read => word.release_read(),
        LockMode::Write => word.release_write(),
    }
}

impl Host {
    pub(crate) fn row_bytes(&self, table: TableId) -> usize {
        self.partition.table(table).spec.row_bytes
    }

    /// A tuple of `owner`: through its CXL index if shared already, else by migration request.
    pub(crate) fn tigon_access_remote(
        &mut self,
        txn: &mut TxnState,
        table: TableId,
        key: u64,
        owner: usize,
        want: LockMode,
    ) -> TxnResult<Option<usize>> {
        self.counters.remote_accesses += 1;
        let want = want.max(LockMode::Read);
        let lookup = self.search_remote_index(owner, table, key);
        let mut locked = None;
        if let Some(node) = lookup.node {
            match self.pin_and_lock(node, table, key, want, false)? {
                Pinned::Locked => locked = Some(node),
                Pinned::Conflict => return abort(Abort::Conflict),
                Pinned::Stale => {}
            }
        }
        let node = match locked {
            Some(node) => {
                self.counters.remote_index_hits += 1;
                node
            }
            None => match self.migrate_and_find(owner, table, key)? {
                Some(node) => match self.pin_and_lock(node, table, key, want, true)? {
                    Pinned::Locked => node,
                    Pinned::Conflict => return abort(Abort::Conflict),
                    Pinned::Stale => unreachable!("a node pinned for us cannot go stale"),
                },
                None => return Ok(None),
            },
        };
        let (tid, value) = self.load_block(node, table);
        let access = Access {
            table,
            key,
            place: Place::Cat { owner, node },
            lock: want,
            read_tid: Some(tid),
            value: None,
            change: Change::None,
        };
        Ok(Some(txn.push(access, Some(&value))?))
    }

    /// Asks the owner to move the tuple in, then searches the owner's CXL index for it as Tigon's
    /// requester does (`data_migration_response_handler` → `get_migrated_row`): a second index
    /// search, over lines the owner's link just rewrote. The node comes back pinned for us and
    /// named in the reply, so the search normally finds it; a concurrent unlink and reuse can
    /// send a lock-free search down another chain (see [`crate::cxl_index`]), and then the
    /// reply's node is used: the search was still made and is counted.
    fn migrate_and_find(&mut self, owner: usize, table: TableId, key: u64) -> TxnResult<Option<Off<CatNode>>> {
        let Some(moved) = self.migrate(owner, table, key)? else { return Ok(None) };
        self.search_remote_index(owner, table, key);
        Ok(Some(moved))
    }

    /// A lock-free search of `owner`'s CXL index, counted with the HWcc lines it read.
    fn search_remote_index(&mut self, owner: usize, table: TableId, key: u64) -> crate::cxl_index::Lookup {
        let lookup = self.index.lookup(self.region, owner, table, key);
        self.counters.remote_index_searches += 1;
        self.counters.hwcc_lines_read += u64::from(lookup.steps);
        lookup
    }

    /// Asks the owner to move the tuple in; the node comes back pinned for us.
    fn migrate(&mut self, owner: usize, table: TableId, key: u64) -> TxnResult<Option<Off<CatNode>>> {
        self.counters.remote_messages += 1;
        let request = self.next_request_id();
        match self.request(owner, Message::Migrate { request, table, key })? {
            Message::MigrateReply { outcome: MigrateOutcome::Moved { node }, .. } => Ok(Some(Off::new(node))),
            Message::MigrateReply { outcome: MigrateOutcome::NotFound, .. } => Ok(None),
            Message::MigrateReply { outcome: MigrateOutcome::OutOfMemory, .. } => abort(Abort::OutOfMemory),
            _ => Err(TxnError::Fatal(PodError::BadMessage { from: owner, detail: "expected a migrate reply" })),
        }
    }

    /// Latches the node, checks it still is `(table, key)`, pins it (unless pinned already) and
    /// takes the lock NO_WAIT; makes this host's cached copy of the block valid.
    fn pin_and_lock(
        &mut self,
        node_off: Off<CatNode>,
        table: TableId,
        key: u64,
        want: LockMode,
        pinned: bool,
    ) -> TxnResult<Pinned> {
        let node: &CatNode = self.region.get(node_off);
        let mut latched = self.latch(node, node_off)?;
        let valid = node.key.load(Ordering::Relaxed) == key
            && node.table.load(Ordering::Relaxed) == u32::from(table)
            && latched.value.block_offset() != 0;
        if !valid {
            assert!(!pinned, "a pinned CAT went stale");
            return Ok(Pinned::Stale);
        }
        let Some(locked) = transition(latched.value, LockMode::None, want) else {
            if pinned {
                node.unpin(&latched);
            }
            return Ok(Pinned::Conflict);
        };
        if !pinned {
            node.pin(&latched);
        }
        let mut word = locked.with_flag(MetaWord::SECOND_CHANCE, true);
        let len = (BLOCK_HEADER_BYTES + self.row_bytes(table)) as u64;
        self.model_read(word.block_offset(), len);
        self.swcc_before_read(&mut word, len);
        latched.value = word;
        Ok(Pinned::Locked)
    }

    /// Reads a block's TID and row through this host's cache (caller holds a lock on it).
    pub(crate) fn load_block(&mut self, node_off: Off<CatNode>, table: TableId) -> (u64, Vec<u8>) {
        let word = MetaWord(self.region.get(node_off).word.load(Ordering::Acquire));
        let mut bytes = vec![0u8; BLOCK_HEADER_BYTES + self.row_bytes(table)];
        self.swcc.load(self.region, word.block_offset(), &mut bytes);
        let mut tid = [0u8; 8];
        tid.copy_from_slice(&bytes[..8]);
        (u64::from_le_bytes(tid), bytes.split_off(BLOCK_HEADER_BYTES))
    }

    /// Stores TID and row into a block through this host's cache (the caller writes it back).
    fn store_block(&mut self, block: u64, tid: u64, value: &[u8]) {
        self.swcc.store(self.region, block, &block_image(tid, value));
    }

    /// A committed write of `new` (version `tid`) to a CAT the caller holds write-locked, whose
    /// row in the block is `old` (`None`: unknown, e.g. an insert's placeholder). Stores and
    /// writes back only the lines that change — the header line (new TID) and the lines where
    /// the row differs: writing back an unchanged line carries no data (Tigon `clwb`s the whole
    /// tuple, but a `clwb` of a clean line moves nothing), so neither the cache nor the model
    /// pays for it. The caller's fence before it releases the lock publishes the lines.
    pub(crate) fn tigon_write_block(&mut self, node_off: Off<CatNode>, tid: u64, old: Option<&[u8]>, new: &[u8]) {
        let block = MetaWord(self.region.get(node_off).word.load(Ordering::Acquire)).block_offset();
        let image = block_image(tid, new);
        let skip = self.config.fault == Some(InjectedFault::SkipWriterWriteback);
        for lines in changed_line_runs(old, new) {
            let bytes = &image[lines.start * LINE..(lines.end * LINE).min(image.len())];
            let at = block + (lines.start * LINE) as u64;
            self.swcc.store(self.region, at, bytes);
            if !skip {
                self.swcc.writeback(self.region, at, bytes.len() as u64);
            }
        }
    }

    pub(crate) fn tigon_upgrade(&mut self, node_off: Off<CatNode>) -> TxnResult<()> {
        let node: &CatNode = self.region.get(node_off);
        let mut latched = self.latch(node, node_off)?;
        match latched.value.try_upgrade() {
            Some(word) => {
                latched.value = word;
                Ok(())
            }
            None => abort(Abort::Conflict),
        }
    }

    /// The owner's node of a migrated row: the shortcut, or (ablation) a CXL index traversal.
    fn owner_node(&mut self, table: TableId, row: RowId) -> Off<CatNode> {
        let stored = self.partition.table(table).row(row);
        if self.config.shortcut {
            return stored.shortcut;
        }
        let lookup = self.index.lookup(self.region, self.me, table, stored.key);
        self.counters.hwcc_lines_read += u64::from(lookup.steps);
        lookup.node.expect("a migrated row is in its owner's CXL index")
    }

    /// Owner locking its own CAT; copies remote modifications back to DRAM before it reads.
    pub(crate) fn tigon_lock_owned_cat(
        &mut self,
        table: TableId,
        row: RowId,
        held: LockMode,
        want: LockMode,
    ) -> TxnResult<()> {
        let node_off = self.owner_node(table, row);
        let node: &CatNode = self.region.get(node_off);
        let mut latched = self.latch_owned(node, node_off)?;
        let Some(mut word) = transition(latched.value, held, want) else {
            return abort(Abort::Conflict);
        };
        let len = (BLOCK_HEADER_BYTES + self.row_bytes(table)) as u64;
        self.model_read(word.block_offset(), len);
        if word.flag(MetaWord::MODIFIED) {
            self.swcc_before_read(&mut word, len);
            latched.value = word;
            let (tid, value) = self.load_block(node_off, table);
            let stored = self.partition.table_mut(table).row_mut(row);
            stored.data.copy_from_slice(&value);
            stored.lock = stored.lock.with_tid(tid);
            word = word.with_flag(MetaWord::MODIFIED, false);
        }
        latched.value = word;
        Ok(())
    }

    pub(crate) fn tigon_unlock_owned_cat(
        &mut self,
        table: TableId,
        row: RowId,
        held: LockMode,
        wrote: bool,
    ) -> TxnResult<()> {
        let node_off = self.owner_node(table, row);
        let node: &CatNode = self.region.get(node_off);
        let mut latched = self.latch_owned(node, node_off)?;
        let mut word = latched.value;
        if wrote {
            let len = (BLOCK_HEADER_BYTES + self.row_bytes(table)) as u64;
            self.swcc_after_write(&mut word, len);
        }
        latched.value = release(word, held);
        Ok(())
    }

    /// Applies (on commit) and releases a remote CAT access, then unpins it.
    pub(crate) fn tigon_finish_cat(&mut self, txn: &TxnState, index: usize, commit_tid: Option<u64>) -> TxnResult<()> {
        let access = txn.accesses[index];
        let Place::Cat { node: node_off, owner } = access.place else { unreachable!("not a CAT access") };
        match (access.change, commit_tid) {
            (Change::Insert, None) => return Ok(self.abandon_insert(owner, access.table, access.key, node_off)?),
            (Change::Delete, Some(_)) => {
                return Ok(self.hand_over_delete(owner, access.table, access.key, node_off)?)
            }
            _ => {}
        }
        let node: &CatNode = self.region.get(node_off);
        let wrote = commit_tid.is_some() && matches!(access.change, Change::Update | Change::Insert);
        let len = (BLOCK_HEADER_BYTES + self.row_bytes(access.table)) as u64;
        if let (true, Some(tid)) = (wrote, commit_tid) {
            let value = txn.value(index).expect("an update carries its value");
            // What we read under this lock is what the block holds; an insert's is unknown.
            let old = if access.change == Change::Update { txn.read_value(index) } else { None };
            self.tigon_write_block(node_off, tid, old, value);
        }
        let mut latched = self.latch(node, node_off)?;
        self.maybe_crash(CrashPoint::HoldingLatch);
        let mut word = latched.value;
        if wrote {
            self.swcc_after_write(&mut word, len);
            word = word.with_flag(MetaWord::MODIFIED, true);
        }
        latched.value = release(word, access.lock);
        node.unpin(&latched);
        drop(latched);
        if access.change == Change::Insert {
            // The owner turns its placeholder into the row (module `remote_insert`).
            self.counters.remote_inserts += 1;
            self.send(owner, &Message::InsertDone { table: access.table, key: access.key, committed: true })?;
        }
        Ok(())
    }

    /// Commit without 2PC: every change — local rows and other hosts' CATs — is logged here and
    /// applied directly.
    pub(crate) fn tigon_commit(&mut self, txn: &mut TxnState) -> TxnResult<()> {
        if txn.is_read_only() {
            self.release_all(txn)?;
            self.counters.committed_read_only += 1;
            self.record_history(txn, 0);
            return Ok(());
        }
        let (epoch, tid) = self.commit_tid(txn, 0);
        self.log_changes(txn, tid);
        self.maybe_crash(CrashPoint::MidEpoch);
        for index in 0..txn.accesses.len() {
            match txn.accesses[index].place {
                Place::Local(_) => self.finish_owned(txn, index, Some(tid))?,
                Place::Cat { .. } => self.tigon_finish_cat(txn, index, Some(tid))?,
                Place::Remote { .. } => unreachable!("Tigon never reaches a tuple by message"),
            }
        }
        self.after_commit(txn, epoch, tid);
        Ok(())
    }

    // ---- owner side: move-in, move-out ----

    /// Handles a migration request: the tuple becomes (or already is) a CAT, pinned for `from`.
    pub(crate) fn serve_migrate(&mut self, from: usize, request: u32, table: TableId, key: u64) -> Result<()> {
        let row = self.partition.table(table).find(key);
        // Finding and reading the row is a DRAM tuple access, as for a baseline's remote access.
        self.counters.dram_tuple_ops += u64::from(row.is_some());
        let outcome = match row {
            None => MigrateOutcome::NotFound,
            // A migrated placeholder is a remote insert: its CAT's lock tells the truth (held
            // while in flight, free once committed), so it is served like any CAT.
            Some(row) if self.partition.table(table).row(row).is(row_flags::MIGRATED) => {
                let node_off = self.partition.table(table).row(row).shortcut;
                let node: &CatNode = self.region.get(node_off);
                let latched = self.latch_owned(node, node_off).map_err(into_pod_error)?;
                node.pin(&latched);
                drop(latched);
                MigrateOutcome::Moved { node: node_off.raw() }
            }
            Some(row) if self.partition.table(table).row(row).is(row_flags::PLACEHOLDER) => MigrateOutcome::NotFound,
            Some(row) => match self.move_in(table, row, 1)? {
                Some(node) => {
                    self.maybe_crash(CrashPoint::MoveIn);
                    MigrateOutcome::Moved { node: node.raw() }
                }
                None => MigrateOutcome::OutOfMemory,
            },
        };
        self.send(from, &Message::MigrateReply { request, outcome })
    }

    /// Moves an owned row into CXL with `pins` pins; `None` if no room even after eviction.
    /// Like Tigon's `move_from_partition_to_shared_region`: block (a retained one under SWcc, a
    /// fresh one under NoSWcc), data copied unless the retained block is current, node linked
    /// into the CXL index, shortcut set.
    pub(crate) fn move_in(&mut self, table: TableId, row: RowId, pins: u32) -> Result<Option<Off<CatNode>>> {
        let bytes = block_bytes(self.row_bytes(table));
        let data_charge = if self.config.swcc == SwccProtocol::NoSwcc { bytes } else { 0 };
        if !self.make_room(CAT_NODE_BYTES + data_charge)? {
            self.counters.moves_refused += 1;
            return Ok(None);
        }
        let stored = self.partition.table(table).row(row);
        let (block, current) = match stored.retained_block {
            0 => match self.blocks.alloc(bytes) {
                Some(block) => (block, false),
                None => {
                    self.counters.moves_refused += 1;
                    return Ok(None);
                }
            },
            block => (block, !stored.is(row_flags::MODIFIED_SINCE_MOVED_OUT)),
        };
        assert!(self.hwcc.charge_data(data_charge), "make_room reserved the data bytes");
        let (key, lock, data) = (stored.key, stored.lock, stored.data.clone());
        // Under SWcc a row's first move-in fills the block later ones reuse: a compulsory cost
        // (`Counters::first_move_in_written_lines`). Under NoSWcc every move-in fills a fresh
        // block, so the first one is what each later one costs too, and is priced.
        let compulsory = stored.retained_block == 0 && self.config.swcc != SwccProtocol::NoSwcc;
        let block_len = BLOCK_HEADER_BYTES as u64 + self.row_bytes(table) as u64;
        if !current {
            self.store_block(block, lock.tid(), &data);
            self.swcc.writeback(self.region, block, block_len);
            self.swcc.fence();
            if compulsory {
                self.counters.first_move_in_written_lines += lines_spanned(block, block_len);
            }
        }
        let node = self.hwcc.alloc_node().expect("make_room reserved the node");
        let word = MetaWord(0).with_block_offset(block).with_lock_of(lock).with_only_host_valid(self.me);
        self.model_event(block, if current { TraceKind::Reset } else { TraceKind::Write }, block_len);
        self.index.link(self.region, self.me, node, NewCat { table, key, word, pins })?;
        // The latch CAS on the new node, and the bucket head line the link rewrites.
        self.counters.owner_atomics += 1;
        self.counters.hwcc_lines_read += 1;
        let stored = self.partition.table_mut(table).row_mut(row);
        stored.set(row_flags::MIGRATED, true);
        stored.set(row_flags::MODIFIED_SINCE_MOVED_OUT, false);
        stored.shortcut = node;
        stored.retained_block = block;
        self.clock.push(ClockEntry { node, table, row });
        self.link_neighbour_bits(table, key)?;
        self.counters.moves_in += 1;
        self.shared().hwcc_used_bytes.store(self.hwcc.used_bytes(), Ordering::Relaxed);
        Ok(Some(node))
    }

    /// CLOCK (second chance) over this host's CATs until `extra` HWcc bytes fit. Bounded: two
    /// sweeps, since every node may be pinned.
    fn make_room(&mut self, extra: u64) -> Result<bool> {
        let mut steps = 0usize;
        let limit = 2 * self.clock.len() + 1;
        while !self.hwcc.fits(extra) && !self.clock.is_empty() && steps < limit {
            steps += 1;
            if self.clock_hand >= self.clock.len() {
                self.clock_hand = 0;
            }
            if !self.move_out(self.clock_hand, false)? {
                self.clock_hand += 1;
            }
        }
        Ok(self.hwcc.fits(extra))
    }

    /// Moves the CAT at `clock[at]` back out unless it is pinned (or, without `force`, has its
    /// second chance). True if it was moved out.
    fn move_out(&mut self, at: usize, force: bool) -> Result<bool> {
        let entry = self.clock[at];
        let node: &CatNode = self.region.get(entry.node);
        let mut latched = self.latch_owned(node, entry.node).map_err(into_pod_error)?;
        if node.pins.load(Ordering::Relaxed) > 0 {
            return Ok(false);
        }
        if !force && latched.value.flag(MetaWord::SECOND_CHANCE) {
            latched.value = latched.value.with_flag(MetaWord::SECOND_CHANCE, false);
            return Ok(false);
        }
        self.evict_latched(entry, &mut latched);
        drop(latched);
        self.clock.swap_remove(at);
        let key = self.partition.table(entry.table).row(entry.row).key;
        self.unlink_neighbour_bits(entry.table, key)?;
        Ok(true)
    }

    /// With the node latched and unpinned: lock state and modified data back to DRAM, unlink,
    /// zero the word (the latch release publishes "no tuple here"), free the node.
    fn evict_latched(&mut self, entry: ClockEntry, latched: &mut Latched<'_>) {
        let mut word = latched.value;
        let key = self.partition.table(entry.table).row(entry.row).key;
        let len = (BLOCK_HEADER_BYTES + self.row_bytes(entry.table)) as u64;
        self.model_read(word.block_offset(), len);
        if word.flag(MetaWord::MODIFIED) {
            self.swcc_before_read(&mut word, len);
            let (tid, value) = self.load_block(entry.node, entry.table);
            let stored = self.partition.table_mut(entry.table).row_mut(entry.row);
            stored.data.copy_from_slice(&value);
            stored.lock = stored.lock.with_tid(tid);
        }
        let stored = self.partition.table_mut(entry.table).row_mut(entry.row);
        stored.lock = stored.lock.with_lock_of(word);
        stored.set(row_flags::MIGRATED, false);
        stored.shortcut = Off::NULL;
        let lines = self.index.unlink(self.region, self.me, entry.node, entry.table, key);
        self.counters.hwcc_lines_read += u64::from(lines.expect("an owned CAT is in its owner's index"));
        latched.value = MetaWord(0);
        self.hwcc.free_node(entry.node);
        if self.config.swcc == SwccProtocol::NoSwcc {
            // Tigon keeps the block as a cache only under SWcc (`move_from_*_to_partition`
            // frees it when `enable_scc` is off, and the next move-in allocates a fresh one), so
            // under NoSWcc every move-in rewrites a block and its readers fetch it anew.
            let bytes = block_bytes(self.row_bytes(entry.table));
            self.hwcc.refund_data(bytes);
            self.blocks.free(word.block_offset(), bytes);
            self.partition.table_mut(entry.table).row_mut(entry.row).retained_block = 0;
        }
        self.counters.moves_out += 1;
        self.shared().hwcc_used_bytes.store(self.hwcc.used_bytes(), Ordering::Relaxed);
    }

    /// Moves one row out now (a committed delete), waiting out transient pins.
    pub(crate) fn tigon_force_move_out(&mut self, table: TableId, row: RowId) -> TxnResult<()> {
        let at = self
            .clock
            .iter()
            .position(|entry| entry.table == table && entry.row == row)
            .expect("a migrated row is in the clock list");
        let started = std::time::Instant::now();
        while !self.move_out(at, true)? {
            if started.elapsed() > crate::word::LATCH_WAIT_MAX {
                return Err(TxnError::Fatal(PodError::Unsupported("a CAT stayed pinned while being deleted")));
            }
            std::thread::yield_now();
        }
        Ok(())
    }

    /// Moves rows of the shareable tables in until the budget is full (no eviction); returns how many.
    pub(crate) fn pre_migrate(&mut self) -> Result<u64> {
        let mut moved = 0;
        for table in self.workload.shareable_tables() {
            let charge = CAT_NODE_BYTES
                + if self.config.swcc == SwccProtocol::NoSwcc { block_bytes(self.row_bytes(table)) } else { 0 };
            for row in self.partition.table(table).live_row_ids() {
                if !self.hwcc.fits(charge) || self.move_in(table, row, 0)?.is_none() {
                    return Ok(moved);
                }
                moved += 1;
            }
        }
        Ok(moved)
    }

    /// End of run: every CAT back out, so DRAM is the whole truth (checks, next start).
    pub(crate) fn evict_all(&mut self) -> Result<()> {
        let started = std::time::Instant::now();
        while !self.clock.is_empty() {
            if !self.move_out(self.clock.len() - 1, true)? {
                if started.elapsed() > crate::word::LATCH_WAIT_MAX {
                    return Err(PodError::Unsupported("a CAT stayed pinned after every host stopped"));
                }
                std::thread::yield_now();
            }
        }
        Ok(())
    }
}

/// Line size as an index into a block image.
const LINE: usize = LINE_BYTES as usize;

/// A block's bytes: `[TID u64 | length u32 | flags u32 | row …]`.
fn block_image(tid: u64, row: &[u8]) -> Vec<u8> {
    let mut image = Vec::with_capacity(BLOCK_HEADER_BYTES + row.len());
    image.extend_from_slice(&tid.to_le_bytes());
    image.extend_from_slice(&(row.len() as u32).to_le_bytes());
    image.extend_from_slice(&[0u8; 4]);
    image.extend_from_slice(row);
    image
}

/// Runs of block lines (line indexes) a write of `new` over `old` changes: always line 0 (the
/// TID), then every line whose row bytes differ; every line when `old` is unknown.
fn changed_line_runs(old: Option<&[u8]>, new: &[u8]) -> Vec<std::ops::Range<usize>> {
    let lines = (BLOCK_HEADER_BYTES + new.len()).div_ceil(LINE);
    let changed = |line: usize| {
        let row_start = (line * LINE).saturating_sub(BLOCK_HEADER_BYTES);
        let row_end = ((line + 1) * LINE - BLOCK_HEADER_BYTES).min(new.len());
        match old {
            Some(old) if line > 0 && old.len() == new.len() => old[row_start..row_end] != new[row_start..row_end],
            _ => true,
        }
    };
    let mut runs: Vec<std::ops::Range<usize>> = Vec::new();
    for line in (0..lines).filter(|line| changed(*line)) {
        match runs.last_mut() {
            Some(run) if run.end == line => run.end += 1,
            _ => runs.push(line..line + 1),
        }
    }
    runs
}

fn into_pod_error(error: TxnError) -> PodError {
    match error {
        TxnError::Fatal(error) => error,
        TxnError::Abort(_) => PodError::Unsupported("latching cannot abort"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_stores_the_tid_line_and_only_the_lines_it_changes() {
        // Goal: write-back covers exactly the header line and the changed lines, merged into runs.
        // Method: a 320-byte row (6 block lines); change bytes in lines 2, 3 and 5; then no change;
        // then an unknown old value.
        let old = vec![7u8; 320];
        let mut new = old.clone();
        new[2 * LINE - BLOCK_HEADER_BYTES] = 1; // first byte of line 2
        new[4 * LINE - BLOCK_HEADER_BYTES - 1] = 1; // last byte of line 3
        new[319] = 1; // last row byte, in line 5
        assert_eq!(changed_line_runs(Some(&old), &new), vec![0..1, 2..4, 5..6]);
        assert_eq!(changed_line_runs(Some(&old), &old), vec![0..1], "the new TID is always written");
        assert_eq!(changed_line_runs(None, &new), vec![0..6]);
        let image = block_image(9, &new);
        assert_eq!(image.len(), BLOCK_HEADER_BYTES + 320);
        assert_eq!(u64::from_le_bytes(image[..8].try_into().expect("8 bytes")), 9);
    }
}
