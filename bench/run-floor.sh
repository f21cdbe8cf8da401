#!/usr/bin/env bash
# netgap against the machine's floor, side by side in one command: the C
# floor programs of bench/floor (page-aligned buffers), netgap and the peer
# tools, each figure as a ratio to the floor measured in the same round.
#
#   sudo bash bench/run-floor.sh [--quick] [--rounds R] [--wait-quiet S]
#                                [--retry-disturbed N] [--no-testbed]
#                                [--only GROUPS] [--congestion CC]
#                                [--report-only DIR]
#
#   --quick          one round, short runs: checks that the script works
#   --rounds R       repeat the interleaved sequence R times (default 3)
#   --wait-quiet S   before each tool, wait up to S s for the CPUs to be idle
#   --retry-disturbed N  run a tool again (up to N times) when other work
#                    took more than 5% of the CPUs while it ran
#   --no-testbed     loopback figures only (no udp and xdp rows; no root)
#   --only GROUPS    only these rows, a comma-separated list of tcp, shm,
#                    udp and xdp (e.g. --only xdp,udp)
#   --congestion CC  the tcp streams under congestion control CC (e.g.
#                    cubic) instead of the system's default: the floor
#                    (-Z), netgap (--congestion) and iperf3 (-C); qperf and
#                    NPtcp cannot choose one, so their stream rows are left
#                    out
#   --report-only D  re-parse an earlier run's raw outputs in D
#
# NETGAP=PATH in the environment measures that netgap binary (built with
# the xdp feature for the testbed rows) instead of building the tree's:
# two builds alternated run by run, on the same script. NETGAP_BEFORE=PATH
# also measures that binary (an earlier build, with the xdp feature) on the
# testbed rows, in the same rounds, interleaved with the floor and netgap:
# a change's before and after as ratios to one floor, column "before". Its
# own testbed (TB_NAME with a b after it, the same link) has its agents, which serve the
# tests, run that binary too.
#
# Figures (every tool pinned alike: servers on CPU 1, clients on CPU 0):
#   tcp loopback   stream at 64 KiB and 1 MiB writes: floor `stream`,
#                  netgap, iperf3, qperf, NPtcp (streaming mode);
#                  ping-pong at 1 B and 64 KiB: floor `pingpong`, netgap,
#                  sockperf, qperf, NPtcp
#   shm            poll ping-pong at 1 B and 64 B: floor `shm_pingpong` and its ring variant `-r`,
#                  netgap -t shm --mode poll; five short runs of each per round, alternated, and
#                  the round's value is each tool's median over its runs
#   testbed link   (two namespace hosts of `netgap testbed up`, one
#                  unshaped veth pair, MTU 1500): udp ping-pong 1 B and
#                  stream of 1 KiB datagrams, floor `udp_pingpong` and
#                  `udp_stream` (blocking) against netgap -t udp --mode
#                  event; xdp ping-pong 1 B and stream, floor `xdp_pingpong`
#                  and `xdp_stream` (copy mode, spinning on the rings)
#                  against netgap -t xdp --mode poll; the ping-pong as five
#                  runs of each per round, alternated, as for shm
#
# Results go to bench-out/floor-<timestamp>/: raw/round-N/ (every tool's own
# output), commands.txt, machine.txt, table.md (printed at the end).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PORT_BASE=${PORT_BASE:-17870}
HOST=127.0.0.1
CLIENT_CPU=0
SERVER_CPU=1

QUICK=0
WAIT_QUIET=0
RETRY_DISTURBED=0
TESTBED=1
ROUNDS=""
REPORT_ONLY=""
ONLY=tcp,shm,udp,xdp
CONGESTION=""
while [ $# -gt 0 ]; do
	case "$1" in
	--quick) QUICK=1 ;;
	--rounds) ROUNDS=${2:?--rounds needs a count}; shift ;;
	--retry-disturbed) RETRY_DISTURBED=${2:?--retry-disturbed needs a count}; shift ;;
	--wait-quiet) WAIT_QUIET=${2:?--wait-quiet needs seconds}; shift ;;
	--no-testbed) TESTBED=0 ;;
	--report-only) REPORT_ONLY=${2:?--report-only needs a directory}; shift ;;
	--only) ONLY=${2:?--only needs groups, e.g. xdp,udp}; shift ;;
	--congestion) CONGESTION=${2:?--congestion needs a name, e.g. cubic}; shift ;;
	-h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
	*) echo "unknown option: $1" >&2; exit 2 ;;
	esac
	shift
done

for g in ${ONLY//,/ }; do
	case "$g" in
	tcp | shm | udp | xdp) ;;
	*) echo "--only: unknown group '$g' (give tcp, shm, udp or xdp, comma-separated)" >&2; exit 2 ;;
	esac
done
if [ -n "$CONGESTION" ] && ! grep -qw "$CONGESTION" /proc/sys/net/ipv4/tcp_available_congestion_control; then
	echo "--congestion: '$CONGESTION' is not available here ($(cat /proc/sys/net/ipv4/tcp_available_congestion_control))" >&2
	exit 2
fi
# The stream tools' flags that choose the congestion control, when asked.
CC_FLOOR=(); CC_NETGAP=(); CC_IPERF=()
if [ -n "$CONGESTION" ]; then
	CC_FLOOR=(-Z "$CONGESTION"); CC_NETGAP=(--congestion "$CONGESTION"); CC_IPERF=(-C "$CONGESTION")
fi
# qperf and NPtcp cannot choose a congestion control: their streams run
# only under the system's.
BW_TOOLS=(floor_stream netgap_stream iperf3 qperf_bw)
[ -z "$CONGESTION" ] || BW_TOOLS=(floor_stream netgap_stream iperf3)
# want GROUP: whether --only kept GROUP's rows
want() { [[ ",$ONLY," == *",$1,"* ]]; }
# the udp and xdp rows are the only ones on the testbed
want udp || want xdp || TESTBED=0

