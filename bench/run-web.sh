#!/usr/bin/env bash
# The application workloads on the namespace testbed, as the studies'
# figures: seed 001's Figure 8 (web server transactions per second against
# file size and against Zipf alpha, offload on and off) and seed 000's
# Figure 13 (time of one gather against the number of hosts, with the share
# of connection setup), plus a check that netgap's own HTTP load generator
# is not the bottleneck: netgap `web` against wrk on the same path, with the
# same connection count, file and nginx configuration, in one run.
#
# Needs root and Debian's nginx-light, apache2, ganglia-monitor and wrk.
# Results (JSON Lines and summary.md) go to OUT_DIR (default
# web-TIMESTAMP). QUICK=1 runs a reduced set (fewer sizes, clients,
# repetitions and host counts); LOADGEN_ONLY=1 only the load-generator
# check, LG_REPS=N alternations of it.
#
# Usage: sudo bash bench/run-web.sh [OUT_DIR]
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
cargo build --release --manifest-path "$here/Cargo.toml" >/dev/null
netgap="$here/target/release/netgap"
out="${1:-web-$(date -u +%Y%m%dT%H%M%S)}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
for p in nginx apache2 gmond wrk; do
    command -v "$p" >/dev/null || [ -x "/usr/sbin/$p" ] || {
        echo "missing $p: apt-get install nginx-light apache2 ganglia-monitor wrk" >&2
        exit 1
    }
done

quick="${QUICK:-0}"
if [ "$quick" = 1 ]; then
    reps=2; dur=1s; sizes=1K,16K,256K,1M; clients=3,12,24; alphas=0.5,0.75,1.0
    host_counts="4 8 16"; lg_reps=${LG_REPS:-2}; lg_secs=3
else
    reps=3; dur=2s; sizes=1K,4K,16K,64K,256K,1M; clients=3,6,12,24
    alphas=0.5,0.625,0.75,0.875,1.0; host_counts="4 8 12 16"; lg_reps=${LG_REPS:-3}; lg_secs=5
fi

tb=i12bench
wrk_dir=""
ngx_pid=""
cleanup() {
    [ -n "$ngx_pid" ] && kill "$ngx_pid" 2>/dev/null || true
    [ -n "$wrk_dir" ] && rm -rf "$wrk_dir"
    "$netgap" testbed down --name "$tb" >/dev/null 2>&1 || true
}
trap cleanup EXIT
# A second between runs, so one run's teardown (a server exiting, its
# sockets closing) falls outside the next run's window.
settle() { sleep 1; }
testbed() { # HOSTS
    "$netgap" testbed down --name "$tb" >/dev/null 2>&1 || true
    "$netgap" testbed up --name "$tb" --hosts "$1" --topology switch >/dev/null
}
hosts="@/run/netgap/$tb/hosts.json"
ns() { echo "ngtb-$tb-$1"; }

# 1. Load generator: 12 connections from h2 to nginx on h1, 1 KiB file;
#    netgap and wrk alternate, each run as long.
testbed 2
addr=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["hosts"][0]["address"])' "/run/netgap/$tb/hosts.json")
for i in $(seq "$lg_reps"); do
    settle; "$netgap" run web --hosts "$hosts" --clients 12 -s 1K --reps 1 --duration "${lg_secs}s" \
        --label "netgap-verify-all" --json "$out/loadgen.jsonl" >/dev/null
    settle; "$netgap" run web --hosts "$hosts" --clients 12 -s 1K --reps 1 --duration "${lg_secs}s" \
        --verify-fraction 0 --label "netgap-verify-none" --json "$out/loadgen.jsonl" >/dev/null
    # wrk against the same nginx configuration netgap wrote and recorded,
    # in a directory of its own, serving a 1 KiB file.
    wrk_dir=$(mktemp -d /tmp/netgap-wrk.XXXXXX)
    chmod 755 "$wrk_dir"
    python3 - "$out/loadgen.jsonl" "$wrk_dir" <<'PY'
