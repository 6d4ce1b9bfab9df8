//! Sorting: keys normalized to integers or floats, then a row-oriented comparison sort, a
//! counting sort for one small-domain key, or top-k selection when a LIMIT bounds the output.

use std::cmp::Ordering;

use super::CHECK_EVERY_ROWS;
use crate::error::Result;
use crate::expr::evaluate;
use crate::plan::SortKey;
use crate::vector::{Batch, Data, Vector};

/// Largest key range a counting sort handles (its count array).
pub const COUNTING_SORT_DOMAIN_MAX: usize = 1 << 16;

/// A sort key as comparable numbers: integers (text as dictionary rank) or floats.
enum Normalized {
    Int(Vec<i64>),
    Float(Vec<f64>),
    Numeric(Vec<crate::numeric::Numeric>),
}

struct Key {
    values: Normalized,
    validity: Option<Vec<bool>>,
    descending: bool,
    nulls_first: bool,
}

fn normalize(vector: &Vector, key: &SortKey) -> Key {
    let values = match &vector.data {
        Data::Bool(v) => Normalized::Int(v.iter().map(|&b| i64::from(b)).collect()),
        Data::I32(v) => Normalized::Int(v.iter().map(|&x| i64::from(x)).collect()),
        Data::I64(v) => Normalized::Int(v.clone()),
        Data::F64(v) => Normalized::Float(v.clone()),
        Data::Numeric(v) => Normalized::Numeric(v.clone()),
        // Intervals order by their span, as PostgreSQL (30-day months, 24-hour days).
        Data::Interval(v) => {
            Normalized::Numeric(v.iter().map(|i| crate::numeric::Numeric::new(i.span_micros(), 0)).collect())
        }
        Data::Text(codes, dictionary) => {
            // Rank each dictionary entry once; codes then compare as ranks.
            let mut order: Vec<u32> = (0..dictionary.len() as u32).collect();
            order.sort_unstable_by(|&a, &b| dictionary.get(a).cmp(dictionary.get(b)));
            let mut rank = vec![0i64; dictionary.len()];
            for (position, &code) in order.iter().enumerate() {
                rank[code as usize] = position as i64;
            }
            Normalized::Int(codes.iter().map(|&c| rank[c as usize]).collect())
        }
    };
    Key { values, validity: vector.validity.clone(), descending: key.descending, nulls_first: key.nulls_first }
}

impl Key {
    fn compare(&self, a: usize, b: usize) -> Ordering {
        if let Some(validity) = &self.validity {
            match (validity[a], validity[b]) {
                (false, false) => return Ordering::Equal,
                (false, true) => return if self.nulls_first { Ordering::Less } else { Ordering::Greater },
                (true, false) => return if self.nulls_first { Ordering::Greater } else { Ordering::Less },
                (true, true) => {}
            }
        }
        let ordering = match &self.values {
            Normalized::Int(v) => v[a].cmp(&v[b]),
            Normalized::Float(v) => v[a].total_cmp(&v[b]),
            Normalized::Numeric(v) => v[a].cmp(&v[b]),
        };
        if self.descending {
            ordering.reverse()
        } else {
            ordering
        }
    }
}

fn compare_rows(keys: &[Key], a: usize, b: usize) -> Ordering {
    for key in keys {
        let ordering = key.compare(a, b);
        if ordering != Ordering::Equal {
            return ordering;
        }
    }
    // Ties keep input order so results are deterministic.
    a.cmp(&b)
}

/// Concatenates batches into one.
pub fn concat(batches: Vec<Batch>, types: &[crate::types::DataType]) -> Batch {
    let mut iter = batches.into_iter();
    let Some(mut first) = iter.next() else {
        return Batch::new(types.iter().map(|&t| Vector::empty(t)).collect(), 0);
    };
    for batch in iter {
        for (column, other) in first.columns.iter_mut().zip(&batch.columns) {
            column.append(other);
        }
        first.rows += batch.rows;
    }
    first
}

