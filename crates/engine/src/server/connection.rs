//! One client connection: the front door logs it in, then the message loop runs.
//!
//! ```text
//!   loop: Query ─► one script task: parse, statements in order (implicit block when several)
//!         Parse/Bind/Describe/Execute/Close/Flush … Sync (an error skips to Sync)
//!   a task runs on a blocking thread (a statement thread with a large stack for long SQL,
//!   `depth`) with the session; everything it says comes back through a bounded channel as
//!   wire bytes, written here in order; meanwhile the socket is read: EOF stops the statement,
//!   and during COPY FROM STDIN the CopyData messages are handed to the task
//! ```
//!
//! The network thread never parses SQL nor holds a syntax tree: a deep tree needs a deep stack
//! to build and to drop, which only statement threads have. Prepared statements and portals
//! keep SQL text and are parsed again on the task that uses them.
//!
//! ```text
//!   Execute(portal, max_rows > 0) of a plain query:
//!     session task: bind (snapshot of the transaction) ─► session home at once
//!     portal thread: stream the plan ─► bounded channel ─► up to max_rows to the socket,
//!       then PortalSuspended; the thread waits on the full channel until the next Execute
//!   meanwhile other statements run with the session (several portals open, as PostgreSQL)
//! ```
//!
//! A portal's statement counts `statement_timeout` per Execute and is cancelable only while
//! one of its Executes runs (PostgreSQL ignores a CancelRequest while it waits for a command);
//! its errors are reported at its own Execute. Other portals under a row limit (DML …
//! RETURNING, SHOW, catalog queries) run to their end on their task and keep their rows,
//! charged to the statement's memory budget (53200 past `memory_limit`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use bypass_frontdoor::{Admission, CancelKey, Stream};
use bypass_wire::auth::Refusal;
use bypass_wire::frame::{check_frontend_tag, read_header};
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
use crate::engine::{ColumnType, Engine};
use crate::error::EngineError;
use crate::session::{DetachedQuery, Outcome, Session, Status};
use crate::stream::{Piece, ResultShape, ResultSink};
use crate::vector::Batch;

/// Messages (or encoded pieces of up to 2,048 rows) a task may have in flight to the socket.
const OUTPUT_PIECES_MAX: usize = 4;
/// COPY messages waiting for the loader.
const COPY_MESSAGES_MAX: usize = 16;
/// Portals of one connection streaming at once (each holds a thread); a further row-limited
/// query portal runs to its end and keeps its rows (charged to its memory budget).
const STREAMING_PORTALS_MAX: usize = 8;
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

/// What a task sends to the network side.
enum Outgoing {
    Bytes(Vec<u8>),
    /// CopyInResponse was sent: forward the client's COPY messages from now on.
    CopyIn,
}

/// A client's COPY message, forwarded to the task loading it.
enum CopyMessage {
    Data(Vec<u8>),
    Done,
    Fail(String),
    /// A CopyFail whose reason is not valid UTF-8 (22021, as PostgreSQL).
    Invalid(EngineError),
}

/// The channels of one running task, seen from the task.
struct TaskIo {
    output: mpsc::Sender<Outgoing>,
    copy: mpsc::Receiver<CopyMessage>,
    slot: Arc<CancelSlot>,
    shared: Arc<Shared>,
    /// Set by the network side when the client closed the (suspended) portal.
    closed: Arc<AtomicBool>,
    /// A portal's rows are kept here instead of sent (a non-query portal under a row limit):
    /// appended on the statement's threads, so charged to its memory budget.
    collect: Option<Arc<Mutex<Vec<u8>>>>,
}

impl TaskIo {
    fn send(&self, bytes: Vec<u8>) -> crate::error::Result<()> {
        self.output
            .blocking_send(Outgoing::Bytes(bytes))
            .map_err(|_| EngineError::QueryCanceled("canceling statement: the client disconnected".into()))
    }
}

/// How one extended-protocol statement ended.
#[derive(Debug)]
enum StatementEnd {
    Done(String),
    Failed(EngineError),
}

/// A prepared statement (extended protocol): text only, see the module docs.
struct Prepared {
    sql: String,
    empty: bool,
    declared: Vec<u32>,
    parameters: usize,
    /// Parameter types after inference (declared ones kept), computed once.
    inferred: Option<Vec<u32>>,
    /// A query (SELECT, VALUES, …): its portal streams under a row limit.
    query: bool,
}

/// Rows of a portal held in memory, waiting for the next Execute: the result of a non-query
/// portal under a row limit (DML … RETURNING runs to its end first, as in PostgreSQL).
struct PendingRows {
    bytes: Vec<u8>,
    offset: usize,
    end: StatementEnd,
}

/// A bound statement: its SQL with the parameters as literals (`None`: the empty query).
struct Portal {
    sql: Option<String>,
    result_formats: Vec<i16>,
    executed: bool,
    query: bool,
    pending: Option<PendingRows>,
}

/// What a session task hands back: the session, and the work's result (or its panic).
type SessionReturn<T> = (Session, std::thread::Result<T>);

/// A task on its thread, seen from the network side: a statement with the session
/// (`R` = [`SessionReturn`]) or a portal's stream without it (`R` = its [`StatementEnd`]).
struct Task<R> {
    receiver: mpsc::Receiver<Outgoing>,
    /// The task may still send output.
    open: bool,
    copy_sender: Option<mpsc::Sender<CopyMessage>>,
    copying: bool,
    done: tokio::sync::oneshot::Receiver<R>,
    finished: Option<R>,
    /// The client left: output is dropped, the statement was stopped.
    gone: bool,
    /// See [`TaskIo::closed`].
    closed: Arc<AtomicBool>,
}

