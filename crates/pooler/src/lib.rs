//! The user-space PostgreSQL pooler: what PgBouncer does, on every core (one single-threaded
//! tokio runtime per core, see [`proxy`]).

//!
//! ```text
//!  client ──TCP──► proxy (accept, max_client_conn) ─► tls (SSLRequest / direct TLS, rustls)
//!                    │
//!                    ▼
//!                  login (startup, hba, auth: trust/md5/scram/password/cert, auth_query,
//!                         welcome) ──► Session
//!                                                                       │ Idle ◄──────────┐
//!                                                                       ▼                 │
//!                  pool (database, user): idle LIFO, FIFO waiters ──► Linked: relay ──────┘
//!                    │                                                   (ReadyForQuery 'I',
//!                    ▼                                                    nothing outstanding)
//!                  server: TLS per server_tls_sslmode, login (trust/cleartext/md5/scram),
//!                          reset, parameter sync
//!
//!  mirror = "<db>": login ─► shadow session per client ─► kernel tc copy, or every client read
//!                   copied to a bounded queue a task feeds to the shadow (replies dropped)
//! ```
//!
//! Invariants:
//! - A server goes back to the pool only at a transaction boundary with every request answered
//!   ([`relay::TransactionTracker`]), and only with no unread bytes.
//! - Every server connection is counted in its pool by a lease that frees the slot on drop, so no
//!   error path can leak a slot.
//! - Waiting clients are served first come, first served; a released server may go to a waiter of
//!   its own core that joined up to 50 ms after the head ([`pool::LOCAL_SLACK`]); a server left
//!   idle on one core while clients of another wait reaches them within one queue tick (100 ms).
//! - After login, relaying allocates nothing: each side owns one fixed buffer.
//! - A mirrored client's shadow gets a byte-exact prefix of the client's stream or is closed,
//!   and the client never waits on it ([`mirror`]).
//! - Plaintext and TLS share one [`stream::Stream`]: plaintext costs one `match` per read or
//!   write, and its TCP socket stays reachable for the kernel fast path.

pub mod admin;
pub mod auth_cache;
pub mod auth_file;
pub mod auth_query;
pub mod buffer;
pub mod cancel;
pub mod client;
pub mod config;
pub mod config_doc;
pub mod error;
pub mod hba;
pub mod import;
pub mod io;
pub mod kernel;
pub mod lease;
pub mod listen;
pub mod load;
pub mod login;
pub mod metrics;
pub mod mirror;
pub mod params;
pub mod pool;
pub mod prepared;
pub mod proxy;
pub mod relay;
pub mod server;
pub mod session;
pub mod session_state;
pub mod shadow;
pub mod shared;
pub mod stats;
pub mod stream;
pub mod tls;

pub use config::Config;
pub use error::PoolerError;
pub use load::{ConfigError, ValidConfig};
pub use proxy::{Proxy, RunningProxy};
pub use shared::{Shared, Snapshot};
