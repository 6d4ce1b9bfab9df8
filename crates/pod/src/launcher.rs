//! The launcher: creates the region, forks one process per host (each maps the region again at
//! its own address), drives the run phases, watches for dead hosts, and collects counters.
//!
//! ```text
//!  Pod::create ─ memfd + header        Pod::start ─ logs: clear | recovery cut ─ fork × hosts
//!  wait_ready ─ Warmup ─ (warmup_ms) ─ Measure ─ (measure_ms, then until measure_acked_min) ─ Stop
//!  ─ wait_finished ─ report
//! ```
//!
//! Forking from a multi-threaded parent (the test harness) is safe here because the child only
//! maps memory, allocates (glibc's malloc is fork-safe), spawns its logger thread and finally
//! `_exit`s; it never touches locks other parent threads may hold. `PR_SET_PDEATHSIG` makes every
//! host die with its launcher, and `Drop` kills and reaps whatever is left.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::config::{PodConfig, Protocol};
use crate::error::{PodError, Result};
use crate::host::layout_for;
use crate::recovery::RecoveryPlan;
use crate::region::{Layout, Phase, Region, HOSTS_MAX};
use crate::stats::{Counters, LatencyTable};

/// Longest a host may take to load its partition.
pub const LOAD_WAIT_MAX: Duration = Duration::from_secs(600);
/// Longest hosts may take from Stop to exit (finishing transactions, barrier, checks).
pub const FINISH_WAIT_MAX: Duration = Duration::from_secs(120);
/// Longest the measured window may be extended to reach `measure_acked_min` (a hang guard: a
/// protocol that stops committing ends the run and the test's own assertions report it).
pub const MEASURE_EXTENSION_MAX: Duration = Duration::from_secs(90);

struct Child {
    host: usize,
    pid: libc::pid_t,
    status: Option<libc::c_int>,
}

pub struct Pod {
    config: Arc<PodConfig>,
    layout: Layout,
    region: Region,
    children: Vec<Child>,
    recovery: Option<RecoveryPlan>,
    /// When a recovering start began, and how long until every host was ready (logs cut,
    /// checkpoint loaded, logs replayed).
    recovery_started: Option<Instant>,
    recovery_ms: Option<u64>,
}

/// What a run measured: per host and in total, measured and modelled.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    pub protocol: Protocol,
    pub workload: String,
    pub hosts: usize,
    pub swcc: crate::coherence::SwccProtocol,
    pub backend: crate::coherence::CoherenceBackend,
    pub hwcc_budget_bytes: u64,
    pub shortcut: bool,
    pub logging: bool,
    pub epoch_ms: u64,
    /// Committed transactions per second, summed over hosts' measured windows.
    pub throughput_tps: f64,
    /// The same from the latency model (CXL ≈ 300 ns per line).
    pub modelled_tps: f64,
    pub abort_rate: f64,
    pub commit_latency_p50_us: u64,
    pub commit_latency_p99_us: u64,
    pub txn_latency_p50_us: u64,
    pub txn_latency_p99_us: u64,
    pub total: Counters,
    pub per_host: Vec<Counters>,
    pub recovery: Option<RecoveryPlan>,
    /// Recovering start → every host ready to run, ms.
    pub recovery_ms: Option<u64>,
}

impl Pod {
    /// Validates the configuration and creates the shared region.
    pub fn create(config: PodConfig) -> Result<Pod> {
        config.validate()?;
        let layout = layout_for(&config);
        let region = Region::create(layout.total)?;
        region.init_header(&layout, config.index_buckets());
        Ok(Pod {
            config: Arc::new(config),
            layout,
            region,
            children: Vec::new(),
            recovery: None,
            recovery_started: None,
            recovery_ms: None,
        })
    }

    pub fn config(&self) -> &PodConfig {
        &self.config
    }

    /// Prepares the logs (fresh: removed; recover: cut and rewritten) and forks the hosts.
    pub fn start(&mut self) -> Result<Option<RecoveryPlan>> {
        if let Some(dir) = &self.config.log_dir {
            std::fs::create_dir_all(dir).map_err(|source| PodError::FileIo { path: dir.clone(), source })?;
            if self.config.recover {
                self.recovery_started = Some(Instant::now());
                let plan = crate::recovery::prepare(dir, self.config.hosts)?;
                let header = self.region.header();
                header.global_epoch.store(plan.next_epoch, Ordering::Release);
                header.recovered_epoch.store(plan.pod_durable_epoch, Ordering::Release);
                self.recovery = Some(plan);
            } else {
                for host in 0..HOSTS_MAX {
                    crate::log::remove_log(dir, host)?;
                    crate::checkpoint::remove_all(dir, host)?;
                    let _ = std::fs::remove_file(crate::log::acked_path(dir, host));
                }
            }
        }
        if let Some(dir) = &self.config.history_dir {
            std::fs::create_dir_all(dir).map_err(|source| PodError::FileIo { path: dir.clone(), source })?;
        }
        for host in 0..self.config.hosts {
            self.fork_host(host)?;
        }
        Ok(self.recovery)
    }

