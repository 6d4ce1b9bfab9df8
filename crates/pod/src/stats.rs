//! Event counters per host and the latency model that turns them into a modelled time.
//!
//! Every shared-memory line read and written, atomic, flush, write-back, fence and message is
//! counted where it happens. [`LatencyTable`] prices each event (CXL ≈ 250–400 ns per line, the
//! MICRO '23 measurements Tigon cites), so a run reports both its measured throughput (two
//! cores time-sliced between hosts) and a modelled one that does not depend on the scheduler.
//!
//! Counters travel to the launcher as words in the host's region slot ([`Counters::to_words`]).

use serde::Serialize;

use crate::region::STATS_WORDS;

/// Log2 buckets of microseconds: bucket i counts values in [2^(i-1), 2^i) µs (bucket 0: < 1 µs).
pub const HISTOGRAM_BUCKETS: usize = 32;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Histogram {
    pub buckets: [u64; HISTOGRAM_BUCKETS],
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram { buckets: [0; HISTOGRAM_BUCKETS] }
    }
}

impl Histogram {
    pub fn record_us(&mut self, micros: u64) {
        let bucket = (64 - micros.leading_zeros() as usize).min(HISTOGRAM_BUCKETS - 1);
        self.buckets[bucket] += 1;
    }
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }
    /// Upper bound (µs) of the bucket holding quantile `q` (0..=1); 0 if empty.
    pub fn quantile_us(&self, q: f64) -> u64 {
        let total = self.count();
        if total == 0 {
            return 0;
        }
        let rank = ((total as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (bucket, count) in self.buckets.iter().enumerate() {
            seen += count;
            if seen >= rank {
                return 1u64 << bucket;
            }
        }
        1u64 << (HISTOGRAM_BUCKETS - 1)
    }
    fn merge(&mut self, other: &Histogram, sign: i8) {
        for (mine, theirs) in self.buckets.iter_mut().zip(other.buckets) {
            *mine = if sign > 0 { *mine + theirs } else { mine.saturating_sub(theirs) };
        }
    }
}

macro_rules! counters {
    ($($(#[doc = $doc:literal])* $name:ident),* $(,)?) => {
        /// One host's counters (or a sum over hosts).
        #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
        pub struct Counters {
            $($(#[doc = $doc])* pub $name: u64,)*
            /// Commit → acknowledgement (pod-wide durable epoch), µs.
            pub commit_latency: Histogram,
            /// First attempt → commit, including retries, µs.
            pub txn_latency: Histogram,
        }

        impl Counters {
            pub const NAMES: &'static [&'static str] = &[$(stringify!($name)),*];

            pub fn to_words(&self) -> Vec<u64> {
                let mut words = vec![$(self.$name),*];
                words.extend_from_slice(&self.commit_latency.buckets);
                words.extend_from_slice(&self.txn_latency.buckets);
                assert!(words.len() <= STATS_WORDS);
                words
            }

            pub fn from_words(words: &[u64]) -> Counters {
                let mut at = 0usize;
                let mut next = || { at += 1; words[at - 1] };
                let mut counters = Counters { $($name: next(),)* ..Counters::default() };
                for bucket in counters.commit_latency.buckets.iter_mut() { *bucket = next(); }
                for bucket in counters.txn_latency.buckets.iter_mut() { *bucket = next(); }
                counters
            }

            /// Field-wise `self − earlier` (the measured window); gauges keep `self`'s value.
            pub fn since(&self, earlier: &Counters) -> Counters {
                let mut out = Counters { $($name: self.$name.saturating_sub(earlier.$name),)* ..self.clone() };
                out.commit_latency.merge(&earlier.commit_latency, -1);
                out.txn_latency.merge(&earlier.txn_latency, -1);
                for gauge in Self::GAUGES { out.set(gauge, self.get(gauge)); }
                out
            }

            /// Field-wise sum (gauges are summed too: they are per-host amounts).
            pub fn add(&mut self, other: &Counters) {
                $(self.$name = self.$name.wrapping_add(other.$name);)*
                self.commit_latency.merge(&other.commit_latency, 1);
                self.txn_latency.merge(&other.txn_latency, 1);
            }

            pub fn get(&self, name: &str) -> u64 {
                match name { $(stringify!($name) => self.$name,)* _ => panic!("no counter {name}") }
            }
            fn set(&mut self, name: &str, value: u64) {
                match name { $(stringify!($name) => self.$name = value,)* _ => panic!("no counter {name}") }
            }
        }
    };
}

counters! {
    /// Transactions committed (read-write and read-only).
    committed,
    committed_read_only,
    /// Attempts, including aborted ones.
    attempts,
    aborts_conflict,
    aborts_out_of_memory,
    aborts_validation,
    /// Transactions the workload itself rolled back (TPC-C's 1% invalid NewOrder).
    aborts_user,
    /// Accesses to tuples another host owns.
    remote_accesses,
    /// Remote accesses served straight from the CXL index (no message).
    remote_index_hits,
    /// Remote accesses that needed a message (migration request or baseline read/lock).
    remote_messages,
    /// Searches of another host's CXL index: one per remote point access, and one more after
    /// each migration reply (Tigon's requester finds the moved-in tuple through the index too).
    remote_index_searches,
    /// Inserts into another host's partition that committed (Tigon-style, through a CAT).
    remote_inserts,
    /// Deletes of another host's rows that committed (Tigon-style, handed to the owner).
    remote_deletes,
    moves_in,
    moves_out,
    /// Migration requests refused for lack of HWcc budget or SWcc space (FAIL_OOM).
    moves_refused,
    /// HWcc lines read: index buckets and nodes traversed.
    hwcc_lines_read,
    /// HWcc atomic read-modify-writes on other hosts' CAT words: latch CAS, pin updates.
    hwcc_atomics,
    /// Atomics of an owner on its own CAT words (their lines usually stay in its cache).
    owner_atomics,
    swcc_invalidated_lines,
    swcc_written_back_lines,
    /// All-coherent back-end (NoSWcc): lines another host wrote that this host fetched from CXL.
    coherent_fetched_lines,
    /// All-coherent back-end: lines this host wrote that coherence must carry to CXL for others.
    coherent_written_lines,
    /// Tuple-block lines among the invalidated / coherently fetched lines above (real order).
    block_fetched_lines,
    /// Tuple-block lines whose cached copy was stale in logical time ([`crate::staleness`]):
    /// what the model prices instead of `block_fetched_lines`, independent of time-slicing.
    model_stale_lines,
    /// Lines written back by a row's first move-in into a fresh block under an SWcc protocol,
    /// where every later move-in reuses the block. Like a compulsory miss it amortises to nothing
    /// in a long run, but how many fall in a short window depends on how far the machine got in
    /// the warm-up: not priced. (Under NoSWcc every move-in fills a fresh block, as in Tigon, so
    /// none is compulsory and all are priced.)
    first_move_in_written_lines,
    /// Σ s² over this host's busy segments s (modelled work between two points where it polls
    /// its inbox), in ns·µs: the length-biased wait a request sees ([`LatencyTable::modelled_tps`]).
    busy_segments_squared_ns_us,
    swcc_fences,
    swcc_loaded_bytes,
    swcc_stored_bytes,
    /// Reads of a CAT whose host bit said the cached copy is valid.
    swcc_hits,
    swcc_misses,
    messages_sent,
    message_bytes,
    messages_received,
    /// Waits for replies: one per phase or commit round, however many hosts it asked.
    round_trips,
    /// Messages from other hosts dropped as malformed (undecodable, outside the pod's limits, a
    /// reply to nothing in flight, a request that makes no sense here); a gauge: the whole run.
    malformed_messages,
    ring_full_retries,
    ring_sleeps,
    /// Tuple accesses and applied writes, each charged the CPU cost of one tuple operation
    /// wherever the tuple lives: this host's DRAM rows, other hosts' CATs, tuples a baseline read
    /// by message (the owner's lookup and copy for a request count on the owner).
    tuple_ops,
    dram_bytes,
    log_bytes,
    log_records,
    acked,
    /// Gauges: all commits of the run (warm-up included), HWcc/SWcc high-water marks, CATs at the end.
    committed_all,
    hwcc_peak_bytes,
    swcc_peak_bytes,
    cats_at_end,
    /// Nanoseconds this host spent in the measured phase.
    measured_ns,
    /// Post-run workload check: failed conditions, and two workload-specific values.
    check_failures,
    check_value_a,
    check_value_b,
    /// Logger: fdatasync calls and bytes written.
    fsyncs,
    log_file_bytes,
    /// Gauges of a recovering start: acknowledged transactions (recorded by any host) whose
    /// receipt row this host owns, and how many of those rows are missing after recovery.
    receipts_checked,
    receipts_missing,
    /// Log bytes deleted because checkpoints covered them, and checkpoints completed (usable).
    log_bytes_deleted,
    checkpoints,
    /// Gauges of the shutdown: how long the host waited for the pod's final group commit, and
    /// how many commits were still unacknowledged when it gave up (0 after a clean run).
    ack_drain_ms,
    unacked_at_end,
}

impl Counters {
    const GAUGES: [&'static str; 12] = [
        "malformed_messages",
        "receipts_checked",
        "receipts_missing",
        "ack_drain_ms",
        "unacked_at_end",
        "committed_all",
        "hwcc_peak_bytes",
        "swcc_peak_bytes",
        "cats_at_end",
        "check_failures",
        "check_value_a",
        "check_value_b",
    ];

    pub fn aborts(&self) -> u64 {
        self.aborts_conflict + self.aborts_out_of_memory + self.aborts_validation
    }
}

/// Prices of events for the modelled time, in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LatencyTable {
    /// Fixed CPU work per transaction attempt (begin, bookkeeping, commit).
    pub attempt_ns: f64,
    /// CPU work of one tuple access or applied write (index lookup, lock, copy, log work),
    /// charged the same for a local row, a CAT and a tuple read by message.
    pub tuple_ns: f64,
    /// A 64 B line fetched from CXL memory after an invalidation, or an HWcc index line.
    pub cxl_line_read_ns: f64,
    /// A 64 B line written back with `clwb` (they stream out; the fence waits for the last).
    pub writeback_line_ns: f64,
    /// An atomic on another host's HWcc word (a cross-host coherence round trip).
    pub cxl_atomic_ns: f64,
    /// An atomic on an owner's own CAT word (usually a hit in its cache).
    pub owner_atomic_ns: f64,
    pub fence_ns: f64,
    /// Software cost of sending or receiving one message (enqueue, poll, dispatch).
    pub message_ns: f64,
    /// Transport part of a request/reply round trip (two one-way CXL message latencies).
    pub transport_round_trip_ns: f64,
    /// Per byte appended to the log buffer.
    pub log_byte_ns: f64,
}

impl Default for LatencyTable {
    /// CXL prices from the MICRO '23 measurements Tigon cites (250–400 ns per line). The DRAM
    /// tuple cost is calibrated on Tigon's artifact CSVs: a 10-op YCSB transaction at 0% cross
    /// takes ≈ 14 µs per worker (1.68 M txn/s on 24 workers), which with TPC-C's mix also gives
    /// its 0/0 throughput (≈ 412 k txn/s).
    fn default() -> Self {
        LatencyTable {
            attempt_ns: 2_000.0,
            tuple_ns: 1_200.0,
            cxl_line_read_ns: 300.0,
            writeback_line_ns: 100.0,
            cxl_atomic_ns: 400.0,
            owner_atomic_ns: 100.0,
            fence_ns: 50.0,
            message_ns: 1_000.0,
            transport_round_trip_ns: 2_000.0,
            log_byte_ns: 0.1,
        }
    }
}

impl LatencyTable {
    /// Modelled busy time of one host, without waiting for replies, in nanoseconds. CXL line
    /// reads are the lines a host had to fetch again: ring payloads it invalidated, tuple-block
    /// lines whose copy another host made stale — judged in logical time, as if the hosts ran
    /// in parallel at equal rates ([`crate::staleness`]; an SWcc invalidation or a coherence miss
    /// under NoSWcc) — bounded by what it loaded, and HWcc index lines. Lines written for other hosts cost a write-back either way: pod.md §3.2
    /// prices NoSWcc as "all CXL treated as HWcc" (Tigon's `SCCNoOP` is a plain `memcpy` on
    /// cacheable memory, so there is a local cache), and §1.1 puts every CXL access at 250–400 ns
    /// — coherence does not make another host's data free, it only removes the instructions.
    pub fn work_ns(&self, c: &Counters) -> f64 {
        let loaded_lines = c.swcc_loaded_bytes.div_ceil(64);
        let ring_fetched = (c.swcc_invalidated_lines + c.coherent_fetched_lines).saturating_sub(c.block_fetched_lines);
        let data_fetched = (ring_fetched + c.model_stale_lines).min(loaded_lines) as f64;
        let data_written =
            (c.swcc_written_back_lines + c.coherent_written_lines).saturating_sub(c.first_move_in_written_lines) as f64;
        c.attempts as f64 * self.attempt_ns
            + c.tuple_ops as f64 * self.tuple_ns
            + (data_fetched + c.hwcc_lines_read as f64) * self.cxl_line_read_ns
            + data_written * self.writeback_line_ns
            + c.hwcc_atomics as f64 * self.cxl_atomic_ns
            + c.owner_atomics as f64 * self.owner_atomic_ns
            + c.swcc_fences as f64 * self.fence_ns
            + (c.messages_sent + c.messages_received) as f64 * self.message_ns
            + c.log_bytes as f64 * self.log_byte_ns
    }

    /// Modelled throughput of a pod. Each host runs one worker that polls its inbox between
    /// transactions and while it waits for a reply (pod.md §2.6: no output threads), so a
    /// request waits for the transport plus the rest of the peer's current busy segment. A
    /// request arriving at a random moment lands in a segment with probability proportional to
    /// its length (the inspection paradox), so its expected wait is Σ s² / (2 · T_peer) over
    /// the peer's busy segments s and its whole modelled time T_peer — zero while the peer is
    /// itself waiting and polling, long behind a Delivery or StockLevel. T depends on the
    /// peers' waits, so the hosts' times are solved together by fixed-point iteration.
    pub fn modelled_tps(&self, hosts: &[Counters]) -> f64 {
        let work: Vec<f64> = hosts.iter().map(|c| self.work_ns(c)).collect();
        let squares: Vec<f64> = hosts.iter().map(|c| c.busy_segments_squared_ns_us as f64 * 1e3).collect();
        let mut time = work.clone();
        for _ in 0..MODEL_ITERATIONS {
            let waits: Vec<f64> = (0..hosts.len()).map(|host| Self::poll_wait_ns(host, &squares, &time)).collect();
            time = (0..hosts.len())
                .map(|host| work[host] + hosts[host].round_trips as f64 * (self.transport_round_trip_ns + waits[host]))
                .collect();
        }
        hosts
            .iter()
            .zip(&time)
            .filter(|(_, total)| **total > 0.0)
            .map(|(counters, total)| counters.committed as f64 / (total / 1e9))
            .sum()
    }

    /// Mean wait of a request from `host` for a peer to poll: Σ s² / 2T, averaged over peers.
    fn poll_wait_ns(host: usize, squares: &[f64], time: &[f64]) -> f64 {
        let peers: Vec<f64> = (0..time.len())
            .filter(|peer| *peer != host && time[*peer] > 0.0)
            .map(|peer| squares[peer] / (2.0 * time[peer]))
            .collect();
        if peers.is_empty() {
            return 0.0;
        }
        peers.iter().sum::<f64>() / peers.len() as f64
    }
}

/// Fixed-point iterations of [`LatencyTable::modelled_tps`]; each host's wait is at most the
/// peer's longest segment, so the times converge in a few rounds (50 is far more than needed).
const MODEL_ITERATIONS: usize = 50;

/// Tracks a host's busy segments for the model: call [`BusySegments::poll_point`] wherever
/// the worker polls its inbox; the modelled work since the previous poll point is a segment.
#[derive(Debug, Default)]
pub struct BusySegments {
    work_at_last_poll_ns: f64,
}

impl BusySegments {
    /// Closes the segment ending now; `work_now_ns` is the host's modelled work so far.
    pub fn poll_point(&mut self, work_now_ns: f64, counters: &mut Counters) {
        let segment = work_now_ns - self.work_at_last_poll_ns;
        self.work_at_last_poll_ns = work_now_ns;
        if segment > 0.0 {
            counters.busy_segments_squared_ns_us =
                counters.busy_segments_squared_ns_us.saturating_add((segment * segment / 1e3) as u64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_round_trip_through_words() {
        // Goal: what a host publishes is what the launcher reads. Method: set fields, words, back.
        let mut counters = Counters { committed: 5, moves_in: 7, check_value_b: u64::MAX, ..Counters::default() };
        counters.commit_latency.record_us(1500);
        let back = Counters::from_words(&counters.to_words());
        assert_eq!(back, counters);
        assert!(counters.to_words().len() <= STATS_WORDS);
    }

    #[test]
    fn since_subtracts_events_but_keeps_gauges() {
        // Goal: the measured window excludes warm-up events, not high-water marks. Method: two snapshots.
        let earlier = Counters { committed: 10, hwcc_peak_bytes: 100, ..Counters::default() };
        let later = Counters { committed: 25, hwcc_peak_bytes: 300, ..Counters::default() };
        let window = later.since(&earlier);
        assert_eq!(window.committed, 15);
        assert_eq!(window.hwcc_peak_bytes, 300);
    }

    #[test]
    fn histogram_quantiles() {
        // Goal: p50/p99 land in the right power-of-two bucket. Method: 99 small values and one large.
        let mut histogram = Histogram::default();
        for _ in 0..99 {
            histogram.record_us(3);
        }
        histogram.record_us(10_000);
        assert_eq!(histogram.quantile_us(0.5), 4);
        assert_eq!(histogram.quantile_us(1.0), 16_384);
    }

    #[test]
    fn model_charges_messages_and_cxl_lines() {
        // Goal: a transaction that needs messages models slower than one that reads CXL lines.
        // Method: two counter sets with the same commits.
        let table = LatencyTable::default();
        let by_message = Counters {
            committed: 1,
            attempts: 1,
            messages_sent: 2,
            messages_received: 2,
            round_trips: 2,
            ..Counters::default()
        };
        let by_cxl = Counters {
            committed: 1,
            attempts: 1,
            hwcc_atomics: 2,
            swcc_invalidated_lines: 4,
            swcc_loaded_bytes: 256,
            ..Counters::default()
        };
        let pair = |c: &Counters| table.modelled_tps(&[c.clone(), c.clone()]);
        assert!(pair(&by_message) < pair(&by_cxl), "messages must model slower than CXL lines");
        assert!(table.work_ns(&by_cxl) > 0.0);
    }

    #[test]
    fn request_waits_are_length_biased_over_the_peers_busy_segments() {
        // Goal: a request waits Σ s² / 2T of the peer, so the same work in one long segment
        // delays it more than in many short ones. Method: two pods with equal work, one host
        // making round trips to a peer whose segments differ; the exact wait is checked.
        let table = LatencyTable::default();
        let asker = Counters { committed: 1, attempts: 1, round_trips: 1, ..Counters::default() };
        let peer = |squared_ns_us: u64| Counters {
            committed: 1,
            attempts: 1,
            busy_segments_squared_ns_us: squared_ns_us,
            ..Counters::default()
        };
        let peer_work = table.work_ns(&peer(0));
        // One segment of all the peer's work, or ten segments of a tenth each.
        let one_long = peer(((peer_work * peer_work) / 1e3) as u64);
        let ten_short = peer((10.0 * (peer_work / 10.0) * (peer_work / 10.0) / 1e3) as u64);
        let long_tps = table.modelled_tps(&[asker.clone(), one_long]);
        let short_tps = table.modelled_tps(&[asker.clone(), ten_short]);
        assert!(long_tps < short_tps, "long peer segments must delay replies more: {long_tps} vs {short_tps}");
        let asker_ns = table.work_ns(&asker) + table.transport_round_trip_ns + peer_work / 2.0;
        let expected = 1e9 / asker_ns + 1e9 / peer_work;
        assert!((long_tps - expected).abs() / expected < 1e-3, "{long_tps} vs {expected}");
    }

    #[test]
    fn coherent_line_transfers_are_priced_like_swcc_ones() {
        // Goal: under NoSWcc, lines another host wrote are not free — hardware coherence moves
        // them as SWcc would. Method: the same transfers counted as SWcc or coherent cost the same.
        let table = LatencyTable::default();
        let base = Counters { committed: 1, attempts: 1, swcc_loaded_bytes: 1024, ..Counters::default() };
        let swcc = Counters { swcc_invalidated_lines: 16, swcc_written_back_lines: 16, ..base.clone() };
        let coherent = Counters { coherent_fetched_lines: 16, coherent_written_lines: 16, ..base.clone() };
        assert!(table.work_ns(&coherent) > table.work_ns(&base));
        assert_eq!(table.work_ns(&coherent), table.work_ns(&swcc));
    }

    #[test]
    fn block_re_reads_are_priced_from_the_logical_time_count() {
        // Goal: the real-order block re-reads (which depend on time-slicing) are not priced; the
        // logical-time count and ring invalidations are, and first move-ins are not. Method: vary
        // each counter alone and compare modelled work.
        let table = LatencyTable::default();
        let base = Counters { committed: 1, attempts: 1, swcc_loaded_bytes: 64 * 64, ..Counters::default() };
        let real_order = Counters { swcc_invalidated_lines: 20, block_fetched_lines: 20, ..base.clone() };
        assert_eq!(table.work_ns(&real_order), table.work_ns(&base), "real-order block re-reads are not priced");
        let logical = Counters { model_stale_lines: 20, ..real_order.clone() };
        assert_eq!(table.work_ns(&logical) - table.work_ns(&base), 20.0 * table.cxl_line_read_ns);
        let ring = Counters { swcc_invalidated_lines: 25, ..real_order.clone() };
        assert_eq!(table.work_ns(&ring) - table.work_ns(&base), 5.0 * table.cxl_line_read_ns, "ring lines stay priced");
        let first_move_in = Counters { coherent_written_lines: 17, first_move_in_written_lines: 17, ..base.clone() };
        assert_eq!(table.work_ns(&first_move_in), table.work_ns(&base), "first move-ins are compulsory");
    }

    #[test]
    fn busy_segments_accumulate_squares_of_positive_segments() {
        // Goal: poll points turn modelled work into Σ s². Method: 3 µs then nothing then 1 µs.
        let mut counters = Counters::default();
        let mut segments = BusySegments::default();
        segments.poll_point(3_000.0, &mut counters);
        segments.poll_point(3_000.0, &mut counters);
        segments.poll_point(4_000.0, &mut counters);
        assert_eq!(counters.busy_segments_squared_ns_us, 9_000 + 1_000);
    }
}
