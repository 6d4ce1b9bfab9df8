//! Per-query routing decisions, without I/O: what a statement is, and which backend gets it.
//!
//! ```text
//!   SQL ─► bypass_wire::sql lexer (strings, quoted names, comments; `route=` hints) ─► Statement
//!   Statement + session (transaction? SET bypass.route?) ─► Primary | Replica
//!   Replica ─► healthy, lag ≤ replica_lag_max_ms, least outstanding requests ─► backend id
//!   statement shape's last answers (hybrid) ─► Small | Large | Unknown ─► relay | hand over
//! ```
//! Invariants:
//! - Anything not provably read-only goes to the primary: several statements, writes, locking
//!   clauses (`FOR UPDATE/SHARE`), `SELECT … INTO`, and calls of volatile functions.
//! - Inside an explicit transaction every statement goes where the transaction is (the session
//!   pins its link until ReadyForQuery says idle); this module only decides outside them.

/// Where a statement should run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    Primary,
    Replica,
}

/// A client's routing preference (`SET bypass.route = …` or a `/* route=… */` comment).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RouteHint {
    #[default]
    Auto,
    Primary,
    Replica,
}

/// What a simple-query string is, as far as routing cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// May run on a replica, unless a function it calls turns out to be volatile.
    Read,
    /// Must run on the primary.
    Write,
    /// `SET bypass.route …` / `RESET bypass.route`: handled by the dispatcher itself.
    SetRoute(RouteHint),
    /// `SET name …` (session level): runs on the primary and is replayed on other backends.
    SetSession { name: String },
    /// `RESET name` or `RESET ALL` (`name` = "all").
    Reset { name: String },
}

/// A classified statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Statement {
    pub kind: Kind,
    /// A `route=` hint found in a comment.
    pub hint: Option<RouteHint>,
    /// Names of functions a read calls that are neither known safe nor known volatile: the
    /// dispatcher asks the catalog before sending the read to a replica.
    pub functions: Vec<String>,
    /// The statement's shape ([`fingerprint`]), from the same lexing pass.
    pub fingerprint: u64,
}

/// Built-in functions with side effects or changing results (pg_proc.provolatile = 'v'):
/// calling one makes a statement a write without asking the catalog.
const VOLATILE_FUNCTIONS: &[&str] = &[
    "nextval",
    "setval",
    "currval",
    "lastval",
    "random",
    "setseed",
    "set_config",
    "pg_notify",
    "txid_current",
    "pg_current_xact_id",
    "pg_advisory_lock",
    "pg_advisory_xact_lock",
    "pg_try_advisory_lock",
    "pg_try_advisory_xact_lock",
    "pg_advisory_unlock",
    "pg_advisory_unlock_all",
    "pg_advisory_lock_shared",
    "lo_create",
    "lo_import",
    "lo_export",
    "lo_unlink",
    "lo_put",
    "clock_timestamp",
    "timeofday",
    "gen_random_uuid",
    "pg_sleep",
    "pg_terminate_backend",
    "pg_cancel_backend",
    "pg_reload_conf",
    "pg_switch_wal",
    "pg_create_restore_point",
    "dblink",
    "dblink_exec",
    "pg_logical_emit_message",
];

/// Built-in functions known not to be volatile (the common ones, so reads need no catalog
/// lookup); anything else is looked up.
const SAFE_FUNCTIONS: &[&str] = &[
    "count",
    "sum",
    "avg",
    "min",
    "max",
    "coalesce",
    "nullif",
    "greatest",
    "least",
    "left",
    "right",
    "repeat",
    "md5",
    "length",
    "lower",
    "upper",
    "substr",
    "substring",
    "concat",
    "format",
    "now",
    "current_setting",
    "generate_series",
    "abs",
    "ceil",
    "floor",
    "round",
    "trunc",
    "to_char",
    "array_agg",
    "string_agg",
    "version",
    "pg_is_in_recovery",
    "pg_backend_pid",
    "pg_last_wal_replay_lsn",
    "pg_last_wal_receive_lsn",
    "pg_last_xact_replay_timestamp",
    "extract",
    "date_trunc",
    "cast",
    "row_number",
    "rank",
    "exists",
    "jsonb_build_object",
    "json_build_object",
    "octet_length",
    "position",
    "replace",
    "split_part",
    "trim",
];

