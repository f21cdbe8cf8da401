#!/usr/bin/env bash
# A real Slurm cluster on a namespace testbed, and netgap run on it as a
# user of an allocation runs it. Needs root, iproute2, slurm-wlm, munge
# (and Open MPI for the mpirun part).
#
#   1. `netgap testbed up`: a switch of N hosts h1..hN (10.77.0.1..N).
#   2. In a fresh 0700 directory: a munge key, munged on its own socket;
#      slurm.conf with one node per testbed host (NodeAddr = its testbed
#      address), proctrack/linuxproc and task/none (no cgroups).
#   3. Each testbed namespace gets /etc/netns/NS/hosts (what `ip netns
#      exec` mounts over /etc/hosts): the host's own name on 127.0.1.1, as
#      Debian installs it, and the other hosts on their addresses.
#   4. slurmctld in h1's network namespace with a UTS namespace of its own
#      (host name `ctl`), so slurmds and srun reach it over the switch.
#   5. One slurmd per host, in the host's network namespace with a UTS
#      namespace whose host name is the node's name.
#   6. Wait until sinfo shows every node idle.
#   7. sbatch --wait a job on every node: srun starts `netgap serve --bind
#      auto` on each node, and `netgap run ... --hosts @slurm:PORT` measures
#      multistream, hotspot, fanin and gather across them (and, with MPI,
#      mpi-latency and mpi-bw on the first two nodes; with --xdp, pingpong
#      and stream over xdp and tcp with both roles on the first two nodes'
#      agents, whose control connections share eth0 with the xdp flows);
#      then `netgap study
#      STUDY --quick --hosts @slurm:PORT --key KEY` measures a study's
#      figures there, its point-to-point tests with both roles on the
#      first two nodes' agents (unless --no-study).
#   8. mpirun, as a user without Slurm runs it: a hostfile of the testbed
#      hosts, the agents started by mpirun, `--hosts @hostfile:FILE:PORT`.
#   9. Everything is taken down (daemons, directories, /etc/netns files,
#      the testbed), on success and on failure alike.
#
# Results: slurm.jsonl, slurm-xdp.jsonl (with --xdp), mpirun.jsonl and
# links-*.json (each host's link counters before and after each run) in OUT (default ./slurm-cluster-TIME),
# and the study's results file and report in OUT/study.
#
# Usage: bench/slurm-cluster.sh [--hosts N] [--name NAME] [--out DIR]
#        [--port PORT] [--netgap PATH] [--no-mpirun] [--mpi] [--xdp] [--no-study]
#        [-- EXTRA RUN FLAGS]
# NETGAP_SLURM_SETTINGS overrides the run's settings (default: short);
# NETGAP_SLURM_STUDY the study's arguments (default: 003 --figures 2,3,
# its sweeps over kernel TCP).
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
hosts=4
name=slurm
out=""
netgap=""
do_mpirun=1
do_mpi=0
do_xdp=0
do_study=1
port=7190
while [ $# -gt 0 ]; do
    case "$1" in
    --hosts) hosts="$2"; shift 2 ;;
    --name) name="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --netgap) netgap="$2"; shift 2 ;;
    --port) port="$2"; shift 2 ;;
    --no-mpirun) do_mpirun=0; shift ;;
    --mpi) do_mpi=1; shift ;;
    --xdp) do_xdp=1; shift ;;
    --no-study) do_study=0; shift ;;
    --) shift; break ;;
    *) echo "slurm-cluster.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
if [ -z "$netgap" ]; then
    if [ "$do_mpi" = 1 ]; then
        cargo build --release --features mpi --manifest-path "$here/Cargo.toml" >/dev/null
    else
        cargo build --release --manifest-path "$here/Cargo.toml" >/dev/null
    fi
    netgap="$here/target/release/netgap"
