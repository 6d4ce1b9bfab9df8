//! The catalog interpreter: a plain row-at-a-time SQL evaluator over the catalog relations.
//!
//! ```text
//!   Query ─► WITH (each CTE once) ─► body: SELECT | UNION [ALL] | VALUES ─► ORDER BY ─► LIMIT
//!   SELECT: FROM (nested loops: joins, LEFT/RIGHT/FULL, derived tables, LATERAL, unnest)
//!           ─► WHERE ─► GROUP BY / aggregates ─► HAVING ─► select list ─► DISTINCT
//!   expressions see their row, then the rows of enclosing queries (correlated subqueries)
//! ```
//!
//! Why a second evaluator: the catalogs hold a few hundred rows, and the queries tools send
//! about them use correlated subqueries, arrays, regular expressions and system functions that
//! analytics never need; nested loops over values answer them in microseconds.
//!
//! Invariants: every loop is bounded by the rows of the relations involved (at most
//! ROWS_MAX intermediate rows per FROM clause); an unknown relation, column or function is an
//! error naming it (42P01, 42703, 42883), never a guess.

use std::cmp::Ordering;
use std::collections::HashMap;

use sqlparser::ast;

use super::functions;
use super::tables::{self, Context, Relation};
use super::value::{compare, equals, sort_order, Datum, PgType};
use crate::bind::identifier;
use crate::error::{EngineError, Result};

/// Bound on the rows one FROM clause may produce (the catalogs are small; this stops a
/// runaway cross join).
const ROWS_MAX: usize = 1 << 20;

/// A query's result: typed columns and rows.
#[derive(Debug, Clone)]
pub struct Output {
    pub columns: Vec<(String, PgType)>,
    pub rows: Vec<Vec<Datum>>,
}

/// The columns of a row: (relation alias, column name, type).
type Layout = Vec<(String, String, PgType)>;
/// A group: its first row (for grouped columns) and all its rows (for aggregates).
type Group = (Vec<Datum>, Vec<Vec<Datum>>);
/// Groups being formed: (key, first row, rows).
type Forming = (Vec<Datum>, Vec<Datum>, Vec<Vec<Datum>>);

/// A row with its layout and the enclosing query's row (correlation).
#[derive(Clone, Copy)]
pub struct Env<'a> {
    layout: &'a Layout,
    row: &'a [Datum],
    parent: Option<&'a Env<'a>>,
    /// The rows of the current group, when aggregates are evaluated.
    group: Option<&'a [Vec<Datum>]>,
}

impl<'a> Env<'a> {
    fn empty() -> Env<'static> {
        static EMPTY: Layout = Vec::new();
        Env { layout: &EMPTY, row: &[], parent: None, group: None }
    }
}

/// Evaluates catalog queries for one statement.
pub struct Interpreter<'c> {
    pub context: &'c Context<'c>,
    ctes: HashMap<String, Output>,
}

