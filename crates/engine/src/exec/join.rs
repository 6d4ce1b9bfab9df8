//! Hash join: the build side is materialized and hashed once; probe batches stream through.

use std::sync::Mutex;

use hashbrown::HashTable;

use super::keys::{hash_words, same_key, KeyCache, KeyEncoder};
use crate::error::{EngineError, Result};
use crate::expr::{evaluate, Expr};
use crate::plan::JoinKind;
use crate::runtime::Runtime;
use crate::types::DataType;
use crate::vector::{Batch, Data, Vector};

/// Output rows per batch produced by a probe (bounds the memory of one probe step).
pub const JOIN_OUTPUT_ROWS_MAX: usize = 8192;
/// Rows a build side may hold.
pub const BUILD_ROWS_MAX: usize = 1 << 30;
/// Candidate pairs a probe step holds before it hands them on (and checks the statement's
/// control): a 7-value key joins each probe row with ~850K build rows at SF 1, and pairs
/// gathered for a whole probe vector grew by reallocations of gigabytes that no check could
/// interrupt.
const PAIRS_PER_FLUSH: usize = JOIN_OUTPUT_ROWS_MAX * 4;

/// Where a probe hands (probe rows, build rows) pairs, in equal-length slices.
type PairSink<'a> = dyn FnMut(&[u32], &[u32]) -> Result<()> + 'a;

/// The hashed build side, in partitions by the keys' hash: each partition's rows are hashed
/// into a table of their own, small enough to stay in cache while it is built, and the
/// partitions are built on all workers.
pub struct JoinTable {
    pub kind: JoinKind,
    build: Batch,
    encoder: KeyEncoder,
    width: usize,
    partitions: Vec<Partition>,
    /// `hash >> shift & mask` is a row's partition: middle bits of the hash, as hashbrown uses
    /// the low ones (bucket) and the top seven (tag) within a table.
    partition_mask: u64,
    probe_keys: Vec<Expr>,
    residual: Option<Expr>,
    /// Whether some build row has a NULL key (NOT IN then matches nothing).
    build_has_null: bool,
    /// One-column keys within a small range: the build keys as a bitmap.
    bitmap: Option<KeyBitmap>,
}

/// The build keys of a one-word key as a bitmap over `min..min + span`: a probe key outside
/// it or with its bit clear has no match, found without hashing. Most probe rows of a
/// selective join miss (TPC-H Q17 probes 6M lineitems against ~200 parts, Q5 against a year
/// of orders), and a miss in the hash table costs a hash and a probe sequence.
struct KeyBitmap {
    min: i64,
    bits: Vec<u64>,
}

/// Widest key range a bitmap covers (1 MiB of bits: SF 1's order keys fit).
const BITMAP_SPAN_MAX: u64 = 1 << 23;

impl KeyBitmap {
    fn of(words: &[u64], has_null: &[bool]) -> Option<KeyBitmap> {
        let keys = || words.iter().zip(has_null).filter(|(_, &null)| !null).map(|(&w, _)| w as i64);
        let (min, max) = keys()
            .fold(None, |range: Option<(i64, i64)>, k| Some(range.map_or((k, k), |(lo, hi)| (lo.min(k), hi.max(k)))))?;
        let span = u64::try_from(i128::from(max) - i128::from(min) + 1).ok().filter(|&s| s <= BITMAP_SPAN_MAX)?;
        let mut bits = vec![0u64; span.div_ceil(64) as usize];
        for key in keys() {
            let offset = key.wrapping_sub(min) as u64;
            bits[(offset / 64) as usize] |= 1 << (offset % 64);
        }
        Some(KeyBitmap { min, bits })
    }

    #[inline]
    fn may_contain(&self, word: u64) -> bool {
        let offset = (word as i64).wrapping_sub(self.min) as u64;
        self.bits.get((offset / 64) as usize).is_some_and(|w| w & (1 << (offset % 64)) != 0)
    }
}

