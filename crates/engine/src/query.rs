//! Query blocks: SELECT … FROM … WHERE … GROUP BY … HAVING … ORDER BY … LIMIT → [`Plan`].
//!
//! ```text
//!   WITH ─► CTEs visible by name ─► FROM (from.rs) ─► WHERE conjuncts: IN/EXISTS as semi/anti
//!   joins (decorrelate.rs), the rest pushed into scans ─► greedy join tree ─► left joins ─►
//!   aggregate ─► HAVING ─► project ─► DISTINCT ─► sort / top-k ─► limit ─► strip hidden columns
//! ```
//!
//! A block nested in an expression sees the enclosing block's row: its references to it
//! become `Expr::Param`s, listed in `BoundQuery::params` as columns of the enclosing row.

use std::borrow::Cow;
use std::cell::RefCell;
use std::sync::Arc;

use sqlparser::ast;

use crate::bind::{
    cast_expr, contains_aggregate, identifier, is_untyped, object_name, unify, AggregateContext, Correlation,
    ExprBinder, Scope,
};
use crate::decorrelate::{apply_subquery_joins, SubqueryJoin};
use crate::error::{EngineError, Result};
use crate::expr::BinaryOp;
use crate::expr::{evaluate_constant, Expr};
use crate::from::{with_outer, From};
use crate::joins::{factor_or, split_conjuncts, Planned};
use crate::plan::{
    AggregateCall, Plan, SetOperator, SharedPlan, SortKey, WindowCall, WindowFrame, WindowFunction, WINDOW_COLUMN_BASE,
};
use crate::storage::Catalog;
use crate::types::{DataType, Value};
use crate::window_bind::WindowContext;

/// A bound query: its plan, output column names, and the enclosing row's columns its
/// `Expr::Param`s stand for (empty unless correlated).
pub struct BoundQuery {
    pub plan: Plan,
    pub names: Vec<String>,
    pub params: Vec<Expr>,
}

/// A common table expression, bound once; each reference reads its plan.
pub(crate) struct Cte {
    pub name: String,
    pub names: Vec<String>,
    pub plan: Arc<SharedPlan>,
}

impl Cte {
    /// The plan a reference reads: the CTE's plan shared, not copied (a copy per reference
    /// made a chain of n CTEs cost n²/2 plan nodes), and counted (a CTE read more than once
    /// is materialized); a bare table scan is copied, so filters still go into it.
    pub fn reference(&self) -> Plan {
        match &self.plan.plan {
            scan @ Plan::Scan { .. } if !self.plan.materialized() => scan.clone(),
            _ => {
                self.plan.add_reference();
                Plan::Shared(Arc::clone(&self.plan))
            }
        }
    }
}

/// Binds queries against a catalog and the CTEs in scope.
pub struct QueryBinder<'c> {
    pub catalog: &'c Catalog,
    ctes: Vec<Arc<Cte>>,
}

/// One query block's binding scope: its FROM columns, then the enclosing block's row.
pub(crate) struct Block<'a> {
    pub inner_width: usize,
    pub scope: Scope,
    pub correlation: &'a Correlation,
}

impl Block<'_> {
    pub fn binder<'b>(&'b self, queries: &'b QueryBinder<'_>) -> ExprBinder<'b> {
        ExprBinder { scope: &self.scope, queries: Some(queries), correlation: Some(self.correlation), windows: None }
    }
}

