//! Result encoding for the wire: RowDescription, DataRow (text and binary format for every
//! type), CopyData, and the backend messages the server composes. Pure functions over a
//! caller-owned buffer; they run on the engine's workers, never on the network thread.

use std::io::Write;

use bypass_wire::write::{message, put_cstr, put_i16, put_i32};

use crate::datetime::{format_interval, format_timestamp, TIMESTAMP_INFINITY, TIMESTAMP_MINUS_INFINITY};
use crate::engine::ColumnType;
use crate::error::EngineError;
use crate::interval::MICROS_PER_DAY;
use crate::pg_catalog::{Datum, PgType};
use crate::stream::ColumnOrigin;
use crate::types::{format_date, format_decimal, format_float, format_float32, pad_char, DataType};
use crate::vector::{Batch, Data, Vector};

/// Days from 1970-01-01 to 2000-01-01 (PostgreSQL's date epoch).
pub const POSTGRES_EPOCH_DAYS: i32 = 10_957;
/// Base of PostgreSQL's binary numeric digits.
const NUMERIC_BASE_DIGITS: usize = 4;

/// Text (0) or binary (1) format of one column or parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Text,
    Binary,
}

impl Format {
    pub fn code(self) -> i16 {
        match self {
            Format::Text => 0,
            Format::Binary => 1,
        }
    }

    /// Per-column formats from a Bind's format codes: none = all text, one = all alike.
    pub fn expand(codes: &[i16], columns: usize) -> Result<Vec<Format>, EngineError> {
        let format = |code: i16| match code {
            0 => Ok(Format::Text),
            1 => Ok(Format::Binary),
            other => Err(EngineError::Protocol(format!("invalid format code {other}"))),
        };
        match codes {
            [] => Ok(vec![Format::Text; columns]),
            [one] => Ok(vec![format(*one)?; columns]),
            many if many.len() == columns => many.iter().map(|&c| format(c)).collect(),
            many => Err(EngineError::Protocol(format!("{} format codes for {columns} columns", many.len()))),
        }
    }
}

/// PostgreSQL's type size (`typlen`) for RowDescription.
fn type_size(data_type: DataType) -> i16 {
    match data_type {
        DataType::Bool => 1,
        DataType::Int16 => 2,
        DataType::Int32 | DataType::Date | DataType::Float32 => 4,
        DataType::Int64 | DataType::Float64 | DataType::Timestamp | DataType::TimestampTz => 8,
        DataType::Interval => 16,
        DataType::Decimal { .. } | DataType::Numeric | DataType::Text | DataType::Char(_) | DataType::Varchar(_) => -1,
    }
}

/// PostgreSQL's type modifier: numeric(p, s) is ((p << 16) | s) + 4.
pub fn type_modifier(data_type: DataType) -> i32 {
    match data_type {
        DataType::Decimal { precision, scale } => ((i32::from(precision) << 16) | i32::from(scale)) + 4,
        // character(n) and character varying(n): n + 4.
        DataType::Char(length) | DataType::Varchar(length) => i32::try_from(length).unwrap_or(i32::MAX - 4) + 4,
        _ => -1,
    }
}

fn catalog_type_size(pg_type: PgType) -> i16 {
    match pg_type {
        PgType::Bool | PgType::Char => 1,
        PgType::Int2 => 2,
        PgType::Int4 | PgType::Oid | PgType::Float4 => 4,
        PgType::Int8 | PgType::Float8 => 8,
        PgType::Name => 64,
        _ => -1,
    }
}

/// `origins[i]` names the table column result column `i` is (table oid and attribute number,
/// as PostgreSQL sends them); a missing or `None` entry sends zeros (a computed column).
pub fn row_description(
    out: &mut Vec<u8>,
    names: &[String],
    types: &[ColumnType],
    origins: &[Option<ColumnOrigin>],
    formats: &[Format],
) {
    message(out, Some(b'T'), |out| {
        put_i16(out, i16::try_from(names.len()).expect("fewer than 32768 columns"));
        for (index, ((name, column_type), format)) in names.iter().zip(types).zip(formats).enumerate() {
            let origin = origins.get(index).copied().flatten();
            let (size, modifier) = match *column_type {
                ColumnType::Engine(data_type) => (type_size(data_type), type_modifier(data_type)),
                ColumnType::Catalog(pg_type) => (catalog_type_size(pg_type), -1),
            };
            put_cstr(out, name.replace('\0', "").as_bytes());
            put_i32(out, origin.map_or(0, |o| o.table as i32));
            put_i16(out, origin.map_or(0, |o| o.attribute));
            put_i32(out, column_type.oid() as i32);
            put_i16(out, size);
            put_i32(out, modifier);
            put_i16(out, format.code());
        }
    });
}

