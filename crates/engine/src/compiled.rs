//! The compiled tier: scan → filters → aggregate pipelines as fused, monomorphized loops built
//! from pre-compiled building blocks (no code generation at query time).
//!
//! ```text
//!   per morsel (table chunk): zone maps drop range filters the chunk always passes and skip
//!   chunks no row passes; ranges over chunks with a narrow copy (1–2 bytes per value,
//!   frame of reference) read the copy instead of the i32/i64 column (scans are bandwidth-bound)
//!   per block of BLOCK_ROWS rows, straight from the chunk buffers:
//!     mask  ← range<u8|u16|i32|i64>/code-set/column-compare kernels (branch-free, vectorized)
//!     sel   ← compaction of the mask (zero words skipped, branch-free within a word)
//!     gid   ← Σ code·stride over small-domain group columns (perfect hash, no hash table)
//!     acc   ← dense blocks: Σ mask·Π factors in i64 lanes; sparse blocks: factors gathered
//!             (from narrow copies when present), then summed; i128 when zone maps allow overflow
//! ```
//!
//! A plan qualifies when its filters are conjunctions of column-vs-constant comparisons,
//! string predicates on dictionary columns (evaluated once per dictionary entry) or
//! comparisons of two columns; groups are text columns with small dictionaries; aggregates are
//! COUNT, SUM or AVG of a product of up to three `offset ± column` factors over integer or
//! decimal columns, without NULLs. Everything else runs in the interpreter, which is also the
//! oracle the tests compare this tier with.

use std::sync::{Arc, Mutex};

use crate::error::Result;
use crate::exec::aggregate::AggregateState;
use crate::expr::{evaluate, BinaryOp, Expr};
use crate::joins::split_conjuncts;
use crate::plan::{AggregateCall, AggregateFunction, Plan};
use crate::runtime::Runtime;
use crate::storage::{ChunkData, ColumnChunk, NarrowCopy, Table};
use crate::types::{DataType, Value};
use crate::vector::{Batch, Data, Vector};

/// Rows per block: the mask, selection and group ids of a block stay in L1.
pub const BLOCK_ROWS: usize = 1024;
/// Largest number of groups the perfect-hash aggregate handles.
pub const COMPILED_GROUPS_MAX: usize = 1 << 12;
/// Factors per aggregated product (shapes with 1, 2 and 3 factors are pre-instantiated).
const FACTORS_MAX: usize = 3;
/// Largest scratch one morsel takes from its worker's arena (see `Scratch`), plus one grain of
/// rounding per slice.
const SCRATCH_BYTES_MAX: usize = BLOCK_ROWS * (1 + 4 + 4)
    + COMPILED_GROUPS_MAX * LANES * 8
    + FACTORS_MAX * BLOCK_ROWS * 8
    + 5 * crate::arena::GRAIN_BYTES;
const _: () = assert!(SCRATCH_BYTES_MAX <= crate::runtime::WORKER_ARENA_BYTES, "a morsel's scratch fits the arena");

/// A filter building block over table columns.
#[derive(Debug, Clone)]
enum Predicate {
    /// lo ≤ column ≤ hi over an i32 column (int32, date).
    RangeI32 { column: usize, lo: i32, hi: i32 },
    /// lo ≤ column ≤ hi over an i64 column (int64, decimal).
    RangeI64 { column: usize, lo: i64, hi: i64 },
    /// Dictionary codes that pass (=, <>, IN, LIKE on text, evaluated per dictionary entry).
    CodeSet { column: usize, allowed: Vec<u8> },
    /// left < right (or ≤) over two i32 columns.
    LessI32 { left: usize, right: usize, or_equal: bool },
}

/// `offset + sign · column`, over an i64 column.
#[derive(Debug, Clone, Copy)]
struct Factor {
    column: usize,
    offset: i64,
    sign: i64,
}

#[derive(Debug, Clone)]
struct CompiledCall {
    call: AggregateCall,
    /// Empty for COUNT(*).
    factors: Vec<Factor>,
}

/// A fused scan → filter → aggregate pipeline.
pub struct CompiledAggregate {
    table: Arc<Table>,
    predicates: Vec<Predicate>,
    /// (table column, dictionary size) per group key, in key order.
    groups: Vec<(usize, usize)>,
    calls: Vec<CompiledCall>,
    group_slots: usize,
}

/// Per-worker accumulators: per call, per group slot.
struct Accumulators {
    sums: Vec<Vec<i128>>,
    counts: Vec<i64>,
}

