//! auth_query: users missing from the auth file are looked up in PostgreSQL as `auth_user`, and
//! authenticated with the returned SCRAM verifier or MD5 hash, end to end without any plaintext
//! in the pooler's configuration.

mod common;

use std::collections::HashSet;

use bypass_pooler::config::{AuthType, PoolMode};
use bypass_testkit::TestUser;
use common::*;

#[tokio::test(flavor = "multi_thread")]
async fn scram_and_md5_users_log_in_through_auth_query() {
    // Goal: SCRAM end to end and MD5 for users only PostgreSQL knows. Method: a SCRAM role and an
    // MD5 role, absent from the auth file (which holds only the auth user); several clients of
    // the SCRAM role run transactions that land on several servers (the pool logs in with the
    // keys recovered from the client's proof); wrong passwords and unknown users get 28P01.
    let postgres = postgres_with_users(vec![
        TestUser::scram("carol", "carol-pw"),
        TestUser::md5("dave", "dave-pw"),
        TestUser::md5("authenticator", "auth-pw"),
    ]);
    let dir = tempfile::tempdir().expect("temp dir");
    let auth_file = dir.path().join("userlist.txt");
    std::fs::write(&auth_file, "\"authenticator\" \"auth-pw\"\n").expect("auth file");
    let mut config = config(&postgres, PoolMode::Transaction, 3);
    config.pooler.auth_type = AuthType::Md5;
    config.pooler.auth_file = Some(auth_file);
    config.pooler.auth_user = Some("authenticator".into());
    let pooler = Pooler::start(config);

    let mut tasks = Vec::new();
    for _ in 0..6 {
        let port = pooler.port;
        tasks.push(tokio::spawn(async move {
            let client = connect(port, "carol", Some("carol-pw")).await.expect("carol logs in with SCRAM");
            let mut pids = HashSet::new();
            for _ in 0..20 {
                let row = client.query_one("select current_user::text, pg_backend_pid()", &[]).await.expect("query");
                assert_eq!(row.get::<_, &str>(0), "carol");
                pids.insert(row.get::<_, i32>(1));
            }
            pids
        }));
    }
    let mut servers = HashSet::new();
    for task in tasks {
        servers.extend(task.await.expect("client task"));
    }
    assert!(servers.len() > 1, "transactions must spread over several servers: {servers:?}");

    let dave = connect(pooler.port, "dave", Some("dave-pw")).await.expect("dave logs in with MD5");
    let row = dave.query_one("select current_user::text", &[]).await.expect("dave's query");
    assert_eq!(row.get::<_, &str>(0), "dave");

    for (user, password) in [("carol", "wrong"), ("dave", "wrong"), ("nobody", "x"), ("o'neil", "x")] {
        let error = connect(pooler.port, user, Some(password)).await.expect_err("must be refused");
        assert_eq!(sqlstate(&error).as_deref(), Some("28P01"), "{user}: {error:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn failed_lookups_are_not_cached() {
    // Goal: a user created right after a failed login can log in at once (failures are never
    // cached). Method: log in as a missing role (28P01), create it, log in again.
    let postgres = postgres_with_users(vec![TestUser::md5("authenticator", "auth-pw")]);
    let dir = tempfile::tempdir().expect("temp dir");
    let auth_file = dir.path().join("userlist.txt");
    std::fs::write(&auth_file, "\"authenticator\" \"auth-pw\"\n").expect("auth file");
    let mut config = config(&postgres, PoolMode::Transaction, 2);
    config.pooler.auth_type = AuthType::ScramSha256;
    config.pooler.auth_file = Some(auth_file);
    config.pooler.auth_user = Some("authenticator".into());
    let pooler = Pooler::start(config);
    let error = connect(pooler.port, "erin", Some("erin-pw")).await.expect_err("erin does not exist yet");
    assert_eq!(sqlstate(&error).as_deref(), Some("28P01"));
    postgres
        .psql("SET password_encryption = 'scram-sha-256'; CREATE ROLE erin LOGIN PASSWORD 'erin-pw'")
        .expect("create erin");
    let erin = connect(pooler.port, "erin", Some("erin-pw")).await.expect("erin logs in right after creation");
    let row = erin.query_one("select current_user::text", &[]).await.expect("query");
    assert_eq!(row.get::<_, &str>(0), "erin");
}
