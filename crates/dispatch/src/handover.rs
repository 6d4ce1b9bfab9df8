//! Moving a live TCP connection between hosts with `TCP_REPAIR` (the CRIU/libsoccr order).
//!
//! ```text
//!  export (old owner):  repair on ─► TCP_INFO (ESTABLISHED, options, wscales) ─► queue lengths
//!     ─► MSS, timestamp, window ─► per queue: sequence number + MSG_PEEK of its bytes
//!     ─► caller closes the socket: in repair mode that sends neither FIN nor RST
//!  import (new owner):  socket, repair on ─► queue sequence numbers ─► bind(local) ─► connect(peer)
//!     (no SYN) ─► options ─► timestamp ─► receive queue ─► sent-but-unacked queue ─► window
//!     ─► repair off without window probe ─► never-sent bytes sent normally ─► TCP_NODELAY
//! ```
//! Lost by design: congestion window (slow start again), RTT estimate (RTO 1 s until the first
//! sample), SACK scoreboard. Needs CAP_NET_ADMIN in the socket's namespace.
//!
//! Invariant: while nobody owns the connection, its packets must not reach any host (the
//! steering map blocks them), else the old host's kernel answers with RST.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use crate::error::{DispatchError, Result};

// Linux <netinet/tcp.h> and <linux/sockios.h>; kept here so the whole repair ABI is in one place.
const TCP_REPAIR: libc::c_int = 19;
const TCP_REPAIR_QUEUE: libc::c_int = 20;
const TCP_QUEUE_SEQ: libc::c_int = 21;
const TCP_REPAIR_OPTIONS: libc::c_int = 22;
const TCP_TIMESTAMP: libc::c_int = 24;
const TCP_REPAIR_WINDOW: libc::c_int = 29;
const TCP_REPAIR_ON: libc::c_int = 1;
/// Leave repair mode without sending a window probe (Prism does the same).
const TCP_REPAIR_OFF_NO_WP: libc::c_int = -1;
const TCP_RECV_QUEUE: libc::c_int = 1;
const TCP_SEND_QUEUE: libc::c_int = 2;
const TCPOPT_MSS: u32 = 2;
const TCPOPT_WINDOW: u32 = 3;
const TCPOPT_SACK_PERM: u32 = 4;
const TCPOPT_TIMESTAMP: u32 = 8;
const TCPI_OPT_TIMESTAMPS: u8 = 1;
const TCPI_OPT_SACK: u8 = 2;
const TCPI_OPT_WSCALE: u8 = 4;
const TCP_ESTABLISHED: u8 = 1;
const SIOCINQ: libc::c_ulong = 0x541B;
const SIOCOUTQ: libc::c_ulong = 0x5411;
const SIOCOUTQNSD: libc::c_ulong = 0x894B;

/// Most bytes a queue may hold to be moved (the kernel's buffers are smaller).
pub const QUEUE_BYTES_MAX: usize = 64 * 1024 * 1024;
/// Repair-mode sends allocate linear buffers; chunks start here and halve on ENOMEM.
const REPAIR_CHUNK_BYTES: usize = 64 * 1024;

/// `struct tcp_repair_opt`.
#[repr(C)]
#[derive(Clone, Copy)]
struct RepairOpt {
    code: u32,
    value: u32,
}

/// `struct tcp_repair_window`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RepairWindow {
    pub snd_wl1: u32,
    pub snd_wnd: u32,
    pub max_window: u32,
    pub rcv_wnd: u32,
    pub rcv_wup: u32,
}

const _: () = assert!(std::mem::size_of::<RepairOpt>() == 8);
const _: () = assert!(std::mem::size_of::<RepairWindow>() == 20);

/// Everything needed to recreate a connection on another host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpState {
    pub local: SocketAddrV4,
    pub peer: SocketAddrV4,
    /// `write_seq`: sequence number after the last byte queued for sending.
    pub send_seq: u32,
    /// `rcv_nxt`: sequence number of the next byte expected from the peer.
    pub recv_seq: u32,
    pub mss: u32,
    pub timestamp: u32,
    /// `TCPI_OPT_*` bits.
    pub options: u8,
    pub snd_wscale: u8,
    pub rcv_wscale: u8,
    pub window: RepairWindow,
    /// Bytes received and not yet read by the application.
    pub recv_queue: Vec<u8>,
    /// Bytes written and not yet acknowledged; the last `unsent` were never sent.
    pub send_queue: Vec<u8>,
    pub unsent: u32,
}

