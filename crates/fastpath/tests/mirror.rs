//! Workload mirroring in the real kernel: plain std TCP sockets on loopback play client, pooler,
//! shadow server and the pooler's shadow connection; the tc program and the verdicts are real.

use std::io::{ErrorKind, Read, Write};
use std::mem::size_of;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, AsRawFd};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bypass_fastpath::{FastPath, FastPathError, MirrorHandle};

/// How long a reader waits for bytes that must arrive, and how long it listens for bytes that
/// must not (the mirror path is a softirq and a kworker away: milliseconds at most).
const ARRIVAL_TIMEOUT: Duration = Duration::from_secs(20);
const SILENCE: Duration = Duration::from_millis(300);
/// The MTU of a fresh lo (the host's default).
const LOOPBACK_MTU: i32 = 65536;

fn fast_path() -> FastPath {
    let fast = FastPath::load().unwrap_or_else(|error| panic!("fast path must load as root: {error}"));
    fast.enable_mirroring("lo").unwrap_or_else(|error| panic!("mirroring must attach to lo: {error}"));
    fast
}

/// A client connected to a "pooler" listener, and the pooler's accepted end.
struct Flow {
    client: TcpStream,
    pooler: TcpStream,
}

impl Flow {
    fn open() -> Flow {
        let listener = TcpListener::bind("127.0.0.1:0").expect("pooler listens");
        let client = TcpStream::connect(listener.local_addr().expect("address")).expect("client connects");
        let (pooler, _) = listener.accept().expect("pooler accepts");
        Flow { client, pooler }
    }

    fn addresses(&self) -> (SocketAddr, SocketAddr) {
        (self.client.local_addr().expect("client address"), self.client.peer_addr().expect("pooler address"))
    }
}

/// The pooler's connection to a shadow server ("shadow") and the server's accepted end.
struct Shadow {
    socket: TcpStream,
    server: TcpStream,
}

impl Shadow {
    fn open() -> Shadow {
        let listener = TcpListener::bind("127.0.0.1:0").expect("shadow server listens");
        let socket = TcpStream::connect(listener.local_addr().expect("address")).expect("shadow connects");
        let (server, _) = listener.accept().expect("shadow server accepts");
        Shadow { socket, server }
    }
}

fn mirror(fast: &FastPath, flow: &Flow, shadow: &Shadow) -> MirrorHandle {
    let (client, pooler) = flow.addresses();
    fast.add_mirror(client, pooler, shadow.socket.as_fd()).expect("mirror added")
}

/// Deterministic message sizes from 1 B to 64 KiB, with the sizes around loopback segment and
/// page boundaries that split a message across skbs.
fn message_sizes(count: usize, seed: u64) -> Vec<usize> {
    let edges = [1, 2, 5, 1447, 1448, 1449, 4095, 4096, 4097, 16383, 16384, 16385, 32767, 32768, 65535, 65536];
    let mut state = seed | 1;
    (0..count)
        .map(|index| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            if index % 4 == 0 {
                edges[(state as usize) % edges.len()]
            } else {
                1 + (state as usize) % 65536
            }
        })
        .collect()
}

fn message_stream(sizes: &[usize], tag: u8) -> Vec<u8> {
    let mut stream = Vec::with_capacity(sizes.iter().sum());
    for (index, &size) in sizes.iter().enumerate() {
        stream.extend((0..size).map(|offset| tag ^ (index as u8).wrapping_mul(31) ^ (offset as u8)));
    }
    stream
}

/// Writes the stream one message per write, as a client sends queries.
fn send_messages(mut client: TcpStream, sizes: Vec<usize>, stream: Vec<u8>) -> JoinHandle<TcpStream> {
    std::thread::spawn(move || {
        let mut start = 0;
        for size in sizes {
            client.write_all(&stream[start..start + size]).expect("client writes");
            start += size;
        }
        client
    })
}

/// Reads exactly `length` bytes, or what arrived before the timeout.
fn read_exactly(socket: &mut TcpStream, length: usize) -> Vec<u8> {
    let deadline = Instant::now() + ARRIVAL_TIMEOUT;
    let mut received = vec![0u8; length];
    let mut filled = 0;
    socket.set_read_timeout(Some(Duration::from_millis(200))).expect("read timeout");
    while filled < length && Instant::now() < deadline {
        match socket.read(&mut received[filled..]) {
            Ok(0) => break,
            Ok(read) => filled += read,
            Err(error) if matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(error) => panic!("read failed: {error}"),
        }
    }
    received.truncate(filled);
    received
}

