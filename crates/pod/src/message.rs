//! Messages between hosts, encoded little-endian into ring slots. Sans-I/O: values in, bytes out,
//! and a decoder that names what is wrong with a malformed payload.
//!
//! Tigon-style hosts only exchange `Migrate` (move a tuple into CXL), `MigrateScan` (move a key
//! range plus its next key in, read-locked for the requester), `RemoteInsert` (a placeholder and
//! its next key moved in, write-locked for the requester) with their replies, and the one-way
//! `InsertDone` and `RemoteDelete`; the DS2PL+ and
//! OCC+ baselines read and lock remote tuples by message and commit with two-phase commit.

use crate::error::{PodError, Result};
use crate::partition::TableId;

/// How a baseline accesses a remote tuple.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessMode {
    /// OCC: read value and TID, no lock.
    ReadNoLock = 0,
    ReadLock = 1,
    WriteLock = 2,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MigrateOutcome {
    /// The tuple is a CAT at this node, pinned once on the requester's behalf.
    Moved {
        node: u64,
    },
    NotFound,
    /// The owner's HWcc budget (or SWcc arena) has no room even after eviction: FAIL_OOM.
    OutOfMemory,
}

/// Most keys one migration request carries (a phase asks for more in several messages).
pub const MIGRATE_KEYS_MAX: usize = 256;
/// Most tuples one access request carries (a phase asks for more in several messages).
pub const ACCESS_ITEMS_MAX: usize = 256;

/// One tuple a baseline's phase reads or locks at its owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AccessItem {
    pub table: TableId,
    pub key: u64,
    pub mode: AccessMode,
}

/// Most rows (range plus next key) one remote scan may move in: bounds the reply's size.
pub const SCAN_ROWS_MAX: usize = 64;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScanOutcome {
    /// `(key, node)` of every row in the range, then the next key's: CATs read-locked and pinned
    /// once on the requester's behalf, contiguous in the owner's partition.
    Locked { rows: Vec<(u64, u64)>, next: Option<(u64, u64)> },
    /// A row of the run is being inserted or is write-locked (NO_WAIT).
    Conflict,
    /// No room in CXL for the run.
    OutOfMemory,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InsertOutcome {
    /// The placeholder's CAT `node` and the next key's `next_node`, both write-locked and pinned
    /// for the requester; the owner keeps one more pin on `node` until `InsertDone`.
    Locked {
        node: u64,
        next_key: u64,
        next_node: u64,
    },
    /// The key is present: the insert is the workload's error.
    Exists,
    /// The key or its next key is locked or being inserted (NO_WAIT).
    Conflict,
    OutOfMemory,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccessOutcome {
    Granted { tid: u64, value: Vec<u8> },
    Conflict,
    NotFound,
}

/// One tuple change carried by a 2PC prepare.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteWrite {
    pub table: TableId,
    pub key: u64,
    /// `None` deletes.
    pub value: Option<Vec<u8>>,
}

/// A read an OCC participant must validate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadCheck {
    pub table: TableId,
    pub key: u64,
    pub tid: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// Tigon's DATA_MIGRATION_REQUEST for every key of a phase this owner holds.
    Migrate {
        request: u32,
        keys: Vec<(TableId, u64)>,
    },
    /// One outcome per key, in order.
    MigrateReply {
        request: u32,
        outcomes: Vec<MigrateOutcome>,
    },
    /// Tigon's DATA_MIGRATION_REQUEST_FOR_SCAN: keys in `[low, high]` (at most `limit`) and the
    /// key after them (next-key locking).
    MigrateScan {
        request: u32,
        table: TableId,
        low: u64,
        high: u64,
        limit: u32,
    },
    MigrateScanReply {
        request: u32,
        outcome: ScanOutcome,
    },
    /// Tigon's REMOTE_INSERT_REQUEST: insert a placeholder for `key` and lock it and its next key.
    RemoteInsert {
        request: u32,
        table: TableId,
        key: u64,
    },
    RemoteInsertReply {
        request: u32,
        outcome: InsertOutcome,
    },
    /// One-way: the remote insert of `key` committed (the placeholder becomes the row) or aborted
    /// (the owner removes it); either way the owner drops its pin.
    InsertDone {
        table: TableId,
        key: u64,
        committed: bool,
    },
    /// One-way, Tigon's REMOTE_DELETE_REQUEST: a committed transaction deleted `key`, whose CAT
    /// it left write-locked; the owner removes the row.
    RemoteDelete {
        table: TableId,
        key: u64,
    },
    /// A baseline phase's reads and locks of this owner's tuples for transaction `gid`.
    Access {
        request: u32,
        gid: u64,
        items: Vec<AccessItem>,
    },
    /// One outcome per item, in order.
    AccessReply {
        request: u32,
        outcomes: Vec<AccessOutcome>,
    },
    /// OCC round 1: write-lock these keys for `gid`.
    Lock {
        request: u32,
        gid: u64,
        keys: Vec<(TableId, u64)>,
    },
    /// Whether all were locked, and the highest TID among them.
    LockReply {
        request: u32,
        ok: bool,
        max_tid: u64,
    },
    /// Validate reads (OCC) and log the writes as prepared (both baselines).
    Prepare {
        request: u32,
        gid: u64,
        writes: Vec<RemoteWrite>,
        reads: Vec<ReadCheck>,
    },
    /// `epoch`: the participant's log epoch holding the prepare records.
    PrepareReply {
        request: u32,
        ok: bool,
        epoch: u64,
    },
    /// Second phase: apply the prepared writes with `tid` (or drop them) and release every lock
    /// `gid` holds here. A commit is acknowledged with `Decided` (classic 2PC's second round);
    /// `request` 0 asks for no reply (aborts, and releasing read-only participants).
    Decide {
        request: u32,
        gid: u64,
        commit: bool,
        tid: u64,
    },
    Decided {
        request: u32,
    },
    Ping {
        request: u32,
    },
    Pong {
        request: u32,
    },
}

