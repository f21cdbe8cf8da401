#!/usr/bin/env bash
# The control plane at scale (issue 27): a switch testbed of 64 hosts, and
# on its first N hosts (N = 2, 4, 8, 16, 32, 64: 000 Figure 13's axis)
#   - gather with gmond on every other host, sequential and parallel
#     (the first host collects from N-1 gmonds), GATHER_REPS repetitions of
#     GATHER_DURATION;
#   - the coordinator's own cost against agents: one short hotspot point
#     with one client on each of the N-1 client hosts, timed whole by
#     /usr/bin/time (wall time and the coordinator's peak resident memory).
#     Its "setup" is the wall time less the measured window and warm-up:
#     connecting and shaking hands with every agent, placing and preparing
#     every role, gathering the reports, closing the sessions.
# Results: gather.jsonl, hotspot.jsonl, coordinator.tsv and summary.md in
# OUT_DIR (default cluster-scale-TIMESTAMP). Needs root, ganglia-monitor.
#
# Usage: sudo bash bench/run-cluster-scale.sh [OUT_DIR]
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
netgap="${NETGAP:-}"
if [ -z "$netgap" ]; then
    cargo build --release --manifest-path "$here/Cargo.toml" >/dev/null
    netgap="$here/target/release/netgap"
fi
out="${1:-cluster-scale-$(date -u +%Y%m%dT%H%M%S)}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
counts="${COUNTS:-2 4 8 16 32 64}"
gather_reps="${GATHER_REPS:-3}"
gather_duration="${GATHER_DURATION:-2s}"
name=scale64
max=64
for n in $counts; do [ "$n" -le "$max" ] || { echo "COUNTS: $n is over $max" >&2; exit 2; }; done
command -v jq >/dev/null || { echo "run-cluster-scale.sh: needs jq" >&2; exit 2; }

cleanup() { "$netgap" testbed down --name "$name" >/dev/null 2>&1 || true; }
trap cleanup EXIT
t0=$(date +%s.%N)
"$netgap" testbed up --name "$name" --hosts "$max" --topology switch >/dev/null
t1=$(date +%s.%N)
echo "testbed up, $max hosts: $(printf '%.1f' "$(echo "$t1 - $t0" | bc)") s" | tee "$out/testbed-up.txt"
hosts="/run/netgap/$name/hosts.json"

printf 'agents\twall_s\twindow_s\tsetup_s\tpeak_rss_kib\n' >"$out/coordinator.tsv"
for n in $counts; do
    sub="$out/hosts-$n.json"
    jq ".hosts |= .[:$n]" "$hosts" >"$sub"
    "$netgap" run gather --hosts "@$sub" --responder gmond --gather-mode sequential,parallel \
        --reps "$gather_reps" --duration "$gather_duration" --json "$out/gather.jsonl" >/dev/null
    # One point, 1 s window and its 200 ms warm-up.
    /usr/bin/time -f '%e %M' -o "$out/time-$n" \
        "$netgap" run hotspot --hosts "@$sub" --clients "$((n - 1))" --reps 1 --duration 1s \
        --json "$out/hotspot.jsonl" >/dev/null
    read -r wall rss <"$out/time-$n"
    setup=$(printf '%.2f' "$(echo "$wall - 1.2" | bc)")
    printf '%s\t%s\t1.2\t%s\t%s\n' "$n" "$wall" "$setup" "$rss" >>"$out/coordinator.tsv"
    echo "N=$n: gather done; coordinator $wall s wall, $rss KiB"
done

{
    echo "gather (gmond), time of one gather in ms:"
    echo
    printf 'hosts  answering  sequential_ms  parallel_ms\n'
    for n in $counts; do
        seq=$(jq -r "select(.app.options[\"gather-mode\"] == \"sequential\" and .app.metrics.hosts == $((n - 1))) | .value" "$out/gather.jsonl" | head -1)
        par=$(jq -r "select(.app.options[\"gather-mode\"] == \"parallel\" and .app.metrics.hosts == $((n - 1))) | .value" "$out/gather.jsonl" | head -1)
        printf '%-6s %-10s %-14.3f %.3f\n' "$n" "$((n - 1))" "$seq" "$par"
    done
    echo
    echo "coordinator against agents:"
    echo
    column -t "$out/coordinator.tsv"
} >"$out/summary.md"
cat "$out/summary.md"
echo "results: $out"
