//! The Prometheus endpoint: `GET /metrics` on `metrics_addr`, in the text exposition format.
//!
//! A deliberately small HTTP/1.0-style server: one request per connection, the request head
//! bounded and timed out; `GET` and `HEAD /metrics` answered, other paths 404, other methods 405. It runs on shard 0 and reads
//! the same counters as `SHOW STATS`.

use std::fmt::Write as _;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::pool::Pool;
use crate::shared::Shared;
use crate::stats::{HistogramTotals, LATENCY_BUCKETS_US};

/// Largest request head read; longer ones are refused.
const REQUEST_HEAD_MAX: usize = 8 * 1024;
/// A scraper must send its request within this time.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Scrapes served at once; more wait in the listen backlog.
const CONNECTIONS_MAX: usize = 16;

/// Serves scrapes until the shard stops.
pub async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    let slots = Arc::new(tokio::sync::Semaphore::new(CONNECTIONS_MAX));
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else { return };
        match listener.accept().await {
            Ok((stream, _)) => {
                let shared = shared.clone();
                tokio::spawn(async move {
                    if let Err(error) = answer(stream, &shared).await {
                        tracing::debug!(%error, "metrics request failed");
                    }
                    drop(permit);
                });
            }
            Err(error) => {
                tracing::warn!(%error, "metrics accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

async fn answer(mut stream: TcpStream, shared: &Shared) -> std::io::Result<()> {
    let head = tokio::time::timeout(REQUEST_TIMEOUT, read_head(&mut stream))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "request head too slow"))??;
    let request_line = head.lines().next().unwrap_or_default();
    let mut parts = request_line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
    let metrics = path == "/metrics" || path.starts_with("/metrics?");
    let response = match method {
        "GET" | "HEAD" if metrics => {
            let body = render(shared);
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            if method == "HEAD" {
                head
            } else {
                head + &body
            }
        }
        "GET" | "HEAD" => "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_owned(),
        _ => "HTTP/1.1 405 Method Not Allowed\r\nAllow: GET, HEAD\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            .to_owned(),
    };
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}

/// Reads up to the blank line that ends the request head.
async fn read_head(stream: &mut TcpStream) -> std::io::Result<String> {
    let mut head = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    while !head.windows(4).any(|window| window == b"\r\n\r\n") {
        if head.len() >= REQUEST_HEAD_MAX {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "request head too large"));
        }
        let read = stream.read(&mut chunk).await?;
        if read == 0 {
            break;
        }
        head.extend_from_slice(&chunk[..read]);
    }
    Ok(String::from_utf8_lossy(&head).into_owned())
}

/// Per-pool series: name, type, help; values in [`pool_values`] order.
const POOL_SERIES: [(&str, &str, &str); 9] = [
    ("bypass_clients_active", "gauge", "Clients logged in to the pool and not waiting."),
    ("bypass_clients_waiting", "gauge", "Clients queued for a server."),
    ("bypass_servers_active", "gauge", "Servers linked to a client."),
    ("bypass_servers_idle", "gauge", "Servers idle in the pool."),
    ("bypass_wait_longest_seconds", "gauge", "Wait of the longest-waiting client."),
    ("bypass_transactions_total", "counter", "Transactions completed."),
    ("bypass_queries_total", "counter", "Requests answered (ReadyForQuery)."),
    ("bypass_received_bytes_total", "counter", "Bytes from clients to servers."),
    ("bypass_sent_bytes_total", "counter", "Bytes from servers to clients."),
];

fn pool_values(pool: &Pool, now: Instant) -> [f64; POOL_SERIES.len()] {
    let (open, idle, waiting) = pool.counts();
    let clients = pool.stats.clients.load(Ordering::Relaxed);
    let totals = pool.totals();
    [
        f64::from(clients.saturating_sub(waiting)),
        f64::from(waiting),
        f64::from(open - idle),
        f64::from(idle),
        pool.longest_wait(now).as_secs_f64(),
        totals.transactions as f64,
        totals.queries as f64,
        totals.bytes_received as f64,
        totals.bytes_sent as f64,
    ]
}

