//! Recovery: CXL contents are soft state, so a restart reinitialises the region and rebuilds
//! every partition from its deterministic initial load plus **all** hosts' logs (a host logs its
//! writes to other hosts' tuples too), keeping only transactions committed within the pod-wide
//! durable epoch, highest TID per key winning (Thomas write rule — order of replay is irrelevant).
//!
//! ```text
//!  launcher: parse every log → pod_durable = min(last marker per host)
//!            committed = { gid → TID : commit record with epoch(TID) ≤ pod_durable }
//!            rewrite each log to its committed records + marker(pod_durable)   (so a later
//!            recovery can never resurrect a dropped transaction); next epoch = max seen + 1
//!  host:     load partition → for every record of every log owned here: keep max TID per key
//!            → apply (update, insert, or delete)
//! ```

use std::collections::HashMap;
use std::path::Path;

use serde::Serialize;

use crate::error::Result;
use crate::log::{log_path, parse_log, rewrite_log, Record};
use crate::partition::{Partition, TableId};
use crate::workload::Workload;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct RecoveryPlan {
    /// Highest epoch every host had made durable: the cut.
    pub pod_durable_epoch: u64,
    /// The global epoch the restarted pod continues from.
    pub next_epoch: u64,
    pub committed_txns: usize,
    /// Records dropped because their transaction was not committed within the cut.
    pub dropped_records: usize,
}

/// Launcher side, before hosts start: computes the cut and rewrites the logs to it.
pub fn prepare(dir: &Path, hosts: usize) -> Result<RecoveryPlan> {
    let logs = (0..hosts).map(|host| parse_log(&log_path(dir, host))).collect::<Result<Vec<_>>>()?;
    let pod_durable = logs.iter().map(|log| log.last_marker).min().unwrap_or(0);
    let max_epoch = logs.iter().map(|log| log.max_epoch).max().unwrap_or(0);
    let mut committed = HashMap::new();
    for log in &logs {
        for (_, records) in &log.buffers {
            for record in records {
                if let Record::Commit { gid, tid } = record {
                    if tid >> 32 <= pod_durable {
                        committed.insert(*gid, *tid);
                    }
                }
            }
        }
    }
    let mut dropped = 0;
    for (host, log) in logs.into_iter().enumerate() {
        let kept: Vec<(u64, Vec<Record>)> = log
            .buffers
            .into_iter()
            .map(|(epoch, records)| {
                let before = records.len();
                let kept: Vec<Record> =
                    records.into_iter().filter(|record| committed.contains_key(&gid_of(record))).collect();
                dropped += before - kept.len();
                (epoch, kept)
            })
            .collect();
        rewrite_log(&log_path(dir, host), &kept, pod_durable)?;
    }
    Ok(RecoveryPlan {
        pod_durable_epoch: pod_durable,
        next_epoch: max_epoch.max(pod_durable) + 1,
        committed_txns: committed.len(),
        dropped_records: dropped,
    })
}

fn gid_of(record: &Record) -> u64 {
    match record {
        Record::Write { gid, .. } | Record::Commit { gid, .. } => *gid,
    }
}

/// Per tuple, the newest committed record: (TID, value or `None` for a delete).
type LatestWrites = HashMap<(TableId, u64), (u64, Option<Vec<u8>>)>;

/// What replay did on one host.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReplayStats {
    pub applied: usize,
    pub deleted: usize,
}

/// Host side: applies every (already cut) log's records that belong to `me`'s partition.
pub fn replay(
    dir: &Path,
    hosts: usize,
    me: usize,
    workload: &dyn Workload,
    partition: &mut Partition,
) -> Result<ReplayStats> {
    let logs = (0..hosts).map(|host| parse_log(&log_path(dir, host))).collect::<Result<Vec<_>>>()?;
    let mut commit_tid = HashMap::new();
    for log in &logs {
        for (_, records) in &log.buffers {
            for record in records {
                if let Record::Commit { gid, tid } = record {
                    commit_tid.insert(*gid, *tid);
                }
            }
        }
    }
    let mut latest: LatestWrites = HashMap::new();
    for log in logs {
        for (_, records) in log.buffers {
            for record in records {
                let Record::Write { gid, table, key, tid, value } = record else { continue };
                if workload.owner(table, key) != me {
                    continue;
                }
                let Some(&committed) = commit_tid.get(&gid) else { continue };
                let tid = if tid == 0 { committed } else { tid };
                let newer = latest.get(&(table, key)).is_none_or(|(seen, _)| tid > *seen);
                if newer {
                    latest.insert((table, key), (tid, value));
                }
            }
        }
    }
    Ok(apply(partition, latest))
}

fn apply(partition: &mut Partition, latest: LatestWrites) -> ReplayStats {
    let mut stats = ReplayStats::default();
    for ((table, key), (tid, value)) in latest {
        let table = partition.table_mut(table);
        match (table.find(key), value) {
            (Some(row), Some(value)) => {
                let stored = table.row_mut(row);
                if stored.lock.tid() < tid {
                    stored.data.copy_from_slice(&value);
                    stored.lock = stored.lock.with_tid(tid);
                    stats.applied += 1;
                }
            }
            (None, Some(value)) => {
                table.insert(key, value.into_boxed_slice(), tid);
                stats.applied += 1;
            }
            (Some(row), None) => {
                if table.row(row).lock.tid() < tid {
                    table.remove(key);
                    stats.deleted += 1;
                }
            }
            (None, None) => {}
        }
    }
    stats
}
