//! The allocator micro-benchmark (the seed's Figure 1): n objects of one size are allocated,
//! one byte of each touched, then all freed (or the arena reset); nanoseconds per object for
//! the per-query arena (bumpalo, pre-sized, reset), mimalloc and glibc malloc.
//!
//! Two working sets, same objects, touches and free order for every allocator:
//! - streaming: all n objects live at once (16 MiB at 16 B × 2^20): every allocator pays the
//!   DRAM write-allocate of fresh cache lines, which hides the allocator's own cost;
//! - resident: batches of [`RESIDENT_BATCH_BYTES`] allocated, touched and freed (reset) in
//!   turn until n objects were served — per-query scratch, whose memory a reset arena (and a
//!   free list) hands out again while it is still in cache; this is the allocator's own cost.

use std::alloc::{GlobalAlloc, Layout};
use std::time::Instant;

use serde::Serialize;

/// (object size in bytes, objects per round), as in the design brief's allocator table.
pub const SIZES: [(usize, usize); 7] = [
    (16, 1 << 20),
    (64, 1 << 20),
    (256, 1 << 18),
    (4096, 1 << 16),
    (32 << 10, 1 << 14),
    (1 << 20, 256),
    (32 << 20, 16),
];
/// Alignment requested from every allocator.
const ALIGN: usize = 16;
/// Bytes allocated per batch in the resident working set (fits the L2 cache).
pub const RESIDENT_BATCH_BYTES: usize = 256 << 10;

#[derive(Debug, Clone, Serialize)]
pub struct AllocatorResult {
    pub size_bytes: usize,
    pub objects: usize,
    /// Streaming working set (all objects live at once).
    pub arena_ns: f64,
    pub mimalloc_ns: f64,
    pub glibc_ns: f64,
    /// Resident working set (batches of RESIDENT_BATCH_BYTES).
    pub arena_resident_ns: f64,
    pub mimalloc_resident_ns: f64,
    pub glibc_resident_ns: f64,
}

/// Objects per batch for one object size: the whole round (streaming) or a cache-sized batch.
fn batch_objects(size: usize, objects: usize, resident: bool) -> usize {
    if resident {
        (RESIDENT_BATCH_BYTES / size).clamp(1, objects)
    } else {
        objects
    }
}

fn per_object(started: Instant, objects: usize) -> f64 {
    started.elapsed().as_nanos() as f64 / objects as f64
}

/// Serves `objects` allocations in batches of `batch`: each batch allocated and touched, then
/// all freed in allocation order.
fn glibc_round(size: usize, objects: usize, batch: usize, pointers: &mut Vec<*mut u8>) -> f64 {
    let started = Instant::now();
    for _ in 0..objects / batch {
        pointers.clear();
        for _ in 0..batch {
            // SAFETY: plain malloc; the pointer is checked, touched once and freed below.
            let pointer = unsafe { libc::malloc(size) } as *mut u8;
            assert!(!pointer.is_null(), "glibc malloc failed");
            // SAFETY: the allocation has at least one byte.
            unsafe { pointer.write_volatile(1) };
            pointers.push(pointer);
        }
        for &pointer in pointers.iter() {
            // SAFETY: each pointer came from malloc above and is freed once.
            unsafe { libc::free(pointer as *mut libc::c_void) };
        }
    }
    per_object(started, objects / batch * batch)
}

fn mimalloc_round(size: usize, objects: usize, batch: usize, pointers: &mut Vec<*mut u8>) -> f64 {
    let layout = Layout::from_size_align(size, ALIGN).expect("sizes and alignment are valid");
    let allocator = mimalloc::MiMalloc;
    let started = Instant::now();
    for _ in 0..objects / batch {
        pointers.clear();
        for _ in 0..batch {
            // SAFETY: non-zero-sized layout; the pointer is checked, touched and freed below.
            let pointer = unsafe { allocator.alloc(layout) };
            assert!(!pointer.is_null(), "mimalloc failed");
            // SAFETY: the allocation has at least one byte.
            unsafe { pointer.write_volatile(1) };
            pointers.push(pointer);
        }
        for &pointer in pointers.iter() {
            // SAFETY: allocated by the same allocator with the same layout, freed once.
            unsafe { allocator.dealloc(pointer, layout) };
        }
    }
    per_object(started, objects / batch * batch)
}

fn arena_round(arena: &mut bumpalo::Bump, size: usize, objects: usize, batch: usize) -> f64 {
    let layout = Layout::from_size_align(size, ALIGN).expect("sizes and alignment are valid");
    let started = Instant::now();
    for _ in 0..objects / batch {
        for _ in 0..batch {
            let pointer = arena.alloc_layout(layout).as_ptr();
            // SAFETY: the allocation has at least one byte and lives until the reset below.
            unsafe { pointer.write_volatile(1) };
        }
        arena.reset();
    }
    per_object(started, objects / batch * batch)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Median ns per object of (arena, mimalloc, glibc), `rounds` interleaved rounds each.
fn measure(size: usize, objects: usize, rounds: usize, resident: bool) -> (f64, f64, f64) {
    let batch = batch_objects(size, objects, resident);
    // Pre-sized and prefaulted once, as the runtime's arenas are; reset() keeps the chunk.
    let mut arena = crate::runtime::prefaulted_arena(size * batch + (1 << 20));
    let mut pointers = Vec::with_capacity(batch);
    let (mut arena_ns, mut mimalloc_ns, mut glibc_ns) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds.max(1) {
        arena_ns.push(arena_round(&mut arena, size, objects, batch));
        mimalloc_ns.push(mimalloc_round(size, objects, batch, &mut pointers));
        glibc_ns.push(glibc_round(size, objects, batch, &mut pointers));
    }
    (median(arena_ns), median(mimalloc_ns), median(glibc_ns))
}

/// Runs every size in both working sets and keeps the medians.
pub fn run(rounds: usize, sizes: &[(usize, usize)]) -> Vec<AllocatorResult> {
    let mut results = Vec::new();
    for &(size, objects) in sizes {
        let (arena_ns, mimalloc_ns, glibc_ns) = measure(size, objects, rounds, false);
        let (arena_resident_ns, mimalloc_resident_ns, glibc_resident_ns) = measure(size, objects, rounds, true);
        results.push(AllocatorResult {
            size_bytes: size,
            objects,
            arena_ns,
            mimalloc_ns,
            glibc_ns,
            arena_resident_ns,
            mimalloc_resident_ns,
            glibc_resident_ns,
        });
    }
    results
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: the three allocators run in both working sets and report positive times; method:
    // one small round each.
    #[test]
    fn allocator_rounds_run() {
        let results = run(1, &[(16, 1 << 15), (4096, 10)]);
        assert_eq!(results.len(), 2);
        assert!(results.iter().all(|r| r.arena_ns > 0.0 && r.mimalloc_ns > 0.0 && r.glibc_ns > 0.0));
        assert!(results.iter().all(|r| r.arena_resident_ns > 0.0 && r.glibc_resident_ns > 0.0));
    }

    // Goal: resident batches are cache-sized and serve every object; method: batch sizes.
    #[test]
    fn resident_batches_fit_the_cache() {
        assert_eq!(batch_objects(16, 1 << 20, true), RESIDENT_BATCH_BYTES / 16);
        assert_eq!(batch_objects(16, 1 << 20, false), 1 << 20);
        assert_eq!(batch_objects(32 << 20, 16, true), 1, "huge objects go one at a time");
        assert_eq!((1 << 20) % batch_objects(64, 1 << 20, true), 0, "batches divide the default counts");
    }
}
