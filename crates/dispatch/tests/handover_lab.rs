//! Hand-over end to end in the lab: real namespaces, shaped links, the eBPF switch, stock
//! PostgreSQL behind agents, the dispatcher on the VIP (needs root, as in CI).

mod common;

use std::time::Duration;

use bypass_dispatch::config::Policy;
use bypass_lab::loadgen::{self, LoadSpec, Target};
use common::LabCluster;

fn load(cluster: &LabCluster, size: u64, connections_per_client: usize, queries: u64) -> LoadSpec {
    LoadSpec {
        targets: cluster
            .lab
            .clients()
            .iter()
            .map(|c| Target {
                namespace: Some(c.namespace.clone()),
                address: cluster.service(),
                connections: connections_per_client,
            })
            .collect(),
        size,
        warmup: Duration::ZERO,
        duration: Duration::ZERO,
        queries_min: queries,
        queries_max: queries,
        login: common::login(),
        read_timeout: Duration::from_secs(30),
    }
}

// Goal: with hand-over always on, every answer reaches the client byte-exact straight from the
// backend and the connection comes home each time; the steering table ends empty.
// Method: 2 clients × 1 connection × 20 queries of 1 MB; count hand-overs and hand-backs.
#[test]
fn answers_arrive_byte_exact_over_handed_over_connections() -> anyhow::Result<()> {
    let cluster = LabCluster::start("ha", Policy::Handover, 1)?;
    let report = loadgen::run(&load(&cluster, 1 << 20, 1, 20))?;
    assert_eq!(report.errors, 0, "{:?}", report.error_samples);
    assert_eq!(report.payload_bytes, 40 << 20);
    let stats = (cluster.stat(|s| &s.handovers), cluster.stat(|s| &s.handbacks), cluster.stat(|s| &s.import_failures));
    // An import the agent refuses (rare, under load) falls back to relaying: correct, not a move.
    assert_eq!(stats.0 + stats.2, 40, "handovers, handbacks, import failures: {stats:?}");
    assert!(stats.2 <= 2, "too many imports failed: {stats:?}");
    // The last answer of each connection is complete before its connection comes home.
    // A client that says goodbye while away closes its connection there: it cannot move back.
    let home = || cluster.stat(|s| &s.handbacks) + cluster.stat(|s| &s.closed_while_away);
    common::wait_until(Duration::from_secs(5), "the last hand-backs", || home() == stats.0)?;
    assert!(cluster.stat(|s| &s.handbacks) >= stats.0 - 2, "every answer but a connection's last comes home");
    assert_eq!(cluster.stat(|s| &s.lost_while_away), 0);
    let switch = cluster.dispatcher.ready.shared.switch.as_ref().expect("hand-over policy has a switch");
    assert_eq!(switch.flow_count()?, 0, "steering entries leaked");
    assert!(switch.stats()?.forwarded > 0);
    Ok(())
}