impl CompiledAggregate {
    /// The compiled pipeline for this aggregate, if every part fits a building block.
    pub fn try_new(input: &Plan, groups: &[Expr], aggregates: &[AggregateCall]) -> Option<CompiledAggregate> {
        let Plan::Scan { table, columns, filter } = input else { return None };
        let used = |c: usize| columns[c];
        if table.chunks.iter().any(|chunk| chunk.columns.iter().any(|c| c.validity.is_some())) {
            return None;
        }
        let mut conjuncts = Vec::new();
        if let Some(filter) = filter {
            split_conjuncts(filter.clone(), &mut conjuncts);
        }
        let predicates = conjuncts.iter().map(|c| compile_predicate(table, columns, c)).collect::<Option<Vec<_>>>()?;
        let predicates = merge_ranges(predicates);
        let mut group_columns = Vec::new();
        let mut group_slots = 1usize;
        for group in groups {
            let Expr::Column { index, data_type: DataType::Text } = group else { return None };
            let size = table.dictionaries[used(*index)].as_ref()?.len().max(1);
            group_slots = group_slots.checked_mul(size)?;
            group_columns.push((used(*index), size));
        }
        if group_slots > COMPILED_GROUPS_MAX {
            return None;
        }
        let calls = aggregates.iter().map(|a| compile_call(table, columns, a)).collect::<Option<Vec<_>>>()?;
        Some(CompiledAggregate { table: Arc::clone(table), predicates, groups: group_columns, calls, group_slots })
    }

    /// Runs the pipeline on all workers and returns groups then aggregates, like the
    /// interpreter's hash aggregate (groups with no rows are left out; a global aggregate
    /// always has one row).
    pub fn run(&self, runtime: &Runtime) -> Result<Batch> {
        let workers = runtime.workers();
        let partials: Vec<Mutex<Accumulators>> = (0..workers).map(|_| Mutex::new(self.accumulators())).collect();
        runtime.run_morsels(self.table.chunks.len(), |worker, morsel| {
            let mut accumulators = partials[worker].lock().unwrap_or_else(|p| p.into_inner());
            runtime.with_arena(worker, |arena| match arena {
                Some(arena) => {
                    // One frame per morsel: the same cache-warm bytes serve every morsel.
                    let mut frame = arena.frame();
                    let mut scratch = Scratch {
                        mask: frame.alloc_slice(BLOCK_ROWS, 0u8)?,
                        selection: frame.alloc_slice(BLOCK_ROWS, 0u32)?,
                        group_ids: frame.alloc_slice(BLOCK_ROWS, 0u32)?,
                        lanes: frame.alloc_slice(self.group_slots * LANES, 0i64)?,
                        gathered: frame.alloc_slice(FACTORS_MAX * BLOCK_ROWS, 0i64)?,
                    };
                    self.run_morsel(morsel, &mut scratch, &mut accumulators);
                    Ok(())
                }
                None => {
                    let (mut mask, mut selection, mut group_ids) =
                        (vec![0u8; BLOCK_ROWS], vec![0u32; BLOCK_ROWS], vec![0u32; BLOCK_ROWS]);
                    let mut lanes = vec![0i64; self.group_slots * LANES];
                    let mut gathered = vec![0i64; FACTORS_MAX * BLOCK_ROWS];
                    let mut scratch = Scratch {
                        mask: &mut mask,
                        selection: &mut selection,
                        group_ids: &mut group_ids,
                        lanes: &mut lanes,
                        gathered: &mut gathered,
                    };
                    self.run_morsel(morsel, &mut scratch, &mut accumulators);
                    Ok(())
                }
            })
        })?;
        let mut total = self.accumulators();
        for partial in partials {
            let partial = partial.into_inner().unwrap_or_else(|p| p.into_inner());
            for (sums, other) in total.sums.iter_mut().zip(&partial.sums) {
                sums.iter_mut().zip(other).for_each(|(a, b)| *a += b);
            }
            total.counts.iter_mut().zip(&partial.counts).for_each(|(a, b)| *a += b);
        }
        self.finish(total)
    }

    fn accumulators(&self) -> Accumulators {
        Accumulators { sums: vec![vec![0; self.group_slots]; self.calls.len()], counts: vec![0; self.group_slots] }
    }

