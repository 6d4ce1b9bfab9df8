//! Cross-host active tuples (CATs) as one host sees them: latching a metadata word, reading and
//! writing a tuple block through this host's cache under the SWcc protocol, the owner's locks on
//! its own CATs, and the next/prev-key bits. No protocol state is needed here — moving tuples in
//! and out (which owns the CLOCK list) is the Tigon protocol's (crate::tigon).
//!
//! ```text
//!  SWcc block: [ TID u64 | length u32 | flags u32 | row bytes … ]  (line-aligned, whole lines;
//!              a write stores and writes back only the TID line and the lines it changes)
//!  reader, under the latch:  before_read(variant, word, me)  → word', invalidate?
//!  writer, under the latch:  after_write(variant, word, me)  → word', drop own copy?
//! ```
//!
//! Invariants: the owner's DRAM copy is current unless the word's MODIFIED bit says a remote
//! host wrote the block; dirty block lines reach memory before the write lock is visibly
//! released; the coherence decisions are pure functions of the word ([`before_read`],
//! [`after_write`]), so they can be tested without a region.

use std::sync::atomic::Ordering;

use crate::access::LockMode;
use crate::alloc::SwccArena;
use crate::coherence::{lines_spanned, SwccProtocol};
use crate::config::{InjectedFault, Protocol};
use crate::error::Result;
use crate::host::Host;
use crate::partition::{row_flags, RowId, TableId, SUPREMUM_KEY};
use crate::region::{Off, LINE_BYTES};
use crate::staleness::{event_time, read_time, TraceKind, TraceRecord};
use crate::word::{CatNode, Latched, MetaWord};

/// Bytes of a block's header before the row.
pub const BLOCK_HEADER_BYTES: usize = 16;

/// Whole-line size of the SWcc block of a row of `row_bytes`.
pub fn block_bytes(row_bytes: usize) -> u64 {
    SwccArena::block_bytes((BLOCK_HEADER_BYTES + row_bytes) as u64)
}

/// NO_WAIT lock transition `held → want` of a metadata word; `None` on conflict.
pub fn transition(word: MetaWord, held: LockMode, want: LockMode) -> Option<MetaWord> {
    match (held, want) {
        (LockMode::None, LockMode::Read) => word.try_read_lock(),
        (LockMode::None, LockMode::Write) => word.try_write_lock(),
        (LockMode::Read, LockMode::Write) => word.try_upgrade(),
        _ => Some(word),
    }
}

/// The word with `held` released.
pub fn release(word: MetaWord, held: LockMode) -> MetaWord {
    match held {
        LockMode::None => word,
        LockMode::Read => word.release_read(),
        LockMode::Write => word.release_write(),
    }
}

/// What a reader must do before reading a block: the word to store back, and whether its cached
/// copy is stale (invalidate the lines first). NoSWcc runs WriteThrough's bookkeeping on the
/// all-coherent back-end: the host bits are what a hardware directory tracks, and its
/// "invalidate" is the coherence miss that fetches another host's lines (counted, no instruction).
pub fn before_read(variant: SwccProtocol, word: MetaWord, me: usize) -> (MetaWord, bool) {
    use SwccProtocol::*;
    match variant {
        WriteThrough | NoSharedReader | NoSwcc if word.host_valid(me) => (word, false),
        NoSharedReader => (word.with_only_host_valid(me), true),
        WriteThrough | NoSwcc => (word.with_host_valid(me), true),
        NonTemporal => (word, true),
    }
}

/// What a writer must do before releasing its write lock: the word to store back (other hosts'
/// copies marked stale), and whether to drop its own copy (NonTemporal keeps nothing cached).
pub fn after_write(variant: SwccProtocol, word: MetaWord, me: usize) -> (MetaWord, bool) {
    use SwccProtocol::*;
    match variant {
        WriteThrough | NoSharedReader | NoSwcc => (word.with_only_host_valid(me), false),
        NonTemporal => (word, true),
    }
}

