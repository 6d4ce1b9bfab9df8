//! One link's life after login: relay requests to PostgreSQL and answers back, and carry out the
//! hand-over conversation when the dispatcher asks for it.
//!
//! ```text
//!  Relay     : PostgreSQL answer ─► link
//!  OnDemand  : answer ─► link until the next message would pass `threshold`
//!              ─► HandOverAt{offset} ─► (hold the answer) ─► Socket ─► import ─► Imported
//!              ─► rest of the answer ─► client
//!  Direct    : (hold the answer) ─► Socket ─► import ─► Imported ─► Steered ─► answer ─► client
//!  (OnDemand, Direct) StaysHome instead of Socket: the client is closing ─► relay the answer
//!  Relay and OnDemand stand until the next Request frame (a hybrid's small requests carry
//!  none); Direct, and anything after a request's first answer, holds for that request only.
//!  hand-back : after ReadyForQuery: client acknowledged all? client's next request here (or
//!              handback_wait_ms passed)? ─► ReturnReady ─► Blocked{segments} ─► socket has
//!              received that many (bounded wait) ─► export, silent close
//!              ─► Returned{status, answer bytes, state}
//! ```

use std::os::fd::AsRawFd;
use std::time::Duration;

use bypass_wire::frame::{read_header, Scanner, Step};
use bypass_wire::tag;
use bypass_wire::{TransactionStatus, DEFAULT_MESSAGE_SIZE_MAX, HEADER_LEN};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::LINK_BUFFER_BYTES;
use crate::buffer::{closed, Buffer, BufferIo};
use crate::config::ValidAgentConfig;
use crate::error::{DispatchError, Result};
use crate::handover::{self, Settled, TcpState};
use crate::link::{Control, Delivery, CONTROL_FRAME_BYTES_MAX, CONTROL_TAG};

/// Answers past this many bytes are read from PostgreSQL in batches. The server sends 8 KB at a
/// time; waking for each piece (read, write, read again, wait) cost the agent about as much CPU
/// as the server spends producing it, and on a small host that CPU is what large answers lack.
const BATCH_AFTER_BYTES: u64 = 1 << 20;
/// Bytes PostgreSQL's socket holds before a batching agent wakes (SO_RCVLOWAT).
const BATCH_BYTES: usize = 64 * 1024;
/// How long a batching agent waits for a full batch before taking what is there: the tail of
/// an answer never fills one. Batching starts only once an answer is large, so this bounded
/// delay (a timer tick) costs a fraction of a percent of its transfer time.
const BATCH_WAIT: Duration = Duration::from_millis(1);

/// The state of one link.
pub struct LinkSession<'a> {
    config: &'a ValidAgentConfig,
    link: TcpStream,
    /// Bytes from the dispatcher.
    down: Buffer,
    down_scanner: Scanner,
    postgres: TcpStream,
    /// Bytes from PostgreSQL.
    up: Buffer,
    up_scanner: Scanner,
    /// How the current answer goes, and the size that starts an on-demand hand-over.
    delivery: Delivery,
    threshold: u64,
    /// What `delivery` and `threshold` return to once a request is answered (see
    /// [`Control::Request`]).
    standing: (Delivery, u64),
    /// Queries and Syncs forwarded to PostgreSQL and not yet answered by ReadyForQuery: a
    /// request with several answers hands over only in its first, as the dispatcher expects.
    open_requests: u32,
    /// Answer bytes of the current request written so far (to the link and to the client).
    answer_bytes: u64,
    /// The handed-over client connection while this agent owns it.
    client: Option<TcpStream>,
    /// Segments the client's socket had received when it was imported.
    client_segments_base: u32,
    /// A socket is on its way: PostgreSQL's answer waits in its socket until it arrives.
    awaiting_socket: bool,
    /// PostgreSQL's socket signals readiness only per [`BATCH_BYTES`] (a large answer streams).
    batching: bool,
    out: Vec<u8>,
}

impl<'a> LinkSession<'a> {
    pub fn new(config: &'a ValidAgentConfig, link: TcpStream, down: Buffer, postgres: TcpStream) -> Self {
        LinkSession {
            config,
            link,
            down,
            down_scanner: Scanner::new(),
            postgres,
            up: Buffer::with_capacity(LINK_BUFFER_BYTES),
            up_scanner: Scanner::new(),
            delivery: Delivery::Relay,
            threshold: u64::MAX,
            standing: (Delivery::Relay, u64::MAX),
            open_requests: 0,
            answer_bytes: 0,
            client: None,
            client_segments_base: 0,
            awaiting_socket: false,
            batching: false,
            out: Vec::with_capacity(256),
        }
    }

