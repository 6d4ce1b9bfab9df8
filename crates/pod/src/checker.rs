//! Offline serializability checker: builds Adya's direct serialization graph from committed
//! transactions' read and write versions and looks for a cycle.
//!
//! ```text
//!  ww: writer(v_i) → writer(v_i+1)            (version order = TID order per key)
//!  wr: writer(v)   → reader of v
//!  rw: reader of v → writer(next version after v)   (anti-dependency)
//! ```
//!
//! Also reported: a read of a version no committed transaction wrote (a dirty or lost write) and
//! a version written twice. Version 0 is the initial load.

use std::collections::HashMap;

use crate::history::TxnRecord;
use crate::partition::TableId;

#[derive(Debug, Clone, Default)]
pub struct CheckReport {
    pub transactions: usize,
    pub edges: usize,
    /// Empty when the history is serializable.
    pub anomalies: Vec<String>,
}

type Item = (TableId, u64);

/// Checks a history; see the module docs.
pub fn check(records: &[TxnRecord]) -> CheckReport {
    let mut report = CheckReport { transactions: records.len(), ..CheckReport::default() };
    let mut writer_of: HashMap<(TableId, u64, u64), usize> = HashMap::new();
    let mut versions: HashMap<Item, Vec<u64>> = HashMap::new();
    for (index, record) in records.iter().enumerate() {
        for &(table, key, tid) in &record.writes {
            if let Some(other) = writer_of.insert((table, key, tid), index) {
                report.anomalies.push(format!(
                    "version {tid:#x} of {table}:{key} written by {:#x} and {:#x}",
                    records[other].gid, record.gid
                ));
            }
            versions.entry((table, key)).or_default().push(tid);
        }
    }
    for list in versions.values_mut() {
        list.sort_unstable();
    }
    let mut edges: Vec<Vec<usize>> = vec![Vec::new(); records.len()];
    let add = |from: usize, to: usize, edges: &mut Vec<Vec<usize>>| {
        if from != to {
            edges[from].push(to);
        }
    };
    for list in versions.iter() {
        let ((table, key), tids) = list;
        for pair in tids.windows(2) {
            add(writer_of[&(*table, *key, pair[0])], writer_of[&(*table, *key, pair[1])], &mut edges);
        }
    }
    for (reader, record) in records.iter().enumerate() {
        for &(table, key, tid) in &record.reads {
            if tid != 0 {
                match writer_of.get(&(table, key, tid)) {
                    Some(&writer) => add(writer, reader, &mut edges),
                    None => report.anomalies.push(format!(
                        "{:#x} read version {tid:#x} of {table}:{key}, which no committed transaction wrote",
                        record.gid
                    )),
                }
            }
            let next = versions.get(&(table, key)).and_then(|tids| tids.iter().find(|&&later| later > tid));
            if let Some(&next) = next {
                add(reader, writer_of[&(table, key, next)], &mut edges);
            }
        }
    }
    report.edges = edges.iter().map(Vec::len).sum();
    if let Some(cycle) = find_cycle(&edges) {
        let names: Vec<String> = cycle.iter().map(|&index| format!("{:#x}", records[index].gid)).collect();
        report.anomalies.push(format!("dependency cycle: {}", names.join(" → ")));
    }
    report
}

/// Iterative DFS; returns one cycle's nodes if there is any.
fn find_cycle(edges: &[Vec<usize>]) -> Option<Vec<usize>> {
    const WHITE: u8 = 0;
    const GREY: u8 = 1;
    const BLACK: u8 = 2;
    let mut color = vec![WHITE; edges.len()];
    let mut parent = vec![usize::MAX; edges.len()];
    for start in 0..edges.len() {
        if color[start] != WHITE {
            continue;
        }
        let mut stack = vec![(start, 0usize)];
        color[start] = GREY;
        while let Some(&mut (node, ref mut next)) = stack.last_mut() {
            if *next < edges[node].len() {
                let target = edges[node][*next];
                *next += 1;
                match color[target] {
                    WHITE => {
                        color[target] = GREY;
                        parent[target] = node;
                        stack.push((target, 0));
                    }
                    GREY => {
                        let mut cycle = vec![target];
                        let mut at = node;
                        while at != target {
                            cycle.push(at);
                            at = parent[at];
                        }
                        cycle.reverse();
                        return Some(cycle);
                    }
                    _ => {}
                }
            } else {
                color[node] = BLACK;
                stack.pop();
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn txn(gid: u64, reads: &[(u64, u64)], writes: &[(u64, u64)]) -> TxnRecord {
        TxnRecord {
            gid,
            reads: reads.iter().map(|&(key, tid)| (0, key, tid)).collect(),
            writes: writes.iter().map(|&(key, tid)| (0, key, tid)).collect(),
        }
    }

    #[test]
    fn serial_history_passes() {
        // Goal: no false alarm. Method: three transactions in a chain of read-modify-writes.
        let history = [txn(1, &[(1, 0)], &[(1, 10)]), txn(2, &[(1, 10)], &[(1, 20)]), txn(3, &[(1, 20), (2, 0)], &[])];
        let report = check(&history);
        assert!(report.anomalies.is_empty(), "{:?}", report.anomalies);
        assert!(report.edges >= 3);
    }

    #[test]
    fn write_skew_is_a_cycle() {
        // Goal: the checker catches a non-serializable interleaving. Method: classic write skew —
        // T1 reads x writes y, T2 reads y writes x, both from the initial versions.
        let history = [txn(1, &[(1, 0), (2, 0)], &[(2, 10)]), txn(2, &[(1, 0), (2, 0)], &[(1, 11)])];
        let report = check(&history);
        assert!(report.anomalies.iter().any(|a| a.contains("cycle")), "{:?}", report.anomalies);
    }

    #[test]
    fn lost_update_is_a_cycle() {
        // Goal: a lost update (both read v0, both write) is caught. Method: two read-modify-writes of
        // the same version.
        let history = [txn(1, &[(1, 0)], &[(1, 10)]), txn(2, &[(1, 0)], &[(1, 20)])];
        assert!(check(&history).anomalies.iter().any(|a| a.contains("cycle")));
    }

    #[test]
    fn read_of_unwritten_version_is_reported() {
        // Goal: dirty reads (of an aborted write) are caught. Method: read a version nobody committed.
        let history = [txn(1, &[(1, 99)], &[])];
        assert!(check(&history).anomalies.iter().any(|a| a.contains("no committed transaction")));
    }
}