impl<'c> QueryBinder<'c> {
    pub fn new(catalog: &'c Catalog) -> QueryBinder<'c> {
        QueryBinder { catalog, ctes: Vec::new() }
    }

    /// The innermost CTE of this name, if any.
    pub(crate) fn cte(&self, name: &ast::ObjectName) -> Option<&Cte> {
        if name.0.len() != 1 {
            return None;
        }
        let name = object_name(name).ok()?;
        self.ctes.iter().rev().find(|c| c.name == name).map(|c| c.as_ref())
    }

    /// Binds a top-level query (or one in FROM): it sees no enclosing row.
    pub fn bind_query(&self, query: &ast::Query) -> Result<BoundQuery> {
        self.bind_query_in(query, None)
    }

    /// Binds a query that may read the enclosing block's row `outer`.
    pub fn bind_query_in(&self, query: &ast::Query, outer: Option<&Scope>) -> Result<BoundQuery> {
        let _depth = crate::depth::enter()?;
        let Some(with) = &query.with else {
            return self.bind_body(query, outer);
        };
        if with.recursive {
            return Err(EngineError::unsupported("WITH RECURSIVE"));
        }
        let mut scoped = QueryBinder { catalog: self.catalog, ctes: self.ctes.clone() };
        for cte in &with.cte_tables {
            let bound = scoped.bind_query(&cte.query)?;
            let name = identifier(&cte.alias.name);
            let names: Vec<String> = if cte.alias.columns.is_empty() {
                bound.names
            } else {
                cte.alias.columns.iter().map(|c| identifier(&c.name)).collect()
            };
            if names.len() != bound.plan.width() {
                return Err(EngineError::Syntax(format!(
                    "WITH query \"{name}\" has {} columns available but {} columns specified",
                    bound.plan.width(),
                    names.len()
                )));
            }
            let hint = cte.materialized.as_ref().map(|m| matches!(m, ast::CteAsMaterialized::Materialized));
            scoped.ctes.push(Arc::new(Cte { name, names, plan: Arc::new(SharedPlan::new(bound.plan, hint)) }));
        }
        scoped.bind_body(query, outer)
    }

    fn bind_body(&self, query: &ast::Query, outer: Option<&Scope>) -> Result<BoundQuery> {
        if query.fetch.is_some() || !query.locks.is_empty() {
            return Err(EngineError::unsupported("FETCH or FOR UPDATE"));
        }
        let (limit, offset) = limit_offset(query)?;
        let order_by = match &query.order_by {
            None => &[][..],
            Some(ast::OrderBy { kind: ast::OrderByKind::Expressions(exprs), .. }) => exprs.as_slice(),
            Some(_) => return Err(EngineError::unsupported("ORDER BY ALL")),
        };
        match query.body.as_ref() {
            ast::SetExpr::Select(select) => self.bind_select(select, order_by, limit, offset, outer),
            ast::SetExpr::Query(inner) if order_by.is_empty() && limit.is_none() && offset == 0 => {
                self.bind_query_in(inner, outer)
            }
            ast::SetExpr::SetOperation { .. } => {
                let bound = self.bind_set_expr(query.body.as_ref(), outer)?;
                order_and_limit(bound, order_by, limit, offset)
            }
            ast::SetExpr::Values(values) => {
                let bound = self.bind_values(values, outer)?;
                order_and_limit(bound, order_by, limit, offset)
            }
            other => Err(EngineError::unsupported(format!("query body {other}"))),
        }
    }

    /// One operand of a set operation (or the whole of one): a block, a parenthesized query,
    /// or a nested set operation.
    fn bind_set_expr(&self, body: &ast::SetExpr, outer: Option<&Scope>) -> Result<BoundQuery> {
        let (op, quantifier, left, right) = match body {
            ast::SetExpr::Select(select) => return self.bind_select(select, &[], None, 0, outer),
            ast::SetExpr::Query(inner) => return self.bind_query_in(inner, outer),
            ast::SetExpr::SetOperation { op, set_quantifier, left, right } => (op, set_quantifier, left, right),
            ast::SetExpr::Values(values) => return self.bind_values(values, outer),
            other => return Err(EngineError::unsupported(format!("query body {other}"))),
        };
        let op = match op {
            ast::SetOperator::Union => SetOperator::Union,
            ast::SetOperator::Intersect => SetOperator::Intersect,
            ast::SetOperator::Except => SetOperator::Except,
            other => return Err(EngineError::unsupported(format!("set operation {other}"))),
        };
        let all = match quantifier {
            ast::SetQuantifier::All => true,
            ast::SetQuantifier::None | ast::SetQuantifier::Distinct => false,
            other => return Err(EngineError::unsupported(format!("{} {other}", op.sql_name()))),
        };
        let (left, mut right) = (self.bind_set_expr(left, outer)?, self.bind_set_expr(right, outer)?);
        // Both operands' parameters become the operation's: the right's are numbered after the left's.
        let shift = left.params.len();
        if shift > 0 && !right.params.is_empty() {
            right.plan = right.plan.map_exprs(&|expr| {
                expr.transform(&|node| match node {
                    Expr::Param { index, data_type } => {
                        Some(Expr::Param { index: index + shift, data_type: *data_type })
                    }
                    _ => None,
                })
            });
        }
        let params = [left.params, right.params].concat();
        if left.plan.width() != right.plan.width() {
            return Err(EngineError::Syntax(format!(
                "each {} query must have the same number of columns",
                op.sql_name()
            )));
        }
        let (left_plan, right_plan) = common_columns(op, left.plan, right.plan)?;
        let plan = Plan::SetOperation { op, all, left: Box::new(left_plan), right: Box::new(right_plan) };
        Ok(BoundQuery { plan, names: left.names, params })
    }

    /// `VALUES (…), (…)`: each row a projection of the single row, the rows concatenated (UNION
    /// ALL); each column takes the rows' common type, as PostgreSQL's VALUES does; the columns
    /// are named column1, column2, ….
    fn bind_values(&self, values: &ast::Values, outer: Option<&Scope>) -> Result<BoundQuery> {
        let width = values.rows.first().map_or(0, |row| row.content.len());
        if values.rows.iter().any(|row| row.content.len() != width) {
            return Err(EngineError::Syntax("VALUES lists must all be the same length".into()));
        }
        let scope = with_outer(&Scope::default(), outer);
        let correlation = Correlation::default();
        let binder = ExprBinder { scope: &scope, queries: Some(self), correlation: Some(&correlation), windows: None };
        let mut columns: Vec<Vec<Expr>> = vec![Vec::with_capacity(values.rows.len()); width];
        for row in &values.rows {
            for (column, expr) in columns.iter_mut().zip(&row.content) {
                column.push(binder.bind(expr)?);
            }
        }
        let mut unified = Vec::with_capacity(width);
        for column in columns {
            let types: Vec<DataType> = column.iter().filter(|e| !is_untyped(e)).map(Expr::data_type).collect();
            let (exprs, _) = unify(column).map_err(|_| {
                let names: Vec<String> = types.iter().map(|t| t.sql_name()).collect();
                EngineError::Type(format!("VALUES types {} cannot be matched", names.join(" and ")))
            })?;
            unified.push(exprs);
        }
        let rows: Vec<Plan> = (0..values.rows.len())
            .map(|row| Plan::Project {
                input: Box::new(Plan::SingleRow),
                exprs: unified.iter().map(|column| column[row].clone()).collect(),
            })
            .collect();
        let names = (1..=width).map(|i| format!("column{i}")).collect();
        Ok(BoundQuery { plan: union_all(rows), names, params: correlation.params() })
    }

    fn bind_select(
        &self,
        select: &ast::Select,
        order_by: &[ast::OrderByExpr],
        limit: Option<usize>,
        offset: usize,
        outer: Option<&Scope>,
    ) -> Result<BoundQuery> {
        reject_unsupported_select(select)?;
        let decorrelated = self.decorrelate_scalar_aggregates(select)?;
        let select = decorrelated.as_ref().unwrap_or(select);
        let correlation = Correlation::default();
        let mut from = self.bind_from(&select.from, outer, Some(&correlation))?;
        let block =
            Block { inner_width: from.scope.width(), scope: with_outer(&from.scope, outer), correlation: &correlation };
        let mut conjuncts = std::mem::take(&mut from.on_conjuncts);
        let mut subqueries = Vec::new();
        if let Some(selection) = &select.selection {
            let mut ast_conjuncts = Vec::new();
            split_ast_conjuncts(selection, &mut ast_conjuncts);
            for conjunct in ast_conjuncts {
                match self.subquery_join(conjunct, &block)? {
                    Some(join) => subqueries.push(join),
                    None => split_conjuncts(block.binder(self).bind(conjunct)?, &mut conjuncts),
                }
            }
        }
        let conjuncts: Vec<Expr> = conjuncts.into_iter().flat_map(factor_or).collect();
        let output = self.bind_outputs(select, order_by, &block)?;
        let used = used_columns(&from, &conjuncts, &subqueries, &output);
        let planned = self.plan_joins(from, conjuncts, &used)?;
        let planned = apply_subquery_joins(planned, subqueries);
        let distinct = matches!(select.distinct, Some(ast::Distinct::Distinct));
        let mut bound = finish_select(planned, output, distinct, limit, offset)?;
        bound.params = correlation.params();
        Ok(bound)
    }

    fn bind_outputs(&self, select: &ast::Select, order_by: &[ast::OrderByExpr], block: &Block<'_>) -> Result<Outputs> {
        let windows = WindowContext { calls: RefCell::new(Vec::new()), named: &select.named_window };
        let mut outputs = self.bind_outputs_with(select, order_by, block, &windows)?;
        outputs.windows = windows.calls.into_inner();
        Ok(outputs)
    }

    /// The select list, ORDER BY and aggregation; window calls go to `windows`.
    fn bind_outputs_with(
        &self,
        select: &ast::Select,
        order_by: &[ast::OrderByExpr],
        block: &Block<'_>,
        windows: &WindowContext<'_>,
    ) -> Result<Outputs> {
        let binder = ExprBinder { windows: Some(windows), ..block.binder(self) };
        let scope = &block.scope;
        let items = expand_select_items(&select.projection, scope)?;
        let group_exprs = match &select.group_by {
            ast::GroupByExpr::Expressions(exprs, modifiers) if modifiers.is_empty() => exprs.as_slice(),
            _ => return Err(EngineError::unsupported("GROUP BY ALL, ROLLUP, CUBE or GROUPING SETS")),
        };
        let aggregated = !group_exprs.is_empty()
            || items.iter().any(|(e, _)| contains_aggregate(e))
            || select.having.is_some()
            || order_by.iter().any(|o| contains_aggregate(&o.expr));
        let names: Vec<String> = items.iter().map(|(_, n)| n.clone()).collect();
        if !aggregated {
            let exprs = items.iter().map(|(e, _)| binder.bind(e)).collect::<Result<Vec<_>>>()?;
            let order = bind_order(&order_items(order_by)?, &names, &exprs, |e| binder.bind(e))?;
            let distinct_on = bind_distinct_on(select, &names, &exprs, |e| binder.bind(e))?;
            return Ok(Outputs {
                names,
                exprs,
                order,
                distinct_on,
                aggregate: None,
                having: None,
                windows: Vec::new(),
            });
        }
        // Window functions are not allowed in GROUP BY (42P20), also through `GROUP BY 1`.
        let group_binder = ExprBinder { windows: None, ..binder };
        let groups = group_exprs
            .iter()
            .map(|g| group_binder.bind(resolve_group_reference(g, &items, &binder)?))
            .collect::<Result<Vec<_>>>()?;
        let mut context = AggregateContext { groups: &groups, aggregates: Vec::new() };
        let exprs = items.iter().map(|(e, _)| binder.bind_aggregated(e, &mut context)).collect::<Result<Vec<_>>>()?;
        // Window functions are computed after HAVING: not allowed in it.
        let having_binder = ExprBinder { windows: None, ..binder };
        let having = select.having.as_ref().map(|h| having_binder.bind_aggregated(h, &mut context)).transpose()?;
        let order = bind_order(&order_items(order_by)?, &names, &exprs, |e| binder.bind_aggregated(e, &mut context))?;
        let distinct_on = bind_distinct_on(select, &names, &exprs, |e| binder.bind_aggregated(e, &mut context))?;
        let aggregates = context.aggregates;
        Ok(Outputs {
            names,
            exprs,
            order,
            distinct_on,
            aggregate: Some((groups, aggregates)),
            having,
            windows: Vec::new(),
        })
    }
}

/// Rows of the same types concatenated as a balanced tree of UNION ALLs (depth log2 n, so a
/// VALUES list of any length executes without deep recursion).
fn union_all(mut plans: Vec<Plan>) -> Plan {
    while plans.len() > 1 {
        let mut pairs = Vec::with_capacity(plans.len().div_ceil(2));
        let mut items = plans.into_iter();
        while let Some(left) = items.next() {
            pairs.push(match items.next() {
                Some(right) => Plan::SetOperation {
                    op: SetOperator::Union,
                    all: true,
                    left: Box::new(left),
                    right: Box::new(right),
                },
                None => left,
            });
        }
        plans = pairs;
    }
    plans.pop().unwrap_or(Plan::SingleRow)
}

/// A sort key: output index, descending, nulls first, or a hidden expression to append.
type OrderKey = (usize, bool, bool, Option<Expr>);

/// Select list, ORDER BY and aggregation, bound.
struct Outputs {
    names: Vec<String>,
    exprs: Vec<Expr>,
    /// Sort keys: output index, descending, nulls first, or a hidden expression to append.
    order: Vec<OrderKey>,
    /// `DISTINCT ON (…)` keys, as sort keys.
    distinct_on: Vec<OrderKey>,
    aggregate: Option<(Vec<Expr>, Vec<AggregateCall>)>,
    having: Option<Expr>,
    /// Window calls; call k stands in the expressions as column WINDOW_COLUMN_BASE + k.
    windows: Vec<WindowCall>,
}

/// Both operands' columns converted to their common types (PostgreSQL's select_common_type: an
/// untyped literal column takes the other side's type).
fn common_columns(op: SetOperator, left: Plan, right: Plan) -> Result<(Plan, Plan)> {
    let representative = |plan: &Plan, index: usize, data_type: DataType| match plan {
        Plan::Project { exprs, .. } if is_untyped(&exprs[index]) => exprs[index].clone(),
        _ => Expr::Column { index, data_type },
    };
    let (left_types, right_types) = (left.output_types(), right.output_types());
    let mut targets = Vec::with_capacity(left_types.len());
    for (index, (&l, &r)) in left_types.iter().zip(&right_types).enumerate() {
        let pair = vec![representative(&left, index, l), representative(&right, index, r)];
        let (_, target) = unify(pair).map_err(|_| {
            EngineError::Type(format!(
                "{} types {} and {} cannot be matched",
                op.sql_name(),
                l.sql_name(),
                r.sql_name()
            ))
        })?;
        targets.push(target);
    }
    let convert = |plan: Plan, types: &[DataType]| -> Result<Plan> {
        if types == targets.as_slice() {
            return Ok(plan);
        }
        let exprs = types
            .iter()
            .zip(&targets)
            .enumerate()
            .map(|(index, (&from, &to))| cast_expr(Expr::Column { index, data_type: from }, to))
            .collect::<Result<Vec<_>>>()?;
        Ok(Plan::Project { input: Box::new(plan), exprs })
    };
    Ok((convert(left, &left_types)?, convert(right, &right_types)?))
}

/// ORDER BY and LIMIT over a set operation's result: by output column name or position only
/// (PostgreSQL refuses other expressions there too).
fn order_and_limit(
    bound: BoundQuery,
    order_by: &[ast::OrderByExpr],
    limit: Option<usize>,
    offset: usize,
) -> Result<BoundQuery> {
    let types = bound.plan.output_types();
    let columns: Vec<Expr> =
        types.iter().enumerate().map(|(index, &data_type)| Expr::Column { index, data_type }).collect();
    let refuse = |_: &ast::Expr| -> Result<Expr> {
        Err(EngineError::unsupported("ORDER BY on a UNION/INTERSECT/EXCEPT result other than by column name or number"))
    };
    let order = bind_order(&order_items(order_by)?, &bound.names, &columns, refuse)?;
    let mut plan = bound.plan;
    if !order.is_empty() {
        let keys = order
            .into_iter()
            .map(|(index, descending, nulls_first, _)| SortKey {
                expr: columns[index].clone(),
                descending,
                nulls_first,
            })
            .collect();
        plan = Plan::Sort { input: Box::new(plan), keys, limit: limit.map(|l| l.saturating_add(offset)) };
    }
    if limit.is_some() || offset > 0 {
        plan = Plan::Limit { input: Box::new(plan), limit, offset };
    }
    Ok(BoundQuery { plan, names: bound.names, params: bound.params })
}

/// ORDER BY items as (expression, descending, nulls first).
pub(crate) fn order_items(order_by: &[ast::OrderByExpr]) -> Result<Vec<(&ast::Expr, bool, bool)>> {
    order_by
        .iter()
        .map(|item| {
            let descending = match &item.options.sort {
                None | Some(ast::OrderBySort::Asc) => false,
                Some(ast::OrderBySort::Desc) => true,
                // `USING <` / `USING >`: the ordering operators of ascending / descending order.
                Some(ast::OrderBySort::Using(operator)) => match operator.to_string().as_str() {
                    "<" => false,
                    ">" => true,
                    other => return Err(EngineError::unsupported(format!("ORDER BY … USING {other}"))),
                },
            };
            // PostgreSQL: NULLs sort as larger than everything, so first when descending.
            Ok((&item.expr, descending, item.options.nulls_first.unwrap_or(descending)))
        })
        .collect()
}

/// Sort keys (or DISTINCT ON keys): by output name or position, an output's expression, or
/// a hidden expression.
fn bind_order(
    items: &[(&ast::Expr, bool, bool)],
    names: &[String],
    exprs: &[Expr],
    mut bind: impl FnMut(&ast::Expr) -> Result<Expr>,
) -> Result<Vec<OrderKey>> {
    let mut keys = Vec::new();
    for &(expr, descending, nulls_first) in items {
        let by_name = match expr {
            ast::Expr::Identifier(ident) => names.iter().position(|n| *n == identifier(ident)),
            ast::Expr::Value(v) => match &v.value {
                ast::Value::Number(n, _) => {
                    let position: usize = n.parse().map_err(|_| EngineError::Syntax(format!("ORDER BY {n}")))?;
                    if position == 0 || position > names.len() {
                        return Err(EngineError::Syntax(format!("ORDER BY position {position} is not in select list")));
                    }
                    Some(position - 1)
                }
                _ => None,
            },
            _ => None,
        };
        match by_name {
            Some(index) => keys.push((index, descending, nulls_first, None)),
            None => {
                let bound = bind(expr)?;
                match exprs.iter().position(|e| *e == bound) {
                    Some(index) => keys.push((index, descending, nulls_first, None)),
                    None => keys.push((usize::MAX, descending, nulls_first, Some(bound))),
                }
            }
        }
    }
    Ok(keys)
}

impl Outputs {
    fn all_exprs(&self) -> impl Iterator<Item = &Expr> {
        self.exprs.iter()
    }
}

fn used_columns(from: &From, conjuncts: &[Expr], subqueries: &[SubqueryJoin], output: &Outputs) -> Vec<bool> {
    let mut used = vec![false; from.scope.width()];
    let mut exprs: Vec<&Expr> = conjuncts.iter().collect();
    exprs.extend(from.left_joins.iter().flat_map(|l| &l.on));
    exprs.extend(subqueries.iter().flat_map(|j| &j.probe_keys));
    match &output.aggregate {
        Some((groups, aggregates)) => {
            exprs.extend(groups);
            exprs.extend(aggregates.iter().flat_map(|a| a.argument.iter().chain(&a.second).chain(&a.filter)));
        }
        None => {
            exprs.extend(output.all_exprs());
            let keys = output.order.iter().chain(&output.distinct_on);
            exprs.extend(keys.filter_map(|(_, _, _, hidden)| hidden.as_ref()));
            for call in &output.windows {
                exprs.extend(call.args.iter().chain(&call.partition).chain(call.order.iter().map(|k| &k.expr)));
            }
        }
    }
    for expr in exprs {
        expr.columns().into_iter().filter(|&c| c < WINDOW_COLUMN_BASE).for_each(|c| used[c] = true);
    }
    for join in subqueries {
        if let Some(residual) = &join.residual {
            residual.columns().into_iter().filter(|&c| c < join.outer_width).for_each(|c| used[c] = true);
        }
    }
    used
}

fn finish_select(
    planned: Planned,
    mut output: Outputs,
    distinct: bool,
    limit: Option<usize>,
    offset: usize,
) -> Result<BoundQuery> {
    let visible = output.exprs.len();
    let mut sort_keys = Vec::new();
    for (index, descending, nulls_first, hidden) in std::mem::take(&mut output.order_keys()) {
        if hidden.is_some() && distinct {
            return Err(EngineError::Syntax(
                "for SELECT DISTINCT, ORDER BY expressions must appear in select list".into(),
            ));
        }
        sort_keys.push((output.column_of(index, hidden), descending, nulls_first));
    }
    let on_keys: Vec<usize> = std::mem::take(&mut output.distinct_on)
        .into_iter()
        .map(|(index, _, _, hidden)| output.column_of(index, hidden))
        .collect();
    check_distinct_on(&on_keys, &sort_keys)?;
    let windows = std::mem::take(&mut output.windows);
    let mut plan = match output.aggregate.take() {
        Some((groups, aggregates)) => {
            let groups = groups.iter().map(|g| planned.localize(g)).collect();
            let aggregates = aggregates
                .into_iter()
                .map(|mut a| {
                    a.argument = a.argument.map(|e| planned.localize(&e));
                    a.second = a.second.map(|e| planned.localize(&e));
                    a.filter = a.filter.map(|e| planned.localize(&e));
                    a
                })
                .collect();
            let mut plan = Plan::Aggregate { input: Box::new(planned.plan), groups, aggregates };
            if let Some(having) = output.having.take() {
                plan = Plan::Filter { input: Box::new(plan), predicate: having };
            }
            let (plan, exprs) = with_windows(plan, windows, &output.exprs, |e| e.clone());
            Plan::Project { input: Box::new(plan), exprs }
        }
        None => {
            let windows = windows.into_iter().map(|call| localize_call(&planned, call)).collect();
            let exprs: Vec<Expr> = output.exprs.iter().map(|e| localize(&planned, e)).collect();
            let (plan, exprs) = with_windows(planned.plan, windows, &exprs, Expr::clone);
            Plan::Project { input: Box::new(plan), exprs }
        }
    };
    if distinct {
        let groups = (0..visible).map(|i| Expr::Column { index: i, data_type: output.exprs[i].data_type() }).collect();
        plan = Plan::Aggregate { input: Box::new(plan), groups, aggregates: Vec::new() };
    }
    if !on_keys.is_empty() {
        plan = first_of_each(plan, &on_keys, &sort_keys);
    }
    let types = plan.output_types();
    if !sort_keys.is_empty() {
        let keys = sort_keys
            .iter()
            .map(|&(index, descending, nulls_first)| SortKey {
                expr: Expr::Column { index, data_type: types[index] },
                descending,
                nulls_first,
            })
            .collect();
        plan = Plan::Sort { input: Box::new(plan), keys, limit: limit.map(|l| l.saturating_add(offset)) };
    }
    if limit.is_some() || offset > 0 {
        plan = Plan::Limit { input: Box::new(plan), limit, offset };
    }
    if types.len() > visible {
        let exprs = (0..visible).map(|i| Expr::Column { index: i, data_type: types[i] }).collect();
        plan = Plan::Project { input: Box::new(plan), exprs };
    }
    Ok(BoundQuery { plan, names: output.names, params: Vec::new() })
}

/// `plan` with a Window node for `windows` on top (if any), and `exprs` over its output: the
/// placeholder of call k becomes the column after the input's columns plus k.
fn with_windows(
    plan: Plan,
    windows: Vec<WindowCall>,
    exprs: &[Expr],
    over_input: impl Fn(&Expr) -> Expr,
) -> (Plan, Vec<Expr>) {
    let width = plan.width();
    let exprs = exprs
        .iter()
        .map(|e| {
            over_input(e).map_columns(&|c| if c >= WINDOW_COLUMN_BASE { width + (c - WINDOW_COLUMN_BASE) } else { c })
        })
        .collect();
    if windows.is_empty() {
        return (plan, exprs);
    }
    (Plan::Window { input: Box::new(plan), calls: windows }, exprs)
}

/// `planned.localize`, leaving window placeholders as they are.
fn localize(planned: &Planned, expr: &Expr) -> Expr {
    let positions: std::collections::HashMap<usize, usize> =
        planned.layout.iter().enumerate().map(|(i, &w)| (w, i)).collect();
    expr.map_columns(&|wide| if wide >= WINDOW_COLUMN_BASE { wide } else { positions[&wide] })
}

fn localize_call(planned: &Planned, call: WindowCall) -> WindowCall {
    WindowCall {
        args: call.args.iter().map(|e| planned.localize(e)).collect(),
        partition: call.partition.iter().map(|e| planned.localize(e)).collect(),
        order: call.order.iter().map(|k| SortKey { expr: planned.localize(&k.expr), ..k.clone() }).collect(),
        ..call
    }
}

/// PostgreSQL: the DISTINCT ON keys must be the leading ORDER BY keys (in any order) — 42P10.
fn check_distinct_on(on_keys: &[usize], sort_keys: &[(usize, bool, bool)]) -> Result<()> {
    let mut covered = std::collections::HashSet::new();
    for &(index, _, _) in sort_keys {
        if on_keys.iter().all(|k| covered.contains(k)) {
            break;
        }
        if !on_keys.contains(&index) {
            return Err(EngineError::InvalidColumnReference(
                "SELECT DISTINCT ON expressions must match initial ORDER BY expressions".into(),
            ));
        }
        covered.insert(index);
    }
    Ok(())
}

/// DISTINCT ON: the first row (in ORDER BY order) of each set of rows equal on `on_keys`, as
/// `row_number() OVER (PARTITION BY on ORDER BY …) = 1`.
fn first_of_each(plan: Plan, on_keys: &[usize], sort_keys: &[(usize, bool, bool)]) -> Plan {
    let types = plan.output_types();
    let column = |index: usize| Expr::Column { index, data_type: types[index] };
    let call = WindowCall {
        function: WindowFunction::RowNumber,
        args: Vec::new(),
        partition: on_keys.iter().map(|&i| column(i)).collect(),
        order: sort_keys
            .iter()
            .map(|&(index, descending, nulls_first)| SortKey { expr: column(index), descending, nulls_first })
            .collect(),
        frame: WindowFrame::DEFAULT,
        data_type: DataType::Int64,
    };
    let width = types.len();
    let first = Expr::binary(
        BinaryOp::Eq,
        Expr::Column { index: width, data_type: DataType::Int64 },
        Expr::literal(Value::Int64(1), DataType::Int64),
        DataType::Bool,
    );
    let numbered = Plan::Window { input: Box::new(plan), calls: vec![call] };
    let filtered = Plan::Filter { input: Box::new(numbered), predicate: first };
    Plan::Project { input: Box::new(filtered), exprs: (0..width).map(column).collect() }
}

/// DISTINCT ON (…) bound as sort keys (PostgreSQL resolves them as ORDER BY items).
fn bind_distinct_on(
    select: &ast::Select,
    names: &[String],
    exprs: &[Expr],
    bind: impl FnMut(&ast::Expr) -> Result<Expr>,
) -> Result<Vec<OrderKey>> {
    let Some(ast::Distinct::On(on)) = &select.distinct else { return Ok(Vec::new()) };
    let items: Vec<(&ast::Expr, bool, bool)> = on.iter().map(|e| (e, false, false)).collect();
    bind_order(&items, names, exprs, bind)
}

impl Outputs {
    /// The output column of a sort key: its index, or a hidden column (appended once) for its
    /// expression.
    fn column_of(&mut self, index: usize, hidden: Option<Expr>) -> usize {
        let Some(expr) = hidden else { return index };
        match self.exprs.iter().position(|e| *e == expr) {
            Some(existing) => existing,
            None => {
                self.exprs.push(expr);
                self.exprs.len() - 1
            }
        }
    }

