//! TLS on both sides: clients reach the pooler over TLS (SSLRequest and PostgreSQL 17 direct TLS,
//! psql and tokio-postgres with a test CA), plaintext is refused under `require`, client
//! certificates are demanded under `verify-full`, and the pooler reaches a TLS PostgreSQL with
//! `server_tls_sslmode = verify-full`. Certificates are generated per test with rcgen.

mod common;

use std::collections::HashSet;
use std::process::Command;
use std::time::Duration;

use bypass_pooler::config::PoolMode;
use bypass_pooler::tls::{ClientSslMode, ServerSslMode};
use bypass_pooler::Config;
use bypass_testkit::{pg_bin, Postgres};
use common::certs::{enable_server_tls, require_client_certificate, Issued, TestCa};
use common::*;
use tokio_postgres::config::{SslMode, SslNegotiation};
use tokio_postgres_rustls::MakeRustlsConnect;

fn tls_config(postgres: &Postgres, ca: &TestCa, pooler: &Issued, mode: ClientSslMode) -> Config {
    let mut config = config(postgres, PoolMode::Transaction, 2);
    config.pooler.client_tls_sslmode = mode;
    config.pooler.client_tls_cert_file = Some(pooler.cert_file.clone());
    config.pooler.client_tls_key_file = Some(pooler.key_file.clone());
    config.pooler.client_tls_ca_file = Some(ca.ca_file());
    config
}

/// Runs psql with a libpq connection string and returns (success, stdout + stderr).
fn psql_conninfo(conninfo: &str, sql: &str) -> (bool, String) {
    let output = Command::new(pg_bin("psql"))
        .args(["-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", conninfo, "-c", sql])
        .env("PGCONNECT_TIMEOUT", "20")
        .output()
        .expect("psql runs");
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    (output.status.success(), text)
}

async fn connect_tls(
    port: u16,
    client_config: rustls::ClientConfig,
    negotiation: SslNegotiation,
) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let mut config = tokio_postgres::Config::new();
    config
        .host("127.0.0.1")
        .port(port)
        .user("postgres")
        .dbname("postgres")
        .ssl_mode(SslMode::Require)
        .ssl_negotiation(negotiation)
        .connect_timeout(Duration::from_secs(20));
    let (client, connection) = config.connect(MakeRustlsConnect::new(client_config)).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

#[test]
fn psql_connects_with_sslmode_require_and_verify_full() {
    // Goal: libpq clients get TLS from the pooler. Method: psql with sslmode=require, then
    // verify-full against the test CA; \conninfo must report an SSL connection.
    let postgres = postgres();
    let ca = TestCa::new();
    let pooler_cert = ca.pooler_certificate();
    let pooler = Pooler::start(tls_config(&postgres, &ca, &pooler_cert, ClientSslMode::Require));
    let base = format!("host=127.0.0.1 port={} user=postgres dbname=postgres", pooler.port);
    let (ok, text) = psql_conninfo(&format!("{base} sslmode=require"), "\\conninfo");
    assert!(ok && text.contains("SSL connection"), "sslmode=require: {text}");
    let verify_full = format!("{base} sslmode=verify-full sslrootcert={}", ca.ca_file().display());
    let (ok, text) = psql_conninfo(&verify_full, "select 40 + 2");
    assert!(ok && text.trim() == "42", "sslmode=verify-full: {text}");
    // A CA that did not sign the pooler's certificate must make verify-full fail.
    let other_ca = TestCa::new();
    let wrong = format!("{base} sslmode=verify-full sslrootcert={}", other_ca.ca_file().display());
    let (ok, text) = psql_conninfo(&wrong, "select 1");
    assert!(!ok, "verify-full with a foreign CA must fail: {text}");
}

