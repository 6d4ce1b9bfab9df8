//! The chunk pool: 64-byte-aligned column buffers carved from large pre-faulted regions.
//!
//! ```text
//!   ChunkPool ── slabs (2 MiB aligned; hugetlb → THP → 4 KiB pages, prefaulted)
//!      │            └─ blocks of one size class (power of two ≥ 64 B)
//!      └─ free list per size class ──► PoolBuffer<T> (returns its block on drop)
//!
//!   slab sizes of one class: first = 32 blocks (≥ 2 MiB), then doubling, at most SLAB_BYTES
//! ```
//!
//! Why slabs grow per class: slabs are prefaulted, so every byte mapped is resident. A fixed
//! 64 MiB slab per class made a class that holds a few kilobytes (a small table's column, a
//! last chunk's narrow copy) cost 64 MiB of RSS; TPC-H SF 1 mapped 7 such slabs (448 MiB, most
//! of the 2.37 → 2.92 GB growth when narrow copies added new classes).
//!
//! Invariants: a block belongs to exactly one live buffer or one free list; slabs are never
//! unmapped while the pool lives; the pool never maps more than `bytes_max`; a class's unused
//! mapped bytes are at most its first slab plus the bytes it has in use. In the `plain`
//! runtime buffers come from the global allocator instead (what a default process does).

use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use crate::error::{EngineError, Result};

/// Alignment of every column buffer (one cache line; AVX-512 loads never split).
pub const BUFFER_ALIGN: usize = 64;
/// Largest mapped region; a multiple of 2 MiB so THP and hugetlb can back it.
pub const SLAB_BYTES: usize = 64 << 20;
/// Blocks in a class's first slab (rounded up to a whole huge page).
const FIRST_SLAB_BLOCKS: usize = 32;
/// Smallest block: one cache line.
const SIZE_CLASS_MIN_LOG2: u32 = 6;
/// Largest pooled block (larger buffers get their own mapping rounded to slabs).
const SIZE_CLASS_MAX_LOG2: u32 = 26;
const SIZE_CLASSES: usize = (SIZE_CLASS_MAX_LOG2 - SIZE_CLASS_MIN_LOG2 + 1) as usize;
const HUGE_PAGE_BYTES: usize = 2 << 20;

/// Which page size backs the pool's memory, as found when the first slab was mapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum PageBacking {
    /// Explicit 2 MiB pages from the hugetlb pool (`/proc/sys/vm/nr_hugepages` reserved).
    HugeTlb,
    /// Transparent huge pages requested with `madvise(MADV_HUGEPAGE)`.
    Transparent,
    /// Normal 4 KiB pages.
    Normal,
}

/// How buffers are obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolMode {
    /// Slabs with huge pages where possible, prefaulted, recycled through free lists.
    Specialized,
    /// Every buffer from the global allocator, faulted in on first touch, freed on drop.
    Plain,
}

struct PoolState {
    free_lists: [Vec<usize>; SIZE_CLASSES],
    /// Free blocks whose pages were given back to the kernel by `trim` (they fault in again,
    /// zeroed, when reused); used after `free_lists`.
    trimmed_lists: [Vec<usize>; SIZE_CLASSES],
    /// Size of the next slab of each class (0: the class has no slab yet).
    next_slab_bytes: [usize; SIZE_CLASSES],
    slabs: Vec<(usize, usize)>,
    mapped_bytes: usize,
    backing: Option<PageBacking>,
}

/// A pool of aligned blocks; share it with `Arc`.
pub struct ChunkPool {
    mode: PoolMode,
    bytes_max: usize,
    state: Mutex<PoolState>,
}

impl std::fmt::Debug for ChunkPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChunkPool").field("mode", &self.mode).field("bytes_max", &self.bytes_max).finish()
    }
}

impl ChunkPool {
    pub fn new(mode: PoolMode, bytes_max: usize) -> Arc<ChunkPool> {
        let state = PoolState {
            free_lists: std::array::from_fn(|_| Vec::new()),
            trimmed_lists: std::array::from_fn(|_| Vec::new()),
            next_slab_bytes: [0; SIZE_CLASSES],
            slabs: Vec::new(),
            mapped_bytes: 0,
            backing: None,
        };
        Arc::new(ChunkPool { mode, bytes_max, state: Mutex::new(state) })
    }

