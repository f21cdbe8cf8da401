# Helpers shared by the bench scripts that run tools side by side
# (run-peers.sh, run-floor.sh): each tool's output kept, its command logged
# with the CPU load seen before it, servers pinned and stopped, and a phase
# run again when other work on the machine disturbed it.  Sourced, not run.
#
# The sourcing script sets, before calling them:
#   RAW             directory for the outputs of the current round
#   CMDLOG          the log of commands (commands.txt)
#   WAIT_QUIET      seconds to wait for idle CPUs before each command (0: none)
#   RETRY_DISTURBED how many times a disturbed phase runs again
#   CLIENT_CPU, SERVER_CPU  where clients and servers run
#   ROUND           the current round (for the log)
#   OUR_NETNS       (optional) network namespaces, by name, whose processes
#                   are the measurement's own (a testbed's agents, which
#                   serve the tools but are not their children)
# and defines phase_TOOL functions for run_phase.  Sourcing it sets the
# EXIT, INT and TERM traps that stop every server and client it started.

FAILED=()
SERVER_PIDS=()
CLIENT_PID=""
DISTURBED=0
PHASE_FILES=()

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

cleanup() {
	local pid
	for pid in ${CLIENT_PID:+"$CLIENT_PID"} ${SERVER_PIDS[@]+"${SERVER_PIDS[@]}"}; do
		if kill -0 "$pid" 2>/dev/null; then
			kill -TERM "$pid" 2>/dev/null || true
		fi
	done
	for pid in ${CLIENT_PID:+"$CLIENT_PID"} ${SERVER_PIDS[@]+"${SERVER_PIDS[@]}"}; do
		wait "$pid" 2>/dev/null || true
	done
	SERVER_PIDS=()
	CLIENT_PID=""
}
trap cleanup EXIT
trap 'cleanup; exit 130' INT
trap 'cleanup; exit 143' TERM

# CPU time used by anything, in percent of both CPUs, over 0.5 s, plus the
# steal share: taken just before a tool starts, while the tools are idle, it
# shows whether other work on the machine could disturb the measurement.
cpu_sample() {
	local a b
	a=$(awk '/^cpu /{print $2+$3+$4+$5+$6+$7+$8+$9, $5+$6, $9}' /proc/stat)
	sleep 0.5
	b=$(awk '/^cpu /{print $2+$3+$4+$5+$6+$7+$8+$9, $5+$6, $9}' /proc/stat)
	echo "$a $b" | awk '{t=$4-$1; if (t<=0) t=1; printf "busy=%d%% steal=%d%%", 100*(t-($5-$2))/t, 100*($6-$3)/t}'
}

