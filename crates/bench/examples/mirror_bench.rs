//! What workload mirroring costs the primary: round-trip latency of a request/reply client on
//! loopback with no mirror, with the kernel mirror, and with user-space mirroring (the "pooler"
//! writes each request to the shadow itself), side by side in one run, rounds interleaved; plus
//! the mirror programs' own run time from bpf_stats.
//!
//! ```text
//! cargo run --release -p bypass-bench --example mirror_bench -- [ROUNDS] [ROUND_TRIPS_PER_ROUND] [rps]
//! ```
//! Runs as root (from the repository root) in a fresh network namespace, lo as on the host: RPS
//! off unless `rps` is given. Writes bench/results/fastpath-mirror.{json,md}, or
//! fastpath-mirror-rps.* with `rps`. Why RPS off by default: RPS steers each flow to a CPU by
//! its hash, so a contender's latency would depend on where its flows happen to land (a
//! cross-CPU wakeup or not) more than on mirroring; one request in flight per client cannot be
//! reordered, and the "shadow intact" column shows it was not.

use std::error::Error;
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use bypass_bench::report::machine::Machine;
use bypass_bench::report::stats::percentile_sorted;
use bypass_bench::report::write_file;
use bypass_fastpath::{FastPath, MirrorHandle};

type Result<T> = std::result::Result<T, Box<dyn Error + Send + Sync>>;

/// Request/reply size, and the time the "server" spends on each request (a busy wait, like a
/// PostgreSQL backend executing a query: it shows how much of the mirror's work overlaps it).
#[derive(Clone, Copy, PartialEq, Eq)]
struct Workload {
    size: usize,
    server_us: u64,
}

const WORKLOADS: [Workload; 3] =
    [Workload { size: 64, server_us: 0 }, Workload { size: 8192, server_us: 0 }, Workload { size: 64, server_us: 50 }];
const MODES: [Mode; 4] = [Mode::Direct, Mode::Kernel, Mode::KernelCloneOnly, Mode::User];
const WARMUP_ROUND_TRIPS: usize = 2000;
/// `bpf_cmd` BPF_ENABLE_STATS and `bpf_stats_type` BPF_STATS_RUN_TIME (linux/bpf.h).
const BPF_ENABLE_STATS: libc::c_long = 32;
const BPF_STATS_RUN_TIME: u32 = 0;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Direct,
    Kernel,
    /// Diagnostic: the kernel mirror with its shadow socket closed, so every datagram is
    /// dropped at the verdict: the tc clone, the rewrite, UDP and the verdict without the send
    /// to the shadow (the kworker and the shadow's TCP). Its "shadow intact" reads false.
    KernelCloneOnly,
    User,
}

impl Mode {
    fn label(self) -> &'static str {
        match self {
            Mode::Direct => "no mirror",
            Mode::Kernel => "kernel mirror",
            Mode::KernelCloneOnly => "kernel, clone only",
            Mode::User => "user-space mirror",
        }
    }
}

/// One client connection with its pooler and shadow server threads.
struct Contender {
    mode: Mode,
    client: TcpStream,
    handle: Option<MirrorHandle>,
    /// Kept open: closing a socket takes it out of the shadow map.
    _shadow: Option<TcpStream>,
    latencies_ns: Vec<u64>,
}

fn open_contender(fast: &FastPath, mode: Mode, workload: Workload) -> Result<Contender> {
    let pooler_listener = TcpListener::bind("127.0.0.1:0")?;
    let client = TcpStream::connect(pooler_listener.local_addr()?)?;
    let (pooler, _) = pooler_listener.accept()?;
    let shadow_listener = TcpListener::bind("127.0.0.1:0")?;
    let shadow = TcpStream::connect(shadow_listener.local_addr()?)?;
    let (mut shadow_server, _) = shadow_listener.accept()?;
    for socket in [&client, &pooler, &shadow] {
        socket.set_nodelay(true)?;
    }
    std::thread::spawn(move || {
        let mut sink = vec![0u8; 1 << 16];
        while matches!(shadow_server.read(&mut sink), Ok(read) if read > 0) {}
    });
    let handle = match mode {
        Mode::Kernel | Mode::KernelCloneOnly => {
            Some(fast.add_mirror(client.local_addr()?, client.peer_addr()?, shadow.as_fd())?)
        }
        Mode::Direct | Mode::User => None,
    };
    let (user_shadow, kept_shadow) = match mode {
        Mode::User => (Some(shadow), None),
        Mode::KernelCloneOnly => (None, None), // closed: it leaves the shadow map
        Mode::Direct | Mode::Kernel => (None, Some(shadow)),
    };
    std::thread::spawn(move || serve(pooler, user_shadow, workload));
    Ok(Contender { mode, client, handle, _shadow: kept_shadow, latencies_ns: Vec::new() })
}

