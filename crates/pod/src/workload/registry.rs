//! A phantom probe for next-key locking: each host keeps a registry — an ordered table of
//! entries in its own key span and a row counting them. A transaction inserts or deletes an
//! entry and adjusts the count, or scans a whole registry and reads its count; with the cross
//! probability it works on another host's registry (a scan, or with `remote_inserts` half the
//! time an insert — a delete when that registry is full). Under serializable range locking the scanned keys always number exactly the
//! count; a mismatch is a phantom (or a lost entry) and is counted, and after the run every
//! host's count must equal its entries.
//!
//! ```text
//!  ENTRIES (ordered)  host h: keys h<<32 | 1 .. h<<32 | SPAN-1, then the table's supremum
//!  COUNTS  (hash)     key h: number of h's entries
//! ```

use serde::Serialize;

use super::api::{field, Check, Driver, Workload};
use crate::access::{abort, update, Abort, TxnOps, TxnResult};
use crate::partition::{Partition, TableId, TableSpec};
use crate::rng::SplitMix64;

pub const ENTRIES: TableId = 0;
pub const COUNTS: TableId = 1;
const ROW_BYTES: usize = 16;
/// Low 32 bits of an entry key: its place in the host's span.
const SPAN: u64 = 1 << 32;
/// Rows one scan asks for; registries are kept well below it, so a scan sees them whole.
pub const SCAN_LIMIT: usize = 48;
/// Above this many entries a host deletes rather than inserts.
const ENTRIES_TARGET: u64 = 16;

#[derive(Debug, Clone, Serialize)]
pub struct RegistryConfig {
    pub initial_entries: u64,
    /// Percent of transactions that work on another host's registry.
    pub cross_percent: u32,
    /// Whether half of those insert into (or delete from) the other registry, else all scan it.
    pub remote_inserts: bool,
}

impl Default for RegistryConfig {
    fn default() -> Self {
        RegistryConfig { initial_entries: 8, cross_percent: 50, remote_inserts: true }
    }
}

impl RegistryConfig {
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.initial_entries == 0 || self.initial_entries > ENTRIES_TARGET {
            problems.push(format!("registry initial_entries must be 1..={ENTRIES_TARGET}"));
        }
        if self.cross_percent > 100 {
            problems.push("registry cross_percent must be 0..=100".into());
        }
        problems
    }
}

pub struct Registry {
    config: RegistryConfig,
    hosts: usize,
}

impl Registry {
    pub fn new(config: RegistryConfig, hosts: usize) -> Registry {
        Registry { config, hosts }
    }
}

fn span_of(host: usize) -> (u64, u64) {
    let first = host as u64 * SPAN;
    (first + 1, first + SPAN - 1)
}

impl Workload for Registry {
    fn name(&self) -> &'static str {
        "registry"
    }
    fn tables(&self) -> Vec<TableSpec> {
        vec![
            TableSpec { id: ENTRIES, name: "entries", row_bytes: ROW_BYTES, ordered: true },
            TableSpec { id: COUNTS, name: "counts", row_bytes: ROW_BYTES, ordered: false },
        ]
    }
    fn owner(&self, table: TableId, key: u64) -> usize {
        match table {
            ENTRIES => ((key / SPAN) as usize).min(self.hosts - 1),
            _ => (key as usize).min(self.hosts - 1),
        }
    }
    fn load(&self, host: usize, partition: &mut Partition) {
        let (first, _) = span_of(host);
        let stride = SPAN / (2 * self.config.initial_entries + 2);
        for entry in 0..self.config.initial_entries {
            partition.table_mut(ENTRIES).insert(first + entry * stride, vec![0; ROW_BYTES].into_boxed_slice(), 0);
        }
        let mut count = vec![0u8; ROW_BYTES];
        field::set_u64(&mut count, 0, self.config.initial_entries);
        partition.table_mut(COUNTS).insert(host as u64, count.into_boxed_slice(), 0);
    }
    fn driver(&self, host: usize, seed: u64, _id_base: u64) -> Box<dyn Driver> {
        Box::new(RegistryDriver {
            config: self.config.clone(),
            hosts: self.hosts,
            host,
            rng: SplitMix64::new(seed),
            plan: Plan::Scan { of: host },
            observed: None,
            phantoms: 0,
            remote_scans_checked: 0,
        })
    }
    fn shareable_tables(&self) -> Vec<TableId> {
        vec![ENTRIES, COUNTS]
    }
    fn check(&self, host: usize, partition: &Partition) -> Check {
        let (first, last) = span_of(host);
        let entries = partition.table(ENTRIES).range(first, last, usize::MAX).len() as u64;
        let count = partition
            .table(COUNTS)
            .find(host as u64)
            .map_or(u64::MAX, |row| field::u64_at(&partition.table(COUNTS).row(row).data, 0));
        let mut failures = Vec::new();
        if entries != count {
            failures.push(format!("host {host} holds {entries} entries but counts {count}"));
        }
        Check { failures, value_a: 0, value_b: 0 }
    }
}

