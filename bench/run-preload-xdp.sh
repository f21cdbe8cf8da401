#!/usr/bin/env bash
# nginx serving 1 KiB and 64 KiB files across two testbed hosts, side by
# side in one run, to two clients: netgap's load generator (`netgap run web`,
# which verifies every body) and wrk (which checks every status code; the
# script also checks the bytes it read per response). Four columns:
#   tcp     kernel TCP, nothing wrapped;
#   relays  nginx and the client under libnetgap_preload.so (xdp build),
#           each host's relay carrying the connections over an AF_XDP flow
#           on the hosts' second link (NETGAP_PRELOAD_DIRECT=0, `netgap
#           run web --preload-relayed`);
#   direct  the same as it goes by default (NETGAP_PRELOAD_DIRECT=1): the
#           relays agree on a queue and hand each program an AF_XDP socket
#           of its own;
# and netgap's own xdp stream (64 KiB messages, the transport the direct
# connections drive) between the same hosts, in event mode (its waits
# sleep, as the library's do: the bound the direct column's bytes are read
# against) and in poll mode.
#
# The load generator's relays column keeps the connections on the relays
# with `--preload-relayed`, on the same testbed: the agents give nginx and
# the load generator NETGAP_PRELOAD_DIRECT=0 (1 without the flag), start
# their host's relay for each run and count its CPU in the role's. The wrk
# rows run on the first testbed: the script starts nginx (netgap's own
# configuration for the point, copied from the load generator's record)
# in the server's namespace and wrk in the client's, both under `netgap
# wrap -t xdp` but for tcp, and a `netgap relay` in each host's namespace
# for the relays and direct rows, stopped after each run.
#
# CPU per transaction, at the server's end and the client's:
#   load generator: the record's `hosts_cpu` (each role's agent, its
#     program and the relay it started, over the run);
#   wrk: nginx's master and workers and the server's relay, from
#     /proc/PID/stat (utime + stime) before and after wrk; wrk's own user
#     and system time (bash's `times` of its process tree, `netgap wrap`
#     included) and the client's relay, from /proc.
# Each round runs every column of each file once, in the order tcp,
# relays, direct (load generator, then wrk), then the xdp stream, so drift
# hits them alike; the load average is printed before and after each round.
# Prints every run, then the medians and the ratios.
#
# Then (SETUP=0 skips it) connection setup across the two hosts: a C
# client makes connections one after another (connect, 1 byte each way,
# close) over the kernel's TCP, on direct connections and through the
# relays, µs per connection (bench/preload-setup/connbench.c).
#
# Then, when sockperf is installed (LATENCY=0 skips it), a small request
# and response across the two hosts: sockperf's TCP ping-pong (14-byte
# messages, 3 s) over the kernel's TCP and under `netgap wrap -t xdp`
# with a `netgap relay` in each host's namespace, on the library's direct
# connections (an AF_XDP socket of the program's own,
# NETGAP_PRELOAD_DIRECT=1) and through the relays
# (NETGAP_PRELOAD_DIRECT=0), with sockperf waiting in epoll, poll and
# select (`-F`; select only through the relays), beside netgap's own xdp
# in event and poll mode and tcp in event mode (`run pingpong -s 1`);
# one-way µs, ROUNDS rounds.
#
# usage: sudo bench/run-preload-xdp.sh [--quick] [SECONDS] [CONNECTIONS]   (default 3 s, 4)
#        (--quick: one round of 1 s, no latency rows: a check of the script)
#        ROUNDS=3 PROFILE=release LATENCY=1 WRK=1 bench/run-preload-xdp.sh
#        WEB=0 SETUP=0 RUNS="tcp epoll,direct epoll" PINGPONGS="xdp event" bench/run-preload-xdp.sh
#        (the latency rows alone, of sockperf's runs and netgap's only those named)
#        WEB=0 LATENCY=0 SETUP_CONNECTIONS=500 bench/run-preload-xdp.sh   (setup alone)
#        NETGAP_PRELOAD=/path/libnetgap_preload.so ...   (another build of the library)
#        NETGAP=/path/netgap ...   (another build of the binary: the relays, `netgap wrap`)
# Needs root, nginx, wrk (WRK=0 skips its rows), libxdp-dev and libbpf-dev
# (the xdp feature).
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
if [ "${1:-}" = --quick ]; then
    quick=1
    shift
