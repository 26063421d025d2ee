#!/bin/bash
# A real 4-node Slurm cluster on this one machine (one slurmd per virtual node, Debian's Slurm),
# for tests/slurm/run.sh. Needs root and apt (installs slurmctld slurmd slurm-client munge).
#   tests/slurm/cluster.sh start   # install if needed, write /etc/slurm/slurm.conf, start, wait idle
#   tests/slurm/cluster.sh stop
set -euo pipefail
NODES=4
case "${1:-}" in
start)
  if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      slurmctld slurmd slurm-client munge >/dev/null
  fi
  host=$(hostname -s)
  mkdir -p /etc/slurm /var/spool/slurmctld /var/log/slurm /run/munge
  for i in $(seq 1 $NODES); do mkdir -p "/var/spool/slurmd/n$i"; done
  cat >/etc/slurm/slurm.conf <<CONF
ClusterName=local
SlurmctldHost=$host
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd/%n
SlurmdPidFile=/run/slurmd-%n.pid
SlurmdLogFile=/var/log/slurm/slurmd-%n.log
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
# Low, as some sites set it (1001 is Slurm's default): tests/slurm/run.sh packs 8 parts in arrays
# that must stay below it.
MaxArraySize=5
NodeName=n[1-$NODES] NodeHostname=$host Port=17001-1700$NODES CPUs=2 RealMemory=4000 State=UNKNOWN
PartitionName=debug Nodes=n[1-$NODES] Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
CONF
  chown -R munge:munge /run/munge
  pgrep -x munged >/dev/null || runuser -u munge -- munged --force
  pgrep -x slurmctld >/dev/null || slurmctld -c  # -c: no jobs from an earlier run
  for i in $(seq 1 $NODES); do
    pgrep -f "slurmd -N n$i\$" >/dev/null || slurmd -N "n$i"
  done
  for _ in $(seq 1 60); do
    if [ "$(sinfo -h -o '%t %D' 2>/dev/null)" = "idle $NODES" ]; then exit 0; fi
    sleep 1
  done
  echo "error: the Slurm cluster did not come up: $(sinfo 2>&1)" >&2
  exit 1
  ;;
stop)
  scontrol shutdown >/dev/null 2>&1 || true
  sleep 1
  for name in slurmd slurmctld munged; do pkill -x "$name" || true; done
  sleep 1
  for name in slurmd slurmctld munged; do pkill -9 -x "$name" || true; done
  ;;
*)
  echo "usage: $0 start|stop" >&2
  exit 2
  ;;
esac