// Goal: 10,000 hand-overs on 16 concurrent connections, every answer byte-exact, zero resets
// and zero PAWS rejections anywhere, the steering table empty at the end. Method: hand-over
// always; 2 clients × 8 connections × 625 queries of alternating size (16 KB and 40 KB).
#[test]
fn ten_thousand_hand_overs_on_sixteen_connections_without_a_reset() -> anyhow::Result<()> {
    let cluster = LabCluster::start("hb", Policy::Handover, 1)?;
    let (resets_before, paws_before) = common::resets(&cluster.lab)?;
    let mut spec = load(&cluster, 16 * 1024, 8, 313);
    let first = loadgen::run(&spec)?;
    spec.size = 40 * 1024;
    spec.queries_min = 312;
    spec.queries_max = 312;
    let second = loadgen::run(&spec)?;
    for report in [&first, &second] {
        assert_eq!(report.errors, 0, "{:?}", report.error_samples);
    }
    assert_eq!(first.queries + second.queries, 10_000);
    let home = || cluster.stat(|s| &s.handbacks) + cluster.stat(|s| &s.closed_while_away);
    let moved = || 10_000 - cluster.stat(|s| &s.import_failures);
    let waited = common::wait_until(Duration::from_secs(30), "every connection home", || home() == moved());
    let counters = [
        "handovers",
        "handbacks",
        "closed_while_away",
        "lost_while_away",
        "import_failures",
        "settle_timeouts",
        "settle_waits",
    ];
    let values = [
        &cluster.shared().stats.handovers,
        &cluster.shared().stats.handbacks,
        &cluster.shared().stats.closed_while_away,
        &cluster.shared().stats.lost_while_away,
        &cluster.shared().stats.import_failures,
        &cluster.shared().stats.settle_timeouts,
        &cluster.shared().stats.settle_waits,
    ];
    let summary: Vec<String> = counters
        .iter()
        .zip(values)
        .map(|(n, v)| format!("{n}={}", v.load(std::sync::atomic::Ordering::Relaxed)))
        .collect();
    waited.map_err(|e| anyhow::anyhow!("{e}: {}", summary.join(" ")))?;
    // An import the agent refuses falls back to relaying (correct, but not a hand-over).
    assert_eq!(cluster.stat(|s| &s.handovers) + cluster.stat(|s| &s.import_failures), 10_000);
    assert!(cluster.stat(|s| &s.import_failures) <= 10, "too many imports failed: {}", summary.join(" "));
    assert_eq!(cluster.stat(|s| &s.lost_while_away), 0);
    let switch = cluster.shared().switch.as_ref().expect("hand-over policy has a switch");
    assert_eq!(switch.flow_count()?, 0, "steering entries leaked");
    eprintln!("{}", summary.join(" "));
    common::wait_until(Duration::from_secs(10), "sessions to end", || switch.tracked_count().ok() == Some(0))?;
    let (resets, paws) = common::resets(&cluster.lab)?;
    assert_eq!(resets - resets_before, 0, "TCP resets were sent");
    assert_eq!(paws - paws_before, 0, "PAWS rejected segments");
    Ok(())
}

// Goal: the next query after a hand-back works, including one sent while the connection was
// away (it travels home in the receive queue). Method: one connection; a 2 MB query, then 1 ms
// later a second query while the first answer streams from the backend; both byte-exact; then
// more queries.
#[test]
fn a_query_sent_while_away_travels_home_and_is_answered() -> anyhow::Result<()> {
    use bypass_lab::payload::{query, Verifier};
    let cluster = LabCluster::start("hc", Policy::Handover, 1)?;
    let service = cluster.service();
    let outcome = bypass_dispatch::netns::run_in(&cluster.lab.client(1).namespace, move || {
        let mut connection =
            bypass_lab::pgclient::PgConnection::connect(service, common::login(), Duration::from_secs(30))?;
        for round in 0..5u64 {
            connection.send_query(&query(round * 2 + 1, 2 << 20))?;
            std::thread::sleep(Duration::from_millis(1));
            connection.send_query(&query(round * 2 + 2, 1000))?;
            connection.read_payload(&mut Verifier::new(1, round * 2 + 1, 2 << 20))?;
            connection.read_payload(&mut Verifier::new(2, round * 2 + 2, 1000))?;
        }
        connection.send_query(&query(99, 5))?;
        connection.read_payload(&mut Verifier::new(3, 99, 5))?;
        Ok(())
    });
    outcome?;
    // The last hand-back may still be on its way when the client has its answer.
    common::wait_until(Duration::from_secs(5), "ten hand-backs", || cluster.stat(|s| &s.handbacks) >= 10)?;
    assert!(cluster.stat(|s| &s.returned_with_request) >= 1, "no query ever travelled home in the receive queue");
    Ok(())
}

