//! The FROM clause: relations (tables, derived tables, CTEs), joins and their ON conditions
//! bound over one "wide row"; then the join tree: single-relation conditions pushed into
//! scans, inner joins ordered greedily (`joins`), LEFT JOINs applied after the inner ones.

use std::sync::Arc;

use sqlparser::ast;

use crate::bind::{identifier, object_name, Correlation, ExprBinder, Scope};
use crate::error::{EngineError, Result};
use crate::expr::{conjunction, BinaryOp, Expr};
use crate::joins::{
    derive_single_relation_filters, join_all, plan_relation, relation_set, split_conjuncts, Conjunct, JoinInput,
    Planned, RelationSource, RELATIONS_MAX,
};
use crate::plan::{JoinKind, Plan};
use crate::query::QueryBinder;
use crate::types::DataType;

/// A LEFT JOIN waiting to be applied after the inner joins: `relation` (an input) is
/// null-extended. A FULL JOIN of input `full_with` and `relation` is planned before any other
/// join (both sides null-extended).
pub(crate) struct LeftJoin {
    pub relation: usize,
    pub on: Vec<Expr>,
    pub full_with: Option<usize>,
}

/// The FROM clause, bound.
pub(crate) struct From {
    pub scope: Scope,
    pub inputs: Vec<JoinInput>,
    pub on_conjuncts: Vec<Expr>,
    pub left_joins: Vec<LeftJoin>,
}

/// The columns an unqualified `*` lists for one FROM item, as (relation alias, column name,
/// wide column), in order; JOIN USING / NATURAL JOIN list each merged column once, first.
pub(crate) type Visible = Vec<(String, String, usize)>;

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum JoinSide {
    Inner,
    /// LEFT JOIN: the right side is null-extended.
    Left,
    /// RIGHT JOIN: the left side is null-extended.
    Right,
    /// FULL JOIN: both sides are.
    Full,
}

impl<'c> QueryBinder<'c> {
    /// Binds FROM; ON conditions see `outer` (the enclosing query's row), whose columns become
    /// the block's parameters through `correlation`.
    pub(crate) fn bind_from(
        &self,
        from: &[ast::TableWithJoins],
        outer: Option<&Scope>,
        correlation: Option<&Correlation>,
    ) -> Result<From> {
        let mut bound =
            From { scope: Scope::default(), inputs: Vec::new(), on_conjuncts: Vec::new(), left_joins: Vec::new() };
        let mut star = Vec::new();
        for item in from {
            let visible = self.add_join_tree(&mut bound, item, outer, correlation)?;
            star.extend(visible.into_iter().map(|(alias, column, _)| (alias, column)));
        }
        bound.scope.star = Some(star);
        if bound.inputs.len() > RELATIONS_MAX {
            return Err(EngineError::LimitExceeded(format!("more than {RELATIONS_MAX} relations in one query block")));
        }
        Ok(bound)
    }

