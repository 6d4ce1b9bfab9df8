//! The pod's message protocol under hostile input: random bytes, truncated messages, oversized
//! counts, well-formed messages that name what does not exist, another protocol's messages and
//! replies to nothing in flight, put into a running host's inbox as if a peer had sent them.
//! Every one must be dropped and counted, the host must keep serving, and the run's invariants
//! must hold.

mod common;

use std::time::Duration;

use bypass_pod::message::{AccessItem, AccessMode, InsertOutcome, Message, MigrateOutcome, RemoteWrite};
use bypass_pod::region::Phase;
use bypass_pod::rng::SplitMix64;
use bypass_pod::{Pod, Protocol};
use common::*;

/// Payloads that must all be refused by a host running `protocol` with YCSB (one table).
fn hostile(protocol: Protocol) -> Vec<Vec<u8>> {
    let mut rng = SplitMix64::new(0xbad);
    let mut payloads = Vec::new();
    let undecodable = |bytes: &[u8]| Message::decode(1, bytes).is_err();
    while payloads.len() < 300 {
        let len = rng.below(300) as usize;
        let bytes: Vec<u8> = (0..len).map(|_| rng.below(256) as u8).collect();
        if undecodable(&bytes) {
            payloads.push(bytes);
        }
    }
    let mut encoded = Vec::new();
    let items = vec![AccessItem { table: 0, key: 3, mode: AccessMode::WriteLock }; 4];
    Message::Access { request: 7, gid: 1 << 56, items }.encode(&mut encoded);
    payloads.extend((0..encoded.len()).map(|len| encoded[..len].to_vec()));
    // More keys than a migration request may carry, with the bytes to back them (a ring slot
    // bounds any payload's size; the codec bounds each count).
    let mut oversized = vec![1u8, 9, 0, 0, 0];
    oversized.extend_from_slice(&300u32.to_le_bytes());
    oversized.extend(std::iter::repeat_n(0u8, 300 * 9));
    payloads.push(oversized);
    let well_formed = [
        Message::Migrate { request: 5, keys: vec![(9, 1)] },
        Message::RemoteDelete { table: 0, key: u64::MAX - 7 },
        Message::InsertDone { table: 0, key: u64::MAX - 7, committed: true },
        Message::MigrateReply { request: 4242, outcomes: vec![MigrateOutcome::NotFound] },
        Message::MigrateReply { request: 4243, outcomes: vec![MigrateOutcome::Moved { node: 3 }] },
        Message::RemoteInsertReply { request: 4244, outcome: InsertOutcome::Exists },
        Message::Prepare {
            request: 6,
            gid: 1 << 56,
            writes: vec![RemoteWrite { table: 0, key: 3, value: Some(vec![0; 7]) }],
            reads: vec![],
        },
        Message::Decided { request: 77 },
        // Another protocol's requests, well formed.
        match protocol {
            Protocol::Tigon => Message::Lock { request: 8, gid: 1 << 56, keys: vec![(0, 3)] },
            _ => Message::MigrateScan { request: 8, table: 0, low: 1, high: 9, limit: 4 },
        },
    ];
    for message in well_formed {
        message.encode(&mut encoded);
        payloads.push(encoded.clone());
    }
    payloads
}

#[test]
fn hostile_messages_are_dropped_and_counted_and_the_pod_carries_on() {
    let _pod = exclusive();
    for protocol in [Protocol::Tigon, Protocol::Ds2pl] {
        let config = small(ycsb(200, 80, 50), protocol);
        let payloads = hostile(protocol);
        let mut pod = Pod::create(config).expect("create");
        pod.start().expect("start");
        pod.wait_ready().expect("ready");
        pod.set_phase(Phase::Warmup);
        pod.set_phase(Phase::Measure);
        for payload in &payloads {
            // A hang guard only: the host drains its inbox between transactions.
            let started = std::time::Instant::now();
            while !pod.inject(0, 1, payload).expect("inject") {
                assert!(started.elapsed() < Duration::from_secs(60), "host 0 stopped reading its inbox");
                pod.watch(Duration::from_millis(1)).expect("hosts alive");
            }
        }
        pod.watch(Duration::from_millis(200)).expect("hosts alive");
        pod.set_phase(Phase::Stop);
        pod.wait_finished().expect("every host finishes cleanly");
        let report = pod.report();
        assert_ycsb(&report);
        assert_eq!(report.per_host[0].malformed_messages, payloads.len() as u64, "{protocol:?}");
        assert_eq!(report.per_host[1].malformed_messages, 0, "{protocol:?}: nothing reached the peer");
        assert_eq!(report.total.check_failures, 0);
    }
}
