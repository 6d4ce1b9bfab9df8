//! UNION, INTERSECT and EXCEPT [ALL] over two materialized inputs: rows are compared whole by
//! their value keys (NULL equals NULL here, as in SQL's set operations); the output keeps the
//! order in which rows first appear (left, then right).

use std::collections::HashMap;

use crate::error::Result;
use crate::plan::SetOperator;
use crate::types::{DataType, ValueKey};
use crate::vector::Batch;

/// `left op [ALL] right`, both of `types`.
pub fn combine(op: SetOperator, all: bool, left: Batch, right: Batch, types: &[DataType]) -> Result<Batch> {
    let left_rows = left.rows;
    let right_keys = || (0..right.rows).map(|r| row_key(&right, r));
    let keep: Vec<u32> = match (op, all) {
        (SetOperator::Union, true) => (0..(left.rows + right.rows) as u32).collect(),
        (SetOperator::Union, false) => {
            let mut seen = std::collections::HashSet::new();
            let mut keep = Vec::new();
            for (row, key) in (0..left.rows).map(|r| row_key(&left, r)).chain(right_keys()).enumerate() {
                if row % super::CHECK_EVERY_ROWS == 0 {
                    crate::control::check()?;
                }
                if seen.insert(key) {
                    keep.push(row as u32);
                }
            }
            keep
        }
        (SetOperator::Intersect | SetOperator::Except, _) => {
            let mut counts: HashMap<Vec<ValueKey>, usize> = HashMap::new();
            for (row, key) in right_keys().enumerate() {
                if row % super::CHECK_EVERY_ROWS == 0 {
                    crate::control::check()?;
                }
                *counts.entry(key).or_default() += 1;
            }
            matching_rows(op, all, &left, &mut counts)?
        }
    };
    let both = super::sort::concat(vec![left, right], types);
    let keep: Vec<u32> = match op {
        SetOperator::Union => keep,
        // INTERSECT and EXCEPT return left rows only.
        _ => keep.into_iter().filter(|&r| (r as usize) < left_rows).collect(),
    };
    Ok(both.gather(&keep))
}

/// Left rows of INTERSECT / EXCEPT given the right side's row counts: INTERSECT ALL keeps
/// min(m, n) copies of a row found m times left and n times right, EXCEPT ALL max(m - n, 0);
/// without ALL each qualifying row once.
fn matching_rows(
    op: SetOperator,
    all: bool,
    left: &Batch,
    counts: &mut HashMap<Vec<ValueKey>, usize>,
) -> Result<Vec<u32>> {
    let mut emitted = std::collections::HashSet::new();
    let mut keep = Vec::new();
    for row in 0..left.rows {
        if row % super::CHECK_EVERY_ROWS == 0 {
            crate::control::check()?;
        }
        let key = row_key(left, row);
        let remaining = counts.get_mut(&key);
        let found = remaining.as_ref().is_some_and(|n| **n > 0);
        let take = match (op, all) {
            (SetOperator::Intersect, true) | (SetOperator::Except, true) => {
                if let Some(n) = remaining.filter(|n| **n > 0) {
                    *n -= 1;
                }
                (op == SetOperator::Intersect) == found
            }
            _ => (op == SetOperator::Intersect) == found && emitted.insert(key),
        };
        if take {
            keep.push(row as u32);
        }
    }
    Ok(keep)
}

fn row_key(batch: &Batch, row: usize) -> Vec<ValueKey> {
    batch.columns.iter().map(|c| c.value(row).key()).collect()
}
