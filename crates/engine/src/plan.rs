//! Physical plans: what the binder and planner produce and the executor runs.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crate::error::Result;
use crate::vector::Batch;

use crate::expr::Expr;
use crate::storage::Table;
use crate::types::DataType;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JoinKind {
    Inner,
    Left,
    Semi,
    Anti,
    /// `x NOT IN (subquery)`: like Anti, but a NULL on either side makes the row unknown
    /// (dropped), as SQL's three-valued logic demands.
    NullAwareAnti,
    /// The build rows some probe row matches (EXISTS with the small outer side hashed and the
    /// subquery's rows streamed through it). Output: build columns only.
    RightSemi,
    /// The build rows no probe row matches (NOT EXISTS, hashed the same way).
    RightAnti,
}

impl JoinKind {
    /// Whether the join outputs build rows only (the probe side streams to mark them).
    pub fn emits_build_rows(self) -> bool {
        matches!(self, JoinKind::RightSemi | JoinKind::RightAnti)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AggregateFunction {
    Sum,
    Avg,
    Count,
    CountStar,
    Min,
    Max,
    /// var_pop, stddev, regr_slope, corr, … (see `statistics`).
    Statistic(crate::statistics::Statistic),
    /// string_agg, percentile_cont/_disc, mode (see `ordered_set`).
    Ordered(crate::ordered_set::OrderedSet),
}

/// UNION, INTERSECT or EXCEPT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetOperator {
    Union,
    Intersect,
    Except,
}

impl SetOperator {
    pub fn sql_name(self) -> &'static str {
        match self {
            SetOperator::Union => "UNION",
            SetOperator::Intersect => "INTERSECT",
            SetOperator::Except => "EXCEPT",
        }
    }
}

/// One aggregate: function, argument over the aggregate's input, and result type.
#[derive(Debug, Clone, PartialEq)]
pub struct AggregateCall {
    pub function: AggregateFunction,
    pub argument: Option<Expr>,
    pub data_type: DataType,
    /// `agg(DISTINCT x)`: each distinct non-null value once per group.
    pub distinct: bool,
    /// `agg(…) FILTER (WHERE condition)`: only rows where the condition is true.
    pub filter: Option<Expr>,
    /// The second argument of two-argument aggregates (`regr_slope(y, x)`: x).
    pub second: Option<Expr>,
}

/// A window function: ranking, offset, frame value, or an aggregate over the frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowFunction {
    RowNumber,
    Rank,
    DenseRank,
    PercentRank,
    CumeDist,
    Ntile,
    Lag,
    Lead,
    FirstValue,
    LastValue,
    NthValue,
    Aggregate(AggregateFunction),
}

/// A window call's frame (ROWS, RANGE or GROUPS, offsets, EXCLUDE): see `window_frame`.
pub use crate::window_frame::{FrameBound, FrameExclusion, FrameOffset, FrameUnits, WindowFrame};

/// `function(args) OVER (PARTITION BY partition ORDER BY order frame)`; expressions over the
/// window node's input.
#[derive(Debug, Clone, PartialEq)]
pub struct WindowCall {
    pub function: WindowFunction,
    pub args: Vec<Expr>,
    pub partition: Vec<Expr>,
    pub order: Vec<SortKey>,
    pub frame: WindowFrame,
    pub data_type: DataType,
}

/// While a select list is bound, window call `k` stands as column `WINDOW_COLUMN_BASE + k`
/// (placed after the window node's input columns once the input is planned).
pub const WINDOW_COLUMN_BASE: usize = 1 << 40;

#[derive(Debug, Clone, PartialEq)]
pub struct SortKey {
    pub expr: Expr,
    pub descending: bool,
    pub nulls_first: bool,
}

/// A CTE's plan and how its references read it.
#[derive(Debug)]
pub struct SharedPlan {
    pub plan: Plan,
    /// `AS MATERIALIZED` (true), `AS NOT MATERIALIZED` (false), or neither.
    hint: Option<bool>,
    references: AtomicUsize,
    /// The planner's row estimate, computed once (a chain of CTEs each reading the one before
    /// twice would be estimated 2^n times otherwise).
    pub estimated_rows: OnceLock<f64>,
    /// The rows, once a materialized plan has run (plans are bound per statement, so these
    /// are one statement's rows, charged to its memory).
    rows: Mutex<Option<Arc<Vec<Batch>>>>,
}

