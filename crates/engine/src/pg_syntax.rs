//! PostgreSQL syntax sqlparser 0.63 does not read, handled in the token stream before the
//! parser sees it: rewritten when this engine means the same by other words, refused with
//! 0A000 when it does not support it (instead of a syntax error PostgreSQL would not give).
//!
//! - `FROM ONLY t`, `UPDATE ONLY t`, `DELETE FROM ONLY t`, `TRUNCATE ONLY t`: ONLY leaves out
//!   inheritance children; this engine has no inheritance (CREATE TABLE … INHERITS is
//!   refused), so `ONLY t` is `t` and the word is dropped.
//! - `FROM t*` (t and its children) and `JOIN … USING (…) AS alias`: refused.
//! - Window frame syntax: see `frame_syntax`.

use sqlparser::tokenizer::{Token, TokenWithSpan, Word};

use crate::error::{EngineError, Result};

/// The token stream with PostgreSQL-only syntax rewritten, or the refusal it needs.
pub fn rewrite(tokens: Vec<TokenWithSpan>) -> Result<Vec<TokenWithSpan>> {
    refuse_unsupported(&tokens)?;
    Ok(crate::frame_syntax::rewrite(drop_only(tokens)))
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
        let after_from = k > 0 && token(k - 1).is_some_and(|t| is_word(t, "FROM") || is_word(t, "JOIN"));
        if after_from && matches!(token(k), Some(Token::Word(_))) && token(k + 1) == Some(&Token::Mul) {
            return Err(EngineError::unsupported("table inheritance (FROM name*)"));
        }
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

/// Drops ONLY between FROM / JOIN / UPDATE / TRUNCATE and a table name.
fn drop_only(tokens: Vec<TokenWithSpan>) -> Vec<TokenWithSpan> {
    if !tokens.iter().any(|t| is_word(&t.token, "ONLY")) {
        return tokens;
    }
    let solid = solid(&tokens);
    let mut dropped = Vec::new();
    for k in 1..solid.len().saturating_sub(1) {
        let (before, only, after) = (&tokens[solid[k - 1]].token, &tokens[solid[k]].token, &tokens[solid[k + 1]].token);
        let opener = ["FROM", "JOIN", "UPDATE", "TRUNCATE"].iter().any(|w| is_word(before, w));
        if opener && is_word(only, "ONLY") && matches!(after, Token::Word(_)) {
            dropped.push(solid[k]);
        }
    }
    tokens.into_iter().enumerate().filter(|(i, _)| !dropped.contains(i)).map(|(_, t)| t).collect()
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
    fn only_dropped_and_inheritance_refused() {
        assert_eq!(
            rewritten("select * from only t join only u using (a)").expect("rewritten"),
            "select * from  t join  u using (a)"
        );
        assert_eq!(rewritten("select a * b from t").expect("rewritten"), "select a * b from t");
        assert!(matches!(rewritten("select * from t* x"), Err(EngineError::Unsupported(_))));
        assert!(matches!(rewritten("select * from a join b using (i) as x"), Err(EngineError::Unsupported(_))));
    }
}
