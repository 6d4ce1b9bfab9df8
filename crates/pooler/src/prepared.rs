//! Prepared statements in transaction mode, without I/O.
//!
//! A client prepares a named statement once and then uses it in many transactions, each of which
//! may land on a different server. The pooler therefore owns the names:
//!
//! ```text
//!  client "s1" = Parse(text, types) ──► registry: (text, types) → id 17 ──► server name "_bypass_p17"
//!  Bind("s1") on a server that lacks _bypass_p17 ──► Parse(_bypass_p17) [answer hidden] + Bind(_bypass_p17)
//!  Parse("s1") on a server that has _bypass_p17   ──► nothing sent, ParseComplete injected in order
//! ```
//!
//! Because the pooler adds and removes requests, the answers no longer match what the client sent.
//! A [`ResponsePlan`] per link keeps one [`Unit`] per request in flight, in order; every server
//! message is matched against the oldest unit, which says whether to forward it, hide it, or
//! whether a synthetic answer is due. After an ErrorResponse the server skips everything up to the
//! next Sync, so the plan drops those units too (synthetic answers included), as PostgreSQL would.
//!
//! Equal text means equal statement, so servers share statements between clients; a different
//! `search_path` could make equal text mean different tables, as with PgBouncer.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use bypass_wire::frontend::{build, DescribeKind};
use bypass_wire::tag;
use bypass_wire::write::{message, put_count16, put_cstr, put_i32};

/// Prefix of server-side statement names; chosen to be unlikely in application SQL.
pub const SERVER_NAME_PREFIX: &str = "_bypass_p";
/// Most distinct statements a pool remembers; beyond this, new texts are refused.
pub const REGISTRY_MAX: usize = 100_000;
/// Most named statements one client may hold.
pub const CLIENT_STATEMENTS_MAX: usize = 10_000;
/// Requests one link may have in flight before the client is refused (pipelining depth).
pub const PLAN_UNITS_MAX: usize = 65_536;

/// One statement as servers know it.
#[derive(Debug)]
pub struct Statement {
    pub id: u32,
    /// The Parse message (header included) that prepares it on a server under its server name.
    pub parse: Box<[u8]>,
}

/// A statement's identity: its query text and parameter type OIDs.
type StatementText = (Box<[u8]>, Box<[u32]>);

/// Statement texts of one pool, each with a stable id.
#[derive(Debug, Default)]
pub struct StatementRegistry {
    by_text: Mutex<HashMap<StatementText, Arc<Statement>>>,
}

impl StatementRegistry {
    /// The statement for `query` with `param_types`, registered on first sight; `None` when the
    /// registry is full.
    pub fn intern(&self, query: &[u8], param_types: &[u32]) -> Option<Arc<Statement>> {
        let mut by_text = self.by_text.lock().unwrap_or_else(|p| p.into_inner());
        let key = (Box::<[u8]>::from(query), Box::<[u32]>::from(param_types));
        if let Some(statement) = by_text.get(&key) {
            return Some(statement.clone());
        }
        if by_text.len() >= REGISTRY_MAX {
            return None;
        }
        let id = by_text.len() as u32 + 1;
        let mut parse = Vec::with_capacity(query.len() + 32);
        let name = server_name(id);
        let query_text = std::str::from_utf8(query).ok();
        match query_text {
            Some(text) => build::parse(&mut parse, &name, text, param_types),
            None => encode_parse_bytes(&mut parse, name.as_bytes(), query, param_types),
        }
        let statement = Arc::new(Statement { id, parse: parse.into_boxed_slice() });
        by_text.insert(key, statement.clone());
        Some(statement)
    }
}

/// Query text may be in any client encoding, not only UTF-8.
fn encode_parse_bytes(buf: &mut Vec<u8>, name: &[u8], query: &[u8], param_types: &[u32]) {
    message(buf, Some(tag::frontend::PARSE), |buf| {
        put_cstr(buf, name);
        put_cstr(buf, query);
        put_count16(buf, param_types.len());
        for oid in param_types {
            put_i32(buf, *oid as i32);
        }
    });
}

