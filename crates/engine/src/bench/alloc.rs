//! The allocator micro-benchmark (the seed's Figure 1): n objects of one size are allocated,
//! one byte of each touched, then all freed (or the arena reset); nanoseconds per object for
//! the per-query arena (bumpalo, pre-sized, reset), mimalloc and glibc malloc.

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

#[derive(Debug, Clone, Serialize)]
pub struct AllocatorResult {
    pub size_bytes: usize,
    pub objects: usize,
    pub arena_ns: f64,
    pub mimalloc_ns: f64,
    pub glibc_ns: f64,
}

fn per_object(started: Instant, objects: usize) -> f64 {
    started.elapsed().as_nanos() as f64 / objects as f64
}

fn glibc_round(size: usize, objects: usize, pointers: &mut Vec<*mut u8>) -> f64 {
    pointers.clear();
    let started = Instant::now();
    for _ in 0..objects {
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
    per_object(started, objects)
}

fn mimalloc_round(size: usize, objects: usize, pointers: &mut Vec<*mut u8>) -> f64 {
    let layout = Layout::from_size_align(size, ALIGN).expect("sizes and alignment are valid");
    let allocator = mimalloc::MiMalloc;
    pointers.clear();
    let started = Instant::now();
    for _ in 0..objects {
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
    per_object(started, objects)
}

fn arena_round(arena: &mut bumpalo::Bump, size: usize, objects: usize) -> f64 {
    let layout = Layout::from_size_align(size, ALIGN).expect("sizes and alignment are valid");
    let started = Instant::now();
    for _ in 0..objects {
        let pointer = arena.alloc_layout(layout).as_ptr();
        // SAFETY: the allocation has at least one byte and lives until the reset below.
        unsafe { pointer.write_volatile(1) };
    }
    arena.reset();
    per_object(started, objects)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Runs every size `rounds` times per allocator (interleaved) and keeps the medians.
pub fn run(rounds: usize, sizes: &[(usize, usize)]) -> Vec<AllocatorResult> {
    let mut results = Vec::new();
    for &(size, objects) in sizes {
        // Pre-sized and prefaulted once, as the runtime's arenas are; reset() keeps the chunk.
        let mut arena = crate::runtime::prefaulted_arena(size * objects + (1 << 20));
        let mut pointers = Vec::with_capacity(objects);
        let (mut arena_ns, mut mimalloc_ns, mut glibc_ns) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..rounds.max(1) {
            arena_ns.push(arena_round(&mut arena, size, objects));
            mimalloc_ns.push(mimalloc_round(size, objects, &mut pointers));
            glibc_ns.push(glibc_round(size, objects, &mut pointers));
        }
        results.push(AllocatorResult {
            size_bytes: size,
            objects,
            arena_ns: median(arena_ns),
            mimalloc_ns: median(mimalloc_ns),
            glibc_ns: median(glibc_ns),
        });
    }
    results
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: the three allocators run and report positive times; method: one tiny round each.
    #[test]
    fn allocator_rounds_run() {
        let results = run(1, &[(16, 1000), (4096, 10)]);
        assert_eq!(results.len(), 2);
        assert!(results.iter().all(|r| r.arena_ns > 0.0 && r.mimalloc_ns > 0.0 && r.glibc_ns > 0.0));
    }
}
