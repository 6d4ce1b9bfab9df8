//! The hba file (`auth_hba_file`): each method, `reject`, no matching line, and `hostssl` /
//! `hostnossl` against plaintext and TLS clients, with real clients through the pooler.

mod common;

use std::time::Duration;

use bypass_pooler::config::{AuthType, PoolMode};
use bypass_pooler::tls::ClientSslMode;
use bypass_pooler::{Config, ConfigError};
use bypass_testkit::{Postgres, TestUser};
use common::certs::{Issued, TestCa};
use common::*;
use tokio_postgres::config::SslMode;
use tokio_postgres_rustls::MakeRustlsConnect;

/// Authentication request codes of AuthenticationXxx messages.
const AUTH_CLEARTEXT: i32 = 3;
const AUTH_MD5: i32 = 5;
const AUTH_SASL: i32 = 10;

fn hba_config(postgres: &Postgres, hba: &str, users: &str) -> (Config, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("hba.conf"), hba).expect("hba file");
    std::fs::write(dir.path().join("userlist.txt"), users).expect("auth file");
    let mut config = config(postgres, PoolMode::Transaction, 2);
    config.pooler.auth_type = AuthType::Md5;
    config.pooler.auth_file = Some(dir.path().join("userlist.txt"));
    config.pooler.auth_hba_file = Some(dir.path().join("hba.conf"));
    (config, dir)
}

/// The authentication request the pooler answers a startup packet for `user` with.
fn first_auth_request(port: u16, user: &str) -> (u8, Vec<u8>) {
    let mut client = RawClient::connect(port);
    let mut startup = Vec::new();
    bypass_wire::startup::encode_startup(&mut startup, &[("user", user), ("database", "postgres")]);
    client.send(&startup);
    client.read_message().expect("an answer")
}

fn auth_code(message: &(u8, Vec<u8>)) -> i32 {
    assert_eq!(message.0, b'R', "expected an authentication request, got {:?}", message.0 as char);
    i32::from_be_bytes(message.1[..4].try_into().expect("4 bytes"))
}

#[tokio::test(flavor = "multi_thread")]
async fn each_method_and_the_refusals_follow_the_first_matching_line() {
    // Goal: the hba file picks each client's method; reject and no match are 28000. Method: one
    // line per user; raw startups show the method asked (cleartext, MD5, SASL); tokio-postgres
    // logs in with right and wrong passwords.
    let names = ["trusted", "rejected", "md5user", "scramuser", "passuser", "elsewhere"];
    let postgres = postgres_with_users(names.iter().map(|name| TestUser::trust(name)).collect());
    let hba = "local all all trust\n\
               host all trusted 127.0.0.1/32 trust\n\
               host all rejected all reject\n\
               host all md5user 127.0.0.0 255.0.0.0 md5\n\
               host all scramuser,other ::1/128 trust\n\
               host all scramuser 127.0.0.1/32 scram-sha-256\n\
               host postgres passuser all password\n\
               host all elsewhere 10.0.0.0/8 trust\n";
    let users = "\"md5user\" \"md5-pw\"\n\"scramuser\" \"scram-pw\"\n\"passuser\" \"pass-pw\"\n";
    let (config, _dir) = hba_config(&postgres, hba, users);
    let pooler = Pooler::start(config);
    let port = pooler.port;

    assert_eq!(auth_code(&first_auth_request(port, "md5user")), AUTH_MD5);
    assert_eq!(auth_code(&first_auth_request(port, "scramuser")), AUTH_SASL);
    assert_eq!(auth_code(&first_auth_request(port, "passuser")), AUTH_CLEARTEXT);
    let cases = [
        ("trusted", None, Ok(())),
        ("md5user", Some("md5-pw"), Ok(())),
        ("md5user", Some("wrong"), Err("28P01")),
        ("scramuser", Some("scram-pw"), Ok(())),
        ("scramuser", Some("wrong"), Err("28P01")),
        ("passuser", Some("pass-pw"), Ok(())),
        ("passuser", Some("wrong"), Err("28P01")),
        ("rejected", Some("x"), Err("28000")),
        ("elsewhere", None, Err("28000")),
        ("unlisted", None, Err("28000")),
    ];
    for (user, password, expected) in cases {
        match (connect(port, user, password).await, expected) {
            (Ok(client), Ok(())) => {
                let row = client.query_one("select current_user::text", &[]).await.expect("query");
                assert_eq!(row.get::<_, &str>(0), user);
            }
            (Err(error), Err(code)) => assert_eq!(sqlstate(&error).as_deref(), Some(code), "{user}: {error:?}"),
            (result, expected) => panic!("{user}: got {:?}, expected {expected:?}", result.err()),
        }
    }
    let error = connect(port, "elsewhere", None).await.expect_err("no line matches");
    let message = error.as_db_error().map(|db| db.message().to_owned()).unwrap_or_default();
    assert!(message.contains("no hba entry"), "{message}");
}

