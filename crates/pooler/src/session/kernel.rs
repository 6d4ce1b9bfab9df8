//! A transaction-mode client whose traffic runs in the kernel fast path.
//!
//! User space sees the client's bytes only when the kernel closed its gate: no free server
//! (clients wait here, FIFO), a named prepared statement or Terminate, a message no client may
//! send (refused here at once), or bytes that arrived before user space re-armed. Then:
//! - **assign**: every whole message is one the kernel may forward → take a server, link it to
//!   the client in the kernel, write the request; the answer flows client-ward in the kernel;
//! - **serve**: otherwise the transaction runs in user space with the ordinary relay (a server
//!   the kernel had linked is taken back once every request on it is answered);
//! - **re-arm** when every passed byte is read and handled, so the paths never reorder bytes;
//!   in a pool where no client queued for a maintenance tick the socket is then parked (out of
//!   the shard's reactor, which every forwarded byte would wake) until the kernel announces a
//!   pass or the client hangs up.

use std::os::fd::RawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bypass_fastpath::{ClientSlot, FastPath, ServerSlot};
use bypass_wire::frame::{check_frontend_tag, read_header};
use bypass_wire::{WireError, HEADER_LEN};
use tokio::sync::Notify;

use super::{next_request, Session};
use crate::client::ClientSide;
use crate::error::{PoolerError, TimeoutKind};
use crate::io::{read_some, sleep_until};
use crate::kernel::KernelPool;
use crate::params::ParamSet;
use crate::relay::LinkEnd;
use crate::server::ServerConn;
use crate::session_state::might_change_state;
use crate::stream::Stream;

/// How often a client waits to see its kernel-linked requests answered before user space
/// takes the server back (rare: a named statement in the middle of a kernel transaction).
const ANSWER_POLL: Duration = Duration::from_millis(1);

/// A client socket in the kernel's maps; dropping it takes the socket out.
pub struct KernelClient {
    fast: Arc<FastPath>,
    slot: ClientSlot,
    /// The client buffer's committed count when the socket entered the maps.
    base: u64,
    /// Bytes at the front of the passed traffic that finish a message the kernel forwarded.
    raw_left: u32,
    /// The gate was open: the next passed bytes start a new episode (read `pass_skip`).
    armed: bool,
    /// Fires when the server the kernel linked this client to hangs up (see `reap_hung_up`).
    server_hung_up: Arc<Notify>,
    /// Fires, while the socket is parked, when the kernel passed bytes or the client hung up.
    passed: Arc<Notify>,
    /// The fast path watches this socket's hang-ups, so it may be parked.
    may_park: bool,
}

impl Drop for KernelClient {
    fn drop(&mut self) {
        self.fast.remove_client(self.slot);
    }
}

impl KernelClient {
    pub fn slot(&self) -> ClientSlot {
        self.slot
    }

    /// Puts a logged-in client under the client program; called before its final ReadyForQuery.
    pub fn enter(
        kernel: &KernelPool,
        client: &ClientSide,
        message_max: u32,
        wanted: &ParamSet,
    ) -> Option<KernelClient> {
        let Stream::Plain(tcp) = &client.stream else { return None };
        if !client.buffer.is_empty() {
            return None; // Bytes read ahead of login stay on the user-space path.
        }
        match kernel.fast.add_client(tcp, kernel.index, message_max, kernel.params_id(wanted)) {
            Ok(slot) => {
                let signals = kernel.watch(slot);
                let may_park = kernel
                    .fast
                    .watch_hangup(tcp, slot)
                    .map_err(|error| {
                        tracing::debug!(%error, "cannot watch the client's hang-ups: it is never parked");
                    })
                    .is_ok();
                Some(KernelClient {
                    fast: kernel.fast.clone(),
                    slot,
                    base: client.buffer.committed(),
                    raw_left: 0,
                    armed: true,
                    server_hung_up: signals.server_hung_up,
                    passed: signals.passed,
                    may_park,
                })
            }
            Err(error) => {
                tracing::debug!(%error, "client stays in user space");
                None
            }
        }
    }
}

