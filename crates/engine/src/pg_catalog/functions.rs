//! Operators, casts, system functions and aggregates of the catalog interpreter: what psql,
//! SQLAlchemy, pandas, psycopg and DBeaver call in their catalog queries, with PostgreSQL's
//! answers for a database whose objects all live in `public`, owned by the session's user.

use std::cmp::Ordering;

use sqlparser::ast;

use super::tables::{self, Context, OWNER_OID};
use super::value::{compare, equals, Datum, PgType};
use crate::error::{EngineError, Result};

/// Longest regular expression accepted (its compiled size is bounded by the regex crate too).
const REGEX_BYTES_MAX: usize = 1 << 12;

pub fn is_aggregate(name: &str) -> bool {
    matches!(
        name,
        "count" | "sum" | "avg" | "min" | "max" | "array_agg" | "string_agg" | "bool_and" | "bool_or" | "every"
    )
}

/// Functions SQL spells without parentheses (`current_user`, `current_schema`).
pub fn niladic(name: &str, context: &Context<'_>) -> Option<Datum> {
    match name {
        "current_user" | "session_user" | "user" | "current_role" => Some(Datum::text(context.user)),
        "current_catalog" => Some(Datum::text(context.database)),
        "current_schema" => Some(Datum::text("public")),
        _ => None,
    }
}

pub fn operator(op: &ast::BinaryOperator, left: &Datum, right: &Datum) -> Result<Datum> {
    use ast::BinaryOperator as B;
    let symbol = match op {
        B::PGCustomBinaryOperator(parts) => parts.last().cloned().unwrap_or_default(),
        other => other.to_string(),
    };
    if left.is_null() || right.is_null() {
        return Ok(match symbol.as_str() {
            "||" if matches!((left, right), (Datum::Array(_), _) | (_, Datum::Array(_))) => concat_arrays(left, right),
            _ => Datum::Null,
        });
    }
    let ordered = |test: fn(Ordering) -> bool| Datum::Bool(compare(left, right).is_some_and(test));
    Ok(match symbol.as_str() {
        "=" => equals(left, right),
        "<>" | "!=" => Datum::Bool(!equals(left, right).is_true()),
        "<" => ordered(|o| o == Ordering::Less),
        "<=" => ordered(|o| o != Ordering::Greater),
        ">" => ordered(|o| o == Ordering::Greater),
        ">=" => ordered(|o| o != Ordering::Less),
        "~" | "!~" | "~*" | "!~*" => regex_match(&symbol, left, right)?,
        "~~" | "!~~" => {
            let matched = crate::expr::LikePattern::new(&right.to_text(false)).matches(&left.to_text(false));
            Datum::Bool(matched == (symbol == "~~"))
        }
        "||" => match (left, right) {
            (Datum::Array(_), _) | (_, Datum::Array(_)) => concat_arrays(left, right),
            _ => Datum::Text(left.to_text(false) + &right.to_text(false)),
        },
        "+" | "-" | "*" | "/" | "%" => arithmetic(&symbol, left, right)?,
        "@>" | "<@" | "&&" => containment(&symbol, left, right),
        other => return Err(EngineError::UndefinedFunction(format!("operator does not exist: {other}"))),
    })
}

fn regex_match(symbol: &str, left: &Datum, right: &Datum) -> Result<Datum> {
    let pattern = right.to_text(false);
    if pattern.len() > REGEX_BYTES_MAX {
        return Err(EngineError::LimitExceeded(format!("regular expression above {REGEX_BYTES_MAX} bytes")));
    }
    let insensitive = symbol.contains('*');
    let compiled = regex::RegexBuilder::new(&pattern)
        .case_insensitive(insensitive)
        .size_limit(1 << 20)
        .build()
        .map_err(|e| EngineError::InvalidValue(format!("invalid regular expression: {e}")))?;
    Ok(Datum::Bool(compiled.is_match(&left.to_text(false)) != symbol.starts_with('!')))
}

fn concat_arrays(left: &Datum, right: &Datum) -> Datum {
    let mut items = Vec::new();
    for side in [left, right] {
        match side {
            Datum::Array(values) => items.extend(values.iter().cloned()),
            Datum::Null => {}
            other => items.push(other.clone()),
        }
    }
    Datum::Array(items)
}

