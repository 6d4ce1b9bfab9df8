//! Table inheritance (CREATE TABLE … INHERITS) and declarative partitioning (PARTITION BY,
//! PARTITION OF … FOR VALUES), both as families of tables.
//!
//! ```text
//!   parent p ◄── parents ── child c (p's columns first, then its own)
//!   SELECT … FROM p      ──► p's rows ∪ every descendant's rows (p's columns only)
//!   SELECT … FROM ONLY p ──► p's rows alone
//!   partitioned p: holds no rows; INSERT INTO p routes each row to the partition whose
//!                  bound holds (23514 when none does); reading p reads its partitions
//! ```
//!
//! A table records only its parents (in [`Family`], kept with its constraints); its children
//! are the tables that name it, found in the catalog. So a CREATE of a child writes the child
//! alone, and ROLLBACK of it leaves the parent as it was.
//!
//! Invariants: a partition has exactly its parent's columns, in the parent's order (so a row
//! routed to it needs no reordering); a partitioned table's own storage stays empty; the
//! bounds of a table's partitions do not overlap, and it has at most one default partition.

use std::cmp::Ordering;
use std::sync::Arc;

use sqlparser::ast;

use crate::bind::{cast_expr, identifier, ExprBinder, Scope};
use crate::catalog::Catalog;
use crate::error::{EngineError, Result};
use crate::expr::evaluate_constant;
use crate::plan::{Plan, SetOperator};
use crate::storage::{ColumnDef, Table, UniqueConstraint};
use crate::types::{compare_values, DataType, Value};

/// A table's place in an inheritance or partitioning tree.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Family {
    /// Storage keys of the parents: INHERITS order, or the one table PARTITION OF names.
    pub parents: Vec<String>,
    /// PARTITION BY: the rows live in the partitions, never in the table itself.
    pub partition_key: Option<PartitionKey>,
    /// FOR VALUES …: the rows this partition of `parents[0]` accepts.
    pub bound: Option<PartitionBound>,
}

