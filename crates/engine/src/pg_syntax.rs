//! PostgreSQL syntax sqlparser 0.63 does not read, handled in the token stream before the
//! parser sees it: rewritten when this engine means the same by other words, refused with
//! 0A000 when it does not support it (instead of a syntax error PostgreSQL would not give).
//!
//! - `FROM ONLY t`, `UPDATE ONLY t`, `DELETE FROM ONLY t`, `TRUNCATE ONLY t`: ONLY leaves out
//!   inheritance children; the name is marked (see [`ONLY_QUALIFIER`]).
//! - `FROM t*` (t and its children, PostgreSQL's default anyway): the `*` is dropped.
//! - `JOIN … USING (…) AS alias`: refused.
//! - Window frame syntax: see `frame_syntax`.

use sqlparser::tokenizer::{Token, TokenWithSpan, Word};

use crate::error::{EngineError, Result};

/// The token stream with PostgreSQL-only syntax rewritten, or the refusal it needs.
pub fn rewrite(tokens: Vec<TokenWithSpan>) -> Result<Vec<TokenWithSpan>> {
    refuse_unsupported(&tokens)?;
    Ok(crate::frame_syntax::rewrite(mark_only(tokens)))
}

fn is_word(token: &Token, wanted: &str) -> bool {
    matches!(token, Token::Word(Word { value, quote_style: None, .. }) if value.eq_ignore_ascii_case(wanted))
}

/// Indexes of the tokens that are not whitespace, in order.
fn solid(tokens: &[TokenWithSpan]) -> Vec<usize> {
    (0..tokens.len()).filter(|&i| !matches!(tokens[i].token, Token::Whitespace(_))).collect()
}

fn refuse_unsupported(tokens: &[TokenWithSpan]) -> Result<()> {
    let solid = solid(tokens);
    let token = |k: usize| solid.get(k).map(|&i| &tokens[i].token);
    for k in 0..solid.len() {
        if token(k).is_some_and(|t| is_word(t, "USING")) && token(k + 1) == Some(&Token::LParen) {
            let close = (k + 2..solid.len()).find(|&j| token(j) == Some(&Token::RParen));
            let aliased = close.is_some_and(|j| token(j + 1).is_some_and(|t| is_word(t, "AS")));
            if aliased {
                return Err(EngineError::unsupported("JOIN … USING (…) AS alias"));
            }
        }
    }
    Ok(())
}

/// The schema-like qualifier `ONLY t` becomes (`"\u{1}only".t`): sqlparser has no ONLY, and
/// no identifier a client can write starts with this byte. See [`crate::ddl::is_only`].
pub const ONLY_QUALIFIER: &str = "\u{1}only";

/// Marks the table after ONLY (following FROM / JOIN / UPDATE / TRUNCATE) with
/// [`ONLY_QUALIFIER`], and drops the `*` of `FROM t*` (t and its descendants: the default).
fn mark_only(tokens: Vec<TokenWithSpan>) -> Vec<TokenWithSpan> {
    let solid = solid(&tokens);
    let mut marked = Vec::new();
    let mut stars = Vec::new();
    for k in 1..solid.len() {
        let (before, current) = (&tokens[solid[k - 1]].token, &tokens[solid[k]].token);
        let after = solid.get(k + 1).map(|&i| &tokens[i].token);
        let opener = ["FROM", "JOIN", "UPDATE", "TRUNCATE"].iter().any(|w| is_word(before, w));
        if opener && is_word(current, "ONLY") && matches!(after, Some(Token::Word(_))) {
            marked.push(solid[k]);
        }
        let after_from = is_word(before, "FROM") || is_word(before, "JOIN");
        if after_from && matches!(current, Token::Word(_)) && after == Some(&Token::Mul) {
            stars.push(solid[k + 1]);
        }
    }
    if marked.is_empty() && stars.is_empty() {
        return tokens;
    }
    let mut rewritten = Vec::with_capacity(tokens.len() + marked.len());
    for (i, token) in tokens.into_iter().enumerate() {
        if stars.contains(&i) {
            continue;
        }
        if marked.contains(&i) {
            let qualifier = Token::Word(Word {
                value: ONLY_QUALIFIER.to_string(),
                quote_style: Some('"'),
                keyword: sqlparser::keywords::Keyword::NoKeyword,
            });
            rewritten.push(TokenWithSpan::new(qualifier, token.span));
            rewritten.push(TokenWithSpan::new(Token::Period, token.span));
            continue;
        }
        rewritten.push(token);
    }
    rewritten
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqlparser::dialect::PostgreSqlDialect;
    use sqlparser::tokenizer::Tokenizer;

    fn rewritten(sql: &str) -> Result<String> {
        let tokens = Tokenizer::new(&PostgreSqlDialect {}, sql).tokenize_with_location().expect("tokens");
        Ok(rewrite(tokens)?.iter().map(|t| t.token.to_string()).collect())
    }

    /// Goal: ONLY is dropped and unsupported PostgreSQL syntax refused, other text unchanged;
    /// method: rewrite small statements and compare.
    #[test]
    fn only_marked_and_star_dropped() {
        assert_eq!(
            rewritten("select * from only t join only u using (a)").expect("rewritten"),
            "select * from \"\u{1}only\". t join \"\u{1}only\". u using (a)"
        );
        assert_eq!(rewritten("select a * b from t").expect("rewritten"), "select a * b from t");
        assert_eq!(rewritten("select * from t* x").expect("rewritten"), "select * from t x");
        assert!(matches!(rewritten("select * from a join b using (i) as x"), Err(EngineError::Unsupported(_))));
    }
}