impl SharedPlan {
    pub fn new(plan: Plan, hint: Option<bool>) -> SharedPlan {
        SharedPlan {
            plan,
            hint,
            references: AtomicUsize::new(0),
            estimated_rows: OnceLock::new(),
            rows: Mutex::new(None),
        }
    }

    /// The plan's rows, from `run` on the first call; the lock is held while it runs, so the
    /// plan runs once (it cannot read itself: a CTE is not recursive here).
    pub fn rows_or_run(&self, run: impl FnOnce() -> Result<Vec<Batch>>) -> Result<Arc<Vec<Batch>>> {
        let mut rows = self.rows.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(rows) = rows.as_ref() {
            return Ok(Arc::clone(rows));
        }
        let made = Arc::new(run()?);
        *rows = Some(Arc::clone(&made));
        Ok(made)
    }

    /// Counts one more reference (binding a CTE's name in FROM).
    pub fn add_reference(&self) {
        self.references.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether the plan runs once per statement and every reference reads its rows: as in
    /// PostgreSQL, when the CTE is read more than once (then every reader reads the same rows,
    /// and a chain of CTEs each reading the one before twice runs in linear time, not 2^n) or
    /// is `MATERIALIZED`; `NOT MATERIALIZED` never.
    pub fn materialized(&self) -> bool {
        self.hint.unwrap_or_else(|| self.references.load(Ordering::Relaxed) > 1)
    }

    /// The same sharing with another plan (expressions mapped).
    fn with_plan(&self, plan: Plan) -> SharedPlan {
        let shared = SharedPlan::new(plan, self.hint);
        shared.references.store(self.references.load(Ordering::Relaxed), Ordering::Relaxed);
        shared
    }
}

impl std::ops::Deref for SharedPlan {
    type Target = Plan;
    fn deref(&self) -> &Plan {
        &self.plan
    }
}

/// A physical plan node. Column indexes in expressions refer to the node's input columns.
#[derive(Debug, Clone)]
pub enum Plan {
    /// Reads `columns` of a table; `filter` (over the read columns) is pushed into the scan.
    Scan {
        table: Arc<Table>,
        columns: Vec<usize>,
        filter: Option<Expr>,
    },
    /// One row with no columns (SELECT without FROM).
    SingleRow,
    /// Rows computed while binding (a set-returning function with constant arguments).
    Constant {
        types: Vec<DataType>,
        batches: Arc<Vec<crate::vector::Batch>>,
    },
    Filter {
        input: Box<Plan>,
        predicate: Expr,
    },
    Project {
        input: Box<Plan>,
        exprs: Vec<Expr>,
    },
    /// Hash join: `build` is hashed, `probe` streams. Output: probe columns then build columns
    /// (semi/anti: probe columns only; right semi/anti: build columns only). `residual` sees
    /// probe ++ build columns.
    HashJoin {
        kind: JoinKind,
        probe: Box<Plan>,
        build: Box<Plan>,
        probe_keys: Vec<Expr>,
        build_keys: Vec<Expr>,
        residual: Option<Expr>,
    },
    /// Output: group keys then aggregates.
    Aggregate {
        input: Box<Plan>,
        groups: Vec<Expr>,
        aggregates: Vec<AggregateCall>,
    },
    /// Sort, or top-k when `limit` is set.
    Sort {
        input: Box<Plan>,
        keys: Vec<SortKey>,
        limit: Option<usize>,
    },
    Limit {
        input: Box<Plan>,
        limit: Option<usize>,
        offset: usize,
    },
    /// Output: the input's columns, then one column per window call.
    Window {
        input: Box<Plan>,
        calls: Vec<WindowCall>,
    },
    /// `left op [ALL] right` over inputs of the same column types; rows are compared whole,
    /// NULLs equal to NULLs (as SQL's set operations do).
    SetOperation {
        op: SetOperator,
        all: bool,
        left: Box<Plan>,
        right: Box<Plan>,
    },
    /// `FROM left, LATERAL right`: for each row of `input`, `right` runs with the row's
    /// `params` (over `input`) as its `Expr::Param`s, and the row is joined to each row it
    /// returns. Output: input columns, then right's. `right` is opaque to `map_exprs` and
    /// `visit_exprs`, as a subquery's plan is: its parameters are its own. With `outer`
    /// (LEFT JOIN LATERAL … ON condition), a row none of whose right rows pass `condition`
    /// (over the output columns) is kept once with NULLs.
    Lateral {
        input: Box<Plan>,
        right: Arc<Plan>,
        params: Vec<Expr>,
        outer: bool,
        condition: Option<Expr>,
    },
    /// `generate_series(args)` whose arguments are known only when it runs (they read a
    /// LATERAL row's parameters); one integer column, then the ordinality when asked.
    Series {
        args: Vec<Expr>,
        data_type: DataType,
        with_ordinality: bool,
    },
    /// A plan bound once and read in several places (a CTE's plan under each reference to it).
    /// Shared rather than copied, so a chain of n CTEs each reading the one before holds n
    /// nodes, not n²/2; run once and read by every reference when materialized (see
    /// [`SharedPlan::materialized`]), else run in each place as the plan it holds.
    Shared(Arc<SharedPlan>),
}

impl Plan {
    /// Output column types.
    pub fn output_types(&self) -> Vec<DataType> {
        match self {
            Plan::Scan { table, columns, .. } => columns.iter().map(|&c| table.schema[c].data_type).collect(),
            Plan::SingleRow => Vec::new(),
            Plan::Constant { types, .. } => types.clone(),
            Plan::Lateral { input, right, .. } => [input.output_types(), right.output_types()].concat(),
            Plan::Series { data_type, with_ordinality, .. } => {
                [*data_type].into_iter().chain(with_ordinality.then_some(DataType::Int64)).collect()
            }
            Plan::Filter { input, .. } | Plan::Sort { input, .. } | Plan::Limit { input, .. } => input.output_types(),
            Plan::SetOperation { left, .. } => left.output_types(),
            Plan::Shared(inner) => inner.output_types(),
            Plan::Project { exprs, .. } => exprs.iter().map(Expr::data_type).collect(),
            Plan::HashJoin { kind, probe, build, .. } => match kind {
                JoinKind::Inner | JoinKind::Left => [probe.output_types(), build.output_types()].concat(),
                JoinKind::RightSemi | JoinKind::RightAnti => build.output_types(),
                JoinKind::Semi | JoinKind::Anti | JoinKind::NullAwareAnti => probe.output_types(),
            },
            Plan::Aggregate { groups, aggregates, .. } => {
                groups.iter().map(Expr::data_type).chain(aggregates.iter().map(|a| a.data_type)).collect()
            }
            Plan::Window { input, calls } => {
                let mut types = input.output_types();
                types.extend(calls.iter().map(|c| c.data_type));
                types
            }
        }
    }

