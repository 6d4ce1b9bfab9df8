//! Quoting for the few SQL statements and config files the testkit writes.

use crate::TestkitError;

/// `"name"` with embedded double quotes doubled: a safe SQL identifier.
pub(crate) fn quote_identifier(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `'text'` with embedded single quotes doubled: a safe SQL literal under
/// `standard_conforming_strings = on` (the default since 9.1), also valid in postgresql.conf.
pub(crate) fn quote_literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// Rejects names that could break out of a config line, a quoted SQL string or an argument.
pub(crate) fn check_plain(what: &str, value: &str) -> Result<(), TestkitError> {
    if value.is_empty() {
        return Err(TestkitError::InvalidOption(format!("{what} must not be empty")));
    }
    check_single_line(what, value)
}

/// Rejects values containing NUL or line breaks; the empty string is allowed.
pub(crate) fn check_single_line(what: &str, value: &str) -> Result<(), TestkitError> {
    if value.contains(['\0', '\n', '\r']) {
        return Err(TestkitError::InvalidOption(format!("{what} {value:?} must be free of NUL and line breaks")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: quoting doubles the quote character and nothing else; method: literal examples.
    #[test]
    fn quotes_identifiers_and_literals() {
        assert_eq!(quote_identifier("a\"b"), "\"a\"\"b\"");
        assert_eq!(quote_literal("it's"), "'it''s'");
        assert_eq!(quote_literal("back\\slash"), "'back\\slash'");
    }

    // Goal: values with line breaks or NUL are refused; method: check good and bad values.
    #[test]
    fn refuses_line_breaks() {
        assert!(check_plain("user", "alice").is_ok());
        assert!(check_plain("user", "a\nb").is_err());
        assert!(check_plain("user", "").is_err());
        assert!(check_plain("user", "a\0b").is_err());
        assert!(check_single_line("password", "").is_ok());
        assert!(check_single_line("password", "x\ry").is_err());
    }
}
