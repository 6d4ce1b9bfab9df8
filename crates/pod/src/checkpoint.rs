//! Checkpoint files: a host's partition written out while the pod runs, so recovery starts from
//! it instead of the initial load, and logs older than every host's checkpoint can be deleted.
//!
//! ```text
//!  checkpoint-H.NNNNNN.F-E.ckpt   F: floor, E: end epoch (in the name, so choosing one reads no file)
//!  frames (crate::log's format):  ROWS [table u8 | key u64 | tid u64 | len u32 | bytes]…  …  END [rows u64]
//! ```
//!
//! The floor says what the checkpoint covers: every transaction whose log buffer epoch is below
//! F had finished before the first row was read, and every row was read while no transaction
//! held it write-locked, so each row is at least as new as any such transaction's write (the
//! worker takes the checkpoint between transactions; crate::checkpointer). Records of those
//! epochs — from every host's log, since hosts log their writes to other hosts' shared tuples —
//! are then redundant for this host's rows. The end epoch E is the global epoch after the last
//! row: no value in the file is newer, so the checkpoint may be used once E is durable pod-wide
//! (a value from a later epoch could belong to a transaction recovery drops).
//!
//! Invariant: a file carries its final name only once complete and synced (written under a
//! temporary name, fsynced, renamed).

use std::path::{Path, PathBuf};

use crate::error::{PodError, Result};
use crate::log::{next_frame, push_frame};
use crate::partition::{Partition, TableId};

const FRAME_ROWS: u8 = 10;
const FRAME_END: u8 = 11;

/// A finished checkpoint file of one host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointFile {
    pub sequence: u64,
    pub floor: u64,
    pub end_epoch: u64,
    pub path: PathBuf,
}

/// Final path of a checkpoint.
pub fn checkpoint_path(dir: &Path, host: usize, sequence: u64, floor: u64, end_epoch: u64) -> PathBuf {
    dir.join(format!("checkpoint-{host}.{sequence:06}.{floor}-{end_epoch}.ckpt"))
}

/// Where a checkpoint is written before it is complete.
pub fn temporary_path(dir: &Path, host: usize) -> PathBuf {
    dir.join(format!("checkpoint-{host}.partial"))
}

/// `host`'s finished checkpoints in `dir`, oldest first.
pub fn checkpoints(dir: &Path, host: usize) -> Result<Vec<CheckpointFile>> {
    let prefix = format!("checkpoint-{host}.");
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => return Err(PodError::FileIo { path: dir.to_path_buf(), source }),
    };
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| PodError::FileIo { path: dir.to_path_buf(), source })?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(file) = parse_name(&name, &prefix, entry.path()) {
            found.push(file);
        }
    }
    found.sort_by_key(|file| file.sequence);
    Ok(found)
}

fn parse_name(name: &str, prefix: &str, path: PathBuf) -> Option<CheckpointFile> {
    let rest = name.strip_prefix(prefix)?.strip_suffix(".ckpt")?;
    let (sequence, epochs) = rest.split_once('.')?;
    let (floor, end_epoch) = epochs.split_once('-')?;
    Some(CheckpointFile {
        sequence: sequence.parse().ok()?,
        floor: floor.parse().ok()?,
        end_epoch: end_epoch.parse().ok()?,
        path,
    })
}

/// The newest checkpoint of `host` usable when `durable` is the pod-wide durable epoch.
pub fn usable(dir: &Path, host: usize, durable: u64) -> Result<Option<CheckpointFile>> {
    Ok(checkpoints(dir, host)?.into_iter().rfind(|file| file.end_epoch <= durable))
}

/// Removes every checkpoint of `host` (a fresh start), and a partial one.
pub fn remove_all(dir: &Path, host: usize) -> Result<()> {
    for file in checkpoints(dir, host)? {
        std::fs::remove_file(&file.path).map_err(|source| PodError::FileIo { path: file.path.clone(), source })?;
    }
    let _ = std::fs::remove_file(temporary_path(dir, host));
    Ok(())
}

/// Appends one row to a frame body being built.
pub fn encode_row(body: &mut Vec<u8>, table: TableId, key: u64, tid: u64, value: &[u8]) {
    body.push(table);
    body.extend_from_slice(&key.to_le_bytes());
    body.extend_from_slice(&tid.to_le_bytes());
    body.extend_from_slice(&(value.len() as u32).to_le_bytes());
    body.extend_from_slice(value);
}