/// Encoded size of a [`TcpState`] without its queues.
pub const STATE_HEADER_BYTES: usize = 6 + 6 + 4 * 4 + 3 + 20 + 4 * 3;

impl TcpState {
    /// Appends the state: fixed header (big-endian), then the receive and send queues.
    pub fn encode(&self, buf: &mut Vec<u8>) {
        let start = buf.len();
        for address in [self.local, self.peer] {
            buf.extend_from_slice(&address.ip().octets());
            buf.extend_from_slice(&address.port().to_be_bytes());
        }
        for value in [self.send_seq, self.recv_seq, self.mss, self.timestamp] {
            buf.extend_from_slice(&value.to_be_bytes());
        }
        buf.extend_from_slice(&[self.options, self.snd_wscale, self.rcv_wscale]);
        let w = self.window;
        for value in [w.snd_wl1, w.snd_wnd, w.max_window, w.rcv_wnd, w.rcv_wup] {
            buf.extend_from_slice(&value.to_be_bytes());
        }
        for value in [self.recv_queue.len() as u32, self.send_queue.len() as u32, self.unsent] {
            buf.extend_from_slice(&value.to_be_bytes());
        }
        debug_assert_eq!(buf.len() - start, STATE_HEADER_BYTES);
        buf.extend_from_slice(&self.recv_queue);
        buf.extend_from_slice(&self.send_queue);
    }

    /// Decodes what [`TcpState::encode`] wrote; malformed input is a typed error.
    pub fn decode(bytes: &[u8]) -> Result<TcpState> {
        let bad = || DispatchError::Protocol("malformed TCP state".into());
        let header = bytes.get(..STATE_HEADER_BYTES).ok_or_else(bad)?;
        let u32_at = |at: usize| u32::from_be_bytes([header[at], header[at + 1], header[at + 2], header[at + 3]]);
        let address_at = |at: usize| {
            let ip = Ipv4Addr::new(header[at], header[at + 1], header[at + 2], header[at + 3]);
            SocketAddrV4::new(ip, u16::from_be_bytes([header[at + 4], header[at + 5]]))
        };
        let window = RepairWindow {
            snd_wl1: u32_at(31),
            snd_wnd: u32_at(35),
            max_window: u32_at(39),
            rcv_wnd: u32_at(43),
            rcv_wup: u32_at(47),
        };
        let (recv_len, send_len, unsent) = (u32_at(51) as usize, u32_at(55) as usize, u32_at(59));
        let queues = &bytes[STATE_HEADER_BYTES..];
        if queues.len() != recv_len + send_len || unsent as usize > send_len {
            return Err(bad());
        }
        Ok(TcpState {
            local: address_at(0),
            peer: address_at(6),
            send_seq: u32_at(12),
            recv_seq: u32_at(16),
            mss: u32_at(20),
            timestamp: u32_at(24),
            options: header[28],
            snd_wscale: header[29],
            rcv_wscale: header[30],
            window,
            recv_queue: queues[..recv_len].to_vec(),
            send_queue: queues[recv_len..].to_vec(),
            unsent,
        })
    }
}

/// Reads the state of an ESTABLISHED socket and leaves it in repair mode, so that closing it
/// afterwards is silent. On error the socket is taken out of repair mode again.
pub fn export(fd: RawFd) -> Result<TcpState> {
    set_int(fd, TCP_REPAIR, TCP_REPAIR_ON, "repair on")?;
    let state = read_state(fd);
    if state.is_err() {
        let _ = set_int(fd, TCP_REPAIR, 0, "repair off");
    }
    state
}