async fn connect_tls(port: u16, user: &str, ca: &TestCa, cert: Option<&Issued>) -> Result<(), tokio_postgres::Error> {
    let mut config = tokio_postgres::Config::new();
    config.host("127.0.0.1").port(port).user(user).dbname("postgres").ssl_mode(SslMode::Require);
    config.connect_timeout(Duration::from_secs(20));
    let (client, connection) = config.connect(MakeRustlsConnect::new(ca.client_config(cert))).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let row = client.query_one("select current_user::text", &[]).await?;
    assert_eq!(row.get::<_, &str>(0), user);
    Ok(())
}

async fn connect_plain(port: u16, user: &str) -> Result<(), tokio_postgres::Error> {
    connect(port, user, None).await.map(drop)
}

fn code(result: Result<(), tokio_postgres::Error>) -> Option<String> {
    result.err().and_then(|error| sqlstate(&error))
}

#[tokio::test(flavor = "multi_thread")]
async fn hostssl_hostnossl_and_cert_follow_the_client_connection() {
    // Goal: hostssl lines match only TLS clients, hostnossl only plaintext ones, and `cert`
    // wants a CA-signed certificate naming the user. Method: the same users over both kinds of
    // connection, with and without client certificates.
    let postgres = postgres_with_users(["tlsuser", "plainuser", "certuser"].map(TestUser::trust).to_vec());
    let hba = "hostssl all tlsuser all trust\nhostnossl all plainuser all trust\nhostssl all certuser all cert\n";
    let (mut config, _dir) = hba_config(&postgres, hba, "");
    let ca = TestCa::new();
    let pooler_cert = ca.pooler_certificate();
    config.pooler.client_tls_sslmode = ClientSslMode::Prefer;
    config.pooler.client_tls_cert_file = Some(pooler_cert.cert_file.clone());
    config.pooler.client_tls_key_file = Some(pooler_cert.key_file.clone());
    config.pooler.client_tls_ca_file = Some(ca.ca_file());
    let pooler = Pooler::start(config);
    let port = pooler.port;
    let none = None::<String>;
    let refused = Some("28000".to_owned());

    assert_eq!(code(connect_tls(port, "tlsuser", &ca, None).await), none, "tlsuser over TLS");
    assert_eq!(code(connect_plain(port, "tlsuser").await), refused, "tlsuser in plaintext");
    assert_eq!(code(connect_plain(port, "plainuser").await), none, "plainuser in plaintext");
    assert_eq!(code(connect_tls(port, "plainuser", &ca, None).await), refused, "plainuser over TLS");

    let good = ca.issue("certuser", "certuser", &[]);
    let misnamed = ca.issue("misnamed", "someone-else", &[]);
    assert_eq!(code(connect_tls(port, "certuser", &ca, Some(&good)).await), none, "matching certificate");
    assert_eq!(code(connect_tls(port, "certuser", &ca, Some(&misnamed)).await), refused, "wrong common name");
    assert_eq!(code(connect_tls(port, "certuser", &ca, None).await), refused, "no certificate");
}

#[test]
fn hba_parse_errors_are_all_reported_at_load_with_file_and_line() {
    // Goal: a bad hba file fails config validation with every problem and its line. Method:
    // two bad lines around a good one.
    let postgres = postgres();
    let (config, _dir) = hba_config(&postgres, "host all all 1.2.3.4/40 md5\nhost all all all md5\nhost x\n", "");
    let Err(ConfigError::Invalid(problems)) = config.validate() else { panic!("must be invalid") };
    let joined = problems.join("\n");
    assert!(joined.contains("hba.conf:1:") && joined.contains("hba.conf:3:"), "{joined}");
    assert!(!joined.contains("hba.conf:2:"), "{joined}");
}
