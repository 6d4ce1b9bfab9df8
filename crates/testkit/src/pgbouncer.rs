//! One or more real PgBouncer 1.18 processes in front of a backend, for comparisons and tests.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::postgres::make_runtime_dir;
use crate::process::{self, server_command, write_server_file};
use crate::sql::{check_plain, check_single_line};
use crate::{free_port, TestkitError};

/// The PgBouncer binary (Debian package).
pub const PGBOUNCER_BIN: &str = "/usr/sbin/pgbouncer";

/// The address PgBouncer listens on.
const HOST: &str = "127.0.0.1";

/// Upper bound on [`PgBouncerOptions::processes`]; more would only oversubscribe the cores.
const PROCESSES_MAX: u32 = 16;

/// How long start-up may take before it is reported as a timeout.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// How long processes get to exit after SIGTERM before SIGKILL.
const TERM_GRACE: Duration = Duration::from_secs(3);

/// Start attempts on fresh automatic ports when another process grabbed the port first.
const START_ATTEMPTS_MAX: usize = 3;

/// Bytes of each log quoted in a start-up error.
const LOG_TAIL_BYTES: usize = 2_048;

/// The line PgBouncer logs once its listening socket is bound.
const LISTENING_MARKER: &str = "listening on";

const POOL_MODES: [&str; 3] = ["session", "transaction", "statement"];
const AUTH_TYPES: [&str; 4] = ["trust", "md5", "scram-sha-256", "plain"];

/// How to run PgBouncer; `Default` is one transaction-pooling process with trust auth.
#[derive(Debug, Clone)]
pub struct PgBouncerOptions {
    /// Port of the PostgreSQL server on 127.0.0.1 that every database maps to; default 5432,
    /// set it to your `Postgres::port()`.
    pub backend_port: u16,
    /// `pool_mode`: "session", "transaction" (default) or "statement".
    pub pool_mode: String,
    /// `default_pool_size`: server connections per user/database pair; default 20.
    pub pool_size: u32,
    /// `max_client_conn`; default 11000.
    pub max_client_conn: u32,
    /// Number of processes sharing the port through `so_reuseport`; default 1.
    pub processes: u32,
    /// `auth_type`: "trust" (default), "md5", "scram-sha-256" or "plain".
    pub auth_type: String,
    /// `userlist.txt` entries as plaintext (name, password). PgBouncer only admits users listed
    /// here, even with `auth_type = trust`; default `[("postgres", "postgres")]`, which also
    /// opens the admin console (`admin_users = postgres`).
    pub users: Vec<(String, String)>,
    /// Listen port; `None` picks [`free_port`].
    pub port: Option<u16>,
}

impl Default for PgBouncerOptions {
    fn default() -> Self {
        PgBouncerOptions {
            backend_port: 5432,
            pool_mode: "transaction".to_string(),
            pool_size: 20,
            max_client_conn: 11_000,
            processes: 1,
            auth_type: "trust".to_string(),
            users: vec![("postgres".to_string(), "postgres".to_string())],
            port: None,
        }
    }
}

impl PgBouncerOptions {
    fn validate(&self) -> Result<(), TestkitError> {
        let invalid = |message: String| Err(TestkitError::InvalidOption(message));
        if !POOL_MODES.contains(&self.pool_mode.as_str()) {
            return invalid(format!("pool_mode {:?} not in {POOL_MODES:?}", self.pool_mode));
        }
        if !AUTH_TYPES.contains(&self.auth_type.as_str()) {
            return invalid(format!("auth_type {:?} not in {AUTH_TYPES:?}", self.auth_type));
        }
        if self.processes == 0 || self.processes > PROCESSES_MAX {
            return invalid(format!("processes must be 1..={PROCESSES_MAX}"));
        }
        if self.pool_size == 0 || self.max_client_conn == 0 {
            return invalid("pool_size and max_client_conn must be positive".to_string());
        }
        for (name, password) in &self.users {
            check_plain("pgbouncer user name", name)?;
            check_single_line("pgbouncer password", password)?;
        }
        Ok(())
    }
}

/// Running PgBouncer processes. Dropping it terminates them and removes the temp dir.
#[derive(Debug)]
pub struct PgBouncer {
    port: u16,
    children: Vec<Child>,
    /// Holds the ini files, userlist.txt and logs.
    dir: TempDir,
}