impl<'c> Interpreter<'c> {
    pub fn new(context: &'c Context<'c>) -> Interpreter<'c> {
        Interpreter { context, ctes: HashMap::new() }
    }

    pub fn query(&mut self, query: &ast::Query, outer: Option<&Env<'_>>) -> Result<Output> {
        crate::control::check()?;
        if let Some(with) = &query.with {
            if with.recursive {
                return Err(EngineError::unsupported("WITH RECURSIVE in catalog queries"));
            }
            for cte in &with.cte_tables {
                let output = self.query(&cte.query, outer)?;
                self.ctes.insert(identifier(&cte.alias.name), rename(output, &cte.alias.columns));
            }
        }
        let order: &[ast::OrderByExpr] = match &query.order_by {
            Some(ast::OrderBy { kind: ast::OrderByKind::Expressions(exprs), .. }) => exprs,
            Some(_) => return Err(EngineError::unsupported("ORDER BY ALL")),
            None => &[],
        };
        let mut output = match query.body.as_ref() {
            ast::SetExpr::Select(select) => self.select(select, order, outer)?,
            other => {
                let mut output = self.set_expr(other, outer)?;
                sort_output(&mut output, order, self, outer)?;
                output
            }
        };
        self.limit(query, &mut output, outer)?;
        Ok(output)
    }

    fn limit(&mut self, query: &ast::Query, output: &mut Output, outer: Option<&Env<'_>>) -> Result<()> {
        let (limit, offset) = match &query.limit_clause {
            None => (None, None),
            Some(ast::LimitClause::LimitOffset { limit, offset, .. }) => {
                (limit.as_ref(), offset.as_ref().map(|o| &o.value))
            }
            Some(ast::LimitClause::OffsetCommaLimit { offset, limit }) => (Some(limit), Some(offset)),
        };
        let env = outer.copied().unwrap_or_else(|| Env::empty());
        let count = |interpreter: &mut Self, e: Option<&ast::Expr>| -> Result<Option<usize>> {
            match e {
                None => Ok(None),
                Some(e) => Ok(interpreter.eval(e, &env)?.as_int().map(|v| v.max(0) as usize)),
            }
        };
        let skip = count(self, offset)?.unwrap_or(0);
        let take = count(self, limit)?;
        let rows = std::mem::take(&mut output.rows);
        output.rows = rows.into_iter().skip(skip).take(take.unwrap_or(usize::MAX)).collect();
        Ok(())
    }

    fn set_expr(&mut self, body: &ast::SetExpr, outer: Option<&Env<'_>>) -> Result<Output> {
        match body {
            ast::SetExpr::Select(select) => self.select(select, &[], outer),
            ast::SetExpr::Query(query) => self.query(query, outer),
            ast::SetExpr::SetOperation { op: ast::SetOperator::Union, set_quantifier, left, right } => {
                let mut output = self.set_expr(left, outer)?;
                let other = self.set_expr(right, outer)?;
                if other.columns.len() != output.columns.len() {
                    return Err(EngineError::Syntax("each UNION query must have the same number of columns".into()));
                }
                output.rows.extend(other.rows);
                if !matches!(set_quantifier, ast::SetQuantifier::All) {
                    distinct(&mut output.rows);
                }
                Ok(output)
            }
            ast::SetExpr::Values(values) => {
                let env = outer.copied().unwrap_or_else(|| Env::empty());
                let mut rows = Vec::new();
                for row in &values.rows {
                    rows.push(row.content.iter().map(|e| self.eval(e, &env)).collect::<Result<Vec<_>>>()?);
                }
                let width = rows.first().map_or(0, Vec::len);
                let columns = (1..=width).map(|i| (format!("column{i}"), column_type(&rows, i - 1))).collect();
                Ok(Output { columns, rows })
            }
            other => Err(EngineError::unsupported(format!("{other} in catalog queries"))),
        }
    }

    fn select(&mut self, select: &ast::Select, order: &[ast::OrderByExpr], outer: Option<&Env<'_>>) -> Result<Output> {
        let (layout, mut rows) = self.from(&select.from, outer)?;
        if rows.is_empty() {
            self.check_names(select, &layout, outer)?;
        }
        if let Some(predicate) = &select.selection {
            let mut kept = Vec::with_capacity(rows.len());
            for row in rows {
                let env = Env { layout: &layout, row: &row, parent: outer, group: None };
                if self.eval(predicate, &env)?.is_true() {
                    kept.push(row);
                }
            }
            rows = kept;
        }
        let items = expand_items(&select.projection, &layout)?;
        let group_by: &[ast::Expr] = match &select.group_by {
            ast::GroupByExpr::Expressions(exprs, modifiers) if modifiers.is_empty() => exprs,
            _ => return Err(EngineError::unsupported("GROUP BY ALL or grouping modifiers in catalog queries")),
        };
        let aggregated = !group_by.is_empty()
            || select.having.is_some()
            || items.iter().any(|(e, _)| has_aggregate(e))
            || order.iter().any(|o| has_aggregate(&o.expr));
        let groups: Vec<Group> = if aggregated {
            self.group(&layout, rows, group_by, outer)?
        } else {
            rows.into_iter().map(|row| (row, Vec::new())).collect()
        };
        let mut produced = Vec::with_capacity(groups.len());
        for (row, members) in &groups {
            let env = Env { layout: &layout, row, parent: outer, group: aggregated.then_some(members.as_slice()) };
            if let Some(having) = &select.having {
                if !self.eval(having, &env)?.is_true() {
                    continue;
                }
            }
            for values in self.project(&items, &env)? {
                let keys = self.order_keys(order, &env, &items, &values)?;
                produced.push((keys, values));
            }
        }
        if select.distinct.is_some() {
            let mut seen: Vec<Vec<Datum>> = Vec::new();
            produced.retain(|(_, values)| {
                let duplicate = seen.iter().any(|s| same_row(s, values));
                if !duplicate {
                    seen.push(values.clone());
                }
                !duplicate
            });
        }
        sort_by_keys(&mut produced, order);
        let rows: Vec<Vec<Datum>> = produced.into_iter().map(|(_, values)| values).collect();
        let columns = items
            .iter()
            .enumerate()
            .map(|(i, (expr, name))| {
                (name.clone(), static_type(expr, &layout).unwrap_or_else(|| column_type(&rows, i)))
            })
            .collect();
        Ok(Output { columns, rows })
    }

    /// The select list over one row. Set-returning calls (`unnest`, `generate_subscripts`,
    /// `generate_series`) at the top of an item make several rows, in lockstep as PostgreSQL
    /// runs them; other items repeat.
    fn project(&mut self, items: &[(ast::Expr, String)], env: &Env<'_>) -> Result<Vec<Vec<Datum>>> {
        let mut sets: Vec<Option<Vec<Datum>>> = Vec::with_capacity(items.len());
        let mut scalars = Vec::with_capacity(items.len());
        for (expr, _) in items {
            match self.set_returning(expr, env)? {
                Some(set) => {
                    sets.push(Some(set));
                    scalars.push(Datum::Null);
                }
                None => {
                    sets.push(None);
                    scalars.push(self.eval(expr, env)?);
                }
            }
        }
        if sets.iter().all(Option::is_none) {
            return Ok(vec![scalars]);
        }
        let rows = sets.iter().flatten().map(Vec::len).max().unwrap_or(0);
        Ok((0..rows)
            .map(|row| {
                scalars
                    .iter()
                    .zip(&sets)
                    .map(|(scalar, set)| match set {
                        Some(values) => values.get(row).cloned().unwrap_or(Datum::Null),
                        None => scalar.clone(),
                    })
                    .collect()
            })
            .collect())
    }

    /// The values of a set-returning call, or `None` for any other expression.
    fn set_returning(&mut self, expr: &ast::Expr, env: &Env<'_>) -> Result<Option<Vec<Datum>>> {
        let ast::Expr::Function(function) = expr else { return Ok(None) };
        let name = function.name.0.last().and_then(|p| p.as_ident()).map(identifier).unwrap_or_default();
        if !matches!(name.as_str(), "unnest" | "generate_subscripts" | "generate_series") {
            return Ok(None);
        }
        let ast::FunctionArguments::List(list) = &function.args else { return Ok(None) };
        let arguments = function_arguments(&list.args)?;
        let (_, rows) = self.table_function(&name, &arguments, false, None, Some(env))?;
        Ok(Some(rows.into_iter().filter_map(|r| r.into_iter().next()).collect()))
    }

    /// With no rows nothing is evaluated, but a misspelled column must still be an error (as
    /// PostgreSQL reports at parse time): evaluate once over a row of NULLs and keep only
    /// name errors.
    fn check_names(&mut self, select: &ast::Select, layout: &Layout, outer: Option<&Env<'_>>) -> Result<()> {
        let nulls = vec![Datum::Null; layout.len()];
        let env = Env { layout, row: &nulls, parent: outer, group: Some(&[]) };
        let items = expand_items(&select.projection, layout)?;
        let checked = self.project(&items, &env).err().into_iter();
        let checked = checked.chain(select.selection.iter().filter_map(|e| self.eval(e, &env).err()));
        for error in checked.collect::<Vec<_>>() {
            if matches!(error.sqlstate(), "42703" | "42702" | "42883" | "42P01") {
                return Err(error);
            }
        }
        Ok(())
    }

    /// ORDER BY keys of one output row: output names and positions first, then expressions
    /// over the source row.
    fn order_keys(
        &mut self,
        order: &[ast::OrderByExpr],
        env: &Env<'_>,
        items: &[(ast::Expr, String)],
        values: &[Datum],
    ) -> Result<Vec<Datum>> {
        order
            .iter()
            .map(|key| {
                if let ast::Expr::Value(v) = &key.expr {
                    if let ast::Value::Number(n, _) = &v.value {
                        let position: usize = n.parse().map_err(|_| EngineError::Syntax(format!("ORDER BY {n}")))?;
                        return values.get(position.wrapping_sub(1)).cloned().ok_or_else(|| {
                            EngineError::Syntax(format!("ORDER BY position {position} is not in select list"))
                        });
                    }
                }
                if let ast::Expr::Identifier(ident) = &key.expr {
                    let name = identifier(ident);
                    if let Some(index) = items.iter().position(|(_, n)| *n == name) {
                        return Ok(values[index].clone());
                    }
                }
                self.eval(&key.expr, env)
            })
            .collect()
    }

    fn group(
        &mut self,
        layout: &Layout,
        rows: Vec<Vec<Datum>>,
        group_by: &[ast::Expr],
        outer: Option<&Env<'_>>,
    ) -> Result<Vec<Group>> {
        if group_by.is_empty() {
            let first = rows.first().cloned().unwrap_or_else(|| vec![Datum::Null; layout.len()]);
            return Ok(vec![(first, rows)]);
        }
        let mut groups: Vec<Forming> = Vec::new();
        for row in rows {
            let env = Env { layout, row: &row, parent: outer, group: None };
            let key = group_by.iter().map(|e| self.eval(e, &env)).collect::<Result<Vec<_>>>()?;
            match groups.iter_mut().find(|(k, _, _)| same_row(k, &key)) {
                Some((_, _, members)) => members.push(row),
                None => groups.push((key, row.clone(), vec![row])),
            }
        }
        Ok(groups.into_iter().map(|(_, first, members)| (first, members)).collect())
    }

    /// The FROM clause as rows (a cross product of its items).
    fn from(&mut self, from: &[ast::TableWithJoins], outer: Option<&Env<'_>>) -> Result<(Layout, Vec<Vec<Datum>>)> {
        let mut layout: Layout = Vec::new();
        let mut rows: Vec<Vec<Datum>> = vec![Vec::new()];
        for item in from {
            (layout, rows) = self.join_into(layout, rows, &item.relation, None, outer)?;
            for join in &item.joins {
                (layout, rows) = self.join_into(layout, rows, &join.relation, Some(&join.join_operator), outer)?;
            }
        }
        Ok((layout, rows))
    }

    /// Joins `factor` onto the rows so far (`operator` None: a comma, a cross product).
    fn join_into(
        &mut self,
        layout: Layout,
        rows: Vec<Vec<Datum>>,
        factor: &ast::TableFactor,
        operator: Option<&ast::JoinOperator>,
        outer: Option<&Env<'_>>,
    ) -> Result<(Layout, Vec<Vec<Datum>>)> {
        use ast::JoinOperator as J;
        let (kind, constraint) = match operator {
            None => (JoinKind::Inner, None),
            Some(J::Join(c) | J::Inner(c)) => (JoinKind::Inner, Some(c)),
            Some(J::CrossJoin(c)) => (JoinKind::Inner, Some(c)),
            Some(J::Left(c) | J::LeftOuter(c)) => (JoinKind::Left, Some(c)),
            Some(J::Right(c) | J::RightOuter(c)) => (JoinKind::Right, Some(c)),
            Some(J::FullOuter(c)) => (JoinKind::Full, Some(c)),
            Some(other) => return Err(EngineError::unsupported(format!("join {other:?} in catalog queries"))),
        };
        let lateral = is_lateral(factor);
        let static_right = if lateral { None } else { Some(self.factor(factor, outer)?) };
        let mut joined_layout = layout.clone();
        let mut result = Vec::new();
        let mut right_layout_known: Option<Layout> = static_right.as_ref().map(|(l, _)| l.clone());
        let mut right_matched: Vec<bool> = static_right.as_ref().map_or_else(Vec::new, |(_, r)| vec![false; r.len()]);
        for left in &rows {
            let (right_layout, right_rows) = match &static_right {
                Some((l, r)) => (l.clone(), r.clone()),
                None => {
                    let env = Env { layout: &layout, row: left, parent: outer, group: None };
                    self.factor(factor, Some(&env))?
                }
            };
            if right_layout_known.is_none() {
                right_layout_known = Some(right_layout.clone());
            }
            let mut combined_layout = layout.clone();
            combined_layout.extend(right_layout.iter().cloned());
            let mut matched = false;
            for (index, right) in right_rows.iter().enumerate() {
                let mut row = left.clone();
                row.extend(right.iter().cloned());
                let env = Env { layout: &combined_layout, row: &row, parent: outer, group: None };
                if self.join_condition(constraint, &env, &layout, &right_layout)? {
                    matched = true;
                    if let Some(flag) = right_matched.get_mut(index) {
                        *flag = true;
                    }
                    result.push(row);
                    if result.len() > ROWS_MAX {
                        return Err(EngineError::LimitExceeded(format!("catalog query above {ROWS_MAX} rows")));
                    }
                }
            }
            if !matched && matches!(kind, JoinKind::Left | JoinKind::Full) {
                let mut row = left.clone();
                row.extend(std::iter::repeat_n(Datum::Null, right_layout.len()));
                result.push(row);
            }
        }
        let right_layout = right_layout_known.unwrap_or_default();
        if let (JoinKind::Right | JoinKind::Full, Some((_, right_rows))) = (kind, &static_right) {
            for (right, matched) in right_rows.iter().zip(&right_matched) {
                if !matched {
                    let mut row = vec![Datum::Null; layout.len()];
                    row.extend(right.iter().cloned());
                    result.push(row);
                }
            }
        }
        joined_layout.extend(right_layout);
        Ok((joined_layout, result))
    }

    fn join_condition(
        &mut self,
        constraint: Option<&ast::JoinConstraint>,
        env: &Env<'_>,
        left: &Layout,
        right: &Layout,
    ) -> Result<bool> {
        match constraint {
            None | Some(ast::JoinConstraint::None) => Ok(true),
            Some(ast::JoinConstraint::On(expr)) => Ok(self.eval(expr, env)?.is_true()),
            Some(ast::JoinConstraint::Using(columns)) => {
                for column in columns {
                    let name = crate::bind::object_name(column)?;
                    let l = left.iter().position(|(_, n, _)| *n == name);
                    let r = right.iter().position(|(_, n, _)| *n == name);
                    let (Some(l), Some(r)) = (l, r) else {
                        return Err(EngineError::UnknownColumn(format!(
                            "\"{name}\" specified in USING clause does not exist"
                        )));
                    };
                    if !equals(&env.row[l], &env.row[left.len() + r]).is_true() {
                        return Ok(false);
                    }
                }
                Ok(true)
            }
            Some(ast::JoinConstraint::Natural) => Err(EngineError::unsupported("NATURAL JOIN in catalog queries")),
        }
    }

    /// One FROM item's columns and rows.
    fn factor(&mut self, factor: &ast::TableFactor, outer: Option<&Env<'_>>) -> Result<(Layout, Vec<Vec<Datum>>)> {
        match factor {
            ast::TableFactor::Table { name, alias, args: None, .. } => {
                let parts: Vec<String> = name.0.iter().filter_map(|p| p.as_ident()).map(identifier).collect();
                let (schema, table) = match parts.as_slice() {
                    [table] => (None, table.clone()),
                    [schema, table] => (Some(schema.as_str()), table.clone()),
                    [_, schema, table] => (Some(schema.as_str()), table.clone()),
                    _ => return Err(EngineError::UnknownTable(name.to_string())),
                };
                let output = match (schema, self.ctes.get(&table)) {
                    (None, Some(cte)) => cte.clone(),
                    _ => self.relation(schema, &table)?,
                };
                let alias_name = alias.as_ref().map_or(table, |a| identifier(&a.name));
                let output = match alias {
                    Some(alias) => rename(output, &alias.columns),
                    None => output,
                };
                Ok(layout_of(&alias_name, output))
            }
            ast::TableFactor::Table { name, alias, args: Some(args), with_ordinality, .. } => {
                let arguments: Vec<&ast::Expr> = function_arguments(&args.args)?;
                self.table_function(&name.to_string(), &arguments, *with_ordinality, alias.as_ref(), outer)
            }
            ast::TableFactor::Function { name, args, alias, with_ordinality, .. } => {
                let arguments = function_arguments(args)?;
                self.table_function(&name.to_string(), &arguments, *with_ordinality, alias.as_ref(), outer)
            }
            ast::TableFactor::UNNEST { alias, array_exprs, with_ordinality, with_offset: false, .. } => {
                let arguments: Vec<&ast::Expr> = array_exprs.iter().collect();
                self.table_function("unnest", &arguments, *with_ordinality, alias.as_ref(), outer)
            }
            ast::TableFactor::Derived { subquery, alias, .. } => {
                let output = self.query(subquery, outer)?;
                let name = alias.as_ref().map_or_else(String::new, |a| identifier(&a.name));
                let output = match alias {
                    Some(alias) => rename(output, &alias.columns),
                    None => output,
                };
                Ok(layout_of(&name, output))
            }
            ast::TableFactor::NestedJoin { table_with_joins, alias: None } => {
                self.from(std::slice::from_ref(table_with_joins.as_ref()), outer)
            }
            other => Err(EngineError::unsupported(format!("FROM {other} in catalog queries"))),
        }
    }

    fn relation(&self, schema: Option<&str>, table: &str) -> Result<Output> {
        let Relation { columns, rows } = tables::relation(schema, table, self.context).ok_or_else(|| {
            EngineError::UnknownTable(match schema {
                Some(schema) => format!("{schema}.{table}"),
                None => table.to_string(),
            })
        })?;
        Ok(Output { columns, rows })
    }

    /// `unnest(array)`, `generate_series(a, b)`, `generate_subscripts(array, 1)` in FROM.
    fn table_function(
        &mut self,
        name: &str,
        arguments: &[&ast::Expr],
        with_ordinality: bool,
        alias: Option<&ast::TableAlias>,
        outer: Option<&Env<'_>>,
    ) -> Result<(Layout, Vec<Vec<Datum>>)> {
        let env = outer.copied().unwrap_or_else(|| Env::empty());
        let values = arguments.iter().map(|a| self.eval(a, &env)).collect::<Result<Vec<_>>>()?;
        let short = name.rsplit('.').next().unwrap_or(name).to_lowercase();
        let (column, items): (PgType, Vec<Datum>) = match (short.as_str(), values.as_slice()) {
            ("unnest", [Datum::Array(items)]) => {
                (PgType::of(items.first().unwrap_or(&Datum::Null)).unwrap_or(PgType::Text), items.clone())
            }
            ("unnest", [Datum::Null]) => (PgType::Text, Vec::new()),
            ("generate_series", [start, end]) | ("generate_series", [start, end, _]) => {
                let step = values.get(2).and_then(Datum::as_int).unwrap_or(1);
                let (Some(start), Some(end)) = (start.as_int(), end.as_int()) else {
                    return Ok((Vec::new(), Vec::new()));
                };
                if step == 0 {
                    return Err(EngineError::InvalidParameterValue("step size cannot equal zero".into()));
                }
                let count = ((end - start) / step + 1).max(0) as usize;
                if count > ROWS_MAX {
                    return Err(EngineError::LimitExceeded(format!("generate_series above {ROWS_MAX} rows")));
                }
                (PgType::Int8, (0..count as i64).map(|i| Datum::Int(start + i * step)).collect())
            }
            ("generate_subscripts", [Datum::Array(items), _]) => {
                (PgType::Int4, (1..=items.len() as i64).map(Datum::Int).collect())
            }
            ("generate_subscripts", [_, _]) => (PgType::Int4, Vec::new()),
            _ => return Err(EngineError::UndefinedFunction(format!("function {name} in FROM does not exist"))),
        };
        let alias_name = alias.map_or(short.clone(), |a| identifier(&a.name));
        let column_names: Vec<String> =
            alias.map(|a| a.columns.iter().map(|c| identifier(&c.name)).collect()).unwrap_or_default();
        let mut columns = vec![(column_names.first().cloned().unwrap_or_else(|| alias_name.clone()), column)];
        if with_ordinality {
            columns.push((column_names.get(1).cloned().unwrap_or_else(|| "ordinality".into()), PgType::Int8));
        }
        let rows = items
            .into_iter()
            .enumerate()
            .map(|(i, item)| if with_ordinality { vec![item, Datum::Int(i as i64 + 1)] } else { vec![item] })
            .collect();
        Ok(layout_of(&alias_name, Output { columns, rows }))
    }

    /// Evaluates an expression in `env`.
    pub fn eval(&mut self, expr: &ast::Expr, env: &Env<'_>) -> Result<Datum> {
        use ast::Expr as E;
        Ok(match expr {
            E::Identifier(ident) => {
                let name = identifier(ident);
                match resolve(env, None, &name) {
                    Ok(value) => value,
                    Err(error) => functions::niladic(&name, self.context).ok_or(error)?,
                }
            }
            E::CompoundIdentifier(parts) => {
                let names: Vec<String> = parts.iter().map(identifier).collect();
                match names.as_slice() {
                    [.., relation, column] => resolve(env, Some(relation), column)?,
                    _ => return Err(EngineError::UnknownColumn(format!("\"{expr}\" does not exist"))),
                }
            }
            E::Value(value) => literal(&value.value)?,
            E::Nested(inner) => self.eval(inner, env)?,
            E::Collate { expr, collation } => {
                let name = collation.to_string().to_lowercase().replace('"', "");
                if !["default", "pg_catalog.default", "c", "pg_catalog.c", "posix"].contains(&name.as_str()) {
                    return Err(EngineError::unsupported(format!("collation {collation}")));
                }
                self.eval(expr, env)?
            }
            E::UnaryOp { op, expr } => unary(*op, self.eval(expr, env)?)?,
            E::BinaryOp { left, op, right } => self.binary(left, op, right, env)?,
            E::IsNull(e) => Datum::Bool(self.eval(e, env)?.is_null()),
            E::IsNotNull(e) => Datum::Bool(!self.eval(e, env)?.is_null()),
            E::IsTrue(e) => Datum::Bool(self.eval(e, env)?.is_true()),
            E::IsNotTrue(e) => Datum::Bool(!self.eval(e, env)?.is_true()),
            E::IsFalse(e) => Datum::Bool(matches!(self.eval(e, env)?, Datum::Bool(false))),
            E::IsNotFalse(e) => Datum::Bool(!matches!(self.eval(e, env)?, Datum::Bool(false))),
            E::IsDistinctFrom(a, b) | E::IsNotDistinctFrom(a, b) => {
                let (x, y) = (self.eval(a, env)?, self.eval(b, env)?);
                let same = match (x.is_null(), y.is_null()) {
                    (true, true) => true,
                    (false, false) => equals(&x, &y).is_true(),
                    _ => false,
                };
                Datum::Bool(same == matches!(expr, E::IsNotDistinctFrom(..)))
            }
            E::InList { expr, list, negated } => {
                let value = self.eval(expr, env)?;
                let items = list.iter().map(|e| self.eval(e, env)).collect::<Result<Vec<_>>>()?;
                membership(&value, &items, *negated)
            }
            E::InSubquery { expr, subquery, negated } => {
                let value = self.eval(expr, env)?;
                let output = self.query(subquery, Some(env))?;
                let items: Vec<Datum> = output.rows.into_iter().filter_map(|r| r.into_iter().next()).collect();
                membership(&value, &items, *negated)
            }
            E::Between { expr, negated, low, high } => {
                let value = self.eval(expr, env)?;
                let (low, high) = (self.eval(low, env)?, self.eval(high, env)?);
                match (compare(&value, &low), compare(&value, &high)) {
                    (Some(a), Some(b)) => Datum::Bool((a != Ordering::Less && b != Ordering::Greater) != *negated),
                    _ => Datum::Null,
                }
            }
            E::Like { negated, expr, pattern, escape_char: None, any: false } => {
                self.like(expr, pattern, *negated, false, env)?
            }
            E::ILike { negated, expr, pattern, escape_char: None, any: false } => {
                self.like(expr, pattern, *negated, true, env)?
            }
            E::Case { operand, conditions, else_result, .. } => {
                self.case(operand.as_deref(), conditions, else_result.as_deref(), env)?
            }
            E::Cast { expr, data_type, .. } => functions::cast(self.eval(expr, env)?, data_type, self.context)?,
            E::TypedString(typed) => {
                let text = match &typed.value.value {
                    ast::Value::SingleQuotedString(s) => Datum::text(s.clone()),
                    other => literal(other)?,
                };
                functions::cast(text, &typed.data_type, self.context)?
            }
            E::Subquery(query) => {
                let output = self.query(query, Some(env))?;
                match output.rows.len() {
                    0 => Datum::Null,
                    1 => output.rows.into_iter().next().and_then(|r| r.into_iter().next()).unwrap_or(Datum::Null),
                    _ => return Err(EngineError::CardinalityViolation),
                }
            }
            E::Exists { subquery, negated } => {
                Datum::Bool(self.query(subquery, Some(env))?.rows.is_empty() == *negated)
            }
            E::Array(array) => Datum::Array(array.elem.iter().map(|e| self.eval(e, env)).collect::<Result<Vec<_>>>()?),
            E::AnyOp { left, compare_op, right, .. } | E::AllOp { left, compare_op, right } => {
                let all = matches!(expr, E::AllOp { .. });
                self.quantified(left, compare_op, right, all, env)?
            }
            E::CompoundFieldAccess { root, access_chain } => {
                let mut value = self.eval(root, env)?;
                for access in access_chain {
                    let ast::AccessExpr::Subscript(ast::Subscript::Index { index }) = access else {
                        return Err(EngineError::unsupported(format!("{expr} in catalog queries")));
                    };
                    let position = self.eval(index, env)?.as_int();
                    value = match (value, position) {
                        (Datum::Array(items), Some(p)) => {
                            usize::try_from(p - 1).ok().and_then(|i| items.get(i).cloned()).unwrap_or(Datum::Null)
                        }
                        _ => Datum::Null,
                    };
                }
                value
            }
            E::Function(function) => self.function(function, env)?,
            E::Substring { expr, substring_from, substring_for, .. } => {
                let text = self.eval(expr, env)?;
                let from = substring_from.as_ref().map(|e| self.eval(e, env)).transpose()?;
                let length = substring_for.as_ref().map(|e| self.eval(e, env)).transpose()?;
                functions::substring(&text, from.as_ref(), length.as_ref())
            }
            E::Tuple(_) | E::Wildcard(_) | E::QualifiedWildcard(..) => {
                return Err(EngineError::unsupported(format!("{expr} here in catalog queries")))
            }
            other => return Err(EngineError::unsupported(format!("expression {other} in catalog queries"))),
        })
    }

    fn binary(
        &mut self,
        left: &ast::Expr,
        op: &ast::BinaryOperator,
        right: &ast::Expr,
        env: &Env<'_>,
    ) -> Result<Datum> {
        use ast::BinaryOperator as B;
        match op {
            B::And => {
                let l = self.eval(left, env)?;
                if matches!(l, Datum::Bool(false)) {
                    return Ok(Datum::Bool(false));
                }
                let r = self.eval(right, env)?;
                return Ok(match (l.is_null(), r.is_null()) {
                    _ if matches!(r, Datum::Bool(false)) => Datum::Bool(false),
                    (false, false) => Datum::Bool(l.is_true() && r.is_true()),
                    _ => Datum::Null,
                });
            }
            B::Or => {
                let l = self.eval(left, env)?;
                if l.is_true() {
                    return Ok(Datum::Bool(true));
                }
                let r = self.eval(right, env)?;
                return Ok(match (l.is_null(), r.is_null()) {
                    _ if r.is_true() => Datum::Bool(true),
                    (false, false) => Datum::Bool(false),
                    _ => Datum::Null,
                });
            }
            _ => {}
        }
        let (l, r) = (self.eval(left, env)?, self.eval(right, env)?);
        functions::operator(op, &l, &r)
    }

    fn like(
        &mut self,
        expr: &ast::Expr,
        pattern: &ast::Expr,
        negated: bool,
        insensitive: bool,
        env: &Env<'_>,
    ) -> Result<Datum> {
        let (value, pattern) = (self.eval(expr, env)?, self.eval(pattern, env)?);
        let (Some(value), Some(pattern)) = (value.as_text(), pattern.as_text()) else { return Ok(Datum::Null) };
        let matcher = crate::expr::LikePattern::new(&if insensitive { pattern.to_lowercase() } else { pattern });
        let subject = if insensitive { value.to_lowercase() } else { value };
        Ok(Datum::Bool(matcher.matches(&subject) != negated))
    }

    fn case(
        &mut self,
        operand: Option<&ast::Expr>,
        conditions: &[ast::CaseWhen],
        otherwise: Option<&ast::Expr>,
        env: &Env<'_>,
    ) -> Result<Datum> {
        let subject = operand.map(|o| self.eval(o, env)).transpose()?;
        for branch in conditions {
            let condition = self.eval(&branch.condition, env)?;
            let hit = match &subject {
                Some(subject) => equals(subject, &condition).is_true(),
                None => condition.is_true(),
            };
            if hit {
                return self.eval(&branch.result, env);
            }
        }
        otherwise.map_or(Ok(Datum::Null), |e| self.eval(e, env))
    }

    /// `x op ANY (array | subquery)` and `x op ALL (…)`.
    fn quantified(
        &mut self,
        left: &ast::Expr,
        op: &ast::BinaryOperator,
        right: &ast::Expr,
        all: bool,
        env: &Env<'_>,
    ) -> Result<Datum> {
        let value = self.eval(left, env)?;
        let items: Vec<Datum> = match right {
            ast::Expr::Subquery(query) => {
                self.query(query, Some(env))?.rows.into_iter().filter_map(|r| r.into_iter().next()).collect()
            }
            other => match self.eval(other, env)? {
                Datum::Array(items) => items,
                Datum::Null => return Ok(Datum::Null),
                single => vec![single],
            },
        };
        let mut unknown = false;
        for item in &items {
            match functions::operator(op, &value, item)? {
                Datum::Bool(hit) if hit != all => return Ok(Datum::Bool(hit)),
                Datum::Null => unknown = true,
                _ => {}
            }
        }
        Ok(if unknown { Datum::Null } else { Datum::Bool(all) })
    }

    fn function(&mut self, function: &ast::Function, env: &Env<'_>) -> Result<Datum> {
        let name = function.name.0.last().and_then(|p| p.as_ident()).map(identifier).unwrap_or_default();
        if let ast::FunctionArguments::Subquery(query) = &function.args {
            if name == "array" {
                let output = self.query(query, Some(env))?;
                return Ok(Datum::Array(output.rows.into_iter().filter_map(|r| r.into_iter().next()).collect()));
            }
            return Err(EngineError::unsupported(format!("{name}(subquery)")));
        }
        if functions::is_aggregate(&name) {
            return self.aggregate(&name, function, env);
        }
        if function.over.is_some() {
            return Err(EngineError::unsupported("window functions in catalog queries"));
        }
        let arguments = match &function.args {
            ast::FunctionArguments::None => Vec::new(),
            ast::FunctionArguments::List(list) => function_arguments(&list.args)?,
            ast::FunctionArguments::Subquery(_) => unreachable!("handled above"),
        };
        let values = arguments.iter().map(|a| self.eval(a, env)).collect::<Result<Vec<_>>>()?;
        functions::call(&name, &values, self.context)
    }

    fn aggregate(&mut self, name: &str, function: &ast::Function, env: &Env<'_>) -> Result<Datum> {
        let Some(group) = env.group else {
            return Err(EngineError::Grouping(format!("aggregate function {name} is not allowed here")));
        };
        let ast::FunctionArguments::List(list) = &function.args else {
            return Err(EngineError::Syntax(format!("{name} needs arguments")));
        };
        let star = matches!(list.args.as_slice(), [ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Wildcard)]);
        let arguments = if star { Vec::new() } else { function_arguments(&list.args)? };
        let order: Vec<&ast::OrderByExpr> = list
            .clauses
            .iter()
            .filter_map(|c| match c {
                ast::FunctionArgumentClause::OrderBy(exprs) => Some(exprs.iter()),
                _ => None,
            })
            .flatten()
            .collect();
        let mut inputs: Vec<(Vec<Datum>, Vec<Datum>)> = Vec::with_capacity(group.len());
        for row in group {
            let row_env = Env { layout: env.layout, row, parent: env.parent, group: None };
            if let Some(filter) = &function.filter {
                if !self.eval(filter, &row_env)?.is_true() {
                    continue;
                }
            }
            let values = arguments.iter().map(|a| self.eval(a, &row_env)).collect::<Result<Vec<_>>>()?;
            let keys = order.iter().map(|o| self.eval(&o.expr, &row_env)).collect::<Result<Vec<_>>>()?;
            inputs.push((keys, values));
        }
        if !order.is_empty() {
            inputs.sort_by(|a, b| {
                for ((x, y), key) in a.0.iter().zip(&b.0).zip(&order) {
                    let ordering = sort_order(x, y);
                    let ordering = if matches!(key.options.sort, Some(ast::OrderBySort::Desc)) {
                        ordering.reverse()
                    } else {
                        ordering
                    };
                    if ordering != Ordering::Equal {
                        return ordering;
                    }
                }
                Ordering::Equal
            });
        }
        let distinct = matches!(list.duplicate_treatment, Some(ast::DuplicateTreatment::Distinct));
        let mut values: Vec<Vec<Datum>> = inputs.into_iter().map(|(_, v)| v).collect();
        if distinct {
            self::distinct(&mut values);
        }
        functions::aggregate(name, star, &values)
    }
}

