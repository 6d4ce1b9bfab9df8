//! One worker thread: a share of the clients on one mio `Poll` (epoll, edge-triggered), each
//! client a small state machine.
//!
//! ```text
//!   Connecting ─writable─► LoggingIn(Login) ─Done─► Ready ─start─► Waiting ─'Z'─► Waiting …
//!                                                                      └─ phase Stop ─► Terminate
//! ```
//! Reads go into one scratch buffer per worker; only the bytes of a message not yet complete
//! stay with the client, so 10,000 idle clients hold almost nothing.

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bypass_wire::frame::read_header;
use bypass_wire::frontend::build;
use bypass_wire::login::{Login, LoginError, LoginRequest, LoginStep};
use bypass_wire::{BackendMessage, HEADER_LEN};
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};

use super::script::{CompiledScript, Random};
use super::tally::Tally;
use super::{LoadError, Phase, Shared};

/// How long a worker sleeps in epoll at most before it looks at the phase again.
const POLL_TIMEOUT: Duration = Duration::from_millis(10);
/// Readiness events taken per `poll`.
const EVENTS_CAPACITY: usize = 1_024;
/// Clients of one worker connecting or logging in at once (a burst of thousands of SYNs would
/// overflow the listener's backlog and wait for SYN retransmits).
const LOGINS_IN_FLIGHT_MAX: usize = 64;
/// Bytes read per `read` call.
const SCRATCH_BYTES: usize = 64 * 1024;
/// Capacity an idle client keeps for a partial message; a larger buffer is given back.
const PENDING_KEPT_BYTES: usize = 4 * 1024;
/// The largest message a client accepts; a bigger one is an error, not a bigger buffer.
pub const MESSAGE_BYTES_MAX: u32 = 1 << 20;

/// Where one client is.
enum Stage {
    Connecting,
    LoggingIn(Box<Login>),
    /// Logged in, waiting for the start of the run.
    Ready,
    /// A query is out since `sent_at`; `failed` once an ErrorResponse arrived for it.
    Waiting {
        sent_at: Instant,
        failed: bool,
    },
    /// Terminate sent (or nothing more to do); the socket closes when the client is dropped.
    Finished,
}

struct Client {
    stream: TcpStream,
    stage: Stage,
    /// Bytes of a message not yet complete.
    pending: Vec<u8>,
    out: Vec<u8>,
    out_sent: usize,
}

impl Client {
    /// Whether a non-blocking connect has completed; an error if it failed.
    fn connected(&mut self) -> Result<bool, LoadError> {
        if let Some(error) = self.stream.take_error().map_err(|e| LoadError::io("connecting", e))? {
            return Err(LoadError::io("connecting", error));
        }
        match self.stream.peer_addr() {
            Ok(_) => Ok(true),
            Err(error) if error.kind() == io::ErrorKind::NotConnected => Ok(false),
            Err(error) => Err(LoadError::io("connecting", error)),
        }
    }

    fn send(&mut self, bytes: &[u8]) -> Result<(), LoadError> {
        self.out.extend_from_slice(bytes);
        self.flush()
    }

    /// Writes what is queued until the socket would block; the rest goes on the next writable
    /// event.
    fn flush(&mut self) -> Result<(), LoadError> {
        while self.out_sent < self.out.len() {
            match self.stream.write(&self.out[self.out_sent..]) {
                Ok(0) => return Err(LoadError::Closed),
                Ok(count) => self.out_sent += count,
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => return Err(LoadError::io("sending to the server", error)),
            }
        }
        self.out.clear();
        self.out_sent = 0;
        Ok(())
    }

    /// Sends Terminate (best effort: the server may already be gone) and finishes.
    fn terminate(&mut self) {
        build::terminate(&mut self.out);
        let _ = self.flush();
        self.stage = Stage::Finished;
    }
}

/// What a worker is given.
pub(super) struct WorkerSpec {
    pub address: SocketAddr,
    pub clients: usize,
    pub login: LoginRequest,
    pub script: Arc<CompiledScript>,
    pub shared: Arc<Shared>,
    pub seed: u64,
    pub drain_timeout: Duration,
}

pub(super) struct Worker {
    spec: WorkerSpec,
    poll: Poll,
    /// Index = token; `None` before the client is opened and after it finished.
    clients: Vec<Option<Client>>,
    opened: usize,
    logging_in: usize,
    finished: usize,
    started: bool,
    ready_reported: bool,
    stop_deadline: Option<Instant>,
    random: Random,
    sql: String,
    scratch: Vec<u8>,
    tally: Tally,
}

impl Worker {
    pub fn new(spec: WorkerSpec) -> Result<Worker, LoadError> {
        let poll = Poll::new().map_err(|e| LoadError::io("creating an epoll instance", e))?;
        Ok(Worker {
            poll,
            clients: (0..spec.clients).map(|_| None).collect(),
            opened: 0,
            logging_in: 0,
            finished: 0,
            started: false,
            ready_reported: false,
            stop_deadline: None,
            random: Random::new(spec.seed),
            sql: String::with_capacity(256),
            scratch: vec![0; SCRATCH_BYTES],
            tally: Tally::new(),
            spec,
        })
    }

