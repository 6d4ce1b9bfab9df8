//! The system catalogs as relations built from a statement's catalog view: `pg_catalog` (the
//! tables and views psql, SQLAlchemy, pandas, psycopg and DBeaver read) and
//! `information_schema` (tables, columns, schemata, constraints). Columns follow PostgreSQL 15's
//! definitions; catalogs of objects the engine does not have (triggers, policies, …) are empty.

use std::sync::Arc;

use super::value::{Datum, PgType};
use crate::catalog::Catalog;
use crate::settings::Settings;
use crate::storage::Table;
use crate::types::DataType;

/// OIDs PostgreSQL gives the built-in namespaces, the bootstrap superuser and its database.
pub const PG_CATALOG_NAMESPACE: i64 = 11;
pub const PUBLIC_NAMESPACE: i64 = 2200;
pub const INFORMATION_SCHEMA_NAMESPACE: i64 = 13_183;
pub const OWNER_OID: i64 = 10;
pub const DATABASE_OID: i64 = 16_383;
const HEAP_AM: i64 = 2;
const BTREE_AM: i64 = 403;
const DEFAULT_COLLATION: i64 = 100;

/// What a catalog query may look at.
pub struct Context<'a> {
    pub catalog: &'a Catalog,
    pub settings: &'a Settings,
    pub user: &'a str,
    pub database: &'a str,
}

/// A catalog relation: typed columns and all its rows.
pub struct Relation {
    pub columns: Vec<(String, PgType)>,
    pub rows: Vec<Vec<Datum>>,
}

impl Relation {
    fn new(columns: &[(&str, PgType)]) -> Relation {
        Relation { columns: columns.iter().map(|(n, t)| (n.to_string(), *t)).collect(), rows: Vec::new() }
    }

    fn push(&mut self, row: Vec<Datum>) {
        assert_eq!(row.len(), self.columns.len(), "a catalog row has one value per column");
        self.rows.push(row);
    }
}

fn int(v: impl Into<i64>) -> Datum {
    Datum::Int(v.into())
}

fn text(v: impl Into<String>) -> Datum {
    Datum::Text(v.into())
}

fn boolean(v: bool) -> Datum {
    Datum::Bool(v)
}

/// OID of a table's unique index `index` (0..63), or of the constraint it backs.
pub fn constraint_oid(table_oid: u32, index: usize, constraint: bool) -> i64 {
    (i64::from(table_oid) << 8) | (index as i64 + if constraint { 129 } else { 1 })
}

/// One index of a table as the catalogs show it.
pub struct IndexEntry {
    pub oid: i64,
    pub name: String,
    pub columns: Vec<usize>,
    pub unique: bool,
    pub primary: bool,
    /// The OID of the constraint the index backs (PRIMARY KEY, UNIQUE).
    pub constraint: Option<i64>,
}

/// Every index of a table: unique ones (enforced), then plain ones (OIDs from slot 64 up).
pub fn table_indexes(table: &Table) -> Vec<IndexEntry> {
    let unique = table.constraints.unique.iter().enumerate().map(|(k, u)| IndexEntry {
        oid: constraint_oid(table.oid, k, false),
        name: u.name.clone(),
        columns: u.columns.clone(),
        unique: true,
        primary: u.primary,
        constraint: u.constraint.then(|| constraint_oid(table.oid, k, true)),
    });
    let plain = table.constraints.indexes.iter().enumerate().map(|(k, i)| IndexEntry {
        oid: constraint_oid(table.oid, 64 + k, false),
        name: i.name.clone(),
        columns: i.columns.clone(),
        unique: false,
        primary: false,
        constraint: None,
    });
    unique.chain(plain).collect()
}

/// (oid, name, length, category, array oid, element oid) of the types clients look up.
const TYPES: [(i64, &str, i64, &str, i64, i64); 30] = [
    (16, "bool", 1, "B", 1000, 0),
    (17, "bytea", -1, "U", 1001, 0),
    (18, "char", 1, "S", 1002, 0),
    (19, "name", 64, "S", 1003, 18),
    (20, "int8", 8, "N", 1016, 0),
    (21, "int2", 2, "N", 1005, 0),
    (22, "int2vector", -1, "A", 1006, 21),
    (23, "int4", 4, "N", 1007, 0),
    (24, "regproc", 4, "N", 1008, 0),
    (25, "text", -1, "S", 1009, 0),
    (26, "oid", 4, "N", 1028, 0),
    (30, "oidvector", -1, "A", 1013, 26),
    (114, "json", -1, "U", 199, 0),
    (700, "float4", 4, "N", 1021, 0),
    (701, "float8", 8, "N", 1022, 0),
    (705, "unknown", -2, "X", 0, 0),
    (1000, "_bool", -1, "A", 0, 16),
    (1005, "_int2", -1, "A", 0, 21),
    (1007, "_int4", -1, "A", 0, 23),
    (1009, "_text", -1, "A", 0, 25),
    (1016, "_int8", -1, "A", 0, 20),
    (1028, "_oid", -1, "A", 0, 26),
    (1042, "bpchar", -1, "S", 1014, 0),
    (1043, "varchar", -1, "S", 1015, 0),
    (1082, "date", 4, "D", 1182, 0),
    (1114, "timestamp", 8, "D", 1115, 0),
    (1184, "timestamptz", 8, "D", 1185, 0),
    (1186, "interval", 16, "T", 1187, 0),
    (1700, "numeric", -1, "N", 1231, 0),
    (2950, "uuid", 16, "U", 2951, 0),
];

