//! `bypass proxy` as an operator runs it: SIGHUP reloads the file, a bad file is refused and the
//! process keeps serving, SIGTERM waits for a running transaction, SIGINT stops at once.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bypass_testkit::{free_port, pg_bin, Postgres};

fn write_config(path: &Path, listen: u16, backend: u16, pool_size: u32, extra: &str) {
    let text = format!(
        "[pooler]\nlisten_addr = \"127.0.0.1:{listen}\"\nworkers = 1\npool_mode = \"transaction\"\n\
         auth_type = \"trust\"\ndefault_pool_size = {pool_size}\nadmin_users = [\"postgres\"]\n{extra}\n\
         [databases.\"*\"]\nport = {backend}\n"
    );
    std::fs::write(path, text).expect("write config");
}

fn start(path: &Path, port: u16) -> Child {
    let child = Command::new(env!("CARGO_BIN_EXE_bypass"))
        .args(["proxy", "--config"])
        .arg(path)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("bypass proxy starts");
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "the pooler never listened");
        std::thread::sleep(Duration::from_millis(50));
    }
    child
}

fn signal(child: &Child, signal: i32) {
    // SAFETY: kill() only sends a signal to our own child process.
    assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0, "kill failed");
}

/// `SHOW CONFIG`'s value for `key`, through psql on the console.
fn config_value(port: u16, key: &str) -> String {
    let output = Command::new(pg_bin("psql"))
        .args(["-X", "-A", "-t", "-h", "127.0.0.1", "-U", "postgres", "-d", "bypass", "-c", "SHOW CONFIG"])
        .arg("-p")
        .arg(port.to_string())
        .output()
        .expect("psql");
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let line = text.lines().find(|line| line.starts_with(&format!("{key}|"))).unwrap_or_default();
    line.split('|').nth(1).unwrap_or_default().to_owned()
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A raw protocol client for holding a transaction open across a signal.
struct Client(TcpStream);

impl Client {
    fn login(port: u16) -> Client {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        stream.set_read_timeout(Some(Duration::from_secs(20))).expect("timeout");
        let mut startup = Vec::new();
        bypass_wire::startup::encode_startup(&mut startup, &[("user", "postgres"), ("database", "postgres")]);
        stream.write_all(&startup).expect("startup");
        let mut client = Client(stream);
        client.read_to_ready();
        client
    }

    /// Sends a simple query; returns the tags of the answer up to ReadyForQuery.
    fn query(&mut self, sql: &str) -> Vec<u8> {
        let mut message = Vec::new();
        bypass_wire::frontend::build::query(&mut message, sql);
        self.0.write_all(&message).expect("send");
        self.read_to_ready()
    }

    fn read_to_ready(&mut self) -> Vec<u8> {
        let mut tags = Vec::new();
        loop {
            let mut header = [0u8; 5];
            if self.0.read_exact(&mut header).is_err() {
                return tags;
            }
            let length = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
            let mut body = vec![0u8; length - 4];
            self.0.read_exact(&mut body).expect("body");
            tags.push(header[0]);
            if header[0] == b'Z' {
                return tags;
            }
        }
    }
}

#[test]
fn sighup_reloads_and_sigterm_waits_for_the_transaction() {
    // Goal: the signals do what the README says. Method: SIGHUP after raising the pool size shows
    // the new value in SHOW CONFIG; SIGHUP with a broken file keeps the old value and the process;
    // SIGTERM with a transaction open leaves the process running until COMMIT, which succeeds.
    let postgres = Postgres::start().expect("PostgreSQL");
    postgres.psql("create table t (x int)").expect("table");
    let folder = tempfile::tempdir().expect("tempdir");
    let path = folder.path().join("bypass.toml");
    let port = free_port();
    write_config(&path, port, postgres.port(), 1, "");
    let mut child = start(&path, port);
    assert_eq!(config_value(port, "default_pool_size"), "1");
    write_config(&path, port, postgres.port(), 4, "");
    signal(&child, libc::SIGHUP);
    wait_until("the reload", || config_value(port, "default_pool_size") == "4");
    write_config(&path, port, postgres.port(), 9, "no_such_key = 1");
    signal(&child, libc::SIGHUP);
    std::thread::sleep(Duration::from_millis(500));
    assert!(child.try_wait().expect("wait").is_none(), "a bad file stopped the process");
    assert_eq!(config_value(port, "default_pool_size"), "4", "a bad file changed the configuration");

    let mut client = Client::login(port);
    assert!(!client.query("begin; insert into t values (1)").contains(&b'E'));
    signal(&child, libc::SIGTERM);
    std::thread::sleep(Duration::from_millis(500));
    assert!(child.try_wait().expect("wait").is_none(), "SIGTERM did not wait for the transaction");
    assert!(!client.query("commit").contains(&b'E'), "the commit failed");
    wait_until("the stop", || child.try_wait().expect("wait").is_some());
    assert_eq!(postgres.psql("select count(*) from t").expect("count").trim(), "1");
}

#[test]
fn sigint_stops_at_once() {
    // Goal: SIGINT does not wait. Method: a transaction is open; after SIGINT the process exits
    // well before shutdown_timeout_ms (60 s here).
    let postgres = Postgres::start().expect("PostgreSQL");
    let folder = tempfile::tempdir().expect("tempdir");
    let path = folder.path().join("bypass.toml");
    let port = free_port();
    write_config(&path, port, postgres.port(), 1, "shutdown_timeout_ms = 60000");
    let mut child = start(&path, port);
    let mut client = Client::login(port);
    client.query("begin");
    let sent = Instant::now();
    signal(&child, libc::SIGINT);
    wait_until("the stop", || child.try_wait().expect("wait").is_some());
    assert!(sent.elapsed() < Duration::from_secs(10), "SIGINT waited");
}
