//! Taking a checkpoint while the pod runs: the worker copies its partition a few thousand rows
//! at a time between transactions, a helper thread syncs the file, and once the checkpoint's
//! end epoch is durable pod-wide the host publishes its floor, so every logger may delete log
//! segments below the pod's minimum floor (crate::checkpoint explains the floor).
//!
//! ```text
//!  Idle ── log grew by checkpoint_log_bytes ──► Copying: floor = min over hosts of worker_epoch;
//!    keys of every row; per step ROWS_PER_STEP rows: absent → skip, placeholder or write-locked
//!    (DRAM word, or CAT word — a shared row is refreshed from CXL first) → retry later, else
//!    (table, key, TID, value) ──► end epoch = global epoch; END frame ──► Syncing (thread:
//!    fsync, rename, fsync dir) ──► Waiting until pod durable ≥ end ──► publish floor, delete the
//!    previous checkpoint ──► Idle
//! ```
//!
//! Invariant: a row is written only while nobody holds it write-locked, so it carries a
//! committed value at least as new as every transaction that finished before the copy began.

use std::fs::File;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;

use crate::checkpoint::{checkpoint_path, checkpoints, encode_row, end_frame, rows_frame, temporary_path};
use crate::error::{PodError, Result};
use crate::host::Host;
use crate::partition::{row_flags, TableId};
use crate::region::EPOCH_IDLE;

/// Rows copied per step (one step between two transactions).
pub const ROWS_PER_STEP: usize = 2048;
/// Bytes of rows gathered before they are written as one frame.
const FRAME_BYTES: usize = 1 << 20;

/// What the checkpoint of one host is doing.
#[derive(Default)]
enum State {
    #[default]
    Idle,
    Copying(Copy),
    Syncing {
        thread: JoinHandle<Result<()>>,
        floor: u64,
        end_epoch: u64,
    },
    Waiting {
        floor: u64,
        end_epoch: u64,
    },
}

struct Copy {
    floor: u64,
    keys: Vec<(TableId, u64)>,
    at: usize,
    retry: Vec<(TableId, u64)>,
    file: File,
    body: Vec<u8>,
    rows: u64,
}

/// One host's checkpoints.
#[derive(Default)]
pub struct Checkpointer {
    state: State,
    /// Log bytes this host had appended when the last checkpoint began.
    log_bytes_at_start: u64,
    pub taken: u64,
}

impl Checkpointer {
    /// One step between transactions (a few thousand rows at most).
    pub(crate) fn step(&mut self, host: &mut Host) -> Result<()> {
        let Some(dir) = host.config.log_dir.clone() else { return Ok(()) };
        let threshold = host.config.checkpoint_log_bytes;
        self.state = match std::mem::take(&mut self.state) {
            State::Idle if threshold > 0 && host.log.bytes - self.log_bytes_at_start >= threshold => {
                self.log_bytes_at_start = host.log.bytes;
                State::Copying(begin(host, &dir)?)
            }
            State::Idle => State::Idle,
            State::Copying(mut copy) => match copy_rows(host, &mut copy)? {
                false => State::Copying(copy),
                true => finish_copy(host, copy, &dir)?,
            },
            State::Syncing { thread, floor, end_epoch } if thread.is_finished() => {
                thread.join().unwrap_or(Err(PodError::Unsupported("checkpoint sync thread panicked")))?;
                State::Waiting { floor, end_epoch }
            }
            syncing @ State::Syncing { .. } => syncing,
            State::Waiting { floor, end_epoch } if host.pod_durable_epoch() >= end_epoch => {
                host.shared().checkpoint_floor.store(floor, Ordering::Release);
                drop_older_checkpoints(&dir, host.me)?;
                self.taken += 1;
                State::Idle
            }
            waiting @ State::Waiting { .. } => waiting,
        };
        Ok(())
    }
}