/// One partition: its build rows grouped by key (a key's rows are contiguous, so a probe
/// reads one run instead of walking a chain of random accesses) and its distinct keys.
struct Partition {
    /// Build rows, the rows of distinct key `d` at `rows[starts[d]..starts[d + 1]]`.
    rows: Vec<u32>,
    starts: Vec<u32>,
    /// Distinct keys' words, `width` per key.
    keys: Vec<u64>,
    /// Distinct key index by hash.
    table: HashTable<u32>,
}

/// Build rows per partition the partition count aims at (a table of ~32 KiB).
const PARTITION_ROWS: usize = 1 << 13;
/// Most partitions (the mask must stay within the hash's middle bits).
const PARTITIONS_MAX: usize = 1 << 12;
const PARTITION_SHIFT: u32 = 40;

impl Partition {
    fn build(members: Vec<u32>, words: &[u64], hashes: &[u64], width: usize) -> Result<Partition> {
        let mut keys: Vec<u64> = Vec::new();
        let mut key_hashes: Vec<u64> = Vec::new();
        let mut table: HashTable<u32> = HashTable::with_capacity(members.len());
        let mut distinct_of = Vec::with_capacity(members.len());
        let mut counts: Vec<u32> = Vec::new();
        for (local, &row) in members.iter().enumerate() {
            if local % super::CHECK_EVERY_ROWS == 0 {
                crate::control::check()?;
            }
            let hash = hashes[row as usize];
            let key = &words[row as usize * width..(row as usize + 1) * width];
            let found =
                table.find(hash, |&d| same_key(&keys[d as usize * width..(d as usize + 1) * width], key)).copied();
            let distinct = match found {
                Some(d) => d,
                None => {
                    let d = counts.len() as u32;
                    table.insert_unique(hash, d, |&d| key_hashes[d as usize]);
                    keys.extend_from_slice(key);
                    key_hashes.push(hash);
                    counts.push(0);
                    d
                }
            };
            counts[distinct as usize] += 1;
            distinct_of.push(distinct);
        }
        let mut starts = Vec::with_capacity(counts.len() + 1);
        let mut total = 0u32;
        starts.push(0);
        for count in &counts {
            total += count;
            starts.push(total);
        }
        let mut fill: Vec<u32> = starts[..counts.len()].to_vec();
        let mut rows = vec![0u32; members.len()];
        for (&row, &d) in members.iter().zip(&distinct_of) {
            rows[fill[d as usize] as usize] = row;
            fill[d as usize] += 1;
        }
        Ok(Partition { rows, starts, keys, table })
    }

    /// The build rows with `key`.
    fn matches(&self, hash: u64, key: &[u64], width: usize) -> &[u32] {
        let keys = &self.keys;
        match self.table.find(hash, |&d| same_key(&keys[d as usize * width..(d as usize + 1) * width], key)) {
            Some(&d) => &self.rows[self.starts[d as usize] as usize..self.starts[d as usize + 1] as usize],
            None => &[],
        }
    }
}

