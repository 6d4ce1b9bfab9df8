//! The programs load and attach on this kernel, and a socket pair round-trips through the maps.

use bypass_fastpath::FastPath;

#[test]
fn programs_load_and_sockets_enter_the_maps() {
    // Goal: the verifier accepts both programs and the maps take real sockets by cookie.
    // Method: load, put a connected loopback socket in as a client and its peer as a server.
    let fast = FastPath::load().unwrap_or_else(|error| panic!("fast path must load as root: {error}"));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
    let client = std::net::TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
    let (server, _) = listener.accept().expect("accept");
    let pool = fast.pool_index("test").expect("a pool index");
    let client_slot = fast.add_client(&client, pool, 1 << 20, 0).expect("client enters the map");
    let server_slot = fast.add_server(&server, pool).expect("server enters the map");
    assert!(fast.link(client_slot).is_none());
    fast.lend(server_slot, 0);
    assert_eq!(fast.reclaim(pool), Some(server_slot), "a lent server can be taken back");
    assert!(fast.reclaim(pool).is_none(), "and only once");
    assert_eq!(fast.program_stats().len(), 2);
    fast.remove_client(client_slot);
    fast.remove_server(server_slot);
}

#[test]
fn status_finds_the_loaded_programs_maps_and_counters() {
    // Goal: `bypass fastpath status` sees what this process loaded. Method: load, then read the
    // kernel's program and map lists by name, as another process would.
    let fast = FastPath::load().unwrap_or_else(|error| panic!("fast path must load as root: {error}"));
    let status = bypass_fastpath::status::status().expect("status reads the kernel's lists");
    for (name, id) in fast.program_stats().iter().map(|stats| (stats.name, stats.id)) {
        assert!(status.programs.iter().any(|p| p.name == name && p.id == id), "{name} {id} missing: {status:?}");
    }
    for map in ["fp_clients", "fp_servers", "fp_slots", "fp_counters", "fp_pool_counts"] {
        assert!(status.maps.iter().any(|m| m.name == map), "{map} missing: {status:?}");
    }
    assert!(status.counters.is_some(), "the counters map is read");
    let report = status.render();
    assert!(report.contains("fp_client") && report.contains("transactions released in the kernel"), "{report}");
}