    pub fn mode(&self) -> PoolMode {
        self.mode
    }

    /// Page size backing the slabs (None before the first slab or in plain mode).
    pub fn backing(&self) -> Option<PageBacking> {
        self.lock().backing
    }

    /// Bytes mapped for slabs so far.
    pub fn mapped_bytes(&self) -> usize {
        self.lock().mapped_bytes
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A buffer of `capacity` elements (length = capacity) that the caller overwrites
    /// completely. Pool blocks are not zeroed again: their bytes are old values of earlier
    /// buffers or the kernel's zero pages, so they are initialized, just meaningless.
    pub fn buffer_for_overwrite<T: Pod>(self: &Arc<Self>, capacity: usize) -> Result<PoolBuffer<T>> {
        let mut buffer = self.allocate::<T>(capacity, false)?;
        buffer.len = capacity;
        Ok(buffer)
    }

    /// A zeroed buffer of `capacity` elements, 64-byte aligned.
    pub fn buffer<T: Pod>(self: &Arc<Self>, capacity: usize) -> Result<PoolBuffer<T>> {
        self.allocate(capacity, true)
    }

    fn allocate<T: Pod>(self: &Arc<Self>, capacity: usize, zeroed: bool) -> Result<PoolBuffer<T>> {
        let bytes = (capacity.max(1) * std::mem::size_of::<T>()).next_multiple_of(BUFFER_ALIGN);
        let (address, origin) = match self.mode {
            PoolMode::Plain => (heap_alloc(bytes)?, Origin::Heap(bytes)),
            PoolMode::Specialized if bytes > 1 << SIZE_CLASS_MAX_LOG2 => (heap_alloc(bytes)?, Origin::Heap(bytes)),
            PoolMode::Specialized => {
                let class = size_class(bytes);
                let address = self.take_block(class)?;
                if zeroed {
                    // SAFETY: the block is `1 << (class + MIN)` bytes ≥ `bytes`, owned by us alone.
                    unsafe { std::ptr::write_bytes(address as *mut u8, 0, bytes) };
                }
                (address, Origin::Pool(Arc::clone(self), class))
            }
        };
        let ptr = NonNull::new(address as *mut T).expect("allocations are never null");
        Ok(PoolBuffer { ptr, len: 0, capacity, origin })
    }

    fn take_block(&self, class: usize) -> Result<usize> {
        let mut state = self.lock();
        if let Some(address) = state.free_lists[class].pop().or_else(|| state.trimmed_lists[class].pop()) {
            return Ok(address);
        }
        let block_bytes = 1usize << (class as u32 + SIZE_CLASS_MIN_LOG2);
        let slab_bytes = match state.next_slab_bytes[class] {
            0 => first_slab_bytes(block_bytes),
            next => next,
        };
        if state.mapped_bytes + slab_bytes > self.bytes_max {
            return Err(EngineError::LimitExceeded(format!(
                "chunk pool would exceed pool_bytes_max = {} bytes",
                self.bytes_max
            )));
        }
        let (slab, backing) = map_slab(slab_bytes)?;
        state.backing.get_or_insert(backing);
        state.slabs.push((slab, slab_bytes));
        state.mapped_bytes += slab_bytes;
        state.next_slab_bytes[class] = (slab_bytes * 2).min(SLAB_BYTES.max(block_bytes));
        // Blocks are handed out from the end so the first one is at the slab start.
        state.free_lists[class].extend((1..slab_bytes / block_bytes).rev().map(|i| slab + i * block_bytes));
        Ok(slab)
    }

    /// Gives the pages of free blocks back to the kernel (after DROP TABLE), so resident memory
    /// follows the data held. Blocks smaller than a page and hugetlb pages (which cannot be
    /// given back in part) stay. Returns the bytes released.
    pub fn trim(&self) -> usize {
        const PAGE_BYTES: usize = 4096;
        let mut state = self.lock();
        if state.backing == Some(PageBacking::HugeTlb) {
            return 0;
        }
        let mut released = 0;
        let first_class = size_class(PAGE_BYTES);
        for class in first_class..SIZE_CLASSES {
            let block_bytes = 1usize << (class as u32 + SIZE_CLASS_MIN_LOG2);
            let blocks = std::mem::take(&mut state.free_lists[class]);
            for &address in &blocks {
                // SAFETY: the block is free (on a free list, owned by no buffer) and lies inside one
                // of our slabs; MADV_DONTNEED on private anonymous memory only drops its pages.
                unsafe { libc::madvise(address as *mut libc::c_void, block_bytes, libc::MADV_DONTNEED) };
                released += block_bytes;
            }
            state.trimmed_lists[class].extend(blocks);
        }
        released
    }

    fn give_back(&self, class: usize, address: usize) {
        self.lock().free_lists[class].push(address);
    }
}

impl Drop for ChunkPool {
    fn drop(&mut self) {
        let state = self.state.get_mut().unwrap_or_else(|poisoned| poisoned.into_inner());
        for &(address, bytes) in &state.slabs {
            // SAFETY: every slab was mapped by `map_slab` with this length; no buffer outlives the
            // pool because each holds an `Arc` to it.
            unsafe { libc::munmap(address as *mut libc::c_void, bytes) };
        }
    }
}

/// A class's first slab: room for FIRST_SLAB_BLOCKS blocks, whole huge pages, at most
/// SLAB_BYTES (or one block, for blocks larger than that).
fn first_slab_bytes(block_bytes: usize) -> usize {
    (block_bytes * FIRST_SLAB_BLOCKS).next_multiple_of(HUGE_PAGE_BYTES).min(SLAB_BYTES).max(block_bytes)
}

fn size_class(bytes: usize) -> usize {
    let log2 = bytes.next_power_of_two().trailing_zeros().max(SIZE_CLASS_MIN_LOG2);
    (log2 - SIZE_CLASS_MIN_LOG2) as usize
}

fn heap_alloc(bytes: usize) -> Result<usize> {
    let layout = Layout::from_size_align(bytes, BUFFER_ALIGN)
        .map_err(|_| EngineError::LimitExceeded(format!("buffer of {bytes} bytes")))?;
    // SAFETY: layout has a non-zero size (callers round up to BUFFER_ALIGN).
    let address = unsafe { std::alloc::alloc_zeroed(layout) };
    if address.is_null() {
        return Err(EngineError::LimitExceeded(format!("out of memory allocating {bytes} bytes")));
    }
    Ok(address as usize)
}

/// Maps a slab: hugetlb 2 MiB pages if reserved, else THP, else normal pages; always prefaulted
/// so page faults happen at load time, never on the query path.
fn map_slab(bytes: usize) -> Result<(usize, PageBacking)> {
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE;
    let huge_2mb = 21 << libc::MAP_HUGE_SHIFT;
    if let Some(address) = mmap(bytes, flags | libc::MAP_HUGETLB | huge_2mb) {
        return Ok((address, PageBacking::HugeTlb));
    }
    // Over-map by one huge page so the range can be aligned for THP.
    let raw = mmap(bytes + HUGE_PAGE_BYTES, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS)
        .ok_or_else(|| EngineError::LimitExceeded(format!("mmap of {bytes} bytes failed")))?;
    let aligned = raw.next_multiple_of(HUGE_PAGE_BYTES);
    // SAFETY: trimming the unaligned head and tail of our own fresh mapping.
    unsafe {
        if aligned > raw {
            libc::munmap(raw as *mut libc::c_void, aligned - raw);
        }
        let tail = raw + bytes + HUGE_PAGE_BYTES - (aligned + bytes);
        if tail > 0 {
            libc::munmap((aligned + bytes) as *mut libc::c_void, tail);
        }
    }
    // SAFETY: advising and touching our own mapping of `bytes` bytes.
    let thp = unsafe { libc::madvise(aligned as *mut libc::c_void, bytes, libc::MADV_HUGEPAGE) } == 0;
    prefault(aligned, bytes);
    Ok((aligned, if thp { PageBacking::Transparent } else { PageBacking::Normal }))
}

fn mmap(bytes: usize, flags: i32) -> Option<usize> {
    // SAFETY: an anonymous mapping with no address hint has no preconditions.
    let address = unsafe { libc::mmap(std::ptr::null_mut(), bytes, libc::PROT_READ | libc::PROT_WRITE, flags, -1, 0) };
    (address != libc::MAP_FAILED).then_some(address as usize)
}

fn prefault(address: usize, bytes: usize) {
    const PAGE_BYTES: usize = 4096;
    for offset in (0..bytes).step_by(PAGE_BYTES) {
        // SAFETY: inside our own writable mapping; a volatile write so it is not elided.
        unsafe { std::ptr::write_volatile((address + offset) as *mut u8, 0) };
    }
}

/// Plain-old-data element types a buffer may hold (every bit pattern valid, no Drop).
pub trait Pod: Copy + Send + Sync + 'static {}
impl Pod for u8 {}
impl Pod for u16 {}
impl Pod for u32 {}
impl Pod for i32 {}
impl Pod for i64 {}
impl Pod for f64 {}
// An i128 and a scale: all-zero bytes are the numeric 0.
impl Pod for crate::numeric::Numeric {}
// Three integers: all-zero bytes are the zero interval.
impl Pod for crate::interval::Interval {}

enum Origin {
    Pool(Arc<ChunkPool>, usize),
    Heap(usize),
}

/// A fixed-capacity, 64-byte-aligned vector of POD values from a [`ChunkPool`].
pub struct PoolBuffer<T: Pod> {
    ptr: NonNull<T>,
    len: usize,
    capacity: usize,
    origin: Origin,
}

// SAFETY: the buffer owns its block exclusively; T is Send + Sync POD.
unsafe impl<T: Pod> Send for PoolBuffer<T> {}
// SAFETY: shared access only reads through `&[T]`.
unsafe impl<T: Pod> Sync for PoolBuffer<T> {}

impl<T: Pod> PoolBuffer<T> {
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Appends; the caller sized the buffer (a chunk holds at most its capacity by construction).
    pub fn push(&mut self, value: T) {
        assert!(self.len < self.capacity, "chunk buffer overflow");
        // SAFETY: len < capacity, inside the allocation.
        unsafe { self.ptr.as_ptr().add(self.len).write(value) };
        self.len += 1;
    }