    /// Relays until either side closes.
    pub async fn run(mut self) -> Result<()> {
        // Bytes that arrived together with the startup packet.
        self.process_down().await?;
        loop {
            let take_answer = !self.awaiting_socket;
            let batch_wait = take_answer && self.batching;
            tokio::select! {
                ready = self.link.readable() => {
                    ready.map_err(|e| DispatchError::io("waiting on the link", e))?;
                    match self.down.try_read_from(&self.link).map_err(|e| DispatchError::io("reading the link", e))? {
                        Some(0) => return Ok(()),
                        Some(_) => self.process_down().await?,
                        None => {}
                    }
                }
                ready = self.postgres.readable(), if take_answer => {
                    ready.map_err(|e| DispatchError::io("waiting on PostgreSQL", e))?;
                    match self.up.try_read_from(&self.postgres).map_err(|e| DispatchError::io("reading PostgreSQL", e))? {
                        Some(0) => return Err(closed("PostgreSQL")),
                        Some(_) => self.process_up().await?,
                        None => {}
                    }
                }
                _ = tokio::time::sleep(BATCH_WAIT), if batch_wait => {
                    // No full batch in time: signal whatever is queued (the answer's tail);
                    // process_up batches again if the answer goes on.
                    self.set_batching(false)?;
                }
            }
        }
    }

    /// Switches batched reads from PostgreSQL on or off.
    fn set_batching(&mut self, on: bool) -> Result<()> {
        if self.batching != on {
            handover::set_receive_low_water(self.postgres.as_raw_fd(), if on { BATCH_BYTES } else { 1 })?;
            self.batching = on;
        }
        Ok(())
    }

    /// Forwards the dispatcher's PostgreSQL messages and acts on control frames.
    async fn process_down(&mut self) -> Result<()> {
        loop {
            let mut forward = 0;
            let mut control = false;
            loop {
                let pending = &self.down.pending()[forward..];
                // A control frame may be larger than the buffer (a connection with its queues):
                // spot it by its header and read it whole below, never pass it on in chunks.
                if self.down_scanner.at_boundary() {
                    if let Some(header) = read_header(pending, DEFAULT_MESSAGE_SIZE_MAX)? {
                        if header.tag == CONTROL_TAG {
                            control = true;
                            break;
                        }
                    }
                }
                match self.down_scanner.next(pending, self.down.capacity(), DEFAULT_MESSAGE_SIZE_MAX)? {
                    Step::Message(header) => {
                        self.open_requests +=
                            u32::from(matches!(header.tag, tag::frontend::QUERY | tag::frontend::SYNC));
                        forward += header.frame_len();
                    }
                    Step::LargeStart { header, chunk_len } => {
                        self.open_requests += u32::from(header.tag == tag::frontend::QUERY);
                        forward += chunk_len;
                    }
                    Step::Continuation { chunk_len, .. } => forward += chunk_len,
                    Step::NeedMore => break,
                }
            }
            if forward > 0 {
                self.postgres
                    .write_all(&self.down.pending()[..forward])
                    .await
                    .map_err(|e| DispatchError::io("writing to PostgreSQL", e))?;
                self.down.consume(forward);
            }
            if !control {
                return Ok(());
            }
            let (_, body) = self.down.read_frame(&mut self.link, "the dispatcher", CONTROL_FRAME_BYTES_MAX).await?;
            self.on_control(&body).await?;
            // Answer bytes may have been held while the socket was on its way: they go to the
            // client now, or to the link when the connection did not come (PostgreSQL may have
            // nothing more to send, so nothing else would wake this answer up).
            if !self.awaiting_socket && !self.up.is_empty() {
                self.process_up().await?;
            }
        }
    }

    async fn on_control(&mut self, body: &[u8]) -> Result<()> {
        match Control::decode(body)? {
            Control::Request { delivery, threshold } => {
                if delivery != Delivery::Direct {
                    self.standing = (delivery, threshold);
                }
                self.delivery = delivery;
                self.threshold = threshold;
                self.answer_bytes = 0;
                self.awaiting_socket = delivery == Delivery::Direct;
                Ok(())
            }
            Control::Socket(state) => self.take_socket(state).await,
            Control::StaysHome => {
                self.awaiting_socket = false;
                self.delivery = Delivery::Relay;
                Ok(())
            }
            other => Err(DispatchError::Protocol(format!("unexpected control frame from the dispatcher: {other:?}"))),
        }
    }

