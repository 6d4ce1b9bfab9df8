//! The two baselines Tigon is measured against, on the same tables, transport and logger:
//! DS2PL+ (NO_WAIT 2PL, remote reads and locks by message, two-phase commit) and OCC+ (a
//! Silo-style distributed OCC — not Sundial: no logical leases). "+" as in Tigon: workers send
//! and poll their own inbox, no output threads, and a phase's requests are batched.
//!
//! ```text
//!  coordinator (this host's transactions)      participant (other hosts' transactions here)
//!  access_remote, commit rounds, abort         holds, prepared writes, serve_* handlers
//! ```
//!
//! Both only scan, insert and delete in their own partition (a typed error otherwise).

mod coordinator;
mod participant;

use crate::access::{Change, LockMode, Place, TxnResult, TxnState};
use crate::error::{PodError, Result};
use crate::host::Host;
use crate::message::{AccessMode, Message};
use crate::owned::ReadPolicy;
use crate::partition::row_flags;
use crate::protocol::{Protocol, RemoteFetch};

use participant::Participant;

/// DS2PL+ on one host: what other hosts' transactions hold and prepared here.
#[derive(Debug, Default)]
pub(crate) struct Ds2pl {
    participant: Participant,
}

/// OCC+ on one host: what other hosts' transactions hold and prepared here.
#[derive(Debug, Default)]
pub(crate) struct Occ {
    participant: Participant,
}

/// A participant's handlers, the same for both baselines.
fn serve(participant: &mut Participant, host: &mut Host, from: usize, message: Message) -> Result<()> {
    match message {
        Message::Access { request, gid, items } => participant.serve_access(host, from, request, gid, &items),
        Message::Lock { request, gid, keys } => participant.serve_lock(host, from, request, gid, &keys),
        Message::Prepare { request, gid, writes, reads } => {
            participant.serve_prepare(host, from, request, gid, writes, &reads)
        }
        Message::Decide { request, gid, commit, tid } => {
            participant.serve_decide(host, from, request, gid, commit, tid)
        }
        _ => Err(PodError::BadMessage { from, detail: "a Tigon-style message sent to a baseline host" }),
    }
}

/// Both baselines' abort: local rows released, participants told.
fn abort_both(host: &mut Host, txn: &TxnState) -> TxnResult<()> {
    host.release_local(txn)?;
    coordinator::abort_participants(host, txn)
}

impl Protocol for Ds2pl {
    fn access_remote(&mut self, host: &mut Host, txn: &mut TxnState, wanted: &[RemoteFetch]) -> TxnResult<()> {
        coordinator::access_remote(host, self, txn, wanted, |want| match want {
            LockMode::Write => (AccessMode::WriteLock, LockMode::Write),
            _ => (AccessMode::ReadLock, LockMode::Read),
        })
    }

    fn upgrade(&mut self, host: &mut Host, txn: &mut TxnState, index: usize) -> TxnResult<()> {
        coordinator::upgrade(host, self, txn, index)
    }

    fn commit(&mut self, host: &mut Host, txn: &mut TxnState) -> TxnResult<()> {
        let mut parts = coordinator::participants(txn);
        let writers = coordinator::writers(&parts);
        let readers: Vec<usize> = parts.keys().copied().filter(|owner| !writers.contains(owner)).collect();
        coordinator::release_participants(host, txn.gid, &readers)?;
        if txn.is_read_only() {
            host.release_local(txn)?;
            host.commit_read_only(txn);
            return Ok(());
        }
        if !coordinator::prepare_round(host, self, txn.gid, &writers, &mut parts, false)? {
            return crate::access::abort(crate::access::Abort::Conflict);
        }
        coordinator::commit_coordinator(host, self, txn, &writers, 0)
    }

    fn abort(&mut self, host: &mut Host, txn: &TxnState) -> TxnResult<()> {
        abort_both(host, txn)
    }

    fn serve(&mut self, host: &mut Host, from: usize, message: Message) -> Result<()> {
        serve(&mut self.participant, host, from, message)
    }

    fn wind_down(&mut self, _host: &mut Host, failures: &mut Vec<String>) -> Result<()> {
        self.participant.check(failures);
        Ok(())
    }
}

impl Protocol for Occ {
    fn read_policy(&self) -> ReadPolicy {
        ReadPolicy::Optimistic
    }

    fn access_remote(&mut self, host: &mut Host, txn: &mut TxnState, wanted: &[RemoteFetch]) -> TxnResult<()> {
        coordinator::access_remote(host, self, txn, wanted, |_| (AccessMode::ReadNoLock, LockMode::None))
    }

    fn upgrade(&mut self, _host: &mut Host, _txn: &mut TxnState, _index: usize) -> TxnResult<()> {
        Ok(()) // OCC locks its writes at commit
    }

    fn commit(&mut self, host: &mut Host, txn: &mut TxnState) -> TxnResult<()> {
        lock_local_writes(host, txn)?;
        let mut parts = coordinator::participants(txn);
        let writers = coordinator::writers(&parts);
        let floor = coordinator::lock_round(host, self, txn.gid, &writers, &parts)?;
        validate_local(host, txn)?;
        let everyone: Vec<usize> = parts.keys().copied().collect();
        if !coordinator::prepare_round(host, self, txn.gid, &everyone, &mut parts, true)? {
            return crate::access::abort(crate::access::Abort::Validation);
        }
        if txn.is_read_only() {
            host.commit_read_only(txn);
            return Ok(());
        }
        coordinator::commit_coordinator(host, self, txn, &writers, floor)
    }

    fn abort(&mut self, host: &mut Host, txn: &TxnState) -> TxnResult<()> {
        abort_both(host, txn)
    }

    fn serve(&mut self, host: &mut Host, from: usize, message: Message) -> Result<()> {
        serve(&mut self.participant, host, from, message)
    }

    fn wind_down(&mut self, _host: &mut Host, failures: &mut Vec<String>) -> Result<()> {
        self.participant.check(failures);
        Ok(())
    }
}

/// OCC's first commit step on this host: write-lock the local rows it changes.
fn lock_local_writes(host: &mut Host, txn: &mut TxnState) -> TxnResult<()> {
    for index in 0..txn.accesses.len() {
        let access = txn.accesses[index];
        if let (Place::Local(row), Change::Update | Change::Delete, LockMode::None) =
            (access.place, access.change, access.lock)
        {
            host.lock_owned(access.table, row, LockMode::None, LockMode::Write)?;
            txn.accesses[index].lock = LockMode::Write;
        }
    }
    Ok(())
}

/// Silo's read validation on this host's rows (write set already locked) and scan re-checks.
fn validate_local(host: &Host, txn: &TxnState) -> TxnResult<()> {
    for access in &txn.accesses {
        let (Place::Local(row), Some(read), Change::None | Change::Update | Change::Delete) =
            (access.place, access.read_tid, access.change)
        else {
            continue;
        };
        let stored = host.partition.table(access.table).row(row);
        let locked_by_other = stored.lock.writer() && access.lock != LockMode::Write;
        if stored.lock.tid() != read || locked_by_other {
            return crate::access::abort(crate::access::Abort::Validation);
        }
    }
    for scan in &txn.scans {
        let table = host.partition.table(scan.table);
        let keys: Vec<u64> = table
            .range(scan.low, scan.high, scan.limit)
            .into_iter()
            .filter(|(_, row)| !table.row(*row).is(row_flags::PLACEHOLDER))
            .map(|(key, _)| key)
            .collect();
        if keys != scan.keys {
            return crate::access::abort(crate::access::Abort::Validation);
        }
    }
    Ok(())
}
