//! Query control: cancellation, statement timeout and the memory budget of running statements.
//!
//! ```text
//!   server / session ── QueryControl::new(deadline, memory_limit) ──► enter(control, || run)
//!        │ CancelRequest, client gone ──► control.cancel(reason)
//!        ▼
//!   query thread + its morsel workers (runtime::run_morsels re-enters the same control)
//!        └─ check() per morsel and per vector: Err(QueryCanceled | OutOfMemory) ends the query
//!   TrackingAllocator (the binary's global allocator): every allocation on a thread inside
//!   `enter` is charged to that control; past memory_limit the control trips (53200)
//!        └─ and to the server's MemoryBudget (shared by every control of one engine): past
//!           memory_budget the control that asks for more trips (53200)
//! ```
//!
//! Why a thread-local "current control" and an allocator instead of passing a context through
//! every operator: the checks are needed deep inside operators owned by other modules (scans,
//! joins, aggregation), and only the allocator sees every byte a query takes, including a join
//! whose output explodes inside one probe step. The allocator never fails an allocation (that
//! would abort the process): it trips the control, and the next `check()` stops the query.
//!
//! Why a server-wide budget beside the per-statement limit: `memory_limit` bounds one statement,
//! so N concurrent runaway statements could take N × memory_limit; the budget bounds their sum.
//!
//! Invariants: a control's state only moves from `Running` to one terminal reason, once; the
//! allocator never allocates, locks or panics; memory freed by a thread outside any control is
//! not credited to any query (a query can only over-count what it frees of others' memory); a
//! budget's `used` is the sum of the net charges of its live controls (a control gives its
//! charges back when it is dropped).

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::sync::atomic::{AtomicIsize, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{EngineError, Result};

/// Bytes a thread charges locally before it adds them to its control (keeps the shared counter
/// off the allocation fast path).
const CHARGE_BATCH_BYTES: isize = 256 << 10;
/// `QueryControl::deadline` when there is none.
const NO_DEADLINE: u64 = u64::MAX;

/// Why a statement stopped early.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum StopReason {
    /// A CancelRequest from the client (or an administrator).
    Canceled = 1,
    /// `statement_timeout` elapsed.
    Timeout = 2,
    /// The client disconnected.
    ClientGone = 3,
    /// The statement needed more than `memory_limit`.
    OutOfMemory = 4,
    /// The statement finished; later checks are a caller's bug, not a reason to stop.
    Finished = 5,
    /// The server's running statements together needed more than its `memory_budget`.
    ServerOutOfMemory = 6,
}

impl StopReason {
    fn from_u8(value: u8) -> Option<StopReason> {
        Some(match value {
            1 => StopReason::Canceled,
            2 => StopReason::Timeout,
            3 => StopReason::ClientGone,
            4 => StopReason::OutOfMemory,
            5 => StopReason::Finished,
            6 => StopReason::ServerOutOfMemory,
            _ => return None,
        })
    }
}

/// The memory all running statements of one server may hold together (`memory_budget`).
#[derive(Debug)]
pub struct MemoryBudget {
    limit: usize,
    used: AtomicIsize,
}

impl MemoryBudget {
    pub fn new(limit: usize) -> Arc<MemoryBudget> {
        Arc::new(MemoryBudget { limit, used: AtomicIsize::new(0) })
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Bytes the running statements hold now (as far as the allocator saw).
    pub fn used(&self) -> usize {
        usize::try_from(self.used.load(Ordering::Relaxed)).unwrap_or(0)
    }
}

/// The control block of one running statement; share it with `Arc`.
#[derive(Debug)]
pub struct QueryControl {
    state: AtomicU8,
    created: Instant,
    /// Nanoseconds after `created` when the statement times out (`NO_DEADLINE`: never);
    /// atomic because a portal's statement gets a new one at each Execute.
    deadline: AtomicU64,
    memory_limit: usize,
    memory_used: AtomicIsize,
    memory_peak: AtomicIsize,
    budget: Option<Arc<MemoryBudget>>,
}

impl QueryControl {
    /// A control for a statement starting now; `timeout` of `None` or zero means none.
    pub fn new(timeout: Option<Duration>, memory_limit: usize) -> Arc<QueryControl> {
        QueryControl::with_budget(timeout, memory_limit, None)
    }

