#!/usr/bin/env bash
# A real two-node Slurm on this machine, for the tests (tests/test_slurm.cpp): munged, slurmctld
# and two slurmd, both at 127.0.0.1 on ports of their own, every file of theirs in one scratch
# directory. Needs root (slurmd starts jobs as any user) and Debian's slurm-wlm and
# munge (tools/setup.sh installs them).
#
#   cluster.sh start DIR [OWNER_PID]  writes DIR/slurm.conf, starts the daemons, waits until both
#                                      nodes are idle; exits 77 with the reason on stderr when Slurm
#                                      is absent or cannot run here. A watchdog stops the cluster
#                                      when OWNER_PID (default: the caller) exits, however it ends
#                                      (a test killed at its time limit included), or after 30 min.
#   cluster.sh stop DIR               cancels every job, stops the daemons and ends whatever is
#                                      left of the cluster's processes; safe to run twice.
#   . DIR/env.sh                       what a client (srun, sbatch, scontrol) needs: SLURM_CONF.
#
# Every process of the cluster carries PIPELINE_SLURM_CLUSTER=DIR in its environment (the jobs'
# tasks included), or works in DIR (slurmstepd, whose process title overwrites its environment):
# that is how stop finds what a job left behind, and nothing else.
#
# The nodes are named by loopback address, 127.0.0.1 and 127.0.0.2 (SLURM_JOB_NODELIST is
# "127.0.0.[1-2]", in Slurm's compressed form): a node name is an address, so the first node's name
# is where the ranks' store listens, as on a cluster whose node names resolve, with no /etc/hosts
# entry and no MASTER_ADDR. (Slurm itself reaches both slurmd at NodeAddr=127.0.0.1.)
#
# Timing is shortened for tests: KillWait=10 (SIGKILL 10 s after SIGTERM), OverTimeLimit=0, a
# requeued job may start again 6 s later (cred_expire=5; Slurm's default is 120 s), the scheduler
# looks at pending jobs every 5 s, MinJobAge=3600 (finished jobs stay visible to scontrol show
# job). Partition "main" (the default) is preempted by partition "high" (PriorityTier 2) with
# PreemptMode=REQUEUE and GraceTime=0: the preempted job gets SIGTERM at once, SIGKILL after
# KillWait, and goes back to the queue. (With a GraceTime, Slurm 22.05 ends a job that exits
# within it FAILED instead of requeuing it.)
#
# Slurm reserves ports for each step (MpiParams=ports, SLURM_STEP_RESV_PORTS), from which the
# ranks' store takes its port, as on a cluster that reserves them: from a block of 100 ports
# below Linux's ephemeral range that this cluster holds alone (an flock in
# ${TMPDIR:-/tmp}/pipeline-slurm-ports, kept by the watchdog until the cluster stops), so that
# the jobs of clusters that run at once (ctest -j, other checkouts) never take the same port.
set -euo pipefail

usage() { sed -n '2,22p' "$0" >&2; exit 2; }
skip() { echo "cluster.sh: $*" >&2; exit 77; }

cmd=${1:-}
DIR=${2:-}
[[ -n $cmd && -n $DIR ]] || usage
DIR=$(mkdir -p "$DIR" && cd "$DIR" && pwd)
export SLURM_CONF=$DIR/slurm.conf PIPELINE_SLURM_CLUSTER=$DIR

