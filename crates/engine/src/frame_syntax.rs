//! Window frame syntax PostgreSQL accepts and sqlparser 0.63 does not, rewritten in the
//! token stream before the parser sees it.
//!
//! - `'1'::int PRECEDING`, `'infinity' PRECEDING`: the parser reads a quoted frame offset as
//!   an interval literal (and stops at `::`); the offset is wrapped in parentheses, which
//!   mean the same.
//! - `… EXCLUDE CURRENT ROW | GROUP | TIES | NO OTHERS)`: the parser has no EXCLUDE. The
//!   clause is taken out and its window specification gets a marker instead, a quoted
//!   identifier no query can name (`"bypass: exclude ties"`) as its first PARTITION BY
//!   item, which the window binder takes back out (`window_bind`).
//!
//! Both rewrites only fire on token sequences that can be nothing but a frame clause, so a
//! text without them is passed on unchanged.

use sqlparser::tokenizer::{Token, TokenWithSpan, Word};

use crate::window_frame::FrameExclusion;

/// The prefix of an EXCLUDE marker; what follows names the exclusion.
const MARKER_PREFIX: &str = "bypass: exclude ";

/// The exclusion an EXCLUDE marker identifier stands for (`None`: not a marker).
pub fn exclusion_of_marker(identifier: &str) -> Option<FrameExclusion> {
    match identifier.strip_prefix(MARKER_PREFIX)? {
        "current row" => Some(FrameExclusion::CurrentRow),
        "group" => Some(FrameExclusion::Group),
        "ties" => Some(FrameExclusion::Ties),
        "no others" => Some(FrameExclusion::NoOthers),
        _ => None,
    }
}

/// The token stream with both rewrites applied.
pub fn rewrite(tokens: Vec<TokenWithSpan>) -> Vec<TokenWithSpan> {
    let has = |word: &str| tokens.iter().any(|t| is_word(&t.token, word));
    if !has("PRECEDING") && !has("FOLLOWING") && !has("EXCLUDE") {
        return tokens;
    }
    rewrite_exclusions(parenthesize_cast_offsets(tokens))
}

fn is_word(token: &Token, wanted: &str) -> bool {
    matches!(token, Token::Word(Word { value, quote_style: None, .. }) if value.eq_ignore_ascii_case(wanted))
}

fn is_blank(token: &Token) -> bool {
    matches!(token, Token::Whitespace(_))
}

/// Indexes of the next `count` tokens after `from` that are not whitespace.
fn next_solid(tokens: &[TokenWithSpan], from: usize, count: usize) -> Vec<usize> {
    (from + 1..tokens.len()).filter(|&i| !is_blank(&tokens[i].token)).take(count).collect()
}

/// `'text'::type PRECEDING` → `('text'::type) PRECEDING` (the parenthesis closes after the
/// type's last token) (the type may be `numeric(10, 2)`
/// or `double precision`; at most a few tokens are looked at).
fn parenthesize_cast_offsets(tokens: Vec<TokenWithSpan>) -> Vec<TokenWithSpan> {
    const TYPE_TOKENS_MAX: usize = 12;
    let mut wraps = Vec::new();
    for (i, token) in tokens.iter().enumerate() {
        if !matches!(token.token, Token::SingleQuotedString(_)) {
            continue;
        }
        let after = next_solid(&tokens, i, TYPE_TOKENS_MAX + 1);
        let Some(&next) = after.first() else { continue };
        if is_word(&tokens[next].token, "PRECEDING") || is_word(&tokens[next].token, "FOLLOWING") {
            // A bare quoted offset is PostgreSQL's unknown literal, not an interval.
            wraps.push((i, i));
            continue;
        }
        if tokens[next].token != Token::DoubleColon {
            continue;
        }
        let mut depth = 0usize;
        let mut last = after[0];
        for &j in &after[1..] {
            match &tokens[j].token {
                Token::LParen => depth += 1,
                Token::RParen if depth > 0 => depth -= 1,
                t if depth == 0 && (is_word(t, "PRECEDING") || is_word(t, "FOLLOWING")) => {
                    wraps.push((i, last));
                    break;
                }
                Token::Word(_) | Token::Number(..) | Token::Comma | Token::DoubleColon => {}
                _ => break,
            }
            last = j;
        }
    }
    let mut out = Vec::with_capacity(tokens.len() + 2 * wraps.len());
    let (opens, closes): (Vec<usize>, Vec<usize>) = wraps.into_iter().unzip();
    for (i, token) in tokens.into_iter().enumerate() {
        let span = token.span;
        if opens.contains(&i) {
            out.push(TokenWithSpan::new(Token::LParen, span));
        }
        out.push(token);
        if closes.contains(&i) {
            out.push(TokenWithSpan::new(Token::RParen, span));
        }
    }
    out
}

