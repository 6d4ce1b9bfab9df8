//! Loading Parquet files: `COPY table [(columns)] FROM 'file.parquet' (FORMAT parquet)`.
//!
//! ```text
//!   file ─► SerializedFileReader ─► rows (parquet record API) ─► Value per target column
//!        ─► TableBuilder::push_row (same path as INSERT and CSV COPY)
//! ```
//!
//! Columns are matched by name (case-insensitively), not by position, because Parquet files
//! carry their schema; every target column must be in the file and extra file columns are
//! ignored. Values are converted to the table's column types with the same rules as a cast:
//! integers widen, decimals are rescaled exactly (or rounded half away from zero when the
//! file has more fractional digits, like PostgreSQL's numeric cast), and a value that does
//! not fit is an error naming the row and column, never a silent truncation.

use std::fs::File;

use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::record::Field;

use crate::error::{EngineError, Result};
use crate::storage::{ColumnDef, TableBuilder};
use crate::types::{parse_date, parse_decimal, pow10, DataType, Value, DECIMAL_PRECISION_MAX};

/// Loads every row of the Parquet file at `path` into `builder`; `targets` are the table
/// columns to fill (the others stay NULL). Returns the number of rows loaded.
pub fn load(path: &str, schema: &[ColumnDef], targets: &[usize], builder: &mut TableBuilder) -> Result<usize> {
    let file = File::open(path).map_err(|e| EngineError::io(format!("opening {path}"), e))?;
    let reader = SerializedFileReader::new(file).map_err(|e| invalid_file(path, e))?;
    let file_columns: Vec<String> =
        reader.metadata().file_metadata().schema().get_fields().iter().map(|f| f.name().to_string()).collect();
    let positions = targets
        .iter()
        .map(|&column| {
            let name = &schema[column].name;
            file_columns.iter().position(|f| f.eq_ignore_ascii_case(name)).ok_or_else(|| {
                EngineError::InvalidValue(format!(
                    "{path}: no column \"{name}\" (file has {})",
                    file_columns.join(", ")
                ))
            })
        })
        .collect::<Result<Vec<usize>>>()?;
    let rows = reader.get_row_iter(None).map_err(|e| invalid_file(path, e))?;
    let mut count = 0;
    for (number, row) in rows.enumerate() {
        let row = row.map_err(|e| invalid_file(path, e))?;
        let fields: Vec<&Field> = row.get_column_iter().map(|(_, field)| field).collect();
        let mut values = vec![Value::Null; schema.len()];
        for (&column, &position) in targets.iter().zip(&positions) {
            let field = fields.get(position).ok_or_else(|| {
                EngineError::InvalidValue(format!("{path} row {}: missing column {position}", number + 1))
            })?;
            values[column] = field_value(field, schema[column].data_type).map_err(|problem| {
                EngineError::InvalidValue(format!(
                    "{path} row {}, column {}: {problem}",
                    number + 1,
                    schema[column].name
                ))
            })?;
        }
        builder.push_row(&values)?;
        count += 1;
    }
    Ok(count)
}

fn invalid_file(path: &str, error: parquet::errors::ParquetError) -> EngineError {
    EngineError::InvalidValue(format!("{path}: not a readable Parquet file: {error}"))
}

/// Converts one Parquet value to the column type; the error says what did not fit.
fn field_value(field: &Field, target: DataType) -> std::result::Result<Value, String> {
    let mismatch = || format!("cannot load {field:?} into a {} column", target.sql_name());
    Ok(match (target, field) {
        (_, Field::Null) => Value::Null,
        (DataType::Bool, Field::Bool(v)) => Value::Bool(*v),
        (DataType::Int32, _) => {
            let v = integer(field).ok_or_else(mismatch)?;
            Value::Int32(i32::try_from(v).map_err(|_| format!("{v} is out of range for integer"))?)
        }
        (DataType::Int64, _) => {
            let v = integer(field).ok_or_else(mismatch)?;
            Value::Int64(i64::try_from(v).map_err(|_| format!("{v} is out of range for bigint"))?)
        }
        (DataType::Float64, Field::Float(v)) => Value::Float64(f64::from(*v)),
        (DataType::Float64, Field::Double(v)) => Value::Float64(*v),
        (DataType::Float64, Field::Decimal(d)) => {
            Value::Float64(decimal_unscaled(d.data())? as f64 / 10f64.powi(d.scale()))
        }
        (DataType::Float64, _) => Value::Float64(integer(field).ok_or_else(mismatch)? as f64),
        (DataType::Date, Field::Date(days)) => Value::Date(*days),
        (DataType::Date, Field::Str(text)) => Value::Date(parse_date(text).map_err(|e| e.to_string())?),
        (DataType::Decimal { precision, scale }, _) => decimal_value(field, precision, scale)?,
        (DataType::Text, Field::Str(text)) => Value::Text(text.clone()),
        (DataType::Text, Field::Bytes(bytes)) => {
            Value::Text(String::from_utf8(bytes.data().to_vec()).map_err(|_| "binary value is not UTF-8".to_string())?)
        }
        _ => return Err(mismatch()),
    })
}

