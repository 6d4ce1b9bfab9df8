//! INSERT … ON CONFLICT [(columns) | ON CONSTRAINT name] DO NOTHING | DO UPDATE SET … [WHERE …].
//!
//! ```text
//!   proposed row ─► key under each arbiter (the unique constraints the target names)
//!     no conflict        ─► appended (its keys now conflict with later rows)
//!     conflict, NOTHING  ─► skipped
//!     conflict, UPDATE   ─► SET values = SELECT <values> FROM <table> (the existing row),
//!                           excluded (the proposed row) WHERE <condition>, over the
//!                           statement's catalog (so SET may hold subqueries)
//!   new version: rewritten chunks of updated rows + appended rows, unique indexes rebuilt
//! ```
//!
//! As in PostgreSQL, one command may not update a row twice, nor update a row it inserted
//! (21000); the command tag counts inserted plus updated rows.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use sqlparser::ast;

use crate::bind::{identifier, object_name};
use crate::catalog::Catalog;
use crate::engine::Engine;
use crate::error::{EngineError, Result};
use crate::session::Session;
use crate::storage::{unique_key, Constraints, Table, TableBuilder};
use crate::types::Value;

/// Where a row a proposed row may conflict with is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Position {
    /// Row `1` of chunk `0` of the table as it was.
    Existing(usize, usize),
    /// The `n`-th row this command appends.
    New(usize),
}

/// What the command does with a conflicting row.
enum Action {
    Nothing,
    Update { columns: Vec<usize>, query: Box<ast::Query> },
}

/// The rows of an upsert, as they are decided.
struct Outcome {
    appended: Vec<Vec<Value>>,
    updated: BTreeMap<(usize, usize), Vec<Value>>,
    /// For RETURNING: inserted and updated rows in the order they were decided.
    affected: Vec<Vec<Value>>,
}

/// Runs INSERT … ON CONFLICT for full `rows` (in table order) into the table stored under
/// `key`; returns the new version and the affected rows.
pub(crate) fn upsert(
    session: &mut Session,
    engine: &Engine,
    (key, target): (&str, &Table),
    on_conflict: &ast::OnConflict,
    rows: Vec<Vec<Value>>,
) -> Result<(Table, Vec<Vec<Value>>)> {
    let arbiters = arbiters(target, on_conflict)?;
    let action = match &on_conflict.action {
        ast::OnConflictAction::DoNothing => Action::Nothing,
        ast::OnConflictAction::DoUpdate(statement) => {
            let (columns, query) = update_query(target, statement)?;
            Action::Update { columns, query: Box::new(query) }
        }
    };
    let base = session.take_for_write(engine, key)?.ok_or_else(|| EngineError::UnknownTable(target.name.clone()))?;
    let outcome = decide(session, engine, (key, &base), &arbiters, &action, rows)?;
    let mut builder = TableBuilder::from_version(Arc::clone(engine.runtime().pool()), base);
    let mut by_chunk: BTreeMap<usize, Vec<(usize, Vec<Value>)>> = BTreeMap::new();
    for ((chunk, row), values) in outcome.updated {
        by_chunk.entry(chunk).or_default().push((row, values));
    }
    for (chunk, changes) in &by_chunk {
        let mut values = builder.chunk_values(*chunk);
        for (row, new) in changes {
            values[*row] = new.clone();
        }
        builder.rewrite_chunk(*chunk, &values)?;
    }
    if !by_chunk.is_empty() {
        builder.rebuild_indexes()?;
    }
    for row in &outcome.appended {
        builder.push_row(row)?;
    }
    Ok((builder.finish(), outcome.affected))
}

