//! INSERT, UPDATE and DELETE (with WHERE and RETURNING) as new table versions in the session's
//! transaction.
//!
//! ```text
//!   INSERT: rows from VALUES (constants, DEFAULT) or a query ─► lock ─► builder.push_row
//!   UPDATE/DELETE: lock ─► per chunk: WHERE over scanned vectors ─► untouched chunks shared,
//!                  touched chunks rewritten ─► unique indexes rebuilt ─► new version
//!   RETURNING: the affected rows as a one-table catalog, then `SELECT <items> FROM <table>`
//!              through the ordinary binder and the streaming executor
//! ```
//!
//! INSERT into a partitioned table routes each row to its partition (`family::Router`);
//! UPDATE and DELETE of an inheritance parent change its descendants too; INSERT … ON
//! CONFLICT is `upsert`.
//!
//! A failed statement leaves nothing behind: its version never reaches the transaction, and
//! the transaction fails (PostgreSQL's semantics), so no partial write can be seen.

use std::sync::Arc;

use sqlparser::ast;

use crate::bind::{cast_expr, identifier, object_name, ExprBinder, Scope};
use crate::catalog::Catalog;
use crate::ddl::user_table_name;
use crate::engine::{Description, Engine};
use crate::error::{EngineError, Result};
use crate::expr::{evaluate, evaluate_constant, Expr};
use crate::session::Session;
use crate::storage::{ColumnDef, Constraints, Table, TableBuilder};
use crate::stream::{ResultShape, ResultSink};
use crate::types::{DataType, Value, ValueKey};
use crate::vector::{scan_chunk, Data, VECTOR_ROWS};

/// INSERT INTO t [(columns)] VALUES … | query | DEFAULT VALUES [RETURNING …].
pub fn insert(session: &mut Session, engine: &Engine, insert: &ast::Insert, sink: &dyn ResultSink) -> Result<String> {
    let on_conflict = match &insert.on {
        None => None,
        Some(ast::OnInsert::OnConflict(on_conflict)) => Some(on_conflict),
        Some(other) => return Err(EngineError::unsupported(format!("INSERT … {other}"))),
    };
    if insert.table_alias.is_some() || insert.output.is_some() || !insert.assignments.is_empty() {
        return Err(EngineError::unsupported("this form of INSERT"));
    }
    let ast::TableObject::TableName(table_name) = &insert.table else {
        return Err(EngineError::unsupported("INSERT into a table function"));
    };
    let name = crate::ddl::storage_key(session, engine, &user_table_name(table_name)?);
    let catalog = session.catalog(engine);
    let target = catalog.get(&name)?;
    crate::view::check_not_view(&target, "INSERT")?;
    let targets = target_columns(&target.schema, &insert.columns)?;
    let rows = match insert.source.as_deref() {
        None => vec![vec![None; 0]],
        Some(source) => match source.body.as_ref() {
            ast::SetExpr::Values(values) => values_rows(&values.rows, &targets, &target.schema)?,
            _ => engine
                .collect_query(&catalog, source)?
                .rows()
                .into_iter()
                .map(|row| row.into_iter().map(Some).collect())
                .collect(),
        },
    };
    if let Some(on_conflict) = on_conflict {
        if crate::family::is_partitioned(&target) || !crate::family::children(&catalog, &name).is_empty() {
            return Err(EngineError::unsupported("INSERT … ON CONFLICT into a table with partitions or children"));
        }
        let partition_constraint = crate::family::PartitionConstraint::of(&catalog, &target);
        drop(catalog);
        let full = rows
            .into_iter()
            .map(|row| full_row(&target.schema, &target.constraints, &targets, row))
            .collect::<Result<Vec<_>>>()?;
        full.iter().try_for_each(|row| partition_constraint.check(row))?;
        let (table, affected) = crate::upsert::upsert(session, engine, (&name, &target), on_conflict, full)?;
        if let Some(items) = &insert.returning {
            returning(engine, &table, &table.name, items, affected.clone(), sink)?;
        }
        session.write(&name, Some(table));
        return Ok(format!("INSERT 0 {}", affected.len()));
    }
    if let Some(router) = crate::family::Router::of(&catalog, &name, &target) {
        let partition_constraint = crate::family::PartitionConstraint::of(&catalog, &target);
        drop(catalog);
        return insert_routed(
            session,
            engine,
            insert,
            (&target, &targets, rows),
            (&router, &partition_constraint),
            sink,
        );
    }
    let partition_constraint = crate::family::PartitionConstraint::of(&catalog, &target);
    drop((catalog, target));
    let base = session.take_for_write(engine, &name)?.ok_or_else(|| EngineError::UnknownTable(name.clone()))?;
    let mut builder = TableBuilder::from_version(Arc::clone(engine.runtime().pool()), base);
    let count = rows.len();
    let mut inserted = Vec::new();
    for (number, row) in rows.into_iter().enumerate() {
        if number % VECTOR_ROWS == 0 {
            crate::control::check()?;
        }
        let full = full_row(builder.schema(), builder.constraints(), &targets, row)?;
        partition_constraint.check(&full)?;
        builder.push_row(&full)?;
        if insert.returning.is_some() {
            inserted.push(full);
        }
    }
    let table = builder.finish();
    if let Some(items) = &insert.returning {
        returning(engine, &table, &table.name, items, inserted, sink)?;
    }
    session.write(&name, Some(table));
    Ok(format!("INSERT 0 {count}"))
}

