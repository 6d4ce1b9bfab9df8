//! Schedule-independent staleness for the latency model: which reads of a CAT block find the
//! reader's copy stale, judged in *logical* time as if the hosts ran truly in parallel at equal
//! rates (a pod with a core per host), not in the order two time-sliced cores happened to run them.
//!
//! The protocol itself (host-valid bits, real invalidations, the simulated incoherent caches) is
//! untouched and still decides what is executed; this module only decides what the model
//! *counts*. Counting in real order makes the figure depend on the scheduler: a host that runs a
//! whole time slice alone re-reads hot blocks many times with no foreign write in between, so the
//! same code counted 10 or 24.5 re-read lines per transaction depending on machine load.
//!
//! ```text
//!  host h's logical time = 2 · (its transaction attempts so far): reads at even, events at odd times
//!
//!  host 0 trace ─┐  (block, time, kind, lines) per read / write / move-in, in the region
//!  host 1 trace ─┼─► launcher, after the run: sort by (block, time) ──► replay per block:
//!          …    ─┘     event by g      → every other copy it clears is dirty
//!                      read by h       → stale ⇔ dirty[h] (NonTemporal readers: always); clean
//!                      first read by h → compulsory, not counted (amortised in a long run)
//!                  stale lines per read in the hosts' common logical window × reads in h's window
//! ```
//!
//! Events are what clears another host's valid bit in the protocol: a committed write
//! (WriteThrough and NoSWcc clear every bit but the writer's), a move-in that resets the bits to
//! the owner's, and — derived in the replay — a NoSharedReader miss. The owner keeps the tuple's
//! DRAM copy and re-reads the block only after a foreign *write* (Tigon's "modified since moved
//! in" bit), so its reads are traced at every lock and only writes make them stale.
//!
//! Invariants: a host only appends to its own trace (bounded by [`TRACE_RECORDS_PER_HOST`]; a
//! full trace stops recording and the replay's window ends at its last record); the launcher
//! reads traces only after every host finished. The trace area is instrumentation, not part of
//! the emulated pod: it is charged to no budget.

use std::sync::atomic::Ordering;

use crate::coherence::SwccProtocol;
use crate::region::{Layout, Region};
pub use crate::region::{TRACE_RECORDS_PER_HOST, TRACE_RECORD_BYTES};

/// Largest logical time a record can hold.
const TIME_MAX: u64 = (1 << 47) - 1;
/// Largest line count a record can hold (a block of 256 KiB).
const LINES_MAX: u64 = (1 << 12) - 1;

/// What a trace record says a host did to a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceKind {
    /// About to read the block: a remote reader before every read, the owner before every lock.
    Read = 1,
    /// A read that re-fetches whatever happened (NonTemporal readers other than the owner).
    ReadAlwaysFetches = 2,
    /// A committed write: every other host's copy is stale, the owner's included.
    Write = 3,
    /// Valid bits reset to the actor's without new data (a move-in of an unchanged block).
    Reset = 4,
}

impl TraceKind {
    fn from_raw(raw: u64) -> Option<TraceKind> {
        [TraceKind::Read, TraceKind::ReadAlwaysFetches, TraceKind::Write, TraceKind::Reset]
            .into_iter()
            .find(|kind| *kind as u64 == raw)
    }
}

/// Logical time of a host's reads in its `attempts`-th transaction attempt.
pub fn read_time(attempts: u64) -> u64 {
    (2 * attempts).min(TIME_MAX)
}

/// Logical time of a host's writes and move-ins during (or just after) that attempt.
pub fn event_time(attempts: u64) -> u64 {
    (2 * attempts + 1).min(TIME_MAX)
}

/// Appends `(block, time, kind, lines)` to `host`'s trace; false (nothing written) when full.
pub fn append(region: &Region, layout: &Layout, host: usize, record: TraceRecord) -> bool {
    let shared = region.host_shared(layout, host);
    let at = shared.trace_records.load(Ordering::Relaxed);
    if at >= TRACE_RECORDS_PER_HOST {
        return false;
    }
    let raw = layout.trace_record(host, at);
    region.atomic_u64(raw).store(record.block, Ordering::Relaxed);
    region.atomic_u64(raw + 8).store(record.packed(), Ordering::Relaxed);
    shared.trace_records.store(at + 1, Ordering::Release);
    true
}

/// One traced access or event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceRecord {
    pub block: u64,
    pub time: u64,
    pub kind: TraceKind,
    pub lines: u64,
}

impl TraceRecord {
    fn packed(self) -> u64 {
        (self.time.min(TIME_MAX) << 16) | (self.lines.min(LINES_MAX) << 4) | self.kind as u64
    }
    fn unpack(block: u64, word: u64) -> Option<TraceRecord> {
        let kind = TraceKind::from_raw(word & 0xF)?;
        Some(TraceRecord { block, time: word >> 16, kind, lines: (word >> 4) & LINES_MAX })
    }
}