impl PgBouncer {
    /// Writes the config into a fresh temp dir, spawns `options.processes` foreground
    /// processes and waits (up to 10 s) until all of them listen.
    pub fn start(options: PgBouncerOptions) -> Result<PgBouncer, TestkitError> {
        options.validate()?;
        let dir = make_runtime_dir("bypass-pgbouncer-")?;
        let userlist = dir.path().join("userlist.txt");
        write_server_file(&userlist, &render_userlist(&options.users))?;
        let mut bouncer = PgBouncer { port: options.port.unwrap_or_else(free_port), children: Vec::new(), dir };
        let mut attempt = 1;
        loop {
            match bouncer.spawn_all(&options) {
                Ok(()) => return Ok(bouncer),
                Err(error) if options.port.is_some() || attempt >= START_ATTEMPTS_MAX => return Err(error),
                Err(_) => {
                    attempt += 1;
                    bouncer.port = free_port();
                }
            }
        }
    }

    /// Spawns every process and waits until all listen; on failure stops what was spawned.
    fn spawn_all(&mut self, options: &PgBouncerOptions) -> Result<(), TestkitError> {
        for index in 0..options.processes {
            let config = IniSettings { options, listen_port: self.port, dir: self.dir.path(), index };
            let ini = self.dir.path().join(format!("pgbouncer-{index}.ini"));
            write_server_file(&ini, &render_ini(&config))?;
            let spawned = self.spawn_one(&ini, index);
            if let Err(error) = spawned {
                self.terminate();
                return Err(error);
            }
        }
        let ready = self.wait_ready();
        if ready.is_err() {
            self.terminate();
        }
        ready
    }

    fn spawn_one(&mut self, ini: &Path, index: u32) -> Result<(), TestkitError> {
        let stderr_path = self.stderr_file(index);
        let stderr = File::create(&stderr_path)
            .map_err(|e| TestkitError::io(format!("creating {}", stderr_path.display()), e))?;
        let mut command = server_command(PGBOUNCER_BIN)?;
        command.arg(ini).stdin(Stdio::null()).stdout(Stdio::null()).stderr(stderr);
        let child = command.spawn().map_err(|e| TestkitError::io(format!("spawning {PGBOUNCER_BIN}"), e))?;
        self.children.push(child);
        Ok(())
    }