/// The unique constraints a conflict is checked against: those over exactly the named
/// columns, the named one, or (DO NOTHING without a target) all of them.
fn arbiters(target: &Table, on_conflict: &ast::OnConflict) -> Result<Vec<Vec<usize>>> {
    let unique = &target.constraints.unique;
    let chosen: Vec<Vec<usize>> = match &on_conflict.conflict_target {
        None => {
            if matches!(on_conflict.action, ast::OnConflictAction::DoUpdate(_)) {
                return Err(EngineError::Syntax(
                    "ON CONFLICT DO UPDATE requires inference specification or constraint name".into(),
                ));
            }
            unique.iter().map(|u| u.columns.clone()).collect()
        }
        Some(ast::ConflictTarget::Columns(columns)) => {
            let mut wanted = Vec::new();
            for column in columns {
                let name = identifier(column);
                let index = target
                    .column_index(&name)
                    .ok_or_else(|| EngineError::UnknownColumn(format!("\"{name}\" does not exist")))?;
                wanted.push(index);
            }
            wanted.sort_unstable();
            wanted.dedup();
            let same = |columns: &[usize]| {
                let mut sorted = columns.to_vec();
                sorted.sort_unstable();
                sorted == wanted
            };
            unique.iter().filter(|u| same(&u.columns)).map(|u| u.columns.clone()).collect()
        }
        Some(ast::ConflictTarget::OnConstraint(name)) => {
            let name = object_name(name)?;
            let found: Vec<Vec<usize>> =
                unique.iter().filter(|u| u.constraint && u.name == name).map(|u| u.columns.clone()).collect();
            if found.is_empty() {
                return Err(EngineError::UnknownObject(format!(
                    "constraint \"{name}\" for table \"{}\" does not exist",
                    target.name
                )));
            }
            found
        }
    };
    if chosen.is_empty() && on_conflict.conflict_target.is_some() {
        return Err(EngineError::InvalidColumnReference(
            "there is no unique or exclusion constraint matching the ON CONFLICT specification".into(),
        ));
    }
    Ok(chosen)
}

/// The columns DO UPDATE sets and the query computing their values:
/// `SELECT <values> FROM <table>, excluded [WHERE <condition>]`.
fn update_query(target: &Table, statement: &ast::DoUpdate) -> Result<(Vec<usize>, ast::Query)> {
    let mut columns = Vec::new();
    let mut values = Vec::new();
    for assignment in &statement.assignments {
        let ast::AssignmentTarget::ColumnName(column) = &assignment.target else {
            return Err(EngineError::unsupported("ON CONFLICT DO UPDATE of a column tuple"));
        };
        let name = object_name(column)?;
        let index = target.column_index(&name).ok_or_else(|| {
            EngineError::UnknownColumn(format!("\"{name}\" of relation \"{}\" does not exist", target.name))
        })?;
        if columns.contains(&index) {
            return Err(EngineError::Syntax(format!("multiple assignments to same column \"{name}\"")));
        }
        if matches!(&assignment.value, ast::Expr::Identifier(i) if i.quote_style.is_none() && i.value.eq_ignore_ascii_case("default"))
        {
            return Err(EngineError::unsupported("SET column = DEFAULT in ON CONFLICT DO UPDATE"));
        }
        columns.push(index);
        values.push(assignment.value.to_string());
    }
    // The query reads the target as a one-row stand-in (the existing row): a subquery reading
    // the target (or excluded) would see that row only, so it is refused.
    let reads_stand_in = |expr: &ast::Expr| {
        ast::visit_relations(expr, |relation| match object_name(relation) {
            Ok(name) if name == target.name || name == "excluded" => std::ops::ControlFlow::Break(()),
            _ => std::ops::ControlFlow::Continue(()),
        })
        .is_break()
    };
    let values_read = statement.assignments.iter().map(|a| &a.value).chain(&statement.selection);
    if values_read.into_iter().any(reads_stand_in) {
        return Err(EngineError::unsupported("a subquery reading the target table in ON CONFLICT DO UPDATE"));
    }
    let table = ast::Ident::with_quote('"', target.name.as_str()).to_string();
    let filter = statement.selection.as_ref().map_or(String::new(), |s| format!(" WHERE {s}"));
    let sql = format!("SELECT {} FROM {table}, excluded{filter}", values.join(", "));
    let mut statements = Engine::parse(&sql)?;
    match statements.pop() {
        Some(ast::Statement::Query(query)) if statements.is_empty() => Ok((columns, *query)),
        _ => Err(EngineError::Syntax(format!("cannot read ON CONFLICT DO UPDATE as a query: {sql}"))),
    }
}

