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

use crate::access::{abort, Abort, Access, Change, LockMode, Place, TxnError, TxnResult, TxnState};
use crate::error::{PodError, Result};
use crate::host::Host;
use crate::message::{InsertOutcome, Message};
use crate::partition::{row_flags, TableId};
use crate::protocol::{exchange, Protocol};
use crate::region::Off;
use crate::word::{CatNode, LocalLock, MetaWord};

use super::cats::Cats;
use super::requester::give_back;
use super::scan::{grant_lock, revoke_lock, Refusal};

/// Pins a fresh remote insert's placeholder starts with: the requester's and the owner's.
const INSERT_PINS: u32 = 2;

// ---- owner side ----

pub(crate) fn grant_insert(host: &mut Host, cats: &mut Cats, table: TableId, key: u64) -> Result<InsertOutcome> {
    if let Some(row) = host.partition.table(table).find(key) {
        // In flight: being inserted, or write-locked (perhaps deleted, removal on its way).
        let stored = host.partition.table(table).row(row);
        let writer = if stored.is(row_flags::MIGRATED) {
            MetaWord(host.region.get(stored.shortcut).word.load(Ordering::Acquire)).writer()
        } else {
            stored.lock.writer()
        };
        let in_flight = writer || stored.is(row_flags::PLACEHOLDER);
        return Ok(if in_flight { InsertOutcome::Conflict } else { InsertOutcome::Exists });
    }
    let next = match grant_next_key(host, cats, table, key)? {
        Ok(next) => next,
        Err(Refusal::Conflict) => return Ok(InsertOutcome::Conflict),
        Err(Refusal::OutOfMemory) => return Ok(InsertOutcome::OutOfMemory),
    };
    let bytes = host.row_bytes(table);
    let row = host.partition.table_mut(table).insert(key, vec![0; bytes].into_boxed_slice(), 0);
    let stored = host.partition.table_mut(table).row_mut(row);
    stored.set(row_flags::PLACEHOLDER, true);
    stored.lock = LocalLock::unlocked(0).try_write_lock().expect("a fresh row is unlocked");
    host.unlink_neighbour_bits(table, key)?;
    match cats.move_in(host, table, row, INSERT_PINS)? {
        Some(node) => {
            let (next_key, next_node) = next.map_or((0, 0), |(next_key, node)| (next_key, node.raw()));
            Ok(InsertOutcome::Locked { node: node.raw(), next_key, next_node })
        }
        None => {
            host.partition.table_mut(table).remove(key);
            if let Some((_, node)) = next {
                revoke_lock(host, node, LockMode::Write)?;
            }
            Ok(InsertOutcome::OutOfMemory)
        }
    }
}

/// Ordered tables: the key after `key`, write-locked for the inserter; hash tables: none.
#[allow(clippy::type_complexity)]
fn grant_next_key(
    host: &mut Host,
    cats: &mut Cats,
    table: TableId,
    key: u64,
) -> Result<std::result::Result<Option<(u64, Off<CatNode>)>, Refusal>> {
    if !host.partition.table(table).spec.ordered {
        return Ok(Ok(None));
    }
    let (next_key, row) = host.partition.table(table).next_key(key);
    if host.partition.table(table).row(row).is(row_flags::PLACEHOLDER) {
        return Ok(Err(Refusal::Conflict));
    }
    Ok(grant_lock(host, cats, table, row, LockMode::Write)?.map(|node| Some((next_key, node))))
}

/// The inserter's transaction ended: the placeholder becomes the row, or goes.
pub(crate) fn insert_done(
    host: &mut Host,
    cats: &mut Cats,
    from: usize,
    table: TableId,
    key: u64,
    committed: bool,
) -> Result<()> {
    let bad = PodError::BadMessage { from, detail: "insert outcome for a key with no remote insert in flight" };
    let Some(row) = host.partition.table(table).find(key) else { return Err(bad) };
    let stored = host.partition.table(table).row(row);
    if !(stored.is(row_flags::PLACEHOLDER) && stored.is(row_flags::MIGRATED)) {
        return Err(bad);
    }
    let node_off = stored.shortcut;
    let node: &CatNode = host.region.get(node_off);
    let latched = host.latch_owned(node, node_off)?;
    node.unpin(&latched);
    drop(latched);
    let stored = host.partition.table_mut(table).row_mut(row);
    if committed && !stored.is(row_flags::DELETE_PENDING) {
        stored.set(row_flags::PLACEHOLDER, false);
        return Ok(());
    }
    cats.delete_row(host, table, row)
}