/// A frame of rows (an epoch of 0: checkpoint frames carry no epoch).
pub fn rows_frame(out: &mut Vec<u8>, body: &[u8]) {
    push_frame(out, 0, FRAME_ROWS, body);
}

/// The closing frame: how many rows the file holds.
pub fn end_frame(out: &mut Vec<u8>, rows: u64) {
    push_frame(out, 0, FRAME_END, &rows.to_le_bytes());
}

/// Loads a checkpoint into an empty partition; how many rows. A file whose frames do not end
/// with a matching END frame is corrupt (its name promised it complete).
pub fn load(file: &CheckpointFile, partition: &mut Partition) -> Result<u64> {
    let bytes = std::fs::read(&file.path).map_err(|source| PodError::FileIo { path: file.path.clone(), source })?;
    let corrupt = |detail: &str| PodError::Workload(format!("checkpoint {}: {detail}", file.path.display()));
    let mut at = 0;
    let mut rows = 0u64;
    while let Some((_, kind, body, next)) = next_frame(&bytes, at) {
        match kind {
            FRAME_ROWS => rows += load_rows(body, partition).ok_or_else(|| corrupt("malformed rows"))?,
            FRAME_END if next == bytes.len() && body.len() == 8 => {
                let promised = u64::from_le_bytes(body.try_into().expect("8 bytes"));
                return if promised == rows { Ok(rows) } else { Err(corrupt("row count differs from its end frame")) };
            }
            _ => return Err(corrupt("unexpected frame")),
        }
        at = next;
    }
    Err(corrupt("no end frame"))
}

fn load_rows(mut body: &[u8], partition: &mut Partition) -> Option<u64> {
    fn take<'a>(body: &mut &'a [u8], len: usize) -> Option<&'a [u8]> {
        let (head, tail) = (body.get(..len)?, body.get(len..)?);
        *body = tail;
        Some(head)
    }
    let u64_of = |bytes: &[u8]| u64::from_le_bytes(bytes.try_into().expect("8 bytes"));
    let mut rows = 0;
    while !body.is_empty() {
        let table = take(&mut body, 1)?[0];
        let key = u64_of(take(&mut body, 8)?);
        let tid = u64_of(take(&mut body, 8)?);
        let len = u32::from_le_bytes(take(&mut body, 4)?.try_into().expect("4 bytes")) as usize;
        let value = take(&mut body, len)?;
        if usize::from(table) >= partition.tables().len() || partition.table(table).spec.row_bytes != len {
            return None;
        }
        partition.table_mut(table).insert(key, value.to_vec().into_boxed_slice(), tid);
        rows += 1;
    }
    Some(rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partition::TableSpec;

    #[test]
    fn a_checkpoint_round_trips_and_a_truncated_one_is_refused() {
        // Goal: what is written loads back exactly, and a file cut short is an error, not a
        // silently smaller partition. Method: two rows in two frames, then the file minus a byte.
        let dir = tempfile::tempdir().expect("tempdir");
        let specs = [TableSpec { id: 0, name: "t", row_bytes: 4, ordered: false }];
        let mut out = Vec::new();
        let mut body = Vec::new();
        encode_row(&mut body, 0, 7, 5 << 32, &[1, 2, 3, 4]);
        rows_frame(&mut out, &body);
        body.clear();
        encode_row(&mut body, 0, 9, 6 << 32, &[5, 6, 7, 8]);
        rows_frame(&mut out, &body);
        end_frame(&mut out, 2);
        let path = checkpoint_path(dir.path(), 1, 3, 40, 44);
        std::fs::write(&path, &out).expect("write");
        let file = checkpoints(dir.path(), 1).expect("list").pop().expect("one checkpoint");
        assert_eq!((file.sequence, file.floor, file.end_epoch), (3, 40, 44));
        assert_eq!(usable(dir.path(), 1, 43).expect("usable"), None, "not usable before its end epoch is durable");
        let mut partition = Partition::new(&specs);
        assert_eq!(load(&file, &mut partition).expect("load"), 2);
        let row = partition.table(0).find(9).expect("row 9");
        assert_eq!(
            (partition.table(0).row(row).lock.tid(), &partition.table(0).row(row).data[..]),
            (6 << 32, &[5, 6, 7, 8][..])
        );
        std::fs::write(&path, &out[..out.len() - 1]).expect("write");
        assert!(load(&file, &mut Partition::new(&specs)).is_err(), "a torn checkpoint is refused");
    }
}
