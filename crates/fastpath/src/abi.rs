//! Rust mirror of `bpf/fastpath.h`: every struct the kernel and the pooler share.
//!
//! The slot and pool arrays are mmap-ed from the kernel, so their words are atomics here: the
//! programs update the same words with compare-and-swap.

use std::mem::{offset_of, size_of};
use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, AtomicU8};

pub const CLIENT_SLOTS: u32 = 32_768;
pub const POOLS_MAX: u32 = 64;
pub const POOL_SERVERS_MAX: u32 = 64;
pub const SERVER_SLOTS: u32 = POOLS_MAX * POOL_SERVERS_MAX;
pub const SLOTS: u32 = CLIENT_SLOTS + SERVER_SLOTS;
pub const NO_PEER: u32 = u32::MAX;

/// `Slot::gate`: set = the kernel forwards; clear = every byte goes to user space.
pub const GATE_FAST: u64 = 1;

/// `Slot::owner` of a client whose socket user space parked (`FP_CLIENT_PARKED`).
pub const CLIENT_PARKED: u32 = 1;
pub const OWNER_ABSENT: u32 = 0;
pub const OWNER_FREE: u32 = 1;
pub const OWNER_KERNEL: u32 = 2;
pub const OWNER_USER: u32 = 3;
pub const OWNER_HANDOFF: u32 = 4;

/// `fp_slot.flags` bit: the server's session state changed in the kernel (`FP_FLAG_DIRTY`).
pub const FLAG_DIRTY: u8 = 2;
/// `fp_slot.flags` bit of a server: the queue behind it broke (`FP_FLAG_QUEUE_BROKEN`); user
/// space fails its current and queued clients and closes it.
pub const FLAG_QUEUE_BROKEN: u8 = 4;

/// Link word bit: user space wrote every outstanding request, each a single autocommit
/// statement; one client may queue behind the link's server (`FP_LINK_QUEUEABLE`).
pub const LINK_QUEUEABLE: u64 = 1 << 30;
/// Link word bit: a client queued behind; no request joins this link (`FP_LINK_CLOSED`).
pub const LINK_CLOSED: u64 = 1 << 31;
/// `fp_slot.params` of a socket whose parameter values are not known: matches nothing.
pub const PARAMS_UNKNOWN: u16 = 0xffff;

/// One socket's state (`struct fp_slot`).
#[repr(C)]
pub struct Slot {
    pub link: AtomicU64,
    pub gate: AtomicU64,
    pub cookie: AtomicU64,
    pub redirected: AtomicU64,
    pub frame_left: AtomicU32,
    pub pool: AtomicU32,
    pub peer: AtomicU32,
    pub owner: AtomicU32,
    pub stash: [AtomicU8; 4],
    pub stash_len: AtomicU8,
    pub flags: AtomicU8,
    pub params: AtomicU16,
    pub pass_skip: AtomicU32,
    pub message_max: AtomicU32,
}

/// `PoolEntry::waiters` of a paused pool (`FP_WAITERS_PAUSED`).
pub const WAITERS_PAUSED: u32 = u32::MAX;

/// Per pool (`struct fp_pool`).
#[repr(C)]
pub struct PoolEntry {
    pub waiters: AtomicU32,
    pub servers: AtomicU32,
    /// From this many waiters on, handoffs do not wake user space (0: every handoff wakes it).
    pub quiet_from: AtomicU32,
    /// 1: a client with no free server may queue behind a queueable link (`fp_pool.queue_behind`).
    pub queue_behind: AtomicU32,
}

impl PoolEntry {
    /// Whether the kernel announces this pool's handoffs without a wake-up now.
    pub fn handoffs_quiet(&self) -> bool {
        let from = self.quiet_from.load(std::sync::atomic::Ordering::Acquire);
        let waiting = self.waiters.load(std::sync::atomic::Ordering::Acquire);
        from != 0 && waiting >= from && waiting != WAITERS_PAUSED
    }
}

