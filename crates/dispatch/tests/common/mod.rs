//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::sync::atomic::{AtomicU32, Ordering};

/// A lab name no other test (or concurrent test run) uses: tag + pid + counter, ≤ 12 chars.
pub fn unique_lab_name(tag: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let name = format!("{tag}{}{n}", std::process::id() % 100_000);
    assert!(name.len() <= 12, "lab name {name} too long");
    name
}
