#!/usr/bin/env bash
# nginx serving 1 KiB and 64 KiB files to wrk on one host, side by side in
# one run: kernel TCP over loopback against shm through the preload library
# (both programs under libnetgap_preload.so, as `netgap wrap -t shm` runs
# them). Prints, per file and stack, transactions per second and the CPU
# time per transaction of nginx's one worker and of wrk (one thread).
# BASELINE_LIB=PATH adds a run under another build of the library (an
# older one, to compare before and after a change in the same run).
#
# Then the same files from nginx to netgap's own load generator (`netgap
# run web -t tcp,shm`, the generator and nginx both under the library for
# shm; CONNECTIONS clients on one client host), ROUNDS times: transactions
# per second and CPU microseconds per transaction at each end. The
# generator compares VERIFY (default 0.01) of the bodies byte for byte,
# as a share: at 1, comparing every 64 KiB body costs the generator about
# as much as the transfer and the generator, not the stack, sets the pace.
#
# Then the library's own cost: a 1-byte request and response, netgap's
# tcp pingpong under the library (`netgap wrap -t shm -- netgap run
# pingpong -t tcp`, client and in-process agent both under it; as it comes,
# with NETGAP_PRELOAD_SPIN_US=0, and under BASELINE_LIB if set) against
# netgap's own shm transport (event mode sleeps on a futex, poll mode
# spins) and plain tcp, interleaved ROUNDS times (default 3); prints each
# round's mean latency, the medians, and what the library adds: without
# its spin to the shm transport's event mode, with it to its poll mode.
#
# usage: bench/run-preload.sh [SECONDS] [CONNECTIONS]   (default 10 s, 16)
#        ROUNDS=3 REPS=5 REP_TIME=1s bench/run-preload.sh
# Needs nginx and wrk; run as root or as the user nginx runs as (a region is
# only shared between processes of one user).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-10}
conns=${2:-16}
rounds=${ROUNDS:-3}
reps=${REPS:-5}
rep_time=${REP_TIME:-1s}
nice cargo build --release --quiet -p netgap-preload -p netgap
lib=$PWD/target/release/libnetgap_preload.so
netgap=$PWD/target/release/netgap
dir=$(mktemp -d)
trap 'kill "$(cat "$dir/nginx.pid" 2>/dev/null)" 2>/dev/null || true; sleep 0.5; rm -rf "$dir"' EXIT
mkdir -p "$dir/root"
head -c 1024 /dev/urandom >"$dir/root/1k"
head -c 65536 /dev/urandom >"$dir/root/64k"
user=""
[ "$(id -u)" = 0 ] && user="user root root;"
hz=$(getconf CLK_TCK)

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

start_nginx() { # $1: preload or empty
    local port=$2
    cat >"$dir/nginx.conf" <<CONF
daemon on;
$user
worker_processes 1;
pid $dir/nginx.pid;
error_log $dir/error.log warn;
events { worker_connections 1024; }
http {
    access_log off; sendfile on; tcp_nopush on; tcp_nodelay on;
    keepalive_requests 100000000;
    client_body_temp_path $dir/body; proxy_temp_path $dir/proxy;
    fastcgi_temp_path $dir/fastcgi; uwsgi_temp_path $dir/uwsgi; scgi_temp_path $dir/scgi;
    types { } default_type application/octet-stream;
    server { listen 127.0.0.1:$port; root $dir/root; }
}
CONF
    rm -f "$dir/nginx.pid"
    env ${1:+LD_PRELOAD=$1} NETGAP_PRELOAD_LOG="$dir/preload.log" \
        nginx -p "$dir" -c "$dir/nginx.conf" -e "$dir/error.log"
    for _ in $(seq 100); do [ -s "$dir/nginx.pid" ] && break; sleep 0.05; done
    sleep 0.3
}

stop_nginx() {
    kill "$(cat "$dir/nginx.pid")"
    for _ in $(seq 100); do [ -e "$dir/nginx.pid" ] || break; sleep 0.05; done
}

printf '%-5s %-22s %12s %16s %16s\n' file stack "trans/s" "nginx us/trans" "wrk us/trans"
port=$((20000 + RANDOM % 20000))
for file in 1k 64k; do
    stacks=("kernel TCP (loopback)" "shm via preload")
    [ -n "${BASELINE_LIB:-}" ] && stacks+=("preload, baseline")
    for stack in "${stacks[@]}"; do
        pre=""
        case $stack in
            "shm via preload") pre=$lib ;;
            "preload, baseline") pre=$BASELINE_LIB ;;
        esac
        port=$((port + 1))
        start_nginx "$pre" "$port"
        master=$(cat "$dir/nginx.pid")
        worker=$(pgrep -P "$master" | head -1)
        before=$(cpu_ticks "$worker")
        out=$(env ${pre:+LD_PRELOAD=$pre} NETGAP_PRELOAD_LOG="$dir/preload.log" \
            /usr/bin/time -f 'CPU %U %S' wrk -t1 -c"$conns" -d"${secs}s" "http://127.0.0.1:$port/$file" 2>&1)
        after=$(cpu_ticks "$worker")
        stop_nginx
        if grep -q "Socket errors\|Non-2xx" <<<"$out"; then
            echo "errors in the $stack run of $file:" >&2
            echo "$out" >&2
            exit 1
        fi
        reqs=$(awk '/requests in/ {print $1}' <<<"$out")
        rate=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
        wrk_s=$(awk '/^CPU/ {print $2 + $3}' <<<"$out")
        awk -v f="$file" -v s="$stack" -v rate="$rate" -v reqs="$reqs" \
            -v ng=$((after - before)) -v hz="$hz" -v w="$wrk_s" \
            'BEGIN { printf "%-5s %-22s %12.0f %16.2f %16.2f\n", f, s, rate, ng / hz / reqs * 1e6, w / reqs * 1e6 }'
    done