/// PostgreSQL's name of a type OID (pg_type.typname).
pub fn type_name(oid: i64) -> Option<&'static str> {
    TYPES.iter().find(|t| t.0 == oid).map(|t| t.1)
}

/// The OID of a type name (`'int4'::regtype`, SQL spellings too).
pub fn type_oid(name: &str) -> Option<i64> {
    let name = name.trim().trim_start_matches("pg_catalog.").trim_matches('"').to_lowercase();
    let canonical = match name.as_str() {
        "boolean" => "bool",
        "smallint" => "int2",
        "integer" | "int" => "int4",
        "bigint" => "int8",
        "real" => "float4",
        "double precision" => "float8",
        "character varying" => "varchar",
        "character" => "bpchar",
        "decimal" => "numeric",
        "timestamp without time zone" => "timestamp",
        "timestamp with time zone" => "timestamptz",
        other => other,
    };
    TYPES.iter().find(|t| t.1 == canonical).map(|t| t.0)
}

/// `format_type(oid, typmod)`: the SQL spelling psql and SQLAlchemy show.
pub fn format_type(oid: i64, typmod: i64) -> String {
    match oid {
        16 => "boolean".into(),
        20 => "bigint".into(),
        21 => "smallint".into(),
        23 => "integer".into(),
        700 => "real".into(),
        701 => "double precision".into(),
        1043 if typmod > 4 => format!("character varying({})", typmod - 4),
        1043 => "character varying".into(),
        1042 if typmod > 4 => format!("character({})", typmod - 4),
        1700 if typmod >= 4 => format!("numeric({},{})", (typmod - 4) >> 16, (typmod - 4) & 0xffff),
        1082 => "date".into(),
        1114 => "timestamp without time zone".into(),
        1184 => "timestamp with time zone".into(),
        other => type_name(other).map_or_else(|| "???".into(), str::to_string),
    }
}

fn column_typmod(data_type: DataType) -> i64 {
    i64::from(crate::server::encode::type_modifier(data_type))
}

fn column_length(data_type: DataType) -> i64 {
    match data_type {
        DataType::Bool => 1,
        DataType::Int16 => 2,
        DataType::Int32 | DataType::Date | DataType::Float32 => 4,
        DataType::Int64 | DataType::Float64 | DataType::Timestamp | DataType::TimestampTz => 8,
        DataType::Interval => 16,
        _ => -1,
    }
}

/// The relation named `schema.name` (or `name` on the search path), if it is a catalog.
pub fn relation(schema: Option<&str>, name: &str, context: &Context<'_>) -> Option<Relation> {
    match schema {
        Some("information_schema") => information_schema(name, context),
        Some("pg_catalog") | None => pg_catalog(name, context),
        Some(_) => None,
    }
}

