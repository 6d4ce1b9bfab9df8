//! The session-state guard of transaction mode: finds statements that leave state on the server
//! beyond their transaction (`SET` of untracked parameters, `LISTEN`, SQL `PREPARE`, `DECLARE …
//! WITH HOLD`, temporary tables, `SET ROLE`, `LOAD`), so the relay can warn about them or refuse
//! them (`session_state`), and so the server is reset before another client gets it.
//!
//! `SET` of a tracked parameter ([`crate::params::TRACKED`]) is safe: PostgreSQL reports the new
//! value in a ParameterStatus, and the pooler replays it on whichever server the client gets.

use bypass_wire::sql::{self, Token};

use crate::params::tracked_index;

/// Statements inspected in one simple query (a bound on work per message).
const STATEMENTS_MAX: usize = 32;
/// First keywords of the statements that may change session state.
const STATE_KEYWORDS: [&str; 7] = ["SET", "RESET", "LISTEN", "PREPARE", "DECLARE", "CREATE", "LOAD"];

/// What a statement does to session state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateChange {
    /// Nothing that outlives the transaction.
    None,
    /// `SET` of a parameter the pooler tracks and replays.
    Tracked,
    /// State the pooler does not carry to other servers; names the statement kind.
    Untracked(&'static str),
}

/// A cheap first look that allocates nothing (for valid UTF-8): false when the text certainly
/// changes no session state (its first keyword is none of ours and it holds one statement).
pub fn might_change_state(sql: &[u8]) -> bool {
    let text = String::from_utf8_lossy(sql);
    let first_is_ours = match sql::first_token(&text) {
        Some(token) => STATE_KEYWORDS.iter().any(|keyword| token.is_keyword(keyword)),
        None => false,
    };
    first_is_ours || (sql.contains(&b';') && sql::has_several_statements(&text))
}

/// Classifies SQL text (one or more `;`-separated statements, split by the shared lexer so a
/// `;` inside a string or comment splits nothing): the first untracked change wins.
pub fn classify(sql: &[u8]) -> StateChange {
    let text = String::from_utf8_lossy(sql);
    let (statements, _) = sql::statements(&text, STATEMENTS_MAX);
    let mut result = StateChange::None;
    for statement in &statements {
        match classify_statement(statement) {
            StateChange::Untracked(kind) => return StateChange::Untracked(kind),
            StateChange::Tracked => result = StateChange::Tracked,
            StateChange::None => {}
        }
    }
    result
}