/// Where one pool's bytes went (`struct fp_pool_counters`), per CPU in the kernel, summed by
/// [`crate::FastPath::pool_counters`]. Forwarded: redirected socket to socket in the kernel, never
/// copied to user space. Passed: handed up to user space, which read them. Requests run client to
/// server, answers server to client. Messages count in the skb their header ends in; `requests`
/// are the messages that ask for a ReadyForQuery (Query, Sync, FunctionCall), `answers` the
/// ReadyForQuery messages.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PoolCounters {
    /// Transactions whose server the kernel released.
    pub transactions: u64,
    pub request_bytes_forwarded: u64,
    pub request_messages_forwarded: u64,
    pub requests_forwarded: u64,
    pub request_bytes_passed: u64,
    pub request_messages_passed: u64,
    pub requests_passed: u64,
    pub answer_bytes_forwarded: u64,
    pub answer_messages_forwarded: u64,
    pub answers_forwarded: u64,
    pub answer_bytes_passed: u64,
    pub answer_messages_passed: u64,
    pub answers_passed: u64,
}

// SAFETY: plain old data of u64 fields, any bit pattern is valid.
unsafe impl aya::Pod for PoolCounters {}

impl PoolCounters {
    /// The fields in declaration order (for sums and differences).
    fn fields_mut(&mut self) -> [&mut u64; 13] {
        [
            &mut self.transactions,
            &mut self.request_bytes_forwarded,
            &mut self.request_messages_forwarded,
            &mut self.requests_forwarded,
            &mut self.request_bytes_passed,
            &mut self.request_messages_passed,
            &mut self.requests_passed,
            &mut self.answer_bytes_forwarded,
            &mut self.answer_messages_forwarded,
            &mut self.answers_forwarded,
            &mut self.answer_bytes_passed,
            &mut self.answer_messages_passed,
            &mut self.answers_passed,
        ]
    }

    pub fn add(&mut self, other: &PoolCounters) {
        let mut other = *other;
        for (mine, theirs) in self.fields_mut().into_iter().zip(other.fields_mut()) {
            *mine += *theirs;
        }
    }

    /// Share of request bytes the kernel forwarded, of all it saw (None before any).
    pub fn request_bytes_share(&self) -> Option<f64> {
        share(self.request_bytes_forwarded, self.request_bytes_passed)
    }

    /// Share of answer bytes the kernel forwarded, of all it saw (None before any).
    pub fn answer_bytes_share(&self) -> Option<f64> {
        share(self.answer_bytes_forwarded, self.answer_bytes_passed)
    }
}

fn share(forwarded: u64, passed: u64) -> Option<f64> {
    let total = forwarded + passed;
    (total > 0).then(|| forwarded as f64 / total as f64)
}

/// Per-CPU counters (`struct fp_counters`).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct Counters {
    pub client_runs: u64,
    pub server_runs: u64,
    pub bytes_to_servers: u64,
    pub bytes_to_clients: u64,
    pub transactions: u64,
    pub passes_no_server: u64,
    pub passes_unsafe: u64,
    pub passes_slow: u64,
    pub passes_idle_server: u64,
    pub handoffs: u64,
    pub redirect_failures: u64,
    /// Handoffs announced without waking user space (many clients waited).
    pub handoffs_quiet: u64,
    /// Requests queued behind a busy server (`queue_behind`).
    pub queued: u64,
    /// Queues behind a server that broke (both clients got an error, the server was closed).
    pub queue_broken: u64,
    /// Servers handed off to user space that a client took in the kernel first (`queue_behind`).
    pub taken_from_handoff: u64,
    /// Passes that closed a parked client's gate, announced on the ring to wake its session.
    pub passes_announced: u64,
}

// SAFETY: plain old data of u64 fields, any bit pattern is valid.
unsafe impl aya::Pod for Counters {}

