//! Logical types, scalar values, and the date and decimal conversions they need.
//!
//! Dates are days since 1970-01-01 in an `i32`; decimals are scaled `i64` (precision ≤ 18), so
//! `12.34` with scale 2 is stored as `1234`; text is dictionary-encoded in storage.

use std::fmt;

use crate::error::{EngineError, Result};
use crate::interval::Interval;
pub use crate::numeric::Numeric;

/// The largest decimal precision a scaled `i64` holds exactly.
pub const DECIMAL_PRECISION_MAX: u8 = 18;

/// A column or expression type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataType {
    Bool,
    /// `smallint`: stored as an i32, every result checked against its range.
    Int16,
    Int32,
    Int64,
    /// `real`: stored as an f64 that always holds an exact f32.
    Float32,
    Float64,
    Date,
    /// Scaled integer: value = stored / 10^scale.
    Decimal {
        precision: u8,
        scale: u8,
    },
    Text,
    /// `character(n)`: text of at most n characters, held without trailing blanks (which
    /// are insignificant) and padded to n when output, as PostgreSQL's bpchar. `Char(0)` is
    /// bpchar without a length (CASE/UNION of character with a literal): values held as
    /// they are output, trailing blanks still insignificant.
    Char(u32),
    /// `character varying(n)`: text of at most n characters.
    Varchar(u32),
    /// Unconstrained `numeric`: exact, each value with its own display scale (see `numeric`).
    Numeric,
    /// Microseconds since 1970-01-01 00:00:00 (see `datetime`).
    Timestamp,
    /// `timestamp with time zone`: microseconds since 1970-01-01 00:00:00 UTC.
    TimestampTz,
    /// Months, days and microseconds (see `interval`).
    Interval,
}

impl DataType {
    /// The PostgreSQL type OID clients see for this type.
    pub fn pg_oid(self) -> u32 {
        match self {
            DataType::Bool => 16,
            DataType::Int16 => 21,
            DataType::Int32 => 23,
            DataType::Int64 => 20,
            DataType::Float32 => 700,
            DataType::Float64 => 701,
            DataType::Date => 1082,
            DataType::Decimal { .. } | DataType::Numeric => 1700,
            DataType::Text => 25,
            DataType::Char(_) => 1042,
            DataType::Varchar(_) => 1043,
            DataType::Timestamp => 1114,
            DataType::TimestampTz => 1184,
            DataType::Interval => 1186,
        }
    }

    pub fn is_numeric(self) -> bool {
        matches!(
            self,
            DataType::Int16
                | DataType::Int32
                | DataType::Int64
                | DataType::Float32
                | DataType::Float64
                | DataType::Decimal { .. }
                | DataType::Numeric
        )
    }

    /// Text, character(n) or character varying(n): strings held as text vectors.
    pub fn is_text(self) -> bool {
        matches!(self, DataType::Text | DataType::Char(_) | DataType::Varchar(_))
    }

    /// The decimal scale, 0 for integers.
    pub fn scale(self) -> u8 {
        match self {
            DataType::Decimal { scale, .. } => scale,
            _ => 0,
        }
    }

    /// SQL spelling, as EXPLAIN and error messages show it.
    pub fn sql_name(self) -> String {
        match self {
            DataType::Bool => "boolean".into(),
            DataType::Int16 => "smallint".into(),
            DataType::Int32 => "integer".into(),
            DataType::Int64 => "bigint".into(),
            DataType::Float32 => "real".into(),
            DataType::Float64 => "double precision".into(),
            DataType::Date => "date".into(),
            DataType::Decimal { precision, scale } => format!("numeric({precision},{scale})"),
            DataType::Text => "text".into(),
            DataType::Char(0) => "bpchar".into(),
            DataType::Char(length) => format!("character({length})"),
            DataType::Varchar(length) => format!("character varying({length})"),
            DataType::Numeric => "numeric".into(),
            DataType::Timestamp => "timestamp without time zone".into(),
            DataType::TimestampTz => "timestamp with time zone".into(),
            DataType::Interval => "interval".into(),
        }
    }
}

/// One scalar value (constants, INSERT rows, result cells).
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Bool(bool),
    Int32(i32),
    Int64(i64),
    Float32(f32),
    Float64(f64),
    Date(i32),
    Decimal { value: i64, scale: u8 },
    Text(String),
    Numeric(Numeric),
    Timestamp(i64),
    TimestampTz(i64),
    Interval(Interval),
}