    /// Runs until the phase is Stop and every client finished (or the drain timeout passed).
    pub fn run(mut self) -> Tally {
        let mut events = Events::with_capacity(EVENTS_CAPACITY);
        while !self.done() {
            self.follow_phase();
            if let Err(error) = self.poll.poll(&mut events, Some(POLL_TIMEOUT)) {
                if error.kind() != io::ErrorKind::Interrupted {
                    self.tally.error(format!("epoll: {error}"));
                    break;
                }
            }
            for event in events.iter() {
                self.on_event(event.token().0, event.is_writable());
            }
        }
        self.close_unfinished();
        self.tally.cpu_total_ns = own_thread_cpu_ns();
        self.tally
    }

    fn done(&self) -> bool {
        match self.stop_deadline {
            Some(deadline) => self.finished == self.clients.len() || Instant::now() >= deadline,
            None => false,
        }
    }

    /// Opens clients, says when all are logged in, starts and stops them as the phase moves.
    fn follow_phase(&mut self) {
        self.open_clients();
        if !self.ready_reported && self.opened == self.clients.len() && self.logging_in == 0 {
            self.ready_reported = true;
            self.spec.shared.report_ready();
        }
        let phase = self.spec.shared.phase();
        if phase >= Phase::Warmup && !self.started {
            self.started = true;
            self.for_each_ready(Worker::send_query);
        }
        if phase == Phase::Stop && self.stop_deadline.is_none() {
            self.stop_deadline = Some(Instant::now() + self.spec.drain_timeout);
            self.finished += self.clients.len() - self.opened;
            self.opened = self.clients.len();
            self.for_each_ready(|_, client| {
                client.terminate();
                Ok(())
            });
            self.drop_logins();
        }
    }

    fn open_clients(&mut self) {
        while self.logging_in < LOGINS_IN_FLIGHT_MAX && self.opened < self.clients.len() && self.stop_deadline.is_none()
        {
            let index = self.opened;
            self.opened += 1;
            match self.open(index) {
                Ok(client) => {
                    self.clients[index] = Some(client);
                    self.logging_in += 1;
                }
                Err(error) => {
                    self.finished += 1;
                    self.tally.error(format!("client {index}: {error}"));
                }
            }
        }
    }

    fn open(&self, index: usize) -> Result<Client, LoadError> {
        let mut stream = TcpStream::connect(self.spec.address).map_err(|e| LoadError::io("connecting", e))?;
        let interest = Interest::READABLE | Interest::WRITABLE;
        self.poll
            .registry()
            .register(&mut stream, Token(index), interest)
            .map_err(|e| LoadError::io("epoll_ctl", e))?;
        Ok(Client { stream, stage: Stage::Connecting, pending: Vec::new(), out: Vec::new(), out_sent: 0 })
    }

    /// Applies `action` to every client in `Ready`.
    fn for_each_ready(&mut self, action: impl Fn(&mut Worker, &mut Client) -> Result<(), LoadError>) {
        for index in 0..self.clients.len() {
            let Some(mut client) = self.clients[index].take() else { continue };
            let outcome = match client.stage {
                Stage::Ready => action(self, &mut client),
                _ => Ok(()),
            };
            self.settle(index, client, outcome);
        }
    }

    /// Closes the clients still connecting or logging in when the run stops.
    fn drop_logins(&mut self) {
        for slot in &mut self.clients {
            if matches!(slot.as_ref().map(|client| &client.stage), Some(Stage::Connecting | Stage::LoggingIn(_))) {
                *slot = None;
                self.logging_in -= 1;
                self.finished += 1;
            }
        }
    }

    fn on_event(&mut self, index: usize, writable: bool) {
        let Some(mut client) = self.clients.get_mut(index).and_then(Option::take) else { return };
        let outcome = self.drive(&mut client, writable);
        self.settle(index, client, outcome);
    }

    /// Puts a client back, or drops it (closing its socket) when it finished or failed.
    fn settle(&mut self, index: usize, client: Client, outcome: Result<(), LoadError>) {
        let logging_in = matches!(client.stage, Stage::Connecting | Stage::LoggingIn(_));
        match outcome {
            Ok(()) if matches!(client.stage, Stage::Finished) => self.finished += 1,
            Ok(()) => self.clients[index] = Some(client),
            Err(error) => {
                self.logging_in -= usize::from(logging_in);
                self.finished += 1;
                self.tally.error(format!("client {index}: {error}"));
            }
        }
    }

