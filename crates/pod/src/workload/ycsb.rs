//! YCSB as Tigon runs it: one table, `keys_per_host` keys per host, fixed-size values, ten
//! operations per transaction over a zipfian, and a cross ratio = the probability that a
//! transaction is multi-partition (its odd operations then go to one other host).
//!
//! Every update increments a counter in the row, so after a run the sum of all counters must
//! equal the number of committed updates: a lost update anywhere (say, a missing flush) shows.
//! An update rewrites the whole value, as YCSB's (and Tigon's) updates assign every field: the
//! bytes after the counter become a fill derived from it, so every line of the row changes.

use serde::Serialize;

use super::api::{field, Check, Driver, Workload};
use crate::access::{update, Fetch, TxnOps, TxnResult};
use crate::partition::{Partition, TableId, TableSpec};
use crate::rng::{SplitMix64, Zipf};

pub const USERTABLE: TableId = 0;

#[derive(Debug, Clone, Serialize)]
pub struct YcsbConfig {
    pub keys_per_host: u64,
    /// Bytes per value (the first 8 are the update counter).
    pub value_bytes: usize,
    pub ops_per_txn: usize,
    /// Zipfian skew (0 < θ < 1).
    pub theta: f64,
    /// Percent of operations that read (100/95/50/0 in the paper); the rest read-modify-write.
    pub read_percent: u32,
    /// Percent of transactions that span two partitions.
    pub cross_percent: u32,
}

impl Default for YcsbConfig {
    fn default() -> Self {
        YcsbConfig {
            keys_per_host: 100_000,
            value_bytes: 1000,
            ops_per_txn: 10,
            theta: 0.7,
            read_percent: 95,
            cross_percent: 0,
        }
    }
}

impl YcsbConfig {
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.keys_per_host < 2 {
            problems.push("ycsb keys_per_host must be at least 2".into());
        }
        if self.value_bytes < 8 || self.value_bytes > 8192 {
            problems.push("ycsb value_bytes must be 8..=8192".into());
        }
        if self.ops_per_txn == 0 || self.ops_per_txn > 64 {
            problems.push("ycsb ops_per_txn must be 1..=64".into());
        }
        if !(self.theta > 0.0 && self.theta < 1.0) {
            problems.push("ycsb theta must be in (0, 1)".into());
        }
        if self.read_percent > 100 || self.cross_percent > 100 {
            problems.push("ycsb percentages must be 0..=100".into());
        }
        problems
    }
}

pub struct Ycsb {
    config: YcsbConfig,
    hosts: usize,
    zipf: Zipf,
}

impl Ycsb {
    pub fn new(config: YcsbConfig, hosts: usize) -> Ycsb {
        let zipf = Zipf::new(config.keys_per_host, config.theta);
        Ycsb { config, hosts, zipf }
    }
}

impl Workload for Ycsb {
    fn name(&self) -> &'static str {
        "ycsb"
    }
    fn tables(&self) -> Vec<TableSpec> {
        vec![TableSpec { id: USERTABLE, name: "usertable", row_bytes: self.config.value_bytes, ordered: false }]
    }
    fn owner(&self, _table: TableId, key: u64) -> usize {
        (key / self.config.keys_per_host) as usize
    }
    fn load(&self, host: usize, partition: &mut Partition) {
        let table = partition.table_mut(USERTABLE);
        let first = host as u64 * self.config.keys_per_host;
        for key in first..first + self.config.keys_per_host {
            let mut row = vec![(key % 251) as u8; self.config.value_bytes];
            field::set_u64(&mut row, 0, 0);
            table.insert(key, row.into_boxed_slice(), 0);
        }
    }
    fn driver(&self, host: usize, seed: u64, _id_base: u64) -> Box<dyn Driver> {
        Box::new(YcsbDriver {
            config: self.config.clone(),
            zipf: self.zipf.clone(),
            hosts: self.hosts,
            host,
            rng: SplitMix64::new(seed),
            ops: Vec::new(),
            committed_updates: 0,
        })
    }
    fn shareable_tables(&self) -> Vec<TableId> {
        vec![USERTABLE]
    }
    fn check(&self, _host: usize, partition: &Partition) -> Check {
        let sum = partition.table(USERTABLE).live_rows().map(|(_, row)| field::u64_at(&row.data, 0)).sum();
        Check { failures: Vec::new(), value_a: sum, value_b: 0 }
    }
}

struct YcsbDriver {
    config: YcsbConfig,
    zipf: Zipf,
    hosts: usize,
    host: usize,
    rng: SplitMix64,
    /// (key, is update) of the current transaction.
    ops: Vec<(u64, bool)>,
    committed_updates: u64,
}

impl Driver for YcsbDriver {
    fn next_transaction(&mut self) {
        self.ops.clear();
        let cross = self.hosts > 1 && self.rng.percent(self.config.cross_percent);
        let other = (self.host + 1 + self.rng.below(self.hosts.max(2) as u64 - 1) as usize) % self.hosts;
        for op in 0..self.config.ops_per_txn {
            let partition = if cross && op % 2 == 1 { other } else { self.host };
            let mut key = 0;
            for _ in 0..8 {
                key = partition as u64 * self.config.keys_per_host + self.zipf.sample(&mut self.rng);
                if !self.ops.iter().any(|(seen, _)| *seen == key) {
                    break;
                }
            }
            let is_update = !self.rng.percent(self.config.read_percent);
            if !self.ops.iter().any(|(seen, _)| *seen == key) {
                self.ops.push((key, is_update));
            }
        }
    }

    fn execute(&mut self, txn: &mut dyn TxnOps) -> TxnResult<()> {
        // One phase, as Tigon's YCSB transaction: every key read or locked, then the updates.
        let wanted: Vec<Fetch> = self
            .ops
            .iter()
            .map(|&(key, is_update)| if is_update { Fetch::write(USERTABLE, key) } else { Fetch::read(USERTABLE, key) })
            .collect();
        txn.fetch(&wanted)?;
        for &(key, is_update) in &self.ops {
            if is_update {
                update(txn, USERTABLE, key, |row| {
                    let counter = field::u64_at(row, 0) + 1;
                    field::set_u64(row, 0, counter);
                    row[8..].fill(counter as u8 ^ 0x5a);
                })?;
            } else {
                txn.read(USERTABLE, key)?;
            }
        }
        Ok(())
    }

    fn committed(&mut self) {
        self.committed_updates += self.ops.iter().filter(|(_, is_update)| *is_update).count() as u64;
    }

    fn totals(&self) -> (u64, u64) {
        (0, self.committed_updates)
    }
}
