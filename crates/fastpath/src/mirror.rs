//! Workload mirroring in the kernel (`bpf/mirror.bpf.c`): every byte a mirrored client sends to
//! the pooler is copied to a shadow server's socket, and the shadow's replies are dropped, with
//! no user-space work per query and no wait on the shadow in the primary's path.
//!
//! ```text
//!   client ──TCP──► [interface ingress: fp_mirror_tc] ──original──► pooler socket (untouched)
//!                          │ clone → UDP datagram (shadow id, TCP sequence, payload)
//!                          ▼
//!              FastPath UDP socket ──fp_mirror_datagram──► shadow TCP socket ──► shadow server
//!              shadow TCP socket ◄── replies ── shadow server: fp_shadow_reply drops them
//! ```
//!
//! Use (the pooler): once, when a database has `mirror`, [`FastPath::enable_mirroring`] with
//! the interface clients arrive on. Per client of that database: connect to the shadow server
//! and run its startup and authentication in user space up to ReadyForQuery, then
//! [`FastPath::add_mirror`]`(client.peer_addr(), client.local_addr(), shadow.as_fd())` before
//! the client's first query; from then on never read or write the shadow socket. When the
//! client leaves, [`FastPath::remove_mirror`], then close the shadow. A client whose mirror
//! broke ([`FastPath::mirror_intact`] false) has an incomplete copy on its shadow: close it.
//! IPv6 clients ([`FastPathError::MirrorIpv6`]) are mirrored in user space.
//!
//! Invariants: a flow enters `fp_mirror_flows` only after its stream word and shadow socket are
//! in place (and leaves first), so the tc program never clones for a flow with nowhere to go; a
//! shadow's stream only advances in sequence order, so a shadow receives a byte-exact prefix of
//! the client's stream: on a gap it is cut off ([`FastPath::mirror_intact`] turns false) rather
//! than fed a corrupt stream.
//!
//! Ordering: a shadow needs the client's bytes in order, and the tc hook sees segments in the
//! order the interface delivers them. On loopback each segment goes to the backlog of the CPU
//! that transmits it, and TCP transmits one flow from several CPUs (the writer, softirqs that
//! process ACKs), so under load a bulk sender's segments are now and then delivered out of
//! order (TCP's `TCPOFOQueue` counter). TCP reorders them for the pooler; this mirror cannot: a
//! reordering cuts that shadow off (`desyncs`, [`FastPath::mirror_intact`] false; the pooler
//! can then mirror that client in user space), it never feeds the shadow a corrupt stream. A
//! request/reply client has one message in flight and is not reordered (every benchmark run
//! kept its shadows intact). RPS on the interface (`/sys/class/net/lo/queues/rx-0/rps_cpus`)
//! steers every packet of a flow, clones included, to one CPU's FIFO backlog and makes the
//! mirror reorder-proof (the tests run that way), at the price of a cross-CPU wakeup for every
//! packet of a flow whose hash lands on another CPU: on the 2-vCPU dev VM that took such a
//! flow's 5 µs loopback round trip to 50–75 µs, mirrored or not
//! (bench/results/fastpath-mirror-rps.md), so it is an operator's choice, not a requirement.
//! `enable_mirroring` logs when RPS is off.
//!
//! Limitations: IPv4 only ([`FastPathError::MirrorIpv6`]: the pooler mirrors such a client in
//! user space); segments are mirrored as the interface delivers them, before TCP checks their
//! checksum (lo has none to check; a NIC verifies them in hardware); two datagrams of one flow
//! verdicted at the same instant on two CPUs could reach the shadow's send queue in the
//! opposite order of their sequence claims (with RPS a flow's datagrams are verdicted on one
//! CPU); bytes queued for a slow shadow are not charged to any socket buffer. On an interface
//! other than `lo` the datagrams are addressed to 127.0.0.1, so the interface needs
//! `net.ipv4.conf.<interface>.route_localnet = 1` (checked by `enable_mirroring`).

use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};

use aya::maps::{Array, HashMap, MapData, PerCpuArray, SockHash, SockMap};
use aya::programs::{tc, SchedClassifier, TcAttachType};
use aya::Ebpf;

use crate::abi::{MirrorConfig, MirrorCounters, MirrorFlow, MIRROR_CLONE_EGRESS, STREAM_BROKEN};
use crate::{load_sk_skb, lock, map_error, program_stats, take_map, FastPath, FastPathError, ProgramStats, Result};

/// The compiled mirroring programs, aligned for the ELF parser.
static MIRROR_PROGRAMS: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/mirror.bpf.o"));

