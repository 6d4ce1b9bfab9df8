//! Extended-protocol parameters: `$n` placeholders replaced by SQL literals before parsing.

use pgwire::api::portal::Portal;
use pgwire::api::Type;

use crate::error::EngineError;

/// Placeholder positions: (byte range, parameter number), outside quotes and identifiers.
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

/// Number of distinct parameters (the highest `$n`).
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

/// The statement with the portal's parameters as literals; `inferred` gives the type of a
/// parameter the client did not declare (from describing the statement).
pub fn substitute(
    sql: &str,
    portal: &Portal<String>,
    inferred: &dyn Fn(usize) -> Option<Type>,
) -> Result<String, EngineError> {
    replace(sql, |number| {
        let index = number.checked_sub(1).ok_or_else(|| EngineError::Syntax("parameter $0".into()))?;
        let value = portal
            .parameters
            .get(index)
            .ok_or_else(|| EngineError::Syntax(format!("there is no parameter ${number}")))?;
        let Some(bytes) = value else { return Ok("NULL".to_string()) };
        let declared = portal
            .statement
            .parameter_types
            .get(index)
            .cloned()
            .flatten()
            .filter(|t| *t != Type::UNKNOWN)
            .or_else(|| inferred(number))
            .unwrap_or(Type::UNKNOWN);
        if portal.parameter_format.is_binary(index) {
            return binary_literal(bytes, &declared);
        }
        let text =
            std::str::from_utf8(bytes).map_err(|_| EngineError::InvalidValue("parameter is not UTF-8".into()))?;
        let numeric =
            matches!(declared, Type::INT2 | Type::INT4 | Type::INT8 | Type::FLOAT4 | Type::FLOAT8 | Type::NUMERIC);
        Ok(if numeric && text.parse::<f64>().is_ok() { text.to_string() } else { quote(text) })
    })
}

fn binary_literal(bytes: &[u8], declared: &Type) -> Result<String, EngineError> {
    let fixed = |n: usize| -> Result<&[u8], EngineError> {
        (bytes.len() == n)
            .then_some(bytes)
            .ok_or_else(|| EngineError::InvalidValue("binary parameter of the wrong size".into()))
    };
    Ok(match *declared {
        Type::BOOL => (fixed(1)?[0] != 0).to_string(),
        Type::INT2 => i16::from_be_bytes([bytes[0], *fixed(2)?.get(1).unwrap_or(&0)]).to_string(),
        Type::INT4 => {
            i32::from_be_bytes(fixed(4)?.try_into().map_err(|_| EngineError::InvalidValue("int4".into()))?).to_string()
        }
        Type::INT8 => {
            i64::from_be_bytes(fixed(8)?.try_into().map_err(|_| EngineError::InvalidValue("int8".into()))?).to_string()
        }
        Type::FLOAT8 => {
            f64::from_be_bytes(fixed(8)?.try_into().map_err(|_| EngineError::InvalidValue("float8".into()))?)
                .to_string()
        }
        Type::TEXT | Type::VARCHAR | Type::UNKNOWN => {
            quote(std::str::from_utf8(bytes).map_err(|_| EngineError::InvalidValue("parameter is not UTF-8".into()))?)
        }
        ref other => return Err(EngineError::unsupported(format!("binary parameters of type {}", other.name()))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: placeholders are found outside quotes only; method: fixed statements.
    #[test]
    fn finds_placeholders_outside_quotes() {
        assert_eq!(placeholder_count("select $1, '$2', $3"), 3);
        let described = with_sentinels("select a from t where b = $1 and c = '$1'");
        assert_eq!(described, format!("select a from t where b = '{}1' and c = '$1'", crate::bind::PARAMETER_SENTINEL));
        assert_eq!(placeholder_count("select 1"), 0);
    }
}