#[test]
fn a_unix_socket_client_is_served_under_require() {
    // Goal: `require` is about the network; a local client on the `unix_socket_dir` socket is
    // served without TLS (PostgreSQL offers none there), while plaintext TCP stays refused.
    // Method: one pooler with require and a Unix socket; psql through the folder and over TCP.
    let postgres = postgres();
    let ca = TestCa::new();
    let pooler_cert = ca.pooler_certificate();
    let folder = tempfile::tempdir().expect("tempdir");
    let mut config = tls_config(&postgres, &ca, &pooler_cert, ClientSslMode::Require);
    config.pooler.unix_socket_dir = Some(folder.path().to_owned());
    let pooler = Pooler::start(config);
    let local = format!("host={} port={} user=postgres dbname=postgres", folder.path().display(), pooler.port);
    let (served, text) = psql_conninfo(&local, "select 40 + 2");
    assert!(served && text.trim() == "42", "{text}");
    let network = format!("host=127.0.0.1 port={} user=postgres dbname=postgres sslmode=disable", pooler.port);
    let (served, text) = psql_conninfo(&network, "select 1");
    assert!(!served && text.contains("SSL required"), "{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn plaintext_client_is_refused_under_require_and_served_under_prefer() {
    // Goal: `require` refuses plaintext with 28000 after the startup packet; `prefer` serves
    // both. Method: tokio-postgres without TLS against both modes, and with TLS under prefer.
    let postgres = postgres();
    let ca = TestCa::new();
    let pooler_cert = ca.pooler_certificate();
    let strict = Pooler::start(tls_config(&postgres, &ca, &pooler_cert, ClientSslMode::Require));
    let error = connect(strict.port, "postgres", None).await.expect_err("plaintext must be refused");
    assert_eq!(sqlstate(&error).as_deref(), Some("28000"), "{error}");
    let relaxed = Pooler::start(tls_config(&postgres, &ca, &pooler_cert, ClientSslMode::Prefer));
    let plain = connect_ok(relaxed.port).await;
    assert_eq!(plain.query_one("select 1::int", &[]).await.expect("plaintext query").get::<_, i32>(0), 1);
    let secure = connect_tls(relaxed.port, ca.client_config(None), SslNegotiation::Postgres).await.expect("TLS");
    assert_eq!(secure.query_one("select 2::int", &[]).await.expect("TLS query").get::<_, i32>(0), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn tokio_postgres_over_sslrequest_and_direct_tls() {
    // Goal: both negotiations work, and direct TLS without ALPN "postgresql" is refused. Method:
    // tokio-postgres-rustls with the test CA, SSLRequest then direct; a direct client without
    // ALPN must fail; many transactions run over TLS in transaction mode on two shards.
    let postgres = postgres();
    let ca = TestCa::new();
    let pooler_cert = ca.pooler_certificate();
    let pooler = Pooler::start(tls_config(&postgres, &ca, &pooler_cert, ClientSslMode::Require));
    for negotiation in [SslNegotiation::Postgres, SslNegotiation::Direct] {
        let client = connect_tls(pooler.port, ca.client_config(None), negotiation).await.expect("TLS connect");
        for round in 0..50i32 {
            let row = client.query_one("select $1::int + 1", &[&round]).await.expect("query over TLS");
            assert_eq!(row.get::<_, i32>(0), round + 1, "{negotiation:?}");
        }
    }
    // Large messages both ways: TLS records must be flushed whole, never left in rustls.
    let client = connect_tls(pooler.port, ca.client_config(None), SslNegotiation::Direct).await.expect("TLS");
    let big = "y".repeat(1 << 20);
    let row = client.query_one("select length($1::text), repeat('x', 4000000)", &[&big]).await.expect("big");
    assert_eq!(row.get::<_, i32>(0), 1 << 20);
    assert_eq!(row.get::<_, &str>(1).len(), 4_000_000);
    let mut without_alpn = ca.client_config(None);
    without_alpn.alpn_protocols.clear();
    assert!(
        connect_tls(pooler.port, without_alpn, SslNegotiation::Direct).await.is_err(),
        "direct TLS without ALPN must be refused"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn verify_full_demands_a_client_certificate_signed_by_the_ca() {
    // Goal: `verify-full` lets in only clients with a certificate from client_tls_ca_file.
    // Method: the same TLS client without a certificate, with a foreign one, with a good one.
    let postgres = postgres();
    let ca = TestCa::new();
    let pooler_cert = ca.pooler_certificate();
    let pooler = Pooler::start(tls_config(&postgres, &ca, &pooler_cert, ClientSslMode::VerifyFull));
    let anonymous = connect_tls(pooler.port, ca.client_config(None), SslNegotiation::Postgres).await;
    assert!(anonymous.is_err(), "a client without a certificate must be refused");
    let foreign_ca = TestCa::new();
    let foreign = foreign_ca.issue("foreign", "postgres", &[]);
    let refused = connect_tls(pooler.port, ca.client_config(Some(&foreign)), SslNegotiation::Postgres).await;
    assert!(refused.is_err(), "a certificate from another CA must be refused");
    let good = ca.issue("client", "postgres", &[]);
    let client = connect_tls(pooler.port, ca.client_config(Some(&good)), SslNegotiation::Postgres).await.expect("ok");
    assert_eq!(client.query_one("select 7::int", &[]).await.expect("query").get::<_, i32>(0), 7);
}

fn server_tls_config(postgres: &Postgres, host: &str, mode: ServerSslMode, ca: &TestCa) -> Config {
    let mut config = config(postgres, PoolMode::Transaction, 2);
    config.databases.get_mut("*").expect("wildcard entry").host = host.into();
    config.pooler.server_tls_sslmode = mode;
    config.pooler.server_tls_ca_file = Some(ca.ca_file());
    config
}

#[tokio::test(flavor = "multi_thread")]
async fn pooler_reaches_a_tls_postgres_with_verify_full_across_shards() {
    // Goal: server-side TLS with certificate and host name checks, and TLS servers that move
    // between shards stay usable. Method: a PostgreSQL with ssl=on and a certificate for
    // "localhost"; pg_stat_ssl must show every server connection encrypted; 8 clients on two
    // shards share 2 servers, so servers move, and still only 2 backends are ever used (a
    // failed move would close the server and open a new backend).
    let postgres = postgres();
    let ca = TestCa::new();
    enable_server_tls(&postgres, &ca, &["localhost"]);
    let pooler = Pooler::start(server_tls_config(&postgres, "localhost", ServerSslMode::VerifyFull, &ca));
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let port = pooler.port;
        tasks.push(tokio::spawn(async move {
            let client = connect_ok(port).await;
            let mut pids = HashSet::new();
            for _ in 0..30 {
                let sql = "select ssl, pg_backend_pid() from pg_stat_ssl where pid = pg_backend_pid()";
                let row = client.query_one(sql, &[]).await.expect("query through a TLS server");
                assert!(row.get::<_, bool>(0), "the server connection must be encrypted");
                pids.insert(row.get::<_, i32>(1));
            }
            pids
        }));
    }
    let mut backends = HashSet::new();
    for task in tasks {
        backends.extend(task.await.expect("client task"));
    }
    let snapshot = pooler.shared.snapshot();
    assert!(snapshot.server_moves > 0, "servers must have moved between shards: {snapshot:?}");
    assert!(backends.len() <= 2, "moved TLS servers must be reused, not reopened: {backends:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn server_tls_modes_check_what_they_promise() {
    // Goal: verify-full checks the name, verify-ca only the chain, a foreign CA fails, and
    // require fails against a plaintext PostgreSQL. Method: a certificate for "localhost" only,
    // reached as 127.0.0.1 under both verify modes; then a foreign CA; then `require`.
    let postgres = postgres();
    let ca = TestCa::new();
    enable_server_tls(&postgres, &ca, &["localhost"]);
    let by_address = Pooler::start(server_tls_config(&postgres, "127.0.0.1", ServerSslMode::VerifyFull, &ca));
    let error = connect(by_address.port, "postgres", None).await.expect_err("name mismatch must fail");
    assert!(db_message(&error).contains("TLS"), "{error:?}");
    let chain_only = Pooler::start(server_tls_config(&postgres, "127.0.0.1", ServerSslMode::VerifyCa, &ca));
    let client = connect_ok(chain_only.port).await;
    let row = client.query_one("select ssl from pg_stat_ssl where pid = pg_backend_pid()", &[]).await.expect("q");
    assert!(row.get::<_, bool>(0), "verify-ca must still encrypt");
    let big = "y".repeat(1 << 20);
    let row = client.query_one("select length($1::text), repeat('x', 4000000)", &[&big]).await.expect("big");
    assert_eq!((row.get::<_, i32>(0), row.get::<_, &str>(1).len()), (1 << 20, 4_000_000), "large messages over TLS");

    let foreign_ca = TestCa::new();
    let untrusting = Pooler::start(server_tls_config(&postgres, "localhost", ServerSslMode::VerifyCa, &foreign_ca));
    let error = connect(untrusting.port, "postgres", None).await.expect_err("foreign CA must fail");
    assert!(db_message(&error).contains("TLS"), "{error:?}");

    let plain_postgres = common::postgres();
    let mut config = common::config(&plain_postgres, PoolMode::Transaction, 2);
    config.pooler.server_tls_sslmode = ServerSslMode::Require;
    let requiring = Pooler::start(config);
    let error = connect(requiring.port, "postgres", None).await.expect_err("require against plaintext must fail");
    assert!(db_message(&error).contains("does not accept TLS"), "{error:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn pooler_presents_its_certificate_to_a_server_that_demands_one() {
    // Goal: server_tls_cert_file/key_file answer PostgreSQL's `cert` method. Method: a role
    // that may only log in with a CA-signed certificate naming it; the pooler logs in as that
    // role with the certificate, and without it the login fails.
    let postgres = postgres_with_users(vec![bypass_testkit::TestUser::trust("certified")]);
    let ca = TestCa::new();
    enable_server_tls(&postgres, &ca, &["localhost"]);
    require_client_certificate(&postgres, &ca, "certified");
    let identity = ca.issue("certified", "certified", &[]);
    let make_config = |with_certificate: bool| {
        let mut config = server_tls_config(&postgres, "localhost", ServerSslMode::VerifyFull, &ca);
        config.databases.get_mut("*").expect("wildcard entry").user = Some("certified".into());
        if with_certificate {
            config.pooler.server_tls_cert_file = Some(identity.cert_file.clone());
            config.pooler.server_tls_key_file = Some(identity.key_file.clone());
        }
        config
    };
    let with_certificate = Pooler::start(make_config(true));
    let client = connect_ok(with_certificate.port).await;
    let row = client.query_one("select current_user::text", &[]).await.expect("query as certified");
    assert_eq!(row.get::<_, &str>(0), "certified");
    let without_certificate = Pooler::start(make_config(false));
    let error = connect(without_certificate.port, "postgres", None).await.expect_err("no certificate must fail");
    assert_eq!(sqlstate(&error).as_deref(), Some("28000"), "{error:?}");
}

#[test]
fn gssenc_request_is_declined_before_an_ssl_request() {
    // Goal: libpq's gssencmode=prefer order works: GSSENCRequest gets 'N', the SSLRequest that
    // follows gets 'S'. Method: raw requests on one TCP connection.
    let postgres = postgres();
    let ca = TestCa::new();
    let pooler_cert = ca.pooler_certificate();
    let pooler = Pooler::start(tls_config(&postgres, &ca, &pooler_cert, ClientSslMode::Prefer));
    let mut client = RawClient::connect(pooler.port);
    let mut answer = [0u8; 1];
    for (packet, expected) in
        [(bypass_wire::StartupPacket::GssEncRequest, b'N'), (bypass_wire::StartupPacket::SslRequest, b'S')]
    {
        let mut request = Vec::new();
        bypass_wire::startup::encode_request(&mut request, &packet);
        client.send(&request);
        std::io::Read::read_exact(&mut client.stream, &mut answer).expect("one-byte answer");
        assert_eq!(answer[0] as char, expected as char, "{packet:?}");
    }
}

fn db_message(error: &tokio_postgres::Error) -> String {
    error.as_db_error().map(|db| db.message().to_owned()).unwrap_or_default()
}
