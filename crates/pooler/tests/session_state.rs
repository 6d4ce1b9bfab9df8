//! The session-state guard in transaction mode, against a real PostgreSQL 15: state a client
//! leaves on a shared server never reaches the next client.

mod common;

use bypass_pooler::config::{PoolMode, SessionStatePolicy};
use common::*;

fn pooler_with(postgres: &bypass_testkit::Postgres, policy: SessionStatePolicy) -> Pooler {
    let mut config = config(postgres, PoolMode::Transaction, 1);
    config.pooler.session_state = policy;
    Pooler::start(config)
}

/// Runs a simple query on a raw client; returns (notice texts, error SQLSTATE if any).
fn run(client: &mut RawClient, sql: &str) -> (Vec<String>, Option<String>) {
    let mut message = Vec::new();
    bypass_wire::frontend::build::query(&mut message, sql);
    client.send(&message);
    let answers = client.read_until(b'Z');
    assert_eq!(answers.last().map(|(tag, _)| *tag), Some(b'Z'), "no ReadyForQuery for {sql}");
    let notices = answers
        .iter()
        .filter(|(tag, _)| *tag == b'N')
        .map(|(_, body)| String::from_utf8_lossy(body).into_owned())
        .collect();
    let error = answers.iter().find(|(tag, _)| *tag == b'E').map(|(_, body)| error_code(body));
    (notices, error)
}

/// The first column of the first row of a simple query, as text.
fn scalar(client: &mut RawClient, sql: &str) -> String {
    let mut message = Vec::new();
    bypass_wire::frontend::build::query(&mut message, sql);
    client.send(&message);
    let answers = client.read_until(b'Z');
    let (_, row) =
        answers.iter().find(|(tag, _)| *tag == b'D').unwrap_or_else(|| panic!("no row for {sql}: {answers:?}"));
    let length = i32::from_be_bytes([row[2], row[3], row[4], row[5]]) as usize;
    String::from_utf8_lossy(&row[6..6 + length]).into_owned()
}

#[test]
fn untracked_state_warns_and_never_reaches_the_next_client() {
    // Goal: under `track`, SET of an untracked parameter, LISTEN and SQL PREPARE run with a
    // WARNING and the server is reset before another client gets it. Method: two clients on a
    // pool of one server; A sets work_mem, listens and prepares; B then sees the defaults, no
    // channel and no statement; a tracked SET (application_name) stays with A.
    let postgres = postgres();
    let pooler = pooler_with(&postgres, SessionStatePolicy::Track);
    let mut a = RawClient::login(pooler.port);
    let mut b = RawClient::login(pooler.port);
    let default_work_mem = scalar(&mut b, "show work_mem");
    for sql in ["set work_mem = '77MB'", "listen bypass_channel", "prepare leaked as select 1"] {
        let (notices, error) = run(&mut a, sql);
        assert_eq!(error, None, "{sql}");
        assert!(
            notices.iter().any(|n| n.contains("WARNING") && n.contains("transaction pooling")),
            "{sql}: {notices:?}"
        );
    }
    assert_eq!(run(&mut a, "set application_name = 'client-a'"), (vec![], None));
    assert_eq!(scalar(&mut b, "show work_mem"), default_work_mem, "work_mem leaked to another client");
    assert_eq!(scalar(&mut b, "select count(*) from pg_listening_channels()"), "0", "LISTEN leaked");
    assert_eq!(run(&mut b, "execute leaked").1.as_deref(), Some("26000"), "a prepared statement leaked");
    assert_ne!(scalar(&mut b, "show application_name"), "client-a");
    assert_eq!(scalar(&mut a, "show application_name"), "client-a", "a tracked parameter was lost");
}

#[test]
fn error_policy_refuses_untracked_state_but_allows_local_and_tracked_sets() {
    // Goal: under `error`, untracked session state is refused with 0A000 and the client goes on;
    // SET LOCAL inside a transaction and tracked SETs are allowed. Method: raw client, each
    // statement's SQLSTATE checked; the server's work_mem is unchanged afterwards.
    let postgres = postgres();
    let pooler = pooler_with(&postgres, SessionStatePolicy::Error);
    let mut client = RawClient::login(pooler.port);
    let default_work_mem = scalar(&mut client, "show work_mem");
    for sql in ["set work_mem = '77MB'", "LISTEN x", "begin; set role postgres; commit", "create temp table t (x int)"]
    {
        assert_eq!(run(&mut client, sql).1.as_deref(), Some("0A000"), "{sql} was not refused");
    }
    assert_eq!(scalar(&mut client, "show work_mem"), default_work_mem);
    assert_eq!(run(&mut client, "begin; set local work_mem = '5MB'; commit"), (vec![], None));
    assert_eq!(run(&mut client, "set timezone = 'UTC'"), (vec![], None));
    assert_eq!(scalar(&mut client, "select 7"), "7");
}

#[test]
fn warn_policy_warns_even_for_tracked_parameters() {
    // Goal: `warn` reports every session-level SET, tracked or not, and still replays tracked ones.
    // Method: a tracked SET gets a WARNING and its value survives into the next transaction.
    let postgres = postgres();
    let pooler = pooler_with(&postgres, SessionStatePolicy::Warn);
    let mut client = RawClient::login(pooler.port);
    let (notices, error) = run(&mut client, "set application_name = 'warned'");
    assert_eq!(error, None);
    assert!(notices.iter().any(|n| n.contains("WARNING")), "{notices:?}");
    assert_eq!(scalar(&mut client, "show application_name"), "warned");
}
