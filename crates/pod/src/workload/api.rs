//! What a workload is to the pod: its tables, who owns a key, its initial load, its driver and
//! its post-run check (the parent module picks one from a configuration).

use serde::Serialize;

use crate::access::{TxnOps, TxnResult};
use crate::partition::{Partition, TableId, TableSpec};

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
    /// Where a committed transaction with id `gid` left a row of its own (a receipt), if the
    /// workload leaves one: recovery then checks every acknowledged id against the data.
    fn receipt(&self, _gid: u64) -> Option<(TableId, u64)> {
        None
    }
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
