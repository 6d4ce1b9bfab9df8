//! One host process: its partition, its view of the region, its worker loop.
//!
//! ```text
//!  attach: map region ─ load partition (workload, then log replay if recovering) ─ start logger
//!  loop until Phase::Stop:  poll inbox (serve Migrate / Access / Lock / Prepare / Decide)
//!                           next transaction: attempt ─► commit | abort ─► back-off ─► retry
//!                           acknowledge transactions whose epoch is durable pod-wide
//!  finish: done barrier (keep serving) ─ seal log ─ move every CAT out ─ check ─ publish counters
//! ```
//!
//! Invariants: one worker thread owns everything here (the logger only sees sealed buffers);
//! requests are handled only at the top of `poll`, never inside a handler or a send (they are
//! deferred), so handlers never nest; every wait is bounded ([`PEER_WAIT_MAX`]).

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::alloc::{HwccArena, SwccArena};
use crate::coherence::Swcc;
use crate::config::{CrashPoint, CrashSpec, PodConfig, Protocol};
use crate::cxl_index::CxlIndex;
use crate::error::{PodError, Result};
use crate::history::{History, TxnRecord};
use crate::log::{FsyncCrash, LogWriter, Logger};
use crate::message::{Message, RemoteWrite};
use crate::partition::{IntMap, Partition};
use crate::region::{HostShared, HostStatus, Layout, Phase, Region, HOSTS_MAX, RING_SLOTS};
use crate::ring::Transport;
use crate::rng::SplitMix64;
use crate::stats::{BusySegments, Counters, LatencyTable};
use crate::tigon::ClockEntry;
use crate::txn::{Abort, ActiveTxn, Change, TxnError, TxnState};
use crate::workload::{Driver, Workload};

/// Longest a host waits for a peer (reply, ring space, barrier) before declaring it dead.
pub const PEER_WAIT_MAX: Duration = Duration::from_secs(20);
/// Transactions waiting for their epoch to become durable; a full queue stalls the worker.
pub const PENDING_ACKS_MAX: usize = 1 << 16;
/// Longest a finished host waits for the other hosts' final group commit before it stops
/// acknowledging. Their last fdatasync can take seconds when the disk is busy (5 s was too
/// short under other builds' write-back); a transaction left unacknowledged is reported as
/// such, never as durable.
pub const ACK_DRAIN_MAX: Duration = Duration::from_secs(60);
/// Requests held back while a send or a handler is in progress.
const DEFERRED_MAX: usize = RING_SLOTS * HOSTS_MAX;
/// Most transactions a host records for the serializability checker.
pub const HISTORY_TXNS_MAX: usize = 2_000_000;

pub struct Host {
    pub(crate) me: usize,
    pub(crate) config: Arc<PodConfig>,
    pub(crate) workload: Arc<dyn Workload>,
    pub(crate) region: &'static Region,
    pub(crate) layout: Layout,
    pub(crate) swcc: Swcc,
    pub(crate) transport: Transport,
    pub(crate) partition: Partition,
    pub(crate) hwcc: HwccArena,
    pub(crate) blocks: SwccArena,
    pub(crate) index: CxlIndex,
    pub(crate) clock: Vec<ClockEntry>,
    pub(crate) clock_hand: usize,
    pub(crate) counters: Counters,
    pub(crate) log: LogWriter,
    pub(crate) last_tid: u64,
    pub(crate) holds: IntMap<u64, Vec<crate::baseline::Hold>>,
    pub(crate) prepared: IntMap<u64, Vec<RemoteWrite>>,
    pub(crate) rng: SplitMix64,
    crash: Option<CrashSpec>,
    history: Option<History>,
    replies: VecDeque<Message>,
    deferred: VecDeque<(usize, Message)>,
    in_send: bool,
    handling: bool,
    receive_buffer: Vec<u8>,
    send_buffer: Vec<u8>,
    next_request: u32,
    txn_seq: u64,
    pending_acks: VecDeque<(u64, Instant)>,
    driver_totals: (u64, u64),
    busy: BusySegments,
}