/// What the front of a passed buffer holds.
enum Batch {
    /// Whole messages the kernel may forward: their length and the requests among them.
    Forward { bytes: usize, requests: u32 },
    /// Something only user space handles (or a message larger than the buffer).
    Serve,
    /// A message is still arriving.
    Incomplete,
    /// A message no logged-in client may send (an unknown type byte, a length below 4 or over
    /// `message_size_max`): refused at once with the relay's error, without waiting for a
    /// body (a StartupPacket sent again would otherwise be waited on for kilobytes).
    Refuse(WireError),
}

impl Session {
    pub(super) async fn serve_kernel(&mut self, client: &mut ClientSide) -> Result<(), PoolerError> {
        let result = self.kernel_loop(client).await;
        self.drop_kernel_link();
        result
    }

    async fn kernel_loop(&mut self, client: &mut ClientSide) -> Result<(), PoolerError> {
        loop {
            if client.buffer.is_empty() {
                if !self.rearm_or_read(client).await? {
                    return Ok(());
                }
                continue;
            }
            if self.forward_raw(client).await? {
                continue;
            }
            match classify(client.buffer.pending(), client.buffer.capacity(), self.limits.message_size_max) {
                Batch::Incomplete => {
                    if read_some(&mut client.stream, &mut client.buffer).await.map_err(PoolerError::ClientIo)? == 0 {
                        return Ok(());
                    }
                }
                Batch::Forward { bytes, requests } => self.forward(client, bytes, requests).await?,
                Batch::Refuse(error) => return Err(PoolerError::ClientProtocol(error)),
                Batch::Serve => {
                    if client.buffer.pending().first() == Some(&b'X') && self.kernel_link().is_none() {
                        return Ok(());
                    }
                    if self.serve_in_user_space(client).await? {
                        return Ok(());
                    }
                }
            }
        }
    }

    fn kernel_client(&mut self) -> &mut KernelClient {
        self.kernel.as_mut().expect("kernel session without a kernel client")
    }

    fn kernel_link(&self) -> Option<(ServerSlot, u32)> {
        let kernel = self.kernel.as_ref()?;
        kernel.fast.link(kernel.slot)
    }

    /// With nothing buffered: opens the gate when every passed byte was read, then waits for
    /// the next bytes the kernel passes. False when the client left.
    async fn rearm_or_read(&mut self, client: &mut ClientSide) -> Result<bool, PoolerError> {
        let read = client.buffer.committed() - self.kernel_client().base;
        self.publish_params();
        let park = self.should_park();
        let kernel = self.kernel_client();
        // Marked before the gate opens, so the pass that closes it is announced.
        kernel.fast.park_client(kernel.slot, park);
        if kernel.fast.rearm(kernel.slot, read) {
            kernel.armed = true;
            let parked = park && park_stream(&mut client.stream);
            let waited = self.wait_for_passed(client, parked).await;
            let kernel = self.kernel_client();
            kernel.fast.park_client(kernel.slot, false);
            return waited.map(|more| more || !client.buffer.is_empty());
        }
        kernel.fast.park_client(kernel.slot, false);
        let count = read_some(&mut client.stream, &mut client.buffer).await.map_err(PoolerError::ClientIo)?;
        Ok(count > 0)
    }

    /// Park the client's socket while its gate is open only in a pool where no client queued
    /// for a while ([`KernelPool::clients_may_park`]): then its requests find free servers in the
    /// kernel. In a busy pool most requests pass, and each would cost an unpark and a park.
    fn should_park(&self) -> bool {
        let (Some(kernel), Some(pool)) = (self.kernel.as_ref(), self.pool.kernel()) else { return false };
        kernel.may_park && pool.clients_may_park()
    }

    /// Parks the client while its gate is open (the pool turned quiet while it waited): marked
    /// first, then the gate checked, so a pass either found the mark (and is announced) or
    /// closed the gate before it (and the socket, still in its reactor, is read as usual).
    fn park_open_gate(&mut self, client: &mut ClientSide) -> bool {
        if !self.should_park() {
            return false;
        }
        let kernel = self.kernel_client();
        kernel.fast.park_client(kernel.slot, true);
        if kernel.fast.gate_open(kernel.slot) && park_stream(&mut client.stream) {
            return true;
        }
        kernel.fast.park_client(kernel.slot, false);
        false
    }

