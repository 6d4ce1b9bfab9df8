//! Kernel lending: a pool whose transactions run in the kernel fast path lends its idle servers
//! there ([`crate::kernel::KernelPool`]), tells the kernel how many clients wait here, and takes
//! servers back (a waiter reclaims one, PAUSE reclaims all, the handoff ring returns the ones the
//! kernel released while clients waited).

use std::sync::{Arc, Mutex, Weak};

use bypass_fastpath::abi::CLIENT_SLOTS;
use bypass_fastpath::{FastPath, ServerSlot};
use tokio::io::unix::AsyncFd;

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

    /// Runs this pool's transactions in the kernel from now on.
    pub fn enable_kernel(&self, kernel: crate::kernel::KernelPool) {
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

/// Hands every server the kernel released while clients waited to the pool's queue.
pub async fn serve_handoffs(fast: Arc<FastPath>, pools: Arc<KernelPools>) {
    let Some(ring) = fast.take_handoffs() else { return };
    // SAFETY: the AsyncFd owns the ring, which owns the descriptor: it stays open while registered.
    let mut ring = match unsafe { AsyncFd::register(ring) } {
        Ok(ring) => ring,
        Err(error) => return tracing::error!(%error, "cannot watch the fast path's handoff ring"),
    };
    loop {
        let Ok(mut ready) = ring.readable_mut().await else { return };
        let ring = ready.get_inner_mut();
        while let Some(item) = ring.next() {
            let Some(bytes) = item.get(..4) else { continue };
            let index = u32::from_ne_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
            let slot = ServerSlot(index.wrapping_sub(CLIENT_SLOTS));
            let pool = lock(&pools).get(slot.pool() as usize).and_then(Weak::upgrade);
            match pool {
                Some(pool) => pool.accept_handoff(slot),
                None => tracing::debug!(slot = slot.0, "handoff for a pool that is gone"),
            }
        }
        ready.clear_ready();
    }
}