fi
secs=${1:-3}
conns=${2:-4}
rounds=${ROUNDS:-3}
if [ "$quick" = 1 ]; then
    secs=1 rounds=1 LATENCY=0
fi
profile=${PROFILE:-release}   # PROFILE=debug: a quick check of the script
if [ "$profile" = release ]; then
    nice cargo build --release --quiet --features xdp -p netgap-preload -p netgap
else
    nice cargo build --quiet --features xdp -p netgap-preload -p netgap
fi
export NETGAP_PRELOAD=${NETGAP_PRELOAD:-$PWD/target/$profile/libnetgap_preload.so}
netgap=${NETGAP:-$PWD/target/$profile/netgap}
tb=${TB_NAME:-pxbench}
dir=$(mktemp -d)
chmod 755 "$dir"
relays=()
stop_relays() {
    for p in ${relays[@]+"${relays[@]}"}; do kill "$p" 2>/dev/null || true; done
    for p in ${relays[@]+"${relays[@]}"}; do wait "$p" 2>/dev/null || true; done
    relays=()
}
nginx_pid=""
stop_nginx() {
    if [ -n "$nginx_pid" ]; then
        # `netgap wrap` and setsid exec, so this is nginx's master; its pid
        # file names it too, should either have forked.
        [ -s "$dir/nginx.pid" ] && kill "$(cat "$dir/nginx.pid")" 2>/dev/null
        kill "$nginx_pid" 2>/dev/null || true
        wait "$nginx_pid" 2>/dev/null || true
    fi
    nginx_pid=""
}
cleanup() {
    stop_nginx
    stop_relays
    "$netgap" testbed down --name "$tb" >/dev/null 2>&1 || true
    rm -rf "$dir"
}
trap cleanup EXIT
"$netgap" testbed down --name "$tb" >/dev/null 2>&1 || true
"$netgap" testbed up --name "$tb" --hosts 2 --topology mesh --links 2 >/dev/null
hosts="@/run/netgap/$tb/hosts.json"

# The first testbed's namespaces, their addresses on the first link (the
# TCP connection's) and their interfaces on the second (the relays' flow's).
read -r ns1 ns2 ip1 ip2 if1 if2 < <(python3 - "/run/netgap/$tb/hosts.json" <<'PY'
import json, sys
h = json.load(open(sys.argv[1]))["hosts"]
second = [next(l["ifname"] for l in x["links"] if l["index"] == 1) for x in h[:2]]
print(h[0]["netns"], h[1]["netns"], h[0]["address"], h[1]["address"], *second)
PY
)
# The relays' shared key, fresh in this run's own directory.
"$netgap" key new "$dir/relay.key" >/dev/null
# A `netgap relay` in each host's namespace of the first testbed, up once
# each says it listens.
start_relays() {
    local side ns dev peer log t
    for side in "$ns1 $if1 $ip2" "$ns2 $if2 $ip1"; do
        read -r ns dev peer <<<"$side"
        log=$dir/relay-$ns.log
        : >"$log"
        ip netns exec "$ns" "$netgap" relay --interface "$dev" --peers "$peer" --key "$dir/relay.key" \
            >>"$log" 2>&1 &
        relays+=("$!")
        for t in $(seq 100); do
            grep -q "listening on @netgap-relay" "$log" && break
            [ "$t" = 100 ] && { echo "the relay in $ns did not come up: $(tail -1 "$log")" >&2; exit 1; }
            sleep 0.05
        done
    done
}

