#!/usr/bin/env bash
# Compare netgap with established peer tools and with the C floor programs,
# side by side in one run, on TCP loopback (127.0.0.1).
#
#   bash bench/run-peers.sh [--quick] [--skip-netgap] [--rounds R] [--wait-quiet S]
#                           [--retry-disturbed N] [--report-only DIR]
#
#   --quick          fewer iterations, shorter durations, one round (smoke run)
#   --skip-netgap    floor and peer tools only (no cargo build, no netgap)
#   --rounds R       repeat the whole interleaved sequence R times (default 3;
#                    figures are medians over rounds)
#   --wait-quiet S   before each tool, wait up to S seconds for the CPUs to be
#                    idle (under 10% busy) when other work runs on the machine
#   --retry-disturbed N  run a tool again (up to N times) when other work took
#                    more than 5% of the CPUs while it ran
#   --report-only D  re-parse the raw outputs of an earlier run in D, print its table
#
# Environment:
#   FLOOR_SRC        floor programs' sources (default bench/floor)
#   PORT_BASE        first of 7 consecutive TCP ports used (default 17770)
#
# Placement: every server on CPU 1, every client on CPU 0 (taskset, and
# netgap's --pin 0,1).  Results go to bench-out/<timestamp>/: raw/round-N/
# (every tool's own output), commands.txt, machine.txt, results.json, table.txt.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
FLOOR_SRC=${FLOOR_SRC:-$REPO/bench/floor}
PORT_BASE=${PORT_BASE:-17770}
HOST=127.0.0.1
CLIENT_CPU=0
SERVER_CPU=1

QUICK=0
SKIP_NETGAP=0
WAIT_QUIET=0
RETRY_DISTURBED=0
ROUNDS=""
REPORT_ONLY=""
while [ $# -gt 0 ]; do
	case "$1" in
	--quick) QUICK=1 ;;
	--skip-netgap) SKIP_NETGAP=1 ;;
	--rounds) ROUNDS=${2:?--rounds needs a count}; shift ;;
	--retry-disturbed) RETRY_DISTURBED=${2:?--retry-disturbed needs a count}; shift ;;
	--wait-quiet) WAIT_QUIET=${2:?--wait-quiet needs seconds}; shift ;;
	--report-only) REPORT_ONLY=${2:?--report-only needs a directory}; shift ;;
	-h | --help) sed -n '2,24p' "$0"; exit 0 ;;
	*) echo "unknown option: $1" >&2; exit 2 ;;
	esac
	shift
done

# ---------------------------------------------------------------- parameters
LAT_SIZES=(1 64 1024 65536)
BW_SIZES=(65536 131072 262144 1048576)
if [ "$QUICK" = 1 ]; then
	PP_ITERS=10000; PP_WARMUP=1000
	NG_ITERS=10000; NG_REPS=3
	LAT_SECS=1                 # sockperf, qperf tcp_lat
	NP_EXTRA=(-n 200)          # NPtcp: fixed repeats instead of its own choice
	BW_SECS=2                  # floor stream -t, qperf tcp_bw -t
	IPERF_SECS=1               # iperf3 -t (after -O 1)
	NG_REP_TIME=1s; NG_BW_REPS=2
	ROUNDS=${ROUNDS:-1}
else
	PP_ITERS=100000; PP_WARMUP=10000
	NG_ITERS=100000; NG_REPS=5
	LAT_SECS=5
	NP_EXTRA=()
	BW_SECS=5
	IPERF_SECS=4
	NG_REP_TIME=1s; NG_BW_REPS=5
	ROUNDS=${ROUNDS:-3}
fi
SOCKPERF_MIN=14 # sockperf refuses messages shorter than its 14-byte header

P_PINGPONG=$PORT_BASE
P_STREAM=$((PORT_BASE + 1))
P_SOCKPERF=$((PORT_BASE + 2))
P_QPERF=$((PORT_BASE + 3))
P_QPERF_DATA=$((PORT_BASE + 4))
P_NPTCP=$((PORT_BASE + 5))
P_IPERF=$((PORT_BASE + 6))