    fn run_morsel(&self, morsel: usize, scratch: &mut Scratch<'_>, accumulators: &mut Accumulators) {
        let chunk = &self.table.chunks[morsel];
        let Some(filters) = chunk_filters(&self.predicates, &chunk.columns) else { return };
        let narrow: Vec<bool> = self.calls.iter().map(|c| fits_i64(&c.factors, &chunk.columns)).collect();
        for start in (0..chunk.rows).step_by(BLOCK_ROWS) {
            let end = (start + BLOCK_ROWS).min(chunk.rows);
            let rows = end - start;
            let mask = &mut scratch.mask[..rows];
            mask.fill(1);
            for filter in &filters {
                filter.apply(&chunk.columns, start, end, mask);
            }
            let selected = count_selected(mask);
            if selected == 0 {
                continue;
            }
            // Dense blocks multiply by the mask instead of gathering through a selection.
            let dense = selected * 2 > rows;
            let selection: &[u32] = if dense {
                &[]
            } else {
                let count = compact(mask, scratch.selection);
                &scratch.selection[..count]
            };
            let active = if dense { rows } else { selected };
            let group_ids = &mut scratch.group_ids[..active];
            self.group_ids(&chunk.columns, start, dense.then_some(rows), selection, group_ids);
            let lanes = &mut scratch.lanes[..self.group_slots * LANES];
            lanes.fill(0);
            let ones = Factor { column: usize::MAX, offset: 1, sign: 0 };
            let block = Block { start, mask, selection, group_ids, dense };
            block.sum::<0>(&[], [ones; 3], lanes);
            fold_lanes(lanes, &mut accumulators.counts);
            for ((call, sums), &narrow) in self.calls.iter().zip(&mut accumulators.sums).zip(&narrow) {
                if call.factors.is_empty() {
                    continue;
                }
                if narrow {
                    lanes.fill(0);
                    block.sum_factors(&call.factors, &chunk.columns, scratch.gathered, lanes);
                    fold_lanes_wide(lanes, sums);
                } else {
                    let selection = if dense { compact_owned(mask) } else { selection.to_vec() };
                    let wide_groups = if dense {
                        selection.iter().map(|&r| group_ids[r as usize]).collect()
                    } else {
                        group_ids.to_vec()
                    };
                    accumulate(&call.factors, &chunk.columns, start, &selection, &wide_groups, sums);
                }
            }
        }
    }

    /// Group slot per active row: every row of a dense block, else the selected rows.
    fn group_ids(
        &self,
        columns: &[ColumnChunk],
        start: usize,
        dense_rows: Option<usize>,
        selection: &[u32],
        out: &mut [u32],
    ) {
        out.fill(0);
        let mut stride = 1u32;
        for &(column, size) in &self.groups {
            let ChunkData::Text(codes) = &columns[column].data else { unreachable!("group columns are text") };
            match dense_rows {
                Some(rows) => {
                    for (g, &code) in out.iter_mut().zip(&codes[start..start + rows]) {
                        *g += code * stride;
                    }
                }
                None => {
                    let codes = &codes[start..];
                    for (g, &row) in out.iter_mut().zip(selection) {
                        *g += codes[row as usize] * stride;
                    }
                }
            }
            stride *= size as u32;
        }
    }

    fn finish(&self, total: Accumulators) -> Result<Batch> {
        let present: Vec<usize> = if self.groups.is_empty() {
            vec![0]
        } else {
            (0..self.group_slots).filter(|&g| total.counts[g] > 0).collect()
        };
        let mut columns = Vec::new();
        let mut stride = 1usize;
        for &(column, size) in &self.groups {
            let dictionary = Arc::clone(self.table.dictionaries[column].as_ref().expect("group columns are text"));
            let codes = present.iter().map(|&g| ((g / stride) % size) as u32).collect();
            columns.push(Vector { data_type: DataType::Text, data: Data::Text(codes, dictionary), validity: None });
            stride *= size;
        }
        for (call, sums) in self.calls.iter().zip(&total.sums) {
            let counts: Vec<i64> = present.iter().map(|&g| total.counts[g]).collect();
            let state = match call.call.function {
                AggregateFunction::Count | AggregateFunction::CountStar => AggregateState::Count(counts),
                _ => AggregateState::SumInt { sums: present.iter().map(|&g| sums[g]).collect(), counts },
            };
            columns.push(state.finish(&call.call)?);
        }
        Ok(Batch::new(columns, present.len()))
    }
}

/// Scratch space of one block: from the worker's arena (specialized) or the heap (plain).
struct Scratch<'a> {
    mask: &'a mut [u8],
    selection: &'a mut [u32],
    group_ids: &'a mut [u32],
    /// LANES partial sums per group slot (independent chains so updates overlap).
    lanes: &'a mut [i64],
    /// Factor values of a sparse block's selected rows, BLOCK_ROWS per factor.
    gathered: &'a mut [i64],
}

/// The mask of a block whose rows all count (factor values gathered for the selected rows).
static ALL_SELECTED: [u8; BLOCK_ROWS] = [1; BLOCK_ROWS];