impl Value {
    pub fn is_null(&self) -> bool {
        matches!(self, Value::Null)
    }

    /// As a float, for comparisons with a tolerance (tests) and float arithmetic.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Int32(v) => Some(f64::from(*v)),
            Value::Int64(v) => Some(*v as f64),
            Value::Float32(v) => Some(f64::from(*v)),
            Value::Float64(v) => Some(*v),
            Value::Decimal { value, scale } => Some(*value as f64 / 10f64.powi(i32::from(*scale))),
            Value::Numeric(n) => Some(n.to_f64()),
            _ => None,
        }
    }
}

impl fmt::Display for Value {
    /// PostgreSQL's text output format.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Null => Ok(()),
            Value::Bool(v) => write!(f, "{}", if *v { "t" } else { "f" }),
            Value::Int32(v) => write!(f, "{v}"),
            Value::Int64(v) => write!(f, "{v}"),
            Value::Float32(v) => write!(f, "{}", format_float32(*v)),
            Value::Float64(v) => write!(f, "{}", format_float(*v)),
            Value::Date(days) => write!(f, "{}", format_date(*days)),
            Value::Decimal { value, scale } => write!(f, "{}", format_decimal(*value, *scale)),
            Value::Text(s) => write!(f, "{s}"),
            Value::Numeric(n) => write!(f, "{n}"),
            Value::Timestamp(micros) => write!(f, "{}", crate::datetime::format_timestamp(*micros, false)),
            Value::TimestampTz(micros) => write!(f, "{}", crate::datetime::format_timestamp(*micros, true)),
            Value::Interval(interval) => write!(f, "{}", crate::datetime::format_interval(*interval)),
        }
    }
}

/// A value as a hash key: equal SQL values (1.5 and 1.50, 0.0 and -0.0, NaN and NaN) have
/// equal keys.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ValueKey {
    Null,
    Bool(bool),
    Int(i64),
    Float(u64),
    Text(String),
    Numeric(Numeric),
}

impl Value {
    pub fn key(&self) -> ValueKey {
        match self {
            Value::Null => ValueKey::Null,
            Value::Bool(b) => ValueKey::Bool(*b),
            Value::Int32(v) | Value::Date(v) => ValueKey::Int(i64::from(*v)),
            Value::Int64(v) | Value::Timestamp(v) | Value::TimestampTz(v) => ValueKey::Int(*v),
            // Equal spans are equal intervals ('1 mon' = '30 days'), as PostgreSQL compares them.
            Value::Interval(i) => ValueKey::Numeric(Numeric::new(i.span_micros(), 0)),
            Value::Float32(v) => Value::Float64(f64::from(*v)).key(),
            Value::Float64(v) if v.is_nan() => ValueKey::Float(f64::NAN.to_bits()),
            Value::Float64(v) => ValueKey::Float((v + 0.0).to_bits()),
            Value::Decimal { value, scale } => ValueKey::Numeric(Numeric::new(i128::from(*value), *scale).normalized()),
            Value::Numeric(n) => ValueKey::Numeric(n.normalized()),
            Value::Text(s) => ValueKey::Text(s.clone()),
        }
    }
}

/// Orders two non-null values of one type as SQL does (NaN above every float, as in
/// PostgreSQL); values of different types compare as numbers.
pub fn compare_values(a: &Value, b: &Value) -> std::cmp::Ordering {
    use std::cmp::Ordering;
    match (a, b) {
        (Value::Bool(x), Value::Bool(y)) => x.cmp(y),
        (Value::Int32(x), Value::Int32(y)) | (Value::Date(x), Value::Date(y)) => x.cmp(y),
        (Value::Int64(x), Value::Int64(y))
        | (Value::Timestamp(x), Value::Timestamp(y))
        | (Value::TimestampTz(x), Value::TimestampTz(y)) => x.cmp(y),
        (Value::Interval(x), Value::Interval(y)) => x.span_micros().cmp(&y.span_micros()),
        (Value::Text(x), Value::Text(y)) => x.cmp(y),
        (Value::Numeric(x), Value::Numeric(y)) => x.cmp(y),
        (Value::Decimal { value: x, scale: sx }, Value::Decimal { value: y, scale: sy }) => {
            Numeric::new(i128::from(*x), *sx).cmp(&Numeric::new(i128::from(*y), *sy))
        }
        (Value::Float64(x), Value::Float64(y)) => match (x.is_nan(), y.is_nan()) {
            (true, true) => Ordering::Equal,
            (true, false) => Ordering::Greater,
            (false, true) => Ordering::Less,
            (false, false) => x.partial_cmp(y).unwrap_or(Ordering::Equal),
        },
        _ => a.as_f64().partial_cmp(&b.as_f64()).unwrap_or(Ordering::Equal),
    }
}

