//! One client connection: startup, then the message loop (simple query, extended query, COPY).
//!
//! ```text
//!   start_up: SSLRequest/GSSENCRequest ─► 'N';  CancelRequest ─► registry;  StartupMessage ─►
//!             AuthenticationOk, ParameterStatus…, BackendKeyData, ReadyForQuery
//!   loop: Query ─► statements one by one (implicit block when several) ─► ReadyForQuery
//!         Parse/Bind/Describe/Execute/Close/Flush … Sync (an error skips to Sync)
//!   a statement: session moves to a blocking thread ─► rows come back through a bounded
//!         channel as encoded bytes ─► written here; meanwhile the socket is read, and EOF
//!         stops the statement (the client is gone)
//! ```

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use bypass_frontdoor::{Admission, CancelKey, Stream};
use bypass_wire::auth::Refusal;
use bypass_wire::frame::read_header;
use bypass_wire::frontend::{Bind, DescribeKind, FrontendMessage, Parse};
use bypass_wire::{SqlState, StartupRequest};
use sqlparser::ast;
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use super::encode::{self, Format};
use super::params;
use super::{CancelSlot, Shared};
use crate::control::{QueryControl, StopReason};
use crate::copy::{CopyFormat, CopyIn};
use crate::engine::{Description, Engine};
use crate::error::EngineError;
use crate::session::{Outcome, Session, Status};
use crate::stream::{Piece, ResultShape, ResultSink};
use crate::vector::Batch;

/// Encoded pieces (up to VECTOR_ROWS rows each) a statement may have in flight to the socket.
const OUTPUT_PIECES_MAX: usize = 4;
/// Bytes read from the socket at a time.
const READ_BYTES: usize = 64 << 10;
/// Pipelined input read ahead while a statement runs; beyond it the socket is left unread.
const READ_AHEAD_BYTES_MAX: usize = 1 << 20;
/// COPY data handed to the loader at a time.
const COPY_BATCH_BYTES: usize = 1 << 20;

/// Why a connection ends.
enum End {
    /// Terminate, EOF or a write failure.
    Closed,
    /// A protocol error: FATAL sent.
    Fatal,
}

/// How one statement ended.
enum StatementEnd {
    Done(String),
    Failed(EngineError),
    CopyIn(Box<CopyIn>),
}

/// A prepared statement (extended protocol).
struct Prepared {
    sql: String,
    /// The statement with sentinels for its parameters (describing it), `None` if empty.
    statement: Option<ast::Statement>,
    declared: Vec<u32>,
    parameters: usize,
    /// Parameter types after inference (declared ones kept), computed once.
    inferred: Option<Vec<u32>>,
}

/// Rows of a portal executed with a row limit, waiting for the next Execute.
struct PendingRows {
    bytes: Vec<u8>,
    offset: usize,
    tag: String,
}

/// A bound statement (extended protocol).
struct Portal {
    statement: Option<ast::Statement>,
    result_formats: Vec<i16>,
    executed: bool,
    pending: Option<PendingRows>,
}

struct Connection {
    shared: Arc<Shared>,
    engine: Arc<Engine>,
    stream: Stream,
    /// Reads land here first (a fixed scratch buffer), then move to `input`.
    scratch: Box<[u8]>,
    input: Vec<u8>,
    output: Vec<u8>,
    session: Option<Session>,
    statements: HashMap<String, Prepared>,
    portals: HashMap<String, Portal>,
    skip_until_sync: bool,
    /// An extended-protocol implicit block is open (since the first Execute after Sync).
    in_block: bool,
    slot: Arc<CancelSlot>,
}