/// INSERT into a partitioned table: each row (completed with the table's defaults) goes to
/// the partition `router` picks, in one new version per partition written.
fn insert_routed(
    session: &mut Session,
    engine: &Engine,
    insert: &ast::Insert,
    (target, targets, rows): (&Table, &[usize], Vec<Vec<Option<Value>>>),
    (router, partition_constraint): (&crate::family::Router, &crate::family::PartitionConstraint),
    sink: &dyn ResultSink,
) -> Result<String> {
    let count = rows.len();
    let mut builders: Vec<(String, TableBuilder)> = Vec::new();
    let mut inserted = Vec::new();
    for (number, row) in rows.into_iter().enumerate() {
        if number % VECTOR_ROWS == 0 {
            crate::control::check()?;
        }
        let full = full_row(&target.schema, &target.constraints, targets, row)?;
        partition_constraint.check(&full)?;
        let key = router.route(&full)?;
        let position = match builders.iter().position(|(k, _)| k == key) {
            Some(position) => position,
            None => {
                let base = session.take_for_write(engine, key)?.ok_or_else(|| EngineError::UnknownTable(key.into()))?;
                builders.push((key.to_string(), TableBuilder::from_version(Arc::clone(engine.runtime().pool()), base)));
                builders.len() - 1
            }
        };
        builders[position].1.push_row(&full)?;
        if insert.returning.is_some() {
            inserted.push(full);
        }
    }
    if let Some(items) = &insert.returning {
        returning(engine, target, &target.name, items, inserted, sink)?;
    }
    for (key, builder) in builders {
        session.write(&key, Some(builder.finish()));
    }
    Ok(format!("INSERT 0 {count}"))
}

/// A row in table order: given values converted to the column types, defaults elsewhere.
fn full_row(
    schema: &[ColumnDef],
    constraints: &Constraints,
    targets: &[usize],
    row: Vec<Option<Value>>,
) -> Result<Vec<Value>> {
    let mut full: Vec<Value> = constraints.defaults.iter().map(|d| d.clone().unwrap_or(Value::Null)).collect();
    for (value, &column) in row.into_iter().zip(targets) {
        // `None` is the DEFAULT keyword: the default stays.
        if let Some(value) = value {
            full[column] = crate::copy::coerce_value(value, schema[column].data_type)?;
        }
    }
    Ok(full)
}

