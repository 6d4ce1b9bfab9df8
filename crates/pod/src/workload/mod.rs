//! Workloads, written once against [`crate::access::TxnOps`] and run unchanged by every protocol: YCSB, a
//! bank-transfer variant of YCSB that keeps its total, TPC-C, and a registry that probes
//! next-key locking for phantoms.
//!
//! A workload names its tables, says which host owns a key, loads a host's partition
//! deterministically from the seed (the "checkpoint" recovery starts from), drives transactions,
//! and checks its invariants on a host's partition after a run.

pub mod api;
pub mod bank;
pub mod registry;
pub mod tpcc;
pub mod ycsb;

use std::sync::Arc;

use serde::Serialize;

pub use api::{field, Check, Driver, Workload};

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