/// Independent accumulators per group: consecutive rows of one group add into different
/// lanes, so the additions do not wait on each other.
const LANES: usize = 4;

/// One block's rows: selected through `mask` (dense) or listed in `selection`.
struct Block<'b> {
    start: usize,
    mask: &'b [u8],
    selection: &'b [u32],
    group_ids: &'b [u32],
    dense: bool,
}

impl Block<'_> {
    fn sum_factors(&self, factors: &[Factor], columns: &[ColumnChunk], gathered: &mut [i64], lanes: &mut [i64]) {
        if !self.dense {
            return self.sum_gathered(factors, columns, gathered, lanes);
        }
        let slice = |f: &Factor| -> &[i64] {
            let ChunkData::I64(v) = &columns[f.column].data else { unreachable!("checked at compile time") };
            &v[self.start..]
        };
        match factors {
            [a] => self.sum::<1>(&[slice(a)], [*a, *a, *a], lanes),
            [a, b] => self.sum::<2>(&[slice(a), slice(b)], [*a, *b, *b], lanes),
            [a, b, c] => self.sum::<3>(&[slice(a), slice(b), slice(c)], [*a, *b, *c], lanes),
            _ => unreachable!("at most {FACTORS_MAX} factors are compiled"),
        }
    }

    /// A sparse block: gathers each factor's selected values first (from the narrow copy when
    /// there is one, so the scattered reads touch 1–2 bytes per row instead of a cache line of
    /// an i64 column the filters did not stream), then sums them as a dense block.
    fn sum_gathered(&self, factors: &[Factor], columns: &[ColumnChunk], gathered: &mut [i64], lanes: &mut [i64]) {
        let count = self.selection.len();
        for (factor, out) in factors.iter().zip(gathered.chunks_mut(BLOCK_ROWS)) {
            gather_factor(&columns[factor.column], self.start, self.selection, &mut out[..count]);
        }
        let block =
            Block { start: 0, mask: &ALL_SELECTED[..count], selection: &[], group_ids: self.group_ids, dense: true };
        let values = |k: usize| &gathered[k * BLOCK_ROWS..k * BLOCK_ROWS + count];
        match factors {
            [a] => block.sum::<1>(&[values(0)], [*a, *a, *a], lanes),
            [a, b] => block.sum::<2>(&[values(0), values(1)], [*a, *b, *b], lanes),
            [a, b, c] => block.sum::<3>(&[values(0), values(1), values(2)], [*a, *b, *c], lanes),
            _ => unreachable!("at most {FACTORS_MAX} factors are compiled"),
        }
    }

    /// Σ Π(offset + sign·column) per group into `lanes`, in 64-bit arithmetic (the caller
    /// proved with the zone maps that it cannot overflow). N = 0 counts rows.
    #[inline(always)]
    fn sum<const N: usize>(&self, columns: &[&[i64]], factors: [Factor; 3], lanes: &mut [i64]) {
        let term = |row: usize| -> i64 {
            let mut product = 1i64;
            for k in 0..N {
                product *= factors[k].offset + factors[k].sign * columns[k][row];
            }
            product
        };
        if self.dense {
            for (row, (&group, &keep)) in self.group_ids.iter().zip(self.mask).enumerate() {
                lanes[group as usize * LANES + (row & (LANES - 1))] += term(row) * i64::from(keep);
            }
        } else {
            for (i, (&group, &row)) in self.group_ids.iter().zip(self.selection).enumerate() {
                lanes[group as usize * LANES + (i & (LANES - 1))] += term(row as usize);
            }
        }
    }
}

/// The i64 values of the selected rows of a factor column.
fn gather_factor(column: &ColumnChunk, start: usize, selection: &[u32], out: &mut [i64]) {
    fn gather<T: Copy>(values: &[T], selection: &[u32], out: &mut [i64], widen: impl Fn(T) -> i64) {
        for (o, &row) in out.iter_mut().zip(selection) {
            *o = widen(values[row as usize]);
        }
    }
    let base = column.min_max.map_or(0, |(min, _)| min);
    match (&column.narrow, &column.data) {
        (Some(NarrowCopy::U8(v)), _) => gather(&v[start..], selection, out, |x| base + i64::from(x)),
        (Some(NarrowCopy::U16(v)), _) => gather(&v[start..], selection, out, |x| base + i64::from(x)),
        (None, ChunkData::I64(v)) => gather(&v[start..], selection, out, |x| x),
        _ => unreachable!("factor columns are i64 (checked at compile time)"),
    }
}

