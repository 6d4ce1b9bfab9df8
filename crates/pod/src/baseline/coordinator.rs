//! The coordinator's side of the baselines, batched per phase as Tigon's executors do
//! (`TwoPLTransaction::process_requests`, `TwoPL::commit`): a phase's remote reads and locks go
//! out as one `Access` message per owner and the phase waits once; each commit round sends one
//! message per participant and waits once.
//!
//! ```text
//!  DS2PL+  phase: Access(items: ReadLock|WriteLock) per owner ─ one wait ─ values
//!          commit: read-only participants released (one-way Decide abort)
//!                  Prepare(writes) to writing participants ─► they log prepared records, reply
//!                  coordinator: TID, log local writes + commit record, apply,
//!                  Decide(commit, TID) ─► participants apply, release, acknowledge (2PC round 2)
//!  OCC+    phase: Access(items: ReadNoLock) per owner ─ one wait ─ values + TIDs (Silo-style)
//!          commit: lock local writes; Lock(keys) round; validate local reads and scans;
//!                  Prepare(writes, reads to validate) round; TID; log; apply; Decide round
//! ```
//!
//! Invariant: the coordinator reads the global epoch only after every participant logged its
//! prepare records, so its commit epoch covers theirs and recovery (commit record ⇒ writes) is sound.

use std::collections::BTreeMap;

use crate::access::{abort, Abort, Access, Change, LockMode, Place, TxnError, TxnResult, TxnState};
use crate::config::CrashPoint;
use crate::error::PodError;
use crate::host::Host;
use crate::message::{AccessItem, AccessMode, AccessOutcome, Message, ReadCheck, RemoteWrite, ACCESS_ITEMS_MAX};
use crate::protocol::{exchange, Protocol, RemoteFetch};
use crate::ring::MESSAGE_BYTES_MAX;

/// What a commit sends to one participant.
#[derive(Debug, Default)]
pub(crate) struct Participant {
    writes: Vec<RemoteWrite>,
    reads: Vec<ReadCheck>,
}

/// Bytes an access reply may spend on its outcomes (the rest is its header and slack).
const ACCESS_REPLY_BUDGET: usize = MESSAGE_BYTES_MAX - 64;

/// One phase of remote reads or locks: one `Access` message per owner (split where its reply
/// would not fit a ring slot), one wait; granted tuples join the transaction, a refusal aborts it.
pub(crate) fn access_remote(
    host: &mut Host,
    protocol: &mut dyn Protocol,
    txn: &mut TxnState,
    wanted: &[RemoteFetch],
    mode_of: impl Fn(LockMode) -> (AccessMode, LockMode),
) -> TxnResult<()> {
    host.counters.remote_accesses += wanted.len() as u64;
    host.counters.remote_messages += wanted.len() as u64;
    let chunks = chunk_by_owner(host, wanted);
    let requests = chunks
        .iter()
        .map(|(owner, chunk)| {
            let items = chunk
                .iter()
                .map(|wanted| {
                    let (mode, _) = mode_of(wanted.fetch.lock);
                    AccessItem { table: wanted.fetch.table, key: wanted.fetch.key, mode }
                })
                .collect();
            (*owner, Message::Access { request: host.next_request_id(), gid: txn.gid, items })
        })
        .collect();
    let replies = exchange(host, protocol, requests)?;
    let mut refused = false;
    for ((owner, chunk), reply) in chunks.into_iter().zip(replies) {
        let Message::AccessReply { outcomes, .. } = reply else {
            return Err(TxnError::Fatal(PodError::BadMessage { from: owner, detail: "expected an access reply" }));
        };
        if outcomes.len() != chunk.len() {
            let detail = "access reply with another number of items";
            return Err(TxnError::Fatal(PodError::BadMessage { from: owner, detail }));
        }
        for (wanted, outcome) in chunk.into_iter().zip(outcomes) {
            let (_, lock) = mode_of(wanted.fetch.lock);
            refused |= !push_remote(host, txn, wanted, lock, outcome)?;
        }
    }
    if refused {
        return abort(Abort::Conflict);
    }
    Ok(())
}

/// The wanted tuples grouped by owner, each group cut where its reply would outgrow a slot.
fn chunk_by_owner(host: &Host, wanted: &[RemoteFetch]) -> Vec<(usize, Vec<RemoteFetch>)> {
    let mut chunks: Vec<(usize, Vec<RemoteFetch>)> = Vec::new();
    let mut owners: Vec<usize> = wanted.iter().map(|wanted| wanted.owner).collect();
    owners.sort_unstable();
    owners.dedup();
    for owner in owners {
        let mut bytes = 0;
        let mut chunk = Vec::new();
        for wanted in wanted.iter().filter(|wanted| wanted.owner == owner) {
            let reply_bytes = 1 + 8 + 4 + host.row_bytes(wanted.fetch.table);
            if !chunk.is_empty() && (bytes + reply_bytes > ACCESS_REPLY_BUDGET || chunk.len() == ACCESS_ITEMS_MAX) {
                chunks.push((owner, std::mem::take(&mut chunk)));
                bytes = 0;
            }
            bytes += reply_bytes;
            chunk.push(*wanted);
        }
        chunks.push((owner, chunk));
    }
    chunks
}