/// The region layout a configuration implies (launcher and hosts agree on it).
pub fn layout_for(config: &PodConfig) -> Layout {
    let index_bytes = CxlIndex::bytes(config.index_buckets());
    let hwcc_per_host = config.hwcc_budget_per_host().max(index_bytes + 4096);
    Layout::new(config.hosts, hwcc_per_host, config.swcc_bytes_per_host)
}

impl Host {
    /// Maps the host onto the region and loads its partition.
    pub fn attach(me: usize, config: Arc<PodConfig>, region: &'static Region) -> Result<Host> {
        let layout = layout_for(&config);
        region.verify_header(&layout)?;
        let workload = config.workload.build(config.hosts);
        let mut partition = Partition::new(&workload.tables());
        workload.load(me, &mut partition);
        if config.recover {
            let dir = config.log_dir.as_deref().expect("validated: recover needs a log dir");
            crate::recovery::replay(dir, config.hosts, me, workload.as_ref(), &mut partition)?;
        }
        let buckets = region.header().index_buckets_per_host.load(Ordering::Relaxed);
        let index_bytes = CxlIndex::bytes(buckets);
        let hwcc =
            HwccArena::new(layout.hwcc_slice(me), layout.hwcc_per_host, config.hwcc_budget_per_host(), index_bytes)?;
        let seed = config.seed ^ (me as u64).wrapping_mul(0x9E37_79B9);
        let history = config.history_dir.as_ref().map(|dir| History::new(dir, me));
        let crash = config.crash.filter(|crash| crash.host == me && crash.point != CrashPoint::BeforeFsync);
        // Transaction ids must never repeat across restarts (recovery matches writes to commit
        // records by id): each run numbers from its starting epoch, above every earlier epoch.
        let start_epoch = region.header().global_epoch.load(Ordering::Acquire);
        assert!(start_epoch < 1 << 24, "epoch {start_epoch} leaves no room in transaction ids");
        Ok(Host {
            me,
            swcc: Swcc::new(config.effective_backend().build(seed)),
            transport: Transport::new(layout, me),
            blocks: SwccArena::new(layout.swcc_slice(me), layout.swcc_per_host),
            index: CxlIndex::new(layout, buckets),
            hwcc,
            partition,
            workload,
            region,
            layout,
            clock: Vec::new(),
            clock_hand: 0,
            counters: Counters::default(),
            log: LogWriter::disabled(),
            last_tid: 0,
            holds: IntMap::default(),
            prepared: IntMap::default(),
            rng: SplitMix64::new(seed),
            crash,
            history,
            replies: VecDeque::new(),
            deferred: VecDeque::new(),
            in_send: false,
            handling: false,
            receive_buffer: Vec::new(),
            send_buffer: Vec::new(),
            next_request: 0,
            txn_seq: start_epoch << 32,
            pending_acks: VecDeque::new(),
            driver_totals: (0, 0),
            busy: BusySegments::default(),
            config,
        })
    }