impl Host {
    /// Latches another host's CAT word, counting the CAS attempts (cross-host atomics).
    pub(crate) fn latch<'r>(&mut self, node: &'r CatNode, node_off: Off<CatNode>) -> Result<Latched<'r>> {
        let (latched, attempts) = Latched::acquire(&node.word, node_off.raw())?;
        self.counters.hwcc_atomics += u64::from(attempts);
        Ok(latched)
    }

    /// Latches one of this host's own CAT words (its line usually sits in this host's cache).
    pub(crate) fn latch_owned<'r>(&mut self, node: &'r CatNode, node_off: Off<CatNode>) -> Result<Latched<'r>> {
        let (latched, attempts) = Latched::acquire(&node.word, node_off.raw())?;
        self.counters.owner_atomics += u64::from(attempts);
        Ok(latched)
    }

    /// Under the latch, for a reader about to read a CAT block: invalidate unless this host's
    /// copy is known valid (per the SWcc protocol variant).
    pub(crate) fn swcc_before_read(&mut self, word: &mut MetaWord, len: u64) {
        let block = word.block_offset();
        let (next, stale) = before_read(self.config.swcc, *word, self.me);
        if stale {
            self.counters.swcc_misses += 1;
            if self.config.fault != Some(InjectedFault::SkipReaderInvalidate) {
                self.swcc.invalidate_block(self.region, block, len);
            }
        } else {
            self.counters.swcc_hits += 1;
        }
        *word = next;
    }

    /// Under the latch, for a writer about to release its write lock: mark other hosts' copies
    /// stale and fence, so the lines [`Host::write_block`] wrote back reach memory before the
    /// lock is visibly released (NonTemporal also drops its copy).
    pub(crate) fn swcc_after_write(&mut self, word: &mut MetaWord, len: u64) {
        let block = word.block_offset();
        let skip = self.config.fault == Some(InjectedFault::SkipWriterWriteback);
        let (next, drop_copy) = after_write(self.config.swcc, *word, self.me);
        if drop_copy && !skip {
            self.swcc.invalidate_block(self.region, block, len);
        }
        *word = next;
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

    /// Bytes of the block of a row of `table` (header + row).
    pub(crate) fn block_len(&self, table: TableId) -> u64 {
        (BLOCK_HEADER_BYTES + self.row_bytes(table)) as u64
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
    pub(crate) fn store_block(&mut self, block: u64, tid: u64, value: &[u8]) {
        self.swcc.store(self.region, block, &block_image(tid, value));
    }

    /// A committed write of `new` (version `tid`) to a CAT the caller holds write-locked, whose
    /// row in the block is `old` (`None`: unknown, e.g. an insert's placeholder). Stores and
    /// writes back only the lines that change — the header line (new TID) and the lines where
    /// the row differs: writing back an unchanged line carries no data (Tigon `clwb`s the whole
    /// tuple, but a `clwb` of a clean line moves nothing), so neither the cache nor the model
    /// pays for it. The caller's fence before it releases the lock publishes the lines.
    pub(crate) fn write_block(&mut self, node_off: Off<CatNode>, tid: u64, old: Option<&[u8]>, new: &[u8]) {
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

    // ---- the owner's locks on its own CATs ----

    /// The owner's node of a migrated row: the shortcut, or (ablation) a CXL index traversal.
    pub(crate) fn owner_node(&mut self, table: TableId, row: RowId) -> Off<CatNode> {
        let stored = self.partition.table(table).row(row);
        if self.config.shortcut {
            return stored.shortcut;
        }
        let lookup = self.index.lookup(self.region, self.me, table, stored.key);
        self.counters.hwcc_lines_read += u64::from(lookup.steps);
        lookup.node.expect("a migrated row is in its owner's CXL index")
    }

    /// Owner locking its own CAT (NO_WAIT; false on conflict); copies remote modifications back
    /// to DRAM before it reads.
    pub(crate) fn lock_owned_cat(
        &mut self,
        table: TableId,
        row: RowId,
        held: LockMode,
        want: LockMode,
    ) -> Result<bool> {
        let node_off = self.owner_node(table, row);
        let node: &CatNode = self.region.get(node_off);
        let mut latched = self.latch_owned(node, node_off)?;
        let Some(mut word) = transition(latched.value, held, want) else {
            return Ok(false);
        };
        let len = self.block_len(table);
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
        Ok(true)
    }

    /// Brings an owned CAT's DRAM copy up to date (a checkpoint reads it): false while a writer
    /// holds it (its block may be half written), else copies a remote modification back.
    pub(crate) fn refresh_owned_cat(&mut self, table: TableId, row: RowId) -> Result<bool> {
        let node_off = self.partition.table(table).row(row).shortcut;
        let node: &CatNode = self.region.get(node_off);
        let mut latched = self.latch_owned(node, node_off)?;
        let mut word = latched.value;
        if word.writer() {
            return Ok(false);
        }
        if word.flag(MetaWord::MODIFIED) {
            let len = self.block_len(table);
            self.swcc_before_read(&mut word, len);
            latched.value = word;
            let (tid, value) = self.load_block(node_off, table);
            let stored = self.partition.table_mut(table).row_mut(row);
            stored.data.copy_from_slice(&value);
            stored.lock = stored.lock.with_tid(tid);
            latched.value = word.with_flag(MetaWord::MODIFIED, false);
        }
        Ok(true)
    }

    /// Releases the owner's `held` lock on its CAT; `wrote` makes it write back first.
    pub(crate) fn unlock_owned_cat(&mut self, table: TableId, row: RowId, held: LockMode, wrote: bool) -> Result<()> {
        let node_off = self.owner_node(table, row);
        let node: &CatNode = self.region.get(node_off);
        let mut latched = self.latch_owned(node, node_off)?;
        let mut word = latched.value;
        if wrote {
            let len = self.block_len(table);
            self.swcc_after_write(&mut word, len);
        }
        latched.value = release(word, held);
        Ok(())
    }

    // ---- next/prev-key bits (crate::next_key explains them) ----

    /// After `key` moved in: link its bits with CAT neighbours (both sides' bits set).
    pub(crate) fn link_neighbour_bits(&mut self, table: TableId, key: u64) -> Result<()> {
        self.set_neighbour_bits(table, key, true)
    }

    /// After `key` moved out, or a row was inserted at `key` between two rows: the neighbours'
    /// bits pointing at `key`'s slot are no longer true.
    pub(crate) fn unlink_neighbour_bits(&mut self, table: TableId, key: u64) -> Result<()> {
        self.set_neighbour_bits(table, key, false)
    }

    /// Sets (`on`) or clears the bits between `key` and its CAT neighbours. When linking, `key`
    /// itself must be a CAT; its own bits are set only towards neighbours that are CATs.
    fn set_neighbour_bits(&mut self, table: TableId, key: u64, on: bool) -> Result<()> {
        if !self.partition.table(table).spec.ordered {
            return Ok(());
        }
        let prev = self.partition.table(table).prev_key(key).map(|(_, row)| row);
        let next = (key < SUPREMUM_KEY).then(|| self.partition.table(table).next_key(key).1);
        let me = self.partition.table(table).find(key).filter(|_| on).and_then(|row| self.cat_of(table, row));
        for (neighbour, towards_me, mine) in [
            (prev, MetaWord::NEXT_KEY_REAL, MetaWord::PREV_KEY_REAL),
            (next, MetaWord::PREV_KEY_REAL, MetaWord::NEXT_KEY_REAL),
        ] {
            let Some(neighbour) = neighbour.and_then(|row| self.cat_of(table, row)) else { continue };
            self.set_flag(neighbour, towards_me, on)?;
            if let Some(me) = me {
                self.set_flag(me, mine, true)?;
            }
        }
        Ok(())
    }

    /// The CAT of an owned row, if it has one.
    pub(crate) fn cat_of(&self, table: TableId, row: RowId) -> Option<Off<CatNode>> {
        let stored = self.partition.table(table).row(row);
        stored.is(row_flags::MIGRATED).then_some(stored.shortcut)
    }

    pub(crate) fn set_flag(&mut self, node_off: Off<CatNode>, flag: u64, on: bool) -> Result<()> {
        let node: &CatNode = self.region.get(node_off);
        let mut latched = self.latch_owned(node, node_off)?;
        latched.value = latched.value.with_flag(flag, on);
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

    #[test]
    fn coherence_decisions_follow_the_host_bits() {
        // Goal: the SWcc variants decide from the word alone, as Tigon's SCCManager does. Method:
        // a word valid for host 1 only, read and written by hosts 0 and 1 under each variant.
        let word = MetaWord(0).with_only_host_valid(1);
        for variant in [SwccProtocol::WriteThrough, SwccProtocol::NoSwcc] {
            assert_eq!(before_read(variant, word, 1), (word, false), "{variant:?}: a valid copy is read as is");
            let (shared, stale) = before_read(variant, word, 0);
            assert!(stale && shared.host_valid(0) && shared.host_valid(1), "{variant:?}: readers share");
        }
        let (alone, stale) = before_read(SwccProtocol::NoSharedReader, word, 0);
        assert!(stale && alone.host_valid(0) && !alone.host_valid(1), "NoSharedReader keeps one reader");
        assert_eq!(before_read(SwccProtocol::NonTemporal, word, 1), (word, true), "NonTemporal always fetches");
        let both = word.with_host_valid(0);
        let (written, drop_copy) = after_write(SwccProtocol::WriteThrough, both, 0);
        assert!(!drop_copy && written.host_valid(0) && !written.host_valid(1), "a write invalidates others");
        assert_eq!(after_write(SwccProtocol::NonTemporal, both, 0), (both, true));
    }
}