import json, os, re, sys
rec = [json.loads(l) for l in open(sys.argv[1])][-1]
conf = rec["app"]["services"][0]["config"]
old = re.search(r"^pid (.*)/nginx.pid;", conf, re.M).group(1)
new = sys.argv[2]
conf = conf.replace(old, new)
open(os.path.join(new, "nginx.conf"), "w").write(conf)
os.makedirs(os.path.join(new, "www"))
open(os.path.join(new, "www", "f0.bin"), "wb").write(os.urandom(1024))
os.chmod(os.path.join(new, "www"), 0o755)
os.chmod(os.path.join(new, "www", "f0.bin"), 0o644)
port = re.search(r"listen [^:]+:(\d+)[ ;]", conf).group(1)
open(os.path.join(new, "port"), "w").write(port)
PY
    port=$(cat "$wrk_dir/port")
    # nginx and wrk each in a session of its own, as netgap's agents and the
    # services they start are: with the scheduler's autogroups, processes
    # of one session share one CPU share under load.
    setsid ip netns exec "$(ns h1)" nginx -p "$wrk_dir" -e "$wrk_dir/error.log" -c "$wrk_dir/nginx.conf" &
    ngx_pid=$!
    sleep 1
    TIMEFORMAT='%U %S'
    { time setsid -w ip netns exec "$(ns h2)" wrk -t 2 -c 12 -d "${lg_secs}s" "http://$addr:$port/f0.bin" \
        >"$out/wrk-$i.txt" ; } 2>"$out/wrk-$i.cpu"
    kill "$ngx_pid"; wait "$ngx_pid" 2>/dev/null || true; ngx_pid=""
    rm -rf "$wrk_dir"; wrk_dir=""
done

if [ "${LOADGEN_ONLY:-0}" != 1 ]; then
# 2. Figure 8a and 8b on four hosts: nginx and Apache on h1, clients
#    spread over h2..h4, offload on and off one after the other.
testbed 4
settle; "$netgap" run web --hosts "$hosts" --server apache,nginx -s "$sizes" --clients "$clients" \
    --reps "$reps" --duration "$dur" --conditions offload=on,off --json "$out/fig8a.jsonl" >/dev/null
settle; "$netgap" run web --hosts "$hosts" --server apache,nginx --trace zipf --files 360 \
    --alpha "$alphas" --clients 12 --reps "$reps" --duration "$dur" \
    --conditions offload=on,off --json "$out/fig8b.jsonl" >/dev/null

# 3. Figure 13: one gather from every other host, 4 to 16 hosts; gmond and
#    the built-in responder (8 KiB, about gmond's answer) over tcp and uring.
for n in $host_counts; do
    testbed "$n"
    settle; "$netgap" run gather --hosts "$hosts" --responder gmond --reps "$reps" --duration "$dur" \
        --label "hosts=$n" --json "$out/fig13.jsonl" >/dev/null
    settle; "$netgap" run gather --hosts "$hosts" -t tcp,uring -s 8K --reps "$reps" --duration "$dur" \
        --label "hosts=$n" --json "$out/fig13.jsonl" >/dev/null
done

fi

python3 - "$out" >"$out/summary.md" <<'PY'
import glob, json, os, re, sys
out = sys.argv[1]
def recs(name):
    p = os.path.join(out, name)
    return [json.loads(l) for l in open(p)] if os.path.exists(p) else []
def client_cpu_s_per_s(r):
    return sum(h["cpu"]["process_percent"] for h in r["hosts_cpu"] if h["role"] == "client") / 100

print("## Load generator: netgap web against wrk (12 connections, 1 KiB, h2 -> nginx on h1)\n")
print("| run | generator | transactions/s | client CPU µs per transaction |")
print("|---|---|---:|---:|")
by = {}
for r in recs("loadgen.jsonl"):
    label = r["stack"].get("label", "")
    tps = r["value"]
    us = client_cpu_s_per_s(r) / tps * 1e6
    by.setdefault(label, []).append((tps, us))