    /// With the gate open: waits for bytes the kernel passes (on the socket, or parked: on the
    /// ring's announcement; the next read puts the socket back in the reactor). Traffic the
    /// kernel forwards counts as activity for `client_idle_timeout`; a link held with every
    /// request answered is a transaction left open, subject to `idle_transaction_timeout`.
    async fn wait_for_passed(&mut self, client: &mut ClientSide, mut parked: bool) -> Result<bool, PoolerError> {
        let (idle_ms, open_ms) = (self.limits.client_idle_timeout_ms, self.limits.idle_transaction_timeout_ms);
        let shortest = [idle_ms, open_ms].into_iter().filter(|&ms| ms > 0).min();
        let tick = shortest.map(|ms| Duration::from_millis((ms / 4).max(1)));
        let hung_up = self.kernel_client().server_hung_up.clone();
        let passed = self.kernel_client().passed.clone();
        let pool = self.pool.clone();
        let park_allowed = pool.kernel().map(|kernel| kernel.park_allowed());
        let mut seen = self.kernel_activity();
        let mut quiet_since = Instant::now();
        loop {
            if let Some(tag) = next_request(client, self.limits.message_size_max)? {
                return Ok(tag != b'X'); // A request, or Terminate: the client is leaving.
            }
            tokio::select! {
                read = read_some(&mut client.stream, &mut client.buffer), if !parked => {
                    if read.map_err(PoolerError::ClientIo)? == 0 {
                        return Ok(false);
                    }
                }
                _ = passed.notified(), if parked => {
                    let kernel = self.kernel_client();
                    kernel.fast.park_client(kernel.slot, false);
                    parked = false;
                }
                _ = notified_or_never(park_allowed), if !parked => {
                    parked = self.park_open_gate(client);
                }
                _ = hung_up.notified() => return Err(PoolerError::ServerIo(std::io::ErrorKind::ConnectionReset.into())),
                _ = sleep_until(tick.map(|tick| Instant::now() + tick)) => {
                    let now = self.kernel_activity();
                    if now != seen {
                        (seen, quiet_since) = (now, Instant::now());
                    }
                    let quiet_ms = quiet_since.elapsed().as_millis() as u64;
                    match self.kernel_link() {
                        Some((_, 0)) if open_ms > 0 && quiet_ms >= open_ms => {
                            return Err(PoolerError::Timeout(TimeoutKind::IdleTransaction))
                        }
                        None if idle_ms > 0 && quiet_ms >= idle_ms => {
                            return Err(PoolerError::Timeout(TimeoutKind::ClientIdle))
                        }
                        _ => {}
                    }
                }
            }
        }
    }

    /// What changes whenever the kernel moves this client's traffic: its link word (requests,
    /// releases) and the bytes redirected to it.
    fn kernel_activity(&self) -> (u64, u64) {
        let Some(kernel) = self.kernel.as_ref() else { return (0, 0) };
        let slot = kernel.fast.client(kernel.slot);
        (slot.link.load(Ordering::Acquire), slot.redirected.load(Ordering::Acquire))
    }

    /// Tells the kernel which parameter values the client wants now (a SET served here may
    /// have changed them), so it links the client only to servers that have them.
    fn publish_params(&self) {
        let (Some(kernel), Some(pool)) = (self.kernel.as_ref(), self.pool.kernel()) else { return };
        kernel.fast.set_params(kernel.fast.client(kernel.slot), pool.params_id(&self.wanted));
    }

    /// At the start of a passed episode, bytes finishing a message the kernel forwarded go to
    /// that message's server unparsed. True when it forwarded something.
    async fn forward_raw(&mut self, client: &mut ClientSide) -> Result<bool, PoolerError> {
        let kernel = self.kernel_client();
        if kernel.armed {
            kernel.armed = false;
            kernel.raw_left = kernel.fast.pass_skip(kernel.slot);
        }
        if kernel.raw_left == 0 {
            return Ok(false);
        }
        let take = (kernel.raw_left as usize).min(client.buffer.pending().len());
        let (server, _) = kernel.fast.link(kernel.slot).ok_or(PoolerError::ServerTerminated)?;
        kernel.raw_left -= take as u32;
        let fd = self.server_fd(server).ok_or(PoolerError::ServerTerminated)?;
        send_all(fd, &client.buffer.pending()[..take]).await?;
        self.count_relayed_request(take);
        client.buffer.consume(take);
        Ok(true)
    }

