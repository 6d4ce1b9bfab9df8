//! Lock words: the 8-byte HWcc metadata word of a shared tuple (CAT), the HWcc node that holds it,
//! and the owner's DRAM lock/TID word. The transitions are pure functions on values
//! (`try_read_lock` …), so NO_WAIT decisions are testable without shared memory; the latch is the
//! only spinning part.
//!
//! ```text
//!  MetaWord  63 latch | 62..47 per-host "my cached copy is valid" (host h = bit 47+h)
//!            46..42 reader count (≤ 31) | 41 writer | 40 modified since moved in
//!            39 next key real | 38 prev key real | 37 second chance | 36..0 SWcc block offset
//!  LocalLock 63 writer | 62..58 reader count (≤ 31) | 57..0 TID (epoch << 32 | counter)
//! ```
//!
//! Invariants: fields other than the latch bit change only while the latch is held (the holder
//! writes the whole word back when it releases); a word with block offset 0 describes no tuple.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::error::{PodError, Result};
use crate::region::Shared;

/// Longest a latch may be held by anyone alive; beyond it the holder is presumed dead.
pub const LATCH_WAIT_MAX: Duration = Duration::from_secs(3);
/// Spins between `sched_yield`s while waiting for a latch (two cores: never spin long).
const LATCH_SPINS_BEFORE_YIELD: u32 = 64;

/// The HWcc metadata word of a CAT, exactly the bit layout of Tigon's `TwoPLPashaMetadataShared`.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
#[repr(transparent)]
pub struct MetaWord(pub u64);

impl MetaWord {
    pub const LATCH: u64 = 1 << 63;
    pub const HOST_VALID_SHIFT: u32 = 47;
    pub const HOST_VALID_MASK: u64 = 0xFFFF << Self::HOST_VALID_SHIFT;
    pub const READERS_SHIFT: u32 = 42;
    pub const READERS_MAX: u64 = 31;
    pub const READERS_MASK: u64 = Self::READERS_MAX << Self::READERS_SHIFT;
    pub const WRITER: u64 = 1 << 41;
    pub const MODIFIED: u64 = 1 << 40;
    pub const NEXT_KEY_REAL: u64 = 1 << 39;
    pub const PREV_KEY_REAL: u64 = 1 << 38;
    pub const SECOND_CHANCE: u64 = 1 << 37;
    pub const OFFSET_MASK: u64 = (1 << 37) - 1;

    pub fn readers(self) -> u64 {
        (self.0 & Self::READERS_MASK) >> Self::READERS_SHIFT
    }
    pub fn writer(self) -> bool {
        self.0 & Self::WRITER != 0
    }
    pub fn is_locked(self) -> bool {
        self.writer() || self.readers() > 0
    }
    fn with_readers(self, readers: u64) -> MetaWord {
        assert!(readers <= Self::READERS_MAX);
        MetaWord((self.0 & !Self::READERS_MASK) | (readers << Self::READERS_SHIFT))
    }
    /// NO_WAIT shared lock: `None` if a writer holds it or the reader count is saturated.
    pub fn try_read_lock(self) -> Option<MetaWord> {
        (!self.writer() && self.readers() < Self::READERS_MAX).then(|| self.with_readers(self.readers() + 1))
    }
    /// NO_WAIT exclusive lock: `None` if anyone holds it.
    pub fn try_write_lock(self) -> Option<MetaWord> {
        (!self.is_locked()).then_some(MetaWord(self.0 | Self::WRITER))
    }
    /// Read lock → write lock, only for the sole reader.
    pub fn try_upgrade(self) -> Option<MetaWord> {
        (!self.writer() && self.readers() == 1).then(|| MetaWord(self.with_readers(0).0 | Self::WRITER))
    }
    pub fn release_read(self) -> MetaWord {
        assert!(self.readers() > 0, "read unlock of an unlocked word {self:?}");
        self.with_readers(self.readers() - 1)
    }
    pub fn release_write(self) -> MetaWord {
        assert!(self.writer(), "write unlock of a word without writer {self:?}");
        MetaWord(self.0 & !Self::WRITER)
    }
    /// Copies the lock state (readers, writer) of a DRAM lock word (move-in).
    pub fn with_lock_of(self, local: LocalLock) -> MetaWord {
        let word = self.with_readers(local.readers());
        MetaWord(if local.writer() { word.0 | Self::WRITER } else { word.0 & !Self::WRITER })
    }

