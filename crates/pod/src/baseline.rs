//! The two baselines Tigon is measured against, on the same tables, transport and logger:
//!
//! ```text
//!  DS2PL+  access remote key ──Access(ReadLock|WriteLock)──► owner locks NO_WAIT, replies value
//!          commit: Prepare(writes) to writing participants ─► they log prepared records, reply
//!                  coordinator: TID, log local writes + commit record, apply,
//!                  Decide(commit, TID) ─► participants apply, release, acknowledge (2PC round 2)
//!                  read-only participants are released at the lock point (one-way Decide abort)
//!  OCC+    read remote key ──Access(ReadNoLock)──► value + TID, no lock  (Silo-style, not Sundial)
//!          commit: lock local writes; Lock(keys) round; validate local reads and scans;
//!                  Prepare(writes, reads to validate) round; TID; log; apply; Decide
//! ```
//!
//! Participants remember the locks each remote transaction holds (`holds`, by transaction id)
//! and its prepared writes (`prepared`); `Decide` applies or drops them and releases everything.
//! Invariant: the coordinator reads the global epoch only after every participant logged its
//! prepare records, so its commit epoch covers theirs and recovery (commit record ⇒ writes) is sound.

use std::collections::BTreeMap;

use crate::config::CrashPoint;
use crate::error::{PodError, Result};
use crate::host::Host;
use crate::message::{AccessMode, AccessOutcome, Message, ReadCheck, RemoteWrite};
use crate::partition::{row_flags, RowId, TableId};
use crate::txn::{abort, Abort, Access, Change, LockMode, Place, TxnError, TxnResult, TxnState};

/// A lock a remote transaction holds on one of this host's rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hold {
    pub table: TableId,
    pub row: RowId,
    pub mode: LockMode,
}

/// What a commit sends to one participant.
#[derive(Debug, Default)]
struct Participant {
    writes: Vec<RemoteWrite>,
    reads: Vec<ReadCheck>,
}

impl Host {
    fn remote_access(
        &mut self,
        owner: usize,
        gid: u64,
        table: TableId,
        key: u64,
        mode: AccessMode,
    ) -> TxnResult<AccessOutcome> {
        self.counters.remote_accesses += 1;
        self.counters.remote_messages += 1;
        let request = self.next_request_id();
        match self.request(owner, Message::Access { request, gid, table, key, mode })? {
            Message::AccessReply { outcome, .. } => Ok(outcome),
            _ => Err(TxnError::Fatal(PodError::BadMessage { from: owner, detail: "expected an access reply" })),
        }
    }

    fn push_remote(
        txn: &mut TxnState,
        owner: usize,
        table: TableId,
        key: u64,
        lock: LockMode,
        outcome: AccessOutcome,
    ) -> TxnResult<Option<usize>> {
        match outcome {
            AccessOutcome::Granted { tid, value } => {
                let access = Access {
                    table,
                    key,
                    place: Place::Remote { owner },
                    lock,
                    read_tid: Some(tid),
                    value: None,
                    change: Change::None,
                };
                Ok(Some(txn.push(access, Some(&value))?))
            }
            AccessOutcome::Conflict => abort(Abort::Conflict),
            AccessOutcome::NotFound => Ok(None),
        }
    }

    pub(crate) fn ds2pl_access_remote(
        &mut self,
        txn: &mut TxnState,
        table: TableId,
        key: u64,
        owner: usize,
        want: LockMode,
    ) -> TxnResult<Option<usize>> {
        let (mode, lock) = match want {
            LockMode::Write => (AccessMode::WriteLock, LockMode::Write),
            _ => (AccessMode::ReadLock, LockMode::Read),
        };
        let outcome = self.remote_access(owner, txn.gid, table, key, mode)?;
        Self::push_remote(txn, owner, table, key, lock, outcome)
    }

    pub(crate) fn ds2pl_upgrade(
        &mut self,
        txn: &mut TxnState,
        owner: usize,
        table: TableId,
        key: u64,
    ) -> TxnResult<()> {
        match self.remote_access(owner, txn.gid, table, key, AccessMode::WriteLock)? {
            AccessOutcome::Granted { .. } => Ok(()),
            _ => abort(Abort::Conflict),
        }
    }

    pub(crate) fn occ_read_remote(
        &mut self,
        txn: &mut TxnState,
        table: TableId,
        key: u64,
        owner: usize,
    ) -> TxnResult<Option<usize>> {
        let outcome = self.remote_access(owner, txn.gid, table, key, AccessMode::ReadNoLock)?;
        Self::push_remote(txn, owner, table, key, LockMode::None, outcome)
    }