/// Any Parquet integer, widened (unsigned 64-bit values need the i128).
fn integer(field: &Field) -> Option<i128> {
    Some(match field {
        Field::Byte(v) => i128::from(*v),
        Field::Short(v) => i128::from(*v),
        Field::Int(v) => i128::from(*v),
        Field::Long(v) => i128::from(*v),
        Field::UByte(v) => i128::from(*v),
        Field::UShort(v) => i128::from(*v),
        Field::UInt(v) => i128::from(*v),
        Field::ULong(v) => i128::from(*v),
        _ => return None,
    })
}

/// A Parquet decimal's unscaled value: big-endian two's complement of 1..=16 bytes.
fn decimal_unscaled(bytes: &[u8]) -> std::result::Result<i128, String> {
    if bytes.is_empty() || bytes.len() > 16 {
        return Err(format!("decimal of {} bytes is not supported (1 to 16)", bytes.len()));
    }
    let negative = bytes[0] & 0x80 != 0;
    let mut widened = [if negative { 0xFF } else { 0 }; 16];
    widened[16 - bytes.len()..].copy_from_slice(bytes);
    Ok(i128::from_be_bytes(widened))
}

/// A value for a `numeric(precision, scale)` column from a Parquet decimal, integer, float
/// or string, checked against the precision like PostgreSQL's cast.
fn decimal_value(field: &Field, precision: u8, scale: u8) -> std::result::Result<Value, String> {
    let scaled: i128 = match field {
        Field::Decimal(d) => {
            let from_scale = u8::try_from(d.scale()).map_err(|_| format!("decimal scale {} unsupported", d.scale()))?;
            rescale(decimal_unscaled(d.data())?, from_scale, scale)?
        }
        Field::Double(v) => (v * 10f64.powi(i32::from(scale))).round() as i128,
        Field::Float(v) => (f64::from(*v) * 10f64.powi(i32::from(scale))).round() as i128,
        Field::Str(text) => i128::from(parse_decimal(text, scale).map_err(|e| e.to_string())?),
        other => {
            let v = integer(other).ok_or_else(|| format!("cannot load {other:?} into numeric({precision},{scale})"))?;
            rescale(v, 0, scale)?
        }
    };
    let limit = i128::from(pow10(precision.min(DECIMAL_PRECISION_MAX)));
    if scaled.abs() >= limit {
        return Err(format!("value does not fit numeric({precision},{scale})"));
    }
    let value = i64::try_from(scaled).map_err(|_| format!("value does not fit numeric({precision},{scale})"))?;
    Ok(Value::Decimal { value, scale })
}

/// Moves an unscaled decimal from one scale to another: exact when widening, rounding half
/// away from zero when narrowing.
fn rescale(value: i128, from_scale: u8, to_scale: u8) -> std::result::Result<i128, String> {
    let overflow = || "decimal value out of range".to_string();
    if to_scale >= from_scale {
        let factor = 10i128.checked_pow(u32::from(to_scale - from_scale)).ok_or_else(overflow)?;
        return value.checked_mul(factor).ok_or_else(overflow);
    }
    let divisor = 10i128.checked_pow(u32::from(from_scale - to_scale)).ok_or_else(overflow)?;
    let (quotient, remainder) = (value / divisor, value % divisor);
    let round_away = remainder.abs() * 2 >= divisor;
    Ok(if round_away { quotient + value.signum() } else { quotient })
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: decimal bytes and scales convert exactly. Method: known big-endian encodings and
    // rescaling cases, including negative values and half-way rounding.
    #[test]
    fn decimals_convert_exactly() {
        assert_eq!(decimal_unscaled(&[0xFF, 0x85]).expect("2 bytes"), -123);
        assert_eq!(decimal_unscaled(&12345i64.to_be_bytes()).expect("8 bytes"), 12345);
        assert!(decimal_unscaled(&[]).is_err());
        assert_eq!(rescale(12345, 2, 4).expect("widen"), 1_234_500);
        assert_eq!(rescale(12345, 3, 2).expect("narrow"), 1235);
        assert_eq!(rescale(-12345, 3, 2).expect("narrow"), -1235);
        assert_eq!(rescale(-12344, 3, 2).expect("narrow"), -1234);
        let field = Field::Decimal(parquet::data_type::Decimal::from_i64(-4_550, 15, 2));
        assert_eq!(decimal_value(&field, 12, 2).expect("fits"), Value::Decimal { value: -4_550, scale: 2 });
        assert!(decimal_value(&field, 3, 2).is_err(), "-45.50 does not fit numeric(3,2)");
    }
}
