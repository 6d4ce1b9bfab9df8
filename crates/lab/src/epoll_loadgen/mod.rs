//! A closed-loop PostgreSQL load generator on epoll: thousands of client connections on a few
//! threads, so its own cost per transaction stays the same whatever it talks to (pgbench polls
//! every socket of a thread on each wake-up, so its cost grows with the clients and hides the
//! pooler's).
//!
//! ```text
//!   caller's thread (the clock)           worker threads (one mio Poll each, a share of clients)
//!   spawn ──────────────────────────────► connect ─► login (bypass_wire::login) ─► Ready
//!   wait until every worker is ready ◄─── report_ready
//!   phase Warmup ───────────────────────► Query ─► … ─► ReadyForQuery ─► Query …  (closed loop)
//!   observer(Start), CPU clocks, phase Measure      counted: transactions, failures, latency
//!   … duration …
//!   observer(End), CPU clocks, phase Stop ─► each client finishes its query, sends Terminate
//!   join ─► merge tallies ─► EpollLoadReport
//! ```
//!
//! Invariants:
//! - Bounded: clients, threads, statements and keys have maxima; a message above
//!   [`worker::MESSAGE_BYTES_MAX`] is an error; histograms have a fixed range; error texts are
//!   sampled.
//! - A transaction counts once, in the phase in which its ReadyForQuery arrived; failed ones
//!   (an ErrorResponse before it) are counted apart and carry no latency.
//! - The generator's CPU is its worker threads' CPU clocks over exactly the measured window.

mod script;
mod tally;
mod worker;

use std::net::SocketAddr;
use std::os::unix::thread::JoinHandleExt;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bypass_wire::login::{LoginError, LoginRequest};
use bypass_wire::WireError;
use serde::Serialize;

pub use script::{CompiledScript, Random, Script, Statement, Zipfian, KEYS_MAX, KEY_PLACEHOLDER, STATEMENTS_MAX};
pub use worker::MESSAGE_BYTES_MAX;

use tally::Tally;
use worker::{Worker, WorkerSpec};

/// Most clients of one run (each is a socket and an ephemeral port).
pub const CLIENTS_MAX: usize = 20_000;
/// Most worker threads.
pub const THREADS_MAX: usize = 64;
/// Descriptors kept beyond one per client (epoll instances, files, the caller's own).
const DESCRIPTORS_SPARE: u64 = 256;
/// How often the clock thread looks at the observer's interrupt flag while it waits.
const CLOCK_TICK: Duration = Duration::from_millis(50);

/// Why a run or a client failed.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("load generator settings: {0}")]
    Config(String),
    #[error("{what}: {source}")]
    Io { what: &'static str, source: std::io::Error },
    #[error("login: {0}")]
    Login(#[from] LoginError),
    #[error("server error {code}: {message}")]
    Server { code: String, message: String },
    #[error("protocol: {0}")]
    Wire(#[from] WireError),
    #[error("protocol: {0}")]
    Protocol(String),
    #[error("the server closed the connection")]
    Closed,
    #[error("a worker thread panicked")]
    WorkerPanicked,
    #[error("interrupted")]
    Interrupted,
}

impl LoadError {
    fn io(what: &'static str, source: std::io::Error) -> LoadError {
        LoadError::Io { what, source }
    }
}

/// One run.
#[derive(Debug, Clone)]
pub struct EpollLoadSpec {
    pub address: SocketAddr,
    pub clients: usize,
    /// Worker threads (at most one per client).
    pub threads: usize,
    pub login: LoginRequest,
    pub script: Script,
    /// Time after every client logged in and before measuring.
    pub warmup: Duration,
    pub duration: Duration,
    /// How long all clients may take to connect and log in; the run goes on after it with
    /// those that did (the report says how many).
    pub connect_timeout: Duration,
    /// How long clients may take to finish their last query after the window closed.
    pub drain_timeout: Duration,
    pub seed: u64,
}

/// The edges of the measured window, for a caller that samples its own counters there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Edge {
    Start,
    End,
}

/// Told about the window's edges and asked, while the clock waits, whether to stop early.
pub trait Observer {
    fn edge(&mut self, _edge: Edge) {}
    fn interrupted(&self) -> bool {
        false
    }
}

/// An observer that does nothing.
pub struct NoObserver;

impl Observer for NoObserver {}

/// What a run measured. Latencies are of the window's successful transactions.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct EpollLoadReport {
    pub clients: usize,
    pub threads: usize,
    /// Clients that logged in.
    pub connected: usize,
    /// From the start until every worker had logged its clients in (or the timeout).
    pub connect_s: f64,
    pub window_s: f64,
    /// Successful transactions completed in the window, and transactions answered with an error.
    pub transactions: u64,
    pub failed_transactions: u64,
    pub tps: f64,
    /// The same over every phase (warm-up and drain included): what the server committed.
    pub total_transactions: u64,
    pub total_failed_transactions: u64,
    /// Clients whose last query was unanswered at the drain deadline.
    pub unfinished: usize,
    pub latency_mean_us: f64,
    pub latency_p50_us: f64,
    pub latency_p95_us: f64,
    pub latency_p99_us: f64,
    pub latency_p999_us: f64,
    pub latency_max_us: f64,
    /// The slowest successful transaction of the whole run (warm-up, window, drain): far above
    /// the window's maximum when a client waited through the window (its wait is in no
    /// percentile above).
    pub slowest_transaction_us: f64,
    /// The worker threads' CPU time (user + system) over the window, and per transaction.
    pub generator_cpu_s: f64,
    pub generator_cpu_us_per_txn: f64,
    /// The worker threads' CPU time over the whole run (connecting and closing included).
    pub generator_cpu_total_s: f64,
    /// Clients lost to errors, with some of the texts (and of failed transactions').
    pub errors: u64,
    pub error_samples: Vec<String>,
}