    /// Sends whole kernel-safe messages: on the client's kernel link if it still holds, else on
    /// a server taken from the pool and linked in the kernel. A new link whose requests are one
    /// autocommit statement becomes one a client may queue behind in the kernel once written.
    async fn forward(&mut self, client: &mut ClientSide, bytes: usize, requests: u32) -> Result<(), PoolerError> {
        let kernel = self.kernel.as_ref().expect("kernel session");
        let (server, fresh) = match kernel.fast.add_requests(kernel.slot, requests) {
            Some(server) => (server, false),
            None => {
                self.wait_for_link_end().await?;
                (self.link_new_server(requests).await?, true)
            }
        };
        let fd = self.server_fd(server).ok_or(PoolerError::ServerTerminated)?;
        let batch = &client.buffer.pending()[..bytes];
        send_all(fd, batch).await?;
        let kernel = self.kernel.as_ref().expect("kernel session");
        if fresh && kernel.fast.queue_behind(server.pool()) && single_autocommit_statement(batch) {
            kernel.fast.make_queueable(kernel.slot, server, requests);
        }
        self.count_relayed_request(bytes);
        client.buffer.consume(bytes);
        Ok(())
    }

    /// A link a client queued behind takes no more requests: wait until the kernel ends it (at
    /// the ReadyForQuery of its last request, or when its server hangs up).
    async fn wait_for_link_end(&mut self) -> Result<(), PoolerError> {
        let hung_up = self.kernel_client().server_hung_up.clone();
        while self.kernel_link().is_some() {
            tokio::select! {
                _ = hung_up.notified() => return Err(PoolerError::ServerIo(std::io::ErrorKind::ConnectionReset.into())),
                _ = tokio::time::sleep(ANSWER_POLL) => {}
            }
        }
        Ok(())
    }

