//! TPC-C, full mix: consistency conditions 1–4 hold after every run, for every protocol, across
//! the remote sweep's extremes, and on simulated incoherent caches.

mod common;

use bypass_pod::workload::tpcc::TpccConfig;
use bypass_pod::workload::WorkloadConfig;
use bypass_pod::{Pod, Protocol};
use common::*;

fn tpcc(remote_new_order: u32, remote_payment: u32) -> WorkloadConfig {
    WorkloadConfig::Tpcc(TpccConfig::small(remote_new_order, remote_payment))
}

#[test]
fn consistency_conditions_hold_for_every_protocol_at_0_0_and_60_90() {
    // Goal: the full mix keeps TPC-C's conditions 1–4 (checked by each host on its warehouse after
    // the run; a violation fails the run). Method: 2 warehouses, small scale, both ends of the
    // remote sweep, each protocol; remote work must actually happen at 60/90.
    let _pod = exclusive();
    for protocol in PROTOCOLS {
        for (new_order, payment) in [(0, 0), (60, 90)] {
            let mut config = small(tpcc(new_order, payment), protocol);
            config.swcc_bytes_per_host = 64 << 20;
            config.hwcc_budget_bytes = 8 << 20;
            let report = Pod::run(config).unwrap_or_else(|error| panic!("{protocol:?} {new_order}/{payment}: {error}"));
            assert!(report.total.committed > 50, "{protocol:?}: {} commits", report.total.committed);
            assert!(report.total.aborts_user > 0 || report.total.committed < 500, "1% NewOrder rollbacks expected");
            let remote = report.total.remote_accesses;
            assert_eq!(remote == 0, new_order == 0, "{protocol:?} {new_order}/{payment}: {remote} remote accesses");
        }
    }
}

#[test]
fn tpcc_on_incoherent_caches_with_a_tight_budget() {
    // Goal: TPC-C stays consistent when Tigon's CATs live behind simulated non-coherent caches and
    // CLOCK keeps moving them out. Method: 60/90 with room for ~40 CATs per host, measured until
    // 600 transactions are acknowledged (≈ 0.6 moves in per commit, so far more than fit).
    let _pod = exclusive();
    let mut config = small(tpcc(60, 90), Protocol::Tigon);
    config.coherence = incoherent();
    config.swcc_bytes_per_host = 64 << 20;
    config.index_buckets_per_host = 256;
    config.hwcc_budget_bytes = 2 * (256 * 8 + 40 * 32);
    config.measure_acked_min = 600;
    let report = Pod::run(config).expect("run");
    assert!(report.total.moves_out > 100, "{:?}", report.total);
    assert!(report.total.committed >= 600);
}
