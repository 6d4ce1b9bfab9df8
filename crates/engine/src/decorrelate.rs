//! Subqueries in WHERE turned into joins, before the general path of `exec::subquery`:
//! `x [NOT] IN (uncorrelated)` and `[NOT] EXISTS (correlated by equalities)` become semi or
//! anti joins (NOT IN a null-aware one), with the remaining correlated conditions as the
//! join's residual (TPC-H Q4, Q21, Q22).

use sqlparser::ast;

use crate::bind::{cast_expr, common_type, ExprBinder};
use crate::error::{EngineError, Result};
use crate::expr::{conjunction, BinaryOp, Expr};
use crate::from::with_outer;
use crate::joins::{split_conjuncts, Planned};
use crate::plan::{JoinKind, Plan};
use crate::query::{Block, QueryBinder};

/// An IN/EXISTS predicate that becomes a semi or anti join.
pub(crate) struct SubqueryJoin {
    pub kind: JoinKind,
    pub build: Planned,
    /// Probe keys over the outer wide row, build keys over the build plan's output.
    pub probe_keys: Vec<Expr>,
    pub build_keys: Vec<Expr>,
    /// Over outer wide row ++ build output (outer columns first, build after `outer_width`).
    pub residual: Option<Expr>,
    pub outer_width: usize,
}

impl<'c> QueryBinder<'c> {
    /// `x [NOT] IN (subquery)` and `[NOT] EXISTS (subquery)` as semi/anti joins; None when
    /// the conjunct is not such a subquery or the general path must take it.
    pub(crate) fn subquery_join(&self, expr: &ast::Expr, block: &Block<'_>) -> Result<Option<SubqueryJoin>> {
        match expr {
            ast::Expr::Nested(inner) => self.subquery_join(inner, block),
            ast::Expr::UnaryOp { op: ast::UnaryOperator::Not, expr } => match expr.as_ref() {
                ast::Expr::Exists { subquery, negated } => self.exists_join(subquery, !negated, block),
                ast::Expr::InSubquery { expr, subquery, negated } => self.in_join(expr, subquery, !negated, block),
                _ => Ok(None),
            },
            ast::Expr::Exists { subquery, negated } => self.exists_join(subquery, *negated, block),
            ast::Expr::InSubquery { expr, subquery, negated } => self.in_join(expr, subquery, *negated, block),
            _ => Ok(None),
        }
    }

    fn in_join(
        &self,
        expr: &ast::Expr,
        subquery: &ast::Query,
        negated: bool,
        block: &Block<'_>,
    ) -> Result<Option<SubqueryJoin>> {
        let probe = block.binder(self).bind(expr)?;
        let bound = self.bind_query_in(subquery, Some(&block.scope))?;
        if !bound.params.is_empty() {
            return Ok(None);
        }
        let types = bound.plan.output_types();
        let [build_type] = types.as_slice() else {
            return Err(EngineError::Syntax("subquery has too many columns".into()));
        };
        let target = common_type(probe.data_type(), *build_type, BinaryOp::Eq)?;
        let build_key = cast_expr(Expr::Column { index: 0, data_type: *build_type }, target)?;
        let rows = crate::joins::estimate_rows(&bound.plan);
        let build = Planned::from_plan(bound.plan, rows);
        let kind = if negated { JoinKind::NullAwareAnti } else { JoinKind::Semi };
        let probe_keys = vec![cast_expr(probe, target)?];
        Ok(Some(SubqueryJoin {
            kind,
            build,
            probe_keys,
            build_keys: vec![build_key],
            residual: None,
            outer_width: block.inner_width,
        }))
    }

