//! Subqueries used as values (`Expr::Subquery`): scalar, EXISTS, `x op ANY/ALL (…)`, IN.
//!
//! ```text
//!   uncorrelated: run once (in parallel by `prepare` before the query, or lazily on first
//!                 use), rows cached in the expression, shared by every worker
//!   correlated:   per input row, the parameter values are substituted into the plan
//!                 (Expr::Param → literal) and it runs on this thread; equal parameter
//!                 values in one batch run once
//! ```
//! The binder turns the common shapes into joins instead (semi/anti joins for EXISTS and IN,
//! grouped derived tables for correlated aggregates); this is the general path.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, OnceLock};

use crate::error::{EngineError, Result};
use crate::expr::{evaluate as evaluate_expr, op_holds, Expr, SubqueryExpr, SubqueryKind};
use crate::plan::Plan;
use crate::runtime::{Runtime, RuntimeKind, RuntimeSettings};
use crate::types::{compare_values, Value, ValueKey};
use crate::vector::{Batch, Vector};

use super::{Executor, Tier};

/// A subquery's rows (its one column), with a hash set for `= ANY` when there are many.
#[derive(Debug)]
pub struct Resolved {
    values: Vec<Value>,
    has_null: bool,
    set: Option<HashSet<ValueKey>>,
}

/// Sets from this many rows on are probed through a hash set.
const HASHED_ROWS_MIN: usize = 16;

impl Resolved {
    fn new(values: Vec<Value>) -> Resolved {
        let has_null = values.iter().any(Value::is_null);
        let set =
            (values.len() >= HASHED_ROWS_MIN).then(|| values.iter().filter(|v| !v.is_null()).map(Value::key).collect());
        Resolved { values, has_null, set }
    }
}

/// The runtime nested executions use: one worker, on the calling thread.
fn serial_runtime() -> Result<&'static Runtime> {
    static SERIAL: OnceLock<Runtime> = OnceLock::new();
    if let Some(runtime) = SERIAL.get() {
        return Ok(runtime);
    }
    let runtime = Runtime::new(RuntimeSettings { kind: RuntimeKind::Plain, workers: 1, ..RuntimeSettings::default() })?;
    Ok(SERIAL.get_or_init(|| runtime))
}

fn first_column(batches: Vec<Batch>) -> Vec<Value> {
    batches.iter().flat_map(|b| (0..b.rows).map(move |row| b.columns[0].value(row))).collect()
}

/// Runs `plan` with `values` for its parameters on `executor`.
fn run(executor: &Executor, plan: &Plan, values: &[Value]) -> Result<Resolved> {
    let batches =
        if values.is_empty() { executor.execute(plan)? } else { executor.execute(&substitute(plan, values))? };
    Ok(Resolved::new(first_column(batches)))
}

/// The plan with `Expr::Param`s replaced by the given values.
pub fn substitute(plan: &Plan, values: &[Value]) -> Plan {
    plan.map_exprs(&|expr| {
        expr.transform(&|node| match node {
            Expr::Param { index, data_type } => Some(Expr::literal(values[*index].clone(), *data_type)),
            _ => None,
        })
    })
}

/// The cached rows of an uncorrelated subquery, running it on `executor` the first time.
fn cached(subquery: &SubqueryExpr, executor: &Executor) -> Result<Arc<Resolved>> {
    let mut cache = subquery.cache.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(resolved) = cache.as_ref() {
        return Ok(Arc::clone(resolved));
    }
    prepare(executor, &subquery.plan)?;
    let resolved = Arc::new(run(executor, &subquery.plan, &[])?);
    *cache = Some(Arc::clone(&resolved));
    Ok(resolved)
}

/// Runs every uncorrelated subquery of `plan` once on `executor` (all workers) before the
/// plan runs, so the workers find their rows cached.
pub fn prepare(executor: &Executor, plan: &Plan) -> Result<()> {
    let mut subqueries = Vec::new();
    plan.visit_exprs(&mut |expr| collect_uncorrelated(expr, &mut subqueries));
    for subquery in subqueries {
        cached(&subquery, executor)?;
    }
    Ok(())
}

