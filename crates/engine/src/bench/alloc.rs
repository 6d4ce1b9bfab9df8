//! The allocator micro-benchmark (the seed's Figure 1): n objects of one size are allocated,
//! one byte of each touched, then all freed; nanoseconds per object for the per-query arena
//! (`crate::arena`: the one the runtime's workers use, one frame per batch), mimalloc and glibc
//! malloc (`libc::malloc`/`free` directly), next to the **touch floor**: the arena's address
//! pattern written with no allocator at all.
//!
//! ```text
//!   per round:  floor floor floor ─► arena arena ─► mimalloc mimalloc ─► glibc glibc
//!               (untimed) (timed twice)  (untimed, timed) …              medians over rounds
//!   floor = the arena's own addresses (its mapping), the same one-byte volatile store
//!   allocator cost above the floor = (glibc − floor) ÷ (arena − floor), unless arena − floor
//!   lies inside the noise band (2 × the gap between the two timed floors, at least 5 %)
//! ```
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
//!
//! Invariant: the floor writes exactly the bytes the arena hands out for the same batch (the
//! first byte of every `size` rounded up to [`GRAIN_BYTES`]), in the same order.

use std::alloc::{GlobalAlloc, Layout};
use std::borrow::Cow;
use std::hint::black_box;
use std::time::Instant;

use serde::{Deserialize, Serialize};

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
/// Smallest difference between the arena and the floor that counts as a cost, as a fraction of
/// the floor: the two are different loops, and code placement alone moves a loop's time by a
/// few percent however many rounds are taken.
const FLOOR_RESOLUTION_FRACTION: f64 = 0.05;
/// The noise band is this many times the median gap between two back-to-back floor timings.
const FLOOR_NOISE_MULTIPLE: f64 = 2.0;

/// How many bytes are live at once.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkingSet {
    pub name: Cow<'static, str>,
    /// Bytes allocated per batch before all are freed; None = the whole round at once.
    pub batch_bytes: Option<usize>,
}

/// The working sets, from DRAM-bound to cache-resident.
pub const WORKING_SETS: [WorkingSet; 3] = [
    WorkingSet { name: Cow::Borrowed("streaming"), batch_bytes: None },
    WorkingSet { name: Cow::Borrowed("L2-resident"), batch_bytes: Some(256 << 10) },
    WorkingSet { name: Cow::Borrowed("L1-resident"), batch_bytes: Some(32 << 10) },
];

/// Median ns per object of the floor and each allocator in one working set.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkingSetResult {
    pub working_set: WorkingSet,
    pub batch_objects: usize,
    /// The touches alone: the arena's addresses written from a pre-faulted block, no allocator.
    #[serde(default)]
    pub floor_ns: f64,
    /// Median gap between the two back-to-back floor timings of a round (one loop timed twice).
    #[serde(default)]
    pub floor_noise_ns: f64,
    pub arena_ns: f64,
    pub mimalloc_ns: f64,
    pub glibc_ns: f64,
    /// arena − floor: what the arena adds to the touches.
    #[serde(default)]
    pub arena_above_floor_ns: f64,
    /// (glibc − floor) ÷ (arena − floor); None when the arena is within noise of the floor.
    #[serde(default)]
    pub glibc_above_floor_ratio: Option<f64>,
}

impl WorkingSetResult {
    /// Differences from the floor up to this are indistinguishable from zero.
    pub fn floor_band_ns(&self) -> f64 {
        (FLOOR_NOISE_MULTIPLE * self.floor_noise_ns).max(FLOOR_RESOLUTION_FRACTION * self.floor_ns)
    }