/// Floats the way PostgreSQL prints float8: the shortest text that reads back exactly, in
/// fixed notation when the decimal exponent is in -4..15, else as `1.5e+20` (two exponent
/// digits at least), like printf's `%g`.
pub fn format_float(v: f64) -> String {
    if v.is_nan() {
        return "NaN".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    if v == 0.0 {
        return if v.is_sign_negative() { "-0" } else { "0" }.into();
    }
    let scientific = format!("{v:e}");
    let (mantissa, exponent) = scientific.split_once('e').expect("{:e} has an exponent");
    let exponent: i32 = exponent.parse().expect("{:e} exponent is an integer");
    if (-4..15).contains(&exponent) {
        return format!("{v}");
    }
    let sign = if exponent < 0 { '-' } else { '+' };
    format!("{mantissa}e{sign}{:02}", exponent.unsigned_abs())
}

/// Floats the way PostgreSQL prints float4: the shortest text that reads back as the same
/// f32, in fixed notation when the decimal exponent is in -4..6 (`1e+06`), else exponential.
pub fn format_float32(v: f32) -> String {
    if !v.is_finite() || v == 0.0 {
        return format_float(f64::from(v));
    }
    let scientific = format!("{v:e}");
    let (mantissa, exponent) = scientific.split_once('e').expect("{:e} has an exponent");
    let exponent: i32 = exponent.parse().expect("{:e} exponent is an integer");
    if (-4..6).contains(&exponent) {
        return format!("{v}");
    }
    let sign = if exponent < 0 { '-' } else { '+' };
    format!("{mantissa}e{sign}{:02}", exponent.unsigned_abs())
}

/// A character(n) value as output: padded with blanks to n characters.
pub fn pad_char(text: &str, length: u32) -> String {
    let missing = (length as usize).saturating_sub(text.chars().count());
    format!("{text}{}", " ".repeat(missing))
}

/// `1234` with scale 2 → `"12.34"`.
pub fn format_decimal(value: i64, scale: u8) -> String {
    if scale == 0 {
        return value.to_string();
    }
    let divisor = 10u64.pow(u32::from(scale));
    let magnitude = value.unsigned_abs();
    let sign = if value < 0 { "-" } else { "" };
    format!("{sign}{}.{:0width$}", magnitude / divisor, magnitude % divisor, width = usize::from(scale))
}

/// `10^scale` as i64; scale ≤ 18 always fits.
pub fn pow10(scale: u8) -> i64 {
    assert!(scale <= DECIMAL_PRECISION_MAX, "decimal scale {scale} above the supported maximum");
    10i64.pow(u32::from(scale))
}

/// Parses `"-12.345"` into a scaled integer with exactly `scale` digits (rounding half away).
pub fn parse_decimal(text: &str, scale: u8) -> Result<i64> {
    let invalid = || EngineError::InvalidValue(format!("invalid input syntax for type numeric: \"{text}\""));
    let trimmed = text.trim();
    let (negative, digits) = match trimmed.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, trimmed.strip_prefix('+').unwrap_or(trimmed)),
    };
    let (whole, fraction) = digits.split_once('.').unwrap_or((digits, ""));
    if (whole.is_empty() && fraction.is_empty()) || !whole.chars().chain(fraction.chars()).all(|c| c.is_ascii_digit()) {
        return Err(invalid());
    }
    let overflow = || EngineError::Overflow(format!("{text} does not fit numeric with scale {scale}"));
    let mut value: i128 = 0;
    for c in whole.chars() {
        value = value * 10 + i128::from(c as u8 - b'0');
        if value > i128::from(i64::MAX) {
            return Err(overflow());
        }
    }
    let mut fraction_digits = fraction.bytes();
    for _ in 0..scale {
        let digit = fraction_digits.next().map_or(0, |b| b - b'0');
        value = value * 10 + i128::from(digit);
    }
    if fraction_digits.next().is_some_and(|b| b >= b'5') {
        value += 1;
    }
    let value = if negative { -value } else { value };
    i64::try_from(value).map_err(|_| overflow())
}