fn fold_lanes(lanes: &[i64], totals: &mut [i64]) {
    for (total, group) in totals.iter_mut().zip(lanes.chunks(LANES)) {
        *total += group.iter().sum::<i64>();
    }
}

fn fold_lanes_wide(lanes: &[i64], totals: &mut [i128]) {
    for (total, group) in totals.iter_mut().zip(lanes.chunks(LANES)) {
        *total += group.iter().map(|&v| i128::from(v)).sum::<i128>();
    }
}

/// Whether Σ over one block of Π factors fits in i64, from the chunk's zone maps.
fn fits_i64(factors: &[Factor], columns: &[ColumnChunk]) -> bool {
    let mut bound: i128 = BLOCK_ROWS as i128;
    for factor in factors {
        let Some((lo, hi)) = columns[factor.column].min_max else { return false };
        let at = |v: i64| (i128::from(factor.offset) + i128::from(factor.sign) * i128::from(v)).abs();
        bound = bound.saturating_mul(at(lo).max(at(hi)).max(1));
    }
    bound < i128::from(i64::MAX) / 2
}

fn compact_owned(mask: &[u8]) -> Vec<u32> {
    (0..mask.len() as u32).filter(|&r| mask[r as usize] != 0).collect()
}

/// Compaction: indexes of the set mask bytes, branch-free within 8-byte words; all-zero words
/// (most of them under a selective filter, which is when blocks are compacted) are skipped
/// with one test.
fn compact(mask: &[u8], selection: &mut [u32]) -> usize {
    let mut count = 0;
    let words = mask.chunks_exact(8);
    let tail_start = mask.len() - words.remainder().len();
    for (index, word) in words.enumerate() {
        if u64::from_ne_bytes(word.try_into().expect("chunks_exact yields 8 bytes")) == 0 {
            continue;
        }
        for (offset, &keep) in word.iter().enumerate() {
            selection[count] = (index * 8 + offset) as u32;
            count += keep as usize;
        }
    }
    for (row, &keep) in mask.iter().enumerate().skip(tail_start) {
        selection[count] = row as u32;
        count += keep as usize;
    }
    count
}

/// `mask[i] &= lo ≤ values[i] ≤ hi`, compiled twice: for the baseline CPU and for AVX2,
/// chosen at run time (the workspace builds for baseline x86-64).
fn range_kernel<T: Copy + PartialOrd>(values: &[T], lo: T, hi: T, mask: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2 (checked just above).
        unsafe { range_kernel_avx2(values, lo, hi, mask) };
        return;
    }
    range_kernel_portable(values, lo, hi, mask);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn range_kernel_avx2<T: Copy + PartialOrd>(values: &[T], lo: T, hi: T, mask: &mut [u8]) {
    range_kernel_portable(values, lo, hi, mask);
}

#[inline(always)]
fn range_kernel_portable<T: Copy + PartialOrd>(values: &[T], lo: T, hi: T, mask: &mut [u8]) {
    for (m, &v) in mask.iter_mut().zip(values) {
        *m &= u8::from(v >= lo) & u8::from(v <= hi);
    }
}

/// Number of set mask bytes (AVX2 when available, as above).
fn count_selected(mask: &[u8]) -> usize {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2 (checked just above).
        return unsafe { count_selected_avx2(mask) };
    }
    count_selected_portable(mask)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn count_selected_avx2(mask: &[u8]) -> usize {
    count_selected_portable(mask)
}

#[inline(always)]
fn count_selected_portable(mask: &[u8]) -> usize {
    // Sum in u32 lanes over bounded chunks so the loop vectorizes.
    mask.chunks(255).map(|c| c.iter().map(|&m| u32::from(m)).sum::<u32>() as usize).sum()
}

/// A predicate specialized for one chunk with its zone map: a range the chunk's narrow copy
/// can answer becomes a one- or two-byte range; ranges the zone map decides disappear.
enum ChunkFilter<'p> {
    /// `lo ≤ copy[i] ≤ hi` over the frame-of-reference copy (bounds already shifted by min).
    Narrow {
        column: usize,
        lo: u16,
        hi: u16,
    },
    Full(&'p Predicate),
}

