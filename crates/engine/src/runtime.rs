//! The runtime: morsel-driven workers with per-core work-stealing queues.
//!
//! ```text
//!   run_morsels(n, task)
//!     morsels 0..n dealt round-robin ──► Worker deque (core 0)   Worker deque (core 1) …
//!                                          │ pop local (LIFO-free: FIFO)     │
//!                                          └──── steal from the others ◄─────┘ when empty
//!   each worker: pinned to its core (specialized), runs morsels to completion; each morsel's
//!   scratch is one frame of the worker's arena (specialized), released when the morsel ends
//! ```
//!
//! `specialized` turns on together: pinning, huge-page prefaulted chunk pool, per-worker arena,
//! optional SCHED_FIFO. `plain` is what a default Linux process does: unpinned threads, the
//! global allocator, pages faulted on first touch.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crossbeam_deque::{Steal, Stealer, Worker};

use crate::arena::Arena;
use crate::error::{EngineError, Result};
use crate::pool::{ChunkPool, PoolMode};

/// Upper bound on worker threads (a 2-core machine uses 2).
pub const WORKERS_MAX: usize = 256;
/// Default bound on the chunk pool: 16 GiB.
pub const POOL_BYTES_MAX_DEFAULT: usize = 16 << 30;
/// Size of each worker's scratch arena: mapped and prefaulted once, never grown (the compiled
/// tier asserts at compile time that its per-morsel scratch fits).
pub const WORKER_ARENA_BYTES: usize = 1 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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
    /// One per worker index (empty in the plain runtime). `run_morsels` gives each index to
    /// one thread, so a lock is never contended; it is there to make sharing the runtime safe.
    arenas: Vec<Mutex<Arena>>,
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
        let arenas = match settings.kind {
            RuntimeKind::Specialized => {
                (0..settings.workers).map(|_| Arena::new(WORKER_ARENA_BYTES).map(Mutex::new)).collect::<Result<_>>()?
            }
            RuntimeKind::Plain => Vec::new(),
        };
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
            return (0..morsels).try_for_each(|m| {
                crate::control::check()?;
                task(0, m)
            });
        }
        // Workers work for the caller's statement: its cancel, timeout and memory budget.
        let control = crate::control::current().unwrap_or_else(crate::control::QueryControl::unlimited);
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
                let control = Arc::clone(&control);
                scope.spawn(move || {
                    crate::control::enter(&control, || {
                        if pin {
                            pin_to_core(index);
                        }
                        if fifo {
                            // Best effort: without root the worker stays time-shared.
                            let _ = set_sched_fifo();
                        }
                        while !failed.load(Ordering::Relaxed) {
                            let Some(morsel) = next_morsel(&queue, stealers, index) else { break };
                            if let Err(error) = crate::control::check().and_then(|()| task(index, morsel)) {
                                failed.store(true, Ordering::Relaxed);
                                first_error.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(error);
                            }
                        }
                    })
                });
            }
        });
        match first_error.into_inner().unwrap_or_else(|p| p.into_inner()) {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }

    /// Runs `f` with worker `index`'s scratch arena (specialized) or `None` (plain: the global
    /// allocator serves scratch memory). Scratch taken from it lives in a frame that ends
    /// before `f` returns, so nothing is carried from one morsel or query to the next.
    pub fn with_arena<R>(&self, index: usize, f: impl FnOnce(Option<&mut Arena>) -> R) -> R {
        if self.arenas.is_empty() {
            return f(None);
        }
        let mut arena = self.arenas[index % self.arenas.len()].lock().unwrap_or_else(|p| p.into_inner());
        f(Some(&mut arena))
    }
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

/// Pins the calling thread to the core it is running on now (best effort): keeps the core the
/// scheduler picked, and stops migrations from then on.
pub fn pin_to_current_core() {
    // SAFETY: sched_getcpu has no preconditions; it returns -1 on failure.
    let core = unsafe { libc::sched_getcpu() };
    pin_to_core(usize::try_from(core).unwrap_or(0));
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

/// Best effort SCHED_FIFO at priority 1 (needs root); returns whether the kernel granted it.
pub fn set_sched_fifo() -> bool {
    let parameters = libc::sched_param { sched_priority: 1 };
    // SAFETY: sched_setscheduler(0) targets the calling thread with a valid parameter struct.
    unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &parameters) == 0 }
}

/// Back to the default time-sharing policy (undoes [`set_sched_fifo`]; best effort).
pub fn set_sched_other() {
    let parameters = libc::sched_param { sched_priority: 0 };
    // SAFETY: as in set_sched_fifo.
    unsafe {
        libc::sched_setscheduler(0, libc::SCHED_OTHER, &parameters);
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

    // Goal: the specialized runtime serves morsel scratch from its worker arenas, reusing the
    // same bytes morsel after morsel, and the plain one from the heap; method: record the
    // address of each morsel's first scratch slice.
    #[test]
    fn specialized_morsels_reuse_their_worker_arena() {
        let runtime = Runtime::new(RuntimeSettings { workers: 2, ..RuntimeSettings::default() }).expect("valid");
        let addresses: Vec<Mutex<Vec<usize>>> = (0..2).map(|_| Mutex::new(Vec::new())).collect();
        runtime
            .run_morsels(40, |worker, _| {
                runtime.with_arena(worker, |arena| {
                    let arena = arena.expect("specialized workers have an arena");
                    let mut frame = arena.frame();
                    let scratch = frame.alloc_slice(1024, 0u32)?;
                    addresses[worker].lock().expect("not poisoned").push(scratch.as_ptr() as usize);
                    Ok(())
                })
            })
            .expect("no morsel fails");
        for worker in addresses {
            let worker = worker.into_inner().expect("not poisoned");
            assert!(worker.windows(2).all(|w| w[0] == w[1]), "every morsel of a worker reuses its frame's bytes");
        }
        let plain =
            Runtime::new(RuntimeSettings { kind: RuntimeKind::Plain, workers: 2, ..RuntimeSettings::default() })
                .expect("valid");
        assert!(plain.with_arena(0, |arena| arena.is_none()), "plain scratch comes from the heap");
    }

    // Goal: a failing morsel surfaces as the error; method: fail morsel 7.
    #[test]
    fn errors_propagate() {
        let runtime = Runtime::new(RuntimeSettings { workers: 2, ..RuntimeSettings::default() }).expect("valid");
        let result = runtime.run_morsels(20, |_, m| if m == 7 { Err(EngineError::DivisionByZero) } else { Ok(()) });
        assert!(matches!(result, Err(EngineError::DivisionByZero)));
    }
}
