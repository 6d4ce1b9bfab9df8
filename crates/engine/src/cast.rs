//! Casts between the engine's types, with PostgreSQL's rules: integers and numerics round
//! half away from zero, floats to integers round half to even (`rint`), every narrowing
//! conversion checks its range (`22003`), text parses with each type's input syntax (`22P02`).

use std::sync::Arc;

use crate::datetime;
use crate::error::{EngineError, Result};
use crate::interval::Interval;
use crate::numeric::Numeric;
use crate::storage::Dictionary;
use crate::types::{format_date, parse_date, pow10, DataType, Value};
use crate::vector::{Data, Vector};

/// Whether `CAST(x AS to)` exists for an `x` of type `from` (PostgreSQL's pg_cast, for the
/// types the engine has).
pub fn can_cast(from: DataType, to: DataType) -> bool {
    use DataType as T;
    from == to
        || from.is_text()
        || to.is_text()
        || (from.is_numeric() && to.is_numeric())
        || matches!((from, to), (T::Bool, T::Int32) | (T::Int32, T::Bool))
        || (is_datetime(from) && is_datetime(to))
}

/// date, timestamp and timestamp with time zone, which cast to one another.
fn is_datetime(t: DataType) -> bool {
    matches!(t, DataType::Date | DataType::Timestamp | DataType::TimestampTz)
}

pub fn cannot_cast(from: DataType, to: DataType) -> EngineError {
    EngineError::CannotCast(format!("cannot cast type {} to {}", from.sql_name(), to.sql_name()))
}

fn out_of_range(to: DataType) -> EngineError {
    EngineError::Overflow(match to {
        DataType::Int16 => "smallint out of range".into(),
        DataType::Int32 => "integer out of range".into(),
        DataType::Int64 => "bigint out of range".into(),
        DataType::Float64 | DataType::Float32 => "value out of range: overflow".into(),
        DataType::Decimal { precision, scale } => format!(
            "numeric field overflow: a field with precision {precision}, scale {scale} must round to an absolute value less than 10^{}",
            i32::from(precision) - i32::from(scale)
        ),
        other => format!("value out of range for type {}", other.sql_name()),
    })
}

/// Converts a vector to `to`. NULL rows stay NULL and are never checked.
pub fn cast(vector: Vector, to: DataType) -> Result<Vector> {
    let from = vector.data_type;
    if from == to {
        return Ok(vector);
    }
    if !can_cast(from, to) {
        return Err(cannot_cast(from, to));
    }
    let valid = |row: usize| vector.is_valid(row);
    let data = match (&vector.data, to) {
        (Data::Text(codes, dictionary), _) if to.is_text() => limit_text(codes, dictionary, &vector, to)?,
        (_, DataType::Text) => to_text(&vector),
        (_, DataType::Char(_) | DataType::Varchar(_)) => {
            let text = Vector { data_type: DataType::Text, data: to_text(&vector), validity: vector.validity.clone() };
            return cast(text, to);
        }
        (Data::Text(codes, dictionary), _) => from_text(codes, dictionary, &vector, to)?,
        (Data::Bool(v), DataType::Int32) => Data::I32(v.iter().map(|&b| i32::from(b)).collect()),
        (Data::I32(v), DataType::Bool) => Data::Bool(v.iter().map(|&x| x != 0).collect()),
        (Data::I32(v), _) if from != DataType::Date => from_integers(v.iter().map(|&x| i64::from(x)), to, valid)?,
        (Data::I64(v), _) if matches!(from, DataType::Decimal { .. }) => from_decimal(v, from.scale(), to, valid)?,
        (Data::I64(v), _) if from == DataType::Int64 => from_integers(v.iter().copied(), to, valid)?,
        (Data::F64(v), _) if from == DataType::Float32 => from_float32s(v, to, valid)?,
        (Data::F64(v), _) => from_floats(v, to, valid)?,
        (Data::Numeric(v), _) => from_numerics(v, to, valid)?,
        (Data::I32(v), DataType::Timestamp | DataType::TimestampTz) if from == DataType::Date => {
            Data::I64(v.iter().map(|&d| datetime::timestamp_of_date(d)).collect())
        }
        (Data::I64(v), DataType::Date) => Data::I32(convert(v.iter().copied(), 0, valid, datetime::date_of_timestamp)?),
        // The engine's one time zone is UTC (`datetime::check_time_zone`): the instant is the same.
        (Data::I64(v), DataType::Timestamp | DataType::TimestampTz) => Data::I64(v.clone()),
        _ => return Err(cannot_cast(from, to)),
    };
    Ok(Vector { data_type: to, data, validity: vector.validity })
}

