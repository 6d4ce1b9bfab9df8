//! Which statements only make sense in PostgreSQL: each is counted as out of scope with its
//! reason, never run and never dropped silently.
//!
//! Out of scope: psql's meta-commands and variables, plan output (EXPLAIN), planner and
//! executor settings, physical design and statistics (indexes, VACUUM, ANALYZE), roles and
//! privileges, server-side code and type-system extensions (functions, aggregates, operators,
//! types, triggers, rules) and what uses them, system catalogs and system columns, and
//! random values (PostgreSQL's generator cannot be matched).

use std::collections::BTreeMap;

/// Names the file defined with out-of-scope statements (functions, types, …): statements that
/// use one are out of scope too.
#[derive(Debug, Default)]
pub struct Defined {
    /// Name → whether it is called (functions, aggregates, procedures: used as `name(`).
    names: BTreeMap<String, bool>,
}

/// Settings that steer PostgreSQL's planner and executor (the answers do not depend on them).
const PLANNER_SETTINGS: [&str; 22] = [
    "enable_",
    "work_mem",
    "hash_mem_multiplier",
    "jit",
    "parallel_",
    "max_parallel_",
    "min_parallel_",
    "force_parallel_mode",
    "debug_parallel_query",
    "random_page_cost",
    "seq_page_cost",
    "cpu_",
    "effective_cache_size",
    "geqo",
    "join_collapse_limit",
    "from_collapse_limit",
    "plan_cache_mode",
    "constraint_exclusion",
    "default_statistics_target",
    "cursor_tuple_fraction",
    "synchronous_commit",
    "maintenance_work_mem",
];

/// Kinds of objects whose definitions are server-side code or extend the type system.
const EXTENSIONS: [&str; 14] = [
    "function",
    "procedure",
    "aggregate",
    "operator",
    "type",
    "domain",
    "trigger",
    "rule",
    "language",
    "cast",
    "collation",
    "extension",
    "conversion",
    "statistics",
];

/// Lower-case words of `sql` outside quotes and comments (identifiers keep `_` and digits).
pub fn words(sql: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut current = String::new();
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                flush(&mut words, &mut current);
                for q in chars.by_ref() {
                    if q == '\'' {
                        break;
                    }
                }
            }
            '-' if chars.peek() == Some(&'-') => {
                flush(&mut words, &mut current);
                for q in chars.by_ref() {
                    if q == '\n' {
                        break;
                    }
                }
            }
            c if c.is_alphanumeric() || c == '_' => current.push(c.to_ascii_lowercase()),
            '"' => {}
            _ => flush(&mut words, &mut current),
        }
    }
    flush(&mut words, &mut current);
    words
}

fn flush(words: &mut Vec<String>, current: &mut String) {
    if !current.is_empty() {
        words.push(std::mem::take(current));
    }
}

/// Why a psql meta-command is out of scope (all are: they are psql's, not SQL).
pub fn meta_reason(command: &str) -> String {
    let name = command.split_whitespace().next().unwrap_or("");
    format!("psql meta-command \\{name}")
}

impl Defined {
    /// The reason `sql` is out of scope, or None when both servers should run it. Records the
    /// names an out-of-scope definition creates.
    pub fn reason(&mut self, sql: &str, sent_by: Option<&str>) -> Option<String> {
        let words = words(sql);
        let reason = self.statement_reason(sql, &words, sent_by);
        if reason.is_some() {
            self.remember_definition(&words);
        }
        reason
    }

