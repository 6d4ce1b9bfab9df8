//! Software cache coherence under the simulated non-coherent caches: every protocol and SWcc
//! variant passes with random early evictions (the other suites run on the simulator too, see
//! `common::small`), and a deliberately missing flush is caught.

mod common;

use bypass_pod::checker;
use bypass_pod::coherence::{CoherenceBackend, SwccProtocol};
use bypass_pod::config::InjectedFault;
use bypass_pod::history::read_histories;
use bypass_pod::{Pod, PodConfig, Protocol};
use common::*;

/// Whether a run's outcome is wrong in any way the tests can see: a failed host check, a lost
/// update (counters vs commits) or a non-serializable history.
fn damage(mut config: PodConfig) -> Option<String> {
    let dir = tempfile::tempdir().expect("tempdir");
    config.history_dir = Some(dir.path().to_path_buf());
    let hosts = config.hosts;
    let report = match Pod::run(config) {
        Ok(report) => report,
        Err(error) => return Some(format!("run failed: {error}")),
    };
    let counted: u64 = report.per_host.iter().map(|host| host.check_value_a).sum();
    let committed: u64 = report.per_host.iter().map(|host| host.check_value_b).sum();
    if counted != committed {
        return Some(format!("lost updates: counters sum to {counted}, {committed} updates committed"));
    }
    let verdict = checker::check(&read_histories(dir.path(), hosts).expect("histories"));
    verdict.anomalies.first().cloned()
}

fn contended(protocol: Protocol) -> PodConfig {
    let mut config = small(ycsb(32, 50, 100), protocol);
    config.coherence = incoherent();
    config.index_buckets_per_host = 16;
    config.hwcc_budget_bytes = 2 * (16 * 8 + 12 * 32);
    config
}

#[test]
fn every_protocol_and_swcc_variant_is_correct_on_incoherent_caches() {
    // Goal: the whole suite passes when every host sees the SWcc arena through its own non-coherent
    // cache with random early evictions. Method: contended YCSB with migrations, for each protocol
    // and, for Tigon, each SWcc variant; require no lost update and a serializable history.
    let _pod = exclusive();
    for protocol in PROTOCOLS {
        assert_eq!(damage(contended(protocol)), None, "{protocol:?}");
    }
    for swcc in [SwccProtocol::NoSharedReader, SwccProtocol::NonTemporal] {
        let mut config = contended(Protocol::Tigon);
        config.swcc = swcc;
        assert_eq!(damage(config), None, "{swcc:?}");
    }
    let mut banked = small(bank(20, 80), Protocol::Tigon);
    banked.coherence = incoherent();
    let report = Pod::run(banked.clone()).expect("run");
    assert_bank(&report, bank_config(&banked.workload));
    assert!(report.total.swcc_invalidated_lines > 0 && report.total.swcc_written_back_lines > 0);
}

#[test]
fn a_missing_invalidation_is_caught_by_the_simulator() {
    // Goal: prove the simulator exposes a reader that forgets to invalidate. Method: inject the bug;
    // the run must show damage on incoherent caches and none on coherent memory (the same bug is
    // harmless there, so it is the simulator that catches it).
    let _pod = exclusive();
    let mut broken = contended(Protocol::Tigon);
    broken.fault = Some(InjectedFault::SkipReaderInvalidate);
    broken.coherence = CoherenceBackend::Incoherent { early_evictions_per_million: 0 };
    let found = damage(broken.clone());
    assert!(found.is_some(), "a reader skipping invalidation went unnoticed");
    broken.coherence = CoherenceBackend::Noop;
    assert_eq!(damage(broken), None, "on coherent memory the skipped invalidation is harmless");
}

#[test]
fn a_missing_write_back_is_caught_by_the_simulator() {
    // Goal: prove the simulator exposes a writer that forgets to write back. Method: as above, with
    // the write-back skipped at write-lock release.
    let _pod = exclusive();
    let mut broken = contended(Protocol::Tigon);
    broken.fault = Some(InjectedFault::SkipWriterWriteback);
    broken.coherence = CoherenceBackend::Incoherent { early_evictions_per_million: 0 };
    assert!(damage(broken.clone()).is_some(), "a writer skipping write-back went unnoticed");
    broken.coherence = CoherenceBackend::Noop;
    assert_eq!(damage(broken), None, "on coherent memory the skipped write-back is harmless");
}