    /// Request bytes the kernel passed up and this path wrote to a server: they count as received
    /// here (the kernel counted them as passed, not forwarded).
    fn count_relayed_request(&self, bytes: usize) {
        self.pool.stats.shard(self.shard).bytes_received.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// A server from the pool, parameters in line with the client's, linked in the kernel with
    /// `requests` about to be written.
    async fn link_new_server(&mut self, requests: u32) -> Result<ServerSlot, PoolerError> {
        let mut server = self.acquire().await?;
        self.sync_params(&mut server).await?;
        let pool = self.pool.clone();
        let kernel_pool = pool.kernel().ok_or(PoolerError::ServerTerminated)?;
        let Some(slot) = kernel_pool.register(&mut server) else {
            pool.release(server);
            return Err(PoolerError::ServerTerminated);
        };
        let kernel = self.kernel.as_ref().expect("kernel session");
        // Owned by the pool's lent table before the kernel can release it.
        kernel_pool.keep_linked(server);
        kernel.fast.link_by_user(kernel.slot, slot, requests);
        Ok(slot)
    }

    fn server_fd(&self, server: ServerSlot) -> Option<RawFd> {
        self.pool.kernel()?.fd_of(server)
    }

    /// Runs one transaction in user space with the ordinary relay. True when the client left.
    async fn serve_in_user_space(&mut self, client: &mut ClientSide) -> Result<bool, PoolerError> {
        let server = match self.kernel_link() {
            Some(_) => self.take_back_answered().await?,
            None => {
                let mut server = self.acquire().await?;
                self.sync_params(&mut server).await?;
                server
            }
        };
        self.attach(server);
        match self.relay_once(client).await? {
            LinkEnd::Released => {
                self.unlink().await;
                Ok(false)
            }
            LinkEnd::ClientGone => Ok(true),
        }
    }

    /// Waits until every request the kernel forwarded is answered, then takes the server back.
    async fn take_back_answered(&mut self) -> Result<Box<ServerConn>, PoolerError> {
        loop {
            let kernel = self.kernel.as_ref().expect("kernel session");
            if let Some(slot) = kernel.fast.unlink_answered(kernel.slot) {
                let pool = self.pool.kernel().ok_or(PoolerError::ServerTerminated)?;
                let server = pool.take(slot).ok_or(PoolerError::ServerTerminated)?;
                return server.rehome(self.shard).map_err(PoolerError::ServerIo);
            }
            if kernel.fast.link(kernel.slot).is_none() {
                return self.acquire().await; // Released meanwhile: a fresh transaction.
            }
            tokio::time::sleep(ANSWER_POLL).await;
        }
    }

    /// The client is gone: a server still linked to it in the kernel is closed (PostgreSQL
    /// rolls back whatever it held), never reused.
    fn drop_kernel_link(&mut self) {
        let Some(kernel) = self.kernel.as_ref() else { return };
        if let Some(slot) = kernel.fast.unlink_now(kernel.slot) {
            if let Some(pool) = self.pool.kernel() {
                pool.fail_queued(slot);
                drop(pool.take(slot));
            }
        }
    }
}

/// Classifies the whole messages at the front of `pending`, which starts at a message
/// boundary (see [`Batch`]). A type byte is judged as soon as it arrives, its length as soon
/// as the header is whole, as the relay does; messages before one that stops the batch go
/// first.
fn classify(pending: &[u8], capacity: usize, message_size_max: u32) -> Batch {
    let (mut at, mut requests) = (0usize, 0u32);
    let batch_or = |at: usize, requests: u32, otherwise: Batch| {
        if at > 0 {
            Batch::Forward { bytes: at, requests }
        } else {
            otherwise
        }
    };
    while at < pending.len() {
        let rest = &pending[at..];
        let header = match check_frontend_tag(rest).and_then(|()| read_header(rest, message_size_max)) {
            Err(error) => return batch_or(at, requests, Batch::Refuse(error)),
            Ok(None) => break,
            Ok(Some(header)) => header,
        };
        if header.frame_len() > capacity {
            return batch_or(at, requests, Batch::Serve); // The relay streams it.
        }
        if header.frame_len() > rest.len() {
            break;
        }
        if !kernel_may_forward(header.tag, &rest[HEADER_LEN..header.frame_len()]) {
            return batch_or(at, requests, Batch::Serve);
        }
        requests += u32::from(matches!(header.tag, b'Q' | b'S' | b'F'));
        at += header.frame_len();
    }
    batch_or(at, requests, Batch::Incomplete)
}

/// The same rule as the client program: named statements and portals need the pooler's
/// statement bookkeeping, SQL that may change session state needs its guard and parameter
/// tracking, Terminate ends the session, unknown types get the relay's error.
fn kernel_may_forward(tag: u8, body: &[u8]) -> bool {
    let byte = |i: usize| body.get(i).copied().unwrap_or(0);
    let sql_is_stateless = |text: &[u8]| {
        let end = text.iter().position(|&b| b == 0).unwrap_or(text.len());
        !might_change_state(&text[..end])
    };
    match tag {
        b'Q' => sql_is_stateless(body),
        b'P' => byte(0) == 0 && sql_is_stateless(body.get(1..).unwrap_or_default()),
        b'B' => byte(0) == 0 && byte(1) == 0,
        b'D' | b'C' => !(byte(0) == b'S' && byte(1) != 0),
        b'E' | b'S' | b'H' | b'F' | b'd' | b'c' | b'f' => true,
        _ => false,
    }
}

/// One simple Query holding one statement that runs in autocommit and ends idle: it starts with
/// SELECT, INSERT, UPDATE, DELETE or VALUES (not BEGIN, COPY, CALL, ...) and has no ';' before
/// anything but blanks and ';'. A client may queue behind such a statement in the kernel.
fn single_autocommit_statement(batch: &[u8]) -> bool {
    const FIRST_WORDS: [&[u8]; 5] = [b"SELECT", b"INSERT", b"UPDATE", b"DELETE", b"VALUES"];
    if batch.len() < HEADER_LEN || batch[0] != b'Q' {
        return false;
    }
    let length = u32::from_be_bytes([batch[1], batch[2], batch[3], batch[4]]) as usize;
    if length + 1 != batch.len() {
        return false;
    }
    let body = &batch[HEADER_LEN..];
    let sql = &body[..body.iter().position(|&b| b == 0).unwrap_or(body.len())];
    let sql = sql.trim_ascii_start();
    let starts_well = FIRST_WORDS.iter().any(|word| {
        sql.len() > word.len()
            && sql[..word.len()].eq_ignore_ascii_case(word)
            && !sql[word.len()].is_ascii_alphanumeric()
    });
    let end = sql.iter().rposition(|&b| !(b == b';' || b.is_ascii_whitespace())).map_or(0, |last| last + 1);
    starts_well && !sql[..end].contains(&b';')
}

async fn notified_or_never(notify: Option<&Notify>) {
    match notify {
        Some(notify) => notify.notified().await,
        None => std::future::pending().await,
    }
}

/// Takes the client's socket out of its shard's reactor (see [`Stream::Parked`]). False if it
/// stays in (the reactor refused: then the socket is lost and the session's next read fails).
fn park_stream(stream: &mut Stream) -> bool {
    stream.park().map_err(|error| tracing::debug!(%error, "could not park a client socket")).is_ok()
}

/// Writes all of `bytes` to a server socket the kernel also writes to (through its redirect
/// queue). Requests are small; a full send buffer is waited out briefly.
async fn send_all(fd: RawFd, mut bytes: &[u8]) -> Result<(), PoolerError> {
    while !bytes.is_empty() {
        // SAFETY: `fd` is an open socket owned by a ServerConn in the pool's lent table, which
        // keeps it open while the client's link to it holds; `bytes` is a valid slice.
        let sent =
            unsafe { libc::send(fd, bytes.as_ptr().cast(), bytes.len(), libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
        if sent >= 0 {
            bytes = &bytes[sent as usize..];
            continue;
        }
        let error = std::io::Error::last_os_error();
        if error.kind() != std::io::ErrorKind::WouldBlock {
            return Err(PoolerError::ServerIo(error));
        }
        tokio::time::sleep(ANSWER_POLL).await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{classify, single_autocommit_statement, Batch};
    use bypass_wire::WireError;

    fn query(sql: &str) -> Vec<u8> {
        let mut message = Vec::new();
        bypass_wire::frontend::build::query(&mut message, sql);
        message
    }

    #[test]
    fn only_one_autocommit_statement_may_be_queued_behind() {
        for sql in
            ["SELECT 1;", "select * from t where k = 5", "  update t set a = 1 ;; ", "VALUES (1)", "delete from t"]
        {
            assert!(single_autocommit_statement(&query(sql)), "{sql}");
        }
        for sql in
            ["begin", "select 1; begin", "copy t from stdin", "call p()", "selectx 1", "-- x\nselect 1", "select"]
        {
            assert!(!single_autocommit_statement(&query(sql)), "{sql}");
        }
        let two = [query("select 1"), query("select 2")].concat();
        assert!(!single_autocommit_statement(&two), "two messages");
        assert!(!single_autocommit_statement(b"S\0\0\0\x04"), "a Sync");
    }

    #[test]
    fn a_message_no_client_may_send_is_refused_before_its_body_arrives() {
        let ssl_request = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];
        let refused = |pending: &[u8]| matches!(classify(pending, 16_384, 1_024), Batch::Refuse(_));
        assert!(refused(&ssl_request), "an SSLRequest again (type byte 0, taken for 2 KB)");
        assert!(refused(&ssl_request[..1]), "its type byte alone");
        assert!(matches!(classify(b"Q\0\0\x04\x01", 16_384, 1_024), Batch::Refuse(WireError::TooLarge { .. })));
        assert!(matches!(classify(b"Q\0\0\0\x03", 16_384, 1_024), Batch::Refuse(WireError::BadLength { .. })));
        let select = query("select 1");
        let mut pending = select.clone();
        pending.extend_from_slice(&ssl_request);
        let Batch::Forward { bytes, requests } = classify(&pending, 16_384, 1_024) else { panic!("forward first") };
        assert_eq!((bytes, requests), (select.len(), 1), "the query before it goes first");
        assert!(matches!(classify(&select[..7], 16_384, 1_024), Batch::Incomplete), "a query still arriving");
    }
}
