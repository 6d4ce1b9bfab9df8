//! Extended-protocol parameters: `$n` placeholders replaced by SQL literals before parsing.
//! Every value is checked and spelled as a typed literal (`CAST('…' AS date)`, numbers as
//! numbers), so a parameter can never change the statement's structure.

use super::encode::{decode_numeric, Format, POSTGRES_EPOCH_DAYS};
use crate::error::EngineError;
use crate::types::{format_date, DataType};

/// PostgreSQL type OIDs of parameters we understand.
pub mod oid {
    pub const UNSPECIFIED: u32 = 0;
    pub const BOOL: u32 = 16;
    pub const BYTEA: u32 = 17;
    pub const NAME: u32 = 19;
    pub const INT8: u32 = 20;
    pub const INT2: u32 = 21;
    pub const INT4: u32 = 23;
    pub const TEXT: u32 = 25;
    pub const OID: u32 = 26;
    pub const JSON: u32 = 114;
    pub const FLOAT4: u32 = 700;
    pub const FLOAT8: u32 = 701;
    pub const UNKNOWN: u32 = 705;
    pub const BPCHAR: u32 = 1042;
    pub const VARCHAR: u32 = 1043;
    pub const DATE: u32 = 1082;
    pub const NUMERIC: u32 = 1700;
    pub const JSONB: u32 = 3802;
}

/// Placeholder positions: (byte range, parameter number), outside quotes, identifiers and
/// comments.
fn placeholders(sql: &str) -> Vec<(std::ops::Range<usize>, usize)> {
    let bytes = sql.as_bytes();
    let mut found = Vec::new();
    let mut quote: Option<u8> = None;
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        match quote {
            Some(q) if b == q => quote = None,
            Some(_) => {}
            None if b == b'\'' || b == b'"' => quote = Some(b),
            None if b == b'-' && bytes.get(i + 1) == Some(&b'-') => {
                i = bytes[i..].iter().position(|&c| c == b'\n').map_or(bytes.len(), |p| i + p);
            }
            None if b == b'$' && i > 0 && (bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_') => {}
            None if b == b'$' => {
                let digits = bytes[i + 1..].iter().take_while(|c| c.is_ascii_digit()).count();
                if digits > 0 {
                    let number = sql[i + 1..i + 1 + digits].parse().unwrap_or(0);
                    found.push((i..i + 1 + digits, number));
                    i += digits;
                }
            }
            None => {}
        }
        i += 1;
    }
    found
}

/// Number of parameters (the highest `$n`).
pub fn placeholder_count(sql: &str) -> usize {
    placeholders(sql).iter().map(|(_, n)| *n).max().unwrap_or(0)
}

fn replace(sql: &str, literal: impl Fn(usize) -> Result<String, EngineError>) -> Result<String, EngineError> {
    let mut out = String::with_capacity(sql.len());
    let mut last = 0;
    for (range, number) in placeholders(sql) {
        out.push_str(&sql[last..range.start]);
        out.push_str(&literal(number)?);
        last = range.end;
    }
    out.push_str(&sql[last..]);
    Ok(out)
}

/// The statement with every parameter as a sentinel literal (to describe it before Bind).
pub fn with_sentinels(sql: &str) -> String {
    replace(sql, |n| Ok(format!("'{}{n}'", crate::bind::PARAMETER_SENTINEL))).unwrap_or_else(|_| sql.to_string())
}

fn quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// The OID of a parameter whose type was inferred from its use.
pub fn oid_of(data_type: DataType) -> u32 {
    data_type.pg_oid()
}