/// Decides each proposed row in order (see the module docs).
fn decide(
    session: &mut Session,
    engine: &Engine,
    (key, base): (&str, &Arc<Table>),
    arbiters: &[Vec<usize>],
    action: &Action,
    rows: Vec<Vec<Value>>,
) -> Result<Outcome> {
    let mut keys: Vec<HashMap<Box<[u8]>, Position>> = vec![HashMap::new(); arbiters.len()];
    for chunk in 0..base.chunks.len() {
        for row in 0..base.chunks[chunk].rows {
            let values = base.row_values(chunk, row);
            index_row(&mut keys, arbiters, &values, Position::Existing(chunk, row));
        }
    }
    let mut outcome = Outcome { appended: Vec::new(), updated: BTreeMap::new(), affected: Vec::new() };
    for row in rows {
        crate::control::check()?;
        let conflict = arbiters
            .iter()
            .zip(&keys)
            .find_map(|(columns, index)| unique_key(&row, columns).and_then(|k| index.get(&k).copied()));
        match (conflict, action) {
            (None, _) => {
                index_row(&mut keys, arbiters, &row, Position::New(outcome.appended.len()));
                outcome.affected.push(row.clone());
                outcome.appended.push(row);
            }
            (Some(_), Action::Nothing) => {}
            (Some(Position::Existing(chunk, at)), Action::Update { columns, query }) => {
                if outcome.updated.contains_key(&(chunk, at)) {
                    return Err(twice());
                }
                let existing = base.row_values(chunk, at);
                let catalog = session.catalog(engine);
                let Some(new) = updated_row(engine, catalog, (key, base), query, columns, (&existing, &row))? else {
                    continue;
                };
                // The row's old keys no longer conflict; its new ones do.
                for (columns, index) in arbiters.iter().zip(keys.iter_mut()) {
                    if let Some(old) = unique_key(&existing, columns) {
                        index.remove(&old);
                    }
                }
                index_row(&mut keys, arbiters, &new, Position::Existing(chunk, at));
                outcome.affected.push(new.clone());
                outcome.updated.insert((chunk, at), new);
            }
            (Some(Position::New(_)), Action::Update { .. }) => return Err(twice()),
        }
    }
    Ok(outcome)
}

fn twice() -> EngineError {
    EngineError::UpsertTwice
}

fn index_row(keys: &mut [HashMap<Box<[u8]>, Position>], arbiters: &[Vec<usize>], row: &[Value], at: Position) {
    for (columns, index) in arbiters.iter().zip(keys) {
        if let Some(key) = unique_key(row, columns) {
            index.insert(key, at);
        }
    }
}

/// The existing row with DO UPDATE's values, or `None` when its WHERE rejects it.
fn updated_row(
    engine: &Engine,
    catalog: Catalog,
    (key, base): (&str, &Table),
    query: &ast::Query,
    columns: &[usize],
    (existing, proposed): (&[Value], &[Value]),
) -> Result<Option<Vec<Value>>> {
    let catalog = catalog
        .with_table(key, Arc::new(one_row_table(engine, base, &base.name, existing)?))
        .with_table("excluded", Arc::new(one_row_table(engine, base, "excluded", proposed)?));
    let result = engine.collect_query(&catalog, query)?;
    let Some(values) = result.rows().into_iter().next() else { return Ok(None) };
    let mut new = existing.to_vec();
    for (&column, value) in columns.iter().zip(values) {
        new[column] = crate::copy::coerce_value(value, base.schema[column].data_type)?;
    }
    Ok(Some(new))
}

/// `row` as a table named `name` with `like`'s columns and no constraints.
fn one_row_table(engine: &Engine, like: &Table, name: &str, row: &[Value]) -> Result<Table> {
    let pool = Arc::clone(engine.runtime().pool());
    let width = like.schema.len();
    let mut builder =
        TableBuilder::with_constraints(pool, name, like.oid, like.schema.clone(), Constraints::none(width), 1);
    builder.push_row(row)?;
    Ok(builder.finish())
}