fn pool_labels(pool: &Pool) -> String {
    format!("database=\"{}\",user=\"{}\"", escape(&pool.key.database), escape(&pool.key.user))
}

/// The whole exposition: per-pool gauges and counters, latency histograms, errors by kind.
pub fn render(shared: &Shared) -> String {
    let mut text = String::with_capacity(4096);
    let now = Instant::now();
    let pools = shared.pools();
    let values: Vec<(String, [f64; POOL_SERIES.len()])> =
        pools.iter().map(|pool| (pool_labels(pool), pool_values(pool, now))).collect();
    for (index, (name, kind, help)) in POOL_SERIES.iter().enumerate() {
        let _ = writeln!(text, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (labels, values) in &values {
            let _ = writeln!(text, "{name}{{{labels}}} {}", values[index]);
        }
    }
    render_histograms(&mut text, &pools);
    if let Some(fast) = &shared.fastpath {
        render_kernel(&mut text, fast);
        render_kernel_pools(&mut text, &pools);
    }
    crate::mirror::render_metrics(&mut text, &shared.mirror, shared.fastpath.as_ref());
    let _ = writeln!(text, "# HELP bypass_errors_total Client sessions ended by an error, by kind.");
    let _ = writeln!(text, "# TYPE bypass_errors_total counter");
    for (kind, count) in shared.errors.totals() {
        let _ = writeln!(text, "bypass_errors_total{{kind=\"{kind}\"}} {count}");
    }
    let _ = writeln!(text, "# HELP bypass_clients_connected Client connections open.");
    let _ = writeln!(text, "# TYPE bypass_clients_connected gauge");
    let _ = writeln!(text, "bypass_clients_connected {}", shared.client_connections.load(Ordering::Relaxed));
    render_limits(&mut text, shared, &pools);
    render_build_and_process(&mut text);
    text
}

/// The configured limits, as gauges: global ones, and each pool's size and reserve.
fn render_limits(text: &mut String, shared: &Shared, pools: &[Arc<Pool>]) {
    let live = shared.live();
    let settings = &live.settings;
    let globals = [
        ("bypass_config_max_client_connections", "max_client_conn.", u64::from(settings.max_client_conn)),
        ("bypass_config_default_pool_size", "default_pool_size.", u64::from(settings.default_pool_size)),
        (
            "bypass_config_max_db_connections",
            "max_db_connections (0 = unlimited).",
            u64::from(settings.max_db_connections),
        ),
        (
            "bypass_config_max_user_connections",
            "max_user_connections (0 = unlimited).",
            u64::from(settings.max_user_connections),
        ),
        ("bypass_config_reserve_pool_size", "reserve_pool_size.", u64::from(settings.reserve_pool_size)),
        (
            "bypass_config_query_wait_timeout_seconds",
            "query_wait_timeout_ms in seconds.",
            settings.query_wait_timeout_ms,
        ),
    ];
    for (name, help, value) in globals {
        let _ = writeln!(text, "# HELP {name} Configured {help}\n# TYPE {name} gauge");
        let value = if name.ends_with("_seconds") { value as f64 / 1000.0 } else { value as f64 };
        let _ = writeln!(text, "{name} {value}");
    }
    let per_pool = [
        ("bypass_pool_size", "Servers the pool may open (its pool_size)."),
        ("bypass_pool_reserve_size", "Servers the pool may open beyond its size for clients that waited."),
        ("bypass_pool_min_size", "Servers the pool keeps open (min_pool_size)."),
    ];
    for (index, (name, help)) in per_pool.iter().enumerate() {
        let _ = writeln!(text, "# HELP {name} {help}\n# TYPE {name} gauge");
        for pool in pools {
            let limits = pool.limits();
            let value = [limits.size, limits.reserve_size, limits.min_size][index];
            let _ = writeln!(text, "{name}{{{}}} {value}", pool_labels(pool));
        }
    }
}

/// `bypass_build_info` and the standard `process_*` series (from /proc/self).
fn render_build_and_process(text: &mut String) {
    let _ = writeln!(text, "# HELP bypass_build_info The running build; the value is always 1.");
    let _ = writeln!(text, "# TYPE bypass_build_info gauge");
    let _ = writeln!(text, "bypass_build_info{{version=\"{}\"}} 1", env!("CARGO_PKG_VERSION"));
    let Some(process) = ProcessStats::read() else { return };
    let series = [
        ("process_cpu_seconds_total", "counter", "User and system CPU time spent, seconds.", process.cpu_seconds),
        ("process_resident_memory_bytes", "gauge", "Resident memory size, bytes.", process.resident_bytes),
        ("process_virtual_memory_bytes", "gauge", "Virtual memory size, bytes.", process.virtual_bytes),
        ("process_open_fds", "gauge", "Open file descriptors.", process.open_fds),
        ("process_max_fds", "gauge", "Limit on open file descriptors.", process.max_fds),
        ("process_start_time_seconds", "gauge", "Start time since the Unix epoch, seconds.", process.start_time),
        ("process_threads", "gauge", "Operating system threads.", process.threads),
    ];
    for (name, kind, help, value) in series {
        let _ = writeln!(text, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}");
    }
}

/// What /proc says about this process.
struct ProcessStats {
    cpu_seconds: f64,
    resident_bytes: f64,
    virtual_bytes: f64,
    open_fds: f64,
    max_fds: f64,
    start_time: f64,
    threads: f64,
}

impl ProcessStats {
    fn read() -> Option<ProcessStats> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        // Fields after the command name, which is in parentheses and may contain spaces.
        let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
        let field = |number: usize| fields.get(number - 3).and_then(|value| value.parse::<f64>().ok());
        // SAFETY: sysconf only reads a system constant.
        let (ticks, page) = unsafe { (libc::sysconf(libc::_SC_CLK_TCK), libc::sysconf(libc::_SC_PAGESIZE)) };
        let (ticks, page) = (ticks.max(1) as f64, page.max(1) as f64);
        let boot = std::fs::read_to_string("/proc/stat").ok()?;
        let boot_time: f64 = boot.lines().find_map(|line| line.strip_prefix("btime "))?.trim().parse().ok()?;
        let open_fds = std::fs::read_dir("/proc/self/fd").map(|entries| entries.count() as f64).unwrap_or(0.0);
        let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit only writes the struct we pass.
        let max_fds =
            if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0 { limit.rlim_cur as f64 } else { 0.0 };
        Some(ProcessStats {
            cpu_seconds: (field(14)? + field(15)?) / ticks,
            threads: field(20)?,
            start_time: boot_time + field(22)? / ticks,
            virtual_bytes: field(23)?,
            resident_bytes: field(24)? * page,
            open_fds,
            max_fds,
        })
    }
}