fi
netgap="$(realpath "$netgap")"
out="${out:-slurm-cluster-$(date -u +%Y%m%dT%H%M%S)}"
mkdir -p "$out"
out="$(realpath "$out")"
settings=(${NETGAP_SLURM_SETTINGS:---reps 1 --duration 300ms --clients 3 --wait 30s})
study_args=(${NETGAP_SLURM_STUDY:-003 --figures 2,3})
extra=("$@")

for tool in ip munged slurmctld slurmd sbatch sinfo srun; do
    command -v "$tool" >/dev/null || { echo "slurm-cluster.sh: $tool is not installed" >&2; exit 2; }
done
[ "$(id -u)" -eq 0 ] || { echo "slurm-cluster.sh: needs root (network namespaces)" >&2; exit 2; }

ns() { if [ "$name" = testbed ]; then echo "ngtb-h$1"; else echo "ngtb-$name-h$1"; fi; }
work=""
pids=()
cleanup() {
    set +e
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
    for p in "${pids[@]}"; do
        for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$p" 2>/dev/null
        wait "$p" 2>/dev/null
    done
    for i in $(seq "$hosts"); do rm -rf "/etc/netns/$(ns "$i")"; done
    rmdir /etc/netns 2>/dev/null
    [ -n "$work" ] && rm -rf "$work"
    "$netgap" testbed down --name "$name" >/dev/null
}
trap cleanup EXIT

echo "== testbed: a switch of $hosts hosts"
"$netgap" testbed up --name "$name" --hosts "$hosts" --topology switch >/dev/null
addr() { echo "10.77.0.$1"; }

work="$(mktemp -d "${TMPDIR:-/tmp}/netgap-slurm.XXXXXX")"
chmod 700 "$work"
mkdir -m 700 "$work/munge" "$work/ctld" "$work/spool" "$work/log"
export SLURM_CONF="$work/slurm.conf"

echo "== munge: one key, its own socket"
dd if=/dev/urandom of="$work/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$work/munge/munge.key"
munged --foreground --force --key-file="$work/munge/munge.key" \
    --socket="$work/munge/munge.socket" --pid-file="$work/munge/munged.pid" \
    --log-file="$work/munge/munged.log" --seed-file="$work/munge/munged.seed" \
    >"$work/munge/munged.out" 2>&1 &
pids+=("$!")
for _ in $(seq 100); do [ -S "$work/munge/munge.socket" ] && break; sleep 0.1; done
[ -S "$work/munge/munge.socket" ] || { echo "munged did not start:" >&2; cat "$work/munge/munged.log" >&2; exit 1; }

nodes="h[1-$hosts]"
{
    echo "ClusterName=netgap"
    echo "SlurmctldHost=ctl($(addr 1))"
    echo "SlurmUser=root"
    echo "SlurmdUser=root"
    echo "AuthType=auth/munge"
    echo "AuthInfo=socket=$work/munge/munge.socket"
    echo "CredType=cred/munge"
    echo "StateSaveLocation=$work/ctld"
    echo "SlurmctldPidFile=$work/ctld/slurmctld.pid"
    echo "SlurmctldLogFile=$work/log/slurmctld.log"
    echo "SlurmdSpoolDir=$work/spool/%n"
    echo "SlurmdPidFile=$work/spool/slurmd-%n.pid"
    echo "SlurmdLogFile=$work/log/slurmd-%n.log"
    echo "ProctrackType=proctrack/linuxproc"
    echo "TaskPlugin=task/none"
    echo "JobAcctGatherType=jobacct_gather/none"
    echo "AccountingStorageType=accounting_storage/none"
    echo "SchedulerType=sched/builtin"
    echo "SelectType=select/linear"
    echo "MpiDefault=none"
    echo "ReturnToService=2"
    echo "SlurmctldPort=6817"
    echo "SlurmdPort=6818"
    echo "KillWait=2"
    echo "MinJobAge=2"
    echo "InactiveLimit=0"
    for i in $(seq "$hosts"); do
        echo "NodeName=h$i NodeAddr=$(addr "$i") NodeHostname=h$i CPUs=1 State=UNKNOWN"
    done
    echo "PartitionName=net Nodes=$nodes Default=YES MaxTime=INFINITE State=UP"
} >"$SLURM_CONF"
# slurmd loads a cgroup plugin even when no plugin uses it; `ip netns exec`
# mounts a fresh /sys with no cgroup file system, so the autodetection
# fails. The v1 plugin loads without one, and nothing here uses it.
echo "CgroupPlugin=cgroup/v1" >"$work/cgroup.conf"

