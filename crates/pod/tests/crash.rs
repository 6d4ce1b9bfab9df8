//! Durability: hosts are SIGKILLed at injected points (mid-epoch, during a move-in, holding a
//! latch, before an fdatasync) or at random times; the whole pod restarts from its checkpoints
//! and logs with an empty shared region. Every acknowledged transaction must be present — each
//! one's id is recorded when it is acknowledged and looked up after the crash — nothing partial,
//! the bank total unchanged; checkpoints keep the logs bounded.

mod common;

use std::time::Duration;

use bypass_pod::config::{CrashPoint, CrashSpec};
use bypass_pod::region::Phase;
use bypass_pod::{Pod, PodConfig, Protocol};
use common::*;

fn logged(dir: &std::path::Path, protocol: Protocol) -> PodConfig {
    let mut config = small(bank(60, 60), protocol);
    config.log_dir = Some(dir.to_path_buf());
    config.epoch_ms = 4;
    config.warmup_ms = 0;
    config.measure_ms = 20_000;
    config.record_acked = true;
    // Checkpoints and segment deletions happen many times in every test, crashes included.
    config.checkpoint_log_bytes = 32 << 10;
    config.log_segment_bytes = 16 << 10;
    config
}

/// Starts a pod, lets it crash (injected point, or `kill_after` then SIGKILL of `victim`), kills
/// the rest, and returns each host's acknowledged count at the time.
fn crash(config: PodConfig, kill_after: Option<(Duration, usize)>) -> Vec<u64> {
    let hosts = config.hosts;
    let mut pod = Pod::create(config).expect("create");
    pod.start().expect("start");
    pod.wait_ready().expect("ready");
    pod.set_phase(Phase::Warmup);
    pod.set_phase(Phase::Measure);
    match kill_after {
        Some((after, victim)) => {
            pod.watch(after).expect("hosts stay alive until the kill");
            pod.kill(victim);
        }
        None => {
            // A hang guard, not a timing assumption: a loaded 2-core machine may take a minute to
            // reach the 3000th commit of a slow protocol.
            let died = pod.wait_for_death(Duration::from_secs(180));
            assert!(died.is_some(), "the injected crash point was never reached");
        }
    }
    let acked: Vec<u64> = (0..hosts).map(|host| pod.acked(host)).collect();
    pod.kill_all();
    acked
}

/// Starts a pod, SIGKILLs every host once they acknowledged `min_acked` transactions together,
/// and returns each host's acknowledged count at the time.
fn crash_after_acked(config: PodConfig, min_acked: u64) -> Vec<u64> {
    let hosts = config.hosts;
    let mut pod = Pod::create(config).expect("create");
    pod.start().expect("start");
    pod.wait_ready().expect("ready");
    pod.set_phase(Phase::Warmup);
    pod.set_phase(Phase::Measure);
    // A hang guard, not a timing assumption (see `crash`).
    let started = std::time::Instant::now();
    while (0..hosts).map(|host| pod.acked(host)).sum::<u64>() < min_acked {
        assert!(started.elapsed() < Duration::from_secs(180), "the pod stopped acknowledging");
        pod.watch(Duration::from_millis(20)).expect("hosts stay alive until the kill");
    }
    let acked: Vec<u64> = (0..hosts).map(|host| pod.acked(host)).collect();
    pod.kill_all();
    acked
}

