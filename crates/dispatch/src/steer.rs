//! The switch's steering table, loaded into the kernel from `bpf/steer.bpf.c` with aya and
//! attached (tcx ingress) to the client-facing ports of the lab's switch namespace.
//!
//! ```text
//!   client ──► switch port ──tc ingress: steer_flows[client ip:port]──►
//!                 none / PASS ─► bridge as usual (to the dispatcher)
//!                 BLOCK       ─► drop (connection in flight between hosts)
//!                 FORWARD mac ─► destination MAC := backend ─► bridge ─► backend (VIP on lo)
//! ```
//! Invariant: only the dispatcher writes the table (backends ask it over their link).
//!
//! Tracked flows (connections that may move) also have an arrivals counter: segments the
//! switch let through to the current owner. An owner gives a connection up only once its
//! socket has received all of them ([`crate::handover::wait_settled`]), because a segment still
//! queued between the switch and the host would meet a closed socket (a reset) or be
//! acknowledged and lost with it.

use std::net::SocketAddrV4;
use std::sync::Mutex;

use aya::maps::{HashMap, MapData, PerCpuArray};
use aya::programs::{SchedClassifier, TcAttachType};
use aya::Ebpf;

use crate::error::{DispatchError, Result};
use crate::netns;

/// `struct steer_key` of bpf/steer.h.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SteerKey {
    /// IPv4 address, network byte order.
    pub client_addr: u32,
    /// TCP port, network byte order.
    pub client_port: u16,
    pub pad: u16,
}

/// `struct steer_value` of bpf/steer.h.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SteerValue {
    pub action: u32,
    pub owner_mac: [u8; 6],
    pub pad: u16,
    pub drop_per_million: u32,
}

/// `struct steer_arrivals` of bpf/steer.h.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SteerArrivals {
    pub arrived: u64,
    pub dropped: u64,
}

/// `struct steer_stats` of bpf/steer.h.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SteerStats {
    pub passed: u64,
    pub blocked: u64,
    pub forwarded: u64,
    pub dropped_random: u64,
}

const _: () = assert!(std::mem::size_of::<SteerKey>() == 8);
const _: () = assert!(std::mem::size_of::<SteerValue>() == 16);
const _: () = assert!(std::mem::offset_of!(SteerValue, owner_mac) == 4);
const _: () = assert!(std::mem::offset_of!(SteerValue, drop_per_million) == 12);
const _: () = assert!(std::mem::size_of::<SteerStats>() == 32);
const _: () = assert!(std::mem::size_of::<SteerArrivals>() == 16);

// SAFETY: plain `#[repr(C)]` integers and byte arrays with explicit padding fields: every bit
// pattern is valid and there are no implicit padding bytes.
unsafe impl aya::Pod for SteerKey {}
// SAFETY: as above.
unsafe impl aya::Pod for SteerValue {}
// SAFETY: as above.
unsafe impl aya::Pod for SteerStats {}
// SAFETY: as above.
unsafe impl aya::Pod for SteerArrivals {}

const STEER_PASS: u32 = 0;
const STEER_BLOCK: u32 = 1;
const STEER_FORWARD: u32 = 2;

/// What the switch does with one client flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Pass,
    Block,
    /// Deliver to the host with this MAC; `drop_per_million` emulates loss on the path.
    Forward {
        mac: [u8; 6],
        drop_per_million: u32,
    },
}

/// The compiled program, aligned for the ELF parser.
static PROGRAM: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/steer.bpf.o"));

/// The steering program attached to the switch ports, and its table.
pub struct Switch {
    /// Keeps the program (and so its attachments) alive.
    _ebpf: Ebpf,
    flows: Mutex<HashMap<MapData, SteerKey, SteerValue>>,
    arrivals: Mutex<HashMap<MapData, SteerKey, SteerArrivals>>,
    counters: PerCpuArray<MapData, SteerStats>,
}

impl Switch {
    /// Loads the program and attaches it to the ingress of `ports` inside `namespace`.
    pub fn attach(namespace: &str, ports: &[String]) -> Result<Switch> {
        let ports = ports.to_vec();
        let namespace = namespace.to_string();
        netns::run_in(&namespace.clone(), move || load_and_attach(&ports).map_err(|e| e.in_namespace(&namespace)))
    }

    /// Sets the action for `client`'s flow.
    pub fn set(&self, client: SocketAddrV4, action: Action) -> Result<()> {
        let value = match action {
            Action::Pass => SteerValue { action: STEER_PASS, owner_mac: [0; 6], pad: 0, drop_per_million: 0 },
            Action::Block => SteerValue { action: STEER_BLOCK, owner_mac: [0; 6], pad: 0, drop_per_million: 0 },
            Action::Forward { mac, drop_per_million } => {
                SteerValue { action: STEER_FORWARD, owner_mac: mac, pad: 0, drop_per_million }
            }
        };
        let mut flows = self.flows.lock().unwrap_or_else(|p| p.into_inner());
        flows.insert(key(client), value, 0).map_err(|e| steering(format!("setting {client}: {e}")))
    }

    /// Forgets `client`'s flow (its packets pass untouched again). Absent flows are fine.
    pub fn remove(&self, client: SocketAddrV4) -> Result<()> {
        let mut flows = self.flows.lock().unwrap_or_else(|p| p.into_inner());
        match flows.remove(&key(client)) {
            Ok(()) | Err(aya::maps::MapError::KeyNotFound) => Ok(()),
            Err(aya::maps::MapError::SyscallError(error)) if error.io_error.raw_os_error() == Some(libc::ENOENT) => {
                Ok(())
            }
            Err(error) => Err(steering(format!("removing {client}: {error}"))),
        }
    }