/// Moves each `EXCLUDE …` before a closing parenthesis into a marker at the start of its
/// window specification (the matching open parenthesis).
fn rewrite_exclusions(tokens: Vec<TokenWithSpan>) -> Vec<TokenWithSpan> {
    let mut out: Vec<TokenWithSpan> = Vec::with_capacity(tokens.len() + 8);
    let mut open_parens: Vec<usize> = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        if let Some((name, last)) = exclusion_clause(&tokens, i) {
            if let Some(&open) = open_parens.last() {
                insert_marker(&mut out, open, name, tokens[i].span);
                i = last + 1;
                continue;
            }
        }
        match tokens[i].token {
            Token::LParen => open_parens.push(out.len()),
            Token::RParen => {
                open_parens.pop();
            }
            _ => {}
        }
        out.push(tokens[i].clone());
        i += 1;
    }
    out
}

/// `EXCLUDE CURRENT ROW | GROUP | TIES | NO OTHERS` at `i` followed by `)`: the exclusion's
/// name and the index of its last token.
fn exclusion_clause(tokens: &[TokenWithSpan], i: usize) -> Option<(&'static str, usize)> {
    if !is_word(&tokens[i].token, "EXCLUDE") {
        return None;
    }
    let after = next_solid(tokens, i, 3);
    let word = |k: usize, wanted: &str| after.get(k).is_some_and(|&j| is_word(&tokens[j].token, wanted));
    let closes = |k: usize| after.get(k).is_some_and(|&j| tokens[j].token == Token::RParen);
    let (name, words) = if word(0, "CURRENT") && word(1, "ROW") {
        ("current row", 2)
    } else if word(0, "NO") && word(1, "OTHERS") {
        ("no others", 2)
    } else if word(0, "GROUP") {
        ("group", 1)
    } else if word(0, "TIES") {
        ("ties", 1)
    } else {
        return None;
    };
    closes(words).then(|| (name, after[words - 1]))
}

/// Puts the marker into the specification opened at `out[open]`: first in its PARTITION BY,
/// or as a PARTITION BY of its own after an optional base window name.
fn insert_marker(out: &mut Vec<TokenWithSpan>, open: usize, name: &str, span: sqlparser::tokenizer::Span) {
    let token = |t: Token| TokenWithSpan::new(t, span);
    let marker = token(Token::Word(Word {
        value: format!("{MARKER_PREFIX}{name}"),
        quote_style: Some('"'),
        keyword: sqlparser::keywords::Keyword::NoKeyword,
    }));
    let space = || token(Token::Whitespace(sqlparser::tokenizer::Whitespace::Space));
    let word = |w: &str| token(Token::Word(Word { value: w.into(), quote_style: None, keyword: keyword_of(w) }));
    let solid = next_solid(out, open, 2);
    let first = solid.first().map(|&j| &out[j].token);
    let partition_by = first.is_some_and(|t| is_word(t, "PARTITION"));
    let base_name = first.is_some_and(|t| {
        matches!(t, Token::Word(_)) && !["ORDER", "ROWS", "RANGE", "GROUPS"].iter().any(|w| is_word(t, w))
    });
    let (at, insertion) = if partition_by {
        (solid[1] + 1, vec![space(), marker, token(Token::Comma)])
    } else {
        let at = if base_name { solid[0] + 1 } else { open + 1 };
        (at, vec![space(), word("PARTITION"), space(), word("BY"), space(), marker, space()])
    };
    out.splice(at..at, insertion);
}

fn keyword_of(word: &str) -> sqlparser::keywords::Keyword {
    match word {
        "PARTITION" => sqlparser::keywords::Keyword::PARTITION,
        _ => sqlparser::keywords::Keyword::BY,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqlparser::dialect::PostgreSqlDialect;
    use sqlparser::tokenizer::Tokenizer;

    fn rewritten(sql: &str) -> String {
        let tokens = Tokenizer::new(&PostgreSqlDialect {}, sql).tokenize_with_location().expect("tokens");
        rewrite(tokens).iter().map(|t| t.token.to_string()).collect()
    }

    /// Goal: the two rewrites produce text sqlparser reads with the same meaning; method:
    /// rewrite typical frame clauses and compare the text.
    #[test]
    fn frame_clauses_are_rewritten() {
        assert_eq!(
            rewritten("sum(x) over (order by x range between '1'::int preceding and 2 following)"),
            "sum(x) over (order by x range between ('1'::int) preceding and 2 following)"
        );
        assert_eq!(
            rewritten("sum(x) over (partition by y order by x rows 1 preceding exclude current row)"),
            "sum(x) over (partition by \"bypass: exclude current row\", y order by x rows 1 preceding )"
        );
        assert_eq!(
            rewritten("sum(x) over (w rows 1 preceding exclude ties)"),
            "sum(x) over (w PARTITION BY \"bypass: exclude ties\"  rows 1 preceding )"
        );
        assert_eq!(
            rewritten("sum(x) over (order by r range 'infinity' preceding)"),
            "sum(x) over (order by r range ('infinity') preceding)"
        );
        assert_eq!(rewritten("select exclude from t"), "select exclude from t");
    }
}