# ---------------------------------------------------------------- parameters
PP_SIZES=(1 65536)
BW_SIZES=(65536 1048576)
SHM_SIZES=1,64
UDP_BW_SIZE=1024
XDP_PAYLOAD=1464 # netgap's xdp payload per frame at MTU 1500 (1514 - 50 B of headers)
XDP_BW_MSG=32K   # netgap messages this large fill every frame
if [ "$QUICK" = 1 ]; then
	PP_ITERS=5000; PP_WARMUP=500
	NG_ITERS=5000; NG_REPS=3
	SHM_ITERS=100000; SHM_WARMUP=10000; SHM_RUNS=1
	XDP_PP_RUNS=1; XDP_NG_REPS=$NG_REPS
	LAT_SECS=1; NP_EXTRA=(-n 50)
	BW_SECS=1; NG_REP_TIME=500ms; NG_BW_REPS=2
	ROUNDS=${ROUNDS:-1}
else
	PP_ITERS=100000; PP_WARMUP=10000
	NG_ITERS=100000; NG_REPS=5
	SHM_ITERS=500000; SHM_WARMUP=50000; SHM_RUNS=5
	XDP_PP_RUNS=5; XDP_NG_REPS=1 # a run as long as the floor's: 100,000 round trips
	LAT_SECS=5; NP_EXTRA=()
	BW_SECS=5; NG_REP_TIME=1s; NG_BW_REPS=5
	ROUNDS=${ROUNDS:-3}
fi

P_PINGPONG=$PORT_BASE
P_STREAM=$((PORT_BASE + 1))
P_SOCKPERF=$((PORT_BASE + 2))
P_QPERF=$((PORT_BASE + 3))
P_QPERF_DATA=$((PORT_BASE + 4))
P_NPTCP=$((PORT_BASE + 5))
P_IPERF=$((PORT_BASE + 6))
P_UDP=$((PORT_BASE + 7))