fn containment(symbol: &str, left: &Datum, right: &Datum) -> Datum {
    let (Datum::Array(a), Datum::Array(b)) = (left, right) else { return Datum::Null };
    let contains =
        |outer: &[Datum], inner: &[Datum]| inner.iter().all(|x| outer.iter().any(|y| equals(x, y).is_true()));
    Datum::Bool(match symbol {
        "@>" => contains(a, b),
        "<@" => contains(b, a),
        _ => a.iter().any(|x| b.iter().any(|y| equals(x, y).is_true())),
    })
}

fn arithmetic(symbol: &str, left: &Datum, right: &Datum) -> Result<Datum> {
    let numbers = |d: &Datum| match d {
        Datum::Int(v) => Some(Datum::Int(*v)),
        Datum::Float(v) => Some(Datum::Float(*v)),
        Datum::Text(t) => {
            t.trim().parse::<i64>().ok().map(Datum::Int).or_else(|| t.trim().parse().ok().map(Datum::Float))
        }
        _ => None,
    };
    let (Some(l), Some(r)) = (numbers(left), numbers(right)) else {
        return Err(EngineError::UndefinedFunction(format!("operator does not exist: {left:?} {symbol} {right:?}")));
    };
    let overflow = || EngineError::Overflow("integer out of range".into());
    Ok(match (l, r) {
        (Datum::Int(a), Datum::Int(b)) => Datum::Int(match symbol {
            "+" => a.checked_add(b).ok_or_else(overflow)?,
            "-" => a.checked_sub(b).ok_or_else(overflow)?,
            "*" => a.checked_mul(b).ok_or_else(overflow)?,
            "/" if b == 0 => return Err(EngineError::DivisionByZero),
            "/" => a.checked_div(b).ok_or_else(overflow)?,
            "%" if b == 0 => return Err(EngineError::DivisionByZero),
            _ => a.checked_rem(b).ok_or_else(overflow)?,
        }),
        (a, b) => {
            let (a, b) = (a.as_int().map_or_else(|| float(&a), |_| float(&a)), float(&b));
            Datum::Float(match symbol {
                "+" => a + b,
                "-" => a - b,
                "*" => a * b,
                "/" if b == 0.0 => return Err(EngineError::DivisionByZero),
                "/" => a / b,
                _ => a % b,
            })
        }
    })
}

fn float(d: &Datum) -> f64 {
    match d {
        Datum::Int(v) => *v as f64,
        Datum::Float(v) => *v,
        other => other.to_text(false).parse().unwrap_or(f64::NAN),
    }
}

/// The catalog type a cast produces, for RowDescription.
pub fn cast_type(data_type: &ast::DataType) -> Option<PgType> {
    let name = data_type.to_string().to_lowercase();
    let name = name.trim_start_matches("pg_catalog.");
    Some(match name {
        "oid" | "regclass" | "regtype" | "regproc" | "regprocedure" | "regnamespace" | "regrole" => PgType::Oid,
        "int2" | "smallint" => PgType::Int2,
        "int" | "int4" | "integer" => PgType::Int4,
        "int8" | "bigint" => PgType::Int8,
        "bool" | "boolean" => PgType::Bool,
        "name" => PgType::Name,
        "char" | "\"char\"" => PgType::Char,
        "float4" | "real" => PgType::Float4,
        "float8" | "double precision" | "float" => PgType::Float8,
        "text[]" | "varchar[]" => PgType::TextArray,
        "name[]" => PgType::NameArray,
        "oid[]" => PgType::OidArray,
        "int2[]" | "smallint[]" => PgType::Int2Array,
        "int4[]" | "integer[]" | "int[]" => PgType::Int4Array,
        "int8[]" | "bigint[]" => PgType::Int8Array,
        _ if name.starts_with("text") || name.starts_with("varchar") || name.starts_with("character") => PgType::Text,
        _ => return None,
    })
}

