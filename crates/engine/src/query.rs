//! Query blocks: SELECT … FROM … WHERE … GROUP BY … HAVING … ORDER BY … LIMIT → [`Plan`].
//!
//! ```text
//!   FROM ─► scope (wide row) ─► WHERE conjuncts ─► pushdown into scans ─► greedy join tree
//!        ─► left joins ─► IN/EXISTS as semi/anti joins ─► aggregate ─► HAVING ─► project
//!        ─► DISTINCT ─► sort / top-k ─► limit ─► strip hidden sort columns
//! ```

use std::borrow::Cow;
use std::sync::Arc;

use sqlparser::ast;

use crate::bind::{
    cast_expr, common_type, contains_aggregate, identifier, object_name, AggregateContext, ExprBinder, Scope,
};
use crate::error::{EngineError, Result};
use crate::expr::evaluate_constant;
use crate::expr::{conjunction, BinaryOp, Expr};
use crate::joins::{
    derive_single_relation_filters, factor_or, join_all, plan_relation, relation_set, split_conjuncts, Conjunct,
    JoinInput, Planned, RelationSource, RELATIONS_MAX,
};
use crate::plan::{AggregateCall, JoinKind, Plan, SortKey};
use crate::storage::Catalog;
use crate::types::{DataType, Value};

/// A bound query: its plan and output column names.
pub struct BoundQuery {
    pub plan: Plan,
    pub names: Vec<String>,
}

/// A LEFT JOIN waiting to be applied after the inner joins.
struct LeftJoin {
    relation: usize,
    on: Vec<Expr>,
}

/// An IN/EXISTS predicate that becomes a semi or anti join.
struct SubqueryJoin {
    kind: JoinKind,
    build: Planned,
    /// Probe keys over the outer wide row, build keys over the build plan's output.
    probe_keys: Vec<Expr>,
    build_keys: Vec<Expr>,
    /// Over outer wide row ++ build output (outer columns first, build after `outer_width`).
    residual: Option<Expr>,
    outer_width: usize,
}

/// The FROM clause, bound.
struct From {
    scope: Scope,
    inputs: Vec<JoinInput>,
    on_conjuncts: Vec<Expr>,
    left_joins: Vec<LeftJoin>,
}

pub struct QueryBinder<'c> {
    pub catalog: &'c Catalog,
}