    /// Imports the client's connection; on failure the dispatcher takes it back and the
    /// answer is relayed.
    async fn take_socket(&mut self, state: &[u8]) -> Result<()> {
        self.awaiting_socket = false;
        let imported = TcpState::decode(state).and_then(|state| handover::import_tokio(&state));
        match imported {
            Ok(imported) => {
                self.client_segments_base = handover::segments_received(imported.stream.as_raw_fd())?;
                self.send_control(&Control::Imported).await?;
                self.wait_for("Steered", |control| (*control == Control::Steered).then_some(())).await?;
                self.client = Some(imported.finish().await?);
                Ok(())
            }
            Err(error) => {
                tracing::warn!(%error, "import failed; the answer will be relayed");
                self.delivery = Delivery::Relay;
                self.send_control(&Control::ImportFailed).await
            }
        }
    }

    async fn send_control(&mut self, control: &Control<'_>) -> Result<()> {
        self.out.clear();
        control.encode(&mut self.out);
        self.link.write_all(&self.out).await.map_err(|e| DispatchError::io("writing a control frame", e))
    }

    /// True when the dispatcher should take over before a message of `frame_len` bytes.
    fn hand_over_before(&self, tag: u8, frame_len: usize, forward: usize) -> bool {
        self.delivery == Delivery::OnDemand
            && self.client.is_none()
            && !matches!(
                tag,
                tag::backend::READY_FOR_QUERY | tag::backend::COMMAND_COMPLETE | tag::backend::ERROR_RESPONSE
            )
            && self.answer_bytes + (forward + frame_len) as u64 > self.threshold
    }

    /// Sends PostgreSQL's answer bytes on their way: to the link, or to the client once its
    /// connection is here; hands the connection back after ReadyForQuery.
    async fn process_up(&mut self) -> Result<()> {
        let mut forward = 0;
        let mut ready = None;
        let mut hand_over = false;
        while ready.is_none() {
            let pending = &self.up.pending()[forward..];
            if self.up_scanner.at_boundary() {
                if let Some(header) = read_header(pending, DEFAULT_MESSAGE_SIZE_MAX)? {
                    if self.hand_over_before(header.tag, header.frame_len(), forward) {
                        hand_over = true;
                        break;
                    }
                }
            }
            match self.up_scanner.next(pending, self.up.capacity(), DEFAULT_MESSAGE_SIZE_MAX)? {
                Step::Message(header) => {
                    if header.tag == tag::backend::READY_FOR_QUERY {
                        ready = TransactionStatus::from_byte(pending[HEADER_LEN]);
                    }
                    forward += header.frame_len();
                }
                Step::LargeStart { chunk_len, .. } | Step::Continuation { chunk_len, .. } => forward += chunk_len,
                Step::NeedMore => break,
            }
        }
        if forward > 0 {
            let bytes = &self.up.pending()[..forward];
            match self.client.as_mut() {
                Some(client) => {
                    client.write_all(bytes).await.map_err(|e| DispatchError::io("writing to the client", e))?
                }
                None => {
                    self.link.write_all(bytes).await.map_err(|e| DispatchError::io("writing to the dispatcher", e))?
                }
            }
            self.answer_bytes += forward as u64;
            self.up.consume(forward);
        }
        if ready.is_none() && self.answer_bytes >= BATCH_AFTER_BYTES {
            self.set_batching(true)?;
        }
        if hand_over {
            self.awaiting_socket = true;
            let offset = self.answer_bytes;
            return self.send_control(&Control::HandOverAt { offset }).await;
        }
        if let Some(status) = ready {
            // The next answer may be one byte: it must not wait for a batch.
            self.set_batching(false)?;
            if self.client.is_some() {
                self.hand_back(status).await?;
            }
            self.open_requests = self.open_requests.saturating_sub(1);
            match self.open_requests {
                0 => (self.delivery, self.threshold) = self.standing,
                _ => self.delivery = Delivery::Relay,
            }
            self.answer_bytes = 0;
        }
        Ok(())
    }