const _: () = {
    assert!(size_of::<Slot>() == 64);
    assert!(offset_of!(Slot, frame_left) == 32);
    assert!(offset_of!(Slot, owner) == 44);
    assert!(offset_of!(Slot, stash) == 48);
    assert!(offset_of!(Slot, params) == 54);
    assert!(offset_of!(Slot, pass_skip) == 56);
    assert!(size_of::<PoolEntry>() == 16);
    assert!(offset_of!(PoolEntry, quiet_from) == 8);
    assert!(size_of::<PoolCounters>() == 104);
    assert!(offset_of!(PoolCounters, request_bytes_passed) == 32);
    assert!(offset_of!(PoolCounters, answers_passed) == 96);
    assert!(size_of::<Counters>() == 128);
};

/// The peer server slot (relative to the server range) of a client link word.
pub fn link_peer(link: u64) -> Option<u32> {
    let peer = (link >> 32) as u32;
    peer.checked_sub(1)
}

pub fn link_outstanding(link: u64) -> u32 {
    link as u32 & 0x3fff_ffff
}

pub fn link_word(server: u32, outstanding: u32) -> u64 {
    ((u64::from(server) + 1) << 32) | u64::from(outstanding)
}

/// Bytes passed to user space so far, from a gate word.
pub fn gate_passed(gate: u64) -> u64 {
    gate >> 1
}

// ---- Workload mirroring (`bpf/mirror.bpf.c`) ----------------------------------------------

pub const MIRROR_FLOWS_MAX: u32 = 4096;

/// `fp_mirror_streams` value bits: the stream started (low 32 bits: next sequence expected).
pub const STREAM_STARTED: u64 = 1 << 63;
/// The stream had a gap: its shadow gets no more bytes.
pub const STREAM_BROKEN: u64 = 1 << 62;

/// A mirrored client flow as its segments carry it (`struct fp_mirror_flow`): every field in
/// network byte order, exactly the bytes of the IPv4 and TCP headers.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MirrorFlow {
    pub client_ip: u32,
    pub pooler_ip: u32,
    pub client_port: u16,
    pub pooler_port: u16,
}

// SAFETY: plain old data without padding (asserted below), any bit pattern is valid.
unsafe impl aya::Pod for MirrorFlow {}

/// `struct fp_mirror_config`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct MirrorConfig {
    /// The UDP socket's port, network byte order.
    pub udp_port: u16,
    pub pad: u16,
    /// `MIRROR_CLONE_EGRESS` or 0.
    pub flags: u32,
    /// Mirrored flows; while 0 the tc program returns at once.
    pub flows: u32,
    pub reserved: u32,
}

/// `MirrorConfig::flags`: clone into the interface's egress (loopback only).
pub const MIRROR_CLONE_EGRESS: u32 = 1;

// SAFETY: plain old data without padding (asserted below), any bit pattern is valid.
unsafe impl aya::Pod for MirrorConfig {}

/// Per-CPU mirroring counters (`struct fp_mirror_counters`).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct MirrorCounters {
    /// tc: client segments with payload cloned.
    pub segments_cloned: u64,
    /// tc: a clone or its rewrite into a datagram failed (the shadow then misses bytes).
    pub clone_failures: u64,
    /// Datagrams whose payload was redirected into a shadow.
    pub segments_mirrored: u64,
    /// Payload bytes redirected into shadows.
    pub bytes_mirrored: u64,
    /// Datagrams that named no live stream or shadow socket, or whose redirect failed.
    pub drops_no_shadow: u64,
    /// Retransmitted bytes already mirrored, skipped.
    pub duplicate_bytes: u64,
    /// Streams cut off at a gap (a lost or reordered clone).
    pub desyncs: u64,
    /// Reply bytes from shadows, dropped in the kernel.
    pub shadow_reply_bytes_dropped: u64,
}

// SAFETY: plain old data of u64 fields, any bit pattern is valid.
unsafe impl aya::Pod for MirrorCounters {}

const _: () = {
    assert!(size_of::<MirrorFlow>() == 12);
    assert!(offset_of!(MirrorFlow, client_port) == 8);
    assert!(size_of::<MirrorConfig>() == 16);
    assert!(offset_of!(MirrorConfig, flows) == 8);
    assert!(size_of::<MirrorCounters>() == 64);
    assert!(offset_of!(MirrorCounters, shadow_reply_bytes_dropped) == 56);
};