/// PARTITION BY LIST|RANGE (columns).
#[derive(Debug, Clone, PartialEq)]
pub struct PartitionKey {
    pub strategy: Strategy,
    pub columns: Vec<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Strategy {
    List,
    Range,
}

/// The rows a partition accepts, by the values of its parent's key columns.
#[derive(Debug, Clone, PartialEq)]
pub enum PartitionBound {
    /// FOR VALUES IN (…): a list key equal to one of these (NULL matches NULL).
    List(Vec<Value>),
    /// FOR VALUES FROM (…) TO (…): lower bound included, upper excluded.
    Range { from: Vec<RangeDatum>, to: Vec<RangeDatum> },
    /// DEFAULT: the rows no other partition accepts.
    Default,
}

/// One column of a range bound.
#[derive(Debug, Clone, PartialEq)]
pub enum RangeDatum {
    MinValue,
    Value(Value),
    MaxValue,
}

/// The storage keys and tables that name `parent_key` as a parent, oldest first (the order
/// PostgreSQL reads them in).
pub fn children(catalog: &Catalog, parent_key: &str) -> Vec<(String, Arc<Table>)> {
    let mut found: Vec<(String, Arc<Table>)> = catalog
        .entries()
        .into_iter()
        .filter(|(_, table)| table.constraints.family.parents.iter().any(|p| p == parent_key))
        .collect();
    found.sort_by_key(|(_, table)| table.oid);
    found
}

/// Every table below `key`, level by level.
pub fn descendants(catalog: &Catalog, key: &str) -> Vec<(String, Arc<Table>)> {
    let mut found = children(catalog, key);
    let mut next = 0;
    while next < found.len() {
        for child in children(catalog, &found[next].0) {
            if !found.iter().any(|(k, _)| *k == child.0) {
                found.push(child);
            }
        }
        next += 1;
    }
    found
}

pub fn is_partitioned(table: &Table) -> bool {
    table.constraints.family.partition_key.is_some()
}

/// The plan reading `table` (stored under `key`) with its descendants, each read as the
/// parent's columns and all read one after another; `None` when the table alone is read
/// (ONLY, or no descendants).
pub fn family_scan(catalog: &Catalog, key: &str, table: &Arc<Table>, only: bool) -> Result<Option<Plan>> {
    if only {
        return Ok(None);
    }
    let descendants = descendants(catalog, key);
    if descendants.is_empty() {
        return Ok(None);
    }
    let mut plan = scan_as(table, table)?;
    for (_, member) in descendants.iter().filter(|(_, member)| !is_partitioned(member)) {
        let scan = scan_as(member, table)?;
        plan = Plan::SetOperation { op: SetOperator::Union, all: true, left: Box::new(plan), right: Box::new(scan) };
    }
    Ok(Some(plan))
}

/// A scan of `member` that yields `parent`'s columns (found by name; a child has them all).
fn scan_as(member: &Arc<Table>, parent: &Table) -> Result<Plan> {
    let columns = parent
        .schema
        .iter()
        .map(|column| {
            member.column_index(&column.name).ok_or_else(|| {
                EngineError::Runtime(format!("\"{}\" lacks its parent's column \"{}\"", member.name, column.name))
            })
        })
        .collect::<Result<_>>()?;
    Ok(Plan::Scan { table: Arc::clone(member), columns, filter: None })
}

/// What a new table takes from its parents.
#[derive(Default)]
pub(crate) struct Inherited {
    pub columns: Vec<ColumnDef>,
    pub not_null: Vec<bool>,
    pub defaults: Vec<Option<Value>>,
    /// A partition's copies of its parent's PRIMARY KEY and UNIQUE constraints.
    pub unique: Vec<UniqueConstraint>,
    pub notices: Vec<String>,
}

/// The columns of `parents` merged by name, in order: the first parent's, then each further
/// parent's new ones (PostgreSQL's MergeAttributes); one name twice must have one type.
pub(crate) fn inherit_from(parents: &[Arc<Table>]) -> Result<Inherited> {
    let mut inherited = Inherited::default();
    for parent in parents {
        for (index, column) in parent.schema.iter().enumerate() {
            let not_null = parent.constraints.not_null[index];
            let default = parent.constraints.defaults[index].clone();
            match inherited.columns.iter().position(|c| c.name == column.name) {
                Some(existing) => {
                    inherited
                        .notices
                        .push(format!("merging multiple inherited definitions of column \"{}\"", column.name));
                    check_same_type(&column.name, inherited.columns[existing].data_type, column.data_type)?;
                    inherited.not_null[existing] |= not_null;
                    if inherited.defaults[existing].is_none() {
                        inherited.defaults[existing] = default;
                    }
                }
                None => {
                    inherited.columns.push(column.clone());
                    inherited.not_null.push(not_null);
                    inherited.defaults.push(default);
                }
            }
        }
    }
    Ok(inherited)
}

pub(crate) fn check_same_type(column: &str, inherited: DataType, own: DataType) -> Result<()> {
    if inherited == own {
        return Ok(());
    }
    Err(EngineError::Type(format!(
        "column \"{column}\" has a type conflict (DETAIL: {} versus {})",
        inherited.sql_name(),
        own.sql_name()
    )))
}

/// A partition's columns and constraints: its parent's, with the parent's unique constraints
/// renamed after it (PostgreSQL's `<partition>_pkey`, `<partition>_<columns>_key`).
pub(crate) fn inherit_partition(name: &str, parent: &Table) -> Inherited {
    let unique = parent
        .constraints
        .unique
        .iter()
        .filter(|u| u.constraint)
        .map(|u| {
            let columns: Vec<&str> = u.columns.iter().map(|&c| parent.schema[c].name.as_str()).collect();
            let name = if u.primary { format!("{name}_pkey") } else { format!("{name}_{}_key", columns.join("_")) };
            UniqueConstraint { name, ..u.clone() }
        })
        .collect();
    Inherited {
        columns: parent.schema.clone(),
        not_null: parent.constraints.not_null.clone(),
        defaults: parent.constraints.defaults.clone(),
        unique,
        notices: Vec::new(),
    }
}

/// PARTITION BY LIST (a) | RANGE (a, b): sqlparser reads it as a call of `list` or `range`.
pub(crate) fn partition_key(expr: &ast::Expr, schema: &[ColumnDef]) -> Result<PartitionKey> {
    let ast::Expr::Function(function) = expr else {
        return Err(EngineError::Syntax(format!("PARTITION BY {expr}")));
    };
    let strategy = match crate::bind::object_name(&function.name)?.as_str() {
        "list" => Strategy::List,
        "range" => Strategy::Range,
        "hash" => return Err(EngineError::unsupported("hash partitioning")),
        other => {
            return Err(EngineError::InvalidParameterValue(format!("unrecognized partitioning strategy \"{other}\"")))
        }
    };
    let ast::FunctionArguments::List(list) = &function.args else {
        return Err(EngineError::Syntax(format!("PARTITION BY {expr}")));
    };
    let columns =
        list.args
            .iter()
            .map(|arg| {
                let ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Expr(ast::Expr::Identifier(ident))) = arg else {
                    return Err(EngineError::unsupported(format!("partition key expression {arg}")));
                };
                let name = identifier(ident);
                schema.iter().position(|c| c.name == name).ok_or_else(|| {
                    EngineError::UnknownColumn(format!("\"{name}\" named in partition key does not exist"))
                })
            })
            .collect::<Result<Vec<usize>>>()?;
    if strategy == Strategy::List && columns.len() != 1 {
        return Err(EngineError::InvalidTableDefinition(
            "cannot use \"list\" partition strategy with more than one column".into(),
        ));
    }
    Ok(PartitionKey { strategy, columns })
}

