//! CREATE TABLE (with NOT NULL, DEFAULT, PRIMARY KEY and UNIQUE), CREATE TABLE AS, DROP TABLE
//! and TRUNCATE, inside the session's transaction. Constraints we do not enforce (CHECK,
//! FOREIGN KEY, generated and identity columns) refuse the whole statement with 0A000.

use std::sync::Arc;

use sqlparser::ast;

use crate::bind::{cast_expr, identifier, object_name, sql_type, ExprBinder, Scope};
use crate::engine::Engine;
use crate::error::{EngineError, Result};
use crate::expr::evaluate_constant;
use crate::session::Session;
use crate::storage::{ColumnDef, Constraints, IndexDefinition, TableBuilder, UniqueConstraint};

/// Names that resolve to the system catalogs; they cannot be created, changed or dropped.
pub fn is_system_name(name: &ast::ObjectName) -> bool {
    name.0.first().and_then(|p| p.as_ident()).is_some_and(|schema| {
        name.0.len() > 1 && ["pg_catalog", "information_schema"].contains(&schema.value.to_lowercase().as_str())
    })
}

/// The table a statement names; user tables live in schema `public` (or no schema).
pub fn user_table_name(name: &ast::ObjectName) -> Result<String> {
    if is_system_name(name) {
        return Err(EngineError::unsupported(format!("changing the system catalog ({name})")));
    }
    if name.0.len() > 1 {
        let schema = name.0[name.0.len() - 2].as_ident().map(identifier).unwrap_or_default();
        if schema != "public" {
            return Err(EngineError::unsupported(format!("schema \"{schema}\" (only public)")));
        }
    }
    object_name(name)
}

fn check_create_options(create: &ast::CreateTable) -> Result<()> {
    let refused = [
        (create.or_replace, "CREATE OR REPLACE TABLE"),
        (create.external, "CREATE EXTERNAL TABLE"),
        (create.like.is_some(), "CREATE TABLE … LIKE"),
        (create.clone.is_some(), "CREATE TABLE … CLONE"),
        (create.inherits.is_some(), "table inheritance"),
        (create.partition_by.is_some() || create.partition_of.is_some(), "partitioned tables"),
        (create.table_options != ast::CreateTableOptions::None, "table storage options"),
        (create.on_commit.is_some(), "ON COMMIT"),
        (create.comment.is_some(), "table comments"),
    ];
    match refused.iter().find(|(present, _)| *present) {
        Some((_, feature)) => Err(EngineError::unsupported(*feature)),
        None => Ok(()),
    }
}

/// The key the table `name` is stored under: the session's temporary table of that name if it
/// has one (found first, as PostgreSQL's search path puts pg_temp first), else `name`.
pub(crate) fn storage_key(session: &mut Session, engine: &Engine, name: &str) -> String {
    session.catalog(engine).key_of(name)
}

/// CREATE [TEMPORARY] TABLE [IF NOT EXISTS] name (columns, constraints) | AS query. A
/// temporary table belongs to the session and is dropped when it ends.
pub fn create_table(session: &mut Session, engine: &Engine, create: &ast::CreateTable) -> Result<String> {
    check_create_options(create)?;
    let name = user_table_name(&create.name)?;
    let key = if create.temporary { session.temp_key(&name) } else { name.clone() };
    if let Some(query) = &create.query {
        return create_table_as(session, engine, (&name, &key), create, query);
    }
    let (schema, constraints) = table_definition(&name, create)?;
    if session.table_for_write(engine, &key)?.is_some() {
        if create.if_not_exists {
            session.notice("42P07", format!("relation \"{name}\" already exists, skipping"));
            return Ok("CREATE TABLE".into());
        }
        return Err(EngineError::TableExists(name));
    }
    let oid = engine.database().new_oid();
    let pool = Arc::clone(engine.runtime().pool());
    let table = TableBuilder::with_constraints(pool, &name, oid, schema, constraints, engine.chunk_rows()).finish();
    session.write(&key, Some(table));
    Ok("CREATE TABLE".into())
}