    pub fn host_valid(self, host: usize) -> bool {
        self.0 & Self::host_bit(host) != 0
    }
    pub fn with_host_valid(self, host: usize) -> MetaWord {
        MetaWord(self.0 | Self::host_bit(host))
    }
    /// Clears every host's valid bit except `host`'s, and sets `host`'s.
    pub fn with_only_host_valid(self, host: usize) -> MetaWord {
        MetaWord((self.0 & !Self::HOST_VALID_MASK) | Self::host_bit(host))
    }
    pub fn without_host_bits(self) -> MetaWord {
        MetaWord(self.0 & !Self::HOST_VALID_MASK)
    }
    fn host_bit(host: usize) -> u64 {
        assert!(host < 16);
        1 << (Self::HOST_VALID_SHIFT + host as u32)
    }

    pub fn block_offset(self) -> u64 {
        self.0 & Self::OFFSET_MASK
    }
    pub fn with_block_offset(self, offset: u64) -> MetaWord {
        assert!(offset <= Self::OFFSET_MASK, "block offset {offset:#x} exceeds 37 bits");
        MetaWord((self.0 & !Self::OFFSET_MASK) | offset)
    }
    pub fn flag(self, bit: u64) -> bool {
        self.0 & bit != 0
    }
    pub fn with_flag(self, bit: u64, on: bool) -> MetaWord {
        MetaWord(if on { self.0 | bit } else { self.0 & !bit })
    }
}

const _: () = {
    let fields = [
        MetaWord::LATCH,
        MetaWord::HOST_VALID_MASK,
        MetaWord::READERS_MASK,
        MetaWord::WRITER,
        MetaWord::MODIFIED,
        MetaWord::NEXT_KEY_REAL,
        MetaWord::PREV_KEY_REAL,
        MetaWord::SECOND_CHANCE,
        MetaWord::OFFSET_MASK,
    ];
    let mut union = 0u64;
    let mut i = 0;
    while i < fields.len() {
        assert!(union & fields[i] == 0, "metadata word fields overlap");
        union |= fields[i];
        i += 1;
    }
    assert!(union == u64::MAX, "metadata word fields leave bits unused");
    assert!(std::mem::size_of::<MetaWord>() == 8);
};

/// The owner's DRAM lock word of a row that is not (or not only) shared.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
#[repr(transparent)]
pub struct LocalLock(pub u64);

impl LocalLock {
    pub const WRITER: u64 = 1 << 63;
    pub const READERS_SHIFT: u32 = 58;
    pub const READERS_MAX: u64 = 31;
    pub const READERS_MASK: u64 = Self::READERS_MAX << Self::READERS_SHIFT;
    pub const TID_MASK: u64 = (1 << 58) - 1;

    pub fn unlocked(tid: u64) -> LocalLock {
        assert!(tid <= Self::TID_MASK, "TID {tid:#x} exceeds 58 bits");
        LocalLock(tid)
    }
    pub fn tid(self) -> u64 {
        self.0 & Self::TID_MASK
    }
    pub fn with_tid(self, tid: u64) -> LocalLock {
        assert!(tid <= Self::TID_MASK, "TID {tid:#x} exceeds 58 bits");
        LocalLock((self.0 & !Self::TID_MASK) | tid)
    }
    pub fn readers(self) -> u64 {
        (self.0 & Self::READERS_MASK) >> Self::READERS_SHIFT
    }
    pub fn writer(self) -> bool {
        self.0 & Self::WRITER != 0
    }
    pub fn is_locked(self) -> bool {
        self.writer() || self.readers() > 0
    }
    fn with_readers(self, readers: u64) -> LocalLock {
        assert!(readers <= Self::READERS_MAX);
        LocalLock((self.0 & !Self::READERS_MASK) | (readers << Self::READERS_SHIFT))
    }
    pub fn try_read_lock(self) -> Option<LocalLock> {
        (!self.writer() && self.readers() < Self::READERS_MAX).then(|| self.with_readers(self.readers() + 1))
    }
    pub fn try_write_lock(self) -> Option<LocalLock> {
        (!self.is_locked()).then_some(LocalLock(self.0 | Self::WRITER))
    }
    pub fn try_upgrade(self) -> Option<LocalLock> {
        (!self.writer() && self.readers() == 1).then(|| LocalLock(self.with_readers(0).0 | Self::WRITER))
    }
    pub fn release_read(self) -> LocalLock {
        assert!(self.readers() > 0, "read unlock of an unlocked row");
        self.with_readers(self.readers() - 1)
    }
    pub fn release_write(self) -> LocalLock {
        assert!(self.writer(), "write unlock of a row without writer");
        LocalLock(self.0 & !Self::WRITER)
    }
    /// Takes the lock state of a metadata word back (move-out).
    pub fn with_lock_of(self, word: MetaWord) -> LocalLock {
        let lock = self.with_readers(word.readers());
        LocalLock(if word.writer() { lock.0 | Self::WRITER } else { lock.0 & !Self::WRITER })
    }
}

