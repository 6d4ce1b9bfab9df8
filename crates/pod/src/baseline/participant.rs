//! The participant's side of the baselines: a host serving other hosts' transactions on its
//! rows — NO_WAIT locks by message, OCC's versioned reads, lock and validation rounds, prepared
//! writes and the decision.
//!
//! Participants remember the locks each remote transaction holds (`holds`, by transaction id)
//! and its prepared writes (`prepared`); `Decide` applies or drops them and releases everything.
//! Invariant: after a run no remote transaction holds anything here ([`Participant::check`]).

use crate::access::LockMode;
use crate::error::Result;
use crate::host::Host;
use crate::message::{AccessItem, AccessMode, AccessOutcome, Message, ReadCheck, RemoteWrite};
use crate::partition::{row_flags, IntMap, RowId, TableId};
use crate::word::LocalLock;

/// A lock a remote transaction holds on one of this host's rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hold {
    pub table: TableId,
    pub row: RowId,
    pub mode: LockMode,
}

/// NO_WAIT transition of a DRAM lock word from what a transaction holds to what it wants;
/// `None` on conflict.
pub fn grant(lock: LocalLock, held: LockMode, want: LockMode) -> Option<LocalLock> {
    match (held, want) {
        _ if held >= want => Some(lock),
        (LockMode::Read, _) => lock.try_upgrade(),
        (_, LockMode::Write) => lock.try_write_lock(),
        _ => lock.try_read_lock(),
    }
}

/// What remote transactions hold and have prepared on this host.
#[derive(Debug, Default)]
pub(crate) struct Participant {
    holds: IntMap<u64, Vec<Hold>>,
    prepared: IntMap<u64, Vec<RemoteWrite>>,
}

impl Participant {
    fn held_mode(&self, gid: u64, table: TableId, row: RowId) -> LockMode {
        self.holds
            .get(&gid)
            .and_then(|holds| holds.iter().find(|hold| hold.table == table && hold.row == row))
            .map_or(LockMode::None, |hold| hold.mode)
    }

    /// Takes `want` on a row for remote transaction `gid` (NO_WAIT); false on conflict.
    fn hold(&mut self, host: &mut Host, gid: u64, table: TableId, row: RowId, want: LockMode) -> bool {
        let held = self.held_mode(gid, table, row);
        let stored = host.partition.table_mut(table).row_mut(row);
        let Some(lock) = grant(stored.lock, held, want) else { return false };
        if held >= want {
            return true;
        }
        stored.lock = lock;
        let holds = self.holds.entry(gid).or_default();
        holds.retain(|hold| !(hold.table == table && hold.row == row));
        holds.push(Hold { table, row, mode: want });
        true
    }

    fn release_holds(&mut self, host: &mut Host, gid: u64) {
        for hold in self.holds.remove(&gid).unwrap_or_default() {
            let stored = host.partition.table_mut(hold.table).row_mut(hold.row);
            stored.lock = match hold.mode {
                LockMode::Read => stored.lock.release_read(),
                LockMode::Write => stored.lock.release_write(),
                LockMode::None => stored.lock,
            };
        }
    }

    /// One phase of a remote transaction's reads and locks: each item granted, refused or absent.
    pub(crate) fn serve_access(
        &mut self,
        host: &mut Host,
        from: usize,
        request: u32,
        gid: u64,
        items: &[AccessItem],
    ) -> Result<()> {
        let outcomes = items.iter().map(|item| self.access_one(host, gid, item)).collect();
        host.send(from, &Message::AccessReply { request, outcomes })
    }

    fn access_one(&mut self, host: &mut Host, gid: u64, item: &AccessItem) -> AccessOutcome {
        let Some(row) = live_row(host, item.table, item.key) else { return AccessOutcome::NotFound };
        let granted = match item.mode {
            AccessMode::ReadNoLock => !host.partition.table(item.table).row(row).lock.writer(),
            AccessMode::ReadLock => self.hold(host, gid, item.table, row, LockMode::Read),
            AccessMode::WriteLock => self.hold(host, gid, item.table, row, LockMode::Write),
        };
        let stored = host.partition.table(item.table).row(row);
        host.counters.tuple_ops += 1;
        if granted {
            AccessOutcome::Granted { tid: stored.lock.tid(), value: stored.data.to_vec() }
        } else {
            AccessOutcome::Conflict
        }
    }