/// The "pooler": answers every request with a reply of the same size; in user-space mode it
/// also writes the request to the shadow, after the reply (the order that costs the primary
/// least).
fn serve(mut pooler: TcpStream, mut shadow: Option<TcpStream>, workload: Workload) {
    let mut request = vec![0u8; workload.size];
    let reply = vec![b'r'; workload.size];
    let server_time = Duration::from_micros(workload.server_us);
    while pooler.read_exact(&mut request).is_ok() {
        let start = Instant::now();
        while start.elapsed() < server_time {
            std::hint::spin_loop();
        }
        if pooler.write_all(&reply).is_err() {
            return;
        }
        if let Some(shadow) = shadow.as_mut() {
            if shadow.write_all(&request).is_err() {
                return;
            }
        }
    }
}

fn round_trips(contender: &mut Contender, count: usize, size: usize, record: bool) -> Result<()> {
    let request = vec![b'q'; size];
    let mut reply = vec![0u8; size];
    for _ in 0..count {
        let start = Instant::now();
        contender.client.write_all(&request)?;
        contender.client.read_exact(&mut reply)?;
        if record {
            contender.latencies_ns.push(start.elapsed().as_nanos() as u64);
        }
    }
    Ok(())
}

struct Summary {
    mean_us: f64,
    p50_us: f64,
    p99_us: f64,
    p999_us: f64,
}

fn summarize(latencies_ns: &mut [u64]) -> Summary {
    latencies_ns.sort_unstable();
    let at = |percent: f64| percentile_sorted(latencies_ns, percent).map_or(f64::NAN, |ns| ns as f64 / 1000.0);
    let mean = latencies_ns.iter().sum::<u64>() as f64 / latencies_ns.len() as f64 / 1000.0;
    Summary { mean_us: mean, p50_us: at(50.0), p99_us: at(99.0), p999_us: at(99.9) }
}

fn main() -> Result<()> {
    let mut arguments = std::env::args().skip(1);
    let rounds: usize = arguments.next().map_or(Ok(10), |text| text.parse())?;
    let per_round: usize = arguments.next().map_or(Ok(5000), |text| text.parse())?;
    let rps = arguments.next().as_deref() == Some("rps");
    let suffix = if rps { " rps" } else { "" };
    let command = format!("cargo run --release -p bypass-bench --example mirror_bench -- {rounds} {per_round}{suffix}");
    std::thread::spawn(move || run(rounds, per_round, rps, command)).join().map_err(|_| "benchmark thread panicked")?
}

fn run(rounds: usize, per_round: usize, rps: bool, command: String) -> Result<()> {
    enter_network_namespace(rps)?;
    // Run-time statistics while this descriptor is open: the kernel counts holders, so another
    // engineer's setting of kernel.bpf_stats_enabled is never clobbered, and a killed run
    // cannot leave statistics on.
    let _stats = enable_bpf_stats()?;
    let mut machine = Machine::now();
    let (rows, programs, counters) = measure(rounds, per_round)?;
    machine.finish();
    write_results(&command, &machine, rounds, per_round, &rows, &programs, &counters)
}

type Row = (Workload, Mode, Summary, bool);

fn measure(rounds: usize, per_round: usize) -> Result<(Vec<Row>, String, String)> {
    let fast = FastPath::load()?;
    fast.enable_mirroring("lo")?;
    let mut rows = Vec::new();
    for workload in WORKLOADS {
        let mut contenders =
            MODES.iter().map(|&mode| open_contender(&fast, mode, workload)).collect::<Result<Vec<_>>>()?;
        for contender in &mut contenders {
            round_trips(contender, WARMUP_ROUND_TRIPS, workload.size, false)?;
        }
        for _ in 0..rounds {
            for contender in &mut contenders {
                round_trips(contender, per_round, workload.size, true)?;
            }
        }
        for mut contender in contenders {
            let intact = contender.handle.as_ref().is_none_or(|handle| fast.mirror_intact(handle));
            rows.push((workload, contender.mode, summarize(&mut contender.latencies_ns), intact));
            if let Some(handle) = contender.handle.take() {
                fast.remove_mirror(handle);
            }
        }
    }
    let mut programs = String::new();
    for program in fast.mirror_program_stats() {
        let per_run = program.run_time_ns as f64 / program.run_count.max(1) as f64;
        writeln!(programs, "| {} | {} | {:.0} |", program.name, program.run_count, per_run)?;
    }
    Ok((rows, programs, format!("{:?}", fast.mirror_counters())))
}