/// Sorts `batch` by `keys`; with `limit`, only the first `limit` rows are produced (top-k).
pub fn sort_batch(batch: &Batch, keys: &[SortKey], limit: Option<usize>) -> Result<Batch> {
    let vectors = keys.iter().map(|k| evaluate(&k.expr, batch)).collect::<Result<Vec<_>>>()?;
    let normalized: Vec<Key> = vectors.iter().zip(keys).map(|(v, k)| normalize(v, k)).collect();
    let permutation = match limit {
        Some(k) if k < batch.rows => top_k(&normalized, batch.rows, k)?,
        _ => match counting_sort(&normalized, batch.rows) {
            Some(permutation) => permutation,
            None => comparison_sort(&normalized, batch.rows)?,
        },
    };
    Ok(batch.gather(&permutation))
}

/// Sorts runs of `CHECK_EVERY_ROWS` rows, then merges them pairwise; the statement's control
/// is checked between runs and every `CHECK_EVERY_ROWS` merged rows, so a cancel or timeout
/// stops a long sort quickly. Ties are broken by row number, so the order is total.
fn comparison_sort(keys: &[Key], rows: usize) -> Result<Vec<u32>> {
    let compare = |a: &u32, b: &u32| compare_rows(keys, *a as usize, *b as usize);
    let mut permutation: Vec<u32> = (0..rows as u32).collect();
    for run in permutation.chunks_mut(CHECK_EVERY_ROWS) {
        crate::control::check()?;
        run.sort_unstable_by(compare);
    }
    let mut merged = vec![0u32; rows];
    let mut width = CHECK_EVERY_ROWS;
    while width < rows {
        for start in (0..rows).step_by(2 * width) {
            let (middle, end) = ((start + width).min(rows), (start + 2 * width).min(rows));
            merge(&permutation[start..middle], &permutation[middle..end], &mut merged[start..end], compare)?;
        }
        std::mem::swap(&mut permutation, &mut merged);
        width *= 2;
    }
    Ok(permutation)
}

/// Merges two sorted runs into `out`.
fn merge(left: &[u32], right: &[u32], out: &mut [u32], compare: impl Fn(&u32, &u32) -> Ordering) -> Result<()> {
    let (mut i, mut j) = (0, 0);
    for (written, slot) in out.iter_mut().enumerate() {
        if written % CHECK_EVERY_ROWS == 0 {
            crate::control::check()?;
        }
        let take_left = j == right.len() || (i < left.len() && compare(&left[i], &right[j]) != Ordering::Greater);
        if take_left {
            *slot = left[i];
            i += 1;
        } else {
            *slot = right[j];
            j += 1;
        }
    }
    Ok(())
}

/// The first `k` rows in order: rows stream through a candidate set trimmed back to `k` (with
/// its k-th row as the bar a new row must beat) every `CHECK_EVERY_ROWS` rows.
fn top_k(keys: &[Key], rows: usize, k: usize) -> Result<Vec<u32>> {
    if k == 0 {
        return Ok(Vec::new());
    }
    if k > CHECK_EVERY_ROWS {
        let mut permutation = comparison_sort(keys, rows)?;
        permutation.truncate(k);
        return Ok(permutation);
    }
    let compare = |a: &u32, b: &u32| compare_rows(keys, *a as usize, *b as usize);
    let mut best: Vec<u32> = Vec::with_capacity(k + CHECK_EVERY_ROWS);
    let mut bar: Option<u32> = None;
    for start in (0..rows).step_by(CHECK_EVERY_ROWS) {
        crate::control::check()?;
        let end = (start + CHECK_EVERY_ROWS).min(rows);
        match bar {
            Some(bar) => best.extend((start as u32..end as u32).filter(|row| compare(row, &bar) == Ordering::Less)),
            None => best.extend(start as u32..end as u32),
        }
        if best.len() > k {
            best.select_nth_unstable_by(k - 1, compare);
            best.truncate(k);
            bar = Some(best[k - 1]);
        }
    }
    best.sort_unstable_by(compare);
    Ok(best)
}