/// Restarts from the logs without running transactions and checks the recovered state: each
/// host's ledger holds at least `acked[host]` transfers, and the recorded acknowledgements (at
/// least `acked_observed` of them, all runs on these logs) all survived.
fn recover_and_check(mut config: PodConfig, acked: &[u64], acked_observed: u64) {
    config.recover = true;
    config.crash = None;
    config.warmup_ms = 0;
    config.measure_ms = 0;
    let report = Pod::run(config.clone()).expect("recovery run");
    let plan = report.recovery.expect("a recovery plan");
    let total: i64 = report.per_host.iter().map(|host| host.check_value_a as i64).sum();
    assert_eq!(total, bank_config(&config.workload).total(config.hosts), "partial transfer after recovery");
    for (host, counters) in report.per_host.iter().enumerate() {
        assert!(
            counters.check_value_b >= acked[host],
            "host {host}: {} transfers recovered, {} were acknowledged",
            counters.check_value_b,
            acked[host]
        );
    }
    assert!(acked.iter().sum::<u64>() > 0, "nothing was acknowledged before the crash: the test proves nothing");
    assert!(plan.pod_durable_epoch > 0);
    // Each acknowledged transaction, by id: its commit record survived the cut, or every host's
    // checkpoint covers it.
    assert_eq!(plan.acked_lost, 0, "acknowledged transactions lost: {plan:?}");
    assert!(plan.acked_recorded as u64 >= acked_observed, "every acknowledgement is recorded: {plan:?}");
    assert_eq!(plan.acked_in_logs + plan.acked_in_checkpoints, plan.acked_recorded);
    // And in the data: every acknowledged transfer's receipt row is in the recovered partitions.
    let checked: u64 = report.per_host.iter().map(|host| host.receipts_checked).sum();
    let missing: u64 = report.per_host.iter().map(|host| host.receipts_missing).sum();
    assert_eq!(checked, plan.acked_recorded as u64, "every recorded acknowledgement has its receipt checked");
    assert_eq!(missing, 0, "receipts of acknowledged transfers missing after recovery");
}

fn crash_at(point: CrashPoint, host: usize, after: u64, protocol: Protocol) {
    let _pod = exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = logged(dir.path(), protocol);
    config.crash = Some(CrashSpec { host, point, after });
    if point == CrashPoint::MoveIn {
        // Room for ~20 CATs per host, so tuples keep moving in (and out) all run long.
        config.index_buckets_per_host = 16;
        config.hwcc_budget_bytes = 2 * (16 * 8 + 20 * 32);
    }
    let acked = crash(config.clone(), None);
    let observed = acked.iter().sum();
    recover_and_check(config, &acked, observed);
}

#[test]
fn clean_shutdown_acknowledges_everything_and_recovers_it_exactly() {
    // Goal: group commit acknowledges every transaction once its epoch is durable pod-wide, and
    // replaying all logs reproduces the final state. Method: run, then recover without running.
    let _pod = exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = logged(dir.path(), Protocol::Tigon);
    config.measure_ms = 600;
    let report = Pod::run(config.clone()).expect("run");
    assert_bank(&report, bank_config(&config.workload));
    for host in &report.per_host {
        assert_eq!(host.unacked_at_end, 0, "final group commit not seen after {} ms", host.ack_drain_ms);
        assert_eq!(host.acked, host.committed, "every commit is acknowledged by the end");
        assert!(host.fsyncs > 0 && host.log_file_bytes > 0);
    }
    assert!(report.commit_latency_p50_us > 0, "acknowledgement waits for the epoch");
    let ledgers: Vec<u64> = report.per_host.iter().map(|host| host.check_value_b).collect();
    config.recover = true;
    config.measure_ms = 0;
    let recovered = Pod::run(config.clone()).expect("recover");
    let after: Vec<u64> = recovered.per_host.iter().map(|host| host.check_value_b).collect();
    assert_eq!(after, ledgers, "recovery reproduces every committed transfer, no more");
    let again = Pod::run(config).expect("recover twice");
    assert_eq!(again.per_host.iter().map(|host| host.check_value_b).collect::<Vec<_>>(), ledgers);
}

