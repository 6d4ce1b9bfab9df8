//! Workload mirroring (`mirror = "<database>"`, Tigger's "replication"): every byte a client of a
//! mirrored database sends is also sent to a shadow server, on a session of its own, and the
//! shadow's replies are thrown away. The client's answers never wait on the shadow.
//!
//! ```text
//!  login ─► shadow login (mirror entry's backend, same user, ≤ mirror_connect_timeout_ms)
//!    │          │ fails: warn, count mirror_failures, serve the client unmirrored
//!    ▼          ▼
//!  kernel (fast_path = "kernel", IPv4 plaintext client and shadow): add_mirror before the
//!    client's ReadyForQuery; the tc program copies the client's raw stream into the shadow
//!    socket and drops its replies; a supervisor task cuts the shadow off if the copy broke
//!  user space (otherwise): ClientSide::read_some ─copy─► MirrorQueue (≤ MIRROR_QUEUE_BYTES)
//!    ─► feeder task ─► shadow socket; a reader task discards replies; a full queue or a stuck
//!    write cuts the shadow off (mirror_cut_offs), never the client
//! ```
//!
//! Invariants:
//! - a shadow receives a byte-exact prefix of its client's stream, or is closed: it is never fed
//!   a stream with a hole (the kernel cuts a desynced flow off, the queue cuts off instead of
//!   dropping bytes);
//! - the primary never blocks on a shadow: copying into the queue is a bounded memcpy, and
//!   every wait on the shadow (write, drain at exit) has a named bound;
//! - a user-space mirrored client never runs in the kernel fast path (its bytes would bypass
//!   the copy), and a kernel-mirrored client's shadow socket is never read or written while it
//!   is in the kernel's maps.
//!
//! At client exit the shadow is closed gracefully: FIN after everything queued, then its replies
//! are read until it closes (bounded by [`MIRROR_DRAIN_TIMEOUT`]), so a shadow that lags behind
//! still runs the client's last transactions instead of being reset mid-way.

use std::fmt::Write as _;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bypass_fastpath::{FastPath, MirrorHandle};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{oneshot, Notify};

use crate::stream::Stream;

/// Bytes a user-space mirrored client may be ahead of its shadow (not yet handed to the shadow's
/// socket); beyond that the shadow is cut off. Two buffers of this size per mirrored client are
/// reserved at login (pages are only touched as far as a burst reaches). It must exceed a single
/// client read ([`crate::buffer::CLIENT_BUFFER_BYTES`]).
pub const MIRROR_QUEUE_BYTES: usize = 256 * 1024;
const _: () = assert!(MIRROR_QUEUE_BYTES > 2 * crate::buffer::CLIENT_BUFFER_BYTES);

/// Longest a single write of queued bytes to a shadow may take before it is cut off.
pub const MIRROR_WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// After the client left: how long its shadow may take to finish what it was sent and close.
pub const MIRROR_DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
/// How often a kernel mirror is checked for a broken copy (a lost or reordered segment).
pub const KERNEL_MIRROR_CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// After the client left: time for its last segments' copies, still in the loopback backlog, to
/// reach the shadow before the flow leaves the kernel's maps.
const KERNEL_FLUSH_GRACE: Duration = Duration::from_millis(20);
/// Bytes of the stack buffer shadow replies are read into and discarded.
const REPLY_DISCARD_BYTES: usize = 8 * 1024;

/// Mirroring counters (all clients, all databases), exported in `/metrics`.
#[derive(Debug, Default)]
pub struct MirrorCounters {
    /// Clients being mirrored right now.
    pub active: AtomicU64,
    /// Clients mirrored by the kernel (tc copy), since start.
    pub kernel_clients: AtomicU64,
    /// Clients mirrored in user space, since start.
    pub user_clients: AtomicU64,
    /// Clients served unmirrored because their shadow could not be reached or logged in to.
    pub failures: AtomicU64,
    /// Shadows closed mid-session: fell behind, stuck, broke, or their kernel copy desynced.
    pub cut_offs: AtomicU64,
}

/// Process-wide mirroring state, in [`Shared`].
#[derive(Debug, Default)]
pub struct MirrorState {
    /// Whether the kernel mirrors (decided at the first mirrored login).
    kernel: OnceLock<bool>,
    pub counters: Arc<MirrorCounters>,
}

