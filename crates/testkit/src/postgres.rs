//! A throwaway (or persistent) PostgreSQL 15 cluster driven through `initdb`, `pg_ctl` and `psql`.

use std::path::{Path, PathBuf};
use std::process::Command;

use tempfile::TempDir;

use crate::pgconf::{self, ServerSettings, INCLUDE_LINE, SETTINGS_FILE};
use crate::process::{self, chown_to_server_user, server_command, write_server_file};
use crate::sql::{check_plain, check_single_line, quote_literal};
use crate::{free_port, pg_bin, TestkitError};

/// The superuser every cluster is initialised with.
pub const SUPERUSER: &str = "postgres";

/// The address every cluster listens on.
const HOST: &str = "127.0.0.1";

/// Name of the server log inside the data directory.
const LOG_FILE: &str = "postgres.log";

/// Seconds `pg_ctl` waits for start-up or shutdown.
const PG_CTL_TIMEOUT_S: &str = "60";

/// Start attempts on fresh automatic ports when another process grabbed the port first.
const START_ATTEMPTS_MAX: usize = 3;

/// Bytes of the server log quoted in a start-up error.
const LOG_TAIL_BYTES: usize = 4_096;

/// How a role must authenticate over TCP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthMethod {
    /// No password check (`trust` in pg_hba.conf).
    Trust,
    /// `md5` in pg_hba.conf, and the password stored as an MD5 hash.
    Md5,
    /// `scram-sha-256` in pg_hba.conf and storage.
    ScramSha256,
}

impl AuthMethod {
    /// The pg_hba.conf method, or `None` when the catch-all trust line covers the user.
    pub(crate) fn hba_method(self) -> Option<&'static str> {
        match self {
            AuthMethod::Trust => None,
            AuthMethod::Md5 => Some("md5"),
            AuthMethod::ScramSha256 => Some("scram-sha-256"),
        }
    }

    /// The `password_encryption` in force while the role's password is set.
    pub(crate) fn password_encryption(self) -> &'static str {
        match self {
            AuthMethod::Md5 => "md5",
            AuthMethod::Trust | AuthMethod::ScramSha256 => "scram-sha-256",
        }
    }
}

/// A login role created (as SUPERUSER, to keep tests simple) after the cluster starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestUser {
    pub name: String,
    pub password: Option<String>,
    pub auth: AuthMethod,
}

impl TestUser {
    /// A role without a password that connects with `trust`.
    pub fn trust(name: &str) -> TestUser {
        TestUser { name: name.to_string(), password: None, auth: AuthMethod::Trust }
    }

    /// A role whose password is stored and checked as MD5.
    pub fn md5(name: &str, password: &str) -> TestUser {
        TestUser { name: name.to_string(), password: Some(password.to_string()), auth: AuthMethod::Md5 }
    }

    /// A role whose password is stored and checked with SCRAM-SHA-256.
    pub fn scram(name: &str, password: &str) -> TestUser {
        TestUser { name: name.to_string(), password: Some(password.to_string()), auth: AuthMethod::ScramSha256 }
    }
}

/// How to set up a cluster; `Default` gives a throwaway cluster on a free port.
#[derive(Debug, Clone)]
pub struct PostgresOptions {
    /// `max_connections`; default 100.
    pub max_connections: u32,
    /// `shared_buffers` in MiB; default 128.
    pub shared_buffers_mb: u32,
    /// Extra `postgresql.conf` lines, e.g. `"synchronous_commit = off"`.
    pub extra_conf: Vec<String>,
    /// Roles created after start.
    pub users: Vec<TestUser>,
    /// TCP port; `None` picks [`free_port`].
    pub port: Option<u16>,
    /// `None`: a fresh temp dir, removed on drop, with fsync off. `Some`: a persistent dir
    /// (initdb only when it holds no `PG_VERSION`), normal durability, kept on drop. Its parent
    /// directories must be traversable by the `postgres` OS user.
    pub data_dir: Option<PathBuf>,
}

