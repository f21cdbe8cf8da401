#!/usr/bin/env bash
# Workloads on one machine: a server agent on 127.0.0.2 and three
# client-host agents on 127.0.0.3..5, each its own `netgap serve` process
# (so each reports its own CPU and peak memory), then hotspot 3..12 clients,
# fan-in and fan-out 1..12 clients, multistream, multirail over 3 loopback
# links against 1, and hotspot and connect with 10,000 flows from one
# client host. Results go to multihost-TIMESTAMP.jsonl in the current
# directory (or $1).
#
# Usage: bash bench/run-multihost.sh [RESULTS.jsonl]
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
cargo build --release --manifest-path "$here/Cargo.toml" >/dev/null
netgap="$here/target/release/netgap"
out="${1:-multihost-$(date -u +%Y%m%dT%H%M%S).jsonl}"
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

start_agent() { # IP PORT
    "$netgap" serve --bind "$1" --port "$2" >/dev/null 2>&1 &
    pids+=("$!")
}
fresh_agents() {
    cleanup
    pids=()
    for i in 2 3 4 5; do start_agent "127.0.0.$i" "$((7310 + i))"; done
    sleep 0.5
}
hosts=127.0.0.2:7312,127.0.0.3:7313,127.0.0.4:7314,127.0.0.5:7315

fresh_agents
"$netgap" run hotspot --hosts "$hosts" --clients 3,6,9,12 --reps 5 --duration 1s --json "$out"
"$netgap" run fanin,fanout --hosts "$hosts" --clients 1,3,6,9,12 --reps 5 --duration 1s --json "$out"
"$netgap" run multistream --hosts "$hosts" -P 1,2,4,8 --reps 5 --duration 1s --json "$out"
"$netgap" run connect --hosts "$hosts" --clients 3,12 --reps 5 --duration 1s --json "$out"
# multirail: in-process agents, loopback links 127.0.1.k -> 127.0.2.k.
"$netgap" run multirail --links 1 --reps 5 --duration 1s --json "$out"
"$netgap" run multirail --links 3 --reps 5 --duration 1s --json "$out"
# 10,000 flows from one client host; fresh agents so each peak memory
# (VmHWM) is this point's.
for t in hotspot connect; do
    fresh_agents
    "$netgap" run "$t" --hosts 127.0.0.2:7312,127.0.0.3:7313 --clients 10000 --reps 3 --duration 2s --json "$out"
done
echo "results: $out"