    fn order_keys(&mut self) -> Vec<OrderKey> {
        std::mem::take(&mut self.order)
    }
}

/// LIMIT and OFFSET: constant expressions of type bigint (PostgreSQL: out of range is
/// 22003, negative 2201W/2201X, LIMIT NULL and LIMIT ALL mean no limit).
fn limit_offset(query: &ast::Query) -> Result<(Option<usize>, usize)> {
    let count = |e: &ast::Expr, offset: bool| -> Result<Option<usize>> {
        let scope = Scope::default();
        let bound = ExprBinder::new(&scope).bind(e).map_err(|error| match error {
            EngineError::UnknownColumn(_) | EngineError::AmbiguousColumn(_) => EngineError::Syntax(format!(
                "argument of {} must not contain variables",
                if offset { "OFFSET" } else { "LIMIT" }
            )),
            other => other,
        })?;
        match evaluate_constant(&cast_expr(bound, DataType::Int64)?)? {
            Value::Null => Ok(None),
            Value::Int64(n) if n < 0 => Err(EngineError::NegativeRowCount { offset }),
            Value::Int64(n) => Ok(Some(usize::try_from(n).unwrap_or(usize::MAX))),
            other => Err(EngineError::Type(format!("LIMIT/OFFSET value {other:?}"))),
        }
    };
    match &query.limit_clause {
        None => Ok((None, 0)),
        Some(ast::LimitClause::LimitOffset { limit, offset, limit_by }) if limit_by.is_empty() => {
            let limit = limit.as_ref().map(|l| count(l, false)).transpose()?.flatten();
            let offset = offset.as_ref().map(|o| count(&o.value, true)).transpose()?.flatten().unwrap_or(0);
            Ok((limit, offset))
        }
        Some(_) => Err(EngineError::unsupported("this LIMIT form")),
    }
}

fn reject_unsupported_select(select: &ast::Select) -> Result<()> {
    if select.top.is_some() || select.into.is_some() || !select.lateral_views.is_empty() {
        return Err(EngineError::unsupported("TOP, SELECT INTO or LATERAL VIEW"));
    }
    if select.qualify.is_some() {
        return Err(EngineError::unsupported("QUALIFY"));
    }
    Ok(())
}

/// The conjuncts of an AND tree, in order (iterative: chains may be as long as the text).
pub(crate) fn split_ast_conjuncts<'a>(expr: &'a ast::Expr, out: &mut Vec<&'a ast::Expr>) {
    let mut pending = vec![expr];
    while let Some(expr) = pending.pop() {
        match expr {
            ast::Expr::BinaryOp { left, op: ast::BinaryOperator::And, right } => {
                pending.push(right);
                pending.push(left);
            }
            ast::Expr::Nested(inner)
                if matches!(inner.as_ref(), ast::Expr::BinaryOp { op: ast::BinaryOperator::And, .. }) =>
            {
                pending.push(inner)
            }
            other => out.push(other),
        }
    }
}

