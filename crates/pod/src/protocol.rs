//! The concurrency-control protocols behind one trait: how a transaction reaches other hosts'
//! tuples, how it commits and aborts, and how a host serves the other hosts' requests. Tigon
//! (crate::tigon), DS2PL+ (crate::baseline::Ds2pl) and OCC+ (crate::baseline::Occ) each own
//! their state (the CLOCK list of CATs; the locks and prepared writes of remote transactions).
//!
//! ```text
//!  worker ──► Protocol::access_remote(host, txn, [(owner, fetch)…])   one phase: one flush, one wait
//!         ──► Protocol::commit / abort(host, txn)
//!  waiting: exchange(host, protocol, requests) ─ send all ─ until every reply: serve_inbox
//!  serving: serve_inbox(host, protocol) ─ host.receive ─ Protocol::serve(host, from, message)
//! ```
//!
//! Invariants: a handler (`serve`) never waits for a reply, so serving never nests; every
//! request of a phase is sent before the phase waits (Tigon's `message_flusher` then
//! `pendingResponses` loop); a wait is bounded by [`PEER_WAIT_MAX`].

use std::time::Instant;

use crate::access::{Fetch, TxnError, TxnResult, TxnState};
use crate::error::{PodError, Result};
use crate::host::{Host, PEER_WAIT_MAX};
use crate::message::Message;
use crate::owned::ReadPolicy;
use crate::partition::TableId;

/// A tuple another host owns, wanted in one phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteFetch {
    pub owner: usize,
    pub fetch: Fetch,
}

pub(crate) trait Protocol {
    /// How local reads are taken (2PL locks them; OCC validates them at commit).
    fn read_policy(&self) -> ReadPolicy {
        ReadPolicy::Locking
    }

    /// Acquires the listed tuples of other hosts, none of them in the transaction yet: NO_WAIT
    /// locks (2PL) or versioned reads (OCC). Absent keys are simply not added. Every request
    /// this needs goes out before the one wait for all replies.
    fn access_remote(&mut self, host: &mut Host, txn: &mut TxnState, wanted: &[RemoteFetch]) -> TxnResult<()>;

    /// Raises access `index` (another host's tuple, held in read mode) to write.
    fn upgrade(&mut self, host: &mut Host, txn: &mut TxnState, index: usize) -> TxnResult<()>;

    /// Inserts into another host's partition.
    fn insert_remote(
        &mut self,
        _host: &mut Host,
        _txn: &mut TxnState,
        _row: (TableId, u64, &[u8]),
        _owner: usize,
    ) -> TxnResult<()> {
        Err(TxnError::Fatal(PodError::Unsupported("baseline inserts into another host's partition")))
    }

    /// Scans a range of another host's partition; the keys in range.
    fn scan_remote(
        &mut self,
        _host: &mut Host,
        _txn: &mut TxnState,
        _table: TableId,
        _range: (u64, u64, usize),
        _owner: usize,
    ) -> TxnResult<Vec<u64>> {
        Err(TxnError::Fatal(PodError::Unsupported("baseline scans of another host's partition")))
    }

    /// Whether a transaction may delete another host's row.
    fn deletes_remote(&self) -> bool {
        false
    }

    /// Commits (applies, logs, releases) or aborts with a reason.
    fn commit(&mut self, host: &mut Host, txn: &mut TxnState) -> TxnResult<()>;

    /// Releases everything an abandoned attempt holds, here and on other hosts.
    fn abort(&mut self, host: &mut Host, txn: &TxnState) -> TxnResult<()>;

    /// Handles another host's request.
    fn serve(&mut self, host: &mut Host, from: usize, message: Message) -> Result<()>;

    /// Before the first transaction (Tigon: pre-migration).
    fn start(&mut self, _host: &mut Host) -> Result<()> {
        Ok(())
    }

    /// After every host stopped: back to a state the post-run checks can read (Tigon: every
    /// CAT moved out), and the protocol's own invariants checked.
    fn wind_down(&mut self, host: &mut Host, failures: &mut Vec<String>) -> Result<()>;

    /// Tuples this host has in CXL right now.
    fn shared_tuples(&self) -> u64 {
        0
    }
}

/// Serves every request received so far; whether anything arrived.
pub(crate) fn serve_inbox(host: &mut Host, protocol: &mut dyn Protocol) -> Result<bool> {
    let any = host.receive()?;
    while let Some((from, message)) = host.next_request() {
        let served = match message {
            Message::Ping { request } => host.send(from, &Message::Pong { request }),
            message if message.reply_to().is_some() => unreachable!("receive queues replies apart"),
            message => protocol.serve(host, from, message),
        };
        match served {
            // A request that makes no sense here (a key with nothing in flight, another
            // protocol's message) is malformed: dropped, counted, not fatal.
            Err(PodError::BadMessage { from, detail }) => host.drop_malformed(from, detail),
            served => served?,
        }
    }
    Ok(any)
}

/// Sends every request, then waits for all replies while serving other hosts: one flush, one
/// wait (one round trip for the latency model however many hosts it involves). Replies come
/// back in the order of `requests`.
pub(crate) fn exchange(
    host: &mut Host,
    protocol: &mut dyn Protocol,
    requests: Vec<(usize, Message)>,
) -> Result<Vec<Message>> {
    let mut pending = Vec::with_capacity(requests.len());
    for (to, message) in requests {
        let request = request_id(&message).expect("exchange sends requests");
        host.await_request(request, true);
        pending.push((to, request, None));
        host.send(to, &message)?;
    }
    let replies = collect_replies(host, protocol, &mut pending);
    for (_, request, _) in &pending {
        host.await_request(*request, false);
    }
    replies
}

/// Waits until every pending request has its reply, serving other hosts meanwhile.
fn collect_replies(
    host: &mut Host,
    protocol: &mut dyn Protocol,
    pending: &mut [(usize, u32, Option<Message>)],
) -> Result<Vec<Message>> {
    if pending.is_empty() {
        return Ok(Vec::new());
    }
    host.counters.round_trips += 1;
    host.poll_point();
    let started = Instant::now();
    loop {
        for (_, request, reply) in pending.iter_mut().filter(|(_, _, reply)| reply.is_none()) {
            *reply = host.take_reply(*request);
        }
        if let Some(&(host_waited, ..)) = pending.iter().find(|(_, _, reply)| reply.is_none()) {
            if !serve_inbox(host, protocol)? {
                if started.elapsed() > PEER_WAIT_MAX {
                    let waited_ms = PEER_WAIT_MAX.as_millis() as u64;
                    return Err(PodError::PeerTimeout { host: host_waited, waited_ms });
                }
                host.wait_for_inbox();
            }
            continue;
        }
        host.poll_point();
        return Ok(pending.iter_mut().map(|(_, _, reply)| reply.take().expect("every reply arrived")).collect());
    }
}

/// The id a request carries (its reply names it).
fn request_id(message: &Message) -> Option<u32> {
    match message {
        Message::Migrate { request, .. }
        | Message::MigrateScan { request, .. }
        | Message::RemoteInsert { request, .. }
        | Message::Access { request, .. }
        | Message::Lock { request, .. }
        | Message::Prepare { request, .. }
        | Message::Decide { request, .. }
        | Message::Ping { request } => Some(*request),
        _ => None,
    }
}