/// The phase every worker follows; only the clock thread moves it forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum Phase {
    Connect = 0,
    Warmup = 1,
    Measure = 2,
    /// The window closed; clients go on until the clock has read the CPU clocks.
    Cooldown = 3,
    Stop = 4,
}

/// What the clock thread and the workers share.
pub(crate) struct Shared {
    phase: AtomicU8,
    ready_workers: AtomicUsize,
}

impl Shared {
    fn new() -> Shared {
        Shared { phase: AtomicU8::new(Phase::Connect as u8), ready_workers: AtomicUsize::new(0) }
    }

    pub(crate) fn phase(&self) -> Phase {
        match self.phase.load(Ordering::Acquire) {
            0 => Phase::Connect,
            1 => Phase::Warmup,
            2 => Phase::Measure,
            3 => Phase::Cooldown,
            _ => Phase::Stop,
        }
    }

    fn set_phase(&self, phase: Phase) {
        self.phase.store(phase as u8, Ordering::Release);
    }

    pub(crate) fn report_ready(&self) {
        self.ready_workers.fetch_add(1, Ordering::AcqRel);
    }
}

/// Runs one measurement: connect every client, warm up, measure, drain.
pub fn run(spec: &EpollLoadSpec, observer: &mut dyn Observer) -> Result<EpollLoadReport, LoadError> {
    validate(spec)?;
    raise_descriptor_limit(spec.clients as u64 + DESCRIPTORS_SPARE)?;
    let script = Arc::new(CompiledScript::new(&spec.script)?);
    let shared = Arc::new(Shared::new());
    let started = Instant::now();
    let workers = spawn_workers(spec, &script, &shared)?;
    let outcome = drive_clock(spec, &shared, &workers, observer, started);
    shared.set_phase(Phase::Stop);
    let tally = join(workers)?;
    let clock = outcome?;
    Ok(report(spec, tally, &clock))
}

fn validate(spec: &EpollLoadSpec) -> Result<(), LoadError> {
    if spec.clients == 0 || spec.clients > CLIENTS_MAX {
        return Err(LoadError::Config(format!("clients must be 1..={CLIENTS_MAX}, not {}", spec.clients)));
    }
    if spec.threads == 0 || spec.threads > THREADS_MAX {
        return Err(LoadError::Config(format!("threads must be 1..={THREADS_MAX}, not {}", spec.threads)));
    }
    if spec.duration.is_zero() {
        return Err(LoadError::Config("the measured window must last more than 0 s".into()));
    }
    Ok(())
}

/// Raises the soft `RLIMIT_NOFILE` of this process to the hard limit when it is below `needed`.
fn raise_descriptor_limit(needed: u64) -> Result<(), LoadError> {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes one rlimit into `limit`, a live local.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(LoadError::io("getrlimit", std::io::Error::last_os_error()));
    }
    if limit.rlim_cur >= needed {
        return Ok(());
    }
    if limit.rlim_max < needed {
        let text = format!("{needed} descriptors needed, the hard limit is {}", limit.rlim_max);
        return Err(LoadError::Config(text));
    }
    limit.rlim_cur = limit.rlim_max;
    // SAFETY: setrlimit reads one rlimit from `limit`, a live local.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
        return Err(LoadError::io("setrlimit", std::io::Error::last_os_error()));
    }
    Ok(())
}

fn spawn_workers(
    spec: &EpollLoadSpec,
    script: &Arc<CompiledScript>,
    shared: &Arc<Shared>,
) -> Result<Vec<JoinHandle<Tally>>, LoadError> {
    let threads = spec.threads.min(spec.clients);
    let mut handles = Vec::with_capacity(threads);
    for index in 0..threads {
        let clients = spec.clients / threads + usize::from(index < spec.clients % threads);
        let worker = Worker::new(WorkerSpec {
            address: spec.address,
            clients,
            login: spec.login.clone(),
            script: Arc::clone(script),
            shared: Arc::clone(shared),
            seed: spec.seed ^ (index as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15),
            drain_timeout: spec.drain_timeout,
        })?;
        let spawned = std::thread::Builder::new().name(format!("epoll-load-{index}")).spawn(move || worker.run());
        match spawned {
            Ok(handle) => handles.push(handle),
            Err(error) => {
                shared.set_phase(Phase::Stop);
                let _ = join(handles);
                return Err(LoadError::io("spawning a load thread", error));
            }
        }
    }
    Ok(handles)
}

