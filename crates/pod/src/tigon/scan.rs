//! Next-key locking across hosts for ordered tables (Tigon's DATA_MIGRATION_REQUEST_FOR_SCAN and
//! the next/prev-key bits of the metadata word, pod.md §2.3 and §3.3).
//!
//! ```text
//!  requester                                owner
//!  MigrateScan(table, low, high, limit) ──► rows in [low, high] (≤ limit) + the next key:
//!                                           refuse if one is a placeholder (insert in flight);
//!                                           move each in (or reuse its CAT), read-lock + pin it
//!                                           for the requester, mark the run contiguous
//!  ◄── MigrateScanReply(Locked{rows, next}) (keys, CAT nodes)
//!  read each CAT through the CXL (locks already held), check the run's next-key bits
//! ```
//!
//! The owner takes the read locks itself, before replying, so there is no window between its
//! view of the range and the requester's locks: an insert into the range must write-lock the key
//! after the new one (a locked row of the run, or the locked next key), a delete must write-lock
//! the row — both fail NO_WAIT until the scanner commits or aborts. Lock state lives in exactly
//! one tier, so read-locking a moved-in CAT is the same lock the owner's own transactions see.
//!
//! Bits: `NEXT_KEY_REAL` on a CAT says "the key after mine in the owner's partition is a CAT too"
//! and `PREV_KEY_REAL` the same for the key before. The owner keeps them true: it sets both when
//! it moves a row in next to a CAT, and clears the neighbours' bits when it moves a CAT out (also
//! on a delete) or inserts a row between two CATs. Our CXL index is a hash table with no ordered
//! walk, so a remote scan always asks the owner; the bits are the owner's promise that the run
//! it returned has no gaps, and the requester checks that promise on the words it locked.
//!
//! Invariant: a node the owner granted is read-locked and pinned once for the requester until
//! the requester's transaction ends (commit or abort releases it like any other CAT access).
//!
//! Limits: a scan needs fewer than [`SCAN_ROWS_MAX`] rows; a transaction that already holds a
//! key of the run in write mode conflicts with its own grant (NO_WAIT) and aborts; and since
//! every partition's supremum row has the same key, a transaction that reaches both another
//! host's supremum (end of a remote scan) and its own treats them as one access — no workload
//! does both in one transaction.

use std::sync::atomic::Ordering;

use crate::access::{abort, Abort, Access, Change, LockMode, Place, TxnError, TxnResult, TxnState};
use crate::cat::{release, transition};
use crate::error::{PodError, Result};
use crate::host::Host;
use crate::message::{Message, ScanOutcome, SCAN_ROWS_MAX};
use crate::partition::{row_flags, RowId, TableId, SUPREMUM_KEY};
use crate::protocol::{exchange, Protocol};
use crate::region::Off;
use crate::word::{CatNode, MetaWord};

use super::cats::Cats;
use super::requester::give_back;

/// Why the owner could not grant a row.
pub(crate) enum Refusal {
    Conflict,
    OutOfMemory,
}

// ---- owner side ----

/// Serves a remote range scan: the run becomes CATs read-locked for the requester (module docs).
pub(crate) fn grant_scan(
    host: &mut Host,
    cats: &mut Cats,
    from: usize,
    table: TableId,
    (low, high, limit): (u64, u64, usize),
) -> Result<ScanOutcome> {
    if !scannable(host, table, limit) {
        return Err(PodError::BadMessage { from, detail: "scan of a hash table, or of no or too many rows" });
    }
    let (run, in_range) = scan_run(host, table, low, high, limit);
    if run.iter().any(|(_, row)| host.partition.table(table).row(*row).is(row_flags::PLACEHOLDER)) {
        return Ok(ScanOutcome::Conflict);
    }
    let mut granted: Vec<(u64, Off<CatNode>)> = Vec::with_capacity(run.len());
    for &(key, row) in &run {
        match grant_lock(host, cats, table, row, LockMode::Read)? {
            Ok(node) => granted.push((key, node)),
            Err(refusal) => {
                for &(_, node) in &granted {
                    revoke_lock(host, node, LockMode::Read)?;
                }
                return Ok(match refusal {
                    Refusal::Conflict => ScanOutcome::Conflict,
                    Refusal::OutOfMemory => ScanOutcome::OutOfMemory,
                });
            }
        }
    }
    mark_run_contiguous(host, &granted)?;
    let mut rows: Vec<(u64, u64)> = granted.iter().map(|(key, node)| (*key, node.raw())).collect();
    let next = (rows.len() > in_range).then(|| rows.pop().expect("the run holds the next key"));
    Ok(ScanOutcome::Locked { rows, next })
}

