//! Per-host allocators for the two arenas. Only a partition's owner allocates and frees CXL
//! memory for it (move-in, move-out), so each host manages its own slice with DRAM-side free
//! lists and no cross-host synchronisation.
//!
//! ```text
//!  HWcc slice of host h: [ index buckets (fixed) | CatNode | CatNode | … bump → ]   hard budget
//!  SWcc slice of host h: [ block | block | … bump → ]   line-aligned, whole lines, size-class free lists
//! ```
//!
//! Invariants: HWcc bytes in use (index + nodes + charged data) never exceed the budget — an
//! allocation that would is refused, and the caller evicts or aborts (FAIL_OOM); every SWcc block
//! is line-aligned and a whole number of lines.

use std::collections::HashMap;

use crate::error::{PodError, Result};
use crate::region::{round_up, Off, LINE_BYTES};
use crate::word::{CatNode, CAT_NODE_BYTES};

/// The HWcc slice of one host: the fixed CXL index, then CAT nodes, under a hard byte budget.
#[derive(Debug)]
pub struct HwccArena {
    nodes_start: u64,
    end: u64,
    bump: u64,
    free_nodes: Vec<u64>,
    budget_bytes: u64,
    index_bytes: u64,
    node_bytes: u64,
    charged_data_bytes: u64,
    peak_bytes: u64,
}

impl HwccArena {
    /// `slice_start..slice_start + slice_bytes` is this host's HWcc slice; its first
    /// `index_bytes` hold the index buckets.
    pub fn new(slice_start: u64, slice_bytes: u64, budget_bytes: u64, index_bytes: u64) -> Result<HwccArena> {
        if index_bytes + CAT_NODE_BYTES > budget_bytes {
            return Err(PodError::BudgetTooSmall { budget_bytes, index_bytes });
        }
        let nodes_start = round_up(slice_start + index_bytes, LINE_BYTES);
        Ok(HwccArena {
            nodes_start,
            end: slice_start + slice_bytes,
            bump: nodes_start,
            free_nodes: Vec::new(),
            budget_bytes,
            index_bytes,
            node_bytes: 0,
            charged_data_bytes: 0,
            peak_bytes: index_bytes,
        })
    }

    pub fn used_bytes(&self) -> u64 {
        self.index_bytes + self.node_bytes + self.charged_data_bytes
    }
    pub fn peak_bytes(&self) -> u64 {
        self.peak_bytes
    }
    pub fn budget_bytes(&self) -> u64 {
        self.budget_bytes
    }
    /// Whether `extra` more bytes stay within the budget.
    pub fn fits(&self, extra: u64) -> bool {
        self.used_bytes() + extra <= self.budget_bytes
    }

    /// A node (possibly reused, possibly still latched by a reader that found it stale), or `None`
    /// when the budget or the slice is exhausted.
    pub fn alloc_node(&mut self) -> Option<Off<CatNode>> {
        if !self.fits(CAT_NODE_BYTES) {
            return None;
        }
        let raw = match self.free_nodes.pop() {
            Some(raw) => raw,
            None if self.bump + CAT_NODE_BYTES <= self.end => {
                self.bump += CAT_NODE_BYTES;
                self.bump - CAT_NODE_BYTES
            }
            None => return None,
        };
        self.node_bytes += CAT_NODE_BYTES;
        self.note_peak();
        Some(Off::new(raw))
    }

    pub fn free_node(&mut self, node: Off<CatNode>) {
        assert!(node.raw() >= self.nodes_start && node.raw() < self.bump, "foreign node {node:?}");
        assert!(self.node_bytes >= CAT_NODE_BYTES);
        self.node_bytes -= CAT_NODE_BYTES;
        self.free_nodes.push(node.raw());
    }

    /// Counts tuple data against the budget (NoSWcc: all CXL memory is HWcc). False if it does not fit.
    pub fn charge_data(&mut self, bytes: u64) -> bool {
        if !self.fits(bytes) {
            return false;
        }
        self.charged_data_bytes += bytes;
        self.note_peak();
        true
    }

