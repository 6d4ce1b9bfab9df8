//! One client session: login, then a loop of requests, each routed and answered.
//!
//! ```text
//!  front door (startup, SCRAM/MD5 from auth_file or hba; refusals 28P01/28000) ─►
//!  AuthenticationOk, ParameterStatus… (from the primary), BackendKeyData, Z
//!  loop: read one request (Query | Parse…Sync | FunctionCall)
//!        ─► pinned link (transaction / named statements)?  use it
//!        ─► else classify ─► primary | replica ─► link ─► replay settings ─► send ─► relay answer
//!        ─► status 'I' and not sticky ⇒ link back to its pool
//! ```

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bypass_frontdoor::{Admission, Admitted, CancelKey, Refusal};
use bypass_wire::backend::build;
use bypass_wire::frame::{check_frontend_tag, read_header, split_message, Scanner, Step};
use bypass_wire::tag;
use bypass_wire::{BackendMessage, FrontendMessage, Severity, SqlState, TransactionStatus};
use bypass_wire::{DEFAULT_MESSAGE_SIZE_MAX, HEADER_LEN};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::OwnedSemaphorePermit;

use super::health::query_single_value;
use super::transfer::{self, Moved};
use super::{Link, LinkKind, Prediction, Shared};
use crate::buffer::{closed, Buffer, BufferIo};
use crate::config::Policy;
use crate::error::{DispatchError, Result};
use crate::link::{Control, Delivery, CONTROL_TAG};
use crate::pglogin::server_error;
use crate::routing::{self, Kind, Route, RouteHint};

/// Bytes of a client's buffer: the largest request (one Query, or Parse…Sync) the dispatcher
/// routes. A larger one is refused with SQLSTATE 54000.
pub const REQUEST_BYTES_MAX: usize = 1024 * 1024;
/// Session settings (`SET name …`) remembered and replayed; more are refused.
pub const SETTINGS_MAX: usize = 64;
/// Attempts to run a read when a replica fails before answering.
const READ_ATTEMPTS_MAX: usize = 2;

/// The client's socket and buffers.
struct Client {
    /// `None` while a backend's agent owns the connection.
    stream: Option<TcpStream>,
    /// The client's address: its flow's key in the switch's steering table.
    peer: SocketAddr,
    /// Segment counting for the connection's current owner; `None`: the connection never moves.
    epoch: Option<transfer::Epoch>,
    /// Answer bytes written so far (a failed request can be retried only while this is unchanged).
    written: u64,
    buffer: Buffer,
    scanner: Scanner,
    out: Vec<u8>,
}

impl Client {
    fn stream(&mut self) -> &mut TcpStream {
        self.stream.as_mut().expect("the dispatcher owns the client connection outside a hand-over")
    }

    async fn flush(&mut self) -> Result<()> {
        if !self.out.is_empty() {
            let stream = self.stream.as_mut().expect("the dispatcher owns the client connection outside a hand-over");
            stream.write_all(&self.out).await.map_err(|e| DispatchError::io("writing to the client", e))?;
            self.out.clear();
        }
        Ok(())
    }

    async fn fatal(&mut self, code: &str, text: &str) {
        if self.stream.is_none() {
            // An agent owned the connection and lost it: nothing left to tell.
            return;
        }
        self.out.clear();
        build::error_with_code(&mut self.out, Severity::Fatal, code, text);
        let _ = self.flush().await;
    }

    async fn fill(&mut self) -> Result<()> {
        if self.buffer.spare().is_empty() {
            return Err(DispatchError::Protocol("request larger than the dispatcher's buffer".into()));
        }
        let stream = self.stream.as_mut().expect("the dispatcher owns the client connection outside a hand-over");
        match self.buffer.read_from(stream).await {
            Ok(0) => Err(closed("the client")),
            Ok(_) => Ok(()),
            Err(e) => Err(DispatchError::io("reading from the client", e)),
        }
    }
}

/// Serves one accepted client until it leaves. Never panics on client input.
pub async fn serve_client(
    shared: Arc<Shared>,
    stream: TcpStream,
    peer: SocketAddr,
    slot: Option<OwnedSemaphorePermit>,
) {
    let _ = stream.set_nodelay(true);
    let epoch = transfer::track(&shared, &stream, peer);
    // Authentication comes first: nothing reaches a backend for an unproven client.
    match shared.door.accept(stream, REQUEST_BYTES_MAX).await {
        Ok(Admission::Client(admitted)) => match login(&shared, *admitted, epoch, slot.is_some()).await {
            Ok(Some(mut session)) => {
                if let Err(error) = session.run().await {
                    tracing::debug!(%peer, %error, "session ended");
                }
            }
            Ok(None) => {}
            Err(error) => tracing::debug!(%peer, %error, "login failed"),
        },
        // Cancel routing is not built yet: accept and drop, as a server does for unknown keys.
        Ok(Admission::Cancel(_)) => {}
        Err(error) => tracing::debug!(%peer, %error, "front door refused the client"),
    }
    transfer::untrack(&shared, peer);
    drop(slot);
}

