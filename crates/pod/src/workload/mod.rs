//! Workloads, written once against [`TxnOps`] and run unchanged by every protocol: YCSB, a
//! bank-transfer variant of YCSB that keeps its total, TPC-C, and a registry that probes
//! next-key locking for phantoms.
//!
//! A workload names its tables, says which host owns a key, loads a host's partition
//! deterministically from the seed (the "checkpoint" recovery starts from), drives transactions,
//! and checks its invariants on a host's partition after a run.

pub mod bank;
pub mod registry;
pub mod tpcc;
pub mod ycsb;

use std::sync::Arc;

use serde::Serialize;

use crate::partition::{Partition, TableId, TableSpec};
use crate::txn::{TxnOps, TxnResult};

pub trait Workload: Send + Sync {
    fn name(&self) -> &'static str;
    fn tables(&self) -> Vec<TableSpec>;
    /// The host whose partition holds `key` of `table`.
    fn owner(&self, table: TableId, key: u64) -> usize;
    /// Fills `host`'s partition with the initial data (deterministic: recovery reloads it).
    fn load(&self, host: usize, partition: &mut Partition);
    /// `id_base` is unique per run and above every earlier run's (start epoch << 32): drivers
    /// derive the keys they insert from it, so keys never collide across restarts.
    fn driver(&self, host: usize, seed: u64, id_base: u64) -> Box<dyn Driver>;
    /// Tables other hosts access (Tigon pre-migrates their rows when asked).
    fn shareable_tables(&self) -> Vec<TableId>;
    /// Invariants on `host`'s partition after a run (all CATs moved back out).
    fn check(&self, host: usize, partition: &Partition) -> Check;
}

/// Generates and runs one host's transactions.
pub trait Driver: Send {
    /// Chooses the next transaction (its parameters stay fixed across retries).
    fn next_transaction(&mut self);
    /// Runs the chosen transaction's logic; the host commits or aborts it.
    fn execute(&mut self, txn: &mut dyn TxnOps) -> TxnResult<()>;
    /// Called once the chosen transaction committed (drivers count what they did).
    fn committed(&mut self) {}
    /// Two workload-specific numbers the launcher compares across hosts after the run.
    fn totals(&self) -> (u64, u64) {
        (0, 0)
    }
}

/// Result of a post-run check on one partition.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Check {
    pub failures: Vec<String>,
    /// Workload-specific values summed or compared across hosts by the caller.
    pub value_a: u64,
    pub value_b: u64,
}

#[derive(Debug, Clone, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum WorkloadConfig {
    Ycsb(ycsb::YcsbConfig),
    Bank(bank::BankConfig),
    Tpcc(tpcc::TpccConfig),
    Registry(registry::RegistryConfig),
}

impl WorkloadConfig {
    pub fn build(&self, hosts: usize) -> Arc<dyn Workload> {
        match self {
            WorkloadConfig::Ycsb(config) => Arc::new(ycsb::Ycsb::new(config.clone(), hosts)),
            WorkloadConfig::Bank(config) => Arc::new(bank::Bank::new(config.clone(), hosts)),
            WorkloadConfig::Tpcc(config) => Arc::new(tpcc::Tpcc::new(config.clone(), hosts)),
            WorkloadConfig::Registry(config) => Arc::new(registry::Registry::new(config.clone(), hosts)),
        }
    }

    pub fn problems(&self, hosts: usize) -> Vec<String> {
        match self {
            WorkloadConfig::Ycsb(config) => config.problems(),
            WorkloadConfig::Bank(config) => config.problems(),
            WorkloadConfig::Tpcc(config) => config.problems(hosts),
            WorkloadConfig::Registry(config) => config.problems(),
        }
    }

    /// Rows per host in tables other hosts may access (sizes the CXL index).
    pub fn shareable_rows_per_host(&self) -> u64 {
        match self {
            WorkloadConfig::Ycsb(config) => config.keys_per_host,
            WorkloadConfig::Bank(config) => config.accounts_per_host,
            WorkloadConfig::Tpcc(config) => config.shareable_rows_per_host(),
            WorkloadConfig::Registry(_) => 64,
        }
    }

    pub fn label(&self) -> String {
        match self {
            WorkloadConfig::Ycsb(config) => format!(
                "YCSB {}/{} θ={} cross {}%",
                config.read_percent,
                100 - config.read_percent,
                config.theta,
                config.cross_percent
            ),
            WorkloadConfig::Bank(config) => format!("bank cross {}%", config.cross_percent),
            WorkloadConfig::Tpcc(config) => {
                format!("TPC-C {}/{}", config.remote_new_order_percent, config.remote_payment_percent)
            }
            WorkloadConfig::Registry(config) => format!("registry cross {}%", config.cross_percent),
        }
    }
}

/// Little-endian field helpers for fixed-layout rows.
pub mod field {
    pub fn u64_at(row: &[u8], offset: usize) -> u64 {
        let mut raw = [0u8; 8];
        raw.copy_from_slice(&row[offset..offset + 8]);
        u64::from_le_bytes(raw)
    }
    pub fn set_u64(row: &mut [u8], offset: usize, value: u64) {
        row[offset..offset + 8].copy_from_slice(&value.to_le_bytes());
    }
    pub fn i64_at(row: &[u8], offset: usize) -> i64 {
        u64_at(row, offset) as i64
    }
    pub fn set_i64(row: &mut [u8], offset: usize, value: i64) {
        set_u64(row, offset, value as u64)
    }
}
