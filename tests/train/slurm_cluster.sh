#!/bin/bash
# A one-node Slurm cluster for a test: munged, slurmctld and slurmd from
# Debian's slurm-wlm packages, configured in DIR (its own ports, sockets,
# state and logs; nothing under /etc is changed), then COMMAND run with
# SLURM_CONF pointing at it, then everything stopped. Exits with COMMAND's
# status; 77 when Slurm is not installed or this is not root (slurmd
# starts tasks as their user, and munged must run as the same user).
#
#   tests/train/slurm_cluster.sh DIR srun -n 2 ./program ...
#
# The node offers CPUS (2 unless set) CPUs, oversubscribed 4 times, so
# steps of more tasks than cores run. Waits are bounded:
# munged 30 s to make its socket and the node 90 s to come up (bounds for a loaded
# machine, not timings), COMMAND runs under the caller's own time limit.
set -u
dir=$1
shift
for tool in munged slurmctld slurmd srun sinfo; do
  command -v "$tool" > /dev/null || { echo "slurm_cluster: $tool is not installed" >&2; exit 77; }
done
[ "$(id -u)" = 0 ] || { echo "slurm_cluster: needs root" >&2; exit 77; }
[ -r /etc/munge/munge.key ] || { echo "slurm_cluster: no /etc/munge/munge.key" >&2; exit 77; }

mkdir -p "$dir/state" "$dir/spool"
# The node's name is the host name, as slurmd finds it, when it resolves:
# the ranks reach rank 0 at the first name of the step's node list. Where it
# does not (some containers), the node is "localhost", named to slurmd.
node=$(hostname -s)
getent hosts "$node" > /dev/null 2>&1 || node=localhost
# Ports of its own, free when checked: below the kernel's ephemeral range
# (32768 and up), where the port-0 sockets of tests running beside this one
# land, and above the Trainer's Slurm control ports (15000-29999).
read -r ctld_port slurmd_port < <(/usr/bin/python3 - << 'EOF'
import random
import socket
picked = []
for port in random.sample(range(30000, 32700), 200):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            continue
    picked.append(port)
    if len(picked) == 2:
        break
print(*picked)
EOF
)
cat > "$dir/slurm.conf" << EOF
ClusterName=cairntest
# Job ids from a random start: the Trainer's control port derives from them,
# so two clusters of this script do not hand out the same one.
FirstJobId=$((RANDOM + 1))
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
AuthType=auth/munge
AuthInfo=socket=$dir/munge.sock
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmUser=root
SlurmdUser=root
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
NodeName=$node NodeAddr=127.0.0.1 CPUs=${CPUS:-2} RealMemory=1000 State=UNKNOWN
PartitionName=test Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
export SLURM_CONF=$dir/slurm.conf

pids=()
stop() {
  for p in "${pids[@]}"; do kill "$p" 2> /dev/null; done
  for p in "${pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$p" 2> /dev/null || break; sleep 0.1; done
    kill -9 "$p" 2> /dev/null
  done
  wait 2> /dev/null
}
trap stop EXIT

munged --force --foreground --socket="$dir/munge.sock" --pid-file="$dir/munged.pid" \
  --log-file="$dir/munged.log" --seed-file="$dir/munge.seed" > "$dir/munged.out" 2>&1 &
pids+=($!)
for _ in $(seq 300); do [ -S "$dir/munge.sock" ] && break; sleep 0.1; done
if [ ! -S "$dir/munge.sock" ]; then
  echo "slurm_cluster: munged made no socket within 30 s; its log:" >&2
  tail -n 20 "$dir/munged.log" "$dir/munged.out" >&2
  exit 1
fi
slurmctld -D -f "$SLURM_CONF" > "$dir/slurmctld.out" 2>&1 &
pids+=($!)
slurmd -D -N "$node" -f "$SLURM_CONF" > "$dir/slurmd.out" 2>&1 &
pids+=($!)
up=
for _ in $(seq 900); do
  if sinfo -h -o %t 2> /dev/null | grep -qx idle; then up=1; break; fi
  sleep 0.1
done
if [ -z "$up" ]; then
  echo "slurm_cluster: the node did not come up within 90 s; logs:" >&2
  tail -n 20 "$dir"/*.log "$dir"/*.out >&2
  exit 1
fi
"$@"