    /// EXISTS correlated by equalities to this block's own columns (not to queries further
    /// out), with no grouping in the subquery.
    fn exists_join(&self, subquery: &ast::Query, negated: bool, block: &Block<'_>) -> Result<Option<SubqueryJoin>> {
        let ast::SetExpr::Select(select) = subquery.body.as_ref() else { return Ok(None) };
        let plain = select.group_by == ast::GroupByExpr::Expressions(vec![], vec![])
            && select.having.is_none()
            && subquery.with.is_none()
            && subquery.limit_clause.is_none();
        if !plain {
            return Ok(None);
        }
        let outer = &block.scope;
        // Join conditions inside the subquery that reach out are left to the general path.
        let reaching_out = crate::bind::Correlation::default();
        let from = self.bind_from(&select.from, Some(outer), Some(&reaching_out))?;
        if !reaching_out.params().is_empty() {
            return Ok(None);
        }
        let inner_width = from.scope.width();
        let scope = with_outer(&from.scope, Some(outer));
        let mut conjuncts = from.on_conjuncts.clone();
        if let Some(selection) = &select.selection {
            let binder = ExprBinder { scope: &scope, queries: Some(self), correlation: None, windows: None };
            split_conjuncts(binder.bind(selection)?, &mut conjuncts);
        }
        let reaches_further = |e: &Expr| e.columns().iter().any(|&c| c >= inner_width + block.inner_width);
        if conjuncts.iter().any(|c| c.contains_subquery() || reaches_further(c)) {
            return Ok(None);
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
                if is_inner(left) && is_outer(right) && !left.columns().is_empty() {
                    keys.push(((**right).clone(), (**left).clone()));
                    continue;
                }
                if is_outer(left) && is_inner(right) && !right.columns().is_empty() {
                    keys.push(((**left).clone(), (**right).clone()));
                    continue;
                }
            }
            residual.push(conjunct);
        }
        if keys.is_empty() {
            return Ok(None);
        }
        let mut used = vec![false; inner_width];
        for e in inner.iter().chain(keys.iter().map(|(_, b)| b)).chain(&residual) {
            e.columns().into_iter().filter(|&c| c < inner_width).for_each(|c| used[c] = true);
        }
        let build = self.plan_joins(from, inner, &used)?;
        let to_outer = |e: &Expr| e.map_columns(&|c| c - inner_width);
        let probe_keys = keys.iter().map(|(o, _)| to_outer(o)).collect();
        let build_keys = keys.iter().map(|(_, b)| build.localize(b)).collect();
        let outer_width = block.inner_width;
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
        Ok(Some(SubqueryJoin { kind, build, probe_keys, build_keys, residual, outer_width }))
    }
}

/// Joins the block's IN/EXISTS subqueries to its planned FROM. An EXISTS whose subquery is
/// estimated larger than the outer rows hashes the outer side instead (right semi/anti join:
/// the subquery streams through it on all workers, TPC-H Q4, Q21, Q22); a semi/anti join
/// without residual is a filter on its keys and goes down to the join input holding them.
pub(crate) fn apply_subquery_joins(mut planned: Planned, subqueries: Vec<SubqueryJoin>) -> Planned {
    for join in subqueries {
        let probe_keys: Vec<Expr> = join.probe_keys.iter().map(|k| planned.localize(k)).collect();
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
        let outer = std::mem::replace(&mut planned.plan, Plan::SingleRow);
        let right_kind = match join.kind {
            JoinKind::Semi => Some(JoinKind::RightSemi),
            JoinKind::Anti => Some(JoinKind::RightAnti),
            _ => None,
        };
        planned.plan = match right_kind {
            Some(kind) if join.build.rows > planned.rows => {
                let subquery_width = join.build.plan.width();
                let residual = residual
                    .map(|r| r.map_columns(&|c| if c < probe_width { subquery_width + c } else { c - probe_width }));
                Plan::HashJoin {
                    kind,
                    probe: Box::new(join.build.plan),
                    build: Box::new(outer),
                    probe_keys: join.build_keys,
                    build_keys: probe_keys,
                    residual,
                }
            }
            _ if residual.is_none() => {
                let filter = KeyFilter { kind: join.kind, build: join.build.plan, build_keys: join.build_keys };
                filter.place(outer, probe_keys)
            }
            _ => Plan::HashJoin {
                kind: join.kind,
                probe: Box::new(outer),
                build: Box::new(join.build.plan),
                probe_keys,
                build_keys: join.build_keys,
                residual,
            },
        };
    }
    planned
}

/// A semi/anti join without residual: it keeps or drops each probe row by its keys alone.
struct KeyFilter {
    kind: JoinKind,
    build: Plan,
    build_keys: Vec<Expr>,
}

impl KeyFilter {
    /// The filter applied to `plan` as low as it can go: into the side of an inner join that
    /// holds all its keys, where it cuts rows before they are joined (TPC-H Q18: 57 orders
    /// pass its IN, out of the 1.5M otherwise joined to 6M lineitems).
    fn place(self, plan: Plan, keys: Vec<Expr>) -> Plan {
        let columns: Vec<usize> = keys.iter().flat_map(Expr::columns).collect();
        match plan {
            Plan::HashJoin { kind: JoinKind::Inner, probe, build, probe_keys, build_keys, residual }
                if !columns.is_empty() =>
            {
                let probe_width = probe.width();
                let (probe, build) = if columns.iter().all(|&c| c < probe_width) {
                    (Box::new(self.place(*probe, keys)), build)
                } else if columns.iter().all(|&c| c >= probe_width) {
                    let shifted = keys.iter().map(|k| k.map_columns(&|c| c - probe_width)).collect();
                    (probe, Box::new(self.place(*build, shifted)))
                } else {
                    let join = Plan::HashJoin { kind: JoinKind::Inner, probe, build, probe_keys, build_keys, residual };
                    return self.wrap(join, keys);
                };
                Plan::HashJoin { kind: JoinKind::Inner, probe, build, probe_keys, build_keys, residual }
            }
            other => self.wrap(other, keys),
        }
    }