/// `value::data_type`.
pub fn cast(value: Datum, data_type: &ast::DataType, context: &Context<'_>) -> Result<Datum> {
    if value.is_null() {
        return Ok(Datum::Null);
    }
    let name = data_type.to_string().to_lowercase();
    let name = name.trim_start_matches("pg_catalog.").trim_matches('"');
    let invalid =
        || EngineError::InvalidValue(format!("invalid input syntax for type {name}: \"{}\"", value.to_text(false)));
    Ok(match name {
        "regclass" => match &value {
            Datum::Int(_) => value,
            other => regclass(&other.to_text(false), context)?,
        },
        "regtype" => match &value {
            Datum::Int(_) => value,
            other => Datum::Int(tables::type_oid(&other.to_text(false)).ok_or_else(|| {
                EngineError::UnknownObject(format!("type \"{}\" does not exist", other.to_text(false)))
            })?),
        },
        "regnamespace" => match value.to_text(false).as_str() {
            "pg_catalog" => Datum::Int(tables::PG_CATALOG_NAMESPACE),
            "public" => Datum::Int(tables::PUBLIC_NAMESPACE),
            "information_schema" => Datum::Int(tables::INFORMATION_SCHEMA_NAMESPACE),
            other => value
                .as_int()
                .map(Datum::Int)
                .ok_or_else(|| EngineError::UnknownObject(format!("schema \"{other}\" does not exist")))?,
        },
        // pg_type names its I/O functions as text (typinput …), so a name casts to that text.
        "regproc" | "regprocedure" if value.as_int().is_none() => {
            let text = value.to_text(false);
            let function = text.trim_start_matches("pg_catalog.").trim_matches('"');
            if !tables::is_type_function(function) {
                return Err(EngineError::UndefinedFunction(format!("function \"{text}\" does not exist")));
            }
            Datum::Text(function.to_string())
        }
        "regproc" | "regprocedure" | "regrole" => value
            .as_int()
            .map(Datum::Int)
            .ok_or_else(|| EngineError::UnknownObject(format!("{name} \"{}\" does not exist", value.to_text(false))))?,
        _ => match cast_type(data_type) {
            Some(PgType::Oid | PgType::Int2 | PgType::Int4 | PgType::Int8) => {
                value.as_int().map(Datum::Int).ok_or_else(invalid)?
            }
            Some(PgType::Float4 | PgType::Float8) => Datum::Float(float(&value)),
            Some(PgType::Bool) => match value.to_text(false).to_lowercase().as_str() {
                "t" | "true" | "yes" | "on" | "1" | "y" => Datum::Bool(true),
                "f" | "false" | "no" | "off" | "0" | "n" => Datum::Bool(false),
                _ => return Err(invalid()),
            },
            Some(PgType::Text | PgType::Name | PgType::Char) => match value {
                Datum::Array(_) => Datum::Text(value.to_text(false)),
                other => Datum::Text(other.to_text(false)),
            },
            Some(array) if array.is_array() => match value {
                Datum::Array(_) => value,
                other => Datum::Array(parse_array_text(&other.to_text(false))),
            },
            _ => value,
        },
    })
}

/// OIDs of the system catalogs (`'pg_catalog.pg_class'::regclass` in catalog queries).
const CATALOG_OIDS: [(&str, i64); 16] = [
    ("pg_type", 1247),
    ("pg_attribute", 1249),
    ("pg_proc", 1255),
    ("pg_class", 1259),
    ("pg_authid", 1260),
    ("pg_database", 1262),
    ("pg_am", 2601),
    ("pg_attrdef", 2604),
    ("pg_constraint", 2606),
    ("pg_description", 2609),
    ("pg_index", 2610),
    ("pg_namespace", 2615),
    ("pg_trigger", 2620),
    ("pg_rewrite", 2618),
    ("pg_collation", 3456),
    ("pg_policy", 3256),
];

/// The OID of a relation named in text (`'t'::regclass`, `'public.t'`, `'"T"'`).
fn regclass(text: &str, context: &Context<'_>) -> Result<Datum> {
    let name = text.rsplit('.').next().unwrap_or(text);
    let name = if name.starts_with('"') { name.trim_matches('"').to_string() } else { name.to_lowercase() };
    if let Some((_, oid)) = CATALOG_OIDS.iter().find(|(catalog, _)| *catalog == name) {
        return Ok(Datum::Int(*oid));
    }
    for table in context.catalog.tables() {
        if table.name == name {
            return Ok(Datum::Int(i64::from(table.oid)));
        }
        if let Some(index) = tables::table_indexes(&table).into_iter().find(|i| i.name == name) {
            return Ok(Datum::Int(index.oid));
        }
    }
    Err(EngineError::UnknownTable(text.to_string()))
}