    /// The action stored for `client`, if any.
    pub fn get(&self, client: SocketAddrV4) -> Result<Option<SteerValue>> {
        let flows = self.flows.lock().unwrap_or_else(|p| p.into_inner());
        match flows.get(&key(client), 0) {
            Ok(value) => Ok(Some(value)),
            Err(aya::maps::MapError::KeyNotFound) => Ok(None),
            Err(error) => Err(steering(format!("reading {client}: {error}"))),
        }
    }

    /// Flows in the table (must be zero once every connection is back home).
    pub fn flow_count(&self) -> Result<usize> {
        let flows = self.flows.lock().unwrap_or_else(|p| p.into_inner());
        let mut count = 0;
        for key in flows.keys() {
            key.map_err(|e| steering(format!("listing flows: {e}")))?;
            count += 1;
        }
        Ok(count)
    }

    /// Starts counting the segments of `client`'s flow (from zero).
    pub fn track(&self, client: SocketAddrV4) -> Result<()> {
        let mut arrivals = self.arrivals.lock().unwrap_or_else(|p| p.into_inner());
        arrivals
            .insert(key(client), SteerArrivals::default(), 0)
            .map_err(|e| steering(format!("tracking {client}: {e}")))
    }

    /// Stops counting `client`'s segments. Absent flows are fine.
    pub fn untrack(&self, client: SocketAddrV4) -> Result<()> {
        let mut arrivals = self.arrivals.lock().unwrap_or_else(|p| p.into_inner());
        match arrivals.remove(&key(client)) {
            Ok(()) | Err(aya::maps::MapError::KeyNotFound) => Ok(()),
            Err(aya::maps::MapError::SyscallError(error)) if error.io_error.raw_os_error() == Some(libc::ENOENT) => {
                Ok(())
            }
            Err(error) => Err(steering(format!("untracking {client}: {error}"))),
        }
    }

    /// Segments of `client`'s flow the switch let through since [`Switch::track`]. A segment
    /// being dropped at this very moment may still count as let through: the answer errs on
    /// the side of waiting longer.
    pub fn delivered(&self, client: SocketAddrV4) -> Result<u64> {
        let arrivals = self.arrivals.lock().unwrap_or_else(|p| p.into_inner());
        match arrivals.get(&key(client), 0) {
            Ok(counts) => Ok(counts.arrived.saturating_sub(counts.dropped)),
            Err(error) => Err(steering(format!("reading arrivals of {client}: {error}"))),
        }
    }

    /// Flows whose segments are counted (must be zero once every session ended).
    pub fn tracked_count(&self) -> Result<usize> {
        let arrivals = self.arrivals.lock().unwrap_or_else(|p| p.into_inner());
        let mut count = 0;
        for key in arrivals.keys() {
            key.map_err(|e| steering(format!("listing tracked flows: {e}")))?;
            count += 1;
        }
        Ok(count)
    }

    /// Packet counters summed over CPUs.
    pub fn stats(&self) -> Result<SteerStats> {
        let values = self.counters.get(&0, 0).map_err(|e| steering(format!("reading counters: {e}")))?;
        Ok(values.iter().fold(SteerStats::default(), |sum, cpu| SteerStats {
            passed: sum.passed + cpu.passed,
            blocked: sum.blocked + cpu.blocked,
            forwarded: sum.forwarded + cpu.forwarded,
            dropped_random: sum.dropped_random + cpu.dropped_random,
        }))
    }
}

fn key(client: SocketAddrV4) -> SteerKey {
    SteerKey { client_addr: u32::from(*client.ip()).to_be(), client_port: client.port().to_be(), pad: 0 }
}

fn load_and_attach(ports: &[String]) -> Result<Switch> {
    let mut ebpf = Ebpf::load(PROGRAM).map_err(|e| kernel(format!("loading the steering program: {e}")))?;
    let program: &mut SchedClassifier = ebpf
        .program_mut("steer_ingress")
        .ok_or_else(|| steering("program steer_ingress missing from the object".into()))?
        .try_into()
        .map_err(|e| steering(format!("steer_ingress is not a tc program: {e}")))?;
    program.load().map_err(|e| kernel(format!("verifying the steering program: {e}")))?;
    for port in ports {
        program.attach(port, TcAttachType::Ingress).map_err(|e| kernel(format!("attaching to {port}: {e}")))?;
    }
    let flows = ebpf.take_map("steer_flows").ok_or_else(|| steering("map steer_flows missing".into()))?;
    let flows = HashMap::try_from(flows).map_err(|e| steering(format!("steer_flows: {e}")))?;
    let arrivals = ebpf.take_map("steer_arrivals").ok_or_else(|| steering("map steer_arrivals missing".into()))?;
    let arrivals = HashMap::try_from(arrivals).map_err(|e| steering(format!("steer_arrivals: {e}")))?;
    let counters = ebpf.take_map("steer_counters").ok_or_else(|| steering("map steer_counters missing".into()))?;
    let counters = PerCpuArray::try_from(counters).map_err(|e| steering(format!("steer_counters: {e}")))?;
    Ok(Switch { _ebpf: ebpf, flows: Mutex::new(flows), arrivals: Mutex::new(arrivals), counters })
}

fn steering(text: String) -> DispatchError {
    DispatchError::Steering(text)
}

/// A kernel refusal here means a missing feature (BPF, tcx, BTF): fail loudly, never skip.
fn kernel(text: String) -> DispatchError {
    DispatchError::KernelFeature(text)
}

impl DispatchError {
    fn in_namespace(self, namespace: &str) -> DispatchError {
        match self {
            DispatchError::Steering(text) => DispatchError::Steering(format!("{text} (in {namespace})")),
            DispatchError::KernelFeature(text) => DispatchError::KernelFeature(format!("{text} (in {namespace})")),
            other => other,
        }
    }
}
