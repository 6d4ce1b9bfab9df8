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

pub(crate) fn apply_subquery_joins(mut planned: Planned, subqueries: Vec<SubqueryJoin>) -> Planned {
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
        let mut rewritten = select.clone();
        let mut kept = Vec::new();
        let mut changed = false;
        for conjunct in conjuncts {
            let Some((subquery, rebuild)) = comparison_with_subquery(conjunct) else {
                kept.push(conjunct.clone());
                continue;
            };
            let Some(aggregate) = self.scalar_aggregate(subquery, &outer)? else {
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
        rewritten.selection = kept.into_iter().reduce(|a, b| ast::Expr::BinaryOp {
            left: Box::new(a),
            op: ast::BinaryOperator::And,
            right: Box::new(b),
        });
        Ok(Some(rewritten))
    }

    /// The grouped derived table for `subquery`, if it is a correlated aggregate of the
    /// supported shape whose correlations are equalities to columns of `outer`.
    fn scalar_aggregate(&self, subquery: &ast::Query, outer: &crate::bind::Scope) -> Result<Option<ScalarAggregate>> {
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
        let outer_binder = ExprBinder::new(outer);
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
        grouped.selection = own.into_iter().reduce(|a, b| ast::Expr::BinaryOp {
            left: Box::new(a),
            op: ast::BinaryOperator::And,
            right: Box::new(b),
        });
        grouped.group_by = ast::GroupByExpr::Expressions(keys.iter().map(|(k, _)| k.clone()).collect(), vec![]);
        let mut derived = subquery.clone();
        derived.body = Box::new(ast::SetExpr::Select(Box::new(grouped)));
        if self.bind_query(&derived).is_err() {
            return Ok(None);
        }
        Ok(Some(ScalarAggregate { keys, derived }))
    }
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