    /// A control whose memory also counts against a server-wide `budget`.
    pub fn with_budget(
        timeout: Option<Duration>,
        memory_limit: usize,
        budget: Option<Arc<MemoryBudget>>,
    ) -> Arc<QueryControl> {
        let control = QueryControl {
            state: AtomicU8::new(0),
            created: Instant::now(),
            deadline: AtomicU64::new(NO_DEADLINE),
            memory_limit,
            memory_used: AtomicIsize::new(0),
            memory_peak: AtomicIsize::new(0),
            budget,
        };
        control.restart_timeout(timeout);
        Arc::new(control)
    }

    /// Starts the statement's clock again: it times out `timeout` from now (`None` or zero:
    /// never). A suspended portal's statement waits without one and gets a new one at each
    /// Execute (PostgreSQL counts statement_timeout per protocol message).
    pub fn restart_timeout(&self, timeout: Option<Duration>) {
        let deadline = timeout
            .filter(|t| !t.is_zero())
            .map_or(NO_DEADLINE, |t| u64::try_from((self.created.elapsed() + t).as_nanos()).unwrap_or(NO_DEADLINE - 1));
        self.deadline.store(deadline, Ordering::Release);
    }

    /// A control that never stops on its own (loaders, tests).
    pub fn unlimited() -> Arc<QueryControl> {
        QueryControl::new(None, usize::MAX)
    }

    /// Asks the statement to stop; the first reason wins.
    pub fn stop(&self, reason: StopReason) {
        let _ = self.state.compare_exchange(0, reason as u8, Ordering::AcqRel, Ordering::Acquire);
    }

    /// Why the statement was asked to stop, if it was.
    pub fn stopped(&self) -> Option<StopReason> {
        StopReason::from_u8(self.state.load(Ordering::Acquire))
    }

    pub fn deadline(&self) -> Option<Instant> {
        match self.deadline.load(Ordering::Acquire) {
            NO_DEADLINE => None,
            nanos => Some(self.created + Duration::from_nanos(nanos)),
        }
    }

    /// Most bytes the statement held at once (as far as the allocator saw).
    pub fn memory_peak(&self) -> usize {
        usize::try_from(self.memory_peak.load(Ordering::Relaxed)).unwrap_or(0)
    }

    /// Ok while the statement may go on; the error to end it with otherwise.
    pub fn check(&self) -> Result<()> {
        if let Some(reason) = self.stopped() {
            return Err(self.error(reason));
        }
        if self.deadline().is_some_and(|d| Instant::now() >= d) {
            self.stop(StopReason::Timeout);
            return Err(self.error(self.stopped().unwrap_or(StopReason::Timeout)));
        }
        Ok(())
    }

    fn error(&self, reason: StopReason) -> EngineError {
        match reason {
            StopReason::Canceled => EngineError::QueryCanceled("canceling statement due to user request".into()),
            StopReason::Timeout => EngineError::QueryCanceled("canceling statement due to statement timeout".into()),
            StopReason::ClientGone => EngineError::QueryCanceled("canceling statement: the client disconnected".into()),
            StopReason::OutOfMemory => EngineError::OutOfMemory(format!(
                "the statement needed more than memory_limit = {} bytes",
                self.memory_limit
            )),
            StopReason::ServerOutOfMemory => EngineError::OutOfMemory(format!(
                "the running statements together needed more than memory_budget = {} bytes",
                self.budget.as_ref().map_or(0, |b| b.limit)
            )),
            StopReason::Finished => EngineError::Runtime("statement checked after it finished".into()),
        }
    }

