//! The requester's side of Tigon: reaching another host's tuple through its CXL index, or by a
//! migration request when it is not shared yet, and finishing a CAT access at commit or abort.
//!
//! ```text
//!  phase (Tigon's process_requests): for each wanted key
//!     owner's CXL index ──hit──► latch word: validate, pin, NO_WAIT lock, SWcc before_read ──► read
//!          └─miss──► queue key for its owner
//!  then one Migrate (up to MIGRATE_KEYS_MAX keys) per owner, one wait for all replies; per
//!  moved node: search the index again (get_migrated_row), lock it (already pinned for us), read
//! ```
//!
//! Invariants: a node pinned for us is released by exactly one path — an access (commit or
//! abort) or, after the phase failed, an unpin right away; a lookup is only a hint, re-validated
//! under the node's latch.

use std::sync::atomic::Ordering;

use crate::access::{abort, Abort, Access, Change, LockMode, Place, TxnResult, TxnState};
use crate::cat::{release, transition};
use crate::config::CrashPoint;
use crate::cxl_index::Lookup;
use crate::error::{PodError, Result};
use crate::host::Host;
use crate::message::{Message, MigrateOutcome, MIGRATE_KEYS_MAX};
use crate::partition::TableId;
use crate::protocol::{exchange, Protocol, RemoteFetch};
use crate::region::Off;
use crate::word::{CatNode, MetaWord};

/// What latching a node for a transaction found.
pub(crate) enum Pinned {
    Locked,
    /// The node no longer describes the tuple (moved out, reused): ask the owner.
    Stale,
    Conflict,
}

/// A lock-free search of `owner`'s CXL index, counted with the HWcc lines it read.
pub(crate) fn search_remote_index(host: &mut Host, owner: usize, table: TableId, key: u64) -> Lookup {
    let lookup = host.index.lookup(host.region, owner, table, key);
    host.counters.remote_index_searches += 1;
    host.counters.hwcc_lines_read += u64::from(lookup.steps);
    lookup
}

/// Latches the node, checks it still is `(table, key)`, pins it (unless pinned already) and
/// takes the lock NO_WAIT; makes this host's cached copy of the block valid. A node pinned for
/// us that conflicts is unpinned here.
pub(crate) fn pin_and_lock(
    host: &mut Host,
    node_off: Off<CatNode>,
    (table, key): (TableId, u64),
    want: LockMode,
    pinned: bool,
) -> Result<Pinned> {
    let node: &CatNode = host.region.get(node_off);
    let mut latched = host.latch(node, node_off)?;
    let valid = node.key.load(Ordering::Relaxed) == key
        && node.table.load(Ordering::Relaxed) == u32::from(table)
        && latched.value.block_offset() != 0;
    if !valid {
        assert!(!pinned, "a pinned CAT went stale");
        return Ok(Pinned::Stale);
    }
    let Some(locked) = transition(latched.value, LockMode::None, want) else {
        if pinned {
            node.unpin(&latched);
        }
        return Ok(Pinned::Conflict);
    };
    if !pinned {
        node.pin(&latched);
    }
    let mut word = locked.with_flag(MetaWord::SECOND_CHANCE, true);
    let len = host.block_len(table);
    host.model_read(word.block_offset(), len);
    host.swcc_before_read(&mut word, len);
    latched.value = word;
    Ok(Pinned::Locked)
}

/// Reads the block of a CAT we hold locked into the transaction as an access.
fn push_cat(
    host: &mut Host,
    txn: &mut TxnState,
    owner: usize,
    node: Off<CatNode>,
    (table, key): (TableId, u64),
    lock: LockMode,
) -> TxnResult<()> {
    let (tid, value) = host.load_block(node, table);
    // A tuple access costs the transaction the same CPU work wherever the tuple lives.
    host.counters.tuple_ops += 1;
    let access = Access {
        table,
        key,
        place: Place::Cat { owner, node },
        lock,
        read_tid: Some(tid),
        value: None,
        change: Change::None,
    };
    txn.push(access, Some(&value))?;
    Ok(())
}

/// One phase of remote accesses (module docs): index hits first, then one migration exchange.
pub(crate) fn access_remote(
    host: &mut Host,
    protocol: &mut dyn Protocol,
    txn: &mut TxnState,
    wanted: &[RemoteFetch],
) -> TxnResult<()> {
    let mut misses = Vec::new();
    for &RemoteFetch { owner, fetch } in wanted {
        host.counters.remote_accesses += 1;
        let want = fetch.lock.max(LockMode::Read);
        let lookup = search_remote_index(host, owner, fetch.table, fetch.key);
        if let Some(node) = lookup.node {
            match pin_and_lock(host, node, (fetch.table, fetch.key), want, false)? {
                Pinned::Locked => {
                    host.counters.remote_index_hits += 1;
                    push_cat(host, txn, owner, node, (fetch.table, fetch.key), want)?;
                    continue;
                }
                Pinned::Conflict => return abort(Abort::Conflict),
                Pinned::Stale => {}
            }
        }
        misses.push(RemoteFetch { owner, fetch: crate::access::Fetch { lock: want, ..fetch } });
    }
    if misses.is_empty() {
        return Ok(());
    }
    let outcomes = migrate(host, protocol, &misses)?;
    adopt_moved(host, txn, &misses, outcomes)
}