/// Serves one client until it leaves: the front door authenticates it, then the session runs.
pub(super) async fn serve(shared: Arc<Shared>, tcp: TcpStream) {
    let mut client = match shared.door.accept(tcp, READ_BYTES).await {
        Ok(Admission::Client(client)) => client,
        Ok(Admission::Cancel(request)) => {
            shared.cancel(request.process_id, &request.secret);
            return;
        }
        // Refused: the front door answered (FATAL), logged and delayed already.
        Err(_) => return,
    };
    let session = match open_session(&shared, &client.request) {
        Ok(session) => session,
        Err(error) => {
            let refusal = Refusal::new(SqlState(error.sqlstate()), error.to_string());
            shared.door.refuse(&mut client, refusal).await;
            return;
        }
    };
    let slot = Arc::new(CancelSlot::default());
    let key = CancelKey::random();
    shared.register(&key, &slot);
    let parameters: Vec<(String, String)> =
        session.settings.reported(&client.request.user).into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    if client.welcome(&parameters, key).await.is_ok() {
        let client = *client;
        let mut connection = Connection {
            engine: Arc::clone(&shared.engine),
            shared: Arc::clone(&shared),
            stream: client.stream,
            scratch: vec![0; READ_BYTES].into_boxed_slice(),
            input: client.buffer.pending().to_vec(),
            output: Vec::new(),
            session: Some(session),
            statements: HashMap::new(),
            portals: HashMap::new(),
            skip_until_sync: false,
            in_block: false,
            slot,
        };
        let _ = connection.run().await;
        let _ = connection.flush().await;
        if let Some(mut session) = connection.session.take() {
            session.close(&connection.engine);
        }
    }
    shared.unregister(&key);
}

/// Checks the database and applies the startup parameters (settings, `options`).
fn open_session(shared: &Shared, request: &StartupRequest) -> Result<Session, EngineError> {
    if request.database != shared.settings.database {
        return Err(EngineError::UnknownDatabase(request.database.clone()));
    }
    let mut session = shared.engine.session();
    for (name, value) in &request.parameters {
        match name.as_str() {
            "replication" => return Err(EngineError::unsupported("replication connections")),
            "options" => apply_options(&mut session, value)?,
            _ => session.settings.set(name, Some(value))?,
        }
    }
    Ok(session)
}

impl Connection {
    fn session(&mut self) -> &mut Session {
        self.session.as_mut().expect("the session is home between statements")
    }

    async fn flush(&mut self) -> Result<(), End> {
        if self.output.is_empty() {
            return Ok(());
        }
        let result = self.stream.write_all(&self.output).await;
        self.output.clear();
        result.map_err(|_| End::Closed)
    }

    async fn fatal(&mut self, code: &str, message: &str) -> End {
        encode::error_or_notice(&mut self.output, b'E', "FATAL", code, message);
        let _ = self.flush().await;
        End::Fatal
    }

    /// Reads more bytes into `input`; EOF and errors end the connection.
    async fn read_more(&mut self) -> Result<(), End> {
        match self.stream.read(&mut self.scratch).await {
            Ok(0) | Err(_) => Err(End::Closed),
            Ok(read) => {
                self.input.extend_from_slice(&self.scratch[..read]);
                Ok(())
            }
        }
    }

    /// The next whole message (tag, body).
    async fn read_message(&mut self) -> Result<(u8, Vec<u8>), End> {
        let limit = u32::try_from(self.shared.settings.message_size_max).unwrap_or(u32::MAX);
        loop {
            match read_header(&self.input, limit) {
                Err(error) => return Err(self.fatal("08P01", &format!("invalid message: {error}")).await),
                Ok(Some(header)) if self.input.len() >= header.frame_len() => {
                    let body = self.input[bypass_wire::HEADER_LEN..header.frame_len()].to_vec();
                    self.input.drain(..header.frame_len());
                    return Ok((header.tag, body));
                }
                Ok(_) => self.read_more().await?,
            }
        }
    }

    async fn run(&mut self) -> Result<(), End> {
        loop {
            if read_header(&self.input, u32::MAX).ok().flatten().is_none_or(|h| self.input.len() < h.frame_len()) {
                self.flush().await?;
            }
            let (tag, body) = self.next_message_or_idle_timeout().await?;
            let message = match FrontendMessage::decode(tag, &body) {
                Ok(message) => message,
                Err(error) => return Err(self.fatal("08P01", &format!("invalid message: {error}")).await),
            };
            self.handle(message).await?;
        }
    }

