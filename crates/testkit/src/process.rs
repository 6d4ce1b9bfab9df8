//! Running server binaries as the `postgres` OS user.
//!
//! `initdb`, `postgres` and `pgbouncer` refuse to run as root. When the test process is root,
//! commands built here switch to the `postgres` user with `setgid`/`setuid` in the child (std's
//! `CommandExt::uid`/`gid`, which also drops supplementary groups), so the spawned pid *is* the
//! server's pid: no `runuser` or `sh` wrapper sits in between. The child also gets its soft
//! file-descriptor limit raised to the hard limit (capped), because a pooler benchmark opens
//! thousands of sockets and the usual soft limit is 1024.

use std::ffi::OsStr;
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use crate::TestkitError;

/// The OS user that owns every server process and data directory when we run as root.
pub const SERVER_OS_USER: &str = "postgres";

/// Upper bound for the raised soft `RLIMIT_NOFILE` of spawned servers.
const FD_LIMIT_MAX: libc::rlim_t = 65_536;

/// How often [`wait_for_port`] retries a connection.
const PORT_POLL_INTERVAL: Duration = Duration::from_millis(50);

/// Numeric identity of an OS user.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OsUser {
    pub uid: u32,
    pub gid: u32,
}

/// Whether the current process runs with effective uid 0.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// The user servers must run as: `Some(postgres)` when we are root, `None` (run as ourselves)
/// otherwise.
pub fn server_user() -> Result<Option<OsUser>, TestkitError> {
    if !is_root() {
        return Ok(None);
    }
    lookup_user(SERVER_OS_USER).map(Some)
}

/// Looks a user up in `/etc/passwd` (the only user database on the machines we test on).
pub fn lookup_user(name: &str) -> Result<OsUser, TestkitError> {
    let passwd = std::fs::read_to_string("/etc/passwd").map_err(|e| TestkitError::io("reading /etc/passwd", e))?;
    passwd
        .lines()
        .find_map(|line| parse_passwd_line(line, name))
        .ok_or_else(|| TestkitError::UserNotFound(name.to_string()))
}

/// Parses `name:x:uid:gid:...` and returns the ids when the name matches.
fn parse_passwd_line(line: &str, name: &str) -> Option<OsUser> {
    let mut fields = line.split(':');
    if fields.next()? != name {
        return None;
    }
    let _password = fields.next()?;
    let uid = fields.next()?.parse().ok()?;
    let gid = fields.next()?.parse().ok()?;
    Some(OsUser { uid, gid })
}

/// Gives `path` to the server user when we are root; does nothing otherwise.
pub fn chown_to_server_user(path: &Path) -> Result<(), TestkitError> {
    let Some(user) = server_user()? else {
        return Ok(());
    };
    std::os::unix::fs::chown(path, Some(user.uid), Some(user.gid))
        .map_err(|e| TestkitError::io(format!("chown {} to {SERVER_OS_USER}", path.display()), e))
}

/// Writes `contents` to `path` and gives the file to the server user.
pub fn write_server_file(path: &Path, contents: &str) -> Result<(), TestkitError> {
    std::fs::write(path, contents).map_err(|e| TestkitError::io(format!("writing {}", path.display()), e))?;
    chown_to_server_user(path)
}

/// A command for `program` that runs as the server user (when root), in `/`, with the C locale
/// and a raised file-descriptor limit.
pub fn server_command(program: impl AsRef<OsStr>) -> Result<Command, TestkitError> {
    let mut command = Command::new(program);
    // `/` is readable by everyone; the caller's cwd may not be, and initdb calls getcwd().
    command.current_dir("/").env("LC_ALL", "C");
    if let Some(user) = server_user()? {
        command.uid(user.uid).gid(user.gid);
    }
    raise_fd_limit_in_child(&mut command);
    Ok(command)
}

