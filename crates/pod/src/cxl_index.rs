//! The CXL index of each host's shared tuples: a bucketed hash table in the owner's HWcc slice,
//! chained through [`CatNode`]s by offset. Any host reads it (lock-free); only the owner links,
//! unlinks and reuses nodes.
//!
//! ```text
//!  owner h's HWcc slice: [bucket 0][bucket 1]…[bucket B-1] │ CatNode ─next→ CatNode ─next→ 0
//!                          head offsets (AtomicU64)        │ {word, key, next, table, pins}
//! ```
//!
//! A reader's lookup is a hint, validated under the node's latch (key, table, block offset ≠ 0):
//! a node unlinked and reused meanwhile fails validation or sends the reader down another chain,
//! which at worst makes it miss and ask the owner by message. So no cross-host epoch-based
//! reclamation is needed: nodes are never unmapped, a freed node's word is zero, and the owner
//! re-initialises a reused node only while holding its latch.

use std::sync::atomic::Ordering;

use crate::error::Result;
use crate::partition::TableId;
use crate::region::{Layout, Off, Region};
use crate::word::{CatNode, Latched, MetaWord};

/// Longest chain a reader follows before it gives up and asks the owner (a reused node can send
/// it around a cycle).
pub const CHAIN_STEPS_MAX: u32 = 1024;

#[derive(Debug, Clone, Copy)]
pub struct CxlIndex {
    layout: Layout,
    buckets: u64,
}

/// What a freshly linked node describes.
#[derive(Debug, Clone, Copy)]
pub struct NewCat {
    pub table: TableId,
    pub key: u64,
    pub word: MetaWord,
    pub pins: u32,
}

/// Result of a lock-free lookup: the node, if found, and how many HWcc lines were read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lookup {
    pub node: Option<Off<CatNode>>,
    pub steps: u32,
}

impl CxlIndex {
    pub fn new(layout: Layout, buckets: u64) -> CxlIndex {
        assert!(buckets.is_power_of_two());
        CxlIndex { layout, buckets }
    }

    /// HWcc bytes of one host's bucket array.
    pub fn bytes(buckets: u64) -> u64 {
        buckets * 8
    }

    fn bucket(&self, owner: usize, table: TableId, key: u64) -> u64 {
        let mut hash = key ^ (u64::from(table) << 56);
        hash = (hash ^ (hash >> 33)).wrapping_mul(0xff51_afd7_ed55_8ccd);
        hash ^= hash >> 33;
        self.layout.hwcc_slice(owner) + (hash & (self.buckets - 1)) * 8
    }

    /// Finds the node of `(table, key)` in `owner`'s index, without locking.
    pub fn lookup(&self, region: &Region, owner: usize, table: TableId, key: u64) -> Lookup {
        let mut raw = region.atomic_u64(self.bucket(owner, table, key)).load(Ordering::Acquire);
        let mut steps = 1;
        while raw != 0 && steps < CHAIN_STEPS_MAX {
            let node: &CatNode = region.get(Off::new(raw));
            steps += 1;
            if node.key.load(Ordering::Acquire) == key && node.table.load(Ordering::Acquire) == u32::from(table) {
                return Lookup { node: Some(Off::new(raw)), steps };
            }
            raw = node.next.load(Ordering::Acquire);
        }
        Lookup { node: None, steps }
    }

    /// Owner only: initialises `node` (under its latch, since a stale reader may hold it) as the
    /// CAT `(table, key)` with `word` and `pins`, then publishes it at the head of its bucket.
    pub fn link(&self, region: &Region, me: usize, node_off: Off<CatNode>, cat: NewCat) -> Result<()> {
        let NewCat { table, key, word, pins } = cat;
        assert!(word.block_offset() != 0 && word.0 & MetaWord::LATCH == 0);
        let bucket = region.atomic_u64(self.bucket(me, table, key));
        let node = region.get(node_off);
        let (mut latched, _) = Latched::acquire(&node.word, node_off.raw())?;
        node.key.store(key, Ordering::Relaxed);
        node.table.store(u32::from(table), Ordering::Relaxed);
        node.pins.store(pins, Ordering::Relaxed);
        node.next.store(bucket.load(Ordering::Relaxed), Ordering::Relaxed);
        latched.value = word;
        latched.release();
        bucket.store(node_off.raw(), Ordering::Release);
        Ok(())
    }