impl Default for PostgresOptions {
    fn default() -> Self {
        PostgresOptions {
            max_connections: 100,
            shared_buffers_mb: 128,
            extra_conf: Vec::new(),
            users: Vec::new(),
            port: None,
            data_dir: None,
        }
    }
}

impl PostgresOptions {
    fn validate(&self) -> Result<(), TestkitError> {
        for line in &self.extra_conf {
            check_single_line("extra_conf line", line)?;
        }
        for user in &self.users {
            check_plain("user name", &user.name)?;
            if let Some(password) = &user.password {
                check_single_line("password", password)?;
            }
            if user.auth != AuthMethod::Trust && user.password.is_none() {
                let name = &user.name;
                let message = format!("user {name} needs a password for {:?}", user.auth);
                return Err(TestkitError::InvalidOption(message));
            }
        }
        Ok(())
    }
}

/// A running (or stopped) PostgreSQL cluster. Dropping it stops the server immediately and,
/// for throwaway clusters, removes the data directory.
#[derive(Debug)]
pub struct Postgres {
    port: u16,
    data_dir: PathBuf,
    log_file: PathBuf,
    /// Holds the Unix socket (and, for throwaway clusters, `data/`); removed on drop.
    runtime_dir: TempDir,
    running: bool,
}

impl Postgres {
    /// Starts a throwaway cluster with default options.
    pub fn start() -> Result<Postgres, TestkitError> {
        Postgres::start_with(PostgresOptions::default())
    }

    /// Initialises (when needed) and starts a cluster, then creates `options.users`.
    pub fn start_with(options: PostgresOptions) -> Result<Postgres, TestkitError> {
        options.validate()?;
        let runtime_dir = make_runtime_dir("bypass-pg-")?;
        let durable = options.data_dir.is_some();
        let data_dir = match &options.data_dir {
            None => runtime_dir.path().join("data"),
            Some(dir) => prepare_persistent_dir(dir)?,
        };
        if !data_dir.join("PG_VERSION").exists() {
            initdb(&data_dir, durable)?;
        }
        ensure_settings_included(&data_dir)?;
        write_server_file(&data_dir.join("pg_hba.conf"), &pgconf::render_hba(&options.users))?;
        let mut postgres = Postgres {
            port: options.port.unwrap_or_else(free_port),
            log_file: data_dir.join(LOG_FILE),
            data_dir,
            runtime_dir,
            running: false,
        };
        // From here on, Drop cleans up whatever a failing step leaves behind.
        postgres.start_first_time(&options)?;
        for user in &options.users {
            postgres.create_role(user)?;
        }
        Ok(postgres)
    }

    /// Writes the settings and starts the server, moving to a fresh port when the automatic one
    /// was taken by another process in the meantime.
    fn start_first_time(&mut self, options: &PostgresOptions) -> Result<(), TestkitError> {
        let mut attempt = 1;
        loop {
            self.write_settings(options)?;
            match self.pg_ctl_start() {
                Ok(()) => return Ok(()),
                Err(error) if options.port.is_some() || attempt >= START_ATTEMPTS_MAX => return Err(error),
                Err(_) => {
                    attempt += 1;
                    self.port = free_port();
                }
            }
        }
    }

    fn write_settings(&self, options: &PostgresOptions) -> Result<(), TestkitError> {
        let settings = ServerSettings {
            port: self.port,
            socket_dir: self.runtime_dir.path(),
            max_connections: options.max_connections,
            shared_buffers_mb: options.shared_buffers_mb,
            durable: options.data_dir.is_some(),
            extra_conf: &options.extra_conf,
        };
        let path = self.data_dir.join(SETTINGS_FILE);
        write_server_file(&path, &pgconf::render_settings(&settings))
    }