    /// Whether the arena's time is the floor's, within noise (or below it).
    pub fn arena_within_noise_of_floor(&self) -> bool {
        self.arena_above_floor_ns <= self.floor_band_ns()
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AllocatorResult {
    pub size_bytes: usize,
    pub objects: usize,
    /// Interleaved rounds the medians are taken over.
    #[serde(default)]
    pub rounds: usize,
    /// One entry per [`WORKING_SETS`] element, in that order.
    pub working_sets: Vec<WorkingSetResult>,
}

/// Objects per batch for one object size: the whole round or a batch of `batch_bytes`.
pub fn batch_objects(size: usize, objects: usize, batch_bytes: Option<usize>) -> usize {
    match batch_bytes {
        Some(bytes) => (bytes / size).clamp(1, objects),
        None => objects,
    }
}

fn per_object(started: Instant, objects: usize) -> f64 {
    started.elapsed().as_nanos() as f64 / objects as f64
}

/// Who serves the objects of one round.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Server {
    /// No allocator: the arena's addresses from one pre-faulted block.
    Floor,
    Arena,
    Mimalloc,
    Glibc,
}

/// One round's state: an arena sized for one batch (also the floor's block) and the pointer
/// list the heap allocators free from.
pub struct Bench {
    size: usize,
    objects: usize,
    batch: usize,
    arena: Arena,
    pointers: Vec<*mut u8>,
}

impl Bench {
    /// Sized for one batch and prefaulted once, as the runtime's worker arenas are.
    pub fn new(size: usize, objects: usize, working_set: &WorkingSet) -> Result<Bench> {
        let batch = batch_objects(size, objects, working_set.batch_bytes);
        let arena = Arena::new(batch * size.next_multiple_of(GRAIN_BYTES))?;
        Ok(Bench { size, objects, batch, arena, pointers: Vec::with_capacity(batch) })
    }

    /// An untimed round, then a timed one: ns per object of the second.
    pub fn warmed_round(&mut self, server: Server) -> f64 {
        self.round(server);
        self.round(server)
    }