# ---------------------------------------------------------------- report
# Parses $1/raw, writes $1/table.md and $1/results.json, prints the table.
report() {
	python3 - "$1" <<'PY'
import glob, json, os, re, statistics, sys

out = sys.argv[1]
vals = {}      # (figure, tool) -> {round: value}
problems = []
runs = []  # each run's value where a round has several, for the notes under the table
all_runs = {}  # (figure, tool) -> every run's value, all rounds

def add(fig, tool, rnd, v):
    vals.setdefault((fig, tool), {})[rnd] = v

def read(raw, name):
    p = os.path.join(raw, name)
    if not os.path.exists(p):
        return None
    with open(p, errors="replace") as f:
        return f.read()

def netgap(text, metric, size, stat="p50"):
    """netgap's JSON lines: the median (p50) for latency, the value otherwise"""
    for line in (text or "").splitlines():
        if not line.strip().startswith("{"):
            continue
        o = json.loads(line)
        if o.get("metric") == metric and int(o["size_bytes"]) == size:
            if metric == "latency_us":
                return (o.get("percentiles") or {}).get(stat, o["value"])
            return float(o["value"])
    return None

def short(fig):
    """a figure's name without its parenthesis and unit"""
    return fig.split(' (')[0].split(',')[0]

def median_of_runs(r, raw, fig, tool, stem, ext, parse):
    """a round's value from several runs: the median of STEM-N.EXT (or
    STEM.EXT, from before there were several)"""
    files = sorted(glob.glob(os.path.join(raw, f"{stem}-*.{ext}")), key=lambda f: int(re.search(r"-(\d+)\.", os.path.basename(f)).group(1)))
    files += glob.glob(os.path.join(raw, f"{stem}.{ext}"))
    got_runs = [v for v in (parse(open(f, errors="replace").read()) for f in files) if v is not None]
    if files and not got_runs:
        problems.append(f"round {r}: {tool}, {fig}: no result in {stem}*.{ext}")
    elif got_runs:
        add(fig, tool, r, statistics.median(got_runs))
        all_runs.setdefault((fig, tool), []).extend(got_runs)
        if len(got_runs) > 1:
            runs.append(f"round {r}, {short(fig)}, {tool}: " + " / ".join(f"{v:.3f}" for v in got_runs))

def floor_rtt(text, label, size):
    m = re.search(rf"^{label} msg={size} iters=\d+ half_rtt_us: .*median=([\d.]+)", text or "", re.M)
    return float(m.group(1)) if m else None

LAT = {1: "tcp ping-pong 1 B, median one-way µs", 65536: "tcp ping-pong 64 KiB, median one-way µs"}
BW = {65536: "tcp stream, 64 KiB writes, Gbit/s", 1048576: "tcp stream, 1 MiB writes, Gbit/s"}
SHM = {1: "shm poll ping-pong 1 B, median one-way µs", 64: "shm poll ping-pong 64 B, median one-way µs"}
UDP_PP = "udp ping-pong 1 B (testbed link), median one-way µs"
UDP_BW = "udp stream 1 KiB datagrams (testbed link), Gbit/s arrived"
XDP_PP = "xdp ping-pong 1 B (testbed link, poll), median one-way µs"
XDP_BW = "xdp stream (testbed link, poll), Gbit/s arrived"
ORDER = list(BW.values()) + list(LAT.values()) + list(SHM.values()) + [UDP_PP, UDP_BW, XDP_PP, XDP_BW]
HIGHER = set(BW.values()) | {UDP_BW, XDP_BW}

rounds = sorted(int(d.rsplit("-", 1)[1]) for d in glob.glob(os.path.join(out, "raw", "round-*")))
for r in rounds:
    raw = os.path.join(out, "raw", f"round-{r}")
    def got(fig, tool, v, name):
        if v is None:
            if read(raw, name) is not None:
                problems.append(f"round {r}: {tool}, {fig}: no result in {name}")
        else:
            add(fig, tool, r, v)
    for size, fig in LAT.items():
        got(fig, "floor", floor_rtt(read(raw, f"floor_pingpong_{size}.txt"), "tcp_pingpong", size), f"floor_pingpong_{size}.txt")
        got(fig, "netgap", netgap(read(raw, f"netgap_pingpong_{size}.jsonl"), "latency_us", size), f"netgap_pingpong_{size}.jsonl")
        t = read(raw, f"sockperf_{size}.txt")
        m = re.search(r"percentile 50\.000 =\s*([\d.]+)", t or "")
        got(fig, "sockperf", float(m.group(1)) if m else None, f"sockperf_{size}.txt")
        t = read(raw, f"qperf_lat_{size}.txt")
        m = re.search(r"latency\s*=\s*([\d.]+)\s*(ns|us)", t or "")
        got(fig, "qperf", (float(m.group(1)) / (1000.0 if m.group(2) == "ns" else 1.0)) if m else None, f"qperf_lat_{size}.txt")
    t = read(raw, "nptcp_lat.out")
    if t is not None:
        lines = {int(f[0]): float(f[2]) * 1e6 for f in (l.split() for l in t.splitlines()) if len(f) >= 3}
        for size, fig in LAT.items():
            got(fig, "NPtcp", lines.get(size), "nptcp_lat.out")
    for size, fig in BW.items():
        t = read(raw, f"floor_stream_{size}.txt")
        m = re.search(r"^tcp_stream write=(\d+) .*steady_gbps=([\d.]+)", t or "", re.M)
        got(fig, "floor", float(m.group(2)) if m and float(m.group(2)) > 0 else None, f"floor_stream_{size}.txt")
        got(fig, "netgap", netgap(read(raw, f"netgap_stream_{size}.jsonl"), "bandwidth_gbps", size), f"netgap_stream_{size}.jsonl")
        t = read(raw, f"iperf3_{size}.txt")
        try:
            v = json.loads(t)["end"]["sum_received"]["bits_per_second"] / 1e9 if t else None
        except (ValueError, KeyError):
            v = None
        got(fig, "iperf3", v, f"iperf3_{size}.txt")
        t = read(raw, f"qperf_bw_{size}.txt")
        m = re.search(r"\bbw\s*=\s*([\d.]+)\s*(bytes/sec|KB/sec|MB/sec|GB/sec)", t or "")
        scale = {"bytes/sec": 1, "KB/sec": 1e3, "MB/sec": 1e6, "GB/sec": 1e9}
        got(fig, "qperf", float(m.group(1)) * scale[m.group(2)] * 8 / 1e9 if m else None, f"qperf_bw_{size}.txt")
    t = read(raw, "nptcp_stream.out")
    if t is not None:
        # NPtcp's Mbps counts 2^20 bits
        lines = {int(f[0]): float(f[1]) * 1048576 / 1e9 for f in (l.split() for l in t.splitlines()) if len(f) >= 3}
        for size, fig in BW.items():
            got(fig, "NPtcp", lines.get(size), "nptcp_stream.out")
    for size, fig in SHM.items():
        for tool, stem, ext, parse in (
            ("floor", "floor_shm", "txt", lambda t: floor_rtt(t, "shm_pingpong", size)),
            ("ring floor", "floor_shm_ring", "txt", lambda t: floor_rtt(t, "shm_pingpong_ring", size)),
            ("netgap", "netgap_shm", "jsonl", lambda t: netgap(t, "latency_us", size)),
        ):
            median_of_runs(r, raw, fig, tool, stem, ext, parse)
    got(UDP_PP, "floor", floor_rtt(read(raw, "floor_udp_pingpong.txt"), "udp_pingpong", 1), "floor_udp_pingpong.txt")
    got(UDP_PP, "netgap", netgap(read(raw, "netgap_udp_pingpong.jsonl"), "latency_us", 1), "netgap_udp_pingpong.jsonl")
    m = re.search(r"^udp_stream .*recv_gbps=([\d.]+)", read(raw, "floor_udp_stream.txt") or "", re.M)
    got(UDP_BW, "floor", float(m.group(1)) if m else None, "floor_udp_stream.txt")
    got(UDP_BW, "netgap", netgap(read(raw, "netgap_udp_stream.jsonl"), "bandwidth_gbps", 1024), "netgap_udp_stream.jsonl")
    median_of_runs(r, raw, XDP_PP, "floor", "floor_xdp_pingpong", "txt", lambda t: floor_rtt(t, "xdp_pingpong", 1))
    median_of_runs(r, raw, XDP_PP, "netgap", "netgap_xdp_pingpong", "jsonl", lambda t: netgap(t, "latency_us", 1))
    m = re.search(r"^xdp_stream .*recv_gbps=([\d.]+)", read(raw, "floor_xdp_stream.txt") or "", re.M)
    got(XDP_BW, "floor", float(m.group(1)) if m else None, "floor_xdp_stream.txt")
    got(XDP_BW, "netgap", netgap(read(raw, "netgap_xdp_stream.jsonl"), "bandwidth_gbps", 32768), "netgap_xdp_stream.jsonl")
    got(UDP_PP, "before", netgap(read(raw, "before_udp_pingpong.jsonl"), "latency_us", 1), "before_udp_pingpong.jsonl")
    got(UDP_BW, "before", netgap(read(raw, "before_udp_stream.jsonl"), "bandwidth_gbps", 1024), "before_udp_stream.jsonl")
    median_of_runs(r, raw, XDP_PP, "before", "before_xdp_pingpong", "jsonl", lambda t: netgap(t, "latency_us", 1))
    got(XDP_BW, "before", netgap(read(raw, "before_xdp_stream.jsonl"), "bandwidth_gbps", 32768), "before_xdp_stream.jsonl")

TOOLS = ["floor", "ring floor", "netgap", "before", "iperf3", "sockperf", "qperf", "NPtcp"]
TOOLS = [t for t in TOOLS if t != "before" or any(k[1] == "before" for k in vals)]

def fmt(v):
    return f"{v:.3f}" if v < 10 else f"{v:.1f}" if v < 1000 else f"{v:.0f}"

def cell(fig, tool):
    v = vals.get((fig, tool))
    if not v:
        return ""
    text = " / ".join(fmt(v[k]) for k in sorted(v))
    if tool == "floor":
        return text
    f = vals.get((fig, "floor"), {})
    ratios = [v[k] / f[k] for k in v if f.get(k)]
    text += f" (**{statistics.median(ratios):.2f}**)" if ratios else ""
    # a byte-stream transport against the floor that walks its buffer as a ring does
    r = vals.get((fig, "ring floor"), {})
    ring = [v[k] / r[k] for k in v if r.get(k)]
    if tool == "netgap" and ring:
        text += f"; **{statistics.median(ring):.2f}** of the ring floor"
    return text

lines = [f"Per tool: the value in each of {len(rounds)} round(s), in order, and in bold the median over rounds "
         "of tool / floor measured in the same round (µs rows: lower is better; Gbit/s rows: higher is better).", "",
         "| figure | " + " | ".join(TOOLS) + " |", "|---" * (len(TOOLS) + 1) + "|"]
summary = []
for fig in ORDER:
    if not any((fig, t) in vals for t in TOOLS):
        continue
    lines.append(f"| {fig} | " + " | ".join(cell(fig, t) for t in TOOLS) + " |")
    for t in TOOLS:
        if (fig, t) in vals:
            summary.append(dict(figure=fig, tool=t, per_round=vals[(fig, t)]))
cmds = os.path.join(out, "commands.txt")
if os.path.exists(cmds):
    log = open(cmds).read()
    other = [int(x) for x in re.findall(r"other work took (\d+)%", log)]
    busy = [int(x) for x in re.findall(r"\[busy=(\d+)%", log)]
    reruns = len(re.findall(r"=> .*: other work disturbed", log))
    lines.append("")
    if other:
        lines.append(f"CPU taken by other work while each tool ran: median {statistics.median(other):.0f}%, "
                     f"max {max(other)}% of the two CPUs" + (" (the machine was busy: figures disturbed)" if max(other) > 5 else ""))
    if busy:
        lines.append(f"CPU busy just before each tool started: median {statistics.median(busy):.0f}%, max {max(busy)}%")
    if reruns:
        lines.append(f"tools run again because other work disturbed them: {reruns}")
if runs:
    lines += ["", "shm and xdp ping-pong rows: a round's value is each tool's median over its runs, which were (µs, in order):", ""]
    lines += [f"- {x}" for x in runs]
    # A run sits on one level of the path for its whole length, and each
    # tool's runs draw their levels alike: the fastest run of each is the
    # tools compared on the same level, whichever levels the rounds drew.
    fastest = []
    for fig in ORDER:
        f = all_runs.get((fig, "floor"))
        if not f or len(f) < 2:
            continue
        for t in TOOLS:
            v = all_runs.get((fig, t))
            if t != "floor" and v:
                fastest.append(f"- {short(fig)}, {t}: {min(v):.3f} against the floor's {min(f):.3f} (**{min(v) / min(f):.2f}**)")
    if fastest:
        lines += ["", "The fastest run of each tool over all rounds, against the floor's fastest (µs):", ""] + fastest
if problems:
    lines += ["", "PROBLEMS: " + "; ".join(problems)]
text = "\n".join(lines) + "\n"
open(os.path.join(out, "table.md"), "w").write(text)
json.dump({"rounds": rounds, "figures": summary, "problems": problems},
          open(os.path.join(out, "results.json"), "w"), indent=1)
sys.stdout.write(text)
PY
}

