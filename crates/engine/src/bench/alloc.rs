//! The allocator micro-benchmark (the seed's Figure 1): n objects of one size are allocated,
//! one byte of each touched, then all freed; nanoseconds per object for the per-query arena
//! (`crate::arena`: the one the runtime's workers use, one frame per batch), mimalloc and glibc
//! malloc (`libc::malloc`/`free` directly).
//!
//! Every allocator gets the same objects, the same touch (one volatile byte store per object),
//! the same free order (allocation order; the arena frees a batch by ending its frame) and the
//! same opaque size (`black_box`, so no call is specialized on a constant). Three working sets:
//! - streaming: all n objects live at once (16 MiB at 16 B × 2^20): the touches write fresh
//!   cache lines that miss every cache, so DRAM write-allocation dominates every allocator;
//! - L2-resident: batches of 256 KiB allocated, touched and freed in turn: the memory is handed
//!   out again while it is in L2; an object ≥ 64 B still fills one line from L2 on its touch;
//! - L1-resident: batches of 32 KiB, about one morsel's scratch in the compiled tier (mask,
//!   selection, group ids, gathered factors: 33 KiB), which is what a worker's arena serves.

use std::alloc::{GlobalAlloc, Layout};
use std::hint::black_box;
use std::time::Instant;

use serde::Serialize;

use crate::arena::{Arena, GRAIN_BYTES};
use crate::error::Result;

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

/// How many bytes are live at once.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct WorkingSet {
    pub name: &'static str,
    /// Bytes allocated per batch before all are freed; None = the whole round at once.
    pub batch_bytes: Option<usize>,
}

/// The working sets, from DRAM-bound to cache-resident.
pub const WORKING_SETS: [WorkingSet; 3] = [
    WorkingSet { name: "streaming", batch_bytes: None },
    WorkingSet { name: "L2-resident", batch_bytes: Some(256 << 10) },
    WorkingSet { name: "L1-resident", batch_bytes: Some(32 << 10) },
];

/// Median ns per object of each allocator in one working set.
#[derive(Debug, Clone, Serialize)]
pub struct WorkingSetResult {
    pub working_set: WorkingSet,
    pub batch_objects: usize,
    pub arena_ns: f64,
    pub mimalloc_ns: f64,
    pub glibc_ns: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct AllocatorResult {
    pub size_bytes: usize,
    pub objects: usize,
    /// One entry per [`WORKING_SETS`] element, in that order.
    pub working_sets: Vec<WorkingSetResult>,
}

/// Objects per batch for one object size: the whole round or a batch of `batch_bytes`.
fn batch_objects(size: usize, objects: usize, batch_bytes: Option<usize>) -> usize {
    match batch_bytes {
        Some(bytes) => (bytes / size).clamp(1, objects),
        None => objects,
    }
}

fn per_object(started: Instant, objects: usize) -> f64 {
    started.elapsed().as_nanos() as f64 / objects as f64
}

/// Serves `objects` allocations in batches of `batch`: each batch allocated and touched, then
/// all freed in allocation order.
fn glibc_round(size: usize, objects: usize, batch: usize, pointers: &mut Vec<*mut u8>) -> f64 {
    let size = black_box(size);
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

fn mimalloc_round(layout: Layout, objects: usize, batch: usize, pointers: &mut Vec<*mut u8>) -> f64 {
    let layout = black_box(layout);
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

fn arena_round(arena: &mut Arena, layout: Layout, objects: usize, batch: usize) -> f64 {
    let layout = black_box(layout);
    let started = Instant::now();
    for _ in 0..objects / batch {
        // Ending the frame frees the whole batch, as a morsel's scratch is freed.
        let mut frame = arena.frame();
        for _ in 0..batch {
            let pointer = frame.alloc_layout(layout).expect("the arena was sized for one batch").as_ptr();
            // SAFETY: the allocation has at least one byte and lives until the frame ends.
            unsafe { pointer.write_volatile(1) };
        }
    }
    per_object(started, objects / batch * batch)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Medians of `rounds` interleaved rounds of the three allocators in one working set.
fn measure(size: usize, objects: usize, rounds: usize, working_set: WorkingSet) -> Result<WorkingSetResult> {
    let layout = Layout::from_size_align(size, ALIGN).expect("sizes and alignment are valid");
    let batch = batch_objects(size, objects, working_set.batch_bytes);
    // Sized for one batch and prefaulted once, as the runtime's worker arenas are.
    let mut arena = Arena::new(batch * size.next_multiple_of(GRAIN_BYTES))?;
    let mut pointers = Vec::with_capacity(batch);
    let (mut arena_ns, mut mimalloc_ns, mut glibc_ns) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds.max(1) {
        arena_ns.push(arena_round(&mut arena, layout, objects, batch));
        mimalloc_ns.push(mimalloc_round(layout, objects, batch, &mut pointers));
        glibc_ns.push(glibc_round(size, objects, batch, &mut pointers));
    }
    Ok(WorkingSetResult {
        working_set,
        batch_objects: batch,
        arena_ns: median(arena_ns),
        mimalloc_ns: median(mimalloc_ns),
        glibc_ns: median(glibc_ns),
    })
}

/// Runs every size in every working set and keeps the medians.
pub fn run(rounds: usize, sizes: &[(usize, usize)]) -> Result<Vec<AllocatorResult>> {
    let mut results = Vec::new();
    for &(size, objects) in sizes {
        let working_sets =
            WORKING_SETS.iter().map(|&set| measure(size, objects, rounds, set)).collect::<Result<Vec<_>>>()?;
        results.push(AllocatorResult { size_bytes: size, objects, working_sets });
    }
    Ok(results)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: the three allocators run in every working set and report positive times; method:
    // one small round each.
    #[test]
    fn allocator_rounds_run() {
        let results = run(1, &[(16, 1 << 15), (4096, 10)]).expect("arenas map");
        assert_eq!(results.len(), 2);
        for result in &results {
            assert_eq!(result.working_sets.len(), WORKING_SETS.len());
            assert!(result.working_sets.iter().all(|w| w.arena_ns > 0.0 && w.mimalloc_ns > 0.0 && w.glibc_ns > 0.0));
        }
    }

    // Goal: batches have the working set's size and serve every object; method: batch sizes.
    #[test]
    fn batches_match_the_working_sets() {
        assert_eq!(batch_objects(16, 1 << 20, Some(256 << 10)), (256 << 10) / 16);
        assert_eq!(batch_objects(16, 1 << 20, None), 1 << 20);
        assert_eq!(batch_objects(32 << 20, 16, Some(32 << 10)), 1, "huge objects go one at a time");
        for set in WORKING_SETS {
            for (size, objects) in SIZES {
                assert_eq!(objects % batch_objects(size, objects, set.batch_bytes), 0, "batches divide the counts");
            }
        }
    }

    // Goal: the benchmark's arena path never falls back or fails for a full batch, so it times
    // the bump alone; method: a frame serves exactly one batch of every size, then is full.
    #[test]
    fn one_batch_fills_the_arena_exactly() {
        for (size, objects) in SIZES.into_iter().take(4) {
            let batch = batch_objects(size, objects, Some(32 << 10));
            let mut arena = Arena::new(batch * size.next_multiple_of(GRAIN_BYTES)).expect("maps");
            let layout = Layout::from_size_align(size, ALIGN).expect("valid");
            let mut frame = arena.frame();
            assert!((0..batch).all(|_| frame.alloc_layout(layout).is_some()));
            assert!(frame.alloc_layout(layout).is_none(), "{size} B: exactly one batch fits");
        }
    }
}