    fn fork_host(&mut self, host: usize) -> Result<()> {
        // SAFETY: see the module docs; the child runs only `child_main`, which never returns.
        let pid = unsafe { libc::fork() };
        match pid {
            -1 => Err(PodError::Process { what: "fork", source: std::io::Error::last_os_error() }),
            0 => child_main(host, Arc::clone(&self.config), &self.region),
            pid => {
                self.children.push(Child { host, pid, status: None });
                Ok(())
            }
        }
    }

    pub fn set_phase(&self, phase: Phase) {
        self.region.header().phase.store(phase as u64, Ordering::Release);
    }

    /// Reaps exited children; an error names the first host that failed.
    fn check_children(&mut self, expect_exit: bool) -> Result<bool> {
        let mut all_exited = true;
        for child in &mut self.children {
            if child.status.is_none() {
                let mut status = 0;
                // SAFETY: our own child's pid; WNOHANG never blocks.
                let rc = unsafe { libc::waitpid(child.pid, &mut status, libc::WNOHANG) };
                if rc == child.pid {
                    child.status = Some(status);
                }
            }
            match child.status {
                None => all_exited = false,
                Some(status) if status == 0 && expect_exit => {}
                Some(status) => {
                    let shared = self.region.host_shared(&self.layout, child.host);
                    return Err(match shared.error_text() {
                        Some(message) => PodError::HostFailed { host: child.host, message },
                        None => PodError::HostDied { host: child.host, status: describe_status(status) },
                    });
                }
            }
        }
        Ok(all_exited)
    }

