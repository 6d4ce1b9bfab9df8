//! Per-host inbox rings in the region: many producers (every other host), one consumer (the
//! owner's worker). Control words are HWcc atomics; payloads are SWcc lines written back by the
//! producer and invalidated by the consumer, the same discipline as tuple data.
//!
//! ```text
//!  producer: CAS tail (if tail − head < SLOTS) → store payload → clwb + sfence → ready[slot] = 1
//!            → doorbell += 1 → futex_wake if anyone sleeps
//!  consumer: ready[head] == 1 ? → clflushopt payload → copy out → ready[head] = 0 → head += 1
//!  waiting : spin RING_WAIT_SPINS polls, then futex_wait(doorbell, seen) with a short timeout
//! ```
//!
//! Invariants: a slot is written only by the producer that reserved it and read only after its
//! ready flag is set; the futex is shared (not `FUTEX_PRIVATE`) because waiters and wakers are
//! different processes; a wake-up is never lost because the waiter re-checks after announcing
//! itself and `futex_wait` refuses to sleep once the doorbell moved.

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::time::Duration;

use crate::coherence::Swcc;
use crate::error::{PodError, Result};
use crate::region::{Layout, Off, Region, Shared, LINE_BYTES, RING_CONTROL_BYTES, RING_SLOTS, RING_SLOT_BYTES};

/// Bytes of the slot header: payload length (u32) and sender host (u32).
const SLOT_HEADER_BYTES: usize = 8;
/// Largest payload a message can carry.
pub const MESSAGE_BYTES_MAX: usize = RING_SLOT_BYTES as usize - SLOT_HEADER_BYTES;
/// Polls before a waiter sleeps in the kernel (on two cores a long spin starves the peer).
pub const RING_WAIT_SPINS: u32 = 2_000;
/// Longest single futex sleep; callers re-check their own deadlines after it.
pub const RING_SLEEP_MAX: Duration = Duration::from_millis(1);

/// Control words of one host's inbox.
#[repr(C)]
pub struct RingControl {
    pub tail: AtomicU64,
    _pad0: [AtomicU64; 7],
    pub head: AtomicU64,
    _pad1: [AtomicU64; 7],
    pub doorbell: AtomicU32,
    pub sleepers: AtomicU32,
    _pad2: [AtomicU64; 7],
    pub ready: [AtomicU8; RING_SLOTS],
}
const _: () = assert!(std::mem::size_of::<RingControl>() == 3 * LINE_BYTES as usize + RING_SLOTS);
const _: () = assert!(std::mem::size_of::<RingControl>() as u64 <= RING_CONTROL_BYTES);
// SAFETY: only atomics.
unsafe impl Shared for RingControl {}

/// Transport events, for the latency model.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RingCounters {
    pub sent: u64,
    pub sent_bytes: u64,
    pub received: u64,
    pub full_retries: u64,
    pub sleeps: u64,
}

/// One host's view of all inboxes.
pub struct Transport {
    layout: Layout,
    me: usize,
    pub counters: RingCounters,
}

impl Transport {
    pub fn new(layout: Layout, me: usize) -> Transport {
        assert!(me < layout.hosts);
        Transport { layout, me, counters: RingCounters::default() }
    }