fn pg_catalog(name: &str, context: &Context<'_>) -> Option<Relation> {
    let tables = context.catalog.tables();
    Some(match name {
        "pg_namespace" => namespaces(context),
        "pg_class" => classes(&tables),
        "pg_attribute" => attributes(&tables),
        "pg_type" => types(),
        "pg_index" => indexes(&tables),
        "pg_constraint" => constraints(&tables),
        "pg_attrdef" => defaults(&tables),
        "pg_database" => databases(context),
        "pg_roles" | "pg_authid" | "pg_user" => roles(name, context),
        "pg_settings" => settings(context),
        "pg_am" => access_methods(),
        "pg_opclass" => operator_classes(),
        "pg_tablespace" => tablespaces(),
        "pg_collation" => collations(),
        "pg_tables" => pg_tables(&tables, context),
        "pg_indexes" => pg_indexes(&tables),
        "pg_proc" => Relation::new(&[
            ("oid", PgType::Oid),
            ("proname", PgType::Name),
            ("pronamespace", PgType::Oid),
            ("proowner", PgType::Oid),
            ("prokind", PgType::Char),
            ("proretset", PgType::Bool),
            ("prorettype", PgType::Oid),
            ("pronargs", PgType::Int2),
            ("proargtypes", PgType::OidVector),
            ("proargnames", PgType::TextArray),
            ("prosrc", PgType::Text),
        ]),
        "pg_description" | "pg_shdescription" => Relation::new(&[
            ("objoid", PgType::Oid),
            ("classoid", PgType::Oid),
            ("objsubid", PgType::Int4),
            ("description", PgType::Text),
        ]),
        "pg_inherits" => Relation::new(&[
            ("inhrelid", PgType::Oid),
            ("inhparent", PgType::Oid),
            ("inhseqno", PgType::Int4),
            ("inhdetachpending", PgType::Bool),
        ]),
        "pg_trigger" => Relation::new(&[
            ("oid", PgType::Oid),
            ("tgrelid", PgType::Oid),
            ("tgname", PgType::Name),
            ("tgisinternal", PgType::Bool),
            ("tgenabled", PgType::Char),
        ]),
        "pg_policy" => Relation::new(&[
            ("oid", PgType::Oid),
            ("polname", PgType::Name),
            ("polrelid", PgType::Oid),
            ("polcmd", PgType::Char),
            ("polpermissive", PgType::Bool),
            ("polroles", PgType::OidArray),
            ("polqual", PgType::Text),
            ("polwithcheck", PgType::Text),
        ]),
        "pg_views" | "pg_matviews" => Relation::new(&[
            ("schemaname", PgType::Name),
            ("viewname", PgType::Name),
            ("viewowner", PgType::Name),
            ("definition", PgType::Text),
        ]),
        "pg_sequence" => Relation::new(&[
            ("seqrelid", PgType::Oid),
            ("seqtypid", PgType::Oid),
            ("seqstart", PgType::Int8),
            ("seqincrement", PgType::Int8),
            ("seqmax", PgType::Int8),
            ("seqmin", PgType::Int8),
            ("seqcache", PgType::Int8),
            ("seqcycle", PgType::Bool),
        ]),
        "pg_extension" => Relation::new(&[
            ("oid", PgType::Oid),
            ("extname", PgType::Name),
            ("extowner", PgType::Oid),
            ("extnamespace", PgType::Oid),
            ("extversion", PgType::Text),
        ]),
        "pg_enum" => Relation::new(&[
            ("oid", PgType::Oid),
            ("enumtypid", PgType::Oid),
            ("enumsortorder", PgType::Float4),
            ("enumlabel", PgType::Name),
        ]),
        "pg_depend" => Relation::new(&[
            ("classid", PgType::Oid),
            ("objid", PgType::Oid),
            ("objsubid", PgType::Int4),
            ("refclassid", PgType::Oid),
            ("refobjid", PgType::Oid),
            ("refobjsubid", PgType::Int4),
            ("deptype", PgType::Char),
        ]),
        "pg_statistic_ext" => Relation::new(&[
            ("oid", PgType::Oid),
            ("stxrelid", PgType::Oid),
            ("stxname", PgType::Name),
            ("stxnamespace", PgType::Oid),
            ("stxowner", PgType::Oid),
            ("stxstattarget", PgType::Int4),
            ("stxkeys", PgType::Int2Vector),
            ("stxkind", PgType::CharArray),
            ("stxexprs", PgType::Text),
        ]),
        "pg_publication" => Relation::new(&[
            ("oid", PgType::Oid),
            ("pubname", PgType::Name),
            ("pubowner", PgType::Oid),
            ("puballtables", PgType::Bool),
            ("pubinsert", PgType::Bool),
            ("pubupdate", PgType::Bool),
            ("pubdelete", PgType::Bool),
            ("pubtruncate", PgType::Bool),
            ("pubviaroot", PgType::Bool),
        ]),
        "pg_publication_rel" => Relation::new(&[
            ("oid", PgType::Oid),
            ("prpubid", PgType::Oid),
            ("prrelid", PgType::Oid),
            ("prqual", PgType::Text),
            ("prattrs", PgType::Int2Vector),
        ]),
        "pg_publication_namespace" => {
            Relation::new(&[("oid", PgType::Oid), ("pnpubid", PgType::Oid), ("pnnspid", PgType::Oid)])
        }
        "pg_partitioned_table" => Relation::new(&[("partrelid", PgType::Oid), ("partstrat", PgType::Char)]),
        "pg_foreign_table" => Relation::new(&[("ftrelid", PgType::Oid), ("ftserver", PgType::Oid)]),
        "pg_rewrite" => Relation::new(&[("oid", PgType::Oid), ("rulename", PgType::Name), ("ev_class", PgType::Oid)]),
        "pg_event_trigger" => Relation::new(&[("oid", PgType::Oid), ("evtname", PgType::Name)]),
        "pg_auth_members" => {
            Relation::new(&[("roleid", PgType::Oid), ("member", PgType::Oid), ("grantor", PgType::Oid)])
        }
        _ => return None,
    })
}

fn namespaces(context: &Context<'_>) -> Relation {
    let mut relation = Relation::new(&[
        ("oid", PgType::Oid),
        ("nspname", PgType::Name),
        ("nspowner", PgType::Oid),
        ("nspacl", PgType::TextArray),
    ]);
    let _ = context;
    for (oid, name) in [
        (PG_CATALOG_NAMESPACE, "pg_catalog"),
        (PUBLIC_NAMESPACE, "public"),
        (INFORMATION_SCHEMA_NAMESPACE, "information_schema"),
    ] {
        relation.push(vec![int(oid), text(name), int(OWNER_OID), Datum::Null]);
    }
    relation
}

