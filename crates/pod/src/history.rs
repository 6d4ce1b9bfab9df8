//! Committed transactions' read and write versions, one file per host, for the offline
//! serializability checker ([`crate::checker`]). Versions are TIDs: unique per key because a
//! writer's TID exceeds every TID it read or overwrote.
//!
//! File format, one transaction per line: `gid;reads;writes`, each list `table:key:tid` joined by
//! commas.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::{PodError, Result};
use crate::partition::TableId;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnRecord {
    pub gid: u64,
    /// (table, key, version read)
    pub reads: Vec<(TableId, u64, u64)>,
    /// (table, key, version written)
    pub writes: Vec<(TableId, u64, u64)>,
}

pub fn history_path(dir: &Path, host: usize) -> PathBuf {
    dir.join(format!("host-{host}.history"))
}

/// One host's records, written at the end of the run.
pub struct History {
    path: PathBuf,
    records: Vec<TxnRecord>,
    /// Set when the bound was hit: the checker must then refuse the history.
    pub truncated: bool,
}

impl History {
    pub fn new(dir: &Path, host: usize) -> History {
        History { path: history_path(dir, host), records: Vec::new(), truncated: false }
    }
    pub fn len(&self) -> usize {
        self.records.len()
    }
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }
    pub fn push(&mut self, record: TxnRecord) {
        self.records.push(record);
    }

    pub fn write(self) -> Result<()> {
        let io = |source| PodError::FileIo { path: self.path.clone(), source };
        let mut out = std::io::BufWriter::new(std::fs::File::create(&self.path).map_err(io)?);
        if self.truncated {
            writeln!(out, "truncated").map_err(io)?;
        }
        let list = |items: &[(TableId, u64, u64)]| {
            items.iter().map(|(table, key, tid)| format!("{table}:{key}:{tid}")).collect::<Vec<_>>().join(",")
        };
        for record in &self.records {
            writeln!(out, "{};{};{}", record.gid, list(&record.reads), list(&record.writes)).map_err(io)?;
        }
        out.flush().map_err(io)
    }
}

/// Reads every host's history; an error if one was truncated or is malformed.
pub fn read_histories(dir: &Path, hosts: usize) -> Result<Vec<TxnRecord>> {
    let mut records = Vec::new();
    for host in 0..hosts {
        let path = history_path(dir, host);
        let text = std::fs::read_to_string(&path).map_err(|source| PodError::FileIo { path: path.clone(), source })?;
        for line in text.lines() {
            records.push(
                parse_line(line)
                    .ok_or_else(|| PodError::Workload(format!("{}: bad history line {line:?}", path.display())))?,
            );
        }
    }
    Ok(records)
}

fn parse_line(line: &str) -> Option<TxnRecord> {
    let mut parts = line.split(';');
    let gid = parts.next()?.parse().ok()?;
    let mut list = || -> Option<Vec<(TableId, u64, u64)>> {
        let text = parts.next()?;
        if text.is_empty() {
            return Some(Vec::new());
        }
        text.split(',')
            .map(|item| {
                let mut fields = item.split(':');
                Some((fields.next()?.parse().ok()?, fields.next()?.parse().ok()?, fields.next()?.parse().ok()?))
            })
            .collect()
    };
    let reads = list()?;
    let writes = list()?;
    Some(TxnRecord { gid, reads, writes })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histories_round_trip_and_truncation_is_refused() {
        // Goal: what hosts write is what the checker reads, and a truncated history is not silently
        // accepted. Method: write two records (one read-only), read back; then mark truncated.
        let dir = tempfile::tempdir().expect("tempdir");
        let mut history = History::new(dir.path(), 0);
        history.push(TxnRecord { gid: 7, reads: vec![(0, 1, 5), (1, 2, 0)], writes: vec![(0, 1, 9)] });
        history.push(TxnRecord { gid: 8, reads: vec![(0, 1, 9)], writes: vec![] });
        let expected = history.records.clone();
        history.write().expect("write");
        assert_eq!(read_histories(dir.path(), 1).expect("read"), expected);
        let mut truncated = History::new(dir.path(), 0);
        truncated.truncated = true;
        truncated.write().expect("write");
        assert!(read_histories(dir.path(), 1).is_err());
    }
}