/// Bytes that arrive within SILENCE (none expected).
fn read_stray(socket: &mut TcpStream) -> usize {
    socket.set_read_timeout(Some(SILENCE)).expect("read timeout");
    let mut buffer = [0u8; 4096];
    match socket.read(&mut buffer) {
        Ok(read) => read,
        Err(error) if matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => 0,
        Err(error) => panic!("read failed: {error}"),
    }
}

fn assert_same_stream(received: &[u8], expected: &[u8], who: &str) {
    assert_eq!(received.len(), expected.len(), "{who} received {} of {} bytes", received.len(), expected.len());
    if let Some(at) = received.iter().zip(expected).position(|(a, b)| a != b) {
        panic!("{who}: first differing byte at offset {at} of {}", expected.len());
    }
}

#[test]
fn a_thousand_messages_reach_pooler_and_shadow_byte_exact() {
    // Goal: the original stream reaches the pooler untouched and the shadow gets the identical
    // stream. Method: 1,000 writes of 1 B…64 KiB on a mirrored loopback flow, both ends read.
    in_network_namespace(LOOPBACK_MTU, move || {
        let fast = fast_path();
        let flow = Flow::open();
        let mut shadow = Shadow::open();
        let handle = mirror(&fast, &flow, &shadow);
        let sizes = message_sizes(1000, 0x5eed);
        let stream = message_stream(&sizes, 0xa5);
        let writer = send_messages(flow.client.try_clone().expect("clone"), sizes, stream.clone());
        let mut pooler = flow.pooler.try_clone().expect("clone");
        let pooler_reader = std::thread::spawn(move || read_exactly(&mut pooler, stream.len()));
        let expected = message_stream(&message_sizes(1000, 0x5eed), 0xa5);
        let at_shadow = read_exactly(&mut shadow.server, expected.len());
        writer.join().expect("writer");
        assert_same_stream(&pooler_reader.join().expect("pooler reader"), &expected, "pooler");
        let state = format!("shadow server ({:?})", fast.mirror_counters());
        assert_same_stream(&at_shadow, &expected, &state);
        assert!(fast.mirror_intact(&handle), "no gap in the shadow's stream");
        let counters = fast.mirror_counters();
        assert_eq!(counters.bytes_mirrored, expected.len() as u64, "{counters:?}");
        assert_eq!(counters.desyncs, 0, "{counters:?}");
        fast.remove_mirror(handle);
    });
}

#[test]
fn shadow_replies_are_dropped_in_the_kernel_and_counted() {
    // Goal: the shadow's answers never reach user space. Method: the shadow server writes
    // 100 KiB to the mirrored shadow socket; a read of the socket gets nothing, the counter
    // counts every byte.
    in_network_namespace(LOOPBACK_MTU, move || {
        let fast = fast_path();
        let flow = Flow::open();
        let mut shadow = Shadow::open();
        let handle = mirror(&fast, &flow, &shadow);
        let reply = vec![b'R'; 100 * 1024];
        shadow.server.write_all(&reply).expect("shadow server replies");
        let deadline = Instant::now() + ARRIVAL_TIMEOUT;
        while fast.mirror_counters().shadow_reply_bytes_dropped < reply.len() as u64 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(fast.mirror_counters().shadow_reply_bytes_dropped, reply.len() as u64);
        assert_eq!(read_stray(&mut shadow.socket), 0, "user space must read none of the shadow's replies");
        fast.remove_mirror(handle);
    });
}