fn write_results(
    command: &str,
    machine: &Machine,
    rounds: usize,
    per_round: usize,
    rows: &[Row],
    programs: &str,
    counters: &str,
) -> Result<()> {
    let mut markdown = format!(
        "# Workload mirroring: latency cost on loopback\n\n`{command}` — {}, shared with other \
         engineers' builds; load average {} before, {} after.\n\nA client sends a request and waits \
         for a same-size reply from a \"pooler\" thread; {rounds} rounds × {per_round} round trips per contender, \
         contenders interleaved, in a network namespace ({}). User-space mirroring: the \
         pooler writes each request to the shadow after its reply. Latencies in µs.\n\n\
         | size | server time | contender | mean | p50 | p99 | p99.9 | mean ÷ no mirror | shadow intact |\n|---:|---:|---|---:|---:|---:|---:|---:|---|\n",
        machine.headline(),
        machine.load_average_before,
        machine.load_average_after,
        if command.ends_with("rps") { "lo with RPS on every CPU" } else { "lo as on the host, RPS off" }
    );
    let mut json_rows = Vec::new();
    for (workload, mode, summary, intact) in rows {
        let (size, server_us) = (workload.size, workload.server_us);
        let base =
            rows.iter().find(|(w, m, _, _)| w == workload && *m == Mode::Direct).map_or(1.0, |row| row.2.mean_us);
        let ratio = summary.mean_us / base;
        writeln!(
            markdown,
            "| {size} B | {server_us} µs | {} | {:.1} | {:.1} | {:.1} | {:.1} | {ratio:.3}× | {intact} |",
            mode.label(),
            summary.mean_us,
            summary.p50_us,
            summary.p99_us,
            summary.p999_us
        )?;
        json_rows.push(format!(
            "{{\"size_bytes\":{size},\"server_us\":{server_us},\"contender\":\"{}\",\"mean_us\":{:.2},\"p50_us\":{:.2},\"p99_us\":{:.2},\
             \"p999_us\":{:.2},\"mean_ratio_to_no_mirror\":{ratio:.4},\"shadow_intact\":{intact}}}",
            mode.label(),
            summary.mean_us,
            summary.p50_us,
            summary.p99_us,
            summary.p999_us
        ));
    }
    write!(
        markdown,
        "\nMirror programs (bpf_stats over the whole run; the tc program runs on every lo packet of the \
         namespace, mirrored or not, clones included):\n\n| program | runs | ns per run |\n|---|---:|---:|\n\
         {programs}\nCounters: `{counters}`\n"
    )?;
    let json = format!(
        "{{\"command\":\"{command}\",\"machine\":{},\"rounds\":{rounds},\"round_trips_per_round\":\
         {per_round},\"rows\":[{}]}}\n",
        serde_json::to_string(machine)?,
        json_rows.join(",")
    );
    let stem =
        if command.ends_with("rps") { "bench/results/fastpath-mirror-rps" } else { "bench/results/fastpath-mirror" };
    std::fs::create_dir_all("bench/results")?;
    write_file(format!("{stem}.md").as_ref(), &markdown)?;
    write_file(format!("{stem}.json").as_ref(), &json)?;
    print!("{markdown}");
    Ok(())
}

fn enable_bpf_stats() -> Result<std::os::fd::OwnedFd> {
    let attr: [u32; 1] = [BPF_STATS_RUN_TIME];
    // SAFETY: bpf(2) reads size_of_val(&attr) bytes of `attr` (union bpf_attr's enable_stats).
    let fd = unsafe { libc::syscall(libc::SYS_bpf, BPF_ENABLE_STATS, attr.as_ptr(), std::mem::size_of_val(&attr)) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    let fd = i32::try_from(fd)?;
    // SAFETY: the kernel just returned this descriptor to us; nothing else owns it.
    Ok(unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) })
}

/// Moves this thread into a new network namespace with lo up, and RPS on every CPU if asked
/// (see the tests' `in_network_namespace` for what RPS is for).
fn enter_network_namespace(rps: bool) -> Result<()> {
    // SAFETY: unshare takes no pointers; CLONE_NEWNET moves only this thread.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    let cpus = std::thread::available_parallelism().map_or(1, |count| count.get()).min(32);
    let mask = if rps { (1u64 << cpus) - 1 } else { 0 };
    let script = format!(
        "ip link set lo up && mount -t sysfs sysfs /sys && echo {mask:x} > /sys/class/net/lo/queues/rx-0/rps_cpus"
    );
    let status = std::process::Command::new("unshare").args(["--mount", "sh", "-c", &script]).status()?;
    if !status.success() {
        return Err("setting up the namespace's lo failed".into());
    }
    std::thread::sleep(Duration::from_millis(10));
    Ok(())
}