    async fn next_message_or_idle_timeout(&mut self) -> Result<(u8, Vec<u8>), End> {
        let idle_limit = self.session().settings.idle_in_transaction_session_timeout;
        let in_transaction = self.session().status() != Status::Idle;
        match idle_limit.filter(|_| in_transaction) {
            None => self.read_message().await,
            Some(limit) => match tokio::time::timeout(limit, self.read_message()).await {
                Ok(message) => message,
                Err(_) => Err(self.fatal("25P03", "terminating connection due to idle-in-transaction timeout").await),
            },
        }
    }

    async fn handle(&mut self, message: FrontendMessage<'_>) -> Result<(), End> {
        match message {
            FrontendMessage::Terminate => return Err(End::Closed),
            FrontendMessage::Sync => return self.sync().await,
            FrontendMessage::Flush => return self.flush().await,
            // Left over from a COPY that failed: PostgreSQL drops them too.
            FrontendMessage::CopyData(_) | FrontendMessage::CopyDone | FrontendMessage::CopyFail(_) => return Ok(()),
            _ if self.skip_until_sync => return Ok(()),
            FrontendMessage::Query(sql) => return self.simple_query(sql).await,
            FrontendMessage::PasswordLike(_) => {
                return Err(self.fatal("08P01", "unexpected password message after startup").await);
            }
            FrontendMessage::FunctionCall(_) => {
                encode::error(&mut self.output, &EngineError::unsupported("the function call protocol"));
                let status = self.status_byte();
                encode::ready_for_query(&mut self.output, status);
                return Ok(());
            }
            _ => {}
        }
        let outcome = match message {
            FrontendMessage::Parse(parse) => self.parse(&parse).await,
            FrontendMessage::Bind(bind) => self.bind(&bind).await,
            FrontendMessage::Describe { kind, name } => self.describe(kind, &String::from_utf8_lossy(name)).await,
            FrontendMessage::Execute { portal, max_rows } => {
                self.execute(&String::from_utf8_lossy(portal), usize::try_from(max_rows).unwrap_or(0)).await?
            }
            FrontendMessage::Close { kind, name } => {
                let name = String::from_utf8_lossy(name).into_owned();
                match kind {
                    DescribeKind::Statement => self.statements.remove(&name).map(|_| ()),
                    DescribeKind::Portal => self.portals.remove(&name).map(|_| ()),
                };
                encode::empty_message(&mut self.output, b'3');
                Ok(())
            }
            _ => unreachable!("handled above"),
        };
        if let Err(error) = outcome {
            self.extended_error(error).await;
        }
        Ok(())
    }

    /// An error in the extended protocol: reported, the transaction fails, the rest of the
    /// batch is skipped until Sync.
    async fn extended_error(&mut self, error: EngineError) {
        encode::error(&mut self.output, &error);
        self.skip_until_sync = true;
        let engine = Arc::clone(&self.engine);
        self.session().abort(&engine);
    }

    fn status_byte(&mut self) -> u8 {
        match self.session().status() {
            Status::Idle => b'I',
            Status::InTransaction => b'T',
            Status::Failed => b'E',
        }
    }

    async fn sync(&mut self) -> Result<(), End> {
        self.skip_until_sync = false;
        if std::mem::take(&mut self.in_block) {
            if let Err(error) = self.with_session(|session, engine| session.end_implicit_block(engine)).await {
                encode::error(&mut self.output, &error);
            }
        }
        if self.session().status() == Status::Idle {
            // Portals live as long as their transaction.
            self.portals.clear();
        }
        let status = self.status_byte();
        encode::ready_for_query(&mut self.output, status);
        self.flush().await
    }

