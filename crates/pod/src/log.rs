//! Value (redo) logging with epoch-based group commit, one log file per host.
//!
//! ```text
//!  worker ── append records to the buffer of its epoch ── seal on epoch change ──► bounded queue
//!     │ publishes worker_epoch (epoch of its open buffer)                              │
//!  logger (thread, every epoch_len): host 0 bumps the global epoch; drain queue; write frames +
//!     marker(min(worker_epoch, global) − 1); fdatasync; publish durable_epoch
//!  ack: a transaction of epoch e is acknowledged once min over hosts of durable_epoch ≥ e
//! ```
//!
//! Only tuple changes are logged (no undo, no index or data-movement state): a write record per
//! changed tuple with its transaction id and TID, and one commit record per transaction. 2PC
//! participants log their writes as prepared (TID 0); the coordinator's commit record supplies the
//! TID. Frames carry a CRC32, so a torn tail ends the valid log; a marker says "every record of
//! an epoch ≤ m of this host is before me".
//!
//! A host's log is a sequence of segment files (`host-H.NNNNNN.log`); the logger starts a new one
//! once the current one passes `PodConfig::log_segment_bytes`, and deletes a closed segment whose frames
//! all have epochs below the pod's checkpoint floor (crate::checkpoint): bounded disk in a long
//! run. Frame epochs never decrease within a host's log, so a segment's last frame is its newest.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TryRecvError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::{PodError, Result};
use crate::partition::TableId;
use crate::region::{Layout, Region, EPOCH_IDLE};

/// A worker seals its buffer early when it grows past this.
pub const LOG_BUFFER_BYTES_MAX: usize = 1 << 20;
/// Sealed buffers queued for the logger; a full queue blocks the worker (back-pressure).
pub const LOG_QUEUE_MAX: usize = 256;
const FRAME_RECORDS: u8 = 1;
const FRAME_MARKER: u8 = 2;
const RECORD_WRITE: u8 = 1;
const RECORD_DELETE: u8 = 2;
const RECORD_COMMIT: u8 = 3;

/// Path of segment `sequence` of `host`'s log in `dir`.
pub fn segment_path(dir: &Path, host: usize, sequence: u64) -> PathBuf {
    dir.join(format!("host-{host}.{sequence:06}.log"))
}

/// `host`'s log segments in `dir`, oldest first.
pub fn segments(dir: &Path, host: usize) -> Result<Vec<(u64, PathBuf)>> {
    let prefix = format!("host-{host}.");
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => return Err(PodError::LogIo { path: dir.to_path_buf(), source }),
    };
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| PodError::LogIo { path: dir.to_path_buf(), source })?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let sequence =
            name.strip_prefix(&prefix).and_then(|rest| rest.strip_suffix(".log")).and_then(|n| n.parse().ok());
        if let Some(sequence) = sequence {
            found.push((sequence, entry.path()));
        }
    }
    found.sort();
    Ok(found)
}

/// Removes every segment of `host`'s log (a fresh start).
pub fn remove_log(dir: &Path, host: usize) -> Result<()> {
    for (_, path) in segments(dir, host)? {
        std::fs::remove_file(&path).map_err(|source| PodError::LogIo { path, source })?;
    }
    Ok(())
}

/// Where `host` records the transactions it acknowledged (`PodConfig::record_acked`).
pub fn acked_path(dir: &Path, host: usize) -> PathBuf {
    dir.join(format!("acked-{host}.ids"))
}

/// One acknowledged transaction: its id, its commit epoch, and the epoch of the log buffer
/// that holds its records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acked {
    pub gid: u64,
    pub epoch: u64,
    pub buffer_epoch: u64,
}

/// Bytes of one [`Acked`] record in the file.
pub const ACKED_BYTES: usize = 24;

impl Acked {
    pub fn encode(&self, out: &mut Vec<u8>) {
        for word in [self.gid, self.epoch, self.buffer_epoch] {
            out.extend_from_slice(&word.to_le_bytes());
        }
    }
}

/// Every record `host` wrote (a torn last record, cut by a crash mid-write, is left out).
pub fn read_acked(dir: &Path, host: usize) -> Result<Vec<Acked>> {
    let path = acked_path(dir, host);
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(source) => return Err(PodError::FileIo { path, source }),
    };
    let word = |record: &[u8], at: usize| u64::from_le_bytes(record[at..at + 8].try_into().expect("8 bytes"));
    Ok(bytes
        .chunks_exact(ACKED_BYTES)
        .map(|record| Acked { gid: word(record, 0), epoch: word(record, 8), buffer_epoch: word(record, 16) })
        .collect())
}