pub fn server_name(id: u32) -> String {
    format!("{SERVER_NAME_PREFIX}{id}")
}

/// A client's named statements.
#[derive(Debug, Default)]
pub struct ClientStatements {
    by_name: HashMap<Box<[u8]>, Arc<Statement>>,
}

impl ClientStatements {
    pub fn get(&self, name: &[u8]) -> Option<&Arc<Statement>> {
        self.by_name.get(name)
    }

    /// Binds `name` to `statement`; false if the client already holds too many.
    pub fn insert(&mut self, name: &[u8], statement: Arc<Statement>) -> bool {
        if self.by_name.len() >= CLIENT_STATEMENTS_MAX && !self.by_name.contains_key(name) {
            return false;
        }
        self.by_name.insert(name.into(), statement);
        true
    }

    pub fn remove(&mut self, name: &[u8]) {
        self.by_name.remove(name);
    }

    pub fn clear(&mut self) {
        self.by_name.clear();
    }

    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }
}

/// Statements prepared on one server, least recently used first out.
#[derive(Debug)]
pub struct ServerStatements {
    last_used: HashMap<u32, u64>,
    clock: u64,
    capacity: usize,
}

impl ServerStatements {
    pub fn new(capacity: usize) -> Self {
        ServerStatements { last_used: HashMap::new(), clock: 0, capacity: capacity.max(1) }
    }

    /// True if the server has `id`; marks it used.
    pub fn touch(&mut self, id: u32) -> bool {
        self.clock += 1;
        match self.last_used.get_mut(&id) {
            Some(used) => {
                *used = self.clock;
                true
            }
            None => false,
        }
    }

    /// Records `id` as prepared; returns the id to close first when the server is full.
    pub fn add(&mut self, id: u32) -> Option<u32> {
        self.clock += 1;
        let evicted = (self.last_used.len() >= self.capacity).then(|| self.least_recently_used()).flatten();
        if let Some(evicted) = evicted {
            self.last_used.remove(&evicted);
        }
        self.last_used.insert(id, self.clock);
        evicted
    }

    fn least_recently_used(&self) -> Option<u32> {
        self.last_used.iter().min_by_key(|(_, used)| **used).map(|(id, _)| *id)
    }

    pub fn forget(&mut self, id: u32) {
        self.last_used.remove(&id);
    }

    /// The server dropped every statement (DISCARD ALL, DEALLOCATE ALL).
    pub fn clear(&mut self) {
        self.last_used.clear();
    }

    pub fn len(&self) -> usize {
        self.last_used.len()
    }

    pub fn is_empty(&self) -> bool {
        self.last_used.is_empty()
    }
}

/// A request in flight and what its answer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Parse: ParseComplete. `hidden` when the pooler added it; `statement` is forgotten on error.
    Parse {
        hidden: bool,
        statement: Option<u32>,
    },
    Bind,
    /// Describe of a statement: ParameterDescription, then RowDescription or NoData.
    DescribeStatement,
    DescribePortal,
    Execute,
    /// Close: CloseComplete; `hidden` when the pooler closes an evicted statement.
    Close {
        hidden: bool,
    },
    Sync,
    /// Simple query: everything up to ReadyForQuery.
    Query,
    FunctionCall,
    /// An answer the pooler gives itself (the request was not sent), due when it is oldest.
    Synthetic(SyntheticAnswer),
    /// Where the client ended COPY data (CopyDone/CopyFail): not answered; it bounds the Syncs the
    /// server ignores while it reads copy data.
    CopyEnd,
}

/// Answers the pooler makes up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyntheticAnswer {
    ParseComplete,
    CloseComplete,
}

