//! The handoff ring (`fp_handoffs`): server slots the kernel released while clients waited in
//! user space, which user space hands to the first of them, and parked clients whose gate a
//! pass closed (see the `park` module).
//!
//! ```text
//!   fp_server at 'Z' 'I' with waiters ─► ring record (server slot)
//!     waiters < quiet_from: forced wake-up ─► ring fd readable ─► handoff task drains
//!     waiters ≥ quiet_from: no wake-up ─► drained by the next passed request's acquire,
//!                                          or by the handoff task's 1 ms tick
//! ```
//!
//! A wake-up is an `irq_work`, raised with a self-IPI, which exits the VM on a virtual machine
//! (measured: most of `fp_server`'s 3.9 µs per run at 1,000 clients). With many clients queued,
//! requests reach the queue about as often as servers come free, so whoever queues next drains
//! the ring first and the wake-up is not needed. Records stay in ring order, and each goes to the
//! pool's oldest waiter: batching changes when a server is handed on, never to whom.

use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::{Mutex, TryLockError};

use aya::maps::{MapData, RingBuf};
use tokio::sync::Notify;

use crate::abi::{CLIENT_SLOTS, SLOTS};
use crate::{ClientSlot, FastPath, ServerSlot};

/// Waiting clients from which a pool's handoffs go without a wake-up, unless changed with
/// [`FastPath::set_handoff_quiet_from`]. A queue this long refills faster than servers come
/// free in a closed loop, so a passed request drains the ring within microseconds; with fewer
/// waiters a client's think time could leave a released server idle until the 1 ms tick.
pub const HANDOFF_QUIET_FROM: u32 = 16;

/// The consumer side of the ring, shared by the handoff task and every acquiring session.
pub(crate) struct Handoffs {
    ring: Mutex<RingBuf<MapData>>,
    fd: RawFd,
    /// Fires when a pool's handoffs turn quiet, so the handoff task starts its tick.
    quiet_started: Notify,
}

impl Handoffs {
    pub(crate) fn new(ring: RingBuf<MapData>) -> Self {
        let fd = ring.as_fd().as_raw_fd();
        Handoffs { ring: Mutex::new(ring), fd, quiet_started: Notify::new() }
    }
}

/// What the kernel announced on the ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Announcement {
    /// A server it released while clients waited in user space: for the first of them.
    Released(ServerSlot),
    /// A parked client whose gate a pass closed: its session must read.
    Passed(ClientSlot),
}

/// A descriptor of the fast path's to watch for wake-ups (the ring's, or the hang-up watch's;
/// it lives as long as the [`FastPath`]).
pub struct WatchFd(pub(crate) RawFd);

impl AsRawFd for WatchFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

impl FastPath {
    /// Calls `accept` for every announcement on the ring, oldest first, and returns how many. 0
    /// without looking when another thread is draining it (that one takes them all).
    pub fn drain_handoffs(&self, mut accept: impl FnMut(Announcement)) -> usize {
        let mut ring = match self.handoffs.ring.try_lock() {
            Ok(ring) => ring,
            Err(TryLockError::WouldBlock) => return 0,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
        };
        let mut taken = 0;
        // A server stays announced until user space takes it, and a parked client's gate closes
        // once per park: the ring holds fewer records than there are slots.
        while taken < SLOTS as usize {
            let Some(item) = ring.next() else { break };
            let index = item.get(..4).map(|bytes| u32::from_ne_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]));
            drop(item);
            match index {
                Some(index) if index < CLIENT_SLOTS => accept(Announcement::Passed(ClientSlot(index))),
                Some(index) => accept(Announcement::Released(ServerSlot(index - CLIENT_SLOTS))),
                None => {}
            }
            taken += 1;
        }
        taken
    }

    /// The ring's descriptor: readable after a wake-up (quiet handoffs make none).
    pub fn handoff_fd(&self) -> WatchFd {
        WatchFd(self.handoffs.fd)
    }

    /// Whether some pool's handoffs go without a wake-up now: then someone must drain the ring.
    pub fn handoffs_quiet(&self) -> bool {
        let used = self.pools_used.load(Ordering::Acquire);
        (0..used).any(|pool| self.pool(pool).handoffs_quiet())
    }

    /// Fires (one stored permit) when a pool's handoffs turn quiet.
    pub fn quiet_started(&self) -> &Notify {
        &self.handoffs.quiet_started
    }

    /// Lets a client with no free server queue its request behind a server whose link user
    /// space made queueable ([`FastPath::make_queueable`]), in every pool from now on.
    pub fn set_queue_behind(&self, on: bool) {
        self.queue_behind.store(u32::from(on), Ordering::Release);
        let used = self.pools_used.load(Ordering::Acquire);
        for pool in 0..used {
            self.pool(pool).queue_behind.store(u32::from(on), Ordering::Release);
        }
    }

    /// Sets, for every pool now and later, from how many waiting clients its handoffs go
    /// without a wake-up; 0 makes every handoff wake user space.
    pub fn set_handoff_quiet_from(&self, waiters: u32) {
        self.quiet_from.store(waiters, Ordering::Release);
        let used = self.pools_used.load(Ordering::Acquire);
        for pool in 0..used {
            self.pool(pool).quiet_from.store(waiters, Ordering::Release);
        }
        if self.handoffs_quiet() {
            self.handoffs.quiet_started.notify_one();
        }
    }

    /// Tells the kernel how many clients of `pool` wait in user space (it then leaves free
    /// servers to them, keeping the queue FIFO, and stops waking user space when they are
    /// many). The exchange makes the count visible to every CPU before the caller goes on, so
    /// the handoff task's look at [`FastPath::handoffs_quiet`] agrees with the kernel's.
    pub fn set_waiters(&self, pool: u32, waiters: u32) {
        let entry = self.pool(pool);
        let was_quiet = entry.handoffs_quiet();
        entry.waiters.swap(waiters, Ordering::SeqCst);
        if !was_quiet && entry.handoffs_quiet() {
            self.handoffs.quiet_started.notify_one();
        }
    }
}
