#!/usr/bin/env bash
# NetPIPE's method on this machine, in one run:
#  1. netgap sweep and NPtcp over tcp loopback, 1 B to 8 MiB, back to back:
#     the time each took, the peak throughput and the 1-byte latency each
#     reports, and how many of netgap's points have a 95% confidence interval
#     within ±2%;
#  2. the dropout detector against a known disturbance: the same tcp sweep
#     (1 KiB to 1 MiB) with default socket buffers and with tiny ones
#     (--sndbuf 4K --rcvbuf 4K), twice each;
#  3. LogP parameters of tcp, unix and shm at 1 B, 1 KiB, 64 KiB and 1 MiB.
#
#   bash bench/run-sweep.sh [--quick]
#
# Traffic stays on loopback. Output: bench-out/sweep-<timestamp>/ with every
# raw output, the commands, machine.txt and summary.txt.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
QUICK=0
[ "${1:-}" = "--quick" ] && QUICK=1
END=8M; END_BYTES=8388608
if [ "$QUICK" = 1 ]; then END=256K; END_BYTES=262144; fi
# A port of NPtcp's own (its default, 5002, may be taken by another run).
NP_PORT=${NP_PORT:-$((20000 + RANDOM % 20000))}

OUT=$REPO/bench-out/sweep-$(date -u +%Y%m%d-%H%M%S)
mkdir -p "$OUT/raw"
(cd "$REPO" && cargo build --release --quiet)
NETGAP=$REPO/target/release/netgap

{
	echo "cpus: $(nproc)"
	echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
	echo "kernel: $(uname -r)"
	echo "netgap: $($NETGAP --version)"
	echo "NPtcp: $(command -v NPtcp || echo missing)"
	echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
} >"$OUT/machine.txt"

log() { echo "$*" >>"$OUT/commands.txt"; }
secs() { date +%s.%N; }

# 1. netgap against NPtcp, same range, one after the other.
log "NPtcp -P $NP_PORT &  ;  NPtcp -h 127.0.0.1 -P $NP_PORT -u $END_BYTES -o np.out"
NPtcp -P "$NP_PORT" >"$OUT/raw/nptcp-receiver.txt" 2>&1 &
NP_RX=$!
sleep 0.5
t0=$(secs)
(cd "$OUT/raw" && timeout 1800 NPtcp -h 127.0.0.1 -P "$NP_PORT" -u "$END_BYTES" -o np.out >nptcp.txt 2>&1) || echo "NPtcp failed (see $OUT/raw/nptcp.txt)" >&2
t1=$(secs)
wait "$NP_RX" 2>/dev/null || true
echo "$t0 $t1" >"$OUT/raw/nptcp.time"

log "$NETGAP sweep -t tcp --end $END --json sweep-tcp.jsonl"
t0=$(secs)
timeout 1800 "$NETGAP" sweep -t tcp --end "$END" --json "$OUT/raw/sweep-tcp.jsonl" >"$OUT/raw/sweep-tcp.txt" 2>&1 || echo "netgap sweep failed" >&2
t1=$(secs)
echo "$t0 $t1" >"$OUT/raw/sweep-tcp.time"

# 1b. The same netgap sweep repeating each point until its 95% interval is
#     within ±2% (at least 5, at most 20 trials).
log "$NETGAP sweep -t tcp --end $END --ci 95,2 --ci-reps 5,20 --json sweep-tcp-ci.jsonl"
t0=$(secs)
timeout 1800 "$NETGAP" sweep -t tcp --end "$END" --ci 95,2 --ci-reps 5,20 --json "$OUT/raw/sweep-tcp-ci.jsonl" >"$OUT/raw/sweep-tcp-ci.txt" 2>&1 || echo "netgap sweep --ci failed" >&2
t1=$(secs)
echo "$t0 $t1" >"$OUT/raw/sweep-tcp-ci.time"

# 2. The detector: clean against tiny socket buffers, twice each, interleaved.
for round in 1 2; do
	for variant in clean tinybuf; do
		extra=()
		[ "$variant" = tinybuf ] && extra=(--sndbuf 4K --rcvbuf 4K)
		log "$NETGAP sweep -t tcp --start 1K --end 1M ${extra[*]} --json dropout-$variant-$round.jsonl"
		timeout 900 "$NETGAP" sweep -t tcp --start 1K --end 1M "${extra[@]}" \
			--json "$OUT/raw/dropout-$variant-$round.jsonl" >"$OUT/raw/dropout-$variant-$round.txt" 2>&1 || echo "sweep $variant failed" >&2
	done
done