/// A constant of a bound, as the key column's type.
fn bound_value(expr: &ast::Expr, data_type: DataType) -> Result<Value> {
    let scope = Scope::default();
    let bound = cast_expr(ExprBinder::new(&scope).bind(expr)?, data_type)?;
    evaluate_constant(&bound)
}

/// FOR VALUES … of a new partition of a table partitioned by `key` over `schema`.
pub(crate) fn partition_bound(
    name: &str,
    values: &ast::ForValues,
    key: &PartitionKey,
    schema: &[ColumnDef],
) -> Result<PartitionBound> {
    let key_type = |k: usize| schema[key.columns[k]].data_type;
    match (values, key.strategy) {
        (ast::ForValues::Default, _) => Ok(PartitionBound::Default),
        (ast::ForValues::In(list), Strategy::List) => {
            let mut values = Vec::new();
            for expr in list {
                let value = bound_value(expr, key_type(0))?;
                if !values.iter().any(|v| same_list_value(v, &value)) {
                    values.push(value);
                }
            }
            Ok(PartitionBound::List(values))
        }
        (ast::ForValues::From { from, to }, Strategy::Range) => {
            if from.len() != key.columns.len() || to.len() != key.columns.len() {
                return Err(EngineError::InvalidTableDefinition(
                    "FROM and TO must specify exactly one value per partitioning column".into(),
                ));
            }
            let datums = |list: &[ast::PartitionBoundValue]| -> Result<Vec<RangeDatum>> {
                list.iter()
                    .enumerate()
                    .map(|(k, datum)| match datum {
                        ast::PartitionBoundValue::MinValue => Ok(RangeDatum::MinValue),
                        ast::PartitionBoundValue::MaxValue => Ok(RangeDatum::MaxValue),
                        ast::PartitionBoundValue::Expr(expr) => match bound_value(expr, key_type(k))? {
                            Value::Null => {
                                Err(EngineError::InvalidTableDefinition("cannot specify NULL in range bound".into()))
                            }
                            value => Ok(RangeDatum::Value(value)),
                        },
                    })
                    .collect()
            };
            let (from, to) = (datums(from)?, datums(to)?);
            if compare_datums(&from, &to) != Ordering::Less {
                return Err(EngineError::InvalidObjectDefinition(format!(
                    "empty range bound specified for partition \"{name}\""
                )));
            }
            Ok(PartitionBound::Range { from, to })
        }
        (ast::ForValues::With { .. }, _) => Err(EngineError::unsupported("hash partitioning")),
        (_, Strategy::List) => {
            Err(EngineError::InvalidTableDefinition("invalid bound specification for a list partition".into()))
        }
        (_, Strategy::Range) => {
            Err(EngineError::InvalidTableDefinition("invalid bound specification for a range partition".into()))
        }
    }
}

/// List values are equal, NULL included (a list bound may hold NULL).
fn same_list_value(a: &Value, b: &Value) -> bool {
    match (a.is_null(), b.is_null()) {
        (true, true) => true,
        (false, false) => compare_values(a, b) == Ordering::Equal,
        _ => false,
    }
}

fn datum_rank(datum: &RangeDatum) -> u8 {
    match datum {
        RangeDatum::MinValue => 0,
        RangeDatum::Value(_) => 1,
        RangeDatum::MaxValue => 2,
    }
}

