//! The emulated CXL memory: one `memfd` mapped `MAP_SHARED` by every host process, each at its own
//! address, so the region holds offsets ([`Off`]) and never pointers.
//!
//! ```text
//!  0        4 KiB          +8×4 KiB        rings          HWcc arena         SWcc arena        ring payloads     model traces
//!  | Header | HostShared×8 | RingControl×8 | host0 … hostN  | host0 … hostN   | host0 … hostN    | host0 … hostN |
//!    epochs,  epochs, stats   head/tail,      index buckets,   tuple blocks      RING_SLOTS ×      latency model
//!    phase    errors          ready flags     CatNodes (budget) (line-aligned)    RING_SLOT_BYTES   only (sparse)
//! ```
//!
//! Everything in the header, host slots, ring controls and HWcc arena is an atomic in place, so a
//! `&T` to a shared struct is sound in every process ([`Shared`]). The SWcc arena and the ring
//! payloads are plain bytes reached only through a coherence back-end
//! ([`crate::coherence::CoherenceOps`]), which is what lets the simulator show a missing flush.

use std::marker::PhantomData;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

use crate::error::{PodError, Result};

/// Most hosts a pod can have (the per-host cache-valid bits in the metadata word reserve 16; the
/// issue asks for up to 8).
pub const HOSTS_MAX: usize = 8;
/// Cache line size: the unit of every flush, write-back and of the simulated caches.
pub const LINE_BYTES: u64 = 64;
/// Slots per host inbox ring.
pub const RING_SLOTS: usize = 64;
/// Bytes per ring slot, header included (Tigon uses 2 KB for itself, 64 KB for its baselines; the
/// largest message here is a 2PC prepare with ten 1 KB values).
pub const RING_SLOT_BYTES: u64 = 16 * 1024;
/// Words of counters each host publishes at the end of a run.
pub const STATS_WORDS: usize = 192;
/// Bytes of error text each host can leave for the launcher.
pub const ERROR_BYTES: usize = 512;
/// Magic at offset 0 ("BYPASSPD").
pub const MAGIC: u64 = 0x4259_5041_5353_5044;
/// Bumped whenever a shared layout changes.
pub const LAYOUT_VERSION: u64 = 5;

/// Records each host can trace in one run for the latency model ([`crate::staleness`]; 16 bytes
/// each; the area is sparse until written).
pub const TRACE_RECORDS_PER_HOST: u64 = 1 << 23;
/// Bytes of one trace record: the block offset, then time, lines and kind.
pub const TRACE_RECORD_BYTES: u64 = 16;
/// Bytes reserved for one host's inbox control words ([`crate::ring`] asserts its struct fits).
pub const RING_CONTROL_BYTES: u64 = 4 * LINE_BYTES + RING_SLOTS as u64;

const HEADER_BYTES: u64 = 4096;
const TRACE_BYTES_PER_HOST: u64 = TRACE_RECORDS_PER_HOST * TRACE_RECORD_BYTES;
const HOST_SHARED_BYTES: u64 = 8192;

/// A shared struct made only of atomics (or arrays of them) with a fixed `#[repr(C)]` layout.
///
/// # Safety
/// Every bit pattern must be a valid value and all mutation must go through interior mutability,
/// so that a `&Self` into memory other processes write concurrently is sound.
pub unsafe trait Shared: Sized {}

/// A typed offset from the region base. Stored in shared memory instead of a pointer.
#[repr(transparent)]
pub struct Off<T> {
    raw: u64,
    _type: PhantomData<fn() -> T>,
}

impl<T> Off<T> {
    pub const NULL: Off<T> = Off { raw: 0, _type: PhantomData };

    pub const fn new(raw: u64) -> Off<T> {
        Off { raw, _type: PhantomData }
    }
    pub const fn raw(self) -> u64 {
        self.raw
    }
    pub const fn is_null(self) -> bool {
        self.raw == 0
    }
}

impl<T> Clone for Off<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Off<T> {}
impl<T> PartialEq for Off<T> {
    fn eq(&self, other: &Self) -> bool {
        self.raw == other.raw
    }
}
impl<T> Eq for Off<T> {}
impl<T> std::fmt::Debug for Off<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Off({:#x})", self.raw)
    }
}