/// DataRows of a catalog query's rows.
pub fn catalog_rows(
    out: &mut Vec<u8>,
    types: &[PgType],
    rows: &[Vec<Datum>],
    formats: &[Format],
) -> Result<(), EngineError> {
    for row in rows {
        let mut failed = None;
        message(out, Some(b'D'), |out| {
            put_i16(out, i16::try_from(row.len()).expect("fewer than 32768 columns"));
            for ((datum, pg_type), format) in row.iter().zip(types).zip(formats) {
                if datum.is_null() {
                    put_i32(out, -1);
                    continue;
                }
                let length_at = out.len();
                out.extend_from_slice(&[0; 4]);
                match format {
                    Format::Text => {
                        let vector = matches!(pg_type, PgType::Int2Vector | PgType::OidVector);
                        out.extend_from_slice(datum.to_text(vector).as_bytes());
                    }
                    Format::Binary => {
                        if let Err(error) = crate::pg_catalog::value::binary(datum, *pg_type, out) {
                            failed = Some(error);
                        }
                    }
                }
                let length = i32::try_from(out.len() - length_at - 4).expect("a value never exceeds 2 GiB");
                out[length_at..length_at + 4].copy_from_slice(&length.to_be_bytes());
            }
        });
        if let Some(error) = failed {
            return Err(error);
        }
    }
    Ok(())
}

pub fn parameter_description(out: &mut Vec<u8>, oids: &[u32]) {
    message(out, Some(b't'), |out| {
        put_i16(out, i16::try_from(oids.len()).expect("at most 65535 parameters"));
        oids.iter().for_each(|&oid| put_i32(out, oid as i32));
    });
}

/// Messages without a body: ParseComplete, BindComplete, CloseComplete, NoData,
/// EmptyQueryResponse, PortalSuspended, CopyDone.
pub fn empty_message(out: &mut Vec<u8>, tag: u8) {
    message(out, Some(tag), |_| {});
}

/// A message with a fixed body (AuthenticationOk: 'R' with 0).
pub fn empty_message_with(out: &mut Vec<u8>, tag: u8, body: &[u8]) {
    message(out, Some(tag), |out| out.extend_from_slice(body));
}

pub fn command_complete(out: &mut Vec<u8>, tag: &str) {
    message(out, Some(b'C'), |out| put_cstr(out, tag.as_bytes()));
}

pub fn ready_for_query(out: &mut Vec<u8>, status: u8) {
    message(out, Some(b'Z'), |out| out.push(status));
}

pub fn parameter_status(out: &mut Vec<u8>, name: &str, value: &str) {
    message(out, Some(b'S'), |out| {
        put_cstr(out, name.as_bytes());
        put_cstr(out, value.as_bytes());
    });
}

pub fn backend_key_data(out: &mut Vec<u8>, process_id: i32, secret: i32) {
    message(out, Some(b'K'), |out| {
        put_i32(out, process_id);
        put_i32(out, secret);
    });
}

/// ErrorResponse ('E') or NoticeResponse ('N'): severity, SQLSTATE, message.
pub fn error_or_notice(out: &mut Vec<u8>, tag: u8, severity: &str, code: &str, text: &str) {
    // Protocol fields are NUL-terminated: a NUL inside the text would corrupt the message.
    let text = text.replace('\0', "\\0");
    message(out, Some(tag), |out| {
        for field in [b'S', b'V'] {
            out.push(field);
            put_cstr(out, severity.as_bytes());
        }
        out.push(b'C');
        put_cstr(out, code.as_bytes());
        out.push(b'M');
        put_cstr(out, text.as_bytes());
        out.push(0);
    });
}

pub fn error(out: &mut Vec<u8>, error: &EngineError) {
    error_or_notice(out, b'E', "ERROR", error.sqlstate(), &error.to_string());
}

/// CopyInResponse ('G') / CopyOutResponse ('H'): text format, `columns` text columns.
pub fn copy_response(out: &mut Vec<u8>, tag: u8, columns: usize) {
    message(out, Some(tag), |out| {
        out.push(0);
        put_i16(out, i16::try_from(columns).expect("fewer than 32768 columns"));
        (0..columns).for_each(|_| put_i16(out, 0));
    });
}

pub fn copy_data(out: &mut Vec<u8>, data: &[u8]) {
    message(out, Some(b'd'), |out| out.extend_from_slice(data));
}