impl<'c> QueryBinder<'c> {
    pub fn bind_query(&self, query: &ast::Query) -> Result<BoundQuery> {
        let _depth = crate::depth::enter()?;
        if query.with.is_some() {
            return Err(EngineError::unsupported("WITH (common table expressions)"));
        }
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
            ast::SetExpr::Select(select) => self.bind_select(select, order_by, limit, offset),
            ast::SetExpr::Query(inner) if order_by.is_empty() && limit.is_none() => self.bind_query(inner),
            ast::SetExpr::SetOperation { op, .. } => Err(EngineError::unsupported(format!("set operation {op}"))),
            ast::SetExpr::Values(_) => Err(EngineError::unsupported("VALUES as a query")),
            other => Err(EngineError::unsupported(format!("query body {other}"))),
        }
    }

    fn bind_from(&self, from: &[ast::TableWithJoins], outer: Option<&Scope>) -> Result<From> {
        let mut bound =
            From { scope: Scope::default(), inputs: Vec::new(), on_conjuncts: Vec::new(), left_joins: Vec::new() };
        for item in from {
            self.add_relation(&mut bound, &item.relation)?;
            for join in &item.joins {
                let relation = self.add_relation(&mut bound, &join.relation)?;
                let (left, constraint) = match &join.join_operator {
                    ast::JoinOperator::Join(c) | ast::JoinOperator::Inner(c) => (false, c),
                    ast::JoinOperator::Left(c) | ast::JoinOperator::LeftOuter(c) => (true, c),
                    ast::JoinOperator::CrossJoin(c) => (false, c),
                    other => {
                        return Err(EngineError::unsupported(
                            format!("join type {other:?}").chars().take(60).collect::<String>(),
                        ))
                    }
                };
                let on = match constraint {
                    ast::JoinConstraint::On(expr) => {
                        let scope = with_outer(&bound.scope, outer);
                        let mut conjuncts = Vec::new();
                        split_conjuncts(ExprBinder { scope: &scope }.bind(expr)?, &mut conjuncts);
                        conjuncts
                    }
                    ast::JoinConstraint::None => Vec::new(),
                    _ => return Err(EngineError::unsupported("JOIN USING or NATURAL JOIN")),
                };
                if left {
                    bound.left_joins.push(LeftJoin { relation, on });
                } else {
                    bound.on_conjuncts.extend(on);
                }
            }
        }
        if bound.inputs.len() > RELATIONS_MAX {
            return Err(EngineError::LimitExceeded(format!("more than {RELATIONS_MAX} relations in one query block")));
        }
        Ok(bound)
    }

    fn add_relation(&self, from: &mut From, factor: &ast::TableFactor) -> Result<usize> {
        let (alias, columns, source) = match factor {
            ast::TableFactor::Table { name, alias, args: None, .. } => {
                let table = self.catalog.get(&object_name(name)?)?;
                let alias = alias.as_ref().map_or(table.name.clone(), |a| identifier(&a.name));
                let columns: Vec<(String, DataType)> =
                    table.schema.iter().map(|c| (c.name.clone(), c.data_type)).collect();
                (alias, columns, RelationSource::Table(Arc::clone(&table)))
            }
            ast::TableFactor::Derived { subquery, alias: Some(alias), lateral: false, .. } => {
                let bound = self.bind_query(subquery)?;
                let names: Vec<String> = if alias.columns.is_empty() {
                    bound.names.clone()
                } else {
                    alias.columns.iter().map(|c| identifier(&c.name)).collect()
                };
                let columns = names.into_iter().zip(bound.plan.output_types()).collect();
                (identifier(&alias.name), columns, RelationSource::Derived(bound.plan))
            }
            other => return Err(EngineError::unsupported(format!("FROM item {other}"))),
        };
        let width = columns.len();
        let index = from.scope.add(&alias, columns);
        from.inputs.push(JoinInput { source, offset: from.scope.relations[index].offset, width });
        Ok(index)
    }

    fn bind_select(
        &self,
        select: &ast::Select,
        order_by: &[ast::OrderByExpr],
        limit: Option<usize>,
        offset: usize,
    ) -> Result<BoundQuery> {
        reject_unsupported_select(select)?;
        let mut from = self.bind_from(&select.from, None)?;
        let mut conjuncts = std::mem::take(&mut from.on_conjuncts);
        let mut subqueries = Vec::new();
        if let Some(selection) = &select.selection {
            let mut ast_conjuncts = Vec::new();
            split_ast_conjuncts(selection, &mut ast_conjuncts);
            for conjunct in ast_conjuncts {
                match self.subquery_join(conjunct, &from.scope)? {
                    Some(join) => subqueries.push(join),
                    None => split_conjuncts(ExprBinder { scope: &from.scope }.bind(conjunct)?, &mut conjuncts),
                }
            }
        }
        let conjuncts: Vec<Expr> = conjuncts.into_iter().flat_map(factor_or).collect();
        let output = self.bind_outputs(select, order_by, &from.scope)?;
        let used = used_columns(&from, &conjuncts, &subqueries, &output);
        let planned = self.plan_joins(from, conjuncts, &used)?;
        let planned = apply_subquery_joins(planned, subqueries);
        finish_select(planned, output, matches!(select.distinct, Some(ast::Distinct::Distinct)), limit, offset)
    }

    fn bind_outputs(&self, select: &ast::Select, order_by: &[ast::OrderByExpr], scope: &Scope) -> Result<Outputs> {
        let binder = ExprBinder { scope };
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
            let order = bind_order(order_by, &names, &exprs, |e| binder.bind(e))?;
            return Ok(Outputs { names, exprs, order, aggregate: None, having: None });
        }
        let groups = group_exprs
            .iter()
            .map(|g| binder.bind(resolve_group_reference(g, &items, scope)?))
            .collect::<Result<Vec<_>>>()?;
        let mut context = AggregateContext { groups: &groups, aggregates: Vec::new() };
        let exprs = items.iter().map(|(e, _)| binder.bind_aggregated(e, &mut context)).collect::<Result<Vec<_>>>()?;
        let having = select.having.as_ref().map(|h| binder.bind_aggregated(h, &mut context)).transpose()?;
        let order = bind_order(order_by, &names, &exprs, |e| binder.bind_aggregated(e, &mut context))?;
        let aggregates = context.aggregates;
        Ok(Outputs { names, exprs, order, aggregate: Some((groups, aggregates)), having })
    }

    fn plan_joins(&self, from: From, conjuncts: Vec<Expr>, used: &[bool]) -> Result<Planned> {
        let From { inputs, left_joins, .. } = from;
        if inputs.is_empty() {
            let mut planned = Planned::with_layout(Plan::SingleRow, Vec::new(), 1.0);
            planned.add_filters(&conjuncts, 1.0);
            return Ok(planned);
        }
        let left_relations: u64 = left_joins.iter().fold(0, |set, l| set | (1 << l.relation));
        let mut per_relation: Vec<Vec<Expr>> = vec![Vec::new(); inputs.len()];
        let mut multi = Vec::new();
        for conjunct in conjuncts {
            let relations = relation_set(&conjunct, &inputs);
            for derived in derive_single_relation_filters(&conjunct, &inputs) {
                let relation = relation_set(&derived, &inputs).trailing_zeros() as usize;
                per_relation[relation].push(derived);
            }
            if relations.count_ones() <= 1 && relations & left_relations == 0 {
                per_relation[relations.trailing_zeros().min(inputs.len() as u32 - 1) as usize].push(conjunct);
            } else {
                multi.push(Conjunct { expr: conjunct, relations });
            }
        }
        let mut left_on: Vec<(usize, Vec<Expr>)> = Vec::new();
        for left in left_joins {
            let (own, rest): (Vec<Expr>, Vec<Expr>) =
                left.on.into_iter().partition(|c| relation_set(c, &inputs) == 1 << left.relation);
            per_relation[left.relation].extend(own);
            left_on.push((left.relation, rest));
        }
        let widths: Vec<usize> = inputs.iter().map(|i| i.offset).collect();
        let mut inner = Vec::new();
        let mut outer_items = Vec::new();
        for (index, (input, filters)) in inputs.into_iter().zip(per_relation).enumerate() {
            let planned = plan_relation(index, input, used, &filters)?;
            if left_relations & (1 << index) != 0 {
                outer_items.push(planned);
            } else {
                inner.push(planned);
            }
        }
        let (now, later): (Vec<Conjunct>, Vec<Conjunct>) =
            multi.into_iter().partition(|c| c.relations & left_relations == 0);
        let offsets_only: Vec<JoinInput> = widths
            .iter()
            .map(|&offset| JoinInput { source: RelationSource::Derived(Plan::SingleRow), offset, width: 0 })
            .collect();
        let mut planned = join_all(inner, now, &offsets_only)?;
        for ((_, on), build) in left_on.into_iter().zip(outer_items) {
            planned = left_join(planned, build, on, &offsets_only)?;
        }
        planned.add_filters(&later.into_iter().map(|c| c.expr).collect::<Vec<_>>(), 1.0 / 3.0);
        Ok(planned)
    }

    /// `x [NOT] IN (subquery)` and `[NOT] EXISTS (subquery)` as semi/anti joins.
    fn subquery_join(&self, expr: &ast::Expr, scope: &Scope) -> Result<Option<SubqueryJoin>> {
        match expr {
            ast::Expr::Nested(inner) => self.subquery_join(inner, scope),
            ast::Expr::UnaryOp { op: ast::UnaryOperator::Not, expr } => match expr.as_ref() {
                ast::Expr::Exists { subquery, negated } => self.exists_join(subquery, !negated, scope).map(Some),
                ast::Expr::InSubquery { expr, subquery, negated } => {
                    self.in_join(expr, subquery, !negated, scope).map(Some)
                }
                _ => Ok(None),
            },
            ast::Expr::Exists { subquery, negated } => self.exists_join(subquery, *negated, scope).map(Some),
            ast::Expr::InSubquery { expr, subquery, negated } => {
                self.in_join(expr, subquery, *negated, scope).map(Some)
            }
            _ => Ok(None),
        }
    }

    fn in_join(&self, expr: &ast::Expr, subquery: &ast::Query, negated: bool, scope: &Scope) -> Result<SubqueryJoin> {
        let probe = ExprBinder { scope }.bind(expr)?;
        let bound = self.bind_query(subquery)?;
        let types = bound.plan.output_types();
        let [build_type] = types.as_slice() else {
            return Err(EngineError::Syntax("subquery in IN must return exactly one column".into()));
        };
        let target = common_type(probe.data_type(), *build_type, BinaryOp::Eq)?;
        let build_key = cast_expr(Expr::Column { index: 0, data_type: *build_type }, target)?;
        let rows = 1000.0;
        let build = Planned::from_plan(bound.plan, rows);
        let kind = if negated { JoinKind::NullAwareAnti } else { JoinKind::Semi };
        let probe_keys = vec![cast_expr(probe, target)?];
        Ok(SubqueryJoin {
            kind,
            build,
            probe_keys,
            build_keys: vec![build_key],
            residual: None,
            outer_width: scope.width(),
        })
    }

    fn exists_join(&self, subquery: &ast::Query, negated: bool, outer: &Scope) -> Result<SubqueryJoin> {
        let ast::SetExpr::Select(select) = subquery.body.as_ref() else {
            return Err(EngineError::unsupported("EXISTS over a set operation"));
        };
        if select.group_by != ast::GroupByExpr::Expressions(vec![], vec![]) || select.having.is_some() {
            return Err(EngineError::unsupported("EXISTS with GROUP BY or HAVING"));
        }
        let from = self.bind_from(&select.from, Some(outer))?;
        let inner_width = from.scope.width();
        let scope = with_outer(&from.scope, Some(outer));
        let mut conjuncts = from.on_conjuncts.clone();
        if let Some(selection) = &select.selection {
            split_conjuncts(ExprBinder { scope: &scope }.bind(selection)?, &mut conjuncts);
        }
        let is_inner = |e: &Expr| e.columns().iter().all(|&c| c < inner_width);
        let is_outer = |e: &Expr| e.columns().iter().all(|&c| c >= inner_width);
        let (mut inner, mut keys, mut residual) = (Vec::new(), Vec::new(), Vec::new());
        for conjunct in conjuncts {
            if is_inner(&conjunct) {
                inner.push(conjunct);
                continue;
            }
            if let Expr::Binary { op: BinaryOp::Eq, left, right, .. } = &conjunct {
                if is_inner(left) && is_outer(right) {
                    keys.push(((**right).clone(), (**left).clone()));
                    continue;
                }
                if is_outer(left) && is_inner(right) {
                    keys.push(((**left).clone(), (**right).clone()));
                    continue;
                }
            }
            residual.push(conjunct);
        }
        if keys.is_empty() {
            return Err(EngineError::unsupported("EXISTS without an equality to the outer query"));
        }
        let mut used = vec![false; inner_width];
        for e in inner.iter().chain(keys.iter().map(|(_, b)| b)).chain(&residual) {
            e.columns().into_iter().filter(|&c| c < inner_width).for_each(|c| used[c] = true);
        }
        let build = self.plan_joins(from, inner, &used)?;
        let to_outer = |e: &Expr| e.map_columns(&|c| c - inner_width);
        let probe_keys = keys.iter().map(|(o, _)| to_outer(o)).collect();
        let build_keys = keys.iter().map(|(_, b)| build.localize(b)).collect();
        let outer_width = outer.width();
        let residual = conjunction(residual).map(|r| {
            let positions = &build.layout;
            r.map_columns(&|c| {
                if c >= inner_width {
                    c - inner_width
                } else {
                    outer_width
                        + positions.iter().position(|&w| w == c).expect("residual column is in the build layout")
                }
            })
        });
        let kind = if negated { JoinKind::Anti } else { JoinKind::Semi };
        Ok(SubqueryJoin { kind, build, probe_keys, build_keys, residual, outer_width })
    }
}