    /// Gives the client's connection back to the dispatcher (see the module diagram).
    async fn hand_back(&mut self, status: TransactionStatus) -> Result<()> {
        let client = self.client.take().expect("hand_back runs only while the agent owns the client");
        let drain_wait = Duration::from_millis(self.config.settings.drain_wait_ms);
        handover::wait_drained(client.as_raw_fd(), drain_wait).await;
        if handover::recv_queue_len(client.as_raw_fd()).unwrap_or(0) == 0 {
            // The client's next request, if it comes soon, is safest inside the connection.
            let wait = Duration::from_millis(self.config.settings.handback_wait_ms);
            let _ = tokio::time::timeout(wait, client.readable()).await;
        }
        if client_is_leaving(&client).await {
            // A closing connection cannot move: finish the goodbye here, then tell the dispatcher.
            close_gracefully(client).await;
            let answer_bytes = self.answer_bytes;
            return self.send_control(&Control::Returned { status, answer_bytes, state: &[] }).await;
        }
        self.send_control(&Control::ReturnReady).await?;
        let segments = self
            .wait_for("Blocked", |control| match control {
                Control::Blocked { segments } => Some(*segments),
                _ => None,
            })
            .await?;
        let settle_wait = Duration::from_millis(self.config.settings.settle_wait_ms);
        let base = self.client_segments_base;
        match handover::wait_settled(client.as_raw_fd(), base, || Ok(segments), settle_wait).await {
            Settled::AtOnce => {}
            Settled::AfterWaiting => tracing::debug!(segments, "segments were still on their way after the block"),
            Settled::GaveUp => {
                let received = handover::segments_received(client.as_raw_fd()).map(|n| n.wrapping_sub(base));
                tracing::warn!(segments, ?received, "gave up waiting for segments on their way after the block");
            }
        }
        if handover::tcp_state(client.as_raw_fd()).ok() == Some(handover::TCP_STATE_CLOSE_WAIT) {
            return self.close_after_block(client, status).await;
        }
        // Closed still in repair mode: neither FIN nor RST reaches the client.
        let state = handover::export_tokio(client);
        let mut encoded = Vec::new();
        if let Ok(state) = &state {
            state.encode(&mut encoded);
        }
        let answer_bytes = self.answer_bytes;
        self.send_control(&Control::Returned { status, answer_bytes, state: &encoded }).await?;
        state.map(|_| ())
    }

    /// The client closed its side after `client_is_leaving` looked and before the block (its FIN
    /// is among the settled segments): a closing connection cannot be exported. Tell the
    /// dispatcher (stateless Returned), wait until the switch steers the flow here again, finish
    /// the goodbye, and confirm. Closing while blocked would send our FIN, drop the client's
    /// ACK at the switch, and let the retransmissions' ACKs reach the dispatcher, which resets.
    async fn close_after_block(&mut self, client: TcpStream, status: TransactionStatus) -> Result<()> {
        tracing::debug!("the client closed during the hand-back; closing here");
        let answer_bytes = self.answer_bytes;
        self.send_control(&Control::Returned { status, answer_bytes, state: &[] }).await?;
        self.wait_for("Steered", |control| matches!(control, Control::Steered).then_some(())).await?;
        close_gracefully(client).await;
        self.send_control(&Control::Returned { status, answer_bytes, state: &[] }).await
    }

    /// Reads the next frame from the dispatcher, which must be the control frame `expected`
    /// (a switch change) that `accept` takes apart.
    async fn wait_for<T>(&mut self, expected: &str, accept: impl Fn(&Control) -> Option<T>) -> Result<T> {
        let (tag, body) = self.down.read_frame(&mut self.link, "the dispatcher", CONTROL_FRAME_BYTES_MAX).await?;
        let control = (tag == CONTROL_TAG).then(|| Control::decode(&body));
        let accepted = match control {
            Some(Ok(ref control)) => accept(control),
            _ => None,
        };
        accepted.ok_or_else(|| DispatchError::Protocol(format!("expected {expected} from the dispatcher")))
    }
}

/// How long a client that sent Terminate gets to close its side before its connection moves
/// home anyway (Terminate and all).
const GOODBYE_WAIT: Duration = Duration::from_millis(100);
/// How long a graceful close may take before the socket is dropped regardless.
const CLOSE_WAIT_MAX: Duration = Duration::from_secs(1);

/// True when the client said Terminate and closed its side (the socket is in CLOSE_WAIT).
async fn client_is_leaving(client: &TcpStream) -> bool {
    let fd = client.as_raw_fd();
    let said_goodbye = handover::peek_first_byte(fd) == Some(tag::frontend::TERMINATE);
    let deadline = tokio::time::Instant::now() + if said_goodbye { GOODBYE_WAIT } else { Duration::ZERO };
    loop {
        if handover::tcp_state(fd).ok() == Some(handover::TCP_STATE_CLOSE_WAIT) {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Sends our FIN and waits (bounded) for the client's last ACK while the switch still steers
/// the flow here, so no segment of this connection ever reaches the dispatcher.
async fn close_gracefully(client: TcpStream) {
    let fd = client.as_raw_fd();
    // SAFETY: shutdown only acts on the descriptor `client` keeps open.
    unsafe { libc::shutdown(fd, libc::SHUT_WR) };
    let deadline = tokio::time::Instant::now() + CLOSE_WAIT_MAX;
    while handover::tcp_state(fd).ok() != Some(handover::TCP_STATE_CLOSE) && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}
