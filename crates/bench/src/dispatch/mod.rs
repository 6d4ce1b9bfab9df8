//! `bypass bench dispatch`: one run in the lab, every contender side by side on the same shaped
//! links — direct to the backends, HAProxy (TCP mode), Bypass relay-only, hand-over-always and
//! hybrid — over the payload sweep, plus 1-byte latency (the seed's Tables 1 and 2).
//!
//! ```text
//!  lab up ─► PostgreSQL + agent on be1, be2 ─► rounds × (for each contender: start it, for
//!     each size: 2 clients × 1 persistent connection, warm-up, measure, every byte verified)
//!  ─► median round per point ─► bench/results/dispatch.{json,md,png}
//! ```

mod plot;
mod report;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde::Serialize;

use crate::report::stats::median_run;
use bypass_dispatch::config::{AgentConfig, BackendEntry, DatabaseEntry, DispatcherConfig, DispatcherSettings, Policy};
use bypass_dispatch::error::{DispatchError, Result};
use bypass_dispatch::pglogin::LoginRequest;
use bypass_dispatch::runtime::Running;
use bypass_dispatch::{agent, dispatcher, netns};
use bypass_lab::lab::{self, Lab, LabSpec, AGENT_PORT, POSTGRES_PORT, SERVICE_PORT, VIP};
use bypass_lab::loadgen::{self, LoadReport, LoadSpec, Target};
use bypass_lab::services::LabPostgres;

pub use report::BenchResults;

/// Where HAProxy listens (the dispatcher has the service port).
pub const HAPROXY_PORT: u16 = 5433;
/// The issue's payload sweep.
pub const DEFAULT_SIZES: [u64; 8] = [1, 64, 4 << 10, 32 << 10, 256 << 10, 1 << 20, 16 << 20, 128 << 20];

/// The systems compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Contender {
    /// Each client straight to its own backend's PostgreSQL (upper bound).
    Direct,
    /// HAProxy in TCP mode on the dispatcher host, least connections.
    Haproxy,
    /// Bypass, every byte relayed (straight from the servers).
    Relay,
    /// Bypass, every byte relayed through the backends' agents (the path before the agent left
    /// the relay path; not in the default set).
    RelayViaAgent,
    /// Bypass, every answer handed over.
    Handover,
    /// Bypass, relay by default, hand-over for large answers.
    Hybrid,
}

impl Contender {
    pub const ALL: [Contender; 5] =
        [Contender::Direct, Contender::Haproxy, Contender::Relay, Contender::Handover, Contender::Hybrid];

    pub fn name(self) -> &'static str {
        match self {
            Contender::Direct => "direct",
            Contender::Haproxy => "HAProxy",
            Contender::Relay => "Bypass relay",
            Contender::RelayViaAgent => "Bypass relay via agent",
            Contender::Handover => "Bypass hand-over",
            Contender::Hybrid => "Bypass hybrid",
        }
    }
}

/// What to measure.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    pub lab_name: String,
    pub link_rate_mbit: u32,
    pub sizes: Vec<u64>,
    pub contenders: Vec<Contender>,
    pub warmup: Duration,
    pub duration: Duration,
    pub latency_duration: Duration,
    /// The hybrid policy's `handover_min_bytes`; `None`: from the crossover measured in the run.
    pub threshold: Option<u64>,
    pub out_dir: PathBuf,
    /// The command line, recorded with the results.
    pub command: String,
    /// Write the result files (a validation run only prints).
    pub write: bool,
    /// Passes over all contenders; each point reports the median pass.
    pub rounds: u32,
    pub tuning: Tuning,
}

/// Settings of the contenders that the run may change.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Tuning {
    /// The Bypass dispatchers' `busy_poll_us`; `None`: the configuration default.
    pub busy_poll_us: Option<u64>,
    /// The Bypass dispatchers' `workers`; `None`: the configuration default.
    pub dispatcher_workers: Option<usize>,
    /// HAProxy's `nbthread`.
    pub haproxy_threads: usize,
}

/// One measured point.
#[derive(Debug, Clone, Serialize)]
pub struct Point {
    pub contender: Contender,
    pub report: LoadReport,
}

/// Every measured run of a benchmark, before the medians are taken.
#[derive(Default)]
struct Runs {
    throughput: Vec<Point>,
    latency: Vec<Point>,
    resets: Vec<(Contender, u64)>,
    handovers: Vec<(Contender, u64, u64)>,
}

