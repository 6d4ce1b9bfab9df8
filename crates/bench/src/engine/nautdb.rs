//! The seed's experiment (NautDB, Figures 2 and 3): create, sort (row- and column-oriented),
//! select and free a table of 256 chunks of uint32 columns with values in a domain of 100,
//! in the specialized and the plain runtime, trial by trial.
//!
//! Specialized: chunk buffers from the huge-page prefaulted pool (blocks recycled, so trials
//! after the first fault nothing in), the thread pinned to the core it starts the trial on,
//! scratch from a frame of a prefaulted arena (optionally SCHED_FIFO). Plain: every buffer from
//! the global allocator (large ones are fresh mappings, faulted in on first touch and unmapped
//! on free), the thread unpinned, scratch from the heap.
//!
//! Both sides use their scratch the same way: one permutation buffer per chunk, reused for the
//! next chunk (the heap side reuses one `Vec`, the arena side starts a new frame, which hands
//! out the same cache-warm bytes).

use std::sync::Arc;
use std::time::Instant;

use bypass_engine::arena::Arena;
use bypass_engine::error::Result;
use bypass_engine::pool::{ChunkPool, PoolBuffer, PoolMode};
use bypass_engine::runtime::{pin_to_current_core, set_sched_fifo, set_sched_other, unpin, RuntimeKind};

/// Table chunks, as in the seed.
pub const CHUNKS: usize = 256;
/// Values are uniform in 0..DOMAIN.
pub const DOMAIN: u32 = 100;
/// The selection keeps rows whose key column equals this (~1%).
const SELECT_VALUE: u32 = 42;

/// Times of one trial (nanoseconds) and its minor page faults.
#[derive(Debug, Clone, Copy, Default, serde::Serialize, serde::Deserialize)]
pub struct TrialTimes {
    pub create_ns: u64,
    pub row_sort_ns: u64,
    pub column_sort_ns: u64,
    pub select_ns: u64,
    pub free_ns: u64,
    pub page_faults: u64,
    /// The trial ran under SCHED_FIFO.
    pub sched_fifo: bool,
}

/// A table of `CHUNKS` chunks × `columns` column chunks of `rows` values.
struct Table {
    chunks: Vec<Vec<PoolBuffer<u32>>>,
}

/// A small, fast generator (xorshift64*): the data only needs to be uniform.
struct Random(u64);

impl Random {
    fn next(&mut self) -> u32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 32) as u32
    }
}

fn minor_faults() -> u64 {
    // SAFETY: getrusage writes into the struct we pass; RUSAGE_THREAD counts this thread only.
    unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_THREAD, &mut usage);
        usage.ru_minflt as u64
    }
}

fn create(pool: &Arc<ChunkPool>, columns: usize, rows: usize, random: &mut Random) -> Result<Table> {
    let mut chunks = Vec::with_capacity(CHUNKS);
    for _ in 0..CHUNKS {
        let mut chunk = Vec::with_capacity(columns);
        for _ in 0..columns {
            let mut buffer = pool.buffer_for_overwrite::<u32>(rows)?;
            buffer.as_mut_slice().iter_mut().for_each(|v| *v = random.next() % DOMAIN);
            chunk.push(buffer);
        }
        chunks.push(chunk);
    }
    Ok(Table { chunks })
}

/// Start offset of every key value in a counting sort of `keys`.
fn counting_offsets(keys: &[u32]) -> [usize; DOMAIN as usize] {
    let mut counts = [0usize; DOMAIN as usize];
    keys.iter().for_each(|&k| counts[k as usize] += 1);
    let mut offsets = [0usize; DOMAIN as usize];
    for value in 1..DOMAIN as usize {
        offsets[value] = offsets[value - 1] + counts[value - 1];
    }
    offsets
}

/// Row-oriented: each row moves as a whole to its sorted slot (touches every column per row).
fn row_sort(pool: &Arc<ChunkPool>, table: &Table) -> Result<Table> {
    let mut chunks = Vec::with_capacity(table.chunks.len());
    for chunk in &table.chunks {
        let rows = chunk[0].len();
        let mut offsets = counting_offsets(&chunk[0]);
        let mut out: Vec<PoolBuffer<u32>> = Vec::with_capacity(chunk.len());
        for _ in 0..chunk.len() {
            out.push(pool.buffer_for_overwrite::<u32>(rows)?);
        }
        for row in 0..rows {
            let slot = &mut offsets[chunk[0][row] as usize];
            for (target, source) in out.iter_mut().zip(chunk) {
                target.as_mut_slice()[*slot] = source[row];
            }
            *slot += 1;
        }
        chunks.push(out);
    }
    Ok(Table { chunks })
}

/// Column-oriented: one permutation per chunk, then applied column by column. The
/// permutation lives in a frame of the arena (specialized) or in a reused `Vec` (plain).
fn column_sort(pool: &Arc<ChunkPool>, table: &Table, mut arena: Option<&mut Arena>) -> Result<Table> {
    let mut chunks = Vec::with_capacity(table.chunks.len());
    let mut heap: Vec<u32> = Vec::new();
    for chunk in &table.chunks {
        let rows = chunk[0].len();
        let mut frame = arena.as_deref_mut().map(Arena::frame);
        let permutation: &mut [u32] = match frame.as_mut() {
            Some(frame) => frame.alloc_slice(rows, 0u32)?,
            None => {
                heap.clear();
                heap.resize(rows, 0);
                &mut heap
            }
        };
        let mut offsets = counting_offsets(&chunk[0]);
        for (row, &key) in chunk[0].iter().enumerate() {
            permutation[offsets[key as usize]] = row as u32;
            offsets[key as usize] += 1;
        }
        let mut out = Vec::with_capacity(chunk.len());
        for source in chunk {
            let mut buffer = pool.buffer_for_overwrite::<u32>(rows)?;
            for (target, &row) in buffer.as_mut_slice().iter_mut().zip(permutation.iter()) {
                *target = source[row as usize];
            }
            out.push(buffer);
        }
        chunks.push(out);
    }
    Ok(Table { chunks })
}

