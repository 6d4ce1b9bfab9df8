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

/// Logs in on a raw socket the way a client does and returns the socket.
fn raw_login(address: SocketAddr) -> anyhow::Result<std::net::TcpStream> {
    use bypass_dispatch::pglogin::{Login, LoginStep};
    let mut stream = std::net::TcpStream::connect(address)?;
    stream.set_read_timeout(Some(Duration::from_secs(20)))?;
    let (mut login, startup) = Login::start(login());
    stream.write_all(&startup)?;
    let mut input = Vec::new();
    loop {
        let (tag, body) = next_message(&mut stream, &mut input)?.ok_or_else(|| anyhow::anyhow!("closed in login"))?;
        match login.on_message(bypass_wire::BackendMessage::decode(tag, &body)?)? {
            LoginStep::Send(bytes) => stream.write_all(&bytes)?,
            LoginStep::Continue => {}
            LoginStep::Done(_) => return Ok(stream),
        }
    }
}

/// The next backend message, or `None` once the peer closed.
fn next_message(stream: &mut std::net::TcpStream, input: &mut Vec<u8>) -> anyhow::Result<Option<(u8, Vec<u8>)>> {
    loop {
        if input.len() >= 5 {
            let length = u32::from_be_bytes([input[1], input[2], input[3], input[4]]) as usize;
            if input.len() > length {
                let body = input[5..1 + length].to_vec();
                let tag = input[0];
                input.drain(..1 + length);
                return Ok(Some((tag, body)));
            }
        }
        let mut chunk = [0u8; 8192];
        match stream.read(&mut chunk) {
            Ok(0) => return Ok(None),
            Ok(read) => input.extend_from_slice(&chunk[..read]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Ok(None),
            Err(e) => return Err(e.into()),
        }
    }
}

// Goal: a logged-in client whose message does not decode gets a FATAL 08P01 saying why before
// the dispatcher closes (it used to close without a word), and the dispatcher goes on. Method:
// a bad length, a length of 1 GiB, an unknown tag, a Query without its terminator, a Describe
// of an unknown kind, a StartupPacket and an SSLRequest, each on a fresh raw connection after a
// real login.
#[test]
fn undecodable_messages_after_login_are_answered_with_08p01() -> anyhow::Result<()> {
    let postgres = logged_postgres()?;
    let agent = start_agent(postgres.port())?;
    let dispatcher = dispatcher::start(dispatcher_config(&[agent.ready], 0, &[])?, None)?;
    let address = dispatcher.ready.local_addr;
    let mut describe_unknown_kind = vec![b'D', 0, 0, 0, 6, b'X', 0];
    describe_unknown_kind.extend_from_slice(&[b'S', 0, 0, 0, 4]);
    let mut startup_again = Vec::new();
    bypass_wire::startup::encode_startup(&mut startup_again, &[("user", "postgres")]);
    let inputs: [Vec<u8>; 7] = [
        vec![b'Q', 0, 0, 0, 2],
        vec![b'Q', 0x40, 0, 0, 0],
        vec![b'!', 0, 0, 0, 4],
        vec![b'Q', 0, 0, 0, 8, b'a', b'b', b'c', b'd'],
        describe_unknown_kind,
        // A StartupPacket or SSLRequest again (type byte 0): refused at once, as PostgreSQL's
        // "invalid frontend message type 0", not waited on as a message some kilobytes long.
        startup_again,
        vec![0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f],
    ];
    for input in inputs {
        let mut stream = raw_login(address)?;
        stream.write_all(&input)?;
        let mut pending = Vec::new();
        let answer = next_message(&mut stream, &mut pending)?;
        let Some((b'E', body)) = answer else { anyhow::bail!("{input:?}: no ErrorResponse but {answer:?}") };
        let text = String::from_utf8_lossy(&body).into_owned();
        assert!(text.contains("C08P01"), "{input:?}: {text}");
        assert!(next_message(&mut stream, &mut pending)?.is_none(), "{input:?}: the connection closes");
    }
    let mut connection = connect(address)?;
    assert_eq!(connection.query("select 'still serving'")?.rows[0][0].as_deref(), Some("still serving"));
    Ok(())
}