    /// Owner only: removes `node` from its chain. The node keeps its `next` so readers standing on
    /// it can continue. Returns the HWcc lines it read (bucket and chain up to the node), or
    /// `None` if the node was not linked.
    pub fn unlink(&self, region: &Region, me: usize, node_off: Off<CatNode>, table: TableId, key: u64) -> Option<u32> {
        let bucket = region.atomic_u64(self.bucket(me, table, key));
        let next_of = |raw: u64| region.get::<CatNode>(Off::new(raw)).next.load(Ordering::Relaxed);
        let mut current = bucket.load(Ordering::Relaxed);
        let mut lines = 1;
        if current == node_off.raw() {
            bucket.store(next_of(current), Ordering::Release);
            return Some(lines + 1);
        }
        while current != 0 {
            let next = next_of(current);
            lines += 1;
            if next == node_off.raw() {
                region.get::<CatNode>(Off::new(current)).next.store(next_of(next), Ordering::Release);
                return Some(lines + 1);
            }
            current = next;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::HwccArena;

    #[test]
    fn link_lookup_unlink_and_reuse() {
        // Goal: lookups find linked CATs from another mapping, miss unlinked ones, and a reused node
        // never answers for its old key. Method: 4 buckets (forces chains), 40 keys, unlink half,
        // reuse the freed nodes for new keys.
        let layout = Layout::new(2, 1 << 16, 1 << 16);
        let region = Region::create(layout.total).expect("memfd");
        let reader = region.remap().expect("second mapping");
        let index = CxlIndex::new(layout, 4);
        let mut arena =
            HwccArena::new(layout.hwcc_slice(1), layout.hwcc_per_host, 1 << 16, CxlIndex::bytes(4)).expect("fits");
        let word = MetaWord(0).with_block_offset(layout.swcc);
        let mut nodes = Vec::new();
        for key in 0..40u64 {
            let node = arena.alloc_node().expect("budget");
            index.link(&region, 1, node, NewCat { table: 3, key, word, pins: 0 }).expect("latch");
            nodes.push(node);
        }
        for key in 0..40u64 {
            assert_eq!(index.lookup(&reader, 1, 3, key).node, Some(nodes[key as usize]));
        }
        assert_eq!(index.lookup(&reader, 1, 4, 0).node, None, "table is part of the key");
        for key in (0..40u64).step_by(2) {
            assert!(index.unlink(&region, 1, nodes[key as usize], 3, key).is_some());
            arena.free_node(nodes[key as usize]);
        }
        for key in 100..120u64 {
            let node = arena.alloc_node().expect("reused");
            index.link(&region, 1, node, NewCat { table: 3, key, word, pins: 0 }).expect("latch");
        }
        for key in 0..40u64 {
            let found = index.lookup(&reader, 1, 3, key).node;
            assert_eq!(found.is_some(), key % 2 == 1, "key {key}");
        }
        assert!(index.lookup(&reader, 1, 3, 119).node.is_some());
    }

    #[test]
    fn random_operations_match_a_model() {
        // Goal: the index agrees with a plain map under any mix of links, unlinks and node reuse.
        // Method: 20 seeds × 2000 random operations on 8 buckets (long chains), a reader on a second
        // mapping checking every key of the model after each step batch.
        use crate::rng::SplitMix64;
        use std::collections::HashMap;
        let layout = Layout::new(1, 1 << 16, 1 << 16);
        let region = Region::create(layout.total).expect("memfd");
        let reader = region.remap().expect("second mapping");
        let word = MetaWord(0).with_block_offset(layout.swcc);
        for seed in 0..20 {
            region.reset().expect("zero");
            let index = CxlIndex::new(layout, 8);
            let mut arena =
                HwccArena::new(layout.hwcc_slice(0), layout.hwcc_per_host, 1 << 16, CxlIndex::bytes(8)).expect("fits");
            let mut model: HashMap<(TableId, u64), Off<CatNode>> = HashMap::new();
            let mut rng = SplitMix64::new(seed);
            for step in 0..2000 {
                let (table, key) = (rng.below(3) as TableId, rng.below(64));
                match model.remove(&(table, key)) {
                    Some(node) => {
                        assert!(index.unlink(&region, 0, node, table, key).is_some(), "seed {seed} step {step}");
                        arena.free_node(node);
                    }
                    None => {
                        let node = arena.alloc_node().expect("budget");
                        index.link(&region, 0, node, NewCat { table, key, word, pins: 0 }).expect("latch");
                        model.insert((table, key), node);
                    }
                }
                if step % 100 == 99 {
                    for table in 0..3 {
                        for key in 0..64 {
                            let expected = model.get(&(table, key)).copied();
                            assert_eq!(index.lookup(&reader, 0, table, key).node, expected, "seed {seed} step {step}");
                        }
                    }
                }
            }
        }
    }
}
