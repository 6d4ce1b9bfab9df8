//! One result value encoded for the wire: PostgreSQL text format, or binary format for the
//! clients that ask for it (tokio-postgres asks for binary results).

use std::error::Error;

use bytes::{BufMut, BytesMut};
use pgwire::api::Type;
use pgwire::types::format::FormatOptions;
use pgwire::types::ToSqlText;
use postgres_types::{to_sql_checked, IsNull, ToSql};

use crate::types::Value;

/// Days from 1970-01-01 to 2000-01-01 (PostgreSQL's date epoch).
const POSTGRES_EPOCH_DAYS: i32 = 10_957;
/// Base of PostgreSQL's binary numeric digits.
const NUMERIC_BASE_DIGITS: usize = 4;

/// A value with its wire encodings.
#[derive(Debug)]
pub struct Cell(pub Value);

type BoxError = Box<dyn Error + Sync + Send>;

impl ToSql for Cell {
    fn to_sql(&self, _ty: &Type, out: &mut BytesMut) -> Result<IsNull, BoxError> {
        match &self.0 {
            Value::Null => return Ok(IsNull::Yes),
            Value::Bool(v) => out.put_u8(u8::from(*v)),
            Value::Int32(v) => out.put_i32(*v),
            Value::Int64(v) => out.put_i64(*v),
            Value::Float64(v) => out.put_f64(*v),
            Value::Date(days) => out.put_i32(days - POSTGRES_EPOCH_DAYS),
            Value::Decimal { value, scale } => encode_numeric(i128::from(*value), *scale, out),
            Value::Numeric(n) => encode_numeric(n.mantissa, n.scale, out),
            Value::Text(s) => out.put_slice(s.as_bytes()),
        }
        Ok(IsNull::No)
    }

    fn accepts(_ty: &Type) -> bool {
        true
    }

    to_sql_checked!();
}

impl ToSqlText for Cell {
    fn to_sql_text(&self, _ty: &Type, out: &mut BytesMut, _options: &FormatOptions) -> Result<IsNull, BoxError> {
        if self.0.is_null() {
            return Ok(IsNull::Yes);
        }
        out.put_slice(self.0.to_string().as_bytes());
        Ok(IsNull::No)
    }
}

/// PostgreSQL's binary numeric: ndigits, weight, sign, dscale, then base-10000 digits.
fn encode_numeric(value: i128, scale: u8, out: &mut BytesMut) {
    let digits = value.unsigned_abs().to_string();
    let scale = usize::from(scale);
    let (integer, fraction) = if digits.len() > scale {
        (digits[..digits.len() - scale].to_string(), digits[digits.len() - scale..].to_string())
    } else {
        (String::new(), format!("{digits:0>scale$}"))
    };
    let integer_padded =
        format!("{integer:0>width$}", width = integer.len().div_ceil(NUMERIC_BASE_DIGITS) * NUMERIC_BASE_DIGITS);
    let fraction_padded =
        format!("{fraction:0<width$}", width = fraction.len().div_ceil(NUMERIC_BASE_DIGITS) * NUMERIC_BASE_DIGITS);
    let group = |s: &str| -> Vec<i16> {
        s.as_bytes()
            .chunks(NUMERIC_BASE_DIGITS)
            .map(|c| std::str::from_utf8(c).map_or(0, |t| t.parse().unwrap_or(0)))
            .collect()
    };
    let mut groups = group(&integer_padded);
    let mut weight = groups.len() as i16 - 1;
    groups.extend(group(&fraction_padded));
    while groups.first() == Some(&0) {
        groups.remove(0);
        weight -= 1;
    }
    while groups.last() == Some(&0) {
        groups.pop();
    }
    if groups.is_empty() {
        weight = 0;
    }
    out.put_i16(groups.len() as i16);
    out.put_i16(weight);
    out.put_u16(if value < 0 { 0x4000 } else { 0 });
    out.put_u16(scale as u16);
    groups.iter().for_each(|&g| out.put_i16(g));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn numeric(value: i64, scale: u8) -> Vec<i16> {
        let mut out = BytesMut::new();
        encode_numeric(i128::from(value), scale, &mut out);
        out.chunks(2).map(|c| i16::from_be_bytes([c[0], c[1]])).collect()
    }

    // Goal: binary numerics match PostgreSQL's layout; method: known encodings.
    #[test]
    fn numeric_binary_layout() {
        // 12345.6789 = [1, 2345] . [6789]: ndigits 3, weight 1, positive, dscale 4
        assert_eq!(numeric(123_456_789, 4), vec![3, 1, 0, 4, 1, 2345, 6789]);
        // -0.05: digits [500] at weight -1, dscale 2
        assert_eq!(numeric(-5, 2), vec![1, -1, 0x4000, 2, 500]);
        assert_eq!(numeric(0, 2), vec![0, 0, 0, 2]);
        assert_eq!(numeric(10000, 0), vec![1, 1, 0, 0, 1]);
    }
}