fn read_state(fd: RawFd) -> Result<TcpState> {
    let mut info = [0u8; 8];
    get_raw(fd, libc::IPPROTO_TCP, libc::TCP_INFO, &mut info, "TCP_INFO")?;
    if info[0] != TCP_ESTABLISHED {
        return Err(repair_error("state", format!("socket is in TCP state {}, not ESTABLISHED", info[0])));
    }
    let (outq, unsent, inq) = (ioctl_int(fd, SIOCOUTQ)?, ioctl_int(fd, SIOCOUTQNSD)?, ioctl_int(fd, SIOCINQ)?);
    if outq > QUEUE_BYTES_MAX || inq > QUEUE_BYTES_MAX || unsent > outq {
        return Err(repair_error(
            "queues",
            format!("queues too large or inconsistent: out {outq}, unsent {unsent}, in {inq}"),
        ));
    }
    let mut window = RepairWindow::default();
    get_struct(fd, TCP_REPAIR_WINDOW, &mut window, "TCP_REPAIR_WINDOW")?;
    set_int(fd, TCP_REPAIR_QUEUE, TCP_RECV_QUEUE, "select receive queue")?;
    let recv_seq = get_int(fd, TCP_QUEUE_SEQ, "receive sequence")? as u32;
    let recv_queue = peek_queue(fd, inq)?;
    set_int(fd, TCP_REPAIR_QUEUE, TCP_SEND_QUEUE, "select send queue")?;
    let send_seq = get_int(fd, TCP_QUEUE_SEQ, "send sequence")? as u32;
    let send_queue = peek_queue(fd, outq)?;
    Ok(TcpState {
        local: socket_address(fd, libc::getsockname, "getsockname")?,
        peer: socket_address(fd, libc::getpeername, "getpeername")?,
        send_seq,
        recv_seq,
        mss: get_int(fd, libc::TCP_MAXSEG, "MSS")? as u32,
        timestamp: get_int(fd, TCP_TIMESTAMP, "timestamp")? as u32,
        options: info[5],
        snd_wscale: info[6] & 0x0f,
        rcv_wscale: info[6] >> 4,
        window,
        recv_queue,
        send_queue,
        unsent: unsent as u32,
    })
}

/// Attempts at binding the connection's address pair while the previous owner's socket on this
/// host may still be leaving the kernel's hash tables.
const IMPORT_ATTEMPTS_MAX: u32 = 50;
/// Pause between those attempts.
const IMPORT_RETRY_PAUSE: std::time::Duration = std::time::Duration::from_micros(200);

/// Recreates the connection in the calling thread's namespace and returns its descriptor,
/// ready for normal use (non-blocking is left to the caller). Retries (bounded) while the
/// address pair is still taken by a socket of this host that was just closed.
pub fn import(state: &TcpState) -> Result<OwnedFd> {
    let (fd, sent) = import_leaving_unsent(state)?;
    let never_sent = &state.send_queue[state.send_queue.len() - state.unsent as usize..];
    send_all(fd.as_raw_fd(), &never_sent[sent..], "send never-sent bytes")?;
    Ok(fd)
}

/// [`import`] without waiting: the descriptor is non-blocking, and of the bytes the exporter
/// had never sent, only the first `.1` are queued (the rest did not fit the new socket's send
/// buffer; the caller writes them). A slow or dead client then never blocks a thread.
pub fn import_leaving_unsent(state: &TcpState) -> Result<(OwnedFd, usize)> {
    let mut attempt = 1;
    loop {
        match import_once(state) {
            Err(DispatchError::Repair { step: "bind" | "connect", source })
                if attempt < IMPORT_ATTEMPTS_MAX && address_in_use(&source) =>
            {
                attempt += 1;
                std::thread::sleep(IMPORT_RETRY_PAUSE);
            }
            outcome => return outcome,
        }
    }
}

fn address_in_use(error: &std::io::Error) -> bool {
    let inner = error.get_ref().and_then(|e| e.downcast_ref::<std::io::Error>());
    let code = inner.and_then(std::io::Error::raw_os_error).or(error.raw_os_error());
    matches!(code, Some(libc::EADDRINUSE) | Some(libc::EADDRNOTAVAIL))
}