#[derive(Clone, Copy)]
enum JoinKind {
    Inner,
    Left,
    Right,
    Full,
}

fn is_lateral(factor: &ast::TableFactor) -> bool {
    match factor {
        ast::TableFactor::Derived { lateral, .. } | ast::TableFactor::Function { lateral, .. } => *lateral,
        // Table functions may use the row before them (PostgreSQL treats them as LATERAL).
        ast::TableFactor::Table { args: Some(_), .. } | ast::TableFactor::UNNEST { .. } => true,
        _ => false,
    }
}

fn function_arguments(args: &[ast::FunctionArg]) -> Result<Vec<&ast::Expr>> {
    args.iter()
        .map(|a| match a {
            ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Expr(e)) => Ok(e),
            ast::FunctionArg::Named { arg: ast::FunctionArgExpr::Expr(e), .. } => Ok(e),
            other => Err(EngineError::unsupported(format!("function argument {other}"))),
        })
        .collect()
}

/// The value of a column visible in `env` (or an enclosing query's row).
fn resolve(env: &Env<'_>, relation: Option<&str>, column: &str) -> Result<Datum> {
    let mut current = Some(env);
    while let Some(scope) = current {
        let mut found = scope
            .layout
            .iter()
            .enumerate()
            .filter(|(_, (alias, name, _))| name == column && relation.is_none_or(|r| r == alias));
        if let Some((index, _)) = found.next() {
            if found.next().is_some() && relation.is_none() {
                return Err(EngineError::AmbiguousColumn(column.to_string()));
            }
            return Ok(scope.row.get(index).cloned().unwrap_or(Datum::Null));
        }
        current = scope.parent;
    }
    Err(EngineError::UnknownColumn(match relation {
        Some(relation) => format!("{relation}.{column} does not exist"),
        None => format!("\"{column}\" does not exist"),
    }))
}

