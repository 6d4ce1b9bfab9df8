//! The pod as a whole: host processes over one region, every protocol, invariants after a run.

mod common;

use bypass_pod::coherence::{CoherenceBackend, SwccProtocol};
use bypass_pod::error::PodError;
use bypass_pod::workload::WorkloadConfig;
use bypass_pod::{Pod, PodConfig, Protocol};
use common::*;

#[test]
fn bank_total_holds_under_contention_for_every_protocol() {
    // Goal: all three protocols keep a bank's total and count every commit once. Method: 2 hosts,
    // 40 accounts each (heavy contention), half the transfers cross hosts; check the invariants.
    let _pod = exclusive();
    for protocol in PROTOCOLS {
        let config = small(bank(40, 50), protocol);
        let report = Pod::run(config.clone()).unwrap_or_else(|error| panic!("{protocol:?}: {error}"));
        assert_bank(&report, bank_config(&config.workload));
        assert!(report.total.remote_accesses > 0, "{protocol:?} made no remote access");
        assert!(report.total.aborts() > 0, "{protocol:?}: contention should cause aborts");
    }
}

#[test]
fn tigon_moves_tuples_in_and_reaches_them_without_messages() {
    // Goal: the Pasha path — first remote access migrates by message, later ones hit the owner's CXL
    // index. Method: YCSB 100% cross over 100 keys per host with a budget that holds them all; count
    // moves (at most one per key) and index hits.
    let _pod = exclusive();
    let mut config = small(ycsb(100, 50, 100), Protocol::Tigon);
    config.warmup_ms = 0;
    let report = Pod::run(config).expect("run");
    assert_ycsb(&report);
    let total = &report.total;
    assert!(total.moves_in > 0 && total.moves_in <= 200, "moves in: {}", total.moves_in);
    assert_eq!(total.moves_out, 0, "the budget holds every key");
    assert!(total.remote_index_hits > total.remote_messages, "{total:?}");
    // A phase's migrations travel together: one request and one reply per phase that missed.
    assert_eq!(total.messages_sent, total.round_trips * 2, "one request + one reply per phase");
    assert!(total.round_trips < total.remote_messages, "migrations of a phase are batched: {total:?}");
}

/// YCSB, 400 keys, 100% cross, with HWcc room for ~40 CATs per host: CLOCK must move tuples out.
fn tight_budget_ycsb() -> PodConfig {
    let mut config = small(ycsb(400, 50, 100), Protocol::Tigon);
    config.index_buckets_per_host = 64;
    config.hwcc_budget_bytes = 2 * (64 * 8 + 40 * 32);
    config
}

#[test]
fn small_budget_forces_clock_move_outs_and_stays_correct() {
    // Goal: CLOCK moves tuples back out under a tight HWcc budget, never exceeding it, and the data
    // survives the round trips. Method: room for ~40 CATs per host, 400 keys, updates across hosts.
    let _pod = exclusive();
    let config = tight_budget_ycsb();
    let report = Pod::run(config.clone()).expect("run");
    assert_ycsb(&report);
    assert!(report.total.moves_out > 100, "moves out: {}", report.total.moves_out);
    for host in &report.per_host {
        assert!(host.hwcc_peak_bytes <= config.hwcc_budget_per_host(), "peak {} over budget", host.hwcc_peak_bytes);
    }
}

#[test]
fn requester_searches_the_owners_index_again_after_a_migration() {
    // Goal: like Tigon's requester (`get_migrated_row` on DATA_MIGRATION_RESPONSE), ours reaches a
    // tuple it had moved in through the owner's CXL index: every remote access searches the index
    // once, and each migration once more, and those searches read HWcc lines. Method: YCSB 100%
    // cross with moves in and out under a small budget; the searches are exactly accesses plus
    // migrations, and each search reads at least the bucket line.
    let _pod = exclusive();
    let config = tight_budget_ycsb();
    let report = Pod::run(config).expect("run");
    assert_ycsb(&report);
    let total = &report.total;
    assert!(total.remote_messages > 100, "too few migrations to tell: {total:?}");
    assert_eq!(total.remote_index_searches, total.remote_accesses + total.remote_messages, "{total:?}");
    assert!(total.hwcc_lines_read >= total.remote_index_searches, "{total:?}");
}

#[test]
fn no_swcc_frees_blocks_at_move_out_and_writes_a_fresh_one_at_every_move_in() {
    // Goal: under NoSWcc all CXL data is hardware-coherent memory charged to the budget, so — as in
    // Tigon, whose move-out frees the block when SWcc is off — no block outlives its CAT, and every
    // move-in writes its row into a fresh block. Method: read-heavy YCSB across hosts, 1000-byte
    // rows (16-line blocks), a budget for ~40 CATs per host: blocks in use never exceed the budget,
    // and at least a whole block is written per move-in (reads and messages write far fewer).
    let _pod = exclusive();
    let mut workload = ycsb(400, 95, 100);
    if let WorkloadConfig::Ycsb(ycsb) = &mut workload {
        ycsb.value_bytes = 1000;
    }
    let mut config = small(workload, Protocol::Tigon);
    config.swcc = SwccProtocol::NoSwcc;
    config.index_buckets_per_host = 64;
    config.hwcc_budget_bytes = 2 * (64 * 8 + 40 * (32 + 1024));
    let report = Pod::run(config.clone()).expect("run");
    assert_ycsb(&report);
    let total = &report.total;
    assert!(total.moves_out > 100, "moves out: {}", total.moves_out);
    for host in &report.per_host {
        let (peak, budget) = (host.swcc_peak_bytes, config.hwcc_budget_per_host());
        assert!(peak <= budget, "{peak} bytes of blocks outlive the HWcc budget of {budget}");
    }
    let floor = 16 * total.moves_in;
    assert!(total.coherent_written_lines >= floor, "{} lines written, floor {floor}", total.coherent_written_lines);
}

