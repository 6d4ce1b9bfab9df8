//! Starting and stopping what sits between pgbench and PostgreSQL for one run.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bypass_testkit::process::{log_tail, port_accepts};
use bypass_testkit::{free_port, PgBouncer, PgBouncerOptions};
use tempfile::TempDir;

use super::Contender;

/// Every pooler admits this many clients, above the largest client count we run.
pub const MAX_CLIENT_CONN: u32 = 11_000;

/// How long the bypass binary may take to listen.
const BYPASS_READY_TIMEOUT: Duration = Duration::from_secs(15);

/// How long bypass gets to exit after SIGINT before SIGKILL.
const BYPASS_STOP_GRACE: Duration = Duration::from_secs(5);

/// Bytes of the bypass log quoted in a start-up error.
const LOG_TAIL_BYTES: usize = 2_048;

const HOST: &str = "127.0.0.1";

/// A running contender; dropping it stops the pooler (if any).
pub struct Target {
    /// Where pgbench connects.
    pub port: u16,
    /// The pooler's processes, for CPU accounting; empty for direct PostgreSQL.
    pub pooler_pids: Vec<u32>,
    /// Held only so that dropping the target stops the pooler.
    _pgbouncer: Option<PgBouncer>,
    _bypass: Option<BypassProcess>,
}

/// Starts `contender` in front of PostgreSQL on `backend_port`.
pub fn start(contender: Contender, backend_port: u16, pool_size: u32, bypass_exe: &Path) -> Result<Target> {
    match contender {
        Contender::Direct => {
            Ok(Target { port: backend_port, pooler_pids: Vec::new(), _pgbouncer: None, _bypass: None })
        }
        Contender::Pgbouncer | Contender::Pgbouncer2 => {
            let processes = if contender == Contender::Pgbouncer2 { 2 } else { 1 };
            let bouncer = PgBouncer::start(PgBouncerOptions {
                backend_port,
                pool_mode: "transaction".to_string(),
                pool_size,
                max_client_conn: MAX_CLIENT_CONN,
                processes,
                auth_type: "trust".to_string(),
                ..PgBouncerOptions::default()
            })
            .with_context(|| format!("starting {}", contender.label()))?;
            let pooler_pids = bouncer.pids();
            Ok(Target { port: bouncer.port(), pooler_pids, _pgbouncer: Some(bouncer), _bypass: None })
        }
        Contender::Bypass
        | Contender::Bypass2
        | Contender::BypassKernel
        | Contender::BypassKernelQueue
        | Contender::BypassMirror
        | Contender::BypassKernelMirror => {
            let bypass = BypassProcess::start(bypass_exe, backend_port, pool_size, contender)?;
            let (port, pooler_pids) = (bypass.port, vec![bypass.child.id()]);
            Ok(Target { port, pooler_pids, _pgbouncer: None, _bypass: Some(bypass) })
        }
    }
}

/// The database every workload runs in, as pgbench names it.
pub const DATABASE: &str = "postgres";

/// The database that receives a copy of every query of [`DATABASE`] when mirroring; created
/// with the same tables.
pub const SHADOW_DATABASE: &str = "shadow";

/// The configuration the bypass binary runs with: the same pool shape as PgBouncer's. A
/// mirroring contender names the two databases, the primary one with `mirror` pointing at the
/// shadow; the others accept any database through the `"*"` entry.
pub fn render_bypass_config(listen_port: u16, backend_port: u16, pool_size: u32, contender: Contender) -> String {
    let fast_path = if contender.is_kernel() { "kernel" } else { "user" };
    // User-space contenders get the thread count of the PgBouncer they are compared with; the
    // kernel fast path keeps the default (one per core: its user space only logs in and hands off).
    let workers = match contender {
        Contender::Bypass2 => "workers = 2\n",
        _ if contender.is_kernel() => "",
        _ => "workers = 1\n",
    };
    let queue = if contender == Contender::BypassKernelQueue { "fast_path_queue_behind = true\n" } else { "" };
    let databases = if contender.mirrors() {
        format!(
            "[databases.{DATABASE}]\n\
             host = \"{HOST}\"\n\
             port = {backend_port}\n\
             mirror = \"{SHADOW_DATABASE}\"\n\
             \n\
             [databases.{SHADOW_DATABASE}]\n\
             host = \"{HOST}\"\n\
             port = {backend_port}\n"
        )
    } else {
        format!("[databases.\"*\"]\nhost = \"{HOST}\"\nport = {backend_port}\n")
    };
    format!(
        "[pooler]\n\
         listen_addr = \"{HOST}:{listen_port}\"\n\
         pool_mode = \"transaction\"\n\
         auth_type = \"trust\"\n\
         max_client_conn = {MAX_CLIENT_CONN}\n\
         default_pool_size = {pool_size}\n\
         listen_backlog = 4096\n\
         fast_path = \"{fast_path}\"\n\
         {queue}\
         {workers}\
         \n\
         {databases}"
    )
}

/// `bypass proxy --config FILE` as a child; SIGINT (then SIGKILL) on drop.
struct BypassProcess {
    child: Child,
    port: u16,
    log: PathBuf,
    /// Holds the config and the log; removed after the child is gone.
    _dir: TempDir,
}