# One record of the load generator: transactions/s, then the server's and
# the client's CPU microseconds per transaction, then the connections
# across hosts under the library, those of them direct, those kept on the
# kernel's TCP, and the errors.
summarize() {
    python3 - "$1" <<'PY'
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])][-1]
m = r["app"]["metrics"]
n = m["transactions"]
cpu = {c["role"]: c["cpu"]["cpu_ns"] for c in r["hosts_cpu"]}
print(f'{r["value"]:.0f} {cpu.get("server", 0) / n / 1e3:.2f} {cpu.get("client", 0) / n / 1e3:.2f} '
      f'{m.get("preload_xdp_connections", 0):.0f} {m.get("preload_direct", 0):.0f} '
      f'{m.get("preload_kernel_connections", 0):.0f} {m["errors"]:.0f}')
PY
}

# CPU ticks (utime + stime, /proc/PID/stat) of the processes named, summed;
# a process gone counts nothing.
ticks() {
    local p sum=0 t
    for p in "$@"; do
        t=$(awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$p/stat" 2>/dev/null) || t=0
        sum=$((sum + ${t:-0}))
    done
    echo "$sum"
}
hz=$(getconf CLK_TCK)

# The nginx configuration of the load generator's record RECORD, for
# nginx run by this script in the server's namespace: its run directory
# and docroot moved into DIR (the 1 KiB and 64 KiB files made there);
# prints the server's namespace, address and port.
wrk_site() {
    python3 - "$1" "$2" "/run/netgap/$tb/hosts.json" <<'PY'
import json, os, re, sys
rec = [json.loads(l) for l in open(sys.argv[1])][-1]
new = sys.argv[2]
svc = next(s for s in rec["app"]["services"] if s["name"] == "nginx")
conf = svc["config"]
old = re.search(r"^pid (.*)/nginx.pid;", conf, re.M).group(1)
conf = conf.replace(old, new)
conf = re.sub(r"^(\s*root) [^;]*;", r"\1 " + new + "/www;", conf, flags=re.M)
open(os.path.join(new, "nginx.conf"), "w").write(conf)
www = os.path.join(new, "www")
os.makedirs(www, exist_ok=True)
for name, size in (("1K", 1024), ("64K", 65536)):
    open(os.path.join(www, name), "wb").write(os.urandom(size))
    os.chmod(os.path.join(www, name), 0o644)
os.chmod(www, 0o755)
port = re.search(r"listen [^ ;]+:(\d+)[ ;]", conf).group(1)
host = next(h for h in json.load(open(sys.argv[3]))["hosts"] if h["name"] == svc["host"])
print(host["netns"], host["address"], port)
PY
}
# wrk's summary, one line: requests, bytes read, duration in µs, its
# errors (connect, read, write, status, timeout), and the latency's
# median, 99th percentile and maximum in µs.
cat >"$dir/summary.lua" <<'LUA'
done = function(summary, latency, requests)
    local e = summary.errors
    io.write(string.format("wrk-summary %d %d %d %d %d %d %d %d %d %d %d\n", summary.requests,
        summary.bytes, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
        latency:percentile(50), latency:percentile(99), latency.max))
end
LUA
# One wrk run: STACK (tcp, relays, direct) and FILE (1K, 64K) against
# nginx in the server's namespace (configured by wrk_site); prints
# transactions/s, the server's and the client's CPU µs per transaction,
# bytes read per response, the errors (socket errors and responses
# other than 2xx or 3xx), wrk's connections the library's log says
# moved across hosts, and of them to direct connections, and the
# latency's median, 99th percentile and maximum in ms.
wrk_run() {
    local stack=$1 file=$2 wrap=() t srv_pids cli_relay srv_relay s0 c0 s1 c1 cpu line sns saddr sport
    read -r sns saddr sport <"$dir/site"
    local cns=$ns1
    [ "$sns" = "$ns1" ] && cns=$ns2
    case $stack in
    relays) wrap=(env NETGAP_PRELOAD_DIRECT=0 "$netgap" wrap -t xdp --) ;;
    direct) wrap=(env NETGAP_PRELOAD_DIRECT=1 "$netgap" wrap -t xdp --) ;;
    esac
    if [ "$stack" != tcp ]; then start_relays; fi
    rm -f "$dir/nginx.pid"
    : >"$dir/wrk-preload.log"
    NETGAP_PRELOAD_LOG=$dir/nginx-preload.log setsid ip netns exec "$sns" ${wrap[@]+"${wrap[@]}"} \
        nginx -p "$dir" -e "$dir/error.log" -c "$dir/nginx.conf" >/dev/null 2>&1 &
    nginx_pid=$!
    for t in $(seq 200); do
        [ -s "$dir/nginx.pid" ] && break
        [ "$t" = 200 ] && { echo "nginx did not come up: $(tail -2 "$dir/error.log")" >&2; exit 1; }
        sleep 0.05
    done
    sleep 0.3
    local master
    master=$(cat "$dir/nginx.pid")
    # shellcheck disable=SC2207 # pids, one word each
    srv_pids=("$master" $(ps -o pid= --ppid "$master"))
    srv_relay=() cli_relay=()
    if [ "$stack" != tcp ]; then
        if [ "$sns" = "$ns1" ]; then srv_relay=("${relays[0]}") cli_relay=("${relays[1]}")
        else srv_relay=("${relays[1]}") cli_relay=("${relays[0]}"); fi
    fi
    s0=$(ticks "${srv_pids[@]}" ${srv_relay[@]+"${srv_relay[@]}"})
    c0=$(ticks ${cli_relay[@]+"${cli_relay[@]}"})
    # wrk's own CPU: the user and system time of the subshell's waited-for
    # children (ip, netgap wrap, wrk).
    cpu=$(NETGAP_PRELOAD_LOG=$dir/wrk-preload.log setsid -w ip netns exec "$cns" \
        ${wrap[@]+"${wrap[@]}"} wrk -t 2 -c "$conns" -d "${secs}s" -s "$dir/summary.lua" \
        "http://$saddr:$sport/$file" >"$dir/wrk.out" 2>&1
        # Not piped: a builtin in a pipeline runs in a fork of its own,
        # whose children's times start at zero.
        times >"$dir/times"
        awk 'NR == 2 { for (i = 1; i <= 2; i++) { split($i, a, "m"); s += a[1] * 60 + a[2] } print s }' "$dir/times")
    s1=$(ticks "${srv_pids[@]}" ${srv_relay[@]+"${srv_relay[@]}"})
    c1=$(ticks ${cli_relay[@]+"${cli_relay[@]}"})
    stop_nginx
    stop_relays
    line=$(grep '^wrk-summary ' "$dir/wrk.out") || {
        echo "wrk $stack $file gave no summary:" >&2
        cat "$dir/wrk.out" >&2
        exit 1
    }
    local relayed direct
    relayed=$(grep -c "moved to xdp via the relay" "$dir/wrk-preload.log" || true)
    direct=$(grep -c "moved to direct" "$dir/wrk-preload.log" || true)
    awk -v s="$((s1 - s0))" -v c="$((c1 - c0))" -v w="$cpu" -v hz="$hz" -v x="$relayed" -v d="$direct" '{
        n = $2; rate = n / ($4 / 1e6)
        printf "%.0f %.2f %.2f %.0f %d %d %d %.2f %.1f %.1f\n", rate, s / hz * 1e6 / n, (c / hz + w) * 1e6 / n,
            n ? $3 / n : 0, $5 + $6 + $7 + $8 + $9, x + d, d, $10 / 1e3, $11 / 1e3, $12 / 1e3 }' <<<"$line"
}