/// Rows `[low, high]` (at most `limit`) and the next key, in key order; the count in range.
fn scan_run(host: &Host, table: TableId, low: u64, high: u64, limit: usize) -> (Vec<(u64, RowId)>, usize) {
    let rows = host.partition.table(table);
    let mut run = rows.range(low, high, limit);
    let in_range = run.len();
    let bound = if in_range == limit { run.last().map_or(high, |(key, _)| *key) } else { high };
    if bound < SUPREMUM_KEY {
        run.push(rows.next_key(bound));
    }
    (run, in_range)
}

/// Whether a remote scan of `limit` rows of `table` fits the protocol (same answer on every
/// host: all hosts have the same tables).
fn scannable(host: &Host, table: TableId, limit: usize) -> bool {
    usize::from(table) < host.partition.tables().len()
        && host.partition.table(table).spec.ordered
        && (1..SCAN_ROWS_MAX).contains(&limit)
}

/// Makes `row` a CAT pinned and locked in `want` mode for a remote transaction (NO_WAIT).
pub(crate) fn grant_lock(
    host: &mut Host,
    cats: &mut Cats,
    table: TableId,
    row: RowId,
    want: LockMode,
) -> Result<std::result::Result<Off<CatNode>, Refusal>> {
    let stored = host.partition.table(table).row(row);
    let node_off = if stored.is(row_flags::MIGRATED) {
        stored.shortcut
    } else {
        match cats.move_in(host, table, row, 0)? {
            Some(node) => node,
            None => return Ok(Err(Refusal::OutOfMemory)),
        }
    };
    let node: &CatNode = host.region.get(node_off);
    let mut latched = host.latch_owned(node, node_off)?;
    let Some(locked) = transition(latched.value, LockMode::None, want) else {
        return Ok(Err(Refusal::Conflict));
    };
    latched.value = locked;
    node.pin(&latched);
    Ok(Ok(node_off))
}

/// Undoes [`grant_lock`] (a later row was refused).
pub(crate) fn revoke_lock(host: &mut Host, node_off: Off<CatNode>, held: LockMode) -> Result<()> {
    let node: &CatNode = host.region.get(node_off);
    let mut latched = host.latch_owned(node, node_off)?;
    latched.value = release(latched.value, held);
    node.unpin(&latched);
    Ok(())
}

/// Sets the next/prev-key bits along a run of CATs that are neighbours in the partition.
fn mark_run_contiguous(host: &mut Host, run: &[(u64, Off<CatNode>)]) -> Result<()> {
    for (at, &(_, node_off)) in run.iter().enumerate() {
        let node: &CatNode = host.region.get(node_off);
        let mut latched = host.latch_owned(node, node_off)?;
        let mut word = latched.value;
        if at + 1 < run.len() {
            word = word.with_flag(MetaWord::NEXT_KEY_REAL, true);
        }
        if at > 0 {
            word = word.with_flag(MetaWord::PREV_KEY_REAL, true);
        }
        latched.value = word;
    }
    Ok(())
}

// ---- requester side ----