// Goal: a backend killed mid-result fails only its own client, which can reconnect; the
// dispatcher and another client are unaffected. Method: replica be2 streams a 128 MB answer
// over a handed-over connection from cli1 while cli2 runs queries on the primary; kill be2's
// PostgreSQL mid-answer.
#[test]
fn a_backend_killed_mid_result_fails_only_its_client() -> anyhow::Result<()> {
    use bypass_lab::payload::{query, Verifier};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let mut cluster = LabCluster::start_with("hd", Policy::Handover, 1, &["be2"])?;
    let service = cluster.service();
    let big = bypass_dispatch::netns::spawn_in(&cluster.lab.client(1).namespace, "big", move || {
        let mut connection =
            bypass_lab::pgclient::PgConnection::connect(service, common::login(), Duration::from_secs(30))?;
        connection.send_query(&query(1, 128 << 20))?;
        connection.read_payload(&mut Verifier::new(1, 1, 128 << 20))
    })?;
    let stop = Arc::new(AtomicBool::new(false));
    let stop_other = stop.clone();
    let other = bypass_dispatch::netns::spawn_in(&cluster.lab.client(2).namespace, "other", move || {
        let mut connection =
            bypass_lab::pgclient::PgConnection::connect(service, common::login(), Duration::from_secs(30))?;
        let mut queries = 0u64;
        while !stop_other.load(Ordering::Relaxed) {
            queries += 1;
            connection.send_query(&format!("/* route=primary */ {}", query(queries, 10_000)))?;
            connection.read_payload(&mut Verifier::new(queries, queries, 10_000))?;
        }
        Ok(queries)
    })?;
    let shared = cluster.dispatcher.ready.shared.clone();
    common::wait_until(Duration::from_secs(10), "the big answer to start", || {
        shared.backends[1].outstanding.load(Ordering::Relaxed) > 0 && shared.stats.handovers.load(Ordering::Relaxed) > 0
    })?;
    std::thread::sleep(Duration::from_millis(300));
    cluster.postgres[1].kill();
    let big_outcome = big.join().expect("big thread");
    assert!(big_outcome.is_err(), "the killed backend's client must see an error, got {big_outcome:?}");
    // The client reconnects; its read falls back to the primary while the replica is down.
    let again = bypass_dispatch::netns::run_in(&cluster.lab.client(1).namespace, move || {
        let mut connection =
            bypass_lab::pgclient::PgConnection::connect(service, common::login(), Duration::from_secs(30))?;
        connection.send_query(&query(5, 1 << 20))?;
        connection.read_payload(&mut Verifier::new(1, 5, 1 << 20))
    })?;
    assert_eq!(again, 1 << 20);
    stop.store(true, Ordering::Relaxed);
    let other_queries = other.join().expect("other thread")?;
    assert!(other_queries > 0, "the other client ran queries throughout");
    common::wait_until(Duration::from_secs(5), "the steering table to empty", || {
        cluster.shared().switch.as_ref().and_then(|s| s.flow_count().ok()) == Some(0)
    })?;
    Ok(())
}

// Goal: the hybrid policy relays small answers, takes over on demand at the exact byte offset
// where an unknown answer passes the threshold, and hands over upfront once it has seen the
// statement's answers are large. Method: one connection; 4 KB, then 4 MB twice, then 4 KB
// twice, with a 256 KB threshold; read the dispatcher's counters after each step.
#[test]
fn hybrid_relays_small_answers_and_hands_over_large_ones() -> anyhow::Result<()> {
    use bypass_lab::payload::{query, Verifier};
    let cluster = LabCluster::start("hh", Policy::Hybrid, 256 * 1024)?;
    let service = cluster.service();
    let shared = cluster.dispatcher.ready.shared.clone();
    let counters = move || {
        let s = &shared.stats;
        let read = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
        (read(&s.handovers), read(&s.on_demand))
    };
    let steps = bypass_dispatch::netns::run_in(&cluster.lab.client(1).namespace, move || {
        let mut connection =
            bypass_lab::pgclient::PgConnection::connect(service, common::login(), Duration::from_secs(30))?;
        let mut seen = Vec::new();
        for (seed, size) in [(1u64, 4096u64), (2, 4 << 20), (3, 4 << 20), (4, 4096), (5, 4096)] {
            connection.send_query(&query(seed, size))?;
            assert_eq!(connection.read_payload(&mut Verifier::new(seed, seed, size))?, size);
            // The connection may still be on its way home: wait for it before reading counters.
            std::thread::sleep(Duration::from_millis(50));
            seen.push(counters());
        }
        Ok(seen)
    })?;
    assert_eq!(steps[0], (0, 0), "a small unknown answer is relayed");
    assert_eq!(steps[1], (1, 1), "a large unknown answer is taken over on demand");
    assert_eq!(steps[2], (2, 1), "a statement known to answer large is handed over upfront");
    assert_eq!(steps[3], (3, 1), "its next answer is predicted large (and learned small)");
    assert_eq!(steps[4], (3, 1), "once learned small, it is relayed again");
    Ok(())
}