echo "== /etc/netns/NS/hosts: each host's own name on 127.0.1.1"
for i in $(seq "$hosts"); do
    mkdir -p "/etc/netns/$(ns "$i")"
    {
        echo "127.0.0.1 localhost"
        echo "127.0.1.1 h$i"
        for j in $(seq "$hosts"); do [ "$j" = "$i" ] || echo "$(addr "$j") h$j"; done
    } >"/etc/netns/$(ns "$i")/hosts"
done

echo "== slurmctld in h1's network namespace (host name ctl), a slurmd on every host"
ip netns exec "$(ns 1)" unshare --uts sh -c 'hostname ctl && exec slurmctld -D -c -i' \
    >"$work/log/slurmctld.out" 2>&1 &
pids+=("$!")
for i in $(seq "$hosts"); do
    mkdir -m 700 "$work/spool/h$i"
    ip netns exec "$(ns "$i")" unshare --uts sh -c "hostname h$i && exec slurmd -D -N h$i" \
        >"$work/log/slurmd-h$i.out" 2>&1 &
    pids+=("$!")
done
in_h1() { ip netns exec "$(ns 1)" "$@"; }
idle=""
for _ in $(seq 300); do
    idle="$(in_h1 sinfo -h -N -t idle -o %N 2>/dev/null | sort -u | wc -l)"
    [ "$idle" = "$hosts" ] && break
    sleep 0.1