/// What a host knows about the pod that bounds the fields of a message: a message that
/// decodes but names a table that does not exist, a CAT node outside the HWcc arena, or a value
/// of the wrong size is as malformed as one that does not decode.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Row size of each table, by table id.
    pub row_bytes: Vec<usize>,
    /// The HWcc arena (every CAT node lies inside, on a node boundary).
    pub hwcc: std::ops::Range<u64>,
    pub node_bytes: u64,
}

impl Limits {
    fn table(&self, table: TableId) -> std::result::Result<(), &'static str> {
        match usize::from(table) < self.row_bytes.len() {
            true => Ok(()),
            false => Err("no such table"),
        }
    }

    fn node(&self, node: u64) -> std::result::Result<(), &'static str> {
        match self.hwcc.contains(&node) && (node - self.hwcc.start).is_multiple_of(self.node_bytes) {
            true => Ok(()),
            false => Err("CAT node outside the HWcc arena"),
        }
    }

    fn value(&self, table: TableId, value: &[u8]) -> std::result::Result<(), &'static str> {
        self.table(table)?;
        match value.len() == self.row_bytes[usize::from(table)] {
            true => Ok(()),
            false => Err("value of another size than its table's rows"),
        }
    }
}

impl Message {
    /// Checks every field against the pod's limits (see [`Limits`]). Values in access replies
    /// carry no table; their requester checks them against what it asked for.
    pub fn check(&self, limits: &Limits) -> std::result::Result<(), &'static str> {
        match self {
            Message::Migrate { keys, .. } => keys.iter().try_for_each(|(table, _)| limits.table(*table)),
            Message::MigrateReply { outcomes, .. } => outcomes.iter().try_for_each(|outcome| match outcome {
                MigrateOutcome::Moved { node } => limits.node(*node),
                _ => Ok(()),
            }),
            Message::MigrateScan { table, limit, .. } => match *limit as usize {
                1..SCAN_ROWS_MAX => limits.table(*table),
                _ => Err("scan limit out of range"),
            },
            Message::MigrateScanReply { outcome: ScanOutcome::Locked { rows, next }, .. } => {
                rows.iter().chain(next.iter()).try_for_each(|(_, node)| limits.node(*node))
            }
            Message::RemoteInsert { table, .. }
            | Message::InsertDone { table, .. }
            | Message::RemoteDelete { table, .. } => limits.table(*table),
            Message::RemoteInsertReply { outcome: InsertOutcome::Locked { node, next_node, .. }, .. } => {
                limits.node(*node)?;
                if *next_node != 0 {
                    limits.node(*next_node)?;
                }
                Ok(())
            }
            Message::Access { items, .. } => items.iter().try_for_each(|item| limits.table(item.table)),
            Message::Lock { keys, .. } => keys.iter().try_for_each(|(table, _)| limits.table(*table)),
            Message::Prepare { writes, reads, .. } => {
                writes.iter().try_for_each(|write| match &write.value {
                    Some(value) => limits.value(write.table, value),
                    None => limits.table(write.table),
                })?;
                reads.iter().try_for_each(|read| limits.table(read.table))
            }
            _ => Ok(()),
        }
    }

    /// The request id a reply answers.
    pub fn reply_to(&self) -> Option<u32> {
        match self {
            Message::MigrateReply { request, .. }
            | Message::MigrateScanReply { request, .. }
            | Message::RemoteInsertReply { request, .. }
            | Message::AccessReply { request, .. }
            | Message::LockReply { request, .. }
            | Message::PrepareReply { request, .. }
            | Message::Decided { request }
            | Message::Pong { request } => Some(*request),
            _ => None,
        }
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        out.clear();
        let mut put = Put(out);
        match self {
            Message::Migrate { request, keys } => {
                put.u8(1).u32(*request).u32(keys.len() as u32);
                for (table, key) in keys {
                    put.u8(*table).u64(*key);
                }
            }
            Message::MigrateReply { request, outcomes } => {
                put.u8(2).u32(*request).u32(outcomes.len() as u32);
                for outcome in outcomes {
                    match outcome {
                        MigrateOutcome::Moved { node } => put.u8(0).u64(*node),
                        MigrateOutcome::NotFound => put.u8(1),
                        MigrateOutcome::OutOfMemory => put.u8(2),
                    };
                }
            }
            Message::MigrateScan { request, table, low, high, limit } => {
                put.u8(13).u32(*request).u8(*table).u64(*low).u64(*high).u32(*limit);
            }
            Message::MigrateScanReply { request, outcome } => encode_scan_reply(&mut put, *request, outcome),
            Message::RemoteInsert { request, table, key } => {
                put.u8(15).u32(*request).u8(*table).u64(*key);
            }
            Message::RemoteInsertReply { request, outcome } => encode_insert_reply(&mut put, *request, outcome),
            Message::InsertDone { table, key, committed } => {
                put.u8(17).u8(*table).u64(*key).u8(u8::from(*committed));
            }
            Message::RemoteDelete { table, key } => {
                put.u8(18).u8(*table).u64(*key);
            }
            Message::Access { request, gid, items } => {
                put.u8(3).u32(*request).u64(*gid).u32(items.len() as u32);
                for item in items {
                    put.u8(item.table).u64(item.key).u8(item.mode as u8);
                }
            }
            Message::AccessReply { request, outcomes } => {
                put.u8(4).u32(*request).u32(outcomes.len() as u32);
                for outcome in outcomes {
                    match outcome {
                        AccessOutcome::Granted { tid, value } => put.u8(0).u64(*tid).bytes(value),
                        AccessOutcome::Conflict => put.u8(1),
                        AccessOutcome::NotFound => put.u8(2),
                    };
                }
            }
            Message::Lock { request, gid, keys } => {
                put.u8(5).u32(*request).u64(*gid).u32(keys.len() as u32);
                for (table, key) in keys {
                    put.u8(*table).u64(*key);
                }
            }
            Message::LockReply { request, ok, max_tid } => {
                put.u8(6).u32(*request).u8(u8::from(*ok)).u64(*max_tid);
            }
            Message::Prepare { request, gid, writes, reads } => encode_prepare(&mut put, *request, *gid, writes, reads),
            Message::PrepareReply { request, ok, epoch } => {
                put.u8(8).u32(*request).u8(u8::from(*ok)).u64(*epoch);
            }
            Message::Decide { request, gid, commit, tid } => {
                put.u8(9).u32(*request).u64(*gid).u8(u8::from(*commit)).u64(*tid);
            }
            Message::Decided { request } => {
                put.u8(12).u32(*request);
            }
            Message::Ping { request } => {
                put.u8(10).u32(*request);
            }
            Message::Pong { request } => {
                put.u8(11).u32(*request);
            }
        }
    }

    pub fn decode(from: usize, bytes: &[u8]) -> Result<Message> {
        let mut get = Get { bytes, at: 0, from };
        let message = match get.u8()? {
            1 => {
                let (request, count) = (get.u32()?, get.bounded_count(MIGRATE_KEYS_MAX)?);
                let keys = (0..count).map(|_| Ok((get.u8()?, get.u64()?))).collect::<Result<_>>()?;
                Message::Migrate { request, keys }
            }
            2 => {
                let (request, count) = (get.u32()?, get.bounded_count(MIGRATE_KEYS_MAX)?);
                let outcomes = (0..count).map(|_| decode_migrate_outcome(&mut get)).collect::<Result<_>>()?;
                Message::MigrateReply { request, outcomes }
            }
            3 => {
                let (request, gid, count) = (get.u32()?, get.u64()?, get.bounded_count(ACCESS_ITEMS_MAX)?);
                let items = (0..count).map(|_| decode_access_item(&mut get)).collect::<Result<_>>()?;
                Message::Access { request, gid, items }
            }
            4 => {
                let (request, count) = (get.u32()?, get.bounded_count(ACCESS_ITEMS_MAX)?);
                let outcomes = (0..count).map(|_| decode_access_outcome(&mut get)).collect::<Result<_>>()?;
                Message::AccessReply { request, outcomes }
            }
            5 => {
                let (request, gid, count) = (get.u32()?, get.u64()?, get.count()?);
                let keys = (0..count).map(|_| Ok((get.u8()?, get.u64()?))).collect::<Result<_>>()?;
                Message::Lock { request, gid, keys }
            }
            6 => Message::LockReply { request: get.u32()?, ok: get.bool()?, max_tid: get.u64()? },
            7 => decode_prepare(&mut get)?,
            8 => Message::PrepareReply { request: get.u32()?, ok: get.bool()?, epoch: get.u64()? },
            9 => Message::Decide { request: get.u32()?, gid: get.u64()?, commit: get.bool()?, tid: get.u64()? },
            12 => Message::Decided { request: get.u32()? },
            13 => Message::MigrateScan {
                request: get.u32()?,
                table: get.u8()?,
                low: get.u64()?,
                high: get.u64()?,
                limit: get.u32()?,
            },
            14 => decode_scan_reply(&mut get)?,
            15 => Message::RemoteInsert { request: get.u32()?, table: get.u8()?, key: get.u64()? },
            16 => decode_insert_reply(&mut get)?,
            17 => Message::InsertDone { table: get.u8()?, key: get.u64()?, committed: get.bool()? },
            18 => Message::RemoteDelete { table: get.u8()?, key: get.u64()? },
            10 => Message::Ping { request: get.u32()? },
            11 => Message::Pong { request: get.u32()? },
            _ => return Err(get.bad("message kind")),
        };
        if get.at != bytes.len() {
            return Err(get.bad("trailing bytes"));
        }
        Ok(message)
    }
}

