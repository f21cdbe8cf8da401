#!/bin/bash
# NetPIPE-style buffer alignment study on tcp loopback: stream throughput
# against the offset of the message buffers from a page boundary, netgap
# (`--offset`) beside NPtcp's own `-O` (its streaming mode), at 64 KiB and
# 1 MiB writes. Client on CPU 0, server on CPU 1, every tool pinned alike;
# ROUNDS interleaved rounds (each round every offset of each tool once).
#
# Usage: bench/run-align.sh [OUT_DIR]     (ROUNDS=3 OFFSETS="0 16 ..." env)
# Needs: target/release/netgap (cargo build --release), NPtcp (netpipe-tcp),
# taskset, python3. Prints one table: Gbit/s per round, by tool and offset.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
NETGAP=${NETGAP:-$REPO/target/release/netgap}
OUT=${1:-$(mktemp -d /tmp/netgap-align.XXXXXX)}
ROUNDS=${ROUNDS:-3}
OFFSETS=${OFFSETS:-"0 16 64 512 2048 4095"}
PORT=${PORT:-47719}
CLIENT_CPU=0
SERVER_CPU=1
mkdir -p "$OUT"

for t in "$NETGAP" NPtcp taskset python3; do
	command -v "$t" >/dev/null || { echo "run-align: $t is missing" >&2; exit 1; }
done

SERVER_PID=
cleanup() { [ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null || true; }
trap cleanup EXIT

for round in $(seq 1 "$ROUNDS"); do
	for off in $OFFSETS; do
		# netgap: its own agent in-process; --pin places the two roles
		nice taskset -c "$CLIENT_CPU,$SERVER_CPU" "$NETGAP" run stream -t tcp --sizes 64K,1M \
			--rep-time 1s --reps 3 --pin "$CLIENT_CPU,$SERVER_CPU" --offset "$off" \
			--json "$OUT/netgap_${round}_${off}.jsonl" >/dev/null 2>>"$OUT/netgap.err" || true
		# NPtcp: the same offset on both ends (-O send,receive)
		nice taskset -c "$SERVER_CPU" NPtcp -s -P "$PORT" -p 0 -l 65536 -u 1048576 -O "$off,$off" \
			>/dev/null 2>&1 &
		SERVER_PID=$!
		sleep 0.5
		nice timeout 300 taskset -c "$CLIENT_CPU" NPtcp -s -h 127.0.0.1 -P "$PORT" -p 0 \
			-l 65536 -u 1048576 -O "$off,$off" -o "$OUT/nptcp_${round}_${off}.out" >/dev/null 2>&1 || true
		kill "$SERVER_PID" 2>/dev/null || true
		wait "$SERVER_PID" 2>/dev/null || true
		SERVER_PID=
	done
done

python3 - "$OUT" "$ROUNDS" "$OFFSETS" <<'EOF'
import json, os, sys
out, rounds, offsets = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
def netgap(r, off, size):
    try:
        for line in open(os.path.join(out, f"netgap_{r}_{off}.jsonl")):
            d = json.loads(line)
            if d["size_bytes"] == size:
                return d["value"]
    except OSError:
        pass
    return None
def nptcp(r, off, size):
    try:
        for line in open(os.path.join(out, f"nptcp_{r}_{off}.out")):
            f = line.split()
            if len(f) >= 3 and int(f[0]) == size:
                return float(f[1]) * 1048576 / 1e9  # NPtcp's Mbps counts 2^20 bits
    except OSError:
        pass
    return None
show = lambda v: "-" if v is None else f"{v:.2f}"
print(f"tcp stream on loopback, Gbit/s, rounds 1..{rounds} (raw files in {out})")
print("| offset, bytes | netgap 64 KiB | NPtcp 64 KiB | netgap 1 MiB | NPtcp 1 MiB |")
print("|---|---|---|---|---|")
for off in offsets:
    cells = []
    for size in (65536, 1048576):
        for tool in (netgap, nptcp):
            cells.append(" / ".join(show(tool(r, off, size)) for r in range(1, rounds + 1)))
    print(f"| {off} | " + " | ".join(cells) + " |")
EOF
