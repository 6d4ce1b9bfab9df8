//! The runtime: morsel-driven workers with per-core work-stealing queues.
//!
//! ```text
//!   run_morsels(n, task)
//!     morsels 0..n dealt round-robin ──► Worker deque (core 0)   Worker deque (core 1) …
//!                                          │ pop local (LIFO-free: FIFO)     │
//!                                          └──── steal from the others ◄─────┘ when empty
//!   each worker: pinned to its core (specialized), runs morsels to completion, keeps its
//!   scratch arena (specialized) across morsels of the query
//! ```
//!
//! `specialized` turns on together: pinning, huge-page prefaulted chunk pool, per-worker arena,
//! optional SCHED_FIFO. `plain` is what a default Linux process does: unpinned threads, the
//! global allocator, pages faulted on first touch.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crossbeam_deque::{Steal, Stealer, Worker};

use crate::error::{EngineError, Result};
use crate::pool::{ChunkPool, PoolMode};

/// Upper bound on worker threads (a 2-core machine uses 2).
pub const WORKERS_MAX: usize = 256;
/// Default bound on the chunk pool: 16 GiB.
pub const POOL_BYTES_MAX_DEFAULT: usize = 16 << 30;
/// Initial size of a worker's scratch arena.
pub const ARENA_BYTES_INITIAL: usize = 1 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
pub enum RuntimeKind {
    /// Pinned workers, huge-page prefaulted pool, per-worker arenas.
    Specialized,
    /// Unpinned threads, global allocator, demand paging.
    Plain,
}

/// How the runtime is set up.
#[derive(Debug, Clone)]
pub struct RuntimeSettings {
    pub kind: RuntimeKind,
    /// Worker threads; default = available cores.
    pub workers: usize,
    /// Run workers under SCHED_FIFO (root only; off by default: it can starve the network
    /// thread on 2 cores).
    pub sched_fifo: bool,
    /// Bound on the chunk pool.
    pub pool_bytes_max: usize,
}

impl Default for RuntimeSettings {
    fn default() -> Self {
        RuntimeSettings {
            kind: RuntimeKind::Specialized,
            workers: online_cores(),
            sched_fifo: false,
            pool_bytes_max: POOL_BYTES_MAX_DEFAULT,
        }
    }
}

/// Shared runtime state: settings, the chunk pool, and each worker's scratch arena.
pub struct Runtime {
    settings: RuntimeSettings,
    pool: Arc<ChunkPool>,
    arenas: Vec<Mutex<bumpalo::Bump>>,
}

impl Runtime {
    pub fn new(settings: RuntimeSettings) -> Result<Runtime> {
        if settings.workers == 0 || settings.workers > WORKERS_MAX {
            return Err(EngineError::InvalidValue(format!("workers must be 1..={WORKERS_MAX}")));
        }
        let mode = match settings.kind {
            RuntimeKind::Specialized => PoolMode::Specialized,
            RuntimeKind::Plain => PoolMode::Plain,
        };
        let pool = ChunkPool::new(mode, settings.pool_bytes_max);
        let arenas = (0..settings.workers).map(|_| Mutex::new(prefaulted_arena(ARENA_BYTES_INITIAL))).collect();
        Ok(Runtime { settings, pool, arenas })
    }

    pub fn settings(&self) -> &RuntimeSettings {
        &self.settings
    }

    pub fn pool(&self) -> &Arc<ChunkPool> {
        &self.pool
    }

    pub fn workers(&self) -> usize {
        self.settings.workers
    }

    pub fn is_specialized(&self) -> bool {
        self.settings.kind == RuntimeKind::Specialized
    }