fn import_once(state: &TcpState) -> Result<(OwnedFd, usize)> {
    // SAFETY: socket has no memory preconditions; the result is checked before use.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(repair_error("socket", std::io::Error::last_os_error()));
    }
    // SAFETY: `raw` is a fresh descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let raw = fd.as_raw_fd();
    set_int(raw, TCP_REPAIR, TCP_REPAIR_ON, "repair on")?;
    set_int(raw, TCP_REPAIR_QUEUE, TCP_RECV_QUEUE, "select receive queue")?;
    set_int(raw, TCP_QUEUE_SEQ, state.recv_seq.wrapping_sub(state.recv_queue.len() as u32) as i32, "receive sequence")?;
    set_int(raw, TCP_REPAIR_QUEUE, TCP_SEND_QUEUE, "select send queue")?;
    set_int(raw, TCP_QUEUE_SEQ, state.send_seq.wrapping_sub(state.send_queue.len() as u32) as i32, "send sequence")?;
    // A repair-mode connect sizes segments from the MSS clamp it finds, and without a SYN that
    // is the kernel's 536-byte default; TCP_REPAIR_OPTIONS later raises the clamp but not the
    // segment size. Set as the user MSS now, the connect sizes them as the original socket did.
    // (The kernel accepts at most USER_MSS_MAX; only loopback-sized segments are larger.)
    set_int(raw, libc::TCP_MAXSEG, state.mss.min(USER_MSS_MAX) as i32, "MSS before connect")?;
    bind_or_connect(raw, state.local, libc::bind, "bind")?;
    bind_or_connect(raw, state.peer, libc::connect, "connect")?;
    set_options(raw, state)?;
    if state.options & TCPI_OPT_TIMESTAMPS != 0 {
        set_int(raw, TCP_TIMESTAMP, state.timestamp as i32, "timestamp")?;
    }
    set_int(raw, TCP_REPAIR_QUEUE, TCP_RECV_QUEUE, "select receive queue")?;
    send_all(raw, &state.recv_queue, "restore receive queue")?;
    let sent_len = state.send_queue.len() - state.unsent as usize;
    make_room_for_send_queue(raw, state.send_queue.len())?;
    set_int(raw, TCP_REPAIR_QUEUE, TCP_SEND_QUEUE, "select send queue")?;
    send_all(raw, &state.send_queue[..sent_len], "restore send queue")?;
    set_struct(raw, TCP_REPAIR_WINDOW, &state.window, "TCP_REPAIR_WINDOW")?;
    set_int(raw, TCP_REPAIR, TCP_REPAIR_OFF_NO_WP, "repair off")?;
    allow_address_reuse(raw)?;
    set_int(raw, libc::TCP_NODELAY, 1, "TCP_NODELAY")?;
    set_nonblocking(raw)?;
    let sent = send_some(raw, &state.send_queue[sent_len..], "send never-sent bytes")?;
    Ok((fd, sent))
}

/// The largest TCP_MAXSEG the kernel accepts (MAX_TCP_WINDOW).
const USER_MSS_MAX: u32 = 32_767;

/// Send queues up to this size fit a new socket's send buffer as the kernel sizes it.
const SEND_QUEUE_AUTOTUNED_BYTES: usize = 64 * 1024;
/// Send buffer of a socket imported with a larger queue: the kernel's default autotuning
/// ceiling (`tcp_wmem` max), so the fixed size costs no throughput.
const SEND_BUFFER_LARGE_BYTES: usize = 4 * 1024 * 1024;

/// Restored bytes count against the send buffer, and a repair-mode send that finds it full
/// waits for acknowledgements that cannot come (nothing is transmitted in repair mode): size
/// the buffer for the whole queue first. This fixes the size (no autotuning), so only when
/// needed.
fn make_room_for_send_queue(fd: RawFd, queue_len: usize) -> Result<()> {
    if queue_len <= SEND_QUEUE_AUTOTUNED_BYTES {
        return Ok(());
    }
    let bytes = (2 * queue_len + REPAIR_CHUNK_BYTES).max(SEND_BUFFER_LARGE_BYTES);
    let value = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    let len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: the pointer and length describe `value`, alive across the call. SO_SNDBUFFORCE
    // (CAP_NET_ADMIN, which repair needs anyway) is not capped by net.core.wmem_max.
    let status = unsafe {
        libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, (&value as *const libc::c_int).cast(), len)
    };
    check(status, "SO_SNDBUFFORCE")
}