# ---------------------------------------------------------------- report
# Parses the raw outputs in $1/raw, writes $1/results.json and $1/table.txt,
# prints the table.
report() {
	python3 - "$1" <<'PY'
import glob, json, os, re, statistics, sys

out = sys.argv[1]
LAT = [1, 64, 1024, 65536]
BW = [65536, 131072, 262144, 1048576]
SOCKPERF_MIN = 14
rows = []          # dicts: round, kind, size, tool, stat, value
problems = []

def label(n):
    for unit, k in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= k and n % k == 0:
            return f"{n // k}{unit}"
    return str(n)

def parse_round(rnd, raw):
    def read(name):
        p = os.path.join(raw, name)
        if not os.path.exists(p):
            return None
        with open(p, errors="replace") as f:
            return f.read()

    def add(kind, size, tool, stat, value):
        rows.append(dict(round=rnd, kind=kind, size=size, tool=tool, stat=stat, value=value))

    def missing(what):
        problems.append(f"round {rnd}: {what}")

    for size in LAT:
        # floor: "tcp_pingpong msg=N iters=N half_rtt_us: min=.. median=.. mean=.."
        t = read(f"floor_pingpong_{size}.txt")
        if t is not None:
            m = re.search(r"^tcp_pingpong msg=(\d+) iters=\d+ half_rtt_us: (.*)$", t, re.M)
            if m and int(m.group(1)) == size:
                kv = dict(re.findall(r"(\w+)=([\d.]+)", m.group(2)))
                add("lat", size, "floor", "median", float(kv["median"]))
                add("lat", size, "floor", "mean", float(kv["mean"]))
            else:
                missing(f"floor pingpong {size}: no result")
        # netgap: JSON lines; value = trimmed mean of the repetitions' means
        t = read(f"netgap_pingpong_{size}.jsonl")
        if t is not None:
            got = False
            for line in t.splitlines():
                if not line.strip().startswith("{"):
                    continue
                o = json.loads(line)
                if o.get("metric") == "latency_us" and int(o["size_bytes"]) == size:
                    add("lat", size, "netgap", "mean", float(o["value"]))
                    p50 = (o.get("percentiles") or {}).get("p50")
                    if p50 is not None:
                        add("lat", size, "netgap", "median", float(p50))
                    got = True
            if not got:
                missing(f"netgap pingpong {size}: no result")
        # sockperf: "avg-latency=X" and "percentile 50.000 = X" (usec, RTT/2)
        t = read(f"sockperf_{size}.txt")
        if t is not None:
            avg = re.search(r"avg-latency=([\d.]+)", t)
            p50 = re.search(r"percentile 50\.000 =\s*([\d.]+)", t)
            if avg and p50:
                add("lat", size, "sockperf", "mean", float(avg.group(1)))
                add("lat", size, "sockperf", "median", float(p50.group(1)))
            else:
                missing(f"sockperf {size}: no result")
        # qperf -uu: "latency = N ns"
        t = read(f"qperf_lat_{size}.txt")
        if t is not None:
            m = re.search(r"latency\s*=\s*([\d.]+)\s*ns", t)
            if m:
                add("lat", size, "qperf", "mean", float(m.group(1)) / 1000.0)
            else:
                missing(f"qperf tcp_lat {size}: no result")
    # NPtcp output file: "bytes Mbps seconds"; seconds = half round trip, the
    # lowest of its 3 trials, each trial a mean over many round trips
    t = read("nptcp.out")
    if t is not None:
        got = {}
        for line in t.splitlines():
            f = line.split()
            if len(f) >= 3:
                got[int(f[0])] = float(f[2]) * 1e6
        for size in LAT:
            if size in got:
                add("lat", size, "NPtcp", "mean", got[size])
            else:
                missing(f"NPtcp: no line for {size} bytes")
    for size in BW:
        # floor: "tcp_stream write=N ... steady_gbps=X" (after the first second)
        t = read(f"floor_stream_{size}.txt")
        if t is not None:
            m = re.search(r"^tcp_stream write=(\d+) .*steady_gbps=([\d.]+)", t, re.M)
            if m and int(m.group(1)) == size and float(m.group(2)) > 0:
                add("bw", size, "floor", "gbps", float(m.group(2)))
            else:
                missing(f"floor stream {size}: no result")
        t = read(f"netgap_stream_{size}.jsonl")
        if t is not None:
            got = False
            for line in t.splitlines():
                if not line.strip().startswith("{"):
                    continue
                o = json.loads(line)
                if o.get("metric") == "bandwidth_gbps" and int(o["size_bytes"]) == size:
                    add("bw", size, "netgap", "gbps", float(o["value"]))
                    got = True
            if not got:
                missing(f"netgap stream {size}: no result")
        # iperf3 -J: end.sum_received.bits_per_second (receiver; -O period excluded)
        t = read(f"iperf3_{size}.txt")
        if t is not None:
            try:
                add("bw", size, "iperf3", "gbps", json.loads(t)["end"]["sum_received"]["bits_per_second"] / 1e9)
            except (ValueError, KeyError):
                missing(f"iperf3 {size}: no result")
        # qperf -uu: "bw = N bytes/sec"
        t = read(f"qperf_bw_{size}.txt")
        if t is not None:
            m = re.search(r"\bbw\s*=\s*([\d.]+)\s*bytes/sec", t)
            if m:
                add("bw", size, "qperf", "gbps", float(m.group(1)) * 8 / 1e9)
            else:
                missing(f"qperf tcp_bw {size}: no result")

rounds = sorted(int(d.rsplit("-", 1)[1]) for d in glob.glob(os.path.join(out, "raw", "round-*")))
for r in rounds:
    parse_round(r, os.path.join(out, "raw", f"round-{r}"))

def vals(kind, size, tool, stat):
    return {r["round"]: r["value"] for r in rows
            if (r["kind"], r["size"], r["tool"], r["stat"]) == (kind, size, tool, stat)}

def med(xs):
    return statistics.median(xs) if xs else None

def ratio(kind, size, tool, stat):
    """median over rounds of tool / floor, both from the same round"""
    a, b = vals(kind, size, tool, stat), vals(kind, size, "floor", stat)
    return med([a[k] / b[k] for k in a if k in b and b[k] > 0])

def f(v, digits=2):
    return "-" if v is None else f"{v:.{digits}f}"

def spread(v):
    return f"{min(v.values()):.1f}-{max(v.values()):.1f}" if len(v) > 1 else ""

summary = {"rounds": rounds, "latency": [], "bandwidth": []}
n = len(rounds)
lines = []
PEERS_LAT = ["sockperf", "qperf", "NPtcp"]
PEERS_BW = ["iperf3", "qperf"]
NOTES = {"netgap": "mean: trimmed mean of its reps", "NPtcp": "mean: best of 3 trial means"}
lines.append(f"LATENCY: one-way = half round trip, microseconds; median of {n} round(s); "
             "x floor = tool / floor of the same statistic in the same round (lower is better)")
lines.append(f"{'size':>6}  {'tool':<9} {'median':>8} {'x floor':>8} {'mean':>8} {'x floor':>8} "
             f"{'range':>13}  note")
for size in LAT:
    for tool in ["floor", "netgap"] + PEERS_LAT:
        vm, va = vals("lat", size, tool, "median"), vals("lat", size, tool, "mean")
        if not vm and not va:
            if tool == "netgap":
                lines.append(f"{label(size):>6}  {tool:<9} {'not measured':>8}")
            continue
        m, a = med(list(vm.values())), med(list(va.values()))
        rm, ra = ratio("lat", size, tool, "median"), ratio("lat", size, tool, "mean")
        note = NOTES.get(tool, "")
        if tool == "sockperf" and size < SOCKPERF_MIN:
            note = f"sent {SOCKPERF_MIN} B (sockperf minimum)"
        lines.append(f"{label(size):>6}  {tool:<9} {f(m):>8} {f(rm):>8} {f(a):>8} {f(ra):>8} "
                     f"{spread(vm) or spread(va):>13}  {note}")
        summary["latency"].append(dict(size=size, tool=tool, median_us=m, median_x_floor=rm,
                                       mean_us=a, mean_x_floor=ra, rounds=len(vm or va)))
    parts = []
    for stat in ("median", "mean"):
        ng = vals("lat", size, "netgap", stat)
        per_round, best_by = [], {}
        for k in ng:
            cands = [(vals("lat", size, p, stat).get(k), p) for p in PEERS_LAT]
            cands = [c for c in cands if c[0] is not None]
            if cands:
                best, who = min(cands)
                per_round.append(ng[k] / best)
                best_by[who] = best_by.get(who, 0) + 1
        if per_round:
            who = max(best_by, key=best_by.get)
            parts.append(f"{stat} {med(per_round):.2f} (best peer: {who})")
    if parts:
        lines.append(f"{'':>6}  netgap / best peer: " + ", ".join(parts))
lines.append("")
lines.append(f"BANDWIDTH: one TCP stream, payload Gbit/s (10^9 bit/s); median of {n} round(s); "
             "x floor = tool / floor in the same round (higher is better)")
lines.append(f"{'size':>6}  {'tool':<9} {'Gbit/s':>8} {'x floor':>8} {'range':>11}")
for size in BW:
    for tool in ["floor", "netgap"] + PEERS_BW:
        v = vals("bw", size, tool, "gbps")
        if not v:
            if tool == "netgap":
                lines.append(f"{label(size):>6}  {tool:<9} {'not measured':>8}")
            continue
        m, r = med(list(v.values())), ratio("bw", size, tool, "gbps")
        lines.append(f"{label(size):>6}  {tool:<9} {f(m):>8} {f(r):>8} {spread(v):>11}")
        summary["bandwidth"].append(dict(size=size, tool=tool, gbps=m, x_floor=r, rounds=len(v)))
    ng = vals("bw", size, "netgap", "gbps")
    per_round, best_by = [], {}
    for k in ng:
        cands = [(vals("bw", size, p, "gbps").get(k), p) for p in PEERS_BW]
        cands = [c for c in cands if c[0] is not None]
        if cands:
            best, who = max(cands)
            per_round.append(ng[k] / best)
            best_by[who] = best_by.get(who, 0) + 1
    if per_round:
        lines.append(f"{'':>6}  netgap / best peer: {med(per_round):.2f} "
                     f"(best peer: {max(best_by, key=best_by.get)})")

cmds = os.path.join(out, "commands.txt")
if os.path.exists(cmds):
    with open(cmds) as fh:
        log = fh.read()
    # the last line per tool and round belongs to the outputs kept
    other, steal, rnd = {}, {}, 0
    for line in log.splitlines():
        m = re.match(r"# round (\d+)", line)
        if m:
            rnd = int(m.group(1))
        m = re.search(r"-> (\S+): exit \S+ after \S+ s; other work took (\d+)%(?:.*steal (\d+)%)?", line)
        if m:
            other[(rnd, m.group(1))] = int(m.group(2))
            if m.group(3) is not None:
                steal[(rnd, m.group(1))] = int(m.group(3))
    reruns = len(re.findall(r"=> .*: other work disturbed", log))
    lines.append("")
    if other:
        worst = max(other, key=other.get)
        lines.append(f"CPU taken by other work on the machine while each tool ran: max {other[worst]}% "
                     f"({worst[1]}, round {worst[0]}), median {med(list(other.values())):.0f}%"
                     + ("  WARNING: the machine was not idle; figures may be disturbed"
                        if other[worst] > 5 else ""))
    if steal:
        worst = max(steal, key=steal.get)
        lines.append(f"CPU time the hypervisor took away (steal) while each tool ran: max {steal[worst]}% "
                     f"({worst[1]}, round {worst[0]}), median {med(list(steal.values())):.0f}%")
    if reruns:
        lines.append(f"Tools run again because other work disturbed them: {reruns} time(s)")
if problems:
    lines.append("")
    lines.append("PROBLEMS: " + "; ".join(problems))
text = "\n".join(lines) + "\n"
with open(os.path.join(out, "table.txt"), "w") as fh:
    fh.write(text)
with open(os.path.join(out, "results.json"), "w") as fh:
    json.dump({"summary": summary, "per_round": rows, "problems": problems}, fh, indent=1)
sys.stdout.write(text)
PY
}