/// `WHERE column0 = SELECT_VALUE`, materializing every column (branch-free compaction).
fn select(pool: &Arc<ChunkPool>, table: &Table) -> Result<Table> {
    let mut chunks = Vec::with_capacity(table.chunks.len());
    for chunk in &table.chunks {
        let rows = chunk[0].len();
        let mut selection = vec![0u32; rows];
        let mut count = 0;
        for (row, &key) in chunk[0].iter().enumerate() {
            selection[count] = row as u32;
            count += usize::from(key == SELECT_VALUE);
        }
        let mut out = Vec::with_capacity(chunk.len());
        for source in chunk {
            let mut buffer = pool.buffer_for_overwrite::<u32>(count)?;
            for (target, &row) in buffer.as_mut_slice().iter_mut().zip(&selection[..count]) {
                *target = source[row as usize];
            }
            out.push(buffer);
        }
        chunks.push(out);
    }
    Ok(Table { chunks })
}

/// Checks a sorted table: keys ascending within each chunk and every row kept intact (the
/// sum of each column is unchanged), as the seed's driver does.
fn check_sorted(original: &Table, sorted: &Table) -> bool {
    original.chunks.iter().zip(&sorted.chunks).all(|(a, b)| {
        b[0].windows(2).all(|w| w[0] <= w[1])
            && a.iter().zip(b).all(|(x, y)| {
                x.iter().map(|&v| u64::from(v)).sum::<u64>() == y.iter().map(|&v| u64::from(v)).sum::<u64>()
            })
    })
}

fn elapsed_ns(started: Instant) -> u64 {
    started.elapsed().as_nanos() as u64
}

/// The state one runtime keeps across trials.
pub struct Side {
    pub kind: RuntimeKind,
    pool: Arc<ChunkPool>,
    /// Scratch of the specialized side (None: plain, the heap serves it).
    arena: Option<Arena>,
}

impl Side {
    pub fn new(kind: RuntimeKind, pool_bytes_max: usize) -> Result<Side> {
        let specialized = kind == RuntimeKind::Specialized;
        let mode = if specialized { PoolMode::Specialized } else { PoolMode::Plain };
        let arena = if specialized { Some(Arena::new(bypass_engine::runtime::WORKER_ARENA_BYTES)?) } else { None };
        Ok(Side { kind, pool: ChunkPool::new(mode, pool_bytes_max), arena })
    }

    /// One trial: create, row sort, column sort, select, free; each timed. `sched_fifo` runs
    /// it under SCHED_FIFO (the specialized side only; `sched_fifo` in the result says whether
    /// the kernel granted it).
    pub fn trial(&mut self, columns: usize, rows: usize, seed: u64, sched_fifo: bool) -> Result<TrialTimes> {
        let specialized = self.kind == RuntimeKind::Specialized;
        if specialized {
            // The core the scheduler chose at the start (the idler one on a shared machine),
            // not a fixed core that another process may be keeping busy.
            pin_to_current_core();
        } else {
            unpin();
        }
        let sched_fifo = sched_fifo && specialized && set_sched_fifo();
        let faults_before = minor_faults();
        let mut random = Random(seed | 1);
        let mut times = TrialTimes { sched_fifo, ..TrialTimes::default() };
        let started = Instant::now();
        let table = create(&self.pool, columns, rows, &mut random)?;
        times.create_ns = elapsed_ns(started);
        let started = Instant::now();
        let sorted = row_sort(&self.pool, &table)?;
        times.row_sort_ns = elapsed_ns(started);
        assert!(check_sorted(&table, &sorted), "row sort output is sorted and a permutation");
        drop(sorted);
        let started = Instant::now();
        let sorted = column_sort(&self.pool, &table, self.arena.as_mut())?;
        times.column_sort_ns = elapsed_ns(started);
        assert!(check_sorted(&table, &sorted), "column sort output is sorted and a permutation");
        drop(sorted);
        let started = Instant::now();
        let selected = select(&self.pool, &table)?;
        times.select_ns = elapsed_ns(started);
        drop(selected);
        let started = Instant::now();
        drop(table);
        times.free_ns = elapsed_ns(started);
        times.page_faults = minor_faults() - faults_before;
        if sched_fifo {
            set_sched_other();
        }
        unpin();
        Ok(times)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: both sorts produce sorted permutations and the selection keeps exactly the rows
    // with the key; method: a small table in each runtime, checked against a scan.
    #[test]
    fn sorts_and_selection_are_correct() {
        for kind in [RuntimeKind::Specialized, RuntimeKind::Plain] {
            let mut side = Side::new(kind, 1 << 30).expect("arena maps");
            let times = side.trial(4, 64, 7, false).expect("trial runs");
            assert!(times.create_ns > 0);
            let pool = ChunkPool::new(PoolMode::Plain, 0);
            let table = create(&pool, 3, 500, &mut Random(3)).expect("heap");
            let selected = select(&pool, &table).expect("heap");
            for (chunk, out) in table.chunks.iter().zip(&selected.chunks) {
                let expected = chunk[0].iter().filter(|&&v| v == SELECT_VALUE).count();
                assert_eq!(out[0].len(), expected);
                assert!(out[0].iter().all(|&v| v == SELECT_VALUE));
            }
            let sorted = column_sort(&pool, &table, None).expect("heap");
            assert!(check_sorted(&table, &sorted));
        }
    }
}
