//! The pooler's kernel fast path: two `sk_skb` stream verdict programs (`bpf/fastpath.bpf.c`)
//! that forward a pooled client's requests and its server's answers inside the kernel, and the
//! user-space side that loads them and shares their state.
//!
//! ```text
//!   client socket ──fp_client──► (linked? or take a FREE server) ──redirect──► server socket
//!   server socket ──fp_server──► redirect to the client; 'Z' 'I' with 0 outstanding: unlink,
//!                                server FREE, or HANDOFF (ring) when clients wait in user space
//!                                (no wake-up when many wait: the `handoff` module)
//!   anything else ──SK_PASS──► the pooler's user-space path (gate closed until it re-arms)
//! ```
//!
//! State lives in two mmap-ed arrays the pooler reads and writes with atomics, exactly as the
//! programs do: one [`Slot`] per socket (link word, gate word, framing) and one [`PoolEntry`] per
//! pool (user-space waiters, server slots in use). Invariants:
//! - a client's link word holds its server and its unanswered requests together, so a request
//!   and the release at the last ReadyForQuery cannot interleave;
//! - a client's gate counts the bytes passed to user space; the gate opens again only when user
//!   space has read all of them and holds no partial message, so the paths never reorder bytes;
//! - a server belongs to exactly one of: the kernel's free set, a kernel link, user space, or the
//!   handoff ring (its `owner`), changed only by compare-and-swap.
//!
//! Workload mirroring (`mirror = "<database>"`) is a separate object (`bpf/mirror.bpf.c`),
//! loaded by [`FastPath::enable_mirroring`]: a tc program clones a mirrored client's segments
//! into UDP datagrams, a verdict on the FastPath's UDP socket redirects their payload, in TCP
//! sequence order, into the shadow server's socket, and the shadow's replies are dropped in the
//! kernel. It works whether the client's bytes take the kernel or the user-space path. See the
//! `mirror` module for the design, the RPS requirement and the limits.

pub mod abi;
mod handoff;
mod link;
mod mirror;
mod park;
pub mod status;

use std::collections::HashMap as StdHashMap;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

use aya::maps::{HashMap, Map, MapData, PerCpuArray, RingBuf, SockHash};
use aya::programs::SkSkb;
use aya::Ebpf;

use abi::*;
pub use abi::{Counters, MirrorCounters, PoolCounters, PoolEntry, Slot};
pub use handoff::{Announcement, WatchFd, HANDOFF_QUIET_FROM};
pub use mirror::MirrorHandle;

/// The compiled programs, aligned for the ELF parser.
static PROGRAMS: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/fastpath.bpf.o"));