    /// Runs one round and returns ns per object.
    pub fn round(&mut self, server: Server) -> f64 {
        let layout = Layout::from_size_align(self.size, ALIGN).expect("sizes and alignment are valid");
        let (objects, batch) = (self.objects, self.batch);
        match server {
            Server::Floor => floor_round(&mut self.arena, self.size.next_multiple_of(GRAIN_BYTES), objects, batch),
            Server::Arena => arena_round(&mut self.arena, layout, objects, batch),
            Server::Mimalloc => mimalloc_round(layout, objects, batch, &mut self.pointers),
            Server::Glibc => glibc_round(self.size, objects, batch, &mut self.pointers),
        }
    }
}

/// The touch floor: one frame's block covering a whole batch, then per batch the same
/// addresses the arena hands out (base, base + stride, …) each written once, no allocator.
fn floor_round(arena: &mut Arena, stride: usize, objects: usize, batch: usize) -> f64 {
    let stride = black_box(stride);
    let mut frame = arena.frame();
    let block = Layout::from_size_align(batch * stride, GRAIN_BYTES).expect("one batch is a valid layout");
    let base = frame.alloc_layout(block).expect("the arena was sized for one batch").as_ptr();
    let started = Instant::now();
    for _ in 0..objects / batch {
        let mut pointer = base;
        for _ in 0..batch {
            // SAFETY: base + index × stride for index < batch lies inside the block.
            unsafe { pointer.write_volatile(1) };
            pointer = pointer.wrapping_add(stride);
        }
    }
    per_object(started, objects / batch * batch)
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

/// Medians of `rounds` interleaved rounds in one working set. Every timed round follows an
/// untimed round of the same server, so each finds the caches and the TLB as its own last
/// round left them (the floor and the arena, which share addresses, find the same state, and
/// neither pays for another allocator's munmap or cache pollution); the floor is timed twice
/// in a row, and the gap between the two is the noise of an identical loop.
fn measure(size: usize, objects: usize, rounds: usize, working_set: &WorkingSet) -> Result<WorkingSetResult> {
    let mut bench = Bench::new(size, objects, working_set)?;
    let (mut floor_ns, mut floor_gaps_ns) = (Vec::new(), Vec::new());
    let (mut arena_ns, mut mimalloc_ns, mut glibc_ns) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds.max(1) {
        let first_floor = bench.warmed_round(Server::Floor);
        let second_floor = bench.round(Server::Floor);
        floor_gaps_ns.push((first_floor - second_floor).abs());
        floor_ns.extend([first_floor, second_floor]);
        arena_ns.push(bench.warmed_round(Server::Arena));
        mimalloc_ns.push(bench.warmed_round(Server::Mimalloc));
        glibc_ns.push(bench.warmed_round(Server::Glibc));
    }
    Ok(WorkingSetResult::new(
        working_set.clone(),
        bench.batch,
        [median(floor_ns), median(floor_gaps_ns), median(arena_ns), median(mimalloc_ns), median(glibc_ns)],
    ))
}

impl WorkingSetResult {
    /// From the medians `[floor, floor noise, arena, mimalloc, glibc]`, with the ratio above
    /// the floor left out when the arena is within noise of it.
    fn new(working_set: WorkingSet, batch_objects: usize, medians_ns: [f64; 5]) -> WorkingSetResult {
        let [floor_ns, floor_noise_ns, arena_ns, mimalloc_ns, glibc_ns] = medians_ns;
        let mut result = WorkingSetResult {
            working_set,
            batch_objects,
            floor_ns,
            floor_noise_ns,
            arena_ns,
            mimalloc_ns,
            glibc_ns,
            arena_above_floor_ns: arena_ns - floor_ns,
            glibc_above_floor_ratio: None,
        };
        if !result.arena_within_noise_of_floor() {
            result.glibc_above_floor_ratio = Some((glibc_ns - floor_ns) / result.arena_above_floor_ns);
        }
        result
    }
}

/// Runs every size in every working set and keeps the medians.
pub fn run(rounds: usize, sizes: &[(usize, usize)]) -> Result<Vec<AllocatorResult>> {
    let mut results = Vec::new();
    for &(size, objects) in sizes {
        let working_sets =
            WORKING_SETS.iter().map(|set| measure(size, objects, rounds, set)).collect::<Result<Vec<_>>>()?;
        results.push(AllocatorResult { size_bytes: size, objects, rounds: rounds.max(1), working_sets });
    }
    Ok(results)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: the floor and the three allocators run in every working set and report positive
    // times; method: one small round each.
    #[test]
    fn allocator_rounds_run() {
        let results = run(1, &[(16, 1 << 15), (4096, 10)]).expect("arenas map");
        assert_eq!(results.len(), 2);
        for result in &results {
            assert_eq!(result.working_sets.len(), WORKING_SETS.len());
            for w in &result.working_sets {
                assert!(w.floor_ns > 0.0 && w.arena_ns > 0.0 && w.mimalloc_ns > 0.0 && w.glibc_ns > 0.0, "{w:?}");
            }
        }
    }

    /// Offsets of the non-zero bytes of a bench's arena (fresh arenas hold zeros).
    fn touched_offsets(bench: &mut Bench) -> Vec<usize> {
        let bytes = bench.arena.bytes();
        let mut frame = bench.arena.frame();
        let block = frame.alloc_layout(Layout::from_size_align(bytes, 1).expect("valid")).expect("fits");
        // SAFETY: the block covers the whole arena, which is mapped, initialized and not aliased.
        let memory = unsafe { std::slice::from_raw_parts(block.as_ptr(), bytes) };
        memory.iter().enumerate().filter(|(_, &byte)| byte != 0).map(|(offset, _)| offset).collect()
    }

    // Goal: the floor is the arena's address pattern without the allocator, so the two write
    // exactly the same bytes; method: one round of each on fresh arenas (48 B: stride 48, not a
    // power of two; 64 B) and compare the offsets that were written.
    #[test]
    fn the_floor_writes_exactly_the_bytes_the_arena_hands_out() {
        let set = &WORKING_SETS[2];
        for size in [48, 64] {
            let mut floor = Bench::new(size, 1 << 12, set).expect("maps");
            let mut arena = Bench::new(size, 1 << 12, set).expect("maps");
            floor.round(Server::Floor);
            arena.round(Server::Arena);
            let expected: Vec<usize> = (0..floor.batch).map(|index| index * size).collect();
            assert_eq!(touched_offsets(&mut floor), expected, "{size} B floor");
            assert_eq!(touched_offsets(&mut arena), expected, "{size} B arena");
        }
    }

    // Goal: the ratio above the floor is left out when the arena is within noise of the floor
    // and computed otherwise; method: medians on either side of the band (5 % of the floor, or
    // twice the floor's own gap when that is larger).
    #[test]
    fn the_ratio_above_the_floor_is_clamped_inside_the_noise_band() {
        let set = WORKING_SETS[1].clone();
        let near = WorkingSetResult::new(set.clone(), 1, [1.0, 0.01, 1.04, 6.0, 10.0]);
        assert!(near.arena_within_noise_of_floor());
        assert_eq!(near.glibc_above_floor_ratio, None, "4 % above the floor is noise");
        let noisy = WorkingSetResult::new(set.clone(), 1, [1.0, 0.2, 1.3, 6.0, 10.0]);
        assert_eq!(noisy.glibc_above_floor_ratio, None, "inside twice the floor's own gap");
        let above = WorkingSetResult::new(set, 1, [1.0, 0.01, 1.5, 6.0, 10.0]);
        let ratio = above.glibc_above_floor_ratio.expect("0.5 ns above the floor is a cost");
        assert!((ratio - 18.0).abs() < 1e-9, "(10 − 1) ÷ (1.5 − 1) = 18, got {ratio}");
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
