//! Recovery: CXL contents are soft state, so a restart reinitialises the region and rebuilds
//! every partition from its newest usable checkpoint (or its deterministic initial load) plus
//! **all** hosts' logs (a host logs its writes to other hosts' tuples too), keeping only
//! transactions committed within the pod-wide durable epoch, highest TID per key winning
//! (Thomas write rule — order of replay is irrelevant).
//!
//! ```text
//!  launcher: parse every log → pod_durable = min(last marker per host)
//!            drop checkpoints whose end epoch > pod_durable (they may hold dropped values)
//!            committed = { gid → TID : commit record with epoch(TID) ≤ pod_durable }
//!            acknowledged ids (if recorded): each in a kept commit record or below the floor
//!            rewrite each log to its committed records + marker(pod_durable)   (so a later
//!            recovery can never resurrect a dropped transaction); next epoch = max seen + 1
//!  host:     checkpoint (end ≤ pod_durable) or initial load → for every record of every log
//!            owned here: keep max TID per key → apply (update, insert, or delete)
//! ```

use std::collections::HashMap;
use std::path::Path;

use serde::Serialize;

use crate::checkpoint::{checkpoints, usable};
use crate::error::{PodError, Result};
use crate::log::{parse_log, read_acked, rewrite_log, ParsedLog, Record};
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
    /// Log bytes read (all hosts) and checkpoints the hosts start from.
    pub log_bytes: u64,
    pub checkpoints_used: usize,
    /// Lowest floor of those checkpoints (0 when some host starts from its initial load).
    pub checkpoint_floor: u64,
    /// Acknowledged transactions the hosts recorded before the crash (`record_acked`), found in
    /// a kept commit record, covered by every host's checkpoint, or lost.
    pub acked_recorded: usize,
    pub acked_in_logs: usize,
    pub acked_in_checkpoints: usize,
    pub acked_lost: usize,
}

/// Launcher side, before hosts start: computes the cut, checks the recorded acknowledgements,
/// and rewrites the logs to the cut.
pub fn prepare(dir: &Path, hosts: usize) -> Result<RecoveryPlan> {
    let logs = (0..hosts).map(|host| parse_log(dir, host)).collect::<Result<Vec<_>>>()?;
    let pod_durable = logs.iter().map(|log| log.last_marker).min().unwrap_or(0);
    let max_epoch = logs.iter().map(|log| log.max_epoch).max().unwrap_or(0);
    let mut plan = RecoveryPlan {
        pod_durable_epoch: pod_durable,
        next_epoch: max_epoch.max(pod_durable) + 1,
        log_bytes: logs.iter().map(|log| log.total_bytes).sum(),
        ..RecoveryPlan::default()
    };
    let floors = choose_checkpoints(dir, hosts, pod_durable)?;
    plan.checkpoints_used = floors.iter().flatten().count();
    plan.checkpoint_floor = floors.iter().map(|floor| floor.unwrap_or(0)).min().unwrap_or(0);
    let committed = committed_within(&logs, pod_durable);
    plan.committed_txns = committed.len();
    check_acked(dir, hosts, &committed, &mut plan)?;
    for (host, log) in logs.into_iter().enumerate() {
        let kept: Vec<(u64, Vec<Record>)> = log
            .buffers
            .into_iter()
            .map(|(epoch, records)| {
                let before = records.len();
                let kept: Vec<Record> =
                    records.into_iter().filter(|record| committed.contains_key(&gid_of(record))).collect();
                plan.dropped_records += before - kept.len();
                (epoch, kept)
            })
            .collect();
        rewrite_log(dir, host, &kept, pod_durable)?;
    }
    Ok(plan)
}

/// Removes checkpoints that end after the cut; each host's floor if it has a usable one.
fn choose_checkpoints(dir: &Path, hosts: usize, pod_durable: u64) -> Result<Vec<Option<u64>>> {
    let mut floors = Vec::with_capacity(hosts);
    for host in 0..hosts {
        for file in checkpoints(dir, host)?.into_iter().filter(|file| file.end_epoch > pod_durable) {
            std::fs::remove_file(&file.path).map_err(|source| PodError::FileIo { path: file.path.clone(), source })?;
        }
        floors.push(usable(dir, host, pod_durable)?.map(|file| file.floor));
    }
    Ok(floors)
}

/// Transactions with a commit record in an epoch within the cut, and their TIDs.
fn committed_within(logs: &[ParsedLog], pod_durable: u64) -> HashMap<u64, u64> {
    let mut committed = HashMap::new();
    for log in logs {
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
    committed
}

/// Every recorded acknowledgement must survive: its commit record kept, or its log buffer
/// below every host's checkpoint floor (the checkpoints then hold its writes).
fn check_acked(dir: &Path, hosts: usize, committed: &HashMap<u64, u64>, plan: &mut RecoveryPlan) -> Result<()> {
    for host in 0..hosts {
        for acked in read_acked(dir, host)? {
            plan.acked_recorded += 1;
            if acked.epoch <= plan.pod_durable_epoch && committed.contains_key(&acked.gid) {
                plan.acked_in_logs += 1;
            } else if acked.epoch <= plan.pod_durable_epoch && acked.buffer_epoch < plan.checkpoint_floor {
                plan.acked_in_checkpoints += 1;
            } else {
                plan.acked_lost += 1;
            }
        }
    }
    Ok(())
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

/// Host side: `me`'s partition as of the cut — its newest usable checkpoint (or its initial
/// load), then every (already cut) log's records that belong to it.
pub fn rebuild(
    dir: &Path,
    hosts: usize,
    me: usize,
    workload: &dyn Workload,
    pod_durable: u64,
) -> Result<(Partition, ReplayStats)> {
    let mut partition = Partition::new(&workload.tables());
    match usable(dir, me, pod_durable)? {
        Some(file) => {
            crate::checkpoint::load(&file, &mut partition)?;
        }
        None => workload.load(me, &mut partition),
    }
    let logs = (0..hosts).map(|host| parse_log(dir, host)).collect::<Result<Vec<_>>>()?;
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
    let stats = apply(&mut partition, latest);
    Ok((partition, stats))
}

/// After a rebuild: for every acknowledged transaction any host recorded whose receipt (a row
/// the workload keys by the transaction's id) lives here, whether it is there. (checked, missing).
pub fn check_receipts(
    dir: &Path,
    hosts: usize,
    me: usize,
    workload: &dyn Workload,
    partition: &Partition,
) -> Result<(u64, u64)> {
    let (mut checked, mut missing) = (0, 0);
    for host in 0..hosts {
        for acked in read_acked(dir, host)? {
            let Some((table, key)) = workload.receipt(acked.gid) else { continue };
            if workload.owner(table, key) != me {
                continue;
            }
            checked += 1;
            missing += u64::from(partition.table(table).find(key).is_none());
        }
    }
    Ok((checked, missing))
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