    /// `pg_ctl start -w`; on failure the error quotes the server log and the server is stopped
    /// in case it came up after pg_ctl gave up waiting.
    fn pg_ctl_start(&mut self) -> Result<(), TestkitError> {
        let mut command = self.pg_ctl()?;
        command.arg("-l").arg(&self.log_file);
        command.args(["-w", "-t", PG_CTL_TIMEOUT_S, "start"]);
        match process::run(&mut command) {
            Ok(_) => {
                self.running = true;
                Ok(())
            }
            Err(error) => {
                self.running = true;
                self.kill();
                Err(TestkitError::Startup {
                    what: format!("PostgreSQL on port {}", self.port),
                    detail: error.to_string(),
                    log_tail: process::log_tail(&self.log_file, LOG_TAIL_BYTES),
                })
            }
        }
    }

    /// `pg_ctl -D <data_dir>` as the server user.
    fn pg_ctl(&self) -> Result<Command, TestkitError> {
        let mut command = server_command(pg_bin("pg_ctl"))?;
        command.arg("-D").arg(&self.data_dir);
        Ok(command)
    }

    fn create_role(&self, user: &TestUser) -> Result<(), TestkitError> {
        let name = quote_literal(&user.name);
        let count = self.psql(&format!("select count(*) from pg_roles where rolname = {name}"))?;
        self.psql(&pgconf::role_sql(user, count == "1"))?;
        Ok(())
    }

    /// The TCP port the server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The address the server listens on: always `127.0.0.1`.
    pub fn host(&self) -> &str {
        HOST
    }

    /// The cluster's data directory.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The server log written by `pg_ctl -l` (inside the data directory).
    pub fn log_file(&self) -> &Path {
        &self.log_file
    }

    /// Whether the server was started and not stopped or killed through this handle since.
    pub fn is_running(&self) -> bool {
        self.running
    }

    /// A libpq key/value connection string: `host=127.0.0.1 port=N user=U dbname=D`.
    pub fn connection_string(&self, user: &str, dbname: &str) -> String {
        format!("host={HOST} port={} user={user} dbname={dbname}", self.port)
    }

    /// Runs `sql` as the superuser in database `postgres` with unaligned, tuples-only output and
    /// returns trimmed stdout. Errors carry psql's stderr.
    pub fn psql(&self, sql: &str) -> Result<String, TestkitError> {
        let mut command = Command::new(pg_bin("psql"));
        command
            .args(["-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-h", HOST])
            .args(["-p", &self.port.to_string(), "-U", SUPERUSER, "-d", "postgres"])
            .args(["-c", sql])
            .env("PGCONNECT_TIMEOUT", "10")
            .env("LC_ALL", "C")
            .env_remove("PGOPTIONS")
            .env_remove("PGSERVICE");
        let output = process::run(&mut command)?;
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
    }

    /// Stops the server with `pg_ctl stop -m fast`; does nothing when it is not running.
    pub fn stop(&mut self) -> Result<(), TestkitError> {
        if !self.running {
            return Ok(());
        }
        if !self.data_dir.join("postmaster.pid").exists() {
            // Gone already (crashed or stopped behind our back).
            self.running = false;
            return Ok(());
        }
        let mut command = self.pg_ctl()?;
        command.args(["-w", "-t", PG_CTL_TIMEOUT_S, "-m", "fast", "stop"]);
        process::run(&mut command)?;
        self.running = false;
        Ok(())
    }

    /// Stops the server with `pg_ctl stop -m immediate`, as if the whole server crashed (the next
    /// start runs crash recovery). Falls back to SIGKILL of the postmaster. Never panics.
    pub fn kill(&mut self) {
        if !self.running {
            return;
        }
        self.running = false;
        let stopped = self.pg_ctl().and_then(|mut command| {
            command.args(["-w", "-t", PG_CTL_TIMEOUT_S, "-m", "immediate", "stop"]);
            process::run(&mut command)
        });
        if stopped.is_err() {
            kill_postmaster(&self.data_dir);
        }
    }