i = 0
wrk = []
while os.path.exists(os.path.join(out, f"wrk-{i+1}.txt")):
    i += 1
    text = open(os.path.join(out, f"wrk-{i}.txt")).read()
    m = re.search(r"(\d+) requests in ([\d.]+)(m?s)", text)
    n, secs = int(m.group(1)), float(m.group(2)) / (1000 if m.group(3) == "ms" else 1)
    user, sys_ = map(float, open(os.path.join(out, f"wrk-{i}.cpu")).read().split())
    wrk.append((n / secs, (user + sys_) / n * 1e6))
for label, rows in by.items():
    for k, (tps, us) in enumerate(rows, 1):
        print(f"| {k} | netgap ({label}) | {tps:,.0f} | {us:.1f} |")
for k, (tps, us) in enumerate(wrk, 1):
    print(f"| {k} | wrk -t2 -c12 | {tps:,.0f} | {us:.1f} |")
def mean(xs): return sum(xs) / len(xs) if xs else float("nan")
for label, rows in by.items():
    print(f"\nmean netgap ({label}): {mean([t for t,_ in rows]):,.0f} tps, {mean([u for _,u in rows]):.1f} µs CPU/transaction")
print(f"mean wrk: {mean([t for t,_ in wrk]):,.0f} tps, {mean([u for _,u in wrk]):.1f} µs CPU/transaction\n")

def offload(r): return r["stack"]["path"].get("offload")
print("## Figure 8a: transactions per second against file size\n")
rows = {}
for r in recs("fig8a.jsonl"):
    key = (r["app"]["options"]["server"], offload(r), r["clients"])
    rows.setdefault(key, {})[r["size_bytes"]] = r["value"]
sizes = sorted({s for v in rows.values() for s in v})
def fmt_size(s): return f"{s//1048576}M" if s >= 1048576 else f"{s//1024}K"
print("| server | offload | clients | " + " | ".join(fmt_size(s) for s in sizes) + " |")
print("|---|---|---:|" + "---:|" * len(sizes))
for (srv, off, c), v in sorted(rows.items()):
    print(f"| {srv} | {off} | {c} | " + " | ".join(f"{v.get(s, float('nan')):,.0f}" for s in sizes) + " |")
print("\n## Figure 8b: transactions per second against Zipf alpha (12 clients, 360 files)\n")
rows = {}
for r in recs("fig8b.jsonl"):
    key = (r["app"]["options"]["server"], offload(r))
    rows.setdefault(key, {})[r["app"]["options"]["alpha"]] = (r["value"], r["app"]["metrics"]["payload_gbps"])
alphas = sorted({a for v in rows.values() for a in v})
print("| server | offload | " + " | ".join(f"α={a}" for a in alphas) + " |")
print("|---|---|" + "---:|" * len(alphas))
for (srv, off), v in sorted(rows.items()):
    print(f"| {srv} | {off} | " + " | ".join(f"{v[a][0]:,.0f} ({v[a][1]:.2f} Gb/s)" for a in alphas) + " |")
print("\n## Figure 13: time of one sequential gather against hosts\n")
print("| hosts | responder | transport | gather ms | connect µs | exchange µs | connection share | bytes per gather |")
print("|---:|---|---|---:|---:|---:|---:|---:|")
for r in recs("fig13.jsonl"):
    m = r["app"]["metrics"]
    resp = r["app"].get("options", {}).get("responder", "builtin")
    n = r["stack"].get("label", "").split("=")[-1]
    print(f"| {n} | {resp} | {r['transport']} | {r['value']:.3f} | {m['connect_time_us']:.1f} | {m['exchange_time_us']:.1f} | {m['connect_share_pct']:.1f}% | {m['gather_bytes']:,.0f} |")
PY
cat "$out/summary.md"
echo "results: $out"