/// Receive buffer of the UDP socket: datagrams wait there only between the tc rewrite and the
/// verdict (one softirq), but a burst of 64 KiB GSO clones must not overflow it.
const UDP_RECEIVE_BUFFER_BYTES: libc::c_int = 8 << 20;

/// Map update flag: fail if the key exists (a second mirror of one flow is an error).
const BPF_NOEXIST: u64 = 1;

/// `bpf_attach_type` BPF_SK_SKB_VERDICT and `bpf_cmd` BPF_PROG_ATTACH (linux/bpf.h).
const BPF_SK_SKB_VERDICT: u32 = 38;
const BPF_PROG_ATTACH: libc::c_long = 8;

/// `/sys/class/net/<interface>/type` values with an Ethernet header at tc (the program reads
/// IPv4 at offset 14): Ethernet and loopback.
const ARPHRD_ETHER: u32 = 1;
const ARPHRD_LOOPBACK: u32 = 772;

/// A mirrored flow; give it back to [`FastPath::remove_mirror`] when the client or the shadow
/// goes away (a forgotten handle keeps mirroring until the FastPath is dropped).
#[must_use = "a mirror stays in the kernel until remove_mirror"]
#[derive(Debug)]
pub struct MirrorHandle {
    shadow_id: u64,
    flow: MirrorFlow,
}

impl MirrorHandle {
    /// The random id naming this shadow in the kernel maps and in every mirrored datagram.
    pub fn shadow_id(&self) -> u64 {
        self.shadow_id
    }
}

/// The loaded mirroring programs and their maps. Field order is drop order: the maps and the
/// UDP socket go first, then `_ebpf`, which detaches the tc program and the verdicts.
pub(crate) struct Mirror {
    interface: String,
    flows: HashMap<MapData, MirrorFlow, u64>,
    streams: HashMap<MapData, u64, u64>,
    shadows: SockHash<MapData, u64>,
    counters: PerCpuArray<MapData, MirrorCounters>,
    config: Array<MapData, MirrorConfig>,
    config_value: MirrorConfig,
    _socket_map: SockMap<MapData>,
    _udp: UdpSocket,
    program_ids: Vec<(&'static str, u32)>,
    _ebpf: Ebpf,
}

impl Mirror {
    fn load(interface: &str) -> Result<Mirror> {
        let loopback = check_interface(interface)?;
        let mut ebpf = Ebpf::load(MIRROR_PROGRAMS).map_err(|e| FastPathError::Load(e.to_string()))?;
        let udp = udp_socket()?;
        let port = udp.local_addr()?.port();
        let flags = if loopback { MIRROR_CLONE_EGRESS } else { 0 };
        let config_value = MirrorConfig { udp_port: port.to_be(), pad: 0, flags, flows: 0, reserved: 0 };
        let mut config: Array<MapData, MirrorConfig> =
            Array::try_from(take_map(&mut ebpf, "fp_mirror_config")?).map_err(map_error("fp_mirror_config"))?;
        config.set(0, config_value, 0).map_err(map_error("fp_mirror_config"))?;
        let mut socket_map =
            SockMap::try_from(take_map(&mut ebpf, "fp_mirror_socket")?).map_err(map_error("fp_mirror_socket"))?;
        let shadows = SockHash::try_from(take_map(&mut ebpf, "fp_shadows")?).map_err(map_error("fp_shadows"))?;
        let mut program_ids = Vec::new();
        // Verdicts first, while no socket is in either map: a socket takes the programs its
        // map has when it enters.
        program_ids.push(attach_skb_verdict(&mut ebpf, "fp_mirror_datagram", socket_map.fd().as_fd())?);
        program_ids.push(attach_stream_verdict(&mut ebpf, "fp_shadow_reply", &shadows)?);
        socket_map.set(0, &udp, 0).map_err(map_error("fp_mirror_socket"))?;
        program_ids.push(attach_tc(&mut ebpf, interface)?);
        Ok(Mirror {
            interface: interface.to_string(),
            flows: HashMap::try_from(take_map(&mut ebpf, "fp_mirror_flows")?).map_err(map_error("fp_mirror_flows"))?,
            streams: HashMap::try_from(take_map(&mut ebpf, "fp_mirror_streams")?)
                .map_err(map_error("fp_mirror_streams"))?,
            shadows,
            counters: PerCpuArray::try_from(take_map(&mut ebpf, "fp_mirror_counters")?)
                .map_err(map_error("fp_mirror_counters"))?,
            config,
            config_value,
            _socket_map: socket_map,
            _udp: udp,
            program_ids,
            _ebpf: ebpf,
        })
    }
}

impl FastPath {
    /// Loads the mirroring programs and attaches the tc program to `interface` (the one that
    /// carries client→pooler traffic; `lo` for local clients). Idempotent: call it once when
    /// the configuration has a mirror. Fails with [`FastPathError::MirrorInterface`] for an
    /// interface without an Ethernet header, or another interface than the one enabled first.
    pub fn enable_mirroring(&self, interface: &str) -> Result<()> {
        let mut mirror = lock(&self.mirror);
        match mirror.as_ref() {
            Some(loaded) if loaded.interface == interface => Ok(()),
            Some(loaded) => Err(interface_error(interface, format!("mirroring already runs on {}", loaded.interface))),
            None => {
                *mirror = Some(Mirror::load(interface)?);
                if !receive_packet_steering(interface) {
                    tracing::info!(
                        interface,
                        "RPS is off: a client whose segments arrive out of order loses its kernel mirror"
                    );
                }
                Ok(())
            }
        }
    }

