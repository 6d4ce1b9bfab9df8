//! Hand-over end to end in the lab: real namespaces, shaped links, the eBPF switch, stock
//! PostgreSQL behind agents, the dispatcher on the VIP (needs root, as in CI).

mod common;

use std::time::Duration;

use bypass_dispatch::config::Policy;
use bypass_dispatch::loadgen::{self, LoadSpec, Target};
use bypass_dispatch::pglogin::LoginRequest;
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
        login: LoginRequest::trust("postgres", "postgres"),
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
    assert_eq!(stats.0, 40, "handovers, handbacks, import failures: {stats:?}");
    // The last answer of each connection is complete before its connection comes home.
    // A client that says goodbye while away closes its connection there: it cannot move back.
    let home = || cluster.stat(|s| &s.handbacks) + cluster.stat(|s| &s.closed_while_away);
    common::wait_until(Duration::from_secs(5), "the last hand-backs", || home() == 40)?;
    assert!(cluster.stat(|s| &s.handbacks) >= 38, "every answer but a connection's last comes home");
    assert_eq!(cluster.stat(|s| &s.lost_while_away), 0);
    let switch = cluster.dispatcher.ready.shared.switch.as_ref().expect("hand-over policy has a switch");
    assert_eq!(switch.flow_count()?, 0, "steering entries leaked");
    assert!(switch.stats()?.forwarded > 0);
    Ok(())
}