/// Bytes of `host`'s log on disk.
pub fn log_bytes(dir: &Path, host: usize) -> Result<u64> {
    let mut bytes = 0;
    for (_, path) in segments(dir, host)? {
        bytes += std::fs::metadata(&path).map_err(|source| PodError::LogIo { path, source })?.len();
    }
    Ok(bytes)
}

/// The worker's side: appends records to the open buffer of its epoch.
pub struct LogWriter {
    epoch: u64,
    buffer: Vec<u8>,
    sender: Option<SyncSender<(u64, Vec<u8>)>>,
    pub bytes: u64,
    pub records: u64,
}

impl LogWriter {
    /// A writer that drops everything (logging off).
    pub fn disabled() -> LogWriter {
        LogWriter { epoch: 0, buffer: Vec::new(), sender: None, bytes: 0, records: 0 }
    }

    pub fn enabled(&self) -> bool {
        self.sender.is_some()
    }

    /// The epoch of the open buffer: every record appended now goes into a frame of this epoch.
    pub fn buffer_epoch(&self) -> u64 {
        self.epoch
    }

    /// Called before each transaction with the global epoch: seals the old epoch's buffer and
    /// publishes the new epoch (after the seal, so the logger never misses a buffer).
    pub fn enter_epoch(&mut self, global_epoch: u64, region: &Region, layout: &Layout, me: usize) {
        if self.sender.is_none() || global_epoch <= self.epoch {
            return;
        }
        self.seal();
        self.epoch = global_epoch;
        region.host_shared(layout, me).worker_epoch.store(global_epoch, Ordering::Release);
    }

    pub fn write(&mut self, gid: u64, table: TableId, key: u64, tid: u64, value: Option<&[u8]>) {
        if self.sender.is_none() {
            return;
        }
        let before = self.buffer.len();
        match value {
            Some(value) => {
                self.buffer.push(RECORD_WRITE);
                self.put_header(gid, table, key, tid);
                self.buffer.extend_from_slice(&(value.len() as u32).to_le_bytes());
                self.buffer.extend_from_slice(value);
            }
            None => {
                self.buffer.push(RECORD_DELETE);
                self.put_header(gid, table, key, tid);
            }
        }
        self.account(before);
    }

    pub fn commit(&mut self, gid: u64, tid: u64) {
        if self.sender.is_none() {
            return;
        }
        let before = self.buffer.len();
        self.buffer.push(RECORD_COMMIT);
        self.buffer.extend_from_slice(&gid.to_le_bytes());
        self.buffer.extend_from_slice(&tid.to_le_bytes());
        self.account(before);
    }

    fn put_header(&mut self, gid: u64, table: TableId, key: u64, tid: u64) {
        self.buffer.extend_from_slice(&gid.to_le_bytes());
        self.buffer.push(table);
        self.buffer.extend_from_slice(&key.to_le_bytes());
        self.buffer.extend_from_slice(&tid.to_le_bytes());
    }

    fn account(&mut self, before: usize) {
        self.bytes += (self.buffer.len() - before) as u64;
        self.records += 1;
        if self.buffer.len() >= LOG_BUFFER_BYTES_MAX {
            self.seal();
        }
    }

    fn seal(&mut self) {
        if self.buffer.is_empty() {
            return;
        }
        let bytes = std::mem::take(&mut self.buffer);
        if let Some(sender) = &self.sender {
            // A closed channel means the logger failed; it reports that itself when joined.
            let _ = sender.send((self.epoch, bytes));
        }
    }

    /// Seals the last buffer and lets the logger finish (call after the pod-wide done barrier:
    /// no host commits anything any more, so the logger may declare the global epoch durable).
    pub fn finish(&mut self, region: &Region, layout: &Layout, me: usize) {
        self.seal();
        region.host_shared(layout, me).worker_epoch.store(EPOCH_IDLE, Ordering::Release);
        self.sender = None;
    }
}

/// Counters of the logger thread.
#[derive(Debug, Clone, Copy, Default)]
pub struct LoggerStats {
    pub fsyncs: u64,
    pub bytes: u64,
    /// Segments deleted because checkpoints cover them, and their bytes.
    pub segments_deleted: u64,
    pub bytes_deleted: u64,
}

