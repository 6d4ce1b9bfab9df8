//! Network namespaces: entering one from a thread, and running commands inside one.
//!
//! A network namespace belongs to a *thread* in Linux, so one process can hold a client, the
//! dispatcher and both agents at once: each runs on threads that entered its host's namespace
//! before creating any socket. Sockets keep the namespace they were created in, whichever thread
//! uses them later.

use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::thread::JoinHandle;

use crate::error::{DispatchError, Result};

/// Where `ip netns add` bind-mounts named namespaces.
pub const NETNS_DIR: &str = "/run/netns";

/// The file of a named namespace.
pub fn path(name: &str) -> PathBuf {
    PathBuf::from(NETNS_DIR).join(name)
}

/// Whether a named namespace exists.
pub fn exists(name: &str) -> bool {
    path(name).exists()
}

/// Moves the calling thread into the named network namespace. Sockets it creates from now on
/// live there; other threads are not affected.
pub fn enter(name: &str) -> Result<()> {
    let file = std::fs::File::open(path(name))
        .map_err(|e| DispatchError::io(format!("opening network namespace {name}"), e))?;
    // SAFETY: setns only reads the descriptor, which `file` keeps open across the call.
    let status = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    if status != 0 {
        return Err(DispatchError::last_os(format!("entering network namespace {name}")));
    }
    Ok(())
}

/// Runs `work` on a new thread inside the named namespace.
pub fn spawn_in<T, F>(namespace: &str, thread_name: &str, work: F) -> Result<JoinHandle<Result<T>>>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T> + Send + 'static,
{
    let namespace = namespace.to_string();
    std::thread::Builder::new()
        .name(thread_name.to_string())
        .spawn(move || {
            enter(&namespace)?;
            work()
        })
        .map_err(|e| DispatchError::io(format!("spawning thread {thread_name}"), e))
}

/// Runs `work` inside the named namespace and waits for it.
pub fn run_in<T, F>(namespace: &str, work: F) -> Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T> + Send + 'static,
{
    let handle = spawn_in(namespace, "netns-run", work)?;
    handle.join().map_err(|_| DispatchError::Lab(format!("a thread in namespace {namespace} panicked")))?
}

/// `ip netns exec <namespace> <program>`: a command that runs inside the namespace.
pub fn command_in(namespace: &str, program: &str) -> Command {
    let mut command = Command::new("ip");
    command.args(["netns", "exec", namespace, program]);
    command
}

/// Runs a command to completion; a non-zero exit becomes an error carrying its stderr.
pub fn run(command: &mut Command) -> Result<Output> {
    let shown = describe(command);
    let output = command.output().map_err(|e| DispatchError::io(format!("spawning `{shown}`"), e))?;
    if output.status.success() {
        return Ok(output);
    }
    Err(DispatchError::Command {
        command: shown,
        status: output.status,
        stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
    })
}

/// Runs `program args…` to completion.
pub fn run_args(program: &str, args: &[&str]) -> Result<Output> {
    run(Command::new(program).args(args))
}

/// `program arg1 arg2 …` for error messages.
pub fn describe(command: &Command) -> String {
    let mut parts = vec![command.get_program().to_string_lossy().into_owned()];
    parts.extend(command.get_args().map(|a| a.to_string_lossy().into_owned()));
    parts.join(" ")
}
