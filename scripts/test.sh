#!/usr/bin/env bash
# Runs every test. Integration tests start real PostgreSQL and PgBouncer, so they need root or the
# `postgres` user (see crates/testkit) and the packages from scripts/setup.sh.
set -euo pipefail
ulimit -n "$(ulimit -Hn)"
cargo test --workspace --locked -- --test-threads="${TEST_THREADS:-2}"
# The pooler's suites once more with the kernel fast path (BYPASS_TEST_FAST_PATH, read by
# crates/pooler/tests/common). Not yet here: limits.rs (idle/lifetime timeouts of servers lent to
# the kernel, per-client parameters, max_db_connections eviction), session_state.rs (the kernel
# cannot see SET/LISTEN/PREPARE text) and protocol.rs (application_name on kernel-taken servers).
BYPASS_TEST_FAST_PATH=kernel cargo test --locked -p bypass-pooler \
    --test failures --test fastpath --test operations --test prepared --test auth --test auth_query \
    --test hba --test tls --test allocations -- --test-threads="${TEST_THREADS:-2}"