/// Days since 1970-01-01 of a proleptic Gregorian date (the shared `bypass_wire::civil`),
/// for dates in the `date` type's range.
pub fn days_from_civil(year: i32, month: u32, day: u32) -> i32 {
    bypass_wire::civil::days_from_civil(i64::from(year), month, day) as i32
}

/// The inverse of [`days_from_civil`]: (year, month 1..=12, day 1..=31).
pub fn civil_from_days(days: i32) -> (i32, u32, u32) {
    let (year, month, day) = bypass_wire::civil::civil_from_days(i64::from(days));
    (year as i32, month, day)
}

fn days_in_month(year: i32, month: u32) -> u32 {
    let next = if month == 12 { days_from_civil(year + 1, 1, 1) } else { days_from_civil(year, month + 1, 1) };
    (next - days_from_civil(year, month, 1)) as u32
}

/// `date + n months`, clamping the day to the target month's length as PostgreSQL does.
pub fn add_months(days: i32, months: i32) -> i32 {
    let (year, month, day) = civil_from_days(days);
    let total = year * 12 + (month as i32 - 1) + months;
    let (new_year, new_month) = (total.div_euclid(12), total.rem_euclid(12) as u32 + 1);
    days_from_civil(new_year, new_month, day.min(days_in_month(new_year, new_month)))
}

/// `"1998-12-01"` → days since the epoch.
pub fn parse_date(text: &str) -> Result<i32> {
    let invalid = || EngineError::InvalidDatetime(format!("invalid input syntax for type date: \"{text}\""));
    let mut parts = text.trim().splitn(3, '-');
    let mut next = || parts.next().ok_or_else(invalid);
    let year: i32 = next()?.parse().map_err(|_| invalid())?;
    let month: u32 = next()?.parse().map_err(|_| invalid())?;
    let day: u32 = next()?.parse().map_err(|_| invalid())?;
    // Like PostgreSQL: well-formed but impossible fields are a range error, not a syntax error.
    if !(1..=12).contains(&month) || day == 0 || day > days_in_month(year, month) {
        return Err(EngineError::DatetimeOutOfRange(format!("\"{text}\"")));
    }
    Ok(days_from_civil(year, month, day))
}

pub fn format_date(days: i32) -> String {
    let (year, month, day) = civil_from_days(days);
    format!("{year:04}-{month:02}-{day:02}")
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: date conversions round-trip and match known epochs; method: fixed dates and a sweep.
    #[test]
    fn dates_round_trip() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(parse_date("1992-01-01").expect("valid"), 8035);
        for days in -1000..40_000 {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days);
        }
        assert_eq!(format_date(parse_date("1998-12-01").expect("valid")), "1998-12-01");
        assert_eq!(format_date(add_months(parse_date("1995-01-31").expect("valid"), 1)), "1995-02-28");
        assert!(parse_date("1995-02-30").is_err());
    }

    // Goal: decimal parse/format agree with PostgreSQL's text form; method: fixed cases.
    #[test]
    fn decimals_parse_and_format() {
        assert_eq!(parse_decimal("12.34", 2).expect("valid"), 1234);
        assert_eq!(parse_decimal("-0.5", 2).expect("valid"), -50);
        assert_eq!(parse_decimal("7", 2).expect("valid"), 700);
        assert_eq!(parse_decimal("0.125", 2).expect("valid"), 13);
        assert!(parse_decimal("1.2.3", 2).is_err());
        assert!(parse_decimal("99999999999999999999", 0).is_err());
        assert_eq!(format_decimal(-5, 2), "-0.05");
        assert_eq!(format_decimal(123456, 3), "123.456");
    }

    // Goal: float8 text as PostgreSQL prints it; method: values around the notation switch.
    #[test]
    fn floats_print_like_postgres() {
        assert_eq!(format_float(1e20), "1e+20");
        assert_eq!(format_float(123456789012345678.0), "1.2345678901234568e+17");
        assert_eq!(format_float(0.0001), "0.0001");
        assert_eq!(format_float(0.00001), "1e-05");
        assert_eq!(format_float(1.5), "1.5");
        assert_eq!(format_float(-0.0), "-0");
        assert_eq!(format_float(100000000000000.0), "100000000000000");
        assert_eq!(format_float(1e15), "1e+15");
    }
}
