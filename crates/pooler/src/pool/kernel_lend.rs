//! Kernel lending: a pool whose transactions run in the kernel fast path lends its idle servers
//! there ([`crate::kernel::KernelPool`]), tells the kernel how many clients wait here, and takes
//! servers back (a waiter reclaims one, PAUSE reclaims all, the handoff ring returns the ones the
//! kernel released while clients waited).

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bypass_fastpath::{Announcement, ClientSlot, FastPath};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use super::{lock, Pool, PoolState};
use crate::server::ServerConn;

impl Pool {
    /// An idle server goes to the kernel's free set when this pool runs there, else to the
    /// user-space idle list.
    pub(super) fn park(&self, state: &mut PoolState, server: Box<ServerConn>) {
        let server = match self.kernel.get().filter(|_| !state.paused) {
            Some(kernel) => match kernel.lend(server) {
                Ok(()) => return,
                Err(server) => server,
            },
            None => server,
        };
        state.idle.push(server);
    }

    /// Tells the kernel how many clients wait here, so it leaves freed servers to them; a
    /// paused pool counts as waited on, so the kernel starts no transaction and hands every
    /// server it releases back here.
    pub(super) fn sync_kernel_waiters(&self, state: &PoolState) {
        if let Some(kernel) = self.kernel.get() {
            kernel.set_waiters(if state.paused { usize::MAX } else { state.waiting() });
        }
    }

    /// Takes every free server back from the kernel into the idle list (PAUSE).
    pub(super) fn reclaim_all(&self, state: &mut PoolState) {
        let Some(kernel) = self.kernel.get() else { return };
        while let Some(server) = kernel.reclaim() {
            state.idle.push(server);
        }
    }

    /// Runs this pool's transactions in the kernel from now on; `pools` routes the handoffs
    /// this pool's clients drain from the ring (of any pool) to their pools.
    pub fn enable_kernel(&self, kernel: crate::kernel::KernelPool, pools: Arc<KernelPools>) {
        let _ = self.handoff_pools.set(pools);
        let _ = self.kernel.set(kernel);
    }

    pub fn kernel(&self) -> Option<&crate::kernel::KernelPool> {
        self.kernel.get()
    }

    /// A server the kernel released while clients waited here: to the first of them.
    pub fn accept_handoff(&self, slot: bypass_fastpath::ServerSlot) {
        let Some(kernel) = self.kernel.get() else { return };
        if !kernel.fast.take_handoff(slot) {
            return;
        }
        if kernel.fast.queue_broken(slot) {
            kernel.fail_broken_queue(slot);
            drop(kernel.take(slot)); // Answers still due on it: closed, never reused.
            return;
        }
        if let Some(server) = kernel.take(slot) {
            self.release(server);
        }
    }

    pub(super) fn kernel_transactions(&self) -> u64 {
        self.kernel.get().map_or(0, |kernel| kernel.counters().transactions)
    }
}

/// Pools by kernel index, for the handoff ring.
pub type KernelPools = Mutex<Vec<Weak<Pool>>>;

/// While some pool's handoffs go without a wake-up: the longest a released server waits in the
/// ring when no passed request drains it first.
const QUIET_TICK: Duration = Duration::from_millis(1);

/// Otherwise every handoff wakes the task; this bounds the wait of a record a race left
/// unannounced (the kernel read a waiter count an instant before user space changed it).
const BACKSTOP_TICK: Duration = Duration::from_millis(100);

/// Hands every server the kernel released while clients waited to the pool's queue: on each
/// wake-up of the ring, and on a tick while handoffs are quiet (see `bypass_fastpath::handoff`).
pub async fn serve_handoffs(fast: Arc<FastPath>, pools: Arc<KernelPools>) {
    // SAFETY: the descriptor belongs to the ring inside `fast`, which this task holds: it stays
    // open as long as it is registered here.
    let ring = match unsafe { AsyncFd::register_with_interest(fast.handoff_fd(), Interest::READABLE) } {
        Ok(ring) => ring,
        Err(error) => return tracing::error!(%error, "cannot watch the fast path's handoff ring"),
    };
    // SAFETY: as above, the hang-up watch lives inside `fast`.
    let hangups = match unsafe { AsyncFd::register_with_interest(fast.hangup_fd(), Interest::READABLE) } {
        Ok(hangups) => hangups,
        Err(error) => return tracing::error!(%error, "cannot watch parked clients' hang-ups"),
    };
    loop {
        let tick = if fast.handoffs_quiet() { QUIET_TICK } else { BACKSTOP_TICK };
        drain_handoffs(&fast, &pools);
        tokio::select! {
            ready = ring.readable() => match ready {
                Ok(mut ready) => ready.clear_ready(),
                Err(error) => return tracing::error!(%error, "the fast path's handoff ring failed"),
            },
            ready = hangups.readable() => match ready {
                Ok(mut ready) => {
                    ready.clear_ready();
                    fast.drain_hangups(|client| wake_client(&fast, &pools, client));
                }
                Err(error) => return tracing::error!(%error, "the hang-up watch failed"),
            },
            () = fast.quiet_started().notified() => {}
            () = tokio::time::sleep(tick) => {}
        }
    }
}

/// Gives each server announced on the ring to the first client waiting in its pool, and wakes
/// each parked client whose gate a pass closed.
fn drain_handoffs(fast: &FastPath, pools: &KernelPools) {
    fast.drain_handoffs(|announcement| match announcement {
        Announcement::Released(slot) => match pool_at(pools, slot.pool()) {
            Some(pool) => pool.accept_handoff(slot),
            None => tracing::debug!(slot = slot.0, "handoff for a pool that is gone"),
        },
        Announcement::Passed(client) => wake_client(fast, pools, client),
    });
}

/// The pool of a kernel index (the list's lock is released before the caller uses it).
fn pool_at(pools: &KernelPools, index: u32) -> Option<Arc<Pool>> {
    let pool = lock(pools).get(index as usize).and_then(Weak::upgrade);
    pool
}

/// Wakes a parked client's session (bytes passed, or it hung up).
fn wake_client(fast: &FastPath, pools: &KernelPools, client: ClientSlot) {
    let index = fast.client(client).pool.load(std::sync::atomic::Ordering::Acquire);
    if let Some(kernel) = pool_at(pools, index).as_ref().and_then(|pool| pool.kernel()) {
        kernel.wake_passed(client);
    }
}

impl Pool {
    /// Before a client queues: servers the kernel announced without a wake-up go to the clients
    /// ahead of it first (FIFO), and may leave one for it.
    pub(super) fn drain_kernel_handoffs(&self) {
        let (Some(kernel), Some(pools)) = (self.kernel.get(), self.handoff_pools.get()) else { return };
        if kernel.fast.handoffs_quiet() {
            drain_handoffs(&kernel.fast, pools);
        }
    }
}