#[test]
fn checkpoints_bound_the_logs_and_recovery_starts_from_them() {
    // Goal: logs are truncated at checkpoints, so disk use stays bounded in a long run, and a
    // whole-pod crash recovers every acknowledged transaction from checkpoint + remaining logs.
    // Method: a run long enough for many checkpoints and segment deletions; SIGKILL every host;
    // recover; the acknowledged ids must all survive, some of them only in the checkpoints.
    let _pod = exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = logged(dir.path(), Protocol::Tigon);
    config.measure_acked_min = 20_000;
    config.measure_ms = 1_000;
    let report = Pod::run(config.clone()).expect("run");
    let deleted: u64 = report.per_host.iter().map(|host| host.log_bytes_deleted).sum();
    let written: u64 = report.per_host.iter().map(|host| host.log_file_bytes).sum();
    assert!(report.per_host.iter().all(|host| host.checkpoints >= 2), "checkpoints: {:?}", report.total);
    // What stays on disk is what was written since the pod's oldest checkpoint began (the
    // checkpoint interval plus however long the slower host's checkpoint took to sync), not the
    // whole run; how much that is depends on the disk, so the benchmark reports it.
    let on_disk: u64 = (0..config.hosts).map(|host| bypass_pod::log::log_bytes(dir.path(), host).expect("size")).sum();
    assert!(deleted > 0 && on_disk <= written - deleted, "{on_disk} log bytes on disk, {deleted} of {written} deleted");
    let acked = crash_after_acked(config.clone(), 5_000);
    config.recover = true;
    config.measure_ms = 0;
    config.warmup_ms = 0;
    let recovered = Pod::run(config.clone()).expect("recover");
    let plan = recovered.recovery.expect("plan");
    assert!(plan.checkpoints_used > 0 && plan.checkpoint_floor > 0, "{plan:?}");
    assert!(plan.acked_in_checkpoints > 0, "some acknowledged transactions survive only in checkpoints: {plan:?}");
    recover_and_check(config, &acked, acked.iter().sum());
    assert!(recovered.recovery_ms.is_some());
}

#[test]
fn crash_mid_epoch_loses_no_acknowledged_transaction() {
    // Goal: a host dying between logging and applying a transaction. Method: SIGKILL host 1 at its
    // 3000th commit, whole-pod restart, check acknowledged ⊆ recovered and the total.
    crash_at(CrashPoint::MidEpoch, 1, 3000, Protocol::Tigon);
}

#[test]
fn crash_during_move_in_recovers() {
    // Goal: CXL state is soft: a host dying halfway through moving a tuple in loses nothing durable.
    // Method: a tight budget keeps tuples moving; SIGKILL host 0 after linking its 3000th CAT, before
    // answering the requester.
    crash_at(CrashPoint::MoveIn, 0, 3000, Protocol::Tigon);
}

#[test]
fn crash_while_holding_a_latch_recovers() {
    // Goal: a host dying with a CAT latch held (other hosts would spin) is recovered by a whole-pod
    // restart. Method: SIGKILL host 1 inside its 5000th write release.
    crash_at(CrashPoint::HoldingLatch, 1, 5000, Protocol::Tigon);
}

#[test]
fn crash_before_fsync_recovers() {
    // Goal: a log batch written but not synced is not trusted. Method: SIGKILL host 0's process from
    // its logger between write and fdatasync of the 60th batch.
    crash_at(CrashPoint::BeforeFsync, 0, 60, Protocol::Tigon);
}

#[test]
fn two_phase_commit_baseline_recovers_prepared_writes() {
    // Goal: DS2PL+'s participants' prepared writes are replayed only with their coordinator's commit
    // record. Method: crash a DS2PL+ host mid-epoch, recover, check.
    crash_at(CrashPoint::MidEpoch, 0, 2000, Protocol::Ds2pl);
}

#[test]
fn random_kills_of_one_host_and_of_all_hosts_recover() {
    // Goal: crashes at arbitrary points, not only instrumented ones. Method: three rounds of SIGKILL
    // of one host (then the rest) and of all hosts, after pseudo-random delays, recovering each time
    // on top of the previous recoveries' logs.
    let _pod = exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = logged(dir.path(), Protocol::Tigon);
    config.hosts = 3;
    let mut acked_total = vec![0u64; 3];
    let mut observed = 0;
    for (round, delay_ms) in [170u64, 260, 90].into_iter().enumerate() {
        config.recover = round > 0;
        let victim = round % 3;
        let acked = crash(config.clone(), Some((Duration::from_millis(delay_ms), victim)));
        for (total, now) in acked_total.iter_mut().zip(&acked) {
            *total += now;
        }
        observed += acked.iter().sum::<u64>();
        recover_and_check(config.clone(), &acked_total, observed);
        // Later rounds continue from the logs: every recovery's acknowledged work must survive.
        config.recover = true;
        acked_total = recovered_ledgers(&config);
    }
}

fn recovered_ledgers(config: &PodConfig) -> Vec<u64> {
    let mut check = config.clone();
    check.warmup_ms = 0;
    check.measure_ms = 0;
    let report = Pod::run(check).expect("recover");
    report.per_host.iter().map(|host| host.check_value_b).collect()
}
