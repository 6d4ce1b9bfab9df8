//! Counters for `SHOW STATS`, `SHOW POOLS` and `/metrics`.
//!
//! Every per-transaction counter lives in a per-shard block on its own cache lines: only that
//! shard's thread writes it, so counting costs an uncontended atomic add and never bounces a line
//! between cores. Readers sum the shards.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use crate::error::PoolerError;

/// Upper bounds of the latency histogram buckets, µs (the last bucket is unbounded).
/// Sub-millisecond bounds for the pooler's own short waits, then 1 ms to 5 s as operators chart
/// them.
pub const LATENCY_BUCKETS_US: [u64; 17] = [
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000, 2_500_000,
    5_000_000, 10_000_000,
];

/// A cumulative-bucket latency histogram, Prometheus style.
#[derive(Debug, Default)]
pub struct Histogram {
    /// Observations at or below each bound, plus one overflow bucket (not cumulative here).
    buckets: [AtomicU64; LATENCY_BUCKETS_US.len() + 1],
    sum_us: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, elapsed: Duration) {
        let micros = elapsed.as_micros().min(u128::from(u64::MAX)) as u64;
        let index = LATENCY_BUCKETS_US.iter().position(|&bound| micros <= bound).unwrap_or(LATENCY_BUCKETS_US.len());
        self.buckets[index].fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(micros, Ordering::Relaxed);
    }
}

/// A histogram summed over shards: cumulative counts per bound, total count and sum.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HistogramTotals {
    pub cumulative: Vec<u64>,
    pub count: u64,
    pub sum_us: u64,
}

impl HistogramTotals {
    /// Adds another histogram's totals.
    pub fn merge(&mut self, other: &HistogramTotals) {
        if self.cumulative.is_empty() {
            self.cumulative = vec![0; LATENCY_BUCKETS_US.len()];
        }
        for (slot, count) in self.cumulative.iter_mut().zip(&other.cumulative) {
            *slot += count;
        }
        self.count += other.count;
        self.sum_us += other.sum_us;
    }

    fn add(&mut self, histogram: &Histogram) {
        if self.cumulative.is_empty() {
            self.cumulative = vec![0; LATENCY_BUCKETS_US.len()];
        }
        let mut running = 0;
        for (index, bucket) in histogram.buckets.iter().enumerate() {
            running += bucket.load(Ordering::Relaxed);
            if let Some(slot) = self.cumulative.get_mut(index) {
                *slot += running;
            }
        }
        self.count += running;
        self.sum_us += histogram.sum_us.load(Ordering::Relaxed);
    }
}

/// One shard's counters for one pool.
#[derive(Debug, Default)]
#[repr(align(128))]
pub struct ShardStats {
    /// Clients of the pool served on this shard (logged in, waiting or not).
    pub clients: AtomicU32,
    pub transactions: AtomicU64,
    /// Requests answered (one per ReadyForQuery), as PgBouncer's query count.
    pub queries: AtomicU64,
    /// Bytes from clients to servers and back.
    pub bytes_received: AtomicU64,
    pub bytes_sent: AtomicU64,
    pub wait: Histogram,
    pub transaction_time: Histogram,
    /// Time from a request to its ReadyForQuery, summed, µs.
    pub query_time_us: AtomicU64,
    /// Parse and Bind messages from clients; Parses servers completed (ParseComplete).
    pub client_parses: AtomicU64,
    pub binds: AtomicU64,
    pub server_parses: AtomicU64,
    /// Times a server was linked to a client.
    pub assignments: AtomicU64,
}

/// Counters of one pool.
#[derive(Debug)]
pub struct PoolStats {
    pub clients: AtomicU32,
    /// Servers moved from one shard's reactor to another's (a measure of shard imbalance).
    pub server_moves: AtomicU64,
    shards: Box<[ShardStats]>,
}

/// One pool's counters summed over shards.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolTotals {
    pub transactions: u64,
    pub queries: u64,
    pub bytes_received: u64,
    pub bytes_sent: u64,
    pub wait: HistogramTotals,
    pub transaction_time: HistogramTotals,
    pub query_time_us: u64,
    pub client_parses: u64,
    pub binds: u64,
    pub server_parses: u64,
    pub assignments: u64,
    /// Where the kernel fast path moved this pool's bytes (pools that run there).
    pub kernel: Option<bypass_fastpath::PoolCounters>,
}

impl PoolTotals {
    /// Adds another pool's totals (histogram buckets included).
    pub fn add(&mut self, other: &PoolTotals) {
        self.transactions += other.transactions;
        self.queries += other.queries;
        self.bytes_received += other.bytes_received;
        self.bytes_sent += other.bytes_sent;
        self.wait.merge(&other.wait);
        self.transaction_time.merge(&other.transaction_time);
        self.query_time_us += other.query_time_us;
        self.client_parses += other.client_parses;
        self.binds += other.binds;
        self.server_parses += other.server_parses;
        self.assignments += other.assignments;
        if let Some(kernel) = &other.kernel {
            self.kernel.get_or_insert_with(Default::default).add(kernel);
        }
    }
}