    /// Starts copying the bytes the client at `client_peer` sends to the pooler's socket at
    /// `pooler_local` into `shadow`, a TCP socket to the shadow server that user space has
    /// already logged in: from here on the kernel drops everything the shadow sends. IPv4 only
    /// ([`FastPathError::MirrorIpv6`]; IPv4-mapped IPv6 addresses count as IPv4); one mirror
    /// per flow ([`FastPathError::MirrorExists`]). The shadow socket must be in no other socket
    /// map (a socket has one set of sk_skb programs), and user space must not write to it while
    /// it is mirrored: its bytes would interleave with the client's at arbitrary points.
    pub fn add_mirror(
        &self,
        client_peer: SocketAddr,
        pooler_local: SocketAddr,
        shadow: BorrowedFd<'_>,
    ) -> Result<MirrorHandle> {
        let flow = MirrorFlow {
            client_ip: ipv4(client_peer)?.to_bits().to_be(),
            pooler_ip: ipv4(pooler_local)?.to_bits().to_be(),
            client_port: client_peer.port().to_be(),
            pooler_port: pooler_local.port().to_be(),
        };
        let mut guard = lock(&self.mirror);
        let mirror = guard.as_mut().ok_or(FastPathError::MirrorNotEnabled)?;
        if mirror.flows.get(&flow, 0).is_ok() {
            return Err(FastPathError::MirrorExists(client_peer));
        }
        let shadow_id = random_id()?;
        mirror.admit(flow, shadow_id, shadow)?;
        Ok(MirrorHandle { shadow_id, flow })
    }

    /// Stops mirroring a flow (the flow first, so no clone is made for a shadow that is gone).
    pub fn remove_mirror(&self, handle: MirrorHandle) {
        if let Some(mirror) = lock(&self.mirror).as_mut() {
            mirror.forget(&handle);
        }
    }

    /// False once the shadow missed bytes (a lost or reordered clone) and was cut off: close
    /// the shadow, or mirror that client in user space.
    pub fn mirror_intact(&self, handle: &MirrorHandle) -> bool {
        let guard = lock(&self.mirror);
        let stream = guard.as_ref().and_then(|mirror| mirror.streams.get(&handle.shadow_id, 0).ok());
        stream.is_some_and(|word| word & STREAM_BROKEN == 0)
    }

    /// The mirroring counters summed over CPUs (all zero before `enable_mirroring`).
    pub fn mirror_counters(&self) -> MirrorCounters {
        let guard = lock(&self.mirror);
        let mut total = MirrorCounters::default();
        if let Some(values) = guard.as_ref().and_then(|mirror| mirror.counters.get(&0, 0).ok()) {
            for cpu in values.iter() {
                add_mirror_counters(&mut total, cpu);
            }
        }
        total
    }