/// One host's trace and measured window (logical read times, inclusive).
#[derive(Debug, Clone, Default)]
pub struct HostTrace {
    pub records: Vec<TraceRecord>,
    pub window: (u64, u64),
}

/// Reads every host's trace and window from the region (after the hosts finished).
pub fn read_traces(region: &Region, layout: &Layout) -> Vec<HostTrace> {
    (0..layout.hosts)
        .map(|host| {
            let shared = region.host_shared(layout, host);
            let len = shared.trace_records.load(Ordering::Acquire).min(TRACE_RECORDS_PER_HOST);
            let records = (0..len)
                .filter_map(|at| {
                    let raw = layout.trace_record(host, at);
                    let block = region.atomic_u64(raw).load(Ordering::Relaxed);
                    TraceRecord::unpack(block, region.atomic_u64(raw + 8).load(Ordering::Relaxed))
                })
                .collect::<Vec<_>>();
            let mut window =
                (shared.trace_window_start.load(Ordering::Acquire), shared.trace_window_end.load(Ordering::Acquire));
            if len >= TRACE_RECORDS_PER_HOST {
                // The trace filled up: nothing after its last record can be judged.
                window.1 = window.1.min(records.last().map_or(0, |record| record.time));
            }
            HostTrace { records, window }
        })
        .collect()
}

/// Tallies of one host's reads.
#[derive(Debug, Clone, Copy, Default)]
struct Tally {
    reads: u64,
    stale_lines: u64,
}

/// Block lines each host's reads in its measured window found stale in logical time: the
/// replay's stale lines per read in the window all hosts share × the host's reads in its own
/// window (hosts that ran at unequal real rates cover different logical spans; outside the
/// common span a host's reads have no peer events to be judged against).
pub fn stale_lines(traces: &[HostTrace], protocol: SwccProtocol, owner_of: impl Fn(u64) -> usize) -> Vec<u64> {
    let hosts = traces.len();
    let common = (
        traces.iter().map(|trace| trace.window.0).max().unwrap_or(0),
        traces.iter().map(|trace| trace.window.1).min().unwrap_or(0),
    );
    let mut merged: Vec<(u64, u64, usize, usize, TraceRecord)> = traces
        .iter()
        .enumerate()
        .flat_map(|(host, trace)| {
            trace.records.iter().enumerate().map(move |(seq, record)| (record.block, record.time, host, seq, *record))
        })
        .collect();
    merged.sort_unstable_by_key(|(block, time, host, seq, _)| (*block, *time, *host, *seq));
    let mut in_common = vec![Tally::default(); hosts];
    let mut in_own = vec![Tally::default(); hosts];
    let mut dirty = vec![false; hosts];
    let mut touched = vec![false; hosts];
    let mut current_block = None;
    for (block, time, host, _, record) in merged {
        let owner = owner_of(block);
        if current_block != Some(block) {
            current_block = Some(block);
            dirty.fill(false);
            touched.fill(false);
        }
        match record.kind {
            TraceKind::Read | TraceKind::ReadAlwaysFetches => {
                // A first touch is a compulsory miss, not a coherence miss: in a long run (Tigon
                // measures 20 s) first touches amortise to nothing, while here how many fall in
                // the window depends on how fast the machine got through the warm-up. It still
                // fetches, so under NoSharedReader it still evicts the other readers.
                let compulsory = !std::mem::replace(&mut touched[host], true) && host != owner;
                let always = record.kind == TraceKind::ReadAlwaysFetches;
                let fetches = dirty[host] || compulsory || always;
                let stale = always || (dirty[host] && !compulsory);
                dirty[host] = false;
                if fetches && protocol == SwccProtocol::NoSharedReader && !always {
                    clear_others(&mut dirty, host, owner, false);
                }
                let lines = if stale { record.lines } else { 0 };
                for (tally, window) in [(&mut in_common[host], common), (&mut in_own[host], traces[host].window)] {
                    if window.0 <= time && time <= window.1 {
                        tally.reads += 1;
                        tally.stale_lines += lines;
                    }
                }
            }
            TraceKind::Write => clear_others(&mut dirty, host, owner, true),
            TraceKind::Reset => clear_others(&mut dirty, host, owner, false),
        }
    }
    (0..hosts)
        .map(|host| match in_common[host] {
            Tally { reads: 0, .. } => in_own[host].stale_lines,
            common => (common.stale_lines as f64 / common.reads as f64 * in_own[host].reads as f64).round() as u64,
        })
        .collect()
}