    /// One FROM item: a relation and its joins, left to right. Inner joins (also inside
    /// parentheses) are flattened into the block's join graph; a side that an outer join
    /// null-extends and that is itself a join (or an aliased join) becomes a unit: planned on
    /// its own, one input of the block.
    fn add_join_tree(
        &self,
        bound: &mut From,
        item: &ast::TableWithJoins,
        outer: Option<&Scope>,
        correlation: Option<&Correlation>,
    ) -> Result<Visible> {
        let start = bound.inputs.len();
        // The left side of the last RIGHT/FULL JOIN is null-extended: when it is a join, it is a unit.
        let split = item
            .joins
            .iter()
            .rposition(|j| matches!(join_side(&j.join_operator), Ok((JoinSide::Right | JoinSide::Full, _))))
            .filter(|&k| k > 0 || matches!(item.relation, ast::TableFactor::NestedJoin { .. }));
        let (mut visible, joins) = match split {
            Some(k) => {
                let prefix = ast::TableWithJoins { relation: item.relation.clone(), joins: item.joins[..k].to_vec() };
                (self.add_unit(bound, &prefix, None, outer, correlation)?, &item.joins[k..])
            }
            None => (self.add_factor(bound, &item.relation, true, outer, correlation)?, &item.joins[..]),
        };
        for join in joins {
            let (side, constraint) = join_side(&join.join_operator)?;
            let first_right = bound.inputs.len();
            let right = match self.lateral_item(bound, &join.relation, outer)? {
                Some(item) if item.reads_before(bound) => {
                    let right = self.join_lateral(bound, item, side, constraint, outer, correlation)?;
                    visible.extend(right);
                    continue;
                }
                Some(item) => self.add_bound_relation(bound, item, correlation)?,
                None => self.add_factor(bound, &join.relation, side == JoinSide::Inner, outer, correlation)?,
            };
            let (on, merged) = match constraint {
                ast::JoinConstraint::On(expr) => {
                    let scope = with_outer(&bound.scope, outer);
                    let mut conjuncts = Vec::new();
                    let binder = ExprBinder { scope: &scope, queries: Some(self), correlation, windows: None };
                    split_conjuncts(binder.bind(expr)?, &mut conjuncts);
                    (conjuncts, visible.into_iter().chain(right).collect())
                }
                ast::JoinConstraint::None => (Vec::new(), visible.into_iter().chain(right).collect()),
                ast::JoinConstraint::Using(names) => {
                    let mut names = names.iter().map(object_name).collect::<Result<Vec<_>>>()?;
                    let alias = take_join_alias(&mut names);
                    let (on, merged) = merge_columns(&mut bound.scope, &names, visible, right, side)?;
                    if let Some(alias) = alias {
                        add_join_alias(&mut bound.scope, alias, &merged[..names.len()])?;
                    }
                    (on, merged)
                }
                ast::JoinConstraint::Natural => {
                    let names = visible
                        .iter()
                        .filter(|(_, name, _)| right.iter().any(|(_, other, _)| other == name))
                        .map(|(_, name, _)| name.clone())
                        .collect::<Vec<_>>();
                    merge_columns(&mut bound.scope, &names, visible, right, side)?
                }
            };
            visible = merged;
            let (relation, full_with) = match side {
                JoinSide::Inner => {
                    bound.on_conjuncts.extend(on);
                    continue;
                }
                JoinSide::Left => (first_right, None),
                JoinSide::Right => (start, None),
                JoinSide::Full => (first_right, Some(start)),
            };
            let one_input = |range: std::ops::Range<usize>| range.len() == 1;
            if !one_input(first_right..bound.inputs.len()) || !one_input(start..first_right) && side != JoinSide::Left {
                return Err(EngineError::unsupported("an outer join whose null-extended side is itself a join"));
            }
            bound.left_joins.push(LeftJoin { relation, on, full_with });
        }
        Ok(visible)
    }