fn with_outer(scope: &Scope, outer: Option<&Scope>) -> Scope {
    let mut combined = scope.clone();
    if let Some(outer) = outer {
        combined.outer_start = Some(combined.relations.len());
        for relation in &outer.relations {
            combined.add(&relation.alias, relation.columns.clone());
        }
    }
    combined
}

fn left_join(probe: Planned, build: Planned, on: Vec<Expr>, inputs: &[JoinInput]) -> Result<Planned> {
    let mut probe_keys = Vec::new();
    let mut build_keys = Vec::new();
    let mut residual = Vec::new();
    for conjunct in on {
        if let Expr::Binary { op: BinaryOp::Eq, left, right, .. } = &conjunct {
            let (ls, rs) = (relation_set(left, inputs), relation_set(right, inputs));
            if ls & !probe.relations == 0 && rs & !build.relations == 0 && ls != 0 && rs != 0 {
                probe_keys.push(probe.localize(left));
                build_keys.push(build.localize(right));
                continue;
            }
            if rs & !probe.relations == 0 && ls & !build.relations == 0 && ls != 0 && rs != 0 {
                probe_keys.push(probe.localize(right));
                build_keys.push(build.localize(left));
                continue;
            }
        }
        residual.push(conjunct);
    }
    if probe_keys.is_empty() {
        return Err(EngineError::unsupported("LEFT JOIN without an equality condition"));
    }
    let mut layout = probe.layout.clone();
    layout.extend(&build.layout);
    let width = probe.layout.len();
    let residual = conjunction(residual).map(|r| {
        r.map_columns(&|c| {
            probe.layout.iter().position(|&w| w == c).unwrap_or_else(|| {
                width + build.layout.iter().position(|&w| w == c).expect("ON columns come from the two sides")
            })
        })
    });
    let rows = probe.rows;
    let relations = probe.relations | build.relations;
    let plan = Plan::HashJoin {
        kind: JoinKind::Left,
        probe: Box::new(probe.plan),
        build: Box::new(build.plan),
        probe_keys,
        build_keys,
        residual,
    };
    let mut planned = Planned::with_layout(plan, layout, rows);
    planned.relations = relations;
    Ok(planned)
}

