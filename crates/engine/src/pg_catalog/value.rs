//! Values of the catalog interpreter: a few dynamic kinds (the catalogs are small and
//! row-shaped), PostgreSQL's type of each output column, and their wire forms.

use std::cmp::Ordering;

use crate::error::{EngineError, Result};

/// One value.
#[derive(Debug, Clone, PartialEq)]
pub enum Datum {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Text(String),
    Array(Vec<Datum>),
}

/// The PostgreSQL type a column of catalog output has (its OID goes to RowDescription).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PgType {
    Bool,
    Char,
    Name,
    Int2,
    Int4,
    Int8,
    Oid,
    Float4,
    Float8,
    Text,
    /// `int2vector`, `oidvector`: space-separated on the wire, subscripts from 0.
    Int2Vector,
    OidVector,
    BoolArray,
    TextArray,
    NameArray,
    Int2Array,
    Int4Array,
    Int8Array,
    OidArray,
    CharArray,
    Float4Array,
}

impl PgType {
    pub fn oid(self) -> u32 {
        match self {
            PgType::Bool => 16,
            PgType::Char => 18,
            PgType::Name => 19,
            PgType::Int8 => 20,
            PgType::Int2 => 21,
            PgType::Int2Vector => 22,
            PgType::Int4 => 23,
            PgType::Text => 25,
            PgType::Oid => 26,
            PgType::OidVector => 30,
            PgType::Float4 => 700,
            PgType::Float8 => 701,
            PgType::BoolArray => 1000,
            PgType::CharArray => 1002,
            PgType::NameArray => 1003,
            PgType::Int2Array => 1005,
            PgType::Int4Array => 1007,
            PgType::TextArray => 1009,
            PgType::Int8Array => 1016,
            PgType::Float4Array => 1021,
            PgType::OidArray => 1028,
        }
    }

    /// The array type of this element type (ARRAY[…], array_agg).
    pub fn array_of(self) -> PgType {
        match self {
            PgType::Int2 => PgType::Int2Array,
            PgType::Int4 => PgType::Int4Array,
            PgType::Int8 => PgType::Int8Array,
            PgType::Oid => PgType::OidArray,
            PgType::Name => PgType::NameArray,
            PgType::Char => PgType::CharArray,
            PgType::Float4 | PgType::Float8 => PgType::Float4Array,
            PgType::Bool => PgType::BoolArray,
            _ => PgType::TextArray,
        }
    }

    pub fn is_array(self) -> bool {
        matches!(
            self,
            PgType::TextArray
                | PgType::BoolArray
                | PgType::NameArray
                | PgType::Int2Array
                | PgType::Int4Array
                | PgType::Int8Array
                | PgType::OidArray
                | PgType::CharArray
                | PgType::Float4Array
                | PgType::Int2Vector
                | PgType::OidVector
        )
    }

    /// The type a value of this kind has when nothing declares one.
    pub fn of(datum: &Datum) -> Option<PgType> {
        Some(match datum {
            Datum::Null => return None,
            Datum::Bool(_) => PgType::Bool,
            Datum::Int(_) => PgType::Int8,
            Datum::Float(_) => PgType::Float8,
            Datum::Text(_) => PgType::Text,
            Datum::Array(items) => items.iter().find_map(PgType::of).map_or(PgType::TextArray, PgType::array_of),
        })
    }
}

impl Datum {
    pub fn text(value: impl Into<String>) -> Datum {
        Datum::Text(value.into())
    }

    pub fn is_null(&self) -> bool {
        matches!(self, Datum::Null)
    }

    /// SQL truth: NULL is not true.
    pub fn is_true(&self) -> bool {
        match self {
            Datum::Bool(b) => *b,
            Datum::Text(t) => matches!(t.as_str(), "t" | "true" | "on" | "yes" | "1"),
            _ => false,
        }
    }

    pub fn as_int(&self) -> Option<i64> {
        match self {
            Datum::Int(v) => Some(*v),
            Datum::Float(v) => Some(*v as i64),
            Datum::Text(t) => t.trim().parse().ok(),
            Datum::Bool(b) => Some(i64::from(*b)),
            _ => None,
        }
    }

