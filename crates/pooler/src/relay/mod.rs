//! The relay between a linked client and server.
//!
//! It never decodes what it only forwards: it walks message headers in the read buffer, forwards
//! everything read in one write, and inspects the few small messages that change state
//! (ReadyForQuery, ParameterStatus, ErrorResponse, CopyInResponse, Terminate). In transaction mode
//! with prepared statements on, client requests also pass through [`statements`], which rewrites
//! named statements, and every server answer is matched against the link's response plan.
//!
//! ```text
//!   client buffer ──scan──► tracker (+ statements rewrite) ──Outgoing──► server socket
//!   server buffer ──scan──► tracker (+ plan: forward / hide / synthetic) ──Outgoing──► client socket
//! ```

mod outgoing;
pub mod statements;
pub mod tracker;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bypass_wire::frame::{check_frontend_tag, Header, Step};
use bypass_wire::tag;
use bypass_wire::{BackendMessage, TransactionStatus, WireError, HEADER_LEN};

use crate::client::ClientSide;
use crate::config::SessionStatePolicy;
use crate::error::{PoolerError, TimeoutKind};
use crate::io::{read_some, sleep_until};
use crate::params::ParamSet;
use crate::pool::Pool;
use crate::prepared::{ClientStatements, Event, ResponsePlan, Verdict};
use crate::server::ServerConn;
use crate::session_state::{self, StateChange};
use outgoing::Outgoing;
use statements::{large_bind_statement, rewrite_large_bind_start, Statements};
pub use tracker::TransactionTracker;

/// A client linked to a server.
pub struct Linked {
    pub server: Box<ServerConn>,
    pub tracker: TransactionTracker,
    /// When the running transaction's first request was forwarded (for transaction time).
    transaction_started: Option<Instant>,
    /// When the oldest unanswered request was sent (query time, up to its ReadyForQuery).
    query_started: Option<Instant>,
}

impl Linked {
    pub fn new(server: Box<ServerConn>) -> Self {
        debug_assert!(server.plan.is_empty(), "a server with requests in flight was linked");
        Linked { server, tracker: TransactionTracker::default(), transaction_started: None, query_started: None }
    }

    /// True when the server holds no state for this client and no byte is in flight.
    pub fn is_idle(&self, client: &ClientSide) -> bool {
        self.tracker.releasable()
            && self.server.plan.is_empty()
            && self.server.buffer.is_empty()
            && self.server.scanner.at_boundary()
            && client.scanner.at_boundary()
    }

    /// An error may be reported to the client unless the server already sent its own FATAL or
    /// the client is in the middle of a message (an error inserted there would corrupt its stream).
    pub fn client_can_be_told(&self) -> bool {
        !self.server.broken && self.server.scanner.at_boundary()
    }
}

/// How relaying on a link stopped.
pub enum LinkEnd {
    /// The transaction ended: the server may go back to the pool.
    Released,
    /// The client sent Terminate or closed its socket.
    ClientGone,
}

/// The bounds a relay works within.
#[derive(Debug, Clone, Copy)]
pub struct RelayLimits {
    pub message_size_max: u32,
    pub idle_transaction_timeout_ms: u64,
    pub transaction_mode: bool,
    pub shard: usize,
    /// The session-state guard's policy; `None` in session mode, where state is the client's.
    pub session_state: Option<SessionStatePolicy>,
}

/// What a relay works with besides the two sockets.
pub struct RelayContext<'a> {
    pub limits: RelayLimits,
    pub pool: &'a Pool,
    /// The client's parameter values, updated from the server's ParameterStatus messages.
    pub wanted: &'a mut ParamSet,
    /// The client's named statements when the pooler owns them (transaction mode).
    pub statements: Option<&'a mut ClientStatements>,
    pub to_server: &'a mut Vec<u8>,
    pub to_client: &'a mut Vec<u8>,
    pub synthetic: &'a mut Vec<u8>,
}

/// What a wait on a link produced: bytes read from one side (0 = closed), or a timeout.
enum Ready {
    Client(usize),
    Server(usize),
    Timeout,
}

