#!/usr/bin/env bash
# Profiles where the kernel fast path spends a 1-client transaction's latency: counts the psock
# backlog work items (sk_psock_backlog, the kworker that transmits every sk_skb redirect) per
# transaction and their queue → start delay, from workqueue tracepoints, while
# `fastpath_probe 1 SECONDS kernel` runs pgbench -S through the kernel path.
# Usage: scripts/profile-fastpath-kworker.sh [seconds]   (root; perf from linux-perf)
set -euo pipefail
seconds="${1:-10}"
cd "$(dirname "$0")/.."
cargo build -q --release -p bypass-pooler --example fastpath_probe
data="$(mktemp -d)/workqueue.data"
perf record -q -a -e workqueue:workqueue_queue_work -e workqueue:workqueue_execute_start \
    -o "$data" -- sleep "$((seconds + 4))" >/dev/null 2>&1 &
recorder=$!
sleep 0.5
./target/release/examples/fastpath_probe 1 "$seconds" kernel | tee "$data.probe"
wait "$recorder"
transactions="$(grep -o 'transactions: [0-9]*' "$data.probe" | head -1 | grep -o '[0-9]*')"
perf script -i "$data" 2>/dev/null | grep sk_psock_backlog | python3 -c '
import re, sys
transactions = int(sys.argv[1])
queued, delays = {}, []
for line in sys.stdin:
    match = re.search(r"(\d+\.\d+):\s+workqueue:(\w+): work struct[= ](0x[0-9a-f]+)", line)
    if not match:
        continue
    at, event, work = float(match.group(1)), match.group(2), match.group(3)
    if event == "workqueue_queue_work":
        queued[work] = at
    elif work in queued:
        delays.append((at - queued.pop(work)) * 1e6)
delays.sort()
n = len(delays)
print(f"sk_psock_backlog work items: {n}, per kernel transaction: {n / max(transactions, 1):.2f}")
print(f"queue -> start delay: mean {sum(delays) / n:.1f} us, p50 {delays[n // 2]:.1f}, "
      f"p90 {delays[int(n * 0.9)]:.1f}, p99 {delays[int(n * 0.99)]:.1f}")
' "$transactions"