# netgap's own xdp stream between the first testbed's hosts, 64 KiB
# messages, in event mode (its waits sleep, as the library's do) and in
# poll mode: Gbit/s of each.
xdp_stream() {
    local json=$dir/stream-$1.jsonl
    "$netgap" run stream -t xdp --mode event,poll -s 64K --hosts "$hosts" --reps 1 \
        --rep-time "${secs}s" --json "$json" >/dev/null
    python3 - "$json" <<'PY'
import json, sys
v = {r["stack"]["mode"]: r["value"] for r in map(json.loads, open(sys.argv[1]))}
print("%.3f %.3f" % (v["event"], v["poll"]))
PY
}

loadavg() { cut -d' ' -f1-3 /proc/loadavg; }

web() {
printf '%-6s %-5s %-5s %-7s %12s %16s %16s %9s %7s\n' round file tool column "trans/s" "server us/trans" \
    "client us/trans" "xdp/dir" errors
: >"$dir/all.txt"
for r in $(seq "$rounds"); do
    echo "round $r: load average before $(loadavg)"
    for file in 1K 64K; do
        for stack in tcp relays direct; do
            json="$dir/$r-$file-$stack.jsonl"
            t=xdp way=()
            [ "$stack" = tcp ] && t=tcp
            [ "$stack" = relays ] && way=(--preload-relayed)
            "$netgap" run web -t "$t" ${way[@]+"${way[@]}"} --hosts "$hosts" -s "$file" \
                --clients "$conns" --reps 1 --duration "${secs}s" --json "$json" >/dev/null
            read -r rate srv cli across direct kept errors < <(summarize "$json")
            if [ "$stack" != tcp ] && [ "$kept" != 0 ]; then
                echo "round $r, $file, $stack: $kept connections stayed on the kernel's TCP" >&2
                exit 1
            fi
            echo "$file loadgen $stack $rate $srv $cli" >>"$dir/all.txt"
            printf '%-6s %-5s %-5s %-7s %12s %16s %16s %9s %7s\n' "$r" "$file" loadgen "$stack" "$rate" "$srv" \
                "$cli" "$across/$direct" "$errors"
            [ -f "$dir/site" ] || wrk_site "$json" "$dir" >"$dir/site"
            sleep 1
        done
        if [ "${WRK:-1}" = 1 ]; then
            for stack in tcp relays direct; do
                # In this shell, not a subshell: the cleanup must see its
                # nginx and relays.
                wrk_run "$stack" "$file" >"$dir/wrk.line"
                read -r rate srv cli per errors across direct p50 p99 pmax <"$dir/wrk.line"
                echo "$file wrk $stack $rate $srv $cli" >>"$dir/all.txt"
                printf '%-6s %-5s %-5s %-7s %12s %16s %16s %9s %7s %s\n' "$r" "$file" wrk "$stack" "$rate" "$srv" \
                    "$cli" "$across/$direct" "$errors" \
                    "($per bytes a response; latency ms: median $p50, 99% $p99, max $pmax)"
                if [ "$errors" != 0 ]; then
                    echo "round $r, $file, wrk $stack: $errors errors:" >&2
                    cat "$dir/wrk.out" >&2
                fi
                sleep 1
            done
        fi
    done
    read -r event poll < <(xdp_stream "$r")
    echo "stream xdp event $event 0 0" >>"$dir/all.txt"
    echo "stream xdp poll $poll 0 0" >>"$dir/all.txt"
    printf '%-6s %-5s %-5s %-7s %12s\n' "$r" 64K xdp event "$event Gbit/s" "$r" 64K xdp poll "$poll Gbit/s"
    echo "round $r: load average after $(loadavg)"
done
echo
printf '%-5s %-7s %-7s %12s %16s %16s\n' file tool column "median t/s" "server us/trans" "client us/trans"
: >"$dir/med.txt"
tools=(loadgen)
[ "${WRK:-1}" = 1 ] && tools+=(wrk)
for file in 1K 64K; do
    for tool in "${tools[@]}"; do
        for stack in tcp relays direct; do
            awk -v f="$file" -v t="$tool" -v s="$stack" '$1 == f && $2 == t && $3 == s' "$dir/all.txt" >"$dir/sel.txt"
            med() { sort -n -k"$1,$1" "$dir/sel.txt" | awk -v k="$1" '{ a[NR] = $k } END { print a[int((NR + 1) / 2)] }'; }
            printf '%-5s %-7s %-7s %12s %16s %16s\n' "$file" "$tool" "$stack" "$(med 4)" "$(med 5)" "$(med 6)"
            echo "$file $tool $stack $(med 4) $(med 5) $(med 6)" >>"$dir/med.txt"
        done
    done
done
smed() {
    awk -v m="$1" '$1 == "stream" && $3 == m' "$dir/all.txt" | sort -n -k4,4 |
        awk '{ a[NR] = $4 } END { print a[int((NR + 1) / 2)] }'
}
stream=$(smed event)
echo "netgap's xdp stream, 64 KiB: median $stream Gbit/s in event mode, $(smed poll) in poll mode"
awk -v g="$stream" '{ t[$1, $2, $3] = $4; s[$1, $2, $3] = $5; c[$1, $2, $3] = $6; seen[$2] = 1 }
     END { split("1K 64K", files, " "); split("loadgen wrk", tools, " ")
           for (i = 1; i <= 2; i++) for (j = 1; j <= 2; j++) { f = files[i]; k = tools[j]
               if (!seen[k]) continue
               for (b = 1; b <= 2; b++) { base = b == 1 ? "tcp" : "relays"
                   printf "%s %s: direct / %s transactions %.2fx, server CPU per transaction %.2fx, client %.2fx\n",
                       f, k, base, t[f, k, "direct"] / t[f, k, base], s[f, k, "direct"] / s[f, k, base],
                       c[f, k, "direct"] / c[f, k, base] }
               if (f == "64K")
                   printf "64K %s: direct bodies %.3f Gbit/s, %.2f of the xdp stream (event mode)\n", k,
                       t[f, k, "direct"] * 65536 * 8 / 1e9, t[f, k, "direct"] * 65536 * 8 / 1e9 / g } }' "$dir/med.txt"
echo "load average: $(loadavg); machine: $(nproc) CPUs, $(uname -r)"
}
[ "${WEB:-1}" = 1 ] && web