#[test]
fn exhausted_budget_refuses_migrations_with_out_of_memory() {
    // Goal: FAIL_OOM — when every CAT is pinned no eviction helps and the requester aborts, and the
    // run stays correct. Method: room for 2 CATs per host, 4 hosts all updating across hosts.
    let _pod = exclusive();
    let mut config = small(bank(50, 100), Protocol::Tigon);
    config.hosts = 4;
    config.index_buckets_per_host = 16;
    config.hwcc_budget_bytes = 4 * (16 * 8 + 2 * 32);
    let report = Pod::run(config.clone()).expect("run");
    assert_bank(&report, bank_config(&config.workload));
    assert!(report.total.moves_refused > 0, "no refused migration: {:?}", report.total);
    assert!(report.total.aborts_out_of_memory > 0);
}

#[test]
fn eight_hosts_share_one_region() {
    // Goal: the pod scales to its maximum of 8 host processes. Method: bank on 8 hosts, every
    // transfer crossing hosts, for each protocol.
    let _pod = exclusive();
    for protocol in PROTOCOLS {
        let mut config = small(bank(30, 100), protocol);
        config.hosts = 8;
        config.measure_ms = 400;
        let report = Pod::run(config.clone()).unwrap_or_else(|error| panic!("{protocol:?}: {error}"));
        assert_bank(&report, bank_config(&config.workload));
        assert!(report.per_host.iter().all(|host| host.committed > 0), "a host starved: {protocol:?}");
    }
}

#[test]
fn shortcut_off_reaches_own_cats_through_the_index() {
    // Goal: the no-shortcut ablation still works and costs HWcc reads. Method: same run with the
    // shortcut on and off; compare index lines read per commit.
    let _pod = exclusive();
    let mut reads_per_commit = Vec::new();
    for shortcut in [true, false] {
        let mut config = small(ycsb(100, 50, 100), Protocol::Tigon);
        config.shortcut = shortcut;
        let report = Pod::run(config).expect("run");
        assert_ycsb(&report);
        reads_per_commit.push(report.total.hwcc_lines_read as f64 / report.total.committed as f64);
    }
    assert!(reads_per_commit[1] > reads_per_commit[0], "{reads_per_commit:?}");
}

#[test]
fn real_flush_instructions_and_noop_back_ends_run_the_same_workload() {
    // Goal: the suite's default is the simulator; the two other back-ends must work too. Method:
    // contended bank with real clflushopt/clwb (which flush the actually coherent region), then with
    // no flushes at all (the NoSWcc ablation's back-end).
    let _pod = exclusive();
    for coherence in [CoherenceBackend::X86Flush, CoherenceBackend::Noop] {
        let mut config = small(bank(40, 80), Protocol::Tigon);
        config.coherence = coherence;
        let report = Pod::run(config.clone()).expect("run");
        assert_bank(&report, bank_config(&config.workload));
        let flushed = report.total.swcc_invalidated_lines + report.total.swcc_written_back_lines;
        assert_eq!(flushed > 0, coherence == CoherenceBackend::X86Flush, "{coherence:?} flushed {flushed} lines");
    }
}

#[test]
fn invalid_configuration_lists_every_problem() {
    // Goal: bad input is a clear typed error naming all problems. Method: three mistakes at once.
    let mut config = PodConfig::new(ycsb(1, 150, 0));
    config.hosts = 9;
    match Pod::create(config) {
        Err(PodError::Config(problems)) => assert!(problems.len() >= 3, "{problems:?}"),
        Err(other) => panic!("wrong error: {other}"),
        Ok(_) => panic!("accepted an invalid configuration"),
    }
}

#[test]
fn measurement_lasts_until_enough_work_is_acknowledged() {
    // Goal: tests can ask for an amount of work instead of a duration (a loaded machine must not
    // make them vacuous). Method: a 1 ms window that must still contain 1500 acknowledged
    // transactions; the measured window's commits and duration show it was extended.
    let _pod = exclusive();
    let mut config = small(ycsb(1000, 50, 50), Protocol::Tigon);
    config.warmup_ms = 0;
    config.measure_ms = 1;
    config.measure_acked_min = 1500;
    let report = Pod::run(config).expect("run");
    assert_ycsb(&report);
    assert!(report.total.committed >= 1500, "window committed only {}", report.total.committed);
    let longest_ns = report.per_host.iter().map(|host| host.measured_ns).max().unwrap_or(0);
    assert!(longest_ns > 1_000_000, "the window was not extended past 1 ms: {longest_ns} ns");
}

#[test]
fn baselines_batch_a_phase_of_remote_reads_into_one_round_trip() {
    // Goal: as in Tigon's TwoPL executor, a transaction's remote reads of one phase travel as one
    // message per owner with one wait — not a round trip per tuple. Method: read-only YCSB, every
    // transaction across two hosts (about five remote keys each); DS2PL+ waits once per attempt
    // (its read locks are released one-way), OCC+ twice (reads, then validation).
    let _pod = exclusive();
    for (protocol, waits_per_attempt) in [(Protocol::Ds2pl, 1), (Protocol::Occ, 2)] {
        let report = Pod::run(small(ycsb(1000, 100, 100), protocol)).expect("run");
        assert_ycsb(&report);
        let total = &report.total;
        assert!(total.remote_accesses >= 3 * total.attempts, "{protocol:?}: {total:?}");
        assert!(total.round_trips <= waits_per_attempt * total.attempts, "{protocol:?}: {total:?}");
        assert!(total.round_trips * 3 <= total.remote_accesses * waits_per_attempt, "{protocol:?}: {total:?}");
    }
}