fn decode_migrate_outcome(get: &mut Get<'_>) -> Result<MigrateOutcome> {
    Ok(match get.u8()? {
        0 => MigrateOutcome::Moved { node: get.u64()? },
        1 => MigrateOutcome::NotFound,
        2 => MigrateOutcome::OutOfMemory,
        _ => return Err(get.bad("migrate outcome")),
    })
}

fn decode_access_item(get: &mut Get<'_>) -> Result<AccessItem> {
    let (table, key) = (get.u8()?, get.u64()?);
    let mode = match get.u8()? {
        0 => AccessMode::ReadNoLock,
        1 => AccessMode::ReadLock,
        2 => AccessMode::WriteLock,
        _ => return Err(get.bad("access mode")),
    };
    Ok(AccessItem { table, key, mode })
}

fn decode_access_outcome(get: &mut Get<'_>) -> Result<AccessOutcome> {
    Ok(match get.u8()? {
        0 => AccessOutcome::Granted { tid: get.u64()?, value: get.bytes()? },
        1 => AccessOutcome::Conflict,
        2 => AccessOutcome::NotFound,
        _ => return Err(get.bad("access outcome")),
    })
}

fn encode_scan_reply(put: &mut Put<'_>, request: u32, outcome: &ScanOutcome) {
    put.u8(14).u32(request);
    match outcome {
        ScanOutcome::Locked { rows, next } => {
            put.u8(0).u32(rows.len() as u32);
            for (key, node) in rows {
                put.u64(*key).u64(*node);
            }
            match next {
                Some((key, node)) => put.u8(1).u64(*key).u64(*node),
                None => put.u8(0),
            };
        }
        ScanOutcome::Conflict => {
            put.u8(1);
        }
        ScanOutcome::OutOfMemory => {
            put.u8(2);
        }
    }
}