/// The region header: layout parameters and the pod-wide control words.
#[repr(C)]
pub struct Header {
    pub magic: AtomicU64,
    pub version: AtomicU64,
    pub total_bytes: AtomicU64,
    pub hosts: AtomicU64,
    pub hwcc_per_host_bytes: AtomicU64,
    pub swcc_per_host_bytes: AtomicU64,
    pub index_buckets_per_host: AtomicU64,
    _pad0: AtomicU64,
    /// The global epoch of group commit (advanced by host 0's logger).
    pub global_epoch: AtomicU64,
    _pad1: [AtomicU64; 7],
    /// [`Phase`] of the run, set by the launcher.
    pub phase: AtomicU64,
    /// Hosts that finished loading.
    pub ready_hosts: AtomicU64,
    /// Hosts that stopped running transactions (they keep serving messages until all are done).
    pub done_hosts: AtomicU64,
    /// Hosts that finished their post-run work (checks, stats) and may exit.
    pub finished_hosts: AtomicU64,
    /// The pod-wide durable epoch recovered from the logs before this start (0 on a fresh pod).
    pub recovered_epoch: AtomicU64,
    _pad2: [AtomicU64; 3],
}
const _: () = assert!(std::mem::size_of::<Header>() == 3 * LINE_BYTES as usize);
const _: () = assert!(std::mem::size_of::<Header>() as u64 <= HEADER_BYTES);
// SAFETY: only atomics.
unsafe impl Shared for Header {}

/// Run phases, in order; hosts poll the header to follow them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u64)]
pub enum Phase {
    Loading = 0,
    Warmup = 1,
    Measure = 2,
    Stop = 3,
}

impl Phase {
    pub fn from_raw(raw: u64) -> Phase {
        match raw {
            0 => Phase::Loading,
            1 => Phase::Warmup,
            2 => Phase::Measure,
            _ => Phase::Stop,
        }
    }
}

/// Per-host words other hosts and the launcher read.
#[repr(C)]
pub struct HostShared {
    /// [`HostStatus`].
    pub status: AtomicU64,
    /// Epoch of the worker's open log buffer; `EPOCH_IDLE` when it has none.
    pub worker_epoch: AtomicU64,
    /// Highest epoch whose log records of this host are on disk.
    pub durable_epoch: AtomicU64,
    /// Transactions acknowledged (their epoch durable pod-wide); read by crash tests after a kill.
    pub acked_txns: AtomicU64,
    /// HWcc bytes this host has allocated (index + metadata, + data under NoSWcc).
    pub hwcc_used_bytes: AtomicU64,
    pub error_len: AtomicU64,
    /// Epoch below which this host's latest usable checkpoint covers every log record of every
    /// host for its rows (crate::checkpoint); loggers delete segments below the pod's minimum.
    pub checkpoint_floor: AtomicU64,
    _pad: [AtomicU64; 1],
    pub error: [AtomicU8; ERROR_BYTES],
    pub stats: [AtomicU64; STATS_WORDS],
    /// Latency model only ([`crate::staleness`]): records in this host's trace, and the logical
    /// times of its measured window's first and last reads.
    pub trace_records: AtomicU64,
    pub trace_window_start: AtomicU64,
    pub trace_window_end: AtomicU64,
}
const _: () = assert!(std::mem::size_of::<HostShared>() as u64 <= HOST_SHARED_BYTES);
// SAFETY: only atomics.
unsafe impl Shared for HostShared {}

pub const EPOCH_IDLE: u64 = u64::MAX;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u64)]
pub enum HostStatus {
    Starting = 0,
    Running = 1,
    Finished = 2,
    Failed = 3,
}

/// Where everything is, computed identically by the launcher and every host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub hosts: usize,
    pub host_shared: u64,
    pub ring_controls: u64,
    pub ring_control_bytes: u64,
    pub hwcc: u64,
    pub hwcc_per_host: u64,
    pub swcc: u64,
    pub swcc_per_host: u64,
    pub payloads: u64,
    /// Latency-model traces, one area per host ([`crate::staleness`]); not part of the pod.
    pub traces: u64,
    pub total: u64,
}

