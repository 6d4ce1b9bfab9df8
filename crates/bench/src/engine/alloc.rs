//! The allocator micro-benchmark (the seed's Figure 1): n objects of one size are allocated,
//! one byte of each touched, then all freed; nanoseconds per object for the per-query arena
//! (`bypass_engine::arena`: the one the runtime's workers use, one frame per batch), mimalloc and glibc
//! malloc (`libc::malloc`/`free` directly), next to the **touch floor**: the arena's address
//! pattern written with no allocator at all.
//!
//! ```text
//!   per round:  settle F │ F A A F A F F A │ settle M, M │ settle G, G     (medians)
//!               (untimed rounds until three in a row agree within 5 %)  timed: F A A F…, M, G
//!   floor = the arena's own addresses (its mapping), the same one-byte volatile store
//!   allocator cost above the floor = (glibc − floor) ÷ (arena − floor), unless arena − floor
//!   lies inside the noise band (2 × its deviation over rounds, at least 5 % of the floor)
//! ```
//!
//! Every allocator gets the same objects, the same touch (one volatile byte store per object),
//! the same free order (allocation order; the arena frees a batch by ending its frame) and the
//! same opaque size (`black_box`, so no call is specialized on a constant). Three working sets:
//! - streaming: all n objects live at once (16 MiB at 16 B × 2^20, 8× this machine's 2 MiB
//!   L2): every line the touches write is filled from beyond L2 (L3 or DRAM), which dominates
//!   the arena's time;
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

use bypass_engine::arena::{Arena, GRAIN_BYTES};
use bypass_engine::error::Result;

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
/// Timed passes of the floor and the arena per round, alternating in Thue–Morse order (ABBA
/// BAAB), which cancels drift that is linear or quadratic in time.
const FLOOR_ARENA_PASSES: usize = 8;
/// Two untimed rounds agree when they differ by at most this fraction.
const SETTLED_FRACTION: f64 = 0.05;
/// A server has settled after this many agreements in a row.
const SETTLED_AGREEMENTS: usize = 2;
/// Bound on the untimed rounds spent settling (a server on a noisy machine may never agree).
const SETTLE_ROUNDS_MAX: usize = 16;
/// The noise band is this many times the median absolute deviation of arena − floor.
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
    pub arena_ns: f64,
    pub mimalloc_ns: f64,
    pub glibc_ns: f64,
    /// arena − floor: what the arena adds to the touches (median of the per-round differences).
    #[serde(default)]
    pub arena_above_floor_ns: f64,
    /// Median absolute deviation of the per-round differences arena − floor.
    #[serde(default)]
    pub arena_above_floor_noise_ns: f64,
    /// (glibc − floor) ÷ (arena − floor); None when the arena is within noise of the floor.
    #[serde(default)]
    pub glibc_above_floor_ratio: Option<f64>,
}