fn decode_scan_reply(get: &mut Get<'_>) -> Result<Message> {
    let request = get.u32()?;
    let outcome = match get.u8()? {
        0 => {
            let count = get.count()?;
            if count > SCAN_ROWS_MAX {
                return Err(get.bad("scan reply rows"));
            }
            let rows = (0..count).map(|_| Ok((get.u64()?, get.u64()?))).collect::<Result<_>>()?;
            let next = match get.u8()? {
                0 => None,
                1 => Some((get.u64()?, get.u64()?)),
                _ => return Err(get.bad("scan reply next key")),
            };
            ScanOutcome::Locked { rows, next }
        }
        1 => ScanOutcome::Conflict,
        2 => ScanOutcome::OutOfMemory,
        _ => return Err(get.bad("scan outcome")),
    };
    Ok(Message::MigrateScanReply { request, outcome })
}

fn encode_insert_reply(put: &mut Put<'_>, request: u32, outcome: &InsertOutcome) {
    put.u8(16).u32(request);
    match outcome {
        InsertOutcome::Locked { node, next_key, next_node } => put.u8(0).u64(*node).u64(*next_key).u64(*next_node),
        InsertOutcome::Exists => put.u8(1),
        InsertOutcome::Conflict => put.u8(2),
        InsertOutcome::OutOfMemory => put.u8(3),
    };
}

