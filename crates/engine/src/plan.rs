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
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AggregateFunction {
    Sum,
    Avg,
    Count,
    CountStar,
    Min,
    Max,
}

/// One aggregate: function, argument over the aggregate's input, and result type.
#[derive(Debug, Clone, PartialEq)]
pub struct AggregateCall {
    pub function: AggregateFunction,
    pub argument: Option<Expr>,
    pub data_type: DataType,
}

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
    Filter {
        input: Box<Plan>,
        predicate: Expr,
    },
    Project {
        input: Box<Plan>,
        exprs: Vec<Expr>,
    },
    /// Hash join: `build` is hashed, `probe` streams. Output: probe columns then build columns
    /// (semi/anti: probe columns only). `residual` sees probe ++ build columns.
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
}

impl Plan {
    /// Output column types.
    pub fn output_types(&self) -> Vec<DataType> {
        match self {
            Plan::Scan { table, columns, .. } => columns.iter().map(|&c| table.schema[c].data_type).collect(),
            Plan::SingleRow => Vec::new(),
            Plan::Filter { input, .. } | Plan::Sort { input, .. } | Plan::Limit { input, .. } => input.output_types(),
            Plan::Project { exprs, .. } => exprs.iter().map(Expr::data_type).collect(),
            Plan::HashJoin { kind, probe, build, .. } => {
                let mut types = probe.output_types();
                if matches!(kind, JoinKind::Inner | JoinKind::Left) {
                    types.extend(build.output_types());
                }
                types
            }
            Plan::Aggregate { groups, aggregates, .. } => {
                groups.iter().map(Expr::data_type).chain(aggregates.iter().map(|a| a.data_type)).collect()
            }
        }
    }

    /// Estimated output rows (planner statistics; tables know their sizes, filters are sampled).
    pub fn width(&self) -> usize {
        self.output_types().len()
    }
}
