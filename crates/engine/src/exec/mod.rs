//! The executor: splits a plan into pipelines at breakers and runs each morsel-parallel.
//!
//! ```text
//!   source (table chunks | materialized batches) ─► scan filter ─► [filter|project|probe]* ─► sink
//!   sinks: collect (ordered by morsel) | partial hash aggregate per worker (merged at the end)
//!   breakers (aggregate, sort, join build, limit) run their input pipelines first
//! ```

pub mod aggregate;
pub mod join;
pub mod keys;
mod lateral;
pub mod set_ops;
pub mod sort;
pub mod subquery;

use std::sync::{Arc, Mutex};

use crate::compiled;
use crate::error::{EngineError, Result};
use crate::expr::{evaluate, Expr};
use crate::plan::{AggregateCall, JoinKind, Plan, SharedPlan};
use crate::runtime::Runtime;
use crate::storage::Table;
use crate::vector::{gather_chunk, scan_chunk, Batch, Data, Vector, VECTOR_ROWS};

use aggregate::PartialAggregate;
use join::JoinTable;
use keys::{KeyCache, KeyEncoder};

/// Rows a long single-threaded loop (sort, join build, aggregate merge, set operation) handles
/// between two checks of the statement's control (cancel, timeout, memory, client gone).
pub const CHECK_EVERY_ROWS: usize = 1 << 16;

/// Which tier runs pipelines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Tier {
    /// Compiled (fused, monomorphized) pipelines where a template fits, else the interpreter.
    Compiled,
    /// The vectorized interpreter only (the oracle).
    Interpreted,
}

/// A streaming operator inside a pipeline.
pub(crate) enum Operator {
    Filter(Expr),
    Project(Vec<Expr>),
    Probe(Arc<JoinTable>),
}

/// Where a pipeline's rows come from.
pub enum Source {
    Scan {
        table: Arc<Table>,
        columns: Vec<usize>,
        filter: Option<Expr>,
    },
    /// Rows already made (a breaker's output, a materialized CTE), read by every reader.
    Batches(Arc<Vec<Batch>>),
}

impl Source {
    fn morsels(&self) -> usize {
        match self {
            Source::Scan { table, .. } => table.chunks.len(),
            Source::Batches(batches) => batches.len(),
        }
    }
}

/// Runs plans on a runtime.
pub struct Executor<'r> {
    pub runtime: &'r Runtime,
    pub tier: Tier,
}