    /// A parenthesized join (or the left part of an outer join) planned on its own: its
    /// relations keep their names (an alias replaces them by one relation with the join's
    /// columns), and the block sees one input.
    fn add_unit(
        &self,
        bound: &mut From,
        item: &ast::TableWithJoins,
        alias: Option<&ast::TableAlias>,
        outer: Option<&Scope>,
        correlation: Option<&Correlation>,
    ) -> Result<Visible> {
        let mut unit = self.bind_from(std::slice::from_ref(item), outer, correlation)?;
        if !unit.scope.computed.is_empty() {
            return Err(EngineError::unsupported("FULL JOIN USING inside a parenthesized join"));
        }
        let scope = unit.scope.clone();
        let star = scope.star.clone().unwrap_or_default();
        let conjuncts = std::mem::take(&mut unit.on_conjuncts);
        let planned = self.plan_joins(unit, conjuncts, &vec![true; scope.width()])?;
        let wide_type = |wide: usize| {
            let relation = &scope.relations[scope.relation_of(wide)];
            relation.columns[wide - relation.offset].1
        };
        let wide_of = |(alias, name): &(String, String)| {
            scope
                .relations
                .iter()
                .find(|r| r.alias == *alias)
                .and_then(|r| r.columns.iter().position(|(c, _)| c == name).map(|position| r.offset + position))
        };
        let outputs: Vec<usize> = match alias {
            None => (0..scope.width()).collect(),
            Some(_) => star.iter().map(|entry| wide_of(entry).expect("star entries name the unit's columns")).collect(),
        };
        let exprs = outputs
            .iter()
            .map(|&wide| {
                let index = planned.layout.iter().position(|&w| w == wide).expect("a unit outputs every column");
                Expr::Column { index, data_type: wide_type(wide) }
            })
            .collect();
        let source = RelationSource::Derived(Plan::Project { input: Box::new(planned.plan), exprs });
        let offset = bound.scope.width();
        bound.inputs.push(JoinInput::range(source, offset, outputs.len()));
        match alias {
            None => {
                for relation in &scope.relations {
                    bound.scope.add(&relation.alias, relation.columns.clone());
                }
                bound.scope.hidden.extend(scope.hidden.iter().map(|h| h + offset));
                bound.scope.join_aliases.extend(scope.join_aliases.iter().cloned());
                Ok(star
                    .iter()
                    .map(|entry| (entry.0.clone(), entry.1.clone(), offset + wide_of(entry).expect("a unit column")))
                    .collect())
            }
            Some(alias) => {
                let columns =
                    star.iter().zip(&outputs).map(|((_, name), &wide)| (name.clone(), wide_type(wide))).collect();
                let (name, columns) = apply_alias(String::new(), Some(alias), columns)?;
                let index = bound.scope.add(&name, columns);
                let relation = &bound.scope.relations[index];
                Ok(relation
                    .columns
                    .iter()
                    .enumerate()
                    .map(|(position, (column, _))| (name.clone(), column.clone(), offset + position))
                    .collect())
            }
        }
    }

    /// A relation, or a parenthesized join (flattened into the block when `flatten`, else a unit).
    fn add_factor(
        &self,
        bound: &mut From,
        factor: &ast::TableFactor,
        flatten: bool,
        outer: Option<&Scope>,
        correlation: Option<&Correlation>,
    ) -> Result<Visible> {
        if let ast::TableFactor::NestedJoin { table_with_joins, alias } = factor {
            if flatten && alias.is_none() {
                return self.add_join_tree(bound, table_with_joins, outer, correlation);
            }
            return self.add_unit(bound, table_with_joins, alias.as_ref(), outer, correlation);
        }
        match self.lateral_item(bound, factor, outer)? {
            Some(item) if item.reads_before(bound) => {
                return self.join_lateral(bound, item, JoinSide::Inner, &ast::JoinConstraint::None, outer, correlation)
            }
            Some(item) => return self.add_bound_relation(bound, item, correlation),
            None => {}
        }
        let index = self.add_relation(bound, factor, outer, correlation)?;
        let relation = &bound.scope.relations[index];
        Ok(relation
            .columns
            .iter()
            .enumerate()
            .map(|(position, (name, _))| (relation.alias.clone(), name.clone(), relation.offset + position))
            .collect())
    }