    fn statement_reason(&self, sql: &str, words: &[String], sent_by: Option<&str>) -> Option<String> {
        if let Some(command) = sent_by {
            return Some(format!("sent by psql's {command} (psql variables)"));
        }
        let first = words.first().map_or("", String::as_str);
        let second = words.get(1).map_or("", String::as_str);
        if let Some(reason) = command_reason(first, second, words) {
            return Some(reason);
        }
        if let Some(name) = words.iter().find(|w| self.uses(sql, w)) {
            return Some(format!("uses {name}, defined by an out-of-scope statement"));
        }
        if let Some(name) = ABSENT_AGGREGATES.iter().find(|name| calls(sql, name)) {
            return Some(format!("uses {name}, a CREATE AGGREGATE of create_aggregate.sql (not in the corpus)"));
        }
        if let Some(word) =
            words.iter().find(|w| w.starts_with("pg_") && !matches!(w.as_str(), "pg_typeof" | "pg_temp"))
        {
            return Some(format!("system catalog or function ({word})"));
        }
        let system_columns = ["ctid", "xmin", "xmax", "cmin", "cmax", "tableoid", "regclass", "regproc", "regtype"];
        if let Some(word) = words.iter().find(|w| system_columns.contains(&w.as_str())) {
            return Some(format!("system column or object identifier ({word})"));
        }
        if words.iter().any(|w| w == "random" || w == "setseed") {
            return Some("random values (PostgreSQL's generator)".into());
        }
        if first == "copy" && words.iter().any(|w| w == "stdout") {
            return Some("COPY TO STDOUT (psql's output stream)".into());
        }
        if has_psql_variable(sql) {
            return Some("psql variable".into());
        }
        None
    }

    /// After an out-of-scope `CREATE <kind> name`, uses of `name` are out of scope too.
    fn remember_definition(&mut self, words: &[String]) {
        if words.first().map(String::as_str) != Some("create") {
            return;
        }
        let Some(kind) = words.iter().position(|w| EXTENSIONS.contains(&w.as_str())) else { return };
        let mut name = words.get(kind + 1);
        // `create function pg_temp.f`: the name is the word after the schema.
        if name.is_some_and(|n| n == "pg_temp" || n == "public") {
            name = words.get(kind + 2);
        }
        if let Some(name) = name.filter(|n| n.len() > 2 && !is_common_word(n)) {
            let called = matches!(words[kind].as_str(), "function" | "aggregate" | "procedure");
            self.names.insert(name.clone(), called);
        }
    }

    /// Whether `sql` uses the defined `word`: a call `word(` for functions (a function named
    /// like a keyword, as window.sql's `unbounded`, leaves the keyword alone), any use else.
    fn uses(&self, sql: &str, word: &str) -> bool {
        match self.names.get(word) {
            None => false,
            Some(false) => true,
            Some(true) => calls(sql, word),
        }
    }
}

/// User-defined aggregates that aggregates.sql calls and create_aggregate.sql, which runs
/// before it in PostgreSQL's schedule, defines: PostgreSQL itself has none of them here.
const ABSENT_AGGREGATES: [&str; 10] = [
    "aggfns",
    "aggfstr",
    "cleast_agg",
    "least_agg",
    "test_rank",
    "test_percentile_disc",
    "newavg",
    "newsum",
    "newcnt",
    "sum2",
];

/// Whether `sql` calls a function named `word` (`word(`, not a longer name ending in it).
fn calls(sql: &str, word: &str) -> bool {
    let lower = sql.to_ascii_lowercase();
    lower.match_indices(word).any(|(at, _)| {
        let before = lower[..at].chars().next_back();
        let after = lower[at + word.len()..].trim_start().chars().next();
        !before.is_some_and(|c| c.is_alphanumeric() || c == '_') && after == Some('(')
    })
}

/// Words too common to mark every later statement that contains them (`create type` of a
/// builtin-looking name would otherwise swallow the file).
fn is_common_word(word: &str) -> bool {
    matches!(
        word,
        "class" | "family" | "if" | "not" | "exists" | "or" | "replace" | "as" | "for" | "int4" | "text" | "int8"
    )
}