/// Session settings replayed on every backend the session uses.
#[derive(Debug, Default, Clone)]
struct Settings {
    statements: Vec<(String, String)>,
    /// Hash of `statements`; 0 when empty.
    hash: u64,
}

impl Settings {
    fn set(&mut self, name: &str, statement: &str) -> Result<()> {
        self.statements.retain(|(n, _)| n != name);
        if self.statements.len() >= SETTINGS_MAX {
            return Err(DispatchError::Protocol(format!("more than {SETTINGS_MAX} session settings")));
        }
        self.statements.push((name.to_string(), statement.to_string()));
        self.rehash();
        Ok(())
    }

    fn reset(&mut self, name: &str) {
        if name == "all" {
            self.statements.clear();
        } else {
            self.statements.retain(|(n, _)| n != name);
        }
        self.rehash();
    }

    fn rehash(&mut self) {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        self.statements.hash(&mut hasher);
        self.hash = if self.statements.is_empty() { 0 } else { hasher.finish() | 1 };
    }

    fn replay_sql(&self) -> String {
        let mut sql = "RESET ALL".to_string();
        for (_, statement) in &self.statements {
            sql.push_str("; ");
            sql.push_str(statement);
        }
        sql
    }
}

struct Session {
    shared: Arc<Shared>,
    client: Client,
    user: String,
    database: String,
    primary: usize,
    replicas: Vec<usize>,
    hint: RouteHint,
    settings: Settings,
    /// The link held across requests: inside a transaction, or for the whole session once
    /// named prepared statements or portals exist (they live on one server).
    pinned: Option<Link>,
    /// The replica that answered the session's last read; it wins ties for the next one.
    last_replica: Option<usize>,
    sticky: bool,
    status: TransactionStatus,
}

/// A request read from the client: `len` bytes at the head of the client buffer.
struct Request {
    len: usize,
    kind: RequestKind,
    /// ReadyForQuery messages the answer will end with.
    answers: u32,
    /// A simple query's shape, once classified (hybrid policy: predicts the answer's size).
    fingerprint: Option<u64>,
}

enum RequestKind {
    Simple(String),
    /// Parse…Sync; the SQL of every Parse, and whether named statements or portals appear.
    Extended {
        queries: Vec<String>,
        named: bool,
    },
    FunctionCall,
    Terminate,
}

/// After the front door admitted the client: picks its backends, takes the welcome from the
/// primary (or a replica while the primary is down) and sends it.
async fn login(
    shared: &Arc<Shared>,
    mut admitted: Admitted,
    epoch: Option<transfer::Epoch>,
    under_limit: bool,
) -> Result<Option<Session>> {
    let (user, database) = (admitted.request.user.clone(), admitted.request.database.clone());
    if !under_limit {
        let refusal = Refusal::new(SqlState::TOO_MANY_CONNECTIONS, "too many clients for the dispatcher");
        shared.door.refuse(&mut admitted, refusal).await;
        return Ok(None);
    }
    let Some((primary, replicas)) = shared.config.route_set(&database).cloned() else {
        let refusal =
            Refusal::new(SqlState::INVALID_CATALOG_NAME, format!("no backend serves database \"{database}\""));
        shared.door.refuse(&mut admitted, refusal).await;
        return Ok(None);
    };
    let (backend_id, link) = match first_link(shared, primary, &replicas, &user, &database).await {
        Ok(found) => found,
        Err(refusal) => {
            shared.door.refuse(&mut admitted, refusal).await;
            return Ok(None);
        }
    };
    let welcome = link.welcome.parameters.clone();
    shared.backends[backend_id].release(link);
    admitted.welcome(&welcome, CancelKey::random()).await.map_err(|e| DispatchError::io("sending the welcome", e))?;
    let Admitted { stream, buffer, peer, .. } = admitted;
    let stream =
        stream.into_plain().map_err(|_| DispatchError::Protocol("the dispatcher serves plaintext only".into()))?;
    let client =
        Client { stream: Some(stream), peer, epoch, written: 0, buffer, scanner: Scanner::new(), out: Vec::new() };
    Ok(Some(Session {
        shared: shared.clone(),
        client,
        user,
        database,
        primary,
        replicas,
        hint: RouteHint::Auto,
        settings: Settings::default(),
        pinned: None,
        last_replica: None,
        sticky: false,
        status: TransactionStatus::Idle,
    }))
}