/// The HWcc footprint of one CAT: its metadata word plus the CXL index entry that finds it.
/// Nodes are chained per index bucket; only the owner links, unlinks and reuses them.
#[repr(C)]
pub struct CatNode {
    /// The [`MetaWord`].
    pub word: AtomicU64,
    pub key: AtomicU64,
    /// Next node in the bucket chain (an offset; 0 ends the chain).
    pub next: AtomicU64,
    pub table: AtomicU32,
    /// Remote transactions referencing the tuple (Tigon's `ref_cnt`); move-out skips pinned nodes.
    /// Changed only under the latch.
    pub pins: AtomicU32,
}
pub const CAT_NODE_BYTES: u64 = 32;
const _: () = assert!(std::mem::size_of::<CatNode>() as u64 == CAT_NODE_BYTES);
const _: () = assert!(std::mem::align_of::<CatNode>() == 8);
// SAFETY: only atomics.
unsafe impl Shared for CatNode {}

impl CatNode {
    /// Adds a pin (Tigon's `ref_cnt`, changed under the latch like Tigon's). The latch CAS has
    /// already taken the node's line exclusively (nodes are 32 B on line-aligned slots, so word
    /// and pins share a line), hence a plain load and store — no second atomic, no second
    /// cross-host round trip. `latch` must be this node's latch.
    pub fn pin(&self, latch: &Latched<'_>) {
        assert!(latch.guards(&self.word), "pinned under another node's latch");
        self.pins.store(self.pins.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }

    /// Drops a pin, under this node's latch (see [`CatNode::pin`]).
    pub fn unpin(&self, latch: &Latched<'_>) {
        assert!(latch.guards(&self.word), "unpinned under another node's latch");
        let pins = self.pins.load(Ordering::Relaxed);
        assert!(pins > 0, "unpin of an unpinned node");
        self.pins.store(pins - 1, Ordering::Relaxed);
    }
}

/// A held latch on a metadata word. Change `value` (never its latch bit) and drop or
/// [`Latched::release`] to publish it with the latch cleared.
pub struct Latched<'a> {
    word: &'a AtomicU64,
    pub value: MetaWord,
}

impl<'a> Latched<'a> {
    /// Spins (yielding every few spins) until the latch is ours. `offset` names the word in the
    /// error if the holder never lets go. Also returns how many compare-and-swaps it executed —
    /// the atomics the latency model prices. Waiting reads of a held latch are not atomics: how
    /// many there are depends on how the two cores are time-sliced, not on the protocol.
    pub fn acquire(word: &'a AtomicU64, offset: u64) -> Result<(Latched<'a>, u32)> {
        let mut swaps = 0u32;
        let mut spins = 0u32;
        let mut started: Option<Instant> = None;
        loop {
            let current = word.load(Ordering::Relaxed);
            if current & MetaWord::LATCH == 0 {
                swaps = swaps.saturating_add(1);
                let latched = current | MetaWord::LATCH;
                if word.compare_exchange_weak(current, latched, Ordering::Acquire, Ordering::Relaxed).is_ok() {
                    return Ok((Latched { word, value: MetaWord(current) }, swaps));
                }
            }
            Self::back_off(&mut spins, &mut started, offset)?;
        }
    }

    fn back_off(spins: &mut u32, started: &mut Option<Instant>, offset: u64) -> Result<()> {
        *spins = spins.saturating_add(1);
        if !spins.is_multiple_of(LATCH_SPINS_BEFORE_YIELD) {
            std::hint::spin_loop();
            return Ok(());
        }
        std::thread::yield_now();
        let since = *started.get_or_insert_with(Instant::now);
        if since.elapsed() > LATCH_WAIT_MAX {
            return Err(PodError::LatchTimeout { offset, waited_ms: LATCH_WAIT_MAX.as_millis() as u64 });
        }
        Ok(())
    }

    /// True if this latch is held on `word` (the pin helpers check they were given the right one).
    fn guards(&self, word: &AtomicU64) -> bool {
        std::ptr::eq(self.word, word)
    }

    pub fn release(self) {
        drop(self)
    }
}