fn target_columns(schema: &[ColumnDef], columns: &[ast::ObjectName]) -> Result<Vec<usize>> {
    if columns.is_empty() {
        return Ok((0..schema.len()).collect());
    }
    let mut targets = Vec::with_capacity(columns.len());
    for column in columns {
        let name = object_name(column)?;
        let index = schema
            .iter()
            .position(|d| d.name == name)
            .ok_or_else(|| EngineError::UnknownColumn(format!("\"{name}\" does not exist")))?;
        if targets.contains(&index) {
            return Err(EngineError::Syntax(format!("column \"{name}\" specified more than once")));
        }
        targets.push(index);
    }
    Ok(targets)
}

/// VALUES rows as constants; `None` marks DEFAULT.
fn values_rows(
    rows: &[ast::Parens<Vec<ast::Expr>>],
    targets: &[usize],
    schema: &[ColumnDef],
) -> Result<Vec<Vec<Option<Value>>>> {
    let scope = Scope::default();
    let binder = ExprBinder::new(&scope);
    rows.iter()
        .map(|row| {
            if row.content.len() > targets.len() {
                return Err(EngineError::Syntax("INSERT has more expressions than target columns".into()));
            }
            if row.content.len() < targets.len() {
                return Err(EngineError::Syntax("INSERT has more target columns than expressions".into()));
            }
            row.content
                .iter()
                .zip(targets)
                .map(|(expr, &column)| {
                    if is_default_keyword(expr) {
                        return Ok(None);
                    }
                    evaluate_constant(&cast_expr(binder.bind(expr)?, schema[column].data_type)?).map(Some)
                })
                .collect()
        })
        .collect()
}

fn is_default_keyword(expr: &ast::Expr) -> bool {
    matches!(expr, ast::Expr::Identifier(ident) if ident.quote_style.is_none() && ident.value.eq_ignore_ascii_case("default"))
}

/// The storage key and the alias of the one table UPDATE or DELETE names (refused when it
/// has descendants; see [`family_members`] for the statements that handle them).
fn single_table(session: &mut Session, engine: &Engine, relation: &ast::TableFactor) -> Result<(String, String)> {
    let (key, alias, only) = named_table(session, engine, relation)?;
    let catalog = session.catalog(engine);
    if let Some(target) = catalog.find(&key) {
        crate::family::check_single_target(&catalog, &key, &target, only)?;
    }
    Ok((key, alias))
}

/// The storage key, alias and ONLY mark of the one table UPDATE or DELETE names.
fn named_table(session: &mut Session, engine: &Engine, relation: &ast::TableFactor) -> Result<(String, String, bool)> {
    let ast::TableFactor::Table { name, alias, args: None, with_hints, .. } = relation else {
        return Err(EngineError::unsupported("UPDATE/DELETE of anything but a plain table"));
    };
    if !with_hints.is_empty() {
        return Err(EngineError::unsupported("table hints"));
    }
    let table = user_table_name(name)?;
    let alias = alias.as_ref().map_or_else(|| table.clone(), |a| identifier(&a.name));
    let key = crate::ddl::storage_key(session, engine, &table);
    if let Some(target) = session.catalog(engine).find(&key) {
        crate::view::check_not_view(&target, "UPDATE or DELETE")?;
    }
    Ok((key, alias, crate::ddl::is_only(name)))
}

/// The tables a plain UPDATE or DELETE of `key` changes: it and, without ONLY, its
/// descendants (partitioned ones hold no rows), each with the order to read its columns in:
/// the target's columns (by name) first, so expressions bound over the target read them,
/// then its own.
fn family_members(session: &mut Session, engine: &Engine, key: &str, only: bool) -> Result<Vec<(String, Vec<usize>)>> {
    let catalog = session.catalog(engine);
    let target = catalog.get(key)?;
    let mut members = vec![(key.to_string(), (0..target.schema.len()).collect())];
    if only {
        return Ok(members);
    }
    for (member_key, member) in crate::family::descendants(&catalog, key) {
        let mut order: Vec<usize> = Vec::with_capacity(member.schema.len());
        for column in &target.schema {
            let position = member.column_index(&column.name).ok_or_else(|| {
                EngineError::Runtime(format!("\"{}\" lacks its parent's column \"{}\"", member.name, column.name))
            })?;
            order.push(position);
        }
        let own: Vec<usize> = (0..member.schema.len()).filter(|c| !order.contains(c)).collect();
        order.extend(own);
        members.push((member_key, order));
    }
    Ok(members)
}

