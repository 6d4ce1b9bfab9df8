//! The lab: one machine turned into a small data centre with network namespaces.
//!
//! ```text
//!   cli1 10.0.0.11 ─┐                        ┌─ be1 10.0.0.3  (+ VIP on lo)  PostgreSQL, agent
//!   cli2 10.0.0.12 ─┤  br0 in namespace sw   ├─ be2 10.0.0.4  (+ VIP on lo)  PostgreSQL, agent
//!                   └─ (the top-of-rack      ┴─ disp 10.0.0.2 (+ VIP 10.0.0.100 on eth0) dispatcher
//!                       switch; tc ingress on the client ports steers handed-over flows)
//! ```
//! Every server link (disp, be1, be2) is shaped with `tc tbf` in both directions, so the
//! dispatcher's single link is the bottleneck as in the paper; client links are unshaped.
//! Backends own the VIP on `lo` with `arp_ignore=1`/`arp_announce=2` (the LVS direct-routing
//! recipe): only the dispatcher answers ARP for it, yet a backend accepts a steered packet for it.
//!
//! Invariants:
//! - All namespaces of a lab share the prefix `<name>-`; `down` deletes every one of them, so a
//!   crashed run never blocks the next `up`.
//! - `up` is idempotent: a complete lab (marker file present, namespaces there) is reused; a
//!   partial one is torn down and rebuilt; a failing `up` tears down what it built.

use std::net::Ipv4Addr;
use std::path::PathBuf;

use bypass_dispatch::error::{DispatchError, Result};
use bypass_dispatch::netns;

/// A lab name no other lab of this process, or of a concurrent process, uses: tag + pid +
/// counter, at most 12 characters (namespace and interface names derive from it).
pub fn unique_name(tag: &str) -> String {
    static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = format!("{tag}{}{n}", std::process::id() % 100_000);
    assert!(name.len() <= 12, "lab name {name} too long");
    name
}

/// The address clients connect to: the dispatcher answers ARP for it, backends own it on `lo`.
pub const VIP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 100);
/// The lab subnet's prefix length.
pub const PREFIX_LEN: u8 = 24;
/// Where the dispatcher (and any contender in its place) listens on the VIP.
pub const SERVICE_PORT: u16 = 5432;
/// Where PostgreSQL listens on each backend.
pub const POSTGRES_PORT: u16 = 5432;
/// Where `bypass agent` listens on each backend.
pub const AGENT_PORT: u16 = 7432;
/// Most clients or backends a lab may have (addresses and MACs are derived from the index).
pub const HOSTS_PER_ROLE_MAX: u8 = 8;
/// Where lab state lives; `/run` is a tmpfs, so state disappears with the namespaces on reboot.
pub const STATE_ROOT: &str = "/run/bypass-lab";
/// The bridge inside the switch namespace.
pub const BRIDGE: &str = "br0";
/// The host side of every link.
pub const HOST_INTERFACE: &str = "eth0";

/// What a host does in the lab.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Dispatcher,
    /// Backend number `n` (1-based).
    Backend(u8),
    /// Client number `n` (1-based).
    Client(u8),
}

/// One namespace attached to the switch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    pub role: Role,
    /// Short name: `disp`, `be1`, `cli2`, …
    pub short: String,
    pub namespace: String,
    pub address: Ipv4Addr,
    /// Fixed MAC of the host's `eth0`, so steering entries and the bridge table are known ahead.
    pub mac: [u8; 6],
    /// The switch port (veth end in the switch namespace) facing this host.
    pub switch_port: String,
    /// Whether the link is shaped (server links) or not (client links).
    pub shaped: bool,
}

/// What to build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabSpec {
    /// Prefix of every namespace; short, `[a-z0-9]` only.
    pub name: String,
    /// Rate of every shaped server link in Mbit/s (stands in for 10 GbE; ratios matter).
    pub link_rate_mbit: u32,
    pub clients: u8,
    pub backends: u8,
}

impl Default for LabSpec {
    fn default() -> Self {
        LabSpec { name: "bypass".to_string(), link_rate_mbit: 1000, clients: 2, backends: 2 }
    }
}