/// Orders two range bounds column by column; MINVALUE and MAXVALUE end the comparison (the
/// columns after them do not matter, as in PostgreSQL).
fn compare_datums(a: &[RangeDatum], b: &[RangeDatum]) -> Ordering {
    for (x, y) in a.iter().zip(b) {
        let order = match (x, y) {
            (RangeDatum::Value(x), RangeDatum::Value(y)) => compare_values(x, y),
            _ => datum_rank(x).cmp(&datum_rank(y)),
        };
        if order != Ordering::Equal || !matches!(x, RangeDatum::Value(_)) {
            return order;
        }
    }
    Ordering::Equal
}

/// Orders a range bound against a row's key values (none NULL).
fn compare_bound_to_key(bound: &[RangeDatum], key: &[Value]) -> Ordering {
    for (datum, value) in bound.iter().zip(key) {
        let order = match datum {
            RangeDatum::MinValue => return Ordering::Less,
            RangeDatum::MaxValue => return Ordering::Greater,
            RangeDatum::Value(bound) => compare_values(bound, value),
        };
        if order != Ordering::Equal {
            return order;
        }
    }
    Ordering::Equal
}

/// Whether a (non-default) bound accepts a row whose key columns hold `key`.
fn accepts(bound: &PartitionBound, key: &[Value]) -> bool {
    match bound {
        PartitionBound::List(values) => values.iter().any(|v| same_list_value(v, &key[0])),
        PartitionBound::Range { from, to } => {
            !key.iter().any(Value::is_null)
                && compare_bound_to_key(from, key) != Ordering::Greater
                && compare_bound_to_key(to, key) == Ordering::Greater
        }
        PartitionBound::Default => false,
    }
}

/// Refuses a new partition whose bound overlaps a sibling's (42P17), or a second default.
pub(crate) fn check_no_overlap(catalog: &Catalog, parent_key: &str, name: &str, bound: &PartitionBound) -> Result<()> {
    for (_, sibling) in children(catalog, parent_key) {
        let Some(other) = &sibling.constraints.family.bound else { continue };
        let overlaps = match (bound, other) {
            (PartitionBound::Default, PartitionBound::Default) => {
                return Err(EngineError::InvalidObjectDefinition(format!(
                    "partition \"{name}\" conflicts with existing default partition \"{}\"",
                    sibling.name
                )));
            }
            (PartitionBound::List(new), PartitionBound::List(old)) => {
                new.iter().any(|v| old.iter().any(|o| same_list_value(v, o)))
            }
            (PartitionBound::Range { from, to }, PartitionBound::Range { from: old_from, to: old_to }) => {
                compare_datums(from, old_to) == Ordering::Less && compare_datums(old_from, to) == Ordering::Less
            }
            _ => false,
        };
        if overlaps {
            return Err(EngineError::InvalidObjectDefinition(format!(
                "partition \"{name}\" would overlap partition \"{}\"",
                sibling.name
            )));
        }
    }
    Ok(())
}

/// Refuses a new partition while the default partition holds rows it would accept (PostgreSQL
/// would have to move them: 23514).
pub(crate) fn check_default_rows(catalog: &Catalog, parent: (&str, &Table), bound: &PartitionBound) -> Result<()> {
    let Some(key) = &parent.1.constraints.family.partition_key else { return Ok(()) };
    let default = children(catalog, parent.0)
        .into_iter()
        .find(|(_, child)| child.constraints.family.bound == Some(PartitionBound::Default));
    let Some((default_key, default)) = default else { return Ok(()) };
    let mut members = vec![Arc::clone(&default)];
    members.extend(descendants(catalog, &default_key).into_iter().map(|(_, t)| t));
    for member in members {
        for chunk in 0..member.chunks.len() {
            for row in 0..member.chunks[chunk].rows {
                let values = member.row_values(chunk, row);
                if accepts(bound, &key_values(key, &values)) {
                    return Err(EngineError::CheckViolation(format!(
                        "updated partition constraint for default partition \"{}\" would be violated by some row",
                        default.name
                    )));
                }
            }
        }
    }
    Ok(())
}

fn key_values(key: &PartitionKey, row: &[Value]) -> Vec<Value> {
    key.columns.iter().map(|&c| row[c].clone()).collect()
}

/// Where INSERT sends the rows of a partitioned table: its partitions (and theirs) by bound.
/// Holds storage keys, not tables, so the tables can be written while it is in use.
pub(crate) struct Router {
    name: String,
    key: PartitionKey,
    partitions: Vec<RoutedPartition>,
}

struct RoutedPartition {
    key: String,
    bound: PartitionBound,
    below: Option<Router>,
}