// Goal: on-demand hand-overs in the middle of large answers stay byte-exact with zero resets,
// also when the dispatcher still has relayed bytes in flight at the move. Method: hybrid with
// a 256 KB threshold; sizes alternate 4 KB / 16 MB on 2 connections, so every large answer
// is mispredicted small and taken over on demand.
#[test]
fn on_demand_hand_overs_mid_answer_are_byte_exact_without_resets() -> anyhow::Result<()> {
    use bypass_lab::payload::{query, Verifier};
    let cluster = LabCluster::start("he", Policy::Hybrid, 256 * 1024)?;
    let (resets_before, _) = common::resets(&cluster.lab)?;
    let service = cluster.service();
    let mut threads = Vec::new();
    for client in cluster.lab.clients() {
        threads.push(bypass_dispatch::netns::spawn_in(&client.namespace, "alternating", move || {
            let mut connection =
                bypass_lab::pgclient::PgConnection::connect(service, common::login(), Duration::from_secs(30))?;
            for round in 0..8u64 {
                for (seed, size) in [(round * 2 + 1, 4096u64), (round * 2 + 2, 16 << 20)] {
                    connection.send_query(&query(seed, size))?;
                    connection.read_payload(&mut Verifier::new(seed, seed, size))?;
                }
            }
            Ok(())
        })?);
    }
    for thread in threads {
        thread.join().expect("client thread")?;
    }
    assert!(cluster.stat(|s| &s.on_demand) >= 14, "on-demand moves: {}", cluster.stat(|s| &s.on_demand));
    common::wait_until(Duration::from_secs(5), "connections home", || {
        cluster.shared().switch.as_ref().and_then(|s| s.flow_count().ok()) == Some(0)
    })?;
    let (resets, _) = common::resets(&cluster.lab)?;
    assert_eq!(resets - resets_before, 0, "TCP resets were sent");
    Ok(())
}

// Goal: connections move with megabytes unacknowledged in both directions (state frames larger
// than the link buffers, large repair-mode queue restores), byte-exact and without resets.
// Method: hybrid with a 256 KB threshold and no drain wait at dispatcher or agents, so every
// move exports right after writing; 2 connections alternate 4 MB and 64 KB answers. The
// clients close (no Terminate) right after their last answer, so a close often meets the
// hand-back in progress: the agent must finish such a close while the flow is steered to it
// (closing it while blocked got the client's last ACKs reset by the dispatcher's host).
#[test]
fn connections_move_with_megabytes_unacknowledged() -> anyhow::Result<()> {
    use bypass_lab::payload::{query, Verifier};
    let cluster = LabCluster::start_tuned("hm", Policy::Hybrid, 256 * 1024, &["be1", "be2"], |agent, dispatcher| {
        agent.drain_wait_ms = 0;
        agent.handback_wait_ms = 0;
        dispatcher.drain_wait_ms = 0;
    })?;
    let (resets_before, _) = common::resets(&cluster.lab)?;
    let service = cluster.service();
    let mut threads = Vec::new();
    for client in cluster.lab.clients() {
        threads.push(bypass_dispatch::netns::spawn_in(&client.namespace, "unacknowledged", move || {
            let mut connection =
                bypass_lab::pgclient::PgConnection::connect(service, common::login(), Duration::from_secs(30))?;
            for round in 0..6u64 {
                for (seed, size) in [(round * 2 + 1, 4u64 << 20), (round * 2 + 2, 64 << 10)] {
                    connection.send_query(&query(seed, size))?;
                    connection.read_payload(&mut Verifier::new(seed, seed, size))?;
                }
            }
            Ok(())
        })?);
    }
    for thread in threads {
        thread.join().expect("client thread")?;
    }
    assert!(cluster.stat(|s| &s.handovers) >= 12, "hand-overs: {}", cluster.stat(|s| &s.handovers));
    assert_eq!(cluster.stat(|s| &s.lost_while_away), 0);
    let (resets, _) = common::resets(&cluster.lab)?;
    assert_eq!(resets - resets_before, 0, "TCP resets were sent");
    Ok(())
}