/// Relays between a client and its server until the link should end.
pub async fn relay(
    client: &mut ClientSide,
    linked: &mut Linked,
    context: &mut RelayContext<'_>,
) -> Result<LinkEnd, PoolerError> {
    loop {
        if forward_client(client, linked, context).await? {
            return Ok(LinkEnd::ClientGone);
        }
        if context.limits.transaction_mode && linked.is_idle(client) {
            return Ok(LinkEnd::Released);
        }
        let deadline = idle_deadline(linked, context.limits.idle_transaction_timeout_ms);
        // Both reads are cancel-safe: the one that loses the race has read nothing.
        let ready = tokio::select! {
            biased;
            read = read_some(&mut linked.server.stream, &mut linked.server.buffer) => {
                Ready::Server(read.map_err(PoolerError::ServerIo)?)
            }
            read = client.read_some() => Ready::Client(read.map_err(PoolerError::ClientIo)?),
            _ = sleep_until(deadline) => Ready::Timeout,
        };
        match ready {
            Ready::Server(0) => return Err(PoolerError::ServerIo(std::io::ErrorKind::UnexpectedEof.into())),
            Ready::Server(_) => forward_server(client, linked, context).await?,
            Ready::Client(0) => return Ok(LinkEnd::ClientGone),
            Ready::Client(_) => {}
            Ready::Timeout => return Err(PoolerError::Timeout(TimeoutKind::IdleTransaction)),
        }
    }
}

fn idle_deadline(linked: &Linked, timeout_ms: u64) -> Option<Instant> {
    (timeout_ms > 0 && linked.tracker.idle_in_transaction()).then(|| Instant::now() + Duration::from_millis(timeout_ms))
}

fn check_client_message(header: Header) -> Result<(), PoolerError> {
    if !tag::frontend::after_login(header.tag) {
        return Err(PoolerError::ClientProtocol(WireError::UnknownTag(header.tag as char)));
    }
    if header.tag == tag::frontend::TERMINATE && header.length != 4 {
        return Err(PoolerError::ClientProtocol(WireError::BadLength { tag: 'X', length: i64::from(header.length) }));
    }
    Ok(())
}

/// Forwards every complete (or streaming) client message in the buffer to the server in one
/// write, rewriting named statements when the pooler owns them. True when the client sent
/// Terminate, which is consumed and not forwarded.
async fn forward_client(
    client: &mut ClientSide,
    linked: &mut Linked,
    context: &mut RelayContext<'_>,
) -> Result<bool, PoolerError> {
    let capacity = client.buffer.capacity();
    let limit = context.limits.message_size_max;
    let pending = client.buffer.pending();
    let mut out = Outgoing::new(pending, context.to_server);
    let mut statements = context.statements.as_deref_mut().map(|client_statements| Statements {
        registry: &context.pool.statements,
        client: client_statements,
        server: &mut linked.server.statements,
        plan: &mut linked.server.plan,
    });
    let mut consumed = 0;
    let mut terminated = false;
    let (mut parses, mut binds) = (0u64, 0u64);
    let mut warnings: Vec<&'static str> = Vec::new(); // Allocates only when a warning is due.
    while consumed < pending.len() {
        if client.scanner.at_boundary() {
            check_frontend_tag(&pending[consumed..]).map_err(PoolerError::ClientProtocol)?;
        }
        match client.scanner.next(&pending[consumed..], capacity, limit).map_err(PoolerError::ClientProtocol)? {
            Step::Message(header) => {
                check_client_message(header)?;
                if header.tag == tag::frontend::TERMINATE {
                    terminated = true;
                    break;
                }
                linked.tracker.client_message(header.tag);
                parses += u64::from(header.tag == tag::frontend::PARSE);
                binds += u64::from(header.tag == tag::frontend::BIND);
                let range = consumed..consumed + header.frame_len();
                let frame = &pending[range.clone()];
                match guard(context.limits.session_state, frame) {
                    Guard::Pass => match statements.as_mut() {
                        Some(statements) => statements.message(&mut out, frame, range.clone())?,
                        None => out.pass(range.clone()),
                    },
                    Guard::Warn(kind) => {
                        warnings.push(kind);
                        linked.server.session_dirty = true;
                        match statements.as_mut() {
                            Some(statements) => statements.message(&mut out, frame, range.clone())?,
                            None => out.pass(range.clone()),
                        }
                    }
                    Guard::Refuse(kind) => {
                        out.drop_range(range.clone());
                        out.insert_with(|buf| {
                            bypass_wire::frontend::build::query(buf, &session_state::refusal_sql(kind))
                        });
                        if let Some(statements) = statements.as_mut() {
                            statements.expect_unit(crate::prepared::Unit::Query)?;
                        }
                    }
                }
                consumed = range.end;
            }
            Step::LargeStart { header, chunk_len } => {
                check_client_message(header)?;
                linked.tracker.client_message(header.tag);
                parses += u64::from(header.tag == tag::frontend::PARSE);
                binds += u64::from(header.tag == tag::frontend::BIND);
                let range = consumed..consumed + chunk_len;
                match statements.as_mut() {
                    Some(statements) => {
                        large_start(statements, &mut out, header, &pending[range.clone()], range.clone())?
                    }
                    None => out.pass(range.clone()),
                }
                consumed = range.end;
            }
            Step::Continuation { chunk_len, .. } => {
                out.pass(consumed..consumed + chunk_len);
                consumed += chunk_len;
            }
            Step::NeedMore => break,
        }
    }
    if !out.bytes().is_empty() {
        linked.server.stream.write_all(out.bytes()).await.map_err(PoolerError::ServerIo)?;
        let stats = context.pool.stats.shard(context.limits.shard);
        stats.bytes_received.fetch_add(out.bytes().len() as u64, Ordering::Relaxed);
        let now = *linked.transaction_started.get_or_insert_with(Instant::now);
        linked.query_started.get_or_insert(now);
        if parses + binds > 0 {
            stats.client_parses.fetch_add(parses, Ordering::Relaxed);
            stats.binds.fetch_add(binds, Ordering::Relaxed);
        }
    }
    client.buffer.consume(consumed);
    if terminated {
        client.buffer.consume(HEADER_LEN);
    }
    send_warnings(client, &warnings).await?;
    send_due_answers(client, &mut linked.server.plan, context.synthetic).await?;
    Ok(terminated)
}

