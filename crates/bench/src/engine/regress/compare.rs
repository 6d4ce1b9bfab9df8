//! One statement's answers from PostgreSQL (the oracle) and the engine, and the verdict.

use serde::{Deserialize, Serialize};

/// What a server answered to one statement, as text (the simple query protocol).
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// A row set: column count and rows (None = NULL).
    Rows {
        columns: usize,
        rows: Vec<Vec<Option<String>>>,
    },
    /// A command without rows and the row count of its tag.
    Done {
        count: u64,
    },
    Error {
        code: String,
        message: String,
    },
    /// No answer: the connection broke or the client's deadline passed.
    Lost(String),
}

/// The verdict on one in-scope statement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Same rows (same order under a top-level ORDER BY), same row count, or the same error
    /// class as PostgreSQL.
    Matched,
    /// The engine answered 0A000 (feature not supported): counted as not run.
    Refused,
    /// Anything else: other rows, an error PostgreSQL did not raise, success where PostgreSQL
    /// failed, another error class, no answer.
    Wrong,
    /// Not run: only PostgreSQL can mean it (see scope.rs).
    OutOfScope,
}

/// SQLSTATE of a feature the engine does not support.
pub const REFUSED: &str = "0A000";
/// Relative tolerance for float8 cells printed with the same number of decimals (summation
/// order changes the last digits).
const RELATIVE_TOLERANCE: f64 = 1e-9;

/// The verdict and, unless matched, what differed.
pub fn judge(postgres: &Answer, engine: &Answer, ordered: bool) -> (Outcome, String) {
    let postgres_refused = matches!(postgres, Answer::Error { code, .. } if code == REFUSED);
    match (postgres, engine) {
        (_, Answer::Error { code, message }) if code == REFUSED && !postgres_refused => {
            (Outcome::Refused, message.clone())
        }
        (_, Answer::Lost(why)) => (Outcome::Wrong, format!("no answer from the engine: {why}")),
        (Answer::Lost(why), _) => (Outcome::Wrong, format!("no answer from PostgreSQL: {why}")),
        (Answer::Error { code: theirs, message }, Answer::Error { code: ours, message: our_message }) => {
            if theirs.get(..2) == ours.get(..2) {
                (Outcome::Matched, String::new())
            } else {
                (Outcome::Wrong, format!("error {ours} ({our_message}); PostgreSQL {theirs} ({message})"))
            }
        }
        (Answer::Error { code, message }, _) => {
            (Outcome::Wrong, format!("answered; PostgreSQL failed with {code} ({message})"))
        }
        (_, Answer::Error { code, message }) => (Outcome::Wrong, format!("error {code}: {message}")),
        (Answer::Done { count: theirs }, Answer::Done { count: ours }) => {
            if theirs == ours {
                (Outcome::Matched, String::new())
            } else {
                (Outcome::Wrong, format!("{ours} rows affected; PostgreSQL {theirs}"))
            }
        }
        (Answer::Rows { columns: theirs_columns, rows: theirs }, Answer::Rows { columns, rows }) => {
            if columns != theirs_columns {
                return (Outcome::Wrong, format!("{columns} columns; PostgreSQL {theirs_columns}"));
            }
            match compare_rows(rows, theirs, ordered) {
                None => (Outcome::Matched, String::new()),
                Some(difference) => (Outcome::Wrong, difference),
            }
        }
        (Answer::Rows { .. }, Answer::Done { .. }) => (Outcome::Wrong, "no rows; PostgreSQL returned rows".into()),
        (Answer::Done { .. }, Answer::Rows { .. }) => (Outcome::Wrong, "rows; PostgreSQL returned none".into()),
    }
}

/// Where `ours` differs from `theirs` (as sequences when `ordered`, else as multisets).
fn compare_rows(ours: &[Vec<Option<String>>], theirs: &[Vec<Option<String>>], ordered: bool) -> Option<String> {
    if ours.len() != theirs.len() {
        return Some(format!(
            "{} rows; PostgreSQL {}; first {} vs {}",
            ours.len(),
            theirs.len(),
            show(ours.first()),
            show(theirs.first())
        ));
    }
    let (mut ours, mut theirs) = (ours.to_vec(), theirs.to_vec());
    if !ordered {
        ours.sort();
        theirs.sort();
    }
    let position = ours.iter().zip(&theirs).position(|(a, b)| !rows_match(a, b))?;
    let order_only = ordered && {
        let (mut a, mut b) = (ours.clone(), theirs.clone());
        a.sort();
        b.sort();
        a.iter().zip(&b).all(|(x, y)| rows_match(x, y))
    };
    let note = if order_only { " (same rows, another order)" } else { "" };
    Some(format!("row {position}: {} vs PostgreSQL {}{note}", show(ours.get(position)), show(theirs.get(position))))
}

fn show(row: Option<&Vec<Option<String>>>) -> String {
    let Some(row) = row else { return "none".into() };
    let cells: Vec<&str> = row.iter().map(|c| c.as_deref().unwrap_or("NULL")).collect();
    let text = format!("({})", cells.join(", "));
    if text.chars().count() > 120 {
        format!("{}…", text.chars().take(120).collect::<String>())
    } else {
        text
    }
}

