#!/usr/bin/env bash
# Start a single-node SLURM cluster on this machine, as root, for the `slurm` tests and for trying
# `hydra/launcher=submitit_slurm` sweeps locally (design.md §3).
#
#   sudo bash scripts/slurm/start_single_node.sh     # prints `sinfo` once the node is idle
#
# - installs the Debian packages slurm-wlm and munge when slurmctld/slurmd/sbatch/munged are missing;
# - starts munged, then slurmctld and slurmd with /etc/slurm/slurm.conf naming this host
#   (`hostname -s`): proctrack/linuxproc, task/none, select/cons_tres with CR_Core_Memory,
#   SlurmUser=root, state and spool dirs under $SPECBENCH_SLURM_DIR, one node with CPUs=$(nproc) and
#   RealMemory a little under `free -m`, one partition ($SPECBENCH_SLURM_PARTITION, Default=YES);
# - waits until `sinfo` shows the node idle (or mixed/allocated: already running jobs).
# Idempotent: a second call finds the node up and only prints `sinfo`; daemons that are already
# running are not started twice. Exit codes: 0 up, 1 failed to start, 2 cannot run here (not root, no apt).
set -euo pipefail

SLURM_DIR=${SPECBENCH_SLURM_DIR:-/tmp/specbench-slurm}
PARTITION=${SPECBENCH_SLURM_PARTITION:-debug}
CONF=/etc/slurm/slurm.conf
MARKER="# written by specbench scripts/slurm/start_single_node.sh"
HOST=$(hostname -s)

log() { echo "[slurm] $*" >&2; }
die() { log "$2"; exit "$1"; }

node_state() { sinfo -h -n "$HOST" -o %T 2>/dev/null | head -n1 | tr -d '*~#!%$@^-' || true; }
node_ready() { case "$(node_state)" in idle | mixed | allocated | completing) return 0 ;; *) return 1 ;; esac; }
running() { [[ -f $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

[[ $(id -u) -eq 0 ]] || die 2 "needs root (starts munged, slurmctld and slurmd as root)"

if command -v sinfo >/dev/null && [[ -f $CONF ]] && node_ready; then
  log "node $HOST is up"
  sinfo
  exit 0
fi

# --- install -------------------------------------------------------------------------------------
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v sbatch >/dev/null \
  || ! command -v munged >/dev/null; then
  command -v apt-get >/dev/null || die 2 "slurm-wlm/munge are not installed and apt-get is missing"
  log "installing slurm-wlm and munge (Debian packages)"
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y -qq --no-install-recommends slurm-wlm munge >/tmp/specbench-slurm-apt.log 2>&1; then
    apt-get update -qq >>/tmp/specbench-slurm-apt.log 2>&1 || true
    apt-get install -y -qq --no-install-recommends slurm-wlm munge >>/tmp/specbench-slurm-apt.log 2>&1 \
      || die 1 "apt-get install slurm-wlm munge failed; see /tmp/specbench-slurm-apt.log"
  fi
fi

# --- munge ---------------------------------------------------------------------------------------
mkdir -p /etc/munge /run/munge /var/lib/munge /var/log/munge
if [[ ! -s /etc/munge/munge.key ]]; then
  if command -v mungekey >/dev/null; then
    mungekey --create --keyfile=/etc/munge/munge.key --force
  else
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
  fi
fi
if id munge >/dev/null 2>&1; then
  chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge
fi
chmod 0700 /etc/munge
chmod 0400 /etc/munge/munge.key
chmod 0755 /run/munge
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  log "starting munged"
  if id munge >/dev/null 2>&1; then
    runuser -u munge -- munged
  else
    munged --force
  fi
  for _ in $(seq 1 20); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.5; done
  munge -n | unmunge >/dev/null || die 1 "munged does not answer (munge -n | unmunge)"
fi

# --- slurm.conf ----------------------------------------------------------------------------------
if [[ -f $CONF ]] && ! grep -qF "$MARKER" "$CONF"; then
  die 1 "$CONF exists and was not written by this script; refusing to replace it"
fi
mkdir -p "$SLURM_DIR/state" "$SLURM_DIR/spool" /etc/slurm
CPUS=$(nproc)
TOTAL_MB=$(free -m | awk '/^Mem:/ {print $2}')
REAL_MB=$((TOTAL_MB * 95 / 100))
NEW_CONF=$(mktemp)
cat >"$NEW_CONF" <<EOF
$MARKER
ClusterName=specbench
SlurmctldHost=$HOST
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/backfill
SlurmdParameters=config_overrides
ReturnToService=2
DefMemPerCPU=1024
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
StateSaveLocation=$SLURM_DIR/state
SlurmdSpoolDir=$SLURM_DIR/spool
SlurmctldPidFile=$SLURM_DIR/slurmctld.pid
SlurmdPidFile=$SLURM_DIR/slurmd.pid
SlurmctldLogFile=$SLURM_DIR/slurmctld.log
SlurmdLogFile=$SLURM_DIR/slurmd.log
NodeName=$HOST CPUs=$CPUS RealMemory=$REAL_MB State=UNKNOWN
PartitionName=$PARTITION Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
EOF
if ! cmp -s "$NEW_CONF" "$CONF" 2>/dev/null; then
  install -m 0644 "$NEW_CONF" "$CONF"
  log "wrote $CONF (node $HOST, CPUs=$CPUS, RealMemory=$REAL_MB, partition $PARTITION)"
  # Daemons started with another config must re-read it.
  for pidfile in "$SLURM_DIR/slurmd.pid" "$SLURM_DIR/slurmctld.pid"; do
    if running "$pidfile"; then kill "$(cat "$pidfile")"; sleep 1; fi
  done
fi
rm -f "$NEW_CONF"

# --- daemons -------------------------------------------------------------------------------------
if ! running "$SLURM_DIR/slurmctld.pid"; then
  log "starting slurmctld"
  slurmctld -f "$CONF"
fi
for _ in $(seq 1 30); do scontrol -f "$CONF" ping >/dev/null 2>&1 && break; sleep 0.5; done
if ! running "$SLURM_DIR/slurmd.pid"; then
  log "starting slurmd"
  slurmd -f "$CONF"
fi

for _ in $(seq 1 60); do
  node_ready && break
  case "$(node_state)" in
    down | drained | draining | fail | failing) scontrol update nodename="$HOST" state=resume >/dev/null 2>&1 || true ;;
  esac
  sleep 1
done
if ! node_ready; then
  log "node $HOST did not become idle (state: '$(node_state)'); logs in $SLURM_DIR/*.log"
  tail -n 20 "$SLURM_DIR/slurmctld.log" "$SLURM_DIR/slurmd.log" >&2 || true
  exit 1
fi
log "node $HOST is up"
sinfo