    /// Adds `bytes` (negative: freed) to the statement and to the server's budget; trips the
    /// control that grows past either bound. Called from the allocator: no allocation, no lock.
    fn charge(&self, bytes: isize) {
        let used = self.memory_used.fetch_add(bytes, Ordering::Relaxed) + bytes;
        if used > self.memory_peak.load(Ordering::Relaxed) {
            self.memory_peak.store(used, Ordering::Relaxed);
        }
        if used > 0 && used as usize > self.memory_limit {
            self.stop(StopReason::OutOfMemory);
        }
        if let Some(budget) = &self.budget {
            let total = budget.used.fetch_add(bytes, Ordering::Relaxed) + bytes;
            if bytes > 0 && total > 0 && total as usize > budget.limit {
                self.stop(StopReason::ServerOutOfMemory);
            }
        }
    }
}

impl Drop for QueryControl {
    /// The statement is over: what it still holds leaves the server's budget with it.
    fn drop(&mut self) {
        if let Some(budget) = &self.budget {
            budget.used.fetch_sub(self.memory_used.load(Ordering::Relaxed), Ordering::Relaxed);
        }
    }
}

thread_local! {
    /// The control of the statement this thread works for (null outside statements). A raw
    /// pointer in a const thread-local: the allocator reads it, so it must not allocate or
    /// register a destructor. `enter` keeps the pointee alive while it is set.
    static CURRENT: Cell<*const QueryControl> = const { Cell::new(std::ptr::null()) };
    /// Bytes allocated (positive) or freed (negative) since the last charge to CURRENT.
    static PENDING: Cell<isize> = const { Cell::new(0) };
}

/// Runs `f` with `control` as this thread's current control, then restores the previous one.
pub fn enter<R>(control: &Arc<QueryControl>, f: impl FnOnce() -> R) -> R {
    let previous = CURRENT.with(|c| c.get());
    flush_pending();
    CURRENT.with(|c| c.set(Arc::as_ptr(control)));
    struct Restore(*const QueryControl);
    impl Drop for Restore {
        fn drop(&mut self) {
            flush_pending();
            CURRENT.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(previous);
    f()
}

/// The current thread's control, for handing to worker threads.
pub fn current() -> Option<Arc<QueryControl>> {
    let pointer = CURRENT.with(|c| c.get());
    if pointer.is_null() {
        return None;
    }
    // SAFETY: `enter` set the pointer from a live Arc it keeps borrowed until it resets it; we
    // add one strong count for the new Arc we hand out.
    unsafe {
        Arc::increment_strong_count(pointer);
        Some(Arc::from_raw(pointer))
    }
}

/// Most a reservation's work ever took, in percent of what was reserved for it (tests read it
/// to show that the reservations made from SQL text are upper bounds).
static RESERVATION_USE_PERCENT_MAX: AtomicU64 = AtomicU64::new(0);

/// Runs `f`, which cannot check the statement's control while it runs (the parser building a
/// syntax tree), with `bytes` reserved for it ahead: past memory_limit or the server's budget
/// the statement stops before `f` runs (53200). While `f` runs the reservation stands for what
/// it allocates (counted apart, not twice); when it returns, what it still holds is charged to
/// the statement. Outside a statement `f` just runs.
pub fn with_reserved<R>(bytes: usize, f: impl FnOnce() -> R) -> Result<R> {
    let Some(control) = current() else {
        return Ok(f());
    };
    let reserved = isize::try_from(bytes).unwrap_or(isize::MAX);
    control.charge(reserved);
    if let Err(error) = control.check() {
        control.charge(-reserved);
        return Err(error);
    }
    let apart = QueryControl::unlimited();
    let result = enter(&apart, f);
    let (held, peak) = (apart.memory_used.load(Ordering::Relaxed), apart.memory_peak());
    control.charge(held - reserved);
    let percent = (peak as u128 * 100 / bytes.max(1) as u128).min(u128::from(u64::MAX)) as u64;
    RESERVATION_USE_PERCENT_MAX.fetch_max(percent, Ordering::Relaxed);
    Ok(result)
}

/// The largest share of its reservation any `with_reserved` work took so far, in percent.
pub fn reservation_use_percent_max() -> u64 {
    RESERVATION_USE_PERCENT_MAX.load(Ordering::Relaxed)
}

/// Ok unless the current statement was asked to stop (cancel, timeout, memory, client gone).
/// Cheap: one thread-local read and one atomic load, plus a clock read when a deadline is set.
pub fn check() -> Result<()> {
    let pointer = CURRENT.with(|c| c.get());
    if pointer.is_null() {
        return Ok(());
    }
    // SAFETY: see `current`; the reference does not outlive this call.
    unsafe { &*pointer }.check()
}

fn flush_pending() {
    let pending = PENDING.with(|p| p.replace(0));
    let pointer = CURRENT.with(|c| c.get());
    if pending != 0 && !pointer.is_null() {
        // SAFETY: see `current`.
        unsafe { &*pointer }.charge(pending);
    }
}

fn account(bytes: isize) {
    // `try_with`: during thread teardown the thread-locals may be gone; then nothing is charged.
    let _ = PENDING.try_with(|pending| {
        let total = pending.get() + bytes;
        if total.abs() < CHARGE_BATCH_BYTES {
            pending.set(total);
            return;
        }
        pending.set(0);
        let pointer = CURRENT.try_with(|c| c.get()).unwrap_or(std::ptr::null());
        if !pointer.is_null() {
            // SAFETY: see `current`.
            unsafe { &*pointer }.charge(total);
        }
    });
}

/// Bytes the current statement allocated leave it: they were handed to a thread that frees
/// them outside any statement (encoded rows sent to the network thread), so they stop counting
/// against its budget; otherwise a streamed result would be charged for every byte ever sent.
pub fn hand_off(bytes: usize) {
    account(-(bytes as isize));
}

/// A global allocator that charges every allocation to the current statement's control.
/// The `bypass` binary installs it around mimalloc; test binaries that check the memory budget
/// install it around the system allocator.
pub struct TrackingAllocator<A>(pub A);

// SAFETY: every call is forwarded unchanged to the inner allocator; the accounting only reads
// and writes thread-locals and atomics, never allocates and never unwinds.
unsafe impl<A: GlobalAlloc> GlobalAlloc for TrackingAllocator<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's guarantees.
        let pointer = unsafe { self.0.alloc(layout) };
        if !pointer.is_null() {
            account(layout.size() as isize);
        }
        pointer
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's guarantees.
        let pointer = unsafe { self.0.alloc_zeroed(layout) };
        if !pointer.is_null() {
            account(layout.size() as isize);
        }
        pointer
    }

    unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { self.0.dealloc(pointer, layout) };
        account(-(layout.size() as isize));
    }

