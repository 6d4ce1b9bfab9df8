//! The load generator against real PostgreSQL: every byte verified, sizes across the sweep.

use std::net::SocketAddr;
use std::time::Duration;

use bypass_dispatch::pglogin::LoginRequest;
use bypass_dispatch::DispatchError;
use bypass_lab::lab::{Lab, LabSpec, POSTGRES_PORT};
use bypass_lab::loadgen::{self, LoadSpec, Target};
use bypass_lab::payload::{self, Verifier};
use bypass_lab::pgclient::PgConnection;
use bypass_lab::services::LabPostgres;
use bypass_testkit::Postgres;

fn spec(address: SocketAddr, namespace: Option<String>, size: u64, connections: usize) -> LoadSpec {
    LoadSpec {
        targets: vec![Target { namespace, address, connections }],
        size,
        warmup: Duration::ZERO,
        duration: Duration::ZERO,
        queries_min: 3,
        queries_max: 3,
        login: LoginRequest::trust("postgres", "postgres"),
        read_timeout: Duration::from_secs(30),
    }
}

// Goal: payloads of the sweep arrive complete and verified from stock PostgreSQL;
// method: 3 queries per size on 2 connections to a testkit cluster on loopback.
#[test]
fn sweep_sizes_are_verified_against_real_postgres() -> anyhow::Result<()> {
    let postgres = Postgres::start()?;
    let address: SocketAddr = format!("127.0.0.1:{}", postgres.port()).parse()?;
    for size in [1, 64, 4 * 1024, 32 * 1024, 256 * 1024, 1 << 20, 16 << 20] {
        let report = loadgen::run(&spec(address, None, size, 2))?;
        assert_eq!(report.errors, 0, "size {size}: {:?}", report.error_samples);
        assert_eq!(report.queries, 6, "size {size}");
        assert_eq!(report.payload_bytes, 6 * size, "size {size}");
        assert!(report.latency_p50_us > 0 && report.throughput_gbit_s > 0.0);
    }
    Ok(())
}

// Goal: verification really checks content; method: ask for seed 1, verify as seed 2, and
// expect a mismatch at byte 0 — then the same connection still works.
#[test]
fn a_wrong_payload_is_reported_at_its_offset() -> anyhow::Result<()> {
    let postgres = Postgres::start()?;
    let address: SocketAddr = format!("127.0.0.1:{}", postgres.port()).parse()?;
    let mut connection =
        PgConnection::connect(address, LoginRequest::trust("postgres", "postgres"), Duration::from_secs(10))?;
    connection.send_query(&payload::query(1, 100_000))?;
    let error = connection.read_payload(&mut Verifier::new(1, 2, 100_000)).expect_err("wrong seed must fail");
    assert!(matches!(error, DispatchError::PayloadMismatch { offset: 0, .. }), "{error}");
    connection.send_query(&payload::query(3, 100_000))?;
    assert_eq!(connection.read_payload(&mut Verifier::new(2, 3, 100_000))?, 100_000);
    connection.send_query("select * from no_such_table")?;
    let error = connection.read_payload(&mut Verifier::new(3, 3, 1)).expect_err("server error");
    assert!(matches!(error, DispatchError::Server { ref code, .. } if code == "42P01"), "{error}");
    Ok(())
}

// Goal: in the lab, clients reach a backend's PostgreSQL over the shaped link, verified;
// method: PostgreSQL in be1, two connections from cli1 and cli2 asking for 1 MB.
#[test]
fn clients_in_the_lab_load_a_backend_directly() -> anyhow::Result<()> {
    let lab = Lab::up_owned(LabSpec { name: bypass_lab::lab::unique_name("lg"), ..LabSpec::default() })?;
    let backend = lab.backend(1);
    let postgres = LabPostgres::start(&backend.namespace, backend.address, None)?;
    assert_eq!(postgres.psql("select 1")?, "1");
    let address = SocketAddr::from((backend.address, POSTGRES_PORT));
    let mut load = spec(address, Some(lab.client(1).namespace), 1 << 20, 1);
    load.targets.push(Target { namespace: Some(lab.client(2).namespace), address, connections: 1 });
    let report = loadgen::run(&load)?;
    assert_eq!(report.errors, 0, "{:?}", report.error_samples);
    assert_eq!(report.payload_bytes, 6 << 20);
    Ok(())
}