    /// Waits until every host has loaded its partition.
    pub fn wait_ready(&mut self) -> Result<()> {
        let started = Instant::now();
        while self.region.header().ready_hosts.load(Ordering::Acquire) < self.config.hosts as u64 {
            self.check_children(false)?;
            if started.elapsed() > LOAD_WAIT_MAX {
                return Err(PodError::PeerTimeout { host: 0, waited_ms: LOAD_WAIT_MAX.as_millis() as u64 });
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        if let Some(started) = self.recovery_started.take() {
            self.recovery_ms = Some(started.elapsed().as_millis() as u64);
        }
        Ok(())
    }

    /// Sleeps `duration` while watching the hosts.
    pub fn watch(&mut self, duration: Duration) -> Result<()> {
        let until = Instant::now() + duration;
        while Instant::now() < until {
            self.check_children(false)?;
            std::thread::sleep(Duration::from_millis(5).min(until.saturating_duration_since(Instant::now())));
        }
        Ok(())
    }

    /// Waits for every host to exit cleanly.
    pub fn wait_finished(&mut self) -> Result<()> {
        let started = Instant::now();
        while !self.check_children(true)? {
            if started.elapsed() > FINISH_WAIT_MAX {
                return Err(PodError::PeerTimeout { host: 0, waited_ms: FINISH_WAIT_MAX.as_millis() as u64 });
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        Ok(())
    }

    /// Warm-up, measurement, stop, exit: the whole run after `start`.
    pub fn drive(&mut self) -> Result<RunReport> {
        self.wait_ready()?;
        if self.config.warmup_ms == 0 && self.config.measure_ms == 0 {
            // Nothing to run (a recovery check): hosts go straight to their post-run checks.
            self.set_phase(Phase::Stop);
            self.wait_finished()?;
            return Ok(self.report());
        }
        self.set_phase(Phase::Warmup);
        self.watch(Duration::from_millis(self.config.warmup_ms))?;
        let acked_before = self.acked_total();
        self.set_phase(Phase::Measure);
        self.watch(Duration::from_millis(self.config.measure_ms))?;
        let extended = Instant::now();
        while self.acked_total() - acked_before < self.config.measure_acked_min
            && extended.elapsed() < MEASURE_EXTENSION_MAX
        {
            self.watch(Duration::from_millis(10))?;
        }
        self.set_phase(Phase::Stop);
        self.wait_finished()?;
        Ok(self.report())
    }

    /// Creates, starts and drives a pod.
    pub fn run(config: PodConfig) -> Result<RunReport> {
        let mut pod = Pod::create(config)?;
        pod.start()?;
        pod.drive()
    }

    /// SIGKILLs one host (a crash), and reaps it.
    pub fn kill(&mut self, host: usize) {
        for child in self.children.iter_mut().filter(|child| child.host == host && child.status.is_none()) {
            // SAFETY: signalling and reaping our own child.
            unsafe {
                libc::kill(child.pid, libc::SIGKILL);
                let mut status = 0;
                libc::waitpid(child.pid, &mut status, 0);
                child.status = Some(status);
            }
        }
    }

    pub fn kill_all(&mut self) {
        for host in 0..self.config.hosts {
            self.kill(host);
        }
    }

    /// Waits until some host has died (crash tests); returns which.
    pub fn wait_for_death(&mut self, timeout: Duration) -> Option<usize> {
        let started = Instant::now();
        while started.elapsed() < timeout {
            if let Err(PodError::HostDied { host, .. } | PodError::HostFailed { host, .. }) = self.check_children(false)
            {
                return Some(host);
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        None
    }

    /// Transactions `host` had acknowledged (readable after it died: the region outlives it).
    pub fn acked(&self, host: usize) -> u64 {
        self.region.host_shared(&self.layout, host).acked_txns.load(Ordering::Acquire)
    }

    /// Transactions all hosts acknowledged so far (monotonic: each host only adds).
    fn acked_total(&self) -> u64 {
        (0..self.config.hosts).map(|host| self.acked(host)).sum()
    }

    /// Puts `payload` into `to`'s inbox as if host `from` had sent it (abuse tests); false while
    /// the inbox is full.
    pub fn inject(&self, to: usize, from: usize, payload: &[u8]) -> Result<bool> {
        let mut transport = crate::ring::Transport::new(self.layout, from);
        let mut swcc = crate::coherence::Swcc::new(crate::coherence::CoherenceBackend::Noop.build(0));
        transport.try_send(&self.region, &mut swcc, to, payload)
    }

    pub fn host_error(&self, host: usize) -> Option<String> {
        self.region.host_shared(&self.layout, host).error_text()
    }

    /// Counters every host published, in total, with the model applied.
    pub fn report(&self) -> RunReport {
        let mut per_host: Vec<Counters> = (0..self.config.hosts)
            .map(|host| {
                let shared = self.region.host_shared(&self.layout, host);
                let words: Vec<u64> = shared.stats.iter().map(|word| word.load(Ordering::Acquire)).collect();
                Counters::from_words(&words)
            })
            .collect();
        let traces = crate::staleness::read_traces(&self.region, &self.layout);
        let owner_of = |block: u64| ((block - self.layout.swcc) / self.layout.swcc_per_host) as usize;
        let stale = crate::staleness::stale_lines(&traces, self.config.swcc, owner_of);
        for (counters, stale_lines) in per_host.iter_mut().zip(stale) {
            counters.model_stale_lines = stale_lines;
        }
        let mut total = Counters::default();
        for counters in &per_host {
            total.add(counters);
        }
        let throughput_tps = per_host
            .iter()
            .filter(|c| c.measured_ns > 0)
            .map(|c| c.committed as f64 / (c.measured_ns as f64 / 1e9))
            .sum();
        let config = &self.config;
        RunReport {
            protocol: config.protocol,
            workload: config.workload.label(),
            hosts: config.hosts,
            swcc: config.swcc,
            backend: config.effective_backend(),
            hwcc_budget_bytes: config.hwcc_budget_bytes,
            shortcut: config.shortcut,
            logging: config.log_dir.is_some(),
            epoch_ms: config.epoch_ms,
            throughput_tps,
            modelled_tps: LatencyTable::default().modelled_tps(&per_host),
            abort_rate: total.aborts() as f64 / total.attempts.max(1) as f64,
            commit_latency_p50_us: total.commit_latency.quantile_us(0.5),
            commit_latency_p99_us: total.commit_latency.quantile_us(0.99),
            txn_latency_p50_us: total.txn_latency.quantile_us(0.5),
            txn_latency_p99_us: total.txn_latency.quantile_us(0.99),
            total,
            per_host,
            recovery: self.recovery,
            recovery_ms: self.recovery_ms,
        }
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        self.kill_all();
    }
}

/// The forked host process. Never returns.
fn child_main(host: usize, config: Arc<PodConfig>, parent_region: &Region) -> ! {
    // SAFETY: prctl with a signal number; if the launcher already died, getppid changed and we exit.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
    }
    let layout = layout_for(&config);
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| -> Result<()> {
        if let Some(cpu) = config.pin_cpu {
            pin_to_cpu(cpu)?;
        }
        let region: &'static Region = Box::leak(Box::new(parent_region.remap()?));
        crate::worker::run(host, config, region)
    }));
    let shared = parent_region.host_shared(&layout, host);
    let code = match outcome {
        Ok(Ok(())) if shared.error_text().is_none() => 0,
        Ok(Ok(())) => 3,
        Ok(Err(error)) => {
            shared.set_error(&error.to_string());
            1
        }
        Err(panic) => {
            let message = panic
                .downcast_ref::<&str>()
                .map(|text| text.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "panic".into());
            shared.set_error(&format!("panicked: {message}"));
            2
        }
    };
    // SAFETY: ends the child without running the parent's atexit handlers or destructors.
    unsafe { libc::_exit(code) }
}

/// Restricts this process (and the threads it starts later) to one CPU.
fn pin_to_cpu(cpu: usize) -> Result<()> {
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET stays inside it (cpu < CPU_SETSIZE is
    // validated); sched_setaffinity reads the set we pass for our own pid (0).
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if rc != 0 {
        return Err(PodError::Process { what: "sched_setaffinity", source: std::io::Error::last_os_error() });
    }
    Ok(())
}

fn describe_status(status: libc::c_int) -> String {
    if libc::WIFSIGNALED(status) {
        format!("killed by signal {}", libc::WTERMSIG(status))
    } else if libc::WIFEXITED(status) {
        format!("exited with status {}", libc::WEXITSTATUS(status))
    } else {
        format!("wait status {status:#x}")
    }
}