/// A row read in `order` (see [`family_members`]) back in its table's column order.
fn in_table_order(order: &[usize], read: Vec<Value>) -> Vec<Value> {
    let mut row = vec![Value::Null; read.len()];
    for (value, &column) in read.into_iter().zip(order) {
        row[column] = value;
    }
    row
}

fn table_scope(alias: &str, schema: &[ColumnDef]) -> Scope {
    let mut scope = Scope::default();
    scope.add(alias, schema.iter().map(|c| (c.name.clone(), c.data_type)).collect());
    scope
}

/// UPDATE t [AS a] SET c = expr, … [WHERE …] [RETURNING …].
pub fn update(session: &mut Session, engine: &Engine, update: &ast::Update, sink: &dyn ResultSink) -> Result<String> {
    if !update.table.joins.is_empty() || update.limit.is_some() || !update.order_by.is_empty() {
        return Err(EngineError::unsupported("UPDATE of a join, ORDER BY or LIMIT"));
    }
    if let Some(ast::UpdateTableFromKind::AfterSet(items) | ast::UpdateTableFromKind::BeforeSet(items)) = &update.from {
        let (name, alias) = single_table(session, engine, &update.table.relation)?;
        return update_from(session, engine, update, (&name, &alias), items);
    }
    let (name, alias, only) = named_table(session, engine, &update.table.relation)?;
    if session.catalog(engine).find(&name).is_some_and(|t| crate::family::is_partitioned(&t)) {
        // A changed partition key would move rows between partitions.
        return Err(EngineError::unsupported(format!("UPDATE on partitioned table \"{name}\"")));
    }
    let members = family_members(session, engine, &name, only)?;
    let base = session.catalog(engine).get(&name)?;
    let scope = table_scope(&alias, &base.schema);
    let binder = ExprBinder::new(&scope);
    let predicate = update.selection.as_ref().map(|e| binder.bind(e)).transpose()?;
    let mut assignments: Vec<(usize, Expr)> = Vec::new();
    for assignment in &update.assignments {
        let ast::AssignmentTarget::ColumnName(column) = &assignment.target else {
            return Err(EngineError::unsupported("UPDATE of a column tuple"));
        };
        let column_name = object_name(column)?;
        let index = base.column_index(&column_name).ok_or_else(|| {
            EngineError::UnknownColumn(format!("\"{column_name}\" of relation \"{}\" does not exist", base.name))
        })?;
        if assignments.iter().any(|(c, _)| *c == index) {
            return Err(EngineError::Syntax(format!("multiple assignments to same column \"{column_name}\"")));
        }
        let value = if is_default_keyword(&assignment.value) {
            Expr::literal(base.constraints.defaults[index].clone().unwrap_or(Value::Null), base.schema[index].data_type)
        } else {
            cast_expr(binder.bind(&assignment.value)?, base.schema[index].data_type)?
        };
        assignments.push((index, value));
    }
    let width = base.schema.len();
    let mut returned = Vec::new();
    for (key, order) in members {
        let partition_constraint = crate::family::PartitionConstraint::of_key(&session.catalog(engine), &key);
        let member = session.take_for_write(engine, &key)?.ok_or_else(|| EngineError::UnknownTable(key.clone()))?;
        let rewrite = |table: &Table, chunk: usize| -> Result<Rewritten> {
            let mut kept = Vec::new();
            let mut changed = Vec::new();
            let mut any = false;
            for_each_slice(table, chunk, &order, |batch| {
                let matched = matching_rows(predicate.as_ref(), &batch)?;
                let new_values = assignments.iter().map(|(_, e)| evaluate(e, &batch)).collect::<Result<Vec<_>>>()?;
                for (row, &hit) in matched.iter().enumerate() {
                    let mut values = batch.row(row);
                    if hit {
                        any = true;
                        for ((column, _), vector) in assignments.iter().zip(&new_values) {
                            values[*column] = vector.value(row);
                        }
                        changed.push(values.clone());
                    }
                    kept.push(in_table_order(&order, values));
                }
                Ok(())
            })?;
            Ok(any.then_some((kept, changed)))
        };
        let (table, affected) = rewrite_table(engine, member, &rewrite)?;
        for read in affected {
            partition_constraint.check(&in_table_order(&order, read.clone()))?;
            returned.push(read[..width].to_vec());
        }
        session.write(&key, Some(table));
    }
    if let Some(items) = &update.returning {
        returning(engine, &base, &alias, items, returned.clone(), sink)?;
    }
    Ok(format!("UPDATE {}", returned.len()))
}

