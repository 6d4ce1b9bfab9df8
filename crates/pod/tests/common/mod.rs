//! Helpers shared by the pod's integration tests: small configurations and invariant checks.
//! Pods run one at a time (each forks its hosts and uses both cores).

#![allow(dead_code)]

use std::sync::{Mutex, MutexGuard};

use bypass_pod::coherence::CoherenceBackend;
use bypass_pod::workload::bank::BankConfig;
use bypass_pod::workload::ycsb::YcsbConfig;
use bypass_pod::workload::WorkloadConfig;
use bypass_pod::{PodConfig, Protocol, RunReport};

static ONE_POD_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Serialises pods across the tests of one binary.
pub fn exclusive() -> MutexGuard<'static, ()> {
    ONE_POD_AT_A_TIME.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

pub const PROTOCOLS: [Protocol; 3] = [Protocol::Tigon, Protocol::Ds2pl, Protocol::Occ];

/// A short run with small arenas, on the simulated non-coherent caches with random early
/// write-backs — so the whole integration suite runs under the simulator unless a test picks
/// another back-end.
pub fn small(workload: WorkloadConfig, protocol: Protocol) -> PodConfig {
    let mut config = PodConfig::new(workload);
    config.protocol = protocol;
    config.coherence = incoherent();
    config.warmup_ms = 100;
    config.measure_ms = 600;
    // Count-driven, not clock-driven: on a loaded 2-core machine a slow protocol may commit only a
    // handful in 600 ms, and the tests' assertions need real work to mean anything.
    config.measure_acked_min = 200;
    config.swcc_bytes_per_host = 4 << 20;
    config.hwcc_budget_bytes = 1 << 20;
    config
}

pub fn bank(accounts_per_host: u64, cross_percent: u32) -> WorkloadConfig {
    WorkloadConfig::Bank(BankConfig { accounts_per_host, cross_percent, initial_balance: 1000 })
}

pub fn ycsb(keys_per_host: u64, read_percent: u32, cross_percent: u32) -> WorkloadConfig {
    WorkloadConfig::Ycsb(YcsbConfig {
        keys_per_host,
        value_bytes: 200,
        ops_per_txn: 10,
        theta: 0.9,
        read_percent,
        cross_percent,
    })
}

pub fn incoherent() -> CoherenceBackend {
    CoherenceBackend::Incoherent { early_evictions_per_million: 20_000 }
}

/// Bank invariants: the total is unchanged and each host's ledger counts its commits.
pub fn assert_bank(report: &RunReport, config: &BankConfig) {
    let total: i64 = report.per_host.iter().map(|host| host.check_value_a as i64).sum();
    assert_eq!(total, config.total(report.hosts), "bank total changed ({:?})", report.protocol);
    for (host, counters) in report.per_host.iter().enumerate() {
        assert_eq!(counters.check_value_b, counters.committed_all, "host {host}'s ledger vs its commits");
    }
    assert!(report.total.committed > 0, "nothing committed");
}

/// YCSB invariant: every committed update incremented exactly one counter.
pub fn assert_ycsb(report: &RunReport) {
    let counted: u64 = report.per_host.iter().map(|host| host.check_value_a).sum();
    let committed: u64 = report.per_host.iter().map(|host| host.check_value_b).sum();
    assert_eq!(counted, committed, "row counters vs committed updates ({:?})", report.protocol);
    assert!(report.total.committed > 0, "nothing committed");
}

pub fn bank_config(workload: &WorkloadConfig) -> &BankConfig {
    match workload {
        WorkloadConfig::Bank(config) => config,
        _ => panic!("not a bank workload"),
    }
}