fn parse_array_text(text: &str) -> Vec<Datum> {
    let inner = text.trim().trim_start_matches('{').trim_end_matches('}');
    if inner.is_empty() {
        return Vec::new();
    }
    inner
        .split(',')
        .map(|item| match item.trim() {
            "NULL" => Datum::Null,
            other => Datum::text(other.trim_matches('"')),
        })
        .collect()
}

/// `SUBSTRING(text FROM start FOR length)`.
pub fn substring(text: &Datum, from: Option<&Datum>, length: Option<&Datum>) -> Datum {
    if text.is_null() {
        return Datum::Null;
    }
    let chars: Vec<char> = text.to_text(false).chars().collect();
    let start = from.and_then(Datum::as_int).unwrap_or(1);
    let end = length.and_then(Datum::as_int).map_or(i64::MAX, |l| start.saturating_add(l));
    let (first, last) = (start.max(1) as usize - 1, end.clamp(1, chars.len() as i64 + 1) as usize - 1);
    Datum::Text(chars.get(first..last.max(first)).map(|c| c.iter().collect()).unwrap_or_default())
}

/// A system or string function.
pub fn call(name: &str, args: &[Datum], context: &Context<'_>) -> Result<Datum> {
    let arg = |i: usize| args.get(i).cloned().unwrap_or(Datum::Null);
    let text = |i: usize| arg(i).as_text();
    let strict = |f: &dyn Fn() -> Datum| if args.iter().any(Datum::is_null) { Datum::Null } else { f() };
    Ok(match name {
        "version" => Datum::text(crate::settings::VERSION_TEXT),
        "current_database" => Datum::text(context.database),
        "current_schema" => Datum::text("public"),
        "current_schemas" => {
            let mut schemas = vec![Datum::text("public")];
            if arg(0).is_true() {
                schemas.insert(0, Datum::text("pg_catalog"));
            }
            Datum::Array(schemas)
        }
        "current_user" | "session_user" | "user" => Datum::text(context.user),
        "pg_backend_pid" => Datum::Int(i64::from(std::process::id())),
        "pg_table_is_visible" | "pg_type_is_visible" | "pg_function_is_visible" | "pg_opclass_is_visible" => {
            strict(&|| Datum::Bool(true))
        }
        "format_type" => match arg(0).as_int() {
            None => Datum::Null,
            Some(oid) => Datum::Text(tables::format_type(oid, arg(1).as_int().unwrap_or(-1))),
        },
        "pg_get_userbyid" => match arg(0).as_int() {
            Some(OWNER_OID) => Datum::text(context.user),
            Some(other) => Datum::Text(format!("unknown (OID={other})")),
            None => Datum::Null,
        },
        "pg_encoding_to_char" => strict(&|| Datum::text(if arg(0).as_int() == Some(6) { "UTF8" } else { "" })),
        "pg_get_expr" => arg(0),
        "pg_get_indexdef" => definition(&arg(0), context, tables::index_definition, false),
        "pg_get_constraintdef" => definition(&arg(0), context, tables::constraint_definition, true),
        "pg_get_viewdef"
        | "pg_get_triggerdef"
        | "pg_get_functiondef"
        | "pg_get_partkeydef"
        | "pg_get_ruledef"
        | "pg_get_statisticsobjdef_columns"
        | "pg_get_serial_sequence"
        | "obj_description"
        | "col_description"
        | "shobj_description"
        | "inet_server_addr"
        | "inet_server_port"
        | "pg_get_function_arguments"
        | "pg_get_function_result"
        | "pg_get_function_identity_arguments" => Datum::Null,
        "has_table_privilege"
        | "has_schema_privilege"
        | "has_database_privilege"
        | "has_column_privilege"
        | "has_function_privilege"
        | "has_any_column_privilege"
        | "has_sequence_privilege"
        | "pg_has_role" => Datum::Bool(true),
        "pg_is_in_recovery" | "pg_jit_available" => Datum::Bool(false),
        "pg_relation_is_publishable" => strict(&|| Datum::Bool(true)),
        "pg_tablespace_location" => Datum::text(""),
        "pg_encoding_max_length" => Datum::Int(4),
        "pg_relation_size" | "pg_table_size" => relation_size(&arg(0), context, Sizes::Relation),
        "pg_indexes_size" => relation_size(&arg(0), context, Sizes::Indexes),
        "pg_total_relation_size" => relation_size(&arg(0), context, Sizes::Total),
        // Scans through an index: none ever (indexes enforce uniqueness; no lookup uses them).
        // Scans of a table are not counted: unknown, not zero.
        "pg_stat_get_numscans" => match arg(0).as_int() {
            Some(oid) if is_index_oid(oid, context) => Datum::Int(0),
            _ => Datum::Null,
        },
        "pg_database_size" => Datum::Int(context.catalog.tables().iter().map(|t| t.bytes() as i64).sum()),
        "pg_size_pretty" => strict(&|| Datum::Text(size_pretty(arg(0).as_int().unwrap_or(0)))),
        "current_setting" => match context.settings.show(&text(0).unwrap_or_default()) {
            Ok(value) => Datum::Text(value),
            Err(_) if arg(1).is_true() => Datum::Null,
            Err(error) => return Err(error),
        },
        "to_regclass" => regclass(&text(0).unwrap_or_default(), context).unwrap_or(Datum::Null),
        "to_regtype" => tables::type_oid(&text(0).unwrap_or_default()).map_or(Datum::Null, Datum::Int),
        "coalesce" => args.iter().find(|a| !a.is_null()).cloned().unwrap_or(Datum::Null),
        "nullif" => {
            if equals(&arg(0), &arg(1)).is_true() {
                Datum::Null
            } else {
                arg(0)
            }
        }
        "greatest" | "least" => extreme(args, name == "greatest"),
        "lower" => strict(&|| Datum::Text(arg(0).to_text(false).to_lowercase())),
        "upper" => strict(&|| Datum::Text(arg(0).to_text(false).to_uppercase())),
        "length" | "char_length" | "character_length" => {
            strict(&|| Datum::Int(arg(0).to_text(false).chars().count() as i64))
        }
        "octet_length" => strict(&|| Datum::Int(arg(0).to_text(false).len() as i64)),
        "concat" => Datum::Text(args.iter().filter(|a| !a.is_null()).map(|a| a.to_text(false)).collect()),
        "concat_ws" => {
            let separator = text(0).unwrap_or_default();
            Datum::Text(
                args[1.min(args.len())..]
                    .iter()
                    .filter(|a| !a.is_null())
                    .map(|a| a.to_text(false))
                    .collect::<Vec<_>>()
                    .join(&separator),
            )
        }
        "replace" => {
            strict(&|| Datum::Text(arg(0).to_text(false).replace(&arg(1).to_text(false), &arg(2).to_text(false))))
        }
        "substr" | "substring" => substring(&arg(0), args.get(1), args.get(2)),
        "btrim" | "trim" => strict(&|| Datum::Text(arg(0).to_text(false).trim().to_string())),
        "ltrim" => strict(&|| Datum::Text(arg(0).to_text(false).trim_start().to_string())),
        "rtrim" => strict(&|| Datum::Text(arg(0).to_text(false).trim_end().to_string())),
        "quote_ident" => strict(&|| Datum::Text(quote_ident(&arg(0).to_text(false)))),
        "quote_literal" => strict(&|| Datum::Text(format!("'{}'", arg(0).to_text(false).replace('\'', "''")))),
        "split_part" => {
            strict(&|| split_part(&arg(0).to_text(false), &arg(1).to_text(false), arg(2).as_int().unwrap_or(1)))
        }
        "strpos" | "position" => strict(&|| {
            let haystack = arg(0).to_text(false);
            Datum::Int(haystack.find(&arg(1).to_text(false)).map_or(0, |i| haystack[..i].chars().count() as i64 + 1))
        }),
        "starts_with" => strict(&|| Datum::Bool(arg(0).to_text(false).starts_with(&arg(1).to_text(false)))),
        "array_to_string" => match arg(0) {
            Datum::Array(items) => {
                let separator = text(1).unwrap_or_default();
                let null = text(2);
                let parts: Vec<String> = items
                    .iter()
                    .filter_map(|i| if i.is_null() { null.clone() } else { Some(i.to_text(false)) })
                    .collect();
                Datum::Text(parts.join(&separator))
            }
            _ => Datum::Null,
        },
        "array_length" | "array_upper" | "cardinality" => match arg(0) {
            Datum::Array(items) if !items.is_empty() => Datum::Int(items.len() as i64),
            Datum::Array(_) if name == "cardinality" => Datum::Int(0),
            _ => Datum::Null,
        },
        "array_lower" => match arg(0) {
            Datum::Array(items) if !items.is_empty() => Datum::Int(1),
            _ => Datum::Null,
        },
        "array_position" => match arg(0) {
            Datum::Array(items) => items
                .iter()
                .position(|i| equals(i, &arg(1)).is_true())
                .map_or(Datum::Null, |p| Datum::Int(p as i64 + 1)),
            _ => Datum::Null,
        },
        "string_to_array" => strict(&|| {
            let separator = arg(1).to_text(false);
            Datum::Array(arg(0).to_text(false).split(separator.as_str()).map(Datum::text).collect())
        }),
        "abs" => strict(&|| match arg(0) {
            Datum::Int(v) => Datum::Int(v.abs()),
            other => Datum::Float(float(&other).abs()),
        }),
        "round" | "ceil" | "ceiling" | "floor" => strict(&|| {
            let v = float(&arg(0));
            Datum::Float(match name {
                "round" => v.round(),
                "floor" => v.floor(),
                _ => v.ceil(),
            })
        }),
        "set_config" => return Err(EngineError::unsupported("set_config() (use SET)")),
        "json_build_object" => {
            let fields: Vec<String> = args
                .chunks(2)
                .map(|pair| format!("{} : {}", json(&pair[0]), json(pair.get(1).unwrap_or(&Datum::Null))))
                .collect();
            Datum::Text(format!("{{{}}}", fields.join(", ")))
        }
        other => return Err(EngineError::UndefinedFunction(format!("function {other}() does not exist"))),
    })
}

