//! No state for strangers (issue 21): pools, metrics labels and per-name entries exist only for
//! clients that authenticated (and whose server accepted them); an unknown user sees the same
//! exchange as a known user with a wrong password; auto-created databases are dropped after
//! `autodb_idle_timeout_ms`; failed logins can be delayed and bounded per address; hostile bytes
//! leave the pooler serving. Real PostgreSQL 15 behind the pooler throughout.

mod common;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bypass_pooler::config::{AuthType, PoolMode};
use bypass_pooler::Config;
use bypass_testkit::{Postgres, TestUser};
use common::*;

/// A configuration with only the catch-all `*` database and an auth file holding `postgres`.
fn stranger_config(postgres: &Postgres, auth_type: AuthType) -> (Config, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("userlist.txt");
    std::fs::write(&path, "\"postgres\" \"right-password\"\n").expect("auth file");
    let mut config = config(postgres, PoolMode::Transaction, 2);
    config.pooler.auth_type = auth_type;
    config.pooler.auth_file = Some(path);
    // 150 concurrent SCRAM exchanges of a debug build on a loaded 2-core machine took over the
    // default 60 s login bound (08006); the tests here are about what strangers leave behind.
    config.pooler.client_login_timeout_ms = 300_000;
    (config, dir)
}

/// Every `database=…,user=…` label pair in the metrics exposition.
fn metric_labels(pooler: &Pooler) -> BTreeSet<String> {
    let text = bypass_pooler::metrics::render(&pooler.shared);
    text.lines()
        .filter_map(|line| line.split_once("{database=\"").map(|(_, rest)| rest))
        .filter_map(|rest| rest.split_once('}').map(|(labels, _)| labels.to_owned()))
        .map(|labels| labels.split(",le=").next().unwrap_or_default().to_owned())
        .collect()
}

fn pool_keys(pooler: &Pooler) -> BTreeSet<(String, String)> {
    pooler.shared.pools().iter().map(|pool| (pool.key.database.clone(), pool.key.user.clone())).collect()
}