fn render_histograms(text: &mut String, pools: &[Arc<Pool>]) {
    let families = [
        ("bypass_wait_seconds", "Time a client waited for a server, per user-space transaction."),
        ("bypass_transaction_seconds", "Time from a user-space transaction's first request to its end."),
    ];
    for (index, (name, help)) in families.iter().enumerate() {
        let _ = writeln!(text, "# HELP {name} {help}\n# TYPE {name} histogram");
        for pool in pools {
            let labels = pool_labels(pool);
            let totals = pool.totals();
            let histogram = if index == 0 { &totals.wait } else { &totals.transaction_time };
            write_histogram(text, name, &labels, histogram);
        }
    }
}

/// The kernel fast path's own counters (all CPUs) and its programs' run time (`bpf_stats`,
/// counted only while the sysctl `kernel.bpf_stats_enabled` is 1).
fn render_kernel(text: &mut String, fast: &bypass_fastpath::FastPath) {
    let c = fast.counters();
    let series: [(&str, &str, &str, u64); 10] = [
        ("bypass_kernel_transactions_total", "", "Transactions released in the kernel.", c.transactions),
        (
            "bypass_kernel_bytes_total",
            "direction=\"to_servers\"",
            "Bytes redirected in the kernel.",
            c.bytes_to_servers,
        ),
        ("bypass_kernel_bytes_total", "direction=\"to_clients\"", "", c.bytes_to_clients),
        (
            "bypass_kernel_passes_total",
            "reason=\"no_server\"",
            "Client bytes passed to user space.",
            c.passes_no_server,
        ),
        ("bypass_kernel_passes_total", "reason=\"unsafe\"", "", c.passes_unsafe),
        ("bypass_kernel_passes_total", "reason=\"slow\"", "", c.passes_slow),
        ("bypass_kernel_passes_total", "reason=\"idle_server\"", "", c.passes_idle_server),
        ("bypass_kernel_handoffs_total", "", "Servers released to clients waiting in user space.", c.handoffs),
        ("bypass_kernel_redirect_failures_total", "", "Redirects the kernel refused.", c.redirect_failures),
        (
            "bypass_kernel_verdicts_total",
            "",
            "Verdict program runs (client and server).",
            c.client_runs + c.server_runs,
        ),
    ];
    for (name, labels, help, value) in series {
        if !help.is_empty() {
            let _ = writeln!(text, "# HELP {name} {help}\n# TYPE {name} counter");
        }
        let _ = writeln!(text, "{name}{{{labels}}} {value}");
    }
    let _ = writeln!(text, "# HELP bypass_kernel_program_seconds_total Run time of each verdict program (bpf_stats).");
    let _ = writeln!(text, "# TYPE bypass_kernel_program_seconds_total counter");
    let programs = fast.program_stats();
    for program in &programs {
        let seconds = program.run_time_ns as f64 / 1e9;
        let _ = writeln!(text, "bypass_kernel_program_seconds_total{{program=\"{}\"}} {seconds}", program.name);
    }
    let _ = writeln!(text, "# HELP bypass_kernel_program_runs_total Runs of each verdict program (bpf_stats).");
    let _ = writeln!(text, "# TYPE bypass_kernel_program_runs_total counter");
    for program in &programs {
        let _ =
            writeln!(text, "bypass_kernel_program_runs_total{{program=\"{}\"}} {}", program.name, program.run_count);
    }
}