/// The filters to run on one chunk, or `None` when the zone maps prove that no row passes.
fn chunk_filters<'p>(predicates: &'p [Predicate], columns: &[ColumnChunk]) -> Option<Vec<ChunkFilter<'p>>> {
    let mut filters = Vec::with_capacity(predicates.len());
    for predicate in predicates {
        let (column, lo, hi) = match *predicate {
            Predicate::RangeI32 { column, lo, hi } => (column, i64::from(lo), i64::from(hi)),
            Predicate::RangeI64 { column, lo, hi } => (column, lo, hi),
            _ => {
                filters.push(ChunkFilter::Full(predicate));
                continue;
            }
        };
        let Some((min, max)) = columns[column].min_max else {
            filters.push(ChunkFilter::Full(predicate));
            continue;
        };
        if hi < min || lo > max || lo > hi {
            return None;
        }
        if lo <= min && max <= hi {
            continue;
        }
        match &columns[column].narrow {
            // Within [min, max] both shifted bounds fit the copy's type (its span fits).
            Some(_) => filters.push(ChunkFilter::Narrow {
                column,
                lo: (lo.max(min) - min) as u16,
                hi: (hi.min(max) - min) as u16,
            }),
            None => filters.push(ChunkFilter::Full(predicate)),
        }
    }
    Some(filters)
}

impl ChunkFilter<'_> {
    fn apply(&self, columns: &[ColumnChunk], start: usize, end: usize, mask: &mut [u8]) {
        match self {
            ChunkFilter::Narrow { column, lo, hi } => match &columns[*column].narrow {
                Some(NarrowCopy::U8(v)) => range_kernel(&v[start..end], *lo as u8, *hi as u8, mask),
                Some(NarrowCopy::U16(v)) => range_kernel(&v[start..end], *lo, *hi, mask),
                None => unreachable!("chosen only for chunks with a narrow copy"),
            },
            ChunkFilter::Full(predicate) => apply_predicate(predicate, columns, start, end, mask),
        }
    }
}

fn apply_predicate(predicate: &Predicate, columns: &[ColumnChunk], start: usize, end: usize, mask: &mut [u8]) {
    match predicate {
        Predicate::RangeI32 { column, lo, hi } => {
            let ChunkData::I32(v) = &columns[*column].data else { unreachable!("checked at compile time") };
            range_kernel(&v[start..end], *lo, *hi, mask);
        }
        Predicate::RangeI64 { column, lo, hi } => {
            let ChunkData::I64(v) = &columns[*column].data else { unreachable!("checked at compile time") };
            range_kernel(&v[start..end], *lo, *hi, mask);
        }
        Predicate::CodeSet { column, allowed } => {
            let ChunkData::Text(codes) = &columns[*column].data else { unreachable!("checked at compile time") };
            for (m, &code) in mask.iter_mut().zip(&codes[start..end]) {
                *m &= allowed[code as usize];
            }
        }
        Predicate::LessI32 { left, right, or_equal } => {
            let (ChunkData::I32(a), ChunkData::I32(b)) = (&columns[*left].data, &columns[*right].data) else {
                unreachable!("checked at compile time")
            };
            for ((m, &x), &y) in mask.iter_mut().zip(&a[start..end]).zip(&b[start..end]) {
                *m &= u8::from(x < y) | (u8::from(*or_equal) & u8::from(x == y));
            }
        }
    }
}

/// Sums the product of `factors` over the selected rows into per-group i128 sums; one
/// monomorphized loop per factor count.
fn accumulate(
    factors: &[Factor],
    columns: &[ColumnChunk],
    start: usize,
    selection: &[u32],
    group_ids: &[u32],
    sums: &mut [i128],
) {
    let slice = |f: &Factor| -> &[i64] {
        let ChunkData::I64(v) = &columns[f.column].data else { unreachable!("checked at compile time") };
        &v[start..]
    };
    match factors {
        [a] => product_loop::<1>([slice(a), &[], &[]], [*a, *a, *a], selection, group_ids, sums),
        [a, b] => product_loop::<2>([slice(a), slice(b), &[]], [*a, *b, *b], selection, group_ids, sums),
        [a, b, c] => product_loop::<3>([slice(a), slice(b), slice(c)], [*a, *b, *c], selection, group_ids, sums),
        _ => unreachable!("at most {FACTORS_MAX} factors are compiled"),
    }
}

#[inline(always)]
fn product_loop<const N: usize>(
    columns: [&[i64]; 3],
    factors: [Factor; 3],
    selection: &[u32],
    group_ids: &[u32],
    sums: &mut [i128],
) {
    for (&row, &group) in selection.iter().zip(group_ids) {
        let row = row as usize;
        let mut product = i128::from(factors[0].offset + factors[0].sign * columns[0][row]);
        if N >= 2 {
            product *= i128::from(factors[1].offset + factors[1].sign * columns[1][row]);
        }
        if N >= 3 {
            product *= i128::from(factors[2].offset + factors[2].sign * columns[2][row]);
        }
        sums[group as usize] += product;
    }
}