    pub(crate) fn shared(&self) -> &'static HostShared {
        self.region.host_shared(&self.layout, self.me)
    }

    fn phase(&self) -> Phase {
        Phase::from_raw(self.region.header().phase.load(Ordering::Acquire))
    }

    fn start_logger(&mut self) -> Result<Option<Logger>> {
        let Some(dir) = self.config.log_dir.clone() else {
            return Ok(None);
        };
        let crash = self
            .config
            .crash
            .filter(|crash| crash.host == self.me && crash.point == CrashPoint::BeforeFsync)
            .map(|crash| FsyncCrash { after: crash.after });
        let epoch_len = Duration::from_millis(self.config.epoch_ms);
        let (writer, logger) = Logger::spawn(self.region, self.layout, self.me, &dir, epoch_len, crash)?;
        self.log = writer;
        Ok(Some(logger))
    }

    // ---- messaging ----

    pub(crate) fn next_request_id(&mut self) -> u32 {
        self.next_request = self.next_request.wrapping_add(1);
        self.next_request
    }

    /// Sends, polling (and deferring requests) while the destination's inbox is full.
    pub(crate) fn send(&mut self, to: usize, message: &Message) -> Result<()> {
        message.encode(&mut self.send_buffer);
        let was_in_send = std::mem::replace(&mut self.in_send, true);
        let started = Instant::now();
        while !self.transport.try_send(self.region, &mut self.swcc, to, &self.send_buffer)? {
            self.poll()?;
            if started.elapsed() > PEER_WAIT_MAX {
                return Err(PodError::PeerTimeout { host: to, waited_ms: PEER_WAIT_MAX.as_millis() as u64 });
            }
            std::thread::yield_now();
        }
        self.in_send = was_in_send;
        Ok(())
    }

    /// Sends a request and waits for its reply, serving other hosts meanwhile.
    pub(crate) fn request(&mut self, to: usize, message: Message) -> Result<Message> {
        let Some(request) = request_id(&message) else { unreachable!("request() needs a request message") };
        self.send(to, &message)?;
        self.await_reply(to, request)
    }

    pub(crate) fn await_reply(&mut self, from: usize, request: u32) -> Result<Message> {
        self.counters.round_trips += 1;
        self.poll_point();
        let started = Instant::now();
        loop {
            if let Some(at) = self.replies.iter().position(|reply| reply.reply_to() == Some(request)) {
                self.poll_point();
                return Ok(self.replies.remove(at).expect("position is in range"));
            }
            if !self.poll()? {
                if started.elapsed() > PEER_WAIT_MAX {
                    return Err(PodError::PeerTimeout { host: from, waited_ms: PEER_WAIT_MAX.as_millis() as u64 });
                }
                self.transport.wait(self.region);
            }
        }
    }

    /// Marks a point where the worker polls its inbox: the modelled work since the previous
    /// one is a busy segment, during which a request from another host waits.
    fn poll_point(&mut self) {
        // The logical-time staleness is only known after the run ([`crate::staleness`]), and the
        // real-order re-reads depend on time-slicing, so busy segments leave block re-reads out
        // (a second-order term of the peer's wait; it slightly favours variants that send messages).
        let work_now_ns = LatencyTable::default().work_ns(&self.snapshot());
        self.busy.poll_point(work_now_ns, &mut self.counters);
    }

    /// Drains the inbox: replies are queued, requests handled (or deferred while nested).
    pub(crate) fn poll(&mut self) -> Result<bool> {
        let mut any = false;
        while let Some(from) = self.transport.try_receive(self.region, &mut self.swcc, &mut self.receive_buffer) {
            any = true;
            let message = Message::decode(from, &self.receive_buffer)?;
            if message.reply_to().is_some() {
                self.replies.push_back(message);
            } else if self.in_send || self.handling {
                assert!(self.deferred.len() < DEFERRED_MAX, "deferred requests exceed their bound");
                self.deferred.push_back((from, message));
            } else {
                self.handle(from, message)?;
            }
        }
        if !self.in_send && !self.handling {
            while let Some((from, message)) = self.deferred.pop_front() {
                self.handle(from, message)?;
            }
        }
        Ok(any)
    }

    fn handle(&mut self, from: usize, message: Message) -> Result<()> {
        self.handling = true;
        let result = match message {
            Message::Migrate { request, table, key } => self.serve_migrate(from, request, table, key),
            Message::MigrateScan { request, table, low, high, limit } => {
                self.serve_migrate_scan(from, request, table, low, high, limit)
            }
            Message::RemoteInsert { request, table, key } => self.serve_remote_insert(from, request, table, key),
            Message::InsertDone { table, key, committed } => self.serve_insert_done(from, table, key, committed),
            Message::RemoteDelete { table, key } => self.serve_remote_delete(from, table, key),
            Message::Access { request, gid, table, key, mode } => {
                self.serve_access(from, request, gid, table, key, mode)
            }
            Message::Lock { request, gid, keys } => self.serve_lock(from, request, gid, &keys),
            Message::Prepare { request, gid, writes, reads } => self.serve_prepare(from, request, gid, writes, &reads),
            Message::Decide { request, gid, commit, tid } => self.serve_decide(from, request, gid, commit, tid),
            Message::Ping { request } => self.send(from, &Message::Pong { request }),
            _ => Err(PodError::BadMessage { from, detail: "a reply kind arrived as a request" }),
        };
        self.handling = false;
        result
    }

    // ---- transactions ----

    fn run_transactions(&mut self) -> Result<Option<(Counters, Instant)>> {
        let seed = self.config.seed.wrapping_mul(0x2545_F491_4F6C_DD1D).wrapping_add(self.me as u64);
        let mut driver = self.workload.driver(self.me, seed, self.txn_seq);
        let mut window = None;
        let mut txn = TxnState::default();
        loop {
            let phase = self.phase();
            if phase >= Phase::Measure && window.is_none() {
                window = Some((self.window_start(), Instant::now()));
                let first_read = crate::staleness::read_time(self.counters.attempts + 1);
                self.shared().trace_window_start.store(first_read, Ordering::Release);
            }
            if phase >= Phase::Stop {
                break;
            }
            self.poll_point();
            self.poll()?;
            self.process_acks();
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
            self.begin(txn);
            self.counters.attempts += 1;
            let executed = driver.execute(&mut ActiveTxn { host: self, txn });
            let outcome = executed.and_then(|()| self.commit(txn));
            let reason = match outcome {
                Ok(()) => {
                    self.counters.committed += 1;
                    self.counters.txn_latency.record_us(started.elapsed().as_micros() as u64);
                    driver.committed();
                    return Ok(());
                }
                Err(TxnError::Fatal(error)) => return Err(error),
                Err(TxnError::Abort(reason)) => reason,
            };
            self.release_all(txn).map_err(fatal_in_release)?;
            match reason {
                Abort::Conflict => self.counters.aborts_conflict += 1,
                Abort::OutOfMemory => self.counters.aborts_out_of_memory += 1,
                Abort::Validation => self.counters.aborts_validation += 1,
                Abort::User => {
                    self.counters.aborts_user += 1;
                    return Ok(());
                }
            }
            if self.phase() >= Phase::Stop {
                return Ok(());
            }
            self.back_off()?;
        }
    }

    fn begin(&mut self, txn: &mut TxnState) {
        self.txn_seq += 1;
        txn.reset(((self.me as u64) << 56) | self.txn_seq);
        let global = self.region.header().global_epoch.load(Ordering::Acquire);
        self.log.enter_epoch(global, self.region, &self.layout, self.me);
    }

    fn commit(&mut self, txn: &mut TxnState) -> crate::txn::TxnResult<()> {
        match self.config.protocol {
            Protocol::Tigon => self.tigon_commit(txn),
            Protocol::Ds2pl => self.ds2pl_commit(txn),
            Protocol::Occ => self.occ_commit(txn),
        }
    }

    /// Random back-off (0..backoff_max_us), serving other hosts meanwhile.
    fn back_off(&mut self) -> Result<()> {
        let wait = Duration::from_micros(self.rng.below(self.config.backoff_max_us.max(1)));
        let until = Instant::now() + wait;
        while Instant::now() < until {
            if !self.poll()? {
                std::thread::yield_now();
            }
        }
        Ok(())
    }

    // ---- acknowledgement ----

    pub(crate) fn queue_ack(&mut self, epoch: u64) {
        if !self.log.enabled() {
            self.acknowledge(Instant::now());
            return;
        }
        while self.pending_acks.len() >= PENDING_ACKS_MAX {
            self.process_acks();
            std::thread::yield_now();
        }
        self.pending_acks.push_back((epoch, Instant::now()));
    }

    fn pod_durable_epoch(&self) -> u64 {
        (0..self.config.hosts)
            .map(|host| self.region.host_shared(&self.layout, host).durable_epoch.load(Ordering::Acquire))
            .min()
            .unwrap_or(0)
    }

    fn process_acks(&mut self) {
        if self.pending_acks.is_empty() {
            return;
        }
        let durable = self.pod_durable_epoch();
        while let Some(&(epoch, committed_at)) = self.pending_acks.front() {
            if epoch > durable {
                break;
            }
            self.pending_acks.pop_front();
            self.acknowledge(committed_at);
        }
    }

    fn acknowledge(&mut self, committed_at: Instant) {
        self.counters.acked += 1;
        self.counters.commit_latency.record_us(committed_at.elapsed().as_micros() as u64);
        self.shared().acked_txns.fetch_add(1, Ordering::Release);
    }

    // ---- history, crash points ----

    pub(crate) fn record_history(&mut self, txn: &TxnState, tid: u64) {
        let Some(history) = &mut self.history else {
            return;
        };
        if history.len() >= HISTORY_TXNS_MAX {
            history.truncated = true;
            return;
        }
        let mut record = TxnRecord { gid: txn.gid, reads: Vec::new(), writes: Vec::new() };
        for access in &txn.accesses {
            if let Some(read) = access.read_tid {
                record.reads.push((access.table, access.key, read));
            }
            if access.change != Change::None {
                record.writes.push((access.table, access.key, tid));
            }
        }
        history.push(record);
    }

    pub(crate) fn maybe_crash(&mut self, point: CrashPoint) {
        if let Some(crash) = &mut self.crash {
            if crash.point == point {
                crash.after -= 1;
                if crash.after == 0 {
                    crash_now();
                }
            }
        }
    }

    // ---- end of run ----

    /// Every counter of this host right now (worker, SWcc, transport, log, arenas).
    /// The snapshot a measured window subtracts. Acknowledgements still pending count as given
    /// here: they belong to transactions committed before the window, so the window's `acked`
    /// covers exactly the transactions it committed.
    fn window_start(&self) -> Counters {
        let mut start = self.snapshot();
        start.acked += self.pending_acks.len() as u64;
        start
    }

    fn snapshot(&self) -> Counters {
        let mut counters = self.counters.clone();
        let swcc = self.swcc.counters;
        counters.swcc_invalidated_lines = swcc.invalidated_lines;
        counters.swcc_written_back_lines = swcc.written_back_lines;
        counters.coherent_fetched_lines = swcc.coherent_fetched_lines;
        counters.coherent_written_lines = swcc.coherent_written_lines;
        counters.block_fetched_lines = swcc.block_fetched_lines;
        counters.swcc_fences = swcc.fences;
        counters.swcc_loaded_bytes = swcc.loaded_bytes;
        counters.swcc_stored_bytes = swcc.stored_bytes;
        let ring = self.transport.counters;
        counters.messages_sent = ring.sent;
        counters.message_bytes = ring.sent_bytes;
        counters.messages_received = ring.received;
        counters.ring_full_retries = ring.full_retries;
        counters.ring_sleeps = ring.sleeps;
        counters.log_bytes = self.log.bytes;
        counters.log_records = self.log.records;
        counters.committed_all = self.counters.committed;
        counters.hwcc_peak_bytes = self.hwcc.peak_bytes();
        counters.swcc_peak_bytes = self.blocks.peak_bytes();
        counters.cats_at_end = self.clock.len() as u64;
        counters
    }

    fn finish(&mut self, logger: Option<Logger>, window: Option<(Counters, Instant)>) -> Result<()> {
        let header = self.region.header();
        let stopped = Instant::now();
        let last_read = crate::staleness::read_time(self.counters.attempts);
        self.shared().trace_window_end.store(last_read, Ordering::Release);
        let mut totals = self.snapshot();
        header.done_hosts.fetch_add(1, Ordering::AcqRel);
        self.wait_all(|header| header.done_hosts.load(Ordering::Acquire))?;
        // Messages sent before their sender joined the barrier are in the ring by now.
        self.poll()?;
        self.log.finish(self.region, &self.layout, self.me);
        if let Some(logger) = logger {
            let stats = logger.join()?;
            totals.fsyncs = stats.fsyncs;
            totals.log_file_bytes = stats.bytes;
        }
        let drain_started = Instant::now();
        self.drain_acks();
        totals.ack_drain_ms = drain_started.elapsed().as_millis() as u64;
        totals.unacked_at_end = self.pending_acks.len() as u64;
        totals.acked = self.counters.acked;
        totals.commit_latency = self.counters.commit_latency;
        self.evict_all()?;
        let mut check = self.workload.check(self.me, &self.partition);
        self.check_baseline_state(&mut check.failures);
        let mut published = match window {
            Some((start, at)) => {
                let mut window = totals.since(&start);
                window.measured_ns = stopped.duration_since(at).as_nanos() as u64;
                window
            }
            None => totals,
        };
        published.check_failures = check.failures.len() as u64;
        let (driver_a, driver_b) = self.driver_totals;
        published.check_value_a = check.value_a.wrapping_add(driver_a);
        published.check_value_b = check.value_b.wrapping_add(driver_b);
        if let Some(failure) = check.failures.first() {
            self.shared().set_error(&format!("check failed: {failure} ({} failures)", check.failures.len()));
        }
        if let Some(history) = self.history.take() {
            history.write()?;
        }
        self.publish(&published);
        header.finished_hosts.fetch_add(1, Ordering::AcqRel);
        self.wait_all(|header| header.finished_hosts.load(Ordering::Acquire))
    }

    /// Serves messages until `count(header)` reaches the number of hosts.
    fn wait_all(&mut self, count: impl Fn(&crate::region::Header) -> u64) -> Result<()> {
        let started = Instant::now();
        while count(self.region.header()) < self.config.hosts as u64 {
            if !self.poll()? {
                self.transport.wait(self.region);
            }
            if started.elapsed() > PEER_WAIT_MAX {
                return Err(PodError::PeerTimeout { host: self.me, waited_ms: PEER_WAIT_MAX.as_millis() as u64 });
            }
        }
        Ok(())
    }

    /// After the loggers finished, every remaining transaction's epoch is durable: acknowledge.
    fn drain_acks(&mut self) {
        let started = Instant::now();
        while !self.pending_acks.is_empty() && started.elapsed() < ACK_DRAIN_MAX {
            self.process_acks();
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn publish(&self, counters: &Counters) {
        let shared = self.shared();
        for (slot, word) in shared.stats.iter().zip(counters.to_words()) {
            slot.store(word, Ordering::Relaxed);
        }
        if shared.status.load(Ordering::Relaxed) != HostStatus::Failed as u64 {
            shared.status.store(HostStatus::Finished as u64, Ordering::Release);
        }
    }
}

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

fn fatal_in_release(error: TxnError) -> PodError {
    match error {
        TxnError::Fatal(error) => error,
        TxnError::Abort(_) => PodError::Unsupported("releasing locks cannot abort"),
    }
}

/// Kills this process the way a crash would (no unwinding, no flushing).
pub fn crash_now() -> ! {
    // SAFETY: signalling our own pid; SIGKILL cannot be caught, so nothing runs after it.
    unsafe {
        libc::kill(libc::getpid(), libc::SIGKILL);
    }
    std::process::abort()
}

/// A host process's whole life: attach, run, finish. Errors are left in the region for the launcher.
pub fn run(me: usize, config: Arc<PodConfig>, region: &'static Region) -> Result<()> {
    let mut host = Host::attach(me, config, region)?;
    if host.config.pre_migrate && host.config.protocol == Protocol::Tigon {
        host.pre_migrate()?;
    }
    let logger = host.start_logger()?;
    host.shared().status.store(HostStatus::Running as u64, Ordering::Release);
    region.header().ready_hosts.fetch_add(1, Ordering::AcqRel);
    while host.phase() < Phase::Warmup {
        host.poll()?;
        std::thread::sleep(Duration::from_millis(1));
    }
    let window = host.run_transactions()?;
    host.finish(logger, window)
}
