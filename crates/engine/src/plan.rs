//! Physical plans: what the binder and planner produce and the executor runs.

use std::sync::Arc;

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
    /// A plan bound once and read in several places (a CTE's plan under each reference to it);
    /// runs once per place, as the plan it holds. Shared rather than copied, so a chain of n
    /// CTEs each reading the one before holds n nodes, not n²/2.
    Shared(Arc<Plan>),
}

impl Plan {
    /// Output column types.
    pub fn output_types(&self) -> Vec<DataType> {
        match self {
            Plan::Scan { table, columns, .. } => columns.iter().map(|&c| table.schema[c].data_type).collect(),
            Plan::SingleRow => Vec::new(),
            Plan::Constant { types, .. } => types.clone(),
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

    /// Every expression of the plan tree, each once (not those inside subqueries' plans).
    pub fn visit_exprs(&self, f: &mut dyn FnMut(&Expr)) {
        match self {
            Plan::Scan { filter, .. } => filter.iter().for_each(&mut *f),
            Plan::SingleRow | Plan::Constant { .. } => {}
            Plan::Filter { input, predicate } => {
                f(predicate);
                input.visit_exprs(f);
            }
            Plan::Project { input, exprs } => {
                exprs.iter().for_each(&mut *f);
                input.visit_exprs(f);
            }
            Plan::HashJoin { probe, build, probe_keys, build_keys, residual, .. } => {
                probe_keys.iter().chain(build_keys).chain(residual).for_each(&mut *f);
                probe.visit_exprs(f);
                build.visit_exprs(f);
            }
            Plan::Aggregate { input, groups, aggregates } => {
                let calls = aggregates.iter().flat_map(|a| a.argument.iter().chain(&a.second).chain(&a.filter));
                groups.iter().chain(calls).for_each(&mut *f);
                input.visit_exprs(f);
            }
            Plan::Sort { input, keys, .. } => {
                keys.iter().for_each(|k| f(&k.expr));
                input.visit_exprs(f);
            }
            Plan::Limit { input, .. } => input.visit_exprs(f),
            Plan::SetOperation { left, right, .. } => {
                left.visit_exprs(f);
                right.visit_exprs(f);
            }
            Plan::Shared(inner) => inner.visit_exprs(f),
            Plan::Window { input, calls } => {
                for call in calls {
                    call.args.iter().chain(&call.partition).chain(call.order.iter().map(|k| &k.expr)).for_each(&mut *f);
                }
                input.visit_exprs(f);
            }
        }
    }

    /// The same plan with every expression replaced by `f(expression)`.
    pub fn map_exprs(&self, f: &dyn Fn(&Expr) -> Expr) -> Plan {
        let map_all = |exprs: &[Expr]| exprs.iter().map(f).collect::<Vec<_>>();
        match self {
            Plan::Scan { table, columns, filter } => {
                Plan::Scan { table: Arc::clone(table), columns: columns.clone(), filter: filter.as_ref().map(f) }
            }
            Plan::SingleRow => Plan::SingleRow,
            Plan::Constant { types, batches } => Plan::Constant { types: types.clone(), batches: Arc::clone(batches) },
            Plan::Filter { input, predicate } => {
                Plan::Filter { input: Box::new(input.map_exprs(f)), predicate: f(predicate) }
            }
            Plan::Project { input, exprs } => {
                Plan::Project { input: Box::new(input.map_exprs(f)), exprs: map_all(exprs) }
            }
            Plan::HashJoin { kind, probe, build, probe_keys, build_keys, residual } => Plan::HashJoin {
                kind: *kind,
                probe: Box::new(probe.map_exprs(f)),
                build: Box::new(build.map_exprs(f)),
                probe_keys: map_all(probe_keys),
                build_keys: map_all(build_keys),
                residual: residual.as_ref().map(f),
            },
            Plan::Aggregate { input, groups, aggregates } => Plan::Aggregate {
                input: Box::new(input.map_exprs(f)),
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
                input: Box::new(input.map_exprs(f)),
                keys: keys.iter().map(|k| SortKey { expr: f(&k.expr), ..k.clone() }).collect(),
                limit: *limit,
            },
            Plan::Limit { input, limit, offset } => {
                Plan::Limit { input: Box::new(input.map_exprs(f)), limit: *limit, offset: *offset }
            }
            Plan::SetOperation { op, all, left, right } => Plan::SetOperation {
                op: *op,
                all: *all,
                left: Box::new(left.map_exprs(f)),
                right: Box::new(right.map_exprs(f)),
            },
            Plan::Shared(inner) => Plan::Shared(Arc::new(inner.map_exprs(f))),
            Plan::Window { input, calls } => Plan::Window {
                input: Box::new(input.map_exprs(f)),
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
