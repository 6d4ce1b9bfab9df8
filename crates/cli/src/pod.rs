//! `bypass pod …` and `bypass bench pod`: argument parsing and wiring over bypass-pod and bypass-bench.

use std::path::PathBuf;

use anyhow::Context;

use bypass_pod::coherence::{CoherenceBackend, SwccProtocol};
use bypass_pod::config::{PodConfig, Protocol};
use bypass_pod::launcher::{Pod, RunReport};
use bypass_pod::workload::bank::BankConfig;
use bypass_pod::workload::tpcc::TpccConfig;
use bypass_pod::workload::ycsb::YcsbConfig;
use bypass_pod::workload::WorkloadConfig;

pub use bypass_bench::pod::BenchArgs;

/// Subcommands of `bypass pod`.
#[derive(clap::Subcommand)]
pub enum Command {
    /// Start host processes over one shared "CXL" region, run a workload, print measured and
    /// modelled throughput and the event counters.
    Run(RunArgs),
    /// Whole-pod restart from the logs in --log-dir: rebuild every partition (initial load + all
    /// hosts' logs up to the pod-wide durable epoch) and run the workload's invariant checks.
    Recover(RunArgs),
    /// Print the shared region's layout and the metadata word's bit layout.
    Layout(RunArgs),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum WorkloadKind {
    Ycsb,
    Tpcc,
    Bank,
}

/// `--protocol`: the pod's [`Protocol`] as a command-line value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ProtocolArg {
    /// Pasha/Tigon: shared tuples in CXL, 2PL NO_WAIT on the HWcc word, no 2PC.
    Tigon,
    /// DS2PL+: owner-only data, remote reads and locks by message, 2PC.
    Ds2pl,
    /// OCC+: Silo-style distributed OCC (remote reads by message; lock, validate, 2PC).
    Occ,
}

/// `--swcc`: the pod's [`SwccProtocol`] as a command-line value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SwccArg {
    /// Readers invalidate unless their host bit is set; writers write back before unlocking.
    WriteThrough,
    /// Like write-through, but a reader that misses clears everyone else's bits.
    NoSharedReader,
    /// Always invalidate before a read and write back (and drop) after a write.
    NonTemporal,
    /// All CXL memory treated as hardware-coherent (no flushes; data counts against HWcc).
    NoSwcc,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendKind {
    /// Real clflushopt/clwb + sfence on the region.
    X86,
    /// Simulated non-coherent cache per host (tests; slow).
    Incoherent,
    /// No flushes.
    Noop,
}