/// Per pool that runs in the kernel: bytes and messages by direction (request: client to
/// server, answer: server to client) and by path (`kernel`: forwarded socket to socket in the
/// kernel; `passed`: handed up to user space, which read and relayed them).
fn render_kernel_pools(text: &mut String, pools: &[Arc<Pool>]) {
    let counted: Vec<(String, bypass_fastpath::PoolCounters)> =
        pools.iter().filter_map(|pool| pool.kernel().map(|kernel| (pool_labels(pool), kernel.counters()))).collect();
    let families = [
        ("bypass_kernel_pool_bytes_total", "Bytes of a kernel pool by direction and path."),
        ("bypass_kernel_pool_messages_total", "Messages of a kernel pool by direction and path."),
    ];
    for (index, (name, help)) in families.iter().enumerate() {
        let _ = writeln!(text, "# HELP {name} {help}\n# TYPE {name} counter");
        for (labels, c) in &counted {
            let values = if index == 0 {
                [c.request_bytes_forwarded, c.request_bytes_passed, c.answer_bytes_forwarded, c.answer_bytes_passed]
            } else {
                [
                    c.request_messages_forwarded,
                    c.request_messages_passed,
                    c.answer_messages_forwarded,
                    c.answer_messages_passed,
                ]
            };
            let keys = [("request", "kernel"), ("request", "passed"), ("answer", "kernel"), ("answer", "passed")];
            for ((direction, path), value) in keys.iter().zip(values) {
                let _ = writeln!(text, "{name}{{{labels},direction=\"{direction}\",path=\"{path}\"}} {value}");
            }
        }
    }
}

fn write_histogram(text: &mut String, name: &str, labels: &str, histogram: &HistogramTotals) {
    for (bound, count) in LATENCY_BUCKETS_US.iter().zip(&histogram.cumulative) {
        let seconds = *bound as f64 / 1e6;
        let _ = writeln!(text, "{name}_bucket{{{labels},le=\"{seconds}\"}} {count}");
    }
    let _ = writeln!(text, "{name}_bucket{{{labels},le=\"+Inf\"}} {}", histogram.count);
    let _ = writeln!(text, "{name}_sum{{{labels}}} {}", histogram.sum_us as f64 / 1e6);
    let _ = writeln!(text, "{name}_count{{{labels}}} {}", histogram.count);
}

/// Escapes a label value (backslash, quote, newline).
fn escape(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}