#[test]
fn two_mirrored_clients_do_not_mix_and_an_unmirrored_flow_is_untouched() {
    // Goal: each shadow gets its own client's stream only, and a flow without a mirror is
    // neither cloned nor disturbed. Method: three clients write at once (two mirrored to
    // their own shadows, one not); every end compares bytes; the counters add up exactly.
    in_network_namespace(LOOPBACK_MTU, move || {
        let fast = fast_path();
        let flows = [Flow::open(), Flow::open(), Flow::open()];
        let mut shadows = [Shadow::open(), Shadow::open()];
        let handles = [mirror(&fast, &flows[0], &shadows[0]), mirror(&fast, &flows[1], &shadows[1])];
        let sizes: Vec<Vec<usize>> = (0..3).map(|seed| message_sizes(200, 77 + seed)).collect();
        let streams: Vec<Vec<u8>> = (0..3).map(|tag| message_stream(&sizes[tag], tag as u8 * 60)).collect();
        let writers: Vec<_> = (0..3)
            .map(|i| send_messages(flows[i].client.try_clone().expect("clone"), sizes[i].clone(), streams[i].clone()))
            .collect();
        let readers: Vec<_> = (0..3)
            .map(|i| {
                let (mut pooler, length) = (flows[i].pooler.try_clone().expect("clone"), streams[i].len());
                std::thread::spawn(move || read_exactly(&mut pooler, length))
            })
            .collect();
        for (i, shadow) in shadows.iter_mut().enumerate() {
            let at_shadow = read_exactly(&mut shadow.server, streams[i].len());
            let state = format!("shadow server ({:?})", fast.mirror_counters());
            assert_same_stream(&at_shadow, &streams[i], &state);
        }
        for (i, (writer, reader)) in writers.into_iter().zip(readers).enumerate() {
            writer.join().expect("writer");
            assert_same_stream(&reader.join().expect("reader"), &streams[i], "pooler");
        }
        for shadow in &mut shadows {
            assert_eq!(read_stray(&mut shadow.server), 0, "a shadow received bytes of another client");
        }
        let counters = fast.mirror_counters();
        assert_eq!(counters.bytes_mirrored, (streams[0].len() + streams[1].len()) as u64, "{counters:?}");
        for handle in handles {
            fast.remove_mirror(handle);
        }
    });
}

#[test]
fn after_remove_mirror_new_bytes_are_not_mirrored() {
    // Goal: remove_mirror stops the copy at once. Method: send a batch, see it at the shadow,
    // remove the mirror, send another: the pooler gets both, the shadow only the first.
    in_network_namespace(LOOPBACK_MTU, move || {
        let fast = fast_path();
        let mut flow = Flow::open();
        let mut shadow = Shadow::open();
        let handle = mirror(&fast, &flow, &shadow);
        // The pooler reads while the client writes: a batch larger than the socket buffers would
        // otherwise stall the client.
        let first = message_stream(&message_sizes(50, 9), 1);
        let writer = send_messages(flow.client.try_clone().expect("clone"), vec![first.len()], first.clone());
        assert_same_stream(&read_exactly(&mut flow.pooler, first.len()), &first, "pooler");
        assert_same_stream(&read_exactly(&mut shadow.server, first.len()), &first, "shadow server");
        writer.join().expect("writer");
        fast.remove_mirror(handle);
        let second = message_stream(&message_sizes(50, 10), 2);
        let writer = send_messages(flow.client.try_clone().expect("clone"), vec![second.len()], second.clone());
        assert_same_stream(&read_exactly(&mut flow.pooler, second.len()), &second, "pooler");
        writer.join().expect("writer");
        assert_eq!(read_stray(&mut shadow.server), 0, "bytes after remove_mirror reached the shadow");
        assert_eq!(fast.mirror_counters().bytes_mirrored, first.len() as u64);
    });
}

#[test]
fn a_client_forwarded_by_the_kernel_fast_path_is_mirrored_too() {
    // Goal: mirroring runs at tc, before the socket's own sk_skb program, so a client whose
    // queries the kernel fast path forwards to a pooled server is mirrored as well. Method: the
    // pooler's end of the client in fp_clients, a lent server in fp_servers; 300 Query messages
    // reach the "PostgreSQL" end through the kernel and the shadow server gets the same bytes.
    in_network_namespace(LOOPBACK_MTU, move || {
        let fast = fast_path();
        let flow = Flow::open();
        let mut postgres = Shadow::open(); // the pooler's server connection and its PostgreSQL end
        let mut shadow = Shadow::open();
        let pool = fast.pool_index("mirrored").expect("a pool index");
        let client_slot = fast.add_client(&flow.pooler, pool, 1 << 20, 0).expect("client enters the fast path");
        let server_slot = fast.add_server(&postgres.socket, pool).expect("server enters the fast path");
        fast.lend(server_slot, 0);
        let handle = mirror(&fast, &flow, &shadow);
        let queries: Vec<u8> = (0..300).flat_map(|index| query_message(&format!("SELECT {index}"))).collect();
        let writer = send_messages(flow.client.try_clone().expect("clone"), vec![queries.len()], queries.clone());
        assert_same_stream(&read_exactly(&mut postgres.server, queries.len()), &queries, "PostgreSQL via the kernel");
        assert_same_stream(&read_exactly(&mut shadow.server, queries.len()), &queries, "shadow server");
        writer.join().expect("writer");
        assert_eq!(fast.counters().bytes_to_servers, queries.len() as u64, "the fast path forwarded every byte");
        fast.remove_mirror(handle);
        fast.remove_client(client_slot);
        fast.remove_server(server_slot);
    });
}

