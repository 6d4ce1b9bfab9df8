//! Next-key locking across hosts: remote range scans through shared tuples see no phantoms while
//! owners insert and delete and other hosts insert remotely, under eviction pressure; baselines
//! refuse remote scans clearly.

mod common;

use bypass_pod::checker;
use bypass_pod::history::read_histories;
use bypass_pod::workload::registry::RegistryConfig;
use bypass_pod::workload::WorkloadConfig;
use bypass_pod::{Pod, PodConfig, Protocol, RunReport};
use common::*;

fn registry(cross_percent: u32, remote_inserts: bool) -> WorkloadConfig {
    WorkloadConfig::Registry(RegistryConfig { initial_entries: 8, cross_percent, remote_inserts })
}

/// Runs a Tigon pod on the registry workload and asserts no committed scan saw a phantom.
fn run_without_phantoms(mut config: PodConfig) -> RunReport {
    let dir = tempfile::tempdir().expect("tempdir");
    config.history_dir = Some(dir.path().to_path_buf());
    let hosts = config.hosts;
    let report = Pod::run(config).expect("run (a lost next-key bit or a failed count check fails it)");
    let phantoms: u64 = report.per_host.iter().map(|host| host.check_value_a).sum();
    let remote_scans: u64 = report.per_host.iter().map(|host| host.check_value_b).sum();
    assert_eq!(phantoms, 0, "committed scans whose key count differs from the count row");
    assert!(remote_scans >= 50, "too few remote scans committed to mean anything: {remote_scans}");
    assert!(report.total.moves_in > 0, "remote scans move rows in: {:?}", report.total);
    let verdict = checker::check(&read_histories(dir.path(), hosts).expect("histories"));
    assert!(verdict.anomalies.is_empty(), "{:?}", &verdict.anomalies[..verdict.anomalies.len().min(5)]);
    report
}

#[test]
fn remote_scans_see_no_phantoms_while_owners_insert_and_delete() {
    // Goal: a scan of another host's ordered table is serializable against the owner's inserts
    // and deletes and against remote inserts and deletes. Method: every host inserts/deletes
    // entries and keeps their count in one transaction, while the others scan its whole registry
    // through CATs and compare the keys they saw with the count, or insert into it remotely
    // (placeholder and next key locked by the owner for them) or delete from it when full;
    // three hosts, so it all interleaves. The run's own check then requires every host's count
    // to equal its entries (no lost, leaked or doubly removed row).
    let _pod = exclusive();
    let mut config = small(registry(60, true), Protocol::Tigon);
    config.hosts = 3;
    config.measure_acked_min = 400;
    let report = run_without_phantoms(config);
    assert!(report.total.remote_inserts >= 20, "remote inserts must commit: {:?}", report.total);
    assert!(report.total.remote_deletes >= 5, "remote deletes must commit: {:?}", report.total);
}

#[test]
fn remote_scans_stay_phantom_free_while_clock_evicts_their_neighbours() {
    // Goal: the next/prev-key bits stay true while rows move in and out around scanned runs.
    // Method: room for 30 CATs per host, so serving a scan evicts other entries (clearing their
    // neighbours' bits) and later scans move them back in; a scanned run whose bits were lost
    // fails the run, a phantom fails the count check.
    let _pod = exclusive();
    let mut config = small(registry(80, true), Protocol::Tigon);
    config.index_buckets_per_host = 16;
    config.hwcc_budget_bytes = 2 * (16 * 8 + 30 * 32);
    config.measure_acked_min = 300;
    let report = run_without_phantoms(config);
    assert!(report.total.moves_out > 0, "the budget must force move-outs: {:?}", report.total);
}

#[test]
fn baselines_refuse_remote_scans_with_a_clear_error() {
    // Goal: a protocol that cannot scan another partition says so instead of scanning wrongly.
    // Method: DS2PL+ on the registry with every transaction scanning another host.
    let _pod = exclusive();
    let mut config = small(registry(100, false), Protocol::Ds2pl);
    config.measure_acked_min = 10;
    let error = Pod::run(config).expect_err("a baseline remote scan must fail the run");
    assert!(error.to_string().contains("baseline scans of another host's partition"), "{error}");
}

#[test]
fn remote_inserts_and_deletes_are_rebuilt_from_the_writers_logs() {
    // Goal: rows another host inserted or deleted come back on recovery, which rebuilds each
    // partition from every host's log (the writer logs remote changes, not the owner). Method: a
    // logged registry run with remote inserts and deletes, then a recovery-only run, twice; each
    // host's count row must equal its entries after replay (the workload check fails the run
    // otherwise) — the count is read-modify-written by owner and remote hosts alike, so losing
    // or misplacing either host's records breaks it.
    let _pod = exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = small(registry(60, true), Protocol::Tigon);
    config.log_dir = Some(dir.path().to_path_buf());
    config.epoch_ms = 4;
    config.measure_acked_min = 300;
    let report = Pod::run(config.clone()).expect("logged run");
    assert!(report.total.remote_inserts > 0 && report.total.remote_deletes > 0, "{:?}", report.total);
    let acked: u64 = report.per_host.iter().map(|host| host.acked).sum();
    config.recover = true;
    config.warmup_ms = 0;
    config.measure_ms = 0;
    for _ in 0..2 {
        let recovered = Pod::run(config.clone()).expect("recovery run (count vs entries checked)");
        let plan = recovered.recovery.expect("a recovery plan");
        assert!(plan.committed_txns as u64 >= acked, "{} replayed, {acked} acknowledged", plan.committed_txns);
    }
}