fn decode_insert_reply(get: &mut Get<'_>) -> Result<Message> {
    let request = get.u32()?;
    let outcome = match get.u8()? {
        0 => InsertOutcome::Locked { node: get.u64()?, next_key: get.u64()?, next_node: get.u64()? },
        1 => InsertOutcome::Exists,
        2 => InsertOutcome::Conflict,
        3 => InsertOutcome::OutOfMemory,
        _ => return Err(get.bad("insert outcome")),
    };
    Ok(Message::RemoteInsertReply { request, outcome })
}

fn encode_prepare(put: &mut Put<'_>, request: u32, gid: u64, writes: &[RemoteWrite], reads: &[ReadCheck]) {
    put.u8(7).u32(request).u64(gid).u32(writes.len() as u32);
    for write in writes {
        put.u8(write.table).u64(write.key);
        match &write.value {
            Some(value) => put.u8(1).bytes(value),
            None => put.u8(0),
        };
    }
    put.u32(reads.len() as u32);
    for read in reads {
        put.u8(read.table).u64(read.key).u64(read.tid);
    }
}

fn decode_prepare(get: &mut Get<'_>) -> Result<Message> {
    let (request, gid, count) = (get.u32()?, get.u64()?, get.count()?);
    let mut writes = Vec::with_capacity(count);
    for _ in 0..count {
        let (table, key) = (get.u8()?, get.u64()?);
        let value = match get.u8()? {
            1 => Some(get.bytes()?),
            0 => None,
            _ => return Err(get.bad("write kind")),
        };
        writes.push(RemoteWrite { table, key, value });
    }
    let count = get.count()?;
    let reads = (0..count)
        .map(|_| Ok(ReadCheck { table: get.u8()?, key: get.u64()?, tid: get.u64()? }))
        .collect::<Result<_>>()?;
    Ok(Message::Prepare { request, gid, writes, reads })
}