/// A link for the welcome: the primary's, or a healthy replica's while the primary is down. A
/// server's own refusal (role does not exist) is passed on as it is.
async fn first_link(
    shared: &Shared,
    primary: usize,
    replicas: &[usize],
    user: &str,
    database: &str,
) -> std::result::Result<(usize, Link), Refusal> {
    let mut candidates = vec![primary];
    candidates.extend(replicas.iter().copied().filter(|&r| r != primary));
    let mut last_error = None;
    for id in candidates {
        let backend = &shared.backends[id];
        if !backend.is_healthy() && id != primary {
            continue;
        }
        match backend.acquire(backend.relay_kind(), user, database).await {
            Ok(link) => return Ok((id, link)),
            Err(DispatchError::Server { code, message }) if !is_connection_error_code(&code) => {
                let code = SqlState::from_code(&code).unwrap_or(SqlState::CONNECTION_FAILURE);
                return Err(Refusal::new(code, message));
            }
            Err(error) => {
                backend.ban(&error);
                last_error = Some(error);
            }
        }
    }
    let text = format!("no backend available: {}", last_error.map(|e| e.to_string()).unwrap_or_default());
    Err(Refusal::new(SqlState::CONNECTION_FAILURE, text))
}

impl Session {
    async fn run(&mut self) -> Result<()> {
        loop {
            let request = match self.read_request().await {
                Ok(request) => request,
                Err(DispatchError::Protocol(text)) => {
                    self.client.fatal(SqlState::PROTOCOL_VIOLATION.code(), &text).await;
                    return Err(DispatchError::Protocol(text));
                }
                // A frame or message that does not decode (bad length, unknown tag, truncated
                // body): the client is told why before the connection closes.
                Err(DispatchError::Wire(error)) => {
                    let text = format!("protocol violation: {error}");
                    self.client.fatal(SqlState::PROTOCOL_VIOLATION.code(), &text).await;
                    return Err(DispatchError::Wire(error));
                }
                Err(error) => return Err(error),
            };
            if matches!(request.kind, RequestKind::Terminate) {
                return Ok(());
            }
            self.handle(request).await?;
        }
    }

    /// Reads until the buffer starts with one whole request.
    async fn read_request(&mut self) -> Result<Request> {
        loop {
            if let Some(request) = parse_request(self.client.buffer.pending())? {
                return Ok(request);
            }
            let stream = self.client.stream.as_ref().expect("requests are read while the connection is home");
            wait_readable(stream, self.busy_poll())
                .await
                .map_err(|e| DispatchError::io("reading from the client", e))?;
            self.client.fill().await?;
        }
    }

    async fn handle(&mut self, mut request: Request) -> Result<()> {
        if self.pinned.is_some() {
            let link = self.pinned.take().expect("checked above");
            let plan = self.plan(&request, link.backend, true);
            assert_eq!(plan.delivery, Delivery::Relay, "a pinned link's answers are relayed");
            return self.run_on(link, &request, None, false, &plan).await.map(|_| ());
        }
        match &request.kind {
            RequestKind::Simple(sql) => {
                let statement = routing::classify(sql);
                request.fingerprint = Some(statement.fingerprint);
                match &statement.kind {
                    Kind::SetRoute(hint) => return self.answer_set_route(*hint, request.len).await,
                    Kind::SetSession { name } => {
                        let (name, sql) = (name.clone(), sql.clone());
                        return self.run_routed(Route::Primary, request, Some((name, sql))).await;
                    }
                    Kind::Reset { name } => {
                        let name = format!("reset:{name}");
                        return self.run_routed(Route::Primary, request, Some((name, String::new()))).await;
                    }
                    Kind::Read | Kind::Write => {}
                }
                let volatile = self.calls_volatile(&statement.functions).await;
                let route = routing::route(&statement, self.hint, volatile);
                self.run_routed(route, request, None).await
            }
            RequestKind::Extended { queries, named } => {
                if *named {
                    self.sticky = true;
                }
                let statements: Vec<_> = queries.iter().map(|q| routing::classify(q)).collect();
                let all_reads = !statements.is_empty() && statements.iter().all(|s| s.kind == Kind::Read);
                let functions: Vec<String> = statements.iter().flat_map(|s| s.functions.clone()).collect();
                let route = if *named || !all_reads || self.calls_volatile(&functions).await {
                    Route::Primary
                } else {
                    routing::route(&statements[0], self.hint, false)
                };
                self.run_routed(route, request, None).await
            }
            RequestKind::FunctionCall => self.run_routed(Route::Primary, request, None).await,
            RequestKind::Terminate => Ok(()),
        }
    }

    async fn answer_set_route(&mut self, hint: RouteHint, len: usize) -> Result<()> {
        self.client.buffer.consume(len);
        self.hint = hint;
        build::command_complete(&mut self.client.out, "SET");
        build::ready_for_query(&mut self.client.out, self.status);
        self.client.flush().await
    }

    /// Whether any of `functions` is volatile, asking the primary's catalog for unknown names.
    /// When the catalog cannot be asked, unknown functions count as volatile (primary is safe).
    async fn calls_volatile(&mut self, functions: &[String]) -> bool {
        for name in functions {
            let volatile = match self.shared.cached_volatility(name) {
                Some(volatile) => volatile,
                None => match self.lookup_volatility(name).await {
                    Ok(volatile) => {
                        self.shared.remember_volatility(name, volatile);
                        volatile
                    }
                    Err(_) => true,
                },
            };
            if volatile {
                return true;
            }
        }
        false
    }