impl Layout {
    pub fn new(hosts: usize, hwcc_per_host: u64, swcc_per_host: u64) -> Layout {
        assert!((1..=HOSTS_MAX).contains(&hosts));
        let page = 4096;
        let hwcc_per_host = round_up(hwcc_per_host, page);
        let swcc_per_host = round_up(swcc_per_host, page);
        let ring_control_bytes = round_up(RING_CONTROL_BYTES, LINE_BYTES);
        let host_shared = HEADER_BYTES;
        let ring_controls = host_shared + HOSTS_MAX as u64 * HOST_SHARED_BYTES;
        let hwcc = round_up(ring_controls + HOSTS_MAX as u64 * ring_control_bytes, page);
        let swcc = hwcc + hosts as u64 * hwcc_per_host;
        let payloads = swcc + hosts as u64 * swcc_per_host;
        let traces = payloads + hosts as u64 * RING_SLOTS as u64 * RING_SLOT_BYTES;
        let total = traces + hosts as u64 * TRACE_BYTES_PER_HOST;
        Layout {
            hosts,
            host_shared,
            ring_controls,
            ring_control_bytes,
            hwcc,
            hwcc_per_host,
            swcc,
            swcc_per_host,
            payloads,
            traces,
            total,
        }
    }

    pub fn host_shared(&self, host: usize) -> Off<HostShared> {
        assert!(host < HOSTS_MAX);
        Off::new(self.host_shared + host as u64 * HOST_SHARED_BYTES)
    }
    /// First byte of `host`'s inbox control words.
    pub fn ring_control(&self, host: usize) -> u64 {
        assert!(host < self.hosts);
        self.ring_controls + host as u64 * self.ring_control_bytes
    }
    /// First byte of `host`'s HWcc slice (its CXL index buckets come first).
    pub fn hwcc_slice(&self, host: usize) -> u64 {
        assert!(host < self.hosts);
        self.hwcc + host as u64 * self.hwcc_per_host
    }
    pub fn swcc_slice(&self, host: usize) -> u64 {
        assert!(host < self.hosts);
        self.swcc + host as u64 * self.swcc_per_host
    }
    /// Record `at` of `host`'s latency-model trace.
    pub fn trace_record(&self, host: usize, at: u64) -> u64 {
        assert!(host < self.hosts && at < TRACE_RECORDS_PER_HOST);
        self.traces + host as u64 * TRACE_BYTES_PER_HOST + at * TRACE_RECORD_BYTES
    }
    /// First byte of ring slot `slot` of `host`'s inbox.
    pub fn payload_slot(&self, host: usize, slot: usize) -> u64 {
        assert!(host < self.hosts && slot < RING_SLOTS);
        self.payloads + (host * RING_SLOTS + slot) as u64 * RING_SLOT_BYTES
    }
}

pub const fn round_up(value: u64, to: u64) -> u64 {
    value.div_ceil(to) * to
}

/// One mapping of the shared memfd in this process.
pub struct Region {
    base: *mut u8,
    len: u64,
    fd: OwnedFd,
}

// SAFETY: the mapping is process-wide and all shared access goes through atomics or the coherence
// back-ends; the raw pointer is just the base address.
unsafe impl Send for Region {}
// SAFETY: as above.
unsafe impl Sync for Region {}

impl Region {
    /// Creates a zero-filled memfd of `len` bytes and maps it.
    pub fn create(len: u64) -> Result<Region> {
        let name = c"bypass-pod-cxl";
        // SAFETY: a valid C string and flags; the result is checked.
        let raw = unsafe { libc::memfd_create(name.as_ptr(), 0) };
        if raw < 0 {
            return Err(PodError::region_errno("memfd_create"));
        }
        // SAFETY: `raw` is a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let file = std::fs::File::from(fd);
        file.set_len(len).map_err(PodError::region("ftruncate"))?;
        Region::map(OwnedFd::from(file), len)
    }

    /// Maps the same memfd again (a fresh address: hosts must not depend on where it lands).
    pub fn remap(&self) -> Result<Region> {
        let fd = self.fd.try_clone().map_err(PodError::region("dup"))?;
        Region::map(fd, self.len)
    }