fn apply_subquery_joins(mut planned: Planned, subqueries: Vec<SubqueryJoin>) -> Planned {
    for join in subqueries {
        let probe_keys = join.probe_keys.iter().map(|k| planned.localize(k)).collect();
        let probe_width = planned.layout.len();
        let outer_width = join.outer_width;
        let residual = join.residual.map(|r| {
            let positions = &planned.layout;
            r.map_columns(&|c| {
                if c < outer_width {
                    positions.iter().position(|&w| w == c).expect("outer residual columns are in the probe layout")
                } else {
                    probe_width + c - outer_width
                }
            })
        });
        let plan = Plan::HashJoin {
            kind: join.kind,
            probe: Box::new(std::mem::replace(&mut planned.plan, Plan::SingleRow)),
            build: Box::new(join.build.plan),
            probe_keys,
            build_keys: join.build_keys,
            residual,
        };
        planned.plan = plan;
    }
    planned
}

/// A sort key: output index, descending, nulls first, or a hidden expression to append.
type OrderKey = (usize, bool, bool, Option<Expr>);

/// Select list, ORDER BY and aggregation, bound.
struct Outputs {
    names: Vec<String>,
    exprs: Vec<Expr>,
    /// Sort keys: output index, descending, nulls first, or a hidden expression to append.
    order: Vec<OrderKey>,
    aggregate: Option<(Vec<Expr>, Vec<AggregateCall>)>,
    having: Option<Expr>,
}