/// Appends one DataRow per row of `batch`.
pub fn data_rows(out: &mut Vec<u8>, batch: &Batch, formats: &[Format]) {
    for row in 0..batch.rows {
        message(out, Some(b'D'), |out| {
            put_i16(out, i16::try_from(batch.columns.len()).expect("fewer than 32768 columns"));
            for (column, format) in batch.columns.iter().zip(formats) {
                if !column.is_valid(row) {
                    put_i32(out, -1);
                    continue;
                }
                let length_at = out.len();
                out.extend_from_slice(&[0; 4]);
                match format {
                    Format::Text => text_cell(out, column, row),
                    Format::Binary => binary_cell(out, column, row),
                }
                let length = i32::try_from(out.len() - length_at - 4).expect("a value never exceeds 2 GiB");
                out[length_at..length_at + 4].copy_from_slice(&length.to_be_bytes());
            }
        });
    }
}

/// PostgreSQL's text output of one value (not NULL).
fn text_cell(out: &mut Vec<u8>, vector: &Vector, row: usize) {
    // Writing into a Vec cannot fail.
    let _ = match (&vector.data, vector.data_type) {
        (Data::Bool(v), _) => out.write_all(if v[row] { b"t" } else { b"f" }),
        (Data::I32(v), DataType::Date) => out.write_all(format_date(v[row]).as_bytes()),
        (Data::I32(v), _) => write!(out, "{}", v[row]),
        (Data::I64(v), DataType::Decimal { scale, .. }) => out.write_all(format_decimal(v[row], scale).as_bytes()),
        (Data::I64(v), DataType::Timestamp) => out.write_all(format_timestamp(v[row], false).as_bytes()),
        (Data::I64(v), DataType::TimestampTz) => out.write_all(format_timestamp(v[row], true).as_bytes()),
        (Data::I64(v), _) => write!(out, "{}", v[row]),
        (Data::F64(v), DataType::Float32) => out.write_all(format_float32(v[row] as f32).as_bytes()),
        (Data::F64(v), _) => out.write_all(format_float(v[row]).as_bytes()),
        (Data::Text(codes, dictionary), DataType::Char(length)) => {
            out.write_all(pad_char(dictionary.get(codes[row]), length).as_bytes())
        }
        (Data::Text(codes, dictionary), _) => out.write_all(dictionary.get(codes[row]).as_bytes()),
        (Data::Numeric(v), _) => write!(out, "{}", v[row]),
        (Data::Interval(v), _) => out.write_all(format_interval(v[row]).as_bytes()),
    };
}

/// PostgreSQL's binary send format of one value (not NULL).
fn binary_cell(out: &mut Vec<u8>, vector: &Vector, row: usize) {
    match (&vector.data, vector.data_type) {
        (Data::Bool(v), _) => out.push(u8::from(v[row])),
        (Data::I32(v), DataType::Date) => out.extend_from_slice(&(v[row] - POSTGRES_EPOCH_DAYS).to_be_bytes()),
        (Data::I32(v), DataType::Int16) => out.extend_from_slice(&(v[row] as i16).to_be_bytes()),
        (Data::I32(v), _) => out.extend_from_slice(&v[row].to_be_bytes()),
        (Data::I64(v), DataType::Decimal { scale, .. }) => encode_numeric(i128::from(v[row]), scale, out),
        (Data::I64(v), DataType::Timestamp | DataType::TimestampTz) => {
            out.extend_from_slice(&postgres_timestamp(v[row]).to_be_bytes())
        }
        (Data::I64(v), _) => out.extend_from_slice(&v[row].to_be_bytes()),
        (Data::F64(v), DataType::Float32) => out.extend_from_slice(&(v[row] as f32).to_bits().to_be_bytes()),
        (Data::F64(v), _) => out.extend_from_slice(&v[row].to_bits().to_be_bytes()),
        (Data::Text(codes, dictionary), DataType::Char(length)) => {
            out.extend_from_slice(pad_char(dictionary.get(codes[row]), length).as_bytes())
        }
        (Data::Text(codes, dictionary), _) => out.extend_from_slice(dictionary.get(codes[row]).as_bytes()),
        (Data::Numeric(v), _) if v[row].is_special() => encode_special_numeric(v[row], out),
        (Data::Numeric(v), _) => encode_numeric(v[row].mantissa, v[row].scale, out),
        (Data::Interval(v), _) => {
            out.extend_from_slice(&v[row].micros.to_be_bytes());
            out.extend_from_slice(&v[row].days.to_be_bytes());
            out.extend_from_slice(&v[row].months.to_be_bytes());
        }
    }
}

/// A timestamp in PostgreSQL's binary form: microseconds since 2000-01-01 (the infinities
/// are the same extreme words).
fn postgres_timestamp(micros: i64) -> i64 {
    match micros {
        TIMESTAMP_INFINITY | TIMESTAMP_MINUS_INFINITY => micros,
        _ => micros - i64::from(POSTGRES_EPOCH_DAYS) * MICROS_PER_DAY,
    }
}