// Goal: a client that closes its sending side together with a query whose answer would be
// handed over gets the whole answer relayed, then a clean close — no failed export, no reset —
// and the dispatcher goes on handing over other connections. Method: hand-over always; the
// query and the FIN travel in one segment (TCP_CORK), so the dispatcher's socket is already in
// CLOSE_WAIT when the move begins; a second connection then runs a normal hand-over.
#[test]
fn a_client_closing_with_its_query_is_answered_by_relay_without_a_reset() -> anyhow::Result<()> {
    use bypass_lab::payload::{query, Verifier};
    use bypass_lab::pgclient::PgConnection;
    let cluster = LabCluster::start("hf", Policy::Handover, 1)?;
    let (resets_before, _) = common::resets(&cluster.lab)?;
    let service = cluster.service();
    let login = || common::login();
    let closing = bypass_dispatch::netns::run_in(&cluster.lab.client(1).namespace, move || {
        let mut connection = PgConnection::connect(service, login(), Duration::from_secs(30))?;
        connection.send_query_and_close(&query(1, 1 << 20))?;
        let bytes = connection.read_payload(&mut Verifier::new(1, 1, 1 << 20))?;
        connection.expect_closed()?;
        Ok(bytes)
    })?;
    assert_eq!(closing, 1 << 20, "the closing client got its whole answer");
    assert_eq!(cluster.stat(|s| &s.stayed_home_closing), 1, "the move was skipped, not attempted");
    assert_eq!(cluster.stat(|s| &s.handovers), 0);
    assert_eq!(cluster.stat(|s| &s.lost_while_away), 0);
    let next = bypass_dispatch::netns::run_in(&cluster.lab.client(2).namespace, move || {
        let mut connection = PgConnection::connect(service, login(), Duration::from_secs(30))?;
        connection.send_query(&query(2, 1 << 20))?;
        connection.read_payload(&mut Verifier::new(2, 2, 1 << 20))
    })?;
    assert_eq!(next, 1 << 20);
    assert_eq!(cluster.stat(|s| &s.handovers) + cluster.stat(|s| &s.import_failures), 1);
    let switch = cluster.shared().switch.as_ref().expect("hand-over policy has a switch");
    common::wait_until(Duration::from_secs(10), "sessions to end", || switch.tracked_count().ok() == Some(0))?;
    assert_eq!(switch.flow_count()?, 0, "steering entries leaked");
    let (resets, _) = common::resets(&cluster.lab)?;
    assert_eq!(resets - resets_before, 0, "TCP resets were sent");
    Ok(())
}

// Goal: a dispatcher stopped after hand-backs can be started again on its address at once.
// Method: hand a large answer over and back (the client's socket is re-imported into the
// dispatcher with TCP_REPAIR), stop the dispatcher while that socket is open (it closes into
// TIME_WAIT), then bind the service address in the dispatcher's namespace as a new dispatcher
// would. Before imported sockets were marked SO_REUSEADDR this failed with EADDRINUSE.
#[test]
fn a_dispatcher_restarted_after_hand_backs_can_listen_again() -> anyhow::Result<()> {
    use bypass_lab::payload::{query, Verifier};
    let cluster = LabCluster::start("hr", Policy::Hybrid, 256 * 1024)?;
    let service = cluster.service();
    let connection = bypass_dispatch::netns::run_in(&cluster.lab.client(1).namespace, move || {
        let mut connection =
            bypass_lab::pgclient::PgConnection::connect(service, common::login(), Duration::from_secs(30))?;
        connection.send_query(&query(7, 4 << 20))?;
        assert_eq!(connection.read_payload(&mut Verifier::new(7, 7, 4 << 20))?, 4 << 20);
        std::thread::sleep(Duration::from_millis(200));
        Ok(connection)
    })?;
    assert!(cluster.stat(|s| &s.handovers) >= 1, "the answer was handed over (and back)");
    let LabCluster { dispatcher, agents: _agents, postgres: _postgres, lab } = cluster;
    dispatcher.stop()?;
    let bound = bypass_dispatch::netns::run_in(&lab.dispatcher().namespace, move || {
        Ok(std::net::TcpListener::bind(service).map(|_| ()).map_err(|e| e.to_string()))
    })?;
    drop(connection);
    assert_eq!(bound, Ok(()), "the service address is free for a new dispatcher");
    Ok(())
}