fn rows_match(ours: &[Option<String>], theirs: &[Option<String>]) -> bool {
    ours.len() == theirs.len()
        && ours.iter().zip(theirs).all(|(a, b)| match (a, b) {
            (Some(a), Some(b)) => cells_match(a, b),
            (None, None) => true,
            _ => false,
        })
}

/// Same text, or float8 values that differ only past [`RELATIVE_TOLERANCE`] and print with
/// the same number of decimals (so numeric scales still have to match: 2.0 is not 2.00).
pub fn cells_match(ours: &str, theirs: &str) -> bool {
    if ours == theirs {
        return true;
    }
    let decimals = |s: &str| s.split_once('.').map(|(_, d)| d.len());
    let exponent = |s: &str| s.contains(['e', 'E']);
    match (ours.parse::<f64>(), theirs.parse::<f64>()) {
        (Ok(a), Ok(b)) if a.is_finite() && b.is_finite() => {
            let close = (a - b).abs() <= RELATIVE_TOLERANCE * a.abs().max(b.abs());
            close && (decimals(ours) == decimals(theirs) || exponent(ours) || exponent(theirs) || long(ours, theirs))
        }
        _ => false,
    }
}

/// float8's shortest round-trip output may drop or add a last digit: 15+ significant digits.
fn long(a: &str, b: &str) -> bool {
    let digits = |s: &str| s.chars().filter(char::is_ascii_digit).count();
    digits(a) >= 15 || digits(b) >= 15
}

/// Whether `sql` has ORDER BY outside parentheses (then row order is part of the answer).
pub fn ordered(sql: &str) -> bool {
    let mut depth = 0usize;
    let mut quoted = false;
    let mut outside = String::with_capacity(sql.len());
    for c in sql.chars() {
        match c {
            '\'' => quoted = !quoted,
            '(' if !quoted => depth += 1,
            ')' if !quoted => depth = depth.saturating_sub(1),
            _ if !quoted && depth == 0 => outside.push(c),
            _ => {}
        }
    }
    let words = super::scope::words(&outside);
    words.windows(2).any(|pair| pair[0] == "order" && pair[1] == "by")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(cells: &[&[Option<&str>]]) -> Answer {
        let rows: Vec<Vec<Option<String>>> =
            cells.iter().map(|row| row.iter().map(|c| c.map(str::to_string)).collect()).collect();
        Answer::Rows { columns: cells.first().map_or(0, |r| r.len()), rows }
    }

    fn error(code: &str) -> Answer {
        Answer::Error { code: code.into(), message: "m".into() }
    }

    // Goal: each verdict comes from the case the brief names (refused is never matched, same
    // error class matches, order counts only under ORDER BY, numeric scale counts); method:
    // one pair of answers per case.
    #[test]
    fn verdicts() {
        let ab = rows(&[&[Some("1")], &[Some("2")]]);
        let ba = rows(&[&[Some("2")], &[Some("1")]]);
        assert_eq!(judge(&ab, &ba, false).0, Outcome::Matched);
        assert_eq!(judge(&ab, &ba, true).0, Outcome::Wrong);
        assert!(judge(&ab, &ba, true).1.contains("another order"));
        assert_eq!(judge(&ab, &error(REFUSED), false).0, Outcome::Refused);
        assert_eq!(judge(&error("42883"), &error(REFUSED), false).0, Outcome::Refused);
        assert_eq!(judge(&error(REFUSED), &error(REFUSED), false).0, Outcome::Matched);
        assert_eq!(judge(&error("22012"), &error("22003"), false).0, Outcome::Matched, "same class 22");
        assert_eq!(judge(&error("22012"), &error("42601"), false).0, Outcome::Wrong);
        assert_eq!(judge(&error("22012"), &ab, false).0, Outcome::Wrong);
        assert_eq!(judge(&ab, &error("42P01"), false).0, Outcome::Wrong);
        assert_eq!(judge(&Answer::Done { count: 3 }, &Answer::Done { count: 3 }, false).0, Outcome::Matched);
        assert_eq!(judge(&Answer::Done { count: 3 }, &Answer::Done { count: 2 }, false).0, Outcome::Wrong);
        assert_eq!(judge(&ab, &Answer::Lost("timeout".into()), false).0, Outcome::Wrong);
        let null = rows(&[&[None], &[Some("2")]]);
        assert_eq!(judge(&ab, &null, false).0, Outcome::Wrong);
    }

    #[test]
    fn cells_and_order() {
        assert!(cells_match("0.30000000000000004", "0.3000000000000001"));
        assert!(!cells_match("2.0", "2.00"), "numeric scale is part of the answer");
        assert!(!cells_match("1", "2"));
        assert!(ordered("select a from t order by a"));
        assert!(!ordered("select (select a from t order by a limit 1), sum(x) over (order by y) from t"));
        assert!(ordered("with c as (select 1) select * from c union select 2 order by 1"));
    }
}