# 3. LogP, client and server on different CPUs.
log "$NETGAP logp -t tcp,unix,shm --sizes 1,1K,64K,1M --pin 0,1 --json logp.jsonl"
timeout 900 "$NETGAP" logp -t tcp,unix,shm --sizes 1,1K,64K,1M --pin 0,1 \
	--json "$OUT/raw/logp.jsonl" >"$OUT/raw/logp.txt" 2>&1 || echo "logp failed" >&2

echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUT/machine.txt"

python3 - "$OUT" >"$OUT/summary.txt" <<'EOF'
import json, sys, os
out = sys.argv[1]
raw = os.path.join(out, "raw")
def took(name):
    a, b = open(os.path.join(raw, name + ".time")).read().split()
    return float(b) - float(a)
def records(name):
    p = os.path.join(raw, name)
    return [json.loads(l) for l in open(p)] if os.path.exists(p) else []

print("== netgap sweep vs NPtcp, tcp loopback ==")
np_rows = []
p = os.path.join(raw, "np.out")
if os.path.exists(p):
    for line in open(p):
        f = line.split()
        if len(f) >= 3:
            np_rows.append((int(f[0]), float(f[1]), float(f[2])))
if np_rows:
    peak = max(np_rows, key=lambda r: r[1])
    one = [r for r in np_rows if r[0] == 1]
    print(f"NPtcp : {took('nptcp'):7.1f} s, {len(np_rows)} points, peak {peak[1]/1000:.2f} Gbit/s at {peak[0]} B, "
          f"1-byte latency {one[0][2]*1e6:.2f} us" if one else "")
recs = records("sweep-tcp.jsonl")
if recs:
    peak = max(recs, key=lambda r: r["value"])
    one = [r for r in recs if r["size_bytes"] == 1]
    def hw(r):
        s = r["stats"]; m = sum(s["reps"]) / len(s["reps"])
        return 100 * (s["ci95_high"] - s["ci95_low"]) / 2 / m
    within = sum(1 for r in recs if hw(r) <= 2.0)
    drops = [r for r in recs if r.get("dropout")]
    print(f"netgap: {took('sweep-tcp'):7.1f} s, {len(recs)} points, peak {peak['value']:.2f} Gbit/s at {peak['size_bytes']} B, "
          f"1-byte latency {one[0]['block_time_us']:.2f} us" if one else "")
    hws = sorted(hw(r) for r in recs)
    print(f"netgap points with ci95 half-width <= 2%: {within} of {len(recs)}; "
          f"median half-width {hws[len(hws)//2]:.1f}%, worst {hws[-1]:.1f}%")
    print(f"netgap dropouts: {len(drops)} " + ", ".join(f"{r['size_bytes']} (-{r['dropout']['depth_pct']:.0f}%)" for r in drops))
recs = records("sweep-tcp-ci.jsonl")
if recs:
    met = sum(1 for r in recs if r["ci_target"]["met"])
    hws = sorted(r["ci_target"]["achieved_half_width_pct"] for r in recs)
    peak = max(recs, key=lambda r: r["value"])
    print(f"netgap --ci 95,2: {took('sweep-tcp-ci'):7.1f} s, target met at {met} of {len(recs)} points, "
          f"median half-width {hws[len(hws)//2]:.1f}%, peak {peak['value']:.2f} Gbit/s, "
          f"dropouts {sum(1 for r in recs if r.get('dropout'))}")

print()
print("== dropout detector: tcp 1K..1M, default buffers vs --sndbuf 4K --rcvbuf 4K ==")
for round_ in (1, 2):
    for variant in ("clean", "tinybuf"):
        rs = records(f"dropout-{variant}-{round_}.jsonl")
        d = [r for r in rs if r.get("dropout")]
        desc = ", ".join(f"{r['size_bytes']} -{r['dropout']['depth_pct']:.0f}% vs {r['dropout']['reference_size_bytes']}" for r in d)
        print(f"round {round_} {variant:8}: {len(rs)} points, {len(d)} dropouts {desc}")

print()
print("== LogP (us; trimmed mean ± stdev of the repetitions) ==")
rs = records("logp.jsonl")
rows = {}
for r in rs:
    rows.setdefault((r["transport"], r["size_bytes"]), {})[r["metric"]] = (r["value"], r["stats"]["stdev"])
print(f"{'transport':9} {'size':>8} {'o_s':>16} {'o_r':>16} {'g':>16} {'L':>16}")
for (t, s), m in rows.items():
    cell = lambda k: f"{m[k][0]:8.2f} ±{m[k][1]:6.2f}" if k in m else "-"
    print(f"{t:9} {s:>8} {cell('send_overhead_us'):>16} {cell('recv_overhead_us'):>16} {cell('gap_us'):>16} {cell('latency_us'):>16}")
EOF
cat "$OUT/summary.txt"
echo "output: $OUT"