    async fn lookup_volatility(&mut self, name: &str) -> Result<bool> {
        let backend = &self.shared.backends[self.primary];
        let mut link = backend.acquire(backend.relay_kind(), &self.user, &self.database).await?;
        let literal = name.replace('\'', "''");
        let sql =
            format!("select coalesce(bool_or(provolatile = 'v'), false) from pg_proc where proname = '{literal}'");
        let value = query_single_value(&mut link, &sql).await?;
        backend.release(link);
        Ok(value == "t")
    }

    /// Runs a request on the primary or a replica, retrying a read elsewhere when a replica
    /// fails before answering anything.
    async fn run_routed(&mut self, route: Route, request: Request, setting: Option<(String, String)>) -> Result<()> {
        for attempt in 1..=READ_ATTEMPTS_MAX {
            let backend = match route {
                Route::Replica => self.shared.pick_replica(&self.replicas, self.last_replica).unwrap_or(self.primary),
                Route::Primary => self.primary,
            };
            let plan = self.plan(&request, backend, setting.is_none());
            let retry_allowed = route == Route::Replica && attempt < READ_ATTEMPTS_MAX;
            let state = &self.shared.backends[backend];
            let link = match state.acquire(plan.link_kind(state), &self.user, &self.database).await {
                Ok(link) => link,
                Err(error) if retry_allowed && is_connection_error(&error) => {
                    self.shared.backends[backend].ban(&error);
                    continue;
                }
                Err(error) => return self.fail_request(request.len, error).await,
            };
            // A request whose answer is handed over cannot be retried once it was sent.
            let retry_sent = retry_allowed && plan.delivery != Delivery::Direct;
            match self.run_on(link, &request, setting.clone(), retry_sent, &plan).await? {
                Ran::Done => {
                    if route == Route::Replica {
                        self.last_replica = Some(backend);
                    }
                    return Ok(());
                }
                Ran::Retry(error) => self.shared.backends[backend].ban(&error),
            }
        }
        let error = DispatchError::Protocol("no backend could run the request".into());
        self.fail_request(request.len, error).await
    }

    /// Tells the client a request could not be run and skips it; the session goes on.
    async fn fail_request(&mut self, len: usize, error: DispatchError) -> Result<()> {
        self.client.buffer.consume(len);
        let (code, text) = match &error {
            DispatchError::Server { code, message } => (code.clone(), message.clone()),
            other => (SqlState::CONNECTION_FAILURE.code().to_string(), format!("no backend available: {other}")),
        };
        build::error_with_code(&mut self.client.out, Severity::Error, &code, &text);
        build::ready_for_query(&mut self.client.out, self.status);
        self.client.flush().await
    }

    /// Sends the request on `link`, relays the answer, and keeps or releases the link.
    /// `retry_allowed`: a failure before any answer byte reached the client returns
    /// [`Ran::Retry`] with the request still unconsumed.
    async fn run_on(
        &mut self,
        mut link: Link,
        request: &Request,
        setting: Option<(String, String)>,
        retry_allowed: bool,
        plan: &Plan,
    ) -> Result<Ran> {
        let backend_id = link.backend;
        if link.settings_applied != self.settings.hash {
            let replay = self.settings.replay_sql();
            if let Err(error) = query_single_value_or_none(&mut link, &replay).await {
                if retry_allowed && is_connection_error(&error) {
                    return Ok(Ran::Retry(error));
                }
                return self.fail_request(request.len, error).await.map(|_| Ran::Done);
            }
            link.settings_applied = self.settings.hash;
        }
        let shared = self.shared.clone();
        let backend = &shared.backends[backend_id];
        backend.outstanding.fetch_add(1, Ordering::Relaxed);
        backend.requests.fetch_add(1, Ordering::Relaxed);
        let written_before = self.client.written;
        let outcome = self.send_and_relay(&mut link, request, retry_allowed, plan).await;
        backend.outstanding.fetch_sub(1, Ordering::Relaxed);
        let answer = match outcome {
            Ok(answer) => answer,
            Err(error) if retry_allowed && self.client.written == written_before && is_connection_error(&error) => {
                return Ok(Ran::Retry(error));
            }
            Err(error) => {
                self.client.fatal(SqlState::CONNECTION_FAILURE.code(), "the backend connection was lost").await;
                return Err(error);
            }
        };
        self.status = answer.status;
        if let Some((name, sql)) = setting.filter(|_| !answer.failed) {
            match name.strip_prefix("reset:") {
                Some(reset) => self.settings.reset(reset),
                None => self.settings.set(&name, &sql)?,
            }
            link.settings_applied = self.settings.hash;
        }
        if self.status == TransactionStatus::Idle && !self.sticky {
            backend.release(link);
        } else {
            self.pinned = Some(link);
        }
        Ok(Ran::Done)
    }