/// DELETE FROM t [AS a] [WHERE …] [RETURNING …].
pub fn delete(session: &mut Session, engine: &Engine, delete: &ast::Delete, sink: &dyn ResultSink) -> Result<String> {
    let (ast::FromTable::WithFromKeyword(from) | ast::FromTable::WithoutKeyword(from)) = &delete.from;
    if from.len() != 1 || !from[0].joins.is_empty() || !delete.tables.is_empty() {
        return Err(EngineError::unsupported("DELETE of several tables"));
    }
    if delete.limit.is_some() || !delete.order_by.is_empty() {
        return Err(EngineError::unsupported("DELETE … ORDER BY or LIMIT"));
    }
    if let Some(items) = &delete.using {
        let (name, alias) = single_table(session, engine, &from[0].relation)?;
        return delete_using(session, engine, delete, (&name, &alias), &from[0].relation, items);
    }
    let (name, alias, only) = named_table(session, engine, &from[0].relation)?;
    let members = family_members(session, engine, &name, only)?;
    let base = session.catalog(engine).get(&name)?;
    let scope = table_scope(&alias, &base.schema);
    let predicate = delete.selection.as_ref().map(|e| ExprBinder::new(&scope).bind(e)).transpose()?;
    let width = base.schema.len();
    let mut returned = Vec::new();
    for (key, order) in members {
        let member = session.take_for_write(engine, &key)?.ok_or_else(|| EngineError::UnknownTable(key.clone()))?;
        let rewrite = |table: &Table, chunk: usize| -> Result<Rewritten> {
            let mut kept = Vec::new();
            let mut removed = Vec::new();
            for_each_slice(table, chunk, &order, |batch| {
                for (row, hit) in matching_rows(predicate.as_ref(), &batch)?.into_iter().enumerate() {
                    if hit {
                        removed.push(batch.row(row));
                    } else {
                        kept.push(in_table_order(&order, batch.row(row)));
                    }
                }
                Ok(())
            })?;
            Ok((!removed.is_empty()).then_some((kept, removed)))
        };
        let (table, affected) = rewrite_table(engine, member, &rewrite)?;
        returned.extend(affected.into_iter().map(|read| read[..width].to_vec()));
        session.write(&key, Some(table));
    }
    if let Some(items) = &delete.returning {
        returning(engine, &base, &alias, items, returned.clone(), sink)?;
    }
    Ok(format!("DELETE {}", returned.len()))
}

/// The key of a whole row: rows with equal values behave alike in any condition over them.
fn row_key(row: &[Value]) -> Vec<ValueKey> {
    row.iter().map(Value::key).collect()
}