    /// Number of output columns.
    pub fn width(&self) -> usize {
        self.output_types().len()
    }

    /// Every expression of the plan tree, each once (not those inside subqueries' plans; a
    /// shared plan's once, however many places read it).
    pub fn visit_exprs(&self, f: &mut dyn FnMut(&Expr)) {
        self.visit_exprs_once(f, &mut HashSet::new());
    }

    fn visit_exprs_once(&self, f: &mut dyn FnMut(&Expr), seen: &mut HashSet<*const SharedPlan>) {
        match self {
            Plan::Scan { filter, .. } => filter.iter().for_each(&mut *f),
            Plan::SingleRow | Plan::Constant { .. } => {}
            Plan::Series { args, .. } => args.iter().for_each(&mut *f),
            Plan::Lateral { input, params, condition, .. } => {
                params.iter().chain(condition).for_each(&mut *f);
                input.visit_exprs_once(f, seen);
            }
            Plan::Filter { input, predicate } => {
                f(predicate);
                input.visit_exprs_once(f, seen);
            }
            Plan::Project { input, exprs } => {
                exprs.iter().for_each(&mut *f);
                input.visit_exprs_once(f, seen);
            }
            Plan::HashJoin { probe, build, probe_keys, build_keys, residual, .. } => {
                probe_keys.iter().chain(build_keys).chain(residual).for_each(&mut *f);
                probe.visit_exprs_once(f, seen);
                build.visit_exprs_once(f, seen);
            }
            Plan::Aggregate { input, groups, aggregates } => {
                let calls = aggregates.iter().flat_map(|a| a.argument.iter().chain(&a.second).chain(&a.filter));
                groups.iter().chain(calls).for_each(&mut *f);
                input.visit_exprs_once(f, seen);
            }
            Plan::Sort { input, keys, .. } => {
                keys.iter().for_each(|k| f(&k.expr));
                input.visit_exprs_once(f, seen);
            }
            Plan::Limit { input, .. } => input.visit_exprs_once(f, seen),
            Plan::SetOperation { left, right, .. } => {
                left.visit_exprs_once(f, seen);
                right.visit_exprs_once(f, seen);
            }
            Plan::Shared(inner) => {
                if seen.insert(Arc::as_ptr(inner)) {
                    inner.plan.visit_exprs_once(f, seen);
                }
            }
            Plan::Window { input, calls } => {
                for call in calls {
                    call.args.iter().chain(&call.partition).chain(call.order.iter().map(|k| &k.expr)).for_each(&mut *f);
                }
                input.visit_exprs_once(f, seen);
            }
        }
    }