fn classes(tables: &[Arc<Table>]) -> Relation {
    let mut relation = Relation::new(&[
        ("oid", PgType::Oid),
        ("relname", PgType::Name),
        ("relnamespace", PgType::Oid),
        ("reltype", PgType::Oid),
        ("reloftype", PgType::Oid),
        ("relowner", PgType::Oid),
        ("relam", PgType::Oid),
        ("relfilenode", PgType::Oid),
        ("reltablespace", PgType::Oid),
        ("relpages", PgType::Int4),
        ("reltuples", PgType::Float4),
        ("relallvisible", PgType::Int4),
        ("reltoastrelid", PgType::Oid),
        ("relhasindex", PgType::Bool),
        ("relisshared", PgType::Bool),
        ("relpersistence", PgType::Char),
        ("relkind", PgType::Char),
        ("relnatts", PgType::Int2),
        ("relchecks", PgType::Int2),
        ("relhasrules", PgType::Bool),
        ("relhastriggers", PgType::Bool),
        ("relhassubclass", PgType::Bool),
        ("relrowsecurity", PgType::Bool),
        ("relforcerowsecurity", PgType::Bool),
        ("relispopulated", PgType::Bool),
        ("relreplident", PgType::Char),
        ("relispartition", PgType::Bool),
        ("relrewrite", PgType::Oid),
        ("relfrozenxid", PgType::Int4),
        ("relminmxid", PgType::Int4),
        ("relacl", PgType::TextArray),
        ("reloptions", PgType::TextArray),
        ("relpartbound", PgType::Text),
    ]);
    let row = |oid: i64, name: &str, kind: &str, am: i64, tuples: f64, attributes: usize, has_index: bool| {
        vec![
            int(oid),
            text(name),
            int(PUBLIC_NAMESPACE),
            int(0),
            int(0),
            int(OWNER_OID),
            int(am),
            int(oid),
            int(0),
            int(0),
            Datum::Float(tuples),
            int(0),
            int(0),
            boolean(has_index),
            boolean(false),
            text("p"),
            text(kind),
            int(attributes as i64),
            int(0),
            boolean(false),
            boolean(false),
            boolean(false),
            boolean(false),
            boolean(false),
            boolean(true),
            text("d"),
            boolean(false),
            int(0),
            int(0),
            int(0),
            Datum::Null,
            Datum::Null,
            Datum::Null,
        ]
    };
    for table in tables {
        let indexes = table_indexes(table);
        relation.push(row(
            i64::from(table.oid),
            &table.name,
            "r",
            HEAP_AM,
            table.rows() as f64,
            table.schema.len(),
            !indexes.is_empty(),
        ));
        for index in indexes {
            relation.push(row(index.oid, &index.name, "i", BTREE_AM, table.rows() as f64, index.columns.len(), false));
        }
    }
    relation
}

fn attributes(tables: &[Arc<Table>]) -> Relation {
    let mut relation = Relation::new(&[
        ("attrelid", PgType::Oid),
        ("attname", PgType::Name),
        ("atttypid", PgType::Oid),
        ("attstattarget", PgType::Int4),
        ("attlen", PgType::Int2),
        ("attnum", PgType::Int2),
        ("attndims", PgType::Int4),
        ("attcacheoff", PgType::Int4),
        ("atttypmod", PgType::Int4),
        ("attbyval", PgType::Bool),
        ("attalign", PgType::Char),
        ("attstorage", PgType::Char),
        ("attcompression", PgType::Char),
        ("attnotnull", PgType::Bool),
        ("atthasdef", PgType::Bool),
        ("atthasmissing", PgType::Bool),
        ("attidentity", PgType::Char),
        ("attgenerated", PgType::Char),
        ("attisdropped", PgType::Bool),
        ("attislocal", PgType::Bool),
        ("attinhcount", PgType::Int4),
        ("attcollation", PgType::Oid),
        ("attacl", PgType::TextArray),
        ("attoptions", PgType::TextArray),
        ("attfdwoptions", PgType::TextArray),
    ]);
    for table in tables {
        let mut add = |relid: i64, number: usize, column: usize| {
            let definition = &table.schema[column];
            let data_type = definition.data_type;
            let length = column_length(data_type);
            relation.push(vec![
                int(relid),
                text(&definition.name),
                int(i64::from(data_type.pg_oid())),
                int(-1),
                int(length),
                int(number as i64),
                int(0),
                int(-1),
                int(column_typmod(data_type)),
                boolean(length > 0),
                text(if length == 8 {
                    "d"
                } else if length == 1 {
                    "c"
                } else {
                    "i"
                }),
                text(if length > 0 { "p" } else { "x" }),
                text(""),
                boolean(table.constraints.not_null[column]),
                boolean(table.constraints.defaults[column].is_some()),
                boolean(false),
                text(""),
                text(""),
                boolean(false),
                boolean(true),
                int(0),
                int(if data_type == DataType::Text { DEFAULT_COLLATION } else { 0 }),
                Datum::Null,
                Datum::Null,
                Datum::Null,
            ]);
        };
        for column in 0..table.schema.len() {
            add(i64::from(table.oid), column + 1, column);
        }
        for index in table_indexes(table) {
            for (position, &column) in index.columns.iter().enumerate() {
                add(index.oid, position + 1, column);
            }
        }
    }
    relation
}