    /// The mirroring programs' cost from bpf_stats, like [`FastPath::program_stats`] (empty
    /// before `enable_mirroring`).
    pub fn mirror_program_stats(&self) -> Vec<ProgramStats> {
        let ids = lock(&self.mirror).as_ref().map(|mirror| mirror.program_ids.clone()).unwrap_or_default();
        program_stats(&ids)
    }
}

impl Mirror {
    /// Enters a mirror into the maps, the flow last (the tc program clones only for a flow whose
    /// stream and shadow exist), counted before the flow enters (no segment after add_mirror
    /// returns is skipped); undoes what it did on failure.
    fn admit(&mut self, flow: MirrorFlow, shadow_id: u64, shadow: BorrowedFd<'_>) -> Result<()> {
        self.streams.insert(shadow_id, 0, BPF_NOEXIST).map_err(map_error("fp_mirror_streams"))?;
        if let Err(error) = self.count_flows(1) {
            let _ = self.streams.remove(&shadow_id);
            return Err(error);
        }
        let inserted = self
            .shadows
            .insert(shadow_id, shadow.as_raw_fd(), BPF_NOEXIST)
            .map_err(map_error("fp_shadows"))
            .and_then(|()| self.flows.insert(flow, shadow_id, BPF_NOEXIST).map_err(map_error("fp_mirror_flows")));
        if let Err(error) = inserted {
            let _ = self.shadows.remove(&shadow_id);
            let _ = self.streams.remove(&shadow_id);
            let _ = self.count_flows(-1);
            return Err(error);
        }
        Ok(())
    }

    fn forget(&mut self, handle: &MirrorHandle) {
        if self.flows.remove(&handle.flow).is_ok() {
            let _ = self.count_flows(-1);
        }
        let _ = self.shadows.remove(&handle.shadow_id);
        let _ = self.streams.remove(&handle.shadow_id);
    }