    fn drive(&mut self, client: &mut Client, writable: bool) -> Result<(), LoadError> {
        if matches!(client.stage, Stage::Connecting) {
            if !client.connected()? {
                return Ok(());
            }
            client.stream.set_nodelay(true).map_err(|e| LoadError::io("TCP_NODELAY", e))?;
            let (login, startup) = Login::start(self.spec.login.clone());
            client.stage = Stage::LoggingIn(Box::new(login));
            client.send(&startup)?;
        } else if writable {
            client.flush()?;
        }
        self.read_all(client)
    }

    /// Reads until the socket would block (edge-triggered), handling every whole message.
    fn read_all(&mut self, client: &mut Client) -> Result<(), LoadError> {
        loop {
            let count = match client.stream.read(&mut self.scratch) {
                Ok(0) => return Err(LoadError::Closed),
                Ok(count) => count,
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                Err(error) => return Err(LoadError::io("reading from the server", error)),
            };
            client.pending.extend_from_slice(&self.scratch[..count]);
            self.handle_messages(client)?;
            if matches!(client.stage, Stage::Finished) {
                return Ok(());
            }
        }
    }

    fn handle_messages(&mut self, client: &mut Client) -> Result<(), LoadError> {
        let pending = std::mem::take(&mut client.pending);
        let mut consumed = 0;
        let outcome = loop {
            let rest = &pending[consumed..];
            let header = match read_header(rest, MESSAGE_BYTES_MAX) {
                Ok(Some(header)) if rest.len() >= header.frame_len() => header,
                Ok(_) => break Ok(()),
                Err(error) => break Err(LoadError::Wire(error)),
            };
            consumed += header.frame_len();
            let body = &rest[HEADER_LEN..header.frame_len()];
            if let Err(error) = self.on_message(client, header.tag, body) {
                break Err(error);
            }
            if matches!(client.stage, Stage::Finished) {
                break Ok(());
            }
        };
        client.pending = pending;
        client.pending.drain(..consumed);
        if client.pending.is_empty() && client.pending.capacity() > PENDING_KEPT_BYTES {
            client.pending = Vec::new();
        }
        outcome
    }

    fn on_message(&mut self, client: &mut Client, tag: u8, body: &[u8]) -> Result<(), LoadError> {
        if let Stage::LoggingIn(login) = &mut client.stage {
            let step = login.on_message(BackendMessage::decode(tag, body)?)?;
            return self.on_login_step(client, step);
        }
        let Stage::Waiting { sent_at, failed } = client.stage else {
            return match tag {
                b'E' => Err(server_error(tag, body)),
                _ => Ok(()),
            };
        };
        match tag {
            b'E' => {
                client.stage = Stage::Waiting { sent_at, failed: true };
                self.tally.failure(server_error(tag, body));
                Ok(())
            }
            b'Z' => {
                self.tally.complete(sent_at.elapsed(), failed, self.spec.shared.phase());
                self.next_transaction(client)
            }
            _ => Ok(()),
        }
    }

    fn on_login_step(&mut self, client: &mut Client, step: LoginStep) -> Result<(), LoadError> {
        match step {
            LoginStep::Send(bytes) => client.send(&bytes),
            LoginStep::Continue => Ok(()),
            LoginStep::Done(_) => {
                client.stage = Stage::Ready;
                self.logging_in -= 1;
                self.tally.connected += 1;
                match self.started {
                    true => self.next_transaction(client),
                    false => Ok(()),
                }
            }
        }
    }

    fn next_transaction(&mut self, client: &mut Client) -> Result<(), LoadError> {
        match self.spec.shared.phase() {
            Phase::Stop => {
                client.terminate();
                Ok(())
            }
            _ => self.send_query(client),
        }
    }

    fn send_query(&mut self, client: &mut Client) -> Result<(), LoadError> {
        self.spec.script.append_query(&mut self.random, &mut self.sql, &mut client.out);
        client.stage = Stage::Waiting { sent_at: Instant::now(), failed: false };
        client.flush()
    }

    /// Drops what is left after the drain timeout, counting clients whose answer never came.
    fn close_unfinished(&mut self) {
        for client in self.clients.iter_mut().filter_map(Option::take) {
            if matches!(client.stage, Stage::Waiting { .. }) {
                self.tally.unfinished += 1;
            }
        }
    }
}

/// An ErrorResponse as a typed error (a malformed one as the decoding error).
fn server_error(tag: u8, body: &[u8]) -> LoadError {
    match BackendMessage::decode(tag, body) {
        Ok(BackendMessage::ErrorResponse(fields)) => match bypass_wire::login::server_error(&fields) {
            LoginError::Server { code, message } => LoadError::Server { code, message },
            other => LoadError::Login(other),
        },
        Ok(_) => LoadError::Protocol("an ErrorResponse that is not one".into()),
        Err(error) => LoadError::Wire(error),
    }
}

/// This thread's CPU time (user + system) so far, in ns; 0 if the clock cannot be read.
fn own_thread_cpu_ns() -> u64 {
    let mut time = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec into `time`, a live local.
    let status = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut time) };
    match status {
        0 => super::timespec_ns(&time),
        _ => 0,
    }
}
