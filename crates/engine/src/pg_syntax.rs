//! PostgreSQL syntax sqlparser 0.63 does not read, handled in the token stream before the
//! parser sees it, rewritten into words this engine's binder reads the same way.
//!
//! - `FROM ONLY t`, `UPDATE ONLY t`, `DELETE FROM ONLY t`, `TRUNCATE ONLY t`: ONLY leaves out
//!   inheritance children; the name is marked (see [`ONLY_QUALIFIER`]).
//! - `FROM t*` (t and its children, PostgreSQL's default anyway): the `*` is dropped.
//! - `JOIN … USING (a, b) AS x` (x names the merged columns): rewritten to `USING (a, b,
//!   "<JOIN_ALIAS_MARK>x")`, a column name no SQL text can hold, which the binder takes back
//!   out as the alias.
//! - `ALTER TABLE c INHERIT p`: rewritten to a SET form (see [`INHERIT_OPTION`]).
//! - Window frame syntax: see `frame_syntax`.

use sqlparser::keywords::Keyword;
use sqlparser::tokenizer::{Token, TokenWithSpan, Word};

use crate::error::Result;

/// The token stream with PostgreSQL-only syntax rewritten.
pub fn rewrite(tokens: Vec<TokenWithSpan>) -> Result<Vec<TokenWithSpan>> {
    Ok(crate::frame_syntax::rewrite(join_aliases_into_using(mark_only(alter_inherit(tokens)))))
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

/// `USING ( … ) AS x` → `USING ( … , "<mark>x" )`, in one pass over the tokens (a scan
/// per USING would make long statements quadratic).
fn join_aliases_into_using(mut tokens: Vec<TokenWithSpan>) -> Vec<TokenWithSpan> {
    let solid = solid(&tokens);
    let token = |k: usize| solid.get(k).map(|&i| &tokens[i].token);
    let mut aliased = Vec::new();
    for k in 0..solid.len() {
        if !(token(k).is_some_and(|t| is_word(t, "USING")) && token(k + 1) == Some(&Token::LParen)) {
            continue;
        }
        // A column list (not `DELETE … USING (SELECT …) AS s`) up to its parenthesis.
        let Some(close) = (k + 2..solid.len()).find(|&j| !matches!(token(j), Some(Token::Word(_) | Token::Comma)))
        else {
            continue;
        };
        if token(close) != Some(&Token::RParen) || token(k + 2).is_some_and(|t| is_word(t, "SELECT")) {
            continue;
        }
        if let (Some(as_word), Some(Token::Word(alias))) = (token(close + 1), token(close + 2)) {
            if is_word(as_word, "AS") {
                aliased.push((solid[close], solid[close + 1], solid[close + 2], alias.clone()));
            }
        }
    }
    // From the back, so the positions of earlier matches stay valid.
    for (close, as_word, alias_at, alias) in aliased.into_iter().rev() {
        let name = if alias.quote_style.is_some() { alias.value } else { alias.value.to_lowercase() };
        let marked =
            Word { value: format!("{JOIN_ALIAS_MARK}{name}"), quote_style: Some('"'), keyword: Keyword::NoKeyword };
        let span = tokens[alias_at].span;
        tokens.drain(as_word..=alias_at);
        let inserted = [Token::Comma, Token::Word(marked)].map(|token| TokenWithSpan { token, span });
        tokens.splice(close..close, inserted);
    }
    tokens
}

/// The option key `ALTER TABLE c INHERIT p` becomes (`ALTER TABLE c SET ("\u{1}inherit" = p)`):
/// sqlparser has no INHERIT; no option a client can write starts with this byte.
pub const INHERIT_OPTION: &str = "\u{1}inherit";

/// Rewrites `ALTER TABLE c INHERIT p` (plain names) to the SET form [`INHERIT_OPTION`] names.
fn alter_inherit(tokens: Vec<TokenWithSpan>) -> Vec<TokenWithSpan> {
    let solid = solid(&tokens);
    let token = |k: usize| solid.get(k).map(|&i| &tokens[i].token);
    let shape = token(0).is_some_and(|t| is_word(t, "ALTER"))
        && token(1).is_some_and(|t| is_word(t, "TABLE"))
        && matches!(token(2), Some(Token::Word(_)))
        && token(3).is_some_and(|t| is_word(t, "INHERIT"))
        && matches!(token(4), Some(Token::Word(_)))
        && matches!(token(5), None | Some(Token::SemiColon));
    if !shape {
        return tokens;
    }
    let (inherit, parent) = (solid[3], solid[4]);
    let mut rewritten = Vec::with_capacity(tokens.len() + 4);
    for (i, token) in tokens.into_iter().enumerate() {
        let span = token.span;
        if i == inherit {
            let option = Token::Word(Word {
                value: INHERIT_OPTION.to_string(),
                quote_style: Some('"'),
                keyword: sqlparser::keywords::Keyword::NoKeyword,
            });
            let set = Token::make_keyword("SET");
            for token in
                [set, Token::Whitespace(sqlparser::tokenizer::Whitespace::Space), Token::LParen, option, Token::Eq]
            {
                rewritten.push(TokenWithSpan::new(token, span));
            }
            continue;
        }
        rewritten.push(token);
        if i == parent {
            rewritten.push(TokenWithSpan::new(Token::RParen, span));
        }
    }
    rewritten
}

/// The schema-like qualifier `ONLY t` becomes (`"\u{1}only".t`): sqlparser has no ONLY, and
/// no identifier a client can write starts with this byte. See [`crate::ddl::is_only`].
pub const ONLY_QUALIFIER: &str = "\u{1}only";

/// Marks the table after ONLY (following FROM / JOIN / UPDATE / TRUNCATE) with
/// [`ONLY_QUALIFIER`], and drops the `*` of `FROM t*` (t and its descendants: the default).
fn mark_only(tokens: Vec<TokenWithSpan>) -> Vec<TokenWithSpan> {
    let solid = solid(&tokens);
    let mut marked = std::collections::BTreeSet::new();
    let mut stars = std::collections::BTreeSet::new();
    for k in 1..solid.len() {
        let (before, current) = (&tokens[solid[k - 1]].token, &tokens[solid[k]].token);
        let after = solid.get(k + 1).map(|&i| &tokens[i].token);
        let opener = ["FROM", "JOIN", "UPDATE", "TRUNCATE"].iter().any(|w| is_word(before, w));
        if opener && is_word(current, "ONLY") && matches!(after, Some(Token::Word(_))) {
            marked.insert(solid[k]);
        }
        let after_from = is_word(before, "FROM") || is_word(before, "JOIN");
        if after_from && matches!(current, Token::Word(_)) && after == Some(&Token::Mul) {
            stars.insert(solid[k + 1]);
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
        assert_eq!(rewritten("alter table c inherit p").expect("rewritten"), "alter table c SET (\"\u{1}inherit\"= p)");
        assert_eq!(
            rewritten("select * from a join b using (i) as X where x.i = 1").expect("rewritten"),
            format!("select * from a join b using (i,\"{JOIN_ALIAS_MARK}x\")  where x.i = 1")
        );
    }
}
