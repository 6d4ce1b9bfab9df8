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
