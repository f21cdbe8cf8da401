#!/usr/bin/env bash
# Connection setup through the preload library: a client connects, sends
# one byte, reads one back and closes, N times in a row, against a server
# that accepts, answers and closes (bench/preload-setup/connbench.c), over
# the kernel's TCP on loopback and with both programs under
# libnetgap_preload.so (`netgap wrap -t shm`), interleaved ROUNDS times.
# BASELINE_LIB=PATH adds a run under another build of the library (an
# older one, to compare before and after a change in the same run).
# Prints each run's mean, median and 90th percentile per connection.
#
# usage: bench/run-preload-setup.sh [N]        (default 2000 connections)
#        ROUNDS=3 BASELINE_LIB=/path/libnetgap_preload.so bench/run-preload-setup.sh
# Needs a C compiler; run as one user (a region is shared between processes
# of one user only).
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-2000}
rounds=${ROUNDS:-3}
nice cargo build --release --quiet -p netgap-preload -p netgap
lib=$PWD/target/release/libnetgap_preload.so
netgap=$PWD/target/release/netgap
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$work"' EXIT
cc -O2 -o "$work/connbench" bench/preload-setup/connbench.c
port=$((20000 + RANDOM % 20000))

run() { # label library(or empty)
    local label=$1 library=$2 pid
    port=$((port + 1))
    if [ -z "$library" ]; then
        "$work/connbench" s "$port" & pid=$!
        sleep 0.3
        printf '%-10s ' "$label"; "$work/connbench" c "$port" "$n"
    else
        NETGAP_PRELOAD="$library" NETGAP_PRELOAD_LOG=/dev/null \
            "$netgap" wrap -t shm -- "$work/connbench" s "$port" & pid=$!
        sleep 0.3
        printf '%-10s ' "$label"
        NETGAP_PRELOAD="$library" NETGAP_PRELOAD_LOG=/dev/null \
            "$netgap" wrap -t shm -- "$work/connbench" c "$port" "$n"
    fi
    kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null || true
}

echo "machine: $(nproc) CPUs, $(uname -r), load $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq "$rounds"); do
    echo "round $r"
    run kernel ""
    [ -n "${BASELINE_LIB:-}" ] && run baseline "$BASELINE_LIB"
    run library "$lib"
done