/// UPDATE … FROM / DELETE … USING: `SELECT <target row>, <values> FROM <target>, <items> WHERE
/// <selection>` under the statement's catalog, run while the target's write lock is held.
/// A target row is affected when it joins a row of the items; the rows come back whole (with
/// equal values, rows behave alike, so the row's values identify what happens to it).
fn joined_rows(
    session: &mut Session,
    engine: &Engine,
    (target, alias, schema): (&ast::TableFactor, &str, &[ColumnDef]),
    items: &[ast::TableWithJoins],
    selection: Option<&ast::Expr>,
    values: &[&ast::Expr],
) -> Result<crate::engine::QueryResult> {
    let quoted = |name: &str| ast::Ident::with_quote('"', name).to_string();
    let mut outputs: Vec<String> = schema.iter().map(|c| format!("{}.{}", quoted(alias), quoted(&c.name))).collect();
    outputs.extend(values.iter().map(|v| v.to_string()));
    let items: Vec<String> = std::iter::once(target.to_string()).chain(items.iter().map(|i| i.to_string())).collect();
    let filter = selection.map_or(String::new(), |s| format!(" WHERE {s}"));
    let sql = format!("SELECT {} FROM {}{filter}", outputs.join(", "), items.join(", "));
    let statements = Engine::parse(&sql)?;
    let [ast::Statement::Query(query)] = statements.as_slice() else {
        return Err(EngineError::Syntax(format!("cannot rewrite as a query: {sql}")));
    };
    let catalog = session.catalog(engine);
    engine.collect_query(&catalog, query)
}

/// UPDATE t SET … FROM items WHERE …: each target row joining some row of the items takes the
/// values computed over the first such join row (PostgreSQL: an unspecified one).
fn update_from(
    session: &mut Session,
    engine: &Engine,
    update: &ast::Update,
    (name, alias): (&str, &str),
    items: &[ast::TableWithJoins],
) -> Result<String> {
    if update.returning.is_some() {
        return Err(EngineError::unsupported("UPDATE … FROM … RETURNING"));
    }
    let locked = session.table_for_write(engine, name)?.ok_or_else(|| EngineError::UnknownTable(name.to_string()))?;
    let mut targets = Vec::new();
    let mut computed = Vec::new();
    for assignment in &update.assignments {
        let ast::AssignmentTarget::ColumnName(column) = &assignment.target else {
            return Err(EngineError::unsupported("UPDATE of a column tuple"));
        };
        let column_name = object_name(column)?;
        let index = locked.column_index(&column_name).ok_or_else(|| {
            EngineError::UnknownColumn(format!("\"{column_name}\" of relation \"{}\" does not exist", locked.name))
        })?;
        if targets.contains(&index) {
            return Err(EngineError::Syntax(format!("multiple assignments to same column \"{column_name}\"")));
        }
        if is_default_keyword(&assignment.value) {
            return Err(EngineError::unsupported("SET column = DEFAULT with UPDATE … FROM"));
        }
        targets.push(index);
        computed.push(&assignment.value);
    }
    let width = locked.schema.len();
    let result = joined_rows(
        session,
        engine,
        (&update.table.relation, alias, &locked.schema),
        items,
        update.selection.as_ref(),
        &computed,
    )?;
    let mut new_values: std::collections::HashMap<Vec<ValueKey>, Vec<Value>> = std::collections::HashMap::new();
    for batch in &result.batches {
        let casts = targets
            .iter()
            .enumerate()
            .map(|(i, &column)| {
                let value = Expr::Column { index: width + i, data_type: result.types[width + i] };
                evaluate(&cast_expr(value, locked.schema[column].data_type)?, batch)
            })
            .collect::<Result<Vec<_>>>()?;
        for row in 0..batch.rows {
            let values = batch.row(row);
            new_values
                .entry(row_key(&values[..width]))
                .or_insert_with(|| casts.iter().map(|vector| vector.value(row)).collect());
        }
    }
    drop(locked);
    let partition_constraint = crate::family::PartitionConstraint::of_key(&session.catalog(engine), name);
    let base = session.take_for_write(engine, name)?.ok_or_else(|| EngineError::UnknownTable(name.to_string()))?;
    let rewrite = |table: &Table, chunk: usize| -> Result<Rewritten> {
        let (mut kept, mut changed) = (Vec::new(), Vec::new());
        for_each_slice(table, chunk, &(0..table.schema.len()).collect::<Vec<_>>(), |batch| {
            for row in 0..batch.rows {
                let mut values = batch.row(row);
                if let Some(assigned) = new_values.get(&row_key(&values)) {
                    for (&column, value) in targets.iter().zip(assigned) {
                        values[column] = value.clone();
                    }
                    changed.push(values.clone());
                }
                kept.push(values);
            }
            Ok(())
        })?;
        Ok((!changed.is_empty()).then_some((kept, changed)))
    };
    let (table, affected) = rewrite_table(engine, base, &rewrite)?;
    affected.iter().try_for_each(|row| partition_constraint.check(row))?;
    session.write(name, Some(table));
    Ok(format!("UPDATE {}", affected.len()))
}