    /// Starts a stopped or killed cluster again on the same port and data directory; does
    /// nothing when it is running.
    pub fn start_again(&mut self) -> Result<(), TestkitError> {
        if self.running {
            return Ok(());
        }
        self.pg_ctl_start()
    }

    /// Pids of client backends (not background workers), excluding the query's own.
    pub fn backend_pids(&self) -> Result<Vec<i32>, TestkitError> {
        let output = self.psql(
            "select pid from pg_stat_activity \
             where backend_type = 'client backend' and pid <> pg_backend_pid() order by pid",
        )?;
        output
            .lines()
            .map(|line| {
                line.trim().parse::<i32>().map_err(|e| {
                    let context = format!("parsing backend pid {line:?}");
                    TestkitError::io(context, std::io::Error::other(e))
                })
            })
            .collect()
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        // kill() never panics; the TempDir field removes the directory after this body.
        self.kill();
    }
}

/// A fresh temp dir owned by the server user (it holds Unix sockets and maybe `data/`).
pub(crate) fn make_runtime_dir(prefix: &str) -> Result<TempDir, TestkitError> {
    let dir =
        tempfile::Builder::new().prefix(prefix).tempdir().map_err(|e| TestkitError::io("creating a temp dir", e))?;
    chown_to_server_user(dir.path())?;
    Ok(dir)
}

/// Creates a persistent data dir when missing and, if it holds no cluster yet, gives it to the
/// server user with mode 0700. Returns it as an absolute path.
fn prepare_persistent_dir(dir: &Path) -> Result<PathBuf, TestkitError> {
    std::fs::create_dir_all(dir).map_err(|e| TestkitError::io(format!("creating {}", dir.display()), e))?;
    let dir = dir.canonicalize().map_err(|e| TestkitError::io(format!("resolving {}", dir.display()), e))?;
    if !dir.join("PG_VERSION").exists() {
        use std::os::unix::fs::PermissionsExt;
        chown_to_server_user(&dir)?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| TestkitError::io(format!("chmod 700 {}", dir.display()), e))?;
    }
    Ok(dir)
}

/// `initdb` with the superuser `postgres`, UTF8, C locale and trust auth (pg_hba.conf is
/// rewritten right after). Throwaway clusters skip the final fsync.
fn initdb(data_dir: &Path, durable: bool) -> Result<(), TestkitError> {
    let mut command = server_command(pg_bin("initdb"))?;
    command.arg("-D").arg(data_dir);
    command.args(["-U", SUPERUSER, "-E", "UTF8", "--locale=C", "-A", "trust"]);
    if !durable {
        command.arg("--no-sync");
    }
    process::run(&mut command)?;
    Ok(())
}

/// Appends the include of `testkit.conf` to `postgresql.conf` unless it is already there.
fn ensure_settings_included(data_dir: &Path) -> Result<(), TestkitError> {
    let path = data_dir.join("postgresql.conf");
    let text =
        std::fs::read_to_string(&path).map_err(|e| TestkitError::io(format!("reading {}", path.display()), e))?;
    if text.lines().any(|line| line.trim() == INCLUDE_LINE) {
        return Ok(());
    }
    write_server_file(&path, &format!("{text}\n{INCLUDE_LINE}\n"))
}

/// Last resort when `pg_ctl stop` failed: SIGKILL the pid in `postmaster.pid`, if any.
fn kill_postmaster(data_dir: &Path) {
    let Ok(text) = std::fs::read_to_string(data_dir.join("postmaster.pid")) else {
        return;
    };
    let Some(pid) = text.lines().next().and_then(|l| l.trim().parse::<i32>().ok()) else {
        return;
    };
    // A stale lock file may name a pid that now belongs to someone else: only signal a
    // process that is still a postgres.
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    if pid > 1 && comm.trim() == "postgres" {
        // SAFETY: kill has no memory-safety preconditions; the pid comes from the cluster's own
        // lock file, is > 1 (never a process group or init) and names a postgres process.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
        }
    }
}