if [ -n "$REPORT_ONLY" ]; then
	report "$REPORT_ONLY"
	exit 0
fi

# ---------------------------------------------------------------- setup
mkdir -p "$REPO/bench-out"
OUT=$REPO/bench-out/floor-$(date +%Y%m%d-%H%M%S)
n=2
until mkdir "$OUT" 2>/dev/null; do
	OUT=$REPO/bench-out/floor-$(date +%Y%m%d-%H%M%S)-$n; n=$((n + 1))
done
RAW=$OUT/raw
mkdir -p "$RAW"
CMDLOG=$OUT/commands.txt
: >"$CMDLOG"
. "$REPO/bench/lib/harness.sh"

TB_NAME=${TB_NAME:-floorbench} # another name lets two runs share the machine
TB_BEFORE=${TB_NAME:0:11}b # NETGAP_BEFORE's testbed (names are at most 12 characters)
TB_UP=0
# a binary given in the environment (NETGAP=PATH), else the tree's build
NETGAP_GIVEN=${NETGAP:-}
[ -z "$NETGAP_GIVEN" ] || NETGAP_GIVEN=$(realpath "$NETGAP_GIVEN")
NETGAP=$REPO/target/release/netgap
testbed_down() {
	if [ "$TB_UP" = 1 ]; then
		"$NETGAP" testbed down --name "$TB_NAME" >/dev/null 2>&1 || true
		[ -z "${NETGAP_BEFORE:-}" ] || "$NETGAP_BEFORE" testbed down --name "$TB_BEFORE" >/dev/null 2>&1 || true
		TB_UP=0
	fi
}
# the harness's traps stop servers and clients; the testbed goes too
trap 'cleanup; testbed_down' EXIT
trap 'cleanup; testbed_down; exit 130' INT
trap 'cleanup; testbed_down; exit 143' TERM

# ---------------------------------------------------------------- tools and builds
PEERS=(iperf3 sockperf NPtcp qperf)
need=()
want tcp || PEERS=()
for t in ${PEERS[@]+"${PEERS[@]}"}; do
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
if [ "$TESTBED" = 1 ] && [ "$(id -u)" != 0 ]; then
	echo "the udp and xdp rows need a testbed, so root; run with sudo or --no-testbed" >&2
	exit 1
