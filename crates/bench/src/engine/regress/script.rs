//! A regression file cut into statements as psql cuts it: `;` ends a statement outside quotes,
//! comments, dollar quotes, parentheses and a function's `BEGIN ATOMIC … END`; a backslash
//! starts a meta-command that runs to the end of its line; `COPY … FROM stdin` takes the lines
//! up to `\.` as its data.

/// One thing psql would do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    /// SQL sent to the server (comments before it dropped, no trailing `;`).
    Statement {
        sql: String,
        line: usize,
        /// Rows of `COPY … FROM stdin` (the lines before `\.`).
        copy_data: Option<String>,
        /// The meta-command that sent it instead of `;` (`\gset`, `\gexec`, …).
        sent_by: Option<String>,
    },
    /// A psql meta-command (`\set x y`), without its backslash.
    Meta { command: String, line: usize },
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    Normal,
    Quote { escapes: bool },
    Identifier,
    LineComment,
    BlockComment(usize),
}

/// Cuts `text` into psql's items.
pub fn split(text: &str) -> Vec<Item> {
    Splitter::new(text).run()
}

struct Splitter<'a> {
    text: &'a str,
    bytes: &'a [u8],
    at: usize,
    line: usize,
    items: Vec<Item>,
    /// Byte where the pending statement starts, and its line.
    start: Option<(usize, usize)>,
    parens: usize,
    atomic: usize,
    state: State,
}

