#!/usr/bin/env bash
# A one-node Slurm on this machine, for the tests and for trying deploy/slurm by hand.
#
#   scripts/slurm_local.sh install          apt-get install slurm-wlm munge (as root)
#   scripts/slurm_local.sh start DIR        write DIR/slurm.conf, start munged, slurmctld
#                                           and slurmd with their state under DIR; prints
#                                           the line to eval: export SLURM_CONF=DIR/slurm.conf
#   scripts/slurm_local.sh stop DIR         stop exactly the daemons `start DIR` started
#
# One node named after this host, with its real core count and memory; select/cons_tres,
# proctrack/linuxproc, task/none (no cgroups needed); munge on a socket under DIR, so a
# system munged, if any, is left alone. Ports are free ones chosen at start.
set -euo pipefail

die() { echo "slurm_local: $*" >&2; exit 1; }

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

cmd_install() {
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null \
            && command -v sbatch >/dev/null && command -v munged >/dev/null; then
        return 0
    fi
    [ "$(id -u)" = 0 ] || die "installing Slurm needs root (apt-get install slurm-wlm munge)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null
}

cmd_start() {
    local dir=$1
    [ "$(id -u)" = 0 ] || die "the daemons run as root here (SlurmUser=root)"
    for exe in munged mungekey slurmctld slurmd sbatch; do
        command -v "$exe" >/dev/null || die "$exe not found: run '$0 install' first"
    done
    mkdir -p "$dir"/{state,spool,munge,log}
    dir=$(cd "$dir" && pwd)
    chmod 700 "$dir/munge"
    local host cores mem_mib ctld_port d_port
    host=$(hostname -s)
    cores=$(nproc)
    mem_mib=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 512 ))
    ctld_port=$(free_port)
    d_port=$(free_port)
    [ -f "$dir/munge/munge.key" ] || mungekey --create --keyfile="$dir/munge/munge.key" >/dev/null
    chmod 600 "$dir/munge/munge.key"
    cat > "$dir/slurm.conf" <<CONF
ClusterName=hypersack-test
SlurmctldHost=$host
SlurmctldPort=$ctld_port
SlurmdPort=$d_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.sock
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/slurmd-%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$dir/log/jobcomp.txt
KillWait=10
InactiveLimit=0
MinJobAge=300
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName=$host CPUs=$cores RealMemory=$mem_mib State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF
    munged --force --socket="$dir/munge/munge.sock" --key-file="$dir/munge/munge.key" \
        --pid-file="$dir/munge/munged.pid" --log-file="$dir/log/munged.log" \
        --seed-file="$dir/munge/munged.seed"
    export SLURM_CONF=$dir/slurm.conf
    slurmctld -f "$SLURM_CONF"
    slurmd -f "$SLURM_CONF"
    # Ready when the node is idle.
    for _ in $(seq 1 120); do
        if sinfo -h -N -o '%T' 2>/dev/null | grep -qx idle; then
            echo "export SLURM_CONF=$SLURM_CONF"
            return 0
        fi
        sleep 0.5
    done
    sinfo -N >&2 || true
    tail -n 20 "$dir/log/slurmctld.log" "$dir/log/slurmd.log" >&2 || true
    die "the node did not become idle in 60 s (logs above)"
}

stop_pidfile() {
    local pidfile=$1 pid
    [ -f "$pidfile" ] || return 0
    pid=$(cat "$pidfile")
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$pidfile"
}

cmd_stop() {
    local dir=$1
    [ -d "$dir" ] || return 0
    dir=$(cd "$dir" && pwd)
    stop_pidfile "$dir/slurmd.pid"
    stop_pidfile "$dir/slurmctld.pid"
    stop_pidfile "$dir/munge/munged.pid"
}

case "${1:-}" in
    install) cmd_install ;;
    start) [ $# -eq 2 ] || die "usage: $0 start DIR"; cmd_start "$2" ;;
    stop) [ $# -eq 2 ] || die "usage: $0 stop DIR"; cmd_stop "$2" ;;
    *) die "usage: $0 install | start DIR | stop DIR" ;;
esac