impl JoinTable {
    /// Hashes the build side, given as the batches its plan produced. Keys are evaluated,
    /// encoded and hashed batch by batch, with the statement's control checked between them:
    /// at SF 1 a 6M-row build side touches ~250 MB of fresh memory, whose page faults alone
    /// took ~300 ms that a single pass over the concatenated side could not interrupt.
    pub fn build(
        runtime: &Runtime,
        kind: JoinKind,
        batches: Vec<Batch>,
        types: &[DataType],
        build_keys: &[Expr],
        probe_keys: Vec<Expr>,
        residual: Option<Expr>,
    ) -> Result<JoinTable> {
        let rows: usize = batches.iter().map(|b| b.rows).sum();
        if rows > BUILD_ROWS_MAX {
            return Err(EngineError::LimitExceeded(format!("hash join build side above {BUILD_ROWS_MAX} rows")));
        }
        let encoder = KeyEncoder::new(build_keys.iter().map(Expr::data_type).collect());
        let width = build_keys.len();
        let (mut words, mut hashes, mut has_null) =
            (Vec::with_capacity(rows * width), Vec::with_capacity(rows), Vec::with_capacity(rows));
        let mut cache = KeyCache::default();
        let mut build = Batch::new(types.iter().map(|&t| Vector::empty(t)).collect(), 0);
        for batch in batches {
            crate::control::check()?;
            let key_vectors = build_keys.iter().map(|k| evaluate(k, &batch)).collect::<Result<Vec<_>>>()?;
            let start = words.len();
            has_null.extend(encoder.encode(&mut cache, &key_vectors, batch.rows, false, &mut words));
            hashes.extend(words[start..].chunks_exact(width.max(1)).map(hash_words));
            build.columns.iter_mut().zip(&batch.columns).for_each(|(column, other)| column.append(other));
            build.rows += batch.rows;
        }
        if width == 0 {
            hashes.resize(rows, hash_words(&[]));
        }
        let partitions = (rows / PARTITION_ROWS).next_power_of_two().min(PARTITIONS_MAX);
        let partition_mask = partitions as u64 - 1;
        let mut members: Vec<Vec<u32>> = vec![Vec::new(); partitions];
        for (row, hash) in hashes.iter().enumerate() {
            if row % super::CHECK_EVERY_ROWS == 0 {
                crate::control::check()?;
            }
            if !has_null[row] {
                members[(hash >> PARTITION_SHIFT & partition_mask) as usize].push(row as u32);
            }
        }
        let slots: Vec<Mutex<Option<Partition>>> = (0..partitions).map(|_| Mutex::new(None)).collect();
        let members: Vec<Mutex<Vec<u32>>> = members.into_iter().map(Mutex::new).collect();
        runtime.run_morsels(partitions, |_, p| {
            let rows = std::mem::take(&mut *members[p].lock().unwrap_or_else(|e| e.into_inner()));
            let partition = Partition::build(rows, &words, &hashes, width)?;
            *slots[p].lock().unwrap_or_else(|e| e.into_inner()) = Some(partition);
            Ok(())
        })?;
        let partitions = slots
            .into_iter()
            .map(|s| s.into_inner().unwrap_or_else(|e| e.into_inner()).expect("every partition is built"))
            .collect();
        let build_has_null = has_null.iter().any(|&n| n);
        let bitmap = if width == 1 { KeyBitmap::of(&words, &has_null) } else { None };
        Ok(JoinTable {
            kind,
            build,
            encoder,
            width,
            partitions,
            partition_mask,
            probe_keys,
            residual,
            build_has_null,
            bitmap,
        })
    }

    pub fn build_rows(&self) -> usize {
        self.build.rows
    }

    /// Calls `flush` with the (probe row, build row) pairs of `batch` whose keys are equal and
    /// that pass the residual, at most `PAIRS_PER_FLUSH` at a time; returns which probe rows
    /// have a NULL key. With `stop_at_first`, a probe row's first match ends its search.
    fn for_each_match(
        &self,
        cache: &mut KeyCache,
        batch: &Batch,
        stop_at_first: bool,
        flush: &mut PairSink<'_>,
    ) -> Result<Vec<bool>> {
        let key_vectors = self.probe_keys.iter().map(|k| evaluate(k, batch)).collect::<Result<Vec<_>>>()?;
        let mut words = Vec::with_capacity(batch.rows * self.width);
        let has_null = self.encoder.encode(cache, &key_vectors, batch.rows, false, &mut words);
        let (mut probe_rows, mut build_rows) = (Vec::new(), Vec::new());
        let width = self.width;
        for row in 0..batch.rows {
            if has_null[row] {
                continue;
            }
            let key = &words[row * width..(row + 1) * width];
            if self.bitmap.as_ref().is_some_and(|bitmap| !bitmap.may_contain(key[0])) {
                continue;
            }
            let hash = hash_words(key);
            let partition = &self.partitions[(hash >> PARTITION_SHIFT & self.partition_mask) as usize];
            for &build_row in partition.matches(hash, key, width) {
                probe_rows.push(row as u32);
                build_rows.push(build_row);
                if probe_rows.len() == PAIRS_PER_FLUSH {
                    crate::control::check()?;
                    self.flush_pairs(batch, &mut probe_rows, &mut build_rows, flush)?;
                }
                if stop_at_first {
                    break;
                }
            }
        }
        self.flush_pairs(batch, &mut probe_rows, &mut build_rows, flush)?;
        Ok(has_null)
    }