    fn add_relation(
        &self,
        from: &mut From,
        factor: &ast::TableFactor,
        outer: Option<&Scope>,
        correlation: Option<&Correlation>,
    ) -> Result<usize> {
        let (name, alias, columns, source) = match factor {
            ast::TableFactor::Table {
                name,
                alias,
                args,
                with_hints,
                version,
                with_ordinality,
                partitions,
                json_path,
                sample,
                index_hints,
            } => {
                let plain = args.is_none()
                    && with_hints.is_empty()
                    && version.is_none()
                    && !with_ordinality
                    && partitions.is_empty()
                    && json_path.is_none()
                    && sample.is_none()
                    && index_hints.is_empty();
                if !plain {
                    return Err(EngineError::unsupported(format!("FROM item {factor}")));
                }
                let (name, columns, source) = match self.cte(name) {
                    Some(cte) => {
                        let columns = cte.names.iter().cloned().zip(cte.plan.output_types()).collect();
                        (cte.name.clone(), columns, RelationSource::Derived(cte.reference()))
                    }
                    None => {
                        let table_name = object_name(name)?;
                        let table = self.catalog.get(&table_name)?;
                        let columns = table.schema.iter().map(|c| (c.name.clone(), c.data_type)).collect();
                        let key = self.catalog.key_of(&table_name);
                        let only = crate::ddl::is_only(name);
                        let source = match &table.view {
                            Some(view) => RelationSource::Derived(crate::view::bind_view(self.catalog, &table, view)?),
                            None => match crate::family::family_scan(self.catalog, &key, &table, only)? {
                                Some(plan) => RelationSource::Derived(plan),
                                None => RelationSource::Table(Arc::clone(&table)),
                            },
                        };
                        (table.name.clone(), columns, source)
                    }
                };
                (name, alias.as_ref(), columns, source)
            }
            ast::TableFactor::Derived { subquery, alias, lateral: false, sample: None } => {
                let alias =
                    alias.as_ref().ok_or_else(|| EngineError::Syntax("subquery in FROM must have an alias".into()))?;
                // It may read the enclosing query's row (not the FROM items before it: that is LATERAL).
                let bound = self.bind_query_in(subquery, outer)?;
                let columns = bound.names.into_iter().zip(bound.plan.output_types()).collect();
                let plan = params_of_block(bound.plan, &bound.params, correlation)?;
                (identifier(&alias.name), Some(alias), columns, RelationSource::Derived(plan))
            }
            other => return Err(EngineError::unsupported(format!("FROM item {other}"))),
        };
        let (alias, columns) = apply_alias(name, alias, columns)?;
        let width = columns.len();
        let index = from.scope.add(&alias, columns);
        from.inputs.push(JoinInput::range(source, from.scope.relations[index].offset, width));
        Ok(index)
    }

    pub(crate) fn plan_joins(&self, from: From, conjuncts: Vec<Expr>, used: &[bool]) -> Result<Planned> {
        let From { inputs, left_joins, .. } = from;
        if inputs.is_empty() {
            let mut planned = Planned::with_layout(Plan::SingleRow, Vec::new(), 1.0);
            planned.add_filters(&conjuncts, 1.0);
            return Ok(planned);
        }
        let left_relations: u64 =
            left_joins.iter().filter(|l| l.full_with.is_none()).fold(0, |set, l| set | (1 << l.relation));
        // Inputs whose rows a join may extend with NULLs: no WHERE condition filters them early.
        let nullable = left_joins
            .iter()
            .fold(left_relations, |set, l| l.full_with.map_or(set, |other| set | (1 << other) | (1 << l.relation)));
        let mut per_relation: Vec<Vec<Expr>> = vec![Vec::new(); inputs.len()];
        let mut multi = Vec::new();
        for conjunct in conjuncts {
            let relations = relation_set(&conjunct, &inputs);
            for derived in derive_single_relation_filters(&conjunct, &inputs) {
                let relation = relation_set(&derived, &inputs).trailing_zeros() as usize;
                // A WHERE condition holds after null extension: filtering a nullable side's
                // rows before its join would extend with NULLs rows the condition rejects.
                if nullable & (1 << relation) == 0 {
                    per_relation[relation].push(derived);
                }
            }
            if relations.count_ones() <= 1 && relations & nullable == 0 {
                per_relation[relations.trailing_zeros().min(inputs.len() as u32 - 1) as usize].push(conjunct);
            } else {
                multi.push(Conjunct { expr: conjunct, relations });
            }
        }
        let mut outer_joins: Vec<LeftJoin> = Vec::new();
        for mut left in left_joins {
            if left.full_with.is_none() {
                let (own, rest): (Vec<Expr>, Vec<Expr>) =
                    left.on.into_iter().partition(|c| relation_set(c, &inputs) == 1 << left.relation);
                per_relation[left.relation].extend(own);
                left.on = rest;
            }
            outer_joins.push(left);
        }
        let offsets_only: Vec<JoinInput> = inputs
            .iter()
            .map(|i| JoinInput { source: RelationSource::Derived(Plan::SingleRow), columns: i.columns.clone() })
            .collect();
        let mut planned_inputs: Vec<Option<Planned>> = Vec::new();
        for (index, (input, filters)) in inputs.into_iter().zip(per_relation).enumerate() {
            planned_inputs.push(Some(plan_relation(index, input, used, &filters)?));
        }
        let mut take = |index: usize| planned_inputs[index].take().expect("each input joins once");
        let mut full = Vec::new();
        let mut left_on = Vec::new();
        for join in outer_joins {
            match join.full_with {
                Some(other) => full.push(full_join(take(other), take(join.relation), join.on, &offsets_only)?),
                None => left_on.push((take(join.relation), join.on)),
            }
        }
        let inner: Vec<Planned> = full.into_iter().chain(planned_inputs.into_iter().flatten()).collect();
        let (now, later): (Vec<Conjunct>, Vec<Conjunct>) =
            multi.into_iter().partition(|c| c.relations & left_relations == 0);
        let mut planned = join_all(inner, now, &offsets_only)?;
        for (build, on) in left_on {
            planned = left_join(planned, build, on, &offsets_only)?;
        }
        planned.add_filters(&later.into_iter().map(|c| c.expr).collect::<Vec<_>>(), 1.0 / 3.0);
        Ok(planned)
    }
}