impl LabSpec {
    /// Checks the name and sizes; lists every problem.
    pub fn validate(&self) -> Result<()> {
        let mut problems = Vec::new();
        if self.name.is_empty() || self.name.len() > 12 {
            problems.push(format!("lab name {:?} must have 1 to 12 characters", self.name));
        }
        if !self.name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()) {
            problems.push(format!("lab name {:?} may only hold a-z and 0-9", self.name));
        }
        for (what, count) in [("clients", self.clients), ("backends", self.backends)] {
            if count == 0 || count > HOSTS_PER_ROLE_MAX {
                problems.push(format!("{what} must be 1 to {HOSTS_PER_ROLE_MAX}, not {count}"));
            }
        }
        if !(1..=100_000).contains(&self.link_rate_mbit) {
            problems.push(format!("link_rate_mbit {} must be 1 to 100000", self.link_rate_mbit));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(DispatchError::Config(problems))
        }
    }

    /// The switch namespace.
    pub fn switch_namespace(&self) -> String {
        format!("{}-sw", self.name)
    }

    /// Every host, dispatcher first, then backends, then clients.
    pub fn hosts(&self) -> Vec<Host> {
        let mut hosts = vec![self.host(Role::Dispatcher)];
        hosts.extend((1..=self.backends).map(|n| self.host(Role::Backend(n))));
        hosts.extend((1..=self.clients).map(|n| self.host(Role::Client(n))));
        hosts
    }

    fn host(&self, role: Role) -> Host {
        let (short, last_octet, shaped) = match role {
            Role::Dispatcher => ("disp".to_string(), 2, true),
            Role::Backend(n) => (format!("be{n}"), 2 + n, true),
            Role::Client(n) => (format!("cli{n}"), 10 + n, false),
        };
        Host {
            role,
            namespace: format!("{}-{short}", self.name),
            address: Ipv4Addr::new(10, 0, 0, last_octet),
            mac: [0x02, 0x00, 10, 0, 0, last_octet],
            switch_port: format!("v-{short}"),
            short,
            shaped,
        }
    }

    /// The directory holding this lab's state (marker, logs, data directories of services).
    pub fn state_dir(&self) -> PathBuf {
        PathBuf::from(STATE_ROOT).join(&self.name)
    }

    /// Bytes a tbf bucket holds: more than one GSO packet (64 KiB) and than a 4 ms timer tick
    /// at the link rate (HZ=250), else tbf caps the rate below what it was asked.
    pub fn tbf_burst_bytes(&self) -> u64 {
        let per_tick = u64::from(self.link_rate_mbit) * 1_000_000 / 8 / 250;
        per_tick.max(256 * 1024)
    }

    /// Every command that builds the network, in order. Pure, so the plan is unit-tested.
    pub fn plan(&self) -> Vec<Vec<String>> {
        let sw = self.switch_namespace();
        let mut plan = Vec::new();
        let mut push = |parts: &[&str]| plan.push(parts.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        push(&["ip", "netns", "add", &sw]);
        push(&["ip", "-n", &sw, "link", "add", BRIDGE, "type", "bridge"]);
        push(&["ip", "-n", &sw, "link", "set", BRIDGE, "up"]);
        push(&["ip", "-n", &sw, "link", "set", "lo", "up"]);
        let rate = format!("{}mbit", self.link_rate_mbit);
        let burst = self.tbf_burst_bytes().to_string();
        for host in self.hosts() {
            let ns = host.namespace.as_str();
            let port = host.switch_port.as_str();
            let mac = format_mac(host.mac);
            let address = format!("{}/{PREFIX_LEN}", host.address);
            push(&["ip", "netns", "add", ns]);
            push(&["ip", "-n", &sw, "link", "add", port, "type", "veth", "peer", "name", HOST_INTERFACE, "netns", ns]);
            push(&["ip", "-n", ns, "link", "set", HOST_INTERFACE, "address", &mac]);
            push(&["ip", "-n", ns, "addr", "add", &address, "dev", HOST_INTERFACE]);
            push(&["ip", "-n", ns, "link", "set", "lo", "up"]);
            push(&["ip", "-n", ns, "link", "set", HOST_INTERFACE, "up"]);
            push(&["ip", "-n", &sw, "link", "set", port, "master", BRIDGE, "up"]);
            push(&["bridge", "-n", &sw, "fdb", "replace", &mac, "dev", port, "master", "static"]);
            let vip = format!("{VIP}/32");
            match host.role {
                Role::Dispatcher => push(&["ip", "-n", ns, "addr", "add", &vip, "dev", HOST_INTERFACE]),
                Role::Backend(_) => {
                    push(&["ip", "netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv4.conf.all.arp_ignore=1"]);
                    push(&["ip", "netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv4.conf.all.arp_announce=2"]);
                    push(&["ip", "-n", ns, "addr", "add", &vip, "dev", "lo"]);
                }
                Role::Client(_) => {}
            }
            if host.shaped {
                for (namespace, device) in [(ns, HOST_INTERFACE), (sw.as_str(), port)] {
                    push(&[
                        "tc", "-n", namespace, "qdisc", "replace", "dev", device, "root", "tbf", "rate", &rate,
                        "burst", &burst, "latency", "5ms",
                    ]);
                }
            }
        }
        plan
    }
}