/// A value as JSON text.
fn json(datum: &Datum) -> String {
    match datum {
        Datum::Null => "null".into(),
        Datum::Bool(b) => b.to_string(),
        Datum::Int(v) => v.to_string(),
        Datum::Float(v) => crate::types::format_float(*v),
        Datum::Text(t) => format!("\"{}\"", t.replace('\\', "\\\\").replace('"', "\\\"")),
        Datum::Array(items) => format!("[{}]", items.iter().map(json).collect::<Vec<_>>().join(", ")),
    }
}

fn extreme(args: &[Datum], greatest: bool) -> Datum {
    args.iter()
        .filter(|a| !a.is_null())
        .cloned()
        .reduce(|best, next| {
            let order = compare(&next, &best).unwrap_or(Ordering::Equal);
            if (order == Ordering::Greater) == greatest && order != Ordering::Equal {
                next
            } else {
                best
            }
        })
        .unwrap_or(Datum::Null)
}

fn split_part(text: &str, separator: &str, field: i64) -> Datum {
    let parts: Vec<&str> = if separator.is_empty() { vec![text] } else { text.split(separator).collect() };
    let index = if field > 0 { field - 1 } else { parts.len() as i64 + field };
    Datum::text(usize::try_from(index).ok().and_then(|i| parts.get(i)).copied().unwrap_or(""))
}