#[derive(Debug, Clone, Copy)]
enum Plan {
    /// In host `of`'s registry: insert at this span offset, or (own registry only) delete the
    /// first entry at or after it.
    Change {
        of: usize,
        at: u64,
    },
    Scan {
        of: usize,
    },
}

struct RegistryDriver {
    config: RegistryConfig,
    hosts: usize,
    host: usize,
    rng: SplitMix64,
    plan: Plan,
    /// What the current attempt's scan saw: (keys in range, count row, of another host).
    observed: Option<(usize, u64, bool)>,
    phantoms: u64,
    remote_scans_checked: u64,
}

impl RegistryDriver {
    fn change(&mut self, txn: &mut dyn TxnOps, of: usize, at: u64) -> TxnResult<()> {
        let (first, last) = span_of(of);
        let count = match txn.read_for_update(COUNTS, of as u64)? {
            Some(row) => field::u64_at(row, 0),
            None => return abort(Abort::User),
        };
        // The owner flips a coin; a remote host deletes only from a full registry, so remote
        // deletes happen but registries stay small.
        let delete = if of != self.host {
            count >= ENTRIES_TARGET
        } else {
            count > ENTRIES_TARGET || (count > 1 && at.is_multiple_of(2))
        };
        let delta: i64 = if delete {
            let keys = txn.scan(ENTRIES, first + at.min(SPAN - 2), last, 1)?;
            let Some(&key) = keys.first() else { return Ok(()) };
            txn.delete(ENTRIES, key)?;
            -1
        } else {
            txn.insert(ENTRIES, first + at, &[0; ROW_BYTES])?;
            1
        };
        update(txn, COUNTS, of as u64, |row| field::set_u64(row, 0, (count as i64 + delta) as u64))?;
        Ok(())
    }

    fn scan(&mut self, txn: &mut dyn TxnOps, of: usize) -> TxnResult<()> {
        let (first, last) = span_of(of);
        let keys = txn.scan(ENTRIES, first, last, SCAN_LIMIT)?;
        let count = match txn.read(COUNTS, of as u64)? {
            Some(row) => field::u64_at(row, 0),
            None => return abort(Abort::User),
        };
        self.observed = Some((keys.len(), count, of != self.host));
        Ok(())
    }
}

impl Driver for RegistryDriver {
    fn next_transaction(&mut self) {
        let at = self.rng.between(1, SPAN - 2);
        self.plan = if self.hosts > 1 && self.rng.percent(self.config.cross_percent) {
            let other = (self.host + 1 + self.rng.below(self.hosts as u64 - 1) as usize) % self.hosts;
            if self.config.remote_inserts && self.rng.percent(50) {
                Plan::Change { of: other, at }
            } else {
                Plan::Scan { of: other }
            }
        } else if self.rng.percent(25) {
            Plan::Scan { of: self.host }
        } else {
            Plan::Change { of: self.host, at }
        };
    }

    fn execute(&mut self, txn: &mut dyn TxnOps) -> TxnResult<()> {
        self.observed = None;
        match self.plan {
            Plan::Change { of, at } => self.change(txn, of, at),
            Plan::Scan { of } => self.scan(txn, of),
        }
    }

    fn committed(&mut self) {
        if let Some((keys, count, remote)) = self.observed.take() {
            self.remote_scans_checked += u64::from(remote);
            if keys < SCAN_LIMIT && keys as u64 != count {
                self.phantoms += 1;
            }
        }
    }

    /// (phantoms seen by committed scans, committed scans of another host's registry)
    fn totals(&self) -> (u64, u64) {
        (self.phantoms, self.remote_scans_checked)
    }
}