    fn wrap(self, plan: Plan, probe_keys: Vec<Expr>) -> Plan {
        Plan::HashJoin {
            kind: self.kind,
            probe: Box::new(plan),
            build: Box::new(self.build),
            probe_keys,
            build_keys: self.build_keys,
            residual: None,
        }
    }
}

/// A WHERE conjunct `x op (SELECT agg FROM … WHERE inner = outer AND …)` rewritten as a join
/// with a grouped derived table (TPC-H Q2, Q17, Q20): the subquery's correlation equalities
/// become its GROUP BY keys and join conditions, its other conditions stay inside. Only for
/// aggregates that are NULL over no rows (sum, avg, min, max), so the inner join loses exactly
/// the rows the comparison with NULL would have dropped.
struct ScalarAggregate {
    /// (inner key, outer key) per correlation equality.
    keys: Vec<(ast::Expr, ast::Expr)>,
    derived: ast::Query,
}

/// Column names of the derived tables the rewrite adds.
const KEY_COLUMN: &str = "__bypass_key";
const VALUE_COLUMN: &str = "__bypass_value";
const DERIVED_ALIAS: &str = "__bypass_subquery";

impl<'c> QueryBinder<'c> {
    /// The SELECT with its correlated scalar aggregates in WHERE turned into joins (None when
    /// there are none).
    pub(crate) fn decorrelate_scalar_aggregates(&self, select: &ast::Select) -> Result<Option<ast::Select>> {
        let Some(selection) = &select.selection else { return Ok(None) };
        if !crate::bind::contains_subquery_ast(selection) {
            return Ok(None);
        }
        let mut conjuncts = Vec::new();
        crate::query::split_ast_conjuncts(selection, &mut conjuncts);
        let outer = self.bind_from(&select.from, None, None)?.scope;
        let outer_conditions: Vec<&ast::Expr> =
            conjuncts.iter().copied().filter(|c| comparison_with_subquery(c).is_none()).collect();
        let outer_block = OuterBlock { from: &select.from, scope: &outer, conditions: &outer_conditions };
        let mut rewritten = select.clone();
        let mut kept = Vec::new();
        let mut changed = false;
        for conjunct in conjuncts {
            let Some((subquery, rebuild)) = comparison_with_subquery(conjunct) else {
                kept.push(conjunct.clone());
                continue;
            };
            let Some(aggregate) = self.scalar_aggregate(subquery, &outer_block)? else {
                kept.push(conjunct.clone());
                continue;
            };
            let alias = format!("{DERIVED_ALIAS}{}", rewritten.from.len());
            let column =
                |name: String| ast::Expr::CompoundIdentifier(vec![ast::Ident::new(&alias), ast::Ident::new(name)]);
            kept.push(rebuild(column(VALUE_COLUMN.to_string())));
            for (index, (_, outer_key)) in aggregate.keys.iter().enumerate() {
                kept.push(ast::Expr::BinaryOp {
                    left: Box::new(outer_key.clone()),
                    op: ast::BinaryOperator::Eq,
                    right: Box::new(column(format!("{KEY_COLUMN}{index}"))),
                });
            }
            rewritten.from.push(derived_relation(aggregate.derived, &alias));
            changed = true;
        }
        if !changed {
            return Ok(None);
        }
        rewritten.selection = and_all(kept);
        Ok(Some(rewritten))
    }