fn collect_uncorrelated(expr: &Expr, out: &mut Vec<SubqueryExpr>) {
    if let Expr::Subquery(subquery) = expr {
        if subquery.params.is_empty() {
            out.push((**subquery).clone());
        }
    }
    for child in expr.children() {
        collect_uncorrelated(child, out);
    }
}

/// The subquery's value for every row of `batch`.
pub fn evaluate(subquery: &SubqueryExpr, batch: &Batch) -> Result<Vector> {
    let serial = Executor { runtime: serial_runtime()?, tier: Tier::Compiled };
    let params = subquery.params.iter().map(|p| evaluate_expr(p, batch)).collect::<Result<Vec<_>>>()?;
    let lhs = subquery.lhs.as_ref().map(|l| evaluate_expr(l, batch)).transpose()?;
    let data_type = subquery.data_type();
    if params.is_empty() {
        let resolved = cached(subquery, &serial)?;
        if lhs.is_none() {
            let value = reduce(subquery.kind, None, &resolved)?;
            return Ok(Vector::broadcast(&value, data_type, batch.rows));
        }
    }
    let mut memo: HashMap<Vec<ValueKey>, Arc<Resolved>> = HashMap::new();
    let mut out = Vec::with_capacity(batch.rows);
    for row in 0..batch.rows {
        let resolved = if params.is_empty() {
            cached(subquery, &serial)?
        } else {
            let values: Vec<Value> = params.iter().map(|p| p.value(row)).collect();
            let key: Vec<ValueKey> = values.iter().map(Value::key).collect();
            match memo.get(&key) {
                Some(resolved) => Arc::clone(resolved),
                None => {
                    let resolved = Arc::new(run(&serial, &subquery.plan, &values)?);
                    memo.insert(key, Arc::clone(&resolved));
                    resolved
                }
            }
        };
        out.push(reduce(subquery.kind, lhs.as_ref().map(|l| l.value(row)), &resolved)?);
    }
    Ok(Vector::from_values(&out, data_type))
}

/// One row's value from the subquery's rows.
fn reduce(kind: SubqueryKind, lhs: Option<Value>, resolved: &Resolved) -> Result<Value> {
    Ok(match kind {
        SubqueryKind::Scalar => match resolved.values.as_slice() {
            [] => Value::Null,
            [value] => value.clone(),
            _ => return Err(EngineError::CardinalityViolation),
        },
        SubqueryKind::Exists => Value::Bool(!resolved.values.is_empty()),
        SubqueryKind::Any(op) => quantified(op, lhs.unwrap_or(Value::Null), resolved, true),
        SubqueryKind::All(op) => quantified(op, lhs.unwrap_or(Value::Null), resolved, false),
    })
}

/// `lhs op ANY (rows)` (`any`) or `lhs op ALL (rows)` in three-valued logic.
fn quantified(op: crate::expr::BinaryOp, lhs: Value, resolved: &Resolved, any: bool) -> Value {
    use crate::expr::BinaryOp;
    if resolved.values.is_empty() {
        return Value::Bool(!any);
    }
    if lhs.is_null() {
        return Value::Null;
    }
    // The decisive outcome: a match for ANY, a failure for ALL.
    let decisive = |holds: bool| holds == any;
    let hashed = match (&resolved.set, op, any) {
        (Some(set), BinaryOp::Eq, true) | (Some(set), BinaryOp::NotEq, false) => Some(set.contains(&lhs.key())),
        _ => None,
    };
    let found = match hashed {
        Some(contains) => contains,
        None => {
            resolved.values.iter().filter(|v| !v.is_null()).any(|v| decisive(op_holds(op, compare_values(&lhs, v))))
        }
    };
    if found {
        Value::Bool(any)
    } else if resolved.has_null {
        Value::Null
    } else {
        Value::Bool(!any)
    }
}
