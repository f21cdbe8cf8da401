#!/usr/bin/env bash
# Every test over every cross-host stack on shaped links, in one run, each
# value beside the limit its record carries (`physics.payload_limit_gbps`)
# and any fault the record states (BENCHMARKS.md, "Physics: every test
# against its link"). Run as root; builds with the xdp feature (libxdp-dev,
# libbpf-dev).
#
#   1. a switch of four hosts, every bridge port shaped to RATE (default
#      1G): pingpong 1 MiB, stream 64 KiB, bibw, bibw-pingpong 1 MiB over
#      tcp, udp, xdp and mptcp; the sweep's peak over tcp; fan-in of three
#      clients; pio 1S/3C and 3S/1C; web serving a 64 KiB file;
#   2. a 2-host mesh of three links at RATE each: multirail over 3 links
#      over tcp and xdp.
#
# Results go to physics-TIMESTAMP.jsonl in the current directory (or $1),
# then a table: test, stack, value, limit, value/limit, fault. The testbed
# is always taken down, also when a step fails; a step that fails is named
# and the rest still run.
#
# Usage: sudo bash bench/run-physics.sh [RESULTS.jsonl] [RATE]
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
cargo build --release --features xdp --manifest-path "$here/Cargo.toml" >/dev/null
netgap="$here/target/release/netgap"
out="${1:-physics-$(date -u +%Y%m%dT%H%M%S).jsonl}"
rate="${2:-1G}"

name=physbench
hosts="@/run/netgap/$name/hosts.json"
down() { "$netgap" testbed down --name "$name" >/dev/null 2>&1 || true; }
trap down EXIT
fresh() { # testbed up flags...
	down
	"$netgap" testbed up --name "$name" "$@" >/dev/null
}
failed=()
step() { # what, command...
	local what=$1
	shift
	echo "== $what" >&2
	if ! "$@" --json "$out" >/dev/null; then
		failed+=("$what")
	fi
}

# 1. A switch of four hosts, every port shaped.
fresh --hosts 4 --rate "$rate"
common=(--hosts "$hosts" --reps 5)
# udp carries at most 65,483 bytes a message: its points are at 60 KiB.
for t in tcp,xdp,mptcp udp; do
	big=1M mid=64K
	if [ "$t" = udp ]; then big=60K mid=60K; fi
	step "pingpong $big $t" "$netgap" run pingpong -t "$t" -s "$big" "${common[@]}" -n 20
	step "stream $mid $t" "$netgap" run stream -t "$t" -s "$mid" "${common[@]}" --rep-time 1s
	step "bibw $mid $t" "$netgap" run bibw -t "$t" -s "$mid" "${common[@]}" --rep-time 1s
	step "bibw-pingpong $big $t" "$netgap" run bibw-pingpong -t "$t" -s "$big" "${common[@]}" -n 20
done
step "sweep" "$netgap" sweep -t tcp --hosts "$hosts" --start 64K --end 4M
step "fan-in" "$netgap" run fanin --clients 3 "${common[@]}" --duration 1s
step "pio 1S/3C" "$netgap" run pio --servers 1 --clients 3 --op write,read "${common[@]}"
step "pio 3S/1C" "$netgap" run pio --servers 3 --clients 1 --op write,read "${common[@]}"
step "web 64 KiB" "$netgap" run web -s 64K --clients 3 "${common[@]}" --duration 1s

# 2. Three shaped links between two hosts.
fresh --hosts 2 --topology mesh --links 3 --rate "$rate"
step "multirail 3 links" "$netgap" run multirail --links 3 -t tcp,xdp "${common[@]}" --duration 1s

python3 - "$out" <<'PY'
import json, sys
rows = []
for line in open(sys.argv[1]):
    r = json.loads(line)
    phys = r.get("physics") or {}
    limit = phys.get("payload_limit_gbps")
    fault = (phys.get("fault") or {}).get("kind", "")
    if any(w.startswith("short window") for w in r.get("warnings", [])):
        fault = (fault + " short_window").strip()
    unit = "us" if r["metric"] == "latency_us" else r["metric"]
    app = (r.get("app") or {}).get("options", {})
    shape = ""
    if r["test"] == "pio":
        shape = "%sS/%sC %s" % (app.get("servers", 1), r.get("client_hosts", "?"), app.get("op", ""))
    rows.append((r["test"] + (" " + shape if shape else ""), r["transport"], r["size_bytes"],
                 r["value"], unit, limit, fault))
print("| test | stack | size, bytes | value | unit | limit, Gbit/s | value / limit | fault |")
print("|---|---|---|---|---|---|---|---|")
for t, s, size, v, unit, limit, fault in rows:
    ratio = "%.3f" % (v / limit) if limit and unit == "bandwidth_gbps" else ""
    print("| %s | %s | %d | %.4g | %s | %s | %s | %s |" % (
        t, s, size, v, unit, "%.3f" % limit if limit else "null", ratio, fault or "none"))
PY
if [ ${#failed[@]} -gt 0 ]; then
	echo "steps that failed: ${failed[*]}" >&2
fi
echo "results: $out" >&2