    unsafe fn realloc(&self, pointer: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded with the caller's guarantees.
        let moved = unsafe { self.0.realloc(pointer, layout, new_size) };
        if !moved.is_null() {
            account(new_size as isize - layout.size() as isize);
        }
        moved
    }
}

/// Physical memory of the machine in bytes (0 if unknown).
pub fn physical_memory_bytes() -> usize {
    // SAFETY: sysconf has no preconditions.
    let (pages, page_size) = unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
    usize::try_from(pages).unwrap_or(0).saturating_mul(usize::try_from(page_size).unwrap_or(0))
}

/// The memory this process may use: physical memory, or the cgroup's `memory.max` when that
/// is lower (a container's limit; 0 if neither is known).
pub fn available_memory_bytes() -> usize {
    let physical = physical_memory_bytes();
    match cgroup_memory_max() {
        Some(cgroup) if physical == 0 || cgroup < physical => cgroup,
        _ => physical,
    }
}

/// The lowest memory limit of this process's cgroup and its ancestors: `memory.max` (cgroup
/// v2) or `memory.limit_in_bytes` (v1's memory controller).
fn cgroup_memory_max() -> Option<usize> {
    let membership = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    membership
        .lines()
        .filter_map(cgroup_limit_file)
        .filter_map(|(root, relative, file)| lowest_limit(root, relative, file))
        .min()
}

/// Where a `/proc/self/cgroup` line's memory limit lives: (hierarchy root, cgroup path, file).
fn cgroup_limit_file(line: &str) -> Option<(&'static str, &str, &'static str)> {
    let mut fields = line.splitn(3, ':');
    let (_, controllers, relative) = (fields.next()?, fields.next()?, fields.next()?);
    if controllers.is_empty() {
        Some(("/sys/fs/cgroup", relative, "memory.max"))
    } else if controllers.split(',').any(|c| c == "memory") {
        Some(("/sys/fs/cgroup/memory", relative, "memory.limit_in_bytes"))
    } else {
        None
    }
}

/// The lowest limit set in `file` from the cgroup up to the hierarchy's root.
fn lowest_limit(root: &str, relative: &str, file: &str) -> Option<usize> {
    let root = std::path::Path::new(root);
    let mut directory = root.join(relative.trim_start_matches('/'));
    let mut lowest: Option<usize> = None;
    loop {
        let limit = std::fs::read_to_string(directory.join(file)).ok().and_then(|t| parse_memory_max(&t));
        lowest = match (lowest, limit) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if directory == root || !directory.pop() {
            return lowest;
        }
    }
}