fn create_table_as(
    session: &mut Session,
    engine: &Engine,
    (name, key): (&str, &str),
    create: &ast::CreateTable,
    query: &ast::Query,
) -> Result<String> {
    if !create.columns.is_empty() || !create.constraints.is_empty() {
        return Err(EngineError::unsupported("column definitions with CREATE TABLE AS"));
    }
    let catalog = session.catalog(engine);
    let result = engine.collect_query(&catalog, query)?;
    if session.table_for_write(engine, key)?.is_some() {
        if create.if_not_exists {
            return Ok("CREATE TABLE AS".into());
        }
        return Err(EngineError::TableExists(name.to_string()));
    }
    let schema: Vec<ColumnDef> = result
        .names
        .iter()
        .zip(&result.types)
        .map(|(name, data_type)| ColumnDef { name: name.clone(), data_type: *data_type })
        .collect();
    let pool = Arc::clone(engine.runtime().pool());
    let oid = engine.database().new_oid();
    let width = schema.len();
    let mut builder =
        TableBuilder::with_constraints(pool, name, oid, schema, Constraints::none(width), engine.chunk_rows());
    let rows = result.row_count();
    for row in result.rows() {
        builder.push_row(&row)?;
    }
    session.write(key, Some(builder.finish()));
    Ok(format!("SELECT {rows}"))
}

/// Columns and constraints of CREATE TABLE.
fn table_definition(table: &str, create: &ast::CreateTable) -> Result<(Vec<ColumnDef>, Constraints)> {
    let mut schema = Vec::new();
    for column in &create.columns {
        let column_name = identifier(&column.name);
        if schema.iter().any(|c: &ColumnDef| c.name == column_name) {
            return Err(EngineError::Syntax(format!("column \"{column_name}\" specified more than once")));
        }
        schema.push(ColumnDef { name: column_name, data_type: sql_type(&column.data_type)? });
    }
    let mut constraints = Constraints::none(schema.len());
    for (index, column) in create.columns.iter().enumerate() {
        for option in &column.options {
            column_option(table, &schema, index, &option.option, &mut constraints)?;
        }
    }
    for constraint in &create.constraints {
        table_constraint(table, &schema, constraint, &mut constraints)?;
    }
    if constraints.unique.iter().filter(|u| u.primary).count() > 1 {
        return Err(EngineError::Syntax(format!("multiple primary keys for table \"{table}\" are not allowed")));
    }
    Ok((schema, constraints))
}

fn column_option(
    table: &str,
    schema: &[ColumnDef],
    index: usize,
    option: &ast::ColumnOption,
    constraints: &mut Constraints,
) -> Result<()> {
    let column = &schema[index];
    match option {
        ast::ColumnOption::Null => constraints.not_null[index] = false,
        ast::ColumnOption::NotNull => constraints.not_null[index] = true,
        ast::ColumnOption::Default(expr) => {
            let scope = Scope::default();
            let bound = cast_expr(ExprBinder::new(&scope).bind(expr)?, column.data_type)?;
            constraints.defaults[index] = Some(
                evaluate_constant(&bound)
                    .map_err(|_| EngineError::unsupported(format!("DEFAULT {expr} (only constant defaults)")))?,
            );
        }
        ast::ColumnOption::PrimaryKey(_) => {
            constraints.not_null[index] = true;
            add_unique(constraints, format!("{table}_pkey"), vec![index], true);
        }
        ast::ColumnOption::Unique(_) => {
            add_unique(constraints, format!("{table}_{}_key", column.name), vec![index], false);
        }
        other => return Err(EngineError::unsupported(format!("column constraint {other}"))),
    }
    Ok(())
}

fn table_constraint(
    table: &str,
    schema: &[ColumnDef],
    constraint: &ast::TableConstraint,
    constraints: &mut Constraints,
) -> Result<()> {
    let columns = |list: &[ast::IndexColumn]| -> Result<Vec<usize>> {
        list.iter()
            .map(|c| {
                let ast::Expr::Identifier(ident) = &c.column.expr else {
                    return Err(EngineError::unsupported(format!("constraint on expression {}", c.column.expr)));
                };
                let name = identifier(ident);
                schema
                    .iter()
                    .position(|d| d.name == name)
                    .ok_or_else(|| EngineError::UnknownColumn(format!("\"{name}\" named in key does not exist")))
            })
            .collect()
    };
    match constraint {
        ast::TableConstraint::PrimaryKey(key) => {
            let key_columns = columns(&key.columns)?;
            key_columns.iter().for_each(|&c| constraints.not_null[c] = true);
            let name = key.name.as_ref().map_or_else(|| format!("{table}_pkey"), identifier);
            add_unique(constraints, name, key_columns, true);
        }
        ast::TableConstraint::Unique(unique) => {
            if unique.nulls_distinct == ast::NullsDistinctOption::NotDistinct {
                return Err(EngineError::unsupported("UNIQUE NULLS NOT DISTINCT"));
            }
            let key_columns = columns(&unique.columns)?;
            let default_name = || {
                let names: Vec<&str> = key_columns.iter().map(|&c| schema[c].name.as_str()).collect();
                format!("{table}_{}_key", names.join("_"))
            };
            let name = unique.name.as_ref().map_or_else(default_name, identifier);
            add_unique(constraints, name, key_columns, false);
        }
        other => return Err(EngineError::unsupported(format!("table constraint {other}"))),
    }
    Ok(())
}