/// Makes the child set its soft `RLIMIT_NOFILE` to `min(hard, FD_LIMIT_MAX)` before exec.
fn raise_fd_limit_in_child(command: &mut Command) {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit only writes into the struct we pass, which lives across the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return;
    }
    let wanted = libc::rlimit { rlim_cur: limit.rlim_max.min(FD_LIMIT_MAX), rlim_max: limit.rlim_max };
    // SAFETY: the closure runs between fork and exec and calls only setrlimit, which is
    // async-signal-safe; it captures a plain struct by value and allocates nothing. Failure is
    // ignored on purpose: the server still works with the lower limit.
    unsafe {
        command.pre_exec(move || {
            libc::setrlimit(libc::RLIMIT_NOFILE, &wanted);
            Ok(())
        });
    }
}

/// Runs `command` to completion and returns its output, or an error carrying its stderr when it
/// exits unsuccessfully.
pub fn run(command: &mut Command) -> Result<Output, TestkitError> {
    let shown = describe(command);
    let output = command.output().map_err(|e| TestkitError::io(format!("spawning `{shown}`"), e))?;
    if output.status.success() {
        return Ok(output);
    }
    Err(TestkitError::Command {
        command: shown,
        status: output.status,
        stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
    })
}

/// `program arg1 arg2 ...` for error messages.
pub fn describe(command: &Command) -> String {
    let mut parts = vec![command.get_program().to_string_lossy().into_owned()];
    parts.extend(command.get_args().map(|a| a.to_string_lossy().into_owned()));
    parts.join(" ")
}

/// Whether something accepts TCP connections on `host:port` right now.
pub fn port_accepts(host: &str, port: u16) -> bool {
    let Ok(ip) = host.parse() else {
        return false;
    };
    let address = SocketAddr::new(ip, port);
    TcpStream::connect_timeout(&address, Duration::from_millis(500)).is_ok()
}

/// Polls until `host:port` accepts TCP connections, or fails after `timeout`.
pub fn wait_for_port(host: &str, port: u16, timeout: Duration) -> Result<(), TestkitError> {
    wait_until(timeout, &format!("{host}:{port} to accept"), || port_accepts(host, port))
}

/// Polls `ready` every [`PORT_POLL_INTERVAL`] until it returns true or `timeout` passes.
pub fn wait_until(timeout: Duration, what: &str, mut ready: impl FnMut() -> bool) -> Result<(), TestkitError> {
    let started = Instant::now();
    loop {
        if ready() {
            return Ok(());
        }
        if started.elapsed() >= timeout {
            return Err(TestkitError::Timeout {
                what: what.to_string(),
                waited_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
            });
        }
        std::thread::sleep(PORT_POLL_INTERVAL);
    }
}

/// The last `max_bytes` of a log file (starting at a line boundary), or a note why it is missing.
pub fn log_tail(path: &Path, max_bytes: usize) -> String {
    match std::fs::read(path) {
        Ok(bytes) => {
            let start = bytes.len().saturating_sub(max_bytes);
            let tail = String::from_utf8_lossy(&bytes[start..]);
            match (start, tail.find('\n')) {
                (0, _) | (_, None) => tail.into_owned(),
                (_, Some(newline)) => tail[newline + 1..].to_string(),
            }
        }
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: /etc/passwd parsing picks the right line and ids; method: feed literal lines.
    #[test]
    fn parses_passwd_lines() {
        let line = "postgres:x:101:104:PostgreSQL administrator,,,:/var/lib/postgresql:/bin/bash";
        assert_eq!(parse_passwd_line(line, "postgres"), Some(OsUser { uid: 101, gid: 104 }));
        assert_eq!(parse_passwd_line(line, "postgre"), None);
        assert_eq!(parse_passwd_line("postgres:x:abc:1", "postgres"), None);
    }

    // Goal: log_tail keeps whole lines from the end; method: write a file and read a short tail.
    #[test]
    fn log_tail_starts_at_line_boundary() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("log");
        std::fs::write(&path, "first line\nsecond line\nthird\n").expect("write log");
        assert_eq!(log_tail(&path, 14), "third\n");
        assert_eq!(log_tail(&path, 1000), "first line\nsecond line\nthird\n");
        assert!(log_tail(&dir.path().join("missing"), 10).contains("cannot read"));
    }
}