fn set_nonblocking(fd: RawFd) -> Result<()> {
    // SAFETY: fcntl on a descriptor this module owns; no memory is passed.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    check(flags, "F_GETFL")?;
    // SAFETY: as above.
    check(unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) }, "F_SETFL")
}

/// Sends what the send buffer takes now; returns how many bytes that was.
fn send_some(fd: RawFd, bytes: &[u8], step: &'static str) -> Result<usize> {
    let mut sent_total = 0;
    while sent_total < bytes.len() {
        let rest = &bytes[sent_total..];
        // SAFETY: the pointer and length describe a live slice of `bytes`.
        let sent = unsafe { libc::send(fd, rest.as_ptr().cast(), rest.len(), libc::MSG_NOSIGNAL) };
        if sent < 0 {
            let error = std::io::Error::last_os_error();
            match error.raw_os_error() {
                Some(libc::EAGAIN) => break,
                Some(libc::EINTR) => continue,
                _ => return Err(repair_error(step, error)),
            }
        }
        sent_total += sent.max(0) as usize;
    }
    Ok(sent_total)
}

fn set_options(fd: RawFd, state: &TcpState) -> Result<()> {
    let mut options = vec![RepairOpt { code: TCPOPT_MSS, value: state.mss }];
    if state.options & TCPI_OPT_WSCALE != 0 {
        let value = u32::from(state.snd_wscale) | (u32::from(state.rcv_wscale) << 16);
        options.push(RepairOpt { code: TCPOPT_WINDOW, value });
    }
    if state.options & TCPI_OPT_SACK != 0 {
        options.push(RepairOpt { code: TCPOPT_SACK_PERM, value: 0 });
    }
    if state.options & TCPI_OPT_TIMESTAMPS != 0 {
        options.push(RepairOpt { code: TCPOPT_TIMESTAMP, value: 0 });
    }
    let len = (options.len() * std::mem::size_of::<RepairOpt>()) as libc::socklen_t;
    // SAFETY: the pointer and length describe the `options` vector, alive across the call.
    let status = unsafe { libc::setsockopt(fd, libc::IPPROTO_TCP, TCP_REPAIR_OPTIONS, options.as_ptr().cast(), len) };
    check(status, "TCP_REPAIR_OPTIONS")
}

/// Writes `bytes` in repair-mode-sized chunks (halving on ENOMEM), or normally after repair.
fn send_all(fd: RawFd, mut bytes: &[u8], step: &'static str) -> Result<()> {
    let mut chunk = REPAIR_CHUNK_BYTES;
    while !bytes.is_empty() {
        let len = chunk.min(bytes.len());
        // SAFETY: the pointer and length describe a live slice of `bytes`.
        let sent = unsafe { libc::send(fd, bytes.as_ptr().cast(), len, libc::MSG_NOSIGNAL) };
        if sent < 0 {
            let error = std::io::Error::last_os_error();
            match error.raw_os_error() {
                Some(libc::ENOMEM) if chunk > 1024 => chunk /= 2,
                Some(libc::EAGAIN) | Some(libc::EINTR) => std::thread::yield_now(),
                _ => return Err(repair_error(step, error)),
            }
            continue;
        }
        bytes = &bytes[sent as usize..];
    }
    Ok(())
}

/// Copies a queue's `len` bytes without consuming them; asks for one more to prove there are
/// exactly `len`.
fn peek_queue(fd: RawFd, len: usize) -> Result<Vec<u8>> {
    if len == 0 {
        return Ok(Vec::new());
    }
    let mut bytes = vec![0u8; len + 1];
    // SAFETY: the pointer and length describe `bytes`, alive across the call.
    let got = unsafe { libc::recv(fd, bytes.as_mut_ptr().cast(), len + 1, libc::MSG_PEEK | libc::MSG_DONTWAIT) };
    if got < 0 {
        return Err(repair_error("peek queue", std::io::Error::last_os_error()));
    }
    if got as usize != len {
        return Err(repair_error("peek queue", format!("queue holds {got} bytes, expected {len}")));
    }
    bytes.truncate(len);
    Ok(bytes)
}