    /// Remote participants of a transaction with what each must apply and validate.
    fn participants(txn: &TxnState) -> BTreeMap<usize, Participant> {
        let mut participants: BTreeMap<usize, Participant> = BTreeMap::new();
        for (index, access) in txn.accesses.iter().enumerate() {
            let Place::Remote { owner } = access.place else { continue };
            let participant = participants.entry(owner).or_default();
            match access.change {
                Change::None => {}
                Change::Update => participant.writes.push(RemoteWrite {
                    table: access.table,
                    key: access.key,
                    value: txn.value(index).map(<[u8]>::to_vec),
                }),
                Change::Delete | Change::Insert => unreachable!("remote inserts and deletes are refused earlier"),
            }
            if let Some(tid) = access.read_tid {
                participant.reads.push(ReadCheck { table: access.table, key: access.key, tid });
            }
        }
        participants
    }

    /// Sends `message(participant)` to each listed participant, then collects every reply.
    fn round(&mut self, owners: &[usize], mut message: impl FnMut(u32, usize) -> Message) -> TxnResult<Vec<Message>> {
        let mut requests = Vec::with_capacity(owners.len());
        for &owner in owners {
            let request = self.next_request_id();
            self.send(owner, &message(request, owner))?;
            requests.push((owner, request));
        }
        let mut replies = Vec::with_capacity(requests.len());
        for (owner, request) in requests {
            replies.push(self.await_reply(owner, request)?);
        }
        Ok(replies)
    }

    fn prepare_round(
        &mut self,
        gid: u64,
        owners: &[usize],
        parts: &mut BTreeMap<usize, Participant>,
        with_reads: bool,
    ) -> TxnResult<bool> {
        let replies = self.round(owners, |request, owner| {
            let part = parts.get_mut(&owner).expect("owner listed from parts");
            let reads = if with_reads { std::mem::take(&mut part.reads) } else { Vec::new() };
            Message::Prepare { request, gid, writes: std::mem::take(&mut part.writes), reads }
        })?;
        Ok(replies.iter().all(|reply| matches!(reply, Message::PrepareReply { ok: true, .. })))
    }

    /// Commits locally (log, apply, release) and tells writing participants the TID.
    fn commit_coordinator(&mut self, txn: &TxnState, writers: &[usize], floor: u64) -> TxnResult<()> {
        let (epoch, tid) = self.commit_tid(txn, floor);
        self.log_changes(txn, tid);
        self.maybe_crash(CrashPoint::MidEpoch);
        for index in 0..txn.accesses.len() {
            if let Place::Local(_) = txn.accesses[index].place {
                self.finish_owned(txn, index, Some(tid))?;
            }
        }
        let gid = txn.gid;
        let acks = self.round(writers, |request, _| Message::Decide { request, gid, commit: true, tid })?;
        if !acks.iter().all(|ack| matches!(ack, Message::Decided { .. })) {
            let detail = "expected a decision acknowledgement";
            return Err(TxnError::Fatal(PodError::BadMessage { from: writers[0], detail }));
        }
        self.after_commit(txn, epoch, tid);
        Ok(())
    }

    pub(crate) fn ds2pl_commit(&mut self, txn: &mut TxnState) -> TxnResult<()> {
        let mut parts = Self::participants(txn);
        let writers: Vec<usize> = parts.iter().filter(|(_, p)| !p.writes.is_empty()).map(|(o, _)| *o).collect();
        let readers: Vec<usize> = parts.keys().copied().filter(|owner| !writers.contains(owner)).collect();
        for &owner in &readers {
            self.send(owner, &Message::Decide { request: 0, gid: txn.gid, commit: false, tid: 0 })?;
        }
        if txn.is_read_only() {
            self.release_all(txn)?;
            self.counters.committed_read_only += 1;
            self.record_history(txn, 0);
            return Ok(());
        }
        if !self.prepare_round(txn.gid, &writers, &mut parts, false)? {
            return abort(Abort::Conflict);
        }
        self.commit_coordinator(txn, &writers, 0)
    }