/// Adds a granted tuple to the transaction; false if the owner refused it.
fn push_remote(
    host: &mut Host,
    txn: &mut TxnState,
    wanted: RemoteFetch,
    lock: LockMode,
    outcome: AccessOutcome,
) -> TxnResult<bool> {
    match outcome {
        AccessOutcome::Granted { tid, value } => {
            if value.len() != host.row_bytes(wanted.fetch.table) {
                let detail = "access reply with a value of another size than the row";
                return Err(TxnError::Fatal(PodError::BadMessage { from: wanted.owner, detail }));
            }
            // A tuple access costs the transaction the same CPU work wherever the tuple lives
            // (the owner's lookup and copy are counted on the owner).
            host.counters.tuple_ops += 1;
            let access = Access {
                table: wanted.fetch.table,
                key: wanted.fetch.key,
                place: Place::Remote { owner: wanted.owner },
                lock,
                read_tid: Some(tid),
                value: None,
                change: Change::None,
            };
            txn.push(access, Some(&value))?;
            Ok(true)
        }
        AccessOutcome::Conflict => Ok(false),
        AccessOutcome::NotFound => Ok(true),
    }
}

/// DS2PL+: raises a remote read lock to a write lock (one round trip).
pub(crate) fn upgrade(host: &mut Host, protocol: &mut dyn Protocol, txn: &mut TxnState, index: usize) -> TxnResult<()> {
    let access = txn.accesses[index];
    let Place::Remote { owner } = access.place else { unreachable!("a baseline's remote access") };
    let item = AccessItem { table: access.table, key: access.key, mode: AccessMode::WriteLock };
    let request = Message::Access { request: host.next_request_id(), gid: txn.gid, items: vec![item] };
    match exchange(host, protocol, vec![(owner, request)])?.pop() {
        Some(Message::AccessReply { outcomes, .. }) if matches!(outcomes[..], [AccessOutcome::Granted { .. }]) => {
            Ok(())
        }
        _ => abort(Abort::Conflict),
    }
}

/// Remote participants of a transaction with what each must apply and validate.
pub(crate) fn participants(txn: &TxnState) -> BTreeMap<usize, Participant> {
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

/// The participants with writes.
pub(crate) fn writers(parts: &BTreeMap<usize, Participant>) -> Vec<usize> {
    parts.iter().filter(|(_, part)| !part.writes.is_empty()).map(|(owner, _)| *owner).collect()
}

/// One round: `message(request, participant)` to each listed participant, one wait.
fn round(
    host: &mut Host,
    protocol: &mut dyn Protocol,
    owners: &[usize],
    mut message: impl FnMut(u32, usize) -> Message,
) -> TxnResult<Vec<Message>> {
    let requests = owners.iter().map(|&owner| (owner, message(host.next_request_id(), owner))).collect();
    Ok(exchange(host, protocol, requests)?)
}

/// 2PC's first round (with OCC's read validation when `with_reads`); true if all voted yes.
pub(crate) fn prepare_round(
    host: &mut Host,
    protocol: &mut dyn Protocol,
    gid: u64,
    owners: &[usize],
    parts: &mut BTreeMap<usize, Participant>,
    with_reads: bool,
) -> TxnResult<bool> {
    let replies = round(host, protocol, owners, |request, owner| {
        let part = parts.get_mut(&owner).expect("owner listed from parts");
        let reads = if with_reads { std::mem::take(&mut part.reads) } else { Vec::new() };
        Message::Prepare { request, gid, writes: std::mem::take(&mut part.writes), reads }
    })?;
    Ok(replies.iter().all(|reply| matches!(reply, Message::PrepareReply { ok: true, .. })))
}

/// OCC's lock round on the writing participants; the floor the commit TID must exceed.
pub(crate) fn lock_round(
    host: &mut Host,
    protocol: &mut dyn Protocol,
    gid: u64,
    writers: &[usize],
    parts: &BTreeMap<usize, Participant>,
) -> TxnResult<u64> {
    let replies = round(host, protocol, writers, |request, owner| Message::Lock {
        request,
        gid,
        keys: parts[&owner].writes.iter().map(|write| (write.table, write.key)).collect(),
    })?;
    let mut floor = 0;
    for reply in replies {
        match reply {
            Message::LockReply { ok: true, max_tid, .. } => floor = floor.max(max_tid + 1),
            _ => return abort(Abort::Conflict),
        }
    }
    Ok(floor)
}

/// Commits locally (log, apply, release) and tells writing participants the TID (2PC round 2).
pub(crate) fn commit_coordinator(
    host: &mut Host,
    protocol: &mut dyn Protocol,
    txn: &TxnState,
    writers: &[usize],
    floor: u64,
) -> TxnResult<()> {
    let (epoch, tid) = host.commit_tid(txn, floor);
    host.log_changes(txn, tid);
    host.maybe_crash(CrashPoint::MidEpoch);
    for index in 0..txn.accesses.len() {
        if let Place::Local(_) = txn.accesses[index].place {
            host.finish_owned(txn, index, Some(tid))?;
        }
    }
    let gid = txn.gid;
    let acks = round(host, protocol, writers, |request, _| Message::Decide { request, gid, commit: true, tid })?;
    if !acks.iter().all(|ack| matches!(ack, Message::Decided { .. })) {
        let detail = "expected a decision acknowledgement";
        return Err(TxnError::Fatal(PodError::BadMessage { from: writers[0], detail }));
    }
    host.after_commit(txn, epoch, tid)?;
    Ok(())
}

/// Abort: every remote participant releases what this transaction holds there (one-way).
pub(crate) fn abort_participants(host: &mut Host, txn: &TxnState) -> TxnResult<()> {
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
    release_participants(host, txn.gid, &owners)
}

/// Tells `owners` to drop everything `gid` holds there, without waiting.
pub(crate) fn release_participants(host: &mut Host, gid: u64, owners: &[usize]) -> TxnResult<()> {
    for &owner in owners {
        host.send(owner, &Message::Decide { request: 0, gid, commit: false, tid: 0 })?;
    }
    Ok(())
}
