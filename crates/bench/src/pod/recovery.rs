//! The recovery point of `bypass bench pod`: a logged Tigon-style run SIGKILLed as a whole pod
//! mid-measurement, then recovered — how long recovery takes, how much log was on disk, and
//! whether every transaction acknowledged before the kill survived (each one's id is recorded
//! when it is acknowledged). Once with checkpoints (logs truncated behind them), once without.

use std::path::Path;
use std::time::{Duration, Instant};

use serde::Serialize;

use bypass_pod::config::PodConfig;
use bypass_pod::launcher::Pod;
use bypass_pod::region::Phase;

/// One crash-and-recover measurement.
#[derive(Debug, Clone, Serialize)]
pub struct RecoveryRun {
    pub label: String,
    pub checkpoint_log_bytes: u64,
    /// Seconds the pod ran (warm-up + measured) before every host was SIGKILLed.
    pub ran_s: f64,
    pub acked_before_kill: u64,
    /// Log and checkpoint bytes on disk when the pod was killed.
    pub log_bytes_on_disk: u64,
    pub checkpoint_bytes_on_disk: u64,
    /// Recovering start → every host ready (logs cut, checkpoint loaded, logs replayed).
    pub recovery_ms: u64,
    pub checkpoints_used: usize,
    pub acked_recorded: usize,
    pub acked_in_logs: usize,
    pub acked_in_checkpoints: usize,
    pub acked_lost: usize,
    pub error: Option<String>,
}

/// Runs `config` (logged) for its warm-up and measured time, kills every host, recovers.
pub fn crash_and_recover(label: &str, mut config: PodConfig, dir: &Path) -> RecoveryRun {
    config.log_dir = Some(dir.to_path_buf());
    config.record_acked = true;
    let mut run = RecoveryRun {
        label: label.into(),
        checkpoint_log_bytes: config.checkpoint_log_bytes,
        ran_s: (config.warmup_ms + config.measure_ms) as f64 / 1000.0,
        acked_before_kill: 0,
        log_bytes_on_disk: 0,
        checkpoint_bytes_on_disk: 0,
        recovery_ms: 0,
        checkpoints_used: 0,
        acked_recorded: 0,
        acked_in_logs: 0,
        acked_in_checkpoints: 0,
        acked_lost: 0,
        error: None,
    };
    if let Err(error) = measure(&mut run, config, dir) {
        run.error = Some(format!("{error:#}"));
    }
    run
}

fn measure(run: &mut RecoveryRun, config: PodConfig, dir: &Path) -> anyhow::Result<()> {
    let hosts = config.hosts;
    let mut pod = Pod::create(config.clone())?;
    pod.start()?;
    pod.wait_ready()?;
    pod.set_phase(Phase::Warmup);
    pod.watch(Duration::from_millis(config.warmup_ms))?;
    pod.set_phase(Phase::Measure);
    pod.watch(Duration::from_millis(config.measure_ms))?;
    run.acked_before_kill = (0..hosts).map(|host| pod.acked(host)).sum();
    pod.kill_all();
    drop(pod);
    for host in 0..hosts {
        run.log_bytes_on_disk += bypass_pod::log::log_bytes(dir, host)?;
        for file in bypass_pod::checkpoint::checkpoints(dir, host)? {
            run.checkpoint_bytes_on_disk += std::fs::metadata(&file.path)?.len();
        }
    }
    let mut recover = config;
    recover.recover = true;
    recover.warmup_ms = 0;
    recover.measure_ms = 0;
    let started = Instant::now();
    let report = Pod::run(recover)?;
    let plan = report.recovery.ok_or_else(|| anyhow::anyhow!("a recovering run reports its plan"))?;
    run.recovery_ms = report.recovery_ms.unwrap_or_else(|| started.elapsed().as_millis() as u64);
    run.checkpoints_used = plan.checkpoints_used;
    run.acked_recorded = plan.acked_recorded;
    run.acked_in_logs = plan.acked_in_logs;
    run.acked_in_checkpoints = plan.acked_in_checkpoints;
    run.acked_lost = plan.acked_lost;
    anyhow::ensure!(report.total.check_failures == 0, "the recovered pod fails its checks");
    Ok(())
}