/// Maps every valid row through `f`; invalid rows get a placeholder.
fn convert<T: Copy, U: Copy>(
    values: impl Iterator<Item = T>,
    placeholder: U,
    valid: impl Fn(usize) -> bool,
    f: impl Fn(T) -> Result<U>,
) -> Result<Vec<U>> {
    values.enumerate().map(|(row, x)| if valid(row) { f(x) } else { Ok(placeholder) }).collect()
}

fn from_integers(values: impl Iterator<Item = i64>, to: DataType, valid: impl Fn(usize) -> bool) -> Result<Data> {
    Ok(match to {
        DataType::Int16 => {
            Data::I32(convert(values, 0, valid, |x| i16::try_from(x).map(i32::from).map_err(|_| out_of_range(to)))?)
        }
        DataType::Int32 => Data::I32(convert(values, 0, valid, |x| i32::try_from(x).map_err(|_| out_of_range(to)))?),
        DataType::Int64 => Data::I64(values.collect()),
        DataType::Float64 => Data::F64(values.map(|x| x as f64).collect()),
        DataType::Float32 => Data::F64(values.map(|x| f64::from(x as f32)).collect()),
        DataType::Numeric => Data::Numeric(values.map(Numeric::from_i64).collect()),
        DataType::Decimal { .. } => {
            Data::I64(convert(values, 0, valid, |x| decimal_from_numeric(Numeric::from_i64(x), to))?)
        }
        other => return Err(cannot_cast(DataType::Int64, other)),
    })
}

fn from_decimal(values: &[i64], scale: u8, to: DataType, valid: impl Fn(usize) -> bool) -> Result<Data> {
    let as_numeric = |x: i64| Numeric::new(i128::from(x), scale);
    Ok(match to {
        DataType::Float64 => {
            let divisor = pow10(scale) as f64;
            Data::F64(values.iter().map(|&x| x as f64 / divisor).collect())
        }
        DataType::Numeric => Data::Numeric(values.iter().map(|&x| as_numeric(x)).collect()),
        _ => from_numerics(&values.iter().map(|&x| as_numeric(x)).collect::<Vec<_>>(), to, valid)?,
    })
}

fn from_numerics(values: &[Numeric], to: DataType, valid: impl Fn(usize) -> bool) -> Result<Data> {
    let values = values.iter().copied();
    Ok(match to {
        DataType::Int16 => Data::I32(convert(values, 0, valid, |n| {
            i16::try_from(numeric_to_integer(n, to)?).map(i32::from).map_err(|_| out_of_range(to))
        })?),
        DataType::Int32 => Data::I32(convert(values, 0, valid, |n| {
            i32::try_from(numeric_to_integer(n, to)?).map_err(|_| out_of_range(to))
        })?),
        DataType::Float32 => Data::F64(convert(values, 0.0, valid, |n| Ok(f64::from(to_float32(n.to_f64())?)))?),
        DataType::Int64 => Data::I64(convert(values, 0, valid, |n| numeric_to_integer(n, to))?),
        // A finite numeric beyond double's range overflows; the special values convert.
        DataType::Float64 => {
            Data::F64(convert(
                values,
                0.0,
                valid,
                |n| if n.is_special() { Ok(n.to_f64()) } else { finite(n.to_f64()) },
            )?)
        }
        DataType::Decimal { .. } => Data::I64(convert(values, 0, valid, |n| decimal_from_numeric(n, to))?),
        DataType::Numeric => Data::Numeric(values.collect()),
        other => return Err(cannot_cast(DataType::Numeric, other)),
    })
}

/// A numeric rounded to a bigint, with numeric_int8's errors for NaN and the infinities
/// (named for the target type; PostgreSQL files them under 0A000, feature_not_supported).
fn numeric_to_integer(value: Numeric, to: DataType) -> Result<i64> {
    if value.is_nan() {
        return Err(EngineError::unsupported(format!("cannot convert NaN to {}", to.sql_name())));
    }
    if value.is_infinite() {
        return Err(EngineError::unsupported(format!("cannot convert infinity to {}", to.sql_name())));
    }
    value.to_i64().ok_or_else(|| out_of_range(to))
}

fn finite(value: f64) -> Result<f64> {
    if value.is_infinite() {
        return Err(out_of_range(DataType::Float64));
    }
    Ok(value)
}