fn add_unique(constraints: &mut Constraints, name: String, columns: Vec<usize>, primary: bool) {
    constraints.unique.push(UniqueConstraint { name, columns, primary, constraint: true });
}

/// DROP TABLE [IF EXISTS] names.
pub fn drop_tables(
    session: &mut Session,
    engine: &Engine,
    names: &[ast::ObjectName],
    if_exists: bool,
) -> Result<String> {
    drop_relations(session, engine, names, if_exists, false)
}

/// DROP TABLE or (`views`) DROP VIEW [IF EXISTS] names: each must be of the kind the statement
/// names (42809), and no view may read it unless it is dropped too (2BP01).
pub(crate) fn drop_relations(
    session: &mut Session,
    engine: &Engine,
    names: &[ast::ObjectName],
    if_exists: bool,
    views: bool,
) -> Result<String> {
    let (noun, tag) = if views { ("view", "DROP VIEW") } else { ("table", "DROP TABLE") };
    let dropped: Vec<String> = names.iter().map(user_table_name).collect::<Result<_>>()?;
    for name in &dropped {
        let key = storage_key(session, engine, name);
        let Some(existing) = session.table_for_drop(engine, &key)? else {
            if if_exists {
                session.notice("00000", format!("{noun} \"{name}\" does not exist, skipping"));
                continue;
            }
            return Err(EngineError::UnknownTable(name.clone()));
        };
        if existing.view.is_some() != views {
            return Err(EngineError::WrongObjectType(format!("\"{name}\" is not a {noun}")));
        }
        crate::view::check_no_dependents(&session.catalog(engine), name, &dropped)?;
        session.write(&key, None);
    }
    Ok(tag.into())
}

/// Drops the session's temporary tables (at its end), in a transaction of their own.
pub(crate) fn drop_temporary_tables(session: &mut Session, engine: &Engine) {
    let snapshot = engine.database().snapshot();
    let keys: Vec<String> = snapshot
        .tables()
        .map(|table| session.temp_key(&table.name))
        .filter(|key| snapshot.get(key).is_some())
        .collect();
    if keys.is_empty() {
        return;
    }
    session.open_internal_transaction(engine);
    for key in keys {
        // Only this session writes its temporary tables, so the lock is free.
        if session.table_for_write(engine, &key).is_ok() {
            session.write(&key, None);
        }
    }
    session.commit_internal_transaction(engine);
}

/// TRUNCATE [TABLE] names: each becomes an empty version with the same definition.
pub fn truncate(session: &mut Session, engine: &Engine, truncate: &ast::Truncate) -> Result<String> {
    if truncate.partitions.is_some() || truncate.identity.is_some() || truncate.cascade.is_some() {
        return Err(EngineError::unsupported("TRUNCATE options"));
    }
    for target in &truncate.table_names {
        let name = user_table_name(&target.name)?;
        let key = storage_key(session, engine, &name);
        let Some(table) = session.table_for_drop(engine, &key)? else {
            if truncate.if_exists {
                continue;
            }
            return Err(EngineError::UnknownTable(name));
        };
        crate::view::check_not_view(&table, "TRUNCATE")?;
        let pool = Arc::clone(engine.runtime().pool());
        let empty = TableBuilder::with_constraints(
            pool,
            &name,
            table.oid,
            table.schema.clone(),
            Constraints::clone(&table.constraints),
            table.chunk_rows,
        );
        session.write(&key, Some(empty.finish()));
    }
    Ok("TRUNCATE TABLE".into())
}

/// Unique and plain indexes a table may have (their catalog OIDs are numbered per table).
const INDEXES_PER_TABLE_MAX: usize = 63;

/// The storage key of the table that has an index or constraint called `name`, if any.
fn owner_of_index(session: &mut Session, engine: &Engine, name: &str) -> Option<String> {
    let catalog = session.catalog(engine);
    catalog.tables().into_iter().find_map(|table| {
        let found = table.constraints.unique.iter().any(|u| u.name == name)
            || table.constraints.indexes.iter().any(|i| i.name == name);
        found.then(|| catalog.key_of(&table.name))
    })
}