/// The logger thread of one host.
pub struct Logger {
    thread: JoinHandle<Result<LoggerStats>>,
}

/// Where the logger stops itself with SIGKILL (crash tests): after `after` writes, between the
/// write and the fdatasync.
#[derive(Debug, Clone, Copy)]
pub struct FsyncCrash {
    pub after: u64,
}

impl Logger {
    /// Starts `host`'s logger on a new segment after any existing ones; host 0's logger also
    /// advances the global epoch every `epoch_len`.
    pub fn spawn(
        region: &'static Region,
        layout: Layout,
        me: usize,
        dir: &Path,
        (epoch_len, segment_bytes): (Duration, u64),
        crash: Option<FsyncCrash>,
    ) -> Result<(LogWriter, Logger)> {
        let mut closed = Vec::new();
        let mut last_marker = 0;
        for (sequence, path) in segments(dir, me)? {
            let parsed = parse_segment(&path)?;
            last_marker = last_marker.max(parsed.last_marker);
            closed.push(Segment {
                sequence,
                path,
                bytes: parsed.total_bytes,
                last_epoch: parsed.max_epoch,
                file: None,
            });
        }
        let (sender, receiver) = sync_channel(LOG_QUEUE_MAX);
        let writer = LogWriter { epoch: 0, buffer: Vec::new(), sender: Some(sender), bytes: 0, records: 0 };
        let next = closed.last().map_or(1, |segment| segment.sequence + 1);
        let mut state = LoggerState {
            region,
            layout,
            me,
            dir: dir.to_path_buf(),
            current: Segment::create(dir, me, next)?,
            closed,
            receiver,
            last_marker,
            segment_bytes,
            crash,
            stats: LoggerStats::default(),
        };
        state.mark_segment_start()?;
        let thread = std::thread::Builder::new()
            .name(format!("pod-logger-{me}"))
            .spawn(move || state.run(epoch_len))
            .map_err(|source| PodError::Process { what: "spawn logger thread", source })?;
        Ok((writer, Logger { thread }))
    }

    pub fn join(self) -> Result<LoggerStats> {
        self.thread.join().unwrap_or(Err(PodError::Unsupported("logger thread panicked")))
    }
}

/// One segment file of a host's log.
struct Segment {
    sequence: u64,
    path: PathBuf,
    bytes: u64,
    /// Highest frame epoch in it (frame epochs never decrease along a host's log).
    last_epoch: u64,
    /// Open while it is the current segment.
    file: Option<File>,
}

impl Segment {
    fn create(dir: &Path, host: usize, sequence: u64) -> Result<Segment> {
        let path = segment_path(dir, host, sequence);
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|source| PodError::LogIo { path: path.clone(), source })?;
        Ok(Segment { sequence, path, bytes: 0, last_epoch: 0, file: Some(file) })
    }
}

struct LoggerState {
    region: &'static Region,
    layout: Layout,
    me: usize,
    dir: PathBuf,
    current: Segment,
    closed: Vec<Segment>,
    receiver: Receiver<(u64, Vec<u8>)>,
    last_marker: u64,
    segment_bytes: u64,
    crash: Option<FsyncCrash>,
    stats: LoggerStats,
}

impl LoggerState {
    fn run(&mut self, epoch_len: Duration) -> Result<LoggerStats> {
        let mut next_tick = Instant::now() + epoch_len;
        loop {
            std::thread::sleep(next_tick.saturating_duration_since(Instant::now()));
            next_tick += epoch_len;
            let header = self.region.header();
            if self.me == 0 {
                header.global_epoch.fetch_add(1, Ordering::AcqRel);
            }
            if !self.tick()? {
                return Ok(self.stats);
            }
            self.rotate_and_truncate()?;
        }
    }

