//! The load generator: persistent PostgreSQL connections in a closed loop, each query asking
//! for a deterministic payload that is verified byte by byte, latencies in HDR histograms.
//!
//! ```text
//!   thread per connection (in its client's namespace)
//!     loop until the deadline: Query(seed, size) ─► verify every row ─► ReadyForQuery
//!   report: Σ per-connection rate (bytes over that connection's own measured span), merged
//!           latency histogram, errors
//! ```
//! Each connection's rate is measured over a whole number of its queries (from the start of its
//! first measured query to the end of its last), so a 128 MB query cut by the deadline does not
//! distort the figure.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::payload::{self, Verifier};
use crate::pgclient::PgConnection;
use bypass_dispatch::error::{DispatchError, Result};
use bypass_dispatch::netns;
use bypass_dispatch::pglogin::LoginRequest;

/// The longest latency the histograms record (a query slower than this is clamped).
pub const LATENCY_US_MAX: u64 = 120_000_000;
/// Most connections one run may open.
pub const CONNECTIONS_MAX: usize = 256;
/// Error texts kept per run; more are only counted.
const ERRORS_KEPT_MAX: usize = 16;

/// Where a group of connections goes.
#[derive(Debug, Clone)]
pub struct Target {
    /// The client namespace to run in; `None` = the caller's namespace.
    pub namespace: Option<String>,
    pub address: SocketAddr,
    pub connections: usize,
}

/// One measurement.
#[derive(Debug, Clone)]
pub struct LoadSpec {
    pub targets: Vec<Target>,
    /// Payload bytes per query.
    pub size: u64,
    /// Time spent before measuring (connections warm, caches filled).
    pub warmup: Duration,
    /// Measuring time; every connection completes at least `queries_min` measured queries.
    pub duration: Duration,
    pub queries_min: u64,
    /// Upper bound on measured queries per connection (`u64::MAX` = none).
    pub queries_max: u64,
    pub login: LoginRequest,
    /// Bound on every single read (a stalled flow fails instead of hanging).
    pub read_timeout: Duration,
}

/// What one connection measured.
struct ConnectionOutcome {
    queries: u64,
    bytes: u64,
    span: Duration,
    latency_us: Histogram<u64>,
    error: Option<String>,
}

/// Aggregate figures of one measurement.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LoadReport {
    pub size: u64,
    pub connections: usize,
    pub queries: u64,
    pub payload_bytes: u64,
    /// Σ over connections of payload bits / own span, in Gbit/s.
    pub throughput_gbit_s: f64,
    pub queries_per_s: f64,
    pub latency_mean_us: f64,
    pub latency_p50_us: u64,
    pub latency_p99_us: u64,
    pub latency_p999_us: u64,
    pub latency_max_us: u64,
    pub errors: u64,
    pub error_samples: Vec<String>,
}

/// Runs one measurement: all connections at once, until the deadline.
pub fn run(spec: &LoadSpec) -> Result<LoadReport> {
    let total: usize = spec.targets.iter().map(|t| t.connections).sum();
    if total == 0 || total > CONNECTIONS_MAX {
        return Err(DispatchError::Config(vec![format!("connections must be 1 to {CONNECTIONS_MAX}, not {total}")]));
    }
    let start_at = Instant::now() + Duration::from_millis(200);
    let mut handles = Vec::with_capacity(total);
    let mut connection_id = 0u64;
    for target in &spec.targets {
        for _ in 0..target.connections {
            connection_id += 1;
            let (spec, target, id) = (spec.clone(), target.clone(), connection_id);
            let work = move || Ok(run_connection(&spec, target.address, id, start_at));
            let handle = match &target.namespace {
                Some(ns) => netns::spawn_in(ns, "loadgen", work)?,
                None => std::thread::Builder::new()
                    .name("loadgen".into())
                    .spawn(work)
                    .map_err(|e| DispatchError::io("spawning a load thread", e))?,
            };
            handles.push(handle);
        }
    }
    let mut outcomes = Vec::with_capacity(total);
    for handle in handles {
        let outcome = handle.join().map_err(|_| DispatchError::Lab("a load thread panicked".into()))??;
        outcomes.push(outcome);
    }
    Ok(aggregate(spec.size, outcomes))
}

fn run_connection(spec: &LoadSpec, address: SocketAddr, id: u64, start_at: Instant) -> ConnectionOutcome {
    let mut outcome = ConnectionOutcome {
        queries: 0,
        bytes: 0,
        span: Duration::ZERO,
        latency_us: Histogram::new_with_max(LATENCY_US_MAX, 3).expect("3 significant digits are valid"),
        error: None,
    };
    if let Err(error) = drive(spec, address, id, start_at, &mut outcome) {
        outcome.error = Some(format!("connection {id}: {error}"));
    }
    outcome
}

fn drive(
    spec: &LoadSpec,
    address: SocketAddr,
    id: u64,
    start_at: Instant,
    outcome: &mut ConnectionOutcome,
) -> Result<()> {
    let mut connection = PgConnection::connect(address, spec.login.clone(), spec.read_timeout)?;
    std::thread::sleep(start_at.saturating_duration_since(Instant::now()));
    let measure_from = start_at + spec.warmup;
    let deadline = measure_from + spec.duration;
    let mut query_number = 0u64;
    let mut first_start = None;
    loop {
        query_number += 1;
        let started = Instant::now();
        let measured = started >= measure_from;
        if measured
            && (outcome.queries >= spec.queries_max || (started >= deadline && outcome.queries >= spec.queries_min))
        {
            break;
        }
        let seed = (id << 32) | query_number;
        connection.send_query(&payload::query(seed, spec.size))?;
        let mut verifier = Verifier::new(query_number, seed, spec.size);
        let bytes = connection.read_payload(&mut verifier)?;
        let finished = Instant::now();
        if measured {
            first_start.get_or_insert(started);
            outcome.queries += 1;
            outcome.bytes += bytes;
            let micros = u64::try_from((finished - started).as_micros()).unwrap_or(u64::MAX);
            outcome.latency_us.saturating_record(micros.min(LATENCY_US_MAX));
            outcome.span = finished - first_start.expect("set above");
        }
    }
    connection.terminate();
    Ok(())
}

fn aggregate(size: u64, outcomes: Vec<ConnectionOutcome>) -> LoadReport {
    let mut latency = Histogram::<u64>::new_with_max(LATENCY_US_MAX, 3).expect("3 significant digits are valid");
    let (mut queries, mut bytes, mut gbit, mut qps) = (0, 0, 0.0, 0.0);
    let mut errors = Vec::new();
    let connections = outcomes.len();
    for outcome in outcomes {
        latency.add(&outcome.latency_us).expect("histograms share their bounds");
        queries += outcome.queries;
        bytes += outcome.bytes;
        let seconds = outcome.span.as_secs_f64();
        if seconds > 0.0 {
            gbit += outcome.bytes as f64 * 8.0 / seconds / 1e9;
            qps += outcome.queries as f64 / seconds;
        }
        errors.extend(outcome.error);
    }
    LoadReport {
        size,
        connections,
        queries,
        payload_bytes: bytes,
        throughput_gbit_s: gbit,
        queries_per_s: qps,
        latency_mean_us: latency.mean(),
        latency_p50_us: latency.value_at_quantile(0.5),
        latency_p99_us: latency.value_at_quantile(0.99),
        latency_p999_us: latency.value_at_quantile(0.999),
        latency_max_us: latency.max(),
        errors: errors.len() as u64,
        error_samples: errors.into_iter().take(ERRORS_KEPT_MAX).collect(),
    }
}