impl SyntheticAnswer {
    pub fn encode(self, buf: &mut Vec<u8>) {
        let tag = match self {
            SyntheticAnswer::ParseComplete => tag::backend::PARSE_COMPLETE,
            SyntheticAnswer::CloseComplete => tag::backend::CLOSE_COMPLETE,
        };
        buf.extend_from_slice(&[tag, 0, 0, 0, 4]);
    }
}

/// What to do with one server message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Forward,
    /// The answer to a request the pooler added: the client must not see it.
    Hide,
}

/// Something the relay must act on besides forwarding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A Parse the pooler counted on failed or was skipped: the server does not have `id`.
    StatementLost(u32),
}

/// The server sent a message no request in flight explains.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unexpected(pub u8);

/// Requests in flight on one link, oldest first.
#[derive(Debug, Default)]
pub struct ResponsePlan {
    units: VecDeque<Unit>,
    /// After an ErrorResponse to an extended-protocol request, until the next Sync's answer.
    skipping: bool,
    /// A Describe of a statement whose ParameterDescription arrived.
    described: bool,
}

impl ResponsePlan {
    pub fn is_empty(&self) -> bool {
        self.units.is_empty()
    }

    pub fn len(&self) -> usize {
        self.units.len()
    }

    /// False when the link has too many requests in flight. While the server skips after an
    /// error, only a Sync will be answered, so nothing else is expected.
    pub fn push(&mut self, unit: Unit) -> bool {
        if self.skipping && unit != Unit::Sync {
            return true;
        }
        if self.units.len() >= PLAN_UNITS_MAX {
            return false;
        }
        self.units.push_back(unit);
        true
    }

    /// Synthetic answers now due (everything before them answered), oldest first.
    pub fn take_due(&mut self, out: &mut Vec<u8>) {
        loop {
            match self.units.front() {
                Some(Unit::Synthetic(answer)) => answer.encode(out),
                Some(Unit::CopyEnd) => {}
                _ => return,
            }
            self.units.pop_front();
        }
    }

    /// COPY FROM STDIN began: Syncs the client sent after the request that started it and before
    /// its CopyDone/CopyFail are ignored by the server, so they will not be answered.
    fn copy_in_started(&mut self) {
        let end = self.units.iter().skip(1).position(|unit| *unit == Unit::CopyEnd).map_or(self.units.len(), |i| i + 1);
        let mut index = 1;
        let mut end = end;
        while index < end {
            if self.units[index] == Unit::Sync {
                self.units.remove(index);
                end -= 1;
            } else {
                index += 1;
            }
        }
    }