    /// One group commit; false once the worker has finished and everything is on disk.
    fn tick(&mut self) -> Result<bool> {
        let shared = self.region.host_shared(&self.layout, self.me);
        let worker_epoch = shared.worker_epoch.load(Ordering::Acquire);
        let global = self.region.header().global_epoch.load(Ordering::Acquire);
        let mut out = Vec::new();
        let mut finished = false;
        let mut newest = 0;
        loop {
            match self.receiver.try_recv() {
                Ok((epoch, records)) => {
                    push_frame(&mut out, epoch, FRAME_RECORDS, &records);
                    newest = newest.max(epoch);
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    finished = true;
                    break;
                }
            }
        }
        // After the worker finished (pod-wide done barrier) nothing commits any more: the global
        // epoch itself is complete — read again now, since the worker may have committed in a
        // newer epoch between the first read and its farewell (its last commit would otherwise
        // never become durable). Otherwise the worker may still add to its open epoch.
        let durable = if finished {
            self.region.header().global_epoch.load(Ordering::Acquire)
        } else {
            worker_epoch.min(global).saturating_sub(1)
        };
        if durable > self.last_marker {
            push_frame(&mut out, durable, FRAME_MARKER, &durable.to_le_bytes());
            newest = newest.max(durable);
        }
        if !out.is_empty() {
            self.write_and_sync(&out, newest)?;
        }
        if durable > self.last_marker {
            self.last_marker = durable;
            shared.durable_epoch.store(durable, Ordering::Release);
        }
        Ok(!finished)
    }

    /// Every segment opens with the newest marker, so deleting older segments never loses it.
    fn mark_segment_start(&mut self) -> Result<()> {
        if self.last_marker == 0 {
            return Ok(());
        }
        let mut out = Vec::new();
        push_frame(&mut out, self.last_marker, FRAME_MARKER, &self.last_marker.to_le_bytes());
        let newest = self.last_marker;
        self.write_and_sync(&out, newest)
    }

    /// Starts a new segment once the current one is full, and deletes closed segments the pod's
    /// checkpoints cover (every frame's epoch below every host's checkpoint floor).
    fn rotate_and_truncate(&mut self) -> Result<()> {
        if self.current.bytes >= self.segment_bytes {
            let next = Segment::create(&self.dir, self.me, self.current.sequence + 1)?;
            let mut full = std::mem::replace(&mut self.current, next);
            full.file = None;
            self.closed.push(full);
            self.mark_segment_start()?;
        }
        let floor = (0..self.layout.hosts)
            .map(|host| self.region.host_shared(&self.layout, host).checkpoint_floor.load(Ordering::Acquire))
            .min()
            .unwrap_or(0);
        while self.closed.first().is_some_and(|segment| segment.last_epoch < floor) {
            let segment = self.closed.remove(0);
            std::fs::remove_file(&segment.path)
                .map_err(|source| PodError::LogIo { path: segment.path.clone(), source })?;
            self.stats.segments_deleted += 1;
            self.stats.bytes_deleted += segment.bytes;
        }
        Ok(())
    }

    fn write_and_sync(&mut self, bytes: &[u8], newest_epoch: u64) -> Result<()> {
        let path = self.current.path.clone();
        let file = self.current.file.as_mut().expect("the current segment is open");
        file.write_all(bytes).map_err(|source| PodError::LogIo { path: path.clone(), source })?;
        if let Some(crash) = &mut self.crash {
            crash.after = crash.after.saturating_sub(1);
            if crash.after == 0 {
                crate::fault::crash_now();
            }
        }
        file.sync_data().map_err(|source| PodError::LogIo { path, source })?;
        self.current.bytes += bytes.len() as u64;
        self.current.last_epoch = self.current.last_epoch.max(newest_epoch);
        self.stats.fsyncs += 1;
        self.stats.bytes += bytes.len() as u64;
        Ok(())
    }
}

/// Appends a frame `[len u32 | crc u32 | epoch u64 | kind u8 | body]` (the CRC covers epoch, kind
/// and body).
pub(crate) fn push_frame(out: &mut Vec<u8>, epoch: u64, kind: u8, body: &[u8]) {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&epoch.to_le_bytes());
    hasher.update(&[kind]);
    hasher.update(body);
    out.extend_from_slice(&((body.len() + 9) as u32).to_le_bytes());
    out.extend_from_slice(&hasher.finalize().to_le_bytes());
    out.extend_from_slice(&epoch.to_le_bytes());
    out.push(kind);
    out.extend_from_slice(body);
}

/// One logged record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// `value: None` is a delete; `tid` 0 means "prepared, TID in the commit record".
    Write {
        gid: u64,
        table: TableId,
        key: u64,
        tid: u64,
        value: Option<Vec<u8>>,
    },
    Commit {
        gid: u64,
        tid: u64,
    },
}

