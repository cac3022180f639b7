#!/usr/bin/env bash
# Start a one-node Slurm (slurmctld + slurmd + munge) on loopback for the Slurm runner's tests.
# Idempotent, run as root; installs Debian's packages if missing; bounded to about 90 s of waiting.
# Accounting is off (no slurmdbd): `sacct` has nothing, the runner polls `squeue` and each job
# writes its own status file.
set -euo pipefail

WAIT_S=${SLURM_START_WAIT_S:-60}

if [[ $(id -u) -ne 0 ]]; then
    echo "start-slurm.sh: run as root (it installs and starts Slurm and munge)" >&2
    exit 1
fi

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null \
        || ! command -v sbatch >/dev/null || ! command -v munged >/dev/null; then
    echo "installing slurmctld slurmd slurm-client munge ..." >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq slurmctld slurmd slurm-client munge >&2
fi

mkdir -p /etc/slurm /var/spool/slurmd /var/spool/slurmctld /var/log/slurm /run/munge

HOST=$(hostname)
CPUS=$(nproc)
MEM=$(free -m | awk '/Mem/{print int($2*0.8)}')
CONF=/etc/slurm/slurm.conf
NEW_CONF=$(cat <<CONF_EOF
# Written by tuner/.ci/start-slurm.sh: one node on loopback, no accounting.
ClusterName=local
SlurmctldHost=${HOST}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SchedulerParameters=sched_interval=1
MinJobAge=300
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
NodeName=${HOST} CPUs=${CPUS} RealMemory=${MEM} State=UNKNOWN
PartitionName=debug Nodes=${HOST} Default=YES MaxTime=INFINITE State=UP
CONF_EOF
)
CHANGED=0
if [[ ! -f $CONF ]] || [[ "$(cat "$CONF")" != "$NEW_CONF" ]]; then
    printf '%s\n' "$NEW_CONF" > "$CONF"
    CHANGED=1
fi

# munge: a key, the right owners, one daemon.
if [[ ! -s /etc/munge/munge.key ]]; then
    (command -v mungekey >/dev/null && mungekey --create --keyfile=/etc/munge/munge.key) \
        || dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none
fi
mkdir -p /var/lib/munge /var/log/munge
chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge
chmod 0400 /etc/munge/munge.key
if ! pgrep -x munged >/dev/null; then
    su -s /bin/sh munge -c munged
fi

if [[ $CHANGED -eq 1 ]] && pgrep -x slurmctld >/dev/null; then
    scontrol reconfigure >&2 || true
fi
pgrep -x slurmctld >/dev/null || slurmctld
pgrep -x slurmd >/dev/null || slurmd

# Wait (bounded) until the node is idle; resume it if an earlier run left it down/drained.
deadline=$((SECONDS + WAIT_S))
while (( SECONDS < deadline )); do
    state=$(sinfo -h -N -n "$HOST" -o '%T' 2>/dev/null | head -n1 || true)
    case "$state" in
        idle|mixed|allocated|completing) echo "slurm: node ${HOST} is ${state}"; exit 0 ;;
        down*|drain*|fail*) scontrol update NodeName="$HOST" State=RESUME >/dev/null 2>&1 || true ;;
    esac
    sleep 1
done
echo "start-slurm.sh: node ${HOST} did not become idle within ${WAIT_S} s (state: ${state:-none});" \
     "see /var/log/slurm/slurmctld.log and /var/log/slurm/slurmd.log" >&2
exit 1