/// A simple-protocol Query message.
fn query_message(sql: &str) -> Vec<u8> {
    let length = u32::try_from(4 + sql.len() + 1).expect("short query");
    [&[b'Q'][..], &length.to_be_bytes(), sql.as_bytes(), &[0]].concat()
}

#[test]
fn ipv6_flows_and_mirrors_before_enabling_get_typed_errors() {
    // Goal: what the kernel cannot mirror is refused with a typed error, not a silent no-op.
    // Method: add_mirror before enable_mirroring, an IPv6 flow, a missing interface, one flow
    // mirrored twice.
    let fast = FastPath::load().unwrap_or_else(|error| panic!("fast path must load as root: {error}"));
    let shadow = Shadow::open();
    let v4: SocketAddr = "127.0.0.1:5000".parse().expect("address");
    let v6: SocketAddr = "[::1]:5000".parse().expect("address");
    let before = fast.add_mirror(v4, v4, shadow.socket.as_fd());
    assert!(matches!(before, Err(FastPathError::MirrorNotEnabled)), "{before:?}");
    fast.enable_mirroring("lo").expect("enable");
    fast.enable_mirroring("lo").expect("enabling twice is harmless");
    let ipv6 = fast.add_mirror(v6, v4, shadow.socket.as_fd());
    assert!(matches!(ipv6, Err(FastPathError::MirrorIpv6(_))), "{ipv6:?}");
    let missing = fast.enable_mirroring("no-such-if0");
    assert!(matches!(missing, Err(FastPathError::MirrorInterface { .. })), "{missing:?}");
    let mapped: SocketAddr = "[::ffff:127.0.0.1]:5000".parse().expect("address");
    let handle = fast.add_mirror(mapped, v4, shadow.socket.as_fd()).expect("IPv4-mapped counts as IPv4");
    let twice = fast.add_mirror(v4, v4, shadow.socket.as_fd());
    assert!(matches!(twice, Err(FastPathError::MirrorExists(_))), "{twice:?}");
    fast.remove_mirror(handle);
}

#[test]
fn dropping_the_fast_path_detaches_the_tc_program() {
    // Goal: no program is left on lo after the FastPath is gone. Method: note the tc program's
    // id, drop the FastPath, and look for that id among the programs still loaded.
    let fast = fast_path();
    let stats = fast.mirror_program_stats();
    let tc_id = stats.iter().find(|program| program.name == "fp_mirror_tc").expect("tc program loaded").id;
    assert!(loaded(tc_id), "the tc program is loaded while the FastPath lives");
    drop(fast);
    let deadline = Instant::now() + ARRIVAL_TIMEOUT;
    while loaded(tc_id) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!loaded(tc_id), "the tc program outlived its FastPath");
}

#[test]
fn gso_super_packets_on_a_small_mtu_loopback_are_mirrored_byte_exact() {
    // Goal: TCP super-packets (GSO skbs larger than the MTU) are mirrored, not skipped or cut.
    // Method: in a fresh network namespace whose lo has MTU 1500, 64 KiB writes travel as GSO
    // skbs; the shadow must get the same bytes, in datagrams that carry more than one MTU each.
    let (expected, at_shadow, at_pooler, counters) = in_network_namespace(1500, || {
        let fast = fast_path();
        let flow = Flow::open();
        let mut shadow = Shadow::open();
        let handle = mirror(&fast, &flow, &shadow);
        let sizes = vec![65536; 64];
        let stream = message_stream(&sizes, 0x3c);
        let writer = send_messages(flow.client.try_clone().expect("clone"), sizes, stream.clone());
        let mut pooler = flow.pooler.try_clone().expect("clone");
        let length = stream.len();
        let pooler_reader = std::thread::spawn(move || read_exactly(&mut pooler, length));
        let at_shadow = read_exactly(&mut shadow.server, stream.len());
        writer.join().expect("writer");
        let at_pooler = pooler_reader.join().expect("pooler reader");
        fast.remove_mirror(handle);
        (stream, at_shadow, at_pooler, fast.mirror_counters())
    });
    assert_same_stream(&at_pooler, &expected, "pooler");
    assert_same_stream(&at_shadow, &expected, "shadow server");
    let per_datagram = counters.bytes_mirrored / counters.segments_mirrored.max(1);
    assert!(per_datagram > 1500, "no GSO super-packet was mirrored whole: {counters:?}");
}

