#!/usr/bin/env bash
# The deterministic profile behind the allocator section of `bypass bench engine`: runs the
# benchmark's own loops (floor, arena, mimalloc, glibc × 16/64/256 B × three working sets) under
# cachegrind and writes bench/results/engine-alloc-profile.{json,md}. A later
# `bench_engine --only allocators` run embeds its summary in engine.md.
#
#   scripts/engine-alloc-profile.sh [OUT_DIR]     # default bench/results; ~3 minutes
#
# Needs valgrind (apt-get install -y valgrind). Optional: nothing else in the project uses it.
# CARGO_TARGET_DIR is honoured; the counts do not depend on the machine's load.
set -euo pipefail
cd "$(dirname "$0")/.."

out_dir=${1:-bench/results}
if ! command -v valgrind >/dev/null; then
    echo "engine-alloc-profile: valgrind is missing (apt-get install -y valgrind)" >&2
    exit 1
fi
target_dir=${CARGO_TARGET_DIR:-target}
cargo build --release -p bypass-bench --example alloc_profile
"$target_dir/release/examples/alloc_profile" report --out-dir "$out_dir"
