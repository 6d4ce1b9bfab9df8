//! The session-state guard of transaction mode: finds statements that leave state on the server
//! beyond their transaction (`SET` of untracked parameters, `LISTEN`, SQL `PREPARE`, `DECLARE …
//! WITH HOLD`, temporary tables, `SET ROLE`, `LOAD`), so the relay can warn about them or refuse
//! them (`session_state`), and so the server is reset before another client gets it.
//!
//! `SET` of a tracked parameter ([`crate::params::TRACKED`]) is safe: PostgreSQL reports the new
//! value in a ParameterStatus, and the pooler replays it on whichever server the client gets.

use crate::params::tracked_index;

/// Statements inspected in one simple query (a bound on work per message).
const STATEMENTS_MAX: usize = 32;

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

/// A cheap first look that allocates nothing: false when the text certainly changes no session
/// state (its first keyword is none of ours and it holds a single statement).
pub fn might_change_state(sql: &[u8]) -> bool {
    let start = sql.iter().position(|b| !b.is_ascii_whitespace()).unwrap_or(sql.len());
    let text = &sql[start..];
    if text.starts_with(b"--") || text.starts_with(b"/*") {
        return true;
    }
    let word_end = text.iter().position(|b| !b.is_ascii_alphabetic()).unwrap_or(text.len());
    let word = &text[..word_end];
    let ours = ["SET", "RESET", "LISTEN", "PREPARE", "DECLARE", "CREATE", "LOAD"];
    if ours.iter().any(|keyword| word.eq_ignore_ascii_case(keyword.as_bytes())) {
        return true;
    }
    // Another statement after a semicolon (trailing semicolons and spaces do not count).
    text.iter().position(|&b| b == b';').is_some_and(|at| text[at..].iter().any(|b| !b" \t\r\n;".contains(b)))
}

/// Classifies SQL text (one or more `;`-separated statements): the first untracked change wins.
pub fn classify(sql: &[u8]) -> StateChange {
    let text = String::from_utf8_lossy(sql);
    let mut result = StateChange::None;
    for statement in text.split(';').take(STATEMENTS_MAX) {
        match classify_statement(&strip_comments(statement)) {
            StateChange::Untracked(kind) => return StateChange::Untracked(kind),
            StateChange::Tracked => result = StateChange::Tracked,
            StateChange::None => {}
        }
    }
    result
}

fn classify_statement(statement: &str) -> StateChange {
    let words: Vec<String> = statement.split_whitespace().take(6).map(str::to_ascii_uppercase).collect();
    let word = |index: usize| words.get(index).map(String::as_str).unwrap_or("");
    match word(0) {
        "SET" => classify_set(&words[1..], statement),
        "LISTEN" => StateChange::Untracked("LISTEN"),
        "PREPARE" if word(1) != "TRANSACTION" => StateChange::Untracked("PREPARE"),
        "DECLARE" if statement.to_ascii_uppercase().contains("WITH HOLD") => {
            StateChange::Untracked("DECLARE … WITH HOLD")
        }
        "CREATE" if is_temporary(&words[1..]) => StateChange::Untracked("CREATE TEMPORARY"),
        "LOAD" => StateChange::Untracked("LOAD"),
        _ => StateChange::None,
    }
}

/// `SET` after its keyword: `words` are upper-cased, `statement` keeps the parameter's case.
fn classify_set(words: &[String], statement: &str) -> StateChange {
    let first = words.first().map(String::as_str).unwrap_or("");
    let (name_index, rest) = match first {
        "LOCAL" | "TRANSACTION" => return StateChange::None,
        "SESSION" => (2, words.get(1).map(String::as_str).unwrap_or("")),
        _ => (1, first),
    };
    match rest {
        "AUTHORIZATION" | "CHARACTERISTICS" => return StateChange::Untracked("SET SESSION"),
        "ROLE" => return StateChange::Untracked("SET ROLE"),
        _ => {}
    }
    let name = statement.split_whitespace().nth(name_index).unwrap_or("");
    let name = name.split(['=', ' ']).next().unwrap_or("").trim_matches('"');
    match tracked_index(name.as_bytes()) {
        Some(_) => StateChange::Tracked,
        None => StateChange::Untracked("SET"),
    }
}

/// `CREATE [GLOBAL|LOCAL] TEMP|TEMPORARY …`.
fn is_temporary(words: &[String]) -> bool {
    let words: Vec<&str> = words.iter().map(String::as_str).filter(|w| *w != "GLOBAL" && *w != "LOCAL").collect();
    matches!(words.first(), Some(&"TEMP" | &"TEMPORARY"))
}

/// Removes `--` line comments and `/* */` block comments (not nested; enough to find the
/// first keyword of a statement).
fn strip_comments(statement: &str) -> String {
    let mut out = String::with_capacity(statement.len());
    let mut rest = statement;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix("--") {
            rest = after.split_once('\n').map(|(_, tail)| tail).unwrap_or("");
            out.push(' ');
        } else if let Some(after) = rest.strip_prefix("/*") {
            rest = after.split_once("*/").map(|(_, tail)| tail).unwrap_or("");
            out.push(' ');
        } else {
            let next = rest.chars().next().expect("not empty");
            out.push(next);
            rest = &rest[next.len_utf8()..];
        }
    }
    out
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
}