/// A committed remote delete: remove the row its deleter left write-locked.
pub(crate) fn remote_delete(host: &mut Host, cats: &mut Cats, from: usize, table: TableId, key: u64) -> Result<()> {
    let Some(row) = host.partition.table(table).find(key) else {
        return Err(PodError::BadMessage { from, detail: "remote delete of an absent key" });
    };
    let stored = host.partition.table_mut(table).row_mut(row);
    if stored.is(row_flags::PLACEHOLDER) {
        // A committed remote insert whose InsertDone is still on its way: its pin is ours
        // until then, so the removal waits for it.
        stored.set(row_flags::DELETE_PENDING, true);
        return Ok(());
    }
    cats.delete_row(host, table, row)
}

// ---- requester side ----

/// Inserts `key` into `owner`'s partition through a shared placeholder (module docs).
pub(crate) fn insert_remote(
    host: &mut Host,
    protocol: &mut dyn Protocol,
    txn: &mut TxnState,
    (table, key, value): (TableId, u64, &[u8]),
    owner: usize,
) -> TxnResult<()> {
    host.counters.remote_accesses += 1;
    host.counters.remote_messages += 1;
    let request = host.next_request_id();
    let reply = exchange(host, protocol, vec![(owner, Message::RemoteInsert { request, table, key })])?;
    let (node, next_key, next_node) = match reply.into_iter().next().expect("one reply") {
        Message::RemoteInsertReply { outcome: InsertOutcome::Locked { node, next_key, next_node }, .. } => {
            (Off::new(node), next_key, Off::<CatNode>::new(next_node))
        }
        Message::RemoteInsertReply { outcome: InsertOutcome::Exists, .. } => return abort(Abort::User),
        Message::RemoteInsertReply { outcome: InsertOutcome::Conflict, .. } => return abort(Abort::Conflict),
        Message::RemoteInsertReply { outcome: InsertOutcome::OutOfMemory, .. } => return abort(Abort::OutOfMemory),
        _ => return Err(TxnError::Fatal(PodError::BadMessage { from: owner, detail: "expected an insert reply" })),
    };
    host.counters.tuple_ops += 1;
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
        abandon_insert(host, owner, table, key, node)?;
        if next_node.raw() != 0 {
            give_back(host, next_node, LockMode::Write)?;
        }
        return Err(error);
    }
    if next_node.raw() != 0 {
        hold_next_key(host, txn, table, owner, next_key, next_node)?;
    }
    Ok(())
}

/// Records the granted next-key lock as an access (released at commit or abort like any
/// CAT), or gives it back if the transaction already holds that key.
fn hold_next_key(
    host: &mut Host,
    txn: &mut TxnState,
    table: TableId,
    owner: usize,
    next_key: u64,
    node: Off<CatNode>,
) -> TxnResult<()> {
    if txn.find(table, next_key).is_some() {
        return Ok(give_back(host, node, LockMode::Write)?);
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
            give_back(host, node, LockMode::Write)?;
            Err(error)
        }
    }
}

/// A committed remote insert: the value went into the CAT like an update; the owner turns its
/// placeholder into the row.
pub(crate) fn finish_insert(host: &mut Host, owner: usize, table: TableId, key: u64) -> Result<()> {
    host.counters.remote_inserts += 1;
    host.send(owner, &Message::InsertDone { table, key, committed: true })
}

/// A delete this transaction committed: the CAT stays write-locked, our pin goes, the owner
/// removes the row.
pub(crate) fn hand_over_delete(
    host: &mut Host,
    owner: usize,
    table: TableId,
    key: u64,
    node_off: Off<CatNode>,
) -> Result<()> {
    let node: &CatNode = host.region.get(node_off);
    let latched = host.latch(node, node_off)?;
    node.unpin(&latched);
    drop(latched);
    host.counters.remote_deletes += 1;
    host.send(owner, &Message::RemoteDelete { table, key })
}

/// An insert this transaction will not commit: leave its placeholder locked, drop our pin,
/// and tell the owner to remove it.
pub(crate) fn abandon_insert(
    host: &mut Host,
    owner: usize,
    table: TableId,
    key: u64,
    node_off: Off<CatNode>,
) -> Result<()> {
    let node: &CatNode = host.region.get(node_off);
    let latched = host.latch(node, node_off)?;
    node.unpin(&latched);
    drop(latched);
    host.send(owner, &Message::InsertDone { table, key, committed: false })
}
