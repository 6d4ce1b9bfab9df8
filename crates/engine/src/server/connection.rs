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

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

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
use crate::control::StopReason;
use crate::copy::{CopyFormat, CopyIn};
use crate::engine::{ColumnType, Description, Engine};
use crate::error::EngineError;
use crate::session::{Outcome, Session, Status};
use crate::stream::{Piece, ResultShape, ResultSink};
use crate::vector::Batch;

/// Messages (or encoded pieces of up to 2,048 rows) a task may have in flight to the socket.
const OUTPUT_PIECES_MAX: usize = 4;
/// COPY messages waiting for the loader.
const COPY_MESSAGES_MAX: usize = 16;
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
/// portal (DML … RETURNING runs to its end first, as in PostgreSQL), or the rest of a
/// suspended query portal when another statement needed the session.
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

/// A statement task on its blocking thread, seen from the network side.
struct Task<T> {
    receiver: mpsc::Receiver<Outgoing>,
    /// The task may still send output.
    open: bool,
    copy_sender: Option<mpsc::Sender<CopyMessage>>,
    copying: bool,
    handle: tokio::task::JoinHandle<(Session, std::thread::Result<T>)>,
    finished: Option<(Session, std::thread::Result<T>)>,
    /// The client left: output is dropped, the statement was stopped.
    gone: bool,
    /// See [`TaskIo::closed`].
    closed: Arc<AtomicBool>,
}