fn command_reason(first: &str, second: &str, words: &[String]) -> Option<String> {
    let setting = match (first, second) {
        ("set" | "reset" | "show", "local" | "session") => words.get(2).map(String::as_str),
        ("set" | "reset" | "show", name) => Some(name),
        _ => None,
    };
    if let Some(name) = setting.filter(|name| PLANNER_SETTINGS.iter().any(|p| name.starts_with(p))) {
        return Some(format!("planner or executor setting ({name})"));
    }
    match first {
        "explain" => return Some("EXPLAIN (PostgreSQL's plan text)".into()),
        "vacuum" | "analyze" | "analyse" | "cluster" | "reindex" | "checkpoint" => {
            return Some(format!("physical design or statistics ({})", first.to_uppercase()))
        }
        "grant" | "revoke" => return Some("roles and privileges".into()),
        "do" => return Some("server-side code (DO block)".into()),
        "load" | "discard" => return Some(format!("server administration ({})", first.to_uppercase())),
        _ => {}
    }
    if matches!(first, "create" | "drop" | "alter") {
        let kind: Vec<&str> = words.iter().skip(1).take(3).map(String::as_str).collect();
        let has = |word: &str| kind.contains(&word);
        if has("index") || (first == "alter" && words.iter().any(|w| w == "statistics")) {
            return Some("physical design or statistics (index)".into());
        }
        if has("role") || has("user") || has("policy") || has("publication") || has("subscription") {
            return Some("roles and privileges".into());
        }
        if let Some(kind) = EXTENSIONS.iter().find(|k| has(k)) {
            return Some(format!("server-side code or type extension ({} {kind})", first.to_uppercase()));
        }
    }
    if first == "set"
        && matches!(second, "role" | "session")
        && words.iter().any(|w| w == "authorization" || w == "role")
    {
        return Some("roles and privileges".into());
    }
    None
}

/// `:name`, `:'name'` or `:"name"` outside quotes that is not a `::` cast or an array slice.
fn has_psql_variable(sql: &str) -> bool {
    let bytes = sql.as_bytes();
    let mut quoted = false;
    for (i, &b) in bytes.iter().enumerate() {
        if b == b'\'' {
            quoted = !quoted;
        }
        if quoted || b != b':' {
            continue;
        }
        let before = i.checked_sub(1).map(|j| bytes[j]);
        let after = bytes.get(i + 1).copied();
        let cast = before == Some(b':') || after == Some(b':');
        let slice = before.is_some_and(|c| c.is_ascii_alphanumeric() || c == b']' || c == b')');
        if !cast && !slice && after.is_some_and(|c| c.is_ascii_alphabetic() || c == b'"' || c == b'\'') {
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: PostgreSQL-only statements get a reason, ordinary SQL none, and a function created
    // out of scope makes its callers out of scope; method: one statement of each kind.
    #[test]
    fn reasons_for_postgresql_only_statements() {
        let mut defined = Defined::default();
        let reason = |d: &mut Defined, sql: &str| d.reason(sql, None);
        assert_eq!(reason(&mut defined, "select a, b from t where a = 1 order by 2"), None);
        assert_eq!(reason(&mut defined, "SET datestyle = iso"), None);
        assert_eq!(reason(&mut defined, "select x::int, a[1:2] from t"), None);
        assert!(reason(&mut defined, "set enable_hashjoin to off").is_some_and(|r| r.contains("planner")));
        assert!(reason(&mut defined, "explain (costs off) select 1").is_some_and(|r| r.contains("EXPLAIN")));
        assert!(reason(&mut defined, "create unique index i on t (a)").is_some_and(|r| r.contains("index")));
        assert!(reason(&mut defined, "VACUUM ANALYZE onek").is_some());
        let created =
            reason(&mut defined, "create function sillysrf(int) returns setof int as 'values (1)' language sql");
        assert!(created.is_some_and(|r| r.contains("function")));
        assert!(reason(&mut defined, "select * from sillysrf(42)").is_some_and(|r| r.contains("sillysrf")));
        assert!(reason(&mut defined, "create function unbounded(x int) returns int language sql return x").is_some());
        let frame = "select sum(a) over (rows between unbounded preceding and current row) from t";
        assert_eq!(reason(&mut defined, frame), None, "the keyword is not a call of the function");
        assert!(reason(&mut defined, "select sum(a) over (rows between unbounded(1) preceding) from t").is_some());
        assert!(reason(&mut defined, "select relname from pg_class").is_some_and(|r| r.contains("pg_class")));
        assert!(reason(&mut defined, "select ctid from t").is_some());
        assert!(reason(&mut defined, "select random() from t").is_some());
        assert!(reason(&mut defined, "select :myvar").is_some_and(|r| r.contains("variable")));
        assert!(reason(&mut defined, "copy t from :'filename'").is_some_and(|r| r.contains("variable")));
        assert_eq!(reason(&mut defined, "select 'a:' || 'b', '12:30'::time"), None);
        assert!(defined.reason("select 1", Some("\\gset")).is_some());
        assert_eq!(meta_reason("set filename :abs_srcdir '/data/x'"), "psql meta-command \\set");
    }
}