/// DELETE FROM t USING items WHERE …: the target rows joining some row of the items.
fn delete_using(
    session: &mut Session,
    engine: &Engine,
    delete: &ast::Delete,
    (name, alias): (&str, &str),
    relation: &ast::TableFactor,
    items: &[ast::TableWithJoins],
) -> Result<String> {
    if delete.returning.is_some() {
        return Err(EngineError::unsupported("DELETE … USING … RETURNING"));
    }
    let locked = session.table_for_write(engine, name)?.ok_or_else(|| EngineError::UnknownTable(name.to_string()))?;
    let result =
        joined_rows(session, engine, (relation, alias, &locked.schema), items, delete.selection.as_ref(), &[])?;
    let doomed: std::collections::HashSet<Vec<ValueKey>> = result.rows().iter().map(|row| row_key(row)).collect();
    drop(locked);
    let base = session.take_for_write(engine, name)?.ok_or_else(|| EngineError::UnknownTable(name.to_string()))?;
    let rewrite = |table: &Table, chunk: usize| -> Result<Rewritten> {
        let (mut kept, mut removed) = (Vec::new(), Vec::new());
        for_each_slice(table, chunk, &(0..table.schema.len()).collect::<Vec<_>>(), |batch| {
            for row in 0..batch.rows {
                let values = batch.row(row);
                if doomed.contains(&row_key(&values)) {
                    removed.push(values);
                } else {
                    kept.push(values);
                }
            }
            Ok(())
        })?;
        Ok((!removed.is_empty()).then_some((kept, removed)))
    };
    let (table, affected) = rewrite_table(engine, base, &rewrite)?;
    session.write(name, Some(table));
    Ok(format!("DELETE {}", affected.len()))
}

/// Chunk rewrite: `None` leaves the chunk as it is, `Some((rows to keep, rows affected))`
/// replaces it.
type ChunkRewrite<'a> = dyn Fn(&Table, usize) -> Result<Rewritten> + 'a;
/// What a chunk rewrite found: `None` (nothing to change) or (rows to keep, rows affected).
type Rewritten = Option<(Vec<Vec<Value>>, Vec<Vec<Value>>)>;

/// Applies `rewrite` to every chunk and returns the new version and the affected rows.
fn rewrite_table(engine: &Engine, base: Arc<Table>, rewrite: &ChunkRewrite<'_>) -> Result<(Table, Vec<Vec<Value>>)> {
    let mut replacements = Vec::new();
    let mut affected = Vec::new();
    for chunk in 0..base.chunks.len() {
        if let Some((kept, changed)) = rewrite(&base, chunk)? {
            affected.extend(changed);
            replacements.push((chunk, kept));
        }
    }
    let mut builder = TableBuilder::from_version(Arc::clone(engine.runtime().pool()), base);
    // Back to front, so removing an emptied chunk does not shift the ones still to rewrite.
    for (chunk, kept) in replacements.iter().rev() {
        builder.rewrite_chunk(*chunk, kept)?;
    }
    if !replacements.is_empty() {
        builder.rebuild_indexes()?;
    }
    Ok((builder.finish(), affected))
}

/// Runs `f` over the rows of one chunk, a vector at a time, its columns read in `columns`' order.
fn for_each_slice(
    table: &Table,
    chunk: usize,
    columns: &[usize],
    mut f: impl FnMut(crate::vector::Batch) -> Result<()>,
) -> Result<()> {
    let rows = table.chunks[chunk].rows;
    for start in (0..rows).step_by(VECTOR_ROWS) {
        crate::control::check()?;
        f(scan_chunk(table, chunk, columns, start, (start + VECTOR_ROWS).min(rows)))?;
    }
    Ok(())
}