#[test]
fn retransmitted_bytes_are_skipped_and_a_gap_cuts_the_shadow_off() {
    // Goal: segment-level duplicates never reach the shadow twice, and a gap stops the shadow
    // instead of feeding it a corrupt stream. Method: inject, with a raw socket, copies of the
    // client's segments (TCP checksum deliberately wrong, so the pooler's TCP discards them while
    // the tc program, which runs first, sees them): one repeating sent bytes, one ahead of the
    // stream; real writes around them show what the shadow gets.
    in_network_namespace(LOOPBACK_MTU, move || {
        let fast = fast_path();
        let mut flow = Flow::open();
        let mut shadow = Shadow::open();
        let handle = mirror(&fast, &flow, &shadow);
        let (first, second, third) = (vec![b'1'; 3000], vec![b'2'; 3000], vec![b'3'; 3000]);
        flow.client.write_all(&first).expect("first batch");
        assert_same_stream(&read_exactly(&mut shadow.server, first.len()), &first, "shadow server");
        let next = next_send_sequence(&flow.client);
        inject_segment(&flow, next.wrapping_sub(100), &first[..100]);
        flow.client.write_all(&second).expect("second batch");
        assert_same_stream(&read_exactly(&mut shadow.server, second.len()), &second, "shadow server");
        assert!(fast.mirror_intact(&handle), "a duplicate is not a gap");
        assert_eq!(fast.mirror_counters().duplicate_bytes, 100);
        let next = next_send_sequence(&flow.client);
        inject_segment(&flow, next.wrapping_add(1000), b"from the future");
        flow.client.write_all(&third).expect("third batch");
        let all = [first.as_slice(), &second, &third].concat();
        assert_same_stream(&read_exactly(&mut flow.pooler, all.len()), &all, "pooler");
        assert_eq!(read_stray(&mut shadow.server), 0, "the shadow got bytes after a gap");
        assert!(!fast.mirror_intact(&handle), "the gap is reported");
        assert_eq!(fast.mirror_counters().desyncs, 1);
        fast.remove_mirror(handle);
    });
}

#[test]
fn a_segment_overlapping_mirrored_bytes_is_trimmed_to_its_new_bytes() {
    // Goal: a segment that repeats some mirrored bytes and carries new ones gives the shadow only
    // the new ones, wherever the overlap ends. Method: inject (bad TCP checksum: the pooler never
    // sees it) 10,000 repeated bytes (more than one sk_skb pop can trim) + 10 new ones, then let
    // the client write 3,000 bytes at the sequence the injected bytes already covered: the shadow
    // must get first + 10 new bytes + the real write without its first 10 bytes, exactly.
    in_network_namespace(LOOPBACK_MTU, move || {
        let fast = fast_path();
        let mut flow = Flow::open();
        let mut shadow = Shadow::open();
        let handle = mirror(&fast, &flow, &shadow);
        let (first, second) = (vec![b'1'; 20_000], vec![b'2'; 3000]);
        flow.client.write_all(&first).expect("first batch");
        assert_same_stream(&read_exactly(&mut shadow.server, first.len()), &first, "shadow server");
        let next = next_send_sequence(&flow.client);
        let overlapping = [&first[first.len() - 10_000..], b"ABCDEFGHIJ"].concat();
        inject_segment(&flow, next.wrapping_sub(10_000), &overlapping);
        flow.client.write_all(&second).expect("second batch");
        let expected = [&b"ABCDEFGHIJ"[..], &second[10..]].concat();
        assert_same_stream(&read_exactly(&mut shadow.server, expected.len()), &expected, "shadow server");
        assert_eq!(read_stray(&mut shadow.server), 0, "the shadow got more than the new bytes");
        assert_eq!(fast.mirror_counters().duplicate_bytes, 10_010);
        assert!(fast.mirror_intact(&handle));
        fast.remove_mirror(handle);
    });
}