    /// Runs `f` with the session on a blocking thread (binding and committing can be work).
    async fn with_session<T: Send + 'static>(
        &mut self,
        f: impl FnOnce(&mut Session, &Engine) -> T + Send + 'static,
    ) -> T {
        let mut session = self.session.take().expect("the session is home between statements");
        let engine = Arc::clone(&self.engine);
        let joined = tokio::task::spawn_blocking(move || {
            let result = f(&mut session, &engine);
            (session, result)
        })
        .await;
        let (session, result) = joined.expect("session tasks do not panic");
        self.session = Some(session);
        result
    }

    async fn simple_query(&mut self, sql: &[u8]) -> Result<(), End> {
        let statements = match std::str::from_utf8(sql) {
            Err(_) => Err(EngineError::CharacterNotInRepertoire("invalid byte sequence for encoding \"UTF8\"".into())),
            Ok(text) => Engine::parse(text),
        };
        match statements {
            Err(error) => encode::error(&mut self.output, &error),
            Ok(statements) if statements.is_empty() => encode::empty_message(&mut self.output, b'I'),
            Ok(statements) => self.run_script(statements).await?,
        }
        let status = self.status_byte();
        encode::ready_for_query(&mut self.output, status);
        self.flush().await
    }

    /// The statements of one Query message: an implicit block when there are several.
    async fn run_script(&mut self, statements: Vec<ast::Statement>) -> Result<(), End> {
        let block = statements.len() > 1;
        if block {
            self.session().begin_implicit_block();
        }
        for statement in statements {
            let end = self.run_statement(statement, true, Vec::new(), None).await?;
            if !self.finish_statement(end).await? {
                break;
            }
        }
        if block {
            if let Err(error) = self.with_session(|session, engine| session.end_implicit_block(engine)).await {
                encode::error(&mut self.output, &error);
            }
        }
        Ok(())
    }

    /// Reports how a statement ended (running a COPY FROM STDIN first); false if it failed.
    async fn finish_statement(&mut self, end: StatementEnd) -> Result<bool, End> {
        let result = match end {
            StatementEnd::Done(tag) => Ok(tag),
            StatementEnd::Failed(error) => Err(error),
            StatementEnd::CopyIn(copy) => self.copy_in(copy).await?,
        };
        self.drain_notices();
        match result {
            Ok(tag) => {
                encode::command_complete(&mut self.output, &tag);
                Ok(true)
            }
            Err(error) => {
                encode::error(&mut self.output, &error);
                Ok(false)
            }
        }
    }

    fn drain_notices(&mut self) {
        for notice in self.session().take_notices() {
            encode::error_or_notice(&mut self.output, b'N', notice.severity, notice.code, &notice.message);
        }
    }

    /// Runs one statement on a blocking thread, writing its rows as they come (or into
    /// `collect`). The socket is watched meanwhile: if the client leaves, the statement stops.
    async fn run_statement(
        &mut self,
        statement: ast::Statement,
        describe: bool,
        result_formats: Vec<i16>,
        collect: Option<&mut Vec<u8>>,
    ) -> Result<StatementEnd, End> {
        let mut session = self.session.take().expect("the session is home between statements");
        let control = session.new_control();
        self.slot.set(Some(Arc::clone(&control)));
        let (sender, receiver) = mpsc::channel(OUTPUT_PIECES_MAX);
        let sink = WireSink { sender, describe, result_formats, encoding: OnceLock::new() };
        let engine = Arc::clone(&self.engine);
        let task_control = Arc::clone(&control);
        let task = tokio::task::spawn_blocking(move || {
            let run = || crate::control::enter(&task_control, || session.execute(&engine, &statement, &sink));
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)).unwrap_or_else(|_| {
                session.close(&engine);
                Err(EngineError::Runtime("the statement failed unexpectedly; its transaction was rolled back".into()))
            });
            drop(sink);
            (session, outcome)
        });
        self.shared.running.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let ((session, outcome), gone) = self.drive(receiver, task, &control, collect).await;
        self.shared.running.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        self.slot.set(None);
        self.session = Some(session);
        if gone {
            return Err(End::Closed);
        }
        Ok(match outcome {
            Ok(Outcome::Done(tag)) => StatementEnd::Done(tag),
            Ok(Outcome::CopyIn(copy)) => StatementEnd::CopyIn(copy),
            Err(error) => StatementEnd::Failed(error),
        })
    }

    /// Pumps a statement's output to the socket (or `collect`) until the statement is done,
    /// reading the socket meanwhile; returns the task's result and whether the client left.
    async fn drive<T: Send + 'static>(
        &mut self,
        mut receiver: mpsc::Receiver<Vec<u8>>,
        mut task: tokio::task::JoinHandle<T>,
        control: &QueryControl,
        mut collect: Option<&mut Vec<u8>>,
    ) -> (T, bool) {
        enum Event<T> {
            Piece(Option<Vec<u8>>),
            Finished(T),
            Read(std::io::Result<usize>),
        }
        let mut gone = false;
        let mut open = true;
        let mut result = None;
        while result.is_none() || open {
            let room = !gone && self.input.len() < READ_AHEAD_BYTES_MAX;
            let event = tokio::select! {
                biased;
                piece = receiver.recv(), if open => Event::Piece(piece),
                joined = &mut task, if result.is_none() => {
                    Event::Finished(joined.expect("statement tasks catch their panics"))
                }
                read = self.stream.read(&mut self.scratch), if room => Event::Read(read),
            };
            let failed = match event {
                Event::Piece(None) => {
                    open = false;
                    false
                }
                Event::Piece(Some(_)) if gone => false,
                Event::Piece(Some(bytes)) => match collect.as_deref_mut() {
                    Some(buffer) => {
                        buffer.extend_from_slice(&bytes);
                        false
                    }
                    None => {
                        self.output.extend_from_slice(&bytes);
                        self.flush().await.is_err()
                    }
                },
                Event::Finished(value) => {
                    result = Some(value);
                    false
                }
                Event::Read(Ok(0) | Err(_)) => true,
                Event::Read(Ok(read)) => {
                    // Pipelined messages: kept for after this statement.
                    self.input.extend_from_slice(&self.scratch[..read]);
                    false
                }
            };
            if failed {
                gone = true;
                control.stop(StopReason::ClientGone);
                receiver.close();
            }
        }
        (result.expect("the loop ends once the task is done"), gone)
    }

    /// COPY FROM STDIN: CopyInResponse, then CopyData until CopyDone or CopyFail.
    async fn copy_in(&mut self, copy: Box<CopyIn>) -> Result<Result<String, EngineError>, End> {
        encode::copy_response(&mut self.output, b'G', copy.columns());
        self.flush().await?;
        let control = self.session().new_control();
        self.slot.set(Some(Arc::clone(&control)));
        let outcome = self.copy_in_loop(copy, &control).await;
        self.slot.set(None);
        outcome
    }

    async fn copy_in_loop(
        &mut self,
        mut copy: Box<CopyIn>,
        control: &Arc<QueryControl>,
    ) -> Result<Result<String, EngineError>, End> {
        let mut batch = Vec::new();
        loop {
            let message = self.read_message().await;
            let (tag, body) = match message {
                Ok(message) => message,
                Err(end) => {
                    let engine = Arc::clone(&self.engine);
                    self.session().copy_in_fail(&engine, copy, "the client disconnected");
                    return Err(end);
                }
            };
            match tag {
                b'd' => {
                    batch.extend_from_slice(&body);
                    if batch.len() < COPY_BATCH_BYTES {
                        continue;
                    }
                    let data = std::mem::take(&mut batch);
                    let task_control = Arc::clone(control);
                    let (returned, loaded) = self
                        .with_session(move |session, engine| {
                            let loaded =
                                crate::control::enter(&task_control, || session.copy_in_data(engine, &mut copy, &data));
                            (copy, loaded)
                        })
                        .await;
                    copy = returned;
                    if let Err(error) = loaded {
                        drop(copy);
                        return Ok(Err(error));
                    }
                }
                b'c' => {
                    let task_control = Arc::clone(control);
                    let done = self
                        .with_session(move |session, engine| {
                            crate::control::enter(&task_control, || {
                                session.copy_in_data(engine, &mut copy, &batch)?;
                                session.copy_in_done(engine, copy)
                            })
                        })
                        .await;
                    return Ok(done);
                }
                b'f' => {
                    let reason = String::from_utf8_lossy(body.strip_suffix(&[0]).unwrap_or(&body)).into_owned();
                    let engine = Arc::clone(&self.engine);
                    return Ok(Err(self.session().copy_in_fail(&engine, copy, &reason)));
                }
                b'H' | b'S' => {}
                other => {
                    let engine = Arc::clone(&self.engine);
                    self.session().copy_in_fail(&engine, copy, "protocol violation");
                    return Ok(Err(EngineError::Protocol(format!(
                        "unexpected message type 0x{other:02x} during COPY from stdin"
                    ))));
                }
            }
        }
    }

    async fn parse(&mut self, parse: &Parse<'_>) -> Result<(), EngineError> {
        let name = String::from_utf8_lossy(parse.name).into_owned();
        if !name.is_empty() && self.statements.contains_key(&name) {
            return Err(EngineError::PreparedStatement(format!("prepared statement \"{name}\" already exists")));
        }
        let sql = std::str::from_utf8(parse.query)
            .map_err(|_| EngineError::CharacterNotInRepertoire("invalid byte sequence for encoding \"UTF8\"".into()))?
            .to_string();
        let mut statements = Engine::parse(&params::with_sentinels(&sql))?;
        if statements.len() > 1 {
            return Err(EngineError::Syntax("cannot insert multiple commands into a prepared statement".into()));
        }
        let parameters = params::placeholder_count(&sql);
        let declared: Vec<u32> = parse.param_types().collect();
        let prepared = Prepared { sql, statement: statements.pop(), declared, parameters, inferred: None };
        self.statements.insert(name, prepared);
        encode::empty_message(&mut self.output, b'1');
        Ok(())
    }

    /// The statement's parameter types: declared, else inferred from their use, else text.
    async fn parameter_types(&mut self, name: &str) -> Result<Vec<u32>, EngineError> {
        let prepared = self.prepared(name)?;
        if let Some(types) = &prepared.inferred {
            return Ok(types.clone());
        }
        let declared = prepared.declared.clone();
        let count = prepared.parameters;
        let open = (0..count).any(|i| declared.get(i).is_none_or(|&t| t == params::oid::UNSPECIFIED));
        let inferred = match (&prepared.statement, open) {
            (Some(statement), true) => {
                let statement = statement.clone();
                self.with_session(move |session, engine| session.describe_parameters(engine, &statement).1).await
            }
            _ => Default::default(),
        };
        let types: Vec<u32> = (0..count)
            .map(|i| match declared.get(i) {
                Some(&oid) if oid != params::oid::UNSPECIFIED => oid,
                _ => inferred.get(&(i + 1)).map_or(params::oid::TEXT, |t| params::oid_of(*t)),
            })
            .collect();
        if let Some(prepared) = self.statements.get_mut(name) {
            prepared.inferred = Some(types.clone());
        }
        Ok(types)
    }

    fn prepared(&self, name: &str) -> Result<&Prepared, EngineError> {
        self.statements
            .get(name)
            .ok_or_else(|| EngineError::PreparedStatement(format!("prepared statement \"{name}\" does not exist")))
    }

    async fn bind(&mut self, bind: &Bind<'_>) -> Result<(), EngineError> {
        let portal_name = String::from_utf8_lossy(bind.portal).into_owned();
        let statement_name = String::from_utf8_lossy(bind.statement).into_owned();
        let prepared = self.prepared(&statement_name)?;
        let values: Vec<Option<&[u8]>> = bind.params.iter().collect();
        if values.len() != prepared.parameters {
            return Err(EngineError::Protocol(format!(
                "bind message supplies {} parameters, but prepared statement \"{statement_name}\" requires {}",
                values.len(),
                prepared.parameters
            )));
        }
        if !portal_name.is_empty() && self.portals.contains_key(&portal_name) {
            return Err(EngineError::InvalidParameterValue(format!("portal \"{portal_name}\" already exists")));
        }
        let empty = prepared.statement.is_none();
        let sql = prepared.sql.clone();
        let types = self.parameter_types(&statement_name).await?;
        let formats: Vec<i16> = bind.param_formats.iter().collect();
        let statement = if empty {
            None
        } else {
            let bound_sql = params::substitute(&sql, &types, &formats, &values)?;
            Engine::parse(&bound_sql)?.pop()
        };
        let result_formats = bind.result_formats.iter().collect();
        self.portals.insert(portal_name, Portal { statement, result_formats, executed: false, pending: None });
        encode::empty_message(&mut self.output, b'2');
        Ok(())
    }

    async fn describe(&mut self, kind: DescribeKind, name: &str) -> Result<(), EngineError> {
        let (statement, formats) = match kind {
            DescribeKind::Statement => {
                let types = self.parameter_types(name).await?;
                encode::parameter_description(&mut self.output, &types);
                (self.prepared(name)?.statement.clone(), Vec::new())
            }
            DescribeKind::Portal => {
                let portal = self.portals.get(name).ok_or_else(|| EngineError::UnknownPortal(name.to_string()))?;
                (portal.statement.clone(), portal.result_formats.clone())
            }
        };
        let described: Option<Description> = match statement {
            None => None,
            Some(statement) => self.with_session(move |session, engine| session.describe(engine, &statement)).await?,
        };
        match described {
            None => encode::empty_message(&mut self.output, b'n'),
            Some((names, types)) => {
                let formats = Format::expand(&formats, names.len())?;
                encode::row_description(&mut self.output, &names, &types, &formats);
            }
        }
        Ok(())
    }

    async fn execute(&mut self, name: &str, max_rows: usize) -> Result<Result<(), EngineError>, End> {
        let Some(portal) = self.portals.get_mut(name) else {
            return Ok(Err(EngineError::UnknownPortal(name.to_string())));
        };
        if portal.pending.is_some() {
            self.send_pending(name, max_rows);
            return Ok(Ok(()));
        }
        let Some(statement) = portal.statement.clone() else {
            encode::empty_message(&mut self.output, b'I');
            return Ok(Ok(()));
        };
        if std::mem::replace(&mut portal.executed, true) {
            // A finished portal has no rows left (PostgreSQL answers the same way).
            encode::command_complete(&mut self.output, "SELECT 0");
            return Ok(Ok(()));
        }
        let formats = portal.result_formats.clone();
        if !self.in_block {
            self.in_block = true;
            self.session().begin_implicit_block();
        }
        let returns_rows = matches!(
            statement,
            ast::Statement::Query(_) | ast::Statement::Explain { .. } | ast::Statement::ShowVariable { .. }
        );
        if max_rows > 0 && returns_rows {
            let mut rows = Vec::new();
            let end = self.run_statement(statement, false, formats, Some(&mut rows)).await?;
            return Ok(match end {
                StatementEnd::Done(tag) => {
                    if let Some(portal) = self.portals.get_mut(name) {
                        portal.pending = Some(PendingRows { bytes: rows, offset: 0, tag });
                    }
                    self.send_pending(name, max_rows);
                    Ok(())
                }
                StatementEnd::Failed(error) => Err(error),
                StatementEnd::CopyIn(_) => Err(EngineError::Protocol("COPY through a row-limited Execute".into())),
            });
        }
        let end = self.run_statement(statement, false, formats, None).await?;
        if self.finish_statement(end).await? {
            Ok(Ok(()))
        } else {
            // finish_statement reported the error; the batch is skipped until Sync.
            self.skip_until_sync = true;
            Ok(Ok(()))
        }
    }

    /// Sends up to `max_rows` rows of a portal's pending result (0 = all), then PortalSuspended
    /// or CommandComplete.
    fn send_pending(&mut self, name: &str, max_rows: usize) {
        let Some(portal) = self.portals.get_mut(name) else { return };
        let Some(pending) = portal.pending.as_mut() else { return };
        let mut end = pending.offset;
        let mut rows = 0;
        while end < pending.bytes.len() && (max_rows == 0 || rows < max_rows) {
            let length = u32::from_be_bytes([
                pending.bytes[end + 1],
                pending.bytes[end + 2],
                pending.bytes[end + 3],
                pending.bytes[end + 4],
            ]);
            end += 1 + length as usize;
            rows += 1;
        }
        self.output.extend_from_slice(&pending.bytes[pending.offset..end]);
        pending.offset = end;
        if end < pending.bytes.len() {
            encode::empty_message(&mut self.output, b's');
        } else {
            let tag = pending.tag.clone();
            portal.pending = None;
            encode::command_complete(&mut self.output, &tag);
        }
    }
}