/// `02:00:0a:00:00:03`.
pub fn format_mac(mac: [u8; 6]) -> String {
    mac.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}

/// A built lab. Dropping a lab made by [`Lab::up_owned`] tears it down (tests); one made by
/// [`Lab::up`] stays until `bypass lab down`.
#[derive(Debug)]
pub struct Lab {
    pub spec: LabSpec,
    owned: bool,
}

impl Lab {
    /// Builds the network of `spec`, or reuses it when a complete lab of that name exists.
    pub fn up(spec: LabSpec) -> Result<Lab> {
        spec.validate()?;
        require_root()?;
        if is_complete(&spec) {
            return Ok(Lab { spec, owned: false });
        }
        Lab::down(&spec.name)?;
        if let Err(error) = build(&spec) {
            // Leave nothing half-built behind; the build error is the one worth reporting.
            let _ = Lab::down(&spec.name);
            return Err(error);
        }
        Ok(Lab { spec, owned: false })
    }

    /// Like [`Lab::up`], but always fresh and torn down on drop.
    pub fn up_owned(spec: LabSpec) -> Result<Lab> {
        spec.validate()?;
        Lab::down(&spec.name)?;
        let mut lab = Lab::up(spec)?;
        lab.owned = true;
        Ok(lab)
    }

    /// Deletes every namespace whose name starts with `<name>-` and the lab's state directory.
    /// Succeeds when nothing is there.
    pub fn down(name: &str) -> Result<()> {
        let prefix = format!("{name}-");
        let spec = LabSpec { name: name.to_string(), ..LabSpec::default() };
        let _ = std::fs::remove_file(spec.state_dir().join(COMPLETE_MARKER));
        for namespace in list_namespaces()? {
            if namespace.starts_with(&prefix) {
                netns::run_args("ip", &["netns", "del", &namespace])?;
            }
        }
        Ok(())
    }

    pub fn hosts(&self) -> Vec<Host> {
        self.spec.hosts()
    }

    pub fn dispatcher(&self) -> Host {
        self.spec.host(Role::Dispatcher)
    }

    pub fn backend(&self, n: u8) -> Host {
        assert!((1..=self.spec.backends).contains(&n), "backend {n} is not in the lab");
        self.spec.host(Role::Backend(n))
    }

    pub fn client(&self, n: u8) -> Host {
        assert!((1..=self.spec.clients).contains(&n), "client {n} is not in the lab");
        self.spec.host(Role::Client(n))
    }

    pub fn backends(&self) -> Vec<Host> {
        (1..=self.spec.backends).map(|n| self.backend(n)).collect()
    }

    pub fn clients(&self) -> Vec<Host> {
        (1..=self.spec.clients).map(|n| self.client(n)).collect()
    }

    pub fn switch_namespace(&self) -> String {
        self.spec.switch_namespace()
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if self.owned {
            if let Err(error) = Lab::down(&self.spec.name) {
                eprintln!("lab {}: tearing down failed: {error}", self.spec.name);
            }
        }
    }
}

/// The kernel's TCP counters (`/proc/net/snmp` `Tcp:` and `/proc/net/netstat` `TcpExt:`) of a
/// namespace, e.g. `OutRsts`, `RetransSegs`, `PAWSEstabRejected`.
pub fn tcp_counters(namespace: &str) -> Result<std::collections::BTreeMap<String, u64>> {
    netns::run_in(namespace, || {
        let mut counters = std::collections::BTreeMap::new();
        for file in ["snmp", "netstat"] {
            // thread-self: the namespace of this thread, not of the process.
            let path = format!("/proc/thread-self/net/{file}");
            let text = std::fs::read_to_string(&path).map_err(|e| DispatchError::io(format!("reading {path}"), e))?;
            let lines: Vec<&str> = text.lines().collect();
            for pair in lines.chunks(2) {
                let [names, values] = pair else { continue };
                let (Some(("Tcp:" | "TcpExt:", names)), Some((_, values))) =
                    (names.split_once(' '), values.split_once(' '))
                else {
                    continue;
                };
                for (name, value) in names.split_whitespace().zip(values.split_whitespace()) {
                    counters.insert(name.to_string(), value.parse().unwrap_or(0));
                }
            }
        }
        Ok(counters)
    })
}

/// Written last by a successful build.
const COMPLETE_MARKER: &str = "complete";

fn is_complete(spec: &LabSpec) -> bool {
    spec.state_dir().join(COMPLETE_MARKER).exists()
        && netns::exists(&spec.switch_namespace())
        && spec.hosts().iter().all(|host| netns::exists(&host.namespace))
}

