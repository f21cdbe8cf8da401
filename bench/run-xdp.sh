#!/usr/bin/env bash
# The xdp, mptcp and multi-rail figures of BENCHMARKS.md on a namespace
# testbed (run as root; needs libxdp-dev and libbpf-dev to build with the
# xdp feature):
#
#   1. one testbed link (a 2-host mesh of one veth pair, unshaped): latency
#      and bandwidth, with CPU of both ends, of xdp against tcp and udp in
#      event and poll mode, and LogP send and receive overheads of xdp and
#      tcp in both modes (seed 004, Figure 4);
#   2. three links of 1 Gbit/s (a 2-host mesh, TBF on every link end):
#      aggregate bandwidth of multirail (one tcp connection per link) over
#      1, 2 and 3 links one way and both ways, of one mptcp connection over
#      all three, and of one tcp flow, against three links' payload limit
#      (3 x 956 Mbit/s at MTU 1500).
#
# Results go to xdp-TIMESTAMP.jsonl in the current directory (or $1). The
# testbed is always taken down, also when a step fails.
#
# Usage: sudo bash bench/run-xdp.sh [RESULTS.jsonl]
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
cargo build --release --features xdp --manifest-path "$here/Cargo.toml" >/dev/null
netgap="$here/target/release/netgap"
out="${1:-xdp-$(date -u +%Y%m%dT%H%M%S).jsonl}"

name=xdpbench
hosts="@/run/netgap/$name/hosts.json"
down() { "$netgap" testbed down --name "$name" >/dev/null 2>&1 || true; }
trap down EXIT
fresh() { # testbed up flags...
    down
    "$netgap" testbed up --name "$name" "$@" >/dev/null
}

# 1. One link.
fresh --hosts 2 --topology mesh --links 1
"$netgap" run pingpong -t xdp,tcp,udp --mode event,poll --hosts "$hosts" \
    -s 1,1K,32K --reps 5 --rep-time 300ms --json "$out"
"$netgap" run stream -t xdp,tcp,udp --mode event,poll --hosts "$hosts" \
    -s 1K,32K --reps 5 --rep-time 300ms --json "$out"
"$netgap" logp -t xdp,tcp --mode event,poll --hosts "$hosts" \
    -s 1,1K,32K --reps 5 --json "$out"

# 2. Three 1 Gbit/s links.
fresh --hosts 2 --topology mesh --links 3 --rate 1G
"$netgap" run multirail --links 1,2,3 --hosts "$hosts" --reps 3 --duration 1s --json "$out"
"$netgap" run multirail --bidir --links 1,2,3 --hosts "$hosts" --reps 3 --duration 1s --json "$out"
"$netgap" run stream -t mptcp,tcp --hosts "$hosts" -s 64K --reps 3 --rep-time 1s --json "$out"

echo "results: $out"