    pub fn refund_data(&mut self, bytes: u64) {
        assert!(self.charged_data_bytes >= bytes);
        self.charged_data_bytes -= bytes;
    }

    fn note_peak(&mut self) {
        self.peak_bytes = self.peak_bytes.max(self.used_bytes());
    }
}

/// The SWcc slice of one host: tuple blocks in line-sized classes.
#[derive(Debug)]
pub struct SwccArena {
    end: u64,
    bump: u64,
    free: HashMap<u64, Vec<u64>>,
    in_use_bytes: u64,
    peak_bytes: u64,
}

impl SwccArena {
    pub fn new(slice_start: u64, slice_bytes: u64) -> SwccArena {
        assert_eq!(slice_start % LINE_BYTES, 0);
        SwccArena {
            end: slice_start + slice_bytes,
            bump: slice_start,
            free: HashMap::new(),
            in_use_bytes: 0,
            peak_bytes: 0,
        }
    }

    /// Whole lines for `bytes`.
    pub fn block_bytes(bytes: u64) -> u64 {
        round_up(bytes.max(1), LINE_BYTES)
    }

    /// A line-aligned block of at least `bytes`, or `None` when the slice is full.
    pub fn alloc(&mut self, bytes: u64) -> Option<u64> {
        let size = Self::block_bytes(bytes);
        let raw = match self.free.get_mut(&size).and_then(Vec::pop) {
            Some(raw) => raw,
            None if self.bump + size <= self.end => {
                self.bump += size;
                self.bump - size
            }
            None => return None,
        };
        self.in_use_bytes += size;
        self.peak_bytes = self.peak_bytes.max(self.in_use_bytes);
        debug_assert_eq!(raw % LINE_BYTES, 0);
        Some(raw)
    }

    pub fn free(&mut self, raw: u64, bytes: u64) {
        let size = Self::block_bytes(bytes);
        assert!(raw + size <= self.bump, "foreign block {raw:#x}");
        self.in_use_bytes -= size;
        self.free.entry(size).or_default().push(raw);
    }

    pub fn in_use_bytes(&self) -> u64 {
        self.in_use_bytes
    }
    pub fn peak_bytes(&self) -> u64 {
        self.peak_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hwcc_budget_is_a_hard_cap() {
        // Goal: no allocation ever exceeds the budget. Method: allocate until refused, check the
        // count, free one and allocate again.
        let mut arena = HwccArena::new(4096, 1 << 20, 1024 + 10 * CAT_NODE_BYTES, 1024).expect("fits");
        let nodes: Vec<_> = std::iter::from_fn(|| arena.alloc_node()).collect();
        assert_eq!(nodes.len(), 10);
        assert_eq!(arena.used_bytes(), arena.budget_bytes());
        assert!(!arena.charge_data(1));
        arena.free_node(nodes[3]);
        assert_eq!(arena.alloc_node(), Some(nodes[3]), "freed node is reused");
        assert!(arena.alloc_node().is_none());
        assert_eq!(arena.peak_bytes(), arena.budget_bytes());
    }

    #[test]
    fn budget_smaller_than_the_index_is_refused() {
        // Goal: a configuration that cannot hold its own index fails clearly. Method: tiny budget.
        assert!(matches!(HwccArena::new(0, 1 << 20, 100, 4096), Err(PodError::BudgetTooSmall { .. })));
    }

    #[test]
    fn swcc_blocks_are_whole_lines_and_reused_by_size() {
        // Goal: blocks never share a cache line. Method: allocate odd sizes, check alignment and reuse.
        let mut arena = SwccArena::new(1 << 16, 4096);
        let a = arena.alloc(1).expect("room");
        let b = arena.alloc(1040).expect("room");
        assert_eq!(a % 64, 0);
        assert_eq!(b, a + 64);
        assert_eq!(arena.in_use_bytes(), 64 + 1088);
        arena.free(b, 1040);
        assert_eq!(arena.alloc(1088), Some(b));
        assert!(arena.alloc(4096).is_none(), "slice exhausted");
    }
}