/// What the clock measured.
struct Clock {
    connect: Duration,
    window: Duration,
    cpu_ns: u64,
}

/// Moves the phases forward on time; the workers' CPU clocks are read while they are certain
/// to be alive (before Stop, which lets them exit).
fn drive_clock(
    spec: &EpollLoadSpec,
    shared: &Shared,
    workers: &[JoinHandle<Tally>],
    observer: &mut dyn Observer,
    started: Instant,
) -> Result<Clock, LoadError> {
    let ready_deadline = started + spec.connect_timeout;
    while shared.ready_workers.load(Ordering::Acquire) < workers.len() && Instant::now() < ready_deadline {
        wait(CLOCK_TICK, observer)?;
    }
    let connect = started.elapsed();
    shared.set_phase(Phase::Warmup);
    wait(spec.warmup, observer)?;
    let cpu_before = threads_cpu_ns(workers)?;
    observer.edge(Edge::Start);
    let window_start = Instant::now();
    shared.set_phase(Phase::Measure);
    wait(spec.duration, observer)?;
    shared.set_phase(Phase::Cooldown);
    let window = window_start.elapsed();
    observer.edge(Edge::End);
    let cpu_ns = threads_cpu_ns(workers)?.saturating_sub(cpu_before);
    Ok(Clock { connect, window, cpu_ns })
}

/// Sleeps `duration` in short steps, returning early with an error on an interrupt.
fn wait(duration: Duration, observer: &dyn Observer) -> Result<(), LoadError> {
    let deadline = Instant::now() + duration;
    loop {
        if observer.interrupted() {
            return Err(LoadError::Interrupted);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(());
        }
        std::thread::sleep(left.min(CLOCK_TICK));
    }
}

/// Σ of the workers' CPU clocks (user + system), in ns.
fn threads_cpu_ns(workers: &[JoinHandle<Tally>]) -> Result<u64, LoadError> {
    let mut total = 0;
    for handle in workers {
        let mut clock: libc::clockid_t = 0;
        // SAFETY: the thread is not joined yet, so its pthread_t is valid; `clock` is a live
        // out-parameter.
        let status = unsafe { libc::pthread_getcpuclockid(handle.as_pthread_t(), &mut clock) };
        if status != 0 {
            return Err(LoadError::io("a worker's CPU clock", std::io::Error::from_raw_os_error(status)));
        }
        let mut time = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: clock_gettime writes one timespec into `time`, a live local.
        if unsafe { libc::clock_gettime(clock, &mut time) } != 0 {
            return Err(LoadError::io("reading a worker's CPU clock", std::io::Error::last_os_error()));
        }
        total += timespec_ns(&time);
    }
    Ok(total)
}

fn timespec_ns(time: &libc::timespec) -> u64 {
    u64::try_from(time.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(time.tv_nsec).unwrap_or(0)
}

fn join(workers: Vec<JoinHandle<Tally>>) -> Result<Tally, LoadError> {
    let mut total = Tally::new();
    let mut panicked = false;
    for handle in workers {
        match handle.join() {
            Ok(tally) => total.merge(tally),
            Err(_) => panicked = true,
        }
    }
    match panicked {
        true => Err(LoadError::WorkerPanicked),
        false => Ok(total),
    }
}

fn report(spec: &EpollLoadSpec, tally: Tally, clock: &Clock) -> EpollLoadReport {
    let window_s = clock.window.as_secs_f64();
    let per_txn = |ns: u64| match tally.window_transactions {
        0 => 0.0,
        count => ns as f64 / 1_000.0 / count as f64,
    };
    EpollLoadReport {
        clients: spec.clients,
        threads: spec.threads.min(spec.clients),
        connected: tally.connected,
        connect_s: clock.connect.as_secs_f64(),
        window_s,
        transactions: tally.window_transactions,
        failed_transactions: tally.window_failed,
        tps: if window_s > 0.0 { tally.window_transactions as f64 / window_s } else { 0.0 },
        total_transactions: tally.total_transactions,
        total_failed_transactions: tally.total_failed,
        unfinished: tally.unfinished,
        latency_mean_us: tally.mean_us(),
        latency_p50_us: tally.quantile_us(0.5),
        latency_p95_us: tally.quantile_us(0.95),
        latency_p99_us: tally.quantile_us(0.99),
        latency_p999_us: tally.quantile_us(0.999),
        latency_max_us: tally.latency_ns.max() as f64 / 1_000.0,
        slowest_transaction_us: tally.slowest_ns as f64 / 1_000.0,
        generator_cpu_s: clock.cpu_ns as f64 / 1e9,
        generator_cpu_us_per_txn: per_txn(clock.cpu_ns),
        generator_cpu_total_s: tally.cpu_total_ns as f64 / 1e9,
        errors: tally.errors,
        error_samples: tally.error_samples,
    }
}
