//! The one SQL lexer behind every routing and session-state decision (the dispatcher's read/write
//! routing, the pooler's session-state guard), without allocation: tokens borrow from the text.
//!
//! ```text
//!  "SET /* x */ search_path = 'a;b'; LISTEN c"
//!   Word(SET) Comment Word(search_path) Symbol(=) Literal(a;b) Semicolon Word(LISTEN) Word(c)
//! ```
//! It knows exactly what decides where a statement ends and what is inside a name or a value:
//! `--` and nested `/* */` comments, `'…'` strings (doubled quotes, `E'…\''` escapes), `"…"`
//! identifiers, `$tag$…$tag$` bodies and `$1` parameters. It parses nothing else; classifiers
//! look at the first few words of each statement. Unterminated strings and comments run to the
//! end of the text (PostgreSQL would report a syntax error; a classifier then sees no further
//! statement, which errs on the side of "changes state" / "goes to the primary" at the caller).
//!
//! (The kernel fast path keeps its own few-keyword check in C, in `crates/fastpath/bpf`: BPF
//! programs cannot call Rust, and it only needs the first keyword of a statement.)

/// One token. Text borrows from the SQL; `Word` keeps its case (compare with
/// [`Token::is_keyword`]), `Quoted` and `Literal` are the bodies without their quotes (doubled
/// quotes left as they are).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Token<'a> {
    /// A keyword or unquoted identifier.
    Word(&'a str),
    /// A `"quoted identifier"`.
    Quoted(&'a str),
    /// A `'string'` (also `E'…'`, `B'…'`, `X'…'`, `U&'…'`: the prefix is a separate word).
    Literal(&'a str),
    /// A `$tag$ … $tag$` body (the text between the delimiters).
    DollarBody(&'a str),
    /// A number, or a `$1` parameter.
    Number(&'a str),
    /// A `--` or `/* */` comment, delimiters included.
    Comment(&'a str),
    /// `(`.
    Open,
    /// `)`.
    Close,
    Semicolon,
    /// `.` between names.
    Dot,
    /// `,`.
    Comma,
    /// Any other operator character (`=`, `+`, `::` gives two).
    Symbol(u8),
}

impl<'a> Token<'a> {
    /// True for a `Word` equal to `keyword` ignoring ASCII case.
    pub fn is_keyword(&self, keyword: &str) -> bool {
        matches!(self, Token::Word(word) if word.eq_ignore_ascii_case(keyword))
    }

    /// The name a `Word` or `Quoted` token stands for.
    pub fn name(&self) -> Option<&'a str> {
        match self {
            Token::Word(text) | Token::Quoted(text) => Some(text),
            _ => None,
        }
    }
}

/// Iterates over the tokens of SQL text.
#[derive(Debug, Clone)]
pub struct Lexer<'a> {
    sql: &'a str,
    at: usize,
}

impl<'a> Lexer<'a> {
    pub fn new(sql: &'a str) -> Self {
        Lexer { sql, at: 0 }
    }

    /// Bytes consumed so far.
    pub fn position(&self) -> usize {
        self.at
    }

    fn bytes(&self) -> &'a [u8] {
        self.sql.as_bytes()
    }

    fn peek(&self, offset: usize) -> Option<u8> {
        self.bytes().get(self.at + offset).copied()
    }

    /// Text from `start` to the current position.
    fn since(&self, start: usize) -> &'a str {
        &self.sql[start..self.at]
    }
}

impl<'a> Iterator for Lexer<'a> {
    type Item = Token<'a>;

    fn next(&mut self) -> Option<Token<'a>> {
        while self.peek(0).is_some_and(|byte| byte.is_ascii_whitespace()) {
            self.at += 1;
        }
        let byte = self.peek(0)?;
        let start = self.at;
        let token = match byte {
            b'-' if self.peek(1) == Some(b'-') => {
                self.at = self.sql[start..].find('\n').map_or(self.sql.len(), |n| start + n);
                Token::Comment(self.since(start))
            }
            b'/' if self.peek(1) == Some(b'*') => {
                self.at = block_comment_end(self.bytes(), start);
                Token::Comment(self.since(start))
            }
            b'\'' => {
                let backslash_escapes = self.escape_string_prefix(start);
                self.at = quoted_end(self.bytes(), start, b'\'', backslash_escapes);
                Token::Literal(body(self.sql, start, self.at))
            }
            b'"' => {
                self.at = quoted_end(self.bytes(), start, b'"', false);
                Token::Quoted(body(self.sql, start, self.at))
            }
            b'$' => self.dollar(start),
            b'(' => self.single(Token::Open),
            b')' => self.single(Token::Close),
            b';' => self.single(Token::Semicolon),
            b'.' if !self.peek(1).is_some_and(|next| next.is_ascii_digit()) => self.single(Token::Dot),
            b',' => self.single(Token::Comma),
            _ if byte.is_ascii_digit() || byte == b'.' => {
                self.at = self.scan_while(start, |byte| byte.is_ascii_alphanumeric() || byte == b'.' || byte == b'_');
                Token::Number(self.since(start))
            }
            _ if is_identifier_start(byte) => {
                self.at =
                    self.scan_while(start, |byte| is_identifier_start(byte) || byte.is_ascii_digit() || byte == b'$');
                Token::Word(self.since(start))
            }
            _ => self.single(Token::Symbol(byte)),
        };
        debug_assert!(self.at > start, "every token consumes input");
        Some(token)
    }
}

