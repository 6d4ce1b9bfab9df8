//! `bypass proxy` and `bypass up` as an operator runs them: the log lines of each failure class
//! (read from the process's stderr, a pipe, so without colour), JSON lines, and refusals of a
//! second pooler on the same address or a second `bypass up` on the same folder. Real
//! PostgreSQL 15 and the real binary.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use bypass_testkit::{free_port, pg_bin, Postgres};

const BYPASS: &str = env!("CARGO_BIN_EXE_bypass");
/// Bound on waiting for a process to listen or to print its first line.
const START_TIMEOUT: Duration = Duration::from_secs(90);

/// A `bypass` child whose stderr goes to a file; killed on drop.
struct Bypass {
    child: Child,
    log: PathBuf,
}

impl Bypass {
    fn proxy(config: &Path, extra: &[&str]) -> Bypass {
        let log = config.with_extension(format!("{}.log", free_port()));
        let stderr = std::fs::File::create(&log).expect("log file");
        let child = Command::new(BYPASS)
            .args(extra)
            .arg("proxy")
            .arg("--config")
            .arg(config)
            .env_remove("BYPASS_LOG")
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("bypass starts");
        Bypass { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the log has a line with every one of `needles`; returns that line.
    fn wait_for_line(&self, needles: &[&str]) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let log = self.log();
            if let Some(line) = log.lines().find(|line| needles.iter().all(|needle| line.contains(needle))) {
                return line.to_owned();
            }
            assert!(Instant::now() < deadline, "no log line with {needles:?} in:\n{log}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGTERM, then the exit status (killed after 30 s).
    fn stop(mut self) -> std::process::ExitStatus {
        // SAFETY: kill only sends a signal to our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Bypass {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn wait_listening(port: u16) {
    let deadline = Instant::now() + START_TIMEOUT;
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nothing listens on {port}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn psql(port: u16, user: &str, database: &str, sql: &str) -> Output {
    Command::new(pg_bin("psql"))
        .args(["-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-U", user, "-d", database, "-c", sql])
        .arg("-p")
        .arg(port.to_string())
        .env("PGCONNECT_TIMEOUT", "20")
        .output()
        .expect("psql runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).trim().to_owned()
}

/// A trust configuration in `folder`: database `app` on `postgres`, database `dead` on a port
/// nobody listens on; one server per pool.
fn write_config(folder: &Path, port: u16, postgres: &Postgres, extra: &str) -> PathBuf {
    let dead_port = free_port();
    let text = format!(
        "[pooler]\nlisten_addr = \"127.0.0.1:{port}\"\nauth_type = \"trust\"\npool_mode = \"transaction\"\n\
         default_pool_size = 1\nquery_wait_timeout_ms = 1000\nserver_connect_timeout_ms = 2000\n{extra}\n\
         [databases.app]\nport = {}\ndbname = \"postgres\"\n[databases.dead]\nport = {dead_port}\n",
        postgres.port()
    );
    let path = folder.join("bypass.toml");
    std::fs::write(&path, text).expect("write config");
    path
}

/// A client speaking the protocol by hand, for states no command-line client holds still in.
struct RawClient(TcpStream);

impl RawClient {
    fn login(port: u16, database: &str) -> RawClient {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        stream.set_read_timeout(Some(Duration::from_secs(20))).expect("timeout");
        let mut startup = Vec::new();
        bypass_wire::startup::encode_startup(&mut startup, &[("user", "postgres"), ("database", database)]);
        stream.write_all(&startup).expect("startup");
        let mut client = RawClient(stream);
        client.read_until(b'Z');
        client
    }

    fn query(&mut self, sql: &str) -> Vec<(u8, Vec<u8>)> {
        let mut message = vec![b'Q'];
        message.extend_from_slice(&(4 + sql.len() as u32 + 1).to_be_bytes());
        message.extend_from_slice(sql.as_bytes());
        message.push(0);
        self.0.write_all(&message).expect("query");
        self.read_until(b'Z')
    }

    fn read_until(&mut self, tag: u8) -> Vec<(u8, Vec<u8>)> {
        let mut messages = Vec::new();
        loop {
            let mut header = [0u8; 5];
            if self.0.read_exact(&mut header).is_err() {
                return messages;
            }
            let length = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
            let mut body = vec![0u8; length - 4];
            self.0.read_exact(&mut body).expect("body");
            messages.push((header[0], body));
            if header[0] == tag {
                return messages;
            }
        }
    }
}

#[test]
fn each_failure_class_is_logged_in_plain_text() {
    // Goal: an operator finds a line for each failure (server unreachable, a server ending a
    // session, a client timeout), logins (a Unix-socket client as `client=unix`) and disconnects,
    // and the periodic stats line, with no terminal escape codes when stderr is not a terminal.
    // Method: run `bypass proxy` with stderr to a file, cause each case against real
    // PostgreSQL, read the file.
    let postgres = Postgres::start().expect("PostgreSQL starts");
    let folder = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let socket_dir = folder.path().display().to_string();
    let extra = format!("stats_period_ms = 300\nunix_socket_dir = \"{socket_dir}\"");
    let config = write_config(folder.path(), port, &postgres, &extra);
    let bypass = Bypass::proxy(&config, &[]);
    wait_listening(port);

    let ok = psql(port, "postgres", "app", "select 1");
    assert!(ok.status.success(), "{}", text(&ok.stderr));
    bypass.wait_for_line(&["login", "database=app", "user=postgres", "client=127.0.0.1:"]);
    bypass.wait_for_line(&["closing client", "database=app", "client close request"]);
    let local = Command::new(pg_bin("psql"))
        .args(["-X", "-A", "-t", "-U", "postgres", "-d", "app", "-c", "select 1", "-h", &socket_dir])
        .args(["-p", &port.to_string()])
        .output()
        .expect("psql runs");
    assert!(local.status.success(), "{}", text(&local.stderr));
    bypass.wait_for_line(&["login", "database=app", "client=unix"]);

    let unreachable = psql(port, "postgres", "dead", "select 1");
    assert!(!unreachable.status.success());
    bypass.wait_for_line(&["WARN", "server connect failed", "database=dead", "sqlstate="]);

    let mut idle = RawClient::login(port, "app");
    idle.query("begin; set local idle_in_transaction_session_timeout = 200");
    let fatal = idle.read_until(b'E');
    assert_eq!(fatal.last().map(|(tag, _)| *tag), Some(b'E'), "the client gets the server's FATAL");
    bypass.wait_for_line(&["WARN", "server ended the session", "sqlstate=25P03", "database=app", "backend_pid="]);

    let mut holder = RawClient::login(port, "app");
    holder.query("begin");
    let waited = psql(port, "postgres", "app", "select 1");
    assert!(text(&waited.stderr).contains("query_wait_timeout"), "{}", text(&waited.stderr));
    bypass.wait_for_line(&["WARN", "closing client", "query_wait_timeout", "sqlstate=08006"]);
    holder.query("commit");

    bypass.wait_for_line(&["stats", "xacts_per_s=", "wait_us="]);
    let log = bypass.log();
    assert!(!log.contains('\u{1b}'), "escape codes in a log that is not a terminal:\n{log}");
    assert!(bypass.stop().success());
}

#[test]
fn json_lines_on_request() {
    // Goal: `--log-format json` writes one JSON object per line with the event's fields.
    // Method: log in once, parse every line of stderr, find the login event.
    let postgres = Postgres::start().expect("PostgreSQL starts");
    let folder = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let config = write_config(folder.path(), port, &postgres, "");
    let bypass = Bypass::proxy(&config, &["--log-format", "json"]);
    wait_listening(port);
    assert!(psql(port, "postgres", "app", "select 1").status.success());
    bypass.wait_for_line(&["\"login\""]);
    let log = bypass.log();
    let events: Vec<serde_json::Value> = log
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|error| panic!("not JSON ({error}): {line}")))
        .collect();
    let login = events.iter().find(|event| event["message"] == "login").expect("a login event");
    assert_eq!(login["database"], "app", "{login}");
    assert_eq!(login["level"], "INFO", "{login}");
    assert!(bypass.stop().success());
}

#[test]
fn a_second_pooler_on_the_same_address_is_refused() {
    // Goal: a second `bypass proxy` on an address another one serves fails fast with a clear
    // message instead of taking half of the new connections through SO_REUSEPORT; the first
    // serves every connection. Method: start two with one configuration, check the second's
    // exit and message, then run 20 psql sessions and count them in the first's log.
    let postgres = Postgres::start().expect("PostgreSQL starts");
    let folder = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let config = write_config(folder.path(), port, &postgres, "");
    let first = Bypass::proxy(&config, &[]);
    wait_listening(port);
    let started = Instant::now();
    let second = Command::new(BYPASS).arg("proxy").arg("--config").arg(&config).output().expect("runs");
    assert!(!second.status.success(), "the second pooler must not start");
    assert!(started.elapsed() < Duration::from_secs(10), "it must fail fast: {:?}", started.elapsed());
    let message = text(&second.stderr);
    assert!(message.contains("already served by another process"), "{message}");
    assert!(message.contains(&format!("127.0.0.1:{port}")), "{message}");
    assert!(!message.contains("stack backtrace"), "{message}");
    for round in 0..20 {
        let output = psql(port, "postgres", "app", &format!("select {round}"));
        assert!(output.status.success(), "{}", text(&output.stderr));
    }
    let log = first.log();
    let logins = log.lines().filter(|line| line.contains(" login ") && line.contains("database=app")).count();
    assert_eq!(logins, 20, "the first pooler served every connection:\n{log}");
    assert!(first.stop().success());
}

/// `bypass up` with its output piped: stdout lines arrive on a channel.
fn bypass_up(folder: &Path, port: u16, metrics_port: u16) -> (Child, mpsc::Receiver<String>) {
    let mut child = Command::new(BYPASS)
        .args(["up", "--dir"])
        .arg(folder)
        .args(["--port", &port.to_string(), "--metrics-port", &metrics_port.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("bypass up starts");
    let (sender, receiver) = mpsc::channel();
    let stdout = child.stdout.take().expect("piped");
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = sender.send(line);
        }
    });
    (child, receiver)
}

fn http_get(port: u16, path: &str) -> String {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    write!(stream, "GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").expect("request");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("response");
    response
}

#[test]
fn bypass_up_first_run_and_a_second_up_on_the_same_folder() {
    // Goal: the README's first-run commands work on `bypass up` (console as the printed user,
    // /metrics), and a second `bypass up` on the same folder refuses at once without touching
    // the first one's PostgreSQL; after a `bypass up` killed hard, the orphaned PostgreSQL is
    // detected, not stopped. Method: real `bypass up` processes on one temporary folder.
    let folder = tempfile::tempdir().expect("tempdir");
    // The cluster inside runs as the `postgres` user, which must be able to reach it.
    std::fs::set_permissions(folder.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
    let (port, metrics_port) = (free_port(), free_port());
    let (mut first, lines) = bypass_up(folder.path(), port, metrics_port);
    let line = lines.recv_timeout(START_TIMEOUT).expect("bypass up prints its psql line");
    assert!(line.contains(&format!("port={port}")) && line.contains("user=postgres"), "{line}");

    let pools = psql(port, "postgres", "bypass", "SHOW POOLS");
    assert!(pools.status.success(), "the README's console command: {}", text(&pools.stderr));
    assert!(psql(port, "postgres", "postgres", "select 1").status.success());
    let metrics = http_get(metrics_port, "/metrics");
    assert!(metrics.starts_with("HTTP/1.1 200") && metrics.contains("bypass_clients_active"), "{metrics}");

    let started = Instant::now();
    let second = Command::new(BYPASS)
        .args(["up", "--dir"])
        .arg(folder.path())
        .args(["--port", &free_port().to_string(), "--metrics-port", "0"])
        .output()
        .expect("runs");
    assert!(!second.status.success());
    assert!(started.elapsed() < Duration::from_secs(10), "it must fail fast: {:?}", started.elapsed());
    let message = text(&second.stderr);
    assert!(message.contains("another `bypass up`") && message.contains(&first.id().to_string()), "{message}");
    let after = psql(port, "postgres", "postgres", "select 2");
    assert!(after.status.success(), "the first one still serves: {}", text(&after.stderr));

    // Killed hard, the first leaves its PostgreSQL running: the next start must say so.
    first.kill().expect("kill");
    first.wait().expect("reaped");
    let third = Command::new(BYPASS)
        .args(["up", "--dir"])
        .arg(folder.path())
        .args(["--port", &free_port().to_string(), "--metrics-port", "0"])
        .output()
        .expect("runs");
    let message = text(&third.stderr);
    assert!(!third.status.success() && message.contains("already running"), "{message}");
    let data_dir = folder.path().join("pgdata");
    let stop = Command::new("runuser")
        .args(["-u", "postgres", "--"])
        .arg(pg_bin("pg_ctl"))
        .arg("-D")
        .arg(&data_dir)
        .args(["-m", "immediate", "stop"])
        .output()
        .expect("pg_ctl runs");
    assert!(stop.status.success(), "the orphan was still running: {}", text(&stop.stderr));
}

fn bypass(args: &[&str], folder: &Path) -> Output {
    Command::new(BYPASS).args(args).current_dir(folder).env("RUST_BACKTRACE", "1").output().expect("bypass runs")
}

fn psql_as(port: u16, user: &str, password: &str, database: &str, sslmode: &str) -> Output {
    Command::new(pg_bin("psql"))
        .args(["-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", "select current_user || '@' || current_database()"])
        .arg(format!("host=127.0.0.1 port={port} user={user} dbname={database} sslmode={sslmode} connect_timeout=20"))
        .env("PGPASSWORD", password)
        .output()
        .expect("psql runs")
}

#[test]
fn import_pgbouncer_then_psql_through_the_result() {
    // Goal: a representative pgbouncer.ini (md5 and SCRAM secrets in its auth file, two
    // databases, client TLS, timeouts) becomes a bypass.toml that serves the same clients, and
    // what has no equivalent is listed. Method: write the ini, `bypass import-pgbouncer`,
    // `bypass check-config`, `bypass proxy`, then psql with each user over TLS to each database.
    let postgres = Postgres::start_with(bypass_testkit::PostgresOptions {
        users: vec![
            bypass_testkit::TestUser::md5("mdfive", "pw-one"),
            bypass_testkit::TestUser::scram("scrammy", "pw-two"),
        ],
        ..Default::default()
    })
    .expect("PostgreSQL starts");
    postgres.psql("create database reports").expect("second database");
    let secret = |user: &str| {
        postgres.psql(&format!("select rolpassword from pg_authid where rolname = '{user}'")).expect("secret")
    };
    let folder = tempfile::tempdir().expect("tempdir");
    let dir = folder.path();
    let userlist = format!("\"mdfive\" \"{}\"\n\"scrammy\" \"{}\"\n", secret("mdfive"), secret("scrammy"));
    std::fs::write(dir.join("userlist.txt"), userlist).expect("userlist");
    let certificate = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost", "-days", "2"])
        .args(["-keyout", "key.pem", "-out", "cert.pem"])
        .current_dir(dir)
        .output()
        .expect("openssl runs");
    assert!(certificate.status.success(), "{}", text(&certificate.stderr));
    let port = free_port();
    let ini = format!(
        "[databases]\napp = host=127.0.0.1 port={pg} dbname=postgres\nreports = host=127.0.0.1 port={pg} dbname=reports pool_size=3\n\n\
         [pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\nauth_type = md5\n\
         auth_file = userlist.txt\npool_mode = transaction\nmax_client_conn = 200\ndefault_pool_size = 5\n\
         client_tls_sslmode = require\nclient_tls_cert_file = cert.pem\nclient_tls_key_file = key.pem\n\
         server_tls_sslmode = disable\nserver_idle_timeout = 30\nquery_wait_timeout = 5\nclient_login_timeout = 10\n\
         logfile = /var/log/pgbouncer.log\npidfile = /run/pgbouncer.pid\n",
        pg = postgres.port()
    );
    std::fs::write(dir.join("pgbouncer.ini"), ini).expect("ini");

    let imported = bypass(&["import-pgbouncer", "pgbouncer.ini", "--output", "bypass.toml"], dir);
    let report = text(&imported.stdout);
    assert!(imported.status.success(), "{report}\n{}", text(&imported.stderr));
    assert!(
        report.contains("not translated (2)") && report.contains("logfile") && report.contains("pidfile"),
        "{report}"
    );
    assert!(report.contains("bypass.toml: valid"), "{report}");
    let checked = bypass(&["check-config", "bypass.toml"], dir);
    assert!(checked.status.success(), "{}", text(&checked.stderr));
    let toml = std::fs::read_to_string(dir.join("bypass.toml")).expect("written");
    assert!(toml.contains("query_wait_timeout_ms = 5000") && toml.contains("server_idle_timeout_ms = 30000"), "{toml}");

    let proxy = Bypass::proxy(&dir.join("bypass.toml"), &[]);
    wait_listening(port);
    for (user, password, database) in [("mdfive", "pw-one", "app"), ("scrammy", "pw-two", "reports")] {
        let output = psql_as(port, user, password, database, "require");
        assert!(output.status.success(), "{user}: {}\n{}", text(&output.stderr), proxy.log());
        let expected = format!("{user}@{}", if database == "app" { "postgres" } else { "reports" });
        assert_eq!(text(&output.stdout), expected);
    }
    let plaintext = psql_as(port, "mdfive", "pw-one", "app", "disable");
    assert!(!plaintext.status.success(), "client_tls_sslmode = require carried over");
    let wrong = psql_as(port, "mdfive", "not-it", "app", "require");
    assert!(text(&wrong.stderr).contains("password authentication failed"), "{}", text(&wrong.stderr));
    assert!(proxy.stop().success());
}

#[test]
fn check_config_lists_every_problem_once_without_a_backtrace() {
    // Goal: `bypass check-config` shows every problem of a file in one run, each once, says when
    // the file is a pgbouncer.ini, and never prints a Rust backtrace. Method: a TOML file with
    // four problems, then a pgbouncer.ini, both with RUST_BACKTRACE=1.
    let folder = tempfile::tempdir().expect("tempdir");
    let dir = folder.path();
    std::fs::write(
        dir.join("broken.toml"),
        "[pooler]\npool_mdoe = \"session\"\ndefault_pool_size = \"ten\"\nauth_type = \"md5\"\n[databases.app]\nport = \"x\"\n",
    )
    .expect("write");
    let checked = bypass(&["check-config", "broken.toml"], dir);
    let message = text(&checked.stderr);
    assert!(!checked.status.success());
    for expected in ["pool_mdoe", "pooler.default_pool_size", "databases.app.port", "auth_file is required"] {
        assert_eq!(message.matches(expected).count(), 1, "{expected} once in:\n{message}");
    }
    assert!(!message.contains("backtrace") && !message.contains("panicked"), "{message}");

    std::fs::write(dir.join("pgbouncer.ini"), "[databases]\napp = host=127.0.0.1\n[pgbouncer]\nlisten_port = 6432\n")
        .expect("write");
    let checked = bypass(&["check-config", "pgbouncer.ini"], dir);
    let message = text(&checked.stderr);
    assert!(!checked.status.success());
    assert!(message.contains("looks like a pgbouncer.ini") && message.contains("bypass import-pgbouncer"), "{message}");
    assert!(!message.contains("backtrace") && !message.contains("panicked"), "{message}");
}