/// Options shared by `run`, `recover` and `layout`.
#[derive(clap::Args, Debug, Clone)]
pub struct RunArgs {
    /// Host processes (1..=8).
    #[arg(long, default_value_t = 2)]
    pub hosts: usize,
    #[arg(long, value_enum, default_value_t = ProtocolArg::Tigon)]
    pub protocol: ProtocolArg,
    #[arg(long, value_enum, default_value_t = WorkloadKind::Ycsb)]
    pub workload: WorkloadKind,
    /// YCSB/bank: keys (accounts) per host.
    #[arg(long, default_value_t = 100_000)]
    pub keys_per_host: u64,
    /// YCSB: bytes per value.
    #[arg(long, default_value_t = 1000)]
    pub value_bytes: usize,
    /// YCSB: zipfian skew.
    #[arg(long, default_value_t = 0.7)]
    pub theta: f64,
    /// YCSB: percent of operations that only read.
    #[arg(long, default_value_t = 95)]
    pub read_percent: u32,
    /// YCSB/bank: percent of transactions spanning two hosts.
    #[arg(long, default_value_t = 0)]
    pub cross_percent: u32,
    /// TPC-C: percent of remote NewOrders.
    #[arg(long, default_value_t = 0)]
    pub remote_new_order: u32,
    /// TPC-C: percent of remote Payments.
    #[arg(long, default_value_t = 0)]
    pub remote_payment: u32,
    /// TPC-C: small warehouses (60 customers per district, 1000 items) instead of full ones.
    #[arg(long)]
    pub small_warehouses: bool,
    /// HWcc budget for the whole pod, KiB.
    #[arg(long, default_value_t = 64 * 1024)]
    pub hwcc_budget_kib: u64,
    /// SWcc arena per host, MiB.
    #[arg(long, default_value_t = 512)]
    pub swcc_mib: u64,
    #[arg(long, value_enum, default_value_t = SwccArg::WriteThrough)]
    pub swcc: SwccArg,
    #[arg(long, value_enum, default_value_t = BackendKind::X86)]
    pub coherence: BackendKind,
    /// Owner reaches its shared tuples through the CXL index instead of the shortcut pointer.
    #[arg(long)]
    pub no_shortcut: bool,
    /// Tigon: move the shareable tables' rows into CXL at start (while the budget lasts).
    #[arg(long)]
    pub pre_migrate: bool,
    /// Log directory (enables redo logging and group commit).
    #[arg(long)]
    pub log_dir: Option<PathBuf>,
    /// Group-commit epoch length, ms.
    #[arg(long, default_value_t = 10)]
    pub epoch_ms: u64,
    #[arg(long, default_value_t = 1000)]
    pub warmup_ms: u64,
    #[arg(long, default_value_t = 3000)]
    pub measure_ms: u64,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Record the id of every acknowledged transaction in --log-dir (`acked-H.ids`), so that
    /// `recover` after a crash (kill -9) checks each one survived.
    #[arg(long)]
    pub record_acked: bool,
    /// Print the full report as JSON.
    #[arg(long)]
    pub json: bool,
}

impl RunArgs {
    pub fn config(&self) -> PodConfig {
        let workload = match self.workload {
            WorkloadKind::Ycsb => WorkloadConfig::Ycsb(YcsbConfig {
                keys_per_host: self.keys_per_host,
                value_bytes: self.value_bytes,
                ops_per_txn: 10,
                theta: self.theta,
                read_percent: self.read_percent,
                cross_percent: self.cross_percent,
            }),
            WorkloadKind::Bank => WorkloadConfig::Bank(BankConfig {
                accounts_per_host: self.keys_per_host,
                cross_percent: self.cross_percent,
                initial_balance: 1000,
            }),
            WorkloadKind::Tpcc => WorkloadConfig::Tpcc(if self.small_warehouses {
                TpccConfig::small(self.remote_new_order, self.remote_payment)
            } else {
                TpccConfig::standard(self.remote_new_order, self.remote_payment)
            }),
        };
        let mut config = PodConfig::new(workload);
        config.hosts = self.hosts;
        config.protocol = match self.protocol {
            ProtocolArg::Tigon => Protocol::Tigon,
            ProtocolArg::Ds2pl => Protocol::Ds2pl,
            ProtocolArg::Occ => Protocol::Occ,
        };
        config.hwcc_budget_bytes = self.hwcc_budget_kib * 1024;
        config.swcc_bytes_per_host = self.swcc_mib << 20;
        config.swcc = match self.swcc {
            SwccArg::WriteThrough => SwccProtocol::WriteThrough,
            SwccArg::NoSharedReader => SwccProtocol::NoSharedReader,
            SwccArg::NonTemporal => SwccProtocol::NonTemporal,
            SwccArg::NoSwcc => SwccProtocol::NoSwcc,
        };
        config.coherence = match self.coherence {
            BackendKind::X86 => CoherenceBackend::X86Flush,
            BackendKind::Incoherent => CoherenceBackend::Incoherent { early_evictions_per_million: 1000 },
            BackendKind::Noop => CoherenceBackend::Noop,
        };
        config.shortcut = !self.no_shortcut;
        config.pre_migrate = self.pre_migrate;
        config.log_dir = self.log_dir.clone();
        config.record_acked = self.record_acked;
        config.epoch_ms = self.epoch_ms;
        config.warmup_ms = self.warmup_ms;
        config.measure_ms = self.measure_ms;
        config.seed = self.seed;
        config
    }
}