    pub(crate) fn occ_commit(&mut self, txn: &mut TxnState) -> TxnResult<()> {
        for index in 0..txn.accesses.len() {
            let access = txn.accesses[index];
            if let (Place::Local(row), Change::Update | Change::Delete, LockMode::None) =
                (access.place, access.change, access.lock)
            {
                self.lock_owned(access.table, row, LockMode::None, LockMode::Write)?;
                txn.accesses[index].lock = LockMode::Write;
            }
        }
        let mut parts = Self::participants(txn);
        let writers: Vec<usize> = parts.iter().filter(|(_, p)| !p.writes.is_empty()).map(|(o, _)| *o).collect();
        let mut floor = 0;
        let lock_replies = self.round(&writers, |request, owner| Message::Lock {
            request,
            gid: txn.gid,
            keys: parts[&owner].writes.iter().map(|write| (write.table, write.key)).collect(),
        })?;
        for reply in lock_replies {
            match reply {
                Message::LockReply { ok: true, max_tid, .. } => floor = floor.max(max_tid + 1),
                _ => return abort(Abort::Conflict),
            }
        }
        self.occ_validate_local(txn)?;
        let everyone: Vec<usize> = parts.keys().copied().collect();
        if !self.prepare_round(txn.gid, &everyone, &mut parts, true)? {
            return abort(Abort::Validation);
        }
        if txn.is_read_only() {
            self.counters.committed_read_only += 1;
            self.record_history(txn, 0);
            return Ok(());
        }
        self.commit_coordinator(txn, &writers, floor)
    }

    /// Silo's read validation on this host's rows (write set already locked) and scan re-checks.
    fn occ_validate_local(&mut self, txn: &TxnState) -> TxnResult<()> {
        for access in &txn.accesses {
            let (Place::Local(row), Some(read), Change::None | Change::Update | Change::Delete) =
                (access.place, access.read_tid, access.change)
            else {
                continue;
            };
            let stored = self.partition.table(access.table).row(row);
            let locked_by_other = stored.lock.writer() && access.lock != LockMode::Write;
            if stored.lock.tid() != read || locked_by_other {
                return abort(Abort::Validation);
            }
        }
        for scan in &txn.scans {
            let table = self.partition.table(scan.table);
            let keys: Vec<u64> = table
                .range(scan.low, scan.high, scan.limit)
                .into_iter()
                .filter(|(_, row)| !table.row(*row).is(row_flags::PLACEHOLDER))
                .map(|(key, _)| key)
                .collect();
            if keys != scan.keys {
                return abort(Abort::Validation);
            }
        }
        Ok(())
    }

    /// Abort: every remote participant releases what this transaction holds there.
    pub(crate) fn baseline_abort_participants(&mut self, txn: &TxnState) -> TxnResult<()> {
        let mut owners: Vec<usize> = txn
            .accesses
            .iter()
            .filter_map(|access| match access.place {
                Place::Remote { owner } => Some(owner),
                _ => None,
            })
            .collect();
        owners.sort_unstable();
        owners.dedup();
        for owner in owners {
            self.send(owner, &Message::Decide { request: 0, gid: txn.gid, commit: false, tid: 0 })?;
        }
        Ok(())
    }

    // ---- participant side ----

    fn held_mode(&self, gid: u64, table: TableId, row: RowId) -> LockMode {
        self.holds
            .get(&gid)
            .and_then(|holds| holds.iter().find(|hold| hold.table == table && hold.row == row))
            .map_or(LockMode::None, |hold| hold.mode)
    }

    /// Takes `want` on a row for remote transaction `gid` (NO_WAIT); false on conflict.
    fn hold(&mut self, gid: u64, table: TableId, row: RowId, want: LockMode) -> bool {
        let held = self.held_mode(gid, table, row);
        if held >= want {
            return true;
        }
        let stored = self.partition.table_mut(table).row_mut(row);
        let next = match held {
            LockMode::Read => stored.lock.try_upgrade(),
            _ if want == LockMode::Write => stored.lock.try_write_lock(),
            _ => stored.lock.try_read_lock(),
        };
        let Some(lock) = next else { return false };
        stored.lock = lock;
        let holds = self.holds.entry(gid).or_default();
        holds.retain(|hold| !(hold.table == table && hold.row == row));
        holds.push(Hold { table, row, mode: want });
        true
    }

    fn release_holds(&mut self, gid: u64) {
        for hold in self.holds.remove(&gid).unwrap_or_default() {
            let stored = self.partition.table_mut(hold.table).row_mut(hold.row);
            stored.lock = match hold.mode {
                LockMode::Read => stored.lock.release_read(),
                LockMode::Write => stored.lock.release_write(),
                LockMode::None => stored.lock,
            };
        }
    }