impl Executor<'_> {
    /// The rows of a materialized shared plan: run on its first read, then read by every
    /// other place (the rows live in the plan, so readers on other executors, such as an
    /// uncorrelated subquery's, find them too).
    fn materialize(&self, shared: &SharedPlan) -> Result<Arc<Vec<Batch>>> {
        shared.rows_or_run(|| self.execute(&shared.plan))
    }

    /// Executes a plan to completion; batches come in a deterministic order.
    pub fn execute(&self, plan: &Plan) -> Result<Vec<Batch>> {
        match plan {
            Plan::Aggregate { input, groups, aggregates } => {
                if self.tier == Tier::Compiled {
                    if let Some(pipeline) = compiled::CompiledAggregate::try_new(input, groups, aggregates) {
                        return Ok(vec![pipeline.run(self.runtime)?]);
                    }
                }
                self.aggregate(input, groups, aggregates)
            }
            Plan::Sort { input, keys, limit } => {
                let types = input.output_types();
                let batch = sort::concat(self.execute(input)?, &types);
                Ok(vec![sort::sort_batch(&batch, keys, *limit)?])
            }
            Plan::SetOperation { op, all, left, right } => {
                let types = left.output_types();
                let left = sort::concat(self.execute(left)?, &types);
                let right = sort::concat(self.execute(right)?, &types);
                Ok(vec![set_ops::combine(*op, *all, left, right, &types)?])
            }
            Plan::Window { input, calls } => {
                let types = input.output_types();
                let batch = sort::concat(self.execute(input)?, &types);
                Ok(vec![crate::window::evaluate_windows(&batch, calls)?])
            }
            Plan::HashJoin { kind, probe, build, probe_keys, build_keys, residual } if kind.emits_build_rows() => {
                let table = self.join_table(*kind, build, build_keys, probe_keys, residual.as_ref())?;
                Ok(vec![self.right_semi_join(&table, probe)?])
            }
            Plan::Lateral { input, right, params, outer, condition } => {
                let lateral = lateral::Lateral { right, params, outer: *outer, condition: condition.as_ref() };
                self.lateral(input, &lateral)
            }
            Plan::Limit { input, limit, offset } => {
                let types = input.output_types();
                let batch = sort::concat(self.execute(input)?, &types);
                let end = limit.map_or(batch.rows, |l| offset.saturating_add(l).min(batch.rows));
                let rows: Vec<u32> = (*offset.min(&batch.rows) as u32..end as u32).collect();
                Ok(vec![batch.gather(&rows)])
            }
            _ => {
                let (source, operators) = self.pipeline(plan)?;
                self.collect(source, &operators)
            }
        }
    }

    /// Splits off the streaming operators above the plan's source; builds join tables.
    pub(crate) fn pipeline(&self, plan: &Plan) -> Result<(Source, Vec<Operator>)> {
        let mut operators = Vec::new();
        let mut node = plan;
        let source = loop {
            match node {
                Plan::Filter { input, predicate } => {
                    operators.push(Operator::Filter(predicate.clone()));
                    node = input;
                }
                Plan::Project { input, exprs } => {
                    operators.push(Operator::Project(exprs.clone()));
                    node = input;
                }
                Plan::HashJoin { kind, probe, build, probe_keys, build_keys, residual } if !kind.emits_build_rows() => {
                    let table = self.join_table(*kind, build, build_keys, probe_keys, residual.as_ref())?;
                    operators.push(Operator::Probe(Arc::new(table)));
                    node = probe;
                }
                Plan::Scan { table, columns, filter } => {
                    break Source::Scan { table: Arc::clone(table), columns: columns.clone(), filter: filter.clone() };
                }
                Plan::SingleRow => break Source::Batches(Arc::new(vec![Batch::new(Vec::new(), 1)])),
                Plan::Shared(inner) if inner.materialized() => break Source::Batches(self.materialize(inner)?),
                Plan::Shared(inner) => node = &inner.plan,
                Plan::Constant { batches, .. } => break Source::Batches(Arc::clone(batches)),
                Plan::Series { .. } => break Source::Batches(Arc::new(crate::table_functions::series_rows(node)?)),
                breaker => break Source::Batches(Arc::new(self.execute(breaker)?)),
            }
        };
        operators.reverse();
        Ok((source, operators))
    }

    /// Runs a join's build side and hashes it.
    fn join_table(
        &self,
        kind: JoinKind,
        build: &Plan,
        build_keys: &[Expr],
        probe_keys: &[Expr],
        residual: Option<&Expr>,
    ) -> Result<JoinTable> {
        let types = build.output_types();
        let batches = self.execute(build)?;
        JoinTable::build(self.runtime, kind, batches, &types, build_keys, probe_keys.to_vec(), residual.cloned())
    }

    /// Right semi/anti join: the probe side streams through the hashed build side on all
    /// workers, each marking the build rows its rows match; then the build rows marked (semi)
    /// or not (anti) are kept. The large side of an EXISTS is never materialized or hashed.
    fn right_semi_join(&self, table: &JoinTable, probe: &Plan) -> Result<Batch> {
        let want = table.kind == JoinKind::RightSemi;
        let rows = table.build_rows();
        if rows == 0 {
            return Ok(table.build_rows_marked(&[], want));
        }
        let (source, operators) = self.pipeline(probe)?;
        let workers = self.runtime.workers();
        type Marks = (Vec<bool>, Vec<KeyCache>, KeyCache);
        let marks: Vec<Mutex<Marks>> =
            (0..workers).map(|_| Mutex::new((vec![false; rows], Vec::new(), KeyCache::default()))).collect();
        self.runtime.run_morsels(source.morsels(), |worker, morsel| {
            let mut guard = marks[worker].lock().unwrap_or_else(|p| p.into_inner());
            let (marked, caches, cache) = &mut *guard;
            for_each_vector(&source, morsel, |batch| {
                run_operators(&operators, caches, batch, &mut |b| table.mark(cache, &b, marked))
            })
        })?;
        let mut marked = vec![false; rows];
        for worker in marks {
            let (theirs, _, _) = worker.into_inner().unwrap_or_else(|p| p.into_inner());
            marked.iter_mut().zip(theirs).for_each(|(m, t)| *m |= t);
        }
        Ok(table.build_rows_marked(&marked, want))
    }

    fn collect(&self, source: Source, operators: &[Operator]) -> Result<Vec<Batch>> {
        let workers = self.runtime.workers();
        let outputs: Vec<Mutex<Vec<(usize, Batch)>>> = (0..workers).map(|_| Mutex::new(Vec::new())).collect();
        let caches: Vec<Mutex<Vec<KeyCache>>> = (0..workers).map(|_| Mutex::new(Vec::new())).collect();
        self.runtime.run_morsels(source.morsels(), |worker, morsel| {
            let mut caches = caches[worker].lock().unwrap_or_else(|p| p.into_inner());
            let mut produced = Vec::new();
            for_each_vector(&source, morsel, |batch| {
                run_operators(operators, &mut caches, batch, &mut |b| {
                    produced.push(b);
                    Ok(())
                })
            })?;
            let mut output = outputs[worker].lock().unwrap_or_else(|p| p.into_inner());
            output.extend(produced.into_iter().map(|b| (morsel, b)));
            Ok(())
        })?;
        let mut all: Vec<(usize, Batch)> =
            outputs.into_iter().flat_map(|o| o.into_inner().unwrap_or_else(|p| p.into_inner())).collect();
        all.sort_by_key(|(morsel, _)| *morsel);
        Ok(all.into_iter().map(|(_, b)| b).filter(|b| b.rows > 0).collect())
    }

    fn aggregate(&self, input: &Plan, groups: &[Expr], aggregates: &[AggregateCall]) -> Result<Vec<Batch>> {
        let (source, operators) = self.pipeline(input)?;
        let encoder = KeyEncoder::new(groups.iter().map(Expr::data_type).collect());
        let workers = self.runtime.workers();
        let capacity = presized_groups(input, groups, workers);
        let partials: Vec<Mutex<(PartialAggregate, Vec<KeyCache>)>> = (0..workers)
            .map(|_| Mutex::new((PartialAggregate::with_capacity(groups.len(), aggregates, capacity), Vec::new())))
            .collect();
        self.runtime.run_morsels(source.morsels(), |worker, morsel| {
            let mut guard = partials[worker].lock().unwrap_or_else(|p| p.into_inner());
            let (partial, caches) = &mut *guard;
            for_each_vector(&source, morsel, |batch| {
                run_operators(&operators, caches, batch, &mut |b| partial.consume(&encoder, groups, aggregates, &b))
            })
        })?;
        let partials = partials.into_iter().map(|p| p.into_inner().unwrap_or_else(|e| e.into_inner()).0).collect();
        aggregate::merge_and_finish(self.runtime, partials, &encoder, aggregates)
    }
}