/// A log file up to its first invalid frame.
#[derive(Debug, Default)]
pub struct ParsedLog {
    /// (buffer epoch, records) per records frame, in file order.
    pub buffers: Vec<(u64, Vec<Record>)>,
    /// Highest marker in the valid prefix (0: none).
    pub last_marker: u64,
    /// Highest epoch mentioned anywhere in the valid prefix (buffers, markers, commit TIDs).
    pub max_epoch: u64,
    pub valid_bytes: u64,
    pub total_bytes: u64,
}

/// Reads `host`'s whole log (every segment, oldest first) up to its first invalid frame.
pub fn parse_log(dir: &Path, host: usize) -> Result<ParsedLog> {
    let mut log = ParsedLog::default();
    for (_, path) in segments(dir, host)? {
        let segment = parse_segment(&path)?;
        let complete = segment.valid_bytes == segment.total_bytes;
        log.buffers.extend(segment.buffers);
        log.last_marker = log.last_marker.max(segment.last_marker);
        log.max_epoch = log.max_epoch.max(segment.max_epoch);
        log.valid_bytes += segment.valid_bytes;
        log.total_bytes += segment.total_bytes;
        if !complete {
            break; // a torn segment ends the log: nothing after it was acknowledged
        }
    }
    Ok(log)
}

/// Reads one segment file; a missing file is an empty segment.
pub fn parse_segment(path: &Path) -> Result<ParsedLog> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(source) => return Err(PodError::LogIo { path: path.to_path_buf(), source }),
    };
    let mut parsed = ParsedLog { total_bytes: bytes.len() as u64, ..ParsedLog::default() };
    let mut at = 0usize;
    while let Some((epoch, kind, body, next)) = next_frame(&bytes, at) {
        match kind {
            FRAME_RECORDS => match parse_records(body) {
                Some(records) => {
                    for record in &records {
                        if let Record::Commit { tid, .. } = record {
                            parsed.max_epoch = parsed.max_epoch.max(tid >> 32);
                        }
                    }
                    parsed.buffers.push((epoch, records));
                }
                None => break,
            },
            FRAME_MARKER => parsed.last_marker = parsed.last_marker.max(epoch),
            _ => break,
        }
        parsed.max_epoch = parsed.max_epoch.max(epoch);
        at = next;
    }
    parsed.valid_bytes = at as u64;
    Ok(parsed)
}

/// The frame at `at`: (epoch, kind, body, where the next one starts); `None` if torn or corrupt.
pub(crate) fn next_frame(bytes: &[u8], at: usize) -> Option<(u64, u8, &[u8], usize)> {
    let header = bytes.get(at..at + 8)?;
    let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
    let crc = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
    if len < 9 {
        return None;
    }
    let rest = bytes.get(at + 8..at + 8 + len)?;
    if crc32fast::hash(rest) != crc {
        return None;
    }
    let mut epoch = [0u8; 8];
    epoch.copy_from_slice(&rest[..8]);
    Some((u64::from_le_bytes(epoch), rest[8], &rest[9..], at + 8 + len))
}

fn parse_records(mut body: &[u8]) -> Option<Vec<Record>> {
    fn take<'a>(body: &mut &'a [u8], len: usize) -> Option<&'a [u8]> {
        let (head, tail) = (body.get(..len)?, body.get(len..)?);
        *body = tail;
        Some(head)
    }
    fn u64_of(body: &mut &[u8]) -> Option<u64> {
        let mut raw = [0u8; 8];
        raw.copy_from_slice(take(body, 8)?);
        Some(u64::from_le_bytes(raw))
    }
    let mut records = Vec::new();
    while !body.is_empty() {
        let tag = take(&mut body, 1)?[0];
        let gid = u64_of(&mut body)?;
        let record = match tag {
            RECORD_COMMIT => Record::Commit { gid, tid: u64_of(&mut body)? },
            RECORD_WRITE | RECORD_DELETE => {
                let table = take(&mut body, 1)?[0];
                let (key, tid) = (u64_of(&mut body)?, u64_of(&mut body)?);
                let value = if tag == RECORD_WRITE {
                    let len = take(&mut body, 4)?;
                    let len = u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
                    Some(take(&mut body, len)?.to_vec())
                } else {
                    None
                };
                Record::Write { gid, table, key, tid, value }
            }
            _ => return None,
        };
        records.push(record);
    }
    Some(records)
}