/// NaN and the infinities in binary: no digits, the sign word says which (NUMERIC_NAN,
/// NUMERIC_PINF, NUMERIC_NINF).
fn encode_special_numeric(value: crate::numeric::Numeric, out: &mut Vec<u8>) {
    let sign: u16 = match value.signum() {
        1 => 0xD000,
        -1 => 0xF000,
        _ => 0xC000,
    };
    put_i16(out, 0);
    put_i16(out, 0);
    out.extend_from_slice(&sign.to_be_bytes());
    put_i16(out, 0);
}

/// PostgreSQL's binary numeric: ndigits, weight, sign, dscale, then base-10000 digits.
pub fn encode_numeric(value: i128, scale: u8, out: &mut Vec<u8>) {
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
            .map(|c| c.iter().fold(0i16, |acc, d| acc * 10 + i16::from(d - b'0')))
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
    put_i16(out, groups.len() as i16);
    put_i16(out, weight);
    out.extend_from_slice(&(if value < 0 { 0x4000u16 } else { 0 }).to_be_bytes());
    out.extend_from_slice(&(scale as u16).to_be_bytes());
    groups.iter().for_each(|&g| put_i16(out, g));
}

/// The decimal text of a binary numeric parameter.
pub fn decode_numeric(bytes: &[u8]) -> Result<String, EngineError> {
    let invalid = || EngineError::InvalidValue("invalid binary numeric parameter".into());
    let word = |i: usize| -> Result<i16, EngineError> {
        bytes.get(i * 2..i * 2 + 2).map(|b| i16::from_be_bytes([b[0], b[1]])).ok_or_else(invalid)
    };
    let (count, weight, sign, scale) = (word(0)?, word(1)?, word(2)? as u16, word(3)?);
    if count < 0 || scale < 0 || bytes.len() != 8 + 2 * count as usize {
        return Err(invalid());
    }
    match sign {
        0xC000 => return Ok("NaN".into()),
        0xD000 => return Ok("Infinity".into()),
        0xF000 => return Ok("-Infinity".into()),
        0 | 0x4000 => {}
        _ => return Err(invalid()),
    }
    let groups: Vec<i16> = (0..count as usize).map(|i| word(4 + i)).collect::<Result<_, _>>()?;
    if groups.iter().any(|g| !(0..10_000).contains(g)) {
        return Err(invalid());
    }
    let mut integer = String::new();
    for position in 0..=weight.max(-1) {
        let group = groups.get(position as usize).copied().unwrap_or(0);
        if integer.is_empty() {
            integer = group.to_string();
        } else {
            integer.push_str(&format!("{group:04}"));
        }
    }
    if integer.is_empty() {
        integer.push('0');
    }
    let mut fraction = String::new();
    let first_fraction_group = i32::from(weight) + 1;
    let groups_needed = (scale as usize).div_ceil(NUMERIC_BASE_DIGITS);
    for index in 0..groups_needed as i32 {
        let position = first_fraction_group + index;
        let group = if position < 0 { 0 } else { groups.get(position as usize).copied().unwrap_or(0) };
        fraction.push_str(&format!("{group:04}"));
    }
    fraction.truncate(scale as usize);
    let sign = if sign == 0x4000 { "-" } else { "" };
    Ok(if fraction.is_empty() { format!("{sign}{integer}") } else { format!("{sign}{integer}.{fraction}") })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn numeric(value: i64, scale: u8) -> Vec<u8> {
        let mut out = Vec::new();
        encode_numeric(i128::from(value), scale, &mut out);
        out
    }

    fn words(bytes: &[u8]) -> Vec<i16> {
        bytes.chunks(2).map(|c| i16::from_be_bytes([c[0], c[1]])).collect()
    }

    // Goal: binary numerics match PostgreSQL's layout and decode back; method: known
    // encodings, then a round trip over awkward values.
    #[test]
    fn numeric_binary_layout_and_round_trip() {
        assert_eq!(words(&numeric(123_456_789, 4)), vec![3, 1, 0, 4, 1, 2345, 6789]);
        assert_eq!(words(&numeric(-5, 2)), vec![1, -1, 0x4000, 2, 500]);
        assert_eq!(words(&numeric(0, 2)), vec![0, 0, 0, 2]);
        assert_eq!(words(&numeric(10000, 0)), vec![1, 1, 0, 0, 1]);
        for (value, scale) in
            [(123_456_789i64, 4u8), (-5, 2), (0, 2), (10000, 0), (1, 9), (-987_654_321_012, 3), (7, 0)]
        {
            let text = decode_numeric(&numeric(value, scale)).expect("valid");
            assert_eq!(text, format_decimal(value, scale), "{value} scale {scale}");
        }
    }
}