/// Groups each worker's table is sized for up front: the planner's estimate split over the
/// workers (morsels of a large input mostly hold different groups), bounded. A table grown
/// by doubling from empty rehashed and copied ~20 times on Q18's 1.5M orders.
fn presized_groups(input: &Plan, groups: &[Expr], workers: usize) -> usize {
    const PRESIZED_GROUPS_MAX: f64 = (1 << 20) as f64;
    if groups.is_empty() {
        return 0;
    }
    crate::joins::estimate_groups(input, groups).map_or(0, |g| (g / workers as f64).min(PRESIZED_GROUPS_MAX) as usize)
}

/// Calls `f` for every vector of a morsel (scan slices with the pushed filter applied).
pub fn for_each_vector(source: &Source, morsel: usize, mut f: impl FnMut(Batch) -> Result<()>) -> Result<()> {
    match source {
        Source::Scan { table, columns, filter } => {
            let rows = table.chunks[morsel].rows;
            // A filtered scan reads the filter's columns first and copies the others only for
            // the rows that pass (copying every column, then gathering, moved each value twice).
            let narrowed = filter.as_ref().filter(|p| !p.contains_subquery()).map(|predicate| {
                let used = predicate.columns();
                let read: Vec<usize> = used.iter().map(|&c| columns[c]).collect();
                let local = predicate.map_columns(&|c| used.binary_search(&c).expect("a used column"));
                (read, local)
            });
            for start in (0..rows).step_by(VECTOR_ROWS) {
                crate::control::check()?;
                let end = (start + VECTOR_ROWS).min(rows);
                let batch = match (filter, &narrowed) {
                    (Some(predicate), None) => apply_filter(predicate, scan_chunk(table, morsel, columns, start, end))?,
                    (_, Some((read, local))) => {
                        let condition = evaluate(local, &scan_chunk(table, morsel, read, start, end))?;
                        let selection = selected_rows(&condition)?;
                        if selection.len() == end - start {
                            scan_chunk(table, morsel, columns, start, end)
                        } else {
                            gather_chunk(table, morsel, columns, start, &selection)
                        }
                    }
                    (None, _) => scan_chunk(table, morsel, columns, start, end),
                };
                if batch.rows > 0 {
                    f(batch)?;
                }
            }
            Ok(())
        }
        Source::Batches(batches) => f(batches[morsel].clone()),
    }
}

