//! A logged-in client: the state machine that links it to servers and relays bytes.
//!
//! ```text
//!            request bytes                       ReadyForQuery 'I', nothing outstanding
//!   Idle ───────────────────► Linked(server) ──────────────────────────────► Idle
//!    │  (transaction mode:      │  relay both ways, count requests         (server back to pool)
//!    │   acquire from pool)     │
//!    └── Terminate / EOF ──►  Done ◄── Terminate / EOF / error (server reset or closed)
//! ```
//! In session mode the client is linked from login to disconnect.
//!
//! The relay never decodes what it forwards: it walks message headers in the read buffer, forwards
//! everything read in one write, and inspects only the few small messages that change state
//! (ReadyForQuery, ParameterStatus, ErrorResponse, CopyInResponse, Terminate).

use std::future::pending;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bypass_wire::backend::build;
use bypass_wire::frame::{Header, Scanner, Step};
use bypass_wire::{BackendMessage, Severity, TransactionStatus, WireError, HEADER_LEN};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::buffer::Buffer;
use crate::cancel::{CancelRoute, Registration};
use crate::config::PoolMode;
use crate::error::{PoolerError, TimeoutKind};
use crate::io::read_some;
use crate::params::ParamSet;
use crate::pool::{Pool, Waiter};
use crate::relay::TransactionTracker;
use crate::server::ServerConn;
use crate::shared::Shared;

/// Bytes of a client's read buffer. Larger client messages stream through in pieces.
pub const CLIENT_BUFFER_BYTES: usize = 16 * 1024;

/// The client's socket, its read buffer and framing state, and a scratch buffer for replies.
pub struct ClientSide {
    pub stream: TcpStream,
    pub buffer: Buffer,
    pub scanner: Scanner,
    pub out: Vec<u8>,
}

impl ClientSide {
    pub fn new(stream: TcpStream) -> Self {
        ClientSide {
            stream,
            buffer: Buffer::with_capacity(CLIENT_BUFFER_BYTES),
            scanner: Scanner::new(),
            out: Vec::with_capacity(512),
        }
    }

    /// Writes and clears `out`.
    pub async fn flush(&mut self) -> Result<(), PoolerError> {
        if !self.out.is_empty() {
            self.stream.write_all(&self.out).await.map_err(PoolerError::ClientIo)?;
            self.out.clear();
        }
        Ok(())
    }

    /// Tells the client why it is being disconnected, if it can still be told.
    pub async fn send_fatal(&mut self, error: &PoolerError) {
        let Some((code, text)) = error.client_report() else { return };
        self.out.clear();
        build::error_with_code(&mut self.out, Severity::Fatal, &code, &text);
        let _ = self.flush().await;
    }
}

/// A client linked to a server.
struct Linked {
    server: Box<ServerConn>,
    tracker: TransactionTracker,
}

/// How relaying on a link stopped.
enum LinkEnd {
    /// The transaction ended: the server may go back to the pool.
    Released,
    /// The client sent Terminate or closed its socket.
    ClientGone,
}

/// A logged-in client.
pub struct Session {
    shared: Arc<Shared>,
    pool: Arc<Pool>,
    /// The runtime (core) this client runs on.
    shard: usize,
    wanted: ParamSet,
    waiter: Arc<Waiter>,
    cancel: Registration,
    linked: Option<Linked>,
    /// The server a session-mode client logged in with, linked when serving starts.
    first_server: Option<Box<ServerConn>>,
    sync_sql: String,
}

impl Session {
    pub fn new(
        shared: Arc<Shared>,
        pool: Arc<Pool>,
        shard: usize,
        wanted: ParamSet,
        waiter: Arc<Waiter>,
        cancel: Registration,
        server: Option<Box<ServerConn>>,
    ) -> Self {
        Session {
            shared,
            pool,
            shard,
            wanted,
            waiter,
            cancel,
            linked: None,
            first_server: server,
            sync_sql: String::new(),
        }
    }

    fn transaction_mode(&self) -> bool {
        self.pool.settings.mode == PoolMode::Transaction
    }