    /// Matches one server message against the oldest request. `events` collects statements the
    /// server turned out not to have.
    pub fn on_server_message(&mut self, tag: u8, events: &mut Vec<Event>) -> Result<Verdict, Unexpected> {
        if matches!(
            tag,
            tag::backend::NOTICE_RESPONSE | tag::backend::PARAMETER_STATUS | tag::backend::NOTIFICATION_RESPONSE
        ) {
            return Ok(Verdict::Forward); // Asynchronous: notice, parameter status, notification.
        }
        let Some(&unit) = self.units.front() else {
            // Nothing asked: an error now is the server ending the session on its own (FATAL:
            // idle_in_transaction_session_timeout, pg_terminate_backend, shutdown), passed on.
            return if tag == b'E' { Ok(Verdict::Forward) } else { Err(Unexpected(tag)) };
        };
        match (unit, tag) {
            (Unit::Query | Unit::Execute, tag::backend::COPY_IN_RESPONSE) => {
                self.copy_in_started();
                Ok(Verdict::Forward)
            }
            (Unit::Query | Unit::FunctionCall, tag::backend::READY_FOR_QUERY) => self.finish(Verdict::Forward),
            (Unit::Query | Unit::FunctionCall, _) => Ok(Verdict::Forward),
            (_, tag::backend::ERROR_RESPONSE) => Ok(self.fail(events)),
            (Unit::Sync, tag::backend::READY_FOR_QUERY) => {
                self.skipping = false;
                self.finish(Verdict::Forward)
            }
            (Unit::Parse { hidden, .. }, tag::backend::PARSE_COMPLETE) => self.finish(visibility(hidden)),
            (Unit::Close { hidden }, tag::backend::CLOSE_COMPLETE) => self.finish(visibility(hidden)),
            (Unit::Bind, tag::backend::BIND_COMPLETE) => self.finish(Verdict::Forward),
            (Unit::DescribeStatement, tag::backend::PARAMETER_DESCRIPTION) if !self.described => {
                self.described = true;
                Ok(Verdict::Forward)
            }
            (Unit::DescribeStatement, tag::backend::ROW_DESCRIPTION | tag::backend::NO_DATA) if self.described => {
                self.described = false;
                self.finish(Verdict::Forward)
            }
            (Unit::DescribePortal, tag::backend::ROW_DESCRIPTION | tag::backend::NO_DATA) => {
                self.finish(Verdict::Forward)
            }
            (
                Unit::Execute,
                tag::backend::COMMAND_COMPLETE | tag::backend::EMPTY_QUERY_RESPONSE | tag::backend::PORTAL_SUSPENDED,
            ) => self.finish(Verdict::Forward),
            (
                Unit::Execute,
                tag::backend::DATA_ROW
                | tag::backend::COPY_DATA
                | tag::backend::COPY_DONE
                | tag::backend::COPY_OUT_RESPONSE
                | tag::backend::COPY_BOTH_RESPONSE,
            ) => Ok(Verdict::Forward),
            _ => Err(Unexpected(tag)),
        }
    }

    fn finish(&mut self, verdict: Verdict) -> Result<Verdict, Unexpected> {
        self.units.pop_front();
        Ok(verdict)
    }

    /// An ErrorResponse answers the oldest extended-protocol request; the server then ignores
    /// every message up to the next Sync, so their units go, with their synthetic answers.
    fn fail(&mut self, events: &mut Vec<Event>) -> Verdict {
        let failed = self.units.pop_front();
        self.described = false;
        self.skipping = true;
        for unit in failed.into_iter().chain(std::iter::from_fn(|| self.pop_unless_sync())) {
            if let Unit::Parse { statement: Some(id), .. } = unit {
                events.push(Event::StatementLost(id));
            }
        }
        // Forwarded even when it answers a hidden Parse: it explains why the client's request
        // that needed the statement fails.
        Verdict::Forward
    }

    fn pop_unless_sync(&mut self) -> Option<Unit> {
        match self.units.front() {
            Some(Unit::Sync) | None => None,
            Some(_) => self.units.pop_front(),
        }
    }

    /// True while the server skips messages after an error.
    pub fn skipping(&self) -> bool {
        self.skipping
    }
}

fn visibility(hidden: bool) -> Verdict {
    if hidden {
        Verdict::Hide
    } else {
        Verdict::Forward
    }
}

/// The unit a client message adds, if it is answered at all (Flush and COPY data are not).
pub fn unit_for(tag: u8, describe_kind: Option<DescribeKind>) -> Option<Unit> {
    match tag {
        tag::frontend::PARSE => Some(Unit::Parse { hidden: false, statement: None }),
        tag::frontend::BIND => Some(Unit::Bind),
        tag::frontend::DESCRIBE if describe_kind == Some(DescribeKind::Statement) => Some(Unit::DescribeStatement),
        tag::frontend::DESCRIBE => Some(Unit::DescribePortal),
        tag::frontend::EXECUTE => Some(Unit::Execute),
        tag::frontend::CLOSE => Some(Unit::Close { hidden: false }),
        tag::frontend::SYNC => Some(Unit::Sync),
        tag::frontend::QUERY => Some(Unit::Query),
        tag::frontend::FUNCTION_CALL => Some(Unit::FunctionCall),
        tag::frontend::COPY_DONE | tag::frontend::COPY_FAIL => Some(Unit::CopyEnd),
        _ => None,
    }
}