fn literal(value: &ast::Value) -> Result<Datum> {
    Ok(match value {
        ast::Value::Number(n, _) => match n.parse::<i64>() {
            Ok(v) => Datum::Int(v),
            Err(_) => Datum::Float(n.parse().map_err(|_| EngineError::Syntax(format!("number {n}")))?),
        },
        ast::Value::SingleQuotedString(s)
        | ast::Value::EscapedStringLiteral(s)
        | ast::Value::NationalStringLiteral(s)
        | ast::Value::DoubleQuotedString(s) => Datum::text(s.clone()),
        ast::Value::DollarQuotedString(s) => Datum::text(s.value.clone()),
        ast::Value::Boolean(b) => Datum::Bool(*b),
        ast::Value::Null => Datum::Null,
        other => return Err(EngineError::unsupported(format!("literal {other}"))),
    })
}

fn unary(op: ast::UnaryOperator, value: Datum) -> Result<Datum> {
    Ok(match (op, value) {
        (_, Datum::Null) => Datum::Null,
        (ast::UnaryOperator::Not, v) => Datum::Bool(!v.is_true()),
        (ast::UnaryOperator::Minus, Datum::Int(v)) => Datum::Int(-v),
        (ast::UnaryOperator::Minus, Datum::Float(v)) => Datum::Float(-v),
        (ast::UnaryOperator::Plus, v) => v,
        (op, v) => return Err(EngineError::unsupported(format!("operator {op} on {v:?}"))),
    })
}