impl<'a> Lexer<'a> {
    fn single(&mut self, token: Token<'a>) -> Token<'a> {
        self.at += 1;
        token
    }

    fn scan_while(&self, start: usize, mut keep: impl FnMut(u8) -> bool) -> usize {
        let bytes = self.bytes();
        let mut end = start + 1;
        while end < bytes.len() && keep(bytes[end]) {
            end += 1;
        }
        end
    }

    /// `E'…'` (the `E` just lexed as a word right before the quote) takes backslash escapes.
    fn escape_string_prefix(&self, quote: usize) -> bool {
        quote > 0
            && matches!(self.bytes()[quote - 1], b'e' | b'E')
            && (quote < 2 || !is_identifier_continue(self.bytes()[quote - 2]))
    }

    /// `$tag$…$tag$` (tag empty or an identifier), else `$1` or a lone `$`.
    fn dollar(&mut self, start: usize) -> Token<'a> {
        let rest = &self.sql[start + 1..];
        let tag_len = rest.find('$').filter(|&n| {
            rest[..n].bytes().all(is_identifier_continue) && !rest[..n].starts_with(|c: char| c.is_ascii_digit())
        });
        let Some(tag_len) = tag_len else {
            self.at = self.scan_while(start, |byte| byte.is_ascii_digit());
            return Token::Number(self.since(start));
        };
        let delimiter = &self.sql[start..start + tag_len + 2];
        let body_start = start + delimiter.len();
        let (body_end, end) = match self.sql[body_start..].find(delimiter) {
            Some(n) => (body_start + n, body_start + n + delimiter.len()),
            None => (self.sql.len(), self.sql.len()),
        };
        self.at = end;
        Token::DollarBody(&self.sql[body_start..body_end])
    }
}

fn is_identifier_start(byte: u8) -> bool {
    byte.is_ascii_alphabetic() || byte == b'_' || byte >= 0x80
}

fn is_identifier_continue(byte: u8) -> bool {
    is_identifier_start(byte) || byte.is_ascii_digit()
}

/// The text between a quoted token's delimiters (the closing one may be missing).
fn body(sql: &str, start: usize, end: usize) -> &str {
    let closed = end > start + 1 && sql.as_bytes()[end - 1] == sql.as_bytes()[start];
    &sql[start + 1..if closed { end - 1 } else { end }]
}

/// End (exclusive) of a `/* … */` comment starting at `start`; nested as in PostgreSQL.
fn block_comment_end(bytes: &[u8], start: usize) -> usize {
    let mut depth = 0usize;
    let mut at = start;
    while at + 1 < bytes.len() {
        match (bytes[at], bytes[at + 1]) {
            (b'/', b'*') => {
                depth += 1;
                at += 2;
            }
            (b'*', b'/') => {
                depth -= 1;
                at += 2;
                if depth == 0 {
                    return at;
                }
            }
            _ => at += 1,
        }
    }
    bytes.len()
}

