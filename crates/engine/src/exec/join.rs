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
/// Candidate pairs between two cancel/memory checks.
const CHECK_EVERY_PAIRS: usize = 1 << 16;

/// Matching (probe row, build row) pairs of one probe batch, and which probe rows had a NULL key.
struct Candidates {
    probe_rows: Vec<u32>,
    build_rows: Vec<u32>,
    has_null: Vec<bool>,
}

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
    pub fn build(
        runtime: &Runtime,
        kind: JoinKind,
        build: Batch,
        build_keys: &[Expr],
        probe_keys: Vec<Expr>,
        residual: Option<Expr>,
    ) -> Result<JoinTable> {
        if build.rows > BUILD_ROWS_MAX {
            return Err(EngineError::LimitExceeded(format!("hash join build side above {BUILD_ROWS_MAX} rows")));
        }
        let types: Vec<DataType> = build_keys.iter().map(Expr::data_type).collect();
        let encoder = KeyEncoder::new(types);
        let key_vectors = build_keys.iter().map(|k| evaluate(k, &build)).collect::<Result<Vec<_>>>()?;
        let mut words = Vec::new();
        let has_null = encoder.encode(&mut KeyCache::default(), &key_vectors, build.rows, false, &mut words);
        let width = build_keys.len();
        let hashes: Vec<u64> = (0..build.rows).map(|r| hash_words(&words[r * width..(r + 1) * width])).collect();
        let partitions = (build.rows / PARTITION_ROWS).next_power_of_two().min(PARTITIONS_MAX);
        let partition_mask = partitions as u64 - 1;
        let mut members: Vec<Vec<u32>> = vec![Vec::new(); partitions];
        for (row, hash) in hashes.iter().enumerate() {
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

    /// Matching build rows for every probe row: (probe row, build row) pairs.
    fn candidate_pairs(&self, cache: &mut KeyCache, batch: &Batch, stop_at_first: bool) -> Result<Candidates> {
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
                if probe_rows.len() % CHECK_EVERY_PAIRS == 0 {
                    // A low-cardinality key can make one probe vector produce billions of pairs.
                    crate::control::check()?;
                }
                if stop_at_first {
                    break;
                }
            }
        }
        Ok(Candidates { probe_rows, build_rows, has_null })
    }

    /// Joins one probe batch; appends output batches to `out`.
    pub fn probe(&self, cache: &mut KeyCache, batch: &Batch, out: &mut Vec<Batch>) -> Result<()> {
        let stop_at_first =
            matches!(self.kind, JoinKind::Semi | JoinKind::Anti | JoinKind::NullAwareAnti) && self.residual.is_none();
        let candidates = self.candidate_pairs(cache, batch, stop_at_first)?;
        let has_null = candidates.has_null;
        let (probe_rows, build_rows) = self.apply_residual(batch, candidates.probe_rows, candidates.build_rows)?;
        match self.kind {
            JoinKind::RightSemi | JoinKind::RightAnti => {
                return Err(EngineError::Runtime(
                    "a right semi/anti join marks its build side, it has no probe".into(),
                ));
            }
            JoinKind::Inner => {
                for (p, b) in probe_rows.chunks(JOIN_OUTPUT_ROWS_MAX).zip(build_rows.chunks(JOIN_OUTPUT_ROWS_MAX)) {
                    out.push(self.pair_batch(batch, p, b));
                }
            }
            JoinKind::Semi | JoinKind::Anti => {
                let mut matched = vec![false; batch.rows];
                probe_rows.iter().for_each(|&p| matched[p as usize] = true);
                let want = self.kind == JoinKind::Semi;
                let rows: Vec<u32> = (0..batch.rows as u32).filter(|&r| matched[r as usize] == want).collect();
                if !rows.is_empty() {
                    out.push(batch.gather(&rows));
                }
            }
            JoinKind::Left => self.left_output(batch, &probe_rows, &build_rows, out),
            JoinKind::NullAwareAnti => {
                if self.build.rows == 0 {
                    out.push(batch.clone());
                    return Ok(());
                }
                if self.build_has_null {
                    return Ok(());
                }
                let mut matched = vec![false; batch.rows];
                probe_rows.iter().for_each(|&p| matched[p as usize] = true);
                let rows: Vec<u32> =
                    (0..batch.rows as u32).filter(|&r| !matched[r as usize] && !has_null[r as usize]).collect();
                if !rows.is_empty() {
                    out.push(batch.gather(&rows));
                }
            }
        }
        Ok(())
    }

    /// Right semi/anti joins: marks the build rows that some row of `batch` matches (and
    /// passes the residual with).
    pub fn mark(&self, cache: &mut KeyCache, batch: &Batch, marked: &mut [bool]) -> Result<()> {
        let candidates = self.candidate_pairs(cache, batch, false)?;
        let (_, build_rows) = self.apply_residual(batch, candidates.probe_rows, candidates.build_rows)?;
        build_rows.iter().for_each(|&b| marked[b as usize] = true);
        Ok(())
    }

    /// The build rows whose mark is `want` (right semi: marked, right anti: not marked).
    pub fn build_rows_marked(&self, marked: &[bool], want: bool) -> Batch {
        let rows: Vec<u32> = (0..self.build.rows as u32).filter(|&r| marked[r as usize] == want).collect();
        self.build.gather(&rows)
    }

    fn apply_residual(
        &self,
        batch: &Batch,
        probe_rows: Vec<u32>,
        build_rows: Vec<u32>,
    ) -> Result<(Vec<u32>, Vec<u32>)> {
        let Some(residual) = &self.residual else {
            return Ok((probe_rows, build_rows));
        };
        let (mut kept_probe, mut kept_build) = (Vec::new(), Vec::new());
        for (p, b) in probe_rows.chunks(JOIN_OUTPUT_ROWS_MAX).zip(build_rows.chunks(JOIN_OUTPUT_ROWS_MAX)) {
            let pairs = self.pair_batch(batch, p, b);
            let result = evaluate(residual, &pairs)?;
            let Data::Bool(values) = &result.data else {
                return Err(EngineError::Type("join condition is not boolean".into()));
            };
            for i in 0..p.len() {
                if values[i] && result.is_valid(i) {
                    kept_probe.push(p[i]);
                    kept_build.push(b[i]);
                }
            }
        }
        Ok((kept_probe, kept_build))
    }

    fn pair_batch(&self, batch: &Batch, probe_rows: &[u32], build_rows: &[u32]) -> Batch {
        let mut columns: Vec<Vector> = batch.columns.iter().map(|c| c.gather(probe_rows)).collect();
        columns.extend(self.build.columns.iter().map(|c| c.gather(build_rows)));
        Batch::new(columns, probe_rows.len())
    }

    fn left_output(&self, batch: &Batch, probe_rows: &[u32], build_rows: &[u32], out: &mut Vec<Batch>) {
        let mut matched = vec![false; batch.rows];
        probe_rows.iter().for_each(|&p| matched[p as usize] = true);
        let mut all_probe: Vec<u32> = probe_rows.to_vec();
        let mut all_build: Vec<Option<u32>> = build_rows.iter().map(|&b| Some(b)).collect();
        for row in (0..batch.rows as u32).filter(|&r| !matched[r as usize]) {
            all_probe.push(row);
            all_build.push(None);
        }
        for (p, b) in all_probe.chunks(JOIN_OUTPUT_ROWS_MAX).zip(all_build.chunks(JOIN_OUTPUT_ROWS_MAX)) {
            let mut columns: Vec<Vector> = batch.columns.iter().map(|c| c.gather(p)).collect();
            columns.extend(self.build.columns.iter().map(|c| c.gather_optional(b)));
            out.push(Batch::new(columns, p.len()));
        }
    }
}
