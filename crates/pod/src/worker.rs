//! A host process's worker: the loop that runs transactions and serves the other hosts, and the
//! [`TxnOps`] the workloads program against, dispatching each tuple to this host's rows or to
//! the protocol.
//!
//! ```text
//!  attach: map region ─ load partition (workload, then log replay if recovering) ─ start logger
//!  loop until Phase::Stop:  serve inbox (the protocol's handlers)
//!                           next transaction: attempt ─► commit | abort ─► back-off ─► retry
//!                           acknowledge transactions whose epoch is durable pod-wide
//!  finish: done barrier (keep serving) ─ seal log ─ wind down the protocol ─ check ─ publish
//! ```
//!
//! Invariants: requests are served only here, between transactions and inside waits (never
//! inside a handler), so handlers never nest; a phase's fetches are taken local ones first, then
//! the other hosts' in one batch.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::access::{abort, Abort, Change, Fetch, LockMode, TxnError, TxnOps, TxnResult, TxnState};
use crate::baseline::{Ds2pl, Occ};
use crate::checkpointer::Checkpointer;
use crate::config::{PodConfig, Protocol as ProtocolKind};
use crate::error::{PodError, Result};
use crate::host::{Host, PEER_WAIT_MAX};
use crate::log::Logger;
use crate::partition::TableId;
use crate::protocol::{serve_inbox, Protocol, RemoteFetch};
use crate::region::{HostStatus, Phase, Region};
use crate::stats::Counters;
use crate::tigon::Tigon;
use crate::workload::Driver;

/// A host's worker: its context and its protocol.
pub struct Worker {
    host: Host,
    protocol: Box<dyn Protocol>,
    checkpointer: Checkpointer,
    driver_totals: (u64, u64),
}

/// A transaction attempt running on a host.
struct ActiveTxn<'w> {
    host: &'w mut Host,
    protocol: &'w mut dyn Protocol,
    txn: &'w mut TxnState,
}

impl ActiveTxn<'_> {
    /// Finds or acquires `(table, key)` in `want` mode; the index of its access, or `None` if absent.
    fn access(&mut self, table: TableId, key: u64, want: LockMode) -> TxnResult<Option<usize>> {
        let policy = self.protocol.read_policy();
        if self.host.owns(table, key) {
            return self.host.access_local(self.txn, table, key, want, policy);
        }
        if self.txn.find(table, key).is_none() {
            let owner = self.host.workload.owner(table, key);
            self.protocol.access_remote(
                self.host,
                self.txn,
                &[RemoteFetch { owner, fetch: Fetch { table, key, lock: want } }],
            )?;
        }
        let Some(index) = self.txn.find(table, key) else { return Ok(None) };
        let access = self.txn.accesses[index];
        if access.change == Change::Delete {
            return Ok(None);
        }
        if access.lock < want && access.lock != LockMode::None {
            self.protocol.upgrade(self.host, self.txn, index)?;
            self.txn.accesses[index].lock = want;
        }
        Ok(Some(index))
    }
}

