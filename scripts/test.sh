#!/usr/bin/env bash
# Runs every test. Integration tests start real PostgreSQL and PgBouncer, so they need root or the
# `postgres` user (see crates/testkit) and the packages from scripts/setup.sh.
set -euo pipefail
ulimit -n "$(ulimit -Hn)"
cargo test --workspace --locked -- --test-threads="${TEST_THREADS:-2}"
# The pooler's whole integration suite once more with the kernel fast path
# (BYPASS_TEST_FAST_PATH, read by crates/pooler/tests/common).
BYPASS_TEST_FAST_PATH=kernel cargo test --locked -p bypass-pooler --tests -- --test-threads="${TEST_THREADS:-2}"
# Every cargo-fuzz target briefly (FUZZ_SECONDS each, default 15), from its committed corpus.
./scripts/fuzz.sh