fn types() -> Relation {
    let mut relation = Relation::new(&[
        ("oid", PgType::Oid),
        ("typname", PgType::Name),
        ("typnamespace", PgType::Oid),
        ("typowner", PgType::Oid),
        ("typlen", PgType::Int2),
        ("typbyval", PgType::Bool),
        ("typtype", PgType::Char),
        ("typcategory", PgType::Char),
        ("typispreferred", PgType::Bool),
        ("typisdefined", PgType::Bool),
        ("typdelim", PgType::Char),
        ("typrelid", PgType::Oid),
        ("typelem", PgType::Oid),
        ("typarray", PgType::Oid),
        ("typinput", PgType::Text),
        ("typoutput", PgType::Text),
        ("typreceive", PgType::Text),
        ("typsend", PgType::Text),
        ("typalign", PgType::Char),
        ("typstorage", PgType::Char),
        ("typnotnull", PgType::Bool),
        ("typbasetype", PgType::Oid),
        ("typtypmod", PgType::Int4),
        ("typndims", PgType::Int4),
        ("typcollation", PgType::Oid),
        ("typdefault", PgType::Text),
        ("typacl", PgType::TextArray),
    ]);
    for (oid, name, length, category, array, element) in TYPES {
        let base = name.trim_start_matches('_');
        relation.push(vec![
            int(oid),
            text(name),
            int(PG_CATALOG_NAMESPACE),
            int(OWNER_OID),
            int(length),
            boolean((1..=8).contains(&length)),
            text("b"),
            text(category),
            boolean(matches!(name, "bool" | "float8" | "text" | "oid")),
            boolean(true),
            text(","),
            int(0),
            int(element),
            int(array),
            text(if category == "A" { "array_in".to_string() } else { format!("{base}in") }),
            text(if category == "A" { "array_out".to_string() } else { format!("{base}out") }),
            text(if category == "A" { "array_recv".to_string() } else { format!("{base}recv") }),
            text(if category == "A" { "array_send".to_string() } else { format!("{base}send") }),
            text(if length == 8 { "d" } else { "i" }),
            text(if length > 0 { "p" } else { "x" }),
            boolean(false),
            int(0),
            int(-1),
            int(0),
            int(if matches!(name, "text" | "varchar" | "bpchar" | "name") { DEFAULT_COLLATION } else { 0 }),
            Datum::Null,
            Datum::Null,
        ]);
    }
    relation
}

/// Whether `name` is one of the input/output functions pg_type names (`typinput` …), the
/// only functions a `regproc` value can name here.
pub fn is_type_function(name: &str) -> bool {
    let io_columns = 14..18;
    types().rows.iter().any(|row| row[io_columns.clone()].iter().any(|d| d.to_text(false) == name))
}

fn indexes(tables: &[Arc<Table>]) -> Relation {
    let mut relation = Relation::new(&[
        ("indexrelid", PgType::Oid),
        ("indrelid", PgType::Oid),
        ("indnatts", PgType::Int2),
        ("indnkeyatts", PgType::Int2),
        ("indisunique", PgType::Bool),
        ("indnullsnotdistinct", PgType::Bool),
        ("indisprimary", PgType::Bool),
        ("indisexclusion", PgType::Bool),
        ("indimmediate", PgType::Bool),
        ("indisclustered", PgType::Bool),
        ("indisvalid", PgType::Bool),
        ("indcheckxmin", PgType::Bool),
        ("indisready", PgType::Bool),
        ("indislive", PgType::Bool),
        ("indisreplident", PgType::Bool),
        ("indkey", PgType::Int2Vector),
        ("indcollation", PgType::OidVector),
        ("indclass", PgType::OidVector),
        ("indoption", PgType::Int2Vector),
        ("indexprs", PgType::Text),
        ("indpred", PgType::Text),
    ]);
    for table in tables {
        for index in table_indexes(table) {
            let keys: Vec<Datum> = index.columns.iter().map(|&c| int(c as i64 + 1)).collect();
            let zeros: Vec<Datum> = index.columns.iter().map(|_| int(0)).collect();
            let classes: Vec<Datum> =
                index.columns.iter().map(|&c| int(operator_class(table.schema[c].data_type))).collect();
            let collations: Vec<Datum> = index
                .columns
                .iter()
                .map(|&c| int(if table.schema[c].data_type == DataType::Text { DEFAULT_COLLATION } else { 0 }))
                .collect();
            let width = index.columns.len() as i64;
            relation.push(vec![
                int(index.oid),
                int(i64::from(table.oid)),
                int(width),
                int(width),
                boolean(index.unique),
                boolean(false),
                boolean(index.primary),
                boolean(false),
                boolean(true),
                boolean(false),
                boolean(true),
                boolean(false),
                boolean(true),
                boolean(true),
                boolean(false),
                Datum::Array(keys),
                Datum::Array(collations),
                Datum::Array(classes),
                Datum::Array(zeros),
                Datum::Null,
                Datum::Null,
            ]);
        }
    }
    relation
}

/// `CREATE [UNIQUE] INDEX name ON public.t USING btree (a, b)`, as pg_get_indexdef shows it.
pub fn index_definition(table: &Table, index: &IndexEntry) -> String {
    let columns: Vec<&str> = index.columns.iter().map(|&c| table.schema[c].name.as_str()).collect();
    let unique = if index.unique { "UNIQUE " } else { "" };
    format!("CREATE {unique}INDEX {} ON public.{} USING btree ({})", index.name, table.name, columns.join(", "))
}

/// `PRIMARY KEY (a)` / `UNIQUE (a, b)`, as pg_get_constraintdef shows it.
pub fn constraint_definition(table: &Table, index: &IndexEntry) -> String {
    let columns: Vec<&str> = index.columns.iter().map(|&c| table.schema[c].name.as_str()).collect();
    format!("{} ({})", if index.primary { "PRIMARY KEY" } else { "UNIQUE" }, columns.join(", "))
}