done
if [ "$idle" != "$hosts" ]; then
    echo "slurm-cluster.sh: $idle of $hosts nodes idle; sinfo:" >&2
    in_h1 sinfo -N >&2 || true
    tail -n 20 "$work"/log/*.log >&2 || true
    exit 1
fi
in_h1 sinfo -N

links() { # FILE
    for i in $(seq "$hosts"); do ip -n "$(ns "$i")" -s -j link show dev eth0; done >"$1"
}

echo "== sbatch --wait: agents by srun, netgap run --hosts @slurm:$port"
"$netgap" key new "$work/key" >/dev/null
mpi_run=""
if [ "$do_mpi" = 1 ]; then
    # The MPI tests: mpirun, inside the allocation, starts rank 0 and rank
    # 1 on the first two nodes (its daemons through srun).
    mpi_run="\"$netgap\" run mpi-latency,mpi-bw --hosts @slurm --sizes 8,65536 --reps 2 --json \"$out/slurm-mpi.jsonl\""
fi
xdp_run=""
if [ "$do_xdp" = 1 ]; then
    # User-level networking through agents on one-interface nodes: the
    # client role on the second node's agent, the server role on the
    # first's, their xdp ports on the eth0 their control connections take.
    xdp_run="\"$netgap\" run pingpong,stream -t xdp,tcp --hosts @slurm:$port --key \"$work/key\" --sizes 1,64K --reps 3 --rep-time 20ms --json \"$out/slurm-xdp.jsonl\""
fi
study_run=""
if [ "$do_study" = 1 ]; then
    # A study on the allocation: its point-to-point figures with both roles
    # on the first two nodes' agents, this job's step only coordinating.
    study_run="\"$netgap\" study ${study_args[*]} --quick --hosts @slurm:$port --key \"$work/key\" -o \"$out/study\""
fi
cat >"$work/job.sh" <<EOF
#!/bin/bash
set -euo pipefail
srun --overlap --ntasks-per-node=1 "$netgap" serve --bind auto --port $port --key "$work/key" --allow-services &
"$netgap" run multistream,hotspot,fanin,gather --hosts @slurm:$port --key "$work/key" ${settings[*]} ${extra[*]} --json "$out/slurm.jsonl"
$mpi_run
$xdp_run
$study_run
EOF
links "$out/links-slurm-before.json"
in_h1 sbatch --wait --nodes="$hosts" --chdir="$work" --output="$out/slurm-job.out" "$work/job.sh" || {
    echo "slurm-cluster.sh: the job failed; its output:" >&2
    cat "$out/slurm-job.out" >&2
    exit 1
}
links "$out/links-slurm-after.json"
cat "$out/slurm-job.out"
# The job's end ends its steps: no agent of it may remain.
for _ in $(seq 50); do pgrep -f "serve --bind auto --port $port" >/dev/null || break; sleep 0.1; done
if pgrep -af "serve --bind auto --port $port"; then
    echo "slurm-cluster.sh: agents left after the job" >&2
    exit 1
fi

if [ "$do_mpirun" = 1 ]; then
    echo "== mpirun: a hostfile of the testbed hosts, agents started by mpirun"
    command -v mpirun >/dev/null || { echo "slurm-cluster.sh: mpirun is not installed" >&2; exit 2; }
    for i in $(seq "$hosts"); do echo "h$i slots=1"; done >"$work/hostfile"
    links "$out/links-mpirun-before.json"
    # mpirun reaches the other hosts with its launch agent; the testbed's
    # hosts are namespaces of this machine, so the launch agent enters the
    # host's namespaces (what ssh would do on a real cluster).
    cat >"$work/rsh" <<EOF
#!/bin/sh
# mpirun's launch agent: HOST COMMAND... -> COMMAND in HOST's namespaces.
host="\$1"; shift
exec ip netns exec "ngtb-$name-\$host" unshare --uts sh -c "hostname \$host && exec \$*"
EOF
    [ "$name" = testbed ] && sed -i "s/ngtb-$name-/ngtb-/" "$work/rsh"
    chmod 700 "$work/rsh"
    # Outside Slurm: no SLURM_CONF, so nothing asks Slurm for addresses.
    ip netns exec "$(ns 1)" env -u SLURM_CONF unshare --uts sh -c "hostname h1 && exec mpirun --allow-run-as-root --oversubscribe \
        --hostfile '$work/hostfile' --map-by ppr:1:node \
        --mca plm_rsh_agent '$work/rsh' --mca btl_tcp_if_include eth0 --mca oob_tcp_if_include eth0 \
        '$netgap' serve --bind auto --port $port --key '$work/key' --allow-services" \
        >"$out/mpirun.out" 2>&1 &
    mpirun_pid=$!
    pids+=("$mpirun_pid")
    in_h1 env -u SLURM_CONF unshare --uts sh -c "hostname h1 && exec '$netgap' run multistream,hotspot,fanin,gather \
        --hosts '@hostfile:$work/hostfile:$port' --key '$work/key' ${settings[*]} ${extra[*]} \
        --json '$out/mpirun.jsonl'"
    if [ "$do_mpi" = 1 ]; then
        # The MPI tests on the hostfile's first two hosts: netgap's mpirun
        # reaches h2 with the launch agent the user configures
        # (OMPI_MCA_plm_rsh_agent; ssh by default).
        in_h1 env -u SLURM_CONF OMPI_MCA_plm_rsh_agent="$work/rsh" unshare --uts sh -c \
            "hostname h1 && exec '$netgap' run mpi-latency,mpi-bw --hosts '@hostfile:$work/hostfile' \
            --sizes 8,65536 --reps 2 --json '$out/mpirun-mpi.jsonl'"
    fi
    links "$out/links-mpirun-after.json"
    kill "$mpirun_pid"
    wait "$mpirun_pid" 2>/dev/null || true
    for _ in $(seq 50); do pgrep -f "serve --bind auto --port $port" >/dev/null || break; sleep 0.1; done
    if pgrep -af "serve --bind auto --port $port"; then
        echo "slurm-cluster.sh: agents left after mpirun" >&2
        exit 1
    fi
fi
echo "results: $out"
