#!/usr/bin/env bash
# Profiles one point of `bypass bench dispatch` while it runs (root; perf from linux-perf).
#
#   scripts/dispatch-profile.sh sched   CONTENDER SIZE   # per-thread run time per query (perf sched)
#   scripts/dispatch-profile.sh segs    CONTENDER SIZE   # TCP segments/retransmits per lab host (nstat)
#   scripts/dispatch-profile.sh perf    CONTENDER SIZE   # cpu-clock call graphs of the bench threads
#
# CONTENDER is one of direct, haproxy, relay, handover, hybrid; SIZE in bytes. `sched` and `perf`
# sample the 1-byte latency phase when SIZE is 1, else the throughput phase. Output goes to
# /tmp/dispatch-profile-<mode>-<contender>/. BIN overrides the binary
# (default target-dispatch/release/bypass). The hybrid threshold is fixed at 256 KB.
set -euo pipefail

mode=${1:?mode: sched, segs or perf}
contender=${2:?contender}
size=${3:?size in bytes}
bin=${BIN:-target-dispatch/release/bypass}
out=/tmp/dispatch-profile-$mode-$contender
mkdir -p "$out"

if [[ $mode == sched || $mode == perf ]] && ! mountpoint -q /sys/kernel/tracing; then
    mount -t tracefs nodev /sys/kernel/tracing
fi

latency_s=0.5
[[ $size == 1 ]] && latency_s=6
"$bin" bench dispatch --sizes "$size" --contenders "$contender" --threshold 262144 \
    --duration-s 8 --warmup-s 1 --latency-s "$latency_s" --dry-run >"$out/bench.txt" 2>&1 &
pid=$!
# Wait for the measuring phase: after the throughput point when profiling 1-byte latency.
if [[ $size == 1 ]]; then
    for _ in $(seq 600); do grep -q " 1 B .*Gbit" "$out/bench.txt" && break; sleep 0.1; done
    sleep 1.5
else
    sleep 4
fi

case $mode in
sched)
    perf sched record -a -o "$out/sched.data" -- sleep 2 >/dev/null 2>&1
    wait $pid
    perf sched timehist -i "$out/sched.data" 2>/dev/null >"$out/timehist.txt"
    # Mean run time per scheduling slice and slices per thread name: run time x slices per
    # query is the CPU each hop costs a query.
    awk 'NR > 3 { split($3, name, "["); sub(/-[0-9]+$/, "", name[1]);
                  run[name[1]] += $NF; slices[name[1]]++ }
         END { for (n in run) if (slices[n] > 100)
                   printf "%-20s slices %7d  mean run %6.1f us\n", n, slices[n], run[n] / slices[n] * 1000 }' \
        "$out/timehist.txt" | sort -k3 -n -r
    ;;
segs)
    # One thread per network namespace stands for its host.
    for task in /proc/$pid/task/*; do
        echo "$(cat "$task/comm") $(readlink "$task/ns/net") ${task##*/}"
    done | sort -u -k2,2 >"$out/namespaces.txt"
    snapshot() {
        while read -r name _ tid; do
            echo "== $name"
            nsenter --net=/proc/$pid/task/$tid/ns/net nstat -az TcpOutSegs TcpRetransSegs \
                TcpExtTCPLossProbes TcpExtTCPSackRecovery TcpExtTCPTimeouts | grep -v '^#' || true
        done <"$out/namespaces.txt"
    }
    snapshot >"$out/before.txt"
    sleep 3
    snapshot >"$out/after.txt"
    wait $pid
    paste "$out/before.txt" "$out/after.txt" |
        awk '/==/ { print $1, $2; next } { delta = $5 - $2; if (delta) printf "    %-24s %d\n", $1, delta }'
    ;;
perf)
    perf record -e cpu-clock -F 4999 -g -p $pid -o "$out/perf.data" -- sleep 3 >/dev/null 2>&1
    wait $pid
    perf report -i "$out/perf.data" --no-children --sort comm,sym -q -g none 2>/dev/null | head -30
    ;;
*)
    echo "unknown mode $mode" >&2
    exit 2
    ;;
esac
grep -E "Gbit|latency:" "$out/bench.txt" || true