type AddressCall = unsafe extern "C" fn(libc::c_int, *mut libc::sockaddr, *mut libc::socklen_t) -> libc::c_int;

fn socket_address(fd: RawFd, call: AddressCall, step: &'static str) -> Result<SocketAddrV4> {
    // SAFETY: sockaddr_in is plain old data; zeroed is a valid value.
    let mut address: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: the pointers describe `address` and `len`, alive across the call.
    let status = unsafe { call(fd, (&mut address as *mut libc::sockaddr_in).cast(), &mut len) };
    check(status, step)?;
    if i32::from(address.sin_family) != libc::AF_INET {
        return Err(repair_error(step, "only IPv4 connections can be handed over".to_string()));
    }
    Ok(SocketAddrV4::new(Ipv4Addr::from(u32::from_be(address.sin_addr.s_addr)), u16::from_be(address.sin_port)))
}

type BindCall = unsafe extern "C" fn(libc::c_int, *const libc::sockaddr, libc::socklen_t) -> libc::c_int;

fn bind_or_connect(fd: RawFd, address: SocketAddrV4, call: BindCall, step: &'static str) -> Result<()> {
    let raw = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: address.port().to_be(),
        sin_addr: libc::in_addr { s_addr: u32::from(*address.ip()).to_be() },
        sin_zero: [0; 8],
    };
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: the pointer and length describe `raw`, alive across the call.
    let status = unsafe { call(fd, (&raw as *const libc::sockaddr_in).cast(), len) };
    check(status, step)
}

/// Sets SO_RCVLOWAT: readiness is signalled only once `bytes` are queued (a non-blocking read
/// still returns whatever is there). Lowering it signals at once if enough is queued.
pub fn set_receive_low_water(fd: RawFd, bytes: usize) -> Result<()> {
    let value = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX).max(1);
    let len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: the pointer and length describe `value`, alive across the call.
    let status = unsafe {
        libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_RCVLOWAT, (&value as *const libc::c_int).cast(), len)
    };
    check(status, "SO_RCVLOWAT")
}

/// Marks an imported socket reusable. Repair off leaves it `SK_NO_REUSE`, and such a socket
/// bound to the service address (still open or in TIME_WAIT for a minute after it closes) makes
/// a new listener's bind there fail with EADDRINUSE: a dispatcher restarted after hand-backs
/// could not listen again.
fn allow_address_reuse(fd: RawFd) -> Result<()> {
    let on: libc::c_int = 1;
    let len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: the pointer and length describe `on`, alive across the call.
    let status =
        unsafe { libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_REUSEADDR, (&on as *const libc::c_int).cast(), len) };
    check(status, "SO_REUSEADDR")
}

fn set_int(fd: RawFd, option: libc::c_int, value: libc::c_int, step: &'static str) -> Result<()> {
    set_struct(fd, option, &value, step)
}

fn set_struct<T>(fd: RawFd, option: libc::c_int, value: &T, step: &'static str) -> Result<()> {
    let len = std::mem::size_of::<T>() as libc::socklen_t;
    // SAFETY: the pointer and length describe `value`, alive across the call.
    let status = unsafe { libc::setsockopt(fd, libc::IPPROTO_TCP, option, (value as *const T).cast(), len) };
    check(status, step)
}

fn get_int(fd: RawFd, option: libc::c_int, step: &'static str) -> Result<i32> {
    let mut value: libc::c_int = 0;
    get_struct(fd, option, &mut value, step)?;
    Ok(value)
}

fn get_struct<T>(fd: RawFd, option: libc::c_int, value: &mut T, step: &'static str) -> Result<()> {
    let mut len = std::mem::size_of::<T>() as libc::socklen_t;
    // SAFETY: the pointers describe `value` and `len`, alive across the call; T is plain data.
    let status = unsafe { libc::getsockopt(fd, libc::IPPROTO_TCP, option, (value as *mut T).cast(), &mut len) };
    check(status, step)
}