if [ -n "$REPORT_ONLY" ]; then
	report "$REPORT_ONLY"
	exit 0
fi

# ---------------------------------------------------------------- setup
STAMP=$(date +%Y%m%d-%H%M%S)
mkdir -p "$REPO/bench-out"
OUT=$REPO/bench-out/$STAMP
n=2
until mkdir "$OUT" 2>/dev/null; do # never share a directory with another run
	OUT=$REPO/bench-out/$STAMP-$n; n=$((n + 1))
done
RAW=$OUT/raw
mkdir -p "$RAW"
CMDLOG=$OUT/commands.txt
: >"$CMDLOG"
. "$REPO/bench/lib/harness.sh"

# ---------------------------------------------------------------- 1. tools and builds
need=()
for t in iperf3 sockperf NPtcp qperf; do
	command -v "$t" >/dev/null || need+=("$t")
done
if [ ${#need[@]} -gt 0 ]; then
	log "installing peer tools (missing: ${need[*]})"
	SUDO=""
	[ "$(id -u)" = 0 ] || SUDO=sudo
	timeout 900 $SUDO apt-get update
	DEBIAN_FRONTEND=noninteractive timeout 900 $SUDO apt-get install -y iperf3 sockperf netpipe-tcp qperf
fi
for t in python3 taskset ss make cc timeout; do
	command -v "$t" >/dev/null || { echo "missing required command: $t" >&2; exit 1; }
done

log "building floor programs in $OUT/floor"
mkdir -p "$OUT/floor"
cp "$FLOOR_SRC"/*.c "$FLOOR_SRC"/*.h "$FLOOR_SRC"/Makefile "$OUT/floor/"
timeout 300 make -s -C "$OUT/floor" nonxdp >"$OUT/floor-build.txt" 2>&1 || { cat "$OUT/floor-build.txt" >&2; exit 1; }
FLOOR=$OUT/floor

NETGAP=$REPO/target/release/netgap
if [ "$SKIP_NETGAP" = 0 ]; then
	log "building netgap (cargo build --release)"
	if ! (cd "$REPO" && timeout 1800 cargo build --release) >"$OUT/cargo-build.txt" 2>&1; then
		tail -20 "$OUT/cargo-build.txt" >&2
		echo "netgap did not build; rerun with --skip-netgap for floor and peers only" >&2
		exit 1
	fi
	# measure a copy, so that a rebuild during the run cannot change the binary
	cp "$NETGAP" "$OUT/netgap"
	NETGAP=$OUT/netgap
fi

# ---------------------------------------------------------------- machine description
{
	echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
	echo "mode: $([ "$QUICK" = 1 ] && echo quick || echo full), $ROUNDS round(s)$([ "$SKIP_NETGAP" = 1 ] && echo ', netgap skipped')"
	echo "nproc: $(nproc)"
	echo "cpu: $(lscpu | sed -n 's/^Model name: *//p' | head -1)"
	echo "hypervisor: $(lscpu | sed -n 's/^Hypervisor vendor: *//p' | head -1)"
	echo "kernel: $(uname -r)"
	echo "os: $(. /etc/os-release && echo "$PRETTY_NAME")"
	echo "memory: $(free -g | awk '/^Mem:/ {print $2 " GiB"}')"
	echo "cpuidle driver: $(cat /sys/devices/system/cpu/cpuidle/current_driver 2>/dev/null || echo n/a)"
	echo "haltpoll guest_halt_poll_ns: $(cat /sys/module/haltpoll/parameters/guest_halt_poll_ns 2>/dev/null || echo n/a)"
	echo "tcp congestion control: $(sysctl -n net.ipv4.tcp_congestion_control)"
	echo "tcp_rmem: $(sysctl -n net.ipv4.tcp_rmem | tr '\t' ' ')"
	echo "tcp_wmem: $(sysctl -n net.ipv4.tcp_wmem | tr '\t' ' ')"
	echo "lo mtu: $(cat /sys/class/net/lo/mtu)"
	echo "placement: servers on CPU $SERVER_CPU, clients on CPU $CLIENT_CPU"
	echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
	echo "cc: $(cc --version | head -1)"
	echo "iperf3: $(iperf3 --version 2>&1 | head -1)"
	echo "sockperf: $(sockperf --version 2>&1 | sed -n 's/.*version //p' | head -1)"
	echo "qperf: $(qperf --version 2>&1 | head -1)"
	echo "netpipe-tcp (NPtcp): $(dpkg-query -W -f '${Version}' netpipe-tcp 2>/dev/null || echo unknown)"
	if [ "$SKIP_NETGAP" = 0 ]; then
		echo "rustc: $(rustc --version 2>/dev/null || echo unknown)"
		echo "netgap: $("$NETGAP" --version 2>/dev/null || echo unknown), binary sha256 $(sha256sum "$NETGAP" | cut -c1-16)"
	fi
} >"$OUT/machine.txt"
cat "$OUT/machine.txt" >&2

# ---------------------------------------------------------------- 2./3. measurements
# The machine's latency can drift by several times within minutes, so tools
# are interleaved: for each message size, every tool runs one after the other,
# and the whole sequence is repeated --rounds times, the tool order rotating
# from round to round.  Each (tool, size) is one phase; with
# --retry-disturbed N, a phase during which other work took more than 5% of
# the CPUs runs again (up to N times, after waiting for quiet CPUs); the
# disturbed attempt's outputs are kept under disturbed/ and left out.


phase_floor_pingpong() {
	local size=$1 pid
	start_server "floor_pingpong_server_$size" 300 "$P_PINGPONG" \
		"$FLOOR/pingpong" -s -b "$HOST" -p "$P_PINGPONG" -T 300 || { FAILED+=("floor_pingpong_$size"); return; }
	pid=$LAST_SERVER
	client "floor_pingpong_$size" 300 "$FLOOR/pingpong" -c "$HOST" -p "$P_PINGPONG" \
		-m "$size" -n "$PP_ITERS" -w "$PP_WARMUP" -L 120 -T 300 || true
	stop_server "$pid" 5
}

phase_netgap_pingpong() {
	local size=$1 f=$RAW/netgap_pingpong_$1.jsonl
	rm -f "$f"
	PHASE_FILES+=("$f")
	run_limited "netgap_pingpong_$size" 900 "$NETGAP" run pingpong --transport tcp --sizes "$(size_label "$size")" \
		--iterations "$NG_ITERS" --reps "$NG_REPS" --pin "$CLIENT_CPU,$SERVER_CPU" --json "$f" || true
}

phase_sockperf() {
	local size=$1 pid m
	m=$size; [ "$m" -ge "$SOCKPERF_MIN" ] || m=$SOCKPERF_MIN
	start_server "sockperf_server_$size" 120 "$P_SOCKPERF" \
		sockperf server --tcp -i "$HOST" -p "$P_SOCKPERF" -m 65536 || { FAILED+=("sockperf_$size"); return; }
	pid=$LAST_SERVER
	client "sockperf_$size" $((LAT_SECS + 30)) sockperf ping-pong --tcp -i "$HOST" \
		-p "$P_SOCKPERF" -m "$m" -t "$LAT_SECS" || true
	stop_server "$pid"
}

phase_qperf_lat() {
	local size=$1 pid
	start_server "qperf_lat_server_$size" 120 "$P_QPERF" qperf -lp "$P_QPERF" ||
		{ FAILED+=("qperf_lat_$size"); return; }
	pid=$LAST_SERVER
	client "qperf_lat_$size" $((LAT_SECS + 30)) qperf "$HOST" -lp "$P_QPERF" -ip "$P_QPERF_DATA" \
		-t "$LAT_SECS" -m "$size" -uu -v tcp_lat || true
	stop_server "$pid"
}

phase_nptcp() { # one sweep 1 B .. 64 KiB covers all latency sizes
	local pid
	start_server nptcp_server 300 "$P_NPTCP" \
		NPtcp -P "$P_NPTCP" -p 0 -l 1 -u 65536 ${NP_EXTRA[@]+"${NP_EXTRA[@]}"} || { FAILED+=(nptcp); return; }
	pid=$LAST_SERVER
	PHASE_FILES+=("$RAW/nptcp.out")
	client nptcp 300 NPtcp -h "$HOST" -P "$P_NPTCP" -p 0 -l 1 -u 65536 \
		${NP_EXTRA[@]+"${NP_EXTRA[@]}"} -o "$RAW/nptcp.out" || true
	stop_server "$pid" 5
}

phase_floor_stream() {
	local size=$1 pid
	start_server "floor_stream_server_$size" 120 "$P_STREAM" \
		"$FLOOR/stream" -s -b "$HOST" -p "$P_STREAM" -l "$size" -T 120 || { FAILED+=("floor_stream_$size"); return; }
	pid=$LAST_SERVER
	client "floor_stream_$size" $((BW_SECS + 30)) "$FLOOR/stream" -c "$HOST" -p "$P_STREAM" \
		-l "$size" -t "$BW_SECS" -O 1 -T 120 || true
	stop_server "$pid" 5
}

phase_netgap_stream() {
	local size=$1 f=$RAW/netgap_stream_$1.jsonl
	rm -f "$f"
	PHASE_FILES+=("$f")
	run_limited "netgap_stream_$size" 300 "$NETGAP" run stream --transport tcp --sizes "$(size_label "$size")" \
		--rep-time "$NG_REP_TIME" --reps "$NG_BW_REPS" --pin "$CLIENT_CPU,$SERVER_CPU" --json "$f" || true
}

phase_iperf3() {
	local size=$1 pid
	start_server "iperf3_server_$size" 120 "$P_IPERF" iperf3 -s -1 -B "$HOST" -p "$P_IPERF" ||
		{ FAILED+=("iperf3_$size"); return; }
	pid=$LAST_SERVER
	client "iperf3_$size" $((IPERF_SECS + 40)) iperf3 -c "$HOST" -p "$P_IPERF" \
		-l "$size" -t "$IPERF_SECS" -O 1 -J || true
	stop_server "$pid" 5
}

phase_qperf_bw() {
	local size=$1 pid
	start_server "qperf_bw_server_$size" 120 "$P_QPERF" qperf -lp "$P_QPERF" ||
		{ FAILED+=("qperf_bw_$size"); return; }
	pid=$LAST_SERVER
	client "qperf_bw_$size" $((BW_SECS + 30)) qperf "$HOST" -lp "$P_QPERF" -ip "$P_QPERF_DATA" \
		-t "$BW_SECS" -m "$size" -uu -v tcp_bw || true
	stop_server "$pid"
}


LAT_TOOLS=(floor_pingpong sockperf qperf_lat)
BW_TOOLS=(floor_stream iperf3 qperf_bw)
if [ "$SKIP_NETGAP" = 0 ]; then
	LAT_TOOLS=(floor_pingpong netgap_pingpong sockperf qperf_lat)
	BW_TOOLS=(floor_stream netgap_stream iperf3 qperf_bw)
fi

for ((ROUND = 1; ROUND <= ROUNDS; ROUND++)); do
	RAW=$OUT/raw/round-$ROUND
	mkdir -p "$RAW"
	echo "# round $ROUND" >>"$CMDLOG"
	for size in "${LAT_SIZES[@]}"; do
		for tool in $(rotate $((ROUND - 1)) "${LAT_TOOLS[@]}"); do
			run_phase "$tool" "$size"
		done
	done
	run_phase nptcp
	for size in "${BW_SIZES[@]}"; do
		for tool in $(rotate $((ROUND - 1)) "${BW_TOOLS[@]}"); do
			run_phase "$tool" "$size"
		done
	done
done

echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUT/machine.txt"
cleanup

# ---------------------------------------------------------------- 4. table
echo
report "$OUT"
echo
echo "raw outputs, commands and machine description: $OUT"
if [ ${#FAILED[@]} -gt 0 ]; then
	echo "FAILED: ${FAILED[*]}" | tee -a "$OUT/table.txt" >&2
	exit 1
fi