/// What the session-state guard does with one client message.
enum Guard {
    Pass,
    /// Forward it, warn the client, reset the server after the transaction.
    Warn(&'static str),
    /// Replace it by a query that fails with 0A000 (simple queries under `session_state = error`).
    Refuse(&'static str),
}

fn guard(policy: Option<SessionStatePolicy>, frame: &[u8]) -> Guard {
    let Some(policy) = policy else { return Guard::Pass };
    let Some(sql) = statement_text(frame) else { return Guard::Pass };
    if !session_state::might_change_state(sql) {
        return Guard::Pass;
    }
    match (session_state::classify(sql), policy) {
        (StateChange::None, _) | (StateChange::Tracked, SessionStatePolicy::Track | SessionStatePolicy::Error) => {
            Guard::Pass
        }
        (StateChange::Tracked, SessionStatePolicy::Warn) => Guard::Warn("SET"),
        (StateChange::Untracked(kind), SessionStatePolicy::Error) if frame[0] == tag::frontend::QUERY => {
            Guard::Refuse(kind)
        }
        (StateChange::Untracked(kind), _) => Guard::Warn(kind),
    }
}

/// The SQL of a Query or Parse message.
fn statement_text(frame: &[u8]) -> Option<&[u8]> {
    let body = frame.get(HEADER_LEN..)?;
    let text = match frame[0] {
        tag::frontend::QUERY => body,
        tag::frontend::PARSE => &body[body.iter().position(|&b| b == 0)? + 1..],
        _ => return None,
    };
    text.iter().position(|&b| b == 0).map(|end| &text[..end])
}

async fn send_warnings(client: &mut ClientSide, warnings: &[&'static str]) -> Result<(), PoolerError> {
    if warnings.is_empty() {
        return Ok(());
    }
    let mut out = Vec::new();
    for kind in warnings {
        bypass_wire::backend::build::notice_with_severity(
            &mut out,
            bypass_wire::Severity::Warning,
            bypass_wire::SqlState::WARNING,
            &session_state::warning_text(kind),
        );
    }
    client.stream.write_all(&out).await.map_err(PoolerError::ClientIo)
}

/// The start of a client message too large for the buffer. Only a Bind can need rewriting there
/// (its statement name is at the start); a named Parse that large is refused, since its text
/// must be whole to be registered.
fn large_start(
    statements: &mut Statements<'_>,
    out: &mut Outgoing<'_>,
    header: Header,
    chunk: &[u8],
    range: std::ops::Range<usize>,
) -> Result<(), PoolerError> {
    let too_large = || {
        PoolerError::refused(
            bypass_wire::SqlState::PROGRAM_LIMIT_EXCEEDED,
            "a named prepared statement this large is not supported in transaction pooling",
        )
    };
    match header.tag {
        tag::frontend::PARSE if chunk.get(HEADER_LEN) != Some(&0) => Err(too_large()),
        tag::frontend::BIND => match large_bind_statement(chunk).filter(|name| !name.is_empty()) {
            Some(name) => match statements.client.get(name).cloned() {
                Some(statement) => {
                    statements.ensure_for_large(out, &statement)?;
                    let name = crate::prepared::server_name(statement.id);
                    let mut prefix = Vec::with_capacity(64);
                    let used =
                        rewrite_large_bind_start(chunk, header.length, &name, &mut prefix).ok_or_else(too_large)?;
                    out.insert(&prefix);
                    out.pass(range.start + used..range.end);
                    statements.expect_unit(crate::prepared::Unit::Bind)
                }
                None => statements.pass_large(out, header.tag, range),
            },
            None => statements.pass_large(out, header.tag, range),
        },
        tag => statements.pass_large(out, tag, range),
    }
}

/// Writes synthetic answers that became due (nothing older is still unanswered).
async fn send_due_answers(
    client: &mut ClientSide,
    plan: &mut ResponsePlan,
    synthetic: &mut Vec<u8>,
) -> Result<(), PoolerError> {
    synthetic.clear();
    plan.take_due(synthetic);
    if !synthetic.is_empty() {
        client.stream.write_all(synthetic).await.map_err(PoolerError::ClientIo)?;
    }
    Ok(())
}

/// Forwards every whole or streaming message the server has sent to the client in one write,
/// updating the link's state from the messages that change it.
async fn forward_server(
    client: &mut ClientSide,
    linked: &mut Linked,
    context: &mut RelayContext<'_>,
) -> Result<(), PoolerError> {
    let limit = context.limits.message_size_max;
    let planned = context.statements.is_some();
    let server = &mut linked.server;
    let capacity = server.buffer.capacity();
    let pending = server.buffer.pending();
    let mut out = Outgoing::new(pending, context.to_client);
    let mut events = Vec::new();
    let mut consumed = 0;
    while consumed < pending.len() {
        let (header, range) =
            match server.scanner.next(&pending[consumed..], capacity, limit).map_err(PoolerError::ServerProtocol)? {
                Step::Message(header) => (Some(header), consumed..consumed + header.frame_len()),
                Step::LargeStart { header, chunk_len } => (Some(header), consumed..consumed + chunk_len),
                Step::Continuation { chunk_len, .. } => (None, consumed..consumed + chunk_len),
                Step::NeedMore => break,
            };
        consumed = range.end;
        let Some(header) = header else {
            out.pass(range);
            continue;
        };
        let verdict = if planned { plan_verdict(&mut server.plan, header.tag, &mut events)? } else { Verdict::Forward };
        match verdict {
            Verdict::Forward => out.pass(range.clone()),
            Verdict::Hide => out.drop_range(range.clone()),
        }
        if range.len() == header.frame_len() {
            let body = &pending[range.start + HEADER_LEN..range.end];
            let effect = inspect_server_message(header, body, &mut linked.tracker, context.wanted, &mut server.params)?;
            if effect == Effect::Fatal {
                server.broken = true;
                log_server_fatal(context.pool, server, body);
            }
            let started = (&mut linked.transaction_started, &mut linked.query_started);
            count_answer(context.pool, context.limits.shard, header.tag, effect, started);
        } else {
            linked.tracker.server_message(header.tag, None);
        }
        if planned {
            context.synthetic.clear();
            server.plan.take_due(context.synthetic);
            if !context.synthetic.is_empty() {
                out.insert(context.synthetic);
            }
        }
    }
    for Event::StatementLost(id) in events.drain(..) {
        server.statements.forget(id);
    }
    if !out.bytes().is_empty() {
        client.stream.write_all(out.bytes()).await.map_err(PoolerError::ClientIo)?;
        let stats = context.pool.stats.shard(context.limits.shard);
        stats.bytes_sent.fetch_add(out.bytes().len() as u64, Ordering::Relaxed);
    }
    server.buffer.consume(consumed);
    Ok(())
}

/// One warn line when a server ends a linked session with a FATAL (passed to the client as is):
/// `idle_in_transaction_session_timeout`, `pg_terminate_backend`, a shutdown.
fn log_server_fatal(pool: &Pool, server: &ServerConn, body: &[u8]) {
    let Ok(BackendMessage::ErrorResponse(fields)) = BackendMessage::decode(tag::backend::ERROR_RESPONSE, body) else {
        return;
    };
    let text = |field: Option<&[u8]>| String::from_utf8_lossy(field.unwrap_or_default()).into_owned();
    tracing::warn!(
        database = %pool.key.database,
        user = %pool.key.user,
        server = %pool.target.address,
        backend_pid = server.key.process_id,
        sqlstate = %text(fields.code()),
        reason = %text(fields.message()),
        "server ended the session"
    );
}

/// Counts a ReadyForQuery as an answered request (with its time), a transaction when it ends
/// one, and a ParseComplete as a Parse the server ran.
fn count_answer(
    pool: &Pool,
    shard: usize,
    tag: u8,
    effect: Effect,
    (transaction_started, query_started): (&mut Option<Instant>, &mut Option<Instant>),
) {
    let stats = pool.stats.shard(shard);
    match tag {
        tag::backend::PARSE_COMPLETE => {
            stats.server_parses.fetch_add(1, Ordering::Relaxed);
            return;
        }
        tag::backend::READY_FOR_QUERY => {}
        _ => return,
    }
    let now = Instant::now();
    stats.queries.fetch_add(1, Ordering::Relaxed);
    if let Some(at) = query_started.take() {
        stats.query_time_us.fetch_add(now.saturating_duration_since(at).as_micros() as u64, Ordering::Relaxed);
    }
    if effect == Effect::TransactionEnd {
        let elapsed = transaction_started.take().map(|at| now.saturating_duration_since(at)).unwrap_or_default();
        pool.stats.count_transaction(shard, elapsed);
    }
}

fn plan_verdict(plan: &mut ResponsePlan, tag: u8, events: &mut Vec<Event>) -> Result<Verdict, PoolerError> {
    plan.on_server_message(tag, events).map_err(|unexpected| {
        PoolerError::ServerProtocol(WireError::BadField { tag: unexpected.0 as char, field: "message order" })
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Effect {
    None,
    TransactionEnd,
    Fatal,
}

/// Applies one whole server message to the link's state.
fn inspect_server_message(
    header: Header,
    body: &[u8],
    tracker: &mut TransactionTracker,
    wanted: &mut ParamSet,
    server_params: &mut ParamSet,
) -> Result<Effect, PoolerError> {
    match header.tag {
        tag::backend::READY_FOR_QUERY => {
            let status = body.first().copied().and_then(TransactionStatus::from_byte);
            let status = status
                .ok_or(PoolerError::ServerProtocol(WireError::BadField { tag: 'Z', field: "transaction status" }))?;
            tracker.server_message(tag::backend::READY_FOR_QUERY, Some(status));
            Ok(if status == TransactionStatus::Idle { Effect::TransactionEnd } else { Effect::None })
        }
        tag::backend::PARAMETER_STATUS => {
            if let Ok(BackendMessage::ParameterStatus { name, value }) =
                BackendMessage::decode(tag::backend::PARAMETER_STATUS, body)
            {
                server_params.update(name, value);
                wanted.update(name, value);
            }
            Ok(Effect::None)
        }
        tag::backend::ERROR_RESPONSE => match BackendMessage::decode(tag::backend::ERROR_RESPONSE, body) {
            Ok(BackendMessage::ErrorResponse(fields)) if fields.is_fatal() => Ok(Effect::Fatal),
            _ => Ok(Effect::None),
        },
        tag => {
            tracker.server_message(tag, None);
            Ok(Effect::None)
        }
    }
}