impl MirrorState {
    /// Loads the kernel mirroring programs once; false (logged once) when they cannot run there.
    pub fn kernel_ready(&self, fast: &FastPath, interface: &str) -> bool {
        *self.kernel.get_or_init(|| match fast.enable_mirroring(interface) {
            Ok(()) => {
                tracing::info!(interface, "workload mirroring runs in the kernel");
                true
            }
            Err(error) => {
                tracing::warn!(%error, interface, "kernel mirroring unavailable; mirroring in user space");
                false
            }
        })
    }

    /// True once kernel mirroring was enabled.
    pub fn in_kernel(&self) -> bool {
        self.kernel.get().copied().unwrap_or(false)
    }
}

/// A client's mirror; dropping it (when the client leaves) lets its shadow finish and close.
pub enum ClientMirror {
    Kernel(KernelMirror),
    User(UserMirror),
}

impl ClientMirror {
    /// Copies bytes just read from the client to its shadow (user-space mirrors only: the
    /// kernel copies on its own). Never waits.
    pub fn copy(&self, bytes: &[u8]) {
        if let ClientMirror::User(user) = self {
            user.queue.push(bytes);
        }
    }

    /// True for a mirror that needs every client byte to pass through user space.
    pub fn in_user_space(&self) -> bool {
        matches!(self, ClientMirror::User(_))
    }
}

/// Counts a mirrored client as active for as long as it lives.
struct ActiveClient(Arc<MirrorCounters>);

impl ActiveClient {
    fn new(counters: &Arc<MirrorCounters>, kernel: bool) -> Self {
        counters.active.fetch_add(1, Ordering::Relaxed);
        let total = if kernel { &counters.kernel_clients } else { &counters.user_clients };
        total.fetch_add(1, Ordering::Relaxed);
        ActiveClient(counters.clone())
    }
}

