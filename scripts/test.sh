#!/usr/bin/env bash
# Runs every test. Integration tests start real PostgreSQL and PgBouncer, so they need root or the
# `postgres` user (see crates/testkit) and the packages from scripts/setup.sh.
set -euo pipefail
ulimit -n "$(ulimit -Hn)"
cargo test --workspace --locked -- --test-threads="${TEST_THREADS:-2}"
