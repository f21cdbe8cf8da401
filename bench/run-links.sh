#!/usr/bin/env bash
# The testbed's links as physics says, in one run (BENCHMARKS.md, "Back at
# the links"); run as root on a quiet machine:
#
#   1. a 2-host mesh of 3 links of 1 Gbit/s: what `testbed up` calibrated
#      the machine to forward; multirail over 1 and 3 links; a 1 MiB stream
#      over tcp (one link) and mptcp (a subflow per link);
#   2. a 4-host mesh at 1 Gbit/s: pio reads by one client from 1 and from 3
#      servers, each server over its own link;
#   3. a 2-host mesh at 10 Gbit/s, offloads on, MTU 1500 and 9000: netgap's
#      64 KiB tcp stream and iperf3 (3 s after 1 s omitted) over the shaped
#      link, then over the same link unshaped.
#
# Records go to links-TIMESTAMP.jsonl (or $1); the tables and iperf3's
# figures to the .txt beside it. The testbed is always taken down.
#
# Usage: sudo bash bench/run-links.sh [RESULTS.jsonl]
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
cargo build --release --manifest-path "$here/Cargo.toml" >/dev/null
netgap="$here/target/release/netgap"
out="${1:-links-$(date -u +%Y%m%dT%H%M%S).jsonl}"
log="${out%.jsonl}.txt"
command -v iperf3 >/dev/null || { echo "iperf3 is needed (apt-get install iperf3)" >&2; exit 1; }

name=links
hosts="@/run/netgap/$name/hosts.json"
down() { "$netgap" testbed down --name "$name" >/dev/null 2>&1 || true; }
trap down EXIT
fresh() { # testbed up flags...
    down
    "$netgap" testbed up --name "$name" "$@" | grep '^forwarding:' | tee -a "$log"
}
say() { echo "== $*" | tee -a "$log"; }

{ date -u; uname -r; nproc; uptime; } >>"$log"

say "2-host mesh, 3 links of 1 Gbit/s"
fresh --hosts 2 --topology mesh --links 3 --rate 1G
"$netgap" run multirail --hosts "$hosts" --links 1,3 --reps 5 --duration 1s --json "$out" | tee -a "$log"
"$netgap" run stream -t tcp,mptcp -s 1M --hosts "$hosts" --reps 5 --json "$out" | tee -a "$log"

say "4-host mesh, links of 1 Gbit/s: pio read by one client"
fresh --hosts 4 --topology mesh --rate 1G
for servers in 1 3; do
    "$netgap" run pio --hosts "$hosts" --op read --servers "$servers" --clients 1 \
        --reps 5 --duration 2s --json "$out" | tee -a "$log"
done

say "2-host mesh at 10 Gbit/s, offloads on: netgap and iperf3, shaped and unshaped"
fresh --hosts 2 --topology mesh --rate 10G --offload on
h1="ngtb-$name-h1"
h2="ngtb-$name-h2"
addr="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["hosts"][0]["address"])' \
    "/run/netgap/$name/hosts.json")"
for mtu in 1500 9000; do
    for rate in 10G none; do
        "$netgap" testbed set --name "$name" --mtu "$mtu" --rate "$rate" >/dev/null
        say "MTU $mtu, rate $rate"
        "$netgap" run stream -s 64K --hosts "$hosts" --reps 5 --label "mtu$mtu-rate$rate" \
            --json "$out" | tee -a "$log"
        ip netns exec "$h1" iperf3 -s -1 -B "$addr" -p 5299 >/dev/null 2>&1 &
        server=$!
        sleep 0.5
        ip netns exec "$h2" iperf3 -c "$addr" -p 5299 -t 3 -O 1 -J >/tmp/links-iperf3.json
        wait "$server" || true
        python3 -c 'import json,sys; e=json.load(open(sys.argv[1]))["end"]
print("iperf3 %.3f Gbit/s, cpu sender %.0f%% receiver %.0f%%" % (e["sum_received"]["bits_per_second"]/1e9,
      e["cpu_utilization_percent"]["host_total"], e["cpu_utilization_percent"]["remote_total"]))' \
            /tmp/links-iperf3.json | tee -a "$log"
    done
done
rm -f /tmp/links-iperf3.json
echo "results: $out, $log"