/// The `options` startup parameter: `-c name=value` and `--name=value` pairs.
fn apply_options(session: &mut Session, options: &str) -> Result<(), EngineError> {
    let mut words = options.split_whitespace();
    while let Some(word) = words.next() {
        let assignment = match word {
            "-c" => words.next().unwrap_or_default().to_string(),
            other if other.starts_with("--") => other[2..].to_string(),
            other if other.starts_with("-c") => other[2..].to_string(),
            other => return Err(EngineError::unsupported(format!("command-line option {other}"))),
        };
        let (name, value) = assignment
            .split_once('=')
            .ok_or_else(|| EngineError::InvalidParameterValue(format!("invalid option \"{assignment}\"")))?;
        session.settings.set(&name.replace('-', "_"), Some(value))?;
    }
    Ok(())
}

/// What a statement's rows are encoded as, fixed by `start`.
enum Encoding {
    Rows(Vec<Format>),
    Copy(CopyFormat),
}

/// The sink of one statement: encodes on the engine's workers, sends through the channel.
struct WireSink {
    sender: mpsc::Sender<Vec<u8>>,
    /// Send RowDescription (simple query; the extended protocol sends it on Describe).
    describe: bool,
    result_formats: Vec<i16>,
    encoding: OnceLock<Encoding>,
}

