//! The login-failure log line (issue 18), in a test binary of its own: tracing caches per
//! call site whether anyone listens, and tests on other threads without a subscriber would race
//! with this one's.

use std::io::Write;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bypass_frontdoor::{Admission, CancelKey, FrontDoor, FrontDoorConfig};
use bypass_wire::auth_file::AuthFile;
use tokio::net::TcpListener;

async fn serve(door: Arc<FrontDoor>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let door = door.clone();
            tokio::spawn(async move {
                if let Ok(Admission::Client(mut client)) = door.accept(tcp, 16 * 1024).await {
                    let _ = client.welcome(&[], CancelKey::random()).await;
                }
            });
        }
    });
    address
}

async fn login(address: SocketAddr, user: &str, password: &str) -> Result<(), String> {
    let mut config = tokio_postgres::Config::new();
    config.host("127.0.0.1").port(address.port()).user(user).password(password).dbname("app");
    match config.connect(tokio_postgres::NoTls).await {
        Ok(_) => Ok(()),
        Err(error) => Err(error.as_db_error().map(|db| db.code().code().to_owned()).unwrap_or(error.to_string())),
    }
}

/// A writer the log subscriber appends to, for checking log lines by content.
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

#[test]
fn every_failed_login_writes_one_warn_line_with_user_database_address_and_reason() {
    // Goal: issue 18's log line: one warn line per failure, structured, without the password.
    // Method: capture the subscriber's output around one wrong-password login.
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_max_level(tracing::Level::WARN)
        .with_writer(move || writer.clone())
        .finish();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    tracing::subscriber::with_default(subscriber, || {
        runtime.block_on(async {
            let users = AuthFile::parse("\"alice\" \"alice-pw\"\n").expect("valid");
            let address = serve(FrontDoor::new(FrontDoorConfig::scram(users))).await;
            assert_eq!(login(address, "alice", "secret-guess-42").await, Err("28P01".into()));
            tokio::time::sleep(Duration::from_millis(100)).await;
        });
    });
    let text = String::from_utf8_lossy(&captured.0.lock().expect("lock")).into_owned();
    let lines: Vec<&str> = text.lines().filter(|line| line.contains("login failed")).collect();
    assert_eq!(lines.len(), 1, "captured: {text:?}");
    let line = lines[0];
    for expected in [
        "WARN",
        "user=\"alice\"",
        "database=\"app\"",
        "client=127.0.0.1:",
        "sqlstate=\"28P01\"",
        "password authentication failed",
    ] {
        assert!(line.contains(expected), "{expected} missing in {line}");
    }
    assert!(!text.contains("secret-guess-42"), "a password reached the log");
}
