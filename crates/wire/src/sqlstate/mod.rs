//! SQLSTATE codes: every code of PostgreSQL 15, under PostgreSQL's own macro names without the
//! `ERRCODE_` prefix (`SqlState::INVALID_PASSWORD` is `ERRCODE_INVALID_PASSWORD`, 28P01).
//!
//! [`codes`] is generated from PostgreSQL's `errcodes.h` by `crates/wire/gen/sqlstate.py`; never
//! type a code by hand: a typo would be a valid-looking code no client recognizes.

mod codes;

/// A five-character SQLSTATE code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SqlState(pub &'static str);

impl SqlState {
    /// The code as text, e.g. `"28P01"`.
    pub fn code(self) -> &'static str {
        self.0
    }

    /// The known code spelled `code`, if PostgreSQL defines it.
    pub fn from_code(code: &str) -> Option<SqlState> {
        codes::ALL.iter().find(|(state, _)| state.0 == code).map(|(state, _)| *state)
    }

    /// PostgreSQL's macro name without `ERRCODE_`, e.g. `"INVALID_PASSWORD"`.
    pub fn name(self) -> Option<&'static str> {
        codes::ALL.iter().find(|(state, _)| state.0 == self.0).map(|(_, name)| *name)
    }

    /// The two-character class (`"28"` for every authorization failure).
    pub fn class(self) -> &'static str {
        &self.0[..2]
    }
}

impl std::fmt::Display for SqlState {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(self.0)
    }
}

const _: () = {
    let mut index = 0;
    while index < codes::ALL.len() {
        assert!(codes::ALL[index].0 .0.len() == 5, "every SQLSTATE has five characters");
        index += 1;
    }
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_table_matches_postgres_for_codes_clients_check() {
        // Goal: the generated constants carry PostgreSQL's codes. Method: spot-check codes every
        // driver knows, and the lookups both ways.
        assert_eq!(SqlState::INVALID_PASSWORD.code(), "28P01");
        assert_eq!(SqlState::INVALID_AUTHORIZATION_SPECIFICATION.code(), "28000");
        assert_eq!(SqlState::TOO_MANY_CONNECTIONS.code(), "53300");
        assert_eq!(SqlState::FEATURE_NOT_SUPPORTED.code(), "0A000");
        assert_eq!(SqlState::STATEMENT_TOO_COMPLEX.code(), "54001");
        assert_eq!(SqlState::from_code("57014"), Some(SqlState::QUERY_CANCELED));
        assert_eq!(SqlState::from_code("ZZZZZ"), None);
        assert_eq!(SqlState::PROTOCOL_VIOLATION.name(), Some("PROTOCOL_VIOLATION"));
        assert_eq!(SqlState::INVALID_PASSWORD.class(), "28");
        assert!(codes::ALL.len() > 250);
    }
}