/// Words that look like a call when followed by `(` but are syntax.
const NOT_FUNCTIONS: &[&str] = &[
    "in",
    "as",
    "values",
    "over",
    "filter",
    "any",
    "all",
    "some",
    "and",
    "or",
    "not",
    "select",
    "from",
    "where",
    "on",
    "using",
    "when",
    "then",
    "else",
    "case",
    "join",
    "lateral",
    "with",
    "array",
    "row",
    "is",
    "between",
    "within",
    "distinct",
    "by",
    "union",
    "except",
    "intersect",
    "limit",
    "offset",
    "group",
    "order",
    "having",
];

/// Longest SQL text classified; longer text routes to the primary unexamined.
pub const CLASSIFY_BYTES_MAX: usize = 64 * 1024;
/// Most distinct unknown function names collected from one statement.
const FUNCTIONS_MAX: usize = 16;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Token {
    /// A keyword or unquoted name, lowercased.
    Word(String),
    /// A `"quoted"` name, case kept.
    Quoted(String),
    /// A `'string'` literal's text, lowercased.
    Literal(String),
    Open,
    Semicolon,
    Dot,
    Other,
}

/// Classifies one simple-query string.
pub fn classify(sql: &str) -> Statement {
    if sql.len() > CLASSIFY_BYTES_MAX {
        return Statement { kind: Kind::Write, hint: None, functions: Vec::new(), fingerprint: fingerprint(sql) };
    }
    let (tokens, hint) = lex(sql);
    let fingerprint = fingerprint_of(&tokens);
    let kind = kind_of(&tokens);
    let functions = match kind {
        Kind::Read => match called_functions(&tokens) {
            Some(unknown) => unknown,
            None => return Statement { kind: Kind::Write, hint, functions: Vec::new(), fingerprint },
        },
        _ => Vec::new(),
    };
    Statement { kind, hint, functions, fingerprint }
}

fn kind_of(tokens: &[Token]) -> Kind {
    let words: Vec<&str> = tokens
        .iter()
        .filter_map(|t| match t {
            Token::Word(w) => Some(w.as_str()),
            _ => None,
        })
        .collect();
    // Several statements in one string: run them all on the primary.
    let last_semicolon = tokens.iter().rposition(|t| *t == Token::Semicolon);
    if let Some(position) = last_semicolon {
        if tokens[..position].contains(&Token::Semicolon) || position + 1 < tokens.len() {
            return Kind::Write;
        }
    }
    match words.as_slice() {
        ["set", "bypass", ..] | ["set", "session", "bypass", ..] => Kind::SetRoute(route_value(tokens)),
        ["reset", "bypass", ..] => Kind::SetRoute(RouteHint::Auto),
        ["set", "local", ..] | ["set", "transaction", ..] | ["set", "session", "characteristics", ..] => Kind::Write,
        ["set", "session", name, ..] | ["set", name, ..] => Kind::SetSession { name: name.to_string() },
        ["reset", name, ..] => Kind::Reset { name: name.to_string() },
        ["explain", rest @ ..] if !rest.contains(&"analyze") && read_only_words(rest) => Kind::Read,
        [first, ..] if ["select", "with", "values", "table", "show"].contains(first) && read_only_words(&words) => {
            Kind::Read
        }
        _ => Kind::Write,
    }
}

