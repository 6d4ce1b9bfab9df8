//! Set-returning functions in FROM: `generate_series(start, stop [, step]) [WITH ORDINALITY]`
//! over integers. With constant arguments the rows are computed while binding and become a
//! constant relation (`Plan::Constant`); arguments that read earlier FROM items (implicitly
//! LATERAL, as in PostgreSQL) make a `Plan::Series` run once per row of those items.

use std::sync::Arc;

use sqlparser::ast;

use crate::bind::{cast_expr, ExprBinder};
use crate::error::{EngineError, Result};
use crate::expr::evaluate_constant;
use crate::plan::Plan;
use crate::types::{DataType, Value};
use crate::vector::{Batch, Vector, VECTOR_ROWS};

/// Most rows a set-returning function in FROM may produce (they are materialized).
pub const SERIES_ROWS_MAX: usize = 1 << 24;

/// A bound table function: its output columns (named after the function) and its rows.
pub struct TableFunction {
    pub columns: Vec<(String, DataType)>,
    pub plan: Plan,
}

/// Binds `name(args)` in FROM with `binder`, whose scope holds the FROM items before it as the
/// enclosing row: arguments that read them become the binder's parameters, and the series is
/// computed per row (`Plan::Series` under a `Plan::Lateral`); constant ones are computed now.
pub fn bind_table_function(
    name: &str,
    args: &[ast::FunctionArg],
    with_ordinality: bool,
    binder: &ExprBinder<'_>,
) -> Result<TableFunction> {
    if name != "generate_series" {
        return Err(EngineError::unsupported(format!("function {name} in FROM")));
    }
    let args = args
        .iter()
        .map(|arg| match arg {
            ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Expr(e)) => Ok(e),
            other => Err(EngineError::unsupported(format!("function argument {other}"))),
        })
        .collect::<Result<Vec<_>>>()?;
    if !(2..=3).contains(&args.len()) {
        return Err(EngineError::UndefinedFunction(format!(
            "function generate_series with {} arguments does not exist",
            args.len()
        )));
    }
    let bound = args.iter().map(|a| binder.bind(a)).collect::<Result<Vec<_>>>()?;
    let data_type = series_type(bound.iter().map(|e| e.data_type()))?;
    let args = bound.into_iter().map(|e| cast_expr(e, data_type)).collect::<Result<Vec<_>>>()?;
    let mut columns = vec![(name.to_string(), data_type)];
    if with_ordinality {
        columns.push(("ordinality".to_string(), DataType::Int64));
    }
    let reads_row = args.iter().any(|a| a.contains_param());
    let plan = Plan::Series { args, data_type, with_ordinality };
    if reads_row {
        return Ok(TableFunction { columns, plan });
    }
    let types = plan.output_types();
    Ok(TableFunction { columns, plan: Plan::Constant { types, batches: Arc::new(series_rows(&plan)?) } })
}

/// The rows of a `Plan::Series` whose arguments are constant (parameters substituted).
pub fn series_rows(plan: &Plan) -> Result<Vec<Batch>> {
    let Plan::Series { args, data_type, with_ordinality } = plan else {
        unreachable!("series_rows runs a Plan::Series");
    };
    let values = args.iter().map(evaluate_constant).collect::<Result<Vec<_>>>()?;
    let integer = |value: &Value| match value {
        Value::Int32(v) => Some(i64::from(*v)),
        Value::Int64(v) => Some(*v),
        _ => None,
    };
    // A NULL argument makes an empty series.
    let integers: Option<Vec<i64>> = values.iter().map(integer).collect();
    let series = match integers {
        Some(ints) => series(ints[0], ints[1], ints.get(2).copied().unwrap_or(1))?,
        None => Vec::new(),
    };
    let data_type = *data_type;
    let mut vectors: Vec<Vec<Value>> = vec![series
        .iter()
        .map(|&v| if data_type == DataType::Int32 { Value::Int32(v as i32) } else { Value::Int64(v) })
        .collect()];
    if *with_ordinality {
        vectors.push((1..=series.len() as i64).map(Value::Int64).collect());
    }
    let types = plan.output_types();
    Ok((0..series.len())
        .step_by(VECTOR_ROWS)
        .map(|start| {
            let end = (start + VECTOR_ROWS).min(series.len());
            let columns = vectors.iter().zip(&types).map(|(v, t)| Vector::from_values(&v[start..end], *t)).collect();
            Batch::new(columns, end - start)
        })
        .collect())
}

/// integer when every argument is, else bigint; other types are not implemented.
fn series_type(types: impl Iterator<Item = DataType>) -> Result<DataType> {
    let mut result = DataType::Int32;
    for data_type in types {
        match data_type {
            DataType::Int32 => {}
            DataType::Int64 => result = DataType::Int64,
            other => {
                return Err(EngineError::unsupported(format!("generate_series over {}", other.sql_name())));
            }
        }
    }
    Ok(result)
}

/// start, start + step, … while not past stop; stops where the next value would overflow.
fn series(start: i64, stop: i64, step: i64) -> Result<Vec<i64>> {
    if step == 0 {
        return Err(EngineError::InvalidParameterValue("step size cannot equal zero".into()));
    }
    let span = if step > 0 { stop.checked_sub(start) } else { start.checked_sub(stop) };
    let count = match span {
        Some(span) if span < 0 => 0,
        Some(span) => (span as u64 / step.unsigned_abs()) as usize + 1,
        None => usize::MAX,
    };
    if count > SERIES_ROWS_MAX {
        return Err(EngineError::LimitExceeded(format!("generate_series of more than {SERIES_ROWS_MAX} rows")));
    }
    let mut values = Vec::with_capacity(count);
    let mut next = Some(start);
    while let Some(value) = next.filter(|v| if step > 0 { *v <= stop } else { *v >= stop }) {
        values.push(value);
        next = value.checked_add(step);
    }
    Ok(values)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: the series ends where PostgreSQL's does (bounds, negative steps, the edge of int8).
    #[test]
    fn series_bounds() {
        assert_eq!(series(1, 5, 2).expect("a series"), vec![1, 3, 5]);
        assert_eq!(series(5, 1, -2).expect("a series"), vec![5, 3, 1]);
        assert!(series(1, 0, 1).expect("a series").is_empty());
        assert_eq!(series(i64::MAX - 1, i64::MAX, 1).expect("a series"), vec![i64::MAX - 1, i64::MAX]);
        assert_eq!(series(0, 1, 0).expect_err("refused").sqlstate(), "22023");
        assert_eq!(series(i64::MIN, i64::MAX, 1).expect_err("refused").sqlstate(), "54000");
    }
}
