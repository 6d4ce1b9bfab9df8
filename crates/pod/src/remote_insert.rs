//! Tigon-style inserts into and deletes from another host's partition, with next-key locking
//! (Tigon's REMOTE_INSERT_REQUEST and REMOTE_DELETE_REQUEST, pod.md §2.3 and §3.3).
//!
//! ```text
//!  requester                           owner
//!  RemoteInsert(table, key)  ────────► key present: Exists; being inserted: Conflict
//!                                      write-lock the next key for the requester (a CAT)
//!                                      insert a placeholder row, write-locked, and move it in
//!                                      (pins: one for the requester, one for itself)
//!  ◄── RemoteInsertReply(Locked{node, next_key, next_node})
//!  commit: value + TID into the CAT, write back, unlock ──InsertDone(committed)──► row is real
//!  abort:  leave the placeholder locked, unpin          ──InsertDone(aborted)───► row removed
//! ```
//!
//! Invariants: until the owner has read `InsertDone`, the placeholder stays a CAT (the owner's
//! pin keeps CLOCK off it), so every host reaches it through the CXL index and its lock says
//! the truth — held while the insert is in flight or aborted, free once committed (the CAT then
//! holds the committed row, marked modified so the owner copies it back). The next key stays
//! write-locked by the inserter until it ends, so no scan can pass over the new key unseen.
//! The inserter's log holds the insert, as for every write Tigon's coordinator makes.
//!
//! A remote delete write-locks the row's CAT like an update; at commit the deleter logs the
//! delete, leaves the CAT write-locked and sends `RemoteDelete`: the row stays present but
//! locked (CLOCK may move it out; the lock moves with it) until the owner removes it, so no
//! transaction reads a deleted row, and a scan that reaches it conflicts instead of skipping it.

use std::sync::atomic::Ordering;

use crate::error::{PodError, Result};
use crate::host::Host;
use crate::message::{InsertOutcome, Message};
use crate::next_key::{fatal, Refusal};
use crate::partition::{row_flags, TableId};
use crate::region::Off;
use crate::txn::{abort, Abort, Access, Change, LockMode, Place, TxnError, TxnResult, TxnState};
use crate::word::{CatNode, LocalLock, MetaWord};

/// Pins a fresh remote insert's placeholder starts with: the requester's and the owner's.
const INSERT_PINS: u32 = 2;

impl Host {
    // ---- owner side ----

    pub(crate) fn serve_remote_insert(&mut self, from: usize, request: u32, table: TableId, key: u64) -> Result<()> {
        let outcome = self.grant_insert(table, key)?;
        self.send(from, &Message::RemoteInsertReply { request, outcome })
    }

    fn grant_insert(&mut self, table: TableId, key: u64) -> Result<InsertOutcome> {
        if let Some(row) = self.partition.table(table).find(key) {
            // In flight: being inserted, or write-locked (perhaps deleted, removal on its way).
            let stored = self.partition.table(table).row(row);
            let writer = if stored.is(row_flags::MIGRATED) {
                MetaWord(self.region.get(stored.shortcut).word.load(Ordering::Acquire)).writer()
            } else {
                stored.lock.writer()
            };
            let in_flight = writer || stored.is(row_flags::PLACEHOLDER);
            return Ok(if in_flight { InsertOutcome::Conflict } else { InsertOutcome::Exists });
        }
        let next = match self.grant_next_key(table, key)? {
            Ok(next) => next,
            Err(Refusal::Conflict) => return Ok(InsertOutcome::Conflict),
            Err(Refusal::OutOfMemory) => return Ok(InsertOutcome::OutOfMemory),
        };
        let bytes = self.row_bytes(table);
        let row = self.partition.table_mut(table).insert(key, vec![0; bytes].into_boxed_slice(), 0);
        let stored = self.partition.table_mut(table).row_mut(row);
        stored.set(row_flags::PLACEHOLDER, true);
        stored.lock = LocalLock::unlocked(0).try_write_lock().expect("a fresh row is unlocked");
        self.unlink_neighbour_bits(table, key)?;
        match self.move_in(table, row, INSERT_PINS)? {
            Some(node) => {
                let (next_key, next_node) = next.map_or((0, 0), |(next_key, node)| (next_key, node.raw()));
                Ok(InsertOutcome::Locked { node: node.raw(), next_key, next_node })
            }
            None => {
                self.partition.table_mut(table).remove(key);
                if let Some((_, node)) = next {
                    self.revoke_lock(node, LockMode::Write)?;
                }
                Ok(InsertOutcome::OutOfMemory)
            }
        }
    }

    /// Ordered tables: the key after `key`, write-locked for the inserter; hash tables: none.
    #[allow(clippy::type_complexity)]
    fn grant_next_key(
        &mut self,
        table: TableId,
        key: u64,
    ) -> Result<std::result::Result<Option<(u64, Off<CatNode>)>, Refusal>> {
        if !self.partition.table(table).spec.ordered {
            return Ok(Ok(None));
        }
        let (next_key, row) = self.partition.table(table).next_key(key);
        if self.partition.table(table).row(row).is(row_flags::PLACEHOLDER) {
            return Ok(Err(Refusal::Conflict));
        }
        Ok(self.grant_lock(table, row, LockMode::Write)?.map(|node| Some((next_key, node))))
    }