impl<R> Task<R> {
    fn new(
        receiver: mpsc::Receiver<Outgoing>,
        copy_sender: Option<mpsc::Sender<CopyMessage>>,
        done: tokio::sync::oneshot::Receiver<R>,
        closed: Arc<AtomicBool>,
    ) -> Task<R> {
        Task { receiver, open: true, copy_sender, copying: false, done, finished: None, gone: false, closed }
    }
}

/// Where a task's output goes.
enum Drain<'a> {
    /// Everything to the socket as it comes.
    Socket,
    /// To the socket until the budget's rows are sent; the task then waits (bounded channel).
    Rows(&'a mut RowBudget),
    /// Dropped (a portal closed while suspended).
    Discard,
}

/// The rows one Execute may still send, and the encoded rows received but not sent yet.
struct RowBudget {
    left: usize,
    sent: usize,
    carry: Vec<u8>,
    carry_at: usize,
}

impl RowBudget {
    fn new(max_rows: usize) -> RowBudget {
        RowBudget { left: if max_rows == 0 { usize::MAX } else { max_rows }, sent: 0, carry: Vec::new(), carry_at: 0 }
    }

    /// A new Execute on the same portal: a new limit, the carried rows kept.
    fn renew(&mut self, max_rows: usize) {
        self.left = if max_rows == 0 { usize::MAX } else { max_rows };
        self.sent = 0;
    }

    /// Moves whole messages of the carry to `out` until `left` DataRows have moved.
    fn send_carried(&mut self, out: &mut Vec<u8>) {
        let start = self.carry_at;
        let (end, rows) = split_rows(&self.carry, start, self.left);
        out.extend_from_slice(&self.carry[start..end]);
        self.carry_at = end;
        self.left -= rows;
        self.sent += rows;
        if self.carry_at == self.carry.len() {
            self.carry.clear();
            self.carry_at = 0;
        }
    }
}

/// The end of the whole messages in `bytes[start..]` holding at most `rows_max` DataRows
/// (other messages pass uncounted), and the DataRows up to there.
fn split_rows(bytes: &[u8], start: usize, rows_max: usize) -> (usize, usize) {
    let (mut end, mut rows) = (start, 0);
    while end + 5 <= bytes.len() {
        let is_row = bytes[end] == b'D';
        if is_row && rows == rows_max {
            break;
        }
        let length = u32::from_be_bytes([bytes[end + 1], bytes[end + 2], bytes[end + 3], bytes[end + 4]]);
        end += 1 + length as usize;
        rows += usize::from(is_row);
    }
    (end.min(bytes.len()), rows)
}

/// PostgreSQL's tag after a row-limited Execute: a query's counts the rows of this Execute.
fn execute_tag(tag: &str, rows: usize) -> String {
    if tag.starts_with("SELECT ") {
        format!("SELECT {rows}")
    } else {
        tag.to_string()
    }
}