/// The statement with `values` as literals. `types[i]` is parameter i+1's OID (declared by
/// the client or inferred); `formats` are the Bind's parameter format codes.
pub fn substitute(sql: &str, types: &[u32], formats: &[i16], values: &[Option<&[u8]>]) -> Result<String, EngineError> {
    let formats = Format::expand(formats, values.len())?;
    replace(sql, |number| {
        let index = number.checked_sub(1).ok_or_else(|| EngineError::Syntax("parameter $0".into()))?;
        let value = values.get(index).ok_or_else(|| EngineError::Syntax(format!("there is no parameter ${number}")))?;
        let oid = types.get(index).copied().unwrap_or(oid::UNSPECIFIED);
        match value {
            None => Ok(null_literal(oid)),
            Some(bytes) => match formats[index] {
                Format::Binary => binary_literal(bytes, oid),
                Format::Text => text_literal(bytes, oid),
            },
        }
    })
}

fn sql_type_name(oid: u32) -> Option<&'static str> {
    Some(match oid {
        oid::BOOL => "boolean",
        oid::INT2 | oid::INT4 => "integer",
        oid::INT8 => "bigint",
        oid::FLOAT4 | oid::FLOAT8 => "double precision",
        oid::NUMERIC => "numeric",
        oid::DATE => "date",
        oid::TEXT | oid::VARCHAR | oid::BPCHAR | oid::NAME => "text",
        _ => return None,
    })
}

fn null_literal(oid: u32) -> String {
    match sql_type_name(oid) {
        Some(name) => format!("CAST(NULL AS {name})"),
        None => "NULL".into(),
    }
}

fn text_literal(bytes: &[u8], oid: u32) -> Result<String, EngineError> {
    let text = crate::error::utf8(bytes)?;
    Ok(match oid {
        oid::INT2 | oid::INT4 | oid::INT8 | oid::OID => integer_literal(
            text.trim()
                .parse::<i64>()
                .map_err(|_| EngineError::InvalidValue(format!("invalid input syntax for type integer: \"{text}\"")))?,
        ),
        oid::FLOAT4 | oid::FLOAT8 => {
            float_literal(crate::copy::parse_field(text, DataType::Float64)?.as_f64().unwrap_or(f64::NAN))
        }
        oid::NUMERIC => numeric_literal(text)?,
        oid::BOOL => match crate::copy::parse_field(text, DataType::Bool)? {
            crate::types::Value::Bool(true) => "TRUE".into(),
            _ => "FALSE".into(),
        },
        oid::DATE => format!("CAST({} AS date)", quote(text)),
        oid::BYTEA => return Err(EngineError::unsupported("bytea parameters")),
        _ => quote(text),
    })
}

fn integer_literal(value: i64) -> String {
    if value < 0 {
        format!("({value})")
    } else {
        value.to_string()
    }
}

fn float_literal(value: f64) -> String {
    if value.is_finite() {
        let text = format!("{value:?}");
        format!("CAST({} AS double precision)", if value < 0.0 { format!("({text})") } else { text })
    } else {
        format!("CAST({} AS double precision)", quote(&crate::types::format_float(value)))
    }
}

fn numeric_literal(text: &str) -> Result<String, EngineError> {
    let trimmed = text.trim();
    let digits = trimmed.strip_prefix(['-', '+']).unwrap_or(trimmed);
    let valid = !digits.is_empty()
        && digits.chars().all(|c| c.is_ascii_digit() || c == '.')
        && digits.matches('.').count() <= 1
        && digits != ".";
    if !valid {
        return Err(EngineError::InvalidValue(format!("invalid input syntax for type numeric: \"{text}\"")));
    }
    Ok(if trimmed.starts_with('-') { format!("({trimmed})") } else { digits.to_string() })
}

fn fixed<const N: usize>(bytes: &[u8], type_name: &str) -> Result<[u8; N], EngineError> {
    bytes
        .try_into()
        .map_err(|_| EngineError::Protocol(format!("binary {type_name} parameter of {} bytes", bytes.len())))
}