impl Drop for ActiveClient {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A client mirrored by the kernel. Its shadow socket belongs to a supervisor task; dropping
/// this tells the task the client left.
pub struct KernelMirror {
    _client_left: oneshot::Sender<()>,
    _active: ActiveClient,
}

impl KernelMirror {
    pub fn start(fast: Arc<FastPath>, handle: MirrorHandle, shadow: TcpStream, counters: &Arc<MirrorCounters>) -> Self {
        let (client_left, left) = oneshot::channel();
        tokio::spawn(supervise_kernel_mirror(fast, handle, shadow, counters.clone(), left));
        KernelMirror { _client_left: client_left, _active: ActiveClient::new(counters, true) }
    }
}

/// Watches a kernel mirror until the client leaves: a broken copy (the shadow missed bytes)
/// closes the shadow at once; at the end the flow leaves the maps and the shadow finishes.
async fn supervise_kernel_mirror(
    fast: Arc<FastPath>,
    handle: MirrorHandle,
    shadow: TcpStream,
    counters: Arc<MirrorCounters>,
    mut client_left: oneshot::Receiver<()>,
) {
    let mut checks = tokio::time::interval(KERNEL_MIRROR_CHECK_INTERVAL);
    let mut stall = SendStall::default();
    let mut stuck = false;
    loop {
        tokio::select! {
            _ = &mut client_left => break,
            _ = checks.tick() => {
                stuck = stall.stuck(unsent_bytes(&shadow));
                if stuck || !fast.mirror_intact(&handle) {
                    break;
                }
            }
        }
    }
    tokio::time::sleep(KERNEL_FLUSH_GRACE).await;
    let intact = !stuck && fast.mirror_intact(&handle);
    // Out of the maps first: from here the socket is an ordinary one again, safe to use.
    fast.remove_mirror(handle);
    if !intact {
        counters.cut_offs.fetch_add(1, Ordering::Relaxed);
        tracing::warn!("a kernel mirror missed bytes (reordered or lost segment); its shadow is closed");
        return; // Dropping the socket resets the shadow session: it rolls back what it held.
    }
    let (reader, writer) = shadow.into_split();
    finish_shadow(reader, writer).await;
}

/// A kernel-mirrored shadow that stops reading: its socket's unsent bytes stay the same,
/// non-zero, check after check. The kernel's copies queued behind them are charged to no
/// socket buffer, so such a shadow is cut off after [`MIRROR_WRITE_TIMEOUT`], as a user-space
/// shadow whose write takes that long is.
#[derive(Default)]
struct SendStall {
    last_unsent: usize,
    unchanged_checks: u32,
}

impl SendStall {
    fn stuck(&mut self, unsent: usize) -> bool {
        if unsent == 0 || unsent != self.last_unsent {
            (self.last_unsent, self.unchanged_checks) = (unsent, 0);
            return false;
        }
        self.unchanged_checks += 1;
        let limit = MIRROR_WRITE_TIMEOUT.as_secs_f64() / KERNEL_MIRROR_CHECK_INTERVAL.as_secs_f64();
        f64::from(self.unchanged_checks) >= limit
    }
}

/// Bytes in a socket's send queue not yet acknowledged by the peer (`SIOCOUTQ`).
fn unsent_bytes(socket: &TcpStream) -> usize {
    let mut unsent: libc::c_int = 0;
    // SAFETY: TIOCOUTQ (= SIOCOUTQ) writes one int through the pointer, which is valid.
    let result = unsafe { libc::ioctl(socket.as_raw_fd(), libc::TIOCOUTQ, &mut unsent) };
    if result < 0 {
        0
    } else {
        unsent.max(0) as usize
    }
}

/// Ends a shadow session gracefully: FIN after what was sent, then its replies are read and
/// discarded until it closes or [`MIRROR_DRAIN_TIMEOUT`] runs out.
async fn finish_shadow<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(reader: R, mut writer: W) {
    let drain = async {
        let _ = writer.shutdown().await;
        discard_replies(reader).await;
    };
    if tokio::time::timeout(MIRROR_DRAIN_TIMEOUT, drain).await.is_err() {
        tracing::debug!("a shadow did not finish within the drain timeout; closed");
    }
}

/// Reads and drops whatever the shadow sends until it closes or fails.
async fn discard_replies<R: AsyncRead + Unpin>(mut reader: R) {
    let mut sink = [0u8; REPLY_DISCARD_BYTES];
    while let Ok(count) = reader.read(&mut sink).await {
        if count == 0 {
            return;
        }
    }
}

/// A client mirrored in user space: its reads are copied into the queue a feeder task drains.
pub struct UserMirror {
    queue: Arc<MirrorQueue>,
    _active: ActiveClient,
}

impl UserMirror {
    /// Starts the shadow's tasks; `read_ahead` is what the client sent before mirroring began.
    pub fn start(shadow: Stream, read_ahead: &[u8], counters: &Arc<MirrorCounters>) -> Self {
        let queue = Arc::new(MirrorQueue::new());
        queue.push(read_ahead);
        let task_queue = queue.clone();
        let task_counters = counters.clone();
        match shadow {
            Stream::Plain(tcp) => {
                let (reader, writer) = tcp.into_split();
                tokio::spawn(run_user_shadow(reader, writer, task_queue, task_counters));
            }
            Stream::Tls(tls) => {
                let (reader, writer) = tokio::io::split(*tls);
                tokio::spawn(run_user_shadow(reader, writer, task_queue, task_counters));
            }
            Stream::Unix(unix) => {
                let (reader, writer) = unix.into_split();
                tokio::spawn(run_user_shadow(reader, writer, task_queue, task_counters));
            }
            // A shadow connection is never lent to the kernel.
            Stream::Parked(_) => task_queue.close(),
        }
        UserMirror { queue, _active: ActiveClient::new(counters, false) }
    }
}

impl Drop for UserMirror {
    fn drop(&mut self) {
        self.queue.close();
    }
}

/// How feeding a shadow ended.
#[derive(Debug, PartialEq, Eq)]
enum FeedEnd {
    /// The client left and everything queued was written.
    Finished,
    /// The shadow fell behind, got stuck or failed: close it now.
    CutOff,
}

/// Feeds the shadow and discards its replies at once (a shadow blocked on sending replies
/// would stop reading requests), then finishes it.
async fn run_user_shadow<R, W>(reader: R, mut writer: W, queue: Arc<MirrorQueue>, counters: Arc<MirrorCounters>)
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let discard = discard_replies(reader);
    tokio::pin!(discard);
    let end = tokio::select! {
        end = feed(&mut writer, &queue) => end,
        // The shadow closed on its own (FATAL, restart): nothing more can be mirrored.
        _ = &mut discard => FeedEnd::CutOff,
    };
    if end == FeedEnd::CutOff {
        queue.cut_off();
        counters.cut_offs.fetch_add(1, Ordering::Relaxed);
        tracing::warn!("a shadow fell behind or failed; it is closed and its client no longer mirrored");
        return; // Dropping both halves resets the shadow session.
    }
    let drain = async {
        let _ = writer.shutdown().await;
        discard.await;
    };
    if tokio::time::timeout(MIRROR_DRAIN_TIMEOUT, drain).await.is_err() {
        tracing::debug!("a shadow did not finish within the drain timeout; closed");
    }
}

