//! PostgreSQL syntax sqlparser 0.63 does not read, handled in the token stream before the
//! parser sees it: rewritten when this engine means the same by other words, refused with
//! 0A000 when it does not support it (instead of a syntax error PostgreSQL would not give).
//!
//! - `FROM ONLY t`, `UPDATE ONLY t`, `DELETE FROM ONLY t`, `TRUNCATE ONLY t`: ONLY leaves out
//!   inheritance children; this engine has no inheritance (CREATE TABLE … INHERITS is
//!   refused), so `ONLY t` is `t` and the word is dropped.
//! - `FROM t*` (t and its children): refused.
//! - `JOIN … USING (a, b) AS x` (x names the merged columns): rewritten to `USING (a, b,
//!   "<JOIN_ALIAS_MARK>x")`, a column name no SQL text can hold, which the binder takes back
//!   out as the alias.
//! - Window frame syntax: see `frame_syntax`.

use sqlparser::keywords::Keyword;
use sqlparser::tokenizer::{Token, TokenWithSpan, Word};

use crate::error::{EngineError, Result};

/// The token stream with PostgreSQL-only syntax rewritten, or the refusal it needs.
pub fn rewrite(tokens: Vec<TokenWithSpan>) -> Result<Vec<TokenWithSpan>> {
    refuse_unsupported(&tokens)?;
    Ok(crate::frame_syntax::rewrite(join_aliases_into_using(drop_only(tokens))))
}

/// Starts the USING column that carries a join alias (a control character: never in a name
/// the tokenizer read from SQL text).
pub const JOIN_ALIAS_MARK: &str = "\u{1}join alias ";

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
    }
    Ok(())
}

/// `USING ( … ) AS x` → `USING ( … , "<mark>x" )`.
fn join_aliases_into_using(mut tokens: Vec<TokenWithSpan>) -> Vec<TokenWithSpan> {
    loop {
        let solid = solid(&tokens);
        let token = |k: usize| solid.get(k).map(|&i| &tokens[i].token);
        let aliased = (0..solid.len()).find_map(|k| {
            let opens = token(k).is_some_and(|t| is_word(t, "USING")) && token(k + 1) == Some(&Token::LParen);
            let close = (k + 2..solid.len()).find(|&j| token(j) == Some(&Token::RParen)).filter(|_| opens)?;
            // A column list (not `DELETE … USING (SELECT …) AS s`).
            let columns = (k + 2..close).all(|j| matches!(token(j), Some(Token::Word(_) | Token::Comma)));
            let columns = columns && !token(k + 2).is_some_and(|t| is_word(t, "SELECT"));
            if !columns {
                return None;
            }
            let alias = match (token(close + 1), token(close + 2)) {
                (Some(as_word), Some(Token::Word(alias))) if is_word(as_word, "AS") => alias.clone(),
                _ => return None,
            };
            Some((solid[close], solid[close + 1], solid[close + 2], alias))
        });
        let Some((close, as_word, alias_at, alias)) = aliased else { return tokens };
        let name = if alias.quote_style.is_some() { alias.value } else { alias.value.to_lowercase() };
        let marked =
            Word { value: format!("{JOIN_ALIAS_MARK}{name}"), quote_style: Some('"'), keyword: Keyword::NoKeyword };
        let span = tokens[alias_at].span;
        tokens.drain(as_word..=alias_at);
        let inserted = [Token::Comma, Token::Word(marked)].map(|token| TokenWithSpan { token, span });
        tokens.splice(close..close, inserted);
    }
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
        assert_eq!(
            rewritten("select * from a join b using (i) as X where x.i = 1").expect("rewritten"),
            format!("select * from a join b using (i,\"{JOIN_ALIAS_MARK}x\")  where x.i = 1")
        );
    }
}