fn membership(value: &Datum, items: &[Datum], negated: bool) -> Datum {
    if value.is_null() {
        return Datum::Null;
    }
    let mut unknown = false;
    for item in items {
        match equals(value, item) {
            Datum::Bool(true) => return Datum::Bool(!negated),
            Datum::Null => unknown = true,
            _ => {}
        }
    }
    if unknown {
        Datum::Null
    } else {
        Datum::Bool(negated)
    }
}

fn same_row(a: &[Datum], b: &[Datum]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x.is_null() && y.is_null()) || equals(x, y).is_true())
}

fn distinct(rows: &mut Vec<Vec<Datum>>) {
    let mut kept: Vec<Vec<Datum>> = Vec::with_capacity(rows.len());
    for row in rows.drain(..) {
        if !kept.iter().any(|k| same_row(k, &row)) {
            kept.push(row);
        }
    }
    *rows = kept;
}

fn sort_by_keys(rows: &mut [(Vec<Datum>, Vec<Datum>)], order: &[ast::OrderByExpr]) {
    rows.sort_by(|a, b| {
        for ((x, y), key) in a.0.iter().zip(&b.0).zip(order) {
            let descending = matches!(key.options.sort, Some(ast::OrderBySort::Desc));
            let nulls_first = key.options.nulls_first.unwrap_or(descending);
            let ordering = match (x.is_null(), y.is_null()) {
                (true, true) => Ordering::Equal,
                (true, false) => {
                    if nulls_first {
                        Ordering::Less
                    } else {
                        Ordering::Greater
                    }
                }
                (false, true) => {
                    if nulls_first {
                        Ordering::Greater
                    } else {
                        Ordering::Less
                    }
                }
                (false, false) => {
                    let ordering = compare(x, y).unwrap_or(Ordering::Equal);
                    if descending {
                        ordering.reverse()
                    } else {
                        ordering
                    }
                }
            };
            if ordering != Ordering::Equal {
                return ordering;
            }
        }
        Ordering::Equal
    });
}