    /// How the answer to `request` on backend `backend_id` should travel.
    fn plan(&self, request: &Request, backend_id: usize, plain: bool) -> Plan {
        let relay = Plan { delivery: Delivery::Relay, threshold: u64::MAX, fingerprint: None, mac: None };
        let settings = &self.shared.config.settings;
        let RequestKind::Simple(sql) = &request.kind else { return relay };
        let mac = self.shared.backends[backend_id].spec.mac;
        let movable = plain
            && self.shared.switch.is_some()
            && self.status == TransactionStatus::Idle
            && !self.sticky
            && self.client.peer.is_ipv4()
            && self.client.epoch.is_some()
            && mac.is_some();
        if !movable {
            return relay;
        }
        let threshold = settings.handover_min_bytes;
        let fingerprint = request.fingerprint.unwrap_or_else(|| routing::fingerprint(sql));
        let straight_to_server = self.shared.backends[backend_id].relay_kind() == LinkKind::Postgres;
        let delivery = match settings.policy {
            Policy::Relay => return relay,
            Policy::Handover => Delivery::Direct,
            Policy::Hybrid => match self.shared.predict(fingerprint) {
                Prediction::Large => Delivery::Direct,
                // Known small: relayed by the dispatcher alone when it can reach the server (an
                // answer that turns out large after all is relayed whole, and remembered).
                Prediction::Small if straight_to_server => Delivery::Relay,
                Prediction::Small | Prediction::Unknown => Delivery::OnDemand,
            },
        };
        let threshold = if delivery == Delivery::Relay { u64::MAX } else { threshold };
        Plan { delivery, threshold, fingerprint: Some(fingerprint), mac }
    }

    /// Sends the request and delivers its answer as planned. When a retry is allowed the
    /// request stays in the client buffer until the first answer byte arrives.
    async fn send_and_relay(
        &mut self,
        link: &mut Link,
        request: &Request,
        retry_allowed: bool,
        plan: &Plan,
    ) -> Result<Answer> {
        let mut out = Vec::with_capacity(request.len + 16);
        if let Some(control) = request_frame(&mut link.standing, plan.delivery, plan.threshold) {
            assert_eq!(link.kind, LinkKind::Agent, "control frames go to agents only");
            control.encode(&mut out);
        }
        out.extend_from_slice(&self.client.buffer.pending()[..request.len]);
        link.stream.write_all(&out).await.map_err(|e| DispatchError::io("sending a request to the backend", e))?;
        if retry_allowed {
            read_answer_start(link).await?;
        }
        self.client.buffer.consume(request.len);
        let written_before = self.client.written;
        let mut direct = plan.delivery == Delivery::Direct;
        loop {
            if direct {
                let peer = match self.client.peer {
                    SocketAddr::V4(peer) => peer,
                    SocketAddr::V6(_) => unreachable!("plan() hands over IPv4 clients only"),
                };
                let mac = plan.mac.expect("plan() hands over only to backends with a MAC");
                let client = &mut self.client;
                let epoch = client.epoch.as_mut().expect("plan() hands over tracked connections only");
                match transfer::hand_over(&self.shared, &mut client.stream, epoch, peer, link, mac).await? {
                    Moved::Away { switch_delivered } => {
                        let returned = transfer::take_back(
                            &self.shared,
                            &mut client.stream,
                            epoch,
                            peer,
                            link,
                            switch_delivered,
                            mac,
                        )
                        .await?;
                        self.remember(plan, returned.answer_bytes);
                        if returned.closed {
                            return Err(closed("the client (while away)"));
                        }
                        return Ok(Answer { status: returned.status, failed: false });
                    }
                    Moved::Refused => {}
                }
            }
            let busy_poll = self.busy_poll();
            match relay_answer(link, &mut self.client, request.answers, busy_poll).await? {
                Relayed::Done(answer) => {
                    self.remember(plan, self.client.written - written_before);
                    return Ok(answer);
                }
                Relayed::HandOverAt(offset) => {
                    let relayed = self.client.written - written_before;
                    if offset != relayed {
                        let text = format!("agent asks for the connection at byte {offset}, {relayed} were relayed");
                        return Err(DispatchError::Protocol(text));
                    }
                    self.shared.stats.on_demand.fetch_add(1, Ordering::Relaxed);
                    direct = true;
                }
            }
        }
    }

    fn busy_poll(&self) -> Duration {
        Duration::from_micros(self.shared.config.settings.busy_poll_us)
    }

    fn remember(&self, plan: &Plan, answer_bytes: u64) {
        if let Some(fingerprint) = plan.fingerprint {
            self.shared.remember_bytes(fingerprint, answer_bytes);
        }
    }
}