# Connection setup across the hosts: bench/preload-setup/connbench.c makes
# SETUP_CONNECTIONS connections one after another from the first host to
# the second (connect, a 1-byte request and reply, close) over the
# kernel's TCP, and under `netgap wrap -t xdp` on direct connections and
# through the relays; per connection, µs, and how many of the client's
# connections went direct.
setup_rows() {
    local n=${SETUP_CONNECTIONS:-200} stack port=$((40000 + RANDOM % 10000)) srv r log
    cc -O2 -o "$dir/connbench" bench/preload-setup/connbench.c
    start_relays
    echo
    echo "connection setup across the hosts ($n connections one after another: connect, 1 byte each way, close):"
    for r in $(seq "$rounds"); do
        for stack in tcp direct relays; do
            local wrap=()
            log=$dir/setup-$stack-$r.log
            : >"$log"
            case $stack in
            direct) wrap=(env NETGAP_PRELOAD_DIRECT=1 NETGAP_PRELOAD_LOG="$log" "$netgap" wrap -t xdp --) ;;
            relays) wrap=(env NETGAP_PRELOAD_DIRECT=0 NETGAP_PRELOAD_LOG="$log" "$netgap" wrap -t xdp --) ;;
            esac
            port=$((port + 1))
            ip netns exec "$ns2" ${wrap[@]+"${wrap[@]}"} "$dir/connbench" s "$port" 0.0.0.0 &
            srv=$!
            sleep 0.5
            printf 'round %s %-7s ' "$r" "$stack"
            ip netns exec "$ns1" ${wrap[@]+"${wrap[@]}"} "$dir/connbench" c "$port" "$n" "$ip2" |
                tr -d '\n'
            echo " ($(grep -c 'connection to port .* moved to direct' "$log" || true) of $n direct)"
            kill "$srv" 2>/dev/null || true
            wait "$srv" 2>/dev/null || true
        done
    done
    stop_relays
    echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
}
[ "${SETUP:-1}" = 1 ] && [ "$quick" = 0 ] && setup_rows