#[test]
fn datagrams_forged_by_a_local_process_reach_no_shadow() {
    // Goal: the UDP socket takes datagrams from any local process, but only the tc program knows
    // a shadow's random 64-bit id, so forged datagrams are dropped and the mirror goes on intact.
    // Method: find the FastPath's UDP port (the only UDP socket in a fresh namespace), send it
    // datagrams with made-up ids, then check the shadow got only the client's real bytes.
    in_network_namespace(LOOPBACK_MTU, move || {
        let fast = fast_path();
        let mut flow = Flow::open();
        let mut shadow = Shadow::open();
        let handle = mirror(&fast, &flow, &shadow);
        let port = only_udp_port();
        let forger = std::net::UdpSocket::bind("127.0.0.1:0").expect("forger binds");
        for forged_id in [0u64, 1, u64::MAX, 0x4d49_5252_0000_0001] {
            let datagram = [&forged_id.to_le_bytes()[..], &[0u8; 4], b"DROP TABLE accounts;"].concat();
            forger.send_to(&datagram, ("127.0.0.1", port)).expect("forged datagram sent");
        }
        forger.send_to(b"short", ("127.0.0.1", port)).expect("short datagram sent");
        let real = vec![b'q'; 5000];
        flow.client.write_all(&real).expect("client writes");
        assert_same_stream(&read_exactly(&mut shadow.server, real.len()), &real, "shadow server");
        assert_eq!(read_stray(&mut shadow.server), 0, "a forged datagram reached the shadow");
        assert_eq!(fast.mirror_counters().drops_no_shadow, 5, "{:?}", fast.mirror_counters());
        assert!(fast.mirror_intact(&handle));
        let _ = read_exactly(&mut flow.pooler, real.len());
        fast.remove_mirror(handle);
    });
}

/// The local port of the only UDP socket in this thread's network namespace.
fn only_udp_port() -> u16 {
    let table = std::fs::read_to_string("/proc/thread-self/net/udp").expect("UDP table");
    let ports: Vec<u16> = table
        .lines()
        .skip(1)
        .filter_map(|line| line.split_whitespace().nth(1)?.split(':').nth(1).map(str::to_string))
        .map(|hex| u16::from_str_radix(&hex, 16).expect("hex port"))
        .collect();
    assert_eq!(ports.len(), 1, "exactly one UDP socket expected: {ports:?}");
    ports[0]
}

/// The sequence number of the next byte the socket will send, read in TCP repair mode.
fn next_send_sequence(socket: &TcpStream) -> u32 {
    let fd = socket.as_raw_fd();
    let set = |option: libc::c_int, value: libc::c_int| {
        // SAFETY: setsockopt reads one c_int from `value`.
        let result = unsafe {
            libc::setsockopt(fd, libc::IPPROTO_TCP, option, (&raw const value).cast(), size_of::<libc::c_int>() as _)
        };
        assert_eq!(result, 0, "setsockopt {option}: {}", std::io::Error::last_os_error());
    };
    const TCP_SEND_QUEUE: libc::c_int = 2;
    set(libc::TCP_REPAIR, 1);
    set(libc::TCP_REPAIR_QUEUE, TCP_SEND_QUEUE);
    let mut sequence: u32 = 0;
    let mut length = size_of::<u32>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `length` bytes into `sequence`, which is that large.
    let result = unsafe {
        libc::getsockopt(fd, libc::IPPROTO_TCP, libc::TCP_QUEUE_SEQ, (&raw mut sequence).cast(), &mut length)
    };
    assert_eq!(result, 0, "TCP_QUEUE_SEQ: {}", std::io::Error::last_os_error());
    set(libc::TCP_REPAIR, 0);
    sequence
}