    pub fn extend_from_slice(&mut self, values: &[T]) {
        assert!(self.len + values.len() <= self.capacity, "chunk buffer overflow");
        // SAFETY: bounds checked above; source and destination do not overlap (we own ours).
        unsafe { std::ptr::copy_nonoverlapping(values.as_ptr(), self.ptr.as_ptr().add(self.len), values.len()) };
        self.len += values.len();
    }

    pub fn as_mut_slice(&mut self) -> &mut [T] {
        // SAFETY: the first len elements are initialised and exclusively ours.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// Shortens to `len` (undoing a failed append); the dropped tail is zeroed again so that
    /// `set_len_zeroed` may rely on memory past `len` being zero.
    pub fn truncate(&mut self, len: usize) {
        if len >= self.len {
            return;
        }
        // SAFETY: elements len..self.len are initialised and ours; T is POD, so all-zero bytes are
        // a valid value and nothing needs dropping.
        unsafe { std::ptr::write_bytes(self.ptr.as_ptr().add(len), 0, self.len - len) };
        self.len = len;
    }

    /// Sets the length to `len` ≤ capacity; the memory is zeroed at allocation, so it is valid.
    pub fn set_len_zeroed(&mut self, len: usize) {
        assert!(len <= self.capacity, "chunk buffer overflow");
        self.len = len;
    }
}

impl<T: Pod> std::ops::Deref for PoolBuffer<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: the first len elements are initialised (zeroed at allocation or written).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: Pod> Drop for PoolBuffer<T> {
    fn drop(&mut self) {
        match &self.origin {
            Origin::Pool(pool, class) => pool.give_back(*class, self.ptr.as_ptr() as usize),
            Origin::Heap(bytes) => {
                let layout = Layout::from_size_align(*bytes, BUFFER_ALIGN).expect("layout was valid at allocation");
                // SAFETY: allocated by heap_alloc with exactly this layout.
                unsafe { std::alloc::dealloc(self.ptr.as_ptr() as *mut u8, layout) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: pooled buffers are aligned, zeroed and recycled; method: allocate, drop, reallocate.
    #[test]
    fn pool_recycles_aligned_blocks() {
        let pool = ChunkPool::new(PoolMode::Specialized, 1 << 30);
        let mut first = pool.buffer::<i64>(1000).expect("pool has room");
        assert_eq!(first.as_ptr() as usize % BUFFER_ALIGN, 0);
        first.extend_from_slice(&[7; 1000]);
        let address = first.as_ptr() as usize;
        drop(first);
        let mut second = pool.buffer::<i64>(1000).expect("pool has room");
        assert_eq!(second.as_ptr() as usize, address, "the freed block is reused");
        second.set_len_zeroed(1000);
        assert!(second.iter().all(|&v| v == 0), "reused blocks are zeroed");
        assert_eq!(pool.mapped_bytes(), first_slab_bytes(8192));
        assert!(pool.backing().is_some());
    }

    // Goal: the pool refuses to grow past its bound; method: a tiny bound.
    #[test]
    fn pool_respects_its_bound() {
        let pool = ChunkPool::new(PoolMode::Specialized, 1 << 20);
        assert!(matches!(pool.buffer::<u8>(100), Err(EngineError::LimitExceeded(_))));
        let plain = ChunkPool::new(PoolMode::Plain, 0);
        let buffer = plain.buffer::<f64>(10).expect("plain mode uses the heap");
        assert_eq!(buffer.as_ptr() as usize % BUFFER_ALIGN, 0);
    }

    // Goal: concurrent alloc/free neither loses nor duplicates blocks; method: 2 threads churn.
    #[test]
    fn pool_is_safe_under_concurrency() {
        let pool = ChunkPool::new(PoolMode::Specialized, 1 << 30);
        std::thread::scope(|scope| {
            for _ in 0..2 {
                scope.spawn(|| {
                    for round in 0..2000 {
                        let mut buffer = pool.buffer::<u32>(256).expect("room");
                        buffer.extend_from_slice(&[round; 256]);
                        assert!(buffer.iter().all(|&v| v == round));
                    }
                });
            }
        });
        assert_eq!(pool.mapped_bytes(), first_slab_bytes(1024), "blocks were recycled, not leaked");
    }

    // Goal: a size class that holds little maps little (slabs are prefaulted, so mapped bytes
    // are resident), and a growing class's slabs double up to SLAB_BYTES; method: one small
    // buffer per class, then enough 512 KiB buffers for five slabs, counting mapped bytes.
    #[test]
    fn slabs_grow_with_their_class() {
        let pool = ChunkPool::new(PoolMode::Specialized, 1 << 30);
        let small: Vec<PoolBuffer<u8>> =
            (6..16).map(|log2| pool.buffer_for_overwrite::<u8>(1 << log2).expect("room")).collect();
        assert_eq!(pool.mapped_bytes(), 10 * HUGE_PAGE_BYTES, "ten small classes cost one huge page each");
        drop(small);
        let block = 512 << 10;
        let first = first_slab_bytes(block);
        assert_eq!(first, 16 << 20);
        let slabs = [first, 2 * first, SLAB_BYTES, SLAB_BYTES];
        let blocks: usize = slabs.iter().map(|bytes| bytes / block).sum();
        let large: Vec<PoolBuffer<u8>> =
            (0..blocks).map(|_| pool.buffer_for_overwrite::<u8>(block).expect("room")).collect();
        let mapped_small = 10 * HUGE_PAGE_BYTES;
        assert_eq!(pool.mapped_bytes(), mapped_small + slabs.iter().sum::<usize>(), "16, 32, 64, 64 MiB");
        assert_eq!(large.len(), blocks);
    }
}