/// A cgroup memory limit: bytes, or `max` (no limit: `None`).
fn parse_memory_max(text: &str) -> Option<usize> {
    text.trim().parse().ok()
}

/// Default `memory_limit` and `memory_budget`: 80% of the available memory (physical or the
/// cgroup's memory.max), as DuckDB's default.
pub fn default_memory_limit() -> usize {
    match available_memory_bytes() {
        0 => usize::MAX,
        bytes => bytes / 5 * 4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: the first stop reason wins and check() reports it; a deadline trips by itself;
    // method: stop twice, and a zero-length timeout.
    #[test]
    fn first_reason_wins_and_deadlines_trip() {
        let control = QueryControl::new(None, usize::MAX);
        assert!(control.check().is_ok());
        control.stop(StopReason::Canceled);
        control.stop(StopReason::Timeout);
        let error = control.check().expect_err("stopped");
        assert_eq!(error.sqlstate(), "57014");
        assert!(error.to_string().contains("user request"), "{error}");
        let control = QueryControl::new(Some(Duration::from_nanos(1)), usize::MAX);
        std::thread::sleep(Duration::from_millis(1));
        assert!(control.check().expect_err("timed out").to_string().contains("statement timeout"));
    }

    // Goal: charges past the limit trip the control with 53200; method: charge directly.
    #[test]
    fn memory_limit_trips() {
        let control = QueryControl::new(None, 1000);
        control.charge(600);
        assert!(control.check().is_ok());
        control.charge(600);
        assert_eq!(control.check().expect_err("over budget").sqlstate(), "53200");
        assert_eq!(control.memory_peak(), 1200);
    }

    // Goal: the server-wide budget bounds the sum of concurrent statements each within its own
    // limit; the one that grows past it trips (53200), and a finished statement gives its bytes
    // back; method: two controls on one budget, charged directly.
    #[test]
    fn the_memory_budget_bounds_statements_together() {
        let budget = MemoryBudget::new(1000);
        let first = QueryControl::with_budget(None, 800, Some(Arc::clone(&budget)));
        let second = QueryControl::with_budget(None, 800, Some(Arc::clone(&budget)));
        first.charge(600);
        second.charge(300);
        assert!(first.check().is_ok() && second.check().is_ok());
        second.charge(300);
        let error = second.check().expect_err("together over the budget");
        assert_eq!(error.sqlstate(), "53200");
        assert!(error.to_string().contains("memory_budget = 1000"), "{error}");
        assert!(first.check().is_ok(), "the statement within the budget goes on");
        assert_eq!(budget.used(), 1200);
        drop(second);
        assert_eq!(budget.used(), 600, "a finished statement gives its bytes back");
        let third = QueryControl::with_budget(None, 800, Some(Arc::clone(&budget)));
        third.charge(300);
        assert!(third.check().is_ok());
    }

    // Goal: cgroup memory.max values read as bytes, `max` as no limit.
    #[test]
    fn cgroup_memory_max_parses() {
        assert_eq!(parse_memory_max("1073741824\n"), Some(1 << 30));
        assert_eq!(parse_memory_max("max\n"), None);
        assert_eq!(cgroup_limit_file("0::/a/b"), Some(("/sys/fs/cgroup", "/a/b", "memory.max")));
        let v1 = cgroup_limit_file("4:cpu,memory:/c");
        assert_eq!(v1, Some(("/sys/fs/cgroup/memory", "/c", "memory.limit_in_bytes")));
        assert_eq!(cgroup_limit_file("3:cpuset:/"), None);
        assert!(available_memory_bytes() <= physical_memory_bytes().max(1) || physical_memory_bytes() == 0);
    }

    // Goal: enter sets the thread's control and restores the previous one; current() hands out
    // a live Arc; method: nest two controls.
    #[test]
    fn enter_nests_and_restores() {
        let outer = QueryControl::unlimited();
        let inner = QueryControl::unlimited();
        assert!(current().is_none());
        enter(&outer, || {
            assert!(Arc::ptr_eq(&current().expect("set"), &outer));
            enter(&inner, || {
                inner.stop(StopReason::Canceled);
                assert!(check().is_err());
            });
            assert!(check().is_ok(), "the outer control is current again");
        });
        assert!(current().is_none());
    }
}