/// Marks every copy but `actor`'s stale; the owner's DRAM copy only for a write.
fn clear_others(dirty: &mut [bool], actor: usize, owner: usize, write: bool) {
    for (host, dirty) in dirty.iter_mut().enumerate() {
        if host != actor && (write || host != owner) {
            *dirty = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(block: u64, time: u64, kind: TraceKind) -> TraceRecord {
        TraceRecord { block, time, kind, lines: 10 }
    }

    fn trace(records: Vec<TraceRecord>, window: (u64, u64)) -> HostTrace {
        HostTrace { records, window }
    }

    /// Host 0 owns block 0; host 1 reads it at attempts 1..=8; host 0 writes it at attempt 5.
    fn write_between_reads() -> (HostTrace, HostTrace) {
        let owner = trace(
            vec![record(0, event_time(0), TraceKind::Reset), record(0, event_time(5), TraceKind::Write)],
            (2, 16),
        );
        let reader = trace((1..=8).map(|attempt| record(0, read_time(attempt), TraceKind::Read)).collect(), (2, 16));
        (owner, reader)
    }

    #[test]
    fn staleness_follows_logical_time_not_the_order_traces_arrive() {
        // Goal: the count does not depend on which host ran first. Method: the same two traces
        // merged in both orders; the reader misses only on the read after the write (its first
        // read is a compulsory miss, not counted).
        let (owner, reader) = write_between_reads();
        let forward = stale_lines(&[owner.clone(), reader.clone()], SwccProtocol::WriteThrough, |_| 0);
        assert_eq!(forward, vec![0, 10]);
        // Host order swapped (the owner is host 1 now): same answer for the reader.
        let backward = stale_lines(&[reader, owner], SwccProtocol::WriteThrough, |_| 1);
        assert_eq!(backward, vec![10, 0]);
    }

    #[test]
    fn the_owner_re_reads_only_after_foreign_writes() {
        // Goal: the owner keeps its DRAM copy; a move-in reset or a reader's miss does not make
        // it re-read, a foreign write does. Method: owner reads around a reader's reset and write.
        let owner = trace((1..=3).map(|attempt| record(0, read_time(attempt), TraceKind::Read)).collect(), (2, 6));
        let reader =
            trace(vec![record(0, event_time(1), TraceKind::Reset), record(0, event_time(2), TraceKind::Write)], (2, 6));
        assert_eq!(stale_lines(&[owner, reader], SwccProtocol::WriteThrough, |_| 0), vec![10, 0]);
    }

    #[test]
    fn no_shared_reader_misses_evict_the_other_readers() {
        // Goal: NoSharedReader's extra misses are derived in the replay. Method: two readers of
        // host 2's block alternate; under WriteThrough neither misses after its first (compulsory)
        // read, under NoSharedReader each of the other's misses evicts it.
        let reads = |host_offset: u64| -> Vec<TraceRecord> {
            (0..4).map(|i| record(0, read_time(1 + 2 * i + host_offset), TraceKind::Read)).collect()
        };
        let traces = [trace(reads(0), (0, 100)), trace(reads(1), (0, 100)), trace(vec![], (0, 100))];
        assert_eq!(stale_lines(&traces, SwccProtocol::WriteThrough, |_| 2), vec![0, 0, 0]);
        assert_eq!(stale_lines(&traces, SwccProtocol::NoSharedReader, |_| 2), vec![30, 30, 0]);
    }

    #[test]
    fn reads_outside_the_common_window_are_scaled_not_judged() {
        // Goal: a host that ran further in logical time is not judged against missing peer
        // events. Method: the reader's window runs to 40 but the owner's ends at 16; the reader's
        // rate in the common window (1 stale of 8 reads) is applied to its 20 reads.
        let (owner, mut reader) = write_between_reads();
        reader.records.extend((9..=20).map(|attempt| record(0, read_time(attempt), TraceKind::Read)));
        reader.window = (2, 40);
        assert_eq!(stale_lines(&[owner, reader], SwccProtocol::WriteThrough, |_| 0), vec![0, 25]);
    }

    #[test]
    fn records_round_trip_through_the_region() {
        // Goal: what a host appends is what the launcher reads. Method: append two, read back.
        let layout = Layout::new(2, 1 << 16, 1 << 16);
        let region = Region::create(layout.total).expect("memfd");
        let written = record(layout.swcc_slice(1), event_time(7), TraceKind::Write);
        assert!(append(&region, &layout, 1, written));
        region.host_shared(&layout, 1).trace_window_end.store(99, Ordering::Relaxed);
        let traces = read_traces(&region, &layout);
        assert!(traces[0].records.is_empty());
        assert_eq!(traces[1].records, vec![written]);
        assert_eq!(traces[1].window, (0, 99));
    }
}