/// Select items with `*` and `t.*` expanded, each with its output name.
fn expand_select_items<'a>(items: &'a [ast::SelectItem], scope: &Scope) -> Result<Vec<(Cow<'a, ast::Expr>, String)>> {
    let mut out = Vec::new();
    for item in items {
        match item {
            ast::SelectItem::UnnamedExpr(expr) => out.push((Cow::Borrowed(expr), output_name(expr))),
            ast::SelectItem::ExprWithAlias { expr, alias } => out.push((Cow::Borrowed(expr), identifier(alias))),
            ast::SelectItem::Wildcard(_) if scope.star.is_some() => {
                for (alias, name) in scope.star.iter().flatten() {
                    let expr = match alias.is_empty() {
                        true => ast::Expr::Identifier(quoted(name)),
                        false => ast::Expr::CompoundIdentifier(vec![quoted(alias), quoted(name)]),
                    };
                    out.push((Cow::Owned(expr), name.clone()));
                }
            }
            ast::SelectItem::Wildcard(_) => {
                for relation in &scope.relations {
                    for (name, _) in &relation.columns {
                        let expr = ast::Expr::CompoundIdentifier(vec![quoted(&relation.alias), quoted(name)]);
                        out.push((Cow::Owned(expr), name.clone()));
                    }
                }
            }
            ast::SelectItem::QualifiedWildcard(ast::SelectItemQualifiedWildcardKind::ObjectName(name), _) => {
                let alias = object_name(name)?;
                if let Some(columns) = scope.join_alias(&alias) {
                    for (column, _) in columns {
                        let expr = ast::Expr::CompoundIdentifier(vec![quoted(&alias), quoted(column)]);
                        out.push((Cow::Owned(expr), column.clone()));
                    }
                    continue;
                }
                let relation = scope
                    .relations
                    .iter()
                    .find(|r| r.alias == alias)
                    .ok_or_else(|| EngineError::UnknownTable(alias.clone()))?;
                for (column, _) in &relation.columns {
                    let expr = ast::Expr::CompoundIdentifier(vec![quoted(&alias), quoted(column)]);
                    out.push((Cow::Owned(expr), column.clone()));
                }
            }
            other => return Err(EngineError::unsupported(format!("select item {other}"))),
        }
    }
    Ok(out)
}