fn get_raw(fd: RawFd, level: libc::c_int, option: libc::c_int, bytes: &mut [u8], step: &'static str) -> Result<()> {
    let mut len = bytes.len() as libc::socklen_t;
    // SAFETY: the pointers describe `bytes` and `len`, alive across the call.
    let status = unsafe { libc::getsockopt(fd, level, option, bytes.as_mut_ptr().cast(), &mut len) };
    check(status, step)
}

fn ioctl_int(fd: RawFd, request: libc::c_ulong) -> Result<usize> {
    let mut value: libc::c_int = 0;
    // SAFETY: these socket ioctls write one int into `value`.
    let status = unsafe { libc::ioctl(fd, request, &mut value) };
    check(status, "queue length ioctl")?;
    Ok(value.max(0) as usize)
}

/// Unsent plus unacknowledged bytes in the send queue (`SIOCOUTQ`).
pub fn send_queue_len(fd: RawFd) -> Result<usize> {
    ioctl_int(fd, SIOCOUTQ)
}

/// Bytes received and not yet read (`SIOCINQ`).
pub fn recv_queue_len(fd: RawFd) -> Result<usize> {
    ioctl_int(fd, SIOCINQ)
}

fn check(status: libc::c_int, step: &'static str) -> Result<()> {
    if status < 0 {
        return Err(repair_error(step, std::io::Error::last_os_error()));
    }
    Ok(())
}

fn repair_error(step: &'static str, source: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> DispatchError {
    DispatchError::Repair { step, source: std::io::Error::other(source) }
}

/// `TCP_CLOSE` and `TCP_CLOSE_WAIT` of the kernel's TCP states.
pub const TCP_STATE_CLOSE: u8 = 7;
pub const TCP_STATE_CLOSE_WAIT: u8 = 8;

/// The kernel's TCP state of a socket (`tcpi_state`).
pub fn tcp_state(fd: RawFd) -> Result<u8> {
    let mut info = [0u8; 8];
    get_raw(fd, libc::IPPROTO_TCP, libc::TCP_INFO, &mut info, "TCP_INFO")?;
    Ok(info[0])
}

/// Offset of `tcpi_segs_in` (u32) in the kernel's `struct tcp_info` (stable ABI, Linux ≥ 4.2).
const TCPI_SEGS_IN_OFFSET: usize = 140;

/// Segments the socket has received (`tcpi_segs_in`, wrapping). An imported socket starts at 0.
pub fn segments_received(fd: RawFd) -> Result<u32> {
    let mut info = [0u8; TCPI_SEGS_IN_OFFSET + 4];
    get_raw(fd, libc::IPPROTO_TCP, libc::TCP_INFO, &mut info, "TCP_INFO")?;
    let bytes: [u8; 4] = info[TCPI_SEGS_IN_OFFSET..].try_into().expect("the slice is 4 bytes long");
    Ok(u32::from_ne_bytes(bytes))
}

/// How [`wait_settled`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// Nothing was on its way.
    AtOnce,
    /// Segments were still on their way; they have arrived.
    AfterWaiting,
    /// The bound passed (a segment was lost on the way) or a counter could not be read.
    GaveUp,
}