fi

log "building the floor programs in $OUT/floor"
mkdir -p "$OUT/floor"
cp "$REPO"/bench/floor/*.c "$REPO"/bench/floor/*.h "$REPO"/bench/floor/Makefile "$OUT/floor/"
target=all
[ "$TESTBED" = 1 ] || target=nonxdp
timeout 300 make -s -C "$OUT/floor" "$target" >"$OUT/floor-build.txt" 2>&1 || { cat "$OUT/floor-build.txt" >&2; exit 1; }
FLOOR=$OUT/floor

if [ -n "$NETGAP_GIVEN" ]; then
	[ -x "$NETGAP_GIVEN" ] || { echo "NETGAP=$NETGAP_GIVEN is not an executable file" >&2; exit 2; }
	log "measuring the given netgap binary $NETGAP_GIVEN (not building)"
	NETGAP=$NETGAP_GIVEN
else
	log "building netgap (cargo build --release --features xdp)"
	features=()
	[ "$TESTBED" = 1 ] && features=(--features xdp)
	if ! (cd "$REPO" && timeout 1800 cargo build --release ${features[@]+"${features[@]}"}) >"$OUT/cargo-build.txt" 2>&1; then
		tail -20 "$OUT/cargo-build.txt" >&2
		exit 1
	fi
fi
# measure a copy, so that a rebuild during the run cannot change the binary
cp "$NETGAP" "$OUT/netgap"
NETGAP=$OUT/netgap
NETGAP_BEFORE=${NETGAP_BEFORE:-}
if [ -n "$NETGAP_BEFORE" ]; then
	[ -x "$NETGAP_BEFORE" ] || { echo "NETGAP_BEFORE=$NETGAP_BEFORE is not an executable file" >&2; exit 2; }
	cp "$NETGAP_BEFORE" "$OUT/netgap-before"
	NETGAP_BEFORE=$OUT/netgap-before
fi

{
	echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
	echo "mode: $([ "$QUICK" = 1 ] && echo quick || echo full), $ROUNDS round(s)"
	echo "nproc: $(nproc)"
	echo "cpu: $(lscpu | sed -n 's/^Model name: *//p' | head -1)"
	echo "hypervisor: $(lscpu | sed -n 's/^Hypervisor vendor: *//p' | head -1)"
	echo "kernel: $(uname -r)"
	echo "os: $(. /etc/os-release && echo "$PRETTY_NAME")"
	echo "tcp congestion control: $(sysctl -n net.ipv4.tcp_congestion_control)${CONGESTION:+ (the streams of the floor, netgap and iperf3: $CONGESTION; qperf and NPtcp streams not run)}"
	echo "placement: servers on CPU $SERVER_CPU, clients on CPU $CLIENT_CPU"
	echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
	echo "cc: $(cc --version | head -1)"
	echo "iperf3: $(iperf3 --version 2>&1 | head -1)"
	echo "sockperf: $(sockperf --version 2>&1 | sed -n 's/.*version //p' | head -1)"
	echo "netpipe-tcp (NPtcp): $(dpkg-query -W -f '${Version}' netpipe-tcp 2>/dev/null || echo unknown)"
	echo "libxdp: $(dpkg-query -W -f '${Version}' libxdp-dev 2>/dev/null || echo unknown)"
	echo "netgap: $("$NETGAP" --version 2>/dev/null || echo unknown), binary sha256 $(sha256sum "$NETGAP" | cut -c1-16)"
	[ -z "$NETGAP_BEFORE" ] || echo "before: binary sha256 $(sha256sum "$NETGAP_BEFORE" | cut -c1-16)"
} >"$OUT/machine.txt"
cat "$OUT/machine.txt" >&2

# ---------------------------------------------------------------- testbed
NS_S="" NS_C="" IF_S="" IF_C="" IP_S="" MAC_S="" MAC_C="" HOSTS="" HOSTS_BEFORE=""
if [ "$TESTBED" = 1 ]; then
	log "testbed: 2 hosts, one unshaped veth link (netgap testbed up --name $TB_NAME)"
	"$NETGAP" testbed down --name "$TB_NAME" >/dev/null 2>&1 || true
	"$NETGAP" testbed up --name "$TB_NAME" --hosts 2 --topology mesh --links 1 >"$OUT/testbed.txt" 2>&1 ||
		{ cat "$OUT/testbed.txt" >&2; exit 1; }
	TB_UP=1
	HOSTS=/run/netgap/$TB_NAME/hosts.json
	if [ -n "$NETGAP_BEFORE" ]; then
		"$NETGAP_BEFORE" testbed down --name "$TB_BEFORE" >/dev/null 2>&1 || true
		"$NETGAP_BEFORE" testbed up --name "$TB_BEFORE" --hosts 2 --topology mesh --links 1 >"$OUT/testbed-before.txt" 2>&1 ||
			{ cat "$OUT/testbed-before.txt" >&2; exit 1; }
		HOSTS_BEFORE=/run/netgap/$TB_BEFORE/hosts.json
	fi
	# The testbeds' agents serve netgap's runs: their CPU is the run's own,
	# not other work on the machine.
	OUR_NETNS=$(ip netns list | awk -v a="ngtb-$TB_NAME-" -v b="ngtb-$TB_BEFORE-" \
		'index($1, a) == 1 || index($1, b) == 1 {print $1}' | tr '\n' ' ')
	# the first host serves, the client runs in the second (as netgap does)
	read -r NS_S NS_C < <(python3 -c 'import json,sys; h=json.load(open(sys.argv[1]))["hosts"]; print(h[0]["netns"], h[1]["netns"])' "$HOSTS")
	link() { # NS -> "IFACE IPV4 MAC" of its one testbed interface
		local ifc
		ifc=$(ip -n "$1" -o -4 addr show scope global | awk '{print $2; exit}')
		echo "$ifc $(ip -n "$1" -o -4 addr show dev "$ifc" | awk '{print $4; exit}' | cut -d/ -f1) $(ip netns exec "$1" cat "/sys/class/net/$ifc/address")"
	}
	read -r IF_S IP_S MAC_S < <(link "$NS_S")
	read -r IF_C _ MAC_C < <(link "$NS_C")
	echo "testbed: server $NS_S $IF_S $IP_S $MAC_S; client $NS_C $IF_C $MAC_C; mtu $(ip netns exec "$NS_S" cat "/sys/class/net/$IF_S/mtu")" >>"$OUT/machine.txt"