fn bind_order(
    order_by: &[ast::OrderByExpr],
    names: &[String],
    exprs: &[Expr],
    mut bind: impl FnMut(&ast::Expr) -> Result<Expr>,
) -> Result<Vec<OrderKey>> {
    let mut keys = Vec::new();
    for item in order_by {
        let descending = matches!(item.options.sort, Some(ast::OrderBySort::Desc));
        // PostgreSQL: NULLs sort as larger than everything, so first when descending.
        let nulls_first = item.options.nulls_first.unwrap_or(descending);
        let by_name = match &item.expr {
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
                let bound = bind(&item.expr)?;
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
            exprs.extend(aggregates.iter().filter_map(|a| a.argument.as_ref()));
        }
        None => {
            exprs.extend(output.all_exprs());
            exprs.extend(output.order.iter().filter_map(|(_, _, _, hidden)| hidden.as_ref()));
        }
    }
    for expr in exprs {
        expr.columns().into_iter().for_each(|c| used[c] = true);
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
        let index = match hidden {
            Some(expr) => {
                if distinct {
                    return Err(EngineError::Syntax(
                        "for SELECT DISTINCT, ORDER BY expressions must appear in select list".into(),
                    ));
                }
                output.exprs.push(expr);
                output.exprs.len() - 1
            }
            None => index,
        };
        sort_keys.push((index, descending, nulls_first));
    }
    let mut plan = match output.aggregate.take() {
        Some((groups, aggregates)) => {
            let groups = groups.iter().map(|g| planned.localize(g)).collect();
            let aggregates = aggregates
                .into_iter()
                .map(|mut a| {
                    a.argument = a.argument.map(|e| planned.localize(&e));
                    a
                })
                .collect();
            let mut plan = Plan::Aggregate { input: Box::new(planned.plan), groups, aggregates };
            if let Some(having) = output.having.take() {
                plan = Plan::Filter { input: Box::new(plan), predicate: having };
            }
            Plan::Project { input: Box::new(plan), exprs: output.exprs.clone() }
        }
        None => {
            let exprs = output.exprs.iter().map(|e| planned.localize(e)).collect();
            Plan::Project { input: Box::new(planned.plan), exprs }
        }
    };
    if distinct {
        let groups = (0..visible).map(|i| Expr::Column { index: i, data_type: output.exprs[i].data_type() }).collect();
        plan = Plan::Aggregate { input: Box::new(plan), groups, aggregates: Vec::new() };
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
    Ok(BoundQuery { plan, names: output.names })
}

impl Outputs {
    fn order_keys(&mut self) -> Vec<OrderKey> {
        std::mem::take(&mut self.order)
    }
}

/// LIMIT and OFFSET: constant expressions of type bigint (PostgreSQL: out of range is
/// 22003, negative 2201W/2201X, LIMIT NULL and LIMIT ALL mean no limit).
fn limit_offset(query: &ast::Query) -> Result<(Option<usize>, usize)> {
    let count = |e: &ast::Expr, offset: bool| -> Result<Option<usize>> {
        let scope = Scope::default();
        let bound = ExprBinder { scope: &scope }.bind(e).map_err(|error| match error {
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
    if matches!(select.distinct, Some(ast::Distinct::On(_))) {
        return Err(EngineError::unsupported("DISTINCT ON"));
    }
    if select.top.is_some() || select.into.is_some() || !select.lateral_views.is_empty() {
        return Err(EngineError::unsupported("TOP, SELECT INTO or LATERAL VIEW"));
    }
    if !select.named_window.is_empty() || select.qualify.is_some() {
        return Err(EngineError::unsupported("window functions"));
    }
    Ok(())
}

/// The conjuncts of an AND tree, in order (iterative: chains may be as long as the text).
fn split_ast_conjuncts<'a>(expr: &'a ast::Expr, out: &mut Vec<&'a ast::Expr>) {
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
            ast::SelectItem::Wildcard(_) => {
                for relation in &scope.relations {
                    for (name, _) in &relation.columns {
                        let expr = ast::Expr::CompoundIdentifier(vec![
                            ast::Ident::new(&relation.alias),
                            ast::Ident::new(name),
                        ]);
                        out.push((Cow::Owned(expr), name.clone()));
                    }
                }
            }
            ast::SelectItem::QualifiedWildcard(ast::SelectItemQualifiedWildcardKind::ObjectName(name), _) => {
                let alias = object_name(name)?;
                let relation = scope
                    .relations
                    .iter()
                    .find(|r| r.alias == alias)
                    .ok_or_else(|| EngineError::UnknownTable(alias.clone()))?;
                for (column, _) in &relation.columns {
                    let expr = ast::Expr::CompoundIdentifier(vec![ast::Ident::new(&alias), ast::Ident::new(column)]);
                    out.push((Cow::Owned(expr), column.clone()));
                }
            }
            other => return Err(EngineError::unsupported(format!("select item {other}"))),
        }
    }
    Ok(out)
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
    scope: &Scope,
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
        ast::Expr::Identifier(ident) if ExprBinder { scope }.bind(expr).is_err() => {
            let name = identifier(ident);
            Ok(items.iter().find(|(_, n)| *n == name).map_or(expr, |(e, _)| e.as_ref()))
        }
        _ => Ok(expr),
    }
}