fn build(spec: &LabSpec) -> Result<()> {
    for step in spec.plan() {
        let (program, args) = step.split_first().expect("every plan step names a program");
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        netns::run_args(program, &args)?;
    }
    let dir = spec.state_dir();
    std::fs::create_dir_all(&dir).map_err(|e| DispatchError::io(format!("creating {}", dir.display()), e))?;
    let marker = dir.join(COMPLETE_MARKER);
    std::fs::write(&marker, format!("{spec:?}\n"))
        .map_err(|e| DispatchError::io(format!("writing {}", marker.display()), e))
}

fn list_namespaces() -> Result<Vec<String>> {
    let entries = match std::fs::read_dir(netns::NETNS_DIR) {
        Ok(entries) => entries,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(error) => return Err(DispatchError::io(format!("listing {}", netns::NETNS_DIR), error)),
    };
    Ok(entries.filter_map(|entry| entry.ok()?.file_name().into_string().ok()).collect())
}

fn require_root() -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(DispatchError::Lab("the lab needs root (network namespaces, tc, eBPF)".to_string()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: hosts get the documented addresses, MACs and namespaces; method: build the list.
    #[test]
    fn hosts_follow_the_addressing_plan() {
        let spec = LabSpec { name: "t".into(), ..LabSpec::default() };
        let hosts = spec.hosts();
        let shorts: Vec<&str> = hosts.iter().map(|h| h.short.as_str()).collect();
        assert_eq!(shorts, ["disp", "be1", "be2", "cli1", "cli2"]);
        assert_eq!(hosts[1].address, Ipv4Addr::new(10, 0, 0, 3));
        assert_eq!(hosts[4].address, Ipv4Addr::new(10, 0, 0, 12));
        assert_eq!(format_mac(hosts[2].mac), "02:00:0a:00:00:04");
        assert_eq!(hosts[3].namespace, "t-cli1");
        assert!(hosts[0].shaped && hosts[1].shaped && !hosts[3].shaped);
    }

    // Goal: every server link is shaped both ways, client links not; method: read the plan.
    #[test]
    fn plan_shapes_server_links_in_both_directions() {
        let spec = LabSpec { name: "t".into(), link_rate_mbit: 500, ..LabSpec::default() };
        let shaped: Vec<(String, String)> = spec
            .plan()
            .into_iter()
            .filter(|step| step.iter().any(|part| part == "tbf"))
            .map(|step| (step[2].clone(), step[6].clone()))
            .collect();
        let expected: Vec<(String, String)> = ["disp", "be1", "be2"]
            .iter()
            .flat_map(|h| [(format!("t-{h}"), "eth0".to_string()), ("t-sw".to_string(), format!("v-{h}"))])
            .collect();
        assert_eq!(shaped, expected);
        assert!(spec.plan().iter().any(|step| step.contains(&"500mbit".to_string())));
    }

    // Goal: only backends get the VIP on lo with ARP suppressed; method: read the plan.
    #[test]
    fn plan_puts_the_vip_on_backend_loopbacks() {
        let spec = LabSpec { name: "t".into(), ..LabSpec::default() };
        let plan = spec.plan();
        let vip_on_lo: Vec<&String> = plan
            .iter()
            .filter(|s| s.last().map(String::as_str) == Some("lo") && s.contains(&"addr".into()))
            .map(|s| &s[2])
            .collect();
        assert_eq!(vip_on_lo, ["t-be1", "t-be2"]);
        assert!(plan
            .iter()
            .any(|s| s.contains(&"t-be2".into()) && s.contains(&"net.ipv4.conf.all.arp_ignore=1".into())));
        assert!(!plan.iter().any(|s| s.contains(&"t-disp".into()) && s.iter().any(|p| p.contains("arp_ignore"))));
    }

    // Goal: bad specs are refused with every problem listed; method: validate a broken spec.
    #[test]
    fn validate_lists_every_problem() {
        let spec = LabSpec { name: "Bad-Name".into(), link_rate_mbit: 0, clients: 0, backends: 9 };
        let Err(DispatchError::Config(problems)) = spec.validate() else { panic!("must be refused") };
        assert_eq!(problems.len(), 4, "{problems:?}");
    }

    // Goal: tbf bursts cover a GSO packet and a timer tick; method: compute for two rates.
    #[test]
    fn tbf_burst_covers_gso_and_a_tick() {
        let slow = LabSpec { link_rate_mbit: 100, ..LabSpec::default() };
        assert_eq!(slow.tbf_burst_bytes(), 256 * 1024);
        let fast = LabSpec { link_rate_mbit: 10_000, ..LabSpec::default() };
        assert_eq!(fast.tbf_burst_bytes(), 5_000_000);
    }
}