fi

# start_ready NAME LIMIT_S CMD...: a server in the background whose output
# says "ready" once it can take traffic (the xdp floors) or, for a UDP
# server, that needs no more than a moment to bind.
start_ready() {
	local name=$1 limit=$2 i; shift 2
	record_cmd "$name" "$@"
	timeout --kill-after=5 "$limit" "$@" >"$RAW/$name.txt" 2>&1 &
	LAST_SERVER=$!
	PHASE_FILES+=("$RAW/$name.txt")
	SERVER_PIDS+=("$LAST_SERVER")
	for i in $(seq 1 100); do
		grep -q '^ready' "$RAW/$name.txt" 2>/dev/null && return 0
		kill -0 "$LAST_SERVER" 2>/dev/null || break
		sleep 0.05
	done
	grep -q '^ready' "$RAW/$name.txt" 2>/dev/null || { log "$name did not get ready (see $RAW/$name.txt)"; return 1; }
}

# ---------------------------------------------------------------- phases: tcp and shm on loopback
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
	rm -f "$f"; PHASE_FILES+=("$f")
	run_limited "netgap_pingpong_$size" 900 "$NETGAP" run pingpong --transport tcp --sizes "$(size_label "$size")" \
		--iterations "$NG_ITERS" --reps "$NG_REPS" --pin "$CLIENT_CPU,$SERVER_CPU" --json "$f" || true
}

phase_sockperf() {
	local size=$1 pid m=$1
	[ "$m" -ge 14 ] || m=14 # sockperf's smallest message (its header)
	start_server "sockperf_server_$size" 120 "$P_SOCKPERF" \
		sockperf server --tcp -i "$HOST" -p "$P_SOCKPERF" -m 65536 || { FAILED+=("sockperf_$size"); return; }
	pid=$LAST_SERVER
	client "sockperf_$size" $((LAT_SECS + 30)) sockperf ping-pong --tcp -i "$HOST" \
		-p "$P_SOCKPERF" -m "$m" -t "$LAT_SECS" || true
	stop_server "$pid"
}

phase_qperf_lat() {
	local size=$1 pid
	start_server "qperf_lat_server_$size" 120 "$P_QPERF" qperf -lp "$P_QPERF" || { FAILED+=("qperf_lat_$size"); return; }
	pid=$LAST_SERVER
	client "qperf_lat_$size" $((LAT_SECS + 30)) qperf "$HOST" -lp "$P_QPERF" -ip "$P_QPERF_DATA" \
		-t "$LAT_SECS" -m "$size" -uu -v tcp_lat || true
	stop_server "$pid"
}

phase_nptcp_lat() { # one sweep 1 B .. 64 KiB covers both sizes
	local pid
	start_server nptcp_lat_server 300 "$P_NPTCP" \
		NPtcp -P "$P_NPTCP" -p 0 -l 1 -u 65536 ${NP_EXTRA[@]+"${NP_EXTRA[@]}"} || { FAILED+=(nptcp_lat); return; }
	pid=$LAST_SERVER
	PHASE_FILES+=("$RAW/nptcp_lat.out")
	client nptcp_lat 300 NPtcp -h "$HOST" -P "$P_NPTCP" -p 0 -l 1 -u 65536 \
		${NP_EXTRA[@]+"${NP_EXTRA[@]}"} -o "$RAW/nptcp_lat.out" || true
	stop_server "$pid" 5
}

phase_floor_stream() {
	local size=$1 pid
	start_server "floor_stream_server_$size" 120 "$P_STREAM" \
		"$FLOOR/stream" -s -b "$HOST" -p "$P_STREAM" -l "$size" -T 120 || { FAILED+=("floor_stream_$size"); return; }
	pid=$LAST_SERVER
	client "floor_stream_$size" $((BW_SECS + 30)) "$FLOOR/stream" -c "$HOST" -p "$P_STREAM" \
		-l "$size" -t "$((BW_SECS + 1))" -O 1 -T 120 "${CC_FLOOR[@]}" || true
	stop_server "$pid" 5
}

phase_netgap_stream() {
	local size=$1 f=$RAW/netgap_stream_$1.jsonl
	rm -f "$f"; PHASE_FILES+=("$f")
	run_limited "netgap_stream_$size" 300 "$NETGAP" run stream --transport tcp --sizes "$(size_label "$size")" \
		--rep-time "$NG_REP_TIME" --reps "$NG_BW_REPS" --pin "$CLIENT_CPU,$SERVER_CPU" "${CC_NETGAP[@]}" --json "$f" || true
}

phase_iperf3() {
	local size=$1 pid
	start_server "iperf3_server_$size" 120 "$P_IPERF" iperf3 -s -1 -B "$HOST" -p "$P_IPERF" || { FAILED+=("iperf3_$size"); return; }
	pid=$LAST_SERVER
	client "iperf3_$size" $((BW_SECS + 40)) iperf3 -c "$HOST" -p "$P_IPERF" -l "$size" -t "$BW_SECS" -O 1 "${CC_IPERF[@]}" -J || true
	stop_server "$pid" 5
}

