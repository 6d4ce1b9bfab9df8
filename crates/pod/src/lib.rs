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
//!          └─ host-0.log (redo, epochs) ──── recovery replays all logs ──── host-1.log ─┘
//! ```
//!
//! Invariants (each module documents its own):
//! - the region holds offsets, never pointers; shared structs are `#[repr(C)]` atomics with
//!   compile-time layout assertions;
//! - HWcc bytes in use never exceed the budget (over budget: evict with CLOCK, else FAIL_OOM);
//! - a tuple's lock state lives in exactly one tier and moves with it; a pinned CAT never moves out;
//! - strict 2PL NO_WAIT: all locks are held before the commit TID is chosen, TIDs increase per key;
//! - a transaction is acknowledged only once its epoch is durable on every host;
//! - CXL contents are soft state: recovery = initial load + every host's log, nothing else.

pub mod alloc;
pub mod baseline;
pub mod bench;
pub mod checker;
pub mod cli;
pub mod coherence;
pub mod config;
pub mod cxl_index;
pub mod error;
pub mod history;
pub mod host;
pub mod launcher;
pub mod log;
pub mod message;
pub mod partition;
pub mod recovery;
pub mod region;
pub mod ring;
pub mod rng;
pub mod stats;
pub mod tigon;
pub mod txn;
pub mod word;
pub mod workload;

pub use config::{PodConfig, Protocol};
pub use error::{PodError, Result};
pub use launcher::{Pod, RunReport};