/// Intersects ranges on the same column (`x >= a AND x <= b` becomes one pass over x).
fn merge_ranges(predicates: Vec<Predicate>) -> Vec<Predicate> {
    let mut merged: Vec<Predicate> = Vec::with_capacity(predicates.len());
    for predicate in predicates {
        let existing = merged.iter_mut().find_map(|p| match (p, &predicate) {
            (Predicate::RangeI32 { column: a, lo, hi }, Predicate::RangeI32 { column: b, lo: l, hi: h }) if a == b => {
                *lo = (*lo).max(*l);
                *hi = (*hi).min(*h);
                Some(())
            }
            (Predicate::RangeI64 { column: a, lo, hi }, Predicate::RangeI64 { column: b, lo: l, hi: h }) if a == b => {
                *lo = (*lo).max(*l);
                *hi = (*hi).min(*h);
                Some(())
            }
            _ => None,
        });
        if existing.is_none() {
            merged.push(predicate);
        }
    }
    merged
}

fn constant_i64(expr: &Expr) -> Option<i64> {
    match expr {
        Expr::Literal { value: Value::Int32(v) | Value::Date(v), .. } => Some(i64::from(*v)),
        Expr::Literal { value: Value::Int64(v) | Value::Decimal { value: v, .. }, .. } => Some(*v),
        _ => None,
    }
}

fn compile_predicate(table: &Table, columns: &[usize], conjunct: &Expr) -> Option<Predicate> {
    match conjunct {
        Expr::Binary { op, left, right, .. } if op.is_comparison() => {
            if let (Expr::Column { index: a, data_type: t }, Expr::Column { index: b, .. }) =
                (left.as_ref(), right.as_ref())
            {
                let physical_i32 = matches!(t, DataType::Date | DataType::Int32);
                return match op {
                    BinaryOp::Lt | BinaryOp::LtEq if physical_i32 => Some(Predicate::LessI32 {
                        left: columns[*a],
                        right: columns[*b],
                        or_equal: *op == BinaryOp::LtEq,
                    }),
                    BinaryOp::Gt | BinaryOp::GtEq if physical_i32 => Some(Predicate::LessI32 {
                        left: columns[*b],
                        right: columns[*a],
                        or_equal: *op == BinaryOp::GtEq,
                    }),
                    _ => None,
                };
            }
            let (column, op, constant) = match (left.as_ref(), right.as_ref()) {
                (Expr::Column { index, .. }, c) => (*index, *op, c),
                (c, Expr::Column { index, .. }) => (*index, op.flipped(), c),
                _ => return None,
            };
            compile_comparison(table, columns[column], op, constant, conjunct, columns)
        }
        Expr::InList { expr, .. } | Expr::Like { expr, .. } => code_set(table, columns, expr, conjunct),
        Expr::Not(inner) if matches!(inner.as_ref(), Expr::Like { .. } | Expr::InList { .. }) => {
            let (Expr::Like { expr, .. } | Expr::InList { expr, .. }) = inner.as_ref() else { return None };
            code_set(table, columns, expr, conjunct)
        }
        _ => None,
    }
}

fn compile_comparison(
    table: &Table,
    column: usize,
    op: BinaryOp,
    constant: &Expr,
    conjunct: &Expr,
    columns: &[usize],
) -> Option<Predicate> {
    match table.schema[column].data_type {
        DataType::Text => {
            let Expr::Binary { left, right, .. } = conjunct else { return None };
            let expr = if matches!(left.as_ref(), Expr::Column { .. }) { left } else { right };
            code_set(table, columns, expr, conjunct)
        }
        DataType::Int32 | DataType::Date => {
            let (lo, hi) = bounds(op, constant_i64(constant)?)?;
            let clamp = |v: i64| v.clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32;
            Some(Predicate::RangeI32 { column, lo: clamp(lo), hi: clamp(hi) })
        }
        DataType::Int64 | DataType::Decimal { .. } => {
            let (lo, hi) = bounds(op, constant_i64(constant)?)?;
            Some(Predicate::RangeI64 { column, lo, hi })
        }
        _ => None,
    }
}

/// Inclusive bounds of `column op constant`.
fn bounds(op: BinaryOp, c: i64) -> Option<(i64, i64)> {
    Some(match op {
        BinaryOp::Eq => (c, c),
        BinaryOp::Lt => (i64::MIN, c.checked_sub(1)?),
        BinaryOp::LtEq => (i64::MIN, c),
        BinaryOp::Gt => (c.checked_add(1)?, i64::MAX),
        BinaryOp::GtEq => (c, i64::MAX),
        _ => return None,
    })
}