phase_qperf_bw() {
	local size=$1 pid
	start_server "qperf_bw_server_$size" 120 "$P_QPERF" qperf -lp "$P_QPERF" || { FAILED+=("qperf_bw_$size"); return; }
	pid=$LAST_SERVER
	client "qperf_bw_$size" $((BW_SECS + 30)) qperf "$HOST" -lp "$P_QPERF" -ip "$P_QPERF_DATA" \
		-t "$BW_SECS" -m "$size" -uu -v tcp_bw || true
	stop_server "$pid"
}

# streaming mode, 64 KiB .. 1 MiB; NPtcp picks its own repeats (a fixed
# small count would time little more than filling the socket buffers)
phase_nptcp_stream() {
	local pid
	start_server nptcp_stream_server 300 "$P_NPTCP" \
		NPtcp -s -P "$P_NPTCP" -p 0 -l 65536 -u 1048576 || { FAILED+=(nptcp_stream); return; }
	pid=$LAST_SERVER
	PHASE_FILES+=("$RAW/nptcp_stream.out")
	client nptcp_stream 300 NPtcp -s -h "$HOST" -P "$P_NPTCP" -p 0 -l 65536 -u 1048576 \
		-o "$RAW/nptcp_stream.out" || true
	stop_server "$pid" 5
}

phase_floor_shm() { # forks its second process onto CPU 1 itself
	run_limited "floor_shm-$SHM_RUN" 300 "$FLOOR/shm_pingpong" -m "$SHM_SIZES" -n "$SHM_ITERS" -w "$SHM_WARMUP" \
		-a "$CLIENT_CPU" -b "$SERVER_CPU" -T 300 || true
}

phase_floor_shm_ring() { # the same, each message at the next offset, as a ring places it
	run_limited "floor_shm_ring-$SHM_RUN" 300 "$FLOOR/shm_pingpong" -r -m "$SHM_SIZES" -n "$SHM_ITERS" -w "$SHM_WARMUP" \
		-a "$CLIENT_CPU" -b "$SERVER_CPU" -T 300 || true
}

phase_netgap_shm() {
	local f=$RAW/netgap_shm-$SHM_RUN.jsonl
	rm -f "$f"; PHASE_FILES+=("$f")
	run_limited "netgap_shm-$SHM_RUN" 900 "$NETGAP" run pingpong --transport shm --mode poll --sizes "$SHM_SIZES" \
		--iterations "$SHM_ITERS" --reps 3 --pin "$CLIENT_CPU,$SERVER_CPU" --json "$f" || true
}

# ---------------------------------------------------------------- phases: the testbed link
# (arrays, not functions: `timeout` runs a program)
IN_S=(ip netns exec "$NS_S" taskset -c "$SERVER_CPU")
IN_C=(ip netns exec "$NS_C" taskset -c "$CLIENT_CPU")

phase_floor_udp_pingpong() {
	local pid
	start_ready floor_udp_pingpong_server 300 "${IN_S[@]}" sh -c 'echo ready; exec "$@"' sh "$FLOOR/udp_pingpong" -s -b "$IP_S" -p "$P_UDP" -T 300 ||
		{ FAILED+=(floor_udp_pingpong); return; }
	pid=$LAST_SERVER
	sleep 0.2 # the server binds right after saying ready
	run_limited floor_udp_pingpong 300 "${IN_C[@]}" "$FLOOR/udp_pingpong" -c "$IP_S" -p "$P_UDP" -m 1 \
		-n "$PP_ITERS" -w "$PP_WARMUP" -T 300 || true
	stop_server "$pid" 5
}

phase_floor_udp_stream() {
	local pid
	start_ready floor_udp_stream_server 120 "${IN_S[@]}" sh -c 'echo ready; exec "$@"' sh "$FLOOR/udp_stream" -s -b "$IP_S" -p "$P_UDP" -T 120 ||
		{ FAILED+=(floor_udp_stream); return; }
	pid=$LAST_SERVER
	sleep 0.2
	run_limited floor_udp_stream $((BW_SECS + 30)) "${IN_C[@]}" "$FLOOR/udp_stream" -c "$IP_S" -p "$P_UDP" \
		-l "$UDP_BW_SIZE" -t "$BW_SECS" -T 120 || true
	stop_server "$pid" 5
}

# A floor stopped by a signal (its time limit, or stop_server after a failed
# client) leaves libxdp's program attached to the interface (with no bpffs
# there is no dispatcher to take it away), and every later netgap phase on
# the link then fails to attach its own: taken off after each floor phase
# (between phases no xdp socket is open on the testbed).
xdp_off() {
	ip netns exec "$NS_S" ip link set dev "$IF_S" xdp off 2>/dev/null || true
	ip netns exec "$NS_C" ip link set dev "$IF_C" xdp off 2>/dev/null || true
}

phase_floor_xdp_pingpong() {
	local pid
	start_ready floor_xdp_pingpong_server 300 "${IN_S[@]}" "$FLOOR/xdp_pingpong" -s -i "$IF_S" -d "$MAC_C" -T 300 ||
		{ FAILED+=(floor_xdp_pingpong); return; }
	pid=$LAST_SERVER
	run_limited "floor_xdp_pingpong-$XDP_RUN" 300 "${IN_C[@]}" "$FLOOR/xdp_pingpong" -i "$IF_C" -d "$MAC_S" -m 1 \
		-n "$PP_ITERS" -w "$PP_WARMUP" -T 300 || true
	stop_server "$pid" 5
	xdp_off
}

phase_floor_xdp_stream() {
	local pid
	start_ready floor_xdp_stream_server 120 "${IN_S[@]}" "$FLOOR/xdp_stream" -s -i "$IF_S" -d "$MAC_C" -T 120 ||
		{ FAILED+=(floor_xdp_stream); return; }
	pid=$LAST_SERVER
	run_limited floor_xdp_stream $((BW_SECS + 30)) "${IN_C[@]}" "$FLOOR/xdp_stream" -i "$IF_C" -d "$MAC_S" \
		-l "$XDP_PAYLOAD" -t "$BW_SECS" -T 120 || true
	stop_server "$pid" 5
	xdp_off
}

