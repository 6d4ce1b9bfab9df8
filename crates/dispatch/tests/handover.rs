//! TCP_REPAIR export and import of live connections (needs root, as in CI).

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddrV4, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, IntoRawFd};
use std::time::Duration;

use bypass_dispatch::handover::{self, TcpState};

fn wait_for(what: &str, mut ready: impl FnMut() -> bool) -> anyhow::Result<()> {
    common::wait_until(Duration::from_secs(5), what, &mut ready)
}

/// Exports `socket` (closing it silently) and imports it again as a new socket.
fn move_socket(socket: TcpStream) -> anyhow::Result<(TcpStream, TcpState)> {
    let state = handover::export(socket.as_raw_fd())?;
    drop(socket);
    let mut encoded = Vec::new();
    state.encode(&mut encoded);
    let decoded = TcpState::decode(&encoded)?;
    let fd = handover::import(&decoded)?;
    Ok((TcpStream::from(fd), state))
}

/// The segment size the kernel uses for `socket` (TCP_MAXSEG outside repair mode).
fn segment_size(socket: &TcpStream) -> anyhow::Result<i32> {
    let mut value: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: the pointers describe `value` and `len`, alive across the call.
    let status = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_MAXSEG,
            (&mut value as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    anyhow::ensure!(status == 0, "TCP_MAXSEG: {}", std::io::Error::last_os_error());
    Ok(value)
}

// Goal: an imported connection sends full-sized segments, as the original did — not the
// kernel's 536-byte default for a socket that never saw a SYN (backends' answers used to leave
// in 524-byte segments, 2.7 times the packets of a direct connection). Method: loopback pair;
// TCP_MAXSEG of the server socket before the move and after.
#[test]
fn an_imported_connection_keeps_its_segment_size() -> anyhow::Result<()> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let client = TcpStream::connect(listener.local_addr()?)?;
    let (server, _) = listener.accept()?;
    let before = segment_size(&server)?;
    assert!(before > 1000, "loopback segments are large: {before}");
    let (moved, _) = move_socket(server)?;
    let after = segment_size(&moved)?;
    // Loopback segments exceed the largest MSS a socket may be given (32767), Ethernet's do not.
    assert!(after >= before.min(32_767) - 64 && after <= before, "segment size {before} before, {after} after");
    drop(client);
    Ok(())
}

// Goal: a live connection survives export, silent close and import with its unread bytes, and
// carries traffic both ways afterwards without a reset. Method: loopback pair; the client's
// bytes wait unread in the server socket's receive queue while it moves; repeat 200 times.
#[test]
fn a_connection_moves_with_its_receive_queue_and_keeps_working() -> anyhow::Result<()> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let mut client = TcpStream::connect(listener.local_addr()?)?;
    client.set_read_timeout(Some(Duration::from_secs(5)))?;
    let (mut server, _) = listener.accept()?;
    let client_address = client.local_addr()?;
    for round in 0u32..200 {
        let request = format!("request {round}");
        client.write_all(request.as_bytes())?;
        wait_for("bytes in the receive queue", || {
            handover::recv_queue_len(server.as_raw_fd()).ok() == Some(request.len())
        })?;
        let (moved, state) = move_socket(server)?;
        assert_eq!(state.recv_queue, request.as_bytes(), "round {round}");
        assert_eq!(SocketAddrV4::new([127, 0, 0, 1].into(), client_address.port()), state.peer);
        server = moved;
        let mut received = vec![0u8; request.len()];
        server.read_exact(&mut received)?;
        assert_eq!(received, request.as_bytes());
        let reply = format!("reply {round}").repeat(100);
        server.write_all(reply.as_bytes())?;
        let mut got = vec![0u8; reply.len()];
        client.read_exact(&mut got)?;
        assert_eq!(got, reply.as_bytes(), "round {round}");
        wait_for("the reply to be acknowledged", || handover::send_queue_len(server.as_raw_fd()).ok() == Some(0))?;
    }
    drop(server);
    let mut rest = Vec::new();
    client.read_to_end(&mut rest)?;
    assert!(rest.is_empty(), "a clean FIN, no stray bytes, no reset");
    Ok(())
}

// Goal: exporting a socket that is not established fails with a typed error and leaves it
// usable; method: export a listening socket.
#[test]
fn exporting_a_listener_is_refused() -> anyhow::Result<()> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let error = handover::export(listener.as_raw_fd()).expect_err("a listener cannot be exported");
    assert!(matches!(error, bypass_dispatch::DispatchError::Repair { .. }), "{error}");
    let _client = TcpStream::connect(listener.local_addr()?)?;
    listener.accept()?;
    let _ = listener.into_raw_fd();
    Ok(())
}

// Goal: a connection whose client has not read megabytes moves with its whole send queue
// (never-sent bytes that exceed the new socket's send buffer go out asynchronously, without
// blocking a thread), and the client then reads every byte in order. Method: loopback pair;
// the server queues 3 MB the client does not read; move the server socket with import_tokio
// inside a tokio runtime; then the client reads and checks all of it.
#[test]
fn a_connection_with_megabytes_unread_moves_whole() -> anyhow::Result<()> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let mut client = TcpStream::connect(listener.local_addr()?)?;
    client.set_read_timeout(Some(Duration::from_secs(10)))?;
    let (server, _) = listener.accept()?;
    let socket = socket2::Socket::from(server);
    socket.set_send_buffer_size(8 << 20)?;
    socket.set_nonblocking(true)?;
    let server = TcpStream::from(socket);
    let payload: Vec<u8> = (0..3u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8).collect();
    let mut queued = 0;
    while queued < payload.len() {
        match (&server).write(&payload[queued..]) {
            Ok(count) => queued += count,
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(error) => return Err(error.into()),
        }
    }
    std::thread::sleep(Duration::from_millis(100));
    let state = handover::export(server.as_raw_fd())?;
    drop(server);
    assert!(state.send_queue.len() > 1 << 20, "only {} bytes were queued", state.send_queue.len());
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let reader = std::thread::spawn(move || -> anyhow::Result<Vec<u8>> {
        std::thread::sleep(Duration::from_millis(200));
        let mut got = vec![0u8; queued];
        client.read_exact(&mut got)?;
        Ok(got)
    });
    let moved = runtime.block_on(async {
        let imported = handover::import_tokio(&state)?;
        anyhow::Ok(tokio::time::timeout(Duration::from_secs(20), imported.finish()).await??)
    })?;
    let got = reader.join().expect("reader thread")?;
    assert!(got == payload[..queued], "the client read different bytes");
    drop(moved);
    Ok(())
}
