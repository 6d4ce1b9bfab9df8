//! TPC-C (placeholder until the full mix lands; refused by configuration validation).

use serde::Serialize;

use super::{Check, Driver, Workload};
use crate::partition::{Partition, TableId, TableSpec};

#[derive(Debug, Clone, Serialize)]
pub struct TpccConfig {
    pub remote_new_order_percent: u32,
    pub remote_payment_percent: u32,
}

impl TpccConfig {
    pub fn problems(&self, _hosts: usize) -> Vec<String> {
        vec!["TPC-C is not implemented yet".into()]
    }
    pub fn shareable_rows_per_host(&self) -> u64 {
        0
    }
}

pub struct Tpcc;

impl Tpcc {
    pub fn new(_config: TpccConfig, _hosts: usize) -> Tpcc {
        Tpcc
    }
}

impl Workload for Tpcc {
    fn name(&self) -> &'static str {
        "tpcc"
    }
    fn tables(&self) -> Vec<TableSpec> {
        Vec::new()
    }
    fn owner(&self, _table: TableId, _key: u64) -> usize {
        0
    }
    fn load(&self, _host: usize, _partition: &mut Partition) {}
    fn driver(&self, _host: usize, _seed: u64) -> Box<dyn Driver> {
        unreachable!("refused by validation")
    }
    fn check(&self, _host: usize, _partition: &Partition) -> Check {
        Check::default()
    }
}