/// Where a task's output goes.
enum Drain<'a> {
    /// Everything to the socket as it comes.
    Socket,
    /// Everything into a buffer.
    Collect(&'a mut Vec<u8>),
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

    fn carried(&self) -> &[u8] {
        &self.carry[self.carry_at..]
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

/// A query portal whose Execute reached its row limit (PortalSuspended): its statement waits
/// on its blocking thread, holding the session, until the next Execute, a Close, the Sync of
/// an implicit transaction, or a message that needs the session (then the rest is collected).
struct Suspended {
    portal: String,
    task: Task<StatementEnd>,
    budget: RowBudget,
    /// Inside BEGIN … COMMIT: the portal outlives Sync.
    explicit: bool,
    idle_limit: Option<Duration>,
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
    suspended: Option<Suspended>,
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
            suspended: None,
        };
        let _ = connection.run().await;
        let _ = connection.flush().await;
        let _ = connection.close_suspended().await;
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
        let (idle_limit, in_transaction) = match (&self.session, &self.suspended) {
            (Some(session), _) => {
                (session.settings.idle_in_transaction_session_timeout, session.status() != Status::Idle)
            }
            (None, suspended) => (suspended.as_ref().and_then(|s| s.idle_limit), true),
        };
        match idle_limit.filter(|_| in_transaction) {
            None => self.read_message().await,
            Some(limit) => match tokio::time::timeout(limit, self.read_message()).await {
                Ok(message) => message,
                Err(_) => Err(self.fatal("25P03", "terminating connection due to idle-in-transaction timeout").await),
            },
        }
    }

    async fn handle(&mut self, message: FrontendMessage<'_>) -> Result<(), End> {
        if self.suspended.is_some() {
            let unnamed = self.suspended.as_ref().is_some_and(|s| s.portal.is_empty());
            if unnamed && matches!(&message, FrontendMessage::Bind(b) if b.portal.is_empty()) {
                // Binding the unnamed portal again replaces it: its rest is not wanted.
                self.close_suspended().await?;
            } else if self.needs_session(&message) {
                self.settle().await?;
            }
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

    /// Whether `message` needs the session home: everything but what a suspended portal
    /// allows in between (its own Execute, Close, Sync, Flush, Terminate, stray COPY data).
    fn needs_session(&self, message: &FrontendMessage<'_>) -> bool {
        match message {
            FrontendMessage::Execute { portal, .. } => {
                self.suspended.as_ref().is_none_or(|s| s.portal.as_bytes() != *portal)
            }
            // An invalid name fails the transaction, which needs the session.
            FrontendMessage::Close { name, .. } => protocol_name(name).is_err(),
            FrontendMessage::Sync
            | FrontendMessage::Flush
            | FrontendMessage::Terminate
            | FrontendMessage::CopyData(_)
            | FrontendMessage::CopyDone
            | FrontendMessage::CopyFail(_) => false,
            _ => !self.skip_until_sync,
        }
    }

    async fn close(&mut self, kind: DescribeKind, name: &str) -> Result<(), EngineError> {
        match kind {
            DescribeKind::Statement => {
                self.statements.remove(name);
            }
            DescribeKind::Portal => {
                if self.suspended.as_ref().is_some_and(|s| s.portal == name) {
                    self.close_suspended().await.map_err(|_| EngineError::QueryCanceled("the client left".into()))?;
                }
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
        if self.session.is_none() {
            // Away with a portal suspended inside BEGIN … COMMIT.
            return b'T';
        }
        match self.session().status() {
            Status::Idle => b'I',
            Status::InTransaction => b'T',
            Status::Failed => b'E',
        }
    }

    async fn sync(&mut self) -> Result<(), End> {
        self.skip_until_sync = false;
        match self.suspended.as_ref().map(|s| s.explicit) {
            Some(true) => {
                // The portal lives on; the implicit block ends at a Sync with the session home.
                encode::ready_for_query(&mut self.output, b'T');
                return self.flush().await;
            }
            // The implicit transaction ends here, and its portals with it.
            Some(false) => self.close_suspended().await?,
            None => {}
        }
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
        let mut task = self.start_task(work);
        self.drive(&mut task, Drain::Socket).await;
        self.finish_task(task).await
    }

    /// Starts `work` on a blocking thread with the session (which stays there until
    /// `finish_task`).
    fn start_task<T: Send + 'static>(
        &mut self,
        work: impl FnOnce(&mut Session, &Engine, &mut TaskIo) -> T + Send + 'static,
    ) -> Task<T> {
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
        };
        let engine = Arc::clone(&self.engine);
        let handle = tokio::task::spawn_blocking(move || {
            let result =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work(&mut session, &engine, &mut io)));
            if result.is_err() {
                // The statement's transaction cannot be trusted after a panic: roll it back.
                session.close(&engine);
            }
            drop(io);
            (session, result)
        });
        Task {
            receiver,
            open: true,
            copy_sender: Some(copy_sender),
            copying: false,
            handle,
            finished: None,
            gone: false,
            closed,
        }
    }

    /// Takes the session back from a task that `drive` saw finish.
    async fn finish_task<T>(&mut self, task: Task<T>) -> Result<T, End> {
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
    async fn drive<T: Send + 'static>(&mut self, task: &mut Task<T>, mut drain: Drain<'_>) -> bool {
        enum Event<T> {
            Output(Option<Outgoing>),
            Finished(T),
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
                joined = &mut task.handle, if task.finished.is_none() => {
                    Event::Finished(joined.expect("tasks catch their panics"))
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
                    Drain::Collect(buffer) => {
                        buffer.extend_from_slice(&bytes);
                        false
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

    /// A message needs the session while a portal is suspended: the rest of the portal's
    /// rows are collected into memory (as PostgreSQL's portals, it stays open; unlike them,
    /// its remaining rows are held, bounded by nothing but their size).
    async fn settle(&mut self) -> Result<(), End> {
        let Some(mut suspended) = self.suspended.take() else { return Ok(()) };
        let mut rest = suspended.budget.carried().to_vec();
        self.drive(&mut suspended.task, Drain::Collect(&mut rest)).await;
        let end = self.finish_task(suspended.task).await?;
        self.drain_notices().await;
        if let Some(portal) = self.portals.get_mut(&suspended.portal) {
            portal.pending = Some(PendingRows { bytes: rest, offset: 0, end });
        }
        Ok(())
    }

    /// Ends a suspended portal's statement early (Close, the Sync of an implicit transaction,
    /// the client leaving): its sink stops taking rows and the statement ends without error.
    async fn close_suspended(&mut self) -> Result<(), End> {
        let Some(mut suspended) = self.suspended.take() else { return Ok(()) };
        suspended.task.closed.store(true, Ordering::Release);
        suspended.task.receiver.close();
        self.drive(&mut suspended.task, Drain::Discard).await;
        self.finish_task(suspended.task).await?;
        self.drain_notices().await;
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
            .with_session(move |_, _| {
                crate::depth::with_statement_stack(&sentinels, || {
                    let statements = Engine::parse(&sentinels)?;
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
                crate::depth::with_statement_stack(&sentinels, || match Engine::parse(&sentinels) {
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
        let described: Option<Description> = match sql {
            None => None,
            Some(sql) => {
                self.with_session(move |session, engine| {
                    crate::depth::with_statement_stack(&sql, || match Engine::parse(&sql)?.pop() {
                        Some(statement) => session.describe(engine, &statement),
                        None => Ok(None),
                    })?
                })
                .await?
            }
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
        if self.suspended.as_ref().is_some_and(|s| s.portal == name) {
            let suspended = self.suspended.take().expect("checked");
            return self.resume(suspended, max_rows).await;
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
        let explicit = self.session().in_explicit_transaction();
        let idle_limit = self.session().settings.idle_in_transaction_session_timeout;
        let mut task = self.start_task(move |session, engine, io| run_portal(session, engine, io, &sql, formats));
        if max_rows > 0 && query {
            let suspended =
                Suspended { portal: name.to_string(), task, budget: RowBudget::new(max_rows), explicit, idle_limit };
            return self.resume(suspended, max_rows).await;
        }
        if max_rows == 0 {
            self.drive(&mut task, Drain::Socket).await;
            let end = self.finish_task(task).await?;
            self.drain_notices().await;
            return Ok(match end {
                StatementEnd::Done(tag) => {
                    encode::command_complete(&mut self.output, &tag);
                    Ok(())
                }
                StatementEnd::Failed(error) => Err(error),
            });
        }
        // DML … RETURNING under a row limit runs to its end first (as PostgreSQL's portals).
        let mut rows = Vec::new();
        self.drive(&mut task, Drain::Collect(&mut rows)).await;
        let end = self.finish_task(task).await?;
        self.drain_notices().await;
        if let Some(portal) = self.portals.get_mut(name) {
            portal.pending = Some(PendingRows { bytes: rows, offset: 0, end });
        }
        Ok(self.send_pending(name, max_rows))
    }

    /// Sends up to `max_rows` more rows of a query portal as its statement produces them, then
    /// PortalSuspended (the statement waits) or the statement's end.
    async fn resume(&mut self, mut suspended: Suspended, max_rows: usize) -> Result<Result<(), EngineError>, End> {
        suspended.budget.renew(max_rows);
        suspended.budget.send_carried(&mut self.output);
        if self.drive(&mut suspended.task, Drain::Rows(&mut suspended.budget)).await {
            encode::empty_message(&mut self.output, b's');
            self.in_block = true;
            self.suspended = Some(suspended);
            return Ok(Ok(()));
        }
        let sent = suspended.budget.sent;
        let end = self.finish_task(suspended.task).await?;
        self.drain_notices().await;
        Ok(match end {
            StatementEnd::Done(tag) => {
                encode::command_complete(&mut self.output, &execute_tag(&tag, sent));
                Ok(())
            }
            StatementEnd::Failed(error) => Err(error),
        })
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
        match portal.pending.take().map(|p| p.end) {
            Some(StatementEnd::Done(tag)) => {
                encode::command_complete(&mut self.output, &execute_tag(&tag, rows));
                Ok(())
            }
            Some(StatementEnd::Failed(error)) => Err(error),
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
    let statements = match Engine::parse(sql) {
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
        let statement = Engine::parse(sql)?.pop().ok_or_else(|| EngineError::Syntax("empty portal".into()))?;
        run_statement(session, engine, io, &statement, false, formats)
    });
    match outcome.and_then(|inner| inner) {
        Ok(tag) => StatementEnd::Done(tag),
        Err(error) => StatementEnd::Failed(error),
    }
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
    let sink = WireSink {
        output: io.output.clone(),
        closed: Arc::clone(&io.closed),
        describe,
        result_formats,
        encoding: OnceLock::new(),
    };
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
}

impl WireSink {
    /// Sends bytes; `false` when the client closed the portal (the statement ends early).
    fn send(&self, bytes: Vec<u8>) -> crate::error::Result<bool> {
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
            ResultShape::Rows { names, types } => {
                let formats = Format::expand(&self.result_formats, names.len())?;
                if self.describe {
                    let column_types: Vec<ColumnType> = types.iter().map(|t| ColumnType::Engine(*t)).collect();
                    encode::row_description(&mut out, names, &column_types, &formats);
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
            encode::row_description(&mut out, &names, &column_types, &formats);
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