/// A Close of statement `name` on a server, for an evicted statement.
pub fn encode_close_statement(buf: &mut Vec<u8>, name: &str) {
    bypass_wire::FrontendMessage::Close { kind: DescribeKind::Statement, name: name.as_bytes() }.encode(buf);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(plan: &mut ResponsePlan, tags: &[u8]) -> (Vec<Verdict>, Vec<Event>) {
        let mut events = Vec::new();
        let verdicts = tags.iter().map(|&t| plan.on_server_message(t, &mut events).expect("expected")).collect();
        (verdicts, events)
    }

    #[test]
    fn synthetic_parse_complete_is_due_only_after_earlier_answers() {
        let mut plan = ResponsePlan::default();
        for unit in [Unit::Bind, Unit::Synthetic(SyntheticAnswer::ParseComplete), Unit::Bind, Unit::Sync] {
            plan.push(unit);
        }
        let mut out = Vec::new();
        plan.take_due(&mut out);
        assert!(out.is_empty(), "a Bind is still unanswered");
        run(&mut plan, b"2");
        plan.take_due(&mut out);
        assert_eq!(out, b"1\0\0\0\x04");
        run(&mut plan, b"2Z");
        assert!(plan.is_empty());
    }

    #[test]
    fn hidden_parse_answers_are_hidden_and_errors_skip_to_sync() {
        let mut plan = ResponsePlan::default();
        plan.push(Unit::Parse { hidden: true, statement: Some(7) });
        plan.push(Unit::Bind);
        plan.push(Unit::Execute);
        plan.push(Unit::Sync);
        let (verdicts, _) = run(&mut plan, b"12DC");
        assert_eq!(verdicts[0], Verdict::Hide);
        assert!(verdicts[1..].iter().all(|v| *v == Verdict::Forward));
        let (_, _) = run(&mut plan, b"Z");

        plan.push(Unit::Parse { hidden: true, statement: Some(9) });
        plan.push(Unit::Synthetic(SyntheticAnswer::ParseComplete));
        plan.push(Unit::Bind);
        plan.push(Unit::Sync);
        let (verdicts, events) = run(&mut plan, b"EZ");
        assert_eq!(verdicts, vec![Verdict::Forward, Verdict::Forward]);
        assert_eq!(events, vec![Event::StatementLost(9)]);
        assert!(plan.is_empty(), "synthetic answers after an error are dropped");
    }

    #[test]
    fn describe_statement_takes_two_answers_and_queries_take_all_until_z() {
        let mut plan = ResponsePlan::default();
        plan.push(Unit::DescribeStatement);
        plan.push(Unit::Sync);
        plan.push(Unit::Query);
        run(&mut plan, b"tTZ");
        run(&mut plan, b"TDDCTDCZ");
        assert!(plan.is_empty());
        let mut events = Vec::new();
        assert_eq!(plan.on_server_message(b'2', &mut events), Err(Unexpected(b'2')));
    }

    #[test]
    fn server_statements_evict_the_least_recently_used() {
        let mut statements = ServerStatements::new(2);
        assert_eq!(statements.add(1), None);
        assert_eq!(statements.add(2), None);
        assert!(statements.touch(1));
        assert_eq!(statements.add(3), Some(2));
        assert!(!statements.touch(2));
        assert_eq!(statements.len(), 2);
    }

    #[test]
    fn registry_gives_equal_texts_one_id() {
        let registry = StatementRegistry::default();
        let a = registry.intern(b"select $1", &[23]).expect("room");
        let b = registry.intern(b"select $1", &[23]).expect("room");
        let c = registry.intern(b"select $1", &[20]).expect("room");
        assert_eq!(a.id, b.id);
        assert_ne!(a.id, c.id);
        assert!(a.parse.starts_with(b"P"));
    }
}