impl WorkingSetResult {
    /// Differences from the floor up to this are indistinguishable from zero.
    pub fn floor_band_ns(&self) -> f64 {
        (FLOOR_NOISE_MULTIPLE * self.arena_above_floor_noise_ns).max(FLOOR_RESOLUTION_FRACTION * self.floor_ns)
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

    /// Untimed rounds until [`SETTLED_AGREEMENTS`] + 1 in a row agree, each within
    /// [`SETTLED_FRACTION`] of the one before (at most [`SETTLE_ROUNDS_MAX`]): the caches and
    /// the TLB are then as this server's own rounds leave them, not as another server's
    /// traffic or munmap left them. One agreement is not enough: after the heap allocators'
    /// traffic a streaming block runs two rounds at one speed before it starts to speed up.
    pub fn settle(&mut self, server: Server) {
        let (mut previous_ns, mut agreements) = (self.round(server), 0);
        for _ in 1..SETTLE_ROUNDS_MAX {
            let time_ns = self.round(server);
            agreements =
                if (time_ns - previous_ns).abs() <= SETTLED_FRACTION * previous_ns { agreements + 1 } else { 0 };
            if agreements == SETTLED_AGREEMENTS {
                return;
            }
            previous_ns = time_ns;
        }
    }

    /// A timed round once the server has settled: ns per object.
    pub fn settled_round(&mut self, server: Server) -> f64 {
        self.settle(server);
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

fn median(values: Vec<f64>) -> f64 {
    crate::report::stats::median(&values).unwrap_or(f64::NAN)
}

/// Per-round times in one working set, ns per object.
#[derive(Debug, Default)]
struct Timings {
    floor: Vec<f64>,
    arena: Vec<f64>,
    mimalloc: Vec<f64>,
    glibc: Vec<f64>,
}

/// `rounds` interleaved rounds in one working set; every server is timed once it has settled
/// ([`Bench::settle`]). After another server's traffic, a streaming block's lines come back
/// into the caches over several passes (measured at 64 B: 6.8, 6.7, 5.8, 5.0, 4.1, 3.6, 2.9,
/// 2.7, 2.7 ns per object). The floor and the arena write the same lines, so they are timed as one block:
/// the floor settles, then [`FLOOR_ARENA_PASSES`] passes alternate in Thue–Morse order, which
/// gives both the same share of any drift that is left.
fn measure(size: usize, objects: usize, rounds: usize, working_set: &WorkingSet) -> Result<WorkingSetResult> {
    let mut bench = Bench::new(size, objects, working_set)?;
    let mut timings = Timings::default();
    for _ in 0..rounds.max(1) {
        bench.settle(Server::Floor);
        let (mut floor_ns, mut arena_ns) = (0.0, 0.0);
        for pass in 0..FLOOR_ARENA_PASSES {
            // The Thue–Morse sequence: floor, arena, arena, floor, arena, floor, floor, arena.
            if pass.count_ones() % 2 == 0 {
                floor_ns += bench.round(Server::Floor);
            } else {
                arena_ns += bench.round(Server::Arena);
            }
        }
        timings.floor.push(floor_ns / (FLOOR_ARENA_PASSES / 2) as f64);
        timings.arena.push(arena_ns / (FLOOR_ARENA_PASSES / 2) as f64);
        timings.mimalloc.push(bench.settled_round(Server::Mimalloc));
        timings.glibc.push(bench.settled_round(Server::Glibc));
    }
    Ok(WorkingSetResult::new(working_set.clone(), bench.batch, &timings))
}

impl WorkingSetResult {
    /// Medians of the rounds; arena − floor is the median of the per-round differences (each
    /// round's floor and arena share a block), its noise their median absolute deviation, and
    /// the ratio above the floor is left out when the difference is within noise.
    fn new(working_set: WorkingSet, batch_objects: usize, timings: &Timings) -> WorkingSetResult {
        let differences: Vec<f64> = timings.arena.iter().zip(&timings.floor).map(|(a, f)| a - f).collect();
        let arena_above_floor_ns = median(differences.clone());
        let deviations = differences.iter().map(|d| (d - arena_above_floor_ns).abs()).collect();
        let mut result = WorkingSetResult {
            working_set,
            batch_objects,
            floor_ns: median(timings.floor.clone()),
            arena_ns: median(timings.arena.clone()),
            mimalloc_ns: median(timings.mimalloc.clone()),
            glibc_ns: median(timings.glibc.clone()),
            arena_above_floor_ns,
            arena_above_floor_noise_ns: median(deviations),
            glibc_above_floor_ratio: None,
        };
        if !result.arena_within_noise_of_floor() {
            result.glibc_above_floor_ratio = Some((result.glibc_ns - result.floor_ns) / arena_above_floor_ns);
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

    fn result(floor: [f64; 3], arena: [f64; 3]) -> WorkingSetResult {
        let timings =
            Timings { floor: floor.to_vec(), arena: arena.to_vec(), mimalloc: vec![6.0; 3], glibc: vec![10.0; 3] };
        WorkingSetResult::new(WORKING_SETS[1].clone(), 1, &timings)
    }

    // Goal: the ratio above the floor is left out when the arena is within noise of the floor
    // and computed otherwise; method: rounds on either side of the band (5 % of the floor, or
    // twice the deviation of arena − floor over rounds when that is larger).
    #[test]
    fn the_ratio_above_the_floor_is_clamped_inside_the_noise_band() {
        let near = result([1.0; 3], [1.04; 3]);
        assert!(near.arena_within_noise_of_floor());
        assert_eq!(near.glibc_above_floor_ratio, None, "4 % above the floor is noise");
        let noisy = result([1.0; 3], [1.0, 1.3, 1.6]);
        assert!((noisy.arena_above_floor_noise_ns - 0.3).abs() < 1e-9);
        assert_eq!(noisy.glibc_above_floor_ratio, None, "0.3 ns inside twice a deviation of 0.3 ns");
        let below = result([2.0; 3], [1.0; 3]);
        assert_eq!(below.glibc_above_floor_ratio, None, "below the floor gives no ratio either");
        let above = result([1.0, 1.1, 0.9], [1.5, 1.6, 1.4]);
        let ratio = above.glibc_above_floor_ratio.expect("0.5 ns above the floor, steadily, is a cost");
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