fn route_value(tokens: &[Token]) -> RouteHint {
    match tokens.iter().rev().find(|t| matches!(t, Token::Word(_) | Token::Literal(_))) {
        Some(Token::Word(value) | Token::Literal(value)) if value == "replica" => RouteHint::Replica,
        Some(Token::Word(value) | Token::Literal(value)) if value == "primary" => RouteHint::Primary,
        _ => RouteHint::Auto,
    }
}

fn read_only_words(words: &[&str]) -> bool {
    const WRITES: &[&str] = &["insert", "update", "delete", "merge", "into", "truncate", "copy", "call", "do"];
    if words.iter().any(|w| WRITES.contains(w)) {
        return false;
    }
    // Locking clauses: FOR UPDATE, FOR NO KEY UPDATE, FOR SHARE, FOR KEY SHARE.
    !words.windows(2).any(|pair| pair[0] == "for" && ["update", "share", "no", "key"].contains(&pair[1]))
}

/// The unknown functions a read calls, or `None` when it calls a known volatile one.
fn called_functions(tokens: &[Token]) -> Option<Vec<String>> {
    let mut unknown = Vec::new();
    for pair in tokens.windows(2) {
        let (Token::Word(name) | Token::Quoted(name), Token::Open) = (&pair[0], &pair[1]) else { continue };
        if matches!(pair[0], Token::Word(_)) && NOT_FUNCTIONS.contains(&name.as_str()) {
            continue;
        }
        if VOLATILE_FUNCTIONS.contains(&name.as_str()) {
            return None;
        }
        if !SAFE_FUNCTIONS.contains(&name.as_str()) && !unknown.contains(name) {
            if unknown.len() == FUNCTIONS_MAX {
                return None;
            }
            unknown.push(name.clone());
        }
    }
    Some(unknown)
}

/// Splits SQL into lowercased words and a few punctuation tokens with the project's one lexer
/// ([`bypass_wire::sql`]): string literals and quoted identifiers kept as tokens, dollar-quoted
/// bodies and comments skipped, numbers and operators as `Other`. A `route=replica|primary`
/// inside a comment becomes the hint.
fn lex(sql: &str) -> (Vec<Token>, Option<RouteHint>) {
    use bypass_wire::sql::{Lexer, Token as Lexed};
    let mut tokens = Vec::new();
    let mut hint = None;
    for lexed in Lexer::new(sql) {
        let token = match lexed {
            Lexed::Comment(text) => {
                hint = hint.or(comment_hint(text));
                continue;
            }
            Lexed::DollarBody(_) => continue,
            Lexed::Word(word) => Token::Word(word.to_ascii_lowercase()),
            Lexed::Quoted(name) => Token::Quoted(name.to_string()),
            Lexed::Literal(text) => Token::Literal(text.to_ascii_lowercase()),
            Lexed::Open => Token::Open,
            Lexed::Semicolon => Token::Semicolon,
            Lexed::Dot => Token::Dot,
            Lexed::Number(_) | Lexed::Close | Lexed::Comma | Lexed::Symbol(_) => {
                if matches!(tokens.last(), Some(Token::Other)) {
                    continue;
                }
                Token::Other
            }
        };
        tokens.push(token);
    }
    (tokens, hint)
}

fn comment_hint(comment: &str) -> Option<RouteHint> {
    let lower = comment.to_ascii_lowercase();
    let at = lower.find("route=")?;
    let value = &lower[at + "route=".len()..];
    if value.starts_with("replica") {
        Some(RouteHint::Replica)
    } else if value.starts_with("primary") {
        Some(RouteHint::Primary)
    } else {
        None
    }
}

/// A hash of the statement's shape: words and punctuation kept, literals and numbers dropped,
/// so `… md5('7:' || i) … 1024 …` and `… md5('8:' || i) … 2048 …` share one fingerprint. The
/// hybrid policy remembers answer sizes per fingerprint.
pub fn fingerprint(sql: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    if sql.len() > CLASSIFY_BYTES_MAX {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        sql.len().hash(&mut hasher);
        return hasher.finish();
    }
    fingerprint_of(&lex(sql).0)
}