fn join_side(operator: &ast::JoinOperator) -> Result<(JoinSide, &ast::JoinConstraint)> {
    Ok(match operator {
        ast::JoinOperator::Join(c) | ast::JoinOperator::Inner(c) | ast::JoinOperator::CrossJoin(c) => {
            (JoinSide::Inner, c)
        }
        ast::JoinOperator::Left(c) | ast::JoinOperator::LeftOuter(c) => (JoinSide::Left, c),
        ast::JoinOperator::Right(c) | ast::JoinOperator::RightOuter(c) => (JoinSide::Right, c),
        ast::JoinOperator::FullOuter(c) => (JoinSide::Full, c),
        other => {
            return Err(EngineError::unsupported(format!("join type {other:?}").chars().take(60).collect::<String>()))
        }
    })
}

/// JOIN USING (names) / NATURAL JOIN: one equality per name between the two sides' columns,
/// and the joined item's columns: the merged ones first (the left side's, the right side's for
/// RIGHT JOIN), then the rest of each side. The other side's copy is hidden from unqualified
/// names (`t.name` still finds it).
fn merge_columns(
    scope: &mut Scope,
    names: &[String],
    left: Visible,
    right: Visible,
    side: JoinSide,
) -> Result<(Vec<Expr>, Visible)> {
    let find = |visible: &Visible, name: &str, which: &str| -> Result<usize> {
        let mut found = visible.iter().enumerate().filter(|(_, (_, column, _))| column == name);
        match (found.next(), found.next()) {
            (Some((index, _)), None) => Ok(index),
            (Some(_), Some(_)) => Err(EngineError::AmbiguousColumn(name.to_string())),
            (None, _) => Err(EngineError::UnknownColumn(format!(
                "column \"{name}\" specified in USING clause does not exist in {which} table"
            ))),
        }
    };
    let mut on = Vec::new();
    let mut merged = Vec::new();
    let (mut left_used, mut right_used) = (Vec::new(), Vec::new());
    for (number, name) in names.iter().enumerate() {
        if names[..number].contains(name) {
            return Err(EngineError::DuplicateColumn(format!(
                "column name \"{name}\" appears more than once in USING clause"
            )));
        }
        let (l, r) = (find(&left, name, "left")?, find(&right, name, "right")?);
        // A column an earlier FULL JOIN USING merged stands for its expression.
        let computed = scope.computed.clone();
        let column = |entry: &(String, String, usize)| match entry.0.is_empty() {
            true => computed.iter().find(|(name, _)| *name == entry.1).map(|(_, e)| e.clone()).expect("merged"),
            false => ast::Expr::CompoundIdentifier(vec![ast::Ident::new(&entry.0), ast::Ident::new(&entry.1)]),
        };
        let equality = ast::Expr::BinaryOp {
            left: Box::new(column(&left[l])),
            op: ast::BinaryOperator::Eq,
            right: Box::new(column(&right[r])),
        };
        on.push(ExprBinder::new(scope).bind(&equality)?);
        if side == JoinSide::Full {
            // Either side may be NULL-extended: the merged column is the one that is not.
            let merged_value = ast::Expr::Function(ast::Function {
                name: ast::ObjectName::from(vec![ast::Ident::new("coalesce")]),
                uses_odbc_syntax: false,
                parameters: ast::FunctionArguments::None,
                args: ast::FunctionArguments::List(ast::FunctionArgumentList {
                    duplicate_treatment: None,
                    args: [column(&left[l]), column(&right[r])]
                        .into_iter()
                        .map(|e| ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Expr(e)))
                        .collect(),
                    clauses: Vec::new(),
                }),
                filter: None,
                null_treatment: None,
                over: None,
                within_group: Vec::new(),
            });
            scope.hidden.extend([left[l].2, right[r].2].into_iter().filter(|&w| w != usize::MAX));
            scope.computed.retain(|(existing, _)| existing != name);
            scope.computed.push((name.clone(), merged_value));
            merged.push((String::new(), name.clone(), usize::MAX));
        } else {
            let (kept, hidden) = if side == JoinSide::Right { (&right[r], &left[l]) } else { (&left[l], &right[r]) };
            merged.push(kept.clone());
            if hidden.2 != usize::MAX {
                scope.hidden.push(hidden.2);
            }
        }
        left_used.push(l);
        right_used.push(r);
    }
    for (visible, used) in [(left, left_used), (right, right_used)] {
        merged.extend(visible.into_iter().enumerate().filter(|(index, _)| !used.contains(index)).map(|(_, e)| e));
    }
    Ok((on, merged))
}