/// The `Request` frame a request needs on a link whose agent applies `standing` to requests
/// without one: always for a hand-over, else only when the plan differs from `standing` (and
/// then becomes it).
fn request_frame(standing: &mut (Delivery, u64), delivery: Delivery, threshold: u64) -> Option<Control<'static>> {
    let wanted = (delivery, if delivery == Delivery::Relay { u64::MAX } else { threshold });
    if delivery != Delivery::Direct {
        if *standing == wanted {
            return None;
        }
        *standing = wanted;
    }
    Some(Control::Request { delivery: wanted.0, threshold: wanted.1 })
}

/// Whether a request ran, or may be retried on another backend.
enum Ran {
    Done,
    Retry(DispatchError),
}

/// How an answer travels.
struct Plan {
    delivery: Delivery,
    threshold: u64,
    /// Set when the answer's size should be remembered (hand-over policies).
    fingerprint: Option<u64>,
    mac: Option<[u8; 6]>,
}

impl Plan {
    /// Relayed answers come over the backend's relay link (straight from the server when it
    /// can); only an answer that may be handed over needs the agent.
    fn link_kind(&self, backend: &super::BackendState) -> LinkKind {
        match self.delivery {
            Delivery::Relay => backend.relay_kind(),
            Delivery::OnDemand | Delivery::Direct => LinkKind::Agent,
        }
    }
}

/// Where relaying stopped.
enum Relayed {
    Done(Answer),
    /// The agent asks for the connection after this many answer bytes.
    HandOverAt(u64),
}

/// How an answer ended.
struct Answer {
    status: TransactionStatus,
    /// An ErrorResponse was part of it.
    failed: bool,
}

/// Relays the link's answer to the client until `answers` ReadyForQuery messages passed, or
/// until the agent asks for the connection.
async fn relay_answer(link: &mut Link, client: &mut Client, answers: u32, busy_poll: Duration) -> Result<Relayed> {
    let mut remaining = answers;
    let mut answer = Answer { status: TransactionStatus::Idle, failed: false };
    loop {
        let mut forward = 0;
        let mut copy_in = false;
        let mut control = None;
        while remaining > 0 && !copy_in && control.is_none() {
            let pending = &link.buffer.pending()[forward..];
            match link.scanner.next(pending, link.buffer.capacity(), DEFAULT_MESSAGE_SIZE_MAX)? {
                Step::Message(header) if header.tag == CONTROL_TAG => control = Some(header),
                Step::Message(header) => {
                    match header.tag {
                        tag::backend::READY_FOR_QUERY => {
                            remaining -= 1;
                            answer.status = TransactionStatus::from_byte(pending[HEADER_LEN]).unwrap_or(answer.status);
                        }
                        tag::backend::ERROR_RESPONSE => answer.failed = true,
                        tag::backend::COPY_IN_RESPONSE => copy_in = true,
                        _ => {}
                    }
                    forward += header.frame_len();
                }
                Step::LargeStart { chunk_len, .. } | Step::Continuation { chunk_len, .. } => forward += chunk_len,
                Step::NeedMore => break,
            }
        }
        if forward > 0 {
            client
                .stream()
                .write_all(&link.buffer.pending()[..forward])
                .await
                .map_err(|e| DispatchError::io("writing to the client", e))?;
            client.written += forward as u64;
            link.buffer.consume(forward);
        }
        if let Some(header) = control {
            let offset = match Control::decode(link.buffer.body(header))? {
                Control::HandOverAt { offset } => offset,
                other => {
                    return Err(DispatchError::Protocol(format!("unexpected control frame in an answer: {other:?}")))
                }
            };
            link.buffer.consume(header.frame_len());
            return Ok(Relayed::HandOverAt(offset));
        }
        if remaining == 0 {
            return Ok(Relayed::Done(answer));
        }
        if copy_in {
            pump_copy_in(link, client).await?;
            continue;
        }
        wait_readable(&link.stream, busy_poll).await.map_err(|e| DispatchError::io("reading from the backend", e))?;
        if link
            .buffer
            .read_from(&mut link.stream)
            .await
            .map_err(|e| DispatchError::io("reading from the backend", e))?
            == 0
        {
            return Err(closed("the backend"));
        }
    }
}

/// Waits until `stream` is readable, polling instead of sleeping for up to `busy_poll`: the task
/// yields to its runtime, which looks for I/O without blocking, so the thread's other sessions
/// keep running. A small answer (or a busy client's next request) arrives within tens of µs,
/// and sleeping for it costs a wake-up — a context switch and, on a VM, an interrupt to the
/// vCPU — which is more than the dispatcher's whole work for a small answer.
async fn wait_readable(stream: &TcpStream, busy_poll: Duration) -> std::io::Result<()> {
    if !busy_poll.is_zero() {
        let deadline = Instant::now() + busy_poll;
        while Instant::now() < deadline {
            tokio::select! {
                biased;
                ready = stream.readable() => return ready,
                () = tokio::task::yield_now() => {}
            }
        }
    }
    stream.readable().await
}