/// A query portal streaming on its own thread without the session (see the module docs):
/// suspended between its Executes, ended by a Close, a new unnamed Bind (for the unnamed
/// portal), the end of its transaction, or the client leaving.
struct PortalStream {
    task: Task<StatementEnd>,
    budget: RowBudget,
    control: Arc<QueryControl>,
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
    /// Open query portals by name, each streaming on its own thread.
    streams: HashMap<String, PortalStream>,
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
            streams: HashMap::new(),
        };
        let _ = connection.run().await;
        let _ = connection.flush().await;
        let _ = connection.close_streams().await;
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
    session.user.clone_from(&request.user);
    session.database.clone_from(&request.database);
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
        self.session.as_mut().expect("the session is home between tasks")
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

    fn message_size_max(&self) -> u32 {
        u32::try_from(self.shared.settings.message_size_max).unwrap_or(u32::MAX)
    }

    /// A whole message at the start of `input`, taken out of it.
    fn take_message(&mut self) -> Result<Option<(u8, Vec<u8>)>, String> {
        check_frontend_tag(&self.input).map_err(|error| format!("invalid message: {error}"))?;
        match read_header(&self.input, self.message_size_max()) {
            Err(error) => Err(format!("invalid message: {error}")),
            Ok(Some(header)) if self.input.len() >= header.frame_len() => {
                let body = self.input[bypass_wire::HEADER_LEN..header.frame_len()].to_vec();
                self.input.drain(..header.frame_len());
                Ok(Some((header.tag, body)))
            }
            Ok(_) => Ok(None),
        }
    }

    /// The next whole message (tag, body); EOF ends the connection.
    async fn read_message(&mut self) -> Result<(u8, Vec<u8>), End> {
        loop {
            match self.take_message() {
                Err(problem) => return Err(self.fatal("08P01", &problem).await),
                Ok(Some(message)) => return Ok(message),
                Ok(None) => match self.stream.read(&mut self.scratch).await {
                    Ok(0) | Err(_) => return Err(End::Closed),
                    Ok(read) => self.input.extend_from_slice(&self.scratch[..read]),
                },
            }
        }
    }

    async fn run(&mut self) -> Result<(), End> {
        loop {
            let complete =
                read_header(&self.input, u32::MAX).ok().flatten().is_some_and(|h| self.input.len() >= h.frame_len());
            if !complete {
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
        let session = self.session();
        let in_transaction = session.status() != Status::Idle;
        match session.settings.idle_in_transaction_session_timeout.filter(|_| in_transaction) {
            None => self.read_message().await,
            Some(limit) => match tokio::time::timeout(limit, self.read_message()).await {
                Ok(message) => message,
                Err(_) => Err(self.fatal("25P03", "terminating connection due to idle-in-transaction timeout").await),
            },
        }
    }

    async fn handle(&mut self, message: FrontendMessage<'_>) -> Result<(), End> {
        if matches!(&message, FrontendMessage::Bind(b) if b.portal.is_empty()) && !self.skip_until_sync {
            // Binding the unnamed portal again replaces it: its rest is not wanted.
            self.close_stream("").await?;
        }
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
            FrontendMessage::Describe { kind, name } => match protocol_name(name) {
                Ok(name) => self.describe(kind, &name).await,
                Err(error) => Err(error),
            },
            FrontendMessage::Execute { portal, max_rows } => match protocol_name(portal) {
                Ok(name) => self.execute(&name, usize::try_from(max_rows).unwrap_or(0)).await?,
                Err(error) => Err(error),
            },
            FrontendMessage::Close { kind, name } => match protocol_name(name) {
                Ok(name) => self.close(kind, &name).await,
                Err(error) => Err(error),
            },
            _ => unreachable!("handled above"),
        };
        if let Err(error) = outcome {
            self.extended_error(&error);
        }
        Ok(())
    }

    async fn close(&mut self, kind: DescribeKind, name: &str) -> Result<(), EngineError> {
        match kind {
            DescribeKind::Statement => {
                self.statements.remove(name);
            }
            DescribeKind::Portal => {
                self.close_stream(name).await.map_err(|_| EngineError::QueryCanceled("the client left".into()))?;
                self.portals.remove(name);
            }
        }
        encode::empty_message(&mut self.output, b'3');
        Ok(())
    }

    /// An error in the extended protocol: reported, the transaction fails, the rest of the
    /// batch is skipped until Sync.
    fn extended_error(&mut self, error: &EngineError) {
        encode::error(&mut self.output, error);
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
            if !self.session().in_explicit_transaction() {
                // The implicit transaction ends here, and its portals with it (before its commit).
                self.close_streams().await?;
            }
            if let Err(error) = self.with_session(|session, engine| session.end_implicit_block(engine)).await {
                encode::error(&mut self.output, &error);
            }
        }
        self.end_portals_outside_transactions().await?;
        let status = self.status_byte();
        encode::ready_for_query(&mut self.output, status);
        self.flush().await
    }

    /// Runs `f` with the session on a blocking thread (binding and committing are work).
    async fn with_session<T: Send + 'static>(
        &mut self,
        f: impl FnOnce(&mut Session, &Engine) -> T + Send + 'static,
    ) -> T {
        let mut session = self.session.take().expect("the session is home between tasks");
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
        match crate::error::utf8(sql) {
            Err(error) => encode::error(&mut self.output, &error),
            Ok(text) => {
                let text = text.to_string();
                self.run_task(move |session, engine, io| run_script(session, engine, io, &text)).await?;
                self.end_portals_outside_transactions().await?;
            }
        }
        let status = self.status_byte();
        encode::ready_for_query(&mut self.output, status);
        self.flush().await
    }

    /// Runs `work` on a blocking thread with the session, writing what it sends to the socket
    /// as it comes and feeding it COPY data; the socket is watched meanwhile, and a client
    /// that leaves stops the running statement.
    async fn run_task<T: Send + 'static>(
        &mut self,
        work: impl FnOnce(&mut Session, &Engine, &mut TaskIo) -> T + Send + 'static,
    ) -> Result<T, End> {
        let mut task = self.start_task(None, work);
        self.drive(&mut task, Drain::Socket).await;
        self.finish_task(task).await
    }

    /// Starts `work` on a blocking thread with the session (which stays there until
    /// `finish_task`); `collect` keeps the rows of its statements instead of sending them.
    fn start_task<T: Send + 'static>(
        &mut self,
        collect: Option<Arc<Mutex<Vec<u8>>>>,
        work: impl FnOnce(&mut Session, &Engine, &mut TaskIo) -> T + Send + 'static,
    ) -> Task<SessionReturn<T>> {
        let mut session = self.session.take().expect("the session is home between tasks");
        let (output, receiver) = mpsc::channel(OUTPUT_PIECES_MAX);
        let (copy_sender, copy) = mpsc::channel(COPY_MESSAGES_MAX);
        let closed = Arc::new(AtomicBool::new(false));
        let mut io = TaskIo {
            output,
            copy,
            slot: Arc::clone(&self.slot),
            shared: Arc::clone(&self.shared),
            closed: Arc::clone(&closed),
            collect,
        };
        let engine = Arc::clone(&self.engine);
        let (finished, done) = tokio::sync::oneshot::channel();
        tokio::task::spawn_blocking(move || {
            let result =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work(&mut session, &engine, &mut io)));
            if result.is_err() {
                // The statement's transaction cannot be trusted after a panic: roll it back.
                session.close(&engine);
            }
            drop(io);
            let _ = finished.send((session, result));
        });
        Task::new(receiver, Some(copy_sender), done, closed)
    }

    /// Starts a portal's stream on its own thread (not Tokio's blocking pool: a suspended
    /// portal may wait there for as long as its transaction lasts).
    fn start_stream(
        &mut self,
        query: DetachedQuery,
        control: Arc<QueryControl>,
        sql: String,
        formats: Vec<i16>,
    ) -> Result<PortalStream, EngineError> {
        let (output, receiver) = mpsc::channel(OUTPUT_PIECES_MAX);
        let closed = Arc::new(AtomicBool::new(false));
        let sink = WireSink::new(output, Arc::clone(&closed), false, formats, None);
        let (engine, shared, thread_control) =
            (Arc::clone(&self.engine), Arc::clone(&self.shared), Arc::clone(&control));
        let (finished, done) = tokio::sync::oneshot::channel();
        shared.running.fetch_add(1, Ordering::Relaxed);
        let started = std::thread::Builder::new().name("bypass-portal".into()).spawn(move || {
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                // The plan is dropped here too: a deep one needs the statement's stack.
                crate::depth::with_statement_stack(&sql, move || {
                    let tag = crate::control::enter(&thread_control, || query.stream(&engine, &sink));
                    drop((query, sink));
                    tag
                })
            }));
            shared.running.fetch_sub(1, Ordering::Relaxed);
            let end = match outcome {
                Ok(Ok(Ok(tag))) => StatementEnd::Done(tag),
                Ok(Ok(Err(error)) | Err(error)) => StatementEnd::Failed(error),
                Err(_) => StatementEnd::Failed(EngineError::Runtime("a portal's statement panicked".into())),
            };
            let _ = finished.send(end);
        });
        if let Err(error) = started {
            self.shared.running.fetch_sub(1, Ordering::Relaxed);
            return Err(EngineError::Runtime(format!("starting a portal thread: {error}")));
        }
        let task = Task::new(receiver, None, done, closed);
        Ok(PortalStream { task, budget: RowBudget::new(0), control })
    }

    /// Takes the session back from a task that `drive` saw finish.
    async fn finish_task<T>(&mut self, task: Task<SessionReturn<T>>) -> Result<T, End> {
        let (mut session, result) = task.finished.expect("drive returns unpaused once the task is done");
        self.slot.set(None);
        for deallocated in session.take_deallocations() {
            match deallocated {
                Some(name) => self.statements.remove(&name),
                None => {
                    self.statements.clear();
                    None
                }
            };
        }
        self.session = Some(session);
        match result {
            _ if task.gone => Err(End::Closed),
            Ok(value) => Ok(value),
            Err(_) => Err(self.fatal("XX000", "internal error: a statement failed unexpectedly").await),
        }
    }

    /// Pumps a task's output to `drain` until the task is done and its output read (false),
    /// or until a row budget is spent (true: paused, the task waits); reads the socket
    /// meanwhile.
    async fn drive<R>(&mut self, task: &mut Task<R>, mut drain: Drain<'_>) -> bool {
        enum Event<R> {
            Output(Option<Outgoing>),
            Finished(R),
            Read(std::io::Result<usize>),
        }
        loop {
            if let Drain::Rows(budget) = &drain {
                if budget.left == 0 {
                    return true;
                }
            }
            if task.finished.is_some() && !task.open {
                return false;
            }
            let room = !task.gone && self.input.len() < READ_AHEAD_BYTES_MAX;
            let event = tokio::select! {
                biased;
                output = task.receiver.recv(), if task.open => Event::Output(output),
                done = &mut task.done, if task.finished.is_none() => {
                    Event::Finished(done.expect("tasks catch their panics and always answer"))
                }
                read = self.stream.read(&mut self.scratch), if room => Event::Read(read),
            };
            let failed = match event {
                Event::Output(None) => {
                    task.open = false;
                    false
                }
                Event::Output(Some(_)) if task.gone => false,
                Event::Output(Some(Outgoing::CopyIn)) => {
                    task.copying = true;
                    self.flush().await.is_err() || !self.forward_copy(&mut task.copy_sender, &mut task.copying).await
                }
                Event::Output(Some(Outgoing::Bytes(bytes))) => match &mut drain {
                    Drain::Socket => {
                        self.output.extend_from_slice(&bytes);
                        self.flush().await.is_err()
                    }
                    Drain::Rows(budget) => {
                        budget.carry.extend_from_slice(&bytes);
                        budget.send_carried(&mut self.output);
                        self.flush().await.is_err()
                    }
                    Drain::Discard => false,
                },
                Event::Finished(value) => {
                    task.finished = Some(value);
                    false
                }
                Event::Read(Ok(0) | Err(_)) => true,
                Event::Read(Ok(read)) => {
                    // Pipelined messages wait for this task to end, COPY messages go to it.
                    self.input.extend_from_slice(&self.scratch[..read]);
                    task.copying && !self.forward_copy(&mut task.copy_sender, &mut task.copying).await
                }
            };
            if failed && !task.gone {
                task.gone = true;
                if let Some(control) = self.slot.current() {
                    control.stop(StopReason::ClientGone);
                }
                task.receiver.close();
                task.copy_sender = None;
            }
        }
    }

    /// Ends a portal's stream early (Close, a new unnamed Bind, the end of its transaction, the
    /// client leaving): its sink stops taking rows, the statement is stopped, its rest dropped.
    async fn close_stream(&mut self, name: &str) -> Result<(), End> {
        let Some(mut stream) = self.streams.remove(name) else { return Ok(()) };
        stream.task.closed.store(true, Ordering::Release);
        stream.task.receiver.close();
        stream.control.stop(StopReason::Canceled);
        self.drive(&mut stream.task, Drain::Discard).await;
        if stream.task.gone {
            return Err(End::Closed);
        }
        Ok(())
    }

    /// Closes every portal's stream, even after the client left (each waits for its thread).
    async fn close_streams(&mut self) -> Result<(), End> {
        let names: Vec<String> = self.streams.keys().cloned().collect();
        let mut outcome = Ok(());
        for name in names {
            if let Err(end) = self.close_stream(&name).await {
                outcome = Err(end);
            }
        }
        outcome
    }

    /// Portals live as long as their transaction: once the session is idle they end.
    async fn end_portals_outside_transactions(&mut self) -> Result<(), End> {
        if self.session().status() == Status::Idle {
            self.close_streams().await?;
            self.portals.clear();
        }
        Ok(())
    }

    /// Hands the buffered COPY messages to the task; stops copying at CopyDone, CopyFail or a
    /// message that does not belong to COPY (which stays for the message loop). False when the
    /// input is not a valid message stream.
    async fn forward_copy(&mut self, sender: &mut Option<mpsc::Sender<CopyMessage>>, copying: &mut bool) -> bool {
        while *copying {
            let (tag, body) = match self.take_message() {
                Err(problem) => {
                    encode::error_or_notice(&mut self.output, b'E', "FATAL", "08P01", &problem);
                    return false;
                }
                Ok(None) => return true,
                Ok(Some(message)) => message,
            };
            let message = match tag {
                b'd' => CopyMessage::Data(body),
                b'c' => CopyMessage::Done,
                b'f' => match crate::error::utf8(body.strip_suffix(&[0]).unwrap_or(&body)) {
                    Ok(reason) => CopyMessage::Fail(reason.to_string()),
                    Err(error) => CopyMessage::Invalid(error),
                },
                // Flush and Sync mean nothing during COPY FROM STDIN.
                b'H' | b'S' => continue,
                other => {
                    let mut frame = vec![other];
                    frame.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
                    frame.extend_from_slice(&body);
                    self.input.splice(0..0, frame);
                    CopyMessage::Fail(format!("unexpected message type 0x{other:02x} during COPY from stdin"))
                }
            };
            if !matches!(message, CopyMessage::Data(_)) {
                *copying = false;
            }
            // The task may have stopped reading (a bad row): later COPY messages are dropped.
            if let Some(channel) = sender.as_ref() {
                if channel.send(message).await.is_err() {
                    *sender = None;
                }
            }
        }
        true
    }

    async fn parse(&mut self, parse: &Parse<'_>) -> Result<(), EngineError> {
        let name = protocol_name(parse.name)?;
        if !name.is_empty() && self.statements.contains_key(&name) {
            return Err(EngineError::PreparedStatement(format!("prepared statement \"{name}\" already exists")));
        }
        let sql = crate::error::utf8(parse.query)?.to_string();
        let sentinels = params::with_sentinels(&sql);
        let (count, query) = self
            .with_session(move |session, _| {
                crate::depth::with_statement_stack(&sentinels, || {
                    let statements = session.parse(&sentinels)?;
                    Ok((statements.len(), matches!(statements.first(), Some(ast::Statement::Query(_)))))
                })?
            })
            .await?;
        if count > 1 {
            return Err(EngineError::Syntax("cannot insert multiple commands into a prepared statement".into()));
        }
        let parameters = params::placeholder_count(&sql);
        let declared: Vec<u32> = parse.param_types().collect();
        self.statements.insert(name, Prepared { sql, empty: count == 0, declared, parameters, inferred: None, query });
        encode::empty_message(&mut self.output, b'1');
        Ok(())
    }

    fn prepared(&self, name: &str) -> Result<&Prepared, EngineError> {
        self.statements
            .get(name)
            .ok_or_else(|| EngineError::PreparedStatement(format!("prepared statement \"{name}\" does not exist")))
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
        let inferred = if open && !prepared.empty {
            let sentinels = params::with_sentinels(&prepared.sql);
            self.with_session(move |session, engine| {
                crate::depth::with_statement_stack(&sentinels, || match session.parse(&sentinels) {
                    Ok(mut statements) => match statements.pop() {
                        Some(statement) => session.describe_parameters(engine, &statement).1,
                        None => Default::default(),
                    },
                    Err(_) => Default::default(),
                })
                .unwrap_or_default()
            })
            .await
        } else {
            Default::default()
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

    async fn bind(&mut self, bind: &Bind<'_>) -> Result<(), EngineError> {
        let portal_name = protocol_name(bind.portal)?;
        let statement_name = protocol_name(bind.statement)?;
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
        let (empty, sql, query) = (prepared.empty, prepared.sql.clone(), prepared.query);
        let types = self.parameter_types(&statement_name).await?;
        let formats: Vec<i16> = bind.param_formats.iter().collect();
        let sql = if empty { None } else { Some(params::substitute(&sql, &types, &formats, &values)?) };
        let result_formats = bind.result_formats.iter().collect();
        self.portals.insert(portal_name, Portal { sql, result_formats, executed: false, query, pending: None });
        encode::empty_message(&mut self.output, b'2');
        Ok(())
    }

    async fn describe(&mut self, kind: DescribeKind, name: &str) -> Result<(), EngineError> {
        let (sql, formats) = match kind {
            DescribeKind::Statement => {
                let types = self.parameter_types(name).await?;
                encode::parameter_description(&mut self.output, &types);
                let prepared = self.prepared(name)?;
                ((!prepared.empty).then(|| params::with_sentinels(&prepared.sql)), Vec::new())
            }
            DescribeKind::Portal => {
                let portal = self.portals.get(name).ok_or_else(|| EngineError::UnknownPortal(name.to_string()))?;
                (portal.sql.clone(), portal.result_formats.clone())
            }
        };
        let described = match sql {
            None => None,
            Some(sql) => {
                self.with_session(move |session, engine| {
                    crate::depth::with_statement_stack(&sql, || match session.parse(&sql)?.pop() {
                        Some(statement) => session.describe_with_origins(engine, &statement),
                        None => Ok(None),
                    })?
                })
                .await?
            }
        };
        match described {
            None => encode::empty_message(&mut self.output, b'n'),
            Some(((names, types), origins)) => {
                let formats = Format::expand(&formats, names.len())?;
                encode::row_description(&mut self.output, &names, &types, &origins, &formats);
            }
        }
        Ok(())
    }

    async fn execute(&mut self, name: &str, max_rows: usize) -> Result<Result<(), EngineError>, End> {
        if let Some(stream) = self.streams.remove(name) {
            return self.resume(name, stream, max_rows).await;
        }
        let Some(portal) = self.portals.get_mut(name) else {
            return Ok(Err(EngineError::UnknownPortal(name.to_string())));
        };
        if portal.pending.is_some() {
            return Ok(self.send_pending(name, max_rows));
        }
        let Some(sql) = portal.sql.clone() else {
            encode::empty_message(&mut self.output, b'I');
            return Ok(Ok(()));
        };
        if std::mem::replace(&mut portal.executed, true) {
            // A finished portal has no rows left (PostgreSQL answers the same way).
            encode::command_complete(&mut self.output, "SELECT 0");
            return Ok(Ok(()));
        }
        let (formats, query) = (portal.result_formats.clone(), portal.query);
        if !self.in_block {
            self.in_block = true;
            self.session().begin_implicit_block();
        }
        if max_rows == 0 {
            let end = self.run_task(move |session, engine, io| run_portal(session, engine, io, &sql, formats)).await?;
            self.drain_notices().await;
            return Ok(self.complete(end, None));
        }
        let stream = query && self.streams.len() < STREAMING_PORTALS_MAX;
        let collected = Arc::new(Mutex::new(Vec::new()));
        let mut task = self.start_task(Some(Arc::clone(&collected)), move |session, engine, io| {
            start_portal(session, engine, io, sql, formats, stream)
        });
        self.drive(&mut task, Drain::Socket).await;
        match self.finish_task(task).await? {
            PortalStart::Stream { query, control, sql, formats } => {
                match self.start_stream(query, control, sql, formats) {
                    Ok(stream) => self.resume(name, stream, max_rows).await,
                    Err(error) => Ok(Err(error)),
                }
            }
            PortalStart::Ended(end) => {
                self.drain_notices().await;
                if let StatementEnd::Failed(error) = end {
                    // It ran to its end before sending anything: PostgreSQL reports the error
                    // at once, with no rows.
                    return Ok(Err(error));
                }
                let bytes = std::mem::take(&mut *collected.lock().unwrap_or_else(|p| p.into_inner()));
                if let Some(portal) = self.portals.get_mut(name) {
                    portal.pending = Some(PendingRows { bytes, offset: 0, end });
                }
                Ok(self.send_pending(name, max_rows))
            }
        }
    }

    /// Sends up to `max_rows` more rows of a streaming portal as its statement produces them,
    /// then PortalSuspended (the statement waits, with no clock running) or its end.
    async fn resume(
        &mut self,
        name: &str,
        mut stream: PortalStream,
        max_rows: usize,
    ) -> Result<Result<(), EngineError>, End> {
        if self.session().status() == Status::Failed {
            // As PostgreSQL: nothing runs in a failed transaction; the portal ends with it.
            self.streams.insert(name.to_string(), stream);
            return Ok(Err(EngineError::InFailedTransaction));
        }
        // statement_timeout counts per Execute, and a CancelRequest reaches the statement
        // only while an Execute of it runs (PostgreSQL ignores one while it waits).
        let timeout = self.session().settings.statement_timeout;
        stream.control.restart_timeout(timeout);
        self.slot.set(Some(Arc::clone(&stream.control)));
        stream.budget.renew(max_rows);
        stream.budget.send_carried(&mut self.output);
        let paused = self.drive(&mut stream.task, Drain::Rows(&mut stream.budget)).await;
        self.slot.set(None);
        if stream.task.gone {
            return Err(End::Closed);
        }
        if paused {
            stream.control.restart_timeout(None);
            encode::empty_message(&mut self.output, b's');
            self.streams.insert(name.to_string(), stream);
            return Ok(Ok(()));
        }
        let sent = stream.budget.sent;
        let end = stream.task.finished.take().expect("drive returns unpaused once the task is done");
        Ok(self.complete(end, Some(sent)))
    }

    /// CommandComplete for a statement that ended well (with the rows of this Execute when it
    /// ran under a row limit), its error otherwise.
    fn complete(&mut self, end: StatementEnd, rows_sent: Option<usize>) -> Result<(), EngineError> {
        match end {
            StatementEnd::Done(tag) => {
                let tag = match rows_sent {
                    Some(rows) => execute_tag(&tag, rows),
                    None => tag,
                };
                encode::command_complete(&mut self.output, &tag);
                Ok(())
            }
            StatementEnd::Failed(error) => Err(error),
        }
    }

    async fn drain_notices(&mut self) {
        for notice in self.session().take_notices() {
            encode::error_or_notice(&mut self.output, b'N', notice.severity, notice.code, &notice.message);
        }
    }

    /// Sends up to `max_rows` rows of a portal's pending result (0 = all), then PortalSuspended
    /// (once `max_rows` rows went, as PostgreSQL, which does not look ahead) or the end.
    fn send_pending(&mut self, name: &str, max_rows: usize) -> Result<(), EngineError> {
        let Some(portal) = self.portals.get_mut(name) else { return Ok(()) };
        let Some(pending) = portal.pending.as_mut() else { return Ok(()) };
        let limit = if max_rows == 0 { usize::MAX } else { max_rows };
        let (end, rows) = split_rows(&pending.bytes, pending.offset, limit);
        self.output.extend_from_slice(&pending.bytes[pending.offset..end]);
        pending.offset = end;
        if rows == limit {
            encode::empty_message(&mut self.output, b's');
            return Ok(());
        }
        match portal.pending.take() {
            Some(pending) => self.complete(pending.end, Some(rows)),
            None => Ok(()),
        }
    }
}

/// A statement or portal name (or another protocol string) as text: PostgreSQL checks the
/// encoding of every string it reads from a message (22021).
fn protocol_name(bytes: &[u8]) -> Result<String, EngineError> {
    crate::error::utf8(bytes).map(str::to_string)
}

/// One Query message on its task: parse, then each statement in order (an implicit block when
/// there are several); every answer goes through `io`. Stops at the first error.
fn run_script(session: &mut Session, engine: &Engine, io: &mut TaskIo, sql: &str) {
    let outcome = crate::depth::with_statement_stack(sql, || script(session, engine, io, sql));
    if let Err(error) = outcome {
        let mut out = Vec::new();
        encode::error(&mut out, &error);
        let _ = io.send(out);
    }
}

fn script(session: &mut Session, engine: &Engine, io: &mut TaskIo, sql: &str) {
    let statements = match session.parse(sql) {
        Ok(statements) => statements,
        Err(error) => return send_error(io, &error),
    };
    if statements.is_empty() {
        let mut out = Vec::new();
        encode::empty_message(&mut out, b'I');
        let _ = io.send(out);
        return;
    }
    let block = statements.len() > 1;
    if block {
        session.begin_implicit_block();
    }
    for statement in &statements {
        let result = run_statement(session, engine, io, statement, true, Vec::new());
        let mut out = Vec::new();
        notices(session, &mut out);
        let failed = result.is_err();
        match result {
            Ok(tag) => encode::command_complete(&mut out, &tag),
            Err(error) => encode::error(&mut out, &error),
        }
        // PostgreSQL runs nothing after a failed statement of a Query message.
        if io.send(out).is_err() || failed {
            break;
        }
    }
    if block {
        if let Err(error) = session.end_implicit_block(engine) {
            send_error(io, &error);
        }
    }
}

fn send_error(io: &TaskIo, error: &EngineError) {
    let mut out = Vec::new();
    encode::error(&mut out, error);
    let _ = io.send(out);
}

fn notices(session: &mut Session, out: &mut Vec<u8>) {
    for notice in session.take_notices() {
        encode::error_or_notice(out, b'N', notice.severity, notice.code, &notice.message);
    }
}

/// A portal's statement on its task (extended protocol: no RowDescription, the portal's
/// result formats); CommandComplete is the caller's.
fn run_portal(session: &mut Session, engine: &Engine, io: &mut TaskIo, sql: &str, formats: Vec<i16>) -> StatementEnd {
    let outcome = crate::depth::with_statement_stack(sql, || {
        let statement = session.parse(sql)?.pop().ok_or_else(|| EngineError::Syntax("empty portal".into()))?;
        run_statement(session, engine, io, &statement, false, formats)
    });
    match outcome.and_then(|inner| inner) {
        Ok(tag) => StatementEnd::Done(tag),
        Err(error) => StatementEnd::Failed(error),
    }
}

/// How a row-limited portal's first Execute starts on its task.
enum PortalStart {
    /// A plain query, bound: it streams on its own thread, without the session.
    Stream { query: DetachedQuery, control: Arc<QueryControl>, sql: String, formats: Vec<i16> },
    /// Anything else ran to its end; its rows were collected (see [`TaskIo::collect`]).
    Ended(StatementEnd),
}

fn start_portal(
    session: &mut Session,
    engine: &Engine,
    io: &mut TaskIo,
    sql: String,
    formats: Vec<i16>,
    stream: bool,
) -> PortalStart {
    if stream {
        let control = session.new_control();
        let bound = crate::depth::with_statement_stack(&sql, || {
            let statement = session.parse(&sql)?.pop().ok_or_else(|| EngineError::Syntax("empty portal".into()))?;
            crate::control::enter(&control, || session.bind_detached(engine, &statement))
        });
        match bound.and_then(|inner| inner) {
            Ok(Some(query)) => return PortalStart::Stream { query, control, sql, formats },
            Ok(None) => {}
            Err(error) => return PortalStart::Ended(StatementEnd::Failed(error)),
        }
    }
    PortalStart::Ended(run_portal(session, engine, io, &sql, formats))
}

/// One statement under its own control (cancel slot, timeout, memory budget), including the
/// data phase of COPY FROM STDIN.
fn run_statement(
    session: &mut Session,
    engine: &Engine,
    io: &mut TaskIo,
    statement: &ast::Statement,
    describe: bool,
    result_formats: Vec<i16>,
) -> crate::error::Result<String> {
    let control = session.new_control();
    io.slot.set(Some(Arc::clone(&control)));
    // Counted once a CancelRequest can reach it (tests wait for this).
    io.shared.running.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let sink = WireSink::new(io.output.clone(), Arc::clone(&io.closed), describe, result_formats, io.collect.clone());
    let outcome = crate::control::enter(&control, || session.execute(engine, statement, &sink));
    drop(sink);
    let outcome = match outcome {
        Ok(Outcome::Done(tag)) => Ok(tag),
        Ok(Outcome::CopyIn(copy)) => crate::control::enter(&control, || copy_in(session, engine, io, copy)),
        Err(error) => Err(error),
    };
    io.slot.set(None);
    io.shared.running.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    outcome
}

/// COPY FROM STDIN on the task: CopyInResponse, then the client's COPY messages as the
/// network side forwards them.
fn copy_in(
    session: &mut Session,
    engine: &Engine,
    io: &mut TaskIo,
    mut copy: Box<CopyIn>,
) -> crate::error::Result<String> {
    let mut out = Vec::new();
    encode::copy_response(&mut out, b'G', copy.columns());
    if io.send(out).is_err() || io.output.blocking_send(Outgoing::CopyIn).is_err() {
        return Err(session.copy_in_fail(engine, copy, "the client disconnected"));
    }
    let mut batch = Vec::new();
    loop {
        match io.copy.blocking_recv() {
            Some(CopyMessage::Data(data)) => {
                batch.extend_from_slice(&data);
                if batch.len() >= COPY_BATCH_BYTES {
                    session.copy_in_data(engine, &mut copy, &std::mem::take(&mut batch))?;
                }
            }
            Some(CopyMessage::Done) => {
                session.copy_in_data(engine, &mut copy, &batch)?;
                return session.copy_in_done(engine, copy);
            }
            Some(CopyMessage::Fail(reason)) => return Err(session.copy_in_fail(engine, copy, &reason)),
            Some(CopyMessage::Invalid(error)) => {
                session.copy_in_fail(engine, copy, "invalid CopyFail message");
                return Err(error);
            }
            None => return Err(session.copy_in_fail(engine, copy, "the client disconnected")),
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
    output: mpsc::Sender<Outgoing>,
    /// See [`TaskIo::closed`].
    closed: Arc<AtomicBool>,
    /// Send RowDescription (simple query; the extended protocol sends it on Describe).
    describe: bool,
    result_formats: Vec<i16>,
    encoding: OnceLock<Encoding>,
    /// See [`TaskIo::collect`].
    collect: Option<Arc<Mutex<Vec<u8>>>>,
}

impl WireSink {
    fn new(
        output: mpsc::Sender<Outgoing>,
        closed: Arc<AtomicBool>,
        describe: bool,
        result_formats: Vec<i16>,
        collect: Option<Arc<Mutex<Vec<u8>>>>,
    ) -> WireSink {
        WireSink { output, closed, describe, result_formats, encoding: OnceLock::new(), collect }
    }

    /// Sends bytes; `false` when the client closed the portal (the statement ends early).
    fn send(&self, bytes: Vec<u8>) -> crate::error::Result<bool> {
        if let Some(collect) = &self.collect {
            // On the statement's thread: the growing buffer counts against memory_limit.
            collect.lock().unwrap_or_else(|p| p.into_inner()).extend_from_slice(&bytes);
            crate::control::check()?;
            return Ok(true);
        }
        // The bytes go to the network thread, which frees them once written: bounded by the
        // channel, no longer the statement's.
        crate::control::hand_off(bytes.capacity());
        match self.output.blocking_send(Outgoing::Bytes(bytes)) {
            Ok(()) => Ok(true),
            Err(_) if self.closed.load(Ordering::Acquire) => Ok(false),
            Err(_) => Err(EngineError::QueryCanceled("canceling statement: the client disconnected".into())),
        }
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
            ResultShape::Rows { names, types, origins } => {
                let formats = Format::expand(&self.result_formats, names.len())?;
                if self.describe {
                    let column_types: Vec<ColumnType> = types.iter().map(|t| ColumnType::Engine(*t)).collect();
                    encode::row_description(&mut out, names, &column_types, origins, &formats);
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
            self.send(out).map(|_| ())
        }
    }

    fn values(
        &self,
        columns: &[(String, crate::pg_catalog::PgType)],
        rows: &[Vec<crate::pg_catalog::Datum>],
    ) -> crate::error::Result<()> {
        let formats = Format::expand(&self.result_formats, columns.len())?;
        let (names, types): (Vec<String>, Vec<crate::pg_catalog::PgType>) = columns.iter().cloned().unzip();
        let mut out = Vec::new();
        if self.describe {
            let column_types: Vec<ColumnType> = types.iter().map(|t| ColumnType::Catalog(*t)).collect();
            encode::row_description(&mut out, &names, &column_types, &[], &formats);
        }
        encode::catalog_rows(&mut out, &types, rows, &formats)?;
        self.send(out).map(|_| ())
    }

    fn encode(&self, batch: Batch) -> crate::error::Result<Piece> {
        let rows = batch.rows;
        Ok(Piece::Encoded { bytes: self.encode_batch(&batch)?, rows })
    }

    fn emit(&self, piece: Piece) -> crate::error::Result<bool> {
        match piece {
            Piece::Encoded { bytes, .. } => self.send(bytes),
            Piece::Rows(batch) => {
                let bytes = self.encode_batch(&batch)?;
                self.send(bytes)
            }
        }
    }
}