    /// Hands the pairs that pass the residual to `flush` and empties both lists.
    fn flush_pairs(
        &self,
        batch: &Batch,
        probe_rows: &mut Vec<u32>,
        build_rows: &mut Vec<u32>,
        flush: &mut PairSink<'_>,
    ) -> Result<()> {
        if let Some(residual) = &self.residual {
            self.retain_residual(batch, residual, probe_rows, build_rows)?;
        }
        if !probe_rows.is_empty() {
            flush(probe_rows, build_rows)?;
        }
        probe_rows.clear();
        build_rows.clear();
        Ok(())
    }

    /// Keeps the pairs for which the residual is true (not false, not NULL), in order.
    fn retain_residual(
        &self,
        batch: &Batch,
        residual: &Expr,
        probe_rows: &mut Vec<u32>,
        build_rows: &mut Vec<u32>,
    ) -> Result<()> {
        let mut kept = 0;
        for start in (0..probe_rows.len()).step_by(JOIN_OUTPUT_ROWS_MAX) {
            let end = (start + JOIN_OUTPUT_ROWS_MAX).min(probe_rows.len());
            let pairs = self.pair_batch(batch, &probe_rows[start..end], &build_rows[start..end]);
            let result = evaluate(residual, &pairs)?;
            let Data::Bool(values) = &result.data else {
                return Err(EngineError::Type("join condition is not boolean".into()));
            };
            for i in 0..end - start {
                if values[i] && result.is_valid(i) {
                    probe_rows[kept] = probe_rows[start + i];
                    build_rows[kept] = build_rows[start + i];
                    kept += 1;
                }
            }
        }
        probe_rows.truncate(kept);
        build_rows.truncate(kept);
        Ok(())
    }

    /// Joins one probe batch; hands each output batch to `out` as soon as it is made, so a
    /// probe step holds at most `PAIRS_PER_FLUSH` pairs whatever the keys' fan-out.
    pub fn probe(&self, cache: &mut KeyCache, batch: &Batch, out: &mut dyn FnMut(Batch) -> Result<()>) -> Result<()> {
        match self.kind {
            JoinKind::RightSemi | JoinKind::RightAnti => {
                return Err(EngineError::Runtime(
                    "a right semi/anti join marks its build side, it has no probe".into(),
                ));
            }
            JoinKind::Inner => {
                self.for_each_match(cache, batch, false, &mut |p, b| self.emit_pairs(batch, p, b, out))?;
            }
            JoinKind::Semi | JoinKind::Anti => {
                let (matched, _) = self.matched_rows(cache, batch)?;
                let want = self.kind == JoinKind::Semi;
                emit_rows(batch, |r| matched[r] == want, out)?;
            }
            JoinKind::Left => {
                let mut matched = vec![false; batch.rows];
                self.for_each_match(cache, batch, false, &mut |p, b| {
                    p.iter().for_each(|&row| matched[row as usize] = true);
                    self.emit_pairs(batch, p, b, out)
                })?;
                self.emit_unmatched(batch, &matched, out)?;
            }
            JoinKind::NullAwareAnti => {
                if self.build.rows == 0 {
                    return out(batch.clone());
                }
                if self.build_has_null {
                    return Ok(());
                }
                let (matched, has_null) = self.matched_rows(cache, batch)?;
                emit_rows(batch, |r| !matched[r] && !has_null[r], out)?;
            }
        }
        Ok(())
    }

