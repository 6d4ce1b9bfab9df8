//! No door around authentication (issue 21): the dispatcher authenticates its clients through the
//! front door, the agent admits only a dispatcher that proves the agent key, and hostile bytes
//! leave both serving. PostgreSQL 15 runs with `log_connections`, so "nothing reached PostgreSQL"
//! is read from its own log.

mod common;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::Duration;

use bypass_dispatch::agent::key::LinkKey;
use bypass_dispatch::config::BackendSpec;
use bypass_dispatch::dispatcher::{self, BackendState};
use bypass_dispatch::error::DispatchError;
use bypass_dispatch::pglogin::LoginRequest;
use bypass_lab::pgclient::PgConnection;
use bypass_testkit::{Postgres, PostgresOptions};
use common::{connect, dispatcher_config, login, start_agent, wait_until, AGENT_KEY, PASSWORD};

fn logged_postgres() -> anyhow::Result<Postgres> {
    Ok(Postgres::start_with(PostgresOptions {
        extra_conf: vec!["log_connections = on".into()],
        ..PostgresOptions::default()
    })?)
}

/// Connections PostgreSQL has received so far, from its log.
fn connections_received(postgres: &Postgres) -> usize {
    std::fs::read_to_string(postgres.log_file()).unwrap_or_default().matches("connection received").count()
}

fn sqlstate(result: Result<PgConnection, DispatchError>) -> String {
    match result {
        Ok(_) => "admitted".into(),
        Err(DispatchError::Server { code, .. }) => code,
        Err(other) => format!("no SQLSTATE: {other}"),
    }
}

/// Opens a link to `agent` with `key` the way a dispatcher does.
fn link_with_key(agent: SocketAddr, key: &str) -> Result<(), DispatchError> {
    let spec = BackendSpec { name: "b".into(), agent, postgres: None, mac: None };
    let backend = BackendState::new(0, spec, 1, None, LinkKey::from_text(key).expect("test key"));
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    runtime.block_on(backend.connect(LoginRequest::trust("postgres", "postgres"))).map(drop)
}

/// Sends raw bytes and reads whatever comes back until the peer closes or 5 s pass.
fn send_raw(address: SocketAddr, bytes: &[u8]) -> Vec<u8> {
    let mut stream = std::net::TcpStream::connect(address).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    let _ = stream.write_all(bytes);
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    answer
}

/// Hostile inputs: a bad length, an oversized startup packet, protocol 2, random bytes, an
/// SSLRequest followed by garbage, a startup that never finishes.
fn hostile_inputs() -> Vec<Vec<u8>> {
    let mut ssl_then_garbage = Vec::new();
    bypass_wire::startup::encode_request(&mut ssl_then_garbage, &bypass_wire::StartupPacket::SslRequest);
    ssl_then_garbage.extend_from_slice(&[0xff; 64]);
    vec![
        vec![0, 0, 0, 3, 0, 0, 0, 0],
        vec![0x7f, 0xff, 0xff, 0xff, 0, 3, 0, 0],
        vec![0, 0, 0, 9, 0, 2, 0, 0, 0],
        (0..65_536u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8).collect(),
        ssl_then_garbage,
        vec![0, 0, 0, 100, 0, 3, 0, 0, b'u'],
    ]
}

// Goal: the agent refuses a plain PostgreSQL client (28000) and a dispatcher with the wrong key
// (28P01), survives hostile bytes, and PostgreSQL receives no connection for any of them; the
// right key still works. Method: a real client, a link with another key, raw bytes, then PG's
// log of received connections.
#[test]
fn the_agent_admits_only_a_dispatcher_holding_its_key() -> anyhow::Result<()> {
    let postgres = logged_postgres()?;
    let agent = start_agent(postgres.port())?;
    let before = connections_received(&postgres);
    let plain =
        PgConnection::connect(agent.ready, LoginRequest::trust("postgres", "postgres"), Duration::from_secs(10));
    assert_eq!(sqlstate(plain), "28000", "a plain client");
    let psql = std::process::Command::new(bypass_testkit::pg_bin("psql"))
        .args(["-X", "-h", "127.0.0.1", "-U", "postgres", "-d", "postgres", "-c", "select 1"])
        .arg("-p")
        .arg(agent.ready.port().to_string())
        .output()?;
    assert!(!psql.status.success());
    assert!(
        String::from_utf8_lossy(&psql.stderr).contains("only a dispatcher holding the agent key"),
        "psql: {psql:?}"
    );
    let wrong = link_with_key(agent.ready, "another-key-that-is-long-enough-to-be-valid");
    assert!(matches!(&wrong, Err(DispatchError::Server { code, .. }) if code == "28P01"), "{wrong:?}");
    for input in hostile_inputs() {
        send_raw(agent.ready, &input);
    }
    assert_eq!(connections_received(&postgres), before, "an unproven peer reached PostgreSQL");
    link_with_key(agent.ready, AGENT_KEY)?;
    wait_until(Duration::from_secs(5), "PostgreSQL to log the proven link", || {
        connections_received(&postgres) == before + 1
    })?;
    Ok(())
}

// Goal: the dispatcher authenticates clients through the front door: a wrong password and an
// unknown user get 28P01, no password is refused, hostile bytes leave it serving, and nothing
// of a failed login reaches PostgreSQL. Method: real PostgreSQL, agent and dispatcher.
#[test]
fn the_dispatcher_refuses_wrong_passwords_and_survives_hostile_bytes() -> anyhow::Result<()> {
    let postgres = logged_postgres()?;
    let agent = start_agent(postgres.port())?;
    let dispatcher = dispatcher::start(dispatcher_config(&[agent.ready], 0, &[])?, None)?;
    let address = dispatcher.ready.local_addr;
    let mut connection = connect(address)?;
    assert_eq!(connection.query("select 41 + 1")?.rows[0][0].as_deref(), Some("42"));
    drop(connection);
    let timeout = Duration::from_secs(20);
    let before = connections_received(&postgres);
    let wrong = LoginRequest { password: Some("wrong".into()), ..login() };
    assert_eq!(sqlstate(PgConnection::connect(address, wrong, timeout)), "28P01", "wrong password");
    let unknown = LoginRequest { password: Some(PASSWORD.into()), ..LoginRequest::trust("mallory", "postgres") };
    assert_eq!(sqlstate(PgConnection::connect(address, unknown, timeout)), "28P01", "unknown user");
    let no_password = PgConnection::connect(address, LoginRequest::trust("postgres", "postgres"), timeout);
    assert!(no_password.is_err(), "a client without a password was admitted");
    for input in hostile_inputs() {
        send_raw(address, &input);
    }
    assert_eq!(connections_received(&postgres), before, "a failed login reached PostgreSQL");
    let mut connection = connect(address)?;
    assert_eq!(connection.query("select 'still serving'")?.rows[0][0].as_deref(), Some("still serving"));
    Ok(())
}