fn from_floats(values: &[f64], to: DataType, valid: impl Fn(usize) -> bool) -> Result<Data> {
    let values = values.iter().copied();
    let integer = |x: f64, lo: f64, hi: f64| {
        let rounded = x.round_ties_even();
        // NaN fails both comparisons.
        if rounded >= lo && rounded < hi {
            Ok(rounded)
        } else {
            Err(out_of_range(to))
        }
    };
    Ok(match to {
        DataType::Int16 => Data::I32(convert(values, 0, valid, |x| Ok(integer(x, -32768.0, 32768.0)? as i32))?),
        DataType::Int32 => {
            Data::I32(convert(values, 0, valid, |x| Ok(integer(x, -2147483648.0, 2147483648.0)? as i32))?)
        }
        DataType::Float32 => Data::F64(convert(values, 0.0, valid, |x| Ok(f64::from(to_float32(x)?)))?),
        DataType::Int64 => Data::I64(convert(values, 0, valid, |x| {
            Ok(integer(x, -9.223372036854776e18, 9.223372036854776e18)? as i64)
        })?),
        DataType::Numeric => Data::Numeric(convert(values, Numeric::ZERO, valid, Numeric::from_f64)?),
        DataType::Decimal { .. } => {
            Data::I64(convert(values, 0, valid, |x| decimal_from_numeric(Numeric::from_f64(x)?, to))?)
        }
        other => return Err(cannot_cast(DataType::Float64, other)),
    })
}

/// A double as real: 22003 when a finite value overflows or a nonzero one underflows
/// (PostgreSQL's float8 → float4 checks).
fn to_float32(x: f64) -> Result<f32> {
    let rounded = x as f32;
    if rounded.is_infinite() && x.is_finite() {
        return Err(out_of_range(DataType::Float32));
    }
    if rounded == 0.0 && x != 0.0 {
        return Err(EngineError::Overflow("value out of range: underflow".into()));
    }
    Ok(rounded)
}

/// From real: to double exactly, to numeric with real's 6 significant digits (float4_numeric),
/// to the rest as a double would go.
fn from_float32s(values: &[f64], to: DataType, valid: impl Fn(usize) -> bool) -> Result<Data> {
    let as_numeric = |x: f64| -> Result<Numeric> {
        if !x.is_finite() {
            return Numeric::from_f64(x);
        }
        Numeric::parse(&format!("{:.5e}", x as f32)).map(Numeric::normalized)
    };
    Ok(match to {
        DataType::Float64 => Data::F64(values.to_vec()),
        DataType::Numeric => Data::Numeric(convert(values.iter().copied(), Numeric::ZERO, valid, as_numeric)?),
        DataType::Decimal { .. } => {
            Data::I64(convert(values.iter().copied(), 0, valid, |x| decimal_from_numeric(as_numeric(x)?, to))?)
        }
        _ => from_floats(values, to, valid)?,
    })
}

/// A numeric as `numeric(p, s)`: rounded to s digits, fewer than p digits in all.
pub fn decimal_from_numeric(value: Numeric, to: DataType) -> Result<i64> {
    let DataType::Decimal { precision, scale } = to else { unreachable!("decimal targets only") };
    // PostgreSQL's numeric(p, s) holds NaN; these scaled integers cannot.
    if value.is_nan() {
        return Err(EngineError::unsupported("NaN in numeric(p, s)"));
    }
    if value.is_infinite() {
        return Err(EngineError::Overflow(format!(
            "numeric field overflow: a field with precision {precision}, scale {scale} cannot hold an infinite value"
        )));
    }
    let rounded = value.rescale(scale).map_err(|_| out_of_range(to))?;
    let limit = crate::numeric::pow10_wide(u32::from(precision)).unwrap_or(i128::MAX);
    if rounded.mantissa.unsigned_abs() >= limit.unsigned_abs() {
        return Err(out_of_range(to));
    }
    i64::try_from(rounded.mantissa).map_err(|_| out_of_range(to))
}

fn to_text(vector: &Vector) -> Data {
    let mut dictionary = Dictionary::new();
    let codes = (0..vector.len())
        .map(|row| match vector.value(row) {
            Value::Null => dictionary.intern(""),
            Value::Bool(b) => dictionary.intern(if b { "true" } else { "false" }),
            Value::Date(days) => dictionary.intern(&format_date(days)),
            other => dictionary.intern(&other.to_string()),
        })
        .collect();
    Data::Text(codes, Arc::new(dictionary))
}

