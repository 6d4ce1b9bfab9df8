//! Per-query routing across PostgreSQL backends, and TCP connection hand-over so large results
//! flow from the backend straight to the client (Prism, seed 004; design:
//! shared/design/dispatch.md).
//!
//! ```text
//!                       ┌──────────── switch (tc ingress, steering table) ────────────┐
//!   client ═══ TCP ═════╪═► PASS ─► dispatcher ══ link ══► agent ── PG ──► PostgreSQL │
//!     ▲                 │   FORWARD(mac) ─────────────────► agent (VIP on lo)          │
//!     │                 │   BLOCK: drop (connection between owners)                   │
//!     └───── answers from the backend's agent straight to the client (DSR) ◄──────────┘
//! ```
//!
//! - [`dispatcher`]: owns client sessions; routes each request ([`routing`]: primary or the
//!   least-busy healthy, fresh replica); relays answers, or hands the client's connection to
//!   the backend's agent ([`config::Policy`]: relay, hand-over, hybrid) and takes it back at
//!   ReadyForQuery.
//! - [`agent`] (`bypass agent`): beside each backend; holds its PostgreSQL connections and
//!   writes answers into handed-over connections — stock PostgreSQL needs no change.
//! - [`handover`]: `TCP_REPAIR` export/import; [`steer`]: the eBPF steering table;
//!   [`link`]: the dispatcher–agent protocol (PostgreSQL messages plus control frames).
//! - [`netns`]: entering a network namespace (`--namespace` of the dispatcher and the agent);
//!   [`pglogin`]: the sans-I/O client login the dispatcher and the agent use towards PostgreSQL.
//! - Not here (measuring, not product): the network lab, load generator and payloads live in
//!   `bypass-lab` (crates/lab), `bypass bench dispatch` in `bypass-bench`, the subcommands in
//!   `bypass-cli`.
//!
//! Invariants:
//! - Exactly one host owns a client connection at any time; while it moves, the switch drops the
//!   client's packets (BLOCK), so no kernel without the connection answers with a reset. Order:
//!   hand-over = drain, BLOCK, settle, export, silent close, import, FORWARD, then write;
//!   hand-back = drain, BLOCK, settle, export, silent close, import, PASS.
//! - Settle: an owner exports only once its socket has received every segment the switch let
//!   through to it (the switch counts them per flow); a segment still queued between switch and
//!   host would otherwise meet a closed socket (reset) or be acknowledged and lost.
//! - A connection's state travels whole, however large its queues (a slow client may leave
//!   megabytes unacknowledged): control frames may exceed the link buffers.
//! - Connections move only at PostgreSQL message boundaries, and come home after every answer:
//!   the dispatcher sees every request. Bytes a client sends while away wait in the kernel's
//!   receive queue and travel home with the connection.
//! - A client session, its links and its imported sockets live on one thread: the dispatcher
//!   runs one single-threaded runtime per worker and pools idle links per thread, so relaying
//!   a small answer never waits for another thread to wake up.
//! - Only the dispatcher writes the steering table; the table is empty when every connection is
//!   home. A dispatcher restart loses the table and with it any connection that was away.

pub mod agent;
pub mod buffer;
pub mod config;
pub mod dispatcher;
pub mod error;
pub mod handover;
pub mod link;
pub mod netns;
pub mod pglogin;
pub mod routing;
pub mod runtime;
pub mod steer;

pub use error::{DispatchError, Result};