/// Evaluates a predicate over a text column once per dictionary entry, with the interpreter
/// (so both tiers agree by construction).
fn code_set(table: &Table, columns: &[usize], expr: &Expr, conjunct: &Expr) -> Option<Predicate> {
    let Expr::Column { index, data_type: DataType::Text } = expr else { return None };
    if conjunct.columns() != vec![*index] {
        return None;
    }
    let column = columns[*index];
    let dictionary = Arc::clone(table.dictionaries[column].as_ref()?);
    let codes: Vec<u32> = (0..dictionary.len() as u32).collect();
    let rows = codes.len();
    // Only column `index` is read by the conjunct; the others are placeholders.
    let mut batch_columns: Vec<Vector> =
        (0..=*index).map(|_| Vector::broadcast(&Value::Null, DataType::Bool, rows)).collect();
    batch_columns[*index] = Vector { data_type: DataType::Text, data: Data::Text(codes, dictionary), validity: None };
    let result = evaluate(conjunct, &Batch::new(batch_columns, rows)).ok()?;
    let Data::Bool(values) = &result.data else { return None };
    let allowed = values.iter().enumerate().map(|(i, &v)| u8::from(v && result.is_valid(i))).collect();
    Some(Predicate::CodeSet { column, allowed })
}

fn compile_call(table: &Table, columns: &[usize], call: &AggregateCall) -> Option<CompiledCall> {
    if call.distinct || call.filter.is_some() {
        return None;
    }
    let factors = match (call.function, &call.argument) {
        (AggregateFunction::CountStar, None) => Vec::new(),
        (AggregateFunction::Sum | AggregateFunction::Avg, Some(argument)) => {
            if !matches!(argument.data_type(), DataType::Int64 | DataType::Decimal { .. }) {
                return None;
            }
            let mut factors = Vec::new();
            collect_factors(table, columns, argument, &mut factors)?;
            if factors.is_empty() || factors.len() > FACTORS_MAX {
                return None;
            }
            factors
        }
        _ => return None,
    };
    Some(CompiledCall { call: call.clone(), factors })
}

/// Flattens a product of `column`, `c ± column` and `column ± c` factors over i64 columns.
fn collect_factors(table: &Table, columns: &[usize], expr: &Expr, out: &mut Vec<Factor>) -> Option<()> {
    let i64_column = |index: usize| -> Option<usize> {
        let column = columns[index];
        matches!(table.schema[column].data_type, DataType::Int64 | DataType::Decimal { .. }).then_some(column)
    };
    match expr {
        Expr::Binary { op: BinaryOp::Mul, left, right, .. } => {
            collect_factors(table, columns, left, out)?;
            collect_factors(table, columns, right, out)
        }
        Expr::Column { index, .. } => {
            out.push(Factor { column: i64_column(*index)?, offset: 0, sign: 1 });
            Some(())
        }
        Expr::Binary { op: op @ (BinaryOp::Add | BinaryOp::Sub), left, right, .. } => {
            let (constant, column, sign) = match (left.as_ref(), right.as_ref()) {
                (c, Expr::Column { index, .. }) => {
                    (constant_i64(c)?, *index, if *op == BinaryOp::Sub { -1 } else { 1 })
                }
                (Expr::Column { index, .. }, c) => {
                    let c = constant_i64(c)?;
                    (if *op == BinaryOp::Sub { c.checked_neg()? } else { c }, *index, 1)
                }
                _ => return None,
            };
            out.push(Factor { column: i64_column(column)?, offset: constant, sign });
            Some(())
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: compaction lists exactly the set mask bytes in order, for sparse, dense, empty and
    // ragged (non-multiple-of-8) blocks; method: compare with a plain filter over masks made
    // by a small LCG at several densities and lengths.
    #[test]
    fn compact_lists_the_set_rows_in_order() {
        let mut state = 12345u64;
        for length in [0, 1, 7, 8, 9, 63, 1000, BLOCK_ROWS] {
            for density_percent in [0, 2, 30, 100] {
                let mask: Vec<u8> = (0..length)
                    .map(|_| {
                        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                        u8::from((state >> 33) % 100 < density_percent)
                    })
                    .collect();
                let mut selection = vec![0u32; BLOCK_ROWS];
                let count = compact(&mask, &mut selection);
                let expected: Vec<u32> = (0..length as u32).filter(|&r| mask[r as usize] == 1).collect();
                assert_eq!(&selection[..count], &expected[..], "length {length}, density {density_percent}%");
            }
        }
    }
}