/// Writes queued bytes to the shadow, a batch at a time, until the client left and the queue
/// is empty, or the shadow is cut off.
async fn feed<W: AsyncWrite + Unpin>(writer: &mut W, queue: &MirrorQueue) -> FeedEnd {
    let mut batch = Vec::with_capacity(MIRROR_QUEUE_BYTES);
    loop {
        match queue.take(&mut batch) {
            Take::Batch => {}
            Take::Empty => {
                queue.ready.notified().await;
                continue;
            }
            Take::Closed => return FeedEnd::Finished,
            Take::CutOff => return FeedEnd::CutOff,
        }
        match tokio::time::timeout(MIRROR_WRITE_TIMEOUT, writer.write_all(&batch)).await {
            Ok(Ok(())) => batch.clear(),
            Ok(Err(_)) | Err(_) => return FeedEnd::CutOff,
        }
    }
}

/// What [`MirrorQueue::take`] found.
enum Take {
    Batch,
    Empty,
    Closed,
    CutOff,
}

/// The bytes a client sent that its shadow has not been handed yet: two buffers of
/// [`MIRROR_QUEUE_BYTES`] swapped between the client (which appends) and the feeder (which
/// writes), so copying never allocates and the backlog is bounded.
struct MirrorQueue {
    state: Mutex<QueueState>,
    /// Signalled when bytes arrive or the queue closes (a stored permit: no wake-up is lost).
    ready: Notify,
}

struct QueueState {
    pending: Vec<u8>,
    /// False once the client left or the shadow was cut off: no more bytes are taken.
    open: bool,
    cut_off: bool,
}

