#!/usr/bin/env bash
# The seeds' stack comparison on this machine, in one run: 1-byte latency and
# 1 MiB bandwidth, with CPU of both ends, for every available transport in
# both completion modes (and tcp with busy polling), next to the floor
# programs: shared-memory ping-pong and memcpy bandwidth.
#
#   bash bench/run-stacks.sh [--quick]
#
# Placement: client on CPU 0, server on CPU 1 (netgap --pin 0,1; the floor
# programs' own flags). Output: bench-out/stacks-<timestamp>/ with every raw
# output, the commands, and table.txt.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
FLOOR_SRC=${FLOOR_SRC:-$REPO/../shared/bench/floor}
QUICK=0
[ "${1:-}" = "--quick" ] && QUICK=1

if [ "$QUICK" = 1 ]; then
	ITERS=20000; REPS=3; REP_TIME=100ms; FLOOR_ITERS=20000
else
	ITERS=100000; REPS=5; REP_TIME=300ms; FLOOR_ITERS=100000
fi

OUT=$REPO/bench-out/stacks-$(date -u +%Y%m%d-%H%M%S)
mkdir -p "$OUT/raw" "$OUT/floor"
cp "$FLOOR_SRC"/*.c "$FLOOR_SRC"/*.h "$FLOOR_SRC"/Makefile "$OUT/floor/"
make -s -C "$OUT/floor" >/dev/null
(cd "$REPO" && cargo build --release --quiet)
NETGAP=$REPO/target/release/netgap

run() { # name, command...
	local name=$1; shift
	echo "$*" >>"$OUT/commands.txt"
	timeout 600 "$@" >"$OUT/raw/$name.txt" 2>"$OUT/raw/$name.err" || echo "failed: $name (see $OUT/raw/$name.err)" >&2
}

{
	echo "cpus: $(nproc)"
	echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
	echo "kernel: $(uname -r)"
	echo "netgap: $($NETGAP --version)"
} >"$OUT/machine.txt"

run floor_shm "$OUT/floor/shm_pingpong" -m 1 -n "$FLOOR_ITERS" -a 0 -b 1
run floor_memcpy "$OUT/floor/memcpy_bw" -s 1m

available=$($NETGAP list | awk '/^transports:/{t=1; next} t && $2=="yes"{print $1}')
for tr in $available; do
	bw_size=1M
	# udp carries one datagram per message: its largest message instead.
	[ "$tr" = udp ] && bw_size=60K
	for mode in event poll; do
		run "netgap_${tr}_${mode}_lat" "$NETGAP" run pingpong -t "$tr" --mode "$mode" --sizes 1 \
			--iterations "$ITERS" --reps "$REPS" --pin 0,1 --json "$OUT/raw/netgap.jsonl"
		run "netgap_${tr}_${mode}_bw" "$NETGAP" run stream -t "$tr" --mode "$mode" --sizes "$bw_size" \
			--rep-time "$REP_TIME" --reps "$REPS" --pin 0,1 --json "$OUT/raw/netgap.jsonl"
	done
done
if echo "$available" | grep -qx tcp; then
	for mode in event poll; do
		run "netgap_tcpbusy_${mode}_lat" "$NETGAP" run pingpong -t tcp --busy-poll 50 --mode "$mode" \
			--sizes 1 --iterations "$ITERS" --reps "$REPS" --pin 0,1 --json "$OUT/raw/netgap.jsonl"
		run "netgap_tcpbusy_${mode}_bw" "$NETGAP" run stream -t tcp --busy-poll 50 --mode "$mode" \
			--sizes 1M --rep-time "$REP_TIME" --reps "$REPS" --pin 0,1 --json "$OUT/raw/netgap.jsonl"
	done
fi

python3 - "$OUT" <<'PY' | tee "$OUT/table.txt"
import json, re, sys, os
out = sys.argv[1]
raw = os.path.join(out, "raw")
def read(n):
    p = os.path.join(raw, n)
    return open(p).read() if os.path.exists(p) else ""
m = re.search(r"msg=1 .*?median=([\d.]+)", read("floor_shm.txt"))
shm_floor = float(m.group(1)) if m else None
mc = None
for line in read("floor_memcpy.txt").splitlines():
    g = re.findall(r"Gbit/s median=([\d.]+)", line)
    if g:
        mc = float(g[-1])
rows = {}
for line in read("netgap.jsonl").splitlines():
    r = json.loads(line)
    o = r["options"]["transport"]
    name = r["transport"] + ("+busy-poll" if o.get("busy_poll_us") else "")
    if r["test"] == "stream" and r["size_bytes"] != 1 << 20:
        name += f"@{r['size_bytes'] // 1024}K"
    key = name.split("@")[0]
    rows.setdefault((key, r["mode"]), {})[r["test"]] = r
    if "@" in name:
        rows[(key, r["mode"])]["bw_note"] = name.split("@")[1]
print(f"floor: shm_pingpong 1 B median half round trip {shm_floor} us; memcpy 1 MiB {mc} Gbit/s")
print()
print(f"{'stack':<16}{'mode':<7}{'lat_1B_us':>10}{'p50_us':>8}{'ci95%':>7}{'cpu_c%':>8}{'cpu_s%':>8}{'bw_1M_gbps':>12}{'ci95%':>7}{'cpu_c%':>8}{'cpu_s%':>8}{'sd_c_us/KiB':>12}")
for (name, mode), t in sorted(rows.items()):
    def cells(r):
        if r is None:
            return ["-"] * 4
        mean = sum(r["stats"]["reps"]) / len(r["stats"]["reps"])
        ci = 100 * (r["stats"]["ci95_high"] - r["stats"]["ci95_low"]) / 2 / mean
        return [f"{r['value']:.3f}", f"{ci:.1f}", f"{r['cpu']['local']['process_percent']:.0f}", f"{r['cpu']['remote']['process_percent']:.0f}"]
    l, b = t.get("pingpong"), t.get("stream")
    sd = b["service_demand_us_per_kib"]["local"] if b and b.get("service_demand_us_per_kib") else None
    lc, bc = cells(l), cells(b)
    p50 = f"{l['percentiles']['p50']:.3f}" if l and l.get("percentiles") else "-"
    if "bw_note" in t:
        name = f"{name} (bw at {t['bw_note']})"
    print(f"{name:<16}{mode:<7}{lc[0]:>10}{p50:>8}{lc[1]:>7}{lc[2]:>8}{lc[3]:>8}{bc[0]:>12}{bc[1]:>7}{bc[2]:>8}{bc[3]:>8}{(f'{sd:.4f}' if sd else '-'):>12}")
shm = rows.get(("shm", "poll"), {})
if shm_floor and "pingpong" in shm:
    print(f"\nshm poll 1 B latency / floor (medians of the half round trips): {shm['pingpong']['percentiles']['p50'] / shm_floor:.3f} (target <= 1.10)")
if mc and "stream" in shm:
    print(f"shm poll 1 MiB bandwidth / memcpy: {shm['stream']['value'] / mc:.3f} (target >= 0.80)")
PY
echo "raw outputs: $OUT"