    fn map(fd: OwnedFd, len: u64) -> Result<Region> {
        // SAFETY: mapping a descriptor we own with a checked length; the result is checked.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(PodError::region_errno("mmap"));
        }
        Ok(Region { base: base.cast(), len, fd })
    }

    pub fn len(&self) -> u64 {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
    /// The address this process mapped the region at (only for tests showing mappings differ).
    pub fn base_address(&self) -> usize {
        self.base as usize
    }

    /// Zeroes the whole region by releasing its pages (restart after a crash: CXL contents are
    /// soft state). Only while no host runs.
    pub fn reset(&self) -> Result<()> {
        // SAFETY: punching a hole in our own memfd; the range is within its size.
        let rc = unsafe {
            libc::fallocate(
                self.fd.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                0,
                self.len as libc::off_t,
            )
        };
        if rc != 0 {
            return Err(PodError::region_errno("fallocate(PUNCH_HOLE)"));
        }
        Ok(())
    }

    /// A shared struct at `off`.
    pub fn get<T: Shared>(&self, off: Off<T>) -> &T {
        assert!(!off.is_null(), "null offset");
        self.shared_at(off.raw())
    }

    fn shared_at<T: Shared>(&self, raw: u64) -> &T {
        assert!(raw + std::mem::size_of::<T>() as u64 <= self.len, "offset {raw:#x} out of the region");
        assert!(raw.is_multiple_of(std::mem::align_of::<T>() as u64), "offset {raw:#x} misaligned");
        // SAFETY: in bounds and aligned (asserted); `T: Shared` is valid for any bits and only
        // mutated through atomics, so a shared reference is sound while the mapping lives (`&self`).
        unsafe { &*(self.base.add(raw as usize) as *const T) }
    }

    pub fn header(&self) -> &Header {
        self.shared_at(0)
    }

    /// An `AtomicU64` in place (index buckets, words).
    pub fn atomic_u64(&self, raw: u64) -> &AtomicU64 {
        assert!(raw + 8 <= self.len && raw.is_multiple_of(8), "atomic offset {raw:#x} invalid");
        // SAFETY: in bounds and 8-aligned (asserted); the memory is only accessed atomically.
        unsafe { AtomicU64::from_ptr(self.base.add(raw as usize).cast()) }
    }

    /// Copies bytes out of the region as they are in memory right now (coherence back-ends only).
    pub(crate) fn load_bytes(&self, raw: u64, out: &mut [u8]) {
        assert!(raw + out.len() as u64 <= self.len, "read {raw:#x}+{} out of the region", out.len());
        // SAFETY: in bounds (asserted). Other processes may write these bytes concurrently only
        // when the protocol says the data is not ours to read yet; like device memory we copy
        // whatever is there and the protocol discards it.
        unsafe { std::ptr::copy_nonoverlapping(self.base.add(raw as usize), out.as_mut_ptr(), out.len()) }
    }

    /// Copies bytes into the region (coherence back-ends only).
    pub(crate) fn store_bytes(&self, raw: u64, data: &[u8]) {
        assert!(raw + data.len() as u64 <= self.len, "write {raw:#x}+{} out of the region", data.len());
        // SAFETY: in bounds (asserted); writers hold the tuple's write lock or own the ring slot.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.base.add(raw as usize), data.len()) }
    }

    /// Address of a line (for the real flush instructions).
    pub(crate) fn line_address(&self, raw: u64) -> *const u8 {
        assert!(raw < self.len);
        // SAFETY: in bounds (asserted).
        unsafe { self.base.add(raw as usize) }
    }

    /// Writes the header of a fresh region.
    pub fn init_header(&self, layout: &Layout, index_buckets_per_host: u64) {
        let header = self.header();
        header.version.store(LAYOUT_VERSION, Ordering::Relaxed);
        header.total_bytes.store(layout.total, Ordering::Relaxed);
        header.hosts.store(layout.hosts as u64, Ordering::Relaxed);
        header.hwcc_per_host_bytes.store(layout.hwcc_per_host, Ordering::Relaxed);
        header.swcc_per_host_bytes.store(layout.swcc_per_host, Ordering::Relaxed);
        header.index_buckets_per_host.store(index_buckets_per_host, Ordering::Relaxed);
        header.global_epoch.store(1, Ordering::Relaxed);
        header.phase.store(Phase::Loading as u64, Ordering::Relaxed);
        header.magic.store(MAGIC, Ordering::Release);
    }

    /// Checks that the region was initialised with `layout`.
    pub fn verify_header(&self, layout: &Layout) -> Result<()> {
        let header = self.header();
        let magic = header.magic.load(Ordering::Acquire);
        let version = header.version.load(Ordering::Relaxed);
        let matches = magic == MAGIC
            && version == LAYOUT_VERSION
            && header.total_bytes.load(Ordering::Relaxed) == layout.total
            && header.hosts.load(Ordering::Relaxed) == layout.hosts as u64;
        if matches {
            Ok(())
        } else {
            Err(PodError::BadRegion { magic, version })
        }
    }

    pub fn host_shared(&self, layout: &Layout, host: usize) -> &HostShared {
        self.get(layout.host_shared(host))
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what `map` mapped; no references outlive `&self`.
        unsafe { libc::munmap(self.base.cast(), self.len as usize) };
    }
}

