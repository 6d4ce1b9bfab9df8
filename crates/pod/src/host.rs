//! One host's context: its partition, its view of the region (arenas, CXL index, coherence),
//! its transport, its log and its counters — plain state and the small operations on it that no
//! protocol decides (messaging, acknowledgement, commit TIDs, logging, counters).
//!
//! ```text
//!  Host ── partition (DRAM rows) ── region: HWcc arena, SWcc blocks, CXL index, Swcc cache
//!       ── transport: send (never serves), receive → replies / requests queues
//!       ── log writer ── pending acknowledgements ── counters, busy segments, history
//! ```
//!
//! What a protocol does with all this lives above (crate::protocol and its implementations);
//! the worker loop that drives transactions and serves requests lives at the top
//! (crate::worker). Invariants: one worker thread owns everything here (the logger only sees
//! sealed buffers); `send` and `receive` never run a request handler — requests wait in a
//! bounded queue until the worker serves them — so handlers never nest; every wait is bounded
//! ([`PEER_WAIT_MAX`]).

use std::collections::VecDeque;
use std::io::Write;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::access::{Change, TxnState};
use crate::alloc::{HwccArena, SwccArena};
use crate::coherence::Swcc;
use crate::config::{CrashPoint, CrashSpec, PodConfig};
use crate::cxl_index::CxlIndex;
use crate::error::{PodError, Result};
use crate::history::{History, TxnRecord};
use crate::log::{acked_path, Acked, FsyncCrash, LogWriter, Logger, ACKED_BYTES};
use crate::message::{Limits, Message};
use crate::partition::{Partition, TableId};
use crate::region::{HostShared, HostStatus, Layout, Phase, Region, HOSTS_MAX, RING_SLOTS};
use crate::ring::Transport;
use crate::rng::SplitMix64;
use crate::stats::{BusySegments, Counters, LatencyTable};
use crate::word::CAT_NODE_BYTES;
use crate::workload::Workload;

/// Longest a host waits for a peer (reply, ring space, barrier) before declaring it dead.
pub const PEER_WAIT_MAX: Duration = Duration::from_secs(20);
/// Transactions waiting for their epoch to become durable; a full queue stalls the worker.
pub const PENDING_ACKS_MAX: usize = 1 << 16;
/// Longest a finished host waits for the other hosts' final group commit before it stops
/// acknowledging. Their last fdatasync can take seconds when the disk is busy (5 s was too
/// short under other builds' write-back); a transaction left unacknowledged is reported as
/// such, never as durable.
pub const ACK_DRAIN_MAX: Duration = Duration::from_secs(60);
/// Requests received but not yet served (every peer can fill our ring while we send).
const REQUESTS_MAX: usize = RING_SLOTS * HOSTS_MAX;
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
    pub(crate) counters: Counters,
    pub(crate) log: LogWriter,
    pub(crate) last_tid: u64,
    pub(crate) rng: SplitMix64,
    /// Transactions numbered from the run's start epoch (ids never repeat across restarts).
    pub(crate) txn_seq: u64,
    crash: Option<CrashSpec>,
    history: Option<History>,
    /// What a well-formed message may name (tables, CAT nodes, row sizes).
    limits: Limits,
    inbox: Inbox,
    pending_acks: VecDeque<PendingAck>,
    /// `acked-H.ids` when acknowledged transactions are recorded.
    acked_file: Option<std::fs::File>,
    busy: BusySegments,
}

/// A committed transaction waiting for its epoch to become durable pod-wide.
#[derive(Debug, Clone, Copy)]
struct PendingAck {
    acked: Acked,
    committed_at: Instant,
}

