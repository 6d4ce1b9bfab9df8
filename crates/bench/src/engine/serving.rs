//! `bypass bench engine-serving`: the engine as a server (issue 19) — first-row latency of a
//! large scan, `select 1` latency while another client streams a large result, resident memory
//! against DuckDB on the same rows, and memory after DROP TABLE.
//!
//! ```text
//!   TPC-H SF n generated here ─► CSV ─► COPY into `bypass engine serve` (child process)
//!                                    └─► DuckDB's read_csv (serving_peer.py, after the server)
//!   timing clients (raw protocol) ─► the server
//!     /proc/<pid>/status: VmRSS after load, VmHWM while serving, VmRSS after DROP
//!     a long join stopped by CancelRequest / statement_timeout: time to its ErrorResponse
//!     a long join whose client leaves: time until the server's threads are idle (schedstat)
//!   DuckDB ─► RSS after load, peak, after DROP
//! ```

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;

use bypass_engine::engine::{Engine, EngineSettings};
use bypass_engine::tpch;
use bypass_wire::login::{Login, LoginRequest, LoginStep};
use bypass_wire::BackendMessage;

use crate::report::machine::{command_line, Machine};
use crate::report::stats::{median, percentile_sorted};

/// The peer script, shipped with the crate.
const PEER_SCRIPT: &str = include_str!("../../engine/serving_peer.py");
/// The large result every measurement streams.
const SCAN: &str = "select * from lineitem";
/// How long the server may take to generate its data and listen.
const START_TIMEOUT: Duration = Duration::from_secs(900);
/// Bound on every read of a client.
const READ_TIMEOUT: Duration = Duration::from_secs(600);
/// Pause between two `select 1` probes while the scan streams.
const PROBE_INTERVAL: Duration = Duration::from_millis(20);
/// A query that runs for minutes (a self-join on a 7-value key), stopped by cancel or timeout.
const LONG_QUERY: &str = "select count(*) from lineitem l1 join lineitem l2 on l1.l_shipmode = l2.l_shipmode";
/// How long the long query runs before the CancelRequest, and its statement_timeout.
const STOP_AFTER: Duration = Duration::from_millis(500);

