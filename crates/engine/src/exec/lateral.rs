//! LATERAL: the right side runs once per distinct parameter row of the left side.
//!
//! ```text
//!   left batch ─► params per row ─► right(params) ─► left row × right rows [─► ON (LEFT)]
//!                                   (rows cached per distinct params within the batch)
//! ```
//! A breaker: the left side runs first; each right execution is a whole plan on this thread's
//! executor, as a correlated subquery's is.

use std::collections::HashMap;
use std::sync::Arc;

use crate::error::Result;
use crate::expr::{evaluate, Expr};
use crate::plan::Plan;
use crate::types::{DataType, Value, ValueKey};
use crate::vector::{Batch, Vector};

use super::subquery::substitute;
use super::{selected_rows, sort, Executor};

/// How one LATERAL node joins its sides.
pub(crate) struct Lateral<'p> {
    pub right: &'p Plan,
    pub params: &'p [Expr],
    pub outer: bool,
    pub condition: Option<&'p Expr>,
}

impl Executor<'_> {
    /// The rows of `input` each joined to the rows `lateral.right` returns for it.
    pub(crate) fn lateral(&self, input: &Plan, lateral: &Lateral<'_>) -> Result<Vec<Batch>> {
        let types = [input.output_types(), lateral.right.output_types()].concat();
        let mut output = Vec::new();
        for batch in self.execute(input)? {
            let joined = self.lateral_batch(&batch, lateral, &types)?;
            if joined.rows > 0 {
                output.push(joined);
            }
        }
        Ok(output)
    }

    fn lateral_batch(&self, batch: &Batch, lateral: &Lateral<'_>, types: &[DataType]) -> Result<Batch> {
        let params = lateral.params.iter().map(|p| evaluate(p, batch)).collect::<Result<Vec<_>>>()?;
        let mut runs: HashMap<Vec<ValueKey>, Arc<Batch>> = HashMap::new();
        let right_types = lateral.right.output_types();
        let mut pieces = Vec::new();
        for row in 0..batch.rows {
            crate::control::check()?;
            let values: Vec<Value> = params.iter().map(|p| p.value(row)).collect();
            let key: Vec<ValueKey> = values.iter().map(Value::key).collect();
            let right = match runs.get(&key) {
                Some(rows) => Arc::clone(rows),
                None => {
                    let rows = self.execute(&substitute(lateral.right, &values))?;
                    let rows = Arc::new(sort::concat(rows, &right_types));
                    runs.insert(key, Arc::clone(&rows));
                    rows
                }
            };
            pieces.push(joined_rows(batch, row, &right, lateral, &right_types)?);
        }
        Ok(sort::concat(pieces, types))
    }
}

/// Row `row` of `left` beside each row of `right`, filtered by the ON condition; for LEFT
/// JOIN LATERAL, once with NULLs when no row is left.
fn joined_rows(
    left: &Batch,
    row: usize,
    right: &Batch,
    lateral: &Lateral<'_>,
    right_types: &[DataType],
) -> Result<Batch> {
    let repeat = |n: usize| left.gather(&vec![row as u32; n]).columns;
    let mut joined = Batch::new([repeat(right.rows), right.columns.clone()].concat(), right.rows);
    if let Some(condition) = lateral.condition {
        joined = joined.gather(&selected_rows(&evaluate(condition, &joined)?)?);
    }
    if joined.rows == 0 && lateral.outer {
        let nulls = right_types.iter().map(|&t| Vector::broadcast(&Value::Null, t, 1));
        return Ok(Batch::new(repeat(1).into_iter().chain(nulls).collect(), 1));
    }
    Ok(joined)
}