impl BypassProcess {
    fn start(exe: &Path, backend_port: u16, pool_size: u32, contender: Contender) -> Result<BypassProcess> {
        let dir = tempfile::Builder::new().prefix("bypass-bench-proxy-").tempdir().context("creating a temp dir")?;
        let port = free_port();
        let config = dir.path().join("bypass.toml");
        std::fs::write(&config, render_bypass_config(port, backend_port, pool_size, contender))
            .with_context(|| format!("writing {}", config.display()))?;
        let log = dir.path().join("bypass.log");
        let log_file = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let log_file_err = log_file.try_clone().context("duplicating the log handle")?;
        let child = Command::new(exe)
            .args(["proxy", "--config"])
            .arg(&config)
            .env("BYPASS_LOG", "info")
            // A start-up error must end the log with its message, not a backtrace that pushes
            // the message out of the quoted tail.
            .env("RUST_BACKTRACE", "0")
            .env("RUST_LIB_BACKTRACE", "0")
            .stdin(Stdio::null())
            .stdout(log_file)
            .stderr(log_file_err)
            .spawn()
            .with_context(|| format!("spawning {}", exe.display()))?;
        let mut bypass = BypassProcess { child, port, log, _dir: dir };
        bypass.wait_ready()?;
        Ok(bypass)
    }

    /// Waits until the port accepts TCP; fails early when the child exits.
    fn wait_ready(&mut self) -> Result<()> {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().context("waiting for bypass")? {
                bail!("bypass exited during start-up ({status}); log:\n{}", log_tail(&self.log, LOG_TAIL_BYTES));
            }
            if port_accepts(HOST, self.port) {
                return Ok(());
            }
            if started.elapsed() > BYPASS_READY_TIMEOUT {
                let waited = BYPASS_READY_TIMEOUT.as_secs();
                bail!("bypass not listening after {waited} s; log:\n{}", log_tail(&self.log, LOG_TAIL_BYTES));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for BypassProcess {
    fn drop(&mut self) {
        if let Ok(pid) = libc::pid_t::try_from(self.child.id()) {
            // SAFETY: kill has no memory-safety preconditions; the pid is our own unreaped child,
            // so it cannot name another process.
            unsafe {
                libc::kill(pid, libc::SIGINT);
            }
        }
        let deadline = Instant::now() + BYPASS_STOP_GRACE;
        while Instant::now() < deadline && matches!(self.child.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(20));
        }
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: bypass gets the same pool shape as PgBouncer; method: render and check the lines.
    #[test]
    fn bypass_config_matches_pgbouncer_shape() {
        let text = render_bypass_config(7000, 5555, 20, Contender::Bypass);
        for line in [
            "listen_addr = \"127.0.0.1:7000\"",
            "pool_mode = \"transaction\"",
            "auth_type = \"trust\"",
            "max_client_conn = 11000",
            "default_pool_size = 20",
            "[databases.\"*\"]",
            "port = 5555",
            "fast_path = \"user\"",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
        assert!(!text.contains("mirror"), "{text}");
        assert!(text.lines().any(|l| l == "workers = 1"), "one thread, as one PgBouncer process:\n{text}");
        let two = render_bypass_config(7000, 5555, 20, Contender::Bypass2);
        assert!(two.lines().any(|l| l == "workers = 2"), "two threads, as PgBouncer ×2:\n{two}");
        let kernel = render_bypass_config(7000, 5555, 20, Contender::BypassKernel);
        assert!(kernel.lines().any(|l| l == "fast_path = \"kernel\""), "{kernel}");
    }

    // Goal: the pooler's own loader accepts what the bench writes, so a renamed setting fails
    // here and not in the middle of a benchmark; the mirrored configs may be refused only for
    // `mirror` itself (the pooler learns it in parallel); method: write each config to a file
    // and run `bypass_pooler::Config::load` on it.
    #[test]
    fn pooler_accepts_the_generated_configs() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("bypass.toml");
        for contender in [Contender::Bypass, Contender::Bypass2, Contender::BypassKernel] {
            std::fs::write(&path, render_bypass_config(7000, 5555, 20, contender)).expect("write");
            if let Err(error) = bypass_pooler::Config::load(&path) {
                panic!("{contender:?}: the pooler refuses the bench's config: {error}");
            }
        }
        for contender in [Contender::BypassMirror, Contender::BypassKernelMirror] {
            std::fs::write(&path, render_bypass_config(7000, 5555, 20, contender)).expect("write");
            if let Err(error) = bypass_pooler::Config::load(&path) {
                let text = format!("{error}: {:?}", std::error::Error::source(&error).map(|e| e.to_string()));
                assert!(text.contains("mirror"), "{contender:?} refused for something other than `mirror`: {text}");
            }
        }
    }

    // Goal: a mirroring contender mirrors `postgres` into `shadow` on the same server, in the
    // right fast-path mode, and the config is valid TOML with the mirror inside the primary's
    // entry only; method: render for both mirroring contenders and parse the TOML.
    #[test]
    fn mirror_config_names_the_shadow_database() {
        for (contender, mode) in [(Contender::BypassMirror, "user"), (Contender::BypassKernelMirror, "kernel")] {
            let text = render_bypass_config(7000, 5555, 20, contender);
            let parsed: toml::Table = text.parse().expect("valid TOML");
            assert_eq!(parsed["pooler"]["fast_path"].as_str(), Some(mode), "{text}");
            let databases = parsed["databases"].as_table().expect("databases table");
            assert_eq!(databases.keys().collect::<Vec<_>>(), vec!["postgres", "shadow"], "{text}");
            assert_eq!(databases["postgres"]["mirror"].as_str(), Some("shadow"));
            assert_eq!(databases["postgres"]["port"].as_integer(), Some(5555));
            assert_eq!(databases["shadow"]["port"].as_integer(), Some(5555));
            assert!(databases["shadow"].get("mirror").is_none(), "the shadow must not mirror again");
        }
    }
}