/// Text to text, character(n) or character varying(n), with PostgreSQL's assignment rule:
/// a longer value is an error (22001) unless the excess is blanks, which are cut off;
/// character(n) keeps no trailing blanks (they are insignificant and padded back on output).
/// Explicit casts, which truncate instead, cut the value first (`Binder` does).
fn limit_text(codes: &[u32], dictionary: &Arc<Dictionary>, vector: &Vector, to: DataType) -> Result<Data> {
    let from = vector.data_type;
    if to == DataType::Text && !matches!(from, DataType::Char(0)) {
        return Ok(Data::Text(codes.to_vec(), Arc::clone(dictionary)));
    }
    let convert = |text: &str| -> Result<String> {
        match (from, to) {
            // character(n) to bpchar: padded as it would be output.
            (DataType::Char(n), DataType::Char(0)) => Ok(crate::types::pad_char(text, n)),
            // bpchar to other strings: without its trailing blanks.
            (DataType::Char(0), _) => fit_text(text.trim_end_matches(' '), to),
            _ => fit_text(text, to),
        }
    };
    let mut limited: Vec<Option<String>> = vec![None; dictionary.len()];
    for (row, &code) in codes.iter().enumerate() {
        if vector.is_valid(row) && limited[code as usize].is_none() {
            limited[code as usize] = Some(convert(dictionary.get(code))?);
        }
    }
    let mut out = Dictionary::new();
    let codes = codes.iter().map(|&code| out.intern(limited[code as usize].as_deref().unwrap_or(""))).collect();
    Ok(Data::Text(codes, Arc::new(out)))
}

/// One string stored as `to` (see `limit_text`).
pub fn fit_text(text: &str, to: DataType) -> Result<String> {
    let (length, padded) = match to {
        DataType::Char(0) => return Ok(text.to_string()),
        DataType::Char(length) => (length as usize, true),
        DataType::Varchar(length) => (length as usize, false),
        _ => return Ok(text.to_string()),
    };
    let cut = text.char_indices().nth(length).map_or(text.len(), |(at, _)| at);
    if !text[cut..].chars().all(|c| c == ' ') {
        return Err(EngineError::StringTooLong(format!("value too long for type {}", to.sql_name())));
    }
    let kept = &text[..cut];
    Ok(if padded { kept.trim_end_matches(' ') } else { kept }.to_string())
}

/// Parses every dictionary entry a valid row uses, once.
fn from_text(codes: &[u32], dictionary: &Dictionary, vector: &Vector, to: DataType) -> Result<Data> {
    let mut parsed: Vec<Option<Value>> = vec![None; dictionary.len()];
    for (row, &code) in codes.iter().enumerate() {
        if vector.is_valid(row) && parsed[code as usize].is_none() {
            parsed[code as usize] = Some(parse_value(dictionary.get(code), to)?);
        }
    }
    let values: Vec<Value> = codes.iter().map(|&code| parsed[code as usize].clone().unwrap_or(Value::Null)).collect();
    Ok(Vector::from_values(&values, to).data)
}

/// Reads a value of type `to` from its text form (PostgreSQL's input functions).
pub fn parse_value(text: &str, to: DataType) -> Result<Value> {
    let invalid = || EngineError::InvalidValue(format!("invalid input syntax for type {}: \"{text}\"", to.sql_name()));
    Ok(match to {
        DataType::Bool => Value::Bool(parse_bool(text).ok_or_else(invalid)?),
        DataType::Int16 | DataType::Int32 => Value::Int32(parse_integer(text, to)? as i32),
        DataType::Int64 => Value::Int64(parse_integer(text, to)?),
        DataType::Float64 => Value::Float64(parse_float(text).ok_or_else(invalid)?),
        DataType::Float32 => {
            // Read straight into an f32 (strtof), not through a double (no double rounding).
            let value = parse_float(text).ok_or_else(invalid)?;
            let single =
                if value.is_finite() { text.trim().parse::<f32>().map_err(|_| invalid())? } else { value as f32 };
            if (single.is_infinite() && value.is_finite()) || (single == 0.0 && value != 0.0) {
                return Err(EngineError::Overflow(format!("\"{text}\" is out of range for type real")));
            }
            Value::Float32(single)
        }
        DataType::Date => Value::Date(parse_date(text)?),
        DataType::Timestamp => Value::Timestamp(datetime::parse_timestamp(text, false)?),
        DataType::TimestampTz => Value::TimestampTz(datetime::parse_timestamp(text, true)?),
        DataType::Interval => Value::Interval(Interval::parse(text)?),
        DataType::Numeric => Value::Numeric(Numeric::parse(text)?),
        DataType::Decimal { scale, .. } => {
            Value::Decimal { value: decimal_from_numeric(Numeric::parse(text)?, to)?, scale }
        }
        DataType::Text => Value::Text(text.to_string()),
        DataType::Char(_) | DataType::Varchar(_) => Value::Text(fit_text(text, to)?),
    })
}