#[derive(Debug, thiserror::Error)]
pub enum FastPathError {
    #[error("loading the fast-path programs: {0}")]
    Load(String),
    #[error("fast-path map {map}: {detail}")]
    Map { map: &'static str, detail: String },
    #[error("the fast path has no free {0} slot")]
    Full(&'static str),
    #[error("socket: {0}")]
    Socket(#[from] std::io::Error),
    #[error("kernel mirroring takes IPv4 flows only ({0}): mirror this client in user space")]
    MirrorIpv6(std::net::SocketAddr),
    #[error("the flow of client {0} is mirrored already")]
    MirrorExists(std::net::SocketAddr),
    #[error("mirroring is not enabled: call enable_mirroring first")]
    MirrorNotEnabled,
    #[error("mirroring on interface {interface}: {detail}")]
    MirrorInterface { interface: String, detail: String },
}

type Result<T> = std::result::Result<T, FastPathError>;

fn map_error(map: &'static str) -> impl Fn(aya::maps::MapError) -> FastPathError {
    move |error| FastPathError::Map { map, detail: error.to_string() }
}

/// A client's slot index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientSlot(pub u32);

/// A server's slot index, relative to the server range (what a client's link word holds).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ServerSlot(pub u32);

impl ServerSlot {
    pub fn pool(self) -> u32 {
        self.0 / POOL_SERVERS_MAX
    }
}

/// The loaded programs, their maps and the shared arrays.
pub struct FastPath {
    /// Keeps the programs and their attachments alive.
    _ebpf: Ebpf,
    clients: Mutex<SockHash<MapData, u64>>,
    servers: Mutex<SockHash<MapData, u64>>,
    slot_of: Mutex<HashMap<MapData, u64, u32>>,
    slots: SharedArray<Slot>,
    pools: SharedArray<PoolEntry>,
    counters: PerCpuArray<MapData, Counters>,
    pool_counters: PerCpuArray<MapData, PoolCounters>,
    handoffs: handoff::Handoffs,
    free_clients: Mutex<Vec<u32>>,
    /// Free server slots per pool (relative indexes within the pool's range), and pool names.
    free_servers: Mutex<Vec<Vec<u32>>>,
    pool_names: Mutex<StdHashMap<String, u32>>,
    /// Pool indexes handed out (the entries of `pools` in use).
    pools_used: AtomicU32,
    /// `PoolEntry::quiet_from` for pools handed out from now on.
    quiet_from: AtomicU32,
    /// `PoolEntry::queue_behind` for pools handed out from now on.
    queue_behind: AtomicU32,
    program_ids: Vec<(&'static str, u32)>,
    /// Workload mirroring, loaded by `enable_mirroring` (see the mirror module).
    mirror: Mutex<Option<mirror::Mirror>>,
    /// Parked clients' hang-ups (see the park module).
    hangups: park::HangupWatch,
}

impl FastPath {
    /// Loads and attaches both programs. Fails without CAP_BPF + CAP_NET_ADMIN or on old kernels.
    pub fn load() -> Result<FastPath> {
        let mut ebpf = Ebpf::load(PROGRAMS).map_err(|e| FastPathError::Load(e.to_string()))?;
        let clients = sock_hash(&mut ebpf, "fp_clients")?;
        let servers = sock_hash(&mut ebpf, "fp_servers")?;
        let mut program_ids = Vec::new();
        for (name, map) in [("fp_client", &clients), ("fp_server", &servers)] {
            let program = load_sk_skb(&mut ebpf, name)?;
            program.attach(map.fd()).map_err(|e| FastPathError::Load(format!("attaching {name}: {e}")))?;
            let id = program.info().map(|info| info.id()).unwrap_or(0);
            program_ids.push((name, id));
        }
        let slot_of = HashMap::try_from(take_map(&mut ebpf, "fp_slot_of")?).map_err(map_error("fp_slot_of"))?;
        let slots = SharedArray::map(take_map(&mut ebpf, "fp_slots")?, SLOTS as usize, "fp_slots")?;
        let pools = SharedArray::map(take_map(&mut ebpf, "fp_pools")?, POOLS_MAX as usize, "fp_pools")?;
        let counters = PerCpuArray::try_from(take_map(&mut ebpf, "fp_counters")?).map_err(map_error("fp_counters"))?;
        let pool_counters =
            PerCpuArray::try_from(take_map(&mut ebpf, "fp_pool_counts")?).map_err(map_error("fp_pool_counts"))?;
        let handoffs = RingBuf::try_from(take_map(&mut ebpf, "fp_handoffs")?).map_err(map_error("fp_handoffs"))?;
        Ok(FastPath {
            _ebpf: ebpf,
            clients: Mutex::new(clients),
            servers: Mutex::new(servers),
            slot_of: Mutex::new(slot_of),
            slots,
            pools,
            counters,
            pool_counters,
            handoffs: handoff::Handoffs::new(handoffs),
            free_clients: Mutex::new((0..CLIENT_SLOTS).rev().collect()),
            free_servers: Mutex::new((0..POOLS_MAX).map(|_| (0..POOL_SERVERS_MAX).rev().collect()).collect()),
            pool_names: Mutex::new(StdHashMap::new()),
            pools_used: AtomicU32::new(0),
            quiet_from: AtomicU32::new(HANDOFF_QUIET_FROM),
            queue_behind: AtomicU32::new(0),
            program_ids,
            mirror: Mutex::new(None),
            hangups: park::HangupWatch::new()?,
        })
    }

    /// The kernel pool index of a pool (by its stable name), allocated on first use.
    pub fn pool_index(&self, name: &str) -> Option<u32> {
        let mut names = lock(&self.pool_names);
        if let Some(&index) = names.get(name) {
            return Some(index);
        }
        let index = u32::try_from(names.len()).ok().filter(|&index| index < POOLS_MAX)?;
        names.insert(name.to_string(), index);
        self.pool(index).quiet_from.store(self.quiet_from.load(Ordering::Acquire), Ordering::Release);
        self.pool(index).queue_behind.store(self.queue_behind.load(Ordering::Acquire), Ordering::Release);
        self.pools_used.store(index + 1, Ordering::Release);
        Some(index)
    }

    pub fn slot(&self, index: u32) -> &Slot {
        &self.slots.as_slice()[index as usize]
    }

    pub fn client(&self, client: ClientSlot) -> &Slot {
        self.slot(client.0)
    }

    pub fn server(&self, server: ServerSlot) -> &Slot {
        self.slot(CLIENT_SLOTS + server.0)
    }

    pub fn pool(&self, pool: u32) -> &PoolEntry {
        &self.pools.as_slice()[pool as usize]
    }

    /// Puts a logged-in client's socket under the client program with its gate open. Call it
    /// before the login's final ReadyForQuery: bytes queued before the insert never reach it.
    /// `message_max`: longer messages go to user space (which refuses them).
    /// `params`: the id of the client's parameter values (see [`FastPath::set_params`]).
    pub fn add_client(&self, socket: &impl AsRawFd, pool: u32, message_max: u32, params: u16) -> Result<ClientSlot> {
        let index = lock(&self.free_clients).pop().ok_or(FastPathError::Full("client"))?;
        let cookie = socket_cookie(socket.as_raw_fd())?;
        let slot = self.slot(index);
        reset_framing(slot);
        slot.link.store(0, Ordering::Relaxed);
        slot.gate.store(GATE_FAST, Ordering::Relaxed);
        slot.cookie.store(cookie, Ordering::Relaxed);
        slot.redirected.store(0, Ordering::Relaxed);
        slot.message_max.store(message_max, Ordering::Relaxed);
        slot.params.store(params, Ordering::Relaxed);
        slot.owner.store(0, Ordering::Relaxed);
        slot.pool.store(pool, Ordering::Release);
        let inserted = self.index_socket(cookie, index, socket, &self.clients, "fp_clients");
        if let Err(error) = inserted {
            lock(&self.free_clients).push(index);
            return Err(error);
        }
        Ok(ClientSlot(index))
    }

    /// Takes a client out of the maps (its socket is closing) and frees its slot.
    pub fn remove_client(&self, client: ClientSlot) {
        let cookie = self.client(client).cookie.load(Ordering::Relaxed);
        let _ = lock(&self.clients).remove(&cookie);
        let _ = lock(&self.slot_of).remove(&cookie);
        self.client(client).gate.store(0, Ordering::Release);
        lock(&self.free_clients).push(client.0);
    }

    /// Puts a server's socket under the server program, held by user space.
    pub fn add_server(&self, socket: &impl AsRawFd, pool: u32) -> Result<ServerSlot> {
        let relative = lock(&self.free_servers)[pool as usize].pop().ok_or(FastPathError::Full("server"))?;
        let server = ServerSlot(pool * POOL_SERVERS_MAX + relative);
        let cookie = socket_cookie(socket.as_raw_fd())?;
        let slot = self.server(server);
        reset_framing(slot);
        slot.cookie.store(cookie, Ordering::Relaxed);
        slot.redirected.store(0, Ordering::Relaxed);
        slot.peer.store(NO_PEER, Ordering::Relaxed);
        slot.pool.store(pool, Ordering::Relaxed);
        slot.params.store(PARAMS_UNKNOWN, Ordering::Relaxed);
        slot.owner.store(OWNER_USER, Ordering::Release);
        self.pool(pool).servers.fetch_max(relative + 1, Ordering::AcqRel);
        let inserted = self.index_socket(cookie, CLIENT_SLOTS + server.0, socket, &self.servers, "fp_servers");
        if let Err(error) = inserted {
            slot.owner.store(OWNER_ABSENT, Ordering::Release);
            lock(&self.free_servers)[pool as usize].push(relative);
            return Err(error);
        }
        Ok(server)
    }

    /// Forgets a server user space holds (it is being closed).
    pub fn remove_server(&self, server: ServerSlot) {
        let slot = self.server(server);
        let cookie = slot.cookie.load(Ordering::Relaxed);
        slot.owner.store(OWNER_ABSENT, Ordering::Release);
        let _ = lock(&self.servers).remove(&cookie);
        let _ = lock(&self.slot_of).remove(&cookie);
        lock(&self.free_servers)[server.pool() as usize].push(server.0 % POOL_SERVERS_MAX);
    }

    fn index_socket(
        &self,
        cookie: u64,
        index: u32,
        socket: &impl AsRawFd,
        map: &Mutex<SockHash<MapData, u64>>,
        name: &'static str,
    ) -> Result<()> {
        lock(&self.slot_of).insert(cookie, index, 0).map_err(map_error("fp_slot_of"))?;
        let inserted = lock(map).insert(cookie, socket.as_raw_fd(), 0).map_err(map_error(name));
        if inserted.is_err() {
            let _ = lock(&self.slot_of).remove(&cookie);
        }
        inserted
    }

    /// Sums the per-CPU counters.
    pub fn counters(&self) -> Counters {
        let mut total = Counters::default();
        if let Ok(values) = self.counters.get(&0, 0) {
            for cpu in values.iter() {
                add_counters(&mut total, cpu);
            }
        }
        total
    }

    /// Where a pool's bytes went, summed over CPUs.
    pub fn pool_counters(&self, pool: u32) -> PoolCounters {
        let mut total = PoolCounters::default();
        if let Ok(values) = self.pool_counters.get(&pool, 0) {
            for cpu in values.iter() {
                total.add(cpu);
            }
        }
        total
    }

    /// Each program's name, id, run count and total run time in ns (counted only while
    /// `kernel.bpf_stats_enabled` is 1).
    pub fn program_stats(&self) -> Vec<ProgramStats> {
        program_stats(&self.program_ids)
    }
}

/// A program's cost from `bpf_stats`.
#[derive(Debug, Clone, Copy)]
pub struct ProgramStats {
    pub name: &'static str,
    pub id: u32,
    pub run_count: u64,
    pub run_time_ns: u64,
}

fn program_stats(ids: &[(&'static str, u32)]) -> Vec<ProgramStats> {
    ids.iter()
        .map(|&(name, id)| {
            let info = aya::programs::loaded_programs().flatten().find(|info| info.id() == id);
            ProgramStats {
                name,
                id,
                run_count: info.as_ref().map_or(0, |info| info.run_count()),
                run_time_ns: info.as_ref().map_or(0, |info| info.run_time().as_nanos() as u64),
            }
        })
        .collect()
}

/// Loads an `sk_skb` program of an object (attaching is the caller's: maps and attach types differ).
pub(crate) fn load_sk_skb<'a>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut SkSkb> {
    let program: &mut SkSkb = ebpf
        .program_mut(name)
        .ok_or_else(|| FastPathError::Load(format!("{name} missing from the object")))?
        .try_into()
        .map_err(|e: aya::programs::ProgramError| FastPathError::Load(e.to_string()))?;
    program.load().map_err(|e| FastPathError::Load(format!("{name}: {e}")))?;
    Ok(program)
}

fn add_counters(total: &mut Counters, cpu: &Counters) {
    total.client_runs += cpu.client_runs;
    total.server_runs += cpu.server_runs;
    total.bytes_to_servers += cpu.bytes_to_servers;
    total.bytes_to_clients += cpu.bytes_to_clients;
    total.transactions += cpu.transactions;
    total.passes_no_server += cpu.passes_no_server;
    total.passes_unsafe += cpu.passes_unsafe;
    total.passes_slow += cpu.passes_slow;
    total.passes_idle_server += cpu.passes_idle_server;
    total.handoffs += cpu.handoffs;
    total.redirect_failures += cpu.redirect_failures;
    total.handoffs_quiet += cpu.handoffs_quiet;
    total.queued += cpu.queued;
    total.queue_broken += cpu.queue_broken;
    total.taken_from_handoff += cpu.taken_from_handoff;
    total.passes_announced += cpu.passes_announced;
}

pub fn reset_framing(slot: &Slot) {
    slot.frame_left.store(0, Ordering::Relaxed);
    slot.stash_len.store(0, Ordering::Relaxed);
    slot.flags.store(0, Ordering::Relaxed);
    slot.pass_skip.store(0, Ordering::Relaxed);
}

fn sock_hash(ebpf: &mut Ebpf, name: &'static str) -> Result<SockHash<MapData, u64>> {
    SockHash::try_from(take_map(ebpf, name)?).map_err(map_error(name))
}

fn take_map(ebpf: &mut Ebpf, name: &'static str) -> Result<Map> {
    ebpf.take_map(name).ok_or_else(|| FastPathError::Load(format!("map {name} missing from the object")))
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The kernel's 64-bit identity of a socket (`SO_COOKIE`), the key of the socket maps.
pub fn socket_cookie(fd: RawFd) -> Result<u64> {
    let mut cookie: u64 = 0;
    let mut length = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `length` bytes into `cookie`, which is that large.
    let result =
        unsafe { libc::getsockopt(fd, libc::SOL_SOCKET, libc::SO_COOKIE, (&raw mut cookie).cast(), &mut length) };
    if result != 0 {
        return Err(FastPathError::Socket(std::io::Error::last_os_error()));
    }
    Ok(cookie)
}

/// An mmap-ed `BPF_F_MMAPABLE` array map, viewed as a slice of atomics.
struct SharedArray<T> {
    _map: MapData,
    base: *mut T,
    len: usize,
    bytes: usize,
}

// SAFETY: every element is made of atomics; the mapping lives as long as the value.
unsafe impl<T: Sync> Send for SharedArray<T> {}
// SAFETY: as above.
unsafe impl<T: Sync> Sync for SharedArray<T> {}

impl<T> SharedArray<T> {
    fn map(map: Map, len: usize, name: &'static str) -> Result<Self> {
        let Map::Array(data) = map else {
            return Err(FastPathError::Map { map: name, detail: "not an array".into() });
        };
        let page = 4096;
        let bytes = (len * std::mem::size_of::<T>()).div_ceil(page) * page;
        let fd = data.fd().as_fd().as_raw_fd();
        // SAFETY: a shared mapping of the map's fd, sized as the kernel laid it out (elements of
        // size_of::<T>(), a multiple of 8, from offset 0); checked for MAP_FAILED below.
        let base = unsafe {
            libc::mmap(std::ptr::null_mut(), bytes, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0)
        };
        if base == libc::MAP_FAILED {
            let detail = std::io::Error::last_os_error().to_string();
            return Err(FastPathError::Map { map: name, detail: format!("mmap: {detail}") });
        }
        Ok(SharedArray { _map: data, base: base.cast(), len, bytes })
    }

    fn as_slice(&self) -> &[T] {
        // SAFETY: `base` maps `len` initialized elements (the kernel zero-fills array maps) for
        // the life of `self`; T is made of atomics, so shared references are sound.
        unsafe { std::slice::from_raw_parts(self.base, self.len) }
    }
}

impl<T> Drop for SharedArray<T> {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `map`; no reference outlives `self`.
        unsafe { libc::munmap(self.base.cast(), self.bytes) };
    }
}