    /// The grouped derived table for `subquery`, if it is a correlated aggregate of the
    /// supported shape whose correlations are equalities to columns of `outer`.
    fn scalar_aggregate(&self, subquery: &ast::Query, outer: &OuterBlock<'_>) -> Result<Option<ScalarAggregate>> {
        let ast::SetExpr::Select(select) = subquery.body.as_ref() else { return Ok(None) };
        let plain_query = subquery.with.is_none()
            && subquery.order_by.is_none()
            && subquery.limit_clause.is_none()
            && subquery.fetch.is_none();
        let plain_select = select.distinct.is_none()
            && select.having.is_none()
            && select.group_by == ast::GroupByExpr::Expressions(vec![], vec![])
            && select.named_window.is_empty();
        let [item] = select.projection.as_slice() else { return Ok(None) };
        let value = match item {
            ast::SelectItem::UnnamedExpr(e) | ast::SelectItem::ExprWithAlias { expr: e, .. } => e,
            _ => return Ok(None),
        };
        if !plain_query || !plain_select || !null_over_no_rows(value) {
            return Ok(None);
        }
        let Ok(from) = self.bind_from(&select.from, None, None) else { return Ok(None) };
        let inner = ExprBinder { scope: &from.scope, queries: Some(self), correlation: None, windows: None };
        let outer_binder = ExprBinder::new(outer.scope);
        let mut conjuncts = Vec::new();
        if let Some(selection) = &select.selection {
            crate::query::split_ast_conjuncts(selection, &mut conjuncts);
        }
        let (mut own, mut keys) = (Vec::new(), Vec::new());
        for conjunct in conjuncts {
            if inner.bind(conjunct).is_ok() {
                own.push(conjunct.clone());
                continue;
            }
            let ast::Expr::BinaryOp { left, op: ast::BinaryOperator::Eq, right } = conjunct else { return Ok(None) };
            let binds = |binder: &ExprBinder<'_>, e: &ast::Expr| binder.bind(e).is_ok();
            if binds(&inner, left) && binds(&outer_binder, right) {
                keys.push(((**left).clone(), (**right).clone()));
            } else if binds(&inner, right) && binds(&outer_binder, left) {
                keys.push(((**right).clone(), (**left).clone()));
            } else {
                return Ok(None);
            }
        }
        if keys.is_empty() {
            return Ok(None);
        }
        let mut grouped = (**select).clone();
        grouped.projection = keys
            .iter()
            .enumerate()
            .map(|(i, (inner_key, _))| ast::SelectItem::ExprWithAlias {
                expr: inner_key.clone(),
                alias: ast::Ident::new(format!("{KEY_COLUMN}{i}")),
            })
            .chain(std::iter::once(ast::SelectItem::ExprWithAlias {
                expr: value.clone(),
                alias: ast::Ident::new(VALUE_COLUMN),
            }))
            .collect();
        grouped.selection = and_all(own);
        grouped.group_by = ast::GroupByExpr::Expressions(keys.iter().map(|(k, _)| k.clone()).collect(), vec![]);
        let derived_of = |select: ast::Select| {
            let mut derived = subquery.clone();
            derived.body = Box::new(ast::SetExpr::Select(Box::new(select)));
            derived
        };
        let magic = self.magic_sets(subquery, select, outer, &keys);
        if !magic.is_empty() {
            let mut restricted = grouped.clone();
            restricted.selection = and_all(restricted.selection.into_iter().chain(magic));
            let derived = derived_of(restricted);
            if self.bind_query(&derived).is_ok() {
                return Ok(Some(ScalarAggregate { keys, derived }));
            }
        }
        let derived = derived_of(grouped);
        if self.bind_query(&derived).is_err() {
            return Ok(None);
        }
        Ok(Some(ScalarAggregate { keys, derived }))
    }

    /// `inner_key IN (SELECT outer_key FROM r WHERE …)` for the derived table of a decorrelated
    /// aggregate, per outer FROM table `r` that holds an outer key and has conditions of its
    /// own: only groups whose key is among r's filtered rows can join back, so the others need
    /// not be aggregated (a magic set: TPC-H Q17 aggregates the lineitems of ~200 parts instead
    /// of all 200K; Q2 and Q20 likewise). `subquery`/`select` are plain (checked by the caller)
    /// and serve as templates.
    fn magic_sets(
        &self,
        subquery: &ast::Query,
        select: &ast::Select,
        outer: &OuterBlock<'_>,
        keys: &[(ast::Expr, ast::Expr)],
    ) -> Vec<ast::Expr> {
        let mut restrictions = Vec::new();
        for item in outer.from {
            if !item.joins.is_empty() || !matches!(item.relation, ast::TableFactor::Table { .. }) {
                continue;
            }
            let Ok(alone) = self.bind_from(std::slice::from_ref(item), None, None) else { continue };
            let binder = ExprBinder { scope: &alone.scope, queries: Some(self), correlation: None, windows: None };
            let own: Vec<ast::Expr> = outer
                .conditions
                .iter()
                .filter(|c| self.is_plain_condition(c) && binder.bind(c).is_ok())
                .map(|c| (*c).clone())
                .collect();
            let Some((inner_key, outer_key)) = keys.iter().find(|(_, o)| binder.bind(o).is_ok()) else { continue };
            if own.is_empty() {
                continue;
            }
            let mut magic = select.clone();
            magic.projection = vec![ast::SelectItem::UnnamedExpr(outer_key.clone())];
            magic.from = vec![item.clone()];
            magic.selection = and_all(own);
            let mut query = subquery.clone();
            query.body = Box::new(ast::SetExpr::Select(Box::new(magic)));
            restrictions.push(ast::Expr::InSubquery {
                expr: Box::new(inner_key.clone()),
                subquery: Box::new(query),
                negated: false,
            });
        }
        restrictions
    }

