#!/usr/bin/env bash
# nginx serving 1 KiB and 64 KiB files to netgap's load generator across
# two testbed hosts, side by side in one run: kernel TCP against xdp
# through the preload library and the hosts' relays (`netgap run web -t
# tcp` and `-t xdp`: the same nginx, load generator, files and
# connections; under xdp both programs run under libnetgap_preload.so and
# each host's relay carries the connections over an AF_XDP flow on the
# hosts' second link). Interleaved ROUNDS times (default 3); prints per
# round, file and stack the transactions per second and the CPU time per
# transaction of the server host's role (nginx, and under xdp its relay)
# and of the client host's role (the load generator, and its relay), then
# the medians and xdp's ratio to tcp.
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
# usage: sudo bench/run-preload-xdp.sh [SECONDS] [CONNECTIONS]   (default 3 s, 4)
#        ROUNDS=3 PROFILE=release LATENCY=1 bench/run-preload-xdp.sh
#        WEB=0 RUNS="tcp epoll,direct epoll" PINGPONGS="xdp event" bench/run-preload-xdp.sh
#        (the latency rows alone, of sockperf's runs and netgap's only those named)
#        NETGAP_PRELOAD=/path/libnetgap_preload.so ...   (another build of the library)
# Needs root, nginx, libxdp-dev and libbpf-dev (the xdp feature).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-3}
conns=${2:-4}
rounds=${ROUNDS:-3}
profile=${PROFILE:-release}   # PROFILE=debug: a quick check of the script
if [ "$profile" = release ]; then
    nice cargo build --release --quiet --features xdp -p netgap-preload -p netgap
else
    nice cargo build --quiet --features xdp -p netgap-preload -p netgap
fi
export NETGAP_PRELOAD=${NETGAP_PRELOAD:-$PWD/target/$profile/libnetgap_preload.so}
netgap=$PWD/target/$profile/netgap
tb=pxbench
dir=$(mktemp -d)
trap '"$netgap" testbed down --name "$tb" >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
"$netgap" testbed down --name "$tb" >/dev/null 2>&1 || true
"$netgap" testbed up --name "$tb" --hosts 2 --topology mesh --links 2 >/dev/null
hosts="@/run/netgap/$tb/hosts.json"

# One record: transactions/s, then the server's and the client's CPU
# microseconds per transaction, then the connections relayed and kept.
summarize() {
    python3 - "$1" <<'PY'
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])][-1]
m = r["app"]["metrics"]
n = m["transactions"]
cpu = {c["role"]: c["cpu"]["cpu_ns"] for c in r["hosts_cpu"]}
print(f'{r["value"]:.0f} {cpu.get("server", 0) / n / 1e3:.2f} {cpu.get("client", 0) / n / 1e3:.2f} '
      f'{m.get("preload_xdp_connections", 0):.0f} {m.get("preload_kernel_connections", 0):.0f} {m["errors"]:.0f}')
PY
}

web() {
printf '%-6s %-5s %-5s %12s %16s %16s %8s %6s\n' round file stack "trans/s" "server us/trans" "client us/trans" relayed errors
: >"$dir/all.txt"
for r in $(seq "$rounds"); do
    for file in 1K 64K; do
        for stack in tcp xdp; do
            json="$dir/$r-$file-$stack.jsonl"
            "$netgap" run web -t "$stack" --hosts "$hosts" -s "$file" --clients "$conns" \
                --reps 1 --duration "${secs}s" --json "$json" >/dev/null
            read -r rate srv cli relayed kept errors < <(summarize "$json")
            if [ "$stack" = xdp ] && [ "$kept" != 0 ]; then
                echo "round $r, $file: $kept connections stayed on the kernel's TCP" >&2
                exit 1
            fi
            echo "$file $stack $rate $srv $cli" >>"$dir/all.txt"
            printf '%-6s %-5s %-5s %12s %16s %16s %8s %6s\n' "$r" "$file" "$stack" "$rate" "$srv" "$cli" "$relayed" "$errors"
        done
        sleep 1
    done
done
echo
printf '%-5s %-5s %12s %16s %16s\n' file stack "median t/s" "server us/trans" "client us/trans"
for file in 1K 64K; do
    for stack in tcp xdp; do
        awk -v f="$file" -v s="$stack" '$1 == f && $2 == s' "$dir/all.txt" >"$dir/sel.txt"
        med() { sort -n -k"$1,$1" "$dir/sel.txt" | awk -v k="$1" '{ a[NR] = $k } END { print a[int((NR + 1) / 2)] }'; }
        printf '%-5s %-5s %12s %16s %16s\n' "$file" "$stack" "$(med 3)" "$(med 4)" "$(med 5)"
        echo "$file $stack $(med 3) $(med 4) $(med 5)" >>"$dir/med.txt"
    done
done
awk '{ t[$1, $2] = $3; s[$1, $2] = $4; c[$1, $2] = $5 }
     END { split("1K 64K", files, " ")
           for (i = 1; i <= 2; i++) { f = files[i]
               printf "%s: xdp / tcp transactions %.2fx, server CPU per transaction %.2fx, client %.2fx\n",
                   f, t[f, "xdp"] / t[f, "tcp"], s[f, "xdp"] / s[f, "tcp"], c[f, "xdp"] / c[f, "tcp"] } }' "$dir/med.txt"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg); machine: $(nproc) CPUs, $(uname -r)"
}
[ "${WEB:-1}" = 1 ] && web

[ "${LATENCY:-1}" = 1 ] || exit 0
if ! command -v sockperf >/dev/null; then
    echo "sockperf is not installed: no latency rows"
    exit 0
fi
# The hosts' namespaces, their addresses on the first link (the TCP
# connection's) and their interfaces on the second (the relays' flow's).
read -r ns1 ns2 ip1 ip2 if1 if2 < <(python3 - "/run/netgap/$tb/hosts.json" <<'PY'
import json, sys
h = json.load(open(sys.argv[1]))["hosts"]
second = [next(l["ifname"] for l in x["links"] if l["index"] == 1) for x in h[:2]]
print(h[0]["netns"], h[1]["netns"], h[0]["address"], h[1]["address"], *second)
PY
)
# The relays' shared key, fresh in this run's own directory.
"$netgap" key new "$dir/relay.key" >/dev/null
relays=()
stop_relays() {
    for p in ${relays[@]+"${relays[@]}"}; do kill "$p" 2>/dev/null || true; done
    for p in ${relays[@]+"${relays[@]}"}; do wait "$p" 2>/dev/null || true; done
    relays=()
}
trap 'stop_relays; "$netgap" testbed down --name "$tb" >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
for side in "$ns1 $if1 $ip2" "$ns2 $if2 $ip1"; do
    read -r ns dev peer <<<"$side"
    ip netns exec "$ns" "$netgap" relay --interface "$dev" --peers "$peer" --key "$dir/relay.key" \
        >>"$dir/relay-$ns.log" 2>&1 &
    relays+=("$!")
done
sleep 0.5
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