    /// Waits until every process logged that it listens and the port accepts connections.
    fn wait_ready(&mut self) -> Result<(), TestkitError> {
        let started = Instant::now();
        loop {
            if let Some(error) = self.exited_process_error() {
                return Err(error);
            }
            if self.all_listening() && process::port_accepts(HOST, self.port) {
                return Ok(());
            }
            if started.elapsed() >= READY_TIMEOUT {
                return Err(self.startup_error(format!(
                    "not listening on port {} after {} ms",
                    self.port,
                    READY_TIMEOUT.as_millis()
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn all_listening(&self) -> bool {
        (0..self.children.len()).all(|index| {
            std::fs::read_to_string(self.log_file(index as u32))
                .map(|log| log.contains(LISTENING_MARKER))
                .unwrap_or(false)
        })
    }

    /// A start-up error when some process already exited (bad config, port in use, ...).
    fn exited_process_error(&mut self) -> Option<TestkitError> {
        let exited = self.children.iter_mut().enumerate().find_map(|(index, child)| match child.try_wait() {
            Ok(Some(status)) => Some((index, status)),
            _ => None,
        })?;
        let (index, status) = exited;
        Some(self.startup_error(format!("process {index} exited with {status}")))
    }

    fn startup_error(&self, detail: String) -> TestkitError {
        let mut log_tail = String::new();
        for index in 0..self.children.len() as u32 {
            for path in [self.stderr_file(index), self.log_file(index)] {
                log_tail.push_str(&format!("== {}\n", path.display()));
                log_tail.push_str(&process::log_tail(&path, LOG_TAIL_BYTES));
            }
        }
        TestkitError::Startup { what: format!("PgBouncer on port {}", self.port), detail, log_tail }
    }

    fn log_file(&self, index: u32) -> PathBuf {
        self.dir.path().join(format!("pgbouncer-{index}.log"))
    }

    fn stderr_file(&self, index: u32) -> PathBuf {
        self.dir.path().join(format!("pgbouncer-{index}.stderr"))
    }

    /// SIGTERM (immediate shutdown in PgBouncer), a short grace period, then SIGKILL; reaps
    /// every child. Never panics.
    fn terminate(&mut self) {
        for child in &self.children {
            if let Ok(pid) = libc::pid_t::try_from(child.id()) {
                // SAFETY: kill has no memory-safety preconditions; the pid is our own unreaped
                // child, so it cannot have been reused by another process.
                unsafe {
                    libc::kill(pid, libc::SIGTERM);
                }
            }
        }
        let deadline = Instant::now() + TERM_GRACE;
        for mut child in self.children.drain(..) {
            while Instant::now() < deadline && matches!(child.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(20));
            }
            if matches!(child.try_wait(), Ok(None)) {
                let _ = child.kill();
            }
            let _ = child.wait();
        }
    }

    /// The port all processes listen on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The address PgBouncer listens on: always `127.0.0.1`.
    pub fn host(&self) -> &str {
        HOST
    }

    /// Pids of the pgbouncer processes themselves (spawned directly, no wrapper).
    pub fn pids(&self) -> Vec<u32> {
        self.children.iter().map(Child::id).collect()
    }

    /// A libpq key/value connection string through PgBouncer.
    pub fn connection_string(&self, user: &str, dbname: &str) -> String {
        format!("host={HOST} port={} user={user} dbname={dbname}", self.port)
    }

    /// The temp dir with the ini files, `userlist.txt` and the logs.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        self.terminate();
    }
}

/// What differs between the ini files of the processes.
struct IniSettings<'a> {
    options: &'a PgBouncerOptions,
    listen_port: u16,
    dir: &'a Path,
    index: u32,
}

/// One process's `pgbouncer.ini`. Each process gets its own file so logs stay apart; no pidfile
/// (we hold the children), so processes never fight over one.
fn render_ini(settings: &IniSettings<'_>) -> String {
    let options = settings.options;
    let dir = settings.dir.display();
    let reuseport = u8::from(options.processes > 1);
    let lines = [
        "[databases]".to_string(),
        format!("* = host={HOST} port={}", options.backend_port),
        String::new(),
        "[pgbouncer]".to_string(),
        format!("listen_addr = {HOST}"),
        format!("listen_port = {}", settings.listen_port),
        "unix_socket_dir =".to_string(),
        format!("auth_type = {}", options.auth_type),
        format!("auth_file = {dir}/userlist.txt"),
        format!("pool_mode = {}", options.pool_mode),
        format!("default_pool_size = {}", options.pool_size),
        format!("max_client_conn = {}", options.max_client_conn),
        "max_db_connections = 0".to_string(),
        format!("logfile = {dir}/pgbouncer-{}.log", settings.index),
        format!("so_reuseport = {reuseport}"),
        "log_connections = 0".to_string(),
        "log_disconnections = 0".to_string(),
        "listen_backlog = 4096".to_string(),
        "ignore_startup_parameters = extra_float_digits,options".to_string(),
        "server_reset_query = DISCARD ALL".to_string(),
        "admin_users = postgres".to_string(),
    ];
    lines.join("\n") + "\n"
}

/// `"name" "password"` lines; a double quote inside a value is written doubled.
fn render_userlist(users: &[(String, String)]) -> String {
    users
        .iter()
        .map(|(name, password)| {
            let name = name.replace('"', "\"\"");
            let password = password.replace('"', "\"\"");
            format!("\"{name}\" \"{password}\"\n")
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: the ini enables so_reuseport only for several processes and keeps logs apart;
    // method: render for 1 and 2 processes and compare lines.
    #[test]
    fn ini_reuseport_only_with_several_processes() {
        let mut options = PgBouncerOptions { backend_port: 5555, ..PgBouncerOptions::default() };
        let settings = |options: &PgBouncerOptions| {
            render_ini(&IniSettings { options, listen_port: 6000, dir: Path::new("/tmp/b"), index: 1 })
        };
        let single = settings(&options);
        assert!(single.contains("* = host=127.0.0.1 port=5555\n"));
        assert!(single.contains("listen_port = 6000\n"));
        assert!(single.contains("so_reuseport = 0\n"));
        assert!(single.contains("logfile = /tmp/b/pgbouncer-1.log\n"));
        assert!(!single.contains("pidfile"));
        options.processes = 2;
        assert!(settings(&options).contains("so_reuseport = 1\n"));
    }

    // Goal: userlist quoting survives quotes in values; method: render one tricky entry.
    #[test]
    fn userlist_doubles_quotes() {
        let users = vec![("a\"b".to_string(), "p\"w".to_string())];
        assert_eq!(render_userlist(&users), "\"a\"\"b\" \"p\"\"w\"\n");
    }

    // Goal: unknown modes and zero processes are refused before anything is spawned.
    #[test]
    fn validate_rejects_bad_options() {
        let bad_mode = PgBouncerOptions { pool_mode: "sessions".to_string(), ..PgBouncerOptions::default() };
        assert!(bad_mode.validate().is_err());
        let no_process = PgBouncerOptions { processes: 0, ..PgBouncerOptions::default() };
        assert!(no_process.validate().is_err());
        assert!(PgBouncerOptions::default().validate().is_ok());
    }
}