/// Which rows of `batch` satisfy `predicate` (all when there is none; NULL is false).
fn matching_rows(predicate: Option<&Expr>, batch: &crate::vector::Batch) -> Result<Vec<bool>> {
    let Some(predicate) = predicate else { return Ok(vec![true; batch.rows]) };
    let result = evaluate(predicate, batch)?;
    let Data::Bool(values) = &result.data else {
        return Err(EngineError::Type("argument of WHERE must be type boolean".into()));
    };
    Ok((0..batch.rows).map(|row| values[row] && result.is_valid(row)).collect())
}

/// `SELECT <items> FROM <alias>` over `rows` shaped like `table`, streamed to `sink`.
fn returning(
    engine: &Engine,
    table: &Table,
    alias: &str,
    items: &[ast::SelectItem],
    rows: Vec<Vec<Value>>,
    sink: &dyn ResultSink,
) -> Result<()> {
    let (catalog, query) = returning_query(engine, table, alias, items, rows)?;
    let bound = engine.bind(&catalog, &query)?;
    let types = bound.plan.output_types();
    sink.start(ResultShape::Rows { names: &bound.names, types: &types, origins: &[] })?;
    crate::stream::stream_plan(&engine.executor(), &bound.plan, sink)?;
    Ok(())
}

fn returning_query(
    engine: &Engine,
    table: &Table,
    alias: &str,
    items: &[ast::SelectItem],
    rows: Vec<Vec<Value>>,
) -> Result<(Catalog, ast::Query)> {
    let pool = Arc::clone(engine.runtime().pool());
    let width = table.schema.len();
    let mut builder = TableBuilder::with_constraints(
        pool,
        alias,
        0,
        table.schema.clone(),
        Constraints::none(width),
        engine.chunk_rows(),
    );
    for row in rows {
        builder.push_row(&row)?;
    }
    let mut changes = crate::catalog::Changes::new();
    changes.insert(alias.to_string(), Some(Arc::new(builder.finish())));
    let catalog = Catalog::new(Arc::new(Default::default()), changes);
    let items: Vec<String> = items.iter().map(ToString::to_string).collect();
    let sql = format!("SELECT {} FROM \"{}\"", items.join(", "), alias.replace('"', "\"\""));
    let mut statements = Engine::parse(&sql)?;
    match statements.pop() {
        Some(ast::Statement::Query(query)) if statements.is_empty() => Ok((catalog, *query)),
        _ => Err(EngineError::Syntax("RETURNING list".into())),
    }
}

/// Output names and types of INSERT/UPDATE/DELETE … RETURNING (`None` without RETURNING).
pub fn describe_returning(
    session: &mut Session,
    engine: &Engine,
    statement: &ast::Statement,
) -> Result<Option<Description>> {
    let (name, alias, items) = match statement {
        ast::Statement::Insert(insert) => match (&insert.table, &insert.returning) {
            (ast::TableObject::TableName(name), Some(items)) => {
                let name = user_table_name(name)?;
                (name.clone(), name, items)
            }
            _ => return Ok(None),
        },
        ast::Statement::Update(update) => match &update.returning {
            Some(items) => {
                let (name, alias, _) = named_table(session, engine, &update.table.relation)?;
                (name, alias, items)
            }
            None => return Ok(None),
        },
        ast::Statement::Delete(delete) => match (&delete.from, &delete.returning) {
            (ast::FromTable::WithFromKeyword(from) | ast::FromTable::WithoutKeyword(from), Some(items))
                if from.len() == 1 =>
            {
                let (name, alias, _) = named_table(session, engine, &from[0].relation)?;
                (name, alias, items)
            }
            _ => return Ok(None),
        },
        _ => return Ok(None),
    };
    let table = session.catalog(engine).get(&name)?;
    let (catalog, query) = returning_query(engine, &table, &alias, items, Vec::new())?;
    let bound = engine.bind(&catalog, &query)?;
    let types: Vec<DataType> = bound.plan.output_types();
    Ok(Some(crate::engine::describe_columns(bound.names, &types)))
}
