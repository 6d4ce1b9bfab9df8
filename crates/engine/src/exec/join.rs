//! Hash join: the build side is materialized and hashed once; probe batches stream through.

use hashbrown::HashTable;

use super::keys::{hash_words, KeyCache, KeyEncoder};
use crate::error::{EngineError, Result};
use crate::expr::{evaluate, Expr};
use crate::plan::JoinKind;
use crate::types::DataType;
use crate::vector::{Batch, Data, Vector};

/// Output rows per batch produced by a probe (bounds the memory of one probe step).
pub const JOIN_OUTPUT_ROWS_MAX: usize = 8192;
/// Rows a build side may hold.
pub const BUILD_ROWS_MAX: usize = 1 << 30;
const NO_ROW: u32 = u32::MAX;
/// Candidate pairs between two cancel/memory checks.
const CHECK_EVERY_PAIRS: usize = 1 << 16;

/// Matching (probe row, build row) pairs of one probe batch, and which probe rows had a NULL key.
struct Candidates {
    probe_rows: Vec<u32>,
    build_rows: Vec<u32>,
    has_null: Vec<bool>,
}

/// The hashed build side.
pub struct JoinTable {
    pub kind: JoinKind,
    build: Batch,
    encoder: KeyEncoder,
    width: usize,
    keys: Vec<u64>,
    /// First build row per distinct key.
    heads: HashTable<u32>,
    /// Next build row with the same key (a chain per key).
    next: Vec<u32>,
    probe_keys: Vec<Expr>,
    residual: Option<Expr>,
    /// Whether some build row has a NULL key (NOT IN then matches nothing).
    build_has_null: bool,
}

impl JoinTable {
    pub fn build(
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
        let mut keys = Vec::new();
        let has_null = encoder.encode(&mut KeyCache::default(), &key_vectors, build.rows, false, &mut keys);
        let width = build_keys.len();
        let mut heads: HashTable<u32> = HashTable::with_capacity(build.rows);
        let mut next = vec![NO_ROW; build.rows];
        for row in 0..build.rows {
            if row % super::CHECK_EVERY_ROWS == 0 {
                crate::control::check()?;
            }
            if has_null[row] {
                continue;
            }
            let words = &keys[row * width..(row + 1) * width];
            let hash = hash_words(words);
            let found = heads.find_mut(hash, |&r| &keys[r as usize * width..(r as usize + 1) * width] == words);
            match found {
                Some(head) => {
                    next[row] = *head;
                    *head = row as u32;
                }
                None => {
                    heads.insert_unique(hash, row as u32, |&r| {
                        hash_words(&keys[r as usize * width..(r as usize + 1) * width])
                    });
                }
            }
        }
        let build_has_null = has_null.iter().any(|&n| n);
        Ok(JoinTable { kind, build, encoder, width, keys, heads, next, probe_keys, residual, build_has_null })
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
            let keys = &self.keys;
            let Some(&head) =
                self.heads.find(hash_words(key), |&r| &keys[r as usize * width..(r as usize + 1) * width] == key)
            else {
                continue;
            };
            let mut build_row = head;
            while build_row != NO_ROW {
                probe_rows.push(row as u32);
                build_rows.push(build_row);
                if probe_rows.len() % CHECK_EVERY_PAIRS == 0 {
                    // A low-cardinality key can make one probe vector produce billions of pairs.
                    crate::control::check()?;
                }
                if stop_at_first {
                    break;
                }
                build_row = self.next[build_row as usize];
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