    /// OCC's lock round: write-lock every key for `gid`, or none.
    pub(crate) fn serve_lock(
        &mut self,
        host: &mut Host,
        from: usize,
        request: u32,
        gid: u64,
        keys: &[(TableId, u64)],
    ) -> Result<()> {
        let mut max_tid = 0;
        let mut ok = true;
        for &(table, key) in keys {
            match live_row(host, table, key) {
                Some(row) if self.hold(host, gid, table, row, LockMode::Write) => {
                    max_tid = max_tid.max(host.partition.table(table).row(row).lock.tid());
                }
                _ => {
                    ok = false;
                    break;
                }
            }
        }
        if !ok {
            self.release_holds(host, gid);
        }
        host.send(from, &Message::LockReply { request, ok, max_tid })
    }

    /// Validates reads (OCC) and logs the writes as prepared; a "no" releases everything.
    pub(crate) fn serve_prepare(
        &mut self,
        host: &mut Host,
        from: usize,
        request: u32,
        gid: u64,
        writes: Vec<RemoteWrite>,
        reads: &[ReadCheck],
    ) -> Result<()> {
        let reads_valid = reads.iter().all(|read| match live_row(host, read.table, read.key) {
            Some(row) => {
                let lock = host.partition.table(read.table).row(row).lock;
                lock.tid() == read.tid && (!lock.writer() || self.held_mode(gid, read.table, row) == LockMode::Write)
            }
            None => false,
        });
        let writes_locked = writes.iter().all(|write| {
            live_row(host, write.table, write.key)
                .is_some_and(|row| self.held_mode(gid, write.table, row) == LockMode::Write)
        });
        let ok = reads_valid && writes_locked;
        if !ok {
            self.release_holds(host, gid);
        } else if !writes.is_empty() {
            for write in &writes {
                host.log.write(gid, write.table, write.key, 0, write.value.as_deref());
            }
            self.prepared.insert(gid, writes);
        }
        let epoch = host.region.header().global_epoch.load(std::sync::atomic::Ordering::Acquire);
        host.send(from, &Message::PrepareReply { request, ok, epoch })
    }

    /// The decision: apply the prepared writes with `tid` (or drop them), release everything.
    pub(crate) fn serve_decide(
        &mut self,
        host: &mut Host,
        from: usize,
        request: u32,
        gid: u64,
        commit: bool,
        tid: u64,
    ) -> Result<()> {
        let writes = self.prepared.remove(&gid).unwrap_or_default();
        if commit {
            for write in writes {
                let row = live_row(host, write.table, write.key).expect("a prepared row is locked, hence present");
                let value = write.value.expect("remote deletes are refused earlier");
                let stored = host.partition.table_mut(write.table).row_mut(row);
                stored.data.copy_from_slice(&value);
                stored.lock = stored.lock.with_tid(tid);
                stored.set(row_flags::MODIFIED_SINCE_MOVED_OUT, true);
                host.counters.tuple_ops += 1;
            }
            host.last_tid = host.last_tid.max(tid);
        }
        self.release_holds(host, gid);
        if request != 0 {
            host.send(from, &Message::Decided { request })?;
        }
        Ok(())
    }

    /// After a run no remote transaction may still hold anything here.
    pub(crate) fn check(&self, failures: &mut Vec<String>) {
        if !self.holds.is_empty() || !self.prepared.is_empty() {
            failures.push(format!(
                "{} remote transactions still hold locks and {} are still prepared after the run",
                self.holds.len(),
                self.prepared.len()
            ));
        }
    }
}

fn live_row(host: &Host, table: TableId, key: u64) -> Option<RowId> {
    let row = host.partition.table(table).find(key)?;
    (!host.partition.table(table).row(row).is(row_flags::PLACEHOLDER)).then_some(row)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_follow_no_wait_two_phase_locking() {
        // Goal: the participant's lock decision is 2PL NO_WAIT. Method: every (held, want) pair
        // on a free, a read-locked and a write-locked word.
        let free = LocalLock::unlocked(7);
        let read = free.try_read_lock().expect("free");
        let written = free.try_write_lock().expect("free");
        assert!(grant(free, LockMode::None, LockMode::Read).is_some_and(|lock| lock.readers() == 1));
        assert!(grant(read, LockMode::None, LockMode::Read).is_some_and(|lock| lock.readers() == 2));
        assert!(grant(read, LockMode::None, LockMode::Write).is_none(), "a reader blocks a writer");
        assert!(grant(read, LockMode::Read, LockMode::Write).is_some_and(|lock| lock.writer()), "sole reader upgrades");
        assert!(grant(written, LockMode::None, LockMode::Read).is_none(), "a writer blocks readers");
        assert_eq!(grant(written, LockMode::Write, LockMode::Read), Some(written), "held covers wanted");
    }
}