/// Runs the whole benchmark: `rounds` passes over the contenders (the order rotates after the
/// first, so slow drift in the machine falls on every contender alike), medians reported.
pub fn run(options: &BenchOptions) -> Result<BenchResults> {
    let load_before = crate::report::machine::load_average();
    let idle = IdlePolling::hold();
    let lab = Lab::up_owned(LabSpec {
        name: options.lab_name.clone(),
        link_rate_mbit: options.link_rate_mbit,
        ..LabSpec::default()
    })?;
    let mut backends = Vec::new();
    let mut agents = Vec::new();
    for backend in lab.backends() {
        backends.push(LabPostgres::start(&backend.namespace, backend.address, None)?);
        let config = AgentConfig {
            listen_addr: format!("0.0.0.0:{AGENT_PORT}"),
            key: Some(agent_key().to_string()),
            ..AgentConfig::default()
        }
        .validate()?;
        agents.push(agent::start(config, Some(backend.namespace.clone()))?);
    }
    let mut runs = Runs::default();
    let mut threshold = options.threshold.unwrap_or(DispatcherSettings::default().handover_min_bytes);
    for round in 0..options.rounds.max(1) {
        for contender in round_order(&options.contenders, round) {
            if round == 0 && contender == Contender::Hybrid && options.threshold.is_none() {
                if let Some(measured) = threshold_from_sweep(&runs.throughput) {
                    threshold = measured;
                }
                eprintln!("hybrid threshold: {threshold} bytes");
            }
            run_contender(&lab, contender, threshold, options, &mut runs)?;
        }
    }
    drop(agents);
    drop(backends);
    let throughput = medians(&runs.throughput, |r| r.throughput_gbit_s);
    let latency = medians(&runs.latency, |r| r.latency_mean_us);
    let mut results = BenchResults::new(options, throughput, latency, runs.resets, load_before);
    results.throughput_runs = runs.throughput;
    results.handovers = runs.handovers;
    results.hybrid_threshold_bytes = threshold;
    results.cpu_idle = idle.describe();
    Ok(results)
}

/// The contenders in the order of `round`: as given first (relay and hand-over before hybrid, so
/// the hybrid threshold can come from their crossover), then rotated by one per round.
fn round_order(contenders: &[Contender], round: u32) -> Vec<Contender> {
    let mut order = contenders.to_vec();
    if !order.is_empty() {
        let by = round as usize % order.len();
        order.rotate_left(by);
    }
    order
}

/// Starts one contender, measures every size and the 1-byte latency, and adds up its resets
/// and hand-overs.
fn run_contender(
    lab: &Lab,
    contender: Contender,
    threshold: u64,
    options: &BenchOptions,
    runs: &mut Runs,
) -> Result<()> {
    let service = Service::start(lab, contender, threshold, &options.tuning)?;
    let before = lab_resets(lab)?;
    for &size in &options.sizes {
        let report = loadgen::run(&spec(lab, &service, size, options, false))?;
        eprintln!(
            "{:<18} {:>10} B  {:>8.3} Gbit/s  p50 {:>7} µs  errors {}",
            contender.name(),
            size,
            report.throughput_gbit_s,
            report.latency_p50_us,
            report.errors
        );
        runs.throughput.push(Point { contender, report });
    }
    let report = loadgen::run(&spec(lab, &service, 1, options, true))?;
    eprintln!(
        "{:<18} 1 B latency: mean {:.0} µs, p99 {} µs",
        contender.name(),
        report.latency_mean_us,
        report.latency_p99_us
    );
    runs.latency.push(Point { contender, report });
    add_to(&mut runs.resets, contender, lab_resets(lab)? - before);
    if let (Some(moves), Service::Bypass(running)) = (service.handovers(), &service) {
        let stats = &running.ready.shared.stats;
        let read = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
        eprintln!(
            "{:<18} hand-overs {} (on demand {}), import failures {}, settle waits {} (gave up {})",
            contender.name(),
            moves.0,
            moves.1,
            read(&stats.import_failures),
            read(&stats.settle_waits),
            read(&stats.settle_timeouts)
        );
        match runs.handovers.iter_mut().find(|(c, _, _)| *c == contender) {
            Some(entry) => {
                entry.1 += moves.0;
                entry.2 += moves.1;
            }
            None => runs.handovers.push((contender, moves.0, moves.1)),
        }
    }
    Ok(())
}

