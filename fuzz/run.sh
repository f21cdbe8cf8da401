#!/usr/bin/env bash
# Runs every fuzz target (or only the TARGETs named) for SECONDS each
# (default 60) on its corpus in
# fuzz/corpus/TARGET, then prints one line per target: executions, edges
# covered (libFuzzer's "cov"), features ("ft") and peak memory. New inputs
# go to a scratch directory, so the kept corpus stays small; pass --keep to
# merge the new inputs that add coverage into it; --dev builds the targets
# unoptimized (with debug assertions), in half the time: enough for a check
# that every target runs on its corpus (CI), not for a long search.
#
# Needs cargo-fuzz (`cargo install cargo-fuzz --locked`); its sanitizer
# flags are nightly features, which the stable toolchain accepts under
# RUSTC_BOOTSTRAP=1.
set -euo pipefail
cd "$(dirname "$0")"

secs=60
keep=0
dev=0
only=()
for arg in "$@"; do
    case "$arg" in
        --keep) keep=1 ;;
        --dev) dev=1 ;;
        "" | -*) echo "usage: fuzz/run.sh [SECONDS] [--keep] [--dev] [TARGET...]" >&2; exit 2 ;;
        *[!0-9]*) only+=("$arg") ;;
        *) secs=$arg ;;
    esac
done

if ! command -v cargo-fuzz >/dev/null; then
    echo "cargo-fuzz is missing: cargo install cargo-fuzz --locked" >&2
    exit 1
fi
export RUSTC_BOOTSTRAP=1

# Built once: the runs below use these binaries, so editing the sources
# meanwhile changes nothing.
if [ "$dev" = 1 ]; then
    cargo fuzz build --dev
    bin=target/x86_64-unknown-linux-gnu/debug
else
    cargo fuzz build -O
    bin=target/x86_64-unknown-linux-gnu/release
fi
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
printf '%-18s %12s %8s %8s %8s\n' target executions cov ft rss_mb
targets=$(cargo fuzz list)
if [ "${#only[@]}" -gt 0 ]; then
    for t in "${only[@]}"; do
        if ! grep -qx "$t" <<<"$targets"; then
            echo "fuzz/run.sh: no fuzz target named '$t' (cargo fuzz list names them)" >&2
            exit 2
        fi
    done
    targets=$(printf '%s\n' "${only[@]}")
fi
for target in $targets; do
    mkdir -p "corpus/$target"
    scratch="$logs/$target.new"
    mkdir -p "$scratch"
    log="$logs/$target.log"
    # A crash, a hang past 10 s or more than 2 GiB ends the run with the
    # reproducer in fuzz/artifacts/TARGET/.
    mkdir -p "artifacts/$target"
    if ! "$bin/$target" "$scratch" "corpus/$target" \
        -artifact_prefix="artifacts/$target/" -max_total_time="$secs" \
        -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
        -print_final_stats=1 >"$log" 2>&1; then
        echo "fuzz target $target failed; its log ends:" >&2
        tail -n 40 "$log" >&2
        exit 1
    fi
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    rss=$(sed -n 's/^stat::peak_rss_mb: *//p' "$log" | tail -n 1)
    last=$(grep -E '^#[0-9]+' "$log" | tail -n 1)
    cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
    ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
    printf '%-18s %12s %8s %8s %8s\n' "$target" "${execs:-?}" "${cov:-?}" "${ft:-?}" "${rss:-?}"
    if [ "$keep" = 1 ]; then
        "$bin/$target" -merge=1 "corpus/$target" "$scratch" >/dev/null 2>&1
    fi
done
