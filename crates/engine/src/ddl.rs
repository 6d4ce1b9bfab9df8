//! CREATE TABLE (with NOT NULL, DEFAULT, PRIMARY KEY and UNIQUE; INHERITS, PARTITION BY and
//! PARTITION OF, see `family`), CREATE TABLE AS, ALTER TABLE … INHERIT, DROP TABLE [CASCADE]
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

/// Whether the statement wrote ONLY before this table name (marked by `pg_syntax`).
pub fn is_only(name: &ast::ObjectName) -> bool {
    name.0.len() > 1
        && name.0.first().and_then(|p| p.as_ident()).is_some_and(|q| q.value == crate::pg_syntax::ONLY_QUALIFIER)
}

/// The name without the ONLY mark.
fn without_only(name: &ast::ObjectName) -> ast::ObjectName {
    match is_only(name) {
        true => ast::ObjectName(name.0[1..].to_vec()),
        false => name.clone(),
    }
}

/// The table a statement names; user tables live in schema `public` (or no schema).
pub fn user_table_name(name: &ast::ObjectName) -> Result<String> {
    let name = &without_only(name);
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
        (create.partition_of.is_some() && !create.columns.is_empty(), "column options of a partition"),
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
    if session.table_for_write(engine, &key)?.is_some() {
        if create.if_not_exists {
            session.notice("42P07", format!("relation \"{name}\" already exists, skipping"));
            return Ok("CREATE TABLE".into());
        }
        return Err(EngineError::TableExists(name));
    }
    let parents = parent_tables(session, engine, create)?;
    let inherited = match (&create.partition_of, parents.first()) {
        (Some(_), Some((_, parent))) => crate::family::inherit_partition(&name, parent),
        _ => crate::family::inherit_from(&parents.iter().map(|(_, t)| Arc::clone(t)).collect::<Vec<_>>())?,
    };
    let (schema, mut constraints, notices) = table_definition(&name, create, inherited)?;
    constraints.family = table_family(session, engine, (&name, create), &parents, &schema, &constraints)?;
    for notice in notices {
        session.notice("00000", notice);
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
    if create.inherits.is_some() || create.partition_by.is_some() || create.partition_of.is_some() {
        return Err(EngineError::unsupported("CREATE TABLE AS with INHERITS or partitioning"));
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

/// Columns and constraints of CREATE TABLE: the inherited columns first (an own column of the
/// same name merges into one, which must have its type), then the table's own; and the
/// notices PostgreSQL gives for merged columns.
fn table_definition(
    table: &str,
    create: &ast::CreateTable,
    inherited: crate::family::Inherited,
) -> Result<(Vec<ColumnDef>, Constraints, Vec<String>)> {
    let mut schema = inherited.columns;
    let inherited_width = schema.len();
    let mut notices = inherited.notices;
    let mut positions = Vec::new();
    for column in &create.columns {
        let column_name = identifier(&column.name);
        let data_type = sql_type(&column.data_type)?;
        match schema.iter().position(|c: &ColumnDef| c.name == column_name) {
            Some(existing) if existing < inherited_width && !positions.contains(&existing) => {
                notices.push(format!("merging column \"{column_name}\" with inherited definition"));
                crate::family::check_same_type(&column_name, schema[existing].data_type, data_type)?;
                positions.push(existing);
            }
            Some(_) => {
                return Err(EngineError::DuplicateColumn(format!("column \"{column_name}\" specified more than once")));
            }
            None => {
                positions.push(schema.len());
                schema.push(ColumnDef { name: column_name, data_type });
            }
        }
    }
    let mut constraints = Constraints::none(schema.len());
    constraints.not_null[..inherited_width].copy_from_slice(&inherited.not_null);
    constraints.defaults[..inherited_width].clone_from_slice(&inherited.defaults);
    constraints.unique = inherited.unique;
    for (column, &index) in create.columns.iter().zip(&positions) {
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
    Ok((schema, constraints, notices))
}

/// The tables INHERITS or PARTITION OF names, with their storage keys, write-locked (so no
/// one drops them while the child is created). A parent must be a table (42809), and a
/// permanent table cannot have a temporary parent (42P16).
fn parent_tables(
    session: &mut Session,
    engine: &Engine,
    create: &ast::CreateTable,
) -> Result<Vec<(String, Arc<crate::storage::Table>)>> {
    let names: Vec<&ast::ObjectName> = match (&create.partition_of, &create.inherits) {
        (Some(parent), _) => vec![parent],
        (None, Some(parents)) => parents.iter().collect(),
        (None, None) => return Ok(Vec::new()),
    };
    let mut parents: Vec<(String, Arc<crate::storage::Table>)> = Vec::new();
    for name in names {
        let parent_name = user_table_name(name)?;
        let key = storage_key(session, engine, &parent_name);
        let parent = session.table_for_write(engine, &key)?.ok_or(EngineError::UnknownTable(parent_name.clone()))?;
        if parent.view.is_some() {
            return Err(EngineError::WrongObjectType(format!("\"{parent_name}\" is not a table")));
        }
        if key.starts_with(crate::catalog::TEMP_KEY_START) && !create.temporary {
            let noun = if create.partition_of.is_some() {
                "create a permanent relation as partition of"
            } else {
                "inherit from"
            };
            return Err(EngineError::InvalidTableDefinition(format!(
                "cannot {noun} temporary relation \"{parent_name}\""
            )));
        }
        if parents.iter().any(|(k, _)| *k == key) {
            return Err(EngineError::DuplicateTable(format!(
                "relation \"{parent_name}\" would be inherited from more than once"
            )));
        }
        if create.partition_of.is_none() {
            if crate::family::is_partitioned(&parent) {
                return Err(EngineError::WrongObjectType(format!(
                    "cannot inherit from partitioned table \"{parent_name}\""
                )));
            }
            if parent.constraints.family.bound.is_some() {
                return Err(EngineError::WrongObjectType(format!("cannot inherit from partition \"{parent_name}\"")));
            }
        }
        parents.push((key, parent));
    }
    Ok(parents)
}

/// The new table's family: its parents' keys, its partition key (PARTITION BY) and its bound
/// (PARTITION OF … FOR VALUES), checked against its siblings.
fn table_family(
    session: &mut Session,
    engine: &Engine,
    (name, create): (&str, &ast::CreateTable),
    parents: &[(String, Arc<crate::storage::Table>)],
    schema: &[ColumnDef],
    constraints: &Constraints,
) -> Result<crate::family::Family> {
    let mut family =
        crate::family::Family { parents: parents.iter().map(|(k, _)| k.clone()).collect(), ..Default::default() };
    if let Some(expr) = &create.partition_by {
        if create.inherits.is_some() {
            return Err(EngineError::WrongObjectType("cannot create partitioned table as inheritance child".into()));
        }
        let key = crate::family::partition_key(expr, schema)?;
        check_unique_covers_key(name, schema, constraints, &key)?;
        family.partition_key = Some(key);
    }
    if let (Some(_), Some((parent_key, parent))) = (&create.partition_of, parents.first()) {
        let Some(key) = &parent.constraints.family.partition_key else {
            return Err(EngineError::InvalidObjectDefinition(format!("\"{}\" is not partitioned", parent.name)));
        };
        let values =
            create.for_values.as_ref().ok_or_else(|| EngineError::Syntax("PARTITION OF without FOR VALUES".into()))?;
        let bound = crate::family::partition_bound(name, values, key, schema)?;
        let catalog = session.catalog(engine);
        crate::family::check_no_overlap(&catalog, parent_key, name, &bound)?;
        crate::family::check_default_rows(&catalog, (parent_key, parent), &bound)?;
        family.bound = Some(bound);
    }
    Ok(family)
}

/// The parent `ALTER TABLE c INHERIT p` names (as `pg_syntax` rewrote it), if that is the
/// statement.
pub fn inherited_parent(alter: &ast::AlterTable) -> Option<&ast::Ident> {
    let [ast::AlterTableOperation::SetOptionsParens { options }] = alter.operations.as_slice() else { return None };
    match options.as_slice() {
        [ast::SqlOption::KeyValue { key, value: ast::Expr::Identifier(parent) }]
            if key.value == crate::pg_syntax::INHERIT_OPTION =>
        {
            Some(parent)
        }
        _ => None,
    }
}

/// ALTER TABLE c INHERIT p: c must have each of p's columns with its type, and NOT NULL where
/// p has it (42804); p must not be c, a descendant of c (42P07) or a partitioned table.
pub fn alter_inherit(session: &mut Session, engine: &Engine, alter: &ast::AlterTable) -> Result<String> {
    let parent_ident = inherited_parent(alter).ok_or_else(|| EngineError::Syntax("ALTER TABLE … INHERIT".into()))?;
    let child_name = user_table_name(&alter.name)?;
    let parent_name = identifier(parent_ident);
    let child_key = storage_key(session, engine, &child_name);
    let parent_key = storage_key(session, engine, &parent_name);
    let parent =
        session.table_for_write(engine, &parent_key)?.ok_or_else(|| EngineError::UnknownTable(parent_name.clone()))?;
    let child =
        session.table_for_write(engine, &child_key)?.ok_or_else(|| EngineError::UnknownTable(child_name.clone()))?;
    for table in [&parent, &child] {
        crate::view::check_not_view(table, "ALTER TABLE … INHERIT")?;
        if crate::family::is_partitioned(table) || table.constraints.family.bound.is_some() {
            return Err(EngineError::WrongObjectType(format!(
                "cannot change inheritance of partitioned table or partition \"{}\"",
                table.name
            )));
        }
    }
    let catalog = session.catalog(engine);
    let below_child = crate::family::descendants(&catalog, &child_key).iter().any(|(k, _)| *k == parent_key);
    if parent_key == child_key || below_child {
        return Err(EngineError::DuplicateTable(format!(
            "circular inheritance not allowed (\"{parent_name}\" is already a child of \"{child_name}\")"
        )));
    }
    if child.constraints.family.parents.contains(&parent_key) {
        return Err(EngineError::DuplicateTable(format!(
            "relation \"{parent_name}\" would be inherited from more than once"
        )));
    }
    for (index, column) in parent.schema.iter().enumerate() {
        let Some(own) = child.column_index(&column.name) else {
            return Err(EngineError::Type(format!("child table is missing column \"{}\"", column.name)));
        };
        if child.schema[own].data_type != column.data_type {
            return Err(EngineError::Type(format!(
                "child table \"{child_name}\" has different type for column \"{}\"",
                column.name
            )));
        }
        if parent.constraints.not_null[index] && !child.constraints.not_null[own] {
            return Err(EngineError::Type(format!(
                "column \"{}\" in child table must be marked NOT NULL",
                column.name
            )));
        }
    }
    drop((catalog, parent, child));
    let child = session.take_for_write(engine, &child_key)?.ok_or(EngineError::UnknownTable(child_name))?;
    let mut builder = TableBuilder::from_version(Arc::clone(engine.runtime().pool()), child);
    builder.add_parent(parent_key);
    session.write(&child_key, Some(builder.finish()));
    Ok("ALTER TABLE".into())
}

/// A unique constraint of a partitioned table holds across its partitions only when it
/// includes every key column (each partition enforces it on its own rows): PostgreSQL's rule.
fn check_unique_covers_key(
    table: &str,
    schema: &[ColumnDef],
    constraints: &Constraints,
    key: &crate::family::PartitionKey,
) -> Result<()> {
    for unique in &constraints.unique {
        if let Some(&missing) = key.columns.iter().find(|c| !unique.columns.contains(c)) {
            let kind = if unique.primary { "PRIMARY KEY" } else { "UNIQUE" };
            return Err(EngineError::unsupported(format!(
                "unique constraint on partitioned table \"{table}\" must include all partitioning columns ({kind} constraint lacks column \"{}\")",
                schema[missing].name
            )));
        }
    }
    Ok(())
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

/// DROP TABLE [IF EXISTS] names [CASCADE].
pub fn drop_tables(
    session: &mut Session,
    engine: &Engine,
    names: &[ast::ObjectName],
    if_exists: bool,
    cascade: bool,
) -> Result<String> {
    drop_relations(session, engine, names, (if_exists, cascade), false)
}

/// DROP TABLE or (`views`) DROP VIEW [IF EXISTS] names [CASCADE]: each must be of the kind
/// the statement names (42809). A partitioned table's partitions go with it; inheritance
/// children and the views that read a dropped relation go too with CASCADE, and refuse the
/// statement (2BP01) without it, unless the statement names them as well.
pub(crate) fn drop_relations(
    session: &mut Session,
    engine: &Engine,
    names: &[ast::ObjectName],
    (if_exists, cascade): (bool, bool),
    views: bool,
) -> Result<String> {
    let (noun, tag) = if views { ("view", "DROP VIEW") } else { ("table", "DROP TABLE") };
    let named: Vec<String> = names.iter().map(user_table_name).collect::<Result<_>>()?;
    let mut doomed: Vec<(String, String)> = Vec::new();
    for name in &named {
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
        if !doomed.iter().any(|(k, _)| *k == key) {
            doomed.push((key, name.clone()));
        }
    }
    let cascaded = add_dependents(session, engine, &mut doomed, &named, cascade)?;
    match cascaded.as_slice() {
        [] => {}
        [one] => session.notice("00000", format!("drop cascades to {one}")),
        many => session.notice("00000", format!("drop cascades to {} other objects", many.len())),
    }
    for (key, _) in &doomed {
        session.table_for_drop(engine, key)?;
        session.write(key, None);
    }
    Ok(tag.into())
}

/// Adds to `doomed` (storage key, name) what must be dropped with it: partitions always,
/// inheritance children and dependent views with CASCADE (returned, described for the
/// notice); without CASCADE such a dependent that the statement does not name is 2BP01.
fn add_dependents(
    session: &mut Session,
    engine: &Engine,
    doomed: &mut Vec<(String, String)>,
    named: &[String],
    cascade: bool,
) -> Result<Vec<String>> {
    let catalog = session.catalog(engine);
    let mut cascaded = Vec::new();
    let mut next = 0;
    while next < doomed.len() {
        let (key, name) = doomed[next].clone();
        let mut dependents: Vec<(String, String, &str, bool)> = crate::family::children(&catalog, &key)
            .into_iter()
            .map(|(k, child)| {
                let partition = child.constraints.family.bound.is_some();
                (k, child.name.clone(), "table", partition)
            })
            .collect();
        for (k, view) in crate::view::dependent_views(&catalog, &name) {
            dependents.push((k, view, "view", false));
        }
        for (dependent_key, dependent, kind, partition) in dependents {
            if doomed.iter().any(|(k, _)| *k == dependent_key) {
                continue;
            }
            if !partition && !named.contains(&dependent) {
                if !cascade {
                    return Err(EngineError::DependentObjects(format!(
                        "cannot drop {name} because other objects depend on it ({kind} {dependent} depends on {name})"
                    )));
                }
                cascaded.push(format!("{kind} {dependent}"));
            }
            doomed.push((dependent_key, dependent));
        }
        next += 1;
    }
    Ok(cascaded)
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
    let mut emptied: Vec<String> = Vec::new();
    for target in &truncate.table_names {
        let name = user_table_name(&target.name)?;
        let only = target.only || is_only(&target.name);
        let key = storage_key(session, engine, &name);
        let Some(table) = session.table_for_drop(engine, &key)? else {
            if truncate.if_exists {
                continue;
            }
            return Err(EngineError::UnknownTable(name));
        };
        crate::view::check_not_view(&table, "TRUNCATE")?;
        if only && crate::family::is_partitioned(&table) {
            return Err(EngineError::WrongObjectType("cannot truncate only a partitioned table".into()));
        }
        emptied.push(key.clone());
        if !only {
            let catalog = session.catalog(engine);
            emptied.extend(crate::family::descendants(&catalog, &key).into_iter().map(|(k, _)| k));
        }
    }
    emptied.dedup();
    for key in emptied {
        let Some(table) = session.table_for_drop(engine, &key)? else { continue };
        let pool = Arc::clone(engine.runtime().pool());
        let empty = TableBuilder::with_constraints(
            pool,
            &table.name,
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