# netgap across the testbed: the first host's agent serves, the client runs
# in the second host's namespace
phase_netgap_testbed() { # NAME TEST TRANSPORT MODE SIZE [BINARY HOSTS]
	local name=$1 test=$2 tr=$3 mode=$4 size=$5 bin=${6:-$NETGAP} hosts=${7:-$HOSTS} f=$RAW/$1.jsonl extra
	rm -f "$f"; PHASE_FILES+=("$f")
	if [ "$test" = pingpong ]; then
		extra=(--iterations "$NG_ITERS" --reps "${REPS:-$NG_REPS}")
	else
		extra=(--rep-time "$NG_REP_TIME" --reps "$NG_BW_REPS")
	fi
	run_limited "$name" 900 "$bin" run "$test" -t "$tr" --mode "$mode" --hosts "@$hosts" \
		--sizes "$size" "${extra[@]}" --pin "$CLIENT_CPU,$SERVER_CPU" --json "$f" || true
}
phase_netgap_udp_pingpong() { phase_netgap_testbed netgap_udp_pingpong pingpong udp event 1; }
phase_netgap_udp_stream() { phase_netgap_testbed netgap_udp_stream stream udp event "$(size_label "$UDP_BW_SIZE")"; }
phase_netgap_xdp_pingpong() { REPS=$XDP_NG_REPS phase_netgap_testbed "netgap_xdp_pingpong-$XDP_RUN" pingpong xdp poll 1; }
phase_netgap_xdp_stream() { phase_netgap_testbed netgap_xdp_stream stream xdp poll "$XDP_BW_MSG"; }
phase_before_udp_pingpong() { phase_netgap_testbed before_udp_pingpong pingpong udp event 1 "$NETGAP_BEFORE" "$HOSTS_BEFORE"; }
phase_before_udp_stream() { phase_netgap_testbed before_udp_stream stream udp event "$(size_label "$UDP_BW_SIZE")" "$NETGAP_BEFORE" "$HOSTS_BEFORE"; }
phase_before_xdp_pingpong() { REPS=$XDP_NG_REPS phase_netgap_testbed "before_xdp_pingpong-$XDP_RUN" pingpong xdp poll 1 "$NETGAP_BEFORE" "$HOSTS_BEFORE"; }
phase_before_xdp_stream() { phase_netgap_testbed before_xdp_stream stream xdp poll "$XDP_BW_MSG" "$NETGAP_BEFORE" "$HOSTS_BEFORE"; }

# ---------------------------------------------------------------- rounds
for ((ROUND = 1; ROUND <= ROUNDS; ROUND++)); do
	RAW=$OUT/raw/round-$ROUND
	mkdir -p "$RAW"
	echo "# round $ROUND" >>"$CMDLOG"
	k=$((ROUND - 1))
	if want tcp; then
		for size in "${BW_SIZES[@]}"; do
			for tool in $(rotate "$k" "${BW_TOOLS[@]}"); do
				run_phase "$tool" "$size"
			done
		done
		[ -n "$CONGESTION" ] || run_phase nptcp_stream
		for size in "${PP_SIZES[@]}"; do
			for tool in $(rotate "$k" floor_pingpong netgap_pingpong sockperf qperf_lat); do
				run_phase "$tool" "$size"
			done
		done
		run_phase nptcp_lat
	fi
	if want shm; then
		# several short runs of each tool, alternated: how long a cache line
		# takes to cross between the two CPUs changes from one run to the
		# next (about 0.05, 0.1 or 0.35 µs on the AMD EPYC guest, even for two
		# runs a second apart), and a round's value is the median of its runs
		for ((SHM_RUN = 1; SHM_RUN <= SHM_RUNS; SHM_RUN++)); do
			for tool in $(rotate $(((k + SHM_RUN) % 3)) floor_shm floor_shm_ring netgap_shm); do
				run_phase "$tool"
			done
		done
	fi
	if [ "$TESTBED" = 1 ]; then
		pairs=()
		want udp && pairs+=("floor_udp_pingpong netgap_udp_pingpong" "floor_udp_stream netgap_udp_stream")
		want xdp && pairs+=("floor_xdp_stream netgap_xdp_stream")
		for pair in "${pairs[@]}"; do
			# the earlier build beside them: floor, netgap, before, rotated
			[ -z "$NETGAP_BEFORE" ] || pair="$pair before_${pair##* netgap_}"
			# shellcheck disable=SC2086
			for tool in $(rotate "$k" $pair); do
				run_phase "$tool"
			done
		done
		if want xdp; then
			# several short runs of each, alternated, as for shm: the
			# copy path's round trip sits on one of two levels for a whole
			# run (about 4.4 and 5.3 µs one way on the AMD EPYC guest, the
			# floor's runs as well as netgap's), and a round's value is
			# each tool's median over its runs
			pair="floor_xdp_pingpong netgap_xdp_pingpong"
			[ -z "$NETGAP_BEFORE" ] || pair="$pair before_xdp_pingpong"
			for ((XDP_RUN = 1; XDP_RUN <= XDP_PP_RUNS; XDP_RUN++)); do
				# shellcheck disable=SC2086
				for tool in $(rotate $((k + XDP_RUN)) $pair); do
					run_phase "$tool"
				done
			done
		fi
	fi
done

echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUT/machine.txt"
cleanup
testbed_down

echo
report "$OUT"
echo
echo "raw outputs, commands and machine description: $OUT"
if [ ${#FAILED[@]} -gt 0 ]; then
	echo "FAILED: ${FAILED[*]}" | tee -a "$OUT/table.md" >&2
	exit 1
fi
