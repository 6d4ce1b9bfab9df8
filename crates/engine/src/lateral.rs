//! FROM items that read the FROM items before them: `LATERAL (subquery)` and set-returning
//! functions over earlier columns (implicitly LATERAL, as in PostgreSQL).
//!
//! ```text
//!   FROM a, b, LATERAL (… a.x …) l  ─►  Lateral { input: (a ⋈ b) in wide order,
//!                                               right: the subquery, params: [a.x] }
//! ```
//! Everything before the item is planned as one unit; the item's plan runs once per distinct
//! parameter row of it (`exec/lateral.rs`). An item that reads no earlier column is an
//! ordinary relation and joins as one.

use std::sync::Arc;

use sqlparser::ast;

use crate::bind::{identifier, object_name, Correlation, ExprBinder, Scope};
use crate::error::{EngineError, Result};
use crate::expr::{conjunction, Expr};
use crate::from::{apply_alias, params_of_block, with_outer, From, JoinSide, Visible};
use crate::joins::{relation_set, split_conjuncts, JoinInput, RelationSource};
use crate::plan::Plan;
use crate::query::QueryBinder;
use crate::table_functions::bind_table_function;
use crate::types::DataType;

/// A FROM item bound over the items before it: its plan reads `Expr::Param`s whose values
/// are `params`, columns of the wide row before it (then of the enclosing query's row).
pub(crate) struct LateralItem {
    name: String,
    alias: Option<ast::TableAlias>,
    columns: Vec<(String, DataType)>,
    plan: Plan,
    pub params: Vec<Expr>,
}

impl LateralItem {
    /// Whether the item reads a column of the FROM items before it (else it is an ordinary
    /// relation, perhaps reading the enclosing query's row).
    pub(crate) fn reads_before(&self, bound: &From) -> bool {
        let width = bound.scope.width();
        self.params.iter().any(|p| matches!(p, Expr::Column { index, .. } if *index < width))
    }
}