impl TxnOps for ActiveTxn<'_> {
    fn host(&self) -> usize {
        self.host.me
    }

    fn id(&self) -> u64 {
        self.txn.gid
    }

    fn fetch(&mut self, wanted: &[Fetch]) -> TxnResult<()> {
        let policy = self.protocol.read_policy();
        let mut remote = Vec::new();
        for &fetch in wanted {
            if self.host.owns(fetch.table, fetch.key) {
                self.host.access_local(self.txn, fetch.table, fetch.key, fetch.lock, policy)?;
            } else if self.txn.find(fetch.table, fetch.key).is_none() {
                let same =
                    |wanted: &&mut RemoteFetch| (wanted.fetch.table, wanted.fetch.key) == (fetch.table, fetch.key);
                match remote.iter_mut().find(same) {
                    Some(wanted) => wanted.fetch.lock = wanted.fetch.lock.max(fetch.lock),
                    None => remote.push(RemoteFetch { owner: self.host.workload.owner(fetch.table, fetch.key), fetch }),
                }
            }
        }
        if remote.is_empty() {
            return Ok(());
        }
        self.protocol.access_remote(self.host, self.txn, &remote)
    }

    fn read(&mut self, table: TableId, key: u64) -> TxnResult<Option<&[u8]>> {
        let index = self.access(table, key, LockMode::Read)?;
        Ok(index.and_then(|index| self.txn.value(index)))
    }

    fn read_for_update(&mut self, table: TableId, key: u64) -> TxnResult<Option<&[u8]>> {
        let index = self.access(table, key, LockMode::Write)?;
        Ok(index.and_then(|index| self.txn.value(index)))
    }

    fn write(&mut self, table: TableId, key: u64, value: &[u8]) -> TxnResult<()> {
        self.host.check_row_size(table, value)?;
        let Some(index) = self.access(table, key, LockMode::Write)? else {
            return Err(TxnError::Fatal(PodError::Workload(format!("write to absent key {key} of table {table}"))));
        };
        self.txn.set_value(index, value);
        let access = &mut self.txn.accesses[index];
        if access.change == Change::None {
            access.change = Change::Update;
        }
        Ok(())
    }

    fn insert(&mut self, table: TableId, key: u64, value: &[u8]) -> TxnResult<()> {
        self.host.check_row_size(table, value)?;
        if let Some(index) = self.txn.find(table, key) {
            if self.txn.accesses[index].change != Change::Delete {
                return abort(Abort::User);
            }
            self.txn.set_value(index, value);
            self.txn.accesses[index].change = Change::Update;
            return Ok(());
        }
        let owner = self.host.workload.owner(table, key);
        if owner != self.host.me {
            return self.protocol.insert_remote(self.host, self.txn, (table, key, value), owner);
        }
        let policy = self.protocol.read_policy();
        self.host.insert_local(self.txn, table, key, value, policy)
    }

    fn delete(&mut self, table: TableId, key: u64) -> TxnResult<()> {
        if !self.host.owns(table, key) && !self.protocol.deletes_remote() {
            return Err(TxnError::Fatal(PodError::Unsupported("baseline deletes from another host's partition")));
        }
        if let Some(index) = self.access(table, key, LockMode::Write)? {
            let access = &mut self.txn.accesses[index];
            if access.change == Change::Insert {
                return Err(TxnError::Fatal(PodError::Unsupported("deleting a row inserted by the same transaction")));
            }
            access.change = Change::Delete;
            access.value = None;
        }
        Ok(())
    }

    fn scan(&mut self, table: TableId, low: u64, high: u64, limit: usize) -> TxnResult<Vec<u64>> {
        let owner = self.host.workload.owner(table, low);
        if owner != self.host.me {
            return self.protocol.scan_remote(self.host, self.txn, table, (low, high, limit), owner);
        }
        let policy = self.protocol.read_policy();
        self.host.scan_local(self.txn, table, (low, high, limit), policy)
    }
}

impl Worker {
    /// Maps the host onto the region, loads its partition, picks its protocol.
    pub fn attach(me: usize, config: Arc<PodConfig>, region: &'static Region) -> Result<Worker> {
        let protocol: Box<dyn Protocol> = match config.protocol {
            ProtocolKind::Tigon => Box::new(Tigon::default()),
            ProtocolKind::Ds2pl => Box::new(Ds2pl::default()),
            ProtocolKind::Occ => Box::new(Occ::default()),
        };
        Ok(Worker {
            host: Host::attach(me, config, region)?,
            protocol,
            checkpointer: Checkpointer::default(),
            driver_totals: (0, 0),
        })
    }

    fn serve(&mut self) -> Result<bool> {
        serve_inbox(&mut self.host, self.protocol.as_mut())
    }

    fn run_transactions(&mut self) -> Result<Option<(Counters, Instant)>> {
        let host = &mut self.host;
        let seed = host.config.seed.wrapping_mul(0x2545_F491_4F6C_DD1D).wrapping_add(host.me as u64);
        let mut driver = host.workload.driver(host.me, seed, host.txn_seq);
        let mut window = None;
        let mut txn = TxnState::default();
        loop {
            let phase = self.host.phase();
            if phase >= Phase::Measure && window.is_none() {
                window = Some((self.host.window_start(), Instant::now()));
                let first_read = crate::staleness::read_time(self.host.counters.attempts + 1);
                self.host.shared().trace_window_start.store(first_read, Ordering::Release);
            }
            if phase >= Phase::Stop {
                break;
            }
            self.host.poll_point();
            self.serve()?;
            self.host.process_acks()?;
            self.checkpointer.step(&mut self.host)?;
            driver.next_transaction();
            self.run_one(driver.as_mut(), &mut txn)?;
        }
        self.driver_totals = driver.totals();
        Ok(window)
    }

    /// Runs the chosen transaction until it commits, the workload rolls it back, or the run stops.
    fn run_one(&mut self, driver: &mut dyn Driver, txn: &mut TxnState) -> Result<()> {
        let started = Instant::now();
        loop {
            self.host.begin(txn);
            self.host.counters.attempts += 1;
            let (host, protocol) = (&mut self.host, self.protocol.as_mut());
            let executed = driver.execute(&mut ActiveTxn { host, protocol, txn });
            let outcome = executed.and_then(|()| self.protocol.commit(&mut self.host, txn));
            let reason = match outcome {
                Ok(()) => {
                    self.host.counters.committed += 1;
                    self.host.counters.txn_latency.record_us(started.elapsed().as_micros() as u64);
                    driver.committed();
                    return Ok(());
                }
                Err(TxnError::Fatal(error)) => return Err(error),
                Err(TxnError::Abort(reason)) => reason,
            };
            self.protocol.abort(&mut self.host, txn).map_err(fatal_in_release)?;
            let counters = &mut self.host.counters;
            match reason {
                Abort::Conflict => counters.aborts_conflict += 1,
                Abort::OutOfMemory => counters.aborts_out_of_memory += 1,
                Abort::Validation => counters.aborts_validation += 1,
                Abort::User => {
                    counters.aborts_user += 1;
                    return Ok(());
                }
            }
            if self.host.phase() >= Phase::Stop {
                return Ok(());
            }
            self.back_off()?;
        }
    }