    /// The same plan with every expression replaced by `f(expression)`; a shared plan is
    /// mapped once and stays shared by the places that read it.
    pub fn map_exprs(&self, f: &dyn Fn(&Expr) -> Expr) -> Plan {
        self.map_exprs_once(f, &mut HashMap::new())
    }

    fn map_exprs_once(
        &self,
        f: &dyn Fn(&Expr) -> Expr,
        mapped: &mut HashMap<*const SharedPlan, Arc<SharedPlan>>,
    ) -> Plan {
        let map_all = |exprs: &[Expr]| exprs.iter().map(f).collect::<Vec<_>>();
        match self {
            Plan::Scan { table, columns, filter } => {
                Plan::Scan { table: Arc::clone(table), columns: columns.clone(), filter: filter.as_ref().map(f) }
            }
            Plan::SingleRow => Plan::SingleRow,
            Plan::Constant { types, batches } => Plan::Constant { types: types.clone(), batches: Arc::clone(batches) },
            Plan::Series { args, data_type, with_ordinality } => {
                Plan::Series { args: map_all(args), data_type: *data_type, with_ordinality: *with_ordinality }
            }
            Plan::Lateral { input, right, params, outer, condition } => Plan::Lateral {
                input: Box::new(input.map_exprs_once(f, mapped)),
                right: Arc::clone(right),
                params: map_all(params),
                outer: *outer,
                condition: condition.as_ref().map(f),
            },
            Plan::Filter { input, predicate } => {
                Plan::Filter { input: Box::new(input.map_exprs_once(f, mapped)), predicate: f(predicate) }
            }
            Plan::Project { input, exprs } => {
                Plan::Project { input: Box::new(input.map_exprs_once(f, mapped)), exprs: map_all(exprs) }
            }
            Plan::HashJoin { kind, probe, build, probe_keys, build_keys, residual } => Plan::HashJoin {
                kind: *kind,
                probe: Box::new(probe.map_exprs_once(f, mapped)),
                build: Box::new(build.map_exprs_once(f, mapped)),
                probe_keys: map_all(probe_keys),
                build_keys: map_all(build_keys),
                residual: residual.as_ref().map(f),
            },
            Plan::Aggregate { input, groups, aggregates } => Plan::Aggregate {
                input: Box::new(input.map_exprs_once(f, mapped)),
                groups: map_all(groups),
                aggregates: aggregates
                    .iter()
                    .map(|a| AggregateCall {
                        argument: a.argument.as_ref().map(f),
                        second: a.second.as_ref().map(f),
                        filter: a.filter.as_ref().map(f),
                        ..a.clone()
                    })
                    .collect(),
            },
            Plan::Sort { input, keys, limit } => Plan::Sort {
                input: Box::new(input.map_exprs_once(f, mapped)),
                keys: keys.iter().map(|k| SortKey { expr: f(&k.expr), ..k.clone() }).collect(),
                limit: *limit,
            },
            Plan::Limit { input, limit, offset } => {
                Plan::Limit { input: Box::new(input.map_exprs_once(f, mapped)), limit: *limit, offset: *offset }
            }
            Plan::SetOperation { op, all, left, right } => Plan::SetOperation {
                op: *op,
                all: *all,
                left: Box::new(left.map_exprs_once(f, mapped)),
                right: Box::new(right.map_exprs_once(f, mapped)),
            },
            Plan::Shared(inner) => {
                if let Some(done) = mapped.get(&Arc::as_ptr(inner)) {
                    return Plan::Shared(Arc::clone(done));
                }
                let done = Arc::new(inner.with_plan(inner.plan.map_exprs_once(f, mapped)));
                mapped.insert(Arc::as_ptr(inner), Arc::clone(&done));
                Plan::Shared(done)
            }
            Plan::Window { input, calls } => Plan::Window {
                input: Box::new(input.map_exprs_once(f, mapped)),
                calls: calls
                    .iter()
                    .map(|c| WindowCall {
                        args: map_all(&c.args),
                        partition: map_all(&c.partition),
                        order: c.order.iter().map(|k| SortKey { expr: f(&k.expr), ..k.clone() }).collect(),
                        ..c.clone()
                    })
                    .collect(),
            },
        }
    }
}
