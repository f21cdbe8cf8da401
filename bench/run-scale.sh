#!/usr/bin/env bash
# Many flows over several client hosts of a namespace testbed (issue 17's
# scale benchmark): hotspot, connect and web (TESTS) with 10,000, 50,000
# and 100,000 flows (COUNTS) against one server host, over CLIENT_HOSTS
# client hosts
# (default: as many as keep each client within its descriptor limit at the
# largest count). The server's agent spreads a role past its own limit
# over shard processes on one listener; the record's `hosts_cpu[]` says
# how many processes its peak memory counts (`processes`). Each point runs
# on a fresh testbed, so every host's peak memory (the agents' VmHWM, plus
# their shards') is that point's; the agents' resident memory before the
# point is read from /proc, so memory per flow is (peak - before) / the
# host's flows.
#
# web runs nginx on the server host serving one 1 KiB file to kept-alive
# clients (WEB_FLAGS), with a window of WEB_DURATION (the clients connect
# all at once at its start, so a longer window than the engine tests').
# nginx is not the agent: its processes' summed peak resident memory is
# the record's `app.services[0].facts.peak_rss_kib`, reported beside the
# agents' peaks.
#
# A point the hosts cannot run (a descriptor limit, the port range) fails
# in one line; the line is kept in OUT_DIR/T-N.err and in the summary, and
# the script goes on.
#
# Results (JSON Lines per point, summary.md) go to OUT_DIR (default
# scale-TIMESTAMP). The testbed is NAME (default scalebench), so a run
# can stand beside another's testbed. Needs root.
#
# Usage: sudo bash bench/run-scale.sh [OUT_DIR]
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
cargo build --release --manifest-path "$here/Cargo.toml" >/dev/null
netgap="$here/target/release/netgap"
out="${1:-scale-$(date -u +%Y%m%dT%H%M%S)}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"

# Every flow is a descriptor on its client host and on the server: raise
# the hard limit where the kernel lets root (CAP_SYS_RESOURCE), then the
# soft one to it. The agents inherit both from `testbed up`.
ulimit -Hn 1048576 2>/dev/null || ulimit -Hn 200000 2>/dev/null || true
ulimit -n "$(ulimit -Hn)"
hard="$(ulimit -Hn)"
reps="${REPS:-3}"
dur="${DURATION:-2s}"
timeout="${TIMEOUT:-10s}"
counts="${COUNTS:-10000 50000 100000}"
tests="${TESTS:-hotspot connect web}"
web_flags="${WEB_FLAGS:---server nginx -s 1K}"
web_dur="${WEB_DURATION:-10s}"
# A client agent holds its flows in one process: its limit less what the
# engine keeps spare (workers, control, files) bounds its share.
fit=$(( hard - 256 ))
largest=0
for n in $counts; do [ "$n" -gt "$largest" ] && largest=$n; done
client_hosts="${CLIENT_HOSTS:-$(( (largest + fit - 1) / fit ))}"
[ "$client_hosts" -ge 2 ] || client_hosts=2

name="${NAME:-scalebench}"
hosts="@/run/netgap/$name/hosts.json"
down() { "$netgap" testbed down --name "$name" >/dev/null 2>&1 || true; }
trap down EXIT

{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "nproc: $(nproc)"
    echo "kernel: $(uname -r)"
    echo "descriptor limit (hard): $hard"
    echo "client hosts: $client_hosts, repetitions: $reps, window: $dur (web: $web_dur), I/O timeout: $timeout"
    echo "fs.file-max: $(cat /proc/sys/fs/file-max), somaxconn: $(cat /proc/sys/net/core/somaxconn)"
} > "$out/machine.txt"

for t in $tests; do
    for n in $counts; do
        down
        "$netgap" testbed up --name "$name" --hosts $((client_hosts + 1)) --topology switch >/dev/null
        # Resident memory of each idle agent before the point, KiB.
        for f in /run/netgap/$name/h*.pid; do
            h="$(basename "$f" .pid)"
            echo "$h $(awk '/VmRSS/ {print $2}' "/proc/$(cat "$f")/status")"
        done > "$out/$t-$n.rss0"
        flags=(--duration "$dur")
        if [ "$t" = web ]; then
            # shellcheck disable=SC2206
            flags=(--duration "$web_dur" $web_flags)
        fi
        t0=$(date +%s.%N)
        if "$netgap" run "$t" --hosts "$hosts" --clients "$n" --reps "$reps" "${flags[@]}" \
            --timeout "$timeout" --json "$out/$t-$n.jsonl" > "$out/$t-$n.out" 2> "$out/$t-$n.err"; then
            :
        fi
        t1=$(date +%s.%N)
        awk "BEGIN { print $t1 - $t0 }" > "$out/$t-$n.wall"
        echo "$t $n: $(tail -n 1 "$out/$t-$n.out") $(head -c 300 "$out/$t-$n.err")"
    done
done

python3 - "$out" "$reps" "$dur" <<'PY'
import json, os, sys
out, reps, dur = sys.argv[1], int(sys.argv[2]), sys.argv[3]
window_s = float(dur.rstrip("s"))
rows = []
points = []
for fn in os.listdir(out):
    if fn.endswith(".wall"):
        t, n = fn[:-5].split("-")
        points.append((t, int(n)))