    /// Serves the client until it leaves; the server it holds is returned or closed on every path.
    pub async fn run(mut self, client: &mut ClientSide) -> Result<(), PoolerError> {
        self.pool.stats.clients.fetch_add(1, Ordering::Relaxed);
        let mut result = self.serve(client).await;
        self.pool.stats.clients.fetch_sub(1, Ordering::Relaxed);
        let clean_end = result.is_ok();
        if let Some(linked) = self.linked.take() {
            if result.is_err() && !client_can_be_told(&linked) {
                result = Err(PoolerError::ServerTerminated);
            }
            self.finish_server(linked, clean_end).await;
        }
        result
    }

    async fn serve(&mut self, client: &mut ClientSide) -> Result<(), PoolerError> {
        if let Some(server) = self.first_server.take() {
            self.link_with(server).await?;
        }
        loop {
            if self.linked.is_none() {
                if !self.wait_for_request(client).await? {
                    return Ok(());
                }
                let server = self.pool.acquire(self.shard, &self.waiter).await?;
                self.link_with(server).await?;
            }
            let limits = RelayLimits {
                message_size_max: self.pool.settings.message_size_max,
                idle_transaction_timeout_ms: self.shared.settings.idle_transaction_timeout_ms,
                transaction_mode: self.transaction_mode(),
                shard: self.shard,
            };
            let linked = self.linked.as_mut().expect("linked above");
            match relay(client, linked, &mut self.wanted, &self.pool, limits).await? {
                LinkEnd::Released => self.unlink(),
                LinkEnd::ClientGone => return Ok(()),
            }
        }
    }

    /// Idle in transaction mode: waits until the client sends a request. False when it left.
    async fn wait_for_request(&mut self, client: &mut ClientSide) -> Result<bool, PoolerError> {
        let timeout_ms = self.shared.settings.client_idle_timeout_ms;
        let deadline = (timeout_ms > 0).then(|| Instant::now() + Duration::from_millis(timeout_ms));
        loop {
            match next_request(client, self.shared.settings.message_size_max)? {
                Some(b'X') => return Ok(false),
                Some(_) => return Ok(true),
                None => {}
            }
            tokio::select! {
                read = read_some(&mut client.stream, &mut client.buffer) => {
                    if read.map_err(PoolerError::ClientIo)? == 0 {
                        return Ok(false);
                    }
                }
                _ = sleep_until(deadline) => return Err(PoolerError::Timeout(TimeoutKind::ClientIdle)),
            }
        }
    }

    /// Brings a server's parameters in line with the client's and links it.
    async fn link_with(&mut self, mut server: Box<ServerConn>) -> Result<(), PoolerError> {
        self.sync_sql.clear();
        if server.params.diff_into(&self.wanted, &mut self.sync_sql) > 0 {
            server.run_internal(&self.sync_sql, "parameter sync", self.pool.settings.message_size_max).await?;
        }
        self.attach(server);
        Ok(())
    }

    fn attach(&mut self, server: Box<ServerConn>) {
        let route = CancelRoute { address: self.pool.target.address, key: server.key };
        self.cancel.entry.set_route(Some(route));
        self.linked = Some(Linked { server, tracker: TransactionTracker::default() });
    }

    fn unlink(&mut self) {
        let linked = self.linked.take().expect("unlink without a link");
        self.cancel.entry.set_route(None);
        self.pool.release(linked.server);
    }

    /// The client is gone or failed: reuse its server only if it is idle and intact.
    async fn finish_server(&mut self, linked: Linked, clean_end: bool) {
        self.cancel.entry.set_route(None);
        let Linked { mut server, tracker } = linked;
        let reusable = clean_end && tracker.releasable() && server.buffer.is_empty() && server.scanner.at_boundary();
        if !reusable {
            return; // Dropping the server closes it; PostgreSQL rolls back whatever it held.
        }
        if !self.transaction_mode() && !self.pool.settings.reset_query.is_empty() {
            let settings = &self.pool.settings;
            if server
                .run_internal(&settings.reset_query, "server_reset_query", settings.message_size_max)
                .await
                .is_err()
            {
                return;
            }
        }
        self.pool.release(server);
    }
}