pub fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Run(args) => {
            let report = Pod::run(args.config()).context("pod run failed")?;
            print_report(&report, args.json)
        }
        Command::Recover(args) => {
            let mut config = args.config();
            anyhow::ensure!(config.log_dir.is_some(), "recover needs --log-dir");
            config.recover = true;
            config.warmup_ms = 0;
            config.measure_ms = 0;
            let report = Pod::run(config).context("recovery failed")?;
            print_report(&report, args.json)?;
            let lost = report.recovery.map_or(0, |plan| plan.acked_lost);
            let receipts_missing = report.total.receipts_missing;
            anyhow::ensure!(
                lost == 0 && receipts_missing == 0,
                "{lost} acknowledged transactions lost, {receipts_missing} receipts missing"
            );
            Ok(())
        }
        Command::Layout(args) => {
            let config = args.config();
            config.validate()?;
            let layout = bypass_pod::host::layout_for(&config);
            println!("{layout:#?}");
            println!("metadata word: 63 latch | 62..47 host-valid bits | 46..42 readers | 41 writer | 40 modified | 39 next-key real | 38 prev-key real | 37 second chance | 36..0 SWcc block offset");
            Ok(())
        }
    }
}

fn print_report(report: &RunReport, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(report)?);
        return Ok(());
    }
    let total = &report.total;
    println!(
        "{} on {} — {} hosts (2-core machine), {:?} over {:?}",
        report.protocol.label(),
        report.workload,
        report.hosts,
        report.swcc,
        report.backend
    );
    println!(
        "measured {:.0} txn/s, modelled {:.0} txn/s; aborts {:.1}%; txn p50/p99 {}/{} µs; commit→ack p50/p99 {}/{} µs",
        report.throughput_tps,
        report.modelled_tps,
        100.0 * report.abort_rate,
        report.txn_latency_p50_us,
        report.txn_latency_p99_us,
        report.commit_latency_p50_us,
        report.commit_latency_p99_us
    );
    let per_commit = |value: u64| value as f64 / total.committed.max(1) as f64;
    println!(
        "per commit: remote {:.2} (index hits {:.2}, messages {:.2}), moves in/out {:.3}/{:.3}, HWcc lines {:.1}, atomics {:.1}, \
         lines invalidated {:.1}, written back {:.1}, messages sent {:.2}",
        per_commit(total.remote_accesses),
        per_commit(total.remote_index_hits),
        per_commit(total.remote_messages),
        per_commit(total.moves_in),
        per_commit(total.moves_out),
        per_commit(total.hwcc_lines_read),
        per_commit(total.hwcc_atomics),
        per_commit(total.swcc_invalidated_lines),
        per_commit(total.swcc_written_back_lines),
        per_commit(total.messages_sent)
    );
    println!(
        "HWcc peak {} KiB per host (max), CATs at end {}",
        report.per_host.iter().map(|h| h.hwcc_peak_bytes).max().unwrap_or(0) / 1024,
        total.cats_at_end
    );
    if let Some(plan) = report.recovery {
        println!(
            "recovered: pod-wide durable epoch {}, {} transactions, {} records dropped",
            plan.pod_durable_epoch, plan.committed_txns, plan.dropped_records
        );
        println!(
            "acknowledged before the crash: {} recorded, {} in logs, {} in checkpoints, {} lost; receipts {} checked, \
             {} missing; recovery took {} ms",
            plan.acked_recorded,
            plan.acked_in_logs,
            plan.acked_in_checkpoints,
            plan.acked_lost,
            total.receipts_checked,
            total.receipts_missing,
            report.recovery_ms.unwrap_or(0)
        );
    }
    Ok(())
}

pub fn bench(args: BenchArgs) -> anyhow::Result<()> {
    bypass_bench::pod::run(args)
}