/// A deterministic stream of made-up names.
fn made_up(index: u64, kind: &str) -> String {
    let mixed = index.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(17);
    format!("{kind}_{mixed:016x}")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_login_flood_under_random_names_leaves_pools_and_metrics_unchanged() {
    // Goal: strangers create no pool and no metrics label, whether the pooler refuses them
    // (scram, wrong password) or the server does (trust, unknown role or database). Method: one
    // real login, then 150 logins under made-up user and database names per auth type; compare
    // the pool table and the label set before and after.
    let postgres = postgres();
    for auth_type in [AuthType::ScramSha256, AuthType::Trust] {
        let (config, _dir) = stranger_config(&postgres, auth_type);
        let pooler = Pooler::start(config);
        let password = (auth_type != AuthType::Trust).then_some("right-password");
        let client = connect(pooler.port, "postgres", password).await.expect("the real user logs in");
        client.simple_query("select 1").await.expect("query");
        drop(client);
        let (pools_before, labels_before) = (pool_keys(&pooler), metric_labels(&pooler));
        assert_eq!(pools_before.len(), 1, "{auth_type:?}: {pools_before:?}");
        let mut tasks = Vec::new();
        for index in 0..150u64 {
            let port = pooler.port;
            tasks.push(tokio::spawn(async move {
                let (user, database) = (made_up(index, "user"), made_up(index, "db"));
                connect_db(port, &user, Some("guess"), &database).await.map(drop).err().and_then(|e| sqlstate(&e))
            }));
        }
        for task in tasks {
            let code = task.await.expect("joined");
            let expected = if auth_type == AuthType::Trust { "28000" } else { "28P01" };
            assert!(code.as_deref() == Some(expected) || code.as_deref() == Some("3D000"), "{auth_type:?}: {code:?}");
        }
        assert_eq!(pool_keys(&pooler), pools_before, "{auth_type:?}: strangers left pools behind");
        assert_eq!(metric_labels(&pooler), labels_before, "{auth_type:?}: strangers reached /metrics");
    }
}

/// The shape of a login as a raw client sees it (tags, authentication codes, SQLSTATE and
/// message with the user name masked), answering every challenge with a wrong password.
fn login_shape(port: u16, user: &str) -> Vec<String> {
    use bypass_wire::scram::{ClientExchange, ClientSecret, MECHANISM};
    let mut raw = RawClient::connect(port);
    let mut startup = Vec::new();
    bypass_wire::startup::encode_startup(&mut startup, &[("user", user), ("database", "postgres")]);
    raw.send(&startup);
    let mut shape = Vec::new();
    let mut scram = None;
    while let Some((tag, body)) = raw.read_message() {
        if tag == b'E' {
            let message = String::from_utf8_lossy(&body).replace(user, "<user>");
            shape.push(format!("E {} {}", error_code(&body), message.split('M').nth(1).unwrap_or_default()));
            continue;
        }
        let code = i32::from_be_bytes([body[0], body[1], body[2], body[3]]);
        shape.push(format!("{}{code}", tag as char));
        let mut reply = Vec::new();
        match code {
            5 => bypass_wire::auth_messages::encode_password(&mut reply, b"md5ffffffffffffffffffffffffffffffff"),
            10 => {
                let (exchange, first) = ClientExchange::start(ClientSecret::Password(b"wrong".to_vec()));
                scram = Some(exchange);
                bypass_wire::auth_messages::encode_sasl_initial(&mut reply, MECHANISM, first.as_bytes());
            }
            11 => {
                let exchange = scram.as_mut().expect("SASL started");
                let answer = exchange.respond(&body[4..]).expect("valid server-first");
                bypass_wire::auth_messages::encode_sasl_response(&mut reply, answer.as_bytes());
            }
            _ => {}
        }
        raw.send(&reply);
    }
    shape
}

#[test]
fn an_unknown_user_sees_the_exchange_of_a_known_user_with_a_wrong_password() {
    // Goal: user names cannot be told apart through the pooler's login (md5 and scram). Method:
    // raw logins with a wrong password as the known user and as two unknown ones; equal shapes.
    let postgres = postgres();
    for auth_type in [AuthType::Md5, AuthType::ScramSha256] {
        let (config, _dir) = stranger_config(&postgres, auth_type);
        let pooler = Pooler::start(config);
        let shapes = ["postgres", "nobody", "someone_else"].map(|user| login_shape(pooler.port, user));
        assert!(shapes[0].last().is_some_and(|last| last.starts_with("E 28P01")), "{auth_type:?}: {:?}", shapes[0]);
        assert_eq!(shapes[0], shapes[1], "{auth_type:?}");
        assert_eq!(shapes[1], shapes[2], "{auth_type:?}");
        assert!(pooler.shared.pools().is_empty(), "{auth_type:?}: a failed login made a pool");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn auto_created_databases_are_dropped_after_their_idle_timeout_and_listed_ones_stay() {
    // Goal: PgBouncer's autodb_idle_timeout: pools of a database served by `*` go once unused
    // for the timeout; a listed database's pool stays. Method: a 1 s timeout, one login to each.
    let postgres = postgres();
    let (mut config, _dir) = stranger_config(&postgres, AuthType::Trust);
    config.pooler.autodb_idle_timeout_ms = 1_000;
    let listed = bypass_pooler::config::DatabaseEntry {
        port: postgres.port(),
        dbname: Some("postgres".into()),
        ..Default::default()
    };
    config.databases.insert("listed".into(), listed);
    let pooler = Pooler::start(config);
    for database in ["postgres", "listed"] {
        let client = connect_db(pooler.port, "postgres", None, database).await.expect("login");
        client.simple_query("select 1").await.expect("query");
    }
    let started = Instant::now();
    while pool_keys(&pooler).len() > 1 {
        assert!(started.elapsed() < Duration::from_secs(15), "the auto-created pool stayed: {:?}", pool_keys(&pooler));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(started.elapsed() >= Duration::from_millis(900), "dropped before its timeout");
    let left: Vec<String> = pool_keys(&pooler).into_iter().map(|(database, _)| database).collect();
    assert_eq!(left, ["listed"]);
    let client = connect(pooler.port, "postgres", None).await.expect("the database works again");
    client.simple_query("select 1").await.expect("query");
}

#[tokio::test(flavor = "multi_thread")]
async fn failed_logins_are_delayed_and_bounded_per_address() {
    // Goal: auth_failure_delay_ms holds each failure back; past failed_logins_per_address_max
    // the address is refused (28000) even with the right password. Method: wrong passwords from
    // 127.0.0.1, then the right one.
    let postgres = postgres();
    let (mut config, _dir) = stranger_config(&postgres, AuthType::ScramSha256);
    config.pooler.auth_failure_delay_ms = 300;
    config.pooler.failed_logins_per_address_max = 2;
    let pooler = Pooler::start(config);
    let started = Instant::now();
    let wrong = connect(pooler.port, "postgres", Some("wrong")).await.map(drop).expect_err("wrong password");
    assert_eq!(sqlstate(&wrong).as_deref(), Some("28P01"));
    assert!(started.elapsed() >= Duration::from_millis(300), "the failure was not delayed");
    let unknown = connect(pooler.port, "nobody", Some("wrong")).await.map(drop).expect_err("unknown user");
    assert_eq!(sqlstate(&unknown).as_deref(), Some("28P01"));
    let blocked = connect(pooler.port, "postgres", Some("right-password")).await.map(drop).expect_err("bounded");
    assert_eq!(sqlstate(&blocked).as_deref(), Some("28000"), "{blocked}");
}

#[tokio::test(flavor = "multi_thread")]
async fn malformed_oversized_and_random_bytes_leave_the_pooler_serving() {
    // Goal: hostile bytes before and during login end only their own connection. Method: raw
    // garbage, then a real login and query.
    let postgres = postgres();
    let (config, _dir) = stranger_config(&postgres, AuthType::ScramSha256);
    let pooler = Pooler::start(config);
    let address = SocketAddr::from(([127, 0, 0, 1], pooler.port));
    let mut inputs: Vec<Vec<u8>> = vec![
        vec![0, 0, 0, 3, 0, 0, 0, 0],
        vec![0x7f, 0xff, 0xff, 0xff, 0, 3, 0, 0],
        vec![0, 0, 0, 9, 0, 2, 0, 0, 0],
        (0..65_536u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8).collect(),
    ];
    let mut startup_then_garbage = Vec::new();
    bypass_wire::startup::encode_startup(&mut startup_then_garbage, &[("user", "postgres")]);
    startup_then_garbage.extend_from_slice(&[b'p', 0x7f, 0xff, 0xff, 0xff]);
    inputs.push(startup_then_garbage);
    tokio::task::spawn_blocking(move || {
        for input in inputs {
            use std::io::{Read, Write};
            let mut stream = std::net::TcpStream::connect(address).expect("connect");
            stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
            let _ = stream.write_all(&input);
            let mut answer = Vec::new();
            let _ = stream.read_to_end(&mut answer);
        }
    })
    .await
    .expect("joined");
    let client = connect(pooler.port, "postgres", Some("right-password")).await.expect("still serving");
    client.simple_query("select 1").await.expect("query");
    assert_eq!(pool_keys(&pooler).len(), 1);
}

#[test]
fn a_startup_packet_after_login_is_refused_at_once() {
    // Goal: a StartupPacket or SSLRequest sent again after login (type byte 0) gets FATAL 08P01
    // at once and the connection closes, as PostgreSQL answers "invalid frontend message type
    // 0" (the pooler, and in transaction mode the kernel fast path, took it for the header of a
    // message ~2-10 KB long and waited for the rest). Method: raw logins in both pool modes
    // (and in the kernel pass, transaction mode framed in the kernel): idle, after a query
    // (linked in session mode), right behind a query in one write (the header starts mid-skb),
    // and the type byte alone; the answer must arrive without another byte sent (RawClient's
    // 10 s read bound) and the pooler must close the connection (EOF, not that bound).
    let postgres = postgres();
    let mut startup = Vec::new();
    bypass_wire::startup::encode_startup(&mut startup, &[("user", "postgres"), ("database", "postgres")]);
    let ssl_request = vec![0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];
    let mut query = Vec::new();
    bypass_wire::frontend::build::query(&mut query, "select 1");
    let ssl_behind_query = [query.clone(), ssl_request.clone()].concat();
    let type_byte_behind_query = [query.clone(), vec![0]].concat();
    // (what, a query answered first, bytes, answers allowed before the error)
    let cases: [(&str, bool, &[u8], &[u8]); 7] = [
        ("a StartupPacket", false, &startup, b""),
        ("an SSLRequest", false, &ssl_request, b""),
        ("a StartupPacket after a query", true, &startup, b""),
        ("an SSLRequest after a query", true, &ssl_request, b""),
        ("type byte 0 alone", false, &[0], b""),
        // The query may be answered first (PostgreSQL would), or dropped with the connection.
        ("an SSLRequest behind a query in one write", false, &ssl_behind_query, b"TDCZ"),
        ("type byte 0 behind a query in one write", false, &type_byte_behind_query, b"TDCZ"),
    ];
    for mode in [PoolMode::Session, PoolMode::Transaction] {
        let pooler = Pooler::start(config(&postgres, mode, 2));
        for (what, after_query, input, allowed_first) in cases {
            let mut raw = RawClient::login(pooler.port);
            if after_query {
                raw.send(&query);
                assert_eq!(raw.read_until(b'Z').last().map(|m| m.0), Some(b'Z'), "{mode:?}");
            }
            raw.send(input);
            let answers = raw.read_until(b'E');
            let Some(((b'E', body), first)) = answers.split_last() else {
                panic!("{mode:?}, {what}: no ErrorResponse but {answers:?}")
            };
            assert!(first.iter().all(|(tag, _)| allowed_first.contains(tag)), "{mode:?}, {what}: {answers:?}");
            assert_eq!(error_code(body), "08P01", "{mode:?}, {what}");
            assert!(raw.is_closed(), "{mode:?}, {what}: the connection closes");
        }
        let mut client = RawClient::login(pooler.port);
        client.send(&query);
        let tags: Vec<u8> = client.read_until(b'Z').iter().map(|m| m.0).collect();
        assert_eq!(tags, b"TDCZ", "{mode:?}: still serving");
    }
}

/// The salt the pooler's SCRAM server-first message gives `user` (known or not).
fn scram_salt(port: u16, user: &str) -> String {
    use bypass_wire::scram::{ClientExchange, ClientSecret, MECHANISM};
    let mut raw = RawClient::connect(port);
    let mut startup = Vec::new();
    bypass_wire::startup::encode_startup(&mut startup, &[("user", user), ("database", "postgres")]);
    raw.send(&startup);
    let (tag, _) = raw.read_message().expect("authentication request");
    assert_eq!(tag, b'R');
    let (_exchange, first) = ClientExchange::start(ClientSecret::Password(b"wrong".to_vec()));
    let mut reply = Vec::new();
    bypass_wire::auth_messages::encode_sasl_initial(&mut reply, MECHANISM, first.as_bytes());
    raw.send(&reply);
    let (tag, body) = raw.read_message().expect("server-first message");
    assert_eq!((tag, i32::from_be_bytes([body[0], body[1], body[2], body[3]])), (b'R', 11), "SASLContinue");
    let server_first = String::from_utf8_lossy(&body[4..]).into_owned();
    let salt = server_first.split(',').find_map(|field| field.strip_prefix("s=")).expect("a salt");
    salt.to_owned()
}

#[test]
fn mock_salts_are_stable_across_restarts_and_differ_between_names() {
    // Goal: an unknown user's SCRAM salt is the same after a restart, as a known user's is, so
    // two logins a restart apart cannot tell them apart (the mock key was random per process;
    // PostgreSQL keeps its mock nonce in pg_control); salts differ between names. Method: the
    // pooler started twice on one auth file (plaintext secret), salts of a known and two
    // unknown users each time; the key file beside the auth file is only readable by its owner.
    let postgres = postgres();
    let (config, dir) = stranger_config(&postgres, AuthType::ScramSha256);
    let users = ["postgres", "nobody", "someone_else"];
    let salts_of_one_start = || {
        let pooler = Pooler::start(config.clone());
        users.map(|user| scram_salt(pooler.port, user))
    };
    let first = salts_of_one_start();
    let second = salts_of_one_start();
    assert_eq!(first, second, "salts after a restart");
    assert_ne!(first[1], first[2], "unknown names get different salts");
    assert_ne!(first[0], first[1], "a known and an unknown name get different salts");
    let key_file = bypass_frontdoor::mock::mock_key_path(&dir.path().join("userlist.txt"));
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&key_file).expect("key file").permissions());
    assert_eq!(mode & 0o077, 0, "{}", key_file.display());
}

#[test]
fn a_pooler_without_an_auth_file_keeps_its_mock_key_beside_its_configuration() {
    // Goal: a pooler whose users come only through auth_query (no auth file) also gives an
    // unknown user the same salt after a restart (its mock key was random per process, so
    // unknown users' salts changed at a restart while known users' stayed: enumeration across
    // restarts). Method: a configuration file with no auth file and no mock_key_file, hba
    // scram-sha-256 for everyone, auth_user logging in with the database entry's password; the
    // pooler started twice from it, salts of a user auth_query finds (PostgreSQL's own salt)
    // and of two unknown users each time; the key is kept in `<config file>.mock-key`, 0600.
    let postgres =
        postgres_with_users(vec![TestUser::scram("carol", "carol-pw"), TestUser::md5("authenticator", "auth-pw")]);
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("hba.conf"), "host all all all scram-sha-256\n").expect("hba file");
    let path = dir.path().join("bypass.toml");
    let text = format!(
        "[pooler]\nlisten_addr = \"127.0.0.1:0\"\nworkers = 2\npool_mode = \"transaction\"\n\
         auth_type = \"trust\"\nauth_hba_file = \"hba.conf\"\nauth_user = \"authenticator\"\n\n\
         [databases.postgres]\nport = {}\nuser = \"authenticator\"\npassword = \"auth-pw\"\n",
        postgres.port()
    );
    std::fs::write(&path, text).expect("configuration file");
    let users = ["carol", "nobody", "someone_else"];
    let salts_of_one_start = || {
        let pooler = Pooler::start_from_file(&path);
        users.map(|user| scram_salt(pooler.port, user))
    };
    let first = salts_of_one_start();
    let second = salts_of_one_start();
    let verifier = postgres.psql("select rolpassword from pg_authid where rolname = 'carol'").expect("verifier");
    let carol_salt = verifier.trim().split(['$', ':']).nth(2).expect("SCRAM-SHA-256$<iterations>:<salt>$...");
    assert_eq!(first[0], carol_salt, "carol was found through auth_query");
    assert_eq!(first, second, "salts after a restart");
    assert_ne!(first[1], first[2], "unknown names get different salts");
    let key_file = dir.path().join("bypass.toml.mock-key");
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&key_file).expect("key file").permissions());
    assert_eq!(mode & 0o077, 0, "{}", key_file.display());
}