impl PoolStats {
    pub fn new(shards: usize) -> Self {
        PoolStats {
            clients: AtomicU32::new(0),
            server_moves: AtomicU64::new(0),
            shards: (0..shards.max(1)).map(|_| ShardStats::default()).collect(),
        }
    }

    /// The counters `shard` writes.
    pub fn shard(&self, shard: usize) -> &ShardStats {
        &self.shards[shard.min(self.shards.len() - 1)]
    }

    /// A client of this pool starts being served on `shard`.
    pub fn client_joined(&self, shard: usize) {
        self.clients.fetch_add(1, Ordering::Relaxed);
        self.shard(shard).clients.fetch_add(1, Ordering::Relaxed);
    }

    /// A client of this pool on `shard` left (or moved to a reloaded pool).
    pub fn client_left(&self, shard: usize) {
        self.clients.fetch_sub(1, Ordering::Relaxed);
        self.shard(shard).clients.fetch_sub(1, Ordering::Relaxed);
    }

    /// Clients of this pool on `shard`.
    pub fn clients_on(&self, shard: usize) -> u32 {
        self.shard(shard).clients.load(Ordering::Relaxed)
    }

    pub fn count_transaction(&self, shard: usize, elapsed: Duration) {
        let stats = self.shard(shard);
        stats.transactions.fetch_add(1, Ordering::Relaxed);
        stats.transaction_time.observe(elapsed);
    }

    pub fn transactions(&self) -> u64 {
        self.shards.iter().map(|s| s.transactions.load(Ordering::Relaxed)).sum()
    }

    pub fn totals(&self) -> PoolTotals {
        let mut totals = PoolTotals::default();
        for shard in self.shards.iter() {
            totals.transactions += shard.transactions.load(Ordering::Relaxed);
            totals.queries += shard.queries.load(Ordering::Relaxed);
            totals.bytes_received += shard.bytes_received.load(Ordering::Relaxed);
            totals.bytes_sent += shard.bytes_sent.load(Ordering::Relaxed);
            totals.wait.add(&shard.wait);
            totals.transaction_time.add(&shard.transaction_time);
            totals.query_time_us += shard.query_time_us.load(Ordering::Relaxed);
            totals.client_parses += shard.client_parses.load(Ordering::Relaxed);
            totals.binds += shard.binds.load(Ordering::Relaxed);
            totals.server_parses += shard.server_parses.load(Ordering::Relaxed);
            totals.assignments += shard.assignments.load(Ordering::Relaxed);
        }
        totals
    }
}

/// PgBouncer's averages over one `stats_period` (STATS, STATS_AVERAGES), in its column order:
/// server assignments, transactions, queries, bytes received and sent (per second), then
/// transaction, query and wait time (µs per transaction, query, wait), then client Parse,
/// server Parse and Bind messages (per second).
pub type Averages = [u64; 11];

/// The `kind` labels of the error counter, in index order.
pub const ERROR_KINDS: [&str; 10] = [
    "client_io",
    "client_protocol",
    "auth",
    "refused",
    "server_connect",
    "server_io",
    "server_protocol",
    "server_login",
    "server_query",
    "timeout",
];

/// Sessions that ended in an error, by kind.
#[derive(Debug, Default)]
pub struct ErrorCounters {
    counts: [AtomicU64; ERROR_KINDS.len()],
}

impl ErrorCounters {
    pub fn count(&self, error: &PoolerError) {
        self.counts[error_kind(error)].fetch_add(1, Ordering::Relaxed);
    }

    /// (kind label, count) for every kind.
    pub fn totals(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        ERROR_KINDS.iter().zip(&self.counts).map(|(kind, count)| (*kind, count.load(Ordering::Relaxed)))
    }
}

/// Index into [`ERROR_KINDS`].
fn error_kind(error: &PoolerError) -> usize {
    match error {
        PoolerError::ClientIo(_) => 0,
        PoolerError::ClientProtocol(_) => 1,
        PoolerError::Refused { code, .. } if code.code().starts_with("28") => 2,
        PoolerError::Refused { .. } => 3,
        PoolerError::ServerConnect { .. } => 4,
        PoolerError::ServerIo(_) | PoolerError::ServerTerminated => 5,
        PoolerError::ServerProtocol(_) => 6,
        PoolerError::ServerLogin { .. } => 7,
        PoolerError::ServerQuery { .. } => 8,
        PoolerError::Timeout(_) => 9,
    }
}
