//! The Pasha/Tigon protocol: cross-host active tuples (CATs) in CXL memory, 2PL NO_WAIT on their
//! 8-byte HWcc word, software cache coherence on their SWcc blocks, and commit without 2PC.
//!
//! ```text
//!  remote access (host A, key of B): requester — B's CXL index, or a migration request
//!  B serving Migrate: cats — move_in (CLOCK make_room, block, node, link) → Moved(node, pinned for A)
//!  commit (A): TID, redo records for every change (also B's tuples!), apply: DRAM rows and CXL
//!    blocks directly; latch: SWcc after_write (write back, clear others' bits), MODIFIED, unlock, unpin
//!  scans and inserts of B's ordered tables: scan, insert (next-key locking across hosts)
//! ```
//!
//! Invariants (each submodule documents its own): a transaction holds every lock before its TID
//! is chosen; every change it makes — to its own rows and to other hosts' CATs — is in its own
//! log, so no transaction needs two-phase commit.

mod cats;
mod insert;
mod requester;
mod scan;

use crate::access::{Change, Place, TxnResult, TxnState};
use crate::error::{PodError, Result};
use crate::host::Host;
use crate::message::{Message, MigrateOutcome};
use crate::partition::{row_flags, TableId};
use crate::protocol::{Protocol, RemoteFetch};

use cats::Cats;

/// Tigon's state on one host: the CATs it owns.
#[derive(Debug, Default)]
pub(crate) struct Tigon {
    cats: Cats,
}

impl Protocol for Tigon {
    fn access_remote(&mut self, host: &mut Host, txn: &mut TxnState, wanted: &[RemoteFetch]) -> TxnResult<()> {
        requester::access_remote(host, self, txn, wanted)
    }

    fn upgrade(&mut self, host: &mut Host, txn: &mut TxnState, index: usize) -> TxnResult<()> {
        let Place::Cat { node, .. } = txn.accesses[index].place else {
            unreachable!("Tigon's remote accesses are CATs")
        };
        requester::upgrade(host, node)
    }

    fn insert_remote(
        &mut self,
        host: &mut Host,
        txn: &mut TxnState,
        row: (TableId, u64, &[u8]),
        owner: usize,
    ) -> TxnResult<()> {
        insert::insert_remote(host, self, txn, row, owner)
    }

    fn scan_remote(
        &mut self,
        host: &mut Host,
        txn: &mut TxnState,
        table: TableId,
        range: (u64, u64, usize),
        owner: usize,
    ) -> TxnResult<Vec<u64>> {
        scan::scan_remote(host, self, txn, table, range, owner)
    }

    fn deletes_remote(&self) -> bool {
        true
    }

    /// Commit without 2PC: every change — local rows and other hosts' CATs — is logged here and
    /// applied directly.
    fn commit(&mut self, host: &mut Host, txn: &mut TxnState) -> TxnResult<()> {
        if txn.is_read_only() {
            self.abort(host, txn)?;
            host.commit_read_only(txn);
            return Ok(());
        }
        let (epoch, tid) = host.commit_tid(txn, 0);
        host.log_changes(txn, tid);
        host.maybe_crash(crate::config::CrashPoint::MidEpoch);
        for index in 0..txn.accesses.len() {
            let access = txn.accesses[index];
            match (access.place, access.change) {
                (Place::Local(row), Change::Delete)
                    if host.partition.table(access.table).row(row).is(row_flags::MIGRATED) =>
                {
                    self.cats.delete_row(host, access.table, row)?;
                }
                (Place::Local(_), _) => host.finish_owned(txn, index, Some(tid))?,
                (Place::Cat { owner, node }, Change::Delete) => {
                    insert::hand_over_delete(host, owner, access.table, access.key, node)?
                }
                (Place::Cat { owner, .. }, Change::Insert) => {
                    requester::finish_cat(host, txn, index, Some(tid))?;
                    insert::finish_insert(host, owner, access.table, access.key)?;
                }
                (Place::Cat { .. }, _) => requester::finish_cat(host, txn, index, Some(tid))?,
                (Place::Remote { .. }, _) => unreachable!("Tigon never reaches a tuple by message"),
            }
        }
        host.after_commit(txn, epoch, tid)?;
        Ok(())
    }

    fn abort(&mut self, host: &mut Host, txn: &TxnState) -> TxnResult<()> {
        host.release_local(txn)?;
        for index in 0..txn.accesses.len() {
            let access = txn.accesses[index];
            match (access.place, access.change) {
                (Place::Cat { owner, node }, Change::Insert) => {
                    insert::abandon_insert(host, owner, access.table, access.key, node)?
                }
                (Place::Cat { .. }, _) => requester::finish_cat(host, txn, index, None)?,
                _ => {}
            }
        }
        Ok(())
    }

    fn serve(&mut self, host: &mut Host, from: usize, message: Message) -> Result<()> {
        let cats = &mut self.cats;
        match message {
            Message::Migrate { request, keys } => {
                let mut outcomes: Vec<MigrateOutcome> = Vec::with_capacity(keys.len());
                for (table, key) in keys {
                    outcomes.push(cats.migrate_one(host, table, key)?);
                }
                host.send(from, &Message::MigrateReply { request, outcomes })
            }
            Message::MigrateScan { request, table, low, high, limit } => {
                let outcome = scan::grant_scan(host, cats, from, table, (low, high, limit as usize))?;
                host.send(from, &Message::MigrateScanReply { request, outcome })
            }
            Message::RemoteInsert { request, table, key } => {
                let outcome = insert::grant_insert(host, cats, table, key)?;
                host.send(from, &Message::RemoteInsertReply { request, outcome })
            }
            Message::InsertDone { table, key, committed } => {
                insert::insert_done(host, cats, from, table, key, committed)
            }
            Message::RemoteDelete { table, key } => insert::remote_delete(host, cats, from, table, key),
            _ => Err(PodError::BadMessage { from, detail: "a baseline's message sent to a Tigon-style host" }),
        }
    }

    fn start(&mut self, host: &mut Host) -> Result<()> {
        if host.config.pre_migrate {
            self.cats.pre_migrate(host)?;
        }
        Ok(())
    }

    fn wind_down(&mut self, host: &mut Host, _failures: &mut Vec<String>) -> Result<()> {
        self.cats.evict_all(host)
    }

    fn shared_tuples(&self) -> u64 {
        self.cats.len() as u64
    }
}