fn constraints(tables: &[Arc<Table>]) -> Relation {
    let mut relation = Relation::new(&[
        ("oid", PgType::Oid),
        ("conname", PgType::Name),
        ("connamespace", PgType::Oid),
        ("contype", PgType::Char),
        ("condeferrable", PgType::Bool),
        ("condeferred", PgType::Bool),
        ("convalidated", PgType::Bool),
        ("conrelid", PgType::Oid),
        ("contypid", PgType::Oid),
        ("conindid", PgType::Oid),
        ("conparentid", PgType::Oid),
        ("confrelid", PgType::Oid),
        ("confupdtype", PgType::Char),
        ("confdeltype", PgType::Char),
        ("confmatchtype", PgType::Char),
        ("conislocal", PgType::Bool),
        ("coninhcount", PgType::Int4),
        ("connoinherit", PgType::Bool),
        ("conkey", PgType::Int2Array),
        ("confkey", PgType::Int2Array),
        ("conbin", PgType::Text),
    ]);
    for table in tables {
        for index in table_indexes(table) {
            let Some(constraint_oid) = index.constraint else { continue };
            let keys: Vec<Datum> = index.columns.iter().map(|&c| int(c as i64 + 1)).collect();
            relation.push(vec![
                int(constraint_oid),
                text(&index.name),
                int(PUBLIC_NAMESPACE),
                text(if index.primary { "p" } else { "u" }),
                boolean(false),
                boolean(false),
                boolean(true),
                int(i64::from(table.oid)),
                int(0),
                int(index.oid),
                int(0),
                int(0),
                text(" "),
                text(" "),
                text(" "),
                boolean(true),
                int(0),
                boolean(true),
                Datum::Array(keys),
                Datum::Null,
                Datum::Null,
            ]);
        }
    }
    relation
}

fn defaults(tables: &[Arc<Table>]) -> Relation {
    let mut relation = Relation::new(&[
        ("oid", PgType::Oid),
        ("adrelid", PgType::Oid),
        ("adnum", PgType::Int2),
        ("adbin", PgType::Text),
    ]);
    for table in tables {
        for (column, default) in table.constraints.defaults.iter().enumerate() {
            if let Some(value) = default {
                let literal = match value {
                    crate::types::Value::Text(t) => format!("'{}'::text", t.replace('\'', "''")),
                    crate::types::Value::Null => "NULL".into(),
                    other => other.to_string(),
                };
                relation.push(vec![
                    int(i64::from(table.oid) * 1000 + column as i64),
                    int(i64::from(table.oid)),
                    int(column as i64 + 1),
                    text(literal),
                ]);
            }
        }
    }
    relation
}

fn databases(context: &Context<'_>) -> Relation {
    let mut relation = Relation::new(&[
        ("oid", PgType::Oid),
        ("datname", PgType::Name),
        ("datdba", PgType::Oid),
        ("encoding", PgType::Int4),
        ("datlocprovider", PgType::Char),
        ("datistemplate", PgType::Bool),
        ("datallowconn", PgType::Bool),
        ("datconnlimit", PgType::Int4),
        ("dattablespace", PgType::Oid),
        ("datcollate", PgType::Name),
        ("datctype", PgType::Name),
        ("daticulocale", PgType::Text),
        ("datacl", PgType::TextArray),
    ]);
    relation.push(vec![
        int(DATABASE_OID),
        text(context.database),
        int(OWNER_OID),
        int(6),
        text("c"),
        boolean(false),
        boolean(true),
        int(-1),
        int(1663),
        text("C"),
        text("C"),
        Datum::Null,
        Datum::Null,
    ]);
    relation
}

fn roles(name: &str, context: &Context<'_>) -> Relation {
    let name_column = if name == "pg_user" { "usename" } else { "rolname" };
    let mut relation = Relation::new(&[
        ("oid", PgType::Oid),
        (name_column, PgType::Name),
        ("rolsuper", PgType::Bool),
        ("rolinherit", PgType::Bool),
        ("rolcreaterole", PgType::Bool),
        ("rolcreatedb", PgType::Bool),
        ("rolcanlogin", PgType::Bool),
        ("rolreplication", PgType::Bool),
        ("rolconnlimit", PgType::Int4),
        ("rolvaliduntil", PgType::Text),
        ("rolbypassrls", PgType::Bool),
        ("rolconfig", PgType::TextArray),
    ]);
    relation.push(vec![
        int(OWNER_OID),
        text(context.user),
        boolean(true),
        boolean(true),
        boolean(true),
        boolean(true),
        boolean(true),
        boolean(false),
        int(-1),
        Datum::Null,
        boolean(true),
        Datum::Null,
    ]);
    relation
}

/// Every setting SHOW knows, as pg_settings rows.
const SETTINGS: [&str; 12] = [
    "application_name",
    "client_encoding",
    "DateStyle",
    "extra_float_digits",
    "idle_in_transaction_session_timeout",
    "lock_timeout",
    "memory_limit",
    "search_path",
    "server_version",
    "standard_conforming_strings",
    "statement_timeout",
    "TimeZone",
];

fn settings(context: &Context<'_>) -> Relation {
    let mut relation = Relation::new(&[
        ("name", PgType::Text),
        ("setting", PgType::Text),
        ("unit", PgType::Text),
        ("category", PgType::Text),
        ("short_desc", PgType::Text),
        ("context", PgType::Text),
        ("vartype", PgType::Text),
        ("source", PgType::Text),
        ("boot_val", PgType::Text),
        ("reset_val", PgType::Text),
        ("pending_restart", PgType::Bool),
    ]);
    for name in SETTINGS {
        let Ok(value) = context.settings.show(name) else { continue };
        relation.push(vec![
            text(name),
            text(value.clone()),
            Datum::Null,
            text("Client Connection Defaults"),
            text(""),
            text("user"),
            text("string"),
            text("session"),
            text(value.clone()),
            text(value),
            boolean(false),
        ]);
    }
    relation
}