/// ORDER BY over a UNION or VALUES result: by output name or position only.
fn sort_output(
    output: &mut Output,
    order: &[ast::OrderByExpr],
    interpreter: &mut Interpreter<'_>,
    outer: Option<&Env<'_>>,
) -> Result<()> {
    if order.is_empty() {
        return Ok(());
    }
    let layout: Layout = output.columns.iter().map(|(n, t)| (String::new(), n.clone(), *t)).collect();
    let items: Vec<(ast::Expr, String)> = Vec::new();
    let mut keyed = Vec::with_capacity(output.rows.len());
    for row in std::mem::take(&mut output.rows) {
        let env = Env { layout: &layout, row: &row, parent: outer, group: None };
        let keys = interpreter.order_keys(order, &env, &items, &row)?;
        keyed.push((keys, row));
    }
    sort_by_keys(&mut keyed, order);
    output.rows = keyed.into_iter().map(|(_, row)| row).collect();
    Ok(())
}

fn rename(mut output: Output, columns: &[ast::TableAliasColumnDef]) -> Output {
    for (column, alias) in output.columns.iter_mut().zip(columns) {
        column.0 = identifier(&alias.name);
    }
    output
}

fn layout_of(alias: &str, output: Output) -> (Layout, Vec<Vec<Datum>>) {
    let layout = output.columns.into_iter().map(|(name, pg_type)| (alias.to_string(), name, pg_type)).collect();
    (layout, output.rows)
}