/// The alias `pg_syntax` carried into a USING list, taken out of it.
fn take_join_alias(names: &mut Vec<String>) -> Option<String> {
    let at = names.iter().position(|n| n.starts_with(crate::pg_syntax::JOIN_ALIAS_MARK))?;
    Some(names.remove(at)[crate::pg_syntax::JOIN_ALIAS_MARK.len()..].to_string())
}

/// `JOIN … USING (…) AS alias`: `alias.c` reads merged column c (as the unqualified name does).
fn add_join_alias(scope: &mut Scope, alias: String, merged: &[(String, String, usize)]) -> Result<()> {
    if scope.relations.iter().any(|r| r.alias == alias) || scope.join_alias(&alias).is_some() {
        return Err(EngineError::DuplicateAlias(format!("table name \"{alias}\" specified more than once")));
    }
    let computed = scope.computed.clone();
    let columns = merged
        .iter()
        .map(|(relation, name, _)| {
            let expr = match relation.is_empty() {
                true => computed.iter().find(|(merged, _)| merged == name).map(|(_, e)| e.clone()).expect("merged"),
                false => ast::Expr::CompoundIdentifier(vec![
                    ast::Ident::with_quote('"', relation),
                    ast::Ident::with_quote('"', name),
                ]),
            };
            (name.clone(), expr)
        })
        .collect();
    scope.join_aliases.push((alias, columns));
    Ok(())
}

/// A derived table's plan with its parameters (`params`: columns of the enclosing query's row)
/// renumbered as the block's own, so the block's caller supplies them.
pub(crate) fn params_of_block(plan: Plan, params: &[Expr], correlation: Option<&Correlation>) -> Result<Plan> {
    if params.is_empty() {
        return Ok(plan);
    }
    let correlation = correlation.ok_or_else(|| EngineError::unsupported("a derived table reading an outer query"))?;
    let renumbered: Vec<Expr> = params
        .iter()
        .map(|param| match param {
            Expr::Column { index, data_type } => correlation.param(*index, *data_type),
            other => other.clone(),
        })
        .collect();
    Ok(plan.map_exprs(&|expr| {
        expr.transform(&|node| match node {
            Expr::Param { index, .. } => Some(renumbered[*index].clone()),
            _ => None,
        })
    }))
}