/// Hashes a statement's tokens with every literal's text left out.
fn fingerprint_of(tokens: &[Token]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    for token in tokens {
        match token {
            Token::Literal(_) => 0u8.hash(&mut hasher),
            other => other.hash(&mut hasher),
        }
    }
    hasher.finish()
}

/// Decides primary or replica for a statement outside a transaction.
pub fn route(statement: &Statement, session_hint: RouteHint, volatile_calls: bool) -> Route {
    let hint = statement.hint.unwrap_or(session_hint);
    match (&statement.kind, hint) {
        (Kind::Read, RouteHint::Primary) => Route::Primary,
        (Kind::Read, _) if volatile_calls => Route::Primary,
        (Kind::Read, _) => Route::Replica,
        // A client may force a replica for a statement we could not prove read-only; the replica
        // refuses writes itself (read-only transaction), which is the client's choice.
        (Kind::Write, RouteHint::Replica) if statement.hint == Some(RouteHint::Replica) => Route::Replica,
        _ => Route::Primary,
    }
}

/// What the dispatcher knows about a backend when picking a replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    pub id: usize,
    pub healthy: bool,
    pub lag_ok: bool,
    pub outstanding: u32,
}

/// The healthy, fresh replica with the fewest outstanding requests. A tie goes to `preferred`
/// (the replica the session used last: its server process has the session's catalog and plan
/// caches warm, and alternating between servers doubled PostgreSQL's time for small queries),
/// else round-robin by `turn`. `None` when no replica qualifies (the caller falls back to the
/// primary).
pub fn pick_replica(candidates: &[Candidate], turn: usize, preferred: Option<usize>) -> Option<usize> {
    let eligible: Vec<&Candidate> = candidates.iter().filter(|c| c.healthy && c.lag_ok).collect();
    let fewest = eligible.iter().map(|c| c.outstanding).min()?;
    let tied: Vec<usize> = eligible.iter().filter(|c| c.outstanding == fewest).map(|c| c.id).collect();
    match preferred.filter(|id| tied.contains(id)) {
        Some(id) => Some(id),
        None => Some(tied[turn % tied.len()]),
    }
}

/// Small answers in a row after which a statement shape counts as small.
pub const SMALL_STREAK_MIN: u32 = 8;

/// What the hybrid policy remembers of a statement shape's answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AnswerSizes {
    /// Bytes of the last answer.
    pub last: u64,
    /// Answers below the threshold in a row, up to the last one.
    pub small_streak: u32,
}

impl AnswerSizes {
    /// The history after one more answer of `bytes`.
    pub fn after(self, bytes: u64, threshold: u64) -> AnswerSizes {
        let small_streak = if bytes < threshold { self.small_streak.saturating_add(1) } else { 0 };
        AnswerSizes { last: bytes, small_streak }
    }
}

/// What a statement's answer is expected to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prediction {
    /// The last [`SMALL_STREAK_MIN`] answers stayed below the threshold: relay it, and the
    /// dispatcher can take it straight from the server (no agent that could ask for the
    /// connection on the way).
    Small,
    /// The last answer reached the threshold: hand the connection over before the answer.
    Large,
    /// Never seen, or small but not yet for long (sizes that alternate never count as small):
    /// relay through the agent, which asks for the connection if the answer passes the threshold.
    Unknown,
}