impl MirrorQueue {
    fn new() -> Self {
        let state = QueueState { pending: Vec::with_capacity(MIRROR_QUEUE_BYTES), open: true, cut_off: false };
        MirrorQueue { state: Mutex::new(state), ready: Notify::new() }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Appends a copy of `bytes`; cuts the shadow off instead when they do not fit.
    fn push(&self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        {
            let mut state = self.lock();
            if !state.open {
                return;
            }
            if state.pending.len() + bytes.len() > MIRROR_QUEUE_BYTES {
                state.open = false;
                state.cut_off = true;
                state.pending.clear();
            } else {
                state.pending.extend_from_slice(bytes);
            }
        }
        self.ready.notify_one();
    }

    /// Swaps the pending bytes into `batch` (which must be empty).
    fn take(&self, batch: &mut Vec<u8>) -> Take {
        debug_assert!(batch.is_empty(), "a batch is taken only after the last one was written");
        let mut state = self.lock();
        if state.cut_off {
            return Take::CutOff;
        }
        if !state.pending.is_empty() {
            std::mem::swap(&mut state.pending, batch);
            return Take::Batch;
        }
        if state.open {
            Take::Empty
        } else {
            Take::Closed
        }
    }

    /// The client left: the feeder writes what is queued, then finishes.
    fn close(&self) {
        self.lock().open = false;
        self.ready.notify_one();
    }

    /// The shadow is gone or hopeless: stop taking bytes.
    fn cut_off(&self) {
        let mut state = self.lock();
        state.open = false;
        state.cut_off = true;
        state.pending.clear();
    }
}

/// The `/metrics` series of mirroring: clients, failures, cut-offs, and (kernel) the tc copy's
/// own counters.
pub fn render_metrics(text: &mut String, state: &MirrorState, fast: Option<&Arc<FastPath>>) {
    let counters = &state.counters;
    let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
    let series: [(&str, &str, &str, &str, u64); 5] = [
        ("bypass_mirror_clients", "gauge", "", "Clients mirrored right now.", load(&counters.active)),
        (
            "bypass_mirror_clients_total",
            "counter",
            "path=\"kernel\"",
            "Clients mirrored, by where their bytes are copied.",
            load(&counters.kernel_clients),
        ),
        ("bypass_mirror_clients_total", "", "path=\"user\"", "", load(&counters.user_clients)),
        (
            "bypass_mirror_failures_total",
            "counter",
            "",
            "Clients served unmirrored: their shadow could not be reached.",
            load(&counters.failures),
        ),
        (
            "bypass_mirror_cut_offs_total",
            "counter",
            "",
            "Shadows closed mid-session (behind, stuck, failed or desynced).",
            load(&counters.cut_offs),
        ),
    ];
    for (name, kind, labels, help, value) in series {
        if !help.is_empty() {
            let _ = writeln!(text, "# HELP {name} {help}\n# TYPE {name} {kind}");
        }
        let _ = writeln!(text, "{name}{{{labels}}} {value}");
    }
    if let Some(fast) = fast.filter(|_| state.in_kernel()) {
        render_kernel_counters(text, fast);
    }
}

fn render_kernel_counters(text: &mut String, fast: &FastPath) {
    let c = fast.mirror_counters();
    let name = "bypass_kernel_mirror_total";
    let _ = writeln!(text, "# HELP {name} Kernel mirroring events (tc copy and shadow verdicts), by kind.");
    let _ = writeln!(text, "# TYPE {name} counter");
    for (kind, value) in [
        ("segments_cloned", c.segments_cloned),
        ("clone_failures", c.clone_failures),
        ("segments_mirrored", c.segments_mirrored),
        ("bytes_mirrored", c.bytes_mirrored),
        ("drops_no_shadow", c.drops_no_shadow),
        ("duplicate_bytes", c.duplicate_bytes),
        ("desyncs", c.desyncs),
        ("shadow_reply_bytes_dropped", c.shadow_reply_bytes_dropped),
    ] {
        let _ = writeln!(text, "{name}{{kind=\"{kind}\"}} {value}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_hands_over_bytes_in_order_and_finishes_after_close() {
        // Goal: the queue passes bytes through unchanged and ends only when drained; method:
        // push two pieces, take a batch, close, take again.
        let queue = MirrorQueue::new();
        queue.push(b"abc");
        queue.push(b"def");
        let mut batch = Vec::with_capacity(MIRROR_QUEUE_BYTES);
        assert!(matches!(queue.take(&mut batch), Take::Batch));
        assert_eq!(batch, b"abcdef");
        batch.clear();
        assert!(matches!(queue.take(&mut batch), Take::Empty));
        queue.push(b"X");
        queue.close();
        queue.push(b"late");
        assert!(matches!(queue.take(&mut batch), Take::Batch), "bytes queued before the close are written");
        assert_eq!(batch, b"X");
        batch.clear();
        assert!(matches!(queue.take(&mut batch), Take::Closed));
    }

    #[test]
    fn a_queue_that_would_overflow_cuts_the_shadow_off() {
        // Goal: a shadow behind by more than MIRROR_QUEUE_BYTES is cut off, never fed a stream
        // with a hole; method: fill the queue past its bound, then check nothing more is taken.
        let queue = MirrorQueue::new();
        let chunk = vec![7u8; MIRROR_QUEUE_BYTES / 2];
        queue.push(&chunk);
        queue.push(&chunk);
        queue.push(b"one byte too many");
        queue.push(b"after");
        let mut batch = Vec::new();
        assert!(matches!(queue.take(&mut batch), Take::CutOff));
        assert!(batch.is_empty());
    }
}

#[cfg(test)]
mod stall_tests {
    use super::*;

    #[test]
    fn a_send_queue_that_never_moves_is_stuck_and_a_moving_one_is_not() {
        // Goal: only a shadow that stopped reading is cut off. Method: feed check results.
        let checks = (MIRROR_WRITE_TIMEOUT.as_secs() / KERNEL_MIRROR_CHECK_INTERVAL.as_secs()) as usize;
        let mut stall = SendStall::default();
        assert!((0..checks * 2).all(|i| !stall.stuck(1000 + i % 3)), "a moving queue is never stuck");
        assert!((0..checks * 2).all(|_| !stall.stuck(0)), "an empty queue is never stuck");
        let mut stall = SendStall::default();
        let verdicts: Vec<bool> = (0..=checks).map(|_| stall.stuck(4096)).collect();
        assert!(!verdicts[..checks].iter().any(|&v| v), "cut off too early: {verdicts:?}");
        assert!(verdicts[checks], "never cut off");
    }
}
