#!/usr/bin/env bash
# The multi-host figures of BENCHMARKS.md on a namespace testbed (run as
# root): every host is a network namespace with its own keyed `netgap
# serve` agent, so each process reports its own CPU and peak memory, and
# the coordinator reaches the agents through the testbed's hosts file
# (which names the key).
#
#   1. hotspot, 3..12 clients over 3 client hosts (4-host switch, no shaping);
#   2. fan-in and fan-out, 1..12 clients, every link 1 Gbit/s (TBF);
#   3. multirail over a 2-host mesh of 3 links of 1 Gbit/s, against one
#      stream and three streams over one such link, and multirail over a
#      1-link mesh;
#   4. point-to-point stream bandwidth and CPU between two hosts at MTU 1500
#      and MTU 9000 (unshaped);
#   5. hotspot and connect with 10,000 flows from one client host, each on a
#      fresh testbed so the agents' peak memory (VmHWM) is that point's.
#
# Results go to testbed-TIMESTAMP.jsonl in the current directory (or $1).
# The testbed is always taken down, also when a step fails.
#
# Usage: sudo bash bench/run-testbed.sh [RESULTS.jsonl]
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
cargo build --release --manifest-path "$here/Cargo.toml" >/dev/null
netgap="$here/target/release/netgap"
out="${1:-testbed-$(date -u +%Y%m%dT%H%M%S).jsonl}"
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

name=bench
hosts="@/run/netgap/$name/hosts.json"
down() { "$netgap" testbed down --name "$name" >/dev/null 2>&1 || true; }
trap down EXIT
fresh() { # testbed up flags...
    down
    "$netgap" testbed up --name "$name" "$@" >/dev/null
}

fresh --hosts 4 --topology switch
"$netgap" run hotspot --hosts "$hosts" --clients 3,6,9,12 --reps 5 --duration 1s --json "$out"

fresh --hosts 4 --topology switch --rate 1G
"$netgap" run fanin,fanout --hosts "$hosts" --clients 1,3,6,9,12 --reps 5 --duration 1s --json "$out"

fresh --hosts 2 --topology mesh --links 3 --rate 1G
"$netgap" run multirail --hosts "$hosts" --reps 5 --duration 1s --json "$out"
# multistream goes over the hosts' first link only.
"$netgap" run multistream --hosts "$hosts" -P 1,3 --reps 5 --duration 1s --json "$out"
fresh --hosts 2 --topology mesh --links 1 --rate 1G
"$netgap" run multirail --hosts "$hosts" --reps 5 --duration 1s --json "$out"

# Point-to-point stream from host h2 to the agent of h1, across the link.
for mtu in 1500 9000; do
    fresh --hosts 2 --topology switch --mtu "$mtu"
    ip netns exec "ngtb-$name-h2" "$netgap" run stream --peer "unix:/run/netgap/$name/h1.sock" \
        --key "/run/netgap/$name/key" -s 64K --reps 5 --json "$out"
done

for t in hotspot connect; do
    fresh --hosts 2 --topology switch
    "$netgap" run "$t" --hosts "$hosts" --clients 10000 --reps 3 --duration 2s --json "$out"
done
echo "results: $out"