fn add_to(totals: &mut Vec<(Contender, u64)>, contender: Contender, count: u64) {
    match totals.iter_mut().find(|(c, _)| *c == contender) {
        Some(entry) => entry.1 += count,
        None => totals.push((contender, count)),
    }
}

/// Per (contender, size), the median run by `key` ([`median_run`]: the lower middle for an even
/// count), in first-seen order. Errors of every run are added to it, so none hides.
fn medians(points: &[Point], key: impl Fn(&LoadReport) -> f64) -> Vec<Point> {
    let mut out: Vec<Point> = Vec::new();
    for point in points {
        if out.iter().any(|p| p.contender == point.contender && p.report.size == point.report.size) {
            continue;
        }
        let same: Vec<&Point> =
            points.iter().filter(|p| p.contender == point.contender && p.report.size == point.report.size).collect();
        let middle = median_run(&same, |p| key(&p.report)).unwrap_or(0);
        let mut median = same[middle].clone();
        median.report.errors = same.iter().map(|p| p.report.errors).sum();
        out.push(median);
    }
    out
}

/// Holds `/dev/cpu_dma_latency` at 0 while the benchmark runs: idle vCPUs poll instead of
/// halting. On this VM a halted vCPU takes a VM exit and a host wake-up per wake (single-connection
/// latency 126 µs direct instead of 29 µs, varying run to run), which would swamp the small-answer
/// figures; the setting applies to every contender alike (cyclictest does the same).
struct IdlePolling(std::result::Result<std::fs::File, String>);

impl IdlePolling {
    fn hold() -> Self {
        use std::io::Write as _;
        let held = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/cpu_dma_latency")
            .and_then(|mut file| file.write_all(&0i32.to_ne_bytes()).map(|_| file))
            .map_err(|error| error.to_string());
        if let Err(error) = &held {
            eprintln!("cannot hold /dev/cpu_dma_latency at 0 ({error}): small-answer figures will be noisier");
        }
        IdlePolling(held)
    }

    fn describe(&self) -> String {
        match &self.0 {
            Ok(_) => "idle vCPUs polling (/dev/cpu_dma_latency held at 0)".into(),
            Err(error) => format!("idle vCPUs may halt (/dev/cpu_dma_latency not held: {error})"),
        }
    }
}

/// The hybrid threshold the sweep so far suggests: between the last size where relay-only beat
/// hand-over-always and the first size from which hand-over-always wins at every larger size
/// (geometric mean, so answers of either size land on their winning side). `None` without
/// both contenders' points or without a crossover.
pub fn threshold_from_sweep(points: &[Point]) -> Option<u64> {
    let gbit = |contender: Contender, size: u64| {
        points.iter().find(|p| p.contender == contender && p.report.size == size).map(|p| p.report.throughput_gbit_s)
    };
    let mut sizes: Vec<u64> = points.iter().map(|p| p.report.size).collect();
    sizes.sort_unstable();
    sizes.dedup();
    let relay_wins: Vec<(u64, bool)> = sizes
        .iter()
        .filter_map(|&size| Some((size, gbit(Contender::Relay, size)? > gbit(Contender::Handover, size)?)))
        .collect();
    let last_relay_win = relay_wins.iter().rposition(|&(_, relay_wins)| relay_wins)?;
    let (crossover, _) = *relay_wins.get(last_relay_win + 1)?;
    let below = relay_wins[last_relay_win].0;
    Some(((below as f64) * (crossover as f64)).sqrt().round() as u64)
}

fn spec(lab: &Lab, service: &Service, size: u64, options: &BenchOptions, latency: bool) -> LoadSpec {
    let clients = if latency { vec![lab.client(1)] } else { lab.clients() };
    let targets = clients
        .iter()
        .enumerate()
        .map(|(i, client)| Target {
            namespace: Some(client.namespace.clone()),
            address: service.address(lab, i),
            connections: 1,
        })
        .collect();
    LoadSpec {
        targets,
        size,
        warmup: options.warmup,
        duration: if latency { options.latency_duration } else { options.duration },
        queries_min: 2,
        queries_max: u64::MAX,
        login: LoginRequest::trust("postgres", "postgres"),
        read_timeout: Duration::from_secs(60),
    }
}

/// TCP resets sent in all hosts of the lab so far.
fn lab_resets(lab: &Lab) -> Result<u64> {
    let mut total = 0;
    for host in lab.hosts() {
        total += lab::tcp_counters(&host.namespace)?.get("OutRsts").copied().unwrap_or(0);
    }
    Ok(total)
}