order = {"hotspot": 0, "connect": 1, "web": 2}
web_rows = []
for t, n in sorted(points, key=lambda p: (order.get(p[0], 3), p[1])):
    base = f"{t}-{n}"
    fn = base + ".wall"
    wall = float(open(os.path.join(out, fn)).read())
    rss0 = dict(l.split() for l in open(os.path.join(out, base + ".rss0")))
    path = os.path.join(out, base + ".jsonl")
    recs = [json.loads(l) for l in open(path)] if os.path.exists(path) else []
    if not recs:
        err = open(os.path.join(out, base + ".err")).read().strip().splitlines()
        line = err[0].split("; points measured before")[0] if err else "no record"
        (web_rows if t == "web" else rows).append((t, n, None, line))
        continue
    r = recs[-1]
    if t == "web":
        flows_of = {}
        for f in r["flows"]:
            flows_of[f["host"]] = flows_of.get(f["host"], 0) + 1
        hosts = []
        for h in r["hosts_cpu"]:
            k = flows_of.get(h["host"], 0)
            hosts.append((h["host"], h["role"], h["peak_rss_kib"], h["peak_rss_kib"] - int(rss0.get(h["host"], 0)), k))
        nginx_kib = int(r["app"]["services"][0]["facts"].get("peak_rss_kib", 0))
        web_rows.append((t, n, dict(r=r, hosts=hosts, nginx_kib=nginx_kib), None))
        continue
    flows_of = {}
    for f in r["flows"]:
        flows_of[f["host"]] = flows_of.get(f["host"], 0) + 1
    accounted = all(f["bytes_tx"] > 0 for f in r["flows"]) and len(r["flows"]) == n
    b = r["bytes"]
    hosts = []
    for h in r["hosts_cpu"]:
        peak = h["peak_rss_kib"]
        k = flows_of.get(h["host"], n if h["role"] == "server" else 0)
        grown = peak - int(rss0.get(h["host"], 0))
        hosts.append((h["host"], h["role"], peak, grown, k, h.get("processes", 1)))
    # Each repetition sets its flows up again: the wall time beyond the
    # repetitions' warm-ups (a fifth of the window) and windows, per
    # repetition, bounds the setup from above (it also holds the session's
    # start, each repetition's drain and teardown).
    beyond = max(wall / reps - 1.2 * window_s, 0.001)
    rows.append((t, n, dict(r=r, hosts=hosts, accounted=accounted, bytes=b, beyond=beyond, wall=wall), None))

with open(os.path.join(out, "summary.md"), "w") as s:
    s.write(open(os.path.join(out, "machine.txt")).read() + "\n")
    s.write("| test | flows | result | p50 / p99 | flows with bytes | bytes client tx = server rx | wall per rep beyond window, s | flows/s set up (bound) | peak RSS per host, MiB | KiB per flow (server; clients) | server processes |\n")
    s.write("|---|---|---|---|---|---|---|---|---|---|---|\n")
    for t, n, d, err in rows:
        if d is None:
            s.write(f"| {t} | {n:,} | refused: {err} | | | | | | | | |\n")
            continue
        r = d["r"]
        unit = "us" if r["metric"] != "connections_per_s" else "conn/s"
        val = f'{r["value"]:,.0f} {unit}'
        p = r.get("percentiles") or {}
        pp = f'{p.get("p50", 0)/1000:,.1f} / {p.get("p99", 0)/1000:,.1f} ms' if p else ""
        peaks = ", ".join(f'{h}: {peak/1024:.1f}' for h, role, peak, grown, k, p in d["hosts"])
        srv = [grown / k for h, role, peak, grown, k, p in d["hosts"] if role == "server" and k]
        cli = [grown / k for h, role, peak, grown, k, p in d["hosts"] if role == "client" and k]
        procs = [p for h, role, peak, grown, k, p in d["hosts"] if role == "server"]
        per = f'{srv[0]:.2f}; {min(cli):.2f}-{max(cli):.2f}' if srv and cli else ""
        b = d["bytes"]
        bal = "yes" if b["client_tx"] == b["server_rx"] and b["client_rx"] == b["server_tx"] else f'no ({b})'
        s.write(f'| {t} | {n:,} | {val} | {pp} | {"all" if d["accounted"] else "NOT all"} | {bal} | {d["beyond"]:.2f} | {n / d["beyond"]:,.0f} | {peaks} | {per} | {procs[0] if procs else ""} |\n')
    if web_rows:
        s.write("\n| test | clients | transactions/s | p50 / p99 | errors | clients with a transaction | every response checked | peak RSS per host (agents), MiB | KiB per client (client hosts) | nginx workers | nginx peak RSS (its processes summed), MiB |\n")
        s.write("|---|---|---|---|---|---|---|---|---|---|---|\n")
    for t, n, d, err in web_rows:
        if d is None:
            s.write(f"| {t} | {n:,} | refused: {err} | | | | | | | | |\n")
            continue
        r = d["r"]
        m = r["app"]["metrics"]
        p = r.get("percentiles") or {}
        pp = f'{p.get("p50", 0)/1000:,.1f} / {p.get("p99", 0)/1000:,.1f} ms' if p else ""
        served = sum(1 for f in r["flows"] if f.get("value"))
        checked = "yes" if m.get("verified") == m.get("checked") and m.get("checked", 0) >= m.get("transactions", 0) else "no"
        peaks = ", ".join(f'{h}: {peak/1024:.1f}' for h, role, peak, grown, k in d["hosts"])
        cli = [grown / k for h, role, peak, grown, k in d["hosts"] if role == "client" and k]
        per = f'{min(cli):.2f}-{max(cli):.2f}' if cli else ""
        svc = r["app"]["services"][0]
        s.write(f'| web | {n:,} | {r["value"]:,.0f} | {pp} | {m.get("errors", 0):,.0f} | {served:,} | {checked} | {peaks} | {per} | {svc.get("workers")} | {d["nginx_kib"]/1024:.1f} |\n')
print(open(os.path.join(out, "summary.md")).read())
PY
echo "results: $out"