/// Waits until the socket has received `expected` segments since it had received `base`, for at
/// most `wait`: the segments the switch let through before it blocked the flow, some of which
/// may still be queued on the way (shaper queues, softirq backlog). A segment dropped on the
/// way never arrives, and then the wait ends by its bound.
pub async fn wait_settled(
    fd: RawFd,
    base: u32,
    expected: impl Fn() -> Result<u64>,
    wait: std::time::Duration,
) -> Settled {
    let deadline = std::time::Instant::now() + wait;
    let mut polls = 0u32;
    loop {
        let received = segments_received(fd).map(|now| u64::from(now.wrapping_sub(base)));
        match (received, expected()) {
            (Ok(received), Ok(expected)) if received >= expected => {
                return if polls == 0 { Settled::AtOnce } else { Settled::AfterWaiting };
            }
            (Err(_), _) | (_, Err(_)) => return Settled::GaveUp,
            _ => {}
        }
        if std::time::Instant::now() >= deadline {
            return Settled::GaveUp;
        }
        polls += 1;
        if polls < SPIN_POLLS_MAX {
            tokio::task::yield_now().await;
        } else {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    }
}

/// The first unread byte, if any, without consuming it.
pub fn peek_first_byte(fd: RawFd) -> Option<u8> {
    let mut byte = 0u8;
    // SAFETY: the pointer and length describe `byte`, alive across the call.
    let got = unsafe { libc::recv(fd, (&mut byte as *mut u8).cast(), 1, libc::MSG_PEEK | libc::MSG_DONTWAIT) };
    (got == 1).then_some(byte)
}

/// Polls of a send queue before waiting between polls becomes a 1 ms sleep.
const SPIN_POLLS_MAX: u32 = 200;

/// Waits until everything written to `fd` was acknowledged, for at most `wait`. Returns whether
/// it was. Polls: the kernel signals no event for "all acknowledged".
pub async fn wait_drained(fd: RawFd, wait: std::time::Duration) -> bool {
    let deadline = std::time::Instant::now() + wait;
    let mut polls = 0u32;
    loop {
        if send_queue_len(fd).unwrap_or(0) == 0 {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        polls += 1;
        if polls < SPIN_POLLS_MAX {
            tokio::task::yield_now().await;
        } else {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    }
}

/// A connection imported into the current tokio runtime.
pub struct Imported {
    pub stream: tokio::net::TcpStream,
    /// Bytes the exporter had never sent that did not fit the new socket's send buffer. Write
    /// them once the switch delivers the client's packets here: before that its
    /// acknowledgements are dropped and the write would wait for nothing.
    pub unsent_tail: Vec<u8>,
}

/// [`import_leaving_unsent`], registered with the current tokio runtime (a slow client must
/// not block a runtime thread).
pub fn import_tokio(state: &TcpState) -> Result<Imported> {
    let (fd, sent) = import_leaving_unsent(state)?;
    let stream = tokio::net::TcpStream::from_std(std::net::TcpStream::from(fd))
        .map_err(|e| DispatchError::io("registering an imported socket", e))?;
    let never_sent = &state.send_queue[state.send_queue.len() - state.unsent as usize..];
    Ok(Imported { stream, unsent_tail: never_sent[sent..].to_vec() })
}

impl Imported {
    /// Writes the never-sent tail and returns the stream, ready for use.
    pub async fn finish(self) -> Result<tokio::net::TcpStream> {
        use tokio::io::AsyncWriteExt;
        let Imported { mut stream, unsent_tail } = self;
        stream
            .write_all(&unsent_tail)
            .await
            .map_err(|e| DispatchError::io("sending never-sent bytes of an imported socket", e))?;
        Ok(stream)
    }
}

/// [`export`] of a tokio socket, which is then closed silently (still in repair mode).
pub fn export_tokio(stream: tokio::net::TcpStream) -> Result<TcpState> {
    let stream = stream.into_std().map_err(|e| DispatchError::io("deregistering a socket", e))?;
    let state = export(stream.as_raw_fd());
    drop(stream);
    state
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: the state encoding round-trips and rejects truncation; method: encode, decode.
    #[test]
    fn state_round_trips() {
        let state = TcpState {
            local: "10.0.0.100:5432".parse().expect("address"),
            peer: "10.0.0.11:40000".parse().expect("address"),
            send_seq: 0xfeed_beef,
            recv_seq: 7,
            mss: 1448,
            timestamp: 123_456,
            options: TCPI_OPT_TIMESTAMPS | TCPI_OPT_SACK | TCPI_OPT_WSCALE,
            snd_wscale: 7,
            rcv_wscale: 9,
            window: RepairWindow { snd_wl1: 1, snd_wnd: 2, max_window: 3, rcv_wnd: 4, rcv_wup: 5 },
            recv_queue: b"Q\0\0\0\x0bselect".to_vec(),
            send_queue: b"abcdef".to_vec(),
            unsent: 2,
        };
        let mut buf = Vec::new();
        state.encode(&mut buf);
        assert_eq!(buf.len(), STATE_HEADER_BYTES + 11 + 6);
        assert_eq!(TcpState::decode(&buf).expect("decodes"), state);
        assert!(TcpState::decode(&buf[..buf.len() - 1]).is_err());
        assert!(TcpState::decode(&buf[..10]).is_err());
    }
}