    fn control<'r>(&self, region: &'r Region, host: usize) -> &'r RingControl {
        region.get(Off::<RingControl>::new(self.layout.ring_control(host)))
    }

    /// Sends `payload` to `to`'s inbox; `Ok(false)` when that inbox is full (the caller must poll
    /// its own inbox before retrying, or two full rings deadlock).
    pub fn try_send(&mut self, region: &Region, swcc: &mut Swcc, to: usize, payload: &[u8]) -> Result<bool> {
        if payload.len() > MESSAGE_BYTES_MAX {
            return Err(PodError::MessageTooLarge { bytes: payload.len(), max_bytes: MESSAGE_BYTES_MAX });
        }
        let ring = self.control(region, to);
        let Some(ticket) = Self::reserve(ring) else {
            self.counters.full_retries += 1;
            return Ok(false);
        };
        let slot = (ticket % RING_SLOTS as u64) as usize;
        let at = self.layout.payload_slot(to, slot);
        let mut header = [0u8; SLOT_HEADER_BYTES];
        header[..4].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        header[4..].copy_from_slice(&(self.me as u32).to_le_bytes());
        swcc.store(region, at, &header);
        swcc.store(region, at + SLOT_HEADER_BYTES as u64, payload);
        let total = (SLOT_HEADER_BYTES + payload.len()) as u64;
        swcc.writeback(region, at, total);
        swcc.fence();
        ring.ready[slot].store(1, Ordering::SeqCst);
        ring.doorbell.fetch_add(1, Ordering::SeqCst);
        if ring.sleepers.load(Ordering::SeqCst) > 0 {
            futex_wake(&ring.doorbell);
        }
        self.counters.sent += 1;
        self.counters.sent_bytes += total;
        Ok(true)
    }

    fn reserve(ring: &RingControl) -> Option<u64> {
        Self::reserve_observed(ring, || {})
    }

    /// Reserves the next ticket. `head` must be read before `tail`: head ≤ tail at every instant
    /// and both only grow, so head(t₁) ≤ tail(t₁) ≤ tail(t₂) and `tail − head` never underflows
    /// (it may overstate the occupancy, which only makes a full answer conservative). Read the
    /// other way round, another producer and the consumer can move both past the `tail` we saw
    /// (CI caught that as "attempt to subtract with overflow" with three hosts). `between_loads`
    /// lets a test run that interleaving deterministically; it is a no-op otherwise.
    fn reserve_observed(ring: &RingControl, mut between_loads: impl FnMut()) -> Option<u64> {
        loop {
            let head = ring.head.load(Ordering::Acquire);
            between_loads();
            let tail = ring.tail.load(Ordering::Acquire);
            assert!(head <= tail, "ring head {head} passed tail {tail}");
            if tail - head >= RING_SLOTS as u64 {
                return None;
            }
            if ring.tail.compare_exchange_weak(tail, tail + 1, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                return Some(tail);
            }
        }
    }

    /// Takes the next message of this host's inbox into `out`; returns the sender.
    pub fn try_receive(&mut self, region: &Region, swcc: &mut Swcc, out: &mut Vec<u8>) -> Option<usize> {
        let ring = self.control(region, self.me);
        let head = ring.head.load(Ordering::Relaxed);
        let slot = (head % RING_SLOTS as u64) as usize;
        if ring.ready[slot].load(Ordering::Acquire) == 0 {
            return None;
        }
        let at = self.layout.payload_slot(self.me, slot);
        swcc.invalidate(region, at, SLOT_HEADER_BYTES as u64);
        let mut header = [0u8; SLOT_HEADER_BYTES];
        swcc.load(region, at, &mut header);
        let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
        let from = u32::from_le_bytes([header[4], header[5], header[6], header[7]]) as usize;
        assert!(
            len <= MESSAGE_BYTES_MAX && from < self.layout.hosts,
            "corrupt ring slot {slot}: {len} bytes from {from}"
        );
        swcc.invalidate(region, at, (SLOT_HEADER_BYTES + len) as u64);
        out.clear();
        out.resize(len, 0);
        swcc.load(region, at + SLOT_HEADER_BYTES as u64, out);
        ring.ready[slot].store(0, Ordering::Release);
        ring.head.store(head + 1, Ordering::Release);
        self.counters.received += 1;
        Some(from)
    }

    /// Whether a message is waiting (one atomic load).
    pub fn has_message(&self, region: &Region) -> bool {
        let ring = self.control(region, self.me);
        let slot = (ring.head.load(Ordering::Relaxed) % RING_SLOTS as u64) as usize;
        ring.ready[slot].load(Ordering::Acquire) != 0
    }

    /// Waits until a message may be waiting: spins, then sleeps on the doorbell for at most
    /// [`RING_SLEEP_MAX`]. Spurious returns are fine; callers loop.
    pub fn wait(&mut self, region: &Region) {
        for _ in 0..RING_WAIT_SPINS {
            if self.has_message(region) {
                return;
            }
            std::hint::spin_loop();
        }
        let ring = self.control(region, self.me);
        let seen = ring.doorbell.load(Ordering::SeqCst);
        ring.sleepers.fetch_add(1, Ordering::SeqCst);
        if !self.has_message(region) {
            self.counters.sleeps += 1;
            futex_wait(&ring.doorbell, seen, RING_SLEEP_MAX);
        }
        ring.sleepers.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Sleeps while `word == expected`, at most `timeout` (shared futex: other processes wake us).
fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let spec = libc::timespec { tv_sec: timeout.as_secs() as libc::time_t, tv_nsec: timeout.subsec_nanos() as _ };
    // SAFETY: `word` is a live, aligned u32 in shared memory; FUTEX_WAIT only reads it. Errors
    // (EAGAIN when the value changed, ETIMEDOUT, EINTR) all mean "go and look again".
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAIT, expected, &spec as *const libc::timespec);
    }
}