/// CREATE [UNIQUE] INDEX [IF NOT EXISTS] name ON t [USING btree] (columns): a unique index is
/// enforced like a UNIQUE constraint; a plain one is recorded in the catalogs.
pub fn create_index(session: &mut Session, engine: &Engine, create: &ast::CreateIndex) -> Result<String> {
    let refused = [
        (!create.include.is_empty(), "INCLUDE"),
        (create.predicate.is_some(), "partial indexes (WHERE)"),
        (create.nulls_distinct == Some(false), "NULLS NOT DISTINCT"),
        (!create.with.is_empty() || !create.index_options.is_empty(), "index storage options"),
        (
            create.using.as_ref().is_some_and(|u| !u.to_string().eq_ignore_ascii_case("btree")),
            "index methods other than btree",
        ),
    ];
    if let Some((_, feature)) = refused.iter().find(|(present, _)| *present) {
        return Err(EngineError::unsupported(*feature));
    }
    let table_name = storage_key(session, engine, &user_table_name(&create.table_name)?);
    let table =
        session.table_for_write(engine, &table_name)?.ok_or_else(|| EngineError::UnknownTable(table_name.clone()))?;
    crate::view::check_not_view(&table, "CREATE INDEX")?;
    let columns: Vec<usize> = create
        .columns
        .iter()
        .map(|c| {
            let ast::Expr::Identifier(ident) = &c.column.expr else {
                return Err(EngineError::unsupported(format!("index on expression {}", c.column.expr)));
            };
            let name = identifier(ident);
            table.column_index(&name).ok_or_else(|| EngineError::UnknownColumn(format!("\"{name}\" does not exist")))
        })
        .collect::<Result<_>>()?;
    let names: Vec<&str> = columns.iter().map(|&c| table.schema[c].name.as_str()).collect();
    let name = match &create.name {
        Some(name) => user_table_name(name)?,
        None => format!("{}_{}_idx", table.name, names.join("_")),
    };
    if owner_of_index(session, engine, &name).is_some() || session.catalog(engine).contains(&name) {
        if create.if_not_exists {
            session.notice("42P07", format!("relation \"{name}\" already exists, skipping"));
            return Ok("CREATE INDEX".into());
        }
        return Err(EngineError::TableExists(name));
    }
    if table.constraints.unique.len() + table.constraints.indexes.len() >= INDEXES_PER_TABLE_MAX {
        return Err(EngineError::LimitExceeded(format!(
            "more than {INDEXES_PER_TABLE_MAX} indexes on \"{}\"",
            table.name
        )));
    }
    let table =
        session.take_for_write(engine, &table_name)?.ok_or_else(|| EngineError::UnknownTable(table_name.clone()))?;
    let mut builder = TableBuilder::from_version(Arc::clone(engine.runtime().pool()), table);
    if create.unique {
        builder.add_unique(UniqueConstraint { name, columns, primary: false, constraint: false })?;
    } else {
        builder.add_index(IndexDefinition { name, columns });
    }
    session.write(&table_name, Some(builder.finish()));
    Ok("CREATE INDEX".into())
}

/// DROP INDEX [IF EXISTS] names (an index that backs a constraint cannot be dropped).
pub fn drop_indexes(
    session: &mut Session,
    engine: &Engine,
    names: &[ast::ObjectName],
    if_exists: bool,
) -> Result<String> {
    for name in names {
        let name = user_table_name(name)?;
        let Some(table_name) = owner_of_index(session, engine, &name) else {
            if if_exists {
                session.notice("00000", format!("index \"{name}\" does not exist, skipping"));
                continue;
            }
            return Err(EngineError::UnknownTable(name));
        };
        let table = session
            .table_for_write(engine, &table_name)?
            .ok_or_else(|| EngineError::UnknownTable(table_name.clone()))?;
        if table.constraints.unique.iter().any(|u| u.name == name && u.constraint) {
            return Err(EngineError::DependentObjects(format!(
                "cannot drop index {name} because constraint {name} on table {} requires it",
                table.name
            )));
        }
        drop(table);
        let table = session
            .take_for_write(engine, &table_name)?
            .ok_or_else(|| EngineError::UnknownTable(table_name.clone()))?;
        let mut builder = TableBuilder::from_version(Arc::clone(engine.runtime().pool()), table);
        builder.drop_index(&name);
        session.write(&table_name, Some(builder.finish()));
    }
    Ok("DROP INDEX".into())
}