/// COPY FROM STDIN: forwards the client's CopyData until CopyDone or CopyFail.
async fn pump_copy_in(link: &mut Link, client: &mut Client) -> Result<()> {
    loop {
        let mut forward = 0;
        let mut done = false;
        while !done {
            let pending = &client.buffer.pending()[forward..];
            if client.scanner.at_boundary() {
                check_frontend_tag(pending)?;
            }
            match client.scanner.next(pending, client.buffer.capacity(), DEFAULT_MESSAGE_SIZE_MAX)? {
                Step::Message(header) => {
                    forward += header.frame_len();
                    done = matches!(header.tag, tag::frontend::COPY_DONE | tag::frontend::COPY_FAIL);
                }
                Step::LargeStart { chunk_len, .. } | Step::Continuation { chunk_len, .. } => forward += chunk_len,
                Step::NeedMore => break,
            }
        }
        if forward > 0 {
            link.stream
                .write_all(&client.buffer.pending()[..forward])
                .await
                .map_err(|e| DispatchError::io("sending COPY data to the backend", e))?;
            client.buffer.consume(forward);
        }
        if done {
            return Ok(());
        }
        client.fill().await?;
    }
}

/// Reads the first bytes of an answer before any of it goes to the client. A server that closes,
/// or says it is going away, first did not run the request: the link was already dying (a server
/// shut down while the link sat idle, its notice and close still on their way) and the request
/// may go elsewhere. Whatever else comes first is the answer.
async fn read_answer_start(link: &mut Link) -> Result<()> {
    loop {
        let count = link
            .buffer
            .read_from(&mut link.stream)
            .await
            .map_err(|e| DispatchError::io("reading from the backend", e))?;
        if count == 0 {
            return Err(closed("the backend"));
        }
        match farewell(link.buffer.pending(), link.buffer.capacity()) {
            Opening::NeedMore => {}
            Opening::Farewell(error) => return Err(error),
            Opening::Answer => return Ok(()),
        }
    }
}

/// What the first bytes from a backend are.
#[derive(Debug)]
enum Opening {
    /// The first message is a notice or error that is not yet whole.
    NeedMore,
    /// A notice or error saying the connection is going away (SQLSTATE class 08 or 57P), as
    /// PostgreSQL sends to each session when it shuts down.
    Farewell(DispatchError),
    Answer,
}

fn farewell(pending: &[u8], capacity: usize) -> Opening {
    let Ok(Some(header)) = read_header(pending, DEFAULT_MESSAGE_SIZE_MAX) else {
        return if pending.len() < HEADER_LEN { Opening::NeedMore } else { Opening::Answer };
    };
    let notice_or_error = matches!(header.tag, tag::backend::NOTICE_RESPONSE | tag::backend::ERROR_RESPONSE);
    if !notice_or_error || header.frame_len() > capacity {
        return Opening::Answer;
    }
    if pending.len() < header.frame_len() {
        return Opening::NeedMore;
    }
    let body = &pending[HEADER_LEN..header.frame_len()];
    let fields = match BackendMessage::decode(header.tag, body) {
        Ok(BackendMessage::ErrorResponse(fields) | BackendMessage::NoticeResponse(fields)) => fields,
        _ => return Opening::Answer,
    };
    match server_error(&fields) {
        DispatchError::Server { code, message } if is_connection_error_code(&code) => {
            Opening::Farewell(DispatchError::Server { code, message })
        }
        _ => Opening::Answer,
    }
}

/// Runs statements whose rows do not matter (settings replay).
async fn query_single_value_or_none(link: &mut Link, sql: &str) -> Result<()> {
    match query_single_value(link, sql).await {
        Ok(_) => Ok(()),
        Err(DispatchError::Protocol(text)) if text.starts_with("no value") => Ok(()),
        Err(error) => Err(error),
    }
}

/// Failures of the path to a backend (not of the statement): worth banning and retrying.
fn is_connection_error(error: &DispatchError) -> bool {
    match error {
        DispatchError::Io { .. } => true,
        // The agent could not log in to its server: the server is down or refusing.
        DispatchError::Server { code, .. } => is_connection_error_code(code),
        _ => false,
    }
}

/// SQLSTATEs of a server that is down or going down rather than of a bad statement.
fn is_connection_error_code(code: &str) -> bool {
    code.starts_with("08") || code.starts_with("57P")
}

