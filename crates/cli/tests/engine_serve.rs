//! `bypass engine serve` as a user starts it: without an auth file it does not start (no silent
//! trust), with one a client must prove its password (28P01 otherwise) and TLS is offered by
//! default (a self-signed certificate); `--tls-required` refuses plaintext. The real binary and
//! psql 15.

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use bypass_testkit::{free_port, pg_bin};

const BYPASS: &str = env!("CARGO_BIN_EXE_bypass");
/// Bound on waiting for the server to listen.
const START_TIMEOUT: Duration = Duration::from_secs(90);

/// A `bypass engine serve` child; killed on drop.
struct Server {
    child: Child,
    port: u16,
}

impl Server {
    fn start(users: &Path, extra: &[&str]) -> Server {
        let port = free_port();
        let child = Command::new(BYPASS)
            .args(["engine", "serve", "--listen", &format!("127.0.0.1:{port}"), "--auth-file"])
            .arg(users)
            .args(["--runtime", "plain", "--workers", "1"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("bypass starts");
        let server = Server { child, port };
        let deadline = Instant::now() + START_TIMEOUT;
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "bypass engine serve did not listen on {port}");
            std::thread::sleep(Duration::from_millis(100));
        }
        server
    }

    /// psql as user `ann` with `password` and libpq's `sslmode`.
    fn psql(&self, password: &str, sslmode: &str, command: &str) -> Output {
        Command::new(pg_bin("psql"))
            .args(["-X", "-At", "-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", "ann", "-d", "bypass"])
            .args(["-c", command])
            .env("PGPASSWORD", password)
            .env("PGSSLMODE", sslmode)
            .env("PGCONNECT_TIMEOUT", "20")
            .output()
            .expect("psql runs")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn text(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

// Goal: the engine's server refuses unauthenticated clients unless told otherwise, and offers
// TLS by default; method: start the real binary without and with an auth file, log in with
// psql with a wrong and the right password, over TLS (sslmode=require, \conninfo names the
// TLS protocol) and without; then with --tls-required, plaintext is refused.
#[test]
fn engine_serve_requires_a_password_and_offers_tls_by_default() {
    let refused = Command::new(BYPASS)
        .args(["engine", "serve", "--listen", &format!("127.0.0.1:{}", free_port())])
        .output()
        .expect("bypass runs");
    assert!(!refused.status.success(), "started without an auth file: {}", text(&refused));
    assert!(text(&refused).contains("--auth-file"), "{}", text(&refused));

    let folder = tempfile::tempdir().expect("temporary folder");
    let users = folder.path().join("users.txt");
    std::fs::write(&users, "\"ann\" \"secret\"\n").expect("auth file");
    let server = Server::start(&users, &[]);
    let wrong = server.psql("guess", "disable", "select 1");
    assert!(!wrong.status.success(), "a wrong password logged in: {}", text(&wrong));
    assert!(text(&wrong).contains("password authentication failed"), "{}", text(&wrong));
    let tls = server.psql("secret", "require", "\\conninfo");
    assert!(tls.status.success(), "{}", text(&tls));
    assert!(text(&tls).contains("SSL connection (protocol: TLSv1."), "not over TLS: {}", text(&tls));
    let plain = server.psql("secret", "disable", "select 40 + 2");
    assert_eq!(String::from_utf8_lossy(&plain.stdout).trim(), "42", "{}", text(&plain));
    drop(server);

    let strict = Server::start(&users, &["--tls-required"]);
    let plain = strict.psql("secret", "disable", "select 1");
    assert!(!plain.status.success(), "plaintext accepted with --tls-required: {}", text(&plain));
    let tls = strict.psql("secret", "require", "select 1");
    assert!(tls.status.success(), "{}", text(&tls));
}