/// An integer of `to`'s range; out of range is 22003 and bad syntax 22P02, as PostgreSQL.
fn parse_integer(text: &str, to: DataType) -> Result<i64> {
    let trimmed = text.trim();
    let out_of_range_input =
        || EngineError::Overflow(format!("value \"{text}\" is out of range for type {}", to.sql_name()));
    let value: i64 = trimmed.parse().map_err(|e: std::num::ParseIntError| match e.kind() {
        std::num::IntErrorKind::PosOverflow | std::num::IntErrorKind::NegOverflow => out_of_range_input(),
        _ => EngineError::InvalidValue(format!("invalid input syntax for type {}: \"{text}\"", to.sql_name())),
    })?;
    let fits = match to {
        DataType::Int16 => i16::try_from(value).is_ok(),
        DataType::Int32 => i32::try_from(value).is_ok(),
        _ => true,
    };
    if !fits {
        return Err(out_of_range_input());
    }
    Ok(value)
}

fn parse_float(text: &str) -> Option<f64> {
    let trimmed = text.trim();
    match trimmed.to_ascii_lowercase().as_str() {
        "nan" => Some(f64::NAN),
        "infinity" | "+infinity" | "inf" | "+inf" => Some(f64::INFINITY),
        "-infinity" | "-inf" => Some(f64::NEG_INFINITY),
        lower if lower.contains(|c: char| c.is_ascii_alphabetic() && c != 'e') => None,
        _ => trimmed.parse().ok(),
    }
}

/// PostgreSQL's boolean input: any unique prefix of true/false/yes/no, on/off, 1/0.
pub fn parse_bool(text: &str) -> Option<bool> {
    let value = text.trim().to_ascii_lowercase();
    if value.is_empty() {
        return None;
    }
    let prefix_of = |word: &str, min: usize| value.len() >= min && word.starts_with(value.as_str());
    if prefix_of("true", 1) || prefix_of("yes", 1) || prefix_of("on", 2) || value == "1" {
        Some(true)
    } else if prefix_of("false", 1) || prefix_of("no", 1) || prefix_of("off", 2) || value == "0" {
        Some(false)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(value: Value, from: DataType, to: DataType) -> Result<Value> {
        Ok(cast(Vector::broadcast(&value, from, 1), to)?.value(0))
    }

    // Goal: narrowing casts check their range and round as PostgreSQL; method: edge values.
    #[test]
    fn casts_round_and_check_ranges() {
        let big = Value::Numeric(Numeric::parse("99999999999999999999").expect("valid"));
        assert!(matches!(one(big, DataType::Numeric, DataType::Int64), Err(EngineError::Overflow(_))));
        assert!(matches!(one(Value::Int64(1 << 40), DataType::Int64, DataType::Int32), Err(EngineError::Overflow(_))));
        assert_eq!(one(Value::Float64(2.5), DataType::Float64, DataType::Int32).expect("fits"), Value::Int32(2));
        assert_eq!(one(Value::Float64(3.5), DataType::Float64, DataType::Int32).expect("fits"), Value::Int32(4));
        assert!(one(Value::Float64(f64::NAN), DataType::Float64, DataType::Int64).is_err());
        let half = Value::Decimal { value: 250, scale: 2 };
        assert_eq!(
            one(half, DataType::Decimal { precision: 5, scale: 2 }, DataType::Int32).expect("fits"),
            Value::Int32(3)
        );
        let to_small = DataType::Decimal { precision: 3, scale: 1 };
        assert!(matches!(one(Value::Int32(100), DataType::Int32, to_small), Err(EngineError::Overflow(_))));
        assert_eq!(one(Value::Text(" 42 ".into()), DataType::Text, DataType::Int32).expect("parses"), Value::Int32(42));
        assert!(matches!(
            one(Value::Text("99999999999".into()), DataType::Text, DataType::Int32),
            Err(EngineError::Overflow(_))
        ));
        assert_eq!(one(Value::Bool(true), DataType::Bool, DataType::Text).expect("prints"), Value::Text("true".into()));
        assert_eq!(parse_bool("of"), Some(false));
        assert_eq!(parse_bool("o"), None);
    }
}
