#!/usr/bin/env bash
# Shows that the pod's modelled figures do not depend on how the cores time-slice the hosts:
# runs the SWcc-variant series (YCSB 95/5 100% cross and TPC-C 60/90) once normally and once
# with the whole bench process tree pinned to one core, and prints both runs' modelled
# SWcc ÷ NoSWcc rows. Usage: scripts/pod-schedule-check.sh [repetitions] (default 3).
set -euo pipefail
repetitions="${1:-3}"
target="${CARGO_TARGET_DIR:-target}"
cargo build --release -p bypass-cli --example pod
out="$(mktemp -d)"
run() {
    local name="$1"; shift
    mkdir -p "$out/$name"
    "$@" "$target/release/examples/pod" bench --only swcc --repetitions "$repetitions" \
        --warmup-ms 1000 --measure-ms 2000 --out "$out/$name" > "$out/$name/log"
    echo "== $name (load: $(cut -d' ' -f1-3 /proc/loadavg))"
    grep -E "SWcc \(WriteThrough\) ÷ NoSWcc|^\| (WriteThrough|NoSwcc) \|" "$out/$name/pod.md"
}
run normal nice -n 10
run one-core taskset -c 0 nice -n 10
echo "results in $out"