/// The hybrid policy's guess for an answer from the shape's history: a few small answers are
/// not yet a pattern, one large answer is.
pub fn predict_answer(sizes: Option<AnswerSizes>, threshold: u64) -> Prediction {
    match sizes {
        None => Prediction::Unknown,
        Some(sizes) if sizes.last >= threshold => Prediction::Large,
        Some(sizes) if sizes.small_streak >= SMALL_STREAK_MIN => Prediction::Small,
        Some(_) => Prediction::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: a shape counts as small only after SMALL_STREAK_MIN small answers in a row, as large
    // after one large answer, and alternating sizes never count as small; method: feed answers.
    #[test]
    fn answers_are_predicted_from_their_history() {
        let feed = |sizes: &[u64]| sizes.iter().fold(AnswerSizes::default(), |h, &bytes| h.after(bytes, 100));
        assert_eq!(predict_answer(None, 100), Prediction::Unknown);
        let almost = feed(&vec![10; SMALL_STREAK_MIN as usize - 1]);
        assert_eq!(predict_answer(Some(almost), 100), Prediction::Unknown, "not yet a streak");
        assert_eq!(predict_answer(Some(almost.after(10, 100)), 100), Prediction::Small);
        assert_eq!(predict_answer(Some(almost.after(100, 100)), 100), Prediction::Large);
        let alternating: Vec<u64> = (0..40).map(|i| if i % 2 == 0 { 10 } else { 1000 }).collect();
        assert_eq!(predict_answer(Some(feed(&alternating).after(10, 100)), 100), Prediction::Unknown);
    }

    fn kind(sql: &str) -> Kind {
        classify(sql).kind
    }

    // Goal: plain reads are reads, writes and locking reads are writes; method: classify samples.
    #[test]
    fn reads_and_writes_are_told_apart() {
        for sql in [
            "select 1",
            "  SELECT * FROM t WHERE a = 'insert'",
            "with x as (select 1) select * from x",
            "values (1)",
            "table t",
            "show work_mem",
            "explain select 1",
            "select 1;",
            "/* c */ select $$update$$",
        ] {
            assert_eq!(kind(sql), Kind::Read, "{sql}");
        }
        for sql in [
            "insert into t values (1)",
            "update t set a = 1",
            "delete from t",
            "select * from t for update",
            "select * from t for no key update",
            "select * into t2 from t",
            "begin",
            "commit",
            "create table t (a int)",
            "with x as (delete from t returning *) select * from x",
            "select 1; select 2",
            "explain analyze select 1",
            "copy t from stdin",
            "select nextval('s')",
            "SELECT pg_advisory_lock(1)",
            "vacuum",
        ] {
            assert_eq!(kind(sql), Kind::Write, "{sql}");
        }
    }

    // Goal: unknown functions are listed for a catalog check, known ones are not; method: classify.
    #[test]
    fn unknown_functions_are_listed_for_the_catalog() {
        let statement = classify("select my_func(1), md5('x'), app.other_fn(2) from t");
        assert_eq!(statement.kind, Kind::Read);
        assert_eq!(statement.functions, vec!["my_func".to_string(), "other_fn".to_string()]);
        assert!(classify(PAYLOAD_100K).functions.is_empty(), "the lab's payload query needs no lookup");
        assert!(classify("select count(*) from t where a in (1, 2)").functions.is_empty());
    }

    // Goal: route hints come from comments and SET bypass.route; method: classify and route.
    #[test]
    fn hints_steer_the_route() {
        assert_eq!(classify("/* route=primary */ select 1").hint, Some(RouteHint::Primary));
        assert_eq!(classify("select 1 -- route=replica").hint, Some(RouteHint::Replica));
        assert_eq!(kind("SET bypass.route = 'replica'"), Kind::SetRoute(RouteHint::Replica));
        assert_eq!(kind("set bypass.route to primary"), Kind::SetRoute(RouteHint::Primary));
        assert_eq!(kind("reset bypass.route"), Kind::SetRoute(RouteHint::Auto));
        assert_eq!(kind("set work_mem = '64MB'"), Kind::SetSession { name: "work_mem".into() });
        assert_eq!(kind("set local work_mem = '64MB'"), Kind::Write);
        assert_eq!(kind("reset all"), Kind::Reset { name: "all".into() });
        let read = classify("select 1");
        assert_eq!(route(&read, RouteHint::Auto, false), Route::Replica);
        assert_eq!(route(&read, RouteHint::Primary, false), Route::Primary);
        assert_eq!(route(&read, RouteHint::Auto, true), Route::Primary);
        assert_eq!(route(&classify("/* route=primary */ select 1"), RouteHint::Replica, false), Route::Primary);
        assert_eq!(route(&classify("insert into t values (1)"), RouteHint::Replica, false), Route::Primary);
    }

    // The lab's payload query (bypass-lab's `payload::query`) for seed 1 and 100,000 bytes, and
    // for seed 99 and 128 MiB: the statements the dispatch benchmark sends.
    const PAYLOAD_100K: &str = "SELECT left(repeat(md5('1:' || i), 256), least(100000::bigint - (i - 1) * 8192, \
         8192)::int) FROM generate_series(1, 13) AS i";
    const PAYLOAD_128M: &str = "SELECT left(repeat(md5('99:' || i), 256), least(134217728::bigint - (i - 1) * 8192, \
         8192)::int) FROM generate_series(1, 16384) AS i";

    // Goal: statements differing only in literals share a fingerprint, others do not; method:
    // payload queries of two sizes and seeds against another statement.
    #[test]
    fn fingerprints_ignore_literals() {
        assert_eq!(fingerprint(PAYLOAD_100K), fingerprint(PAYLOAD_128M));
        assert_ne!(fingerprint(PAYLOAD_100K), fingerprint("select 1"));
        assert_eq!(fingerprint("select 'a'"), fingerprint("select 'b'"));
        for sql in [PAYLOAD_100K, "select 1", "update t set a = 'x'", "select now()"] {
            assert_eq!(classify(sql).fingerprint, fingerprint(sql), "one lexing pass gives the same shape: {sql}");
        }
    }

    // Goal: strings, quoted names and comments cannot fake keywords; method: tricky inputs.
    #[test]
    fn literals_and_comments_hide_keywords() {
        assert_eq!(kind("select 'it''s; delete' as x"), Kind::Read);
        assert_eq!(kind("select \"update\" from t"), Kind::Read);
        assert_eq!(kind("select /* nested /* delete */ still */ 1"), Kind::Read);
        assert_eq!(kind("select $tag$ ; insert $tag$"), Kind::Read);
        assert_eq!(kind("select $1"), Kind::Read);
        assert_eq!(kind("-- just a comment\nupdate t set a = 1"), Kind::Write);
    }

    // Goal: replicas are picked by fewest outstanding among healthy, fresh ones, ties rotate;
    // method: candidate tables.
    #[test]
    fn least_outstanding_healthy_fresh_replica_wins() {
        let c = |id, healthy, lag_ok, outstanding| Candidate { id, healthy, lag_ok, outstanding };
        assert_eq!(pick_replica(&[c(1, true, true, 3), c(2, true, true, 1)], 0, None), Some(2));
        assert_eq!(pick_replica(&[c(1, true, true, 3), c(2, false, true, 0)], 0, None), Some(1));
        assert_eq!(pick_replica(&[c(1, true, false, 0), c(2, true, true, 5)], 0, None), Some(2));
        assert_eq!(pick_replica(&[c(1, false, true, 0), c(2, true, false, 0)], 0, None), None);
        let tied = [c(1, true, true, 0), c(2, true, true, 0)];
        assert_eq!((pick_replica(&tied, 0, None), pick_replica(&tied, 1, None)), (Some(1), Some(2)));
        // The session's last replica wins a tie, never against fewer outstanding requests.
        assert_eq!(pick_replica(&tied, 0, Some(2)), Some(2));
        assert_eq!(pick_replica(&[c(1, true, true, 0), c(2, true, true, 1)], 0, Some(2)), Some(1));
        assert_eq!(pick_replica(&[c(1, true, true, 0), c(2, false, true, 0)], 1, Some(2)), Some(1));
    }
}