/// Rewrites `host`'s log keeping only `buffers`' records, ending with a marker at `durable`
/// (recovery: drops everything not committed within the pod-wide durable epoch, so a later
/// recovery can never resurrect it): one new segment after the old ones, written to a temporary
/// file, synced and renamed, then the old segments are removed.
pub fn rewrite_log(dir: &Path, host: usize, buffers: &[(u64, Vec<Record>)], durable: u64) -> Result<()> {
    let old = segments(dir, host)?;
    let sequence = old.last().map_or(1, |(sequence, _)| sequence + 1);
    write_segment(&segment_path(dir, host, sequence), buffers, durable)?;
    for (_, path) in old {
        std::fs::remove_file(&path).map_err(|source| PodError::LogIo { path, source })?;
    }
    Ok(())
}

fn write_segment(path: &Path, buffers: &[(u64, Vec<Record>)], durable: u64) -> Result<()> {
    let mut out = Vec::new();
    for (epoch, records) in buffers {
        let mut body = Vec::new();
        for record in records {
            encode_record(&mut body, record);
        }
        if !body.is_empty() {
            push_frame(&mut out, *epoch, FRAME_RECORDS, &body);
        }
    }
    push_frame(&mut out, durable, FRAME_MARKER, &durable.to_le_bytes());
    let temporary = path.with_extension("log.rewrite");
    let io = |source| PodError::LogIo { path: temporary.clone(), source };
    let file = File::create(&temporary).map_err(io)?;
    file.write_all_at(&out, 0).map_err(io)?;
    file.sync_all().map_err(io)?;
    std::fs::rename(&temporary, path).map_err(|source| PodError::LogIo { path: path.to_path_buf(), source })?;
    if let Some(dir) = path.parent() {
        if let Ok(dir) = File::open(dir) {
            let _ = dir.sync_all();
        }
    }
    Ok(())
}

fn encode_record(out: &mut Vec<u8>, record: &Record) {
    match record {
        Record::Commit { gid, tid } => {
            out.push(RECORD_COMMIT);
            out.extend_from_slice(&gid.to_le_bytes());
            out.extend_from_slice(&tid.to_le_bytes());
        }
        Record::Write { gid, table, key, tid, value } => {
            out.push(if value.is_some() { RECORD_WRITE } else { RECORD_DELETE });
            out.extend_from_slice(&gid.to_le_bytes());
            out.push(*table);
            out.extend_from_slice(&key.to_le_bytes());
            out.extend_from_slice(&tid.to_le_bytes());
            if let Some(value) = value {
                out.extend_from_slice(&(value.len() as u32).to_le_bytes());
                out.extend_from_slice(value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_a_torn_tail_ends_the_log() {
        // Goal: recovery reads back what was written and stops at the first damaged frame. Method:
        // write two record frames and a marker, then append half a frame and a flipped byte.
        let dir = tempfile::tempdir().expect("tempdir");
        let records = vec![
            Record::Write { gid: 1, table: 2, key: 3, tid: 5 << 32, value: Some(vec![7; 40]) },
            Record::Write { gid: 1, table: 2, key: 4, tid: 5 << 32, value: None },
            Record::Commit { gid: 1, tid: 5 << 32 },
        ];
        rewrite_log(dir.path(), 0, &[(5, records.clone()), (6, vec![Record::Commit { gid: 9, tid: 6 << 32 }])], 6)
            .expect("write");
        let path = segments(dir.path(), 0).expect("segments").pop().expect("one segment").1;
        let clean = parse_log(dir.path(), 0).expect("parse");
        assert_eq!(clean.buffers[0], (5, records));
        assert_eq!(clean.last_marker, 6);
        assert_eq!(clean.valid_bytes, clean.total_bytes);
        let mut bytes = std::fs::read(&path).expect("read");
        let mut torn = Vec::new();
        push_frame(&mut torn, 7, FRAME_MARKER, &7u64.to_le_bytes());
        bytes.extend_from_slice(&torn[..torn.len() / 2]);
        std::fs::write(&path, &bytes).expect("write");
        let parsed = parse_log(dir.path(), 0).expect("parse");
        assert_eq!(parsed.last_marker, 6, "half a marker is no marker");
        assert_eq!(parsed.valid_bytes, clean.valid_bytes);
        bytes[20] ^= 0xff;
        std::fs::write(&path, &bytes).expect("write");
        assert!(parse_log(dir.path(), 0).expect("parse").buffers.is_empty(), "a corrupt first frame ends the log");
    }
}