# The pids of every process whose environment carries this cluster's mark or whose working
# directory is in DIR, but this script's own, its caller's, the owner's and the watchdog's.
marked_pids() {
  local f p cwd self=$$ mark="PIPELINE_SLURM_CLUSTER=$DIR"
  local -A skip=([$self]=1 [$PPID]=1)
  for f in "$DIR/watchdog.pid" "$DIR/owner.pid"; do [[ -f $f ]] && skip[$(cat "$f")]=1; done
  for p in /proc/[0-9]*; do
    p=${p#/proc/}
    [[ -n ${skip[$p]:-} ]] && continue
    cwd=$(readlink "/proc/$p/cwd" 2>/dev/null) || cwd=
    if [[ $cwd == "$DIR" || $cwd == "$DIR/"* ]] ||
       { tr '\0' '\n' < "/proc/$p/environ"; } 2>/dev/null | grep -qxF "$mark"; then
      echo "$p"
    fi
  done
  return 0
}

stop() {
  touch "$DIR/stopped"
  if [[ -f $DIR/slurmctld.pid ]] && kill -0 "$(cat "$DIR/slurmctld.pid")" 2>/dev/null; then
    scancel --full --quiet --user=root 2>/dev/null || true
    # The jobs get SIGTERM now and SIGKILL after KillWait: give them that long to go.
    for _ in $(seq 1 60); do
      [[ -z $(squeue --noheader --format=%i 2>/dev/null | head -1) ]] && break
      sleep 0.25
    done
    scontrol shutdown >/dev/null 2>&1 || true
  fi
  local f pid
  for f in "$DIR"/slurmctld.pid "$DIR"/slurmd-*.pid "$DIR"/munge/munged.pid; do
    [[ -f $f ]] || continue
    pid=$(cat "$f")
    for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; kill -TERM "$pid" 2>/dev/null || true; sleep 0.25; done
    kill -KILL "$pid" 2>/dev/null || true
  done
  # What a killed slurmd left: slurmstepd and the tasks it started.
  local left=()
  mapfile -t left < <(marked_pids)
  if ((${#left[@]})); then
    kill -TERM "${left[@]}" 2>/dev/null || true
    sleep 1
    mapfile -t left < <(marked_pids)
    if ((${#left[@]})); then kill -KILL "${left[@]}" 2>/dev/null || true; fi
  fi
  return 0
}

# A block of ports no other cluster on this machine holds: its first port in PORT_BLOCK, its lock
# open on fd 9 (whoever keeps fd 9 keeps the block).
take_port_block() {
  local locks=${TMPDIR:-/tmp}/pipeline-slurm-ports b
  mkdir -p "$locks"
  for b in $(seq 0 39 | shuf); do
    exec 9>"$locks/block-$b.lock"
    if flock -n 9; then
      PORT_BLOCK=$((20000 + 100 * b))
      return 0
    fi
    exec 9>&-
  done
  echo "cluster.sh: every block of ports in 20000-23999 is held by another cluster ($locks)" >&2
  exit 1
}

free_ports() {  # N loopback TCP ports that are free now
  python3 -c 'import socket,sys
s=[socket.socket() for _ in range(int(sys.argv[1]))]
for x in s: x.bind(("127.0.0.1",0))
print(" ".join(str(x.getsockname()[1]) for x in s))' "$1"
}

start() {
  local owner=${1:-$PPID}
  echo "$owner" > "$DIR/owner.pid"
  [[ $(id -u) -eq 0 ]] || skip "Slurm's daemons need root here (slurmd starts jobs as their users); running as $(id -un)"
  local t
  for t in munged mungekey slurmctld slurmd srun sbatch scontrol squeue scancel python3; do
    command -v "$t" >/dev/null || skip "no $t: install Debian's slurm-wlm and munge (tools/setup.sh does)"
  done
  rm -f "$DIR/stopped"
  mkdir -p "$DIR/munge" "$DIR/state" "$DIR/spool" "$DIR/log"
  chmod 700 "$DIR/munge"
  mungekey -c -f -k "$DIR/munge/munge.key" 2>/dev/null
  chmod 600 "$DIR/munge/munge.key"
  munged --force --socket="$DIR/munge/munge.socket" --key-file="$DIR/munge/munge.key" \
    --pid-file="$DIR/munge/munged.pid" --log-file="$DIR/log/munged.log" --seed-file="$DIR/munge/munged.seed" \
    2>>"$DIR/log/munged.log" || { cat "$DIR/log/munged.log" >&2; skip "munged does not start here (see above)"; }

  read -r ctl_port p1 p2 < <(free_ports 3)
  take_port_block
  cat > "$SLURM_CONF" <<EOF
# A two-node test cluster on one machine (tests/slurm/cluster.sh).
ClusterName=pipelinetest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$ctl_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge/munge.socket,cred_expire=5
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
MpiParams=ports=$PORT_BLOCK-$((PORT_BLOCK + 99))
SwitchType=switch/none
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=5
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
ReturnToService=2
KillWait=10
OverTimeLimit=0
MinJobAge=3600
InactiveLimit=0
MessageTimeout=10
SlurmctldTimeout=30
SlurmdTimeout=30
JobRequeue=1
FirstJobId=$((1000 + RANDOM % 8000))
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
NodeName=127.0.0.1 NodeHostname=$(hostname -s) NodeAddr=127.0.0.1 Port=$p1 CPUs=1 State=UNKNOWN
NodeName=127.0.0.2 NodeHostname=$(hostname -s) NodeAddr=127.0.0.1 Port=$p2 CPUs=1 State=UNKNOWN
PartitionName=main Nodes=127.0.0.[1-2] Default=YES MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=REQUEUE GraceTime=0
PartitionName=high Nodes=127.0.0.[1-2] MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=OFF
EOF
  cat > "$DIR/env.sh" <<EOF
# Sourced by the tests before srun, sbatch, scontrol (tests/slurm/cluster.sh).
export SLURM_CONF=$SLURM_CONF PIPELINE_SLURM_CLUSTER=$DIR
EOF
  # From here on, whatever happens to the caller, the cluster goes with it.
  (
    trap '' HUP INT
    started=$SECONDS
    while kill -0 "$owner" 2>/dev/null && [[ ! -e $DIR/stopped ]] && ((SECONDS - started < 1800)); do sleep 1; done
    "$0" stop "$DIR" >/dev/null 2>&1
  ) </dev/null >/dev/null 2>&1 &
  echo $! > "$DIR/watchdog.pid"
  disown
  exec 9>&-  # the watchdog keeps the block of ports; the daemons need not

  slurmctld -c -f "$SLURM_CONF" 2>>"$DIR/log/slurmctld.log" || { tail -20 "$DIR/log/slurmctld.log" >&2; exit 1; }
  local n
  for n in 127.0.0.1 127.0.0.2; do
    slurmd -N "$n" -f "$SLURM_CONF" 2>>"$DIR/log/slurmd-$n.log" || { tail -20 "$DIR/log/slurmd-$n.log" >&2; exit 1; }
  done
  # Both nodes idle: the cluster takes jobs.
  for _ in $(seq 1 120); do
    if [[ $(sinfo --Node --noheader --responding --states=idle --format=%N 2>/dev/null | sort -u | tr '\n' ' ') == "127.0.0.1 127.0.0.2 " ]]; then
      return 0
    fi
    sleep 0.25
  done
  echo "cluster.sh: the nodes did not become idle within 30 s:" >&2
  sinfo >&2 || true
  tail -n 20 "$DIR/log/slurmctld.log" "$DIR"/log/slurmd-*.log >&2 || true
  exit 1
}

case $cmd in
  start) start "${3:-}" ;;
  stop) stop ;;
  *) usage ;;
esac