fn access_methods() -> Relation {
    let mut relation = Relation::new(&[
        ("oid", PgType::Oid),
        ("amname", PgType::Name),
        ("amhandler", PgType::Text),
        ("amtype", PgType::Char),
    ]);
    relation.push(vec![int(HEAP_AM), text("heap"), text("heap_tableam_handler"), text("t")]);
    relation.push(vec![int(BTREE_AM), text("btree"), text("bthandler"), text("i")]);
    relation
}

/// Default btree operator classes: (oid, name, input type).
const OPERATOR_CLASSES: [(i64, &str, i64); 7] = [
    (424, "bool_ops", 16),
    (1978, "int4_ops", 23),
    (3124, "int8_ops", 20),
    (3123, "float8_ops", 701),
    (3126, "text_ops", 25),
    (3122, "date_ops", 1082),
    (3125, "numeric_ops", 1700),
];

/// The default btree operator class of a column type.
fn operator_class(data_type: DataType) -> i64 {
    let oid = i64::from(data_type.pg_oid());
    OPERATOR_CLASSES.iter().find(|(_, _, input)| *input == oid).map_or(0, |(class, _, _)| *class)
}

fn operator_classes() -> Relation {
    let mut relation = Relation::new(&[
        ("oid", PgType::Oid),
        ("opcmethod", PgType::Oid),
        ("opcname", PgType::Name),
        ("opcnamespace", PgType::Oid),
        ("opcowner", PgType::Oid),
        ("opcfamily", PgType::Oid),
        ("opcintype", PgType::Oid),
        ("opcdefault", PgType::Bool),
        ("opckeytype", PgType::Oid),
    ]);
    for (oid, name, input) in OPERATOR_CLASSES {
        relation.push(vec![
            int(oid),
            int(BTREE_AM),
            text(name),
            int(PG_CATALOG_NAMESPACE),
            int(OWNER_OID),
            int(oid),
            int(input),
            boolean(true),
            int(0),
        ]);
    }
    relation
}

fn tablespaces() -> Relation {
    let mut relation = Relation::new(&[("oid", PgType::Oid), ("spcname", PgType::Name), ("spcowner", PgType::Oid)]);
    relation.push(vec![int(1663), text("pg_default"), int(OWNER_OID)]);
    relation.push(vec![int(1664), text("pg_global"), int(OWNER_OID)]);
    relation
}

fn collations() -> Relation {
    let mut relation = Relation::new(&[
        ("oid", PgType::Oid),
        ("collname", PgType::Name),
        ("collnamespace", PgType::Oid),
        ("collprovider", PgType::Char),
        ("collencoding", PgType::Int4),
        ("collcollate", PgType::Name),
        ("collctype", PgType::Name),
    ]);
    for (oid, name, provider) in [(DEFAULT_COLLATION, "default", "d"), (950, "C", "c"), (951, "POSIX", "c")] {
        relation.push(vec![
            int(oid),
            text(name),
            int(PG_CATALOG_NAMESPACE),
            text(provider),
            int(-1),
            text("C"),
            text("C"),
        ]);
    }
    relation
}

fn pg_tables(tables: &[Arc<Table>], context: &Context<'_>) -> Relation {
    let mut relation = Relation::new(&[
        ("schemaname", PgType::Name),
        ("tablename", PgType::Name),
        ("tableowner", PgType::Name),
        ("tablespace", PgType::Name),
        ("hasindexes", PgType::Bool),
        ("hasrules", PgType::Bool),
        ("hastriggers", PgType::Bool),
        ("rowsecurity", PgType::Bool),
    ]);
    for table in tables {
        relation.push(vec![
            text("public"),
            text(&table.name),
            text(context.user),
            Datum::Null,
            boolean(!table_indexes(table).is_empty()),
            boolean(false),
            boolean(false),
            boolean(false),
        ]);
    }
    relation
}

fn pg_indexes(tables: &[Arc<Table>]) -> Relation {
    let mut relation = Relation::new(&[
        ("schemaname", PgType::Name),
        ("tablename", PgType::Name),
        ("indexname", PgType::Name),
        ("tablespace", PgType::Name),
        ("indexdef", PgType::Text),
    ]);
    for table in tables {
        for index in table_indexes(table) {
            relation.push(vec![
                text("public"),
                text(&table.name),
                text(&index.name),
                Datum::Null,
                text(index_definition(table, &index)),
            ]);
        }
    }
    relation
}