/// Sends an IPv4 TCP segment of the flow's client with `payload` at `sequence` and a wrong TCP
/// checksum, through a raw socket (it passes lo like the client's own segments).
fn inject_segment(flow: &Flow, sequence: u32, payload: &[u8]) {
    let (client, pooler) = flow.addresses();
    let (SocketAddr::V4(client), SocketAddr::V4(pooler)) = (client, pooler) else { panic!("IPv4 flow") };
    let mut packet = Vec::with_capacity(40 + payload.len());
    packet.extend([0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, libc::IPPROTO_TCP as u8, 0, 0]); // length, checksum: kernel
    packet.extend(client.ip().octets());
    packet.extend(pooler.ip().octets());
    packet.extend(client.port().to_be_bytes());
    packet.extend(pooler.port().to_be_bytes());
    packet.extend(sequence.to_be_bytes());
    packet.extend([0, 0, 0, 0, 0x50, 0x18, 0xff, 0xff, 0xde, 0xad, 0, 0]); // ack 0, ACK|PSH, bad checksum
    packet.extend(payload);
    // SAFETY: a raw socket (IP header included), closed below; sendto reads `packet` and the
    // sockaddr_in we pass, both alive for the call.
    unsafe {
        let socket = libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_RAW);
        assert!(socket >= 0, "raw socket: {}", std::io::Error::last_os_error());
        let mut target: libc::sockaddr_in = std::mem::zeroed();
        target.sin_family = libc::AF_INET as libc::sa_family_t;
        target.sin_addr.s_addr = u32::from_ne_bytes(pooler.ip().octets());
        let sent = libc::sendto(
            socket,
            packet.as_ptr().cast(),
            packet.len(),
            0,
            (&raw const target).cast(),
            size_of::<libc::sockaddr_in>() as libc::socklen_t,
        );
        assert_eq!(sent, packet.len() as isize, "sendto: {}", std::io::Error::last_os_error());
        libc::close(socket);
    }
    // The injected segment reaches the shadow path in the same softirq; give it a moment.
    std::thread::sleep(Duration::from_millis(50));
}

/// Runs `body` on a thread in a new network namespace (namespaces are per thread, and threads
/// it spawns inherit it) whose lo is up with the given MTU and has RPS on every CPU.
///
/// Why RPS: loopback hands each segment to the backlog of the CPU that transmits it, and TCP
/// transmits a flow's segments from several CPUs (the writer, and softirqs processing ACKs), so
/// under load a flow's segments, and their clones, can be delivered out of order. TCP reorders
/// them for the pooler; a segment-level mirror cannot and cuts the shadow off (`desyncs`, see
/// the gap test). These tests send megabytes in bulk, which on a loaded machine reorders now
/// and then; RPS steers every packet of a flow to one CPU's backlog, which is FIFO, and keeps
/// them deterministic (see the crate docs for its cost). The namespace keeps the host's lo
/// untouched.
fn in_network_namespace<T: Send + 'static>(mtu: i32, body: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(move || {
        // SAFETY: unshare takes no pointers; CLONE_NEWNET moves only this thread.
        assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0, "unshare: {}", std::io::Error::last_os_error());
        set_loopback(mtu);
        enable_loopback_rps();
        body()
    })
    .join()
    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// Writes every CPU into this namespace's lo rps_cpus. sysfs shows the namespace of whoever
/// mounted it, so a child (which inherits this thread's network namespace) mounts a fresh sysfs
/// in a private mount namespace of its own.
fn enable_loopback_rps() {
    let cpus = std::thread::available_parallelism().map_or(1, |count| count.get()).min(32);
    let mask = format!("{:x}", (1u64 << cpus) - 1);
    let script = format!("mount -t sysfs sysfs /sys && echo {mask} > /sys/class/net/lo/queues/rx-0/rps_cpus");
    let status = std::process::Command::new("unshare")
        .args(["--mount", "sh", "-c", &script])
        .status()
        .expect("unshare (util-linux) runs");
    assert!(status.success(), "setting rps_cpus on the namespace's lo failed");
}

fn set_loopback(mtu: i32) {
    // SAFETY: a plain socket for the interface ioctls, closed below.
    let socket = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0) };
    assert!(socket >= 0, "socket: {}", std::io::Error::last_os_error());
    // SAFETY: ifreq is plain data; zero is a valid value.
    let mut request: libc::ifreq = unsafe { std::mem::zeroed() };
    for (slot, byte) in request.ifr_name.iter_mut().zip(b"lo\0") {
        *slot = *byte as libc::c_char;
    }
    request.ifr_ifru.ifru_mtu = mtu;
    // SAFETY: SIOCSIFMTU and SIOCSIFFLAGS read the ifreq we pass, which outlives the calls.
    unsafe {
        assert_eq!(libc::ioctl(socket, libc::SIOCSIFMTU, &request), 0, "MTU: {}", std::io::Error::last_os_error());
        request.ifr_ifru.ifru_flags = (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        assert_eq!(libc::ioctl(socket, libc::SIOCSIFFLAGS, &request), 0, "up: {}", std::io::Error::last_os_error());
        libc::close(socket);
    }
}

fn loaded(id: u32) -> bool {
    aya::programs::loaded_programs().flatten().any(|info| info.id() == id)
}