/// The floor (every host's open log buffer epoch, minimum) and the keys, read now.
fn begin(host: &Host, dir: &std::path::Path) -> Result<Copy> {
    let floor = (0..host.config.hosts)
        .map(|other| host.region.host_shared(&host.layout, other).worker_epoch.load(Ordering::Acquire))
        .filter(|epoch| *epoch != EPOCH_IDLE)
        .min()
        .unwrap_or(0);
    let mut keys = Vec::new();
    for table in 0..host.partition.tables().len() {
        let table = table as TableId;
        keys.extend(host.partition.table(table).live_rows().map(|(key, _)| (table, key)));
    }
    let path = temporary_path(dir, host.me);
    let file = File::create(&path).map_err(|source| PodError::FileIo { path, source })?;
    Ok(Copy { floor, keys, at: 0, retry: Vec::new(), file, body: Vec::new(), rows: 0 })
}

/// Copies up to [`ROWS_PER_STEP`] rows; true once every row is in.
fn copy_rows(host: &mut Host, copy: &mut Copy) -> Result<bool> {
    for _ in 0..ROWS_PER_STEP {
        if copy.at == copy.keys.len() {
            if copy.retry.is_empty() {
                return Ok(true);
            }
            copy.keys = std::mem::take(&mut copy.retry);
            copy.at = 0;
            return Ok(false); // give the holders of the locked rows time to finish
        }
        let (table, key) = copy.keys[copy.at];
        copy.at += 1;
        let Some(row) = host.partition.table(table).find(key) else { continue };
        let stored = host.partition.table(table).row(row);
        let settled = if stored.is(row_flags::PLACEHOLDER) {
            false
        } else if stored.is(row_flags::MIGRATED) {
            host.refresh_owned_cat(table, row)?
        } else {
            !stored.lock.writer()
        };
        if !settled {
            copy.retry.push((table, key));
            continue;
        }
        let stored = host.partition.table(table).row(row);
        encode_row(&mut copy.body, table, key, stored.lock.tid(), &stored.data);
        copy.rows += 1;
        if copy.body.len() >= FRAME_BYTES {
            write_rows(copy)?;
        }
    }
    Ok(false)
}

fn write_rows(copy: &mut Copy) -> Result<()> {
    let mut frame = Vec::with_capacity(copy.body.len() + 32);
    rows_frame(&mut frame, &copy.body);
    copy.body.clear();
    copy.file.write_all(&frame).map_err(|source| PodError::FileIo { path: "checkpoint".into(), source })
}

/// Closes the file with its END frame; a thread syncs and renames it.
fn finish_copy(host: &Host, mut copy: Copy, dir: &std::path::Path) -> Result<State> {
    if !copy.body.is_empty() {
        write_rows(&mut copy)?;
    }
    let mut end = Vec::new();
    end_frame(&mut end, copy.rows);
    copy.file.write_all(&end).map_err(|source| PodError::FileIo { path: "checkpoint".into(), source })?;
    let end_epoch = host.region.header().global_epoch.load(Ordering::Acquire);
    let sequence = checkpoints(dir, host.me)?.last().map_or(1, |file| file.sequence + 1);
    let from = temporary_path(dir, host.me);
    let to = checkpoint_path(dir, host.me, sequence, copy.floor, end_epoch);
    let (file, directory) = (copy.file, dir.to_path_buf());
    let thread = std::thread::Builder::new()
        .name(format!("pod-checkpoint-{}", host.me))
        .spawn(move || sync_and_rename(file, from, to, directory))
        .map_err(|source| PodError::Process { what: "spawn checkpoint thread", source })?;
    Ok(State::Syncing { thread, floor: copy.floor, end_epoch })
}

fn sync_and_rename(file: File, from: PathBuf, to: PathBuf, dir: PathBuf) -> Result<()> {
    file.sync_all().map_err(|source| PodError::FileIo { path: from.clone(), source })?;
    std::fs::rename(&from, &to).map_err(|source| PodError::FileIo { path: to.clone(), source })?;
    File::open(&dir).and_then(|dir| dir.sync_all()).map_err(|source| PodError::FileIo { path: dir, source })
}

/// Keeps only the newest checkpoint (its floor is published; the older ones cover less).
fn drop_older_checkpoints(dir: &std::path::Path, host: usize) -> Result<()> {
    let mut files = checkpoints(dir, host)?;
    files.pop();
    for file in files {
        std::fs::remove_file(&file.path).map_err(|source| PodError::FileIo { path: file.path.clone(), source })?;
    }
    Ok(())
}
