//! Serializability: committed transactions' read and write versions form an acyclic dependency
//! graph, for every protocol, under high contention and (for Tigon) constant migrations.

mod common;

use bypass_pod::checker;
use bypass_pod::history::read_histories;
use bypass_pod::{Pod, PodConfig, Protocol, RunReport};
use common::*;

/// Runs with history recording and returns the report and the checker's verdict.
fn run_checked(mut config: PodConfig) -> (RunReport, checker::CheckReport) {
    let dir = tempfile::tempdir().expect("tempdir");
    config.history_dir = Some(dir.path().to_path_buf());
    let hosts = config.hosts;
    let report = Pod::run(config).expect("run");
    let history = read_histories(dir.path(), hosts).expect("histories");
    (report, checker::check(&history))
}

#[test]
fn histories_are_serializable_under_contention_with_many_migrations() {
    // Goal: no dependency cycle while tuples move in and out under locks. Method: YCSB 50/50 over 24
    // keys per host, every transaction crossing hosts; Tigon gets room for 6 CATs per host so CLOCK
    // evicts constantly; the offline checker builds the DSG from every host's history.
    let _pod = exclusive();
    for protocol in PROTOCOLS {
        let mut config = small(ycsb(24, 50, 100), protocol);
        config.hosts = 3;
        config.index_buckets_per_host = 16;
        config.hwcc_budget_bytes = 3 * (16 * 8 + 6 * 32);
        config.measure_ms = 1000;
        config.measure_acked_min = 400;
        let (report, verdict) = run_checked(config);
        assert_ycsb(&report);
        assert!(
            verdict.anomalies.is_empty(),
            "{protocol:?}: {:?}",
            &verdict.anomalies[..verdict.anomalies.len().min(5)]
        );
        // The run lasts until 400 are acknowledged (however loaded the machine), so the checker
        // always sees a dense graph; the edges make it a real test.
        assert!(verdict.transactions >= 400 && verdict.edges > 5 * verdict.transactions, "{protocol:?}: {verdict:?}");
        if protocol == Protocol::Tigon {
            assert!(report.total.moves_in > 200 && report.total.moves_out > 200, "{:?}", report.total);
        }
    }
}

#[test]
fn bank_histories_are_serializable_and_keep_the_total() {
    // Goal: read-modify-write transfers across three hosts serialize. Method: 10 accounts per host
    // (very hot), 80% cross; check the DSG and the total.
    let _pod = exclusive();
    for protocol in PROTOCOLS {
        let mut config = small(bank(10, 80), protocol);
        config.hosts = 3;
        let workload = config.workload.clone();
        let (report, verdict) = run_checked(config);
        assert_bank(&report, bank_config(&workload));
        assert!(
            verdict.anomalies.is_empty(),
            "{protocol:?}: {:?}",
            &verdict.anomalies[..verdict.anomalies.len().min(5)]
        );
    }
}