/// The select list with `*` and `alias.*` expanded; each item with its output name.
fn expand_items(projection: &[ast::SelectItem], layout: &Layout) -> Result<Vec<(ast::Expr, String)>> {
    let mut items = Vec::new();
    for item in projection {
        match item {
            ast::SelectItem::UnnamedExpr(expr) => items.push((expr.clone(), output_name(expr))),
            ast::SelectItem::ExprWithAlias { expr, alias } => items.push((expr.clone(), identifier(alias))),
            ast::SelectItem::ExprWithAliases { .. } => {
                return Err(EngineError::unsupported("several aliases for one item"))
            }
            ast::SelectItem::Wildcard(_) => {
                for (alias, name, _) in layout {
                    items.push((column_expr(alias, name), name.clone()));
                }
            }
            ast::SelectItem::QualifiedWildcard(kind, _) => {
                let relation = match kind {
                    ast::SelectItemQualifiedWildcardKind::ObjectName(name) => crate::bind::object_name(name)?,
                    ast::SelectItemQualifiedWildcardKind::Expr(e) => e.to_string(),
                };
                for (alias, name, _) in layout.iter().filter(|(a, _, _)| *a == relation) {
                    items.push((column_expr(alias, name), name.clone()));
                }
            }
        }
    }
    Ok(items)
}