    /// Runs `task(worker, morsel)` for every morsel in `0..morsels`, in parallel, and returns
    /// the first error. Morsels are dealt to per-worker deques; idle workers steal.
    pub fn run_morsels<F>(&self, morsels: usize, task: F) -> Result<()>
    where
        F: Fn(usize, usize) -> Result<()> + Sync,
    {
        let workers = self.settings.workers.min(morsels.max(1));
        if workers <= 1 {
            return (0..morsels).try_for_each(|m| task(0, m));
        }
        let queues: Vec<Worker<usize>> = (0..workers).map(|_| Worker::new_fifo()).collect();
        for morsel in 0..morsels {
            queues[morsel % workers].push(morsel);
        }
        let stealers: Vec<Stealer<usize>> = queues.iter().map(Worker::stealer).collect();
        let failed = AtomicBool::new(false);
        let first_error: Mutex<Option<EngineError>> = Mutex::new(None);
        let pin = self.is_specialized();
        let fifo = self.settings.sched_fifo;
        std::thread::scope(|scope| {
            for (index, queue) in queues.into_iter().enumerate() {
                let (stealers, task, failed, first_error) = (&stealers, &task, &failed, &first_error);
                scope.spawn(move || {
                    if pin {
                        pin_to_core(index);
                    }
                    if fifo {
                        set_sched_fifo();
                    }
                    while !failed.load(Ordering::Relaxed) {
                        let Some(morsel) = next_morsel(&queue, stealers, index) else { break };
                        if let Err(error) = task(index, morsel) {
                            failed.store(true, Ordering::Relaxed);
                            first_error.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(error);
                        }
                    }
                });
            }
        });
        match first_error.into_inner().unwrap_or_else(|p| p.into_inner()) {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }

    /// Runs `f` with worker `index`'s scratch arena (specialized) or `None` (plain: the global
    /// allocator serves scratch memory).
    pub fn with_arena<R>(&self, index: usize, f: impl FnOnce(Option<&bumpalo::Bump>) -> R) -> R {
        if !self.is_specialized() {
            return f(None);
        }
        let arena = self.arenas[index % self.arenas.len()].lock().unwrap_or_else(|p| p.into_inner());
        f(Some(&arena))
    }

    /// Releases every arena's memory for reuse by the next query (no destructors run: arenas
    /// hold only POD scratch).
    pub fn reset_arenas(&self) {
        for arena in &self.arenas {
            arena.lock().unwrap_or_else(|p| p.into_inner()).reset();
        }
    }
}

/// An arena of `bytes` whose pages are already faulted in (touched once, then reset), so
/// query-time allocations from it never fault.
pub fn prefaulted_arena(bytes: usize) -> bumpalo::Bump {
    const PAGE_BYTES: usize = 4096;
    let mut arena = bumpalo::Bump::with_capacity(bytes);
    let touched = arena.alloc_slice_fill_copy(bytes, 0u8);
    for offset in (0..touched.len()).step_by(PAGE_BYTES) {
        // SAFETY: in bounds of the slice we were just given; volatile so it is not elided.
        unsafe { std::ptr::write_volatile(touched.as_mut_ptr().add(offset), 1) };
    }
    arena.reset();
    arena
}

fn next_morsel(local: &Worker<usize>, stealers: &[Stealer<usize>], me: usize) -> Option<usize> {
    if let Some(morsel) = local.pop() {
        return Some(morsel);
    }
    // Bounded: each round tries every other worker once; retry only on contention.
    loop {
        let mut retry = false;
        for (other, stealer) in stealers.iter().enumerate() {
            if other == me {
                continue;
            }
            match stealer.steal() {
                Steal::Success(morsel) => return Some(morsel),
                Steal::Retry => retry = true,
                Steal::Empty => {}
            }
        }
        if !retry {
            return None;
        }
    }
}

/// Cores online. Not `available_parallelism`, which shrinks to the calling thread's affinity
/// mask (1 once the thread is pinned).
pub fn online_cores() -> usize {
    // SAFETY: sysconf has no preconditions.
    let cores = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    usize::try_from(cores).ok().filter(|&c| c > 0).unwrap_or(1).min(WORKERS_MAX)
}

/// Pins the calling thread to core `index % cores` (best effort).
pub fn pin_to_core(index: usize) {
    let cores = online_cores();
    // SAFETY: cpu_set_t is plain data; CPU_SET writes inside it; sched_setaffinity(0) targets
    // the calling thread and reads the set we pass.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(index % cores, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// Lifts every CPU restriction of the calling thread (plain runtime measurements).
pub fn unpin() {
    let cores = online_cores();
    // SAFETY: as in pin_to_core.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for core in 0..cores {
            libc::CPU_SET(core, &mut set);
        }
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// Best effort SCHED_FIFO at priority 1 (needs root; ignored otherwise).
pub fn set_sched_fifo() {
    let parameters = libc::sched_param { sched_priority: 1 };
    // SAFETY: sched_setscheduler(0) targets the calling thread with a valid parameter struct.
    unsafe {
        libc::sched_setscheduler(0, libc::SCHED_FIFO, &parameters);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    // Goal: every morsel runs exactly once across workers, with stealing; method: count runs
    // per morsel where worker 0 is slow so the other must steal.
    #[test]
    fn every_morsel_runs_once() {
        for kind in [RuntimeKind::Specialized, RuntimeKind::Plain] {
            let runtime =
                Runtime::new(RuntimeSettings { kind, workers: 2, ..RuntimeSettings::default() }).expect("valid");
            let counts: Vec<AtomicUsize> = (0..100).map(|_| AtomicUsize::new(0)).collect();
            let by_worker: Vec<AtomicUsize> = (0..2).map(|_| AtomicUsize::new(0)).collect();
            runtime
                .run_morsels(100, |worker, morsel| {
                    if worker == 0 {
                        std::thread::sleep(std::time::Duration::from_millis(2));
                    }
                    counts[morsel].fetch_add(1, Ordering::Relaxed);
                    by_worker[worker].fetch_add(1, Ordering::Relaxed);
                    Ok(())
                })
                .expect("no task fails");
            assert!(counts.iter().all(|c| c.load(Ordering::Relaxed) == 1));
            assert!(by_worker[1].load(Ordering::Relaxed) > 50, "the fast worker stole from the slow one");
        }
    }

    // Goal: a failing morsel surfaces as the error; method: fail morsel 7.
    #[test]
    fn errors_propagate() {
        let runtime = Runtime::new(RuntimeSettings { workers: 2, ..RuntimeSettings::default() }).expect("valid");
        let result = runtime.run_morsels(20, |_, m| if m == 7 { Err(EngineError::DivisionByZero) } else { Ok(()) });
        assert!(matches!(result, Err(EngineError::DivisionByZero)));
    }
}