    pub fn as_text(&self) -> Option<String> {
        match self {
            Datum::Null => None,
            other => Some(other.to_text(false)),
        }
    }

    /// PostgreSQL's text output; `int2vector` style (space-separated) when `vector`.
    pub fn to_text(&self, vector: bool) -> String {
        match self {
            Datum::Null => String::new(),
            Datum::Bool(b) => if *b { "t" } else { "f" }.into(),
            Datum::Int(v) => v.to_string(),
            Datum::Float(v) => crate::types::format_float(*v),
            Datum::Text(t) => t.clone(),
            Datum::Array(items) if vector => items.iter().map(|i| i.to_text(false)).collect::<Vec<_>>().join(" "),
            Datum::Array(items) => {
                let parts: Vec<String> = items.iter().map(array_element).collect();
                format!("{{{}}}", parts.join(","))
            }
        }
    }
}

/// One element of an array's text form: NULL, or quoted when it must be.
fn array_element(item: &Datum) -> String {
    match item {
        Datum::Null => "NULL".into(),
        Datum::Array(_) => item.to_text(false),
        other => {
            let text = other.to_text(false);
            let plain = !text.is_empty()
                && !text.eq_ignore_ascii_case("null")
                && !text.chars().any(|c| matches!(c, '{' | '}' | ',' | '"' | '\\') || c.is_whitespace());
            if plain {
                text
            } else {
                format!("\"{}\"", text.replace('\\', "\\\\").replace('"', "\\\""))
            }
        }
    }
}

/// Compares two non-null values the way PostgreSQL would after coercing an untyped literal
/// to the other side's type; `None` when they do not compare.
pub fn compare(a: &Datum, b: &Datum) -> Option<Ordering> {
    match (a, b) {
        (Datum::Null, _) | (_, Datum::Null) => None,
        (Datum::Int(x), Datum::Int(y)) => Some(x.cmp(y)),
        (Datum::Int(x), Datum::Float(y)) => (*x as f64).partial_cmp(y),
        (Datum::Float(x), Datum::Int(y)) => x.partial_cmp(&(*y as f64)),
        (Datum::Float(x), Datum::Float(y)) => x.partial_cmp(y),
        (Datum::Bool(x), Datum::Bool(y)) => Some(x.cmp(y)),
        (Datum::Text(x), Datum::Text(y)) => Some(x.cmp(y)),
        (Datum::Int(_) | Datum::Float(_), Datum::Text(t)) => {
            let parsed = if t.contains(['.', 'e', 'E']) {
                t.trim().parse().ok().map(Datum::Float)
            } else {
                t.trim().parse().ok().map(Datum::Int)
            };
            compare(a, &parsed?)
        }
        (Datum::Text(_), Datum::Int(_) | Datum::Float(_)) => compare(b, a).map(Ordering::reverse),
        (Datum::Bool(x), Datum::Text(_)) => Some(x.cmp(&b.is_true())),
        (Datum::Text(_), Datum::Bool(y)) => Some(a.is_true().cmp(y)),
        (Datum::Array(x), Datum::Array(y)) => {
            for (p, q) in x.iter().zip(y) {
                match compare(p, q)? {
                    Ordering::Equal => continue,
                    other => return Some(other),
                }
            }
            Some(x.len().cmp(&y.len()))
        }
        _ => None,
    }
}

/// Equality as `=`: NULL when either side is NULL.
pub fn equals(a: &Datum, b: &Datum) -> Datum {
    match compare(a, b) {
        _ if a.is_null() || b.is_null() => Datum::Null,
        Some(order) => Datum::Bool(order == Ordering::Equal),
        None => Datum::Bool(false),
    }
}

/// Ordering for ORDER BY: NULLs last (PostgreSQL's default for ascending order).
pub fn sort_order(a: &Datum, b: &Datum) -> Ordering {
    match (a.is_null(), b.is_null()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        (false, false) => compare(a, b).unwrap_or(Ordering::Equal),
    }
}