/// The rows where a boolean vector is true (not false, not NULL).
pub fn selected_rows(condition: &Vector) -> Result<Vec<u32>> {
    let Data::Bool(values) = &condition.data else {
        return Err(EngineError::Type("condition is not boolean".into()));
    };
    // Branch-free: every row index is written, the end advances only past selected rows (a
    // filter passing about half the rows mispredicts a branch per row; it was 8–18% of Q3,
    // Q4, Q21).
    let mut selection = vec![0u32; values.len()];
    let mut end = 0;
    match &condition.validity {
        None => {
            for (row, &value) in values.iter().enumerate() {
                selection[end] = row as u32;
                end += usize::from(value);
            }
        }
        Some(valid) => {
            for (row, (&value, &valid)) in values.iter().zip(valid).enumerate() {
                selection[end] = row as u32;
                end += usize::from(value & valid);
            }
        }
    }
    selection.truncate(end);
    Ok(selection)
}

/// Keeps the rows where `predicate` is true: builds a selection vector, then gathers.
pub fn apply_filter(predicate: &Expr, batch: Batch) -> Result<Batch> {
    let selection = selected_rows(&evaluate(predicate, &batch)?)?;
    if selection.len() == batch.rows {
        return Ok(batch);
    }
    Ok(batch.gather(&selection))
}

pub(crate) fn run_operators(
    operators: &[Operator],
    caches: &mut Vec<KeyCache>,
    batch: Batch,
    sink: &mut dyn FnMut(Batch) -> Result<()>,
) -> Result<()> {
    let Some((first, rest)) = operators.split_first() else {
        return sink(batch);
    };
    let cache_index = operators.len() - 1;
    match first {
        Operator::Filter(predicate) => {
            let batch = apply_filter(predicate, batch)?;
            if batch.rows > 0 {
                run_operators(rest, caches, batch, sink)?;
            }
        }
        Operator::Project(exprs) => {
            let columns = exprs.iter().map(|e| evaluate(e, &batch)).collect::<Result<Vec<_>>>()?;
            run_operators(rest, caches, Batch::new(columns, batch.rows), sink)?;
        }
        Operator::Probe(table) => {
            if caches.len() <= cache_index {
                caches.resize_with(cache_index + 1, KeyCache::default);
            }
            // The probe's cache is taken out while its output runs through the operators after
            // it, which use the caches of their own slots.
            let mut cache = std::mem::take(&mut caches[cache_index]);
            let probed = table.probe(&mut cache, &batch, &mut |output| run_operators(rest, caches, output, sink));
            caches[cache_index] = cache;
            probed?;
        }
    }
    Ok(())
}