/// A running contender.
enum Service {
    Direct,
    Haproxy(Child),
    Bypass(Running<dispatcher::DispatcherInfo>),
}

impl Service {
    fn start(lab: &Lab, contender: Contender, threshold: u64, tuning: &Tuning) -> Result<Service> {
        let bypass = |policy, relays| start_bypass(lab, policy, threshold, relays, tuning);
        match contender {
            Contender::Direct => Ok(Service::Direct),
            Contender::Haproxy => start_haproxy(lab, tuning.haproxy_threads),
            Contender::Relay => bypass(Policy::Relay, Relays::StraightFromServer),
            Contender::RelayViaAgent => bypass(Policy::Relay, Relays::ThroughAgent),
            Contender::Handover => bypass(Policy::Handover, Relays::StraightFromServer),
            Contender::Hybrid => bypass(Policy::Hybrid, Relays::StraightFromServer),
        }
    }

    /// (hand-overs, of which on demand) so far, for Bypass contenders.
    fn handovers(&self) -> Option<(u64, u64)> {
        let Service::Bypass(running) = self else { return None };
        let stats = &running.ready.shared.stats;
        let read = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
        Some((read(&stats.handovers), read(&stats.on_demand)))
    }

    /// Where client number `index` (0-based) connects.
    fn address(&self, lab: &Lab, index: usize) -> SocketAddr {
        match self {
            // Client i talks to backend i: the two direct paths run side by side.
            Service::Direct => {
                let backends = lab.backends();
                SocketAddr::from((backends[index % backends.len()].address, POSTGRES_PORT))
            }
            Service::Haproxy(_) => SocketAddr::from((VIP, HAPROXY_PORT)),
            Service::Bypass(_) => SocketAddr::from((VIP, SERVICE_PORT)),
        }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        if let Service::Haproxy(child) = self {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Where a Bypass contender's relayed answers come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Relays {
    StraightFromServer,
    ThroughAgent,
}

/// The key this run's dispatcher proves to its agents (random per process).
fn agent_key() -> &'static str {
    static KEY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    KEY.get_or_init(bypass_dispatch::agent::key::LinkKey::random_text)
}

fn start_bypass(lab: &Lab, policy: Policy, threshold: u64, relays: Relays, tuning: &Tuning) -> Result<Service> {
    let mut config = DispatcherConfig::default();
    let settings = &mut config.dispatcher;
    settings.busy_poll_us = tuning.busy_poll_us.unwrap_or(settings.busy_poll_us);
    settings.workers = tuning.dispatcher_workers.unwrap_or(settings.workers);
    settings.agent_key = Some(agent_key().to_string());
    // Logins are not what this benchmark measures (every connection is persistent), and the
    // baselines (HAProxy, direct) authenticate nobody: trust, as the pooler benchmark does.
    settings.auth_type = bypass_dispatch::config::AuthType::Trust;
    settings.listen_addr = format!("{VIP}:{SERVICE_PORT}");
    settings.source_addr = Some(lab.dispatcher().address);
    settings.policy = policy;
    settings.handover_min_bytes = threshold;
    settings.steer_namespace = Some(lab.switch_namespace());
    settings.steer_ports = lab.clients().iter().map(|c| c.switch_port.clone()).collect();
    for backend in lab.backends() {
        let agent = format!("{}:{AGENT_PORT}", backend.address);
        let postgres = (relays == Relays::StraightFromServer).then(|| format!("{}:{POSTGRES_PORT}", backend.address));
        let mac = Some(lab::format_mac(backend.mac));
        config.backends.insert(backend.short.clone(), BackendEntry { agent, postgres, mac });
    }
    let replicas = lab.backends().iter().map(|b| b.short.clone()).collect();
    config.databases.insert("*".into(), DatabaseEntry { primary: "be1".into(), replicas });
    Ok(Service::Bypass(dispatcher::start(config.validate()?, Some(lab.dispatcher().namespace))?))
}

fn start_haproxy(lab: &Lab, threads: usize) -> Result<Service> {
    let dir = lab.spec.state_dir();
    std::fs::create_dir_all(&dir).map_err(|e| DispatchError::io(format!("creating {}", dir.display()), e))?;
    let path = dir.join("haproxy.cfg");
    let servers: String =
        lab.backends().iter().map(|b| format!("  server {} {}:{POSTGRES_PORT}\n", b.short, b.address)).collect();
    let config = format!(
        "global\n  nbthread {threads}\n  maxconn 1000\ndefaults\n  mode tcp\n  timeout connect 5s\n  timeout client 1h\n  \
         timeout server 1h\n  option tcpka\nfrontend pg\n  bind {VIP}:{HAPROXY_PORT}\n  default_backend pgs\n\
         backend pgs\n  balance leastconn\n{servers}"
    );
    std::fs::write(&path, config).map_err(|e| DispatchError::io(format!("writing {}", path.display()), e))?;
    let child = netns::command_in(&lab.dispatcher().namespace, "haproxy")
        .arg("-db")
        .arg("-f")
        .arg(&path)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| DispatchError::io("starting haproxy", e))?;
    let service = Service::Haproxy(child);
    let address = SocketAddr::from((VIP, HAPROXY_PORT));
    let namespace = lab.client(1).namespace;
    let started = std::time::Instant::now();
    while !netns::run_in(&namespace, move || Ok(std::net::TcpStream::connect(address).is_ok()))? {
        if started.elapsed() > Duration::from_secs(10) {
            return Err(DispatchError::Timeout { what: "haproxy to listen".into(), waited_ms: 10_000 });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(service)
}

/// `haproxy -v` for the report.
pub fn haproxy_version() -> String {
    Command::new("haproxy")
        .arg("-v")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|text| text.lines().next().map(str::to_string))
        .unwrap_or_else(|| "haproxy not found".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(contender: Contender, size: u64, throughput_gbit_s: f64) -> Point {
        Point { contender, report: LoadReport { size, throughput_gbit_s, ..LoadReport::default() } }
    }

    // Goal: the hybrid threshold lands between the last relay win and the crossover, ignoring
    // a hand-over win that relay-only overturns at a larger size; method: made-up sweeps.
    #[test]
    fn threshold_sits_between_the_last_relay_win_and_the_crossover() {
        let sweep = |pairs: &[(u64, f64, f64)]| -> Vec<Point> {
            pairs
                .iter()
                .flat_map(|&(size, relay, handover)| {
                    [point(Contender::Relay, size, relay), point(Contender::Handover, size, handover)]
                })
                .collect()
        };
        let clean = sweep(&[(4096, 0.3, 0.1), (262_144, 0.9, 0.7), (1 << 20, 0.9, 1.5), (16 << 20, 0.9, 1.8)]);
        assert_eq!(threshold_from_sweep(&clean), Some(524_288));
        let noisy = sweep(&[(4096, 0.3, 0.4), (32_768, 0.8, 0.5), (1 << 20, 0.9, 1.5)]);
        assert_eq!(threshold_from_sweep(&noisy), Some(185_364), "a lone early hand-over win is noise");
        let never = sweep(&[(4096, 0.3, 0.1), (1 << 20, 0.9, 0.8)]);
        assert_eq!(threshold_from_sweep(&never), None);
        let always = sweep(&[(4096, 0.3, 0.4), (1 << 20, 0.9, 1.8)]);
        assert_eq!(threshold_from_sweep(&always), None, "no relay win: no crossover to place it at");
    }

    // Goal: each point reports its median round, with every round's errors, and rounds after
    // the first rotate the contender order; method: made-up rounds.
    #[test]
    fn medians_pick_the_middle_round_and_keep_every_error() {
        let mut runs = vec![point(Contender::Relay, 64, 0.5), point(Contender::Relay, 64, 0.1)];
        runs.push(point(Contender::Relay, 64, 0.3));
        runs[1].report.errors = 2;
        runs.push(point(Contender::Hybrid, 64, 0.2));
        let medians = medians(&runs, |r| r.throughput_gbit_s);
        assert_eq!(medians.len(), 2);
        assert_eq!((medians[0].contender, medians[0].report.throughput_gbit_s), (Contender::Relay, 0.3));
        assert_eq!(medians[0].report.errors, 2, "an error in a discarded round still shows");
        assert_eq!(medians[1].report.throughput_gbit_s, 0.2);
        let all = Contender::ALL;
        assert_eq!(round_order(&all, 0), all.to_vec());
        assert_eq!(round_order(&all, 1)[0], Contender::Haproxy);
        assert_eq!(round_order(&all, 5), all.to_vec());
    }
}