/// An identifier that names `name` exactly (a column named "Approved" keeps its case).
fn quoted(name: &str) -> ast::Ident {
    ast::Ident::with_quote('"', name)
}

/// PostgreSQL's default output names: the column name, the function name, else `?column?`.
fn output_name(expr: &ast::Expr) -> String {
    figure_name(expr).unwrap_or_else(|| "?column?".into())
}

/// PostgreSQL's FigureColname: a name from a column, function, CASE…, or for a cast of
/// something nameless the type's name (`1::int` is `int4`). Iterative over cast chains.
fn figure_name(mut expr: &ast::Expr) -> Option<String> {
    let mut cast_type: Option<&ast::DataType> = None;
    loop {
        let name = match expr {
            ast::Expr::Identifier(ident) => Some(identifier(ident)),
            ast::Expr::CompoundIdentifier(parts) => parts.last().map(identifier),
            ast::Expr::Function(f) => object_name(&f.name).ok(),
            ast::Expr::Nested(inner) => {
                expr = inner;
                continue;
            }
            ast::Expr::Cast { expr: inner, data_type, .. } => {
                cast_type = cast_type.or(Some(data_type));
                expr = inner;
                continue;
            }
            ast::Expr::Case { .. } => Some("case".into()),
            ast::Expr::Extract { .. } => Some("extract".into()),
            // `timestamp '…'` is a cast of a string: named by its type, as `'…'::timestamp`.
            ast::Expr::TypedString(typed) => cast_type_name(&typed.data_type),
            ast::Expr::Interval(_) => Some("interval".into()),
            ast::Expr::Substring { .. } => Some("substring".into()),
            ast::Expr::Exists { .. } => Some("exists".into()),
            _ => None,
        };
        return name.or_else(|| cast_type.and_then(cast_type_name));
    }
}