/// Messages received and not yet consumed, and the buffers of the transport.
#[derive(Default)]
struct Inbox {
    replies: VecDeque<Message>,
    requests: VecDeque<(usize, Message)>,
    receive_buffer: Vec<u8>,
    send_buffer: Vec<u8>,
    next_request: u32,
    /// Requests of ours waiting for their replies; any other reply is malformed.
    awaiting: Vec<u32>,
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
        let mut counters = Counters::default();
        let partition = if config.recover {
            let dir = config.log_dir.as_deref().expect("validated: recover needs a log dir");
            let durable = region.header().recovered_epoch.load(Ordering::Acquire);
            let (partition, _) = crate::recovery::rebuild(dir, config.hosts, me, workload.as_ref(), durable)?;
            let (checked, missing) =
                crate::recovery::check_receipts(dir, config.hosts, me, workload.as_ref(), &partition)?;
            counters.receipts_checked = checked;
            counters.receipts_missing = missing;
            partition
        } else {
            let mut partition = Partition::new(&workload.tables());
            workload.load(me, &mut partition);
            partition
        };
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
        let limits = Limits {
            row_bytes: partition.tables().iter().map(|table| table.spec.row_bytes).collect(),
            hwcc: layout.hwcc..layout.hwcc + config.hosts as u64 * layout.hwcc_per_host,
            node_bytes: CAT_NODE_BYTES,
        };
        Ok(Host {
            me,
            limits,
            swcc: Swcc::new(config.effective_backend().build(seed)),
            transport: Transport::new(layout, me),
            blocks: SwccArena::new(layout.swcc_slice(me), layout.swcc_per_host),
            index: CxlIndex::new(layout, buckets),
            hwcc,
            partition,
            workload,
            region,
            layout,
            counters,
            log: LogWriter::disabled(),
            last_tid: 0,
            rng: SplitMix64::new(seed),
            txn_seq: start_epoch << 32,
            crash,
            history,
            inbox: Inbox::default(),
            pending_acks: VecDeque::new(),
            acked_file: None,
            busy: BusySegments::default(),
            config,
        })
    }

    pub(crate) fn shared(&self) -> &'static HostShared {
        self.region.host_shared(&self.layout, self.me)
    }

    pub(crate) fn phase(&self) -> Phase {
        Phase::from_raw(self.region.header().phase.load(Ordering::Acquire))
    }

    pub(crate) fn start_logger(&mut self) -> Result<Option<Logger>> {
        let Some(dir) = self.config.log_dir.clone() else {
            return Ok(None);
        };
        let crash = self
            .config
            .crash
            .filter(|crash| crash.host == self.me && crash.point == CrashPoint::BeforeFsync)
            .map(|crash| FsyncCrash { after: crash.after });
        let timing = (Duration::from_millis(self.config.epoch_ms), self.config.log_segment_bytes);
        let (writer, logger) = Logger::spawn(self.region, self.layout, self.me, &dir, timing, crash)?;
        self.log = writer;
        if self.config.record_acked {
            let path = acked_path(&dir, self.me);
            let file = std::fs::OpenOptions::new().create(true).append(true).open(&path);
            self.acked_file = Some(file.map_err(|source| PodError::FileIo { path, source })?);
        }
        Ok(Some(logger))
    }

    // ---- messaging (no handler runs here; see the module docs) ----

    pub(crate) fn next_request_id(&mut self) -> u32 {
        self.inbox.next_request = self.inbox.next_request.wrapping_add(1).max(1);
        self.inbox.next_request
    }

    /// Sends, receiving (never serving) while the destination's inbox is full: our own inbox
    /// keeps draining, so two hosts sending to each other cannot block each other.
    pub(crate) fn send(&mut self, to: usize, message: &Message) -> Result<()> {
        message.encode(&mut self.inbox.send_buffer);
        let started = Instant::now();
        while !self.transport.try_send(self.region, &mut self.swcc, to, &self.inbox.send_buffer)? {
            self.receive()?;
            if started.elapsed() > PEER_WAIT_MAX {
                return Err(PodError::PeerTimeout { host: to, waited_ms: PEER_WAIT_MAX.as_millis() as u64 });
            }
            std::thread::yield_now();
        }
        Ok(())
    }

    /// Drains the inbox into the reply and request queues; whether anything arrived. A message
    /// that does not decode, breaks the pod's limits, or answers no request of ours is dropped
    /// and counted ([`Host::drop_malformed`]).
    pub(crate) fn receive(&mut self) -> Result<bool> {
        let mut any = false;
        while let Some(from) = self.transport.try_receive(self.region, &mut self.swcc, &mut self.inbox.receive_buffer) {
            any = true;
            let message = match Message::decode(from, &self.inbox.receive_buffer) {
                Ok(message) => message,
                Err(PodError::BadMessage { detail, .. }) => {
                    self.drop_malformed(from, detail);
                    continue;
                }
                Err(error) => return Err(error),
            };
            if let Err(detail) = message.check(&self.limits) {
                self.drop_malformed(from, detail);
                continue;
            }
            match message.reply_to() {
                Some(request) if self.inbox.awaiting.contains(&request) => self.inbox.replies.push_back(message),
                Some(_) => self.drop_malformed(from, "a reply to no request in flight"),
                None => {
                    assert!(self.inbox.requests.len() < REQUESTS_MAX, "queued requests exceed their bound");
                    self.inbox.requests.push_back((from, message));
                }
            }
        }
        Ok(any)
    }

    /// Another host sent something this host cannot use: it is dropped and counted (the first
    /// one per run is also reported on stderr), and the host carries on. A dropped request is
    /// never answered, so a peer that really waits for it fails with its own timeout.
    pub(crate) fn drop_malformed(&mut self, from: usize, detail: &str) {
        if self.counters.malformed_messages == 0 {
            eprintln!("pod host {}: dropped a malformed message from host {from}: {detail}", self.me);
        }
        self.counters.malformed_messages += 1;
    }

    /// Marks `request` as ours, in flight (its reply will be accepted) or done.
    pub(crate) fn await_request(&mut self, request: u32, waiting: bool) {
        if waiting {
            self.inbox.awaiting.push(request);
        } else {
            self.inbox.awaiting.retain(|pending| *pending != request);
        }
    }

    /// The reply to `request`, if it arrived.
    pub(crate) fn take_reply(&mut self, request: u32) -> Option<Message> {
        let at = self.inbox.replies.iter().position(|reply| reply.reply_to() == Some(request))?;
        self.inbox.replies.remove(at)
    }

    /// The oldest request not yet served.
    pub(crate) fn next_request(&mut self) -> Option<(usize, Message)> {
        self.inbox.requests.pop_front()
    }

    /// Sleeps briefly until something may have arrived (spin, then futex).
    pub(crate) fn wait_for_inbox(&mut self) {
        self.transport.wait(self.region);
    }

    /// Marks a point where the worker polls its inbox: the modelled work since the previous
    /// one is a busy segment, during which a request from another host waits.
    pub(crate) fn poll_point(&mut self) {
        // The logical-time staleness is only known after the run ([`crate::staleness`]), and the
        // real-order re-reads depend on time-slicing, so busy segments leave block re-reads out
        // (a second-order term of the peer's wait; it slightly favours variants that send messages).
        let work_now_ns = LatencyTable::default().work_ns(&self.snapshot());
        self.busy.poll_point(work_now_ns, &mut self.counters);
    }

    // ---- transactions: what every protocol does the same way ----

    pub(crate) fn row_bytes(&self, table: TableId) -> usize {
        self.partition.table(table).spec.row_bytes
    }

    /// Starts an attempt: a fresh transaction id, and the log buffer of the current epoch.
    pub(crate) fn begin(&mut self, txn: &mut TxnState) {
        self.txn_seq += 1;
        txn.reset(((self.me as u64) << 56) | self.txn_seq);
        let global = self.region.header().global_epoch.load(Ordering::Acquire);
        self.log.enter_epoch(global, self.region, &self.layout, self.me);
    }

    /// The commit TID and epoch (call once every lock is held).
    pub(crate) fn commit_tid(&self, txn: &TxnState, floor: u64) -> (u64, u64) {
        let epoch = self.region.header().global_epoch.load(Ordering::Acquire);
        let mut tid = (epoch << 32).max(self.last_tid + 1).max(floor);
        for access in &txn.accesses {
            if let Some(read) = access.read_tid {
                tid = tid.max(read + 1);
            }
        }
        (epoch, tid)
    }

    /// Appends redo records for every change this host logs and the commit record.
    pub(crate) fn log_changes(&mut self, txn: &TxnState, tid: u64) {
        for (index, access) in txn.accesses.iter().enumerate() {
            if let crate::access::Place::Remote { .. } = access.place {
                continue; // a 2PC participant logs its own part as prepared
            }
            match access.change {
                Change::None => {}
                Change::Delete => self.log.write(txn.gid, access.table, access.key, tid, None),
                Change::Update | Change::Insert => {
                    self.log.write(txn.gid, access.table, access.key, tid, txn.value(index))
                }
            }
        }
        self.log.commit(txn.gid, tid);
    }

    /// Bookkeeping after a commit: last TID, history, acknowledgement.
    pub(crate) fn after_commit(&mut self, txn: &TxnState, epoch: u64, tid: u64) -> Result<()> {
        self.last_tid = tid;
        self.record_history(txn, tid);
        let acked = Acked { gid: txn.gid, epoch, buffer_epoch: self.log.buffer_epoch() };
        self.queue_ack(acked)
    }

    /// A read-only transaction commits without a TID or a log record.
    pub(crate) fn commit_read_only(&mut self, txn: &TxnState) {
        self.counters.committed_read_only += 1;
        self.record_history(txn, 0);
    }

    // ---- acknowledgement ----

    fn queue_ack(&mut self, acked: Acked) -> Result<()> {
        if !self.log.enabled() {
            self.acknowledge(Instant::now());
            return Ok(());
        }
        while self.pending_acks.len() >= PENDING_ACKS_MAX {
            self.process_acks()?;
            std::thread::yield_now();
        }
        self.pending_acks.push_back(PendingAck { acked, committed_at: Instant::now() });
        Ok(())
    }

    /// The highest epoch every host has made durable.
    pub(crate) fn pod_durable_epoch(&self) -> u64 {
        (0..self.config.hosts)
            .map(|host| self.region.host_shared(&self.layout, host).durable_epoch.load(Ordering::Acquire))
            .min()
            .unwrap_or(0)
    }

    /// Acknowledges every queued transaction whose epoch is durable on every host (recording
    /// it first when asked: a recorded id is always an acknowledged one).
    pub(crate) fn process_acks(&mut self) -> Result<()> {
        if self.pending_acks.is_empty() {
            return Ok(());
        }
        let durable = self.pod_durable_epoch();
        let ready = self.pending_acks.iter().take_while(|pending| pending.acked.epoch <= durable).count();
        if ready == 0 {
            return Ok(());
        }
        if let Some(file) = &mut self.acked_file {
            let mut records = Vec::with_capacity(ready * ACKED_BYTES);
            self.pending_acks.iter().take(ready).for_each(|pending| pending.acked.encode(&mut records));
            let path = || acked_path(self.config.log_dir.as_deref().expect("recording needs a log dir"), self.me);
            file.write_all(&records).map_err(|source| PodError::FileIo { path: path(), source })?;
        }
        for _ in 0..ready {
            let pending = self.pending_acks.pop_front().expect("counted above");
            self.acknowledge(pending.committed_at);
        }
        Ok(())
    }

    fn acknowledge(&mut self, committed_at: Instant) {
        self.counters.acked += 1;
        self.counters.commit_latency.record_us(committed_at.elapsed().as_micros() as u64);
        self.shared().acked_txns.fetch_add(1, Ordering::Release);
    }

    /// After the loggers finished, every remaining transaction's epoch is durable: acknowledge.
    pub(crate) fn drain_acks(&mut self) -> Result<()> {
        let started = Instant::now();
        while !self.pending_acks.is_empty() && started.elapsed() < ACK_DRAIN_MAX {
            self.process_acks()?;
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }

    pub(crate) fn unacked(&self) -> u64 {
        self.pending_acks.len() as u64
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

    pub(crate) fn write_history(&mut self) -> Result<()> {
        match self.history.take() {
            Some(history) => history.write(),
            None => Ok(()),
        }
    }

    pub(crate) fn maybe_crash(&mut self, point: CrashPoint) {
        if let Some(crash) = &mut self.crash {
            if crash.point == point {
                crash.after -= 1;
                if crash.after == 0 {
                    crate::fault::crash_now();
                }
            }
        }
    }

    // ---- counters ----

    /// The snapshot a measured window subtracts. Acknowledgements still pending count as given
    /// here: they belong to transactions committed before the window, so the window's `acked`
    /// covers exactly the transactions it committed.
    pub(crate) fn window_start(&self) -> Counters {
        let mut start = self.snapshot();
        start.acked += self.pending_acks.len() as u64;
        start
    }

    /// Every counter of this host right now (worker, SWcc, transport, log, arenas).
    pub(crate) fn snapshot(&self) -> Counters {
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
        counters
    }

    /// Leaves the counters in this host's region slot for the launcher.
    pub(crate) fn publish(&self, counters: &Counters) {
        let shared = self.shared();
        for (slot, word) in shared.stats.iter().zip(counters.to_words()) {
            slot.store(word, Ordering::Relaxed);
        }
        if shared.status.load(Ordering::Relaxed) != HostStatus::Failed as u64 {
            shared.status.store(HostStatus::Finished as u64, Ordering::Release);
        }
    }
}
