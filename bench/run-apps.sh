#!/usr/bin/env bash
# The application-level workloads on a 4-host namespace switch testbed
# (root): pipeline query time against UOW size for the vm and iso presets
# over tcp, uring and co-located shm, with offloads on and off; pio read
# and write bandwidth for 1 server / 3 clients, 3 servers / 1 client and
# the tiled pattern, over 1 Gbit/s and unlimited links. pio keeps its
# stripes in tmpfs (--dir under /dev/shm) so the links and stacks, not a
# disk, decide; one pair of points on the disk (the default directory,
# direct I/O) follows for reference; then 3 servers / 1 client on a mesh
# at 1 Gbit/s, where the client has a link to each server. Results go to
# apps-TIMESTAMP.jsonl in the current directory (or $1).
#
# Usage: sudo bash bench/run-apps.sh [RESULTS.jsonl]
# REPS (default 5) sets the repetitions of every point.
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
cargo build --release --manifest-path "$here/Cargo.toml" >/dev/null
netgap="$here/target/release/netgap"
out="${1:-apps-$(date -u +%Y%m%dT%H%M%S).jsonl}"
reps="${REPS:-5}"
tb=apps
hosts="@/run/netgap/$tb/hosts.json"
data="$(mktemp -d /dev/shm/netgap-apps.XXXXXX)"
cleanup() {
    "$netgap" testbed down --name "$tb" >/dev/null 2>&1 || true
    "$netgap" testbed down --name "${tb}mesh" >/dev/null 2>&1 || true
    rm -rf "$data"
}
trap cleanup EXIT
"$netgap" testbed down --name "$tb" >/dev/null 2>&1 || true
"$netgap" testbed up --name "$tb" --hosts 4 --topology switch --offload on >/dev/null

# pipeline: one query per repetition, a filter stage of 2 copies; copies
# cyclic over the 4 hosts (tcp, uring) or all on h1 (shm).
for offload in on off; do
    "$netgap" testbed set --name "$tb" --offload "$offload" --rate none >/dev/null
    "$netgap" run pipeline --hosts "$hosts" -t tcp,uring,shm --preset vm,iso -s 16K,32K,64K \
        --copies 2 --reps "$reps" --duration 10s --label "offload-$offload" --json "$out"
done

# pio: write then read back, verified; the headline of each point is the
# --op phase, both phases are in app.metrics.
"$netgap" testbed set --name "$tb" --offload on >/dev/null
for rate in 1G none; do
    "$netgap" testbed set --name "$tb" --rate "$rate" >/dev/null
    pio=(run pio --hosts "$hosts" -s 64K --op write,read --dir "$data" --reps "$reps"
        --duration 20s --label "rate-$rate" --json "$out")
    # pvfs-test: 2 MiB blocks, 16 MiB per client (48 MiB in all for 3 clients).
    "$netgap" "${pio[@]}" --servers 1 --clients 3 --pattern contiguous --blocks 8
    "$netgap" "${pio[@]}" --servers 3 --clients 1 --pattern contiguous --blocks 24
    # MPI-Tile-I/O, the study's case: 1x2 tiles of 1024x768 elements of
    # 32 bytes (48 MiB), over 2 servers.
    "$netgap" "${pio[@]}" --servers 2 --clients 2 --pattern tile
done
# On the disk (the agents' own run directories, direct I/O), unlimited links.
"$netgap" run pio --hosts "$hosts" -s 64K --op write,read --servers 3 --clients 1 \
    --blocks 24 --reps "$reps" --duration 30s --label disk --json "$out"
"$netgap" run pio --hosts "$hosts" -s 64K --op write,read --servers 1 --clients 3 \
    --blocks 8 --reps "$reps" --duration 30s --label disk --json "$out"

# A mesh: the client's reads from 3 servers each come over their own link.
"$netgap" testbed down --name "$tb" >/dev/null
"$netgap" testbed up --name "${tb}mesh" --hosts 4 --topology mesh --rate 1G >/dev/null
"$netgap" run pio --hosts "@/run/netgap/${tb}mesh/hosts.json" -s 64K --op write,read --dir "$data" \
    --servers 3 --clients 1 --blocks 24 --reps "$reps" --duration 20s --label mesh-1G --json "$out"
echo "results: $out"