impl WireSink {
    fn send(&self, bytes: Vec<u8>) -> crate::error::Result<()> {
        self.sender
            .blocking_send(bytes)
            .map_err(|_| EngineError::QueryCanceled("canceling statement: the client disconnected".into()))
    }

    fn encode_batch(&self, batch: &Batch) -> crate::error::Result<Vec<u8>> {
        let mut out = Vec::new();
        match self.encoding.get() {
            Some(Encoding::Rows(formats)) => encode::data_rows(&mut out, batch, formats),
            Some(Encoding::Copy(format)) => {
                crate::copy::encode_rows(batch, format, |line| encode::copy_data(&mut out, line))
            }
            None => return Err(EngineError::Runtime("rows before the result's shape".into())),
        }
        Ok(out)
    }
}

impl ResultSink for WireSink {
    fn start(&self, shape: ResultShape<'_>) -> crate::error::Result<()> {
        let mut out = Vec::new();
        let encoding = match shape {
            ResultShape::Rows { names, types } => {
                let formats = Format::expand(&self.result_formats, names.len())?;
                if self.describe {
                    encode::row_description(&mut out, names, types, &formats);
                }
                Encoding::Rows(formats)
            }
            ResultShape::CopyOut { names, format } => {
                encode::copy_response(&mut out, b'H', names.len());
                if format.header {
                    encode::copy_data(&mut out, &crate::copy::header_line(names, format));
                }
                Encoding::Copy(format.clone())
            }
        };
        if self.encoding.set(encoding).is_err() {
            return Err(EngineError::Runtime("a statement described its result twice".into()));
        }
        if out.is_empty() {
            Ok(())
        } else {
            self.send(out)
        }
    }

    fn encode(&self, batch: Batch) -> crate::error::Result<Piece> {
        let rows = batch.rows;
        Ok(Piece::Encoded { bytes: self.encode_batch(&batch)?, rows })
    }

    fn emit(&self, piece: Piece) -> crate::error::Result<()> {
        match piece {
            Piece::Encoded { bytes, .. } => self.send(bytes),
            Piece::Rows(batch) => {
                let bytes = self.encode_batch(&batch)?;
                self.send(bytes)
            }
        }
    }
}
