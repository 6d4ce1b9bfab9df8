//! Views: CREATE [OR REPLACE] [TEMPORARY] VIEW name [(columns)] AS query, DROP VIEW, and
//! binding a view where a query reads it.
//!
//! ```text
//!   CREATE VIEW v AS q ──► bind q (checks it, gives the columns) ──► catalog entry "v":
//!                          a table with v's columns, no rows, and q kept
//!   SELECT … FROM v    ──► q bound afresh over the statement's catalog, as a subquery
//!                          named v (its columns must still be the ones CREATE VIEW saw)
//! ```
//!
//! A view lives in the catalog as a table (so transactions, temporary namespaces and locks
//! treat it as one) and is read-only here: INSERT, UPDATE, DELETE, COPY, TRUNCATE and
//! indexes refuse it. A table or view other views read cannot be dropped (2BP01) unless
//! CASCADE drops those views too, as in PostgreSQL.

use std::cell::Cell;
use std::sync::Arc;

use sqlparser::ast;

use crate::bind::identifier;
use crate::catalog::Catalog;
use crate::ddl::user_table_name;
use crate::engine::Engine;
use crate::error::{EngineError, Result};
use crate::plan::Plan;
use crate::session::Session;
use crate::storage::{ColumnDef, Constraints, Table, TableBuilder};
use crate::types::DataType;

/// A view's query, as written (names in it are resolved at each use).
#[derive(Debug)]
pub struct ViewDefinition {
    pub query: ast::Query,
}

/// How deeply views may read views: a bound on the binder's recursion (a view redefined to
/// read itself would otherwise recurse without end).
const VIEW_DEPTH_MAX: usize = 32;

thread_local! {
    static VIEW_DEPTH: Cell<usize> = const { Cell::new(0) };
}

/// CREATE [OR REPLACE] [TEMPORARY] VIEW.
pub fn create_view(session: &mut Session, engine: &Engine, create: &ast::CreateView) -> Result<String> {
    check_view_options(create)?;
    let name = user_table_name(&create.name)?;
    let key = if create.temporary { session.temp_key(&name) } else { name.clone() };
    let catalog = session.catalog(engine);
    let bound = engine.bind(&catalog, &create.query)?;
    let schema = view_columns(create, bound.names, &bound.plan.output_types())?;
    if let Some(existing) = session.table_for_write(engine, &key)? {
        if existing.view.is_none() {
            return Err(EngineError::WrongObjectType(format!("\"{name}\" is not a view")));
        }
        if !create.or_replace {
            return Err(EngineError::TableExists(name));
        }
        check_replacement(&existing.schema, &schema)?;
    }
    let pool = Arc::clone(engine.runtime().pool());
    let oid = engine.database().new_oid();
    let width = schema.len();
    let mut table =
        TableBuilder::with_constraints(pool, &name, oid, schema, Constraints::none(width), engine.chunk_rows())
            .finish();
    table.view = Some(Arc::new(ViewDefinition { query: (*create.query).clone() }));
    session.write(&key, Some(table));
    Ok("CREATE VIEW".into())
}

fn check_view_options(create: &ast::CreateView) -> Result<()> {
    let refused = [
        (create.materialized, "materialized views"),
        (create.or_alter, "CREATE OR ALTER VIEW"),
        (create.secure, "secure views"),
        (create.options != ast::CreateTableOptions::None, "view options"),
        (!create.cluster_by.is_empty(), "CLUSTER BY"),
        (create.comment.is_some(), "view comments"),
        (create.with_no_schema_binding, "WITH NO SCHEMA BINDING"),
        (create.to.is_some(), "CREATE VIEW … TO"),
        (create.params.is_some(), "view parameters"),
        (create.copy_grants, "COPY GRANTS"),
        (create.columns.iter().any(|c| c.data_type.is_some() || c.options.is_some()), "typed view columns"),
    ];
    if create.if_not_exists {
        return Err(EngineError::Syntax("CREATE VIEW … IF NOT EXISTS".into()));
    }
    match refused.iter().find(|(present, _)| *present) {
        Some((_, feature)) => Err(EngineError::unsupported(*feature)),
        None => Ok(()),
    }
}