    fn live_row(&self, table: TableId, key: u64) -> Option<RowId> {
        let row = self.partition.table(table).find(key)?;
        (!self.partition.table(table).row(row).is(row_flags::PLACEHOLDER)).then_some(row)
    }

    pub(crate) fn serve_access(
        &mut self,
        from: usize,
        request: u32,
        gid: u64,
        table: TableId,
        key: u64,
        mode: AccessMode,
    ) -> Result<()> {
        let outcome = match self.live_row(table, key) {
            None => AccessOutcome::NotFound,
            Some(row) => {
                let granted = match mode {
                    AccessMode::ReadNoLock => !self.partition.table(table).row(row).lock.writer(),
                    AccessMode::ReadLock => self.hold(gid, table, row, LockMode::Read),
                    AccessMode::WriteLock => self.hold(gid, table, row, LockMode::Write),
                };
                let stored = self.partition.table(table).row(row);
                self.counters.dram_tuple_ops += 1;
                if granted {
                    AccessOutcome::Granted { tid: stored.lock.tid(), value: stored.data.to_vec() }
                } else {
                    AccessOutcome::Conflict
                }
            }
        };
        self.send(from, &Message::AccessReply { request, outcome })
    }

    pub(crate) fn serve_lock(&mut self, from: usize, request: u32, gid: u64, keys: &[(TableId, u64)]) -> Result<()> {
        let mut max_tid = 0;
        let mut ok = true;
        for &(table, key) in keys {
            match self.live_row(table, key) {
                Some(row) if self.hold(gid, table, row, LockMode::Write) => {
                    max_tid = max_tid.max(self.partition.table(table).row(row).lock.tid());
                }
                _ => {
                    ok = false;
                    break;
                }
            }
        }
        if !ok {
            self.release_holds(gid);
        }
        self.send(from, &Message::LockReply { request, ok, max_tid })
    }

    pub(crate) fn serve_prepare(
        &mut self,
        from: usize,
        request: u32,
        gid: u64,
        writes: Vec<RemoteWrite>,
        reads: &[ReadCheck],
    ) -> Result<()> {
        let reads_valid = reads.iter().all(|read| match self.live_row(read.table, read.key) {
            Some(row) => {
                let lock = self.partition.table(read.table).row(row).lock;
                lock.tid() == read.tid && (!lock.writer() || self.held_mode(gid, read.table, row) == LockMode::Write)
            }
            None => false,
        });
        let writes_locked = writes.iter().all(|write| {
            self.live_row(write.table, write.key)
                .is_some_and(|row| self.held_mode(gid, write.table, row) == LockMode::Write)
        });
        let ok = reads_valid && writes_locked;
        if !ok {
            self.release_holds(gid);
        } else if !writes.is_empty() {
            for write in &writes {
                self.log.write(gid, write.table, write.key, 0, write.value.as_deref());
            }
            self.prepared.insert(gid, writes);
        }
        let epoch = self.region.header().global_epoch.load(std::sync::atomic::Ordering::Acquire);
        self.send(from, &Message::PrepareReply { request, ok, epoch })
    }

    pub(crate) fn serve_decide(&mut self, from: usize, request: u32, gid: u64, commit: bool, tid: u64) -> Result<()> {
        let writes = self.prepared.remove(&gid).unwrap_or_default();
        if commit {
            for write in writes {
                let row = self.live_row(write.table, write.key).expect("a prepared row is locked, hence present");
                let value = write.value.expect("remote deletes are refused earlier");
                let stored = self.partition.table_mut(write.table).row_mut(row);
                stored.data.copy_from_slice(&value);
                stored.lock = stored.lock.with_tid(tid);
                stored.set(row_flags::MODIFIED_SINCE_MOVED_OUT, true);
                self.counters.dram_tuple_ops += 1;
            }
            self.last_tid = self.last_tid.max(tid);
        }
        self.release_holds(gid);
        if request != 0 {
            self.send(from, &Message::Decided { request })?;
        }
        Ok(())
    }

    /// After a run no remote transaction may still hold anything here.
    pub(crate) fn check_baseline_state(&self, failures: &mut Vec<String>) {
        if !self.holds.is_empty() || !self.prepared.is_empty() {
            failures.push(format!(
                "{} remote transactions still hold locks and {} are still prepared after the run",
                self.holds.len(),
                self.prepared.len()
            ));
        }
    }
}
