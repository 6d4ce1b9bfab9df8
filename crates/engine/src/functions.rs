//! Scalar functions: string functions, rounding, COALESCE and NULLIF. Binding gives each call
//! PostgreSQL's signature (argument types, result type, `42883` for a call with no matching
//! signature); evaluation runs a row at a time over the argument vectors, which is enough for
//! functions that sit in projections and filters (the hot arithmetic stays in `expr`).

use crate::bind::{cast_expr, fold, is_untyped, unify};
use crate::datetime::DatePart;
use crate::error::{EngineError, Result};
use crate::expr::Expr;
use crate::types::{compare_values, DataType, Value};
use crate::vector::Vector;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScalarFunction {
    Coalesce,
    NullIf,
    Upper,
    Lower,
    Length,
    /// `a || b`.
    Concat,
    Replace,
    /// `strpos(text, sub)` = `position(sub IN text)`.
    Position,
    Trim(TrimSide),
    Round,
    Trunc,
    Floor,
    Ceil,
    /// `abs(x)`: its argument evaluated once (binding it as a CASE copied the argument three
    /// times, so nested calls grew as 3^depth).
    Abs,
    /// `date_trunc(unit, timestamp)`; a date is truncated as a `timestamp with time zone`.
    DateTrunc(DatePart),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrimSide {
    Both,
    Leading,
    Trailing,
}

impl ScalarFunction {
    /// The function a SQL name calls, if it is one of these.
    pub fn named(name: &str) -> Option<ScalarFunction> {
        use ScalarFunction as F;
        Some(match name {
            "coalesce" => F::Coalesce,
            "nullif" => F::NullIf,
            "upper" => F::Upper,
            "lower" => F::Lower,
            "length" | "char_length" | "character_length" => F::Length,
            "replace" => F::Replace,
            "strpos" => F::Position,
            "btrim" => F::Trim(TrimSide::Both),
            "ltrim" => F::Trim(TrimSide::Leading),
            "rtrim" => F::Trim(TrimSide::Trailing),
            "round" => F::Round,
            "trunc" => F::Trunc,
            "floor" => F::Floor,
            "ceil" | "ceiling" => F::Ceil,
            "abs" => F::Abs,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        use ScalarFunction as F;
        match self {
            F::Coalesce => "coalesce",
            F::NullIf => "nullif",
            F::Upper => "upper",
            F::Lower => "lower",
            F::Length => "length",
            F::Concat => "||",
            F::Replace => "replace",
            F::Position => "strpos",
            F::Trim(TrimSide::Both) => "btrim",
            F::Trim(TrimSide::Leading) => "ltrim",
            F::Trim(TrimSide::Trailing) => "rtrim",
            F::Round => "round",
            F::Trunc => "trunc",
            F::Floor => "floor",
            F::Ceil => "ceil",
            F::Abs => "abs",
            F::DateTrunc(_) => "date_trunc",
        }
    }
}

/// `function(args)` typed as PostgreSQL types it, constants folded.
pub fn call(function: ScalarFunction, args: Vec<Expr>) -> Result<Expr> {
    use ScalarFunction as F;
    let (args, data_type) = match function {
        F::Coalesce if !args.is_empty() => unify(args)?,
        F::NullIf if args.len() == 2 => unify(args)?,
        F::Upper | F::Lower if args.len() == 1 => (texts(function, args)?, DataType::Text),
        F::Length if args.len() == 1 => (texts(function, args)?, DataType::Int32),
        F::Replace if args.len() == 3 => (texts(function, args)?, DataType::Text),
        F::Position if args.len() == 2 => (texts(function, args)?, DataType::Int32),
        F::Trim(_) if (1..=2).contains(&args.len()) => (texts(function, args)?, DataType::Text),
        F::Concat if args.len() == 2 => (concat_operands(args)?, DataType::Text),
        F::Round | F::Trunc | F::Floor | F::Ceil => rounding(function, args)?,
        F::Abs if args.len() == 1 && args[0].data_type().is_numeric() => {
            let data_type = args[0].data_type();
            (args, data_type)
        }
        // An untyped literal resolves to abs(float8), as in PostgreSQL.
        F::Abs if args.len() == 1 && is_untyped(&args[0]) => {
            (args.into_iter().map(|a| cast_expr(a, DataType::Float64)).collect::<Result<_>>()?, DataType::Float64)
        }
        F::DateTrunc(part) if args.len() == 1 => date_trunc_operand(part, args)?,
        _ => return Err(no_signature(function, &args)),
    };
    fold(Expr::Function { function, args, data_type })
}

/// date_trunc's operand: a timestamp of either kind, or a date read as a `timestamp with
/// time zone` (PostgreSQL's choice for a date); units that are not spans are refused.
fn date_trunc_operand(part: DatePart, mut args: Vec<Expr>) -> Result<(Vec<Expr>, DataType)> {
    let value = args.remove(0);
    let value = match value.data_type() {
        DataType::Timestamp | DataType::TimestampTz => value,
        DataType::Date => {
            crate::datetime::check_time_zone()?;
            cast_expr(value, DataType::TimestampTz)?
        }
        _ => return Err(no_signature(ScalarFunction::DateTrunc(part), &[value])),
    };
    let data_type = value.data_type();
    if crate::datetime::truncate(part, 0).is_err() {
        return Err(EngineError::InvalidParameterValue(format!(
            "unit \"{}\" not recognized for type {}",
            part.name(),
            data_type.sql_name()
        )));
    }
    Ok((vec![value], data_type))
}

fn no_signature(function: ScalarFunction, args: &[Expr]) -> EngineError {
    let types: Vec<String> = args.iter().map(|a| a.data_type().sql_name()).collect();
    EngineError::UndefinedFunction(format!("function {}({}) does not exist", function.name(), types.join(", ")))
}

/// Arguments of a text function: text, or untyped literals taken as text.
fn texts(function: ScalarFunction, args: Vec<Expr>) -> Result<Vec<Expr>> {
    if args.iter().any(|a| !a.data_type().is_text() && !is_untyped(a)) {
        return Err(no_signature(function, &args));
    }
    args.into_iter().map(|a| cast_expr(a, DataType::Text)).collect()
}

/// `||`: text with text, or text with any other value, which is converted to its text form
/// (PostgreSQL's `anynonarray || text`).
fn concat_operands(args: Vec<Expr>) -> Result<Vec<Expr>> {
    let textual = |a: &Expr| a.data_type().is_text() || is_untyped(a);
    if !args.iter().any(textual) {
        return Err(EngineError::UndefinedFunction(format!(
            "operator does not exist: {} || {}",
            args[0].data_type().sql_name(),
            args[1].data_type().sql_name()
        )));
    }
    args.into_iter().map(|a| cast_expr(a, DataType::Text)).collect()
}

/// round/trunc/floor/ceil: exact types give numeric, float8 gives float8; integers go to
/// float8 with one argument (PostgreSQL's preferred type) and numeric with a digit count.
fn rounding(function: ScalarFunction, mut args: Vec<Expr>) -> Result<(Vec<Expr>, DataType)> {
    let with_digits = args.len() == 2;
    let allowed_arity = if matches!(function, ScalarFunction::Round | ScalarFunction::Trunc) { 1..=2 } else { 1..=1 };
    if !allowed_arity.contains(&args.len()) {
        return Err(no_signature(function, &args));
    }
    if with_digits {
        let digits = args.pop().expect("two arguments");
        if !matches!(digits.data_type(), DataType::Int16 | DataType::Int32 | DataType::Int64) && !is_untyped(&digits) {
            return Err(no_signature(function, &[args.remove(0), digits]));
        }
        args.push(cast_expr(digits, DataType::Int32)?);
    }
    let value = args.remove(0);
    let target = match value.data_type() {
        DataType::Float64 | DataType::Float32 if !with_digits => DataType::Float64,
        DataType::Int16 | DataType::Int32 | DataType::Int64 if !with_digits => DataType::Float64,
        DataType::Int16 | DataType::Int32 | DataType::Int64 | DataType::Decimal { .. } | DataType::Numeric => {
            DataType::Numeric
        }
        _ if is_untyped(&value) => DataType::Float64,
        _ => {
            args.insert(0, value);
            return Err(no_signature(function, &args));
        }
    };
    args.insert(0, cast_expr(value, target)?);
    Ok((args, target))
}

/// Evaluates a call over argument vectors of `rows` rows.
pub fn evaluate(function: ScalarFunction, args: &[Vector], rows: usize, data_type: DataType) -> Result<Vector> {
    let mut values = Vec::with_capacity(rows);
    let mut row_args = Vec::with_capacity(args.len());
    for row in 0..rows {
        row_args.clear();
        row_args.extend(args.iter().map(|a| a.value(row)));
        values.push(apply(function, &row_args, data_type)?);
    }
    Ok(Vector::from_values(&values, data_type))
}

fn apply(function: ScalarFunction, args: &[Value], data_type: DataType) -> Result<Value> {
    use ScalarFunction as F;
    match function {
        F::Coalesce => Ok(args.iter().find(|v| !v.is_null()).cloned().unwrap_or(Value::Null)),
        F::NullIf => Ok(match (&args[0], &args[1]) {
            (a, b) if !a.is_null() && !b.is_null() && compare_values(a, b).is_eq() => Value::Null,
            (a, _) => a.clone(),
        }),
        _ if args.iter().any(Value::is_null) => Ok(Value::Null),
        // The engine's collation is C (byte order), and so is its case mapping: ASCII letters only,
        // as PostgreSQL's upper/lower in a database with LC_CTYPE C.
        F::Upper => Ok(Value::Text(text(&args[0]).to_ascii_uppercase())),
        F::Lower => Ok(Value::Text(text(&args[0]).to_ascii_lowercase())),
        F::Length => Ok(Value::Int32(i32::try_from(text(&args[0]).chars().count()).unwrap_or(i32::MAX))),
        F::Concat => Ok(Value::Text(format!("{}{}", text(&args[0]), text(&args[1])))),
        F::Replace => Ok(Value::Text(replace(text(&args[0]), text(&args[1]), text(&args[2])))),
        F::Position => Ok(Value::Int32(position(text(&args[0]), text(&args[1])))),
        F::Trim(side) => Ok(Value::Text(trim(text(&args[0]), args.get(1).map_or(" ", text), side))),
        F::Round | F::Trunc | F::Floor | F::Ceil => round(function, args),
        F::Abs => abs(&args[0], data_type),
        F::DateTrunc(part) => match args[0] {
            Value::Timestamp(t) => Ok(Value::Timestamp(crate::datetime::truncate(part, t)?)),
            Value::TimestampTz(t) => Ok(Value::TimestampTz(crate::datetime::truncate(part, t)?)),
            ref other => Err(EngineError::Runtime(format!("date_trunc of {other:?}"))),
        },
    }
}

/// PostgreSQL's abs: integer minimums have no absolute value in their type (22003).
fn abs(value: &Value, data_type: DataType) -> Result<Value> {
    let out_of_range = |name: &str| EngineError::Overflow(format!("{name} out of range"));
    Ok(match value {
        Value::Int32(x) if data_type == DataType::Int16 => {
            Value::Int32(x.checked_abs().filter(|a| *a <= i32::from(i16::MAX)).ok_or_else(|| out_of_range("smallint"))?)
        }
        Value::Int32(x) => Value::Int32(x.checked_abs().ok_or_else(|| out_of_range("integer"))?),
        Value::Float32(x) => Value::Float32(x.abs()),
        Value::Int64(x) => Value::Int64(x.checked_abs().ok_or_else(|| out_of_range("bigint"))?),
        Value::Decimal { value, scale } => {
            Value::Decimal { value: value.checked_abs().ok_or_else(|| out_of_range("numeric"))?, scale: *scale }
        }
        Value::Float64(x) => Value::Float64(x.abs()),
        Value::Numeric(n) if n.signum() < 0 => Value::Numeric(n.negated()),
        other => other.clone(),
    })
}

fn text(value: &Value) -> &str {
    match value {
        Value::Text(s) => s,
        _ => panic!("the binder types text function arguments as text"),
    }
}

fn replace(value: &str, from: &str, to: &str) -> String {
    if from.is_empty() {
        return value.to_string();
    }
    value.replace(from, to)
}

/// 1-based character position of `sub` in `value`, 0 when absent.
fn position(value: &str, sub: &str) -> i32 {
    match value.find(sub) {
        Some(byte) => i32::try_from(value[..byte].chars().count() + 1).unwrap_or(i32::MAX),
        None => 0,
    }
}

fn trim(value: &str, characters: &str, side: TrimSide) -> String {
    let strip = |c: char| characters.contains(c);
    match side {
        TrimSide::Both => value.trim_matches(strip),
        TrimSide::Leading => value.trim_start_matches(strip),
        TrimSide::Trailing => value.trim_end_matches(strip),
    }
    .to_string()
}

fn round(function: ScalarFunction, args: &[Value]) -> Result<Value> {
    use ScalarFunction as F;
    let digits = match args.get(1) {
        Some(Value::Int32(d)) => *d,
        _ => 0,
    };
    match &args[0] {
        // float8 round is rint(): halves go to the even neighbour.
        Value::Float64(x) => Ok(Value::Float64(match function {
            F::Round => x.round_ties_even(),
            F::Trunc => x.trunc(),
            F::Floor => x.floor(),
            _ => x.ceil(),
        })),
        Value::Numeric(n) => Ok(Value::Numeric(match function {
            F::Round => n.round(digits)?,
            F::Trunc => n.trunc(digits)?,
            F::Floor => n.floor(),
            _ => n.ceil(),
        })),
        other => Err(EngineError::Runtime(format!("{} of {other:?}", function.name()))),
    }
}