/// Wakes one sleeper on `word`.
fn futex_wake(word: &AtomicU32) {
    // SAFETY: `word` is a live, aligned u32; FUTEX_WAKE does not access memory beyond the key.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coherence::{CoherenceBackend, Swcc};

    fn pod(hosts: usize) -> (Region, Layout) {
        let layout = Layout::new(hosts, 1 << 16, 1 << 16);
        let region = Region::create(layout.total).expect("memfd");
        region.init_header(&layout, 16);
        (region, layout)
    }

    fn incoherent(seed: u64) -> Swcc {
        Swcc::new(CoherenceBackend::Incoherent { early_evictions_per_million: 0 }.build(seed))
    }

    #[test]
    fn messages_arrive_in_order_through_incoherent_caches() {
        // Goal: ring payloads follow the flush discipline. Method: send 3×RING_SLOTS messages through
        // simulated non-coherent caches (slots are reused, so a missing invalidate would show old
        // bytes) and check every payload.
        let (region, layout) = pod(2);
        let mut sender = Transport::new(layout, 0);
        let mut receiver = Transport::new(layout, 1);
        let (mut send_cache, mut receive_cache) = (incoherent(1), incoherent(2));
        let mut out = Vec::new();
        for round in 0..3 * RING_SLOTS as u64 {
            let payload: Vec<u8> = (0..(round % 200) as usize + 1).map(|i| (i as u64 + round) as u8).collect();
            assert!(sender.try_send(&region, &mut send_cache, 1, &payload).expect("fits"));
            assert_eq!(receiver.try_receive(&region, &mut receive_cache, &mut out), Some(0));
            assert_eq!(out, payload, "round {round}");
        }
        assert_eq!(receiver.try_receive(&region, &mut receive_cache, &mut out), None);
    }

    #[test]
    fn full_ring_refuses_and_oversized_message_is_an_error() {
        // Goal: the ring is bounded and says so. Method: fill it without consuming.
        let (region, layout) = pod(2);
        let mut sender = Transport::new(layout, 0);
        let mut cache = incoherent(1);
        for _ in 0..RING_SLOTS {
            assert!(sender.try_send(&region, &mut cache, 1, b"x").expect("fits"));
        }
        assert!(!sender.try_send(&region, &mut cache, 1, b"x").expect("fits"));
        assert_eq!(sender.counters.full_retries, 1);
        let huge = vec![0u8; MESSAGE_BYTES_MAX + 1];
        assert!(matches!(sender.try_send(&region, &mut cache, 1, &huge), Err(PodError::MessageTooLarge { .. })));
    }

    #[test]
    fn reservation_survives_another_producer_and_the_consumer_moving_between_its_loads() {
        // Goal: the CI failure ("attempt to subtract with overflow" in a 3-host run) cannot recur.
        // Method: with an empty ring, run the exact interleaving between reserve's two loads —
        // another producer sends one message and the consumer takes it — then check the
        // reservation succeeds with the next ticket instead of computing tail − head < 0.
        let (region, layout) = pod(3);
        let ring: &RingControl = region.get(Off::<RingControl>::new(layout.ring_control(2)));
        let mut other_producer = Transport::new(layout, 1);
        let mut consumer = Transport::new(layout, 2);
        let (mut producer_cache, mut consumer_cache) = (incoherent(1), incoherent(2));
        let mut out = Vec::new();
        let mut interleaved = false;
        let ticket = Transport::reserve_observed(ring, || {
            if !interleaved {
                interleaved = true;
                assert!(other_producer.try_send(&region, &mut producer_cache, 2, b"other").expect("fits"));
                assert_eq!(consumer.try_receive(&region, &mut consumer_cache, &mut out), Some(1));
            }
        });
        assert!(interleaved);
        assert_eq!(ticket, Some(1), "the ticket after the other producer's");
        assert_eq!(ring.tail.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn many_producers_one_consumer_across_threads() {
        // Goal: concurrent producers never lose or duplicate a message. Method: 3 threads each send
        // 500 numbered messages to host 3, which sleeps on the futex between bursts.
        let (region, layout) = pod(4);
        let region = &region;
        let received = std::thread::scope(|scope| {
            for producer in 0..3usize {
                scope.spawn(move || {
                    let mut transport = Transport::new(layout, producer);
                    let mut cache = Swcc::new(CoherenceBackend::Noop.build(0));
                    for n in 0..500u32 {
                        let payload = n.to_le_bytes();
                        while !transport.try_send(region, &mut cache, 3, &payload).expect("fits") {
                            std::thread::yield_now();
                        }
                    }
                });
            }
            let mut transport = Transport::new(layout, 3);
            let mut cache = Swcc::new(CoherenceBackend::Noop.build(0));
            let mut next = [0u32; 3];
            let mut out = Vec::new();
            while next.iter().sum::<u32>() < 1500 {
                match transport.try_receive(region, &mut cache, &mut out) {
                    Some(from) => {
                        let n = u32::from_le_bytes([out[0], out[1], out[2], out[3]]);
                        assert_eq!(n, next[from], "per-producer FIFO order");
                        next[from] += 1;
                    }
                    None => transport.wait(region),
                }
            }
            next
        });
        assert_eq!(received, [500, 500, 500]);
    }
}