done
moved=$(grep -c "moved to shm" "$dir/preload.log" || true)
kept=$(grep -c "kernel's TCP" "$dir/preload.log" || true)
echo "preload log: $moved connection ends moved to shm, $kept kept on kernel TCP"

echo
verify=${VERIFY:-0.01}
echo "nginx to netgap's load generator: $conns clients, ${secs} s x 3 per point, --verify-fraction $verify"
printf '%-6s %-5s %-6s %12s %16s %16s\n' round file stack "trans/s" "server us/trans" "client us/trans"
for r in $(seq "$rounds"); do
    NETGAP_PRELOAD=$lib "$netgap" run web -t tcp,shm -s 1K,64K --server nginx --server-workers 1 \
        --clients "$conns" --client-hosts 1 --reps 3 --duration "${secs}s" --verify-fraction "$verify" \
        --json "$dir/web.jsonl" >/dev/null 2>"$dir/web.err" || { cat "$dir/web.err" >&2; exit 1; }
done
python3 - "$dir/web.jsonl" "$rounds" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
per = len(recs) // int(sys.argv[2])
for k, r in enumerate(recs):
    tps = r["value"]
    # each role's processes' share of one CPU over the window, in %
    pct = {h["role"]: h["cpu"]["process_percent"] for h in r.get("hosts_cpu") or []}
    us = lambda role: f"{pct[role] / 100 / tps * 1e6:16.2f}" if role in pct and tps else f"{'-':>16}"
    print(f"{k // per + 1:<6} {r['size_bytes'] // 1024:>4}K {r['transport']:<6} {tps:12.0f} {us('server')} {us('client')}")
PY

echo
echo "1-byte request/response: netgap pingpong -s 1, mean latency (us), $reps x $rep_time per run"
printf '%-6s %10s %10s %10s %10s %10s %10s %10s %10s\n' round "shm event" "shm poll" tcp preload "no spin" baseline "nospin-ev" "pre-poll"
lat() { awk '$1 == "pingpong" { print $5 }'; }
pp_args=(run pingpong -s 1 --reps "$reps" --rep-time "$rep_time")
ping() { "$netgap" "${pp_args[@]}" "$@" 2>/dev/null | lat; }
wrapped() { # $1: the library; $2: NETGAP_PRELOAD_SPIN_US
    NETGAP_PRELOAD=$1 NETGAP_PRELOAD_LOG="$dir/pp.log" NETGAP_PRELOAD_SPIN_US=$2 \
        "$netgap" wrap -t shm -- "$netgap" "${pp_args[@]}" -t tcp 2>/dev/null | lat
}
: >"$dir/pp.txt"
for r in $(seq "$rounds"); do
    ev=$(ping -t shm)
    po=$(ping -t shm --mode poll)
    tcp=$(ping -t tcp)
    pre=$(wrapped "$lib" 30)
    nospin=$(wrapped "$lib" 0)
    base=0
    [ -n "${BASELINE_LIB:-}" ] && base=$(wrapped "$BASELINE_LIB" 30)
    echo "$ev $po $tcp $pre $nospin $base" >>"$dir/pp.txt"
    awk -v r="$r" -v a="$ev" -v b="$po" -v c="$tcp" -v d="$pre" -v e="$nospin" -v f="$base" \
        'BEGIN { printf "%-6s %10.2f %10.2f %10.2f %10.2f %10.2f %10.2f %+10.2f %+10.2f\n", r, a, b, c, d, e, f, e - a, d - b }'
done
med() { sort -n -k"$1,$1" "$dir/pp.txt" | awk -v k="$1" '{ a[NR] = $k } END { print a[int((NR + 1) / 2)] }'; }
awk -v a="$(med 1)" -v b="$(med 2)" -v c="$(med 3)" -v d="$(med 4)" -v e="$(med 5)" -v f="$(med 6)" \
    'BEGIN { printf "%-6s %10.2f %10.2f %10.2f %10.2f %10.2f %10.2f %+10.2f %+10.2f\n", "median", a, b, c, d, e, f, e - a, d - b
             printf "preload (spin 0) / shm event: %.2fx; preload / shm poll: %.2fx\n", e / a, d / b }'
moved=$(grep -c "moved to shm" "$dir/pp.log" || true)
echo "ping-pong preload log: $moved connection ends moved to shm; load average: $(cut -d' ' -f1-3 /proc/loadavg)"
