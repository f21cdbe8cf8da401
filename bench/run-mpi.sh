#!/usr/bin/env bash
# The MPI figures of BENCHMARKS.md (Figure 7 of study 001), on one path of a
# 2-host namespace testbed (run as root):
#
#   1. one run of netgap's tcp pingpong and stream, then its MPI latency and
#      bandwidth (Open MPI's TCP transport pinned to the testbed interface),
#      under offload on and offload off (--conditions), sizes 1 B to 1 MiB;
#      once with MPI's default spinning ranks, once with yielding ones;
#   2. on the same path, a small OSU-style C latency program
#      (bench/mpi/latency.c, built with mpicc) started exactly as netgap
#      starts its ranks: mpirun inside host h1's namespaces, rank 1 on h2
#      through netgap's launch agent, btl tcp,self on the testbed interface;
#      and netgap's mpi-latency again right after it, offload on; spinning
#      and yielding.
#
# Results: mpi-TIMESTAMP.jsonl (or $1), the C program's lines beside it
# (.c-latency.txt), and a summary table on standard output.
#
# Usage: sudo bash bench/run-mpi.sh [RESULTS.jsonl]
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
cargo build --release --features mpi --manifest-path "$here/Cargo.toml" >/dev/null
netgap="$here/target/release/netgap"
out="${1:-mpi-$(date -u +%Y%m%dT%H%M%S).jsonl}"
clat="${out%.jsonl}.c-latency.txt"
sizes="1,1K,64K,1M"
reps="${REPS:-10}"
rep_time="${REP_TIME:-200ms}"
iterations="${C_ITERATIONS:-5000}"

name=mpibench
hosts="@/run/netgap/$name/hosts.json"
build="$(mktemp -d)"
down() {
    "$netgap" testbed down --name "$name" >/dev/null 2>&1 || true
    rm -rf "$build"
}
trap down EXIT
"$netgap" testbed down --name "$name" >/dev/null 2>&1 || true
"$netgap" testbed up --name "$name" --hosts 2 --offload on >/dev/null

# Open MPI's ranks spin in their blocking calls; on a small, shared machine a
# spinning rank can starve the other rank and the kernel's packet
# processing. Each step runs twice: MPI as it comes (spin) and with
# OMPI_MCA_mpi_yield_when_idle=1 (an idle rank yields its core), which the
# records name in their stack.
with_mpi() { # spin|yield COMMAND...
    local mode="$1"
    shift
    if [ "$mode" = yield ]; then OMPI_MCA_mpi_yield_when_idle=1 "$@"; else "$@"; fi
}

# 1. Sockets and MPI, offload on and off, in one run (per MPI setting).
for mode in spin yield; do
    with_mpi "$mode" "$netgap" run pingpong,stream,mpi-latency,mpi-bw --hosts "$hosts" \
        -s "$sizes" --reps "$reps" --rep-time "$rep_time" --conditions offload=on,off \
        --label "$mode" --json "$out"
done

# 2. The C program on the same path, then netgap's MPI latency right after.
mpicc -O2 -o "$build/latency" "$here/bench/mpi/latency.c"
ns1="ngtb-$name-h1" ns2="ngtb-$name-h2"
a1=10.77.0.1 a2=10.77.0.2
iface="$(ip netns exec "$ns1" ip -o -4 addr show | awk -v a="$a1/" 'index($4, a) == 1 { print $2 }')"
: > "$clat"
for mode in spin yield; do
    NETGAP_MPI_HOSTS="$a1=$ns1=h1;$a2=$ns2=h2" with_mpi "$mode" \
        "$netgap" mpi-exec --netns "$ns1" --hostname h1 -- \
        mpirun -np 2 --allow-run-as-root --mca pml ob1 --bind-to none \
        --mca btl tcp,self --mca btl_tcp_if_include "$iface" --mca oob_tcp_if_include "$iface" \
        --mca plm_rsh_agent "$netgap mpi-agent" --host "$a1:1,$a2:1" \
        "$build/latency" "$iterations" 1 1024 65536 1048576 | sed "s/^/$mode /" | tee -a "$clat"
    with_mpi "$mode" "$netgap" run mpi-latency --hosts "$hosts" -s "$sizes" --reps "$reps" \
        --rep-time "$rep_time" --label "after-c-$mode" --json "$out"
done

# Summary: per MPI setting, condition and size, tcp and MPI side by side.
python3 - "$out" "$clat" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
c = {}
for l in open(sys.argv[2]):
    if l.strip():
        mode, size, v = l.split()
        c[(mode, int(size))] = float(v)
def key(r):
    return (r["stack"].get("label"), r["stack"]["path"].get("offload"), r["test"], r["transport"], r["size_bytes"])
by = {key(r): r for r in recs}
def fmt(r):
    if r is None:
        return "-"
    return f'{r["value"]:.2f} (median {r["stats"]["median"]:.2f})'
sizes = sorted({r["size_bytes"] for r in recs})
for test, unit in (("pingpong", "latency µs"), ("stream", "bandwidth Gbit/s")):
    print(f"\n{test} ({unit}): MPI | offload | size | tcp | mpi | mpi/tcp")
    for mode in ("spin", "yield"):
        for off in ("on", "off"):
            for size in sizes:
                t = by.get((mode, off, test, "tcp", size))
                m = by.get((mode, off, test, "mpi", size))
                ratio = f'{m["value"] / t["value"]:.2f}' if t and m else "-"
                print(f"  {mode} | {off} | {size} | {fmt(t)} | {fmt(m)} | {ratio}")
print("\nMPI latency (µs), offload on: MPI | size | C program | netgap mpi-latency right after")
for (mode, size), v in sorted(c.items()):
    after = by.get((f"after-c-{mode}", "on", "pingpong", "mpi", size))
    print(f"  {mode} | {size} | {v:.2f} | {fmt(after)}")
PY