    /// Publishes the number of mirrored flows to the tc program (0: it returns at once).
    fn count_flows(&mut self, change: i32) -> Result<()> {
        let flows = self.config_value.flows.checked_add_signed(change).expect("flows counted in step with the map");
        let value = MirrorConfig { flows, ..self.config_value };
        self.config.set(0, value, 0).map_err(map_error("fp_mirror_config"))?;
        self.config_value = value;
        Ok(())
    }
}

fn add_mirror_counters(total: &mut MirrorCounters, cpu: &MirrorCounters) {
    total.segments_cloned += cpu.segments_cloned;
    total.clone_failures += cpu.clone_failures;
    total.segments_mirrored += cpu.segments_mirrored;
    total.bytes_mirrored += cpu.bytes_mirrored;
    total.drops_no_shadow += cpu.drops_no_shadow;
    total.duplicate_bytes += cpu.duplicate_bytes;
    total.desyncs += cpu.desyncs;
    total.shadow_reply_bytes_dropped += cpu.shadow_reply_bytes_dropped;
}

fn ipv4(address: SocketAddr) -> Result<Ipv4Addr> {
    match address.ip() {
        IpAddr::V4(ip) => Ok(ip),
        IpAddr::V6(ip) => ip.to_ipv4_mapped().ok_or(FastPathError::MirrorIpv6(address)),
    }
}

fn interface_error(interface: &str, detail: String) -> FastPathError {
    FastPathError::MirrorInterface { interface: interface.to_string(), detail }
}

/// The tc program reads IPv4 right after a 14-byte Ethernet header, and the datagrams it makes
/// go to 127.0.0.1, which the kernel accepts from another interface than lo only with
/// route_localnet. True for a loopback interface.
fn check_interface(interface: &str) -> Result<bool> {
    let read = |path: String| std::fs::read_to_string(path).map(|text| text.trim().to_string());
    let kind = read(format!("/sys/class/net/{interface}/type"))
        .map_err(|error| interface_error(interface, format!("no such interface ({error})")))?;
    let kind: u32 = kind.parse().map_err(|_| interface_error(interface, format!("unreadable type {kind:?}")))?;
    if kind != ARPHRD_ETHER && kind != ARPHRD_LOOPBACK {
        return Err(interface_error(interface, format!("link type {kind} has no Ethernet header")));
    }
    let local = read(format!("/proc/sys/net/ipv4/conf/{interface}/route_localnet")).unwrap_or_default();
    if kind != ARPHRD_LOOPBACK && local != "1" {
        return Err(interface_error(interface, "set net.ipv4.conf.<interface>.route_localnet = 1".into()));
    }
    Ok(kind == ARPHRD_LOOPBACK)
}

/// Whether any receive queue of the interface steers packets with RPS (a non-zero CPU mask).
fn receive_packet_steering(interface: &str) -> bool {
    let Ok(queues) = std::fs::read_dir(format!("/sys/class/net/{interface}/queues")) else {
        return false;
    };
    queues.flatten().filter(|queue| queue.file_name().to_string_lossy().starts_with("rx-")).any(|queue| {
        let mask = std::fs::read_to_string(queue.path().join("rps_cpus")).unwrap_or_default();
        mask.trim().chars().any(|digit| digit != '0' && digit != ',')
    })
}

fn udp_socket() -> Result<UdpSocket> {
    let udp = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))?;
    let size = UDP_RECEIVE_BUFFER_BYTES;
    // SAFETY: setsockopt reads size_of::<c_int>() bytes from `size`, which is a c_int.
    let result = unsafe {
        libc::setsockopt(
            udp.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            (&raw const size).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if result != 0 {
        return Err(FastPathError::Socket(std::io::Error::last_os_error()));
    }
    Ok(udp)
}

fn random_id() -> Result<u64> {
    let mut bytes = [0u8; 8];
    // SAFETY: getrandom writes at most bytes.len() bytes into `bytes`.
    let written = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    if written != bytes.len() as isize {
        return Err(FastPathError::Socket(std::io::Error::last_os_error()));
    }
    Ok(u64::from_ne_bytes(bytes))
}

/// The shadow map's verdict: a TCP socket, so aya's stream-verdict attach fits.
fn attach_stream_verdict(
    ebpf: &mut Ebpf,
    name: &'static str,
    map: &SockHash<MapData, u64>,
) -> Result<(&'static str, u32)> {
    let program = load_sk_skb(ebpf, name)?;
    program.attach(map.fd()).map_err(|e| FastPathError::Load(format!("attaching {name}: {e}")))?;
    Ok((name, program.info().map(|info| info.id()).unwrap_or(0)))
}

/// The UDP socket's verdict needs attach type BPF_SK_SKB_VERDICT, which aya 0.14 cannot name
/// (its `SkSkbKind` has the stream parser and stream verdict only), so it is attached with a
/// raw bpf(BPF_PROG_ATTACH). The attachment belongs to the map and ends when the map is freed.
fn attach_skb_verdict(ebpf: &mut Ebpf, name: &'static str, map: BorrowedFd<'_>) -> Result<(&'static str, u32)> {
    let program = load_sk_skb(ebpf, name)?;
    let program_fd: RawFd = program.fd().map_err(|e| FastPathError::Load(e.to_string()))?.as_fd().as_raw_fd();
    prog_attach(map.as_raw_fd(), program_fd, BPF_SK_SKB_VERDICT)
        .map_err(|error| FastPathError::Load(format!("attaching {name} as skb verdict: {error}")))?;
    Ok((name, program.info().map(|info| info.id()).unwrap_or(0)))
}

/// `union bpf_attr` as BPF_PROG_ATTACH reads it.
#[repr(C)]
struct ProgAttachAttr {
    target_fd: u32,
    attach_bpf_fd: u32,
    attach_type: u32,
    attach_flags: u32,
    replace_bpf_fd: u32,
}

fn prog_attach(target: RawFd, program: RawFd, attach_type: u32) -> std::io::Result<()> {
    let attr = ProgAttachAttr {
        target_fd: target as u32,
        attach_bpf_fd: program as u32,
        attach_type,
        attach_flags: 0,
        replace_bpf_fd: 0,
    };
    // SAFETY: bpf(2) reads size_of::<ProgAttachAttr>() bytes of `attr`; the kernel treats the
    // rest of union bpf_attr as zero.
    let result = unsafe {
        libc::syscall(libc::SYS_bpf, BPF_PROG_ATTACH, &raw const attr, std::mem::size_of::<ProgAttachAttr>())
    };
    if result != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Attaches the tc program at `interface` ingress. On Linux ≥ 6.6 aya uses a TCX link (no
/// qdisc, no `tc filter` entry; `bpftool net` lists it), which the kernel removes when its fd
/// closes, i.e. when the FastPath drops. Older kernels take a netlink filter under clsact.
fn attach_tc(ebpf: &mut Ebpf, interface: &str) -> Result<(&'static str, u32)> {
    let name = "fp_mirror_tc";
    let program: &mut SchedClassifier = ebpf
        .program_mut(name)
        .ok_or_else(|| FastPathError::Load(format!("{name} missing from the object")))?
        .try_into()
        .map_err(|e: aya::programs::ProgramError| FastPathError::Load(e.to_string()))?;
    program.load().map_err(|e| FastPathError::Load(format!("{name}: {e}")))?;
    if program.attach(interface, TcAttachType::Ingress).is_err() {
        // Netlink attach (old kernels) needs the clsact qdisc; it may exist already.
        let _ = tc::qdisc_add_clsact(interface);
        program
            .attach(interface, TcAttachType::Ingress)
            .map_err(|e| interface_error(interface, format!("attaching {name}: {e}")))?;
    }
    Ok((name, program.info().map(|info| info.id()).unwrap_or(0)))
}

// The pooler shares one FastPath between threads: mirroring must not take that away.
const _: () = {
    const fn shared_between_threads<T: Send + Sync>() {}
    shared_between_threads::<FastPath>();
};