impl HostShared {
    /// Leaves an error message for the launcher (truncated to [`ERROR_BYTES`]).
    pub fn set_error(&self, message: &str) {
        let bytes = &message.as_bytes()[..message.len().min(ERROR_BYTES)];
        for (slot, byte) in self.error.iter().zip(bytes) {
            slot.store(*byte, Ordering::Relaxed);
        }
        self.error_len.store(bytes.len() as u64, Ordering::Release);
        self.status.store(HostStatus::Failed as u64, Ordering::Release);
    }

    pub fn error_text(&self) -> Option<String> {
        let len = self.error_len.load(Ordering::Acquire) as usize;
        if len == 0 {
            return None;
        }
        let bytes: Vec<u8> = self.error[..len.min(ERROR_BYTES)].iter().map(|b| b.load(Ordering::Relaxed)).collect();
        Some(String::from_utf8_lossy(&bytes).into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_places_arenas_without_overlap() {
        // Goal: the layout's areas are ordered, aligned and disjoint. Method: compute one and compare bounds.
        let layout = Layout::new(4, 1 << 20, 8 << 20);
        assert!(layout.ring_controls >= layout.host_shared + HOSTS_MAX as u64 * HOST_SHARED_BYTES);
        assert!(layout.hwcc >= layout.ring_controls + HOSTS_MAX as u64 * layout.ring_control_bytes);
        assert_eq!(layout.swcc, layout.hwcc + 4 * (1 << 20));
        assert_eq!(layout.payloads, layout.swcc + 4 * (8 << 20));
        assert_eq!(layout.payload_slot(3, RING_SLOTS - 1) + RING_SLOT_BYTES, layout.traces);
        assert_eq!(layout.trace_record(3, TRACE_RECORDS_PER_HOST - 1) + 16, layout.total);
        assert_eq!(layout.hwcc % 4096, 0);
    }

    #[test]
    fn two_mappings_see_the_same_bytes_at_different_addresses() {
        // Goal: the region is shared memory reached by offsets. Method: write through one mapping, read
        // through a second mapping of the same memfd.
        let region = Region::create(1 << 20).expect("memfd");
        let other = region.remap().expect("remap");
        assert_ne!(region.base_address(), other.base_address());
        region.atomic_u64(4096).store(0xfeed, Ordering::Release);
        assert_eq!(other.atomic_u64(4096).load(Ordering::Acquire), 0xfeed);
        region.store_bytes(8192, b"cxl");
        let mut out = [0u8; 3];
        other.load_bytes(8192, &mut out);
        assert_eq!(&out, b"cxl");
        region.reset().expect("punch hole");
        assert_eq!(other.atomic_u64(4096).load(Ordering::Acquire), 0);
    }

    #[test]
    fn header_round_trip_and_mismatch_is_an_error() {
        // Goal: hosts refuse a region of another layout. Method: init with one layout, verify with another.
        let layout = Layout::new(2, 1 << 16, 1 << 16);
        let region = Region::create(layout.total).expect("memfd");
        region.init_header(&layout, 64);
        region.verify_header(&layout).expect("same layout");
        let other = Layout::new(3, 1 << 16, 1 << 16);
        assert!(matches!(region.verify_header(&other), Err(PodError::BadRegion { .. })));
    }
}
