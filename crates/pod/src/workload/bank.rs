//! The bank-transfer variant of YCSB: accounts hash-partitioned over hosts, each transaction
//! moves an amount between two accounts (the second one on another host with the cross
//! probability), counts itself in its host's ledger row and inserts a receipt keyed by its
//! transaction id. The total balance never changes, a host's ledger counts exactly its committed
//! transfers and its receipts — the invariants crash tests check, and after a crash every
//! acknowledged transaction's receipt must be there.

use serde::Serialize;

use super::api::{field, Check, Driver, Workload};
use crate::access::{update, Fetch, TxnOps, TxnResult};
use crate::partition::{Partition, TableId, TableSpec};
use crate::rng::SplitMix64;

pub const ACCOUNTS: TableId = 0;
pub const LEDGER: TableId = 1;
/// One row per committed transfer, keyed by its transaction id (owned by the host that ran it).
pub const RECEIPTS: TableId = 2;
const ROW_BYTES: usize = 64;
const RECEIPT_BYTES: usize = 16;

#[derive(Debug, Clone, Serialize)]
pub struct BankConfig {
    pub accounts_per_host: u64,
    pub cross_percent: u32,
    pub initial_balance: i64,
}

impl Default for BankConfig {
    fn default() -> Self {
        BankConfig { accounts_per_host: 1000, cross_percent: 50, initial_balance: 1000 }
    }
}

impl BankConfig {
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.accounts_per_host < 2 {
            problems.push("bank accounts_per_host must be at least 2".into());
        }
        if self.cross_percent > 100 {
            problems.push("bank cross_percent must be 0..=100".into());
        }
        problems
    }

    /// The total every run must preserve.
    pub fn total(&self, hosts: usize) -> i64 {
        self.initial_balance * self.accounts_per_host as i64 * hosts as i64
    }
}

pub struct Bank {
    config: BankConfig,
    hosts: usize,
}

impl Bank {
    pub fn new(config: BankConfig, hosts: usize) -> Bank {
        Bank { config, hosts }
    }
}

impl Workload for Bank {
    fn name(&self) -> &'static str {
        "bank"
    }
    fn tables(&self) -> Vec<TableSpec> {
        vec![
            TableSpec { id: ACCOUNTS, name: "accounts", row_bytes: ROW_BYTES, ordered: false },
            TableSpec { id: LEDGER, name: "ledger", row_bytes: ROW_BYTES, ordered: false },
            TableSpec { id: RECEIPTS, name: "receipts", row_bytes: RECEIPT_BYTES, ordered: false },
        ]
    }
    fn owner(&self, table: TableId, key: u64) -> usize {
        match table {
            ACCOUNTS => (key / self.config.accounts_per_host) as usize,
            RECEIPTS => (key >> 56) as usize,
            _ => key as usize,
        }
    }
    fn load(&self, host: usize, partition: &mut Partition) {
        let first = host as u64 * self.config.accounts_per_host;
        for key in first..first + self.config.accounts_per_host {
            let mut row = vec![0u8; ROW_BYTES];
            field::set_i64(&mut row, 0, self.config.initial_balance);
            partition.table_mut(ACCOUNTS).insert(key, row.into_boxed_slice(), 0);
        }
        partition.table_mut(LEDGER).insert(host as u64, vec![0u8; ROW_BYTES].into_boxed_slice(), 0);
    }
    fn driver(&self, host: usize, seed: u64, _id_base: u64) -> Box<dyn Driver> {
        Box::new(BankDriver {
            config: self.config.clone(),
            hosts: self.hosts,
            host,
            rng: SplitMix64::new(seed),
            plan: (0, 0, 0),
        })
    }
    fn shareable_tables(&self) -> Vec<TableId> {
        vec![ACCOUNTS]
    }
    fn receipt(&self, gid: u64) -> Option<(TableId, u64)> {
        Some((RECEIPTS, gid))
    }
    fn check(&self, host: usize, partition: &Partition) -> Check {
        let balance: i64 = partition.table(ACCOUNTS).live_rows().map(|(_, row)| field::i64_at(&row.data, 0)).sum();
        let ledger = partition
            .table(LEDGER)
            .find(host as u64)
            .map_or(0, |row| field::u64_at(&partition.table(LEDGER).row(row).data, 0));
        let receipts = partition.table(RECEIPTS).live_rows().count() as u64;
        let mut failures = Vec::new();
        if receipts != ledger {
            failures.push(format!("host {host}: {receipts} receipts for {ledger} transfers in the ledger"));
        }
        Check { failures, value_a: balance as u64, value_b: ledger }
    }
}

struct BankDriver {
    config: BankConfig,
    hosts: usize,
    host: usize,
    rng: SplitMix64,
    /// (from, to, amount)
    plan: (u64, u64, i64),
}

impl Driver for BankDriver {
    fn next_transaction(&mut self) {
        let accounts = self.config.accounts_per_host;
        let from = self.host as u64 * accounts + self.rng.below(accounts);
        let to_host = if self.hosts > 1 && self.rng.percent(self.config.cross_percent) {
            (self.host + 1 + self.rng.below(self.hosts as u64 - 1) as usize) % self.hosts
        } else {
            self.host
        };
        let mut to = from;
        while to == from {
            to = to_host as u64 * accounts + self.rng.below(accounts);
        }
        self.plan = (from, to, self.rng.between(1, 10) as i64);
    }

    fn execute(&mut self, txn: &mut dyn TxnOps) -> TxnResult<()> {
        let (from, to, amount) = self.plan;
        let ledger = self.host as u64;
        txn.fetch(&[Fetch::write(ACCOUNTS, from), Fetch::write(ACCOUNTS, to), Fetch::write(LEDGER, ledger)])?;
        update(txn, ACCOUNTS, from, |row| field::set_i64(row, 0, field::i64_at(row, 0) - amount))?;
        update(txn, ACCOUNTS, to, |row| field::set_i64(row, 0, field::i64_at(row, 0) + amount))?;
        update(txn, LEDGER, self.host as u64, |row| field::set_u64(row, 0, field::u64_at(row, 0) + 1))?;
        let mut receipt = [0u8; RECEIPT_BYTES];
        field::set_i64(&mut receipt, 0, amount);
        field::set_u64(&mut receipt, 8, from);
        txn.insert(RECEIPTS, txn.id(), &receipt)
    }
}