    /// Random back-off (0..backoff_max_us), serving other hosts meanwhile.
    fn back_off(&mut self) -> Result<()> {
        let wait = Duration::from_micros(self.host.rng.below(self.host.config.backoff_max_us.max(1)));
        let until = Instant::now() + wait;
        while Instant::now() < until {
            if !self.serve()? {
                std::thread::yield_now();
            }
        }
        Ok(())
    }

    fn finish(&mut self, logger: Option<Logger>, window: Option<(Counters, Instant)>) -> Result<()> {
        let header = self.host.region.header();
        let stopped = Instant::now();
        let last_read = crate::staleness::read_time(self.host.counters.attempts);
        self.host.shared().trace_window_end.store(last_read, Ordering::Release);
        let mut totals = self.host.snapshot();
        totals.cats_at_end = self.protocol.shared_tuples();
        totals.checkpoints = self.checkpointer.taken;
        header.done_hosts.fetch_add(1, Ordering::AcqRel);
        self.wait_all(|header| header.done_hosts.load(Ordering::Acquire))?;
        // Messages sent before their sender joined the barrier are in the ring by now.
        self.serve()?;
        self.host.log.finish(self.host.region, &self.host.layout, self.host.me);
        if let Some(logger) = logger {
            let stats = logger.join()?;
            totals.fsyncs = stats.fsyncs;
            totals.log_file_bytes = stats.bytes;
            totals.log_bytes_deleted = stats.bytes_deleted;
        }
        let drain_started = Instant::now();
        self.host.drain_acks()?;
        totals.ack_drain_ms = drain_started.elapsed().as_millis() as u64;
        totals.unacked_at_end = self.host.unacked();
        totals.acked = self.host.counters.acked;
        totals.commit_latency = self.host.counters.commit_latency;
        let mut failures = Vec::new();
        self.protocol.wind_down(&mut self.host, &mut failures)?;
        let check = self.host.workload.check(self.host.me, &self.host.partition);
        failures.extend(check.failures.iter().cloned());
        let mut published = match window {
            Some((start, at)) => {
                let mut window = totals.since(&start);
                window.measured_ns = stopped.duration_since(at).as_nanos() as u64;
                window
            }
            None => totals,
        };
        published.check_failures = failures.len() as u64;
        let (driver_a, driver_b) = self.driver_totals;
        published.check_value_a = check.value_a.wrapping_add(driver_a);
        published.check_value_b = check.value_b.wrapping_add(driver_b);
        if let Some(failure) = failures.first() {
            self.host.shared().set_error(&format!("check failed: {failure} ({} failures)", failures.len()));
        }
        self.host.write_history()?;
        self.host.publish(&published);
        header.finished_hosts.fetch_add(1, Ordering::AcqRel);
        self.wait_all(|header| header.finished_hosts.load(Ordering::Acquire))
    }

    /// Serves messages until `count(header)` reaches the number of hosts.
    fn wait_all(&mut self, count: impl Fn(&crate::region::Header) -> u64) -> Result<()> {
        let started = Instant::now();
        while count(self.host.region.header()) < self.host.config.hosts as u64 {
            if !self.serve()? {
                self.host.wait_for_inbox();
            }
            if started.elapsed() > PEER_WAIT_MAX {
                let waited_ms = PEER_WAIT_MAX.as_millis() as u64;
                return Err(PodError::PeerTimeout { host: self.host.me, waited_ms });
            }
        }
        Ok(())
    }
}

fn fatal_in_release(error: TxnError) -> PodError {
    match error {
        TxnError::Fatal(error) => error,
        TxnError::Abort(_) => PodError::Unsupported("releasing locks cannot abort"),
    }
}

/// A host process's whole life: attach, run, finish. Errors are left in the region for the launcher.
pub fn run(me: usize, config: Arc<PodConfig>, region: &'static Region) -> Result<()> {
    let mut worker = Worker::attach(me, config, region)?;
    worker.protocol.start(&mut worker.host)?;
    let logger = worker.host.start_logger()?;
    worker.host.shared().status.store(HostStatus::Running as u64, Ordering::Release);
    region.header().ready_hosts.fetch_add(1, Ordering::AcqRel);
    while worker.host.phase() < Phase::Warmup {
        worker.serve()?;
        std::thread::sleep(Duration::from_millis(1));
    }
    let window = worker.run_transactions()?;
    worker.finish(logger, window)
}