/// Arguments of `bypass bench engine-serving`.
#[derive(clap::Args, Debug, Clone)]
pub struct ServingArgs {
    /// TPC-H scale factor served (lineitem has about 6M rows per unit).
    #[arg(long, default_value_t = 1.0)]
    pub sf: f64,
    /// Timed scans per measurement (median reported).
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// Python with duckdb (default: the venv of scripts/engine-venv.sh); without it, no DuckDB.
    #[arg(long)]
    pub python: Option<PathBuf>,
    /// Skip DuckDB.
    #[arg(long)]
    pub no_peers: bool,
    /// Where engine-serving.{json,md} go.
    #[arg(long, default_value = "bench/results")]
    pub out_dir: PathBuf,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Latencies {
    pub samples_ms: Vec<f64>,
    pub median_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub max_ms: Option<f64>,
}

impl Latencies {
    fn of(samples_ms: Vec<f64>) -> Latencies {
        let mut micros: Vec<u64> = samples_ms.iter().map(|ms| (ms * 1000.0) as u64).collect();
        micros.sort_unstable();
        Latencies {
            median_ms: median(&samples_ms),
            p99_ms: percentile_sorted(&micros, 99.0).map(|us| us as f64 / 1000.0),
            max_ms: micros.last().map(|&us| us as f64 / 1000.0),
            samples_ms,
        }
    }
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Memory {
    pub rss_after_load_mib: Option<f64>,
    /// Peak resident set while serving (the engine: reset after load; DuckDB: since start).
    pub peak_rss_mib: Option<f64>,
    pub rss_after_drop_mib: Option<f64>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct ServingReport {
    pub command: String,
    pub machine: Machine,
    pub scale_factor: f64,
    pub runs: usize,
    pub scan: String,
    pub scan_rows: u64,
    /// Query sent → first DataRow, per scan.
    pub first_row: Latencies,
    /// Query sent → ReadyForQuery of the whole scan, seconds.
    pub scan_s: Vec<f64>,
    /// `select 1` on an idle server.
    pub select1_idle: Latencies,
    /// `select 1` from a second client while the first one streams the scan (only probes
    /// answered before the scan ended count).
    pub select1_while_streaming: Latencies,
    /// CancelRequest sent → the long query's ErrorResponse (57014).
    pub cancel_to_error: Latencies,
    /// The long query's ErrorResponse (57014) after its statement_timeout, minus the timeout.
    pub timeout_overshoot: Latencies,
    /// The long query's client closes its socket: until the server's threads stop using CPU
    /// (the first 10 ms window under 10% of a core after the close).
    pub disconnect_to_idle: Latencies,
    pub engine_memory: Memory,
    /// DuckDB on the same rows (its own CSV reader, in memory): version, load, scan in record
    /// batches of 2,048 rows, memory.
    pub duckdb: Option<serde_json::Value>,
    pub notes: Vec<String>,
}

/// A logged-in raw protocol connection that times messages.
struct Probe {
    stream: TcpStream,
    /// BackendKeyData: process id and secret, for CancelRequest.
    key: (i32, Vec<u8>),
    /// Unread bytes are `input[start..end]`.
    input: Vec<u8>,
    start: usize,
    end: usize,
}

impl Probe {
    fn connect(address: SocketAddr) -> anyhow::Result<Probe> {
        let stream = TcpStream::connect(address)?;
        stream.set_read_timeout(Some(READ_TIMEOUT))?;
        stream.set_nodelay(true)?;
        let mut probe = Probe { stream, key: (0, Vec::new()), input: vec![0; 1 << 20], start: 0, end: 0 };
        let (mut login, startup) = Login::start(LoginRequest::trust("bench", bypass_engine::server::DATABASE_NAME));
        probe.stream.write_all(&startup)?;
        loop {
            let (tag, body) = probe.message()?;
            let body = probe.input[body].to_vec();
            match login.on_message(BackendMessage::decode(tag, &body)?)? {
                LoginStep::Send(bytes) => probe.stream.write_all(&bytes)?,
                LoginStep::Continue => {}
                LoginStep::Done(welcome) => {
                    probe.key = (welcome.process_id, welcome.secret_key);
                    return Ok(probe);
                }
            }
        }
    }

    /// The next message: its tag and where its body lies in `input` (valid until the next call).
    fn message(&mut self) -> anyhow::Result<(u8, std::ops::Range<usize>)> {
        loop {
            let pending = &self.input[self.start..self.end];
            if pending.len() >= 5 {
                let length = u32::from_be_bytes([pending[1], pending[2], pending[3], pending[4]]) as usize;
                if pending.len() > length {
                    let (tag, body) = (pending[0], self.start + 5..self.start + 1 + length);
                    self.start += 1 + length;
                    return Ok((tag, body));
                }
                if 1 + length > self.input.len() {
                    self.input.resize(1 + length, 0);
                }
            }
            // Move the partial message to the front, then read after it.
            self.input.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
            let read = self.stream.read(&mut self.input[self.end..])?;
            anyhow::ensure!(read > 0, "the server closed the connection");
            self.end += read;
        }
    }

    /// Sends `sql`; returns (time to the first DataRow, time to ReadyForQuery, rows).
    fn timed(&mut self, sql: &str) -> anyhow::Result<(Option<Duration>, Duration, u64)> {
        let mut out = Vec::new();
        bypass_wire::frontend::build::query(&mut out, sql);
        let started = Instant::now();
        self.stream.write_all(&out)?;
        let (mut first, mut rows) = (None, 0u64);
        loop {
            let (tag, body) = self.message()?;
            match tag {
                b'D' => {
                    first.get_or_insert_with(|| started.elapsed());
                    rows += 1;
                }
                b'E' => anyhow::bail!("{sql}: {:?}", BackendMessage::decode(tag, &self.input[body])?),
                b'Z' => return Ok((first, started.elapsed(), rows)),
                _ => {}
            }
        }
    }
}

impl Probe {
    fn send(&mut self, sql: &str) -> anyhow::Result<()> {
        let mut out = Vec::new();
        bypass_wire::frontend::build::query(&mut out, sql);
        Ok(self.stream.write_all(&out)?)
    }

    /// Reads the answer of a query sent with `send` up to ReadyForQuery; when its
    /// ErrorResponse arrived and its SQLSTATE (an error if there was none).
    fn until_error(&mut self) -> anyhow::Result<(Instant, String)> {
        let mut failed = None;
        loop {
            let (tag, body) = self.message()?;
            match tag {
                b'E' => failed = Some((Instant::now(), sqlstate(&self.input[body]))),
                b'Z' => return failed.ok_or_else(|| anyhow::anyhow!("the query ended without an error")),
                _ => {}
            }
        }
    }

    /// CancelRequest for this connection's running query, on a new connection.
    fn cancel(&self, address: SocketAddr) -> anyhow::Result<()> {
        let mut request = Vec::with_capacity(16);
        request.extend_from_slice(&16u32.to_be_bytes());
        request.extend_from_slice(&bypass_wire::startup::CANCEL_REQUEST_CODE.to_be_bytes());
        request.extend_from_slice(&self.key.0.to_be_bytes());
        request.extend_from_slice(&self.key.1);
        TcpStream::connect(address)?.write_all(&request)?;
        Ok(())
    }
}

/// The SQLSTATE field of an ErrorResponse body.
fn sqlstate(body: &[u8]) -> String {
    let mut fields = body.split(|&b| b == 0);
    fields.find(|f| f.first() == Some(&b'C')).map(|f| String::from_utf8_lossy(&f[1..]).into_owned()).unwrap_or_default()
}

/// `runs` long queries stopped by CancelRequest (CancelRequest sent → ErrorResponse), then
/// `runs` stopped by statement_timeout (ErrorResponse after the query was sent, minus the
/// timeout), in milliseconds.
fn stop_latencies(address: SocketAddr, runs: usize) -> anyhow::Result<(Vec<f64>, Vec<f64>)> {
    let mut client = Probe::connect(address)?;
    let (mut canceled, mut timed_out) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        client.send(LONG_QUERY)?;
        std::thread::sleep(STOP_AFTER);
        let sent = Instant::now();
        client.cancel(address)?;
        let (answered, code) = client.until_error()?;
        anyhow::ensure!(code == "57014", "the canceled query answered {code}");
        canceled.push(ms(answered - sent));
    }
    client.timed(&format!("set statement_timeout = {}", STOP_AFTER.as_millis()))?;
    for _ in 0..runs {
        let started = Instant::now();
        client.send(LONG_QUERY)?;
        let (answered, code) = client.until_error()?;
        anyhow::ensure!(code == "57014", "the timed-out query answered {code}");
        timed_out.push(ms((answered - started).saturating_sub(STOP_AFTER)));
    }
    client.timed("reset statement_timeout")?;
    Ok((canceled, timed_out))
}

/// `runs` long queries whose client closes its socket `STOP_AFTER` in: milliseconds from the
/// close to the first 10 ms window in which the server's threads use under 10% of a core.
fn disconnect_latencies(address: SocketAddr, pid: u32, runs: usize) -> anyhow::Result<Vec<f64>> {
    const WINDOW: Duration = Duration::from_millis(10);
    let mut stopped = Vec::new();
    for _ in 0..runs {
        let mut client = Probe::connect(address)?;
        client.send(LONG_QUERY)?;
        std::thread::sleep(STOP_AFTER - WINDOW);
        let (before, cpu_before) = (Instant::now(), cpu_ns(pid)?);
        std::thread::sleep(WINDOW);
        let busy = Duration::from_nanos(cpu_ns(pid)?.saturating_sub(cpu_before));
        anyhow::ensure!(busy > before.elapsed() / 2, "the long query was not running before its client left");
        let closed = Instant::now();
        drop(client);
        loop {
            let (window_start, cpu_before) = (Instant::now(), cpu_ns(pid)?);
            std::thread::sleep(WINDOW);
            let busy = Duration::from_nanos(cpu_ns(pid)?.saturating_sub(cpu_before));
            if busy < window_start.elapsed() / 10 {
                stopped.push(ms(window_start - closed));
                break;
            }
            anyhow::ensure!(closed.elapsed() < READ_TIMEOUT, "the server kept working after its client left");
        }
        // The next run starts on an idle server.
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(stopped)
}

/// CPU time every thread of `pid` has used so far, from /proc/<pid>/task/*/schedstat.
fn cpu_ns(pid: u32) -> anyhow::Result<u64> {
    let mut total = 0u64;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let stat = std::fs::read_to_string(task?.path().join("schedstat")).unwrap_or_default();
        total += stat.split_whitespace().next().and_then(|ns| ns.parse::<u64>().ok()).unwrap_or(0);
    }
    Ok(total)
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

/// A field of /proc/<pid>/status in MiB.
fn status_mib(pid: u32, field: &str) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse::<f64>().ok().map(|kib| kib / 1024.0)
}

/// The engine server as a child process; killed when dropped.
struct ServerProcess {
    child: Child,
    address: SocketAddr,
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_server(bypass: &Path) -> anyhow::Result<ServerProcess> {
    let address: SocketAddr = format!("127.0.0.1:{}", bypass_testkit::free_port()).parse()?;
    let child = Command::new(bypass)
        .args(["engine", "serve", "--no-auth", "--no-tls", "--listen", &address.to_string()])
        .stdout(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {} engine serve", bypass.display()))?;
    let server = ServerProcess { child, address };
    let started = Instant::now();
    while started.elapsed() < START_TIMEOUT {
        if let Ok(mut probe) = Probe::connect(address) {
            probe.timed("select 1")?;
            return Ok(server);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    anyhow::bail!("the engine server did not answer within {START_TIMEOUT:?}")
}

/// `select 1` probes from a second client while `client` streams the scan once.
fn probes_while_streaming(address: SocketAddr, streaming: &mut Probe) -> anyhow::Result<(Vec<f64>, u64)> {
    let done = Arc::new(AtomicBool::new(false));
    let prober = {
        let done = Arc::clone(&done);
        std::thread::spawn(move || -> anyhow::Result<Vec<f64>> {
            let mut probe = Probe::connect(address)?;
            let mut samples = Vec::new();
            while !done.load(Ordering::Acquire) {
                let (_, took, _) = probe.timed("select 1")?;
                // A probe that ended after the scan did not compete with it.
                if !done.load(Ordering::Acquire) {
                    samples.push(ms(took));
                }
                std::thread::sleep(PROBE_INTERVAL);
            }
            Ok(samples)
        })
    };
    let outcome = streaming.timed(SCAN);
    done.store(true, Ordering::Release);
    let samples = prober.join().map_err(|_| anyhow::anyhow!("the probe thread panicked"))??;
    Ok((samples, outcome?.2))
}

/// Generates TPC-H in this process and writes it as CSV into `scratch`: the server and DuckDB
/// both load these files (the generator's static 300 MiB text pool stays in this process;
/// `bypass engine serve --tpch-sf` runs this in a child process for the same reason).
pub fn export_tpch(sf: f64, scratch: &Path) -> anyhow::Result<()> {
    let engine = Engine::new(EngineSettings::default())?;
    tpch::load(&engine, sf)?;
    super::tpch::export_csv(&engine, scratch)
}

/// CREATE TABLE and COPY … FROM '<dir>/<table>.csv' of every TPC-H table (files written by
/// [`export_tpch`]).
pub fn tpch_csv_statements(dir: &Path) -> Vec<String> {
    let mut statements = Vec::new();
    for name in tpch::TABLES {
        let columns = tpch::table_schema(name).expect("known table");
        let columns: Vec<String> = columns.iter().map(|c| format!("{} {}", c.name, c.data_type.sql_name())).collect();
        let path = dir.join(format!("{name}.csv"));
        statements.push(format!("create table {name} ({})", columns.join(", ")));
        statements.push(format!("copy {name} from '{}' (format csv)", path.display()));
    }
    statements
}

/// Loads the CSV files of [`export_tpch`] into the server through `client`.
fn load_server(client: &mut Probe, scratch: &Path) -> anyhow::Result<()> {
    for statement in tpch_csv_statements(scratch) {
        client.timed(&statement)?;
    }
    Ok(())
}

/// DuckDB on the same rows, through serving_peer.py.
fn run_duckdb(python: &Path, scratch: &Path) -> anyhow::Result<serde_json::Value> {
    let tables: serde_json::Map<String, serde_json::Value> = tpch::TABLES
        .iter()
        .map(|&name| {
            let columns = tpch::table_schema(name).expect("known table");
            let columns: Vec<(String, String)> =
                columns.iter().map(|c| (c.name.clone(), super::tpch::type_name(c.data_type))).collect();
            (name.to_string(), serde_json::json!(columns))
        })
        .collect();
    let job = serde_json::json!({"data_dir": scratch, "threads": 2, "tables": tables, "scan": SCAN});
    let job_path = scratch.join("serving_job.json");
    std::fs::write(&job_path, serde_json::to_vec(&job)?)?;
    let script = scratch.join("serving_peer.py");
    std::fs::write(&script, PEER_SCRIPT)?;
    let output = Command::new(python).arg(&script).arg(&job_path).output()?;
    anyhow::ensure!(output.status.success(), "serving_peer.py failed: {}", String::from_utf8_lossy(&output.stderr));
    Ok(serde_json::from_slice(&output.stdout)?)
}

/// Runs the benchmark and writes `engine-serving.{json,md}`.
pub fn run(args: &ServingArgs, bypass: &Path, python: Option<PathBuf>) -> anyhow::Result<ServingReport> {
    let mut report = ServingReport {
        command: command_line(),
        machine: Machine::now(),
        scale_factor: args.sf,
        runs: args.runs,
        scan: SCAN.into(),
        ..ServingReport::default()
    };
    let scratch = tempfile::tempdir()?;
    export_tpch(args.sf, scratch.path())?;
    let server = start_server(bypass)?;
    let pid = server.child.id();
    load_server(&mut Probe::connect(server.address)?, scratch.path())?;
    report.engine_memory.rss_after_load_mib = status_mib(pid, "VmRSS");
    // Peak from here on: serving, not generating the data (Linux ≥ 4.0, "5" resets VmHWM).
    let reset = std::fs::write(format!("/proc/{pid}/clear_refs"), "5").is_ok();
    if !reset {
        report.notes.push("VmHWM could not be reset after load: the engine's peak includes generating the data".into());
    }
    let address = server.address;
    let mut idle = Probe::connect(address)?;
    let idle_samples: Vec<f64> =
        (0..20).map(|_| idle.timed("select 1").map(|(_, took, _)| ms(took))).collect::<anyhow::Result<_>>()?;
    report.select1_idle = Latencies::of(idle_samples);
    let mut client = Probe::connect(address)?;
    let mut first_rows = Vec::new();
    for _ in 0..args.runs {
        let (first, total, rows) = client.timed(SCAN)?;
        first_rows.push(first.map_or(f64::NAN, ms));
        report.scan_s.push(total.as_secs_f64());
        report.scan_rows = rows;
    }
    report.first_row = Latencies::of(first_rows);
    let mut under_load = Vec::new();
    for _ in 0..args.runs {
        under_load.extend(probes_while_streaming(address, &mut client)?.0);
    }
    report.select1_while_streaming = Latencies::of(under_load);
    report.engine_memory.peak_rss_mib = status_mib(pid, "VmHWM");
    let (canceled, timed_out) = stop_latencies(address, args.runs)?;
    report.cancel_to_error = Latencies::of(canceled);
    report.timeout_overshoot = Latencies::of(timed_out);
    report.disconnect_to_idle = Latencies::of(disconnect_latencies(address, pid, args.runs)?);
    let drops: Vec<String> = tpch::TABLES.iter().map(|t| format!("drop table {t}")).collect();
    client.timed(&drops.join("; "))?;
    std::thread::sleep(Duration::from_secs(1));
    report.engine_memory.rss_after_drop_mib = status_mib(pid, "VmRSS");
    drop(server);
    if let Some(python) = python.filter(|_| !args.no_peers) {
        report.duckdb = Some(run_duckdb(&python, scratch.path())?);
    }
    report.machine.finish();
    report.notes.push(format!(
        "{} cores shared by the server, its clients (and DuckDB when it runs, after the server has stopped)",
        report.machine.nproc
    ));
    crate::report::write(&args.out_dir, "engine-serving", &report, &markdown(&report), |_| {
        anyhow::bail!("no plot for this benchmark (tables only)")
    })?;
    Ok(report)
}

fn cell(value: Option<f64>) -> String {
    value.map_or_else(|| "–".into(), |v| format!("{v:.1}"))
}

fn markdown(report: &ServingReport) -> String {
    let duck = |key: &str| report.duckdb.as_ref().and_then(|d| d[key].as_f64());
    let mut out = String::new();
    out.push_str(&format!("# The engine as a server (TPC-H SF {})\n\n", report.scale_factor));
    out.push_str(&format!("Command: `{}`\n\n{}\n\n", report.command, report.machine.headline()));
    out.push_str(&format!(
        "Load average before / after: {} / {}\n\n",
        report.machine.load_average_before, report.machine.load_average_after
    ));
    out.push_str("| measurement | median ms | p99 ms | max ms | samples |\n|---|---|---|---|---|\n");
    for (name, latencies) in [
        (format!("first row of `{}` ({} rows)", report.scan, report.scan_rows), &report.first_row),
        ("`select 1`, idle server".to_string(), &report.select1_idle),
        ("`select 1` while another client streams the scan".to_string(), &report.select1_while_streaming),
        (
            format!("CancelRequest → ErrorResponse of a running join ({} ms in)", STOP_AFTER.as_millis()),
            &report.cancel_to_error,
        ),
        (
            format!("ErrorResponse after statement_timeout = {} ms, minus the timeout", STOP_AFTER.as_millis()),
            &report.timeout_overshoot,
        ),
        (
            format!(
                "client closes its socket {} ms into the join → server threads idle (< 10% of a core over 10 ms)",
                STOP_AFTER.as_millis()
            ),
            &report.disconnect_to_idle,
        ),
    ] {
        out.push_str(&format!(
            "| {name} | {} | {} | {} | {} |\n",
            cell(latencies.median_ms),
            cell(latencies.p99_ms),
            cell(latencies.max_ms),
            latencies.samples_ms.len()
        ));
    }
    out.push_str(&format!("\nWhole scan, seconds per run: {:.2?}\n\n", report.scan_s));
    out.push_str("| resident memory, MiB | Bypass engine | DuckDB |\n|---|---|---|\n");
    let memory = &report.engine_memory;
    out.push_str(&format!(
        "| after load | {} | {} |\n| peak (engine: while serving; DuckDB: since start) | {} | {} |\n| after DROP TABLE of every table | {} | {} |\n",
        cell(memory.rss_after_load_mib),
        cell(duck("rss_after_load_mib")),
        cell(memory.peak_rss_mib),
        cell(duck("peak_rss_mib")),
        cell(memory.rss_after_drop_mib),
        cell(duck("rss_after_drop_mib")),
    ));
    if let Some(first) = duck("first_batch_ms") {
        out.push_str(&format!(
            "\nDuckDB in-process (no protocol): first batch of the scan {first:.1} ms, whole scan {} s.\n",
            cell(duck("scan_s"))
        ));
    }
    for note in &report.notes {
        out.push_str(&format!("\n- {note}"));
    }
    out.push('\n');
    out
}