/// Asks the owners to move the missed tuples in: one message per owner (per
/// [`MIGRATE_KEYS_MAX`] keys), one wait. The outcomes, in the order of `misses`.
fn migrate(host: &mut Host, protocol: &mut dyn Protocol, misses: &[RemoteFetch]) -> Result<Vec<MigrateOutcome>> {
    host.counters.remote_messages += misses.len() as u64;
    let mut requests = Vec::new();
    let mut order = Vec::new();
    let mut owners: Vec<usize> = misses.iter().map(|miss| miss.owner).collect();
    owners.sort_unstable();
    owners.dedup();
    for owner in owners {
        let mine: Vec<usize> = (0..misses.len()).filter(|at| misses[*at].owner == owner).collect();
        for chunk in mine.chunks(MIGRATE_KEYS_MAX) {
            let keys = chunk.iter().map(|at| (misses[*at].fetch.table, misses[*at].fetch.key)).collect();
            requests.push((owner, Message::Migrate { request: host.next_request_id(), keys }));
            order.push(chunk.to_vec());
        }
    }
    let replies = exchange(host, protocol, requests)?;
    let mut outcomes = vec![MigrateOutcome::NotFound; misses.len()];
    for (reply, chunk) in replies.into_iter().zip(order) {
        let from = misses[chunk[0]].owner;
        let Message::MigrateReply { outcomes: got, .. } = reply else {
            return Err(PodError::BadMessage { from, detail: "expected a migrate reply" });
        };
        if got.len() != chunk.len() {
            return Err(PodError::BadMessage { from, detail: "migrate reply with another number of keys" });
        }
        for (at, outcome) in chunk.into_iter().zip(got) {
            outcomes[at] = outcome;
        }
    }
    Ok(outcomes)
}

/// Locks every moved-in node for the transaction as Tigon's requester does after the reply
/// (`data_migration_response_handler` → `get_migrated_row`: a second index search, over lines
/// the owner's link just rewrote). The reply names the node, pinned for us, so the search normally
/// finds it; a concurrent unlink and reuse can send a lock-free search down another chain (see
/// [`crate::cxl_index`]), and then the reply's node is used: the search was still made and is
/// counted. After the first failure the remaining nodes are found the same way but only unpinned
/// (Tigon's response handler also runs for every reply of the phase).
fn adopt_moved(
    host: &mut Host,
    txn: &mut TxnState,
    misses: &[RemoteFetch],
    outcomes: Vec<MigrateOutcome>,
) -> TxnResult<()> {
    let mut failure = None;
    for (miss, outcome) in misses.iter().zip(outcomes) {
        let (table, key) = (miss.fetch.table, miss.fetch.key);
        let node = match outcome {
            MigrateOutcome::Moved { node } => Off::<CatNode>::new(node),
            MigrateOutcome::NotFound => continue,
            MigrateOutcome::OutOfMemory => {
                failure = failure.or(Some(Abort::OutOfMemory));
                continue;
            }
        };
        search_remote_index(host, miss.owner, table, key);
        if failure.is_some() {
            give_back(host, node, LockMode::None)?;
            continue;
        }
        match pin_and_lock(host, node, (table, key), miss.fetch.lock, true)? {
            Pinned::Locked => {
                if let Err(error) = push_cat(host, txn, miss.owner, node, (table, key), miss.fetch.lock) {
                    give_back(host, node, miss.fetch.lock)?;
                    return Err(error);
                }
            }
            Pinned::Conflict => failure = Some(Abort::Conflict),
            Pinned::Stale => unreachable!("a node pinned for us cannot go stale"),
        }
    }
    match failure {
        Some(reason) => abort(reason),
        None => Ok(()),
    }
}

/// Releases a granted lock and pin that no access of ours will release.
pub(crate) fn give_back(host: &mut Host, node_off: Off<CatNode>, held: LockMode) -> Result<()> {
    let node: &CatNode = host.region.get(node_off);
    let mut latched = host.latch(node, node_off)?;
    latched.value = release(latched.value, held);
    node.unpin(&latched);
    Ok(())
}

/// Raises a CAT access from read to write (NO_WAIT).
pub(crate) fn upgrade(host: &mut Host, node_off: Off<CatNode>) -> TxnResult<()> {
    let node: &CatNode = host.region.get(node_off);
    let mut latched = host.latch(node, node_off)?;
    match latched.value.try_upgrade() {
        Some(word) => {
            latched.value = word;
            Ok(())
        }
        None => abort(Abort::Conflict),
    }
}

/// Applies (on commit) and releases an update or read of a remote CAT, then unpins it.
pub(crate) fn finish_cat(host: &mut Host, txn: &TxnState, index: usize, commit_tid: Option<u64>) -> Result<()> {
    let access = txn.accesses[index];
    let Place::Cat { node: node_off, .. } = access.place else { unreachable!("not a CAT access") };
    let node: &CatNode = host.region.get(node_off);
    let wrote = commit_tid.is_some() && matches!(access.change, Change::Update | Change::Insert);
    let len = host.block_len(access.table);
    if let (true, Some(tid)) = (wrote, commit_tid) {
        let value = txn.value(index).expect("an update carries its value");
        // What we read under this lock is what the block holds; an insert's is unknown.
        let old = if access.change == Change::Update { txn.read_value(index) } else { None };
        host.write_block(node_off, tid, old, value);
        host.counters.tuple_ops += 1;
    }
    let mut latched = host.latch(node, node_off)?;
    host.maybe_crash(CrashPoint::HoldingLatch);
    let mut word = latched.value;
    if wrote {
        host.swcc_after_write(&mut word, len);
        word = word.with_flag(MetaWord::MODIFIED, true);
    }
    latched.value = release(word, access.lock);
    node.unpin(&latched);
    Ok(())
}
