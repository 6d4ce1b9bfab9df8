//! `bypass-pod`: a multi-host transactional store on an emulated CXL pod, after Tigon (OSDI '25)
//! and its Pasha architecture (CIDR '25), with the DS2PL+ and OCC+ baselines in the same code.
//!
//! Each host is a process with its partition in private DRAM. Only tuples that several hosts
//! touch (CATs) move into the shared region — an 8-byte metadata word in the small
//! hardware-coherent (HWcc) arena, the data in the large non-coherent (SWcc) arena under software
//! cache coherence — so every host can lock, read and write them directly and no transaction
//! needs two-phase commit.
//!
//! ```text
//!   host 0 (process)                 shared region (memfd)                   host 1 (process)
//!  ┌──────────────────┐   ┌──────────────────────────────────────────┐   ┌──────────────────┐
//!  │ partition (DRAM) │   │ header: epochs, phase   per-host slots    │   │ partition (DRAM) │
//!  │  rows, locks,    │◄─►│ rings: MPSC inbox per host (futex)        │◄─►│                  │
//!  │  shortcut ───────┼──►│ HWcc: CXL index + CatNode{word,key,pins}  │◄──┼─ remote lookups  │
//!  │ worker + logger  │   │ SWcc: tuple blocks (flush/write-back)     │   │ worker + logger  │
//!  └──────────────────┘   └──────────────────────────────────────────┘   └──────────────────┘
//!    host-0.NNNNNN.log segments + checkpoint-0.*.ckpt ── recovery ── host-1 segments + checkpoint
//! ```
//!
//! Reading order (each file imports only files above it in this list; `tests/layering.rs`
//! checks that no chain of references leads from a file back to itself):
//! `region` → `word` → `partition` → `message` → `ring` → `access` (what a transaction is) →
//! `workload` → `log` → `checkpoint` → `recovery` → `host` (one host's context) → `cat` (shared
//! tuples as a host sees them) → `owned` (a host's own rows) → `protocol` (the trait, waiting,
//! serving) → `tigon/` (`cats` move-in/out, `requester`, `scan`, `insert`) and `baseline/`
//! (`coordinator`, `participant`) → `checkpointer` → `worker` (the loop, `TxnOps`) → `launcher`.
//!
//! Invariants (each module documents its own):
//! - the region holds offsets, never pointers; shared structs are `#[repr(C)]` atomics with
//!   compile-time layout assertions;
//! - HWcc bytes in use never exceed the budget (over budget: evict with CLOCK, else FAIL_OOM);
//! - a tuple's lock state lives in exactly one tier and moves with it; a pinned CAT never moves out;
//! - strict 2PL NO_WAIT: all locks are held before the commit TID is chosen, TIDs increase per key;
//! - a transaction is acknowledged only once its epoch is durable on every host;
//! - CXL contents are soft state: recovery = newest usable checkpoint (else the initial load) +
//!   every host's log, nothing else; a log segment is deleted only once every host's checkpoint
//!   covers it;
//! - a host drops (and counts) any message it cannot use — undecodable, outside the pod's
//!   limits, a reply to nothing in flight — and carries on.
//!
//! How the pod is emulated on one machine: each host is a forked process ([`launcher`]) with
//! one worker thread (transactions and message handling) and one logger thread; the "CXL
//! memory" is a `memfd` every host maps at its own address ([`region`]). The machine keeps the
//! region coherent, so the HWcc/SWcc split is enforced by accounting (the HWcc arena is a hard
//! budget) and by the coherence back-end ([`coherence`]): real `clflushopt`/`clwb` for cost, or
//! a simulated non-coherent cache per host under which a missing flush is a stale read. Every
//! CXL event is counted and priced by a latency table ([`stats`]), so results are reported both
//! measured and modelled; which reads of shared tuples re-fetch stale lines is judged after the run
//! from per-host traces merged in logical time ([`staleness`]), so the model does not depend on
//! how two cores time-slice the hosts.
//!
//! Testing: the integration suites run on the simulated non-coherent caches by default and are
//! count-driven — a run measures until `measure_acked_min` transactions are acknowledged, so a
//! loaded machine changes how long a test takes, never what it checks; time limits are hang
//! guards only.
//!
//! Decisions that differ from Tigon's code, and why:
//! - Tigon has no recovery code (pod.md §4); here a pod-wide durable epoch holds every
//!   acknowledgement, checkpoints taken while the pod runs bound the logs, and recovery rebuilds
//!   every partition from them.
//! - No cross-host epoch-based reclamation: a CXL index lookup is only a hint, re-validated
//!   under the node's latch (key, table, block offset ≠ 0); nodes are never unmapped, a freed
//!   node's word is zero, and a reused node is re-initialised under its latch ([`cxl_index`]).
//! - `ref_cnt` (pins) lives in the HWcc node next to the word, changed only under the latch
//!   (so by plain stores on the line the latch CAS holds), and the owner pins a freshly
//!   moved-in tuple for the requester before replying, so it cannot be evicted in between.
//! - A committed write to a CAT stores and writes back only the TID line and the lines whose
//!   bytes changed (Tigon `clwb`s the whole tuple; a `clwb` of a clean line moves no data).
//! - Remote range scans and inserts (Tigon-style) are served by the owner taking the locks for
//!   the requester before it replies — the range and its next key read-locked (`tigon::scan`), a
//!   placeholder and its next key write-locked (`tigon::insert`) — rather than at Tigon's
//!   commit step; a remote delete leaves the row write-locked for the owner to remove. The owner
//!   keeps the next/prev-key bits of the word true on move-in, move-out, insert and delete. The
//!   baselines scan, insert and delete only in their own partition (typed error otherwise).
//! - The OCC baseline is Silo-style distributed OCC (lock, validate, 2PC), not Sundial: no leases.
//! - The CXL index is a bucketed hash table ([`cxl_index`]) for every table; Tigon's YCSB table
//!   and TPC-C CUSTOMER/STOCK use an OLC B+tree in CXL (4 KB pages), whose searches, inserts and
//!   removes touch more HWcc lines than a bucket and a chain node.
//! - Under NoSWcc every move-in copies the row into its fresh block. Tigon's code allocates the
//!   fresh block too but skips the copy when the DRAM row is unchanged since its last move-out
//!   (`enable_migration_optimization`), which leaves the block's previous bytes in place.

pub mod access;
pub mod alloc;
pub(crate) mod baseline;
pub(crate) mod cat;
pub mod checker;
pub mod checkpoint;
pub(crate) mod checkpointer;
pub mod coherence;
pub mod config;
pub mod cxl_index;
pub mod error;
pub(crate) mod fault;
pub mod history;
pub mod host;
pub mod launcher;
pub mod log;
pub mod message;
pub(crate) mod owned;
pub mod partition;
pub(crate) mod protocol;
pub mod recovery;
pub mod region;
pub mod ring;
pub mod rng;
pub mod staleness;
pub mod stats;
pub(crate) mod tigon;
pub mod word;
pub(crate) mod worker;
pub mod workload;

pub use config::{PodConfig, Protocol};
pub use error::{PodError, Result};
pub use launcher::{Pod, RunReport};
