#!/usr/bin/env bash
# Brings up a single-node Slurm cluster on this machine for the Slurm executor's end-to-end tests
# (server/tests/launcher/slurm.rs): Debian's munge, slurmctld and slurmd, started in the
# background without systemd. Idempotent: when a cluster already answers (`sinfo` shows a node
# that can take jobs) it does nothing. Fails loudly when Slurm does not come up, so the tests
# are never skipped for want of a cluster.
#
# Accounting is off (`accounting_storage/none`: no slurmdbd, no database), so `sacct` knows
# nothing here; the executor reads a finished job's state from `scontrol show job` (the
# controller remembers ended jobs for MinJobAge seconds, raised to an hour below) and its exit
# status from the `exit_code` file the batch script writes in the run directory.
#
# usage: scripts/slurm-up.sh   (needs root or sudo; logs go to /var/log/slurm/)
set -euo pipefail

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

node_ready() {
    # A node in `idle`, `mixed` or `allocated` state takes (or will take) jobs.
    local state
    state="$(sinfo -h -N -o '%T' 2>/dev/null | head -n 1)" || return 1
    case "$state" in
        idle* | mixed* | allocated* | completing*) return 0 ;;
        *) return 1 ;;
    esac
}

if command -v sinfo >/dev/null 2>&1 && node_ready; then
    echo "==> Slurm already answers: $(sinfo -h -N -o '%N %T %P' | head -n 1)"
    exit 0
fi

if ! command -v slurmctld >/dev/null 2>&1 || ! command -v slurmd >/dev/null 2>&1 ||
    ! command -v munged >/dev/null 2>&1; then
    echo "==> installing slurmctld, slurmd, slurm-client and munge"
    as_root apt-get update -q
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurmctld slurmd slurm-client munge
fi

host="$(hostname -s)"
cpus="$(nproc)"
mem_mb="$(free -m | awk '/^Mem:/ {print $2}')"
# Leave the machine some memory of its own; slurmd refuses to register a node that claims more
# than it has.
real_mem=$((mem_mb * 9 / 10))

echo "==> munge"
as_root mkdir -p /etc/munge /var/lib/munge /var/log/munge /run/munge
if [ ! -s /etc/munge/munge.key ]; then
    as_root sh -c 'dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null'
fi
as_root chown -R munge:munge /etc/munge /var/lib/munge /var/log/munge /run/munge
as_root chmod 700 /etc/munge
as_root chmod 400 /etc/munge/munge.key
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    as_root runuser -u munge -- /usr/sbin/munged
    for _ in $(seq 1 20); do
        munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break
        sleep 0.5
    done
fi
if ! munge -n | unmunge >/dev/null; then
    echo "ERROR: munged does not answer; Slurm cannot authenticate without it." >&2
    exit 1
fi

echo "==> slurm.conf for a single node ($host, $cpus CPUs, ${real_mem} MB)"
conf_dir=/etc/slurm
as_root mkdir -p "$conf_dir" /var/spool/slurm/ctld /var/spool/slurm/d /var/log/slurm /run/slurm
conf="$(mktemp)"
cat >"$conf" <<EOF
# Written by trainyard's scripts/slurm-up.sh: a one-node test cluster.
ClusterName=trainyard-test
# Loopback addresses: one node, and no reliance on the host name resolving.
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
StateSaveLocation=/var/spool/slurm/ctld
SlurmdSpoolDir=/var/spool/slurm/d
SlurmctldPidFile=/run/slurm/slurmctld.pid
SlurmdPidFile=/run/slurm/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
# Ended jobs stay visible to \`scontrol show job\` for an hour (no accounting database here).
MinJobAge=3600
# Seconds between the SIGTERM of a time limit or scancel and the SIGKILL.
KillWait=30
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1
SlurmctldTimeout=30
SlurmdTimeout=60
InactiveLimit=0
Waittime=0
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$real_mem State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
as_root cp "$conf" "$conf_dir/slurm.conf"
rm -f "$conf"
as_root chmod 644 "$conf_dir/slurm.conf"

echo "==> slurmctld and slurmd"
if ! pgrep -x slurmctld >/dev/null 2>&1; then
    as_root /usr/sbin/slurmctld
fi
if ! pgrep -x slurmd >/dev/null 2>&1; then
    as_root /usr/sbin/slurmd
fi

for _ in $(seq 1 60); do
    node_ready && break
    # A node left `down`/`drained` by an earlier run of this cluster is put back in service.
    state="$(sinfo -h -N -o '%T' 2>/dev/null | head -n 1 || true)"
    case "$state" in
        down* | drain* | fail*) as_root scontrol update NodeName="$host" State=RESUME 2>/dev/null || true ;;
    esac
    sleep 1
done
if ! node_ready; then
    echo "ERROR: Slurm did not come up; the Slurm tests cannot run." >&2
    sinfo -N -l >&2 || true
    echo "--- slurmctld.log ---" >&2
    as_root tail -n 30 /var/log/slurm/slurmctld.log >&2 || true
    echo "--- slurmd.log ---" >&2
    as_root tail -n 30 /var/log/slurm/slurmd.log >&2 || true
    exit 1
fi
echo "==> Slurm is up: $(sinfo -h -N -o '%N %T %P' | head -n 1)"