fn column_expr(alias: &str, name: &str) -> ast::Expr {
    if alias.is_empty() {
        ast::Expr::Identifier(ast::Ident::with_quote('"', name))
    } else {
        ast::Expr::CompoundIdentifier(vec![ast::Ident::with_quote('"', alias), ast::Ident::with_quote('"', name)])
    }
}

/// PostgreSQL's output name of an unnamed select item.
fn output_name(expr: &ast::Expr) -> String {
    match expr {
        ast::Expr::Identifier(ident) => identifier(ident),
        ast::Expr::CompoundIdentifier(parts) => parts.last().map(identifier).unwrap_or_default(),
        ast::Expr::Function(function) => {
            function.name.0.last().and_then(|p| p.as_ident()).map(identifier).unwrap_or_else(|| "?column?".into())
        }
        ast::Expr::Cast { expr, data_type, .. } => match expr.as_ref() {
            ast::Expr::Value(_) => data_type_name(data_type),
            inner => output_name(inner),
        },
        ast::Expr::Nested(inner) | ast::Expr::Collate { expr: inner, .. } => output_name(inner),
        ast::Expr::Case { .. } => "case".into(),
        ast::Expr::Exists { .. } => "exists".into(),
        ast::Expr::Array(_) => "array".into(),
        _ => "?column?".into(),
    }
}

fn data_type_name(data_type: &ast::DataType) -> String {
    let text = data_type.to_string().to_lowercase();
    let text = text.trim_start_matches("pg_catalog.");
    match text {
        "integer" | "int" => "int4".into(),
        "bigint" => "int8".into(),
        "smallint" => "int2".into(),
        "boolean" => "bool".into(),
        other => other.split('(').next().unwrap_or(other).to_string(),
    }
}

/// The declared type of an expression when it is a column or a cast (else `None`).
fn static_type(expr: &ast::Expr, layout: &Layout) -> Option<PgType> {
    match expr {
        ast::Expr::Identifier(ident) => {
            let name = identifier(ident);
            layout.iter().find(|(_, n, _)| *n == name).map(|(_, _, t)| *t)
        }
        ast::Expr::CompoundIdentifier(parts) if parts.len() >= 2 => {
            let (relation, column) = (identifier(&parts[parts.len() - 2]), identifier(&parts[parts.len() - 1]));
            layout.iter().find(|(a, n, _)| *a == relation && *n == column).map(|(_, _, t)| *t)
        }
        ast::Expr::Nested(inner) | ast::Expr::Collate { expr: inner, .. } => static_type(inner, layout),
        ast::Expr::Cast { data_type, .. } => functions::cast_type(data_type),
        _ => None,
    }
}

/// The type of column `index` from its values (text when all are NULL).
fn column_type(rows: &[Vec<Datum>], index: usize) -> PgType {
    rows.iter().filter_map(|r| r.get(index)).find_map(PgType::of).unwrap_or(PgType::Text)
}

/// Whether an expression calls an aggregate (outside subqueries).
fn has_aggregate(expr: &ast::Expr) -> bool {
    use ast::Expr as E;
    match expr {
        E::Function(f) => {
            let name = f.name.0.last().and_then(|p| p.as_ident()).map(identifier).unwrap_or_default();
            functions::is_aggregate(&name)
                || matches!(&f.args, ast::FunctionArguments::List(list) if list.args.iter().any(|a| matches!(a,
                    ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Expr(e)) if has_aggregate(e))))
        }
        E::BinaryOp { left, right, .. } => has_aggregate(left) || has_aggregate(right),
        E::UnaryOp { expr, .. }
        | E::Nested(expr)
        | E::Cast { expr, .. }
        | E::Collate { expr, .. }
        | E::IsNull(expr)
        | E::IsNotNull(expr) => has_aggregate(expr),
        E::Case { operand, conditions, else_result, .. } => {
            operand.as_deref().is_some_and(has_aggregate)
                || conditions.iter().any(|c| has_aggregate(&c.condition) || has_aggregate(&c.result))
                || else_result.as_deref().is_some_and(has_aggregate)
        }
        _ => false,
    }
}