fn information_schema(name: &str, context: &Context<'_>) -> Option<Relation> {
    let tables = context.catalog.tables();
    Some(match name {
        "tables" => {
            let mut relation = Relation::new(&[
                ("table_catalog", PgType::Name),
                ("table_schema", PgType::Name),
                ("table_name", PgType::Name),
                ("table_type", PgType::Text),
                ("self_referencing_column_name", PgType::Name),
                ("reference_generation", PgType::Text),
                ("user_defined_type_catalog", PgType::Name),
                ("user_defined_type_schema", PgType::Name),
                ("user_defined_type_name", PgType::Name),
                ("is_insertable_into", PgType::Text),
                ("is_typed", PgType::Text),
                ("commit_action", PgType::Text),
            ]);
            for table in &tables {
                relation.push(vec![
                    text(context.database),
                    text("public"),
                    text(&table.name),
                    text("BASE TABLE"),
                    Datum::Null,
                    Datum::Null,
                    Datum::Null,
                    Datum::Null,
                    Datum::Null,
                    text("YES"),
                    text("NO"),
                    Datum::Null,
                ]);
            }
            relation
        }
        "columns" => information_columns(&tables, context),
        "schemata" => {
            let mut relation = Relation::new(&[
                ("catalog_name", PgType::Name),
                ("schema_name", PgType::Name),
                ("schema_owner", PgType::Name),
            ]);
            for schema in ["pg_catalog", "public", "information_schema"] {
                relation.push(vec![text(context.database), text(schema), text(context.user)]);
            }
            relation
        }
        "table_constraints" | "key_column_usage" => information_constraints(name, &tables, context),
        "views" | "routines" | "sequences" | "triggers" => Relation::new(&[
            ("table_catalog", PgType::Name),
            ("table_schema", PgType::Name),
            ("table_name", PgType::Name),
        ]),
        _ => return None,
    })
}

fn information_columns(tables: &[Arc<Table>], context: &Context<'_>) -> Relation {
    let mut relation = Relation::new(&[
        ("table_catalog", PgType::Name),
        ("table_schema", PgType::Name),
        ("table_name", PgType::Name),
        ("column_name", PgType::Name),
        ("ordinal_position", PgType::Int4),
        ("column_default", PgType::Text),
        ("is_nullable", PgType::Text),
        ("data_type", PgType::Text),
        ("character_maximum_length", PgType::Int4),
        ("numeric_precision", PgType::Int4),
        ("numeric_precision_radix", PgType::Int4),
        ("numeric_scale", PgType::Int4),
        ("datetime_precision", PgType::Int4),
        ("udt_catalog", PgType::Name),
        ("udt_schema", PgType::Name),
        ("udt_name", PgType::Name),
        ("is_identity", PgType::Text),
        ("is_generated", PgType::Text),
        ("is_updatable", PgType::Text),
    ]);
    for table in tables {
        for (index, column) in table.schema.iter().enumerate() {
            let (precision, radix, scale) = match column.data_type {
                DataType::Int16 => (int(16), int(2), int(0)),
                DataType::Int32 => (int(32), int(2), int(0)),
                DataType::Float32 => (int(24), int(2), Datum::Null),
                DataType::Int64 => (int(64), int(2), int(0)),
                DataType::Float64 => (int(53), int(2), Datum::Null),
                DataType::Decimal { precision, scale } => (int(precision), int(10), int(scale)),
                _ => (Datum::Null, Datum::Null, Datum::Null),
            };
            let oid = i64::from(column.data_type.pg_oid());
            relation.push(vec![
                text(context.database),
                text("public"),
                text(&table.name),
                text(&column.name),
                int(index as i64 + 1),
                table.constraints.defaults[index].as_ref().map_or(Datum::Null, |v| text(v.to_string())),
                text(if table.constraints.not_null[index] { "NO" } else { "YES" }),
                text(format_type(oid, -1).split('(').next().unwrap_or_default().to_string()),
                Datum::Null,
                precision,
                radix,
                scale,
                if column.data_type == DataType::Date { int(0) } else { Datum::Null },
                text(context.database),
                text("pg_catalog"),
                text(type_name(oid).unwrap_or("text")),
                text("NO"),
                text("NEVER"),
                text("YES"),
            ]);
        }
    }
    relation
}

fn information_constraints(name: &str, tables: &[Arc<Table>], context: &Context<'_>) -> Relation {
    let mut relation = if name == "table_constraints" {
        Relation::new(&[
            ("constraint_catalog", PgType::Name),
            ("constraint_schema", PgType::Name),
            ("constraint_name", PgType::Name),
            ("table_catalog", PgType::Name),
            ("table_schema", PgType::Name),
            ("table_name", PgType::Name),
            ("constraint_type", PgType::Text),
            ("is_deferrable", PgType::Text),
            ("initially_deferred", PgType::Text),
            ("enforced", PgType::Text),
        ])
    } else {
        Relation::new(&[
            ("constraint_catalog", PgType::Name),
            ("constraint_schema", PgType::Name),
            ("constraint_name", PgType::Name),
            ("table_catalog", PgType::Name),
            ("table_schema", PgType::Name),
            ("table_name", PgType::Name),
            ("column_name", PgType::Name),
            ("ordinal_position", PgType::Int4),
            ("position_in_unique_constraint", PgType::Int4),
        ])
    };
    for table in tables {
        for constraint in table.constraints.unique.iter().filter(|u| u.constraint) {
            let head = || {
                vec![
                    text(context.database),
                    text("public"),
                    text(&constraint.name),
                    text(context.database),
                    text("public"),
                    text(&table.name),
                ]
            };
            if name == "table_constraints" {
                let mut row = head();
                row.extend([
                    text(if constraint.primary { "PRIMARY KEY" } else { "UNIQUE" }),
                    text("NO"),
                    text("NO"),
                    text("YES"),
                ]);
                relation.push(row);
            } else {
                for (position, &column) in constraint.columns.iter().enumerate() {
                    let mut row = head();
                    row.extend([text(&table.schema[column].name), int(position as i64 + 1), Datum::Null]);
                    relation.push(row);
                }
            }
        }
    }
    relation
}