    /// The inserter's transaction ended: the placeholder becomes the row, or goes.
    pub(crate) fn serve_insert_done(&mut self, from: usize, table: TableId, key: u64, committed: bool) -> Result<()> {
        let bad = PodError::BadMessage { from, detail: "insert outcome for a key with no remote insert in flight" };
        let Some(row) = self.partition.table(table).find(key) else { return Err(bad) };
        let stored = self.partition.table(table).row(row);
        if !(stored.is(row_flags::PLACEHOLDER) && stored.is(row_flags::MIGRATED)) {
            return Err(bad);
        }
        let node_off = stored.shortcut;
        let node: &CatNode = self.region.get(node_off);
        let latched = self.latch_owned(node, node_off).map_err(fatal)?;
        node.unpin(&latched);
        drop(latched);
        let stored = self.partition.table_mut(table).row_mut(row);
        if committed && !stored.is(row_flags::DELETE_PENDING) {
            stored.set(row_flags::PLACEHOLDER, false);
            return Ok(());
        }
        self.delete_owned_row(table, row).map_err(fatal)
    }

    /// A committed remote delete: remove the row its deleter left write-locked.
    pub(crate) fn serve_remote_delete(&mut self, from: usize, table: TableId, key: u64) -> Result<()> {
        let Some(row) = self.partition.table(table).find(key) else {
            return Err(PodError::BadMessage { from, detail: "remote delete of an absent key" });
        };
        let stored = self.partition.table_mut(table).row_mut(row);
        if stored.is(row_flags::PLACEHOLDER) {
            // A committed remote insert whose InsertDone is still on its way: its pin is ours
            // until then, so the removal waits for it.
            stored.set(row_flags::DELETE_PENDING, true);
            return Ok(());
        }
        self.delete_owned_row(table, row).map_err(fatal)
    }

    // ---- requester side ----

    /// Inserts `key` into `owner`'s partition through a shared placeholder (module docs).
    pub(crate) fn tigon_insert_remote(
        &mut self,
        txn: &mut TxnState,
        table: TableId,
        key: u64,
        value: &[u8],
        owner: usize,
    ) -> TxnResult<()> {
        self.counters.remote_accesses += 1;
        self.counters.remote_messages += 1;
        let request = self.next_request_id();
        let (node, next_key, next_node) = match self.request(owner, Message::RemoteInsert { request, table, key })? {
            Message::RemoteInsertReply { outcome: InsertOutcome::Locked { node, next_key, next_node }, .. } => {
                (Off::new(node), next_key, Off::<CatNode>::new(next_node))
            }
            Message::RemoteInsertReply { outcome: InsertOutcome::Exists, .. } => return abort(Abort::User),
            Message::RemoteInsertReply { outcome: InsertOutcome::Conflict, .. } => return abort(Abort::Conflict),
            Message::RemoteInsertReply { outcome: InsertOutcome::OutOfMemory, .. } => return abort(Abort::OutOfMemory),
            _ => return Err(TxnError::Fatal(PodError::BadMessage { from: owner, detail: "expected an insert reply" })),
        };
        let inserted = Access {
            table,
            key,
            place: Place::Cat { owner, node },
            lock: LockMode::Write,
            read_tid: None,
            value: None,
            change: Change::Insert,
        };
        if let Err(error) = txn.push(inserted, Some(value)) {
            self.abandon_insert(owner, table, key, node)?;
            if next_node.raw() != 0 {
                self.give_back(next_node, LockMode::Write)?;
            }
            return Err(error);
        }
        if next_node.raw() != 0 {
            self.hold_next_key(txn, table, owner, next_key, next_node)?;
        }
        Ok(())
    }

    /// Records the granted next-key lock as an access (released at commit or abort like any
    /// CAT), or gives it back if the transaction already holds that key.
    fn hold_next_key(
        &mut self,
        txn: &mut TxnState,
        table: TableId,
        owner: usize,
        next_key: u64,
        node: Off<CatNode>,
    ) -> TxnResult<()> {
        if txn.find(table, next_key).is_some() {
            return Ok(self.give_back(node, LockMode::Write)?);
        }
        let access = Access {
            table,
            key: next_key,
            place: Place::Cat { owner, node },
            lock: LockMode::Write,
            read_tid: None,
            value: None,
            change: Change::None,
        };
        match txn.push(access, None) {
            Ok(_) => Ok(()),
            Err(error) => {
                self.give_back(node, LockMode::Write)?;
                Err(error)
            }
        }
    }

    /// A delete this transaction committed: the CAT stays write-locked, our pin goes, the owner
    /// removes the row.
    pub(crate) fn hand_over_delete(
        &mut self,
        owner: usize,
        table: TableId,
        key: u64,
        node_off: Off<CatNode>,
    ) -> Result<()> {
        let node: &CatNode = self.region.get(node_off);
        let latched = self.latch(node, node_off).map_err(fatal)?;
        node.unpin(&latched);
        drop(latched);
        self.counters.remote_deletes += 1;
        self.send(owner, &Message::RemoteDelete { table, key })
    }

    /// An insert this transaction will not commit: leave its placeholder locked, drop our pin,
    /// and tell the owner to remove it.
    pub(crate) fn abandon_insert(
        &mut self,
        owner: usize,
        table: TableId,
        key: u64,
        node_off: Off<CatNode>,
    ) -> Result<()> {
        let node: &CatNode = self.region.get(node_off);
        let latched = self.latch(node, node_off).map_err(fatal)?;
        node.unpin(&latched);
        drop(latched);
        self.send(owner, &Message::InsertDone { table, key, committed: false })
    }
}