struct Put<'a>(&'a mut Vec<u8>);

impl Put<'_> {
    fn u8(&mut self, value: u8) -> &mut Self {
        self.0.push(value);
        self
    }
    fn u32(&mut self, value: u32) -> &mut Self {
        self.0.extend_from_slice(&value.to_le_bytes());
        self
    }
    fn u64(&mut self, value: u64) -> &mut Self {
        self.0.extend_from_slice(&value.to_le_bytes());
        self
    }
    fn bytes(&mut self, value: &[u8]) -> &mut Self {
        self.u32(value.len() as u32);
        self.0.extend_from_slice(value);
        self
    }
}

struct Get<'a> {
    bytes: &'a [u8],
    at: usize,
    from: usize,
}

impl Get<'_> {
    fn bad(&self, detail: &'static str) -> PodError {
        PodError::BadMessage { from: self.from, detail }
    }
    fn take(&mut self, len: usize) -> Result<&[u8]> {
        if self.bytes.len() - self.at < len {
            return Err(self.bad("truncated"));
        }
        self.at += len;
        Ok(&self.bytes[self.at - len..self.at])
    }
    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    /// A flag: exactly 0 or 1 (any other byte is malformed, so every message has one encoding).
    fn bool(&mut self) -> Result<bool> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(self.bad("flag other than 0 or 1")),
        }
    }
    fn u32(&mut self) -> Result<u32> {
        let bytes = self.take(4)?;
        Ok(u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
    }
    fn u64(&mut self) -> Result<u64> {
        let mut raw = [0u8; 8];
        raw.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(raw))
    }
    /// A count of items that must each take at least one byte of what is left.
    fn count(&mut self) -> Result<usize> {
        let count = self.u32()? as usize;
        if count > self.bytes.len() - self.at {
            return Err(self.bad("count larger than the payload"));
        }
        Ok(count)
    }
    /// A count of items, refused above `max` (a bound of the protocol, not only of the payload).
    fn bounded_count(&mut self, max: usize) -> Result<usize> {
        let count = self.count()?;
        if count > max {
            return Err(self.bad("more items than the protocol allows"));
        }
        Ok(count)
    }
    fn bytes(&mut self) -> Result<Vec<u8>> {
        let len = self.u32()? as usize;
        Ok(self.take(len)?.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples() -> Vec<Message> {
        vec![
            Message::Migrate { request: 1, keys: vec![(2, 3), (0, 9)] },
            Message::MigrateReply {
                request: 1,
                outcomes: vec![MigrateOutcome::Moved { node: 0x4000 }, MigrateOutcome::NotFound],
            },
            Message::MigrateReply { request: 1, outcomes: vec![MigrateOutcome::OutOfMemory] },
            Message::Access {
                request: 9,
                gid: 77,
                items: vec![
                    AccessItem { table: 1, key: 5, mode: AccessMode::WriteLock },
                    AccessItem { table: 0, key: 6, mode: AccessMode::ReadNoLock },
                ],
            },
            Message::AccessReply {
                request: 9,
                outcomes: vec![AccessOutcome::Granted { tid: 8, value: vec![1, 2, 3] }, AccessOutcome::NotFound],
            },
            Message::AccessReply { request: 9, outcomes: vec![AccessOutcome::Conflict] },
            Message::Lock { request: 4, gid: 6, keys: vec![(1, 2), (3, 4)] },
            Message::LockReply { request: 4, ok: true, max_tid: 99 },
            Message::Prepare {
                request: 3,
                gid: 11,
                writes: vec![
                    RemoteWrite { table: 0, key: 1, value: Some(vec![9; 10]) },
                    RemoteWrite { table: 0, key: 2, value: None },
                ],
                reads: vec![ReadCheck { table: 1, key: 2, tid: 3 }],
            },
            Message::PrepareReply { request: 3, ok: false, epoch: 12 },
            Message::Decide { request: 5, gid: 11, commit: true, tid: 1 << 32 },
            Message::Decided { request: 5 },
            Message::Ping { request: 0 },
            Message::Pong { request: 0 },
            Message::MigrateScan { request: 7, table: 3, low: 10, high: 20, limit: 5 },
            Message::MigrateScanReply {
                request: 7,
                outcome: ScanOutcome::Locked { rows: vec![(10, 0x40), (12, 0x80)], next: Some((u64::MAX, 0xc0)) },
            },
            Message::MigrateScanReply { request: 7, outcome: ScanOutcome::Locked { rows: vec![], next: None } },
            Message::MigrateScanReply { request: 7, outcome: ScanOutcome::Conflict },
            Message::RemoteInsert { request: 8, table: 1, key: 99 },
            Message::RemoteInsertReply {
                request: 8,
                outcome: InsertOutcome::Locked { node: 0x100, next_key: 120, next_node: 0x140 },
            },
            Message::RemoteInsertReply { request: 8, outcome: InsertOutcome::Exists },
            Message::InsertDone { table: 1, key: 99, committed: true },
            Message::RemoteDelete { table: 1, key: 98 },
        ]
    }

    #[test]
    fn every_message_round_trips() {
        // Goal: encode/decode are inverse. Method: round-trip one of each kind.
        let mut buffer = Vec::new();
        for message in samples() {
            message.encode(&mut buffer);
            assert_eq!(Message::decode(0, &buffer).expect("valid"), message);
        }
    }

    #[test]
    fn the_fuzz_corpus_is_valid_messages() {
        // Goal: the fuzz target starts from real messages (it mutates from them). Method: every
        // committed corpus file decodes and re-encodes to itself.
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/pod_message");
        let mut files = 0;
        for entry in std::fs::read_dir(&dir).expect("corpus directory") {
            let bytes = std::fs::read(entry.expect("entry").path()).expect("read");
            let message = Message::decode(0, &bytes).expect("a corpus file decodes");
            let mut encoded = Vec::new();
            message.encode(&mut encoded);
            assert_eq!(encoded, bytes);
            files += 1;
        }
        assert!(files >= 5, "{files} corpus files");
    }

    #[test]
    fn well_formed_messages_outside_the_pods_limits_are_refused() {
        // Goal: a message that decodes but names what does not exist is malformed too. Method:
        // the samples pass limits that hold them; a bad table, a node outside or off the HWcc
        // grid, a value of the wrong size and a scan limit of 0 each fail.
        let limits = Limits { row_bytes: vec![10, 3, 8, 8], hwcc: 0x40..0x10_000, node_bytes: 0x20 };
        for message in samples() {
            assert_eq!(message.check(&limits), Ok(()), "{message:?}");
        }
        let bad = [
            Message::Migrate { request: 1, keys: vec![(4, 3)] },
            Message::MigrateReply { request: 1, outcomes: vec![MigrateOutcome::Moved { node: 0x10_000 }] },
            Message::MigrateReply { request: 1, outcomes: vec![MigrateOutcome::Moved { node: 0x50 }] },
            Message::MigrateScan { request: 7, table: 3, low: 10, high: 20, limit: 0 },
            Message::Prepare {
                request: 3,
                gid: 1,
                writes: vec![RemoteWrite { table: 0, key: 1, value: Some(vec![9; 11]) }],
                reads: vec![],
            },
            Message::RemoteDelete { table: 200, key: 1 },
        ];
        for message in bad {
            assert!(message.check(&limits).is_err(), "{message:?} passed");
        }
    }

    #[test]
    fn truncated_and_garbage_payloads_are_typed_errors() {
        // Goal: a corrupt payload never panics. Method: every truncation of every sample, plus junk.
        let mut buffer = Vec::new();
        for message in samples() {
            message.encode(&mut buffer);
            for len in 0..buffer.len() {
                assert!(matches!(Message::decode(1, &buffer[..len]), Err(PodError::BadMessage { from: 1, .. })));
            }
        }
        assert!(Message::decode(0, &[200, 1, 2]).is_err());
        assert!(Message::decode(0, &[5, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 255, 255, 255, 255]).is_err());
    }
}