[ "${LATENCY:-1}" = 1 ] || exit 0
if ! command -v sockperf >/dev/null; then
    echo "sockperf is not installed: no latency rows"
    exit 0
fi
start_relays
port=$((30000 + RANDOM % 10000))
# One sockperf ping-pong: STACK (tcp, direct: under the library on its
# direct connections, or relay: under the library through the relays),
# MUX (epoll, poll or select) and the server's PORT (a fresh one each
# time: a closed server's port may still be held); prints its mean
# one-way µs.
sockperf_pp() {
    local stack=$1 mux=$2 port=$3 wrap=() feed=$dir/feed args srv
    echo "T:$ip2:$port" >"$feed"
    if [ "$mux" = epoll ]; then args=(--tcp -i "$ip2" -p "$port"); else args=(-f "$feed" -F "$mux"); fi
    case $stack in
    direct) wrap=(env NETGAP_PRELOAD_DIRECT=1 "$netgap" wrap -t xdp --) ;;
    relay) wrap=(env NETGAP_PRELOAD_DIRECT=0 "$netgap" wrap -t xdp --) ;;
    esac
    ip netns exec "$ns2" ${wrap[@]+"${wrap[@]}"} sockperf server "${args[@]}" >"$dir/sps.log" 2>&1 &
    srv=$!
    sleep 0.7
    ip netns exec "$ns1" ${wrap[@]+"${wrap[@]}"} sockperf ping-pong "${args[@]}" -m 14 -t 3 2>&1 |
        awk '/Summary: Latency is/ { for (i = 1; i <= NF; i++) if ($i == "is") print $(i + 1) }'
    kill "$srv" 2>/dev/null || true
    wait "$srv" 2>/dev/null || true
}
# netgap's own pingpong over STACK in MODE (event or poll), 1 byte: mean
# one-way µs.
netgap_pp() {
    local json=$dir/pp-$1-$2.jsonl
    rm -f "$json"
    "$netgap" run pingpong -t "$1" --mode "$2" -s 1 --hosts "$hosts" --reps 3 --rep-time 1s \
        --json "$json" >/dev/null 2>&1 || { echo "-"; return; }
    python3 -c 'import json, sys; r = json.loads(open(sys.argv[1]).readline()); print(round(r["value"], 1))' "$json"
}
echo
echo "a 14-byte request and response across the hosts, one-way µs (sockperf mean; netgap's event and poll mode):"
runs=("tcp epoll" "direct epoll" "direct poll" "relay epoll" "relay poll" "relay select")
if [ -n "${RUNS:-}" ]; then IFS=, read -r -a runs <<<"$RUNS"; fi
printf '%-6s' round
for run in "${runs[@]}"; do printf ' %13s' "$run"; done
# netgap's own runs, each "STACK MODE"; PINGPONGS overrides them.
pps=("xdp event" "xdp poll" "tcp event")
if [ -n "${PINGPONGS:-}" ]; then IFS=, read -r -a pps <<<"$PINGPONGS"; fi
for pp in "${pps[@]}"; do printf ' %13s' "netgap $pp"; done
printf '\n'
for r in $(seq "$rounds"); do
    row=()
    for run in "${runs[@]}"; do
        port=$((port + 1))
        # shellcheck disable=SC2086 # stack and multiplexer, two words
        row+=("$(sockperf_pp $run "$port")")
    done
    printf '%-6s' "$r"
    for pp in "${pps[@]}"; do
        # shellcheck disable=SC2086 # stack and mode, two words
        row+=("$(netgap_pp $pp)")
    done
    printf ' %13s' "${row[@]}"
    printf '\n'
done
stop_relays
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
