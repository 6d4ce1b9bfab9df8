//! The eBPF steering table at the lab's switch (needs root, as in CI): real program, real
//! namespaces, real packets.

mod common;

use std::io::Read;
use std::net::{SocketAddr, SocketAddrV4, TcpListener};
use std::time::Duration;

use bypass_dispatch::netns;
use bypass_dispatch::steer::{Action, Switch};
use bypass_dispatch::DispatchError;
use bypass_lab::lab::{Lab, LabSpec, VIP};

/// Answers every connection on `address` in `namespace` with `banner`, until the process ends.
fn serve_banners(namespace: &str, address: SocketAddr, banner: &'static str) -> anyhow::Result<()> {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    netns::spawn_in(namespace, "banner", move || {
        let listener = TcpListener::bind(address).map_err(|e| DispatchError::io("bind", e))?;
        ready_tx.send(()).expect("test waits");
        for stream in listener.incoming() {
            use std::io::Write;
            let mut stream = stream.map_err(|e| DispatchError::io("accept", e))?;
            let _ = stream.write_all(banner.as_bytes());
        }
        Ok(())
    })?;
    ready_rx.recv()?;
    Ok(())
}

/// Connects from `client_ip:port` inside `namespace` and reads the banner.
fn banner_from(namespace: &str, local: SocketAddrV4, server: SocketAddr) -> anyhow::Result<String> {
    Ok(netns::run_in(namespace, move || {
        let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
            .map_err(|e| DispatchError::io("socket", e))?;
        socket.set_reuse_address(true).map_err(|e| DispatchError::io("reuse", e))?;
        socket.bind(&SocketAddr::V4(local).into()).map_err(|e| DispatchError::io("bind", e))?;
        socket
            .connect_timeout(&server.into(), Duration::from_millis(500))
            .map_err(|e| DispatchError::io("connect", e))?;
        let mut stream: std::net::TcpStream = socket.into();
        stream.set_read_timeout(Some(Duration::from_secs(2))).map_err(|e| DispatchError::io("timeout", e))?;
        let mut text = String::new();
        stream.read_to_string(&mut text).map_err(|e| DispatchError::io("read", e))?;
        Ok(text)
    })?)
}

// Goal: the switch passes unknown flows to the dispatcher, forwards a steered flow to the
// backend that owns the VIP on its loopback, drops a blocked flow, and forgets removed flows.
// Method: banner servers on VIP:7000 in disp and be1; connections from fixed client ports.
#[test]
fn the_switch_passes_forwards_and_blocks_flows() -> anyhow::Result<()> {
    let lab = Lab::up_owned(LabSpec { name: common::unique_lab_name("st"), ..LabSpec::default() })?;
    let ports: Vec<String> = lab.clients().iter().map(|c| c.switch_port.clone()).collect();
    let switch = Switch::attach(&lab.switch_namespace(), &ports)?;
    let service = SocketAddr::from((VIP, 7000));
    serve_banners(&lab.dispatcher().namespace, service, "disp")?;
    serve_banners(&lab.backend(1).namespace, service, "be1")?;
    let client = lab.client(1);
    let from = |port| SocketAddrV4::new(client.address, port);

    assert_eq!(banner_from(&client.namespace, from(40001), service)?, "disp");
    switch.set(from(40002), Action::Forward { mac: lab.backend(1).mac, drop_per_million: 0 })?;
    assert_eq!(banner_from(&client.namespace, from(40002), service)?, "be1");
    switch.set(from(40003), Action::Block)?;
    assert!(banner_from(&client.namespace, from(40003), service).is_err(), "a blocked flow must not connect");
    let stats = switch.stats()?;
    assert!(stats.forwarded > 0 && stats.blocked > 0, "{stats:?}");
    assert_eq!(switch.flow_count()?, 2);
    switch.remove(from(40002))?;
    switch.remove(from(40003))?;
    switch.remove(from(40003))?;
    assert_eq!(switch.flow_count()?, 0);
    assert_eq!(banner_from(&client.namespace, from(40004), service)?, "disp");
    Ok(())
}

/// Connects from `local` inside `namespace` to `server` and returns the connection.
fn connect_from(namespace: &str, local: SocketAddrV4, server: SocketAddr) -> anyhow::Result<std::net::TcpStream> {
    Ok(netns::run_in(namespace, move || {
        let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
            .map_err(|e| DispatchError::io("socket", e))?;
        socket.set_reuse_address(true).map_err(|e| DispatchError::io("reuse", e))?;
        socket.bind(&SocketAddr::V4(local).into()).map_err(|e| DispatchError::io("bind", e))?;
        socket.connect_timeout(&server.into(), Duration::from_secs(2)).map_err(|e| DispatchError::io("connect", e))?;
        socket.set_nodelay(true).map_err(|e| DispatchError::io("nodelay", e))?;
        Ok(std::net::TcpStream::from(socket))
    })?)
}

// Goal: for a tracked flow the switch counts exactly the segments the owner's socket receives
// (what an owner waits for before giving a connection up), and a blocked segment is not
// counted as delivered. Method: a connection from a client to the dispatcher host; 20 one-byte
// writes, each read before the next; compare the switch's count with the server socket's
// tcpi_segs_in; then block the flow and write once more.
#[test]
fn the_switch_counts_the_segments_it_lets_through() -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::fd::AsRawFd;
    let lab = Lab::up_owned(LabSpec { name: common::unique_lab_name("sc"), ..LabSpec::default() })?;
    let ports: Vec<String> = lab.clients().iter().map(|c| c.switch_port.clone()).collect();
    let switch = Switch::attach(&lab.switch_namespace(), &ports)?;
    let service = SocketAddr::from((VIP, 7001));
    let listener = netns::run_in(&lab.dispatcher().namespace, move || {
        TcpListener::bind(service).map_err(|e| DispatchError::io("bind", e))
    })?;
    let client_address = SocketAddrV4::new(lab.client(1).address, 40010);
    let mut client = connect_from(&lab.client(1).namespace, client_address, service)?;
    let (mut server, _) = listener.accept()?;
    std::thread::sleep(Duration::from_millis(50));
    switch.track(client_address)?;
    let base = bypass_dispatch::handover::segments_received(server.as_raw_fd())?;
    let mut byte = [0u8; 1];
    for _ in 0..20 {
        client.write_all(b"x")?;
        server.read_exact(&mut byte)?;
    }
    std::thread::sleep(Duration::from_millis(50));
    let received = u64::from(bypass_dispatch::handover::segments_received(server.as_raw_fd())?.wrapping_sub(base));
    let delivered = switch.delivered(client_address)?;
    assert!(received >= 20, "the server socket received {received} segments");
    assert_eq!(delivered, received, "the switch's count must match the owner's socket");

    switch.set(client_address, Action::Block)?;
    client.write_all(b"y")?;
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(switch.delivered(client_address)?, delivered, "a blocked segment is not delivered");
    server.set_nonblocking(true)?;
    assert!(server.read(&mut byte).is_err(), "the blocked byte must not arrive");
    assert_eq!(switch.tracked_count()?, 1);
    switch.untrack(client_address)?;
    switch.remove(client_address)?;
    assert_eq!(switch.tracked_count()?, 0);
    Ok(())
}