fn binary_literal(bytes: &[u8], oid: u32) -> Result<String, EngineError> {
    Ok(match oid {
        oid::BOOL => if fixed::<1>(bytes, "bool")?[0] != 0 { "TRUE" } else { "FALSE" }.into(),
        oid::INT2 => integer_literal(i64::from(i16::from_be_bytes(fixed(bytes, "int2")?))),
        oid::INT4 => integer_literal(i64::from(i32::from_be_bytes(fixed(bytes, "int4")?))),
        oid::OID => integer_literal(i64::from(u32::from_be_bytes(fixed(bytes, "oid")?))),
        oid::INT8 => integer_literal(i64::from_be_bytes(fixed(bytes, "int8")?)),
        oid::FLOAT4 => float_literal(f64::from(f32::from_be_bytes(fixed(bytes, "float4")?))),
        oid::FLOAT8 => float_literal(f64::from_be_bytes(fixed(bytes, "float8")?)),
        oid::NUMERIC => numeric_literal(&decode_numeric(bytes)?)?,
        oid::DATE => {
            let days = i32::from_be_bytes(fixed(bytes, "date")?);
            let days = days
                .checked_add(POSTGRES_EPOCH_DAYS)
                .ok_or_else(|| EngineError::DatetimeOutOfRange("binary date parameter".into()))?;
            format!("CAST('{}' AS date)", format_date(days))
        }
        oid::TEXT | oid::VARCHAR | oid::BPCHAR | oid::NAME | oid::UNKNOWN | oid::JSON | oid::UNSPECIFIED => {
            text_literal(bytes, oid::TEXT)?
        }
        oid::JSONB => match bytes.split_first() {
            Some((1, text)) => text_literal(text, oid::TEXT)?,
            _ => return Err(EngineError::Protocol("binary jsonb parameter of an unknown version".into())),
        },
        other => return Err(EngineError::unsupported(format!("binary parameters of type oid {other}"))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: placeholders are found outside quotes and comments only; method: fixed statements.
    #[test]
    fn finds_placeholders_outside_quotes() {
        assert_eq!(placeholder_count("select $1, '$2', $3"), 3);
        let described = with_sentinels("select a from t where b = $1 and c = '$1'");
        assert_eq!(described, format!("select a from t where b = '{}1' and c = '$1'", crate::bind::PARAMETER_SENTINEL));
        assert_eq!(placeholder_count("select 1 -- $4\n"), 0);
        assert_eq!(placeholder_count("select 1"), 0);
    }

    // Goal: every binary type becomes the literal PostgreSQL would read, NULLs stay typed and a
    // quote inside text cannot escape its literal; method: fixed values.
    #[test]
    fn literals_for_every_type() {
        let sql = "select $1, $2, $3, $4, $5, $6, $7, $8";
        let date = 31i32.to_be_bytes();
        let mut numeric = Vec::new();
        super::super::encode::encode_numeric(-12_345, 2, &mut numeric);
        let values: Vec<Option<&[u8]>> = vec![
            Some(&[1]),
            Some(&[0xff, 0xff, 0xff, 0xfe]),
            Some(&[0, 0, 0, 0, 0, 0, 0, 9]),
            Some(&[0x40, 0x09, 0x21, 0xfb, 0x54, 0x44, 0x2d, 0x18]),
            Some(&date),
            Some(&numeric),
            Some(b"it's"),
            None,
        ];
        let types = [oid::BOOL, oid::INT4, oid::INT8, oid::FLOAT8, oid::DATE, oid::NUMERIC, oid::TEXT, oid::INT4];
        let out = substitute(sql, &types, &[1, 1, 1, 1, 1, 1, 1, 1], &values).expect("valid");
        assert_eq!(
            out,
            "select TRUE, (-2), 9, CAST(3.141592653589793 AS double precision), CAST('2000-02-01' AS date), (-123.45), 'it''s', CAST(NULL AS integer)"
        );
        let text =
            substitute("select $1, $2", &[oid::INT4, oid::NUMERIC], &[0], &[Some(b"-7"), Some(b"1.5")]).expect("valid");
        assert_eq!(text, "select (-7), 1.5");
        assert!(substitute("select $1", &[oid::INT4], &[0], &[Some(b"1; drop table t")]).is_err());
    }
}