impl Drop for Latched<'_> {
    fn drop(&mut self) {
        debug_assert!(self.word.load(Ordering::Relaxed) & MetaWord::LATCH != 0);
        self.word.store(self.value.0 & !MetaWord::LATCH, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_wait_transitions_of_the_metadata_word() {
        // Goal: shared/exclusive NO_WAIT rules. Method: walk a word through locks and refusals.
        let free = MetaWord(0).with_block_offset(0x1000);
        let one_reader = free.try_read_lock().expect("free word takes a reader");
        assert_eq!(one_reader.readers(), 1);
        assert!(one_reader.try_write_lock().is_none(), "writer must not join a reader");
        let writer = one_reader.try_upgrade().expect("sole reader upgrades");
        assert!(writer.writer() && writer.readers() == 0);
        assert!(writer.try_read_lock().is_none() && writer.try_write_lock().is_none());
        assert_eq!(writer.release_write(), free);
        let mut many = free;
        for _ in 0..MetaWord::READERS_MAX {
            many = many.try_read_lock().expect("below the reader limit");
        }
        assert!(many.try_read_lock().is_none(), "31 readers saturate the count");
        assert!(many.try_upgrade().is_none());
        assert_eq!(many.block_offset(), 0x1000, "locking never touches the offset");
    }

    #[test]
    fn host_bits_and_flags_are_independent() {
        // Goal: each field of the word is separately addressable. Method: set fields, read them back.
        let word = MetaWord(0).with_block_offset(MetaWord::OFFSET_MASK).with_host_valid(0).with_host_valid(7);
        assert!(word.host_valid(0) && word.host_valid(7) && !word.host_valid(3));
        let only = word.with_only_host_valid(3);
        assert!(only.host_valid(3) && !only.host_valid(0) && !only.host_valid(7));
        let flagged = only.with_flag(MetaWord::MODIFIED, true).with_flag(MetaWord::SECOND_CHANCE, true);
        assert!(flagged.flag(MetaWord::MODIFIED) && !flagged.flag(MetaWord::NEXT_KEY_REAL));
        assert_eq!(flagged.block_offset(), MetaWord::OFFSET_MASK);
        assert_eq!(flagged.readers(), 0);
        assert!(!flagged.writer());
    }

    #[test]
    fn lock_state_moves_between_tiers() {
        // Goal: move-in/out carries lock state exactly. Method: DRAM → word → DRAM round trip.
        let local = LocalLock::unlocked(42).try_read_lock().and_then(LocalLock::try_read_lock).expect("readers");
        let word = MetaWord(0).with_lock_of(local);
        assert_eq!(word.readers(), 2);
        let back = LocalLock::unlocked(42).with_lock_of(word);
        assert_eq!(back, local);
        assert_eq!(back.tid(), 42);
        let writer = LocalLock::unlocked(7).try_write_lock().expect("free");
        assert!(MetaWord(0).with_lock_of(writer).writer());
    }

    #[test]
    fn latch_counts_compare_and_swaps_not_waiting_spins() {
        // Goal: the model is charged for the atomics a latch executes, not for how long the
        // waiter spun (that depends on time-slicing). Method: hold the latch for 20 ms while
        // another thread acquires it; it spins thousands of times but swaps once the latch is free.
        let word = AtomicU64::new(0);
        let node = CatNode {
            word: AtomicU64::new(0),
            key: AtomicU64::new(0),
            next: AtomicU64::new(0),
            table: AtomicU32::new(0),
            pins: AtomicU32::new(0),
        };
        let (held, swaps) = Latched::acquire(&word, 0).expect("free latch");
        assert_eq!(swaps, 1);
        std::thread::scope(|scope| {
            let waiter = scope.spawn(|| Latched::acquire(&word, 0).expect("released in time").1);
            std::thread::sleep(Duration::from_millis(20));
            drop(held);
            let swaps = waiter.join().expect("waiter");
            assert!((1..=2).contains(&swaps), "{swaps} swaps counted for one contended acquisition");
        });
        let (latched, _) = Latched::acquire(&node.word, 0).expect("free latch");
        node.pin(&latched);
        node.pin(&latched);
        node.unpin(&latched);
        assert_eq!(node.pins.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn latch_excludes_and_publishes_the_new_value() {
        // Goal: the latch is exclusive and the holder's value is published on release. Method: two
        // threads increment the reader count 1000 times each under the latch.
        let word = AtomicU64::new(0);
        std::thread::scope(|scope| {
            for _ in 0..2 {
                scope.spawn(|| {
                    for _ in 0..1000 {
                        let (mut latched, _) = Latched::acquire(&word, 0).expect("latch");
                        let readers = latched.value.readers();
                        latched.value = latched.value.with_readers((readers + 1) % 31);
                    }
                });
            }
        });
        assert_eq!(MetaWord(word.load(Ordering::Relaxed)).readers(), 2000 % 31);
        assert_eq!(word.load(Ordering::Relaxed) & MetaWord::LATCH, 0);
    }
}