/// A relation's name and columns under its alias: `t AS u (a, b)` renames the first columns.
pub(crate) fn apply_alias(
    name: String,
    alias: Option<&ast::TableAlias>,
    mut columns: Vec<(String, DataType)>,
) -> Result<(String, Vec<(String, DataType)>)> {
    let Some(alias) = alias else { return Ok((name, columns)) };
    let name = identifier(&alias.name);
    if alias.columns.len() > columns.len() {
        return Err(EngineError::Syntax(format!(
            "table \"{name}\" has {} columns available but {} columns specified",
            columns.len(),
            alias.columns.len()
        )));
    }
    for (column, renamed) in columns.iter_mut().zip(&alias.columns) {
        column.0 = identifier(&renamed.name);
    }
    Ok((name, columns))
}

pub(crate) fn with_outer(scope: &Scope, outer: Option<&Scope>) -> Scope {
    let mut combined = scope.clone();
    if let Some(outer) = outer {
        let base = combined.relations.len();
        combined.outer_start = Some(base);
        combined.further_starts = outer.outer_start.iter().chain(&outer.further_starts).map(|s| s + base).collect();
        let shift = combined.width();
        combined.hidden.extend(outer.hidden.iter().map(|column| column + shift));
        combined.join_aliases.extend(outer.join_aliases.iter().cloned());
        for relation in &outer.relations {
            combined.add(&relation.alias, relation.columns.clone());
        }
    }
    combined
}

fn left_join(probe: Planned, build: Planned, on: Vec<Expr>, inputs: &[JoinInput]) -> Result<Planned> {
    hash_join_on(JoinKind::Left, probe, build, on, inputs)
}

/// FULL JOIN: the LEFT JOIN's rows, then the right side's rows no left row matches with NULLs
/// for the left side's columns.
fn full_join(left: Planned, right: Planned, on: Vec<Expr>, inputs: &[JoinInput]) -> Result<Planned> {
    let left_types = left.plan.output_types();
    let right_width = right.layout.len();
    let copy = |p: &Planned| {
        let mut copy = Planned::with_layout(p.plan.clone(), p.layout.clone(), p.rows);
        copy.relations = p.relations;
        copy
    };
    // `ON true` / `ON false` need no join key (PostgreSQL takes them as well).
    let constant_on = on.iter().all(|c| c.columns().is_empty() && !c.contains_param() && !c.contains_subquery());
    let unmatched = hash_join_on(JoinKind::Anti, copy(&right), copy(&left), on.clone(), inputs)?;
    let mut exprs: Vec<Expr> = left_types.iter().map(|&t| Expr::literal(crate::types::Value::Null, t)).collect();
    let right_types = unmatched.plan.output_types();
    exprs.extend((0..right_width).map(|index| Expr::Column { index, data_type: right_types[index] }));
    let extended = Plan::Project { input: Box::new(unmatched.plan), exprs };
    let matched = hash_join_on(JoinKind::Left, left, right, on, inputs)?;
    if !constant_on && matches!(&matched.plan, Plan::HashJoin { probe_keys, .. } if probe_keys.is_empty()) {
        return Err(EngineError::unsupported(
            "FULL JOIN is only supported with merge-joinable or hash-joinable join conditions",
        ));
    }
    let plan = Plan::SetOperation {
        op: crate::plan::SetOperator::Union,
        all: true,
        left: Box::new(matched.plan),
        right: Box::new(extended),
    };
    let mut planned = Planned::with_layout(plan, matched.layout, matched.rows);
    planned.relations = matched.relations;
    Ok(planned)
}

/// A hash join on the equalities of `on` between the two sides; the rest is its residual
/// (over probe ++ build columns). Output: probe ++ build (anti: probe only).
fn hash_join_on(
    kind: JoinKind,
    probe: Planned,
    build: Planned,
    on: Vec<Expr>,
    inputs: &[JoinInput],
) -> Result<Planned> {
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
    let mut layout = probe.layout.clone();
    if kind != JoinKind::Anti {
        layout.extend(&build.layout);
    }
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
        kind,
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