/// Finds one whole request at the start of `pending`, or `None` when more bytes are needed.
fn parse_request(pending: &[u8]) -> Result<Option<Request>> {
    let mut offset = 0;
    let mut queries = Vec::new();
    let mut named = false;
    loop {
        check_frontend_tag(&pending[offset..])?;
        let Some((header, body)) = split_message(&pending[offset..], REQUEST_BYTES_MAX as u32)? else {
            return Ok(None);
        };
        offset += header.frame_len();
        let first = offset == header.frame_len();
        match FrontendMessage::decode(header.tag, body)? {
            FrontendMessage::Query(sql) if first => {
                let sql = String::from_utf8_lossy(sql.strip_suffix(&[0]).unwrap_or(sql)).into_owned();
                return Ok(Some(Request {
                    len: offset,
                    kind: RequestKind::Simple(sql),
                    answers: 1,
                    fingerprint: None,
                }));
            }
            FrontendMessage::FunctionCall(_) if first => {
                return Ok(Some(Request {
                    len: offset,
                    kind: RequestKind::FunctionCall,
                    answers: 1,
                    fingerprint: None,
                }))
            }
            FrontendMessage::Terminate if first => {
                return Ok(Some(Request { len: offset, kind: RequestKind::Terminate, answers: 0, fingerprint: None }))
            }
            FrontendMessage::Parse(parse) => {
                named |= !parse.name.is_empty();
                queries.push(String::from_utf8_lossy(parse.query).into_owned());
            }
            FrontendMessage::Bind(bind) => named |= !bind.portal.is_empty() || !bind.statement.is_empty(),
            FrontendMessage::Describe { name, .. } | FrontendMessage::Close { name, .. } => named |= !name.is_empty(),
            FrontendMessage::Execute { portal, .. } => named |= !portal.is_empty(),
            FrontendMessage::Sync => {
                let kind = RequestKind::Extended { queries, named };
                return Ok(Some(Request { len: offset, kind, answers: 1, fingerprint: None }));
            }
            FrontendMessage::Flush => {}
            other => {
                return Err(DispatchError::Protocol(format!(
                    "unexpected message {:?} outside a request",
                    other.tag() as char
                )))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: a hybrid's small requests carry no Request frame once the agent stands in
    // OnDemand, a hand-over always carries one without changing the standing mode, and a
    // change of mode or threshold is announced; method: a sequence of plans on one link.
    #[test]
    fn request_frames_only_announce_changes() {
        let mut standing = (Delivery::Relay, u64::MAX);
        assert_eq!(request_frame(&mut standing, Delivery::Relay, 100), None, "a new link already relays");
        let on_demand = Some(Control::Request { delivery: Delivery::OnDemand, threshold: 100 });
        assert_eq!(request_frame(&mut standing, Delivery::OnDemand, 100), on_demand);
        assert_eq!(request_frame(&mut standing, Delivery::OnDemand, 100), None);
        let direct = Some(Control::Request { delivery: Delivery::Direct, threshold: 100 });
        assert_eq!(request_frame(&mut standing, Delivery::Direct, 100), direct);
        assert_eq!(standing, (Delivery::OnDemand, 100), "a hand-over is for one request only");
        assert!(request_frame(&mut standing, Delivery::OnDemand, 200).is_some(), "a new threshold is announced");
        let relay = Some(Control::Request { delivery: Delivery::Relay, threshold: u64::MAX });
        assert_eq!(request_frame(&mut standing, Delivery::Relay, 200), relay);
        assert_eq!(request_frame(&mut standing, Delivery::Relay, 200), None);
    }

    // Goal: only a notice or error saying the server is going away, before any answer byte,
    // makes a request retryable; an answer that starts with another notice is an answer.
    // Method: PostgreSQL's immediate-shutdown warning, whole and cut, and ordinary openings.
    #[test]
    fn a_shutdown_notice_before_the_answer_is_a_farewell() {
        let capacity = 1024;
        let mut shutdown = Vec::new();
        let text = "terminating connection due to immediate shutdown command";
        build::notice_with_severity(&mut shutdown, Severity::Warning, SqlState::ADMIN_SHUTDOWN, text);
        build::ready_for_query(&mut shutdown, TransactionStatus::Idle);
        let farewell_of = |bytes: &[u8]| farewell(bytes, capacity);
        assert!(matches!(
            farewell_of(&shutdown),
            Opening::Farewell(DispatchError::Server { ref code, .. }) if code == "57P01"
        ));
        for cut in [1, HEADER_LEN, HEADER_LEN + 3] {
            assert!(matches!(farewell_of(&shutdown[..cut]), Opening::NeedMore), "cut at {cut}");
        }
        let mut fatal = Vec::new();
        build::error(&mut fatal, Severity::Fatal, SqlState::ADMIN_SHUTDOWN, "terminating connection");
        assert!(matches!(farewell_of(&fatal), Opening::Farewell(_)));

        let mut chatty = Vec::new();
        build::notice(&mut chatty, SqlState::WARNING, "a warning of the query's own");
        assert!(matches!(farewell_of(&chatty), Opening::Answer));
        let mut failed = Vec::new();
        build::error(&mut failed, Severity::Error, SqlState::UNDEFINED_TABLE, "no such table");
        assert!(matches!(farewell_of(&failed), Opening::Answer));
        let mut rows = Vec::new();
        build::text_row_description(&mut rows, &["name"]);
        assert!(matches!(farewell_of(&rows), Opening::Answer));
        assert!(matches!(farewell_of(&rows[..2]), Opening::NeedMore));
    }
}