    /// Whether a condition may be copied into a magic set: no subquery but an uncorrelated
    /// `x IN (subquery)` (which becomes a semi join there too).
    fn is_plain_condition(&self, condition: &ast::Expr) -> bool {
        match condition {
            ast::Expr::InSubquery { expr, subquery, negated: false } => {
                !crate::bind::contains_subquery_ast(expr) && self.bind_query(subquery).is_ok()
            }
            other => !crate::bind::contains_subquery_ast(other),
        }
    }
}

/// The outer query block of a decorrelated subquery: its FROM, bound scope, and the WHERE
/// conjuncts that are not comparisons with subqueries.
struct OuterBlock<'a> {
    from: &'a [ast::TableWithJoins],
    scope: &'a crate::bind::Scope,
    conditions: &'a [&'a ast::Expr],
}

fn and_all(conditions: impl IntoIterator<Item = ast::Expr>) -> Option<ast::Expr> {
    conditions.into_iter().reduce(|a, b| ast::Expr::BinaryOp {
        left: Box::new(a),
        op: ast::BinaryOperator::And,
        right: Box::new(b),
    })
}

/// A comparison with a subquery on one side: the subquery, and how to rebuild the comparison
/// with something else in its place.
type Rebuild<'a> = Box<dyn Fn(ast::Expr) -> ast::Expr + 'a>;

fn comparison_with_subquery(conjunct: &ast::Expr) -> Option<(&ast::Query, Rebuild<'_>)> {
    use ast::BinaryOperator as B;
    let ast::Expr::BinaryOp { left, op, right } = conjunct else { return None };
    if !matches!(op, B::Eq | B::NotEq | B::Lt | B::LtEq | B::Gt | B::GtEq) {
        return None;
    }
    match (left.as_ref(), right.as_ref()) {
        (other, ast::Expr::Subquery(query)) if !crate::bind::contains_subquery_ast(other) => Some((
            query,
            Box::new(move |value| ast::Expr::BinaryOp { left: left.clone(), op: op.clone(), right: Box::new(value) }),
        )),
        (ast::Expr::Subquery(query), other) if !crate::bind::contains_subquery_ast(other) => Some((
            query,
            Box::new(move |value| ast::Expr::BinaryOp { left: Box::new(value), op: op.clone(), right: right.clone() }),
        )),
        _ => None,
    }
}

/// Whether the select item is NULL when its aggregates see no rows: arithmetic over sum, avg,
/// min and max only (count is 0 over no rows, coalesce hides the NULL).
fn null_over_no_rows(expr: &ast::Expr) -> bool {
    use ast::Expr as E;
    let mut has_aggregate = false;
    let mut pending = vec![expr];
    while let Some(expr) = pending.pop() {
        match expr {
            E::BinaryOp { left, right, .. } => pending.extend([left.as_ref(), right.as_ref()]),
            E::UnaryOp { expr, .. } | E::Nested(expr) | E::Cast { expr, .. } => pending.push(expr),
            E::Value(_) | E::TypedString(_) => {}
            E::Function(f) => {
                let name = crate::bind::object_name(&f.name).unwrap_or_default();
                if !matches!(name.as_str(), "sum" | "avg" | "min" | "max") || f.over.is_some() || f.filter.is_some() {
                    return false;
                }
                has_aggregate = true;
            }
            _ => return false,
        }
    }
    has_aggregate
}

fn derived_relation(query: ast::Query, alias: &str) -> ast::TableWithJoins {
    ast::TableWithJoins {
        relation: ast::TableFactor::Derived {
            lateral: false,
            subquery: Box::new(query),
            alias: Some(ast::TableAlias { explicit: true, name: ast::Ident::new(alias), columns: vec![], at: None }),
            sample: None,
        },
        joins: vec![],
    }
}