impl Router {
    /// The router of `table` (stored under `key`), if it is partitioned.
    pub(crate) fn of(catalog: &Catalog, key: &str, table: &Table) -> Option<Router> {
        let partition_key = table.constraints.family.partition_key.clone()?;
        let partitions = children(catalog, key)
            .into_iter()
            .map(|(child_key, child)| RoutedPartition {
                bound: child.constraints.family.bound.clone().unwrap_or(PartitionBound::Default),
                below: Router::of(catalog, &child_key, &child),
                key: child_key,
            })
            .collect();
        Some(Router { name: table.name.clone(), key: partition_key, partitions })
    }

    /// The storage key of the table that stores `row` (23514 when no partition accepts it).
    pub(crate) fn route(&self, row: &[Value]) -> Result<&str> {
        let key = key_values(&self.key, row);
        let chosen = self
            .partitions
            .iter()
            .find(|p| accepts(&p.bound, &key))
            .or_else(|| self.partitions.iter().find(|p| p.bound == PartitionBound::Default));
        let Some(partition) = chosen else {
            let shown: Vec<String> = key.iter().map(|v| v.to_string()).collect();
            return Err(EngineError::CheckViolation(format!(
                "no partition of relation \"{}\" found for row (DETAIL: Partition key of the failing row contains ({}).)",
                self.name,
                shown.join(", ")
            )));
        };
        match &partition.below {
            Some(router) => router.route(row),
            None => Ok(&partition.key),
        }
    }
}

/// The bounds a row written straight into a partition must satisfy: its own and its
/// ancestors' (PostgreSQL's partition constraint).
pub(crate) struct PartitionConstraint {
    name: String,
    levels: Vec<Level>,
}

struct Level {
    key: PartitionKey,
    bound: PartitionBound,
    /// For a default partition: the bounds of its siblings, which it must not accept.
    siblings: Vec<PartitionBound>,
}

impl PartitionConstraint {
    pub(crate) fn of(catalog: &Catalog, table: &Table) -> PartitionConstraint {
        let mut levels = Vec::new();
        let mut current = (String::new(), table.constraints.family.clone());
        while let (Some(bound), Some(parent_key)) = (current.1.bound.clone(), current.1.parents.first().cloned()) {
            let Some(parent) = catalog.find(&parent_key) else { break };
            let Some(key) = parent.constraints.family.partition_key.clone() else { break };
            let siblings = children(catalog, &parent_key)
                .into_iter()
                .filter_map(|(_, sibling)| sibling.constraints.family.bound.clone())
                .filter(|b| *b != PartitionBound::Default)
                .collect();
            levels.push(Level { key, bound, siblings });
            current = (parent_key, parent.constraints.family.clone());
        }
        PartitionConstraint { name: table.name.clone(), levels }
    }

    /// The constraint of the table stored under `key` (none when there is no such table).
    pub(crate) fn of_key(catalog: &Catalog, key: &str) -> PartitionConstraint {
        match catalog.find(key) {
            Some(table) => PartitionConstraint::of(catalog, &table),
            None => PartitionConstraint { name: String::new(), levels: Vec::new() },
        }
    }

    /// Refuses a row outside the bounds (23514).
    pub(crate) fn check(&self, row: &[Value]) -> Result<()> {
        for level in &self.levels {
            let key = key_values(&level.key, row);
            let accepted = match &level.bound {
                PartitionBound::Default => !level.siblings.iter().any(|b| accepts(b, &key)),
                bound => accepts(bound, &key),
            };
            if !accepted {
                return Err(EngineError::CheckViolation(format!(
                    "new row for relation \"{}\" violates partition constraint",
                    self.name
                )));
            }
        }
        Ok(())
    }
}

/// UPDATE … FROM and DELETE … USING change one table's rows: a partitioned table (whose rows
/// are in its partitions) or, without ONLY, a table with descendants is refused rather than
/// half done.
pub(crate) fn check_single_target(catalog: &Catalog, key: &str, table: &Table, only: bool) -> Result<()> {
    if is_partitioned(table) {
        return Err(EngineError::unsupported(format!(
            "UPDATE … FROM or DELETE … USING on partitioned table \"{}\"",
            table.name
        )));
    }
    if !only && !children(catalog, key).is_empty() {
        return Err(EngineError::unsupported(format!(
            "UPDATE … FROM or DELETE … USING on \"{}\" with its inheritance children",
            table.name
        )));
    }
    Ok(())
}
