//! Fault injection for crash tests: a host process dies the way a crash would.

/// Kills this process the way a crash would (no unwinding, no flushing).
pub fn crash_now() -> ! {
    // SAFETY: signalling our own pid; SIGKILL cannot be caught, so nothing runs after it.
    unsafe {
        libc::kill(libc::getpid(), libc::SIGKILL);
    }
    std::process::abort()
}
