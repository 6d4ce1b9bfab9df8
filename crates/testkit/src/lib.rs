//! Throwaway real PostgreSQL clusters and PgBouncer instances for tests and benchmarks.
//!
//! Nothing here is mocked: [`Postgres`] runs `initdb` + `pg_ctl` from PostgreSQL 15 and
//! [`PgBouncer`] spawns the real `pgbouncer` binary. Both live in fresh temp directories on free
//! loopback ports and are torn down when dropped, also while a failing test unwinds.
//!
//! ```text
//!   test ──► Postgres::start_with(options)
//!              │  initdb (temp dir, owned by the `postgres` OS user when we are root)
//!              │  testkit.conf + pg_hba.conf written, pg_ctl start -w
//!              ▼
//!            postgres on 127.0.0.1:<free port>  ◄── PgBouncer::start(backend_port)
//!                                                     N × pgbouncer (so_reuseport when N > 1)
//! ```
//!
//! ```no_run
//! use bypass_testkit::{PgBouncer, PgBouncerOptions, Postgres, PostgresOptions, TestUser};
//!
//! # fn main() -> Result<(), bypass_testkit::TestkitError> {
//! let postgres = Postgres::start_with(PostgresOptions {
//!     users: vec![TestUser::scram("app", "secret")],
//!     ..PostgresOptions::default()
//! })?;
//! assert_eq!(postgres.psql("select 1")?, "1");
//! let bouncer = PgBouncer::start(PgBouncerOptions {
//!     backend_port: postgres.port(),
//!     processes: 2,
//!     ..PgBouncerOptions::default()
//! })?;
//! println!("pgbench -h 127.0.0.1 -p {} -U postgres postgres", bouncer.port());
//! # Ok(())
//! # }
//! ```
//!
//! Invariants:
//! - Servers never run as root: when the test process is root every server command is spawned
//!   with the `postgres` user's uid/gid (see [`process`]).
//! - Servers listen on `127.0.0.1` only and their Unix sockets live in our temp dirs, so they
//!   never touch a system cluster on 5432 or `/var/run/postgresql`.
//! - `Drop` never panics and always stops what was started (`pg_ctl stop -m immediate`, then
//!   SIGKILL as a last resort); temp dirs are removed afterwards.
//! - [`free_port`] never hands out the same port twice in one process.

mod error;
mod pgbouncer;
mod pgconf;
mod postgres;
pub mod process;
mod sql;

use std::collections::BTreeSet;
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::Mutex;

pub use error::TestkitError;
pub use pgbouncer::{PgBouncer, PgBouncerOptions};
pub use postgres::{AuthMethod, Postgres, PostgresOptions, TestUser};

/// Where the PostgreSQL 15 server binaries live (Debian/Ubuntu layout).
pub const PG_BIN_DIR: &str = "/usr/lib/postgresql/15/bin";

/// How many times [`free_port`] asks the kernel before giving up on finding an unused port.
const FREE_PORT_ATTEMPTS_MAX: usize = 1_000;

/// Ports already handed out by [`free_port`] in this process.
static PORTS_HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

/// A loopback TCP port that is free right now and was not returned before in this process.
///
/// The kernel picks the port (bind `127.0.0.1:0`); the listener is dropped before returning, so
/// another process could still grab it. Servers started with an automatic port retry on a
/// different one when that happens.
///
/// # Panics
/// If binding a loopback socket fails or no new port is found in [`FREE_PORT_ATTEMPTS_MAX`]
/// attempts; both mean the machine is unusable for tests.
pub fn free_port() -> u16 {
    let mut handed_out = PORTS_HANDED_OUT.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    for _ in 0..FREE_PORT_ATTEMPTS_MAX {
        let listener = TcpListener::bind("127.0.0.1:0").expect("binding 127.0.0.1:0 must work on a test box");
        let port = listener.local_addr().expect("a bound listener has a local address").port();
        if handed_out.insert(port) {
            return port;
        }
    }
    panic!("no new free port after {FREE_PORT_ATTEMPTS_MAX} attempts");
}

/// Path of a PostgreSQL 15 binary, e.g. `pg_bin("pgbench")`.
pub fn pg_bin(name: &str) -> PathBuf {
    PathBuf::from(PG_BIN_DIR).join(name)
}

// Handles move into benchmark threads and shared fixtures.
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Postgres>();
    assert_send_sync::<PgBouncer>();
};

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: free_port never repeats within a process; method: draw many ports, count distinct.
    #[test]
    fn free_port_is_unique() {
        let ports: Vec<u16> = (0..200).map(|_| free_port()).collect();
        let distinct: BTreeSet<u16> = ports.iter().copied().collect();
        assert_eq!(distinct.len(), ports.len());
        assert!(ports.iter().all(|&p| p != 0));
    }

    // Goal: pg_bin points into the PostgreSQL 15 bin dir; method: compare paths, check existence.
    #[test]
    fn pg_bin_points_at_postgres_15() {
        assert_eq!(pg_bin("initdb"), PathBuf::from("/usr/lib/postgresql/15/bin/initdb"));
        assert!(pg_bin("pg_ctl").exists());
    }
}