/// The type name PostgreSQL's grammar gives a cast target (`int` is `int4`).
fn cast_type_name(data_type: &ast::DataType) -> Option<String> {
    use ast::DataType as T;
    let name = match data_type {
        T::Boolean | T::Bool => "bool",
        T::Int(_) | T::Integer(_) | T::Int4(_) => "int4",
        T::SmallInt(_) | T::Int2(_) => "int2",
        T::BigInt(_) | T::Int8(_) => "int8",
        T::Double(_) | T::DoublePrecision | T::Float8 => "float8",
        T::Real | T::Float4 => "float4",
        T::Float(_) => "float8",
        T::Date => "date",
        T::Timestamp(_, ast::TimezoneInfo::WithTimeZone | ast::TimezoneInfo::Tz) => "timestamptz",
        T::Timestamp(..) => "timestamp",
        T::Interval { .. } => "interval",
        T::Text => "text",
        T::Varchar(_) | T::CharacterVarying(_) => "varchar",
        T::Char(_) | T::Character(_) => "bpchar",
        T::Numeric(_) | T::Decimal(_) => "numeric",
        _ => return None,
    };
    Some(name.into())
}

/// GROUP BY 1 and GROUP BY alias refer to select items.
fn resolve_group_reference<'e>(
    expr: &'e ast::Expr,
    items: &'e [(Cow<'_, ast::Expr>, String)],
    binder: &ExprBinder<'_>,
) -> Result<&'e ast::Expr> {
    match expr {
        ast::Expr::Value(v) => match &v.value {
            ast::Value::Number(n, _) => {
                let position: usize = n.parse().map_err(|_| EngineError::Syntax(format!("GROUP BY {n}")))?;
                items
                    .get(position.wrapping_sub(1))
                    .map(|(e, _)| e.as_ref())
                    .ok_or_else(|| EngineError::Syntax(format!("GROUP BY position {position} is not in select list")))
            }
            _ => Ok(expr),
        },
        // PostgreSQL: an input column of that name wins over an output alias.
        ast::Expr::Identifier(ident) if binder.bind(expr).is_err() => {
            let name = identifier(ident);
            Ok(items.iter().find(|(_, n)| *n == name).map_or(expr, |(e, _)| e.as_ref()))
        }
        _ => Ok(expr),
    }
}