/// A stable counting sort when there is one non-null integer key with a small range.
fn counting_sort(keys: &[Key], rows: usize) -> Option<Vec<u32>> {
    let [key] = keys else { return None };
    let Normalized::Int(values) = &key.values else { return None };
    if key.validity.is_some() || rows == 0 {
        return None;
    }
    let (min, max) = values.iter().fold((i64::MAX, i64::MIN), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    let domain = usize::try_from(max.checked_sub(min)?).ok()? + 1;
    if domain > COUNTING_SORT_DOMAIN_MAX || domain > rows {
        return None;
    }
    let bucket = |v: i64| {
        let offset = (v - min) as usize;
        if key.descending {
            domain - 1 - offset
        } else {
            offset
        }
    };
    let mut starts = vec![0usize; domain + 1];
    values.iter().for_each(|&v| starts[bucket(v) + 1] += 1);
    for i in 0..domain {
        starts[i + 1] += starts[i];
    }
    let mut permutation = vec![0u32; rows];
    for (row, &v) in values.iter().enumerate() {
        let slot = &mut starts[bucket(v)];
        permutation[*slot] = row as u32;
        *slot += 1;
    }
    Some(permutation)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::expr::Expr;
    use crate::types::DataType;

    fn int_batch(values: &[i64]) -> Batch {
        let vector = Vector { data_type: DataType::Int64, data: Data::I64(values.to_vec()), validity: None };
        Batch::new(vec![vector], values.len())
    }

    fn column(batch: &Batch) -> Vec<i64> {
        match &batch.columns[0].data {
            Data::I64(v) => v.clone(),
            _ => unreachable!(),
        }
    }

    // Goal: the counting sort, the run-and-merge comparison sort and top-k all order like the
    // standard library; method: random small-domain and wide-domain inputs compared with `sort`.
    #[test]
    fn sorts_agree_with_reference() {
        let mut state = 42u64;
        let mut next = move || {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (state >> 33) as i64
        };
        for domain in [100i64, 1 << 40] {
            // More rows than three sort runs, so the merge passes run too.
            let values: Vec<i64> = (0..3 * CHECK_EVERY_ROWS + 5000).map(|_| next() % domain).collect();
            let batch = int_batch(&values);
            let key = SortKey {
                expr: Expr::Column { index: 0, data_type: DataType::Int64 },
                descending: false,
                nulls_first: false,
            };
            let mut expected = values.clone();
            expected.sort();
            assert_eq!(column(&sort_batch(&batch, std::slice::from_ref(&key), None).expect("sorts")), expected);
            assert_eq!(
                column(&sort_batch(&batch, std::slice::from_ref(&key), Some(10)).expect("sorts")),
                expected[..10].to_vec()
            );
            let descending = SortKey { descending: true, ..key };
            expected.reverse();
            assert_eq!(column(&sort_batch(&batch, &[descending], None).expect("sorts")), expected);
        }
    }

    // Goal: a canceled statement's sort and top-k stop with 57014 instead of running to the
    // end; method: sort under a control that is already canceled.
    #[test]
    fn a_canceled_sort_stops() {
        use crate::control::{enter, QueryControl, StopReason};
        let batch = int_batch(&(0..3 * CHECK_EVERY_ROWS as i64).rev().collect::<Vec<_>>());
        let key = SortKey {
            expr: Expr::Column { index: 0, data_type: DataType::Int64 },
            descending: false,
            nulls_first: false,
        };
        let control = QueryControl::unlimited();
        control.stop(StopReason::Canceled);
        for limit in [None, Some(10)] {
            let result = enter(&control, || sort_batch(&batch, std::slice::from_ref(&key), limit));
            let error = result.expect_err("a canceled sort fails");
            assert_eq!(error.sqlstate(), "57014", "{error}");
        }
    }
}