fn quote_ident(name: &str) -> String {
    let plain = !name.is_empty()
        && name.chars().next().is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if plain {
        name.to_string()
    } else {
        format!("\"{}\"", name.replace('"', "\"\""))
    }
}

fn size_pretty(bytes: i64) -> String {
    let units = ["bytes", "kB", "MB", "GB", "TB"];
    let mut value = bytes;
    let mut unit = 0;
    while value.abs() >= 10 * 1024 && unit < units.len() - 1 {
        value = (value + 512) / 1024;
        unit += 1;
    }
    format!("{value} {}", units[unit])
}

fn is_index_oid(oid: i64, context: &Context<'_>) -> bool {
    context.catalog.tables().iter().any(|t| tables::table_indexes(t).iter().any(|i| i.oid == oid))
}

/// What a size function counts of a table.
#[derive(Clone, Copy, PartialEq)]
enum Sizes {
    /// The relation itself (a table's columns and dictionaries, or one index).
    Relation,
    /// A table's indexes.
    Indexes,
    /// A table with its indexes.
    Total,
}

/// Bytes in memory of a table or index, as the size functions report them. A unique index
/// (primary key, UNIQUE) holds its keys in a hash set, measured; an index that is not unique is
/// a catalog entry only (no lookup uses it), 0 bytes. The system catalogs are computed when
/// read: 0. An unknown oid: NULL, as PostgreSQL.
fn relation_size(oid: &Datum, context: &Context<'_>, sizes: Sizes) -> Datum {
    let Some(oid) = oid.as_int() else { return Datum::Null };
    if CATALOG_OIDS.iter().any(|(_, catalog)| *catalog == oid) {
        return Datum::Int(0);
    }
    for table in context.catalog.tables() {
        let unique = table.constraints.unique.len();
        let index_bytes = |k: usize| if k < unique { table.unique_index_bytes(k) } else { 0 };
        let indexes = tables::table_indexes(&table);
        if i64::from(table.oid) == oid {
            let all_indexes: usize = (0..indexes.len()).map(index_bytes).sum();
            let bytes = match sizes {
                Sizes::Relation => table.bytes(),
                Sizes::Indexes => all_indexes,
                Sizes::Total => table.bytes() + all_indexes,
            };
            return Datum::Int(bytes as i64);
        }
        if let Some(k) = indexes.iter().position(|index| index.oid == oid) {
            return Datum::Int(if sizes == Sizes::Indexes { 0 } else { index_bytes(k) as i64 });
        }
    }
    Datum::Null
}