/// The view's columns: the query's, renamed by the column list (which may name fewer).
fn view_columns(create: &ast::CreateView, mut names: Vec<String>, types: &[DataType]) -> Result<Vec<ColumnDef>> {
    if create.columns.len() > names.len() {
        return Err(EngineError::Syntax("CREATE VIEW specifies more column names than columns".into()));
    }
    for (name, column) in names.iter_mut().zip(&create.columns) {
        *name = identifier(&column.name);
    }
    for (i, name) in names.iter().enumerate() {
        if names[..i].contains(name) {
            return Err(EngineError::DuplicateColumn(format!("column \"{name}\" specified more than once")));
        }
    }
    Ok(names.into_iter().zip(types).map(|(name, &data_type)| ColumnDef { name, data_type }).collect())
}

/// CREATE OR REPLACE VIEW keeps the old columns (names and types) and may add new ones.
fn check_replacement(old: &[ColumnDef], new: &[ColumnDef]) -> Result<()> {
    if new.len() < old.len() {
        return Err(EngineError::InvalidTableDefinition("cannot drop columns from view".into()));
    }
    for (old, new) in old.iter().zip(new) {
        if old.name != new.name {
            return Err(EngineError::InvalidTableDefinition(format!(
                "cannot change name of view column \"{}\" to \"{}\"",
                old.name, new.name
            )));
        }
        if old.data_type != new.data_type {
            return Err(EngineError::InvalidTableDefinition(format!(
                "cannot change data type of view column \"{}\" from {} to {}",
                old.name,
                old.data_type.sql_name(),
                new.data_type.sql_name()
            )));
        }
    }
    Ok(())
}

/// DROP VIEW [IF EXISTS] names [CASCADE].
pub fn drop_views(
    session: &mut Session,
    engine: &Engine,
    names: &[ast::ObjectName],
    if_exists: bool,
    cascade: bool,
) -> Result<String> {
    crate::ddl::drop_relations(session, engine, names, (if_exists, cascade), true)
}

/// The views (storage key, name) whose query names `name`.
pub(crate) fn dependent_views(catalog: &Catalog, name: &str) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for (key, table) in catalog.entries() {
        let Some(view) = &table.view else { continue };
        if table.name == name {
            continue;
        }
        let statement = ast::Statement::Query(Box::new(view.query.clone()));
        if crate::catalog::named_tables(&statement).contains(name) {
            found.push((key, table.name.clone()));
        }
    }
    found
}

/// Refuses a view as the target of a statement that writes rows or storage.
pub(crate) fn check_not_view(table: &Table, statement: &str) -> Result<()> {
    match table.view {
        Some(_) => Err(EngineError::unsupported(format!("{statement} on view \"{}\"", table.name))),
        None => Ok(()),
    }
}

/// A view read by a query: its query bound over `catalog` (without the reader's CTEs or
/// columns), with the columns CREATE VIEW recorded.
pub(crate) fn bind_view(catalog: &Catalog, table: &Table, view: &ViewDefinition) -> Result<Plan> {
    let depth = VIEW_DEPTH.with(Cell::get);
    if depth >= VIEW_DEPTH_MAX {
        return Err(EngineError::InfiniteRecursion(format!(
            "infinite recursion detected in rules for relation \"{}\"",
            table.name
        )));
    }
    VIEW_DEPTH.with(|d| d.set(depth + 1));
    let bound = crate::query::QueryBinder::new(catalog).bind_query(&view.query);
    VIEW_DEPTH.with(|d| d.set(depth));
    let bound = bound?;
    let types = bound.plan.output_types();
    let expected: Vec<DataType> = table.schema.iter().map(|c| c.data_type).collect();
    if types != expected {
        return Err(EngineError::unsupported(format!(
            "view \"{}\" whose tables changed since CREATE VIEW (columns now {})",
            table.name,
            types.iter().map(|t| t.sql_name()).collect::<Vec<_>>().join(", ")
        )));
    }
    Ok(bound.plan)
}
