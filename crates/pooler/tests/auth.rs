//! Authentication through the pooler: clients prove themselves to the pooler (trust, md5,
//! scram-sha-256 from an auth file) and the pooler to PostgreSQL (trust, md5, scram-sha-256).
//! A wrong password must end in FATAL 28P01 and nothing else.

mod common;

use bypass_pooler::config::{AuthType, DatabaseEntry, PoolMode};
use bypass_pooler::Config;
use bypass_testkit::{Postgres, TestUser};
use common::*;

/// Writes an auth file and returns a config that uses it with `auth_type`.
fn auth_config(postgres: &Postgres, auth_type: AuthType, users: &str) -> (Config, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("userlist.txt");
    std::fs::write(&path, users).expect("auth file");
    let mut config = config(postgres, PoolMode::Transaction, 2);
    config.pooler.auth_type = auth_type;
    config.pooler.auth_file = Some(path);
    (config, dir)
}

fn scram_verifier(password: &str) -> String {
    bypass_wire::scram::Verifier::from_password(password.as_bytes(), 4096).to_text()
}

async fn assert_login(port: u16, user: &str, password: &str, expected: Result<(), &str>, what: &str) {
    match (connect(port, user, Some(password)).await, expected) {
        (Ok(client), Ok(())) => {
            let row = client.query_one("select current_user::text", &[]).await.expect("query after login");
            assert_eq!(row.get::<_, &str>(0), user, "{what}");
        }
        (Err(error), Err(code)) => assert_eq!(sqlstate(&error).as_deref(), Some(code), "{what}: {error}"),
        (Ok(_), Err(code)) => panic!("{what}: login succeeded, expected {code}"),
        (Err(error), Ok(())) => panic!("{what}: login failed: {error}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn client_md5_and_scram_accept_right_and_refuse_wrong_passwords() {
    // Goal: each client method admits the right password and refuses a wrong one with 28P01.
    // Method: users with plaintext, md5-hash and SCRAM-verifier secrets, auth_type md5 and scram.
    let postgres =
        postgres_with_users(vec![TestUser::trust("alice"), TestUser::trust("bob"), TestUser::trust("carol")]);
    let users = format!(
        "\"alice\" \"alice-pw\"\n\"bob\" \"{}\"\n\"carol\" \"{}\"\n",
        bypass_wire::md5::stored_hash(b"bob", b"bob-pw"),
        scram_verifier("carol-pw")
    );
    for auth_type in [AuthType::Md5, AuthType::ScramSha256] {
        let (config, _dir) = auth_config(&postgres, auth_type, &users);
        let pooler = Pooler::start(config);
        let what = |user: &str| format!("{auth_type:?} {user}");
        assert_login(pooler.port, "alice", "alice-pw", Ok(()), &what("alice")).await;
        assert_login(pooler.port, "alice", "wrong", Err("28P01"), &what("alice wrong")).await;
        assert_login(pooler.port, "carol", "carol-pw", Ok(()), &what("carol")).await;
        assert_login(pooler.port, "carol", "wrong", Err("28P01"), &what("carol wrong")).await;
        assert_login(pooler.port, "nobody", "x", Err("28P01"), &what("unknown user")).await;
        let bob = if auth_type == AuthType::Md5 { Ok(()) } else { Err("28P01") }; // an md5 hash cannot do SCRAM
        assert_login(pooler.port, "bob", "bob-pw", bob, &what("bob")).await;
        assert_login(pooler.port, "bob", "wrong", Err("28P01"), &what("bob wrong")).await;
    }
}

#[test]
fn wrong_password_gets_only_a_fatal_28p01() {
    // Goal: a failed login tells the client exactly one thing. Method: psql with a wrong password
    // under md5 and scram; its stderr must carry the PostgreSQL wording and nothing about servers.
    let postgres = postgres();
    for auth_type in [AuthType::Md5, AuthType::ScramSha256] {
        let (config, _dir) = auth_config(&postgres, auth_type, "\"postgres\" \"right\"\n");
        let pooler = Pooler::start(config);
        let output = psql(pooler.port, "postgres", Some("wrong"), "select 1");
        assert!(!output.status.success());
        let text = stderr(&output);
        assert!(text.contains("FATAL:  password authentication failed for user \"postgres\""), "{auth_type:?}: {text}");
        assert_eq!(text.matches("FATAL").count(), 1, "{text}");
        let ok = psql(pooler.port, "postgres", Some("right"), "select 1");
        assert_eq!(stdout(&ok), "1", "{}", stderr(&ok));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn backend_md5_scram_and_trust_logins() {
    // Goal: the pooler logs in to servers that demand md5, SCRAM or nothing. Method: PostgreSQL
    // roles with each method in pg_hba.conf; passwords in the database entries, in the auth file,
    // and (SCRAM only) none at all, relying on the keys from the client's own SCRAM login.
    let postgres = postgres_with_users(vec![
        TestUser::md5("md5user", "md5-secret"),
        TestUser::scram("scramuser", "scram-secret"),
        TestUser::trust("trustuser"),
    ]);
    // Passwords from [databases] entries, clients trusted.
    let mut config = config(&postgres, PoolMode::Transaction, 2);
    for (name, user, password) in [("db_md5", "md5user", "md5-secret"), ("db_scram", "scramuser", "scram-secret")] {
        let entry = DatabaseEntry {
            port: postgres.port(),
            dbname: Some("postgres".into()),
            user: Some(user.into()),
            password: Some(password.into()),
            ..DatabaseEntry::default()
        };
        config.databases.insert(name.into(), entry);
    }
    let pooler = Pooler::start(config);
    // The client's name is "anyone"; the entries log in to the server as their own user.
    for (database, client_user, backend_user) in
        [("db_md5", "anyone", "md5user"), ("db_scram", "anyone", "scramuser"), ("postgres", "trustuser", "trustuser")]
    {
        let client = connect_db(pooler.port, client_user, database).await;
        let row = client.query_one("select current_user::text", &[]).await.expect("query");
        assert_eq!(row.get::<_, &str>(0), backend_user, "{database}");
    }
    // Wrong backend password: the server's own refusal reaches the client.
    let mut config = config_for(&postgres);
    config.databases.insert(
        "bad".into(),
        DatabaseEntry {
            port: postgres.port(),
            user: Some("md5user".into()),
            password: Some("nope".into()),
            ..DatabaseEntry::default()
        },
    );
    let pooler = Pooler::start(config);
    let error = connect_db_result(pooler.port, "anyone", "bad").await.expect_err("backend refuses");
    assert_eq!(sqlstate(&error).as_deref(), Some("28P01"), "{error}");
}

#[tokio::test(flavor = "multi_thread")]
async fn scram_end_to_end_without_a_plaintext_password() {
    // Goal: with only a SCRAM verifier stored (the one PostgreSQL holds), a SCRAM client can reach
    // a SCRAM server: the pooler reuses the keys the client's proof reveals. Method: copy the
    // role's verifier from pg_authid into the auth file; connect with the password.
    let postgres = postgres_with_users(vec![TestUser::scram("dave", "dave-pw")]);
    let verifier = postgres.psql("select rolpassword from pg_authid where rolname = 'dave'").expect("verifier");
    assert!(verifier.starts_with("SCRAM-SHA-256$"), "{verifier}");
    let (config, _dir) = auth_config(&postgres, AuthType::ScramSha256, &format!("\"dave\" \"{verifier}\"\n"));
    let pooler = Pooler::start(config);
    assert_login(pooler.port, "dave", "dave-pw", Ok(()), "scram pass-through").await;
    assert_login(pooler.port, "dave", "wrong", Err("28P01"), "scram pass-through, wrong password").await;
}

fn config_for(postgres: &Postgres) -> Config {
    config(postgres, PoolMode::Transaction, 2)
}

async fn connect_db_result(
    port: u16,
    user: &str,
    database: &str,
) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let mut config = tokio_postgres::Config::new();
    config.host("127.0.0.1").port(port).user(user).dbname(database);
    let (client, connection) = config.connect(tokio_postgres::NoTls).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

async fn connect_db(port: u16, user: &str, database: &str) -> tokio_postgres::Client {
    connect_db_result(port, user, database).await.expect("connects")
}