# "TOTAL BUSY OURS STEAL" in clock ticks: all CPU time of both CPUs; time
# spent in processes (user, nice, system); the part of it used by this
# script's processes (live descendants plus reaped children, and every
# process in the namespaces of OUR_NETNS); and steal, the
# time the hypervisor ran something else while a CPU had work.  Two snapshots
# around a tool give the share of CPU that other work on the machine took
# meanwhile, and the share the host took away.
cpu_snapshot() {
	python3 - "$$" ${OUR_NETNS:-} <<'PY'
import os, sys
me = int(sys.argv[1])
own_ns = set()
for name in sys.argv[2:]:
    try:
        own_ns.add(os.stat(f"/run/netns/{name}").st_ino)
    except OSError:
        pass
with open("/proc/stat") as f:
    v = [int(x) for x in f.readline().split()[1:9]]
total, busy = sum(v), v[0] + v[1] + v[2]
parent, ticks = {}, {}
for d in os.listdir("/proc"):
    if not d.isdigit():
        continue
    try:
        with open(f"/proc/{d}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        continue
    parent[int(d)] = int(rest[1])
    ticks[int(d)] = (int(rest[11]) + int(rest[12]), int(rest[13]) + int(rest[14]))
ours = ticks.get(me, (0, 0))[1]
for pid in ticks:
    if own_ns:
        try:
            if os.stat(f"/proc/{pid}/ns/net").st_ino in own_ns:
                ours += ticks[pid][0]
                continue
        except OSError:
            pass
    p, seen = pid, 0
    while p > 1 and seen < 64:
        p, seen = parent.get(p, 0), seen + 1
        if p == me:
            ours += ticks[pid][0]
            break
print(total, busy, ours, v[7])
PY
}

other_cpu() { # other_cpu "SNAP_BEFORE" "SNAP_AFTER" -> percent of both CPUs
	echo "$1 $2" | awk '{t=$5-$1; if (t<=0) t=1; o=($6-$2)-($7-$3); if (o<0) o=0; printf "%d", 100*o/t}'
}

steal_cpu() { # steal_cpu "SNAP_BEFORE" "SNAP_AFTER" -> percent of both CPUs
	echo "$1 $2" | awk '{t=$5-$1; if (t<=0) t=1; printf "%d", 100*($8-$4)/t}'
}

# wait_quiet S: waits up to S seconds for the CPUs to be under 10% busy;
# prints the last sample.
wait_quiet() {
	local limit=$1 sample busy waited=0
	sample=$(cpu_sample)
	while :; do
		busy=${sample#busy=}; busy=${busy%%%*}
		[ "$busy" -gt 10 ] && [ "$waited" -lt "$limit" ] || break
		sleep 1.5; waited=$((waited + 2))
		sample=$(cpu_sample)
	done
	echo "$sample"
}

record_cmd() { # record_cmd NAME CMD...
	local name=$1; shift
	{ printf '%s [%s]: ' "$name" "$(wait_quiet "$WAIT_QUIET")"; printf '%q ' "$@"; echo; } >>"$CMDLOG"
}

port_listening() { ss -Hltn "sport = :$1" 2>/dev/null | grep -q .; }

# start_server NAME LIMIT_S PORT CMD...   (runs CMD on the server CPU, in background)
start_server() {
	local name=$1 limit=$2 port=$3; shift 3
	if port_listening "$port"; then
		log "port $port is already in use (left over from an earlier run?); set PORT_BASE"
		return 1
	fi
	record_cmd "$name" taskset -c "$SERVER_CPU" "$@"
	timeout --kill-after=5 "$limit" taskset -c "$SERVER_CPU" "$@" >"$RAW/$name.txt" 2>&1 &
	LAST_SERVER=$!
	PHASE_FILES+=("$RAW/$name.txt")
	SERVER_PIDS+=("$LAST_SERVER")
	local i
	for i in $(seq 1 100); do
		port_listening "$port" && return 0
		kill -0 "$LAST_SERVER" 2>/dev/null || break
		sleep 0.05
	done
	log "$name did not start listening on port $port (see $RAW/$name.txt)"
	return 1
}

# stop_server PID [GRACE_S]: lets a server that exits by itself do so, then TERM.
stop_server() {
	local pid=$1 grace=${2:-0} i
	for i in $(seq 1 $((grace * 10))); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	kill -TERM "$pid" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
	local keep=() p
	for p in ${SERVER_PIDS[@]+"${SERVER_PIDS[@]}"}; do
		[ "$p" = "$pid" ] || keep+=("$p")
	done
	SERVER_PIDS=(${keep[@]+"${keep[@]}"})
}

# run_limited NAME LIMIT_S CMD...   (output to raw/NAME.txt; records a failure)
run_limited() {
	local name=$1 limit=$2; shift 2
	record_cmd "$name" "$@"
	local rc=0 before after t0 other
	before=$(cpu_snapshot); t0=$(date +%s.%N)
	# in the background so that a signal to this script is handled at once
	timeout --kill-after=5 "$limit" "$@" >"$RAW/$name.txt" 2>&1 &
	CLIENT_PID=$!
	wait "$CLIENT_PID" || rc=$?
	CLIENT_PID=""
	after=$(cpu_snapshot)
	other=$(other_cpu "$before" "$after")
	[ "$other" -le 5 ] || DISTURBED=1
	PHASE_FILES+=("$RAW/$name.txt")
	printf '  -> %s: exit %s after %.1f s; other work took %s%% of the CPUs meanwhile; steal %s%%\n' \
		"$name" "$rc" "$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {print b - a}')" "$other" \
		"$(steal_cpu "$before" "$after")" >>"$CMDLOG"
	if [ "$rc" != 0 ]; then
		log "$name failed (exit $rc; 124 = time limit), see $RAW/$name.txt"
		FAILED+=("$name")
		return 1
	fi
}

# client NAME LIMIT_S CMD...   (CMD on the client CPU)
client() {
	local name=$1 limit=$2; shift 2
	run_limited "$name" "$limit" taskset -c "$CLIENT_CPU" "$@"
}

size_label() { # 1024 -> 1K, 1048576 -> 1M (netgap's size syntax)
	local n=$1
	if [ $((n % 1048576)) = 0 ]; then echo "$((n / 1048576))M"
	elif [ $((n % 1024)) = 0 ]; then echo "$((n / 1024))K"
	else echo "$n"; fi
}

# run_phase TOOL [SIZE]: runs phase_TOOL, again if it was disturbed.
run_phase() {
	local tool=$1 size=${2:-} attempt=1 f keep
	while :; do
		log "round $ROUND: $tool${size:+ $size B}"
		DISTURBED=0
		PHASE_FILES=()
		"phase_$tool" ${size:+"$size"}
		[ "$DISTURBED" = 1 ] && [ "$attempt" -le "$RETRY_DISTURBED" ] || break
		keep=$RAW/disturbed/$tool${size:+_$size}-$attempt
		mkdir -p "$keep"
		for f in ${PHASE_FILES[@]+"${PHASE_FILES[@]}"}; do
			[ -e "$f" ] && mv "$f" "$keep/"
		done
		echo "  => $tool${size:+ $size}: other work disturbed attempt $attempt; outputs moved to $keep; running it again" >>"$CMDLOG"
		log "$tool${size:+ $size B} was disturbed by other work on the machine; running it again"
		wait_quiet $((WAIT_QUIET > 60 ? WAIT_QUIET : 60)) >/dev/null
		attempt=$((attempt + 1))
	done
}

# rotate K WORDS...: the words rotated left by K
rotate() {
	local k=$1; shift
	local n=$# i
	for ((i = 0; i < n; i++)); do
		local j=$(((i + k) % n + 1))
		printf '%s ' "${!j}"
	done
}