/// Peeks at the client's buffer: the tag of the first message if at least its start is there.
fn next_request(client: &ClientSide, message_size_max: u32) -> Result<Option<u8>, PoolerError> {
    let mut scanner = client.scanner.clone();
    match scanner.next(client.buffer.pending(), client.buffer.capacity(), message_size_max) {
        Ok(Step::Message(header) | Step::LargeStart { header, .. }) => Ok(Some(header.tag)),
        Ok(Step::Continuation { .. }) => Ok(Some(0)),
        Ok(Step::NeedMore) => Ok(None),
        Err(error) => Err(PoolerError::ClientProtocol(error)),
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline.into()).await,
        None => pending().await,
    }
}

/// What a wait on a link produced: bytes read from one side (0 = closed), or a timeout.
enum Ready {
    Client(usize),
    Server(usize),
    Timeout,
}

/// The bounds a relay works within.
#[derive(Debug, Clone, Copy)]
struct RelayLimits {
    message_size_max: u32,
    idle_transaction_timeout_ms: u64,
    transaction_mode: bool,
    shard: usize,
}

/// Relays between a client and its server until the link should end.
async fn relay(
    client: &mut ClientSide,
    linked: &mut Linked,
    wanted: &mut ParamSet,
    pool: &Pool,
    limits: RelayLimits,
) -> Result<LinkEnd, PoolerError> {
    let limit = limits.message_size_max;
    loop {
        if forward_client(client, linked, limit).await? {
            return Ok(LinkEnd::ClientGone);
        }
        if limits.transaction_mode && link_is_idle(client, linked) {
            return Ok(LinkEnd::Released);
        }
        let deadline = idle_deadline(linked, limits.idle_transaction_timeout_ms);
        // Both reads are cancel-safe: the one that loses the race has read nothing.
        let ready = tokio::select! {
            biased;
            read = read_some(&mut linked.server.stream, &mut linked.server.buffer) => {
                Ready::Server(read.map_err(PoolerError::ServerIo)?)
            }
            read = read_some(&mut client.stream, &mut client.buffer) => Ready::Client(read.map_err(PoolerError::ClientIo)?),
            _ = sleep_until(deadline) => Ready::Timeout,
        };
        match ready {
            Ready::Server(0) => return Err(PoolerError::ServerIo(std::io::ErrorKind::UnexpectedEof.into())),
            Ready::Server(_) => forward_server(client, linked, wanted, pool, limits).await?,
            Ready::Client(0) => return Ok(LinkEnd::ClientGone),
            Ready::Client(_) => {}
            Ready::Timeout => return Err(PoolerError::Timeout(TimeoutKind::IdleTransaction)),
        }
    }
}

/// An error may be reported unless the server already sent its own FATAL or the client is in the
/// middle of a message (an error inserted there would corrupt its stream).
fn client_can_be_told(linked: &Linked) -> bool {
    !linked.server.broken && linked.server.scanner.at_boundary()
}

fn link_is_idle(client: &ClientSide, linked: &Linked) -> bool {
    linked.tracker.releasable()
        && linked.server.buffer.is_empty()
        && linked.server.scanner.at_boundary()
        && client.scanner.at_boundary()
}

fn idle_deadline(linked: &Linked, timeout_ms: u64) -> Option<Instant> {
    (timeout_ms > 0 && linked.tracker.idle_in_transaction()).then(|| Instant::now() + Duration::from_millis(timeout_ms))
}

/// Messages a logged-in client may send.
fn valid_client_tag(tag: u8) -> bool {
    matches!(tag, b'B' | b'C' | b'd' | b'c' | b'f' | b'D' | b'E' | b'H' | b'F' | b'P' | b'Q' | b'S' | b'X')
}