fn classify_statement(tokens: &[Token<'_>]) -> StateChange {
    let Some(first) = tokens.first() else { return StateChange::None };
    let rest = &tokens[1..];
    let next_is = |keyword: &str| rest.first().is_some_and(|token| token.is_keyword(keyword));
    if first.is_keyword("SET") {
        classify_set(rest)
    } else if first.is_keyword("LISTEN") {
        StateChange::Untracked("LISTEN")
    } else if first.is_keyword("PREPARE") && !next_is("TRANSACTION") {
        StateChange::Untracked("PREPARE")
    } else if first.is_keyword("DECLARE") && rest.windows(2).any(|w| w[0].is_keyword("WITH") && w[1].is_keyword("HOLD"))
    {
        StateChange::Untracked("DECLARE … WITH HOLD")
    } else if first.is_keyword("CREATE") && is_temporary(rest) {
        StateChange::Untracked("CREATE TEMPORARY")
    } else if first.is_keyword("LOAD") {
        StateChange::Untracked("LOAD")
    } else {
        StateChange::None
    }
}

/// `SET` after its keyword.
fn classify_set(rest: &[Token<'_>]) -> StateChange {
    let word = |index: usize| rest.get(index).copied();
    let is = |index: usize, keyword: &str| word(index).is_some_and(|token| token.is_keyword(keyword));
    if is(0, "LOCAL") || is(0, "TRANSACTION") {
        return StateChange::None;
    }
    let name_at = if is(0, "SESSION") { 1 } else { 0 };
    if is(name_at, "AUTHORIZATION") || is(name_at, "CHARACTERISTICS") {
        return StateChange::Untracked("SET SESSION");
    }
    if is(name_at, "ROLE") {
        return StateChange::Untracked("SET ROLE");
    }
    match word(name_at).and_then(|token| token.name()).and_then(|name| tracked_index(name.as_bytes())) {
        Some(_) => StateChange::Tracked,
        None => StateChange::Untracked("SET"),
    }
}

/// `CREATE [GLOBAL|LOCAL] TEMP|TEMPORARY …`.
fn is_temporary(rest: &[Token<'_>]) -> bool {
    let mut words = rest.iter().skip_while(|token| token.is_keyword("GLOBAL") || token.is_keyword("LOCAL"));
    words.next().is_some_and(|token| token.is_keyword("TEMP") || token.is_keyword("TEMPORARY"))
}

/// A query that makes PostgreSQL refuse in place of a statement (so the error arrives in order
/// with everything else the client pipelined).
pub fn refusal_sql(kind: &str) -> String {
    format!(
        "DO $bypass$BEGIN RAISE EXCEPTION USING ERRCODE = 'feature_not_supported', MESSAGE = \
         '{kind} is not allowed in transaction pooling (session_state = error): its state would \
         stay on a server other clients share'; END$bypass$"
    )
}

/// The WARNING a client gets for a statement whose state is not carried across transactions.
pub fn warning_text(kind: &str) -> String {
    format!(
        "{kind} changes session state, which transaction pooling does not keep: the server is \
         reset (DISCARD ALL) when this transaction ends"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_are_classified() {
        let cases: [(&str, StateChange); 14] = [
            ("select 1", StateChange::None),
            ("SET LOCAL work_mem = '8MB'", StateChange::None),
            ("set transaction isolation level serializable", StateChange::None),
            ("SET application_name = 'x'", StateChange::Tracked),
            ("set session TimeZone to 'UTC'", StateChange::Tracked),
            ("SET work_mem TO '64MB'", StateChange::Untracked("SET")),
            ("set search_path=app", StateChange::Untracked("SET")),
            ("SET ROLE admin", StateChange::Untracked("SET ROLE")),
            ("/* hi */ LISTEN chan", StateChange::Untracked("LISTEN")),
            ("PREPARE p AS select 1", StateChange::Untracked("PREPARE")),
            ("PREPARE TRANSACTION 'x'", StateChange::None),
            ("declare c cursor with hold for select 1", StateChange::Untracked("DECLARE … WITH HOLD")),
            ("create temp table t (x int)", StateChange::Untracked("CREATE TEMPORARY")),
            ("begin; -- note\n set datestyle = iso; commit", StateChange::Tracked),
        ];
        for (sql, expected) in cases {
            assert_eq!(classify(sql.as_bytes()), expected, "{sql}");
        }
    }

    #[test]
    fn semicolons_and_keywords_inside_strings_and_comments_change_nothing() {
        // Goal: the shared lexer, not a split on ';', decides statements. Method: state-changing
        // text hidden in a literal, a quoted name, a comment and a dollar body.
        for sql in [
            "select ';set work_mem = 1'",
            "select 1 as \"; listen x\"",
            "select 1 /* ; prepare p as select 1 */",
            "do $$ begin perform 1; end $$",
        ] {
            assert_eq!(classify(sql.as_bytes()), StateChange::None, "{sql}");
        }
        assert!(!might_change_state(b"select ';set x = 1'"));
        assert!(!might_change_state(b"-- c\nselect 1;"));
        assert!(might_change_state(b"/* c */ LISTEN x"));
        assert!(might_change_state(b"select 1; select 2"));
        assert!(might_change_state(b"\xff\xfe; set x = 1"), "invalid UTF-8 is still looked at");
    }
}