/// A Tigon scan of another host's ordered table: the owner grants the run read-locked, then
/// every row is read through the CXL like any CAT. Returns the keys in range.
pub(crate) fn scan_remote(
    host: &mut Host,
    protocol: &mut dyn Protocol,
    txn: &mut TxnState,
    table: TableId,
    (low, high, limit): (u64, u64, usize),
    owner: usize,
) -> TxnResult<Vec<u64>> {
    if !scannable(host, table, limit) {
        let what = "remote scans other than of 1 to 63 rows of an ordered table";
        return Err(TxnError::Fatal(PodError::Unsupported(what)));
    }
    host.counters.remote_accesses += 1;
    host.counters.remote_messages += 1;
    let request = host.next_request_id();
    let scan = Message::MigrateScan { request, table, low, high, limit: limit as u32 };
    let reply = exchange(host, protocol, vec![(owner, scan)])?.pop().expect("one reply");
    let (rows, next) = match reply {
        Message::MigrateScanReply { outcome: ScanOutcome::Locked { rows, next }, .. } => (rows, next),
        Message::MigrateScanReply { outcome: ScanOutcome::Conflict, .. } => return abort(Abort::Conflict),
        Message::MigrateScanReply { outcome: ScanOutcome::OutOfMemory, .. } => return abort(Abort::OutOfMemory),
        _ => return Err(TxnError::Fatal(PodError::BadMessage { from: owner, detail: "expected a scan reply" })),
    };
    let run: Vec<(u64, Off<CatNode>)> =
        rows.iter().chain(next.iter()).map(|(key, node)| (*key, Off::new(*node))).collect();
    adopt_run(host, txn, table, owner, &run)?;
    check_run_contiguous(host, &run)?;
    Ok(rows.iter().map(|(key, _)| *key).collect())
}

/// Turns every granted node into an access of `txn` (or, for a key the transaction already
/// holds, gives the extra grant back); on failure the rest is given back too.
fn adopt_run(
    host: &mut Host,
    txn: &mut TxnState,
    table: TableId,
    owner: usize,
    run: &[(u64, Off<CatNode>)],
) -> TxnResult<()> {
    for (at, &(key, node)) in run.iter().enumerate() {
        let adopted = if txn.find(table, key).is_some() {
            give_back(host, node, LockMode::Read).map_err(TxnError::Fatal)
        } else {
            adopt(host, txn, table, owner, key, node)
        };
        if let Err(error) = adopted {
            for &(_, rest) in &run[at + 1..] {
                give_back(host, rest, LockMode::Read)?;
            }
            return Err(error);
        }
    }
    Ok(())
}

/// Makes this host's copy of a granted CAT valid, reads it, records the read-locked access.
fn adopt(
    host: &mut Host,
    txn: &mut TxnState,
    table: TableId,
    owner: usize,
    key: u64,
    node_off: Off<CatNode>,
) -> TxnResult<()> {
    let node: &CatNode = host.region.get(node_off);
    {
        let mut latched = host.latch(node, node_off)?;
        assert!(
            node.key.load(Ordering::Relaxed) == key && latched.value.readers() > 0,
            "a granted CAT is the key's and read-locked"
        );
        let mut word = latched.value.with_flag(MetaWord::SECOND_CHANCE, true);
        let len = host.block_len(table);
        host.model_read(word.block_offset(), len);
        host.swcc_before_read(&mut word, len);
        latched.value = word;
    }
    let (tid, value) = host.load_block(node_off, table);
    host.counters.tuple_ops += 1;
    let access = Access {
        table,
        key,
        place: Place::Cat { owner, node: node_off },
        lock: LockMode::Read,
        read_tid: Some(tid),
        value: None,
        change: Change::None,
    };
    match txn.push(access, Some(&value)) {
        Ok(_) => Ok(()),
        Err(error) => {
            give_back(host, node_off, LockMode::Read)?;
            Err(error)
        }
    }
}

/// The owner's promise, checked on the words this transaction holds read-locked: every CAT
/// of the run but the last has a CAT as its next key, every one but the first a previous one.
fn check_run_contiguous(host: &mut Host, run: &[(u64, Off<CatNode>)]) -> TxnResult<()> {
    for (at, &(_, node_off)) in run.iter().enumerate() {
        let word = MetaWord(host.region.get(node_off).word.load(Ordering::Acquire));
        host.counters.hwcc_lines_read += 1;
        let next_ok = at + 1 == run.len() || word.flag(MetaWord::NEXT_KEY_REAL);
        let prev_ok = at == 0 || word.flag(MetaWord::PREV_KEY_REAL);
        if !(next_ok && prev_ok) {
            return Err(TxnError::Fatal(PodError::Unsupported(
                "a scanned run lost its next/prev-key bits while read-locked (owner bookkeeping bug)",
            )));
        }
    }
    Ok(())
}