impl<'a> Splitter<'a> {
    fn new(text: &'a str) -> Splitter<'a> {
        Splitter {
            text,
            bytes: text.as_bytes(),
            at: 0,
            line: 1,
            items: Vec::new(),
            start: None,
            parens: 0,
            atomic: 0,
            state: State::Normal,
        }
    }

    fn run(mut self) -> Vec<Item> {
        while self.at < self.bytes.len() {
            let byte = self.bytes[self.at];
            if byte == b'\n' {
                self.line += 1;
            }
            match self.state {
                State::Normal => self.normal(byte),
                State::Quote { escapes } => self.quoted(byte, escapes),
                State::Identifier => {
                    if byte == b'"' {
                        self.state = State::Normal;
                    }
                    self.at += 1;
                }
                State::LineComment => {
                    if byte == b'\n' {
                        self.state = State::Normal;
                    }
                    self.at += 1;
                }
                State::BlockComment(depth) => self.block_comment(depth),
            }
        }
        self.finish_statement(self.bytes.len(), None);
        self.items
    }

    fn mark_start(&mut self) {
        if self.start.is_none() {
            self.start = Some((self.at, self.line));
        }
    }

    fn normal(&mut self, byte: u8) {
        let next = self.bytes.get(self.at + 1).copied();
        match byte {
            b'-' if next == Some(b'-') => {
                self.state = State::LineComment;
                self.at += 2;
                return;
            }
            b'/' if next == Some(b'*') => {
                self.state = State::BlockComment(1);
                self.at += 2;
                return;
            }
            b'\\' => return self.meta_command(),
            _ => {}
        }
        if byte.is_ascii_whitespace() {
            self.at += 1;
            return;
        }
        self.mark_start();
        match byte {
            b'\'' => {
                let escapes = self.at > 0 && matches!(self.bytes[self.at - 1], b'E' | b'e') && !self.word_before(1);
                self.state = State::Quote { escapes };
            }
            b'"' => self.state = State::Identifier,
            b'$' => {
                if let Some(end) = self.dollar_quote_end() {
                    self.count_lines(self.at, end);
                    self.at = end;
                    return;
                }
            }
            b'(' => self.parens += 1,
            b')' => self.parens = self.parens.saturating_sub(1),
            b';' if self.parens == 0 && self.atomic == 0 => {
                self.finish_statement(self.at, None);
                self.at += 1;
                return;
            }
            b if b.is_ascii_alphabetic() || b == b'_' => return self.word(),
            _ => {}
        }
        self.at += 1;
    }

    /// A keyword or identifier: tracks `BEGIN ATOMIC … END` of CREATE FUNCTION / PROCEDURE.
    fn word(&mut self) {
        let end = self.at
            + self.bytes[self.at..]
                .iter()
                .take_while(|b| b.is_ascii_alphanumeric() || **b == b'_' || **b == b'$')
                .count();
        if self.at > 0 && (self.bytes[self.at - 1].is_ascii_alphanumeric() || self.bytes[self.at - 1] == b'_') {
            self.at = end;
            return;
        }
        let word = self.text[self.at..end].to_ascii_lowercase();
        let pending = self.start.map_or("", |(s, _)| &self.text[s..self.at]).to_ascii_lowercase();
        let routine = pending.starts_with("create") && (pending.contains("function") || pending.contains("procedure"));
        match word.as_str() {
            "begin" if routine => self.atomic += 1,
            "case" if self.atomic > 0 => self.atomic += 1,
            "end" if self.atomic > 0 => self.atomic -= 1,
            _ => {}
        }
        self.at = end;
    }

    /// Whether the byte `back` places before the cursor is preceded by an identifier byte.
    fn word_before(&self, back: usize) -> bool {
        self.at > back && {
            let b = self.bytes[self.at - back - 1];
            b.is_ascii_alphanumeric() || b == b'_'
        }
    }

    fn quoted(&mut self, byte: u8, escapes: bool) {
        if escapes && byte == b'\\' {
            self.at += 2;
            return;
        }
        if byte == b'\'' {
            if self.bytes.get(self.at + 1) == Some(&b'\'') {
                self.at += 2;
                return;
            }
            self.state = State::Normal;
        }
        self.at += 1;
    }

    fn block_comment(&mut self, depth: usize) {
        let next = self.bytes.get(self.at + 1).copied();
        match (self.bytes[self.at], next) {
            (b'*', Some(b'/')) => {
                self.state = if depth == 1 { State::Normal } else { State::BlockComment(depth - 1) };
                self.at += 2;
            }
            (b'/', Some(b'*')) => {
                self.state = State::BlockComment(depth + 1);
                self.at += 2;
            }
            _ => self.at += 1,
        }
    }

    /// `$tag$ … $tag$` starting at the cursor: the byte after its end, or None when the `$` is
    /// not a dollar quote (`$1`, part of an identifier).
    fn dollar_quote_end(&self) -> Option<usize> {
        if self.word_before(0) {
            return None;
        }
        let rest = &self.text[self.at + 1..];
        let tag_len = rest.bytes().take_while(|b| b.is_ascii_alphanumeric() || *b == b'_').count();
        if rest.as_bytes().get(tag_len) != Some(&b'$') || rest.as_bytes().first().is_some_and(u8::is_ascii_digit) {
            return None;
        }
        let delimiter = &self.text[self.at..self.at + tag_len + 2];
        let body = self.at + delimiter.len();
        let close = self.text[body..].find(delimiter)?;
        Some(body + close + delimiter.len())
    }

    fn count_lines(&mut self, from: usize, to: usize) {
        // The cursor's own byte is counted by `run` only when it is a newline it steps on.
        self.line += self.bytes[from + 1..to].iter().filter(|b| **b == b'\n').count();
    }

    /// `\command args` to the end of the line; `\g`-family commands send the pending statement.
    fn meta_command(&mut self) {
        let end = self.text[self.at..].find('\n').map_or(self.bytes.len(), |n| self.at + n);
        let command = self.text[self.at + 1..end].trim().to_string();
        let name = command.split_whitespace().next().unwrap_or("");
        if matches!(name, "g" | "gx" | "gset" | "gexec" | "gdesc" | "crosstabview") && self.start.is_some() {
            self.finish_statement(self.at, Some(format!("\\{name}")));
        } else {
            self.items.push(Item::Meta { command, line: self.line });
        }
        self.at = end;
    }

    fn finish_statement(&mut self, end: usize, sent_by: Option<String>) {
        let Some((start, line)) = self.start.take() else { return };
        let sql = self.text[start..end].trim_end().to_string();
        self.parens = 0;
        if sql.is_empty() || sql == ";" {
            return;
        }
        self.atomic = 0;
        let copy_data = is_copy_from_stdin(&sql).then(|| self.copy_data(end));
        self.items.push(Item::Statement { sql, line, copy_data, sent_by });
    }

    /// The lines after the statement ending at `end` up to `\.` (or the end of the text); the
    /// cursor is left on the last byte consumed (the caller steps past it).
    fn copy_data(&mut self, end: usize) -> String {
        let mut at = self.text[end..].find('\n').map_or(self.bytes.len(), |n| end + n + 1);
        let mut data = String::new();
        while at < self.bytes.len() {
            let line_end = self.text[at..].find('\n').map_or(self.bytes.len(), |n| at + n + 1);
            let line = &self.text[at..line_end];
            at = line_end;
            if line.trim_end() == "\\." {
                break;
            }
            data.push_str(line);
        }
        self.line += self.text[end..at].matches('\n').count();
        self.at = at.saturating_sub(1).max(end);
        data
    }
}

/// `COPY … FROM stdin` (any case, any options).
pub fn is_copy_from_stdin(sql: &str) -> bool {
    let words: Vec<String> = sql.split_whitespace().map(|w| w.to_ascii_lowercase()).collect();
    words.first().is_some_and(|w| w == "copy")
        && words.windows(2).any(|pair| pair[0] == "from" && pair[1].trim_end_matches(';') == "stdin")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn statements(items: &[Item]) -> Vec<(&str, usize)> {
        items
            .iter()
            .filter_map(|item| match item {
                Item::Statement { sql, line, .. } => Some((sql.as_str(), *line)),
                Item::Meta { .. } => None,
            })
            .collect()
    }

    // Goal: semicolons inside quotes, comments, dollar quotes, parentheses and BEGIN ATOMIC do
    // not end a statement, and each statement keeps the line it starts on; method: a script
    // with each construct.
    #[test]
    fn cuts_where_psql_cuts() {
        let text = "-- head; comment\nselect 'a;b', \"c;d\" /* e; /* f; */ g; */ from t;\n\
                    select $$x;y$$, $q$;$q$, E'\\';' ;\n\
                    create function f() returns int language sql\nbegin atomic\n  select case when true then 1 end;\nend;\n\
                    select (1;2);\nselect 1";
        let items = split(text);
        let got = statements(&items);
        assert_eq!(got.len(), 5, "{got:?}");
        assert_eq!(got[0], ("select 'a;b', \"c;d\" /* e; /* f; */ g; */ from t", 2));
        assert_eq!(got[1], ("select $$x;y$$, $q$;$q$, E'\\';'", 3));
        assert!(got[2].0.ends_with("end") && got[2].1 == 4, "{:?}", got[2]);
        assert_eq!(got[3], ("select (1;2)", 8));
        assert_eq!(got[4], ("select 1", 9));
    }

    // Goal: meta-commands are items of their own, `\gset` sends the pending statement, and
    // COPY FROM stdin takes its data lines; method: a script with each.
    #[test]
    fn meta_commands_and_copy_data() {
        let text = "\\set filename :abs_srcdir '/data/x'\nselect 1 as a \\gset\n\
                    COPY t FROM STDIN NULL 'null';\n1\t2\nnull\t3\n\\.\nselect 2;\n";
        let items = split(text);
        assert_eq!(items[0], Item::Meta { command: "set filename :abs_srcdir '/data/x'".into(), line: 1 });
        assert_eq!(
            items[1],
            Item::Statement { sql: "select 1 as a".into(), line: 2, copy_data: None, sent_by: Some("\\gset".into()) }
        );
        assert_eq!(
            items[2],
            Item::Statement {
                sql: "COPY t FROM STDIN NULL 'null'".into(),
                line: 3,
                copy_data: Some("1\t2\nnull\t3\n".into()),
                sent_by: None
            }
        );
        assert_eq!(statements(&items)[2], ("select 2", 7));
        assert_eq!(items.len(), 4);
    }
}