fn check_client_message(header: Header) -> Result<(), PoolerError> {
    if !valid_client_tag(header.tag) {
        return Err(PoolerError::ClientProtocol(WireError::UnknownTag(header.tag as char)));
    }
    if header.tag == b'X' && header.length != 4 {
        return Err(PoolerError::ClientProtocol(WireError::BadLength { tag: 'X', length: i64::from(header.length) }));
    }
    Ok(())
}

/// Forwards every complete (or streaming) client message in the buffer to the server in one
/// write. True when the client sent Terminate, which is consumed and not forwarded.
async fn forward_client(client: &mut ClientSide, linked: &mut Linked, limit: u32) -> Result<bool, PoolerError> {
    let capacity = client.buffer.capacity();
    let pending = client.buffer.pending();
    let mut end = 0;
    let mut terminated = false;
    while end < pending.len() {
        match client.scanner.next(&pending[end..], capacity, limit).map_err(PoolerError::ClientProtocol)? {
            Step::Message(header) => {
                check_client_message(header)?;
                if header.tag == b'X' {
                    terminated = true;
                    break;
                }
                linked.tracker.client_message(header.tag);
                end += header.frame_len();
            }
            Step::LargeStart { header, chunk_len } => {
                check_client_message(header)?;
                linked.tracker.client_message(header.tag);
                end += chunk_len;
            }
            Step::Continuation { chunk_len, .. } => end += chunk_len,
            Step::NeedMore => break,
        }
    }
    if end > 0 {
        linked.server.stream.write_all(&pending[..end]).await.map_err(PoolerError::ServerIo)?;
        client.buffer.consume(end);
    }
    if terminated {
        client.buffer.consume(HEADER_LEN);
    }
    Ok(terminated)
}

/// Forwards every whole or streaming message the server has sent to the client in one write,
/// updating the link's state from the messages that change it.
async fn forward_server(
    client: &mut ClientSide,
    linked: &mut Linked,
    wanted: &mut ParamSet,
    pool: &Pool,
    limits: RelayLimits,
) -> Result<(), PoolerError> {
    let limit = limits.message_size_max;
    let server = &mut linked.server;
    let capacity = server.buffer.capacity();
    let pending = server.buffer.pending();
    let mut end = 0;
    while end < pending.len() {
        match server.scanner.next(&pending[end..], capacity, limit).map_err(PoolerError::ServerProtocol)? {
            Step::Message(header) => {
                let frame = &pending[end..end + header.frame_len()];
                let effect = inspect_server_message(
                    header,
                    &frame[HEADER_LEN..],
                    &mut linked.tracker,
                    wanted,
                    &mut server.params,
                )?;
                server.broken |= effect == Effect::Fatal;
                if effect == Effect::TransactionEnd {
                    pool.stats.count_transaction(limits.shard);
                }
                end += header.frame_len();
            }
            Step::LargeStart { header, chunk_len } => {
                linked.tracker.server_message(header.tag, None);
                end += chunk_len;
            }
            Step::Continuation { chunk_len, .. } => end += chunk_len,
            Step::NeedMore => break,
        }
    }
    if end > 0 {
        client.stream.write_all(&pending[..end]).await.map_err(PoolerError::ClientIo)?;
        server.buffer.consume(end);
    }
    Ok(())
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
        b'Z' => {
            let status = body.first().copied().and_then(TransactionStatus::from_byte);
            let status = status
                .ok_or(PoolerError::ServerProtocol(WireError::BadField { tag: 'Z', field: "transaction status" }))?;
            tracker.server_message(b'Z', Some(status));
            Ok(if status == TransactionStatus::Idle { Effect::TransactionEnd } else { Effect::None })
        }
        b'S' => {
            if let Ok(BackendMessage::ParameterStatus { name, value }) = BackendMessage::decode(b'S', body) {
                server_params.update(name, value);
                wanted.update(name, value);
            }
            Ok(Effect::None)
        }
        b'E' => match BackendMessage::decode(b'E', body) {
            Ok(BackendMessage::ErrorResponse(fields)) if fields.is_fatal() => Ok(Effect::Fatal),
            _ => Ok(Effect::None),
        },
        tag => {
            tracker.server_message(tag, None);
            Ok(Effect::None)
        }
    }
}