/// PostgreSQL's binary send format of a value of `pg_type` (arrays: one dimension).
pub fn binary(datum: &Datum, pg_type: PgType, out: &mut Vec<u8>) -> Result<()> {
    let int = || datum.as_int().ok_or_else(|| EngineError::Type(format!("{datum:?} is not an integer")));
    match pg_type {
        PgType::Bool => out.push(u8::from(datum.is_true())),
        PgType::Char => out.push(datum.to_text(false).bytes().next().unwrap_or(0)),
        PgType::Int2 => out.extend_from_slice(&(int()? as i16).to_be_bytes()),
        PgType::Int4 => out.extend_from_slice(&(int()? as i32).to_be_bytes()),
        PgType::Oid => out.extend_from_slice(&(int()? as u32).to_be_bytes()),
        PgType::Int8 => out.extend_from_slice(&int()?.to_be_bytes()),
        PgType::Float4 => out.extend_from_slice(&(float(datum) as f32).to_bits().to_be_bytes()),
        PgType::Float8 => out.extend_from_slice(&float(datum).to_bits().to_be_bytes()),
        PgType::Text | PgType::Name => out.extend_from_slice(datum.to_text(false).as_bytes()),
        array => binary_array(datum, array, out)?,
    }
    Ok(())
}

fn float(datum: &Datum) -> f64 {
    match datum {
        Datum::Float(v) => *v,
        Datum::Int(v) => *v as f64,
        other => other.to_text(false).parse().unwrap_or(f64::NAN),
    }
}

fn element_type(array: PgType) -> PgType {
    match array {
        PgType::Int2Array | PgType::Int2Vector => PgType::Int2,
        PgType::Int4Array => PgType::Int4,
        PgType::Int8Array => PgType::Int8,
        PgType::OidArray | PgType::OidVector => PgType::Oid,
        PgType::NameArray => PgType::Name,
        PgType::CharArray => PgType::Char,
        PgType::Float4Array => PgType::Float4,
        PgType::BoolArray => PgType::Bool,
        _ => PgType::Text,
    }
}

fn binary_array(datum: &Datum, array: PgType, out: &mut Vec<u8>) -> Result<()> {
    let items: &[Datum] = match datum {
        Datum::Array(items) => items,
        other => return Err(EngineError::Type(format!("{other:?} is not an array"))),
    };
    let element = element_type(array);
    out.extend_from_slice(&1i32.to_be_bytes());
    out.extend_from_slice(&i32::from(items.iter().any(Datum::is_null)).to_be_bytes());
    out.extend_from_slice(&element.oid().to_be_bytes());
    out.extend_from_slice(&(items.len() as i32).to_be_bytes());
    let lower = if matches!(array, PgType::Int2Vector | PgType::OidVector) { 0i32 } else { 1 };
    out.extend_from_slice(&lower.to_be_bytes());
    for item in items {
        if item.is_null() {
            out.extend_from_slice(&(-1i32).to_be_bytes());
            continue;
        }
        let at = out.len();
        out.extend_from_slice(&[0; 4]);
        binary(item, element, out)?;
        let length = (out.len() - at - 4) as i32;
        out[at..at + 4].copy_from_slice(&length.to_be_bytes());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: text forms match PostgreSQL's (arrays quoted where needed, vectors space-separated)
    // and untyped literals compare as numbers against numbers; method: fixed values.
    #[test]
    fn text_forms_and_comparisons() {
        let array = Datum::Array(vec![Datum::text("a"), Datum::text("b c"), Datum::Null, Datum::text("")]);
        assert_eq!(array.to_text(false), "{a,\"b c\",NULL,\"\"}");
        assert_eq!(Datum::Array(vec![Datum::Int(1), Datum::Int(3)]).to_text(true), "1 3");
        assert_eq!(compare(&Datum::Int(16384), &Datum::text("16384")), Some(Ordering::Equal));
        assert_eq!(equals(&Datum::Null, &Datum::Int(1)), Datum::Null);
        assert_eq!(sort_order(&Datum::Null, &Datum::Int(1)), Ordering::Greater);
    }
}
