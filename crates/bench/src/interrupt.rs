//! Ctrl-C and SIGTERM turn into a flag that the benchmark loop polls, so an interrupted run
//! unwinds normally and every `Drop` stops its server. Without this, the default action would
//! kill us on the spot and leave PostgreSQL running: `pg_ctl` starts it in its own session, so
//! the terminal's SIGINT never reaches it.

use std::sync::atomic::{AtomicBool, Ordering};

static REQUESTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_signal: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    REQUESTED.store(true, Ordering::SeqCst);
}

/// Installs the handler for SIGINT and SIGTERM (idempotent).
pub fn install() {
    let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // SAFETY: the handler only performs an atomic store, which is async-signal-safe; signal()
    // has no memory-safety preconditions beyond a valid handler address.
    unsafe {
        libc::signal(libc::SIGINT, handler);
        libc::signal(libc::SIGTERM, handler);
    }
}

/// Whether SIGINT or SIGTERM arrived since [`install`].
pub fn requested() -> bool {
    REQUESTED.load(Ordering::SeqCst)
}