/// End (exclusive) of a token quoted with `quote` starting at `start`; a doubled quote is part
/// of the body, and with `backslash_escapes` so is an escaped one.
fn quoted_end(bytes: &[u8], start: usize, quote: u8, backslash_escapes: bool) -> usize {
    let mut at = start + 1;
    while at < bytes.len() {
        match bytes[at] {
            b'\\' if backslash_escapes => at += 2,
            byte if byte == quote && bytes.get(at + 1) == Some(&quote) => at += 2,
            byte if byte == quote => return at + 1,
            _ => at += 1,
        }
    }
    bytes.len()
}

/// The statements of a text: token slices between top-level semicolons, comments dropped,
/// empty statements skipped; at most `statements_max` (a bound on work per message). The
/// second value is true when the text held more statements than that.
pub fn statements(sql: &str, statements_max: usize) -> (Vec<Vec<Token<'_>>>, bool) {
    let mut statements = Vec::new();
    let mut current = Vec::new();
    for token in Lexer::new(sql) {
        match token {
            Token::Comment(_) => {}
            Token::Semicolon if current.is_empty() => {}
            Token::Semicolon => {
                if statements.len() == statements_max {
                    return (statements, true);
                }
                statements.push(std::mem::take(&mut current));
            }
            token => current.push(token),
        }
    }
    if !current.is_empty() {
        if statements.len() == statements_max {
            return (statements, true);
        }
        statements.push(current);
    }
    (statements, false)
}

/// True when the text holds more than one statement (a semicolon followed by anything but
/// semicolons and comments). Allocates nothing.
pub fn has_several_statements(sql: &str) -> bool {
    let mut seen_semicolon = false;
    let mut seen_statement = false;
    for token in Lexer::new(sql) {
        match token {
            Token::Comment(_) => {}
            Token::Semicolon => seen_semicolon = seen_statement,
            _ if seen_semicolon => return true,
            _ => seen_statement = true,
        }
    }
    false
}

/// The first token that is not a comment.
pub fn first_token(sql: &str) -> Option<Token<'_>> {
    Lexer::new(sql).find(|token| !matches!(token, Token::Comment(_)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(sql: &str) -> Vec<Token<'_>> {
        Lexer::new(sql).collect()
    }

    #[test]
    fn strings_names_comments_and_dollar_bodies_hide_what_is_inside() {
        // Goal: keywords and semicolons inside literals, names, comments and bodies are not seen.
        let sql = "select 'a;b''c', \"x;y\", $f$ ; drop $f$ /* ; /* nested */ ; */ -- ;\n; E'\\'' ; $1";
        let seen = tokens(sql);
        assert_eq!(seen[0], Token::Word("select"));
        assert_eq!(seen[1], Token::Literal("a;b''c"));
        assert_eq!(seen[3], Token::Quoted("x;y"));
        assert_eq!(seen[5], Token::DollarBody(" ; drop "));
        assert!(matches!(seen[6], Token::Comment(text) if text.ends_with("*/")));
        assert!(matches!(seen[7], Token::Comment(text) if text == "-- ;"));
        assert_eq!(seen[8], Token::Semicolon);
        assert_eq!(seen[9], Token::Word("E"));
        assert_eq!(seen[10], Token::Literal("\\'"));
        assert_eq!(seen[11], Token::Semicolon);
        assert_eq!(seen[12], Token::Number("$1"));
        assert_eq!(seen.len(), 13);
    }

    #[test]
    fn statements_split_at_top_level_semicolons_only() {
        let (found, truncated) = statements("begin; set x = ';' ; ; -- c\n commit;", 8);
        assert!(!truncated);
        let first_words: Vec<&str> = found.iter().filter_map(|s| s[0].name()).collect();
        assert_eq!(first_words, ["begin", "set", "commit"]);
        assert!(statements("a;b;c", 2).1, "the bound is reported");
        assert!(has_several_statements("select 1; select 2"));
        assert!(!has_several_statements("select ';'; -- x\n;"));
        assert_eq!(first_token("/* hi */ -- x\n LISTEN c"), Some(Token::Word("LISTEN")));
    }

    #[test]
    fn unterminated_input_ends_without_panicking() {
        for sql in ["'abc", "\"abc", "/* abc", "$tag$ abc", "E'\\", "$", "$1$", "--", "\u{e9}t\u{e9}", "x::int"] {
            let count = tokens(sql).len();
            assert!(count <= sql.len(), "{sql}");
        }
    }
}
