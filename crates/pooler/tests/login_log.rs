//! Issue 18's login-failure log line from the pooler itself: one warn line per failed login
//! with user, database, client address and reason, never the password. A test binary of its
//! own, because it installs the process-wide subscriber the pooler's shard threads log to.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};

use bypass_pooler::config::{AuthType, PoolMode};
use common::*;

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("lock").extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn each_failed_login_is_one_warn_line_with_who_where_and_why() {
    // Goal: a wrong password, an unknown user and an unknown database each give exactly one
    // `login failed` line naming user, database, client and reason; no password appears.
    // Method: capture the global subscriber's output around three failed logins.
    let captured = Captured::default();
    let writer = captured.clone();
    tracing_subscriber::fmt()
        .with_ansi(false)
        .with_max_level(tracing::Level::WARN)
        .with_writer(move || writer.clone())
        .init();
    let postgres = postgres();
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("userlist.txt");
    std::fs::write(&path, "\"postgres\" \"right-password\"\n").expect("auth file");
    let mut config = config(&postgres, PoolMode::Transaction, 2);
    config.pooler.auth_type = AuthType::ScramSha256;
    config.pooler.auth_file = Some(path);
    config.databases.clear();
    config.databases.insert(
        "app".into(),
        bypass_pooler::config::DatabaseEntry {
            port: postgres.port(),
            dbname: Some("postgres".into()),
            ..Default::default()
        },
    );
    let pooler = Pooler::start(config);
    let attempts = [
        ("postgres", "guess-one-1234", "app", "28P01"),
        ("nobody", "guess-two-5678", "app", "28P01"),
        ("postgres", "right-password", "nowhere", "3D000"),
    ];
    for (user, password, database, code) in attempts {
        let error = connect_db(pooler.port, user, Some(password), database).await.map(drop).expect_err("refused");
        assert_eq!(sqlstate(&error).as_deref(), Some(code), "{user}/{database}: {error}");
    }
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let text = String::from_utf8_lossy(&captured.0.lock().expect("lock")).into_owned();
    let lines: Vec<&str> = text.lines().filter(|line| line.contains("login failed")).collect();
    assert_eq!(lines.len(), attempts.len(), "{text}");
    for ((user, _, database, code), line) in attempts.iter().zip(&lines) {
        for expected in [
            "WARN".to_string(),
            format!("user=\"{user}\""),
            format!("database=\"{database}\""),
            "client=127.0.0.1:".to_string(),
            format!("sqlstate=\"{code}\""),
            "reason=".to_string(),
        ] {
            assert!(line.contains(&expected), "{expected} missing in {line}");
        }
    }
    for (_, password, _, _) in attempts {
        assert!(!text.contains(password), "a password reached the log");
    }
}