    /// Semi/anti joins: which probe rows have a match (the first one ends a row's search when
    /// there is no residual), and which have a NULL key.
    fn matched_rows(&self, cache: &mut KeyCache, batch: &Batch) -> Result<(Vec<bool>, Vec<bool>)> {
        let mut matched = vec![false; batch.rows];
        let has_null = self.for_each_match(cache, batch, self.residual.is_none(), &mut |p, _| {
            p.iter().for_each(|&row| matched[row as usize] = true);
            Ok(())
        })?;
        Ok((matched, has_null))
    }

    /// Right semi/anti joins: marks the build rows that some row of `batch` matches (and
    /// passes the residual with).
    pub fn mark(&self, cache: &mut KeyCache, batch: &Batch, marked: &mut [bool]) -> Result<()> {
        self.for_each_match(cache, batch, false, &mut |_, build_rows| {
            build_rows.iter().for_each(|&b| marked[b as usize] = true);
            Ok(())
        })?;
        Ok(())
    }

    /// The build rows whose mark is `want` (right semi: marked, right anti: not marked).
    pub fn build_rows_marked(&self, marked: &[bool], want: bool) -> Batch {
        let rows: Vec<u32> = (0..self.build.rows as u32).filter(|&r| marked[r as usize] == want).collect();
        self.build.gather(&rows)
    }

    /// The joined rows of `pairs`, in batches of at most `JOIN_OUTPUT_ROWS_MAX`.
    fn emit_pairs(
        &self,
        batch: &Batch,
        probe_rows: &[u32],
        build_rows: &[u32],
        out: &mut dyn FnMut(Batch) -> Result<()>,
    ) -> Result<()> {
        for (p, b) in probe_rows.chunks(JOIN_OUTPUT_ROWS_MAX).zip(build_rows.chunks(JOIN_OUTPUT_ROWS_MAX)) {
            out(self.pair_batch(batch, p, b))?;
        }
        Ok(())
    }

    /// A left join's probe rows without a match, with NULL build columns.
    fn emit_unmatched(&self, batch: &Batch, matched: &[bool], out: &mut dyn FnMut(Batch) -> Result<()>) -> Result<()> {
        let unmatched: Vec<u32> = (0..batch.rows as u32).filter(|&r| !matched[r as usize]).collect();
        for rows in unmatched.chunks(JOIN_OUTPUT_ROWS_MAX) {
            let nulls = vec![None; rows.len()];
            let mut columns: Vec<Vector> = batch.columns.iter().map(|c| c.gather(rows)).collect();
            columns.extend(self.build.columns.iter().map(|c| c.gather_optional(&nulls)));
            out(Batch::new(columns, rows.len()))?;
        }
        Ok(())
    }

    fn pair_batch(&self, batch: &Batch, probe_rows: &[u32], build_rows: &[u32]) -> Batch {
        let mut columns: Vec<Vector> = batch.columns.iter().map(|c| c.gather(probe_rows)).collect();
        columns.extend(self.build.columns.iter().map(|c| c.gather(build_rows)));
        Batch::new(columns, probe_rows.len())
    }
}

/// The rows of `batch` that `keep` selects, in batches of at most `JOIN_OUTPUT_ROWS_MAX`.
fn emit_rows(batch: &Batch, keep: impl Fn(usize) -> bool, out: &mut dyn FnMut(Batch) -> Result<()>) -> Result<()> {
    let rows: Vec<u32> = (0..batch.rows as u32).filter(|&r| keep(r as usize)).collect();
    if rows.len() == batch.rows && !rows.is_empty() {
        return out(batch.clone());
    }
    for chunk in rows.chunks(JOIN_OUTPUT_ROWS_MAX) {
        out(batch.gather(chunk))?;
    }
    Ok(())
}