/// pg_get_indexdef (by index OID) / pg_get_constraintdef (by constraint OID).
fn definition(
    oid: &Datum,
    context: &Context<'_>,
    describe: fn(&crate::storage::Table, &tables::IndexEntry) -> String,
    constraint: bool,
) -> Datum {
    let Some(oid) = oid.as_int() else { return Datum::Null };
    for table in context.catalog.tables() {
        for index in tables::table_indexes(&table) {
            let matches = if constraint { index.constraint == Some(oid) } else { index.oid == oid };
            if matches {
                return Datum::Text(describe(&table, &index));
            }
        }
    }
    Datum::Null
}

/// An aggregate over the argument rows of one group.
pub fn aggregate(name: &str, star: bool, rows: &[Vec<Datum>]) -> Result<Datum> {
    let first: Vec<&Datum> = rows.iter().filter_map(|r| r.first()).collect();
    let present: Vec<&Datum> = first.iter().copied().filter(|d| !d.is_null()).collect();
    Ok(match name {
        "count" if star => Datum::Int(rows.len() as i64),
        "count" => Datum::Int(present.len() as i64),
        "min" | "max" => extreme(&present.into_iter().cloned().collect::<Vec<_>>(), name == "max"),
        "sum" if present.is_empty() => Datum::Null,
        "sum" => present.iter().try_fold(Datum::Int(0), |total, value| arithmetic("+", &total, value))?,
        "avg" if present.is_empty() => Datum::Null,
        "avg" => Datum::Float(present.iter().map(|d| float(d)).sum::<f64>() / present.len() as f64),
        "array_agg" if first.is_empty() => Datum::Null,
        "array_agg" => Datum::Array(first.into_iter().cloned().collect()),
        "string_agg" if present.is_empty() => Datum::Null,
        "string_agg" => {
            let separator = rows.first().and_then(|r| r.get(1)).map(|s| s.to_text(false)).unwrap_or_default();
            Datum::Text(present.iter().map(|d| d.to_text(false)).collect::<Vec<_>>().join(&separator))
        }
        "bool_and" | "every" if present.is_empty() => Datum::Null,
        "bool_and" | "every" => Datum::Bool(present.iter().all(|d| d.is_true())),
        "bool_or" if present.is_empty() => Datum::Null,
        "bool_or" => Datum::Bool(present.iter().any(|d| d.is_true())),
        other => return Err(EngineError::UndefinedFunction(format!("aggregate {other} does not exist"))),
    })
}