impl QueryBinder<'_> {
    /// `factor` bound as a LATERAL item when it may be one (a LATERAL subquery, a table
    /// function), else None.
    pub(crate) fn lateral_item(
        &self,
        bound: &From,
        factor: &ast::TableFactor,
        outer: Option<&Scope>,
    ) -> Result<Option<LateralItem>> {
        let before = with_outer(&bound.scope, outer);
        match factor {
            ast::TableFactor::Derived { subquery, alias, lateral: true, sample: None } => {
                let alias =
                    alias.as_ref().ok_or_else(|| EngineError::Syntax("subquery in FROM must have an alias".into()))?;
                let query = self.bind_query_in(subquery, Some(&before))?;
                let columns = query.names.into_iter().zip(query.plan.output_types()).collect();
                let (name, alias) = (identifier(&alias.name), Some(alias.clone()));
                Ok(Some(LateralItem { name, alias, columns, plan: query.plan, params: query.params }))
            }
            ast::TableFactor::Table { name, alias, args: Some(function), with_ordinality, .. }
                if is_plain_function(factor) =>
            {
                self.function_item(&before, name, &function.args, *with_ordinality, alias.as_ref()).map(Some)
            }
            ast::TableFactor::Function { name, args, with_ordinality, alias, .. } => {
                self.function_item(&before, name, args, *with_ordinality, alias.as_ref()).map(Some)
            }
            _ => Ok(None),
        }
    }

    fn function_item(
        &self,
        before: &Scope,
        name: &ast::ObjectName,
        args: &[ast::FunctionArg],
        with_ordinality: bool,
        alias: Option<&ast::TableAlias>,
    ) -> Result<LateralItem> {
        let correlation = Correlation::default();
        let scope = with_outer(&Scope::default(), Some(before));
        let binder = ExprBinder { scope: &scope, queries: Some(self), correlation: Some(&correlation), windows: None };
        let name = object_name(name)?;
        let function = bind_table_function(&name, args, with_ordinality, &binder)?;
        // PostgreSQL: a function returning one column names it after the alias.
        let mut columns = function.columns;
        if let Some(alias) = alias.filter(|a| a.columns.is_empty()) {
            columns[0].0 = identifier(&alias.name);
        }
        let params = correlation.params();
        Ok(LateralItem { name, alias: alias.cloned(), columns, plan: function.plan, params })
    }

    /// A LATERAL item that reads no earlier column: an ordinary relation of the block (what
    /// it reads of the enclosing query's row becomes the block's parameters).
    pub(crate) fn add_bound_relation(
        &self,
        bound: &mut From,
        item: LateralItem,
        correlation: Option<&Correlation>,
    ) -> Result<Visible> {
        let width = bound.scope.width();
        let outer_params: Vec<Expr> = item
            .params
            .iter()
            .map(|p| match p {
                Expr::Column { index, data_type } => Expr::Column { index: index - width, data_type: *data_type },
                other => other.clone(),
            })
            .collect();
        let plan = params_of_block(item.plan, &outer_params, correlation)?;
        let (name, columns) = apply_alias(item.name, item.alias.as_ref(), item.columns)?;
        let columns_width = columns.len();
        let index = bound.scope.add(&name, columns);
        bound.inputs.push(JoinInput::range(RelationSource::Derived(plan), width, columns_width));
        Ok(visible_columns(bound, index))
    }

    /// Joins `item` to the inputs bound before it that it (or its LEFT JOIN's ON) reads,
    /// which become one input with it: inner (ON conditions join the block's), or LEFT (ON
    /// inside the join). Returns the item's columns.
    pub(crate) fn join_lateral(
        &self,
        bound: &mut From,
        item: LateralItem,
        side: JoinSide,
        constraint: &ast::JoinConstraint,
        outer: Option<&Scope>,
        correlation: Option<&Correlation>,
    ) -> Result<Visible> {
        let width = bound.scope.width();
        let params = item.params.iter().map(|p| param_of_block(p, width, correlation)).collect::<Result<Vec<_>>>()?;
        if matches!(side, JoinSide::Right | JoinSide::Full) {
            // PostgreSQL: the combining JOIN type must be INNER or LEFT for a LATERAL reference.
            let read = params.iter().flat_map(Expr::columns).next().unwrap_or(0);
            let table = bound.scope.relations[bound.scope.relation_of(read)].alias.clone();
            return Err(EngineError::InvalidFromReference(table));
        }
        let (name, columns) = apply_alias(item.name, item.alias.as_ref(), item.columns)?;
        let right_width = columns.len();
        let index = bound.scope.add(&name, columns);
        let mut on = Vec::new();
        match constraint {
            ast::JoinConstraint::On(expr) => {
                let scope = with_outer(&bound.scope, outer);
                let binder = ExprBinder { scope: &scope, queries: Some(self), correlation, windows: None };
                split_conjuncts(binder.bind(expr)?, &mut on);
            }
            ast::JoinConstraint::None => {}
            _ => return Err(EngineError::unsupported("JOIN LATERAL with USING or NATURAL")),
        }
        let (outer_join, condition) = match side {
            JoinSide::Left => (true, conjunction(std::mem::take(&mut on))),
            _ => (false, None),
        };
        let read: Vec<usize> = params.iter().chain(&condition).flat_map(Expr::columns).filter(|&c| c < width).collect();
        let (input, mut columns) = self.plan_read_inputs(bound, &read)?;
        bound.on_conjuncts.extend(on);
        columns.extend(width..width + right_width);
        // The node's expressions read its own columns: the taken inputs', then the item's.
        let local =
            |expr: &Expr| expr.map_columns(&|wide| columns.binary_search(&wide).expect("a column the node has"));
        let params = params.iter().map(local).collect();
        let condition = condition.as_ref().map(local);
        let plan =
            Plan::Lateral { input: Box::new(input), right: Arc::new(item.plan), params, outer: outer_join, condition };
        bound.inputs.push(JoinInput { source: RelationSource::Derived(plan), columns });
        Ok(visible_columns(bound, index))
    }

    /// Takes the inputs holding the wide columns `read` out of the block and plans them as one
    /// plan (with the ON conditions among them), its columns ascending, which it returns.
    /// After an outer join every input is taken: an outer join's sides stay together.
    fn plan_read_inputs(&self, bound: &mut From, read: &[usize]) -> Result<(Plan, Vec<usize>)> {
        let inputs = std::mem::take(&mut bound.inputs);
        let taken_set = match bound.left_joins.is_empty() {
            true => read.iter().fold(0u64, |set, &c| {
                set | relation_set(&Expr::Column { index: c, data_type: DataType::Int32 }, &inputs)
            }),
            false => u64::MAX,
        };
        let conjuncts = std::mem::take(&mut bound.on_conjuncts);
        let (own, rest): (Vec<Expr>, Vec<Expr>) =
            conjuncts.into_iter().partition(|c| relation_set(c, &inputs) & !taken_set == 0);
        bound.on_conjuncts = rest;
        let mut taken = Vec::new();
        for (index, input) in inputs.into_iter().enumerate() {
            match taken_set & (1 << index) != 0 {
                true => taken.push(input),
                false => bound.inputs.push(input),
            }
        }
        let mut columns: Vec<usize> = taken.iter().flat_map(|input| input.columns.clone()).collect();
        columns.sort_unstable();
        let unit = From {
            scope: bound.scope.clone(),
            inputs: taken,
            on_conjuncts: Vec::new(),
            left_joins: std::mem::take(&mut bound.left_joins),
        };
        let planned = self.plan_joins(unit, own, &vec![true; bound.scope.width()])?;
        let types = planned.plan.output_types();
        let exprs = columns
            .iter()
            .map(|wide| {
                let index = planned.layout.iter().position(|w| w == wide).expect("every column is planned");
                Expr::Column { index, data_type: types[index] }
            })
            .collect();
        Ok((Plan::Project { input: Box::new(planned.plan), exprs }, columns))
    }
}

/// A LATERAL parameter as the block sees it: a column of the row before the item, or (past
/// `width`) of the enclosing query's row, which is the block's own parameter.
fn param_of_block(param: &Expr, width: usize, correlation: Option<&Correlation>) -> Result<Expr> {
    match (param, correlation) {
        (Expr::Column { index, .. }, _) if *index < width => Ok(param.clone()),
        (Expr::Column { index, data_type }, Some(correlation)) => Ok(correlation.param(index - width, *data_type)),
        _ => Err(EngineError::unsupported("a LATERAL reference to a query level further out")),
    }
}

fn visible_columns(bound: &From, index: usize) -> Visible {
    let relation = &bound.scope.relations[index];
    relation
        .columns
        .iter()
        .enumerate()
        .map(|(position, (name, _))| (relation.alias.clone(), name.clone(), relation.offset + position))
        .collect()
}

/// `name(args) [WITH ORDINALITY] [alias]` and nothing else a table factor may carry.
fn is_plain_function(factor: &ast::TableFactor) -> bool {
    let ast::TableFactor::Table { args, with_hints, version, partitions, json_path, sample, index_hints, .. } = factor
    else {
        return false;
    };
    args.as_ref().is_some_and(|a| a.settings.is_none())
        && with_hints.is_empty()
        && version.is_none()
        && partitions.is_empty()
        && json_path.is_none()
        && sample.is_none()
        && index_hints.is_empty()
}
